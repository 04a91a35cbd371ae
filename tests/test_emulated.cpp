// The CUDA kernels under the emulator (kernels/cuda/emulator; ctest label emulated): every row of
// the op table through the CUDA backend's kernel bodies, compiled from kernels/cuda as host C++,
// against the CPU backend on the same inputs: f32, f16 and bf16, contiguous and not, outputs and
// gradients (optable::parity, the harness of the GPU parity test). Then every handwritten
// __global__ kernel of kernels/cuda must have run, and the kernels' own checks (an index out of
// range) must surface as the real backend's errors.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "engine/amp.h"
#include "engine/internal.h"
#include "engine/nn.h"
#include "engine/ops.h"
#include "engine/optim.h"
#include "kernels/cuda/emulator/emulator.h"
#include "models/bert.h"
#include "models/resnet.h"
#include "tests/int_edges.h"
#include "tests/op_table.h"
#include "tests/softmax_edges.h"

using namespace kiln;
using namespace kiln::optable;

namespace {

// While one lives, cuda:0 is the emulated device: its tensors live in the emulator's device memory,
// its ops run the emulated CUDA table, and a kernel given any other memory throws.
class EmulatedCuda {
 public:
  EmulatedCuda() { emu::check_device_pointers(true); }
  ~EmulatedCuda() { emu::check_device_pointers(false); }

 private:
  detail::DeviceEmulation device_{emu::emulated_cuda_backend(), emu::device_memory()};
};

// The row on the emulated cuda:0, as the GPU parity test runs it on a real one: the inputs are
// uploaded, the engine takes its device paths, and a kernel handed host memory is an error.
std::vector<std::string> emulated_parity(const Row& r) {
  const auto run = [&](const std::vector<Tensor>& in, bool transposed) {
    EmulatedCuda device;
    return run_row(r, in, transposed, cuda_device(0));
  };
  return parity(r, "emulated CUDA", run);
}

// Each __global__ kernel of a kernels/cuda file, by its source name.
std::set<std::string> global_kernels(const std::string& file) {
  std::ifstream in(file);
  std::stringstream text;
  text << in.rdbuf();
  const std::string s = text.str();
  static const std::regex re(R"(__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s+)?(\w+)\s*\()");
  std::set<std::string> names;
  for (auto it = std::sregex_iterator(s.begin(), s.end(), re); it != std::sregex_iterator(); ++it)
    names.insert((*it)[1].str());
  return names;
}

// Five steps of an optimizer under loss scaling (the third step's gradient holds an inf, so it is
// skipped and the scale backs off; the growth interval of 2 grows it again), from the same start:
// the parameters, the optimizer state and the scaler state after them.
struct AfterSteps {
  std::vector<std::vector<double>> params;
  optim::OptimizerState opt;
  amp::GradScalerState scaler;
};
using MakeOptimizer = std::function<std::unique_ptr<optim::Optimizer>(std::vector<Tensor>)>;

AfterSteps run_steps(const MakeOptimizer& make, const std::vector<Tensor>& start, const std::vector<Tensor>& dirs,
                     bool emulated) {
  std::optional<EmulatedCuda> device;  // parameters, gradients, optimizer and scaler state on cuda:0
  if (emulated) device.emplace();
  const Device dev = emulated ? cuda_device(0) : kCPU;
  std::vector<Tensor> ps, ds;
  for (const Tensor& t : start) ps.push_back(t.to(dev).clone().set_requires_grad());
  for (const Tensor& t : dirs) ds.push_back(t.to(dev));
  const std::unique_ptr<optim::Optimizer> opt = make(ps);
  amp::GradScaler scaler({1024.0, 2.0, 0.5, 2});
  for (int s = 0; s < 5; ++s) {
    opt->zero_grad();
    Tensor loss = zeros({}, TensorOptions(DType::f32, dev));
    for (size_t i = 0; i < ps.size(); ++i) loss = loss + sum(ps[i] * ds[i] * double(s + 1) + ps[i] * ps[i]);
    scaler.scale(loss).backward();
    if (s == 2) ps[1].grad().narrow(0, 3, 1).fill_(INFINITY);
    scaler.step(*opt, ps);
    scaler.update();
  }
  AfterSteps out{{}, opt->state(), scaler.state()};
  for (auto& [name, t] : out.opt.tensors) t = t.to(kCPU);
  for (const Tensor& p : ps) out.params.push_back(p.to_vector());
  return out;
}

void check_close(const std::vector<double>& got, const std::vector<double>& want, const std::string& what) {
  REQUIRE_MESSAGE(got.size() == want.size(), what, ": sizes differ");
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(got[i] - want[i]) / (1 + std::abs(want[i])));
  CHECK_MESSAGE(worst <= 1e-6, what, ": worst relative error ", worst);
}

}  // namespace

