// The decompositions of engine/ops_decomp.cpp on small matrices with known answers: LAPACK's pivots,
// inverses, dets (and det's finite gradient at a singular matrix), Cholesky, triangular solves, the
// errors PyTorch gives, and second derivatives under create_graph. The op table (tests/op_table.cpp) checks
// gradients against finite differences; tests/python/test_linalg_lu_vs_torch.py compares with torch.
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>

#include "engine/autograd.h"
#include "engine/nn_ops.h"
#include "engine/ops.h"
#include "kernels/cuda/cuda_backend.h"

using namespace kiln;

namespace {

const TensorOptions kF64(DType::f64);

Tensor m(const std::vector<double>& v, const Shape& s) { return from_vector(v, s, kF64); }

double max_diff(const Tensor& a, const Tensor& b) { return amax(abs(a - b)).item<double>(); }

// The 3 x 3 cofactor matrix (det's exact gradient) in plain doubles, row-major.
std::vector<double> cofactors3(const std::vector<double>& a) {
  std::vector<double> c(9);
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) {
      const int r0 = (i + 1) % 3, r1 = (i + 2) % 3, c0 = (j + 1) % 3, c1 = (j + 2) % 3;
      c[size_t(i * 3 + j)] =
          a[size_t(r0 * 3 + c0)] * a[size_t(r1 * 3 + c1)] - a[size_t(r0 * 3 + c1)] * a[size_t(r1 * 3 + c0)];
    }
  return c;
}

