// Dynamic loss scaling for f16 training (the usual semantics): multiply the loss by the scale, unscale
// the gradients in one fused pass that also looks for inf/NaN, skip the optimizer step when one is
// found and halve the scale, double it after `growth_interval` clean steps (never past f32 range).
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "engine/optim.h"
#include "engine/tensor.h"

namespace kiln::amp {

struct GradScalerOptions {
  double init_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;  // <= 0: the scale never grows (torch's meaning of such an interval)
  bool enabled = true;  // disabled: scale 1, nothing skipped (bf16 and f32 runs use the same code path)
};

// What a checkpoint stores.
struct GradScalerState {
  double scale = 65536.0;
  int64_t growth_tracker = 0;  // clean steps since the last change of scale
  int64_t skipped = 0;         // steps skipped so far
};

// The scale, the growth count, the skipped-step count and this step's inf/NaN flag live on the
// gradients' device and are read there: the unscale kernel divides by the scale, the optimizer's
// kernels skip the step on the flag, and update() advances the state in a kernel. Nothing in a
// step waits for the host; get_scale(), skipped_steps() and state() do (for logs and checkpoints).
class GradScaler {
 public:
  explicit GradScaler(GradScalerOptions o = {});

  // loss * scale, recorded by autograd (f32).
  Tensor scale(const Tensor& loss);
  // Divides the gradients of `opt`'s parameters by the scale in place, noting any inf/NaN of the
  // unscaled values, in one pass per tensor. As torch's: at most once per optimizer and step (again
  // before update(), or after step(), is an error); several optimizers each unscale once.
  // 16-bit gradients are refused (unscaling them in 16 bits underflows): keep f32 parameters.
  void unscale(optim::Optimizer& opt, const std::vector<Tensor>& params);
  // Unscales (if not done yet for `opt`), agrees on its inf flag across ranks (`agree`), and steps
  // the optimizer, which changes nothing if its gradients had an inf/NaN (decided on the device).
  // Once per optimizer and step.
  void step(optim::Optimizer& opt, const std::vector<Tensor>& params);
  // What this step recorded for `was` (unscaled, stepped) now belongs to `now`: an optimizer rebuilt
  // in place (Python's add_param_group makes a new engine) keeps its stage, as torch keys it by the
  // optimizer. Nothing recorded: nothing to move.
  void rename_optimizer(const optim::Optimizer& was, const optim::Optimizer& now);
  // Ends the step: backs the scale off if any optimizer's gradients overflowed, grows it after
  // growth_interval clean steps. Needs an inf/NaN check (a step() or unscale()) since the last one.
  void update();

  // Read from the device (a synchronising read: for logs, checkpoints and tests).
  double get_scale() const { return state().scale; }
  int64_t skipped_steps() const { return state().skipped; }
  GradScalerState state() const;
  // Whether the last step() found an inf/NaN and was skipped (a synchronising read).
  bool last_step_skipped() const;
  bool enabled() const { return o_.enabled; }
  // The f32 flag tensor of the last step() (1: inf/NaN found), on the gradients' device.
  const Tensor& found_inf() const { return found_inf_; }
  void load_state(const GradScalerState& s);

  // Combines the found-inf flag over ranks (data parallel: an all-reduce with max), so every rank
  // takes the same decision. Unset: one process.
  std::function<void(Tensor& found_inf)> agree;

 private:
  // Moves the state and the flag to `dev` (the first time, or when the model moved).
  void place(Device dev);
  enum class Stage { unscaled, stepped };
  // What this step did with one optimizer (torch's per-optimizer state); cleared by update().
  struct PerOptimizer {
    const optim::Optimizer* opt;
    Stage stage;
    Tensor found_inf;  // f32 [] on the state's device
    bool have_grads;   // unscale() saw a gradient (and placed the state with it)
  };
  PerOptimizer* find(const optim::Optimizer& opt);
  GradScalerOptions o_;
  // f64 [3] {scale, growth_tracker, skipped}: kernels/common/amp_math.h; the scale is always an f32
  // value (torch keeps it in f32), the counts are exact in f64.
  Tensor state_;
  Tensor found_inf_;  // f32 []: the last step()'s flag
  std::vector<PerOptimizer> per_opt_;
};

}  // namespace kiln::amp
