// Scalar math shared by the CPU and CUDA kernels: activations and their derivatives.
// Each function is written once here so the CPU tests cover what the GPU runs.
#pragma once
#include <cmath>

#include "base/macros.h"

namespace kiln::math {

// Overloads for float and double on host; nvcc maps the same std:: names to device intrinsics.
using std::erf;
using std::exp;
using std::sqrt;
using std::tanh;

constexpr double kSqrt1_2 = 0.70710678118654752440;
constexpr double kInvSqrt2Pi = 0.39894228040143267794;
constexpr double kSqrt2OverPi = 0.79788456080286535588;
constexpr double kGeluTanhCoeff = 0.044715;

template <typename T> KILN_HD T sigmoid(T x) {
  // Stable for large |x|: never exponentiates a positive number.
  if (x >= T(0)) {
    T z = exp(-x);
    return T(1) / (T(1) + z);
  }
  T z = exp(x);
  return z / (T(1) + z);
}

template <typename T> KILN_HD T relu(T x) { return x > T(0) ? x : T(0); }

template <typename T> KILN_HD T gelu_erf(T x) { return T(0.5) * x * (T(1) + erf(x * T(kSqrt1_2))); }
template <typename T> KILN_HD T gelu_erf_grad(T x) {
  const T cdf = T(0.5) * (T(1) + erf(x * T(kSqrt1_2)));
  const T pdf = T(kInvSqrt2Pi) * exp(T(-0.5) * x * x);
  return cdf + x * pdf;
}

template <typename T> KILN_HD T gelu_tanh(T x) {
  const T u = T(kSqrt2OverPi) * (x + T(kGeluTanhCoeff) * x * x * x);
  return T(0.5) * x * (T(1) + tanh(u));
}
template <typename T> KILN_HD T gelu_tanh_grad(T x) {
  const T u = T(kSqrt2OverPi) * (x + T(kGeluTanhCoeff) * x * x * x);
  const T t = tanh(u);
  const T du = T(kSqrt2OverPi) * (T(1) + T(3 * kGeluTanhCoeff) * x * x);
  return T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * du;
}

template <typename T> KILN_HD T rsqrt(T x) { return T(1) / sqrt(x); }

}  // namespace kiln::math
