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
// The descriptors are built from a plan (kernels/common/conv_plan.h's plan_conv: formats, dims,
// strides, the convolution's parameters, and the paths cuDNN cannot take), a pure function that the
// CUDA emulator executes on the CPU in CI; which of cuDNN's candidates are usable is libplan::usable.
//
// Algorithm choice: by default cuDNN's heuristic order (the first that fits in the workspace
// limit and runs: a candidate that refuses the problem is skipped for the next); with
// cuda::set_cudnn_benchmark(true) every algorithm is timed once per shape and the fastest kept; in
// deterministic mode only algorithms cuDNN marks deterministic are used. The candidates and the
// algorithm that ran are cached per (device, pass, dtype, shape, deterministic, TF32, benchmark): libplan::conv_key.
#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/common/conv_plan.h"
#include "kernels/cuda/context.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/ops_cuda.h"

namespace kiln::cuda {
namespace {

using libplan::ConvPath;
using libplan::ConvPlan;
using Pass = libplan::ConvPass;

constexpr size_t kMaxWorkspace = libplan::kConvMaxWorkspace;  // algorithms needing more are skipped
std::atomic<bool> g_benchmark{false};

// The plan's plain enums as cuDNN's.
cudnnDataType_t dnn_type(libplan::DnnType t) {
  switch (t) {
    case libplan::DnnType::f32: return CUDNN_DATA_FLOAT;
    case libplan::DnnType::f64: return CUDNN_DATA_DOUBLE;
    case libplan::DnnType::f16: return CUDNN_DATA_HALF;
    case libplan::DnnType::bf16: return CUDNN_DATA_BFLOAT16;
  }
  KILN_FAIL("cuda conv2d: unknown data type ", int(t));
}
cudnnTensorFormat_t dnn_format(libplan::DnnFormat f) {
  return f == libplan::DnnFormat::nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
}
cudnnMathType_t dnn_math(libplan::DnnMath m) {
  switch (m) {
    case libplan::DnnMath::default_math: return CUDNN_DEFAULT_MATH;
    case libplan::DnnMath::tensor_op: return CUDNN_TENSOR_OP_MATH;
    case libplan::DnnMath::tensor_op_allow_conversion: return CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
    case libplan::DnnMath::fma: return CUDNN_FMA_MATH;
  }
  KILN_FAIL("cuda conv2d: unknown math type ", int(m));
}
libplan::DnnMath plan_math(cudnnMathType_t m) {
  switch (m) {
    case CUDNN_TENSOR_OP_MATH: return libplan::DnnMath::tensor_op;
    case CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION: return libplan::DnnMath::tensor_op_allow_conversion;
    case CUDNN_FMA_MATH: return libplan::DnnMath::fma;
    default: return libplan::DnnMath::default_math;  // not FMA: never taken for f32 without TF32
  }
}
void set_tensor(cudnnTensorDescriptor_t d, const libplan::DnnTensor& t, cudnnDataType_t type) {
  KILN_CUDNN_OK(cudnnSetTensor4dDescriptor(d, dnn_format(t.format), type, t.n, t.c, t.h, t.w));
}

// The descriptors of one convolution, built from its plan: y and the bias always, x, the filter and
// the convolution when the plan convolves (a bias-only plan has an empty x and filter, which cuDNN
// would reject).
struct ConvDescs {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr, bias = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  // The plan's math type. Each candidate sets its own on `conv` before it runs, and cuDNN's searches read
  // the descriptor's, so usable_list sets this one back first: one pass's last candidate must not decide
  // what the next pass's search (on the same descriptors in conv2d_backward) may offer.
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;

