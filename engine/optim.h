// Optimizers (SGD, AdamW, LAMB) over parameter groups, gradient clipping, and learning-rate
// schedules that are pure functions of the step (a resumed run gets the same LR).
#pragma once
#include <functional>
#include <map>
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
};

// What a checkpoint stores: per-parameter tensors under "<group>.<index>.<slot>" and scalars.
struct OptimizerState {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, double> scalars;
};

class Optimizer {
 public:
  explicit Optimizer(std::vector<ParamGroup> groups);
  virtual ~Optimizer() = default;
  virtual std::string name() const = 0;
  // One update from the parameters' .grad (parameters without a gradient are skipped). With
  // skip_if (an f32 one-element flag on the parameters' device, the loss scaler's inf/NaN flag) the
  // update changes nothing where the flag is nonzero, decided on the device: the fused kernels read
  // the flag and the step count there, so a step never waits for the host. (Parameters outside the
  // fused path, see use_fused, read both on the host.)
  void step(const Tensor& skip_if = {});
  void zero_grad();
  std::vector<ParamGroup>& groups() { return groups_; }
  const std::vector<ParamGroup>& groups() const { return groups_; }
  void set_lr(double lr);  // every group
  // Steps taken (skipped ones not counted): a synchronising read of the device-side count.
  int64_t steps() const;

  OptimizerState state() const;
  // Restores state() output; names, shapes and the optimizer kind must match.
  void load_state(const OptimizerState& s);
  // f32 parameters with contiguous f32 gradients are updated by one fused backend call per group
  // and device (the same arithmetic); off: one tensor-op update per parameter.
  bool use_fused = true;

 protected:
  // The fused form of a group's step (kind and hyper-parameters), when the optimizer has one.
  virtual bool fused(const ParamGroup& /*g*/, OptimKind& /*kind*/, OptimHyper& /*h*/) const { return false; }
  // The fused slice of one parameter, creating its state slots.
  virtual OptimSlice fused_slice(Tensor& /*p*/, const Tensor& /*grad*/, std::map<std::string, Tensor>& /*slots*/) {
    return {};
  }
  // Updates parameter p (index i of group g) with gradient grad; slots are this parameter's state.
  virtual void update(const ParamGroup& g, Tensor& p, const Tensor& grad, std::map<std::string, Tensor>& slots) = 0;
  virtual std::map<std::string, double> hyper() const = 0;
  // This step's number (skipped steps not counted), for the per-tensor update() path only: a host
  // copy of step_count_, read once in a step that runs that path (update() is called once per
  // parameter, and the fused path must not wait for the device).
  int64_t steps_ = 0;

 private:
  std::vector<ParamGroup> groups_;
  std::vector<std::vector<std::map<std::string, Tensor>>> slots_;  // [group][param] -> slot -> tensor
  // f64 [] on the parameters' device: steps taken, the one count (the fused kernels read it there;
  // steps() and the per-tensor path's steps_ read it on the host). Whether a parameter's state
  // exists is its slots: a step that might be skipped reads the flag on the host only while they
  // are being made.
  Tensor step_count_;
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
  bool fused(const ParamGroup& g, OptimKind& kind, OptimHyper& h) const override;
  OptimSlice fused_slice(Tensor& p, const Tensor& grad, std::map<std::string, Tensor>& slots) override;
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
  bool fused(const ParamGroup& g, OptimKind& kind, OptimHyper& h) const override;
  OptimSlice fused_slice(Tensor& p, const Tensor& grad, std::map<std::string, Tensor>& slots) override;
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

// Scales all gradients so their global norm is at most max_norm (a norm that is inf or NaN leaves
// them as they are); returns the norm before, as an f64 0-dim tensor on the gradients' device (on
// the CPU when there are none). No value goes to the host. norm_type: 2 (L2), any p > 0 (the p-th
// root of the sum of |g|^p), or inf (the largest |g|), as torch's clip_grad_norm_.
// With `reduce_partial`, the f64 partial (the sum of |g|^p, or for inf the largest |g|; `is_max`
// says which) is passed through it before the root is taken: for gradients sharded over ranks
// (dist::ZeroRedundancy), an all-reduce (sum or max) makes it the global one.
Tensor clip_grad_norm(const std::vector<Tensor>& params, double max_norm, double norm_type = 2.0,
                      const std::function<void(Tensor& partial, bool is_max)>& reduce_partial = {});
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
