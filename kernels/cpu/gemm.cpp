// CPU GEMM: an AVX-512 packed, cache-blocked micro-kernel for f32 (when the build targets AVX-512), and Eigen
// for f64 and as the portable f32 fallback; both spread output blocks over the engine's pool.
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/scratch.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <type_traits>

// Eigen must never start its own threads: the engine's pool owns the cores.
#define EIGEN_DONT_PARALLELIZE
// GCC 12 reports a false -Wmaybe-uninitialized inside Eigen's AVX-512 transposes (the _mm512_undefined_*
// placeholders of the intrinsics it inlines); nothing in this file is affected.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <Eigen/Core>
#pragma GCC diagnostic pop

#include "base/error.h"
#include "base/thread_pool.h"

#if defined(__AVX512F__) && !defined(KILN_GEMM_EIGEN_ONLY)
#define KILN_GEMM_AVX512 1
#include <immintrin.h>
#endif

namespace kiln::cpu {
namespace {

// Below this many multiply-adds a problem runs on the calling thread: waking the pool costs more.
constexpr double kParallelMinMacs = double(1 << 23);

template <typename T>
void check_args(const char* name, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const T* a,
                int64_t lda, const T* b, int64_t ldb, const T* c, int64_t ldc) {
  KILN_CHECK(m >= 0 && n >= 0 && k >= 0, name, ": sizes must be non-negative, got m=", m, " n=", n, " k=", k);
  // The stored (not op'd) shapes, so the message names what the caller actually passed.
  const int64_t a_rows = trans_a ? k : m, a_cols = trans_a ? m : k;
  const int64_t b_rows = trans_b ? n : k, b_cols = trans_b ? k : n;
  KILN_CHECK(lda >= a_cols, name, ": lda=", lda, " is below the row width of A, stored ", a_rows, "x", a_cols,
             trans_a ? " (trans_a)" : "", " for m=", m, " k=", k);
  KILN_CHECK(ldb >= b_cols, name, ": ldb=", ldb, " is below the row width of B, stored ", b_rows, "x", b_cols,
             trans_b ? " (trans_b)" : "", " for k=", k, " n=", n);
  KILN_CHECK(ldc >= n, name, ": ldc=", ldc, " is below the row width of C, ", m, "x", n);
  KILN_CHECK(m == 0 || n == 0 || c != nullptr, name, ": C is null for a ", m, "x", n, " result");
  KILN_CHECK(m == 0 || n == 0 || k == 0 || (a != nullptr && b != nullptr), name, ": A or B is null for m=", m,
             " n=", n, " k=", k);
}

// C = beta * C, where beta == 0 writes zeros without reading C.
template <typename T>
void scale_c(int64_t m, int64_t n, T beta, T* c, int64_t ldc) {
  if (beta == T(1)) return;
  for (int64_t i = 0; i < m; ++i) {
    T* row = c + i * ldc;
    if (beta == T(0))
      std::fill(row, row + n, T(0));
    else
      for (int64_t j = 0; j < n; ++j) row[j] *= beta;
  }
}

// One problem, or a block of rows / columns of one. Splitting only ever cuts M or N, never K.
template <typename T>
struct Problem {
  bool trans_a, trans_b;
  int64_t m, n, k;
  T alpha;
  const T* a;
  int64_t lda;
  const T* b;
  int64_t ldb;
  T beta;
  T* c;
  int64_t ldc;
  const PackedB* packed_b = nullptr;  // f32 only: B comes from packed_b->pack, and b is unused
  int64_t b_col0 = 0;                 // with packed_b: B's column of this (sub-)problem's column 0

