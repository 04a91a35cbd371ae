// Tests for kernels/common: 16-bit float conversions, Philox 4x32-10 and its uniform/normal
// helpers, and the activation math shared by the CPU and CUDA backends.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kiln.h"
#include "base/half.h"
#include "kernels/common/math.h"
#include "kernels/common/philox.h"
#include "kernels/common/self_test.h"
#include "test_util.h"

#if defined(__F16C__)
#include <immintrin.h>
#endif

using namespace kiln;
using kiln::testing::contains;

namespace {

// An independent decoder for binary16 written with ldexp, to check f16_bits_to_f32.
double decode_f16(uint16_t h) {
  const int sign = (h >> 15) & 1;
  const int e = (h >> 10) & 0x1f;
  const int m = h & 0x3ff;
  double v;
  if (e == 0x1f) {
    v = m ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  } else if (e == 0) {
    v = std::ldexp(double(m), -24);
  } else {
    v = std::ldexp(double(1024 + m), e - 25);
  }
  return sign ? -v : v;
}

bool f16_is_nan(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0; }
bool bf16_is_nan(uint16_t b) { return (b & 0x7f80u) == 0x7f80u && (b & 0x7fu) != 0; }

float f(uint32_t bits) { return f32_from_bits(bits); }

bool near(double a, double b, double atol, double rtol) { return std::abs(a - b) <= atol + rtol * std::abs(b); }
#define CHECK_NEAR(a, b, atol, rtol)                                                   \
  do {                                                                                 \
    const double a_ = (a), b_ = (b);                                                   \
    CHECK_MESSAGE(near(a_, b_, atol, rtol), #a, " = ", a_, " but expected ", b_);      \
  } while (0)

}  // namespace

// ---- f16 -----------------------------------------------------------------------------------------

TEST_CASE("common: f16 exact values") {
  CHECK(f32_to_f16_bits(0.0f) == 0x0000);
  CHECK(f32_to_f16_bits(-0.0f) == 0x8000);
  CHECK(f32_to_f16_bits(1.0f) == 0x3c00);
  CHECK(f32_to_f16_bits(-2.0f) == 0xc000);
  CHECK(f32_to_f16_bits(0.5f) == 0x3800);
  CHECK(f32_to_f16_bits(1.5f) == 0x3e00);
  CHECK(f32_to_f16_bits(0.333251953125f) == 0x3555);  // closest half to 1/3, exactly representable
  CHECK(f32_to_f16_bits(65504.0f) == 0x7bff);
  CHECK(f32_to_f16_bits(-65504.0f) == 0xfbff);
  CHECK(f32_to_f16_bits(std::ldexp(1.0f, -14)) == 0x0400);  // smallest normal
  CHECK(f32_to_f16_bits(std::ldexp(1.0f, -24)) == 0x0001);  // smallest subnormal
  CHECK(f32_to_f16_bits(std::ldexp(1023.0f, -24)) == 0x03ff);  // largest subnormal
  CHECK(f32_to_f16_bits(-std::ldexp(5.0f, -24)) == 0x8005);

  CHECK(f16_bits_to_f32(0x3c00) == 1.0f);
  CHECK(f16_bits_to_f32(0x7bff) == 65504.0f);
  CHECK(f16_bits_to_f32(0x0001) == std::ldexp(1.0f, -24));
  CHECK(f16_bits_to_f32(0x03ff) == std::ldexp(1023.0f, -24));
  CHECK(f16_bits_to_f32(0x0400) == std::ldexp(1.0f, -14));
  CHECK(f16_bits_to_f32(0xc000) == -2.0f);
  const float nz = f16_bits_to_f32(0x8000);
  CHECK(nz == 0.0f);
  CHECK(std::signbit(nz));
  CHECK(std::isinf(f16_bits_to_f32(0x7c00)));
  CHECK(f16_bits_to_f32(0x7c00) > 0);
  CHECK(std::isinf(f16_bits_to_f32(0xfc00)));
  CHECK(f16_bits_to_f32(0xfc00) < 0);
  CHECK(std::isnan(f16_bits_to_f32(0x7e00)));
  CHECK(std::isnan(f16_bits_to_f32(0x7c01)));
  CHECK(std::isnan(f16_bits_to_f32(0xfe00)));
}

TEST_CASE("common: f16 rounds to nearest even at halfway cases") {
  // Around 1.0 the half step is 2^-10.
  const float h = std::ldexp(1.0f, -11);  // half a step
  CHECK(f32_to_f16_bits(1.0f + h) == 0x3c00);              // tie, 0x3c00 is even
  CHECK(f32_to_f16_bits(1.0f + 3 * h) == 0x3c02);          // tie between 0x3c01 and 0x3c02: even wins
  CHECK(f32_to_f16_bits(1.0f + 5 * h) == 0x3c02);          // tie between 0x3c02 and 0x3c03
  CHECK(f32_to_f16_bits(1.0f + h + std::ldexp(1.0f, -20)) == 0x3c01);  // just above the tie
  CHECK(f32_to_f16_bits(1.0f + h - std::ldexp(1.0f, -20)) == 0x3c00);  // just below
  CHECK(f32_to_f16_bits(-(1.0f + 3 * h)) == 0xbc02);
  // A tie that carries into the exponent: 2 - 2^-11 is halfway between 0x3fff (odd) and 2.0.
  CHECK(f32_to_f16_bits(2.0f - h) == 0x4000);
  CHECK(f32_to_f16_bits(2.0f - h - std::ldexp(1.0f, -20)) == 0x3fff);
  // Subnormal ties, in units of 2^-24.
  const float s = std::ldexp(1.0f, -25);  // half a subnormal step
  CHECK(f32_to_f16_bits(s) == 0x0000);                       // 0.5 units -> 0 (even)
  CHECK(f32_to_f16_bits(-s) == 0x8000);                      // keeps the sign
  CHECK(f32_to_f16_bits(std::nextafter(s, 1.0f)) == 0x0001);  // above the tie
  CHECK(f32_to_f16_bits(3 * s) == 0x0002);                   // 1.5 units -> 2
  CHECK(f32_to_f16_bits(5 * s) == 0x0002);                   // 2.5 units -> 2
  CHECK(f32_to_f16_bits(7 * s) == 0x0004);                   // 3.5 units -> 4
  CHECK(f32_to_f16_bits(std::ldexp(1.0f, -26)) == 0x0000);    // 0.25 units
  CHECK(f32_to_f16_bits(std::ldexp(1.0f, -30)) == 0x0000);
  CHECK(f32_to_f16_bits(std::numeric_limits<float>::denorm_min()) == 0x0000);
  // 1023.5 units: between the largest subnormal (odd) and the smallest normal.
  CHECK(f32_to_f16_bits(std::ldexp(2047.0f, -25)) == 0x0400);
  CHECK(f32_to_f16_bits(std::ldexp(2045.0f, -25)) == 0x03fe);  // 1022.5 -> 1022
}

TEST_CASE("common: f16 overflow, infinity, NaN and -0") {
  CHECK(f32_to_f16_bits(65519.0f) == 0x7bff);  // below the midpoint 65520
  CHECK(f32_to_f16_bits(std::nextafter(65520.0f, 0.0f)) == 0x7bff);
  CHECK(f32_to_f16_bits(65520.0f) == 0x7c00);  // the tie rounds to even, which is inf
  CHECK(f32_to_f16_bits(-65520.0f) == 0xfc00);
  CHECK(f32_to_f16_bits(70000.0f) == 0x7c00);
  CHECK(f32_to_f16_bits(1e10f) == 0x7c00);
  CHECK(f32_to_f16_bits(std::numeric_limits<float>::max()) == 0x7c00);
  CHECK(f32_to_f16_bits(-std::numeric_limits<float>::max()) == 0xfc00);
  CHECK(f32_to_f16_bits(std::numeric_limits<float>::infinity()) == 0x7c00);
  CHECK(f32_to_f16_bits(-std::numeric_limits<float>::infinity()) == 0xfc00);
  CHECK(f32_to_f16_bits(-0.0f) == 0x8000);
  // NaNs stay NaN with their sign, whatever the payload (also one only in the low bits).
  for (uint32_t bits : {0x7fc00000u, 0x7f800001u, 0x7f800fffu, 0x7fffffffu, 0x7fa00000u}) {
    CAPTURE(bits);
    CHECK(f16_is_nan(f32_to_f16_bits(f(bits))));
    CHECK((f32_to_f16_bits(f(bits)) & 0x8000) == 0);
    CHECK(f16_is_nan(f32_to_f16_bits(f(bits | 0x80000000u))));
    CHECK((f32_to_f16_bits(f(bits | 0x80000000u)) & 0x8000) == 0x8000);
  }
}

TEST_CASE("common: f16 all 65536 bit patterns round-trip through f32") {
  int nans = 0;
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t h = static_cast<uint16_t>(i);
    const float x = f16_bits_to_f32(h);
    const double want = decode_f16(h);
    if (f16_is_nan(h)) {
      ++nans;
      if (!std::isnan(x)) FAIL_CHECK("f16 NaN ", h, " decoded to ", x);
      const uint16_t back = f32_to_f16_bits(x);
      if (!f16_is_nan(back) || (back & 0x8000) != (h & 0x8000)) FAIL_CHECK("f16 NaN ", h, " came back as ", back);
      continue;
    }
    if (!(double(x) == want) || std::signbit(x) != bool(h & 0x8000)) FAIL_CHECK("f16 ", h, " decoded to ", x, " want ", want);
    const uint16_t back = f32_to_f16_bits(x);
    if (back != h) FAIL_CHECK("f16 ", h, " -> ", x, " -> ", back);
    // The struct does the same.
    if (Half(x).bits != h || float(Half::from_bits(h)) != x) FAIL_CHECK("Half disagrees for ", h);
  }
  CHECK(nans == 2 * 1023);
}

