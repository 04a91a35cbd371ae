// Eigen's symmetric eigensolver, SVD and Householder QR over a batch of row-major matrices
// (kernels/linalg_spectral.h). One matrix per task of the engine's pool; Eigen itself never starts
// threads.
#include "kernels/linalg_spectral.h"

#include <atomic>
#include <cmath>
#include <string>
#include <vector>

#if defined(__SSE2__)
#include <xmmintrin.h>
#endif

#define EIGEN_DONT_PARALLELIZE
// GCC 12's false -Wmaybe-uninitialized inside Eigen's vectorised code (as kernels/cpu/gemm.cpp).
#pragma GCC diagnostic push
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <Eigen/Eigenvalues>
#include <Eigen/Householder>
#include <Eigen/QR>
#include <Eigen/SVD>
#pragma GCC diagnostic pop

#include "base/thread_pool.h"

namespace kiln::spectral {
namespace {

template <typename T> using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <typename T> using CMap = Eigen::Map<const Mat<T>>;
template <typename T> using MMap = Eigen::Map<Mat<T>>;
template <typename T> using VMap = Eigen::Map<Eigen::Matrix<T, Eigen::Dynamic, 1>>;

// The pool's tasks flush subnormals to zero (set_flush_denormal, on by default). The iterative solvers
// lose orthogonality on inputs of wide range that way, and subnormal values vanish, so each batch runs
// with IEEE subnormals, as LAPACK's (torch's) does; the caller's mode is restored after.
class IeeeSubnormals {
 public:
  IeeeSubnormals() {
#if defined(__SSE2__)
    saved_ = _mm_getcsr();
    if (saved_ & kFtzDaz) _mm_setcsr(saved_ & ~kFtzDaz);
#endif
  }
  ~IeeeSubnormals() {
#if defined(__SSE2__)
    if (_mm_getcsr() != saved_) _mm_setcsr(saved_);
#endif
  }
  IeeeSubnormals(const IeeeSubnormals&) = delete;
  IeeeSubnormals& operator=(const IeeeSubnormals&) = delete;

