// The functions of engine/nn_ops.h (kiln.nn.functional in the package): convolution, pooling,
// normalisation, activations, softmax, losses, embedding, dropout, attention, padding and
// resampling. Sizes take an int or a tuple, as in torch.nn.functional.
#include <nanobind/stl/array.h>
#include <nanobind/stl/tuple.h>

#include <limits>

#include "common.h"
#include "engine/autocast.h"

namespace kiln::py {
namespace {

using R = GilRelease;
auto nogil = nb::call_guard<GilRelease>();

template <size_t N> std::array<int64_t, N> tuple_of(nb::handle h, const char* what, int64_t fallback = 0) {
  std::array<int64_t, N> out;
  if (h.is_none()) {
    out.fill(fallback);
    return out;
  }
  if (PyLong_Check(h.ptr())) {
    out.fill(nb::cast<int64_t>(h));
    return out;
  }
  const std::vector<int64_t> v = to_dims(h, what);
  if (v.size() != N)
    value_error(std::string(what) + ": expected an int or " + std::to_string(N) + " ints, got " +
                std::to_string(v.size()));
  for (size_t i = 0; i < N; ++i) out[i] = v[i];
  return out;
}
int64_t one_of(nb::handle h, const char* what, int64_t fallback = 0) { return tuple_of<1>(h, what, fallback)[0]; }
// max_unpool's output_size: None, or a size whose last N entries are the spatial ones (torch takes both).
template <size_t N> std::optional<std::array<int64_t, N>> unpool_size(nb::handle h, const char* dims) {
  if (h.is_none()) return std::nullopt;
  const std::vector<int64_t> v = to_dims(h, "output_size");
  if (v.size() < N) value_error(std::string("output_size: expected ") + dims + " or a longer size ending in them");
  std::array<int64_t, N> out;
  for (size_t i = 0; i < N; ++i) out[i] = v[v.size() - N + i];
  return out;
}

// A pool's stride: None (the kernel size, which the engine takes as 0), else positive values; an
// explicit 0 is an error, not "not given".
template <size_t N> std::array<int64_t, N> pool_stride(nb::handle h, const char* op) {
  const std::array<int64_t, N> s = tuple_of<N>(h, "stride", 0);
  if (!h.is_none())
    for (int64_t v : s)
      if (v < 1) value_error(std::string(op) + ": stride must be positive, got " + std::to_string(v));
  return s;
}
int64_t divisor_of(const std::optional<int64_t>& d, const char* op) {
  if (!d) return 0;
  if (*d == 0) value_error(std::string(op) + ": divisor_override must be nonzero (None: the pooling region's size)");
  return *d;
}
// kiln.float32's name of a dtype, for messages.
const char* kiln_dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "float32";
    case DType::f16: return "float16";
    case DType::bf16: return "bfloat16";
    case DType::f64: return "float64";
    case DType::i32: return "int32";
    case DType::i64: return "int64";
    case DType::u8: return "uint8";
    case DType::boolean: return "bool";
    case DType::i8: return "int8";
    case DType::i16: return "int16";
  }
  return "?";
}

// torch refuses a linear or convolution whose input, weight and bias differ in dtype (a float64 NumPy
// batch into float32 layers), where the engine would promote and give a float64 result. Under autocast
// the engine casts them first by its own rules (docs/amp.md), so mixed dtypes there are left to it.
void check_same_dtype(const char* op, const Tensor& x, const Tensor& w, const std::optional<Tensor>& b) {
  if (amp::autocast_dtype()) return;
  const char* wn = kiln_dtype_name(w.dtype());
  const std::string to = w.dtype() == DType::f32 ? "x.float()" : std::string("x.to(kiln.") + wn + ")";
  // An integer input (token ids, raw pixels) is converted; weights are not made integers.
  KILN_CHECK(x.dtype() == w.dtype(), op, ": the input is ", kiln_dtype_name(x.dtype()), " and the weight ", wn,
             "; they must have the same dtype, as in torch: convert the input (", to, ")",
             is_floating(x.dtype()) ? std::string(" or the weights (.to(kiln.") + kiln_dtype_name(x.dtype()) + "))"
                                    : std::string());
  KILN_CHECK(!b || b->dtype() == w.dtype(), op, ": the bias is ", kiln_dtype_name(b->dtype()), " and the weight ", wn,
             "; they must have the same dtype, as in torch (convert the bias: b.to(kiln.", wn, "))");
}

// torch's normalisations (batch, layer, group, instance) take parameters of the input's dtype, or f32
// ones for a 16-bit input; anything else (a float64 batch into float32 norms) it refuses as "mixed
// dtype", where the engine would promote. Under autocast the engine's casts decide, as for linear.
void check_norm_dtype(const char* op, const Tensor& x, std::initializer_list<const std::optional<Tensor>*> params) {
  if (amp::autocast_dtype()) return;
  for (const std::optional<Tensor>* p : params) {
    if (!*p || (*p)->dtype() == x.dtype()) continue;
    KILN_CHECK(is_low_precision(x.dtype()) && (*p)->dtype() == DType::f32, op, ": the input is ",
               kiln_dtype_name(x.dtype()), " and its parameters or running statistics ", kiln_dtype_name((*p)->dtype()),
               "; mixed dtypes are refused, as in torch (which takes float32 parameters only with a 16-bit input): ",
               "convert the input (x.to(kiln.", kiln_dtype_name((*p)->dtype()), "))");
  }
}

// A 16-bit input's normalisation with float32 parameters is the input's dtype, as torch's (the engine's
// group and instance norms promote to float32).
Tensor in_input_dtype(const Tensor& x, const Tensor& y) {
  return is_low_precision(x.dtype()) && !amp::autocast_dtype() ? y.to(x.dtype()) : y;
}

// max_unpool's output_size against the sizes the pooling could have come from, as torch checks:
// within a stride of (in - 1) * stride - 2 * padding + kernel, per spatial dim.
template <size_t N> void check_unpool_size(const char* op, const Tensor& x,
                                           const std::optional<std::array<int64_t, N>>& os,
                                           const std::array<int64_t, N>& k, const std::array<int64_t, N>& s,
                                           const std::array<int64_t, N>& p) {
  if (!os || x.dim() < int64_t(N)) return;
  for (size_t i = 0; i < N; ++i) {
    const int64_t st = s[i] > 0 ? s[i] : k[i];
    const int64_t in = x.size(x.dim() - int64_t(N) + int64_t(i));
    const int64_t def = (in - 1) * st - 2 * p[i] + k[i];
    const int64_t want = (*os)[i];
    if (want <= def - st || want >= def + st)
      value_error(std::string(op) + ": output_size " + std::to_string(want) + " in spatial dim " + std::to_string(i) +
                  " is impossible for an input of size " + std::to_string(in) + " (kernel " + std::to_string(k[i]) +
                  ", stride " + std::to_string(st) + ", padding " + std::to_string(p[i]) + "): it must be between " +
                  std::to_string(def - st + 1) + " and " + std::to_string(def + st - 1));
  }
}

