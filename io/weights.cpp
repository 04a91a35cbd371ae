#include "io/weights.h"

#include <sstream>

#include "base/error.h"

namespace kiln::io {

namespace {
constexpr size_t kShown = 10;

std::string shape_text(const Shape& s) {
  std::ostringstream o;
  o << s;
  return o.str();
}

// "a [16], b [16], ... and 29 more"
std::string cut_list(const std::vector<std::string>& names) {
  std::string s;
  for (size_t i = 0; i < names.size() && i < kShown; ++i) s += (i ? ", " : "") + names[i];
  if (names.size() > kShown) s += ", ... and " + std::to_string(names.size() - kShown) + " more";
  return s;
}

// "missing (39): a [16], b [16], ... and 29 more"
std::string name_list(const char* what, const std::vector<std::string>& names, const std::string& hint) {
  return std::string(what) + " (" + std::to_string(names.size()) + hint + "): " + cut_list(names);
}
}  // namespace

std::string names_with_shapes(const nn::StateDict& tensors) {
  std::vector<std::string> names;
  for (const auto& [n, t] : tensors) names.push_back(n + " " + shape_text(t.shape()));
  return cut_list(names);
}

bool dtype_fits(DType stored, DType expected) { return is_floating(stored) == is_floating(expected); }

std::string dtype_problem(const std::string& name, DType stored, DType expected) {
  if (dtype_fits(stored, expected)) return "";
  return detail::str_cat("dtype of ", name, ": stored ", dtype_name(stored), ", model ", dtype_name(expected), " (",
                         is_floating(expected) ? "an integer or bool tensor cannot stand for a floating-point one"
                                               : "a floating-point tensor cannot stand for an integer or bool one",
                         ")");
}

std::vector<std::string> weights_mismatch(const nn::StateDict& mine, const std::map<std::string, StoredTensor>& stored,
                                          bool allow_missing, const std::string& where,
                                          const std::string& missing_hint) {
  std::vector<std::string> missing, unexpected, differences;
  for (const auto& [n, t] : mine)
    if (!stored.count(n)) missing.push_back(n + " " + shape_text(t.shape()));
  for (const auto& [n, s] : stored) {
    auto it = mine.find(n);
    if (it == mine.end()) {
      unexpected.push_back(n + " " + dtype_name(s.dtype) + " " + shape_text(s.shape));
    } else if (it->second.shape() != s.shape) {
      differences.push_back("shape of " + n + ": " + where + " " + shape_text(s.shape) + ", model " +
                            shape_text(it->second.shape()));
    } else if (std::string p = dtype_problem(n, s.dtype, it->second.dtype()); !p.empty()) {
      differences.push_back(p);
    }
  }
  std::vector<std::string> lines;
  if (!missing.empty() && !allow_missing) lines.push_back(name_list("missing", missing, missing_hint));
  if (!unexpected.empty()) lines.push_back(name_list("unexpected", unexpected, ""));
  for (size_t i = 0; i < differences.size() && i < kShown; ++i) lines.push_back(differences[i]);
  if (differences.size() > kShown)
    lines.push_back("... and " + std::to_string(differences.size() - kShown) + " more shape or dtype differences");
  return lines;
}

void check_weights(const nn::Module& model, const nn::StateDict& given, const std::string& file, bool allow_missing,
                   const std::string& missing_hint) {
  std::map<std::string, StoredTensor> stored;
  for (const auto& [n, t] : given)
    if (t.defined()) stored[n] = {t.shape(), t.dtype()};
  const auto lines = weights_mismatch(model.state_dict(), stored, allow_missing, "file", missing_hint);
  if (lines.empty()) return;
  std::string msg = file + " does not match the model:";
  for (const auto& l : lines) msg += "\n  " + l;
  KILN_FAIL(msg);
}

}  // namespace kiln::io
