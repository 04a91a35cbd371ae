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
// derivative sum(w * (fn(x + e) - fn(x - e))) / 2 eps, element by element, within atol +
// rtol * |numerical| + the rounding of the outputs that moved (which grows with their magnitudes,
// not with their number or sum). An output that does not depend on the inputs has a zero gradient.
// Returns "" on success, otherwise a message naming the input, the element and both values; also a
// failure when that rounding is as large as the gradient (nothing could be told apart there).
std::string gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& fn,
                      const std::vector<Tensor>& inputs, GradcheckOptions opts = {});

}  // namespace kiln
