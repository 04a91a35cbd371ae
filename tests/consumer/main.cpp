// Uses an installed Kiln: a custom op with its own backward, checked by gradcheck, then a tiny fit;
// the caller's buffers without copies; and (extending.cpp) the walkthroughs of docs/extending.md.
#include <kiln/kiln.h>

#include <cstdio>
#include <vector>

using namespace kiln;

// squareplus(x) = (x + sqrt(x^2 + 4)) / 2, a smooth ReLU, with its derivative
// (1 + x / sqrt(x^2 + 4)) / 2 written by hand.
Tensor squareplus(const Tensor& x) {
  Tensor out;
  {
    NoGradGuard ng;
    out = (x + sqrt(x * x + 4.0)) * 0.5;
  }
  if (autograd::needs_grad({x})) {
    SavedTensor sx(x);
    autograd::record("squareplus", {x}, {out}, [sx](const GradCtx& c) -> std::vector<Tensor> {
      const Tensor xs = sx.unpack("squareplus");
      return {c.g() * ((xs / sqrt(xs * xs + 4.0) + 1.0) * 0.5)};
    });
  }
  return out;
}

// The caller's buffer as a tensor without a copy, and values read back in their own type.
int check_buffers() {
  std::vector<float> buf = {1, 2, 3, 4, 5, 6};
  Tensor t = from_blob(buf.data(), {2, 3}, DType::f32);
  t.mul_(2.0);  // writes reach the caller's memory
  if (buf[5] != 12.0f || t.raw_data() != buf.data()) {
    std::printf("from_blob: the tensor does not share the buffer\n");
    return 1;
  }
  bool released = false;
  {
    auto* owned = new int64_t[2]{int64_t(1) << 60, 3};
    Tensor big = from_blob(owned, {2}, DType::i64, [&released](void* p) {
      delete[] static_cast<int64_t*>(p);
      released = true;
    });
    const std::vector<int64_t> v = (big + 1).values<int64_t>();  // 2^60 + 1 has no f64 representation
    if (v[0] != (int64_t(1) << 60) + 1 || v[1] != 4 || big.select(0, 0).item<int64_t>() != int64_t(1) << 60) {
      std::printf("values<int64_t>: read back through f64\n");
      return 1;
    }
  }
  if (!released) {
    std::printf("from_blob: the deleter did not run\n");
    return 1;
  }
  return 0;
}

int extending_examples();
int clashing_headers();

int main() {
  if (check_buffers() != 0) return 1;
  if (extending_examples() != 0) return 1;
  if (clashing_headers() != 0) return 1;
  const std::string err = gradcheck([](const std::vector<Tensor>& v) { return squareplus(v[0]); },
                                    {randn({3, 4}, TensorOptions(DType::f64))});
  if (!err.empty()) {
    std::printf("gradcheck failed: %s\n", err.c_str());
    return 1;
  }
  // Fit w so that squareplus(x * w) matches a target made with w = 2.
  Tensor x = randn({64});
  Tensor target = squareplus(x * 2.0).detach();
  Tensor w = zeros({1}).set_requires_grad();
  for (int i = 0; i < 200; ++i) {
    Tensor loss = mean(pow(squareplus(x * w) - target, 2.0));
    w.set_grad(Tensor());
    loss.backward();
    NoGradGuard ng;
    w.add_(w.grad(), -2.0);
  }
  const double wv = w.item<double>();
  std::printf("consumer: gradcheck ok, fitted w = %.4f (want 2)\n", wv);
  return (wv > 1.95 && wv < 2.05) ? 0 : 1;
}
