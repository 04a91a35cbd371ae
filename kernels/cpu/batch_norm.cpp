// CPU kernels of batch norm on NCHW buffers (training and eval), forward and backward: a channel's
// statistics are two-pass sums in fixed lanes combined in f64 (the engine converts channels_last).
#include <algorithm>
#include <cmath>

#include "kernels/cpu/loops.h"
#include "kernels/cpu/nn_common.h"
#include "kernels/cpu/ops_cpu.h"

namespace kiln::cpu {
using namespace nn_detail;
namespace {

template <typename T>
void batch_norm_fwd(int64_t n, int64_t c, int64_t hw, double eps, double momentum, bool training, const T* x,
                    const T* gamma, const T* beta, T* rmean, T* rvar, T* y, T* mean, T* rstd) {
  using A = LaneAcc<T>;
  parallel_for(0, c, 1, [&](int64_t b, int64_t e) {
    for (int64_t ch = b; ch < e; ++ch) {
      double m, v;
      const int64_t count = n * hw;
      if (training) {
        double s = 0;
        for (int64_t i = 0; i < n; ++i) {
          const T* xr = x + (i * c + ch) * hw;
          s += lane_sum<T>(hw, [&](int64_t j) { return A(xr[j]); });
        }
        m = s / double(std::max<int64_t>(count, 1));
        // Two passes: the sum of squared deviations from the mean does not cancel catastrophically.
        const A mf = A(m);
        double q = 0;
        for (int64_t i = 0; i < n; ++i) {
          const T* xr = x + (i * c + ch) * hw;
          q += lane_sum<T>(hw, [&](int64_t j) {
            const A d = A(xr[j]) - mf;
            return d * d;
          });
        }
        v = q / double(std::max<int64_t>(count, 1));
        if (rmean) rmean[ch] = T((1 - momentum) * double(rmean[ch]) + momentum * m);
        if (rvar) {
          const double unbiased = count > 1 ? q / double(count - 1) : v;
          rvar[ch] = T((1 - momentum) * double(rvar[ch]) + momentum * unbiased);
        }
      } else {
        m = double(rmean[ch]);
        v = double(rvar[ch]);
      }
      const double rs = 1.0 / std::sqrt(v + eps);
      mean[ch] = T(m);
      rstd[ch] = T(rs);
      const A sc = A(rs * (gamma ? double(gamma[ch]) : 1.0));
      const A sh = A((beta ? double(beta[ch]) : 0.0) - m * double(sc));
      for (int64_t i = 0; i < n; ++i) {
        const T* xr = x + (i * c + ch) * hw;
        T* yr = y + (i * c + ch) * hw;
        for (int64_t j = 0; j < hw; ++j) yr[j] = T(A(xr[j]) * sc + sh);
      }
    }
  });
}

template <typename T>
void batch_norm_bwd(int64_t n, int64_t c, int64_t hw, bool training, const T* x, const T* gamma, const T* mean,
                    const T* rstd, const T* gy, T* gx, T* ggamma, T* gbeta) {
  using A = LaneAcc<T>;
  parallel_for(0, c, 1, [&](int64_t b, int64_t e) {
    for (int64_t ch = b; ch < e; ++ch) {
      const double m = double(mean[ch]), rs = double(rstd[ch]);
      const double gm = gamma ? double(gamma[ch]) : 1.0;
      const A mf = A(m);
      double sg = 0, sgd = 0;  // sum gy, sum gy * (x - mean)
      for (int64_t i = 0; i < n; ++i) {
        const T* xr = x + (i * c + ch) * hw;
        const T* gr = gy + (i * c + ch) * hw;
        // One pass for both sums: gy*(x - m) = gy*x - m*gy, so accumulate gy and gy*x per lane.
        A acc_g[kLanes] = {}, acc_gx[kLanes] = {};
        int64_t j = 0;
        for (; j + kLanes <= hw; j += kLanes)
          for (int l = 0; l < kLanes; ++l) {
            const A gv = A(gr[j + l]);
            acc_g[l] += gv;
            acc_gx[l] += gv * (A(xr[j + l]) - mf);
          }
        for (; j < hw; ++j) {
          sg += double(gr[j]);
          sgd += double(A(gr[j]) * (A(xr[j]) - mf));
        }
        for (int l = 0; l < kLanes; ++l) {
          sg += double(acc_g[l]);
          sgd += double(acc_gx[l]);
        }
      }
      const double sgx = sgd * rs;
      if (ggamma) ggamma[ch] = T(sgx);
      if (gbeta) gbeta[ch] = T(sg);
      if (!gx) continue;
      const double count = double(std::max<int64_t>(n * hw, 1));
      // gx = gm * rs * (gy - sg / count - (x - m) * rs * sgx / count) = k1 * gy + k2 * x + k3
      const double k1 = gm * rs;
      const double k2 = training ? -gm * rs * rs * sgx / count : 0.0;
      const double k3 = training ? -gm * rs * sg / count - k2 * m : 0.0;
      const A a1 = A(k1), a2 = A(k2), a3 = A(k3);
      for (int64_t i = 0; i < n; ++i) {
        const T* xr = x + (i * c + ch) * hw;
        const T* gr = gy + (i * c + ch) * hw;
        T* out = gx + (i * c + ch) * hw;
        for (int64_t j = 0; j < hw; ++j) out[j] = T(a1 * A(gr[j]) + a2 * A(xr[j]) + a3);
      }
    }
  });
}

}  // namespace

void batch_norm_forward(DType dt, int64_t n, int64_t c, int64_t hw, double eps, double momentum, bool training,
                        const void* x, const void* gamma, const void* beta, void* rmean, void* rvar, void* y,
                        void* mean, void* rstd, bool nhwc) {
  KILN_CHECK(!nhwc, "batch_norm: the CPU kernels take NCHW buffers (the engine converts channels_last)");
  dispatch_float(dt, "batch_norm", [&](auto t) {
    using T = decltype(t);
    batch_norm_fwd(n, c, hw, eps, momentum, training, cp<T>(x), cp<T>(gamma), cp<T>(beta), mp<T>(rmean), mp<T>(rvar),
                   mp<T>(y), mp<T>(mean), mp<T>(rstd));
  });
}
// eps is not needed here: the saved rstd already holds it.
void batch_norm_backward(DType dt, int64_t n, int64_t c, int64_t hw, bool training, double /*eps*/, const void* x,
                         const void* gamma, const void* mean, const void* rstd, const void* gy, void* gx, void* ggamma,
                         void* gbeta, bool nhwc) {
  KILN_CHECK(!nhwc, "batch_norm backward: the CPU kernels take NCHW buffers (the engine converts channels_last)");
  dispatch_float(dt, "batch_norm", [&](auto t) {
    using T = decltype(t);
    batch_norm_bwd(n, c, hw, training, cp<T>(x), cp<T>(gamma), cp<T>(mean), cp<T>(rstd), cp<T>(gy), mp<T>(gx),
                   mp<T>(ggamma), mp<T>(gbeta));
  });
}

}  // namespace kiln::cpu
