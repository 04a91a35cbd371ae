// Tests for autograd: gradcheck itself, finite-difference checks of views, and the engine's behaviour (accumulation,
// retain_graph, no-grad, detach, saved-tensor versions, diamonds, grad-ready hooks, autograd::grad, and its errors,
// threads sharing a leaf).
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "kiln.h"
#include "test_util.h"

using namespace kiln;
using kiln::testing::contains;
using kiln::testing::error_of;

namespace {

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

// Random f64 values in [lo, hi]; with `away` > 0 the magnitude is at least `away` (random sign).
Tensor rnd(const Shape& s, double lo = -1, double hi = 1, uint32_t seed = 1, double away = 0) {
  std::mt19937 rng(seed * 7919u + uint32_t(s.size()) * 31u + 17u);
  std::uniform_real_distribution<double> d(lo, hi);
  std::vector<double> v(static_cast<size_t>(s.numel()));
  for (double& x : v) {
    x = d(rng);
    if (away > 0) {
      const double m = away + std::abs(x) * (1 - away);
      x = (rng() & 1) ? m : -m;
    }
  }
  return from_vector(v, s, DType::f64);
}

std::string run_gradcheck(const Fn& fn, const std::vector<Tensor>& inputs, GradcheckOptions opts = {}) {
  try {
    return gradcheck(fn, inputs, opts);
  } catch (const std::exception& e) {
    return std::string("threw: ") + e.what();
  }
}

#define GRADCHECK_OPTS(name, fn, inputs, opts)                          \
  do {                                                                  \
    const std::string r_ = run_gradcheck(fn, inputs, opts);             \
    CHECK_MESSAGE(r_.empty(), std::string(name), ": ", r_);              \
  } while (0)
#define GRADCHECK(name, fn, inputs) GRADCHECK_OPTS(name, fn, inputs, GradcheckOptions{})

void check_values(const Tensor& t, const std::vector<double>& want, double tol, const std::string& what) {
  REQUIRE_MESSAGE(t.defined(), what, ": undefined tensor");
  const std::vector<double> got = t.to_vector();
  REQUIRE_MESSAGE(got.size() == want.size(), what, ": ", got.size(), " values, want ", want.size());
  for (size_t i = 0; i < got.size(); ++i)
    if (!(std::abs(got[i] - want[i]) <= tol * (1 + std::abs(want[i])))) {
      FAIL_CHECK(what, ": element ", i, " got ", got[i], " want ", want[i]);
      return;
    }
}

Tensor leaf(const Shape& s, double lo = -1, double hi = 1, uint32_t seed = 1) {
  Tensor t = rnd(s, lo, hi, seed);
  t.set_requires_grad(true);
  return t;
}

// A user-defined op through autograd::record: y = x^2 with a backward that can be made wrong.
Tensor custom_square(const Tensor& x, double grad_scale) {
  Tensor out;
  {
    NoGradGuard ng;
    out = x * x;
  }
  SavedTensor sx(x);
  autograd::record("custom_square", {x}, {out}, [sx, grad_scale](const GradCtx& c) -> std::vector<Tensor> {
    return {c.g() * sx.unpack("custom_square") * grad_scale};
  });
  return out;
}

// y = x + offset with a backward of grad_scale * g, or |g| when abs_grad (a backward that loses the sign).
Tensor custom_shift(const Tensor& x, double offset, double grad_scale, bool abs_grad = false) {
  Tensor out;
  {
    NoGradGuard ng;
    out = x + offset;
  }
  autograd::record("custom_shift", {x}, {out}, [grad_scale, abs_grad](const GradCtx& c) -> std::vector<Tensor> {
    return {(abs_grad ? abs(c.g()) : c.g()) * grad_scale};
  });
  return out;
}

}  // namespace

// ---- gradcheck itself (every op's gradients are checked by the op table: tests/test_op_table.cpp) ----

TEST_CASE("autograd: gradcheck catches a wrong backward") {
  Tensor x = rnd({3, 2}, -1, 1, 2);
  CHECK(run_gradcheck([](const std::vector<Tensor>& v) { return custom_square(v[0], 2.0); }, {x}).empty());
  const std::string bad = run_gradcheck([](const std::vector<Tensor>& v) { return custom_square(v[0], 3.0); }, {x});
  CHECK(!bad.empty());
  CHECK(contains(bad, "input 0"));
  // A sampled check still visits the last element; an input left out is not differentiated.
  const Tensor big = rnd({50}, -1, 1, 3);
  auto wrong_last = [](const std::vector<Tensor>& v) {
    return cat({v[0].narrow(0, 0, 49) * 1.0, custom_square(v[0].narrow(0, 49, 1), 3.0)}, 0);
  };
  GradcheckOptions sampled;
  sampled.max_checks = 4;
  CHECK(contains(gradcheck(wrong_last, {big}, sampled), "element 49"));
  GradcheckOptions skip;
  skip.differentiate = {true, false};
  CHECK(gradcheck([](const std::vector<Tensor>& v) { return v[0] * v[1].detach(); }, {x, rnd({3, 2}, -1, 1, 4)}, skip)
            .empty());
  CHECK(!gradcheck([](const std::vector<Tensor>& v) { return v[0] * v[1].detach(); }, {x, rnd({3, 2}, -1, 1, 4)}).empty());
}

TEST_CASE("autograd: gradcheck catches a wrong backward next to large outputs, at any size") {
  // A backward 3x too large on outputs near 1e6: the numerical derivative comes from each output's own
  // difference, so the size (and number) of the other outputs adds no slack.
  for (int64_t n : {1, 10, 1000, 5000}) {
    CAPTURE(n);
    const Tensor x = zeros({n}, TensorOptions(DType::f64));
    const std::string bad =
        run_gradcheck([](const std::vector<Tensor>& v) { return custom_shift(v[0], 1e6, 3.0); }, {x});
    CHECK(contains(bad, "analytic"));
    CHECK(run_gradcheck([](const std::vector<Tensor>& v) { return custom_shift(v[0], 1e6, 1.0); }, {x}).empty());
  }
  // Where the rounding of the outputs is as large as the gradient (outputs near 1e9 moved by 2e-6: a
  // few ulps), it fails saying so rather than pass, right backward or wrong.
  CHECK(contains(run_gradcheck([](const std::vector<Tensor>& v) { return custom_shift(v[0], 1e9, 1.0); },
                               {zeros({4}, TensorOptions(DType::f64))}),
                 "cannot be resolved at this magnitude"));
  const std::string blind = run_gradcheck([](const std::vector<Tensor>& v) { return custom_shift(v[0], 1e9, 3.0); },
                                          {zeros({4}, TensorOptions(DType::f64))});
  CHECK(contains(blind, "cannot be resolved at this magnitude"));
}

TEST_CASE("autograd: gradcheck passes a right gradient next to large outputs, as torch") {
  // The rounding allowance is a loose bound (16 ulp of every moved output, summed): it only loosens
  // the tolerance. A difference within atol + rtol * |numerical| passes however large the outputs; the
  // reviewer's cases, which torch.autograd.gradcheck passes (with its atol 1e-5, rtol 1e-3), failed
  // as "cannot be resolved" although the numerical derivative was within 1e-8 of the analytic one.
  GradcheckOptions torch_tol;
  torch_tol.atol = 1e-5;
  torch_tol.rtol = 1e-3;
  for (double scale : {1e5, 1e6}) {
    CAPTURE(scale);
    GradcheckOptions o = torch_tol;
    o.max_checks = 20;
    Generator gen(7);
    const Tensor x = randn({1, 4096}, TensorOptions(DType::f64), &gen) * scale;
    CHECK(run_gradcheck([](const std::vector<Tensor>& v) { return layer_norm(v[0], Shape{4096}); }, {x}, o).empty());
  }
  std::vector<double> ones_but_one(10000, 1.0);
  ones_but_one[0] = 1e-5;
  GradcheckOptions five = torch_tol;
  five.max_checks = 5;
  CHECK(run_gradcheck([](const std::vector<Tensor>& v) { return sum(v[0] * v[0]); },
                      {from_vector(ones_but_one, Shape{10000}, TensorOptions(DType::f64))}, five)
            .empty());
  CHECK(run_gradcheck([](const std::vector<Tensor>& v) { return v[0] * 1e-4 + 1e5; },
                      {zeros({3}, TensorOptions(DType::f64))}, torch_tol)
            .empty());
}