  // The sub-problem writing rows [i0, i1) and columns [j0, j1) of C.
  Problem block(int64_t i0, int64_t i1, int64_t j0, int64_t j1) const {
    Problem p = *this;
    p.m = i1 - i0;
    p.n = j1 - j0;
    p.a = trans_a ? a + i0 : a + i0 * lda;
    if (!packed_b) p.b = trans_b ? b + j0 * ldb : b + j0;
    p.b_col0 = b_col0 + j0;
    p.c = c + i0 * ldc + j0;
    return p;
  }
};

// In double: m*n*k of valid sizes can exceed int64.
template <typename T>
double macs(const Problem<T>& p) {
  return double(p.m) * double(p.n) * double(p.k);
}

// Runs `fn` on `tiles` blocks of C cut along N (split_n) or M at multiples of `align`.
// Boundaries are a function of the arguments only; `fn(block)` may run on any thread.
template <typename T, typename Fn>
void for_each_block(const Problem<T>& p, bool split_n, int64_t tiles, int64_t align, const Fn& fn) {
  if (tiles <= 1) {
    fn(p);
    return;
  }
  const int64_t dim = split_n ? p.n : p.m;
  auto edge = [&](int64_t t) {
    // Round each boundary to `align` so no block but the last has a ragged register tile.
    const int64_t x = (dim * t / tiles + align / 2) / align * align;
    return t == tiles ? dim : std::min(x, dim);
  };
  parallel_for(0, tiles, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t lo = edge(t), hi = edge(t + 1);
      if (hi <= lo) continue;
      fn(split_n ? p.block(0, p.m, lo, hi) : p.block(lo, hi, 0, p.n));
    }
  });
}

// ---- Eigen path ------------------------------------------------------------------------------------

// C += alpha * op(A) * op(B) for one block (beta already applied), through Maps: no copies, even transposed.
template <typename T>
void eigen_block(const Problem<T>& p) {
  using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using ConstMap = Eigen::Map<const Mat, Eigen::Unaligned, Eigen::OuterStride<>>;
  using MutMap = Eigen::Map<Mat, Eigen::Unaligned, Eigen::OuterStride<>>;
  MutMap c(p.c, p.m, p.n, Eigen::OuterStride<>(p.ldc));
  ConstMap a(p.a, p.trans_a ? p.k : p.m, p.trans_a ? p.m : p.k, Eigen::OuterStride<>(p.lda));
  ConstMap b(p.b, p.trans_b ? p.n : p.k, p.trans_b ? p.k : p.n, Eigen::OuterStride<>(p.ldb));
  if (!p.trans_a && !p.trans_b)
    c.noalias() += p.alpha * a * b;
  else if (!p.trans_a)
    c.noalias() += p.alpha * a * b.transpose();
  else if (!p.trans_b)
    c.noalias() += p.alpha * a.transpose() * b;
  else
    c.noalias() += p.alpha * a.transpose() * b.transpose();
}

// Eigen's result for an element depends on where it falls in Eigen's own blocking (its edge kernels
// accumulate in a different order), so the tiles here are fixed by the shape alone, never by the thread
// count: one thread computes exactly the same Eigen calls as many.
template <typename T>
void eigen_gemm(const Problem<T>& p) {
  constexpr int64_t kTile = 256;
  const int64_t dim = std::max(p.m, p.n);
  const int64_t tiles = macs(p) >= kParallelMinMacs ? std::max<int64_t>(1, dim / kTile) : 1;
  scale_c(p.m, p.n, p.beta, p.c, p.ldc);
  for_each_block(p, p.n >= p.m, tiles, 16, [](const Problem<T>& blk) { eigen_block(blk); });
}

