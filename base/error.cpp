// Out-of-line thrower, so every KILN_CHECK site stays one compare and one cold call.
#include "base/error.h"

namespace kiln::detail {

void throw_error(const std::string& msg, const char* file, int line) {
  // Report the path from the repository root, not the build machine's absolute path.
  std::string f(file);
  for (const char* root : {"/engine/", "/kernels/", "/io/", "/models/", "/tools/", "/tests/", "/bench/"}) {
    auto pos = f.rfind(root);
    if (pos != std::string::npos) {
      f = f.substr(pos + 1);
      break;
    }
  }
  throw Error(msg, f.c_str(), line);
}

}  // namespace kiln::detail
