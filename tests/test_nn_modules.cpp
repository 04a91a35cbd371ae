// nn modules, initialisers, optimizers (against hand-computed steps), clipping and LR schedules,
// and a small transformer block that learns.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <set>
#include <tuple>
#include <type_traits>

#include "kernels/common/optim_math.h"
#include "kernels/cpu/ops_cpu.h"
#include "kiln.h"
#include "test_util.h"

using namespace kiln;
using kiln::testing::contains;
using kiln::testing::error_of;

namespace {

struct Block : nn::Module {
  std::shared_ptr<nn::Conv2d> conv1;
  std::shared_ptr<nn::BatchNorm2d> bn1;
  std::shared_ptr<nn::Sequential> downsample;
  Block() {
    conv1 = register_module("conv1", std::make_shared<nn::Conv2d>(3, 4, Pair{3, 3}, Pair{1, 1}, Pair{1, 1}, Pair{1, 1}, 1, false));
    bn1 = register_module("bn1", std::make_shared<nn::BatchNorm2d>(4));
    downsample = register_module("downsample", std::make_shared<nn::Sequential>());
    downsample->push_back(std::make_shared<nn::Conv2d>(3, 4, Pair{1, 1}, Pair{1, 1}, Pair{0, 0}, Pair{1, 1}, 1, false));
    downsample->push_back(std::make_shared<nn::BatchNorm2d>(4));
  }
  std::string type_name() const override { return "Block"; }
};

struct Net : nn::Module {
  std::shared_ptr<nn::Sequential> layer1;
  std::shared_ptr<nn::Linear> fc;
  Net() {
    layer1 = register_module("layer1", std::make_shared<nn::Sequential>());
    fc = register_module("fc", std::make_shared<nn::Linear>(4, 2));
  }
  std::string type_name() const override { return "Net"; }
};

std::vector<std::string> names(const nn::NamedTensors& v) {
  std::vector<std::string> out;
  for (auto& [n, t] : v) out.push_back(n);
  return out;
}

Tensor param(std::vector<double> v) { return from_vector(v, {int64_t(v.size())}).set_requires_grad(); }

}  // namespace

TEST_CASE("modules: dotted names in the common convention, buffers, counts") {
  Block b;
  CHECK(names(b.named_parameters()) ==
        std::vector<std::string>{"conv1.weight", "bn1.weight", "bn1.bias", "downsample.0.weight", "downsample.1.weight",
                                 "downsample.1.bias"});
  CHECK(names(b.named_buffers()) ==
        std::vector<std::string>{"bn1.running_mean", "bn1.running_var", "bn1.num_batches_tracked",
                                 "downsample.1.running_mean", "downsample.1.running_var",
                                 "downsample.1.num_batches_tracked"});
  CHECK(b.num_parameters() == 4 * 3 * 9 + 4 + 4 + 4 * 3 + 4 + 4);
  b.eval();
  CHECK(!b.bn1->is_training());
  CHECK(!b.downsample->children()[1].second->is_training());
  b.train();
  CHECK(b.bn1->is_training());
}

// A copy would share the parameters (`Net ema = model;` would be the same model), so it does not
// compile; a move is fine, and an independent copy is another module plus load_state_dict.
static_assert(!std::is_copy_constructible_v<nn::Module> && !std::is_copy_assignable_v<nn::Module>);
static_assert(!std::is_copy_constructible_v<nn::Linear> && !std::is_copy_assignable_v<nn::Linear>);
static_assert(!std::is_copy_constructible_v<Net> && !std::is_copy_assignable_v<Net>);
static_assert(std::is_move_constructible_v<nn::Linear> && std::is_move_assignable_v<nn::Linear>);
static_assert(std::is_move_constructible_v<Net>);

TEST_CASE("modules: not copyable; moved or copied through state_dict, the parameters are right") {
  Net model;
  const Tensor w = model.fc->weight;
  Net moved = std::move(model);
  CHECK(moved.fc->weight.raw_data() == w.raw_data());  // the same parameters, now the moved-to's
  CHECK(moved.named_parameters().size() == 2);
  Net ema;  // the documented independent copy
  ema.load_state_dict(moved.state_dict());
  CHECK(ema.fc->weight.raw_data() != w.raw_data());
  CHECK(ema.fc->weight.values<float>() == w.values<float>());
  {
    NoGradGuard ng;
    moved.fc->weight.add_(ones_like(w));
  }
  CHECK(ema.fc->weight.values<float>() != moved.fc->weight.values<float>());
}

TEST_CASE("modules: state_dict round trip and strict errors list every problem") {
  Block a, b;
  CHECK(!allclose(a.conv1->weight, b.conv1->weight));
  b.load_state_dict(a.state_dict());
  CHECK(allclose(a.conv1->weight, b.conv1->weight, 0, 0));
  CHECK(allclose(a.downsample->children()[0].second->state_dict().at("weight"), b.downsample->state_dict().at("0.weight")));

  nn::StateDict sd = a.state_dict();
  sd.erase("bn1.bias");
  sd["extra.weight"] = zeros({1});
  sd["conv1.weight"] = zeros({4, 3, 1, 1});
  try {
    b.load_state_dict(sd);
    FAIL("expected an error");
  } catch (const kiln::Error& e) {
    const std::string m = e.what();
    CHECK(m.find("missing: bn1.bias") != std::string::npos);
    CHECK(m.find("unexpected: extra.weight") != std::string::npos);
    CHECK(m.find("conv1.weight (checkpoint [4,3,1,1], model [4,3,3,3])") != std::string::npos);
  }
  // Non-strict still refuses shape mismatches but tolerates missing and unexpected names.
  sd["conv1.weight"] = a.conv1->weight;
  b.load_state_dict(sd, false);
}

namespace {
// One tensor under two names (weight tying), a submodule under two names, and names taken twice.
struct Tied : nn::Module {
  Tensor w, v;
  Tied() {
    w = register_parameter("w", ones({2}));
    v = register_parameter("v", w);
  }
  std::string type_name() const override { return "Tied"; }
};
struct SharedChild : nn::Module {
  std::shared_ptr<nn::BatchNorm2d> a, b;
  SharedChild() {
    auto bn = std::make_shared<nn::BatchNorm2d>(2);
    a = register_module("a", bn);
    b = register_module("b", bn);
  }
  std::string type_name() const override { return "SharedChild"; }
};
struct Dup : nn::Module {
  // kind: the first registration; then "x" again as a parameter, buffer or submodule.
  Dup(const std::string& first, const std::string& second) {
    auto add = [this](const std::string& kind) {
      if (kind == "parameter") register_parameter("x", ones({2}));
      if (kind == "buffer") register_buffer("x", zeros({3}));
      if (kind == "submodule") register_module("x", std::make_shared<nn::Linear>(1, 1));
    };
    add(first);
    add(second);
  }
  std::string type_name() const override { return "Dup"; }
};
}  // namespace

TEST_CASE("modules: a tensor registered under two names is one tied parameter") {
  Tied m;
  CHECK(m.w.same(m.v));
  CHECK(names(m.named_parameters()) == std::vector<std::string>{"w"});
  CHECK(m.num_parameters() == 2);
  CHECK(m.state_dict().size() == 2);  // every name, as PyTorch's
  CHECK(m.state_dict().at("v").same(m.w));
  // One AdamW step with gradient 2 moves a single parameter by lr (two leaves moved twice: 0.8).
  optim::AdamW opt({optim::ParamGroup(m.parameters(), 0.1)});
  (sum(m.w * 1.0) + sum(m.v * 1.0)).backward();
  opt.step();
  for (double w : m.w.to_vector()) CHECK(w == doctest::Approx(0.9).epsilon(1e-6));
  // to() converts the tensor once, in place: still one tensor.
  m.to(DType::f64);
  CHECK(m.w.same(m.v));
  CHECK(m.v.dtype() == DType::f64);
  m.load_state_dict(m.state_dict());
}

TEST_CASE("modules: replace_parameter ties a layer's weight to another module's, parameters() and state_dict() agree") {
  struct Lm : nn::Module {
    std::shared_ptr<nn::Embedding> emb;
    std::shared_ptr<nn::Linear> out;
    Lm() {
      emb = register_module("emb", std::make_shared<nn::Embedding>(5, 3));
      out = register_module("out", std::make_shared<nn::Linear>(3, 5));
    }
    std::string type_name() const override { return "Lm"; }
  };
  Lm m;
  const Tensor old = m.out->weight;
  // The pitfall: `m.out->weight = m.emb->weight` alone left parameters() and state_dict() with `old`.
  m.out->replace_parameter("weight", m.out->weight, m.emb->weight);
  CHECK(m.out->weight.same(m.emb->weight));
  CHECK(names(m.named_parameters()) == std::vector<std::string>{"emb.weight", "out.bias"});  // the tie once
  CHECK(m.state_dict().at("out.weight").same(m.emb->weight));  // under each name, as PyTorch
  for (const Tensor& p : m.parameters()) CHECK(!p.same(old));
  // One optimizer step moves the tied tensor, which forward uses.
  optim::SGD opt({optim::ParamGroup(m.parameters(), 0.1)});
  const Tensor before = m.emb->weight.clone();
  sum((*m.out)((*m.emb)(from_vector({1, 2}, {2}, DType::i64)))).backward();
  opt.step();
  CHECK(amax(abs(m.emb->weight - before)).item<double>() > 0);
  // A member that holds the new tensor already is refused: it could be another module's (here the
  // embedding's own, which would leave lin.weight, which forward reads, untied).
  nn::Linear lin(3, 5);
  CHECK(contains(error_of([&] { lin.replace_parameter("weight", m.emb->weight, m.emb->weight); }),
                 "the member passed for 'weight' does not hold the registered tensor"));
  lin.weight = m.emb->weight;  // the trap, assigned already: refused too, saying how to undo it
  CHECK(contains(error_of([&] { lin.replace_parameter("weight", lin.weight, m.emb->weight); }),
                 "assign the registered tensor back first"));
  // Refused, naming what was wrong.
  nn::Linear other(3, 5);
  CHECK(contains(error_of([&] { other.replace_parameter("w", other.weight, m.emb->weight); }),
                 "this module has no parameter 'w' (its parameters: weight, bias"));
  CHECK(contains(error_of([&] { other.replace_parameter("weight", other.bias, m.emb->weight); }),
                 "the member passed for 'weight' does not hold the registered tensor (f32 cpu [5,3])"));
  CHECK(contains(error_of([&] {
                   other.replace_parameter("weight", other.weight, ones({3, 5}));
                 }),
                 "'weight' is f32 cpu [5,3], the tensor for it is f32 cpu [3,5]"));
  CHECK(contains(error_of([&] { other.replace_parameter("weight", other.weight, m.emb->weight * 2.0); }),
                 "must be replaced by a leaf tensor"));
  CHECK(names(other.named_parameters()) == std::vector<std::string>{"weight", "bias"});
}

