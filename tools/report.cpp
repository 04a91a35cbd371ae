// kiln report: runs' metrics as one HTML page of SVG charts (tools/report.h).
#include "tools/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "base/error.h"
#include "io/atomic_file.h"
#include "io/json_text.h"
#include "tools/cli_checks.h"

namespace kiln::tools {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"};

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      default: o += c;
    }
  }
  return o;
}

std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.4g", v);
  return b;
}
std::string px(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", v);
  return b;
}

// About five round ticks (1, 2 or 5 times a power of ten) covering [lo, hi].
std::vector<double> linear_ticks(double lo, double hi) {
  const double raw = (hi - lo) / 5.0;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (raw <= m * mag) {
      step = m * mag;
      break;
    }
  std::vector<double> t;
  for (double v = std::ceil(lo / step) * step; v <= hi + step * 1e-9; v += step)
    t.push_back(std::abs(v) < step * 1e-9 ? 0 : v);
  return t;
}

std::vector<double> log_ticks(double lo, double hi) {
  std::vector<double> t;
  const int a = int(std::floor(std::log10(lo))), b = int(std::ceil(std::log10(hi)));
  const bool fine = b - a <= 2;
  for (int k = a; k <= b; ++k)
    for (double m : fine ? std::vector<double>{1, 2, 5} : std::vector<double>{1}) {
      const double v = m * std::pow(10.0, k);
      if (v >= lo * (1 - 1e-9) && v <= hi * (1 + 1e-9)) t.push_back(v);
    }
  return t;
}

}  // namespace

// Whether a point can be drawn on c's axes (finite, and positive on a log axis).
static bool plottable(const Chart& c, double x, double y) {
  return std::isfinite(x) && std::isfinite(y) && !(c.log_y && y <= 0) && !(c.log_x && x <= 0);
}

