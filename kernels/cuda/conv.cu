// 2-D convolution through cuDNN: forward, backward data and backward filter, NCHW or NHWC
// (Conv2dParams::nhwc: activations channels_last, filters KRSC), f32/f64/f16/bf16
// (16-bit with f32 accumulation on tensor cores; f32 on TF32 tensor cores only when
// cuda::set_allow_tf32(true)).
//
// Why the legacy convolution calls and not the graph API: cuDNN 9 still ships them (in
// libcudnn_cnn), they cover exactly the three operations the engine asks for with one call each,
// and their algorithm search (heuristics, or a timed search in benchmark mode) is what we need.
// The graph API earns its verbosity with fusions (conv + bias + activation), which the engine
// does not express yet; that is the moment to move.
//
// Algorithm choice: by default cuDNN's heuristic order (the first that fits in the workspace
// limit); with cuda::set_cudnn_benchmark(true) every algorithm is timed once per shape and the
// fastest kept; in deterministic mode only algorithms cuDNN marks deterministic are used. The
// choice is cached per (device, dtype, shape, math mode).
#include <atomic>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "kernels/cuda/context.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/ops_cuda.h"

namespace kiln::cuda {
namespace {

constexpr size_t kMaxWorkspace = size_t(1) << 30;  // algorithms needing more are skipped
std::atomic<bool> g_benchmark{false};

cudnnDataType_t data_type(DType dt) {
  switch (dt) {
    case DType::f32: return CUDNN_DATA_FLOAT;
    case DType::f64: return CUDNN_DATA_DOUBLE;
    case DType::f16: return CUDNN_DATA_HALF;
    case DType::bf16: return CUDNN_DATA_BFLOAT16;
    default: KILN_FAIL("cuda conv2d: dtype ", dt, " is not supported (f32, f64, f16, bf16)");
  }
}

// The descriptors of one convolution, built from the engine's parameters.
struct ConvDescs {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr, bias = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;