#if KILN_GEMM_AVX512
// ---- AVX-512 micro-kernel (f32 and f64) -------------------------------------------------------------
//
// Goto/BLIS-style blocking, run independently by each thread on its block of C:
//   for jc in N step NC:          pack B[pc:pc+KC, jc:jc+NC] as NC/NR panels of KC x NR    (~0.4 MiB f32: L2)
//     for pc in K step KC:
//       for ir in M step MR:      A rows ir:ir+MR over pc:pc+KC, read in place when A is not transposed
//                                 (MR row streams), else packed into a KC x MR panel  (9 KiB f32: L1)
//         for jr in NC step NR:   micro-kernel: C[ir:ir+MR, jc+jr:+NR] = alpha * A'B' + beta' * C
// Register tile MR x NR = 6 x 4 vectors (6 x 64 f32, 6 x 32 f64): 24 zmm accumulators acc[r][v] (row r,
// vector v), 4 zmm holding the current row of the B panel; each A value is broadcast straight from memory
// into its 4 FMAs. Per k step: 4 vector loads, 6 broadcasts, 24 FMAs (Zen4 issues one 512-bit FMA a cycle).
// KC and NC blocks are balanced from k and n alone, so an element's sum runs over p in the same order,
// in the same KC blocks, whatever the thread split: results are independent of the thread count.
constexpr int kMR = 6;
constexpr int kNV = 4;
static_assert(kNV * 16 == kGemmPanelCols, "gemm.h documents the f32 panel layout");
#ifndef KILN_GEMM_KC
#define KILN_GEMM_KC 384
#endif
#ifndef KILN_GEMM_NC
#define KILN_GEMM_NC 384
#endif
constexpr int64_t kKC = KILN_GEMM_KC;
constexpr int64_t kNC = KILN_GEMM_NC;

template <typename T>
struct Simd;

template <>
struct Simd<float> {
  using V = __m512;
  using Mask = __mmask16;
  static constexpr int kW = 16;
  static V zero() { return _mm512_setzero_ps(); }
  static V set1(float x) { return _mm512_set1_ps(x); }
  static V load(const float* p) { return _mm512_load_ps(p); }
  static V loadu(const float* p) { return _mm512_loadu_ps(p); }
  static V maskz_loadu(Mask m, const float* p) { return _mm512_maskz_loadu_ps(m, p); }
  static void store(float* p, V v) { _mm512_store_ps(p, v); }
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
      const V d2 = _mm512_shuffle_f32x4(c[8 + j], c[12 + j], 0x88), d3 = _mm512_shuffle_f32x4(c[8 + j], c[12 + j], 0xDD);
      r[j] = _mm512_shuffle_f32x4(d0, d2, 0x88);
      r[8 + j] = _mm512_shuffle_f32x4(d0, d2, 0xDD);
      r[4 + j] = _mm512_shuffle_f32x4(d1, d3, 0x88);
      r[12 + j] = _mm512_shuffle_f32x4(d1, d3, 0xDD);
    }
  }
};

