// GradScaler: the state machine of dynamic loss scaling over the backend's fused unscale kernel and
// its device-side scale update (kernels/common/amp_math.h); the state stays on the gradients' device.
#include "engine/amp.h"

#include <algorithm>
#include <cfloat>

#include "engine/internal.h"
#include "engine/ops.h"
#include "kernels/common/amp_math.h"

namespace kiln::amp {

GradScaler::GradScaler(GradScalerOptions o) : o_(o) {
  // A normal f32: below FLT_MIN the f32 scale is subnormal or 0, the scaled loss 0 and 1/scale inf.
  KILN_CHECK(o_.init_scale >= FLT_MIN && o_.init_scale <= FLT_MAX, "GradScaler: init_scale must be a normal f32 ",
             "value in [", FLT_MIN, ", ", FLT_MAX, "], got ", o_.init_scale);
  KILN_CHECK(o_.growth_factor > 1 && o_.backoff_factor > 0 && o_.backoff_factor < 1, "GradScaler: growth_factor ",
             o_.growth_factor, " must be > 1 and backoff_factor ", o_.backoff_factor, " in (0, 1)");
  // The scale is an f32 value, as torch's (amp_math::update_scale keeps it one).
  state_ = from_vector({o_.enabled ? double(float(o_.init_scale)) : 1.0, 0.0, 0.0}, {amp_math::kStateSize}, DType::f64);
  found_inf_ = zeros({}, DType::f32);
}

void GradScaler::place(Device dev) {
  if (state_.device() != dev) state_ = state_.to(dev);
  if (found_inf_.device() != dev) found_inf_ = zeros({}, TensorOptions(DType::f32, dev));
}

GradScaler::PerOptimizer* GradScaler::find(const optim::Optimizer& opt) {
  for (PerOptimizer& p : per_opt_)
    if (p.opt == &opt) return &p;
  return nullptr;
}

void GradScaler::rename_optimizer(const optim::Optimizer& was, const optim::Optimizer& now) {
  if (&was == &now) return;
  KILN_CHECK(find(now) == nullptr, "GradScaler: the optimizer was already unscaled or stepped this step");
  if (PerOptimizer* p = find(was)) p->opt = &now;
}

Tensor GradScaler::scale(const Tensor& loss) {
  if (!o_.enabled) return loss;
  // The f32 loss times the scale, which is an f32 value, so the cast is exact.
  // The state stays where the gradients are (placed by unscale()); a loss elsewhere gets a copy.
  Tensor s = cast(state_.narrow(0, amp_math::kScale, 1).reshape({}), DType::f32);
  if (s.device() != loss.device()) s = s.to(loss.device());
  return cast(loss, DType::f32) * s;
}

void GradScaler::unscale(optim::Optimizer& opt, const std::vector<Tensor>& params) {
  if (const PerOptimizer* p = find(opt)) {
    KILN_CHECK(p->stage != Stage::unscaled,
               "GradScaler: unscale() was already called on this optimizer since "
               "the last update(); call update() after the optimizer step before unscaling again");
    KILN_FAIL("GradScaler: unscale() is being called after step() on this optimizer; call update() first");
  }
  if (o_.enabled)
    for (size_t i = 0; i < params.size(); ++i) {
      const Tensor& g = params[i].grad();
      // As torch: f16 only (bf16 has f32's exponent range, so unscaling it does not underflow).
      KILN_CHECK(!g.defined() || g.dtype() != DType::f16, "GradScaler: parameter ", i, " (shape ", params[i].shape(),
                 ") has a ", g.dtype(),
                 " gradient; unscaling f16 gradients "
                 "loses them to underflow (torch: \"Attempting to unscale FP16 gradients\"): keep f32 parameters "
                 "and run the forward under autocast");
    }
  // The flag and the scale live with the gradients, so a GPU step never copies them to the host.
  bool have_grads = false;
  for (const Tensor& p : params)
    if (p.grad().defined()) {
      place(p.grad().device());
      have_grads = true;
      break;
    }
  Tensor found = zeros({}, TensorOptions(DType::f32, state_.device()));
  if (o_.enabled) {
    const double* scale = state_.data<double>() + amp_math::kScale;
    for (const Tensor& p : params) {
      Tensor g = p.grad();
      if (!g.defined()) continue;
      KILN_CHECK(is_floating(g.dtype()), "GradScaler: a gradient of dtype ", g.dtype(), " cannot be unscaled");
      KILN_CHECK(g.is_contiguous(), "GradScaler: gradients must be contiguous, got strides ", g.strides());
      KILN_CHECK(g.device() == found.device(), "GradScaler: gradients on ", g.device(), " and ", found.device(),
                 "; one scaler serves one device");
      detail::backend(g.device()).unscale_check(g.dtype(), g.numel(), g.raw_data(), scale, found.data<float>());
      g.bump_version();
    }
  }
  per_opt_.push_back({&opt, Stage::unscaled, found, have_grads});
}

void GradScaler::step(optim::Optimizer& opt, const std::vector<Tensor>& params) {
  if (const PerOptimizer* p = find(opt))
    KILN_CHECK(p->stage != Stage::stepped,
               "GradScaler: step() was already called on this optimizer since the last "
               "update(); call update() first");
  // The optimizer's lr check (the refusal a schedule can cause), before the gradients are unscaled and the
  // stage moves on: a refused step leaves both as they were, and a retry after fixing the lr steps. Its
  // other refusals (groups' layout or options edited through groups(), C++ only) come from opt.step(),
  // after the unscale.
  opt.check_lrs();
  if (!find(opt)) unscale(opt, params);
  PerOptimizer& p = *find(opt);
  if (agree) agree(p.found_inf);
  p.stage = Stage::stepped;
  found_inf_ = p.found_inf;
  opt.step(o_.enabled && p.have_grads ? p.found_inf : Tensor());
}

void GradScaler::update() {
  KILN_CHECK(!per_opt_.empty(),
             "GradScaler: update() needs a step() first (no inf/NaN check was recorded since "
             "the last update())");
  // Any optimizer's overflow backs the scale off (the flags are 0 or 1: their sum is nonzero exactly then).
  Tensor found = per_opt_[0].found_inf;
  for (size_t i = 1; i < per_opt_.size(); ++i) found = found + per_opt_[i].found_inf;
  per_opt_.clear();
  if (!o_.enabled) return;
  detail::backend(state_.device())
      .amp_update_scale(state_.data<double>(), found.data<float>(), o_.growth_factor, o_.backoff_factor,
                        o_.growth_interval);
  state_.bump_version();
}

GradScalerState GradScaler::state() const {
  const std::vector<double> v = state_.to_vector();
  return {v[amp_math::kScale], int64_t(v[amp_math::kGrowthTracker]), int64_t(v[amp_math::kSkipped])};
}

bool GradScaler::last_step_skipped() const {
  for (const PerOptimizer& p : per_opt_)
    KILN_CHECK(p.stage != Stage::unscaled, "GradScaler: last_step_skipped() between unscale() and step()");
  return o_.enabled && found_inf_.item<double>() != 0.0;
}

void GradScaler::load_state(const GradScalerState& s) {
  KILN_CHECK(s.scale > 0 && s.scale <= FLT_MAX && s.growth_tracker >= 0 && s.skipped >= 0,
             "GradScaler: invalid saved state (scale ", s.scale, " must be in (0, FLT_MAX], growth tracker ",
             s.growth_tracker, " and skipped steps ", s.skipped, " >= 0)");
  // Checkpoints from before the scale was kept in f32 hold an f64 scale, which backoff may have
  // taken below FLT_MIN: rounded to f32 and raised to the floor update() keeps.
  state_ = from_vector({std::max(double(float(s.scale)), double(FLT_MIN)), double(s.growth_tracker), double(s.skipped)},
                       {amp_math::kStateSize}, DType::f64)
               .to(state_.device());
  per_opt_.clear();
}

}  // namespace kiln::amp
