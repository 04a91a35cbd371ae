// GradScaler: the state machine of dynamic loss scaling over the backend's fused unscale kernel.
#include "engine/amp.h"

#include <cfloat>

#include "engine/internal.h"
#include "engine/ops.h"

namespace kiln::amp {

GradScaler::GradScaler(GradScalerOptions o) : o_(o) {
  KILN_CHECK(o_.init_scale > 0 && o_.init_scale <= FLT_MAX, "GradScaler: init_scale must be in (0, FLT_MAX], got ",
             o_.init_scale);
  KILN_CHECK(o_.growth_factor > 1 && o_.backoff_factor > 0 && o_.backoff_factor < 1, "GradScaler: growth_factor ",
             o_.growth_factor, " must be > 1 and backoff_factor ", o_.backoff_factor, " in (0, 1)");
  KILN_CHECK(o_.growth_interval >= 1, "GradScaler: growth_interval must be >= 1, got ", o_.growth_interval);
  s_.scale = o_.enabled ? o_.init_scale : 1.0;
  found_inf_ = zeros({}, DType::f32);
}

Tensor GradScaler::scale(const Tensor& loss) const {
  if (!o_.enabled) return loss;
  return cast(loss, DType::f32) * s_.scale;
}

void GradScaler::unscale(const std::vector<Tensor>& params) {
  KILN_CHECK(stage_ == Stage::ready, "GradScaler: unscale() was already called for this step; call update() after "
             "the optimizer step before unscaling again");
  // The flag lives with the gradients, so a GPU step never copies it to the host to check it.
  for (const Tensor& p : params)
    if (p.grad().defined()) {
      if (found_inf_.device() != p.grad().device()) found_inf_ = zeros({}, TensorOptions(DType::f32, p.grad().device()));
      break;
    }
  found_inf_.fill_(0.0);
  if (o_.enabled) {
    const double inv = 1.0 / s_.scale;
    for (const Tensor& p : params) {
      Tensor g = p.grad();
      if (!g.defined()) continue;
      KILN_CHECK(is_floating(g.dtype()), "GradScaler: a gradient of dtype ", g.dtype(), " cannot be unscaled");
      KILN_CHECK(g.is_contiguous(), "GradScaler: gradients must be contiguous, got strides ", g.strides());
      KILN_CHECK(g.device() == found_inf_.device(), "GradScaler: gradients on ", g.device(), " and ",
                 found_inf_.device(), "; one scaler serves one device");
      detail::backend(g.device()).unscale_check(g.dtype(), g.numel(), g.raw_data(), inv, found_inf_.data<float>());
      g.bump_version();
    }
  }
  stage_ = Stage::unscaled;
}

bool GradScaler::step(optim::Optimizer& opt, const std::vector<Tensor>& params) {
  KILN_CHECK(stage_ != Stage::stepped, "GradScaler: step() was already called for this step; call update() first");
  if (stage_ == Stage::ready) unscale(params);
  if (agree) agree(found_inf_);
  const bool overflow = found_inf_.item<double>() != 0.0;
  stage_ = Stage::stepped;
  if (overflow) {
    ++s_.skipped;
    return false;
  }
  opt.step();
  return true;
}

void GradScaler::update() {
  KILN_CHECK(stage_ == Stage::stepped, "GradScaler: update() needs a step() first (no inf/NaN check was made)");
  stage_ = Stage::ready;
  if (!o_.enabled) return;
  if (found_inf_.item<double>() != 0.0) {
    s_.scale *= o_.backoff_factor;
    s_.growth_tracker = 0;
    return;
  }
  if (++s_.growth_tracker >= o_.growth_interval) {
    s_.growth_tracker = 0;
    if (s_.scale * o_.growth_factor <= FLT_MAX) s_.scale *= o_.growth_factor;  // never past the f32 range
  }
}

void GradScaler::load_state(const GradScalerState& s) {
  KILN_CHECK(s.scale > 0 && s.scale <= FLT_MAX && s.growth_tracker >= 0 && s.skipped >= 0,
             "GradScaler: invalid saved state (scale ", s.scale, ", growth tracker ", s.growth_tracker, ")");
  s_ = s;
  stage_ = Stage::ready;
}

}  // namespace kiln::amp
