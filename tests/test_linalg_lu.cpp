// The decompositions of engine/ops_decomp.cpp on small matrices with known answers: LAPACK's pivots,
// inverses, dets (and det's finite gradient at a singular matrix), Cholesky, triangular solves, the
// errors PyTorch gives, and second derivatives under create_graph. The op table (tests/op_table.cpp) checks
// gradients against finite differences; tests/python/test_linalg_lu_vs_torch.py compares with torch.
#include <doctest/doctest.h>

#include <cmath>

#include "engine/autograd.h"
#include "engine/nn_ops.h"
#include "engine/ops.h"

using namespace kiln;

namespace {

const TensorOptions kF64(DType::f64);

Tensor m(const std::vector<double>& v, const Shape& s) { return from_vector(v, s, kF64); }

double max_diff(const Tensor& a, const Tensor& b) { return amax(abs(a - b)).item<double>(); }

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
