// The compute interface a device implements: a small table of functions over strided buffers.
// The engine validates, broadcasts and promotes; a backend only computes. kernels/cpu fills it
// for the CPU, kernels/cuda for NVIDIA GPUs.
#pragma once
#include <cstdint>

#include "base/dtype.h"
#include "base/macros.h"

namespace kiln {

constexpr int kMaxKernelDims = 8;

// A strided view as a kernel sees it: no ownership, no autograd. Sizes and strides in elements.
struct TensorDesc {
  void* data = nullptr;
  DType dtype = DType::f32;
  int ndim = 0;
  int64_t shape[kMaxKernelDims] = {};
  int64_t strides[kMaxKernelDims] = {};
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= shape[i];
    return n;
  }
};

enum class UnaryOp : uint8_t {
  neg, abs, sign, exp, log, sqrt, rsqrt, tanh, sigmoid, relu, gelu_erf, gelu_tanh,
  pow_scalar,  // x ^ p0
  clamp,       // clamp(x, p0, p1); NaN bounds mean "no bound"
  logical_not,
};
enum class BinaryOp : uint8_t {
  add,  // a + alpha * b
  sub,  // a - alpha * b
  mul, div, pow, maximum, minimum,
  eq, ne, lt, le, gt, ge, logical_and, logical_or,  // write bool
  relu_backward,       // b > 0 ? a : 0          (a: grad, b: relu output)
  gelu_erf_backward,   // a * gelu_erf'(b)       (b: input)
  gelu_tanh_backward,  // a * gelu_tanh'(b)
  sigmoid_backward,    // a * b * (1 - b)        (b: sigmoid output)
  tanh_backward,       // a * (1 - b * b)        (b: tanh output)
};
enum class ReduceOp : uint8_t { sum, max, min, argmax, argmin };
enum class RandomKind : uint8_t { uniform, normal, bernoulli };

// 2-D convolution of contiguous NCHW x [n,c,h,w] with weight [o, c/groups, kh, kw] into y [n,o,oh,ow].
struct Conv2dParams {
  int64_t n, c, h, w, o, kh, kw, sh, sw, ph, pw, dh, dw, groups, oh, ow;
  // x, y (and their gradients) channels_last, w [O, kh, kw, C/groups] in memory; only where the
  // backend says native_channels_last.
  bool nhwc = false;
};
// Pooling windows over contiguous NCHW planes: fixed (kernel, stride, padding, dilation) or
// adaptive (window i spans floor(i*H/OH) .. ceil((i+1)*H/OH)).
struct Pool2dParams {
  int64_t planes, h, w, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw;
  bool adaptive = false;
  bool count_include_pad = true;  // average pooling divisor
};

// Where row r of an attention mask starts: the rows of x ([..., n] viewed as rows x n) are indexed by
// the leading dims `size` (outermost first); the mask is broadcast over them with `stride` (0 where it
// is broadcast) and along the row with `step` (0 or 1).
struct MaskRows {
  static constexpr int kMaxDims = 7;
  int ndim = 0;
  int64_t size[kMaxDims] = {};
  int64_t stride[kMaxDims] = {};
  int64_t step = 1;
};
KILN_HD int64_t mask_row_offset(const MaskRows& m, int64_t r) {
  // Constant indices after unrolling: a kernel reads the struct from its parameters instead of
  // copying it to local memory to index it.
  int64_t off = 0;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int d = MaskRows::kMaxDims - 1; d >= 0; --d) {
    if (d >= m.ndim) continue;
    off += (r % m.size[d]) * m.stride[d];
    r /= m.size[d];
  }
  return off;
}

// One parameter of a fused optimizer step: f32 weights, gradient and state, updated in place.
struct OptimSlice {
  float* w;
  const float* g;
  float* s0;  // SGD: momentum buffer (null without momentum); Adam/LAMB: first moment
  float* s1;  // Adam/LAMB: second moment
  int64_t n;
  bool fresh;  // SGD: the momentum buffer starts as this step's direction
};
enum class OptimKind : uint8_t { sgd, adamw, lamb };
// In f64 as the user gave them; bc1/bc2 are Adam's bias corrections 1 - beta^t.
struct OptimHyper {
  double lr = 0, weight_decay = 0;
  double momentum = 0, dampening = 0;
  bool nesterov = false;
  double beta1 = 0, beta2 = 0, eps = 0, bc1 = 1, bc2 = 1;
};