std::string render_chart(const Chart& c) {
  const double W = 740, H = 300, L = 70, R = 190, T = 30, B = 46;  // the legend in the right margin
  const double pw = W - L - R, ph = H - T - B;
  double x0 = 1e300, x1 = -1e300, y0 = 1e300, y1 = -1e300;
  for (const auto& s : c.series)
    for (auto [x, y] : s.points) {
      if (!plottable(c, x, y)) continue;
      x0 = std::min(x0, x), x1 = std::max(x1, x), y0 = std::min(y0, y), y1 = std::max(y1, y);
    }
  std::ostringstream o;
  o << "<figure class=\"chart\"><svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 " << W << " " << H
    << "\" width=\"" << W << "\" height=\"" << H
    << "\" font-family=\"sans-serif\" font-size=\"11\" role=\"img\" aria-label=\"" << esc(c.title) << "\">"
    << "<text x=\"" << W / 2
    << "\" y=\"18\" class=\"title\" font-size=\"13\" font-weight=\"600\" text-anchor=\"middle\">" << esc(c.title)
    << "</text>";
  if (x0 > x1) {
    o << "<text x=\"" << W / 2 << "\" y=\"" << H / 2
      << "\" text-anchor=\"middle\" class=\"empty\">no data</text></svg></figure>";
    return o.str();
  }
  if (c.log_x) {
    x0 = std::pow(10.0, std::floor(std::log10(x0))), x1 = std::pow(10.0, std::ceil(std::log10(x1)));
    if (x1 <= x0) x1 = x0 * 10;
  } else if (x1 == x0) {
    x0 -= 0.5, x1 += 0.5;
  }
  if (c.log_y) {
    y0 = std::pow(10.0, std::floor(std::log10(y0) * 4) / 4), y1 = std::pow(10.0, std::ceil(std::log10(y1) * 4) / 4);
    if (y1 <= y0) y1 = y0 * 10;
  } else {
    if (y1 == y0) y0 -= std::max(std::abs(y0) * 0.1, 0.5), y1 += std::max(std::abs(y1) * 0.1, 0.5);
    const double pad = (y1 - y0) * 0.05;
    y0 -= pad, y1 += pad;
  }
  auto X = [&](double x) {
    const double f =
        c.log_x ? (std::log10(x) - std::log10(x0)) / (std::log10(x1) - std::log10(x0)) : (x - x0) / (x1 - x0);
    return L + f * pw;
  };
  auto Y = [&](double y) {
    const double f =
        c.log_y ? (std::log10(y) - std::log10(y0)) / (std::log10(y1) - std::log10(y0)) : (y - y0) / (y1 - y0);
    return T + ph - f * ph;
  };
  // axes, grid, ticks
  o << "<g class=\"axes\"><rect x=\"" << L << "\" y=\"" << T << "\" width=\"" << pw << "\" height=\"" << ph
    << "\" fill=\"none\" stroke=\"#999\"/>";
  bool int_x = !c.log_x;  // counts (ranks, steps): no tick between two integers
  for (const auto& sr : c.series)
    for (const auto& p : sr.points) int_x = int_x && p.first == std::round(p.first);
  std::vector<double> xt = c.log_x ? log_ticks(x0, x1) : linear_ticks(x0, x1);
  if (int_x) std::erase_if(xt, [](double v) { return v != std::round(v); });
  for (double v : xt)
    o << "<line x1=\"" << px(X(v)) << "\" x2=\"" << px(X(v)) << "\" y1=\"" << T + ph << "\" y2=\"" << T + ph + 4
      << "\" stroke=\"#999\"/><text x=\"" << px(X(v)) << "\" y=\"" << T + ph + 16 << "\" text-anchor=\"middle\">"
      << num(v) << "</text>";
  for (double v : c.log_y ? log_ticks(y0, y1) : linear_ticks(y0, y1))
    o << "<line x1=\"" << L << "\" x2=\"" << L + pw << "\" y1=\"" << px(Y(v)) << "\" y2=\"" << px(Y(v))
      << "\" stroke=\"#eee\"/><text x=\"" << L - 6 << "\" y=\"" << px(Y(v) + 4) << "\" text-anchor=\"end\">" << num(v)
      << "</text>";
  o << "<text x=\"" << L + pw / 2 << "\" y=\"" << H - 8 << "\" text-anchor=\"middle\">" << esc(c.x_label)
    << (c.log_x ? " (log scale)" : "") << "</text>"
    << "<text transform=\"translate(16 " << T + ph / 2 << ") rotate(-90)\" text-anchor=\"middle\">" << esc(c.y_label)
    << (c.log_y ? " (log scale)" : "") << "</text></g>";
  // series, then the legend (top right, inside the plot)
  int i = 0;
  for (const auto& s : c.series) {
    const char* col = kColors[i++ % 8];
    std::ostringstream d;
    int n = 0;
    for (auto [x, y] : s.points) {
      if (!plottable(c, x, y)) continue;
      if (s.markers)
        d << "<circle cx=\"" << px(X(x)) << "\" cy=\"" << px(Y(y)) << "\" r=\"3.5\" fill=\"" << col << "\"/>";
      else
        d << (n ? " L" : "M") << px(X(x)) << " " << px(Y(y));
      ++n;
    }
    if (s.markers)
      o << "<g class=\"series\" data-series=\"" << esc(s.name) << "\" data-points=\"" << n << "\">" << d.str()
        << "</g>";
    else if (n <= 2) {  // a line of one or two points would hardly show: its points too
      for (auto [x, y] : s.points)
        if (plottable(c, x, y))
          o << "<circle cx=\"" << px(X(x)) << "\" cy=\"" << px(Y(y)) << "\" r=\"3\" fill=\"" << col << "\"/>";
    }
    if (!s.markers)
      o << "<path class=\"series\" data-series=\"" << esc(s.name) << "\" data-points=\"" << n << "\" d=\"" << d.str()
        << "\" fill=\"none\" stroke=\"" << col << "\" stroke-width=\"1.6\""
        << (s.dashed ? " stroke-dasharray=\"5 4\"" : "") << "/>";
  }
  i = 0;
  double ly = T + 8;
  for (const auto& s : c.series) {
    const char* col = kColors[i++ % 8];
    o << "<g class=\"legend\">";
    if (s.markers)
      o << "<circle cx=\"" << L + pw + 20 << "\" cy=\"" << ly << "\" r=\"3.5\" fill=\"" << col << "\"/>";
    else
      o << "<line x1=\"" << L + pw + 12 << "\" x2=\"" << L + pw + 28 << "\" y1=\"" << ly << "\" y2=\"" << ly
        << "\" stroke=\"" << col << "\" stroke-width=\"2\"" << (s.dashed ? " stroke-dasharray=\"5 4\"" : "") << "/>";
    // A long name keeps its end (the run's distinguishing suffix and the series); the whole in a tooltip.
    const std::string label = s.name.size() > 24 ? "\u2026" + s.name.substr(s.name.size() - 23) : s.name;
    o << "<title>" << esc(s.name) << "</title><text x=\"" << L + pw + 34 << "\" y=\"" << ly + 4 << "\">" << esc(label)
      << "</text></g>";
    ly += 15;
  }
  o << "</svg></figure>";
  return o.str();
}

