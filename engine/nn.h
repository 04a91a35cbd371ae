// nn::Module and the standard layers. A module owns named parameters, buffers and children;
// names join with dots in the common convention (layer1.0.conv1.weight), so state dicts match
// other frameworks' checkpoints.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/nn_ops.h"

namespace kiln::nn {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;
using StateDict = std::map<std::string, Tensor>;

class Module {
 public:
  Module() = default;
  virtual ~Module() = default;
  // Not copyable: parameters are tensor handles, so a copy would share them, and `MLP ema = model;`
  // would silently be the same model. For an independent copy build another module of the same
  // configuration and load_state_dict(model.state_dict()) into it (docs/extending.md). Moves are
  // fine: nothing holds a module's address.
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;
  Module(Module&&) = default;
  Module& operator=(Module&&) = default;
  virtual std::string type_name() const = 0;

  NamedTensors named_parameters() const;  // recursive, in registration order
  NamedTensors named_buffers() const;
  std::vector<Tensor> parameters() const;
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& children() const { return children_; }
  int64_t num_parameters() const;

  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  void zero_grad();  // drops every parameter's .grad
  // Converts every floating parameter and buffer to dtype in place (handles held elsewhere see it).
  void to(DType dtype);
  // Moves every parameter and buffer to `device` in place (handles held elsewhere see it; gradients
  // are dropped). Create the optimizer after this, so its state lives on the same device.
  void to(Device device);

  // Parameters and buffers under their dotted names (buffers included, as checkpoints expect).
  StateDict state_dict() const;
  // Copies values into this module's tensors (converting dtype). With strict, any missing,
  // unexpected or mis-shaped name is an error that lists all of them; without, the matching ones load
  // and the names left out are returned (as torch's load_state_dict does), so a caller can say which
  // it ignored.
  struct IncompatibleKeys {
    std::vector<std::string> missing, unexpected;
  };
  IncompatibleKeys load_state_dict(const StateDict& sd, bool strict = true);

  // Puts t in place of this module's parameter `name` (its own, no dots) and of the member that holds it,
  // e.g. to tie a decoder to the word embeddings: out->replace_parameter("weight", out->weight, emb->weight).
  // Assigning the member alone (out->weight = emb->weight) is the pitfall this avoids: forward uses the
  // new tensor while parameters(), state_dict() and so the optimizer and checkpoints keep the old one,
  // which nothing uses. `member` must hold the registered tensor; t must be a leaf of
  // the same shape, dtype and device (it is flagged requires_grad, as register_parameter flags it). A
  // tensor held under two names is tied: listed once by parameters() (stepped once), under each name by
  // state_dict(), as PyTorch. Make the optimizer after this (it holds the tensors it was given).
  void replace_parameter(const std::string& name, Tensor& member, Tensor t);

 protected:
  Tensor register_parameter(const std::string& name, Tensor t);  // flags requires_grad
  Tensor register_buffer(const std::string& name, Tensor t);
  template <typename M> std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    add_child(name, m);
    return m;
  }
  void add_child(const std::string& name, std::shared_ptr<Module> m);

 private:
  void collect(const std::string& prefix, bool params, NamedTensors& out) const;
  NamedTensors params_, buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
};

// A module with one tensor in and one out, as Sequential chains them.
class Layer : public Module {
 public:
  virtual Tensor forward(const Tensor& x) = 0;
  Tensor operator()(const Tensor& x) { return forward(x); }
};

// y = x W^T + b, W [out, in]; initialised like the common default (Kaiming-uniform with a = sqrt(5)).
class Linear : public Layer {
 public:
  Linear(int64_t in, int64_t out, bool bias = true);
  std::string type_name() const override { return "Linear"; }
  Tensor forward(const Tensor& x) override;
  Tensor weight, bias;
};

class Conv2d : public Layer {
 public:
  Conv2d(int64_t in, int64_t out, Pair kernel, Pair stride = {1, 1}, Pair padding = {0, 0}, Pair dilation = {1, 1},
         int64_t groups = 1, bool bias = true);
  std::string type_name() const override { return "Conv2d"; }
  Tensor forward(const Tensor& x) override;
  Tensor weight, bias;
  Pair stride, padding, dilation;
  int64_t groups;
};

// Buffers running_mean, running_var and num_batches_tracked, as torchvision names them.
class BatchNorm2d : public Layer {
 public:
  explicit BatchNorm2d(int64_t channels, double eps = 1e-5, double momentum = 0.1, bool affine = true);
  std::string type_name() const override { return "BatchNorm2d"; }
  Tensor forward(const Tensor& x) override;
  // relu(forward(x) + residual) as one op (batch_norm_relu); residual optional.
  Tensor forward_relu(const Tensor& x, const Tensor& residual = {});
  Tensor weight, bias, running_mean, running_var, num_batches_tracked;
  double eps, momentum;
  // The values each channel's statistics came from in the last training forward (N x H x W; 0 before
  // one): a handful (a ResNet's last stage at a small micro-batch) makes them noise (kiln plan says so).
  int64_t values_per_channel = 0;

 private:
  Tensor run(const Tensor& x, const Tensor& residual, bool relu);
};

class LayerNorm : public Layer {
 public:
  explicit LayerNorm(Shape normalized_shape, double eps = 1e-5, bool affine = true);
  std::string type_name() const override { return "LayerNorm"; }
  Tensor forward(const Tensor& x) override;
  Tensor weight, bias;
  Shape normalized_shape;
  double eps;
};

