// CPU kernels of batch norm on NCHW buffers (training and eval), forward and backward: a channel's
// statistics are two-pass sums in fixed lanes combined in f64 (the engine converts channels_last). The f32
// loops over a plane are leaves of the kernel set in use (kernels/cpu/isa/rows.inc).
//
// The fused form y = relu(bn(x) + residual) (batch_norm_relu) costs batch norm's passes alone: the
// residual and the ReLU are applied as y is written, and the backward masks gy plane by plane inside
// batch norm's two passes (into the residual's gradient when there is one, else into a scratch plane
// that stays in L1), where add and relu would each have made a pass over the whole tensor.
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "kernels/cpu/kernel_sets.h"
#include "kernels/cpu/loops.h"
#include "kernels/cpu/nn_common.h"
#include "kernels/cpu/ops_cpu.h"
#include "kernels/cpu/scratch.h"

namespace kiln::cpu {
using namespace nn_detail;
namespace {

// The per-plane loops: f32 through the kernel set's leaves (kernels/cpu/isa/rows.inc, vectorised for
// its registers), f64 here, in the same fixed lanes.
struct F64Planes {
  static void stats(int64_t n, const double* x, double m, double* sum, double* sq) {
    if (sum) *sum += lane_sum<double>(n, [&](int64_t j) { return x[j]; });
    if (sq)
      *sq += lane_sum<double>(n, [&](int64_t j) {
        const double d = x[j] - m;
        return d * d;
      });
  }
  static void affine(int64_t n, const double* x, double sc, double sh, const double* r, bool relu, double* y) {
    for (int64_t j = 0; j < n; ++j) {
      double v = x[j] * sc + sh;
      if (r) v += r[j];
      y[j] = relu ? (v <= 0 ? 0.0 : v) : v;
    }
  }
  static void relu_mask(int64_t n, const double* g, const double* y, double* o) {
    for (int64_t j = 0; j < n; ++j) o[j] = y[j] <= 0 ? 0.0 : g[j];
  }
  // One pass for both sums; the tail goes straight into the totals, then the lanes.
  static void grad_sums(int64_t n, const double* g, const double* x, double m, double* sg, double* sgd) {
    double ag[kLanes] = {}, ad[kLanes] = {};
    int64_t j = 0;
    for (; j + kLanes <= n; j += kLanes)
      for (int l = 0; l < kLanes; ++l) {
        ag[l] += g[j + l];
        ad[l] += g[j + l] * (x[j + l] - m);
      }
    for (; j < n; ++j) {
      *sg += g[j];
      *sgd += g[j] * (x[j] - m);
    }
    for (int l = 0; l < kLanes; ++l) {
      *sg += ag[l];
      *sgd += ad[l];
    }
  }
  static void grad_apply(int64_t n, const double* g, const double* y, const double* x, double k1, double k2, double k3,
                         double* o) {
    for (int64_t j = 0; j < n; ++j) {
      const double gj = k1 * (y && y[j] <= 0 ? 0.0 : g[j]);
      o[j] = x ? gj + k2 * x[j] + k3 : gj;
    }
  }
};
struct F32Planes {
  const isa::RowLeaves& r = kernel_set().rows;
  void stats(int64_t n, const float* x, float m, double* sum, double* sq) const { r.bn_stats(n, x, m, sum, sq); }
  void affine(int64_t n, const float* x, float sc, float sh, const float* res, bool relu, float* y) const {
    r.bn_affine(n, x, sc, sh, res, relu, y);
  }
  void relu_mask(int64_t n, const float* g, const float* y, float* o) const { r.relu_mask(n, g, y, o); }
  void grad_sums(int64_t n, const float* g, const float* x, float m, double* sg, double* sgd) const {
    r.bn_grad_sums(n, g, x, m, sg, sgd);
  }
  void grad_apply(int64_t n, const float* g, const float* y, const float* x, float k1, float k2, float k3,
                  float* o) const {
    r.bn_grad_apply(n, g, y, x, k1, k2, k3, o);
  }
};
template <typename T> using Planes = std::conditional_t<std::is_same_v<T, float>, F32Planes, F64Planes>;

template <typename T> void batch_norm_fwd(int64_t n, int64_t c, int64_t hw, double eps, double momentum, bool training,
                                          const T* x, const T* gamma, const T* beta, T* rmean, T* rvar, T* y, T* mean,
                                          T* rstd, const T* res, bool relu) {
  const Planes<T> planes{};
  parallel_for(0, c, 1, [&](int64_t b, int64_t e) {
    for (int64_t ch = b; ch < e; ++ch) {
      double m, v;
      const int64_t count = n * hw;
      if (training) {
        double s = 0;
        for (int64_t i = 0; i < n; ++i) planes.stats(hw, x + (i * c + ch) * hw, T(0), &s, nullptr);
        m = s / double(std::max<int64_t>(count, 1));
        // Two passes: the sum of squared deviations from the mean does not cancel catastrophically.
        double q = 0;
        for (int64_t i = 0; i < n; ++i) planes.stats(hw, x + (i * c + ch) * hw, T(m), nullptr, &q);
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
      const T sc = T(rs * (gamma ? double(gamma[ch]) : 1.0));
      const T sh = T((beta ? double(beta[ch]) : 0.0) - m * double(sc));
      for (int64_t i = 0; i < n; ++i) {
        const int64_t at = (i * c + ch) * hw;
        planes.affine(hw, x + at, sc, sh, res ? res + at : nullptr, relu, y + at);
      }
    }
  });
}

thread_local ScratchBuffer t_masked;  // one plane of ReLU-masked gy

// y non-null: gy is masked first, y <= 0 ? 0 : gy (into gres where given, which the apply pass then reads).
template <typename T> void batch_norm_bwd(int64_t n, int64_t c, int64_t hw, bool training, const T* x, const T* gamma,
                                          const T* mean, const T* rstd, const T* gy, T* gx, T* ggamma, T* gbeta,
                                          const T* y, T* gres) {
  const Planes<T> planes{};
  parallel_for(0, c, 1, [&](int64_t b, int64_t e) {
    T* scratch = y && !gres ? t_masked.get<T>(size_t(hw)) : nullptr;
    for (int64_t ch = b; ch < e; ++ch) {
      const double m = double(mean[ch]), rs = double(rstd[ch]);
      const double gm = gamma ? double(gamma[ch]) : 1.0;
      double sg = 0, sgd = 0;  // sum gy, sum gy * (x - mean)
      for (int64_t i = 0; i < n; ++i) {
        const int64_t at = (i * c + ch) * hw;
        const T* g = gy + at;
        if (y) {
          T* masked = gres ? gres + at : scratch;
          planes.relu_mask(hw, g, y + at, masked);
          g = masked;
        } else if (gres) {  // a residual without ReLU: its gradient is gy
          std::copy(g, g + hw, gres + at);
        }
        planes.grad_sums(hw, g, x + at, T(m), &sg, &sgd);
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
      for (int64_t i = 0; i < n; ++i) {
        const int64_t at = (i * c + ch) * hw;
        // The masked gradient is in gres when there is one; else the mask is applied again. Eval mode
        // takes no x: gx = k1 * gy, as PyTorch's (0 * x would make an inf or NaN input's gradient NaN).
        planes.grad_apply(hw, gres ? gres + at : gy + at, gres ? nullptr : (y ? y + at : nullptr),
                          training ? x + at : nullptr, T(k1), T(k2), T(k3), gx + at);
      }
    }
  });
}

}  // namespace

void batch_norm_forward(DType dt, int64_t n, int64_t c, int64_t hw, double eps, double momentum, bool training,
                        const void* x, const void* gamma, const void* beta, void* rmean, void* rvar, void* y,
                        void* mean, void* rstd, bool nhwc, const void* residual, bool relu) {
  KILN_CHECK(!nhwc, "batch_norm: the CPU kernels take NCHW buffers (the engine converts channels_last)");
  dispatch_float(dt, "batch_norm", [&](auto t) {
    using T = decltype(t);
    batch_norm_fwd(n, c, hw, eps, momentum, training, cp<T>(x), cp<T>(gamma), cp<T>(beta), mp<T>(rmean), mp<T>(rvar),
                   mp<T>(y), mp<T>(mean), mp<T>(rstd), cp<T>(residual), relu);
  });
}
// eps is not needed here: the saved rstd already holds it.
void batch_norm_backward(DType dt, int64_t n, int64_t c, int64_t hw, bool training, double /*eps*/, const void* x,
                         const void* gamma, const void* mean, const void* rstd, const void* gy, void* gx, void* ggamma,
                         void* gbeta, bool nhwc, const void* y, void* gresidual) {
  KILN_CHECK(!nhwc, "batch_norm backward: the CPU kernels take NCHW buffers (the engine converts channels_last)");
  dispatch_float(dt, "batch_norm", [&](auto t) {
    using T = decltype(t);
    batch_norm_bwd(n, c, hw, training, cp<T>(x), cp<T>(gamma), cp<T>(mean), cp<T>(rstd), cp<T>(gy), mp<T>(gx),
                   mp<T>(ggamma), mp<T>(gbeta), cp<T>(y), mp<T>(gresidual));
  });
}

}  // namespace kiln::cpu
