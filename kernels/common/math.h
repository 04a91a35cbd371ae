// Scalar math shared by the CPU and CUDA kernels: activations and their derivatives.
// Each function is written once here so the CPU tests cover what the GPU runs.
#pragma once
#include <cmath>
#include <limits>
#include <type_traits>

#include "base/macros.h"

namespace kiln::math {

// Overloads for float and double on host; nvcc maps the same std:: names to device intrinsics.
using std::erf;
using std::erfc;
using std::exp;
using std::expm1;
using std::fabs;
using std::log;
using std::log1p;
using std::sqrt;
using std::tanh;
using std::trunc;

// fmod and Python's remainder, exact for floats (fmod is) and integers (b != 0, checked by the caller).
// A clamp bound given as f64 in the arithmetic type A: itself for floats; for integers the nearest
// value inside the clamp (ceil for a lower bound, floor for an upper one), saturated at A's range, so
// a bound past the range is no bound (clamp(x_i8, 0, 200) keeps 127, as PyTorch).
template <typename A> KILN_HD A clamp_bound(double v, bool lower) {
  if constexpr (std::is_floating_point_v<A>) {
    return A(v);
  } else {
    const double lo = double(std::numeric_limits<A>::lowest()), hi = double(std::numeric_limits<A>::max());
    if (v <= lo) return std::numeric_limits<A>::lowest();
    if (v >= hi) return std::numeric_limits<A>::max();  // for i64, hi is 2^63 once rounded
    return A(lower ? std::ceil(v) : std::floor(v));
  }
}

template <typename T> KILN_HD T fmod_of(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    return std::fmod(a, b);
  } else {
    if constexpr (std::is_signed_v<T>) {
      if (b == T(-1)) return T(0);  // INT_MIN % -1 overflows
    }
    return T(a % b);
  }
}
template <typename T> KILN_HD T remainder_of(T a, T b) {
  const T r = fmod_of(a, b);
  if constexpr (std::is_signed_v<T> || std::is_floating_point_v<T>) {
    if (r != T(0) && ((r < T(0)) != (b < T(0)))) return T(r + b);
  }
  return r;
}

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

// NaN stays NaN, as in PyTorch (a NaN activation must not turn into a finite 0 that hides it).
template <typename T> KILN_HD T relu(T x) { return x <= T(0) ? T(0) : x; }

// The normal CDF as erfc(-x/sqrt2)/2, not (1 + erf(x/sqrt2))/2: for x below about -5, 1 + erf
// cancels to a few bits (or to 0), so two libraries' erf, an ulp apart, gave results a factor of
// two apart; erfc keeps full relative precision in that tail.
template <typename T> KILN_HD T gelu_erf(T x) { return T(0.5) * x * erfc(-x * T(kSqrt1_2)); }
template <typename T> KILN_HD T gelu_erf_grad(T x) {
  const T cdf = T(0.5) * erfc(-x * T(kSqrt1_2));
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

// ---- the elementwise math and activation ops of UnaryOp (kernels/backend.h), p0/p1 as named there ----

template <typename T> KILN_HD T frac(T x) { return x - trunc(x); }

// The inverse of erf on (-1, 1) (+-inf at +-1, NaN outside): Giles' single-precision approximation
// ("Approximating the erfinv function", GPU Computing Gems, 2011), then Newton steps on erf(y) - x,
// one in float and two in double, so both reach their type's precision.
template <typename T> KILN_HD T erfinv(T x) {
  if (!(x > T(-1) && x < T(1))) {
    if (x == T(1)) return T(INFINITY);
    if (x == T(-1)) return T(-INFINITY);
    return T(NAN);
  }
  float w = -log((1.0f - float(x)) * (1.0f + float(x))), p;
  if (w < 5.0f) {
    w -= 2.5f;
    p = 2.81022636e-08f;
    p = 3.43273939e-07f + p * w;
    p = -3.5233877e-06f + p * w;
    p = -4.39150654e-06f + p * w;
    p = 0.00021858087f + p * w;
    p = -0.00125372503f + p * w;
    p = -0.00417768164f + p * w;
    p = 0.246640727f + p * w;
    p = 1.50140941f + p * w;
  } else {
    w = sqrt(w) - 3.0f;
    p = -0.000200214257f;
    p = 0.000100950558f + p * w;
    p = 0.00134934322f + p * w;
    p = -0.00367342844f + p * w;
    p = 0.00573950773f + p * w;
    p = -0.0076224613f + p * w;
    p = 0.00943887047f + p * w;
    p = 1.00167406f + p * w;
    p = 2.83297682f + p * w;
  }
  T y = T(p * float(x));
  constexpr int kSteps = sizeof(T) == 4 ? 1 : 2;
  for (int i = 0; i < kSteps; ++i) {
    const T d = T(2 * kInvSqrt2Pi * 1.4142135623730950488) * exp(-y * y);  // erf'(y) = 2/sqrt(pi) e^-y^2
    if (!(d > T(0))) break;  // far in the tail: the approximation is as good as it gets
    y -= (erf(y) - x) / d;
  }
  return y;
}

template <typename T> KILN_HD T silu(T x) { return x * sigmoid(x); }
// log(1 + e^(beta x)) / beta, as max(z, 0) + log1p(e^-|z|) (z = beta x) so it never overflows; x where
// z > threshold (PyTorch's rule).
template <typename T> KILN_HD T softplus(T x, T beta, T threshold) {
  const T z = beta * x;
  if (z > threshold) return x;
  return ((z > T(0) ? z : T(0)) + log1p(exp(-fabs(z)))) / beta;
}
template <typename T> KILN_HD T mish(T x) { return x * tanh(softplus(x, T(1), T(20))); }
template <typename T> KILN_HD T logsigmoid(T x) { return (x < T(0) ? x : T(0)) - log1p(exp(-fabs(x))); }
template <typename T> KILN_HD T softsign(T x) { return x / (T(1) + fabs(x)); }
template <typename T> KILN_HD T leaky_relu(T x, T slope) { return x > T(0) ? x : slope * x; }
template <typename T> KILN_HD T elu(T x, T alpha, T scale) { return scale * (x > T(0) ? x : alpha * expm1(x)); }
template <typename T> KILN_HD T celu(T x, T alpha) { return x > T(0) ? x : alpha * expm1(x / alpha); }
template <typename T> KILN_HD T hardsigmoid(T x) { return x <= T(-3) ? T(0) : x >= T(3) ? T(1) : x / T(6) + T(0.5); }
template <typename T> KILN_HD T hardswish(T x) { return x <= T(-3) ? T(0) : x >= T(3) ? x : x * (x + T(3)) / T(6); }

}  // namespace kiln::math
