// Neural-network ops over the backend's fused kernels: convolution, pooling, normalisation,
// softmax and cross-entropy. 16-bit inputs compute in f32 and return their own dtype.
#include <algorithm>
#include <cmath>
#include <limits>

#include "engine/autocast.h"
#include "engine/autograd.h"
#include "engine/internal.h"
#include "engine/nn_ops.h"

namespace kiln {
namespace {

DType compute_dtype(DType t) { return t == DType::f64 ? DType::f64 : DType::f32; }

// A detached, dense copy (or view) in the kernel's dtype and layout.
Tensor kin(const Tensor& t, DType dt, MemoryFormat format = MemoryFormat::contiguous) {
  Tensor x = t.detach();
  if (x.dtype() != dt) x = x.to(dt);
  return x.contiguous(format);
}
Tensor kout(const Shape& shape, DType dt, Device dev, MemoryFormat format = MemoryFormat::contiguous) {
  return make_tensor(shape, dt, dev, format);
}
// A kernel input kept for backward as the tensor itself (its history serves a backward with
// create_graph), its kernel copy made again in backward when the forward needed one (a dtype or
// layout conversion): never the copy beside the tensor, and no more memory than the copy alone.
class Kept {
 public:
  Kept() = default;
  Kept(const Tensor& t, DType dt, MemoryFormat fmt = MemoryFormat::contiguous) : t_(t), dt_(dt), fmt_(fmt) {}
  Tensor kernel(const char* op) const { return kin(t_.unpack(op), dt_, fmt_); }
  Tensor history(const char* op) const { return t_.unpack(op); }

