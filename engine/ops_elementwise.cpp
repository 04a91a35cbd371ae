// Elementwise ops: broadcasting, dtype promotion, the kernel call and the backward of each op,
// one op per block.
#include <cmath>
#include <limits>

#include "engine/autograd.h"
#include "engine/internal.h"
#include "engine/nn_ops.h"
#include "engine/ops.h"

namespace kiln {

using detail::backend;
using detail::desc;
using detail::desc_broadcast;

Shape broadcast_shapes(const Shape& a, const Shape& b) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    KILN_CHECK(da >= 0 && db >= 0, "shapes ", a, " and ", b, " do not broadcast: negative size");
    KILN_CHECK(da == db || da == 1 || db == 1, "shapes ", a, " and ", b, " do not broadcast (dim ", i, ": ", da,
               " vs ", db, ")");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

namespace {

// An elementwise output keeps channels_last when an input of the output's shape has it.
MemoryFormat layout_of(const Shape& shape, std::initializer_list<const Tensor*> inputs) {
  if (shape.size() != 4) return MemoryFormat::contiguous;
  for (const Tensor* t : inputs)
    if (t->defined() && t->shape() == shape && t->is_channels_last()) return MemoryFormat::channels_last;
  return MemoryFormat::contiguous;
}

// A cast that autograd does not see (for kernel inputs; the op records its own backward).
Tensor raw_cast(const Tensor& t, DType dt) {
  if (t.dtype() == dt) return t;
  Tensor out = make_tensor(t.shape(), dt, t.device(), layout_of(t.shape(), {&t}));
  backend(t.device()).copy(desc(out), desc(t));
  return out;
}

Tensor run_binary(const char* name, BinaryOp op, const Tensor& a, const Tensor& b, DType compute, DType out_dtype,
                  double alpha = 1.0) {
  const Device dev = detail::common_device(name, {a, b});
  Shape shape;
  try {
    shape = broadcast_shapes(a.shape(), b.shape());
  } catch (const Error& e) {
    KILN_FAIL(name, ": ", e.message());
  }
  Tensor out = make_tensor(shape, out_dtype, dev, layout_of(shape, {&a, &b}));
  // A 0-dim f32 operand (a number: scalar_operand) of a 16-bit add, sub, mul or div stays f32: the kernels
  // compute 16-bit in f32 and take it as it is, rounding only the result (PyTorch's wrapped numbers).
  const bool arith = op == BinaryOp::add || op == BinaryOp::sub || op == BinaryOp::mul || op == BinaryOp::div;
  if (arith && is_low_precision(compute) && out_dtype == compute && a.dim() + b.dim() > 0) {
    const auto number = [](const Tensor& t) { return t.dim() == 0 && t.dtype() == DType::f32; };
    if (number(a) && b.dim() > 0) {
      backend(dev).binary(op, desc(out), desc(a), desc_broadcast(raw_cast(b, compute), shape), alpha);
      return out;
    }
    if (number(b) && a.dim() > 0) {
      backend(dev).binary(op, desc(out), desc_broadcast(raw_cast(a, compute), shape), desc(b), alpha);
      return out;
    }
  }
  const Tensor a2 = raw_cast(a, compute), b2 = raw_cast(b, compute);
  backend(dev).binary(op, desc(out), desc_broadcast(a2, shape), desc_broadcast(b2, shape), alpha);
  return out;
}

Tensor run_unary(UnaryOp op, const Tensor& a, DType dt, double p0 = 0, double p1 = 0) {
  const Tensor a2 = raw_cast(a, dt);
  Tensor out = make_tensor(a.shape(), dt, a.device(), layout_of(a.shape(), {&a}));
  backend(a.device()).unary(op, desc(out), desc(a2), p0, p1);
  return out;
}

// Float ops on integer inputs compute in f32, as in common array libraries.
DType float_type(DType t) { return is_floating(t) ? t : DType::f32; }

DType arith_type(const char*, const Tensor& a, const Tensor& b) { return result_type(a, b); }

// The values of an integer dtype, as doubles (i64's upper bound rounds to 2^63).
std::pair<double, double> integer_range(DType t) {
  switch (t) {
    case DType::u8: return {0.0, 255.0};
    case DType::i8: return {-128.0, 127.0};
    case DType::i16: return {-32768.0, 32767.0};
    case DType::i32: return {-2147483648.0, 2147483647.0};
    default: return {-9223372036854775808.0, 9223372036854775808.0};
  }
}

// A whole double as an integer of dtype t, wrapped modulo 2^bits as a Python int beside the tensor is
// (i32 x + 4294967301.0 adds 5). fmod and the one shift are exact at any magnitude; the element
// conversion (convert_to) would send everything outside int32 to INT32_MIN first.
double wrap_integral(double s, DType t) {
  const double lo = integer_range(t).first;
  const double span = t == DType::u8 ? 256.0 : -2.0 * lo;  // 2^bits
  double r = std::fmod(s, span);                           // in (-span, span)
  if (r < lo) r += span;
  if (r >= lo + span) r -= span;
  return r;
}

void check_not_bool(const char* name, DType t) {
  KILN_CHECK(t != DType::boolean, name, ": not defined for bool tensors");
}

}  // namespace

// ---- binary arithmetic ------------------------------------------------------------------------------

bool alpha_fits(DType t, double alpha, bool subtracts) {
  if (is_floating(t) || t == DType::boolean || alpha == 1.0) return true;
  const int bits = int(dtype_size(t)) * 8;
  const double lo = t == DType::u8 ? -255.0 : -std::ldexp(1.0, bits - 1);
  const double hi = t == DType::u8 ? 256.0 : std::ldexp(1.0, bits - 1);  // exclusive
  const double v = subtracts && alpha != -0x1p63 ? -alpha : alpha;       // PyTorch negates in int64: -2**63 stays
  return std::isfinite(v) && v == std::floor(v) && v >= lo && v < hi;
}

namespace detail {
// PyTorch refuses an alpha alpha_fits() refuses too, so the kernels never convert an out-of-range double.
void check_alpha(const char* op, DType t, double alpha, bool subtracts) {
  KILN_CHECK(alpha_fits(t, alpha, subtracts), op, ": alpha ", alpha, subtracts ? ", negated," : "",
             " is not a value of ", t, t == DType::u8 ? " (-255 to 255, as PyTorch's)" : "");
}

double alpha_in(DType t, double alpha) {
  return is_floating(t) || t == DType::boolean ? alpha : wrap_integral(alpha, t);
}

Tensor with_zero_edge(const Tensor& r, const Tensor& x) {
  if (!autograd::needs_grad({x})) return r;
  const Shape shape = x.shape();
  const TensorOptions opts(x.dtype(), x.device());
  Tensor out = r.detach();
  autograd::record("zero_edge", {r, x}, {out}, [shape, opts](const GradCtx& c) -> std::vector<Tensor> {
    return {c.g(), c.needs_grad(1) ? zeros(shape, opts) : Tensor()};
  });
  return out;
}
}  // namespace detail

using detail::check_alpha;

Tensor add(const Tensor& a, const Tensor& b, double alpha) {
  const DType t = arith_type("add", a, b);
  check_alpha("add", t, alpha);
  Tensor out = run_binary("add", BinaryOp::add, a, b, t, t, alpha);
  if (autograd::needs_grad({a, b}))
    autograd::record("add", {a, b}, {out}, [alpha](const GradCtx& c) -> std::vector<Tensor> {
      return {c.g(), alpha == 1.0 ? c.g() : c.g() * alpha};
    });
  return out;
}

Tensor sub(const Tensor& a, const Tensor& b, double alpha) {
  // Either operand bool is refused, as PyTorch's (bool - 1 and 1.5 - bool too, whose result type is not bool),
  // with its reason: a mask is inverted with ~, and two masks differ by ^.
  const bool ba = a.dtype() == DType::boolean, bb = b.dtype() == DType::boolean;
  KILN_CHECK(!(ba && bb), "sub: subtraction of two bool tensors (", a.type_str(), ", ", b.type_str(),
             ") is not supported, as in PyTorch; use ^ or logical_xor() instead");
  KILN_CHECK(!ba && !bb, "sub: subtraction with a bool tensor (", (ba ? a : b).type_str(),
             ") is not supported, as in PyTorch; to invert a mask use ~ or logical_not() instead");
  const DType t = arith_type("sub", a, b);
  check_alpha("sub", t, alpha, true);
  Tensor out = run_binary("sub", BinaryOp::sub, a, b, t, t, alpha);
  if (autograd::needs_grad({a, b}))
    autograd::record("sub", {a, b}, {out}, [alpha](const GradCtx& c) -> std::vector<Tensor> {
      return {c.g(), c.g() * -alpha};
    });
  return out;
}

Tensor mul(const Tensor& a, const Tensor& b) {
  const DType t = arith_type("mul", a, b);
  Tensor out = run_binary("mul", BinaryOp::mul, a, b, t, t);
  if (autograd::needs_grad({a, b})) {
    SavedTensor sa(a), sb(b);
    autograd::record("mul", {a, b}, {out}, [sa, sb](const GradCtx& c) -> std::vector<Tensor> {
      return {c.needs_grad(0) ? c.g() * sb.unpack("mul") : Tensor(),
              c.needs_grad(1) ? c.g() * sa.unpack("mul") : Tensor()};
    });
  }
  return out;
}

Tensor div(const Tensor& a, const Tensor& b) {
  const DType t = float_type(arith_type("div", a, b));
  Tensor out = run_binary("div", BinaryOp::div, a, b, t, t);
  if (autograd::needs_grad({a, b})) {
    SavedTensor sa(a), sb(b);
    autograd::record("div", {a, b}, {out}, [sa, sb](const GradCtx& c) -> std::vector<Tensor> {
      const Tensor b = sb.unpack("div");
      const Tensor ga = c.g() / b;
      return {ga, c.needs_grad(1) ? neg(ga * sa.unpack("div") / b) : Tensor()};
    });
  }
  return out;
}

namespace {
Tensor rounded_div(const char* name, const Tensor& a, const Tensor& b, bool floor_mode) {
  const DType t = arith_type(name, a, b);
  check_not_bool(name, t);
  Tensor q;
  {
    NoGradGuard no_grad;
    const OpScope scope(name);
    if (!is_floating(t)) {
      // In the result type throughout: a 0-dim divisor may wrap into it (int8 // 200 divides by -56), and
      // its sign must be the wrapped one.
      const Tensor at = a.to(t), bt = b.to(t);
      q = run_binary(name, BinaryOp::div, at, bt, t, t);  // truncates; refuses a divisor of 0
      if (floor_mode) {                                   // one less where the remainder's sign is not the divisor's
        const Tensor r = run_binary(name, BinaryOp::fmod, at, bt, t, t);
        const Tensor zero = scalar_tensor(0, TensorOptions(t, q.device()));
        q = sub(q, cast(logical_and(ne(r, zero), ne(lt(r, zero), lt(bt, zero))), t));
      }
    } else {
      // In the operands' type: a 16-bit quotient is rounded before it is rounded to a whole number, as
      // PyTorch's (f16 -10.41 / -0.03566 is 291.9, stored as 292, truncated to 292)
      const DType ct = t;
      const Tensor x = a.to(ct), y = b.to(ct);
      const Tensor quotient = div(x, y);
      if (!floor_mode) {
        q = trunc(quotient);
      } else {
        // PyTorch's div_floor: (x - fmod(x, y)) / y is the truncated quotient, exactly where that is
        // representable; step down where the remainder's sign is not the divisor's, then floor, and
        // round up a result more than half below its value. A zero keeps the sign of x / y; a
        // divisor of 0 gives x / y (inf or NaN).
        const Tensor zero = scalar_tensor(0, TensorOptions(ct, quotient.device()));
        const Tensor mod = fmod(x, y);
        Tensor d = div(sub(x, mod), y);
        d = sub(d, cast(logical_and(ne(mod, zero), ne(lt(y, zero), lt(mod, zero))), ct));
        Tensor fl = floor(d);
        fl = add(fl, cast(gt(sub(d, fl), scalar_tensor(0.5, TensorOptions(ct, fl.device()))), ct));
        fl = where(eq(d, zero), mul(quotient, zero), fl);  // a zero with the sign of x / y
        q = where(eq(y, zero), quotient, fl);
      }
    }
  }
  if (autograd::needs_grad({a, b})) {
    autograd::record(name, {a, b}, {q},
                     [sa = a.shape(), sb = b.shape(), ta = a.dtype(), tb = b.dtype()](const GradCtx& c) {
                       const Device dev = c.g().device();
                       return std::vector<Tensor>{c.needs_grad(0) ? zeros(sa, TensorOptions(ta, dev)) : Tensor(),
                                                  c.needs_grad(1) ? zeros(sb, TensorOptions(tb, dev)) : Tensor()};
                     });
  }
  return q;
}
}  // namespace

Tensor div_trunc(const Tensor& a, const Tensor& b) { return rounded_div("div_trunc", a, b, false); }
Tensor floor_divide(const Tensor& a, const Tensor& b) { return rounded_div("floor_divide", a, b, true); }

Tensor pow(const Tensor& a, const Tensor& b) {
  const DType t = arith_type("pow", a, b);
  check_not_bool("pow", t);
  Tensor out = run_binary("pow", BinaryOp::pow, a, b, t, t);
  if (autograd::needs_grad({a, b})) {
    SavedTensor sa(a), sb(b), so(out);
    autograd::record("pow", {a, b}, {out}, [sa, sb, so](const GradCtx& c) -> std::vector<Tensor> {
      const Tensor a = sa.unpack("pow"), b = sb.unpack("pow");
      Tensor ga, gb;
      if (c.needs_grad(0)) {
        // b * a^(b-1), 0 where b == 0 (as torch's: a^0 is constant, even at a == 0 where a^-1 is inf).
        ga = c.g() * b * pow(a, b - 1.0);
        ga = where(eq(b, scalar_like(0, b)), zeros_like(ga), ga);
      }
      if (c.needs_grad(1)) {
        // d(a^b)/db = a^b log a; where a == 0 the limit used by common libraries is 0.
        const Tensor safe = where(eq(a, scalar_like(0, a)), ones_like(a), a);
        gb = where(eq(a, scalar_like(0, a)), zeros_like(so.unpack("pow")), c.g() * so.unpack("pow") * log(safe));
      }
      return {ga, gb};
    });
  }
  return out;
}

namespace {
// fmod and remainder: the gradient is 1 for a and -round(a / b) for b, rounded as the op rounds.
Tensor modulo(const char* name, BinaryOp op, const Tensor& a, const Tensor& b) {
  const DType t = arith_type(name, a, b);
  check_not_bool(name, t);
  Tensor out = run_binary(name, op, a, b, t, t);
  if (autograd::needs_grad({a, b})) {
    SavedTensor sa(a), sb(b);
    autograd::record(name, {a, b}, {out}, [sa, sb, op, name](const GradCtx& c) -> std::vector<Tensor> {
      Tensor gb;
      if (c.needs_grad(1)) {
        // The quotient in f32 at least: a 16-bit one could round across the integer the op rounds to.
        const Tensor a = sa.unpack(name), b = sb.unpack(name);
        const DType qt = promote_types(promote_types(a.dtype(), b.dtype()), DType::f32);
        const Tensor q = div(a.to(qt), b.to(qt));
        gb = neg(c.g() * (op == BinaryOp::fmod ? trunc(q) : floor(q)).to(c.g().dtype()));
      }
      return {c.g(), gb};
    });
  }
  return out;
}
}  // namespace

Tensor fmod(const Tensor& a, const Tensor& b) { return modulo("fmod", BinaryOp::fmod, a, b); }
Tensor fmod(const Tensor& a, double b) { return fmod(a, scalar_like(b, a)); }
Tensor remainder(const Tensor& a, const Tensor& b) { return modulo("remainder", BinaryOp::remainder, a, b); }
Tensor remainder(const Tensor& a, double b) { return remainder(a, scalar_like(b, a)); }

Tensor atan2(const Tensor& a, const Tensor& b) {
  const DType t = float_type(arith_type("atan2", a, b));
  check_not_bool("atan2", arith_type("atan2", a, b));
  Tensor out = run_binary("atan2", BinaryOp::atan2, a, b, t, t);
  if (autograd::needs_grad({a, b})) {
    SavedTensor sa(a), sb(b);
    autograd::record("atan2", {a, b}, {out}, [sa, sb](const GradCtx& c) -> std::vector<Tensor> {
      // d/da = b / (a^2 + b^2), d/db = -a / (a^2 + b^2); 0 at a = b = 0 (PyTorch's), not 0/0.
      const Tensor a = sa.unpack("atan2"), b = sb.unpack("atan2");
      const Tensor r2 = a * a + b * b;
      const Tensor gr = c.g() / where(eq(r2, scalar_like(0.0, r2)), ones_like(r2), r2);
      return {c.needs_grad(0) ? gr * b : Tensor(), c.needs_grad(1) ? neg(gr * a) : Tensor()};
    });
  }
  return out;
}

Tensor pow(const Tensor& a, double e) {
  check_not_bool("pow", a.dtype());
  const DType t = (e == std::floor(e) && !is_floating(a.dtype()) && e >= 0) ? a.dtype() : float_type(a.dtype());
  Tensor out;
  if (is_floating(t)) {
    out = run_unary(UnaryOp::pow_scalar, a, t, e);
  } else {
    // The exponent becomes a 0-dim tensor of x's dtype: one outside its range is refused, as PyTorch's,
    // rather than converted (i8 x ** 257 would be x ** 1).
    // i64's upper bound is 2^63 as a double, itself outside: the range is half-open there.
    const auto [lo, hi] = integer_range(t);
    KILN_CHECK(e >= lo && (t == DType::i64 ? e < hi : e <= hi), "pow: the exponent ", e,
               " does not fit in the dtype of the base, ", a.type_str(), " (", lo, " to ",
               t == DType::i64 ? "2^63 - 1" : std::to_string(int64_t(hi)), ")");
    out = run_binary("pow", BinaryOp::pow, a, scalar_tensor(e, TensorOptions(t, a.device())), t, t);
  }
  if (autograd::needs_grad({a})) {
    SavedTensor sa(a);
    autograd::record("pow", {a}, {out}, [sa, e](const GradCtx& c) -> std::vector<Tensor> {
      if (e == 0.0) return {zeros_like(c.g())};
      return {c.g() * e * pow(sa.unpack("pow"), e - 1.0)};
    });
  }
  return out;
}

namespace {
// max/min: the gradient goes to the larger (smaller) input; ties split it in half; a NaN on either side
// (the output NaN) gives it to both, as PyTorch's (each loses it only where the other wins).
Tensor extremum(const char* name, BinaryOp op, const Tensor& a, const Tensor& b, bool is_max) {
  const DType t = arith_type(name, a, b);
  Tensor out = run_binary(name, op, a, b, t, t);
  if (autograd::needs_grad({a, b})) {
    SavedTensor sa(a), sb(b);
    autograd::record(name, {a, b}, {out}, [sa, sb, is_max, name](const GradCtx& c) -> std::vector<Tensor> {
      const Tensor a = sa.unpack(name), b = sb.unpack(name);
      const DType gt_ = c.g().dtype();
      const Tensor a_loses = cast(is_max ? lt(a, b) : gt(a, b), gt_);
      const Tensor b_loses = cast(is_max ? gt(a, b) : lt(a, b), gt_);
      const Tensor half = cast(eq(a, b), gt_) * 0.5;
      return {c.g() * (1.0 - a_loses - half), c.g() * (1.0 - b_loses - half)};
    });
  }
  return out;
}
}  // namespace

Tensor maximum(const Tensor& a, const Tensor& b) { return extremum("maximum", BinaryOp::maximum, a, b, true); }
Tensor minimum(const Tensor& a, const Tensor& b) { return extremum("minimum", BinaryOp::minimum, a, b, false); }

// ---- comparisons and logic (not differentiable) ------------------------------------------------------

namespace {
Tensor compare(const char* name, BinaryOp op, const Tensor& a, const Tensor& b) {
  return run_binary(name, op, a, b, result_type(a, b), DType::boolean);
}
}  // namespace

Tensor eq(const Tensor& a, const Tensor& b) { return compare("eq", BinaryOp::eq, a, b); }
Tensor ne(const Tensor& a, const Tensor& b) { return compare("ne", BinaryOp::ne, a, b); }
Tensor lt(const Tensor& a, const Tensor& b) { return compare("lt", BinaryOp::lt, a, b); }
Tensor le(const Tensor& a, const Tensor& b) { return compare("le", BinaryOp::le, a, b); }
Tensor gt(const Tensor& a, const Tensor& b) { return compare("gt", BinaryOp::gt, a, b); }
Tensor ge(const Tensor& a, const Tensor& b) { return compare("ge", BinaryOp::ge, a, b); }
Tensor logical_and(const Tensor& a, const Tensor& b) { return compare("logical_and", BinaryOp::logical_and, a, b); }
Tensor logical_or(const Tensor& a, const Tensor& b) { return compare("logical_or", BinaryOp::logical_or, a, b); }
Tensor logical_not(const Tensor& a) { return run_unary(UnaryOp::logical_not, raw_cast(a, DType::boolean), DType::boolean); }

// ---- bitwise (integers and bool; not differentiable) -------------------------------------------------

namespace {
// Integer and bool operands only, as PyTorch's: a floating one is refused, naming the op and the operand.
void check_bitwise_operand(const char* name, const char* which, const Tensor& t) {
  KILN_CHECK(!is_floating(t.dtype()), name, ": ", which, " is ", t.type_str(),
             "; bitwise ops take integer and bool tensors only, as in PyTorch (for a mask use a bool tensor, or "
             "convert with .to(i64) first)");
}

// The result type is result_type(a, b) (bool & bool is bool, i32 & i64 is i64, bool & i32 is i32); the
// shifts refuse a bool result (PyTorch has no bool shift).
Tensor bitwise_binary(const char* name, BinaryOp op, const Tensor& a, const Tensor& b) {
  check_bitwise_operand(name, "the first operand", a);
  check_bitwise_operand(name, "the second operand", b);
  const DType t = result_type(a, b);
  KILN_CHECK(t != DType::boolean || (op != BinaryOp::shift_left && op != BinaryOp::shift_right), name,
             ": not defined for two bool operands (", a.type_str(), ", ", b.type_str(),
             "), as in PyTorch; convert one to an integer dtype first");
  return run_binary(name, op, a, b, t, t);
}
}  // namespace

Tensor bitwise_and(const Tensor& a, const Tensor& b) {
  return bitwise_binary("bitwise_and", BinaryOp::bitwise_and, a, b);
}
Tensor bitwise_or(const Tensor& a, const Tensor& b) { return bitwise_binary("bitwise_or", BinaryOp::bitwise_or, a, b); }
Tensor bitwise_xor(const Tensor& a, const Tensor& b) {
  return bitwise_binary("bitwise_xor", BinaryOp::bitwise_xor, a, b);
}
Tensor bitwise_left_shift(const Tensor& a, const Tensor& b) {
  return bitwise_binary("bitwise_left_shift", BinaryOp::shift_left, a, b);
}
Tensor bitwise_right_shift(const Tensor& a, const Tensor& b) {
  return bitwise_binary("bitwise_right_shift", BinaryOp::shift_right, a, b);
}
Tensor bitwise_not(const Tensor& a) {
  check_bitwise_operand("bitwise_not", "the operand", a);
  return run_unary(UnaryOp::bitwise_not, a, a.dtype());
}

// ---- unary ---------------------------------------------------------------------------------------

namespace {
// A float unary op (parameters p0, p1) whose backward needs the input (save_output false) or the output.
template <typename Back>
Tensor float_unary(const char* name, UnaryOp op, const Tensor& a, bool save_output, Back back, double p0 = 0,
                   double p1 = 0) {
  check_not_bool(name, a.dtype());
  Tensor out = run_unary(op, a, float_type(a.dtype()), p0, p1);
  if (autograd::needs_grad({a})) {
    SavedTensor saved(save_output ? out : a);
    autograd::record(name, {a}, {out}, [saved, back, name](const GradCtx& c) -> std::vector<Tensor> {
      return {back(c.g(), saved.unpack(name))};
    });
  }
  return out;
}
}  // namespace

Tensor neg(const Tensor& a) {
  check_not_bool("neg", a.dtype());
  Tensor out = run_unary(UnaryOp::neg, a, a.dtype());
  if (autograd::needs_grad({a}))
    autograd::record("neg", {a}, {out}, [](const GradCtx& c) -> std::vector<Tensor> { return {neg(c.g())}; });
  return out;
}

Tensor abs(const Tensor& a) {
  check_not_bool("abs", a.dtype());
  Tensor out = run_unary(UnaryOp::abs, a, a.dtype());
  if (autograd::needs_grad({a})) {
    SavedTensor sa(a);
    autograd::record("abs", {a}, {out}, [sa](const GradCtx& c) -> std::vector<Tensor> {
      return {c.g() * sign(sa.unpack("abs"))};
    });
  }
  return out;
}

Tensor sign(const Tensor& a) {
  check_not_bool("sign", a.dtype());
  Tensor out = run_unary(UnaryOp::sign, a, a.dtype());
  if (autograd::needs_grad({a}))
    autograd::record("sign", {a}, {out}, [](const GradCtx& c) -> std::vector<Tensor> { return {zeros_like(c.g())}; });
  return out;
}

Tensor exp(const Tensor& a) {
  return float_unary("exp", UnaryOp::exp, a, true, [](const Tensor& g, const Tensor& y) { return g * y; });
}
Tensor log(const Tensor& a) {
  return float_unary("log", UnaryOp::log, a, false, [](const Tensor& g, const Tensor& x) { return g / x; });
}
Tensor sqrt(const Tensor& a) {
  return float_unary("sqrt", UnaryOp::sqrt, a, true, [](const Tensor& g, const Tensor& y) { return g / (y * 2.0); });
}
Tensor rsqrt(const Tensor& a) {
  // d/dx x^-1/2 = -1/2 x^-3/2 = -1/2 y^3
  return float_unary("rsqrt", UnaryOp::rsqrt, a, true,
                     [](const Tensor& g, const Tensor& y) { return g * pow(y, 3.0) * -0.5; });
}

namespace {
// A float unary op with parameters p0, p1 whose backward reads the input.
template <typename Back>
Tensor unary_on_input(const char* name, UnaryOp op, const Tensor& a, double p0, double p1, Back back) {
  return float_unary(name, op, a, false, back, p0, p1);
}
// floor, ceil, round, trunc: an integer tensor is already whole (a copy, its own dtype); gradient 0.
Tensor rounding(const char* name, UnaryOp op, const Tensor& a) {
  check_not_bool(name, a.dtype());
  if (!is_floating(a.dtype())) return a.clone();
  return float_unary(name, op, a, false, [](const Tensor& g, const Tensor&) { return zeros_like(g); });
}
constexpr double kLn2 = 0.69314718055994530942, kLn10 = 2.30258509299404568402;
constexpr double kTwoOverSqrtPi = 1.12837916709551257390;
}  // namespace

Tensor sin(const Tensor& a) {
  return float_unary("sin", UnaryOp::sin, a, false, [](const Tensor& g, const Tensor& x) { return g * cos(x); });
}
Tensor cos(const Tensor& a) {
  return float_unary("cos", UnaryOp::cos, a, false, [](const Tensor& g, const Tensor& x) { return -(g * sin(x)); });
}
Tensor tan(const Tensor& a) {
  return float_unary("tan", UnaryOp::tan, a, true, [](const Tensor& g, const Tensor& y) { return g * (y * y + 1.0); });
}
Tensor asin(const Tensor& a) {
  return float_unary("asin", UnaryOp::asin, a, false,
                     [](const Tensor& g, const Tensor& x) { return g * rsqrt(1.0 - x * x); });
}
Tensor acos(const Tensor& a) {
  return float_unary("acos", UnaryOp::acos, a, false,
                     [](const Tensor& g, const Tensor& x) { return -(g * rsqrt(1.0 - x * x)); });
}
Tensor atan(const Tensor& a) {
  return float_unary("atan", UnaryOp::atan, a, false,
                     [](const Tensor& g, const Tensor& x) { return g / (x * x + 1.0); });
}
Tensor sinh(const Tensor& a) {
  return float_unary("sinh", UnaryOp::sinh, a, false, [](const Tensor& g, const Tensor& x) { return g * cosh(x); });
}
Tensor cosh(const Tensor& a) {
  return float_unary("cosh", UnaryOp::cosh, a, false, [](const Tensor& g, const Tensor& x) { return g * sinh(x); });
}
// torch's derivatives: (x^2 + 1)^-1/2, (x^2 - 1)^-1/2, 1 / (1 - x^2).
Tensor asinh(const Tensor& a) {
  return float_unary("asinh", UnaryOp::asinh, a, false,
                     [](const Tensor& g, const Tensor& x) { return g * rsqrt(x * x + 1.0); });
}
Tensor acosh(const Tensor& a) {
  return float_unary("acosh", UnaryOp::acosh, a, false,
                     [](const Tensor& g, const Tensor& x) { return g * rsqrt(x * x - 1.0); });
}
Tensor atanh(const Tensor& a) {
  return float_unary("atanh", UnaryOp::atanh, a, false,
                     [](const Tensor& g, const Tensor& x) { return g / (1.0 - x * x); });
}
Tensor erf(const Tensor& a) {
  return float_unary("erf", UnaryOp::erf, a, false,
                     [](const Tensor& g, const Tensor& x) { return g * (exp(-(x * x)) * kTwoOverSqrtPi); });
}
Tensor erfc(const Tensor& a) {
  return float_unary("erfc", UnaryOp::erfc, a, false,
                     [](const Tensor& g, const Tensor& x) { return g * (exp(-(x * x)) * -kTwoOverSqrtPi); });
}
Tensor erfinv(const Tensor& a) {
  // d/dx erfinv(x) = sqrt(pi) / 2 * e^(y^2)
  return float_unary("erfinv", UnaryOp::erfinv, a, true,
                     [](const Tensor& g, const Tensor& y) { return g * (exp(y * y) * (1.0 / kTwoOverSqrtPi)); });
}
Tensor log1p(const Tensor& a) {
  return float_unary("log1p", UnaryOp::log1p, a, false, [](const Tensor& g, const Tensor& x) { return g / (x + 1.0); });
}
// ---- gamma and Bessel functions ---------------------------------------------------------------------

namespace {
// A bool input computes as an integer one does (in f32), as PyTorch's special functions.
Tensor special_input(const Tensor& a) { return a.dtype() == DType::boolean ? a.to(DType::f32) : a; }
// The machine epsilon of a floating dtype (i1's and i1e's gradient takes 0.5 within it of 0, as PyTorch).
double epsilon_of(DType t) {
  switch (t) {
    case DType::f64: return std::numeric_limits<double>::epsilon();
    case DType::f16: return 0x1p-10;
    case DType::bf16: return 0x1p-7;
    default: return std::numeric_limits<float>::epsilon();
  }
}
// x where |x| > eps, else eps (the input of i1's gradient formula, which divides by x) and whether it was.
std::pair<Tensor, Tensor> away_from_zero(const Tensor& x) {
  const double eps = epsilon_of(x.dtype());
  const Tensor big = gt(abs(x), scalar_like(eps, x));
  return {where(big, x, scalar_like(eps, x)), big};
}
}  // namespace

Tensor lgamma(const Tensor& a) {
  return float_unary("lgamma", UnaryOp::lgamma, special_input(a), false,
                     [](const Tensor& g, const Tensor& x) { return g * digamma(x); });
}
Tensor digamma(const Tensor& a) {
  return float_unary("digamma", UnaryOp::digamma, special_input(a), false,
                     [](const Tensor& g, const Tensor& x) { return g * polygamma(1, x); });
}
Tensor polygamma(int64_t n, const Tensor& a) {
  KILN_CHECK(n >= 0, "polygamma: n is ", n, "; polygamma(n, x) is defined for whole n >= 0 only");
  // The CUDA kernel takes n as its float parameter, exact to 2^24; past that n! is inf in f64 anyway.
  KILN_CHECK(n <= (int64_t(1) << 24), "polygamma: n is ", n, ", beyond the ", int64_t(1) << 24,
             " it supports (n! overflows f64 from n = 171: every value past that is 0, inf or NaN)");
  if (n == 0) return digamma(a);
  return float_unary(
      "polygamma", UnaryOp::polygamma, special_input(a), false,
      [n](const Tensor& g, const Tensor& x) { return g * polygamma(n + 1, x); }, double(n));
}
Tensor i0(const Tensor& a) {
  return float_unary("i0", UnaryOp::i0, special_input(a), false,
                     [](const Tensor& g, const Tensor& x) { return g * i1(x); });
}
Tensor i0e(const Tensor& a) {
  // d/dx e^-|x| i0(x) = i1e(x) - sign(x) i0e(x)
  return float_unary("i0e", UnaryOp::i0e, special_input(a), false,
                     [](const Tensor& g, const Tensor& x) { return g * (i1e(x) - sign(x) * i0e(x)); });
}
Tensor i1(const Tensor& a) {
  // d/dx i1(x) = i0(x) - i1(x) / x, 1/2 at 0 (where the formula divides 0 by 0)
  return float_unary("i1", UnaryOp::i1, special_input(a), false, [](const Tensor& g, const Tensor& x) {
    const auto [safe, big] = away_from_zero(x);
    return g * where(big, i0(safe) - i1(safe) / safe, scalar_like(0.5, x));
  });
}
Tensor i1e(const Tensor& a) {
  // d/dx e^-|x| i1(x) = i0e(x) - i1e(x) (sign(x) + 1 / x), 1/2 at 0
  return float_unary("i1e", UnaryOp::i1e, special_input(a), false, [](const Tensor& g, const Tensor& x) {
    const auto [safe, big] = away_from_zero(x);
    return g * where(big, i0e(safe) - i1e(safe) * (sign(safe) + reciprocal(safe)), scalar_like(0.5, x));
  });
}
Tensor ndtri(const Tensor& a) {
  // d/dp ndtri(p) = sqrt(2 pi) e^(y^2 / 2)
  return float_unary("ndtri", UnaryOp::ndtri, special_input(a), true,
                     [](const Tensor& g, const Tensor& y) { return g * (exp(y * y * 0.5) * 2.50662827463100050242); });
}
Tensor log_ndtr(const Tensor& a) {
  // d/dx log ndtr(x) = pdf(x) / ndtr(x) = e^-(x^2 / 2 + log_ndtr(x)) / sqrt(2 pi)
  return float_unary("log_ndtr", UnaryOp::log_ndtr, special_input(a), false, [](const Tensor& g, const Tensor& x) {
    return g * (exp(-(x * x * 0.5 + log_ndtr(x))) * 0.39894228040143267794);
  });
}
Tensor erfcx(const Tensor& a) {
  // d/dx erfcx(x) = 2 x erfcx(x) - 2 / sqrt(pi)
  return float_unary("erfcx", UnaryOp::erfcx, special_input(a), false,
                     [](const Tensor& g, const Tensor& x) { return g * (x * erfcx(x) * 2.0 - kTwoOverSqrtPi); });
}
Tensor expm1(const Tensor& a) {
  return float_unary("expm1", UnaryOp::expm1, a, true, [](const Tensor& g, const Tensor& y) { return g * (y + 1.0); });
}
Tensor log2(const Tensor& a) {
  return float_unary("log2", UnaryOp::log2, a, false, [](const Tensor& g, const Tensor& x) { return g / (x * kLn2); });
}
Tensor log10(const Tensor& a) {
  return float_unary("log10", UnaryOp::log10, a, false,
                     [](const Tensor& g, const Tensor& x) { return g / (x * kLn10); });
}
Tensor exp2(const Tensor& a) {
  return float_unary("exp2", UnaryOp::exp2, a, true, [](const Tensor& g, const Tensor& y) { return g * (y * kLn2); });
}
Tensor reciprocal(const Tensor& a) {
  return float_unary("reciprocal", UnaryOp::reciprocal, a, true,
                     [](const Tensor& g, const Tensor& y) { return -(g * (y * y)); });
}
Tensor floor(const Tensor& a) { return rounding("floor", UnaryOp::floor, a); }
Tensor ceil(const Tensor& a) { return rounding("ceil", UnaryOp::ceil, a); }
Tensor round(const Tensor& a) { return rounding("round", UnaryOp::round, a); }
Tensor trunc(const Tensor& a) { return rounding("trunc", UnaryOp::trunc, a); }
Tensor frac(const Tensor& a) {
  return float_unary("frac", UnaryOp::frac, a, false, [](const Tensor& g, const Tensor&) { return g; });
}

// ---- activations -------------------------------------------------------------------------------------

namespace {
Tensor where_positive(const Tensor& x, const Tensor& pos, const Tensor& rest) {
  return where(gt(x, scalar_like(0, x)), pos, rest);
}
// pos where x is not <= 0, NaN included: elu's and celu's gradient at NaN is their positive side's, as
// PyTorch's elu_backward (leaky_relu's is its slope: where_positive).
Tensor where_not_at_most_zero(const Tensor& x, const Tensor& pos, const Tensor& rest) {
  return where(le(x, scalar_like(0, x)), rest, pos);
}
}  // namespace

Tensor silu(const Tensor& x) {
  return unary_on_input("silu", UnaryOp::silu, x, 0, 0, [](const Tensor& g, const Tensor& x) {
    const Tensor s = sigmoid(x);
    return g * (s * (x * (1.0 - s) + 1.0));
  });
}
Tensor mish(const Tensor& x) {
  return unary_on_input("mish", UnaryOp::mish, x, 0, 0, [](const Tensor& g, const Tensor& x) {
    const Tensor t = tanh(softplus(x));
    return g * (t + x * sigmoid(x) * (1.0 - t * t));
  });
}
Tensor softplus(const Tensor& x, double beta, double threshold) {
  KILN_CHECK(beta != 0 && std::isfinite(beta), "softplus: beta must be finite and non-zero, got ", beta);
  return unary_on_input("softplus", UnaryOp::softplus, x, beta, threshold,
                        [beta, threshold](const Tensor& g, const Tensor& x) {
                          const Tensor z = x * beta;
                          return where(gt(z, scalar_like(threshold, z)), g, g * sigmoid(z));
                        });
}
Tensor softsign(const Tensor& x) {
  return unary_on_input("softsign", UnaryOp::softsign, x, 0, 0, [](const Tensor& g, const Tensor& x) {
    const Tensor d = abs(x) + 1.0;
    return g / (d * d);
  });
}
Tensor logsigmoid(const Tensor& x) {
  return unary_on_input("logsigmoid", UnaryOp::logsigmoid, x, 0, 0,
                        [](const Tensor& g, const Tensor& x) { return g * sigmoid(-x); });
}
Tensor leaky_relu(const Tensor& x, double slope) {
  return unary_on_input("leaky_relu", UnaryOp::leaky_relu, x, slope, 0, [slope](const Tensor& g, const Tensor& x) {
    return detail::with_zero_edge(where_positive(x, g, g * slope), x);
  });
}
namespace {
Tensor elu_scaled(const char* name, const Tensor& x, double alpha, double scale) {
  return unary_on_input(name, UnaryOp::elu, x, alpha, scale, [alpha, scale](const Tensor& g, const Tensor& x) {
    return where_not_at_most_zero(x, g * scale, g * (exp(x) * (alpha * scale)));
  });
}
}  // namespace
Tensor elu(const Tensor& x, double alpha) { return elu_scaled("elu", x, alpha, 1.0); }
// Klambauer et al.'s constants, as torch.nn.functional.selu.
Tensor selu(const Tensor& x) {
  return elu_scaled("selu", x, 1.6732632423543772848170429916717, 1.0507009873554804934193349852946);
}
Tensor celu(const Tensor& x, double alpha) {
  KILN_CHECK(alpha != 0, "celu: alpha must be non-zero");
  return unary_on_input("celu", UnaryOp::celu, x, alpha, 0, [alpha](const Tensor& g, const Tensor& x) {
    return where_not_at_most_zero(x, g, g * exp(x / alpha));
  });
}
Tensor hardtanh(const Tensor& x, double min_val, double max_val) {
  KILN_CHECK(min_val <= max_val, "hardtanh: min_val ", min_val, " is above max_val ", max_val);
  return unary_on_input(
      "hardtanh", UnaryOp::clamp, x, min_val, max_val, [min_val, max_val](const Tensor& g, const Tensor& x) {
        // 0 at or past a bound, and g elsewhere, NaN included: PyTorch's hardtanh_backward (its CUDA and
        // scalar CPU kernels; its vectorised CPU loop gives 0 at NaN).
        const Tensor outside = logical_or(le(x, scalar_like(min_val, x)), ge(x, scalar_like(max_val, x)));
        return detail::with_zero_edge(where(outside, zeros_like(g), g), x);
      });
}
Tensor relu6(const Tensor& x) { return hardtanh(x, 0.0, 6.0); }
Tensor prelu(const Tensor& x, const Tensor& weight) {
  KILN_CHECK(weight.dim() == 1 && (weight.size(0) == 1 || (x.dim() >= 2 && weight.size(0) == x.size(1))),
             "prelu: weight must be [1] or [C] with C = x.size(1), got weight ", weight.shape(), " for x ", x.shape());
  Shape ws(size_t(std::max<int64_t>(x.dim(), 1)), 1);
  if (x.dim() >= 2) ws[1] = weight.size(0);
  return where_positive(x, x, weight.reshape(ws) * x);
}
Tensor glu(const Tensor& x, int64_t dim) {
  const int64_t d = wrap_dim(dim, x.dim(), "glu");
  KILN_CHECK(x.size(d) % 2 == 0, "glu: dim ", dim, " of ", x.shape(), " must have an even size");
  const int64_t h = x.size(d) / 2;
  return x.narrow(d, 0, h) * sigmoid(x.narrow(d, h, h));
}
Tensor hardsigmoid(const Tensor& x) {
  return unary_on_input("hardsigmoid", UnaryOp::hardsigmoid, x, 0, 0, [](const Tensor& g, const Tensor& x) {
    return where(lt(abs(x), scalar_like(3, x)), g * (1.0 / 6.0), zeros_like(g));
  });
}
Tensor hardswish(const Tensor& x) {
  return unary_on_input("hardswish", UnaryOp::hardswish, x, 0, 0, [](const Tensor& g, const Tensor& x) {
    // PyTorch 2.x's hardswish_backward: 0 at -3 and below, 1 at 3 and above, x / 3 + 1/2 strictly
    // between (x / 3, not x * (1/3): the same bits as PyTorch); NaN passes g, as there.
    return where(le(x, scalar_like(-3, x)), zeros_like(g), where(lt(x, scalar_like(3, x)), g * (x / 3.0 + 0.5), g));
  });
}

namespace {
// An activation's backward in one kernel; in a backward with create_graph (grad mode on there) the
// same formula from recorded ops, so that it can be differentiated again.
Tensor fused_backward(BinaryOp op, const Tensor& g, const Tensor& saved) {
  const DType t = promote_types(g.dtype(), saved.dtype());
  if (!autograd::needs_grad({g, saved})) return run_binary("backward", op, g, saved, t, t);
  const Tensor a = g.to(t), b = saved.to(t);
  switch (op) {
    case BinaryOp::relu_backward:  // b <= 0 ? 0 : a (a NaN b passes a)
      return detail::with_zero_edge(where(le(b, scalar_like(0, b)), zeros_like(a), a), b);
    case BinaryOp::sigmoid_backward:
      return a * b * (1.0 - b);
    case BinaryOp::tanh_backward:
      return a * (1.0 - b * b);
    case BinaryOp::gelu_erf_backward: {  // Phi(x) + x phi(x)
      const double inv_sqrt2 = 0.70710678118654752440, inv_sqrt_2pi = 0.39894228040143267794;
      return a * ((erf(b * inv_sqrt2) + 1.0) * 0.5 + b * exp(b * b * -0.5) * inv_sqrt_2pi);
    }
    case BinaryOp::gelu_tanh_backward: {  // d/dx 0.5 x (1 + tanh(k (x + 0.044715 x^3)))
      const double k = 0.79788456080286535588;
      const Tensor th = tanh((b + b * b * b * 0.044715) * k);
      return a * ((th + 1.0) * 0.5 + b * (1.0 - th * th) * ((b * b * (3 * 0.044715) + 1.0) * (0.5 * k)));
    }
    default:
      KILN_FAIL("backward: no recorded form of fused backward op ", int(op));
  }
}
}  // namespace

Tensor tanh(const Tensor& a) {
  return float_unary("tanh", UnaryOp::tanh, a, true,
                     [](const Tensor& g, const Tensor& y) { return fused_backward(BinaryOp::tanh_backward, g, y); });
}
Tensor sigmoid(const Tensor& a) {
  return float_unary("sigmoid", UnaryOp::sigmoid, a, true,
                     [](const Tensor& g, const Tensor& y) { return fused_backward(BinaryOp::sigmoid_backward, g, y); });
}

Tensor relu(const Tensor& a) {
  check_not_bool("relu", a.dtype());
  Tensor out = run_unary(UnaryOp::relu, a, a.dtype());
  if (autograd::needs_grad({a})) {
    SavedTensor so(out);
    autograd::record("relu", {a}, {out}, [so](const GradCtx& c) -> std::vector<Tensor> {
      return {fused_backward(BinaryOp::relu_backward, c.g(), so.unpack("relu"))};
    });
  }
  return out;
}

Tensor gelu(const Tensor& a, GeluApprox approx) {
  const bool t = approx == GeluApprox::tanh;
  return float_unary(t ? "gelu_tanh" : "gelu", t ? UnaryOp::gelu_tanh : UnaryOp::gelu_erf, a, false,
                     [t](const Tensor& g, const Tensor& x) {
                       return fused_backward(t ? BinaryOp::gelu_tanh_backward : BinaryOp::gelu_erf_backward, g, x);
                     });
}

Tensor clamp(const Tensor& a, std::optional<double> lo, std::optional<double> hi) {
  check_not_bool("clamp", a.dtype());
  // min > max is no error: every element becomes max, as PyTorch's (the kernels raise to min, then lower to
  // max), and the gradient is 0 (no x is inside).
  const bool nan_bound = (lo && std::isnan(*lo)) || (hi && std::isnan(*hi));
  KILN_CHECK(!nan_bound || is_floating(a.dtype()), "clamp: a NaN bound on ", a.type_str(),
             ", which holds no NaN (PyTorch's result is a float tensor); convert x to a floating dtype first");
  if (is_integral(a.dtype())) {
    // As PyTorch: a bound that every element would be clamped past (i8 min 300) is refused rather than
    // saturated; one past the other end (i8 max 300) bounds nothing and is taken.
    const auto [first, last] = integer_range(a.dtype());
    KILN_CHECK(!lo || *lo <= last, "clamp: min ", *lo, " is above the largest ", a.dtype(), " value (", last, ")");
    KILN_CHECK(!hi || *hi >= first, "clamp: max ", *hi, " is below the smallest ", a.dtype(), " value (", first, ")");
  }
  // An absent bound goes to the kernel as an infinity, which bounds nothing (an integer dtype saturates it
  // to its range: math::clamp_bound); the kernel takes a NaN bound as a bound, propagating it.
  const double inf = std::numeric_limits<double>::infinity();
  Tensor out = run_unary(UnaryOp::clamp, a, a.dtype(), lo ? *lo : -inf, hi ? *hi : inf);
  if (autograd::needs_grad({a})) {
    SavedTensor sa(a);
    autograd::record("clamp", {a}, {out}, [sa, lo, hi](const GradCtx& c) -> std::vector<Tensor> {
      const Tensor x = sa.unpack("clamp");
      // Strictly inside: the gradient is 0 at a bound, as PyTorch's (and hardtanh's below).
      Tensor inside = ones_like(x).to(DType::boolean);
      if (lo) inside = logical_and(inside, gt(x, scalar_like(*lo, x)));
      if (hi) inside = logical_and(inside, lt(x, scalar_like(*hi, x)));
      return {where(inside, c.g(), zeros_like(c.g()))};
    });
  }
  return out;
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  const Device dev = detail::common_device("where", {cond, a, b});
  KILN_CHECK(cond.dtype() == DType::boolean, "where: condition must be bool, got ", cond.dtype());
  Shape shape;
  try {
    shape = broadcast_shapes(broadcast_shapes(cond.shape(), a.shape()), b.shape());
  } catch (const Error& e) {
    KILN_FAIL("where: ", e.message());
  }
  const DType t = result_type(a, b);
  const Tensor a2 = raw_cast(a, t), b2 = raw_cast(b, t);
  Tensor out = make_tensor(shape, t, dev, layout_of(shape, {&a, &b}));
  backend(dev).where(desc(out), desc_broadcast(cond, shape), desc_broadcast(a2, shape), desc_broadcast(b2, shape));
  if (autograd::needs_grad({a, b})) {
    const Tensor c0 = cond.detach();
    autograd::record("where", {a, b}, {out}, [c0](const GradCtx& c) -> std::vector<Tensor> {
      const Tensor z = zeros_like(c.g());
      return {c.needs_grad(0) ? where(c0, c.g(), z) : Tensor(), c.needs_grad(1) ? where(c0, z, c.g()) : Tensor()};
    });
  }
  return out;
}

Tensor cast(const Tensor& a, DType dt) {
  if (a.dtype() == dt) return a;
  Tensor out = raw_cast(a, dt);
  if (is_floating(dt) && autograd::needs_grad({a}))
    autograd::record("cast", {a}, {out}, [](const GradCtx& c) -> std::vector<Tensor> { return {c.g()}; });
  return out;
}

// ---- operators with scalars -------------------------------------------------------------------------

DType result_type(const Tensor& a, const Tensor& b) {
  if ((a.dim() == 0) == (b.dim() == 0)) return promote_types(a.dtype(), b.dtype());
  const Tensor& zero_dim = a.dim() == 0 ? a : b;
  const Tensor& dimensioned = a.dim() == 0 ? b : a;
  const auto category = [](DType t) { return t == DType::boolean ? 0 : is_floating(t) ? 2 : 1; };
  return category(zero_dim.dtype()) > category(dimensioned.dtype()) ? zero_dim.dtype() : dimensioned.dtype();
}

Tensor scalar_like(double s, const Tensor& like) {
  DType t;
  const bool integral = std::isfinite(s) && s == std::floor(s);
  if (is_floating(like.dtype())) {
    t = like.dtype();
  } else if (integral) {
    t = like.dtype() == DType::boolean ? DType::i64 : like.dtype();
    s = wrap_integral(s, t);
  } else {
    t = DType::f32;
  }
  return scalar_tensor(s, TensorOptions(t, like.device()));
}

Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator-(const Tensor& a) { return neg(a); }
namespace {
// A number next to a tensor in + - * /: as PyTorch's wrapped numbers, it sets the result type only by its
// category (scalar_like), and a 16-bit op computes in f32 with the number in f32, rounding once (the kernels
// take a 0-dim f32 operand as it is: run_binary). Rounding the number to 16 bits first biased every result
// (bf16 x * 0.1 was x * 0.10009765625). A 0-dim 16-bit tensor, whose f32 partner would promote it, computes
// in f32 and is cast back: the same single rounding.
template <typename Op> Tensor with_number(const Tensor& a, double s, bool number_first, Op op) {
  const Tensor like = scalar_like(s, a);
  if (!is_low_precision(like.dtype()) || a.dtype() != like.dtype()) return number_first ? op(like, a) : op(a, like);
  const Tensor n = scalar_tensor(s, TensorOptions(DType::f32, a.device()));
  if (a.dim() == 0) {
    const Tensor a32 = cast(a, DType::f32);
    return cast(number_first ? op(n, a32) : op(a32, n), a.dtype());
  }
  return number_first ? op(n, a) : op(a, n);
}
}  // namespace

Tensor operator+(const Tensor& a, double s) {
  return with_number(a, s, false, [](const Tensor& x, const Tensor& y) { return add(x, y); });
}
Tensor operator-(const Tensor& a, double s) {
  return with_number(a, s, false, [](const Tensor& x, const Tensor& y) { return sub(x, y); });
}
Tensor operator*(const Tensor& a, double s) {
  return with_number(a, s, false, [](const Tensor& x, const Tensor& y) { return mul(x, y); });
}
namespace {
// True division of an integer or bool tensor by a number computes in f32 with the number as it is, as
// PyTorch's: scalar_like would first make a whole number an integer of the tensor's dtype (i8 x / 300
// divided by 300 wrapped into i8, 44).
Tensor number_for_division(double s, const Tensor& a) {
  return scalar_tensor(s, TensorOptions(DType::f32, a.device()));
}
}  // namespace

Tensor operator/(const Tensor& a, double s) {
  if (!is_floating(a.dtype())) return div(a, number_for_division(s, a));
  return with_number(a, s, false, [](const Tensor& x, const Tensor& y) { return div(x, y); });
}
Tensor operator+(double s, const Tensor& a) {
  return with_number(a, s, true, [](const Tensor& x, const Tensor& y) { return add(x, y); });
}
Tensor operator-(double s, const Tensor& a) {
  return with_number(a, s, true, [](const Tensor& x, const Tensor& y) { return sub(x, y); });
}
Tensor operator*(double s, const Tensor& a) {
  return with_number(a, s, true, [](const Tensor& x, const Tensor& y) { return mul(x, y); });
}
Tensor operator/(double s, const Tensor& a) {
  if (!is_floating(a.dtype())) return div(number_for_division(s, a), a);
  return with_number(a, s, true, [](const Tensor& x, const Tensor& y) { return div(x, y); });
}

bool allclose(const Tensor& a, const Tensor& b, double rtol, double atol, bool equal_nan) {
  const OpScope scope("allclose");
  KILN_CHECK(rtol >= 0 && atol >= 0, "allclose: rtol and atol must be >= 0, got ", rtol, " and ", atol);
  // PyTorch's rule: the shapes broadcast (an error where they cannot); NaN matches NaN only with
  // equal_nan; an infinity matches only the same infinity (|inf - x| <= atol + rtol |x| is true for
  // x = inf or -inf, so they are compared first).
  const Shape s = broadcast_shapes(a.shape(), b.shape());
  const std::vector<double> x = a.expand(s).to_vector(), y = b.expand(s).to_vector();
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(x[i]) || std::isnan(y[i])) {
      if (!(equal_nan && std::isnan(x[i]) && std::isnan(y[i]))) return false;
      continue;
    }
    if (std::isinf(x[i]) || std::isinf(y[i])) {
      if (x[i] != y[i]) return false;
      continue;
    }
    if (std::abs(x[i] - y[i]) > atol + rtol * std::abs(y[i])) return false;
  }
  return true;
}

}  // namespace kiln