  // The destructor of a member-less base would not run if this constructor threw, so creation
  // happens in init(), after the object is complete.
  explicit ConvDescs(const ConvPlan& p) {
    try {
      init(p);
    } catch (...) {
      destroy();
      throw;
    }
  }
  void init(const ConvPlan& p) {
    const cudnnDataType_t t = dnn_type(p.data);
    KILN_CUDNN_OK(cudnnCreateTensorDescriptor(&y));
    KILN_CUDNN_OK(cudnnCreateTensorDescriptor(&bias));
    set_tensor(y, p.y, t);
    set_tensor(bias, p.bias, t);
    if (p.path != ConvPath::convolve) return;
    KILN_CUDNN_OK(cudnnCreateTensorDescriptor(&x));
    KILN_CUDNN_OK(cudnnCreateFilterDescriptor(&w));
    KILN_CUDNN_OK(cudnnCreateConvolutionDescriptor(&conv));
    set_tensor(x, p.x, t);
    KILN_CUDNN_OK(cudnnSetFilter4dDescriptor(w, t, dnn_format(p.w.format), p.w.k, p.w.c, p.w.r, p.w.s));
    const libplan::DnnConvolution& c = p.conv;
    const cudnnConvolutionMode_t mode =
        c.mode == libplan::DnnMode::convolution ? CUDNN_CONVOLUTION : CUDNN_CROSS_CORRELATION;
    KILN_CUDNN_OK(cudnnSetConvolution2dDescriptor(conv, c.pad_h, c.pad_w, c.stride_h, c.stride_w, c.dilation_h,
                                                  c.dilation_w, mode, dnn_type(c.compute)));
    KILN_CUDNN_OK(cudnnSetConvolutionGroupCount(conv, c.groups));
    math = dnn_math(c.math);
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

using Key = libplan::ConvKey;
Key key_of(Pass pass, DType dt, const Conv2dParams& p) {
  return libplan::conv_key(current().device, pass, dt, p, {deterministic(), allow_tf32(), g_benchmark.load()});
}

// alpha = 1, beta = 0 (or 1 to add), in the scaling type cuDNN expects for the dtype.
struct Scale {
  float f;
  double d;
  const void* of(DType dt) const { return dt == DType::f64 ? static_cast<const void*>(&d) : &f; }
};
constexpr Scale kOne{1.0f, 1.0}, kZero{0.0f, 0.0};

// cuDNN's lists pair an algorithm with a math type, and the workspace size belongs to the pair, so
// both are kept and the math type is set on the descriptor before the call.
struct Choice {
  int algo = 0;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
  size_t workspace = 0;
};
// The buffers of one pass: forward reads x and w into out (y); backward data reads w and gy into
// out (gx); backward filter reads x and gy into out (gw).
struct Operands {
  const void* x;
  const void* w;
  const void* gy;
  void* out;
};

// What differs between the three passes: cuDNN's perf type, its heuristic and timed searches, and
// the call that runs the pass. The search and the retry below are written once over these.
template <Pass P> struct PassApi;
template <> struct PassApi<Pass::forward> {
  using Perf = cudnnConvolutionFwdAlgoPerf_t;
  static constexpr const char* kName = "forward";
  static void get(cudnnHandle_t h, const ConvDescs& d, int max, int* n, Perf* perf) {
    KILN_CUDNN_OK(cudnnGetConvolutionForwardAlgorithm_v7(h, d.x, d.w, d.conv, d.y, max, n, perf));
  }
  static void find(cudnnHandle_t h, const ConvDescs& d, const Operands& o, int max, int* n, Perf* perf, void* ws,
                   size_t wsn) {
    KILN_CUDNN_OK(cudnnFindConvolutionForwardAlgorithmEx(h, d.x, o.x, d.w, o.w, d.conv, d.y, o.out, max, n, perf, ws, wsn));
  }
  static cudnnStatus_t workspace(cudnnHandle_t h, const ConvDescs& d, int algo, size_t* bytes) {
    return cudnnGetConvolutionForwardWorkspaceSize(h, d.x, d.w, d.conv, d.y, cudnnConvolutionFwdAlgo_t(algo), bytes);
  }
  static cudnnStatus_t run(cudnnHandle_t h, DType dt, const ConvDescs& d, const Operands& o, int algo, void* ws,
                           size_t wsn) {
    return cudnnConvolutionForward(h, kOne.of(dt), d.x, o.x, d.w, o.w, d.conv, cudnnConvolutionFwdAlgo_t(algo), ws, wsn,
                                   kZero.of(dt), d.y, o.out);
  }
};
template <> struct PassApi<Pass::backward_data> {
  using Perf = cudnnConvolutionBwdDataAlgoPerf_t;
  static constexpr const char* kName = "backward data";
  static void get(cudnnHandle_t h, const ConvDescs& d, int max, int* n, Perf* perf) {
    KILN_CUDNN_OK(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, d.w, d.y, d.conv, d.x, max, n, perf));
  }
  static void find(cudnnHandle_t h, const ConvDescs& d, const Operands& o, int max, int* n, Perf* perf, void* ws,
                   size_t wsn) {
    KILN_CUDNN_OK(cudnnFindConvolutionBackwardDataAlgorithmEx(h, d.w, o.w, d.y, o.gy, d.conv, d.x, o.out, max, n, perf,
                                                              ws, wsn));
  }
  static cudnnStatus_t workspace(cudnnHandle_t h, const ConvDescs& d, int algo, size_t* bytes) {
    return cudnnGetConvolutionBackwardDataWorkspaceSize(h, d.w, d.y, d.conv, d.x, cudnnConvolutionBwdDataAlgo_t(algo),
                                                        bytes);
  }
  static cudnnStatus_t run(cudnnHandle_t h, DType dt, const ConvDescs& d, const Operands& o, int algo, void* ws,
                           size_t wsn) {
    return cudnnConvolutionBackwardData(h, kOne.of(dt), d.w, o.w, d.y, o.gy, d.conv, cudnnConvolutionBwdDataAlgo_t(algo),
                                        ws, wsn, kZero.of(dt), d.x, o.out);
  }
};
template <> struct PassApi<Pass::backward_filter> {
  using Perf = cudnnConvolutionBwdFilterAlgoPerf_t;
  static constexpr const char* kName = "backward filter";
  static void get(cudnnHandle_t h, const ConvDescs& d, int max, int* n, Perf* perf) {
    KILN_CUDNN_OK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, d.x, d.y, d.conv, d.w, max, n, perf));
  }
  static void find(cudnnHandle_t h, const ConvDescs& d, const Operands& o, int max, int* n, Perf* perf, void* ws,
                   size_t wsn) {
    KILN_CUDNN_OK(cudnnFindConvolutionBackwardFilterAlgorithmEx(h, d.x, o.x, d.y, o.gy, d.conv, d.w, o.out, max, n,
                                                                perf, ws, wsn));
  }
  static cudnnStatus_t workspace(cudnnHandle_t h, const ConvDescs& d, int algo, size_t* bytes) {
    return cudnnGetConvolutionBackwardFilterWorkspaceSize(h, d.x, d.y, d.conv, d.w,
                                                          cudnnConvolutionBwdFilterAlgo_t(algo), bytes);
  }
  static cudnnStatus_t run(cudnnHandle_t h, DType dt, const ConvDescs& d, const Operands& o, int algo, void* ws,
                           size_t wsn) {
    return cudnnConvolutionBackwardFilter(h, kOne.of(dt), d.x, o.x, d.y, o.gy, d.conv,
                                          cudnnConvolutionBwdFilterAlgo_t(algo), ws, wsn, kZero.of(dt), d.w, o.out);
  }
};

std::mutex g_mutex;
std::map<Key, Choice> g_choices;                  // the algorithm that ran, per pass and shape
std::map<Key, std::vector<Choice>> g_candidates;  // cuDNN's usable list, per pass and shape

// The usable entries of cuDNN's list, fastest first: by heuristics, or, given `timed` (benchmark
// mode), timed on those buffers (whose outputs the real call overwrites). Usable: within the workspace
// limit, deterministic in deterministic mode, and f32 without TF32 in f32 arithmetic. `pressed`: the
// timed search lost an algorithm to an allocation failure, so the list says how full the device was
// then, not what the shape allows, and is not kept.
struct Usable {
  std::vector<Choice> list;
  bool pressed = false;
};
constexpr size_t kFindWorkspace = kMaxWorkspace / 4;  // the buffer benchmark mode times candidates in
template <Pass P> Usable usable_list(DType dt, const ConvDescs& d, const Operands* timed) {
  using Api = PassApi<P>;
  constexpr int kMax = 16;
  typename Api::Perf perf[kMax];
  int n = 0;
  cudnnHandle_t h = current().cudnn();
  KILN_CUDNN_OK(cudnnSetConvolutionMathType(d.conv, d.math));
  if (timed) {
    DeviceBuffer ws(kFindWorkspace);
    Api::find(h, d, *timed, kMax, &n, perf, ws.get(), kFindWorkspace);
  } else {
    Api::get(h, d, kMax, &n, perf);
  }
  Usable usable;
  for (int i = 0; i < n; ++i) {
    // Lost to a full device, where it would have been usable had it run (not one the limits refuse anyway).
    if (timed && perf[i].status == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED) {
      const libplan::DnnCandidate would{true, perf[i].memory, perf[i].determinism == CUDNN_DETERMINISTIC,
                                        plan_math(perf[i].mathType)};
      usable.pressed = usable.pressed || libplan::usable(would, dt, deterministic(), allow_tf32());
    }
    // The workspace as the size query answers for this algorithm and math type, when it asks for
    // more than the list said: a kernel given less than it needs writes past its buffer.
    size_t bytes = perf[i].memory;
    if (perf[i].status == CUDNN_STATUS_SUCCESS) {
      KILN_CUDNN_OK(cudnnSetConvolutionMathType(d.conv, perf[i].mathType));
      size_t asked = 0;
      if (Api::workspace(h, d, int(perf[i].algo), &asked) != CUDNN_STATUS_SUCCESS) continue;
      bytes = std::max(bytes, asked);
    }
    const libplan::DnnCandidate c{perf[i].status == CUDNN_STATUS_SUCCESS, bytes,
                                  perf[i].determinism == CUDNN_DETERMINISTIC, plan_math(perf[i].mathType)};
    if (!libplan::usable(c, dt, deterministic(), allow_tf32())) continue;
    usable.list.push_back(Choice{int(perf[i].algo), perf[i].mathType, bytes});
  }
  KILN_CUDNN_OK(cudnnSetConvolutionMathType(d.conv, d.math));
  return usable;
}

// usable_list, once per pass and shape (timed in benchmark mode). Empty when none is. A timed list that
// lost algorithms to a full device is used for this call only, and where it lost all of them that is
// OutOfMemory (a training step shrinks on it), not "no algorithm".
template <Pass P>
std::vector<Choice> candidates(DType dt, const Conv2dParams& p, const ConvDescs& d, const Operands& o) {
  const Key key = key_of(P, dt, p);
  {
    std::lock_guard<std::mutex> lk(g_mutex);
    auto it = g_candidates.find(key);
    if (it != g_candidates.end()) return it->second;
  }
  Usable usable = usable_list<P>(dt, d, g_benchmark.load() ? &o : nullptr);
  if (usable.pressed) {
    if (usable.list.empty())
      KILN_FAIL_OOM("cuda conv2d ", PassApi<P>::kName, ": every cuDNN algorithm for ", libplan::describe(dt, p),
                    " that could run was out of device memory while benchmark mode timed it");
    return usable.list;
  }
  std::lock_guard<std::mutex> lk(g_mutex);
  return g_candidates.emplace(key, std::move(usable.list)).first->second;
}

// Runs pass P with the algorithm that ran before for this shape, or else tries cuDNN's usable
// candidates in order and keeps the first that runs: the legacy heuristics sometimes name an
// algorithm that then refuses the problem, and one whose workspace does not fit in the memory left
// gives way to the next (which may need less). Fails naming every algorithm tried and its status:
// OutOfMemory where memory was what stopped any of them, so that a training step can shrink.
template <Pass P> void convolve(DType dt, const Conv2dParams& p, const ConvDescs& d, const Operands& o) {
  using Api = PassApi<P>;
  cudnnHandle_t h = current().cudnn();
  auto attempt = [&](const Choice& c) {
    DeviceBuffer ws(c.workspace);
    KILN_CUDNN_OK(cudnnSetConvolutionMathType(d.conv, c.math));
    return Api::run(h, dt, d, o, c.algo, ws.get(), c.workspace);
  };
  const Key key = key_of(P, dt, p);
  std::optional<Choice> known;
  {
    std::lock_guard<std::mutex> lk(g_mutex);
    if (auto it = g_choices.find(key); it != g_choices.end()) known = it->second;
  }
  if (known) {
    KILN_CUDNN_OK(attempt(*known));
    return;
  }
  std::string tried;
  bool out_of_memory = false;
  for (const Choice& c : candidates<P>(dt, p, d, o)) {
    cudnnStatus_t st;
    try {
      st = attempt(c);
    } catch (const OutOfMemory&) {  // its workspace did not fit
      out_of_memory = true;
      tried += " algorithm " + std::to_string(c.algo) + ": no memory for its " + std::to_string(c.workspace >> 20) +
               " MiB workspace;";
      continue;
    }
    if (st == CUDNN_STATUS_SUCCESS) {
      std::lock_guard<std::mutex> lk(g_mutex);
      g_choices.emplace(key, c);
      return;
    }
    if (st == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED) {
      out_of_memory = true;
      (void)cudaGetLastError();  // in case the library's failed allocation left it (KILN_CUDA_OK says why)
    }
    tried += " algorithm " + std::to_string(c.algo) + ": " + cudnnGetErrorString(st) + ";";
  }
  const std::string what = detail::str_cat(
      "cuda conv2d ", Api::kName, ": no cuDNN ", deterministic() ? "deterministic " : "", "algorithm runs for ",
      libplan::describe(dt, p), tried.empty() ? " (cuDNN offers none within the limits)" : " (tried" + tried + ")");
  if (out_of_memory) KILN_FAIL_OOM(what);
  KILN_FAIL(what);
}

// The workspace the pass will take: the algorithm that ran for this shape, else the first of the
// usable list found before, else the first of cuDNN's heuristic list now (not kept: a later run in
// benchmark mode still times its own, in a buffer of kFindWorkspace, counted until it has). Nothing when
// no algorithm is usable.
template <Pass P> std::optional<size_t> planned_workspace(DType dt, const Conv2dParams& p, const ConvDescs& d) {
  const Key key = key_of(P, dt, p);
  {
    std::lock_guard<std::mutex> lk(g_mutex);
    if (auto it = g_choices.find(key); it != g_choices.end()) return it->second.workspace;
    if (auto it = g_candidates.find(key); it != g_candidates.end()) {
      if (it->second.empty()) return std::nullopt;
      return it->second.front().workspace;
    }
  }
  const std::vector<Choice> usable = usable_list<P>(dt, d, nullptr).list;
  if (usable.empty()) return std::nullopt;
  return g_benchmark.load() ? std::max(usable.front().workspace, kFindWorkspace) : usable.front().workspace;
}

// Whether cuDNN offers an algorithm for the pass at all (NHWC without one runs on NCHW copies).
// Only "none offered" answers false: a descriptor or library error still throws.
bool has_algorithm(Pass pass, DType dt, const Conv2dParams& p, const ConvDescs& d, const Operands& o) {
  {  // one ran before: no search (a list not kept, timed under memory pressure, would be timed again)
    std::lock_guard<std::mutex> lk(g_mutex);
    if (g_choices.count(key_of(pass, dt, p))) return true;
  }
  switch (pass) {
    case Pass::forward: return !candidates<Pass::forward>(dt, p, d, o).empty();
    case Pass::backward_data: return !candidates<Pass::backward_data>(dt, p, d, o).empty();
    case Pass::backward_filter: return !candidates<Pass::backward_filter>(dt, p, d, o).empty();
  }
  return false;
}

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

}  // namespace

