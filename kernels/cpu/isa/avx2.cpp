// The AVX2 + FMA leaf kernels (compiled with -mavx2 -mfma -mf16c and without AVX-512, whatever the
// rest of the build targets; run only where base/cpu_isa.h's cpu_isa() says avx2 or better). Everything but
// avx2_leaves() has internal linkage (leaves.h says why).
#include <immintrin.h>

#include <type_traits>

#include <math.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "base/macros.h"
#include "kernels/backend.h"
#include "kernels/cpu/isa/leaves.h"

namespace kiln::cpu::isa {
namespace {

// 16 ymm registers: a 6 x 2-vector tile (12 accumulators, 2 of B, 1 broadcast).
struct F32 {
  using T = float;
  using V = __m256;
  using Mask = __m256i;  // a lane is on when its sign bit is set
  static constexpr int kW = 8, kNV = 2;
  static V zero() { return _mm256_setzero_ps(); }
  static V set1(float x) { return _mm256_set1_ps(x); }
  static V load(const float* p) { return _mm256_load_ps(p); }
  static V loadu(const float* p) { return _mm256_loadu_ps(p); }
  static V maskz_loadu(Mask m, const float* p) { return _mm256_maskload_ps(p, m); }
  static void store(float* p, V v) { _mm256_store_ps(p, v); }
  static void storeu(float* p, V v) { _mm256_storeu_ps(p, v); }
  static void mask_storeu(float* p, Mask m, V v) { _mm256_maskstore_ps(p, m, v); }
  static V fmadd(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static Mask tail(int64_t valid) {
    const int n = valid >= kW ? kW : valid <= 0 ? 0 : int(valid);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  // r[i][j] -> r[j][i] for an 8 x 8 block: unpack pairs, 4x4 within 128-bit lanes, then swap halves.
  static void transpose(V (&r)[kW]) {
    V b[8], c[8];
    for (int i = 0; i < 8; i += 2) {
      b[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
      b[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int g = 0; g < 8; g += 4) {  // c[g + j], half H: column 4H + j, rows g..g+3
      c[g + 0] = _mm256_shuffle_ps(b[g + 0], b[g + 2], 0x44);
      c[g + 1] = _mm256_shuffle_ps(b[g + 0], b[g + 2], 0xEE);
      c[g + 2] = _mm256_shuffle_ps(b[g + 1], b[g + 3], 0x44);
      c[g + 3] = _mm256_shuffle_ps(b[g + 1], b[g + 3], 0xEE);
    }
    for (int j = 0; j < 4; ++j) {
      r[j] = _mm256_permute2f128_ps(c[j], c[4 + j], 0x20);
      r[4 + j] = _mm256_permute2f128_ps(c[j], c[4 + j], 0x31);
    }
  }
};

struct F64 {
  using T = double;
  using V = __m256d;
  using Mask = __m256i;
  static constexpr int kW = 4, kNV = 2;
  static V zero() { return _mm256_setzero_pd(); }
  static V set1(double x) { return _mm256_set1_pd(x); }
  static V load(const double* p) { return _mm256_load_pd(p); }
  static V loadu(const double* p) { return _mm256_loadu_pd(p); }
  static V maskz_loadu(Mask m, const double* p) { return _mm256_maskload_pd(p, m); }
  static void store(double* p, V v) { _mm256_store_pd(p, v); }
  static void storeu(double* p, V v) { _mm256_storeu_pd(p, v); }
  static void mask_storeu(double* p, Mask m, V v) { _mm256_maskstore_pd(p, m, v); }
  static V fmadd(V a, V b, V c) { return _mm256_fmadd_pd(a, b, c); }
  static V mul(V a, V b) { return _mm256_mul_pd(a, b); }
  static Mask tail(int64_t valid) {
    const int64_t n = valid >= kW ? kW : valid <= 0 ? 0 : valid;
    return _mm256_cmpgt_epi64(_mm256_set1_epi64x(n), _mm256_setr_epi64x(0, 1, 2, 3));
  }
  // 4 x 4: unpack pairs, then swap 128-bit halves.
  static void transpose(V (&r)[kW]) {
    const V b0 = _mm256_unpacklo_pd(r[0], r[1]), b1 = _mm256_unpackhi_pd(r[0], r[1]);
    const V b2 = _mm256_unpacklo_pd(r[2], r[3]), b3 = _mm256_unpackhi_pd(r[2], r[3]);
    r[0] = _mm256_permute2f128_pd(b0, b2, 0x20);
    r[1] = _mm256_permute2f128_pd(b1, b3, 0x20);
    r[2] = _mm256_permute2f128_pd(b0, b2, 0x31);
    r[3] = _mm256_permute2f128_pd(b1, b3, 0x31);
  }
};

#include "kernels/cpu/isa/gemm_leaves.inc"
#include "kernels/cpu/isa/rows.inc"
// clang-format off: convert.inc follows rows.inc
#include "kernels/cpu/isa/convert.inc"
// clang-format on

// Philox (loops.inc) in ymm registers: 8 blocks at once.
typedef uint32_t PhiloxV __attribute__((vector_size(32)));
constexpr int kPhiloxLanes = 8;
inline PhiloxV philox_mulhi(PhiloxV a, uint32_t m) {
  const __m256i x = __m256i(a), mv = _mm256_set1_epi32(int(m));
  const __m256i even = _mm256_mul_epu32(x, mv), odd = _mm256_mul_epu32(_mm256_srli_epi64(x, 32), mv);
  return PhiloxV(_mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA));
}
// A 4 x 8 transpose: unpacks put block 4 j + k in 128-bit lane j of u[k]; permutes pair the lanes up.
inline void philox_store(const PhiloxV (&c)[4], uint32_t* out) {
  const __m256i t0 = _mm256_unpacklo_epi32(__m256i(c[0]), __m256i(c[1])),
                t1 = _mm256_unpackhi_epi32(__m256i(c[0]), __m256i(c[1])),
                t2 = _mm256_unpacklo_epi32(__m256i(c[2]), __m256i(c[3])),
                t3 = _mm256_unpackhi_epi32(__m256i(c[2]), __m256i(c[3]));
  const __m256i u0 = _mm256_unpacklo_epi64(t0, t2), u1 = _mm256_unpackhi_epi64(t0, t2),
                u2 = _mm256_unpacklo_epi64(t1, t3), u3 = _mm256_unpackhi_epi64(t1, t3);
  __m256i* o = reinterpret_cast<__m256i*>(out);
  _mm256_storeu_si256(o, _mm256_permute2x128_si256(u0, u1, 0x20));
  _mm256_storeu_si256(o + 1, _mm256_permute2x128_si256(u2, u3, 0x20));
  _mm256_storeu_si256(o + 2, _mm256_permute2x128_si256(u0, u1, 0x31));
  _mm256_storeu_si256(o + 3, _mm256_permute2x128_si256(u2, u3, 0x31));
}
#include "kernels/cpu/isa/loops.inc"

// ---- convolution (conv.cpp describes the schemes: the AVX-512 ones in 8-lane vectors, tiles sized for 16 ymm) --

#include "kernels/cpu/isa/im2col_pack.inc"

// The lane mask of 8 mask bits (bit l: lane l on).
__m256i expand8(unsigned bits) {
  const __m256i lane = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  return _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(int(bits)), lane), lane);
}
// Stores the lanes of `bits` (the low ones): a plain store for all 8 (AVX2's masked stores are slow on AMD).
void store_lanes(float* p, unsigned bits, __m256 v) {
  if (bits == 0xFF)
    _mm256_storeu_ps(p, v);
  else if (bits)
    _mm256_maskstore_ps(p, expand8(bits), v);
}

// Lanes [lo, hi) of each 8-wide step are inside the row; the masked load touches only those.
void copy_row_stride1(const float* src, int64_t iw0, int64_t w, int64_t len, float* o) {
  for (int64_t e = 0; e < len; e += 8) {
    const int64_t n = len - e < 8 ? len - e : 8, base = iw0 + e;
    const int64_t lo = clamp64(-base, 0, n), hi = clamp64(w - base, lo, n);
    const unsigned in = ((1u << hi) - 1) & ~((1u << lo) - 1);
    const __m256 v = in == 0xFF ? _mm256_loadu_ps(src + base) : _mm256_maskload_ps(src + base, expand8(in));
    store_lanes(o + e, (1u << n) - 1, v);
  }
}

// A 64-pixel tile as 4 groups of 16 pixels (2 vectors), each with a register tile of kRows x 2
// vectors: per input channel and tap, 2 loads of x and kRows broadcasts of w feed 2 kRows FMAs.
// kPlain (every address the tile reads lies inside x's buffer): a plain load and an AND with the lane
// mask, which on AMD cores is much cheaper than a masked load; else masked loads, which touch only
// the lanes inside the plane. The lanes outside are +0 either way.
// Each output's sum runs over (c, t) in order, as the AVX-512 leaf's does: the same bits.
template <int kRows, bool kPlain>
void direct_tile(const float* x, int64_t plane, int64_t cg, const float* w, int64_t wstride, int64_t taps,
                 const int64_t* shift, const Mask16 (*masks)[4], float* y, int64_t ldy, const Mask16* store) {
  __m256i lm[kDirectMaxTaps][8];  // the tile's load masks as lane vectors, per tap and 8-pixel vector
  for (int64_t t = 0; t < taps; ++t)
    for (int h = 0; h < 8; ++h) lm[t][h] = expand8((unsigned(masks[t][h >> 1]) >> (8 * (h & 1))) & 0xFFu);
  for (int g = 0; g < 4; ++g) {
    if (store[g] == 0) continue;  // past the plane
    __m256 acc[kRows][2];
#pragma GCC unroll 6
    for (int r = 0; r < kRows; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    const float* xc = x + 16 * g;
    const float* wc = w;
    if ((store[g] >> 8) == 0) {  // the plane ends in the group's first 8 pixels: one vector
      for (int64_t c = 0; c < cg; ++c, xc += plane, wc += taps)
        for (int64_t t = 0; t < taps; ++t) {
          const float* xs = xc + shift[t];
          const __m256 b0 = kPlain ? _mm256_and_ps(_mm256_loadu_ps(xs), _mm256_castsi256_ps(lm[t][2 * g]))
                                   : _mm256_maskload_ps(xs, lm[t][2 * g]);
#pragma GCC unroll 6
          for (int r = 0; r < kRows; ++r)
            acc[r][0] = _mm256_fmadd_ps(_mm256_broadcast_ss(wc + r * wstride + t), b0, acc[r][0]);
        }
#pragma GCC unroll 6
      for (int r = 0; r < kRows; ++r) store_lanes(y + r * ldy + 16 * g, store[g], acc[r][0]);
      continue;
    }
    for (int64_t c = 0; c < cg; ++c, xc += plane, wc += taps) {
      for (int64_t t = 0; t < taps; ++t) {
        const float* xs = xc + shift[t];
        __m256 b0, b1;
        if constexpr (kPlain) {
          b0 = _mm256_and_ps(_mm256_loadu_ps(xs), _mm256_castsi256_ps(lm[t][2 * g]));
          b1 = _mm256_and_ps(_mm256_loadu_ps(xs + 8), _mm256_castsi256_ps(lm[t][2 * g + 1]));
        } else {
          b0 = _mm256_maskload_ps(xs, lm[t][2 * g]);
          b1 = _mm256_maskload_ps(xs + 8, lm[t][2 * g + 1]);
        }
#pragma GCC unroll 6
        for (int r = 0; r < kRows; ++r) {
          const __m256 a = _mm256_broadcast_ss(wc + r * wstride + t);
          acc[r][0] = _mm256_fmadd_ps(a, b0, acc[r][0]);
          acc[r][1] = _mm256_fmadd_ps(a, b1, acc[r][1]);
        }
      }
    }
    const unsigned lo = store[g] & 0xFFu, hi = unsigned(store[g]) >> 8;
#pragma GCC unroll 6
    for (int r = 0; r < kRows; ++r) {
      store_lanes(y + r * ldy + 16 * g, lo, acc[r][0]);
      store_lanes(y + r * ldy + 16 * g + 8, hi, acc[r][1]);
    }
  }
}
template <int kRows> void direct_block(const float* x, int64_t plane, int64_t cg, const float* w, int64_t wstride,
                                       int64_t taps, const int64_t* shift, const Mask16 (*masks)[4], float* y,
                                       int64_t ldy, const Mask16* store, bool inside) {
  if (inside)
    direct_tile<kRows, true>(x, plane, cg, w, wstride, taps, shift, masks, y, ldy, store);
  else
    direct_tile<kRows, false>(x, plane, cg, w, wstride, taps, shift, masks, y, ldy, store);
}

// kV vectors of 8 output channels x kP pixels (conv.cpp's direct_conv_oc): per (tap, channel) kV loads
// of w and kP broadcasts of x feed kV * kP FMAs (2 x 6: 12 sums + 2 + 1 of the 16 ymm registers). AVX2
// has no scatter: the tile goes through a small buffer to y's rows.
template <int kV, int kP> void direct_oc_tile(int64_t cg, int64_t taps, int64_t plane, const float* const* px,
                                              const float* w, float* const* y, int64_t ldy, int pixels) {
  __m256 acc[kV][kP];
#pragma GCC unroll 4
  for (int v = 0; v < kV; ++v)
#pragma GCC unroll 8
    for (int i = 0; i < kP; ++i) acc[v][i] = _mm256_setzero_ps();
  for (int64_t t = 0; t < taps; ++t) {
    const float* b[kP];
#pragma GCC unroll 8
    for (int i = 0; i < kP; ++i) b[i] = px[t * kP + i];
    const float* wt = w + t * cg * (8 * kV);
    for (int64_t c = 0, off = 0; c < cg; ++c, off += plane, wt += 8 * kV) {
      __m256 wv[kV];
#pragma GCC unroll 4
      for (int v = 0; v < kV; ++v) wv[v] = _mm256_loadu_ps(wt + 8 * v);
#pragma GCC unroll 8
      for (int i = 0; i < kP; ++i) {
        const __m256 xb = _mm256_broadcast_ss(b[i] + off);
#pragma GCC unroll 4
        for (int v = 0; v < kV; ++v) acc[v][i] = _mm256_fmadd_ps(wv[v], xb, acc[v][i]);
      }
    }
  }
  alignas(32) float buf[kP][8 * kV];
#pragma GCC unroll 8
  for (int i = 0; i < kP; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < kV; ++v) _mm256_store_ps(buf[i] + 8 * v, acc[v][i]);
  for (int i = 0; i < pixels; ++i)
    for (int j = 0; j < 8 * kV; ++j) y[i][j * ldy] = buf[i][j];
}

// The weight gradient's masks: each 16-pixel mask as two lane vectors (64 bytes, unaligned).
void expand_masks(const Mask16* in, int64_t n, void* out) {
  unsigned char* o = static_cast<unsigned char*>(out);
  for (int64_t i = 0; i < n; ++i, o += 64) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(o), expand8(in[i] & 0xFFu));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + 32), expand8(unsigned(in[i]) >> 8));
  }
}
__m256i mask_at(const void* masks, int64_t i) { return _mm256_loadu_si256(static_cast<const __m256i*>(masks) + i); }

