#include "io/weights.h"

#include "base/error.h"

namespace kiln::io {

bool dtype_fits(DType stored, DType expected) { return is_floating(stored) == is_floating(expected); }

std::string dtype_problem(const std::string& name, DType stored, DType expected) {
  if (dtype_fits(stored, expected)) return "";
  return detail::str_cat("dtype of ", name, ": stored ", dtype_name(stored), ", model ", dtype_name(expected), " (",
                         is_floating(expected) ? "an integer or bool tensor cannot stand for a floating-point one"
                                               : "a floating-point tensor cannot stand for an integer or bool one",
                         ")");
}

void check_weight_dtypes(const nn::Module& model, const nn::StateDict& given, const std::string& file) {
  const nn::StateDict mine = model.state_dict();
  std::vector<std::string> problems;
  for (const auto& [n, t] : given) {
    auto it = mine.find(n);
    if (it == mine.end() || !t.defined()) continue;
    if (std::string p = dtype_problem(n, t.dtype(), it->second.dtype()); !p.empty()) problems.push_back(p);
  }
  if (problems.empty()) return;
  std::string msg = file + ": stored with the wrong kind of dtype (the file is mislabelled or not for this model):";
  constexpr size_t kShown = 10;
  for (size_t i = 0; i < problems.size() && i < kShown; ++i) msg += "\n  " + problems[i];
  if (problems.size() > kShown) msg += "\n  ... and " + std::to_string(problems.size() - kShown) + " more";
  KILN_FAIL(msg);
}

}  // namespace kiln::io
