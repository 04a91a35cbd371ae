// Neural-network ops composed from the fused ones (their gradients, autocast rules and CUDA paths
// come with them): convolution in 1-D and 3-D and with "same" padding, and the group, instance, RMS
// and local-response normalisations; the CTC loss.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "engine/autocast.h"
#include "engine/internal.h"
#include "engine/nn_ops.h"

namespace kiln {
namespace {

// Shape [1, C, 1, ...] for a per-channel vector against x [N, C, *].
Shape channel_shape(const Tensor& x) {
  Shape s(static_cast<size_t>(x.dim()), 1);
  s[1] = x.size(1);
  return s;
}

void check_conv_dims(const char* op, const Tensor& x, const Tensor& weight, int64_t dims, const char* xs,
                     const char* ws) {
  KILN_CHECK(x.defined() && x.dim() == dims + 2, op, ": input must be ", xs, ", got ",
             x.defined() ? x.shape() : Shape{});
  KILN_CHECK(weight.defined() && weight.dim() == dims + 2, op, ": weight must be ", ws, ", got ",
             weight.defined() ? weight.shape() : Shape{});
}

// "same" padding of one dim: {before, after}.
std::array<int64_t, 2> same_pad(int64_t k, int64_t dilation) {
  const int64_t total = dilation * (k - 1);
  return {total / 2, total - total / 2};
}

}  // namespace

// ---- convolution ---------------------------------------------------------------------------------

Tensor conv1d(const Tensor& x, const Tensor& weight, const Tensor& bias, int64_t stride, int64_t padding,
              int64_t dilation, int64_t groups) {
  check_conv_dims("conv1d", x, weight, 1, "[N, C, L]", "[O, C/groups, k]");
  return conv2d(x.unsqueeze(2), weight.unsqueeze(2), bias, {1, stride}, {0, padding}, {1, dilation}, groups).squeeze(2);
}

Tensor conv_transpose1d(const Tensor& x, const Tensor& weight, const Tensor& bias, int64_t stride, int64_t padding,
                        int64_t output_padding, int64_t groups, int64_t dilation) {
  const char* op = "conv_transpose1d";
  check_conv_dims(op, x, weight, 1, "[N, C_in, L]", "[C_in, C_out/groups, k]");
  KILN_CHECK(stride >= 1 && dilation >= 1 && padding >= 0, op, ": stride ", stride, " and dilation ", dilation,
             " must be >= 1 and padding ", padding, " >= 0");
  KILN_CHECK(output_padding >= 0 && output_padding < std::max(stride, dilation), op, ": output_padding ",
             output_padding, " must be >= 0 and smaller than the stride ", stride, " or the dilation ", dilation,
             " (PyTorch's rule)");
  return conv_transpose2d(x.unsqueeze(2), weight.unsqueeze(2), bias, {1, stride}, {0, padding}, {0, output_padding},
                          groups, {1, dilation})
      .squeeze(2);
}

Tensor conv3d(const Tensor& x, const Tensor& weight, const Tensor& bias, Triple stride, Triple padding, Triple dilation,
              int64_t groups) {
  const char* op = "conv3d";
  check_conv_dims(op, x, weight, 3, "[N, C, D, H, W]", "[O, C/groups, kd, kh, kw]");
  KILN_CHECK(groups >= 1 && x.size(1) % groups == 0 && weight.size(0) % groups == 0, op, ": groups ", groups,
             " must divide input channels ", x.size(1), " and output channels ", weight.size(0));
  KILN_CHECK(weight.size(1) * groups == x.size(1), op, ": input ", x.shape(), " has ", x.size(1),
             " channels but weight ", weight.shape(), " expects ", weight.size(1) * groups);
  for (int i = 0; i < 3; ++i)
    KILN_CHECK(stride[i] >= 1 && dilation[i] >= 1 && padding[i] >= 0, op,
               ": stride and dilation must be >= 1 and padding >= 0");
  if (bias.defined())
    KILN_CHECK(bias.dim() == 1 && bias.size(0) == weight.size(0), op, ": bias ", bias.shape(), " must be [",
               weight.size(0), "]");
  const int64_t n = x.size(0), c = x.size(1), kd = weight.size(2);
  const int64_t depth = x.size(2) + 2 * padding[0];
  const int64_t od = (depth - dilation[0] * (kd - 1) - 1) / stride[0] + 1;
  KILN_CHECK(depth - dilation[0] * (kd - 1) - 1 >= 0 && od > 0, op, ": input ", x.shape(), " is too small for kernel ",
             weight.shape(), " with padding [", padding[0], ",", padding[1], ",", padding[2], "] and dilation [",
             dilation[0], ",", dilation[1], ",", dilation[2], "]");
  // [N, D, C, H, W] with the depth padding, so that the slices one kernel plane meets are a strided
  // range of dim 1, folded into the batch for conv2d.
  Tensor xt = x.permute({0, 2, 1, 3, 4});
  if (padding[0] > 0) xt = pad(xt, {0, 0, 0, 0, 0, 0, padding[0], padding[0]});
  Tensor out;
  DType out_t = DType::f32;  // conv2d's result dtype (its promotion and autocast rule)
  for (int64_t i = 0; i < kd; ++i) {
    const int64_t first = i * dilation[0];
    const Tensor xs =
        xt.slice(1, first, first + (od - 1) * stride[0] + 1, stride[0]).reshape({n * od, c, xt.size(3), xt.size(4)});
    Tensor yi = conv2d(xs, weight.select(2, i), {}, {stride[1], stride[2]}, {padding[1], padding[2]},
                       {dilation[1], dilation[2]}, groups);
    out_t = yi.dtype();
    if (is_low_precision(out_t)) yi = cast(yi, DType::f32);  // the kd partial sums in f32
    out = out.defined() ? out + yi : yi;
  }
  out = out.reshape({n, od, weight.size(0), out.size(2), out.size(3)}).permute({0, 2, 1, 3, 4}).contiguous();
  if (bias.defined())
    out = out + (bias.dtype() == out.dtype() ? bias : cast(bias, out.dtype())).reshape({1, weight.size(0), 1, 1, 1});
  return out.dtype() == out_t ? out : cast(out, out_t);
}

Tensor conv1d(const Tensor& x, const Tensor& weight, const Tensor& bias, SamePadding, int64_t dilation,
              int64_t groups) {
  check_conv_dims("conv1d", x, weight, 1, "[N, C, L]", "[O, C/groups, k]");
  const auto p = same_pad(weight.size(2), dilation);
  if (p[0] == p[1]) return conv1d(x, weight, bias, 1, p[0], dilation, groups);
  return conv1d(pad(x, {p[0], p[1]}), weight, bias, 1, 0, dilation, groups);
}

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, SamePadding, Pair dilation, int64_t groups) {
  check_conv_dims("conv2d", x, weight, 2, "[N, C, H, W]", "[O, C/groups, kh, kw]");
  const auto ph = same_pad(weight.size(2), dilation[0]), pw = same_pad(weight.size(3), dilation[1]);
  if (ph[0] == ph[1] && pw[0] == pw[1]) return conv2d(x, weight, bias, {1, 1}, {ph[0], pw[0]}, dilation, groups);
  return conv2d(pad(x, {pw[0], pw[1], ph[0], ph[1]}), weight, bias, {1, 1}, {0, 0}, dilation, groups);
}