TEST_CASE("modules: register_parameter keeps the caller's leaf; a tensor made by an op is detached") {
  struct Keep : nn::Module {
    Tensor mine = randn({2}), made;
    Keep() { register_parameter("mine", mine); }
    void add_made(const Tensor& leaf) { made = register_parameter("made", leaf * 2.0); }
    std::string type_name() const override { return "Keep"; }
  };
  Keep k;
  CHECK(k.mine.requires_grad());  // the handle is the parameter (it stayed requires_grad=0)
  CHECK(k.named_parameters()[0].second.same(k.mine));
  Tensor leaf = ones({2}).set_requires_grad();
  k.add_made(leaf);
  CHECK(k.made.is_leaf());
  CHECK(k.made.requires_grad());
  CHECK(!k.made.same(leaf));
}

TEST_CASE("modules: a submodule registered twice lists its tensors once, state_dict every name") {
  SharedChild m;
  CHECK(names(m.named_parameters()) == std::vector<std::string>{"a.weight", "a.bias"});
  CHECK(names(m.named_buffers()) ==
        std::vector<std::string>{"a.running_mean", "a.running_var", "a.num_batches_tracked"});
  CHECK(m.num_parameters() == 4);
  CHECK(m.parameters().size() == 2);
  CHECK(m.state_dict().size() == 10);
  optim::SGD opt({optim::ParamGroup(m.parameters(), 0.1)});  // was: "parameter 2 of group 0 is also parameter 0"
  m.load_state_dict(m.state_dict());
}

TEST_CASE("modules: a name taken by a parameter, buffer or submodule of the module is refused") {
  for (const char* first : {"parameter", "buffer", "submodule"})
    for (const char* second : {"parameter", "buffer", "submodule"}) {
      const std::string e = error_of([&] { Dup d(first, second); });
      CHECK_MESSAGE(contains(e, std::string("register_") + (std::strcmp(second, "submodule") ? second : "module") +
                                    ": the name 'x' is already taken by a " + first + " of this module"),
                    e);
    }
}

TEST_CASE("modules: layers compute what their ops do") {
  nn::Linear lin(3, 2);
  const Tensor x = randn({5, 3});
  CHECK(allclose(lin(x), matmul(x, lin.weight.t()) + lin.bias, 1e-6, 1e-6));
  CHECK_THROWS_WITH_AS(lin(randn({5, 4})), doctest::Contains("[5,4]"), kiln::Error);
  nn::Sequential seq({std::make_shared<nn::Linear>(3, 4), std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(4, 1)});
  CHECK(seq(x).shape() == Shape{5, 1});
  CHECK(names(seq.named_parameters())[2] == "2.weight");

  nn::BatchNorm2d bn(2);
  const Tensor img = randn({4, 2, 3, 3});
  bn(img);
  CHECK(bn.num_batches_tracked.item<int64_t>() == 1);
  CHECK(!allclose(bn.running_mean, zeros({2})));
  bn.eval();
  const Tensor before = bn.running_mean.clone();
  bn(img);
  CHECK(allclose(bn.running_mean, before, 0, 0));

  nn::Embedding emb(10, 4, 0);
  CHECK(amax(abs(emb.weight.select(0, 0))).item<double>() == 0.0);
  nn::Dropout drop(0.5);
  drop.eval();
  CHECK(allclose(drop(x), x, 0, 0));

  nn::MultiheadSelfAttention mha(8, 2);
  const Tensor h = randn({2, 5, 8});
  const Tensor keep = from_vector({1, 1, 1, 0, 0, 1, 1, 1, 1, 1}, {2, 5}, TensorOptions(DType::i64));
  const Tensor out = mha.forward(h, nn::additive_padding_mask(keep));
  CHECK(out.shape() == Shape{2, 5, 8});
  // Changing a padded position of sample 0 does not change sample 0's outputs at kept positions.
  Tensor h2 = h.clone();
  h2.select(0, 0).select(0, 4).fill_(7.0);
  const Tensor out2 = mha.forward(h2, nn::additive_padding_mask(keep));
  CHECK(allclose(out.select(0, 0).narrow(0, 0, 3), out2.select(0, 0).narrow(0, 0, 3), 1e-5, 1e-6));
}

TEST_CASE("init: kaiming, xavier, normal, trunc_normal have the right spread") {
  Tensor w = empty({256, 128, 3, 3});
  nn::init::kaiming_normal_(w, 0.0, nn::init::FanMode::fan_out, "relu");
  const double want = std::sqrt(2.0 / (256 * 9));
  CHECK(std::sqrt(var(w).item<double>()) == doctest::Approx(want).epsilon(0.02));
  nn::init::kaiming_uniform_(w, 0.0, nn::init::FanMode::fan_in, "relu");
  const double bound = std::sqrt(3.0) * std::sqrt(2.0 / (128 * 9));
  CHECK(amax(abs(w)).item<double>() <= bound);
  CHECK(amax(abs(w)).item<double>() > 0.99 * bound);
  Tensor x = empty({400, 600});
  nn::init::xavier_uniform_(x);
  CHECK(amax(abs(x)).item<double>() <= std::sqrt(6.0 / 1000));
  nn::init::xavier_normal_(x);
  CHECK(std::sqrt(var(x).item<double>()) == doctest::Approx(std::sqrt(2.0 / 1000)).epsilon(0.02));
  Tensor t = empty({100000});
  nn::init::trunc_normal_(t, 0.0, 0.02, -0.04, 0.04);
  CHECK(amax(abs(t)).item<double>() <= 0.04);
  // A normal truncated at 2 sigma has std 0.8796 sigma.
  CHECK(std::sqrt(var(t).item<double>()) == doctest::Approx(0.02 * 0.8796).epsilon(0.02));
  CHECK_THROWS_AS(nn::init::kaiming_normal_(t), kiln::Error);  // 1-D: no fan
}

TEST_CASE("optim: SGD with momentum, dampening, nesterov and weight decay, by hand") {
  Tensor p = param({1.0, -2.0});
  optim::SGD opt({{{p}, 0.1, 0.01}}, {0.9, 0.0, true});
  // step 1: g = [0.5, 1]; d = g + wd p = [0.51, 0.98]; buf = d; nesterov d' = d + 0.9 buf = 1.9 d
  p.set_grad(from_vector({0.5, 1.0}, {2}));
  opt.step();
  std::vector<double> v = p.to_vector();
  CHECK(v[0] == doctest::Approx(1.0 - 0.1 * 1.9 * 0.51));
  CHECK(v[1] == doctest::Approx(-2.0 - 0.1 * 1.9 * 0.98));
  // step 2: g = [0, 0]; d = wd p; buf = 0.9 buf + d; d' = d + 0.9 buf
  const double p0 = v[0], b0 = 0.51;
  p.set_grad(zeros({2}));
  opt.step();
  const double d = 0.01 * p0, buf = 0.9 * b0 + d;
  CHECK(p.to_vector()[0] == doctest::Approx(p0 - 0.1 * (d + 0.9 * buf)));

  Tensor q = param({1.0});
  optim::SGD damp({{{q}, 1.0, 0.0}}, {0.5, 0.5, false});
  q.set_grad(from_vector({2.0}, {1}));
  damp.step();  // buf = g = 2 (first step ignores dampening)
  q.set_grad(from_vector({2.0}, {1}));
  damp.step();  // buf = 0.5*2 + 0.5*2 = 2
  CHECK(q.item<double>() == doctest::Approx(1.0 - 2.0 - 2.0));
  CHECK_THROWS_AS(optim::SGD({{{q}, 1.0, 0.0}}, {0.0, 0.0, true}), kiln::Error);
}

