// The loss scaler's kernels: the fused pass that unscales a gradient in place and flags any inf/NaN,
// for every floating dtype (16-bit values are computed in f32 and stored back rounded), and the
// end-of-step update of the scaler's state.
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "kernels/common/amp_math.h"
#include "kernels/cpu/loops.h"
#include "kernels/cpu/ops_cpu.h"

namespace kiln::cpu {

template <typename T> static bool unscale_typed(int64_t n, T* x, double inv_scale) {
  using C = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const C s = C(inv_scale);
  // Chunks in parallel; a chunk reports whether it saw a non-finite value (x - x is NaN exactly then),
  // looking at the unscaled values as stored, so a product that overflows (in f32 or in the 16-bit
  // rounding) or turns NaN is caught too.
  constexpr int64_t kChunk = 1 << 16;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<char> bad(size_t(chunks), 0);
  parallel_for(0, chunks, 1, [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) {
      const int64_t i0 = c * kChunk, i1 = std::min(n, i0 + kChunk);
      C acc = 0;
      for (int64_t i = i0; i < i1; ++i) {
        x[i] = T(C(x[i]) * s);
        const C r = C(x[i]);  // the stored value: an overflow of a 16-bit rounding counts too
        acc += r - r;
      }
      bad[size_t(c)] = acc != 0 || std::isnan(acc);
    }
  });
  for (char b : bad)
    if (b) return true;
  return false;
}

void unscale_check(DType dt, int64_t n, void* x, const double* scale, float* found_inf) {
  const double inv_scale = 1.0 / *scale;
  bool bad = false;
  switch (dt) {
    case DType::f32: bad = unscale_typed(n, static_cast<float*>(x), inv_scale); break;
    case DType::f64: bad = unscale_typed(n, static_cast<double*>(x), inv_scale); break;
    case DType::f16: bad = unscale_typed(n, static_cast<Half*>(x), inv_scale); break;
    case DType::bf16: bad = unscale_typed(n, static_cast<BFloat16*>(x), inv_scale); break;
    default: KILN_FAIL("unscale: gradients must be floating, got ", dt);
  }
  if (bad) *found_inf = 1.0f;
}

void amp_update_scale(double* state, const float* found_inf, double growth, double backoff, int64_t interval) {
  amp_math::update_scale(state, *found_inf, growth, backoff, interval);
}

}  // namespace kiln::cpu
