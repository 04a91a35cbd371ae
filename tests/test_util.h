// Helpers shared by the test files.
#pragma once
#include <exception>
#include <string>

#include "engine/error.h"

namespace kiln::testing {

// The message of the kiln::Error that f throws, or a marker when it throws something else or nothing.
template <typename F> std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("NOT A kiln::Error: ") + e.what();
  }
  return "NO ERROR";
}

inline bool contains(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

}  // namespace kiln::testing
