// The op table's rows and the harness that runs them (see op_table.h). Rows are grouped as the
// public headers are: elementwise, reductions, linear algebra, neural-network ops, indexing,
// factories. A row's inputs are small enough for finite differences and large enough to reach the
// vectorised and multi-block paths (rows of 1100 for softmax, 1000-long sums).
#include "tests/op_table.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <set>
#include <sstream>

#include "engine/autograd.h"
#include "engine/nn_ops.h"
#include "engine/ops.h"

namespace kiln::optable {

namespace {

using V = std::vector<Tensor>;
using amp::AutocastOp;

V one(const Tensor& t) { return {t}; }

// Plain f64 references, element by element over contiguous CPU copies.
Tensor map1(const Tensor& x, const std::function<double(double)>& f) {
  std::vector<double> v = x.to_vector();
  for (double& e : v) e = f(e);
  return from_vector(v, x.shape(), DType::f64);
}
Tensor map2(const Tensor& a, const Tensor& b, const std::function<double(double, double)>& f) {
  const Shape s = broadcast_shapes(a.shape(), b.shape());
  const std::vector<double> x = a.expand(s).contiguous().to_vector(), y = b.expand(s).contiguous().to_vector();
  std::vector<double> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = f(x[i], y[i]);
  return from_vector(out, s, DType::f64);
}
// Softmax or log-softmax over `dim`, with the max subtracted first.
Tensor softmax_ref(const Tensor& x, int64_t dim, bool log) {
  const int64_t last = x.dim() - 1;
  const Tensor m = x.transpose(dim, last).contiguous();
  const int64_t n = m.shape()[size_t(last)], rows = m.numel() / std::max<int64_t>(n, 1);
  std::vector<double> v = m.to_vector();
  for (int64_t r = 0; r < rows; ++r) {
    double* p = v.data() + r * n;
    const double mx = *std::max_element(p, p + n);
    double s = 0;
    for (int64_t i = 0; i < n; ++i) s += std::exp(p[i] - mx);
    for (int64_t i = 0; i < n; ++i) p[i] = log ? (p[i] - mx) - std::log(s) : std::exp(p[i] - mx) / s;
  }
  return from_vector(v, m.shape(), DType::f64).transpose(dim, last).contiguous();
}
// Convolution in 1 to 3 spatial dims by its definition (transposed: each input element scattered
// through the kernel), f64. s, p, d, op (output padding): one per spatial dim.
Tensor conv_ref(const Tensor& xt, const Tensor& wt, const Tensor& bt, std::vector<int64_t> s, std::vector<int64_t> p,
                std::vector<int64_t> d, int64_t groups, bool transposed = false, std::vector<int64_t> op = {}) {
  const int64_t nd = xt.dim() - 2;
  std::vector<int64_t> in(3, 1), k(3, 1), out(3, 1);
  s.resize(3, 1), p.resize(3, 0), d.resize(3, 1), op.resize(3, 0);
  for (int64_t i = 0; i < nd; ++i) in[size_t(i)] = xt.size(2 + i), k[size_t(i)] = wt.size(2 + i);
  const int64_t n = xt.size(0), c = xt.size(1);
  const int64_t o = transposed ? wt.size(1) * groups : wt.size(0), cg = c / groups, og = o / groups;
  for (size_t i = 0; i < 3; ++i)
    out[i] = transposed ? (in[i] - 1) * s[i] - 2 * p[i] + d[i] * (k[i] - 1) + op[i] + 1
                        : (in[i] + 2 * p[i] - d[i] * (k[i] - 1) - 1) / s[i] + 1;
  const std::vector<double> x = xt.contiguous().to_vector(), w = wt.contiguous().to_vector();
  std::vector<double> y(size_t(n * o * out[0] * out[1] * out[2]), 0.0);
  const auto at = [](const std::vector<int64_t>& sz, int64_t a, int64_t b, int64_t cc) {
    return (a * sz[1] + b) * sz[2] + cc;
  };
  for (int64_t b = 0; b < n; ++b)
    for (int64_t g = 0; g < groups; ++g)
      for (int64_t ci = 0; ci < cg; ++ci)
        for (int64_t co = 0; co < og; ++co)
          for (int64_t k0 = 0; k0 < k[0]; ++k0)
            for (int64_t k1 = 0; k1 < k[1]; ++k1)
              for (int64_t k2 = 0; k2 < k[2]; ++k2) {
                const int64_t kk = at(k, k0, k1, k2);
                const double wv = transposed ? w[size_t(((g * cg + ci) * og + co) * k[0] * k[1] * k[2] + kk)]
                                             : w[size_t(((g * og + co) * cg + ci) * k[0] * k[1] * k[2] + kk)];
                // The "small" side (conv input, transposed output) indexes the big one through the kernel.
                const std::vector<int64_t>& big = transposed ? in : out;
                for (int64_t a0 = 0; a0 < big[0]; ++a0)
                  for (int64_t a1 = 0; a1 < big[1]; ++a1)
                    for (int64_t a2 = 0; a2 < big[2]; ++a2) {
                      const int64_t i0 = a0 * s[0] - p[0] + k0 * d[0], i1 = a1 * s[1] - p[1] + k1 * d[1],
                                    i2 = a2 * s[2] - p[2] + k2 * d[2];
                      const std::vector<int64_t>& other = transposed ? out : in;
                      if (i0 < 0 || i1 < 0 || i2 < 0 || i0 >= other[0] || i1 >= other[1] || i2 >= other[2]) continue;
                      const int64_t xi = (b * c + g * cg + ci) * in[0] * in[1] * in[2];
                      const int64_t yi = (b * o + g * og + co) * out[0] * out[1] * out[2];
                      if (transposed)
                        y[size_t(yi + at(out, i0, i1, i2))] += x[size_t(xi + at(in, a0, a1, a2))] * wv;
                      else
                        y[size_t(yi + at(out, a0, a1, a2))] += x[size_t(xi + at(in, i0, i1, i2))] * wv;
                    }
              }
  if (bt.defined()) {
    const std::vector<double> bv = bt.to_vector();
    const int64_t plane = out[0] * out[1] * out[2];
    for (int64_t i = 0; i < int64_t(y.size()); ++i) y[size_t(i)] += bv[size_t((i / plane) % o)];
  }
  Shape shape{n, o};
  for (int64_t i = 0; i < nd; ++i) shape.push_back(out[size_t(i)]);
  return from_vector(y, shape, DType::f64);
}
// f(row) applied to each 1-D slice of x along dim (f64 values in, one or more same-length rows out),
// results stacked back along dim; `int_out` marks outputs that are positions (i64).
std::vector<Tensor> along(const Tensor& x, int64_t dim,
                          const std::function<std::vector<std::vector<double>>(const std::vector<double>&)>& f,
                          std::vector<bool> int_out = {}) {
  const int64_t last = x.dim() - 1;
  const Tensor m = x.transpose(dim, last).contiguous();
  const int64_t n = m.size(last), rows = n ? m.numel() / n : 0;
  const std::vector<double> v = m.to_vector();
  std::vector<std::vector<double>> outs;
  int64_t len = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<std::vector<double>> got = f(std::vector<double>(v.begin() + r * n, v.begin() + (r + 1) * n));
    if (outs.empty()) outs.resize(got.size());
    for (size_t i = 0; i < got.size(); ++i) outs[i].insert(outs[i].end(), got[i].begin(), got[i].end());
    len = int64_t(got[0].size());
  }
  std::vector<Tensor> res;
  Shape s = m.shape();
  s[size_t(last)] = len;
  int_out.resize(outs.size(), false);
  for (size_t i = 0; i < outs.size(); ++i)
    res.push_back(from_vector(outs[i], s, int_out[i] ? DType::i64 : DType::f64).transpose(dim, last).contiguous());
  return res;
}
// The stable ascending or descending order of a row (NaN last ascending).
std::vector<double> order_of(const std::vector<double>& v, bool descending) {
  std::vector<double> o(v.size());
  std::iota(o.begin(), o.end(), 0.0);
  std::stable_sort(o.begin(), o.end(), [&](double a, double b) {
    const double x = v[size_t(a)], y = v[size_t(b)];
    return descending ? x > y : x < y;
  });
  return o;
}
std::vector<double> pick(const std::vector<double>& v, const std::vector<double>& at) {
  std::vector<double> o;
  for (double i : at) o.push_back(v[size_t(i)]);
  return o;
}
// Pooling in 1 to 3 spatial dims by its definition (PyTorch's output sizes, windows and divisors):
// max (values, and the flat index of the first maximum within its plane when `idx`) or average.
struct PoolRef {
  std::vector<int64_t> k, s, p, d;
  bool ceil = false, max = true, count_include_pad = true;
  int64_t divisor = 0;
};
std::vector<Tensor> pool_ref(const Tensor& xt, PoolRef q) {
  const int64_t nd = int64_t(q.k.size()), lead = xt.dim() - nd;
  q.k.resize(3, 1), q.s.resize(3, 1), q.p.resize(3, 0), q.d.resize(3, 1);
  std::vector<int64_t> in(3, 1), out(3, 1);
  for (int64_t i = 0; i < nd; ++i) in[size_t(i)] = xt.size(lead + i);
  for (size_t i = 0; i < 3; ++i) {
    const int64_t span = in[i] + 2 * q.p[i] - q.d[i] * (q.k[i] - 1) - 1;
    out[i] = (q.ceil ? (span + q.s[i] - 1) / q.s[i] : span / q.s[i]) + 1;
    if (q.ceil && (out[i] - 1) * q.s[i] >= in[i] + q.p[i]) --out[i];
  }
  const std::vector<double> x = xt.contiguous().to_vector();
  const int64_t plane = in[0] * in[1] * in[2], planes = xt.numel() / plane;
  std::vector<double> y, at;
  for (int64_t pl = 0; pl < planes; ++pl)
    for (int64_t o0 = 0; o0 < out[0]; ++o0)
      for (int64_t o1 = 0; o1 < out[1]; ++o1)
        for (int64_t o2 = 0; o2 < out[2]; ++o2) {
          const int64_t o[3] = {o0, o1, o2};
          double best = -INFINITY, sum = 0, pad_count = 1, valid = 0;
          int64_t best_at = -1;
          for (size_t i = 0; i < 3; ++i) {
            const int64_t st = o[i] * q.s[i] - q.p[i];
            pad_count *= double(std::min(st + q.k[i], in[i] + q.p[i]) - st);
          }
          for (int64_t j0 = 0; j0 < q.k[0]; ++j0)
            for (int64_t j1 = 0; j1 < q.k[1]; ++j1)
              for (int64_t j2 = 0; j2 < q.k[2]; ++j2) {
                const int64_t j[3] = {j0, j1, j2};
                int64_t pos[3];
                bool inside = true;
                for (size_t i = 0; i < 3; ++i) {
                  pos[i] = o[i] * q.s[i] - q.p[i] + j[i] * q.d[i];
                  inside = inside && pos[i] >= 0 && pos[i] < in[i];
                }
                if (!inside) continue;
                const int64_t flat = (pos[0] * in[1] + pos[1]) * in[2] + pos[2];
                const double v = x[size_t(pl * plane + flat)];
                if (v > best) best = v, best_at = flat;
                sum += v, valid += 1;
              }
          if (q.max) {
            y.push_back(best), at.push_back(double(best_at));
          } else {
            y.push_back(sum / (q.divisor ? double(q.divisor) : q.count_include_pad ? pad_count : valid));
          }
        }
  Shape shape(xt.shape().begin(), xt.shape().begin() + lead);
  for (int64_t i = 0; i < nd; ++i) shape.push_back(out[size_t(i)]);
  std::vector<Tensor> r{from_vector(y, shape, DType::f64)};
  if (q.max) r.push_back(from_vector(at, shape, DType::i64));
  return r;
}
// einsum by brute force: every assignment of values to the labels (explicit "->", no "..."), the
// product of the operands' elements added into the output's.
Tensor einsum_ref(const std::string& eq, const std::vector<Tensor>& ops) {
  const size_t arrow = eq.find("->");
  std::vector<std::string> terms;
  std::string lhs = eq.substr(0, arrow), out = eq.substr(arrow + 2);
  for (size_t s = 0;;) {
    const size_t c = lhs.find(',', s);
    terms.push_back(lhs.substr(s, c == std::string::npos ? std::string::npos : c - s));
    if (c == std::string::npos) break;
    s = c + 1;
  }
  std::string labels;
  std::vector<int64_t> size;
  std::vector<std::vector<double>> vals;
  for (size_t i = 0; i < terms.size(); ++i) {
    vals.push_back(ops[i].contiguous().to_vector());
    for (size_t d = 0; d < terms[i].size(); ++d)
      if (labels.find(terms[i][d]) == std::string::npos) labels += terms[i][d], size.push_back(ops[i].size(int64_t(d)));
  }
  Shape oshape;
  for (char c : out) oshape.push_back(size[labels.find(c)]);
  int64_t on = 1;
  for (int64_t s : oshape) on *= s;
  std::vector<double> res(size_t(on), 0.0);
  std::vector<int64_t> v(labels.size(), 0);
  const auto flat = [&](const std::string& t, const Shape& shape) {
    int64_t f = 0;
    for (size_t d = 0; d < t.size(); ++d) f = f * shape[d] + v[labels.find(t[d])];
    return f;
  };
  for (;;) {
    double p = 1;
    for (size_t i = 0; i < terms.size(); ++i) p *= vals[i][size_t(flat(terms[i], ops[i].shape()))];
    res[size_t(flat(out, oshape))] += p;
    size_t l = 0;
    while (l < v.size() && ++v[l] == size[l]) v[l++] = 0;
    if (l == v.size()) break;
  }
  return from_vector(res, oshape, DType::f64);
}
Tensor matmul_ref(const Tensor& a, const Tensor& b) {
  const int64_t m = a.shape()[0], k = a.shape()[1], n = b.shape()[1];
  const std::vector<double> x = a.contiguous().to_vector(), y = b.contiguous().to_vector();
  std::vector<double> out(size_t(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t p = 0; p < k; ++p) s += x[size_t(i * k + p)] * y[size_t(p * n + j)];
      out[size_t(i * n + j)] = s;
    }
  return from_vector(out, {m, n}, DType::f64);
}

double gelu_exact(double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }
// erf's inverse by bisection: slow, plain, exact to the last bit of a double.
double erfinv_ref(double x) {
  double lo = -6, hi = 6;
  for (int i = 0; i < 200; ++i) {
    const double mid = 0.5 * (lo + hi);
    (std::erf(mid) < x ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}
// Plain references for the gamma and Bessel family: recurrences up to x >= 20, then the first terms of
// the asymptotic series (far below an f64 ulp there), or the power series; bisection for ndtri.
double digamma_ref(double x) {
  if (x < 0) return digamma_ref(1 - x) - M_PI / std::tan(M_PI * x);
  double acc = 0;
  for (; x < 20; x += 1) acc -= 1 / x;
  const double z = 1 / (x * x);
  return acc + std::log(x) - 0.5 / x - z * (1.0 / 12 - z * (1.0 / 120 - z * (1.0 / 252 - z / 240)));
}
double trigamma_ref(double x) {
  double acc = 0;
  for (; x < 20; x += 1) acc += 1 / (x * x);
  const double z = 1 / (x * x);
  return acc + 1 / x + z / 2 + z / x * (1.0 / 6 - z * (1.0 / 30 - z * (1.0 / 42 - z / 30)));
}
double tetragamma_ref(double x) {
  double acc = 0;
  for (; x < 20; x += 1) acc -= 2 / (x * x * x);
  const double z = 1 / (x * x);
  return acc - z - z / x - z * z * (0.5 - z * (1.0 / 6 - z * (1.0 / 6 - z * 3 / 10)));
}
double bessel_i_ref(int nu, double x, bool scaled) {
  const double q = x * x / 4;
  double term = nu ? x / 2 : 1, sum = term;
  for (int k = 1; k < 100; ++k) sum += term *= q / (k * (k + nu));
  return scaled ? sum * std::exp(-std::abs(x)) : sum;
}
double ndtr_ref(double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); }
double ndtri_ref(double p) {
  double lo = -10, hi = 10;
  for (int i = 0; i < 200; ++i) {
    const double mid = 0.5 * (lo + hi);
    (ndtr_ref(mid) < p ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}
double softplus_ref(double x, double beta, double threshold) {
  return beta * x > threshold ? x : std::log1p(std::exp(beta * x)) / beta;
}
constexpr double kSeluAlpha = 1.6732632423543772848170429916717, kSeluScale = 1.0507009873554804934193349852946;
double gelu_tanh(double x) { return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }

std::vector<Row> build() {
  std::vector<Row> v;
  auto row = [&](std::string name, std::vector<In> inputs, Fn fn) -> Row& {
    Row r;
    r.name = std::move(name);
    r.inputs = std::move(inputs);
    r.fn = std::move(fn);
    v.push_back(std::move(r));
    return v.back();
  };
  const AutocastOp ew = AutocastOp::elementwise;

  // ---- elementwise: unary on [33, 17], binary with the second operand broadcast ----
  auto un = [&](const char* name, Tensor (*f)(const Tensor&), double (*r)(double), Kind k = Kind::normal) -> Row& {
    return row(name, {{{33, 17}, k}}, [f](const V& x) { return one(f(x[0])); })
        .ref([r](const V& x) { return one(map1(x[0], r)); })
        .autocast(ew);
  };
  un("neg", [](const Tensor& a) { return neg(a); }, [](double x) { return -x; });
  un("abs", [](const Tensor& a) { return abs(a); }, [](double x) { return std::abs(x); }, Kind::nonzero);
  un("exp", [](const Tensor& a) { return exp(a); }, [](double x) { return std::exp(x); });
  un("log", [](const Tensor& a) { return log(a); }, [](double x) { return std::log(x); }, Kind::positive);
  un("sqrt", [](const Tensor& a) { return sqrt(a); }, [](double x) { return std::sqrt(x); }, Kind::positive);
  un("rsqrt", [](const Tensor& a) { return rsqrt(a); }, [](double x) { return 1 / std::sqrt(x); }, Kind::positive);
  un("tanh", [](const Tensor& a) { return tanh(a); }, [](double x) { return std::tanh(x); });
  un("sigmoid", [](const Tensor& a) { return sigmoid(a); }, [](double x) { return 1 / (1 + std::exp(-x)); });
  un(
      "relu", [](const Tensor& a) { return relu(a); }, [](double x) { return x <= 0 ? 0.0 : x; }, Kind::nonzero);
  un("gelu", [](const Tensor& a) { return gelu(a); }, gelu_exact);
  un("gelu_tanh", [](const Tensor& a) { return gelu(a, GeluApprox::tanh); }, gelu_tanh).covers({"gelu"});
  // Elementwise math (docs/ops.md), inputs inside each function's domain.
  un(
      "sin", [](const Tensor& a) { return sin(a); }, [](double x) { return std::sin(x); });
  un(
      "cos", [](const Tensor& a) { return cos(a); }, [](double x) { return std::cos(x); });
  un(
      "tan", [](const Tensor& a) { return tan(a); }, [](double x) { return std::tan(x); }, Kind::unit);
  un(
      "asin", [](const Tensor& a) { return asin(a); }, [](double x) { return std::asin(x); }, Kind::unit);
  un(
      "acos", [](const Tensor& a) { return acos(a); }, [](double x) { return std::acos(x); }, Kind::unit);
  un(
      "atan", [](const Tensor& a) { return atan(a); }, [](double x) { return std::atan(x); });
  un(
      "sinh", [](const Tensor& a) { return sinh(a); }, [](double x) { return std::sinh(x); });
  un(
      "cosh", [](const Tensor& a) { return cosh(a); }, [](double x) { return std::cosh(x); });
  un(
      "asinh", [](const Tensor& a) { return asinh(a); }, [](double x) { return std::asinh(x); });
  un(  // acosh over [1.5, 2.5): defined from 1, its derivative infinite there
      "acosh", [](const Tensor& a) { return acosh(a + 1.0); }, [](double x) { return std::acosh(x + 1.0); },
      Kind::positive);
  un(  // atanh over [0, 0.8): its derivative 1 / (1 - x^2) grows without bound towards 1
      "atanh", [](const Tensor& a) { return atanh(a * 0.8); }, [](double x) { return std::atanh(x * 0.8); },
      Kind::unit);
  un(
      "erf", [](const Tensor& a) { return erf(a); }, [](double x) { return std::erf(x); });
  un(
      "erfc", [](const Tensor& a) { return erfc(a); }, [](double x) { return std::erfc(x); });
  // erfinv over (-0.96, 0.96), and its tail branch (|x| > 0.9925) in f32 and f64 only: 16 bits cannot
  // hold inputs that close to 1 (bf16 rounds them to 1, whose erfinv is inf).
  row("erfinv", {{{33, 17}, Kind::unit}}, [](const V& x) {
    return one(erfinv(x[0] * 1.92 - 0.96));
  }).ref([](const V& x) {
      return one(map1(x[0], [](double e) { return erfinv_ref(e * 1.92 - 0.96); }));
    }).autocast(ew);
  row("erfinv_tail", {{{33, 17}, Kind::unit}}, [](const V& x) { return one(erfinv(x[0] * 0.007 + 0.9925)); })
      .ref([](const V& x) { return one(map1(x[0], [](double e) { return erfinv_ref(e * 0.007 + 0.9925); })); })
      .covers({"erfinv"})
      .f32_only()
      .autocast(ew);
  // The gamma and Bessel family (engine/ops.h), inputs away from the poles of lgamma, digamma and
  // polygamma; i0e and i1e (sign(x) in their gradients) away from 0.
  un(
      "lgamma", [](const Tensor& a) { return lgamma(a); }, [](double x) { return std::lgamma(x); }, Kind::positive);
  un(
      "digamma", [](const Tensor& a) { return digamma(a); }, digamma_ref, Kind::positive);
  // digamma between the poles -3 and -2 (the reflection), in f32 and f64: 16 bits lose its steep tails
  row("digamma_negative", {{{33, 17}, Kind::unit}}, [](const V& x) { return one(digamma(x[0] * 0.4 - 2.7)); })
      .ref([](const V& x) { return one(map1(x[0], [](double e) { return digamma_ref(e * 0.4 - 2.7); })); })
      .covers({"digamma"})
      .f32_only()
      .autocast(ew);
  row("polygamma", {{{33, 17}, Kind::positive}}, [](const V& x) {
    return V{polygamma(1, x[0]), polygamma(2, x[0])};
  }).ref([](const V& x) {
      return V{map1(x[0], trigamma_ref), map1(x[0], tetragamma_ref)};
    })
      .autocast(ew)
      .tol(3e-2);  // the gradient (polygamma(n + 1)) of 16-bit inputs, rounded before the f32 compute
  row("i0", {{{33, 17}}}, [](const V& x) {
    return one(i0(x[0] * 3.0));
  }).ref([](const V& x) {
      return one(map1(x[0], [](double e) { return bessel_i_ref(0, e * 3, false); }));
    }).autocast(ew);
  row("i1", {{{33, 17}}}, [](const V& x) {
    return one(i1(x[0] * 3.0));
  }).ref([](const V& x) {
      return one(map1(x[0], [](double e) { return bessel_i_ref(1, e * 3, false); }));
    }).autocast(ew);
  row("i0e", {{{33, 17}, Kind::nonzero}}, [](const V& x) {
    return one(i0e(x[0] * 3.0));
  }).ref([](const V& x) {
      return one(map1(x[0], [](double e) { return bessel_i_ref(0, e * 3, true); }));
    }).autocast(ew);
  row("i1e", {{{33, 17}, Kind::nonzero}}, [](const V& x) {
    return one(i1e(x[0] * 3.0));
  }).ref([](const V& x) {
      return one(map1(x[0], [](double e) { return bessel_i_ref(1, e * 3, true); }));
    }).autocast(ew);
  row("ndtri", {{{33, 17}, Kind::unit}}, [](const V& x) {
    return one(ndtri(x[0] * 0.96 + 0.02));
  }).ref([](const V& x) {
      return one(map1(x[0], [](double e) { return ndtri_ref(e * 0.96 + 0.02); }));
    }).autocast(ew);
  row("log_ndtr", {{{33, 17}}}, [](const V& x) {
    return one(log_ndtr(x[0] * 3.0 - 2.0));
  }).ref([](const V& x) {
      return one(map1(x[0], [](double e) { return std::log(ndtr_ref(e * 3 - 2)); }));
    })
      .autocast(ew)
      .tol(5e-2);  // its gradient (about -x far left) amplifies the rounding of a 16-bit input
  // erfcx over [-1.5, 2.5): further below, 2 e^(x^2) leaves f16's range
  row("erfcx", {{{33, 17}, Kind::unit}}, [](const V& x) { return one(erfcx(x[0] * 4.0 - 1.5)); })
      .ref([](const V& x) {
        return one(map1(x[0], [](double e) {
          const double y = e * 4 - 1.5;
          return std::exp(y * y) * std::erfc(y);
        }));
      })
      .autocast(ew);
  un(
      "log1p", [](const Tensor& a) { return log1p(a); }, [](double x) { return std::log1p(x); }, Kind::positive);
  un(
      "expm1", [](const Tensor& a) { return expm1(a); }, [](double x) { return std::expm1(x); });
  un(
      "log2", [](const Tensor& a) { return log2(a); }, [](double x) { return std::log2(x); }, Kind::positive);
  un(
      "log10", [](const Tensor& a) { return log10(a); }, [](double x) { return std::log10(x); }, Kind::positive);
  un(
      "exp2", [](const Tensor& a) { return exp2(a); }, [](double x) { return std::exp2(x); });
  un(
      "reciprocal", [](const Tensor& a) { return reciprocal(a); }, [](double x) { return 1 / x; }, Kind::nonzero);
  // The rounding ops on 4x the inputs (several integers apart), each times x so the row has a gradient.
  row("rounding", {{{33, 17}, Kind::nonzero}},
      [](const V& x) {
        const Tensor y = x[0] * 4.0;
        return V{floor(y) * x[0], ceil(y) * x[0], round(y) * x[0], trunc(y) * x[0], frac(y)};
      })
      .ref([](const V& x) {
        return V{map1(x[0], [](double e) { return std::floor(4 * e) * e; }),
                 map1(x[0], [](double e) { return std::ceil(4 * e) * e; }),
                 map1(x[0], [](double e) { return std::nearbyint(4 * e) * e; }),
                 map1(x[0], [](double e) { return std::trunc(4 * e) * e; }),
                 map1(x[0], [](double e) { return 4 * e - std::trunc(4 * e); })};
      })
      .covers({"floor", "ceil", "round", "trunc", "frac"})
      .autocast(ew);
  // Activations (torch.nn.functional's definitions and defaults).
  un(
      "silu", [](const Tensor& a) { return silu(a); }, [](double x) { return x / (1 + std::exp(-x)); });
  un(
      "mish", [](const Tensor& a) { return mish(a); }, [](double x) { return x * std::tanh(std::log1p(std::exp(x))); });
  un(
      "softsign", [](const Tensor& a) { return softsign(a); }, [](double x) { return x / (1 + std::abs(x)); },
      Kind::nonzero);
  un(
      "logsigmoid", [](const Tensor& a) { return logsigmoid(a); }, [](double x) { return -std::log1p(std::exp(-x)); });
  row("softplus", {{{33, 17}}},
      [](const V& x) {
        return V{softplus(x[0]), softplus(x[0], 2.0, 1.0)};
      })
      .ref([](const V& x) {
        return V{map1(x[0], [](double e) { return softplus_ref(e, 1, 20); }),
                 map1(x[0], [](double e) { return softplus_ref(e, 2, 1); })};
      })
      .autocast(ew);
  row("leaky_relu", {{{33, 17}, Kind::nonzero}},
      [](const V& x) {
        return V{leaky_relu(x[0]), leaky_relu(x[0], 0.2)};
      })
      .ref([](const V& x) {
        return V{map1(x[0], [](double e) { return e > 0 ? e : 0.01 * e; }),
                 map1(x[0], [](double e) { return e > 0 ? e : 0.2 * e; })};
      })
      .autocast(ew);
  row("elu", {{{33, 17}, Kind::nonzero}},
      [](const V& x) {
        return V{elu(x[0]), elu(x[0], 0.5), selu(x[0]), celu(x[0], 0.7)};
      })
      .ref([](const V& x) {
        return V{map1(x[0], [](double e) { return e > 0 ? e : std::expm1(e); }),
                 map1(x[0], [](double e) { return e > 0 ? e : 0.5 * std::expm1(e); }),
                 map1(x[0], [](double e) { return kSeluScale * (e > 0 ? e : kSeluAlpha * std::expm1(e)); }),
                 map1(x[0], [](double e) { return e > 0 ? e : 0.7 * std::expm1(e / 0.7); })};
      })
      .covers({"elu", "selu", "celu"})
      .autocast(ew);
  row("prelu_glu", {{{6, 4, 5}, Kind::nonzero}, {{4}, Kind::positive}, {{1}, Kind::positive}},
      [](const V& x) {
        return V{prelu(x[0], x[1]), prelu(x[0], x[2]), glu(x[0], 1), glu(x[0].narrow(2, 0, 4))};
      })
      .ref([](const V& x) {
        const std::vector<double> v = x[0].to_vector(), w = x[1].to_vector();
        const double w1 = x[2].to_vector()[0];
        std::vector<double> p4(v.size()), p1(v.size()), g1, g2;
        for (size_t i = 0; i < v.size(); ++i) {
          const size_t c = (i / 5) % 4;
          p4[i] = v[i] > 0 ? v[i] : w[c] * v[i];
          p1[i] = v[i] > 0 ? v[i] : w1 * v[i];
        }
        const auto sig = [](double z) { return 1 / (1 + std::exp(-z)); };
        for (size_t n = 0; n < 6; ++n)
          for (size_t c = 0; c < 2; ++c)
            for (size_t k = 0; k < 5; ++k) g1.push_back(v[(n * 4 + c) * 5 + k] * sig(v[(n * 4 + c + 2) * 5 + k]));
        for (size_t n = 0; n < 6; ++n)
          for (size_t c = 0; c < 4; ++c)
            for (size_t k = 0; k < 2; ++k) g2.push_back(v[(n * 4 + c) * 5 + k] * sig(v[(n * 4 + c) * 5 + k + 2]));
        return V{from_vector(p4, {6, 4, 5}, DType::f64), from_vector(p1, {6, 4, 5}, DType::f64),
                 from_vector(g1, {6, 2, 5}, DType::f64), from_vector(g2, {6, 4, 2}, DType::f64)};
      })
      .covers({"prelu", "glu"})
      .autocast(ew);
  // The hard activations on 4x the inputs, so their flat parts are reached.
  row("hardtanh", {{{33, 17}, Kind::nonzero}},
      [](const V& x) {
        const Tensor y = x[0] * 4.0;
        return V{hardtanh(y), hardtanh(y, -0.5, 2.5), relu6(y * 2.0), hardsigmoid(y), hardswish(y)};
      })
      .ref([](const V& x) {
        return V{map1(x[0], [](double e) { return std::clamp(4 * e, -1.0, 1.0); }),
                 map1(x[0], [](double e) { return std::clamp(4 * e, -0.5, 2.5); }),
                 map1(x[0], [](double e) { return std::clamp(8 * e, 0.0, 6.0); }),
                 map1(x[0], [](double e) { return std::clamp(4 * e / 6 + 0.5, 0.0, 1.0); }),
                 map1(x[0], [](double e) { return 4 * e * std::clamp(4 * e + 3, 0.0, 6.0) / 6; })};
      })
      .covers({"hardtanh", "relu6", "hardsigmoid", "hardswish"})
      .autocast(ew);
  // sign has no gradient of its own: times x, so the row has one to check.
  row("sign", {{{33, 17}, Kind::nonzero}}, [](const V& x) { return V{sign(x[0]), sign(x[0]) * x[0]}; })
      .ref([](const V& x) { return V{map1(x[0], [](double e) { return double((e > 0) - (e < 0)); }), map1(x[0], [](double e) { return std::abs(e); })}; })
      .autocast(ew);
  row("clamp", {{{33, 17}}},
      [](const V& x) { return V{clamp(x[0], -0.5, 0.7), clamp(x[0], -0.5, std::nullopt), clamp(x[0], std::nullopt, 0.3)}; })
      .ref([](const V& x) {
        return V{map1(x[0], [](double e) { return std::clamp(e, -0.5, 0.7); }), map1(x[0], [](double e) { return std::max(e, -0.5); }),
                 map1(x[0], [](double e) { return std::min(e, 0.3); })};
      })
      .autocast(ew);
  row("pow_scalar", {{{33, 17}}, {{33, 17}, Kind::positive}},
      [](const V& x) { return V{pow(x[0], 2.0), pow(x[0], 3.0), pow(x[1], -1.5), pow(x[1], 0.5), pow(x[0], 0.0) + x[0]}; })
      .ref([](const V& x) {
        return V{map1(x[0], [](double e) { return e * e; }), map1(x[0], [](double e) { return e * e * e; }),
                 map1(x[1], [](double e) { return std::pow(e, -1.5); }), map1(x[1], [](double e) { return std::sqrt(e); }),
                 map1(x[0], [](double e) { return 1 + e; })};
      })
      .covers({"pow"})
      .autocast(ew);
  // The scalar operators, on both sides of the tensor.
  row("scalar_operators", {{{33, 17}}, {{33, 17}, Kind::positive}},
      [](const V& x) {
        return V{x[0] * 2.5, 2.5 * x[0], x[0] + 1.0, 1.0 + x[0], x[0] - 1.0, 1.0 - x[0], x[0] / 3.0, 3.0 / x[1], -x[0]};
      })
      .ref([](const V& x) {
        return V{map1(x[0], [](double e) { return e * 2.5; }), map1(x[0], [](double e) { return 2.5 * e; }),
                 map1(x[0], [](double e) { return e + 1; }),   map1(x[0], [](double e) { return 1 + e; }),
                 map1(x[0], [](double e) { return e - 1; }),   map1(x[0], [](double e) { return 1 - e; }),
                 map1(x[0], [](double e) { return e / 3; }),   map1(x[1], [](double e) { return 3 / e; }),
                 map1(x[0], [](double e) { return -e; })};
      })
      .covers({"scalar_like"})
      .autocast(ew);
  // Rounding through bf16 and back: the rounding itself is compared on CUDA, not with f64.
  row("cast", {{{33, 17}}}, [](const V& x) { return V{cast(cast(x[0], DType::bf16), DType::f32)}; })
      .no_grad()
      .dtype_dependent("rounds through bf16, so f32 and f64 inputs round differently");
  // Casts that keep the values: gradients come back through them.
  row("cast_grad", {{{33, 17}}}, [](const V& x) { return V{cast(x[0], DType::f64) * x[0], cast(cast(x[0], DType::f64) * 2.0, x[0].dtype())}; })
      .covers({"cast"});
  row("contiguous", {{{33, 17}}}, [](const V& x) { return one(x[0].t().contiguous() * x[0].t()); })
      .covers({})
      .autocast(AutocastOp::elementwise);

  auto bin = [&](const char* name, Tensor (*f)(const Tensor&, const Tensor&), double (*r)(double, double),
                 Kind kb = Kind::normal) -> Row& {
    return row(name, {{{8, 33, 17}}, {{33, 1}, kb}}, [f](const V& x) { return one(f(x[0], x[1])); })
        .ref([r](const V& x) { return one(map2(x[0], x[1], r)); })
        .autocast(ew);
  };
  bin("add", [](const Tensor& a, const Tensor& b) { return add(a, b, 0.5); }, [](double a, double b) { return a + 0.5 * b; });
  bin("sub", [](const Tensor& a, const Tensor& b) { return sub(a, b, 2.0); }, [](double a, double b) { return a - 2 * b; });
  bin("mul", [](const Tensor& a, const Tensor& b) { return a * b; }, [](double a, double b) { return a * b; });
  bin("div", [](const Tensor& a, const Tensor& b) { return a / b; }, [](double a, double b) { return a / b; }, Kind::positive);
  bin("maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); }, [](double a, double b) { return std::max(a, b); });
  bin("minimum", [](const Tensor& a, const Tensor& b) { return minimum(a, b); }, [](double a, double b) { return std::min(a, b); });
  row("pow", {{{8, 33, 17}, Kind::positive}, {{33, 17}}}, [](const V& x) { return one(pow(x[0], x[1])); })
      .ref([](const V& x) { return one(map2(x[0], x[1], [](double a, double b) { return std::pow(a, b); })); })
      .autocast(ew)
      .tol(3e-2);
  // Divisors of both signs (|b| in [0.5, 1.5)); quotients up to about 10, away from the jumps almost surely.
  row("fmod_remainder", {{{6, 33, 17}}, {{33, 17}, Kind::positive}},
      [](const V& x) {
        const Tensor& a = x[0];  // no arithmetic before the op: a rounded product could cross a jump
        return V{fmod(a, x[1]), remainder(a, x[1]), fmod(a, neg(x[1])), remainder(a, neg(x[1])), remainder(a, 0.75)};
      })
      .ref([](const V& x) {
        const Tensor& a = x[0];
        const auto f = [](double p, double q) { return p - q * std::trunc(p / q); };
        const auto r = [](double p, double q) { return p - q * std::floor(p / q); };
        return V{map2(a, x[1], f), map2(a, x[1], r), map2(a, neg(x[1]), f), map2(a, neg(x[1]), r),
                 map1(a, [&](double p) { return r(p, 0.75); })};
      })
      .covers({"fmod", "remainder"})
      .autocast(ew)
      .tol(3e-2);
  // Quotients up to about 10 from divisors of both signs, away from the jumps almost surely.
  row("rounded_div", {{{6, 33, 17}}, {{33, 17}, Kind::positive}},
      [](const V& x) {
        return V{div_trunc(x[0], x[1]), floor_divide(x[0], x[1]), div_trunc(x[0], neg(x[1])),
                 floor_divide(x[0], neg(x[1]))};
      })
      .ref([](const V& x) {
        const auto t = [](double p, double q) { return std::trunc(p / q); };
        const auto f = [](double p, double q) { return std::floor(p / q); };
        return V{map2(x[0], x[1], t), map2(x[0], x[1], f), map2(x[0], neg(x[1]), t), map2(x[0], neg(x[1]), f)};
      })
      .covers({"div_trunc", "floor_divide"})
      .autocast(ew)
      .tol(3e-2);
  row("atan2", {{{6, 33, 17}}, {{33, 17}}},
      [](const V& x) {
        return V{atan2(x[0], x[1]), atan2(x[1], x[0])};
      })
      .ref([](const V& x) {
        return V{map2(x[0], x[1], [](double a, double b) { return std::atan2(a, b); }),
                 map2(x[1], x[0], [](double a, double b) { return std::atan2(a, b); })};
      })
      .autocast(ew)
      .tol(3e-2);
  // Every broadcasting pattern: scalar (0-dim) on either side, a vector against a column, 1 against many.
  row("broadcast",
      {{{3, 1, 4}},
       {{2, 1}, Kind::positive},
       {{2, 3}},
       {{}, Kind::positive},
       {{}},
       {{2, 3}, Kind::positive},
       {{4}},
       {{3, 1}, Kind::positive}},
      [](const V& x) {
        V out;
        for (int p = 0; p < 4; ++p) {
          const Tensor& a = x[size_t(2 * p)];
          const Tensor& b = x[size_t(2 * p + 1)];
          for (const Tensor& t : {add(a, b, -1.5), sub(a, b, 0.25), mul(a, b), div(a, b), maximum(a, b), minimum(a, b),
                                  pow(b, a), a * b + a / (b * b + 1.0)})
            out.push_back(t);
        }
        return out;
      })
      .covers({"add", "sub", "mul", "div", "maximum", "minimum", "pow"})
      .f32_only()
      .autocast(AutocastOp::elementwise);
  // One tensor on both sides of a binary op: both gradients land on the same leaf.
  row("same_operand", {{{7}, Kind::positive}},
      [](const V& x) {
        return V{x[0] * x[0], pow(x[0], x[0]), x[0].unsqueeze(1) / x[0]};
      })
      .covers({"mul", "pow", "div"})
      .autocast(AutocastOp::elementwise);
  row("where", {{{4, 33, 17}, Kind::mask}, {{4, 33, 17}}, {{33, 17}}, {{4, 1, 17}, Kind::mask}, {{33, 1}}, {{}}},
      [](const V& x) { return V{where(x[0], x[1], x[2]), where(x[3], x[4], x[5]), where(x[0], exp(x[2]), x[2] * x[2])}; })
      .autocast(ew);
  row("compare", {{{33, 17}}, {{33, 17}}},
      [](const V& x) {
        const Tensor a = x[0], b = x[1];
        const Tensor ge0 = ge(a, scalar_like(0.0, a));
        return V{eq(a, a), ne(a, b), lt(a, b), le(a, b), gt(a, b), ge(a, b),
                 logical_and(ge0, lt(b, scalar_like(0.0, b))), logical_or(ge0, gt(b, a)), logical_not(ge0)};
      })
      .covers({"eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_not", "scalar_like"})
      .no_grad();
  // Bitwise ops on integers and bool (no floating inputs: no gradients, nothing in 16 bits), exact: both signs,
  // broadcasting, promotion (i32 with i64, bool with i8, bool with bool), u8 / i8 / i16 wrapping, a transposed
  // operand, and shifts by amounts in and out of [0, width), negative ones too.
  row("bitwise",
      {{{33, 17}, Kind::index, 1 << 20},
       {{17}, Kind::index, 1 << 20},
       {{33, 17}, Kind::mask},
       {{17}, Kind::mask},
       {{33, 17}, Kind::index, 80}},
      [](const V& x) {
        const Tensor a = sub(x[0], full({}, 1 << 19, TensorOptions(DType::i64, x[0].device()))), b = x[1], m = x[2],
                     mb = x[3];
        const Tensor s = sub(x[4], full({}, 8, TensorOptions(DType::i64, x[4].device())));  // shift amounts in [-8, 72)
        return V{bitwise_and(a, b), bitwise_or(a, b), bitwise_xor(a, b), bitwise_not(a),
                 bitwise_and(a.to(DType::i32), b), bitwise_or(a.to(DType::i16), b.to(DType::i16)),
                 bitwise_xor(a.to(DType::u8), b.to(DType::u8)), bitwise_not(a.to(DType::u8)),
                 bitwise_and(a.to(DType::i8), m), bitwise_and(m, mb), bitwise_or(m, mb), bitwise_xor(m, mb),
                 bitwise_not(m), bitwise_xor(a.t(), b.unsqueeze(1)), bitwise_left_shift(a, s),
                 bitwise_right_shift(a, s), bitwise_left_shift(a.to(DType::i32), s.to(DType::i32)),
                 bitwise_right_shift(a.to(DType::i8), s.to(DType::i8)),
                 bitwise_right_shift(a.to(DType::u8), s.to(DType::u8)), bitwise_left_shift(m, s),
                 // An i64 shift's result goes past 2^53, where the comparison's doubles drop low bits: its
                 // low and high 32 bits each, exactly.
                 bitwise_and(bitwise_left_shift(a, s), full({}, 0xFFFFFFFFLL, TensorOptions(DType::i64, a.device()))),
                 bitwise_right_shift(bitwise_left_shift(a, s), full({}, 32, TensorOptions(DType::i64, a.device())))};
      })
      .ref([](const V& x) {
        using I = int64_t;
        const Tensor a = map1(x[0], [](double p) { return p - double(1 << 19); }), b = x[1], m = x[2], mb = x[3];
        const Tensor s = map1(x[4], [](double p) { return p - 8.0; });
        // The integer dtypes' wrapping, from the low bits (two's complement).
        const auto i32 = [](I v) { return double(int32_t(uint32_t(uint64_t(v)))); };
        const auto i16 = [](I v) { return double(int16_t(uint16_t(uint64_t(v)))); };
        const auto i8 = [](I v) { return double(int8_t(uint8_t(uint64_t(v)))); };
        const auto u8 = [](I v) { return double(uint8_t(uint64_t(v))); };
        // Shifts as PyTorch's, for a width of `bits` (signed unless u8): out of [0, width) gives 0, or the sign fill.
        const auto shl = [](I v, I k, int bits) { return k < 0 || k >= bits ? I(0) : I(uint64_t(v) << k); };
        const auto shr = [](I v, I k, int bits, bool is_signed) {
          if (k < 0 || k >= bits) return is_signed ? (v < 0 ? I(-1) : I(0)) : I(0);
          return v >> k;  // v holds the operand's value: arithmetic for a negative one
        };
        const auto f = [](const Tensor& p, const Tensor& q, std::function<double(I, I)> g) {
          return map2(p, q, [g](double u, double v) { return g(I(u), I(v)); });
        };
        const auto u = [](const Tensor& p, std::function<double(I)> g) {
          return map1(p, [g](double v) { return g(I(v)); });
        };
        return V{f(a, b, [](I p, I q) { return double(p & q); }),
                 f(a, b, [](I p, I q) { return double(p | q); }),
                 f(a, b, [](I p, I q) { return double(p ^ q); }),
                 u(a, [](I p) { return double(~p); }),
                 f(a, b, [&](I p, I q) { return double(I(i32(p)) & q); }),
                 f(a, b, [&](I p, I q) { return i16(I(i16(p)) | I(i16(q))); }),
                 f(a, b, [&](I p, I q) { return u8(I(u8(p)) ^ I(u8(q))); }),
                 u(a, [&](I p) { return u8(~I(u8(p))); }),
                 f(a, m, [&](I p, I q) { return double(I(i8(p)) & q); }),
                 f(m, mb, [](I p, I q) { return double(p & q); }),
                 f(m, mb, [](I p, I q) { return double(p | q); }),
                 f(m, mb, [](I p, I q) { return double(p ^ q); }),
                 u(m, [](I p) { return double(!p); }),
                 f(a.t(), b.unsqueeze(1), [](I p, I q) { return double(p ^ q); }),
                 f(a, s, [&](I p, I q) { return double(shl(p, q, 64)); }),
                 f(a, s, [&](I p, I q) { return double(shr(p, q, 64, true)); }),
                 f(a, s, [&](I p, I q) { return i32(shl(I(i32(p)), I(i32(q)), 32)); }),
                 f(a, s, [&](I p, I q) { return i8(shr(I(i8(p)), I(i8(q)), 8, true)); }),
                 f(a, s, [&](I p, I q) { return u8(shr(I(u8(p)), I(u8(q)), 8, false)); }),
                 f(m, s, [&](I p, I q) { return double(shl(p, q, 64)); }),
                 f(a, s, [&](I p, I q) { return double(shl(p, q, 64) & I(0xFFFFFFFFLL)); }),
                 f(a, s, [&](I p, I q) { return double(shl(p, q, 64) >> 32); })};
      })
      .covers({"bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not", "bitwise_left_shift", "bitwise_right_shift"})
      .f32_only()
      .no_grad()
      .tol(0.0, 0.0);
  row("masked_fill", {{{33, 17}}, {{33, 17}, Kind::mask}}, [](const V& x) { return one(masked_fill(x[0], x[1], -3.0)); })
      .autocast(ew);
  // x with +inf where x > 1, -inf where x < -1 and NaN where 0.5 < x < 0.6; each test as 0/1 in x's dtype.
  row("nan_inf", {{{33, 17}}},
      [](const V& x) {
        const Tensor a = x[0], inf = scalar_like(INFINITY, a);
        Tensor z = where(gt(a, scalar_like(1, a)), inf, where(lt(a, scalar_like(-1, a)), -inf, a));
        z = where(logical_and(gt(a, scalar_like(0.5, a)), lt(a, scalar_like(0.6, a))), scalar_like(NAN, a), z);
        const auto f = [&](const Tensor& b) { return where(b, ones_like(a), zeros_like(a)); };
        // nan_to_num's default for inf is the dtype's largest value: test_ops.cpp checks it per dtype.
        return V{f(isnan(z)), f(isinf(z)), f(isfinite(z)), where(isinf(z), zeros_like(a), nan_to_num(z)),
                 nan_to_num(z, 1.5, 7.0, -8.0) * a};
      })
      .ref([](const V& x) {
        const auto z = [](double e) { return e > 1 ? INFINITY : e < -1 ? -INFINITY : (e > 0.5 && e < 0.6) ? NAN : e; };
        return V{map1(x[0], [&](double e) { return std::isnan(z(e)) ? 1.0 : 0.0; }),
                 map1(x[0], [&](double e) { return std::isinf(z(e)) ? 1.0 : 0.0; }),
                 map1(x[0], [&](double e) { return std::isfinite(z(e)) ? 1.0 : 0.0; }),
                 map1(x[0], [&](double e) { return std::isinf(z(e)) || std::isnan(z(e)) ? 0.0 : e; }),
                 map1(x[0], [&](double e) {
                   return (e > 1 ? 7.0 : e < -1 ? -8.0 : (e > 0.5 && e < 0.6) ? 1.5 : e) * e;
                 })};
      })
      .covers({"isnan", "isinf", "isfinite", "nan_to_num"})
      .f32_only()
      .autocast(AutocastOp::elementwise);
  row("lerp", {{{33, 17}}, {{33, 17}}, {{17}, Kind::unit}},
      [](const V& x) {
        return V{lerp(x[0], x[1], x[2] * 2.0 - 0.5), lerp(x[0], x[1], 0.3), lerp(x[0], x[1], 0.8)};
      })
      .ref([](const V& x) {
        const Tensor w = (x[2] * 2.0 - 0.5).expand({33, 17});
        return V{x[0] + w * (x[1] - x[0]), x[0] + (x[1] - x[0]) * 0.3, x[0] + (x[1] - x[0]) * 0.8};
      })
      .autocast(ew);
  row("addcmul", {{{33, 17}}, {{33, 17}}, {{33, 17}, Kind::nonzero}},
      [](const V& x) {
        return V{addcmul(x[0], x[1], x[2], 0.5), addcdiv(x[0], x[1], x[2], -2.0)};
      })
      .ref([](const V& x) {
        return V{x[0] + x[1] * x[2] * 0.5, x[0] - x[1] / x[2] * 2.0};
      })
      .covers({"addcmul", "addcdiv"})
      .autocast(ew);
  row("clamp_tensor", {{{33, 17}}, {{33, 17}}, {{17}}},
      [](const V& x) {
        const Tensor lo = x[1] - 1.0, hi = x[2] + 1.0;
        return V{clamp(x[0], lo, hi), clamp(x[0], lo, Tensor()), clamp(x[0], Tensor(), hi)};
      })
      .ref([](const V& x) {
        const Tensor lo = x[1] - 1.0, hi = (x[2] + 1.0).expand({33, 17});
        return V{map2(map2(x[0], lo, [](double a, double l) { return std::max(a, l); }), hi,
                      [](double a, double h) { return std::min(a, h); }),
                 map2(x[0], lo, [](double a, double l) { return std::max(a, l); }),
                 map2(x[0], hi, [](double a, double h) { return std::min(a, h); })};
      })
      .covers({"clamp"})
      .f32_only()  // 16-bit rounding moves x across a bound it nearly touches, and the gradient with it
      .autocast(ew);

  // ---- reductions ----
  row("sum", {{{6, 1000, 7}}}, [](const V& x) { return V{sum(x[0], {1}), sum(x[0], {0, 2}), sum(x[0])}; })
      .autocast(AutocastOp::reductions)
      .tol(5e-2);
  row("sum_large", {{{3, 20000}}},
      [](const V& x) {
        return V{sum(x[0], {1}), sum(x[0])};
      })
      .covers({"sum"})
      .tol(5e-2, 1e-4)
      .f32_only()
      .autocast(AutocastOp::reductions);
  // Every dim set, with and without keepdim, on contiguous and strided views.
  row("reduce_dims", {{{3, 4, 5}}},
      [](const V& x) {
        V out;
        const std::vector<std::vector<int64_t>> dim_sets = {{}, {0}, {1}, {-1}, {0, 2}, {1, 2}, {0, 1, 2}};
        for (const auto& d : dim_sets)
          for (bool keep : {false, true}) {
            out.push_back(sum(x[0], d, keep));
            out.push_back(mean(x[0], d, keep));
            out.push_back(var(x[0], d, 1, keep));
            out.push_back(var(x[0], d, 0, keep));
            out.push_back(amax(x[0], d, keep));
            out.push_back(amin(x[0], d, keep));
            out.push_back(sum(x[0].transpose(0, 2), d, keep));
            out.push_back(amax(x[0].slice(2, 0, 5, 2), d, keep));
          }
        return out;
      })
      .covers({"sum", "mean", "var", "amax", "amin"})
      .tol(5e-2)
      .autocast(AutocastOp::reductions);
  row("mean", {{{6, 100, 7}}}, [](const V& x) { return V{mean(x[0], {1}), mean(x[0], {2}, true)}; }).autocast(AutocastOp::reductions);
  row("var", {{{6, 100, 7}}},
      [](const V& x) {
        return V{var(x[0], {1}), var(x[0], {0, 2}, 0)};
      })
      .tol(5e-2)
      .autocast(AutocastOp::reductions);
  row("amax", {{{6, 100, 7}}}, [](const V& x) {
    return V{amax(x[0], {1}), amax(x[0], {2})};
  }).autocast(AutocastOp::reductions);
  row("amin", {{{6, 100, 7}}}, [](const V& x) {
    return V{amin(x[0], {1}), amin(x[0], {2})};
  }).autocast(AutocastOp::reductions);
  row("max_min_dim", {{{3, 4, 5}}},
      [](const V& x) {
        V out;
        for (int64_t d : {0, 1, 2, -1})
          for (bool keep : {false, true}) {
            const ValuesIndices a = max(x[0], d, keep), b = min(x[0], d, keep);
            out.insert(out.end(), {a.values, a.indices, b.values, b.indices, max(x[0].permute({1, 2, 0}), d, keep).values * 2.0});
          }
        return out;
      })
      .covers({"max", "min"})
      .f32_only()
      .autocast(AutocastOp::reductions);
  // Scans along the middle and the last dim; cumprod also over rows with zeros (masked in), whose
  // gradient is the exact product of the others.
  row("cumsum_cumprod", {{{4, 30, 5}}, {{3, 12, 4}, Kind::positive}, {{3, 12, 4}, Kind::mask, 0, false}},
      [](const V& x) {
        return V{cumsum(x[0], 1), cumsum(x[0], -1), cumprod(x[1], 1), cumprod(masked_fill(x[1], x[2], 0.0), 1),
                 cumprod(x[1], 2)};
      })
      .ref([](const V& x) {
        const auto run = [](bool prod) {
          return [prod](const std::vector<double>& v) {
            std::vector<double> o;
            double acc = prod ? 1 : 0;
            for (double e : v) o.push_back(acc = prod ? acc * e : acc + e);
            return std::vector<std::vector<double>>{o};
          };
        };
        return V{along(x[0], 1, run(false))[0], along(x[0], 2, run(false))[0], along(x[1], 1, run(true))[0],
                 along(masked_fill(x[1], x[2], 0.0), 1, run(true))[0], along(x[1], 2, run(true))[0]};
      })
      .covers({"cumsum", "cumprod"})
      .tol(5e-2)
      .autocast(AutocastOp::reductions);
  row("cummax_cummin", {{{4, 30, 5}}},
      [](const V& x) {
        const ValuesIndices a = cummax(x[0], 1), b = cummin(x[0], -1);
        return V{a.values, a.indices, b.values, b.indices};
      })
      .ref([](const V& x) {
        const auto run = [](bool mx) {
          return [mx](const std::vector<double>& v) {
            std::vector<double> val, at;
            for (size_t i = 0; i < v.size(); ++i) {
              if (i == 0 || (mx ? v[i] >= val.back() : v[i] <= val.back())) {
                val.push_back(v[i]), at.push_back(double(i));
              } else {
                val.push_back(val.back()), at.push_back(at.back());
              }
            }
            return std::vector<std::vector<double>>{val, at};
          };
        };
        const V a = along(x[0], 1, run(true), {false, true}), b = along(x[0], 2, run(false), {false, true});
        return V{a[0], a[1], b[0], b[1]};
      })
      .covers({"cummax", "cummin"})
      .autocast(AutocastOp::reductions);
  // Sorting over 300 (several merge passes in the CUDA kernel) and over a short middle dim.
  row("sort", {{{3, 300}}, {{4, 9, 5}}},
      [](const V& x) {
        const ValuesIndices a = sort(x[0]), b = sort(x[1], 1, true);
        const ValuesIndices t = topk(x[0], 7), u = topk(x[1], 3, 1, false);
        const ValuesIndices k = kthvalue(x[1], 4, 1), m = median(x[1], -1, true);
        // mode over values rounded to a few levels (floor(2x)), so that values repeat.
        const ValuesIndices mo = mode(floor(x[1] * 2.0), 1), mk = mode(floor(x[1] * 2.0), 2, true);
        return V{a.values,  a.indices,    b.values,  b.indices,  argsort(x[1], 2), t.values,
                 t.indices, u.values,     u.indices, k.values,   k.indices,        m.values,
                 m.indices, median(x[0]), mo.values, mo.indices, mk.values,        mk.indices};
      })
      .ref([](const V& x) {
        const auto sorter = [](bool desc, size_t take, size_t from = 0) {
          return [=](const std::vector<double>& v) {
            const std::vector<double> o = order_of(v, desc);
            const std::vector<double> at(o.begin() + long(from), o.begin() + long(from + take));
            return std::vector<std::vector<double>>{pick(v, at), at};
          };
        };
        const V a = along(x[0], 1, sorter(false, 300), {false, true}),
                b = along(x[1], 1, sorter(true, 9), {false, true});
        const V s = along(x[1], 2, sorter(false, 5), {false, true});
        const V t = along(x[0], 1, sorter(true, 7), {false, true}), u = along(x[1], 1, sorter(false, 3), {false, true});
        const V k = along(x[1], 1, sorter(false, 1, 3), {false, true}),
                m = along(x[1], 2, sorter(false, 1, 2), {false, true});
        const std::vector<double> all = x[0].to_vector();
        const double med = all[size_t(order_of(all, false)[449])];
        const auto moder = [](const std::vector<double>& v) {
          double best = 0, at = 0;
          int bestn = 0;
          for (size_t i = 0; i < v.size(); ++i) {
            int cnt = 0;
            size_t last = 0;
            for (size_t j = 0; j < v.size(); ++j)
              if (v[j] == v[i]) ++cnt, last = j;
            if (cnt > bestn || (cnt == bestn && v[i] < best)) best = v[i], bestn = cnt, at = double(last);
          }
          return std::vector<std::vector<double>>{{best}, {at}};
        };
        const Tensor fl = floor(x[1] * 2.0);
        const V mo = along(fl, 1, moder, {false, true}), mk = along(fl, 2, moder, {false, true});
        return V{a[0],
                 a[1],
                 b[0],
                 b[1],
                 s[1],
                 t[0],
                 t[1],
                 u[0],
                 u[1],
                 k[0].squeeze(1),
                 k[1].squeeze(1),
                 m[0],
                 m[1],
                 from_vector({med}, {}, DType::f64),
                 mo[0].squeeze(1),
                 mo[1].squeeze(1),
                 mk[0],
                 mk[1]};
      })
      .covers({"sort", "argsort", "topk", "kthvalue", "median", "mode"})
      .tol(1e-2, 1e-6)
      .autocast(AutocastOp::reductions);  // f32: a position off by one is an error of at least 1/300
  row("prod_stddev", {{{4, 6, 5}, Kind::positive}, {{4, 6, 5}}},
      [](const V& x) {
        // prod over an empty dim: ones, still in the graph (its gradient zeros), as PyTorch's
        return V{prod(x[0], {1}),           prod(x[0], {0, 2}, true), prod(x[0] * 0.9), stddev(x[1], {1}),
                 stddev(x[1], {}, 0),       prod(x[0].narrow(1, 0, 0), {1})};
      })
      .ref([](const V& x) {
        const auto p = [](const Tensor& t, const std::vector<int64_t>& d, bool keep) {
          return exp(sum(log(t), d, keep));
        };
        return V{p(x[0], {1}, false), p(x[0], {0, 2}, true), p(x[0] * 0.9, {}, false), sqrt(var(x[1], {1})),
                 sqrt(var(x[1], {}, 0)), ones({4, 5}, TensorOptions(x[0].dtype()))};
      })
      .covers({"prod", "stddev"})
      .tol(5e-2)
      .autocast(AutocastOp::reductions);
  row("argmax", {{{6, 100, 7}}}, [](const V& x) {
    return V{argmax(x[0], 1), argmax(x[0], 2), argmax(x[0]), argmax(x[0], 0, true)};
  }).no_grad();
  row("argmin", {{{6, 100, 7}}}, [](const V& x) { return V{argmin(x[0], 1), argmin(x[0], 2, true)}; }).no_grad();
  // logsumexp over each dim set; norms of every kind; any/all/count_nonzero.
  row("logsumexp", {{{6, 10, 7}}},
      [](const V& x) {
        return V{logsumexp(x[0], {1}), logsumexp(x[0] * 30.0, {0, 2}, true), logsumexp(x[0])};
      })
      .ref([](const V& x) {
        const auto lse = [](const Tensor& t, const std::vector<int64_t>& d, bool keep) {
          const Tensor m = amax(t, d, true);
          const Tensor out = log(sum(exp(t - m), d, true)) + m;
          return keep ? out : out.reshape(sum(t, d, false).shape());
        };
        return V{lse(x[0], {1}, false), lse(x[0] * 30.0, {0, 2}, true), lse(x[0], {}, false)};
      })
      .autocast(AutocastOp::reductions);
  row("norm", {{{6, 10, 7}, Kind::nonzero}},
      [](const V& x) {
        return V{norm(x[0]),
                 norm(x[0], 2, {1}),
                 norm(x[0], 1, {2}, true),
                 norm(x[0], INFINITY, {0}),
                 norm(x[0], -INFINITY, {1}),
                 norm(x[0], 3, {1}),
                 norm(x[0], 1.5, {0}),
                 norm(x[0], 0.5, {2}),
                 norm(x[0], 0, {2})};
      })
      .autocast(AutocastOp::reductions)
      .tol(5e-2);
  row("any_all", {{{6, 10, 7}, Kind::mask}, {{6, 10, 7}}},
      [](const V& x) {
        const Tensor m = x[0];
        const Tensor some = logical_and(m, gt(x[1], scalar_like(1.5, x[1])));  // rare: most rows have none
        return V{any(m, {1}),
                 all(m, {1}),
                 any(some, {2}),
                 all(logical_or(m, ge(x[1], scalar_like(-1, x[1]))), {1}),
                 count_nonzero(m, {0, 2}),
                 count_nonzero(x[1]),
                 any(x[1] * 0.0),
                 all(x[1])};
      })
      .covers({"any", "all", "count_nonzero"})
      .no_grad();
  row("sum_to", {{{2, 3, 4}}}, [](const V& x) {
    return V{sum_to(x[0], {3, 1}), sum_to(x[0] * x[0], {}), sum_to(x[0].transpose(0, 2), {2})};
  }).autocast(AutocastOp::reductions);

  // ---- linear algebra ----
  row("matmul", {{{70, 45}}, {{45, 33}}}, [](const V& x) { return one(matmul(x[0], x[1])); })
      .ref([](const V& x) { return one(matmul_ref(x[0], x[1])); })
      .autocast(AutocastOp::matmul);
  row("matmul_batched", {{{3, 4, 20, 16}}, {{4, 16, 24}}}, [](const V& x) { return one(matmul(x[0], x[1])); })
      .covers({"matmul"})
      .autocast(AutocastOp::matmul);
  // Vectors on either side, batch broadcasting, transposed and strided operands, one tensor twice.
  row("matmul_shapes",
      {{{5}},
       {{5}},
       {{4}},
       {{4, 3}},
       {{3, 4}},
       {{2, 3, 4}},
       {{2, 4, 5}},
       {{2, 1, 3, 4}},
       {{3, 4, 2}},
       {{3, 8}},
       {{4, 2}}},
      [](const V& x) {
        return V{matmul(x[0], x[1]),  matmul(x[2], x[3]),         matmul(x[4], x[2]),
                 matmul(x[5], x[6]),  matmul(x[5], x[6].select(0, 0)), matmul(x[4], x[6]),
                 matmul(x[7], x[8]),  matmul(x[2], x[6]),         matmul(x[5], x[2]),
                 matmul(x[4].t(), x[4]), matmul(x[4], x[4].t()),  matmul(x[9].slice(1, 0, 8, 2), x[10]),
                 matmul(x[4].unsqueeze(0).expand({2, 3, 4}), x[6])};
      })
      .covers({"matmul"})
      .f32_only()
      .autocast(AutocastOp::matmul);
  row("linear", {{{2, 9, 40}}, {{24, 40}}, {{24}}}, [](const V& x) { return V{linear(x[0], x[1], x[2]), linear(x[0], x[1])}; })
      .autocast(AutocastOp::linear)
      .tol(3e-2);

  // ---- spectral decompositions (engine/ops_spectral.cpp) ----
  // Eigenvectors and singular vectors are determined up to sign (Eigen's may differ from LAPACK's), so the
  // rows give gauge-invariant results: values, squared vectors (each column's sign drops out),
  // reconstructions. Random N(0, 1) matrices have distinct eigenvalues and singular values. f32 and f64:
  // 16-bit inputs are refused, as torch's.
  row("linalg_eigh", {{{2, 5, 5}}, {{4, 4}}},
      [](const V& x) {
        const Tensor a = x[0] + x[0].transpose(-1, -2), b = x[1] + x[1].transpose(-1, -2);
        const EighResult e = linalg_eigh(a), u = linalg_eigh(b, true);
        return V{e.eigenvalues, e.eigenvectors * e.eigenvectors,
                 matmul(u.eigenvectors * u.eigenvalues.unsqueeze(-2), u.eigenvectors.transpose(-1, -2)),
                 linalg_eigvalsh(b, true)};
      })
      .covers({"linalg_eigh", "linalg_eigvalsh"})
      .f32_only()
      .tol(2e-2, 1e-3);
  row("linalg_svd", {{{2, 6, 4}}, {{3, 5}}},
      [](const V& x) {
        const SvdResult tall = linalg_svd(x[0], false), wide = linalg_svd(x[1], true);
        const Tensor wu = wide.U, wv = wide.Vh.narrow(-2, 0, 3);
        return V{tall.S,
                 tall.U * tall.U,
                 tall.Vh * tall.Vh,
                 wide.S,
                 wu * wu,
                 wv * wv,
                 matmul(wide.U * wide.S.unsqueeze(-2), wv),
                 linalg_svdvals(x[0])};
      })
      .covers({"linalg_svd", "linalg_svdvals"})
      .f32_only()
      .tol(2e-2, 1e-3);
  row("linalg_qr", {{{2, 6, 4}}, {{4, 4}}},
      [](const V& x) {
        const QrResult r = linalg_qr(x[0]), c = linalg_qr(x[1], QrMode::complete);
        return V{r.Q, r.R, c.Q, c.R, linalg_qr(x[0], QrMode::r).R.detach()};
      })
      .f32_only()
      .tol(2e-2, 1e-3);

  // ---- neural-network ops ----
  row("conv2d", {{{2, 3, 11, 10}}, {{5, 3, 3, 3}}, {{5}}},
      [](const V& x) { return one(conv2d(x[0], x[1], x[2], {1, 1}, {1, 1})); })
      .autocast(AutocastOp::conv2d)
      .tol(3e-2);
  row("conv2d_strided_grouped", {{{2, 4, 12, 9}}, {{6, 2, 3, 2}}},
      [](const V& x) {
        return V{conv2d(x[0], x[1], {}, {2, 1}, {1, 0}, {1, 2}, 2), conv2d(x[0], x[1], {}, {1, 2}, {2, 1}, {2, 1}, 2)};
      })
      .covers({"conv2d"})
      .tol(3e-2)
      .autocast(AutocastOp::conv2d);
  // channels_last: on CUDA, cuDNN on NHWC buffers (filters copied to KRSC) against the CPU's NCHW
  // kernels; training batch norm through cuDNN, then eval (the apply kernel's NHWC indexing), then
  // the deterministic handwritten kernels on NCHW copies, and pooling, which keeps the layout. The
  // max pool reads the input itself, not a computed activation: in 16-bit, two summation orders
  // (cuDNN's and the CPU's) put a convolution output an ulp apart, which can flip a window's argmax
  // and move a whole gradient entry (7e-2 on an H200, 2026-12-04), a tie and not a kernel error.
  row("channels_last", {{{2, 8, 9, 7}}, {{6, 8, 3, 3}}, {{6}}, {{6}}, {{6}}},
      [](const V& x) {
        const Tensor xl = x[0].contiguous(MemoryFormat::channels_last);
        const Tensor y = conv2d(xl, x[1], x[4], {1, 1}, {1, 1});
        const Tensor y2 = conv2d(xl, x[1], {}, {2, 2}, {0, 0});
        Tensor y3;  // deterministic algorithms only (or NCHW copies where cuDNN has no NHWC one)
        {
          const DeterministicOnCuda on(x[0]);
          y3 = conv2d(xl, x[1], x[4], {1, 1}, {2, 2}, {2, 2});
        }
        const TensorOptions o(DType::f32, x[0].device());
        Tensor rm = zeros({6}, o), rv = ones({6}, o);
        const Tensor b = batch_norm(y, rm, rv, x[2], x[3], true, 0.1, 1e-5);
        const Tensor be = batch_norm(y2, zeros({6}, o) + 0.1, ones({6}, o) * 1.5, x[2], x[3], false, 0.1, 1e-5);
        Tensor bd;
        {
          const DeterministicOnCuda on(x[0]);
          bd = batch_norm(y, Tensor(), Tensor(), x[2], x[3], true, 0.1, 1e-5);
        }
        return V{y, y2, y3, b, be, bd, rm, rv, max_pool2d(relu(xl), {2, 2}), avg_pool2d(bd, {3, 3}, {1, 1}, {1, 1})};
      })
      .covers({"conv2d", "batch_norm", "max_pool2d", "avg_pool2d"})
      .tol(3e-2)
      .autocast(AutocastOp::conv2d);
  row("conv_transpose2d", {{{2, 4, 5, 6}}, {{4, 3, 3, 2}}, {{6}}},
      [](const V& x) {
        return V{conv_transpose2d(x[0], x[1], x[2].narrow(0, 0, 3)),
                 conv_transpose2d(x[0], x[1], x[2], {2, 3}, {1, 0}, {1, 2}, 2, {1, 2})};
      })
      .ref([](const V& x) {
        return V{conv_ref(x[0], x[1], x[2].narrow(0, 0, 3), {1, 1}, {0, 0}, {1, 1}, 1, true),
                 conv_ref(x[0], x[1], x[2], {2, 3}, {1, 0}, {1, 2}, 2, true, {1, 2})};
      })
      .autocast(AutocastOp::conv2d)
      .tol(3e-2);
  row("conv1d", {{{2, 4, 13}}, {{6, 2, 3}}, {{6}}, {{4, 3, 4}}},
      [](const V& x) {
        return V{conv1d(x[0], x[1], x[2], 2, 1, 2, 2),
                 conv1d(x[0], x[1], {}, kSame, 1, 2),
                 conv1d(x[0], x[1].narrow(2, 0, 2), x[2], kSame, 3, 2),
                 conv_transpose1d(x[0], x[3], x[2].narrow(0, 0, 3), 2, 1, 1),
                 conv_transpose1d(x[0], x[3], x[2], 2, 1, 1, 2, 2),
                 conv1d(x[0], x[1], x[2], 1, 2, 1, 2)};
      })
      .ref([](const V& x) {
        const Tensor w2 = x[1].narrow(2, 0, 2);
        return V{conv_ref(x[0], x[1], x[2], {2}, {1}, {2}, 2),
                 conv_ref(x[0], x[1], {}, {1}, {1}, {1}, 2),
                 conv_ref(pad(x[0], {1, 2}), w2, x[2], {1}, {0}, {3}, 2),
                 conv_ref(x[0], x[3], x[2].narrow(0, 0, 3), {2}, {1}, {1}, 1, true, {1}),
                 conv_ref(x[0], x[3], x[2], {2}, {1}, {2}, 2, true, {1}),
                 conv_ref(x[0], x[1], x[2], {1}, {2}, {1}, 2)};
      })
      .covers({"conv1d", "conv_transpose1d"})
      .autocast(AutocastOp::conv2d)
      .tol(3e-2);
  row("conv3d", {{{2, 4, 5, 6, 4}}, {{6, 2, 3, 2, 3}}, {{6}}},
      [](const V& x) {
        return V{conv3d(x[0], x[1], x[2], {2, 1, 1}, {1, 0, 1}, {1, 2, 1}, 2),
                 conv3d(x[0], x[1], {}, kSame, {1, 1, 1}, 2),
                 conv3d(x[0], x[1], {}, {1, 1, 1}, {2, 1, 2}, {1, 1, 1}, 2)};
      })
      .ref([](const V& x) {
        return V{conv_ref(x[0], x[1], x[2], {2, 1, 1}, {1, 0, 1}, {1, 2, 1}, 2),
                 conv_ref(pad(x[0], {1, 1, 0, 1, 1, 1}), x[1], {}, {1, 1, 1}, {0, 0, 0}, {1, 1, 1}, 2),
                 conv_ref(x[0], x[1], {}, {1, 1, 1}, {2, 1, 2}, {1, 1, 1}, 2)};
      })
      .autocast(AutocastOp::conv2d)
      .tol(3e-2);
  row("conv2d_same", {{{2, 3, 7, 6}}, {{4, 3, 2, 3}}},
      [](const V& x) {
        return V{conv2d(x[0], x[1], {}, kSame), conv2d(x[0], x[1], {}, kSame, {2, 2})};
      })
      .ref([](const V& x) {
        return V{conv_ref(pad(x[0], {1, 1, 0, 1}), x[1], {}, {1, 1}, {0, 0}, {1, 1}, 1),
                 conv_ref(x[0], x[1], {}, {1, 1}, {1, 2}, {2, 2}, 1)};
      })
      .covers({"conv2d"})
      .autocast(AutocastOp::conv2d)
      .tol(3e-2);
  row("max_pool2d", {{{2, 3, 11, 10}}},
      [](const V& x) { return V{max_pool2d(x[0], {3, 3}, {2, 2}, {1, 1}), max_pool2d(x[0], {2, 3}, {1, 2}, {0, 1}, {2, 1})}; })
      .autocast(AutocastOp::pooling);
  row("avg_pool2d", {{{2, 3, 11, 10}}},
      [](const V& x) { return V{avg_pool2d(x[0], {3, 3}, {2, 2}, {1, 1}), avg_pool2d(x[0], {2, 2}, {2, 2}, {1, 1}, false)}; })
      .autocast(AutocastOp::pooling);
  // ceil_mode (a window hanging over the end, one dropped by the padding rule), indices,
  // divisor_override, 1-D and 3-D (separable), and unpooling of overlapping windows' picks.
  row("pooling_more", {{{2, 3, 10, 9}}, {{2, 3, 11}}, {{2, 2, 5, 6, 7}}},
      [](const V& x) {
        const ValuesIndices m = max_pool2d_with_indices(x[0], {3, 3}, {2, 2}, {1, 1}, {1, 1}, true);
        const ValuesIndices m1 = max_pool1d_with_indices(x[1], 3, 2, 1, 1, true);
        const ValuesIndices mo = max_pool2d_with_indices(x[0], {3, 3}, {1, 1});
        const ValuesIndices m3 = max_pool3d_with_indices(x[2], {2, 3, 2}, {2, 2, 2}, {1, 1, 0}, {1, 1, 2}, true);
        const ValuesIndices mo3 = max_pool3d_with_indices(x[2].select(0, 1), {2, 2, 3}, {1, 1, 1});
        return V{m.values,
                 m.indices,
                 avg_pool2d(x[0], {3, 2}, {2, 2}, {1, 0}, false, true),
                 avg_pool2d(x[0], {3, 3}, {2, 3}, {1, 1}, true, true),
                 avg_pool2d(x[0], {2, 2}, {2, 2}, {1, 1}, true, false, 3),
                 m1.values,
                 m1.indices,
                 avg_pool1d(x[1], 4, 3, 2, false, true),
                 max_pool3d(x[2], {2, 3, 2}, {2, 2, 2}, {1, 1, 0}, {1, 1, 2}, true),
                 avg_pool3d(x[2], {3, 2, 3}, {2, 2, 2}, {1, 1, 1}, false, true),
                 avg_pool3d(x[2], {2, 2, 2}, {}, {}, true, false, 5),
                 max_unpool2d(mo.values, mo.indices, {3, 3}, {1, 1}),
                 max_unpool1d(m1.values, m1.indices, 3, 2, 1, 11),
                 m3.values,
                 m3.indices,
                 max_unpool3d(mo3.values, mo3.indices, {2, 2, 3}, {1, 1, 1}),
                 max_unpool3d(m3.values, m3.indices, {2, 3, 2}, {2, 2, 2}, {1, 1, 0}, Triple{5, 6, 7})};
      })
      .ref([](const V& x) {
        const V m = pool_ref(x[0], {{3, 3}, {2, 2}, {1, 1}, {1, 1}, true});
        const V m1 = pool_ref(x[1], {{3}, {2}, {1}, {1}, true});
        const V mo = pool_ref(x[0], {{3, 3}, {1, 1}, {0, 0}, {1, 1}});
        const V m3 = pool_ref(x[2], {{2, 3, 2}, {2, 2, 2}, {1, 1, 0}, {1, 1, 2}, true});
        const V mo3 = pool_ref(x[2].select(0, 1), {{2, 2, 3}, {1, 1, 1}, {0, 0, 0}, {1, 1, 1}});
        // Each value at its index of a zero plane (the last `dims` dims of shape); distinct indices only.
        const auto unpool = [](const Tensor& v, const Tensor& at, const Shape& shape, size_t dims) {
          int64_t plane = 1;
          for (size_t i = shape.size() - dims; i < shape.size(); ++i) plane *= shape[i];
          const std::vector<double> vv = v.to_vector(), aa = at.to_vector();
          std::vector<double> y(size_t(Tensor(zeros(shape)).numel()), 0.0);
          const int64_t per = v.numel() / (Tensor(zeros(shape)).numel() / plane);
          for (size_t i = 0; i < vv.size(); ++i) y[size_t(int64_t(i) / per * plane + int64_t(aa[i]))] = vv[i];
          return from_vector(y, shape, DType::f64);
        };
        return V{m[0],
                 m[1],
                 pool_ref(x[0], {{3, 2}, {2, 2}, {1, 0}, {1, 1}, true, false, false})[0],
                 pool_ref(x[0], {{3, 3}, {2, 3}, {1, 1}, {1, 1}, true, false, true})[0],
                 pool_ref(x[0], {{2, 2}, {2, 2}, {1, 1}, {1, 1}, false, false, true, 3})[0],
                 m1[0],
                 m1[1],
                 pool_ref(x[1], {{4}, {3}, {2}, {1}, true, false, false})[0],
                 pool_ref(x[2], {{2, 3, 2}, {2, 2, 2}, {1, 1, 0}, {1, 1, 2}, true})[0],
                 pool_ref(x[2], {{3, 2, 3}, {2, 2, 2}, {1, 1, 1}, {1, 1, 1}, true, false, false})[0],
                 pool_ref(x[2], {{2, 2, 2}, {2, 2, 2}, {0, 0, 0}, {1, 1, 1}, false, false, true, 5})[0],
                 unpool(mo[0], mo[1], {2, 3, 10, 9}, 2),
                 unpool(m1[0], m1[1], {2, 3, 11}, 1),
                 m3[0],
                 m3[1],
                 unpool(mo3[0], mo3[1], {2, 5, 6, 7}, 3),
                 unpool(m3[0], m3[1], {2, 2, 5, 6, 7}, 3)};
      })
      .covers({"max_pool2d_with_indices", "avg_pool2d", "max_pool1d_with_indices", "avg_pool1d", "max_pool3d",
               "avg_pool3d", "max_unpool2d", "max_unpool1d", "max_pool3d_with_indices", "max_unpool3d"})
      .autocast(AutocastOp::pooling);
  row("max_pool1d", {{{2, 3, 12}}},
      [](const V& x) {
        return V{max_pool1d(x[0], 3), max_pool1d(x[0], 2, 3, 1, 2, true)};
      })
      .ref([](const V& x) {
        return V{pool_ref(x[0], {{3}, {3}, {0}, {1}})[0], pool_ref(x[0], {{2}, {3}, {1}, {2}, true})[0]};
      })
      .autocast(AutocastOp::pooling);
  row("adaptive_avg_pool2d", {{{2, 3, 11, 10}}},
      [](const V& x) { return V{adaptive_avg_pool2d(x[0], {1, 1}), adaptive_avg_pool2d(x[0], {4, 3})}; })
      .autocast(AutocastOp::pooling);
  row("batch_norm", {{{4, 5, 6, 7}}, {{5}}, {{5}}},
      [](const V& x) {
        const TensorOptions o(DType::f32, x[0].device());
        Tensor rm = zeros({5}, o), rv = ones({5}, o);
        const Tensor y = batch_norm(x[0], rm, rv, x[1], x[2], true, 0.1, 1e-5);
        return V{y, rm, rv};
      })
      .autocast(AutocastOp::batch_norm)
      .tol(3e-2);
  // instance_norm with running statistics: batch norm over [1, N*C, ...] (Python's F.instance_norm),
  // eps=0 taken as torch takes it; the second call normalises with the running statistics.
  row("instance_norm_running", {{{1, 6, 4, 5}}, {{6}}, {{6}}},
      [](const V& x) {
        const TensorOptions o(DType::f32, x[0].device());
        Tensor rm = zeros({6}, o), rv = ones({6}, o);
        const Tensor y = instance_norm_running(x[0], rm, rv, x[1], x[2], true, 0.1, 0.0);
        const Tensor y2 =
            instance_norm_running(x[0], zeros({6}, o) + 0.1, ones({6}, o) * 1.5, x[1], x[2], false, 0.1, 0.0);
        return V{y, y2, rm, rv};
      })
      .autocast(AutocastOp::batch_norm)
      .tol(3e-2);
  // The fused "BN, ReLU" and "BN, add the shortcut, ReLU" against the ops in a row: training with a
  // residual, eval (fixed running statistics) without, and training without gamma or running buffers.
  row("batch_norm_relu", {{{4, 5, 6, 7}}, {{5}}, {{5}}, {{4, 5, 6, 7}}},
      [](const V& x) {
        const TensorOptions o(DType::f32, x[0].device());
        Tensor rm = zeros({5}, o), rv = ones({5}, o);
        const Tensor y = batch_norm_relu(x[0], rm, rv, x[1], x[2], true, 0.1, 1e-5, x[3]);
        const Tensor y2 = batch_norm_relu(x[0], zeros({5}, o) + 0.1, ones({5}, o) * 1.5, x[1], x[2], false, 0.1, 1e-5);
        const Tensor y3 = batch_norm_relu(x[0], Tensor(), Tensor(), Tensor(), x[2], true, 0.1, 1e-5);
        return V{y, y2, y3, rm, rv};
      })
      .ref([](const V& x) {
        const TensorOptions o(DType::f32, x[0].device());
        Tensor rm = zeros({5}, o), rv = ones({5}, o);
        const Tensor y = relu(batch_norm(x[0], rm, rv, x[1], x[2], true, 0.1, 1e-5) + x[3]);
        const Tensor y2 = relu(batch_norm(x[0], zeros({5}, o) + 0.1, ones({5}, o) * 1.5, x[1], x[2], false, 0.1, 1e-5));
        const Tensor y3 = relu(batch_norm(x[0], Tensor(), Tensor(), Tensor(), x[2], true, 0.1, 1e-5));
        return V{y, y2, y3, rm, rv};
      })
      .autocast(AutocastOp::batch_norm)
      .tol(3e-2);
  // eps well above cuDNN's default, which the backward must take from the forward; the second call
  // has running_var only (cuDNN gets a zeroed stand-in for running_mean) and no gamma.
  row("batch_norm_eps", {{{4, 5, 6, 7}}, {{5}}, {{5}}},
      [](const V& x) {
        const TensorOptions o(DType::f32, x[0].device());
        Tensor rm = zeros({5}, o), rv = ones({5}, o), rv2 = ones({5}, o);
        const Tensor y = batch_norm(x[0], rm, rv, x[1], x[2], true, 0.1, 0.1);
        const Tensor y2 = batch_norm(x[0], Tensor(), rv2, Tensor(), x[2], true, 0.3, 0.1);
        return V{y, rm, rv, y2, rv2};
      })
      .covers({"batch_norm"})
      .tol(3e-2)
      .autocast(AutocastOp::batch_norm);
  // The handwritten deterministic kernels (CUDA run): 40*60*4 = 9600 values per channel is two
  // chunks of the split reduction, the first ending inside an image. The backward runs inside the
  // row, while the mode is on; its gradients reach the leaves as in every other row.
  row("batch_norm_deterministic", {{{4, 3, 40, 60}}, {{3}}, {{3}}},
      [](const V& x) {
        const DeterministicOnCuda on(x[0]);
        const TensorOptions o(DType::f32, x[0].device());
        Tensor rm = zeros({3}, o), rv = ones({3}, o), rv2 = ones({3}, o);
        const Tensor y = batch_norm(x[0], rm, rv, x[1], x[2], true, 0.1, 1e-5);
        const Tensor y2 = batch_norm(x[0], Tensor(), rv2, Tensor(), Tensor(), true, 0.2, 1e-3);
        if (GradMode::enabled()) {
          Generator g(31);
          Tensor loss;
          for (const Tensor& out : {y, y2}) {
            const Tensor w = randn(out.shape(), DType::f64, &g).to(out.dtype()).to(out.device());
            const Tensor term = sum(cast(out * w, DType::f32));
            loss = loss.defined() ? loss + term : term;
          }
          loss.backward();
        }
        return V{y.detach(), rm, rv, y2.detach(), rv2};
      })
      .covers({"batch_norm"})
      .no_grad()
      .tol(3e-2);
  row("batch_norm_eval", {{{4, 5, 6, 7}}, {{5}}, {{5}}, {{5}, Kind::normal, 0, false}, {{5}, Kind::positive, 0, false}},
      [](const V& x) { return one(batch_norm(x[0], x[3].detach(), x[4].detach(), x[1], x[2], false, 0.1, 1e-5)); })
      .covers({"batch_norm"})
      .autocast(AutocastOp::batch_norm);
  // [N, C, L] inputs: training statistics without running buffers, and eval with given ones.
  row("batch_norm_1d", {{{3, 2, 4}}, {{2}}, {{2}}, {{2}, Kind::normal, 0, false}, {{2}, Kind::positive, 0, false}},
      [](const V& x) {
        return V{batch_norm(x[0], {}, {}, x[1], x[2], true), batch_norm(x[0], x[3].detach(), x[4].detach(), x[1], x[2], false)};
      })
      .covers({"batch_norm"})
      .tol(3e-2)
      .autocast(AutocastOp::batch_norm);
  // Batch norm over [N, C] and [N, C, D, H, W] (BatchNorm1d on features, BatchNorm3d), train and
  // eval, against per-channel statistics by hand (biased variance in the normalisation).
  row("batch_norm_nd",
      {{{6, 3}}, {{2, 3, 3, 4, 2}}, {{3}}, {{3}}, {{3}, Kind::normal, 0, false}, {{3}, Kind::positive, 0, false}},
      [](const V& x) {
        return V{batch_norm(x[0], {}, {}, x[2], x[3], true), batch_norm(x[1], {}, {}, x[2], x[3], true),
                 batch_norm(x[1], x[4].detach(), x[5].detach(), x[2], x[3], false)};
      })
      .ref([](const V& x) {
        const auto bn = [](const Tensor& t, const Tensor& g, const Tensor& b, const Tensor& rm, const Tensor& rv) {
          const std::vector<double> v = t.contiguous().to_vector(), gv = g.to_vector(), bv = b.to_vector();
          const int64_t n = t.size(0), c = t.size(1), r = t.numel() / (n * c);
          std::vector<double> y(v.size());
          for (int64_t ch = 0; ch < c; ++ch) {
            double m = 0, q = 0;
            const auto at = [&](int64_t s, int64_t i) { return size_t((s * c + ch) * r + i); };
            if (rm.defined()) {
              m = rm.to_vector()[size_t(ch)], q = rv.to_vector()[size_t(ch)];
            } else {
              for (int64_t s = 0; s < n; ++s)
                for (int64_t i = 0; i < r; ++i) m += v[at(s, i)];
              m /= double(n * r);
              for (int64_t s = 0; s < n; ++s)
                for (int64_t i = 0; i < r; ++i) q += (v[at(s, i)] - m) * (v[at(s, i)] - m);
              q /= double(n * r);
            }
            for (int64_t s = 0; s < n; ++s)
              for (int64_t i = 0; i < r; ++i)
                y[at(s, i)] = (v[at(s, i)] - m) / std::sqrt(q + 1e-5) * gv[size_t(ch)] + bv[size_t(ch)];
          }
          return from_vector(y, t.shape(), DType::f64);
        };
        return V{bn(x[0], x[2], x[3], {}, {}), bn(x[1], x[2], x[3], {}, {}), bn(x[1], x[2], x[3], x[4], x[5])};
      })
      .covers({"batch_norm"})
      .tol(3e-2)
      .autocast(AutocastOp::batch_norm);
  row("layer_norm", {{{3, 7, 96}}, {{96}}, {{96}}, {{4, 6, 5}}},
      [](const V& x) { return V{layer_norm(x[0], {96}, x[1], x[2]), layer_norm(x[3], {6, 5})}; })
      .autocast(AutocastOp::layer_norm)
      .tol(3e-2);
  row("group_norm", {{{3, 6, 5, 4}}, {{6}}, {{6}}, {{2, 4, 7}}},
      [](const V& x) {
        return V{group_norm(x[0], 3, x[1], x[2]), group_norm(x[3], 2, {}, {}, 1e-3), instance_norm(x[0], x[1], x[2]),
                 instance_norm(x[3])};
      })
      .ref([](const V& x) {
        // Statistics over each (sample, group) slice by hand, biased variance.
        const auto gn = [](const Tensor& t, int64_t groups, const Tensor& g, const Tensor& b, double eps) {
          std::vector<double> v = t.contiguous().to_vector();
          const int64_t n = t.size(0), c = t.size(1), per = t.numel() / (n * c) * (c / groups);
          for (int64_t s0 = 0; s0 < n * groups; ++s0) {
            double* p0 = v.data() + s0 * per;
            double m = 0, q = 0;
            for (int64_t i = 0; i < per; ++i) m += p0[i];
            m /= double(per);
            for (int64_t i = 0; i < per; ++i) q += (p0[i] - m) * (p0[i] - m);
            for (int64_t i = 0; i < per; ++i) p0[i] = (p0[i] - m) / std::sqrt(q / double(per) + eps);
          }
          Tensor y = from_vector(v, t.shape(), DType::f64);
          Shape cs(size_t(t.dim()), 1);
          cs[1] = c;
          if (g.defined()) y = y * g.reshape(cs) + b.reshape(cs);
          return y;
        };
        return V{gn(x[0], 3, x[1], x[2], 1e-5), gn(x[3], 2, {}, {}, 1e-3), gn(x[0], 6, x[1], x[2], 1e-5),
                 gn(x[3], 4, {}, {}, 1e-5)};
      })
      .covers({"group_norm", "instance_norm"})
      .tol(3e-2)
      .autocast(AutocastOp::layer_norm);
  row("rms_norm", {{{3, 5, 8}}, {{5, 8}}, {{8}}},
      [](const V& x) {
        return V{rms_norm(x[0], {5, 8}, x[1]), rms_norm(x[0], {8}, x[2], 1e-2), rms_norm(x[0], {8})};
      })
      .ref([](const V& x) {
        const auto rms = [](const Tensor& t, int64_t d, double eps) {
          std::vector<double> v = t.to_vector();
          for (size_t r = 0; r < v.size(); r += size_t(d)) {
            double q = 0;
            for (int64_t i = 0; i < d; ++i) q += v[r + size_t(i)] * v[r + size_t(i)];
            for (int64_t i = 0; i < d; ++i) v[r + size_t(i)] /= std::sqrt(q / double(d) + eps);
          }
          return from_vector(v, t.shape(), DType::f64);
        };
        return V{rms(x[0], 40, 2.220446049250313e-16) * x[1], rms(x[0], 8, 1e-2) * x[2],
                 rms(x[0], 8, 2.220446049250313e-16)};
      })
      .tol(3e-2)
      .autocast(AutocastOp::layer_norm);
  row("local_response_norm", {{{2, 7, 3, 4}}, {{3, 5}}},
      [](const V& x) {
        return V{local_response_norm(x[0], 3, 0.5, 0.75, 2.0), local_response_norm(x[1], 4, 1e-1)};
      })
      .ref([](const V& x) {
        const auto lrn = [](const Tensor& t, int64_t size, double alpha, double beta, double k) {
          const std::vector<double> v = t.contiguous().to_vector();
          std::vector<double> y(v.size());
          const int64_t n = t.size(0), c = t.size(1), r = t.numel() / (n * c);
          for (int64_t b = 0; b < n; ++b)
            for (int64_t ch = 0; ch < c; ++ch)
              for (int64_t i = 0; i < r; ++i) {
                double sq = 0;
                for (int64_t j = ch - size / 2; j <= ch + (size - 1) / 2; ++j)
                  if (j >= 0 && j < c) sq += v[size_t((b * c + j) * r + i)] * v[size_t((b * c + j) * r + i)];
                const size_t at = size_t((b * c + ch) * r + i);
                y[at] = v[at] / std::pow(k + alpha / double(size) * sq, beta);
              }
          return from_vector(y, t.shape(), DType::f64);
        };
        return V{lrn(x[0], 3, 0.5, 0.75, 2.0), lrn(x[1], 4, 1e-1, 0.75, 1.0)};
      })
      .tol(3e-2)
      .autocast(AutocastOp::layer_norm);
  // Over rows, and over the middle dim with 300, 5 and 2 columns (a block of the column kernel
  // covers 32 columns, or several rows of fewer).
  row("softmax", {{{5, 300}}, {{3, 70, 5}}, {{2, 40, 2}}},
      [](const V& x) { return V{softmax(x[0], 1), softmax(x[0], 0), softmax(x[1], 1), softmax(x[2], 1)}; })
      .ref([](const V& x) {
        return V{softmax_ref(x[0], 1, false), softmax_ref(x[0], 0, false), softmax_ref(x[1], 1, false),
                 softmax_ref(x[2], 1, false)};
      })
      .autocast(AutocastOp::softmax);
  row("log_softmax", {{{5, 300}}, {{3, 70, 5}}, {{2, 40, 2}}},
      [](const V& x) { return V{log_softmax(x[0], 1), log_softmax(x[0], 0), log_softmax(x[1], 1), log_softmax(x[2], 1)}; })
      .ref([](const V& x) {
        return V{softmax_ref(x[0], 1, true), softmax_ref(x[0], 0, true), softmax_ref(x[1], 1, true),
                 softmax_ref(x[2], 1, true)};
      })
      .autocast(AutocastOp::log_softmax);
  // Rows of 40 (a warp per row) and of 1100 (a block per row); masks get gradients too.
  row("masked_softmax", {{{2, 3, 10, 40}}, {{2, 1, 1, 40}}, {{10, 1}}, {{3, 1100}}, {{1100}}},
      [](const V& x) {
        return V{masked_softmax(x[0], x[1], 0.3), masked_softmax(x[0], x[2], 1.5),
                 masked_softmax(x[0].narrow(3, 0, 7), Tensor(), 0.9), masked_softmax(x[3], x[4], 0.7)};
      })
      .autocast(AutocastOp::softmax);
  row("cross_entropy", {{{40, 13}}, {{40}, Kind::index, 13}},
      [](const V& x) { return V{cross_entropy(x[0], x[1]), cross_entropy(x[0], x[1], 3, 0.1, Reduction::none)}; })
      .autocast(AutocastOp::cross_entropy);
  // [N, C, L] logits with [N, L] targets: the class dim is dim 1.
  row("cross_entropy_kdim", {{{2, 5, 3}}, {{2, 3}, Kind::index, 5}},
      [](const V& x) {
        return V{cross_entropy(x[0], x[1]), cross_entropy(x[0], x[1], -100, 0.2, Reduction::none)};
      })
      .covers({"cross_entropy"})
      .autocast(AutocastOp::cross_entropy);
  row("nll_loss", {{{40, 13}}, {{40}, Kind::index, 13}},
      [](const V& x) { return V{nll_loss(log_softmax(x[0], 1), x[1], 5), nll_loss(x[0], x[1], -100, Reduction::sum)}; })
      .autocast(AutocastOp::nll_loss);
  row("mse_loss", {{{40, 13}}, {{40, 13}}},
      [](const V& x) { return V{mse_loss(x[0], x[1]), mse_loss(x[0], x[1], Reduction::none)}; })
      .autocast(AutocastOp::mse_loss);
  row("bce_with_logits", {{{40, 13}}, {{40, 13}, Kind::unit}},
      [](const V& x) { return one(binary_cross_entropy_with_logits(x[0], x[1])); })
      .covers({"binary_cross_entropy_with_logits"})
      .autocast(AutocastOp::binary_cross_entropy_with_logits);
  // Class weights: plain references from log-softmax, PyTorch's formulas (weighted mean; smoothing weighs
  // every class).
  row("cross_entropy_weight", {{{40, 13}}, {{40}, Kind::index, 13}, {{13}, Kind::positive}},
      [](const V& x) {
        return V{cross_entropy(x[0], x[1], -100, 0.0, Reduction::mean, x[2]),
                 cross_entropy(x[0], x[1], 3, 0.1, Reduction::mean, x[2]),
                 cross_entropy(x[0], x[1], 3, 0.1, Reduction::none, x[2]),
                 nll_loss(x[0], x[1], 5, Reduction::mean, x[2]), nll_loss(x[0], x[1], -100, Reduction::sum, x[2])};
      })
      .ref([](const V& x) {
        const std::vector<double> lg = x[0].to_vector(), w = x[2].to_vector();
        const std::vector<double> t = x[1].to_vector();
        const int64_t n = 40, c = 13;
        // ce(ignore, eps) per row and the sum of target weights.
        auto ce = [&](int64_t ignore, double eps, std::vector<double>& per, double& wsum) {
          per.assign(size_t(n), 0.0);
          wsum = 0;
          for (int64_t i = 0; i < n; ++i) {
            const int64_t ti = int64_t(t[size_t(i)]);
            if (ti == ignore) continue;
            const double* r = lg.data() + i * c;
            const double mx = *std::max_element(r, r + c);
            double se = 0;
            for (int64_t k = 0; k < c; ++k) se += std::exp(r[k] - mx);
            const auto lp = [&](int64_t k) { return (r[k] - mx) - std::log(se); };
            double smooth = 0;
            for (int64_t k = 0; k < c; ++k) smooth -= w[size_t(k)] * lp(k);
            per[size_t(i)] = (1 - eps) * -w[size_t(ti)] * lp(ti) + eps * smooth / double(c);
            wsum += w[size_t(ti)];
          }
        };
        auto nll = [&](int64_t ignore, double& wsum) {
          double s = 0;
          wsum = 0;
          for (int64_t i = 0; i < n; ++i) {
            const int64_t ti = int64_t(t[size_t(i)]);
            if (ti == ignore) continue;
            s -= w[size_t(ti)] * lg[size_t(i * c + ti)];
            wsum += w[size_t(ti)];
          }
          return s;
        };
        std::vector<double> p0, p1;
        double w0, w1, w2, w3;
        ce(-100, 0.0, p0, w0);
        ce(3, 0.1, p1, w1);
        const double sum0 = std::accumulate(p0.begin(), p0.end(), 0.0),
                     sum1 = std::accumulate(p1.begin(), p1.end(), 0.0);
        const double n2 = nll(5, w2), n3 = nll(-100, w3);
        return V{scalar_tensor(sum0 / w0, DType::f64), scalar_tensor(sum1 / w1, DType::f64),
                 from_vector(p1, {40}, DType::f64), scalar_tensor(n2 / w2, DType::f64), scalar_tensor(n3, DType::f64)};
      })
      .covers({"cross_entropy", "nll_loss"})
      .autocast(AutocastOp::cross_entropy);
  row("regression_losses", {{{40, 13}}, {{40, 13}}},
      [](const V& x) {
        return V{l1_loss(x[0], x[1]),
                 l1_loss(x[0], x[1], Reduction::none),
                 smooth_l1_loss(x[0], x[1]),
                 smooth_l1_loss(x[0], x[1], Reduction::sum, 0.5),
                 smooth_l1_loss(x[0], x[1], Reduction::mean, 0.0),
                 huber_loss(x[0], x[1]),
                 huber_loss(x[0], x[1], Reduction::batchmean, 0.3)};
      })
      .ref([](const V& x) {
        const auto per = [&](const std::function<double(double)>& f) {
          return map2(x[0], x[1], [f](double a, double b) { return f(std::abs(a - b)); });
        };
        const Tensor l1 = per([](double d) { return d; });
        const Tensor s1 = per([](double d) { return d < 1 ? 0.5 * d * d : d - 0.5; });
        const Tensor s5 = per([](double d) { return d < 0.5 ? d * d : d - 0.25; });
        const Tensor h1 = per([](double d) { return d <= 1 ? 0.5 * d * d : d - 0.5; });
        const Tensor h3 = per([](double d) { return d <= 0.3 ? 0.5 * d * d : 0.3 * (d - 0.15); });
        return V{mean(l1), l1, mean(s1), sum(s5), mean(l1), mean(h1), sum(h3) / 40.0};
      })
      .covers({"l1_loss", "smooth_l1_loss", "huber_loss"})
      .autocast(AutocastOp::mse_loss);
  row("binary_cross_entropy", {{{40, 13}, Kind::unit}, {{40, 13}, Kind::unit}, {{13}, Kind::positive}},
      [](const V& x) {
        const Tensor p = x[0] * 0.9 + 0.05;  // inside (0, 1), away from the log clamp
        return V{binary_cross_entropy(p, x[1]), binary_cross_entropy(p, x[1], Reduction::none, x[2])};
      })
      .ref([](const V& x) {
        const Tensor p = x[0] * 0.9 + 0.05;
        const Tensor per =
            map2(p, x[1], [](double a, double y) { return -(y * std::log(a) + (1 - y) * std::log(1 - a)); });
        return V{mean(per), per * x[2]};
      })
      .autocast(AutocastOp::binary_cross_entropy_with_logits);
  row("kl_div", {{{40, 13}}, {{40, 13}, Kind::unit}},
      [](const V& x) {
        // Some target probabilities exactly 0: their terms are 0, not NaN.
        const Tensor q0 = where(gt(x[1], scalar_like(0.8, x[1])), zeros_like(x[1]), x[1]);
        return V{kl_div(x[0], q0), kl_div(x[0], q0, Reduction::batchmean),
                 kl_div(x[0], x[1] - 1.0, Reduction::sum, true)};
      })
      .ref([](const V& x) {
        const Tensor q0 = map1(x[1], [](double t) { return t > 0.8 ? 0.0 : t; });
        const Tensor per = map2(q0, x[0], [](double t, double l) { return t > 0 ? t * (std::log(t) - l) : 0.0; });
        const Tensor perl = map2(x[1], x[0], [](double t, double l) { return std::exp(t - 1) * ((t - 1) - l); });
        return V{mean(per), sum(per) / 40.0, sum(perl)};
      })
      .autocast(AutocastOp::reductions);
  row("margin_losses", {{{40, 13}}, {{40, 13}}, {{40}, Kind::mask}, {{40}}},
      [](const V& x) {
        const Tensor y = where(x[2], ones_like(x[3]), -ones_like(x[3]));
        const Tensor a = x[0].slice(1, 0, 1).squeeze(1), b = x[1].slice(1, 0, 1).squeeze(1);
        return V{margin_ranking_loss(a, b, y, 0.3), cosine_similarity(x[0], x[1]),
                 cosine_embedding_loss(x[0], x[1], y, 0.1, Reduction::none), cosine_embedding_loss(x[0], x[1], y)};
      })
      .ref([](const V& x) {
        const std::vector<double> a = x[0].to_vector(), b = x[1].to_vector(), m = x[2].to_vector();
        std::vector<double> rank(40), cs(40), emb(40);
        for (size_t i = 0; i < 40; ++i) {
          const double y = m[i] != 0 ? 1 : -1;
          rank[i] = std::max(0.0, -y * (a[i * 13] - b[i * 13]) + 0.3);
          double d = 0, na = 0, nb = 0;
          for (size_t k = 0; k < 13; ++k) {
            d += a[i * 13 + k] * b[i * 13 + k];
            na += a[i * 13 + k] * a[i * 13 + k];
            nb += b[i * 13 + k] * b[i * 13 + k];
          }
          cs[i] = d / std::max(std::sqrt(na * nb), 1e-8);
          emb[i] = y > 0 ? 1 - cs[i] : std::max(0.0, cs[i] - 0.1);
        }
        std::vector<double> emb0(40);  // margin 0
        for (size_t i = 0; i < 40; ++i) emb0[i] = m[i] != 0 ? 1 - cs[i] : std::max(0.0, cs[i]);
        return V{mean(from_vector(rank, {40}, DType::f64)), from_vector(cs, {40}, DType::f64),
                 from_vector(emb, {40}, DType::f64), mean(from_vector(emb0, {40}, DType::f64))};
      })
      .covers({"margin_ranking_loss", "cosine_similarity", "cosine_embedding_loss"})
      .autocast(AutocastOp::reductions);
  // CTC over log_softmax of 12 frames x 3 sequences x 5 classes: padded and concatenated targets, a
  // repeated label (which needs a blank between), an empty target, shorter inputs, another blank, one
  // sequence, and a target no alignment fits (zero_infinity). The reference is the forward recursion in
  // plain probabilities (f64), not in logs.
  row("ctc_loss", {{{12, 3, 5}}},
      [](const V& x) {
        const Tensor lp = log_softmax(x[0], -1);
        const TensorOptions i64(DType::i64, x[0].device());
        const Tensor padded = from_vector({1, 2, 2, 3, 4, 1, 1, 1, 1, 1, 1, 1}, {3, 4}, i64);
        const Tensor concat = from_vector({1, 2, 2, 3, 4, 1}, {6}, i64);
        const Tensor other = from_vector({0, 0, 1, 3, 2, 1, 2, 1}, {8}, i64);
        const Tensor never = from_vector({1, 1, 1, 1, 1, 1, 1, 2, 3}, {9}, i64);
        return V{ctc_loss(lp, padded, {12, 9, 5}, {4, 2, 0}),
                 ctc_loss(lp, concat, {12, 9, 5}, {4, 2, 0}, 0, Reduction::none),
                 ctc_loss(lp, other, {12, 12, 7}, {3, 1, 4}, 4, Reduction::sum),
                 ctc_loss(lp.select(1, 0), padded.select(0, 0), {12}, {4}, 0, Reduction::none),
                 ctc_loss(lp, never, {12, 12, 3}, {7, 2, 0}, 0, Reduction::none, true)};
      })
      .ref([](const V& x) {
        const std::vector<double> z = x[0].to_vector();  // [T, N, C] logits
        const int64_t T = 12, N = 3, C = 5;
        std::vector<double> p(size_t(T * N * C));  // softmax
        for (int64_t r = 0; r < T * N; ++r) {
          double m = -1e300, s = 0;
          for (int64_t c = 0; c < C; ++c) m = std::max(m, z[size_t(r * C + c)]);
          for (int64_t c = 0; c < C; ++c) s += std::exp(z[size_t(r * C + c)] - m);
          for (int64_t c = 0; c < C; ++c) p[size_t(r * C + c)] = std::exp(z[size_t(r * C + c)] - m) / s;
        }
        // -log P(target | sequence n's first `frames` frames), or +inf.
        const auto nll = [&](int64_t n, const std::vector<int64_t>& target, int64_t frames, int64_t blank) {
          std::vector<int64_t> ext = {blank};
          for (int64_t c : target) {
            ext.push_back(c);
            ext.push_back(blank);
          }
          const size_t L = ext.size();
          std::vector<double> a(L, 0.0), b(L);
          a[0] = p[size_t(n * C + blank)];
          if (L > 1) a[1] = p[size_t(n * C + ext[1])];
          for (int64_t t = 1; t < frames; ++t) {
            for (size_t s = 0; s < L; ++s) {
              double v = a[s] + (s >= 1 ? a[s - 1] : 0.0);
              if (s >= 2 && ext[s] != blank && ext[s] != ext[s - 2]) v += a[s - 2];
              b[s] = v * p[size_t((t * N + n) * C + ext[s])];
            }
            a = b;
          }
          const double prob = a[L - 1] + (L > 1 ? a[L - 2] : 0.0);
          return prob > 0 ? -std::log(prob) : std::numeric_limits<double>::infinity();
        };
        const double l0 = nll(0, {1, 2, 2, 3}, 12, 0), l1 = nll(1, {4, 1}, 9, 0), l2 = nll(2, {}, 5, 0);
        const double s0 = nll(0, {0, 0, 1}, 12, 4), s1 = nll(1, {3}, 12, 4), s2 = nll(2, {2, 1, 2, 1}, 7, 4);
        const double n0 = nll(0, {1, 1, 1, 1, 1, 1, 1}, 12, 0), n1 = nll(1, {2, 3}, 12, 0), n2 = nll(2, {}, 3, 0);
        (void)n0;  // +inf: 7 equal labels need 13 frames; zero_infinity makes it 0
        const auto f64 = [](std::vector<double> v) { return from_vector(v, {int64_t(v.size())}, DType::f64); };
        return V{scalar_tensor((l0 / 4 + l1 / 2 + l2) / 3, DType::f64), f64({l0, l1, l2}),
                 scalar_tensor(s0 + s1 + s2, DType::f64), scalar_tensor(l0, DType::f64), f64({0.0, n1, n2})};
      })
      .autocast(AutocastOp::nll_loss);
  // ---- shape ops built from views, index_select, gather, cat, where: plain index-by-index references ----
  row("tril_triu", {{{3, 5, 6}}},
      [](const V& x) {
        return V{tril(x[0]), tril(x[0], 1), triu(x[0], -1), triu(x[0], 2)};
      })
      .ref([](const V& x) {
        const auto tri = [&](int64_t k, bool lower) {
          std::vector<double> v = x[0].to_vector();
          for (int64_t b = 0; b < 3; ++b)
            for (int64_t i = 0; i < 5; ++i)
              for (int64_t j = 0; j < 6; ++j)
                if (lower ? j - i > k : j - i < k) v[size_t((b * 5 + i) * 6 + j)] = 0;
          return from_vector(v, {3, 5, 6}, DType::f64);
        };
        return V{tri(0, true), tri(1, true), tri(-1, false), tri(2, false)};
      })
      .covers({"tril", "triu"})
      .autocast(AutocastOp::elementwise);
  row("flip_roll", {{{4, 6}}},
      [](const V& x) {
        return V{flip(x[0], {0}), flip(x[0], {0, -1}), roll(x[0], 2, 1), roll(x[0], -5, 0)};
      })
      .ref([](const V& x) {
        const std::vector<double> v = x[0].to_vector();
        const auto map = [&](const std::function<double(int64_t, int64_t)>& f) {
          std::vector<double> o(24);
          for (int64_t i = 0; i < 4; ++i)
            for (int64_t j = 0; j < 6; ++j) o[size_t(i * 6 + j)] = f(i, j);
          return from_vector(o, {4, 6}, DType::f64);
        };
        const auto at = [&](int64_t i, int64_t j) { return v[size_t(i * 6 + j)]; };
        return V{map([&](int64_t i, int64_t j) { return at(3 - i, j); }),
                 map([&](int64_t i, int64_t j) { return at(3 - i, 5 - j); }),
                 map([&](int64_t i, int64_t j) { return at(i, (j + 4) % 6); }),
                 map([&](int64_t i, int64_t j) { return at((i + 5) % 4, j); })};
      })
      .covers({"flip", "roll"})
      .autocast(AutocastOp::elementwise);
  row("tile_chunk_unbind", {{{2, 3}}, {{7, 3}}},
      [](const V& x) {
        const std::vector<Tensor> c = chunk(x[1], 3, 0), u = unbind(x[0], 1);
        return V{tile(x[0], {2, 2}), tile(x[0], {2, 1, 3}), c[0], c[1], c[2], u[1] * 2.0};
      })
      .ref([](const V& x) {
        const std::vector<double> a = x[0].to_vector(), b = x[1].to_vector();
        std::vector<double> t1, t2, u;
        for (int64_t i = 0; i < 4; ++i)
          for (int64_t j = 0; j < 6; ++j) t1.push_back(a[size_t((i % 2) * 3 + j % 3)]);
        for (int64_t r = 0; r < 2; ++r)
          for (int64_t i = 0; i < 2; ++i)
            for (int64_t j = 0; j < 9; ++j) t2.push_back(a[size_t(i * 3 + j % 3)]);
        for (int64_t i = 0; i < 2; ++i) u.push_back(2 * a[size_t(i * 3 + 1)]);
        const auto rows = [&](int64_t r0, int64_t n) {
          return from_vector(std::vector<double>(b.begin() + r0 * 3, b.begin() + (r0 + n) * 3), {n, 3}, DType::f64);
        };
        return V{from_vector(t1, {4, 6}, DType::f64),
                 from_vector(t2, {2, 2, 9}, DType::f64),
                 rows(0, 3),
                 rows(3, 3),
                 rows(6, 1),
                 from_vector(u, {2}, DType::f64)};
      })
      .covers({"tile", "chunk", "unbind"})
      .autocast(AutocastOp::elementwise);
  // A strided view (offset, dims, batched): the backward puts the gradient on the diagonal.
  row("diagonal", {{{3, 4}}, {{2, 3, 4}}},
      [](const V& x) {
        return V{diagonal(x[0]), diagonal(x[0], 1), diagonal(x[0], -1) * 2.0, diagonal(x[1], 1, 2, 1),
                 diagonal(x[1], 0, 0, 2)};
      })
      .ref([](const V& x) {
        const std::vector<double> a = x[0].to_vector(), b = x[1].to_vector();
        std::vector<double> d0, d1, dm, e, f;
        for (int64_t i = 0; i < 3; ++i) d0.push_back(a[size_t(i * 4 + i)]);
        for (int64_t i = 0; i < 3; ++i) d1.push_back(a[size_t(i * 4 + i + 1)]);
        for (int64_t i = 0; i < 2; ++i) dm.push_back(2 * a[size_t((i + 1) * 4 + i)]);
        for (int64_t k = 0; k < 2; ++k)  // b[k, i + 1, i] for dims 2 (columns) and 1 (rows), offset 1
          for (int64_t i = 0; i < 2; ++i) e.push_back(b[size_t(k * 12 + (i + 1) * 4 + i)]);
        for (int64_t j = 0; j < 3; ++j)  // b[i, j, i], dims 0 and 2: j first, the diagonal last
          for (int64_t i = 0; i < 2; ++i) f.push_back(b[size_t(i * 12 + j * 4 + i)]);
        return V{from_vector(d0, {3}, DType::f64), from_vector(d1, {3}, DType::f64), from_vector(dm, {2}, DType::f64),
                 from_vector(e, {2, 2}, DType::f64), from_vector(f, {3, 2}, DType::f64)};
      })
      .covers({"diagonal"})
      .autocast(AutocastOp::elementwise);
  row("take_along_dim", {{{4, 6}}, {{4, 2}, Kind::index, 6}, {{2, 1}, Kind::index, 4}},
      [](const V& x) {
        return V{take_along_dim(x[0], x[1], 1), take_along_dim(x[0], x[2], 0)};
      })
      .ref([](const V& x) {
        const std::vector<double> v = x[0].to_vector(), i1 = x[1].to_vector(), i2 = x[2].to_vector();
        std::vector<double> o1, o2;
        for (int64_t i = 0; i < 4; ++i)
          for (int64_t j = 0; j < 2; ++j) o1.push_back(v[size_t(i * 6 + int64_t(i1[size_t(i * 2 + j)]))]);
        for (int64_t i = 0; i < 2; ++i)
          for (int64_t j = 0; j < 6; ++j) o2.push_back(v[size_t(int64_t(i2[size_t(i)]) * 6 + j)]);
        return V{from_vector(o1, {4, 2}, DType::f64), from_vector(o2, {2, 6}, DType::f64)};
      })
      .autocast(AutocastOp::elementwise);
  row("pad", {{{2, 3, 5}}},
      [](const V& x) {
        return V{pad(x[0], {1, 2}, PadMode::constant, 0.5), pad(x[0], {-1, 2, 1, -1}),
                 pad(x[0], {2, 1, 1, 0}, PadMode::reflect), pad(x[0], {3, 1, 2, 2}, PadMode::replicate),
                 pad(x[0], {2, 5, 1, 3}, PadMode::circular)};
      })
      .ref([](const V& x) {
        const std::vector<double> v = x[0].to_vector();
        // Output (b, i, j) reads input row src(i) and column src(j), or the constant where src is -1.
        const auto padded = [&](int64_t h, int64_t w, const std::function<int64_t(int64_t)>& si,
                                const std::function<int64_t(int64_t)>& sj, double c) {
          std::vector<double> o;
          for (int64_t b = 0; b < 2; ++b)
            for (int64_t i = 0; i < h; ++i)
              for (int64_t j = 0; j < w; ++j) {
                const int64_t r = si(i), q = sj(j);
                o.push_back(r < 0 || q < 0 ? c : v[size_t((b * 3 + r) * 5 + q)]);
              }
          return from_vector(o, {2, h, w}, DType::f64);
        };
        const auto reflect = [](int64_t i, int64_t n) { return i < 0 ? -i : i >= n ? 2 * (n - 1) - i : i; };
        const auto clampi = [](int64_t i, int64_t n) { return std::clamp<int64_t>(i, 0, n - 1); };
        const auto wrap = [](int64_t i, int64_t n) { return ((i % n) + n) % n; };
        const auto inside = [](int64_t i, int64_t n) { return i >= 0 && i < n ? i : -1; };
        return V{
            padded(
                3, 8, [](int64_t i) { return i; }, [&](int64_t j) { return inside(j - 1, 5); }, 0.5),
            padded(
                3, 6, [&](int64_t i) { return inside(i - 1, 3); }, [&](int64_t j) { return inside(j + 1, 5); }, 0.0)
                .narrow(1, 0, 3),
            padded(
                4, 8, [&](int64_t i) { return reflect(i - 1, 3); }, [&](int64_t j) { return reflect(j - 2, 5); }, 0),
            padded(
                7, 9, [&](int64_t i) { return clampi(i - 2, 3); }, [&](int64_t j) { return clampi(j - 3, 5); }, 0),
            padded(
                7, 12, [&](int64_t i) { return wrap(i - 1, 3); }, [&](int64_t j) { return wrap(j - 2, 5); }, 0)};
      })
      .autocast(AutocastOp::elementwise);
  row("pixel_shuffle", {{{2, 8, 3, 2}}, {{2, 3, 4, 6}}},
      [](const V& x) {
        return V{pixel_shuffle(x[0], 2), pixel_unshuffle(pixel_shuffle(x[0], 2), 2), pixel_unshuffle(x[1], 2)};
      })
      .ref([](const V& x) {
        const std::vector<double> a = x[0].to_vector(), b = x[1].to_vector();
        std::vector<double> s(a.size()), u(b.size());
        for (int64_t n = 0; n < 2; ++n)
          for (int64_t c = 0; c < 2; ++c)
            for (int64_t y = 0; y < 6; ++y)
              for (int64_t z = 0; z < 4; ++z)  // out[n, c, y, z] = in[n, c*4 + (y%2)*2 + z%2, y/2, z/2]
                s[size_t(((n * 2 + c) * 6 + y) * 4 + z)] =
                    a[size_t(((n * 8 + c * 4 + (y % 2) * 2 + z % 2) * 3 + y / 2) * 2 + z / 2)];
        for (int64_t n = 0; n < 2; ++n)
          for (int64_t c = 0; c < 12; ++c)
            for (int64_t y = 0; y < 2; ++y)
              for (int64_t z = 0; z < 3; ++z)  // out[n, c, y, z] = in[n, c/4, y*2 + (c%4)/2, z*2 + c%2]
                u[size_t(((n * 12 + c) * 2 + y) * 3 + z)] =
                    b[size_t(((n * 3 + c / 4) * 4 + y * 2 + (c % 4) / 2) * 6 + z * 2 + c % 2)];
        return V{from_vector(s, {2, 2, 6, 4}, DType::f64), x[0], from_vector(u, {2, 12, 2, 3}, DType::f64)};
      })
      .covers({"pixel_shuffle", "pixel_unshuffle"})
      .autocast(AutocastOp::elementwise);
  row("interpolate", {{{2, 3, 5, 4}}},
      [](const V& x) {
        return V{interpolate(x[0], {7, 9}),
                 interpolate(x[0], {3, 2}),
                 interpolate(x[0], {8, 6}, InterpMode::bilinear),
                 interpolate(x[0], {3, 7}, InterpMode::bilinear, true),
                 interpolate_scale(x[0], {2.0, 1.5}, InterpMode::bilinear),
                 interpolate(x[0], {9, 3}, InterpMode::bicubic),
                 interpolate(x[0], {3, 7}, InterpMode::bicubic, true)};
      })
      .ref([](const V& x) {
        const std::vector<double> v = x[0].to_vector();
        // Bilinear by its 2-D formula (not separably), nearest by floor(dst * in / out).
        const auto resize = [&](int64_t oh, int64_t ow, bool bilinear, bool ac) {
          const auto src = [&](int64_t o, int64_t in, int64_t out) {
            if (ac) return out > 1 ? double(o) * double(in - 1) / double(out - 1) : 0.0;
            return std::max(0.0, (double(o) + 0.5) * double(in) / double(out) - 0.5);
          };
          std::vector<double> o;
          for (int64_t p = 0; p < 6; ++p)
            for (int64_t i = 0; i < oh; ++i)
              for (int64_t j = 0; j < ow; ++j) {
                const double* plane = v.data() + p * 20;
                if (!bilinear) {
                  const int64_t r = std::min<int64_t>(int64_t(std::floor(double(i) * 5 / double(oh))), 4);
                  const int64_t c = std::min<int64_t>(int64_t(std::floor(double(j) * 4 / double(ow))), 3);
                  o.push_back(plane[r * 4 + c]);
                  continue;
                }
                const double sy = src(i, 5, oh), sx = src(j, 4, ow);
                const int64_t y0 = std::min<int64_t>(int64_t(sy), 4), x0 = std::min<int64_t>(int64_t(sx), 3);
                const int64_t y1 = std::min<int64_t>(y0 + 1, 4), x1 = std::min<int64_t>(x0 + 1, 3);
                const double ly = sy - double(y0), lx = sx - double(x0);
                o.push_back((1 - ly) * ((1 - lx) * plane[y0 * 4 + x0] + lx * plane[y0 * 4 + x1]) +
                            ly * ((1 - lx) * plane[y1 * 4 + x0] + lx * plane[y1 * 4 + x1]));
              }
          return from_vector(o, {2, 3, oh, ow}, DType::f64);
        };
        // Bicubic by its 4x4 formula (PyTorch's upsample_bicubic2d).
        const auto bicubic = [&](int64_t oh, int64_t ow, bool ac) {
          const double A = -0.75;
          const auto cc = [A](double t) {
            t = std::abs(t);
            return t <= 1 ? ((A + 2) * t - (A + 3)) * t * t + 1 : ((A * t - 5 * A) * t + 8 * A) * t - 4 * A;
          };
          const auto src = [&](int64_t o, int64_t in, int64_t out) {
            if (ac) return out > 1 ? double(o) * double(in - 1) / double(out - 1) : 0.0;
            return (double(o) + 0.5) * double(in) / double(out) - 0.5;
          };
          std::vector<double> o;
          for (int64_t p = 0; p < 6; ++p)
            for (int64_t i = 0; i < oh; ++i)
              for (int64_t j = 0; j < ow; ++j) {
                const double sy = src(i, 5, oh), sx = src(j, 4, ow), fy = std::floor(sy), fx = std::floor(sx);
                double acc = 0;
                for (int a = -1; a <= 2; ++a)
                  for (int b = -1; b <= 2; ++b) {
                    const int64_t r = std::clamp<int64_t>(int64_t(fy) + a, 0, 4),
                                  c = std::clamp<int64_t>(int64_t(fx) + b, 0, 3);
                    acc += cc(sy - (fy + a)) * cc(sx - (fx + b)) * v[size_t(p * 20 + r * 4 + c)];
                  }
                o.push_back(acc);
              }
          return from_vector(o, {2, 3, oh, ow}, DType::f64);
        };
        return V{resize(7, 9, false, false), resize(3, 2, false, false), resize(8, 6, true, false),
                 resize(3, 7, true, true),   resize(10, 6, true, false), bicubic(9, 3, false),
                 bicubic(3, 7, true)};
      })
      .covers({"interpolate", "interpolate_scale"})
      .autocast(AutocastOp::elementwise);
  // The other ranks and modes (values against torch in tests/python/test_interpolate_vs_torch.py): here
  // gradients, f32 and the CUDA path.
  row("interpolate_nd", {{{2, 3, 7}}, {{1, 2, 3, 5, 4}}},
      [](const V& x) {
        return V{interpolate(x[0], {11}, InterpMode::linear),
                 interpolate(x[0], {4}, InterpMode::linear, true),
                 interpolate(x[0], {3}, InterpMode::area),
                 interpolate_scale(x[0], {1.7}, InterpMode::nearest_exact),
                 interpolate(x[1], {5, 7, 3}, InterpMode::trilinear),
                 interpolate_scale(x[1], {1.5, 0.6, 2.0}, InterpMode::trilinear, true),
                 interpolate(x[1], {2, 3, 3}, InterpMode::area),
                 interpolate(x[1], {4, 3, 6}, InterpMode::nearest_exact),
                 interpolate(x[1], {4, 3, 6})};
      })
      .covers({"interpolate"})
      .autocast(AutocastOp::elementwise);
  // 280 indices: the CUDA backward sums runs in chunks of 256 (index_add_chunks_kernel).
  row("embedding", {{{50, 24}}, {{4, 70}, Kind::index, 50}}, [](const V& x) {
    return one(embedding(x[0], x[1]));
  }).autocast(AutocastOp::embedding);
  // padding_idx's row is returned but gets no gradient: no finite differences (the parity run and
  // tests/test_nn_ops.cpp check its zero gradient).
  row("embedding_padding", {{{50, 24}}, {{4, 30}, Kind::index, 50}},
      [](const V& x) { return one(embedding(x[0], x[1], 7)); })
      .covers({"embedding"})
      .no_grad()
      .autocast(AutocastOp::embedding);
  row("dropout", {{{64, 40}}},
      [](const V& x) {
        Generator g(5);
        return V{dropout(x[0], 0.3, true, &g), dropout(x[0], 0.3, false)};
      })
      .autocast(AutocastOp::dropout);
  row("attention", {{{2, 3, 10, 16}}, {{2, 3, 12, 16}}, {{2, 3, 12, 8}}, {{10, 12}, Kind::mask}},
      [](const V& x) {
        return V{scaled_dot_product_attention(x[0], x[1], x[2]), scaled_dot_product_attention(x[0], x[1], x[2], logical_not(x[3]))};
      })
      .covers({"scaled_dot_product_attention"})
      .tol(3e-2)
      .autocast(AutocastOp::attention);
  // Grouped-query (6 query heads over 2 key/value heads) and multi-query (1): against the same
  // attention with each key/value head repeated for its query heads by hand.
  row("attention_gqa", {{{2, 6, 5, 8}}, {{2, 2, 7, 8}}, {{2, 2, 7, 4}}, {{2, 1, 7, 8}}, {{2, 1, 7, 4}}},
      [](const V& x) {
        return V{scaled_dot_product_attention(x[0], x[1], x[2]), scaled_dot_product_attention(x[0], x[3], x[4])};
      })
      .ref([](const V& x) {
        const auto rep = [](const Tensor& t, int64_t times) {  // head h of the result is head h / times of t
          std::vector<Tensor> heads;
          for (int64_t h = 0; h < t.size(1) * times; ++h) heads.push_back(t.select(1, h / times));
          return stack(heads, 1);
        };
        const auto att = [](const Tensor& q, const Tensor& k, const Tensor& v) {
          return matmul(softmax(matmul(q, k.transpose(-1, -2)) * (1.0 / std::sqrt(8.0)), -1), v);
        };
        return V{att(x[0], rep(x[1], 3), rep(x[2], 3)), att(x[0], rep(x[3], 6), rep(x[4], 6))};
      })
      .covers({"scaled_dot_product_attention"})
      .tol(3e-2)
      .autocast(AutocastOp::attention);
  // Causal masks from the kernel (top-left and bottom-right, with and without an additive bias), a
  // scale, a softcap and the weights: against materialised -inf masks and plain softmax.
  row("attention_options", {{{2, 2, 5, 8}}, {{2, 2, 7, 8}}, {{2, 2, 7, 4}}, {{5, 7}}},
      [](const V& x) {
        AttentionOptions tl, br, cap;
        tl.causal = Causal::top_left;
        br.causal = Causal::bottom_right;
        br.scale = 0.5;
        cap.softcap = 2.0;
        const AttentionOutput a = attention(x[0], x[1], x[2], {}, tl, true);
        const AttentionOutput b = attention(x[0], x[1], x[2], x[3], br, true);
        return V{a.out,
                 a.weights,
                 b.out,
                 b.weights,
                 attention(x[0], x[1], x[2], x[3], cap).out,
                 masked_softmax(x[3], {}, 1.5, Causal::top_left)};
      })
      .ref([](const V& x) {
        const double inf = INFINITY;
        const auto causal = [inf](int64_t l, int64_t s, int64_t off) {
          std::vector<double> m;
          for (int64_t i = 0; i < l; ++i)
            for (int64_t j = 0; j < s; ++j) m.push_back(j <= i + off ? 0.0 : -inf);
          return from_vector(m, {l, s}, DType::f64);
        };
        const Tensor s = matmul(x[0], x[1].transpose(-1, -2));
        const Tensor pa = softmax_ref(s * (1.0 / std::sqrt(8.0)) + causal(5, 7, 0), 3, false);
        const Tensor pb = softmax_ref(s * 0.5 + x[3] + causal(5, 7, 2), 3, false);
        const Tensor pc = softmax_ref(tanh(s * (1.0 / std::sqrt(8.0) / 2.0)) * 2.0 + x[3], 3, false);
        return V{matmul(pa, x[2]), pa,
                 matmul(pb, x[2]), pb,
                 matmul(pc, x[2]), softmax_ref(x[3] * 1.5 + causal(5, 7, 0), 1, false)};
      })
      .covers({"attention", "masked_softmax"})
      .tol(3e-2)
      .autocast(AutocastOp::attention);
  // einsum: attention scores, a bilinear form over three operands, an ellipsis with broadcasting, a
  // transpose, a full sum and an implicit output.
  row("einsum", {{{2, 3, 4, 5}}, {{2, 3, 6, 5}}, {{4, 3}}, {{3, 5}}, {{4, 5}}, {{2, 3, 4}}, {{4, 2}}},
      [](const V& x) {
        return V{einsum("bhld,bhmd->bhlm", {x[0], x[1]}),
                 einsum("bi,ij,bj->b", {x[2], x[3], x[4]}),
                 einsum("...ij,...jk->...ik", {x[5], x[6]}),
                 einsum("ij->ji", {x[3]}),
                 einsum("ij->", {x[3]}),
                 einsum("ij,jk", {x[2], x[3]})};
      })
      .ref([](const V& x) {
        return V{einsum_ref("bhld,bhmd->bhlm", {x[0], x[1]}),
                 einsum_ref("bi,ij,bj->b", {x[2], x[3], x[4]}),
                 einsum_ref("aij,jk->aik", {x[5], x[6]}),
                 einsum_ref("ij->ji", {x[3]}),
                 einsum_ref("ij->", {x[3]}),
                 einsum_ref("ij,jk->ik", {x[2], x[3]})};
      })
      .tol(3e-2)
      .autocast(AutocastOp::matmul);

  // ---- joining, splitting and indexing ----
  row("cat_stack_split", {{{4, 5}}, {{4, 5}}},
      [](const V& x) {
        const std::vector<Tensor> parts = split(x[0], 2, 1);
        return V{cat({x[0], x[1]}, 1), stack({x[0], x[1]}, 0), parts[0] * 2.0, parts[2], cat({x[0].t(), x[1].t()}, 0)};
      })
      .covers({"cat", "stack", "split"})
      .autocast(AutocastOp::elementwise);
  row("index_select", {{{9, 20}}, {{14}, Kind::index, 9}}, [](const V& x) {
    return V{index_select(x[0], 0, x[1]), index_select(x[0].t(), 1, x[1])};
  }).autocast(AutocastOp::elementwise);
  row("gather", {{{9, 20}}, {{9, 6}, Kind::index, 20}}, [](const V& x) {
    return one(gather(x[0], 1, x[1]));
  }).autocast(AutocastOp::elementwise);
  row("scatter_add", {{{9, 20}}, {{9, 6}, Kind::index, 20}, {{9, 6}}}, [](const V& x) {
    return one(scatter_add(x[0], 1, x[1], x[2]));
  }).autocast(AutocastOp::elementwise);
  row("one_hot", {{{7, 3}, Kind::index, 6}},
      [](const V& x) {
        return V{one_hot(x[0], 6), one_hot(x[0], 4, OutOfRange::zeros), one_hot(x[0], -1)};
      })
      .ref([](const V& x) {
        const std::vector<double> v = x[0].to_vector();
        const double hi = *std::max_element(v.begin(), v.end());
        const auto oh = [&](int64_t c) {
          std::vector<double> o;
          for (double e : v)
            for (int64_t k = 0; k < c; ++k) o.push_back(double(k) == e ? 1 : 0);
          return from_vector(o, {7, 3, c}, DType::i64);
        };
        return V{oh(6), oh(4), oh(int64_t(hi) + 1)};
      })
      .f32_only()
      .no_grad();
  // scatter and scatter_reduce along dim 1 with repeated indices (9 writes into 6 places per row;
  // some places get none), with and without x's own value, against writes done in order by hand.
  row("scatter_reduce", {{{4, 6}, Kind::positive}, {{4, 9}, Kind::index, 6}, {{4, 9}, Kind::positive}},
      [](const V& x) {
        V out{scatter(x[0], 1, x[1], x[2])};
        for (ScatterReduce r :
             {ScatterReduce::sum, ScatterReduce::prod, ScatterReduce::mean, ScatterReduce::amax, ScatterReduce::amin})
          for (bool self : {true, false}) out.push_back(scatter_reduce(x[0], 1, x[1], x[2], r, self));
        return out;
      })
      .ref([](const V& x) {
        const std::vector<double> xv = x[0].to_vector(), iv = x[1].to_vector(), sv = x[2].to_vector();
        const auto run = [&](int r, bool self) {  // r: -1 assign, else ScatterReduce's order
          std::vector<double> y = xv, n(xv.size(), 0.0);
          for (size_t row = 0; row < 4; ++row)
            for (size_t i = 0; i < 9; ++i) {
              const size_t at = row * 6 + size_t(iv[row * 9 + i]);
              const double s = sv[row * 9 + i];
              const bool first = !self && n[at] == 0;
              n[at] += 1;
              if (r == -1 || first)
                y[at] = s;
              else if (r == 0 || r == 2)
                y[at] += s;
              else if (r == 1)
                y[at] *= s;
              else if (r == 3)
                y[at] = std::max(y[at], s);
              else
                y[at] = std::min(y[at], s);
            }
          if (r == 2)
            for (size_t at = 0; at < y.size(); ++at)
              if (n[at] > 0) y[at] /= n[at] + (self ? 1 : 0);
          return from_vector(y, {4, 6}, DType::f64);
        };
        V out{run(-1, true)};
        for (int r = 0; r < 5; ++r)
          for (bool self : {true, false}) out.push_back(run(r, self));
        return out;
      })
      .covers({"scatter", "scatter_reduce"})
      .tol(3e-2)
      .autocast(AutocastOp::elementwise);
  // scatter_reduce's prod with zeros at fixed places of x and src (and fixed indices), with and without
  // x's own value. At most one zero src per place: each gradient is a product of the others, and so is
  // differentiable again (x zero and src zero in one place too). Two zero srcs in one place: the
  // second derivative of those srcs' gradient (0, the product of the others) is refused, as torch's.
  const auto prod_zeros = [](bool two) {
    return [two](const V& x) {
      const Device dev = x[0].device();
      const Tensor idx = from_vector({0, 1, 0, 2, 1, 2, 2, 0, 1, 0}, {2, 5}, DType::i64).to(dev);
      const Tensor xz = from_vector({0, 1, 0, 0, 0, 1}, {2, 3}, DType::boolean).to(dev);
      const Tensor sz = from_vector({1, 0, two ? 1.0 : 0.0, 0, 0, 0, 1, 0, 0, 0}, {2, 5}, DType::boolean).to(dev);
      const Tensor a = masked_fill(x[0], xz, 0.0), b = masked_fill(x[1], sz, 0.0);
      return V{scatter_reduce(a, 1, idx, b, ScatterReduce::prod, true),
               scatter_reduce(a, 1, idx, b, ScatterReduce::prod, false)};
    };
  };
  row("scatter_reduce_prod_zero", {{{2, 3}, Kind::positive}, {{2, 5}, Kind::positive}}, prod_zeros(false))
      .covers({"scatter_reduce"})
      .tol(3e-2)
      .autocast(AutocastOp::elementwise);
  row("scatter_reduce_prod_zeros", {{{2, 3}, Kind::positive}, {{2, 5}, Kind::positive}}, prod_zeros(true))
      .covers({"scatter_reduce"})
      .tol(3e-2)
      .autocast(AutocastOp::elementwise);
  // index_put on [5, 4, 3] with two broadcast index tensors (a repeated place, negative indices), a
  // bool mask over the leading dims, and accumulation.
  row("index_put", {{{5, 4, 3}}, {{2, 1}}, {{3, 4, 3}}, {{5, 4}, Kind::mask}},
      [](const V& x) {
        const TensorOptions o(DType::i64, x[0].device());
        const Tensor i0 = from_vector({4, -5}, {2, 1}, o), i1 = from_vector({0, 3, -1}, {3}, o);
        const Tensor rows = from_vector({1, 3, 1}, {3}, o);
        return V{index_put(x[0], {i0, i1}, x[1].unsqueeze(2)), index_put(x[0], {rows}, x[2], true),
                 index_put(x[0], {rows}, x[2]), index_put(x[0], {x[3]}, x[1].select(1, 0).narrow(0, 0, 1))};
      })
      .ref([](const V& x) {
        std::vector<double> a = x[0].to_vector(), b = a, c = a, d = a;
        const std::vector<double> v1 = x[1].to_vector(), v2 = x[2].to_vector(), m = x[3].to_vector();
        const int64_t i0[2] = {4, 0}, i1[3] = {0, 3, 3};
        for (int64_t p = 0; p < 2; ++p)
          for (int64_t q = 0; q < 3; ++q)
            for (int64_t e = 0; e < 3; ++e) a[size_t((i0[p] * 4 + i1[q]) * 3 + e)] = v1[size_t(p)];
        const int64_t rows[3] = {1, 3, 1};
        for (int64_t p = 0; p < 3; ++p)
          for (int64_t e = 0; e < 12; ++e) {
            b[size_t(rows[p] * 12 + e)] += v2[size_t(p * 12 + e)];
            c[size_t(rows[p] * 12 + e)] = v2[size_t(p * 12 + e)];
          }
        for (size_t p = 0; p < 20; ++p)
          if (m[p] != 0)
            for (size_t e = 0; e < 3; ++e) d[p * 3 + e] = v1[0];
        return V{from_vector(a, {5, 4, 3}, DType::f64), from_vector(b, {5, 4, 3}, DType::f64),
                 from_vector(c, {5, 4, 3}, DType::f64), from_vector(d, {5, 4, 3}, DType::f64)};
      })
      .autocast(AutocastOp::elementwise);
  // nonzero's coordinates, masked_scatter from a longer src, and slices with negative steps (copies).
  row("nonzero_masked_scatter", {{{4, 5, 3}}, {{4, 5, 3}, Kind::mask}, {{70}}, {{5, 1}, Kind::mask}},
      [](const V& x) {
        return V{nonzero(x[1]),
                 masked_scatter(x[0], x[1], x[2]),
                 masked_scatter(x[0], x[3], x[2]),
                 x[0].slice(1, -1, -100, -2),
                 x[0].slice(2, 1, -4, -1),
                 x[0].slice(0, 3, 0, -2)};
      })
      .ref([](const V& x) {
        const std::vector<double> m = x[1].to_vector(), xs = x[0].contiguous().to_vector(), src = x[2].to_vector();
        std::vector<double> coords, ms = xs;
        size_t k = 0;
        for (size_t i = 0; i < m.size(); ++i)
          if (m[i] != 0) {
            coords.insert(coords.end(), {double(i / 15), double(i / 3 % 5), double(i % 3)});
            ms[i] = src[k++];
          }
        const std::vector<double> m2 = x[3].to_vector();
        std::vector<double> ms2 = xs;
        k = 0;
        for (size_t i = 0; i < xs.size(); ++i)
          if (m2[i / 3 % 5] != 0) ms2[i] = src[k++];
        const auto sel = [](const Tensor& t, int64_t d, std::vector<int64_t> at) {
          return index_select(t, d, from_blob_copy(at.data(), {int64_t(at.size())}));
        };
        return V{from_vector(coords, {int64_t(coords.size() / 3), 3}, DType::i64),
                 from_vector(ms, {4, 5, 3}, DType::f64),
                 from_vector(ms2, {4, 5, 3}, DType::f64),
                 sel(x[0], 1, {4, 2, 0}),
                 sel(x[0], 2, {1, 0}),
                 sel(x[0], 0, {3, 1})};
      })
      .covers({"nonzero", "masked_scatter"})
      .autocast(AutocastOp::elementwise);

  // ---- factories and random streams (the device comes from the input) ----
  row("factories", {{{3, 4}}},
      [](const V& x) {
        const TensorOptions o(DType::f32, x[0].device());
        return V{arange(0.0, 10.0, 0.5, o), full({3, 4}, 2.5, o), eye(4, 5, o),  zeros({2, 3}, o),
                 ones({3}, o),               zeros_like(x[0]),    ones_like(x[0]), full_like(x[0], -1.5),
                 scalar_tensor(4.0, o),      arange(int64_t(7), TensorOptions(DType::i64, x[0].device())), x[0] * 1.0};
      })
      .covers({"arange", "full", "eye", "zeros", "ones", "zeros_like", "ones_like", "full_like", "scalar_tensor"})
      .f32_only()
      .no_grad()
      .tol(2e-2, 1e-5);
  row("random", {{{3, 4}}},
      [](const V& x) {
        const TensorOptions o(DType::f32, x[0].device());
        Generator g(77);
        return V{rand({1001}, o, &g), bernoulli({1001}, 0.4, o, &g), randn({1001}, o, &g), uniform({64}, -2, 3, o, &g),
                 normal({64}, 1, 0.5, o, &g), randint(3, 9, {64}, TensorOptions(DType::i64, x[0].device()), &g)};
      })
      .covers({"rand", "bernoulli", "randn", "uniform", "normal", "randint"})
      .f32_only()
      .no_grad()
      .tol(2e-2, 1e-5)
      .dtype_dependent("draws in f32 whatever the inputs' dtype: nothing for f64 to check");

  // ---- matrix decompositions (engine/ops_decomp.cpp): inputs made well-conditioned (A + n I, B B^T + n I) ----
  {
    const auto shifted = [](const Tensor& a) {  // a + n I over the last two dims
      return a + eye(a.size(-1), -1, TensorOptions(a.dtype(), a.device())) * double(a.size(-1));
    };
    const auto spd = [](const Tensor& b) {  // b b^T + n I, n x n for b [..., n, k]
      return matmul(b, b.transpose(-1, -2)) +
             eye(b.size(-2), -1, TensorOptions(b.dtype(), b.device())) * double(b.size(-2));
    };
    row("linalg_solve", {{{2, 4, 4}}, {{4, 3}}, {{2, 4}}, {{3, 4}}},
        [shifted](const V& x) {
          const Tensor a = shifted(x[0]);
          return V{linalg_solve(a, x[1]), linalg_solve(a, x[2]), linalg_solve(a, x[3], false)};
        })
        .f32_only()
        .tol(0, 1e-3);
    row("linalg_inv_det", {{{3, 4, 4}}, {{2, 3}}},
        [shifted, spd](const V& x) {
          const Tensor a = shifted(x[0]);
          const SignLogAbsDet s = linalg_slogdet(a);
          return V{linalg_inv(a), linalg_det(a), s.sign, s.logabsdet, logdet(spd(x[1]))};
        })
        .covers({"linalg_inv", "linalg_det", "linalg_slogdet", "logdet"})
        .f32_only()
        .tol(0, 1e-3);
    // det at a singular matrix (third row the sum of the first two): 0, its gradient the cofactors.
    row("linalg_det_singular", {{{2, 3}}, {{4, 2}}},
        [](const V& x) {
          const Tensor a = cat({x[0], sum(x[0], {0}, true)}, 0);
          // rank 2 of 4: the cofactors, so the gradient, are 0 too
          return V{linalg_det(a), linalg_det(matmul(x[1], x[1].transpose(0, 1)))};
        })
        .covers({"linalg_det"})
        .f32_only()
        .tol(0, 1e-3);
    row("linalg_cholesky", {{{2, 4, 4}}, {{4, 3}}, {{4, 4}}},
        [spd, shifted](const V& x) {
          const Tensor a = spd(x[0]);
          const Tensor l = linalg_cholesky(a);
          const Tensor lower = tril(shifted(x[2]));
          return V{l,
                   linalg_cholesky(a, true),
                   linalg_cholesky_ex(a).L,
                   cholesky_solve(x[1], l),
                   cholesky_solve(x[1], lower.transpose(0, 1), true),
                   cholesky_inverse(lower)};
        })
        .covers({"linalg_cholesky", "linalg_cholesky_ex", "cholesky_solve", "cholesky_inverse"})
        .f32_only()
        .tol(0, 1e-3);
    row("linalg_solve_triangular", {{{2, 4, 4}}, {{4, 3}}, {{3, 4}}},
        [shifted](const V& x) {
          const Tensor a = shifted(x[0]);
          return V{linalg_solve_triangular(a, x[1], true), linalg_solve_triangular(a, x[2], false, false),
                   linalg_solve_triangular(a, x[1], false, true, true)};
        })
        .f32_only()
        .tol(0, 1e-3);
    row("linalg_lu", {{{2, 4, 4}}, {{4, 3}}, {{2, 3, 4}}},
        [shifted](const V& x) {
          const LUFactor f = linalg_lu_factor(shifted(x[0]));
          return V{f.LU,
                   f.pivots,
                   linalg_lu_solve(f.LU, f.pivots, x[1]),
                   linalg_lu_solve(f.LU, f.pivots, x[1], true, true),
                   linalg_lu_solve(f.LU, f.pivots, x[2], false),
                   linalg_lu_solve(f.LU, f.pivots, x[2], false, true)};
        })
        .covers({"linalg_lu_factor", "linalg_lu_solve"})
        .f32_only()
        .tol(0, 1e-3);
  }

  for (Row& r : v)
    if (r.ops.empty()) r.ops = {r.name};
  return v;
}

}  // namespace

const std::vector<Row>& rows() {
  static const std::vector<Row> all = build();
  return all;
}

const Row* find_row(const std::string& name) {
  for (const Row& r : rows())
    if (r.name == name) return &r;
  return nullptr;
}

bool transposable(const In& in) {
  return (in.kind == Kind::normal || in.kind == Kind::positive || in.kind == Kind::unit || in.kind == Kind::nonzero) &&
         in.shape.size() >= 2 && in.shape[in.shape.size() - 1] != in.shape[in.shape.size() - 2];
}

std::vector<Tensor> make_inputs(const Row& row, DType dt, bool transposed, uint64_t seed) {
  Generator g(seed);
  std::vector<Tensor> out;
  for (const In& in : row.inputs) {
    Shape s = in.shape;
    if (transposed && transposable(in)) std::swap(s[s.size() - 1], s[s.size() - 2]);
    Tensor t;
    switch (in.kind) {
      case Kind::normal: t = randn(s, DType::f64, &g); break;
      case Kind::positive: t = rand(s, DType::f64, &g) + 0.5; break;
      case Kind::unit: t = rand(s, DType::f64, &g); break;
      case Kind::nonzero: {
        const Tensor r = randn(s, DType::f64, &g);
        t = r + where(ge(r, scalar_like(0.0, r)), full_like(r, 0.1), full_like(r, -0.1));
        break;
      }
      case Kind::index: out.push_back(randint(0, in.hi, s, DType::i64, &g)); continue;
      case Kind::mask: out.push_back(lt(rand(s, DType::f64, &g), scalar_tensor(0.3, DType::f64))); continue;
    }
    out.push_back(t.to(dt));
  }
  return out;
}

RunResult run_row(const Row& row, const std::vector<Tensor>& cpu_inputs, bool transposed, Device dev,
                  std::optional<DType> dtype, uint64_t grad_seed) {
  std::vector<Tensor> xs;
  for (size_t i = 0; i < cpu_inputs.size(); ++i) {
    Tensor x = cpu_inputs[i];
    if (dtype && is_floating(x.dtype())) x = x.to(*dtype);
    x = x.to(dev);
    if (transposed && transposable(row.inputs[i])) x = x.transpose(-1, -2);
    // A transposed view is made a leaf again (detach keeps the strides).
    if (is_floating(x.dtype())) x = x.detach().set_requires_grad(row.inputs[i].grad);
    xs.push_back(x);
  }
  // The projection weights are rounded through the inputs' dtype, so a 16-bit run and its f64
  // reference differentiate the same function.
  DType round_dt = DType::f64;
  for (const Tensor& x : cpu_inputs)
    if (is_floating(x.dtype())) {
      round_dt = x.dtype();
      break;
    }
  const std::vector<Tensor> outs = row.fn(xs);
  Tensor loss;
  Generator g(grad_seed);
  for (const Tensor& o : outs) {
    if (!o.defined() || !is_floating(o.dtype()) || !o.requires_grad()) continue;
    const Tensor w = randn(o.shape(), DType::f64, &g).to(round_dt).to(o.dtype()).to(o.device());
    const Tensor term = sum(cast(o * w, DType::f32));
    loss = loss.defined() ? loss + term : term;
  }
  if (loss.defined()) loss.backward();
  RunResult res;
  for (const Tensor& o : outs) res.outputs.push_back(o.defined() ? o.detach().to(kCPU) : Tensor());
  for (const Tensor& x : xs) res.grads.push_back(x.grad().defined() ? x.grad().to(kCPU) : Tensor());
  return res;
}

TimedStep timed_step(const Row& row, Device dev) {
  TimedStep st;
  const std::vector<Tensor> in = make_inputs(row, DType::f32, false);
  for (size_t i = 0; i < in.size(); ++i) {
    Tensor x = in[i].to(dev);
    if (is_floating(x.dtype())) x = x.detach().set_requires_grad(row.inputs[i].grad);
    st.inputs.push_back(x);
  }
  const Fn fn = row.fn;
  const std::vector<Tensor> xs = st.inputs;
  st.forward = [fn, xs] {
    NoGradGuard ng;
    (void)fn(xs);
  };
  std::vector<size_t> diff;
  std::vector<Tensor> gys;
  {
    const std::vector<Tensor> outs = fn(xs);
    Generator g(99);
    for (size_t i = 0; i < outs.size(); ++i) {
      const Tensor& o = outs[i];
      if (!o.defined() || !is_floating(o.dtype()) || !o.requires_grad()) continue;
      diff.push_back(i);
      gys.push_back(randn(o.shape(), TensorOptions(o.dtype(), dev), &g));
    }
  }
  if (diff.empty()) return st;
  st.forward_backward = [fn, xs, diff, gys] {
    const std::vector<Tensor> outs = fn(xs);
    std::vector<Tensor> roots;
    for (size_t i : diff) roots.push_back(outs[i]);
    autograd::backward(roots, gys);
    for (Tensor x : xs)
      if (x.requires_grad()) x.set_grad(Tensor());
  };
  return st;
}

double worst_error(const Tensor& got, const Tensor& want) {
  if (got.shape() != want.shape()) return INFINITY;
  const std::vector<double> x = got.to_vector(), y = want.to_vector();
  double w = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(x[i]) || std::isnan(y[i])) {
      if (!(std::isnan(x[i]) && std::isnan(y[i]))) return INFINITY;
      continue;
    }
    if (std::isinf(x[i]) || std::isinf(y[i])) {
      if (x[i] != y[i]) return INFINITY;
      continue;
    }
    w = std::max(w, std::abs(x[i] - y[i]) / (1.0 + std::abs(y[i])));
  }
  return w;
}

std::string compare(const Row& row, const RunResult& got, const RunResult& want, double tol, const std::string& what) {
  std::ostringstream err;
  auto one_list = [&](const std::vector<Tensor>& g, const std::vector<Tensor>& w, const char* kind) {
    if (g.size() != w.size()) {
      err << row.name << " (" << what << "): " << g.size() << " " << kind << "s, want " << w.size() << "\n";
      return;
    }
    for (size_t i = 0; i < g.size(); ++i) {
      if (g[i].defined() != w[i].defined()) {
        err << row.name << " (" << what << "): " << kind << " " << i << " is " << (g[i].defined() ? "" : "not ")
            << "defined, the reference's is " << (w[i].defined() ? "" : "not ") << "\n";
        continue;
      }
      if (!g[i].defined()) continue;
      if (g[i].shape() != w[i].shape()) {
        err << row.name << " (" << what << "): " << kind << " " << i << " has shape " << g[i].shape() << ", want "
            << w[i].shape() << "\n";
        continue;
      }
      const double e = worst_error(g[i], w[i]);
      if (!(e <= tol)) err << row.name << " (" << what << "): " << kind << " " << i << ": worst relative error " << e << " > " << tol << "\n";
    }
  };
  one_list(got.outputs, want.outputs, "output");
  one_list(got.grads, want.grads, "gradient");
  return err.str();
}

DeterministicOnCuda::DeterministicOnCuda(const Tensor& x) {
  if (!x.device().is_cuda()) return;
  Context c = guard_.saved();
  c.deterministic = true;
  c.apply();
}

std::vector<std::string> parity(const Row& row, const std::string& who, const Runner& got_run) {
  std::vector<std::string> errors;
  std::vector<DType> dts = {DType::f32};
  if (row.lowp) dts.insert(dts.end(), {DType::f16, DType::bf16});
  bool any = false;
  for (const In& in : row.inputs) any = any || transposable(in);
  for (DType dt : dts)
    for (bool transposed : {false, true}) {
      if (transposed && !any) continue;
      const std::vector<Tensor> in = make_inputs(row, dt, transposed);
      const RunResult want = run_row(row, in, transposed, kCPU);
      const RunResult got = got_run(in, transposed);
      std::ostringstream what;
      what << dt << (transposed ? ", non-contiguous" : "") << ": " << who << " against the CPU";
      for (size_t i = 0; i < want.outputs.size() && i < got.outputs.size(); ++i)
        if (want.outputs[i].defined() && got.outputs[i].defined() && want.outputs[i].dtype() != got.outputs[i].dtype())
          errors.push_back(row.name + " output " + std::to_string(i) + ": dtypes differ (" + what.str() + ")");
      std::string err = compare(row, got, want, dt == DType::f32 ? row.tol32 : row.tol16, what.str());
      if (!err.empty()) errors.push_back(std::move(err));
    }
  return errors;
}

}  // namespace kiln::optable