TEST_CASE("common: f32 -> f16 is the nearest half (exhaustive over midpoints)") {
  // For every pair of adjacent finite halves, the value just below, at and just above their
  // midpoint must round to the expected neighbour. Midpoints are exact in f32.
  for (uint32_t i = 0; i < 0x7bff; ++i) {
    const uint16_t lo = static_cast<uint16_t>(i), hi = static_cast<uint16_t>(i + 1);
    const float a = f16_bits_to_f32(lo), b = f16_bits_to_f32(hi);
    const float mid = static_cast<float>((double(a) + double(b)) / 2);
    if (double(mid) != (double(a) + double(b)) / 2) {
      FAIL_CHECK("midpoint of ", lo, " and ", hi, " is not exact in f32");
      break;
    }
    const uint16_t even = (lo & 1) ? hi : lo;
    const uint16_t below = f32_to_f16_bits(std::nextafter(mid, 0.0f));
    const uint16_t at = f32_to_f16_bits(mid);
    const uint16_t above = f32_to_f16_bits(std::nextafter(mid, 1e30f));
    if (below != lo || at != even || above != hi) {
      FAIL_CHECK("between halves ", lo, " and ", hi, ": got ", below, " ", at, " ", above);
      break;
    }
    // Negative values mirror.
    if (f32_to_f16_bits(-mid) != (even | 0x8000)) {
      FAIL_CHECK("negative midpoint between ", lo, " and ", hi);
      break;
    }
  }
}

