// Matrix decompositions and the solves built on them: LU (lu_factor, lu_solve, solve, inv, det, slogdet,
// logdet), Cholesky (cholesky, cholesky_solve, cholesky_inverse) and triangular solves, batched over the
// leading dims, f32 and f64, on the CPU kernels of kernels/linalg_lu.h (Eigen). A CUDA tensor is copied
// to the host, decomposed there and its result copied back (no cuSOLVER). Every backward is made of these
// ops and matmul (det's singular case: linalg_svd), so second derivatives work under create_graph; the
// formulas are PyTorch's.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "engine/autograd.h"
#include "engine/internal.h"
#include "engine/nn_ops.h"
#include "engine/ops.h"
#include "kernels/linalg_lu.h"

namespace kiln {
namespace {

// f32 and f64 only: 16-bit and integer tensors are refused, as PyTorch's linalg.
void check_float(const char* op, const char* what, const Tensor& t) {
  KILN_CHECK(t.defined(), op, ": ", what, " is undefined");
  KILN_CHECK(!is_low_precision(t.dtype()), op, ": Low precision dtypes not supported. Got ", t.dtype(), " (", what,
             "); convert it to f32 first");
  KILN_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::f64, op,
             ": Expected a floating point tensor as input. Got ", t.dtype(), " (", what, ")");
}

void check_square(const char* op, const char* what, const Tensor& A) {
  check_float(op, what, A);
  KILN_CHECK(A.dim() >= 2, op, ": ", what, " must have at least 2 dimensions, got shape ", A.shape());
  KILN_CHECK(A.size(-1) == A.size(-2), op, ": ", what, " must be batches of square matrices, but they are ", A.size(-2),
             " by ", A.size(-1), " matrices");
}

// A and B (and lu_solve's pivots) on one device, as PyTorch's "Expected all tensors to be on the same device".
void check_same_device(const char* op, const Tensor& A, const Tensor& B) {
  KILN_CHECK(A.device() == B.device(), op, ": Expected all tensors to be on the same device, but found A on ",
             A.device(), " and B on ", B.device());
}

void check_same_dtype(const char* op, const Tensor& A, const Tensor& B) {
  KILN_CHECK(A.dtype() == B.dtype(), op, ": Expected A and B to have the same dtype, but found A of type ", A.dtype(),
             " and B of type ", B.dtype(), " instead");
}

Shape batch_of(const Tensor& t) { return Shape(t.shape().begin(), t.shape().end() - 2); }

Shape with_matrix(Shape batch, int64_t rows, int64_t cols) {
  batch.insert(batch.end(), {rows, cols});
  return batch;
}

Shape broadcast_batch(const char* op, const Tensor& A, const Tensor& B) {
  try {
    return broadcast_shapes(batch_of(A), batch_of(B));
  } catch (const Error& e) {
    KILN_FAIL(op, ": the batch dims of A ", A.shape(), " and B ", B.shape(), " do not broadcast (", e.message(), ")");
  }
}

// A shape as PyTorch prints it in its messages: "[5, 4]".
std::string torch_shape(const Shape& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

// "(Batch element 3): " where A has batch dims, as PyTorch's messages.
std::string batch_prefix(const Tensor& A, int64_t b) {
  return A.dim() > 2 ? "(Batch element " + std::to_string(b) + "): " : std::string();
}

// t without its history, expanded to `shape`, as a fresh contiguous host tensor the kernels may overwrite.
Tensor host_copy(const Tensor& t, const Shape& shape) {
  Tensor h = t.detach().to(kCPU).expand(shape).clone();
  KILN_ASSERT(h.is_contiguous(), "host_copy: the copy must be contiguous");
  return h;
}

struct HostLU {
  Tensor lu;                  // [batch..., n, n] on the host
  Tensor piv;                 // i32 [batch..., n] on the host
  std::vector<int32_t> info;  // one per matrix
};

HostLU host_lu(const Tensor& A, const Shape& batch) {
  const int64_t n = A.size(-1);
  HostLU r;
  r.lu = host_copy(A, with_matrix(batch, n, n));
  Shape ps = batch;
  ps.push_back(n);
  r.piv = make_tensor(ps, DType::i32, kCPU);
  r.info.assign(size_t(batch.numel()), 0);
  cpu::lu_factor(A.dtype(), batch.numel(), n, r.lu.raw_data(), r.piv.data<int32_t>(), r.info.data());
  return r;
}

// The row order of P A = L U from LAPACK pivots: LU's row r is A's row perm[r]; `inverse` gives where each
// row of A went. i64 [batch..., n] on `dev`.
Tensor row_order(const Tensor& pivots, bool inverse, Device dev) {
  const Tensor p = pivots.detach().to(kCPU).to(DType::i32).contiguous();
  const int64_t n = p.size(-1), batch = n == 0 ? 0 : p.numel() / n;
  Tensor out = make_tensor(p.shape(), DType::i64, kCPU);
  const int32_t* pv = p.data<int32_t>();
  int64_t* o = out.data<int64_t>();
  std::vector<int64_t> perm(static_cast<size_t>(n));
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t i = 0; i < n; ++i) perm[size_t(i)] = i;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t j = int64_t(pv[b * n + i]) - 1;
      KILN_CHECK(j >= i && j < n, "lu_solve: pivots[", b, ", ", i, "] = ", j + 1, " is out of range [", i + 1, ", ", n,
                 "] (1-based LAPACK pivots, as linalg.lu_factor gives)");
      std::swap(perm[size_t(i)], perm[size_t(j)]);
    }
    for (int64_t r = 0; r < n; ++r) {
      if (inverse)
        o[b * n + perm[size_t(r)]] = r;
      else
        o[b * n + r] = perm[size_t(r)];
    }
  }
  return out.to(dev);
}