Tensor conv3d(const Tensor& x, const Tensor& weight, const Tensor& bias, SamePadding, Triple dilation, int64_t groups) {
  check_conv_dims("conv3d", x, weight, 3, "[N, C, D, H, W]", "[O, C/groups, kd, kh, kw]");
  const auto pd = same_pad(weight.size(2), dilation[0]), ph = same_pad(weight.size(3), dilation[1]),
             pw = same_pad(weight.size(4), dilation[2]);
  if (pd[0] == pd[1] && ph[0] == ph[1] && pw[0] == pw[1])
    return conv3d(x, weight, bias, {1, 1, 1}, {pd[0], ph[0], pw[0]}, dilation, groups);
  return conv3d(pad(x, {pw[0], pw[1], ph[0], ph[1], pd[0], pd[1]}), weight, bias, {1, 1, 1}, {0, 0, 0}, dilation,
                groups);
}

// ---- pooling in 1-D and 3-D, and unpooling -------------------------------------------------------

namespace {
void check_pool_input(const char* op, const Tensor& x, int64_t dims, const char* shapes) {
  KILN_CHECK(x.defined() && (x.dim() == dims + 1 || x.dim() == dims + 2), op, ": input must be ", shapes, ", got ",
             x.defined() ? x.shape() : Shape{});
}
Triple stride_or_kernel(Triple stride, Triple kernel) {
  return stride[0] == 0 && stride[1] == 0 && stride[2] == 0 ? kernel : stride;
}
void check_pool3d(const char* op, const Tensor& x, Triple kernel, Triple stride, Triple padding, Triple dilation) {
  check_pool_input(op, x, 3, "[N, C, D, H, W] or [C, D, H, W]");
  for (int i = 0; i < 3; ++i) {
    KILN_CHECK(kernel[i] >= 1 && stride[i] >= 1 && dilation[i] >= 1, op, ": kernel, stride and dilation must be >= 1");
    KILN_CHECK(padding[i] >= 0 && 2 * padding[i] <= kernel[i], op, ": padding [", padding[0], ",", padding[1], ",",
               padding[2], "] must be at most half the kernel [", kernel[0], ",", kernel[1], ",", kernel[2], "]");
  }
}
// The 3-D pool of x as a 2-D pool of the (H, W) planes, then one down the depth of [N C, 1, D, Ho Wo].
template <typename Pool2d, typename PoolDepth> Tensor pool3d(const Tensor& x_in, Pool2d&& plane, PoolDepth&& depth) {
  const Tensor x = x_in.dim() == 4 ? x_in.unsqueeze(0) : x_in;
  const int64_t n = x.size(0), c = x.size(1), d = x.size(2);
  const Tensor a = plane(x.reshape({n, c * d, x.size(3), x.size(4)}));
  const int64_t ho = a.size(2), wo = a.size(3);
  const Tensor b = depth(a.reshape({n * c, 1, d, ho * wo}));
  const Tensor y = b.reshape({n, c, b.size(2), ho, wo});
  return x_in.dim() == 4 ? y.squeeze(0) : y;
}
}  // namespace

