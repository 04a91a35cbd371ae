// Checks analytic gradients against central finite differences, in f64. For op authors and tests.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "engine/tensor.h"

namespace kiln {

struct GradcheckOptions {
  double eps = 1e-6;
  double atol = 1e-6;
  double rtol = 1e-4;
  uint64_t seed = 1234;  // for the random projection of the output
  // Elements checked per input: 0 checks all; n > 0 checks about n, evenly spread, first and last
  // included (each check costs two evaluations of fn).
  int64_t max_checks = 0;
  // Which inputs to differentiate (by position); empty: every floating input.
  std::vector<bool> differentiate;
};

// `fn` maps the inputs to one output. Floating inputs are copied to contiguous f64 leaves that
// require grad (fn can take views of them to test strided paths); others pass as they are.
// Compares d(sum(w * fn(x)))/dx for a random signed w (|w| in [0.5, 1.5]) with the numerical
// derivative sum(w * (fn(x + e) - fn(x - e))) / 2 eps, element by element. Within atol + rtol *
// |numerical| is a pass, whatever the outputs' magnitudes. A larger difference still passes within a
// loose rounding allowance for the outputs that moved (16 ulp of each, summed; it grows with their
// magnitudes, not with their number or the size of outputs that did not move), unless that allowance
// is at least half the gradient: then it fails saying the gradient cannot be resolved at this
// magnitude. Beyond the allowance it fails. An output that does not depend on the inputs has a zero
// gradient. Returns "" on success, otherwise a message naming the input (its position in `inputs`),
// the element and both values.
std::string gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& fn,
                      const std::vector<Tensor>& inputs, GradcheckOptions opts = {});

}  // namespace kiln