// Rows of M [batch..., n, k] taken in the order idx [batch'..., n] (the batches broadcast): out[r] = M[idx[r]].
Tensor take_rows(const Tensor& M, const Tensor& idx) {
  Shape batch = broadcast_shapes(batch_of(M), Shape(idx.shape().begin(), idx.shape().end() - 1));
  const int64_t n = M.size(-2), k = M.size(-1);
  Shape is = batch;
  is.push_back(n);
  const Tensor i = idx.expand(is).unsqueeze(-1).expand(with_matrix(batch, n, k));
  return gather(M.expand(with_matrix(batch, n, k)), -2, i);
}

Tensor mT(const Tensor& t) { return t.transpose(-1, -2); }

Tensor identity_like(const Tensor& A) {
  const int64_t n = A.size(-1);
  return eye(n, -1, TensorOptions(A.dtype(), A.device())).expand(A.shape());
}

// A X = B for triangular A, B [..., n, k]: the recorded op (left only; right solves are its transposes).
Tensor solve_triangular_left(const Tensor& A, const Tensor& B, bool upper, bool unit) {
  const Shape batch = broadcast_batch("linalg.solve_triangular", A, B);
  const int64_t n = A.size(-1), k = B.size(-1);
  const Tensor a = host_copy(A, with_matrix(batch, n, n));
  Tensor x = host_copy(B, with_matrix(batch, n, k));
  cpu::triangular_solve(A.dtype(), batch.numel(), n, k, a.raw_data(), x.raw_data(), upper, unit);
  x = x.to(A.device());
  if (autograd::needs_grad({A, B})) {
    const SavedTensor sa(A), sx(x);
    autograd::record("linalg_solve_triangular", {A, B}, {x},
                     [sa, sx, upper, unit](const GradCtx& c) -> std::vector<Tensor> {
                       const Tensor a = sa.unpack("linalg_solve_triangular");
                       // gB = A^-T G; gA = -gB X^T on A's triangle (off the diagonal when it is taken as ones).
                       const Tensor gb = solve_triangular_left(mT(a), c.g(), !upper, unit);
                       Tensor ga;
                       if (c.needs_grad(0)) {
                         const Tensor full = -matmul(gb, mT(sx.unpack("linalg_solve_triangular")));
                         ga = upper ? triu(full, unit ? 1 : 0) : tril(full, unit ? -1 : 0);
                       }
                       return {ga, c.needs_grad(1) ? gb : Tensor()};
                     });
  }
  return x;
}