TEST_CASE("autograd: gradcheck weights the outputs with both signs, and a constant output passes") {
  // A backward that takes |g| agrees with the truth for positive weights only.
  const Tensor x = rnd({10}, -1, 1, 5);
  CHECK(contains(run_gradcheck([](const std::vector<Tensor>& v) { return custom_shift(v[0], 0.0, 1.0, true); }, {x}),
                 "analytic"));
  CHECK(run_gradcheck([](const std::vector<Tensor>& v) { return custom_shift(v[0], 0.0, 1.0); }, {x}).empty());
  // An output that does not depend on the input: both gradients are zero (as PyTorch's gradcheck).
  CHECK(run_gradcheck([](const std::vector<Tensor>& v) { return ones({3}, TensorOptions(DType::f64)); }, {x}).empty());
  // ...but one that depends on it behind a detach (no gradient, a numerical derivative) still fails.
  CHECK(contains(run_gradcheck([](const std::vector<Tensor>& v) { return v[0].detach() * v[0].detach(); }, {x}),
                 "analytic 0 vs numerical"));
}

TEST_CASE("autograd: gradcheck refuses options that would check nothing or guess") {
  const Fn mul = [](const std::vector<Tensor>& v) { return v[0] * v[1]; };
  const Tensor x = rnd({3}, -1, 1, 1), y = rnd({3}, -1, 1, 2);
  CHECK(contains(run_gradcheck(mul, {}), "threw: gradcheck: no inputs"));
  GradcheckOptions shorter, longer, none;
  shorter.differentiate = {true};
  longer.differentiate = {true, false, true};
  none.differentiate = {false, false};
  CHECK(contains(run_gradcheck(mul, {x, y}, shorter), "differentiate has 1 entries for 2 inputs"));
  CHECK(contains(run_gradcheck(mul, {x, y}, longer), "differentiate has 3 entries for 2 inputs"));
  CHECK(contains(run_gradcheck(mul, {x, y}, none), "none of the 2 inputs is differentiated"));
  const Fn twice = [](const std::vector<Tensor>& v) { return v[0].to(DType::f64) * 2.0; };
  CHECK(contains(run_gradcheck(twice, {ones({2}, TensorOptions(DType::i64))}), "none of the 1 inputs"));
}

TEST_CASE("autograd: cast gradients come back in the leaf's dtype") {
  Tensor x = from_vector({1.5, -2, 0.25}, {3}, DType::f64);
  x.set_requires_grad(true);
  Tensor y = cast(x, DType::f32);
  CHECK(y.dtype() == DType::f32);
  CHECK(y.requires_grad());
  sum(y * y).backward();
  REQUIRE(x.grad().defined());
  CHECK(x.grad().dtype() == DType::f64);
  check_values(x.grad(), {3, -4, 0.5}, 1e-6, "d sum(cast(x)^2)");
  // f16 leaves get f16 gradients.
  Tensor h = from_vector({1, 2}, {2}, DType::f16);
  h.set_requires_grad(true);
  sum(cast(h, DType::f32) * 3.0).backward();
  REQUIRE(h.grad().defined());
  CHECK(h.grad().dtype() == DType::f16);
  check_values(h.grad(), {3, 3}, 1e-3, "f16 leaf");
  // A leaf in f32 used with an f64 tensor: the promoted op's gradient is cast back.
  Tensor f = from_vector({1, 2}, {2}, DType::f32);
  f.set_requires_grad(true);
  sum(f * from_vector({0.5, 4}, {2}, DType::f64)).backward();
  CHECK(f.grad().dtype() == DType::f32);
  check_values(f.grad(), {0.5, 4}, 1e-6, "promoted mul");
  // Casting to an integer type cuts the graph.
  CHECK(!cast(x, DType::i32).requires_grad());
}

// ---- gradcheck of views -------------------------------------------------------------------------------

TEST_CASE("autograd: gradcheck views made inside fn") {
  const Tensor m = rnd({3, 4}, -1, 1, 20);
  const Tensor c = rnd({2, 3, 4}, -1, 1, 21);
  const Tensor k = rnd({3, 1, 4}, -1, 1, 22);
  struct C {
    const char* name;
    Fn fn;
    const Tensor* in;
  };
  const std::vector<C> cases = {
      {"exp(t)", [](const std::vector<Tensor>& v) { return exp(v[0].t()); }, &m},
      {"t * weights", [](const std::vector<Tensor>& v) { return v[0].t() * arange(int64_t(3)).to(DType::f64); }, &m},
      {"permute", [](const std::vector<Tensor>& v) { return exp(v[0].permute({2, 0, 1})); }, &c},
      {"transpose", [](const std::vector<Tensor>& v) { return v[0].transpose(0, 2) * v[0].transpose(0, 2); }, &c},
      {"narrow", [](const std::vector<Tensor>& v) { return exp(v[0].narrow(1, 1, 2)); }, &c},
      {"narrow negative dim", [](const std::vector<Tensor>& v) { return v[0].narrow(-1, 1, 3) * 2.0; }, &c},
      {"slice step", [](const std::vector<Tensor>& v) { return exp(v[0].slice(2, 0, 4, 2)); }, &c},
      {"slice step offset", [](const std::vector<Tensor>& v) { return tanh(v[0].slice(2, 1, 4, 2)); }, &c},
      {"slice rows", [](const std::vector<Tensor>& v) { return v[0].slice(0, 1, 3) * v[0].slice(0, 0, 2); }, &m},
      {"select", [](const std::vector<Tensor>& v) { return exp(v[0].select(1, 2)); }, &c},
      {"select negative", [](const std::vector<Tensor>& v) { return v[0].select(-1, -1) * v[0].select(-1, 0); }, &c},
      {"expand", [](const std::vector<Tensor>& v) { return exp(v[0].expand({2, 3, 5, 4})); }, &k},
      {"expand -1", [](const std::vector<Tensor>& v) { return v[0].expand({-1, 3, -1}) * 3.0; }, &k},
      {"squeeze", [](const std::vector<Tensor>& v) { return exp(v[0].squeeze()); }, &k},
      {"squeeze dim", [](const std::vector<Tensor>& v) { return exp(v[0].squeeze(1)); }, &k},
      {"unsqueeze", [](const std::vector<Tensor>& v) { return exp(v[0].unsqueeze(0)) * v[0].unsqueeze(1); }, &m},
      {"unsqueeze last", [](const std::vector<Tensor>& v) { return exp(v[0].unsqueeze(-1)) * 2.0; }, &m},
      {"view", [](const std::vector<Tensor>& v) { return exp(v[0].view({4, 3})); }, &m},
      {"view -1", [](const std::vector<Tensor>& v) { return v[0].view({-1}) * v[0].view({-1}); }, &c},
      {"reshape (view)", [](const std::vector<Tensor>& v) { return exp(v[0].reshape({6, 4})); }, &c},
      {"reshape (copy)", [](const std::vector<Tensor>& v) { return exp(v[0].t().reshape({12})); }, &m},
      {"flatten", [](const std::vector<Tensor>& v) { return exp(v[0].flatten()); }, &c},
      {"flatten range", [](const std::vector<Tensor>& v) { return exp(v[0].flatten(1, 2)); }, &c},
      {"flatten of permuted", [](const std::vector<Tensor>& v) { return exp(v[0].permute({2, 1, 0}).flatten(0, 1)); }, &c},
      {"chain", [](const std::vector<Tensor>& v) {
         return exp(v[0].permute({1, 0, 2}).slice(2, 0, 4, 2).narrow(0, 1, 2).unsqueeze(1).expand({2, 3, 2, 2}).select(3, 1));
       }, &c},
      {"chain 2", [](const std::vector<Tensor>& v) {
         return v[0].t().reshape({2, 6}).slice(1, 1, 6, 2).t().contiguous().view({-1}) * v[0].view({-1}).narrow(0, 0, 6);
       }, &m},
      {"view of a view mixed with base", [](const std::vector<Tensor>& v) {
         return v[0] + v[0].t().t() * v[0].select(0, 1).unsqueeze(0);
       }, &m},
  };
  for (const C& cs : cases) GRADCHECK(cs.name, cs.fn, {*cs.in});
}

