// Out-of-line thrower, so every KILN_CHECK site stays one compare and one cold call.
#include "base/error.h"

namespace kiln::detail {

std::string mib(size_t bytes) {
  char buf[48];
  if (bytes >= (size_t(1) << 20) / 10)
    std::snprintf(buf, sizeof buf, "%.1f MiB", double(bytes) / double(1 << 20));
  else if (bytes >= 1024)
    std::snprintf(buf, sizeof buf, "%.1f KiB", double(bytes) / 1024.0);
  else
    std::snprintf(buf, sizeof buf, "%zu B", bytes);
  return buf;
}

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

thread_local const char* t_op = nullptr;  // the outermost OpScope's op

// msg, after "op: " unless it already begins with the op's name.
std::string in_scope(const std::string& msg) {
  if (!t_op) return msg;
  const std::string op(t_op);
  if (msg.compare(0, op.size(), op) == 0 && (msg.size() == op.size() || msg[op.size()] == ':' || msg[op.size()] == ' '))
    return msg;
  return op + ": " + msg;
}
}  // namespace

void throw_error(const std::string& msg, const char* file, int line) {
  throw Error(in_scope(msg), repo_path(file).c_str(), line);
}

void throw_out_of_memory(const std::string& msg, const char* file, int line) {
  throw OutOfMemory(in_scope(msg), repo_path(file).c_str(), line);
}

}  // namespace kiln::detail

namespace kiln {
OpScope::OpScope(const char* op) : outermost_(detail::t_op == nullptr && op != nullptr) {
  if (outermost_) detail::t_op = op;
}
const char* OpScope::current() { return detail::t_op; }
OpScope::~OpScope() {
  if (outermost_) detail::t_op = nullptr;
}
}  // namespace kiln