ValuesIndices max_pool1d_with_indices(const Tensor& x, int64_t kernel, int64_t stride, int64_t padding,
                                      int64_t dilation, bool ceil_mode) {
  check_pool_input("max_pool1d", x, 1, "[N, C, L] or [C, L]");
  const ValuesIndices r = max_pool2d_with_indices(x.unsqueeze(-2), {1, kernel}, {1, stride ? stride : kernel},
                                                  {0, padding}, {1, dilation}, ceil_mode);
  return {r.values.squeeze(-2), r.indices.squeeze(-2)};
}

Tensor max_pool1d(const Tensor& x, int64_t kernel, int64_t stride, int64_t padding, int64_t dilation, bool ceil_mode) {
  return max_pool1d_with_indices(x, kernel, stride, padding, dilation, ceil_mode).values;
}

Tensor avg_pool1d(const Tensor& x, int64_t kernel, int64_t stride, int64_t padding, bool count_include_pad,
                  bool ceil_mode) {
  check_pool_input("avg_pool1d", x, 1, "[N, C, L] or [C, L]");
  return avg_pool2d(x.unsqueeze(-2), {1, kernel}, {1, stride ? stride : kernel}, {0, padding}, count_include_pad,
                    ceil_mode)
      .squeeze(-2);
}

Tensor max_pool3d(const Tensor& x, Triple kernel, Triple stride_in, Triple padding, Triple dilation, bool ceil_mode) {
  const Triple stride = stride_or_kernel(stride_in, kernel);
  check_pool3d("max_pool3d", x, kernel, stride, padding, dilation);
  return pool3d(
      x,
      [&](const Tensor& t) {
        return max_pool2d(t, {kernel[1], kernel[2]}, {stride[1], stride[2]}, {padding[1], padding[2]},
                          {dilation[1], dilation[2]}, ceil_mode);
      },
      [&](const Tensor& t) {
        return max_pool2d(t, {kernel[0], 1}, {stride[0], 1}, {padding[0], 0}, {dilation[0], 1}, ceil_mode);
      });
}