TEST_CASE("autograd: tied maxima share the gradient, max(dim) gives it to the first index") {
  Tensor x = from_vector({1, 3, 3, 2}, {4}, DType::f64);
  x.set_requires_grad(true);
  amax(x).backward();
  check_values(x.grad(), {0, 0.5, 0.5, 0}, 1e-12, "amax ties");
  Tensor y = from_vector({5, 1, 5, 2, 5, 5}, {2, 3}, DType::f64);
  y.set_requires_grad(true);
  sum(amax(y, {1}) * from_vector({3, 6}, {2}, DType::f64)).backward();
  check_values(y.grad(), {1.5, 0, 1.5, 0, 3, 3}, 1e-12, "amax ties per row");
  Tensor z = from_vector({-1, -4, -4, 0}, {4}, DType::f64);
  z.set_requires_grad(true);
  amin(z).backward();
  check_values(z.grad(), {0, 0.5, 0.5, 0}, 1e-12, "amin ties");
  Tensor w = from_vector({2, 7, 7, 1, 1, 0}, {2, 3}, DType::f64);
  w.set_requires_grad(true);
  auto mx = max(w, 1);
  check_values(mx.indices, {1, 0}, 0, "max indices");
  sum(mx.values).backward();
  check_values(w.grad(), {0, 1, 0, 1, 0, 0}, 1e-12, "max(dim) to the first index");
  CHECK(!mx.indices.requires_grad());
  Tensor u = from_vector({2, 7, 7, 1, 1, 0}, {2, 3}, DType::f64);
  u.set_requires_grad(true);
  sum(min(u, 1, true).values * 2.0).backward();
  check_values(u.grad(), {2, 0, 0, 0, 0, 2}, 1e-12, "min(dim) keepdim");
}

// ---- engine behaviour -------------------------------------------------------------------------------------

TEST_CASE("autograd: leaves, requires_grad and grad_fn") {
  Tensor x = leaf({3});
  CHECK(x.requires_grad());
  CHECK(x.is_leaf());
  CHECK(!x.grad().defined());
  Tensor y = exp(x);
  CHECK(y.requires_grad());
  CHECK(!y.is_leaf());
  CHECK(y.grad_fn() != nullptr);
  Tensor plain = rnd({3});
  CHECK(!plain.requires_grad());
  CHECK(!(plain * 2.0).requires_grad());
  CHECK(!exp(plain).grad_fn());
  CHECK((plain + x).requires_grad());
  // Comparisons are not differentiable.
  CHECK(!gt(x, plain).requires_grad());
  CHECK(!argmax(x, 0).requires_grad());
  // Views of leaves are not leaves.
  CHECK(!x.view({3, 1}).is_leaf());
  CHECK(x.view({3, 1}).requires_grad());
  // As torch: flagging a non-leaf (which requires grad through its inputs) is a no-op, clearing
  // the flag is an error that points at detach().
  CHECK(&y.set_requires_grad(true) == &y);
  CHECK(y.requires_grad());
  CHECK(y.grad_fn() != nullptr);
  CHECK(contains(error_of([&] { x.view({3}).set_requires_grad(false); }), "use detach()"));
  // Clearing the flag on a leaf works.
  Tensor z = leaf({2});
  z.set_requires_grad(false);
  CHECK(!z.requires_grad());
  CHECK(!exp(z).requires_grad());
  // Factories can make leaves that require grad.
  Tensor f = zeros({2}, TensorOptions(DType::f64).with_grad());
  CHECK(f.requires_grad());
  CHECK(f.is_leaf());
}

TEST_CASE("autograd: gradients accumulate into leaves across backward calls") {
  Tensor x = from_vector({1, -2, 3}, {3}, DType::f64);
  x.set_requires_grad(true);
  sum(x * x).backward();
  check_values(x.grad(), {2, -4, 6}, 1e-12, "first backward");
  CHECK(x.grad().shape() == Shape{3});
  CHECK(x.grad().dtype() == DType::f64);
  sum(x * x).backward();
  check_values(x.grad(), {4, -8, 12}, 1e-12, "accumulated");
  sum(x * 3.0).backward();
  check_values(x.grad(), {7, -5, 15}, 1e-12, "accumulated other graph");
  x.set_grad(Tensor());
  CHECK(!x.grad().defined());
  sum(x).backward();
  check_values(x.grad(), {1, 1, 1}, 1e-12, "after reset");
  // The gradient buffer is not the incoming gradient of some other tensor: changing one later
  // does not change the other.
  Tensor a = from_vector({1, 2}, {2}, DType::f64);
  a.set_requires_grad(true);
  Tensor b = from_vector({3, 4}, {2}, DType::f64);
  b.set_requires_grad(true);
  sum(a + b).backward();
  check_values(a.grad(), {1, 1}, 0, "a");
  check_values(b.grad(), {1, 1}, 0, "b");
  {
    NoGradGuard ng;
    a.grad().mul_(10.0);
  }
  check_values(b.grad(), {1, 1}, 0, "b after scaling a.grad");
  // Broadcast leaves get gradients of their own shape.
  Tensor bias = from_vector({0, 0, 0, 0}, {4}, DType::f64);
  bias.set_requires_grad(true);
  Tensor m = rnd({3, 4}, -1, 1, 70);
  m.set_requires_grad(true);
  sum((m + bias) * 2.0).backward();
  CHECK(bias.grad().shape() == Shape{4});
  check_values(bias.grad(), {6, 6, 6, 6}, 1e-12, "broadcast bias");
  Tensor s = scalar_tensor(2.0, DType::f64);
  s.set_requires_grad(true);
  sum(m * s).backward();
  CHECK(s.grad().dim() == 0);
  double total = 0;
  for (double v : m.to_vector()) total += v;
  check_values(s.grad(), {total}, 1e-12, "0-dim leaf");
}

TEST_CASE("autograd: retain_graph") {
  Tensor x = from_vector({0.5, -1}, {2}, DType::f64);
  x.set_requires_grad(true);
  Tensor y = sum(exp(x) * x);
  y.backward(Tensor(), true);
  const std::vector<double> g1 = {std::exp(0.5) * 1.5, std::exp(-1.0) * 0.0};
  check_values(x.grad(), g1, 1e-12, "first");
  y.backward();  // the graph was retained
  check_values(x.grad(), {2 * g1[0], 2 * g1[1]}, 1e-12, "second");
  // Now it was freed: a third backward is an error, not a crash or silent zeros.
  const std::string e = error_of([&] { y.backward(); });
  CHECK(e != "NO ERROR");
  CHECK(!contains(e, "NOT A kiln::Error"));
  check_values(x.grad(), {2 * g1[0], 2 * g1[1]}, 1e-12, "unchanged after the failed backward");
  // Without retain_graph the second call fails.
  Tensor z = sum(tanh(x) * x);
  z.backward();
  CHECK_THROWS_AS(z.backward(), Error);
}

