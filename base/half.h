// 16-bit floating types as stored bits, with round-to-nearest-even conversions from f32.
// Shared by CPU and CUDA. The *_soft conversions are plain integer code (CPUs without F16C use
// them); where the host compiler targets F16C or AVX512-FP16, and in device code (PTX cvt), the
// conversions are single hardware instructions with the same results (tests compare the host ones
// exhaustively; `kiln doctor`'s self-test compares the device with the host).
// The host path uses the F16C intrinsics, not _Float16: clang 14 rejects _Float16 on x86 unless
// the target has AVX512-FP16, and GCC and clang emit the same vcvtps2ph/vcvtph2ps for both.
#pragma once
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "base/macros.h"
#if !defined(__CUDACC__) && defined(__F16C__)
#include <immintrin.h>
#endif

namespace kiln {

KILN_HD uint32_t f32_bits(float f) {
#if KILN_DEVICE_CODE
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}
KILN_HD float f32_from_bits(uint32_t u) {
#if KILN_DEVICE_CODE
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

#if !defined(__CUDACC__) && defined(__F16C__)
#define KILN_HOST_F16_HW 1
#else
#define KILN_HOST_F16_HW 0
#endif

// IEEE binary16: 1 sign, 5 exponent, 10 mantissa bits.
KILN_HD uint16_t f32_to_f16_bits_soft(float f) {
  const uint32_t x = f32_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) {  // inf or NaN: keep NaN quiet and non-zero
    return static_cast<uint16_t>(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u | ((ax >> 13) & 0x3ffu) : 0u));
  }
  if (ax >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (ax < 0x38800000u) {  // below the smallest normal half (2^-14): subnormal or zero
    if (ax < 0x33000000u) return static_cast<uint16_t>(sign);  // < 2^-25 rounds to 0
    const uint32_t e = ax >> 23;
    const uint32_t mant = (ax & 0x7fffffu) | 0x800000u;
    // value = mant * 2^(e-150); in units of the half subnormal step 2^-24 that is mant >> (126 - e).
    const uint32_t shift = 126u - e;
    uint32_t q = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1u);
    const uint32_t halfway = 1u << (shift - 1u);
    if (rem > halfway || (rem == halfway && (q & 1u))) ++q;
    return static_cast<uint16_t>(sign | q);
  }
  // Normal: rebias exponent (127 -> 15) and round the 13 dropped mantissa bits to nearest even.
  uint32_t h = ((ax - 0x38000000u) >> 13);
  const uint32_t rem = ax & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // a carry into the exponent is correct
  return static_cast<uint16_t>(sign | h);
}

KILN_HD float f16_bits_to_f32_soft(uint16_t h) {
  const uint32_t sign = (uint32_t(h) & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu;
  const uint32_t m = h & 0x3ffu;
  if (e == 0x1f) return f32_from_bits(sign | 0x7f800000u | (m ? 0x400000u | (m << 13) : 0u));  // NaN stays quiet
  if (e == 0) {
    if (m == 0) return f32_from_bits(sign);
    // subnormal: m * 2^-24
    float v = static_cast<float>(m) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  return f32_from_bits(sign | ((e + 112u) << 23) | (m << 13));
}

KILN_HD uint16_t f32_to_f16_bits(float f) {
#if KILN_HOST_F16_HW
  return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
#elif KILN_DEVICE_CODE
  uint16_t h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
#else
  return f32_to_f16_bits_soft(f);
#endif
}
KILN_HD float f16_bits_to_f32(uint16_t h) {
#if KILN_HOST_F16_HW
  return _cvtsh_ss(h);
#elif KILN_DEVICE_CODE
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
#else
  return f16_bits_to_f32_soft(h);
#endif
}

// bfloat16: the top 16 bits of an f32, rounded to nearest even.
KILN_HD uint16_t f32_to_bf16_bits(float f) {
#if KILN_DEVICE_CODE && __CUDA_ARCH__ >= 800
  uint16_t h;  // the same rounding in one instruction (NaN becomes the canonical quiet NaN)
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
#else
  const uint32_t x = f32_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  const uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>((x + rounding) >> 16);
#endif
}
KILN_HD float bf16_bits_to_f32(uint16_t b) { return f32_from_bits(uint32_t(b) << 16); }

// Storage types. They convert implicitly to float so generic kernels can compute in f32.
struct Half {
  uint16_t bits = 0;
  Half() = default;
  KILN_HD explicit Half(float f) : bits(f32_to_f16_bits(f)) {}
  KILN_HD operator float() const { return f16_bits_to_f32(bits); }
  KILN_HD static Half from_bits(uint16_t b) {
    Half h;
    h.bits = b;
    return h;
  }
};
struct BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  KILN_HD explicit BFloat16(float f) : bits(f32_to_bf16_bits(f)) {}
  KILN_HD operator float() const { return bf16_bits_to_f32(bits); }
  KILN_HD static BFloat16 from_bits(uint16_t b) {
    BFloat16 h;
    h.bits = b;
    return h;
  }
};
static_assert(sizeof(Half) == 2 && sizeof(BFloat16) == 2);

// One value converted to element type T, the same on both devices (the CPU loops' store, the CUDA
// kernels' st, fills and casts): 16-bit floats round from f32; bool is "non-zero"; a floating value
// into an integer type converts as x86-64's truncating conversion does, which is what PyTorch and
// NumPy give there: toward zero to i32 (to i64 for an i64 target), a value outside that range or NaN
// giving its minimum (the "integer indefinite"), then, like every integer narrowing, the low bits.
// So -1.0 gives 255 in u8, 300.0 gives 44 in i8, 3e9 gives INT32_MIN in i32 and 0 in u8, NaN gives 0
// in u8/i8/i16: defined everywhere, where C++ leaves out-of-range conversions undefined and CUDA's
// cvt saturates.
template <typename T, typename V> KILN_HD T convert_to(V v) {
  if constexpr (std::is_same_v<V, Half> || std::is_same_v<V, BFloat16>) {
    return convert_to<T>(static_cast<float>(v));
  } else if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
    return T(static_cast<float>(v));
  } else if constexpr (std::is_same_v<T, bool>) {
    return v != V(0);
  } else if constexpr (std::is_integral_v<T> && std::is_floating_point_v<V>) {
    if constexpr (sizeof(T) == 8) {
      if (!(v >= V(-9223372036854775808.0) && v < V(9223372036854775808.0))) return static_cast<T>(INT64_MIN);
      return static_cast<T>(static_cast<int64_t>(v));
    } else {
      if (!(v >= V(-2147483648.0) && v < V(2147483648.0))) return static_cast<T>(INT32_MIN);
      return static_cast<T>(static_cast<int32_t>(v));
    }
  } else {
    return static_cast<T>(v);
  }
}

// A scalar given as f64 (a fill value) in element type T, converted as convert_to does.
template <typename T> KILN_HD T value_as(double v) { return convert_to<T>(v); }

}  // namespace kiln
