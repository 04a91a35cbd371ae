// Assembly and indexing ops (cat, stack, split, index_select, gather, scatter_add, one_hot,
// masked_fill) and the ops built on them: embedding, dropout, scaled dot-product attention.
#include <algorithm>
#include <cmath>
#include <limits>

#include "engine/autocast.h"
#include "engine/autograd.h"
#include "engine/internal.h"
#include "engine/nn_ops.h"

namespace kiln {
namespace {

// [outer, n, inner] around `dim`.
void split_dims(const Shape& s, int64_t dim, int64_t& outer, int64_t& n, int64_t& inner) {
  outer = 1;
  inner = 1;
  for (int64_t i = 0; i < dim; ++i) outer *= s[size_t(i)];
  n = s[size_t(dim)];
  for (size_t i = size_t(dim) + 1; i < s.size(); ++i) inner *= s[i];
}

// `on`: the tensor the indices address; kernels read indices on its device.
Tensor index_tensor(const char* op, const Tensor& idx, const Tensor& on = {}) {
  KILN_CHECK(idx.defined() && (idx.dtype() == DType::i64 || idx.dtype() == DType::i32), op,
             ": indices must be i64 (or i32), got ", idx.defined() ? idx.type_str() : "undefined");
  if (on.defined())
    KILN_CHECK(idx.device() == on.device(), op, ": indices are on ", idx.device(), " but the tensor they index is on ",
               on.device(), "; move them with .to(", on.device(), ")");
  Tensor t = idx.detach();
  if (t.dtype() != DType::i64) t = t.to(DType::i64);
  return t.contiguous();
}

// Gathered rows along dim, flat indices, no autograd.
Tensor index_select_raw(const Tensor& x, int64_t d, const Tensor& idx) {
  const Tensor xc = x.detach().contiguous();
  int64_t outer, n, inner;
  split_dims(xc.shape(), d, outer, n, inner);
  Shape os = xc.shape();
  os[size_t(d)] = idx.numel();
  Tensor out = make_tensor(os, xc.dtype(), xc.device());
  detail::backend(xc.device()).index_select(xc.dtype(), outer, n, inner, xc.raw_data(), idx.numel(),
                                            idx.data<int64_t>(), out.raw_data());
  return out;
}

DType float_compute(DType t) { return t == DType::f64 ? DType::f64 : DType::f32; }

}  // namespace

Tensor cat(const std::vector<Tensor>& ts, int64_t dim) {
  KILN_CHECK(!ts.empty(), "cat: needs at least one tensor");
  const int64_t nd = ts[0].dim();
  KILN_CHECK(nd > 0, "cat: 0-dim tensors cannot be concatenated; unsqueeze them or use stack");
  const int64_t d = wrap_dim(dim, nd, "cat");
  DType t = ts[0].dtype();
  Shape out_shape = ts[0].shape();
  out_shape[size_t(d)] = 0;
  for (size_t i = 0; i < ts.size(); ++i) {
    KILN_CHECK(ts[i].dim() == nd, "cat: tensor ", i, " has shape ", ts[i].shape(), ", tensor 0 has ", ts[0].shape());
    for (int64_t k = 0; k < nd; ++k)
      KILN_CHECK(k == d || ts[i].shape()[size_t(k)] == ts[0].shape()[size_t(k)], "cat: tensor ", i, " has shape ",
                 ts[i].shape(), ", which differs from ", ts[0].shape(), " outside dim ", d);
    out_shape[size_t(d)] += ts[i].size(d);
    t = promote_types(t, ts[i].dtype());
  }
  const Device dev = detail::common_device("cat", ts);
  Tensor out = make_tensor(out_shape, t, dev);
  std::vector<int64_t> sizes;
  {
    NoGradGuard ng;
    int64_t off = 0;
    for (const Tensor& x : ts) {
      out.narrow(d, off, x.size(d)).copy_(x.detach());
      sizes.push_back(x.size(d));
      off += x.size(d);
    }
  }
  if (autograd::needs_grad(ts)) {
    autograd::record("cat", ts, {out}, [sizes, d](const GradCtx& c) -> std::vector<Tensor> {
      std::vector<Tensor> gs;
      int64_t off = 0;
      for (size_t i = 0; i < sizes.size(); ++i) {
        gs.push_back(c.needs_grad(i) ? c.g().narrow(d, off, sizes[i]) : Tensor());
        off += sizes[i];
      }
      return gs;
    });
  }
  return out;
}

Tensor stack(const std::vector<Tensor>& ts, int64_t dim) {
  KILN_CHECK(!ts.empty(), "stack: needs at least one tensor");
  const int64_t d = wrap_dim(dim, ts[0].dim() + 1, "stack");
  std::vector<Tensor> us;
  for (size_t i = 0; i < ts.size(); ++i) {
    KILN_CHECK(ts[i].shape() == ts[0].shape(), "stack: tensor ", i, " has shape ", ts[i].shape(), ", tensor 0 has ",
               ts[0].shape());
    us.push_back(ts[i].unsqueeze(d));
  }
  return cat(us, d);
}

std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim) {
  KILN_CHECK(split_size >= 1, "split: split_size must be >= 1, got ", split_size);
  KILN_CHECK(x.dim() > 0, "split: tensor is 0-dim");
  const int64_t d = wrap_dim(dim, x.dim(), "split");
  std::vector<Tensor> out;
  for (int64_t off = 0; off < x.size(d); off += split_size)
    out.push_back(x.narrow(d, off, std::min(split_size, x.size(d) - off)));
  return out;
}

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& indices) {
  const OpScope scope("index_select");
  KILN_CHECK(x.dim() > 0, "index_select: tensor is 0-dim");
  const int64_t d = wrap_dim(dim, x.dim(), "index_select");
  KILN_CHECK(indices.dim() <= 1, "index_select: indices must be 1-D, got ", indices.shape());
  const Tensor idx = index_tensor("index_select", indices, x).reshape({-1});
  Tensor out = index_select_raw(x, d, idx);
  if (autograd::needs_grad({x})) {
    const Shape in_shape = x.shape();
    autograd::record("index_select", {x}, {out}, [idx, d, in_shape](const GradCtx& c) -> std::vector<Tensor> {
      const DType ct = float_compute(c.g().dtype());
      const Tensor g = c.g().detach().to(ct).contiguous();
      Tensor gx = zeros(in_shape, TensorOptions(ct, g.device()));
      int64_t outer, n, inner;
      split_dims(in_shape, d, outer, n, inner);
      detail::backend(g.device()).index_add(ct, outer, n, inner, gx.raw_data(), idx.numel(), idx.data<int64_t>(),
                                            g.raw_data());
      // In a backward with create_graph: recorded, its own gradient the same index_select.
      if (autograd::needs_grad({c.g()}))
        autograd::record("index_select_backward", {c.g()}, {gx},
                         [idx, d](const GradCtx& cc) -> std::vector<Tensor> { return {index_select(cc.g(), d, idx)}; });
      return {gx};
    });
  }
  return out;
}

namespace {
// t's leading part in every dim but `skip` (-1: none) where idx is shorter: a view (autograd sees it),
// as torch's gather and scatter read only the part of input and src that the indices cover.
Tensor narrow_to(const Tensor& t, const Tensor& idx, int64_t skip) {
  Tensor r = t;
  for (int64_t i = 0; i < t.dim(); ++i)
    if (i != skip && idx.size(i) < t.size(i)) r = r.narrow(i, 0, idx.size(i));
  return r;
}
}  // namespace