#if defined(__F16C__)
TEST_CASE("common: the software f16 conversions (device code, CPUs without F16C) match the F16C instructions") {
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t h = static_cast<uint16_t>(i);
    const float hw = _cvtsh_ss(h);
    const float sw = f16_bits_to_f32_soft(h);
    if (f32_bits(hw) != f32_bits(sw)) {  // NaNs too: both quiet them, keeping sign and payload
      FAIL_CHECK("f16 ", h, ": hardware ", hw, " software ", sw);
    }
  }
  std::mt19937 rng(12345);
  std::uniform_real_distribution<float> near(-70000.0f, 70000.0f);
  std::uniform_real_distribution<float> small(-1e-4f, 1e-4f);
  int mismatches = 0;
  auto check_one = [&](float x) {
    const uint16_t hw = static_cast<uint16_t>(_cvtss_sh(x, 0));  // 0: round to nearest even
    const uint16_t sw = f32_to_f16_bits_soft(x);
    const bool ok = hw == sw;
    if (!ok && ++mismatches <= 10) FAIL_CHECK("f32 bits ", f32_bits(x), " (", x, "): hardware ", hw, " software ", sw);
  };
  for (int i = 0; i < 1000000; ++i) {
    check_one(f32_from_bits(static_cast<uint32_t>(rng())));  // every exponent, NaNs and infs included
    check_one(near(rng));
    check_one(small(rng));  // the subnormal range of f16
  }
  CHECK(mismatches == 0);
}
#endif

// ---- bf16 ----------------------------------------------------------------------------------------