  // The destructor of a member-less base would not run if this constructor threw, so creation
  // happens in init(), after the object is complete.
  ConvDescs(DType dt, const Conv2dParams& p) {
    try {
      init(dt, p);
    } catch (...) {
      destroy();
      throw;
    }
  }
  void init(DType dt, const Conv2dParams& p) {
    const cudnnDataType_t t = data_type(dt);
    KILN_CHECK(p.n < INT32_MAX && p.c < INT32_MAX && p.h < INT32_MAX && p.w < INT32_MAX && p.o < INT32_MAX,
               "cuda conv2d: sizes beyond 2^31 are not supported by cuDNN");
    KILN_CUDNN_OK(cudnnCreateTensorDescriptor(&x));
    KILN_CUDNN_OK(cudnnCreateTensorDescriptor(&y));
    KILN_CUDNN_OK(cudnnCreateTensorDescriptor(&bias));
    KILN_CUDNN_OK(cudnnCreateFilterDescriptor(&w));
    KILN_CUDNN_OK(cudnnCreateConvolutionDescriptor(&conv));
    // Dimensions are given as N, C, H, W in both formats; the format says how they lie in memory
    // (the bias [1, O, 1, 1] has the same bytes in either, and takes y's format for cudnnAddTensor).
    const cudnnTensorFormat_t f = p.nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
    KILN_CUDNN_OK(cudnnSetTensor4dDescriptor(x, f, t, int(p.n), int(p.c), int(p.h), int(p.w)));
    KILN_CUDNN_OK(cudnnSetTensor4dDescriptor(y, f, t, int(p.n), int(p.o), int(p.oh), int(p.ow)));
    KILN_CUDNN_OK(cudnnSetTensor4dDescriptor(bias, f, t, 1, int(p.o), 1, 1));
    KILN_CUDNN_OK(cudnnSetFilter4dDescriptor(w, t, f, int(p.o), int(p.c / p.groups), int(p.kh), int(p.kw)));
    const cudnnDataType_t compute = dt == DType::f64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
    KILN_CUDNN_OK(cudnnSetConvolution2dDescriptor(conv, int(p.ph), int(p.pw), int(p.sh), int(p.sw), int(p.dh),
                                                  int(p.dw), CUDNN_CROSS_CORRELATION, compute));
    KILN_CUDNN_OK(cudnnSetConvolutionGroupCount(conv, int(p.groups)));
    // FMA math forbids TF32; tensor-op math lets 16-bit inputs use tensor cores.
    const cudnnMathType_t math = is_low_precision(dt) ? CUDNN_TENSOR_OP_MATH
                                 : (dt == DType::f32 && allow_tf32()) ? CUDNN_DEFAULT_MATH
                                                                      : CUDNN_FMA_MATH;
    KILN_CUDNN_OK(cudnnSetConvolutionMathType(conv, math));
  }
  ~ConvDescs() { destroy(); }
  void destroy() {
    if (conv) cudnnDestroyConvolutionDescriptor(conv);
    if (w) cudnnDestroyFilterDescriptor(w);
    if (bias) cudnnDestroyTensorDescriptor(bias);
    if (y) cudnnDestroyTensorDescriptor(y);
    if (x) cudnnDestroyTensorDescriptor(x);
    conv = nullptr;
    w = nullptr;
    bias = y = x = nullptr;
  }
  ConvDescs(const ConvDescs&) = delete;
  ConvDescs& operator=(const ConvDescs&) = delete;
};

enum class Pass : int { forward, backward_data, backward_filter };

using Key = std::tuple<int, int, int, bool, bool, std::vector<int64_t>>;
Key key_of(Pass pass, DType dt, const Conv2dParams& p) {
  return Key{current().device, int(pass), int(dt), deterministic(), allow_tf32(),
             std::vector<int64_t>{p.n, p.c, p.h, p.w, p.o, p.kh, p.kw, p.sh, p.sw, p.ph, p.pw, p.dh, p.dw, p.groups,
                                  int64_t(p.nhwc)}};
}

// cuDNN's lists pair an algorithm with a math type, and the workspace size belongs to the pair, so
// both are kept and the math type is set on the descriptor before the call.
struct Choice {
  int algo = 0;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
  size_t workspace = 0;
};
std::mutex g_mutex;
std::map<Key, Choice> g_choices;

// The first usable entry of cuDNN's list (sorted fastest first, by heuristics or by timing).
template <typename Perf> Choice pick(const Perf* perf, int count, const char* what, const Conv2dParams& p, DType dt) {
  for (int i = 0; i < count; ++i) {
    if (perf[i].status != CUDNN_STATUS_SUCCESS || perf[i].memory > kMaxWorkspace) continue;
    if (deterministic() && perf[i].determinism != CUDNN_DETERMINISTIC) continue;
    // f32 without TF32 must stay in f32 arithmetic.
    if (dt == DType::f32 && !allow_tf32() && perf[i].mathType != CUDNN_FMA_MATH) continue;
    return Choice{int(perf[i].algo), perf[i].mathType, perf[i].memory};
  }
  KILN_FAIL("cuda conv2d ", what, ": cuDNN has no ", deterministic() ? "deterministic " : "", "algorithm for ", dt,
            " input [", p.n, ",", p.c, ",", p.h, ",", p.w, "] weight [", p.o, ",", p.c / p.groups, ",", p.kh, ",", p.kw,
            "] groups ", p.groups);
}

// Looks up or finds the algorithm of one pass. The Find* calls time the algorithms on the real
// buffers (their outputs are overwritten afterwards by the real call).
Choice choose(Pass pass, DType dt, const Conv2dParams& p, const ConvDescs& d, const void* x, const void* w,
              const void* gy_or_y, void* out) {
  const Key key = key_of(pass, dt, p);
  {
    std::lock_guard<std::mutex> lk(g_mutex);
    auto it = g_choices.find(key);
    if (it != g_choices.end()) return it->second;
  }
  cudnnHandle_t h = current().cudnn();
  constexpr int kMax = 16;
  int n = 0;
  Choice c;
  const bool bench = g_benchmark.load();
  if (pass == Pass::forward) {
    cudnnConvolutionFwdAlgoPerf_t perf[kMax];
    if (bench) {
      DeviceBuffer ws(kMaxWorkspace / 4);
      KILN_CUDNN_OK(cudnnFindConvolutionForwardAlgorithmEx(h, d.x, x, d.w, w, d.conv, d.y, out, kMax, &n, perf,
                                                           ws.get(), kMaxWorkspace / 4));
    } else {
      KILN_CUDNN_OK(cudnnGetConvolutionForwardAlgorithm_v7(h, d.x, d.w, d.conv, d.y, kMax, &n, perf));
    }
    c = pick(perf, n, "forward", p, dt);
  } else if (pass == Pass::backward_data) {
    cudnnConvolutionBwdDataAlgoPerf_t perf[kMax];
    if (bench) {
      DeviceBuffer ws(kMaxWorkspace / 4);
      KILN_CUDNN_OK(cudnnFindConvolutionBackwardDataAlgorithmEx(h, d.w, w, d.y, gy_or_y, d.conv, d.x, out, kMax, &n,
                                                                perf, ws.get(), kMaxWorkspace / 4));
    } else {
      KILN_CUDNN_OK(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, d.w, d.y, d.conv, d.x, kMax, &n, perf));
    }
    c = pick(perf, n, "backward data", p, dt);
  } else {
    cudnnConvolutionBwdFilterAlgoPerf_t perf[kMax];
    if (bench) {
      DeviceBuffer ws(kMaxWorkspace / 4);
      KILN_CUDNN_OK(cudnnFindConvolutionBackwardFilterAlgorithmEx(h, d.x, x, d.y, gy_or_y, d.conv, d.w, out, kMax, &n,
                                                                  perf, ws.get(), kMaxWorkspace / 4));
    } else {
      KILN_CUDNN_OK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, d.x, d.y, d.conv, d.w, kMax, &n, perf));
    }
    c = pick(perf, n, "backward filter", p, dt);
  }
  std::lock_guard<std::mutex> lk(g_mutex);
  g_choices.emplace(key, c);
  return c;
}