// X = A^-1 B from the LU factors (lu_solve's left, not adjoint case), made of engine ops.
Tensor lu_solve_left(const Tensor& LU, const Tensor& order, const Tensor& B) {
  const Tensor pb = take_rows(B, order);
  const Tensor y = solve_triangular_left(LU, pb, false, true);
  return solve_triangular_left(LU, y, true, false);
}

// A^T X = B from the LU factors: X = P L^-T U^-T B.
Tensor lu_solve_adjoint(const Tensor& LU, const Tensor& inverse_order, const Tensor& B) {
  const Tensor y = solve_triangular_left(mT(LU), B, false, false);
  const Tensor z = solve_triangular_left(mT(LU), y, true, true);
  return take_rows(z, inverse_order);
}

// A X = B, A square, B [..., n, k]: the recorded solve.
Tensor solve_left(const Tensor& A, const Tensor& B) {
  const Shape batch = broadcast_batch("linalg.solve", A, B);
  Tensor x;
  {
    NoGradGuard ng;
    const HostLU f = host_lu(A, batch);
    for (size_t b = 0; b < f.info.size(); ++b)
      KILN_CHECK(f.info[b] == 0, "linalg.solve: ", batch_prefix(A, int64_t(b)),
                 "The solver failed because the input matrix is singular.");
    const Tensor order = row_order(f.piv, false, kCPU);
    x = lu_solve_left(f.lu, order, B.detach().to(kCPU)).contiguous().to(A.device());
  }
  if (autograd::needs_grad({A, B})) {
    const SavedTensor sa(A), sx(x);
    autograd::record("linalg_solve", {A, B}, {x}, [sa, sx](const GradCtx& c) -> std::vector<Tensor> {
      // gB = A^-T G; gA = -gB X^T (PyTorch's linalg_solve backward).
      const Tensor gb = solve_left(mT(sa.unpack("linalg_solve")), c.g());
      const Tensor ga = c.needs_grad(0) ? -matmul(gb, mT(sx.unpack("linalg_solve"))) : Tensor();
      return {ga, c.needs_grad(1) ? gb : Tensor()};
    });
  }
  return x;
}

// det and log|det| with its sign from LU factors on the host: the product of U's diagonal, negated per swap.
template <typename T> void det_from_lu(const HostLU& f, int64_t n, T* det, T* sign, T* logabs) {
  const T* lu = f.lu.data<T>();
  const int32_t* piv = f.piv.data<int32_t>();
  const int64_t batch = int64_t(f.info.size());
  for (int64_t b = 0; b < batch; ++b) {
    T d = 1, s = 1, la = 0;
    for (int64_t i = 0; i < n; ++i) {
      const T u = lu[(b * n + i) * n + i];
      d *= u;
      s *= u > 0 ? T(1) : u < 0 ? T(-1) : T(0);
      la += std::log(std::abs(u));
      if (piv[b * n + i] != i + 1) d = -d, s = -s;
    }
    if (det) det[b] = d;
    if (sign) sign[b] = s;
    if (logabs) logabs[b] = s == 0 ? -std::numeric_limits<T>::infinity() : la;
  }
}

// Per matrix of f: whether U's diagonal is numerically singular, min |U_ii| <= n eps max |U_ii| (an exact
// zero included), where det A^-T is rounding noise times an inverse and det's gradient is taken from the SVD.
template <typename T> std::vector<double> near_singular(const HostLU& f, int64_t n) {
  const T* lu = f.lu.data<T>();
  const T tol = T(n) * std::numeric_limits<T>::epsilon();
  std::vector<double> out(f.info.size(), 0.0);
  for (size_t b = 0; b < out.size(); ++b) {
    T lo = std::numeric_limits<T>::infinity(), hi = 0;
    for (int64_t i = 0; i < n; ++i) {
      const T u = std::abs(lu[(int64_t(b) * n + i) * n + i]);
      lo = std::min(lo, u);
      hi = std::max(hi, u);
    }
    out[b] = n > 0 && lo <= tol * hi ? 1.0 : 0.0;
  }
  return out;
}

