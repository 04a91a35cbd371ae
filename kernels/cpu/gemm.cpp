// CPU GEMM: packed, cache-blocked micro-kernels of the kernel set in use (base/cpu_isa.h: AVX-512 or AVX2, f32 and
// f64), and Eigen for the generic set and for matrix-vector shapes; both spread output blocks over the
// engine's pool.
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
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <Eigen/Core>
#pragma GCC diagnostic pop

#include "base/error.h"
#include "base/thread_pool.h"

#include "base/cpu_isa.h"
#include "kernels/cpu/kernel_sets.h"

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

// ---- packed kernels (the instruction-set leaves of kernels/cpu/isa) ---------------------------------
//
// Goto/BLIS-style blocking, run independently by each thread on its block of C:
//   for jc in N step NC:          pack B[pc:pc+KC, jc:jc+NC] as NC/NR panels of KC x NR    (L2)
//     for pc in K step KC:
//       for ir in M step MR:      A rows ir:ir+MR over pc:pc+KC, read in place when A is not transposed
//                                 (MR row streams), else packed into a KC x MR panel  (L1)
//         for jr in NC step NR:   micro-kernel: C[ir:ir+MR, jc+jr:+NR] = alpha * A'B' + beta' * C
// MR = 6 rows; NR = 4 vectors (AVX-512: 64 f32, 32 f64) or 2 (AVX2: 16 f32, 8 f64); the leaves
// (kernels/cpu/isa/gemm_leaves.inc) describe the register tiles. KC and NC blocks are balanced from k and
// n alone, so an element's sum runs over p in the same order, in the same KC blocks, whatever the thread
// split: results are independent of the thread count (not of the kernel set).
constexpr int kMR = isa::kGemmMR;

// The leaves of the kernel set in use, or null for Eigen (the generic set).
const isa::Leaves* packed_leaves() {
  const isa::Leaves& l = kernel_set();
  return l.f32.w ? &l : nullptr;
}
template <typename T> const isa::GemmLeaves<T>& leaves_of(const isa::Leaves& l) {
  if constexpr (std::is_same_v<T, float>)
    return l.f32;
  else
    return l.f64;
}

// Pack buffers per thread, grown on demand and kept: pool threads live as long as the program.
thread_local ScratchBuffer t_pack_a, t_pack_b;

// Splits [0, total) into equal blocks of at most `max_block`, rounded up to `align`: few ragged blocks.
int64_t balanced_block(int64_t total, int64_t max_block, int64_t align) {
  const int64_t blocks = (total + max_block - 1) / max_block;
  const int64_t size = (total + blocks - 1) / blocks;
  return (size + align - 1) / align * align;
}

// One thread's block of C, start to finish.
template <typename T> void packed_block(const Problem<T>& p, const isa::GemmLeaves<T>& L) {
  const int64_t kNR = int64_t(L.w) * L.nv;
  // Both block sizes follow from k and n alone (n of this block: only where columns go, not how sums run).
  const int64_t kc_block = balanced_block(p.k, L.kc, 8);
  const int64_t nc_block = balanced_block(p.n, L.nc, kNR);
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
        else
          L.pack_b(p.trans_b, p.b, p.ldb, pc, kc, jc, nc, pack_b_buf);
      } else {
        L.pack_b(p.trans_b, p.b, p.ldb, pc, kc, jc, nc, pack_b_buf);
      }
      for (int64_t ir = 0; ir < p.m; ir += kMR) {
        const int64_t rows = std::min<int64_t>(kMR, p.m - ir);
        const T* a_row[kMR];
        if (p.trans_a) {
          L.pack_a_trans(p.a, p.lda, ir, rows, pc, kc, pack_a_buf);
          for (int r = 0; r < kMR; ++r) a_row[r] = pack_a_buf + r;
        } else {
          // Rows past the edge re-read row 0: their sums are computed but never stored.
          for (int r = 0; r < kMR; ++r) a_row[r] = p.a + (ir + (r < rows ? r : 0)) * p.lda + pc;
        }
        T* c_tile = p.c + ir * p.ldc + jc;
        for (int64_t jr = 0; jr < nc; jr += kNR) {
          const T* pb = pack_b_buf + (jr / kNR) * kc * kNR;
          const int64_t cols = std::min<int64_t>(kNR, nc - jr);
          const int nv = int((cols + L.w - 1) / L.w);  // vectors in this panel: fewer for a narrow last one
          L.micro[p.trans_a ? 1 : 0][nv - 1](kc, a_row, pb, c_tile + jr, p.ldc, rows, cols, p.alpha, beta);
        }
      }
    }
  }
}

template <typename T> void packed_gemm(const Problem<T>& p, const isa::GemmLeaves<T>& L) {
  const int64_t kNR = int64_t(L.w) * L.nv;
  // Any split gives the same bits here, so one block per thread, cut at register-tile multiples: along the
  // longer side unless only the other has a unit of work for every thread.
  const int64_t threads = macs(p) >= kParallelMinMacs ? num_threads() : 1;
  const int64_t units_n = p.n / kNR, units_m = p.m / (4 * kMR);
  const bool split_n = p.n >= p.m ? units_n >= std::min(threads, units_m) : units_m < std::min(threads, units_n);
  const int64_t tiles = std::min(threads, split_n ? units_n : units_m);
  for_each_block(p, split_n, tiles, split_n ? kNR : 4 * kMR, [&L](const Problem<T>& blk) { packed_block(blk, L); });
}

// Where the micro-kernels beat Eigen; a function of the shape alone, so the choice never depends on threads.
// A few rows or columns are (nearly) matrix-vector products: a 6-row tile would mostly compute padding,
// and Eigen's GEMV / small kernels measured as fast or faster there.
template <typename T> bool use_packed(const Problem<T>& p) { return p.m >= 4 && p.n >= 5; }

template <typename T>
void gemm_impl(const Problem<T>& p) {
  if (p.m == 0 || p.n == 0) return;
  if (p.k == 0 || p.alpha == T(0)) {
    scale_c(p.m, p.n, p.beta, p.c, p.ldc);
    return;
  }
  if (const isa::Leaves* l = packed_leaves(); l && (p.packed_b || use_packed(p)))
    return packed_gemm(p, leaves_of<T>(*l));
  eigen_gemm(p);
}

}  // namespace

void gemm_f32(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
              const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  check_args("gemm_f32", trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc);
  gemm_impl(Problem<float>{trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc});
}

GemmPanels gemm_panels() {
  const isa::Leaves* l = packed_leaves();
  return l ? GemmPanels{int64_t(l->f32.w) * l->f32.nv, l->f32.w} : GemmPanels{};
}

bool gemm_has_packed_b() { return packed_leaves() != nullptr; }

void gemm_f32_packed_b(bool trans_a, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                       const PackedB& b, float beta, float* c, int64_t ldc) {
  KILN_CHECK(gemm_has_packed_b(), "gemm_f32_packed_b: the CPU kernel set in use (", cpu_isa_name(cpu_isa()),
             ") has no packed kernels (check gemm_has_packed_b)");
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