// ---- NaN tests, interpolation, tensor-bounded clamp (built from the ops above) ------------------------

namespace kiln {
namespace {
double largest_finite(DType t) {
  switch (t) {
    case DType::f16: return 65504.0;
    case DType::bf16: return 3.3895313892515355e38;
    case DType::f32: return double(std::numeric_limits<float>::max());
    default: return std::numeric_limits<double>::max();
  }
}
}  // namespace

Tensor isnan(const Tensor& a) {
  if (!is_floating(a.dtype())) return zeros(a.shape(), TensorOptions(DType::boolean, a.device()));
  return ne(a, a);
}
Tensor isinf(const Tensor& a) {
  if (!is_floating(a.dtype())) return zeros(a.shape(), TensorOptions(DType::boolean, a.device()));
  return eq(abs(a.detach()), scalar_like(std::numeric_limits<double>::infinity(), a));
}
Tensor isfinite(const Tensor& a) {
  if (!is_floating(a.dtype())) return ones(a.shape(), TensorOptions(DType::boolean, a.device()));
  // x - x is 0 for a finite x, NaN for inf and NaN.
  const Tensor d = a.detach();
  return eq(d - d, scalar_like(0, a));
}
Tensor nan_to_num(const Tensor& a, double nan, std::optional<double> posinf, std::optional<double> neginf) {
  if (!is_floating(a.dtype())) return a.clone();
  const double big = largest_finite(a.dtype()), inf = std::numeric_limits<double>::infinity();
  const Tensor d = a.detach();
  Tensor out = where(ne(d, d), scalar_like(nan, a), a);
  out = where(eq(d, scalar_like(inf, a)), scalar_like(posinf.value_or(big), a), out);
  return where(eq(d, scalar_like(-inf, a)), scalar_like(neginf.value_or(-big), a), out);
}

namespace {
// The composites below compute 16-bit operands in f32 (their op-math type) and round once at the end, as
// PyTorch's fused kernels: rounding every step loses the result near cancellation (lerp's b - a, then the
// sum). `out` is the result type; f32 operands, the casts' backward returns each gradient in its input's dtype.
template <typename F> Tensor in_f32(DType out, std::initializer_list<Tensor> ts, F f) {
  if (!is_low_precision(out)) return f(ts);
  std::vector<Tensor> up;
  for (const Tensor& t : ts) up.push_back(is_floating(t.dtype()) ? cast(t, DType::f32) : t);
  return cast(f(up), out);
}
// The result type of x op (t1 op t2) for floating operands; the f32 route is for those only.
DType composite_type(const Tensor& x, const Tensor& t1, const Tensor& t2) {
  if (!is_floating(x.dtype()) || !is_floating(t1.dtype()) || !is_floating(t2.dtype())) return DType::f32;
  const DType inner = result_type(t1, t2);
  const bool inner_zero_dim = t1.dim() == 0 && t2.dim() == 0;
  if ((x.dim() == 0) == inner_zero_dim) return promote_types(x.dtype(), inner);
  return x.dim() == 0 ? inner : x.dtype();  // same category: the dimensioned side's type
}
}  // namespace

Tensor lerp(const Tensor& a, const Tensor& b, const Tensor& weight) {
  const OpScope scope("lerp");
  return in_f32(composite_type(weight, a, b), {a, b, weight}, [](const auto& t) {
    const Tensor &a = t.begin()[0], &b = t.begin()[1], &weight = t.begin()[2];
    const Tensor diff = b - a;
    const Tensor small = lt(abs(weight.detach()), scalar_like(0.5, weight));
    return where(small, a + weight * diff, b - diff * (1.0 - weight));
  });
}
Tensor lerp(const Tensor& a, const Tensor& b, double weight) {
  const OpScope scope("lerp");
  return in_f32(composite_type(a, a, b), {a, b}, [weight](const auto& t) {
    const Tensor &a = t.begin()[0], &b = t.begin()[1];
    return std::abs(weight) < 0.5 ? a + (b - a) * weight : b - (b - a) * (1.0 - weight);
  });
}
Tensor addcmul(const Tensor& x, const Tensor& t1, const Tensor& t2, double value) {
  return in_f32(composite_type(x, t1, t2), {x, t1, t2},
                [value](const auto& t) { return t.begin()[0] + t.begin()[1] * t.begin()[2] * value; });
}
Tensor addcdiv(const Tensor& x, const Tensor& t1, const Tensor& t2, double value) {
  return in_f32(composite_type(x, t1, t2), {x, t1, t2},
                [value](const auto& t) { return t.begin()[0] + t.begin()[1] / t.begin()[2] * value; });
}

Tensor clamp(const Tensor& a, const Tensor& min, const Tensor& max) {
  const OpScope scope("clamp");
  KILN_CHECK(min.defined() || max.defined(), "clamp: give min or max (or both)");
  check_not_bool("clamp", a.dtype());
  // One bound: maximum or minimum, which keep a NaN of either side and whose gradient is PyTorch's clamp's
  // there (measured against torch 2: a tie splits it in half, and a NaN on either side gives 1 to both).
  if (!max.defined()) return maximum(a, min);
  if (!min.defined()) return minimum(a, max);
  // Both: the same values (min > max gives max), but PyTorch's gradient is not the composition's, so it is
  // recorded as one op.
  Tensor out;
  {
    const NoGradGuard no_grad;
    out = minimum(maximum(a, min), max);
  }
  if (autograd::needs_grad({a, min, max})) {
    SavedTensor sa(a), sl(min), sh(max);
    autograd::record("clamp", {a, min, max}, {out}, [sa, sl, sh](const GradCtx& c) -> std::vector<Tensor> {
      const Tensor x = sa.unpack("clamp"), lo = sl.unpack("clamp"), hi = sh.unpack("clamp");
      const DType dt = c.g().dtype();
      // PyTorch 2's rule, measured over NaN, +-inf, ties and min > max: x gets the gradient unless it is
      // below min or above max (so a NaN anywhere gives it to x); min gets it where x < min <= max, max where
      // x > max >= min or min > max (all max then); with min < max a tie splits it between x and that bound.
      const Tensor below = lt(x, lo), above = gt(x, hi), ordered = lt(lo, hi), ok = le(lo, hi);
      const Tensor tie_lo = logical_and(ordered, eq(x, lo)), tie_hi = logical_and(ordered, eq(x, hi));
      const Tensor wx = cast(logical_not(logical_or(below, above)), dt) - cast(logical_or(tie_lo, tie_hi), dt) * 0.5;
      const Tensor wlo = cast(logical_and(below, ok), dt) + cast(tie_lo, dt) * 0.5;
      const Tensor whi = cast(logical_or(logical_and(above, ok), gt(lo, hi)), dt) + cast(tie_hi, dt) * 0.5;
      return {c.needs_grad(0) ? c.g() * wx : Tensor(), c.needs_grad(1) ? c.g() * wlo : Tensor(),
              c.needs_grad(2) ? c.g() * whi : Tensor()};
    });
  }
  return out;
}

}  // namespace kiln