TEST_CASE("emulated cuda: every op-table row matches the CPU (KILN_EMULATED_OP: one row)") {
  const char* only = std::getenv("KILN_EMULATED_OP");
  bool found = false;
  for (const Row& r : rows()) {
    if (only && r.name != only) continue;
    found = true;
    INFO("row ", r.name);
    for (const std::string& err : emulated_parity(r)) CHECK_MESSAGE(false, err);
  }
  CHECK_MESSAGE(found, "no op-table row named ", std::string(only ? only : ""));
}

TEST_CASE(
    "emulated cuda: large inputs keep log-softmax's precision; a fully masked row gives softmax 0 and attention 0") {
  detail::BackendOverride use(emu::emulated_cuda_backend());
  kiln::testing::check_softmax_edges();
}

TEST_CASE("emulated cuda: layer norm of a constant row far from 0 is exactly 0") {
  detail::BackendOverride use(emu::emulated_cuda_backend());
  // 8192 wide: each thread of the row's block sums 32 values of 12345.678 in f32.
  CHECK(amax(abs(layer_norm(full({2, 8192}, 12345.678), {8192}))).item<double>() == 0.0);
}

TEST_CASE("emulated cuda: u8, i8 and i16 give the CPU's values (wrapping, division, casts, reductions, sorting)") {
  detail::BackendOverride use(emu::emulated_cuda_backend());
  kiln::testing::check_integer_dtypes();
}

TEST_CASE(
    "emulated cuda: i32 and i64 wrap at overflow as the CPU's; INT_MIN / -1 does not trap; a zero divisor is an "
    "error") {
  detail::BackendOverride use(emu::emulated_cuda_backend());
  kiln::testing::check_integer_overflow();
}

TEST_CASE("emulated cuda: index_put into i64 is exact (sort, scan and scatter of its composition)") {
  detail::BackendOverride use(emu::emulated_cuda_backend());
  const int64_t big = (int64_t(1) << 60) + 3;
  const std::vector<int64_t> xv{1, big, 5, 7}, iv{2, 1, 2, 1, 1}, vv{big, 1, -3, (int64_t(1) << 55) + 1, 7};
  const Tensor x = from_blob_copy(xv.data(), {4}), idx = from_blob_copy(iv.data(), {5}),
               v = from_blob_copy(vv.data(), {5});
  CHECK(index_put(x, {idx}, v, true).values<int64_t>() ==
        std::vector<int64_t>{1, big + 1 + (int64_t(1) << 55) + 1 + 7, 5 + big - 3, 7});
  CHECK(index_put(x, {idx}, v, false).values<int64_t>() == std::vector<int64_t>{1, 7, -3, 7});
}

TEST_CASE("emulated cuda: the threads of a block in reverse order give the same results") {
  // A kernel whose threads race between barriers tends to change its result with the order.
  emu::set_order(emu::Order::reverse);
  for (const char* name : {"softmax", "log_softmax", "layer_norm", "cross_entropy", "sum_large", "batch_norm",
                           "masked_softmax", "embedding", "max_pool2d", "batch_norm_1d"}) {
    const Row* r = find_row(name);
    REQUIRE_MESSAGE(r, "no op-table row ", name);
    INFO("row ", name);
    for (const std::string& err : emulated_parity(*r)) CHECK_MESSAGE(false, err);
  }
  emu::set_order(emu::Order::forward);
}

