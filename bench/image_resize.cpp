// Image loader resampling: the per-image time of the PIL-exact bilinear resize (io/images.cpp) from
// decoded 8-bit pixels to 224x224, for the evaluation transform (Resize(256) then CenterCrop(224)) and
// the training one (RandomResizedCrop: here its largest box, the whole image), at ImageNet's typical
// 500x375 and a 12-megapixel 4000x3000 photo. Decoding is not timed. One thread, as a loader worker.
// The peer, PIL's Image.resize(BILINEAR) on the same sizes and boxes, is timed in the same run through
// --python; without it, the first of $KILN_VENV/bin/python, the checkout's .venv/bin/python (the venv
// scripts/common.sh makes) and python3 that imports PIL. Where none does, the table says why its column
// is "-". The outputs differ in layout: Kiln writes planar f32 (CHW, the loader's tensor), PIL
// interleaved u8 (HWC RGB). Prints a table; --json FILE writes the rows as the other benchmarks do (an
// object: benchmark, cpu, cpu_kernels, threads, peer, rows).
#include <sys/wait.h>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/bench_main.h"
#include "io/images.h"
#include "kiln.h"

using namespace kiln;

namespace {
using bench::median_ms;

// PIL's median ms per (image, pass) for the same cases, run by `python` (empty when it cannot import
// PIL or fails). Its input is noise as ours is (the time does not depend on the values); each case is
// "w,h,pass,left,top,box_w,box_h".
const char* kPilScript = R"(
import os, statistics, sys, time
from PIL import Image
reps = int(sys.argv[1])
for case in sys.argv[2:]:
    w, h, p, l, t, bw, bh = case.split(",")
    w, h = int(w), int(h)
    im = Image.frombytes("RGB", (w, h), os.urandom(3 * w * h))
    box = (float(l), float(t), float(l) + float(bw), float(t) + float(bh))
    im.resize((224, 224), Image.BILINEAR, box=box)
    ts = []
    for _ in range(reps):
        a = time.perf_counter()
        im.resize((224, 224), Image.BILINEAR, box=box)
        ts.append((time.perf_counter() - a) * 1e3)
    print(f"{w}x{h}", p, statistics.median(ts))
)";

// PIL's times, or none with the reason in `why`. The script runs under timeout(1): a Python that
// hangs costs the bench 10 minutes at most, not forever.
std::map<std::string, double> pil_times(const std::string& python, int reps, const std::vector<std::string>& cases,
                                        std::string& why) {
  std::map<std::string, double> out;
  if (python.empty()) return why = "no --python given", out;
  if (python.find('\'') != std::string::npos) return why = "--python " + python + ": a path with a quote", out;
  std::string cmd = "timeout 600 '" + python + "' -c '" + kPilScript + "' " + std::to_string(reps);
  for (const std::string& c : cases) cmd += " " + c;
  cmd += " 2>/dev/null";
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return why = "could not start a shell", out;
  char image[64], pass[16];
  double ms = 0;
  while (std::fscanf(f, "%63s %15s %lf", image, pass, &ms) == 3) out[std::string(image) + " " + pass] = ms;
  const int st = pclose(f);
  const int code = st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  if (code == 0) return out;
  out.clear();
  why = code == 124   ? "--python " + python + " did not finish within 600 s"
        : code == 127 ? "--python " + python + " was not found"
                      : "--python " + python + " exited with status " + std::to_string(code) +
                            " (PIL missing? run it with -c 'import PIL' to see)";
  return out;
}

// Whether `python` runs and imports PIL.
bool imports_pil(const std::string& python) {
  if (python.empty() || python.find('\'') != std::string::npos) return false;
  const std::string cmd = "timeout 60 '" + python + "' -c 'import PIL' >/dev/null 2>&1";
  const int st = std::system(cmd.c_str());
  return st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

// The Python for the peer when --python was not given: the first candidate that imports PIL, else ""
// with `why` naming those tried.
std::string find_python(std::string& why) {
  std::vector<std::string> tried;
  if (const char* venv = std::getenv("KILN_VENV"); venv && *venv) tried.push_back(std::string(venv) + "/bin/python");
  tried.push_back(std::string(KILN_BENCH_SOURCE_DIR) + "/.venv/bin/python");
  tried.push_back("python3");
  std::string names;
  for (const std::string& p : tried) {
    if (imports_pil(p)) return p;
    names += (names.empty() ? "" : ", ") + p;
  }
  why = "none of " + names + " imports PIL: pip install pillow into one, or give --python PATH";
  return "";
}
}  // namespace

