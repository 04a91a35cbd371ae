// Dynamic loss scaling: the fused unscale + inf/NaN check on every float dtype, and the GradScaler
// state machine (skip and back off on overflow with weights and optimizer state untouched, growth
// after the interval, no growth past the f32 range, misuse errors, rank agreement, state round trip),
// and a whole training step without one synchronising read.
#include <doctest/doctest.h>

#include <cfloat>
#include <cmath>

#include "kernels/backend.h"
#include "kiln.h"
#include "test_util.h"

using namespace kiln;
using kiln::testing::contains;
using kiln::testing::error_of;

namespace {
struct Toy {
  Tensor w = randn({4, 3}).set_requires_grad();
  Tensor b = zeros({3}).set_requires_grad();
  std::vector<Tensor> params() const { return {w, b}; }
  Tensor loss(const Tensor& x) const { return mean(pow(matmul(x, w) + b, 2.0)); }
};
}  // namespace

TEST_CASE("unscale kernel: divides in place and flags inf and NaN, for f32, f64, f16 and bf16") {
  for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    Tensor g = from_vector({2, -4, 8, 0.5}, {4}, dt);
    float flag = 0;
    const double four = 4.0, two = 2.0;
    cpu_backend().unscale_check(dt, g.numel(), g.raw_data(), &four, &flag);
    CHECK(g.to_vector() == std::vector<double>{0.5, -1, 2, 0.125});
    CHECK(flag == 0.0f);
    for (double bad : {double(INFINITY), -double(INFINITY), double(NAN)}) {
      // One bad element deep inside a large buffer (several parallel chunks) is found.
      std::vector<double> v(200000, 1.0);
      v[150001] = bad;
      Tensor h = from_vector(v, {200000}, dt);
      float f = 0;
      cpu_backend().unscale_check(dt, h.numel(), h.raw_data(), &two, &f);
      CHECK(f == 1.0f);
      CHECK(h.to_vector()[7] == 0.5);
    }
  }
  // A finite f32 product that the 16-bit rounding makes inf (scale < 1: bf16's largest value x 1.003) is flagged.
  Tensor big = from_vector({3.3895e38}, {1}, DType::bf16);
  float f = 0;
  const double below_one = 1.0 / 1.003;
  cpu_backend().unscale_check(DType::bf16, 1, big.raw_data(), &below_one, &f);
  CHECK(std::isinf(big.to_vector()[0]));
  CHECK(f == 1.0f);
}

TEST_CASE("grad scaler: scaled loss, exact unscale, a normal step") {
  manual_seed(3);
  Toy m;
  const Tensor x = randn({8, 4});
  m.loss(x).backward();
  const std::vector<double> want = m.w.grad().to_vector();
  m.w.set_grad(Tensor());
  m.b.set_grad(Tensor());
  amp::GradScaler sc;
  CHECK(sc.get_scale() == 65536.0);
  sc.scale(m.loss(x)).backward();
  optim::SGD opt({optim::ParamGroup(m.params(), 0.1)});
  const std::vector<double> before = m.w.to_vector();
  sc.step(opt, m.params());
  CHECK_FALSE(sc.last_step_skipped());
  CHECK(m.w.grad().to_vector() == want);  // a power-of-two scale unscales exactly
  CHECK(m.w.to_vector() != before);
  sc.update();
  CHECK(sc.get_scale() == 65536.0);
  CHECK(sc.skipped_steps() == 0);
}

