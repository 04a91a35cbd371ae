// The decomposition kernels of kernels/linalg_lu.h over Eigen: PartialPivLU (its row permutation turned
// into LAPACK's sequence of swaps), triangular views' solveInPlace, LLT (with an unblocked
// loop that finds a failing minor). Small matrices share a pool task (grain).
#include "kernels/linalg_lu.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

// Eigen must never start its own threads: the engine's pool owns the cores.
#define EIGEN_DONT_PARALLELIZE
#pragma GCC diagnostic push
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <Eigen/Cholesky>
#include <Eigen/Core>
#include <Eigen/LU>
#pragma GCC diagnostic pop

#include "base/error.h"
#include "base/thread_pool.h"

namespace kiln::cpu {
namespace {

template <typename T> using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <typename T> using MapMat = Eigen::Map<Mat<T>>;
template <typename T> using ConstMapMat = Eigen::Map<const Mat<T>>;

// Matrices of n x n per task: small ones share a task.
int64_t grain(int64_t n) { return std::max<int64_t>(1, (int64_t(1) << 15) / std::max<int64_t>(1, n * n * n)); }

template <typename T> void lu_one(int64_t n, T* a, int32_t* piv, int32_t* info) {
  MapMat<T> m(a, n, n);
  *info = 0;
  if (n == 0) return;
  const Eigen::PartialPivLU<Mat<T>> lu(m);
  m = lu.matrixLU();
  // P A = L U with (P A) row indices[i] = A row i: the LU's row r holds A's row orig[r]. LAPACK's swaps
  // bring orig[0], orig[1], ... to the top in turn.
  const auto& idx = lu.permutationP().indices();
  std::vector<int64_t> orig(static_cast<size_t>(n)), cur(static_cast<size_t>(n)), where(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) orig[size_t(idx[i])] = i;
  std::iota(cur.begin(), cur.end(), 0);
  std::iota(where.begin(), where.end(), 0);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t p = where[size_t(orig[size_t(i)])];
    piv[i] = int32_t(p + 1);
    std::swap(cur[size_t(i)], cur[size_t(p)]);
    where[size_t(cur[size_t(i)])] = i;
    where[size_t(cur[size_t(p)])] = p;
  }
  for (int64_t i = 0; i < n; ++i)
    if (m(i, i) == T(0)) {
      *info = int32_t(i + 1);
      break;
    }
}

template <typename T> void tri_one(int64_t n, int64_t k, const T* a, T* b, bool upper, bool unit) {
  const ConstMapMat<T> m(a, n, n);
  MapMat<T> x(b, n, k);
  if (upper && unit) m.template triangularView<Eigen::UnitUpper>().solveInPlace(x);
  if (upper && !unit) m.template triangularView<Eigen::Upper>().solveInPlace(x);
  if (!upper && unit) m.template triangularView<Eigen::UnitLower>().solveInPlace(x);
  if (!upper && !unit) m.template triangularView<Eigen::Lower>().solveInPlace(x);
}

// LAPACK's unblocked potf2 on the lower triangle: column by column, stopping at the first pivot that is
// <= 0 or NaN (an inf pivot passes, as LAPACK's). On failure that pivot's value stays on the diagonal, the
// columns before it hold the factor's and the rest the input's, and info is its 1-based order.
template <typename T> void chol_unblocked(int64_t n, MapMat<T>& m, int32_t* info) {
  for (int64_t j = 0; j < n; ++j) {
    T ajj = m(j, j);
    for (int64_t k = 0; k < j; ++k) ajj -= m(j, k) * m(j, k);
    if (!(ajj > T(0))) {  // also NaN
      m(j, j) = ajj;
      *info = int32_t(j + 1);
      return;
    }
    ajj = std::sqrt(ajj);
    m(j, j) = ajj;
    for (int64_t i = j + 1; i < n; ++i) {
      T v = m(i, j);
      for (int64_t k = 0; k < j; ++k) v -= m(i, k) * m(j, k);
      m(i, j) = v / ajj;
    }
  }
}

// Eigen's blocked LLT first; where it fails, or lets a NaN through (its test is x <= 0), the unblocked
// loop above on the input finds the failing minor and leaves LAPACK's partial factor (one O(n^3) pass).
template <typename T> void chol_one(int64_t n, T* a, int32_t* info) {
  MapMat<T> m(a, n, n);
  *info = 0;
  Eigen::LLT<Mat<T>> llt(m);
  if (llt.info() == Eigen::Success) {
    bool nan = false;
    for (int64_t i = 0; i < n && !nan; ++i) nan = std::isnan(llt.matrixLLT()(i, i));
    if (!nan) {
      m = llt.matrixL().toDenseMatrix();
      return;
    }
  }
  chol_unblocked(n, m, info);
}

template <typename F> void over_batch(int64_t batch, int64_t n, F f) {
  parallel_for(0, batch, grain(n), [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) f(b);
  });
}

void check_dtype(const char* fn, DType dt) {
  KILN_CHECK(dt == DType::f32 || dt == DType::f64, fn, ": f32 or f64 only, got ", dt);
}

}  // namespace

void lu_factor(DType dt, int64_t batch, int64_t n, void* a, int32_t* piv, int32_t* info) {
  check_dtype("lu_factor", dt);
  over_batch(batch, n, [&](int64_t b) {
    if (dt == DType::f64)
      lu_one(n, static_cast<double*>(a) + b * n * n, piv + b * n, info + b);
    else
      lu_one(n, static_cast<float*>(a) + b * n * n, piv + b * n, info + b);
  });
}

void triangular_solve(DType dt, int64_t batch, int64_t n, int64_t k, const void* a, void* b, bool upper, bool unit) {
  check_dtype("triangular_solve", dt);
  if (n == 0 || k == 0) return;
  over_batch(batch, n, [&](int64_t i) {
    if (dt == DType::f64)
      tri_one(n, k, static_cast<const double*>(a) + i * n * n, static_cast<double*>(b) + i * n * k, upper, unit);
    else
      tri_one(n, k, static_cast<const float*>(a) + i * n * n, static_cast<float*>(b) + i * n * k, upper, unit);
  });
}

void cholesky(DType dt, int64_t batch, int64_t n, void* a, int32_t* info) {
  check_dtype("cholesky", dt);
  over_batch(batch, n, [&](int64_t b) {
    if (dt == DType::f64)
      chol_one(n, static_cast<double*>(a) + b * n * n, info + b);
    else
      chol_one(n, static_cast<float*>(a) + b * n * n, info + b);
  });
}

}  // namespace kiln::cpu
