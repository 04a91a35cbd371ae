// Tests for the ops of engine/ops.h: every op's forward against a naive double-precision reference
// written here, over dtypes, broadcasting, non-contiguous inputs and type promotion.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "kiln.h"
#include "test_util.h"
#include "tests/int_edges.h"

using namespace kiln;
using kiln::testing::contains;
using kiln::testing::error_of;

namespace {

const DType kFloat[] = {DType::f32, DType::f64, DType::f16, DType::bf16};
const DType kInt[] = {DType::i32, DType::i64, DType::i16, DType::i8};

struct Tol {
  double atol, rtol;
};
Tol tol_for(DType t) {
  switch (t) {
    case DType::f64: return {1e-12, 1e-12};
    case DType::f32: return {1e-5, 1e-5};
    case DType::f16: return {2e-3, 2e-3};
    case DType::bf16: return {1.6e-2, 1.6e-2};
    default: return {0, 0};
  }
}

// The value `v` has after storing it in dtype t (inputs are made exactly representable).
double round_to(double v, DType t) {
  switch (t) {
    case DType::f32: return double(float(v));
    case DType::f16: return double(f16_bits_to_f32(f32_to_f16_bits(float(v))));
    case DType::bf16: return double(bf16_bits_to_f32(f32_to_bf16_bits(float(v))));
    case DType::f64: return v;
    case DType::boolean: return v != 0 ? 1.0 : 0.0;
    default: return std::trunc(v);
  }
}

// A reference array: a shape and row-major values.
struct Ref {
  Shape shape;
  std::vector<double> v;
};

int64_t numel_of(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// Broadcasting written independently of the engine.
Shape bshape(const Shape& a, const Shape& b) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n, 1);
  for (size_t i = 0; i < n; ++i) {
    const int64_t da = i + a.size() >= n ? a[i + a.size() - n] : 1;
    const int64_t db = i + b.size() >= n ? b[i + b.size() - n] : 1;
    REQUIRE((da == db || da == 1 || db == 1));
    out[i] = da == 1 ? db : da;
  }
  return out;
}

std::vector<int64_t> unravel(int64_t flat, const Shape& s) {
  std::vector<int64_t> idx(s.size());
  for (int64_t d = int64_t(s.size()) - 1; d >= 0; --d) {
    idx[size_t(d)] = s[size_t(d)] ? flat % s[size_t(d)] : 0;
    if (s[size_t(d)]) flat /= s[size_t(d)];
  }
  return idx;
}

// Element of r at the index `idx` of a broadcast shape (trailing alignment, size-1 dims repeat).
double bget(const Ref& r, const std::vector<int64_t>& idx) {
  const size_t off = idx.size() - r.shape.size();
  int64_t flat = 0;
  for (size_t d = 0; d < r.shape.size(); ++d) {
    const int64_t i = r.shape[d] == 1 ? 0 : idx[d + off];
    flat = flat * r.shape[d] + i;
  }
  return r.v[size_t(flat)];
}

template <typename F> Ref map1(const Ref& a, F f) {
  Ref out{a.shape, a.v};
  for (double& x : out.v) x = f(x);
  return out;
}

template <typename F> Ref map2(const Ref& a, const Ref& b, F f) {
  Ref out;
  out.shape = bshape(a.shape, b.shape);
  const int64_t n = numel_of(out.shape);
  for (int64_t i = 0; i < n; ++i) {
    const auto idx = unravel(i, out.shape);
    out.v.push_back(f(bget(a, idx), bget(b, idx)));
  }
  return out;
}

template <typename F> Ref map3(const Ref& a, const Ref& b, const Ref& c, F f) {
  Ref out;
  out.shape = bshape(bshape(a.shape, b.shape), c.shape);
  const int64_t n = numel_of(out.shape);
  for (int64_t i = 0; i < n; ++i) {
    const auto idx = unravel(i, out.shape);
    out.v.push_back(f(bget(a, idx), bget(b, idx), bget(c, idx)));
  }
  return out;
}

void expect_close(const Tensor& got, const Ref& want, Tol tol, const std::string& what = "") {
  CAPTURE(what);
  REQUIRE(got.shape() == want.shape);
  const std::vector<double> g = got.to_vector();
  REQUIRE(g.size() == want.v.size());
  int bad = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    const double w = want.v[i];
    bool ok;
    if (std::isnan(w)) {
      ok = std::isnan(g[i]);
    } else if (std::isinf(w)) {
      ok = g[i] == w;
    } else {
      ok = std::abs(g[i] - w) <= tol.atol + tol.rtol * std::abs(w);
    }
    if (!ok && ++bad <= 6)
      FAIL_CHECK(what, ": element ", i, " of ", got.type_str(), ": got ", g[i], " want ", w);
  }
}
void expect_close(const Tensor& got, const Ref& want, DType dt, const std::string& what = "") {
  expect_close(got, want, tol_for(dt), what);
}

enum class Layout { contiguous, transposed, strided, expanded };
const char* layout_name(Layout l) {
  switch (l) {
    case Layout::contiguous: return "contiguous";
    case Layout::transposed: return "transposed";
    case Layout::strided: return "strided";
    case Layout::expanded: return "expanded";
  }
  return "?";
}
bool layout_applies(Layout l, const Shape& s) {
  switch (l) {
    case Layout::contiguous: return true;
    case Layout::transposed: return s.size() >= 2;
    case Layout::strided: return s.size() >= 1;
    case Layout::expanded: return s.size() >= 1 && s[0] > 1;
  }
  return false;
}

struct Gen {
  std::mt19937 rng;
  bool ints_only = false;  // draw small integers even for floating dtypes (to get ties)
  explicit Gen(uint32_t seed) : rng(seed) {}
  // n values in [lo, hi], rounded to dtype t; integers for integral dtypes.
  std::vector<double> values(int64_t n, double lo, double hi, DType t) {
    std::vector<double> v(static_cast<size_t>(n));
    if (is_integral(t) || ints_only) {
      std::uniform_int_distribution<int64_t> d(int64_t(std::ceil(lo)), int64_t(std::floor(hi)));
      for (double& x : v) x = double(d(rng));
      if (t == DType::boolean)
        for (double& x : v) x = x != 0;
    } else {
      std::uniform_real_distribution<double> d(lo, hi);
      for (double& x : v) x = round_to(d(rng), t);
    }
    return v;
  }
  // A tensor of logical shape s and dtype t in the given layout, with its logical values in `ref`.
  // The reference values are known from construction, never read back through the engine.
  Tensor make(const Shape& s, DType t, Layout l, double lo, double hi, Ref& ref) {
    ref.shape = s;
    const int64_t n = numel_of(s);
    switch (l) {
      case Layout::contiguous: {
        ref.v = values(n, lo, hi, t);
        return from_vector(ref.v, s, t);
      }
      case Layout::transposed: {
        ref.v = values(n, lo, hi, t);
        const size_t nd = s.size();
        Shape bs = s;
        std::swap(bs[nd - 1], bs[nd - 2]);
        std::vector<double> base(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) {
          auto idx = unravel(i, s);
          std::swap(idx[nd - 1], idx[nd - 2]);
          int64_t flat = 0;
          for (size_t d = 0; d < nd; ++d) flat = flat * bs[d] + idx[d];
          base[size_t(flat)] = ref.v[size_t(i)];
        }
        return from_vector(base, bs, t).transpose(-1, -2);
      }
      case Layout::strided: {
        ref.v = values(n, lo, hi, t);
        Shape bs = s;
        const int64_t last = s.back();
        bs.back() = 2 * last + 1;
        const double junk = is_integral(t) ? (t == DType::boolean ? 1.0 : 77.0) : std::nan("");
        std::vector<double> base(static_cast<size_t>(numel_of(bs)), junk);
        for (int64_t i = 0; i < n; ++i) {
          const int64_t row = last ? i / last : 0, col = last ? i % last : 0;
          base[size_t(row * (2 * last + 1) + 1 + 2 * col)] = ref.v[size_t(i)];
        }
        return from_vector(base, bs, t).slice(-1, 1, 2 * last + 1, 2);
      }
      case Layout::expanded: {
        Shape bs = s;
        bs[0] = 1;
        const std::vector<double> base = values(numel_of(bs), lo, hi, t);
        ref.v.clear();
        for (int64_t r = 0; r < s[0]; ++r) ref.v.insert(ref.v.end(), base.begin(), base.end());
        return from_vector(base, bs, t).expand(s);
      }
    }
    return Tensor();
  }
};

double gelu_erf_ref(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }
double gelu_tanh_ref(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}
double sigmoid_ref(double x) { return 1.0 / (1.0 + std::exp(-x)); }
double sign_ref(double x) { return x > 0 ? 1.0 : (x < 0 ? -1.0 : 0.0); }

const Shape kShapes[] = {Shape{2, 3}, Shape{3, 1, 4}, Shape{5}, Shape{2, 3, 2, 3}};

}  // namespace

// ---- unary -------------------------------------------------------------------------------------------

TEST_CASE("ops: unary float ops against a double reference, every float dtype and layout") {
  struct Case {
    const char* name;
    std::function<Tensor(const Tensor&)> op;
    std::function<double(double)> ref;
    double lo, hi;
  };
  const std::vector<Case> cases = {
      {"neg", [](const Tensor& x) { return neg(x); }, [](double x) { return -x; }, -3, 3},
      {"unary -", [](const Tensor& x) { return -x; }, [](double x) { return -x; }, -3, 3},
      {"abs", [](const Tensor& x) { return abs(x); }, [](double x) { return std::abs(x); }, -3, 3},
      {"sign", [](const Tensor& x) { return sign(x); }, sign_ref, -3, 3},
      {"exp", [](const Tensor& x) { return exp(x); }, [](double x) { return std::exp(x); }, -3, 3},
      {"log", [](const Tensor& x) { return log(x); }, [](double x) { return std::log(x); }, 0.1, 4},
      {"sqrt", [](const Tensor& x) { return sqrt(x); }, [](double x) { return std::sqrt(x); }, 0, 4},
      {"rsqrt", [](const Tensor& x) { return rsqrt(x); }, [](double x) { return 1 / std::sqrt(x); }, 0.1, 4},
      {"tanh", [](const Tensor& x) { return tanh(x); }, [](double x) { return std::tanh(x); }, -3, 3},
      {"sigmoid", [](const Tensor& x) { return sigmoid(x); }, sigmoid_ref, -6, 6},
      {"relu", [](const Tensor& x) { return relu(x); }, [](double x) { return x <= 0 ? 0.0 : x; }, -3, 3},
      {"gelu", [](const Tensor& x) { return gelu(x); }, gelu_erf_ref, -4, 4},
      {"gelu tanh", [](const Tensor& x) { return gelu(x, GeluApprox::tanh); }, gelu_tanh_ref, -4, 4},
      {"pow 2", [](const Tensor& x) { return pow(x, 2.0); }, [](double x) { return x * x; }, -3, 3},
      {"pow 3", [](const Tensor& x) { return pow(x, 3.0); }, [](double x) { return x * x * x; }, -2, 2},
      {"pow 0.5", [](const Tensor& x) { return pow(x, 0.5); }, [](double x) { return std::sqrt(x); }, 0, 4},
      {"pow -1", [](const Tensor& x) { return pow(x, -1.0); }, [](double x) { return 1 / x; }, 0.5, 3},
      {"pow 0", [](const Tensor& x) { return pow(x, 0.0); }, [](double) { return 1.0; }, -3, 3},
      {"clamp both", [](const Tensor& x) { return clamp(x, -1.0, 0.5); },
       [](double x) { return std::min(std::max(x, -1.0), 0.5); }, -3, 3},
      {"clamp min only", [](const Tensor& x) { return clamp(x, -0.5, std::nullopt); },
       [](double x) { return std::max(x, -0.5); }, -3, 3},
      {"clamp max only", [](const Tensor& x) { return clamp(x, std::nullopt, 0.25); },
       [](double x) { return std::min(x, 0.25); }, -3, 3},
      {"x * 2.5", [](const Tensor& x) { return x * 2.5; }, [](double x) { return x * 2.5; }, -3, 3},
      {"2.5 * x", [](const Tensor& x) { return 2.5 * x; }, [](double x) { return x * 2.5; }, -3, 3},
      {"x + 1.5", [](const Tensor& x) { return x + 1.5; }, [](double x) { return x + 1.5; }, -3, 3},
      {"1.5 + x", [](const Tensor& x) { return 1.5 + x; }, [](double x) { return x + 1.5; }, -3, 3},
      {"x - 0.75", [](const Tensor& x) { return x - 0.75; }, [](double x) { return x - 0.75; }, -3, 3},
      {"2 - x", [](const Tensor& x) { return 2.0 - x; }, [](double x) { return 2 - x; }, -3, 3},
      {"x / 4", [](const Tensor& x) { return x / 4.0; }, [](double x) { return x / 4; }, -3, 3},
      {"3 / x", [](const Tensor& x) { return 3.0 / x; }, [](double x) { return 3 / x; }, 0.5, 3},
  };
  Gen gen(1);
  for (const Case& c : cases) {
    for (DType dt : kFloat) {
      for (const Shape& s : kShapes) {
        for (Layout l : {Layout::contiguous, Layout::transposed, Layout::strided, Layout::expanded}) {
          if (!layout_applies(l, s)) continue;
          Ref in;
          Tensor x = gen.make(s, dt, l, c.lo, c.hi, in);
          Tensor y = c.op(x);
          CHECK_MESSAGE(y.dtype() == dt, std::string(c.name), " ", std::string(dtype_name(dt)));
          // Low-precision results are the f32 result rounded once: compare with the rounded reference.
          Ref want = map1(in, c.ref);
          expect_close(y, want, dt, std::string(c.name) + " " + dtype_name(dt) + " " + layout_name(l));
          // The input is left alone.
          CHECK(x.shape() == s);
        }
      }
    }
  }
}

