// bench_gemm's agreement check of Kiln's result with OpenBLAS's, apart so a test can feed it NaNs.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>

namespace kiln::bench {

// Largest |got - want| / (|want| + sqrt(k)) over `count` values; NaN when either side has a NaN at
// some index (std::max(worst, NaN) would keep `worst` and let a NaN result pass).
template <typename T> double max_scaled_diff(const T* got, const T* want, int64_t count, int64_t k) {
  double worst = 0;
  for (int64_t i = 0; i < count; ++i) {
    const double d = std::abs(double(got[i]) - double(want[i])) / (std::abs(double(want[i])) + std::sqrt(double(k)));
    if (std::isnan(d)) return NAN;
    worst = std::max(worst, d);
  }
  return worst;
}

// Loose: only a wrong result, not rounding, fails it; a NaN difference always does.
inline bool gemm_results_agree(double max_scaled_diff, bool f64) {
  return !std::isnan(max_scaled_diff) && max_scaled_diff <= (f64 ? 1e-10 : 1e-4);
}

}  // namespace kiln::bench