Reduction reduction_of(const std::string& r) {
  if (r == "mean") return Reduction::mean;
  if (r == "sum") return Reduction::sum;
  if (r == "none") return Reduction::none;
  if (r == "batchmean") return Reduction::batchmean;
  value_error("reduction must be \"mean\", \"sum\", \"none\" or \"batchmean\", got \"" + r + "\"");
}

Tensor opt(const std::optional<Tensor>& t) { return t ? *t : Tensor(); }

// torch's cross_entropy: class indices go to the engine's; a floating target of the input's shape holds
// class probabilities (soft labels: mixup, distillation): -sum_c weight_c y_c log_softmax(x)_c over the
// class dim (1), the labels smoothed first (y (1 - s) + s / C), and a mean over the other positions (not
// divided by the weights, as torch; ignore_index has no class to ignore there: refused unless -100,
// its default, as torch refuses it).
Tensor cross_entropy_py(const Tensor& x, const Tensor& t, const Tensor& w, int64_t ignore_index, Reduction r,
                        double smoothing) {
  if (!is_floating(t.dtype())) return cross_entropy(x, t, ignore_index, smoothing, r, w);
  KILN_CHECK(ignore_index == -100, "cross_entropy: ignore_index ", ignore_index,
             " is for class-index targets; a floating target (class probabilities) takes none (leave it -100)");
  KILN_CHECK(x.dim() >= 2 && t.shape() == x.shape(),
             "cross_entropy: a floating target holds class probabilities "
             "and must have the input's shape ",
             x.shape(), ", got ", t.type_str(), " (class indices are i64)");
  KILN_CHECK(std::isfinite(smoothing) && smoothing >= 0 && smoothing <= 1,
             "cross_entropy: label_smoothing must be in [0, 1], got ", smoothing);
  KILN_CHECK(r != Reduction::batchmean, "cross_entropy: reduction must be none, mean or sum");
  const int64_t classes = x.size(1);
  Tensor y = t.to(x.dtype());
  if (smoothing > 0) y = y * (1.0 - smoothing) + smoothing / double(classes);
  if (w.defined()) {
    KILN_CHECK(w.dim() == 1 && w.size(0) == classes, "cross_entropy: weight must be [", classes, "], got ",
               w.type_str());
    Shape ws(size_t(x.dim()), 1);
    ws[1] = classes;
    y = y * w.to(x.dtype()).reshape(ws);
  }
  const Tensor loss = neg(sum(y * log_softmax(x, 1), {1}));
  if (r == Reduction::none) return loss;
  return r == Reduction::sum ? sum(loss) : mean(loss);
}

bool is_same(nb::handle padding) {
  if (!nb::isinstance<nb::str>(padding)) return false;
  const std::string s = nb::cast<std::string>(padding);
  if (s == "same") return true;
  if (s == "valid") return false;
  value_error("padding: expected an int, a tuple, \"same\" or \"valid\", got \"" + s + "\"");
}
bool is_valid(nb::handle padding) { return nb::isinstance<nb::str>(padding) && !is_same(padding); }
// padding="same" keeps the input's size, which only a stride of 1 can: torch refuses the others, and
// the engine's kSame would quietly compute the stride-1 convolution.
template <size_t N> void check_same_stride(const std::array<int64_t, N>& stride, const char* op) {
  for (int64_t v : stride)
    if (v != 1)
      value_error(std::string(op) + ": padding='same' is not supported for strided convolutions (stride " +
                  std::to_string(v) + ")");
}

// interpolate's refusal of an input rank its mode does not take: a NotImplementedError, the type
// torch raises (Kiln has no KilnError subclass of it; its Python code raises the builtin too).
[[noreturn]] void not_implemented(const std::string& msg) {
  set_error(PyExc_NotImplementedError, msg);
  throw nb::python_error();
}
// One of interpolate's output sizes: an int or anything with __index__ (a NumPy integer), as torch's;
// TypeError for a float or a bool.
int64_t interp_int(nb::handle h) { return to_int64(h, "interpolate: size"); }

}  // namespace