 private:
  SavedTensor t_;
  DType dt_ = DType::f32;
  MemoryFormat fmt_ = MemoryFormat::contiguous;
};
// The layout a 4-D op keeps: channels_last in, channels_last out.
MemoryFormat layout_of(const Tensor& x) { return x.is_channels_last() ? MemoryFormat::channels_last : MemoryFormat::contiguous; }
// Whether the backend runs a channels_last op on channels_last buffers (else it gets NCHW copies).
bool runs_channels_last(const Tensor& x, Device dev, DType ct) {
  return x.is_channels_last() && detail::backend(dev).native_channels_last && ct != DType::f64;
}
Tensor back_to(const Tensor& t, DType dt) { return t.dtype() == dt ? t : t.to(dt); }
const void* ptr_or_null(const Tensor& t) { return t.defined() ? t.raw_data() : nullptr; }
void* out_or_null(Tensor& t) { return t.defined() ? t.raw_data() : nullptr; }

void check_floating(const char* op, const Tensor& t, const char* what) {
  KILN_CHECK(t.defined() && is_floating(t.dtype()), op, ": ", what, " must be a floating tensor, got ",
             t.defined() ? t.type_str() : "undefined");
}

int64_t conv_out(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d) { return (in + 2 * p - d * (k - 1) - 1) / s + 1; }

// The output_padding that makes conv_transpose2d, the adjoint of the convolution p describes, give
// that convolution's input size back (the rows a stride leaves unread at the end).
Pair conv_output_padding(const Conv2dParams& p) {
  return {p.h - ((p.oh - 1) * p.sh - 2 * p.ph + p.dh * (p.kh - 1) + 1),
          p.w - ((p.ow - 1) * p.sw - 2 * p.pw + p.dw * (p.kw - 1) + 1)};
}

// The weight gradient of the convolution p describes, for input x [N, C, H, W] and output gradient g
// [N, O, OH, OW]: [O, C/groups, kh, kw]. Only a backward with create_graph calls it (the ordinary one
// calls the kernel with the input gradient's). It is bilinear, so its own backward is convolutions:
// d/dx = conv_transpose2d(g, G), d/dg = conv2d(x, G), recorded again for higher derivatives.
Tensor conv2d_weight_grad(const Tensor& x, const Tensor& g, Conv2dParams p) {
  const Device dev = detail::common_device("conv2d_weight_grad", {x, g});
  const DType out_t = promote_types(x.dtype(), g.dtype());
  const DType ct =
      is_low_precision(out_t) && detail::backend(dev).native_16bit_gemm_conv ? out_t : compute_dtype(out_t);
  p.nhwc = false;
  const Tensor xc = kin(x, ct), gc = kin(g, ct);
  Tensor gw = kout({p.o, p.c / p.groups, p.kh, p.kw}, ct, dev);
  // The weight-gradient pass reads no weight; gw (being written) stands in for it.
  detail::backend(dev).conv2d_backward(ct, p, xc.raw_data(), gw.raw_data(), gc.raw_data(), nullptr, gw.raw_data());
  gw = back_to(gw, out_t);
  if (autograd::needs_grad({x, g})) {
    SavedTensor sx(x), sg(g);
    autograd::record("conv2d_weight_grad", {x, g}, {gw}, [sx, sg, p](const GradCtx& c) -> std::vector<Tensor> {
      const Tensor xs = sx.unpack("conv2d_weight_grad"), gs = sg.unpack("conv2d_weight_grad");
      const Tensor gx = c.needs_grad(0) ? conv_transpose2d(gs, c.g(), Tensor(), {p.sh, p.sw}, {p.ph, p.pw},
                                                           conv_output_padding(p), p.groups, {p.dh, p.dw})
                                        : Tensor();
      const Tensor gg =
          c.needs_grad(1) ? conv2d(xs, c.g(), Tensor(), {p.sh, p.sw}, {p.ph, p.pw}, {p.dh, p.dw}, p.groups) : Tensor();
      return {gx, gg};
    });
  }
  return gw;
}

}  // namespace

// ---- conv2d ---------------------------------------------------------------------------------------

Tensor conv2d(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in, Pair stride, Pair padding,
              Pair dilation, int64_t groups) {
  using amp::AutocastOp;
  const Tensor x = amp::autocast_arg(AutocastOp::conv2d, x_in), weight = amp::autocast_arg(AutocastOp::conv2d, weight_in),
               bias = amp::autocast_arg(AutocastOp::conv2d, bias_in);
  check_floating("conv2d", x, "input");
  check_floating("conv2d", weight, "weight");
  KILN_CHECK(x.dim() == 4, "conv2d: input must be [N, C, H, W], got ", x.shape());
  KILN_CHECK(weight.dim() == 4, "conv2d: weight must be [O, C/groups, kh, kw], got ", weight.shape());
  KILN_CHECK(groups >= 1 && x.size(1) % groups == 0 && weight.size(0) % groups == 0, "conv2d: groups ", groups,
             " must divide input channels ", x.size(1), " and output channels ", weight.size(0));
  KILN_CHECK(weight.size(1) * groups == x.size(1), "conv2d: input ", x.shape(), " has ", x.size(1),
             " channels but weight ", weight.shape(), " expects ", weight.size(1) * groups);
  KILN_CHECK(stride[0] >= 1 && stride[1] >= 1 && dilation[0] >= 1 && dilation[1] >= 1 && padding[0] >= 0 &&
                 padding[1] >= 0,
             "conv2d: stride and dilation must be >= 1 and padding >= 0");
  if (bias.defined())
    KILN_CHECK(bias.dim() == 1 && bias.size(0) == weight.size(0), "conv2d: bias ", bias.shape(), " must be [",
               weight.size(0), "]");
  Conv2dParams p{x.size(0), x.size(1), x.size(2), x.size(3), weight.size(0), weight.size(2), weight.size(3),
                 stride[0], stride[1], padding[0], padding[1], dilation[0], dilation[1], groups, 0, 0};
  p.oh = conv_out(p.h, p.kh, p.sh, p.ph, p.dh);
  p.ow = conv_out(p.w, p.kw, p.sw, p.pw, p.dw);
  KILN_CHECK(p.oh > 0 && p.ow > 0, "conv2d: input ", x.shape(), " is too small for kernel ", weight.shape(),
             " with padding [", p.ph, ",", p.pw, "] and dilation [", p.dh, ",", p.dw, "]");
  const Device dev = detail::common_device("conv2d", {x, weight});
  const DType out_t = promote_types(x.dtype(), weight.dtype());
  const DType ct = is_low_precision(out_t) && detail::backend(dev).native_16bit_gemm_conv ? out_t : compute_dtype(out_t);
  // A channels_last input gives a channels_last output (and input gradient). cuDNN computes on
  // NHWC buffers with the filters copied to KRSC for the call; the CPU computes NCHW copies.
  const MemoryFormat out_fmt = layout_of(x);
  const bool nhwc = runs_channels_last(x, dev, ct);
  const MemoryFormat fmt = nhwc ? MemoryFormat::channels_last : MemoryFormat::contiguous;
  p.nhwc = nhwc;
  const Tensor xc = kin(x, ct, fmt), wc = kin(weight, ct, fmt), bc = bias.defined() ? kin(bias, ct) : Tensor();
  Tensor y = kout({p.n, p.o, p.oh, p.ow}, ct, dev, fmt);
  detail::backend(dev).conv2d_forward(ct, p, xc.raw_data(), wc.raw_data(), ptr_or_null(bc), y.raw_data());
  y = back_to(y.contiguous(out_fmt), out_t);
  if (autograd::needs_grad({x, weight, bias})) {
    const Kept kx(x, ct, fmt), kw(weight, ct, fmt);
    autograd::record(
        "conv2d", {x, weight, bias}, {y},
        [kx, kw, p, ct, dev, fmt, out_fmt](const GradCtx& c) -> std::vector<Tensor> {
          if (GradMode::enabled()) {  // a backward with create_graph: the same gradients from recorded convolutions
            const Tensor xh = kx.history("conv2d"), wh = kw.history("conv2d");
            if (autograd::needs_grad({c.g(), xh, wh})) {
              const Tensor gx = c.needs_grad(0) ? conv_transpose2d(c.g(), wh, Tensor(), {p.sh, p.sw}, {p.ph, p.pw},
                                                                   conv_output_padding(p), p.groups, {p.dh, p.dw})
                                                : Tensor();
              const Tensor gw = c.needs_grad(1) ? conv2d_weight_grad(xh, c.g(), p) : Tensor();
              return {gx, gw, c.needs_grad(2) ? sum(c.g(), {0, 2, 3}) : Tensor()};
            }
          }
          const Tensor xs = kx.kernel("conv2d"), ws = kw.kernel("conv2d");
          const Tensor g = kin(c.g(), ct, fmt);
          Tensor gx = c.needs_grad(0) ? kout(xs.shape(), ct, dev, fmt) : Tensor();
          Tensor gw = c.needs_grad(1) ? kout(ws.shape(), ct, dev, fmt) : Tensor();
          if (gx.defined() || gw.defined())
            detail::backend(dev).conv2d_backward(ct, p, xs.raw_data(), ws.raw_data(), g.raw_data(),
                                                 gx.defined() ? gx.raw_data() : nullptr,
                                                 gw.defined() ? gw.raw_data() : nullptr);
          Tensor gb = c.needs_grad(2) ? sum(g, {0, 2, 3}) : Tensor();
          // The weight gradient in the parameters' own (NCHW) layout, the input's in the input's.
          if (gw.defined()) gw = gw.contiguous();
          if (gx.defined()) gx = gx.contiguous(out_fmt);
          return {gx, gw, gb};
        });
  }
  return y;
}

// The adjoint of conv2d: x [N, C_in, H, W] is the output gradient of a convolution whose input y
// [N, C_out, H', W'] it computes (conv2d's input-gradient kernel), weight [C_in, C_out/groups, kh, kw]
// is that convolution's filter, unchanged. Backward: gx = conv2d(gy, weight), gw = conv2d's weight
// gradient with gy as the input and x as the output gradient.
Tensor conv_transpose2d(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in, Pair stride, Pair padding,
                        Pair output_padding, int64_t groups, Pair dilation) {
  using amp::AutocastOp;
  const Tensor x = amp::autocast_arg(AutocastOp::conv2d, x_in),
               weight = amp::autocast_arg(AutocastOp::conv2d, weight_in),
               bias = amp::autocast_arg(AutocastOp::conv2d, bias_in);
  const char* op = "conv_transpose2d";
  check_floating(op, x, "input");
  check_floating(op, weight, "weight");
  KILN_CHECK(x.dim() == 4, op, ": input must be [N, C, H, W], got ", x.shape());
  KILN_CHECK(weight.dim() == 4, op, ": weight must be [C_in, C_out/groups, kh, kw], got ", weight.shape());
  KILN_CHECK(groups >= 1 && weight.size(0) % groups == 0, op, ": groups ", groups, " must divide input channels ",
             weight.size(0));
  KILN_CHECK(weight.size(0) == x.size(1), op, ": input ", x.shape(), " has ", x.size(1), " channels but weight ",
             weight.shape(), " expects ", weight.size(0));
  for (int i = 0; i < 2; ++i) {
    KILN_CHECK(stride[i] >= 1 && dilation[i] >= 1 && padding[i] >= 0, op,
               ": stride and dilation must be >= 1 and padding >= 0");
    KILN_CHECK(output_padding[i] >= 0 && output_padding[i] < std::max(stride[i], dilation[i]), op, ": output_padding [",
               output_padding[0], ",", output_padding[1], "] must be >= 0 and smaller than the stride [", stride[0],
               ",", stride[1], "] or the dilation [", dilation[0], ",", dilation[1], "] (PyTorch's rule)");
  }
  const int64_t c_out = weight.size(1) * groups;
  if (bias.defined())
    KILN_CHECK(bias.dim() == 1 && bias.size(0) == c_out, op, ": bias ", bias.shape(), " must be [", c_out, "]");
  // output_padding of a stride or more (which a larger dilation allows) is past the rows the adjoint
  // convolution reaches (cuDNN refuses such an output size). The whole transpose (no padding, no
  // output_padding), output_padding zero rows (columns) after it, then the rows [padding, padding +
  // out) of that: the rows padding crops at the end hold data, which a cut-down output_padding and
  // zeros after it would lose. Then the bias over all of it, as PyTorch's.
  if (output_padding[0] >= stride[0] || output_padding[1] >= stride[1]) {
    Tensor y = conv_transpose2d(x_in, weight_in, Tensor(), stride, {0, 0}, {0, 0}, groups, dilation);
    y = pad(y, {0, output_padding[1], 0, output_padding[0]});
    for (int i = 0; i < 2; ++i) {
      const int64_t out = y.size(2 + i) - 2 * padding[i];  // the whole transpose + output_padding - 2 padding
      KILN_CHECK(out > 0, op, ": input ", x.shape(), " with kernel ", weight.shape(), ", stride [", stride[0], ",",
                 stride[1], "] and padding [", padding[0], ",", padding[1], "] gives an empty output");
      y = y.narrow(2 + i, padding[i], out);
    }
    if (bias.defined()) y = y + (bias.dtype() == y.dtype() ? bias : cast(bias, y.dtype())).reshape({1, c_out, 1, 1});
    return y;
  }
  auto out_size = [&](int i) {
    return (x.size(2 + i) - 1) * stride[i] - 2 * padding[i] + dilation[i] * (weight.size(2 + i) - 1) +
           output_padding[i] + 1;
  };
  // The convolution y -> x that this op is the adjoint of.
  Conv2dParams p{x.size(0),      c_out,     out_size(0), out_size(1), weight.size(0), weight.size(2),
                 weight.size(3), stride[0], stride[1],   padding[0],  padding[1],     dilation[0],
                 dilation[1],    groups,    x.size(2),   x.size(3)};
  KILN_CHECK(p.h > 0 && p.w > 0, op, ": input ", x.shape(), " with kernel ", weight.shape(), ", stride [", stride[0],
             ",", stride[1], "] and padding [", padding[0], ",", padding[1], "] gives an empty output (", p.h, "x", p.w,
             ")");
  const Device dev = detail::common_device(op, {x, weight});
  const DType out_t = promote_types(x.dtype(), weight.dtype());
  const DType ct =
      is_low_precision(out_t) && detail::backend(dev).native_16bit_gemm_conv ? out_t : compute_dtype(out_t);
  const Tensor xc = kin(x, ct), wc = kin(weight, ct);
  // On CUDA (16-bit cuDNN) the bias is added to the 16-bit output, rounding twice, as conv2d's there
  // and torch's on CUDA; on the CPU the pass computes in f32 and the bias is added before the one cast.
  Tensor y = kout({p.n, p.c, p.h, p.w}, ct, dev);
  // The input-gradient pass reads no input; y (being written) stands in for it.
  detail::backend(dev).conv2d_backward(ct, p, y.raw_data(), wc.raw_data(), xc.raw_data(), y.raw_data(), nullptr);
  if (bias.defined()) y = y + kin(bias, ct).reshape({1, c_out, 1, 1});
  y = back_to(y, out_t);
  if (autograd::needs_grad({x, weight, bias})) {
    const Kept kx(x, ct), kw(weight, ct);
    autograd::record(op, {x, weight, bias}, {y}, [kx, kw, p, ct, dev](const GradCtx& c) -> std::vector<Tensor> {
      if (GradMode::enabled()) {  // a backward with create_graph: the same gradients from recorded convolutions
        const Tensor xh = kx.history("conv_transpose2d"), wh = kw.history("conv_transpose2d");
        if (autograd::needs_grad({c.g(), xh, wh})) {
          // c.g() is the input of the convolution p describes, x its output gradient.
          const Tensor gx = c.needs_grad(0)
                                ? conv2d(c.g(), wh, Tensor(), {p.sh, p.sw}, {p.ph, p.pw}, {p.dh, p.dw}, p.groups)
                                : Tensor();
          const Tensor gw = c.needs_grad(1) ? conv2d_weight_grad(c.g(), xh, p) : Tensor();
          return {gx, gw, c.needs_grad(2) ? sum(c.g(), {0, 2, 3}) : Tensor()};
        }
      }
      const Tensor xs = kx.kernel("conv_transpose2d"), ws = kw.kernel("conv_transpose2d");
      const Tensor g = kin(c.g(), ct);
      Tensor gx, gw;
      if (c.needs_grad(0)) {
        gx = kout(xs.shape(), ct, dev);
        detail::backend(dev).conv2d_forward(ct, p, g.raw_data(), ws.raw_data(), nullptr, gx.raw_data());
      }
      if (c.needs_grad(1)) {
        gw = kout(ws.shape(), ct, dev);
        detail::backend(dev).conv2d_backward(ct, p, g.raw_data(), ws.raw_data(), xs.raw_data(), nullptr, gw.raw_data());
      }
      Tensor gb = c.needs_grad(2) ? sum(g, {0, 2, 3}) : Tensor();
      return {gx, gw, gb};
    });
  }
  return y;
}

// ---- pooling --------------------------------------------------------------------------------------

namespace {
// Output size of a pooling dim: floor, or ceil mode (PyTorch's rule: a last window that would
// start in the right padding is dropped).
int64_t pool_out(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d, bool ceil_mode) {
  const int64_t span = in + 2 * p - d * (k - 1) - 1;
  if (span < 0) return 0;
  int64_t out = (ceil_mode ? (span + s - 1) / s : span / s) + 1;
  if (ceil_mode && (out - 1) * s >= in + p) --out;
  return out;
}

Pool2dParams pool_params(const char* op, const Tensor& x, Pair kernel, Pair stride, Pair padding, Pair dilation,
                         bool ceil_mode) {
  KILN_CHECK(x.dim() == 4 || x.dim() == 3, op, ": input must be [N, C, H, W] or [C, H, W], got ", x.shape());
  if (stride[0] == 0 && stride[1] == 0) stride = kernel;
  KILN_CHECK(kernel[0] >= 1 && kernel[1] >= 1 && stride[0] >= 1 && stride[1] >= 1 && dilation[0] >= 1 &&
                 dilation[1] >= 1,
             op, ": kernel, stride and dilation must be >= 1");
  KILN_CHECK(padding[0] >= 0 && padding[1] >= 0 && 2 * padding[0] <= kernel[0] && 2 * padding[1] <= kernel[1], op,
             ": padding [", padding[0], ",", padding[1], "] must be at most half the kernel [", kernel[0], ",",
             kernel[1], "]");
  Pool2dParams p{};
  p.h = x.size(-2);
  p.w = x.size(-1);
  p.planes = x.numel() / std::max<int64_t>(p.h * p.w, 1);
  p.kh = kernel[0];
  p.kw = kernel[1];
  p.sh = stride[0];
  p.sw = stride[1];
  p.ph = padding[0];
  p.pw = padding[1];
  p.dh = dilation[0];
  p.dw = dilation[1];
  p.oh = pool_out(p.h, p.kh, p.sh, p.ph, p.dh, ceil_mode);
  p.ow = pool_out(p.w, p.kw, p.sw, p.pw, p.dw, ceil_mode);
  KILN_CHECK(p.oh > 0 && p.ow > 0, op, ": input ", x.shape(), " is too small for kernel [", p.kh, ",", p.kw, "]");
  return p;
}

Shape pooled_shape(const Tensor& x, const Pool2dParams& p) {
  Shape s = x.shape();
  s[s.size() - 2] = p.oh;
  s[s.size() - 1] = p.ow;
  return s;
}

Tensor avg_pool_impl(const char* name, const Tensor& x, const Pool2dParams& p);

// Average pooling's backward, recorded: only a backward with create_graph calls it. It is linear, its
// adjoint the pooling itself, so its own backward is the forward op (named `name`) on the gradient.
Tensor avg_pool_backward(const char* name, const Tensor& g, const Pool2dParams& p, const Shape& in_shape) {
  const Device dev = g.device();
  const DType ct = compute_dtype(g.dtype());
  const Tensor gc = kin(g, ct);
  Tensor gx = kout(in_shape, ct, dev);
  detail::backend(dev).avg_pool2d_backward(ct, p, gc.raw_data(), gx.raw_data());
  gx = back_to(gx, g.dtype());
  if (autograd::needs_grad({g}))
    autograd::record("avg_pool2d_backward", {g}, {gx},
                     [name, p](const GradCtx& c) -> std::vector<Tensor> { return {avg_pool_impl(name, c.g(), p)}; });
  return gx;
}

Tensor avg_pool_impl(const char* name, const Tensor& x, const Pool2dParams& p) {
  const Device dev = x.device();
  const DType ct = compute_dtype(x.dtype());
  const Tensor xc = kin(x, ct);
  Tensor y = kout(pooled_shape(x, p), ct, dev);
  detail::backend(dev).avg_pool2d_forward(ct, p, xc.raw_data(), y.raw_data());
  // Pooling kernels take NCHW planes; a channels_last input gets channels_last results back.
  const MemoryFormat fmt = layout_of(x);
  y = back_to(y.contiguous(fmt), x.dtype());
  if (autograd::needs_grad({x})) {
    const Shape in_shape = x.shape();
    autograd::record(name, {x}, {y}, [name, p, ct, dev, in_shape, fmt](const GradCtx& c) -> std::vector<Tensor> {
      // A backward with create_graph: recorded, so that it can be differentiated again.
      if (autograd::needs_grad({c.g()})) return {avg_pool_backward(name, c.g(), p, in_shape).contiguous(fmt)};
      const Tensor g = kin(c.g(), ct);
      Tensor gx = kout(in_shape, ct, dev);
      detail::backend(dev).avg_pool2d_backward(ct, p, g.raw_data(), gx.raw_data());
      return {gx.contiguous(fmt)};
    });
  }
  return y;
}
}  // namespace

ValuesIndices max_pool2d_with_indices(const Tensor& x, Pair kernel, Pair stride, Pair padding, Pair dilation,
                                      bool ceil_mode) {
  check_floating("max_pool2d", x, "input");
  const Pool2dParams p = pool_params("max_pool2d", x, kernel, stride, padding, dilation, ceil_mode);
  const Device dev = x.device();
  const DType ct = compute_dtype(x.dtype());
  const Tensor xc = kin(x, ct);
  Tensor y = kout(pooled_shape(x, p), ct, dev);
  Tensor idx = kout(pooled_shape(x, p), DType::i64, dev);
  detail::backend(dev).max_pool2d_forward(ct, p, xc.raw_data(), y.raw_data(), idx.data<int64_t>());
  // Pooling kernels take NCHW planes; a channels_last input gets channels_last results back.
  const MemoryFormat fmt = layout_of(x);
  y = back_to(y.contiguous(fmt), x.dtype());
  if (autograd::needs_grad({x})) {
    const Shape in_shape = x.shape();
    autograd::record("max_pool2d", {x}, {y}, [p, ct, dev, in_shape, idx, fmt](const GradCtx& c) -> std::vector<Tensor> {
      if (autograd::needs_grad({c.g()})) {
        // A backward with create_graph: g scattered to each window's argmax (an index into its plane; -1,
        // an empty window's, takes nothing) by recorded ops, whose own backward gathers.
        const Tensor flat = idx.reshape({p.planes, p.oh * p.ow});
        const Tensor valid = ge(flat, scalar_like(0, flat));
        const Tensor g = where(valid, c.g().reshape({p.planes, p.oh * p.ow}), zeros_like(flat).to(c.g().dtype()));
        const Tensor gx = scatter_add(zeros({p.planes, p.h * p.w}, TensorOptions(g.dtype(), g.device())), 1,
                                      where(valid, flat, zeros_like(flat)), g);
        return {gx.reshape(in_shape).contiguous(fmt)};
      }
      const Tensor g = kin(c.g(), ct);
      Tensor gx = kout(in_shape, ct, dev);
      detail::backend(dev).max_pool2d_backward(ct, p, g.raw_data(), idx.data<int64_t>(), gx.raw_data());
      return {gx.contiguous(fmt)};
    });
  }
  return {y, idx};
}

Tensor max_pool2d(const Tensor& x, Pair kernel, Pair stride, Pair padding, Pair dilation, bool ceil_mode) {
  return max_pool2d_with_indices(x, kernel, stride, padding, dilation, ceil_mode).values;
}

Tensor avg_pool2d(const Tensor& x, Pair kernel, Pair stride, Pair padding, bool count_include_pad, bool ceil_mode,
                  int64_t divisor_override) {
  check_floating("avg_pool2d", x, "input");
  KILN_CHECK(divisor_override >= 0, "avg_pool2d: divisor_override must be positive (0: none), got ", divisor_override);
  Pool2dParams p = pool_params("avg_pool2d", x, kernel, stride, padding, {1, 1}, ceil_mode);
  p.count_include_pad = count_include_pad;
  p.divisor = divisor_override;
  return avg_pool_impl("avg_pool2d", x, p);
}

Tensor adaptive_avg_pool2d(const Tensor& x, Pair out) {
  check_floating("adaptive_avg_pool2d", x, "input");
  KILN_CHECK(x.dim() == 4 || x.dim() == 3, "adaptive_avg_pool2d: input must be [N, C, H, W] or [C, H, W], got ",
             x.shape());
  KILN_CHECK(out[0] >= 1 && out[1] >= 1, "adaptive_avg_pool2d: output size must be >= 1");
  Pool2dParams p{};
  p.h = x.size(-2);
  p.w = x.size(-1);
  KILN_CHECK(p.h >= 1 && p.w >= 1, "adaptive_avg_pool2d: empty input ", x.shape());
  p.planes = x.numel() / (p.h * p.w);
  p.oh = out[0];
  p.ow = out[1];
  p.adaptive = true;
  return avg_pool_impl("adaptive_avg_pool2d", x, p);
}

// ---- normalisation -------------------------------------------------------------------------------

namespace {

// batch_norm's backward from recorded ops, for a backward with create_graph: x (with its history),
// gamma (undefined: 1), g, and the forward's ReLU output y (undefined: no ReLU; a mask, constant).
// Training normalises with x's batch statistics, recomputed here (torch's formula: gx = rstd (gxhat -
// mean(gxhat) - xhat mean(gxhat xhat))); eval with the running ones, constants the forward kept.
std::vector<Tensor> batch_norm_backward_recorded(const GradCtx& cx, const Tensor& x, const Tensor& gamma,
                                                 const Tensor& y, const Tensor& mean_c, const Tensor& rstd_c,
                                                 bool training, double eps) {
  // In f32 at least, as the kernel and the other recorded forms (16-bit statistics lose digits).
  const DType t = promote_types(promote_types(cx.g().dtype(), x.dtype()), DType::f32);
  const Tensor xt = back_to(x, t);
  std::vector<int64_t> red = {0};
  Shape per_channel(size_t(xt.dim()), 1);
  per_channel[1] = xt.size(1);
  for (int64_t d = 2; d < xt.dim(); ++d) red.push_back(d);
  Tensor mu, rs;
  if (training) {
    mu = mean(xt, red, true);
    const Tensor dev = xt - mu;
    rs = rsqrt(mean(dev * dev, red, true) + eps);
  } else {
    mu = back_to(mean_c, t).reshape(per_channel);
    rs = back_to(rstd_c, t).reshape(per_channel);
  }
  const Tensor xhat = (xt - mu) * rs;
  Tensor gz = back_to(cx.g(), t);
  if (y.defined()) gz = where(gt(y, scalar_like(0, y)), gz, zeros_like(gz));
  Tensor gx, gg, gb, gr;
  if (cx.needs_grad(0)) {
    const Tensor gxhat = gamma.defined() ? gz * back_to(gamma, t).reshape(per_channel) : gz;
    gx = training ? (gxhat - mean(gxhat, red, true) - xhat * mean(gxhat * xhat, red, true)) * rs : gxhat * rs;
  }
  if (cx.needs_grad(1)) gg = sum(gz * xhat, red);
  if (cx.needs_grad(2)) gb = sum(gz, red);
  if (cx.needs_grad(3)) gr = gz;
  return {gx, gg, gb, gr};
}

// batch_norm, and with relu (batch_norm_relu) relu(batch_norm(x) + residual): one kernel call each way.
Tensor batch_norm_impl(const char* op, const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                       const Tensor& gamma, const Tensor& beta, bool training, double momentum, double eps,
                       const Tensor& residual, bool relu) {
  check_floating(op, x, "input");
  KILN_CHECK(x.dim() >= 2, op, ": input must be [N, C, ...], got ", x.shape());
  if (residual.defined()) {
    check_floating(op, residual, "residual");
    KILN_CHECK(residual.shape() == x.shape(), op, ": residual must have the input's shape ", x.shape(), ", got ",
               residual.shape());
    KILN_CHECK(residual.device() == x.device(), op, ": residual is on ", residual.device().str(), ", input on ",
               x.device().str());
  }
  const int64_t n = x.size(0), c = x.size(1), hw = x.numel() / std::max<int64_t>(n * c, 1);
  for (const Tensor* t : {&running_mean, &running_var, &gamma, &beta})
    if (t->defined())
      KILN_CHECK(t->dim() == 1 && t->size(0) == c, op, ": per-channel tensors must be [", c, "], got ", t->shape());
  KILN_CHECK(training || (running_mean.defined() && running_var.defined()), op,
             ": eval mode needs running_mean and running_var");
  if (training) KILN_CHECK(n * hw > 1, op, ": training needs more than one value per channel, got input ", x.shape());
  const Device dev = x.device();
  const DType ct = compute_dtype(x.dtype());
  // channels_last in, channels_last out: cuDNN normalises NHWC buffers, the CPU NCHW copies.
  const MemoryFormat out_fmt = layout_of(x);
  const bool nhwc = runs_channels_last(x, dev, ct);
  const MemoryFormat fmt = nhwc ? MemoryFormat::channels_last : MemoryFormat::contiguous;
  const Tensor xc = kin(x, ct, fmt);
  const Tensor gc = gamma.defined() ? kin(gamma, ct) : Tensor(), bc = beta.defined() ? kin(beta, ct) : Tensor();
  // The residual is added in the compute dtype, before y is rounded to x's.
  const Tensor rc = residual.defined() ? kin(residual, ct, fmt) : Tensor();
  // Running statistics are updated in place in the caller's tensors (a temporary when their dtype differs).
  Tensor rm = running_mean, rv = running_var;
  const bool rm_direct = rm.defined() && rm.dtype() == ct && rm.is_contiguous();
  const bool rv_direct = rv.defined() && rv.dtype() == ct && rv.is_contiguous();
  if (rm.defined() && !rm_direct) rm = kin(rm, ct).clone();
  if (rv.defined() && !rv_direct) rv = kin(rv, ct).clone();
  Tensor y = kout(x.shape(), ct, dev, fmt), mean = kout({c}, ct, dev), rstd = kout({c}, ct, dev);
  detail::backend(dev).batch_norm_forward(ct, n, c, hw, eps, momentum, training, xc.raw_data(), ptr_or_null(gc),
                                          ptr_or_null(bc), rm.defined() ? rm.raw_data() : nullptr,
                                          rv.defined() ? rv.raw_data() : nullptr, y.raw_data(), mean.raw_data(),
                                          rstd.raw_data(), nhwc, ptr_or_null(rc), relu);
  if (training) {
    NoGradGuard ng;
    if (running_mean.defined()) {
      if (rm_direct) {
        running_mean.bump_version();
      } else {
        Tensor(running_mean).copy_(rm);
      }
    }
    if (running_var.defined()) {
      if (rv_direct) {
        running_var.bump_version();
      } else {
        Tensor(running_var).copy_(rv);
      }
    }
  }
  const Tensor yc = y;  // in the compute dtype and layout: the ReLU mask of the backward
  y = back_to(y.contiguous(out_fmt), x.dtype());
  if (autograd::needs_grad({x, gamma, beta, residual})) {
    // hg: gamma itself (its history), for a backward with create_graph (gc is its kernel copy).
    const Kept kx(x, ct, fmt);
    SavedTensor sy(relu ? yc : Tensor()), hg(gamma);
    autograd::record(op, {x, gamma, beta, residual}, {y},
                     [op, kx, sy, hg, gc, mean, rstd, n, c, hw, training, eps, ct, dev, nhwc, fmt,
                      out_fmt](const GradCtx& cx) -> std::vector<Tensor> {
                       if (GradMode::enabled()) {  // a backward with create_graph: recorded
                         const Tensor xh = kx.history(op), gh = hg.unpack(op);
                         if (autograd::needs_grad({cx.g(), xh, gh})) {
                           const Tensor mask = sy.defined() ? sy.unpack(op).detach() : Tensor();
                           return batch_norm_backward_recorded(cx, xh, gh, mask, mean, rstd, training, eps);
                         }
                       }
                       const Tensor xs = kx.kernel(op);
                       const Tensor ys = sy.defined() ? sy.unpack(op) : Tensor();
                       const Tensor g = kin(cx.g(), ct, fmt);
                       Tensor gx = cx.needs_grad(0) ? kout(xs.shape(), ct, dev, fmt) : Tensor();
                       Tensor gg = cx.needs_grad(1) ? kout({c}, ct, dev) : Tensor();
                       Tensor gb = cx.needs_grad(2) ? kout({c}, ct, dev) : Tensor();
                       Tensor gr = cx.needs_grad(3) ? kout(xs.shape(), ct, dev, fmt) : Tensor();
                       detail::backend(dev).batch_norm_backward(
                           ct, n, c, hw, training, eps, xs.raw_data(), ptr_or_null(gc), mean.raw_data(),
                           rstd.raw_data(), g.raw_data(), out_or_null(gx), out_or_null(gg), out_or_null(gb), nhwc,
                           ptr_or_null(ys), out_or_null(gr));
                       if (gx.defined()) gx = gx.contiguous(out_fmt);
                       if (gr.defined()) gr = gr.contiguous(out_fmt);
                       return {gx, gg, gb, gr};
                     });
  }
  return y;
}

// batch_norm's and batch_norm_relu's own rule, not instance_norm's (which runs as a batch norm and, as
// PyTorch's, takes any eps): training divides by sqrt(var + eps) with a batch variance that can be 0, so
// eps must be positive there, and non-negative in eval mode; a NaN eps (which PyTorch takes) would make
// every output NaN.
void check_batch_norm_eps(const char* op, bool training, double eps) {
  KILN_CHECK(!std::isnan(eps), op, ": eps is NaN, which would make every output NaN");
  if (training) KILN_CHECK(eps > 0, op, ": eps must be positive during training, got ", eps);
  KILN_CHECK(eps >= 0, op, ": eps must be non-negative, got ", eps);
}

}  // namespace

Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& gamma,
                  const Tensor& beta, bool training, double momentum, double eps) {
  check_batch_norm_eps("batch_norm", training, eps);
  return batch_norm_impl("batch_norm", x, running_mean, running_var, gamma, beta, training, momentum, eps, Tensor(),
                         false);
}