Tensor gather(const Tensor& x, int64_t dim, const Tensor& indices) {
  KILN_CHECK(x.dim() > 0, "gather: tensor is 0-dim");
  const int64_t d = wrap_dim(dim, x.dim(), "gather");
  const Tensor idx = index_tensor("gather", indices, x);
  KILN_CHECK(idx.dim() == x.dim(), "gather: indices ", idx.shape(), " must have the rank of input ", x.shape());
  for (int64_t i = 0; i < x.dim(); ++i)
    KILN_CHECK(i == d || idx.size(i) <= x.size(i), "gather: indices ", idx.shape(), " must be no larger than input ",
               x.shape(), " outside dim ", d, " (dim ", i, ")");
  // Indices shorter than x outside dim (torch allows it) read x's leading part there.
  if (const Tensor part = narrow_to(x, idx, d); part.shape() != x.shape()) return gather(part, d, idx);
  const Tensor xc = x.detach().contiguous();
  int64_t outer, n, inner;
  split_dims(xc.shape(), d, outer, n, inner);
  Tensor out = make_tensor(idx.shape(), xc.dtype(), xc.device());
  detail::backend(xc.device()).gather(xc.dtype(), outer, n, inner, xc.raw_data(), idx.size(d), idx.data<int64_t>(),
                                      out.raw_data());
  if (autograd::needs_grad({x})) {
    const Shape in_shape = x.shape();
    autograd::record("gather", {x}, {out}, [idx, d, in_shape](const GradCtx& c) -> std::vector<Tensor> {
      return {scatter_add(zeros(in_shape, TensorOptions(c.g().dtype(), c.g().device())), d, idx, c.g())};
    });
  }
  return out;
}

namespace {
// Checks and runs the scatter kernel: out = x with src's elements combined in at indices along dim.
// Returns out (no autograd) and the dim.
Tensor scatter_raw(const char* name, ScatterOp op, bool include_self, const Tensor& x, int64_t dim, const Tensor& idx,
                   const Tensor& src, int64_t& d) {
  KILN_CHECK(x.dim() > 0, name, ": tensor is 0-dim");
  d = wrap_dim(dim, x.dim(), name);
  KILN_CHECK(idx.shape() == src.shape(), name, ": indices ", idx.shape(), " and src ", src.shape(), " differ");
  KILN_CHECK(idx.dim() == x.dim(), name, ": indices ", idx.shape(), " must have the rank of input ", x.shape());
  for (int64_t i = 0; i < x.dim(); ++i)
    KILN_CHECK(i == d || idx.size(i) <= x.size(i), name, ": indices ", idx.shape(), " must be no larger than input ",
               x.shape(), " outside dim ", d, " (dim ", i, ")");
  const DType t = promote_types(x.dtype(), src.dtype());
  // Integers of 32 bits or fewer (and bool) combine in f64, which holds each of their values exactly;
  // i64 does not fit f64's 53 bits, so it is refused rather than rounded.
  KILN_CHECK(t != DType::i64, name, ": i64 tensors are not supported (f64, in which integers combine, cannot hold ",
             "every i64); convert to i32 or f64 first (got ", x.type_str(), " and ", src.type_str(), ")");
  const DType ct = is_floating(t) ? float_compute(t) : DType::f64;
  Tensor out = x.detach().to(ct).contiguous().clone();
  const Tensor sc = src.detach().to(ct).contiguous();
  // Indices shorter than x outside dim write into x's leading part there: scattered in a dense copy of
  // that part, copied back.
  Tensor part = narrow_to(out, idx, d);  // a view of out
  const bool whole = part.shape() == out.shape();
  Tensor dst = whole ? out : part.contiguous();
  int64_t outer, n, inner;
  split_dims(dst.shape(), d, outer, n, inner);
  detail::backend(dst.device())
      .scatter(op, include_self, ct, outer, n, inner, dst.raw_data(), idx.size(d), idx.data<int64_t>(), sc.raw_data());
  if (!whole) part.copy_(dst);
  return t != ct ? out.to(t) : out;
}

// src's part that the indices cover (torch reads no more of a larger src): refused where src is shorter.
Tensor src_part(const char* name, const Tensor& src, const Tensor& idx) {
  if (src.dim() != idx.dim()) return src;  // scatter_raw names the mismatch
  for (int64_t i = 0; i < src.dim(); ++i)
    KILN_CHECK(idx.size(i) <= src.size(i), name, ": indices ", idx.shape(), " must be no larger than src ", src.shape(),
               " (dim ", i, ")");
  return narrow_to(src, idx, -1);
}
}  // namespace

Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& indices, const Tensor& src_) {
  const Tensor idx = index_tensor("scatter_add", indices, x);
  const Tensor src = src_part("scatter_add", src_, idx);
  int64_t d = 0;
  Tensor out = scatter_raw("scatter_add", ScatterOp::add, true, x, dim, idx, src, d);
  if (autograd::needs_grad({x, src})) {
    autograd::record("scatter_add", {x, src}, {out}, [idx, d](const GradCtx& c) -> std::vector<Tensor> {
      return {c.g(), c.needs_grad(1) ? gather(c.g(), d, idx) : Tensor()};
    });
  }
  return out;
}

Tensor scatter(const Tensor& x, int64_t dim, const Tensor& indices, const Tensor& src_) {
  const Tensor idx = index_tensor("scatter", indices, x);
  const Tensor src = src_part("scatter", src_, idx);
  int64_t d = 0;
  Tensor out = scatter_raw("scatter", ScatterOp::assign, true, x, dim, idx, src, d);
  if (autograd::needs_grad({x, src})) {
    const Shape xs = x.shape();
    autograd::record("scatter", {x, src}, {out}, [idx, d, xs](const GradCtx& c) -> std::vector<Tensor> {
      // x keeps its gradient where nothing was written; of several writes to one place only the last
      // (in index order) reached the output: found by scattering each write's ordinal the same way.
      const TensorOptions o(DType::f64, c.g().device());
      int64_t dd = 0;
      Shape os(static_cast<size_t>(idx.dim()), 1);
      os[size_t(d)] = idx.size(d);
      const Tensor ord = arange(0.0, double(idx.size(d)), 1.0, o).reshape(os).expand(idx.shape()).contiguous();
      const Tensor last = scatter_raw("scatter", ScatterOp::assign, true, full(xs, -1.0, o), d, idx, ord, dd);
      const Tensor hit = ge(last, zeros({}, o));
      const Tensor won = eq(gather(last, d, idx), ord);
      return {c.needs_grad(0) ? where(hit, zeros_like(c.g()), c.g()) : Tensor(),
              c.needs_grad(1)
                  ? where(won, gather(c.g(), d, idx), zeros({}, TensorOptions(c.g().dtype(), c.g().device())))
                  : Tensor()};
    });
  }
  return out;
}