struct Backend {
  const char* name;
  // dst[i] = src[i] for same-shaped views, converting dtypes.
  void (*copy)(const TensorDesc& dst, const TensorDesc& src);
  void (*fill)(const TensorDesc& dst, double value);
  void (*arange)(const TensorDesc& dst, double start, double step);
  // dst and src have one shape and dtype.
  void (*unary)(UnaryOp op, const TensorDesc& dst, const TensorDesc& src, double p0, double p1);
  // a and b have dst's shape (broadcast dims have stride 0) and one dtype; dst has it too, or
  // bool for comparisons and logical ops.
  void (*binary)(BinaryOp op, const TensorDesc& dst, const TensorDesc& a, const TensorDesc& b, double alpha);
  void (*where)(const TensorDesc& dst, const TensorDesc& cond, const TensorDesc& a, const TensorDesc& b);
  // Contiguous src viewed as [outer, r, inner] reduced over r into contiguous dst [outer, inner].
  // sum accumulates floats in f64 in a fixed order (results do not depend on the thread count);
  // dst has src's dtype except sum of integers (i64) and argmax/argmin (i64).
  void (*reduce)(ReduceOp op, void* dst, DType dst_dtype, const void* src, DType src_dtype, int64_t outer,
                 int64_t r, int64_t inner);
  // Row-major C = alpha * op(A) op(B) + beta * C for f32 and f64; beta == 0 never reads C.
  void (*gemm)(DType dtype, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha, const void* a,
               int64_t lda, const void* b, int64_t ldb, double beta, void* c, int64_t ldc);
  // `batch` GEMMs at once, operand i of product b at base + b * stride (elements; a stride may be
  // 0 to reuse an operand). Null where the backend has no batched GEMM: the engine then loops.
  void (*gemm_batched)(DType dtype, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
                       const void* a, int64_t lda, int64_t stride_a, const void* b, int64_t ldb, int64_t stride_b,
                       double beta, void* c, int64_t ldc, int64_t stride_c, int64_t batch);
  // Contiguous dst filled from the Philox stream (seed, offset): uniform [p0, p1), normal (mean p0,
  // std p1), bernoulli (probability p0).
  void (*random)(RandomKind kind, const TensorDesc& dst, uint64_t seed, uint64_t offset, double p0, double p1);

