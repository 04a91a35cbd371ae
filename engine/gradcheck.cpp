// gradcheck: analytic gradients of sum(w * f(x)) against central differences, element by element.
#include "engine/gradcheck.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "engine/autograd.h"
#include "engine/ops.h"

namespace kiln {

std::string gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& fn, const std::vector<Tensor>& inputs,
                      GradcheckOptions opts) {
  // Options that cannot mean what the caller meant are errors, not a pass: with no inputs nothing
  // is checked, and a mask of another length than the inputs says nothing sure about the rest.
  KILN_CHECK(!inputs.empty(), "gradcheck: no inputs; give fn at least one floating tensor to differentiate");
  KILN_CHECK(opts.differentiate.empty() || opts.differentiate.size() == inputs.size(), "gradcheck: differentiate has ",
             opts.differentiate.size(), " entries for ", inputs.size(),
             " inputs; give one per input (or none for all)");
  std::vector<Tensor> xs;
  std::vector<size_t> diff;  // indices of the inputs we differentiate
  for (size_t i = 0; i < inputs.size(); ++i) {
    const bool wanted = opts.differentiate.empty() || opts.differentiate[i];
    if (inputs[i].defined() && is_floating(inputs[i].dtype()) && wanted) {
      Tensor x = inputs[i].detach().to(DType::f64).clone().contiguous();
      x.set_requires_grad(true);
      xs.push_back(x);
      diff.push_back(i);
    } else {
      xs.push_back(inputs[i]);
    }
  }
  // Nothing differentiated checks nothing: not a pass (as PyTorch's gradcheck refuses it).
  KILN_CHECK(!diff.empty(), "gradcheck: none of the ", inputs.size(),
             " inputs is differentiated (one is when it is a defined floating tensor",
             opts.differentiate.empty() ? "" : " marked true in differentiate", ")");
  Tensor out = fn(xs);
  KILN_CHECK(out.defined() && is_floating(out.dtype()), "gradcheck: fn must return a floating tensor");
  Generator gen(opts.seed);
  // Signed weights, |w| in [0.5, 1.5]: with weights of one sign a backward that loses the sign of
  // its incoming gradient (g.abs(), g * g.sign()) would agree with the numerical derivative.
  const TensorOptions f64(DType::f64);
  const Tensor sign = bernoulli(out.shape(), 0.5, f64, &gen) * 2.0 - 1.0;
  const Tensor w = sign * uniform(out.shape(), 0.5, 1.5, f64, &gen);
  const std::vector<double> wv = w.to_vector();
  auto values = [&](const Tensor& y) {
    std::vector<double> v = y.detach().to(DType::f64).contiguous().to_vector();
    KILN_CHECK(v.size() == wv.size(), "gradcheck: fn returned ", v.size(), " elements for perturbed inputs but ",
               wv.size(), " for the original ones");
    return v;
  };

  std::vector<Tensor> leaves;
  for (size_t i : diff) leaves.push_back(xs[i]);
  // An output that does not depend on the inputs has a zero gradient; the numerical one must be zero
  // too (as PyTorch's gradcheck compares them).
  std::vector<Tensor> analytic;
  if (out.requires_grad()) {
    analytic = autograd::grad({sum(out.to(DType::f64) * w)}, leaves, {}, false, /*materialize=*/true);
  } else {
    for (const Tensor& x : leaves) analytic.push_back(zeros_like(x));
  }

  NoGradGuard ng;
  for (size_t li = 0; li < leaves.size(); ++li) {
    Tensor x = leaves[li];
    double* p = x.data<double>();
    const std::vector<double> ga = analytic[li].to_vector();
    const int64_t n = x.numel();
    const int64_t step = opts.max_checks > 0 && n > opts.max_checks ? (n + opts.max_checks - 1) / opts.max_checks : 1;
    for (int64_t e = 0; e < n; e = (e + step < n || e == n - 1) ? e + step : n - 1) {
      const double orig = p[e];
      p[e] = orig + opts.eps;
      x.bump_version();
      const std::vector<double> yp = values(fn(xs));
      p[e] = orig - opts.eps;
      x.bump_version();
      const std::vector<double> ym = values(fn(xs));
      p[e] = orig;
      x.bump_version();
      // The numerical derivative from the outputs' own differences, sum(w * (f(x+e) - f(x-e))) / 2 eps,
      // not from the difference of two sums: an output that does not move adds exactly nothing, so a
      // large output elsewhere does not drown the derivative.
      double diff_sum = 0, round_sum = 0;
      for (size_t i = 0; i < yp.size(); ++i) {
        if (yp[i] == ym[i]) continue;
        diff_sum += wv[i] * (yp[i] - ym[i]);
        round_sum += std::abs(wv[i]) * (std::abs(yp[i]) + std::abs(ym[i]));
      }
      const double num = diff_sum / (2 * opts.eps);
      const double ana = ga[size_t(e)];
      const double err = std::abs(num - ana);
      // Within atol + rtol * |numerical|: a pass, however large the outputs.
      const double tol = opts.atol + opts.rtol * std::abs(num);
      if (err <= tol) continue;
      // Beyond it, a rounding allowance may still pass it: each moved output carries about |f_i| *
      // 2^-52 of rounding (more after long sums inside fn), divided by 2 eps. The allowance is a
      // deliberately loose bound (16 ulp of every moved output, summed linearly, where the actual
      // rounding adds up about as a root-sum-square of one ulp each), so it only ever loosens the
      // tolerance: a difference within atol and rtol never fails because of it.
      const double noise = 16.0 * 0x1p-52 * round_sum / (2 * opts.eps);
      std::ostringstream where;
      where << "gradcheck: input " << diff[li] << " " << inputs[diff[li]].shape() << " element " << e;
      if (!(err <= tol + noise)) {
        std::ostringstream os;
        os << where.str() << ": analytic " << ana << " vs numerical " << num;
        return os.str();
      }
      // A difference beyond atol and rtol that only the allowance covers, where the allowance is as
      // large as the gradient itself, proves nothing: a backward off by its own size would pass too.
      // Say so rather than pass.
      if (noise >= 0.5 * std::max(std::abs(ana), std::abs(num))) {
        std::ostringstream os;
        os << where.str() << ": analytic " << ana << " vs numerical " << num << " differ by " << err
           << ", more than atol + rtol * |numerical| = " << tol
           << ", and cannot be resolved at this magnitude: the outputs it moves sum to about " << 0.5 * round_sum
           << " in size, so their rounding (up to about " << noise
           << " in the derivative) is as large as the gradient; scale the outputs down or raise eps";
        return os.str();
      }
    }
  }
  return "";
}

}  // namespace kiln
