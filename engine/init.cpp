// Initialisers: draw from the Philox stream in f32, write into the tensor without autograd.
#include "engine/init.h"

#include <algorithm>
#include <cmath>

#include "engine/autograd.h"

namespace kiln::nn::init {
namespace {
void assign(Tensor& t, const Tensor& v) {
  NoGradGuard ng;
  t.copy_(v);
}
TensorOptions f32_on(const Tensor& t) { return TensorOptions(DType::f32, t.device()); }
}  // namespace

std::pair<int64_t, int64_t> fans(const Tensor& w) {
  KILN_CHECK(w.dim() >= 2, "init: fan in/out need a weight with at least 2 dims, got ", w.shape());
  int64_t rf = 1;
  for (int64_t i = 2; i < w.dim(); ++i) rf *= w.size(i);
  return {w.size(1) * rf, w.size(0) * rf};
}

double gain(const std::string& nl, double a) {
  if (nl == "linear" || nl == "conv" || nl == "conv2d" || nl == "sigmoid") return 1.0;
  if (nl == "tanh") return 5.0 / 3.0;
  if (nl == "relu") return std::sqrt(2.0);
  if (nl == "leaky_relu") return std::sqrt(2.0 / (1.0 + a * a));
  if (nl == "selu") return 3.0 / 4.0;
  KILN_FAIL("init: unknown nonlinearity '", nl, "'");
}

void uniform_(Tensor& t, double lo, double hi, Generator* g) { assign(t, uniform(t.shape(), lo, hi, f32_on(t), g)); }
void normal_(Tensor& t, double m, double s, Generator* g) { assign(t, normal(t.shape(), m, s, f32_on(t), g)); }

void trunc_normal_(Tensor& t, double m, double s, double a, double b, Generator* g) {
  KILN_CHECK(a < b, "trunc_normal_: bounds [", a, ", ", b, "] are empty");
  // Inverse-CDF sampling: exact truncation with one uniform draw per element.
  auto cdf = [](double x) { return 0.5 * (1.0 + std::erf(x / std::sqrt(2.0))); };
  const double lo = cdf((a - m) / s), hi = cdf((b - m) / s);
  std::vector<double> u = uniform(t.shape(), 0.0, 1.0, f32_on(t), g).to_vector();
  for (double& x : u) {
    const double p = std::clamp(lo + (hi - lo) * x, 1e-12, 1 - 1e-12);
    // z = sqrt(2) * erfinv(2p - 1), erfinv by Newton's method on erf.
    const double target = 2 * p - 1;
    double y = 0.0;
    for (int it = 0; it < 60; ++it) {
      const double err = std::erf(y) - target;
      if (std::abs(err) < 1e-15) break;
      y -= err / (2.0 / std::sqrt(M_PI) * std::exp(-y * y));
    }
    x = std::clamp(m + s * std::sqrt(2.0) * y, a, b);
  }
  assign(t, from_vector(u, t.shape(), TensorOptions(DType::f64)));
}

void zeros_(Tensor& t) { constant_(t, 0.0); }
void ones_(Tensor& t) { constant_(t, 1.0); }
void constant_(Tensor& t, double v) {
  NoGradGuard ng;
  t.fill_(v);
}

namespace {
double kaiming_std(const Tensor& t, double a, FanMode mode, const std::string& nl) {
  const auto [fi, fo] = fans(t);
  const int64_t fan = mode == FanMode::fan_in ? fi : fo;
  KILN_CHECK(fan > 0, "init: zero fan for weight ", t.shape());
  return gain(nl, a) / std::sqrt(double(fan));
}
}  // namespace

void kaiming_uniform_(Tensor& t, double a, FanMode mode, const std::string& nl, Generator* g) {
  const double bound = std::sqrt(3.0) * kaiming_std(t, a, mode, nl);
  uniform_(t, -bound, bound, g);
}
void kaiming_normal_(Tensor& t, double a, FanMode mode, const std::string& nl, Generator* g) {
  normal_(t, 0.0, kaiming_std(t, a, mode, nl), g);
}
void xavier_uniform_(Tensor& t, double gn, Generator* g) {
  const auto [fi, fo] = fans(t);
  const double bound = gn * std::sqrt(6.0 / double(fi + fo));
  uniform_(t, -bound, bound, g);
}
void xavier_normal_(Tensor& t, double gn, Generator* g) {
  const auto [fi, fo] = fans(t);
  normal_(t, 0.0, gn * std::sqrt(2.0 / double(fi + fo)), g);
}

}  // namespace kiln::nn::init