TEST_CASE("optim: AdamW by hand") {
  Tensor p = param({0.5});
  optim::AdamW opt({{{p}, 0.01, 0.1}}, {0.9, 0.999, 1e-8});
  double w = 0.5, m = 0, v = 0;
  const double gs[3] = {0.2, -0.1, 0.4};
  for (int t = 1; t <= 3; ++t) {
    p.set_grad(from_vector({gs[t - 1]}, {1}));
    opt.step();
    m = 0.9 * m + 0.1 * gs[t - 1];
    v = 0.999 * v + 0.001 * gs[t - 1] * gs[t - 1];
    w *= 1 - 0.01 * 0.1;
    w -= 0.01 * (m / (1 - std::pow(0.9, t))) / (std::sqrt(v / (1 - std::pow(0.999, t))) + 1e-8);
    CHECK(p.item<double>() == doctest::Approx(w).epsilon(1e-6));
  }
  // State round trip into a fresh optimizer continues identically.
  Tensor p2 = param({p.item<double>()});
  optim::AdamW opt2({{{p2}, 0.01, 0.1}}, {0.9, 0.999, 1e-8});
  opt2.load_state(opt.state());
  CHECK(opt2.steps() == 3);
  p.set_grad(from_vector({0.3}, {1}));
  p2.set_grad(from_vector({0.3}, {1}));
  opt.step();
  opt2.step();
  CHECK(p.item<double>() == p2.item<double>());
  optim::SGD sgd({{{p2}, 0.1, 0.0}}, {0.9});
  CHECK_THROWS_AS(sgd.load_state(opt.state()), kiln::Error);
}

TEST_CASE("optim: RMSprop by hand (momentum, centered, L2 weight decay), torch's single-tensor rule") {
  const double gs[4][2] = {{0.5, -1.0}, {0.2, 0.3}, {-0.4, 0.1}, {0.0, -0.6}};
  for (const double momentum : {0.0, 0.9})
    for (const bool centered : {false, true}) {
      CAPTURE(momentum);
      CAPTURE(centered);
      Tensor p = param({1.0, -2.0});
      optim::RMSprop opt({{{p}, 0.01, 0.1}}, {0.9, 1e-6, momentum, centered});
      double w[2] = {1.0, -2.0}, sq[2] = {0, 0}, ga[2] = {0, 0}, buf[2] = {0, 0};
      for (int t = 0; t < 4; ++t) {
        p.set_grad(from_vector({gs[t][0], gs[t][1]}, {2}));
        opt.step();
        for (int k = 0; k < 2; ++k) {
          const double g = gs[t][k] + 0.1 * w[k];
          sq[k] = 0.9 * sq[k] + 0.1 * g * g;
          ga[k] = ga[k] + 0.1 * (g - ga[k]);
          const double avg = std::sqrt(centered ? sq[k] - ga[k] * ga[k] : sq[k]) + 1e-6;
          buf[k] = momentum * buf[k] + g / avg;
          w[k] -= 0.01 * (momentum > 0 ? buf[k] : g / avg);
          CHECK(p.to_vector()[size_t(k)] == doctest::Approx(w[k]).epsilon(1e-5));
        }
      }
      CHECK(opt.steps(0, 0) == 4);  // torch's state['step']
      std::set<std::string> names;
      for (const auto& [k, t] : opt.state().tensors) names.insert(k);
      std::set<std::string> want = {"0.0.square_avg"};
      if (momentum > 0) want.insert("0.0.momentum_buffer");
      if (centered) want.insert("0.0.grad_avg");
      CHECK(names == want);
    }
  Tensor q = param({1.0});
  CHECK(contains(error_of([&] {
                   optim::RMSprop({{{q}, 0.01, 0.0}}, {-0.5});
                 }),
                 "alpha must be finite and >= 0, got -0.5"));
  CHECK(contains(error_of([&] {
                   optim::RMSprop({{{q}, 0.01, 0.0}}, {0.99, 1e-8, -1});
                 }),
                 "momentum must be finite and >= 0, got -1"));
}

TEST_CASE("optim: Adagrad by hand (lr_decay, initial accumulator, L2 weight decay), torch's single-tensor rule") {
  const double gs[4][2] = {{0.5, -1.0}, {0.2, 0.3}, {-0.4, 0.1}, {0.0, -0.6}};
  for (const double lr_decay : {0.0, 0.5})
    for (const double init : {0.0, 0.3}) {
      CAPTURE(lr_decay);
      CAPTURE(init);
      Tensor p = param({1.0, -2.0});
      optim::Adagrad opt({{{p}, 0.1, 0.05}}, {lr_decay, 1e-10, init});
      double w[2] = {1.0, -2.0}, acc[2] = {init, init};
      for (int t = 1; t <= 4; ++t) {
        p.set_grad(from_vector({gs[t - 1][0], gs[t - 1][1]}, {2}));
        opt.step();
        const double clr = 0.1 / (1 + (t - 1) * lr_decay);
        for (int k = 0; k < 2; ++k) {
          const double g = gs[t - 1][k] + 0.05 * w[k];
          acc[k] += g * g;
          w[k] -= clr * g / (std::sqrt(acc[k]) + 1e-10);
          CHECK(p.to_vector()[size_t(k)] == doctest::Approx(w[k]).epsilon(1e-5));
        }
      }
      CHECK(opt.steps(0, 0) == 4);
    }
  Tensor q = param({1.0});
  CHECK(contains(error_of([&] {
                   optim::Adagrad({{{q}, 0.01, 0.0}}, {0.0, 1e-10, -1});
                 }),
                 "initial_accumulator_value must be finite and >= 0, got -1"));
}

TEST_CASE(
    "optim: RMSprop and Adagrad state() / load_state() resume exactly, and a parameter's late first step counts "
    "alone") {
  auto make = [](const std::string& which) {
    Generator g(3);
    std::vector<Tensor> ps = {randn({5, 3}, DType::f32, &g).set_requires_grad(),
                              randn({4}, DType::f32, &g).set_requires_grad()};
    std::vector<optim::ParamGroup> groups = {{{ps[0]}, 0.02, 0.01}, {{ps[1]}, 0.05, 0.0}};
    std::unique_ptr<optim::Optimizer> opt;
    if (which == "rmsprop") opt = std::make_unique<optim::RMSprop>(groups, optim::RmspropOptions{0.9, 1e-8, 0.5, true});
    if (which == "adagrad") opt = std::make_unique<optim::Adagrad>(groups, optim::AdagradOptions{0.1, 1e-10, 0.2});
    return std::make_tuple(std::move(opt), ps);
  };
  for (const char* which : {"rmsprop", "adagrad"}) {
    CAPTURE(which);
    auto [a, pa] = make(which);
    auto [b, pb] = make(which);
    Generator g(11);
    std::vector<std::vector<Tensor>> grads;
    for (int s = 0; s < 6; ++s) grads.push_back({randn({5, 3}, DType::f32, &g), randn({4}, DType::f32, &g)});
    for (int s = 0; s < 3; ++s) {
      pa[0].set_grad(grads[size_t(s)][0]);
      if (s > 0) pa[1].set_grad(grads[size_t(s)][1]);  // its first gradient at the second step
      a->step();
    }
    CHECK(a->steps(0, 0) == 3);
    CHECK(a->steps(1, 0) == 2);
    {
      NoGradGuard ng;
      for (size_t k = 0; k < 2; ++k) pb[k].copy_(pa[k]);
    }
    b->load_state(a->state());
    CHECK(b->steps(1, 0) == 2);
    for (int s = 3; s < 6; ++s) {
      for (size_t k = 0; k < 2; ++k) {
        pa[k].set_grad(grads[size_t(s)][k]);
        pb[k].set_grad(grads[size_t(s)][k]);
      }
      a->step();
      b->step();
    }
    for (size_t k = 0; k < 2; ++k) CHECK(pa[k].to_vector() == pb[k].to_vector());
    const optim::OptimizerState sa = a->state(), sb = b->state();
    for (const auto& [k, t] : sa.tensors) CHECK(t.to_vector() == sb.tensors.at(k).to_vector());
    CHECK(sa.scalars == sb.scalars);
    // another optimizer's state is refused
    optim::SGD sgd({{{pb[0]}, 0.1, 0.0}, {{pb[1]}, 0.1, 0.0}}, {0.9});
    CHECK_THROWS_AS(sgd.load_state(a->state()), kiln::Error);
  }
}

TEST_CASE("optim: load_state with an empty first group, and with no parameters at all") {
  // A hand-made group list may lead with an empty group: the restored step count still goes to the
  // parameters' device, and the restored optimizer continues as the saved one does.
  Tensor p = param({0.5});
  optim::SGD a({optim::ParamGroup({}, 0.1), optim::ParamGroup({p}, 0.1)}, {0.9});
  for (double g : {0.2, -0.4}) {
    p.set_grad(from_vector({g}, {1}));
    a.step();
  }
  Tensor q = param({p.item<double>()});
  optim::SGD b({optim::ParamGroup({}, 0.1), optim::ParamGroup({q}, 0.1)}, {0.9});
  b.load_state(a.state());
  CHECK(b.steps() == 2);
  p.set_grad(from_vector({0.3}, {1}));
  q.set_grad(from_vector({0.3}, {1}));
  a.step();
  b.step();
  CHECK(p.item<double>() == q.item<double>());
  // No parameters anywhere: a step updates nothing and is not counted (as torch, whose state has no
  // step for a parameter that never had a gradient); the count alone round-trips, on the CPU.
  optim::SGD none({optim::ParamGroup({}, 0.1)});
  none.step();
  CHECK(none.steps() == 0);
  optim::SGD none2({optim::ParamGroup({}, 0.1)});
  optim::OptimizerState counted = none.state();
  counted.scalars["steps"] = 4;
  none2.load_state(counted);
  CHECK(none2.steps() == 4);
  none2.step();
  CHECK(none2.steps() == 4);
}