TEST_CASE("ops: unary ops on integers") {
  Gen gen(2);
  struct Case {
    const char* name;
    std::function<Tensor(const Tensor&)> op;
    std::function<double(double)> ref;
  };
  const std::vector<Case> cases = {
      {"neg", [](const Tensor& x) { return neg(x); }, [](double x) { return -x; }},
      {"abs", [](const Tensor& x) { return abs(x); }, [](double x) { return std::abs(x); }},
      {"sign", [](const Tensor& x) { return sign(x); }, sign_ref},
      {"relu", [](const Tensor& x) { return relu(x); }, [](double x) { return x <= 0 ? 0.0 : x; }},
      {"clamp", [](const Tensor& x) { return clamp(x, -2.0, 3.0); },
       [](double x) { return std::min(std::max(x, -2.0), 3.0); }},
      {"clamp min", [](const Tensor& x) { return clamp(x, 1.0, std::nullopt); },
       [](double x) { return std::max(x, 1.0); }},
      {"clamp max", [](const Tensor& x) { return clamp(x, std::nullopt, -1.0); },
       [](double x) { return std::min(x, -1.0); }},
      {"x * 3", [](const Tensor& x) { return x * 3.0; }, [](double x) { return 3 * x; }},
      {"x + 2", [](const Tensor& x) { return x + 2.0; }, [](double x) { return x + 2; }},
      {"x - 5", [](const Tensor& x) { return x - 5.0; }, [](double x) { return x - 5; }},
      {"10 - x", [](const Tensor& x) { return 10.0 - x; }, [](double x) { return 10 - x; }},
  };
  for (const Case& c : cases)
    for (DType dt : kInt)
      for (Layout l : {Layout::contiguous, Layout::transposed, Layout::strided, Layout::expanded}) {
        Ref in;
        Tensor x = gen.make({3, 4}, dt, l, -9, 9, in);
        Tensor y = c.op(x);
        CHECK_MESSAGE(y.dtype() == dt, std::string(c.name), " ", std::string(dtype_name(dt)));  // integral scalars keep the dtype
        expect_close(y, map1(in, c.ref), Tol{0, 0}, std::string(c.name) + " " + dtype_name(dt) + " " + layout_name(l));
      }
  // u8: the ops that stay in range.
  Ref in;
  Tensor u = gen.make({7}, DType::u8, Layout::strided, 0, 200, in);
  expect_close(abs(u), in, Tol{0, 0}, "abs u8");
  expect_close(relu(u), in, Tol{0, 0}, "relu u8");
  expect_close(clamp(u, 50.0, 150.0), map1(in, [](double x) { return std::min(std::max(x, 50.0), 150.0); }),
               Tol{0, 0}, "clamp u8");
  CHECK(clamp(u, 50.0, 150.0).dtype() == DType::u8);
  // Float math on integers computes in a floating type.
  Tensor xi = from_vector({0, 1, 2, 4}, {4}, DType::i32);
  Tensor e = exp(xi);
  CHECK(is_floating(e.dtype()));
  expect_close(e, Ref{{4}, {1, std::exp(1.0), std::exp(2.0), std::exp(4.0)}}, Tol{1e-4, 1e-6}, "exp i32");
  expect_close(sqrt(xi), Ref{{4}, {0, 1, std::sqrt(2.0), 2}}, Tol{1e-6, 1e-6}, "sqrt i32");
  CHECK(is_floating(sigmoid(xi).dtype()));
}

TEST_CASE("ops: activations and math at special values") {
  Tensor x = from_vector({-1000, -20, -1, 0, 1, 20, 1000}, {7});
  expect_close(sigmoid(x), map1(Ref{{7}, x.to_vector()}, sigmoid_ref), Tol{1e-7, 1e-6}, "sigmoid extremes");
  expect_close(tanh(x), Ref{{7}, {-1, -1, std::tanh(-1.0), 0, std::tanh(1.0), 1, 1}}, Tol{1e-7, 1e-6}, "tanh");
  expect_close(gelu(x), Ref{{7}, {0, gelu_erf_ref(-20), gelu_erf_ref(-1), 0, gelu_erf_ref(1), 20, 1000}},
               Tol{1e-6, 1e-6}, "gelu");
  expect_close(relu(x), Ref{{7}, {0, 0, 0, 0, 1, 20, 1000}}, Tol{0, 0}, "relu");
  Tensor p = from_vector({0, 1, 4}, {3}, DType::f64);
  expect_close(log(p), Ref{{3}, {-std::numeric_limits<double>::infinity(), 0, std::log(4.0)}}, DType::f64, "log 0");
  expect_close(rsqrt(p), Ref{{3}, {std::numeric_limits<double>::infinity(), 1, 0.5}}, DType::f64, "rsqrt 0");
  CHECK(std::isnan(sqrt(from_vector({-1}, {1})).item<double>()));
  CHECK(std::isnan(log(from_vector({-1}, {1})).item<double>()));
  // Known values.
  CHECK(sigmoid(scalar_tensor(0.0)).item<double>() == 0.5);
  CHECK(std::abs(gelu(scalar_tensor(1.0, DType::f64)).item<double>() - 0.8413447460685429) < 1e-12);
  CHECK(std::abs(gelu(scalar_tensor(1.0, DType::f64), GeluApprox::tanh).item<double>() - 0.8411919906082768) < 1e-12);
  CHECK(sign(from_vector({-0.0, 0.0, -2, 3}, {4})).to_vector() == std::vector<double>{0, 0, -1, 1});
}

TEST_CASE("ops: abs(-0.0) is +0.0 in every float dtype") {
  // A sign kept on zero would make 1 / abs(-0.0) = -inf (PyTorch gives +0.0, as fabs).
  for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    INFO(dt);
    const auto v = abs(from_vector({-0.0, 0.0, -2.5, 3}, {4}, dt)).to_vector();
    CHECK(!std::signbit(v[0]));
    CHECK(!std::signbit(v[1]));
    CHECK(v == std::vector<double>{0, 0, 2.5, 3});
    CHECK(reciprocal(abs(from_vector({-0.0}, {1}, dt))).item<double>() == std::numeric_limits<double>::infinity());
  }
}

TEST_CASE("ops: hardswish's gradient at -3 and 3 is PyTorch 2.x's (0 and 1)") {
  // torch.nn.functional.hardswish's backward (2.x): 0 for x <= -3, x / 3 + 1/2 for -3 < x < 3, 1 for x >= 3.
  for (DType dt : {DType::f32, DType::f64}) {
    INFO(dt);
    Tensor x = from_vector({-3.5, -3, -1.5, 0, 1.5, 3, 3.5}, {7}, dt).set_requires_grad();
    sum(hardswish(x)).backward();
    CHECK(x.grad().to_vector() == std::vector<double>{0, 0, 0, 0.5, 1, 1, 1});
  }
}

TEST_CASE("ops: rounding, erfinv, softplus and the NaN tests at their edges") {
  const double inf = std::numeric_limits<double>::infinity();
  // round is half to even; floor/ceil/trunc/frac by hand, negative halves included.
  const Tensor h = from_vector({-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, -1.25}, {7}, DType::f64);
  CHECK(round(h).to_vector() == std::vector<double>{-2, -2, -0, 0, 2, 2, -1});
  CHECK(floor(h).to_vector() == std::vector<double>{-3, -2, -1, 0, 1, 2, -2});
  CHECK(ceil(h).to_vector() == std::vector<double>{-2, -1, -0, 1, 2, 3, -1});
  CHECK(trunc(h).to_vector() == std::vector<double>{-2, -1, -0, 0, 1, 2, -1});
  CHECK(frac(h).to_vector() == std::vector<double>{-0.5, -0.5, -0.5, 0.5, 0.5, 0.5, -0.25});
  // An integer tensor is already whole: the same values and dtype.
  const Tensor i = from_vector({-3, 7}, {2}, DType::i64);
  for (const Tensor& r : {floor(i), ceil(i), round(i), trunc(i)}) {
    CHECK(r.dtype() == DType::i64);
    CHECK(r.to_vector() == std::vector<double>{-3, 7});
  }
  // erfinv: exact at 0, +-inf at +-1, NaN outside; erf(erfinv(x)) = x in f32 and f64.
  for (DType dt : {DType::f32, DType::f64}) {
    const auto e = erfinv(from_vector({0, 1, -1, 1.5}, {4}, dt)).to_vector();
    CHECK(e[0] == 0);
    CHECK(e[1] == inf);
    CHECK(e[2] == -inf);
    CHECK(std::isnan(e[3]));
    const Tensor x = from_vector({-0.999, -0.5, 0.1, 0.9, 0.9999}, {5}, dt);
    const auto back = erf(erfinv(x)).to_vector(), xv = x.to_vector();
    for (size_t k = 0; k < xv.size(); ++k) CHECK(std::abs(back[k] - xv[k]) <= (dt == DType::f32 ? 2e-7 : 1e-15));
  }
  // softplus never overflows and passes x through above the threshold.
  const auto sp = softplus(from_vector({-1000, 0, 30, 1000}, {4})).to_vector();
  CHECK(sp[0] == 0);
  CHECK(std::abs(sp[1] - std::log(2.0)) < 1e-7);
  CHECK(sp[2] == 30);
  CHECK(sp[3] == 1000);
  // nan_to_num's defaults are each dtype's largest and lowest finite values.
  const struct {
    DType dt;
    double big;
  } limits[] = {{DType::f16, 65504.0},
                {DType::bf16, 3.3895313892515355e38},
                {DType::f32, double(std::numeric_limits<float>::max())},
                {DType::f64, std::numeric_limits<double>::max()}};
  for (const auto& l : limits) {
    INFO(l.dt);
    const auto v = nan_to_num(from_vector({std::nan(""), inf, -inf, 2.5}, {4}, l.dt)).to_vector();
    CHECK(v == std::vector<double>{0, l.big, -l.big, 2.5});
    CHECK(isnan(from_vector({std::nan(""), 1}, {2}, l.dt)).to_vector() == std::vector<double>{1, 0});
  }
  CHECK(isfinite(from_vector({1, 2}, {2}, DType::i64)).to_vector() == std::vector<double>{1, 1});
  CHECK(isinf(from_vector({1, 2}, {2}, DType::i32)).to_vector() == std::vector<double>{0, 0});
}

TEST_CASE("ops: reductions over an empty dim give their identity") {
  const Tensor e = zeros({0, 3});
  CHECK(sum(e, {0}).to_vector() == std::vector<double>{0, 0, 0});
  for (double m : mean(e, {0}).to_vector()) CHECK(std::isnan(m));
  CHECK(logsumexp(e, {0}).to_vector() == std::vector<double>(3, -std::numeric_limits<double>::infinity()));
  CHECK(any(e, {0}).to_vector() == std::vector<double>{0, 0, 0});
  CHECK(all(e, {0}).to_vector() == std::vector<double>{1, 1, 1});
  CHECK(count_nonzero(e, {0}).to_vector() == std::vector<double>{0, 0, 0});
  CHECK(norm(e, 2, {0}).to_vector() == std::vector<double>{0, 0, 0});
  // amax/amin (and the inf norm) over nothing have no value: an error naming the op and the shape, as
  // PyTorch's, for every dtype. Over a dim with elements, an empty tensor gives an empty result.
  CHECK_THROWS_WITH_AS(amax(e, {0}), doctest::Contains("amax: cannot reduce over an empty dim of [0,3]"), kiln::Error);
  CHECK_THROWS_WITH_AS(amin(e, {0}), doctest::Contains("amin: cannot reduce over an empty dim"), kiln::Error);
  CHECK_THROWS_WITH_AS(amax(e), doctest::Contains("amax"), kiln::Error);
  CHECK_THROWS_WITH_AS(amax(zeros({0, 3}, TensorOptions(DType::i64)), {0}), doctest::Contains("amax"), kiln::Error);
  CHECK_THROWS_WITH_AS(norm(e, std::numeric_limits<double>::infinity(), {0}), doctest::Contains("norm: the inf norm"),
                       kiln::Error);
  CHECK(amax(e, {1}).shape() == Shape{0});
  // Gradients through an empty reduction are empty, not an error.
  Tensor x = zeros({0, 3}).set_requires_grad();
  sum(amax(x, {1})).backward();
  CHECK(x.grad().shape() == Shape{0, 3});
  Tensor xl = zeros({0, 3}).set_requires_grad();
  sum(logsumexp(xl, {0})).backward();
  CHECK(xl.grad().shape() == Shape{0, 3});
  // logsumexp of a slice of -inf is -inf; of large values, max + log(n) without overflow.
  const double inf = std::numeric_limits<double>::infinity();
  CHECK(logsumexp(from_vector({-inf, -inf}, {2})).item<double>() == -inf);
  CHECK(std::abs(logsumexp(from_vector({1000, 1000}, {2})).item<double>() - (1000 + std::log(2.0))) < 1e-3);
  // The 2-norm's gradient at 0 is 0.
  Tensor z = zeros({3}).set_requires_grad();
  norm(z).backward();
  CHECK(z.grad().to_vector() == std::vector<double>{0, 0, 0});
}

// ---- binary ------------------------------------------------------------------------------------------