TEST_CASE("autograd: an in-place write of an operand that requires grad is refused while grad mode is on") {
  // Kiln does not record in-place ops: copying w * 3 into a plain tensor would lose w's gradient silently.
  Tensor w = leaf({3});
  Tensor z = zeros({3}, DType::f64);
  const std::vector<double> before = z.to_vector();
  std::string msg;
  try {
    z.copy_(w * 3.0);
  } catch (const Error& e) {
    msg = e.message();
  }
  CHECK(msg.find("copy_: the operand") == 0);
  CHECK(msg.find("requires grad") != std::string::npos);
  CHECK(contains(msg, "kiln.no_grad() in Python"));
  CHECK(contains(error_of([&] { w.fill_(1.0); }), "fill_: in-place update of a tensor that requires grad"));
  CHECK(contains(error_of([&] { w.fill_(1.0); }), "NoGradGuard (kiln.no_grad() in Python)"));
  CHECK_THROWS_AS(z.add_(w), Error);
  CHECK_THROWS_AS(z.add_(w, -1.0), Error);
  CHECK_THROWS_AS(z.mul_(exp(w)), Error);
  CHECK(z.to_vector() == before);
  {
    NoGradGuard ng;  // the gradient is not wanted: allowed
    z.copy_(w);
    z.add_(w);
  }
  CHECK(z.to_vector() == (w.detach() * 2.0).to_vector());
  z.mul_(w.detach());  // an operand without grad: allowed
  z.add_(ones({3}, DType::f64));
}

TEST_CASE("autograd: NoGradGuard and detach") {
  Tensor x = leaf({3});
  CHECK(GradMode::enabled());
  {
    NoGradGuard ng;
    CHECK(!GradMode::enabled());
    Tensor y = exp(x) * x;
    CHECK(!y.requires_grad());
    CHECK(!y.grad_fn());
    CHECK(!matmul(x, x).requires_grad());
    CHECK(!x.unsqueeze(0).requires_grad());
    CHECK(!sum(x).requires_grad());
    {
      NoGradGuard inner;
      CHECK(!GradMode::enabled());
    }
    CHECK(!GradMode::enabled());  // the inner guard restores the outer state
  }
  CHECK(GradMode::enabled());
  CHECK(exp(x).requires_grad());
  GradMode::set_enabled(false);
  CHECK(!exp(x).requires_grad());
  GradMode::set_enabled(true);
  // detach: same data, no graph.
  Tensor y = exp(x);
  Tensor d = y.detach();
  CHECK(!d.requires_grad());
  CHECK(d.is_leaf());
  CHECK(d.storage().get() == y.storage().get());
  CHECK(!exp(d).requires_grad());
  Tensor loss = sum(y * d);  // d is a constant: d(loss)/dx = exp(x) * d = exp(2x)
  loss.backward();
  std::vector<double> want;
  for (double v : x.to_vector()) want.push_back(std::exp(2 * v));
  check_values(x.grad(), want, 1e-12, "detached factor");
}

TEST_CASE("autograd: a saved tensor modified in place makes backward fail naming the op") {
  Tensor x = leaf({3});
  Tensor y = exp(x);
  Tensor z = sum(y);
  {
    NoGradGuard ng;
    y.add_(ones({3}, DType::f64));
  }
  const std::string e = error_of([&] { z.backward(); });
  CHECK(contains(e, "exp"));
  CHECK(!contains(e, "NOT A kiln::Error"));
  // The same through a detached alias (shared storage, shared version).
  Tensor x2 = leaf({3});
  Tensor y2 = exp(x2);
  Tensor z2 = sum(y2 * 2.0);
  y2.detach().mul_(3.0);
  const std::string e2 = error_of([&] { z2.backward(); });
  CHECK(contains(e2, "exp"));
  // A constant input saved by mul, modified afterwards.
  Tensor w = leaf({3});
  Tensor c = rnd({3}, -1, 1, 80);
  Tensor p = sum(w * c);
  c.fill_(0.0);
  const std::string e3 = error_of([&] { p.backward(); });
  CHECK(contains(e3, "mul"));
  // A user op's SavedTensor names the user op.
  Tensor u = leaf({2});
  Tensor cs = sum(custom_square(u, 2.0));
  {
    NoGradGuard ng;
    u.add_(ones({2}, DType::f64));
  }
  CHECK(contains(error_of([&] { cs.backward(); }), "custom_square"));
  // Modifying a tensor that was not saved is fine: add saves nothing.
  Tensor q = leaf({2});
  Tensor k = rnd({2}, -1, 1, 81);
  Tensor r = sum(q + k);
  k.fill_(5.0);
  CHECK_NOTHROW(r.backward());
  check_values(q.grad(), {1, 1}, 0, "add after modifying the constant");
}

TEST_CASE("autograd: diamonds sum the gradients of every use") {
  Tensor x = from_vector({0.3, -0.7, 1.1}, {3}, DType::f64);
  x.set_requires_grad(true);
  Tensor y = sum(x * x + exp(x) + x * 3.0);
  y.backward();
  std::vector<double> want;
  for (double v : x.to_vector()) want.push_back(2 * v + std::exp(v) + 3);
  check_values(x.grad(), want, 1e-12, "x used four times");
  // A diamond on an intermediate: a = 2x, b = a * a + a.
  Tensor x2 = from_vector({1, 2}, {2}, DType::f64);
  x2.set_requires_grad(true);
  Tensor a = x2 * 2.0;
  sum(a * a + a).backward();
  check_values(x2.grad(), {2 * (2 * 2 + 1), 2 * (2 * 4 + 1)}, 1e-12, "intermediate used twice");  // d/dx = 2(2a + 1)
  // Through views of the same leaf.
  Tensor m = from_vector({1, 2, 3, 4}, {2, 2}, DType::f64);
  m.set_requires_grad(true);
  sum(m.t() * m).backward();  // sum_ij m_ji m_ij: d/dm_ij = 2 m_ji
  check_values(m.grad(), {2, 6, 4, 8}, 1e-12, "m.t() * m");
  GRADCHECK("deep diamond", [](const std::vector<Tensor>& v) {
    Tensor a = tanh(v[0]);
    Tensor b = a * v[0];
    Tensor c = exp(a) + b;
    return c * a + sum(b) * v[0];
  }, {rnd({4}, -1, 1, 90)});
}

TEST_CASE("autograd: several roots at once") {
  Tensor x = from_vector({1, 2}, {2}, DType::f64);
  x.set_requires_grad(true);
  Tensor y1 = sum(x * x);
  Tensor y2 = x * 3.0;
  autograd::backward({y1, y2}, {Tensor(), from_vector({1, -1}, {2}, DType::f64)});
  check_values(x.grad(), {2 + 3, 4 - 3}, 1e-12, "two roots");
}

TEST_CASE("autograd: a chain of 300000 ops is freed and run backward without recursing through the stack") {
  // The nodes behind a dying one went recursively: 200000 overflowed an 8 MB stack.
  {
    Tensor w = leaf({2});
    Tensor y = w;
    for (int i = 0; i < 300000; ++i) y = y * 1.0;
  }  // freed here
  Tensor w = leaf({1});
  Tensor y = w;
  for (int i = 0; i < 300000; ++i) y = y + 1.0;
  sum(y).backward();
  check_values(w.grad(), {1}, 0, "deep chain");
}