TEST_CASE("optim: load_state refuses integer state, bad names and counts, and widens a half-precision state") {
  Tensor p = param({0.5, -1.0});
  optim::SGD a({optim::ParamGroup({p}, 0.1)}, {0.9});
  p.set_grad(from_vector({0.2, 0.4}, {2}));
  a.step();
  const optim::OptimizerState good = a.state();
  REQUIRE(good.tensors.size() == 1);
  const std::string key = good.tensors.begin()->first;  // "0.0.<slot>"
  const Tensor buf = good.tensors.begin()->second;
  optim::SGD b({optim::ParamGroup({param({0.0, 0.0})}, 0.1)}, {0.9});
  auto with = [&](const std::string& k, const Tensor& t) {
    optim::OptimizerState s = good;
    s.tensors.clear();
    s.tensors[k] = t;
    return s;
  };
  CHECK(
      contains(error_of([&] { b.load_state(with(key, buf.to(DType::i64))); }), "is i64 cpu [2]; the optimizer keeps"));
  for (const char* bad : {"x.0.momentum_buffer", "0.-1.momentum_buffer", "0", "0.99999999999999999999.m"})
    CHECK_MESSAGE(contains(error_of([&] { b.load_state(with(bad, buf)); }), "bad optimizer state name"), bad);
  optim::OptimizerState neg = good;
  neg.scalars["steps"] = -1;
  CHECK(contains(error_of([&] { b.load_state(neg); }), "step count -1 is not a whole number >= 0"));
  // A bf16 copy of the state loads as f32 (the slots' type) and the next step uses it.
  b.load_state(with(key, buf.to(DType::bf16)));
  CHECK(b.state().tensors.at(key).dtype() == DType::f32);
  CHECK(allclose(b.state().tensors.at(key), buf.to(DType::bf16).to(DType::f32), 0, 0));
}

TEST_CASE("optim: load_state checks and restores each group's lr and weight decay, and refuses unknown slots") {
  Tensor p = param({1.0, 1.0, 1.0});
  optim::AdamW a({optim::ParamGroup({p}, 0.1, 0.01)});
  p.set_grad(from_vector({2.0, 2.0, 2.0}, {3}));
  a.step();
  const optim::OptimizerState good = a.state();
  // Held to the constructor's checks, and a refused state changes nothing.
  optim::AdamW b({optim::ParamGroup({param({0.0, 0.0, 0.0})}, 0.1)});
  for (double bad : {std::nan(""), -1.0, double(INFINITY)}) {
    optim::OptimizerState s = good;
    s.scalars["group0.weight_decay"] = bad;
    const std::string e = error_of([&] { b.load_state(s); });
    CHECK_MESSAGE(contains(e, "adamw: optimizer state's group0.weight_decay must be finite and >= 0"), e);
  }
  // a negative lr is kept (a schedule's last, which no step used, as torch saves it); step() refuses it
  for (double bad : {std::nan(""), double(INFINITY)}) {
    optim::OptimizerState s = good;
    s.scalars["group0.lr"] = bad;
    const std::string e = error_of([&] { b.load_state(s); });
    CHECK_MESSAGE(contains(e, "adamw: optimizer state's group0.lr must be finite, got"), e);
  }
  CHECK(b.steps() == 0);
  CHECK(b.groups()[0].lr == 0.1);
  // The weight decay state() saves comes back.
  optim::AdamW c({optim::ParamGroup({param({0.0, 0.0, 0.0})}, 0.5, 0.5)});
  c.load_state(good);
  CHECK(c.groups()[0].lr == 0.1);
  CHECK(c.groups()[0].weight_decay == 0.01);
  // A slot this optimizer does not keep (a misspelt moment would restart from zero).
  optim::OptimizerState typo = good;
  typo.tensors["0.0.exp_avgX"] = typo.tensors.at("0.0.exp_avg");
  typo.tensors.erase("0.0.exp_avg");
  CHECK(contains(error_of([&] { c.load_state(typo); }),
                 "adamw: optimizer state '0.0.exp_avgX' names a slot 'exp_avgX' this optimizer does not keep (it "
                 "keeps 'exp_avg', 'exp_avg_sq')"));
  // A momentum buffer in a state whose momentum is 0 loads and is kept, as torch's: a run whose
  // momentum (or one group's) was set to 0 after it had buffers saves them, and must resume.
  optim::SGD plain({optim::ParamGroup({param({0.0, 0.0, 0.0})}, 0.1)});
  optim::SGD heavy({optim::ParamGroup({p}, 0.1)}, {0.9});
  heavy.step();
  heavy.groups()[0].options["momentum"] = 0.0;
  heavy.step();
  const optim::OptimizerState no_momentum = heavy.state();
  CHECK(no_momentum.scalars.at("group0.momentum") == 0.0);
  plain.load_state(no_momentum);
  CHECK(plain.state().tensors.count("0.0.momentum_buffer") == 1);
  heavy.load_state(no_momentum);  // its own state, which it refused before
  CHECK(heavy.group_hyper(0).at("momentum") == 0.0);
}

TEST_CASE("optim: f64 parameters update and keep their state in f64, as PyTorch") {
  // An f64 parameter's step ran in f32: one SGD step of lr 0.01 from 1 with gradient 0.1 gave
  // 0.99900001287 (0.999 rounded to f32) instead of 0.999.
  const auto f64param = [](std::vector<double> v) {
    return from_vector(v, {int64_t(v.size())}, DType::f64).set_requires_grad();
  };
  Tensor p = f64param({1.0, 2.0, 3.0});
  optim::SGD plain({{{p}, 0.01, 0.0}});
  p.set_grad(from_vector({0.1, 0.2, 0.3}, {3}, DType::f64));
  plain.step();
  CHECK(p.to_vector() == std::vector<double>{1.0 - 0.01 * 0.1, 2.0 - 0.01 * 0.2, 3.0 - 0.01 * 0.3});
  // Momentum, nesterov and weight decay over three steps, against the same arithmetic in double.
  Tensor q = f64param({0.7});
  optim::SGD mom({{{q}, 0.1, 0.01}}, {0.9, 0.0, true});
  double w = 0.7, buf = 0;
  const double gs[3] = {0.3, -0.2, 0.45};
  for (int t = 0; t < 3; ++t) {
    q.set_grad(from_vector({gs[t]}, {1}, DType::f64));
    mom.step();
    const double d = gs[t] + w * 0.01;
    buf = t == 0 ? d : buf * 0.9 + d * (1.0 - 0.0);
    w = w - (d + buf * 0.9) * 0.1;
    CHECK(q.item<double>() == doctest::Approx(w).epsilon(1e-14));
  }
  CHECK(mom.state().tensors.begin()->second.dtype() == DType::f64);
  // AdamW: the same recurrences in double.
  Tensor r = f64param({0.5});
  optim::AdamW adam({{{r}, 0.01, 0.1}}, {0.9, 0.999, 1e-8});
  double wa = 0.5, m = 0, v = 0;
  for (int t = 1; t <= 3; ++t) {
    r.set_grad(from_vector({gs[t - 1]}, {1}, DType::f64));
    adam.step();
    m = 0.9 * m + 0.1 * gs[t - 1];
    v = 0.999 * v + 0.001 * gs[t - 1] * gs[t - 1];
    wa *= 1 - 0.01 * 0.1;
    wa -= 0.01 / (1 - std::pow(0.9, t)) * (m / (std::sqrt(v / (1 - std::pow(0.999, t))) + 1e-8));
    CHECK(r.item<double>() == doctest::Approx(wa).epsilon(1e-13));
  }
  for (const auto& [k, s] : adam.state().tensors) CHECK_MESSAGE(s.dtype() == DType::f64, k);
  // LAMB's first step: u = g / (|g| + eps) per element, trust = ||w|| / ||u||.
  Tensor l = f64param({3.0, 4.0});
  optim::LAMB lamb({{{l}, 0.1, 0.0}}, {0.9, 0.999, 1e-6});
  l.set_grad(from_vector({1.0, -1.0}, {2}, DType::f64));
  lamb.step();
  const double u = 1.0 / (1.0 + 1e-6), trust = 5.0 / (std::sqrt(2.0) * u);
  CHECK(l.to_vector()[0] == doctest::Approx(3.0 - 0.1 * trust * u).epsilon(1e-14));
  CHECK(l.to_vector()[1] == doctest::Approx(4.0 + 0.1 * trust * u).epsilon(1e-14));
}

