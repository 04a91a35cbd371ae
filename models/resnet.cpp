// ResNet definitions. Small-image ResNets use projection shortcuts (1x1 conv + BN, He et al.'s
// option B) where the shape changes, so every variant shares torchvision's layerN.M.downsample.K names.
#include "models/resnet.h"

#include <utility>
#include <vector>

#include "engine/autograd.h"
#include "engine/init.h"

namespace kiln::models {
namespace {

std::shared_ptr<nn::Conv2d> conv3x3(int64_t in, int64_t out, int64_t stride) {
  return std::make_shared<nn::Conv2d>(in, out, Pair{3, 3}, Pair{stride, stride}, Pair{1, 1}, Pair{1, 1}, 1, false);
}
std::shared_ptr<nn::Conv2d> conv1x1(int64_t in, int64_t out, int64_t stride) {
  return std::make_shared<nn::Conv2d>(in, out, Pair{1, 1}, Pair{stride, stride}, Pair{0, 0}, Pair{1, 1}, 1, false);
}
std::shared_ptr<nn::Sequential> projection(int64_t in, int64_t out, int64_t stride) {
  auto s = std::make_shared<nn::Sequential>();
  s->push_back(conv1x1(in, out, stride));
  s->push_back(std::make_shared<nn::BatchNorm2d>(out));
  return s;
}

struct Arch {
  bool imagenet;
  bool bottleneck;
  std::vector<int64_t> blocks;
};

// In the order names are listed to users: the small-image ResNets, then the ImageNet ones.
const std::vector<std::pair<std::string, Arch>>& archs() {
  static const std::vector<std::pair<std::string, Arch>> a = {
      {"resnet20", {false, false, {3, 3, 3}}},       {"resnet32", {false, false, {5, 5, 5}}},
      {"resnet44", {false, false, {7, 7, 7}}},       {"resnet56", {false, false, {9, 9, 9}}},
      {"resnet110", {false, false, {18, 18, 18}}},   {"resnet18", {true, false, {2, 2, 2, 2}}},
      {"resnet34", {true, false, {3, 4, 6, 3}}},     {"resnet50", {true, true, {3, 4, 6, 3}}},
      {"resnet101", {true, true, {3, 4, 23, 3}}},    {"resnet152", {true, true, {3, 8, 36, 3}}},
  };
  return a;
}

const Arch* find_arch(const std::string& name) {
  for (const auto& [n, a] : archs())
    if (n == name) return &a;
  return nullptr;
}

}  // namespace

const std::vector<std::string>& resnet_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const auto& [n, a] : archs()) v.push_back(n);
    return v;
  }();
  return names;
}

bool is_resnet_name(const std::string& name) { return find_arch(name) != nullptr; }

BasicBlock::BasicBlock(int64_t in, int64_t planes, int64_t stride) {
  conv1 = register_module("conv1", conv3x3(in, planes, stride));
  bn1 = register_module("bn1", std::make_shared<nn::BatchNorm2d>(planes));
  conv2 = register_module("conv2", conv3x3(planes, planes, 1));
  bn2 = register_module("bn2", std::make_shared<nn::BatchNorm2d>(planes));
  if (stride != 1 || in != planes) downsample = register_module("downsample", projection(in, planes, stride));
}

// "BN, ReLU" and "BN, add the shortcut, ReLU" are one op each (batch_norm_relu): the same values as
// the ops in a row, without their passes over the activations.
Tensor BasicBlock::forward(const Tensor& x) {
  const Tensor out = bn1->forward_relu((*conv1)(x));
  return bn2->forward_relu((*conv2)(out), downsample ? (*downsample)(x) : x);
}

Bottleneck::Bottleneck(int64_t in, int64_t planes, int64_t stride) {
  conv1 = register_module("conv1", conv1x1(in, planes, 1));
  bn1 = register_module("bn1", std::make_shared<nn::BatchNorm2d>(planes));
  conv2 = register_module("conv2", conv3x3(planes, planes, stride));  // v1.5: the stride is here
  bn2 = register_module("bn2", std::make_shared<nn::BatchNorm2d>(planes));
  conv3 = register_module("conv3", conv1x1(planes, planes * expansion, 1));
  bn3 = register_module("bn3", std::make_shared<nn::BatchNorm2d>(planes * expansion));
  if (stride != 1 || in != planes * expansion)
    downsample = register_module("downsample", projection(in, planes * expansion, stride));
}

