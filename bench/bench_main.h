// What every benchmark program starts with: the environment `kiln` honours (KILN_NUM_THREADS, ...),
// then its flags through CLI11 with the shared ones (--json FILE, --threads N, --quick) declared once.
#pragma once
#include <CLI/CLI.hpp>

#include <fstream>
#include <string>

#include "base/cpu_isa.h"
#include "base/thread_pool.h"
#include "tools/environment.h"

namespace kiln::bench {

struct CommonFlags {
  std::string json;  // where the JSON rows go ("": none)
  int threads = 0;   // 0: KILN_NUM_THREADS or all hardware threads
  bool quick = false;
};

// Adds --json always, --threads and --quick where the benchmark has them.
inline void add_common_flags(CLI::App& app, CommonFlags& f, bool threads = true, bool quick = true) {
  app.add_option("--json", f.json, "Write the results as JSON to this file");
  if (threads) app.add_option("--threads", f.threads, "CPU threads (0: KILN_NUM_THREADS or all)")->check(CLI::NonNegativeNumber);
  if (quick) app.add_flag("--quick", f.quick, "Fewer repetitions and shapes (a smoke run)");
}

// Applies the environment, parses the flags and the thread count. Returns -1 to go on, else the
// exit code (0 for --help, 2 for a bad flag, with CLI11's one-line message).
inline int start(CLI::App& app, CommonFlags& f, int argc, char** argv) {
  try {
    tools::apply_environment();
    app.parse(argc, argv);
    if (f.threads > 0) set_num_threads(f.threads);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  } catch (const Error& e) {
    std::fprintf(stderr, "%s: %s\n", app.get_name().c_str(), e.message().c_str());
    return 2;
  }
  return -1;
}

// The CPU's model name (/proc/cpuinfo), or "unknown CPU": every CPU figure names the machine.
inline std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon != std::string::npos && colon + 2 <= line.size()) return line.substr(colon + 2);
  }
  return "unknown CPU";
}
// "AMD EPYC ..., CPU kernels avx2 (this CPU supports avx512)": what a CPU benchmark ran on.
inline std::string cpu_line() {
  std::string s = cpu_model() + ", CPU kernels " + cpu_isa_name(cpu_isa());
  if (cpu_isa() != cpu_isa_supported())
    s += std::string(" (this CPU supports ") + cpu_isa_name(cpu_isa_supported()) + ")";
  return s;
}

}  // namespace kiln::bench
