// Views and layouts of torch's Tensor API that the engine has no op for: unfold (sliding windows over
// one dim, a view with a backward), view(dtype) (the same memory read as another dtype) and the
// channels_last test of is_contiguous(memory_format=). kiln/_views.py and kiln/_memory_format.py check
// the arguments as torch does and call these.
#include "common.h"
#include "engine/autograd.h"
#include "engine/internal.h"

namespace kiln::py {

namespace {

// x.unfold(d, size, step): every window of `size` elements along d, `step` apart, as a new last dim;
// d is already normalised (0 for a 0-dim x). Sharing x's memory; the gradient of each element is the
// sum over the windows that hold it.
Tensor unfold_view(const Tensor& x, int64_t d, int64_t size, int64_t step) {
  const bool scalar = x.dim() == 0;
  KILN_CHECK(scalar ? d == 0 : d >= 0 && d < x.dim(), "unfold: dimension ", d, " is out of range for a ", x.dim(),
             "-D tensor");
  const int64_t len = scalar ? 1 : x.size(d);
  KILN_CHECK(size >= 0 && size <= len, "unfold: size ", size, " is outside [0, ", len, "] (dimension ", d, " of ",
             x.shape(), ")");
  KILN_CHECK(step > 0, "unfold: step is ", step, " but must be > 0");
  const int64_t windows = (len - size) / step + 1;
  Shape ns = x.shape(), st = x.strides();
  const int64_t inner = scalar ? 1 : st[size_t(d)];
  if (!scalar) {
    ns[size_t(d)] = windows;
    st[size_t(d)] = inner * step;
  }
  ns.push_back(size);
  st.push_back(inner);
  Tensor out = detail::make_view(x, ns, st, x.offset());
  if (autograd::needs_grad({x})) {
    const Shape in_shape = x.shape();
    const DType dt = x.dtype();
    autograd::record("unfold", {x}, {out}, [=](const GradCtx& c) -> std::vector<Tensor> {
      const Tensor g = c.g().detach();
      if (scalar) return {sum(c.g()).to(dt)};  // recorded under create_graph
      // Element j of every window lies `step` apart along d from j on: one strided add per offset.
      Tensor gx = zeros(in_shape, TensorOptions(dt, g.device()));
      for (int64_t j = 0; j < size; ++j) {
        Tensor part = gx.slice(d, j, j + (windows - 1) * step + 1, step);
        part.add_(g.select(g.dim() - 1, j));
      }
      // In a backward with create_graph: recorded, its own gradient the same windows.
      if (autograd::needs_grad({c.g()}))
        autograd::record("unfold_backward", {c.g()}, {gx}, [=](const GradCtx& cc) -> std::vector<Tensor> {
          return {unfold_view(cc.g(), d, size, step)};
        });
      return {gx};
    });
  }
  return out;
}

// x.view(dtype) as torch's: the same bytes as `to`. Of the same element size, the same shape; of a
// smaller one, the last dim (stride 1) holds proportionally more elements; of a larger one, fewer
// (its size, the offset and the other strides divisible by the ratio). Not differentiable (as torch's).
Tensor view_dtype(const Tensor& x, DType to) {
  const int64_t from_size = int64_t(x.element_size()), to_size = int64_t(dtype_size(to));
  Shape ns = x.shape(), st = x.strides();
  int64_t off = x.offset();
  if (from_size != to_size) {
    const std::string what =
        std::string(" to view ") + dtype_name(x.dtype()) + " as " + dtype_name(to) + " (different element sizes)";
    KILN_CHECK(x.dim() > 0, "view(dtype): the tensor cannot be 0-dim", what);
    KILN_CHECK(st.back() == 1, "view(dtype): stride(-1) must be 1", what, ", but got ", st.back());
    if (from_size > to_size) {
      const int64_t r = from_size / to_size;
      for (size_t i = 0; i + 1 < st.size(); ++i) st[i] *= r;
      ns.back() *= r;
      off *= r;
    } else {
      const int64_t r = to_size / from_size;
      KILN_CHECK(ns.back() % r == 0, "view(dtype): size(-1) must be divisible by ", r, what, ", but got ", ns.back());
      KILN_CHECK(off % r == 0, "view(dtype): storage_offset() must be divisible by ", r, what, ", but got ", off);
      for (size_t i = 0; i + 1 < st.size(); ++i)
        KILN_CHECK(st[i] % r == 0, "view(dtype): stride(", i, ") must be divisible by ", r, what, ", but got ", st[i]);
      for (size_t i = 0; i + 1 < st.size(); ++i) st[i] /= r;
      ns.back() /= r;
      off /= r;
    }
  }
  Tensor out = detail::make_view(x, ns, st, off);
  out.impl().dtype = to;
  return out;
}

}  // namespace

void bind_tensor_views(nb::module_& m) {
  m.def("_unfold", &unfold_view, nb::arg("input"), nb::arg("dimension"), nb::arg("size"), nb::arg("step"),
        "Tensor.unfold's view (kiln/_views.py checks the arguments as torch does).");
  m.def(
      "_view_dtype", [](const Tensor& x, nb::handle dtype) { return view_dtype(x, to_dtype(dtype, "view(dtype)")); },
      nb::arg("input"), nb::arg("dtype"), "Tensor.view(dtype): the same memory read as another dtype.");
  m.def(
      "_is_contiguous_channels_last", [](const Tensor& x) { return x.is_contiguous(MemoryFormat::channels_last); },
      nb::arg("input"), "Tensor.is_contiguous(memory_format=kiln.channels_last): 4-D and dense in NHWC order.");
}

}  // namespace kiln::py