TEST_CASE("autograd: a custom backward's mistakes are named with its op") {
  Tensor x = leaf({3, 4});
  const auto with = [&](BackwardFn fn) {
    Tensor out = x.detach() * 2.0;
    autograd::record("my_op", {x}, {out}, std::move(fn));
    return error_of([&] { sum(out).backward(); });
  };
  CHECK(contains(with([](const GradCtx& c) {
                   return std::vector<Tensor>{c.g(), c.g()};
                 }),
                 "my_op backward returned 2 gradient(s) for its 1 input(s)"));
  CHECK(contains(with([](const GradCtx& c) { return std::vector<Tensor>{c.g().transpose(0, 1).contiguous()}; }),
                 "my_op backward: the gradient for input 0 has shape [4,3], which is neither the input's shape [3,4]"));
  CHECK(contains(with([](const GradCtx& c) { return std::vector<Tensor>{c.g(3)}; }),
                 "my_op backward: asked for the gradient of output 3, but the op recorded 1 output(s)"));
  CHECK(contains(with([](const GradCtx& c) { return std::vector<Tensor>{c.needs_grad(7) ? c.g() : c.g()}; }),
                 "my_op backward: asked whether input 7 needs a gradient, but the op recorded 1 input(s)"));
  // A broadcast gradient is still folded back.
  CHECK(with([](const GradCtx& c) { return std::vector<Tensor>{c.g().unsqueeze(0).expand({2, 3, 4})}; }) == "NO ERROR");
  // The output must not be the input itself, nor undefined.
  CHECK(contains(error_of([&] {
                   autograd::record("ident", {x}, {x}, [](const GradCtx& c) { return std::vector<Tensor>{c.g()}; });
                 }),
                 "ident: output 0 is input 0 itself"));
  CHECK(x.grad_fn() == nullptr);  // still a leaf
  CHECK(contains(error_of([&] {
                   autograd::record("undef", {x}, {Tensor()},
                                    [](const GradCtx& c) { return std::vector<Tensor>{c.g()}; });
                 }),
                 "undef: output 0 given to autograd::record is an undefined tensor"));
  // After a backward that failed partway the message says the graph may be spent.
  Tensor y = x * 3.0;
  Tensor out = y.detach() * 1.0;
  autograd::record("fails", {y}, {out}, [](const GradCtx&) -> std::vector<Tensor> { KILN_FAIL("from backward"); });
  CHECK(contains(error_of([&] { sum(out).backward(); }), "from backward"));
}

TEST_CASE("autograd: backward errors") {
  Tensor x = leaf({3});
  Tensor y = x * 2.0;
  const std::string e = error_of([&] { y.backward(); });
  CHECK(e != "NO ERROR");
  CHECK(!contains(e, "NOT A kiln::Error"));
  CHECK(contains(e, "[3]"));
  // With a gradient it works.
  y.backward(from_vector({1, 2, 3}, {3}, DType::f64));
  check_values(x.grad(), {2, 4, 6}, 1e-12, "with grad_output");
  // A gradient of the wrong shape is an error.
  Tensor y2 = x * 2.0;
  CHECK_THROWS_AS(y2.backward(ones({4}, DType::f64)), Error);
  // Backward from something that does not require grad.
  CHECK_THROWS_AS(sum(rnd({3})).backward(), Error);
  // A one-element non-scalar needs no gradient.
  Tensor one = leaf({1, 1});
  CHECK_NOTHROW((one * 5.0).backward());
  check_values(one.grad(), {5}, 1e-12, "[1,1] root");
}

TEST_CASE("autograd: autograd::grad does not touch .grad") {
  Tensor x = from_vector({1, 2, 3}, {3}, DType::f64);
  x.set_requires_grad(true);
  Tensor w = from_vector({-1, 0.5, 2}, {3}, DType::f64);
  w.set_requires_grad(true);
  Tensor y = sum(x * x * w);
  std::vector<Tensor> g = autograd::grad({y}, {x, w}, {}, true);
  REQUIRE(g.size() == 2);
  check_values(g[0], {-2, 2, 12}, 1e-12, "dy/dx");
  check_values(g[1], {1, 4, 9}, 1e-12, "dy/dw");
  CHECK(!x.grad().defined());
  CHECK(!w.grad().defined());
  // The graph was retained: backward still works and fills .grad.
  y.backward();
  check_values(x.grad(), {-2, 2, 12}, 1e-12, ".grad after backward");
  // With explicit output gradients, and with respect to an intermediate.
  Tensor x2 = from_vector({0.5, 1.5}, {2}, DType::f64);
  x2.set_requires_grad(true);
  Tensor h = exp(x2);
  Tensor out = h * h;
  std::vector<Tensor> gh = autograd::grad({out}, {h, x2}, {from_vector({1, 10}, {2}, DType::f64)});
  check_values(gh[0], {2 * std::exp(0.5), 20 * std::exp(1.5)}, 1e-12, "d out / d h");
  check_values(gh[1], {2 * std::exp(1.0), 20 * std::exp(3.0)}, 1e-12, "d out / d x");
  CHECK(!x2.grad().defined());
  // An input the outputs do not depend on gets zeros.
  Tensor a = leaf({2});
  Tensor b = leaf({2});
  std::vector<Tensor> gz = autograd::grad({sum(a * 2.0)}, {a, b});
  check_values(gz[0], {2, 2}, 1e-12, "used");
  REQUIRE(gz[1].defined());
  check_values(gz[1], {0, 0}, 0, "unused");
  // materialize = false leaves it undefined (torch's allow_unused=True).
  std::vector<Tensor> gu = autograd::grad({sum(a * 2.0)}, {a, b}, {}, false, /*materialize=*/false);
  check_values(gu[0], {2, 2}, 1e-12, "used");
  CHECK(!gu[1].defined());
  CHECK(!a.grad().defined());
  CHECK(!b.grad().defined());
  CHECK_THROWS_AS(autograd::grad({sum(a * 2.0)}, {rnd({2})}), Error);  // input does not require grad
}

// ---- grad-ready hooks -------------------------------------------------------------------------------------

TEST_CASE("autograd: grad-ready hook fires once per leaf per backward, after the gradient is complete") {
  Tensor w = from_vector({0.2, -0.4, 0.9}, {3}, DType::f64);
  w.set_requires_grad(true);
  // d/dw of sum(w*w) + sum(exp(w)) + sum(3w) + sum(tanh(tanh(w))) (the long path arrives last)
  std::vector<double> want(3);
  for (size_t i = 0; i < want.size(); ++i) {
    const double v = w.to_vector()[i];
    const double t1 = std::tanh(v), t2 = std::tanh(t1);
    want[i] = 2 * v + std::exp(v) + 3 + (1 - t2 * t2) * (1 - t1 * t1);
  }
  int calls = 0;
  std::vector<double> seen;
  const int id = w.register_grad_ready_hook([&](Tensor& t) {
    ++calls;
    CHECK(t.same(w));
    seen = t.grad().to_vector();
  });
  auto forward = [&] { return sum(w * w) + sum(exp(w)) + sum(w * 3.0) + sum(tanh(tanh(w))); };
  forward().backward();
  CHECK(calls == 1);
  REQUIRE(seen.size() == 3);
  for (size_t i = 0; i < 3; ++i) CHECK(std::abs(seen[i] - want[i]) < 1e-12);
  forward().backward();
  CHECK(calls == 2);
  for (size_t i = 0; i < 3; ++i) CHECK(std::abs(seen[i] - 2 * want[i]) < 1e-12);  // accumulated
  w.remove_grad_ready_hook(id);
  forward().backward();
  CHECK(calls == 2);
  // A leaf that the loss does not reach does not fire.
  Tensor unused = leaf({2});
  int unused_calls = 0;
  unused.register_grad_ready_hook([&](Tensor&) { ++unused_calls; });
  sum(w).backward();
  CHECK(unused_calls == 0);
  // Hooks need a leaf that requires grad.
  CHECK_THROWS_AS(exp(w).register_grad_ready_hook([](Tensor&) {}), Error);
}

