// Module bookkeeping (names, train/eval, state dicts) and the standard layers.
#include "engine/nn.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <sstream>

#include "engine/autograd.h"
#include "engine/init.h"

namespace kiln::nn {

// ---- Module -----------------------------------------------------------------------------------------

namespace {
// A name is taken once per module, whatever holds it: a parameter and a buffer both named "x" left only
// one of them in state_dict(), and a second register_parameter("w", ...) hid the first from a checkpoint.
template <typename Children> void check_new_name(const Module& m, const char* what, const std::string& name,
                                                 const NamedTensors& params, const NamedTensors& buffers,
                                                 const Children& children) {
  // Not m.type_name(): it is pure virtual, and a base class registering in its own constructor would
  // make this error path a pure virtual call.
  (void)m;
  KILN_CHECK(!name.empty() && name.find('.') == std::string::npos, what, ": bad name '", name,
             "' (empty or with a dot)");
  auto has = [&name](const auto& v) {
    return std::any_of(v.begin(), v.end(), [&name](const auto& e) { return e.first == name; });
  };
  const char* holder = has(params) ? "parameter" : has(buffers) ? "buffer" : has(children) ? "submodule" : nullptr;
  KILN_CHECK(!holder, what, ": the name '", name, "' is already taken by a ", holder, " of this module");
}
}  // namespace

Tensor Module::register_parameter(const std::string& name, Tensor t) {
  check_new_name(*this, "register_parameter", name, params_, buffers_, children_);
  if (t.defined()) {
    // A leaf is registered as itself, flagged in place (as PyTorch's Parameter is the registered object):
    // the caller's handle is the parameter, and one tensor registered under two names is one tied
    // parameter that trains once. Only a tensor made by an op is detached: a parameter is a leaf.
    if (!t.is_leaf()) t = t.detach();
    if (!t.requires_grad()) t.set_requires_grad(true);
  }
  params_.emplace_back(name, t);
  return t;
}

void Module::replace_parameter(const std::string& name, Tensor& member, Tensor t) {
  auto it = std::find_if(params_.begin(), params_.end(), [&name](const auto& e) { return e.first == name; });
  if (it == params_.end()) {
    std::string known;
    for (const auto& e : params_) known += (known.empty() ? "" : ", ") + e.first;
    KILN_FAIL("replace_parameter: this module has no parameter '", name, "' (",
              known.empty() ? std::string("it has none") : "its parameters: " + known,
              "; a sub-module's parameter is replaced on that sub-module)");
  }
  Tensor& old = it->second;
  KILN_CHECK(t.defined() && t.is_leaf(), "replace_parameter: '", name,
             "' must be replaced by a leaf tensor (a parameter), got ",
             t.defined() ? "one computed from others (" + t.type_str() + ")" : std::string("none"));
  // The member must hold the registered tensor: one holding t already could as well be another module's
  // (out.replace_parameter("weight", emb.weight, emb.weight) would leave out.weight, which forward reads,
  // untied), and the two cannot be told apart.
  KILN_CHECK(member.same(old), "replace_parameter: the member passed for '", name,
             "' does not hold the registered tensor (", old.defined() ? old.type_str() : std::string("none"),
             "): pass the member that holds '", name, "' (one assigned already, out->weight = emb->weight, ",
             "is the trap this avoids: assign the registered tensor back first)");
  KILN_CHECK(!old.defined() || (t.shape() == old.shape() && t.dtype() == old.dtype() && t.device() == old.device()),
             "replace_parameter: '", name, "' is ", old.type_str(), ", the tensor for it is ", t.type_str(),
             " (a replacement keeps the shape, dtype and device the module was built with)");
  if (!t.requires_grad()) t.set_requires_grad(true);
  old = t;
  member = t;
}

Tensor Module::register_buffer(const std::string& name, Tensor t) {
  check_new_name(*this, "register_buffer", name, params_, buffers_, children_);
  buffers_.emplace_back(name, t);
  return t;
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> m) {
  check_new_name(*this, "register_module", name, params_, buffers_, children_);
  KILN_CHECK(m, "register_module: '", name, "' is null");  // not type_name(): see check_new_name
  children_.emplace_back(name, std::move(m));
}

void Module::collect(const std::string& prefix, bool params, NamedTensors& out) const {
  for (const auto& [n, t] : params ? params_ : buffers_)
    if (t.defined()) out.emplace_back(prefix + n, t);
  for (const auto& [n, c] : children_) c->collect(prefix + n + ".", params, out);
}

namespace {
// Each tensor once, under its first name: a tied parameter or a submodule registered twice would
// otherwise be counted twice and stepped twice (an optimizer refuses a parameter listed twice).
NamedTensors first_names(NamedTensors all) {
  std::set<const TensorImpl*> seen;
  NamedTensors out;
  for (auto& [n, t] : all)
    if (seen.insert(&t.impl()).second) out.emplace_back(std::move(n), std::move(t));
  return out;
}
}  // namespace

NamedTensors Module::named_parameters() const {
  NamedTensors out;
  collect("", true, out);
  return first_names(std::move(out));
}
NamedTensors Module::named_buffers() const {
  NamedTensors out;
  collect("", false, out);
  return first_names(std::move(out));
}
std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [n, t] : named_parameters()) out.push_back(t);
  return out;
}
int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (auto& [name, t] : named_parameters()) n += t.numel();
  return n;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [n, c] : children_) c->train(on);
}