ValuesIndices max_pool3d_with_indices(const Tensor& x_in, Triple kernel, Triple stride_in, Triple padding,
                                      Triple dilation, bool ceil_mode) {
  const Triple stride = stride_or_kernel(stride_in, kernel);
  check_pool3d("max_pool3d_with_indices", x_in, kernel, stride, padding, dilation);
  const Tensor x = x_in.dim() == 4 ? x_in.unsqueeze(0) : x_in;
  const int64_t n = x.size(0), c = x.size(1), d = x.size(2), h = x.size(3), w = x.size(4);
  // The 2-D pool of every depth slice (in-plane indices), then the pool down the depth, whose index
  // is dsel * (Ho Wo) + column; the in-plane index of the picked slice is gathered.
  const ValuesIndices a =
      max_pool2d_with_indices(x.reshape({n, c * d, h, w}), {kernel[1], kernel[2]}, {stride[1], stride[2]},
                              {padding[1], padding[2]}, {dilation[1], dilation[2]}, ceil_mode);
  const int64_t ho = a.values.size(2), wo = a.values.size(3);
  const ValuesIndices b = max_pool2d_with_indices(a.values.reshape({n * c, 1, d, ho * wo}), {kernel[0], 1},
                                                  {stride[0], 1}, {padding[0], 0}, {dilation[0], 1}, ceil_mode);
  const int64_t dout = b.values.size(2);
  const Tensor col = arange(ho * wo, TensorOptions(DType::i64, x.device())).reshape({1, 1, ho * wo});
  const Tensor rows = b.indices.reshape({n * c, dout, ho * wo}) - col;  // dsel * (Ho Wo), exact
  const Tensor dsel = (rows.to(DType::f64) / double(ho * wo)).to(DType::i64);
  const Tensor in_plane = gather(a.indices.reshape({n * c, d, ho * wo}), 1, dsel);
  const Tensor idx = (dsel * double(h * w) + in_plane).reshape({n, c, dout, ho, wo});
  const Tensor y = b.values.reshape({n, c, dout, ho, wo});
  if (x_in.dim() == 4) return {y.squeeze(0), idx.squeeze(0)};
  return {y, idx};
}

Tensor avg_pool3d(const Tensor& x, Triple kernel, Triple stride_in, Triple padding, bool count_include_pad,
                  bool ceil_mode, int64_t divisor_override) {
  const Triple stride = stride_or_kernel(stride_in, kernel);
  check_pool3d("avg_pool3d", x, kernel, stride, padding, {1, 1, 1});
  KILN_CHECK(divisor_override >= 0, "avg_pool3d: divisor_override must be positive (0: none), got ", divisor_override);
  // With a divisor override both passes sum (divisor 1), then one division.
  const int64_t div = divisor_override > 0 ? 1 : 0;
  const Tensor y = pool3d(
      x,
      [&](const Tensor& t) {
        return avg_pool2d(t, {kernel[1], kernel[2]}, {stride[1], stride[2]}, {padding[1], padding[2]},
                          count_include_pad, ceil_mode, div);
      },
      [&](const Tensor& t) {
        return avg_pool2d(t, {kernel[0], 1}, {stride[0], 1}, {padding[0], 0}, count_include_pad, ceil_mode, div);
      });
  return divisor_override > 0 ? y / double(divisor_override) : y;
}