Tensor scatter_reduce(const Tensor& x, int64_t dim, const Tensor& indices, const Tensor& src_, ScatterReduce reduce,
                      bool include_self) {
  const Tensor idx = index_tensor("scatter_reduce", indices, x);
  const Tensor src = src_part("scatter_reduce", src_, idx);
  static constexpr ScatterOp kOps[] = {ScatterOp::add, ScatterOp::mul, ScatterOp::mean, ScatterOp::amax,
                                       ScatterOp::amin};
  const ScatterOp op = kOps[int(reduce)];
  int64_t d = 0;
  Tensor out = scatter_raw("scatter_reduce", op, include_self, x, dim, idx, src, d);
  if (!autograd::needs_grad({x, src})) return out;
  const Tensor y = out.detach();
  // Saved, not captured: a captured input keeps its graph alive from this node (a long chain of them was
  // freed by recursion), and an in-place change after the forward is caught.
  const SavedTensor saved_x(x), saved_src(src);
  autograd::record("scatter_reduce", {x, src}, {out}, [=](const GradCtx& c) -> std::vector<Tensor> {
    const Tensor g = c.g(), xs = saved_x.unpack("scatter_reduce"), ss = saved_src.unpack("scatter_reduce");
    const TensorOptions o(g.dtype(), g.device());
    int64_t dd = 0;
    // Which elements were written, and how many times.
    const Tensor writes =
        scatter_raw("scatter_reduce", ScatterOp::add, true, zeros(xs.shape(), o), d, idx, ones(idx.shape(), o), dd);
    const Tensor hit = gt(writes, zeros({}, o));
    // x takes part where it was not replaced: everywhere with include_self, else where nothing wrote.
    const Tensor x_in = include_self ? ones(xs.shape(), TensorOptions(DType::boolean, g.device())) : logical_not(hit);
    Tensor gx, gs;
    switch (reduce) {
      case ScatterReduce::sum:
        gx = where(x_in, g, zeros({}, o));
        gs = gather(g, d, idx);
        break;
      case ScatterReduce::mean: {
        const Tensor n = writes + (include_self ? 1.0 : 0.0);
        // g / n where n is 0 would give a NaN in its own gradient (0 / 0) under create_graph.
        const Tensor gn = g / where(gt(n, zeros({}, o)), n, ones({}, o));
        gx = where(x_in, gn, zeros({}, o));
        gs = gather(gn, d, idx);
        break;
      }
      case ScatterReduce::amax:
      case ScatterReduce::amin: {
        // Shared evenly among the participants equal to the result.
        const Tensor x_eq = logical_and(x_in, eq(xs, y));
        const Tensor s_eq = eq(ss, gather(y, d, idx));
        const Tensor n =
            scatter_raw("scatter_reduce", ScatterOp::add, true, x_eq.to(g.dtype()), d, idx, s_eq.to(g.dtype()), dd);
        const Tensor gn = g / where(gt(n, zeros({}, o)), n, ones({}, o));
        gx = where(x_eq, gn, zeros({}, o));
        gs = where(s_eq, gather(gn, d, idx), zeros({}, o));
        break;
      }
      case ScatterReduce::prod: {
        // The product of the other participants, exact with zeros: from the product of the non-zero
        // ones P and the count of zeros Z (others' product: P / v with no zero, P for the only zero,
        // else 0).
        const Tensor zero = zeros({}, TensorOptions(xs.dtype(), g.device()));
        const Tensor x_nz = where(logical_and(x_in, ne(xs, zero)), xs, ones_like(xs));
        const Tensor s_nz = where(ne(ss, zero), ss, ones_like(ss));
        const Tensor p = scatter_raw("scatter_reduce", ScatterOp::mul, true, x_nz, d, idx, s_nz, dd);
        const Tensor z =
            scatter_raw("scatter_reduce", ScatterOp::add, true, logical_and(x_in, eq(xs, zero)).to(xs.dtype()), d, idx,
                        eq(ss, zero).to(xs.dtype()), dd);
        const auto others = [&](const Tensor& v, const Tensor& pv, const Tensor& zv) {
          return where(eq(v, zero), where(eq(zv, ones_like(zv)), pv, zeros_like(pv)),
                       where(eq(zv, zeros_like(zv)), pv / v, zeros_like(pv)));
        };
        if (!autograd::needs_grad({g, xs, ss})) {
          gx = where(x_in, g * others(xs, p, z).to(g.dtype()), zeros({}, o));
          gs = gather(g, d, idx) * others(ss, gather(p, d, idx), gather(z, d, idx)).to(g.dtype());
          break;
        }
        // In a backward with create_graph, PyTorch's form, from recorded products: x's share is the
        // product with x itself set to 1; a src's is the result over it, or, for the only zero src
        // of its place, the product with it set to 1. A zero src of a place with several has no
        // such form: its gradient (0) refuses a second derivative.
        const Tensor xm = where(eq(xs, zero), ones_like(xs), xs);
        gx = where(x_in, g * (scatter_reduce(xm, d, idx, ss, ScatterReduce::prod, include_self) / xm).to(g.dtype()),
                   zeros({}, o));
        const Tensor s_zero = eq(ss, zero);
        const Tensor zs =
            scatter_raw("scatter_reduce", ScatterOp::add, true, zeros(xs.shape(), o), d, idx, s_zero.to(g.dtype()), dd);
        const Tensor nz = gather(zs, d, idx);
        const Tensor single = logical_and(s_zero, eq(nz, ones_like(nz)));
        const Tensor sm = where(single, ones_like(ss), ss);
        const Tensor r = scatter_reduce(xs, d, idx, ss, ScatterReduce::prod, include_self);
        const Tensor rm = scatter_reduce(xs, d, idx, sm, ScatterReduce::prod, include_self);
        gs = where(single, gather(g * rm.to(g.dtype()), d, idx),
                   gather(g * r.to(g.dtype()), d, idx) / where(s_zero, ones_like(ss), ss).to(g.dtype()));
        if (c.needs_grad(1) && any(logical_and(s_zero, gt(nz, ones_like(nz)))).item<bool>()) {
          const Tensor value = gs.detach();
          gs = value.clone();
          autograd::record("scatter_reduce_backward", {xs, ss, g}, {gs}, [](const GradCtx&) -> std::vector<Tensor> {
            KILN_FAIL(
                "backward through the gradient of scatter_reduce: a backward with create_graph ran through "
                "scatter_reduce (prod) with more than one zero src scattered to one place, whose gradient is "
                "not differentiable in Kiln, and a second derivative came back to it (the first derivative "
                "is right)");
          });
        }
        break;
      }
    }
    return {c.needs_grad(0) ? gx : Tensor(), c.needs_grad(1) ? gs : Tensor()};
  });
  return out;
}

Tensor one_hot(const Tensor& indices, int64_t num_classes, OutOfRange policy) {
  KILN_CHECK(num_classes >= 1 || num_classes == -1,
             "one_hot: num_classes must be >= 1 (or -1: the largest index + 1), got ", num_classes);
  const Tensor idx = index_tensor("one_hot", indices);
  if (num_classes == -1) {
    KILN_CHECK(idx.numel() > 0, "one_hot: num_classes -1 needs at least one index to size the classes");
    num_classes = std::max<int64_t>(amax(idx).item<int64_t>() + 1, 1);
  }
  if (idx.numel() > 0 && policy == OutOfRange::error) {
    const int64_t lo = amin(idx).item<int64_t>(), hi = amax(idx).item<int64_t>();
    KILN_CHECK(lo >= 0 && hi < num_classes, "one_hot: indices span [", lo, ", ", hi, "], outside [0, ", num_classes,
               ") (OutOfRange::zeros gives such an index a row of zeros)");
  }
  return cast(eq(idx.unsqueeze(-1), arange(num_classes, TensorOptions(DType::i64, idx.device()))), DType::i64);
}