// The sum of a vector's 8 lanes, folded in halves (a fixed order).
float lane_total(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Passes of kR rows x kWgradPairsAvx2 (3) pairs over the 8 rows, each reading its rows of gy and all 3 pairs
// of x over the images' pixels, 8 at a time. kPlain (every x address read lies inside x's buffer): whole-
// vector loads of x cleared by the tap masks, 2 passes of 4 rows (12 sums, the 3 x vectors held and the gy
// rows streamed one at a time: all 16 ymm registers); else masked loads, whose masks need a register: 4 passes of 2
// rows. 8 rows x 3 pairs leave no idle rows or pairs on 16, 32 and 64 channels of 3x3 taps (6 x 4 computed 18 rows for
// 16). The pixels go in blocks of about 512 (whole images where a plane is smaller), every pass over one block before
// the next, so the passes after the first read x from L1, not L2; the sums wait in memory between blocks. Each sum runs
// over images and vectors in order either way: the same bits.
constexpr int kWgradRowsAvx2 = 8, kWgradPairsAvx2 = 3;
template <int kR, bool kPlain> void wgrad_passes(const float* gy, int64_t gy_image, const float* x, int64_t x_image,
                                                 int64_t images, int64_t vecs, int64_t ohw, const int64_t* orow,
                                                 const int64_t* xoff, const void* const* xmask, const void* plane_mask,
                                                 float* sums) {
  constexpr int R = kWgradRowsAvx2, P = kWgradPairsAvx2;
  static_assert(R % kR == 0, "whole passes");
  constexpr int64_t kBlockSteps = 64;       // 8-pixel steps of a block
  const int64_t half_vecs = (ohw + 7) / 8;  // 8-lane vectors with a pixel in the plane (of the 2 * vecs)
  const int64_t block_images = half_vecs >= kBlockSteps ? 1 : kBlockSteps / half_vecs;
  const int64_t block_steps = block_images > 1 ? half_vecs : kBlockSteps;
  __m256 keep[R][P];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < P; ++j) keep[r][j] = _mm256_setzero_ps();
  for (int64_t n0 = 0; n0 < images; n0 += block_images) {
    const int64_t n1 = n0 + block_images < images ? n0 + block_images : images;
    for (int64_t h0 = 0; h0 < half_vecs; h0 += block_steps) {
      const int64_t h1 = h0 + block_steps < half_vecs ? h0 + block_steps : half_vecs;
      for (int pass = 0; pass < R / kR; ++pass) {
        __m256 acc[kR][P];
#pragma GCC unroll 4
        for (int r = 0; r < kR; ++r)
#pragma GCC unroll 3
          for (int j = 0; j < P; ++j) acc[r][j] = keep[kR * pass + r][j];
        const float* gyn = gy + n0 * gy_image;
        const float* xn = x + n0 * x_image;
        for (int64_t n = n0; n < n1; ++n, gyn += gy_image, xn += x_image) {
          const float* g[kR];
#pragma GCC unroll 4
          for (int r = 0; r < kR; ++r) g[r] = gyn + orow[kR * pass + r] * ohw;
          const float* xs[P];
#pragma GCC unroll 3
          for (int j = 0; j < P; ++j) xs[j] = xn + xoff[j];
          // x by each pair's tap masks; gy past the plane (the last group's tail) masked. The 3 x vectors stay
          // in registers and the gy rows come one at a time: 12 sums + 3 + 1, all 16 ymm registers.
          auto step = [&](int64_t h, auto whole) {
            const int64_t o = 8 * h;
            __m256 xv[P];
#pragma GCC unroll 3
            for (int j = 0; j < P; ++j) {
              if constexpr (kPlain)
                xv[j] = _mm256_and_ps(_mm256_loadu_ps(xs[j] + o), _mm256_castsi256_ps(mask_at(xmask[j], h)));
              else
                xv[j] = _mm256_maskload_ps(xs[j] + o, mask_at(xmask[j], h));
            }
#pragma GCC unroll 4
            for (int r = 0; r < kR; ++r) {
              __m256 gv;
              if constexpr (decltype(whole)::value)
                gv = _mm256_loadu_ps(g[r] + o);
              else
                gv = _mm256_maskload_ps(g[r] + o, mask_at(plane_mask, h));
#pragma GCC unroll 3
              for (int j = 0; j < P; ++j) acc[r][j] = _mm256_fmadd_ps(gv, xv[j], acc[r][j]);
            }
          };
          const int64_t hw = h1 < ohw / 8 ? h1 : ohw / 8;  // the vectors inside the plane
          for (int64_t h = h0; h < hw; ++h) step(h, std::true_type{});
          for (int64_t h = hw > h0 ? hw : h0; h < h1; ++h) step(h, std::false_type{});
        }
#pragma GCC unroll 4
        for (int r = 0; r < kR; ++r)
#pragma GCC unroll 3
          for (int j = 0; j < P; ++j) keep[kR * pass + r][j] = acc[r][j];
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < P; ++j) sums[r * P + j] = lane_total(keep[r][j]);
}
__attribute__((noinline)) void wgrad_tile(const float* gy, int64_t gy_image, const float* x, int64_t x_image,
                                          int64_t images, int64_t vecs, int64_t ohw, const int64_t* orow,
                                          const int64_t* xoff, const void* const* xmask, const void* plane_mask,
                                          float* sums, bool inside) {
  if (inside)
    wgrad_passes<4, true>(gy, gy_image, x, x_image, images, vecs, ohw, orow, xoff, xmask, plane_mask, sums);
  else
    wgrad_passes<2, false>(gy, gy_image, x, x_image, images, vecs, ohw, orow, xoff, xmask, plane_mask, sums);
}

Leaves make() {
  Leaves l{};
  l.name = "avx2";
  l.rows = row_leaves();
  add_conversions(l.rows);
  add_loops(l.rows);
  l.conv.mask_bytes = 64;
  l.conv.expand_masks = expand_masks;
  l.conv.pack_im2col_panel = pack_im2col_panel;
  l.conv.direct[0] = direct_block<1>;
  l.conv.direct[1] = direct_block<2>;
  l.conv.direct[2] = direct_block<3>;
  l.conv.direct[3] = direct_block<4>;
  l.conv.direct[4] = direct_block<5>;
  l.conv.direct[5] = direct_block<6>;
  l.conv.direct_oc[0] = {16, 6, direct_oc_tile<2, 6>};
  l.conv.wgrad_rows = kWgradRowsAvx2;
  l.conv.wgrad_pairs = kWgradPairsAvx2;
  l.conv.wgrad_tile = wgrad_tile;
  // K blocks of 256: a 256 x 16 panel of B is 16 KiB, half of Zen 2/3's and Haswell's 32 KiB L1.
  l.f32 = gemm_leaves<F32>(256, 384);
  l.f64 = gemm_leaves<F64>(256, 384);
  return l;
}

}  // namespace

const Leaves& avx2_leaves() {
  static const Leaves leaves = make();
  return leaves;
}

}  // namespace kiln::cpu::isa
