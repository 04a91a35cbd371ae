// The neural-network ops ResNet and BERT need, each differentiable: convolution, pooling,
// normalisation, softmax and losses, embedding, dropout, attention, and tensor assembly/indexing.
#pragma once
#include <array>
#include <optional>
#include <string>
#include <vector>

#include "engine/ops.h"

namespace kiln {

using Pair = std::array<int64_t, 2>;

// x @ weight^T + bias: x [..., in], weight [out, in], bias [out] or undefined.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = {});

// x [N, C, H, W], weight [O, C/groups, kh, kw], bias [O] or undefined.
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = {}, Pair stride = {1, 1},
              Pair padding = {0, 0}, Pair dilation = {1, 1}, int64_t groups = 1);

// The adjoint of conv2d (a "deconvolution"): x [N, C_in, H, W], weight [C_in, C_out/groups, kh, kw],
// bias [C_out]; output size (H - 1) stride - 2 padding + dilation (kh - 1) + output_padding + 1, with
// output_padding smaller than the stride or the dilation. torch.nn.functional.conv_transpose2d's argument order.
Tensor conv_transpose2d(const Tensor& x, const Tensor& weight, const Tensor& bias = {}, Pair stride = {1, 1},
                        Pair padding = {0, 0}, Pair output_padding = {0, 0}, int64_t groups = 1,
                        Pair dilation = {1, 1});
// 1-D: x [N, C, L], weight [O, C/groups, k] (transposed: [C_in, C_out/groups, k]); conv2d over a
// height of 1.
Tensor conv1d(const Tensor& x, const Tensor& weight, const Tensor& bias = {}, int64_t stride = 1, int64_t padding = 0,
              int64_t dilation = 1, int64_t groups = 1);
Tensor conv_transpose1d(const Tensor& x, const Tensor& weight, const Tensor& bias = {}, int64_t stride = 1,
                        int64_t padding = 0, int64_t output_padding = 0, int64_t groups = 1, int64_t dilation = 1);
// 3-D: x [N, C, D, H, W], weight [O, C/groups, kd, kh, kw]: kd convolutions in 2-D over the depth
// slices each kernel plane meets, summed (in f32 for 16-bit inputs).
using Triple = std::array<int64_t, 3>;
Tensor conv3d(const Tensor& x, const Tensor& weight, const Tensor& bias = {}, Triple stride = {1, 1, 1},
              Triple padding = {0, 0, 0}, Triple dilation = {1, 1, 1}, int64_t groups = 1);
// padding="same" (stride 1): the output keeps the input's size. Of the total dilation (k - 1) per dim
// the odd one out goes after (right, bottom, back), as PyTorch; then the input is padded with zeros
// first. Other asymmetric padding: pad() the input, then convolve without padding.
struct SamePadding {};
inline constexpr SamePadding kSame{};
Tensor conv1d(const Tensor& x, const Tensor& weight, const Tensor& bias, SamePadding, int64_t dilation = 1,
              int64_t groups = 1);
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, SamePadding, Pair dilation = {1, 1},
              int64_t groups = 1);
Tensor conv3d(const Tensor& x, const Tensor& weight, const Tensor& bias, SamePadding, Triple dilation = {1, 1, 1},
              int64_t groups = 1);

// stride {0, 0} means stride = kernel. Floor mode output sizes.
// ceil_mode: ceil output sizes (a last window starting in the right padding is dropped, as PyTorch).
Tensor max_pool2d(const Tensor& x, Pair kernel, Pair stride = {0, 0}, Pair padding = {0, 0}, Pair dilation = {1, 1},
                  bool ceil_mode = false);
// return_indices: each maximum's flat index h * W + w within its plane (the first one in a tie).
ValuesIndices max_pool2d_with_indices(const Tensor& x, Pair kernel, Pair stride = {0, 0}, Pair padding = {0, 0},
                                      Pair dilation = {1, 1}, bool ceil_mode = false);