TEST_CASE("autograd: grad-ready hooks fire in reverse order of use for a chain of layers") {
  Tensor x = rnd({4, 3}, -1, 1, 100);
  Tensor w1 = leaf({3, 5}, -1, 1, 101), b1 = leaf({5}, -1, 1, 102);
  Tensor w2 = leaf({5, 5}, -1, 1, 103), b2 = leaf({5}, -1, 1, 104);
  Tensor w3 = leaf({5, 2}, -1, 1, 105);
  std::vector<std::string> order;
  std::vector<std::pair<Tensor*, std::string>> params = {{&w1, "w1"}, {&b1, "b1"}, {&w2, "w2"}, {&b2, "b2"}, {&w3, "w3"}};
  for (auto& [p, name] : params) {
    const std::string n = name;
    Tensor* pp = p;
    p->register_grad_ready_hook([&order, n, pp](Tensor& t) {
      order.push_back(n);
      CHECK(t.grad().defined());
      CHECK(t.grad().shape() == pp->shape());
    });
  }
  auto step = [&] {
    Tensor h1 = tanh(matmul(x, w1) + b1);
    Tensor h2 = tanh(matmul(h1, w2) + b2);
    return mean(matmul(h2, w3) * matmul(h2, w3));
  };
  step().backward();
  // Each fires once; a later layer's parameters are ready before an earlier layer's.
  REQUIRE(order.size() == 5);
  auto pos = [&](const std::string& n) { return std::find(order.begin(), order.end(), n) - order.begin(); };
  CHECK(pos("w3") < pos("w2"));
  CHECK(pos("w3") < pos("b2"));
  CHECK(pos("w2") < pos("w1"));
  CHECK(pos("b2") < pos("b1"));
  CHECK(pos("w2") < pos("b1"));
  CHECK(pos("b2") < pos("w1"));
  CHECK(order.front() == "w3");
  order.clear();
  step().backward();
  CHECK(order.size() == 5);
  // The gradients the hooks saw are the full ones: compare with autograd::grad on a fresh graph.
  Tensor w1_grad_twice = w1.grad().clone();
  std::vector<Tensor> g = autograd::grad({step()}, {w1});
  check_values(w1_grad_twice, [&] {
    std::vector<double> v = g[0].to_vector();
    for (double& e : v) e *= 2;
    return v;
  }(), 1e-10, "w1 grad after two steps");
}

TEST_CASE("autograd: register_hook sees and replaces the gradient of leaves and non-leaves; retain_grad keeps it") {
  Tensor x = from_vector({1, 2, 3}, {3});
  x.set_requires_grad(true);
  std::vector<double> seen_x, seen_y;
  const int hx = x.register_hook([&](const Tensor& g) {
    seen_x = g.to_vector();
    return g * 2.0;  // doubles what reaches x.grad
  });
  Tensor y = x * 3.0;
  y.retain_grad();
  CHECK(y.retains_grad());
  const int hy = y.register_hook([&](const Tensor& g) {
    seen_y = g.to_vector();
    return g + 1.0;  // changes what flows on to x, and what y keeps
  });
  sum(y * y).backward();  // dL/dy = 2y = [6, 12, 18]
  CHECK(seen_y == std::vector<double>{6, 12, 18});
  CHECK(y.grad().to_vector() == std::vector<double>{7, 13, 19});  // kept after its hook, as torch
  CHECK(seen_x == std::vector<double>{21, 39, 57});
  CHECK(x.grad().to_vector() == std::vector<double>{42, 78, 114});
  // Removed hooks no longer run; a retained gradient sums over backward passes, as a leaf's.
  x.remove_hook(hx);
  y.remove_hook(hy);
  x.set_grad(Tensor());
  Tensor y2 = x * 3.0;
  y2.retain_grad();
  sum(y2 * y2).backward(Tensor(), /*retain_graph=*/true);
  sum(y2 * y2).backward();
  CHECK(x.grad().to_vector() == std::vector<double>{36, 72, 108});
  CHECK(y2.grad().to_vector() == std::vector<double>{12, 24, 36});
  // Without retain_grad a non-leaf keeps nothing; on a leaf retain_grad is a no-op.
  Tensor y3 = x * 3.0;
  sum(y3).backward();
  CHECK(!y3.grad().defined());
  x.retain_grad();
  CHECK(!x.retains_grad());
  // Errors: a hook returning another shape names both; a tensor without grad takes no hook.
  Tensor w = from_vector({1, 2}, {2});
  w.set_requires_grad(true);
  w.register_hook([](const Tensor&) { return ones({3}); });
  CHECK(contains(error_of([&] { sum(w * 2.0).backward(); }),
                 "returned a gradient f32 cpu [3] for the gradient f32 cpu [2]"));
  CHECK(
      contains(error_of([] { ones({2}).register_hook([](const Tensor& g) { return g; }); }), "does not require grad"));
  CHECK(contains(error_of([] { ones({2}).retain_grad(); }), "does not require grad"));
}

TEST_CASE("autograd: register_hook runs in autograd::grad and for an output the loss does not reach, never") {
  Tensor x = from_vector({1, 2}, {2});
  x.set_requires_grad(true);
  int unused_calls = 0;
  Tensor a = x * 2.0, b = x * 5.0;
  b.register_hook([&](const Tensor& g) {
    ++unused_calls;
    return g;
  });
  x.register_hook([](const Tensor& g) { return g * 10.0; });
  // A leaf the loss reaches but autograd::grad was not asked about keeps its hooks quiet.
  Tensor p = from_vector({3, 4}, {2});
  p.set_requires_grad(true);
  int p_calls = 0;
  p.register_hook([&](const Tensor& g) {
    ++p_calls;
    return g;
  });
  const std::vector<Tensor> g = autograd::grad({sum(a) + sum(p * x)}, {x});
  CHECK(g[0].to_vector() == std::vector<double>{50, 60});  // the leaf's hook ran before the capture
  CHECK(!x.grad().defined());
  CHECK(unused_calls == 0);
  CHECK(p_calls == 0);
  sum(p * x).backward();
  CHECK(p_calls == 1);
}

namespace {

// Lets `n` threads through together, round after round: they spin, so they leave at the same instant.
class SpinBarrier {
 public:
  explicit SpinBarrier(int n) : n_(n) {}
  void wait() {
    const int gen = gen_.load();
    if (waiting_.fetch_add(1) + 1 == n_) {
      waiting_.store(0);
      gen_.fetch_add(1);
    } else {
      while (gen_.load() == gen) std::this_thread::yield();
    }
  }

 private:
  const int n_;
  std::atomic<int> waiting_{0}, gen_{0};
};

}  // namespace

TEST_CASE("autograd: two threads running backward into a shared leaf both land in its .grad") {
  // w*1 and w*2 on one leaf, each backward in its own thread at the same instant: the grad is 3
  // everywhere. Without a lock both threads found .grad unset and one gradient was lost, or both
  // add_ed into the same buffer at once and lost elements (about 1 round in 100).
  constexpr int rounds = 2000;
  constexpr int64_t n = 50000;
  std::vector<Tensor> ys(2);
  SpinBarrier start(3), done(3);
  std::atomic<bool> stop{false};
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t)
    threads.emplace_back([&, t] {
      while (true) {
        start.wait();
        if (stop.load()) return;
        try {
          ys[size_t(t)].backward();
        } catch (const std::exception& e) {
          errors[size_t(t)] = e.what();
        }
        done.wait();
      }
    });
  int wrong = 0;
  for (int r = 0; r < rounds; ++r) {
    Tensor w = zeros({n});
    w.set_requires_grad(true);
    if (r % 2) w.set_grad(zeros({n}));  // both paths: .grad unset, and .grad already there
    ys[0] = sum(w * 1.0);
    ys[1] = sum(w * 2.0);
    start.wait();
    done.wait();
    const std::vector<double> g = w.grad().defined() ? w.grad().to_vector() : std::vector<double>{};
    if (g.size() != size_t(n) || std::any_of(g.begin(), g.end(), [](double v) { return v != 3.0; })) ++wrong;
  }
  stop.store(true);
  start.wait();
  for (std::thread& th : threads) th.join();
  CHECK(errors[0] == "");
  CHECK(errors[1] == "");
  CHECK_MESSAGE(wrong == 0, wrong, " of ", rounds, " rounds lost a gradient");
}