template <>
struct Simd<double> {
  using V = __m512d;
  using Mask = __mmask8;
  static constexpr int kW = 8;
  static V zero() { return _mm512_setzero_pd(); }
  static V set1(double x) { return _mm512_set1_pd(x); }
  static V load(const double* p) { return _mm512_load_pd(p); }
  static V loadu(const double* p) { return _mm512_loadu_pd(p); }
  static V maskz_loadu(Mask m, const double* p) { return _mm512_maskz_loadu_pd(m, p); }
  static void store(double* p, V v) { _mm512_store_pd(p, v); }
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

// Pack buffers per thread, grown on demand and kept: pool threads live as long as the program.
thread_local ScratchBuffer t_pack_a, t_pack_b;

// Splits [0, total) into equal blocks of at most `max_block`, rounded up to `align`: few ragged blocks.
int64_t balanced_block(int64_t total, int64_t max_block, int64_t align) {
  const int64_t blocks = (total + max_block - 1) / max_block;
  const int64_t size = (total + blocks - 1) / blocks;
  return (size + align - 1) / align * align;
}

// Vectors in the panel of B starting at column jr: NV, or fewer for a narrow last panel.
template <typename T>
int panel_vectors(int64_t cols) {
  return int(std::min<int64_t>(kNV, (cols + Simd<T>::kW - 1) / Simd<T>::kW));
}

// B[pc:pc+kc, j0:j0+nc] -> panels of kc x NR (row q of a panel: its NR consecutive values), a narrow last
// panel only as many vectors wide as it needs, zero past nc.
template <typename T>
void pack_b(const Problem<T>& p, int64_t pc, int64_t kc, int64_t j0, int64_t nc, T* dst) {
  using S = Simd<T>;
  constexpr int kW = S::kW, kNR = kW * kNV;
  for (int64_t jr = 0; jr < nc; jr += kNR, dst += kc * kNR) {
    const int64_t cols = std::min<int64_t>(kNR, nc - jr);
    const int nv = panel_vectors<T>(cols);
    const int64_t stride = int64_t(nv) * kW;
    if (!p.trans_b) {
      const T* src = p.b + pc * p.ldb + j0 + jr;
      for (int64_t q = 0; q < kc; ++q, src += p.ldb)
        for (int v = 0; v < nv; ++v) S::store(dst + q * stride + kW * v, S::maskz_loadu(S::tail(cols - kW * v), src + kW * v));
      continue;
    }
    // B stored n x k: a panel column is a contiguous run along k. Transpose kW x kW blocks in registers;
    // ragged edges (and columns past nc, as zeros) go one element at a time.
    for (int v = 0; v < nv; ++v) {
      const int64_t vcols = std::min<int64_t>(cols - kW * v, kW);
      const T* src = p.b + (j0 + jr + kW * v) * p.ldb + pc;
      int64_t q = 0;
      if (vcols == kW) {
        for (; q + kW <= kc; q += kW) {
          typename S::V r[kW];
          for (int i = 0; i < kW; ++i) r[i] = S::loadu(src + i * p.ldb + q);
          S::transpose(r);
          for (int i = 0; i < kW; ++i) S::store(dst + (q + i) * stride + kW * v, r[i]);
        }
      }
      for (; q < kc; ++q)
        for (int i = 0; i < kW; ++i) dst[q * stride + kW * v + i] = i < vcols ? src[i * p.ldb + q] : T(0);
    }
  }
}

// A[i0:i0+rows, pc:pc+kc] from a transposed A (stored k x m) -> one kc x MR panel, zero past rows.
template <typename T>
void pack_a_trans(const Problem<T>& p, int64_t i0, int64_t rows, int64_t pc, int64_t kc, T* dst) {
  using S = Simd<T>;
  static_assert(kMR <= S::kW, "a panel row must fit one vector");
  const auto load_mask = S::tail(rows), store_mask = S::tail(kMR);
  const T* src = p.a + pc * p.lda + i0;
  for (int64_t q = 0; q < kc; ++q, src += p.lda, dst += kMR) S::mask_storeu(dst, store_mask, S::maskz_loadu(load_mask, src));
}

// C[0:rows, 0:cols] = alpha * A'B' + beta * C over one MR x (kNVv vectors) tile (beta == 0: C is not read).
// A' element (r, q) is a_row[r][q * kAStep]: kAStep = 1 reads rows of A in place, kAStep = MR a packed panel.
// The B panel's rows are kNVv vectors apart; kNVv < NV only for a narrow last panel.
template <typename T, int kAStep, int kNVv>
__attribute__((noinline)) void micro_kernel(int64_t kc, const T* const* a_row, const T* __restrict pb, T* c, int64_t ldc, int64_t rows,
                  int64_t cols, T alpha, T beta) {
  using S = Simd<T>;
  using V = typename S::V;
  constexpr int kW = S::kW, kStride = kW * kNVv;
  const T* a0 = a_row[0];
  const T* a1 = a_row[1];
  const T* a2 = a_row[2];
  const T* a3 = a_row[3];
  const T* a4 = a_row[4];
  const T* a5 = a_row[5];
  static_assert(kMR == 6, "the row pointers above assume MR = 6");

  V acc[kMR][kNVv];
#pragma GCC unroll 6
  for (int r = 0; r < kMR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < kNVv; ++v) acc[r][v] = S::zero();

  // C is touched once per K block; start its lines on their way so the final loads don't stall.
  for (int64_t r = 0; r < rows; ++r)
    for (int v = 0; v < kNVv; ++v) _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc + kW * v), _MM_HINT_T0);

