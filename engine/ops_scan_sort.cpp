// Scans and sorting along one dim: cumsum, cumprod, cummax/cummin, prod; sort, argsort, topk,
// kthvalue, median; stddev. The kernels see a contiguous [outer, n, inner] block; values that sorting
// or an extreme picks are gathered from the input, so their gradient is gather's.
#include <algorithm>
#include <limits>

#include "engine/autograd.h"
#include "engine/internal.h"
#include "engine/nn_ops.h"
#include "engine/ops.h"

namespace kiln {
namespace {

// x as a contiguous [outer, n, inner] block around dim, in a dtype the kernels take (f32, f64, i32,
// i64): 16-bit floats go to f32, bool, u8, i8 and i16 to i32 (all exact).
struct Columns {
  Tensor src;
  int64_t dim = 0, outer = 1, n = 1, inner = 1;
};
DType kernel_dtype(DType t) {
  switch (t) {
    case DType::f16:
    case DType::bf16: return DType::f32;
    case DType::boolean:
    case DType::u8:
    case DType::i8:
    case DType::i16: return DType::i32;
    default: return t;
  }
}
Columns columns(const Tensor& x, int64_t dim, const char* op) {
  Columns c;
  const int64_t nd = std::max<int64_t>(x.dim(), 1);
  c.dim = wrap_dim(dim, nd, op);
  Tensor t = x.detach();
  if (x.dim() == 0) t = t.reshape({1});
  t = t.to(kernel_dtype(t.dtype())).contiguous();
  for (int64_t i = 0; i < c.dim; ++i) c.outer *= t.size(i);
  c.n = t.size(c.dim);
  for (int64_t i = c.dim + 1; i < t.dim(); ++i) c.inner *= t.size(i);
  c.src = t;
  return c;
}

// The kernel's positions (i64, x's shape; a 0-dim x gives a 0-dim result).
Tensor positions_like(const Tensor& x, const Columns& c) {
  return make_tensor(x.dim() == 0 ? Shape{1} : x.shape(), DType::i64, x.device());
}

Tensor scan_values(ScanOp op, const Tensor& x, const Columns& c, Tensor* idx) {
  Tensor y = make_tensor(c.src.shape(), c.src.dtype(), x.device());
  if (idx) *idx = positions_like(x, c);
  detail::backend(x.device())
      .scan(op, c.src.dtype(), c.outer, c.n, c.inner, c.src.raw_data(), y.raw_data(),
            idx ? idx->data<int64_t>() : nullptr);
  return y;
}

ValuesIndices running_extreme(const char* name, ScanOp op, const Tensor& x, int64_t dim) {
  const Columns c = columns(x, dim, name);
  Tensor idx;
  scan_values(op, x, c, &idx);
  if (x.dim() == 0) idx = idx.reshape({});
  // The values are the picked elements: gather's gradient sends each one back to its source.
  return {x.dim() == 0 ? x.clone() : gather(x, c.dim, idx), idx};
}

Tensor sorted_positions(const char* name, const Tensor& x, int64_t dim, bool descending, Columns* out = nullptr) {
  const Columns c = columns(x, dim, name);
  Tensor idx = positions_like(x, c);
  detail::backend(x.device())
      .argsort(c.src.dtype(), c.outer, c.n, c.inner, c.src.raw_data(), descending, idx.data<int64_t>());
  if (out) *out = c;
  return x.dim() == 0 ? idx.reshape({}) : idx;
}

// cumprod's gradient from recorded ops, for a backward with create_graph (so that it is differentiable
// again). Without zeros in x: the reversed running sum of g * y, divided by x. With zeros, where that
// divides by zero, PyTorch's exact form: each position's sum over the later outputs of g times the
// product of the others (O(n^2) ops, only here).
Tensor cumprod_backward_recorded(const Tensor& g, const Tensor& x, int64_t d) {
  if (x.dim() == 0 || x.size(d) <= 1) return g;
  const int64_t n = x.size(d);
  if (!any(eq(x, zeros({}, TensorOptions(x.dtype(), x.device())))).item<bool>())
    return flip(cumsum(flip(g * cumprod(x, d), {d}), d), {d}) / x;
  Shape one = x.shape();
  one[size_t(d)] = 1;
  const Tensor ones1 = ones(one, TensorOptions(x.dtype(), x.device()));
  std::vector<Tensor> parts;
  for (int64_t k = 0; k < n; ++k) {
    // The products leaving out x_k of the outputs k..n-1: those of x_0..x_{k-1}, times x_{k+1}..x_j.
    Tensor omitted = k + 1 < n ? cat({ones1, cumprod(x.narrow(d, k + 1, n - k - 1), d)}, d) : ones1;
    if (k > 0) omitted = omitted * prod(x.narrow(d, 0, k), {d}, true);
    parts.push_back(sum(g.narrow(d, k, n - k) * omitted, {d}, true));
  }
  return cat(parts, d);
}

}  // namespace

Tensor cumsum(const Tensor& x, int64_t dim) {
  // Integers and bool sum to i64 (PyTorch's rule), floats keep their dtype.
  const DType out_t = is_floating(x.dtype()) ? x.dtype() : DType::i64;
  const Columns c = columns(is_floating(x.dtype()) ? x : x.to(DType::i64), dim, "cumsum");
  Tensor y = scan_values(ScanOp::cumsum, x, c, nullptr).to(out_t).reshape(x.shape());
  if (autograd::needs_grad({x})) {
    const int64_t d = c.dim;
    const bool scalar = x.dim() == 0;
    autograd::record("cumsum", {x}, {y}, [d, scalar](const GradCtx& g) -> std::vector<Tensor> {
      // Each input reaches every later output: the gradient is the reversed running sum.
      if (scalar) return {g.g()};
      return {flip(cumsum(flip(g.g(), {d}), d), {d})};
    });
  }
  return y;
}

Tensor cumprod(const Tensor& x, int64_t dim) {
  const DType out_t = is_floating(x.dtype()) ? x.dtype() : DType::i64;
  const Columns c = columns(is_floating(x.dtype()) ? x : x.to(DType::i64), dim, "cumprod");
  Tensor y = scan_values(ScanOp::cumprod, x, c, nullptr).to(out_t).reshape(x.shape());
  if (autograd::needs_grad({x})) {
    SavedTensor sx(c.src), sx_in(x);  // sx_in: x with its history, for a backward with create_graph
    const Device dev = x.device();
    const Columns geo{Tensor(), c.dim, c.outer, c.n, c.inner};
    autograd::record("cumprod", {x}, {y}, [sx, sx_in, geo, dev](const GradCtx& g) -> std::vector<Tensor> {
      if (GradMode::enabled()) {
        const Tensor xh = sx_in.unpack("cumprod");
        if (autograd::needs_grad({g.g(), xh})) return {cumprod_backward_recorded(g.g(), xh, geo.dim)};
      }
      const Tensor xs = sx.unpack("cumprod");
      const DType ct = xs.dtype() == DType::f64 ? DType::f64 : DType::f32;
      const Tensor xc = xs.to(ct).contiguous(), gc = g.g().detach().to(ct).contiguous().reshape(xc.shape());
      Tensor gx = make_tensor(xc.shape(), ct, dev);
      detail::backend(dev).cumprod_backward(ct, geo.outer, geo.n, geo.inner, xc.raw_data(), gc.raw_data(),
                                            gx.raw_data());
      return {gx.reshape(g.g().shape()).to(g.g().dtype())};
    });
  }
  return y;
}

ValuesIndices cummax(const Tensor& x, int64_t dim) { return running_extreme("cummax", ScanOp::cummax, x, dim); }
ValuesIndices cummin(const Tensor& x, int64_t dim) { return running_extreme("cummin", ScanOp::cummin, x, dim); }

Tensor prod(const Tensor& x, const std::vector<int64_t>& dims_in, bool keepdim) {
  const int64_t nd = x.dim();
  std::vector<int64_t> dims = detail::normalize_dims(dims_in, nd, "prod");
  if (nd == 0) return is_floating(x.dtype()) ? x.clone() : x.to(DType::i64);
  if (dims.empty())
    for (int64_t i = 0; i < nd; ++i) dims.push_back(i);
  // The reduced dims moved last and flattened; the product is the running product's last entry
  // (cumprod's gradient is exact where x has zeros). An empty product is 1.
  std::vector<bool> red(size_t(nd), false);
  for (int64_t d : dims) red[size_t(d)] = true;
  std::vector<int64_t> perm;
  Shape kept, keep_shape;
  int64_t r = 1;
  for (int64_t i = 0; i < nd; ++i)
    if (!red[size_t(i)]) perm.push_back(i), kept.push_back(x.size(i));
  for (int64_t d : dims) perm.push_back(d), r *= x.size(d);
  for (int64_t i = 0; i < nd; ++i) keep_shape.push_back(red[size_t(i)] ? 1 : x.size(i));
  Shape flat = kept;
  flat.push_back(r);
  Tensor out;
  if (r == 0) {
    out = ones(kept, TensorOptions(is_floating(x.dtype()) ? x.dtype() : DType::i64, x.device()));
    // Still part of the graph, as PyTorch's: its gradient is zeros of x's (empty) shape.
    if (autograd::needs_grad({x})) {
      const Shape in_shape = x.shape();
      autograd::record("prod", {x}, {out}, [in_shape](const GradCtx& c) -> std::vector<Tensor> {
        return {zeros(in_shape, TensorOptions(c.g().dtype(), c.g().device()))};
      });
    }
  } else {
    out = cumprod(x.permute(perm).reshape(flat), -1).select(-1, r - 1);
  }
  return keepdim ? out.reshape(keep_shape) : out;
}

Tensor stddev(const Tensor& a, const std::vector<int64_t>& dims, int64_t correction, bool keepdim) {
  // A 16-bit std is the square root of the f32 variance, rounded once: the root of the variance
  // rounded to bf16 first is off by an ulp (bf16 [900, 1000, 1100, 1200] gave 129, PyTorch 130).
  if (is_low_precision(a.dtype())) return cast(stddev(cast(a, DType::f32), dims, correction, keepdim), a.dtype());
  return sqrt(var(a, dims, correction, keepdim));
}

ValuesIndices sort(const Tensor& x, int64_t dim, bool descending) {
  const Tensor idx = sorted_positions("sort", x, dim, descending);
  if (x.dim() == 0) return {x.clone(), idx};
  return {gather(x, wrap_dim(dim, x.dim(), "sort"), idx), idx};
}

Tensor argsort(const Tensor& x, int64_t dim, bool descending) {
  return sorted_positions("argsort", x, dim, descending);
}

namespace {
// Picks along a dim (topk, kthvalue, median, mode): the dim wrapped (a 0-dim x takes 0 and -1) and
// its size, 1 for a 0-dim x.
struct Along {
  int64_t d, n;
};
Along along(const char* op, const Tensor& x, int64_t dim) {
  const int64_t d = wrap_dim(dim, std::max<int64_t>(x.dim(), 1), op);
  return {d, x.dim() == 0 ? 1 : x.size(d)};
}
// A 0-dim x is its own pick, at index 0.
ValuesIndices pick_of_scalar(const Tensor& x) { return {x.clone(), zeros({}, TensorOptions(DType::i64, x.device()))}; }
// x's values at idx (a size-1 dim d), dim d dropped unless keepdim.
ValuesIndices picked(const Tensor& x, int64_t d, Tensor idx, bool keepdim) {
  Tensor v = gather(x, d, idx);
  if (!keepdim) v = v.squeeze(d), idx = idx.squeeze(d);
  return {v, idx};
}
}  // namespace

ValuesIndices topk(const Tensor& x, int64_t k, int64_t dim, bool largest) {
  const auto [d, n] = along("topk", x, dim);
  KILN_CHECK(k >= 0 && k <= n, "topk: k = ", k, " is outside [0, ", n, "] for dim ", dim, " of ", x.shape());
  if (x.dim() == 0) return pick_of_scalar(x);
  const Tensor idx = sorted_positions("topk", x, d, largest).narrow(d, 0, k).contiguous();
  return {gather(x, d, idx), idx};
}

ValuesIndices kthvalue(const Tensor& x, int64_t k, int64_t dim, bool keepdim) {
  const auto [d, n] = along("kthvalue", x, dim);
  KILN_CHECK(k >= 1 && k <= n, "kthvalue: k = ", k, " is outside [1, ", n, "] for dim ", dim, " of ", x.shape());
  if (x.dim() == 0) return pick_of_scalar(x);
  return picked(x, d, sorted_positions("kthvalue", x, d, false).narrow(d, k - 1, 1).contiguous(), keepdim);
}

ValuesIndices median(const Tensor& x, int64_t dim, bool keepdim) {
  const auto [d, n] = along("median", x, dim);
  KILN_CHECK(n >= 1, "median: dim ", dim, " of ", x.shape(), " is empty");
  if (x.dim() == 0) return pick_of_scalar(x);
  const Tensor order = sorted_positions("median", x, d, false);
  // The lower median, (n - 1) / 2 in sorted order; a slice with NaN gives its first NaN (NaN sorts
  // last, stably: at n - count).
  Shape one_shape = x.shape();
  one_shape[size_t(d)] = 1;
  Tensor pos = full(one_shape, double((n - 1) / 2), TensorOptions(DType::i64, x.device()));
  if (is_floating(x.dtype())) {
    const Tensor nans = sum(isnan(x.detach()), {d}, true);
    pos =
        where(gt(nans, zeros_like(nans)), scalar_tensor(double(n), TensorOptions(DType::i64, x.device())) - nans, pos);
  }
  return picked(x, d, gather(order, d, pos), keepdim);
}

ValuesIndices mode(const Tensor& x, int64_t dim, bool keepdim) {
  const auto [d, n] = along("mode", x, dim);
  KILN_CHECK(n >= 1, "mode: dim ", dim, " of ", x.shape(), " is empty");
  if (x.dim() == 0) return pick_of_scalar(x);
  // Runs of equal values in sorted order [rows, n]: each element's run length, the first longest run
  // (the smallest value among the most frequent), and that run's last element (the value's last
  // position, the order being stable).
  const Tensor xt = x.detach().transpose(d, -1).contiguous();
  const Shape lead(xt.shape().begin(), xt.shape().end() - 1);
  const Tensor rows = xt.reshape({-1, n});
  const ValuesIndices s = sort(rows, 1);
  const TensorOptions o(DType::i64, x.device());
  Tensor fresh = ones({rows.size(0), n}, TensorOptions(DType::boolean, x.device()));
  if (n > 1) fresh = cat({fresh.narrow(1, 0, 1), ne(s.values.narrow(1, 1, n - 1), s.values.narrow(1, 0, n - 1))}, 1);
  const Tensor run = cumsum(fresh, 1) - 1.0;
  const Tensor len = gather(scatter_add(zeros({rows.size(0), n}, TensorOptions(DType::f64, x.device())), 1, run,
                                        ones({rows.size(0), n}, TensorOptions(DType::f64, x.device()))),
                            1, run);
  const Tensor first = argmax(len, 1, true);
  const Tensor last = first + gather(len, 1, first).to(DType::i64) - 1.0;
  // Back from [lead..., 1] to x's layout with dim d of size 1.
  return picked(x, d, gather(s.indices, 1, last).reshape(lead).unsqueeze(-1).transpose(d, -1).contiguous(), keepdim);
}

Tensor median(const Tensor& x) {
  KILN_CHECK(x.numel() >= 1, "median: the tensor ", x.shape(), " is empty");
  return median(x.reshape({-1}), 0).values;
}

}  // namespace kiln