Tensor batch_norm_relu(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& gamma,
                       const Tensor& beta, bool training, double momentum, double eps, const Tensor& residual) {
  check_batch_norm_eps("batch_norm_relu", training, eps);
  return batch_norm_impl("batch_norm_relu", x, running_mean, running_var, gamma, beta, training, momentum, eps,
                         residual, true);
}

Tensor instance_norm_running(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                             const Tensor& gamma, const Tensor& beta, bool use_input_stats, double momentum,
                             double eps) {
  return batch_norm_impl("instance_norm", x, running_mean, running_var, gamma, beta, use_input_stats, momentum, eps,
                         Tensor(), false);
}

namespace {
// layer_norm's backward from recorded ops (in a backward with create_graph), over the last k dims of
// x: with xhat = (x - mean) rstd and gh = g gamma, gx = rstd (gh - mean(gh) - xhat mean(gh xhat)),
// ggamma = sum over rows of g xhat, gbeta = sum over rows of g; in the compute dtype.
std::vector<Tensor> layer_norm_backward_recorded(const GradCtx& c, const Tensor& x_in, const Tensor& gamma_in,
                                                 int64_t k, double eps, DType ct) {
  const Tensor x = back_to(x_in, ct), g = back_to(c.g(), ct);
  std::vector<int64_t> norm_dims, row_dims;
  for (int64_t i = 0; i < x.dim(); ++i) (i < x.dim() - k ? row_dims : norm_dims).push_back(i);
  const Tensor xm = x - mean(x, norm_dims, true);
  const Tensor rstd = rsqrt(mean(xm * xm, norm_dims, true) + eps);
  const Tensor xhat = xm * rstd;
  Tensor gx, gg, gb;
  if (c.needs_grad(0)) {
    const Tensor gh = gamma_in.defined() ? g * back_to(gamma_in, ct) : g;
    gx = rstd * (gh - mean(gh, norm_dims, true) - xhat * mean(gh * xhat, norm_dims, true));
  }
  if (c.needs_grad(1)) gg = row_dims.empty() ? g * xhat : sum(g * xhat, row_dims);
  if (c.needs_grad(2)) gb = row_dims.empty() ? g : sum(g, row_dims);
  return {gx, gg, gb};
}
}  // namespace