#pragma GCC unroll 2
  for (int64_t q = 0; q < kc; ++q) {
    V bv[kNVv];
#pragma GCC unroll 4
    for (int v = 0; v < kNVv; ++v) bv[v] = S::load(pb + q * kStride + kW * v);
    const T av[kMR] = {a0[q * kAStep], a1[q * kAStep], a2[q * kAStep], a3[q * kAStep], a4[q * kAStep], a5[q * kAStep]};
#pragma GCC unroll 6
    for (int r = 0; r < kMR; ++r) {
      const V a = S::set1(av[r]);
#pragma GCC unroll 4
      for (int v = 0; v < kNVv; ++v) acc[r][v] = S::fmadd(a, bv[v], acc[r][v]);
    }
  }

  const V valpha = S::set1(alpha), vbeta = S::set1(beta);
  typename S::Mask mask[kNVv];
  for (int v = 0; v < kNVv; ++v) mask[v] = S::tail(cols - kW * v);
#pragma GCC unroll 6
  for (int r = 0; r < kMR; ++r) {
    if (r >= rows) break;
    T* crow = c + r * ldc;
#pragma GCC unroll 4
    for (int v = 0; v < kNVv; ++v) {
      V out = S::mul(acc[r][v], valpha);
      if (beta != T(0)) out = S::fmadd(S::maskz_loadu(mask[v], crow + kW * v), vbeta, out);
      S::mask_storeu(crow + kW * v, mask[v], out);
    }
  }
}

template <typename T, int kAStep>
void dispatch_kernel(int nv, int64_t kc, const T* const* a_row, const T* pb, T* c, int64_t ldc, int64_t rows,
                     int64_t cols, T alpha, T beta) {
  static_assert(kNV == 4, "one case per panel width below");
  switch (nv) {
    case 4: return micro_kernel<T, kAStep, 4>(kc, a_row, pb, c, ldc, rows, cols, alpha, beta);
    case 3: return micro_kernel<T, kAStep, 3>(kc, a_row, pb, c, ldc, rows, cols, alpha, beta);
    case 2: return micro_kernel<T, kAStep, 2>(kc, a_row, pb, c, ldc, rows, cols, alpha, beta);
    default: return micro_kernel<T, kAStep, 1>(kc, a_row, pb, c, ldc, rows, cols, alpha, beta);
  }
}

// One thread's block of C, start to finish.
template <typename T>
void avx512_block(const Problem<T>& p) {
  constexpr int kNR = Simd<T>::kW * kNV;
  // Both block sizes follow from k and n alone (n of this block: only where columns go, not how sums run).
  const int64_t kc_block = balanced_block(p.k, kKC, 8);
  const int64_t nc_block = balanced_block(p.n, kNC, kNR);
  T* pack_b_buf = t_pack_b.get<T>(size_t(std::min(nc_block, (p.n + kNR - 1) / kNR * kNR) * std::min(kc_block, p.k)));
  T* pack_a_buf = p.trans_a ? t_pack_a.get<T>(size_t(kMR * std::min(kc_block, p.k))) : nullptr;
  for (int64_t jc = 0; jc < p.n; jc += nc_block) {
    const int64_t nc = std::min(nc_block, p.n - jc);
    for (int64_t pc = 0; pc < p.k; pc += kc_block) {
      const int64_t kc = std::min(kc_block, p.k - pc);
      // The first K block applies beta; later ones accumulate onto what it wrote.
      const T beta = pc == 0 ? p.beta : T(1);
      if constexpr (std::is_same_v<T, float>) {
        if (p.packed_b) p.packed_b->pack(p.packed_b->ctx, pc, kc, p.b_col0 + jc, nc, pack_b_buf);
        else pack_b(p, pc, kc, jc, nc, pack_b_buf);
      } else {
        pack_b(p, pc, kc, jc, nc, pack_b_buf);
      }
      for (int64_t ir = 0; ir < p.m; ir += kMR) {
        const int64_t rows = std::min<int64_t>(kMR, p.m - ir);
        const T* a_row[kMR];
        if (p.trans_a) {
          pack_a_trans(p, ir, rows, pc, kc, pack_a_buf);
          for (int r = 0; r < kMR; ++r) a_row[r] = pack_a_buf + r;
        } else {
          // Rows past the edge re-read row 0: their sums are computed but never stored.
          for (int r = 0; r < kMR; ++r) a_row[r] = p.a + (ir + (r < rows ? r : 0)) * p.lda + pc;
        }
        T* c_tile = p.c + ir * p.ldc + jc;
        for (int64_t jr = 0; jr < nc; jr += kNR) {
          const T* pb = pack_b_buf + (jr / kNR) * kc * kNR;
          const int64_t cols = std::min<int64_t>(kNR, nc - jr);
          if (p.trans_a)
            dispatch_kernel<T, kMR>(panel_vectors<T>(cols), kc, a_row, pb, c_tile + jr, p.ldc, rows, cols, p.alpha, beta);
          else
            dispatch_kernel<T, 1>(panel_vectors<T>(cols), kc, a_row, pb, c_tile + jr, p.ldc, rows, cols, p.alpha, beta);
        }
      }
    }
  }
}