std::string render_bars(const std::string& title, const std::string& unit,
                        const std::vector<std::pair<std::string, double>>& bars) {
  const double W = 740, L = 230, R = 90, T = 30, row = 20;
  const double H = T + row * double(std::max<size_t>(bars.size(), 1)) + 30, pw = W - L - R;
  double top = 0;
  for (const auto& b : bars)
    if (std::isfinite(b.second)) top = std::max(top, b.second);
  std::ostringstream o;
  o << "<figure class=\"chart\"><svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 " << W << " " << H
    << "\" width=\"" << W << "\" height=\"" << H
    << "\" font-family=\"sans-serif\" font-size=\"11\" role=\"img\" aria-label=\"" << esc(title) << "\"><text x=\""
    << W / 2 << "\" y=\"18\" font-size=\"13\" font-weight=\"600\" text-anchor=\"middle\">" << esc(title)
    << "</text><g class=\"series\" data-series=\"bars\" data-points=\"" << bars.size() << "\">";
  double y = T;
  for (const auto& [label, v] : bars) {
    const double w = top > 0 && std::isfinite(v) ? v / top * pw : 0;
    o << "<text x=\"" << L - 6 << "\" y=\"" << px(y + 13) << "\" text-anchor=\"end\">" << esc(label)
      << "</text><rect x=\"" << L << "\" y=\"" << px(y + 3) << "\" width=\"" << px(w) << "\" height=\"" << row - 6
      << "\" fill=\"" << kColors[0] << "\"/><text x=\"" << px(L + w + 4) << "\" y=\"" << px(y + 13) << "\">" << num(v)
      << " " << esc(unit) << "</text>";
    y += row;
  }
  o << "</g></svg></figure>";
  return o.str();
}

namespace {

struct Run {
  std::string name, dir;
  std::vector<json> train, eval;
  json summary;
};

// The NaN or infinity literal a line that does not parse holds outside its strings ("NaN",
// "-Infinity", ...), or "".
std::string non_json_number(const std::string& line) {
  bool in_string = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
      continue;
    }
    for (const char* lit : {"-Infinity", "Infinity", "-inf", "inf", "NaN", "nan", "-nan"})
      if (line.compare(i, std::strlen(lit), lit) == 0) return lit;
  }
  return "";
}

// The first field the report draws as a number that holds something else ("\"step\" is a string
// (\"x\"), not a number"), or "". A null (what a writer may put for a missing value) is let be.
std::string wrong_field(const json& j) {
  for (const auto& [k, v] : j.items()) {
    const bool numeric = k == "step" || k == "epoch" || k == "loss" || k == "lr" || k == "eval_loss" ||
                         k == "loss_scale" || k == "samples_per_s" || k == "data_wait_s" || k == "forward_backward_s" ||
                         k == "comm_wait_s" || k == "optimizer_s" || k == "grad_norm" ||
                         (k.size() >= 8 && k.compare(k.size() - 8, 8, "accuracy") == 0);
    if (numeric && !v.is_number() && !v.is_null())
      return "\"" + k + "\" is a " + v.type_name() + " (" + io::dump_json(v).substr(0, 40) + "), not a number";
  }
  return "";
}

Run read_run(const std::string& dir, std::vector<std::string>& notes) {
  Run r;
  r.dir = dir;
  r.name = fs::path(dir).lexically_normal().filename().string();
  if (r.name.empty() || r.name == ".") r.name = fs::path(dir).lexically_normal().parent_path().filename().string();
  const std::string mpath = (fs::path(dir) / "metrics.jsonl").string();
  std::ifstream in(mpath);
  if (!in) {
    notes.push_back(mpath + (fs::exists(fs::path(dir) / "summary.json")
                                 ? ": missing: the run has a summary.json but no metrics (nothing to chart)"
                                 : ": cannot be read (not a run directory of kiln train?)"));
  } else {
    std::string line;
    int64_t n = 0;
    while (std::getline(in, line)) {
      ++n;
      if (line.empty()) continue;
      const bool last = in.peek() == std::char_traits<char>::eof();
      json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
      const std::string where = mpath + ":" + std::to_string(n) + ": ";
      if (j.is_object()) {
        if (j.contains("stopped")) continue;  // why a run stopped early (a signal), not a metric
        if (const std::string bad = wrong_field(j); !bad.empty()) {
          notes.push_back(where + bad + "; skipped");
          continue;
        }
        (j.contains("eval_loss") ? r.eval : r.train).push_back(std::move(j));
        continue;
      }
      // Only a last line that does not parse may have been cut by a kill; anything else was written
      // so (NaN and 1e999 are not JSON numbers).
      std::string why;
      if (!j.is_discarded())
        why = std::string("a JSON ") + j.type_name() + ", not an object";
      else if (const std::string lit = non_json_number(line); !lit.empty())
        why = "holds " + lit + ", which is not a JSON number (JSON has no NaN or infinity)";
      else
        why = last ? "not a complete JSON line (cut by a kill?)" : "not valid JSON";
      notes.push_back(where + why + "; skipped");
    }
    if (r.train.empty() && r.eval.empty()) notes.push_back(mpath + ": no metrics yet (an empty run)");
  }
  const std::string spath = (fs::path(dir) / "summary.json").string();
  if (std::ifstream s(spath); s) {
    try {
      r.summary = json::parse(s);
    } catch (const std::exception&) {
      notes.push_back(spath + ": not valid JSON; skipped");
    }
  }
  return r;
}

double get(const json& j, const std::string& k) {
  auto it = j.find(k);
  return it != j.end() && it->is_number() ? it->get<double>() : NAN;
}

