// Autocast: the op policy (GEMMs in 16 bits, softmax/norms/losses in f32, the rest in the input's
// dtype), gradients reaching f32 master weights in f32, backward untouched by autocast, the docs
// table in step with the code, and loss scaling rescuing gradients that underflow f16.
#include <doctest/doctest.h>

#include <fstream>
#include <sstream>

#include "kiln.h"
#include "test_util.h"

using namespace kiln;
using kiln::testing::contains;
using kiln::testing::error_of;

namespace {
double max_rel_diff(const Tensor& a, const Tensor& b) {
  const auto x = a.to_vector(), y = b.to_vector();
  REQUIRE(x.size() == y.size());
  double scale = 0, diff = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    scale = std::max(scale, std::abs(y[i]));
    diff = std::max(diff, std::abs(x[i] - y[i]));
  }
  return diff / std::max(scale, 1e-30);
}
}  // namespace

TEST_CASE("autocast: GEMM ops run in the autocast dtype, reductions in f32, the rest in their input's dtype") {
  manual_seed(1);
  for (DType low : {DType::f16, DType::bf16}) {
    CAPTURE(low);
    const Tensor x = randn({4, 8}), w = randn({5, 8}), b = randn({5});
    const Tensor img = randn({2, 3, 6, 6}), k = randn({4, 3, 3, 3});
    amp::AutocastGuard guard(low);
    REQUIRE(amp::autocast_dtype() == low);
    CHECK(matmul(x, w.t()).dtype() == low);
    CHECK(linear(x, w, b).dtype() == low);  // the bias is cast too
    CHECK(conv2d(img, k).dtype() == low);
    const Tensor y = conv2d(img, k, {}, {1, 1}, {1, 1});
    CHECK(batch_norm(y, zeros({4}), ones({4}), ones({4}), zeros({4}), true).dtype() == low);  // native
    CHECK(relu(y).dtype() == low);
    CHECK(softmax(y, 1).dtype() == DType::f32);
    CHECK(log_softmax(y, 1).dtype() == DType::f32);
    CHECK(layer_norm(y, {6}).dtype() == DType::f32);
    const Tensor logits = linear(x, w, b);
    CHECK(cross_entropy(logits, from_vector({0, 1, 2, 3}, {4}, DType::i64)).dtype() == DType::f32);
    CHECK(mse_loss(logits, logits.detach()).dtype() == DType::f32);
    CHECK((logits + b).dtype() == DType::f32);  // mixed dtypes promote
    // f64 asks for precision on purpose: never lowered.
    CHECK(matmul(x.to(DType::f64), w.t().to(DType::f64)).dtype() == DType::f64);
    // Values: the product of the rounded inputs, accumulated in f32.
    const Tensor ref = matmul(x.to(low).to(DType::f32), w.to(low).to(DType::f32).t());
    {
      amp::AutocastGuard off(low, /*enabled=*/false);
      CHECK(!amp::autocast_dtype().has_value());
      CHECK(matmul(x, w.t()).dtype() == DType::f32);
      CHECK(max_rel_diff(ref.to(low).to(DType::f32), ref) < (low == DType::f16 ? 1e-3 : 8e-3));
    }
    CHECK(amp::autocast_dtype() == low);  // restored after the nested guard
  }
  CHECK(!amp::autocast_dtype().has_value());
  CHECK(contains(error_of([] { amp::AutocastGuard g(DType::f32); }), "must be f16 or bf16"));
}

TEST_CASE("autocast: f32 master weights get f32 gradients close to the f32 run's") {
  manual_seed(2);
  nn::Linear fc1(16, 32), fc2(32, 4);
  const Tensor x = randn({8, 16});
  const Tensor target = from_vector({0, 1, 2, 3, 0, 1, 2, 3}, {8}, DType::i64);
  auto grads = [&](std::optional<DType> low) {
    fc1.zero_grad();
    fc2.zero_grad();
    Tensor loss;
    {
      amp::AutocastGuard g(low.value_or(DType::f16), low.has_value());
      loss = cross_entropy(fc2.forward(gelu(fc1.forward(x))), target);
    }
    CHECK(loss.dtype() == DType::f32);
    loss.backward();
    return std::vector<Tensor>{fc1.weight.grad(), fc1.bias.grad(), fc2.weight.grad(), fc2.bias.grad()};
  };
  const auto ref = grads(std::nullopt);
  for (DType low : {DType::f16, DType::bf16}) {
    CAPTURE(low);
    const auto got = grads(low);
    for (size_t i = 0; i < ref.size(); ++i) {
      CAPTURE(i);
      CHECK(got[i].dtype() == DType::f32);
      CHECK(max_rel_diff(got[i], ref[i]) < (low == DType::f16 ? 1e-2 : 5e-2));
    }
  }
}

TEST_CASE("autocast: backward keeps the forward's dtypes even when called inside a guard") {
  manual_seed(3);
  Tensor w = randn({6, 6}).set_requires_grad();
  const Tensor x = randn({3, 6});
  Tensor loss = sum(softmax(matmul(x, w), 1) * randn({3, 6}));  // recorded in f32
  loss.backward({}, /*retain_graph=*/true);
  const Tensor g32 = w.grad().clone();
  w.set_grad(Tensor());
  {
    amp::AutocastGuard g(DType::f16);
    loss.backward();
  }
  CHECK(w.grad().to_vector() == g32.to_vector());  // bit for bit: nothing was lowered
}

TEST_CASE("autocast: loss scaling keeps f16 gradients that would underflow") {
  manual_seed(4);
  nn::Linear fc(32, 32);
  const Tensor x = randn({16, 32});
  // A tiny loss: its output gradient (1e-9 per element) is below the smallest f16 subnormal (6e-8).
  auto run = [&](double scale, std::optional<DType> low) {
    fc.zero_grad();
    Tensor loss;
    {
      amp::AutocastGuard g(low.value_or(DType::f16), low.has_value());
      loss = sum(fc.forward(x)) * 1e-9;
    }
    (cast(loss, DType::f32) * scale).backward();
    return fc.weight.grad() * (1.0 / scale);
  };
  const Tensor ref = run(1.0, std::nullopt);
  CHECK(amax(abs(run(1.0, DType::f16))).item<double>() == 0.0);  // all underflowed
  amp::GradScaler scaler;  // 2^16
  const Tensor scaled = run(scaler.get_scale(), DType::f16);
  CHECK(max_rel_diff(scaled, ref) < 2e-2);
  CHECK(max_rel_diff(run(1.0, DType::bf16), ref) < 5e-2);  // bf16 has f32's range: no scaling needed
}

TEST_CASE("autocast: the op policy in docs/amp.md is the one in the code") {
  std::ifstream f(std::string(KILN_TEST_SOURCE_DIR) + "/../docs/amp.md");
  REQUIRE(f.good());
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string doc = ss.str();
  for (const auto& r : amp::autocast_policy()) {
    CAPTURE(r.name);
    const std::string row = std::string("| ") + r.name + " | " + amp::policy_name(r.policy) + " | " + r.why + " |";
    CHECK(contains(doc, row));
  }
  // And no row in the doc that the code lacks (the doc has this one table).
  size_t rows = 0;
  for (size_t p = doc.find("\n| "); p != std::string::npos; p = doc.find("\n| ", p + 1))
    if (doc.compare(p, 6, "\n| op ") != 0) ++rows;
  CHECK(rows == amp::autocast_policy().size());
}
