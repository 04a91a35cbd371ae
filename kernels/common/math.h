// Scalar math shared by the CPU and CUDA kernels: activations and their derivatives.
// Each function is written once here so the CPU tests cover what the GPU runs.
#pragma once
#include <cmath>
#include <limits>
#include <type_traits>

#include "base/macros.h"

namespace kiln::math {

// Overloads for float and double on host; nvcc maps the same std:: names to device intrinsics.
using std::copysign;
using std::cos;
using std::erf;
using std::erfc;
using std::exp;
using std::expm1;
using std::fabs;
using std::floor;
using std::lgamma;
using std::log;
using std::log1p;
using std::pow;
using std::sin;
using std::sqrt;
using std::tan;
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

// ---- gamma-family and Bessel special functions (torch.special's), in the input's float type ----

constexpr double kPi = 3.14159265358979323846;
constexpr double kSqrt2 = 1.41421356237309504880;
constexpr double kSqrtPi = 1.77245385090551602730;

// The digamma function psi = Gamma'/Gamma for x > 0 (and +inf, NaN): psi(x) = psi(x + 1) - 1/x until
// x >= 10, then the asymptotic series ln x - 1/2x - sum B_2k / (2k x^2k) to k = 7 (Cephes' psi).
template <typename T> KILN_HD T digamma_positive(T x) {
  T acc = T(0);
  while (x < T(10)) {
    acc -= T(1) / x;
    x += T(1);
  }
  if (x == T(10)) return acc + T(2.25175258906672110764);  // psi(10), so whole inputs land exactly
  T y = T(0);
  if (x < T(1e17)) {  // beyond, the series' terms are below an ulp of ln x
    const T z = T(1) / (x * x);
    y = z * (T(1.0 / 12) +
             z * (T(-1.0 / 120) +
                  z * (T(1.0 / 252) + z * (T(-1.0 / 240) + z * (T(1.0 / 132) + z * (T(-691.0 / 32760) + z / T(12)))))));
  }
  return acc + log(x) - T(0.5) / x - y;
}

// psi at every x, as torch.digamma: -inf at +0 (+inf at -0), NaN at the negative integers and -inf;
// a negative x reflects, psi(x) = psi(1 - x) - pi / tan(pi x), tan taking x's fraction (exact) so a large
// |x| keeps its digits.
template <typename T> KILN_HD T digamma(T x) {
  if (x == T(0)) return copysign(T(INFINITY), -x);
  if (x < T(0)) {
    if (x == trunc(x)) return T(NAN);
    return digamma_positive(T(1) - x) - T(kPi) / tan(T(kPi) * (x - trunc(x)));
  }
  return digamma_positive(x);
}

// The Hurwitz zeta function sum_k (k + q)^-s for s > 1 (Cephes' zeta, as torch's): the sum directly
// until the terms drop below an ulp or past q + 9 terms, then the Euler-Maclaurin tail with B_2 .. B_24.
// inf at s == 1 and at whole q <= 0, NaN for s < 1 and for a non-whole s with q <= 0 (hurwitz_zeta below;
// this is its sum, for q > -16, not recursive so that device code inlines it).
template <typename T> KILN_HD T hurwitz_zeta_direct(T s, T q) {
  // (2k)! / B_2k, k = 1 .. 12
  constexpr double kA[12] = {12.0,
                             -720.0,
                             30240.0,
                             -1209600.0,
                             47900160.0,
                             -1.8924375803183791606e9,
                             7.47242496e10,
                             -2.950130727918164224e12,
                             1.1646782814350067249e14,
                             -4.5979787224074726105e15,
                             1.8152105401943546773e17,
                             -7.1661652561756670113e18};
  constexpr T kEps = std::numeric_limits<T>::epsilon() / 2;
  T sum = pow(q, -s), a = q, b = T(0);
  for (int i = 0; i < 9 || a <= T(9);) {
    ++i;
    a += T(1);
    b = pow(a, -s);
    sum += b;
    if (-kEps * sum < b && b < kEps * sum) return sum;
  }
  const T w = a;
  sum += b * w / (s - T(1)) - T(0.5) * b;
  T fac = T(1), k = T(0);
  for (int i = 0; i < 12; ++i) {
    fac *= s + k;
    b /= w;
    const T t = fac * b / T(kA[i]);
    sum += t;
    if (fabs(t / sum) < kEps) break;
    k += T(1);
    fac *= s + k;
    b /= w;
    k += T(1);
  }
  return sum;
}

template <typename T> KILN_HD T hurwitz_zeta(T s, T q) {
  if (s == T(1)) return T(INFINITY);
  if (s < T(1)) return T(NAN);
  if (q <= T(0)) {
    if (q == floor(q)) return T(INFINITY);
    if (s != floor(s)) return T(NAN);  // q^-s is not real
    if (q < T(-16)) {
      // The direct sum would take |q| steps (hours near -1e12). With f = q - floor(q) and M = -floor(q), the
      // terms q .. q + M - 1 are (f - m), m = 1 .. M, so for whole s: zeta(s, q) = zeta(s, f) +
      // (-1)^s (zeta(s, 1 - f) - zeta(s, M + 1 - f)), each of them O(1).
      const T f = q - floor(q), m = -floor(q);
      const T odd = fmod(s, T(2)) != T(0) ? T(-1) : T(1);
      // The O(1) pair first (it cancels exactly for odd s at f = 1/2), then the small tail: subtracting the tail
      // from zeta(s, 1 - f) first would round it away.
      return (hurwitz_zeta_direct(s, f) + odd * hurwitz_zeta_direct(s, T(1) - f)) -
             odd * hurwitz_zeta_direct(s, m + T(1) - f);
    }
  }
  if (q > T(1e8) && q < T(INFINITY)) {  // (at inf the sum below gives torch's NaN)
    // Euler-Maclaurin's first terms, q^(1-s) (1 / (s - 1) + 1 / (2q) + s / (12 q^2)), the next below q^-4
    // relative: forming q^-s alone underflowed (trigamma was 0 above 1.3e154, where it is about 1 / q).
    return pow(q, T(1) - s) * (T(1) / (s - T(1)) + T(0.5) / q + s / (T(12) * q * q));
  }
  return hurwitz_zeta_direct(s, q);
}

// The n-th derivative of digamma (n >= 0, checked by the caller): digamma for n = 0, else
// (-1)^(n+1) n! zeta(n + 1, x), which holds at every non-pole x (the poles give inf times the sign). At
// +-inf the values are torch's: trigamma 0 at inf and NaN at -inf, higher orders NaN at inf (zeta's tail
// multiplies 0 by inf) and -+inf at -inf.
template <typename T> KILN_HD T polygamma(int n, T x) {
  if (n == 0) return digamma(x);
  if (n == 1 && (x == T(INFINITY) || x == T(-INFINITY))) return x > T(0) ? T(0) : T(NAN);
  // in f64 for every type: float's zeta cancels to nothing between the poles (the sum's terms there are
  // far larger than the result) and n! overflows float from n = 35
  const double sign = n % 2 ? 1.0 : -1.0;
  return T(sign * exp(lgamma(double(n) + 1.0)) * hurwitz_zeta(double(n + 1), double(x)));
}

// e^(x^2) without x^2's rounding error (which e^ would multiply by x^2): x = hi + lo with hi short
// enough that hi^2 is exact below e^'s overflow, and x^2 - hi^2 = lo (x + hi).
template <typename T> KILN_HD T exp_of_square(T x) {
  constexpr T kSplit = sizeof(T) == 4 ? T(64) : T(4096);
  const T hi = trunc(x * kSplit) / kSplit, lo = x - hi;
  return exp(hi * hi) * exp(lo * (x + hi));
}

// e^(x^2) erfc(x) for x >= 0: the product below 6 (erfc keeps its relative precision there), the
// asymptotic series 1 / (x sqrt(pi)) sum (-1)^k (2k-1)!! / (2x^2)^k above (its smallest term, near
// k = x^2, is below e^-36).
template <typename T> KILN_HD T erfcx_nonnegative(T x) {
  if (x < T(6)) return exp_of_square(x) * erfc(x);
  const T z = T(1) / (T(2) * x * x);
  T term = T(1), sum = T(1);
  for (int k = 1; k < 40; ++k) {
    term *= -T(2 * k - 1) * z;
    sum += term;
    if (fabs(term) < std::numeric_limits<T>::epsilon() * T(0.25)) break;
  }
  return sum / (x * T(kSqrtPi));
}
// The scaled complementary error function e^(x^2) erfc(x); below 0 it is 2 e^(x^2) - erfcx(-x), inf
// where e^(x^2) overflows.
template <typename T> KILN_HD T erfcx(T x) {
  if (x != x) return x;
  if (x >= T(0)) return erfcx_nonnegative(x);
  if (x < T(-30)) return T(INFINITY);
  return T(2) * exp_of_square(x) - erfcx_nonnegative(-x);
}

// log of the normal CDF, as torch.special.log_ndtr: log(erfcx(-t) / 2) - t^2 (t = x / sqrt2) below -1,
// which stays accurate far into the tail (log(ndtr) underflows near -38), log1p(-erfc(t) / 2) above.
template <typename T> KILN_HD T log_ndtr(T x) {
  const T t = x * T(kSqrt1_2);
  if (x < T(-1)) return log(erfcx(-t) * T(0.5)) - t * t;
  return log1p(T(-0.5) * erfc(t));
}

// The inverse of the normal CDF: -inf at 0, +inf at 1, NaN outside [0, 1]. In [0.25, 0.75] it is
// sqrt2 erfinv(2p - 1) (2p - 1 exact there); outside, for q = min(p, 1 - p) (1 - p exact for p >= 1/2),
// Newton's method on log ndtr(y) = log q from Abramowitz and Stegun's 26.2.23 (error < 4.5e-4):
// log ndtr is concave and keeps its precision in the tail, so a few steps reach the last bits even for
// subnormal q.
template <typename T> KILN_HD T ndtri(T p) {
  if (!(p > T(0) && p < T(1))) {
    if (p == T(0)) return T(-INFINITY);
    if (p == T(1)) return T(INFINITY);
    return T(NAN);
  }
  if (p >= T(0.25) && p <= T(0.75)) return T(kSqrt2) * erfinv(T(2) * p - T(1));
  const bool upper = p > T(0.5);
  const T q = upper ? T(1) - p : p, lq = log(q);
  const T t = sqrt(T(-2) * lq);
  T y = (T(2.515517) + t * (T(0.802853) + t * T(0.010328))) /
            (T(1) + t * (T(1.432788) + t * (T(0.189269) + t * T(0.001308)))) -
        t;
  for (int i = 0; i < 8; ++i) {
    const T l = log_ndtr(y);
    // d/dy log ndtr(y) = pdf(y) / ndtr(y)
    const T d = exp(T(-0.5) * y * y - l) * T(kInvSqrt2Pi);
    const T step = (l - lq) / d;
    y -= step;
    if (!(fabs(step) > std::numeric_limits<T>::epsilon() * fabs(y))) break;
  }
  return upper ? -y : y;
}

// The modified Bessel functions of the first kind I0 and I1 (nu = 0, 1), times e^-|x| when scaled:
// up to |x| = 30 the power series (x/2)^nu sum (x^2/4)^k / (k! (k + nu)!), whose terms are all positive;
// beyond, the asymptotic series e^|x| / sqrt(2 pi |x|) sum_k prod_j ((2j-1)^2 - 4 nu^2) / (8 j |x|), whose
// smallest term is below e^-60. I0 is even, I1 odd.
template <typename T> KILN_HD T bessel_i(int nu, T x, bool scaled) {
  if (x != x) return x;
  const T ax = fabs(x);
  constexpr T kEps = std::numeric_limits<T>::epsilon() / 4;
  T r;
  if (ax <= T(30)) {
    const T q = T(0.25) * ax * ax;
    T term = nu ? T(0.5) * ax : T(1), sum = term;
    for (int k = 1; k < 200 && term > kEps * sum; ++k) {
      term *= q / (T(k) * T(k + nu));
      sum += term;
    }
    r = scaled ? sum * exp(-ax) : sum;
  } else {
    const T mu = T(4 * nu * nu);
    T term = T(1), sum = T(1);
    for (int k = 1; k < 60; ++k) {
      term *= (T((2 * k - 1) * (2 * k - 1)) - mu) / (T(8 * k) * ax);
      sum += term;
      if (fabs(term) < kEps * fabs(sum)) break;
    }
    r = sum / (sqrt(ax) * sqrt(T(2 * kPi)));  // not sqrt(2 pi ax): 2 pi ax overflows near the type's top
    if (!scaled) r *= exp(ax);
  }
  return nu && x < T(0) ? -r : r;
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
