#include "tools/cli_checks.h"

#include <filesystem>

namespace kiln::tools {

std::string output_is_input(const std::string& out_flag, const std::string& out,
                            const std::vector<std::string>& inputs) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (out.empty() || !fs::exists(out, ec)) return "";
  for (const auto& in : inputs) {
    if (in.empty() || !fs::equivalent(in, out, ec)) continue;
    return out_flag + " " + out + " is the input " + (in == out ? std::string("itself") : in + " itself") +
           ": writing it would replace the file being read; write to another path";
  }
  return "";
}

}  // namespace kiln::tools
