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
  neg,
  abs,
  sign,
  exp,
  log,
  sqrt,
  rsqrt,
  tanh,
  sigmoid,
  relu,
  gelu_erf,
  gelu_tanh,
  pow_scalar,  // x ^ p0
  clamp,       // clamp(x, p0, p1); NaN bounds mean "no bound"
  logical_not,
  // Floating point only (kernels/common/math.h has the ones <cmath> lacks):
  sin,
  cos,
  tan,
  asin,
  acos,
  atan,
  sinh,
  cosh,
  asinh,
  acosh,
  atanh,
  erf,
  erfc,
  erfinv,
  log1p,
  // torch.special's gamma and Bessel family (kernels/common/math.h)
  lgamma,
  digamma,
  polygamma,  // the p0-th derivative of digamma (p0 a whole number >= 0)
  i0,
  i0e,  // e^-|x| i0(x)
  i1,
  i1e,  // e^-|x| i1(x)
  ndtri,
  log_ndtr,
  erfcx,  // e^(x^2) erfc(x)
  expm1,
  log2,
  log10,
  exp2,
  reciprocal,
  floor,
  ceil,
  round,  // round: half to even
  trunc,
  frac,  // frac: x - trunc(x)
  silu,
  mish,
  softsign,
  logsigmoid,
  hardsigmoid,
  hardswish,
  softplus,     // log(1 + e^(p0 x)) / p0; x where p0 x > p1 (beta, threshold)
  leaky_relu,   // x > 0 ? x : p0 x
  elu,          // p1 (x > 0 ? x : p0 (e^x - 1))   (alpha, scale: selu is elu with its two constants)
  celu,         // x > 0 ? x : p0 (e^(x / p0) - 1)
  bitwise_not,  // ~x for integers, !x for bool; not defined for floating types
};
enum class BinaryOp : uint8_t {
  add,  // a + alpha * b
  sub,  // a - alpha * b
  mul,
  div,
  pow,
  maximum,
  minimum,
  fmod,       // a - b * trunc(a / b), exactly (C's fmod; the sign of a)
  remainder,  // a - b * floor(a / b), exactly (Python's %; the sign of b)
  atan2,      // atan2(a, b): the angle of (b, a); floating only
  eq,
  ne,
  lt,
  le,
  gt,
  ge,
  logical_and,
  logical_or,          // write bool
  relu_backward,       // b <= 0 ? 0 : a         (a: grad, b: relu output; NaN b passes a)
  gelu_erf_backward,   // a * gelu_erf'(b)       (b: input)
  gelu_tanh_backward,  // a * gelu_tanh'(b)
  sigmoid_backward,    // a * b * (1 - b)        (b: sigmoid output)
  tanh_backward,       // a * (1 - b * b)        (b: tanh output)
  // Integers and bool only (for bool: and, or, xor); the shifts integers only, as PyTorch's
  // (kernels/common/int_arith.h: an amount out of [0, width) gives 0, or the sign fill to the right).
  bitwise_and,
  bitwise_or,
  bitwise_xor,
  shift_left,
  shift_right,
};
enum class ReduceOp : uint8_t { sum, max, min, argmax, argmin };
// Running scans along a dim (kernels/common/scan.h): sums and products accumulate in f64 (i64 for
// integers); cummax/cummin take the latest index among ties and NaN as the extreme.
enum class ScanOp : uint8_t { cumsum, cumprod, cummax, cummin };
// How scatter combines a write with the element (kernels/common/scatter.h).
enum class ScatterOp : uint8_t { add, assign, mul, amax, amin, mean };
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
  int64_t divisor = 0;            // average pooling: a fixed divisor (divisor_override); 0: the window's count
};

// Where row r of an attention mask starts: the rows of x ([..., n] viewed as rows x n) are indexed by
// the leading dims `size` (outermost first); the mask is broadcast over them with `stride` (0 where it
// is broadcast) and along the row with `step` (0 or 1).
// A causal mask without a tensor: with causal_rows = L > 0, row r is query r % L and sees the keys
// j <= r % L + causal_offset (the rest are -inf).
struct MaskRows {
  static constexpr int kMaxDims = 7;
  int ndim = 0;
  int64_t size[kMaxDims] = {};
  int64_t stride[kMaxDims] = {};
  int64_t step = 1;
  int64_t causal_rows = 0;
  int64_t causal_offset = 0;
};
// The first masked key of row r under the causal mask (n: none).
KILN_HD int64_t causal_end(const MaskRows& m, int64_t r, int64_t n) {
  if (m.causal_rows <= 0) return n;
  const int64_t end = r % m.causal_rows + m.causal_offset + 1;
  return end < 0 ? 0 : end > n ? n : end;
}
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
  // Adam/LAMB: this parameter's own step number (f64, in the backend's memory, read by the kernels
  // only), as torch keeps one per parameter; null: OptimHyper's step (or bc1/bc2) for the group.
  const double* step = nullptr;
};
enum class OptimKind : uint8_t { sgd, adamw, lamb };
// In f64 as the user gave them; bc1/bc2 are Adam's bias corrections 1 - beta^t.
struct OptimHyper {
  double lr = 0, weight_decay = 0;
  double momentum = 0, dampening = 0;
  bool nesterov = false;
  double beta1 = 0, beta2 = 0, eps = 0, bc1 = 1, bc2 = 1;
  // In the backend's memory, read by the kernels (never by the host): when step is set (and a
  // slice has no step of its own), t = *step (this step's number, f64) gives bc1/bc2; when skip_if is set and *skip_if
  // != 0 (the loss scaler found an inf/NaN), the step changes nothing.
  const double* step = nullptr;
  const float* skip_if = nullptr;
};

struct Backend {
  const char* name;
  // Row-major C = alpha * op(A) op(B) + beta * C for f32 and f64; beta == 0 never reads C.
  void (*gemm)(DType dtype, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha, const void* a,
               int64_t lda, const void* b, int64_t ldb, double beta, void* c, int64_t ldc);
  // `batch` GEMMs at once, operand i of product b at base + b * stride (elements; a stride may be
  // 0 to reuse an operand). Null where the backend has no batched GEMM: the engine then loops.
  void (*gemm_batched)(DType dtype, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
                       const void* a, int64_t lda, int64_t stride_a, const void* b, int64_t ldb, int64_t stride_b,
                       double beta, void* c, int64_t ldc, int64_t stride_c, int64_t batch);
#define KILN_KERNEL(name, params) void(*name) params;
#include "kernels/kernel_list.h"
#undef KILN_KERNEL

  // gemm and conv2d take f16 and bf16 operands themselves (with f32 accumulation) instead of
  // the engine converting them to f32 first: true on CUDA (tensor cores), false on the CPU.
  bool native_16bit_gemm_conv = false;
  // conv2d and batch norm take channels_last (NHWC) buffers themselves (Conv2dParams::nhwc, the
  // batch-norm `nhwc` flag): true on CUDA (cuDNN), false on the CPU, which computes NCHW copies.
  bool native_channels_last = false;
};

const Backend& cpu_backend();

}  // namespace kiln
