// gradcheck: analytic gradients of sum(w * f(x)) against central differences, element by element.
#include "engine/gradcheck.h"

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
  const Tensor w = uniform(out.shape(), 0.5, 1.5, TensorOptions(DType::f64), &gen);
  auto objective = [&](const Tensor& y) { return sum(y.to(DType::f64) * w).item<double>(); };

  std::vector<Tensor> leaves;
  for (size_t i : diff) leaves.push_back(xs[i]);
  if (!out.requires_grad()) return "gradcheck: output does not depend on any floating input";
  std::vector<Tensor> analytic = autograd::grad({sum(out.to(DType::f64) * w)}, leaves);

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
      const double fp = objective(fn(xs));
      p[e] = orig - opts.eps;
      x.bump_version();
      const double fm = objective(fn(xs));
      p[e] = orig;
      x.bump_version();
      const double num = (fp - fm) / (2 * opts.eps);
      const double ana = ga[size_t(e)];
      // The difference quotient's own rounding: each objective carries about |f| * 2^-52 of error
      // (more for long sums), divided by 2 eps. Without this a large objective (thousands of
      // outputs) fails on noise that says nothing about the gradient.
      const double noise = 16.0 * 0x1p-52 * (std::abs(fp) + std::abs(fm)) / (2 * opts.eps);
      if (!(std::abs(num - ana) <= opts.atol + opts.rtol * std::abs(num) + noise)) {
        std::ostringstream os;
        os << "gradcheck: input " << diff[li] << " " << inputs[diff[li]].shape() << " element " << e
           << ": analytic " << ana << " vs numerical " << num;
        return os.str();
      }
    }
  }
  return "";
}

}  // namespace kiln
