// Integer pow, shared by the CPU and CUDA elementwise kernels (a header of its own: kernels/common/math.h
// is included by every kernel through backend.h).
#pragma once
#include <cstdint>
#include <type_traits>

#include "base/macros.h"

namespace kiln::math {

// x ** y for integers, wrapping at A's width (unsigned arithmetic: the low bits, never UB). A negative
// exponent gives PyTorch's tensor-exponent result (the CPU and CUDA kernels agree): 1 ** y is 1,
// (-1) ** y is -1 for odd y and 1 for even, and every other base (0 included) gives 0, the truncated
// 1 / x ** -y.
template <typename A> KILN_HD A int_pow(A x, A y) {
  if constexpr (std::is_signed_v<A>) {
    if (y < A(0)) {
      if (x == A(1)) return A(1);
      if (x == A(-1)) return (int64_t(y) & 1) ? A(-1) : A(1);
      return A(0);
    }
  }
  uint64_t r = 1, base = uint64_t(int64_t(x));
  for (int64_t e = int64_t(y); e > 0; e >>= 1, base *= base)
    if (e & 1) r *= base;
  return A(r);
}

}  // namespace kiln::math