TEST_CASE("common: bf16 exact values, rounding and specials") {
  CHECK(f32_to_bf16_bits(1.0f) == 0x3f80);
  CHECK(f32_to_bf16_bits(-2.0f) == 0xc000);
  CHECK(f32_to_bf16_bits(0.0f) == 0x0000);
  CHECK(f32_to_bf16_bits(-0.0f) == 0x8000);
  CHECK(f32_to_bf16_bits(3.0f) == 0x4040);
  // Ties: the dropped half is exactly 0x8000.
  CHECK(f32_to_bf16_bits(f(0x3f808000u)) == 0x3f80);  // even stays
  CHECK(f32_to_bf16_bits(f(0x3f818000u)) == 0x3f82);  // odd rounds up
  CHECK(f32_to_bf16_bits(f(0x3f808001u)) == 0x3f81);  // above the tie
  CHECK(f32_to_bf16_bits(f(0x3f807fffu)) == 0x3f80);  // below the tie
  CHECK(f32_to_bf16_bits(f(0xbf818000u)) == 0xbf82);
  CHECK(f32_to_bf16_bits(f(0x3fff8000u)) == 0x4000);  // carry into the exponent
  // Subnormals round like normals.
  CHECK(f32_to_bf16_bits(f(0x00000001u)) == 0x0000);
  CHECK(f32_to_bf16_bits(f(0x00008000u)) == 0x0000);
  CHECK(f32_to_bf16_bits(f(0x00018000u)) == 0x0002);
  CHECK(f32_to_bf16_bits(f(0x00010000u)) == 0x0001);
  CHECK(f32_to_bf16_bits(f(0x80008001u)) == 0x8001);
  // Overflow: the largest bf16 is 0x7f7f; values at or past the midpoint to 2^128 become inf.
  CHECK(f32_to_bf16_bits(f(0x7f7f0000u)) == 0x7f7f);
  CHECK(f32_to_bf16_bits(f(0x7f7f7fffu)) == 0x7f7f);
  CHECK(f32_to_bf16_bits(f(0x7f7f8000u)) == 0x7f80);
  CHECK(f32_to_bf16_bits(std::numeric_limits<float>::max()) == 0x7f80);
  CHECK(f32_to_bf16_bits(-std::numeric_limits<float>::max()) == 0xff80);
  CHECK(f32_to_bf16_bits(std::numeric_limits<float>::infinity()) == 0x7f80);
  CHECK(f32_to_bf16_bits(-std::numeric_limits<float>::infinity()) == 0xff80);
  // NaN stays NaN, including payloads that live only in the dropped low bits, and keeps its sign.
  for (uint32_t bits : {0x7fc00000u, 0x7f800001u, 0x7f80ffffu, 0x7fffffffu, 0x7fbf0000u}) {
    CAPTURE(bits);
    CHECK(bf16_is_nan(f32_to_bf16_bits(f(bits))));
    CHECK((f32_to_bf16_bits(f(bits)) & 0x8000) == 0);
    CHECK(bf16_is_nan(f32_to_bf16_bits(f(bits | 0x80000000u))));
    CHECK((f32_to_bf16_bits(f(bits | 0x80000000u)) & 0x8000) == 0x8000);
  }
  CHECK(bf16_bits_to_f32(0x3f80) == 1.0f);
  CHECK(bf16_bits_to_f32(0x7f7f) == f(0x7f7f0000u));
  CHECK(std::isnan(bf16_bits_to_f32(0x7fc0)));
  CHECK(std::signbit(bf16_bits_to_f32(0x8000)));
  CHECK(BFloat16(1.5f).bits == 0x3fc0);
  CHECK(float(BFloat16::from_bits(0x4049)) == 3.140625f);
}

TEST_CASE("common: bf16 all 65536 bit patterns round-trip through f32") {
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t b = static_cast<uint16_t>(i);
    const float x = bf16_bits_to_f32(b);
    if (f32_bits(x) != (uint32_t(b) << 16)) FAIL_CHECK("bf16 ", b, " decoded to bits ", f32_bits(x));
    const uint16_t back = f32_to_bf16_bits(x);
    if (bf16_is_nan(b)) {
      if (!bf16_is_nan(back) || (back & 0x8000) != (b & 0x8000)) FAIL_CHECK("bf16 NaN ", b, " came back as ", back);
    } else if (back != b) {
      FAIL_CHECK("bf16 ", b, " -> ", x, " -> ", back);
    }
  }
}