// divisor_override > 0 divides every window's sum by it. (ceil_mode and divisor_override come after
// count_include_pad, unlike PyTorch's order, so that older calls keep their meaning.)
Tensor avg_pool2d(const Tensor& x, Pair kernel, Pair stride = {0, 0}, Pair padding = {0, 0},
                  bool count_include_pad = true, bool ceil_mode = false, int64_t divisor_override = 0);
// 1-D pooling of [N, C, L] or [C, L] (the 2-D kernels over a height of 1); indices are positions in L.
Tensor max_pool1d(const Tensor& x, int64_t kernel, int64_t stride = 0, int64_t padding = 0, int64_t dilation = 1,
                  bool ceil_mode = false);
ValuesIndices max_pool1d_with_indices(const Tensor& x, int64_t kernel, int64_t stride = 0, int64_t padding = 0,
                                      int64_t dilation = 1, bool ceil_mode = false);
Tensor avg_pool1d(const Tensor& x, int64_t kernel, int64_t stride = 0, int64_t padding = 0,
                  bool count_include_pad = true, bool ceil_mode = false);
// 3-D pooling of [N, C, D, H, W] or [C, D, H, W], separably: the 2-D pool over (H, W) of each depth
// slice, then a pool down the depth (max of maxima; the average's divisor is the product of the
// per-dim counts, which is what a 3-D window's count is). stride {0, 0, 0} means stride = kernel.
Tensor max_pool3d(const Tensor& x, Triple kernel, Triple stride = {0, 0, 0}, Triple padding = {0, 0, 0},
                  Triple dilation = {1, 1, 1}, bool ceil_mode = false);
// return_indices: each maximum's flat index (d H + h) W + w within its volume, the first in (d, h, w)
// order in a tie (the depth pass picks the first slice, the slice's 2-D pass its first position).
ValuesIndices max_pool3d_with_indices(const Tensor& x, Triple kernel, Triple stride = {0, 0, 0},
                                      Triple padding = {0, 0, 0}, Triple dilation = {1, 1, 1}, bool ceil_mode = false);
Tensor avg_pool3d(const Tensor& x, Triple kernel, Triple stride = {0, 0, 0}, Triple padding = {0, 0, 0},
                  bool count_include_pad = true, bool ceil_mode = false, int64_t divisor_override = 0);
// The inverse of max pooling: x's values put at `indices` (max_pool*_with_indices' flat positions
// within each plane) of a zero plane of output_size (default (in - 1) stride - 2 padding + kernel);
// the rest are 0. Entries naming the same position (overlapping windows' picks of one element) give
// their mean and share its gradient, so unpooling a max pool passes each element's gradient once.
Tensor max_unpool2d(const Tensor& x, const Tensor& indices, Pair kernel, Pair stride = {0, 0}, Pair padding = {0, 0},
                    std::optional<Pair> output_size = std::nullopt);
Tensor max_unpool1d(const Tensor& x, const Tensor& indices, int64_t kernel, int64_t stride = 0, int64_t padding = 0,
                    std::optional<int64_t> output_size = std::nullopt);
// [N, C, D, H, W] or [C, D, H, W] with max_pool3d_with_indices' indices.
Tensor max_unpool3d(const Tensor& x, const Tensor& indices, Triple kernel, Triple stride = {0, 0, 0},
                    Triple padding = {0, 0, 0}, std::optional<Triple> output_size = std::nullopt);
Tensor adaptive_avg_pool2d(const Tensor& x, Pair output_size);

// x [N, C, *]. In training, normalises with batch statistics and updates running_mean/var in place
// (momentum, unbiased variance); in eval, uses them. gamma/beta [C] or undefined.
Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& gamma,
                  const Tensor& beta, bool training, double momentum = 0.1, double eps = 1e-5);
// relu(batch_norm(x, ...) + residual), residual (x's shape) optional: ResNet's "BN, ReLU" and "BN, add
// the shortcut, ReLU" as one op. The CPU applies the residual and ReLU as batch norm writes y and masks
// the gradient inside batch norm's backward passes, so neither costs a pass over the tensor; the result
// has the bits of the three ops in a row in f32 and f64 (in f16/bf16 the residual is added before
// rounding). The backward keeps y for ReLU's mask.
Tensor batch_norm_relu(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& gamma,
                       const Tensor& beta, bool training, double momentum = 0.1, double eps = 1e-5,
                       const Tensor& residual = {});
