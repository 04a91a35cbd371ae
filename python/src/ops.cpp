// The functions of engine/ops.h as module functions: factories, elementwise math, reductions,
// scans and sorting, linear algebra, and the shape and index ops of nn_ops.h. Argument names and
// defaults follow torch where the op exists there (dim, keepdim, ...). The GIL is released around
// every computation.
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>

#include <nanobind/stl/array.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/tuple.h>

#include "common.h"

namespace kiln::py {
namespace {

using R = GilRelease;
auto nogil = nb::call_guard<GilRelease>();

TensorOptions options(nb::handle dtype, nb::handle device, bool requires_grad, DType fallback = DType::f32) {
  TensorOptions o;
  o.dtype = dtype.is_none() ? fallback : to_dtype(dtype);
  o.device = device.is_none() ? kCPU : to_device(device);
  o.requires_grad = requires_grad;
  return o;
}

// A second operand: a tensor, or a number taking the first operand's dtype rules.
Tensor operand(nb::handle h, const Tensor& like) { return to_tensor(h, &like, "other"); }

// Two operands either of which may be a Python number: a number takes the other operand's type (as
// the binary ops see their operands); `wa` and `wb` name them in errors.
std::pair<Tensor, Tensor> operand_pair(nb::handle a, nb::handle b, const char* wa, const char* wb) {
  Tensor ta = nb::isinstance<Tensor>(a) ? nb::cast<Tensor>(a) : Tensor();
  Tensor tb = nb::isinstance<Tensor>(b) ? nb::cast<Tensor>(b) : Tensor();
  const Tensor* ref = ta.defined() ? &ta : (tb.defined() ? &tb : nullptr);
  // Two numbers: a NumPy bool is a float number to PyTorch beside another number too (where(mask, np.True_, 2)
  // is f32), as to_tensor takes it beside a tensor.
  const std::string tn = py_type_name(a);
  const nb::object na = !ref && (tn == "numpy.bool" || tn == "numpy.bool_")
                            ? nb::object(nb::float_(PyObject_IsTrue(a.ptr()) == 1))
                            : nb::borrow(a);
  if (!ta.defined()) ta = to_tensor(na, ref, wa);
  if (!tb.defined()) tb = to_tensor(b, ref ? ref : &ta, wb);
  return {ta, tb};
}

nb::tuple pair_of(const ValuesIndices& vi) { return nb::make_tuple(vi.values, vi.indices); }
// Runs `op` with the GIL let go (other Python threads go on through a long sort), then makes the
// Python result with it held.
template <class F> nb::object nogil_result(F op) {
  decltype(op()) out;
  {
    R r;
    out = op();
  }
  if constexpr (std::is_same_v<decltype(op()), ValuesIndices>)
    return pair_of(out);
  else
    return nb::cast(std::move(out));
}

// A NumPy integer: a scalar (np.int32(3)) or a 0-dim integer array (np.array(3)), which NumPy code passes
// for a number alike.
bool numpy_integer(nb::handle h) {
  const std::string tn = py_type_name(h);
  if (tn.rfind("numpy.int", 0) == 0 || tn.rfind("numpy.uint", 0) == 0) return true;
  if (tn != "numpy.ndarray" || nb::cast<size_t>(h.attr("ndim")) != 0) return false;
  const std::string kind = nb::cast<std::string>(h.attr("dtype").attr("kind"));
  return kind == "i" || kind == "u";
}

// A Python int or a NumPy integer (not a bool), as an exact int64; nothing for anything else.
std::optional<int64_t> int_number(nb::handle h, const char* what) {
  if (PyLong_Check(h.ptr())) return exact_int(h, what);
  if (!numpy_integer(h)) return std::nullopt;
  nb::object i = nb::steal(PyNumber_Index(h.ptr()));
  if (!i.is_valid()) throw nb::python_error();
  return exact_int(i, what);
}

// where(condition, x, v) with an int v beside an integer tensor x: v takes x's dtype, so one x's dtype
// cannot hold is refused, as torch's ("value cannot be converted to type int8_t without overflow"), where
// it wrapped (where(mask, x_i8, 300) wrote 44). torch's range, measured: a uint8 takes -255 to 255 (a
// negative one wraps: -1 is 255), the signed dtypes their own range.
void check_where_number(nb::handle h, const Tensor& other, const char* what) {
  if (nb::isinstance<Tensor>(h) || !is_integral(other.dtype()) || other.dtype() == DType::boolean) return;
  const std::optional<int64_t> v = int_number(h, what);
  if (!v) return;
  int64_t lo = std::numeric_limits<int64_t>::min(), hi = std::numeric_limits<int64_t>::max();
  switch (other.dtype()) {
    case DType::u8: lo = -255, hi = 255; break;
    case DType::i8: lo = -128, hi = 127; break;
    case DType::i16: lo = -32768, hi = 32767; break;
    case DType::i32: lo = std::numeric_limits<int32_t>::min(), hi = std::numeric_limits<int32_t>::max(); break;
    default: break;
  }
  if (*v < lo || *v > hi)
    value_error("where: " + std::string(what) + " " + std::to_string(*v) + " does not fit in the other operand's " +
                other.type_str() + " (" + std::to_string(lo) + " to " + std::to_string(hi) +
                "), as in PyTorch; pass a tensor of a wider dtype, or convert the tensor first");
}

// The dtype clamp(x, min, max) with number bounds gives, as torch's type promotion with wrapped numbers:
// x's own unless x is an integer or bool tensor and a bound is a float (a NumPy bool too, a float number to
// PyTorch), which gives f32 (clamp(x_i8, 0.5, 2.5) is f32 [1., 2.]), or x is bool and a bound an int (i64).
DType clamp_dtype(const Tensor& x, nb::handle lo, nb::handle hi) {
  if (is_floating(x.dtype())) return x.dtype();
  bool floats = false, ints = false;
  for (nb::handle b : {lo, hi}) {
    if (b.is_none() || PyBool_Check(b.ptr())) continue;
    if (PyLong_Check(b.ptr()) || numpy_integer(b))
      ints = true;
    else
      floats = true;
  }
  if (floats) return DType::f32;
  return ints && x.dtype() == DType::boolean ? DType::i64 : x.dtype();
}

// An integer argument for arange: a Python int (not a bool), an integer 0-dim tensor, a NumPy integer.
bool int_like(nb::handle h) {
  if (PyBool_Check(h.ptr()) || PyFloat_Check(h.ptr())) return false;
  if (PyLong_Check(h.ptr())) return true;
  if (nb::isinstance<Tensor>(h)) return is_integral(nb::cast<Tensor>(h).dtype());
  return PyIndex_Check(h.ptr());
}

Tensor finish(Tensor t, bool requires_grad) {
  if (requires_grad) t.set_requires_grad(true);
  return t;
}

template <typename F> void unary(Defs& m, const char* name, F fn) {
  m.def(
      name, [fn](const Tensor& x) { return fn(x); }, nb::arg("input"), nogil);
}

template <typename F> void binary_fn(Defs& m, const char* name, F fn) {
  m.def(
      name,
      [fn](const Tensor& a, nb::handle b) {
        const Tensor t = operand(b, a);
        R r;
        return fn(a, t);
      },
      nb::arg("input"), nb::arg("other"));
}

}  // namespace

void bind_ops(nb::module_& mod) {
  Defs m{mod};
  // ---- factories ----
  auto sized = [&](const char* name, auto make) {
    m.def(
        name,
        [make](nb::args size, nb::kwargs kw) {
          nb::handle dtype = nb::none(), device = nb::none();
          bool rg = false;
          for (auto [k, v] : kw) {
            const std::string key = nb::cast<std::string>(k);
            if (key == "dtype")
              dtype = v;
            else if (key == "device")
              device = v;
            else if (key == "requires_grad")
              rg = nb::cast<bool>(v);
            else
              value_error(std::string("unexpected keyword argument '") + key + "'");
          }
          const Shape s = to_shape(size);
          TensorOptions o = options(dtype, device, false);
          Tensor t;
          {
            R r;
            t = make(s, o);
          }
          return finish(t, rg);
        },
        "(*size, dtype=kiln.float32, device='cpu', requires_grad=False)");
  };
  sized("zeros", [](const Shape& s, TensorOptions o) { return zeros(s, o); });
  sized("ones", [](const Shape& s, TensorOptions o) { return ones(s, o); });
  sized("empty", [](const Shape& s, TensorOptions o) { return empty(s, o); });
  sized("rand", [](const Shape& s, TensorOptions o) { return rand(s, o); });
  sized("randn", [](const Shape& s, TensorOptions o) { return randn(s, o); });
  m.def(
      "full",
      [](nb::handle size, nb::handle fill_value_, nb::handle dtype, nb::handle device, bool rg) {
        const Shape s(to_dims(size, "size"));
        // No dtype: the fill value's, as torch.full and kiln.tensor infer it: a bool (Python's or
        // NumPy's) gives bool, an int (Python's or a NumPy integer) int64, anything else float32.
        const std::string tn = py_type_name(fill_value_);
        const bool is_bool = PyBool_Check(fill_value_.ptr()) || tn == "numpy.bool" || tn == "numpy.bool_";
        const bool is_int =
            !is_bool && !nb::isinstance<Tensor>(fill_value_) && !PyFloat_Check(fill_value_.ptr()) &&
            (PyLong_Check(fill_value_.ptr()) || tn.rfind("numpy.int", 0) == 0 || tn.rfind("numpy.uint", 0) == 0);
        // A 0-d tensor gives the default of its kind, as torch.full (an f64 or i32 one: float32, int64).
        DType inferred = is_bool ? DType::boolean : (is_int ? DType::i64 : DType::f32);
        if (nb::isinstance<Tensor>(fill_value_)) {
          const Tensor& t = nb::cast<const Tensor&>(fill_value_);
          if (t.dim() != 0)
            type_error("full: fill_value must be a number or a 0-d tensor, got a tensor " + t.type_str());
          inferred = t.dtype() == DType::boolean ? DType::boolean : is_integral(t.dtype()) ? DType::i64 : DType::f32;
        }
        const TensorOptions o = options(dtype, device, false, inferred);
        return finish(full(s, fill_value(o.dtype, fill_value_, "full: fill_value"), o), rg);
      },
      nb::arg("size"), nb::arg("fill_value"), nb::kw_only(), nb::arg("dtype") = nb::none(),
      nb::arg("device") = nb::none(), nb::arg("requires_grad") = false);
  m.def(
      "randint",
      [](nb::handle low_, nb::handle high_, nb::handle size, nb::handle dtype, nb::handle device) {
        const int64_t low = to_int64(low_, "randint: low"), high = to_int64(high_, "randint: high");
        // The range in 128 bits: high - low overflows int64 for a range wider than 2^63.
        if (high <= low || __int128(high) - low > (__int128(1) << 24))
          value_error("randint: need low < high and high - low <= 2^24, got [" + std::to_string(low) + ", " +
                      std::to_string(high) + ")");
        return randint(low, high, Shape(to_dims(size, "size")), options(dtype, device, false, DType::i64));
      },
      nb::arg("low"), nb::arg("high"), nb::arg("size"), nb::kw_only(), nb::arg("dtype") = nb::none(),
      nb::arg("device") = nb::none(), "Integers uniform in [low, high).");
  m.def(
      "normal",
      [](double mean, double std, nb::handle size, nb::handle dtype, nb::handle device) {
        return normal(Shape(to_dims(size, "size")), mean, std, options(dtype, device, false));
      },
      nb::arg("mean"), nb::arg("std"), nb::arg("size"), nb::kw_only(), nb::arg("dtype") = nb::none(),
      nb::arg("device") = nb::none());
  m.def(
      "uniform",
      [](double low, double high, nb::handle size, nb::handle dtype, nb::handle device) {
        return uniform(Shape(to_dims(size, "size")), low, high, options(dtype, device, false));
      },
      nb::arg("low"), nb::arg("high"), nb::arg("size"), nb::kw_only(), nb::arg("dtype") = nb::none(),
      nb::arg("device") = nb::none(), "Uniform in [low, high), from the default Philox stream.");
  m.def(
      "sum_to", [](const Tensor& x, nb::handle shape) { return sum_to(x, Shape(to_dims(shape, "shape"))); },
      nb::arg("input"), nb::arg("shape"));
  m.def(
      "bernoulli",
      [](nb::handle size, double p, nb::handle dtype, nb::handle device) {
        return bernoulli(Shape(to_dims(size, "size")), p, options(dtype, device, false));
      },
      nb::arg("size"), nb::arg("p"), nb::kw_only(), nb::arg("dtype") = nb::none(), nb::arg("device") = nb::none());
  auto like = [&](const char* name, auto make) {
    m.def(
        name,
        [make](const Tensor& t, nb::handle dtype, nb::handle device, bool rg) {
          TensorOptions o(t.dtype(), t.device());
          if (!dtype.is_none()) o.dtype = to_dtype(dtype);
          if (!device.is_none()) o.device = to_device(device);
          return finish(make(t.shape(), o), rg);
        },
        nb::arg("input"), nb::kw_only(), nb::arg("dtype") = nb::none(), nb::arg("device") = nb::none(),
        nb::arg("requires_grad") = false);
  };
  like("zeros_like", [](const Shape& s, TensorOptions o) { return zeros(s, o); });
  like("ones_like", [](const Shape& s, TensorOptions o) { return ones(s, o); });
  like("empty_like", [](const Shape& s, TensorOptions o) { return empty(s, o); });
  like("rand_like", [](const Shape& s, TensorOptions o) { return rand(s, o); });
  like("randn_like", [](const Shape& s, TensorOptions o) { return randn(s, o); });
  m.def(
      "full_like",
      [](const Tensor& t, nb::handle v, nb::handle dtype, nb::handle device) {
        TensorOptions o(t.dtype(), t.device());
        if (!dtype.is_none()) o.dtype = to_dtype(dtype);
        if (!device.is_none()) o.device = to_device(device);
        return full(t.shape(), fill_value(o.dtype, v, "full_like: fill_value"), o);
      },
      nb::arg("input"), nb::arg("fill_value"), nb::kw_only(), nb::arg("dtype") = nb::none(),
      nb::arg("device") = nb::none());
  m.def(
      "arange",
      [](nb::handle start, nb::handle end, nb::handle step, nb::handle dtype, nb::handle device, bool rg) {
        if (end.is_none()) {
          end = start;
          start = nb::int_(0);
        }
        // As torch: integers give int64, a float anywhere gives the default float dtype (float32).
        const bool ints = int_like(start) && int_like(end) && int_like(step);
        const DType dt = dtype.is_none() ? (ints ? DType::i64 : DType::f32) : to_dtype(dtype);
        const TensorOptions o = options(nb::none(), device, false, dt);
        if (ints && is_integral(dt) && dt != DType::boolean) {
          // In integers: start + i * step is exact for any int64 (a double holds 53 bits).
          const int64_t s0 = to_int64(start, "start"), e = to_int64(end, "end"), st = to_int64(step, "step");
          if (st == 0) value_error("arange: step must be nonzero");
          const __int128 span = __int128(e) - s0;
          __int128 n = span / st;
          if (n * st != span) ++n;  // ceil: span and st have the same sign when n > 0
          // As torch (and the engine's arange): a step leading away from the end is an error.
          if (n < 0)
            value_error("arange: the step " + std::to_string(st) + " leads from start " + std::to_string(s0) +
                        " away from end " + std::to_string(e) +
                        " (upper bound and lower bound inconsistent with step sign)");
          Tensor t;
          {
            R r;
            t = add(mul(arange(int64_t(n), TensorOptions(DType::i64)), int64_scalar(st)), int64_scalar(s0));
            if (dt != DType::i64) t = t.to(dt);
            if (o.device != kCPU) t = t.to(o.device);
          }
          return finish(t, rg);
        }
        const double s0 = to_double(start, "start"), e = to_double(end, "end"), st = to_double(step, "step");
        R r;
        return finish(arange(s0, e, st, o), rg);
      },
      nb::arg("start"), nb::arg("end").none() = nb::none(), nb::arg("step") = 1, nb::kw_only(),
      nb::arg("dtype") = nb::none(), nb::arg("device") = nb::none(), nb::arg("requires_grad") = false);
  m.def(
      "eye",
      [](int64_t n, std::optional<int64_t> mm, nb::handle dtype, nb::handle device) {
        return eye(n, mm ? *mm : -1, options(dtype, device, false));
      },
      nb::arg("n"), nb::arg("m") = nb::none(), nb::kw_only(), nb::arg("dtype") = nb::none(),
      nb::arg("device") = nb::none());
  m.def(
      "scalar_tensor",
      [](double v, nb::handle dtype, nb::handle device) { return scalar_tensor(v, options(dtype, device, false)); },
      nb::arg("value"), nb::kw_only(), nb::arg("dtype") = nb::none(), nb::arg("device") = nb::none());

  // ---- elementwise ----
  unary(m, "neg", [](const Tensor& x) { return neg(x); });
  unary(m, "abs", [](const Tensor& x) { return abs(x); });
  unary(m, "sign", [](const Tensor& x) { return sign(x); });
  unary(m, "exp", [](const Tensor& x) { return exp(x); });
  unary(m, "log", [](const Tensor& x) { return log(x); });
  unary(m, "sqrt", [](const Tensor& x) { return sqrt(x); });
  unary(m, "rsqrt", [](const Tensor& x) { return rsqrt(x); });
  unary(m, "tanh", [](const Tensor& x) { return tanh(x); });
  unary(m, "sigmoid", [](const Tensor& x) { return sigmoid(x); });
  m.def(
      "relu",
      [](Tensor& x, bool inplace) {
        return activation_out("relu", x, inplace, [](const Tensor& t) { return relu(t); });
      },
      nb::arg("input"), nb::arg("inplace") = false);
  unary(m, "sin", [](const Tensor& x) { return sin(x); });
  unary(m, "cos", [](const Tensor& x) { return cos(x); });
  unary(m, "tan", [](const Tensor& x) { return tan(x); });
  unary(m, "asin", [](const Tensor& x) { return asin(x); });
  unary(m, "acos", [](const Tensor& x) { return acos(x); });
  unary(m, "atan", [](const Tensor& x) { return atan(x); });
  unary(m, "sinh", [](const Tensor& x) { return sinh(x); });
  unary(m, "cosh", [](const Tensor& x) { return cosh(x); });
  unary(m, "asinh", [](const Tensor& x) { return asinh(x); });
  unary(m, "acosh", [](const Tensor& x) { return acosh(x); });
  unary(m, "atanh", [](const Tensor& x) { return atanh(x); });
  unary(m, "erf", [](const Tensor& x) { return erf(x); });
  unary(m, "erfc", [](const Tensor& x) { return erfc(x); });
  unary(m, "erfinv", [](const Tensor& x) { return erfinv(x); });
  unary(m, "log1p", [](const Tensor& x) { return log1p(x); });
  unary(m, "lgamma", [](const Tensor& x) { return lgamma(x); });
  unary(m, "digamma", [](const Tensor& x) { return digamma(x); });
  m.def(
      "polygamma", [](int64_t n, const Tensor& x) { return polygamma(n, x); }, nb::arg("n"), nb::arg("input"), nogil);
  unary(m, "i0", [](const Tensor& x) { return i0(x); });
  unary(m, "i0e", [](const Tensor& x) { return i0e(x); });
  unary(m, "i1", [](const Tensor& x) { return i1(x); });
  unary(m, "i1e", [](const Tensor& x) { return i1e(x); });
  unary(m, "ndtri", [](const Tensor& x) { return ndtri(x); });
  unary(m, "log_ndtr", [](const Tensor& x) { return log_ndtr(x); });
  unary(m, "erfcx", [](const Tensor& x) { return erfcx(x); });
  unary(m, "expm1", [](const Tensor& x) { return expm1(x); });
  unary(m, "log2", [](const Tensor& x) { return log2(x); });
  unary(m, "log10", [](const Tensor& x) { return log10(x); });
  unary(m, "exp2", [](const Tensor& x) { return exp2(x); });
  unary(m, "reciprocal", [](const Tensor& x) { return reciprocal(x); });
  unary(m, "floor", [](const Tensor& x) { return floor(x); });
  unary(m, "ceil", [](const Tensor& x) { return ceil(x); });
  m.def(
      "round",
      [](const Tensor& x, int64_t decimals) {
        if (decimals == 0) return round(x);
        // torch's: half to even at the given decimal place, x * 10^n rounded then divided by it (x / 10^-n
        // rounded then multiplied, for n < 0), in x's dtype, but f16/bf16 in float32 (its opmath type) and
        // rounded back once: in 16 bits f16 1234.5 * 100 overflows to inf; it has no such kernel for integers
        KILN_CHECK(is_floating(x.dtype()), "round: decimals=", decimals, " needs a floating tensor, got ", x.type_str(),
                   " (torch has none for integers either); convert it first, e.g. x.float().round(decimals=", decimals,
                   ")");
        const double ten_pow = std::pow(10.0, double(decimals > 0 ? decimals : -decimals));
        const bool half = x.dtype() == DType::f16 || x.dtype() == DType::bf16;
        const Tensor xo = half ? x.to(DType::f32) : x;
        Tensor y = decimals > 0 ? round(xo * ten_pow) / ten_pow : round(xo / ten_pow) * ten_pow;
        return half ? y.to(x.dtype()) : y;
      },
      nb::arg("input"), nb::kw_only(), nb::arg("decimals") = 0, nogil,
      "Rounds half to even; decimals= rounds to that many decimal places (negative: to tens, hundreds, ...), "
      "as torch.round.");
  unary(m, "trunc", [](const Tensor& x) { return trunc(x); });
  unary(m, "frac", [](const Tensor& x) { return frac(x); });
  unary(m, "isnan", [](const Tensor& x) { return isnan(x); });
  unary(m, "isinf", [](const Tensor& x) { return isinf(x); });
  unary(m, "isfinite", [](const Tensor& x) { return isfinite(x); });
  unary(m, "logical_not", [](const Tensor& x) { return logical_not(x); });
  m.def(
      "gelu",
      [](const Tensor& x, const std::string& approximate) {
        if (approximate != "none" && approximate != "tanh")
          value_error("gelu: approximate must be \"none\" or \"tanh\", got \"" + approximate + "\"");
        R r;
        return gelu(x, approximate == "tanh" ? GeluApprox::tanh : GeluApprox::none);
      },
      nb::arg("input"), nb::arg("approximate") = "none");

  m.def(
      "add",
      [](const Tensor& a, nb::handle b, nb::handle alpha_h) {
        if (const auto v = number_beside_16bit(b, a, "other")) {
          const double alpha = alpha_arg(alpha_h, a.dtype(), "add");
          R r;
          return a + *v * alpha;
        }
        const Tensor t = operand(b, a);
        const double alpha = alpha_arg(alpha_h, result_type(a, t), "add");
        R r;
        return add(a, t, alpha);
      },
      nb::arg("input"), nb::arg("other"), nb::kw_only(), nb::arg("alpha") = 1, "input + alpha * other");
  m.def(
      "sub",
      [](const Tensor& a, nb::handle b, nb::handle alpha_h) {
        if (const auto v = number_beside_16bit(b, a, "other")) {
          const double alpha = alpha_arg(alpha_h, a.dtype(), "sub", true);
          R r;
          return a - *v * alpha;
        }
        const Tensor t = operand(b, a);
        const double alpha = alpha_arg(alpha_h, result_type(a, t), "sub", true);
        R r;
        return sub(a, t, alpha);
      },
      nb::arg("input"), nb::arg("other"), nb::kw_only(), nb::arg("alpha") = 1, "input - alpha * other");
  m.def(
      "mul",
      [](const Tensor& a, nb::handle b) {
        if (const auto v = number_beside_16bit(b, a, "other")) {
          R r;
          return a * *v;
        }
        const Tensor t = operand(b, a);
        R r;
        return mul(a, t);
      },
      nb::arg("input"), nb::arg("other"));
  m.def(
      "div",
      [](const Tensor& a, nb::handle b, std::optional<std::string> rounding_mode) {
        if (const auto v = number_beside_16bit(b, a, "other"); v && !rounding_mode) {
          R r;
          return a / *v;
        }
        // Without a rounding mode, a number beside an integer tensor divides as x / n does (to_tensor
        // would wrap it into x's dtype: i8 x.div(300) divided by 44); floor and trunc wrap it, as torch's.
        if (!rounding_mode)
          if (std::optional<Tensor> q = divide_by_number(a, b, false)) return *q;
        const Tensor t = operand(b, a);
        if (rounding_mode && *rounding_mode != "trunc" && *rounding_mode != "floor")
          value_error("div: rounding_mode must be None, 'trunc' or 'floor', got '" + *rounding_mode + "'");
        R r;
        if (!rounding_mode) return div(a, t);
        return *rounding_mode == "trunc" ? div_trunc(a, t) : floor_divide(a, t);
      },
      nb::arg("input"), nb::arg("other"), nb::kw_only(), nb::arg("rounding_mode") = nb::none());
  binary_fn(m, "floor_divide", [](const Tensor& a, const Tensor& b) { return floor_divide(a, b); });
  m.def(
      "pow", [](const Tensor& a, nb::handle b) { return pow_operand(a, b); }, nb::arg("input"), nb::arg("exponent"));
  binary_fn(m, "fmod", [](const Tensor& a, const Tensor& b) { return fmod(a, b); });
  binary_fn(m, "remainder", [](const Tensor& a, const Tensor& b) { return remainder(a, b); });
  binary_fn(m, "atan2", [](const Tensor& a, const Tensor& b) { return atan2(a, b); });
  binary_fn(m, "maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); });
  binary_fn(m, "minimum", [](const Tensor& a, const Tensor& b) { return minimum(a, b); });
  binary_fn(m, "eq", [](const Tensor& a, const Tensor& b) { return eq(a, b); });
  binary_fn(m, "ne", [](const Tensor& a, const Tensor& b) { return ne(a, b); });
  binary_fn(m, "lt", [](const Tensor& a, const Tensor& b) { return lt(a, b); });
  binary_fn(m, "le", [](const Tensor& a, const Tensor& b) { return le(a, b); });
  binary_fn(m, "gt", [](const Tensor& a, const Tensor& b) { return gt(a, b); });
  binary_fn(m, "ge", [](const Tensor& a, const Tensor& b) { return ge(a, b); });
  binary_fn(m, "logical_and", [](const Tensor& a, const Tensor& b) { return logical_and(a, b); });
  binary_fn(m, "logical_or", [](const Tensor& a, const Tensor& b) { return logical_or(a, b); });
  binary_fn(m, "matmul", [](const Tensor& a, const Tensor& b) { return matmul(a, b); });
  m.def(
      "result_type",
      [](nb::handle a, nb::handle b) {
        const auto [ta, tb] = operand_pair(a, b, "tensor1", "tensor2");
        return result_type(ta, tb);
      },
      nb::arg("tensor1"), nb::arg("tensor2"),
      "The dtype a binary op on these operands computes in (a 0-dim tensor counts only by its category).");
  m.def(
      "where",
      [](const Tensor& c, nb::handle a, nb::handle b) {
        if (nb::isinstance<Tensor>(a)) check_where_number(b, nb::cast<const Tensor&>(a), "other");
        if (nb::isinstance<Tensor>(b)) check_where_number(a, nb::cast<const Tensor&>(b), "input");
        const auto [ta, tb] = operand_pair(a, b, "input", "other");
        R r;
        return where(c, ta, tb);
      },
      nb::arg("condition"), nb::arg("input"), nb::arg("other"));
  m.def(
      "clamp",
      [](const Tensor& x, nb::handle lo, nb::handle hi) {
        if (lo.is_none() && hi.is_none())  // as torch: a clamp that bounds nothing is a mistake, not a copy
          value_error("clamp: give min or max (or both); neither bound was given");
        const bool tensors = nb::isinstance<Tensor>(lo) || nb::isinstance<Tensor>(hi);
        if (tensors) {
          const Tensor tl = lo.is_none() ? Tensor() : to_tensor(lo, &x, "min");
          const Tensor th = hi.is_none() ? Tensor() : to_tensor(hi, &x, "max");
          // A bool x is clamped in the bounds' promoted dtype, as torch's (the engine has no bool clamp):
          // clamp(mask, tensor(0.5)) is f32.
          DType dt = x.dtype();
          if (dt == DType::boolean)
            for (const Tensor& b : {tl, th})
              if (b.defined()) dt = promote_types(dt, result_type(x, b));
          R r;
          return clamp(dt == x.dtype() ? x : x.to(dt), tl, th);
        }
        std::optional<double> l, h;
        if (!lo.is_none()) l = nb::cast<double>(lo);
        if (!hi.is_none()) h = nb::cast<double>(hi);
        // in the promoted dtype: clamp(x_i8, 0.5, 2.5) stayed i8, its bounds rounded inward; torch's is f32
        const DType dt = clamp_dtype(x, lo, hi);
        R r;
        return clamp(dt == x.dtype() ? x : x.to(dt), l, h);
      },
      nb::arg("input"), nb::arg("min") = nb::none(), nb::arg("max") = nb::none());
  m.def(
      "nan_to_num",
      [](const Tensor& x, double nan, std::optional<double> posinf, std::optional<double> neginf) {
        return nan_to_num(x, nan, posinf, neginf);
      },
      nb::arg("input"), nb::arg("nan") = 0.0, nb::arg("posinf") = nb::none(), nb::arg("neginf") = nb::none(), nogil);
  m.def(
      "lerp",
      [](const Tensor& a, const Tensor& b, nb::handle w) {
        if (nb::isinstance<Tensor>(w)) {
          const Tensor tw = nb::cast<Tensor>(w);
          R r;
          return lerp(a, b, tw);
        }
        const double v = nb::cast<double>(w);
        R r;
        return lerp(a, b, v);
      },
      nb::arg("input"), nb::arg("end"), nb::arg("weight"));
  m.def("addcmul", &addcmul, nb::arg("input"), nb::arg("tensor1"), nb::arg("tensor2"), nb::kw_only(),
        nb::arg("value") = 1.0, nogil);
  m.def("addcdiv", &addcdiv, nb::arg("input"), nb::arg("tensor1"), nb::arg("tensor2"), nb::kw_only(),
        nb::arg("value") = 1.0, nogil);

  // ---- reductions ----
  auto reduce = [&](const char* name, Tensor (*fn)(const Tensor&, const std::vector<int64_t>&, bool)) {
    m.def(
        name,
        [fn](const Tensor& x, nb::handle dim, bool keepdim) {
          const std::vector<int64_t> d = to_dims(dim);
          R r;
          return fn(x, d, keepdim);
        },
        nb::arg("input"), nb::arg("dim") = nb::none(), nb::arg("keepdim") = false);
  };
  reduce("sum", [](const Tensor& x, const std::vector<int64_t>& d, bool k) { return sum(x, d, k); });
  reduce("mean", [](const Tensor& x, const std::vector<int64_t>& d, bool k) { return mean(x, d, k); });
  reduce("amax", [](const Tensor& x, const std::vector<int64_t>& d, bool k) { return amax(x, d, k); });
  reduce("amin", [](const Tensor& x, const std::vector<int64_t>& d, bool k) { return amin(x, d, k); });
  reduce("logsumexp", [](const Tensor& x, const std::vector<int64_t>& d, bool k) { return logsumexp(x, d, k); });
  reduce("any", [](const Tensor& x, const std::vector<int64_t>& d, bool k) { return any(x, d, k); });
  reduce("all", [](const Tensor& x, const std::vector<int64_t>& d, bool k) { return all(x, d, k); });
  reduce("prod", [](const Tensor& x, const std::vector<int64_t>& d, bool k) { return prod(x, d, k); });
  m.def(
      "count_nonzero", [](const Tensor& x, nb::handle dim) { return count_nonzero(x, to_dims(dim)); }, nb::arg("input"),
      nb::arg("dim") = nb::none());
  auto varlike = [&](const char* name, Tensor (*fn)(const Tensor&, const std::vector<int64_t>&, int64_t, bool)) {
    m.def(
        name,
        [fn](const Tensor& x, nb::handle dim, std::optional<bool> unbiased, std::optional<int64_t> correction,
             bool keepdim) {
          int64_t c = 1;
          if (correction)
            c = *correction;
          else if (unbiased)
            c = *unbiased ? 1 : 0;
          const std::vector<int64_t> d = to_dims(dim);
          R r;
          return fn(x, d, c, keepdim);
        },
        nb::arg("input"), nb::arg("dim") = nb::none(), nb::arg("unbiased") = nb::none(), nb::kw_only(),
        nb::arg("correction") = nb::none(), nb::arg("keepdim") = false);
  };
  varlike("var", [](const Tensor& x, const std::vector<int64_t>& d, int64_t c, bool k) { return var(x, d, c, k); });
  varlike("std", [](const Tensor& x, const std::vector<int64_t>& d, int64_t c, bool k) { return stddev(x, d, c, k); });
  m.def(
      "norm",
      [](const Tensor& x, nb::handle p, nb::handle dim, bool keepdim) {
        double pv = 2.0;
        if (nb::isinstance<nb::str>(p)) {
          const std::string s = nb::cast<std::string>(p);
          if (s != "fro") value_error("norm: p must be a number, inf or \"fro\", got \"" + s + "\"");
        } else if (!p.is_none()) {
          pv = nb::cast<double>(p);
        }
        const std::vector<int64_t> d = to_dims(dim);
        R r;
        return norm(x, pv, d, keepdim);
      },
      nb::arg("input"), nb::arg("p") = "fro", nb::arg("dim") = nb::none(), nb::arg("keepdim") = false);
  auto maxmin = [&](const char* name, bool is_max) {
    m.def(
        name,
        [name, is_max](const Tensor& x, std::optional<int64_t> dim, bool keepdim) -> nb::object {
          // An empty tensor has no largest element: refused as torch (and as max(x, 0) over an empty dim).
          if (!dim && x.numel() == 0)
            value_error(std::string(name) + "(): the tensor " + x.type_str() + " is empty, so it has no " +
                        (is_max ? "largest" : "smallest") +
                        " element");
          // The GIL let go for the kernel only: the result is made with it held.
          if (!dim) return nogil_result([&] { return is_max ? amax(x, {}, false) : amin(x, {}, false); });
          return nogil_result([&] { return is_max ? max(x, *dim, keepdim) : min(x, *dim, keepdim); });
        },
        nb::arg("input"), nb::arg("dim") = nb::none(), nb::arg("keepdim") = false,
        "Without dim: the largest (smallest) element. With dim: (values, indices) along it.");
  };
  maxmin("max", true);
  maxmin("min", false);
  m.def(
      "argmax",
      [](const Tensor& x, std::optional<int64_t> dim, bool keepdim) {
        return dim ? argmax(x, *dim, keepdim) : argmax(x);
      },
      nb::arg("input"), nb::arg("dim") = nb::none(), nb::arg("keepdim") = false, nogil);
  m.def(
      "argmin",
      [](const Tensor& x, std::optional<int64_t> dim, bool keepdim) {
        return dim ? argmin(x, *dim, keepdim) : argmin(x.reshape({-1}), 0, false);
      },
      nb::arg("input"), nb::arg("dim") = nb::none(), nb::arg("keepdim") = false, nogil);

  // ---- scans and sorting ----
  m.def("cumsum", &cumsum, nb::arg("input"), nb::arg("dim"), nogil);
  m.def("cumprod", &cumprod, nb::arg("input"), nb::arg("dim"), nogil);
  m.def(
      "cummax", [](const Tensor& x, int64_t d) { return nogil_result([&] { return cummax(x, d); }); }, nb::arg("input"),
      nb::arg("dim"));
  m.def(
      "cummin", [](const Tensor& x, int64_t d) { return nogil_result([&] { return cummin(x, d); }); }, nb::arg("input"),
      nb::arg("dim"));
  m.def(
      "sort",
      [](const Tensor& x, int64_t d, bool desc, std::optional<bool>) {
        return nogil_result([&] { return sort(x, d, desc); });
      },
      nb::arg("input"), nb::arg("dim") = -1, nb::arg("descending") = false, nb::kw_only(),
      nb::arg("stable") = nb::none(),
      "Sorts along dim: (values, indices). Always stable (equal values keep their order, NaN last ascending, first "
      "descending), so torch's stable=True is what every call gives; stable=False is taken too.");
  m.def(
      "argsort", [](const Tensor& x, int64_t d, bool desc, bool) { return argsort(x, d, desc); }, nb::arg("input"),
      nb::arg("dim") = -1, nb::arg("descending") = false, nb::kw_only(), nb::arg("stable") = false, nogil,
      "The indices that sort x along dim; always stable (equal values keep their order), as torch's stable=True.");
  m.def(
      "topk",
      [](const Tensor& x, int64_t k, int64_t d, bool largest) {
        return nogil_result([&] { return topk(x, k, d, largest); });
      },
      nb::arg("input"), nb::arg("k"), nb::arg("dim") = -1, nb::arg("largest") = true);
  m.def(
      "kthvalue",
      [](const Tensor& x, int64_t k, int64_t d, bool keep) {
        return nogil_result([&] { return kthvalue(x, k, d, keep); });
      },
      nb::arg("input"), nb::arg("k"), nb::arg("dim") = -1, nb::arg("keepdim") = false);
  m.def(
      "median",
      [](const Tensor& x, std::optional<int64_t> d, bool keep) -> nb::object {
        if (!d) return nogil_result([&] { return median(x); });
        return nogil_result([&] { return median(x, *d, keep); });
      },
      nb::arg("input"), nb::arg("dim") = nb::none(), nb::arg("keepdim") = false);
  m.def(
      "mode", [](const Tensor& x, int64_t d, bool keep) { return nogil_result([&] { return mode(x, d, keep); }); },
      nb::arg("input"), nb::arg("dim") = -1, nb::arg("keepdim") = false);

  // ---- linear algebra ----
  m.def(
      "einsum",
      [](const std::string& eq, nb::args ops) {
        std::vector<Tensor> ts;
        if (ops.size() == 1 && !nb::isinstance<Tensor>(ops[0]))
          ts = nb::cast<std::vector<Tensor>>(ops[0]);
        else
          ts = nb::cast<std::vector<Tensor>>(ops);
        R r;
        return einsum(eq, ts);
      },
      nb::arg("equation"), nb::arg("operands"));

  // ---- shapes, indices ----
  m.def("cat", &cat, nb::arg("tensors"), nb::arg("dim") = 0, nogil);
  m.def("stack", &stack, nb::arg("tensors"), nb::arg("dim") = 0, nogil);
  m.def(
      "split", [](const Tensor& x, int64_t size, int64_t dim) { return split(x, size, dim); }, nb::arg("tensor"),
      nb::arg("split_size"), nb::arg("dim") = 0, nogil);
  m.def("chunk", &chunk, nb::arg("input"), nb::arg("chunks"), nb::arg("dim") = 0, nogil);
  m.def("unbind", &unbind, nb::arg("input"), nb::arg("dim") = 0, nogil);
  m.def("diagonal", &diagonal, nb::arg("input"), nb::arg("offset") = 0, nb::arg("dim1") = 0, nb::arg("dim2") = 1,
        nogil);
  m.def("index_select", &index_select, nb::arg("input"), nb::arg("dim"), nb::arg("index"), nogil);
  m.def("gather", &gather, nb::arg("input"), nb::arg("dim"), nb::arg("index"), nogil);
  m.def(
      "scatter",
      [](const Tensor& x, int64_t dim, const Tensor& idx, const Tensor& src, std::optional<std::string> reduce) {
        // torch.scatter's reduce: "add" and "multiply" combine with the input's values.
        if (reduce && *reduce != "add" && *reduce != "multiply")
          value_error("scatter: reduce must be \"add\" or \"multiply\", got \"" + *reduce + "\"");
        R g;
        if (!reduce) return scatter(x, dim, idx, src);
        return scatter_reduce(x, dim, idx, src, *reduce == "add" ? ScatterReduce::sum : ScatterReduce::prod, true);
      },
      nb::arg("input"), nb::arg("dim"), nb::arg("index"), nb::arg("src"), nb::kw_only(),
      nb::arg("reduce") = nb::none());
  m.def("scatter_add", &scatter_add, nb::arg("input"), nb::arg("dim"), nb::arg("index"), nb::arg("src"), nogil);
  m.def(
      "scatter_reduce",
      [](const Tensor& x, int64_t dim, const Tensor& idx, const Tensor& src, const std::string& reduce,
         bool include_self) {
        ScatterReduce r;
        if (reduce == "sum")
          r = ScatterReduce::sum;
        else if (reduce == "prod")
          r = ScatterReduce::prod;
        else if (reduce == "mean")
          r = ScatterReduce::mean;
        else if (reduce == "amax")
          r = ScatterReduce::amax;
        else if (reduce == "amin")
          r = ScatterReduce::amin;
        else
          value_error("scatter_reduce: reduce must be sum, prod, mean, amax or amin, got \"" + reduce + "\"");
        R g;
        return scatter_reduce(x, dim, idx, src, r, include_self);
      },
      nb::arg("input"), nb::arg("dim"), nb::arg("index"), nb::arg("src"), nb::arg("reduce"), nb::kw_only(),
      nb::arg("include_self") = true);
  m.def("take_along_dim", &take_along_dim, nb::arg("input"), nb::arg("indices"), nb::arg("dim"), nogil);
  m.def(
      "one_hot",
      [](const Tensor& idx, int64_t n, const std::string& out_of_range) {
        // Kiln's policy for an index outside [0, num_classes): "error" (torch's) or "zeros" (a row of 0).
        if (out_of_range != "error" && out_of_range != "zeros")
          value_error("one_hot: out_of_range must be \"error\" or \"zeros\", got \"" + out_of_range + "\"");
        R g;
        return one_hot(idx, n, out_of_range == "zeros" ? OutOfRange::zeros : OutOfRange::error);
      },
      nb::arg("tensor"), nb::arg("num_classes"), nb::kw_only(), nb::arg("out_of_range") = "error");
  m.def("nonzero", &nonzero, nb::arg("input"), nogil);
  m.def(
      "masked_fill",
      [](const Tensor& x, const Tensor& mask, nb::handle value) {
        // An int (Python or NumPy) goes exactly, as setitem's (a double held i64 2**53 + 1 as 2**53); a
        // bool, a float or a 0-dim tensor as a number.
        const std::string tn = py_type_name(value);
        const bool is_int = !PyBool_Check(value.ptr()) && tn != "numpy.bool" && tn != "numpy.bool_" &&
                            !nb::isinstance<Tensor>(value) && PyIndex_Check(value.ptr());
        if (is_int) {
          int64_t v = to_int64(value, "masked_fill: value");
          if (x.dtype() == DType::u8 && v >= -255 && v < 0) v += 256;  // wrapped, as torch's (fill_value)
          GilRelease nogil;
          return masked_fill(x, mask, v);
        }
        const double v = fill_value(x.dtype(), value, "masked_fill: value");  // (a 0-d int tensor wraps into u8)
        GilRelease nogil;
        return masked_fill(x, mask, v);
      },
      nb::arg("input"), nb::arg("mask"), nb::arg("value"));
  m.def("masked_scatter", &masked_scatter, nb::arg("input"), nb::arg("mask"), nb::arg("source"), nogil);
  m.def("index_put", &index_put, nb::arg("input"), nb::arg("indices"), nb::arg("values"), nb::arg("accumulate") = false,
        nogil);
  m.def("tril", &tril, nb::arg("input"), nb::arg("diagonal") = 0, nogil);
  m.def("triu", &triu, nb::arg("input"), nb::arg("diagonal") = 0, nogil);
  m.def(
      "flip", [](const Tensor& x, nb::handle dims) { return flip(x, to_dims(dims, "dims")); }, nb::arg("input"),
      nb::arg("dims"));
  m.def(
      "roll",
      [](const Tensor& x, nb::handle shifts, nb::handle dims) {
        // torch.roll: one shift per dim (ints or sequences), or the flattened tensor when dims is None.
        const std::vector<int64_t> sh = to_dims(shifts, "shifts"), ds = to_dims(dims, "dims");
        if (dims.is_none()) {
          if (sh.size() != 1) value_error("roll: without dims, shifts must be one int");
          R r;
          return roll(x.reshape({-1}), sh[0], 0).reshape(x.shape());
        }
        if (sh.size() != ds.size())
          value_error("roll: " + std::to_string(sh.size()) + " shifts for " + std::to_string(ds.size()) + " dims");
        R r;
        Tensor y = x;
        for (size_t i = 0; i < sh.size(); ++i) y = roll(y, sh[i], ds[i]);
        return y;
      },
      nb::arg("input"), nb::arg("shifts"), nb::arg("dims") = nb::none());
  m.def(
      "tile", [](const Tensor& x, nb::handle reps) { return tile(x, to_dims(reps, "dims")); }, nb::arg("input"),
      nb::arg("dims"));
  m.def("broadcast_shapes", [](nb::args shapes) {
    Shape s;
    for (nb::handle h : shapes) s = broadcast_shapes(s, Shape(to_dims(h, "shape")));
    nb::list l;
    for (int64_t v : s) l.append(v);
    return nb::tuple(l);
  });
  m.def("allclose", &allclose, nb::arg("input"), nb::arg("other"), nb::arg("rtol") = 1e-5, nb::arg("atol") = 1e-8,
        nb::arg("equal_nan") = false, nogil);
  m.def("cast", &cast, nb::arg("input"), nb::arg("dtype"), nogil);

  // Bitwise ops on integer and bool tensors, as torch's (the operators are in tensor.cpp).
  binary_fn(m, "bitwise_and", [](const Tensor& a, const Tensor& b) { return bitwise_and(a, b); });
  binary_fn(m, "bitwise_or", [](const Tensor& a, const Tensor& b) { return bitwise_or(a, b); });
  binary_fn(m, "bitwise_xor", [](const Tensor& a, const Tensor& b) { return bitwise_xor(a, b); });
  binary_fn(m, "bitwise_left_shift", [](const Tensor& a, const Tensor& b) { return bitwise_left_shift(a, b); });
  binary_fn(m, "bitwise_right_shift", [](const Tensor& a, const Tensor& b) { return bitwise_right_shift(a, b); });
  unary(m, "bitwise_not", [](const Tensor& x) { return bitwise_not(x); });
}

}  // namespace kiln::py