int main(int argc, char** argv) {
  CLI::App app("Image loader resampling (PIL's antialiased bilinear) per image", "bench_image_resize");
  bench::CommonFlags flags;
  bench::add_common_flags(app, flags, /*threads=*/false);
  int reps_flag = 0;
  app.add_option("--reps", reps_flag,
                 "Timed repetitions of each case, the median reported (default 20; 3 with --quick)")
      ->check(bench::whole_number(0));
  std::string python;
  const CLI::Option* python_opt = app.add_option(
      "--python", python,
      "The Python that times PIL as the peer (default: $KILN_VENV/bin/python, the checkout's .venv, then python3, "
      "the first that imports PIL; \"\" for none)");
  if (const int rc = bench::start(app, flags, argc, argv); rc >= 0) return rc;
  if (!bench::json_path_ok("bench_image_resize", flags.json)) return 2;
  const int reps = reps_flag > 0 ? reps_flag : flags.quick ? 3 : 20;
  const int64_t c = 3, s = 224, resize = 256;
  struct Case {
    std::string image, pass;
    double ms;
  };
  std::vector<Case> cases;
  std::vector<std::string> pil_cases;
  for (const auto& size : std::vector<std::pair<int64_t, int64_t>>{{500, 375}, {4000, 3000}}) {
    const int64_t w = size.first, h = size.second;  // named, not bound: lambdas below capture them
    std::vector<uint8_t> px(size_t(c * h * w));
    for (size_t i = 0; i < px.size(); ++i) px[i] = uint8_t((i * 2654435761u) >> 24);
    std::vector<float> out(size_t(c * s * s));
    // The evaluation transform's box, as ImageFolderDataset::get_batch computes it.
    const int64_t shorter = std::min(h, w), longer = std::max(h, w);
    const int64_t rlong = int64_t(double(resize * longer) / double(shorter));
    const int64_t rh = h <= w ? resize : rlong, rw = h <= w ? rlong : resize;
    const double sy = double(h) / double(rh), sx = double(w) / double(rw);
    const double top = std::nearbyint(double(rh - s) / 2.0), left = std::nearbyint(double(rw - s) / 2.0);
    const double eval = median_ms(
        [&] {
          io::resize_bilinear(px.data(), c, h, w, top * sy, left * sx, double(s) * sy, double(s) * sx, out.data(), s,
                              s);
        },
        reps);
    const double train =
        median_ms([&] { io::resize_box_bilinear(px.data(), c, h, w, 0, 0, h, w, out.data(), s, s); }, reps);
    const std::string image = std::to_string(w) + "x" + std::to_string(h);
    cases.push_back({image, "eval", eval});
    cases.push_back({image, "train", train});
    char box[256];
    std::snprintf(box, sizeof box, "%lld,%lld,eval,%.17g,%.17g,%.17g,%.17g", (long long)w, (long long)h, left * sx,
                  top * sy, double(s) * sx, double(s) * sy);
    pil_cases.push_back(box);
    std::snprintf(box, sizeof box, "%lld,%lld,train,0,0,%lld,%lld", (long long)w, (long long)h, (long long)w,
                  (long long)h);
    pil_cases.push_back(box);
  }
  std::string pil_missing;
  std::map<std::string, double> pil;
  if (python_opt->count() == 0) python = find_python(pil_missing);
  if (python_opt->count() > 0 || !python.empty()) pil = pil_times(python, reps, pil_cases, pil_missing);
  std::printf("bench_image_resize: %s; 1 thread\n", bench::cpu_line().c_str());
  std::printf("out: 224x224; Kiln writes planar f32 (CHW), PIL interleaved u8 (HWC RGB)\n");
  if (pil.empty())
    std::printf("peer: PIL unavailable, its columns \"-\" (%s)\n", pil_missing.c_str());
  else
    std::printf("peer: PIL through %s\n", python.c_str());
  std::printf("%-12s %-6s %10s %10s %8s\n", "image", "pass", "ms/image", "PIL ms", "PIL/Kiln");
  nlohmann::json rows = nlohmann::json::array();
  for (const Case& k : cases) {
    const auto p = pil.find(k.image + " " + k.pass);
    nlohmann::json row = {{"image", k.image}, {"pass", k.pass}, {"out", s}, {"ms", k.ms}};
    if (p != pil.end()) {
      std::printf("%-12s %-6s %10.3f %10.3f %8.2f\n", k.image.c_str(), k.pass.c_str(), k.ms, p->second,
                  p->second / k.ms);
      row["pil_ms"] = p->second;
    } else {
      std::printf("%-12s %-6s %10.3f %10s %8s\n", k.image.c_str(), k.pass.c_str(), k.ms, "-", "-");
    }
    rows.push_back(row);
  }
  const nlohmann::json doc = {{"benchmark", "image_resize"},
                              {"cpu", bench::cpu_model()},
                              {"cpu_kernels", cpu_isa_name(cpu_isa())},
                              {"threads", 1},
                              {"layout", "Kiln: planar f32 (CHW); PIL: interleaved u8 (HWC RGB)"},
                              {"peer", pil.empty() ? nlohmann::json(nullptr) : nlohmann::json("PIL via " + python)},
                              {"peer_missing", pil.empty() ? nlohmann::json(pil_missing) : nlohmann::json(nullptr)},
                              {"rows", rows}};
  return bench::write_json("bench_image_resize", flags.json, doc) ? 0 : 1;
}