Tensor nonzero(const Tensor& x) {
  // The flat positions of the non-zeros in order are the first `count` of a stable descending sort
  // of the 0/1 mask; one host read for the count, then coordinates by division.
  const int64_t nd = x.dim();
  const Tensor m = ne(x.detach().reshape({-1}), zeros({}, TensorOptions(x.dtype(), x.device())));
  const int64_t count = m.numel() ? sum(m).item<int64_t>() : 0;
  const Tensor flat = argsort(m.to(DType::i32), 0, true).narrow(0, 0, count);
  std::vector<Tensor> cols;
  Tensor f = flat;
  for (int64_t d = nd - 1; d >= 0; --d) {
    const Tensor c = remainder(f, scalar_tensor(double(x.size(d)), TensorOptions(DType::i64, x.device())));
    cols.push_back(c);
    f = ((f - c).to(DType::f64) / double(x.size(d))).to(DType::i64);  // exact: f - c divides by the size
  }
  std::reverse(cols.begin(), cols.end());
  return nd == 0 ? zeros({count, 0}, TensorOptions(DType::i64, x.device())) : stack(cols, 1);
}

Tensor masked_scatter(const Tensor& x, const Tensor& mask, const Tensor& src) {
  KILN_CHECK(mask.dtype() == DType::boolean, "masked_scatter: mask must be bool, got ", mask.type_str());
  Shape shape;
  try {
    shape = broadcast_shapes(x.shape(), mask.shape());
  } catch (const Error&) {
    KILN_FAIL("masked_scatter: mask ", mask.shape(), " does not broadcast to the input ", x.shape());
  }
  KILN_CHECK(shape == x.shape(), "masked_scatter: mask ", mask.shape(), " does not broadcast to the input ", x.shape());
  const Tensor m = mask.expand(shape).reshape({-1});
  const int64_t count = m.numel() ? sum(m).item<int64_t>() : 0;
  KILN_CHECK(count <= src.numel(), "masked_scatter: the mask selects ", count, " elements but src ", src.shape(),
             " has ", src.numel());
  if (count == 0) return x.clone();
  // The k-th selected position takes src's k-th element (row-major order): k = running count - 1.
  const Tensor k = clamp(cumsum(m, 0) - 1.0, 0.0, std::nullopt).to(DType::i64);
  const Tensor vals = index_select(src.reshape({-1}), 0, k);
  const DType t = promote_types(x.dtype(), src.dtype());
  return where(m, vals.to(t), x.reshape({-1}).to(t)).reshape(shape);
}

namespace {
// index_put's write for i64, which scatter refuses (it combines integers in f64): exact integer copies and sums.
// x2 [places, r]; lin [m], the row of x2 that value row i goes to; v2 [m, r]. Row ordinals are combined
// in f64 (exact below 2^53); the values themselves only move or add as i64.
Tensor index_put_i64(const Tensor& x2_in, const Tensor& lin, const Tensor& v2_in, bool accumulate) {
  const Tensor x2 = x2_in.detach().to(DType::i64), v2 = v2_in.detach().to(DType::i64);
  const int64_t places = x2.size(0), m = lin.numel();
  if (m == 0) return x2.clone();
  const TensorOptions f64(DType::f64, x2.device()), i64(DType::i64, x2.device());
  const Tensor ord = arange(m, i64), minus_one = full({places, 1}, -1.0, f64), zero = zeros({}, f64);
  // For each row of x2, the ordinal of the last write (in `at`'s order) that reaches it; -1 for none.
  auto last_write = [&](const Tensor& at, const Tensor& ords) {
    return scatter(minus_one, 0, at.reshape({m, 1}), ords.reshape({m, 1}).to(DType::f64)).reshape({places});
  };
  if (!accumulate) {
    const Tensor last = last_write(lin, ord);
    const Tensor pick = index_select(v2, 0, where(ge(last, zero), last, zero).to(DType::i64));
    return where(ge(last, zero).unsqueeze(1), pick, x2);
  }
  // Sorted by target (stably), each target's values are a run; its sum is a difference of the running sum.
  const Tensor order = argsort(lin, 0);
  const Tensor st = index_select(lin.reshape({m}), 0, order), sv = index_select(v2, 0, order);
  const Tensor run = cumsum(sv, 0);
  const Tensor last = last_write(st, ord), first = last_write(flip(st, {0}), flip(ord, {0}));
  const Tensor hit = ge(last, zero);
  const Tensor l = where(hit, last, zero).to(DType::i64), f = where(hit, first, zero).to(DType::i64);
  const Tensor sums = index_select(run, 0, l) - index_select(run, 0, f) + index_select(sv, 0, f);
  return where(hit.unsqueeze(1), x2 + sums, x2);
}
}  // namespace

Tensor index_put(const Tensor& x, const std::vector<Tensor>& indices_in, const Tensor& values, bool accumulate) {
  const char* op = "index_put";
  // A bool mask stands for the coordinates of its true elements (over as many leading dims as it has).
  std::vector<Tensor> indices;
  for (const Tensor& t : indices_in) {
    KILN_CHECK(t.defined(), op, ": an index tensor is undefined");
    if (t.dtype() == DType::boolean) {
      const Tensor nz = nonzero(t);
      for (int64_t c = 0; c < nz.size(1); ++c) indices.push_back(nz.select(1, c));
    } else {
      indices.push_back(index_tensor(op, t, x));
    }
  }
  const int64_t k = static_cast<int64_t>(indices.size());
  KILN_CHECK(k >= 1 && k <= x.dim(), op, ": ", k, " index tensors for input ", x.shape());
  Shape bshape;
  try {
    for (const Tensor& t : indices) bshape = broadcast_shapes(bshape, t.shape());
  } catch (const Error&) {
    KILN_FAIL(op, ": the index tensors do not broadcast together");
  }
  // Flat position over the first k dims (negative indices count from the end).
  Tensor lin = zeros(bshape, TensorOptions(DType::i64, x.device()));
  int64_t places = 1;
  for (int64_t i = 0; i < k; ++i) {
    const int64_t n = x.size(i);
    Tensor t = indices[size_t(i)];
    if (t.numel() > 0) {
      const int64_t lo = amin(t).item<int64_t>(), hi = amax(t).item<int64_t>();
      KILN_CHECK(lo >= -n && hi < n, op, ": indices for dim ", i, " span [", lo, ", ", hi, "], outside [", -n, ", ", n,
                 ")");
    }
    t = where(lt(t, zeros({}, TensorOptions(DType::i64, x.device()))), t + double(n), t);
    lin = lin * double(n) + t;
    places *= n;
  }
  Shape rest(x.shape().begin() + k, x.shape().end()), vshape = bshape;
  int64_t r = 1;
  for (int64_t s : rest) r *= s, vshape.push_back(s);
  const int64_t m = lin.numel();
  Tensor vals;
  try {
    vals = values.expand(vshape);
  } catch (const Error&) {
    KILN_FAIL(op, ": values ", values.shape(), " do not broadcast to ", vshape);
  }
  const Tensor at = lin.reshape({m, 1}).expand({m, r}).contiguous();
  const Tensor x2 = x.reshape({places, r}), v2 = vals.reshape({m, r});
  if (promote_types(x.dtype(), values.dtype()) == DType::i64)
    return index_put_i64(x2, lin.reshape({m}), v2, accumulate).reshape(x.shape());
  const Tensor out = accumulate ? scatter_add(x2, 0, at, v2) : scatter(x2, 0, at, v2);
  return out.reshape(x.shape());
}

Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  const OpScope scope("masked_fill");
  KILN_CHECK(mask.dtype() == DType::boolean, "masked_fill: mask must be bool, got ", mask.type_str());
  // As fill_ and PyTorch: the value is one of x's dtype, refused where it does not fit (i8 300 wrapped to 44,
  // and i8 masked_fill(m, 2.5) was f32).
  detail::check_fill_value(x, value, "masked_fill");
  const Tensor v =
      is_floating(x.dtype()) ? scalar_like(value, x) : scalar_tensor(value, TensorOptions(x.dtype(), x.device()));
  return where(mask, v, x);
}