// A series of one key over the step for each run (those that have it).
void add_key(Chart& c, const std::vector<Run>& runs, bool eval, const std::string& key, const std::string& label,
             double scale = 1.0) {
  for (const Run& r : runs) {
    ChartSeries s{runs.size() > 1 ? r.name + " " + label : label, {}, eval};
    for (const json& j : eval ? r.eval : r.train)
      if (std::isfinite(get(j, key))) s.points.emplace_back(get(j, "step"), scale * get(j, key));
    if (!s.points.empty()) c.series.push_back(std::move(s));
  }
}

std::string first_key(const std::vector<Run>& runs, bool eval, const std::string& prefix, const std::string& suffix) {
  for (const Run& r : runs)
    for (const json& j : eval ? r.eval : r.train)
      for (const auto& [k, v] : j.items())
        if (k.rfind(prefix, 0) == 0 && k.size() >= suffix.size() &&
            k.compare(k.size() - suffix.size(), suffix.size(), suffix) == 0)
          return k;
  return "";
}

}  // namespace

namespace {

// Charts of one benchmark's JSON (the "benchmark" or "bench" key names its kind); an unknown kind
// or unreadable file is a note.
std::vector<std::string> bench_charts(const std::string& path, std::vector<std::string>& notes) {
  json j;
  try {
    std::ifstream in(path);
    if (!in) throw std::runtime_error("cannot be read");
    j = json::parse(in);
  } catch (const std::exception& e) {
    // nlohmann's message less its "[json.exception.parse_error.101] " tag, whole (cut, it ended
    // mid-word).
    std::string m = e.what();
    if (m.rfind("[json.exception.", 0) == 0 && m.find("] ") != std::string::npos) m = m.substr(m.find("] ") + 2);
    notes.push_back(path + ": not a readable JSON file (" + m + ")");
    return {};
  }
  // Every benchmark writes an object; anything else (a bare array of rows) is named, not fatal.
  if (!j.is_object()) {
    notes.push_back(path + ": a JSON " + j.type_name() + ", not a benchmark's object (benchmark, rows, ...); skipped");
    return {};
  }
  const std::string kind = j.value("benchmark", j.value("bench", std::string()));
  const std::string where =
      j.contains("cpu") ? " on " + j.value("cpu", std::string()) + " (" + j.value("cpu_kernels", std::string()) + ")"
                        : std::string();
  const json rows = j.value("rows", json::array());
  std::vector<std::string> out;
  auto key_of = [](const json& r, std::initializer_list<const char*> ks) {
    std::string s;
    for (const char* k : ks)
      if (r.contains(k))
        s += (s.empty() ? "" : " ") + (r[k].is_string() ? r[k].get<std::string>() : io::dump_json(r[k]));
    return s;
  };
  if (kind == "gemm") {
    Chart c{"GEMM" + where, "size (cube root of m n k)", "GFLOP/s", false, {}, true};
    std::map<std::string, ChartSeries> kiln_s, peer_s;
    for (const json& r : rows) {
      const double size = std::cbrt(get(r, "m") * get(r, "n") * get(r, "k"));
      const std::string k = key_of(r, {"dtype", "layout"});
      kiln_s[k].name = "Kiln " + k;
      kiln_s[k].points.emplace_back(size, get(r, "gflops"));
      if (std::isfinite(get(r, "openblas_gflops"))) {
        peer_s[k].name = "OpenBLAS " + k;
        peer_s[k].dashed = true;
        peer_s[k].points.emplace_back(size, get(r, "openblas_gflops"));
      }
    }
    for (auto* m : {&kiln_s, &peer_s})
      for (auto& [k, v] : *m) {
        std::sort(v.points.begin(), v.points.end());
        c.series.push_back(v);
      }
    out.push_back(render_chart(c));
  } else if (kind == "allreduce") {
    Chart c{
        "All-reduce (" + j.value("backend", std::string("?")) + ", " + std::to_string(j.value("ranks", 0)) + " ranks)",
        "message size (bytes)",
        "bandwidth (GB/s)",
        false,
        {},
        true};
    ChartSeries bus{"bus bandwidth", {}, false}, alg{"algorithm bandwidth", {}, false, true};
    for (const json& r : rows) {
      bus.points.emplace_back(get(r, "bytes"), get(r, "busbw_GBps"));
      alg.points.emplace_back(get(r, "bytes"), get(r, "algbw_GBps"));
    }
    c.series = {bus, alg};
    out.push_back(render_chart(c));
  } else if (kind == "scaling") {
    Chart t{"Scaling: " + j.value("model", std::string()) + " throughput", "ranks", "samples/s", false, {}};
    Chart e{"Scaling efficiency", "ranks", "efficiency (%)", false, {}};
    ChartSeries sps{"measured", {}, false}, ideal{"ideal (linear)", {}, false, true}, eff{"measured", {}, false},
        full{"ideal", {}, false, true};
    double one = NAN;
    for (const json& r : rows) {
      const double n = get(r, "ranks");
      if (n == 1) one = get(r, "samples_per_s");
      sps.points.emplace_back(n, get(r, "samples_per_s"));
      eff.points.emplace_back(n, 100.0 * get(r, "efficiency"));
      full.points.emplace_back(n, 100.0);
    }
    for (const auto& p : sps.points) ideal.points.emplace_back(p.first, p.first * one);
    t.series = {sps, ideal};
    e.series = {eff, full};
    out.push_back(render_chart(t));
    out.push_back(render_chart(e));
  } else if (kind == "train") {
    std::vector<std::pair<std::string, double>> bars;
    for (const json& r : rows) bars.emplace_back(key_of(r, {"model", "amp", "input"}), get(r, "median_ms"));
    out.push_back(render_bars("Training step (median)" + where, "ms", bars));
  } else if (kind == "memory") {  // kiln bench memory
    std::vector<std::pair<std::string, double>> peak, ms;
    for (const json& r : rows) {
      const std::string k = key_of(r, {"model", "run"});
      peak.emplace_back(k, get(r, "peak_mib"));
      ms.emplace_back(k, get(r, "median_ms"));
    }
    out.push_back(render_bars("Peak memory of a training step (per rank)" + where, "MiB", peak));
    out.push_back(render_bars("Training step (median)" + where, "ms", ms));
  } else if (kind == "nn" || kind == "ops") {
    std::vector<std::pair<std::string, double>> bars;
    // bench_ops writes "cpu_fwd_bwd_ms": null for a row without gradients: its bar is the forward time,
    // labelled so; a row with no time at all has no bar (not a "nan ms" one).
    for (const json& r : rows) {
      const std::string k = key_of(r, {"op", "name", "row"});
      bool drawn = false;
      for (const char* t : {"fwd_bwd_ms", "ms", "cpu_fwd_bwd_ms"})
        if (!drawn && std::isfinite(get(r, t))) bars.emplace_back(k, get(r, t)), drawn = true;
      for (const char* t : {"fwd_ms", "cpu_fwd_ms"})
        if (!drawn && std::isfinite(get(r, t))) bars.emplace_back(k + " (forward only)", get(r, t)), drawn = true;
    }
    out.push_back(render_bars(kind + " benchmark: forward+backward (or one pass)" + where, "ms", bars));
  } else if (kind == "image_resize") {  // bench_image_resize, PIL beside it when it was measured
    std::vector<std::pair<std::string, double>> bars;
    for (const json& r : rows) {
      bars.emplace_back("Kiln " + key_of(r, {"image", "pass"}), get(r, "ms"));
      if (std::isfinite(get(r, "pil_ms"))) bars.emplace_back("PIL " + key_of(r, {"image", "pass"}), get(r, "pil_ms"));
    }
    out.push_back(render_bars("Image resize to 224x224 (PIL's bilinear), per image" + where, "ms", bars));
  } else if (kind.empty() && j.contains("datasheet") && j.contains("gemm")) {  // bench_gpu
    const std::string dev = " on " + j.value("device", std::string("the GPU"));
    const json& sheet = j["datasheet"];
    Chart g{"cuBLASLt GEMM" + dev, "size (m = n = k)", "TFLOP/s", false, {}, true};
    std::map<std::string, ChartSeries> by;
    for (const json& r : j["gemm"]) {
      const std::string dt = r.value("dtype", std::string("?"));
      by[dt].name = dt;
      by[dt].points.emplace_back(get(r, "m"), get(r, "TFLOPs"));
    }
    double lo = 1e300, hi = 0;
    for (auto& [dt, v] : by) {
      for (auto& p : v.points) lo = std::min(lo, p.first), hi = std::max(hi, p.first);
      g.series.push_back(v);
    }
    // the datasheet's peak of each dtype, dashed (f16 and bf16 share the tensor-core peak)
    for (auto [dt, key] :
         {std::pair<const char*, const char*>{"f16", "f16_TFLOPs"}, {"tf32", "tf32_TFLOPs"}, {"f32", "f32_TFLOPs"}})
      if (by.count(dt) && std::isfinite(get(sheet, key)) && get(sheet, key) > 0)
        g.series.push_back({std::string("peak ") + dt + (std::string(dt) == "f16" ? "/bf16" : ""),
                            {{lo, get(sheet, key)}, {hi, get(sheet, key)}},
                            false,
                            true});
    out.push_back(render_chart(g));
    std::vector<std::pair<std::string, double>> mem;
    for (const json& r : j.value("memory_bound", json::array()))
      mem.emplace_back(r.value("kernel", std::string()), get(r, "GBps"));
    if (!mem.empty())
      out.push_back(
          render_bars("Memory-bound kernels" + dev + " (datasheet " + num(1000 * get(sheet, "memory_TBps")) + " GB/s)",
                      "GB/s", mem));
    std::vector<std::pair<std::string, double>> tc;
    if (j["tc_gemm"].is_array())
      for (const json& r : j["tc_gemm"]) {
        const std::string sh = r.value("shape", std::string());
        if (r.contains("kiln_ms")) {
          tc.emplace_back(sh + ": Kiln", get(r, "kiln_ms"));
          tc.emplace_back(sh + ": cuBLASLt", get(r, "cublaslt_ms"));
        } else {
          tc.emplace_back(sh + ": Kiln fused", get(r, "kiln_fused_ms"));
          tc.emplace_back(sh + ": cuBLASLt + bias + gelu", get(r, "cublaslt_bias_gelu_ms"));
        }
      }
    if (!tc.empty()) out.push_back(render_bars("Tensor Core GEMM: Kiln against cuBLASLt" + dev, "ms", tc));
    std::vector<std::pair<std::string, double>> conv;
    for (const json& r : j.value("conv", json::array()))
      conv.emplace_back(key_of(r, {"layer", "dtype", "layout"}), get(r, "fwd_bwd_ms"));
    if (!conv.empty()) out.push_back(render_bars("Convolutions, forward + backward" + dev, "ms", conv));
  } else {
    notes.push_back(path + ": a benchmark JSON of an unknown kind (\"" + kind +
                    "\"; kiln report draws gemm, allreduce, scaling, train, nn, ops, image_resize and bench_gpu's)");
  }
  return out;
}

}  // namespace

