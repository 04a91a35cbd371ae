// A two-layer MLP learns three interleaved spirals, written against Kiln's core API only
// (tensors, autograd, random numbers): the demo of scripts/demo and the find_package example.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "kiln.h"

using namespace kiln;

namespace {

// Three spiral arms in 2-D with a little noise; label = arm.
void make_spirals(int64_t per_class, Generator& gen, Tensor& x, Tensor& y) {
  const int64_t classes = 3, n = per_class * classes;
  const Tensor t = arange(0.0, double(per_class), 1.0, TensorOptions(DType::f64)) / double(per_class);  // [0,1)
  const Tensor noise = normal({n, 2}, 0.0, 0.04, TensorOptions(DType::f64), &gen);
  std::vector<double> pts(static_cast<size_t>(n * 2)), labels(static_cast<size_t>(n));
  const std::vector<double> tv = t.to_vector(), nv = noise.to_vector();
  for (int64_t c = 0; c < classes; ++c) {
    for (int64_t i = 0; i < per_class; ++i) {
      const int64_t k = c * per_class + i;
      const double r = 0.1 + 0.9 * tv[size_t(i)];
      const double a = 4.0 * tv[size_t(i)] + 2.0 * M_PI * double(c) / double(classes);
      pts[size_t(2 * k)] = r * std::cos(a) + nv[size_t(2 * k)];
      pts[size_t(2 * k + 1)] = r * std::sin(a) + nv[size_t(2 * k + 1)];
      labels[size_t(k)] = double(c);
    }
  }
  x = from_vector(pts, {n, 2});
  y = from_vector(labels, {n}, TensorOptions(DType::i64));
}

// Mean cross-entropy of logits [N, C] against class indices [N], from core ops: a stable
// log-softmax and a one-hot mask.
Tensor cross_entropy(const Tensor& logits, const Tensor& target) {
  const int64_t classes = logits.size(1);
  const Tensor shifted = logits - amax(logits, {1}, true).detach();
  const Tensor logp = shifted - log(sum(exp(shifted), {1}, true));
  const Tensor onehot = cast(eq(arange(classes).unsqueeze(0), target.unsqueeze(1)), logits.dtype());
  return neg(mean(sum(logp * onehot, {1})));
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 600;
  Generator gen(7);
  Tensor x, y;
  make_spirals(400, gen, x, y);

  // Parameters: 2 -> 64 -> 3, Kaiming-style scaling, drawn from the same seeded stream.
  const int64_t hidden = 64;
  Tensor w1 = (randn({2, hidden}, {}, &gen) * std::sqrt(2.0 / 2.0)).detach().set_requires_grad();
  Tensor b1 = zeros({hidden}).set_requires_grad();
  Tensor w2 = (randn({hidden, 3}, {}, &gen) * std::sqrt(1.0 / double(hidden))).detach().set_requires_grad();
  Tensor b2 = zeros({3}).set_requires_grad();
  std::vector<Tensor> params{w1, b1, w2, b2}, velocity;
  for (const Tensor& p : params) velocity.push_back(zeros_like(p));

  std::printf("training a 2-64-3 MLP on %lld spiral points, full batch, SGD momentum 0.9\n",
              static_cast<long long>(x.size(0)));
  const auto t0 = std::chrono::steady_clock::now();
  double loss_v = 0;
  for (int step = 0; step <= steps; ++step) {
    const Tensor logits = matmul(relu(matmul(x, w1) + b1), w2) + b2;
    const Tensor loss = cross_entropy(logits, y);
    loss_v = loss.item<double>();
    if (step % 50 == 0) std::printf("  step %4d  loss %.4f\n", step, loss_v);
    if (step == steps) break;
    for (Tensor& p : params) p.set_grad(Tensor());
    loss.backward();
    const double lr = 0.5 * 0.5 * (1.0 + std::cos(M_PI * step / steps));  // cosine decay
    NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) {
      velocity[i].mul_(0.9).add_(params[i].grad());
      params[i].add_(velocity[i], -lr);
    }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  NoGradGuard no_grad;
  const Tensor pred = argmax(matmul(relu(matmul(x, w1) + b1), w2) + b2, 1);
  const double acc = mean(cast(eq(pred, y), DType::f32)).item<double>();
  std::printf("final loss %.4f, training accuracy %.2f%% (%d steps in %.2f s)\n", loss_v, 100.0 * acc, steps, secs);
  return acc > 0.9 ? 0 : 1;
}
