// One macro for CUDA runtime return codes: a failed call throws kiln::Error naming the call and the
// runtime's own error name and string; cudaErrorMemoryAllocation throws its subclass OutOfMemory,
// on which `kiln train --micro-batch` halves the micro-batch and redoes the step. Only for .cu files
// (it needs cuda_runtime.h, or the emulator's stand-in for it).
#pragma once
#ifdef KILN_CUDA_EMULATION
#include "kernels/cuda/emulator/cuda_runtime_emulated.h"
#else
#include <cuda_runtime.h>
#endif

#include <string>

#include "base/error.h"

namespace kiln::cuda {
inline std::string cuda_error(cudaError_t e) {
  return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
}
}  // namespace kiln::cuda

// A failed call's error is also kept as the thread's last error, which the next launch check
// (cudaGetLastError) would report against an unrelated kernel (the next of a step redone after an out-of-
// memory error; any launch after a destructor swallowed a failed free): it is cleared before the throw.
// A sticky error (a kernel's illegal address) stays with the context whatever is cleared.
#define KILN_CUDA_OK(call)                                                                               \
  do {                                                                                                   \
    const cudaError_t kiln_cuda_e_ = (call);                                                             \
    if (kiln_cuda_e_ != cudaSuccess) (void)cudaGetLastError();                                           \
    if (kiln_cuda_e_ == cudaErrorMemoryAllocation)                                                       \
      KILN_FAIL_OOM(#call, " failed: ", ::kiln::cuda::cuda_error(kiln_cuda_e_));                         \
    KILN_CHECK(kiln_cuda_e_ == cudaSuccess, #call, " failed: ", ::kiln::cuda::cuda_error(kiln_cuda_e_)); \
  } while (0)

namespace kiln::cuda {
// The answer of cudaEventQuery or cudaStreamQuery as done / not yet. cudaErrorNotReady is also left as
// the thread's last error (PyTorch clears it for the same reason), which the next launch check would
// report as that kernel's failure: it is cleared here. Any other error throws, naming `what`.
inline bool query_done(cudaError_t e, const char* what) {
  if (e == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  KILN_CHECK(e == cudaSuccess, what, " failed: ", cuda_error(e));
  return true;
}
}  // namespace kiln::cuda
