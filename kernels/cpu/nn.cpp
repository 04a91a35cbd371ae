// CPU kernels of the neural-network ops: pooling, softmax, layer and batch norm, fused
// cross-entropy, and the index kernels (index_select/index_add, gather/scatter_add).
// Statistics accumulate in f64; every loop that sums over rows runs in a fixed order.
#include <cmath>
#include <type_traits>
#include <limits>
#include <vector>

#include "kernels/common/pool_window.h"
#include "kernels/cpu/loops.h"
#include "kernels/cpu/ops_cpu.h"
#include "kernels/cpu/vmath.h"

namespace kiln::cpu {
namespace {

template <typename Fn> void dispatch_float(DType dt, const char* op, Fn&& fn) {
  if (dt == DType::f32) return fn(float{});
  if (dt == DType::f64) return fn(double{});
  KILN_FAIL(op, ": the CPU kernel computes f32 and f64, got ", dt);
}

// ---- pooling ---------------------------------------------------------------------------------------

template <typename T> void max_pool_fwd(const Pool2dParams& p, const T* x, T* y, int64_t* idx) {
  parallel_for(0, p.planes, 1, [&](int64_t b, int64_t e) {
    for (int64_t pl = b; pl < e; ++pl) {
      const T* img = x + pl * p.h * p.w;
      for (int64_t oh = 0; oh < p.oh; ++oh)
        for (int64_t ow = 0; ow < p.ow; ++ow) {
          const PoolWindow w = pool_window(p, oh, ow);
          T best = -std::numeric_limits<T>::infinity();
          int64_t bi = -1;
          const int64_t step_h = w.step_h, step_w = w.step_w;
          for (int64_t ih = w.h0; ih < w.h1; ih += step_h) {
            if (ih < 0) continue;
            for (int64_t iw = w.w0; iw < w.w1; iw += step_w) {
              if (iw < 0) continue;
              const T v = img[ih * p.w + iw];
              if (bi < 0 || v > best || v != v) {
                best = v;
                bi = ih * p.w + iw;
                if (v != v) break;
              }
            }
          }
          y[(pl * p.oh + oh) * p.ow + ow] = best;
          idx[(pl * p.oh + oh) * p.ow + ow] = bi;
        }
    }
  });
}

template <typename T> void max_pool_bwd(const Pool2dParams& p, const T* gy, const int64_t* idx, T* gx) {
  parallel_for(0, p.planes, 1, [&](int64_t b, int64_t e) {
    for (int64_t pl = b; pl < e; ++pl) {
      T* g = gx + pl * p.h * p.w;
      std::fill(g, g + p.h * p.w, T(0));
      for (int64_t i = 0; i < p.oh * p.ow; ++i) {
        const int64_t k = idx[pl * p.oh * p.ow + i];
        if (k >= 0) g[k] += gy[pl * p.oh * p.ow + i];
      }
    }
  });
}

template <typename T> void avg_pool_fwd(const Pool2dParams& p, const T* x, T* y) {
  parallel_for(0, p.planes, 1, [&](int64_t b, int64_t e) {
    for (int64_t pl = b; pl < e; ++pl) {
      const T* img = x + pl * p.h * p.w;
      for (int64_t oh = 0; oh < p.oh; ++oh)
        for (int64_t ow = 0; ow < p.ow; ++ow) {
          const PoolWindow w = pool_window(p, oh, ow);
          const int64_t step_h = w.step_h, step_w = w.step_w;
          double acc = 0;
          for (int64_t ih = std::max<int64_t>(w.h0, 0); ih < w.h1; ih += step_h)
            for (int64_t iw = std::max<int64_t>(w.w0, 0); iw < w.w1; iw += step_w) acc += double(img[ih * p.w + iw]);
          y[(pl * p.oh + oh) * p.ow + ow] = T(w.count > 0 ? acc / double(w.count) : 0.0);
        }
    }
  });
}

template <typename T> void avg_pool_bwd(const Pool2dParams& p, const T* gy, T* gx) {
  parallel_for(0, p.planes, 1, [&](int64_t b, int64_t e) {
    for (int64_t pl = b; pl < e; ++pl) {
      T* g = gx + pl * p.h * p.w;
      std::fill(g, g + p.h * p.w, T(0));
      for (int64_t oh = 0; oh < p.oh; ++oh)
        for (int64_t ow = 0; ow < p.ow; ++ow) {
          const PoolWindow w = pool_window(p, oh, ow);
          if (w.count <= 0) continue;
          const T v = gy[(pl * p.oh + oh) * p.ow + ow] / T(w.count);
          const int64_t step_h = w.step_h, step_w = w.step_w;
          for (int64_t ih = std::max<int64_t>(w.h0, 0); ih < w.h1; ih += step_h)
            for (int64_t iw = std::max<int64_t>(w.w0, 0); iw < w.w1; iw += step_w) g[ih * p.w + iw] += v;
        }
    }
  });
}

// ---- softmax ---------------------------------------------------------------------------------------

// Per-row sums in a fixed lane order (16 independent accumulators the compiler keeps in one vector
// register), added up in double per row: fast, and the same bits whatever the thread count.
template <typename T> using LaneAcc = std::conditional_t<std::is_same_v<T, double>, double, float>;
constexpr int kLanes = 16;

template <typename T, typename F> double lane_sum(int64_t hw, F&& term) {
  using A = LaneAcc<T>;
  A acc[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= hw; j += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += term(j + l);
  double s = 0;
  for (; j < hw; ++j) s += double(term(j));
  for (int l = 0; l < kLanes; ++l) s += double(acc[l]);
  return s;
}

// The maximum of a contiguous f32 row, in the same fixed lanes.
float lane_max(int64_t n, const float* x) {
  float ml[kLanes];
  for (int l = 0; l < kLanes; ++l) ml[l] = -std::numeric_limits<float>::infinity();
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) ml[l] = ml[l] > x[i + l] ? ml[l] : x[i + l];
  float mx = -std::numeric_limits<float>::infinity();
  for (; i < n; ++i) mx = mx > x[i] ? mx : x[i];
  for (int l = 0; l < kLanes; ++l) mx = mx > ml[l] ? mx : ml[l];
  return mx;
}

// y = exp(x - mx) / sum, in fixed lanes; x may be y.
void softmax_row_f32(int64_t n, float mx, const float* xr, float* yr) {
  for (int64_t j = 0; j < n; ++j) yr[j] = vexp(xr[j] - mx);
  const double sum = lane_sum<float>(n, [&](int64_t j) { return yr[j]; });
  const float inv = float(1.0 / sum);
  for (int64_t j = 0; j < n; ++j) yr[j] *= inv;
}

template <typename T>
void softmax_fwd(bool log, int64_t outer, int64_t n, int64_t inner, const T* x, T* y) {
  if constexpr (std::is_same_v<T, float>) {
    if (inner == 1) {  // rows are contiguous: max, exp and sums in fixed vector lanes
      parallel_for(0, outer, std::max<int64_t>(1, 4096 / std::max<int64_t>(n, 1)), [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) {
          const float* xr = x + r * n;
          float* yr = y + r * n;
          float mx = lane_max(n, xr);
          if (!std::isfinite(mx)) mx = 0;
          double sum;
          if (log) {
            sum = lane_sum<float>(n, [&](int64_t j) { return vexp(xr[j] - mx); });
            const float lse = float(std::log(sum)) + mx;
            for (int64_t j = 0; j < n; ++j) yr[j] = xr[j] - lse;
          } else {
            softmax_row_f32(n, mx, xr, yr);
          }
        }
      });
      return;
    }
  }
  parallel_for(0, outer * inner, std::max<int64_t>(1, 4096 / std::max<int64_t>(n, 1)), [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const int64_t o = t / inner, j = t % inner;
      const T* xr = x + o * n * inner + j;
      T* yr = y + o * n * inner + j;
      T mx = -std::numeric_limits<T>::infinity();
      for (int64_t i = 0; i < n; ++i) mx = std::max(mx, xr[i * inner]);
      if (!std::isfinite(mx)) mx = 0;  // all -inf rows give NaN/0 naturally below; avoid inf - inf
      // exp in T (each term is at most 1), summed in f64; softmax keeps the terms in y for the scale pass.
      double s = 0;
      for (int64_t i = 0; i < n; ++i) {
        const T e = std::exp(xr[i * inner] - mx);
        if (!log) yr[i * inner] = e;
        s += double(e);
      }
      if (log) {
        const T lse = T(std::log(s)) + mx;
        for (int64_t i = 0; i < n; ++i) yr[i * inner] = xr[i * inner] - lse;
      } else {
        const T inv = T(1.0 / s);
        for (int64_t i = 0; i < n; ++i) yr[i * inner] *= inv;
      }
    }
  });
}