TEST_CASE("optim: AdamW and LAMB count steps per parameter, as torch's state['step']") {
  // b gets its first gradient at the second step (an unused branch, a layer unfrozen later), and a
  // step without any gradient comes between: b's first update is a first step's (bias corrections
  // of t = 1), a's second a second step's. One count for the optimizer gave b 0.92558634 (t = 2).
  for (const bool fused : {true, false})
    for (const bool lamb : {false, true}) {
      CAPTURE(fused);
      CAPTURE(lamb);
      Tensor a = param({1.0}), b = param({1.0});
      std::unique_ptr<optim::Optimizer> o;
      if (lamb)
        o = std::make_unique<optim::LAMB>(std::vector<optim::ParamGroup>{optim::ParamGroup({a, b}, 0.1)});
      else
        o = std::make_unique<optim::AdamW>(std::vector<optim::ParamGroup>{optim::ParamGroup({a, b}, 0.1)});
      o->use_fused = fused;
      a.set_grad(from_vector({1.0}, {1}));
      o->step();
      o->zero_grad();
      o->step();  // no gradient anywhere: nothing moves, nothing counts
      CHECK(o->steps() == 1);
      CHECK(o->steps(0, 0) == 1);
      CHECK(o->steps(0, 1) == 0);
      // A skipped step (the loss scaler's flag) counts for nobody.
      a.set_grad(from_vector({1.0}, {1}));
      b.set_grad(from_vector({1.0}, {1}));
      o->step(from_vector({1.0}, {1}));
      CHECK(o->steps(0, 0) == 1);
      CHECK(o->steps(0, 1) == 0);
      CHECK(b.item<double>() == 1.0);
      o->step();
      CHECK(o->steps() == 2);
      CHECK(o->steps(0, 0) == 2);
      CHECK(o->steps(0, 1) == 1);
      // Equal gradients: m_hat / sqrt(v_hat) is 1 at every t when the bias corrections match t, so
      // a moves by lr twice and b once (LAMB: times the trust ratio |w| / |u| = |w|).
      CHECK(b.item<double>() == doctest::Approx(0.9).epsilon(1e-6));
      CHECK(a.item<double>() == doctest::Approx(lamb ? 0.81 : 0.8).epsilon(1e-6));
    }
}

TEST_CASE(
    "optim: per-parameter step counts round-trip; a state without them gives 'steps' to each parameter with state") {
  Tensor a = param({1.0, 2.0}), b = param({-1.0}), c = param({3.0});
  optim::AdamW o({optim::ParamGroup({a, b}, 0.1, 0.01), optim::ParamGroup({c}, 0.05)});
  a.set_grad(from_vector({0.5, -0.5}, {2}));
  o.step();
  b.set_grad(from_vector({0.3}, {1}));
  o.step();
  const optim::OptimizerState st = o.state();
  CHECK(st.scalars.at("steps") == 2);
  CHECK(st.scalars.at("0.1.step") == 1);  // b: one step behind
  CHECK(!st.scalars.count("0.0.step"));   // a: as "steps"
  CHECK(!st.scalars.count("1.0.step"));   // c: no state, 0
  CHECK(st.scalars.at("group0.params") == 2);
  CHECK(st.scalars.at("group1.params") == 1);
  const auto copy = [](const Tensor& t) { return from_vector(t.to_vector(), t.shape()).set_requires_grad(); };
  Tensor a2 = copy(a), b2 = copy(b), c2 = copy(c);
  optim::AdamW o2({optim::ParamGroup({a2, b2}, 0.1, 0.01), optim::ParamGroup({c2}, 0.05)});
  o2.load_state(st);
  CHECK(o2.steps(0, 0) == 2);
  CHECK(o2.steps(0, 1) == 1);
  CHECK(o2.steps(1, 0) == 0);
  for (Tensor* t : {&a, &b, &c, &a2, &b2, &c2}) t->set_grad(full_like(*t, 0.25));
  o.step();
  o2.step();
  CHECK(a.to_vector() == a2.to_vector());
  CHECK(b.to_vector() == b2.to_vector());
  CHECK(c.to_vector() == c2.to_vector());
  // A state written before the per-parameter counts (and the groups' sizes) were saved: every
  // parameter with state resumes at "steps" (what the one count gave it), one without at 0.
  optim::OptimizerState old = st;
  old.scalars.erase("0.1.step");
  old.scalars.erase("group0.params");
  old.scalars.erase("group1.params");
  Tensor a3 = param({1.0, 2.0}), b3 = param({-1.0}), c3 = param({3.0});
  optim::AdamW o3({optim::ParamGroup({a3, b3}, 0.1, 0.01), optim::ParamGroup({c3}, 0.05)});
  o3.load_state(old);
  CHECK(o3.steps() == 2);
  CHECK(o3.steps(0, 0) == 2);
  CHECK(o3.steps(0, 1) == 2);
  CHECK(o3.steps(1, 0) == 0);
  CHECK(o3.state().scalars.count("1.0.step") == 0);
  // Bad per-parameter counts are named.
  optim::OptimizerState bad = st;
  bad.scalars["0.7.step"] = 1;
  CHECK(contains(error_of([&] { o3.load_state(bad); }), "optimizer state '0.7.step' names a parameter"));
  bad = st;
  bad.scalars["0.1.step"] = -1;
  CHECK(contains(error_of([&] { o3.load_state(bad); }), "0.1.step -1 is not a whole number >= 0"));
  bad = st;
  bad.scalars["0.x.step"] = 1;
  CHECK(contains(error_of([&] { o3.load_state(bad); }), "bad optimizer state scalar '0.x.step'"));
}

TEST_CASE("optim: load_state refuses other groups or group sizes and restores the hyper-parameters, as torch") {
  Tensor p = param({1.0});
  optim::SGD one({optim::ParamGroup({p}, 0.1)}, {0.9});
  p.set_grad(from_vector({1.0}, {1}));
  one.step();
  // A 1-parameter state into a 2-parameter optimizer loaded and left the second without momentum.
  optim::SGD two({optim::ParamGroup({param({1.0}), param({2.0})}, 0.1)}, {0.9});
  CHECK(contains(error_of([&] { two.load_state(one.state()); }),
                 "sgd: optimizer state's group 0 has 1 parameter, this optimizer's group 0 has 2"));
  // Two groups into one: group1.lr was dropped.
  optim::SGD grouped({optim::ParamGroup({param({1.0})}, 0.1), optim::ParamGroup({param({1.0})}, 0.01)}, {0.9});
  optim::SGD single({optim::ParamGroup({param({1.0})}, 0.1)}, {0.9});
  CHECK(contains(error_of([&] { single.load_state(grouped.state()); }),
                 "sgd: optimizer state has 2 parameter groups, this optimizer has 1"));
  CHECK(contains(error_of([&] { grouped.load_state(single.state()); }),
                 "sgd: optimizer state has 1 parameter group, this optimizer has 2"));
  // Momentum 0.5 saved, 0.9 constructed: the loaded optimizer continues as the saved one.
  Tensor q = param({1.0}), r = param({1.0});
  optim::SGD saved({optim::ParamGroup({q}, 0.1)}, {0.5});
  q.set_grad(from_vector({1.0}, {1}));
  saved.step();
  optim::SGD loaded({optim::ParamGroup({r}, 0.1)}, {0.9, 0.0, true});
  {
    NoGradGuard ng;
    r.copy_(q.detach());
  }
  loaded.load_state(saved.state());
  CHECK(loaded.state().scalars.at("momentum") == 0.5);
  CHECK(loaded.state().scalars.at("nesterov") == 0);
  q.set_grad(from_vector({0.5}, {1}));
  r.set_grad(from_vector({0.5}, {1}));
  saved.step();
  loaded.step();
  CHECK(q.item<double>() == r.item<double>());
  // Checked as the constructor checks them; a refused state changes nothing.
  optim::OptimizerState bad = saved.state();
  bad.scalars["nesterov"] = 1;
  bad.scalars["dampening"] = 0.5;
  bad.scalars["group0.lr"] = 0.7;
  CHECK(contains(error_of([&] { loaded.load_state(bad); }), "nesterov needs momentum > 0 and no dampening"));
  CHECK(loaded.groups()[0].lr == 0.1);
  CHECK(loaded.state().scalars.at("nesterov") == 0);
  // AdamW's betas and eps.
  Tensor u = param({1.0}), v = param({1.0});
  optim::AdamW au({optim::ParamGroup({u}, 0.1)}, {0.8, 0.99, 1e-6});
  optim::AdamW av({optim::ParamGroup({v}, 0.1)});
  u.set_grad(from_vector({0.3}, {1}));
  au.step();
  {
    NoGradGuard ng;
    v.copy_(u.detach());
  }
  av.load_state(au.state());
  const optim::OptimizerState avs = av.state();
  CHECK(avs.scalars.at("beta1") == 0.8);
  CHECK(avs.scalars.at("beta2") == 0.99);
  CHECK(avs.scalars.at("eps") == 1e-6);
  u.set_grad(from_vector({-0.2}, {1}));
  v.set_grad(from_vector({-0.2}, {1}));
  au.step();
  av.step();
  CHECK(u.item<double>() == v.item<double>());
  bad = au.state();
  bad.scalars["beta1"] = 1.0;
  CHECK(contains(error_of([&] { av.load_state(bad); }), "adamw: optimizer state's betas must be in [0, 1)"));
}

TEST_CASE("optim: a gradient of another dtype than its parameter is refused, naming it; zero_grad in place") {
  Tensor a = param({1.0}), b = param({1.0});
  optim::SGD o({optim::ParamGroup({a, b}, 0.1)});
  a.set_grad(from_vector({1.0}, {1}));
  b.set_grad(from_vector({1.0}, {1}, DType::f64));
  CHECK(contains(
      error_of([&] { o.step(); }),
      "sgd: parameter 1 of group 0 (f32 cpu [1]) has a f64 gradient; a gradient must have its parameter's dtype"));
  CHECK(a.item<double>() == 1.0);  // checked before anything moved
  b.set_grad(from_vector({2.0}, {1}));
  const Tensor ga = a.grad();
  o.zero_grad(/*set_to_none=*/false);
  REQUIRE(a.grad().defined());
  CHECK(a.grad().same(ga));
  CHECK(a.grad().to_vector() == std::vector<double>{0.0});
  CHECK(b.grad().to_vector() == std::vector<double>{0.0});
  o.zero_grad();
  CHECK(!a.grad().defined());
  // The parameter lists stay as made (the per-parameter counts are laid out by them): a parameter
  // pushed into groups() afterwards is refused, not written past the end of the counts.
  Tensor c = param({1.0});
  c.set_grad(from_vector({1.0}, {1}));
  optim::AdamW adam({optim::ParamGroup({a}, 0.1)});
  adam.groups()[0].params.push_back(c);
  CHECK(contains(error_of([&] { adam.step(); }), "adamw: group 0 has 2 parameters, made with 1"));
  adam.groups().push_back(optim::ParamGroup({c}, 0.1));
  CHECK(contains(error_of([&] { adam.step(); }), "2 parameter groups, made with 1"));
}

