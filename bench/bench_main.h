// What every benchmark program starts with: the environment `kiln` honours (KILN_NUM_THREADS, ...),
// then its flags through CLI11 with the shared ones (--json FILE, --threads N, --quick) declared once.
#pragma once
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "base/thread_pool.h"
#include "tools/environment.h"
#include "tools/machine.h"

namespace kiln::bench {

struct CommonFlags {
  std::string json;  // where the JSON rows go ("": none)
  int threads = 0;   // 0: KILN_NUM_THREADS or the CPUs available (available_cpus)
  bool quick = false;
};

// Adds --json always, --threads and --quick where the benchmark has them.
inline void add_common_flags(CLI::App& app, CommonFlags& f, bool threads = true, bool quick = true) {
  app.add_option("--json", f.json, "Write the results as JSON to this file");
  if (threads)
    app.add_option("--threads", f.threads, "CPU threads (0: KILN_NUM_THREADS or the CPUs available)")
        ->check(CLI::NonNegativeNumber);
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

using tools::cpu_line;
using tools::cpu_model;

// Median milliseconds of fn over reps runs, after one warm-up call. `settle` runs after each call and
// is timed with it: a GPU benchmark passes a synchronize, so each run goes from idle to idle.
inline double median_ms(const std::function<void()>& fn, int reps, const std::function<void()>& settle = {}) {
  const auto run = [&] {
    fn();
    if (settle) settle();
  };
  run();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto a = std::chrono::steady_clock::now();
    run();
    t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace kiln::bench