TEST_CASE("emulated cuda: the fused optimizer steps and loss scaling match the CPU") {
  // Odd sizes: a parameter smaller than a warp, one over several 256-thread chunks.
  const std::vector<Tensor> start = {randn({3, 5}), randn({1000}), randn({7})};
  const std::vector<Tensor> dirs = {randn({3, 5}), randn({1000}), randn({7})};
  const std::vector<std::pair<std::string, MakeOptimizer>> optimizers = {
      {"sgd",
       [](std::vector<Tensor> p) {
         return std::make_unique<optim::SGD>(std::vector<optim::ParamGroup>{{p, 0.1, 0.01}});
       }},
      {"sgd momentum",
       [](std::vector<Tensor> p) {
         return std::make_unique<optim::SGD>(std::vector<optim::ParamGroup>{{p, 0.1, 0.01}},
                                             optim::SgdOptions{0.9, 0.1, false});
       }},
      {"sgd nesterov",
       [](std::vector<Tensor> p) {
         return std::make_unique<optim::SGD>(std::vector<optim::ParamGroup>{{p, 0.1, 0.0}},
                                             optim::SgdOptions{0.9, 0.0, true});
       }},
      {"adamw",
       [](std::vector<Tensor> p) {
         return std::make_unique<optim::AdamW>(std::vector<optim::ParamGroup>{{p, 0.01, 0.1}});
       }},
      {"lamb",
       [](std::vector<Tensor> p) {
         return std::make_unique<optim::LAMB>(std::vector<optim::ParamGroup>{{p, 0.01, 0.1}});
       }},
  };
  for (const auto& [name, make] : optimizers) {
    INFO("optimizer ", name);
    const AfterSteps want = run_steps(make, start, dirs, false), got = run_steps(make, start, dirs, true);
    CHECK(got.scaler.scale == want.scaler.scale);
    CHECK(got.scaler.growth_tracker == want.scaler.growth_tracker);
    CHECK(got.scaler.skipped == want.scaler.skipped);
    CHECK(want.scaler.skipped == 1);
    for (size_t i = 0; i < want.params.size(); ++i) {
      check_close(got.params[i], want.params[i], "parameter " + std::to_string(i));
      // The per-element arithmetic is kernels/common/optim_math.h on both sides, FMAs written out:
      // the same bits, but for LAMB, whose trust ratio comes from norms summed in another order.
      if (name != "lamb") CHECK_MESSAGE(got.params[i] == want.params[i], "parameter ", i, " differs in its bits");
    }
    CHECK(got.opt.scalars == want.opt.scalars);
    REQUIRE(got.opt.tensors.size() == want.opt.tensors.size());
    for (const auto& [k, t] : want.opt.tensors) check_close(got.opt.tensors.at(k).to_vector(), t.to_vector(), k);
  }
}

TEST_CASE("emulated cuda: a kernel's index check throws the backend's error") {
  const Backend& b = emu::emulated_cuda_backend();
  const std::vector<float> src = {1, 2, 3, 4, 5, 6};
  const std::vector<int64_t> idx = {0, 3};  // row 3 of 3
  std::vector<float> dst(4);
  CHECK_THROWS_WITH_AS(b.index_select(DType::f32, 1, 3, 2, src.data(), 2, idx.data(), dst.data()),
                       doctest::Contains("index_select/embedding: an index is out of range"), Error);
  // The word is cleared: the next call with good indices succeeds.
  const std::vector<int64_t> good = {2, 0};
  b.index_select(DType::f32, 1, 3, 2, src.data(), 2, good.data(), dst.data());
  CHECK(dst == std::vector<float>{5, 6, 1, 2});
}