TEST_CASE("grad scaler: an inf or NaN gradient skips the step, leaves weights and optimizer state alone, halves the scale") {
  Toy m;
  optim::AdamW opt({optim::ParamGroup(m.params(), 0.1, 0.01)});
  amp::GradScaler sc({1024.0, 2.0, 0.5, 3});
  const Tensor x = randn({8, 4});
  // A clean step first, so the optimizer has state to protect.
  sc.scale(m.loss(x)).backward();
  sc.step(opt, m.params());
  CHECK_FALSE(sc.last_step_skipped());
  sc.update();
  const auto state_before = opt.state();
  const std::vector<double> w_before = m.w.to_vector();
  for (double bad : {double(INFINITY), double(NAN)}) {
    opt.zero_grad();
    sc.scale(m.loss(x)).backward();
    m.b.grad().data<float>()[1] = float(bad);
    const double s = sc.get_scale();
    sc.step(opt, m.params());
  CHECK(sc.last_step_skipped());
    CHECK(sc.found_inf().item<double>() == 1.0);
    sc.update();
    CHECK(sc.get_scale() == s * 0.5);
    CHECK(m.w.to_vector() == w_before);
    const auto st = opt.state();
    CHECK(st.scalars.at("steps") == state_before.scalars.at("steps"));
    for (const auto& [k, t] : st.tensors) CHECK(t.to_vector() == state_before.tensors.at(k).to_vector());
  }
  CHECK(sc.skipped_steps() == 2);
  // Three clean steps (the growth interval) double the scale; the tracker restarts.
  for (int i = 0; i < 3; ++i) {
    opt.zero_grad();
    sc.scale(m.loss(x)).backward();
    sc.step(opt, m.params());
  CHECK_FALSE(sc.last_step_skipped());
    sc.update();
  }
  CHECK(sc.get_scale() == 1024.0 * 0.25 * 2.0);
  CHECK(sc.state().growth_tracker == 0);
}

TEST_CASE("grad scaler: never grows past the f32 range; misuse is an error; ranks agree; state round-trips") {
  Toy m;
  optim::SGD opt({optim::ParamGroup(m.params(), 0.0)});
  amp::GradScaler sc({double(FLT_MAX) / 1.5, 2.0, 0.5, 1});
  const Tensor x = randn({2, 4});
  for (int i = 0; i < 3; ++i) {
    opt.zero_grad();
    sc.scale(m.loss(x)).backward();
    sc.step(opt, m.params());
    sc.update();
    CHECK(sc.get_scale() == double(FLT_MAX) / 1.5);
  }
  amp::GradScaler s2;
  opt.zero_grad();
  s2.scale(m.loss(x)).backward();
  s2.unscale(opt, m.params());
  CHECK(contains(error_of([&] { s2.unscale(opt, m.params()); }), "already called"));
  s2.step(opt, m.params());
  CHECK_FALSE(s2.last_step_skipped());  // uses the unscale above
  CHECK(contains(error_of([&] { s2.step(opt, m.params()); }), "step() was already called"));
  s2.update();
  CHECK(contains(error_of([&] { s2.update(); }), "needs a step() first"));
  // Another rank saw an overflow: the agreement hook makes this one skip too.
  s2.agree = [](Tensor& f) { f.fill_(1.0); };
  opt.zero_grad();
  s2.scale(m.loss(x)).backward();
  s2.step(opt, m.params());
  CHECK(s2.last_step_skipped());
  s2.update();
  amp::GradScaler s3;
  s3.load_state(s2.state());
  CHECK(s3.get_scale() == s2.get_scale());
  CHECK(s3.skipped_steps() == 1);
  CHECK(contains(error_of([&] { s3.load_state({-1.0, 0, 0}); }), "invalid saved state"));
  // Disabled (bf16 or f32 runs): scale 1, loss untouched.
  amp::GradScaler off({65536.0, 2.0, 0.5, 2000, false});
  CHECK(off.get_scale() == 1.0);
}