 private:
  static constexpr unsigned kFtzDaz = 0x8040u;
  unsigned saved_ = 0;
};

// Runs f(i) for each matrix of the batch on the pool; the first failing matrix's index, or -1.
template <class F> int64_t each(int64_t batch, F f) {
  std::atomic<int64_t> failed{-1};
  parallel_for(0, batch, 1, [&](int64_t b0, int64_t b1) {
    const IeeeSubnormals ieee;
    for (int64_t i = b0; i < b1; ++i)
      if (!f(i)) {
        int64_t none = -1;
        failed.compare_exchange_strong(none, i);
      }
  });
  return failed.load();
}

std::string at_batch(int64_t batch, int64_t i) {
  return batch > 1 ? " (batch element " + std::to_string(i) + ")" : std::string();
}

// Whether the triangle of x that eigh reads is finite (the other one may hold anything, as LAPACK's).
template <typename T> bool triangle_finite(const CMap<T>& x, bool upper) {
  for (int64_t r = 0; r < x.rows(); ++r)
    for (int64_t c = upper ? r : 0; c < (upper ? x.cols() : r + 1); ++c)
      if (!std::isfinite(x(r, c))) return false;
  return true;
}

// f32 matrices are decomposed in f64 and rounded back: Eigen's f32 solvers return eigenvectors and singular
// vectors far from orthonormal on graded or low-rank inputs (a zero row of Vh), where LAPACK's sgesdd does not.
template <typename T> std::string eigh_t(int64_t batch, int64_t n, const T* a, bool upper, T* w, T* v) {
  const int64_t bad = each(batch, [&](int64_t i) {
    const CMap<T> xt(a + i * n * n, n, n);
    if (!triangle_finite(xt, upper)) return false;  // LAPACK's syevd fails on NaN (torch's error)
    const Mat<double> x = xt.template cast<double>();
    // Eigen reads the lower triangle: the upper one of x is the lower one of x^T.
    Eigen::SelfAdjointEigenSolver<Mat<double>> es;
    if (upper)
      es.compute(x.transpose(), v ? Eigen::ComputeEigenvectors : Eigen::EigenvaluesOnly);
    else
      es.compute(x, v ? Eigen::ComputeEigenvectors : Eigen::EigenvaluesOnly);
    if (es.info() != Eigen::Success) return false;
    VMap<T>(w + i * n, n) = es.eigenvalues().template cast<T>();
    if (v) MMap<T>(v + i * n * n, n, n) = es.eigenvectors().template cast<T>();
    return true;
  });
  if (bad < 0) return "";
  return "The algorithm failed to converge because the input matrix is ill-conditioned or has too many repeated "
         "eigenvalues (or holds NaN or infinity)" +
         at_batch(batch, bad);
}

template <typename T> std::string svd_t(int64_t batch, int64_t m, int64_t n, const T* a, bool full, T* u, T* s, T* vh) {
  const int64_t k = std::min(m, n);
  const int64_t bad = each(batch, [&](int64_t i) {
    const CMap<T> xt(a + i * m * n, m, n);
    if (!xt.allFinite()) return false;  // LAPACK's gesdd does not converge on NaN or infinity either
    const Mat<double> x = xt.template cast<double>();
    const unsigned opts = !u     ? 0u
                          : full ? unsigned(Eigen::ComputeFullU | Eigen::ComputeFullV)
                                 : unsigned(Eigen::ComputeThinU | Eigen::ComputeThinV);
    Eigen::BDCSVD<Mat<double>> svd(x, opts);
    if (svd.info() != Eigen::Success) return false;
    VMap<T>(s + i * k, k) = svd.singularValues().template cast<T>();
    if (u) {
      const int64_t uc = full ? m : k, vr = full ? n : k;
      MMap<T>(u + i * m * uc, m, uc) = svd.matrixU().template cast<T>();
      MMap<T>(vh + i * vr * n, vr, n) = svd.matrixV().transpose().template cast<T>();
    }
    return true;
  });
  if (bad < 0) return "";
  return "The algorithm failed to converge because the input matrix contained non-finite values (or Eigen's "
         "BDCSVD did not converge)" +
         at_batch(batch, bad);
}

template <typename T> std::string qr_t(int64_t batch, int64_t m, int64_t n, const T* a, bool complete, T* q, T* r) {
  const int64_t k = std::min(m, n), qc = complete ? m : k, rr = complete ? m : k;
  each(batch, [&](int64_t i) {
    const CMap<T> x(a + i * m * n, m, n);
    Eigen::HouseholderQR<Mat<T>> hq(x);
    MMap<T> ro(r + i * rr * n, rr, n);
    ro = hq.matrixQR().topRows(rr).template triangularView<Eigen::Upper>();
    if (q) {
      Mat<T> full = Mat<T>::Identity(m, qc);
      full.applyOnTheLeft(hq.householderQ());
      MMap<T>(q + i * m * qc, m, qc) = full;
    }
    return true;
  });
  return "";
}

template <typename T> void tri_inv_t(int64_t batch, int64_t n, const T* r, T* out) {
  each(batch, [&](int64_t i) {
    const CMap<T> x(r + i * n * n, n, n);
    MMap<T> o(out + i * n * n, n, n);
    o.setIdentity();
    x.template triangularView<Eigen::Upper>().solveInPlace(o);
    return true;
  });
}

}  // namespace

std::string eigh(DType dt, int64_t batch, int64_t n, const void* a, bool upper, void* w, void* v) {
  if (dt == DType::f64)
    return eigh_t(batch, n, static_cast<const double*>(a), upper, static_cast<double*>(w), static_cast<double*>(v));
  return eigh_t(batch, n, static_cast<const float*>(a), upper, static_cast<float*>(w), static_cast<float*>(v));
}

std::string svd(DType dt, int64_t batch, int64_t m, int64_t n, const void* a, bool full, void* u, void* s, void* vh) {
  if (dt == DType::f64)
    return svd_t(batch, m, n, static_cast<const double*>(a), full, static_cast<double*>(u), static_cast<double*>(s),
                 static_cast<double*>(vh));
  return svd_t(batch, m, n, static_cast<const float*>(a), full, static_cast<float*>(u), static_cast<float*>(s),
               static_cast<float*>(vh));
}

std::string qr(DType dt, int64_t batch, int64_t m, int64_t n, const void* a, bool complete, void* q, void* r) {
  if (dt == DType::f64)
    return qr_t(batch, m, n, static_cast<const double*>(a), complete, static_cast<double*>(q), static_cast<double*>(r));
  return qr_t(batch, m, n, static_cast<const float*>(a), complete, static_cast<float*>(q), static_cast<float*>(r));
}

void upper_triangular_inverse(DType dt, int64_t batch, int64_t n, const void* r, void* out) {
  if (dt == DType::f64)
    tri_inv_t(batch, n, static_cast<const double*>(r), static_cast<double*>(out));
  else
    tri_inv_t(batch, n, static_cast<const float*>(r), static_cast<float*>(out));
}

}  // namespace kiln::spectral
