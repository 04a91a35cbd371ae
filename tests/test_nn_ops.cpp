// nn ops: forward against naive references written here, backward against finite differences.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <utility>
#include <vector>

#include "base/cpu_isa.h"
#include "kernels/cpu/loops.h"
#include "kiln.h"
#include "tests/softmax_edges.h"

using namespace kiln;

namespace {

Tensor rnd(const Shape& s, uint64_t seed, DType dt = DType::f64) {
  Generator g(seed);
  return randn(s, TensorOptions(dt), &g);
}

void check_grad(const std::function<Tensor(const std::vector<Tensor>&)>& fn, const std::vector<Tensor>& in,
                double atol = 1e-6, double rtol = 1e-4) {
  GradcheckOptions o;
  o.atol = atol;
  o.rtol = rtol;
  const std::string err = gradcheck(fn, in, o);
  CHECK_MESSAGE(err.empty(), err);
}

double at(const std::vector<double>& v, const Shape& s, std::initializer_list<int64_t> idx) {
  int64_t off = 0, k = 0;
  const Shape st = contiguous_strides(s);
  for (int64_t i : idx) off += i * st[size_t(k++)];
  return v[size_t(off)];
}

// Direct convolution, one output element at a time.
std::vector<double> naive_conv(const Tensor& x, const Tensor& w, const Tensor& b, Pair s, Pair p, Pair d, int64_t g,
                               Shape& os) {
  const auto xv = x.to_vector(), wv = w.to_vector();
  const auto bv = b.defined() ? b.to_vector() : std::vector<double>();
  const int64_t n = x.size(0), c = x.size(1), h = x.size(2), wd = x.size(3), o = w.size(0), kh = w.size(2),
                kw = w.size(3);
  const int64_t oh = (h + 2 * p[0] - d[0] * (kh - 1) - 1) / s[0] + 1, ow = (wd + 2 * p[1] - d[1] * (kw - 1) - 1) / s[1] + 1;
  os = {n, o, oh, ow};
  std::vector<double> out(size_t(n * o * oh * ow));
  const int64_t cg = c / g, og = o / g;
  for (int64_t in = 0; in < n; ++in)
    for (int64_t oc = 0; oc < o; ++oc)
      for (int64_t i = 0; i < oh; ++i)
        for (int64_t j = 0; j < ow; ++j) {
          double acc = bv.empty() ? 0 : bv[size_t(oc)];
          const int64_t grp = oc / og;
          for (int64_t ic = 0; ic < cg; ++ic)
            for (int64_t a = 0; a < kh; ++a)
              for (int64_t bb = 0; bb < kw; ++bb) {
                const int64_t y = i * s[0] - p[0] + a * d[0], xx = j * s[1] - p[1] + bb * d[1];
                if (y < 0 || y >= h || xx < 0 || xx >= wd) continue;
                acc += at(xv, x.shape(), {in, grp * cg + ic, y, xx}) * at(wv, w.shape(), {oc, ic, a, bb});
              }
          out[size_t(((in * o + oc) * oh + i) * ow + j)] = acc;
        }
  return out;
}

void check_close(const std::vector<double>& got, const std::vector<double>& want, double tol) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i);
    CHECK(got[i] == doctest::Approx(want[i]).epsilon(tol).scale(1.0));
  }
}

}  // namespace