template <typename T>
void softmax_bwd(bool log, int64_t outer, int64_t n, int64_t inner, const T* y, const T* gy, T* gx) {
  if constexpr (std::is_same_v<T, float>) {
    if (inner == 1) {
      parallel_for(0, outer, std::max<int64_t>(1, 4096 / std::max<int64_t>(n, 1)), [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) {
          const float* yr = y + r * n;
          const float* g = gy + r * n;
          float* o = gx + r * n;
          if (log) {
            const float sf = float(lane_sum<float>(n, [&](int64_t j) { return g[j]; }));
            for (int64_t j = 0; j < n; ++j) o[j] = g[j] - vexp(yr[j]) * sf;
          } else {
            const float sf = float(lane_sum<float>(n, [&](int64_t j) { return g[j] * yr[j]; }));
            for (int64_t j = 0; j < n; ++j) o[j] = yr[j] * (g[j] - sf);
          }
        }
      });
      return;
    }
  }
  parallel_for(0, outer * inner, std::max<int64_t>(1, 4096 / std::max<int64_t>(n, 1)), [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const int64_t o = t / inner, j = t % inner;
      const int64_t base = o * n * inner + j;
      double s = 0;
      if (log) {
        for (int64_t i = 0; i < n; ++i) s += double(gy[base + i * inner]);
        for (int64_t i = 0; i < n; ++i)
          gx[base + i * inner] = T(double(gy[base + i * inner]) - std::exp(double(y[base + i * inner])) * s);
      } else {
        for (int64_t i = 0; i < n; ++i) s += double(gy[base + i * inner]) * double(y[base + i * inner]);
        for (int64_t i = 0; i < n; ++i)
          gx[base + i * inner] = T(double(y[base + i * inner]) * (double(gy[base + i * inner]) - s));
      }
    }
  });
}

