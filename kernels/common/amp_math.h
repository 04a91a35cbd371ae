// The loss scaler's arithmetic, shared by the CPU and CUDA kernels: the scaler's state lives on the
// device as three f64 values {scale (an f32 value), growth_tracker, skipped} and is updated there at the end of
// each step, so no step waits for the host to read the inf/NaN flag.
#pragma once
#include <cfloat>
#include <cstdint>

#include "base/macros.h"

namespace kiln::amp_math {

enum : int { kScale = 0, kGrowthTracker = 1, kSkipped = 2, kStateSize = 3 };

// After an inf/NaN (found_inf != 0): count the skipped step, back the scale off, restart the
// growth count. Otherwise grow the scale after `interval` clean steps, never past the f32 range; an
// interval of 0 or less never grows it (torch takes one, and its count of clean steps never equals it).
// The scale stays an f32 value as torch's (the product in f64, rounded to f32), and never goes below
// FLT_MIN: a subnormal or zero scale zeroes the scaled loss and makes 1/scale inf.
KILN_HD void update_scale(double* state, float found_inf, double growth, double backoff, int64_t interval) {
  if (found_inf != 0.0f) {
    const double s = double(float(state[kScale] * backoff));
    state[kScale] = s < double(FLT_MIN) ? double(FLT_MIN) : s;
    state[kGrowthTracker] = 0;
    state[kSkipped] += 1;
    return;
  }
  state[kGrowthTracker] += 1;
  if (interval > 0 && state[kGrowthTracker] >= double(interval)) {
    state[kGrowthTracker] = 0;
    const float s = float(state[kScale] * growth);
    if (double(s) <= double(FLT_MAX)) state[kScale] = double(s);  // not inf
  }
}

}  // namespace kiln::amp_math