TEST_CASE("emulated cuda: a product over k = 0 scales C by beta (gemm.cu's scale kernel), never reading it for beta 0") {
  const Backend& b = emu::emulated_cuda_backend();
  // Two 3 x 4 matrices with row stride 5 and 16 elements apart; the padding must stay untouched.
  std::vector<float> c(32, 7.0f);
  for (size_t i = 0; i < c.size(); ++i) c[i] = float(i);
  const std::vector<float> before = c;
  b.gemm_batched(DType::f32, false, false, 3, 4, 0, 1.0, nullptr, 1, 0, nullptr, 4, 0, 0.5, c.data(), 5, 16, 2);
  for (int64_t i = 0; i < 32; ++i) {
    const int64_t in = i % 16, row = in / 5, col = in % 5;
    const bool inside = row < 3 && col < 4;
    CHECK(c[size_t(i)] == (inside ? before[size_t(i)] * 0.5f : before[size_t(i)]));
  }
  std::vector<float> nan_c(12, std::nanf(""));
  b.gemm(DType::f32, false, false, 3, 4, 0, 1.0, nullptr, 1, nullptr, 4, 0.0, nan_c.data(), 4);
  for (float v : nan_c) CHECK(v == 0.0f);
}

TEST_CASE("emulated cuda: clamp's NaN bound gives NaN and an absent bound is no bound, as on the CPU") {
  // The kernel takes both bounds (an absent one an infinity, saturated for integers); a NaN bound is a bound.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EmulatedCuda device;
  for (DType dt : {DType::f32, DType::f16, DType::bf16, DType::f64}) {
    CAPTURE(dt);
    const Tensor x = from_vector({0, -5, 5, nan}, {4}).to(dt).to(cuda_device(0));
    for (const Tensor& y : {clamp(x, std::nullopt, nan), clamp(x, nan, 1.0), clamp(x, -1.0, nan)})
      for (double v : y.to(kCPU).to_vector()) CHECK(std::isnan(v));
    const std::vector<double> hi = clamp(x, std::nullopt, 1.0).to(kCPU).to_vector();
    CHECK(hi[0] == 0);
    CHECK(hi[1] == -5);
    CHECK(hi[2] == 1);
    CHECK(std::isnan(hi[3]));
    // min > max: every element max (NaN stays NaN), as PyTorch's.
    const std::vector<double> crossed = clamp(x, 2.0, 1.0).to(kCPU).to_vector();
    CHECK(crossed[0] == 1);
    CHECK(crossed[1] == 1);
    CHECK(crossed[2] == 1);
    CHECK(std::isnan(crossed[3]));
  }
  for (DType dt : {DType::i8, DType::u8, DType::i64}) {
    CAPTURE(dt);
    const Tensor x = from_vector({0, 5, 100}, {3}, dt).to(cuda_device(0));
    CHECK(clamp(x, std::nullopt, 200.0).to(kCPU).to_vector() == std::vector<double>{0, 5, 100});
    CHECK(clamp(x, 3.0, std::nullopt).to(kCPU).to_vector() == std::vector<double>{3, 5, 100});
    CHECK(clamp(x, 7.0, 4.0).to(kCPU).to_vector() == std::vector<double>{4, 4, 4});
  }
}

