// CPU elementwise kernels: copy/cast, fill, arange, unary, binary and where over strided views.
// Each op is a scalar functor on Acc<T>; contiguous rows get a plain loop the compiler vectorises.
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "kernels/common/int_arith.h"
#include "kernels/common/int_pow.h"
#include "kernels/common/math.h"
#include "kernels/cpu/kernel_sets.h"
#include "kernels/cpu/loops.h"
#include "kernels/cpu/ops_cpu.h"

namespace kiln::cpu {
namespace {

template <typename T> constexpr bool is_float_v =
    std::is_floating_point_v<T> || std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;

template <typename TO, typename TI> void copy_typed(const TensorDesc& dst, const TensorDesc& src) {
  auto L = make_loop<2>({&dst, &src});
  run_rows(L, [](std::array<char*, 2> p, std::array<int64_t, 2> s, int64_t n) {
    TO* o = reinterpret_cast<TO*>(p[0]);
    const TI* in = reinterpret_cast<const TI*>(p[1]);
    // f16/bf16 <-> f32 rows: the kernel set's block conversions (loops.h).
    if constexpr (is_f16_or_bf16_v<TO> && std::is_same_v<TI, float>) {
      if (s[0] == 1 && s[1] == 1) return store_block_f32(in, o, 1, n);
    }
    if constexpr (std::is_same_v<TO, float> && is_f16_or_bf16_v<TI>) {
      if (s[0] == 1 && s[1] == 1) return load_block_f32(in, 1, o, n);
    }
    if constexpr (std::is_same_v<TO, TI>) {
      if (s[0] == 1 && s[1] == 1) {
        std::memcpy(o, in, size_t(n) * sizeof(TO));
        return;
      }
      for (int64_t i = 0; i < n; ++i) o[i * s[0]] = in[i * s[1]];
    } else if constexpr (std::is_same_v<TO, bool>) {
      for (int64_t i = 0; i < n; ++i) o[i * s[0]] = load(in + i * s[1]) != Acc<TI>(0);
    } else {
      for (int64_t i = 0; i < n; ++i) store(o + i * s[0], load(in + i * s[1]));
    }
  });
}

// A kernel set's vector leaf for an op's f32 rows (kernels/cpu/isa/rows.inc, loops.inc), used on contiguous
// f32 rows and 16-bit blocks where the op has one; the functor f elsewhere (the same bits for add, sub, mul,
// div and the ReLUs, GELU's to a few ulp).
using UnaryRow = void (*)(int64_t n, const float* x, float* y);
using BinaryRow = void (*)(int64_t n, const float* a, const float* b, float* o);

template <typename T, typename F>
void unary_loop(const TensorDesc& dst, const TensorDesc& src, F f, UnaryRow row = nullptr) {
  auto L = make_loop<2>({&dst, &src});
  run_rows(L, [&](std::array<char*, 2> p, std::array<int64_t, 2> s, int64_t n) {
    T* o = reinterpret_cast<T*>(p[0]);
    const T* a = reinterpret_cast<const T*>(p[1]);
    if constexpr (is_f16_or_bf16_v<T>) {
      float buf[kStageBlock];
      for (int64_t i0 = 0; i0 < n; i0 += kStageBlock) {
        const int64_t m = std::min(kStageBlock, n - i0);
        load_block_f32(a + i0 * s[1], s[1], buf, m);
        if (row) {
          row(m, buf, buf);
        } else {
          for (int64_t j = 0; j < m; ++j) buf[j] = f(buf[j]);
        }
        store_block_f32(buf, o + i0 * s[0], s[0], m);
      }
      return;
    }
    if constexpr (std::is_same_v<T, float>) {
      if (row && s[0] == 1 && s[1] == 1) return row(n, a, o);
    }
    if (s[0] == 1 && s[1] == 1) {
      for (int64_t i = 0; i < n; ++i) store(o + i, f(load(a + i)));
    } else {
      for (int64_t i = 0; i < n; ++i) store(o + i * s[0], f(load(a + i * s[1])));
    }
  });
}

template <typename TO, typename T, typename F>
void binary_loop(const TensorDesc& dst, const TensorDesc& a, const TensorDesc& b, F f, BinaryRow row = nullptr) {
  auto L = make_loop<3>({&dst, &a, &b});
  run_rows(L, [&](std::array<char*, 3> p, std::array<int64_t, 3> s, int64_t n) {
    TO* o = reinterpret_cast<TO*>(p[0]);
    const T* x = reinterpret_cast<const T*>(p[1]);
    const T* y = reinterpret_cast<const T*>(p[2]);
    if constexpr (is_f16_or_bf16_v<T>) {
      float xa[kStageBlock], ya[kStageBlock];
      for (int64_t i0 = 0; i0 < n; i0 += kStageBlock) {
        const int64_t m = std::min(kStageBlock, n - i0);
        load_block_f32(x + i0 * s[1], s[1], xa, m);
        load_block_f32(y + i0 * s[2], s[2], ya, m);
        if constexpr (std::is_same_v<TO, T>) {
          if (row) {
            row(m, xa, ya, xa);
          } else {
            for (int64_t j = 0; j < m; ++j) xa[j] = f(xa[j], ya[j]);
          }
          store_block_f32(xa, o + i0 * s[0], s[0], m);
        } else {
          for (int64_t j = 0; j < m; ++j) store(o + (i0 + j) * s[0], f(xa[j], ya[j]));
        }
      }
      return;
    }
    if constexpr (std::is_same_v<T, float> && std::is_same_v<TO, float>) {
      if (row && s[0] == 1 && s[1] == 1 && s[2] == 1) return row(n, x, y, o);
    }
    if (s[0] == 1 && s[1] == 1 && s[2] == 1) {
      for (int64_t i = 0; i < n; ++i) store(o + i, f(load(x + i), load(y + i)));
    } else if (s[0] == 1 && s[1] == 1 && s[2] == 0) {
      const auto yv = load(y);
      for (int64_t i = 0; i < n; ++i) store(o + i, f(load(x + i), yv));
    } else if (s[0] == 1 && s[1] == 0 && s[2] == 1) {
      const auto xv = load(x);
      for (int64_t i = 0; i < n; ++i) store(o + i, f(xv, load(y + i)));
    } else {
      for (int64_t i = 0; i < n; ++i) store(o + i * s[0], f(load(x + i * s[1]), load(y + i * s[2])));
    }
  });
}

template <typename T> void unary_typed(UnaryOp op, const TensorDesc& dst, const TensorDesc& src, double p0, double p1) {
  using A = Acc<T>;
  if constexpr (is_float_v<T>) {
    switch (op) {
      case UnaryOp::exp: return unary_loop<T>(dst, src, [](A x) { return std::exp(x); });
      case UnaryOp::log: return unary_loop<T>(dst, src, [](A x) { return std::log(x); });
      case UnaryOp::sqrt: return unary_loop<T>(dst, src, [](A x) { return std::sqrt(x); });
      case UnaryOp::rsqrt: return unary_loop<T>(dst, src, [](A x) { return A(1) / std::sqrt(x); });
      case UnaryOp::tanh: return unary_loop<T>(dst, src, [](A x) { return std::tanh(x); });
      case UnaryOp::sigmoid: return unary_loop<T>(dst, src, [](A x) { return math::sigmoid(x); });
      case UnaryOp::gelu_erf:
        return unary_loop<T>(
            dst, src, [](A x) { return math::gelu_erf(x); }, kernel_set().rows.gelu_erf);
      case UnaryOp::gelu_tanh: return unary_loop<T>(dst, src, [](A x) { return math::gelu_tanh(x); });
      case UnaryOp::pow_scalar: {
        const A e = A(p0);
        if (p0 == 2.0) return unary_loop<T>(dst, src, [](A x) { return x * x; });
        return unary_loop<T>(dst, src, [e](A x) { return std::pow(x, e); });
      }
      default: break;
    }
    const A a0 = A(p0), a1 = A(p1);
    const auto F = [&](auto f) { unary_loop<T>(dst, src, f); };
    switch (op) {
      case UnaryOp::sin: return F([](A x) { return std::sin(x); });
      case UnaryOp::cos: return F([](A x) { return std::cos(x); });
      case UnaryOp::tan: return F([](A x) { return std::tan(x); });
      case UnaryOp::asin: return F([](A x) { return std::asin(x); });
      case UnaryOp::acos: return F([](A x) { return std::acos(x); });
      case UnaryOp::atan: return F([](A x) { return std::atan(x); });
      case UnaryOp::sinh: return F([](A x) { return std::sinh(x); });
      case UnaryOp::cosh: return F([](A x) { return std::cosh(x); });
      case UnaryOp::asinh: return F([](A x) { return std::asinh(x); });
      case UnaryOp::acosh: return F([](A x) { return std::acosh(x); });
      case UnaryOp::atanh: return F([](A x) { return std::atanh(x); });
      case UnaryOp::erf: return F([](A x) { return std::erf(x); });
      case UnaryOp::erfc: return F([](A x) { return std::erfc(x); });
      case UnaryOp::erfinv: return F([](A x) { return math::erfinv(x); });
      case UnaryOp::log1p: return F([](A x) { return std::log1p(x); });
      case UnaryOp::lgamma: return F([](A x) { return std::lgamma(x); });
      case UnaryOp::digamma: return F([](A x) { return math::digamma(x); });
      case UnaryOp::polygamma: {
        const int n = int(p0);
        return F([n](A x) { return math::polygamma(n, x); });
      }
      case UnaryOp::i0: return F([](A x) { return math::bessel_i(0, x, false); });
      case UnaryOp::i0e: return F([](A x) { return math::bessel_i(0, x, true); });
      case UnaryOp::i1: return F([](A x) { return math::bessel_i(1, x, false); });
      case UnaryOp::i1e: return F([](A x) { return math::bessel_i(1, x, true); });
      case UnaryOp::ndtri: return F([](A x) { return math::ndtri(x); });
      case UnaryOp::log_ndtr: return F([](A x) { return math::log_ndtr(x); });
      case UnaryOp::erfcx: return F([](A x) { return math::erfcx(x); });
      case UnaryOp::expm1: return F([](A x) { return std::expm1(x); });
      case UnaryOp::log2: return F([](A x) { return std::log2(x); });
      case UnaryOp::log10: return F([](A x) { return std::log10(x); });
      case UnaryOp::exp2: return F([](A x) { return std::exp2(x); });
      case UnaryOp::reciprocal: return F([](A x) { return A(1) / x; });
      case UnaryOp::floor: return F([](A x) { return std::floor(x); });
      case UnaryOp::ceil: return F([](A x) { return std::ceil(x); });
      case UnaryOp::round: return F([](A x) { return std::nearbyint(x); });
      case UnaryOp::trunc: return F([](A x) { return std::trunc(x); });
      case UnaryOp::frac: return F([](A x) { return math::frac(x); });
      case UnaryOp::silu: return F([](A x) { return math::silu(x); });
      case UnaryOp::mish: return F([](A x) { return math::mish(x); });
      case UnaryOp::softsign: return F([](A x) { return math::softsign(x); });
      case UnaryOp::logsigmoid: return F([](A x) { return math::logsigmoid(x); });
      case UnaryOp::hardsigmoid: return F([](A x) { return math::hardsigmoid(x); });
      case UnaryOp::hardswish: return F([](A x) { return math::hardswish(x); });
      case UnaryOp::softplus: return F([a0, a1](A x) { return math::softplus(x, a0, a1); });
      case UnaryOp::leaky_relu: return F([a0](A x) { return math::leaky_relu(x, a0); });
      case UnaryOp::elu: return F([a0, a1](A x) { return math::elu(x, a0, a1); });
      case UnaryOp::celu: return F([a0](A x) { return math::celu(x, a0); });
      default: break;
    }
  }
  switch (op) {
    // Integers wrap (math::wrap_neg): neg and abs of INT_MIN give INT_MIN, as PyTorch's.
    case UnaryOp::neg: return unary_loop<T>(dst, src, [](A x) { return math::wrap_neg(x); });
    // 0 - x, not -x, at zero: abs(-0.0) is +0.0 (as fabs and PyTorch), so 1 / abs(-0.0) is +inf.
    case UnaryOp::abs: return unary_loop<T>(dst, src, [](A x) { return x <= A(0) ? math::wrap_sub(A(0), x) : x; });
    case UnaryOp::sign: return unary_loop<T>(dst, src, [](A x) { return A((A(0) < x) - (x < A(0))); });
    case UnaryOp::relu:
      return unary_loop<T>(
          dst, src, [](A x) { return x <= A(0) ? A(0) : x; }, kernel_set().rows.relu);
    case UnaryOp::logical_not: return unary_loop<T>(dst, src, [](A x) { return A(!x); });
    case UnaryOp::bitwise_not:
      if constexpr (std::is_same_v<T, bool>) {
        return unary_loop<T>(dst, src, [](A x) { return A(!x); });
      } else if constexpr (!is_float_v<T>) {
        return unary_loop<T>(dst, src, [](A x) { return A(~x); });
      }
      break;
    case UnaryOp::clamp: {
      // Both bounds given: an absent one is an infinity, which clamp_bound saturates for integers. A NaN
      // bound makes every element NaN, as PyTorch's (the engine refuses one for integers).
      const A lo = math::clamp_bound<A>(p0, true), hi = math::clamp_bound<A>(p1, false);
      return unary_loop<T>(dst, src, [=](A x) {
        if constexpr (is_float_v<T>) {
          if (x != x) return x;  // NaN stays NaN
          if (lo != lo) return lo;
          if (hi != hi) return hi;
        }
        if (x < lo) x = lo;
        if (x > hi) x = hi;
        return x;
      });
    }
    default: break;
  }
  KILN_FAIL("unary op ", int(op), " is not defined for dtype ", dtype_name(src.dtype));
}

template <typename T>
void binary_typed(BinaryOp op, const TensorDesc& dst, const TensorDesc& a, const TensorDesc& b, double alpha) {
  using A = Acc<T>;
  const isa::RowLeaves& rows = kernel_set().rows;  // used on f32 rows and 16-bit blocks only
  switch (op) {
    case BinaryOp::eq: return binary_loop<bool, T>(dst, a, b, [](A x, A y) { return x == y; });
    case BinaryOp::ne: return binary_loop<bool, T>(dst, a, b, [](A x, A y) { return x != y; });
    case BinaryOp::lt: return binary_loop<bool, T>(dst, a, b, [](A x, A y) { return x < y; });
    case BinaryOp::le: return binary_loop<bool, T>(dst, a, b, [](A x, A y) { return x <= y; });
    case BinaryOp::gt: return binary_loop<bool, T>(dst, a, b, [](A x, A y) { return x > y; });
    case BinaryOp::ge: return binary_loop<bool, T>(dst, a, b, [](A x, A y) { return x >= y; });
    case BinaryOp::logical_and: return binary_loop<bool, T>(dst, a, b, [](A x, A y) { return x != A(0) && y != A(0); });
    case BinaryOp::logical_or: return binary_loop<bool, T>(dst, a, b, [](A x, A y) { return x != A(0) || y != A(0); });
    default: break;
  }
  KILN_ASSERT(dst.dtype == a.dtype, "binary op output dtype ", dst.dtype, " differs from input ", a.dtype);
  if constexpr (std::is_same_v<T, bool>) {
    // bool arithmetic: + is or, * is and; other ops make no sense on bool. add is x + alpha * y with
    // alpha a bool too (the Python layer takes False or 0): alpha False gives x, as PyTorch's.
    switch (op) {
      case BinaryOp::add: return binary_loop<T, T>(dst, a, b, [al = alpha != 0.0](A x, A y) { return x || (al && y); });
      case BinaryOp::mul: return binary_loop<T, T>(dst, a, b, [](A x, A y) { return x && y; });
      case BinaryOp::maximum: return binary_loop<T, T>(dst, a, b, [](A x, A y) { return x || y; });
      case BinaryOp::minimum: return binary_loop<T, T>(dst, a, b, [](A x, A y) { return x && y; });
      case BinaryOp::bitwise_and: return binary_loop<T, T>(dst, a, b, [](A x, A y) { return x && y; });
      case BinaryOp::bitwise_or: return binary_loop<T, T>(dst, a, b, [](A x, A y) { return x || y; });
      case BinaryOp::bitwise_xor: return binary_loop<T, T>(dst, a, b, [](A x, A y) { return x != y; });
      default: KILN_FAIL("binary op ", int(op), " is not defined for bool tensors");
    }
  } else {
    if constexpr (!is_float_v<T>) {
      // Integers wrap at the dtype's width, two's complement, as PyTorch's (kernels/common/int_arith.h):
      // signed overflow would be undefined behaviour.
      switch (op) {
        case BinaryOp::add:
          if (alpha == 1.0) return binary_loop<T, T>(dst, a, b, [](A x, A y) { return math::wrap_add(x, y); });
          return binary_loop<T, T>(
              dst, a, b, [al = convert_to<A>(alpha)](A x, A y) { return math::wrap_add(x, math::wrap_mul(al, y)); });
        case BinaryOp::sub:
          if (alpha == 1.0) return binary_loop<T, T>(dst, a, b, [](A x, A y) { return math::wrap_sub(x, y); });
          return binary_loop<T, T>(
              dst, a, b, [al = convert_to<A>(alpha)](A x, A y) { return math::wrap_sub(x, math::wrap_mul(al, y)); });
        case BinaryOp::mul: return binary_loop<T, T>(dst, a, b, [](A x, A y) { return math::wrap_mul(x, y); });
        case BinaryOp::bitwise_and: return binary_loop<T, T>(dst, a, b, [](A x, A y) { return A(x & y); });
        case BinaryOp::bitwise_or: return binary_loop<T, T>(dst, a, b, [](A x, A y) { return A(x | y); });
        case BinaryOp::bitwise_xor: return binary_loop<T, T>(dst, a, b, [](A x, A y) { return A(x ^ y); });
        case BinaryOp::shift_left: return binary_loop<T, T>(dst, a, b, [](A x, A y) { return math::shift_left(x, y); });
        case BinaryOp::shift_right:
          return binary_loop<T, T>(dst, a, b, [](A x, A y) { return math::shift_right(x, y); });
        default: break;
      }
    }
    switch (op) {
      case BinaryOp::add:
        if (alpha == 1.0)
          return binary_loop<T, T>(
              dst, a, b, [](A x, A y) { return A(x + y); }, rows.add);
        return binary_loop<T, T>(dst, a, b, [al = convert_to<A>(alpha)](A x, A y) { return A(x + al * y); });
      case BinaryOp::sub:
        if (alpha == 1.0)
          return binary_loop<T, T>(
              dst, a, b, [](A x, A y) { return A(x - y); }, rows.sub);
        return binary_loop<T, T>(dst, a, b, [al = convert_to<A>(alpha)](A x, A y) { return A(x - al * y); });
      case BinaryOp::mul:
        return binary_loop<T, T>(
            dst, a, b, [](A x, A y) { return A(x * y); }, rows.mul);
      case BinaryOp::div:
        if constexpr (is_float_v<T>) {
          return binary_loop<T, T>(
              dst, a, b, [](A x, A y) { return x / y; }, rows.div);
        } else {
          // Integer division truncates toward zero (INT_MIN / -1 wraps to INT_MIN, never the trap of x86's
          // idiv); division by zero is an error, never UB.
          return binary_loop<T, T>(dst, a, b, [](A x, A y) {
            KILN_CHECK(y != A(0), "div: integer division by zero");
            return math::trunc_div(x, y);
          });
        }
      case BinaryOp::fmod:
      case BinaryOp::remainder:
        if constexpr (!is_float_v<T>) {
          return binary_loop<T, T>(dst, a, b, [op](A x, A y) {
            KILN_CHECK(y != A(0), op == BinaryOp::fmod ? "fmod" : "remainder", ": integer division by zero");
            return op == BinaryOp::fmod ? math::fmod_of(x, y) : math::remainder_of(x, y);
          });
        } else {
          if (op == BinaryOp::fmod) return binary_loop<T, T>(dst, a, b, [](A x, A y) { return math::fmod_of(x, y); });
          return binary_loop<T, T>(dst, a, b, [](A x, A y) { return math::remainder_of(x, y); });
        }
      case BinaryOp::maximum:
        return binary_loop<T, T>(dst, a, b, [](A x, A y) {
          if constexpr (is_float_v<T>) {
            if (x != x || y != y) return std::numeric_limits<A>::quiet_NaN();
          }
          return x > y ? x : y;
        });
      case BinaryOp::minimum:
        return binary_loop<T, T>(dst, a, b, [](A x, A y) {
          if constexpr (is_float_v<T>) {
            if (x != x || y != y) return std::numeric_limits<A>::quiet_NaN();
          }
          return x < y ? x : y;
        });
      default: break;
    }
    if constexpr (is_float_v<T>) {
      switch (op) {
        case BinaryOp::pow: return binary_loop<T, T>(dst, a, b, [](A x, A y) { return std::pow(x, y); });
        case BinaryOp::atan2: return binary_loop<T, T>(dst, a, b, [](A x, A y) { return std::atan2(x, y); });
        case BinaryOp::relu_backward:
          return binary_loop<T, T>(
              dst, a, b, [](A g, A y) { return y <= A(0) ? A(0) : g; }, rows.relu_mask);
        case BinaryOp::gelu_erf_backward:
          return binary_loop<T, T>(
              dst, a, b, [](A g, A x) { return g * math::gelu_erf_grad(x); }, kernel_set().rows.gelu_erf_backward);
        case BinaryOp::gelu_tanh_backward:
          return binary_loop<T, T>(dst, a, b, [](A g, A x) { return g * math::gelu_tanh_grad(x); });
        case BinaryOp::sigmoid_backward:
          return binary_loop<T, T>(dst, a, b, [](A g, A y) { return g * y * (A(1) - y); });
        case BinaryOp::tanh_backward: return binary_loop<T, T>(dst, a, b, [](A g, A y) { return g * (A(1) - y * y); });
        default: break;
      }
    } else if (op == BinaryOp::pow) {
      return binary_loop<T, T>(dst, a, b, [](A x, A y) { return math::int_pow(x, y); });
    }
  }
  KILN_FAIL("binary op ", int(op), " is not defined for dtype ", dtype_name(a.dtype));
}

// A 16-bit tensor with a one-element f32 operand (a number: engine/ops_elementwise.cpp's scalar ops): the op runs
// in f32 with the number's f32 value and rounds once, as PyTorch's wrapped numbers; rounding the number to 16
// bits first biases every product (bf16 0.1 is 0.10009765625).
template <typename T> void binary_scalar_typed(BinaryOp op, const TensorDesc& dst, const TensorDesc& t, float s,
                                               bool scalar_first, double alpha) {
  const float al = float(alpha);
  const auto run = [&](auto f) {
    if (scalar_first) return unary_loop<T>(dst, t, [=](float x) { return f(s, x); });
    unary_loop<T>(dst, t, [=](float x) { return f(x, s); });
  };
  switch (op) {
    case BinaryOp::add: return run([al](float x, float y) { return x + al * y; });
    case BinaryOp::sub: return run([al](float x, float y) { return x - al * y; });
    case BinaryOp::mul: return run([](float x, float y) { return x * y; });
    case BinaryOp::div: return run([](float x, float y) { return x / y; });
    default: KILN_FAIL("binary op ", int(op), " does not take an f32 number next to ", dtype_name(t.dtype));
  }
}

template <typename T> void where_typed(const TensorDesc& dst, const TensorDesc& c, const TensorDesc& a, const TensorDesc& b) {
  auto L = make_loop<4>({&dst, &c, &a, &b});
  run_rows(L, [](std::array<char*, 4> p, std::array<int64_t, 4> s, int64_t n) {
    T* o = reinterpret_cast<T*>(p[0]);
    const bool* cc = reinterpret_cast<const bool*>(p[1]);
    const T* x = reinterpret_cast<const T*>(p[2]);
    const T* y = reinterpret_cast<const T*>(p[3]);
    for (int64_t i = 0; i < n; ++i) o[i * s[0]] = cc[i * s[1]] ? x[i * s[2]] : y[i * s[3]];
  });
}

}  // namespace

void copy(const TensorDesc& dst, const TensorDesc& src) {
  visit_dtype(dst.dtype, [&](auto to) {
    visit_dtype(src.dtype, [&](auto ti) { copy_typed<decltype(to), decltype(ti)>(dst, src); });
  });
}

void fill(const TensorDesc& dst, double value) {
  visit_dtype(dst.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T v = value_as<T>(value);
    auto L = make_loop<1>({&dst});
    run_rows(L, [v](std::array<char*, 1> p, std::array<int64_t, 1> s, int64_t n) {
      T* o = reinterpret_cast<T*>(p[0]);
      for (int64_t i = 0; i < n; ++i) o[i * s[0]] = v;
    });
  });
}

