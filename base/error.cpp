// Out-of-line thrower, so every KILN_CHECK site stays one compare and one cold call.
#include "base/error.h"

namespace kiln::detail {

namespace {
// The path from the repository root, not the build machine's absolute path.
std::string repo_path(const char* file) {
  std::string f(file);
  for (const char* root : {"/base/", "/engine/", "/kernels/", "/io/", "/models/", "/tools/", "/tests/", "/bench/"}) {
    auto pos = f.rfind(root);
    if (pos != std::string::npos) return f.substr(pos + 1);
  }
  return f;
}
}  // namespace

void throw_error(const std::string& msg, const char* file, int line) {
  throw Error(msg, repo_path(file).c_str(), line);
}

void throw_out_of_memory(const std::string& msg, const char* file, int line) {
  throw OutOfMemory(msg, repo_path(file).c_str(), line);
}

}  // namespace kiln::detail
