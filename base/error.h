// Errors that say what and where: kiln::Error carries file:line and a message built from values.
// KILN_CHECK is for user errors (bad shapes, bad files); KILN_ASSERT for broken internal invariants.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace kiln {

class Error : public std::runtime_error {
 public:
  Error(const std::string& what, const char* file, int line)
      : std::runtime_error(what + " (" + file + ":" + std::to_string(line) + ")"), msg_(what) {}
  // The message without the source location.
  const std::string& message() const { return msg_; }

 private:
  std::string msg_;
};

// What a computation stops with when the host program interrupts it between kernels
// (engine/context.h, set_interrupt_poll).
class Interrupted : public Error {
 public:
  using Error::Error;
};

// An allocation that did not fit: the device's memory (or a cap set for testing, like
// set_cpu_memory_cap) is full. A caller that can make a step smaller (`kiln train --micro-batch
// auto`) catches this one; nothing else about the computation is wrong.
class OutOfMemory : public Error {
 public:
  using Error::Error;
};

// While one lives on this thread, errors raised inside name this op first ("nll_loss: gather: index 9 is out of
// range"): a composite op's user sees the op they called, not only the inner op that failed. The outermost
// scope names the error; nested ones add nothing.
class OpScope {
 public:
  explicit OpScope(const char* op);  // null: no scope
  ~OpScope();
  static const char* current();  // the outermost scope's op on this thread, or null
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

 private:
  bool outermost_;
};

namespace detail {
template <typename... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
// A byte count for messages and tables: "12.5 MiB"; under a tenth of a MiB in KiB ("40.0 KiB") or
// bytes ("300 B"), so a small amount never reads "0.0 MiB".
std::string mib(size_t bytes);
[[noreturn]] void throw_error(const std::string& msg, const char* file, int line);
[[noreturn]] void throw_out_of_memory(const std::string& msg, const char* file, int line);
}  // namespace detail

}  // namespace kiln

#define KILN_CHECK(cond, ...)                                                                   \
  do {                                                                                          \
    if (!(cond)) [[unlikely]]                                                                   \
      ::kiln::detail::throw_error(::kiln::detail::str_cat(__VA_ARGS__), __FILE__, __LINE__);    \
  } while (0)

#define KILN_ASSERT(cond, ...)                                                                  \
  do {                                                                                          \
    if (!(cond)) [[unlikely]]                                                                   \
      ::kiln::detail::throw_error(                                                              \
          ::kiln::detail::str_cat("internal error: assertion `" #cond "` failed. ", ##__VA_ARGS__), \
          __FILE__, __LINE__);                                                                  \
  } while (0)

#define KILN_FAIL(...) ::kiln::detail::throw_error(::kiln::detail::str_cat(__VA_ARGS__), __FILE__, __LINE__)
#define KILN_FAIL_OOM(...) ::kiln::detail::throw_out_of_memory(::kiln::detail::str_cat(__VA_ARGS__), __FILE__, __LINE__)