// alpha = 1, beta = 0 (or 1 to add), in the scaling type cuDNN expects for the dtype.
struct Scale {
  float f;
  double d;
  const void* of(DType dt) const { return dt == DType::f64 ? static_cast<const void*>(&d) : &f; }
};
constexpr Scale kOne{1.0f, 1.0}, kZero{0.0f, 0.0};

// ---- NHWC through NCHW copies --------------------------------------------------------------------
// cuDNN may have no NHWC algorithm for a pass (f32 without TF32 allows only FMA math, deterministic
// mode only deterministic algorithms). Then the pass runs on NCHW copies of its NHWC buffers, laid
// back out as NHWC: slower, never an error the NCHW layout would not give.

// A 4-D buffer [n, c, h, w] as the strided copy kernel sees it: NCHW, or NHWC ([n, h, w, c] in memory).
TensorDesc desc4(DType dt, const void* p, int64_t n, int64_t c, int64_t h, int64_t w, bool nhwc) {
  TensorDesc d;
  d.data = const_cast<void*>(p);
  d.dtype = dt;
  d.ndim = 4;
  const int64_t shape[4] = {n, c, h, w};
  const int64_t nchw[4] = {c * h * w, h * w, w, 1}, nhwc_st[4] = {h * w * c, 1, w * c, c};
  for (int i = 0; i < 4; ++i) {
    d.shape[i] = shape[i];
    d.strides[i] = nhwc ? nhwc_st[i] : nchw[i];
  }
  return d;
}

// A buffer in `to_nhwc` layout (to_nhwc false: NCHW) filled from `src` in the other one; null in, null out.
DeviceBuffer relaid(DType dt, const void* src, int64_t n, int64_t c, int64_t h, int64_t w, bool to_nhwc) {
  DeviceBuffer b(src ? size_t(n * c * h * w) * dtype_size(dt) : 0);
  if (src) copy(desc4(dt, b.get(), n, c, h, w, to_nhwc), desc4(dt, src, n, c, h, w, !to_nhwc));
  return b;
}

bool has_choice(Pass pass, DType dt, const Conv2dParams& p, const ConvDescs& d, const void* x, const void* w,
                const void* gy_or_y, void* out) {
  try {
    choose(pass, dt, p, d, x, w, gy_or_y, out);
    return true;
  } catch (const Error&) {
    return false;
  }
}

}  // namespace

void set_cudnn_benchmark(bool on) { g_benchmark = on; }
bool cudnn_benchmark() { return g_benchmark; }

void conv2d_forward(DType dt, const Conv2dParams& p, const void* x, const void* w, const void* bias, void* y) {
  const int64_t ny = p.n * p.o * p.oh * p.ow;
  if (ny == 0) return;
  cudaStream_t stream = current().stream;
  if (p.c == 0) {
    // No input channels (cuDNN rejects zero sizes): y is the bias, or zeros.
    KILN_CUDA_OK(cudaMemsetAsync(y, 0, size_t(ny) * dtype_size(dt), stream));
    if (bias) {
      const Conv2dParams one{1, 1, 1, 1, p.o, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1};
      const ConvDescs d(dt, one);
      const ConvDescs full(dt, Conv2dParams{p.n, 1, p.oh, p.ow, p.o, 1, 1, 1, 1, 0, 0, 1, 1, 1, p.oh, p.ow, p.nhwc});
      KILN_CUDNN_OK(cudnnAddTensor(current().cudnn(), kOne.of(dt), d.bias, bias, kOne.of(dt), full.y, y));
    }
    return;
  }
  const ConvDescs d(dt, p);
  if (p.nhwc && !has_choice(Pass::forward, dt, p, d, x, w, nullptr, y)) {
    Conv2dParams q = p;
    q.nhwc = false;
    const int64_t cg = p.c / p.groups;
    const DeviceBuffer xt = relaid(dt, x, p.n, p.c, p.h, p.w, false), wt = relaid(dt, w, p.o, cg, p.kh, p.kw, false);
    const DeviceBuffer yt(size_t(ny) * dtype_size(dt));
    conv2d_forward(dt, q, xt.get(), wt.get(), bias, yt.get());
    copy(desc4(dt, y, p.n, p.o, p.oh, p.ow, true), desc4(dt, yt.get(), p.n, p.o, p.oh, p.ow, false));
    return;
  }
  const Choice c = choose(Pass::forward, dt, p, d, x, w, nullptr, y);
  DeviceBuffer ws(c.workspace);
  cudnnHandle_t h = current().cudnn();
  KILN_CUDNN_OK(cudnnSetConvolutionMathType(d.conv, c.math));
  KILN_CUDNN_OK(cudnnConvolutionForward(h, kOne.of(dt), d.x, x, d.w, w, d.conv, cudnnConvolutionFwdAlgo_t(c.algo),
                                        ws.get(), c.workspace, kZero.of(dt), d.y, y));
  if (bias) KILN_CUDNN_OK(cudnnAddTensor(h, kOne.of(dt), d.bias, bias, kOne.of(dt), d.y, y));
}