// d/dA sum(w * cofactors(A)) exactly: the sum is quadratic in A, so a central difference with step 1 is exact.
std::vector<double> cofactor_hessian3(const std::vector<double>& a, const std::vector<double>& w) {
  const auto f = [&](const std::vector<double>& x) {
    const std::vector<double> c = cofactors3(x);
    double s = 0;
    for (size_t i = 0; i < 9; ++i) s += w[i] * c[i];
    return s;
  };
  std::vector<double> h(9);
  for (size_t k = 0; k < 9; ++k) {
    std::vector<double> up = a, down = a;
    up[k] += 1;
    down[k] -= 1;
    h[k] = (f(up) - f(down)) / 2;
  }
  return h;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

TEST_CASE("linalg lu: LAPACK's 1-based pivots, and A = P L U") {
  const Tensor a = m({1, 2, 0, 3, 4, 1, 0, 1, 5}, {3, 3});
  const LUFactor f = linalg_lu_factor(a);
  CHECK(f.pivots.dtype() == DType::i32);
  // Column 0's largest is row 2 (3): swap 1 with 2 (1-based); then column 1's is row 3 (1 against 2/3).
  CHECK(f.pivots.values<int32_t>() == std::vector<int32_t>{2, 3, 3});
  const Tensor x = linalg_lu_solve(f.LU, f.pivots, eye(3, -1, kF64));
  CHECK(max_diff(matmul(a, x), eye(3, -1, kF64)) < 1e-12);
  const Tensor xt = linalg_lu_solve(f.LU, f.pivots, eye(3, -1, kF64), true, true);
  CHECK(max_diff(matmul(a.t(), xt), eye(3, -1, kF64)) < 1e-12);
}

TEST_CASE("linalg inv, det, slogdet, logdet: values, batches and PyTorch's errors") {
  const Tensor a = m({4, 7, 2, 6}, {2, 2});
  CHECK(max_diff(linalg_inv(a), m({0.6, -0.7, -0.2, 0.4}, {2, 2})) < 1e-12);
  CHECK(std::abs(linalg_det(a).item<double>() - 10) < 1e-12);
  const Tensor neg = m({0, 1, 1, 0}, {2, 2});  // det -1
  const SignLogAbsDet s = linalg_slogdet(stack({a, neg}, 0));
  CHECK(s.sign.values<double>() == std::vector<double>{1, -1});
  CHECK(std::abs(s.logabsdet.values<double>()[0] - std::log(10.0)) < 1e-12);
  CHECK(std::isnan(logdet(neg).item<double>()));
  const Tensor sing = m({1, 2, 2, 4}, {2, 2});
  CHECK(linalg_det(sing).item<double>() == 0);
  CHECK(std::isinf(logdet(sing).item<double>()));
  CHECK_THROWS_WITH_AS(
      linalg_inv(sing),
      doctest::Contains("linalg.inv: The diagonal element 2 is zero, the inversion could not be completed because the "
                        "input matrix is singular."),
      kiln::Error);
  CHECK_THROWS_WITH_AS(linalg_inv(stack({a, sing}, 0)),
                       doctest::Contains("linalg.inv: (Batch element 1): The diagonal"), kiln::Error);
  CHECK_THROWS_WITH_AS(linalg_solve(sing, ones({2}, kF64)),
                       doctest::Contains("linalg.solve: The solver failed because the input matrix is singular."),
                       kiln::Error);
  CHECK_THROWS_WITH_AS(linalg_det(ones({2, 3}, kF64)),
                       doctest::Contains("linalg.det: A must be batches of square matrices, but they are 2 by 3"),
                       kiln::Error);
  CHECK_THROWS_WITH_AS(linalg_inv(a.to(DType::f16)),
                       doctest::Contains("linalg.inv: Low precision dtypes not supported"), kiln::Error);
  CHECK_THROWS_WITH_AS(linalg_inv(a.to(DType::i64)), doctest::Contains("linalg.inv: Expected a floating point"),
                       kiln::Error);
}

TEST_CASE("linalg det: the gradient at a singular matrix is the cofactor matrix, finite") {
  // [[1, 2], [2, 4]]: det 0, cofactors [[4, -2], [-2, 1]].
  const Tensor a = m({1, 2, 2, 4}, {2, 2}).set_requires_grad();
  linalg_det(a).backward();
  CHECK(max_diff(a.grad(), m({4, -2, -2, 1}, {2, 2})) < 1e-12);
  // 3 x 3 of rank 2: the third row the sum of the others. Cofactor (0, 0) = 5 * 9 - 6 * 7 = 3
  // (torch gives these with create_graph, zeros without).
  const Tensor b = m({1, 2, 3, 4, 5, 6, 5, 7, 9}, {3, 3}).set_requires_grad();
  linalg_det(b).backward();
  CHECK(std::isfinite(amax(abs(b.grad())).item<double>()));
  CHECK(std::abs(b.grad().values<double>()[0] - 3) < 1e-12);
}

TEST_CASE("linalg det: second derivative at rank-deficient matrices whose computed det is not exactly 0") {
  // The rank-2 matrix above: Eigen's LU gives det ~3e-15, not 0, so an exact-zero test would take det A^-T,
  // whose derivative is off by ~6; the tolerance on U's diagonal takes the SVD adjugate. Alone, and in a
  // batch with an invertible matrix (each gets its own branch).
  const std::vector<double> sing = {1, 2, 3, 4, 5, 6, 5, 7, 9}, reg = {2, 1, 0, 1, 3, 1, 0, 1, 4};
  const std::vector<double> w = {1, -2, 3, 0.5, 4, -1, 2, 1, -3};
  CHECK(linalg_det(m(sing, {3, 3})).item<double>() != 0);
  const auto check_hessian = [&](Tensor x, const std::vector<std::vector<double>>& mats) {
    const Tensor leaf = x.set_requires_grad();
    const Tensor g = autograd::grad({sum(linalg_det(leaf))}, {leaf}, {}, false, true, true)[0];
    const Tensor wt = m(w, {3, 3});
    const Tensor h = autograd::grad({sum(g * wt)}, {leaf})[0].reshape({-1, 9});
    for (size_t b = 0; b < mats.size(); ++b) {
      const std::vector<double> want_g = cofactors3(mats[b]), want_h = cofactor_hessian3(mats[b], w);
      const std::vector<double> got_g = g.detach().reshape({-1, 9}).select(0, int64_t(b)).values<double>();
      const std::vector<double> got_h = h.select(0, int64_t(b)).values<double>();
      for (size_t k = 0; k < 9; ++k) {
        CHECK(std::abs(got_g[k] - want_g[k]) < 1e-9);
        CHECK(std::abs(got_h[k] - want_h[k]) < 1e-9);
      }
    }
  };
  check_hessian(m(sing, {3, 3}), {sing});
  check_hessian(stack({m(reg, {3, 3}), m(sing, {3, 3})}, 0), {reg, sing});
  // Another rank 2 (the third row the sum of two random-ish rows), not exactly 0 in floating point.
  const std::vector<double> r2 = {0.3, -1.7, 0.9, 1.1, 0.4, -0.6, 1.4, -1.3, 0.3};
  check_hessian(m(r2, {3, 3}), {r2});
}

TEST_CASE("linalg det: the gradient at an exactly singular 128 x 128 is one SVD, not n^2 minors' dets") {
  // The identity with one zero on the diagonal: the adjugate's transpose is 1 at that entry, 0 elsewhere.
  const int64_t n = 128;
  std::vector<double> v(size_t(n * n), 0.0);
  for (int64_t i = 0; i < n; ++i) v[size_t(i * n + i)] = i == 5 ? 0.0 : 1.0;
  const Tensor a = m(v, {n, n}).set_requires_grad();
  const auto t0 = std::chrono::steady_clock::now();
  linalg_det(a).backward();
  const double took = seconds_since(t0);
  std::vector<double> want(size_t(n * n), 0.0);
  want[size_t(5 * n + 5)] = 1;
  CHECK(max_diff(a.grad(), m(want, {n, n})) < 1e-12);
  CHECK(took < 1.0);  // the n^2 cofactor dets took seconds
}

TEST_CASE("linalg slogdet, logdet: the gradient at a singular matrix is torch's inf entries, not an inv error") {
  const Tensor sing = m({1, 2, 2, 4}, {2, 2});
  const double inf = std::numeric_limits<double>::infinity();
  const Tensor a = sing.clone().set_requires_grad();
  linalg_slogdet(a).logabsdet.backward();
  CHECK(a.grad().values<double>() == std::vector<double>{-inf, inf, inf, -inf});  // torch's
  const Tensor b = sing.clone().set_requires_grad();
  logdet(b).backward();
  CHECK(b.grad().values<double>() == std::vector<double>{-inf, inf, inf, -inf});
  // In a batch the invertible matrix keeps A^-T, and its second derivative.
  const Tensor reg = m({4, 7, 2, 6}, {2, 2});
  const Tensor c = stack({reg, sing}, 0).set_requires_grad();
  const Tensor g = autograd::grad({sum(linalg_slogdet(c).logabsdet)}, {c}, {}, false, true, true)[0];
  CHECK(max_diff(g.select(0, 0).detach(), linalg_inv(reg).t()) < 1e-12);
  CHECK(g.select(0, 1).detach().values<double>() == std::vector<double>{-inf, inf, inf, -inf});
}

TEST_CASE("linalg solve: vector and matrix right-hand sides, broadcast, left=false") {
  const Tensor a = m({3, 1, 1, 2}, {2, 2});
  const Tensor b = m({9, 8}, {2});
  CHECK(max_diff(linalg_solve(a, b), m({2, 3}, {2})) < 1e-12);
  const Tensor batch = stack({a, a * 2.0}, 0);  // [2, 2, 2] with B [2, 1]: B broadcast over the batch
  const Tensor x = linalg_solve(batch, b.unsqueeze(-1));
  CHECK(x.shape() == Shape{2, 2, 1});
  CHECK(max_diff(matmul(batch, x), b.unsqueeze(-1).expand({2, 2, 1})) < 1e-12);
  const Tensor xr = linalg_solve(a, m({1, 2, 3, 4}, {2, 2}), false);  // X A = B
  CHECK(max_diff(matmul(xr, a), m({1, 2, 3, 4}, {2, 2})) < 1e-12);
  CHECK_THROWS_WITH_AS(linalg_solve(a, ones({3}, kF64)),
                       doctest::Contains("linalg.solve: Incompatible shapes of A and B for the equation AX = B"),
                       kiln::Error);
}

TEST_CASE("linalg cholesky: factors, solves, the leading minor that fails") {
  const Tensor a = m({4, 2, 2, 3}, {2, 2});
  const Tensor l = linalg_cholesky(a);
  CHECK(max_diff(l, m({2, 0, 1, std::sqrt(2.0)}, {2, 2})) < 1e-12);
  CHECK(max_diff(linalg_cholesky(a, true), l.t()) < 1e-12);
  CHECK(max_diff(cholesky_inverse(l), linalg_inv(a)) < 1e-12);
  CHECK(max_diff(cholesky_solve(m({1, 1}, {2, 1}), l), linalg_solve(a, m({1, 1}, {2, 1}))) < 1e-12);
  const Tensor bad = m({1, 2, 2, 1}, {2, 2});
  CHECK_THROWS_WITH_AS(
      linalg_cholesky(bad),
      doctest::Contains("linalg.cholesky: The factorization could not be completed because the input is not "
                        "positive-definite (the leading minor of order 2 is not positive-definite)."),
      kiln::Error);
  CHECK_THROWS_WITH_AS(linalg_cholesky(stack({a, bad}, 0)), doctest::Contains("(Batch element 1)"), kiln::Error);
  CHECK(linalg_cholesky_ex(stack({a, bad}, 0)).info.values<int32_t>() == std::vector<int32_t>{0, 2});
}

TEST_CASE("linalg cholesky: upper reads the upper triangle, LAPACK's partial factor, NaN pivots fail") {
  // Not symmetric: lower uses [4; 3 5], upper [4 1; 5] (torch's potrf 'L' / 'U').
  const Tensor ns = m({4, 1, 3, 5}, {2, 2});
  CHECK(max_diff(linalg_cholesky(ns), m({2, 0, 1.5, std::sqrt(5 - 2.25)}, {2, 2})) < 1e-12);
  CHECK(max_diff(linalg_cholesky(ns, true), m({2, 0.5, 0, std::sqrt(5 - 0.25)}, {2, 2})) < 1e-12);
  CHECK(max_diff(linalg_cholesky_ex(ns, true).L, m({2, 0.5, 0, std::sqrt(5 - 0.25)}, {2, 2})) < 1e-12);
  // A failed factorization: torch's L (columns before the failing pivot factored, the pivot's value).
  const CholeskyEx up = linalg_cholesky_ex(m({1, 2, 5, 1}, {2, 2}), true);
  CHECK(up.info.item<int32_t>() == 2);
  CHECK(max_diff(up.L, m({1, 2, 0, -3}, {2, 2})) < 1e-12);
  const CholeskyEx lo = linalg_cholesky_ex(m({4, 1, 1, 3, 5, 2, 1, 1, -9}, {3, 3}));
  CHECK(lo.info.item<int32_t>() == 3);
  const double l11 = std::sqrt(5 - 2.25), l21 = (1 - 0.75) / l11;
  CHECK(max_diff(lo.L, m({2, 0, 0, 1.5, l11, 0, 0.5, l21, -9 - 0.25 - l21 * l21}, {3, 3})) < 1e-12);
  // NaN: LLT's x <= 0 test lets it through; torch (LAPACK's isnan) fails at that pivot. An inf pivot passes.
  const double nan = std::nan(""), inf = std::numeric_limits<double>::infinity();
  CHECK(linalg_cholesky_ex(m({nan, nan, nan, nan}, {2, 2})).info.item<int32_t>() == 1);
  CHECK(linalg_cholesky_ex(m({4, 0, nan, 1}, {2, 2})).info.item<int32_t>() == 2);
  CHECK_THROWS_WITH_AS(linalg_cholesky(m({nan, 0, 0, 1}, {2, 2})),
                       doctest::Contains("the leading minor of order 1 is not positive-definite"), kiln::Error);
  const CholeskyEx big = linalg_cholesky_ex(m({4, 0, inf, 1}, {2, 2}));
  CHECK(big.info.item<int32_t>() == 2);
  CHECK(big.L.values<double>() == std::vector<double>{2, 0, inf, -inf});  // torch's
  CHECK(linalg_cholesky_ex(m({inf, 0, 0, 1}, {2, 2})).info.item<int32_t>() == 0);
}

TEST_CASE("linalg cholesky_ex: a failure at the last minor of an 800 x 800 is one factorization, not n") {
  // Positive-definite but for the last diagonal entry: the old search refactored every leading minor (O(n^4)).
  const int64_t n = 800;
  std::vector<double> v(size_t(n * n), 0.5);
  for (int64_t i = 0; i < n; ++i) v[size_t(i * n + i)] = 2.5;
  v.back() = -1;
  const Tensor a = m(v, {n, n});
  const auto t0 = std::chrono::steady_clock::now();
  const CholeskyEx r = linalg_cholesky_ex(a);
  const double took = seconds_since(t0);
  CHECK(r.info.item<int32_t>() == int32_t(n));
  CHECK(took < 1.0);  // seconds before
}

TEST_CASE("linalg solve_triangular: upper, lower, unit diagonal, right side") {
  const Tensor u = m({2, 1, 9, 4}, {2, 2});  // the 9 below the diagonal is not read with upper
  const Tensor b = m({4, 8}, {2, 1});
  CHECK(max_diff(linalg_solve_triangular(u, b, true), m({1, 2}, {2, 1})) < 1e-12);
  CHECK(max_diff(linalg_solve_triangular(u, b, false, true, true), m({4, -28}, {2, 1})) < 1e-12);
  const Tensor xr = linalg_solve_triangular(u, b.t(), true, false);  // X U = B
  CHECK(max_diff(matmul(xr, triu(u)), b.t()) < 1e-12);
}

TEST_CASE("linalg: second derivatives of inv and det under create_graph") {
  // d/dA det(A) = det(A) A^-T; for 2 x 2 that is the cofactor matrix [[d, -c], [-b, a]], linear in A:
  // the derivative of sum(w * grad) w.r.t. A is the fixed rearrangement of w.
  const Tensor a = m({3, 1, 2, 5}, {2, 2}).set_requires_grad();
  const Tensor g = autograd::grad({linalg_det(a)}, {a}, {}, false, true, true)[0];
  CHECK(max_diff(g.detach(), m({5, -2, -1, 3}, {2, 2})) < 1e-12);
  const Tensor w = m({1, 2, 3, 4}, {2, 2});
  const Tensor h = autograd::grad({sum(g * w)}, {a})[0];
  // sum(w * cof) = w00 a11 - w01 a10 - w10 a01 + w11 a00 -> [[w11, -w10], [-w01, w00]]
  CHECK(max_diff(h, m({4, -3, -2, 1}, {2, 2})) < 1e-10);
  // sum(inv(A)) twice: the second derivative along A against a central difference of the first.
  const Tensor b = m({4, 1, 2, 3}, {2, 2}).set_requires_grad();
  const Tensor gb = autograd::grad({sum(linalg_inv(b))}, {b}, {}, false, true, true)[0];
  const Tensor hb = autograd::grad({sum(gb * w)}, {b})[0];
  const double eps = 1e-6;
  const Tensor e = m({0, 1, 0, 0}, {2, 2});
  const auto first = [&](const Tensor& x) {
    const Tensor leaf = x.detach().set_requires_grad();
    return sum(autograd::grad({sum(linalg_inv(leaf))}, {leaf})[0] * w).item<double>();
  };
  const double fd = (first(b + e * eps) - first(b - e * eps)) / (2 * eps);
  CHECK(std::abs(hb.values<double>()[1] - fd) < 1e-6);
}

TEST_CASE("linalg lu_solve: pivots must be LU's shape without its last dim, torch's message") {
  const Tensor lu = eye(4, -1, kF64).expand({3, 4, 4});
  CHECK_THROWS_WITH_AS(
      linalg_lu_solve(lu, ones({5, 4}, TensorOptions(DType::i32)), ones({3, 4, 1}, kF64)),
      doctest::Contains("linalg.lu_solve: Expected LU.shape[:-1] and pivots.shape to be the same, but got pivots with "
                        "shape [5, 4] instead"),
      kiln::Error);
  CHECK_THROWS_WITH_AS(linalg_lu_solve(lu, ones({4}, TensorOptions(DType::i32)), ones({3, 4, 1}, kF64)),
                       doctest::Contains("Expected LU.shape[:-1] and pivots.shape to be the same"), kiln::Error);
}

TEST_CASE("linalg solves: A and B on different devices are an error naming both") {
  if (cuda::device_count() == 0) {
    MESSAGE("skipped: no CUDA device visible");
    return;
  }
  const Tensor a = m({2, 0, 1, 3}, {2, 2}), b = m({1, 2}, {2, 1});
  const Tensor bg = b.to(cuda_device(0));
  const auto msg = doctest::Contains("Expected all tensors to be on the same device");
  CHECK_THROWS_WITH_AS(linalg_solve(a, bg), msg, kiln::Error);
  CHECK_THROWS_WITH_AS(linalg_solve(a, bg.squeeze(-1)), msg, kiln::Error);
  CHECK_THROWS_WITH_AS(linalg_solve_triangular(a, bg, false), msg, kiln::Error);
  CHECK_THROWS_WITH_AS(cholesky_solve(bg, a), msg, kiln::Error);
  const LUFactor f = linalg_lu_factor(a);
  CHECK_THROWS_WITH_AS(linalg_lu_solve(f.LU, f.pivots, bg), msg, kiln::Error);
  CHECK_THROWS_WITH_AS(linalg_solve(a.to(bg.device()), b), msg, kiln::Error);
}
