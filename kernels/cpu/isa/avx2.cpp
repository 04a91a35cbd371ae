// The AVX2 + FMA leaf kernels (compiled with -mavx2 -mfma -mf16c and without AVX-512, whatever the
// rest of the build targets; run only where base/cpu_isa.h's cpu_isa() says avx2 or better). Everything but
// avx2_leaves() has internal linkage (leaves.h says why). The convolution has no AVX2 leaves yet:
// it runs as im2col + this GEMM.
#include <immintrin.h>

#include <cstdint>

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

Leaves make() {
  Leaves l{};
  l.name = "avx2";
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