void bind_nn_ops(nb::module_& mod) {
  Defs m{mod};
  auto a = [](const char* n) { return nb::arg(n); };
  m.def(
      "linear",
      [](const Tensor& x, const Tensor& w, std::optional<Tensor> b) {
        check_same_dtype("linear", x, w, b);
        return linear(x, w, opt(b));
      },
      a("input"), a("weight"), nb::arg("bias") = nb::none(), nogil);

  // ---- convolution ----
  m.def(
      "conv1d",
      [](const Tensor& x, const Tensor& w, std::optional<Tensor> b, nb::handle stride, nb::handle padding,
         nb::handle dilation, int64_t groups) {
        check_same_dtype("conv1d", x, w, b);
        const int64_t dl = one_of(dilation, "dilation", 1);
        if (is_same(padding)) {
          check_same_stride<1>({one_of(stride, "stride", 1)}, "conv1d");
          R r;
          return conv1d(x, w, opt(b), kSame, dl, groups);
        }
        const int64_t st = one_of(stride, "stride", 1), pd = is_valid(padding) ? 0 : one_of(padding, "padding");
        R r;
        return conv1d(x, w, opt(b), st, pd, dl, groups);
      },
      a("input"), a("weight"), nb::arg("bias") = nb::none(), nb::arg("stride") = 1, nb::arg("padding") = 0,
      nb::arg("dilation") = 1, nb::arg("groups") = 1);
  m.def(
      "conv2d",
      [](const Tensor& x, const Tensor& w, std::optional<Tensor> b, nb::handle stride, nb::handle padding,
         nb::handle dilation, int64_t groups) {
        check_same_dtype("conv2d", x, w, b);
        const Pair dl = tuple_of<2>(dilation, "dilation", 1);
        if (is_same(padding)) {
          check_same_stride<2>(tuple_of<2>(stride, "stride", 1), "conv2d");
          R r;
          return conv2d(x, w, opt(b), kSame, dl, groups);
        }
        const Pair st = tuple_of<2>(stride, "stride", 1),
                   pd = is_valid(padding) ? Pair{0, 0} : tuple_of<2>(padding, "padding");
        R r;
        return conv2d(x, w, opt(b), st, pd, dl, groups);
      },
      a("input"), a("weight"), nb::arg("bias") = nb::none(), nb::arg("stride") = 1, nb::arg("padding") = 0,
      nb::arg("dilation") = 1, nb::arg("groups") = 1);
  m.def(
      "conv3d",
      [](const Tensor& x, const Tensor& w, std::optional<Tensor> b, nb::handle stride, nb::handle padding,
         nb::handle dilation, int64_t groups) {
        check_same_dtype("conv3d", x, w, b);
        const Triple dl = tuple_of<3>(dilation, "dilation", 1);
        if (is_same(padding)) {
          check_same_stride<3>(tuple_of<3>(stride, "stride", 1), "conv3d");
          R r;
          return conv3d(x, w, opt(b), kSame, dl, groups);
        }
        const Triple st = tuple_of<3>(stride, "stride", 1);
        const Triple pd = is_valid(padding) ? Triple{0, 0, 0} : tuple_of<3>(padding, "padding");
        R r;
        return conv3d(x, w, opt(b), st, pd, dl, groups);
      },
      a("input"), a("weight"), nb::arg("bias") = nb::none(), nb::arg("stride") = 1, nb::arg("padding") = 0,
      nb::arg("dilation") = 1, nb::arg("groups") = 1);
  m.def(
      "conv_transpose1d",
      [](const Tensor& x, const Tensor& w, std::optional<Tensor> b, nb::handle stride, nb::handle padding,
         nb::handle output_padding, int64_t groups, nb::handle dilation) {
        check_same_dtype("conv_transpose1d", x, w, b);
        const int64_t st = one_of(stride, "stride", 1), pd = one_of(padding, "padding"),
                      op = one_of(output_padding, "output_padding"), dl = one_of(dilation, "dilation", 1);
        R r;
        return conv_transpose1d(x, w, opt(b), st, pd, op, groups, dl);
      },
      a("input"), a("weight"), nb::arg("bias") = nb::none(), nb::arg("stride") = 1, nb::arg("padding") = 0,
      nb::arg("output_padding") = 0, nb::arg("groups") = 1, nb::arg("dilation") = 1);
  m.def(
      "conv_transpose2d",
      [](const Tensor& x, const Tensor& w, std::optional<Tensor> b, nb::handle stride, nb::handle padding,
         nb::handle output_padding, int64_t groups, nb::handle dilation) {
        check_same_dtype("conv_transpose2d", x, w, b);
        const Pair st = tuple_of<2>(stride, "stride", 1), pd = tuple_of<2>(padding, "padding"),
                   op = tuple_of<2>(output_padding, "output_padding"), dl = tuple_of<2>(dilation, "dilation", 1);
        R r;
        return conv_transpose2d(x, w, opt(b), st, pd, op, groups, dl);
      },
      a("input"), a("weight"), nb::arg("bias") = nb::none(), nb::arg("stride") = 1, nb::arg("padding") = 0,
      nb::arg("output_padding") = 0, nb::arg("groups") = 1, nb::arg("dilation") = 1);

  // ---- pooling ----
  m.def(
      "max_pool1d",
      [](const Tensor& x, nb::handle k, nb::handle s, nb::handle p, nb::handle d, bool ceil_mode,
         bool return_indices) -> nb::object {
        const int64_t kk = one_of(k, "kernel_size"), ss = pool_stride<1>(s, "max_pool1d")[0], pp = one_of(p, "padding"),
                      dd = one_of(d, "dilation", 1);
        if (return_indices) {
          ValuesIndices vi;
          {
            R r;
            vi = max_pool1d_with_indices(x, kk, ss, pp, dd, ceil_mode);
          }
          return nb::make_tuple(vi.values, vi.indices);
        }
        Tensor out;
        {
          R r;  // the GIL let go for the kernel only: the result is made with it held
          out = max_pool1d(x, kk, ss, pp, dd, ceil_mode);
        }
        return nb::cast(out);
      },
      a("input"), a("kernel_size"), nb::arg("stride") = nb::none(), nb::arg("padding") = 0, nb::arg("dilation") = 1,
      nb::arg("ceil_mode") = false, nb::arg("return_indices") = false);
  m.def(
      "max_pool2d",
      [](const Tensor& x, nb::handle k, nb::handle s, nb::handle p, nb::handle d, bool ceil_mode,
         bool return_indices) -> nb::object {
        const Pair kk = tuple_of<2>(k, "kernel_size"), ss = pool_stride<2>(s, "max_pool2d"),
                   pp = tuple_of<2>(p, "padding"), dd = tuple_of<2>(d, "dilation", 1);
        if (return_indices) {
          ValuesIndices vi;
          {
            R r;
            vi = max_pool2d_with_indices(x, kk, ss, pp, dd, ceil_mode);
          }
          return nb::make_tuple(vi.values, vi.indices);
        }
        Tensor out;
        {
          R r;
          out = max_pool2d(x, kk, ss, pp, dd, ceil_mode);
        }
        return nb::cast(out);
      },
      a("input"), a("kernel_size"), nb::arg("stride") = nb::none(), nb::arg("padding") = 0, nb::arg("dilation") = 1,
      nb::arg("ceil_mode") = false, nb::arg("return_indices") = false);
  m.def(
      "max_pool3d",
      [](const Tensor& x, nb::handle k, nb::handle s, nb::handle p, nb::handle d, bool ceil_mode,
         bool return_indices) -> nb::object {
        const Triple kk = tuple_of<3>(k, "kernel_size"), ss = pool_stride<3>(s, "max_pool3d"),
                     pp = tuple_of<3>(p, "padding"), dd = tuple_of<3>(d, "dilation", 1);
        ValuesIndices vi;
        {
          R r;
          if (return_indices)
            vi = max_pool3d_with_indices(x, kk, ss, pp, dd, ceil_mode);
          else
            vi.values = max_pool3d(x, kk, ss, pp, dd, ceil_mode);
        }
        return return_indices ? nb::object(nb::make_tuple(vi.values, vi.indices)) : nb::cast(vi.values);
      },
      a("input"), a("kernel_size"), nb::arg("stride") = nb::none(), nb::arg("padding") = 0, nb::arg("dilation") = 1,
      nb::arg("ceil_mode") = false, nb::arg("return_indices") = false);
  m.def(
      "avg_pool1d",
      [](const Tensor& x, nb::handle k, nb::handle s, nb::handle p, bool ceil_mode, bool cip) {
        const int64_t kk = one_of(k, "kernel_size"), ss = pool_stride<1>(s, "avg_pool1d")[0], pp = one_of(p, "padding");
        R r;
        return avg_pool1d(x, kk, ss, pp, cip, ceil_mode);
      },
      a("input"), a("kernel_size"), nb::arg("stride") = nb::none(), nb::arg("padding") = 0,
      nb::arg("ceil_mode") = false, nb::arg("count_include_pad") = true);
  m.def(
      "avg_pool2d",
      [](const Tensor& x, nb::handle k, nb::handle s, nb::handle p, bool ceil_mode, bool cip,
         std::optional<int64_t> divisor) {
        const Pair kk = tuple_of<2>(k, "kernel_size"), ss = pool_stride<2>(s, "avg_pool2d"),
                   pp = tuple_of<2>(p, "padding");
        const int64_t dv = divisor_of(divisor, "avg_pool2d");
        R r;
        return avg_pool2d(x, kk, ss, pp, cip, ceil_mode, dv);
      },
      a("input"), a("kernel_size"), nb::arg("stride") = nb::none(), nb::arg("padding") = 0,
      nb::arg("ceil_mode") = false, nb::arg("count_include_pad") = true, nb::arg("divisor_override") = nb::none());
  m.def(
      "avg_pool3d",
      [](const Tensor& x, nb::handle k, nb::handle s, nb::handle p, bool ceil_mode, bool cip,
         std::optional<int64_t> divisor) {
        const Triple kk = tuple_of<3>(k, "kernel_size"), ss = pool_stride<3>(s, "avg_pool3d"),
                     pp = tuple_of<3>(p, "padding");
        const int64_t dv = divisor_of(divisor, "avg_pool3d");
        R r;
        return avg_pool3d(x, kk, ss, pp, cip, ceil_mode, dv);
      },
      a("input"), a("kernel_size"), nb::arg("stride") = nb::none(), nb::arg("padding") = 0,
      nb::arg("ceil_mode") = false, nb::arg("count_include_pad") = true, nb::arg("divisor_override") = nb::none());
  m.def(
      "max_unpool1d",
      [](const Tensor& x, const Tensor& idx, nb::handle k, nb::handle s, nb::handle p, std::optional<int64_t> size) {
        const int64_t kk = one_of(k, "kernel_size"), ss = pool_stride<1>(s, "max_unpool1d")[0],
                      pp = one_of(p, "padding");
        if (size) check_unpool_size<1>("max_unpool1d", x, std::array<int64_t, 1>{*size}, {kk}, {ss}, {pp});
        R r;
        return max_unpool1d(x, idx, kk, ss, pp, size);
      },
      a("input"), a("indices"), a("kernel_size"), nb::arg("stride") = nb::none(), nb::arg("padding") = 0,
      nb::arg("output_size") = nb::none());
  m.def(
      "max_unpool2d",
      [](const Tensor& x, const Tensor& idx, nb::handle k, nb::handle s, nb::handle p, nb::handle size) {
        const Pair kk = tuple_of<2>(k, "kernel_size"), ss = pool_stride<2>(s, "max_unpool2d"),
                   pp = tuple_of<2>(p, "padding");
        const std::optional<Pair> os = unpool_size<2>(size, "(H, W)");
        check_unpool_size<2>("max_unpool2d", x, os, kk, ss, pp);
        R r;
        return max_unpool2d(x, idx, kk, ss, pp, os);
      },
      a("input"), a("indices"), a("kernel_size"), nb::arg("stride") = nb::none(), nb::arg("padding") = 0,
      nb::arg("output_size") = nb::none());
  m.def(
      "max_unpool3d",
      [](const Tensor& x, const Tensor& idx, nb::handle k, nb::handle s, nb::handle p, nb::handle size) {
        const Triple kk = tuple_of<3>(k, "kernel_size"), ss = pool_stride<3>(s, "max_unpool3d"),
                     pp = tuple_of<3>(p, "padding");
        const std::optional<Triple> os = unpool_size<3>(size, "(D, H, W)");
        check_unpool_size<3>("max_unpool3d", x, os, kk, ss, pp);
        R r;
        return max_unpool3d(x, idx, kk, ss, pp, os);
      },
      a("input"), a("indices"), a("kernel_size"), nb::arg("stride") = nb::none(), nb::arg("padding") = 0,
      nb::arg("output_size") = nb::none());
  m.def(
      "adaptive_avg_pool2d",
      [](const Tensor& x, nb::handle size) {
        const Pair s = tuple_of<2>(size, "output_size");
        R r;
        return adaptive_avg_pool2d(x, s);
      },
      a("input"), a("output_size"));

  // ---- normalisation ----
  m.def(
      "batch_norm",
      [](const Tensor& x, std::optional<Tensor> rm, std::optional<Tensor> rv, std::optional<Tensor> w,
         std::optional<Tensor> b, bool training, std::optional<double> momentum, double eps) {
        // torch's functional form takes a number too; None (a cumulative average) needs the batch count
        // that only the module keeps.
        if (!momentum)
          type_error(
              "batch_norm: momentum must be a number, got None (the cumulative average, momentum=None, "
              "is nn.BatchNorm's: it counts the batches; here pass 1 / batches seen)");
        check_norm_dtype("batch_norm", x, {&rm, &rv, &w, &b});
        R r;
        return batch_norm(x, opt(rm), opt(rv), opt(w), opt(b), training, *momentum, eps);
      },
      a("input"), a("running_mean").none(), a("running_var").none(), nb::arg("weight") = nb::none(),
      nb::arg("bias") = nb::none(), nb::arg("training") = false, nb::arg("momentum").none() = 0.1,
      nb::arg("eps") = 1e-5);
  m.def(
      "_instance_norm_running",
      [](const Tensor& x, std::optional<Tensor> rm, std::optional<Tensor> rv, std::optional<Tensor> w,
         std::optional<Tensor> b, bool use_input_stats, double momentum, double eps) {
        check_norm_dtype("instance_norm", x, {&rm, &rv, &w, &b});
        return in_input_dtype(
            x, instance_norm_running(x, opt(rm), opt(rv), opt(w), opt(b), use_input_stats, momentum, eps));
      },
      a("input"), a("running_mean").none(), a("running_var").none(), a("weight").none(), a("bias").none(),
      a("use_input_stats"), a("momentum"), a("eps"), nogil);
  m.def(
      "batch_norm_relu",
      [](const Tensor& x, std::optional<Tensor> rm, std::optional<Tensor> rv, std::optional<Tensor> w,
         std::optional<Tensor> b, bool training, double momentum, double eps, std::optional<Tensor> residual) {
        check_norm_dtype("batch_norm", x, {&rm, &rv, &w, &b});
        return batch_norm_relu(x, opt(rm), opt(rv), opt(w), opt(b), training, momentum, eps, opt(residual));
      },
      a("input"), a("running_mean").none(), a("running_var").none(), nb::arg("weight") = nb::none(),
      nb::arg("bias") = nb::none(), nb::arg("training") = false, nb::arg("momentum") = 0.1, nb::arg("eps") = 1e-5,
      nb::arg("residual") = nb::none(), nogil);
  m.def(
      "layer_norm",
      [](const Tensor& x, nb::handle shape, std::optional<Tensor> w, std::optional<Tensor> b, double eps) {
        const Shape s(to_dims(shape, "normalized_shape"));
        check_norm_dtype("layer_norm", x, {&w, &b});
        R r;
        return layer_norm(x, s, opt(w), opt(b), eps);
      },
      a("input"), a("normalized_shape"), nb::arg("weight") = nb::none(), nb::arg("bias") = nb::none(),
      nb::arg("eps") = 1e-5);
  m.def(
      "group_norm",
      [](const Tensor& x, int64_t g, std::optional<Tensor> w, std::optional<Tensor> b, double eps) {
        check_norm_dtype("group_norm", x, {&w, &b});
        return in_input_dtype(x, group_norm(x, g, opt(w), opt(b), eps));
      },
      a("input"), a("num_groups"), nb::arg("weight") = nb::none(), nb::arg("bias") = nb::none(), nb::arg("eps") = 1e-5,
      nogil);
  m.def(
      "instance_norm",
      [](const Tensor& x, std::optional<Tensor> w, std::optional<Tensor> b, double eps) {
        check_norm_dtype("instance_norm", x, {&w, &b});
        return in_input_dtype(x, instance_norm(x, opt(w), opt(b), eps));
      },
      a("input"), nb::arg("weight") = nb::none(), nb::arg("bias") = nb::none(), nb::arg("eps") = 1e-5, nogil);
  m.def(
      "rms_norm",
      [](const Tensor& x, nb::handle shape, std::optional<Tensor> w, std::optional<double> eps) {
        const Shape s(to_dims(shape, "normalized_shape"));
        R r;
        return rms_norm(x, s, opt(w), eps);
      },
      a("input"), a("normalized_shape"), nb::arg("weight") = nb::none(), nb::arg("eps") = nb::none());
  m.def("local_response_norm", &local_response_norm, a("input"), a("size"), nb::arg("alpha") = 1e-4,
        nb::arg("beta") = 0.75, nb::arg("k") = 1.0, nogil);

  // ---- activations ----
  m.def(
      "silu",
      [](Tensor& x, bool inplace) {
        return activation_out("silu", x, inplace, [&](const Tensor& t) { return silu(t); });
      },
      a("input"), nb::arg("inplace") = false);
  m.def(
      "mish",
      [](Tensor& x, bool inplace) {
        return activation_out("mish", x, inplace, [&](const Tensor& t) { return mish(t); });
      },
      a("input"), nb::arg("inplace") = false);
  m.def("softsign", &softsign, a("input"), nogil);
  m.def("logsigmoid", &logsigmoid, a("input"), nogil);
  m.def(
      "selu",
      [](Tensor& x, bool inplace) {
        return activation_out("selu", x, inplace, [&](const Tensor& t) { return selu(t); });
      },
      a("input"), nb::arg("inplace") = false);
  m.def(
      "relu6",
      [](Tensor& x, bool inplace) {
        return activation_out("relu6", x, inplace, [&](const Tensor& t) { return relu6(t); });
      },
      a("input"), nb::arg("inplace") = false);
  m.def(
      "hardsigmoid",
      [](Tensor& x, bool inplace) {
        return activation_out("hardsigmoid", x, inplace, [&](const Tensor& t) { return hardsigmoid(t); });
      },
      a("input"), nb::arg("inplace") = false);
  m.def(
      "hardswish",
      [](Tensor& x, bool inplace) {
        return activation_out("hardswish", x, inplace, [&](const Tensor& t) { return hardswish(t); });
      },
      a("input"), nb::arg("inplace") = false);
  m.def("softplus", &softplus, a("input"), nb::arg("beta") = 1.0, nb::arg("threshold") = 20.0, nogil);
  m.def(
      "leaky_relu",
      [](Tensor& x, double v, bool inplace) {
        return activation_out("leaky_relu", x, inplace, [&](const Tensor& t) { return leaky_relu(t, v); });
      },
      a("input"), nb::arg("negative_slope") = 0.01, nb::arg("inplace") = false);
  m.def(
      "elu",
      [](Tensor& x, double v, bool inplace) {
        return activation_out("elu", x, inplace, [&](const Tensor& t) { return elu(t, v); });
      },
      a("input"), nb::arg("alpha") = 1.0, nb::arg("inplace") = false);
  m.def(
      "celu",
      [](Tensor& x, double v, bool inplace) {
        return activation_out("celu", x, inplace, [&](const Tensor& t) { return celu(t, v); });
      },
      a("input"), nb::arg("alpha") = 1.0, nb::arg("inplace") = false);
  m.def(
      "hardtanh",
      [](Tensor& x, double lo, double hi, bool inplace) {
        return activation_out("hardtanh", x, inplace, [&](const Tensor& t) { return hardtanh(t, lo, hi); });
      },
      a("input"), nb::arg("min_val") = -1.0, nb::arg("max_val") = 1.0, nb::arg("inplace") = false);
  m.def("prelu", &prelu, a("input"), a("weight"), nogil);
  m.def("glu", &glu, a("input"), nb::arg("dim") = -1, nogil);
  m.def("softmax", &softmax, a("input"), a("dim"), nogil);
  m.def("log_softmax", &log_softmax, a("input"), a("dim"), nogil);

  // ---- losses ----
  m.def(
      "cross_entropy",
      [](const Tensor& x, const Tensor& t, std::optional<Tensor> w, int64_t ignore_index, const std::string& red,
         double smoothing) {
        const Reduction r = reduction_of(red);
        R g;
        // Unbatched, as torch: input [C] with a class index [] (or probabilities [C]) is a batch of one.
        if (x.dim() == 1) {
          const Tensor one = cross_entropy_py(x.unsqueeze(0), t.unsqueeze(0), opt(w), ignore_index, r, smoothing);
          return r == Reduction::none ? one.squeeze(0) : one;
        }
        return cross_entropy_py(x, t, opt(w), ignore_index, r, smoothing);
      },
      a("input"), a("target"), nb::arg("weight") = nb::none(), nb::arg("ignore_index") = -100,
      nb::arg("reduction") = "mean", nb::arg("label_smoothing") = 0.0);
  m.def(
      "nll_loss",
      [](const Tensor& x, const Tensor& t, std::optional<Tensor> w, int64_t ignore_index, const std::string& red) {
        const Reduction r = reduction_of(red);
        R g;
        return nll_loss(x, t, ignore_index, r, opt(w));
      },
      a("input"), a("target"), nb::arg("weight") = nb::none(), nb::arg("ignore_index") = -100,
      nb::arg("reduction") = "mean");
  auto loss2 = [&](const char* name, Tensor (*fn)(const Tensor&, const Tensor&, Reduction)) {
    m.def(
        name,
        [fn](const Tensor& x, const Tensor& t, const std::string& red) {
          const Reduction r = reduction_of(red);
          R g;
          return fn(x, t, r);
        },
        nb::arg("input"), nb::arg("target"), nb::arg("reduction") = "mean");
  };
  loss2("mse_loss", [](const Tensor& x, const Tensor& t, Reduction r) { return mse_loss(x, t, r); });
  loss2("l1_loss", [](const Tensor& x, const Tensor& t, Reduction r) { return l1_loss(x, t, r); });
  loss2("binary_cross_entropy_with_logits",
        [](const Tensor& x, const Tensor& t, Reduction r) { return binary_cross_entropy_with_logits(x, t, r); });
  m.def(
      "binary_cross_entropy",
      [](const Tensor& x, const Tensor& t, std::optional<Tensor> w, const std::string& red) {
        const Reduction r = reduction_of(red);
        R g;
        return binary_cross_entropy(x, t, r, opt(w));
      },
      a("input"), a("target"), nb::arg("weight") = nb::none(), nb::arg("reduction") = "mean");
  m.def(
      "smooth_l1_loss",
      [](const Tensor& x, const Tensor& t, const std::string& red, double beta) {
        const Reduction r = reduction_of(red);
        R g;
        return smooth_l1_loss(x, t, r, beta);
      },
      a("input"), a("target"), nb::arg("reduction") = "mean", nb::arg("beta") = 1.0);
  m.def(
      "huber_loss",
      [](const Tensor& x, const Tensor& t, const std::string& red, double delta) {
        const Reduction r = reduction_of(red);
        R g;
        return huber_loss(x, t, r, delta);
      },
      a("input"), a("target"), nb::arg("reduction") = "mean", nb::arg("delta") = 1.0);
  m.def(
      "kl_div",
      [](const Tensor& x, const Tensor& t, const std::string& red, bool log_target) {
        const Reduction r = reduction_of(red);
        R g;
        return kl_div(x, t, r, log_target);
      },
      a("input"), a("target"), nb::arg("reduction") = "mean", nb::arg("log_target") = false);
  m.def(
      "margin_ranking_loss",
      [](const Tensor& x1, const Tensor& x2, const Tensor& y, double margin, const std::string& red) {
        const Reduction r = reduction_of(red);
        R g;
        return margin_ranking_loss(x1, x2, y, margin, r);
      },
      a("input1"), a("input2"), a("target"), nb::arg("margin") = 0.0, nb::arg("reduction") = "mean");
  m.def(
      "cosine_embedding_loss",
      [](const Tensor& x1, const Tensor& x2, const Tensor& y, double margin, const std::string& red) {
        const Reduction r = reduction_of(red);
        R g;
        return cosine_embedding_loss(x1, x2, y, margin, r);
      },
      a("input1"), a("input2"), a("target"), nb::arg("margin") = 0.0, nb::arg("reduction") = "mean");
  m.def(
      "ctc_loss",
      [](const Tensor& lp, const Tensor& targets, nb::handle in_lens, nb::handle tgt_lens, int64_t blank,
         const std::string& red, bool zero_infinity) {
        // Lengths as sequences of ints or as integer tensors (torch accepts both).
        const auto lengths = [](nb::handle h, const char* what) {
          if (nb::isinstance<Tensor>(h)) {
            const Tensor t = nb::cast<Tensor>(h);
            if (!is_integral(t.dtype()) || t.dtype() == DType::boolean || t.dim() > 1)
              value_error(std::string("ctc_loss: ") + what + " must be a 1-D integer tensor, got " + t.type_str());
            return t.values<int64_t>();
          }
          return to_dims(h, what);
        };
        const std::vector<int64_t> il = lengths(in_lens, "input_lengths"), tl = lengths(tgt_lens, "target_lengths");
        const Reduction r = reduction_of(red);
        R g;
        return ctc_loss(lp, targets, il, tl, blank, r, zero_infinity);
      },
      a("log_probs"), a("targets"), a("input_lengths"), a("target_lengths"), nb::arg("blank") = 0,
      nb::arg("reduction") = "mean", nb::arg("zero_infinity") = false);
  m.def("cosine_similarity", &cosine_similarity, a("x1"), a("x2"), nb::arg("dim") = 1, nb::arg("eps") = 1e-8, nogil);

  // ---- embedding, dropout, attention ----
  m.def(
      "embedding",
      [](const Tensor& idx, const Tensor& w, std::optional<int64_t> padding_idx) {
        // PyTorch counts a negative padding_idx from the end (-1: the last row); the C++ API's -1 means none.
        int64_t pad = -1;
        if (padding_idx && w.dim() == 2) {  // another weight shape gets embedding's own error
          const int64_t v = w.size(0);
          KILN_CHECK(*padding_idx >= -v && *padding_idx < v, "embedding: padding_idx ", *padding_idx, " is outside [-",
                     v, ", ", v, ") for weight ", w.type_str());
          pad = *padding_idx < 0 ? *padding_idx + v : *padding_idx;
        }
        return embedding(w, idx, pad);
      },
      a("input"), a("weight"), nb::arg("padding_idx") = nb::none(), nogil);
  m.def(
      "dropout",
      [](Tensor& x, double p, bool training, bool inplace) -> nb::object {
        // torch's dropout_: the input itself, as it was, out of training, for p = 0 or an empty input (a leaf
        // that requires grad included: nothing is written)
        if (!(p >= 0 && p <= 1))  // before the shortcuts: torch checks p out of training too
          value_error("dropout: dropout probability has to be between 0 and 1, but got " + str_of(nb::float_(p)));
        if (inplace && (!training || p == 0 || (x.numel() == 0 && p > 0 && p <= 1))) return nb::find(&x);
        return activation_out("dropout", x, inplace, [&](const Tensor& t) { return dropout(t, p, training); });
      },
      a("input"), nb::arg("p") = 0.5, nb::arg("training") = true, nb::arg("inplace") = false,
      "Zeroes elements with probability p, scaling the rest by 1/(1-p). inplace=True returns the input itself, "
      "as torch: the result is written into it where it needs no gradient (or under kiln.no_grad()); inside a "
      "graph its object is pointed at the result (refused for a leaf that requires grad, as torch, and for a "
      "tensor whose memory a view shares); out of training or with p=0 it is returned as it was.");
  m.def(
      "_activation_into",
      [](const char* op, Tensor& x, const Tensor& out) {
        return activation_out(op, x, true, [&](const Tensor&) { return out; });
      },
      nb::arg("op"), a("input"), nb::arg("out"),
      "inplace=True for an op written in Python (F.dropout1d/2d/3d): puts its out-of-place result `out` into "
      "the input as the activations' inplace= does and returns the input itself.");
  m.def(
      "scaled_dot_product_attention",
      [](const Tensor& q, const Tensor& k, const Tensor& v, std::optional<Tensor> mask, double dropout_p,
         bool is_causal, std::optional<double> scale) {
        AttentionOptions o;
        o.causal = is_causal ? Causal::top_left : Causal::none;
        o.scale = scale;
        o.dropout_p = dropout_p;
        o.training = dropout_p > 0;
        return attention(q, k, v, opt(mask), o).out;  // a bool mask: True takes part (torch's rule)
      },
      a("query"), a("key"), a("value"), nb::arg("attn_mask") = nb::none(), nb::arg("dropout_p") = 0.0,
      nb::arg("is_causal") = false, nb::arg("scale") = nb::none(), nogil,
      "softmax(q k^T * scale + mask) v; a bool mask keeps the True places (as torch); a fully masked row gives zeros.");

  auto causal_of = [](const std::string& c) {
    if (c == "none") return Causal::none;
    if (c == "top_left") return Causal::top_left;
    if (c == "bottom_right") return Causal::bottom_right;
    value_error("causal must be \"none\", \"top_left\" or \"bottom_right\", got \"" + c + "\"");
  };
  m.def(
      "masked_softmax",
      [causal_of](const Tensor& x, std::optional<Tensor> mask, double scale, const std::string& causal) {
        const Causal cz = causal_of(causal);
        R r;
        return masked_softmax(x, opt(mask), scale, cz);
      },
      a("input"), nb::arg("mask") = nb::none(), nb::arg("scale") = 1.0, nb::arg("causal") = "none",
      "softmax(scale * input + mask) over the last dim; mask additive, or bool keeping its True places "
      "(-inf elsewhere, as scaled_dot_product_attention); a row with no place kept gives zeros.");
  m.def(
      "attention",
      [causal_of](const Tensor& q, const Tensor& k, const Tensor& v, std::optional<Tensor> mask,
                  const std::string& causal, std::optional<double> scale, double softcap, double dropout_p,
                  bool training, bool need_weights) -> nb::object {
        AttentionOptions o;
        o.causal = causal_of(causal);
        o.scale = scale;
        o.softcap = softcap;
        o.dropout_p = dropout_p;
        o.training = training;
        AttentionOutput out;
        {
          R r;
          out = attention(q, k, v, opt(mask), o, need_weights);
        }
        if (need_weights) return nb::make_tuple(out.out, out.weights);
        return nb::cast(out.out);
      },
      a("query"), a("key"), a("value"), nb::arg("mask") = nb::none(), nb::kw_only(), nb::arg("causal") = "none",
      nb::arg("scale") = nb::none(), nb::arg("softcap") = 0.0, nb::arg("dropout_p") = 0.0, nb::arg("training") = false,
      nb::arg("need_weights") = false,
      "Kiln's attention with all its options: an additive mask (or bias), or a bool mask keeping its True "
      "places (as scaled_dot_product_attention), a causal mask computed in the "
      "softmax kernel, scale (default 1/sqrt(head size)), softcap; need_weights also returns the weights.");

  // ---- padding, resampling ----
  m.def(
      "pad",
      [](const Tensor& x, nb::handle pad_, const std::string& mode, std::optional<double> value) {
        PadMode pm;
        if (mode == "constant")
          pm = PadMode::constant;
        else if (mode == "reflect")
          pm = PadMode::reflect;
        else if (mode == "replicate")
          pm = PadMode::replicate;
        else if (mode == "circular")
          pm = PadMode::circular;
        else
          value_error("pad: mode must be constant, reflect, replicate or circular, got \"" + mode + "\"");
        // torch's rule: only constant padding has a fill value (a value of 0 passes with the others).
        if (pm != PadMode::constant && value && *value != 0.0)
          value_error("pad: mode \"" + mode +
                      "\" takes no value (only \"constant\" fills), got value=" + std::to_string(*value));
        const std::vector<int64_t> p = to_dims(pad_, "pad");
        R r;
        return pad(x, p, pm, value.value_or(0.0));
      },
      a("input"), a("pad"), nb::arg("mode") = "constant", nb::arg("value") = nb::none());
  m.def(
      "interpolate",
      [](const Tensor& x, nb::handle size, nb::handle scale, const std::string& mode, std::optional<bool> align_corners,
         std::optional<bool> recompute_scale_factor, bool antialias) {
        static const std::pair<const char*, InterpMode> kModes[] = {{"nearest", InterpMode::nearest},
                                                                    {"linear", InterpMode::linear},
                                                                    {"bilinear", InterpMode::bilinear},
                                                                    {"bicubic", InterpMode::bicubic},
                                                                    {"trilinear", InterpMode::trilinear},
                                                                    {"area", InterpMode::area},
                                                                    {"nearest-exact", InterpMode::nearest_exact}};
        std::optional<InterpMode> found;
        for (const auto& [name, m] : kModes)
          if (mode == name) found = m;
        if (!found)
          value_error(
              "interpolate: mode must be nearest, linear, bilinear, bicubic, trilinear, area or nearest-exact, "
              "got \"" +
              mode + "\"");
        const InterpMode im = *found;
        const bool picks = im == InterpMode::nearest || im == InterpMode::area || im == InterpMode::nearest_exact;
        // torch's rule: align_corners (even False) only with the interpolating modes.
        if (picks && align_corners)
          value_error(
              "interpolate: align_corners option can only be set with the interpolating modes: linear | "
              "bilinear | bicubic | trilinear (mode \"" +
              mode + "\")");
        // the rank each mode takes: a NotImplementedError, as torch's (the engine checks it again)
        const int64_t need = im == InterpMode::linear                                  ? 3
                             : im == InterpMode::trilinear                             ? 5
                             : im == InterpMode::bilinear || im == InterpMode::bicubic ? 4
                                                                                       : 0;
        if (need && x.dim() != need)
          not_implemented("interpolate: mode " + mode + " needs " + std::to_string(need) + "-d input, got " +
                          std::to_string(x.dim()) + "-d");
        if (!need && (x.dim() < 3 || x.dim() > 5))
          not_implemented("interpolate: mode " + mode + " needs 3-d, 4-d or 5-d input [N, C, spatial...], got " +
                          std::to_string(x.dim()) + "-d");
        const bool ac = align_corners.value_or(false);
        const size_t nsp = x.dim() >= 2 ? size_t(x.dim() - 2) : 0;
        if (!size.is_none() && !scale.is_none())
          value_error("interpolate: only one of size or scale_factor should be defined");
        if (antialias) {
          if (!((im == InterpMode::bilinear || im == InterpMode::bicubic) && x.dim() == 4))
            value_error("interpolate: antialias is restricted to bilinear and bicubic modes on 4-d input (mode \"" +
                        mode + "\", input of " + std::to_string(x.dim()) + " dims)");
          value_error(
              "interpolate: antialias=True is not implemented in Kiln (antialias=False resamples as torch's "
              "default)");
        }
        if (!size.is_none()) {
          if (recompute_scale_factor.value_or(false))
            value_error("interpolate: recompute_scale_factor is not meaningful with an explicit size");
          // ints, or anything with __index__ (a NumPy integer), one or one per spatial dim, as torch's
          std::vector<int64_t> s;
          if (PySequence_Check(size.ptr())) {
            for (nb::handle v : nb::iter(size)) s.push_back(interp_int(v));
            if (s.size() != nsp)
              value_error("interpolate: size has " + std::to_string(s.size()) + " values for the " +
                          std::to_string(nsp) + " spatial dims of the input (" + std::to_string(x.dim()) + "-d)");
          } else {
            s.assign(nsp, interp_int(size));
          }
          R r;
          return interpolate(x, s, im, ac);
        }
        if (scale.is_none()) value_error("interpolate: give size or scale_factor");
        // numbers (a NumPy float or int too), one or one per spatial dim
        std::vector<double> sf;
        if (!PySequence_Check(scale.ptr())) {
          sf.assign(nsp, to_double(scale, "interpolate: scale_factor"));
        } else {
          for (nb::handle v : nb::iter(scale)) sf.push_back(to_double(v, "interpolate: scale_factor"));
          if (sf.size() != nsp)
            value_error("interpolate: scale_factor has " + std::to_string(sf.size()) + " values for the " +
                        std::to_string(nsp) + " spatial dims of the input (" + std::to_string(x.dim()) + "-d)");
        }
        R r;
        // area is adaptive pooling to the output size: the scale only sizes it, as torch's.
        return interpolate_scale(x, sf, im, ac, recompute_scale_factor.value_or(false) || im == InterpMode::area);
      },
      a("input"), nb::arg("size") = nb::none(), nb::arg("scale_factor") = nb::none(), nb::arg("mode") = "nearest",
      nb::arg("align_corners") = nb::none(), nb::arg("recompute_scale_factor") = nb::none(),
      nb::arg("antialias") = false);
  m.def("pixel_shuffle", &pixel_shuffle, a("input"), a("upscale_factor"), nogil);
  m.def("pixel_unshuffle", &pixel_unshuffle, a("input"), a("downscale_factor"), nogil);
}