size_t conv_transient_bytes(int device, DType dt, const Conv2dParams& p, bool forward, bool gx, bool gw) {
  use(device);
  const size_t es = dtype_size(dt);
  const int64_t cg = p.groups > 0 ? p.c / p.groups : 0;
  const size_t nx = size_t(p.n * p.c * p.h * p.w) * es, nw = size_t(p.o * cg * p.kh * p.kw) * es,
               ny = size_t(p.n * p.o * p.oh * p.ow) * es;
  Conv2dParams q = p;  // an NHWC call without a cuDNN algorithm runs as this NCHW one, on copies
  q.nhwc = false;
  if (forward) {
    const ConvPlan plan = libplan::plan_conv(dt, p, Pass::forward, allow_tf32());
    if (plan.path != ConvPath::convolve) return 0;
    const ConvDescs d(plan);
    const std::optional<size_t> ws = planned_workspace<Pass::forward>(dt, p, d);
    if (ws || !p.nhwc) return ws.value_or(0);
    return nx + nw + ny + conv_transient_bytes(device, dt, q, true, false, false);
  }
  const ConvPlan data = libplan::plan_conv(dt, p, Pass::backward_data, allow_tf32());
  const ConvPlan filter = libplan::plan_conv(dt, p, Pass::backward_filter, allow_tf32());
  if (data.path != ConvPath::convolve || filter.path != ConvPath::convolve) return 0;
  const ConvDescs d(data);  // as conv2d_backward: the descriptors do not depend on the pass
  const std::optional<size_t> wd = gx ? planned_workspace<Pass::backward_data>(dt, p, d) : std::optional<size_t>(0);
  const std::optional<size_t> wf = gw ? planned_workspace<Pass::backward_filter>(dt, p, d) : std::optional<size_t>(0);
  if ((wd && wf) || !p.nhwc) return std::max(wd.value_or(0), wf.value_or(0));
  // The copies live through both passes, which run one after the other.
  return nx + nw + ny + (gx ? nx : 0) + (gw ? nw : 0) + conv_transient_bytes(device, dt, q, false, gx, gw);
}