Tensor layer_norm(const Tensor& x_in, const Shape& normalized_shape, const Tensor& gamma, const Tensor& beta, double eps) {
  const Tensor x = amp::autocast_arg(amp::AutocastOp::layer_norm, x_in);
  check_floating("layer_norm", x, "input");
  const int64_t k = int64_t(normalized_shape.size());
  KILN_CHECK(k >= 1 && k <= x.dim(), "layer_norm: normalized_shape ", normalized_shape, " does not fit input ",
             x.shape());
  for (int64_t i = 0; i < k; ++i)
    KILN_CHECK(x.shape()[size_t(x.dim() - k + i)] == normalized_shape[size_t(i)], "layer_norm: input ", x.shape(),
               " does not end with normalized_shape ", normalized_shape);
  for (const Tensor* t : {&gamma, &beta})
    if (t->defined())
      KILN_CHECK(t->shape() == normalized_shape, "layer_norm: weight/bias ", t->shape(), " must be ",
                 normalized_shape);
  const int64_t d = normalized_shape.numel(), rows = d > 0 ? x.numel() / d : 0;
  const Device dev = x.device();
  const DType ct = compute_dtype(x.dtype());
  const Tensor xc = kin(x, ct);
  const Tensor gc = gamma.defined() ? kin(gamma, ct) : Tensor(), bc = beta.defined() ? kin(beta, ct) : Tensor();
  Tensor y = kout(x.shape(), ct, dev), mean = kout({rows}, ct, dev), rstd = kout({rows}, ct, dev);
  detail::backend(dev).layer_norm_forward(ct, rows, d, eps, xc.raw_data(), ptr_or_null(gc), ptr_or_null(bc),
                                          y.raw_data(), mean.raw_data(), rstd.raw_data());
  y = back_to(y, x.dtype());
  if (autograd::needs_grad({x, gamma, beta})) {
    // The kernel reads the compute-dtype copies (x's made again in backward); gamma itself is saved
    // too, for the recorded backward, which needs its history.
    const Kept kx(x, ct);
    SavedTensor sgamma(gamma);
    autograd::record("layer_norm", {x, gamma, beta}, {y},
                     [kx, sgamma, gc, mean, rstd, rows, d, ct, dev, normalized_shape,
                      eps](const GradCtx& c) -> std::vector<Tensor> {
                       if (GradMode::enabled()) {  // a backward with create_graph
                         const Tensor xh = kx.history("layer_norm"), gh = sgamma.unpack("layer_norm");
                         if (autograd::needs_grad({c.g(), xh, gh}))
                           return layer_norm_backward_recorded(c, xh, gh, int64_t(normalized_shape.size()), eps, ct);
                       }
                       const Tensor xs = kx.kernel("layer_norm");
                       const Tensor g = kin(c.g(), ct);
                       Tensor gx = c.needs_grad(0) ? kout(xs.shape(), ct, dev) : Tensor();
                       Tensor gg = c.needs_grad(1) ? kout(normalized_shape, ct, dev) : Tensor();
                       Tensor gb = c.needs_grad(2) ? kout(normalized_shape, ct, dev) : Tensor();
                       detail::backend(dev).layer_norm_backward(
                           ct, rows, d, xs.raw_data(), ptr_or_null(gc), mean.raw_data(), rstd.raw_data(), g.raw_data(),
                           gx.defined() ? gx.raw_data() : nullptr, gg.defined() ? gg.raw_data() : nullptr,
                           gb.defined() ? gb.raw_data() : nullptr);
                       return {gx, gg, gb};
                     });
  }
  return y;
}