TEST_CASE("common: bf16 is the nearest bf16 for random floats") {
  std::mt19937 rng(7);
  int bad = 0;
  for (int i = 0; i < 1000000; ++i) {
    const uint32_t x = static_cast<uint32_t>(rng());
    if ((x & 0x7fffffffu) >= 0x7f800000u) continue;  // specials are covered above
    const uint16_t got = f32_to_bf16_bits(f(x));
    // Reference: the candidates truncate and truncate+1 (in magnitude), pick the nearer, ties even.
    const uint32_t t = x >> 16;
    const double v = double(f(x));
    const double lo = double(bf16_bits_to_f32(static_cast<uint16_t>(t)));
    const uint32_t up = t + 1;
    double hi;
    if (((up << 16) & 0x7fffffffu) >= 0x7f800000u) {
      hi = std::copysign(std::ldexp(1.0, 128), v);  // the next step is 2^128, which becomes inf
    } else {
      hi = double(bf16_bits_to_f32(static_cast<uint16_t>(up)));
    }
    const double dlo = std::abs(v - lo), dhi = std::abs(hi - v);
    uint32_t want = (dlo < dhi || (dlo == dhi && (t & 1u) == 0)) ? t : up;
    if (got != static_cast<uint16_t>(want) && ++bad <= 10) FAIL_CHECK("f32 bits ", x, ": got ", got, " want ", want);
  }
  CHECK(bad == 0);
}

// ---- Philox ----------------------------------------------------------------------------------------

TEST_CASE("common: philox4x32-10 matches the Random123 known-answer vectors") {
  auto check = [](U32x4 got, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
    CHECK(got.v[0] == a);
    CHECK(got.v[1] == b);
    CHECK(got.v[2] == c);
    CHECK(got.v[3] == d);
  };
  check(philox4x32_10(0, 0, 0, 0, 0, 0), 0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u);
  check(philox4x32_10(0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu), 0x408f276du,
        0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu);
  check(philox4x32_10(0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u, 0xa4093822u, 0x299f31d0u), 0xd16cfe09u,
        0x94fdccebu, 0x5001e420u, 0x24126ea1u);
}

TEST_CASE("common: philox_block maps (seed, block) to counter and key") {
  for (uint64_t seed : {0ull, 1ull, 0x299f31d0a4093822ull, 0xffffffffffffffffull}) {
    for (uint64_t block : {0ull, 1ull, 0x85a308d3243f6a88ull, 0x100000000ull}) {
      const U32x4 a = philox_block(seed, block);
      const U32x4 b = philox4x32_10(uint32_t(block & 0xffffffffu), uint32_t(block >> 32), 0, 0,
                                    uint32_t(seed & 0xffffffffu), uint32_t(seed >> 32));
      for (int j = 0; j < 4; ++j) CHECK(a.v[j] == b.v[j]);
    }
  }
  // The first KAT is seed 0, block 0.
  CHECK(philox_block(0, 0).v[0] == 0x6627e8d5u);
  CHECK(philox_block(0, 0).v[3] == 0x9b00dbd8u);
  // Different blocks and different seeds give different streams.
  CHECK(philox_block(0, 1).v[0] != philox_block(0, 0).v[0]);
  CHECK(philox_block(1, 0).v[0] != philox_block(0, 0).v[0]);
  // The high half of the seed matters too.
  CHECK(philox_block(1ull << 32, 0).v[0] != philox_block(0, 0).v[0]);
}

TEST_CASE("common: u32_to_uniform ranges") {
  CHECK(u32_to_uniform(0u) == 0.0f);
  CHECK(u32_to_uniform(0xffffffffu) == 1.0f - std::ldexp(1.0f, -24));
  CHECK(u32_to_uniform(0xffffffffu) < 1.0f);
  CHECK(u32_to_uniform(0x80000000u) == 0.5f);
  CHECK(u32_to_uniform(0x000000ffu) == 0.0f);  // only the top 24 bits count
  CHECK(u32_to_uniform(0x00000100u) == std::ldexp(1.0f, -24));
  CHECK(u32_to_uniform_pos(0u) == std::ldexp(1.0f, -24));
  CHECK(u32_to_uniform_pos(0u) > 0.0f);
  CHECK(u32_to_uniform_pos(0xffffffffu) == 1.0f);
  CHECK(u32_to_uniform_pos(0x80000000u) == 0.5f + std::ldexp(1.0f, -24));
  // Every value is an exact multiple of 2^-24.
  std::mt19937 rng(3);
  for (int i = 0; i < 10000; ++i) {
    const uint32_t x = static_cast<uint32_t>(rng());
    const float u = u32_to_uniform(x);
    CHECK_MESSAGE(double(u) * 16777216.0 == double(x >> 8), x);
    const float up = u32_to_uniform_pos(x);
    CHECK_MESSAGE(double(up) * 16777216.0 == double((x >> 8) + 1), x);
  }
}

