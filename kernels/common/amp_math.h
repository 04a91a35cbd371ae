// The loss scaler's arithmetic, shared by the CPU and CUDA kernels: the scaler's state lives on the
// device as three f64 values {scale, growth_tracker, skipped} and is updated there at the end of
// each step, so no step waits for the host to read the inf/NaN flag.
#pragma once
#include <cfloat>
#include <cstdint>

#include "base/macros.h"

namespace kiln::amp_math {

enum : int { kScale = 0, kGrowthTracker = 1, kSkipped = 2, kStateSize = 3 };

// After an inf/NaN (found_inf != 0): count the skipped step, back the scale off, restart the
// growth count. Otherwise grow the scale after `interval` clean steps, never past the f32 range.
KILN_HD void update_scale(double* state, float found_inf, double growth, double backoff, int64_t interval) {
  if (found_inf != 0.0f) {
    state[kScale] *= backoff;
    state[kGrowthTracker] = 0;
    state[kSkipped] += 1;
    return;
  }
  state[kGrowthTracker] += 1;
  if (state[kGrowthTracker] >= double(interval)) {
    state[kGrowthTracker] = 0;
    if (state[kScale] * growth <= double(FLT_MAX)) state[kScale] *= growth;
  }
}

}  // namespace kiln::amp_math