TEST_CASE(
    "emulated cuda: a number in 16-bit + - * / (in place too) stays f32, and linear adds its bias before the one "
    "rounding") {
  // bf16 x * 0.1 is x * 0.1f rounded once (not x * bf16(0.1) = x * 0.10009765625), on the CPU and in the CUDA
  // kernels; linear's bias joins the GEMM's f32 accumulation (its C), so each output is rounded once.
  for (DType dt : {DType::bf16, DType::f16}) {
    CAPTURE(dt);
    std::vector<double> xs, ws, bs;
    // Values exact in both dtypes, products and sums exact in f32; rounding the product before adding the bias
    // misses the one correct rounding in 40 bf16 outputs and 2 f16 ones.
    for (int i = 0; i < 16 * 32; ++i) xs.push_back(double(i * 37 % 121) - 60.0);
    for (int i = 0; i < 16 * 32; ++i) ws.push_back(double(i * 5 % 23 - 11) / 256.0);
    for (int i = 0; i < 16; ++i) bs.push_back(0.75 * i - 5.125);
    const Tensor x = from_vector(xs, {16, 32}).to(dt), w = from_vector(ws, {16, 32}).to(dt),
                 b = from_vector(bs, {16}).to(dt);
    const auto round_once = [dt](double v) { return from_vector({v}, {1}).to(dt).to_vector()[0]; };
    const std::vector<double> xv = x.to_vector();
    for (bool emulated : {false, true}) {
      CAPTURE(emulated);
      std::optional<EmulatedCuda> device;
      if (emulated) device.emplace();
      const Device dev = emulated ? cuda_device(0) : kCPU;
      const Tensor xd = x.to(dev);
      const std::vector<double> mul = (xd * 0.1).to(kCPU).to_vector(), div = (xd / 3.0).to(kCPU).to_vector(),
                                rsub = (0.1 - xd).to(kCPU).to_vector(), add = (xd + 0.1).to(kCPU).to_vector();
      int wrong = 0;
      for (size_t i = 0; i < xv.size(); ++i) {
        const float v = float(xv[i]);
        wrong += mul[i] != round_once(v * 0.1f) || div[i] != round_once(v / 3.0f) || rsub[i] != round_once(0.1f - v) ||
                 add[i] != round_once(v + 0.1f);
      }
      CHECK(wrong == 0);
      // In place as out of place: x.mul_(0.999) and x += 0.1 round once too (an EMA's decay stays 0.999).
      Tensor xm = xd.clone(), xa = xd.clone();
      xm.mul_(0.999);
      xa.add_(scalar_tensor(0.1, TensorOptions(DType::f32, dev)));
      CHECK(xm.to(kCPU).to_vector() == (xd * 0.999).to(kCPU).to_vector());
      CHECK(xa.to(kCPU).to_vector() == add);
      const std::vector<double> y = linear(xd, w.to(dev), b.to(dev)).to(kCPU).to_vector();
      int wrong_linear = 0;
      for (int r = 0; r < 16; ++r)
        for (int o = 0; o < 16; ++o) {
          double exact = bs[size_t(o)];
          for (int k = 0; k < 32; ++k) exact += xs[size_t(r * 32 + k)] * ws[size_t(o * 32 + k)];
          wrong_linear += y[size_t(r * 16 + o)] != round_once(exact);
        }
      CHECK(wrong_linear == 0);
    }
  }
}

TEST_CASE("emulated cuda: 16-bit conv_transpose2d adds its bias to the 16-bit output on CUDA, rounds once on the CPU") {
  // The CUDA backend computes 16-bit convolutions in 16-bit buffers (cuDNN, tensor cores) and adds the bias
  // to the rounded output, as its conv2d and torch's CUDA convolutions do; the CPU computes in f32 and adds
  // the bias before the one cast. Values exact in both dtypes, products and sums exact in f32 (multiples of
  // 1/256 below 2^8): each CPU output is the exact sum rounded once, each CUDA output the exact product
  // rounded, plus the bias, rounded.
  const int64_t n = 2, ci = 8, h = 5, wd = 5, co = 4, k = 3, oh = h + k - 1, ow = wd + k - 1;
  std::vector<double> xs, ws, bs;
  for (int64_t i = 0; i < n * ci * h * wd; ++i) xs.push_back(double(i * 37 % 121) - 60.0);
  for (int64_t i = 0; i < ci * co * k * k; ++i) ws.push_back(double(i * 5 % 23 - 11) / 256.0);
  for (int64_t i = 0; i < co; ++i) bs.push_back(0.75 * double(i) - 5.125);
  for (DType dt : {DType::bf16, DType::f16}) {
    CAPTURE(dt);
    const Tensor x = from_vector(xs, {n, ci, h, wd}).to(dt), w = from_vector(ws, {ci, co, k, k}).to(dt),
                 b = from_vector(bs, {co}).to(dt);
    const auto round_once = [dt](double v) { return from_vector({v}, {1}).to(dt).to_vector()[0]; };
    for (bool emulated : {false, true}) {
      CAPTURE(emulated);
      std::optional<EmulatedCuda> device;
      if (emulated) device.emplace();
      const Device dev = emulated ? cuda_device(0) : kCPU;
      const Tensor y = conv_transpose2d(x.to(dev), w.to(dev), b.to(dev));
      REQUIRE(y.dtype() == dt);
      const std::vector<double> yv = y.to(kCPU).to_vector();
      int wrong = 0, twice_differs = 0;
      for (int64_t s = 0; s < n; ++s)
        for (int64_t o = 0; o < co; ++o)
          for (int64_t i = 0; i < oh; ++i)
            for (int64_t j = 0; j < ow; ++j) {
              double exact = 0;
              for (int64_t c = 0; c < ci; ++c)
                for (int64_t ki = 0; ki < k; ++ki)
                  for (int64_t kj = 0; kj < k; ++kj) {
                    const int64_t hi = i - ki, wi = j - kj;
                    if (hi < 0 || hi >= h || wi < 0 || wi >= wd) continue;
                    exact +=
                        xs[size_t(((s * ci + c) * h + hi) * wd + wi)] * ws[size_t(((c * co + o) * k + ki) * k + kj)];
                  }
              const double once = round_once(exact + bs[size_t(o)]);
              const double twice = round_once(round_once(exact) + bs[size_t(o)]);
              twice_differs += once != twice;
              wrong += yv[size_t(((s * co + o) * oh + i) * ow + j)] != (emulated ? twice : once);
            }
      CHECK(wrong == 0);
      CHECK(twice_differs > 0);  // the data tell the two apart
    }
  }
}