void conv2d_backward(DType dt, const Conv2dParams& p, const void* x, const void* w, const void* gy, void* gx, void* gw) {
  cudaStream_t stream = current().stream;
  const int64_t nx = p.n * p.c * p.h * p.w, nw = p.o * (p.c / p.groups) * p.kh * p.kw;
  // Nothing flows when the output is empty: the gradients are zeros (cuDNN rejects zero sizes).
  if (p.n * p.o * p.oh * p.ow == 0 || nx == 0 || nw == 0) {
    if (gx && nx > 0) KILN_CUDA_OK(cudaMemsetAsync(gx, 0, size_t(nx) * dtype_size(dt), stream));
    if (gw && nw > 0) KILN_CUDA_OK(cudaMemsetAsync(gw, 0, size_t(nw) * dtype_size(dt), stream));
    return;
  }
  const ConvDescs d(dt, p);
  if (p.nhwc && ((gx && !has_choice(Pass::backward_data, dt, p, d, x, w, gy, gx)) ||
                 (gw && !has_choice(Pass::backward_filter, dt, p, d, x, w, gy, gw)))) {
    Conv2dParams q = p;
    q.nhwc = false;
    const int64_t cg = p.c / p.groups;
    const DeviceBuffer xt = relaid(dt, x, p.n, p.c, p.h, p.w, false), wt = relaid(dt, w, p.o, cg, p.kh, p.kw, false);
    const DeviceBuffer gyt = relaid(dt, gy, p.n, p.o, p.oh, p.ow, false);
    const DeviceBuffer gxt(gx ? size_t(nx) * dtype_size(dt) : 0), gwt(gw ? size_t(nw) * dtype_size(dt) : 0);
    conv2d_backward(dt, q, xt.get(), wt.get(), gyt.get(), gx ? gxt.get() : nullptr, gw ? gwt.get() : nullptr);
    if (gx) copy(desc4(dt, gx, p.n, p.c, p.h, p.w, true), desc4(dt, gxt.get(), p.n, p.c, p.h, p.w, false));
    if (gw) copy(desc4(dt, gw, p.o, cg, p.kh, p.kw, true), desc4(dt, gwt.get(), p.o, cg, p.kh, p.kw, false));
    return;
  }
  cudnnHandle_t h = current().cudnn();
  if (gx) {
    const Choice c = choose(Pass::backward_data, dt, p, d, x, w, gy, gx);
    DeviceBuffer ws(c.workspace);
    KILN_CUDNN_OK(cudnnSetConvolutionMathType(d.conv, c.math));
    KILN_CUDNN_OK(cudnnConvolutionBackwardData(h, kOne.of(dt), d.w, w, d.y, gy, d.conv,
                                               cudnnConvolutionBwdDataAlgo_t(c.algo), ws.get(), c.workspace,
                                               kZero.of(dt), d.x, gx));
  }
  if (gw) {
    const Choice c = choose(Pass::backward_filter, dt, p, d, x, w, gy, gw);
    DeviceBuffer ws(c.workspace);
    KILN_CUDNN_OK(cudnnSetConvolutionMathType(d.conv, c.math));
    KILN_CUDNN_OK(cudnnConvolutionBackwardFilter(h, kOne.of(dt), d.x, x, d.y, gy, d.conv,
                                                 cudnnConvolutionBwdFilterAlgo_t(c.algo), ws.get(), c.workspace,
                                                 kZero.of(dt), d.w, gw));
  }
}

}  // namespace kiln::cuda
