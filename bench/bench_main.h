// What every benchmark program starts with: the environment `kiln` honours (KILN_NUM_THREADS, ...),
// then its flags through CLI11 with the shared ones (--json FILE, --threads N, --quick) declared once.
#pragma once
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/thread_pool.h"
#include "tools/cli_checks.h"
#include "tools/environment.h"
#include "tools/machine.h"

namespace kiln::bench {

struct CommonFlags {
  std::string json;  // where the JSON rows go ("": none)
  int threads = 0;   // 0: KILN_NUM_THREADS or the CPUs available (available_cpus)
  bool quick = false;
};

// A whole number in [lo, hi] for an integer flag, with one plain message ("want a whole number >= 0,
// got '-1'") where CLI11's NonNegativeNumber prints the range up to the largest double, 309 digits.
inline CLI::Validator whole_number(long long lo, long long hi = std::numeric_limits<int>::max()) {
  return CLI::Validator(
      [lo, hi](std::string& s) -> std::string {
        size_t used = 0;
        long long v = 0;
        try {
          v = std::stoll(s, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used == 0 || used != s.size()) return "want a whole number >= " + std::to_string(lo) + ", got '" + s + "'";
        if (v > hi) return "want a whole number <= " + std::to_string(hi) + ", got " + s;
        if (v < lo) return "want a whole number >= " + std::to_string(lo) + ", got " + s;
        return "";
      },
      "INT>=" + std::to_string(lo));
}

// Adds --json always, --threads and --quick where the benchmark has them.
inline void add_common_flags(CLI::App& app, CommonFlags& f, bool threads = true, bool quick = true) {
  app.add_option("--json", f.json, "Write the results as JSON to this file");
  if (threads)
    app.add_option("--threads", f.threads, "CPU threads (0: KILN_NUM_THREADS or the CPUs available)")
        ->check(whole_number(0));
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

// --json checked before any work, as `kiln bench` does (tools::output_file_problem): a directory
// that is missing or not writable, or a path that is a directory. Prints "<prog>: error: ..." and
// returns false when the path cannot be written; true for "" (no JSON asked for) or a good path.
inline bool json_path_ok(const std::string& prog, const std::string& path) {
  if (path.empty()) return true;
  const std::string why = tools::output_file_problem("--json", path, "JSON file to write");
  if (why.empty()) return true;
  std::fprintf(stderr, "%s: error: %s\n", prog.c_str(), why.c_str());
  return false;
}

// Writes `doc` to `path` and says so ("wrote PATH"); on a failed open or write prints
// "<prog>: error: cannot write PATH" and returns false (the caller exits 1). Nothing for "".
inline bool write_json(const std::string& prog, const std::string& path, const nlohmann::json& doc) {
  if (path.empty()) return true;
  std::ofstream out(path);
  if (out) {
    out << doc.dump(2) << "\n";
    out.close();
  }
  if (!out) {
    std::fprintf(stderr, "%s: error: cannot write %s\n", prog.c_str(), path.c_str());
    return false;
  }
  std::printf("\nwrote %s\n", path.c_str());
  return true;
}

using tools::cpu_line;
using tools::cpu_model;

// The median of `t` (reordered): the middle value, or the mean of the two middle ones for an even
// count. NaN when empty.
inline double median(std::vector<double> t) {
  if (t.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(t.begin(), t.end());
  const size_t h = t.size() / 2;
  return t.size() % 2 == 1 ? t[h] : (t[h - 1] + t[h]) / 2.0;
}

// Median milliseconds of fn over reps runs, after one warm-up call. `settle` runs after each call and
// is timed with it: a GPU benchmark passes a synchronize, so each run goes from idle to idle.
// `prepare` (optional) runs before each call, untimed: the forward pass of a backward-only timing.
inline double median_ms(const std::function<void()>& fn, int reps, const std::function<void()>& settle = {},
                        const std::function<void()>& prepare = {}) {
  const auto run = [&] {
    fn();
    if (settle) settle();
  };
  if (prepare) prepare();
  run();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    if (prepare) prepare();
    if (prepare && settle) settle();
    const auto a = std::chrono::steady_clock::now();
    run();
    t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a).count());
  }
  return median(std::move(t));
}

}  // namespace kiln::bench
