// The per-element arithmetic of the fused optimizer steps, shared by the CPU and CUDA kernels so
// both devices update a weight with the same f32 operations in the same order (the order of the
// unfused tensor-op versions in engine/optim.cpp).
//
// Every a * b + c is written as an explicit fused multiply-add (fmaf: one rounding) and no other
// sum is left where a product could be fused into it: nvcc contracts a * b + c into an FMA by
// default and the host compiler does where the target has FMA (GCC's default for C++), each at
// places of its own choosing, so the two devices differed in the last bit. Written out, both
// compute the same bits. (The unfused tensor ops round the product apart: they agree to an ulp.)
#pragma once
#include <math.h>

#include <cmath>

#include "kernels/backend.h"
#include "base/macros.h"

namespace kiln::optim_math {

// Hyper-parameters as f32, converted once on the host (as the tensor ops convert their scalars).
struct SgdF {
  float lr, wd, momentum, one_minus_dampening;
  bool nesterov;
};
struct AdamF {
  float lr, wd, beta1, one_minus_beta1, beta2, one_minus_beta2, eps, inv_bc1, inv_bc2, decay_factor, step_scale;
};

KILN_HD SgdF sgd_constants(const OptimHyper& h) {
  return {float(h.lr), float(h.weight_decay), float(h.momentum), float(1.0 - h.dampening), h.nesterov};
}
// On the device (or the CPU) where h.step points: the bias corrections from the step number there.
KILN_HD AdamF adam_constants(const OptimHyper& h) {
  double bc1 = h.bc1, bc2 = h.bc2;
  if (h.step) {
    bc1 = 1.0 - std::pow(h.beta1, *h.step);
    bc2 = 1.0 - std::pow(h.beta2, *h.step);
  }
  return {float(h.lr),          float(h.weight_decay),        float(h.beta1),   float(1.0 - h.beta1),
          float(h.beta2),       float(1.0 - h.beta2),         float(h.eps),     float(1.0 / bc1),
          float(1.0 / bc2),     float(1.0 - h.lr * h.weight_decay), float(-h.lr / bc1)};
}
// Whether the loss scaler asked this step to be skipped (read where the flag lives).
KILN_HD bool skipped(const OptimHyper& h) { return h.skip_if && *h.skip_if != 0.0f; }
// LAMB's step factor for one tensor: -lr * trust, rounded to f32 once.
inline float lamb_step(const OptimHyper& h, double trust) { return float(-h.lr * trust); }

// w -= lr * d with d = g + wd * w, through the momentum buffer when there is one.
KILN_HD void sgd(float& w, float g, float* buf, bool fresh, const SgdF& h) {
  float d = g;
  if (h.wd != 0.0f) d = fmaf(w, h.wd, d);
  if (buf) {
    *buf = fresh ? d : fmaf(*buf, h.momentum, h.one_minus_dampening * d);
    d = h.nesterov ? fmaf(*buf, h.momentum, d) : *buf;
  }
  w = fmaf(-h.lr, d, w);
}

KILN_HD void adam_moments(float g, float& m, float& v, const AdamF& h) {
  m = fmaf(m, h.beta1, h.one_minus_beta1 * g);
  v = fmaf(v, h.beta2, h.one_minus_beta2 * (g * g));
}

// AdamW after the moments: decoupled decay, then the bias-corrected step (step_scale = -lr / bc1).
KILN_HD void adamw_apply(float& w, float m, float v, const AdamF& h) {
  if (h.wd != 0.0f) w = w * h.decay_factor;
  const float denom = std::sqrt(v * h.inv_bc2) + h.eps;
  w = fmaf(h.step_scale, m / denom, w);
}

// LAMB's direction before the trust ratio: m_hat / (sqrt(v_hat) + eps) + wd * w.
KILN_HD float lamb_direction(float w, float m, float v, const AdamF& h) {
  float u = (m * h.inv_bc1) / (std::sqrt(v * h.inv_bc2) + h.eps);
  if (h.wd != 0.0f) u = fmaf(w, h.wd, u);
  return u;
}

// LAMB's update once the step factor (-lr * trust) is known.
KILN_HD void lamb_apply(float& w, float step, float u) { w = fmaf(step, u, w); }

// ||w|| / ||u||, or 1 when either is zero.
KILN_HD double lamb_trust(double w_sq, double u_sq) {
  const double wn = std::sqrt(w_sq), un = std::sqrt(u_sq);
  return (wn > 0 && un > 0) ? wn / un : 1.0;
}

}  // namespace kiln::optim_math