// det's gradient (the adjugate's transpose) from one SVD, exact at singular A: A = U S Vh gives
// adj(A)^T = det(U) det(Vh) U diag(p) Vh, p_i the product of the s_j but s_i (PyTorch's singular case).
// Differentiable through linalg_svd; det(U) det(Vh) is +-1 and piecewise constant, so taken without history.
Tensor det_grad_svd(const Tensor& A) {
  const int64_t n = A.size(-1);
  const SvdResult svd = linalg_svd(A, false);
  Tensor sign;
  {
    NoGradGuard ng;
    sign = linalg_det(svd.U) * linalg_det(svd.Vh);
  }
  const Tensor diag =
      eq(eye(n, -1, TensorOptions(A.dtype(), A.device())), ones({n, n}, TensorOptions(A.dtype(), A.device())));
  Shape ss = svd.S.shape();
  ss.insert(ss.end() - 1, n);
  const Tensor others = where(diag, ones_like(svd.S).unsqueeze(-2).expand(ss), svd.S.unsqueeze(-2).expand(ss));
  const Tensor p = prod(others, {-1}) * sign.unsqueeze(-1);
  return matmul(svd.U * p.unsqueeze(-2), svd.Vh);
}

// Per-matrix flags (1/0, batch-shaped) as a bool tensor [batch..., 1, 1] that broadcasts over the matrices.
Tensor matrix_mask(const std::vector<double>& flags, const Shape& batch, Device dev) {
  return ne(from_vector(flags, batch, TensorOptions(DType::f32, dev)), zeros(batch, TensorOptions(DType::f32, dev)))
      .unsqueeze(-1)
      .unsqueeze(-1);
}

struct CholeskyResult {
  Tensor L;
  std::vector<int32_t> info;
  Tensor info_tensor;
};

// The lower factor, recorded; info per matrix (0: factored).
CholeskyResult cholesky_lower(const Tensor& A) {
  const int64_t n = A.size(-1);
  const Shape batch = batch_of(A);
  CholeskyResult r;
  Tensor l = host_copy(A, A.shape());
  r.info.assign(size_t(batch.numel()), 0);
  cpu::cholesky(A.dtype(), batch.numel(), n, l.raw_data(), r.info.data());
  std::vector<double> iv(r.info.begin(), r.info.end());
  r.info_tensor = from_vector(iv, batch, TensorOptions(DType::i32, A.device()));
  {
    NoGradGuard ng;
    r.L = tril(l).to(A.device());  // a failed matrix: LAPACK's partial factor (kernels/linalg_lu.h)
  }
  if (autograd::needs_grad({A})) {
    const SavedTensor sl(r.L);
    autograd::record("linalg_cholesky", {A}, {r.L}, [sl](const GradCtx& c) -> std::vector<Tensor> {
      // PyTorch's cholesky_backward: Phi = tril(L^T gL), S = (Phi + tril(Phi, -1)^T) / 2, gA = L^-T S L^-1.
      const Tensor L = sl.unpack("linalg_cholesky");
      const Tensor phi = tril(matmul(mT(L), c.g()));
      const Tensor s = (phi + mT(tril(phi, -1))) * 0.5;
      const Tensor left = solve_triangular_left(mT(L), s, true, false);
      return {mT(solve_triangular_left(mT(L), mT(left), true, false))};  // (L^-T S) L^-1 = (L^-T (L^-T S)^T)^T
    });
  }
  return r;
}

void check_vector_or_matrix_rhs(const char* op, const Tensor& A, const Tensor& B, int64_t n, bool left) {
  check_float(op, "B", B);
  check_same_dtype(op, A, B);
  check_same_device(op, A, B);
  KILN_CHECK(B.dim() >= 2, op, ": B must have at least 2 dimensions, got shape ", B.shape());
  const int64_t got = left ? B.size(-2) : B.size(-1);
  KILN_CHECK(got == n, op, ": Incompatible shapes of A and B for the equation ", left ? "AX = B" : "XA = B", " (",
             A.size(-2), "x", A.size(-1), " and ", B.size(-2), "x", B.size(-1), ")");
}

}  // namespace

