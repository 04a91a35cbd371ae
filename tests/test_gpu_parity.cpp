// GPU parity (ctest label gpu): every op on CUDA against the CPU reference on the same inputs,
// forward and backward; f32 with a tight tolerance, f16 and bf16 with per-op tolerances, and
// non-contiguous inputs. ctest runs one entry per op (tests/gpu_parity_ops.txt, KILN_PARITY_OP);
// without a device each reports skipped (exit 77). The CPU test at the end checks that the op list
// and the table agree and that every case runs on the CPU, so the harness itself is tested in CI.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <set>
#include <string>

#include "engine/autograd.h"
#include "engine/nn_ops.h"
#include "engine/ops.h"
#include "kernels/cuda/cuda_backend.h"
#include "test_util.h"

using namespace kiln;

namespace {

enum class Kind { normal, positive, index, mask, unit };
struct In {
  Shape shape;
  Kind kind = Kind::normal;
  int64_t hi = 0;  // indices: [0, hi)
};
using Fn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;
struct Case {
  std::string name;
  std::vector<In> inputs;
  Fn fn;
  double tol16 = 2e-2;   // relative and absolute tolerance for f16/bf16 (f32: 2e-4 unless tol32)
  bool lowp = true;      // also run in f16 and bf16
  double tol32 = 2e-4;
};

std::vector<Tensor> one(const Tensor& t) { return {t}; }

bool transposable(const In& in) {
  return (in.kind == Kind::normal || in.kind == Kind::positive || in.kind == Kind::unit) && in.shape.size() >= 2 &&
         in.shape[in.shape.size() - 1] != in.shape[in.shape.size() - 2];
}

// A reference input: values drawn on the CPU in f64 from a fixed generator. Transposed inputs are
// stored with the last two dims swapped; run_case transposes them back into non-contiguous views.
Tensor make_input(const In& in, DType dt, Generator& g, bool transposed) {
  Shape s = in.shape;
  if (transposed && transposable(in)) std::swap(s[s.size() - 1], s[s.size() - 2]);
  Tensor t;
  switch (in.kind) {
    case Kind::normal: t = randn(s, DType::f64, &g); break;
    case Kind::positive: t = rand(s, DType::f64, &g) + 0.5; break;
    case Kind::unit: t = rand(s, DType::f64, &g); break;
    case Kind::index: return randint(0, in.hi, s, DType::i64, &g);
    case Kind::mask: return lt(rand(s, DType::f64, &g), scalar_tensor(0.3, DType::f64));
  }
  return t.to(dt);
}

// Runs a case on `dev` from the same CPU inputs; returns outputs then input gradients (on the CPU).
std::vector<Tensor> run_case(const Case& c, const std::vector<Tensor>& cpu_inputs, bool transposed, Device dev,
                             uint64_t grad_seed) {
  std::vector<Tensor> xs;
  for (size_t i = 0; i < cpu_inputs.size(); ++i) {
    Tensor x = cpu_inputs[i].to(dev);
    if (transposed && transposable(c.inputs[i])) x = x.transpose(-1, -2);
    if (is_floating(x.dtype())) x = x.detach().set_requires_grad(true);
    xs.push_back(x);
  }
  // Leaves must be leaves: a transposed view is re-made a leaf above (detach keeps the strides).
  std::vector<Tensor> outs = c.fn(xs);
  Tensor loss;
  Generator g(grad_seed);
  for (const Tensor& o : outs) {
    if (!is_floating(o.dtype()) || !o.requires_grad()) continue;
    const Tensor w = randn(o.shape(), DType::f64, &g).to(o.dtype()).to(dev);
    const Tensor term = sum(cast(o * w, DType::f32));
    loss = loss.defined() ? loss + term : term;
  }
  if (loss.defined()) loss.backward();
  std::vector<Tensor> res;
  for (const Tensor& o : outs) res.push_back(o.detach().to(kCPU));
  for (const Tensor& x : xs) res.push_back(x.grad().defined() ? x.grad().to(kCPU) : Tensor());
  return res;
}

// Largest |a - b| / (1 + |b|) over all elements, with NaN only matching NaN.
double worst(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = a.to_vector(), y = b.to_vector();
  double w = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(x[i]) || std::isnan(y[i])) {
      if (!(std::isnan(x[i]) && std::isnan(y[i]))) return INFINITY;
      continue;
    }
    if (std::isinf(x[i]) || std::isinf(y[i])) {
      if (x[i] != y[i]) return INFINITY;
      continue;
    }
    w = std::max(w, std::abs(x[i] - y[i]) / (1.0 + std::abs(y[i])));
  }
  return w;
}