TEST_CASE("optim: LAMB by hand, trust ratio") {
  Tensor p = param({3.0, 4.0});  // ||p|| = 5
  optim::LAMB opt({{{p}, 0.1, 0.0}}, {0.9, 0.999, 1e-6});
  p.set_grad(from_vector({1.0, -1.0}, {2}));
  opt.step();
  // step 1: m_hat = g, v_hat = g^2, u = g / (|g| + eps) ~ [1, -1], ||u|| = sqrt(2), trust = 5 / sqrt(2)
  const double u = 1.0 / (1.0 + 1e-6), trust = 5.0 / (std::sqrt(2.0) * u);
  const auto v = p.to_vector();
  CHECK(v[0] == doctest::Approx(3.0 - 0.1 * trust * u));
  CHECK(v[1] == doctest::Approx(4.0 + 0.1 * trust * u));
}

TEST_CASE("optim: clipping, decay groups") {
  Tensor a = param({0, 0}), b = param({0});
  a.set_grad(from_vector({3, 0}, {2}));
  b.set_grad(from_vector({4}, {1}));
  const double n = optim::clip_grad_norm({a, b}, 1.0).item<double>();
  CHECK(n == doctest::Approx(5.0));
  CHECK(a.grad().to_vector()[0] == doctest::Approx(0.6).epsilon(1e-5));
  CHECK(b.grad().item<double>() == doctest::Approx(0.8).epsilon(1e-5));
  CHECK(optim::clip_grad_norm({a, b}, 10.0).item<double>() == doctest::Approx(1.0).epsilon(1e-5));  // no change below the max
  optim::clip_grad_value({a, b}, 0.7);
  CHECK(b.grad().item<double>() == doctest::Approx(0.7));
  optim::clip_grad_value({a, b}, 0.0);  // torch's clip_grad_value_ takes 0: every gradient zeroed
  CHECK(b.grad().item<double>() == 0.0);
  CHECK(a.grad().to_vector()[0] == 0.0);
  CHECK_THROWS(optim::clip_grad_value({a, b}, -0.5));
  // Other norms, as torch's norm_type: the largest |g|, the sum of |g|, the cube root of the sum of |g|^3.
  for (const auto& [type, norm] : std::vector<std::pair<double, double>>{{INFINITY, 4}, {1, 7}, {3, 4.497941}}) {
    a.set_grad(from_vector({-3, 0}, {2}));
    b.set_grad(from_vector({4}, {1}));
    CHECK(optim::clip_grad_norm({a, b}, 2.0, type).item<double>() == doctest::Approx(norm).epsilon(1e-4));
    CHECK(b.grad().item<double>() == doctest::Approx(4 * 2.0 / norm).epsilon(1e-4));
    CHECK(a.grad().to_vector()[0] == doctest::Approx(-3 * 2.0 / norm).epsilon(1e-4));
  }
  CHECK(error_of([&] { optim::clip_grad_norm({a, b}, 1.0, 0.0); }).find("norm_type must be > 0") != std::string::npos);
  Block blk;
  const auto groups = optim::decay_groups(blk.named_parameters(), 0.1, 5e-4);
  REQUIRE(groups.size() == 2);
  CHECK(groups[0].params.size() == 2);  // the two conv weights
  CHECK(groups[1].weight_decay == 0.0);
}

TEST_CASE("optim: LR schedules are pure functions of the step") {
  // Every schedule by its name, and an unknown name lists them all.
  for (const auto& [name, kind] : optim::LrSchedule::kinds()) CHECK(optim::LrSchedule::parse(name) == kind);
  CHECK(optim::LrSchedule::kinds().size() == 6);
  CHECK(contains(error_of([] { optim::LrSchedule::parse("cyclic"); }),
                 "unknown LR schedule 'cyclic' (expected one of constant, step, multistep, cosine, linear, polynomial)"));
  optim::LrSchedule s;
  s.kind = optim::ScheduleKind::cosine;
  s.base_lr = 1.0;
  s.warmup_steps = 10;
  s.total_steps = 110;
  CHECK(s.at(0) == doctest::Approx(0.1));
  CHECK(s.at(9) == doctest::Approx(1.0));
  CHECK(s.at(10) == doctest::Approx(1.0));
  CHECK(s.at(60) == doctest::Approx(0.5));
  CHECK(s.at(110) == doctest::Approx(0.0));
  CHECK(s.at(500) == doctest::Approx(0.0));
  s.kind = optim::ScheduleKind::linear;
  CHECK(s.at(35) == doctest::Approx(0.75));
  s.kind = optim::ScheduleKind::polynomial;
  s.power = 2.0;
  CHECK(s.at(60) == doctest::Approx(0.25));
  optim::LrSchedule st;
  st.kind = optim::ScheduleKind::step;
  st.base_lr = 1.0;
  st.step_size = 30;
  st.gamma = 0.1;
  CHECK(st.at(29) == doctest::Approx(1.0));
  CHECK(st.at(30) == doctest::Approx(0.1));
  CHECK(st.at(65) == doctest::Approx(0.01));
  optim::LrSchedule ms;
  ms.kind = optim::ScheduleKind::multistep;
  ms.base_lr = 0.1;
  ms.milestones = {5, 8};
  CHECK(ms.at(4) == doctest::Approx(0.1));
  CHECK(ms.at(5) == doctest::Approx(0.01));
  CHECK(ms.at(9) == doctest::Approx(0.001));
  CHECK_THROWS_AS(optim::LrSchedule::parse("wobbly"), kiln::Error);
  // A schedule that cannot give a rate for every step is refused, naming the field.
  optim::LrSchedule bad;
  bad.kind = optim::ScheduleKind::cosine;  // without total steps its rate would be 0 from step 1
  CHECK(contains(error_of([&] { bad.at(1); }), "cosine schedule needs its total steps (> 0), got 0"));
  bad.total_steps = 10;
  bad.warmup_steps = 20;  // a warmup longer than the run: it warms up throughout, as before
  CHECK(bad.at(9) == doctest::Approx(0.1 * 10 / 20));
  bad.warmup_steps = 0;
  bad.base_lr = std::nan("");
  CHECK(contains(error_of([&] { bad.at(1); }), "base lr must be finite"));
  bad.base_lr = 1;
  bad.kind = optim::ScheduleKind::polynomial;
  bad.power = -1;
  CHECK(contains(error_of([&] { bad.at(1); }), "power must be finite and > 0"));
}

TEST_CASE("optim: a non-finite or negative lr, and a parameter listed twice, are refused") {
  Tensor p = zeros({2}), q = zeros({1});
  p.set_requires_grad();
  q.set_requires_grad();
  CHECK(contains(error_of([&] { optim::SGD({optim::ParamGroup({p}, INFINITY)}); }),
                 "lr must be finite and >= 0, got inf"));
  CHECK(contains(error_of([&] { optim::SGD({optim::ParamGroup({p}, std::nan(""))}); }), "got nan"));
  CHECK(contains(error_of([&] { optim::SGD({optim::ParamGroup({p}, 0.1, -1)}); }), "weight decay must be finite"));
  CHECK(contains(error_of([&] {
                   optim::SGD({optim::ParamGroup({p, q, p}, 0.1)});
                 }),
                 "parameter 2 of group 0 is also parameter 0 of group 0"));
  CHECK(contains(error_of([&] {
                   optim::SGD({optim::ParamGroup({q}, 0.1), optim::ParamGroup({p, q}, 0.1)});
                 }),
                 "parameter 1 of group 1 is also parameter 0 of group 0"));
  optim::SGD ok({optim::ParamGroup({p, q}, 0.1)});
  CHECK(contains(error_of([&] { ok.set_lr(std::nan("")); }), "lr must be finite, got nan"));
  CHECK(ok.groups()[0].lr == 0.1);
  // A negative lr is kept when set (a schedule's last past its end, as torch keeps it) and refused at the step,
  // which changes nothing.
  ok.set_lr(-5);
  CHECK(ok.groups()[0].lr == -5);
  p.set_grad(ones({2}));
  CHECK(contains(error_of([&] { ok.step(); }), "sgd: group 0's lr is -5 at this step; a step needs a finite lr >= 0"));
  CHECK(p.to_vector() == std::vector<double>{0.0, 0.0});
  CHECK(ok.steps() == 0);
  ok.set_lr(0.5);
  ok.step();
  CHECK(p.to_vector() == std::vector<double>{-0.5, -0.5});
}