// ---- softmax ---------------------------------------------------------------------------------------

namespace {
// Softmax's (log_softmax's) backward from its output y along dim, from recorded ops (in a backward
// with create_graph): y (g - sum(g y)), or g - exp(y) sum(g) for log_softmax; in the compute dtype.
Tensor softmax_backward_recorded(const Tensor& g_in, const Tensor& y_in, int64_t dim, bool log, DType ct) {
  const Tensor g = back_to(g_in, ct), y = back_to(y_in, ct);
  if (log) return g - exp(y) * sum(g, {dim}, true);
  return y * (g - sum(g * y, {dim}, true));
}

Tensor softmax_impl(const Tensor& x, int64_t dim, bool log) {
  const char* name = log ? "log_softmax" : "softmax";
  check_floating(name, x, "input");
  if (x.dim() == 0) return log ? zeros_like(x) : ones_like(x);
  const int64_t d = wrap_dim(dim, x.dim(), name);
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < d; ++i) outer *= x.size(i);
  for (int64_t i = d + 1; i < x.dim(); ++i) inner *= x.size(i);
  const int64_t n = x.size(d);
  const Device dev = x.device();
  const DType ct = compute_dtype(x.dtype());
  const Tensor xc = kin(x, ct);
  Tensor y = kout(x.shape(), ct, dev);
  detail::backend(dev).softmax_forward(ct, log, outer, n, inner, xc.raw_data(), y.raw_data());
  y = back_to(y, x.dtype());
  if (autograd::needs_grad({x})) {
    // The output itself is saved (its history serves the recorded backward); a 16-bit one is widened
    // again for the kernel, as torch's half softmax backward reads its half output (half the memory
    // of keeping the f32 copy).
    const SavedTensor sy(y);
    autograd::record(
        name, {x}, {y}, [sy, log, d, outer, n, inner, ct, dev, name](const GradCtx& c) -> std::vector<Tensor> {
          const Tensor yh = sy.unpack(name), ys = kin(yh, ct);
          // Under create_graph: the same formula from recorded ops, differentiable again.
          if (autograd::needs_grad({c.g(), yh})) return {softmax_backward_recorded(c.g(), yh, d, log, ct)};
          const Tensor g = kin(c.g(), ct);
          Tensor gx = kout(ys.shape(), ct, dev);
          detail::backend(dev).softmax_backward(ct, log, outer, n, inner, ys.raw_data(), g.raw_data(), gx.raw_data());
          return {gx};
        });
  }
  return y;
}
}  // namespace

