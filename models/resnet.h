// The ResNet family: the small-image ResNets of He et al. (20/32/44/56, three stages of 16/32/64
// channels) and the ImageNet ResNets (18/34 basic blocks, 50/101/152 bottlenecks, v1.5 with the
// stride in the 3x3 conv). Parameter and buffer names are torchvision's.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "engine/nn.h"

namespace kiln::models {

struct ResNetConfig {
  std::string name = "resnet20";  // resnet20|32|44|56|110, resnet18|34|50|101|152
  int64_t num_classes = 10;
  int64_t in_channels = 3;
  bool zero_init_residual = false;  // start each block's last BN gamma at 0
  // Keep only each block's input for backward and run the block again there
  // (autograd::checkpoint): less activation memory for about one more forward pass.
  bool recompute = false;
};

class BasicBlock final : public nn::Layer {
 public:
  static constexpr int64_t expansion = 1;
  BasicBlock(int64_t in, int64_t planes, int64_t stride);
  std::string type_name() const override { return "BasicBlock"; }
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<nn::Conv2d> conv1, conv2;
  std::shared_ptr<nn::BatchNorm2d> bn1, bn2;
  std::shared_ptr<nn::Sequential> downsample;  // null when the shortcut is the identity
};

class Bottleneck final : public nn::Layer {
 public:
  static constexpr int64_t expansion = 4;
  Bottleneck(int64_t in, int64_t planes, int64_t stride);
  std::string type_name() const override { return "Bottleneck"; }
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<nn::Conv2d> conv1, conv2, conv3;
  std::shared_ptr<nn::BatchNorm2d> bn1, bn2, bn3;
  std::shared_ptr<nn::Sequential> downsample;
};

class ResNet final : public nn::Layer {
 public:
  explicit ResNet(const ResNetConfig& cfg);
  std::string type_name() const override { return "ResNet"; }
  // x [N, in_channels, H, W] -> logits [N, num_classes].
  Tensor forward(const Tensor& x) override;
  ResNetConfig config;
  bool imagenet = false;
  std::shared_ptr<nn::Conv2d> conv1;
  std::shared_ptr<nn::BatchNorm2d> bn1;
  std::vector<std::shared_ptr<nn::Sequential>> stages;  // layer1, layer2, ...
  std::shared_ptr<nn::Linear> fc;
};

// Throws a clear error listing the known names for an unknown one.
std::shared_ptr<ResNet> make_resnet(const ResNetConfig& cfg);
bool is_resnet_name(const std::string& name);
// Every name make_resnet takes: resnet20, resnet32, resnet44, resnet56, resnet110, then resnet18,
// resnet34, resnet50, resnet101, resnet152.
const std::vector<std::string>& resnet_names();

}  // namespace kiln::models