// Attention's softmax: z = scale * x + mask written into y, then softmax in place (softmax_fwd's rules:
// a row whose maximum is not finite uses 0 as its shift).
template <typename T>
void masked_softmax_fwd(int64_t rows, int64_t n, const T* x, T scale, const T* mask, const MaskRows& mr, T* y) {
  parallel_for(0, rows, std::max<int64_t>(1, 4096 / std::max<int64_t>(n, 1)), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const T* xr = x + r * n;
      T* yr = y + r * n;
      if (mask) {
        const T* mrow = mask + mask_row_offset(mr, r);
        if (mr.step == 1)
          for (int64_t j = 0; j < n; ++j) yr[j] = xr[j] * scale + mrow[j];
        else
          for (int64_t j = 0; j < n; ++j) yr[j] = xr[j] * scale + mrow[0];
      } else {
        for (int64_t j = 0; j < n; ++j) yr[j] = xr[j] * scale;
      }
      if constexpr (std::is_same_v<T, float>) {
        float mx = lane_max(n, yr);
        if (!std::isfinite(mx)) mx = 0;
        softmax_row_f32(n, mx, yr, yr);
      } else {
        T mx = -std::numeric_limits<T>::infinity();
        for (int64_t j = 0; j < n; ++j) mx = std::max(mx, yr[j]);
        if (!std::isfinite(mx)) mx = 0;
        double s = 0;
        for (int64_t j = 0; j < n; ++j) s += double(yr[j] = std::exp(yr[j] - mx));
        const T inv = T(1.0 / s);
        for (int64_t j = 0; j < n; ++j) yr[j] *= inv;
      }
    }
  });
}

template <typename T>
void masked_softmax_bwd(int64_t rows, int64_t n, const T* y, const T* gy, T scale, T* gx) {
  parallel_for(0, rows, std::max<int64_t>(1, 4096 / std::max<int64_t>(n, 1)), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const T* yr = y + r * n;
      const T* g = gy + r * n;
      T* o = gx + r * n;
      const T s = T(lane_sum<T>(n, [&](int64_t j) { return LaneAcc<T>(g[j] * yr[j]); }));
      for (int64_t j = 0; j < n; ++j) o[j] = scale * (yr[j] * (g[j] - s));
    }
  });
}