Tensor masked_fill(const Tensor& x, const Tensor& mask, int64_t value) {
  // Only an integer x needs the int exactly; a float or bool x takes it as a number.
  if (!is_integral(x.dtype()) || x.dtype() == DType::boolean) return masked_fill(x, mask, double(value));
  const OpScope scope("masked_fill");
  KILN_CHECK(mask.dtype() == DType::boolean, "masked_fill: mask must be bool, got ", mask.type_str());
  // Checked and written as an int64: through a double, i64 2**63 - 1 was refused as out of range and
  // 2**53 + 1 written as 2**53.
  int64_t lo = std::numeric_limits<int64_t>::min(), hi = std::numeric_limits<int64_t>::max();
  switch (x.dtype()) {
    case DType::u8: lo = 0, hi = 255; break;
    case DType::i8: lo = -128, hi = 127; break;
    case DType::i16: lo = -32768, hi = 32767; break;
    case DType::i32: lo = std::numeric_limits<int32_t>::min(), hi = std::numeric_limits<int32_t>::max(); break;
    default: break;
  }
  KILN_CHECK(value >= lo && value <= hi, "masked_fill: ", value, " does not fit in ", x.dtype(), " (", lo, " to ", hi,
             ")");
  const Tensor v = from_blob_copy(&value, Shape{}).to(x.dtype()).to(x.device());
  return where(mask, v, x);
}

Tensor embedding(const Tensor& weight, const Tensor& indices, int64_t padding_idx) {
  const OpScope scope("embedding");
  KILN_CHECK(weight.dim() == 2, "embedding: weight must be [num_embeddings, dim], got ", weight.shape());
  const Tensor idx = index_tensor("embedding", indices, weight);
  const int64_t v = weight.size(0), dm = weight.size(1);
  KILN_CHECK(padding_idx >= -1 && padding_idx < v, "embedding: padding_idx ", padding_idx, " is outside [0, ", v, ")");
  const Tensor flat = idx.reshape({-1});
  Tensor rows = index_select_raw(weight, 0, flat);  // validates every index against v
  Shape os = idx.shape();
  os.push_back(dm);
  Tensor out = rows.view(os);
  if (autograd::needs_grad({weight})) {
    autograd::record("embedding", {weight}, {out}, [flat, v, dm, padding_idx](const GradCtx& c) -> std::vector<Tensor> {
      const DType ct = float_compute(c.g().dtype());
      Tensor g = c.g().detach().to(ct).contiguous().view({flat.numel(), dm});
      if (padding_idx >= 0) {
        const Tensor pad = eq(flat, scalar_tensor(double(padding_idx), TensorOptions(DType::i64, flat.device())));
        g = where(pad.unsqueeze(1), zeros_like(g), g);
      }
      Tensor gw = zeros({v, dm}, TensorOptions(ct, g.device()));
      detail::backend(g.device()).index_add(ct, 1, v, dm, gw.raw_data(), flat.numel(), flat.data<int64_t>(),
                                            g.raw_data());
      // In a backward with create_graph: recorded, its own gradient the rows the indices pick (none for
      // padding_idx), shaped as the incoming gradient.
      if (autograd::needs_grad({c.g()})) {
        const Shape gs = c.g().shape();
        autograd::record("embedding_backward", {c.g()}, {gw},
                         [flat, gs, padding_idx](const GradCtx& cc) -> std::vector<Tensor> {
                           Tensor r = index_select(cc.g(), 0, flat);
                           if (padding_idx >= 0) {
                             const Tensor pad =
                                 eq(flat, scalar_tensor(double(padding_idx), TensorOptions(DType::i64, flat.device())));
                             r = where(pad.unsqueeze(1), zeros_like(r), r);
                           }
                           return {r.reshape(gs)};
                         });
      }
      return {gw};
    });
  }
  return out;
}

Tensor dropout(const Tensor& x, double p, bool training, Generator* gen) {
  KILN_CHECK(p >= 0 && p <= 1, "dropout: p must be in [0, 1], got ", p);
  if (!training || p == 0.0) return x;
  if (p == 1.0) return x * 0.0;
  const Tensor keep = bernoulli(x.shape(), 1.0 - p, TensorOptions(x.dtype(), x.device()), gen);
  return x * (keep * (1.0 / (1.0 - p)));
}

AttentionOutput attention(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, const Tensor& mask,
                          const AttentionOptions& o, bool need_weights) {
  // Autocast: q, k and v in the 16-bit dtype (both products are GEMMs; masked_softmax computes in f32).
  const Tensor q = amp::autocast_arg(amp::AutocastOp::attention, q_in),
               k = amp::autocast_arg(amp::AutocastOp::attention, k_in),
               v = amp::autocast_arg(amp::AutocastOp::attention, v_in);
  KILN_CHECK(q.dim() >= 2 && k.dim() >= 2 && v.dim() >= 2, "attention: q, k, v need at least 2 dims, got ",
             q.shape(), ", ", k.shape(), ", ", v.shape());
  KILN_CHECK(q.size(-1) == k.size(-1), "attention: q ", q.shape(), " and k ", k.shape(), " differ in head size");
  KILN_CHECK(k.size(-2) == v.size(-2), "attention: k ", k.shape(), " and v ", v.shape(), " differ in length");
  // Grouped-query / multi-query attention: k and v with fewer heads (dim -3) than q, each shared by
  // q.size(-3) / k.size(-3) consecutive query heads.
  Tensor kk = k, vv = v;
  if (q.dim() >= 3 && k.dim() >= 3 && k.size(-3) != q.size(-3)) {
    const int64_t hq = q.size(-3), hk = k.size(-3);
    KILN_CHECK(v.dim() >= 3 && v.size(-3) == hk, "attention: k ", k.shape(), " and v ", v.shape(),
               " differ in heads (dim -3)");
    KILN_CHECK(hk >= 1 && hq % hk == 0, "attention: q has ", hq, " heads (dim -3), not a multiple of k and v's ", hk);
    std::vector<int64_t> group(static_cast<size_t>(hq));
    for (int64_t h = 0; h < hq; ++h) group[size_t(h)] = h / (hq / hk);
    const Tensor idx = from_blob_copy(group.data(), {hq}).to(k.device());
    kk = index_select(k, k.dim() - 3, idx);
    vv = index_select(v, v.dim() - 3, idx);
  }
  const double scale = o.scale ? *o.scale : 1.0 / std::sqrt(double(q.size(-1)));
  KILN_CHECK(std::isfinite(scale), "attention: scale must be finite, got ", scale);
  KILN_CHECK(o.softcap >= 0 && std::isfinite(o.softcap), "attention: softcap must be >= 0 (0: none), got ", o.softcap);
  KILN_CHECK(o.causal == Causal::none || q.size(-2) <= k.size(-2) || o.causal == Causal::top_left,
             "attention: a bottom-right causal mask needs no more queries (", q.size(-2), ") than keys (", k.size(-2),
             ")");
  Tensor scores = matmul(q, kk.transpose(-1, -2));
  double kernel_scale = scale;
  if (o.softcap > 0) {
    // softcap tanh(scale s / softcap), before the mask (Gemma 2's logit soft-capping).
    scores = tanh(scores * (scale / o.softcap)) * o.softcap;
    kernel_scale = 1.0;
  }
  // The scale, the mask and the causal mask go into the softmax kernel: no scaled or masked copy of
  // the scores is made.
  const Tensor probs = masked_softmax(scores, mask, kernel_scale, o.causal);
  const Tensor out = matmul(dropout(probs, o.dropout_p, o.training, o.gen), vv);
  return {out, need_weights ? probs : Tensor()};
}

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                                    double dropout_p, bool training, Generator* gen) {
  AttentionOptions o;
  o.dropout_p = dropout_p;
  o.training = training;
  o.gen = gen;
  return attention(q, k, v, mask, o).out;
}

}  // namespace kiln

