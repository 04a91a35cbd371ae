// GradScaler: the state machine of dynamic loss scaling over the backend's fused unscale kernel and
// its device-side scale update (kernels/common/amp_math.h); the state stays on the gradients' device.
#include "engine/amp.h"

#include <cfloat>

#include "engine/internal.h"
#include "engine/ops.h"
#include "kernels/common/amp_math.h"

namespace kiln::amp {

GradScaler::GradScaler(GradScalerOptions o) : o_(o) {
  KILN_CHECK(o_.init_scale > 0 && o_.init_scale <= FLT_MAX, "GradScaler: init_scale must be in (0, FLT_MAX], got ",
             o_.init_scale);
  KILN_CHECK(o_.growth_factor > 1 && o_.backoff_factor > 0 && o_.backoff_factor < 1, "GradScaler: growth_factor ",
             o_.growth_factor, " must be > 1 and backoff_factor ", o_.backoff_factor, " in (0, 1)");
  KILN_CHECK(o_.growth_interval >= 1, "GradScaler: growth_interval must be >= 1, got ", o_.growth_interval);
  state_ = from_vector({o_.enabled ? o_.init_scale : 1.0, 0.0, 0.0}, {amp_math::kStateSize}, DType::f64);
  found_inf_ = zeros({}, DType::f32);
}

void GradScaler::place(Device dev) {
  if (state_.device() != dev) state_ = state_.to(dev);
  if (found_inf_.device() != dev) found_inf_ = zeros({}, TensorOptions(DType::f32, dev));
}

Tensor GradScaler::scale(const Tensor& loss) {
  if (!o_.enabled) return loss;
  // The f32 loss times the scale rounded to f32 (exact: the scale is init_scale times powers of 2).
  // The state stays where the gradients are (placed by unscale()); a loss elsewhere gets a copy.
  Tensor s = cast(state_.narrow(0, amp_math::kScale, 1).reshape({}), DType::f32);
  if (s.device() != loss.device()) s = s.to(loss.device());
  return cast(loss, DType::f32) * s;
}

void GradScaler::unscale(const std::vector<Tensor>& params) {
  KILN_CHECK(stage_ == Stage::ready, "GradScaler: unscale() was already called for this step; call update() after "
             "the optimizer step before unscaling again");
  // The flag and the scale live with the gradients, so a GPU step never copies them to the host.
  have_grads_ = false;
  for (const Tensor& p : params)
    if (p.grad().defined()) {
      place(p.grad().device());
      have_grads_ = true;
      break;
    }
  found_inf_.fill_(0.0);
  if (o_.enabled) {
    const double* scale = state_.data<double>() + amp_math::kScale;
    for (const Tensor& p : params) {
      Tensor g = p.grad();
      if (!g.defined()) continue;
      KILN_CHECK(is_floating(g.dtype()), "GradScaler: a gradient of dtype ", g.dtype(), " cannot be unscaled");
      KILN_CHECK(g.is_contiguous(), "GradScaler: gradients must be contiguous, got strides ", g.strides());
      KILN_CHECK(g.device() == found_inf_.device(), "GradScaler: gradients on ", g.device(), " and ",
                 found_inf_.device(), "; one scaler serves one device");
      detail::backend(g.device()).unscale_check(g.dtype(), g.numel(), g.raw_data(), scale, found_inf_.data<float>());
      g.bump_version();
    }
  }
  stage_ = Stage::unscaled;
}

void GradScaler::step(optim::Optimizer& opt, const std::vector<Tensor>& params) {
  KILN_CHECK(stage_ != Stage::stepped, "GradScaler: step() was already called for this step; call update() first");
  if (stage_ == Stage::ready) unscale(params);
  if (agree) agree(found_inf_);
  stage_ = Stage::stepped;
  opt.step(o_.enabled && have_grads_ ? found_inf_ : Tensor());
}

void GradScaler::update() {
  KILN_CHECK(stage_ == Stage::stepped, "GradScaler: update() needs a step() first (no inf/NaN check was made)");
  stage_ = Stage::ready;
  if (!o_.enabled) return;
  detail::backend(state_.device())
      .amp_update_scale(state_.data<double>(), found_inf_.data<float>(), o_.growth_factor, o_.backoff_factor,
                        o_.growth_interval);
  state_.bump_version();
}

GradScalerState GradScaler::state() const {
  const std::vector<double> v = state_.to_vector();
  return {v[amp_math::kScale], int64_t(v[amp_math::kGrowthTracker]), int64_t(v[amp_math::kSkipped])};
}

bool GradScaler::last_step_skipped() const {
  KILN_CHECK(stage_ != Stage::unscaled, "GradScaler: last_step_skipped() between unscale() and step()");
  return o_.enabled && found_inf_.item<double>() != 0.0;
}

void GradScaler::load_state(const GradScalerState& s) {
  KILN_CHECK(s.scale > 0 && s.scale <= FLT_MAX && s.growth_tracker >= 0 && s.skipped >= 0,
             "GradScaler: invalid saved state (scale ", s.scale, ", growth tracker ", s.growth_tracker, ")");
  state_ = from_vector({s.scale, double(s.growth_tracker), double(s.skipped)}, {amp_math::kStateSize}, DType::f64)
               .to(state_.device());
  stage_ = Stage::ready;
}

}  // namespace kiln::amp