TEST_CASE("training step: no synchronising read outside logging (loss scaling, clipping, fused optimizers, losses)") {
  // The counter counts: a read is one.
  const uint64_t r0 = host_read_count();
  (void)ones({1}).item<double>();
  CHECK(host_read_count() == r0 + 1);

  manual_seed(11);
  const Tensor w = randn({6, 5}).set_requires_grad(), b = zeros({5}).set_requires_grad();
  const Tensor x = randn({16, 6});
  Tensor target = randint(0, 5, {16});
  target.data<int64_t>()[3] = -100;  // an ignored row: the mean's divisor is counted on the device
  optim::AdamW adamw({optim::ParamGroup({w}, 0.01, 0.01)});
  optim::LAMB lamb({optim::ParamGroup({b}, 0.01)});
  amp::GradScaler sc({1024.0, 2.0, 0.5, 2});
  auto one_step = [&](bool overflow) {
    adamw.zero_grad();
    lamb.zero_grad();
    const Tensor logits = linear(x, w.t(), b);
    const Tensor loss = cross_entropy(logits, target) + nll_loss(log_softmax(logits, 1), target);
    sc.scale(loss).backward();
    if (overflow) w.grad().data<float>()[2] = INFINITY;
    sc.unscale(adamw, {w, b});  // b belongs to lamb, stepped later outside the scaler
    const Tensor norm = optim::clip_grad_norm({w, b}, 0.5);
    sc.step(adamw, {w});
    sc.update();
    return norm;
  };
  one_step(false);  // the first step makes the optimizer's state
  const std::vector<double> before = w.to_vector();
  const uint64_t start = host_read_count();
  for (int i = 0; i < 4; ++i) one_step(i == 1);
  CHECK(host_read_count() == start);  // four steps, one of them skipped on the device: no read
  lamb.step();  // LAMB's fused norms stay on the device too
  CHECK(host_read_count() == start);
  // What the device decided, read afterwards: one skip; the scale grown after two clean steps
  // (2048), halved at the overflow, grown again after two more; AdamW counts the applied steps.
  CHECK(sc.skipped_steps() == 1);
  CHECK(sc.get_scale() == 2048.0);
  CHECK(adamw.steps() == 4);
  CHECK(w.to_vector() != before);
}

TEST_CASE("grad scaler: a skipped first step makes no optimizer state; an empty group is fine") {
  // SGD with dampening: its first momentum is the direction itself, so a skipped first step must
  // leave no zero buffer behind. Run A skips a step, then steps with G; run B only steps with G.
  Tensor a = from_vector({1, 2, 3}, {3}).set_requires_grad(), b = from_vector({1, 2, 3}, {3}).set_requires_grad();
  optim::SGD oa({optim::ParamGroup({}, 0.1), optim::ParamGroup({a}, 0.1)}, {0.9, 0.5, false});
  optim::SGD ob({optim::ParamGroup({b}, 0.1)}, {0.9, 0.5, false});
  amp::GradScaler sc({1024.0, 2.0, 0.5, 100});
  a.set_grad(from_vector({INFINITY, 0, 0}, {3}));
  sc.step(oa, {a});
  CHECK(sc.last_step_skipped());
  sc.update();
  const Tensor g = from_vector({0.5, -1, 2}, {3});
  a.set_grad(g * sc.get_scale());  // unscaled exactly (a power of two)
  sc.step(oa, {a});
  sc.update();
  b.set_grad(g.clone());
  ob.step();
  CHECK(a.to_vector() == b.to_vector());
  CHECK(oa.steps() == 1);
  CHECK(oa.state().tensors.at("1.0.momentum_buffer").to_vector() == ob.state().tensors.at("0.0.momentum_buffer").to_vector());
  // SGD without momentum has no state to make: even its first step under the flag reads nothing
  // on the host (the kernel skips it on the device).
  Tensor c = from_vector({1, 2, 3}, {3}).set_requires_grad();
  optim::SGD plain({optim::ParamGroup({c}, 0.1)});
  c.set_grad(from_vector({INFINITY, 0, 0}, {3}));
  const uint64_t reads = host_read_count();
  sc.step(plain, {c});
  CHECK(host_read_count() == reads);
  CHECK(sc.last_step_skipped());
  CHECK(c.to_vector() == std::vector<double>{1, 2, 3});
  CHECK(plain.state().tensors.empty());
}