Tensor masked_softmax(const Tensor& input, const Tensor& mask_in, double scale, Causal causal) {
  const Tensor x = amp::autocast_arg(amp::AutocastOp::softmax, input);
  check_floating("masked_softmax", x, "input");
  KILN_CHECK(x.dim() >= 1, "masked_softmax: input must have at least 1 dim, got a scalar");
  KILN_CHECK(std::isfinite(scale), "masked_softmax: scale must be finite, got ", scale);
  const Device dev = x.device();
  const DType ct = compute_dtype(x.dtype());
  const int64_t n = x.size(-1), rows = n == 0 ? 0 : x.numel() / n;
  MaskRows mr;
  Tensor mc;
  if (mask_in.defined()) {
    KILN_CHECK(mask_in.device() == dev, "masked_softmax: mask is on ", mask_in.device(), " but the input on ", dev);
    KILN_CHECK(mask_in.dim() <= x.dim(), "masked_softmax: mask ", mask_in.shape(), " has more dims than the input ",
               x.shape());
    KILN_CHECK(x.dim() - 1 <= MaskRows::kMaxDims, "masked_softmax: at most ", MaskRows::kMaxDims + 1,
               " dims with a mask, got ", x.shape());
    // Right-aligned broadcast of the mask over x, as strides of its contiguous copy. A bool mask keeps
    // its True places (PyTorch's scaled_dot_product_attention): 0 there, -inf elsewhere.
    mc = mask_in.dtype() == DType::boolean ? masked_fill(zeros(mask_in.shape(), TensorOptions(ct, dev)),
                                                         logical_not(mask_in), -std::numeric_limits<double>::infinity())
                                           : kin(mask_in, ct);
    const int64_t off = x.dim() - mc.dim();
    const Shape ms = contiguous_strides(mc.shape());
    auto stride_for = [&](int64_t d) -> int64_t {  // d: a dim of x
      const int64_t md = d - off;
      if (md < 0) return 0;
      const int64_t sz = mc.size(md);
      KILN_CHECK(sz == 1 || sz == x.size(d), "masked_softmax: mask ", mask_in.shape(),
                 " does not broadcast to the input ", x.shape(), " (dim ", d, ")");
      return sz == 1 ? 0 : ms[size_t(md)];
    };
    mr.ndim = int(x.dim() - 1);
    for (int64_t d = 0; d + 1 < x.dim(); ++d) {
      mr.size[d] = x.size(d);
      mr.stride[d] = stride_for(d);
    }
    mr.step = stride_for(x.dim() - 1);
  }
  if (causal != Causal::none) {
    KILN_CHECK(x.dim() >= 2, "masked_softmax: a causal mask needs [..., L, S] scores, got ", x.shape());
    mr.causal_rows = x.size(-2);
    mr.causal_offset = causal == Causal::top_left ? 0 : x.size(-1) - x.size(-2);
  }
  const Tensor xc = kin(x, ct);
  Tensor y = kout(x.shape(), ct, dev);
  detail::backend(dev).masked_softmax_forward(ct, rows, n, xc.raw_data(), scale, ptr_or_null(mc), mr, y.raw_data());
  y = back_to(y, x.dtype());
  std::vector<Tensor> inputs{x};
  if (mask_in.defined() && is_floating(mask_in.dtype())) inputs.push_back(mask_in);
  if (autograd::needs_grad(inputs)) {
    const SavedTensor sy(y);  // as softmax's
    autograd::record("masked_softmax", inputs, {y},
                     [sy, rows, n, ct, dev, scale](const GradCtx& c) -> std::vector<Tensor> {
                       const Tensor yh = sy.unpack("masked_softmax"), ys = kin(yh, ct);
                       const bool mask_grad = c.needs->size() > 1 && c.needs_grad(1);
                       if (autograd::needs_grad({c.g(), yh})) {
                         // Under create_graph, from recorded ops: softmax's backward along the last dim (a masked
                         // place has y = 0, so its gradient is 0).
                         const Tensor gz = softmax_backward_recorded(c.g(), yh, -1, false, ct);
                         if (c.needs->size() == 1) return {gz * scale};
                         return {c.needs_grad(0) ? gz * scale : Tensor(), mask_grad ? gz : Tensor()};
                       }
                       const Tensor g = kin(c.g(), ct);
                       // The gradient of the scaled, masked scores z; x's is scale times it, the mask's is z's summed
                       // down to the mask's shape (record does that).
                       Tensor gz = kout(ys.shape(), ct, dev);
                       detail::backend(dev).masked_softmax_backward(ct, rows, n, ys.raw_data(), g.raw_data(),
                                                                    mask_grad ? 1.0 : scale, gz.raw_data());
                       if (c.needs->size() == 1) return {gz};
                       if (!mask_grad) return {gz, Tensor()};
                       return {c.needs_grad(0) ? gz * scale : Tensor(), gz};
                     });
  }
  return y;
}

Tensor softmax(const Tensor& x, int64_t dim) {
  return softmax_impl(amp::autocast_arg(amp::AutocastOp::softmax, x), dim, false);
}
Tensor log_softmax(const Tensor& x, int64_t dim) {
  return softmax_impl(amp::autocast_arg(amp::AutocastOp::log_softmax, x), dim, true);
}

// ---- losses ----------------------------------------------------------------------------------------

namespace {
Tensor reduce_loss(const Tensor& per, Reduction r) {
  if (r == Reduction::none) return per;
  if (r == Reduction::sum) return sum(per);
  if (r == Reduction::batchmean) return sum(per) / double(per.dim() == 0 ? 1 : std::max<int64_t>(per.size(0), 1));
  return mean(per);
}

void check_class_weight(const char* op, const Tensor& weight, int64_t classes) {
  if (!weight.defined()) return;
  KILN_CHECK(weight.dim() == 1 && weight.size(0) == classes, op, ": weight must be [C] = [", classes, "], got ",
             weight.shape());
  KILN_CHECK(is_floating(weight.dtype()), op, ": weight must be floating, got ", weight.type_str());
}

// [N, C, d...] -> [N * d..., C] and [N, d...] -> [N * d...].
void flatten_class_dim(const char* op, const Tensor& logits, const Tensor& target, Tensor& l2, Tensor& t2) {
  KILN_CHECK(logits.dim() >= 2, op, ": input must be [N, C] or [N, C, d...], got ", logits.shape());
  KILN_CHECK(target.dtype() == DType::i64 || target.dtype() == DType::i32, op, ": target must hold class indices (i64), got ",
             target.type_str());
  Shape want = logits.shape();
  want.erase(want.begin() + 1);
  KILN_CHECK(target.shape() == want, op, ": target ", target.shape(), " does not match input ", logits.shape(),
             " (expected ", want, ")");
  const int64_t c = logits.size(1);
  if (logits.dim() == 2) {
    l2 = logits;
  } else {
    std::vector<int64_t> perm{0};
    for (int64_t i = 2; i < logits.dim(); ++i) perm.push_back(i);
    perm.push_back(1);
    l2 = logits.permute(perm).reshape({-1, c});
  }
  t2 = target.reshape({-1});
  if (t2.dtype() != DType::i64) t2 = t2.to(DType::i64);
}

// nll_loss's rows from log-probabilities [rows, C] and targets [rows]: which rows count (keep), each
// row's weight (weight[target], 0 where ignored; undefined without class weights) and its loss.
struct NllRows {
  Tensor keep, w, per;
};
NllRows nll_rows(const Tensor& lp, const Tensor& t2, int64_t ignore_index, const Tensor& weight) {
  NllRows r;
  r.keep = ne(t2, scalar_tensor(double(ignore_index), TensorOptions(DType::i64, t2.device())));
  const Tensor safe = where(r.keep, t2, zeros_like(t2));
  const Tensor picked = gather(lp, 1, safe.unsqueeze(1)).squeeze(1);
  if (weight.defined()) r.w = where(r.keep, index_select(weight, 0, safe).to(picked.dtype()), zeros_like(picked));
  r.per = r.w.defined() ? neg(picked) * r.w : where(r.keep, neg(picked), zeros_like(picked));
  return r;
}
// The reduction of per-row losses: none (in the target's shape), sum, or the mean over the weights
// (the count of kept rows without class weights), divided in f32 at least (a count rounded to bf16
// or f16 would be off).
Tensor reduce_rows(const Tensor& per, const NllRows& r, Reduction reduction, const Shape& target_shape) {
  if (reduction == Reduction::none) return per.reshape(target_shape);
  if (reduction == Reduction::sum) return sum(per);
  const DType ct = promote_types(per.dtype(), DType::f32);
  const Tensor kept = sum(r.keep).to(ct);
  const Tensor den = r.w.defined() ? sum(r.w).to(ct) : kept;
  // Every target ignored: the mean is 0/0 = NaN, as PyTorch's, but its gradient is 0, not 0 * inf = NaN
  // (one such batch would poison the weights): divide by 1 there and add the NaN as a constant.
  const Tensor none_kept = eq(kept, scalar_like(0, kept));
  const Tensor safe_den = where(none_kept, ones_like(den), den);
  const Tensor nan_if_none = where(none_kept, scalar_like(std::nan(""), den), zeros_like(den));
  return (sum(per).to(ct) / safe_den + nan_if_none).to(per.dtype());
}
}  // namespace