namespace {
// x's values put at `indices` (flat positions within each plane of the last K dims) of zero planes
// of output_size (default (in - 1) stride - 2 padding + kernel per dim). Scattered by sums, each
// position divided by how many entries name it: overlapping windows can pick the same element, and
// then they carry the same value, which the mean keeps. The gradient is that function's (shared among
// the entries), so max_unpool of max_pool passes each element's gradient once.
template <size_t K> Tensor unpool(const char* op, const Tensor& x, const Tensor& indices,
                                  const std::array<int64_t, K>& kernel, const std::array<int64_t, K>& stride,
                                  const std::array<int64_t, K>& padding,
                                  const std::optional<std::array<int64_t, K>>& output_size) {
  KILN_CHECK(indices.defined() && indices.dtype() == DType::i64 && indices.shape() == x.shape(), op,
             ": indices must be i64 of the input's shape ", x.shape(), ", got ",
             indices.defined() ? indices.type_str() : std::string("undefined"));
  Shape out(K);
  int64_t in_plane = 1, out_plane = 1;
  for (size_t i = 0; i < K; ++i) {
    const int64_t in = x.size(int64_t(i) - int64_t(K));
    out[i] = output_size ? (*output_size)[i] : (in - 1) * stride[i] - 2 * padding[i] + kernel[i];
    in_plane *= in;
    out_plane *= out[i];
  }
  for (size_t i = 0; i < K; ++i) KILN_CHECK(out[i] >= 1, op, ": output size ", out, " must be positive");
  const int64_t planes = x.numel() / std::max<int64_t>(in_plane, 1);
  const Tensor idx = indices.reshape({planes, in_plane}).contiguous();
  const Tensor xf = x.reshape({planes, in_plane});
  const Tensor base = zeros({planes, out_plane}, TensorOptions(xf.dtype(), x.device()));
  const Tensor sums = scatter_add(base, 1, idx, xf);
  const Tensor counts = scatter_add(base, 1, idx, ones_like(xf.detach()));
  Shape out_shape = x.shape();
  for (size_t i = 0; i < K; ++i) out_shape[out_shape.size() - K + i] = out[i];
  return where(gt(counts, ones_like(counts)), sums / counts, sums).reshape(out_shape);
}
}  // namespace

Tensor max_unpool2d(const Tensor& x, const Tensor& indices, Pair kernel, Pair stride, Pair padding,
                    std::optional<Pair> output_size) {
  const char* op = "max_unpool2d";
  const OpScope scope(op);
  check_pool_input(op, x, 2, "[N, C, H, W] or [C, H, W]");
  if (stride[0] == 0 && stride[1] == 0) stride = kernel;
  return unpool(op, x, indices, kernel, stride, padding, output_size);
}

Tensor max_unpool3d(const Tensor& x, const Tensor& indices, Triple kernel, Triple stride, Triple padding,
                    std::optional<Triple> output_size) {
  const char* op = "max_unpool3d";
  const OpScope scope(op);
  check_pool_input(op, x, 3, "[N, C, D, H, W] or [C, D, H, W]");
  return unpool(op, x, indices, kernel, stride_or_kernel(stride, kernel), padding, output_size);
}

Tensor max_unpool1d(const Tensor& x, const Tensor& indices, int64_t kernel, int64_t stride, int64_t padding,
                    std::optional<int64_t> output_size) {
  const OpScope scope("max_unpool1d");
  check_pool_input("max_unpool1d", x, 1, "[N, C, L] or [C, L]");
  const std::optional<Pair> out = output_size ? std::optional<Pair>(Pair{1, *output_size}) : std::nullopt;
  return max_unpool2d(x.unsqueeze(-2), indices.unsqueeze(-2), {1, kernel}, {1, stride ? stride : kernel}, {0, padding},
                      out)
      .squeeze(-2);
}

// ---- normalisation -------------------------------------------------------------------------------

Tensor group_norm(const Tensor& x, int64_t num_groups, const Tensor& gamma, const Tensor& beta, double eps) {
  KILN_CHECK(x.defined() && x.dim() >= 2, "group_norm: input must be [N, C, *], got ",
             x.defined() ? x.shape() : Shape{});
  const int64_t c = x.size(1);
  KILN_CHECK(num_groups >= 1 && c % num_groups == 0, "group_norm: num_groups ", num_groups,
             " must divide the channels ", c, " of input ", x.shape());
  for (const Tensor* t : {&gamma, &beta})
    if (t->defined())
      KILN_CHECK(t->dim() == 1 && t->size(0) == c, "group_norm: ", t == &gamma ? "gamma " : "beta ", t->shape(),
                 " must be [", c, "] for input ", x.shape());
  KILN_CHECK(x.numel() > 0, "group_norm: empty input ", x.shape());
  const Tensor xr = x.reshape({x.size(0), num_groups, -1});
  Tensor y = layer_norm(xr, {xr.size(2)}, {}, {}, eps).reshape(x.shape());
  if (gamma.defined()) y = y * gamma.reshape(channel_shape(x));
  if (beta.defined()) y = y + beta.reshape(channel_shape(x));
  return y;
}