// batch_norm without its eps check, for instance_norm with running statistics (Python's
// F.instance_norm): x is the input as [1, N*C, ...] and the per-channel tensors are repeated N times;
// use_input_stats is batch_norm's training. PyTorch takes any eps there (eps=0 included); errors name
// instance_norm.
Tensor instance_norm_running(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                             const Tensor& gamma, const Tensor& beta, bool use_input_stats, double momentum,
                             double eps);
// Normalises over the trailing dims given by normalized_shape; gamma/beta of that shape or undefined.
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& gamma = {}, const Tensor& beta = {},
                  double eps = 1e-5);

// group_norm: x [N, C, *] normalised over each group of C / num_groups channels (and all of *), then
// gamma/beta [C] per channel; instance_norm: one group per channel (statistics of each sample's
// planes; no running statistics, as InstanceNorm's default). Both through layer norm's kernel.
Tensor group_norm(const Tensor& x, int64_t num_groups, const Tensor& gamma = {}, const Tensor& beta = {},
                  double eps = 1e-5);
Tensor instance_norm(const Tensor& x, const Tensor& gamma = {}, const Tensor& beta = {}, double eps = 1e-5);
// x / sqrt(mean(x^2 over the trailing normalized_shape) + eps) * weight, computed in f32 at least;
// eps by default the dtype's machine epsilon (torch.nn.functional.rms_norm).
Tensor rms_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = {},
                std::optional<double> eps = std::nullopt);
// x / (k + alpha / size * sum of x^2 over `size` neighbouring channels)^beta, the window running from
// c - size/2 to c + (size-1)/2 (zeros past the ends), x [N, C, *].
Tensor local_response_norm(const Tensor& x, int64_t size, double alpha = 1e-4, double beta = 0.75, double k = 1.0);

// Activations, as torch.nn.functional defines them (defaults included).
Tensor silu(const Tensor& x);  // x * sigmoid(x), also called swish
Tensor mish(const Tensor& x);  // x * tanh(softplus(x))
Tensor softplus(const Tensor& x, double beta = 1.0, double threshold = 20.0);
Tensor softsign(const Tensor& x);
Tensor logsigmoid(const Tensor& x);
Tensor leaky_relu(const Tensor& x, double negative_slope = 0.01);
Tensor elu(const Tensor& x, double alpha = 1.0);
Tensor selu(const Tensor& x);
Tensor celu(const Tensor& x, double alpha = 1.0);
Tensor hardtanh(const Tensor& x, double min_val = -1.0, double max_val = 1.0);  // gradient 0 at and past the bounds
Tensor relu6(const Tensor& x);
Tensor hardsigmoid(const Tensor& x);
Tensor hardswish(const Tensor& x);
// x where x > 0, else weight * x; weight [1] or [C] with C = x.size(1) (one slope per channel).
Tensor prelu(const Tensor& x, const Tensor& weight);
// a * sigmoid(b) for the two halves a, b of x along dim (its size must be even).
Tensor glu(const Tensor& x, int64_t dim = -1);
Tensor softmax(const Tensor& x, int64_t dim);
Tensor log_softmax(const Tensor& x, int64_t dim);
// softmax(scale * x + mask) over the last dim in one kernel (attention's scores): mask additive,
// broadcastable to x's shape (no more dims than x), and may be undefined; a bool mask keeps its True
// places and leaves out the others (adds 0 or -inf: PyTorch's scaled_dot_product_attention rule). A
// row with every place left out gives zeros. The result has x's dtype (the mask is converted to it),
// softmax's autocast rule applies. Gradients flow to x and to a floating mask that requires them.
// causal: query i of the last-but-one dim (L) sees keys j <= i (top_left, PyTorch's is_causal) or
// j <= i + S - L (bottom_right: the queries are the last L of S positions, as with a KV cache), in
// the kernel, with no mask tensor; it combines with `mask`.
enum class Causal { none, top_left, bottom_right };
Tensor masked_softmax(const Tensor& x, const Tensor& mask, double scale = 1.0, Causal causal = Causal::none);