Tensor cross_entropy(const Tensor& logits_in, const Tensor& target, int64_t ignore_index, double label_smoothing,
                     Reduction reduction, const Tensor& weight) {
  const OpScope scope("cross_entropy");
  const Tensor logits = amp::autocast_arg(amp::AutocastOp::cross_entropy, logits_in);
  check_floating("cross_entropy", logits, "input");
  KILN_CHECK(label_smoothing >= 0 && label_smoothing <= 1, "cross_entropy: label_smoothing must be in [0, 1], got ",
             label_smoothing);
  KILN_CHECK(reduction != Reduction::batchmean, "cross_entropy: reduction batchmean is for kl_div; use mean or sum");
  if (weight.defined()) {
    // Class weights: from log_softmax, as PyTorch defines them. Row loss = (1 - e) w[t] (-log p_t) +
    // e / C sum_c w[c] (-log p_c); the mean divides by the sum of w[t] over the rows not ignored.
    Tensor l2, t2;
    flatten_class_dim("cross_entropy", logits, target, l2, t2);
    check_class_weight("cross_entropy", weight, l2.size(1));
    const Tensor lp = log_softmax(l2, 1);
    const NllRows r = nll_rows(lp, t2, ignore_index, weight);
    Tensor per = r.per;
    if (label_smoothing > 0) {
      const Tensor smooth = neg(sum(lp * weight.to(lp.dtype()).unsqueeze(0), {1})) / double(l2.size(1));
      per = per * (1.0 - label_smoothing) + where(r.keep, smooth, zeros_like(smooth)) * label_smoothing;
    }
    return reduce_rows(per, r, reduction, target.shape());
  }
  Tensor l2, t2;
  flatten_class_dim("cross_entropy", logits, target, l2, t2);
  const int64_t rows = l2.size(0), classes = l2.size(1);
  const Device dev = detail::common_device("cross_entropy", {logits, target});
  const DType ct = compute_dtype(logits.dtype());
  const Tensor lc = kin(l2, ct), tc = t2.contiguous();
  const bool grad = autograd::needs_grad({logits});
  Tensor per = kout({rows}, ct, dev);
  Tensor glogits = grad ? kout({rows, classes}, ct, dev) : Tensor();
  detail::backend(dev).cross_entropy(ct, rows, classes, lc.raw_data(), tc.data<int64_t>(), ignore_index,
                                     label_smoothing, per.raw_data(), grad ? glogits.raw_data() : nullptr, 1.0);
  // The mean divides by the number of targets that are not ignored, counted on the device (1/0 is
  // inf, so a batch that ignores every target has a NaN mean, as in the common frameworks).
  Tensor count, inv;
  if (reduction == Reduction::mean) {
    count = sum(ne(tc, scalar_tensor(double(ignore_index), TensorOptions(DType::i64, dev))));
    // The gradient's factor 1/count is 1 where every target is ignored: each row's gradient is 0 there
    // and stays 0 (times 1, not times inf = NaN), as PyTorch's.
    inv = 1.0 / maximum(count, scalar_like(1, count)).to(DType::f64);
  }
  Tensor out;
  if (reduction == Reduction::none) {
    out = back_to(per.reshape(t2.shape()), logits.dtype()).reshape(target.shape());
  } else if (reduction == Reduction::mean) {
    out = back_to(sum(per) * (1.0 / count.to(DType::f64)).to(per.dtype()), logits.dtype());
  } else {
    out = back_to(sum(per), logits.dtype());
  }
  if (grad) {
    // d loss / d logits = glogits * (upstream gradient of each row's loss); recorded against l2,
    // whose own views carry it back to logits' layout.
    // Under create_graph the gradient is recomputed with recorded ops, so that it is differentiable
    // again: keep * (softmax(z) - want), want = (1 - e) onehot(t) + e / C, where z stands for the
    // logits: log of the softmax read back from glogits (p = glogits + want on the rows kept), with the
    // logits' history (their node, held weakly: this node's edge keeps it; a leaf is kept itself, as
    // its owner keeps it). softmax is shift-invariant per row, so softmax(z) = softmax(logits) and its
    // Jacobian is theirs: nothing logits-sized is kept but glogits.
    const Shape row_shape{rows, 1};
    const std::weak_ptr<Node> l_fn = l2.grad_fn();
    const uint32_t l_nr = l2.output_nr();
    const SavedTensor l_leaf(l2.is_leaf() ? l2 : Tensor());
    autograd::record("cross_entropy", {l2}, {out},
                     [glogits, l_fn, l_nr, l_leaf, tc, ignore_index, label_smoothing, reduction, inv,
                      row_shape](const GradCtx& c) -> std::vector<Tensor> {
                       const DType ct = glogits.dtype();
                       Tensor g = c.g();
                       if (reduction == Reduction::none) {
                         g = g.reshape(row_shape);
                       } else if (reduction == Reduction::mean) {
                         g = g.to(ct) * inv.to(ct);  // in the compute dtype: 1/count unrounded to 16 bits
                       }
                       // (grad mode is on only in a backward with create_graph)
                       const std::shared_ptr<Node> fn = GradMode::enabled() ? l_fn.lock() : nullptr;
                       const Tensor leaf = GradMode::enabled() ? l_leaf.unpack("cross_entropy") : Tensor();
                       if (!autograd::needs_grad({c.g()}) && !fn && !leaf.defined()) return {glogits * g.to(ct)};
                       const int64_t classes = glogits.size(1);
                       const Tensor keep =
                           ne(tc, scalar_tensor(double(ignore_index), TensorOptions(DType::i64, tc.device())));
                       const Tensor safe = where(keep, tc, zeros_like(tc));
                       const Tensor want =
                           one_hot(safe, classes).to(ct) * (1.0 - label_smoothing) + label_smoothing / double(classes);
                       Tensor z;
                       if (leaf.defined()) {
                         z = back_to(leaf, ct);
                       } else {
                         const double tiny = ct == DType::f64 ? std::numeric_limits<double>::min()
                                                              : double(std::numeric_limits<float>::min());
                         {
                           NoGradGuard ng;
                           z = where(keep.unsqueeze(1), log(maximum(glogits + want, scalar_like(tiny, glogits))),
                                     zeros_like(glogits));
                         }
                         if (fn) {
                           auto m = std::make_unique<AutogradMeta>();
                           m->requires_grad = true;
                           m->grad_fn = fn;
                           m->output_nr = l_nr;
                           z.impl().autograd = std::move(m);
                         }
                       }
                       const Tensor p = softmax(z, 1);
                       const Tensor gl = where(keep.unsqueeze(1), p - want, zeros_like(p));
                       return {gl * g.to(ct)};
                     });
  }
  return out;
}

Tensor nll_loss(const Tensor& log_probs_in, const Tensor& target, int64_t ignore_index, Reduction reduction,
                const Tensor& weight) {
  const OpScope scope("nll_loss");
  const Tensor log_probs = amp::autocast_arg(amp::AutocastOp::nll_loss, log_probs_in);
  check_floating("nll_loss", log_probs, "input");
  KILN_CHECK(reduction != Reduction::batchmean, "nll_loss: reduction batchmean is for kl_div; use mean or sum");
  Tensor l2, t2;
  flatten_class_dim("nll_loss", log_probs, target, l2, t2);
  check_class_weight("nll_loss", weight, l2.size(1));
  const NllRows r = nll_rows(l2, t2, ignore_index, weight);
  return reduce_rows(r.per, r, reduction, target.shape());
}