void set_cudnn_benchmark(bool on) { g_benchmark = on; }
bool cudnn_benchmark() { return g_benchmark; }

void conv2d_forward(DType dt, const Conv2dParams& p, const void* x, const void* w, const void* bias, void* y) {
  const ConvPlan plan = libplan::plan_conv(dt, p, Pass::forward, allow_tf32());
  if (plan.path == ConvPath::nothing) return;
  const int64_t ny = libplan::elements(plan.y);
  const ConvDescs d(plan);
  if (plan.path == ConvPath::bias_only) {
    // No input channels (cuDNN rejects zero sizes): y is the bias, or zeros.
    KILN_CUDA_OK(cudaMemsetAsync(y, 0, size_t(ny) * dtype_size(dt), current().stream));
    if (bias) KILN_CUDNN_OK(cudnnAddTensor(current().cudnn(), kOne.of(dt), d.bias, bias, kOne.of(dt), d.y, y));
    return;
  }
  if (p.nhwc && !has_algorithm(Pass::forward, dt, p, d, Operands{x, w, nullptr, y})) {
    Conv2dParams q = p;
    q.nhwc = false;
    const int64_t cg = p.c / p.groups;
    const DeviceBuffer xt = relaid(dt, x, p.n, p.c, p.h, p.w, false), wt = relaid(dt, w, p.o, cg, p.kh, p.kw, false);
    const DeviceBuffer yt(size_t(ny) * dtype_size(dt));
    conv2d_forward(dt, q, xt.get(), wt.get(), bias, yt.get());
    copy(desc4(dt, y, p.n, p.o, p.oh, p.ow, true), desc4(dt, yt.get(), p.n, p.o, p.oh, p.ow, false));
    return;
  }
  convolve<Pass::forward>(dt, p, d, Operands{x, w, nullptr, y});
  if (bias) KILN_CUDNN_OK(cudnnAddTensor(current().cudnn(), kOne.of(dt), d.bias, bias, kOne.of(dt), d.y, y));
}

