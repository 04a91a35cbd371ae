// Integer arithmetic that wraps, shared by the CPU and CUDA kernels (a header of its own, as
// int_pow.h: kernels/common/math.h is included by every kernel through backend.h).
#pragma once
#include <type_traits>

#include "base/macros.h"

namespace kiln::math {

// Integer arithmetic that wraps at A's width, two's complement, as PyTorch's: computed in the unsigned
// type of the same width (at least unsigned int, so that a small unsigned type is not promoted to a
// signed int that overflows) and converted back, which C++20 defines as the low bits. Signed overflow
// is undefined behaviour, which UBSan reports and an optimiser may exploit; INT_MIN / -1 traps on
// x86-64 (idiv). Floats (and bool) take the plain operators: their code is what it was.
template <typename A> constexpr bool wraps_v = std::is_integral_v<A> && !std::is_same_v<A, bool>;
template <typename A> using WrapUnsigned =
    std::conditional_t<(sizeof(A) < sizeof(unsigned)), unsigned,
                       std::make_unsigned_t<std::conditional_t<wraps_v<A>, A, int>>>;
template <typename A> KILN_HD A wrap_add(A x, A y) {
  if constexpr (wraps_v<A>) {
    return A(WrapUnsigned<A>(x) + WrapUnsigned<A>(y));
  } else {
    return A(x + y);
  }
}
template <typename A> KILN_HD A wrap_sub(A x, A y) {
  if constexpr (wraps_v<A>) {
    return A(WrapUnsigned<A>(x) - WrapUnsigned<A>(y));
  } else {
    return A(x - y);
  }
}
template <typename A> KILN_HD A wrap_mul(A x, A y) {
  if constexpr (wraps_v<A>) {
    return A(WrapUnsigned<A>(x) * WrapUnsigned<A>(y));
  } else {
    return A(x * y);
  }
}
template <typename A> KILN_HD A wrap_neg(A x) {
  if constexpr (wraps_v<A>) {
    return A(WrapUnsigned<A>(0) - WrapUnsigned<A>(x));
  } else {
    return A(-x);
  }
}
// Integer division toward zero (C's /) for y != 0 (the caller checks): INT_MIN / -1 wraps to INT_MIN,
// as PyTorch's floor division gives (its truncating division traps there on x86-64).
template <typename A> KILN_HD A trunc_div(A x, A y) {
  if constexpr (std::is_signed_v<A>) {
    if (y == A(-1)) return wrap_neg(x);
  }
  return A(x / y);
}

// Bitwise shifts as PyTorch's (bitwise_left_shift / bitwise_right_shift, << and >>) for an integer A (not
// bool: the engine refuses a bool result): a shift by a negative amount or by A's width or more gives 0 to
// the left and, to the right, the sign fill (x >> (width - 1): 0 or -1; 0 for an unsigned A); in range the
// left shift is computed unsigned (a signed overflow would be undefined behaviour) and the right shift is
// arithmetic for a signed A, as C++20 defines it.
template <typename A> KILN_HD A shift_left(A x, A y) {
  constexpr A width = A(sizeof(A) * 8);
  if constexpr (std::is_signed_v<A>) {
    if (y < A(0)) return A(0);
  }
  if (y >= width) return A(0);
  return A(WrapUnsigned<A>(x) << unsigned(y));
}
template <typename A> KILN_HD A shift_right(A x, A y) {
  constexpr A width = A(sizeof(A) * 8);
  if constexpr (std::is_signed_v<A>) {
    if (y < A(0) || y >= width - A(1)) return A(x >> unsigned(width - A(1)));
  } else {
    if (y >= width) return A(0);
  }
  return A(x >> unsigned(y));
}

}  // namespace kiln::math
