// torch.linalg's spectral decompositions (eigh, eigvalsh, svd, svdvals, qr) over Eigen on the host
// (kernels/linalg_spectral.h): a CUDA tensor is copied to the host, decomposed and its results copied
// back. Backwards are torch's formulas (FunctionsManual.cpp: linalg_eig_backward, svd_backward,
// linalg_qr_backward) written with engine ops, so a backward under create_graph records its own graph.
#include <string>

#include "engine/autograd.h"
#include "engine/internal.h"
#include "engine/nn_ops.h"
#include "engine/ops.h"
#include "kernels/linalg_spectral.h"

namespace kiln {
namespace {

// The checks torch makes: at least 2 dims, f32 or f64 (its CPU kernels refuse 16-bit and integers),
// square where `square`.
void check_input(const char* op, const Tensor& a, bool square) {
  KILN_CHECK(a.defined(), "linalg.", op, ": the input is an undefined tensor");
  KILN_CHECK(a.dim() >= 2, "linalg.", op, ": The input tensor A must have at least 2 dimensions, got ", a.shape());
  KILN_CHECK(a.dtype() == DType::f32 || a.dtype() == DType::f64, "linalg.", op, ": ", a.type_str(),
             ": only float32 and float64 tensors are supported (torch's CPU kernels refuse 16-bit and integer "
             "ones too)");
  KILN_CHECK(!square || a.size(-1) == a.size(-2), "linalg.", op,
             ": A must be batches of square matrices, but they are ", a.size(-2), " by ", a.size(-1), " matrices");
}

// The input as the kernels read it: detached, on the host, contiguous (a meta tensor stays one: shapes only).
Tensor host_copy(const Tensor& a) {
  Tensor x = a.detach();
  if (!x.device().is_cpu() && !x.device().is_meta()) x = x.to(kCPU);
  return x.contiguous();
}

// Where the results are made: the host, or meta for a meta input.
Device work_device(const Tensor& a) { return a.device().is_meta() ? a.device() : kCPU; }

// A host result moved where the input lives.
Tensor to_device_of(const Tensor& t, const Tensor& like) {
  return t.device() == like.device() ? t : t.to(like.device());
}

Shape with_tail(const Tensor& a, std::initializer_list<int64_t> tail) {
  Shape s(a.shape().begin(), a.shape().end() - 2);
  s.insert(s.end(), tail);
  return s;
}

int64_t batch_of(const Tensor& a) { return Shape(a.shape().begin(), a.shape().end() - 2).numel(); }

Tensor mT(const Tensor& t) { return t.transpose(-1, -2); }

Tensor eye_like(int64_t n, const Tensor& like) { return eye(n, -1, TensorOptions(like.dtype(), like.device())); }

// Whether output i of the op was reached by a gradient (GradCtx::reached null: all were).
bool reached(const GradCtx& c, size_t i) { return !c.reached || (*c.reached)[i]; }

// R^-1 for an upper triangular R (its strict lower part unread): QR's backward solves with R^T through it.
// Recorded, so a second derivative through QR's backward has it: d(R^-1) = -R^-1 dR R^-1, on the upper triangle.
Tensor upper_triangular_inverse(const Tensor& r) {
  const Tensor x = host_copy(r);
  Tensor out = make_tensor(x.shape(), x.dtype(), work_device(r));
  if (!r.device().is_meta() && x.numel() > 0)
    spectral::upper_triangular_inverse(x.dtype(), batch_of(x), x.size(-1), x.raw_data(), out.raw_data());
  out = to_device_of(out, r);
  if (autograd::needs_grad({r})) {
    SavedTensor so(out);
    autograd::record("linalg_qr_triangular_inverse", {r}, {out}, [so](const GradCtx& c) -> std::vector<Tensor> {
      const Tensor ri = so.unpack("linalg_qr_triangular_inverse");
      return {triu(-matmul(matmul(mT(ri), c.g()), mT(ri)))};
    });
  }
  return out;
}

}  // namespace

EighResult linalg_eigh(const Tensor& a, bool upper) {
  const OpScope scope("linalg.eigh");
  check_input("eigh", a, true);
  const int64_t n = a.size(-1);
  const Tensor x = host_copy(a);
  Tensor w = make_tensor(with_tail(a, {n}), a.dtype(), work_device(a)),
         v = make_tensor(a.shape(), a.dtype(), work_device(a));
  if (!a.device().is_meta() && x.numel() > 0) {
    const std::string err = spectral::eigh(x.dtype(), batch_of(x), n, x.raw_data(), upper, w.raw_data(), v.raw_data());
    KILN_CHECK(err.empty(), "linalg.eigh: ", err);
  }
  w = to_device_of(w, a);
  v = to_device_of(v, a);
  if (autograd::needs_grad({a})) {
    SavedTensor sw(w), sv(v);
    // torch's linalg_eig_backward (hermitian): gA = V (skew(V^T gV) / E + diag(gL)) V^T with E_ij = L_j - L_i
    // (1 on the diagonal, where skew(.) is 0); gL alone (eigvalsh): V diag(gL) V^T.
    autograd::record("linalg_eigh", {a}, {w, v}, [sw, sv](const GradCtx& c) -> std::vector<Tensor> {
      const Tensor L = sw.unpack("linalg_eigh"), V = sv.unpack("linalg_eigh");
      if (!reached(c, 1)) return {matmul(V * c.g(0).unsqueeze(-2), mT(V))};
      const Tensor VtgV = matmul(mT(V), c.g(1));
      const Tensor I = eye_like(L.size(-1), L);
      Tensor inner = (VtgV - mT(VtgV)) * 0.5 / (L.unsqueeze(-2) - L.unsqueeze(-1) + I);
      if (reached(c, 0)) inner = inner + c.g(0).unsqueeze(-1) * I;
      return {matmul(matmul(V, inner), mT(V))};
    });
  }
  return {w, v};
}

Tensor linalg_eigvalsh(const Tensor& a, bool upper) {
  // The eigenvectors are computed (and kept for backward) as torch's eigvalsh does when A needs a gradient.
  const OpScope scope("linalg.eigvalsh");
  check_input("eigvalsh", a, true);
  return linalg_eigh(a, upper).eigenvalues;
}

SvdResult linalg_svd(const Tensor& a, bool full_matrices) {
  const OpScope scope("linalg.svd");
  check_input("svd", a, false);
  const int64_t m = a.size(-2), n = a.size(-1), k = std::min(m, n);
  const Tensor x = host_copy(a);
  const int64_t uc = full_matrices ? m : k, vr = full_matrices ? n : k;
  Tensor u = make_tensor(with_tail(a, {m, uc}), a.dtype(), work_device(a)),
         s = make_tensor(with_tail(a, {k}), a.dtype(), work_device(a)),
         vh = make_tensor(with_tail(a, {vr, n}), a.dtype(), work_device(a));
  if (!a.device().is_meta()) {
    if (x.numel() > 0) {
      const std::string err = spectral::svd(x.dtype(), batch_of(x), m, n, x.raw_data(), full_matrices, u.raw_data(),
                                            s.raw_data(), vh.raw_data());
      KILN_CHECK(err.empty(), "linalg.svd: ", err);
    } else if (full_matrices) {  // an empty matrix: the square factors are identities, as torch's
      u = eye(m, -1, TensorOptions(a.dtype())).expand(u.shape()).contiguous();
      vh = eye(n, -1, TensorOptions(a.dtype())).expand(vh.shape()).contiguous();
    }
  }
  u = to_device_of(u, a);
  s = to_device_of(s, a);
  vh = to_device_of(vh, a);
  if (autograd::needs_grad({a})) {
    SavedTensor su(u), ss(s), svh(vh);
    autograd::record("linalg_svd", {a}, {u, s, vh},
                     [su, ss, svh, m, n, k, full_matrices](const GradCtx& c) -> std::vector<Tensor> {
                       // torch's svd_backward for real inputs (the gauge-invariant case).
                       Tensor U = su.unpack("linalg_svd"), S = ss.unpack("linalg_svd"), Vh = svh.unpack("linalg_svd");
                       const bool gu = reached(c, 0), gs = reached(c, 1), gv = reached(c, 2);
                       Tensor gU = gu ? c.g(0) : Tensor(), gVh = gv ? c.g(2) : Tensor();
                       if (full_matrices) {
                         U = U.narrow(-1, 0, k);
                         Vh = Vh.narrow(-2, 0, k);
                         if (gu) gU = gU.narrow(-1, 0, k);
                         if (gv) gVh = gVh.narrow(-2, 0, k);
                       }
                       if (!gu && !gv) {
                         if (!gs) return {Tensor()};
                         return {m >= n ? matmul(U, c.g(1).unsqueeze(-1) * Vh) : matmul(U * c.g(1).unsqueeze(-2), Vh)};
                       }
                       const Tensor V = mT(Vh), gV = gv ? mT(gVh) : Tensor();
                       const Tensor I = eye_like(k, S);
                       const Tensor S2 = S * S, E = S2.unsqueeze(-2) - S2.unsqueeze(-1) + I;
                       Tensor UtgU, VtgV;
                       if (gu) {
                         const Tensor p = matmul(mT(U), gU);
                         UtgU = p - mT(p);
                       }
                       if (gv) {
                         const Tensor p = matmul(Vh, gV);
                         VtgV = p - mT(p);
                       }
                       Tensor gA = gu && gv ? (UtgU * S.unsqueeze(-2) + S.unsqueeze(-1) * VtgV) / E
                                   : gu     ? (UtgU / E) * S.unsqueeze(-2)
                                            : S.unsqueeze(-1) * (VtgV / E);
                       if (gs) gA = gA + c.g(1).unsqueeze(-1) * I;
                       if (m > k && gu) {
                         gA = matmul(U, gA);
                         const Tensor gUSinv = gU / S.unsqueeze(-2);
                         gA = gA + gUSinv - matmul(U, matmul(mT(U), gUSinv));
                         return {matmul(gA, Vh)};
                       }
                       if (n > k && gv) {
                         gA = matmul(gA, Vh);
                         const Tensor gVSinv = gV / S.unsqueeze(-2);
                         gA = gA + mT(gVSinv) - matmul(matmul(mT(gVSinv), V), Vh);
                         return {matmul(U, gA)};
                       }
                       return {m >= n ? matmul(U, matmul(gA, Vh)) : matmul(matmul(U, gA), Vh)};
                     });
  }
  return {u, s, vh};
}

Tensor linalg_svdvals(const Tensor& a) {
  // The vectors are computed (and kept for backward) as torch's svdvals does when A needs a gradient.
  const OpScope scope("linalg.svdvals");
  check_input("svdvals", a, false);
  return linalg_svd(a, false).S;
}

QrResult linalg_qr(const Tensor& a, QrMode mode) {
  const OpScope scope("linalg.qr");
  check_input("qr", a, false);
  const int64_t m = a.size(-2), n = a.size(-1), k = std::min(m, n);
  const bool complete = mode == QrMode::complete, want_q = mode != QrMode::r;
  const Tensor x = host_copy(a);
  const int64_t qc = complete ? m : k, rr = complete ? m : k;
  Tensor q = want_q ? make_tensor(with_tail(a, {m, qc}), a.dtype(), work_device(a))
                    : zeros({0}, TensorOptions(a.dtype(), work_device(a)));
  Tensor r = make_tensor(with_tail(a, {rr, n}), a.dtype(), work_device(a));
  if (!a.device().is_meta()) {
    if (x.numel() > 0) {
      spectral::qr(x.dtype(), batch_of(x), m, n, x.raw_data(), complete, want_q ? q.raw_data() : nullptr, r.raw_data());
    } else {  // an empty matrix: R is zeros, a complete Q the identity
      r = zeros(r.shape(), TensorOptions(a.dtype()));
      if (want_q) q = eye(m, qc, TensorOptions(a.dtype())).expand(q.shape()).contiguous();
    }
  }
  q = to_device_of(q, a);
  r = to_device_of(r, a);
  if (autograd::needs_grad({a})) {
    SavedTensor sq(q), sr(r);
    autograd::record(
        "linalg_qr", {a}, {q, r}, [sq, sr, m, n, want_q, complete](const GradCtx& c) -> std::vector<Tensor> {
          // torch's linalg_qr_backward for m >= n: gA = (Q syminvadj(triu(gR R^T - Q^T gQ)) + gQ) R^-T.
          KILN_CHECK(want_q,
                     "linalg.qr: The derivative of linalg.qr depends on Q, which is not computed when mode='r'. "
                     "Please use linalg.qr(A, mode='reduced') if you are going to differentiate through linalg.qr.");
          KILN_CHECK(!complete || m <= n,
                     "linalg.qr: The QR decomposition is not differentiable when mode='complete' and nrows > ncols.");
          KILN_CHECK(m >= n, "linalg.qr: the derivative for a wide input (", m, " < ", n,
                     " columns) is not implemented in Kiln (torch's m < n case); only m >= n");
          const Tensor Q = sq.unpack("linalg_qr"), R = sr.unpack("linalg_qr");
          const bool gq = reached(c, 0), gr = reached(c, 1);
          Tensor M;
          if (gr) M = matmul(c.g(1), mT(R));
          if (gq) M = M.defined() ? M - matmul(mT(Q), c.g(0)) : -matmul(mT(Q), c.g(0));
          if (!M.defined()) return {Tensor()};
          // syminvadj(triu(M)): triu(M) + triu(M)^T with the diagonal once.
          Tensor b = matmul(Q, triu(M) + mT(triu(M, 1)));
          if (gq) b = b + c.g(0);
          return {matmul(b, mT(upper_triangular_inverse(R)))};
        });
  }
  return {q, r};
}

}  // namespace kiln