namespace {
struct BinCase {
  const char* name;
  std::function<Tensor(const Tensor&, const Tensor&)> op;
  std::function<double(double, double)> ref;
  double alo, ahi, blo, bhi;
};

std::vector<BinCase> arith_cases() {
  return {
      {"add", [](const Tensor& a, const Tensor& b) { return add(a, b); }, [](double a, double b) { return a + b; }, -3, 3, -3, 3},
      {"a + b", [](const Tensor& a, const Tensor& b) { return a + b; }, [](double a, double b) { return a + b; }, -3, 3, -3, 3},
      {"add alpha", [](const Tensor& a, const Tensor& b) { return add(a, b, 2.5); }, [](double a, double b) { return a + 2.5 * b; }, -3, 3, -3, 3},
      {"sub", [](const Tensor& a, const Tensor& b) { return sub(a, b); }, [](double a, double b) { return a - b; }, -3, 3, -3, 3},
      {"a - b", [](const Tensor& a, const Tensor& b) { return a - b; }, [](double a, double b) { return a - b; }, -3, 3, -3, 3},
      {"sub alpha", [](const Tensor& a, const Tensor& b) { return sub(a, b, 0.5); }, [](double a, double b) { return a - 0.5 * b; }, -3, 3, -3, 3},
      {"mul", [](const Tensor& a, const Tensor& b) { return mul(a, b); }, [](double a, double b) { return a * b; }, -3, 3, -3, 3},
      {"a * b", [](const Tensor& a, const Tensor& b) { return a * b; }, [](double a, double b) { return a * b; }, -3, 3, -3, 3},
      {"div", [](const Tensor& a, const Tensor& b) { return div(a, b); }, [](double a, double b) { return a / b; }, -3, 3, 0.5, 3},
      {"a / b", [](const Tensor& a, const Tensor& b) { return a / b; }, [](double a, double b) { return a / b; }, -3, 3, -3, -0.5},
      {"pow", [](const Tensor& a, const Tensor& b) { return pow(a, b); }, [](double a, double b) { return std::pow(a, b); }, 0.5, 2, -2, 2},
      {"maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); }, [](double a, double b) { return std::max(a, b); }, -3, 3, -3, 3},
      {"minimum", [](const Tensor& a, const Tensor& b) { return minimum(a, b); }, [](double a, double b) { return std::min(a, b); }, -3, 3, -3, 3},
  };
}

std::vector<BinCase> compare_cases() {
  return {
      {"eq", [](const Tensor& a, const Tensor& b) { return eq(a, b); }, [](double a, double b) { return double(a == b); }, -1, 2, -1, 2},
      {"ne", [](const Tensor& a, const Tensor& b) { return ne(a, b); }, [](double a, double b) { return double(a != b); }, -1, 2, -1, 2},
      {"lt", [](const Tensor& a, const Tensor& b) { return lt(a, b); }, [](double a, double b) { return double(a < b); }, -1, 2, -1, 2},
      {"le", [](const Tensor& a, const Tensor& b) { return le(a, b); }, [](double a, double b) { return double(a <= b); }, -1, 2, -1, 2},
      {"gt", [](const Tensor& a, const Tensor& b) { return gt(a, b); }, [](double a, double b) { return double(a > b); }, -1, 2, -1, 2},
      {"ge", [](const Tensor& a, const Tensor& b) { return ge(a, b); }, [](double a, double b) { return double(a >= b); }, -1, 2, -1, 2},
      {"logical_and", [](const Tensor& a, const Tensor& b) { return logical_and(a, b); }, [](double a, double b) { return double(a != 0 && b != 0); }, -1, 2, -1, 2},
      {"logical_or", [](const Tensor& a, const Tensor& b) { return logical_or(a, b); }, [](double a, double b) { return double(a != 0 || b != 0); }, -1, 2, -1, 2},
  };
}

struct ShapePair {
  Shape a, b;
};
const ShapePair kPairs[] = {
    {{3, 1, 4}, {2, 1}}, {{2, 3}, {2, 3}}, {{4}, {3, 1}}, {{}, {2, 3}}, {{2, 3}, {}}, {{1}, {5}},
    {{2, 1, 3}, {2, 4, 1}}, {{6, 5}, {5}}, {{}, {}},
};
const std::pair<Layout, Layout> kLayoutPairs[] = {
    {Layout::contiguous, Layout::contiguous}, {Layout::transposed, Layout::strided},
    {Layout::strided, Layout::expanded},      {Layout::expanded, Layout::transposed},
};

// Comparisons of floats computed in a low-precision dtype: the engine rounds inputs to it first.
void run_binary_cases(const std::vector<BinCase>& cases, const std::vector<DType>& dtypes, bool is_compare, Gen& gen) {
  gen.ints_only = is_compare;
  for (const BinCase& c : cases)
    for (DType dt : dtypes)
      for (const ShapePair& sp : kPairs)
        for (auto [la, lb] : kLayoutPairs) {
          if (!layout_applies(la, sp.a) || !layout_applies(lb, sp.b)) continue;
          double alo = c.alo, ahi = c.ahi, blo = c.blo, bhi = c.bhi;
          if (is_integral(dt) && std::string(c.name) == "pow") {
            alo = -3, ahi = 3, blo = 0, bhi = 3;
          }
          if (dt == DType::u8) {  // stay in range of an unsigned byte
            alo = 0, ahi = 9, blo = 0, bhi = 9;
          }
          Ref ra, rb;
          Tensor a = gen.make(sp.a, dt, la, alo, ahi, ra);
          Tensor b = gen.make(sp.b, dt, lb, blo, bhi, rb);
          Tensor y = c.op(a, b);
          const std::string what = std::string(c.name) + " " + dtype_name(dt) + " " + layout_name(la) + "/" +
                                   layout_name(lb);
          CAPTURE(what);
          if (is_compare) {
            CHECK(y.dtype() == DType::boolean);
            expect_close(y, map2(ra, rb, c.ref), Tol{0, 0}, what);
          } else {
            CHECK(y.dtype() == dt);
            Ref want = map2(ra, rb, c.ref);
            if (is_integral(dt)) {
              for (double& v : want.v) v = std::trunc(v);
            }
            expect_close(y, want, dt, what);
          }
        }
}
}  // namespace

TEST_CASE("ops: binary arithmetic with broadcasting and strided inputs, float dtypes") {
  Gen gen(3);
  run_binary_cases(arith_cases(), {DType::f32, DType::f64, DType::f16, DType::bf16}, false, gen);
}

TEST_CASE("ops: broadcast backward through a zero-size output gives the smaller input zeros") {
  // [2, 0, 3] op [1, 3] -> [2, 0, 3]: the output has fewer elements than w, and w's gradient is the
  // sum over nothing (PyTorch: zeros); it tripped the check that a gradient is at least its input's size.
  const std::vector<std::pair<const char*, std::function<Tensor(const Tensor&, const Tensor&)>>> ops = {
      {"add", [](const Tensor& a, const Tensor& b) { return a + b; }},
      {"sub", [](const Tensor& a, const Tensor& b) { return a - b; }},
      {"mul", [](const Tensor& a, const Tensor& b) { return a * b; }},
      {"div", [](const Tensor& a, const Tensor& b) { return a / b; }},
      {"maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); }},
      {"atan2", [](const Tensor& a, const Tensor& b) { return atan2(a, b); }}};
  for (const auto& [name, op] : ops)
    for (bool empty_first : {true, false}) {
      INFO(name, empty_first ? " [2, 0, 3] op [1, 3]" : " [1, 3] op [2, 0, 3]");
      Tensor z = zeros({2, 0, 3}).set_requires_grad(), w = ones({1, 3}).set_requires_grad();
      sum(empty_first ? op(z, w) : op(w, z)).backward();
      REQUIRE(w.grad().defined());
      CHECK(w.grad().shape() == Shape{1, 3});
      CHECK(w.grad().to_vector() == std::vector<double>{0, 0, 0});
      CHECK(z.grad().shape() == Shape{2, 0, 3});
    }
}

TEST_CASE("ops: binary arithmetic on integers") {
  Gen gen(4);
  std::vector<BinCase> cases;
  for (const BinCase& c : arith_cases()) {
    const std::string n = c.name;
    if (n == "div" || n == "a / b") continue;  // tested below
    BinCase ic = c;
    if (n == "add alpha") {
      ic.op = [](const Tensor& a, const Tensor& b) { return add(a, b, 2.0); };
      ic.ref = [](double a, double b) { return a + 2 * b; };
    }
    if (n == "sub alpha") {
      ic.op = [](const Tensor& a, const Tensor& b) { return sub(a, b, 3.0); };
      ic.ref = [](double a, double b) { return a - 3 * b; };
    }
    cases.push_back(ic);
  }
  run_binary_cases(cases, {DType::i32, DType::i64, DType::i16, DType::i8}, false, gen);
  std::vector<BinCase> u8_cases;
  for (const BinCase& c : cases) {
    const std::string n = c.name;
    if (n == "add" || n == "a + b" || n == "mul" || n == "a * b" || n == "maximum" || n == "minimum") u8_cases.push_back(c);
  }
  run_binary_cases(u8_cases, {DType::u8}, false, gen);
}

TEST_CASE("ops: u8, i8 and i16 wrap, divide, cast, promote, reduce and sort as docs/ops.md says") {
  kiln::testing::check_integer_dtypes();
}

TEST_CASE("ops: i32 and i64 wrap at overflow as PyTorch's; INT_MIN / -1 does not trap; a zero divisor is an error") {
  kiln::testing::check_integer_overflow();
}

TEST_CASE("ops: comparisons and logical ops give bool") {
  Gen gen(5);
  run_binary_cases(
      compare_cases(),
      {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64, DType::i16, DType::i8, DType::u8}, true,
      gen);
  Ref r;
  Tensor x = gen.make({4, 3}, DType::f32, Layout::transposed, -1, 1, r);
  Tensor n = logical_not(gt(x, scalar_tensor(0.0)));
  CHECK(n.dtype() == DType::boolean);
  expect_close(n, map1(r, [](double v) { return double(!(v > 0)); }), Tol{0, 0}, "logical_not");
  Tensor ints = from_vector({0, 3, -1, 0}, {4}, DType::i32);
  expect_close(logical_not(ints), Ref{{4}, {1, 0, 0, 1}}, Tol{0, 0}, "logical_not i32");
  CHECK(logical_not(ints).dtype() == DType::boolean);
  // Mixed dtypes compare after promotion.
  expect_close(lt(from_vector({1, 2}, {2}, DType::i32), from_vector({1.5, 1.5}, {2})), Ref{{2}, {1, 0}}, Tol{0, 0},
               "lt i32 f32");
  expect_close(eq(from_vector({1, 0, 1}, {3}, DType::boolean), from_vector({1, 1, 0}, {3}, DType::boolean)),
               Ref{{3}, {1, 0, 0}}, Tol{0, 0}, "eq bool");
  // Comparing with a scalar through scalar_like.
  expect_close(ge(from_vector({1, 2, 3}, {3}, DType::i64), scalar_like(2, from_vector({1}, {1}, DType::i64))),
               Ref{{3}, {0, 1, 1}}, Tol{0, 0}, "ge scalar");
}

TEST_CASE("ops: div_trunc and floor_divide round as C's / and Python's //, integers staying integers") {
  const std::vector<double> a = {7, -7, 7, -7, 0, 6, -6, 5};
  const std::vector<double> b = {2, 2, -2, -2, 3, 3, -3, 1};
  for (DType dt : {DType::i8, DType::i32, DType::i64}) {
    CAPTURE(std::string(dtype_name(dt)));
    const Tensor x = from_vector(a, {8}, dt), y = from_vector(b, {8}, dt);
    CHECK(div_trunc(x, y).dtype() == dt);
    CHECK(div_trunc(x, y).to_vector() == std::vector<double>{3, -3, -3, 3, 0, 2, 2, 5});
    CHECK(floor_divide(x, y).to_vector() == std::vector<double>{3, -4, -4, 3, 0, 2, 2, 5});
    CHECK(contains(error_of([&] { floor_divide(x, zeros({8}, dt)); }), "division by zero"));
  }
  CHECK(floor_divide(from_vector({-128}, {1}, DType::i8), from_vector({-1}, {1}, DType::i8)).to_vector() ==
        std::vector<double>{-128});  // wraps, as PyTorch
  // Floats: Python's 1 // 0.1 is 9 (0.1 is a little above a tenth), not floor(1 / 0.1) = 10.
  const Tensor f = floor_divide(from_vector({1, -1, 7.5, -7.5, 1, -1, 0.5, 0}, {8}, DType::f64),
                                from_vector({0.1, 0.1, 2, 2, 0, 0, -2, -2}, {8}, DType::f64));
  const std::vector<double> v = f.to_vector();
  CHECK(v[0] == 9);
  CHECK(v[1] == -10);
  CHECK(v[2] == 3);
  CHECK(v[3] == -4);
  CHECK(v[4] == INFINITY);
  CHECK(v[5] == -INFINITY);
  CHECK(v[6] == -1);
  CHECK((v[7] == 0 && std::signbit(v[7])));  // 0.0 // -2 is -0.0 in Python: the sign of 0 / -2
  CHECK(div_trunc(from_vector({-7.5}, {1}, DType::f16), from_vector({2}, {1}, DType::f16)).to_vector() ==
        std::vector<double>{-3});
  // The gradient is zero (PyTorch's), with the inputs' shapes.
  Tensor p = from_vector({1, 2, 3}, {3}).set_requires_grad(), q = full({}, 2.0).set_requires_grad();
  sum(floor_divide(p, q)).backward();
  CHECK(p.grad().to_vector() == std::vector<double>{0, 0, 0});
  CHECK(q.grad().dim() == 0);
  CHECK(q.grad().item<double>() == 0);
}

TEST_CASE("ops: integer division, type promotion and scalars") {
  // i32 + f32 -> f32, f16 + bf16 -> f32, i64 + f16 -> f16, u8 + bool -> u8, f32 + f64 -> f64.
  struct P {
    DType a, b, out;
  };
  const P ps[] = {{DType::i32, DType::f32, DType::f32}, {DType::f16, DType::bf16, DType::f32},
                  {DType::i64, DType::f16, DType::f16}, {DType::u8, DType::boolean, DType::u8},
                  {DType::f32, DType::f64, DType::f64}, {DType::i32, DType::i64, DType::i64},
                  {DType::bf16, DType::u8, DType::bf16}, {DType::boolean, DType::i32, DType::i32}};
  for (const P& p : ps) {
    CAPTURE(std::string(dtype_name(p.a)));
    CAPTURE(std::string(dtype_name(p.b)));
    Tensor a = from_vector({1, 2, 3}, {3}, p.a == DType::boolean ? TensorOptions(p.a) : TensorOptions(p.a));
    Tensor b = from_vector({1, 0, 1}, {3}, p.b);
    CHECK(add(a, b).dtype() == p.out);
    CHECK(add(b, a).dtype() == p.out);
    CHECK(mul(a, b).dtype() == p.out);
    CHECK(maximum(a, b).dtype() == p.out);
    const double a0 = p.a == DType::boolean ? 1 : 1, a1 = p.a == DType::boolean ? 1 : 2, a2 = p.a == DType::boolean ? 1 : 3;
    expect_close(add(a, b), Ref{{3}, {a0 + 1, a1 + 0, a2 + 1}}, Tol{0, 0}, "promoted add");
    expect_close(mul(a, b), Ref{{3}, {a0, 0, a2}}, Tol{0, 0}, "promoted mul");
    CHECK(eq(a, b).dtype() == DType::boolean);
  }
  // A 0-dim tensor next to a dimensioned one counts only by category (bool < integer < floating), as
  // PyTorch's result_type: the values as the dimensioned dtype holds them.
  CHECK((ones({2}) + scalar_tensor(1, DType::f64)).dtype() == DType::f32);
  CHECK((ones({2}, DType::i32) + scalar_tensor(1, DType::i64)).dtype() == DType::i32);
  CHECK((scalar_tensor(1, DType::i64) + ones({2}, DType::i32)).dtype() == DType::i32);
  CHECK((full({2}, 100, DType::i8) + scalar_tensor(100, DType::i64)).to_vector() == std::vector<double>{-56, -56});
  CHECK((ones({2}, DType::i8) + scalar_tensor(0.5, DType::f64)).dtype() == DType::f64);  // a higher category
  CHECK((ones({2}, DType::boolean) + scalar_tensor(1, DType::i32)).dtype() == DType::i32);
  CHECK(maximum(ones({2}, DType::f16), scalar_tensor(1, DType::f64)).dtype() == DType::f16);
  CHECK(where(ones({2}, DType::boolean), ones({2}, DType::bf16), scalar_tensor(0, DType::f16)).dtype() == DType::bf16);
  CHECK((scalar_tensor(1, DType::i32) + scalar_tensor(1, DType::i64)).dtype() == DType::i64);  // both 0-dim
  CHECK((ones({1}, DType::i32) + ones({1}, DType::i64)).dtype() == DType::i64);                // both dimensioned
  Tensor h = ones({2}, DType::f16);
  h.add_(scalar_tensor(0.5, DType::f64));  // the result type is f16: allowed in place
  CHECK(h.to_vector() == std::vector<double>{1.5, 1.5});
  CHECK(contains(error_of([] { ones({2}, DType::i64).add_(scalar_tensor(0.5, DType::f32)); }),
                 "the result type f32 cannot be written into i64"));
  // Scalars take a floating tensor's dtype.
  for (DType dt : kFloat) {
    Tensor x = from_vector({1, 2}, {2}, dt);
    CHECK((x * 2.0).dtype() == dt);
    CHECK((2.0 * x).dtype() == dt);
    CHECK((x + 0.1).dtype() == dt);
    CHECK((x / 3.0).dtype() == dt);
    CHECK((1.0 - x).dtype() == dt);
    CHECK(scalar_like(2.5, x).dtype() == dt);
    CHECK(scalar_like(2.5, x).dim() == 0);
  }
  // f16 * 3.1 rounds the scalar to f16 first or computes in f32: either way the result is f16 close to 6.2.
  expect_close(from_vector({2}, {1}, DType::f16) * 3.1, Ref{{1}, {6.2}}, DType::f16, "f16 * 3.1");
  // Integral scalars keep an integer tensor's dtype; fractional ones make it floating.
  Tensor xi = from_vector({1, 2, 3}, {3}, DType::i32);
  CHECK((xi * 2.0).dtype() == DType::i32);
  CHECK((xi + 1.0).dtype() == DType::i32);
  Tensor frac = xi * 2.5;
  CHECK(is_floating(frac.dtype()));
  expect_close(frac, Ref{{3}, {2.5, 5, 7.5}}, Tol{1e-6, 1e-6}, "i32 * 2.5");
  CHECK(scalar_like(3, xi).dtype() == DType::i32);
  // Integer division: int / int gives a floating true quotient.
  Tensor q = div(from_vector({7, -7, 1, 6}, {4}, DType::i32), from_vector({2, 2, 3, -4}, {4}, DType::i32));
  CHECK(is_floating(q.dtype()));
  expect_close(q, Ref{{4}, {3.5, -3.5, 1.0 / 3, -1.5}}, Tol{1e-6, 1e-6}, "i32 / i32");
  Tensor q64 = from_vector({9}, {1}, DType::i64) / 2.0;
  CHECK(is_floating(q64.dtype()));
  CHECK(std::abs(q64.item<double>() - 4.5) < 1e-6);
  // Bool tensors: sum counts, mean is a fraction.
  Tensor bo = from_vector({1, 0, 1, 1}, {4}, DType::boolean);
  CHECK(sum(bo).dtype() == DType::i64);
  CHECK(sum(bo).item<int64_t>() == 3);
  CHECK(std::abs(mean(bo).item<double>() - 0.75) < 1e-6);
  // where promotes its two branches.
  Tensor w = where(from_vector({1, 0}, {2}, DType::boolean), from_vector({1, 2}, {2}, DType::i32),
                   from_vector({0.5, 0.25}, {2}));
  CHECK(w.dtype() == DType::f32);
  expect_close(w, Ref{{2}, {1, 0.25}}, Tol{0, 0}, "where promote");
}

TEST_CASE("ops: true division of an integer or bool tensor by a number is f32 with the number as it is") {
  // scalar_like would make a whole number an integer of x's dtype first: i8 x / 300 divided by 44 and
  // u8 x / -3 by 253 (PyTorch divides by 300 and -3).
  const Tensor x = from_vector({5, -5, 100}, {3}, DType::i8);
  CHECK((x / 300.0).dtype() == DType::f32);
  expect_close(x / 300.0, Ref{{3}, {5.0 / 300, -5.0 / 300, 100.0 / 300}}, Tol{1e-6, 0}, "i8 / 300");
  expect_close(300.0 / x, Ref{{3}, {60, -60, 3}}, Tol{1e-6, 0}, "300 / i8");
  expect_close(from_vector({6}, {1}, DType::u8) / -3.0, Ref{{1}, {-2}}, Tol{0, 0}, "u8 / -3");
  expect_close(from_vector({1, 0}, {2}, DType::boolean) / 2.0, Ref{{2}, {0.5, 0}}, Tol{0, 0}, "bool / 2");
  CHECK((2.0 / from_vector({1, 4}, {2}, DType::i64)).to_vector() == std::vector<double>{2, 0.5});
}

TEST_CASE("ops: a whole double beside an integer tensor wraps into its dtype as a Python int does") {
  // The element conversion alone sends a double outside int32 to INT32_MIN before narrowing.
  const Tensor i32 = from_vector({1, 2}, {2}, DType::i32);
  CHECK((i32 + 4294967301.0).dtype() == DType::i32);
  CHECK((i32 + 4294967301.0).to_vector() == std::vector<double>{6, 7});          // 2^32 + 5 adds 5
  CHECK((i32 * -4294967295.0).to_vector() == std::vector<double>{1, 2});         // -(2^32 - 1) is 1
  CHECK((3e10 - i32).to_vector() == std::vector<double>{-64771073, -64771074});  // 3e10 is -64771072
  const Tensor i8 = from_vector({5, -5}, {2}, DType::i8);
  CHECK((i8 + 300.0).to_vector() == std::vector<double>{49, 39});                   // 300 is 44
  CHECK((i8 + (1099511627776.0 + 3.0)).to_vector() == std::vector<double>{8, -2});  // 2^40 + 3 is 3
  CHECK((from_vector({1}, {1}, DType::u8) + -1.0).to_vector() == std::vector<double>{0});
  CHECK((from_vector({1}, {1}, DType::i16) * 65537.0).to_vector() == std::vector<double>{1});
  CHECK((from_vector({1}, {1}, DType::i64) + 3e18).to_vector() == std::vector<double>{3e18 + 1});
  CHECK((from_vector({0}, {1}, DType::i64) + 1.8446744073709552e19).to_vector() == std::vector<double>{0});
}

TEST_CASE("ops: an integer tensor's exponent outside its dtype is refused, as PyTorch's") {
  const Tensor i8 = from_vector({1, 2}, {2}, DType::i8);
  CHECK(contains(error_of([&] { (void)pow(i8, 257.0); }), "pow: the exponent 257 does not fit in"));
  CHECK(contains(error_of([&] { (void)pow(i8, 128.0); }), "the dtype of the base, i8 cpu [2] (-128 to 127)"));
  CHECK(pow(i8, 7.0).to_vector() == std::vector<double>{1, -128});
  CHECK(pow(from_vector({2}, {1}, DType::u8), 200.0).to_vector() == std::vector<double>{0});
  CHECK(contains(error_of([&] { (void)pow(from_vector({2}, {1}, DType::i32), 2147483648.0); }), "does not fit"));
  // i64's bound, 2^63 as a double, is outside (it would become INT64_MIN, a negative exponent).
  CHECK(contains(error_of([&] { (void)pow(from_vector({3}, {1}, DType::i64), 9223372036854775808.0); }),
                 "does not fit in the dtype of the base, i64 cpu [1] (-9.22337e+18 to 2^63 - 1)"));
}

TEST_CASE("ops: clamp with a NaN bound gives NaN, as PyTorch; an absent bound is no bound") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (DType dt : kFloat) {
    CAPTURE(std::string(dtype_name(dt)));
    const Tensor x = from_vector({0, -5, 5}, {3}, dt);
    for (const Tensor& y :
         {clamp(x, std::nullopt, nan), clamp(x, nan, std::nullopt), clamp(x, nan, 1.0), clamp(x, -1.0, nan)})
      for (double v : y.to_vector()) CHECK(std::isnan(v));
    CHECK(clamp(x, std::nullopt, 1.0).to_vector() == std::vector<double>{0, -5, 1});
    CHECK(clamp(x, -1.0, std::nullopt).to_vector() == std::vector<double>{0, -1, 5});
    // a NaN element stays NaN; infinite values pass an absent bound
    const Tensor z = from_vector({nan, -INFINITY, INFINITY}, {3}, dt);
    const std::vector<double> lo = clamp(z, -1.0, std::nullopt).to_vector();
    CHECK(std::isnan(lo[0]));
    CHECK(lo[1] == -1);
    CHECK(lo[2] == INFINITY);
  }
  CHECK(contains(error_of([nan] { clamp(ones({2}, DType::i32), nan, std::nullopt); }), "NaN bound"));
  CHECK(clamp(from_vector({-100, 100}, {2}, DType::i8), std::nullopt, 200.0).to_vector() ==
        std::vector<double>{-100, 100});
  CHECK(clamp(from_vector({-100, 100}, {2}, DType::i64), 0.0, std::nullopt).to_vector() == std::vector<double>{0, 100});
}

TEST_CASE("ops: broadcast_shapes and shape errors") {
  CHECK(broadcast_shapes({3, 1, 4}, {2, 1}) == Shape{3, 2, 4});
  CHECK(broadcast_shapes({}, {2, 3}) == Shape{2, 3});
  CHECK(broadcast_shapes({5, 1}, {1, 6}) == Shape{5, 6});
  CHECK(broadcast_shapes({0, 1}, {1, 3}) == Shape{0, 3});
  CHECK(broadcast_shapes({1}, {}) == Shape{1});
  CHECK_THROWS_AS(broadcast_shapes({2, 3}, {4}), Error);
  const std::string e = error_of([] { add(ones({3, 2}), ones({4, 2})); });
  CHECK(contains(e, "[3,2]"));
  CHECK(contains(e, "[4,2]"));
  CHECK(error_of([] { where(ones({2}), ones({2}), ones({2})); }) != "NO ERROR");  // cond must be bool
  CHECK(error_of([] { where(ones({2}, DType::boolean), ones({3}), ones({2})); }) != "NO ERROR");
  // min > max is no error: all max, as PyTorch's.
  CHECK(clamp(from_vector({0, 5}, {2}), 2.0, 1.0).to_vector() == std::vector<double>{1, 1});
}

TEST_CASE("ops: where") {
  Gen gen(6);
  const Shape shapes[][3] = {
      {{3, 1}, {1, 4}, {3, 4}}, {{2, 3}, {2, 3}, {}}, {{4}, {3, 4}, {1}}, {{}, {2, 2}, {2, 2}}, {{2, 1, 3}, {4, 1}, {3}}};
  for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64, DType::u8}) {
    for (const auto& s : shapes) {
      for (auto [la, lb] : kLayoutPairs) {
        Ref rc, ra, rb;
        Tensor c = gen.make(s[0], DType::boolean, layout_applies(la, s[0]) ? la : Layout::contiguous, 0, 1, rc);
        Tensor a = gen.make(s[1], dt, layout_applies(lb, s[1]) ? lb : Layout::contiguous, 0, 9, ra);
        Tensor b = gen.make(s[2], dt, layout_applies(la, s[2]) ? la : Layout::contiguous, 0, 9, rb);
        Tensor y = where(c, a, b);
        CHECK(y.dtype() == dt);
        expect_close(y, map3(rc, ra, rb, [](double c, double a, double b) { return c != 0 ? a : b; }), Tol{0, 0},
                     std::string("where ") + dtype_name(dt));
      }
    }
  }
  // where picks, it does not blend: NaN in the unpicked branch does not leak.
  Tensor nan = full({3}, std::nan(""));
  Tensor picked = where(from_vector({1, 1, 0}, {3}, DType::boolean), ones({3}), nan);
  CHECK(picked.to_vector()[0] == 1.0);
  CHECK(picked.to_vector()[1] == 1.0);
  CHECK(std::isnan(picked.to_vector()[2]));
}