TEST_CASE("autograd: threads building graphs on a shared leaf and running backward share one accumulator") {
  // Each thread builds sum(w * x) and runs backward over and over, the others doing the same on the
  // same leaf: the leaf's accumulator is created and looked up from all of them at once. It was read
  // and written unlocked: threads got accumulators freed under them ("pure virtual method called").
  constexpr int threads_n = 4, iters = 20000;
  Tensor w = zeros({8});
  w.set_requires_grad(true);
  SpinBarrier start(threads_n);
  std::vector<std::string> errors(threads_n);
  std::vector<std::thread> threads;
  for (int t = 0; t < threads_n; ++t)
    threads.emplace_back([&, t] {
      start.wait();
      try {
        const Tensor x = ones({8});
        for (int i = 0; i < iters; ++i) sum(w * x).backward();
      } catch (const std::exception& e) {
        errors[size_t(t)] = e.what();
      }
    });
  for (std::thread& th : threads) th.join();
  for (const std::string& e : errors) CHECK(e == "");
  REQUIRE(w.grad().defined());
  for (double v : w.grad().to_vector()) CHECK(v == double(threads_n * iters));
}

// ---- second derivatives (create_graph); every op's are checked by the op table ----

namespace {
// y = x^3 with a backward recorded as once differentiable: first derivatives only.
Tensor custom_cube_once(const Tensor& x) {
  Tensor out;
  {
    NoGradGuard ng;
    out = x * x * x;
  }
  SavedTensor sx(x);
  autograd::record(
      "custom_cube_once", {x}, {out},
      [sx](const GradCtx& c) -> std::vector<Tensor> {
        const Tensor xs = sx.unpack("custom_cube_once");
        return {c.g() * xs * xs * 3.0};
      },
      {.once_differentiable = true});
  return out;
}

// y = exp(x), saving its output for backward (as exp does): the saved output's history is the op's own node.
Tensor custom_exp(const Tensor& x) {
  Tensor out;
  {
    NoGradGuard ng;
    out = exp(x);
  }
  SavedTensor so(out);
  autograd::record("custom_exp", {x}, {out}, [so](const GradCtx& c) -> std::vector<Tensor> {
    return {c.g() * so.unpack("custom_exp")};
  });
  return out;
}
}  // namespace

TEST_CASE("autograd: create_graph gives gradients with a history, differentiated again") {
  const Tensor x = leaf({5}, -2, 2, 3);
  const std::vector<double> xv = x.to_vector();
  // d/dx x^3 = 3 x^2, then d/dx sum(3 x^2) = 6 x; the third derivative is 6.
  const Tensor g = autograd::grad({sum(x * x * x)}, {x}, {}, false, true, /*create_graph=*/true)[0];
  CHECK(g.requires_grad());
  const Tensor h = autograd::grad({sum(g)}, {x}, {}, false, true, true)[0];
  const Tensor t = autograd::grad({sum(h)}, {x})[0];
  std::vector<double> want_g, want_h, want_t;
  for (double v : xv) want_g.push_back(3 * v * v), want_h.push_back(6 * v), want_t.push_back(6);
  check_values(g, want_g, 1e-12, "first");
  check_values(h, want_h, 1e-12, "second");
  check_values(t, want_t, 1e-12, "third");
  // Without create_graph the gradient has no history.
  CHECK(!autograd::grad({sum(x * x * x)}, {x})[0].requires_grad());
  // A Hessian-vector product of a small tanh layer against finite differences of its gradient.
  const Tensor w = leaf({4, 5}, -1, 1, 4), v = rnd({4, 5}, -1, 1, 5);
  auto grad_w = [&](const Tensor& wt, bool create) {
    return autograd::grad({sum(tanh(matmul(wt, x.detach().reshape({5, 1}))) * 0.7)}, {wt}, {}, false, true, create)[0];
  };
  const Tensor hv = autograd::grad({sum(grad_w(w, true) * v)}, {w})[0];
  const double eps = 1e-6;
  Tensor wp = (w.detach() + v * eps).set_requires_grad(true), wm = (w.detach() - v * eps).set_requires_grad(true);
  const Tensor fd = (grad_w(wp, false) - grad_w(wm, false)) / (2 * eps);
  check_values(hv, fd.to_vector(), 1e-6, "Hessian-vector product");
}

TEST_CASE("autograd: backward(create_graph) leaves .grad with a history; a second backward adds to it") {
  // As torch: y = x^3; y.backward(create_graph) gives x.grad = 3x^2 (with a graph); x.grad.sum().backward()
  // then adds 6x to it.
  Tensor x = from_vector(std::vector<double>{1.5, -2.0}, {2}, DType::f64).set_requires_grad(true);
  sum(x * x * x).backward(Tensor(), false, /*create_graph=*/true);
  const Tensor g1 = x.grad();
  CHECK(g1.requires_grad());
  check_values(g1, {6.75, 12.0}, 1e-12, "first");
  sum(g1).backward();
  check_values(x.grad(), {6.75 + 9.0, 12.0 - 12.0}, 1e-12, "accumulated");
  // A saved output (exp saves its result) takes its history from the op's own node.
  const Tensor z = from_vector(std::vector<double>{0.3, -1.1}, {2}, DType::f64).set_requires_grad(true);
  const Tensor gz = autograd::grad({sum(custom_exp(z))}, {z}, {}, false, true, true)[0];
  const Tensor hz = autograd::grad({sum(gz)}, {z})[0];
  check_values(hz, {std::exp(0.3), std::exp(-1.1)}, 1e-12, "exp twice");
  const Tensor hz2 = autograd::grad({sum(autograd::grad({sum(exp(z) * sigmoid(z))}, {z}, {}, false, true, true)[0])},
                                    {z})[0];
  std::vector<double> want;
  for (double v : {0.3, -1.1}) {
    // f = e^v s(v); f'' = e^v (s + 2 s' + s''), s' = s(1-s), s'' = s'(1-2s)
    const double s = 1 / (1 + std::exp(-v)), s1 = s * (1 - s), s2 = s1 * (1 - 2 * s);
    want.push_back(std::exp(v) * (s + 2 * s1 + s2));
  }
  check_values(hz2, want, 1e-12, "exp * sigmoid twice");
}

TEST_CASE("autograd: softmax, layer_norm and cross_entropy on 16-bit inputs differentiate twice with every term") {
  // Their kernels read f32 copies, which have no history: the recorded backward must use the 16-bit
  // output (softmax) or input (layer_norm, cross_entropy) itself, else a Hessian-vector product
  // silently drops the terms through it. Against the same product in f64.
  const Tensor x = rnd({4, 6}, -2, 2, 11), w = rnd({4, 6}, -1, 1, 12), v = rnd({4, 6}, -1, 1, 13);
  const Tensor gamma = rnd({6}, 0.5, 1.5, 14), beta = rnd({6}, -1, 1, 15);
  const Tensor target = from_vector(std::vector<double>{1, 5, 0, 3}, {4}, DType::f64).to(DType::i64);
  const std::vector<std::pair<const char*, std::function<Tensor(const Tensor&)>>> ops{
      {"softmax", [](const Tensor& t) { return softmax(t, 1); }},
      {"log_softmax", [](const Tensor& t) { return log_softmax(t, 1); }},
      {"masked_softmax", [](const Tensor& t) { return masked_softmax(t, Tensor(), 0.7); }},
      {"layer_norm", [&](const Tensor& t) { return layer_norm(t, {6}, gamma.to(t.dtype()), beta.to(t.dtype())); }},
      {"cross_entropy", [&](const Tensor& t) { return cross_entropy(t, target, -100, 0.1, Reduction::none); }},
      {"batch_norm", [&](const Tensor& t) {
         return batch_norm(t, Tensor(), Tensor(), gamma.to(t.dtype()), beta.to(t.dtype()), true, 0.1, 1e-5);
       }},
  };
  for (const auto& entry : ops) {
    const char* name = entry.first;
    const std::function<Tensor(const Tensor&)>& op = entry.second;
    auto hvp = [&](DType dt) {
      Tensor xl = x.to(dt);
      xl.set_requires_grad(true);
      const Tensor y = cast(op(xl), DType::f64);
      const Tensor wy = y.dim() == 2 ? w : w.select(1, 0);  // cross_entropy's rows: [4]
      const Tensor g = autograd::grad({sum(y * y * wy)}, {xl}, {}, false, true, true)[0];
      return cast(autograd::grad({sum(cast(g, DType::f64) * v)}, {xl})[0], DType::f64);
    };
    const Tensor want = hvp(DType::f64);
    for (DType dt : {DType::f16, DType::bf16}) {
      const double scale = amax(abs(want)).item_double();
      const double err = amax(abs(hvp(dt) - want)).item_double();
      CHECK_MESSAGE(err <= 0.05 * scale, std::string(name), dt == DType::f16 ? " in f16" : " in bf16",
                    ": Hessian-vector product off by ", err, " (largest ", scale, ")");
    }
  }
}

