// Optimizers (SGD, AdamW, LAMB, RMSprop, Adagrad) over parameter groups, gradient clipping, and learning-rate
// schedules that are pure functions of the step (a resumed run gets the same LR).
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/ops.h"
#include "kernels/backend.h"

namespace kiln::optim {

struct ParamGroup {
  ParamGroup(std::vector<Tensor> p, double lr_ = 1e-3, double wd = 0.0, std::string n = "")
      : params(std::move(p)), lr(lr_), weight_decay(wd), name(std::move(n)) {}
  std::vector<Tensor> params;
  double lr;
  double weight_decay;
  std::string name;
  // This group's own values of the optimizer's hyper-parameters (the keys of its state: "momentum",
  // "dampening", "nesterov" for SGD; "beta1", "beta2", "eps" for the Adam family), as torch's groups
  // may hold their own momentum or betas; a key not here takes the optimizer's value. Checked as the
  // constructor checks the optimizer's, at construction and at every step.
  std::map<std::string, double> options;
};

// What a checkpoint stores: per-parameter tensors under "<group>.<index>.<slot>" and scalars: "steps",
// the hyper-parameters, "group<g>.lr", "group<g>.weight_decay", "group<g>.params" (the group's size),
// "group<g>.<key>" for each of a group's own options (ParamGroup::options) and
// "<group>.<index>.step" for a parameter with state whose own step count is not "steps" (one that got
// its first gradient late). A state without "group<g>.params" or "<g>.<i>.step" entries (written
// before they were) gives every parameter with state the count "steps".
struct OptimizerState {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, double> scalars;
};

class Optimizer {
 public:
  // Each parameter a leaf, in one group only; a frozen one (requires_grad off) is taken, as torch
  // takes it, and skipped by step() while it has no gradient.
  explicit Optimizer(std::vector<ParamGroup> groups);
  virtual ~Optimizer() = default;
  virtual std::string name() const = 0;
  // One update from the parameters' .grad (parameters without a gradient are skipped and their
  // step counts stay: each parameter counts its own steps, as torch's state['step']). With
  // skip_if (an f32 one-element flag on the parameters' device, the loss scaler's inf/NaN flag) the
  // update changes nothing where the flag is nonzero, decided on the device: the fused kernels read
  // the flag and the step count there, so a step never waits for the host. (Parameters outside the
  // fused path, see use_fused, read both on the host.)
  void step(const Tensor& skip_if = {});
  // step()'s first check, callable before it (GradScaler::step runs it before unscaling): every group's
  // lr finite and >= 0, whether or not its parameters have gradients.
  void check_lrs() const;
  // Drops the gradients, or with set_to_none = false sets them to zero in place.
  void zero_grad(bool set_to_none = true);
  // Mutable for each group's lr, weight decay and options, and for replacing a parameter by another
  // tensor (its index kept; groups and parameters cannot be added or removed: make a new optimizer).
  // State follows the tensor, as torch keys its state by the tensor: a tensor put in a parameter's
  // place gets fresh state (its moments and step count start from zero) unless it was a parameter of
  // this optimizer at another index, whose state then comes with it; the replaced tensor's state is
  // dropped. The new tensor must be a leaf and in one place only, as the constructor requires.
  std::vector<ParamGroup>& groups() { return groups_; }
  const std::vector<ParamGroup>& groups() const { return groups_; }
  void set_lr(double lr);  // every group
  // Steps taken that updated a parameter (skipped ones and those without any gradient not counted):
  // a synchronising read of the device-side count.
  int64_t steps() const;
  // The step count of parameter i of group g (its Adam bias corrections), a synchronising read.
  int64_t steps(size_t group, size_t index) const;

  OptimizerState state() const;
  // Restores state() output: the slots, the step counts, each group's lr and weight decay and the
  // optimizer's hyper-parameters (momentum, betas, ...), as torch's load_state_dict. Names, shapes,
  // the optimizer kind, the number of groups and each group's size must match; the state is the
  // state of the tensors the groups hold now.
  void load_state(const OptimizerState& s);
  // Replaces group g's own hyper-parameters (ParamGroup::options) after checking them as the
  // constructor does; nothing changes when it throws.
  void set_group_options(size_t g, const std::map<std::string, double>& options);
  // Group g's hyper-parameters: the optimizer's, with the group's own values in their place.
  std::map<std::string, double> group_hyper(size_t g) const;
  // f32 parameters with contiguous f32 gradients are updated by one fused backend call per group
  // and device (the same arithmetic); off: one tensor-op update per parameter.
  bool use_fused = true;

