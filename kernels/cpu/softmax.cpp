// CPU kernels of softmax and log-softmax over any dim and of attention's masked softmax
// (softmax(scale * x + mask)), forward and backward; contiguous f32 rows run in the kernel set's row
// leaves (kernels/cpu/isa/rows.inc: fixed vector lanes).
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

// Whether a row (n elements `inner` apart) of maximum mx is all -inf: a fully masked attention row, which
// gives softmax 0 and log-softmax -inf on every device and in every dtype (NaN in it is not -inf).
template <typename T> bool all_neg_inf(int64_t n, int64_t inner, const T* x, T mx) {
  if (!(mx == -std::numeric_limits<T>::infinity())) return false;
  for (int64_t i = 0; i < n; ++i)
    if (!(x[i * inner] == -std::numeric_limits<T>::infinity())) return false;
  return true;
}

template <typename T>
void softmax_fwd(bool log, int64_t outer, int64_t n, int64_t inner, const T* x, T* y) {
  if constexpr (std::is_same_v<T, float>) {
    if (inner == 1) {  // rows are contiguous: the kernel set's row leaf (fixed vector lanes)
      const auto row = kernel_set().rows.softmax;
      parallel_for(0, outer, std::max<int64_t>(1, 4096 / std::max<int64_t>(n, 1)), [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) row(log, n, x + r * n, y + r * n);
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
      if (all_neg_inf(n, inner, xr, mx)) {  // a fully masked row: 0 (log: -inf)
        for (int64_t i = 0; i < n; ++i) yr[i * inner] = log ? -std::numeric_limits<T>::infinity() : T(0);
        continue;
      }
      if (!std::isfinite(mx)) mx = 0;  // avoid inf - inf
      // exp in T (each term is at most 1), summed in f64; softmax keeps the terms in y for the scale pass.
      double s = 0;
      for (int64_t i = 0; i < n; ++i) {
        const T e = std::exp(xr[i * inner] - mx);
        if (!log) yr[i * inner] = e;
        s += double(e);
      }
      if (log) {  // (x - max) - log(sum): adding log(sum) to max first would round it to max's ulp
        const T ls = T(std::log(s));
        for (int64_t i = 0; i < n; ++i) yr[i * inner] = (xr[i * inner] - mx) - ls;
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
      const auto row = kernel_set().rows.softmax_bwd;
      parallel_for(0, outer, std::max<int64_t>(1, 4096 / std::max<int64_t>(n, 1)), [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) row(log, n, y + r * n, gy + r * n, 1.0f, gx + r * n);
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
// a fully masked row, all -inf, gives 0; any other row whose maximum is not finite uses 0 as its shift).
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
      for (int64_t j = causal_end(mr, r, n); j < n; ++j) yr[j] = -std::numeric_limits<T>::infinity();
      if constexpr (std::is_same_v<T, float>) {
        kernel_set().rows.softmax(false, n, yr, yr);
      } else {
        T mx = -std::numeric_limits<T>::infinity();
        for (int64_t j = 0; j < n; ++j) mx = std::max(mx, yr[j]);
        if (all_neg_inf(n, 1, yr, mx)) {
          std::fill(yr, yr + n, T(0));
          continue;
        }
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
      if constexpr (std::is_same_v<T, float>) {
        kernel_set().rows.softmax_bwd(false, n, yr, g, scale, o);
        continue;
      }
      const T s = T(lane_sum<T>(n, [&](int64_t j) { return LaneAcc<T>(g[j] * yr[j]); }));
      for (int64_t j = 0; j < n; ++j) o[j] = scale * (yr[j] * (g[j] - s));
    }
  });
}

}  // namespace

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

}  // namespace kiln::cpu