std::string render_report(const std::vector<std::string>& inputs, const std::string& title,
                          std::vector<std::string>& notes) {
  std::vector<Run> runs;
  std::vector<std::string> bench_svgs;
  for (const auto& d : inputs) {
    if (d.size() > 5 && d.compare(d.size() - 5, 5, ".json") == 0) {
      try {
        for (auto& svg : bench_charts(d, notes)) bench_svgs.push_back(std::move(svg));
      } catch (const json::exception& e) {  // a field of the wrong type ("benchmark": 3): this file only
        std::string m = e.what();
        if (m.rfind("[json.exception.", 0) == 0 && m.find("] ") != std::string::npos) m = m.substr(m.find("] ") + 2);
        notes.push_back(d + ": not a benchmark's JSON as Kiln writes it (" + m + "); skipped");
      }
      continue;
    }
    runs.push_back(read_run(d, notes));
  }
  std::vector<Chart> charts;
  {
    Chart c{"Loss (train: mean over each logging window)", "optimizer step", "loss", false, {}};
    add_key(c, runs, false, "loss", "train");
    add_key(c, runs, true, "eval_loss", "eval");
    charts.push_back(std::move(c));
  }
  if (const std::string tk = first_key(runs, false, "train_", "accuracy"); !tk.empty()) {
    Chart c{"Accuracy", "optimizer step", "accuracy (%)", false, {}};
    add_key(c, runs, false, tk, "train", 100.0);
    add_key(c, runs, true, "eval" + tk.substr(5), "eval", 100.0);
    charts.push_back(std::move(c));
  }
  {
    Chart c{"Learning rate", "optimizer step", "learning rate", false, {}};
    add_key(c, runs, false, "lr", "lr");
    charts.push_back(std::move(c));
  }
  if (!first_key(runs, false, "loss_scale", "loss_scale").empty()) {
    Chart c{"Loss scale (fp16)", "optimizer step", "loss scale", true, {}};
    add_key(c, runs, false, "loss_scale", "scale");
    // bf16 runs carry a disabled scaler (scale 1 throughout): nothing to see
    std::erase_if(c.series, [](const ChartSeries& s) {
      return std::all_of(s.points.begin(), s.points.end(), [](const auto& p) { return p.second == 1.0; });
    });
    if (!c.series.empty()) charts.push_back(std::move(c));
  }
  if (!first_key(runs, false, "grad_norm", "grad_norm").empty()) {  // runs with --clip-grad-norm
    Chart c{"Gradient norm (before clipping)", "optimizer step", "L2 norm", true, {}};
    add_key(c, runs, false, "grad_norm", "grad norm");
    if (!c.series.empty()) charts.push_back(std::move(c));
  }
  {
    Chart c{"Throughput", "optimizer step", "samples/s", false, {}};
    add_key(c, runs, false, "samples_per_s", "samples/s");
    charts.push_back(std::move(c));
  }
  {
    Chart c{"Time per logging window, by phase", "optimizer step", "seconds", false, {}};
    for (const char* k : {"data_wait_s", "forward_backward_s", "comm_wait_s", "optimizer_s"})
      add_key(c, runs, false, k, std::string(k).substr(0, std::strlen(k) - 2));
    charts.push_back(std::move(c));
  }
  {
    // Who waits for whom: a rank that waits long for the others' gradients (comm) is ahead of them;
    // one that waits for data starves.
    Chart c{"Each rank's waiting: for the others (comm) and for data", "optimizer step", "seconds", false, {}};
    for (const Run& r : runs) {
      std::map<std::pair<size_t, int>, ChartSeries> per;
      for (const json& j : r.train)
        if (auto it = j.find("ranks"); it != j.end() && it->is_array())
          for (size_t q = 0; q < it->size(); ++q)
            for (int w = 0; w < 2; ++w) {
              auto& s = per[{q, w}];
              s.name = (runs.size() > 1 ? r.name + " " : "") + "rank " + std::to_string(q) + (w ? " data" : " comm");
              s.dashed = w == 1;
              s.points.emplace_back(get(j, "step"), get((*it)[q], w ? "data_wait_s" : "comm_wait_s"));
            }
      for (auto& [q, s] : per) c.series.push_back(std::move(s));
    }
    if (!c.series.empty()) charts.push_back(std::move(c));
  }
  {
    Chart c{"GPU memory", "optimizer step", "MiB", false, {}};
    for (const Run& r : runs)
      for (const char* k : {"allocated", "peak_allocated", "reserved"}) {
        ChartSeries s{(runs.size() > 1 ? r.name + " " : "") + k, {}, false};
        for (const json& j : r.train)
          if (auto it = j.find("gpu_memory_mib"); it != j.end() && it->is_object())
            s.points.emplace_back(get(j, "step"), get(*it, k));
        if (!s.points.empty()) c.series.push_back(std::move(s));
      }
    if (!c.series.empty()) charts.push_back(std::move(c));
  }

  std::ostringstream o;
  o << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>" << esc(title) << "</title><style>"
    << "body{font:14px system-ui,sans-serif;margin:24px;color:#222}h1{font-size:20px}h2{font-size:16px;margin-top:28px}"
    << ".charts{display:flex;flex-wrap:wrap;gap:12px}.chart{margin:0;border:1px solid #ddd;padding:4px}"
    << "svg text{font:11px system-ui,sans-serif;fill:#333}svg text.title{font-size:13px;font-weight:600}"
    << "table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;"
    << "vertical-align:top}.notes{background:#fff4e0;border:1px solid #e8c07a;padding:8px 12px}"
    << "@media print{.chart{break-inside:avoid}}</style></head><body>\n<h1>" << esc(title) << "</h1>\n";
  if (!notes.empty()) {
    o << "<div class=\"notes\"><b>Not all of the input could be read:</b><ul>";
    for (const auto& n : notes) o << "<li>" << esc(n) << "</li>";
    o << "</ul></div>\n";
  }
  if (!bench_svgs.empty()) {
    o << "<h2>Benchmarks</h2><div class=\"charts\">\n";
    for (const auto& svg : bench_svgs) o << svg << "\n";
    o << "</div>\n";
  }
  if (runs.empty()) {
    o << "</body></html>\n";
    return o.str();
  }
  o << "<div class=\"charts\">\n";
  for (const Chart& c : charts) o << render_chart(c) << "\n";
  o << "</div>\n<h2>Final metrics</h2><table><tr><th>run</th><th>steps</th><th>test loss</th><th>test metric</th>"
    << "<th>samples/s</th><th>train time (s)</th></tr>";
  for (const Run& r : runs) {
    const json& s = r.summary;
    // The run's metric, a share shown in percent: "test_" + the task's metric (tools/tasks.cpp: mlm_accuracy
    // for "mlm", accuracy for "classify"), never test_perplexity (no share) nor test_loss / test_samples.
    // A summary without "task" shows its test_*accuracy key.
    std::string metric = "&mdash;";
    if (s.is_object()) {
      std::string key;
      if (s.contains("task") && s["task"].is_string())
        key = s["task"].get<std::string>() == "mlm" ? "test_mlm_accuracy" : "test_accuracy";
      else
        for (const auto& [k, v] : s.items())
          if (k.rfind("test_", 0) == 0 && k.size() >= 8 && k.compare(k.size() - 8, 8, "accuracy") == 0) key = k;
      if (!key.empty() && s.contains(key) && s[key].is_number())
        metric = esc(key.substr(5)) + " " + num(100.0 * s[key].get<double>()) + "%";
    }
    auto field = [&](const char* k) {
      return s.is_object() && s.contains(k) && s[k].is_number() ? num(s[k].get<double>()) : std::string("&mdash;");
    };
    // The whole run's training time, over every process of a resumed one (wall_seconds is only the
    // last process's); a summary from before train_seconds shows its wall time, labelled so.
    std::string train_time = field("train_seconds");
    if (train_time == "&mdash;" && field("wall_seconds") != "&mdash;") train_time = field("wall_seconds") + " (wall)";
    // A signal stop's summary is where the run was, not its end: said in its row, or its last
    // evaluation's numbers would read as a finished run's.
    std::string steps = field("steps");
    if (s.is_object() && s.contains("stopped")) {
      const json& sig = s["stopped"];
      steps = "stopped (" + esc(sig.is_string() ? sig.get<std::string>() : io::dump_json(sig)) + ") at step " + steps;
    }
    std::string test_loss = field("test_loss"), samples = field("samples_per_s");
    // No summary.json: a run still going (or one killed before its end). Its row says so and shows
    // where the metrics are, the last evaluation's numbers labelled as such, not a row of dashes.
    if (!s.is_object() && (!r.train.empty() || !r.eval.empty())) {
      double last_step = NAN;
      for (const auto* v : {&r.train, &r.eval})
        if (!v->empty() && std::isfinite(get(v->back(), "step")))
          last_step = std::isfinite(last_step) ? std::max(last_step, get(v->back(), "step")) : get(v->back(), "step");
      steps = (std::isfinite(last_step) ? num(last_step) : std::string("&mdash;")) +
              " (no summary.json: still running, or ended before writing one)";
      if (!r.eval.empty()) {
        const json& e = r.eval.back();
        const std::string at = " (eval, step " + num(get(e, "step")) + ")";
        if (std::isfinite(get(e, "eval_loss"))) test_loss = num(get(e, "eval_loss")) + at;
        for (const auto& [k, v] : e.items())
          if (k.rfind("eval_", 0) == 0 && k.size() >= 13 && k.compare(k.size() - 8, 8, "accuracy") == 0 &&
              v.is_number())
            metric = esc(k.substr(5)) + " " + num(100.0 * v.get<double>()) + "%" + at;
      }
      if (!r.train.empty() && std::isfinite(get(r.train.back(), "samples_per_s")))
        samples = num(get(r.train.back(), "samples_per_s")) + " (last step)";
    }
    o << "<tr><td>" << esc(r.name) << "</td><td>" << steps << "</td><td>" << test_loss << "</td><td>" << metric
      << "</td><td>" << samples << "</td><td>" << train_time << "</td></tr>";
  }
  o << "</table>\n<h2>Config</h2>";
  for (const Run& r : runs) {
    if (!r.summary.is_object() || !r.summary.contains("config")) continue;
    o << "<details" << (runs.size() == 1 ? " open" : "") << "><summary>" << esc(r.name) << "</summary><table>";
    for (const auto& [k, v] : r.summary["config"].items())
      o << "<tr><td>" << esc(k) << "</td><td>" << esc(v.is_string() ? v.get<std::string>() : io::dump_json(v))
        << "</td></tr>";
    o << "</table></details>";
  }
  o << "\n</body></html>\n";
  return o.str();
}