Tensor mse_loss(const Tensor& input_in, const Tensor& target_in, Reduction reduction) {
  const Tensor input = amp::autocast_arg(amp::AutocastOp::mse_loss, input_in),
               target = amp::autocast_arg(amp::AutocastOp::mse_loss, target_in);
  KILN_CHECK(input.shape() == target.shape(), "mse_loss: input ", input.shape(), " and target ", target.shape(),
             " differ");
  const Tensor d = input - target;
  return reduce_loss(d * d, reduction);
}

namespace {
void check_same_shape(const char* op, const Tensor& input, const Tensor& target) {
  KILN_CHECK(input.shape() == target.shape(), op, ": input ", input.shape(), " and target ", target.shape(), " differ");
}
// |input - target| with mse_loss's autocast rule (losses in f32).
Tensor abs_diff(const char* op, const Tensor& input, const Tensor& target) {
  check_same_shape(op, input, target);
  return abs(amp::autocast_arg(amp::AutocastOp::mse_loss, input) -
             amp::autocast_arg(amp::AutocastOp::mse_loss, target));
}
}  // namespace

Tensor l1_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  return reduce_loss(abs_diff("l1_loss", input, target), reduction);
}
Tensor smooth_l1_loss(const Tensor& input, const Tensor& target, Reduction reduction, double beta) {
  KILN_CHECK(beta >= 0, "smooth_l1_loss: beta must be >= 0, got ", beta);
  const Tensor d = abs_diff("smooth_l1_loss", input, target);
  if (beta == 0) return reduce_loss(d, reduction);  // L1 (PyTorch's rule for beta 0)
  return reduce_loss(where(lt(d, scalar_like(beta, d)), d * d * (0.5 / beta), d - 0.5 * beta), reduction);
}
Tensor huber_loss(const Tensor& input, const Tensor& target, Reduction reduction, double delta) {
  KILN_CHECK(delta > 0, "huber_loss: delta must be > 0, got ", delta);
  const Tensor d = abs_diff("huber_loss", input, target);
  // Quadratic strictly inside delta, as torch's: the same values and first derivative at |d| = delta, and
  // torch's second derivative there (0, the linear side's).
  return reduce_loss(where(lt(d, scalar_like(delta, d)), d * d * 0.5, (d - 0.5 * delta) * delta), reduction);
}
Tensor binary_cross_entropy(const Tensor& p_in, const Tensor& y_in, Reduction reduction, const Tensor& weight) {
  const Tensor p = amp::autocast_arg(amp::AutocastOp::binary_cross_entropy_with_logits, p_in),
               y = amp::autocast_arg(amp::AutocastOp::binary_cross_entropy_with_logits, y_in);
  check_same_shape("binary_cross_entropy", p, y);
  check_floating("binary_cross_entropy", p, "input");
  check_floating("binary_cross_entropy", y, "target");  // as PyTorch: a bool or integer target is refused
  // As PyTorch: probabilities outside [0, 1] (or NaN) are an error, not a NaN loss (one min/max pass).
  if (p.numel() > 0) {
    const double lo = amin(p.detach()).item_double(), hi = amax(p.detach()).item_double();
    KILN_CHECK(lo >= 0 && hi <= 1, "binary_cross_entropy: all elements of input should be between 0 and 1, found min ",
               lo, " and max ", hi, " (pass logits to binary_cross_entropy_with_logits, or apply sigmoid first)");
  }
  // The logs clamped at -100, as PyTorch. The backward is PyTorch's own, not the graph's: through
  // maximum(log(p), -100) a p of exactly 0 or 1 (a saturated sigmoid) met log's infinite derivative
  // times 0, a NaN; PyTorch's (p - y) / max(p (1 - p), 1e-12) is finite there.
  Tensor per;
  {
    NoGradGuard ng;
    const Tensor floor = scalar_like(-100, p);
    per = neg(y * maximum(log(p), floor) + (1.0 - y) * maximum(log(1.0 - p), floor));
  }
  if (autograd::needs_grad({p, y})) {
    SavedTensor sp(p), sy(y);
    autograd::record("binary_cross_entropy", {p, y}, {per}, [sp, sy](const GradCtx& c) -> std::vector<Tensor> {
      const Tensor pp = sp.unpack("binary_cross_entropy"), yy = sy.unpack("binary_cross_entropy");
      Tensor gp, gy;
      if (c.needs_grad(0)) gp = c.g() * (pp - yy) / maximum(pp * (1.0 - pp), scalar_like(1e-12, pp));
      if (c.needs_grad(1)) {
        const Tensor floor = scalar_like(-100, pp);
        gy = c.g() * (maximum(log(1.0 - pp), floor) - maximum(log(pp), floor));
      }
      return {gp, gy};
    });
  }
  if (weight.defined()) per = per * weight;
  return reduce_loss(per, reduction);
}
Tensor kl_div(const Tensor& input, const Tensor& target, Reduction reduction, bool log_target) {
  check_same_shape("kl_div", input, target);
  // target * (log target - input), 0 where target is exactly 0 (the limit of t log t); a negative
  // target gives NaN (its log), as PyTorch's xlogy, not a number that hides it.
  const Tensor nonzero = ne(target, scalar_like(0, target));
  const Tensor per = log_target ? exp(target) * (target - input)
                                : where(nonzero, target * (log(where(nonzero, target, ones_like(target))) - input),
                                        zeros_like(input * target));
  return reduce_loss(per, reduction);
}
Tensor margin_ranking_loss(const Tensor& x1, const Tensor& x2, const Tensor& y, double margin, Reduction reduction) {
  return reduce_loss(relu(neg(y) * (x1 - x2) + margin), reduction);
}
namespace {
// ||x|| along dim (kept), at least eps in value only: PyTorch clamps the norm in place under no_grad,
// so the gradient is the norm's own (0 at a zero vector), never the clamp's or a 0/0.
Tensor clamped_norm(const Tensor& x, int64_t dim, double eps) {
  const Tensor n = norm(x, 2.0, {dim}, true), nd = n.detach();
  return n + (maximum(nd, scalar_like(eps, nd)) - nd);
}
}  // namespace
Tensor cosine_similarity(const Tensor& x1, const Tensor& x2, int64_t dim, double eps) {
  const OpScope scope("cosine_similarity");
  // 16-bit inputs compute in f32 (300^2 summed in f16 was inf, and the result NaN), rounded back once.
  const DType rt = promote_types(x1.dtype(), x2.dtype());
  if (is_low_precision(rt)) return cast(cosine_similarity(cast(x1, DType::f32), cast(x2, DType::f32), dim, eps), rt);
  // As PyTorch: broadcast first, then each vector divided by its own clamped norm (a zero vector
  // gives 0 and finite gradients; two tiny vectors still give their cosine).
  Shape shape;
  try {
    shape = broadcast_shapes(x1.shape(), x2.shape());
  } catch (const Error& e) {
    KILN_FAIL("cosine_similarity: ", e.message());
  }
  const Tensor a = x1.expand(shape), b = x2.expand(shape);
  return sum((a / clamped_norm(a, dim, eps)) * (b / clamped_norm(b, dim, eps)), {dim});
}
Tensor cosine_embedding_loss(const Tensor& x1, const Tensor& x2, const Tensor& y, double margin, Reduction reduction) {
  KILN_CHECK(x1.dim() == 2 && x1.shape() == x2.shape() && y.dim() == 1 && y.size(0) == x1.size(0),
             "cosine_embedding_loss: x1, x2 must be [N, D] and y [N], got ", x1.shape(), ", ", x2.shape(), ", ",
             y.shape());
  const Tensor c = cosine_similarity(x1, x2, 1, 1e-8);
  const Tensor pos = gt(y, scalar_like(0, y));
  return reduce_loss(where(pos, 1.0 - c, relu(c - margin)), reduction);
}

Tensor binary_cross_entropy_with_logits(const Tensor& x_in, const Tensor& y_in, Reduction reduction) {
  const Tensor x = amp::autocast_arg(amp::AutocastOp::binary_cross_entropy_with_logits, x_in),
               y = amp::autocast_arg(amp::AutocastOp::binary_cross_entropy_with_logits, y_in);
  KILN_CHECK(x.shape() == y.shape(), "binary_cross_entropy_with_logits: input ", x.shape(), " and target ", y.shape(),
             " differ");
  check_floating("binary_cross_entropy_with_logits", y, "target");  // as PyTorch: bool/integer refused
  // max(x, 0) - x*y + log(1 + exp(-|x|)): no overflow for large |x|.
  const Tensor per = relu(x) - x * y + log(exp(neg(abs(x))) + 1.0);
  return reduce_loss(per, reduction);
}

}  // namespace kiln