TEST_CASE("ops: fmod and remainder on integers and floats take the signs C and Python give") {
  const std::vector<double> a{-7, 7, -7, 7, 6, -6, 0}, b{3, 3, -3, -3, 3, -4, 5};
  const std::vector<double> f{-1, 1, -1, 1, 0, -2, 0}, r{2, 1, -1, -2, 0, -2, 0};
  for (DType dt : {DType::i32, DType::i64, DType::f32, DType::f64}) {
    CAPTURE(dtype_name(dt));
    const Tensor x = from_vector(a, {7}, dt), y = from_vector(b, {7}, dt);
    CHECK(fmod(x, y).dtype() == dt);
    CHECK(fmod(x, y).to_vector() == f);
    CHECK(remainder(x, y).to_vector() == r);
  }
  // Exact for floats where a - b * floor(a / b) is not: 1e17 mod 3 and a tiny b.
  CHECK(remainder(from_vector({1e17}, {1}, DType::f64), 3.0).item<double>() == std::fmod(1e17, 3.0));
  CHECK(fmod(from_vector({-7.5}, {1}), 2.0).item<double>() == -1.5);
  CHECK(remainder(from_vector({-7.5}, {1}), 2.0).item<double>() == 0.5);
  CHECK(fmod(from_vector({200, 7}, {2}, DType::u8), from_vector({7, 200}, {2}, DType::u8)).to_vector() ==
        std::vector<double>{4, 7});
  CHECK(std::isnan(fmod(from_vector({1.0}, {1}), 0.0).item<double>()));
  CHECK_THROWS_WITH_AS(remainder(from_vector({5}, {1}, DType::i64), 0.0),
                       doctest::Contains("remainder: integer division by zero"), kiln::Error);
  CHECK_THROWS_WITH_AS(fmod(from_vector({1}, {1}, DType::boolean), from_vector({1}, {1}, DType::boolean)),
                       doctest::Contains("fmod: not defined for bool"), kiln::Error);
  // atan2's quadrants and its integer inputs (computed in f32).
  const Tensor at =
      atan2(from_vector({1, 1, -1, -1, 0}, {5}, DType::i64), from_vector({1, -1, 1, -1, -1}, {5}, DType::i64));
  CHECK(at.dtype() == DType::f32);
  const std::vector<double> want{std::atan2(1, 1), std::atan2(1, -1), std::atan2(-1, 1), std::atan2(-1, -1),
                                 std::atan2(0, -1)};
  for (size_t i = 0; i < 5; ++i) CHECK(at.to_vector()[i] == doctest::Approx(want[i]).epsilon(1e-6));
}