void compare_case(const Case& c, Device dev) {
  std::vector<DType> dts = {DType::f32};
  if (c.lowp) dts.insert(dts.end(), {DType::f16, DType::bf16});
  for (DType dt : dts) {
    for (bool transposed : {false, true}) {
      bool any = false;
      for (const In& in : c.inputs) any = any || transposable(in);
      if (transposed && !any) continue;
      Generator g(1234);
      std::vector<Tensor> inputs;
      for (const In& in : c.inputs) inputs.push_back(make_input(in, dt, g, transposed));
      const std::vector<Tensor> want = run_case(c, inputs, transposed, kCPU, 99);
      const std::vector<Tensor> got = run_case(c, inputs, transposed, dev, 99);
      REQUIRE(want.size() == got.size());
      const double tol = dt == DType::f32 ? c.tol32 : c.tol16;
      for (size_t i = 0; i < want.size(); ++i) {
        if (!want[i].defined()) {
          CHECK_MESSAGE(!got[i].defined(), c.name, ": result ", i, " defined only on ", dev);
          continue;
        }
        REQUIRE_MESSAGE(got[i].defined(), c.name, ": result ", i, " missing on ", dev);
        CHECK_MESSAGE(want[i].shape() == got[i].shape(), c.name, " result ", i, ": shapes ", want[i].shape(), " vs ",
                      got[i].shape());
        CHECK_MESSAGE(want[i].dtype() == got[i].dtype(), c.name, " result ", i, ": dtypes differ");
        const double w = worst(got[i], want[i]);
        CHECK_MESSAGE(w <= tol, c.name, " (", dt, transposed ? ", non-contiguous" : "", ") result ", i,
                      (i < want.size() - c.inputs.size() ? " (output)" : " (gradient)"), ": worst relative error ", w,
                      " > ", tol);
      }
    }
  }
}

// Deterministic mode for the CUDA run of a case (the CPU has one mode), restored when it ends.
struct DeterministicOnCuda {
  const bool was = cuda::deterministic();
  explicit DeterministicOnCuda(const Tensor& x) { cuda::set_deterministic(was || x.device().is_cuda()); }
  ~DeterministicOnCuda() { cuda::set_deterministic(was); }
  DeterministicOnCuda(const DeterministicOnCuda&) = delete;
  DeterministicOnCuda& operator=(const DeterministicOnCuda&) = delete;
};