 protected:
  // The fused form of a group's step (kind and hyper-parameters), when the optimizer has one.
  virtual bool fused(const ParamGroup& /*g*/, OptimKind& /*kind*/, OptimHyper& /*h*/) const { return false; }
  // The fused slice of one parameter of group g, creating its state slots.
  virtual OptimSlice fused_slice(const ParamGroup& /*g*/, Tensor& /*p*/, const Tensor& /*grad*/,
                                 std::map<std::string, Tensor>& /*slots*/) {
    return {};
  }
  // Updates parameter p (index i of group g) with gradient grad; slots are this parameter's state.
  virtual void update(const ParamGroup& g, Tensor& p, const Tensor& grad, std::map<std::string, Tensor>& slots) = 0;
  virtual std::map<std::string, double> hyper() const = 0;
  // Takes the hyper-parameters a state saved (hyper()'s keys, all present), after checking them as
  // the constructor does; nothing changes when it throws. This default refuses any that differ from
  // hyper() (an optimizer that cannot set them must not run with other ones silently).
  virtual void set_hyper(const std::map<std::string, double>& h);
  // Throws unless h (hyper()'s keys) is a valid set of hyper-parameters for this optimizer; `where`
  // names its source in the message ("group 1's", "optimizer state's"). This default takes only
  // hyper()'s values (see set_hyper).
  virtual void check_hyper(const std::map<std::string, double>& h, const std::string& where) const;
  // The checks of every group's own options (made by the constructors of Kiln's optimizers; step()
  // makes them again, as groups() may change them).
  void check_group_options() const;
  // h with group g's own options in place of the optimizer's values (unknown keys refused).
  std::map<std::string, double> with_group_options(std::map<std::string, double> h, size_t g,
                                                   const std::map<std::string, double>& options) const;
  // Whether the update uses the per-parameter step count (Adam's bias corrections; SGD does not:
  // its counts stay 0 and are not saved).
  virtual bool counts_steps() const { return true; }
  // Whether the per-tensor update() reads its step number on the host (steps_: one synchronising
  // read of the counts per step). An optimizer that answers false reads it on the device instead,
  // from step_t_, so its steps never wait for the device.
  virtual bool host_steps() const { return counts_steps(); }
  // This parameter's step number (skipped steps not counted), for the per-tensor update() path only:
  // from a host copy of counts_, read once in a step that runs that path (update() is called once
  // per parameter, and the fused path must not wait for the device).
  int64_t steps_ = 0;
  // This parameter's step number as an f64 [] view of the device-side counts (this step counted), for
  // the per-tensor update() path of an optimizer that counts steps; no host read.
  Tensor step_t_;

 private:
  std::vector<ParamGroup> groups_;
  std::vector<std::vector<std::map<std::string, Tensor>>> slots_;  // [group][param] -> slot -> tensor
  // f64 [] on the parameters' device: steps taken that updated something (steps()). Whether a
  // parameter's state exists is its slots: a step that might be skipped reads the flag on the host
  // only while they are being made.
  Tensor step_count_;
  // f64 [parameters] beside it: each parameter's own step count, in group order (first_[g] + i); the
  // fused kernels read a parameter's there (OptimSlice::step), the per-tensor path reads a host copy.
  // Advanced by the mask of the parameters with a gradient (mask_, uploaded when it changes).
  Tensor counts_, mask_;
  std::vector<double> mask_host_;
  std::vector<size_t> first_;  // each group's first index into counts_
  size_t nparams_ = 0;
  // Each parameter's tensor (its TensorImpl) as the state is laid out: a tensor put in its place
  // through groups() is told apart from it (a weak handle: a replaced tensor that died cannot be
  // mistaken for a new one made at its address).
  std::vector<std::vector<std::weak_ptr<TensorImpl>>> ids_;
  void place_counts(Device dev);  // counts_ made (zeros) or moved to dev
  // Throws unless the groups have the number of groups and sizes the optimizer was made with.
  void check_layout() const;
  // Empty when every parameter is the tensor its state was made for; else, for each parameter
  // (first_[g] + i), the index whose state it takes (its own old index, or -1: fresh state), after
  // checking each is a leaf in one place only.
  std::vector<int64_t> moved() const;
  // Lays the state out by moved() (the per-parameter counts read to the host once, when it changed).
  void rebind(const std::vector<int64_t>& from);  // from: moved()'s answer
};

struct SgdOptions {
  double momentum = 0.0, dampening = 0.0;
  bool nesterov = false;
};
class SGD final : public Optimizer {
 public:
  SGD(std::vector<ParamGroup> groups, SgdOptions o = {});
  std::string name() const override { return "sgd"; }