TEST_CASE("ops: scans and sorting at their edges: zeros, ties, NaN, integers, empty") {
  const auto vec = [](const Tensor& t) { return t.to_vector(); };
  const double nan = std::nan("");
  // cumprod's gradient with zeros: d/dx_i sum_j prod_{k<=j} x_k, by hand for x = [2, 0, 3, 0, 5].
  Tensor x = from_vector({2, 0, 3, 0, 5}, {5}, DType::f64).set_requires_grad();
  sum(cumprod(x, 0)).backward();
  // i = 0: 1 + x1 + x1 x2 + ... = 1; i = 1 (first zero): x0 (1 + x2 + x2 x3 + x2 x3 x4) = 2 * 4 = 8; after: 0.
  CHECK(vec(x.grad()) == std::vector<double>{1, 8, 0, 0, 0});
  Tensor y = from_vector({3, 0, 2}, {3}, DType::f64).set_requires_grad();
  prod(y).backward();
  CHECK(vec(y.grad()) == std::vector<double>{0, 6, 0});
  CHECK(prod(zeros({0, 3})).item<double>() == 1.0);
  CHECK(vec(prod(zeros({2, 0}), {1})) == std::vector<double>{1, 1});
  CHECK(prod(from_vector({2, 3, 4}, {3}, DType::i32)).dtype() == DType::i64);
  CHECK(prod(from_vector({2, 3, 4}, {3}, DType::i32)).item<double>() == 24);
  // Integer and bool running sums are i64, exactly past 2^53 / 2^31.
  const Tensor big = from_vector({2147483647, 2147483647, 1}, {3}, DType::i32);
  CHECK(cumsum(big, 0).dtype() == DType::i64);
  CHECK(vec(cumsum(big, 0)) == std::vector<double>{2147483647.0, 4294967294.0, 4294967295.0});
  CHECK(vec(cumsum(from_vector({1, 0, 1}, {3}, DType::boolean), 0)) == std::vector<double>{1, 1, 2});
  // cummax: ties take the latest index, NaN stays once seen.
  const ValuesIndices cm = cummax(from_vector({1, 3, 3, 2, nan, 5, nan}, {7}), 0);
  CHECK(vec(cm.indices) == std::vector<double>{0, 1, 2, 2, 4, 4, 6});
  CHECK(std::isnan(vec(cm.values)[5]));
  CHECK(vec(cummin(from_vector({4, 2, 2, 7}, {4}, DType::u8), 0).values) == std::vector<double>{4, 2, 2, 2});
  // sort: stable, NaN after every number ascending and first descending, -0 equal to +0.
  const Tensor s = from_vector({2, nan, -1, 2, -0.0, 0.0, nan, -5}, {8});
  CHECK(vec(argsort(s)) == std::vector<double>{7, 2, 4, 5, 0, 3, 1, 6});
  CHECK(vec(argsort(s, 0, true)) == std::vector<double>{1, 6, 0, 3, 4, 5, 2, 7});
  CHECK(vec(sort(from_vector({3, 1, 2}, {3}, DType::i64)).values) == std::vector<double>{1, 2, 3});
  CHECK(vec(topk(from_vector({1, 9, 9, 4}, {4}, DType::f16), 2).indices) == std::vector<double>{1, 2});
  CHECK(topk(s, 0).values.numel() == 0);
  CHECK_THROWS_WITH_AS(topk(s, 9), doctest::Contains("topk: k = 9 is outside [0, 8]"), kiln::Error);
  CHECK_THROWS_WITH_AS(kthvalue(s, 0), doctest::Contains("kthvalue: k = 0 is outside [1, 8]"), kiln::Error);
  // median: the lower one; NaN if the slice holds one (its first NaN's index).
  const ValuesIndices md = median(from_vector({4, 1, 3, 2, 9, 8, nan, 0}, {2, 4}), 1);
  CHECK(vec(md.values)[0] == 2);
  CHECK(vec(md.indices) == std::vector<double>{3, 2});
  CHECK(std::isnan(vec(md.values)[1]));
  CHECK(median(from_vector({5, 1, 4, 2}, {4})).item<double>() == 2);
  CHECK_THROWS_WITH_AS(median(zeros({0})), doctest::Contains("median: the tensor [0] is empty"), kiln::Error);
  // mode: the smallest of the most frequent values, at its last position.
  const ValuesIndices mo = mode(from_vector({3, 2, 3, 2, 1}, {5}, DType::i64));
  CHECK(mo.values.item<double>() == 2);
  CHECK(mo.indices.item<double>() == 3);
  CHECK_THROWS_WITH_AS(mode(zeros({2, 0})), doctest::Contains("mode: dim -1 of [2,0] is empty"), kiln::Error);
  // scatter_reduce prod's gradient through zeros: place 0 gets x0 = 2 and writes 0, 3; place 1 gets 0, 0.
  Tensor sx = from_vector({2, 5}, {2}, DType::f64).set_requires_grad();
  Tensor ss = from_vector({0, 3, 0, 0}, {4}, DType::f64).set_requires_grad();
  sum(scatter_reduce(sx, 0, from_vector({0, 0, 1, 1}, {4}, DType::i64), ss, ScatterReduce::prod)).backward();
  CHECK(vec(sx.grad()) == std::vector<double>{0, 0});
  CHECK(vec(ss.grad()) == std::vector<double>{6, 0, 0, 0});  // the only zero of place 0: 2 * 3
  // scatter: the last write wins and alone gets the gradient.
  Tensor a = zeros({3}, DType::f64).set_requires_grad(),
         b = from_vector({1, 2, 3}, {3}, DType::f64).set_requires_grad();
  const Tensor sc = scatter(a, 0, from_vector({2, 0, 2}, {3}, DType::i64), b);
  CHECK(vec(sc) == std::vector<double>{2, 0, 3});
  sum(sc * from_vector({1, 10, 100}, {3}, DType::f64)).backward();
  CHECK(vec(a.grad()) == std::vector<double>{0, 10, 0});
  CHECK(vec(b.grad()) == std::vector<double>{0, 1, 100});
  CHECK(stddev(from_vector({1, 2, 3, 4}, {4}, DType::f64)).item<double>() == doctest::Approx(std::sqrt(5.0 / 3.0)));
}

TEST_CASE("ops: cast") {
  Tensor x = from_vector({1.25, -2.5, 3, 0}, {2, 2});
  for (DType dt : {DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64, DType::u8, DType::boolean}) {
    Tensor y = cast(x.t(), dt);
    CHECK(y.dtype() == dt);
    CHECK(y.shape() == Shape{2, 2});
    std::vector<double> want = {1.25, 3, -2.5, 0};
    for (double& v : want) v = dt == DType::u8 ? (v < 0 ? 0 : std::trunc(v)) : round_to(v, dt);
    if (dt == DType::u8) continue;  // negative to unsigned is not a portable conversion
    expect_close(y, Ref{{2, 2}, want}, Tol{0, 0}, std::string("cast ") + dtype_name(dt));
  }
  CHECK(cast(x, DType::f32).dtype() == DType::f32);
  expect_close(cast(x, DType::f32), Ref{{2, 2}, {1.25, -2.5, 3, 0}}, Tol{0, 0}, "cast same");
}

TEST_CASE("ops: allclose") {
  Tensor a = from_vector({1, 2, 3}, {3});
  CHECK(allclose(a, a));
  CHECK(allclose(a, from_vector({1, 2, 3.00001}, {3}), 1e-4));
  CHECK(!allclose(a, from_vector({1, 2, 3.1}, {3})));
  CHECK(!allclose(a, from_vector({1, 2, 3}, {3, 1})));  // [3, 3] after broadcasting: rows against columns
  CHECK(allclose(a, from_vector({1, 2, 3.05}, {3}), 0.0, 0.1));
  CHECK(allclose(a.to(DType::f64), a));
  // PyTorch's rules: shapes broadcast ([2] against [1]), an infinity matches only itself (|inf - -inf| <=
  // atol + rtol inf held), NaN matches NaN only with equal_nan.
  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  CHECK(allclose(from_vector({1, 1}, {2}), from_vector({1}, {1})));
  CHECK_THROWS_WITH_AS(allclose(a, from_vector({1, 2}, {2})), doctest::Contains("allclose: shapes [3] and [2]"),
                       kiln::Error);
  CHECK(!allclose(from_vector({inf}, {1}), from_vector({-inf}, {1})));
  CHECK(!allclose(from_vector({1e10}, {1}), from_vector({inf}, {1})));
  CHECK(allclose(from_vector({inf, -inf}, {2}), from_vector({inf, -inf}, {2})));
  CHECK(!allclose(from_vector({nan}, {1}), from_vector({nan}, {1})));
  CHECK(allclose(from_vector({nan, 1}, {2}), from_vector({nan, 1}, {2}), 1e-5, 1e-8, true));
  CHECK(!allclose(from_vector({nan}, {1}), from_vector({1}, {1}), 1e-5, 1e-8, true));
}

TEST_CASE("ops: an empty tensor is contiguous, and an empty product is zeros") {
  // PyTorch's rule: no element can be out of place (its strides count a size-0 dim as 1, as Kiln's).
  const Tensor e = zeros({2, 0});
  CHECK(e.is_contiguous());
  CHECK(e.strides() == Shape{1, 1});
  Tensor a = randn({2, 0}).set_requires_grad(), b = randn({0, 3}).set_requires_grad();
  const Tensor y = matmul(a, b);  // was "assertion out.is_contiguous() failed"
  CHECK(y.shape() == Shape{2, 3});
  CHECK(y.to_vector() == std::vector<double>(6, 0.0));
  sum(y).backward();
  CHECK(a.grad().shape() == Shape{2, 0});
  CHECK(b.grad().shape() == Shape{0, 3});
  CHECK(linear(randn({2, 4}), randn({0, 4})).shape() == Shape{2, 0});
}

// ---- reductions -------------------------------------------------------------------------------------

namespace {

enum class Red { sum, mean, var0, var1, amax, amin };

// Reference reduction over `dims` (already non-negative) of r.
Ref ref_reduce(const Ref& r, std::vector<int64_t> dims, bool keepdim, Red op) {
  const int64_t nd = int64_t(r.shape.size());
  if (dims.empty())
    for (int64_t d = 0; d < nd; ++d) dims.push_back(d);
  std::vector<bool> red(size_t(std::max<int64_t>(nd, 0)), false);
  for (int64_t d : dims) red[size_t(d)] = true;
  Shape keep, out;
  for (int64_t d = 0; d < nd; ++d) {
    keep.push_back(red[size_t(d)] ? 1 : r.shape[size_t(d)]);
    if (!red[size_t(d)] || keepdim) out.push_back(keep.back());
  }
  const int64_t nout = numel_of(keep);
  std::vector<std::vector<double>> groups(static_cast<size_t>(nout));
  for (int64_t i = 0; i < numel_of(r.shape); ++i) {
    auto idx = unravel(i, r.shape);
    int64_t flat = 0;
    for (int64_t d = 0; d < nd; ++d) flat = flat * keep[size_t(d)] + (red[size_t(d)] ? 0 : idx[size_t(d)]);
    groups[size_t(flat)].push_back(r.v[size_t(i)]);
  }
  Ref res{out, {}};
  for (const auto& g : groups) {
    double s = 0;
    for (double x : g) s += x;
    const double n = double(g.size());
    double v = 0;
    switch (op) {
      case Red::sum: v = s; break;
      case Red::mean: v = s / n; break;
      case Red::var0:
      case Red::var1: {
        const double m = s / n;
        double ss = 0;
        for (double x : g) ss += (x - m) * (x - m);
        v = ss / (n - (op == Red::var1 ? 1 : 0));
        break;
      }
      case Red::amax: v = *std::max_element(g.begin(), g.end()); break;
      case Red::amin: v = *std::min_element(g.begin(), g.end()); break;
    }
    res.v.push_back(v);
  }
  return res;
}

Tensor run_red(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim, Red op) {
  switch (op) {
    case Red::sum: return sum(x, dims, keepdim);
    case Red::mean: return mean(x, dims, keepdim);
    case Red::var0: return var(x, dims, 0, keepdim);
    case Red::var1: return var(x, dims, 1, keepdim);
    case Red::amax: return amax(x, dims, keepdim);
    case Red::amin: return amin(x, dims, keepdim);
  }
  return Tensor();
}
const char* red_name(Red op) {
  switch (op) {
    case Red::sum: return "sum";
    case Red::mean: return "mean";
    case Red::var0: return "var(correction 0)";
    case Red::var1: return "var(correction 1)";
    case Red::amax: return "amax";
    case Red::amin: return "amin";
  }
  return "?";
}

}  // namespace