Tensor instance_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps) {
  KILN_CHECK(x.defined() && x.dim() >= 3, "instance_norm: input must be [N, C, *] with at least one spatial dim, got ",
             x.defined() ? x.shape() : Shape{});
  return group_norm(x, x.size(1), gamma, beta, eps);
}

Tensor rms_norm(const Tensor& x_in, const Shape& normalized_shape, const Tensor& weight, std::optional<double> eps) {
  const Tensor x = amp::autocast_arg(amp::AutocastOp::layer_norm, x_in);  // f32 under autocast, as layer_norm
  const int64_t k = static_cast<int64_t>(normalized_shape.size());
  KILN_CHECK(x.defined() && is_floating(x.dtype()), "rms_norm: input must be a floating tensor");
  KILN_CHECK(k >= 1 && k <= x.dim() && Shape(x.shape().end() - k, x.shape().end()) == normalized_shape,
             "rms_norm: normalized_shape ", normalized_shape, " must be the trailing dims of input ", x.shape());
  if (weight.defined())
    KILN_CHECK(weight.shape() == normalized_shape, "rms_norm: weight ", weight.shape(), " must be ", normalized_shape);
  const DType dt = x.dtype(), ct = promote_types(dt, DType::f32);
  const double e = eps                 ? *eps
                   : dt == DType::f64  ? std::numeric_limits<double>::epsilon()
                   : dt == DType::f16  ? 0.0009765625
                   : dt == DType::bf16 ? 0.0078125
                                       : double(std::numeric_limits<float>::epsilon());
  KILN_CHECK(e >= 0, "rms_norm: eps must be >= 0, got ", e);
  std::vector<int64_t> dims;
  for (int64_t i = x.dim() - k; i < x.dim(); ++i) dims.push_back(i);
  const Tensor xf = dt == ct ? x : cast(x, ct);
  Tensor y = xf * rsqrt(mean(xf * xf, dims, true) + e);
  if (weight.defined()) y = y * (weight.dtype() == ct ? weight : cast(weight, ct));
  return y.dtype() == dt ? y : cast(y, dt);
}

Tensor local_response_norm(const Tensor& x_in, int64_t size, double alpha, double beta, double k) {
  const Tensor x = amp::autocast_arg(amp::AutocastOp::layer_norm, x_in);
  KILN_CHECK(x.defined() && x.dim() >= 2, "local_response_norm: input must be [N, C, *], got ",
             x.defined() ? x.shape() : Shape{});
  KILN_CHECK(size >= 1, "local_response_norm: size must be >= 1, got ", size);
  const int64_t n = x.size(0), c = x.size(1);
  // The channel window's mean of x^2 by average pooling down the channels of [N, 1, C, rest].
  const Tensor sq = (x * x).reshape({n, 1, c, x.numel() / std::max<int64_t>(n * c, 1)});
  const Tensor avg = avg_pool2d(pad(sq, {0, 0, size / 2, (size - 1) / 2}), {size, 1}, {1, 1});
  return x / pow(avg.reshape(x.shape()) * alpha + k, beta);
}

// ---- CTC ---------------------------------------------------------------------------------------------

namespace {
// "log 0" inside the recursion: finite, so that logsumexp and its gradient never meet -inf - -inf,
// and far below any sum of log-probabilities an alignment can have.
constexpr double kCtcLogZero = -1e30;
}  // namespace

