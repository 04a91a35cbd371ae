// Which batch-norm calls the CUDA backend may give cuDNN (kernels/cuda/batch_norm.cu): a pure
// function of the shape, so that a CPU test can ask it about sizes no test could allocate. No CUDA
// headers: this compiles with any C++ compiler.
#pragma once
#include <cstdint>

namespace kiln::libplan {

// Whether cuDNN's batch norm can take [n, c, hw]: its 4-D tensor descriptors refuse more than
// 2^31-1 elements in all. Larger ones take the handwritten kernels, which index in int64 (as they
// do in deterministic mode), instead of failing.
inline bool cudnn_bn_fits(int64_t n, int64_t c, int64_t hw) {
  if (n <= 0 || c <= 0 || hw <= 0) return true;  // nothing to count (the callers handle empty shapes)
  return n <= INT32_MAX / c && n * c <= INT32_MAX / hw;
}

}  // namespace kiln::libplan
