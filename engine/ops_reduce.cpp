// Reductions: each becomes one kernel call over a contiguous [outer, r, inner] block; reduced
// dims that are not one block of a contiguous tensor are permuted to the end first.
#include <algorithm>
#include <cmath>
#include <limits>

#include "engine/autograd.h"
#include "engine/internal.h"
#include "engine/ops.h"

namespace kiln {
namespace {

struct Plan {
  Tensor src;  // contiguous, no autograd
  int64_t outer = 1, r = 1, inner = 1;
  Shape keep_shape;  // input shape with reduced dims set to 1
  Shape out_shape;   // keep_shape, or with those dims removed
};

// The elements of each slice a reduction over dims_in reads (plan_reduce's r, without its copy).
int64_t slice_count(const Tensor& a, const std::vector<int64_t>& dims_in, const char* op) {
  if (a.dim() == 0) return 1;
  const std::vector<int64_t> dims = detail::normalize_dims(dims_in, a.dim(), op);
  if (dims.empty()) return a.numel();
  int64_t r = 1;
  for (int64_t d : dims) r *= a.size(d);
  return r;
}

Plan plan_reduce(const Tensor& a, const std::vector<int64_t>& dims_in, bool keepdim, const char* op) {
  Plan p;
  const int64_t nd = a.dim();
  std::vector<int64_t> dims = detail::normalize_dims(dims_in, nd, op);
  if (nd == 0) dims.clear();  // a 0-dim tensor accepts dim 0 / -1 and reduces over nothing
  if (dims.empty())
    for (int64_t i = 0; i < nd; ++i) dims.push_back(i);
  std::vector<bool> red(size_t(nd), false);
  for (int64_t d : dims) red[size_t(d)] = true;
  for (int64_t i = 0; i < nd; ++i) {
    p.keep_shape.push_back(red[size_t(i)] ? 1 : a.shape()[size_t(i)]);
    if (!red[size_t(i)] || keepdim) p.out_shape.push_back(p.keep_shape.back());
  }
  const Tensor x = a.detach();
  const bool block = dims.empty() || dims.back() - dims.front() + 1 == int64_t(dims.size());
  if (x.is_contiguous() && block) {
    p.src = x;
    if (!dims.empty()) {
      for (int64_t i = 0; i < dims.front(); ++i) p.outer *= a.shape()[size_t(i)];
      for (int64_t d : dims) p.r *= a.shape()[size_t(d)];
      for (int64_t i = dims.back() + 1; i < nd; ++i) p.inner *= a.shape()[size_t(i)];
    } else {
      p.outer = a.numel();
    }
    return p;
  }
  std::vector<int64_t> perm;
  for (int64_t i = 0; i < nd; ++i)
    if (!red[size_t(i)]) {
      perm.push_back(i);
      p.outer *= a.shape()[size_t(i)];
    }
  for (int64_t d : dims) {
    perm.push_back(d);
    p.r *= a.shape()[size_t(d)];
  }
  p.src = x.permute(perm).contiguous();
  return p;
}

Tensor run_reduce(ReduceOp op, const Plan& p, DType out_dtype) {
  Tensor out = make_tensor(p.out_shape, out_dtype, p.src.device());
  detail::backend(p.src.device()).reduce(op, out.raw_data(), out_dtype, p.src.raw_data(), p.src.dtype(), p.outer, p.r,
                                         p.inner);
  return out;
}

// The gradient of a reduction output, shaped back to the input's rank (reduced dims of size 1).
Tensor unsqueeze_grad(const Tensor& g, const Shape& keep_shape) { return g.reshape(keep_shape); }

// The composite reductions (mean, var, norm, logsumexp) run on a floating x in f32 at least, as
// PyTorch accumulates them: a 16-bit sum of squares or a 16-bit sum before a mean's division
// overflows (f16 var of [0, 200] * 5 was inf) or drops bits. `f` gets x widened; its result is
// rounded back to x's dtype once.
template <typename F> Tensor in_f32_at_least(const Tensor& x, F&& f) {
  if (!is_low_precision(x.dtype())) return f(x);
  return cast(f(cast(x, DType::f32)), x.dtype());
}

}  // namespace

Tensor sum(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim) {
  Plan p = plan_reduce(a, dims, keepdim, "sum");
  const DType out_dtype = is_floating(a.dtype()) ? a.dtype() : DType::i64;
  Tensor out = run_reduce(ReduceOp::sum, p, out_dtype);
  if (autograd::needs_grad({a})) {
    const Shape keep = p.keep_shape, in_shape = a.shape();
    autograd::record("sum", {a}, {out}, [keep, in_shape](const GradCtx& c) -> std::vector<Tensor> {
      return {unsqueeze_grad(c.g(), keep).expand(in_shape)};
    });
  }
  return out;
}

Tensor mean(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim) {
  const Tensor x = is_floating(a.dtype()) ? a : a.to(DType::f32);
  const Plan p = plan_reduce(a, dims, keepdim, "mean");
  return in_f32_at_least(
      x, [&](const Tensor& xw) { return sum(xw, dims, keepdim) * (1.0 / double(std::max<int64_t>(p.r, 0))); });
}

Tensor var(const Tensor& a, const std::vector<int64_t>& dims, int64_t correction, bool keepdim) {
  KILN_CHECK(correction >= 0, "var: correction must be >= 0, got ", correction);
  const Tensor x = is_floating(a.dtype()) ? a : a.to(DType::f32);
  const Plan p = plan_reduce(a, dims, keepdim, "var");
  return in_f32_at_least(x, [&](const Tensor& xw) {
    const Tensor d = xw - mean(xw, dims, true);
    // As PyTorch: no more elements than the correction divides by 0 (inf, or NaN where the sum is 0), never by a
    // negative count.
    return sum(d * d, dims, keepdim) / double(std::max<int64_t>(p.r - correction, 0));
  });
}

namespace {

Tensor extreme_all(const char* name, ReduceOp op, const Tensor& a, const std::vector<int64_t>& dims, bool keepdim) {
  Plan p = plan_reduce(a, dims, keepdim, name);
  // Nothing to compare is an error, as PyTorch's amax/amin (and max/min over a dim): no result would
  // be one of the slice's values.
  KILN_CHECK(p.r > 0, name, ": cannot reduce over an empty dim of ", a.shape(),
             " (the slice has no elements to take the ", op == ReduceOp::max ? "largest" : "smallest", " of)");
  Tensor out = run_reduce(op, p, a.dtype());
  if (autograd::needs_grad({a})) {
    SavedTensor sa(a), so(out);
    const Shape keep = p.keep_shape;
    const std::vector<int64_t> d = dims;
    autograd::record(name, {a}, {out}, [sa, so, keep, d, name](const GradCtx& c) -> std::vector<Tensor> {
      const Tensor x = sa.unpack(name);
      const Tensor mask = cast(eq(x, unsqueeze_grad(so.unpack(name), keep)), c.g().dtype());
      const Tensor count = sum(mask, d, true);
      return {mask * (unsqueeze_grad(c.g(), keep) / count)};
    });
  }
  return out;
}

ValuesIndices extreme_dim(const char* name, bool is_max, const Tensor& a, int64_t dim, bool keepdim) {
  const int64_t d = wrap_dim(dim, a.dim(), name);
  Plan p = plan_reduce(a, {d}, keepdim, name);
  KILN_CHECK(p.r > 0, name, ": cannot reduce over an empty dim of ", a.shape());
  ValuesIndices vi;
  vi.values = run_reduce(is_max ? ReduceOp::max : ReduceOp::min, p, a.dtype());
  vi.indices = run_reduce(is_max ? ReduceOp::argmax : ReduceOp::argmin, p, DType::i64);
  if (autograd::needs_grad({a})) {
    const Shape keep = p.keep_shape, in_shape = a.shape();
    const Tensor idx = vi.indices.detach();
    const int64_t n = a.dim() == 0 ? 1 : a.shape()[size_t(d)];
    const int64_t nd = a.dim();
    autograd::record(name, {a}, {vi.values}, [=](const GradCtx& c) -> std::vector<Tensor> {
      Shape iota_shape(static_cast<size_t>(nd), 1);
      if (nd > 0) iota_shape[size_t(d)] = n;
      const Tensor iota = arange(n, TensorOptions(DType::i64, c.g().device())).reshape(iota_shape);
      const Tensor hit = eq(iota, idx.reshape(keep));
      const Tensor g = unsqueeze_grad(c.g(), keep).expand(in_shape);
      return {where(hit, g, zeros_like(g))};
    });
  }
  return vi;
}

}  // namespace

Tensor amax(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim) {
  return extreme_all("amax", ReduceOp::max, a, dims, keepdim);
}
Tensor amin(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim) {
  return extreme_all("amin", ReduceOp::min, a, dims, keepdim);
}
ValuesIndices max(const Tensor& a, int64_t dim, bool keepdim) { return extreme_dim("max", true, a, dim, keepdim); }
ValuesIndices min(const Tensor& a, int64_t dim, bool keepdim) { return extreme_dim("min", false, a, dim, keepdim); }

Tensor argmax(const Tensor& a, int64_t dim, bool keepdim) {
  const int64_t d = wrap_dim(dim, a.dim(), "argmax");
  Plan p = plan_reduce(a, {d}, keepdim, "argmax");
  KILN_CHECK(p.r > 0, "argmax: cannot reduce over an empty dim of ", a.shape());
  return run_reduce(ReduceOp::argmax, p, DType::i64);
}
Tensor argmin(const Tensor& a, int64_t dim, bool keepdim) {
  const int64_t d = wrap_dim(dim, a.dim(), "argmin");
  Plan p = plan_reduce(a, {d}, keepdim, "argmin");
  KILN_CHECK(p.r > 0, "argmin: cannot reduce over an empty dim of ", a.shape());
  return run_reduce(ReduceOp::argmin, p, DType::i64);
}
Tensor argmax(const Tensor& a) { return argmax(a.detach().reshape({-1}), 0); }

Tensor logsumexp(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim) {
  if (is_low_precision(a.dtype()))
    return in_f32_at_least(a, [&](const Tensor& xw) { return logsumexp(xw, dims, keepdim); });
  const Tensor x = is_floating(a.dtype()) ? a : a.to(DType::f32);
  // The shift only steadies the exponentials (it cancels): no gradient through it. A slice whose
  // maximum is not finite shifts by 0 (all -inf: log(0) = -inf; +inf or NaN: inf/NaN as arithmetic says).
  // (An empty slice has no maximum: shift 0, and its sum of exponentials 0 gives -inf.)
  const Tensor m = slice_count(x, dims, "logsumexp") == 0
                       ? zeros(plan_reduce(x, dims, true, "logsumexp").keep_shape, TensorOptions(x.dtype(), x.device()))
                       : amax(x.detach(), dims, true);
  const Tensor shift = where(isfinite(m), m, zeros_like(m));
  const Tensor out = log(sum(exp(x - shift), dims, true)) + shift;
  if (keepdim) return out;
  const Plan p = plan_reduce(a, dims, false, "logsumexp");
  return out.reshape(p.out_shape);
}

Tensor norm(const Tensor& a, double p, const std::vector<int64_t>& dims, bool keepdim) {
  KILN_CHECK(!std::isnan(p) && (p > 0 || p == 0 || std::isinf(p)), "norm: p must be > 0, 0 or +-inf, got ", p);
  if (is_low_precision(a.dtype()) && !std::isinf(p) && p != 0)  // sums of powers: f16 300^2 overflowed
    return in_f32_at_least(a, [&](const Tensor& xw) { return norm(xw, p, dims, keepdim); });
  const Tensor x = is_floating(a.dtype()) ? a : a.to(DType::f32);
  if (std::isinf(p)) {
    KILN_CHECK(slice_count(x, dims, "norm") > 0, "norm: the ", p > 0 ? "inf" : "-inf", " norm of an empty slice of ",
               a.shape(), " has no value (no maximum), as PyTorch's refuses");
    return p > 0 ? amax(abs(x), dims, keepdim) : amin(abs(x), dims, keepdim);
  }
  if (p == 0) {
    // The number of non-zeros: piecewise constant, so its gradient is zeros, but the result stays in
    // the graph (requires_grad), as PyTorch's.
    const Tensor out = cast(sum(ne(x.detach(), scalar_like(0, x)), dims, keepdim), x.dtype());
    if (autograd::needs_grad({x})) {
      const Shape in_shape = x.shape();
      autograd::record("norm", {x}, {out}, [in_shape](const GradCtx& c) -> std::vector<Tensor> {
        return {zeros(in_shape, TensorOptions(c.g().dtype(), c.g().device()))};
      });
    }
    return out;
  }
  if (p == 1) return sum(abs(x), dims, keepdim);
  if (p == 2) {
    // sqrt(sum(x^2)) with the gradient x / norm, and 0 where the norm is 0 (sqrt's inf would make NaN).
    Tensor out;
    {
      NoGradGuard ng;
      out = sqrt(sum(x * x, dims, keepdim));
    }
    if (autograd::needs_grad({x})) {
      SavedTensor sx(x), so(out);
      const Plan pl = plan_reduce(a, dims, keepdim, "norm");
      const Shape keep = pl.keep_shape;
      autograd::record("norm", {x}, {out}, [sx, so, keep](const GradCtx& c) -> std::vector<Tensor> {
        const Tensor xs = sx.unpack("norm"), n = so.unpack("norm").reshape(keep), g = c.g().reshape(keep);
        const Tensor zero = eq(n, scalar_like(0, n));
        return {where(zero, zeros_like(xs), xs * (g / where(zero, ones_like(n), n)))};
      });
    }
    return out;
  }
  // Any other p: sum(|x|^p)^(1/p), with torch's gradient, which is 0 (not NaN) where the norm is 0 and, for
  // p < 1, at zero elements (|x|^(p-1) is inf there): sgn(x) |x|^(p-1) g / norm^(p-1).
  Tensor out;
  {
    NoGradGuard ng;
    out = pow(sum(pow(abs(x), p), dims, keepdim), 1.0 / p);
  }
  if (autograd::needs_grad({x})) {
    SavedTensor sx(x), so(out);
    const Shape keep = plan_reduce(a, dims, keepdim, "norm").keep_shape;
    autograd::record("norm", {x}, {out}, [sx, so, keep, p](const GradCtx& c) -> std::vector<Tensor> {
      const Tensor xs = sx.unpack("norm"), n = so.unpack("norm").reshape(keep), g = c.g().reshape(keep);
      if (p < 1) {
        const Tensor at_zero = eq(xs, scalar_like(0, xs));
        const Tensor scaled = sign(xs) * where(at_zero, zeros_like(xs), pow(abs(xs), p - 1));
        return {scaled * (g * pow(n, 1 - p))};
      }
      const Tensor scaled = p < 2 ? sign(xs) * pow(abs(xs), p - 1) : xs * pow(abs(xs), p - 2);
      const Tensor zero = eq(n, scalar_like(0, n));
      return {scaled * where(zero, zeros_like(n), g / where(zero, ones_like(n), pow(n, p - 1)))};
    });
  }
  return out;
}

Tensor any(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim) {
  return gt(sum(ne(a.detach(), scalar_like(0, a)), dims, keepdim), scalar_like(0, a).to(DType::i64));
}
Tensor all(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim) {
  return eq(sum(eq(a.detach(), scalar_like(0, a)), dims, keepdim), scalar_like(0, a).to(DType::i64));
}
Tensor count_nonzero(const Tensor& a, const std::vector<int64_t>& dims) {
  return sum(ne(a.detach(), scalar_like(0, a)), dims, false);
}

Tensor sum_to(const Tensor& a, const Shape& shape) {
  if (a.shape() == shape) return a;
  const int64_t lead = a.dim() - int64_t(shape.size());
  KILN_CHECK(lead >= 0, "sum_to: cannot sum ", a.shape(), " to the larger rank of ", shape);
  std::vector<int64_t> dims;
  for (int64_t i = 0; i < a.dim(); ++i) {
    if (i < lead) {
      dims.push_back(i);
    } else {
      const int64_t want = shape[size_t(i - lead)];
      const int64_t have = a.shape()[size_t(i)];
      KILN_CHECK(want == have || want == 1, "sum_to: cannot sum ", a.shape(), " to ", shape);
      if (want == 1 && have != 1) dims.push_back(i);
    }
  }
  if (dims.empty()) return a.reshape(shape);
  return sum(a, dims, true).reshape(shape);
}

}  // namespace kiln
