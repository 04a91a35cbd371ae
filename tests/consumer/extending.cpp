// The code of docs/extending.md, built against an installed Kiln: a data set, a model and an
// optimizer of the caller's own, trained together through Kiln's loader and autograd.
#include <kiln/io/data.h>
#include <kiln/kiln.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

using namespace kiln;

namespace {

// A data set: points on y = 3x - 1, made from the sample index alone, so any loader thread can
// build any batch and every epoch sees the same samples.
class Line final : public io::Dataset {
 public:
  int64_t size() const override { return 256; }
  io::Batch get_batch(const std::vector<int64_t>& indices, uint64_t /*seed*/) const override {
    std::vector<float> x, y;
    for (int64_t i : indices) {
      const float v = float(i % 64) / 32.0f - 1.0f;
      x.push_back(v);
      y.push_back(3.0f * v - 1.0f);
    }
    const int64_t n = int64_t(indices.size());
    return {{"input", from_blob_copy(x.data(), {n, 1})}, {"target", from_blob_copy(y.data(), {n, 1})}};
  }
};

// A model: parameters and sub-modules registered by name give state_dict() its dotted names.
class Affine final : public nn::Module {
 public:
  Affine() {
    weight = register_parameter("weight", zeros({1, 1}));
    bias = register_parameter("bias", zeros({1}));
  }
  std::string type_name() const override { return "Affine"; }
  Tensor forward(const Tensor& x) const { return linear(x, weight, bias); }
  Tensor weight, bias;
};

// An optimizer: sign descent, p -= lr * sign(grad), through the per-tensor path (update() runs
// under no-grad for every parameter with a gradient; its slots map holds per-parameter state,
// saved in checkpoints, here a step counter).
class SignSGD final : public optim::Optimizer {
 public:
  using Optimizer::Optimizer;
  std::string name() const override { return "signsgd"; }

 private:
  void update(const optim::ParamGroup& g, Tensor& p, const Tensor& grad, std::map<std::string, Tensor>& slots) override {
    p.add_(sign(grad), -g.lr);
    auto it = slots.try_emplace("updates", zeros({}, TensorOptions(DType::f32, p.device()))).first;
    it->second.add_(scalar_like(1.0, it->second));
  }
  std::map<std::string, double> hyper() const override { return {}; }
};

}  // namespace

// Trains Affine on Line with SignSGD; 0 when it found y = 3x - 1.
int extending_examples() {
  io::LoaderOptions lo;
  lo.batch_size = 32;
  lo.workers = 2;
  io::DataLoader loader(std::make_shared<Line>(), lo);
  Affine model;
  SignSGD opt({optim::ParamGroup(model.parameters(), 0.05)});
  double last = 0;
  for (int64_t epoch = 0; epoch < 25; ++epoch) {
    if (epoch == 15) opt.set_lr(0.005);
    loader.seek({epoch, 0});
    while (auto b = loader.next()) {
      opt.zero_grad();
      const Tensor loss = mse_loss(model.forward(b->at("input")), b->at("target"));
      loss.backward();
      opt.step();
      last = loss.item<double>();
    }
  }
  const double w = model.weight.item<double>(), c = model.bias.item<double>();
  const auto state = opt.state();
  const bool named = model.state_dict().count("weight") == 1 && model.state_dict().count("bias") == 1;
  const bool counted = state.tensors.count("0.0.updates") == 1 && state.tensors.at("0.0.updates").item<double>() == 200.0;
  SignSGD again({optim::ParamGroup(model.parameters(), 0.05)});  // its own state loads back (a 0-dim slot)
  again.load_state(state);
  const bool reloaded = again.state().tensors.at("0.0.updates").item<double>() == 200.0;
  std::printf("extending: y = %.3f x %+.3f after 200 SignSGD steps (last loss %.4f)\n", w, c, last);
  if (std::abs(w - 3.0) > 0.05 || std::abs(c + 1.0) > 0.05 || !named || !counted || !reloaded) {
    std::printf("extending: the custom data set, model or optimizer did not do what docs/extending.md says\n");
    return 1;
  }
  return 0;
}