void conv2d_backward(DType dt, const Conv2dParams& p, const void* x, const void* w, const void* gy, void* gx, void* gw) {
  cudaStream_t stream = current().stream;
  const ConvPlan data = libplan::plan_conv(dt, p, Pass::backward_data, allow_tf32());
  const ConvPlan filter = libplan::plan_conv(dt, p, Pass::backward_filter, allow_tf32());
  const int64_t nx = libplan::output_elements(data), nw = libplan::output_elements(filter);
  // Nothing flows when x, w or y is empty: the gradients are zeros (cuDNN rejects zero sizes). Both
  // passes' plans take this path together (the same sizes decide it).
  if (data.path == ConvPath::zero_output || filter.path == ConvPath::zero_output) {
    if (gx && nx > 0) KILN_CUDA_OK(cudaMemsetAsync(gx, 0, size_t(nx) * dtype_size(dt), stream));
    if (gw && nw > 0) KILN_CUDA_OK(cudaMemsetAsync(gw, 0, size_t(nw) * dtype_size(dt), stream));
    return;
  }
  const ConvDescs d(data);  // the descriptors do not depend on the pass
  if (p.nhwc && ((gx && !has_algorithm(Pass::backward_data, dt, p, d, Operands{x, w, gy, gx})) ||
                 (gw && !has_algorithm(Pass::backward_filter, dt, p, d, Operands{x, w, gy, gw})))) {
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
  if (gx) convolve<Pass::backward_data>(dt, p, d, Operands{x, w, gy, gx});
  if (gw) convolve<Pass::backward_filter>(dt, p, d, Operands{x, w, gy, gw});
}

}  // namespace kiln::cuda
