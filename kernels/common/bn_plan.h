// Which batch-norm calls the CUDA backend may give cuDNN (kernels/cuda/batch_norm.cu): a pure
// function of the shape and eps, so that a CPU test can ask it about sizes no test could allocate.
// No CUDA headers: this compiles with any C++ compiler.
#pragma once
#include <cstdint>

namespace kiln::libplan {

// cuDNN's CUDNN_BN_MIN_EPSILON, the smallest eps its batch-norm calls take: 0.0 since cuDNN 8 (it
// was 1e-5 in cuDNN 7). The value, not cudnn.h, which this header does not include; batch_norm.cu
// static_asserts that the two agree, so a cuDNN that raises it again fails the build, not a run.
inline constexpr double kCudnnBnMinEpsilon = 0.0;

// Whether cuDNN's batch norm can take [n, c, hw] with this eps: its 4-D tensor descriptors refuse
// more than 2^31-1 elements in all, and its calls refuse an eps below CUDNN_BN_MIN_EPSILON. Either
// takes the handwritten kernels instead of failing: they index in int64 (as they do in
// deterministic mode) and take any eps.
inline bool cudnn_bn_fits(int64_t n, int64_t c, int64_t hw, double eps) {
  if (!(eps >= kCudnnBnMinEpsilon)) return false;  // a NaN eps too: cuDNN would refuse it
  if (n <= 0 || c <= 0 || hw <= 0) return true;    // nothing to count (the callers handle empty shapes)
  return n <= INT32_MAX / c && n * c <= INT32_MAX / hw;
}

}  // namespace kiln::libplan