// ---- layer norm ------------------------------------------------------------------------------------

template <typename T>
void layer_norm_fwd(int64_t rows, int64_t d, double eps, const T* x, const T* gamma, const T* beta, T* y, T* mean,
                    T* rstd) {
  using A = LaneAcc<T>;
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
  if (gx) {
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
  if (ggamma || gbeta) {
    // Column sums over rows, in row order per column block.
    parallel_for(0, d, 64, [&](int64_t b, int64_t e) {
      std::vector<double> sg(size_t(e - b), 0.0), sb(size_t(e - b), 0.0);
      for (int64_t r = 0; r < rows; ++r) {
        const double m = double(mean[r]), rs = double(rstd[r]);
        for (int64_t i = b; i < e; ++i) {
          const double g = double(gy[r * d + i]);
          sg[size_t(i - b)] += g * (double(x[r * d + i]) - m) * rs;
          sb[size_t(i - b)] += g;
        }
      }
      for (int64_t i = b; i < e; ++i) {
        if (ggamma) ggamma[i] = T(sg[size_t(i - b)]);
        if (gbeta) gbeta[i] = T(sb[size_t(i - b)]);
      }
    });
  }
}

// ---- batch norm ------------------------------------------------------------------------------------

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

// ---- cross-entropy -----------------------------------------------------------------------------------

// One f32 row: max, sum of exponentials and the gradient in 16 fixed lanes (vectorised, the same
// bits on any thread count), combined in double.
void cross_entropy_row_f32(int64_t classes, const float* x, int64_t t, double eps, float* loss, float* g,
                           double grad_scale) {
  constexpr int L = kLanes;
  const float mx = lane_max(classes, x);
  float sl[L] = {}, xl[L] = {};
  double s = 0, sum_x = 0;
  int64_t i = 0;
  for (; i + L <= classes; i += L)
    for (int l = 0; l < L; ++l) {
      sl[l] += vexp(x[i + l] - mx);
      xl[l] += x[i + l];
    }
  for (; i < classes; ++i) {
    s += double(vexp(x[i] - mx));
    sum_x += double(x[i]);
  }
  for (int l = 0; l < L; ++l) {
    s += double(sl[l]);
    sum_x += double(xl[l]);
  }
  const double lse = std::log(s) + double(mx);
  const double nll = lse - double(x[t]);
  // The smoothing term only when it is asked for: with a -inf logit sum_x is -inf, and 0 * inf is NaN.
  *loss = float(eps != 0 ? (1 - eps) * nll + eps * (lse - sum_x / double(classes)) : nll);
  if (!g) return;
  const float lse_f = float(lse), sc = float(grad_scale), off = float(grad_scale * eps / double(classes));
  for (int64_t j = 0; j < classes; ++j) g[j] = sc * vexp(x[j] - lse_f) - off;
  g[t] = float(grad_scale * (std::exp(double(x[t]) - lse) - (1 - eps) - eps / double(classes)));
}

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
      if constexpr (std::is_same_v<T, float>) {
        cross_entropy_row_f32(classes, x, t, eps, loss + r, g, grad_scale);
        continue;
      }
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t i = 0; i < classes; ++i) mx = std::max(mx, double(x[i]));
      double s = 0, sum_x = 0;
      for (int64_t i = 0; i < classes; ++i) {
        s += std::exp(double(x[i]) - mx);
        sum_x += double(x[i]);
      }
      const double lse = std::log(s) + mx;
      // loss = -(1-eps) * logp[t] - eps/C * sum_i logp[i]; the smoothing term only when eps != 0
      // (with a -inf logit sum_x is -inf, and 0 * inf is NaN).
      const double nll = lse - double(x[t]);
      loss[r] = T(eps != 0 ? (1 - eps) * nll + eps * (lse - sum_x / double(classes)) : nll);
      if (g) {
        for (int64_t i = 0; i < classes; ++i) {
          const double p = std::exp(double(x[i]) - lse);
          const double want = (i == t ? (1 - eps) : 0.0) + eps / double(classes);
          g[i] = T(grad_scale * (p - want));
        }
      }
    }
  });
}