// An activation's inplace=True (torch.nn.functional's): where Kiln may change x in place (it needs no
// gradient, or grad mode is off) the result is written into it; inside a graph, where Kiln records no
// in-place op, x is pointed at the result (a non-leaf: its Python object now holds the result and its
// gradient function, as torch's after an in-place op, while its old storage, which the graph may have
// saved, is left as it was). Either way the call returns x itself, so code that uses the result
// (x = F.elu(x, inplace=True)) or ignores it (F.relu(x, inplace=True); return x) computes what torch's
// does. Refused: a leaf that requires grad, as torch refuses it ("a leaf Variable that requires grad is
// being used in an in-place operation"); a result of another dtype (SiLU of an int64 tensor: torch has no
// such in-place kernel, and a copy would truncate the floats); and, inside a graph, an x whose memory
// another tensor shares (a view, or the base of one: torch would write through to it and route its
// gradient, pointing x at the result would leave the other stale).
bool activation_into(const char* op, Tensor& x, bool inplace, const Tensor& out) {
  if (!inplace) return false;
  // relu6 and hardtanh are clamps, which torch runs on integer tensors too (bounds cast to the dtype):
  // the float result copied in, truncated, gives its values.
  const bool clamp_op = std::string_view(op) == "relu6" || std::string_view(op) == "hardtanh";
  KILN_CHECK(out.dtype() == x.dtype() || (clamp_op && is_integral(x.dtype()) && x.dtype() != DType::boolean), op,
             ": inplace=True on ", x.type_str(), " would give a ", dtype_name(out.dtype()),
             " result, which does not fit the input (torch has no in-place kernel for it either); pass inplace=False, "
             "or convert the input first (e.g. x.float())");
  if (GradMode::enabled() && x.requires_grad()) {
    KILN_CHECK(!x.is_leaf(), op, ": inplace=True on a leaf tensor that requires grad ", x.type_str(),
               " (torch refuses it too: a leaf Variable that requires grad is being used in an in-place operation); "
               "pass inplace=False, or do it under kiln.no_grad()");
    // Besides x's own impl, only autograd's saved copies may hold its memory (what _data_shared counts).
    const auto& st = x.storage();
    const long others = st.use_count() - 1 - long(autograd::saved_aliases(x)) - (out.storage() == st ? 1 : 0);
    KILN_CHECK(others <= 0, op, ": inplace=True on ", x.type_str(),
               " inside a graph, whose memory another tensor still holds (a view of it or the tensor it is a view "
               "of, a .detach()/.data alias, or one kept by Python code such as a hook): Kiln records no in-place "
               "op, so that tensor and its gradient would not see the change as torch's do. Use the out-of-place "
               "result (y = F.",
               op,
               "(x), or inplace=False), or drop the other reference first: x = x.view(...); x = act(x) holds no "
               "other, act(x.view(...)) while x is still bound does");
    // x's object becomes the result; the state torch keeps on the object goes with it: retain_grad (torch
    // moves it to the new grad_fn) and the gradient kept so far. Hooks registered on x before stay with the
    // old value's node and see its gradient, as torch's do; requires_grad follows from the result.
    const bool retains = x.retains_grad();
    const std::shared_ptr<TensorImpl> kept = retains ? x.impl().autograd->grad : nullptr;
    x = out;
    if (retains && x.requires_grad() && !x.is_leaf()) {
      x.retain_grad();
      x.impl().autograd->grad = kept;
    }
    return true;
  }
  x.copy_(out);
  return true;
}

}  // namespace kiln::py