LUFactor linalg_lu_factor(const Tensor& A) {
  check_square("linalg.lu_factor", "A", A);
  const Shape batch = batch_of(A);
  HostLU f = host_lu(A, batch);
  for (size_t b = 0; b < f.info.size(); ++b)
    KILN_CHECK(f.info[b] == 0, "linalg.lu_factor: ", batch_prefix(A, int64_t(b)), "U[", f.info[b], ",", f.info[b],
               "] is zero and using it on lu_solve would result in a division by zero (A is singular)");
  LUFactor out{f.lu.to(A.device()), f.piv.to(A.device())};
  if (autograd::needs_grad({A})) {
    const SavedTensor slu(out.LU);
    const Tensor inverse_order = row_order(out.pivots, true, A.device());
    autograd::record("linalg_lu_factor", {A}, {out.LU}, [slu, inverse_order](const GradCtx& c) -> std::vector<Tensor> {
      // PyTorch's linalg_lu_backward (square): A = P L U, gA = P L^-T (tril(L^T gL, -1) + triu(gU U^T)) U^-T.
      const Tensor lu = slu.unpack("linalg_lu_factor");
      const Tensor L = tril(lu, -1) + identity_like(lu), U = triu(lu);
      const Tensor g = c.g();
      const Tensor phi = tril(matmul(mT(L), tril(g, -1)), -1) + triu(matmul(triu(g), mT(U)));
      const Tensor x = solve_triangular_left(mT(L), phi, true, true);
      const Tensor y = mT(solve_triangular_left(U, mT(x), true, false));  // x U^-T = (U^-1 x^T)^T
      return {take_rows(y, inverse_order)};
    });
  }
  return out;
}

Tensor linalg_lu_solve(const Tensor& LU, const Tensor& pivots, const Tensor& B, bool left, bool adjoint) {
  const OpScope scope("linalg.lu_solve");
  check_square("linalg.lu_solve", "LU", LU);
  KILN_CHECK(pivots.defined() && pivots.dtype() == DType::i32,
             "linalg.lu_solve: pivots should be a Tensor of dtype "
             "int32 (as linalg.lu_factor gives), got ",
             pivots.defined() ? dtype_name(pivots.dtype()) : "undefined");
  const int64_t n = LU.size(-1);
  KILN_CHECK(pivots.shape() == Shape(LU.shape().begin(), LU.shape().end() - 1),
             "linalg.lu_solve: Expected LU.shape[:-1] and pivots.shape to be the same, but got pivots with shape ",
             torch_shape(pivots.shape()), " instead (LU ", LU.shape(), ")");
  KILN_CHECK(pivots.device() == LU.device(),
             "linalg.lu_solve: Expected all tensors to be on the same device, but found LU on ", LU.device(),
             " and pivots on ", pivots.device());
  check_vector_or_matrix_rhs("linalg.lu_solve", LU, B, n, left);
  // X A = B is A^T X^T = B^T, and X A^T = B is A X^T = B^T.
  const Tensor rhs = left ? B : mT(B);
  const bool transposed = left == adjoint;  // the system solved is A^T Y = rhs
  const Tensor y = transposed ? lu_solve_adjoint(LU, row_order(pivots, true, LU.device()), rhs)
                              : lu_solve_left(LU, row_order(pivots, false, LU.device()), rhs);
  return left ? y : mT(y);
}

Tensor linalg_solve(const Tensor& A, const Tensor& B, bool left) {
  check_square("linalg.solve", "A", A);
  check_float("linalg.solve", "B", B);
  check_same_dtype("linalg.solve", A, B);
  check_same_device("linalg.solve", A, B);
  const int64_t n = A.size(-1);
  // B is a vector (or a batch of them) when 1-D, or when its shape is A's without the last dim (PyTorch's rule).
  const bool vector =
      B.dim() == 1 || (B.dim() == A.dim() - 1 && B.shape() == Shape(A.shape().begin(), A.shape().end() - 1));
  if (vector) {
    // A column: with left=false (X A = B) PyTorch refuses it, as here.
    KILN_CHECK(left && B.size(-1) == n, "linalg.solve: Incompatible shapes of A and B for the equation ",
               left ? "AX = B" : "XA = B", " (", A.size(-2), "x", A.size(-1), " and ", B.size(-1), "x1)");
    return solve_left(A, B.unsqueeze(-1)).squeeze(-1);
  }
  check_vector_or_matrix_rhs("linalg.solve", A, B, n, left);
  return left ? solve_left(A, B) : mT(solve_left(mT(A), mT(B)));
}