TEST_CASE("ops: reductions over single, several, all and negative dims, with keepdim") {
  Gen gen(7);
  const Shape s{3, 4, 5};
  const std::vector<std::vector<int64_t>> dim_sets = {{}, {0}, {1}, {2}, {-1}, {0, 2}, {-3, -1}, {1, 2}, {2, 0}, {0, 1, 2}, {-2}};
  for (Red op : {Red::sum, Red::mean, Red::var0, Red::var1, Red::amax, Red::amin}) {
    for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64}) {
      const bool int_in = is_integral(dt);
      for (Layout l : {Layout::contiguous, Layout::transposed, Layout::strided, Layout::expanded}) {
        Ref in;
        Tensor x = gen.make(s, dt, l, -5, 5, in);
        for (const auto& dims : dim_sets) {
          for (bool keepdim : {false, true}) {
            std::vector<int64_t> nd;
            for (int64_t d : dims) nd.push_back(d < 0 ? d + 3 : d);
            std::string what = std::string(red_name(op)) + " " + dtype_name(dt) + " " + layout_name(l) + " dims";
            for (int64_t d : dims) what.append(" ").append(std::to_string(d));
            if (keepdim) what += " keepdim";
            CAPTURE(Shape(dims));
            Tensor y = run_red(x, dims, keepdim, op);
            Ref want = ref_reduce(in, nd, keepdim, op);
            // Result dtypes: sums of integers are i64; mean/var of integers are floating; others keep it.
            if (op == Red::sum) CHECK(y.dtype() == (int_in ? DType::i64 : dt));
            if (op == Red::amax || op == Red::amin) CHECK(y.dtype() == dt);
            if (op == Red::mean || op == Red::var0 || op == Red::var1) {
              CHECK(is_floating(y.dtype()));
              if (!int_in) CHECK(y.dtype() == dt);
            }
            Tol tol = tol_for(y.dtype());
            if (is_low_precision(y.dtype())) tol.atol *= 4;  // var/mean may round intermediates
            expect_close(y, want, tol, what);
          }
        }
      }
    }
  }
}

TEST_CASE("ops: sum of ints gives i64 without overflow") {
  Tensor x = full({1000}, 3e6, DType::i32);  // 3e9 overflows i32 but not i64
  Tensor s = sum(x);
  CHECK(s.dtype() == DType::i64);
  CHECK(s.item<int64_t>() == 3000000000LL);
  Tensor u = full({300}, 255, DType::u8);
  CHECK(sum(u).dtype() == DType::i64);
  CHECK(sum(u).item<int64_t>() == 76500);
  CHECK(sum(u.view({30, 10}), {1}).dtype() == DType::i64);
  expect_close(sum(u.view({30, 10}), {1}), Ref{{30}, std::vector<double>(30, 2550)}, Tol{0, 0}, "sum u8 rows");
}

TEST_CASE("ops: large reductions are accurate") {
  Gen gen(8);
  Ref in;
  Tensor x = gen.make({100003}, DType::f32, Layout::contiguous, -1, 1, in);
  double s = 0;
  for (double v : in.v) s += v;
  CHECK(std::abs(sum(x).item<double>() - s) < 1e-3);
  CHECK(std::abs(mean(x).item<double>() - s / 100003) < 1e-7);
  // Many rows and a wide inner dim: column blocks.
  Ref in2;
  Tensor y = gen.make({700, 300}, DType::f32, Layout::contiguous, -1, 1, in2);
  expect_close(sum(y, {0}), ref_reduce(in2, {0}, false, Red::sum), Tol{1e-4, 1e-5}, "sum dim 0 of [700,300]");
  expect_close(sum(y, {1}), ref_reduce(in2, {1}, false, Red::sum), Tol{1e-4, 1e-5}, "sum dim 1 of [700,300]");
  expect_close(amax(y, {0}), ref_reduce(in2, {0}, false, Red::amax), Tol{0, 0}, "amax dim 0 of [700,300]");
  expect_close(var(y, {1}), ref_reduce(in2, {1}, false, Red::var1), Tol{1e-5, 1e-4}, "var dim 1 of [700,300]");
  // A long reduced dim (more than one summation chunk) in the middle.
  Ref in3;
  Tensor z = gen.make({2, 20000, 3}, DType::f32, Layout::contiguous, -1, 1, in3);
  expect_close(sum(z, {1}), ref_reduce(in3, {1}, false, Red::sum), Tol{1e-3, 1e-5}, "sum dim 1 of [2,20000,3]");
  Ref in4;
  Tensor w = gen.make({3, 20000}, DType::f64, Layout::contiguous, -1, 1, in4);
  expect_close(sum(w, {1}), ref_reduce(in4, {1}, false, Red::sum), Tol{1e-10, 1e-12}, "sum f64 of [3,20000]");
  // Many f16 elements: accumulation happens in wider precision, so the sum is the f16 of the true sum.
  Tensor h = full({4096}, 0.1, DType::f16);
  const double h1 = round_to(0.1, DType::f16);
  CHECK(std::abs(sum(h).item<double>() - 4096 * h1) <= 4096 * h1 * 1e-3);
}

TEST_CASE("ops: 16-bit mean, var, std, norm and logsumexp compute in f32 and round once") {
  // The exact value rounded once to dt (PyTorch's result: it accumulates 16-bit reductions in f32).
  const auto once = [](double v, DType dt) { return scalar_tensor(v, dt).item<double>(); };
  std::vector<double> alt;
  for (int i = 0; i < 5; ++i) {  // push_back: insert of a list here set off GCC 12's -Wstringop-overflow
    alt.push_back(0);
    alt.push_back(200);
  }
  for (DType dt : {DType::f16, DType::bf16}) {
    INFO(dt);
    const Tensor x = from_vector(alt, {10}, dt);
    // sum of squares 100000: past f16's 65504 when summed into an f16 result (var and std were inf)
    CHECK(var(x).dtype() == dt);
    CHECK(var(x).item<double>() == once(100000.0 / 9, dt));
    CHECK(stddev(x).item<double>() == once(std::sqrt(100000.0 / 9), dt));
    CHECK(var(x, {0}, 0).item<double>() == once(10000, dt));
    // std is the root of the unrounded variance: bf16 [900, 1000, 1104, 1200] has variance 16804 (16768 in
    // bf16), std 129.63 (130 in bf16; the root of 16768 is 129.49, which rounded to 129).
    CHECK(stddev(from_vector({900, 1000, 1104, 1200}, {4}, dt)).item<double>() == once(std::sqrt(16804.0), dt));
    const Tensor y = from_vector({300, 300}, {1, 2}, dt);  // 300^2 = 90000
    CHECK(norm(y).item<double>() == once(std::sqrt(180000.0), dt));
    CHECK(norm(y, 2.0, {1}).to_vector() == std::vector<double>{once(std::sqrt(180000.0), dt)});
    CHECK(norm(y, 3.0).item<double>() == once(std::cbrt(2 * 27e6), dt));
    // a mean whose sum is past 65504
    CHECK(mean(from_vector({60000, 60000}, {2}, dt)).item<double>() == once(60000, dt));
    // 2^17 terms of e^0 sum past 65504
    CHECK(logsumexp(zeros({1 << 17}, TensorOptions(dt)), {0}).item<double>() == once(17 * std::log(2.0), dt));
  }
  // The gradient still reaches a 16-bit input, in its dtype.
  Tensor x = from_vector({1, 2, 3, 4}, {4}, DType::f16).set_requires_grad();
  sum(var(x) + norm(x) + mean(x)).backward();
  CHECK(x.grad().dtype() == DType::f16);
  for (double g : x.grad().to_vector()) CHECK(std::isfinite(g));
}

TEST_CASE("ops: var with correction 0 and 1 by hand") {
  Tensor x = from_vector({1, 2, 3, 4, 10, 20, 30, 40}, {2, 4}, DType::f64);
  expect_close(var(x, {1}, 0), Ref{{2}, {1.25, 125}}, DType::f64, "var pop");
  expect_close(var(x, {1}, 1), Ref{{2}, {5.0 / 3, 500.0 / 3}}, DType::f64, "var unbiased");
  expect_close(var(x, {1}, 1, true), Ref{{2, 1}, {5.0 / 3, 500.0 / 3}}, DType::f64, "var keepdim");
  expect_close(var(x, {0}, 0), Ref{{4}, {20.25, 81, 182.25, 324}}, DType::f64, "var dim 0");
  expect_close(var(x), ref_reduce(Ref{{2, 4}, x.to_vector()}, {}, false, Red::var1), DType::f64, "var all");
  CHECK(var(x).dim() == 0);
  expect_close(mean(x, {0, 1}, true), Ref{{1, 1}, {13.75}}, DType::f64, "mean keepdim all");
}

TEST_CASE("ops: amax/amin ties, max/min/argmax/argmin values and indices") {
  Tensor x = from_vector({3, 1, 3, 2,    //
                          -1, -1, -5, -1,  //
                          0, 7, 7, 7},
                         {3, 4}, DType::f32);
  expect_close(amax(x, {1}), Ref{{3}, {3, -1, 7}}, Tol{0, 0}, "amax ties");
  expect_close(amin(x, {1}), Ref{{3}, {1, -5, 0}}, Tol{0, 0}, "amin");
  expect_close(amax(x, {0}), Ref{{4}, {3, 7, 7, 7}}, Tol{0, 0}, "amax dim 0");
  expect_close(amax(x), Ref{{}, {7}}, Tol{0, 0}, "amax all");
  auto mx = max(x, 1);
  expect_close(mx.values, Ref{{3}, {3, -1, 7}}, Tol{0, 0}, "max values");
  CHECK(mx.indices.dtype() == DType::i64);
  expect_close(mx.indices, Ref{{3}, {0, 0, 1}}, Tol{0, 0}, "max indices (first of ties)");
  auto mn = min(x, -1, true);
  CHECK(mn.values.shape() == Shape{3, 1});
  CHECK(mn.indices.shape() == Shape{3, 1});
  expect_close(mn.values, Ref{{3, 1}, {1, -5, 0}}, Tol{0, 0}, "min values");
  expect_close(mn.indices, Ref{{3, 1}, {1, 2, 0}}, Tol{0, 0}, "min indices");
  auto m0 = max(x, 0);
  expect_close(m0.values, Ref{{4}, {3, 7, 7, 7}}, Tol{0, 0}, "max dim 0");
  expect_close(m0.indices, Ref{{4}, {0, 2, 2, 2}}, Tol{0, 0}, "max dim 0 indices");
  expect_close(argmax(x, 1), Ref{{3}, {0, 0, 1}}, Tol{0, 0}, "argmax");
  expect_close(argmin(x, 1), Ref{{3}, {1, 2, 0}}, Tol{0, 0}, "argmin");
  expect_close(argmax(x, 0, true), Ref{{1, 4}, {0, 2, 2, 2}}, Tol{0, 0}, "argmax keepdim");
  CHECK(argmax(x, 1).dtype() == DType::i64);
  Tensor fa = argmax(x);
  CHECK(fa.dim() == 0);
  CHECK(fa.item<int64_t>() == 9);  // first 7 in row-major order
  CHECK(argmax(x.t()).item<int64_t>() == 5);  // the transposed view: (1,2) in a [4,3] -> 1*3+2
  // Against the reference on random data with many ties, every dtype, strided inputs.
  Gen gen(9);
  for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64}) {
    for (Layout l : {Layout::contiguous, Layout::transposed, Layout::strided}) {
      Ref in;
      Tensor y = gen.make({4, 6, 5}, dt, l, -3, 3, in);
      for (int64_t d : {0, 1, 2, -1}) {
        const int64_t dd = d < 0 ? d + 3 : d;
        auto r = max(y, d);
        auto q = min(y, d);
        Ref want_v = ref_reduce(in, {dd}, false, Red::amax);
        expect_close(r.values, want_v, Tol{0, 0}, std::string("max values ") + dtype_name(dt));
        expect_close(q.values, ref_reduce(in, {dd}, false, Red::amin), Tol{0, 0}, "min values");
        CHECK(r.values.dtype() == dt);
        // Reference indices: the first position of the extreme along dd.
        Shape os;
        for (int64_t k = 0; k < 3; ++k)
          if (k != dd) os.push_back(in.shape[size_t(k)]);
        std::vector<double> imax, imin;
        for (int64_t o = 0; o < numel_of(os); ++o) {
          auto oi = unravel(o, os);
          oi.insert(oi.begin() + dd, 0);
          int64_t bmax = 0, bmin = 0;
          double vmax = -1e300, vmin = 1e300;
          for (int64_t i = 0; i < in.shape[size_t(dd)]; ++i) {
            oi[size_t(dd)] = i;
            const double v = in.v[size_t((oi[0] * in.shape[1] + oi[1]) * in.shape[2] + oi[2])];
            if (v > vmax) vmax = v, bmax = i;
            if (v < vmin) vmin = v, bmin = i;
          }
          imax.push_back(double(bmax));
          imin.push_back(double(bmin));
        }
        expect_close(r.indices, Ref{os, imax}, Tol{0, 0}, std::string("max indices ") + dtype_name(dt) + layout_name(l));
        expect_close(q.indices, Ref{os, imin}, Tol{0, 0}, std::string("min indices ") + dtype_name(dt) + layout_name(l));
        expect_close(argmax(y, d), Ref{os, imax}, Tol{0, 0}, "argmax");
        expect_close(argmin(y, d), Ref{os, imin}, Tol{0, 0}, "argmin");
      }
      // Flattened argmax: the first maximum in row-major logical order.
      const auto it = std::max_element(in.v.begin(), in.v.end());
      CHECK(argmax(y).item<int64_t>() == int64_t(it - in.v.begin()));
    }
  }
  CHECK_THROWS_AS(max(x, 2), Error);
}

TEST_CASE("ops: sum_to") {
  Gen gen(10);
  Ref in;
  Tensor x = gen.make({2, 3, 4}, DType::f64, Layout::transposed, -2, 2, in);
  struct C {
    Shape target;
    std::vector<int64_t> dims;  // reduced dims of x
  };
  const C cs[] = {{{3, 1}, {0, 2}}, {{4}, {0, 1}}, {{1, 1}, {0, 1, 2}}, {{}, {0, 1, 2}}, {{3, 4}, {0}},
                  {{1, 3, 1}, {0, 2}}, {{2, 1, 4}, {1}}, {{1, 4}, {0, 1}}};
  for (const C& c : cs) {
    CAPTURE(c.target);
    Tensor y = sum_to(x, c.target);
    CHECK(y.shape() == c.target);
    Ref want = ref_reduce(in, c.dims, false, Red::sum);
    want.shape = c.target;
    expect_close(y, want, DType::f64, "sum_to");
  }
  expect_close(sum_to(x, {2, 3, 4}), in, DType::f64, "sum_to same shape");
  CHECK_THROWS_AS(sum_to(x, {5}), Error);
  CHECK_THROWS_AS(sum_to(ones({3}), {2, 3}), Error);
  Tensor i = from_vector({1, 2, 3, 4}, {2, 2}, DType::i32);
  expect_close(sum_to(i, {2}), Ref{{2}, {4, 6}}, Tol{0, 0}, "sum_to ints");
}

