// Tests for the spectral decompositions of engine/ops.h (engine/ops_spectral.cpp): eigh, eigvalsh, svd,
// svdvals and qr against their defining identities (A V = V diag(L), A = U diag(S) Vh, A = QR, orthonormal
// factors, ordering), batched and non-contiguous inputs, the refusals torch makes, and gradients against
// finite differences of gauge-invariant losses. tests/op_table.cpp has their rows (first and second
// derivatives); tests/python/test_linalg_spectral_vs_torch.py compares them with torch.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "engine/gradcheck.h"
#include "kiln.h"

using namespace kiln;

namespace {

double max_abs(const Tensor& t) { return amax(abs(t.to(DType::f64))).item<double>(); }

Tensor sym(const Tensor& a) { return a + a.transpose(-1, -2); }

Tensor eye_batch(int64_t n, const Tensor& like) { return eye(n, -1, TensorOptions(like.dtype())); }

}  // namespace

TEST_CASE("linalg_eigh: A V = V diag(L), V orthonormal, L ascending; UPLO reads one triangle") {
  Generator g(5);
  for (DType dt : {DType::f32, DType::f64}) {
    const double tol = dt == DType::f64 ? 1e-10 : 1e-4;
    const Tensor a = sym(randn({3, 6, 6}, TensorOptions(dt), &g));
    const EighResult e = linalg_eigh(a);
    CHECK(e.eigenvalues.shape() == Shape{3, 6});
    CHECK(e.eigenvectors.shape() == Shape{3, 6, 6});
    const Tensor& v = e.eigenvectors;
    CHECK(max_abs(matmul(a, v) - v * e.eigenvalues.unsqueeze(-2)) < tol * 10);
    CHECK(max_abs(matmul(v.transpose(-1, -2), v) - eye_batch(6, a)) < tol);
    const std::vector<double> l = e.eigenvalues.to_vector();
    for (size_t i = 0; i + 1 < l.size(); ++i)
      if ((i + 1) % 6 != 0) CHECK(l[i] <= l[i + 1]);
    // The upper triangle alone: the lower one replaced by garbage changes nothing.
    const Tensor garbage = triu(a) + tril(randn({3, 6, 6}, TensorOptions(dt), &g), -1);
    CHECK(max_abs(linalg_eigvalsh(garbage, true) - e.eigenvalues) < tol * 10);
    CHECK(max_abs(linalg_eigvalsh(garbage.transpose(-1, -2)) - e.eigenvalues) < tol * 10);  // non-contiguous
  }
}

TEST_CASE("linalg_svd and linalg_qr: reconstructions, orthonormal factors, shapes of each mode") {
  Generator g(6);
  for (const Shape& s : {Shape{2, 7, 4}, Shape{4, 7}, Shape{5, 5}}) {
    const Tensor a = randn(s, TensorOptions(DType::f64), &g);
    const int64_t m = a.size(-2), n = a.size(-1), k = std::min(m, n);
    const SvdResult r = linalg_svd(a, false);
    CHECK(r.U.size(-1) == k);
    CHECK(r.Vh.size(-2) == k);
    CHECK(max_abs(matmul(r.U * r.S.unsqueeze(-2), r.Vh) - a) < 1e-12);
    const std::vector<double> sv = r.S.to_vector();
    for (size_t i = 0; i + 1 < sv.size(); ++i)
      if ((i + 1) % size_t(k) != 0) CHECK(sv[i] >= sv[i + 1]);
    const SvdResult f = linalg_svd(a, true);
    CHECK(f.U.size(-1) == m);
    CHECK(f.Vh.size(-2) == n);
    CHECK(max_abs(matmul(f.U.transpose(-1, -2), f.U) - eye(m, -1, TensorOptions(DType::f64))) < 1e-12);
    CHECK(max_abs(matmul(f.Vh, f.Vh.transpose(-1, -2)) - eye(n, -1, TensorOptions(DType::f64))) < 1e-12);
    CHECK(max_abs(linalg_svdvals(a) - r.S) < 1e-12);

    const QrResult q = linalg_qr(a);
    CHECK(q.Q.size(-1) == k);
    CHECK(q.R.size(-2) == k);
    CHECK(max_abs(matmul(q.Q, q.R) - a) < 1e-12);
    CHECK(max_abs(q.R - triu(q.R)) == 0.0);
    const QrResult c = linalg_qr(a, QrMode::complete);
    CHECK(c.Q.size(-1) == m);
    CHECK(c.R.size(-2) == m);
    CHECK(max_abs(matmul(c.Q, c.R) - a) < 1e-12);
    CHECK(max_abs(matmul(c.Q.transpose(-1, -2), c.Q) - eye(m, -1, TensorOptions(DType::f64))) < 1e-12);
    const QrResult ro = linalg_qr(a, QrMode::r);
    CHECK(ro.Q.shape() == Shape{0});
    CHECK(max_abs(ro.R - q.R) == 0.0);
  }
}

