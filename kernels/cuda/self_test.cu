// `kiln doctor`'s device self-test kernel (the rows of kernels/common/self_test.h), apart from the
// runtime queries of runtime_info.cu so that the CUDA emulator compiles and runs it too.
#include <cstdint>

#include "kernels/common/self_test.h"
#include "kernels/cuda/context.h"
#include "kernels/cuda/runtime_info.h"

namespace kiln::cuda {
namespace {

// Launch: 1-D grid, one thread per test element i (n elements). Thread i writes the
// kSelfTestWords words of self_test_row(i) (kernels/common/self_test.h).
// Memory: 20 bytes written per thread; nothing read but the index.
__global__ void self_test_kernel(uint32_t* out, int n) {
  const int i = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= n) return;
  self_test_row(i, out + kSelfTestWords * i);
}

}  // namespace

void launch_self_test(uint32_t* out, int n) {
  if (n > 0) launch("self_test_kernel", self_test_kernel, dim3(unsigned((n + 255) / 256)), dim3(256), 0, nullptr, out, n);
}

}  // namespace kiln::cuda
