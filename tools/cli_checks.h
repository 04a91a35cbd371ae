// Checks that several commands make on their flags before any work, with one wording each.
#pragma once
#include <string>
#include <vector>

namespace kiln::tools {

// "--out X is the input X itself: writing it would replace the file being read; write to another
// path" when `out` (an output flag's value) names the same file as one of `inputs`, compared with
// std::filesystem::equivalent (so another path to the same file, or a link to it, counts); "" when
// it does not or `out` does not exist yet. Every command that reads one file and writes another asks
// this before reading anything.
std::string output_is_input(const std::string& out_flag, const std::string& out,
                            const std::vector<std::string>& inputs);

}  // namespace kiln::tools