Tensor ctc_loss(const Tensor& log_probs_in, const Tensor& targets, const std::vector<int64_t>& input_lengths,
                const std::vector<int64_t>& target_lengths, int64_t blank, Reduction reduction, bool zero_infinity) {
  KILN_CHECK(log_probs_in.defined() && (log_probs_in.dim() == 3 || log_probs_in.dim() == 2),
             "ctc_loss: log_probs must be [T, N, C] (or [T, C] for one sequence), got ",
             log_probs_in.defined() ? log_probs_in.shape() : Shape{});
  KILN_CHECK(is_floating(log_probs_in.dtype()), "ctc_loss: log_probs must be floating, got ", log_probs_in.type_str());
  KILN_CHECK(reduction != Reduction::batchmean, "ctc_loss: reduction batchmean is for kl_div; use mean, sum or none");
  const bool batched = log_probs_in.dim() == 3;
  // Computed in f32 at least (16-bit inputs are converted; autocast's rule for losses).
  Tensor lp = amp::autocast_arg(amp::AutocastOp::nll_loss, log_probs_in);
  if (is_low_precision(lp.dtype())) lp = lp.to(DType::f32);
  if (!batched) lp = lp.unsqueeze(1);
  // -inf log-probabilities (classes a softmax masked out) as "log 0": no gradient, no NaN.
  lp = clamp(lp, kCtcLogZero, std::nullopt);
  const int64_t T = lp.size(0), N = lp.size(1), C = lp.size(2);
  KILN_CHECK(blank >= 0 && blank < C, "ctc_loss: blank ", blank, " is not a class of log_probs (C = ", C, ")");
  KILN_CHECK(int64_t(input_lengths.size()) == N && int64_t(target_lengths.size()) == N, "ctc_loss: ", N,
             " sequences, but ", input_lengths.size(), " input lengths and ", target_lengths.size(), " target lengths");
  KILN_CHECK(targets.defined() && is_integral(targets.dtype()) && targets.dtype() != DType::boolean,
             "ctc_loss: targets must hold class indices (an integer dtype), got ",
             targets.defined() ? targets.type_str() : std::string("an undefined tensor"));
  int64_t total = 0, s_max = 0, t_max = 0, t_min = T;
  // Per sequence: its input length, whether it has no frames (then log P is 0 for an empty target,
  // "log 0" for any other), and the divisor of the mean (its target length, at least 1).
  const size_t count = static_cast<size_t>(N);
  std::vector<double> frames(count), no_frames(count), empty_ll(count), mean_div(count);
  for (int64_t n = 0; n < N; ++n) {
    const int64_t t_len = input_lengths[size_t(n)], s_len = target_lengths[size_t(n)];
    KILN_CHECK(t_len >= 0 && t_len <= T, "ctc_loss: input length ", t_len, " of sequence ", n,
               " is outside [0, T = ", T, "]");
    KILN_CHECK(s_len >= 0, "ctc_loss: target length ", s_len, " of sequence ", n, " is negative");
    total += s_len;
    s_max = std::max(s_max, s_len);
    t_max = std::max(t_max, t_len);
    t_min = std::min(t_min, t_len);
    frames[size_t(n)] = double(t_len);
    no_frames[size_t(n)] = t_len == 0 ? 1 : 0;
    empty_ll[size_t(n)] = s_len == 0 ? 0.0 : kCtcLogZero;
    mean_div[size_t(n)] = double(std::max<int64_t>(s_len, 1));
  }
  // Targets padded [N, S] (S >= every target length), or concatenated 1-D (the sum of the lengths); [S]
  // for one sequence. Read on the host: the labels are checked and the extended label rows built there.
  if (batched) {
    KILN_CHECK((targets.dim() == 2 && targets.size(0) == N && targets.size(1) >= s_max) ||
                   (targets.dim() == 1 && targets.size(0) == total),
               "ctc_loss: targets must be [N, S] with S >= the longest target (", s_max,
               ") or 1-D holding the sum of the target lengths (", total, "), got ", targets.shape());
  } else {
    KILN_CHECK(targets.dim() == 1 && targets.size(0) >= s_max,
               "ctc_loss: targets of one sequence must be [S] with S >= ", s_max, ", got ", targets.shape());
  }
  const std::vector<int64_t> tv = targets.values<int64_t>();
  const int64_t stride = targets.dim() == 2 ? targets.size(1) : 0;  // 0: concatenated
  // Extended labels l' = blank, l1, blank, l2, ..., blank (L = 2 S_max + 1 columns; a shorter target's
  // extra columns are blanks its alignments never reach). skip: s may come from s - 2 (l'_s is a label
  // different from l'_{s-2}). Last: the two columns an alignment may end in.
  const int64_t L = 2 * s_max + 1;
  std::vector<double> ext(size_t(N * L), double(blank)), skip(size_t(N * L), 0), last(size_t(N * 2), 0),
      last_ok(size_t(N * 2), 0), first_ok(size_t(N * L), 0);
  int64_t offset = 0;
  for (int64_t n = 0; n < N; ++n) {
    const int64_t len = target_lengths[size_t(n)];
    for (int64_t i = 0; i < len; ++i) {
      const int64_t c = tv[size_t(stride ? n * stride + i : offset + i)];
      KILN_CHECK(c >= 0 && c < C && c != blank, "ctc_loss: target ", i, " of sequence ", n, " is ", c,
                 c == blank ? " (the blank)" : "", ": labels must be classes in [0, ", C, ") other than blank ", blank);
      ext[size_t(n * L + 2 * i + 1)] = double(c);
      if (i > 0 && c != ext[size_t(n * L + 2 * i - 1)]) skip[size_t(n * L + 2 * i + 1)] = 1;
    }
    offset += len;
    first_ok[size_t(n * L)] = 1;
    if (len > 0) first_ok[size_t(n * L + 1)] = 1;
    last[size_t(2 * n)] = double(2 * len);
    last[size_t(2 * n + 1)] = double(std::max<int64_t>(2 * len - 1, 0));
    last_ok[size_t(2 * n)] = 1;
    last_ok[size_t(2 * n + 1)] = len > 0 ? 1 : 0;
  }
  const Device dev = lp.device();
  const TensorOptions i64(DType::i64, dev), flag(DType::boolean, dev);
  const Tensor ext_t = from_vector(ext, {1, N, L}, i64);
  // lp_ext[t, n, s] = log_probs[t, n, l'_s]
  const Tensor lp_ext = gather(lp, 2, ext_t.expand({T, N, L}).contiguous());
  const Tensor skip_t = from_vector(skip, {N, L}, flag);
  const Tensor zero = full({N, L}, kCtcLogZero, TensorOptions(lp.dtype(), dev));
  const Tensor zero2 = zero.narrow(1, 0, std::min<int64_t>(2, L));
  // alpha_t(s): log of the probability of the alignments of the first t + 1 frames that end at s.
  Tensor alpha = t_max > 0 ? where(from_vector(first_ok, {N, L}, flag), lp_ext.select(0, 0), zero) : zero;
  const Tensor frames_t = from_vector(frames, {N, 1}, i64);
  for (int64_t t = 1; t < t_max; ++t) {
    const Tensor from1 = L > 1 ? cat({zero2.narrow(1, 0, 1), alpha.narrow(1, 0, L - 1)}, 1) : zero;
    const Tensor from2 = L > 2 ? where(skip_t, cat({zero2, alpha.narrow(1, 0, L - 2)}, 1), zero) : zero;
    const Tensor next = logsumexp(stack({alpha, from1, from2}, 0), {0}) + lp_ext.select(0, t);
    // A sequence whose frames have all been read keeps its alpha.
    alpha = t < t_min ? next : where(gt(frames_t, scalar_like(double(t), frames_t)), next, alpha);
  }
  const Tensor ends = where(from_vector(last_ok, {N, 2}, flag), gather(alpha, 1, from_vector(last, {N, 2}, i64)),
                            full({N, 2}, kCtcLogZero, TensorOptions(lp.dtype(), dev)));
  const Tensor ll = where(from_vector(no_frames, {N}, flag), from_vector(empty_ll, {N}, TensorOptions(lp.dtype(), dev)),
                          logsumexp(ends, {1}));
  // No alignment (a target longer than its frames allow): the likelihood stayed at "log 0".
  const Tensor impossible = lt(ll.detach(), scalar_like(kCtcLogZero / 2, ll));
  const Tensor inf =
      full({N}, zero_infinity ? 0.0 : std::numeric_limits<double>::infinity(), TensorOptions(ll.dtype(), dev));
  Tensor per = where(impossible, inf, -ll);
  if (!batched) per = per.squeeze(0);
  if (reduction == Reduction::mean) {
    // PyTorch's mean: each loss over its target length (at least 1), then the mean over the batch.
    const Tensor len_t = from_vector(mean_div, batched ? Shape{N} : Shape{}, TensorOptions(per.dtype(), dev));
    return mean(per / len_t);
  }
  return reduction == Reduction::sum ? sum(per) : per;
}

}  // namespace kiln