void Module::zero_grad() {
  for (auto& [n, t] : named_parameters()) Tensor(t).set_grad(Tensor());
}

namespace {
// The parameters and buffers, each tensor once: to() converts a tensor in place (its impl), so every
// name of a tied tensor sees the one converted tensor and the tie survives; converting per name made
// each name a copy of its own.
std::vector<Tensor> distinct_tensors(const Module& m) {
  NamedTensors all = m.named_parameters(), bufs = m.named_buffers();
  all.insert(all.end(), bufs.begin(), bufs.end());
  std::vector<Tensor> out;
  for (auto& [n, t] : first_names(std::move(all))) out.push_back(t);
  return out;
}
}  // namespace

void Module::to(DType dt) {
  KILN_CHECK(is_floating(dt), "Module::to: target dtype must be floating, got ", dt);
  NoGradGuard ng;
  auto convert = [dt](const Tensor& t) {
    if (!is_floating(t.dtype()) || t.dtype() == dt) return;
    const Tensor c = t.detach().to(dt).contiguous();
    TensorImpl& im = t.impl();
    im.storage = c.storage();
    im.strides = c.strides();
    im.offset = c.offset();
    im.dtype = dt;
    if (im.autograd) im.autograd->grad = nullptr;
  };
  for (const Tensor& t : distinct_tensors(*this)) convert(t);
}

void Module::to(Device device) {
  NoGradGuard ng;
  auto move = [device](const Tensor& t) {
    if (t.device() == device) return;
    const Tensor c = t.detach().to(device);
    TensorImpl& im = t.impl();
    im.storage = c.storage();
    im.strides = c.strides();
    im.offset = c.offset();
    if (im.autograd) im.autograd->grad = nullptr;
  };
  for (const Tensor& t : distinct_tensors(*this)) move(t);
}

StateDict Module::state_dict() const {
  // Every name, a tied tensor under each of its names (as PyTorch's), so a checkpoint loads into a
  // model that names them the same whether or not it ties them.
  NamedTensors all;
  collect("", true, all);
  collect("", false, all);
  StateDict sd;
  for (auto& [n, t] : all) sd[n] = t;
  return sd;
}

Module::IncompatibleKeys Module::load_state_dict(const StateDict& sd, bool strict) {
  StateDict mine = state_dict();
  std::vector<std::string> missing, unexpected, mismatched;
  for (const auto& [n, t] : mine) {
    auto it = sd.find(n);
    if (it == sd.end()) {
      missing.push_back(n);
    } else if (it->second.shape() != t.shape()) {
      std::ostringstream os;
      os << n << " (checkpoint " << it->second.shape() << ", model " << t.shape() << ")";
      mismatched.push_back(os.str());
    }
  }
  for (const auto& [n, t] : sd)
    if (!mine.count(n)) unexpected.push_back(n);
  auto join = [](const std::vector<std::string>& v) {
    std::string s;
    for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
    return s;
  };
  if (!mismatched.empty() || (strict && (!missing.empty() || !unexpected.empty()))) {
    std::string msg = "load_state_dict: state dict does not match the model:";
    if (!missing.empty()) msg += "\n  missing: " + join(missing);
    if (!unexpected.empty()) msg += "\n  unexpected: " + join(unexpected);
    if (!mismatched.empty()) msg += "\n  shape mismatch: " + join(mismatched);
    KILN_FAIL(msg);
  }
  NoGradGuard ng;
  for (auto& [n, t] : mine) {
    auto it = sd.find(n);
    if (it != sd.end()) Tensor(t).copy_(it->second.to(t.dtype()).to(t.device()));
  }
  return {missing, unexpected};
}