const std::vector<Case>& cases() {
  using V = std::vector<Tensor>;
  static const std::vector<Case> all = [] {
    std::vector<Case> v;
    auto un = [&](const char* name, std::function<Tensor(const Tensor&)> f, Kind k = Kind::normal, double tol16 = 2e-2) {
      v.push_back({name, {{{33, 17}, k}}, [f](const V& x) { return one(f(x[0])); }, tol16});
    };
    auto bin = [&](const char* name, std::function<Tensor(const Tensor&, const Tensor&)> f, Kind kb = Kind::normal) {
      v.push_back({name, {{{8, 33, 17}}, {{33, 1}, kb}}, [f](const V& x) { return one(f(x[0], x[1])); }});
    };
    // elementwise (the second operand broadcasts)
    bin("add", [](const Tensor& a, const Tensor& b) { return add(a, b, 0.5); });
    bin("sub", [](const Tensor& a, const Tensor& b) { return sub(a, b, 2.0); });
    bin("mul", [](const Tensor& a, const Tensor& b) { return a * b; });
    bin("div", [](const Tensor& a, const Tensor& b) { return a / b; }, Kind::positive);
    bin("maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); });
    bin("minimum", [](const Tensor& a, const Tensor& b) { return minimum(a, b); });
    v.push_back({"pow", {{{8, 33, 17}, Kind::positive}, {{33, 17}}}, [](const V& x) { return one(pow(x[0], x[1])); },
                 3e-2});
    un("pow_scalar", [](const Tensor& a) { return pow(a, 3.0); });
    un("neg", [](const Tensor& a) { return -a; });
    un("abs", [](const Tensor& a) { return abs(a); });
    un("sign", [](const Tensor& a) { return sign(a) * a; });
    un("exp", [](const Tensor& a) { return exp(a); });
    un("log", [](const Tensor& a) { return log(a); }, Kind::positive);
    un("sqrt", [](const Tensor& a) { return sqrt(a); }, Kind::positive);
    un("rsqrt", [](const Tensor& a) { return rsqrt(a); }, Kind::positive);
    un("tanh", [](const Tensor& a) { return tanh(a); });
    un("sigmoid", [](const Tensor& a) { return sigmoid(a); });
    un("relu", [](const Tensor& a) { return relu(a); });
    un("gelu", [](const Tensor& a) { return gelu(a); });
    un("gelu_tanh", [](const Tensor& a) { return gelu(a, GeluApprox::tanh); });
    un("clamp", [](const Tensor& a) { return clamp(a, -0.5, 0.7); });
    un("cast", [](const Tensor& a) { return cast(cast(a, DType::bf16), DType::f32); });
    un("contiguous", [](const Tensor& a) { return a.t().contiguous(); });
    v.push_back({"where", {{{4, 33, 17}, Kind::mask}, {{4, 33, 17}}, {{33, 17}}},
                 [](const V& x) { return one(where(x[0], x[1], x[2])); }});
    v.push_back({"compare",
                 {{{33, 17}}, {{33, 17}}},
                 [](const V& x) {
                   const Tensor a = x[0], b = x[1];
                   const Tensor ge0 = ge(a, scalar_like(0.0, a));
                   return V{eq(a, a), ne(a, b), lt(a, b), le(a, b), gt(a, b), ge(a, b),
                            logical_and(ge0, lt(b, scalar_like(0.0, b))), logical_or(ge0, gt(b, a)), logical_not(ge0)};
                 }});
    v.push_back({"masked_fill", {{{33, 17}}, {{33, 17}, Kind::mask}},
                 [](const V& x) { return one(masked_fill(x[0], x[1], -3.0)); }});
    // reductions
    v.push_back({"sum", {{{6, 1000, 7}}}, [](const V& x) { return V{sum(x[0], {1}), sum(x[0], {0, 2}), sum(x[0])}; },
                 5e-2});
    v.push_back({"sum_large", {{{3, 20000}}}, [](const V& x) { return V{sum(x[0], {1}), sum(x[0])}; }, 5e-2, false,
                 1e-4});
    v.push_back({"mean", {{{6, 100, 7}}}, [](const V& x) { return V{mean(x[0], {1}), mean(x[0], {2}, true)}; }});
    v.push_back({"var", {{{6, 100, 7}}}, [](const V& x) { return V{var(x[0], {1}), var(x[0], {0, 2}, 0)}; }, 5e-2});
    v.push_back({"amax", {{{6, 100, 7}}}, [](const V& x) { return V{amax(x[0], {1}), amax(x[0], {2})}; }});
    v.push_back({"amin", {{{6, 100, 7}}}, [](const V& x) { return V{amin(x[0], {1}), amin(x[0], {2})}; }});
    v.push_back({"argmax", {{{6, 100, 7}}}, [](const V& x) { return V{argmax(x[0], 1), argmax(x[0], 2), argmax(x[0])}; }});
    v.push_back({"argmin", {{{6, 100, 7}}}, [](const V& x) { return V{argmin(x[0], 1), argmin(x[0], 2)}; }});
    // linear algebra
    v.push_back({"matmul", {{{70, 45}}, {{45, 33}}}, [](const V& x) { return one(matmul(x[0], x[1])); }});
    v.push_back({"matmul_batched", {{{3, 4, 20, 16}}, {{4, 16, 24}}},
                 [](const V& x) { return one(matmul(x[0], x[1])); }});
    v.push_back({"linear", {{{2, 9, 40}}, {{24, 40}}, {{24}}},
                 [](const V& x) { return one(linear(x[0], x[1], x[2])); }});
    // neural-network ops
    v.push_back({"conv2d", {{{2, 3, 11, 10}}, {{5, 3, 3, 3}}, {{5}}},
                 [](const V& x) { return one(conv2d(x[0], x[1], x[2], {1, 1}, {1, 1})); }, 3e-2});
    v.push_back({"conv2d_strided_grouped", {{{2, 4, 12, 9}}, {{6, 2, 3, 2}}},
                 [](const V& x) { return one(conv2d(x[0], x[1], {}, {2, 1}, {1, 0}, {1, 2}, 2)); }, 3e-2});
    // channels_last: cuDNN on NHWC buffers (filters copied to KRSC) against the CPU's NCHW kernels;
    // training batch norm through cuDNN, then eval (the apply kernel's NHWC indexing), then the
    // deterministic handwritten kernels on NCHW copies, and pooling, which keeps the layout.
    v.push_back({"channels_last", {{{2, 8, 9, 7}}, {{6, 8, 3, 3}}, {{6}}, {{6}}, {{6}}},
                 [](const V& x) {
                   const Tensor xl = x[0].contiguous(MemoryFormat::channels_last);
                   const Tensor y = conv2d(xl, x[1], x[4], {1, 1}, {1, 1});
                   const Tensor y2 = conv2d(xl, x[1], {}, {2, 2}, {0, 0});
                   Tensor y3;  // deterministic algorithms only (or NCHW copies where cuDNN has no NHWC one)
                   {
                     const DeterministicOnCuda on(x[0]);
                     y3 = conv2d(xl, x[1], x[4], {1, 1}, {2, 2}, {2, 2});
                   }
                   Tensor rm = zeros({6}, TensorOptions(DType::f32, x[0].device()));
                   Tensor rv = ones({6}, TensorOptions(DType::f32, x[0].device()));
                   const Tensor b = batch_norm(y, rm, rv, x[2], x[3], true, 0.1, 1e-5);
                   const Tensor be = batch_norm(y2, rm, rv, x[2], x[3], false, 0.1, 1e-5);
                   Tensor bd;
                   {
                     const DeterministicOnCuda on(x[0]);
                     bd = batch_norm(y, Tensor(), Tensor(), x[2], x[3], true, 0.1, 1e-5);
                   }
                   return V{y,  y2, y3, b, be, bd, rm, rv, max_pool2d(relu(b), {2, 2}),
                            avg_pool2d(bd, {3, 3}, {1, 1}, {1, 1})};
                 }, 3e-2});
    v.push_back({"max_pool2d", {{{2, 3, 11, 10}}}, [](const V& x) { return one(max_pool2d(x[0], {3, 3}, {2, 2}, {1, 1})); }});
    v.push_back({"avg_pool2d", {{{2, 3, 11, 10}}},
                 [](const V& x) { return V{avg_pool2d(x[0], {3, 3}, {2, 2}, {1, 1}), avg_pool2d(x[0], {2, 2}, {2, 2}, {1, 1}, false)}; }});
    v.push_back({"adaptive_avg_pool2d", {{{2, 3, 11, 10}}},
                 [](const V& x) { return V{adaptive_avg_pool2d(x[0], {1, 1}), adaptive_avg_pool2d(x[0], {4, 3})}; }});
    v.push_back({"batch_norm_train", {{{4, 5, 6, 7}}, {{5}}, {{5}}},
                 [](const V& x) {
                   Tensor rm = zeros({5}, TensorOptions(DType::f32, x[0].device()));
                   Tensor rv = ones({5}, TensorOptions(DType::f32, x[0].device()));
                   const Tensor y = batch_norm(x[0], rm, rv, x[1], x[2], true, 0.1, 1e-5);
                   return V{y, rm, rv};
                 }, 3e-2});
    // eps well above cuDNN's default, which the backward must take from the forward; the second call
    // has running_var only (cuDNN gets a zeroed stand-in for running_mean) and no gamma.
    v.push_back({"batch_norm_eps", {{{4, 5, 6, 7}}, {{5}}, {{5}}},
                 [](const V& x) {
                   Tensor rm = zeros({5}, TensorOptions(DType::f32, x[0].device()));
                   Tensor rv = ones({5}, TensorOptions(DType::f32, x[0].device()));
                   Tensor rv2 = ones({5}, TensorOptions(DType::f32, x[0].device()));
                   const Tensor y = batch_norm(x[0], rm, rv, x[1], x[2], true, 0.1, 0.1);
                   const Tensor y2 = batch_norm(x[0], Tensor(), rv2, Tensor(), x[2], true, 0.3, 0.1);
                   return V{y, rm, rv, y2, rv2};
                 }, 3e-2});
    // The handwritten deterministic kernels (CUDA run only): 40*60*4 = 9600 values per channel is two
    // chunks of the split reduction, the first ending inside an image. The backward runs inside the
    // case, while the mode is on; the gradients reach the leaves as in every other case.
    v.push_back({"batch_norm_deterministic", {{{4, 3, 40, 60}}, {{3}}, {{3}}},
                 [](const V& x) {
                   const DeterministicOnCuda on(x[0]);
                   Tensor rm = zeros({3}, TensorOptions(DType::f32, x[0].device()));
                   Tensor rv = ones({3}, TensorOptions(DType::f32, x[0].device()));
                   Tensor rv2 = ones({3}, TensorOptions(DType::f32, x[0].device()));
                   const Tensor y = batch_norm(x[0], rm, rv, x[1], x[2], true, 0.1, 1e-5);
                   const Tensor y2 = batch_norm(x[0], Tensor(), rv2, Tensor(), Tensor(), true, 0.2, 1e-3);
                   Generator g(31);
                   Tensor loss;
                   for (const Tensor& o : {y, y2}) {
                     const Tensor w = randn(o.shape(), DType::f64, &g).to(o.dtype()).to(o.device());
                     const Tensor term = sum(cast(o * w, DType::f32));
                     loss = loss.defined() ? loss + term : term;
                   }
                   loss.backward();
                   return V{y.detach(), rm, rv, y2.detach(), rv2};
                 }, 3e-2});
    v.push_back({"batch_norm_eval", {{{4, 5, 6, 7}}, {{5}}, {{5}}, {{5}}, {{5}, Kind::positive}},
                 [](const V& x) {
                   return one(batch_norm(x[0], x[3].detach(), x[4].detach(), x[1], x[2], false, 0.1, 1e-5));
                 }});
    v.push_back({"layer_norm", {{{3, 7, 96}}, {{96}}, {{96}}},
                 [](const V& x) { return one(layer_norm(x[0], {96}, x[1], x[2])); }, 3e-2});
    v.push_back({"softmax", {{{5, 300}}}, [](const V& x) { return V{softmax(x[0], 1), softmax(x[0], 0)}; }});
    // Rows of 40 (a warp per row) and of 1100 (a block per row); masks get gradients too.
    v.push_back({"masked_softmax", {{{2, 3, 10, 40}}, {{2, 1, 1, 40}}, {{10, 1}}, {{3, 1100}}, {{1100}}},
                 [](const V& x) {
                   return V{masked_softmax(x[0], x[1], 0.3), masked_softmax(x[0], x[2], 1.5),
                            masked_softmax(x[0].narrow(3, 0, 7), Tensor(), 0.9), masked_softmax(x[3], x[4], 0.7)};
                 }});
    v.push_back({"log_softmax", {{{5, 300}}}, [](const V& x) { return V{log_softmax(x[0], 1), log_softmax(x[0], 0)}; }});
    v.push_back({"cross_entropy", {{{40, 13}}, {{40}, Kind::index, 13}},
                 [](const V& x) {
                   return V{cross_entropy(x[0], x[1]), cross_entropy(x[0], x[1], 3, 0.1, Reduction::none)};
                 }});
    v.push_back({"nll_loss", {{{40, 13}}, {{40}, Kind::index, 13}},
                 [](const V& x) { return one(nll_loss(log_softmax(x[0], 1), x[1], 5)); }});
    v.push_back({"mse_loss", {{{40, 13}}, {{40, 13}}}, [](const V& x) { return one(mse_loss(x[0], x[1])); }});
    v.push_back({"bce_with_logits", {{{40, 13}}, {{40, 13}, Kind::unit}},
                 [](const V& x) { return one(binary_cross_entropy_with_logits(x[0], x[1])); }});
    v.push_back({"embedding", {{{50, 24}}, {{4, 30}, Kind::index, 50}},
                 [](const V& x) { return V{embedding(x[0], x[1]), embedding(x[0], x[1], 7)}; }});
    v.push_back({"dropout", {{{64, 40}}}, [](const V& x) {
                   Generator g(5);
                   return one(dropout(x[0], 0.3, true, &g));
                 }});
    v.push_back({"attention", {{{2, 3, 10, 16}}, {{2, 3, 12, 16}}, {{2, 3, 12, 8}}, {{10, 12}, Kind::mask}},
                 [](const V& x) {
                   return V{scaled_dot_product_attention(x[0], x[1], x[2]),
                            scaled_dot_product_attention(x[0], x[1], x[2], logical_not(x[3]))};
                 }, 3e-2});
    v.push_back({"cat_stack_split", {{{4, 5}}, {{4, 5}}},
                 [](const V& x) {
                   const std::vector<Tensor> parts = split(x[0], 2, 1);
                   return V{cat({x[0], x[1]}, 1), stack({x[0], x[1]}, 0), parts[0] * 2.0, parts[2]};
                 }});
    v.push_back({"index_select", {{{9, 20}}, {{14}, Kind::index, 9}},
                 [](const V& x) { return V{index_select(x[0], 0, x[1]), index_select(x[0].t(), 1, x[1])}; }});
    v.push_back({"gather", {{{9, 20}}, {{9, 6}, Kind::index, 20}}, [](const V& x) { return one(gather(x[0], 1, x[1])); }});
    v.push_back({"scatter_add", {{{9, 20}}, {{9, 6}, Kind::index, 20}, {{9, 6}}},
                 [](const V& x) { return one(scatter_add(x[0], 1, x[1], x[2])); }});
    v.push_back({"one_hot", {{{7, 3}, Kind::index, 6}}, [](const V& x) { return one(one_hot(x[0], 6)); }, 0, false});
    // factories and random streams (no inputs: the device comes from a dummy input)
    v.push_back({"factories", {{{3, 4}}},
                 [](const V& x) {
                   const TensorOptions o(DType::f32, x[0].device());
                   Generator g(77);
                   return V{arange(0.0, 10.0, 0.5, o), full({3, 4}, 2.5, o), eye(4, 5, o), rand({1001}, o, &g),
                            bernoulli({1001}, 0.4, o, &g), randn({1001}, o, &g), x[0] * 1.0};
                 }, 2e-2, false, 1e-5});
    return v;
  }();
  return all;
}

std::set<std::string> listed_ops() {
  std::ifstream f(std::string(KILN_TEST_SOURCE_DIR) + "/gpu_parity_ops.txt");
  std::set<std::string> ops;
  for (std::string line; std::getline(f, line);)
    if (!line.empty() && line[0] != '#') ops.insert(line);
  return ops;
}

}  // namespace

TEST_CASE("gpu parity: the op named by KILN_PARITY_OP (all without it) matches the CPU") {
  if (cuda::device_count() == 0) {
    std::printf("skipped: %s\n", cuda::compiled() ? "no CUDA device visible" : "this build has no CUDA backend");
    std::exit(77);
  }
  const char* only = std::getenv("KILN_PARITY_OP");
  bool found = false;
  for (const Case& c : cases()) {
    if (only && c.name != only) continue;
    found = true;
    INFO("op ", c.name);
    compare_case(c, cuda_device(0));
  }
  CHECK_MESSAGE(found, "no parity case named ", only ? only : "");
  cuda::synchronize(0);
}

TEST_CASE("gpu parity table: lists the ops ctest registers, and every case runs on the CPU") {
  std::set<std::string> names;
  for (const Case& c : cases()) names.insert(c.name);
  CHECK(names == listed_ops());
  // The harness end to end with the CPU on both sides: inputs, forward, backward, comparison.
  for (const Case& c : cases()) {
    INFO("op ", c.name);
    compare_case(c, kCPU);
  }
}