 private:
  void update(const ParamGroup& g, Tensor& p, const Tensor& grad, std::map<std::string, Tensor>& slots) override;
  std::map<std::string, double> hyper() const override;
  void set_hyper(const std::map<std::string, double>& h) override;
  void check_hyper(const std::map<std::string, double>& h, const std::string& where) const override;
  bool counts_steps() const override { return false; }
  bool fused(const ParamGroup& g, OptimKind& kind, OptimHyper& h) const override;
  OptimSlice fused_slice(const ParamGroup& g, Tensor& p, const Tensor& grad,
                         std::map<std::string, Tensor>& slots) override;
  SgdOptions options(const ParamGroup& g) const;  // o_ with the group's own values
  SgdOptions o_;
};

struct AdamOptions {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
};
// What AdamW and LAMB share: the options and their check, the moments (slots "exp_avg",
// "exp_avg_sq"), the saved hyper-parameters and the fused form; each adds its update rule.
class AdamFamily : public Optimizer {
 public:
  AdamFamily(std::vector<ParamGroup> groups, AdamOptions o, OptimKind kind, const char* name);

 protected:
  std::map<std::string, double> hyper() const override;
  void set_hyper(const std::map<std::string, double>& h) override;
  void check_hyper(const std::map<std::string, double>& h, const std::string& where) const override;
  bool fused(const ParamGroup& g, OptimKind& kind, OptimHyper& h) const override;
  OptimSlice fused_slice(const ParamGroup& g, Tensor& p, const Tensor& grad,
                         std::map<std::string, Tensor>& slots) override;
  AdamOptions options(const ParamGroup& g) const;  // o_ with the group's own values
  AdamOptions o_;
  OptimKind kind_;
};

// Adam with decoupled weight decay: p -= lr * (wd * p + m_hat / (sqrt(v_hat) + eps)).
class AdamW final : public AdamFamily {
 public:
  AdamW(std::vector<ParamGroup> groups, AdamOptions o = {}) : AdamFamily(std::move(groups), o, OptimKind::adamw, "adamw") {}
  std::string name() const override { return "adamw"; }

 private:
  void update(const ParamGroup& g, Tensor& p, const Tensor& grad, std::map<std::string, Tensor>& slots) override;
};

// LAMB (You et al. 2019): the Adam direction plus weight decay, scaled per tensor by the trust
// ratio ||p|| / ||update|| (1 when either norm is zero).
class LAMB final : public AdamFamily {
 public:
  LAMB(std::vector<ParamGroup> groups, AdamOptions o = {0.9, 0.999, 1e-6})
      : AdamFamily(std::move(groups), o, OptimKind::lamb, "lamb") {}
  std::string name() const override { return "lamb"; }

 private:
  void update(const ParamGroup& g, Tensor& p, const Tensor& grad, std::map<std::string, Tensor>& slots) override;
};

// torch.optim.RMSprop (its single-tensor rule): with g = grad + weight_decay * p (L2, as torch),
// square_avg = alpha * square_avg + (1 - alpha) * g^2; centered: grad_avg lerps to g by 1 - alpha and
// avg = sqrt(square_avg - grad_avg^2) + eps, else sqrt(square_avg) + eps; with momentum > 0
// momentum_buffer = momentum * momentum_buffer + g / avg and p -= lr * momentum_buffer, else
// p -= lr * g / avg. Slots "square_avg", "momentum_buffer" (momentum > 0), "grad_avg" (centered), as
// torch's state; the step count is kept (torch's state['step']) though the rule does not use it.
// torch's maximize (the gradient negated) is the Python class's, as for the other optimizers.
struct RmspropOptions {
  double alpha = 0.99, eps = 1e-8, momentum = 0.0;
  bool centered = false;
};
class RMSprop final : public Optimizer {
 public:
  RMSprop(std::vector<ParamGroup> groups, RmspropOptions o = {});
  std::string name() const override { return "rmsprop"; }