void add_report_flags(CLI::App& app, ReportOptions& o) {
  app.add_option("runs", o.runs,
                 "Run directories of kiln train (several: their curves overlaid) and benchmark JSON files")
      ->required();
  app.add_option("--out", o.out, "The HTML file to write (default: report.html in the first run directory)");
  app.add_option("--title", o.title, "The page's title (default: the runs' names)");
}

int run_report(const ReportOptions& o) {
  for (const auto& d : o.runs) {
    const bool json_file = d.size() > 5 && d.compare(d.size() - 5, 5, ".json") == 0;
    if (json_file ? !fs::is_regular_file(d) : !fs::is_directory(d)) {
      std::fprintf(stderr, "kiln report: error: %s: no such %s\n", d.c_str(),
                   json_file ? "benchmark JSON file" : "run directory");
      return 2;
    }
  }
  // The files read: each JSON input, and each run directory's metrics and summary (an --out naming
  // one of those would replace the run's record with the page).
  std::vector<std::string> read;
  for (const auto& d : o.runs) {
    read.push_back(d);
    if (fs::is_directory(d))
      for (const char* f : {"metrics.jsonl", "summary.json"}) read.push_back((fs::path(d) / f).string());
  }
  if (const std::string clash = output_is_input("--out", o.out, read); !clash.empty()) {
    std::fprintf(stderr, "kiln report: error: %s\n", clash.c_str());
    return 2;
  }
  std::string title = o.title;
  if (title.empty()) {
    title = "kiln report:";
    for (const auto& d : o.runs) title += " " + fs::path(d).lexically_normal().filename().string();
  }
  std::vector<std::string> notes;
  const std::string html = render_report(o.runs, title, notes);
  for (const auto& n : notes) std::fprintf(stderr, "kiln report: warning: %s\n", n.c_str());
  std::string out = o.out;
  if (out.empty()) {
    if (!fs::is_directory(o.runs[0])) {
      std::fprintf(stderr, "kiln report: error: --out is needed when the first input is a JSON file\n");
      return 2;
    }
    out = (fs::path(o.runs[0]) / "report.html").string();
  }
  try {
    io::write_file_atomic(out, html);
  } catch (const Error& e) {
    std::fprintf(stderr, "kiln report: error: %s\n", e.message().c_str());
    return 1;
  }
  std::printf("kiln report: %s (%zu input%s)\n", out.c_str(), o.runs.size(), o.runs.size() == 1 ? "" : "s");
  return 0;
}

}  // namespace kiln::tools