TEST_CASE("nn: conv2d forward matches direct convolution") {
  struct Case {
    Shape x, w;
    Pair s, p, d;
    int64_t g;
    bool bias;
  };
  const Case cases[] = {
      {{2, 3, 7, 6}, {4, 3, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1, true},
      {{1, 4, 9, 9}, {6, 2, 3, 2}, {2, 1}, {0, 1}, {1, 2}, 2, false},
      {{3, 2, 5, 5}, {2, 2, 1, 1}, {2, 2}, {0, 0}, {1, 1}, 1, true},
      {{1, 8, 6, 6}, {8, 1, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 8, false},  // depthwise
      {{70, 2, 4, 4}, {3, 2, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1, true},  // several image chunks
  };
  for (const Case& cs : cases) {
    const Tensor x = rnd(cs.x, 1, DType::f32), w = rnd(cs.w, 2, DType::f32);
    const Tensor b = cs.bias ? rnd({cs.w[0]}, 3, DType::f32) : Tensor();
    Shape os;
    const auto want = naive_conv(x, w, b, cs.s, cs.p, cs.d, cs.g, os);
    const Tensor y = conv2d(x, w, b, cs.s, cs.p, cs.d, cs.g);
    CHECK(y.shape() == os);
    check_close(y.to_vector(), want, 1e-4);
  }
}

// f32 convolutions take other code paths than f64 on AVX-512 builds (direct convolution for stride-1
// "same" shapes, im2col packed inside the GEMM otherwise, the input gradient as a convolution with the
// flipped filters); the f64 path is the plain im2col + GEMM one that the op table's gradcheck covers. Every
// gradient of the f32 paths must match it, on shapes that hit their edges.
TEST_CASE("nn: conv2d f32 forward and gradients match f64 on every CPU path") {
  struct Case {
    const char* what;
    Shape x, w;
    Pair s, p, d;
    int64_t g;
  };
  const Case cases[] = {
      {"same 3x3, 7 wide, 7 filters (a short row tile)", {3, 5, 7, 7}, {7, 5, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1},
      {"same 3x3 on 28x28 (49 pixel vectors)", {2, 3, 28, 28}, {8, 3, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1},
      {"same 5x5, non-square, groups", {2, 4, 9, 11}, {6, 2, 5, 5}, {1, 1}, {2, 2}, {1, 1}, 2},
      {"same 3x1", {2, 3, 6, 5}, {4, 3, 3, 1}, {1, 1}, {1, 0}, {1, 1}, 1},
      {"8x8 maps over several image chunks", {140, 6, 8, 8}, {5, 6, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1},
      {"stride 1, no padding", {2, 3, 9, 8}, {4, 3, 3, 3}, {1, 1}, {0, 0}, {1, 1}, 1},
      {"padding beyond the kernel", {1, 2, 5, 6}, {3, 2, 3, 3}, {1, 1}, {3, 3}, {1, 1}, 1},
      {"stride 2", {2, 3, 9, 10}, {4, 3, 3, 3}, {2, 2}, {1, 1}, {1, 1}, 1},
      {"dilation 2", {2, 3, 9, 9}, {4, 3, 3, 3}, {1, 1}, {2, 2}, {2, 2}, 1},
      {"1x1", {3, 8, 5, 5}, {6, 8, 1, 1}, {1, 1}, {0, 0}, {1, 1}, 1},
      {"K over several GEMM blocks, same", {2, 50, 6, 6}, {9, 50, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1},
      {"K over several GEMM blocks, valid", {2, 50, 6, 6}, {9, 50, 3, 3}, {1, 1}, {0, 0}, {1, 1}, 1},
      {"direct with padding beyond the kernel in H", {2, 3, 5, 6}, {4, 3, 3, 3}, {1, 1}, {3, 1}, {1, 1}, 1},
      {"63 taps", {2, 2, 9, 8}, {3, 2, 9, 7}, {1, 1}, {4, 3}, {1, 1}, 1},
      {"one image, 100 filters (several channel spans)", {1, 8, 6, 6}, {100, 8, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1},
      // Output-channel tiles (direct_conv_oc: planes that fill 64-pixel tiles to under 90%, filters a
      // multiple of the tile's channels), tiles running across images, a tail tile, zero-buffer taps.
      {"7x7, 64 filters (output-channel tiles)", {5, 16, 7, 7}, {64, 16, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1},
      {"14x14, 32 to 32 (output-channel tiles both ways)", {3, 32, 14, 14}, {32, 32, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1},
      {"7x7, 2 groups of 32 filters (output-channel tiles both ways)",
       {2, 64, 7, 7},
       {64, 32, 3, 3},
       {1, 1},
       {1, 1},
       {1, 1},
       2},
      {"7x7 weight gradient packed in chunks, the last short",
       {100, 16, 7, 7},
       {16, 16, 3, 3},
       {1, 1},
       {1, 1},
       {1, 1},
       1},
      {"6x6 padded to 8 rows, 64 filters", {3, 16, 6, 6}, {64, 16, 3, 3}, {1, 1}, {2, 1}, {1, 1}, 1},
      {"stride 2, 32 filters (output-channel tiles)", {3, 16, 9, 10}, {32, 16, 3, 3}, {2, 2}, {1, 1}, {1, 1}, 1},
      {"dilation 2, 64 filters (output-channel tiles)", {2, 16, 9, 9}, {64, 16, 3, 3}, {1, 1}, {2, 2}, {2, 2}, 1},
      // The strided input gradient phase by phase (input_grad_oc): 1..4 taps a phase; a 1x1 stride-2
      // filter reaches one phase of four, whose others must come out 0; groups; stride 3 with dilation 2.
      {"stride 2, 32 to 32 (input gradient by phases)", {2, 32, 9, 10}, {32, 32, 3, 3}, {2, 2}, {1, 1}, {1, 1}, 1},
      {"1x1 stride 2, 32 to 64", {2, 32, 7, 8}, {64, 32, 1, 1}, {2, 2}, {0, 0}, {1, 1}, 1},
      {"stride 3, dilation 2, 2 groups", {2, 64, 11, 10}, {32, 32, 3, 3}, {3, 3}, {2, 1}, {2, 2}, 2},
      // Planes of a multiple of 2 KiB go through a scratch band: 16 channels, a 1x1 filter's untouched phases,
      // an odd height whose phases end on different rows.
      {"stride 2 on 32x16, 16 channels (gx through a band)",
       {3, 16, 32, 16},
       {32, 16, 3, 3},
       {2, 2},
       {1, 1},
       {1, 1},
       1},
      {"1x1 stride 2 on 16x32 (a band)", {2, 16, 16, 32}, {32, 16, 1, 1}, {2, 2}, {0, 0}, {1, 1}, 1},
      {"stride 2 on 5x512 (a band, odd height)", {2, 16, 5, 512}, {16, 16, 3, 3}, {2, 2}, {1, 1}, {1, 1}, 1},
      // The strided weight gradient over phase planes (direct_conv_wgrad, outputs of 8x8, 8x16 and 4x4 that
      // fill their vectors): an odd size, 5x5, strides 3, 4 and (2, 1), groups, padding beyond the kernel;
      // 7x7 outputs and stride (2, 1) without padding (whose phases do not fit) through im2col.
      {"stride 2, 5x5, padding 2, 15x16", {2, 3, 15, 16}, {4, 3, 5, 5}, {2, 2}, {2, 2}, {1, 1}, 1},
      {"stride 3, padding 1, 12x11", {2, 4, 12, 11}, {5, 4, 3, 3}, {3, 3}, {1, 1}, {1, 1}, 1},
      {"stride 2, 2 groups", {2, 8, 16, 16}, {6, 4, 3, 3}, {2, 2}, {1, 1}, {1, 1}, 2},
      {"stride (2, 1), padding 1", {2, 3, 16, 16}, {4, 3, 3, 3}, {2, 1}, {1, 1}, {1, 1}, 1},
      {"stride 4, 5x5, padding 2", {2, 3, 16, 16}, {4, 3, 5, 5}, {4, 4}, {2, 2}, {1, 1}, 1},
      {"stride 2, padding beyond the kernel", {2, 3, 12, 12}, {4, 3, 3, 3}, {2, 2}, {3, 3}, {1, 1}, 1},
      {"stride 2 to 7x7", {100, 16, 14, 14}, {32, 16, 3, 3}, {2, 2}, {1, 1}, {1, 1}, 1},
      {"stride (2, 1), no padding", {2, 3, 8, 7}, {4, 3, 3, 3}, {2, 1}, {0, 0}, {1, 1}, 1},
  };
  for (const Case& cs : cases) {
    INFO(std::string(cs.what));
    const Tensor x64 = rnd(cs.x, 11), w64 = rnd(cs.w, 12), b64 = rnd({cs.w[0]}, 13);
    Shape os;
    (void)naive_conv(x64, w64, b64, cs.s, cs.p, cs.d, cs.g, os);
    const Tensor r64 = rnd(os, 14);
    std::vector<std::vector<double>> grads[2];
    std::vector<double> outs[2];
    for (int k = 0; k < 2; ++k) {
      const DType dt = k == 0 ? DType::f64 : DType::f32;
      Tensor x = x64.to(dt).detach(), w = w64.to(dt).detach(), b = b64.to(dt).detach();
      x.set_requires_grad();
      w.set_requires_grad();
      b.set_requires_grad();
      const Tensor y = conv2d(x, w, b, cs.s, cs.p, cs.d, cs.g);
      sum(y * r64.to(dt)).backward();
      outs[k] = y.to_vector();
      grads[k] = {x.grad().to_vector(), w.grad().to_vector(), b.grad().to_vector()};
    }
    const char* names[] = {"y", "grad x", "grad w", "grad b"};
    for (int t = 0; t < 4; ++t) {
      const auto& want = t == 0 ? outs[0] : grads[0][size_t(t - 1)];
      const auto& got = t == 0 ? outs[1] : grads[1][size_t(t - 1)];
      REQUIRE(got.size() == want.size());
      double scale = 0, err = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        scale = std::max(scale, std::abs(want[i]));
        err = std::max(err, std::abs(got[i] - want[i]));
      }
      INFO(names[t] << ": max error " << err << " at scale " << scale);
      CHECK(err <= 2e-6 * std::max(scale, 1.0) * 8);
    }
  }
}

TEST_CASE("nn: f32 conv2d forward and gradients are bitwise identical with 1 and 3 threads") {
  struct Case {
    Shape x, w;
    Pair s, p;
    int64_t g;
  };
  // Direct (same 3x3, images in several chunks; one image with channel spans; groups), implicit GEMM
  // (valid, and padding beyond the kernel), strided; big enough to be split.
  const Case cases[] = {
      {{40, 16, 8, 8}, {16, 16, 3, 3}, {1, 1}, {1, 1}, 1},  {{1, 32, 12, 12}, {120, 32, 3, 3}, {1, 1}, {1, 1}, 1},
      {{6, 16, 12, 12}, {24, 8, 3, 3}, {1, 1}, {1, 1}, 2},  {{4, 16, 20, 20}, {24, 16, 3, 3}, {1, 1}, {0, 0}, 1},
      {{4, 16, 20, 20}, {24, 16, 3, 3}, {1, 1}, {3, 3}, 1}, {{4, 16, 20, 20}, {24, 16, 3, 3}, {2, 2}, {1, 1}, 1},
      {{40, 32, 7, 7}, {64, 32, 3, 3}, {1, 1}, {1, 1}, 1},  {{4, 16, 20, 20}, {32, 16, 3, 3}, {2, 2}, {1, 1}, 1},
      {{8, 16, 16, 16}, {24, 16, 3, 3}, {2, 2}, {1, 1}, 1}};  // the last: the weight gradient by phases
  const int saved = num_threads();
  for (const Case& cs : cases) {
    std::vector<std::vector<double>> runs;
    for (int threads : {1, 3}) {
      set_num_threads(threads);
      Tensor x = rnd(cs.x, 21, DType::f32), w = rnd(cs.w, 22, DType::f32);
      x.set_requires_grad();
      w.set_requires_grad();
      const Tensor y = conv2d(x, w, {}, cs.s, cs.p, {1, 1}, cs.g);
      Shape os = y.shape();
      sum(y * rnd(os, 23, DType::f32)).backward();
      std::vector<double> all = y.to_vector();
      for (const Tensor& g : {x.grad(), w.grad()}) {
        const auto v = g.to_vector();
        all.insert(all.end(), v.begin(), v.end());
      }
      runs.push_back(all);
    }
    CHECK(runs[0] == runs[1]);
  }
  set_num_threads(saved);
}

// The direct kernels may load whole vectors across a plane's edge and clear the lanes outside it
// (kernels/cpu/isa/avx2.cpp): what lies there (the neighbouring channel or image) must not reach the
// result, even NaN. Image 1 (and its output gradient) is NaN; images 0 and 2 must come out exactly as
// with image 1 all zeros.
TEST_CASE("nn: f32 conv2d results of an image do not depend on its neighbours, even NaN ones") {
  // The last two run the output-channel tiles (direct_conv_oc), whose tiles span images.
  const std::pair<Shape, int64_t> cases[] = {
      {{3, 16, 8, 8}, 6}, {{3, 4, 28, 28}, 6}, {{3, 5, 7, 7}, 6}, {{3, 32, 7, 7}, 64}, {{3, 32, 14, 14}, 32}};
  for (const auto& [xs, filters] : cases) {
    INFO("planes of " << xs[2] << "x" << xs[3] << ", " << filters << " filters");
    std::vector<double> outs[2];
    for (int k = 0; k < 2; ++k) {
      const double fill = k == 0 ? 0.0 : std::nan("");
      Tensor x = rnd(xs, 31, DType::f32), w = rnd({filters, xs[1], 3, 3}, 32, DType::f32);
      Tensor gy = rnd({xs[0], filters, xs[2], xs[3]}, 33, DType::f32);
      x.select(0, 1).fill_(fill);
      gy.select(0, 1).fill_(fill);
      x.set_requires_grad();
      const Tensor y = conv2d(x, w, {}, {1, 1}, {1, 1});
      y.backward(gy);
      for (const Tensor& t : {y, x.grad()})
        for (int64_t n : {0, 2}) {
          const auto v = t.select(0, n).to_vector();
          outs[k].insert(outs[k].end(), v.begin(), v.end());
        }
    }
    for (double v : outs[1]) REQUIRE(std::isfinite(v));
    CHECK(outs[0] == outs[1]);
  }
}

TEST_CASE("nn: conv2d errors name the shapes") {
  const Tensor x = zeros({1, 3, 8, 8}), w = zeros({4, 2, 3, 3});
  CHECK_THROWS_WITH_AS(conv2d(x, w), doctest::Contains("[1,3,8,8]"), kiln::Error);
  CHECK_THROWS_AS(conv2d(zeros({1, 3, 2, 2}), zeros({4, 3, 5, 5})), kiln::Error);
}

TEST_CASE("nn: pooling forward and gradients") {
  const Tensor x = rnd({2, 3, 7, 6}, 11);
  const auto xv = x.to_vector();
  // max pool 3x3 stride 2 pad 1
  const Tensor y = max_pool2d(x, {3, 3}, {2, 2}, {1, 1});
  CHECK(y.shape() == Shape{2, 3, 4, 3});
  const auto yv = y.to_vector();
  for (int64_t n = 0; n < 2; ++n)
    for (int64_t c = 0; c < 3; ++c)
      for (int64_t i = 0; i < 4; ++i)
        for (int64_t j = 0; j < 3; ++j) {
          double best = -1e300;
          for (int64_t a = 0; a < 3; ++a)
            for (int64_t b = 0; b < 3; ++b) {
              const int64_t r = i * 2 - 1 + a, q = j * 2 - 1 + b;
              if (r >= 0 && r < 7 && q >= 0 && q < 6) best = std::max(best, at(xv, x.shape(), {n, c, r, q}));
            }
          CHECK(at(yv, y.shape(), {n, c, i, j}) == best);
        }
  // avg pool 2x2 and adaptive to 1x1 / 3x2
  const Tensor a = avg_pool2d(x, {2, 2});
  CHECK(a.shape() == Shape{2, 3, 3, 3});
  CHECK(at(a.to_vector(), a.shape(), {1, 2, 1, 1}) ==
        doctest::Approx((at(xv, x.shape(), {1, 2, 2, 2}) + at(xv, x.shape(), {1, 2, 2, 3}) +
                         at(xv, x.shape(), {1, 2, 3, 2}) + at(xv, x.shape(), {1, 2, 3, 3})) / 4));
  const Tensor g = adaptive_avg_pool2d(x, {1, 1});
  check_close(g.reshape({6}).to_vector(), mean(x, {2, 3}).reshape({6}).to_vector(), 1e-12);
  CHECK(adaptive_avg_pool2d(x, {3, 2}).shape() == Shape{2, 3, 3, 2});

}

TEST_CASE("nn: softmax and log_softmax") {
  const Tensor x = rnd({3, 4, 5}, 21);
  for (int64_t d : {0, 1, 2, -1}) {
    const Tensor want = exp(x - amax(x, {d}, true)) / sum(exp(x - amax(x, {d}, true)), {d}, true);
    check_close(softmax(x, d).to_vector(), want.to_vector(), 1e-12);
    check_close(log_softmax(x, d).to_vector(), log(want).to_vector(), 1e-12);
  }
  // Stable for large logits.
  const Tensor big = from_vector({1000, 1001, 1002}, {3});
  CHECK(std::isfinite(log_softmax(big, 0).to_vector()[0]));
}

TEST_CASE("nn: large inputs keep log-softmax's precision; a fully masked row gives softmax 0 and attention 0") {
  kiln::testing::check_softmax_edges();
}

TEST_CASE("nn: layer_norm") {
  const Tensor x = rnd({2, 3, 8}, 31), w = rnd({8}, 32), b = rnd({8}, 33);
  const Tensor m = mean(x, {-1}, true), v = var(x, {-1}, 0, true);
  const Tensor want = (x - m) / sqrt(v + 1e-5) * w + b;
  check_close(layer_norm(x, {8}, w, b).to_vector(), want.to_vector(), 1e-10);
}

TEST_CASE("nn: batch_norm training, running statistics and eval") {
  const Tensor x = rnd({4, 3, 2, 2}, 41), w = rnd({3}, 42), b = rnd({3}, 43);
  Tensor rm = zeros({3}, TensorOptions(DType::f64)), rv = ones({3}, TensorOptions(DType::f64));
  const Tensor y = batch_norm(x, rm, rv, w, b, true, 0.1, 1e-5);
  const Tensor m = mean(x, {0, 2, 3}, true), v = var(x, {0, 2, 3}, 0, true);
  const Tensor want = (x - m) / sqrt(v + 1e-5) * w.reshape({1, 3, 1, 1}) + b.reshape({1, 3, 1, 1});
  check_close(y.to_vector(), want.to_vector(), 1e-10);
  check_close(rm.to_vector(), (m.reshape({3}) * 0.1).to_vector(), 1e-12);
  check_close(rv.to_vector(), (var(x, {0, 2, 3}, 1) * 0.1 + 0.9).to_vector(), 1e-12);
  const Tensor ye = batch_norm(x, rm, rv, w, b, false);
  const Tensor want_e = (x - rm.reshape({1, 3, 1, 1})) / sqrt(rv.reshape({1, 3, 1, 1}) + 1e-5) *
                            w.reshape({1, 3, 1, 1}) + b.reshape({1, 3, 1, 1});
  check_close(ye.to_vector(), want_e.to_vector(), 1e-10);
}

// The kernel sets' plain loops (kernels/cpu/isa/loops.inc), under each set in ctest (rows_<set>): the
// elementwise rows and the f64 column sums give the scalar bits, special values and tails included.
TEST_CASE("nn: kernel set loops: elementwise f32 rows and column sums give the scalar bits") {
  const int64_t n = 1000 + 13;  // a tail in every set
  std::vector<double> av = rnd({n}, 71).to_vector(), bv = rnd({n}, 72).to_vector();
  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  // (No subnormals: Kiln's kernels flush them by default, base/thread_pool.h.)
  const double specials[] = {0.0, -0.0, inf, -inf, nan, 1e-30, -1e-30, 1e30};
  for (size_t i = 0; i < 8; ++i) {
    av[i * 7] = specials[i];
    bv[i * 11 + 3] = specials[(i + 3) % 8];
    av[i * 13 + 5] = specials[(i + 5) % 8];
  }
  const Tensor a = from_vector(av, {n}).to(DType::f32), b = from_vector(bv, {n}).to(DType::f32);
  const auto fa = a.to_vector(), fb = b.to_vector();
  auto same = [](const std::vector<double>& got, auto&& want, const std::string& what) {
    int64_t bad = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const float w = want(i);
      const bool ok =
          std::isnan(w) ? std::isnan(got[i]) : got[i] == double(w) && std::signbit(got[i]) == std::signbit(w);
      if (!ok && bad++ == 0) FAIL_CHECK(what << " at " << i << ": " << got[i] << " against " << w);
    }
    CHECK_MESSAGE(bad == 0, what << ": " << bad << " elements differ");
  };
  auto f = [&](size_t i) { return float(fa[i]); };
  auto g = [&](size_t i) { return float(fb[i]); };
  same((a + b).to_vector(), [&](size_t i) { return f(i) + g(i); }, "add");
  same((a - b).to_vector(), [&](size_t i) { return f(i) - g(i); }, "sub");
  same((a * b).to_vector(), [&](size_t i) { return f(i) * g(i); }, "mul");
  same((a / b).to_vector(), [&](size_t i) { return f(i) / g(i); }, "div");
  same(
      relu(a).to_vector(), [&](size_t i) { return f(i) <= 0.f ? 0.f : f(i); }, "relu");
  Tensor x = a.detach();
  x.set_requires_grad();
  relu(x).backward(b);
  same(
      x.grad().to_vector(), [&](size_t i) { return f(i) <= 0.f ? 0.f : g(i); }, "relu backward");
  // In place: the output is one of the inputs.
  Tensor c = a.clone();
  c.add_(b);
  same(
      c.to_vector(), [&](size_t i) { return f(i) + g(i); }, "add_");
  // f16 and bf16 go through f32 blocks and the same rows: the f32 result rounded once.
  for (const DType h : {DType::f16, DType::bf16}) {
    const Tensor ah = a.to(h), bh = b.to(h), af = ah.to(DType::f32), bf = bh.to(DType::f32);
    auto as_f32 = [&](const Tensor& x, const Tensor& want, const std::string& what) {
      const auto wv = want.to(h).to_vector();
      same(
          x.to_vector(), [&](size_t i) { return float(wv[i]); }, what + " " + dtype_name(h));
    };
    as_f32(ah + bh, af + bf, "add");
    as_f32(ah / bh, af / bf, "div");
    as_f32(ah * bh, af * bf, "mul");
    as_f32(relu(ah), relu(af), "relu");
  }
  // Column sums of a [rows, cols] f32 block in f64, row by row (a bias gradient), to an f32 result.
  for (const Shape& sh : {Shape{37, 300}, Shape{3, 5, 260}}) {
    const Tensor m = rnd(sh, 73).to(DType::f32);
    const auto mv = m.to_vector();
    const int64_t cols = sh.back(), rows = int64_t(mv.size()) / cols;
    std::vector<double> want(size_t(cols), 0.0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < cols; ++j) want[size_t(j)] += mv[size_t(r * cols + j)];
    const Tensor got = sh.size() == 2 ? sum(m, {0}) : sum(m, {0, 1});
    same(
        got.to_vector(), [&](size_t j) { return float(want[j]); }, "column sums");
  }
}

// f32 uniform and Bernoulli fills run the set's lane-parallel Philox (loops.inc); f64 fills the scalar code of
// kernels/common/random_draw.h, whose values are f32 numbers: the same stream must give the same bits.
TEST_CASE("nn: kernel set loops: f32 random fills give the scalar stream's bits") {
  for (const int64_t n : {int64_t(1), int64_t(63), int64_t(64), int64_t(4099), int64_t(70001)})
    for (const int kind : {0, 1, 2}) {
      INFO("n " << n << " kind " << kind);
      std::vector<std::vector<double>> out;
      for (const DType dt : {DType::f32, DType::f64}) {
        Generator g(1234);
        (void)rand({5}, TensorOptions(dt), &g);  // start the fill at block 2, not at a group of 16
        const Tensor t = kind == 0   ? rand({n}, TensorOptions(dt), &g)
                         : kind == 1 ? uniform({n}, -3.0, 5.0, TensorOptions(dt), &g)
                                     : bernoulli({n}, 0.3, TensorOptions(dt), &g);
        out.push_back(kind == 1 || dt == DType::f32 ? t.to(DType::f32).to_vector() : t.to_vector());
      }
      CHECK(out[0] == out[1]);
      if (kind == 2 && n > 1000) {
        double ones = 0;
        for (const double v : out[0]) ones += v;
        CHECK(std::abs(ones / double(n) - 0.3) < 0.02);
      }
    }
}

// Layer norm's f32 rows (loops.inc) against f64, forward and all three gradients, with and without gamma
// and beta, d below, at and above the sets' lanes.
TEST_CASE("nn: kernel set loops: layer norm f32 rows against f64") {
  for (const int64_t d : {5, 16, 128, 777})
    for (const bool affine : {true, false}) {
      INFO("d " << d << (affine ? " with gamma and beta" : ""));
      std::vector<std::vector<double>> out;
      for (const DType dt : {DType::f32, DType::f64}) {
        Tensor x = (rnd({9, d}, 81) * 3.0 + 1.5).to(DType::f32).to(dt).detach();
        Tensor w = (rnd({d}, 82) + 1.0).to(DType::f32).to(dt).detach(),
               bb = rnd({d}, 83).to(DType::f32).to(dt).detach();
        for (Tensor* t : {&x, &w, &bb}) t->set_requires_grad();
        const Tensor y = affine ? layer_norm(x, {d}, w, bb) : layer_norm(x, {d});
        y.backward(rnd({9, d}, 84).to(DType::f32).to(dt));
        std::vector<double> all = y.to_vector();
        for (const Tensor& t :
             affine ? std::vector<Tensor>{x.grad(), w.grad(), bb.grad()} : std::vector<Tensor>{x.grad()}) {
          const auto v = t.to_vector();
          all.insert(all.end(), v.begin(), v.end());
        }
        out.push_back(all);
      }
      REQUIRE(out[0].size() == out[1].size());
      double worst = 0;
      for (size_t i = 0; i < out[0].size(); ++i)
        worst = std::max(worst, std::abs(out[0][i] - out[1][i]) / (1.0 + std::abs(out[1][i])));
      INFO("worst difference from f64 " << worst);
      CHECK(worst < 2e-5);
    }
}

// GELU's f32 rows run the kernel set's vector erfc (rows.inc's verfc): against f64 over the whole range,
// tails included, under each set (rows_<set> in ctest), in f32 and through bf16's staged blocks.
TEST_CASE("nn: gelu (erf) f32 rows of each kernel set against f64, tails included") {
  const int64_t n = 24001;
  std::vector<double> xs(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) xs[size_t(i)] = -12.0 + 24.0 * double(i) / double(n - 1);
  const Tensor x64 = from_vector(xs, {n});
  Tensor x32 = x64.to(DType::f32).detach();
  x32.set_requires_grad();
  const Tensor y32 = gelu(x32);
  y32.backward(ones({n}));
  const auto y = y32.to_vector(), g = x32.grad().to_vector(), xv = x32.to_vector();
  double worst_rel = 0, worst_grad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double v = xv[size_t(i)], cdf = 0.5 * std::erfc(-v / std::sqrt(2.0));
    const double want = v * cdf, want_g = cdf + v * std::exp(-0.5 * v * v) / std::sqrt(2.0 * M_PI);
    if (std::abs(want) > 1e-30) worst_rel = std::max(worst_rel, std::abs(y[size_t(i)] - want) / std::abs(want));
    worst_grad = std::max(worst_grad, std::abs(g[size_t(i)] - want_g));
  }
  INFO("worst relative error of gelu " << worst_rel << ", worst absolute error of its gradient " << worst_grad);
  CHECK(worst_rel < 2e-5);
  CHECK(worst_grad < 1e-6);
  // bf16 goes through f32 blocks: within bf16's rounding of the f32 result.
  const auto yb = gelu(x64.to(DType::bf16)).to(DType::f32).to_vector();
  const auto yr = gelu(x64.to(DType::bf16).to(DType::f32)).to(DType::bf16).to(DType::f32).to_vector();
  CHECK(yb == yr);
}

// ReLU keeps NaN, as PyTorch's does (max(x, 0) with NaN giving 0 would hide a NaN activation behind a
// finite 0), and its gradient passes where the output is NaN (PyTorch's threshold_backward: y <= 0 ? 0 : g);
// -inf and -0 give +0. The same in batch_norm_relu's fused planes, under each kernel set (rows_<set>).
TEST_CASE("nn: relu and batch_norm_relu keep NaN and pass its gradient, as PyTorch") {
  const double nan = std::nan(""), inf = std::numeric_limits<double>::infinity();
  for (const DType dt : {DType::f32, DType::f64, DType::f16})
    for (const Shape& xs : {Shape{2, 3, 5}, Shape{3, 4, 16, 16}}) {
      INFO(dtype_name(dt) << " " << xs);
      const int64_t n = zeros(xs).numel();
      std::vector<double> rv = rnd(xs, 81).to_vector();
      rv[5] = nan, rv[9] = -inf, rv[11] = -0.0, rv[size_t(n - 1)] = nan;
      const Tensor upstream = rnd(xs, 82, dt);
      const auto gv = upstream.to_vector();
      Tensor a = from_vector(rv, xs).to(dt);
      a.set_requires_grad();
      const Tensor y = relu(a);
      y.backward(upstream);
      const auto yv = y.to_vector(), av = a.grad().to_vector();
      for (const size_t i : {size_t(5), size_t(n - 1)}) {
        CHECK(std::isnan(yv[i]));
        CHECK(av[i] == gv[i]);  // the gradient passes a NaN output
      }
      CHECK((yv[9] == 0 && !std::signbit(yv[9]) && av[9] == 0));
      CHECK((yv[11] == 0 && !std::signbit(yv[11]) && av[11] == 0));
      if (dt == DType::f16) continue;  // batch norm takes f32/f64
      for (const bool training : {true, false}) {
        INFO((training ? "training" : "eval"));
        const int64_t c = xs[1];
        Tensor x = rnd(xs, 83, dt), r = from_vector(rv, xs).to(dt);
        for (Tensor* t : {&x, &r}) t->set_requires_grad();
        Tensor rm = zeros({c}, dt), rvar = ones({c}, dt);
        const Tensor yb = batch_norm_relu(x, rm, rvar, ones({c}, dt), zeros({c}, dt), training, 0.1, 1e-5, r);
        yb.backward(upstream);
        const auto ybv = yb.to_vector(), rg = r.grad().to_vector();
        for (const size_t i : {size_t(5), size_t(n - 1)}) {
          CHECK(std::isnan(ybv[i]));
          CHECK(rg[i] == gv[i]);  // the residual's gradient is the masked gy
        }
        CHECK((ybv[9] == 0 && rg[9] == 0));
        for (const double v : x.grad().to_vector()) CHECK(std::isfinite(v));
      }
      // No residual (the masked gradient then goes through a scratch plane into the sums, and is
      // masked again where x's gradient is made): NaN in beta for channel 0, so channel 0's outputs
      // are NaN from finite x; training (batch statistics) and eval. The gradients pass those outputs:
      // x's, gamma's and beta's are finite, channel 0's not 0, and the fused op gives the bits of the
      // three in a row.
      for (const bool training : {true, false}) {
        INFO((training ? "no residual, training" : "no residual, eval"));
        std::vector<std::vector<double>> outs;
        for (const bool fused : {true, false}) {
          const int64_t c = xs[1];
          std::vector<double> bv = rnd({c}, 85).to_vector();
          bv[0] = nan;
          Tensor x = rnd(xs, 83, dt), g = rnd({c}, 84, dt) + 2.0, b = from_vector(bv, {c}).to(dt);
          for (Tensor* t : {&x, &g, &b}) t->set_requires_grad();
          Tensor rm = rnd({c}, 86, dt) * 0.1, rvar = abs(rnd({c}, 87, dt)) + 0.5;
          const Tensor yb = fused ? batch_norm_relu(x, rm, rvar, g, b, training, 0.1, 1e-5)
                                  : relu(batch_norm(x, rm, rvar, g, b, training, 0.1, 1e-5));
          yb.backward(upstream);
          std::vector<double> all = yb.to_vector();
          const auto xg = x.grad().to_vector(), gg = g.grad().to_vector(), bg = b.grad().to_vector();
          const int64_t plane = n / xs[0] / c;
          int64_t nan_out = 0, finite_grad = 0, zero_grad_c0 = 0;
          for (int64_t i = 0; i < n; ++i) {
            const bool c0 = (i / plane) % c == 0;
            nan_out += std::isnan(all[size_t(i)]) == c0 ? 1 : 0;
            finite_grad += std::isfinite(xg[size_t(i)]) ? 1 : 0;
            zero_grad_c0 += c0 && xg[size_t(i)] == 0 ? 1 : 0;
          }
          CHECK(nan_out == n);  // NaN exactly on channel 0
          CHECK(finite_grad == n);
          CHECK(zero_grad_c0 == 0);
          CHECK((std::isfinite(gg[0]) && std::isfinite(bg[0]) && bg[0] != 0));
          for (const auto* v : {&xg, &gg, &bg}) all.insert(all.end(), v->begin(), v->end());
          for (double& v : all) v = std::isnan(v) ? 12345.0 : v;  // NaN compares unequal: mark it
          outs.push_back(all);
        }
        CHECK(outs[0] == outs[1]);
      }
      // Eval mode with inf and NaN inputs: x's gradient is gamma * rstd * (masked) g everywhere, finite
      // (it read x before: 0 * inf gave NaN), as PyTorch's eval backward.
      for (const bool fused : {true, false}) {
        INFO((fused ? "eval, inf/NaN x, fused" : "eval, inf/NaN x, unfused"));
        const int64_t c = xs[1];
        Tensor x = from_vector(rv, xs).to(dt), g = rnd({c}, 84, dt) + 2.0, b = rnd({c}, 85, dt);
        x.set_requires_grad();
        const Tensor rm = rnd({c}, 86, dt) * 0.1, rvar = abs(rnd({c}, 87, dt)) + 0.5;
        const Tensor yb = fused ? batch_norm_relu(x, rm, rvar, g, b, false, 0.1, 1e-5)
                                : relu(batch_norm(x, rm, rvar, g, b, false, 0.1, 1e-5));
        yb.backward(upstream);
        int64_t finite = 0;
        for (const double v : x.grad().to_vector()) finite += std::isfinite(v) ? 1 : 0;
        CHECK(finite == n);
        CHECK(x.grad().to_vector()[5] != 0);  // a NaN output passes its gradient
      }
    }
}

// ResNet's blocks run "BN, ReLU" and "BN, add the shortcut, ReLU" as batch_norm_relu: the same bits as
// the three ops in a row, forward and every gradient, under each CPU kernel set (rows_<set> in ctest),
// also with planes whose size is not a multiple of the vector width and in eval mode.
TEST_CASE("nn: batch_norm_relu gives the bits of batch_norm, add and relu in a row") {
  for (const DType dt : {DType::f32, DType::f64})
    for (const Shape& xs : {Shape{6, 5, 7, 7}, Shape{3, 4, 16, 16}, Shape{2, 3, 5}})
      for (const bool training : {true, false})
        for (const bool with_residual : {true, false}) {
          INFO(dtype_name(dt) << " " << xs << (training ? " training" : " eval") << (with_residual ? " residual" : ""));
          std::vector<std::vector<double>> runs;
          for (const bool fused : {true, false}) {
            const int64_t c = xs[1];
            Tensor x = rnd(xs, 61, dt), g = rnd({c}, 62, dt), b = rnd({c}, 63, dt), r = rnd(xs, 64, dt);
            for (Tensor* t : {&x, &g, &b, &r}) t->set_requires_grad();
            Tensor rm = rnd({c}, 65, dt) * 0.1, rv = abs(rnd({c}, 66, dt)) + 0.5;
            const Tensor res = with_residual ? r : Tensor();
            const Tensor y = fused ? batch_norm_relu(x, rm, rv, g, b, training, 0.1, 1e-5, res)
                                   : relu(with_residual ? batch_norm(x, rm, rv, g, b, training, 0.1, 1e-5) + r
                                                        : batch_norm(x, rm, rv, g, b, training, 0.1, 1e-5));
            sum(y * rnd(xs, 67, dt)).backward();
            std::vector<double> all = y.to_vector();
            for (const Tensor& t : {x.grad(), g.grad(), b.grad(), rm, rv}) {
              const auto v = t.to_vector();
              all.insert(all.end(), v.begin(), v.end());
            }
            if (with_residual) {
              const auto v = r.grad().to_vector();
              all.insert(all.end(), v.begin(), v.end());
            } else {
              CHECK_FALSE(r.grad().defined());
            }
            runs.push_back(all);
          }
          CHECK(runs[0] == runs[1]);
        }
  CHECK_THROWS_WITH_AS(batch_norm_relu(zeros({2, 3, 4}), {}, {}, {}, {}, true, 0.1, 1e-5, zeros({2, 3, 5})),
                       doctest::Contains("residual must have the input's shape [2,3,4], got [2,3,5]"), kiln::Error);
}

TEST_CASE("nn: cross_entropy against log_softmax + one-hot, ignore_index and smoothing") {
  const Tensor x = rnd({5, 4}, 51);
  const Tensor t = from_vector({0, 3, 1, -100, 2}, {5}, TensorOptions(DType::i64));
  const auto lp = log_softmax(x, 1).to_vector();
  const std::vector<int64_t> tv{0, 3, 1, -100, 2};
  double want = 0, want_s = 0;
  int kept = 0;
  for (int64_t r = 0; r < 5; ++r) {
    if (tv[size_t(r)] < 0) continue;
    ++kept;
    want += -lp[size_t(r * 4 + tv[size_t(r)])];
    double all = 0;
    for (int64_t c = 0; c < 4; ++c) all += -lp[size_t(r * 4 + c)];
    want_s += 0.9 * -lp[size_t(r * 4 + tv[size_t(r)])] + 0.1 * all / 4;
  }
  CHECK(cross_entropy(x, t).item<double>() == doctest::Approx(want / kept));
  CHECK(cross_entropy(x, t, -100, 0.1).item<double>() == doctest::Approx(want_s / kept));
  CHECK(cross_entropy(x, t, -100, 0.0, Reduction::sum).item<double>() == doctest::Approx(want));
  CHECK(nll_loss(log_softmax(x, 1), t).item<double>() == doctest::Approx(want / kept));
  // [N, C, L] layout
  const Tensor t3 = from_vector({0, 2, 1, 1, 0, 2}, {2, 3}, TensorOptions(DType::i64));
  CHECK_THROWS_WITH_AS(cross_entropy(x, from_vector({0, 9, 1, 1, 2}, {5}, TensorOptions(DType::i64))),
                       doctest::Contains("target 9"), kiln::Error);
}

TEST_CASE("nn: cross_entropy with a -inf logit and no smoothing is finite") {
  // Without smoothing the loss must not touch sum(logits) = -inf (0 * inf is NaN): it is the
  // log-sum-exp minus the target's logit, and the -inf logit gets gradient 0.
  const double inf = std::numeric_limits<double>::infinity(), e = std::exp(1.0);
  const double want = std::log(1.0 + e);  // log(e^0 + e^-inf + e^1) - 0
  const std::vector<double> want_g{1.0 / (1.0 + e) - 1.0, 0.0, e / (1.0 + e)};
  const TensorOptions i64(DType::i64);
  for (DType dt : {DType::f32, DType::f64}) {
    INFO("dtype ", dt);
    const double tol = dt == DType::f32 ? 1e-6 : 1e-12;
    Tensor x = from_vector({0, -inf, 1}, {1, 3}, TensorOptions(dt)).set_requires_grad(true);
    const Tensor l = cross_entropy(x, from_vector({0}, {1}, i64));
    CHECK(std::isfinite(l.item<double>()));
    CHECK(l.item<double>() == doctest::Approx(want).epsilon(tol));
    l.backward();
    const std::vector<double> g = x.grad().to_vector();
    for (double v : g) CHECK(std::isfinite(v));
    check_close(g, want_g, tol);
    // With ignored rows, one of them with -inf logits too: the mean counts the kept row only.
    Tensor x2 = from_vector({-inf, 2, 3, 0, -inf, 1, 5, -inf, -inf}, {3, 3}, TensorOptions(dt)).set_requires_grad(true);
    const Tensor t2 = from_vector({-100, 0, -100}, {3}, i64);
    const Tensor l2 = cross_entropy(x2, t2);
    CHECK(l2.item<double>() == doctest::Approx(want).epsilon(tol));
    check_close(cross_entropy(x2, t2, -100, 0.0, Reduction::none).to_vector(), {0, want, 0}, tol);
    l2.backward();
    const std::vector<double> g2 = x2.grad().to_vector();
    for (double v : g2) CHECK(std::isfinite(v));
    check_close(g2, {0, 0, 0, want_g[0], want_g[1], want_g[2], 0, 0, 0}, tol);
  }
}

TEST_CASE("nn: cross_entropy and nll_loss with every target ignored: NaN mean, zero gradient") {
  // PyTorch's: the mean is 0/0 = NaN, the sum 0, and the gradient 0 (a NaN gradient from one fully
  // padded batch would poison every weight it reaches).
  const Tensor t = from_vector({-100, -100}, {2}, TensorOptions(DType::i64));
  const Tensor w = from_vector({0.5, 1, 2}, {3});
  for (DType dt : {DType::f32, DType::f64})
    for (int path = 0; path < 5; ++path) {
      INFO(dt, " path ", path);
      Tensor x = rnd({2, 3}, 71, dt).set_requires_grad();
      const Tensor lw = w.to(dt);
      const Tensor l = path == 0   ? cross_entropy(x, t)
                       : path == 1 ? cross_entropy(x, t, -100, 0.1)
                       : path == 2 ? cross_entropy(x, t, -100, 0.0, Reduction::mean, lw)
                       : path == 3 ? cross_entropy(x, t, -100, 0.1, Reduction::mean, lw)
                                   : nll_loss(log_softmax(x, 1), t, -100, Reduction::mean, lw);
      CHECK(std::isnan(l.item<double>()));
      l.backward();
      CHECK(x.grad().to_vector() == std::vector<double>(6, 0.0));
      Tensor x2 = rnd({2, 3}, 72, dt).set_requires_grad();
      const Tensor l2 = path < 2 ? cross_entropy(x2, t, -100, 0.1 * path, Reduction::sum)
                                 : nll_loss(log_softmax(x2, 1), t, -100, Reduction::sum, lw);
      CHECK(l2.item<double>() == 0);
      l2.backward();
      CHECK(x2.grad().to_vector() == std::vector<double>(6, 0.0));
    }
  // nll_loss without class weights too, and a batch with one kept row is unchanged (its own mean).
  Tensor x = rnd({2, 3}, 73).set_requires_grad();
  const Tensor l = nll_loss(log_softmax(x, 1), t);
  CHECK(std::isnan(l.item<double>()));
  l.backward();
  CHECK(x.grad().to_vector() == std::vector<double>(6, 0.0));
  const Tensor one = from_vector({-100, 2}, {2}, TensorOptions(DType::i64));
  CHECK(nll_loss(log_softmax(x, 1), one, -100, Reduction::mean, w.to(DType::f64)).item<double>() ==
        doctest::Approx(-log_softmax(x, 1).to_vector()[5]));
}

TEST_CASE("nn: cosine_similarity as PyTorch: each norm clamped to eps, zero and tiny vectors, broadcast, 16-bit") {
  // A zero vector: cosine 0; the gradients are PyTorch's (finite: a's is b / |b| / eps, b's is 0), not 0/0.
  Tensor a = zeros({1, 3}).set_requires_grad(), b = from_vector({1, 2, 3}, {1, 3}).set_requires_grad();
  const Tensor c = cosine_similarity(a, b);
  CHECK(c.to_vector() == std::vector<double>{0});
  sum(c).backward();
  const double nb = std::sqrt(14.0);
  check_close(a.grad().to_vector(), {1 / nb / 1e-8, 2 / nb / 1e-8, 3 / nb / 1e-8}, 1e-6);
  CHECK(b.grad().to_vector() == std::vector<double>{0, 0, 0});
  // Two tiny parallel vectors: each norm (1e-5) is above eps, so the cosine is 1 (a clamp of the product
  // of the norms, 1e-10, to 1e-8 gave 0.01).
  const Tensor tiny = from_vector({1e-5, 0, 0}, {1, 3}, DType::f64);
  CHECK(cosine_similarity(tiny, tiny).item<double>() == doctest::Approx(1.0));
  // Broadcast along the reduced dim first, as PyTorch: [2, 1] against [2, 3] is [x, x, x] against the row.
  const Tensor x1 = from_vector({1, -2}, {2, 1}, DType::f64), x2 = from_vector({1, 2, 3, 4, 5, 6}, {2, 3}, DType::f64);
  check_close(cosine_similarity(x1, x2).to_vector(),
              {6 / (std::sqrt(3.0) * nb), -15 / (std::sqrt(3.0) * std::sqrt(77.0))}, 1e-12);
  // 16-bit: squares of 300 overflow f16 (the result was NaN); computed in f32, rounded once.
  for (DType dt : {DType::f16, DType::bf16}) {
    const Tensor y = from_vector({300, 300}, {1, 2}, dt);
    const Tensor cy = cosine_similarity(y, y);
    CHECK(cy.dtype() == dt);
    CHECK(cy.item<double>() == 1.0);
  }
}

TEST_CASE("nn: mse and bce with logits") {
  const Tensor a = rnd({3, 2}, 61), b = rnd({3, 2}, 62);
  CHECK(mse_loss(a, b).item<double>() == doctest::Approx(mean(pow(a - b, 2.0)).item<double>()));
  const Tensor y = from_vector({0, 1, 1, 0, 1, 0}, {3, 2}, TensorOptions(DType::f64));
  const Tensor big = from_vector({15, -15, 3, 0, -2, 12}, {3, 2}, TensorOptions(DType::f64));
  const double l = binary_cross_entropy_with_logits(big, y, Reduction::sum).item<double>();
  const auto bv = big.to_vector(), yv = y.to_vector();
  double want = 0;
  for (size_t i = 0; i < 6; ++i) {
    const double p = 1 / (1 + std::exp(-bv[i]));
    want += -(yv[i] * std::log(p) + (1 - yv[i]) * std::log(1 - p));
  }
  CHECK(l == doctest::Approx(want).epsilon(1e-6));
}

TEST_CASE("nn: embedding with padding_idx") {
  const Tensor w = rnd({6, 3}, 71);
  const Tensor idx = from_vector({1, 0, 5, 1, 2, 0}, {2, 3}, TensorOptions(DType::i64));
  const Tensor e = embedding(w, idx);
  CHECK(e.shape() == Shape{2, 3, 3});
  const auto wv = w.to_vector(), ev = e.to_vector();
  CHECK(ev[3 * 2 + 1] == wv[3 * 5 + 1]);
  Tensor wl = w.clone().set_requires_grad();
  sum(embedding(wl, idx, 0)).backward();
  const auto gv = wl.grad().to_vector();
  CHECK(gv[0] == 0.0);          // padding row gets nothing
  CHECK(gv[3 * 1] == 2.0);      // row 1 used twice
  CHECK(gv[3 * 4] == 0.0);      // unused
  CHECK_THROWS_AS(embedding(w, from_vector({6}, {1}, TensorOptions(DType::i64))), kiln::Error);
}

TEST_CASE("nn: dropout is reproducible and scaled") {
  const Tensor x = ones({1000});
  Generator g1(5), g2(5);
  const Tensor a = dropout(x, 0.3, true, &g1), b = dropout(x, 0.3, true, &g2);
  CHECK(allclose(a, b, 0, 0));
  const auto av = a.to_vector();
  int64_t zeros_n = 0;
  for (double v : av) {
    if (v == 0) {
      ++zeros_n;
    } else {
      CHECK(v == doctest::Approx(1 / 0.7));
    }
  }
  CHECK(zeros_n > 240);
  CHECK(zeros_n < 360);
  CHECK(dropout(x, 0.3, false).same(x));
  // Gradient flows through the kept elements with the same scale.
  Tensor xl = ones({50}).set_requires_grad();
  Generator g3(9), g4(9);
  sum(dropout(xl, 0.5, true, &g3)).backward();
  CHECK(allclose(xl.grad(), dropout(ones({50}), 0.5, true, &g4)));
}

TEST_CASE("nn: masked_softmax equals softmax(scale * x + mask) for every mask broadcast, with gradients") {
  const Tensor x = rnd({2, 3, 4, 5}, 71);
  const Shape mask_shapes[] = {{5}, {2, 1, 1, 5}, {4, 5}, {2, 3, 4, 5}, {2, 3, 4, 1}, {1}, {3, 1, 5}};
  for (DType dt : {DType::f64, DType::f32}) {
    const Tensor xd = x.to(dt);
    check_close(masked_softmax(xd, Tensor(), 0.7).to_vector(), softmax(xd * 0.7, -1).to_vector(), 1e-6);
    for (const Shape& ms : mask_shapes) {
      INFO("mask " << ms << " " << dt);
      const Tensor m = rnd(ms, 72).to(dt);
      check_close(masked_softmax(xd, m, 0.5).to_vector(), softmax(xd * 0.5 + m, -1).to_vector(), 1e-6);
    }
    // A bool mask keeps its True places, as PyTorch's scaled_dot_product_attention: the additive mask
    // 0 there and -inf elsewhere, no weight where False (it added 0 or 1, as x + mask).
    const Tensor bm = lt(rand({4, 5}, DType::f64), scalar_tensor(0.5, DType::f64));
    const Tensor add =
        masked_fill(zeros({4, 5}, TensorOptions(dt)), logical_not(bm), -std::numeric_limits<double>::infinity());
    const std::vector<double> kept = masked_softmax(xd, bm).to_vector();
    check_close(kept, masked_softmax(xd, add).to_vector(), 1e-12);
    const std::vector<double> keep = bm.expand(xd.shape()).to_vector();
    for (size_t i = 0; i < kept.size(); ++i)
      if (keep[i] == 0) CHECK(kept[i] == 0.0);
  }
  // A fully masked row follows softmax's rule (0/0), a partly masked one puts no weight on -inf.
  Tensor inf_mask = zeros({2, 5}, TensorOptions(DType::f64));
  inf_mask.narrow(0, 0, 1).fill_(-std::numeric_limits<double>::infinity());
  inf_mask.narrow(0, 1, 1).narrow(1, 0, 2).fill_(-std::numeric_limits<double>::infinity());
  const Tensor xr = rnd({2, 5}, 73);
  const std::vector<double> got = masked_softmax(xr, inf_mask).to_vector(), want = softmax(xr + inf_mask, -1).to_vector();
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i);
    CHECK(std::isnan(got[i]) == std::isnan(want[i]));
    if (!std::isnan(want[i])) CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-12));
  }
  CHECK(got[5] == 0.0);
  // Gradients to x and to a floating mask (summed over its broadcast dims).
  CHECK_THROWS_WITH_AS(masked_softmax(x, rnd({3, 5}, 1)), doctest::Contains("does not broadcast"), kiln::Error);
  CHECK_THROWS_WITH_AS(masked_softmax(x, rnd({1, 2, 3, 4, 5}, 1)), doctest::Contains("more dims"), kiln::Error);
}

TEST_CASE("nn: attention equals its definition and has gradients") {
  const Tensor q = rnd({2, 2, 3, 4}, 81), k = rnd({2, 2, 5, 4}, 82), v = rnd({2, 2, 5, 3}, 83);
  Tensor mask = zeros({2, 1, 1, 5}, TensorOptions(DType::f64));
  mask.narrow(3, 3, 2).fill_(-1e9);  // pad the last two keys
  const Tensor out = scaled_dot_product_attention(q, k, v, mask);
  const Tensor p = softmax(matmul(q, k.transpose(-1, -2)) / 2.0 + mask, -1);
  check_close(out.to_vector(), matmul(p, v).to_vector(), 1e-12);
  // Padded keys carry no weight.
  CHECK(amax(p.narrow(3, 3, 2)).item<double>() < 1e-12);
  const Tensor mask4 = mask.narrow(0, 0, 1).narrow(3, 1, 4);  // [1,1,1,4], last key padded
  // Grouped-query heads must divide the query heads: 4 over 3 is an error naming both.
  CHECK_THROWS_WITH_AS(scaled_dot_product_attention(rnd({1, 4, 2, 8}, 1), rnd({1, 3, 2, 8}, 2), rnd({1, 3, 2, 8}, 3)),
                       doctest::Contains("q has 4 heads (dim -3), not a multiple of k and v's 3"), kiln::Error);
}

TEST_CASE("nn: cat, stack, split, index_select, gather, scatter_add, one_hot, masked_fill") {
  const Tensor a = rnd({2, 3}, 91), b = rnd({2, 1}, 92);
  const Tensor c = cat({a, b}, 1);
  CHECK(c.shape() == Shape{2, 4});
  CHECK(c.to_vector()[3] == b.to_vector()[0]);
  CHECK(stack({a, a}, 0).shape() == Shape{2, 2, 3});
  const auto parts = split(c, 3, 1);
  REQUIRE(parts.size() == 2);
  CHECK(parts[1].shape() == Shape{2, 1});
  CHECK_THROWS_AS(cat({a, rnd({3, 3}, 1)}, 1), kiln::Error);

  const Tensor idx = from_vector({2, 0, 2}, {3}, TensorOptions(DType::i64));
  const Tensor s = index_select(a, 1, idx);
  CHECK(s.shape() == Shape{2, 3});
  CHECK(s.to_vector()[0] == a.to_vector()[2]);
  CHECK_THROWS_AS(index_select(a, 1, from_vector({3}, {1}, TensorOptions(DType::i64))), kiln::Error);

  const Tensor gi = from_vector({0, 2, 1, 1}, {2, 2}, TensorOptions(DType::i64));
  const Tensor gth = gather(a, 1, gi);
  const auto av = a.to_vector();
  CHECK(gth.to_vector() == std::vector<double>{av[0], av[2], av[4], av[4]});
  const Tensor sa = scatter_add(zeros({2, 3}, TensorOptions(DType::f64)), 1, gi, ones({2, 2}, TensorOptions(DType::f64)));
  CHECK(sa.to_vector() == std::vector<double>{1, 0, 1, 0, 2, 0});

  const Tensor oh = one_hot(from_vector({2, 0}, {2}, TensorOptions(DType::i64)), 3);
  CHECK(oh.dtype() == DType::i64);
  CHECK(oh.to_vector() == std::vector<double>{0, 0, 1, 1, 0, 0});
  CHECK_THROWS_AS(one_hot(from_vector({3}, {1}, TensorOptions(DType::i64)), 3), kiln::Error);
  const Tensor mf = masked_fill(a, gt(a, scalar_like(0, a)), -1.0);
  for (double v : mf.to_vector()) CHECK(v <= 0.0);
}

TEST_CASE("nn: a small CNN learns a synthetic task") {
  // Class = which half of the image is brighter; conv -> relu -> pool -> linear.
  Generator gen(3);
  const int64_t n = 64;
  Tensor x = randn({n, 1, 8, 8}, {}, &gen);
  std::vector<double> labels(static_cast<size_t>(n));
  {
    const auto xv = x.to_vector();
    for (int64_t i = 0; i < n; ++i) {
      double left = 0, right = 0;
      for (int64_t r = 0; r < 8; ++r)
        for (int64_t c = 0; c < 8; ++c) (c < 4 ? left : right) += xv[size_t(i * 64 + r * 8 + c)];
      labels[size_t(i)] = left > right ? 0 : 1;
    }
  }
  const Tensor y = from_vector(labels, {n}, TensorOptions(DType::i64));
  Tensor w1 = (randn({4, 1, 3, 3}, {}, &gen) * 0.5).detach().set_requires_grad();
  Tensor b1 = zeros({4}).set_requires_grad();
  Tensor w2 = (randn({4 * 16, 2}, {}, &gen) * 0.1).detach().set_requires_grad();
  std::vector<Tensor> params{w1, b1, w2};
  double first = 0, last = 0;
  for (int step = 0; step < 60; ++step) {
    const Tensor h = max_pool2d(relu(conv2d(x, w1, b1, {1, 1}, {1, 1})), {2, 2});
    const Tensor loss = cross_entropy(matmul(h.flatten(1), w2), y);
    if (step == 0) first = loss.item<double>();
    last = loss.item<double>();
    for (Tensor& p : params) p.set_grad(Tensor());
    loss.backward();
    NoGradGuard ng;
    for (Tensor& p : params) p.add_(p.grad(), -0.2);
  }
  CHECK(last < 0.5 * first);
}

TEST_CASE("nn: non-contiguous inputs and 16-bit dtypes") {
  // Each op on a permuted / strided view equals the op on its contiguous copy, and has gradients.
  const Tensor base = rnd({3, 4, 6, 5}, 101);
  const Tensor v = base.permute({0, 1, 3, 2});  // [3,4,5,6], non-contiguous
  REQUIRE(!v.is_contiguous());
  check_close(layer_norm(v, {6}).to_vector(), layer_norm(v.contiguous(), {6}).to_vector(), 1e-12);
  check_close(batch_norm(v, {}, {}, {}, {}, true).to_vector(), batch_norm(v.contiguous(), {}, {}, {}, {}, true).to_vector(), 1e-12);
  check_close(max_pool2d(v, {2, 2}).to_vector(), max_pool2d(v.contiguous(), {2, 2}).to_vector(), 1e-15);
  check_close(softmax(v, 2).to_vector(), softmax(v.contiguous(), 2).to_vector(), 1e-12);
  const Tensor strided = base.slice(3, 0, 5, 2);  // every other column
  check_close(avg_pool2d(strided, {2, 1}).to_vector(), avg_pool2d(strided.contiguous(), {2, 1}).to_vector(), 1e-12);
  check_grad([](const std::vector<Tensor>& t) { return layer_norm(t[0].transpose(0, 1), {2}); }, {rnd({2, 3}, 102)});
  check_grad([](const std::vector<Tensor>& t) { return batch_norm(t[0].permute({1, 0, 2}), {}, {}, {}, {}, true); },
             {rnd({2, 3, 2}, 103)});
  check_grad([](const std::vector<Tensor>& t) { return max_pool2d(t[0].slice(3, 0, 6, 2), {2, 2}, {1, 1}); },
             {rnd({1, 1, 3, 6}, 104)});
  const Tensor tgt = from_vector({1, 0, 2}, {3}, TensorOptions(DType::i64));
  check_grad([&](const std::vector<Tensor>& t) { return cross_entropy(t[0].t(), tgt); }, {rnd({4, 3}, 105)});
  // Broadcasting gamma through a stride-0 expanded weight.
  check_grad([](const std::vector<Tensor>& t) { return layer_norm(t[0], {4}, t[1].expand({4}), {}); },
             {rnd({2, 4}, 106), rnd({1}, 107)});

  // f16 / bf16 compute in f32 and return their own dtype, close to the f32 result.
  const Tensor x = rnd({2, 3, 6, 6}, 108, DType::f32), w = rnd({4, 3, 3, 3}, 109, DType::f32);
  for (DType dt : {DType::f16, DType::bf16}) {
    const Tensor y = conv2d(x.to(dt), w.to(dt), {}, {1, 1}, {1, 1});
    CHECK(y.dtype() == dt);
    CHECK(allclose(y.to(DType::f32), conv2d(x.to(dt).to(DType::f32), w.to(dt).to(DType::f32), {}, {1, 1}, {1, 1}),
                   dt == DType::f16 ? 2e-3 : 1e-2, dt == DType::f16 ? 2e-3 : 2e-2));
    const Tensor ln = layer_norm(x.to(dt), {6});
    CHECK(ln.dtype() == dt);
    CHECK(allclose(ln.to(DType::f32), layer_norm(x.to(dt).to(DType::f32), {6}), 1e-2, 1e-2));
    CHECK(cross_entropy(x.to(dt).reshape({-1, 6}), zeros({36}, TensorOptions(DType::i64))).dtype() == dt);
  }
}

TEST_CASE("nn: channels_last tensors: layout, copies, and elementwise ops keep it") {
  const Tensor x = rnd({2, 3, 4, 5}, 101, DType::f32);
  CHECK_FALSE(x.is_channels_last());
  const Tensor xl = x.contiguous(MemoryFormat::channels_last);
  CHECK(xl.is_channels_last());
  CHECK(xl.strides() == Shape{60, 1, 15, 3});
  CHECK(xl.to_vector() == x.to_vector());
  CHECK(xl.contiguous(MemoryFormat::channels_last).same(xl));  // already in that layout: no copy
  CHECK(xl.contiguous().is_contiguous());
  CHECK(make_tensor({2, 3, 4, 5}, DType::f32, kCPU, MemoryFormat::channels_last).is_channels_last());
  // A size-1 channel or plane is both layouts at once: not "channels_last" for the ops.
  CHECK_FALSE(rnd({2, 1, 4, 5}, 1).contiguous(MemoryFormat::channels_last).is_channels_last());
  CHECK_THROWS_WITH_AS(rnd({2, 3}, 1).contiguous(MemoryFormat::channels_last), doctest::Contains("4-D"), kiln::Error);
  // An empty tensor is channels_last-contiguous only with NHWC strides, as PyTorch's (a size-0 dim counted as 0).
  const Tensor e = zeros({2, 0, 4, 5});
  CHECK_FALSE(e.is_contiguous(MemoryFormat::channels_last));
  CHECK(e.contiguous(MemoryFormat::channels_last).strides() == Shape{0, 1, 0, 0});
  CHECK(e.contiguous(MemoryFormat::channels_last).is_contiguous(MemoryFormat::channels_last));
  // Elementwise results keep the layout (and the values).
  const Tensor b = rnd({3, 1, 1}, 102, DType::f32);
  for (const Tensor& r : {relu(xl), xl + b, xl * xl, where(gt(xl, b), xl, b), xl.to(DType::f64)}) {
    CHECK(r.is_channels_last());
  }
  CHECK((xl + b).to_vector() == (x + b).to_vector());
  CHECK(relu(xl).to_vector() == relu(x).to_vector());
  // The copy is differentiable.
  Tensor xg = x.detach().set_requires_grad();
  sum(xg.contiguous(MemoryFormat::channels_last) * 2.0).backward();
  CHECK(allclose(xg.grad(), full_like(x, 2.0)));
}

// On the CPU, channels_last inputs run the NCHW kernels on copies: every output, and every gradient,
// must be bit-identical to the NCHW run, and outputs and input gradients must come back channels_last.
TEST_CASE("nn: conv2d, batch norm and pooling on channels_last inputs equal the NCHW results") {
  using Fn = std::function<Tensor(const Tensor&, const Tensor&)>;
  const std::pair<const char*, Fn> ops[] = {
      {"conv2d", [](const Tensor& x, const Tensor& w) { return conv2d(x, w, {}, {1, 1}, {1, 1}); }},
      {"conv2d strided", [](const Tensor& x, const Tensor& w) { return conv2d(x, w, {}, {2, 2}, {0, 0}); }},
      {"batch_norm", [](const Tensor& x, const Tensor&) { return batch_norm(x, {}, {}, {}, {}, true, 0.1, 1e-5); }},
      {"max_pool2d", [](const Tensor& x, const Tensor&) { return max_pool2d(x, {2, 2}); }},
      {"avg_pool2d", [](const Tensor& x, const Tensor&) { return avg_pool2d(x, {3, 3}, {1, 1}, {1, 1}); }},
  };
  for (const auto& [name, op] : ops) {
    INFO(std::string(name));
    std::vector<double> results[2];
    for (int cl = 0; cl < 2; ++cl) {
      Tensor x = rnd({3, 6, 8, 7}, 111, DType::f32), w = rnd({5, 6, 3, 3}, 112, DType::f32);
      if (cl) x = x.contiguous(MemoryFormat::channels_last);
      x = x.detach().set_requires_grad();
      w.set_requires_grad();
      const Tensor y = op(x, w);
      CHECK(y.is_channels_last() == bool(cl));
      sum(y * y).backward();
      CHECK(x.grad().is_channels_last() == bool(cl));
      results[cl] = y.to_vector();
      for (const Tensor& g : {x.grad(), w.grad()})
        if (g.defined()) {
          const auto v = g.to_vector();
          results[cl].insert(results[cl].end(), v.begin(), v.end());
        }
    }
    CHECK(results[0] == results[1]);
  }
}

TEST_CASE("nn: transposed, 1-D, 3-D and same-padded convolutions and the composed norms refuse bad input by name") {
  const Tensor x = randn({1, 4, 5, 5}), w = randn({4, 2, 3, 3});
  CHECK(conv_transpose2d(x, w, {}, {2, 2}, {1, 1}, {1, 1}).shape() == Shape{1, 2, 10, 10});
  CHECK_THROWS_WITH_AS(conv_transpose2d(x, w, {}, {2, 2}, {0, 0}, {2, 0}), doctest::Contains("output_padding [2,0]"),
                       kiln::Error);
  CHECK_THROWS_WITH_AS(conv_transpose2d(randn({1, 3, 5, 5}), w), doctest::Contains("has 3 channels"), kiln::Error);
  CHECK_THROWS_WITH_AS(conv_transpose2d(x, w, {}, {1, 1}, {4, 4}), doctest::Contains("empty output"), kiln::Error);
  CHECK_THROWS_WITH_AS(conv1d(x, randn({2, 4, 3})), doctest::Contains("conv1d: input must be [N, C, L]"), kiln::Error);
  CHECK_THROWS_WITH_AS(conv3d(randn({1, 4, 2, 5, 5}), randn({2, 4, 3, 3, 3})), doctest::Contains("too small"),
                       kiln::Error);
  CHECK_THROWS_WITH_AS(conv3d(randn({1, 4, 2, 5, 5}), randn({2, 4, 1, 3, 3}), randn({3})),
                       doctest::Contains("bias [3] must be [2]"), kiln::Error);
  // "same" keeps every size, for odd and even kernels.
  CHECK(conv2d(x, randn({3, 4, 2, 4}), {}, kSame).shape() == Shape{1, 3, 5, 5});
  CHECK(conv3d(randn({1, 2, 3, 4, 5}), randn({3, 2, 2, 3, 4}), {}, kSame).shape() == Shape{1, 3, 3, 4, 5});
  CHECK_THROWS_WITH_AS(group_norm(x, 3), doctest::Contains("num_groups 3 must divide the channels 4"), kiln::Error);
  CHECK_THROWS_WITH_AS(group_norm(x, 2, randn({3})), doctest::Contains("gamma [3] must be [4]"), kiln::Error);
  CHECK_THROWS_WITH_AS(rms_norm(x, {4}), doctest::Contains("trailing dims"), kiln::Error);
  CHECK_THROWS_WITH_AS(local_response_norm(x, 0), doctest::Contains("size must be >= 1"), kiln::Error);
  // Pooling sizes as PyTorch gives them: ceil mode adds the window hanging over the end, unless it
  // would start in the right padding.
  CHECK(max_pool2d(randn({1, 1, 5, 5}), {2, 2}, {2, 2}, {0, 0}, {1, 1}, true).shape() == Shape{1, 1, 3, 3});
  CHECK(max_pool2d(randn({1, 1, 5, 5}), {2, 2}, {2, 2}, {1, 1}, {1, 1}, true).shape() == Shape{1, 1, 3, 3});
  CHECK(avg_pool1d(randn({1, 6}), 3, 2, 1, true, true).shape() == Shape{1, 4});
  CHECK(max_pool3d(randn({1, 2, 5, 4, 3}), {2, 2, 2}).shape() == Shape{1, 2, 2, 2, 1});
  CHECK_THROWS_WITH_AS(max_pool3d(randn({1, 2, 5, 4, 3}), {2, 2, 2}, {}, {2, 0, 0}),
                       doctest::Contains("max_pool3d: padding [2,0,0]"), kiln::Error);
  CHECK_THROWS_WITH_AS(avg_pool2d(x, {2, 2}, {}, {}, true, false, -1), doctest::Contains("divisor_override"),
                       kiln::Error);
  const ValuesIndices m = max_pool2d_with_indices(x, {2, 2});
  CHECK_THROWS_WITH_AS(max_unpool2d(m.values, m.indices.to(DType::i32), {2, 2}),
                       doctest::Contains("indices must be i64"), kiln::Error);
  CHECK_THROWS_AS(max_unpool2d(m.values, m.indices + 100, {2, 2}), kiln::Error);  // past the output plane
  CHECK_THROWS_WITH_AS(max_unpool2d(m.values, m.indices, {2, 2}), doctest::Contains("is out of range [0, 16)"),
                       kiln::Error);  // the 5x5 input needs output_size
  CHECK(max_unpool2d(m.values, m.indices, {2, 2}, {}, {}, Pair{5, 5}).shape() == Shape{1, 4, 5, 5});
  const Tensor five = from_vector({0, 5, 2}, {3}, DType::i64);
  CHECK_THROWS_WITH_AS(one_hot(five, 4), doctest::Contains("indices span [0, 5], outside [0, 4)"), kiln::Error);
  CHECK(one_hot(five, 4, OutOfRange::zeros).to_vector() == std::vector<double>{1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0});
  CHECK_THROWS_WITH_AS(masked_scatter(zeros({2, 3}), ones({2, 3}).to(DType::boolean), zeros({5})),
                       doctest::Contains("selects 6 elements but src [5] has 5"), kiln::Error);
  CHECK_THROWS_WITH_AS(masked_scatter(zeros({2, 3}), ones({3, 3}).to(DType::boolean), zeros({9})),
                       doctest::Contains("does not broadcast"), kiln::Error);
  CHECK(nonzero(zeros({2, 2})).shape() == Shape{0, 2});
  CHECK_THROWS_WITH_AS(index_put(zeros({5, 2}), {from_vector({1, 5}, {2}, DType::i64)}, ones({1})),
                       doctest::Contains("index_put: indices for dim 0 span [1, 5], outside [-5, 5)"), kiln::Error);
  CHECK_THROWS_WITH_AS(index_put(zeros({5, 2}), {from_vector({1, 2}, {2}, DType::i64)}, ones({3})),
                       doctest::Contains("do not broadcast to [2,2]"), kiln::Error);
  CHECK_THROWS_WITH_AS(einsum("ii->i", {zeros({3, 3})}), doctest::Contains("repeats within operand 0"), kiln::Error);
  CHECK_THROWS_WITH_AS(einsum("ij,jk->ik", {zeros({3, 4}), zeros({5, 2})}),
                       doctest::Contains("label 'j' has sizes 4 and 5"), kiln::Error);
  CHECK_THROWS_WITH_AS(einsum("ij->iq", {zeros({3, 4})}), doctest::Contains("output label 'q'"), kiln::Error);
  CHECK_THROWS_WITH_AS(einsum("ijk->i", {zeros({3, 4})}), doctest::Contains("has 2 dims but 'ijk' names 3"),
                       kiln::Error);
  CHECK_THROWS_WITH_AS(scatter_reduce(zeros({3}), 0, from_vector({3}, {1}, DType::i64), ones({1}), ScatterReduce::amax),
                       doctest::Contains("index 3 is out of range [0, 3)"), kiln::Error);
  CHECK_THROWS_WITH_AS(zeros({4}).slice(0, 0, 4, 0), doctest::Contains("step must not be 0"), kiln::Error);
  CHECK(zeros({4}).slice(0, 0, 4, -1).numel() == 0);  // start 0 is not above end 3
}

// Rows far from 0 in every CPU kernel set: the f32 lanes of the row sums see x - x[0] (layer norm)
// or x - max (cross-entropy), so a constant row normalises to exactly 0 and huge logits keep log(sum).
TEST_CASE("norms and cross-entropy keep their precision far from 0 in every CPU kernel set") {
  const CpuIsa before = cpu_isa();
  for (CpuIsa isa : {CpuIsa::generic, CpuIsa::avx2, CpuIsa::avx512}) {
    if (isa > cpu_isa_supported()) continue;
    set_cpu_isa(isa);
    CAPTURE(std::string(cpu_isa_name(isa)));
    // A constant row of 12345.678 (768 wide) gave outputs up to 0.84; group norm uses the same rows.
    const Tensor ln = layer_norm(full({2, 768}, 12345.678), {768});
    CHECK(amax(abs(ln)).item<double>() == 0.0);
    CHECK(amax(abs(group_norm(full({1, 4, 16, 16}, 1234.567), 2))).item<double>() == 0.0);
    // Logits of 1e17: the loss is log(4) and the target's gradient -3/4 (they were 0 and 0).
    Tensor big = full({1, 4}, 1e17);
    big.set_requires_grad(true);
    const Tensor target = from_vector({2}, {1}, DType::i64);
    const Tensor loss = cross_entropy(big, target);
    CHECK(loss.item<double>() == doctest::Approx(std::log(4.0)).epsilon(1e-6));
    loss.backward();
    CHECK(big.grad().to_vector()[2] == doctest::Approx(-0.75).epsilon(1e-6));
    // Label smoothing over 30522 classes offset by 1e4: the f64 reference to 1e-7 (was 7e-7).
    std::vector<double> lv(30522);
    for (size_t i = 0; i < lv.size(); ++i) lv[i] = 1e4 + double((i * 104729) % 1000) / 250.0 - 2.0;
    const Tensor logits = from_vector(lv, {1, 30522});
    const Tensor t7 = from_vector({7}, {1}, DType::i64);
    const double got = cross_entropy(logits, t7, -100, 0.1).item<double>();
    const double ref = cross_entropy(logits.to(DType::f64), t7, -100, 0.1).item<double>();
    CHECK(std::abs(got - ref) < 1e-7 * std::abs(ref));
  }
  set_cpu_isa(before);
}

// One long contiguous row is split among the threads (kernels/cpu/loops.h). Split points that
// moved with the thread count gave a leaf's scalar tail other elements than its vector body, so
// GELU's gradient differed in the last bit in 7 of 524288 elements between 1 and 3 threads.
TEST_CASE("elementwise leaves give the same bits at 1, 2 and 3 threads in every CPU kernel set") {
  const CpuIsa before = cpu_isa();
  const int saved = num_threads();
  const int64_t n = 524288 + 37;  // not a multiple of any vector width
  const Tensor x0 = rnd({n}, 31, DType::f32) * 3.0, g = rnd({n}, 32, DType::f32);
  for (CpuIsa isa : {CpuIsa::generic, CpuIsa::avx2, CpuIsa::avx512}) {
    if (isa > cpu_isa_supported()) continue;
    set_cpu_isa(isa);
    CAPTURE(std::string(cpu_isa_name(isa)));
    std::vector<std::vector<double>> runs;
    for (int threads : {1, 2, 3}) {
      set_num_threads(threads);
      std::vector<double> all;
      for (int op = 0; op < 4; ++op) {
        Tensor x = x0.detach();
        x.set_requires_grad();
        const Tensor y = op == 0 ? gelu(x) : op == 1 ? gelu(x, GeluApprox::tanh) : op == 2 ? sigmoid(x) : tanh(x);
        y.backward(g);
        for (const Tensor& t : {y, x.grad()}) {
          const auto v = t.to_vector();
          all.insert(all.end(), v.begin(), v.end());
        }
      }
      runs.push_back(all);
    }
    CHECK(runs[0] == runs[1]);
    CHECK(runs[0] == runs[2]);
  }
  set_num_threads(saved);
  set_cpu_isa(before);
}

// The reductions, normalisations, losses, index and random kernels and the GEMM/conv paths, audited
// for the same promise (docs/architecture.md): each at 1, 2 and 3 threads in every kernel set, on
// sizes past the split thresholds (one long row, many rows, columns, odd lengths), bits compared.
TEST_CASE("reductions, norms, losses, index, random and GEMM kernels give the same bits at 1, 2 and 3 threads") {
  const CpuIsa before = cpu_isa();
  const int saved = num_threads();
  const int64_t n = 524288 + 37;
  const Tensor flat = rnd({n}, 41, DType::f32) * 2.0 + 0.5;
  const Tensor rows = rnd({700, 1001}, 42, DType::f32) * 3.0;  // many odd rows
  const Tensor rows_g = rnd({700, 1001}, 43, DType::f32);
  const Tensor planes = rnd({8, 24, 17, 17}, 44, DType::f32) + 1.0;
  const Tensor planes_g = rnd({8, 24, 17, 17}, 45, DType::f32);
  std::vector<double> tv(700), iv(5000);
  for (size_t i = 0; i < tv.size(); ++i) tv[i] = double((i * 7919) % 1001);
  for (size_t i = 0; i < iv.size(); ++i) iv[i] = double((i * 104729) % 97);  // many repeats
  const Tensor target = from_vector(tv, {700}, DType::i64);
  const Tensor ids = from_vector(iv, {50, 100}, DType::i64);
  const Tensor ma = rnd({517, 900}, 46, DType::f32), mb = rnd({900, 130}, 47, DType::f32);
  for (CpuIsa isa : {CpuIsa::generic, CpuIsa::avx2, CpuIsa::avx512}) {
    if (isa > cpu_isa_supported()) continue;
    set_cpu_isa(isa);
    std::vector<std::vector<std::vector<double>>> runs;  // [threads][check]
    for (int threads : {1, 2, 3}) {
      set_num_threads(threads);
      std::vector<std::vector<double>> got;
      auto keep = [&](const Tensor& t) { got.push_back(t.to_vector()); };
      // Reductions over everything, a long row, rows and columns.
      // (f32 sums accumulate in f64, where a moved chunk edge rarely shows: f64 data too.)
      for (const Tensor& t : {flat, rows, flat.to(DType::f64), rows.to(DType::f64)}) {
        keep(sum(t));
        keep(mean(t));
        keep(var(t));
        keep(norm(t));
        keep(logsumexp(t));
      }
      for (int64_t d : {0, 1}) {
        keep(sum(rows.to(DType::f64), {d}));
        keep(sum(rows, {d}));
        keep(var(rows, {d}));
        keep(norm(rows, 2.0, {d}));
        keep(amax(rows, {d}));
        keep(cumsum(rows, d));
      }
      keep(sum(rows.to(DType::bf16), {1}).to(DType::f32));
      // Softmax and log-softmax over rows and over columns (inner > 1), forward and backward.
      for (int64_t d : {1, 0})
        for (int lg = 0; lg < 2; ++lg) {
          Tensor x = rows.detach();
          x.set_requires_grad();
          const Tensor y = lg ? log_softmax(x, d) : softmax(x, d);
          y.backward(rows_g);
          keep(y);
          keep(x.grad());
        }
      {  // layer norm with gamma and beta
        Tensor x = rows.detach(), w = rnd({1001}, 48, DType::f32) + 1.0, b = rnd({1001}, 49, DType::f32);
        for (Tensor* t : {&x, &w, &b}) t->set_requires_grad();
        const Tensor y = layer_norm(x, {1001}, w, b);
        y.backward(rows_g);
        for (const Tensor& t : {y, x.grad(), w.grad(), b.grad()}) keep(t);
      }
      {  // batch norm's statistics in training, and its backward
        Tensor x = planes.detach(), w = rnd({24}, 50, DType::f32) + 1.0, b = rnd({24}, 51, DType::f32);
        for (Tensor* t : {&x, &w, &b}) t->set_requires_grad();
        Tensor rm = zeros({24}, TensorOptions(DType::f32)), rv = ones({24}, TensorOptions(DType::f32));
        const Tensor y = batch_norm(x, rm, rv, w, b, true);
        y.backward(planes_g);
        for (const Tensor& t : {y, x.grad(), w.grad(), b.grad(), rm, rv}) keep(t);
      }
      {  // cross entropy with label smoothing
        Tensor x = rows.detach();
        x.set_requires_grad();
        const Tensor l = cross_entropy(x, target, -100, 0.1);
        l.backward();
        keep(l);
        keep(x.grad());
      }
      {  // index kernels: gather, scatter_add, embedding and index_select backward (repeated indices)
        Tensor w = rnd({97, 300}, 52, DType::f32);
        w.set_requires_grad();
        const Tensor e = embedding(w, ids);
        e.backward(rnd({50, 100, 300}, 53, DType::f32));
        keep(e);
        keep(w.grad());
        Tensor w2 = rows.detach();
        w2.set_requires_grad();
        const Tensor s = index_select(w2, 1, ids.reshape({-1}));
        s.backward(rnd({700, 5000}, 54, DType::f32));
        keep(w2.grad());
        const Tensor gi = from_vector(std::vector<double>(iv.begin(), iv.begin() + 700), {700, 1}, DType::i64);
        keep(gather(rows, 1, gi));
        keep(scatter_add(zeros({700, 97}, TensorOptions(DType::f32)), 1,
                         ids.reshape({-1}).narrow(0, 0, 4900).reshape({700, 7}), rows.narrow(1, 0, 7)));
      }
      // Random streams: they must not depend on where the work is cut.
      for (DType dt : {DType::f32, DType::f64, DType::bf16}) {
        Generator g1(60), g2(61), g3(62), g4(63);
        keep(rand({n}, TensorOptions(dt), &g1).to(DType::f32));
        keep(randn({n}, TensorOptions(dt), &g2).to(DType::f32));
        keep(bernoulli({n}, 0.3, TensorOptions(dt), &g3).to(DType::f32));
        keep(dropout(flat.to(dt), 0.25, true, &g4).to(DType::f32));
      }
      {  // GEMM (Eigen in the generic set, the packed leaves otherwise) and a convolution, with gradients
        Tensor a = ma.detach(), b = mb.detach();
        a.set_requires_grad();
        b.set_requires_grad();
        const Tensor c = matmul(a, b);
        c.backward(rnd({517, 130}, 55, DType::f32));
        for (const Tensor& t : {c, a.grad(), b.grad()}) keep(t);
        Tensor qa = rnd({6, 130, 200}, 58, DType::f32), kb = rnd({6, 200, 70}, 59, DType::f32);
        qa.set_requires_grad();
        kb.set_requires_grad();
        const Tensor bc = matmul(qa, kb);  // a batch of small products, one per task
        bc.backward(rnd(bc.shape(), 64, DType::f32));
        for (const Tensor& t : {bc, qa.grad(), kb.grad()}) keep(t);
        Tensor q = rnd({2, 4, 130, 64}, 65, DType::f32);
        q.set_requires_grad();
        AttentionOptions ao;  // the masked softmax kernel, causal, with dropout
        ao.causal = Causal::top_left;
        ao.dropout_p = 0.1;
        ao.training = true;
        Generator ga(66);
        ao.gen = &ga;
        const Tensor at = attention(q, q * 0.5, q * 0.25, {}, ao).out;
        at.backward(rnd(at.shape(), 67, DType::f32));
        keep(at);
        keep(q.grad());
        for (int64_t stride : {1, 2}) {  // stride 2: the phase-by-phase input gradient, its bands per thread
          Tensor x = rnd({8, 32, 17, 17}, 68, DType::f32), w = rnd({32, 32, 3, 3}, 56, DType::f32);
          x.set_requires_grad();
          w.set_requires_grad();
          const Tensor y = conv2d(x, w, {}, {stride, stride}, {1, 1});
          y.backward(rnd(y.shape(), 57, DType::f32));
          for (const Tensor& t : {y, x.grad(), w.grad()}) keep(t);
        }
      }
      runs.push_back(got);
    }
    for (size_t t = 1; t < runs.size(); ++t)
      for (size_t k = 0; k < runs[0].size(); ++k) {
        const std::string set = cpu_isa_name(isa);
        CAPTURE(set);
        CAPTURE(t + 1);  // threads
        CAPTURE(k);      // which check, in the order above
        CHECK(runs[t][k] == runs[0][k]);
      }
  }
  set_num_threads(saved);
  set_cpu_isa(before);
}

// The fixed chunks of a long row are even (the threads' shares balanced) and depend on the length
// only: 100000 elements were 32768, 32768, 32768 and 1696 (two threads: 65536 and 34464).
TEST_CASE("parallel_for_fixed cuts a range into even chunks that depend on its length only") {
  const int saved = num_threads();
  std::vector<std::vector<std::pair<int64_t, int64_t>>> runs;
  for (int threads : {1, 2, 3}) {
    set_num_threads(threads);
    std::mutex mu;
    std::vector<std::pair<int64_t, int64_t>> chunks;
    cpu::parallel_for_fixed(5, 100005, 32768, [&](int64_t b, int64_t e) {
      std::lock_guard<std::mutex> lock(mu);
      chunks.emplace_back(b, e);
    });
    std::sort(chunks.begin(), chunks.end());
    runs.push_back(chunks);
  }
  set_num_threads(saved);
  CHECK(runs[0] == runs[1]);
  CHECK(runs[0] == runs[2]);
  const auto& c = runs[0];
  REQUIRE(c.size() == 4);  // ceil(100000 / 32768)
  CHECK(c.front().first == 5);
  CHECK(c.back().second == 100005);
  for (size_t i = 0; i + 1 < c.size(); ++i) {
    CHECK(c[i].second == c[i + 1].first);
    CHECK(c[i].second - c[i].first == 25024);  // 25000 rounded up to a multiple of 64
  }
  CHECK(c.back().second - c.back().first == 100000 - 3 * 25024);
  CHECK(cpu::fixed_chunk(100, 16384) == 128);  // one chunk, the range shorter than it
  CHECK(cpu::fixed_chunk(65536, 32768) == 32768);
}