// ---- layers -------------------------------------------------------------------------------------------

Linear::Linear(int64_t in, int64_t out, bool with_bias) {
  KILN_CHECK(in >= 1 && out >= 1, "Linear: sizes must be >= 1, got in=", in, " out=", out);
  Tensor w = empty({out, in});
  init::kaiming_uniform_(w, std::sqrt(5.0));
  weight = register_parameter("weight", w);
  if (with_bias) {
    Tensor b = empty({out});
    const double bound = 1.0 / std::sqrt(double(in));
    init::uniform_(b, -bound, bound);
    bias = register_parameter("bias", b);
  }
}

Tensor Linear::forward(const Tensor& x) {
  KILN_CHECK(x.dim() >= 1 && x.size(-1) == weight.size(1), "Linear(", weight.size(1), " -> ", weight.size(0),
             "): input ", x.shape(), " must end with ", weight.size(1));
  return linear(x, weight, bias);
}

Conv2d::Conv2d(int64_t in, int64_t out, Pair kernel, Pair s, Pair p, Pair d, int64_t g, bool with_bias)
    : stride(s), padding(p), dilation(d), groups(g) {
  KILN_CHECK(in >= 1 && out >= 1 && g >= 1 && in % g == 0 && out % g == 0, "Conv2d: channels ", in, " -> ", out,
             " must be positive multiples of groups ", g);
  Tensor w = empty({out, in / g, kernel[0], kernel[1]});
  init::kaiming_uniform_(w, std::sqrt(5.0));
  weight = register_parameter("weight", w);
  if (with_bias) {
    Tensor b = empty({out});
    const double bound = 1.0 / std::sqrt(double(init::fans(w).first));
    init::uniform_(b, -bound, bound);
    bias = register_parameter("bias", b);
  }
}

Tensor Conv2d::forward(const Tensor& x) { return conv2d(x, weight, bias, stride, padding, dilation, groups); }

BatchNorm2d::BatchNorm2d(int64_t c, double e, double m, bool affine) : eps(e), momentum(m) {
  KILN_CHECK(c >= 1, "BatchNorm2d: channels must be >= 1, got ", c);
  if (affine) {
    weight = register_parameter("weight", ones({c}));
    bias = register_parameter("bias", zeros({c}));
  }
  running_mean = register_buffer("running_mean", zeros({c}));
  running_var = register_buffer("running_var", ones({c}));
  num_batches_tracked = register_buffer("num_batches_tracked", zeros({}, TensorOptions(DType::i64)));
}

Tensor BatchNorm2d::forward(const Tensor& x) { return run(x, Tensor(), false); }
Tensor BatchNorm2d::forward_relu(const Tensor& x, const Tensor& residual) { return run(x, residual, true); }

Tensor BatchNorm2d::run(const Tensor& x, const Tensor& residual, bool relu) {
  auto bn = [&](const Tensor& rm, const Tensor& rv, bool training) {
    return relu ? batch_norm_relu(x, rm, rv, weight, bias, training, momentum, eps, residual)
                : batch_norm(x, rm, rv, weight, bias, training, momentum, eps);
  };
  // A block recomputed in backward (autograd::checkpoint) normalises with the batch's statistics
  // again but must not count them into the running ones twice.
  if (is_training() && autograd::recomputing()) return bn(Tensor(), Tensor(), true);
  if (is_training()) {
    if (x.dim() >= 2 && x.size(1) > 0) values_per_channel = x.numel() / x.size(1);
    NoGradGuard ng;
    num_batches_tracked.add_(ones({}, TensorOptions(DType::i64, num_batches_tracked.device())));
  }
  return bn(running_mean, running_var, is_training());
}

