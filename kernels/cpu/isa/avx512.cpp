// The AVX-512 leaf kernels (compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma whatever
// the rest of the build targets; run only where base/cpu_isa.h's cpu_isa() says avx512). Everything but
// avx512_leaves() has internal linkage (leaves.h says why).
#include <immintrin.h>

#include <math.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "base/macros.h"
#include "kernels/backend.h"
// GCC 12 reports a false -Wmaybe-uninitialized inside the AVX-512 shuffles (the _mm512_undefined_*
// placeholders of the intrinsics' masked forms).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include "kernels/cpu/isa/leaves.h"

namespace kiln::cpu::isa {
namespace {

struct F32 {
  using T = float;
  using V = __m512;
  using Mask = __mmask16;
  static constexpr int kW = 16, kNV = 4;
  static V zero() { return _mm512_setzero_ps(); }
  static V set1(float x) { return _mm512_set1_ps(x); }
  static V load(const float* p) { return _mm512_load_ps(p); }
  static V loadu(const float* p) { return _mm512_loadu_ps(p); }
  static V maskz_loadu(Mask m, const float* p) { return _mm512_maskz_loadu_ps(m, p); }
  static void store(float* p, V v) { _mm512_store_ps(p, v); }
  static void storeu(float* p, V v) { _mm512_storeu_ps(p, v); }
  static void mask_storeu(float* p, Mask m, V v) { _mm512_mask_storeu_ps(p, m, v); }
  static V fmadd(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static Mask tail(int64_t valid) {
    return valid >= kW ? Mask(0xFFFF) : valid <= 0 ? Mask(0) : Mask((1u << valid) - 1);
  }
  // r[i][j] -> r[j][i] for a 16 x 16 block: unpack pairs, 4x4 within 128-bit lanes, then two lane shuffles.
  static void transpose(V (&r)[kW]) {
    V b[16], c[16];
    for (int i = 0; i < 16; i += 2) {
      b[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
      b[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int g = 0; g < 16; g += 4) {  // c[g + j], lane L: column 4L + j, rows g..g+3
      c[g + 0] = _mm512_shuffle_ps(b[g + 0], b[g + 2], 0x44);
      c[g + 1] = _mm512_shuffle_ps(b[g + 0], b[g + 2], 0xEE);
      c[g + 2] = _mm512_shuffle_ps(b[g + 1], b[g + 3], 0x44);
      c[g + 3] = _mm512_shuffle_ps(b[g + 1], b[g + 3], 0xEE);
    }
    for (int j = 0; j < 4; ++j) {
      const V d0 = _mm512_shuffle_f32x4(c[j], c[4 + j], 0x88), d1 = _mm512_shuffle_f32x4(c[j], c[4 + j], 0xDD);
      const V d2 = _mm512_shuffle_f32x4(c[8 + j], c[12 + j], 0x88),
              d3 = _mm512_shuffle_f32x4(c[8 + j], c[12 + j], 0xDD);
      r[j] = _mm512_shuffle_f32x4(d0, d2, 0x88);
      r[8 + j] = _mm512_shuffle_f32x4(d0, d2, 0xDD);
      r[4 + j] = _mm512_shuffle_f32x4(d1, d3, 0x88);
      r[12 + j] = _mm512_shuffle_f32x4(d1, d3, 0xDD);
    }
  }
};

struct F64 {
  using T = double;
  using V = __m512d;
  using Mask = __mmask8;
  static constexpr int kW = 8, kNV = 4;
  static V zero() { return _mm512_setzero_pd(); }
  static V set1(double x) { return _mm512_set1_pd(x); }
  static V load(const double* p) { return _mm512_load_pd(p); }
  static V loadu(const double* p) { return _mm512_loadu_pd(p); }
  static V maskz_loadu(Mask m, const double* p) { return _mm512_maskz_loadu_pd(m, p); }
  static void store(double* p, V v) { _mm512_store_pd(p, v); }
  static void storeu(double* p, V v) { _mm512_storeu_pd(p, v); }
  static void mask_storeu(double* p, Mask m, V v) { _mm512_mask_storeu_pd(p, m, v); }
  static V fmadd(V a, V b, V c) { return _mm512_fmadd_pd(a, b, c); }
  static V mul(V a, V b) { return _mm512_mul_pd(a, b); }
  static Mask tail(int64_t valid) { return valid >= kW ? Mask(0xFF) : valid <= 0 ? Mask(0) : Mask((1u << valid) - 1); }
  // 8 x 8: unpack pairs, then two 128-bit lane shuffles.
  static void transpose(V (&r)[kW]) {
    V b[8];
    for (int i = 0; i < 8; i += 2) {  // b[i + j], lane L: column 2L + j, rows i, i+1
      b[i] = _mm512_unpacklo_pd(r[i], r[i + 1]);
      b[i + 1] = _mm512_unpackhi_pd(r[i], r[i + 1]);
    }
    for (int j = 0; j < 2; ++j) {
      const V d0 = _mm512_shuffle_f64x2(b[j], b[2 + j], 0x88), d1 = _mm512_shuffle_f64x2(b[j], b[2 + j], 0xDD);
      const V d2 = _mm512_shuffle_f64x2(b[4 + j], b[6 + j], 0x88), d3 = _mm512_shuffle_f64x2(b[4 + j], b[6 + j], 0xDD);
      r[j] = _mm512_shuffle_f64x2(d0, d2, 0x88);
      r[4 + j] = _mm512_shuffle_f64x2(d0, d2, 0xDD);
      r[2 + j] = _mm512_shuffle_f64x2(d1, d3, 0x88);
      r[6 + j] = _mm512_shuffle_f64x2(d1, d3, 0xDD);
    }
  }
};

#include "kernels/cpu/isa/gemm_leaves.inc"
#include "kernels/cpu/isa/rows.inc"
// clang-format off: convert.inc follows rows.inc
#include "kernels/cpu/isa/convert.inc"
// clang-format on

// Philox (loops.inc) in zmm registers: 16 blocks at once.
typedef uint32_t PhiloxV __attribute__((vector_size(64)));
constexpr int kPhiloxLanes = 16;
inline PhiloxV philox_mulhi(PhiloxV a, uint32_t m) {
  const __m512i x = __m512i(a), mv = _mm512_set1_epi32(int(m));
  const __m512i even = _mm512_mul_epu32(x, mv), odd = _mm512_mul_epu32(_mm512_srli_epi64(x, 32), mv);
  return PhiloxV(_mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(even, 32), odd));
}
// A 4 x 16 transpose: 32- and 64-bit unpacks put block 4 j + k in 128-bit lane j of u[k], then 128-bit
// shuffles gather blocks 4 q .. 4 q + 3 into output vector q.
inline void philox_store(const PhiloxV (&c)[4], uint32_t* out) {
  const __m512i t0 = _mm512_unpacklo_epi32(__m512i(c[0]), __m512i(c[1])),
                t1 = _mm512_unpackhi_epi32(__m512i(c[0]), __m512i(c[1])),
                t2 = _mm512_unpacklo_epi32(__m512i(c[2]), __m512i(c[3])),
                t3 = _mm512_unpackhi_epi32(__m512i(c[2]), __m512i(c[3]));
  const __m512i u0 = _mm512_unpacklo_epi64(t0, t2), u1 = _mm512_unpackhi_epi64(t0, t2),
                u2 = _mm512_unpacklo_epi64(t1, t3), u3 = _mm512_unpackhi_epi64(t1, t3);
  const __m512i v0 = _mm512_shuffle_i32x4(u0, u1, 0x44), v1 = _mm512_shuffle_i32x4(u2, u3, 0x44),
                w0 = _mm512_shuffle_i32x4(u0, u1, 0xEE), w1 = _mm512_shuffle_i32x4(u2, u3, 0xEE);
  _mm512_storeu_si512(out, _mm512_shuffle_i32x4(v0, v1, 0x88));
  _mm512_storeu_si512(out + 16, _mm512_shuffle_i32x4(v0, v1, 0xDD));
  _mm512_storeu_si512(out + 32, _mm512_shuffle_i32x4(w0, w1, 0x88));
  _mm512_storeu_si512(out + 48, _mm512_shuffle_i32x4(w0, w1, 0xDD));
}
#include "kernels/cpu/isa/loops.inc"

// ---- convolution (conv.cpp describes the schemes) ----------------------------------------------------

#include "kernels/cpu/isa/im2col_pack.inc"

// Lanes [lo, hi) of each 16-wide step are inside the row; the masked load touches only those.
void copy_row_stride1(const float* src, int64_t iw0, int64_t w, int64_t len, float* o) {
  for (int64_t e = 0; e < len; e += 16) {
    const int64_t n = len - e < 16 ? len - e : 16, base = iw0 + e;
    const int64_t lo = clamp64(-base, 0, n), hi = clamp64(w - base, lo, n);
    const __mmask16 in = __mmask16(((1u << hi) - 1) & ~((1u << lo) - 1));
    _mm512_mask_storeu_ps(o + e, __mmask16((1u << n) - 1), _mm512_maskz_loadu_ps(in, src + base));
  }
}

template <int kRows> void direct_block(const float* x, int64_t plane, int64_t cg, const float* w, int64_t wstride,
                                       int64_t taps, const int64_t* shift, const Mask16 (*masks)[4], float* y,
                                       int64_t ldy, const Mask16* store,
                                       bool /*inside: masked loads cost nothing extra*/) {
  // Every loop over the tile fully unrolled, or GCC keeps acc in memory (a store per FMA).
  __m512 acc[kRows][4];
#pragma GCC unroll 6
  for (int r = 0; r < kRows; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int64_t c = 0; c < cg; ++c, x += plane, w += taps) {
    for (int64_t t = 0; t < taps; ++t) {
      const float* xs = x + shift[t];
      const __m512 b0 = _mm512_maskz_loadu_ps(masks[t][0], xs), b1 = _mm512_maskz_loadu_ps(masks[t][1], xs + 16);
      const __m512 b2 = _mm512_maskz_loadu_ps(masks[t][2], xs + 32), b3 = _mm512_maskz_loadu_ps(masks[t][3], xs + 48);
#pragma GCC unroll 6
      for (int r = 0; r < kRows; ++r) {
        const __m512 a = _mm512_set1_ps(w[r * wstride + t]);
        acc[r][0] = _mm512_fmadd_ps(a, b0, acc[r][0]);
        acc[r][1] = _mm512_fmadd_ps(a, b1, acc[r][1]);
        acc[r][2] = _mm512_fmadd_ps(a, b2, acc[r][2]);
        acc[r][3] = _mm512_fmadd_ps(a, b3, acc[r][3]);
      }
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < kRows; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) _mm512_mask_storeu_ps(y + r * ldy + 16 * v, store[v], acc[r][v]);
}

// kV vectors of 16 output channels x kP pixels: per (tap, channel) kV loads of w and kP broadcasts of x
// feed kV * kP FMAs. The tile goes out through a small buffer to y's rows (a scatter per vector was 10%
// slower on Zen 4).
template <int kV, int kP> void direct_oc_tile(int64_t cg, int64_t taps, int64_t plane, const float* const* px,
                                              const float* w, float* const* y, int64_t ldy, int pixels) {
  __m512 acc[kV][kP];
#pragma GCC unroll 4
  for (int v = 0; v < kV; ++v)
#pragma GCC unroll 8
    for (int i = 0; i < kP; ++i) acc[v][i] = _mm512_setzero_ps();
  for (int64_t t = 0; t < taps; ++t) {
    const float* b[kP];
#pragma GCC unroll 8
    for (int i = 0; i < kP; ++i) b[i] = px[t * kP + i];
    const float* wt = w + t * cg * (16 * kV);
    for (int64_t c = 0, off = 0; c < cg; ++c, off += plane, wt += 16 * kV) {
      __m512 wv[kV];
#pragma GCC unroll 4
      for (int v = 0; v < kV; ++v) wv[v] = _mm512_loadu_ps(wt + 16 * v);
#pragma GCC unroll 8
      for (int i = 0; i < kP; ++i) {
        const __m512 xb = _mm512_set1_ps(b[i][off]);
#pragma GCC unroll 4
        for (int v = 0; v < kV; ++v) acc[v][i] = _mm512_fmadd_ps(wv[v], xb, acc[v][i]);
      }
    }
  }
  alignas(64) float buf[kP][16 * kV];
#pragma GCC unroll 8
  for (int i = 0; i < kP; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < kV; ++v) _mm512_store_ps(buf[i] + 16 * v, acc[v][i]);
  for (int i = 0; i < pixels; ++i)
    for (int j = 0; j < 16 * kV; ++j) y[i][j * ldy] = buf[i][j];
}

// The sum of a vector's 16 lanes, folded in halves (a fixed order).
float lane_total(__m512 v) {
  // The mask forms with a full mask: the plain ones pass an undefined vector GCC 12 warns about.
  v = _mm512_add_ps(v, _mm512_mask_shuffle_f32x4(v, 0xFFFF, v, v, 0x4E));
  v = _mm512_add_ps(v, _mm512_mask_shuffle_f32x4(v, 0xFFFF, v, v, 0xB1));
  v = _mm512_add_ps(v, _mm512_mask_permute_ps(v, 0xFFFF, v, 0x4E));
  v = _mm512_add_ps(v, _mm512_mask_permute_ps(v, 0xFFFF, v, 0xB1));
  return _mm512_cvtss_f32(v);
}

// A tile of 8 rows x 3 pairs: per 16-pixel vector the 3 x vectors are loaded once and each of the 8 gy
// vectors feeds 3 FMAs as it is loaded, so 24 sums + 3 + 1 operands fit the 32 vector registers with 11
// loads per 24 FMAs. 3 x 3 filters give Cg * 9 pairs and ResNet widths are multiples of 8: no tile
// computes a row or pair it does not store.
__attribute__((noinline)) void wgrad_tile(const float* gy, int64_t gy_image, const float* x, int64_t x_image,
                                          int64_t images, int64_t vecs, int64_t ohw, const int64_t* orow,
                                          const int64_t* xoff, const void* const* xmasks, const void* plane_masks,
                                          float* sums, bool /*inside: masked loads cost nothing extra*/) {
  const Mask16* const* xmask = reinterpret_cast<const Mask16* const*>(xmasks);
  const Mask16* plane_mask = static_cast<const Mask16*>(plane_masks);
  __m512 acc[8][3];
#pragma GCC unroll 8
  for (int r = 0; r < 8; ++r)
#pragma GCC unroll 3
    for (int j = 0; j < 3; ++j) acc[r][j] = _mm512_setzero_ps();
  const Mask16* m0 = xmask[0];
  const Mask16* m1 = xmask[1];
  const Mask16* m2 = xmask[2];
  for (int64_t n = 0; n < images; ++n, gy += gy_image, x += x_image) {
    const float* g[8];
#pragma GCC unroll 8
    for (int r = 0; r < 8; ++r) g[r] = gy + orow[r] * ohw;
    const float* x0 = x + xoff[0];
    const float* x1 = x + xoff[1];
    const float* x2 = x + xoff[2];
    for (int64_t v = 0, o = 0; v < vecs; ++v, o += 16) {
      const __mmask16 in_plane = plane_mask[v];
      const __m512 a0 = _mm512_maskz_loadu_ps(m0[v], x0 + o), a1 = _mm512_maskz_loadu_ps(m1[v], x1 + o),
                   a2 = _mm512_maskz_loadu_ps(m2[v], x2 + o);
#pragma GCC unroll 8
      for (int r = 0; r < 8; ++r) {
        const __m512 gv = _mm512_maskz_loadu_ps(in_plane, g[r] + o);
        acc[r][0] = _mm512_fmadd_ps(gv, a0, acc[r][0]);
        acc[r][1] = _mm512_fmadd_ps(gv, a1, acc[r][1]);
        acc[r][2] = _mm512_fmadd_ps(gv, a2, acc[r][2]);
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < 8; ++r)
#pragma GCC unroll 3
    for (int j = 0; j < 3; ++j) sums[r * 3 + j] = lane_total(acc[r][j]);
}

// The weight gradient's masks are the 16-bit masks themselves.
void expand_masks(const Mask16* in, int64_t n, void* out) {
  Mask16* o = static_cast<Mask16*>(out);
  for (int64_t i = 0; i < n; ++i) o[i] = in[i];
}

Leaves make() {
  Leaves l{};
  l.name = "avx512";
  l.rows = row_leaves();
  add_conversions(l.rows);
  add_loops(l.rows);
  l.conv.mask_bytes = sizeof(Mask16);
  l.conv.expand_masks = expand_masks;
  l.f32 = gemm_leaves<F32>(384, 384);
  l.f64 = gemm_leaves<F64>(384, 384);
  l.conv.pack_im2col_panel = pack_im2col_panel;
  l.conv.direct[0] = direct_block<1>;
  l.conv.direct[1] = direct_block<2>;
  l.conv.direct[2] = direct_block<3>;
  l.conv.direct[3] = direct_block<4>;
  l.conv.direct[4] = direct_block<5>;
  l.conv.direct[5] = direct_block<6>;
  l.conv.direct_oc[0] = {64, 6, direct_oc_tile<4, 6>};
  l.conv.direct_oc[1] = {32, 8, direct_oc_tile<2, 8>};
  // 16 channels, for the strided input gradient only: ResNet-20's into 16 channels went through GEMM +
  // col2im (3.2 -> 1.6 ms at 28x28 on the Intel Xeon). In the forward the pixel tiles beat it on 16 filters
  // (a 14x14 plane: 0.51 against 0.67 ms), and 48 filters were level. 8 pixels, not 12: 12 pixel pointers
  // left GCC short of general registers, and it kept the sums in memory.
  l.conv.direct_oc[2] = {16, 8, direct_oc_tile<1, 8>, true};
  l.conv.wgrad_rows = 8;
  l.conv.wgrad_pairs = 3;
  l.conv.wgrad_tile = wgrad_tile;
  return l;
}

}  // namespace

const Leaves& avx512_leaves() {
  static const Leaves leaves = make();
  return leaves;
}

}  // namespace kiln::cpu::isa
