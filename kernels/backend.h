// The compute interface a device implements: a small table of functions over strided buffers.
// The engine validates, broadcasts and promotes; a backend only computes. kernels/cpu fills it
// for the CPU, kernels/cuda for NVIDIA GPUs.
#pragma once
#include <cstdint>

#include "engine/dtype.h"

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
  // Contiguous dst filled from the Philox stream (seed, offset): uniform [p0, p1), normal (mean p0,
  // std p1), bernoulli (probability p0).
  void (*random)(RandomKind kind, const TensorDesc& dst, uint64_t seed, uint64_t offset, double p0, double p1);
};

const Backend& cpu_backend();

}  // namespace kiln