void arange(const TensorDesc& dst, double start, double step) {
  KILN_ASSERT(dst.ndim == 1, "arange writes a 1-D tensor");
  visit_dtype(dst.dtype, [&](auto tag) {
    using T = decltype(tag);
    T* o = static_cast<T*>(dst.data);
    for (int64_t i = 0; i < dst.shape[0]; ++i) store(o + i * dst.strides[0], start + double(i) * step);
  });
}

void unary(UnaryOp op, const TensorDesc& dst, const TensorDesc& src, double p0, double p1) {
  visit_dtype(src.dtype, [&](auto tag) { unary_typed<decltype(tag)>(op, dst, src, p0, p1); });
}

void binary(BinaryOp op, const TensorDesc& dst, const TensorDesc& a, const TensorDesc& b, double alpha) {
  if (a.dtype != b.dtype && b.dtype == DType::f64 && op == BinaryOp::mul) {
    // An f32 or 16-bit tensor times a one-element f64 number (clip_grad_norm's
    // factor, engine/optim.cpp): the product in f64, rounded to f32, then (16-bit) to a's dtype. Where the
    // product's magnitude is FLT_MIN or more, for every dtype, that is one rounding (f32's 24 bits are at least
    // 2p + 2 for a 16-bit dtype's p, so rounding twice is rounding once), so a number that a's dtype holds gives that
    // dtype's own product bit for bit; below FLT_MIN the f32 step is a subnormal with fewer bits, and a 16-bit result
    // may then differ from one rounding in its last bit. Such a product is not flushed as an f32 one is under DAZ, so
    // the scaled values neither vanish nor take a second pass.
    KILN_ASSERT(is_floating(a.dtype) && a.dtype != DType::f64 && dst.dtype == a.dtype && b.ndim == 0,
                "binary op mul: operands ", a.dtype, " and ", b.dtype, " (output ", dst.dtype, ") do not pair");
    const double v = *static_cast<const double*>(b.data);
    const auto run = [&](auto tag) {
      using T = decltype(tag);
      unary_loop<T>(dst, a, [v](float x) { return convert_to<float>(double(x) * v); });
    };
    if (a.dtype == DType::f32) return run(float{});
    if (a.dtype == DType::f16) return run(Half{});
    return run(BFloat16{});
  }
  if (a.dtype != b.dtype) {
    // The other mixed pair: a 16-bit tensor and a one-element f32 number (binary_scalar_typed).
    const bool first = a.dtype == DType::f32;
    const TensorDesc& t = first ? b : a;
    const TensorDesc& s = first ? a : b;
    KILN_ASSERT(is_low_precision(t.dtype) && s.dtype == DType::f32 && dst.dtype == t.dtype && s.ndim == 0,
                "binary op operands ", a.dtype, " and ", b.dtype, " (output ", dst.dtype, ") do not pair");
    const float v = *static_cast<const float*>(s.data);
    if (t.dtype == DType::f16) return binary_scalar_typed<Half>(op, dst, t, v, first, alpha);
    return binary_scalar_typed<BFloat16>(op, dst, t, v, first, alpha);
  }
  visit_dtype(a.dtype, [&](auto tag) { binary_typed<decltype(tag)>(op, dst, a, b, alpha); });
}

void where(const TensorDesc& dst, const TensorDesc& cond, const TensorDesc& a, const TensorDesc& b) {
  visit_dtype(dst.dtype, [&](auto tag) { where_typed<decltype(tag)>(dst, cond, a, b); });
}

}  // namespace kiln::cpu