  // ---- neural-network kernels; every buffer contiguous, dtype f32 or f64 on the CPU ----
  void (*conv2d_forward)(DType dt, const Conv2dParams& p, const void* x, const void* w, const void* bias, void* y);
  // Writes (does not accumulate) gx and gw where non-null.
  void (*conv2d_backward)(DType dt, const Conv2dParams& p, const void* x, const void* w, const void* gy, void* gx,
                          void* gw);
  // Max pooling writes y and the flat index (ih * W + iw) of each maximum within its plane.
  void (*max_pool2d_forward)(DType dt, const Pool2dParams& p, const void* x, void* y, int64_t* idx);
  void (*max_pool2d_backward)(DType dt, const Pool2dParams& p, const void* gy, const int64_t* idx, void* gx);
  void (*avg_pool2d_forward)(DType dt, const Pool2dParams& p, const void* x, void* y);
  void (*avg_pool2d_backward)(DType dt, const Pool2dParams& p, const void* gy, void* gx);
  // Softmax or log-softmax over the middle dim of [outer, n, inner].
  void (*softmax_forward)(DType dt, bool log, int64_t outer, int64_t n, int64_t inner, const void* x, void* y);
  // gx = y * (gy - sum(gy * y)) for softmax, gy - exp(y) * sum(gy) for log-softmax (y: the output).
  void (*softmax_backward)(DType dt, bool log, int64_t outer, int64_t n, int64_t inner, const void* y, const void* gy,
                           void* gx);
  // Attention's softmax in one pass over contiguous rows of n: y = softmax(scale * x + mask), mask
  // (same dtype, may be null) placed by MaskRows. Rows that are all -inf follow softmax's rule.
  void (*masked_softmax_forward)(DType dt, int64_t rows, int64_t n, const void* x, double scale, const void* mask,
                                 const MaskRows& mask_rows, void* y);
  // gx = scale * y * (gy - sum(gy * y)).
  void (*masked_softmax_backward)(DType dt, int64_t rows, int64_t n, const void* y, const void* gy, double scale,
                                  void* gx);
  // Layer norm over rows of length d: y = (x - mean) * rstd * gamma + beta (gamma/beta may be null);
  // writes mean and rstd (f32 or f64, one per row) for the backward.
  void (*layer_norm_forward)(DType dt, int64_t rows, int64_t d, double eps, const void* x, const void* gamma,
                             const void* beta, void* y, void* mean, void* rstd);
  void (*layer_norm_backward)(DType dt, int64_t rows, int64_t d, const void* x, const void* gamma, const void* mean,
                              const void* rstd, const void* gy, void* gx, void* ggamma, void* gbeta);
  // Batch norm over NCHW viewed as [n, c, hw]. Training: batch statistics into mean/rstd (and the
  // running buffers updated with momentum, unbiased variance); eval: running statistics.
  void (*batch_norm_forward)(DType dt, int64_t n, int64_t c, int64_t hw, double eps, double momentum, bool training,
                             const void* x, const void* gamma, const void* beta, void* running_mean,
                             void* running_var, void* y, void* mean, void* rstd, bool nhwc);
  // eps is the forward's (cuDNN asks for the same value in both passes); mean/rstd are the forward's outputs.
  // nhwc (only where native_channels_last): x, y, gy and gx lie as [n, hw, c] in memory.
  void (*batch_norm_backward)(DType dt, int64_t n, int64_t c, int64_t hw, bool training, double eps, const void* x,
                              const void* gamma, const void* mean, const void* rstd, const void* gy, void* gx,
                              void* ggamma, void* gbeta, bool nhwc);
  // Cross-entropy of logits [rows, classes] against i64 targets, with ignore_index and label
  // smoothing; writes per-row losses (0 for ignored rows) and, when grad_scale != 0, the gradient
  // grad_scale * d loss_row / d logits into glogits.
  void (*cross_entropy)(DType dt, int64_t rows, int64_t classes, const void* logits, const int64_t* target,
                        int64_t ignore_index, double smoothing, void* loss, void* glogits, double grad_scale);
  // Gather along the middle dim: dst[o, i, in] = src[o, idx[i], in] ([outer, n_src, inner] -> [outer, n_idx, inner]).
  void (*index_select)(DType dt, int64_t outer, int64_t n_src, int64_t inner, const void* src, int64_t n_idx,
                       const int64_t* idx, void* dst);
  // The adjoint: dst[o, idx[i], in] += src[o, i, in], in a fixed order.
  void (*index_add)(DType dt, int64_t outer, int64_t n_dst, int64_t inner, void* dst, int64_t n_idx,
                    const int64_t* idx, const void* src);
  // Elementwise along the middle dim with a full index tensor: gather dst[o,i,in] = src[o, idx[o,i,in], in];
  // scatter_add dst[o, idx[o,i,in], in] += src[o,i,in].
  void (*gather)(DType dt, int64_t outer, int64_t n_src, int64_t inner, const void* src, int64_t n_idx,
                 const int64_t* idx, void* dst);
  void (*scatter_add)(DType dt, int64_t outer, int64_t n_dst, int64_t inner, void* dst, int64_t n_idx,
                      const int64_t* idx, const void* src);

  // ---- mixed precision ----
  // One pass over a contiguous floating buffer: x *= inv_scale, and *found_inf (an f32 flag in the
  // backend's memory, so a GPU step never waits for the host) is set to 1 if any element is inf or NaN.
  void (*unscale_check)(DType dt, int64_t n, void* x, double inv_scale, float* found_inf);

  // ---- optimizers ----
  // One fused step over `count` parameters of one group (multi-tensor: one pass over each weight,
  // gradient and state; LAMB's per-tensor trust ratios never leave the device). The arithmetic is
  // kernels/common/optim_math.h, the same as the unfused tensor ops.
  void (*optimizer_step)(OptimKind kind, const OptimSlice* slices, int64_t count, const OptimHyper& h);

  // gemm and conv2d take f16 and bf16 operands themselves (with f32 accumulation) instead of
  // the engine converting them to f32 first: true on CUDA (tensor cores), false on the CPU.
  bool native_16bit_gemm_conv = false;
  // conv2d and batch norm take channels_last (NHWC) buffers themselves (Conv2dParams::nhwc, the
  // batch-norm `nhwc` flag): true on CUDA (cuDNN), false on the CPU, which computes NCHW copies.
  bool native_channels_last = false;
};

const Backend& cpu_backend();

}  // namespace kiln