TEST_CASE("emulated cuda: kiln doctor's device self-test passes") {
  // The same kernel and rule as `kiln doctor --device cuda`: the device's scalar math (Philox, f16
  // and bf16 conversions, NaN patterns, GELU) against the host's.
  const std::string mismatch = emu::device_self_test();
  CHECK_MESSAGE(mismatch.empty(), mismatch);
}

// Training steps on the emulated cuda:0 against the CPU from the same weights and data (as the GPU
// training test does on a real device, smaller): modules, buffers, optimizers and their state on
// the device, so that a module that hands a kernel a CPU tensor fails here, in CI.
template <typename Model> std::pair<std::vector<double>, nn::StateDict> emulated_steps(
    bool on_device, const std::function<std::shared_ptr<Model>()>& build,
    const std::function<Tensor(Model&, Device)>& loss_at,
    const std::function<std::unique_ptr<optim::Optimizer>(Model&)>& make_opt, int steps) {
  std::optional<EmulatedCuda> device;
  if (on_device) device.emplace();
  const Device dev = on_device ? cuda_device(0) : kCPU;
  manual_seed(11);
  auto model = build();
  model->to(dev);
  auto opt = make_opt(*model);
  manual_seed(12);
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s) {
    opt->zero_grad();
    Tensor loss = loss_at(*model, dev);
    loss.backward();
    opt->step();
    losses.push_back(loss.item<double>());
  }
  nn::StateDict state;
  for (auto& [name, t] : model->state_dict()) state[name] = t.detach().to(kCPU);
  return {losses, state};
}

template <typename Model>
void check_emulated_training(const std::function<std::shared_ptr<Model>()>& build,
                             const std::function<Tensor(Model&, Device)>& loss_at,
                             const std::function<std::unique_ptr<optim::Optimizer>(Model&)>& make_opt) {
  const auto [want, cpu_state] = emulated_steps<Model>(false, build, loss_at, make_opt, 3);
  const auto [got, dev_state] = emulated_steps<Model>(true, build, loss_at, make_opt, 3);
  REQUIRE(want.size() == got.size());
  for (size_t i = 0; i < want.size(); ++i)
    CHECK_MESSAGE(std::abs(got[i] - want[i]) <= 1e-3 * (1 + std::abs(want[i])), "step ", i, ": CPU loss ", want[i],
                  ", emulated CUDA loss ", got[i]);
  REQUIRE(cpu_state.size() == dev_state.size());
  for (const auto& [name, t] : cpu_state) {
    const std::vector<double> a = t.to_vector(), b = dev_state.at(name).to_vector();
    REQUIRE_MESSAGE(a.size() == b.size(), name);
    double worst = 0, scale = 0;
    for (size_t i = 0; i < a.size(); ++i)
      worst = std::max(worst, std::abs(a[i] - b[i])), scale = std::max(scale, std::abs(a[i]));
    CHECK_MESSAGE(worst <= 2e-3 * (1 + scale), name, ": largest difference ", worst, " (largest value ", scale, ")");
  }
}

