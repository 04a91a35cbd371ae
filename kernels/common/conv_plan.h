// The CUDA backend's cuDNN convolution calls as data: a pure function from the engine's
// Conv2dParams (kernels/backend.h) and a pass to a plain struct holding the cuDNN descriptors
// exactly as kernels/cuda/conv.cu sets them (tensor and filter formats and dimensions, with the
// strides cuDNN derives from them; the convolution's pads, strides, dilations, groups, mode,
// compute and math types) and what the call does (convolve, or one of the paths cuDNN cannot take:
// zero sizes). conv.cu builds its descriptors from this struct alone; the CUDA emulator
// (kernels/cuda/emulator/library_interp.cpp) builds the same struct and executes it on the CPU
// through the descriptors' strides, so every convolution of the op table checks the mapping in CI.
// The part of the algorithm choice that needs no library (which of cuDNN's candidates are usable)
// is here too. No CUDA headers: this compiles with any C++ compiler.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <string>
#include <tuple>
#include <vector>

#include "base/dtype.h"
#include "base/error.h"
#include "kernels/backend.h"

namespace kiln::libplan {

// cuDNN's enums as plain values; conv.cu maps each to the library's one to one.
enum class DnnType : uint8_t { f32, f64, f16, bf16 };  // cudnnDataType_t
enum class DnnFormat : uint8_t { nchw, nhwc };         // cudnnTensorFormat_t (filters: KCRS, KRSC)
enum class DnnMode : uint8_t { cross_correlation, convolution };
enum class DnnMath : uint8_t { default_math, tensor_op, tensor_op_allow_conversion, fma };  // cudnnMathType_t
enum class ConvPass : uint8_t { forward, backward_data, backward_filter };
// nothing: no output elements; bias_only: forward with no input channels, y = bias (or zeros);
// zero_output: a backward pass whose output gets no contribution (an empty x, w or y), zeros;
// convolve: the cuDNN call (forward also adds the bias afterwards with cudnnAddTensor).
// cuDNN rejects zero sizes, hence the other paths.
enum class ConvPath : uint8_t { nothing, bias_only, zero_output, convolve };

// A 4-D tensor as cudnnSetTensor4dDescriptor takes it (format, N, C, H, W), and the element strides
// (n, c, h, w) cuDNN derives from the format: NCHW packs w fastest, NHWC packs c fastest.
struct DnnTensor {
  DnnFormat format = DnnFormat::nchw;
  int n = 0, c = 0, h = 0, w = 0;
  int64_t stride[4] = {};
};
// A filter as cudnnSetFilter4dDescriptor takes it (format, K output channels, C input channels per
// group, R rows, S columns): NCHW is KCRS in memory, NHWC is KRSC. Strides (k, c, r, s) as derived.
struct DnnFilter {
  DnnFormat format = DnnFormat::nchw;
  int k = 0, c = 0, r = 0, s = 0;
  int64_t stride[4] = {};
};
// cudnnSetConvolution2dDescriptor + group count + math type.
struct DnnConvolution {
  int pad_h = 0, pad_w = 0, stride_h = 1, stride_w = 1, dilation_h = 1, dilation_w = 1, groups = 1;
  DnnMode mode = DnnMode::cross_correlation;
  DnnType compute = DnnType::f32;
  DnnMath math = DnnMath::fma;  // the initial math type (each candidate algorithm sets its own)
};

struct ConvPlan {
  ConvPass pass = ConvPass::forward;
  ConvPath path = ConvPath::nothing;
  DnnType data = DnnType::f32;
  DnnTensor x, y, bias;  // bias [1, O, 1, 1] in y's format (the same bytes in either)
  DnnFilter w;
  DnnConvolution conv;
};

// Limit on an algorithm's workspace: candidates needing more are skipped.
constexpr size_t kConvMaxWorkspace = size_t(1) << 30;

inline std::string describe(DType dt, const Conv2dParams& p) {
  return detail::str_cat(dt, " input [", p.n, ",", p.c, ",", p.h, ",", p.w, "] weight [", p.o, ",",
                         p.groups > 0 ? p.c / p.groups : 0, ",", p.kh, ",", p.kw, "] stride [", p.sh, ",", p.sw,
                         "] padding [", p.ph, ",", p.pw, "] dilation [", p.dh, ",", p.dw, "] groups ", p.groups,
                         " output [", p.oh, ",", p.ow, "]", p.nhwc ? " (NHWC)" : "");
}

inline const char* pass_name(ConvPass pass) {
  switch (pass) {
    case ConvPass::forward: return "forward";
    case ConvPass::backward_data: return "backward data";
    case ConvPass::backward_filter: return "backward filter";
  }
  return "?";
}

// The strides cuDNN derives for a packed 4-D layout of dims (d0, d1, d2, d3) = (N, C, H, W) or
// (K, C, R, S): NCHW/KCRS is row-major over them, NHWC/KRSC puts d1 innermost.
inline void packed_strides(DnnFormat f, int64_t d1, int64_t d2, int64_t d3, int64_t (&stride)[4]) {
  const bool nchw = f == DnnFormat::nchw;
  stride[0] = d1 * d2 * d3;
  stride[1] = nchw ? d2 * d3 : 1;
  stride[2] = nchw ? d3 : d3 * d1;
  stride[3] = nchw ? 1 : d1;
}
inline DnnTensor dnn_tensor(DnnFormat f, int n, int c, int h, int w) {
  DnnTensor t{f, n, c, h, w, {}};
  packed_strides(f, c, h, w, t.stride);
  return t;
}
inline DnnFilter dnn_filter(DnnFormat f, int k, int c, int r, int s) {
  DnnFilter t{f, k, c, r, s, {}};
  packed_strides(f, c, r, s, t.stride);
  return t;
}

// The product of non-negative sizes, or INT64_MAX where it would overflow (four dimensions of up to
// 2^31 each can): only compared against limits.
inline int64_t size_product(std::initializer_list<int64_t> dims) {
  int64_t n = 1;
  for (int64_t d : dims) {
    if (d == 0) return 0;
    n = n > INT64_MAX / d ? INT64_MAX : n * d;
  }
  return n;
}

// cuDNN's output size of one spatial dimension (cudnnGetConvolution2dForwardOutputDim).
inline int64_t conv_output_size(int64_t in, int64_t pad, int64_t kernel, int64_t stride, int64_t dilation) {
  return (in + 2 * pad - dilation * (kernel - 1) - 1) / stride + 1;
}

// The cuDNN call for one pass of the engine's convolution. allow_tf32: f32 may run on TF32 tensor
// cores (cuda::allow_tf32()). Throws naming the convolution for what cuDNN would refuse: an
// unsupported dtype, sizes beyond int32 (each dimension, and each tensor's element count), a
// non-positive stride or dilation, groups that do not divide the channels, an output size that is
// not the convolution's.
inline ConvPlan plan_conv(DType dt, const Conv2dParams& p, ConvPass pass, bool allow_tf32) {
  ConvPlan plan;
  plan.pass = pass;
  switch (dt) {
    case DType::f32: plan.data = DnnType::f32; break;
    case DType::f64: plan.data = DnnType::f64; break;
    case DType::f16: plan.data = DnnType::f16; break;
    case DType::bf16: plan.data = DnnType::bf16; break;
    default: KILN_FAIL("cuda conv2d: dtype ", dt, " is not supported (f32, f64, f16, bf16): ", describe(dt, p));
  }
  for (int64_t v : {p.n, p.c, p.h, p.w, p.o, p.kh, p.kw, p.sh, p.sw, p.ph, p.pw, p.dh, p.dw, p.groups, p.oh, p.ow})
    KILN_CHECK(v >= 0 && v < INT32_MAX, "cuda conv2d: sizes must lie in [0, 2^31) for cuDNN: ", describe(dt, p));
  KILN_CHECK(p.kh >= 1 && p.kw >= 1 && p.sh >= 1 && p.sw >= 1 && p.dh >= 1 && p.dw >= 1,
             "cuda conv2d: kernel, stride and dilation must be >= 1: ", describe(dt, p));
  KILN_CHECK(p.groups >= 1 && p.c % p.groups == 0 && p.o % p.groups == 0, "cuda conv2d: groups ", p.groups,
             " must divide the input and output channels: ", describe(dt, p));
  KILN_CHECK(
      p.oh == conv_output_size(p.h, p.ph, p.kh, p.sh, p.dh) && p.ow == conv_output_size(p.w, p.pw, p.kw, p.sw, p.dw),
      "cuda conv2d: the output must be [", conv_output_size(p.h, p.ph, p.kh, p.sh, p.dh), ",",
      conv_output_size(p.w, p.pw, p.kw, p.sw, p.dw), "]: ", describe(dt, p));
  // cudnnSetTensor4dDescriptor and cudnnSetFilter4dDescriptor refuse more than 2^31-1 elements in all, even where
  // each dimension fits: the cuDNN path has no other way for such a convolution, so say which it is here.
  const int64_t nx = size_product({p.n, p.c, p.h, p.w}), ny = size_product({p.n, p.o, p.oh, p.ow}),
                nw = size_product({p.o, p.c / p.groups, p.kh, p.kw});
  KILN_CHECK(nx <= INT32_MAX && ny <= INT32_MAX && nw <= INT32_MAX,
             "cuda conv2d: cuDNN takes at most 2^31-1 elements per tensor, but the input has ", nx, ", the weight ", nw,
             " and the output ", ny, ": ", describe(dt, p));
  // Dimensions are given as N, C, H, W in both formats; the format says how they lie in memory.
  const DnnFormat f = p.nhwc ? DnnFormat::nhwc : DnnFormat::nchw;
  plan.x = dnn_tensor(f, int(p.n), int(p.c), int(p.h), int(p.w));
  plan.y = dnn_tensor(f, int(p.n), int(p.o), int(p.oh), int(p.ow));
  plan.bias = dnn_tensor(f, 1, int(p.o), 1, 1);
  plan.w = dnn_filter(f, int(p.o), int(p.c / p.groups), int(p.kh), int(p.kw));
  DnnConvolution& c = plan.conv;
  c.pad_h = int(p.ph);
  c.pad_w = int(p.pw);
  c.stride_h = int(p.sh);
  c.stride_w = int(p.sw);
  c.dilation_h = int(p.dh);
  c.dilation_w = int(p.dw);
  c.groups = int(p.groups);
  c.mode = DnnMode::cross_correlation;  // what deep learning calls convolution: the filter is not flipped
  c.compute = dt == DType::f64 ? DnnType::f64 : DnnType::f32;
  // FMA math forbids TF32; tensor-op math lets 16-bit inputs use tensor cores.
  c.math = is_low_precision(dt)               ? DnnMath::tensor_op
           : (dt == DType::f32 && allow_tf32) ? DnnMath::default_math
                                              : DnnMath::fma;
  if (pass == ConvPass::forward) {
    plan.path = ny == 0 ? ConvPath::nothing : p.c == 0 ? ConvPath::bias_only : ConvPath::convolve;
  } else {
    // Nothing flows when any of x, w and y is empty: the gradient is zeros.
    plan.path = ny == 0 || nx == 0 || nw == 0 ? ConvPath::zero_output : ConvPath::convolve;
  }
  return plan;
}

// Elements of a tensor or filter, and of what a pass writes (y, the input gradient or the filter gradient).
inline int64_t elements(const DnnTensor& t) { return int64_t(t.n) * t.c * t.h * t.w; }
inline int64_t elements(const DnnFilter& f) { return int64_t(f.k) * f.c * f.r * f.s; }
inline int64_t output_elements(const ConvPlan& p) {
  switch (p.pass) {
    case ConvPass::forward: return elements(p.y);
    case ConvPass::backward_data: return elements(p.x);
    case ConvPass::backward_filter: return elements(p.w);
  }
  return 0;
}

// One entry of cuDNN's algorithm list (heuristic or timed), as far as the choice looks at it.
struct DnnCandidate {
  bool ok = false;  // status CUDNN_STATUS_SUCCESS
  size_t workspace = 0;
  bool deterministic = false;
  DnnMath math = DnnMath::default_math;
};
// Whether conv.cu may use a candidate: it ran in the search, needs at most kConvMaxWorkspace,
// is deterministic in deterministic mode, and keeps f32 in f32 arithmetic (FMA math) unless TF32 is
// allowed, never rounding f32 or f64 data to f16. Usable candidates are tried in cuDNN's order (fastest first) until
// one runs.
inline bool usable(const DnnCandidate& c, DType dt, bool deterministic_mode, bool allow_tf32) {
  if (!c.ok || c.workspace > kConvMaxWorkspace) return false;
  if (deterministic_mode && !c.deterministic) return false;
  if (dt == DType::f32 && !allow_tf32 && c.math != DnnMath::fma) return false;
  // Tensor ops "allowing conversion" may round f32 (and f64) data to f16: 5 exponent bits, below TF32's
  // reach, where TF32 is what was allowed.
  if ((dt == DType::f32 || dt == DType::f64) && c.math == DnnMath::tensor_op_allow_conversion) return false;
  return true;
}

// What conv.cu's caches (the usable candidates and the algorithm that ran) are keyed on: the device,
// the pass, the dtype, the shape, and every mode that changes the choice: deterministic mode and TF32
// change which candidates are usable, and benchmark mode how they are ordered (timed, not by
// heuristics), so turning benchmark mode on must not keep a heuristic choice made before.
struct ConvModes {
  bool deterministic = false, allow_tf32 = false, benchmark = false;
};
using ConvKey = std::tuple<int, int, int, bool, bool, bool, std::vector<int64_t>>;
inline ConvKey conv_key(int device, ConvPass pass, DType dt, const Conv2dParams& p, ConvModes m) {
  return ConvKey{device,
                 int(pass),
                 int(dt),
                 m.deterministic,
                 m.allow_tf32,
                 m.benchmark,
                 std::vector<int64_t>{p.n, p.c, p.h, p.w, p.o, p.kh, p.kw, p.sh, p.sw, p.ph, p.pw, p.dh, p.dw, p.groups,
                                      int64_t(p.nhwc)}};
}

}  // namespace kiln::libplan