Tensor linalg_inv(const Tensor& A) {
  check_square("linalg.inv", "A", A);
  Tensor x;
  {
    NoGradGuard ng;
    const HostLU f = host_lu(A, batch_of(A));
    for (size_t b = 0; b < f.info.size(); ++b)
      KILN_CHECK(f.info[b] == 0, "linalg.inv: ", batch_prefix(A, int64_t(b)), "The diagonal element ", f.info[b],
                 " is zero, the inversion could not be completed because the input matrix is singular.");
    x = lu_solve_left(f.lu, row_order(f.piv, false, kCPU), identity_like(f.lu)).contiguous().to(A.device());
  }
  if (autograd::needs_grad({A})) {
    const SavedTensor sx(x);
    autograd::record("linalg_inv", {A}, {x}, [sx](const GradCtx& c) -> std::vector<Tensor> {
      // -A^-T G A^-T
      const Tensor xt = mT(sx.unpack("linalg_inv"));
      return {-matmul(matmul(xt, c.g()), xt)};
    });
  }
  return x;
}

Tensor linalg_det(const Tensor& A) {
  check_square("linalg.det", "A", A);
  const int64_t n = A.size(-1);
  const Shape batch = batch_of(A);
  const HostLU f = host_lu(A, batch);
  Tensor d = make_tensor(batch, A.dtype(), kCPU);
  std::vector<double> singular;
  if (A.dtype() == DType::f64) {
    det_from_lu<double>(f, n, d.data<double>(), nullptr, nullptr);
    singular = near_singular<double>(f, n);
  } else {
    det_from_lu<float>(f, n, d.data<float>(), nullptr, nullptr);
    singular = near_singular<float>(f, n);
  }
  d = d.to(A.device());
  if (autograd::needs_grad({A})) {
    const SavedTensor sa(A), sd(d);
    const size_t count = size_t(std::count(singular.begin(), singular.end(), 1.0));
    const Tensor mask = count == 0 || count == singular.size() ? Tensor() : matrix_mask(singular, batch, A.device());
    const bool all = count > 0 && count == singular.size();
    autograd::record("linalg_det", {A}, {d}, [sa, sd, mask, all](const GradCtx& c) -> std::vector<Tensor> {
      // G det A^-T where A is invertible; where it is numerically singular (per matrix, near_singular), G
      // times the adjugate's transpose from the SVD: finite, and its derivative right at rank n - 1.
      const Tensor a = sa.unpack("linalg_det"), det = sd.unpack("linalg_det");
      const Tensor g = c.g().unsqueeze(-1).unsqueeze(-1);
      if (a.size(-1) == 0) return {zeros_like(a)};
      if (all) return {g * det_grad_svd(a)};
      if (!mask.defined()) return {(g * det.unsqueeze(-1).unsqueeze(-1)) * mT(linalg_inv(a))};
      // A batch of both: each branch sees the identity in place of the other's matrices.
      const Tensor id = identity_like(a);
      const Tensor regular = det.unsqueeze(-1).unsqueeze(-1) * mT(linalg_inv(where(mask, id, a)));
      return {g * where(mask, det_grad_svd(where(mask, a, id)), regular)};
    });
  }
  return d;
}

