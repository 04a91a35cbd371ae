// A two-layer MLP learns three interleaved spirals with Kiln's autograd, nn modules and SGD: a
// minimal example of embedding the engine (ctest's example_mlp runs it).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <kiln/kiln.h>

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

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 600;
  Generator gen(7);
  Tensor x, y;
  make_spirals(400, gen, x, y);

  // 2 -> 64 -> 3 with ReLU; SGD with momentum 0.9 and a cosine schedule.
  nn::Sequential net({std::make_shared<nn::Linear>(2, 64), std::make_shared<nn::ReLU>(),
                      std::make_shared<nn::Linear>(64, 3)});
  optim::SGD opt({{net.parameters(), 0.5, 0.0}}, {0.9});
  optim::LrSchedule lr;
  lr.kind = optim::ScheduleKind::cosine;
  lr.base_lr = 0.5;
  lr.total_steps = steps;

  std::printf("training a 2-64-3 MLP (%lld parameters) on %lld spiral points, full batch, SGD momentum 0.9\n",
              static_cast<long long>(net.num_parameters()), static_cast<long long>(x.size(0)));
  const auto t0 = std::chrono::steady_clock::now();
  double loss_v = 0;
  for (int step = 0; step <= steps; ++step) {
    const Tensor loss = cross_entropy(net(x), y);
    loss_v = loss.item<double>();
    if (step % 50 == 0) std::printf("  step %4d  loss %.4f\n", step, loss_v);
    if (step == steps) break;
    opt.zero_grad();
    loss.backward();
    opt.set_lr(lr.at(step));
    opt.step();
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  NoGradGuard no_grad;
  const Tensor pred = argmax(net(x), 1);
  const double acc = mean(cast(eq(pred, y), DType::f32)).item<double>();
  std::printf("final loss %.4f, training accuracy %.2f%% (%d steps in %.2f s)\n", loss_v, 100.0 * acc, steps, secs);
  return acc > 0.9 ? 0 : 1;
}