LayerNorm::LayerNorm(Shape ns, double e, bool affine) : normalized_shape(std::move(ns)), eps(e) {
  if (affine) {
    weight = register_parameter("weight", ones(normalized_shape));
    bias = register_parameter("bias", zeros(normalized_shape));
  }
}

Tensor LayerNorm::forward(const Tensor& x) { return layer_norm(x, normalized_shape, weight, bias, eps); }

Embedding::Embedding(int64_t num, int64_t dim, int64_t pad) : padding_idx(pad) {
  KILN_CHECK(num >= 1 && dim >= 1, "Embedding: sizes must be >= 1, got ", num, " x ", dim);
  Tensor w = randn({num, dim});
  if (pad >= 0) {
    KILN_CHECK(pad < num, "Embedding: padding_idx ", pad, " is outside [0, ", num, ")");
    w.select(0, pad).zero_();
  }
  weight = register_parameter("weight", w);
}

Tensor Embedding::forward(const Tensor& idx) { return embedding(weight, idx, padding_idx); }

Sequential::Sequential(std::vector<std::shared_ptr<Layer>> layers) {
  for (auto& l : layers) push_back(std::move(l));
}

Sequential& Sequential::push_back(std::shared_ptr<Layer> layer) {
  add_child(std::to_string(layers_.size()), layer);
  layers_.push_back(std::move(layer));
  return *this;
}

Tensor Sequential::forward(const Tensor& x) {
  Tensor y = x;
  for (auto& l : layers_) y = l->forward(y);
  return y;
}

MultiheadSelfAttention::MultiheadSelfAttention(int64_t e, int64_t h, double p) : embed_dim(e), heads(h), dropout_p(p) {
  KILN_CHECK(h >= 1 && e % h == 0, "MultiheadSelfAttention: embed_dim ", e, " must be a multiple of heads ", h);
  query = register_module("query", std::make_shared<Linear>(e, e));
  key = register_module("key", std::make_shared<Linear>(e, e));
  value = register_module("value", std::make_shared<Linear>(e, e));
  out = register_module("out", std::make_shared<Linear>(e, e));
}

Tensor MultiheadSelfAttention::forward(const Tensor& x, const Tensor& mask) {
  KILN_CHECK(x.dim() == 3 && x.size(2) == embed_dim, "MultiheadSelfAttention: input must be [B, L, ", embed_dim,
             "], got ", x.shape());
  const int64_t b = x.size(0), l = x.size(1), d = embed_dim / heads;
  auto split_heads = [&](const Tensor& t) { return t.view({b, l, heads, d}).transpose(1, 2); };  // [B, H, L, d]
  const Tensor q = split_heads(query->forward(x)), k = split_heads(key->forward(x)), v = split_heads(value->forward(x));
  const Tensor ctx = scaled_dot_product_attention(q, k, v, mask, dropout_p, is_training());
  return out->forward(ctx.transpose(1, 2).reshape({b, l, embed_dim}));
}

Tensor additive_padding_mask(const Tensor& keep, DType dtype) {
  KILN_CHECK(keep.dim() == 2, "additive_padding_mask: expects [B, L], got ", keep.shape());
  const Tensor k = cast(keep, DType::f32);
  // (1 - keep) * -10000: the value BERT uses; large enough to zero the softmax, small enough for f16.
  return ((1.0 - k) * -10000.0).view({keep.size(0), 1, 1, keep.size(1)}).to(dtype);
}

namespace {
thread_local BlockObserver t_block_observer;
}  // namespace

void set_block_observer(BlockObserver observer) { t_block_observer = std::move(observer); }

BlockScope::BlockScope(const std::string& prefix, size_t index) {
  if (!t_block_observer) return;
  name_ = prefix + "." + std::to_string(index);
  t_block_observer(name_, true);
}

BlockScope::~BlockScope() {
  if (t_block_observer && !name_.empty()) t_block_observer(name_, false);
}

}  // namespace kiln::nn