// ---- index kernels -----------------------------------------------------------------------------------

template <typename T>
void index_select_typed(int64_t outer, int64_t n_src, int64_t inner, const T* src, int64_t n_idx, const int64_t* idx,
                        T* dst) {
  for (int64_t i = 0; i < n_idx; ++i)
    KILN_CHECK(idx[i] >= 0 && idx[i] < n_src, "index ", idx[i], " at position ", i, " is out of range [0, ", n_src, ")");
  parallel_for(0, outer * n_idx, std::max<int64_t>(1, 16384 / std::max<int64_t>(inner, 1)), [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const int64_t o = t / n_idx, i = t % n_idx;
      std::memcpy(dst + t * inner, src + (o * n_src + idx[i]) * inner, size_t(inner) * sizeof(T));
    }
  });
}

template <typename T>
void index_add_typed(int64_t outer, int64_t n_dst, int64_t inner, T* dst, int64_t n_idx, const int64_t* idx,
                     const T* src) {
  for (int64_t i = 0; i < n_idx; ++i)
    KILN_CHECK(idx[i] >= 0 && idx[i] < n_dst, "index ", idx[i], " at position ", i, " is out of range [0, ", n_dst, ")");
  // Parallel over (outer, column blocks); each column is summed in index order.
  const int64_t blk = 256, nblk = (inner + blk - 1) / blk;
  parallel_for(0, outer * nblk, 1, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const int64_t o = t / nblk, j0 = (t % nblk) * blk, j1 = std::min(inner, j0 + blk);
      for (int64_t i = 0; i < n_idx; ++i) {
        T* d = dst + (o * n_dst + idx[i]) * inner;
        const T* s = src + (o * n_idx + i) * inner;
        for (int64_t j = j0; j < j1; ++j) d[j] += s[j];
      }
    }
  });
}

template <typename T>
void gather_typed(int64_t outer, int64_t n_src, int64_t inner, const T* src, int64_t n_idx, const int64_t* idx, T* dst) {
  parallel_for(0, outer, 1, [&](int64_t b, int64_t e) {
    for (int64_t o = b; o < e; ++o)
      for (int64_t i = 0; i < n_idx; ++i)
        for (int64_t j = 0; j < inner; ++j) {
          const int64_t k = idx[(o * n_idx + i) * inner + j];
          KILN_CHECK(k >= 0 && k < n_src, "gather: index ", k, " is out of range [0, ", n_src, ")");
          dst[(o * n_idx + i) * inner + j] = src[(o * n_src + k) * inner + j];
        }
  });
}

template <typename T>
void scatter_add_typed(int64_t outer, int64_t n_dst, int64_t inner, T* dst, int64_t n_idx, const int64_t* idx,
                       const T* src) {
  parallel_for(0, outer, 1, [&](int64_t b, int64_t e) {
    for (int64_t o = b; o < e; ++o)
      for (int64_t i = 0; i < n_idx; ++i)
        for (int64_t j = 0; j < inner; ++j) {
          const int64_t k = idx[(o * n_idx + i) * inner + j];
          KILN_CHECK(k >= 0 && k < n_dst, "scatter_add: index ", k, " is out of range [0, ", n_dst, ")");
          dst[(o * n_dst + k) * inner + j] += src[(o * n_idx + i) * inner + j];
        }
  });
}

template <typename T> const T* cp(const void* p) { return static_cast<const T*>(p); }
template <typename T> T* mp(void* p) { return static_cast<T*>(p); }

}  // namespace