TEST_CASE("optim: a refused step after a parameter was replaced changes nothing; putting it back keeps its state") {
  Tensor a = ones({2}).set_requires_grad();
  optim::AdamW adam({optim::ParamGroup({a}, 0.1)});
  for (int k = 0; k < 3; ++k) {
    a.set_grad(Tensor());
    sum(a * a).backward();
    adam.step();
  }
  REQUIRE(adam.steps(0, 0) == 3);
  Tensor t = ones({2}).set_requires_grad();
  adam.groups()[0].params[0] = t;
  sum(t).backward();
  // Refused (an f64 skip flag): the replacement was applied before this check, and a's state was lost.
  CHECK(contains(error_of([&] { adam.step(scalar_tensor(0.0, DType::f64)); }), "the skip flag must be one f32"));
  adam.groups()[0].params[0] = a;
  CHECK(adam.steps(0, 0) == 3);
  CHECK(adam.state().tensors.count("0.0.exp_avg") == 1);
}

TEST_CASE("optim: a parameter replaced through groups() gets its own state, as torch keys state by tensor") {
  // SGD with momentum: [2] stepped, then a [4] in its place. Its momentum buffer was the [2]'s, and the
  // step read and wrote past it ([0.81, 0.81, 0.93, 0.93]); now the new tensor starts fresh: 1 - 0.1 * 1.
  Tensor a = zeros({2}).set_requires_grad();
  optim::SGD sgd({optim::ParamGroup({a}, 0.1)}, {0.9});
  sum(a).backward();
  sgd.step();
  Tensor b = ones({4}).set_requires_grad();
  sgd.groups()[0].params[0] = b;
  CHECK(sgd.state().tensors.empty());  // the replaced tensor's buffer is not b's
  sum(b).backward();
  sgd.step();
  CHECK(amax(abs(b - 0.9)).item<double>() < 1e-6);
  CHECK(sgd.state().tensors.at("0.0.momentum_buffer").shape() == Shape{4});
  // The same shape too: a new tensor does not inherit the old one's momentum.
  Tensor c = ones({4}).set_requires_grad();
  sgd.groups()[0].params[0] = c;
  sum(c).backward();
  sgd.step();
  CHECK(amax(abs(c - 0.9)).item<double>() < 1e-6);

  // AdamW: [2] -> [100000] crashed; the new tensor gets fresh moments and its own step count, and two
  // parameters swapped take their state with them (as a reference optimizer that never swapped them).
  Tensor p = ones({2}).set_requires_grad(), q = full({3}, 2.0).set_requires_grad();
  Tensor rp = ones({2}).set_requires_grad(), rq = full({3}, 2.0).set_requires_grad();
  optim::AdamW adam({optim::ParamGroup({p, q}, 0.1)}), ref({optim::ParamGroup({rp, rq}, 0.1)});
  auto step_both = [&] {
    for (Tensor t : {p, q, rp, rq}) t.set_grad(Tensor());
    (sum(p * p) + sum(q * q * q)).backward();
    (sum(rp * rp) + sum(rq * rq * rq)).backward();
    adam.step();
    ref.step();
  };
  step_both();
  step_both();
  adam.groups()[0].params = {q, p};
  CHECK(adam.steps(0, 0) == 2);
  step_both();
  CHECK(p.to_vector() == rp.to_vector());
  CHECK(q.to_vector() == rq.to_vector());
  CHECK(adam.state().tensors.at("0.0.exp_avg").shape() == Shape{3});
  Tensor big = ones({100000}).set_requires_grad();
  adam.groups()[0].params[1] = big;  // p's place
  CHECK(adam.steps(0, 1) == 0);
  sum(big).backward();
  q.set_grad(Tensor());
  adam.step();
  CHECK(adam.steps(0, 1) == 1);
  CHECK(amax(abs(big - 0.9)).item<double>() < 1e-6);  // Adam's first step: lr * sign(g)

  // A state saved for another shape is refused, naming it; so are a computed tensor and one listed twice.
  optim::OptimizerState s = adam.state();
  adam.groups()[0].params[1] = p;
  CHECK(contains(error_of([&] { adam.load_state(s); }),
                 "optimizer state '0.1.exp_avg' has shape [100000], parameter has [2]"));
  adam.groups()[0].params[1] = p * 2;
  CHECK(contains(error_of([&] { adam.step(); }), "parameter 1 of group 0 was replaced by a tensor that is not a leaf"));
  adam.groups()[0].params[1] = q;
  CHECK(contains(error_of([&] { adam.step(); }), "parameter 1 of group 0 is also parameter 0 of group 0"));
  adam.groups()[0].params.push_back(p);
  CHECK(contains(error_of([&] { (void)adam.state(); }), "parameters cannot be added or removed"));
  CHECK(contains(error_of([&] { adam.load_state(s); }), "parameters cannot be added or removed"));
  adam.groups().emplace_back(std::vector<Tensor>{p});
  CHECK(contains(error_of([&] { (void)adam.steps(1, 0); }), "groups cannot be added or removed"));
}

TEST_CASE("optim: state that no longer matches its parameter (converted in place) is refused, not used") {
  nn::Linear lin(3, 2);
  optim::AdamW opt({optim::ParamGroup(lin.parameters(), 0.1)});
  sum(lin(ones({1, 3}))).backward();
  opt.step();
  lin.to(DType::f64);  // the same tensors, now f64: their f32 moments no longer fit
  sum(lin(ones({1, 3}, DType::f64))).backward();
  const Tensor before = lin.weight.clone();
  CHECK(contains(error_of([&] { opt.step(); }),
                 "adamw: parameter 0 of group 0: state 'exp_avg' is f32 cpu [2,3], its parameter (f64 cpu [2,3]) needs "
                 "f64 cpu [2,3]"));
  CHECK(lin.weight.to_vector() == before.to_vector());  // refused before anything changed
}

TEST_CASE("modules: a small transformer block learns to copy a token") {
  // Inputs: random tokens; target at each position = the token at position 0 (needs attention).
  Generator gen(11);
  const int64_t vocab = 8, len = 6, dm = 16, batch = 32;
  nn::Embedding tok(vocab, dm), pos(len, dm);
  nn::MultiheadSelfAttention attn(dm, 2);
  nn::LayerNorm ln1(Shape{dm}), ln2(Shape{dm});
  nn::Linear ff1(dm, 32), ff2(32, dm), head(dm, vocab);
  std::vector<Tensor> params;
  for (nn::Module* m : std::initializer_list<nn::Module*>{&tok, &pos, &attn, &ln1, &ln2, &ff1, &ff2, &head})
    for (auto& p : m->parameters()) params.push_back(p);
  optim::AdamW opt({{params, 3e-3, 0.0}});
  const Tensor positions = arange(len);
  double first = 0, last = 0;
  for (int step = 0; step < 150; ++step) {
    const Tensor ids = randint(0, vocab, {batch, len}, TensorOptions(DType::i64), &gen);
    const Tensor target = ids.narrow(1, 0, 1).expand({batch, len}).contiguous();
    Tensor h = tok(ids) + pos(positions);
    h = ln1(h + attn.forward(h));
    h = ln2(h + ff2(gelu(ff1(h))));
    const Tensor loss = cross_entropy(head(h).reshape({batch * len, vocab}), target.reshape({-1}));
    if (step == 0) first = loss.item<double>();
    last = loss.item<double>();
    opt.zero_grad();
    loss.backward();
    opt.step();
  }
  CHECK(last < 0.3 * first);
}

// The CPU's fused steps run the kernel set's loops (kernels/cpu/isa/loops.inc); with kernels/common/optim_math.h's
// explicit FMAs every set gives the bits of that arithmetic done one element at a time (ctest runs this under
// each set: rows_<set>). Lengths cross the 16384-element chunks and end in a tail.
TEST_CASE("optimizers: kernel set loops give optim_math's bits for SGD, AdamW and LAMB") {
  using namespace kiln;
  const int64_t n = 2 * 16384 + 45;
  auto draw = [&](uint64_t seed, double scale, bool positive) {
    Generator gen(seed);
    std::vector<float> out(static_cast<size_t>(n));
    const auto d = randn({n}, DType::f64, &gen).to_vector();
    for (int64_t i = 0; i < n; ++i)
      out[size_t(i)] = float(positive ? std::abs(d[size_t(i)]) * scale : d[size_t(i)] * scale);
    return out;
  };
  const std::vector<float> w0 = draw(1, 1.0, false), g0 = draw(2, 0.1, false), m0 = draw(3, 0.01, false),
                           v0 = draw(4, 0.001, true);
  for (const OptimKind kind : {OptimKind::sgd, OptimKind::adamw, OptimKind::lamb})
    for (const int variant : {0, 1, 2, 3})  // SGD: no momentum, a fresh buffer, nesterov, plain momentum
      for (const double wd : {0.01, 0.0}) {
        if (kind != OptimKind::sgd && variant > 0) continue;
        INFO("kind " << int(kind) << " variant " << variant << " weight decay " << wd);
        OptimHyper h;
        h.lr = 0.03;
        h.weight_decay = wd;
        h.momentum = 0.9;
        h.dampening = 0.1;
        h.nesterov = variant == 2;
        h.beta1 = 0.9;
        h.beta2 = 0.999;
        h.eps = 1e-8;
        h.bc1 = 1 - std::pow(0.9, 3);
        h.bc2 = 1 - std::pow(0.999, 3);
        std::vector<float> w = w0, m = m0, v = v0;
        const bool with_buf = kind != OptimKind::sgd || variant > 0;
        OptimSlice s{w.data(), g0.data(), with_buf ? m.data() : nullptr, v.data(), n, variant == 1};
        cpu::optimizer_step(kind, &s, 1, h);
        // The reference, element by element.
        std::vector<float> rw = w0, rm = m0, rv = v0;
        if (kind == OptimKind::sgd) {
          const optim_math::SgdF c = optim_math::sgd_constants(h);
          for (int64_t i = 0; i < n; ++i)
            optim_math::sgd(rw[size_t(i)], g0[size_t(i)], with_buf ? &rm[size_t(i)] : nullptr, variant == 1, c);
        } else if (kind == OptimKind::adamw) {
          const optim_math::AdamF a = optim_math::adam_constants(h);
          for (size_t i = 0; i < size_t(n); ++i) {
            optim_math::adam_moments(g0[i], rm[i], rv[i], a);
            optim_math::adamw_apply(rw[i], rm[i], rv[i], a);
          }
        } else {
          const optim_math::AdamF a = optim_math::adam_constants(h);
          double ws = 0, us = 0;
          for (int64_t c0 = 0; c0 < n; c0 += 16384) {
            double cw = 0, cu = 0;
            for (int64_t i = c0; i < std::min(n, c0 + 16384); ++i) {
              optim_math::adam_moments(g0[size_t(i)], rm[size_t(i)], rv[size_t(i)], a);
              const float u = optim_math::lamb_direction(rw[size_t(i)], rm[size_t(i)], rv[size_t(i)], a);
              cw += double(rw[size_t(i)] * rw[size_t(i)]);
              cu += double(u * u);
            }
            ws += cw;
            us += cu;
          }
          const float step = optim_math::lamb_step(h, optim_math::lamb_trust(ws, us));
          for (size_t i = 0; i < size_t(n); ++i)
            optim_math::lamb_apply(rw[i], step, optim_math::lamb_direction(rw[i], rm[i], rv[i], a));
        }
        CHECK(std::memcmp(w.data(), rw.data(), w.size() * 4) == 0);
        CHECK(std::memcmp(m.data(), rm.data(), m.size() * 4) == 0);
        CHECK(std::memcmp(v.data(), rv.data(), v.size() * 4) == 0);
        CHECK(w != w0);
      }
}

