// The edges of softmax, log-softmax, cross-entropy and attention that every backend must get the same
// way (docs/ops.md): log-sum-exp as (x - max) - log(sum), so large inputs keep their precision, and a
// fully masked row (every element -inf) as softmax 0, log-softmax -inf and attention output 0, in f32
// and f64. Run on the CPU by test_nn_ops.cpp and on the CUDA kernels by test_emulated.cpp.
#pragma once
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "kiln.h"

namespace kiln::testing {

inline void check_softmax_edges() {
  const double inf = std::numeric_limits<double>::infinity();
  for (DType dt : {DType::f32, DType::f64}) {
    INFO("dtype " << dt);
    const double tol = dt == DType::f32 ? 3e-7 : 1e-12;
    // log_softmax([1e6, 1e6 + 1]): -log(1 + e) and -log(1 + 1/e). x - (max + log(sum)) gave -1.3125 and
    // -0.3125 in f32 (max + log(sum) rounded to 1e6's ulp of 1/16).
    const double a = 1e6, w0 = -std::log1p(std::exp(1.0)), w1 = -std::log1p(std::exp(-1.0));
    {
      const auto y = log_softmax(from_vector({a, a + 1}, {1, 2}, dt), -1).to_vector();
      CHECK(std::abs(y[0] - w0) <= tol);
      CHECK(std::abs(y[1] - w1) <= tol);
      // Over the first of two dims: each column is [a, a + 1].
      const auto c = log_softmax(from_vector({a, a, a + 1, a + 1}, {2, 2}, dt), 0).to_vector();
      CHECK(std::abs(c[0] - w0) <= tol);
      CHECK(std::abs(c[3] - w1) <= tol);
      // cross_entropy's gradient, softmax - one-hot, from the same log-sum-exp.
      Tensor logits = from_vector({a, a + 1}, {1, 2}, dt).set_requires_grad();
      const int64_t t0 = 0;
      cross_entropy(logits, from_blob_copy(&t0, {1})).backward();
      const auto g = logits.grad().to_vector();
      CHECK(std::abs(g[0] - (std::exp(w0) - 1)) <= 1e-6);
      CHECK(std::abs(g[1] - std::exp(w1)) <= 1e-6);
    }
    // Logits of 1e17: the loss is log(4) and the target's gradient -3/4 (max + log(sum) would absorb
    // log(sum): loss 0, gradient 0); with label smoothing the same holds, the smoothing term summing
    // x - max.
    for (double eps : {0.0, 0.1}) {
      Tensor big = full({1, 4}, 1e17, dt).set_requires_grad();
      const int64_t t2 = 2;
      const Tensor loss = cross_entropy(big, from_blob_copy(&t2, {1}), -100, eps);
      CHECK(std::abs(loss.item<double>() - std::log(4.0)) <= 1e-6);
      loss.backward();
      CHECK(std::abs(big.grad().to_vector()[2] - (0.25 - (1 - eps) - eps / 4)) <= 1e-6);
    }
    // Row 0 fully masked, row 1 with one masked element.
    const std::vector<double> xv = {-inf, -inf, -inf, 0.5, 1.0, -inf};
    const double e0 = std::exp(0.5 - 1.0), p0 = e0 / (e0 + 1), p1 = 1 / (e0 + 1);
    for (bool middle : {false, true}) {
      INFO((middle ? "softmax over the first dim" : "softmax over the last dim"));
      Tensor x = from_vector(xv, {2, 3}, dt);
      if (middle) x = x.transpose(0, 1).contiguous();
      x.set_requires_grad();
      const int64_t dim = middle ? 0 : 1;
      const Tensor y = softmax(x, dim);
      const Tensor ly = log_softmax(x, dim);
      const Tensor yr = middle ? y.transpose(0, 1).contiguous() : y,
                   lyr = middle ? ly.transpose(0, 1).contiguous() : ly;
      const auto s = yr.to_vector(), l = lyr.to_vector();
      for (int j = 0; j < 3; ++j) {
        CHECK(s[size_t(j)] == 0.0);
        CHECK(l[size_t(j)] == -inf);
      }
      CHECK(std::abs(s[3] - p0) <= tol);
      CHECK(std::abs(s[4] - p1) <= tol);
      CHECK(s[5] == 0.0);
      sum(y * from_vector({1, 2, 3, 4, 5, 6}, y.shape(), dt)).backward();
      for (double v : x.grad().to_vector()) CHECK(std::isfinite(v));
      const auto gx = (middle ? x.grad().transpose(0, 1).contiguous() : x.grad()).to_vector();
      for (int j = 0; j < 3; ++j) CHECK(gx[size_t(j)] == 0.0);
    }
    // Attention: the mask hides every key from query 0; its output row and its gradients are 0.
    {
      Tensor q = from_vector({0.1, -0.2, 0.3, 0.4, 0.5, -0.6}, {2, 3}, dt).set_requires_grad();
      Tensor k = from_vector({0.2, 0.1, -0.1, 0.3, -0.3, 0.2, 0.5, 0.4, 0.1}, {3, 3}, dt).set_requires_grad();
      Tensor v = from_vector({1, 2, 3, 4, 5, 6}, {3, 2}, dt).set_requires_grad();
      const Tensor mask = from_vector({-inf, -inf, -inf, 0, 0, -inf}, {2, 3}, dt);
      const auto p = masked_softmax(q.detach(), from_vector({-inf, -inf, -inf, 0, 0, 0}, {2, 3}, dt)).to_vector();
      for (int j = 0; j < 3; ++j) CHECK(p[size_t(j)] == 0.0);
      const Tensor out = scaled_dot_product_attention(q, k, v, mask);
      const auto o = out.to_vector();
      CHECK(o[0] == 0.0);
      CHECK(o[1] == 0.0);
      CHECK(std::isfinite(o[2]));
      sum(out).backward();
      const auto gq = q.grad().to_vector();
      for (int j = 0; j < 3; ++j) CHECK(gq[size_t(j)] == 0.0);
      for (const Tensor& t : {q.grad(), k.grad(), v.grad()})
        for (double g : t.to_vector()) CHECK(std::isfinite(g));
    }
    // NaN is not a mask: a row of -inf and NaN stays NaN.
    for (double y : softmax(from_vector({-inf, std::nan("")}, {1, 2}, dt), -1).to_vector()) CHECK(std::isnan(y));
  }
}

}  // namespace kiln::testing