// ---- shape ops built from views, index_select, gather, cat and where --------------------------------

namespace kiln {
namespace {
// A host-built i64 index vector on x's device.
Tensor host_indices(const std::vector<int64_t>& v, const Tensor& like) {
  return from_blob_copy(v.data(), {int64_t(v.size())}).to(like.device());
}
Tensor triangle(const char* name, const Tensor& x, int64_t k, bool lower) {
  KILN_CHECK(x.dim() >= 2, name, ": needs at least 2 dims, got ", x.shape());
  const int64_t h = x.size(-2), w = x.size(-1);
  const Tensor rows = arange(h, TensorOptions(DType::i64, x.device())).reshape({h, 1});
  const Tensor cols = arange(w, TensorOptions(DType::i64, x.device())).reshape({1, w});
  const Tensor diff = cols - rows;  // col - row
  const Tensor kt = scalar_tensor(double(k), TensorOptions(DType::i64, x.device()));
  return where(lower ? le(diff, kt) : ge(diff, kt), x, zeros_like(x));
}
}  // namespace

Tensor tril(const Tensor& x, int64_t k) { return triangle("tril", x, k, true); }
Tensor triu(const Tensor& x, int64_t k) { return triangle("triu", x, k, false); }

Tensor flip(const Tensor& x, const std::vector<int64_t>& dims) {
  Tensor out = x;
  std::vector<bool> seen(size_t(std::max<int64_t>(x.dim(), 1)), false);
  for (int64_t d0 : dims) {
    const int64_t d = wrap_dim(d0, x.dim(), "flip");
    KILN_CHECK(!seen[size_t(d)], "flip: dim ", d0, " given twice");
    seen[size_t(d)] = true;
    const int64_t n = x.size(d);
    std::vector<int64_t> idx(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) idx[size_t(i)] = n - 1 - i;
    out = index_select(out, d, host_indices(idx, x));
  }
  return dims.empty() ? x.clone() : out;
}

Tensor roll(const Tensor& x, int64_t shift, int64_t dim) {
  const int64_t d = wrap_dim(dim, x.dim(), "roll");
  const int64_t n = x.size(d);
  if (n == 0) return x.clone();
  std::vector<int64_t> idx(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) idx[size_t(i)] = (((i - shift) % n) + n) % n;  // out[i] = x[i - shift]
  return index_select(x, d, host_indices(idx, x));
}

Tensor tile(const Tensor& x, const std::vector<int64_t>& reps) {
  for (int64_t r : reps) KILN_CHECK(r >= 0, "tile: repetitions must be >= 0, got ", r);
  const int64_t nd = std::max<int64_t>(x.dim(), int64_t(reps.size()));
  Shape s(size_t(nd), 1), r(size_t(nd), 1);
  for (int64_t i = 0; i < x.dim(); ++i) s[size_t(nd - x.dim() + i)] = x.size(i);
  for (size_t i = 0; i < reps.size(); ++i) r[size_t(nd) - reps.size() + i] = reps[i];
  // [1, s0, 1, s1, ...] expanded to [r0, s0, r1, s1, ...], then each pair merged.
  Shape inter, expanded, out;
  for (int64_t i = 0; i < nd; ++i) {
    inter.insert(inter.end(), {1, s[size_t(i)]});
    expanded.insert(expanded.end(), {r[size_t(i)], s[size_t(i)]});
    out.push_back(r[size_t(i)] * s[size_t(i)]);
  }
  return x.reshape(inter).expand(expanded).contiguous().reshape(out);
}

std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim) {
  KILN_CHECK(chunks >= 1, "chunk: chunks must be >= 1, got ", chunks);
  const int64_t d = wrap_dim(dim, x.dim(), "chunk");
  const int64_t n = x.size(d);
  return split(x, std::max<int64_t>(1, (n + chunks - 1) / chunks), d);
}

Tensor diagonal(const Tensor& x, int64_t offset, int64_t dim1, int64_t dim2) {
  KILN_CHECK(x.dim() >= 2, "diagonal: needs at least 2 dims, got ", x.shape());
  const int64_t d1 = wrap_dim(dim1, x.dim(), "diagonal"), d2 = wrap_dim(dim2, x.dim(), "diagonal");
  KILN_CHECK(d1 != d2, "diagonal: dimensions cannot be identical ", dim1, ", ", dim2);
  const int64_t n1 = x.size(d1), n2 = x.size(d2);
  // Elements (r, r + offset) with both in range; compared without forming -offset or offset + n (a huge
  // offset would overflow).
  int64_t length = 0, r0 = 0, c0 = 0;
  if (offset >= 0 && offset < n2) {
    c0 = offset;
    length = std::min(n1, n2 - offset);
  } else if (offset < 0 && offset > -n1) {
    r0 = -offset;
    length = std::min(n1 - r0, n2);
  }
  Shape ns, st;
  for (int64_t i = 0; i < x.dim(); ++i)
    if (i != d1 && i != d2) {
      ns.push_back(x.size(i));
      st.push_back(x.strides()[size_t(i)]);
    }
  ns.push_back(length);
  st.push_back(x.strides()[size_t(d1)] + x.strides()[size_t(d2)]);
  const int64_t off = x.offset() + (length > 0 ? r0 * x.strides()[size_t(d1)] + c0 * x.strides()[size_t(d2)] : 0);
  Tensor out = detail::make_view(x, ns, st, off);
  if (autograd::needs_grad({x})) {
    const Shape in_shape = x.shape();
    const DType dt = x.dtype();
    autograd::record("diagonal", {x}, {out}, [=](const GradCtx& c) -> std::vector<Tensor> {
      Tensor gx = zeros(in_shape, TensorOptions(dt, c.g().device()));
      diagonal(gx, offset, d1, d2).copy_(c.g().detach());
      // In a backward with create_graph: recorded, its own gradient the same diagonal.
      if (autograd::needs_grad({c.g()}))
        autograd::record("diagonal_backward", {c.g()}, {gx}, [=](const GradCtx& cc) -> std::vector<Tensor> {
          return {diagonal(cc.g(), offset, d1, d2)};
        });
      return {gx};
    });
  }
  return out;
}

std::vector<Tensor> unbind(const Tensor& x, int64_t dim) {
  const int64_t d = wrap_dim(dim, x.dim(), "unbind");
  std::vector<Tensor> out;
  for (int64_t i = 0; i < x.size(d); ++i) out.push_back(x.select(d, i));
  return out;
}

Tensor take_along_dim(const Tensor& x, const Tensor& indices, int64_t dim) {
  KILN_CHECK(x.dim() == indices.dim(), "take_along_dim: x ", x.shape(), " and indices ", indices.shape(),
             " need the same number of dims");
  const int64_t d = wrap_dim(dim, x.dim(), "take_along_dim");
  Shape xs = x.shape(), is = indices.shape();
  for (int64_t i = 0; i < x.dim(); ++i) {
    if (i == d) continue;
    const int64_t a = xs[size_t(i)], b = is[size_t(i)];
    KILN_CHECK(a == b || a == 1 || b == 1, "take_along_dim: x ", x.shape(), " and indices ", indices.shape(),
               " do not broadcast in dim ", i);
    xs[size_t(i)] = is[size_t(i)] = std::max(a, b);
  }
  return gather(x.expand(xs), d, indices.expand(is).contiguous());
}