TEST_CASE("optimizers: the fused step (one backend call per group) matches the per-tensor ops") {
  using namespace kiln;
  auto run = [](const std::string& which, bool fused) {
    Generator g(21);
    std::vector<Tensor> ps = {randn({37, 5}, DType::f32, &g).set_requires_grad(), randn({300}, DType::f32, &g).set_requires_grad(),
                              randn({70001}, DType::f32, &g).set_requires_grad()};
    std::vector<optim::ParamGroup> groups = {{{ps[0], ps[2]}, 0.05, 0.01}, {{ps[1]}, 0.02, 0.0}};
    std::unique_ptr<optim::Optimizer> opt;
    if (which == "sgd") opt = std::make_unique<optim::SGD>(groups, optim::SgdOptions{0.9, 0.1, false});
    if (which == "nesterov") opt = std::make_unique<optim::SGD>(groups, optim::SgdOptions{0.9, 0.0, true});
    if (which == "adamw") opt = std::make_unique<optim::AdamW>(groups);
    if (which == "lamb") opt = std::make_unique<optim::LAMB>(groups);
    opt->use_fused = fused;
    for (int step = 0; step < 3; ++step) {
      for (Tensor& p : ps) p.set_grad(randn(p.shape(), DType::f32, &g));
      opt->step();
    }
    std::vector<double> out;
    for (const Tensor& p : ps) {
      const auto v = p.to_vector();
      out.insert(out.end(), v.begin(), v.end());
    }
    for (const auto& [k, t] : opt->state().tensors) {
      const auto v = t.to_vector();
      out.insert(out.end(), v.begin(), v.end());
    }
    return out;
  };
  for (const char* which : {"sgd", "nesterov", "adamw", "lamb"}) {
    const auto a = run(which, true), b = run(which, false);
    REQUIRE(a.size() == b.size());
    // The same f32 operations in the same order; the compiler may contract a*b+c into one FMA in
    // either version, so the last bit may differ.
    double worst = 0;
    for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]) / (1.0 + std::abs(b[i])));
    CHECK_MESSAGE(worst < 2e-6, std::string(which), ": largest relative difference ", worst);
  }
}

TEST_CASE("optimizers: a group's own momentum or betas (ParamGroup::options) step as an optimizer of its own") {
  using namespace kiln;
  // Two groups, the second with its own options, against two one-group optimizers with those options
  // as their own: the same parameters bit for bit, on the fused path and the per-tensor one.
  auto params = [] {
    Generator g(7);
    return std::vector<Tensor>{randn({9, 4}, DType::f32, &g).set_requires_grad(),
                               randn({70}, DType::f32, &g).set_requires_grad()};
  };
  auto grads = [](std::vector<Tensor>& ps, int step) {
    Generator g(100 + uint64_t(step));
    for (Tensor& p : ps) p.set_grad(randn(p.shape(), DType::f32, &g));
  };
  auto same = [](const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
    for (size_t i = 0; i < a.size(); ++i)
      if (a[i].to_vector() != b[i].to_vector()) return false;
    return true;
  };
  for (const bool fused : {true, false}) {
    CAPTURE(fused);
    std::vector<Tensor> a = params(), b = params();
    optim::ParamGroup own({a[1]}, 0.02, 0.01);
    own.options = {{"momentum", 0.5}, {"dampening", 0.0}, {"nesterov", 1.0}};
    optim::SGD two({optim::ParamGroup({a[0]}, 0.05, 0.01), own}, optim::SgdOptions{0.9, 0.1, false});
    optim::SGD first({optim::ParamGroup({b[0]}, 0.05, 0.01)}, optim::SgdOptions{0.9, 0.1, false});
    optim::SGD second({optim::ParamGroup({b[1]}, 0.02, 0.01)}, optim::SgdOptions{0.5, 0.0, true});
    two.use_fused = first.use_fused = second.use_fused = fused;
    for (int step = 0; step < 3; ++step) {
      grads(a, step);
      grads(b, step);
      two.step();
      first.step();
      second.step();
    }
    CHECK(same(a, b));
    // saved as "group1.<key>", restored into an optimizer made without them, which goes on the same
    const optim::OptimizerState s = two.state();
    CHECK(s.scalars.at("group1.momentum") == 0.5);
    CHECK(s.scalars.count("group0.momentum") == 0);
    optim::SGD again({optim::ParamGroup({a[0]}, 1.0), optim::ParamGroup({a[1]}, 1.0)},
                     optim::SgdOptions{0.9, 0.1, false});
    again.use_fused = fused;
    again.load_state(s);
    CHECK(again.group_hyper(1).at("nesterov") == 1.0);
    grads(a, 3);
    grads(b, 3);
    again.step();
    first.step();
    second.step();
    CHECK(same(a, b));

    std::vector<Tensor> c = params(), d = params();
    optim::ParamGroup betas({c[1]}, 0.01);
    betas.options = {{"beta1", 0.5}, {"eps", 1e-3}};
    optim::AdamW adam({optim::ParamGroup({c[0]}, 0.01), betas});
    optim::AdamW adam0({optim::ParamGroup({d[0]}, 0.01)}), adam1({optim::ParamGroup({d[1]}, 0.01)}, {0.5, 0.999, 1e-3});
    adam.use_fused = adam0.use_fused = adam1.use_fused = fused;
    for (int step = 0; step < 3; ++step) {
      grads(c, step);
      grads(d, step);
      adam.step();
      adam0.step();
      adam1.step();
    }
    CHECK(same(c, d));
  }
  // Bad options are refused naming the group, and change nothing.
  Tensor p = zeros({2}).set_requires_grad(), q = zeros({2}).set_requires_grad();
  optim::ParamGroup bad({q}, 0.1);
  bad.options = {{"momentum", -1.0}};
  CHECK(contains(error_of([&] {
                   optim::SGD o({optim::ParamGroup({p}, 0.1), bad});
                 }),
                 "sgd: group 1's momentum must be >= 0, got -1"));
  bad.options = {{"beta1", 0.5}};
  CHECK(contains(error_of([&] {
                   optim::SGD o({optim::ParamGroup({p}, 0.1), bad});
                 }),
                 "sgd: group 1 sets 'beta1', which is not an option of this optimizer (its options: dampening, "
                 "momentum, nesterov)"));
  optim::AdamW adam({optim::ParamGroup({p}, 0.1), optim::ParamGroup({q}, 0.1)});
  CHECK(contains(error_of([&] {
                   adam.set_group_options(1, {{"beta2", 1.0}});
                 }),
                 "adamw: group 1's betas must be in [0, 1)"));
  CHECK(adam.groups()[1].options.empty());
  adam.groups()[0].options["eps"] = -1.0;  // edited in place: refused at the step, before anything moves
  p.set_grad(ones({2}));
  CHECK(contains(error_of([&] { adam.step(); }), "adamw: group 0's betas must be in [0, 1) and eps finite and >= 0"));
  CHECK(p.to_vector() == std::vector<double>{0, 0});
  adam.groups()[0].options.clear();
  // A saved group option that fails the checks is refused, naming the group.
  optim::SGD sgd({optim::ParamGroup({p}, 0.1)}, optim::SgdOptions{0.9});
  optim::OptimizerState s = sgd.state();
  s.scalars["group0.momentum"] = NAN;
  CHECK(contains(error_of([&] { sgd.load_state(s); }), "sgd: optimizer state's group 0's momentum must be >= 0"));
  CHECK(sgd.groups()[0].options.empty());
}
