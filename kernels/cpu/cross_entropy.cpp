// CPU kernel of the fused cross-entropy (log-softmax + NLL with label smoothing and ignore_index):
// the loss of each row and, when asked, the logits' gradient in the same pass.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "kernels/cpu/kernel_sets.h"
#include "kernels/cpu/loops.h"
#include "kernels/cpu/nn_common.h"
#include "kernels/cpu/ops_cpu.h"

namespace kiln::cpu {
using namespace nn_detail;
namespace {

template <typename T>
void cross_entropy_typed(int64_t rows, int64_t classes, const T* logits, const int64_t* target, int64_t ignore,
                         double eps, T* loss, T* glogits, double grad_scale) {
  parallel_for(0, rows, std::max<int64_t>(1, 4096 / std::max<int64_t>(classes, 1)), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const T* x = logits + r * classes;
      const int64_t t = target[r];
      T* g = glogits ? glogits + r * classes : nullptr;
      if (t == ignore) {
        loss[r] = T(0);
        if (g) std::fill(g, g + classes, T(0));
        continue;
      }
      KILN_CHECK(t >= 0 && t < classes, "cross_entropy: target ", t, " at row ", r, " is outside [0, ", classes, ")");
      if constexpr (std::is_same_v<T, float>) {  // the kernel set's row leaf (fixed vector lanes)
        kernel_set().rows.cross_entropy(classes, x, t, eps, loss + r, g, grad_scale);
        continue;
      }
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t i = 0; i < classes; ++i) mx = std::max(mx, double(x[i]));
      // Relative to the maximum, as the f32 row leaf: max + log(sum) would absorb log(sum) into a
      // large max (logits of 1e17 gave a loss of 0).
      double s = 0, sum_d = 0;
      for (int64_t i = 0; i < classes; ++i) {
        s += std::exp(double(x[i]) - mx);
        sum_d += double(x[i]) - mx;
      }
      const double ls = std::log(s);
      // loss = -(1-eps) * logp[t] - eps/C * sum_i logp[i]; the smoothing term only when eps != 0
      // (with a -inf logit sum_d is -inf, and 0 * inf is NaN).
      const double nll = (mx - double(x[t])) + ls;
      loss[r] = T(eps != 0 ? (1 - eps) * nll + eps * (ls - sum_d / double(classes)) : nll);
      if (g) {
        for (int64_t i = 0; i < classes; ++i) {
          const double p = std::exp((double(x[i]) - mx) - ls);  // not x - lse: lse is rounded to mx's ulp
          const double want = (i == t ? (1 - eps) : 0.0) + eps / double(classes);
          g[i] = T(grad_scale * (p - want));
        }
      }
    }
  });
}

}  // namespace

void cross_entropy(DType dt, int64_t rows, int64_t classes, const void* logits, const int64_t* target,
                   int64_t ignore_index, double smoothing, void* loss, void* glogits, double grad_scale) {
  dispatch_float(dt, "cross_entropy", [&](auto t) {
    using T = decltype(t);
    cross_entropy_typed(rows, classes, cp<T>(logits), target, ignore_index, smoothing, mp<T>(loss), mp<T>(glogits),
                        grad_scale);
  });
}

}  // namespace kiln::cpu