void max_pool2d_forward(DType dt, const Pool2dParams& p, const void* x, void* y, int64_t* idx) {
  dispatch_float(dt, "max_pool2d", [&](auto t) { max_pool_fwd(p, cp<decltype(t)>(x), mp<decltype(t)>(y), idx); });
}
void max_pool2d_backward(DType dt, const Pool2dParams& p, const void* gy, const int64_t* idx, void* gx) {
  dispatch_float(dt, "max_pool2d", [&](auto t) { max_pool_bwd(p, cp<decltype(t)>(gy), idx, mp<decltype(t)>(gx)); });
}
void avg_pool2d_forward(DType dt, const Pool2dParams& p, const void* x, void* y) {
  dispatch_float(dt, "avg_pool2d", [&](auto t) { avg_pool_fwd(p, cp<decltype(t)>(x), mp<decltype(t)>(y)); });
}
void avg_pool2d_backward(DType dt, const Pool2dParams& p, const void* gy, void* gx) {
  dispatch_float(dt, "avg_pool2d", [&](auto t) { avg_pool_bwd(p, cp<decltype(t)>(gy), mp<decltype(t)>(gx)); });
}
void softmax_forward(DType dt, bool log, int64_t outer, int64_t n, int64_t inner, const void* x, void* y) {
  dispatch_float(dt, "softmax", [&](auto t) { softmax_fwd(log, outer, n, inner, cp<decltype(t)>(x), mp<decltype(t)>(y)); });
}
void softmax_backward(DType dt, bool log, int64_t outer, int64_t n, int64_t inner, const void* y, const void* gy,
                      void* gx) {
  dispatch_float(dt, "softmax", [&](auto t) {
    using T = decltype(t);
    softmax_bwd(log, outer, n, inner, cp<T>(y), cp<T>(gy), mp<T>(gx));
  });
}

void masked_softmax_forward(DType dt, int64_t rows, int64_t n, const void* x, double scale, const void* mask,
                            const MaskRows& mask_rows, void* y) {
  dispatch_float(dt, "masked_softmax", [&](auto t) {
    using T = decltype(t);
    masked_softmax_fwd(rows, n, cp<T>(x), T(scale), cp<T>(mask), mask_rows, mp<T>(y));
  });
}
void masked_softmax_backward(DType dt, int64_t rows, int64_t n, const void* y, const void* gy, double scale, void* gx) {
  dispatch_float(dt, "masked_softmax", [&](auto t) {
    using T = decltype(t);
    masked_softmax_bwd(rows, n, cp<T>(y), cp<T>(gy), T(scale), mp<T>(gx));
  });
}
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
void cross_entropy(DType dt, int64_t rows, int64_t classes, const void* logits, const int64_t* target,
                   int64_t ignore_index, double smoothing, void* loss, void* glogits, double grad_scale) {
  dispatch_float(dt, "cross_entropy", [&](auto t) {
    using T = decltype(t);
    cross_entropy_typed(rows, classes, cp<T>(logits), target, ignore_index, smoothing, mp<T>(loss), mp<T>(glogits),
                        grad_scale);
  });
}

namespace {
// Index kernels move any dtype; they dispatch on every storage type.
template <typename Fn> void dispatch_any(DType dt, Fn&& fn) {
  visit_dtype(dt, [&](auto t) { fn(t); });
}
}  // namespace

void index_select(DType dt, int64_t outer, int64_t n_src, int64_t inner, const void* src, int64_t n_idx,
                  const int64_t* idx, void* dst) {
  dispatch_any(dt, [&](auto t) {
    using T = decltype(t);
    index_select_typed(outer, n_src, inner, cp<T>(src), n_idx, idx, mp<T>(dst));
  });
}
void index_add(DType dt, int64_t outer, int64_t n_dst, int64_t inner, void* dst, int64_t n_idx, const int64_t* idx,
               const void* src) {
  dispatch_float(dt, "index_add", [&](auto t) {
    using T = decltype(t);
    index_add_typed(outer, n_dst, inner, mp<T>(dst), n_idx, idx, cp<T>(src));
  });
}
void gather(DType dt, int64_t outer, int64_t n_src, int64_t inner, const void* src, int64_t n_idx, const int64_t* idx,
            void* dst) {
  dispatch_any(dt, [&](auto t) {
    using T = decltype(t);
    gather_typed(outer, n_src, inner, cp<T>(src), n_idx, idx, mp<T>(dst));
  });
}
void scatter_add(DType dt, int64_t outer, int64_t n_dst, int64_t inner, void* dst, int64_t n_idx, const int64_t* idx,
                 const void* src) {
  dispatch_float(dt, "scatter_add", [&](auto t) {
    using T = decltype(t);
    scatter_add_typed(outer, n_dst, inner, mp<T>(dst), n_idx, idx, cp<T>(src));
  });
}

}  // namespace kiln::cpu