class Embedding : public Layer {
 public:
  Embedding(int64_t num, int64_t dim, int64_t padding_idx = -1);
  std::string type_name() const override { return "Embedding"; }
  Tensor forward(const Tensor& indices) override;
  Tensor weight;
  int64_t padding_idx;
};

// Draws its masks from the default generator unless given one (which must outlive the module).
class Dropout : public Layer {
 public:
  explicit Dropout(double p = 0.5, Generator* gen = nullptr) : p(p), gen(gen) {}
  std::string type_name() const override { return "Dropout"; }
  Tensor forward(const Tensor& x) override { return dropout(x, p, is_training(), gen); }
  double p;
  Generator* gen;
};

class ReLU : public Layer {
 public:
  std::string type_name() const override { return "ReLU"; }
  Tensor forward(const Tensor& x) override { return relu(x); }
};
class GELU : public Layer {
 public:
  explicit GELU(GeluApprox approx = GeluApprox::none) : approx(approx) {}
  std::string type_name() const override { return "GELU"; }
  Tensor forward(const Tensor& x) override { return gelu(x, approx); }
  GeluApprox approx;
};
class Tanh : public Layer {
 public:
  std::string type_name() const override { return "Tanh"; }
  Tensor forward(const Tensor& x) override { return tanh(x); }
};
class MaxPool2d : public Layer {
 public:
  MaxPool2d(Pair kernel, Pair stride = {0, 0}, Pair padding = {0, 0}) : kernel(kernel), stride(stride), padding(padding) {}
  std::string type_name() const override { return "MaxPool2d"; }
  Tensor forward(const Tensor& x) override { return max_pool2d(x, kernel, stride, padding); }
  Pair kernel, stride, padding;
};
class AvgPool2d : public Layer {
 public:
  AvgPool2d(Pair kernel, Pair stride = {0, 0}, Pair padding = {0, 0}) : kernel(kernel), stride(stride), padding(padding) {}
  std::string type_name() const override { return "AvgPool2d"; }
  Tensor forward(const Tensor& x) override { return avg_pool2d(x, kernel, stride, padding); }
  Pair kernel, stride, padding;
};
class AdaptiveAvgPool2d : public Layer {
 public:
  explicit AdaptiveAvgPool2d(Pair out) : out(out) {}
  std::string type_name() const override { return "AdaptiveAvgPool2d"; }
  Tensor forward(const Tensor& x) override { return adaptive_avg_pool2d(x, out); }
  Pair out;
};
class Flatten : public Layer {
 public:
  explicit Flatten(int64_t start = 1, int64_t end = -1) : start(start), end(end) {}
  std::string type_name() const override { return "Flatten"; }
  Tensor forward(const Tensor& x) override { return x.flatten(start, end); }
  int64_t start, end;
};

// Children named 0, 1, 2, ... (torchvision's downsample.0.weight).
class Sequential : public Layer {
 public:
  Sequential() = default;
  explicit Sequential(std::vector<std::shared_ptr<Layer>> layers);
  std::string type_name() const override { return "Sequential"; }
  Sequential& push_back(std::shared_ptr<Layer> layer);
  Tensor forward(const Tensor& x) override;
  size_t size() const { return layers_.size(); }
  Layer& operator[](size_t i) { return *layers_.at(i); }

 private:
  std::vector<std::shared_ptr<Layer>> layers_;
};

// Modules under indices 0, 1, 2, ... with no forward of their own (BERT's encoder.layer.N).
template <typename M> class ModuleList : public Module {
 public:
  std::string type_name() const override { return "ModuleList"; }
  std::shared_ptr<M> push_back(std::shared_ptr<M> m) {
    add_child(std::to_string(items_.size()), m);
    items_.push_back(m);
    return m;
  }
  size_t size() const { return items_.size(); }
  M& operator[](size_t i) { return *items_.at(i); }
  auto begin() { return items_.begin(); }
  auto end() { return items_.end(); }

 private:
  std::vector<std::shared_ptr<M>> items_;
};

// Self-attention over x [B, L, E] with `heads` heads; children query, key, value, out (Linear).
// mask: additive, broadcastable to [B, heads, L, L] (e.g. [B, 1, 1, L] from a padding mask), or bool
// with True where a key is attended (scaled_dot_product_attention's rule).
class MultiheadSelfAttention : public Module {
 public:
  MultiheadSelfAttention(int64_t embed_dim, int64_t heads, double dropout_p = 0.0);
  std::string type_name() const override { return "MultiheadSelfAttention"; }
  Tensor forward(const Tensor& x, const Tensor& mask = {});
  std::shared_ptr<Linear> query, key, value, out;
  int64_t embed_dim, heads;
  double dropout_p;
};

// An additive attention mask from a [B, L] padding mask of 1 (keep) / 0 (pad): [B, 1, 1, L] of
// 0 and a large negative number.
Tensor additive_padding_mask(const Tensor& keep, DType dtype = DType::f32);

// The named blocks of a model's forward (a ResNet's blocks "layer1.0", ..., a BERT's layers
// "encoder.layer.0", ...) report where they begin and end to this thread's observer, if one is
// set: how the memory planner tells which block keeps how much for backward.
using BlockObserver = std::function<void(const std::string& name, bool begin)>;
void set_block_observer(BlockObserver observer);  // this thread; an empty one removes it
class BlockScope {
 public:
  BlockScope(const std::string& prefix, size_t index);  // reports prefix + "." + index
  ~BlockScope();
  BlockScope(const BlockScope&) = delete;
  BlockScope& operator=(const BlockScope&) = delete;

 private:
  std::string name_;
};

}  // namespace kiln::nn
