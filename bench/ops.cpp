// The op table's timing mode: every row of tests/op_table.cpp (or those matching --rows), forward
// alone and forward + backward, median milliseconds in f32 on the CPU and, where a GPU is visible,
// on cuda:0 with the CPU/CUDA ratios of each. fwd+bwd times the op itself (optable::timed_step: backward from
// an upstream gradient made on the device once, no loss, no copies); "-" for a row without gradients.
// Prints a table and writes JSON (--json FILE).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/bench_main.h"
#include "bench/ops_row.h"
#include "engine/autograd.h"
#include "kernels/cuda/cuda_backend.h"
#include "tests/op_table.h"
#include "tools/machine.h"

using namespace kiln;
using namespace kiln::optable;

namespace {

// Median milliseconds of `reps` calls after one warm-up call.
template <typename F> double median_ms(int reps, Device dev, F&& f) {
  f();
  if (dev.is_cuda()) cuda::synchronize(dev.index);
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    if (dev.is_cuda()) cuda::synchronize(dev.index);
    t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return bench::median(std::move(t));
}

using Timing = bench::OpTiming;

// The op itself, as a training step runs it (optable::timed_step): forward, backward from upstream
// gradients made on the device once, the inputs' gradients cleared; nothing copied in the timed
// region. run_row, the tests' harness, builds a loss and copies to the CPU: not what is timed here.
Timing time_row(const Row& r, Device dev, int reps) {
  const TimedStep st = timed_step(r, dev);
  Timing t;
  t.fwd = median_ms(reps, dev, st.forward);
  if (!st.forward_backward) return t;
  t.backward = true;
  t.both = median_ms(reps, dev, st.forward_backward);
  return t;
}

// "%14.3f" of a measured time, "-" for none.
std::string cell(bool measured, double ms, int width) {
  char b[32];
  if (measured)
    std::snprintf(b, sizeof b, "%*.3f", width, ms);
  else
    std::snprintf(b, sizeof b, "%*s", width, "-");
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("Per-op timings over the op table", "bench_ops");
  bench::CommonFlags flags;
  bench::add_common_flags(app, flags);
  std::string pattern = ".*";
  app.add_option("--rows", pattern, "Only rows whose name matches this regular expression");
  if (const int rc = bench::start(app, flags, argc, argv); rc >= 0) return rc;
  if (!bench::json_path_ok("bench_ops", flags.json)) return 2;

  std::regex re;
  try {
    re = std::regex(pattern);
  } catch (const std::regex_error& e) {
    std::fprintf(stderr, "bench_ops: --rows '%s' is not a regular expression: %s\n", pattern.c_str(), e.what());
    return 2;
  }
  const int reps = flags.quick ? 3 : 15;
  const bool gpu = cuda::device_count() > 0;
  std::printf("op table timings, f32, median of %d (CPU: %s, %d thread%s; %s)\n", reps, tools::cpu_line().c_str(),
              num_threads(), num_threads() == 1 ? "" : "s", gpu ? "CUDA device 0" : "no GPU visible: CPU columns only");
  std::printf("%-26s %12s %14s", "row", "cpu fwd ms", "cpu fwd+bwd ms");
  if (gpu) std::printf(" %12s %14s %12s %16s", "cuda fwd ms", "cuda fwd+bwd", "cpu/cuda fwd", "cpu/cuda fwd+bwd");
  std::printf("\n");
  nlohmann::json rows_json = nlohmann::json::array();
  int n = 0;
  for (const Row& r : rows()) {
    if (!std::regex_search(r.name, re)) continue;
    ++n;
    const Timing c = time_row(r, kCPU, reps);
    // A row without gradients has no fwd+bwd time (nor ratio): null in the JSON, "-" in the table.
    std::printf("%-26s %12.3f %s", r.name.c_str(), c.fwd, cell(c.backward, c.both, 14).c_str());
    if (gpu) {
      const Timing g = time_row(r, cuda_device(0), reps);
      std::printf(" %12.3f %s %s %s", g.fwd, cell(g.backward, g.both, 14).c_str(),
                  cell(true, c.fwd / g.fwd, 12).c_str(), cell(c.backward && g.backward, c.both / g.both, 16).c_str());
      rows_json.push_back(bench::ops_row_json(r.name, c, &g));
    } else {
      rows_json.push_back(bench::ops_row_json(r.name, c, nullptr));
    }
    std::printf("\n");
  }
  if (n == 0) {
    std::fprintf(stderr, "bench_ops: no row matches --rows '%s'\n", pattern.c_str());
    return 2;
  }
  const nlohmann::json doc = {{"benchmark", "ops"},
                              {"cpu", tools::cpu_model()},
                              {"cpu_kernels", cpu_isa_name(cpu_isa())},
                              {"threads", num_threads()},
                              {"rows", rows_json}};
  return bench::write_json("bench_ops", flags.json, doc) ? 0 : 1;
}