TEST_CASE(
    "grad scaler: init_scale is a normal f32, backoff stops at FLT_MIN, an overflow made by unscaling is caught") {
  CHECK(contains(error_of([] { amp::GradScaler({1e-50}); }),
                 "init_scale must be a normal f32 value in [1.17549e-38, "
                 "3.40282e+38], got 1e-50"));
  CHECK(contains(error_of([] { amp::GradScaler({1e39}); }), "got 1e+39"));
  Tensor w = from_vector({1.0, 2.0}, {2}).set_requires_grad();
  optim::SGD opt({optim::ParamGroup({w}, 0.1)});
  amp::GradScaler sc({double(FLT_MIN), 2.0, 0.5, 100});
  // A finite scaled gradient whose unscaled value (1e30 / FLT_MIN) is inf: the step is skipped.
  w.set_grad(from_vector({1e30, 1.0}, {2}));
  sc.step(opt, {w});
  CHECK(sc.last_step_skipped());
  sc.update();
  CHECK(w.to_vector() == std::vector<double>{1.0, 2.0});
  CHECK(sc.get_scale() == double(FLT_MIN));  // not backed off below FLT_MIN
  CHECK(sc.scale(from_vector({1.0}, {1}).reshape({})).item<double>() == double(FLT_MIN));
  CHECK(sc.skipped_steps() == 1);
  // An older checkpoint's f64 scale is rounded to f32 (and raised to the floor).
  sc.load_state({18.224999999999998, 1, 0});
  CHECK(sc.get_scale() == double(18.225f));
  sc.load_state({1e-50, 0, 0});
  CHECK(sc.get_scale() == double(FLT_MIN));
}

TEST_CASE("grad scaler: several optimizers each unscale and step once a step (as torch's); f16 gradients are refused") {
  Tensor a = from_vector({1.0}, {1}).set_requires_grad(), b = from_vector({1.0}, {1}).set_requires_grad();
  optim::SGD oa({optim::ParamGroup({a}, 1.0)}), ob({optim::ParamGroup({b}, 1.0)});
  amp::GradScaler sc({4.0, 2.0, 0.5, 100});
  a.set_grad(from_vector({8.0}, {1}));
  b.set_grad(from_vector({INFINITY}, {1}));
  sc.unscale(oa, {a});
  sc.unscale(ob, {b});
  CHECK(contains(error_of([&] { sc.unscale(oa, {a}); }), "unscale() was already called on this optimizer"));
  sc.step(oa, {a});
  CHECK(contains(error_of([&] { sc.unscale(oa, {a}); }), "after step()"));
  CHECK(contains(error_of([&] { sc.step(oa, {a}); }), "step() was already called on this optimizer"));
  sc.step(ob, {b});
  CHECK(sc.last_step_skipped());
  sc.update();
  CHECK(a.to_vector() == std::vector<double>{-1.0});  // 1 - 8 / 4
  CHECK(b.to_vector() == std::vector<double>{1.0});   // skipped
  CHECK(sc.get_scale() == 2.0);                       // one optimizer's inf backs the scale off
  CHECK(contains(error_of([&] { sc.update(); }), "needs a step() first"));
  Tensor h = from_vector({1.0}, {1}, DType::f16).set_requires_grad();
  h.set_grad(from_vector({1.0}, {1}, DType::f16));
  optim::SGD oh({optim::ParamGroup({h}, 1.0)});
  CHECK(contains(error_of([&] { sc.step(oh, {h}); }), "parameter 0 (shape [1]) has a f16 gradient"));
  // bf16 has f32's exponent range: unscaled as torch unscales it.
  Tensor hb = from_vector({1.0}, {1}, DType::bf16).set_requires_grad();
  hb.set_grad(from_vector({4.0}, {1}, DType::bf16));
  optim::SGD obf({optim::ParamGroup({hb}, 1.0)});
  const double scale = sc.get_scale();
  sc.step(obf, {hb});
  CHECK(hb.to_vector() == std::vector<double>{1.0 - 4.0 / scale});
}
