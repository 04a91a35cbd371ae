// The CUDA runtime queries in a build without the CUDA backend: they say so.
#include "kernels/cuda/runtime_info.h"
#include "kernels/cuda/device_memory.h"
#include "kernels/cuda/tc_gemm.h"

#include "engine/error.h"

#if !defined(KILN_WITH_CUDA)
namespace kiln::cuda {
RuntimeInfo query_runtime() {
  RuntimeInfo info;
  info.error = "this build of Kiln has no CUDA backend (configured with KILN_CUDA=OFF or without nvcc)";
  return info;
}
std::string device_self_test(int) { return "this build of Kiln has no CUDA backend"; }
void tc_gemm(const TcGemmArgs&, void*) { KILN_FAIL("tc_gemm: this build of Kiln has no CUDA backend"); }
bool tc_gemm_supported(int, std::string* why) {
  if (why) *why = "this build of Kiln has no CUDA backend";
  return false;
}
std::string tc_gemm_selftest(int) { return "this build of Kiln has no CUDA backend"; }
CachingAllocator& device_allocator(int device) {
  KILN_FAIL("cuda:", device, ": this build of Kiln has no CUDA backend");
}
void* pinned_alloc(size_t) { KILN_FAIL("pinned memory: this build of Kiln has no CUDA backend"); }
void pinned_free(void*) {}
}  // namespace kiln::cuda
#endif
