// What a CPU figure ran on, for the benchmarks and `kiln bench`: the CPU's model and the kernel set
// in use. Header-only for the separate benchmark programs.
#pragma once
#include <fstream>
#include <string>

#include "base/cpu_isa.h"

namespace kiln::tools {

// The CPU's model name (/proc/cpuinfo), or "unknown CPU".
inline std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon != std::string::npos && colon + 2 <= line.size()) return line.substr(colon + 2);
  }
  return "unknown CPU";
}

// "AMD EPYC ..., CPU kernels avx2 (this CPU supports avx512)".
inline std::string cpu_line() {
  std::string s = cpu_model() + ", CPU kernels " + cpu_isa_name(cpu_isa());
  if (cpu_isa() != cpu_isa_supported())
    s += std::string(" (this CPU supports ") + cpu_isa_name(cpu_isa_supported()) + ")";
  return s;
}

}  // namespace kiln::tools