TEST_CASE("common: philox uniforms have the moments of U[0,1)") {
  const int blocks = 250000;  // 1M samples
  double s = 0, s2 = 0, mn = 1, mx = 0;
  int64_t buckets[10] = {};
  int64_t out_of_range = 0;
  for (int b = 0; b < blocks; ++b) {
    const U32x4 r = philox_block(42, uint64_t(b));
    for (int j = 0; j < 4; ++j) {
      const double u = u32_to_uniform(r.v[j]);
      out_of_range += !(u >= 0.0 && u < 1.0);
      s += u;
      s2 += u * u;
      mn = std::min(mn, u);
      mx = std::max(mx, u);
      if (u >= 0.0 && u < 1.0) ++buckets[int(u * 10)];
    }
  }
  CHECK(out_of_range == 0);
  const double n = 4.0 * blocks;
  const double mean = s / n, var = s2 / n - mean * mean;
  CHECK(std::abs(mean - 0.5) < 5 * std::sqrt(1.0 / 12 / n));
  CHECK(std::abs(var - 1.0 / 12) < 1e-3);
  CHECK(mn < 1e-4);
  CHECK(mx > 1 - 1e-4);
  for (int64_t c : buckets) CHECK(std::abs(double(c) - n / 10) < 5 * std::sqrt(n * 0.1 * 0.9));
}

TEST_CASE("common: philox_normal4 is Box-Muller on lane pairs") {
  for (uint64_t b = 0; b < 1000; ++b) {
    const U32x4 r = philox_block(7, b);
    float out[4];
    philox_normal4(r, out);
    for (int j = 0; j < 2; ++j) {
      const double u1 = (double(r.v[2 * j] >> 8) + 1.0) / 16777216.0;
      const double u2 = double(r.v[2 * j + 1] >> 8) / 16777216.0;
      const double rad = std::sqrt(-2.0 * std::log(u1));
      const double z0 = rad * std::cos(2 * M_PI * u2), z1 = rad * std::sin(2 * M_PI * u2);
      CHECK(std::isfinite(out[2 * j]));
      CHECK(std::isfinite(out[2 * j + 1]));
      CHECK_NEAR(double(out[2 * j]), z0, 1e-5, 1e-4);
      CHECK_NEAR(double(out[2 * j + 1]), z1, 1e-5, 1e-4);
    }
  }
  // The extremes of the uniform inputs stay finite: u1 = 2^-24 gives the largest radius.
  U32x4 extreme{{0u, 0u, 0xffffffffu, 0xffffffffu}};
  float out[4];
  philox_normal4(extreme, out);
  for (float v : out) CHECK(std::isfinite(v));
  CHECK_NEAR(double(out[0]), std::sqrt(-2.0 * std::log(std::ldexp(1.0, -24))), 0.0, 1e-5);
  CHECK(std::abs(out[2]) < 1e-6);  // u1 = 1: radius 0
}

TEST_CASE("common: philox normals have the moments of N(0,1)") {
  const int blocks = 250000;
  double s = 0, s2 = 0, s3 = 0, s4 = 0;
  int64_t within1 = 0;
  for (int b = 0; b < blocks; ++b) {
    float z[4];
    philox_normal4(philox_block(1234, uint64_t(b)), z);
    for (float v : z) {
      const double x = v;
      s += x;
      s2 += x * x;
      s3 += x * x * x;
      s4 += x * x * x * x;
      within1 += std::abs(x) < 1.0;
    }
  }
  const double n = 4.0 * blocks;
  const double mean = s / n, var = s2 / n - mean * mean;
  CHECK(std::abs(mean) < 5 / std::sqrt(n));
  CHECK(std::abs(var - 1) < 5 * std::sqrt(2.0 / n));
  CHECK(std::abs(s3 / n) < 5 * std::sqrt(15.0 / n));
  CHECK(std::abs(s4 / n - 3) < 5 * std::sqrt(96.0 / n));
  CHECK(std::abs(double(within1) / n - 0.682689492) < 5 * std::sqrt(0.2168 / n));
}