// batchmean: the sum divided by the size of dim 0 (kl_div's mathematically right mean).
enum class Reduction { none, mean, sum, batchmean };
// logits [N, C] or [N, C, d...], target i64 [N] or [N, d...]. Mean is over non-ignored targets.
// weight [C] (optional): each target's loss times weight[target], and the mean divides by the sum of
// those weights (PyTorch's rule; with label smoothing the smoothing term weighs each class too).
Tensor cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index = -100,
                     double label_smoothing = 0.0, Reduction reduction = Reduction::mean, const Tensor& weight = {});
Tensor nll_loss(const Tensor& log_probs, const Tensor& target, int64_t ignore_index = -100,
                Reduction reduction = Reduction::mean, const Tensor& weight = {});
Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::mean);
Tensor binary_cross_entropy_with_logits(const Tensor& logits, const Tensor& target,
                                        Reduction reduction = Reduction::mean);
// Regression losses on same-shaped input and target: |d|; smooth L1 (0.5 d^2 / beta where |d| < beta,
// else |d| - 0.5 beta); Huber (0.5 d^2 where |d| <= delta, else delta (|d| - 0.5 delta)).
Tensor l1_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::mean);
Tensor smooth_l1_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::mean,
                      double beta = 1.0);
Tensor huber_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::mean, double delta = 1.0);
// Binary cross-entropy on probabilities: -(y log p + (1 - y) log(1 - p)), each log clamped at -100 as
// PyTorch does (p = 0 or 1 gives a finite loss); weight (optional) broadcasts over the elements.
Tensor binary_cross_entropy(const Tensor& probs, const Tensor& target, Reduction reduction = Reduction::mean,
                            const Tensor& weight = {});
// KL(target || input) with input as log-probabilities: target (log target - input), 0 where target is
// exactly 0, NaN where it is negative (PyTorch's); log_target: target given as log-probabilities. Mean
// is over elements (PyTorch's default); use batchmean for the true mean KL per sample.
Tensor kl_div(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::mean,
              bool log_target = false);
// max(0, -y (x1 - x2) + margin), y = +-1.
Tensor margin_ranking_loss(const Tensor& x1, const Tensor& x2, const Tensor& y, double margin = 0.0,
                           Reduction reduction = Reduction::mean);
// x1 . x2 / max(|x1| |x2|, eps) along dim.
Tensor cosine_similarity(const Tensor& x1, const Tensor& x2, int64_t dim = 1, double eps = 1e-8);
// Rows of x1, x2 [N, D] and y [N] = +-1: 1 - cos where y = 1, max(0, cos - margin) where y = -1.
Tensor cosine_embedding_loss(const Tensor& x1, const Tensor& x2, const Tensor& y, double margin = 0.0,
                             Reduction reduction = Reduction::mean);
// Connectionist temporal classification (Graves et al. 2006): per sequence, -log of the summed
// probability of every alignment of its target to its frames. log_probs [T, N, C] (log-softmax
// outputs; [T, C] for one sequence), targets [N, S] padded or 1-D concatenated ([S] for one sequence;
// labels in [0, C) other than blank), a length per sequence (input lengths in [0, T]). The targets are
// read on the host. A target its frames cannot hold gives +inf (0 with zero_infinity, and no
// gradient). mean: each loss over its target length (at least 1), then the mean over the batch.
// Computed in f32 at least; the gradient is the exact one with respect to log_probs (PyTorch's adds
// exp(log_probs), which cancels through log_softmax: the gradients for the logits agree).
Tensor ctc_loss(const Tensor& log_probs, const Tensor& targets, const std::vector<int64_t>& input_lengths,
                const std::vector<int64_t>& target_lengths, int64_t blank = 0, Reduction reduction = Reduction::mean,
                bool zero_infinity = false);

