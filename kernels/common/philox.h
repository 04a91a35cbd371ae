// Philox 4x32-10 (Salmon et al., SC'11): a counter-based generator, so a random stream is a pure
// function of (seed, offset) and the CPU and GPU draw the same numbers for the same element.
#pragma once
#include <cmath>
#include <cstdint>

#include "base/macros.h"

namespace kiln {

struct U32x4 {
  uint32_t v[4];
};

KILN_HD void mulhilo32(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  const uint64_t p = uint64_t(a) * uint64_t(b);
  hi = static_cast<uint32_t>(p >> 32);
  lo = static_cast<uint32_t>(p);
}

// One block of four 32-bit outputs for the 128-bit counter (c0..c3) under the 64-bit key (k0, k1).
KILN_HD U32x4 philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1) {
  constexpr uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u, W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
  for (int r = 0; r < 10; ++r) {
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo32(M0, c0, hi0, lo0);
    mulhilo32(M1, c2, hi1, lo1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += W0;
    k1 += W1;
  }
  return U32x4{{c0, c1, c2, c3}};
}

// Kiln's stream: element i of a draw that starts at `offset` (a multiple of 4) is lane (i % 4) of
// the block with counter (offset/4 + i/4) under key = seed.
KILN_HD U32x4 philox_block(uint64_t seed, uint64_t block) {
  return philox4x32_10(static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), 0u, 0u,
                       static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

// [0, 1) with 24 random bits, exactly representable in f32.
KILN_HD float u32_to_uniform(uint32_t x) { return static_cast<float>(x >> 8) * (1.0f / 16777216.0f); }
// [0, 1) with the top `bits` random bits (1..24), k * 2^-bits: exact in a type whose significand has
// `bits` bits, so a 16-bit fill never rounds up to 1. bits = 24 is u32_to_uniform's number.
KILN_HD float u32_to_uniform_bits(uint32_t x, int bits) {
  return static_cast<float>(x >> (32 - bits)) * (1.0f / static_cast<float>(1u << bits));
}
// (0, 1], safe for log().
KILN_HD float u32_to_uniform_pos(uint32_t x) { return static_cast<float>((x >> 8) + 1u) * (1.0f / 16777216.0f); }

// Box-Muller on lanes (0,1) and (2,3): four standard normals from one block.
KILN_HD void philox_normal4(const U32x4& r, float out[4]) {
  constexpr float two_pi = 6.28318530717958647692f;
  for (int j = 0; j < 2; ++j) {
    const float u1 = u32_to_uniform_pos(r.v[2 * j]);
    const float u2 = u32_to_uniform(r.v[2 * j + 1]);
    const float rad = std::sqrt(-2.0f * std::log(u1));
    out[2 * j] = rad * std::cos(two_pi * u2);
    out[2 * j + 1] = rad * std::sin(two_pi * u2);
  }
}

}  // namespace kiln