// ---- activations ------------------------------------------------------------------------------------

TEST_CASE("common: sigmoid values, stability and derivative") {
  CHECK(math::sigmoid(0.0) == 0.5);
  CHECK(math::sigmoid(0.0f) == 0.5f);
  const double xs[] = {-30, -5, -1, -0.5, 0.25, 1, 3, 20};
  for (double x : xs) {
    const long double ref = 1.0L / (1.0L + std::exp(-(long double)x));
    CAPTURE(x);
    CHECK_NEAR(math::sigmoid(x), double(ref), 0.0, 1e-14);
    CHECK_NEAR(double(math::sigmoid(float(x))), double(ref), 0.0, 1e-6);
    // sigmoid'(x) = s (1 - s)
    const double h = 1e-5;
    const double fd = (math::sigmoid(x + h) - math::sigmoid(x - h)) / (2 * h);
    CHECK_NEAR(fd, double(ref * (1 - ref)), 1e-9, 1e-6);
  }
  CHECK_NEAR(math::sigmoid(1.0), 0.7310585786300049, 0.0, 1e-14);
  CHECK_NEAR(math::sigmoid(-3.0), 0.04742587317756678, 0.0, 1e-13);
  // Large magnitudes saturate without NaN.
  CHECK(math::sigmoid(1000.0) == 1.0);
  CHECK(math::sigmoid(-1000.0) == 0.0);
  CHECK(math::sigmoid(100.0f) == 1.0f);
  CHECK(math::sigmoid(-100.0f) >= 0.0f);
  CHECK(!std::isnan(math::sigmoid(-100.0f)));
  CHECK_NEAR(math::sigmoid(-100.0), std::exp(-100.0), 0.0, 1e-12);
}

TEST_CASE("common: gelu (erf) keeps its relative precision in the negative tail") {
  // Reference in long double: x/2 * erfc(-x/sqrt2). Through 1 + erf(x/sqrt2), x = -8.25 lost every
  // digit (1 + erf rounds to a multiple of 2^-52 near 1e-16), and a GPU's erf an ulp from libm's
  // made kiln doctor's self-test report a factor of two.
  for (double x : {-8.25, -6.0, -3.0, -0.5, 0.0, 0.7, 4.0}) {
    const long double want = 0.5L * x * std::erfc(-static_cast<long double>(x) / std::sqrt(2.0L));
    CHECK_NEAR(math::gelu_erf(x), double(want), 0.0, 1e-14);
    // f32: x/sqrt2 rounded to f32 moves erfc by about x^2 ulps in the tail
    CHECK_NEAR(double(math::gelu_erf(float(x))), double(want), 1e-30, 2e-5);
    const long double cdf = 0.5L * std::erfc(-static_cast<long double>(x) / std::sqrt(2.0L));
    const long double grad = cdf + x * std::exp(-0.5L * x * x) / std::sqrt(2.0L * 3.14159265358979323846L);
    CHECK_NEAR(math::gelu_erf_grad(x), double(grad), 1e-300, 1e-13);
  }
  CHECK(math::gelu_erf(-8.25) < 0.0);  // x times a positive probability, not a cancelled zero
}

TEST_CASE("common: relu and rsqrt") {
  CHECK(math::relu(-2.0) == 0.0);
  CHECK(math::relu(3.5) == 3.5);
  CHECK(math::relu(0.0f) == 0.0f);
  CHECK(math::rsqrt(4.0) == 0.5);
  CHECK(math::rsqrt(0.25f) == 2.0f);
}