// ---- matmul -------------------------------------------------------------------------------------------

namespace {

// numpy matmul, written out: 1-D operands are promoted and the added dim removed; batch dims broadcast.
Ref ref_matmul(const Ref& a, const Ref& b) {
  Shape as = a.shape, bs = b.shape;
  const bool va = as.size() == 1, vb = bs.size() == 1;
  if (va) as.insert(as.begin(), 1);
  if (vb) bs.push_back(1);
  const int64_t m = as[as.size() - 2], k = as.back(), n = bs.back();
  REQUIRE(bs[bs.size() - 2] == k);
  const Shape ab(as.begin(), as.end() - 2), bb(bs.begin(), bs.end() - 2);
  const Shape batch = bshape(ab, bb);
  Ref A{as, a.v}, B{bs, b.v};
  Ref out;
  const int64_t nb = numel_of(batch);
  for (int64_t bi = 0; bi < nb; ++bi) {
    auto bidx = unravel(bi, batch);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0;
        for (int64_t p = 0; p < k; ++p) {
          auto ia = bidx;
          ia.push_back(i);
          ia.push_back(p);
          auto ib = bidx;
          ib.push_back(p);
          ib.push_back(j);
          acc += bget(A, ia) * bget(B, ib);
        }
        out.v.push_back(acc);
      }
  }
  out.shape = batch;
  if (!va) out.shape.push_back(m);
  if (!vb) out.shape.push_back(n);
  return out;
}

}  // namespace

TEST_CASE("ops: matmul 1-D, 2-D, batched and broadcast against a naive reference") {
  Gen gen(11);
  const ShapePair cases[] = {
      {{4}, {4, 3}},               // vector x matrix -> [3]
      {{3, 4}, {4}},               // matrix x vector -> [3]
      {{3, 4}, {4, 5}},            // plain
      {{1, 1}, {1, 1}},            //
      {{7, 1}, {1, 6}},            // outer product
      {{2, 3, 4}, {2, 4, 5}},      // batched
      {{2, 3, 4}, {4, 5}},         // batch x matrix
      {{3, 4}, {2, 4, 5}},         // matrix x batch
      {{2, 1, 3, 4}, {3, 4, 2}},   // broadcast batch -> [2,3,3,2]
      {{4}, {2, 4, 3}},            // vector x batch -> [2,3]
      {{2, 3, 4}, {4}},            // batch x vector -> [2,3]
      {{33, 65}, {65, 47}},        // larger than one micro-tile
      {{3, 17, 9}, {3, 9, 130}},   //
  };
  for (DType dt : kFloat) {
    for (const ShapePair& c : cases) {
      for (auto [la, lb] : kLayoutPairs) {
        if (!layout_applies(la, c.a) || !layout_applies(lb, c.b)) continue;
        Ref ra, rb;
        Tensor a = gen.make(c.a, dt, la, -1, 1, ra);
        Tensor b = gen.make(c.b, dt, lb, -1, 1, rb);
        const std::string what = std::string("matmul ") + dtype_name(dt) + " " + layout_name(la) + "/" + layout_name(lb);
        CAPTURE(c.a);
        CAPTURE(c.b);
        Tensor y;
        try {
          y = matmul(a, b);
        } catch (const std::exception& e) {
          FAIL_CHECK(what, " ", c.a, " x ", c.b, " (strides ", a.strides(), " and ", b.strides(), ") threw: ", std::string(e.what()));
          continue;
        }
        CHECK(y.dtype() == dt);
        const int64_t k = c.a.back();
        Tol tol = tol_for(dt);
        tol.atol *= std::max<int64_t>(1, k / 8);
        expect_close(y, ref_matmul(ra, rb), tol, what);
      }
    }
  }
}

TEST_CASE("ops: matmul with transposed, sliced and expanded operands") {
  Gen gen(12);
  for (DType dt : {DType::f32, DType::f64}) {
    Ref ra, rb;
    Tensor a = gen.make({6, 5}, dt, Layout::contiguous, -1, 1, ra);
    Tensor b = gen.make({6, 4}, dt, Layout::contiguous, -1, 1, rb);
    // a.t() @ b: a transposed view, GEMM reads it as a transpose.
    Ref rat{{5, 6}, {}};
    for (int i = 0; i < 5; ++i)
      for (int j = 0; j < 6; ++j) rat.v.push_back(ra.v[size_t(j * 5 + i)]);
    expect_close(matmul(a.t(), b), ref_matmul(rat, rb), dt, "a.t() @ b");
    // b.t() @ a
    Ref rbt{{4, 6}, {}};
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 6; ++j) rbt.v.push_back(rb.v[size_t(j * 4 + i)]);
    expect_close(matmul(b.t(), a), ref_matmul(rbt, ra), dt, "b.t() @ a");
    // a.t() @ a.t().t()
    expect_close(matmul(a.t(), a), ref_matmul(rat, ra), dt, "a.t() @ a");
    expect_close(matmul(a, a.t()), ref_matmul(ra, rat), dt, "a @ a.t()");
    // Columns with a step: neither row- nor column-major.
    Tensor s = a.slice(1, 0, 5, 2);  // [6,3]
    Ref rs{{6, 3}, {}};
    for (int i = 0; i < 6; ++i)
      for (int j = 0; j < 5; j += 2) rs.v.push_back(ra.v[size_t(i * 5 + j)]);
    expect_close(matmul(s.t(), b), ref_matmul(Ref{{3, 6}, [&] {
                                                 std::vector<double> v;
                                                 for (int i = 0; i < 3; ++i)
                                                   for (int j = 0; j < 6; ++j) v.push_back(rs.v[size_t(j * 3 + i)]);
                                                 return v;
                                               }()},
                                               rb),
                 dt, "sliced.t() @ b");
    expect_close(matmul(b.t(), s), ref_matmul(rbt, rs), dt, "b.t() @ sliced");
    // Rows with a step.
    Tensor rstep = a.slice(0, 1, 6, 2);  // rows 1,3,5 -> [3,5]
    Ref rr{{3, 5}, {}};
    for (int i = 1; i < 6; i += 2)
      for (int j = 0; j < 5; ++j) rr.v.push_back(ra.v[size_t(i * 5 + j)]);
    expect_close(matmul(rstep, a.t()), ref_matmul(rr, rat), dt, "row-stepped @ a.t()");
    // An expanded batch operand (stride 0 over the batch).
    Tensor e = a.unsqueeze(0).expand({3, 6, 5});
    Ref re{{3, 6, 5}, {}};
    for (int r = 0; r < 3; ++r) re.v.insert(re.v.end(), ra.v.begin(), ra.v.end());
    Ref rc;
    Tensor c = gen.make({3, 5, 2}, dt, Layout::transposed, -1, 1, rc);
    expect_close(matmul(e, c), ref_matmul(re, rc), dt, "expanded batch @ transposed batch");
    // A permuted batch: [5, 3, 6] viewed as [3, 6, 5] through permute.
    Ref rp0;
    Tensor p0 = gen.make({5, 3, 6}, dt, Layout::contiguous, -1, 1, rp0);
    Tensor p = p0.permute({1, 2, 0});
    Ref rp{{3, 6, 5}, {}};
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 6; ++j)
        for (int k = 0; k < 5; ++k) rp.v.push_back(rp0.v[size_t((k * 3 + i) * 6 + j)]);
    expect_close(matmul(p, c), ref_matmul(rp, rc), dt, "permuted batch");
  }
}

// A weight read transposed (a tied embedding as W^T, a Linear as x @ W.t()) gets its gradient as the
// transpose of a row-major product (the view's own layout), so it reaches W contiguous: no strided copy
// or element-by-element transposed add where it accumulates.
TEST_CASE("ops: matmul's gradient of a transposed operand is exact and comes in the operand's layout") {
  Gen gen(31);
  auto transposed_ref = [](const Ref& r) {  // [rows, cols] -> [cols, rows]
    const int64_t rows = r.shape[0], cols = r.shape[1];
    Ref t{{cols, rows}, {}};
    for (int64_t i = 0; i < cols; ++i)
      for (int64_t j = 0; j < rows; ++j) t.v.push_back(r.v[size_t(j * cols + i)]);
    return t;
  };
  for (DType dt : {DType::f32, DType::f64}) {
    Ref rx, rw, rg, ra, rm;
    Tensor x = gen.make({7, 5}, dt, Layout::contiguous, -1, 1, rx).set_requires_grad();
    Tensor w = gen.make({9, 5}, dt, Layout::contiguous, -1, 1, rw).set_requires_grad();
    Tensor g = gen.make({7, 9}, dt, Layout::contiguous, -1, 1, rg);
    // As the matmul hands it back: column-major, the transposed view's layout.
    const Tensor wt = w.t();
    const Tensor gwt = autograd::grad({sum(mul(matmul(x, wt), g))}, {wt}).at(0);
    CHECK(gwt.stride(0) == 1);
    CHECK(gwt.stride(1) == 5);
    sum(mul(matmul(x, w.t()), g)).backward();  // dL/dy = g
    REQUIRE(w.grad().defined());
    CHECK(w.grad().is_contiguous());
    expect_close(w.grad(), ref_matmul(transposed_ref(rg), rx), dt, "grad of W in x @ W.t()");  // g^T x
    expect_close(x.grad(), ref_matmul(rg, rw), dt, "grad of x in x @ W.t()");                  // g W
    // The first operand transposed: y = A.t() @ m.
    Tensor a = gen.make({5, 7}, dt, Layout::contiguous, -1, 1, ra).set_requires_grad();
    Tensor m = gen.make({5, 9}, dt, Layout::contiguous, -1, 1, rm).set_requires_grad();
    const Tensor at = a.t();
    const Tensor gat = autograd::grad({sum(mul(matmul(at, m), g))}, {at}).at(0);
    CHECK(gat.stride(0) == 1);
    CHECK(gat.stride(1) == 7);
    sum(mul(matmul(a.t(), m), g)).backward();
    CHECK(a.grad().is_contiguous());
    expect_close(a.grad(), ref_matmul(rm, transposed_ref(rg)), dt, "grad of A in A.t() @ m");  // m g^T
    expect_close(m.grad(), ref_matmul(ra, rg), dt, "grad of m in A.t() @ m");                  // A g
  }
}

// A linear layer on [batch, rows, features] (x @ W.t(), W 2-D) runs as one product over batch * rows rows, so
// W's gradient is one GEMM over every row: no [batch, out, in] gradient per batch entry summed afterwards.
TEST_CASE("ops: matmul of a stack of matrices by one matrix: exact gradients, no per-batch weight gradients") {
  Gen gen(32);
  auto flat = [](Ref r) {  // [..., k] -> [rows, k]: the same values, row-major
    const int64_t k = r.shape.back();
    r.shape = {numel_of(r.shape) / k, k};
    return r;
  };
  auto transposed_ref = [](const Ref& r) {
    Ref t{{r.shape[1], r.shape[0]}, {}};
    for (int64_t i = 0; i < r.shape[1]; ++i)
      for (int64_t j = 0; j < r.shape[0]; ++j) t.v.push_back(r.v[size_t(j * r.shape[1] + i)]);
    return t;
  };
  for (DType dt : {DType::f32, DType::f64}) {
    // Row-major x folds into one product; x with transposed matrices does not (the batched path).
    for (Layout l : {Layout::contiguous, Layout::transposed}) {
      CAPTURE(layout_name(l));
      Ref rx, rw, rg;
      Tensor x = gen.make({3, 2, 5, 7}, dt, l, -1, 1, rx).set_requires_grad();
      Tensor w = gen.make({6, 7}, dt, Layout::contiguous, -1, 1, rw).set_requires_grad();
      Tensor g = gen.make({3, 2, 5, 6}, dt, Layout::contiguous, -1, 1, rg);
      const Tensor y = matmul(x, w.t());
      REQUIRE(y.shape() == Shape{3, 2, 5, 6});
      expect_close(y, ref_matmul(rx, transposed_ref(rw)), dt, "x @ W.t()");
      sum(mul(y, g)).backward();
      CHECK(w.grad().is_contiguous());
      expect_close(w.grad(), ref_matmul(transposed_ref(flat(rg)), flat(rx)), dt, "grad of W: g^T x over every row");
      expect_close(x.grad(), ref_matmul(rg, rw), dt, "grad of x: g W");
    }
  }
  // The memory the backward takes: a per-batch gradient of W would be [256, 64, 64] f32, 4 MiB. One row per
  // batch entry, contiguous or a slice of longer rows (the rows then step by the batch stride).
  const Tensor whole = randn({256, 3, 64}).set_requires_grad();
  for (const Tensor& x : {randn({256, 1, 64}).set_requires_grad(), whole.slice(1, 1, 2)}) {
    CAPTURE(x.strides());
    Tensor w = randn({64, 64}).set_requires_grad();
    const Tensor loss = sum(mul(matmul(x, w.t()), randn({256, 1, 64})));
    const size_t before = cpu_memory_stats().allocated;
    reset_cpu_memory_peak();
    loss.backward();
    CHECK(cpu_memory_stats().peak_allocated - before < size_t(1) << 20);
  }
}

