// CPU kernels of layer norm over the last d elements of each row, forward and backward: row
// statistics in fixed lanes combined in f64, ggamma/gbeta as column sums in row order. f32 runs the
// kernel set's rows (kernels/cpu/isa/loops.inc: the same operations, whose last bit may differ between
// sets where one contracts a * b + c into an FMA); f64 the loops here.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/kernel_sets.h"
#include "kernels/cpu/loops.h"
#include "kernels/cpu/nn_common.h"
#include "kernels/cpu/ops_cpu.h"

namespace kiln::cpu {
using namespace nn_detail;
namespace {

template <typename T>
void layer_norm_fwd(int64_t rows, int64_t d, double eps, const T* x, const T* gamma, const T* beta, T* y, T* mean,
                    T* rstd) {
  using A = LaneAcc<T>;
  if constexpr (std::is_same_v<T, float>) {  // the kernel set's rows (kernels/cpu/isa/loops.inc)
    const auto row = kernel_set().rows.layer_norm;
    parallel_for(0, rows, std::max<int64_t>(1, 8192 / std::max<int64_t>(d, 1)), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) row(d, eps, x + r * d, gamma, beta, y + r * d, mean + r, rstd + r);
    });
    return;
  }
  parallel_for(0, rows, std::max<int64_t>(1, 8192 / std::max<int64_t>(d, 1)), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const T* xr = x + r * d;
      const double m = lane_sum<T>(d, [&](int64_t i) { return A(xr[i]); }) / double(std::max<int64_t>(d, 1));
      const A mf = A(m);
      const double v = lane_sum<T>(d, [&](int64_t i) {
                         const A t = A(xr[i]) - mf;
                         return t * t;
                       }) / double(std::max<int64_t>(d, 1));
      const double rs = 1.0 / std::sqrt(v + eps);
      const A rsf = A(rs);
      T* yr = y + r * d;
      if (gamma && beta) {
        for (int64_t i = 0; i < d; ++i) yr[i] = T((A(xr[i]) - mf) * rsf * A(gamma[i]) + A(beta[i]));
      } else {
        for (int64_t i = 0; i < d; ++i) {
          A h = (A(xr[i]) - mf) * rsf;
          if (gamma) h *= A(gamma[i]);
          if (beta) h += A(beta[i]);
          yr[i] = T(h);
        }
      }
      mean[r] = T(m);
      rstd[r] = T(rs);
    }
  });
}

template <typename T>
void layer_norm_bwd(int64_t rows, int64_t d, const T* x, const T* gamma, const T* mean, const T* rstd, const T* gy,
                    T* gx, T* ggamma, T* gbeta) {
  using A = LaneAcc<T>;
  constexpr bool f32 = std::is_same_v<T, float>;  // f32: the kernel set's rows (kernels/cpu/isa/loops.inc)
  if (gx) {
    if constexpr (f32) {
      const auto row = kernel_set().rows.layer_norm_bwd;
      parallel_for(0, rows, std::max<int64_t>(1, 8192 / std::max<int64_t>(d, 1)), [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) row(d, x + r * d, gamma, mean[r], rstd[r], gy + r * d, gx + r * d);
      });
    } else {
      parallel_for(0, rows, std::max<int64_t>(1, 8192 / std::max<int64_t>(d, 1)), [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) {
          const T* xr = x + r * d;
          const T* g = gy + r * d;
          const A m = A(mean[r]), rs = A(rstd[r]);
          // gx = rstd * (gh - mean(gh) - xhat * mean(gh * xhat)), gh = gy * gamma
          auto gh = [&](int64_t i) { return gamma ? A(g[i]) * A(gamma[i]) : A(g[i]); };
          const A s1 = A(lane_sum<T>(d, gh) / double(d));
          const A s2 = A(lane_sum<T>(d, [&](int64_t i) { return gh(i) * ((A(xr[i]) - m) * rs); }) / double(d));
          T* o = gx + r * d;
          for (int64_t i = 0; i < d; ++i) o[i] = T(rs * (gh(i) - s1 - (A(xr[i]) - m) * rs * s2));
        }
      });
    }
  }
  if (ggamma || gbeta) {
    // Column sums over rows, in row order per column block.
    parallel_for(0, d, 64, [&](int64_t b, int64_t e) {
      std::vector<double> sg(size_t(e - b), 0.0), sb(size_t(e - b), 0.0);
      if constexpr (f32) {
        kernel_set().rows.layer_norm_param_sums(rows, d, b, e, x, mean, rstd, gy, sg.data(), sb.data());
      } else {
        for (int64_t r = 0; r < rows; ++r) {
          const double m = double(mean[r]), rs = double(rstd[r]);
          for (int64_t i = b; i < e; ++i) {
            const double g = double(gy[r * d + i]);
            sg[size_t(i - b)] += g * (double(x[r * d + i]) - m) * rs;
            sb[size_t(i - b)] += g;
          }
        }
      }
      for (int64_t i = b; i < e; ++i) {
        if (ggamma) ggamma[i] = T(sg[size_t(i - b)]);
        if (gbeta) gbeta[i] = T(sb[size_t(i - b)]);
      }
    });
  }
}

}  // namespace

void layer_norm_forward(DType dt, int64_t rows, int64_t d, double eps, const void* x, const void* gamma,
                        const void* beta, void* y, void* mean, void* rstd) {
  dispatch_float(dt, "layer_norm", [&](auto t) {
    using T = decltype(t);
    layer_norm_fwd(rows, d, eps, cp<T>(x), cp<T>(gamma), cp<T>(beta), mp<T>(y), mp<T>(mean), mp<T>(rstd));
  });
}
void layer_norm_backward(DType dt, int64_t rows, int64_t d, const void* x, const void* gamma, const void* mean,
                         const void* rstd, const void* gy, void* gx, void* ggamma, void* gbeta) {
  dispatch_float(dt, "layer_norm", [&](auto t) {
    using T = decltype(t);
    layer_norm_bwd(rows, d, cp<T>(x), cp<T>(gamma), cp<T>(mean), cp<T>(rstd), cp<T>(gy), mp<T>(gx), mp<T>(ggamma),
                   mp<T>(gbeta));
  });
}

}  // namespace kiln::cpu