Tensor pad(const Tensor& x, const std::vector<int64_t>& amounts, PadMode mode, double value) {
  KILN_CHECK(amounts.size() % 2 == 0 && int64_t(amounts.size()) / 2 <= x.dim(), "pad: ", amounts.size(),
             " amounts for ", x.shape(), " (two per padded dim, last dim first)");
  Tensor out = x;
  for (size_t k = 0; k < amounts.size() / 2; ++k) {
    const int64_t d = x.dim() - 1 - int64_t(k), lo = amounts[2 * k], hi = amounts[2 * k + 1];
    const int64_t n = out.size(d);
    KILN_CHECK(n + lo + hi >= 0, "pad: padding (", lo, ", ", hi, ") of dim ", d, " leaves a negative size from ", n);
    if (mode == PadMode::constant) {
      // Crop first (negative amounts), then add the constant blocks.
      out = out.narrow(d, std::max<int64_t>(0, -lo), n - std::max<int64_t>(0, -lo) - std::max<int64_t>(0, -hi));
      std::vector<Tensor> parts;
      Shape side = out.shape();
      if (lo > 0) {
        side[size_t(d)] = lo;
        parts.push_back(full(side, value, TensorOptions(out.dtype(), out.device())));
      }
      parts.push_back(out);
      if (hi > 0) {
        side[size_t(d)] = hi;
        parts.push_back(full(side, value, TensorOptions(out.dtype(), out.device())));
      }
      out = parts.size() == 1 ? out : cat(parts, d);
      continue;
    }
    const char* mname = mode == PadMode::reflect ? "reflect" : mode == PadMode::replicate ? "replicate" : "circular";
    KILN_CHECK(lo >= 0 && hi >= 0, "pad: ", mname, " padding must be >= 0, got (", lo, ", ", hi, ")");
    KILN_CHECK(n > 0, "pad: ", mname, " padding of an empty dim ", d);
    if (mode == PadMode::reflect)
      KILN_CHECK(lo < n && hi < n, "pad: reflect padding (", lo, ", ", hi, ") must be below the size ", n, " of dim ",
                 d);
    if (mode == PadMode::circular)
      KILN_CHECK(lo <= n && hi <= n, "pad: circular padding (", lo, ", ", hi, ") must be at most the size ", n,
                 " of dim ", d);
    std::vector<int64_t> idx;
    for (int64_t i = -lo; i < n + hi; ++i) {
      int64_t j = i;
      if (mode == PadMode::reflect) j = i < 0 ? -i : i >= n ? 2 * (n - 1) - i : i;
      if (mode == PadMode::replicate) j = std::clamp<int64_t>(i, 0, n - 1);
      if (mode == PadMode::circular) j = ((i % n) + n) % n;
      idx.push_back(j);
    }
    out = index_select(out, d, host_indices(idx, x));
  }
  return out;
}

Tensor pixel_shuffle(const Tensor& x, int64_t r) {
  KILN_CHECK(x.dim() == 4 && r >= 1 && x.size(1) % (r * r) == 0, "pixel_shuffle: needs [N, C r^2, H, W] with r = ", r,
             ", got ", x.shape());
  const int64_t n = x.size(0), c = x.size(1) / (r * r), h = x.size(2), w = x.size(3);
  return x.reshape({n, c, r, r, h, w}).permute({0, 1, 4, 2, 5, 3}).reshape({n, c, h * r, w * r});
}
Tensor pixel_unshuffle(const Tensor& x, int64_t r) {
  KILN_CHECK(x.dim() == 4 && r >= 1 && x.size(2) % r == 0 && x.size(3) % r == 0,
             "pixel_unshuffle: needs [N, C, H r, W r] with r = ", r, ", got ", x.shape());
  const int64_t n = x.size(0), c = x.size(1), h = x.size(2) / r, w = x.size(3) / r;
  return x.reshape({n, c, h, r, w, r}).permute({0, 1, 3, 5, 2, 4}).reshape({n, c * r * r, h, w});
}

}  // namespace kiln

// ---- interpolate: separable, one dim at a time, by index_select and weights --------------------------