 private:
  void update(const ParamGroup& g, Tensor& p, const Tensor& grad, std::map<std::string, Tensor>& slots) override;
  std::map<std::string, double> hyper() const override;
  void set_hyper(const std::map<std::string, double>& h) override;
  void check_hyper(const std::map<std::string, double>& h, const std::string& where) const override;
  bool host_steps() const override { return false; }
  RmspropOptions options(const ParamGroup& g) const;  // o_ with the group's own values
  RmspropOptions o_;
};

// torch.optim.Adagrad (its single-tensor rule, dense gradients): with g = grad + weight_decay * p (L2)
// and t this parameter's step number (from 1), sum += g^2 and p -= lr / (1 + (t - 1) * lr_decay) *
// g / (sqrt(sum) + eps). The slot "sum" starts at the optimizer's initial_accumulator_value (made at the
// parameter's first step; torch makes it at construction, with the same value): a group's own
// "initial_accumulator_value" is kept but not used, as torch 2.x's, whose add_param_group's groups also
// start from the optimizer's (its defaults').
struct AdagradOptions {
  double lr_decay = 0.0, eps = 1e-10, initial_accumulator_value = 0.0;
};
class Adagrad final : public Optimizer {
 public:
  Adagrad(std::vector<ParamGroup> groups, AdagradOptions o = {});
  std::string name() const override { return "adagrad"; }

 private:
  void update(const ParamGroup& g, Tensor& p, const Tensor& grad, std::map<std::string, Tensor>& slots) override;
  std::map<std::string, double> hyper() const override;
  void set_hyper(const std::map<std::string, double>& h) override;
  void check_hyper(const std::map<std::string, double>& h, const std::string& where) const override;
  bool host_steps() const override { return false; }
  AdagradOptions options(const ParamGroup& g) const;  // o_ with the group's own values
  AdagradOptions o_;
};

// Scales all gradients by torch's factor min(max_norm / (norm + 1e-6), 1), so their global norm is at
// most max_norm (max_norm >= 0; an inf norm gives factor 0, a NaN norm NaN, as torch); returns the norm
// before, as an f64 0-dim tensor on the gradients' device (on the CPU when there are none), the powers
// summed in f64. No value goes to the host unless error_if_nonfinite (then an inf or NaN norm is an
// error, torch's, before anything is scaled). On the CPU, whose kernels flush subnormals, non-f64
// gradients are scaled in one pass by the factor as an f64 number: each product in f64, rounded to
// f32 and then (16-bit gradients) to their dtype. Where a product's magnitude is FLT_MIN or more, for
// every dtype, that is one rounding (torch's product, bit for bit); below FLT_MIN it is kept (an f32
// subnormal, not flushed to 0), and a 16-bit one, rounded twice there, may differ from one rounding
// in its last bit.
// norm_type: 2 (L2), any p > 0 (the p-th root of the sum of |g|^p), or inf (the largest |g|), as
// torch's clip_grad_norm_.
// With `reduce_partial`, the f64 partial (the sum of |g|^p, or for inf the largest |g|; `is_max`
// says which) is passed through it before the root is taken: for gradients sharded over ranks
// (dist::ZeroRedundancy), an all-reduce (sum or max) makes it the global one.
Tensor clip_grad_norm(const std::vector<Tensor>& params, double max_norm, double norm_type = 2.0,
                      const std::function<void(Tensor& partial, bool is_max)>& reduce_partial = {},
                      bool error_if_nonfinite = false);
void clip_grad_value(const std::vector<Tensor>& params, double clip);

// Groups for the usual recipe: no weight decay on biases and normalisation weights (1-D tensors).
std::vector<ParamGroup> decay_groups(const std::vector<std::pair<std::string, Tensor>>& named, double lr,
                                     double weight_decay);

enum class ScheduleKind { constant, step, multistep, cosine, linear, polynomial };
struct LrSchedule {
  ScheduleKind kind = ScheduleKind::constant;
  double base_lr = 0.1;
  int64_t warmup_steps = 0;   // linear warmup from 0 to base_lr (all kinds)
  int64_t total_steps = 0;    // cosine / linear / polynomial end
  double min_lr = 0.0;        // cosine / linear / polynomial floor
  int64_t step_size = 1;      // step
  double gamma = 0.1;         // step / multistep factor
  std::vector<int64_t> milestones;  // multistep
  double power = 1.0;         // polynomial
  // Throws naming the field when the schedule cannot give a rate for every step (a cosine schedule without
  // total steps, a negative or non-finite rate, ...). `at` checks first.
  void check() const;
  // The learning rate for optimizer step `step` (0-based).
  double at(int64_t step) const;
  // The schedules by name, one row each (the command line's choices come from them).
  static const std::vector<std::pair<std::string, ScheduleKind>>& kinds();
  static ScheduleKind parse(const std::string& name);
};

}  // namespace kiln::optim