TEST_CASE("ops: matmul across GEMM cache blocks, transposed or not") {
  Gen gen(14);
  struct MKN {
    int64_t m, k, n;
  };
  const MKN sizes[] = {{20, 400, 390}, {7, 385, 65}, {1, 800, 1}, {100, 3, 100}, {13, 1, 129}, {6, 64, 64}};
  for (DType dt : {DType::f32, DType::f64}) {
    for (const MKN& z : sizes) {
      for (int ta = 0; ta < 2; ++ta) {
        for (int tb = 0; tb < 2; ++tb) {
          // Logical A is m x k, B is k x n; stored transposed when ta / tb.
          const std::vector<double> av = gen.values(z.m * z.k, -1, 1, dt), bv = gen.values(z.k * z.n, -1, 1, dt);
          std::vector<double> as(av.size()), bs(bv.size());
          for (int64_t i = 0; i < z.m; ++i)
            for (int64_t p = 0; p < z.k; ++p) as[size_t(p * z.m + i)] = av[size_t(i * z.k + p)];
          for (int64_t p = 0; p < z.k; ++p)
            for (int64_t j = 0; j < z.n; ++j) bs[size_t(j * z.k + p)] = bv[size_t(p * z.n + j)];
          Tensor a = ta ? from_vector(as, {z.k, z.m}, dt).t() : from_vector(av, {z.m, z.k}, dt);
          Tensor b = tb ? from_vector(bs, {z.n, z.k}, dt).t() : from_vector(bv, {z.k, z.n}, dt);
          Ref want{{z.m, z.n}, std::vector<double>(size_t(z.m * z.n), 0.0)};
          for (int64_t i = 0; i < z.m; ++i)
            for (int64_t p = 0; p < z.k; ++p) {
              const double x = av[size_t(i * z.k + p)];
              for (int64_t j = 0; j < z.n; ++j) want.v[size_t(i * z.n + j)] += x * bv[size_t(p * z.n + j)];
            }
          const Tol tol = dt == DType::f64 ? Tol{1e-11, 1e-11} : Tol{2e-5 * std::sqrt(double(z.k)), 1e-5};
          expect_close(matmul(a, b), want, tol,
                       std::string("gemm ") + dtype_name(dt) + " m=" + std::to_string(z.m) + " k=" + std::to_string(z.k) +
                           " n=" + std::to_string(z.n) + (ta ? " A^T" : "") + (tb ? " B^T" : ""));
        }
      }
    }
  }
}

TEST_CASE("ops: matmul of two vectors is a 0-dim dot product") {
  Tensor d;
  CHECK_NOTHROW(d = matmul(from_vector({1, 2, 3}, {3}), from_vector({4, 5, 6}, {3})));
  if (d.defined()) {
    CHECK(d.dim() == 0);
    expect_close(d, Ref{{}, {32}}, Tol{0, 0}, "dot");
  }
  Gen gen(13);
  for (DType dt : kFloat)
    for (Layout l : {Layout::contiguous, Layout::strided}) {
      Ref ra, rb;
      Tensor a = gen.make({17}, dt, l, -1, 1, ra);
      Tensor b = gen.make({17}, dt, Layout::strided, -1, 1, rb);
      Tensor y;
      try {
        y = matmul(a, b);
      } catch (const std::exception& e) {
        FAIL_CHECK("dot of [17] and [17] ", std::string(dtype_name(dt)), " threw: ", std::string(e.what()));
        continue;
      }
      CHECK(y.dtype() == dt);
      Tol tol = tol_for(dt);
      tol.atol *= 2;
      expect_close(y, ref_matmul(ra, rb), tol, std::string("dot ") + dtype_name(dt));
    }
}

TEST_CASE("ops: matmul errors and exact small products") {
  Tensor a = from_vector({1, 2, 3, 4, 5, 6}, {2, 3}, DType::f64);
  Tensor b = from_vector({7, 8, 9, 10, 11, 12}, {3, 2}, DType::f64);
  expect_close(matmul(a, b), Ref{{2, 2}, {58, 64, 139, 154}}, Tol{0, 0}, "2x3 @ 3x2");
  expect_close(matmul(eye(3), from_vector({1, 2, 3}, {3})), Ref{{3}, {1, 2, 3}}, Tol{0, 0}, "eye @ v");
  // Mixed dtypes promote.
  CHECK(matmul(ones({2, 2}), ones({2, 2}, DType::f64)).dtype() == DType::f64);
  CHECK(matmul(ones({2, 2}, DType::f16), ones({2, 2}, DType::bf16)).dtype() == DType::f32);
  const std::string e1 = error_of([] { matmul(ones({2, 3}), ones({4, 5})); });
  CHECK(contains(e1, "[2,3]"));
  CHECK(contains(e1, "[4,5]"));
  CHECK(error_of([] { matmul(ones({3}), ones({4})); }) != "NO ERROR");
  CHECK(error_of([] { matmul(scalar_tensor(1), ones({1})); }) != "NO ERROR");
  CHECK(error_of([] { matmul(ones({2, 2, 3}), ones({3, 3, 4})); }) != "NO ERROR");  // batch 2 vs 3
  CHECK(error_of([] { matmul(ones({2, 2}, DType::i32), ones({2, 2}, DType::i32)); }) != "NO ERROR");
}

TEST_CASE("ops: index_put into i64 is exact, with and without accumulate") {
  // scatter combines integers in f64 and refuses i64; index_put moves and adds i64 values as integers.
  const int64_t big = (int64_t(1) << 60) + 3;
  const std::vector<int64_t> xv{1, big, 5, 7}, iv{2, 1, 2, 1, 1}, vv{big, 1, -3, (int64_t(1) << 55) + 1, 7};
  const Tensor x = from_blob_copy(xv.data(), {4}), idx = from_blob_copy(iv.data(), {5}),
               v = from_blob_copy(vv.data(), {5});
  const Tensor acc = index_put(x, {idx}, v, true);
  CHECK(acc.dtype() == DType::i64);
  CHECK(acc.values<int64_t>() == std::vector<int64_t>{1, big + 1 + (int64_t(1) << 55) + 1 + 7, 5 + big - 3, 7});
  const Tensor put = index_put(x, {idx}, v, false);  // the last write to a place wins
  CHECK(put.values<int64_t>() == std::vector<int64_t>{1, 7, -3, 7});
  // rows of a 2-D tensor, a bool mask, broadcast values, no index at all
  const std::vector<int64_t> rv{big, -big};
  const Tensor rows = index_put(zeros({3, 2}, DType::i64), {from_vector({0, 2, 0}, {3}, DType::i64)},
                                from_blob_copy(rv.data(), {1, 2}), true);
  CHECK(rows.values<int64_t>() == std::vector<int64_t>{2 * big, -2 * big, 0, 0, big, -big});
  const Tensor masked =
      index_put(from_blob_copy(xv.data(), {2, 2}), {gt(from_blob_copy(xv.data(), {2, 2}), full({}, 4.0, DType::i64))},
                from_blob_copy(rv.data(), {1}));
  CHECK(masked.values<int64_t>() == std::vector<int64_t>{1, big, big, big});
  CHECK(index_put(x, {zeros({0}, DType::i64)}, zeros({0}, DType::i64), true).values<int64_t>() == xv);
}

TEST_CASE("ops: alpha_fits is PyTorch's integer alpha rule, and add/sub refuse what it refuses") {
  CHECK(alpha_fits(DType::f32, 0.5));
  CHECK(alpha_fits(DType::boolean, 0.0));
  CHECK(alpha_fits(DType::i8, 127));
  CHECK_FALSE(alpha_fits(DType::i8, 128));
  CHECK(alpha_fits(DType::i8, -128));
  CHECK_FALSE(alpha_fits(DType::i8, -128, /*subtracts=*/true));  // sub negates: 128 is no i8
  CHECK(alpha_fits(DType::i8, 128, /*subtracts=*/true));
  CHECK(alpha_fits(DType::u8, -255));  // taken modulo 256
  CHECK_FALSE(alpha_fits(DType::u8, -256));
  CHECK_FALSE(alpha_fits(DType::u8, 256));
  CHECK_FALSE(alpha_fits(DType::i32, 2.5));
  CHECK_FALSE(alpha_fits(DType::i64, std::nan("")));
  CHECK(alpha_fits(DType::i64, -0x1p63, /*subtracts=*/true));  // PyTorch negates in int64: -2**63 stays
  CHECK(contains(error_of([] { add(ones({2}, DType::i8), ones({2}, DType::i8), 128); }),
                 "add: alpha 128 is not a value of i8"));
  CHECK(contains(error_of([] { sub(ones({2}, DType::u8), ones({2}, DType::u8), -256); }),
                 "sub: alpha -256, negated, is not a value of u8 (-255 to 255, as PyTorch's)"));
  CHECK(add(ones({2}, DType::u8), ones({2}, DType::u8), -1).to_vector() == std::vector<double>{0, 0});
}

TEST_CASE("ops: bitwise and, or, xor, not and shifts on integers and bool, as PyTorch's") {
  using V = std::vector<double>;
  const Tensor x = from_vector({12, -5, 0, 255}, {4}, DType::i32), y = from_vector({10, 3, -1, 256}, {4}, DType::i32);
  CHECK(bitwise_and(x, y).to_vector() == V{8, 3, 0, 0});
  CHECK(bitwise_or(x, y).to_vector() == V{14, -5, -1, 511});
  CHECK(bitwise_xor(x, y).to_vector() == V{6, -8, -1, 511});
  CHECK(bitwise_not(x).to_vector() == V{-13, 4, -1, -256});
  CHECK(bitwise_not(x).dtype() == DType::i32);
  // Every integer dtype keeps its own (u8's not is 255 - x; i8, i16, i64 two's complement).
  for (DType dt : {DType::u8, DType::i8, DType::i16, DType::i32, DType::i64}) {
    CAPTURE(std::string(dtype_name(dt)));
    const Tensor a = from_vector({6, 5}, {2}, dt), b = from_vector({3, 1}, {2}, dt);
    CHECK(bitwise_and(a, b).dtype() == dt);
    CHECK(bitwise_and(a, b).to_vector() == V{2, 1});
    CHECK(bitwise_or(a, b).to_vector() == V{7, 5});
    CHECK(bitwise_xor(a, b).to_vector() == V{5, 4});
    CHECK(bitwise_not(a).to_vector() == (dt == DType::u8 ? V{249, 250} : V{-7, -6}));
  }
  // bool: logical and, or, xor, not; the result stays bool.
  const Tensor p = from_vector({1, 1, 0, 0}, {4}, DType::boolean), q = from_vector({1, 0, 1, 0}, {4}, DType::boolean);
  CHECK(bitwise_and(p, q).dtype() == DType::boolean);
  CHECK(bitwise_and(p, q).to_vector() == V{1, 0, 0, 0});
  CHECK(bitwise_or(p, q).to_vector() == V{1, 1, 1, 0});
  CHECK(bitwise_xor(p, q).to_vector() == V{0, 1, 1, 0});
  CHECK(bitwise_not(p).dtype() == DType::boolean);
  CHECK(bitwise_not(p).to_vector() == V{0, 0, 1, 1});
  // Promotion as result_type: i32 with i64 gives i64, bool with an integer that integer, u8 with i8 i16; a
  // 0-dim i64 beside an i8 tensor counts by its category (i8).
  CHECK(bitwise_and(x, y.to(DType::i64)).dtype() == DType::i64);
  CHECK(bitwise_or(p, x).dtype() == DType::i32);
  CHECK(bitwise_or(p, x).to_vector() == V{13, -5, 0, 255});
  CHECK(bitwise_xor(from_vector({1}, {1}, DType::u8), from_vector({-1}, {1}, DType::i8)).dtype() == DType::i16);
  CHECK(bitwise_xor(from_vector({1}, {1}, DType::u8), from_vector({-1}, {1}, DType::i8)).to_vector() == V{-2});
  CHECK(bitwise_and(from_vector({7}, {1}, DType::i8), scalar_tensor(5, DType::i64)).dtype() == DType::i8);
  // Broadcasting, and a transposed (non-contiguous) operand.
  const Tensor col = from_vector({1, 2}, {2, 1}, DType::i64), row = from_vector({3, 6, 5}, {3}, DType::i64);
  CHECK(bitwise_and(col, row).shape() == Shape{2, 3});
  CHECK(bitwise_and(col, row).to_vector() == V{1, 0, 1, 2, 2, 0});
  const Tensor m = from_vector({1, 2, 4, 8, 16, 32}, {2, 3}, DType::i64);
  CHECK(bitwise_or(m.t(), from_vector({64, 128}, {2}, DType::i64)).to_vector() == V{65, 136, 66, 144, 68, 160});
  // Shifts: an amount out of [0, width) gives 0 to the left and the sign fill to the right.
  const Tensor v = from_vector({-5, 3, 1, -1, -8, 200}, {6}, DType::i64);
  const Tensor k = from_vector({1, 62, 64, -1, 70, 3}, {6}, DType::i64);
  CHECK(bitwise_left_shift(v, k).to_vector() == V{-10, double(int64_t(3) << 62), 0, 0, 0, 1600});
  CHECK(bitwise_right_shift(v, k).to_vector() == V{-3, 0, 0, -1, -1, 25});
  const Tensor v8 = from_vector({-128, 64, 200 - 256, 1}, {4}, DType::i8),
               k8 = from_vector({1, 1, 7, 8}, {4}, DType::i8);
  CHECK(bitwise_left_shift(v8, k8).to_vector() == V{0, -128, 0, 0});  // wraps at 8 bits
  CHECK(bitwise_right_shift(v8, k8).to_vector() == V{-64, 32, -1, 0});
  const Tensor u = from_vector({200, 7}, {2}, DType::u8), ku = from_vector({9, 3}, {2}, DType::u8);
  CHECK(bitwise_right_shift(u, ku).to_vector() == V{0, 0});
  CHECK(bitwise_left_shift(u, ku).to_vector() == V{0, 56});
  CHECK(bitwise_left_shift(p, from_vector({2}, {1}, DType::i32)).to_vector() == V{4, 4, 0, 0});
  CHECK(contains(error_of([&] { bitwise_left_shift(p, q); }), "bitwise_left_shift: not defined for two bool"));
  // A floating operand is refused, naming the op, the operand and its dtype; no value is taken as an integer.
  CHECK(contains(error_of([&] { bitwise_and(x, from_vector({1.5}, {1})); }), "bitwise_and: the second operand is f32"));
  CHECK(contains(error_of([&] { bitwise_or(from_vector({1}, {1}, DType::f16), x); }),
                 "bitwise_or: the first operand is f16"));
  CHECK(
      contains(error_of([&] { bitwise_not(from_vector({1}, {1}, DType::bf16)); }), "bitwise_not: the operand is bf16"));
  CHECK(contains(error_of([&] { bitwise_right_shift(x, scalar_tensor(1.0, DType::f64)); }),
                 "bitwise_right_shift: the second operand is f64"));
  // Not differentiable: a float tensor that requires grad never reaches them, and the results are plain tensors.
  CHECK(!bitwise_xor(x, y).requires_grad());
  CHECK(!bitwise_not(p).requires_grad());
}