Tensor Bottleneck::forward(const Tensor& x) {
  Tensor out = bn1->forward_relu((*conv1)(x));
  out = bn2->forward_relu((*conv2)(out));
  return bn3->forward_relu((*conv3)(out), downsample ? (*downsample)(x) : x);
}

ResNet::ResNet(const ResNetConfig& cfg) : config(cfg) {
  const Arch* arch = find_arch(cfg.name);
  if (arch == nullptr) {
    std::string known;
    for (const auto& n : resnet_names()) known += (known.empty() ? "" : ", ") + n;
    KILN_FAIL("unknown ResNet '", cfg.name, "' (known: ", known, ")");
  }
  KILN_CHECK(cfg.num_classes >= 1 && cfg.in_channels >= 1, cfg.name, ": num_classes and in_channels must be >= 1, got ",
             cfg.num_classes, " and ", cfg.in_channels);
  const Arch& a = *arch;
  imagenet = a.imagenet;
  const int64_t width0 = imagenet ? 64 : 16;
  if (imagenet) {
    conv1 = register_module("conv1", std::make_shared<nn::Conv2d>(cfg.in_channels, 64, Pair{7, 7}, Pair{2, 2},
                                                                   Pair{3, 3}, Pair{1, 1}, 1, false));
  } else {
    conv1 = register_module("conv1", conv3x3(cfg.in_channels, width0, 1));
  }
  bn1 = register_module("bn1", std::make_shared<nn::BatchNorm2d>(width0));
  int64_t in = width0;
  for (size_t s = 0; s < a.blocks.size(); ++s) {
    auto stage = std::make_shared<nn::Sequential>();
    const int64_t planes = width0 << s;
    for (int64_t b = 0; b < a.blocks[s]; ++b) {
      const int64_t stride = (b == 0 && s > 0) ? 2 : 1;
      if (a.bottleneck) {
        stage->push_back(std::make_shared<Bottleneck>(in, planes, stride));
        in = planes * Bottleneck::expansion;
      } else {
        stage->push_back(std::make_shared<BasicBlock>(in, planes, stride));
        in = planes;
      }
    }
    stages.push_back(register_module("layer" + std::to_string(s + 1), stage));
  }
  fc = register_module("fc", std::make_shared<nn::Linear>(in, cfg.num_classes));

  // torchvision's initialisation: Kaiming-normal (fan_out, relu) convs, BN gamma 1 and beta 0.
  for (auto& [name, p] : named_parameters()) {
    Tensor t = p;
    if (t.dim() == 4) nn::init::kaiming_normal_(t, 0.0, nn::init::FanMode::fan_out, "relu");
  }
  if (cfg.zero_init_residual) {
    for (auto& stage : stages)
      for (size_t b = 0; b < stage->size(); ++b) {
        nn::Layer& blk = (*stage)[b];
        if (auto* bb = dynamic_cast<BasicBlock*>(&blk)) nn::init::zeros_(bb->bn2->weight);
        if (auto* bt = dynamic_cast<Bottleneck*>(&blk)) nn::init::zeros_(bt->bn3->weight);
      }
  }
}

Tensor ResNet::forward(const Tensor& x) {
  KILN_CHECK(x.dim() == 4 && x.size(1) == config.in_channels, config.name, ": input must be [N, ", config.in_channels,
             ", H, W], got ", x.shape());
  Tensor h = bn1->forward_relu((*conv1)(x));
  if (imagenet) h = max_pool2d(h, {3, 3}, {2, 2}, {1, 1});
  for (size_t si = 0; si < stages.size(); ++si) {
    nn::Sequential& s = *stages[si];
    const std::string stage = "layer" + std::to_string(si + 1);
    for (size_t i = 0; i < s.size(); ++i) {
      nn::BlockScope scope(stage, i);
      nn::Layer* block = &s[i];
      if (!config.recompute) {
        h = (*block)(h);
        continue;
      }
      h = autograd::checkpoint([block](const std::vector<Tensor>& in) { return std::vector<Tensor>{(*block)(in[0])}; },
                               {h})[0];
    }
  }
  h = adaptive_avg_pool2d(h, {1, 1}).flatten(1);
  return (*fc)(h);
}

std::shared_ptr<ResNet> make_resnet(const ResNetConfig& cfg) { return std::make_shared<ResNet>(cfg); }

}  // namespace kiln::models