SignLogAbsDet linalg_slogdet(const Tensor& A) {
  check_square("linalg.slogdet", "A", A);
  const int64_t n = A.size(-1);
  const Shape batch = batch_of(A);
  const HostLU f = host_lu(A, batch);
  Tensor s = make_tensor(batch, A.dtype(), kCPU), la = make_tensor(batch, A.dtype(), kCPU);
  if (A.dtype() == DType::f64)
    det_from_lu<double>(f, n, nullptr, s.data<double>(), la.data<double>());
  else
    det_from_lu<float>(f, n, nullptr, s.data<float>(), la.data<float>());
  SignLogAbsDet out{s.to(A.device()), la.to(A.device())};
  if (autograd::needs_grad({A})) {
    const SavedTensor sa(A);
    // Where U has an exact zero (det 0), A^-T from the LU factors as they are: inf/NaN entries, as
    // PyTorch's lu_solve gives, with no history (the other matrices keep theirs through linalg_inv).
    std::vector<double> singular(f.info.size(), 0.0);
    for (size_t b = 0; b < f.info.size(); ++b) singular[b] = f.info[b] != 0 ? 1.0 : 0.0;
    const bool any_singular = std::count(singular.begin(), singular.end(), 1.0) > 0;
    Tensor mask, at_zero;
    if (any_singular) {
      NoGradGuard ng;
      mask = matrix_mask(singular, batch, A.device());
      at_zero = lu_solve_adjoint(f.lu, row_order(f.piv, true, kCPU), identity_like(f.lu)).to(A.device());
    }
    autograd::record("linalg_slogdet", {A}, {out.sign, out.logabsdet},
                     [sa, mask, at_zero](const GradCtx& c) -> std::vector<Tensor> {
                       // The sign's gradient is zero; log|det A|'s is A^-T.
                       const Tensor a = sa.unpack("linalg_slogdet");
                       const Tensor g = c.g(1).unsqueeze(-1).unsqueeze(-1);
                       if (!mask.defined()) return {g * mT(linalg_inv(a))};
                       return {g * where(mask, at_zero, mT(linalg_inv(where(mask, identity_like(a), a))))};
                     });
  }
  return out;
}

Tensor logdet(const Tensor& A) {
  const OpScope scope("logdet");
  const SignLogAbsDet s = linalg_slogdet(A);
  // log det: NaN where det < 0, -inf where it is 0 (PyTorch's).
  return where(lt(s.sign, zeros_like(s.sign)), full_like(s.logabsdet, std::nan("")), s.logabsdet);
}

CholeskyEx linalg_cholesky_ex(const Tensor& A, bool upper) {
  check_square("linalg.cholesky_ex", "A", A);
  // upper reads A's upper triangle: the lower one of A^T, whose factor's transpose is U (LAPACK's 'U').
  CholeskyResult r = cholesky_lower(upper ? mT(A) : A);
  return {upper ? mT(r.L).contiguous() : r.L, r.info_tensor};
}

Tensor linalg_cholesky(const Tensor& A, bool upper) {
  check_square("linalg.cholesky", "A", A);
  CholeskyResult r = cholesky_lower(upper ? mT(A) : A);
  for (size_t b = 0; b < r.info.size(); ++b)
    KILN_CHECK(r.info[b] == 0, "linalg.cholesky: ", batch_prefix(A, int64_t(b)),
               "The factorization could not be completed because the input is not positive-definite (the leading "
               "minor of order ",
               r.info[b], " is not positive-definite).");
  return upper ? mT(r.L).contiguous() : r.L;
}

Tensor cholesky_solve(const Tensor& B, const Tensor& L, bool upper) {
  const OpScope scope("cholesky_solve");
  check_square("cholesky_solve", "L", L);
  check_vector_or_matrix_rhs("cholesky_solve", L, B, L.size(-1), true);
  // A = L L^T (or U^T U): X = L^-T L^-1 B.
  const Tensor lower = upper ? mT(L) : L;
  const Tensor y = solve_triangular_left(lower, B, false, false);
  return solve_triangular_left(mT(lower), y, true, false);
}

Tensor cholesky_inverse(const Tensor& L, bool upper) {
  const OpScope scope("cholesky_inverse");
  check_square("cholesky_inverse", "L", L);
  return cholesky_solve(identity_like(L), L, upper);
}

Tensor linalg_solve_triangular(const Tensor& A, const Tensor& B, bool upper, bool left, bool unitriangular) {
  check_square("linalg.solve_triangular", "A", A);
  check_vector_or_matrix_rhs("linalg.solve_triangular", A, B, A.size(-1), left);
  // X A = B is A^T X^T = B^T, A^T triangular the other way.
  return left ? solve_triangular_left(A, B, upper, unitriangular)
              : mT(solve_triangular_left(mT(A), mT(B), !upper, unitriangular));
}

}  // namespace kiln
