// Uses an installed Kiln: a custom op with its own backward, checked by gradcheck, then a tiny fit.
#include <kiln/kiln.h>

#include <cstdio>

using namespace kiln;

// softplus(x) = log(1 + exp(x)), with its derivative sigmoid(x) written by hand.
Tensor softplus(const Tensor& x) {
  Tensor out;
  {
    NoGradGuard ng;
    out = log(exp(x) + 1.0);
  }
  if (autograd::needs_grad({x})) {
    SavedTensor sx(x);
    autograd::record("softplus", {x}, {out}, [sx](const GradCtx& c) -> std::vector<Tensor> {
      return {c.g() * sigmoid(sx.unpack("softplus"))};
    });
  }
  return out;
}

int main() {
  const std::string err = gradcheck([](const std::vector<Tensor>& v) { return softplus(v[0]); },
                                    {randn({3, 4}, TensorOptions(DType::f64))});
  if (!err.empty()) {
    std::printf("gradcheck failed: %s\n", err.c_str());
    return 1;
  }
  // Fit w so that softplus(x * w) matches a target made with w = 2.
  Tensor x = randn({64});
  Tensor target = softplus(x * 2.0).detach();
  Tensor w = zeros({1}).set_requires_grad();
  for (int i = 0; i < 200; ++i) {
    Tensor loss = mean(pow(softplus(x * w) - target, 2.0));
    w.set_grad(Tensor());
    loss.backward();
    NoGradGuard ng;
    w.add_(w.grad(), -2.0);
  }
  const double wv = w.item<double>();
  std::printf("consumer: gradcheck ok, fitted w = %.4f (want 2)\n", wv);
  return (wv > 1.95 && wv < 2.05) ? 0 : 1;
}
