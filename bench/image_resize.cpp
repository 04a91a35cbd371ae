// Image loader resampling: the per-image time of the PIL-exact bilinear resize (io/images.cpp) from
// decoded 8-bit pixels to 224x224, for the evaluation transform (Resize(256) then CenterCrop(224)) and
// the training one (RandomResizedCrop: here its largest box, the whole image), at ImageNet's typical
// 500x375 and a 12-megapixel 4000x3000 photo. Decoding is not timed. One thread, as a loader worker.
// Prints a table; --json FILE writes the rows.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/bench_main.h"
#include "io/images.h"
#include "kiln.h"

using namespace kiln;

namespace {
double median_ms(const std::function<void()>& fn, int reps) {
  fn();  // warm-up
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto a = std::chrono::steady_clock::now();
    fn();
    t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}
}  // namespace

int main(int argc, char** argv) {
  CLI::App app("Image loader resampling (PIL's antialiased bilinear) per image", "bench_image_resize");
  bench::CommonFlags flags;
  bench::add_common_flags(app, flags, /*threads=*/false);
  int reps_flag = 0;
  app.add_option("--reps", reps_flag,
                 "Timed repetitions of each case, the median reported (default 20; 3 with --quick)")
      ->check(CLI::NonNegativeNumber);
  if (const int rc = bench::start(app, flags, argc, argv); rc >= 0) return rc;
  const int reps = reps_flag > 0 ? reps_flag : flags.quick ? 3 : 20;
  const int64_t c = 3, s = 224, resize = 256;
  nlohmann::json rows = nlohmann::json::array();
  std::printf("bench_image_resize: %s\n%-12s %-6s %10s\n", bench::cpu_line().c_str(), "image", "pass", "ms/image");
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
    for (const auto& [pass, ms] : {std::pair<const char*, double>{"eval", eval}, {"train", train}}) {
      std::printf("%-12s %-6s %10.3f\n", image.c_str(), pass, ms);
      rows.push_back({{"image", image}, {"pass", pass}, {"out", s}, {"ms", ms}, {"cpu", bench::cpu_model()}});
    }
  }
  if (!flags.json.empty()) std::ofstream(flags.json) << rows.dump(2) << "\n";
  return 0;
}