TEST_CASE("autograd: Hessian-vector products through conv2d, conv_transpose2d, pooling and batch norm") {
  // d/dt grad(f)(x + t v) at t = 0 by central differences of the first gradient, against the
  // gradient of <grad f(x), v> from a backward with create_graph; the weights' Hessian too.
  const Tensor w1 = rnd({4, 2, 3, 3}, -0.5, 0.5, 21), w2 = rnd({4, 3, 2, 2}, -0.5, 0.5, 22);
  const Tensor gamma = rnd({3}, 0.5, 1.5, 23), beta = rnd({3}, -0.3, 0.3, 24);
  auto f = [&](const Tensor& x, const Tensor& a, const Tensor& b, bool training) {
    Tensor h = tanh(conv2d(x, a, Tensor(), {2, 1}, {1, 1}, {1, 2}, 2));
    h = max_pool2d(h, {2, 2}, {1, 1}, {1, 1});
    h = conv_transpose2d(h, b, Tensor(), {2, 2}, {1, 0}, {1, 0});
    h = training
            ? batch_norm_relu(h, Tensor(), Tensor(), gamma, beta, true, 0.1, 1e-5, h * 0.5)
            : batch_norm(h, zeros({3}, DType::f64) + 0.1, ones({3}, DType::f64) * 1.5, gamma, beta, false, 0.1, 1e-5);
    h = avg_pool2d(tanh(h), {3, 3}, {2, 2}, {1, 1}, false);
    return sum(adaptive_avg_pool2d(h, {2, 3}) * adaptive_avg_pool2d(h, {2, 3}));
  };
  for (bool training : {true, false}) {
    INFO(std::string(training ? "training" : "eval"));
    const Tensor x0 = rnd({2, 4, 7, 6}, -1, 1, 25), v = rnd({2, 4, 7, 6}, -1, 1, 26);
    const Tensor va = rnd({4, 2, 3, 3}, -1, 1, 27), vb = rnd({4, 3, 2, 2}, -1, 1, 28);
    auto grads = [&](const Tensor& x, const Tensor& a, const Tensor& b, bool create) {
      const Tensor xl = x.detach().set_requires_grad(true), al = a.detach().set_requires_grad(true),
                   bl = b.detach().set_requires_grad(true);
      std::vector<Tensor> g = autograd::grad({f(xl, al, bl, training)}, {xl, al, bl}, {}, false, true, create);
      g.insert(g.end(), {xl, al, bl});
      return g;
    };
    const std::vector<Tensor> g = grads(x0, w1, w2, true);
    const Tensor dot = sum(g[0] * v) + sum(g[1] * va) + sum(g[2] * vb);
    const std::vector<Tensor> hv = autograd::grad({dot}, {g[3], g[4], g[5]});
    const double eps = 1e-5;
    const std::vector<Tensor> gp = grads(x0 + v * eps, w1 + va * eps, w2 + vb * eps, false);
    const std::vector<Tensor> gm = grads(x0 - v * eps, w1 - va * eps, w2 - vb * eps, false);
    for (size_t i = 0; i < 3; ++i) {
      const std::vector<double> want = ((gp[i] - gm[i]) * (0.5 / eps)).to_vector();
      check_values(hv[i], want, 1e-6, "Hessian-vector product, input " + std::to_string(i));
    }
  }
}

TEST_CASE("autograd: a once-differentiable backward refuses a second derivative, naming the op") {
  const Tensor x = from_vector(std::vector<double>{1.0, 2.0}, {2}, DType::f64).set_requires_grad(true);
  // First derivatives are right with or without create_graph.
  const Tensor g = autograd::grad({sum(custom_cube_once(x))}, {x}, {}, false, true, true)[0];
  check_values(g, {3.0, 12.0}, 1e-12, "first");
  CHECK(contains(error_of([&] { autograd::grad({sum(g)}, {x}); }),
                 "custom_cube_once, whose backward is not differentiable in Kiln"));
  // A gradient that does not go through it differentiates as usual, even beside it.
  const Tensor g2 = autograd::grad({sum(custom_cube_once(x) + x * x)}, {x}, {}, false, true, true)[0];
  CHECK(contains(error_of([&] { autograd::grad({sum(g2)}, {x}); }), "custom_cube_once"));
  const Tensor g3 = autograd::grad({sum(custom_cube_once(x.detach()) + x * x)}, {x}, {}, false, true, true)[0];
  check_values(autograd::grad({sum(g3)}, {x})[0], {2.0, 2.0}, 1e-12, "beside it");
  // checkpoint's backward runs a backward of its own: refused the same way (conv2d's, which once
  // was, records under create_graph).
  const Tensor img = rnd({1, 1, 4, 4}, -1, 1, 6).set_requires_grad(true), k = rnd({1, 1, 3, 3}, -1, 1, 7);
  const autograd::RecomputeFn conv_sq = [k](const std::vector<Tensor>& in) {
    const Tensor c = conv2d(in[0], k);
    return std::vector<Tensor>{c * c};
  };
  const Tensor gi = autograd::grad({sum(autograd::checkpoint(conv_sq, {img})[0])}, {img}, {}, false, true, true)[0];
  CHECK(contains(error_of([&] { autograd::grad({sum(gi)}, {img}); }), "second derivatives of checkpoint"));
  // A saved tensor modified in place is still caught in a backward with create_graph.
  Tensor y = x * 2.0;
  const Tensor out = y * y;
  {
    NoGradGuard ng;
    y.add_(ones_like(y));
  }
  CHECK(contains(error_of([&] { autograd::grad({sum(out)}, {x}, {}, false, true, true); }), "modified in place"));
}

namespace {
// y = 2x whose backward reads an intermediate it computed with a history of its own (t = x * 1, not
// an input or output of the op): a custom op's mistake the engine must survive.
Tensor custom_saves_intermediate(const Tensor& x) {
  const Tensor t = x * 1.0;
  Tensor out;
  {
    NoGradGuard ng;
    out = x * 2.0;
  }
  SavedTensor st(t);
  autograd::record("custom_saves_intermediate", {x}, {out}, [st](const GradCtx& c) -> std::vector<Tensor> {
    return {c.g() * st.unpack("custom_saves_intermediate") * 0.0 + c.g() * 2.0};
  });
  return out;
}
}  // namespace

TEST_CASE("autograd: saved intermediates with a history free a deep chain in constant stack; create_graph refuses them") {
  {
    Tensor y = leaf({2});
    for (int i = 0; i < 300000; ++i) y = custom_saves_intermediate(y);
  }  // freed here, iteratively (a strong hold on the intermediate's node recursed)
  const Tensor x = leaf({2});
  const Tensor y = custom_saves_intermediate(x);
  check_values(autograd::grad({sum(y)}, {x})[0], {2.0, 2.0}, 0, "first order");
  CHECK(contains(error_of([&] { autograd::grad({sum(custom_saves_intermediate(x))}, {x}, {}, false, true, true); }),
                 "had a history that has since been freed"));
}