template <typename T>
void avx512_gemm(const Problem<T>& p) {
  constexpr int kNR = Simd<T>::kW * kNV;
  // Any split gives the same bits here, so one block per thread, cut at register-tile multiples: along the
  // longer side unless only the other has a unit of work for every thread.
  const int64_t threads = macs(p) >= kParallelMinMacs ? num_threads() : 1;
  const int64_t units_n = p.n / kNR, units_m = p.m / (4 * kMR);
  const bool split_n = p.n >= p.m ? units_n >= std::min(threads, units_m) : units_m < std::min(threads, units_n);
  const int64_t tiles = std::min(threads, split_n ? units_n : units_m);
  for_each_block(p, split_n, tiles, split_n ? kNR : 4 * kMR, [](const Problem<T>& blk) { avx512_block(blk); });
}

// Where the micro-kernel beats Eigen; a function of the shape alone, so the choice never depends on threads.
// A few rows or columns are (nearly) matrix-vector products: a 6 x 64 tile would mostly compute padding,
// and Eigen's GEMV / small kernels measured as fast or faster there.
template <typename T>
bool use_avx512(const Problem<T>& p) {
  return p.m >= 4 && p.n >= 5;
}
#endif

template <typename T>
void gemm_impl(const Problem<T>& p) {
  if (p.m == 0 || p.n == 0) return;
  if (p.k == 0 || p.alpha == T(0)) {
    scale_c(p.m, p.n, p.beta, p.c, p.ldc);
    return;
  }
#if KILN_GEMM_AVX512
  if (p.packed_b || use_avx512(p)) return avx512_gemm(p);
#endif
  eigen_gemm(p);
}

}  // namespace

void gemm_f32(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
              const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  check_args("gemm_f32", trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc);
  gemm_impl(Problem<float>{trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc});
}

bool gemm_has_packed_b() {
#if KILN_GEMM_AVX512
  return true;
#else
  return false;
#endif
}

void gemm_f32_packed_b(bool trans_a, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                       const PackedB& b, float beta, float* c, int64_t ldc) {
  KILN_CHECK(gemm_has_packed_b(), "gemm_f32_packed_b: this build has no AVX-512 micro-kernel (check gemm_has_packed_b)");
  KILN_CHECK(b.pack != nullptr, "gemm_f32_packed_b: no pack function");
  // check_args on a stand-in B: only A's and C's arguments are real.
  check_args("gemm_f32_packed_b", trans_a, false, m, n, k, a, lda, a, n, c, ldc);
  Problem<float> p{trans_a, false, m, n, k, alpha, a, lda, nullptr, n, beta, c, ldc};
  p.packed_b = &b;
  gemm_impl(p);
}

void gemm_f64(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha, const double* a,
              int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  check_args("gemm_f64", trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc);
  gemm_impl(Problem<double>{trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc});
}

}  // namespace kiln::cpu