TEST_CASE("emulated cuda: ResNet-20 and BERT-tiny training steps on the device follow the CPU") {
  if (std::getenv("KILN_EMULATED_OP")) return;  // one row only
  {
    INFO("ResNet-20, SGD with momentum");
    using M = models::ResNet;
    Generator g(3);
    const Tensor images = randn({4, 3, 16, 16}, DType::f32, &g);
    const Tensor labels = randint(0, 10, {4}, DType::i64, &g);
    check_emulated_training<M>(
        [] {
          return models::make_resnet({"resnet20", 10, 3});
        },
        [&](M& m, Device dev) { return cross_entropy(m(images.to(dev)), labels.to(dev)); },
        [](M& m) -> std::unique_ptr<optim::Optimizer> {
          return std::make_unique<optim::SGD>(std::vector<optim::ParamGroup>{{m.parameters(), 0.05, 5e-4}},
                                              optim::SgdOptions{0.9, 0.0, false});
        });
  }
  {
    INFO("BERT-tiny masked LM, AdamW, dropout on");
    using M = models::BertForMaskedLM;
    models::BertConfig c = models::bert_config("tiny");
    c.vocab_size = 100;
    Generator g(4);
    const Tensor ids = randint(5, 100, {2, 16}, DType::i64, &g);
    const Tensor picked = lt(rand({2, 16}, DType::f32, &g), scalar_tensor(0.3));
    const Tensor labels = where(picked, ids, full({2, 16}, -100.0, DType::i64));
    check_emulated_training<M>(
        [c] { return std::make_shared<M>(c); },
        [&](M& m, Device dev) {
          return cross_entropy(m.forward(ids.to(dev)).reshape({-1, c.vocab_size}), labels.to(dev).reshape({-1}));
        },
        [](M& m) -> std::unique_ptr<optim::Optimizer> {
          return std::make_unique<optim::AdamW>(std::vector<optim::ParamGroup>{{m.parameters(), 1e-3, 0.01}});
        });
  }
}

TEST_CASE("emulated cuda: every handwritten kernel of kernels/cuda ran") {
  if (std::getenv("KILN_EMULATED_OP")) return;  // one row runs only its own kernels
  // Kernels the emulated build does not compile, and what covers them instead.
  const std::map<std::string, std::string> elsewhere = {
      {"tc_gemm_kernel", "inline PTX: the Tensor Core GEMM's own emulator (test_tcgemm.cpp)"},
  };
  const std::string dir = std::string(KILN_TEST_SOURCE_DIR) + "/../kernels/cuda/";
  std::set<std::string> all;
  // Every kernel file, so that a new one is covered without a list to update.
  for (const auto& f : std::filesystem::directory_iterator(dir))
    if (f.path().extension() == ".cu")
      for (const std::string& k : global_kernels(f.path().string())) all.insert(k);
  CHECK(all.size() > 30);
  const auto runs = emu::kernel_runs();
  std::printf("%-32s %10s %12s\n", "kernel", "launches", "threads");
  for (const std::string& k : all) {
    auto it = runs.find(k);
    if (it != runs.end()) {
      std::printf("%-32s %10lld %12lld\n", k.c_str(), (long long)it->second.launches, (long long)it->second.threads);
    } else if (elsewhere.count(k)) {
      std::printf("%-32s %23s\n", k.c_str(), "not emulated");
    } else {
      CHECK_MESSAGE(false, "kernel ", k, " never ran under the emulator: give the op table a row that reaches it");
    }
  }
  for (const auto& [k, r] : runs) CHECK_MESSAGE(all.count(k), "launch name ", k, " is not a __global__ kernel");
  // The list for bench/kernel_facts.sh, which prints it beside each kernel's registers.
  if (const char* out = std::getenv("KILN_EMULATED_KERNELS_OUT")) {
    std::ofstream f(out);
    for (const auto& [k, r] : runs) f << k << " " << r.launches << " " << r.threads << "\n";
    CHECK_MESSAGE(f.good(), "could not write ", out);
  }
}