TEST_CASE("common: gelu values and derivatives against finite differences") {
  // Reference values computed independently (x * Phi(x), and the tanh form).
  struct Ref {
    double x, erf_v, tanh_v;
  };
  const Ref refs[] = {
      {-3, -0.00404969409489031, -0.0036373920817729943}, {-1, -0.15865525393145707, -0.15880800939172324},
      {-0.5, -0.15426876936299344, -0.15428599017485606}, {0, 0.0, 0.0},
      {0.5, 0.34573123063700656, 0.34571400982514394},    {1, 0.8413447460685429, 0.8411919906082768},
      {3, 2.99595030590511, 2.996362607918227},
  };
  for (const Ref& r : refs) {
    CAPTURE(r.x);
    CHECK_NEAR(math::gelu_erf(r.x), r.erf_v, 1e-15, 1e-12);
    CHECK_NEAR(math::gelu_tanh(r.x), r.tanh_v, 1e-15, 1e-12);
    CHECK_NEAR(double(math::gelu_erf(float(r.x))), r.erf_v, 1e-6, 1e-5);
    CHECK_NEAR(double(math::gelu_tanh(float(r.x))), r.tanh_v, 1e-6, 1e-5);
  }
  for (double x = -6.0; x <= 6.0; x += 0.37) {
    CAPTURE(x);
    const double h = 1e-5;
    const double fd_erf = (math::gelu_erf(x + h) - math::gelu_erf(x - h)) / (2 * h);
    const double fd_tanh = (math::gelu_tanh(x + h) - math::gelu_tanh(x - h)) / (2 * h);
    CHECK_NEAR(math::gelu_erf_grad(x), fd_erf, 1e-8, 1e-7);
    CHECK_NEAR(math::gelu_tanh_grad(x), fd_tanh, 1e-8, 1e-7);
    CHECK_NEAR(double(math::gelu_erf_grad(float(x))), fd_erf, 1e-5, 1e-4);
    CHECK_NEAR(double(math::gelu_tanh_grad(float(x))), fd_tanh, 1e-5, 1e-4);
  }
  // Known derivative values: gelu'(0) = 0.5 in both forms.
  CHECK(math::gelu_erf_grad(0.0) == 0.5);
  CHECK(math::gelu_tanh_grad(0.0) == 0.5);
  // Far tails: gelu(x) -> x for large x and -> 0 for very negative x.
  CHECK_NEAR(math::gelu_erf(10.0), 10.0, 0.0, 1e-15);
  CHECK(std::abs(math::gelu_erf(-10.0)) < 1e-20);
  CHECK_NEAR(math::gelu_erf_grad(10.0), 1.0, 1e-15, 0.0);
  CHECK(std::abs(math::gelu_tanh_grad(-10.0)) < 1e-10);
}

#include "kernels/cpu/vmath.h"

TEST_CASE("cpu vexp: within 2 ulp of exp over the float range, 0 and inf at the ends") {
  double worst = 0;
  for (float x = -87.0f; x < 88.0f; x += 0.0137f) {
    const double want = std::exp(double(x));
    const double got = double(kiln::cpu::vexp(x));
    const double ulp = std::nextafter(float(want), INFINITY) - float(want);
    worst = std::max(worst, std::abs(got - want) / ulp);
  }
  CHECK(worst <= 2.0);
  CHECK(kiln::cpu::vexp(0.0f) == 1.0f);
  CHECK(kiln::cpu::vexp(-200.0f) < 1e-37f);
  CHECK(std::isinf(kiln::cpu::vexp(100.0f)));
}

TEST_CASE("doctor self-test: a GPU's canonical NaN matches the host's payload NaN; real differences do not") {
  constexpr int n = 1024;  // what device_self_test runs
  std::vector<uint32_t> dev(size_t(kSelfTestWords) * n);
  for (int i = 0; i < n; ++i) self_test_row(i, dev.data() + kSelfTestWords * i);
  // What a GPU returns: cvt.f32.f16 gives the canonical NaN for every f16 NaN pattern.
  int payloads = 0;
  for (int i = 0; i < n; ++i) {
    uint32_t& w = dev[size_t(kSelfTestWords * i + 3)];
    if (self_test_is_nan(w) && w != 0x7fffffffu) {
      w = 0x7fffffffu;
      ++payloads;
    }
  }
  REQUIRE(payloads > 0);  // the sweep does reach NaNs with payloads (the bug this rule fixes)
  CHECK(self_test_mismatch(dev.data(), n).empty());
  auto with = [&](int i, int j, int64_t delta) {
    std::vector<uint32_t> d = dev;
    d[size_t(kSelfTestWords * i + j)] = uint32_t(int64_t(d[size_t(kSelfTestWords * i + j)]) + delta);
    return self_test_mismatch(d.data(), n);
  };
  CHECK(with(7, 4, 1).empty());  // erf: an ulp apart is fine
  CHECK(contains(with(7, 4, 2), "gelu_erf differs at element 7"));
  CHECK(contains(with(3, 0, 1), "philox differs at element 3"));
  CHECK(contains(with(100, 3, 1), "f16->f32 differs at element 100"));  // a number is not a NaN's neighbour
  CHECK(contains(with(200, 1, 1), "f32->f16 differs at element 200"));
}
