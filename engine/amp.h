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
  int64_t growth_interval = 2000;
  bool enabled = true;  // disabled: scale 1, nothing skipped (bf16 and f32 runs use the same code path)
};

// What a checkpoint stores.
struct GradScalerState {
  double scale = 65536.0;
  int64_t growth_tracker = 0;  // clean steps since the last change of scale
  int64_t skipped = 0;         // steps skipped so far
};

class GradScaler {
 public:
  explicit GradScaler(GradScalerOptions o = {});

  // loss * scale, recorded by autograd (f32).
  Tensor scale(const Tensor& loss) const;
  // Divides every parameter's gradient by the scale in place, noting any inf/NaN, in one pass per
  // tensor. At most once per step: a second call before update() is an error.
  void unscale(const std::vector<Tensor>& params);
  // Unscales (if not done yet), agrees on the inf flag across ranks (`agree`), and steps the
  // optimizer unless a gradient was inf/NaN. Returns whether it stepped.
  bool step(optim::Optimizer& opt, const std::vector<Tensor>& params);
  // Ends the step: backs the scale off after an overflow, grows it after growth_interval clean steps.
  void update();

  double get_scale() const { return s_.scale; }
  bool enabled() const { return o_.enabled; }
  // The f32 flag tensor of this step (1: inf/NaN found); on a GPU it stays on the device.
  const Tensor& found_inf() const { return found_inf_; }
  int64_t skipped_steps() const { return s_.skipped; }
  GradScalerState state() const { return s_; }
  void load_state(const GradScalerState& s);

  // Combines the found-inf flag over ranks (data parallel: an all-reduce with max), so every rank
  // takes the same decision. Unset: one process.
  std::function<void(Tensor& found_inf)> agree;

 private:
  GradScalerOptions o_;
  GradScalerState s_;
  Tensor found_inf_;
  enum class Stage { ready, unscaled, stepped } stage_ = Stage::ready;
};

}  // namespace kiln::amp
