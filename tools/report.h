// `kiln report RUN_DIR|BENCH.json... --out FILE.html`: one self-contained HTML page (inline SVG,
// nothing fetched) with a run's curves, several runs overlaid: loss and evaluation, accuracy,
// learning rate, loss scale, throughput, the per-phase times and each rank's waiting, GPU memory,
// the final metrics and the resolved config; and benchmark JSON: GEMM GFLOP/s or TFLOP/s against
// size beside the peer library, all-reduce bus bandwidth against message size, scaling throughput
// and efficiency against the ideal, training-step times, `kiln bench memory`'s peaks and times.
// `kiln train` refreshes OUT/report.html at
// each evaluation.
#pragma once
#include <CLI/CLI.hpp>

#include <string>
#include <utility>
#include <vector>

namespace kiln::tools {

struct ReportOptions {
  std::vector<std::string> runs;
  std::string out;
  std::string title;
};
void add_report_flags(CLI::App& app, ReportOptions& o);
int run_report(const ReportOptions& o);

// The page for `run_dirs` (a path ending in .json is a benchmark's output). What could not be read (a missing file, a
// line cut by a kill, an empty run) is added to `notes`, named by file and line, and shown at the top of the page;
// whatever is readable is still drawn.
std::string render_report(const std::vector<std::string>& run_dirs, const std::string& title,
                          std::vector<std::string>& notes);

// One chart as inline SVG: each series a <path> (or markers) carrying data-series and data-points.
struct ChartSeries {
  std::string name;
  std::vector<std::pair<double, double>> points;
  bool markers = false;  // points rather than a line (evaluations)
  bool dashed = false;   // a reference: a peer library, the ideal
};
struct Chart {
  std::string title, x_label, y_label;
  bool log_y = false;
  std::vector<ChartSeries> series;
  bool log_x = false;  // sizes over decades
};
std::string render_chart(const Chart& c);
// Horizontal bars, one per (label, value), with the value printed: training-step times and the like.
std::string render_bars(const std::string& title, const std::string& unit,
                        const std::vector<std::pair<std::string, double>>& bars);

}  // namespace kiln::tools
