// The f32 constants of the fused optimizer steps (kernels/common/optim_math.h): plain data, so the CPU
// kernel sets' table of leaves (kernels/cpu/isa/leaves.h) can name them.
#pragma once

namespace kiln::optim_math {

// Hyper-parameters as f32, converted once on the host (as the tensor ops convert their scalars).
struct SgdF {
  float lr, wd, momentum, one_minus_dampening;
  bool nesterov;
};
struct AdamF {
  float lr, wd, beta1, one_minus_beta1, beta2, one_minus_beta2, eps, inv_bc1, inv_bc2, decay_factor, step_scale;
};

}  // namespace kiln::optim_math