namespace kiln {
namespace {
const char* interp_name(InterpMode m) {
  switch (m) {
    case InterpMode::nearest: return "nearest";
    case InterpMode::bilinear: return "bilinear";
    case InterpMode::bicubic: return "bicubic";
    case InterpMode::linear: return "linear";
    case InterpMode::trilinear: return "trilinear";
    case InterpMode::nearest_exact: return "nearest-exact";
    case InterpMode::area: return "area";
  }
  return "?";
}
bool interp_linear(InterpMode m) {
  return m == InterpMode::linear || m == InterpMode::bilinear || m == InterpMode::trilinear;
}

// area: dim d averaged over adaptive pooling's windows [floor(o in / out), ceil((o + 1) in / out)), as
// PyTorch's 'area' (adaptive_avg_pool): dim d moved last and the rest flattened to [rows, 1, in], pooled
// to [rows, 1, out] by the engine's adaptive_avg_pool2d (each window summed directly), so memory is
// O(input + output), not a dense [in, out] matrix.
Tensor area_dim(const Tensor& x, int64_t d, int64_t out) {
  const int64_t in = x.size(d);
  if (in == out) return x;
  const int64_t last = x.dim() - 1;
  const Tensor t = d == last ? x : x.transpose(d, last);
  Shape shape = t.shape();
  shape.back() = out;
  if (x.numel() == 0) {
    const Tensor y = zeros(shape, TensorOptions(x.dtype(), x.device()));
    return d == last ? y : y.transpose(d, last);
  }
  // A mean, not a GEMM: under autocast it runs in x's dtype (interpolate's elementwise rule).
  const amp::AutocastGuard no_autocast(x.dtype(), false);
  const int64_t rows = t.numel() / in;
  const Tensor y = adaptive_avg_pool2d(t.reshape({rows, 1, in}), Pair{1, out}).reshape(shape);
  return d == last ? y : y.transpose(d, last);
}

// Resizes dim d of x from its size to `out`; without align_corners, output o reads source
// (o + 0.5) * ratio - 0.5 (nearest: floor(o * ratio); nearest-exact: floor((o + 0.5) * ratio), both
// with ratio in float as PyTorch's), where ratio is in / out for a size and 1 / scale_factor for a
// scale (PyTorch's rule, which differs where in * scale is not whole).
Tensor resize_dim(const Tensor& x, int64_t d, int64_t out, InterpMode mode, bool align_corners, double ratio) {
  if (mode == InterpMode::area) return area_dim(x, d, out);
  const int64_t in = x.size(d);
  // PyTorch's 2-d nearest kernel (only it: the 1-d and 3-d ones do not) copies where out == in and takes
  // o / 2 where out == 2 in, whatever the scale.
  const bool nearest2d = mode == InterpMode::nearest && x.dim() == 4;
  // The same size is a copy whatever the scale, as in PyTorch's linear kernels and its 2-d nearest; its
  // bicubic, nearest-exact and 1-d and 3-d nearest kernels resample by 1 / scale (identity where that is 1).
  if (in == out && (nearest2d || interp_linear(mode) || align_corners || ratio == 1.0)) return x;
  if (mode == InterpMode::bicubic) {
    // PyTorch's cubic convolution (A = -0.75) over taps floor(src) - 1 .. + 2, clamped to the edge;
    // the source index is not clamped at 0 as bilinear's is.
    constexpr double A = -0.75;
    const auto near = [](double t) { return ((A + 2) * t - (A + 3)) * t * t + 1; };       // |t| <= 1
    const auto far = [](double t) { return ((A * t - 5 * A) * t + 8 * A) * t - 4 * A; };  // 1 < |t| < 2
    std::vector<std::vector<int64_t>> at(4, std::vector<int64_t>(static_cast<size_t>(out)));
    std::vector<std::vector<double>> w(4, std::vector<double>(static_cast<size_t>(out)));
    for (int64_t o = 0; o < out; ++o) {
      const double src = align_corners ? (out > 1 ? double(o) * double(in - 1) / double(out - 1) : 0.0)
                                       : (double(o) + 0.5) * ratio - 0.5;
      const double fl = std::floor(src), t = src - fl;
      const double wt[4] = {far(t + 1), near(t), near(1 - t), far(2 - t)};
      for (int k = 0; k < 4; ++k) {
        at[size_t(k)][size_t(o)] = std::clamp<int64_t>(int64_t(fl) - 1 + k, 0, in - 1);
        w[size_t(k)][size_t(o)] = wt[k];
      }
    }
    Shape ws(size_t(x.dim()), 1);
    ws[size_t(d)] = out;
    Tensor y;
    for (int k = 0; k < 4; ++k) {
      const Tensor term = index_select(x, d, from_blob_copy(at[size_t(k)].data(), {out}).to(x.device())) *
                          from_vector(w[size_t(k)], ws, TensorOptions(x.dtype(), x.device()));
      y = y.defined() ? y + term : term;
    }
    return y;
  }
  std::vector<int64_t> i0(static_cast<size_t>(out)), i1(static_cast<size_t>(out));
  std::vector<double> w1(static_cast<size_t>(out));
  const double scale = ratio;
  // nearest and nearest-exact: PyTorch computes the step in float and rounds the source coordinate to float.
  const float fscale = float(ratio);
  const bool pick = mode == InterpMode::nearest || mode == InterpMode::nearest_exact;
  for (int64_t o = 0; o < out; ++o) {
    if (mode == InterpMode::nearest) {
      const float src = float(o) * fscale;
      i0[size_t(o)] = nearest2d && out == 2 * in ? o / 2 : std::min<int64_t>(int64_t(std::floor(src)), in - 1);
      continue;
    }
    if (mode == InterpMode::nearest_exact) {
      const float src = float((double(o) + 0.5) * double(fscale));
      i0[size_t(o)] = std::min<int64_t>(int64_t(std::floor(src)), in - 1);
      continue;
    }
    const double src = align_corners ? (out > 1 ? double(o) * double(in - 1) / double(out - 1) : 0.0)
                                     : std::max(0.0, (double(o) + 0.5) * scale - 0.5);
    const int64_t lo = std::min<int64_t>(int64_t(std::floor(src)), in - 1);
    i0[size_t(o)] = lo;
    i1[size_t(o)] = std::min<int64_t>(lo + 1, in - 1);
    w1[size_t(o)] = src - double(lo);
  }
  const Tensor a = index_select(x, d, from_blob_copy(i0.data(), {out}).to(x.device()));
  if (pick) return a;
  const Tensor b = index_select(x, d, from_blob_copy(i1.data(), {out}).to(x.device()));
  Shape ws(size_t(x.dim()), 1);
  ws[size_t(d)] = out;
  const Tensor w = from_vector(w1, ws, TensorOptions(x.dtype(), x.device()));
  return a + (b - a) * w;
}

// The input's rank against the mode's (PyTorch's: linear 3-d, bilinear and bicubic 4-d, trilinear 5-d,
// the others 3- to 5-d) and the output sizes' count against its spatial dims.
void check_interp(const Tensor& x, size_t n, InterpMode mode, bool align_corners, const char* what) {
  const char* name = interp_name(mode);
  const int64_t need = mode == InterpMode::linear                                    ? 3
                       : mode == InterpMode::trilinear                               ? 5
                       : mode == InterpMode::bilinear || mode == InterpMode::bicubic ? 4
                                                                                     : 0;
  if (need)
    KILN_CHECK(x.dim() == need, "interpolate: mode ", name, " needs ", need, "-d input [N, C, ",
               need == 3   ? "L"
               : need == 4 ? "H, W"
                           : "D, H, W",
               "], got ", x.shape());
  else
    KILN_CHECK(x.dim() >= 3 && x.dim() <= 5, "interpolate: mode ", name,
               " needs 3-d, 4-d or 5-d input [N, C, spatial...], got ", x.shape());
  KILN_CHECK(int64_t(n) == x.dim() - 2, "interpolate: ", what, " has ", n, " values for the ", x.dim() - 2,
             " spatial dims of ", x.shape());
  for (int64_t d = 2; d < x.dim(); ++d) KILN_CHECK(x.size(d) >= 1, "interpolate: empty input ", x.shape());
  KILN_CHECK(!align_corners || interp_linear(mode) || mode == InterpMode::bicubic, "interpolate: align_corners is for ",
             "linear, bilinear, bicubic and trilinear, not ", name);
  if (mode != InterpMode::nearest && mode != InterpMode::nearest_exact)
    KILN_CHECK(is_floating(x.dtype()), "interpolate: mode ", name, " needs a floating tensor, got ", x.dtype());
}

Tensor resize(const Tensor& x, const std::vector<int64_t>& size, InterpMode mode, bool align_corners,
              const std::vector<double>& ratio) {
  Tensor y = x;  // (interpolate and interpolate_scale checked each size >= 1)
  for (size_t i = 0; i < size.size(); ++i) y = resize_dim(y, int64_t(i) + 2, size[i], mode, align_corners, ratio[i]);
  // Nothing resampled (every dim kept its size): a new tensor, as PyTorch's, not x's storage (an in-place
  // op on the result would change x, and be refused on a leaf that requires grad); clone is recorded
  // for autograd.
  if (&y.impl() == &x.impl()) return x.clone();
  return y;
}
}  // namespace

Tensor interpolate(const Tensor& x, const std::vector<int64_t>& size, InterpMode mode, bool align_corners) {
  check_interp(x, size.size(), mode, align_corners, "size");
  std::vector<double> ratio(size.size());
  for (size_t i = 0; i < size.size(); ++i) {
    KILN_CHECK(size[i] >= 1, "interpolate: output size must be >= 1, got ", size[i]);
    ratio[i] = double(x.size(int64_t(i) + 2)) / double(size[i]);
  }
  return resize(x, size, mode, align_corners, ratio);
}

Tensor interpolate_scale(const Tensor& x, const std::vector<double>& scale, InterpMode mode, bool align_corners,
                         bool recompute_scale_factor) {
  check_interp(x, scale.size(), mode, align_corners, "scale_factor");
  std::vector<int64_t> size(scale.size());
  std::vector<double> ratio(scale.size());
  for (size_t i = 0; i < scale.size(); ++i) {
    KILN_CHECK(std::isfinite(scale[i]) && scale[i] > 0, "interpolate: scale factors must be finite and > 0, got ",
               scale[i]);
    const int64_t in = x.size(int64_t(i) + 2);
    size[i] = int64_t(std::floor(double(in) * scale[i]));
    KILN_CHECK(size[i] >= 1, "interpolate: scale factor ", scale[i], " makes spatial size ", in, " an empty ", size[i]);
    ratio[i] = 1.0 / scale[i];
  }
  if (recompute_scale_factor) return interpolate(x, size, mode, align_corners);
  return resize(x, size, mode, align_corners, ratio);
}

}  // namespace kiln