TEST_CASE("linalg spectral ops: the refusals name the op and what was wrong") {
  CHECK_THROWS_WITH_AS(linalg_eigh(zeros({3, 4}, TensorOptions(DType::f64))),
                       doctest::Contains("linalg.eigh: A must be batches of square matrices, but they are 3 by 4"),
                       kiln::Error);
  CHECK_THROWS_WITH_AS(linalg_svd(zeros({3}, TensorOptions(DType::f64))),
                       doctest::Contains("linalg.svd: The input tensor A must have at least 2 dimensions"),
                       kiln::Error);
  CHECK_THROWS_WITH_AS(linalg_qr(zeros({3, 3}, TensorOptions(DType::f16))),
                       doctest::Contains("only float32 and float64"), kiln::Error);
  CHECK_THROWS_WITH_AS(linalg_eigvalsh(zeros({3, 3}, TensorOptions(DType::i64))), doctest::Contains("linalg.eigvalsh"),
                       kiln::Error);
  CHECK_THROWS_WITH_AS(linalg_svdvals(full({3, 3}, NAN, TensorOptions(DType::f64))), doctest::Contains("non-finite"),
                       kiln::Error);
  CHECK_THROWS_WITH_AS(linalg_eigh(full({2, 3, 3}, NAN, TensorOptions(DType::f64))),
                       doctest::Contains("failed to converge"), kiln::Error);
  // QR's gradient needs Q, and a tall complete Q is not unique: torch's errors, at backward.
  const Tensor a = randn({4, 3}, TensorOptions(DType::f64)).set_requires_grad(true);
  CHECK_THROWS_WITH_AS(sum(linalg_qr(a, QrMode::r).R).backward(), doctest::Contains("mode='r'"), kiln::Error);
  CHECK_THROWS_WITH_AS(sum(linalg_qr(a, QrMode::complete).Q).backward(),
                       doctest::Contains("not differentiable when mode='complete' and nrows > ncols"), kiln::Error);
}

TEST_CASE("linalg spectral ops: gradients of gauge-invariant losses against finite differences") {
  Generator g(8);
  GradcheckOptions opts;
  const Tensor x = randn({2, 5, 5}, TensorOptions(DType::f64), &g);
  // eigh: eigenvalues and a matrix function V diag(sin L) V^T; the input symmetrised inside.
  CHECK(gradcheck(
            [](const std::vector<Tensor>& in) {
              const EighResult e = linalg_eigh(sym(in[0]));
              return cat({e.eigenvalues.reshape({-1}),
                          matmul(e.eigenvectors * sin(e.eigenvalues).unsqueeze(-2), e.eigenvectors.transpose(-1, -2))
                              .reshape({-1})},
                         0);
            },
            {x}, opts)
            .empty());
  // svd, tall and wide: the projectors U U^T and Vh^T Vh, and the values.
  for (const Shape& s : {Shape{6, 4}, Shape{3, 5}}) {
    const Tensor y = randn(s, TensorOptions(DType::f64), &g);
    CHECK(gradcheck(
              [](const std::vector<Tensor>& in) {
                const SvdResult r = linalg_svd(in[0], false);
                const Tensor pu = matmul(r.U * r.S.unsqueeze(-2), r.U.transpose(-1, -2));
                const Tensor pv = matmul(r.Vh.transpose(-1, -2), r.Vh * sqrt(r.S.unsqueeze(-1)));
                return cat({r.S, pu.reshape({-1}), pv.reshape({-1})}, 0);
              },
              {y}, opts)
              .empty());
  }
  // qr (reduced, tall): Q and R themselves (Householder's signs are a smooth function of A).
  const Tensor z = randn({6, 4}, TensorOptions(DType::f64), &g);
  CHECK(gradcheck(
            [](const std::vector<Tensor>& in) {
              const QrResult r = linalg_qr(in[0]);
              return cat({r.Q.reshape({-1}), r.R.reshape({-1})}, 0);
            },
            {z}, opts)
            .empty());
}