// weight [V, D], indices i64 of any shape -> [..., D]. Rows at padding_idx get no gradient.
Tensor embedding(const Tensor& weight, const Tensor& indices, int64_t padding_idx = -1);
// Zeroes elements with probability p and scales the rest by 1/(1-p); the mask comes from the
// Philox stream, so a (seed, offset) reproduces it on any device.
Tensor dropout(const Tensor& x, double p, bool training, Generator* gen = nullptr);
// q [..., L, D], k [..., S, D], v [..., S, Dv]; mask additive, broadcastable to [..., L, S], or bool
// (True: attended, as PyTorch's; see masked_softmax). k and v
// may have fewer heads (dim -3) than q, dividing them (grouped-query and multi-query attention):
// query head h reads key/value head h / (q heads / kv heads).
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask = {},
                                    double dropout_p = 0.0, bool training = false, Generator* gen = nullptr);
// The same attention with its options: a causal mask computed in the softmax kernel (combinable with
// `mask`, which also serves as an additive attention bias), a scale (default 1/sqrt(head size)), a
// softcap (> 0: scores become softcap tanh(scores / softcap) before the masks), dropout. With
// need_weights, also the attention probabilities [..., L, S] (before dropout).
struct AttentionOptions {
  Causal causal = Causal::none;
  std::optional<double> scale;
  double softcap = 0.0;
  double dropout_p = 0.0;
  bool training = false;
  Generator* gen = nullptr;
};
struct AttentionOutput {
  Tensor out, weights;
};
AttentionOutput attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask = {},
                          const AttentionOptions& options = {}, bool need_weights = false);

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim);
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim);
std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim);
// indices i64 1-D.
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& indices);
// indices i64 of x's rank, no larger than x outside dim; out (indices' shape) [..i..] = x[..indices[..i..]..]
// along dim.
Tensor gather(const Tensor& x, int64_t dim, const Tensor& indices);
// out = x, then out[..indices[..i..]..] += src[..i..] along dim; indices no larger than src (whose part
// they cover is read) nor than x outside dim, as torch's (so for scatter and scatter_reduce).
Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& indices, const Tensor& src);
// out = x, then out[..indices[..i..]..] = src[..i..] along dim; of several writes to one place the
// last in index order wins (deterministic; PyTorch leaves it unspecified), and only it gets gradient.
Tensor scatter(const Tensor& x, int64_t dim, const Tensor& indices, const Tensor& src);
// torch.scatter_reduce: the writes to each place combined by sum, prod, mean, amax or amin, with x's
// own value (include_self) or without it (then a place nothing writes keeps x). Gradients as PyTorch:
// amax/amin share among the participants equal to the result; prod's is exact with zeros.
enum class ScatterReduce { sum, prod, mean, amax, amin };
Tensor scatter_reduce(const Tensor& x, int64_t dim, const Tensor& indices, const Tensor& src, ScatterReduce reduce,
                      bool include_self = true);
