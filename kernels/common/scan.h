// The arithmetic of the scan and sort kernels, shared by the CPU and CUDA bodies so that both give
// the same bits: the running step of each ScanOp, cumprod's exact gradient, and sort's order.
#pragma once
#include <cstdint>
#include <type_traits>

#include "base/macros.h"
#include "kernels/backend.h"
#include "kernels/common/int_arith.h"

namespace kiln::scan {

// Sums and products run in f64 for floats (one rounding per output), i64 for integers, wrapping there
// as PyTorch's (math::wrap_add, wrap_mul: a signed overflow would be undefined).
template <typename T> using Acc = std::conditional_t<std::is_floating_point_v<T>, double, int64_t>;

template <typename T> KILN_HD bool is_nan(T v) { return v != v; }

// Whether x replaces the running extreme m (cummax: x >= m; cummin: x <= m). Ties move the index to
// the latest, and NaN, once seen, stays (each later NaN takes the index), as PyTorch.
template <typename T> KILN_HD bool takes_over(ScanOp op, T x, T m) {
  if (is_nan(x)) return true;
  if (is_nan(m)) return false;
  return op == ScanOp::cummax ? x >= m : x <= m;
}

// One column of a scan: n elements at stride `stride`.
template <typename T> KILN_HD void scan_column(ScanOp op, int64_t n, int64_t stride, const T* x, T* y, int64_t* idx) {
  if (op == ScanOp::cumsum || op == ScanOp::cumprod) {
    Acc<T> acc = op == ScanOp::cumsum ? Acc<T>(0) : Acc<T>(1);
    for (int64_t i = 0; i < n; ++i) {
      const Acc<T> v = Acc<T>(x[i * stride]);
      acc = op == ScanOp::cumsum ? math::wrap_add(acc, v) : math::wrap_mul(acc, v);
      y[i * stride] = T(acc);
    }
    return;
  }
  T m{};
  int64_t at = 0;
  for (int64_t i = 0; i < n; ++i) {
    const T v = x[i * stride];
    if (i == 0 || takes_over(op, v, m)) m = v, at = i;
    y[i * stride] = m;
    idx[i * stride] = at;
  }
}

// cumprod's gradient for one column. Before the first zero z: (sum_{j >= i} gy_j y_j) / x_i, the
// sum running from the end; at z: y_{z-1} sum_{j >= z} gy_j prod_{z < k <= j} x_k; after z: 0 (each
// product there holds x_z). In f64 for floats.
template <typename T> KILN_HD void cumprod_backward_column(int64_t n, int64_t stride, const T* x, const T* gy, T* gx) {
  using A = double;
  int64_t z = n;
  for (int64_t i = 0; i < n; ++i)
    if (x[i * stride] == T(0)) {
      z = i;
      break;
    }
  // y_{z-1} as the forward computes it, then down from z - 1 by division (no x_i is 0 there):
  // tail = sum_{z > j >= i} gy_j y_j.
  A prefix = 1, tail = 0;
  for (int64_t j = 0; j < z; ++j) prefix *= A(x[j * stride]);
  A y_j = prefix;
  for (int64_t i = z - 1; i >= 0; --i) {
    tail += A(gy[i * stride]) * y_j;
    const A xi = A(x[i * stride]);
    gx[i * stride] = T(tail / xi);
    y_j /= xi;  // y_{i-1}
  }
  if (z == n) return;
  // At z: y_{z-1} (the prefix; 1 for z = 0), then the products past z.
  A p = prefix, acc = 0;
  for (int64_t j = z; j < n; ++j) {
    if (j > z) p *= A(x[j * stride]);
    acc += A(gy[j * stride]) * p;
  }
  gx[z * stride] = T(acc);
  for (int64_t i = z + 1; i < n; ++i) gx[i * stride] = T(0);
}

// Sort order: whether element (a, at ia) goes before (b, at ib). NaN is greater than every number
// and equal to NaN; equal values keep their source order (a stable sort).
template <typename T> KILN_HD bool sorts_before(T a, int64_t ia, T b, int64_t ib, bool descending) {
  const bool na = is_nan(a), nb = is_nan(b);
  bool less, greater;
  if (na || nb) {
    less = !na && nb;
    greater = na && !nb;
  } else {
    less = a < b;
    greater = b < a;
  }
  if (descending ? greater : less) return true;
  if (descending ? less : greater) return false;
  return ia < ib;
}

}  // namespace kiln::scan