// i64 [..., num_classes]; num_classes -1: the largest index + 1. An index outside [0, num_classes) is
// an error naming the span (OutOfRange::error), or gets a row of zeros (OutOfRange::zeros).
enum class OutOfRange { error, zeros };
Tensor one_hot(const Tensor& indices, int64_t num_classes, OutOfRange policy = OutOfRange::error);
// The coordinates of the non-zero elements, i64 [count, dims], in row-major order (one host read for
// the count, as every framework's nonzero).
Tensor nonzero(const Tensor& x);
// x with the positions where mask (bool, broadcast to x) is true taken, in row-major order, from the
// leading elements of src (which must have at least as many); gradients to x and src.
Tensor masked_scatter(const Tensor& x, const Tensor& mask, const Tensor& src);
// x[indices...] = values (x.index_put_ out of place): i64 index tensors (negative ones count from the
// end) for the leading dims, broadcast together, or bool masks standing for their true coordinates;
// values broadcast to [index shape..., the remaining dims]. Repeated places: the last write wins, or
// with accumulate the writes add up (torch.index_put with accumulate=True).
Tensor index_put(const Tensor& x, const std::vector<Tensor>& indices, const Tensor& values, bool accumulate = false);
// Shape ops built from the ones above (gradients come with them). tril / triu keep the elements of the
// last two dims with col - row <= k / >= k and zero the rest.
Tensor tril(const Tensor& x, int64_t k = 0);
Tensor triu(const Tensor& x, int64_t k = 0);
Tensor flip(const Tensor& x, const std::vector<int64_t>& dims);
// Shifts along dim by `shift` with wrap-around (element i goes to (i + shift) mod size).
Tensor roll(const Tensor& x, int64_t shift, int64_t dim);
// x repeated reps[i] times along dim i (numpy.tile, torch.Tensor.repeat); more reps than dims adds
// leading dims.
Tensor tile(const Tensor& x, const std::vector<int64_t>& reps);
// `chunks` pieces of ceil(size / chunks) along dim (fewer when that leaves nothing for the last).
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim);
std::vector<Tensor> unbind(const Tensor& x, int64_t dim);  // the slices along dim, that dim removed
// The diagonal of dims dim1 and dim2 (above it for offset > 0, below for offset < 0) as a new last dim,
// the others kept in order: a view sharing x's storage (writes into it reach x), as torch.diagonal.
Tensor diagonal(const Tensor& x, int64_t offset = 0, int64_t dim1 = 0, int64_t dim2 = 1);
// gather with indices broadcast against x in every dim but `dim` (torch.take_along_dim).
Tensor take_along_dim(const Tensor& x, const Tensor& indices, int64_t dim);
enum class PadMode { constant, reflect, replicate, circular };
// Pads the last pad.size() / 2 dims, in torch.nn.functional.pad's order: {left, right} of the last
// dim, then {before, after} of the one before it, ... Negative amounts crop (constant mode). reflect
// mirrors without repeating the edge (pad < size), replicate repeats the edge, circular wraps
// (pad <= size).
Tensor pad(const Tensor& x, const std::vector<int64_t>& pad, PadMode mode = PadMode::constant, double value = 0.0);
// Resizes the spatial dims (all after the first two) of [N, C, ...] to `size`, one value per spatial dim,
// separably, as PyTorch's modes: nearest (source index floor(dst * in / out), the step in float, as
// PyTorch's 'nearest'; on 4-d input, as its 2-d kernel, a copy where out == in and dst / 2 where out ==
// 2 in, whatever the scale), nearest_exact (floor((dst + 0.5) in / out), 'nearest-exact'), linear / bilinear /
// trilinear (the one linear rule on 3-, 4- and 5-d input; align_corners false: source (dst + 0.5) in / out - 0.5,
// clamped at 0; true: dst (in - 1) / (out - 1)), bicubic (4-d; PyTorch's cubic convolution, A = -0.75, over 4 taps per
// dim clamped to the edge: values may overshoot the input's range, as there) and area (the mean over adaptive average
// pooling's windows [floor(o in / out), ceil((o + 1) in / out))). nearest, nearest_exact and area take 3- to 5-d input;
// align_corners is for the linear modes and bicubic. interpolate_scale: size floor(in * scale), and without
// align_corners the source coordinates step by 1 / scale, as PyTorch's default; with recompute_scale_factor by in /
// out, as interpolate to that size (the two differ where in * scale is not whole: 5 -> 7 at scale 1.5). area ignores
// the scale.
enum class InterpMode { nearest, bilinear, bicubic, linear, trilinear, nearest_exact, area };
Tensor interpolate(const Tensor& x, const std::vector<int64_t>& size, InterpMode mode = InterpMode::nearest,
                   bool align_corners = false);
Tensor interpolate_scale(const Tensor& x, const std::vector<double>& scale_factor,
                         InterpMode mode = InterpMode::nearest, bool align_corners = false,
                         bool recompute_scale_factor = false);
// [N, C r^2, H, W] <-> [N, C, H r, W r] (sub-pixel convolution's rearrangement).
Tensor pixel_shuffle(const Tensor& x, int64_t r);
Tensor pixel_unshuffle(const Tensor& x, int64_t r);
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);
// An int value: written into an integer x exactly (every int64 into i64), refused where it does not fit x's
// dtype; into a float or bool x as the double overload.
Tensor masked_fill(const Tensor& x, const Tensor& mask, int64_t value);

}  // namespace kiln
