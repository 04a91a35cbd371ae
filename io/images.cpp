// Image folders: scanning, decoding (stb_image, JPEG/PNG/BMP only) and the crop/resize transforms.
#include "io/images.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "engine/random.h"

#define STB_IMAGE_STATIC
#define STB_IMAGE_IMPLEMENTATION
#define STBI_ONLY_JPEG
#define STBI_ONLY_PNG
#define STBI_ONLY_BMP
// Static, so GCC names every stb function this file does not call (stb's own header, not Kiln's code).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#include <stb_image.h>
#pragma GCC diagnostic pop

namespace kiln::io {
namespace fs = std::filesystem;

namespace {
bool is_image(const fs::path& p) {
  std::string e = p.extension().string();
  std::transform(e.begin(), e.end(), e.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  return e == ".jpg" || e == ".jpeg" || e == ".png" || e == ".bmp";
}
}  // namespace

Tensor decode_image(const std::string& path, int64_t channels) {
  KILN_CHECK(channels == 1 || channels == 3, path, ": images decode to 1 or 3 channels, not ", channels);
  int w = 0, h = 0, n = 0;
  unsigned char* px = stbi_load(path.c_str(), &w, &h, &n, int(channels));
  if (px == nullptr) {
    // stb_image calls an empty file an "unknown image type"; an interrupted copy is the likelier cause.
    const char* why = stbi_failure_reason();
    std::error_code ec;
    const auto size = fs::file_size(path, ec);
    KILN_CHECK(ec || size != 0, path, ": the file is empty (0 bytes), not an image");
    KILN_FAIL(path, ": cannot decode the image (", why, ")");
  }
  std::unique_ptr<unsigned char, void (*)(void*)> guard(px, stbi_image_free);
  KILN_CHECK(w > 0 && h > 0, path, ": empty image ", w, "x", h);
  Tensor t = make_tensor({channels, h, w}, DType::u8, kCPU);
  uint8_t* out = t.data<uint8_t>();
  for (int64_t y = 0; y < h; ++y)
    for (int64_t x = 0; x < w; ++x)
      for (int64_t ch = 0; ch < channels; ++ch) out[(ch * h + y) * w + x] = px[(y * w + x) * channels + ch];
  return t;
}

void resize_bilinear(const float* src, int64_t c, int64_t h, int64_t w, double y0, double x0, double bh, double bw,
                     float* dst, int64_t out_h, int64_t out_w) {
  const double sy = bh / double(out_h), sx = bw / double(out_w);
  for (int64_t oy = 0; oy < out_h; ++oy) {
    const double fy = std::clamp(y0 + (double(oy) + 0.5) * sy - 0.5, 0.0, double(h - 1));
    const int64_t iy = std::min<int64_t>(int64_t(fy), h - 1), iy1 = std::min<int64_t>(iy + 1, h - 1);
    const float dy = float(fy - double(iy));
    for (int64_t ox = 0; ox < out_w; ++ox) {
      const double fx = std::clamp(x0 + (double(ox) + 0.5) * sx - 0.5, 0.0, double(w - 1));
      const int64_t ix = std::min<int64_t>(int64_t(fx), w - 1), ix1 = std::min<int64_t>(ix + 1, w - 1);
      const float dx = float(fx - double(ix));
      for (int64_t ch = 0; ch < c; ++ch) {
        const float* p = src + ch * h * w;
        const float top = p[iy * w + ix] * (1 - dx) + p[iy * w + ix1] * dx;
        const float bot = p[iy1 * w + ix] * (1 - dx) + p[iy1 * w + ix1] * dx;
        dst[(ch * out_h + oy) * out_w + ox] = top * (1 - dy) + bot * dy;
      }
    }
  }
}

ImageFolderDataset::ImageFolderDataset(const std::string& root, ImageFolderOptions o, std::vector<std::string> classes)
    : root_(root), o_(std::move(o)), classes_(std::move(classes)) {
  KILN_CHECK(fs::is_directory(root_), root_, ": not a directory (an image folder holds one sub-directory per class)");
  KILN_CHECK(o_.size >= 1 && o_.resize >= o_.size, root_, ": image size ", o_.size, " and resize ", o_.resize,
             " (need 1 <= size <= resize)");
  KILN_CHECK(o_.channels == 1 || o_.channels == 3, root_, ": images decode to 1 or 3 channels, not ", o_.channels);
  KILN_CHECK(o_.mean.size() == size_t(o_.channels) && o_.std.size() == size_t(o_.channels), root_, ": normalisation has ",
             o_.mean.size(), " means and ", o_.std.size(), " stds for ", o_.channels, " channels");
  std::vector<std::string> found;
  for (const auto& e : fs::directory_iterator(root_))
    if (e.is_directory()) found.push_back(e.path().filename().string());
  std::sort(found.begin(), found.end());
  if (classes_.empty()) classes_ = found;
  KILN_CHECK(!classes_.empty(), root_, ": no class sub-directories");
  for (size_t ci = 0; ci < classes_.size(); ++ci) {
    const fs::path dir = fs::path(root_) / classes_[ci];
    if (!fs::is_directory(dir)) continue;  // a class the validation folder lacks
    std::vector<std::string> files;
    for (const auto& e : fs::recursive_directory_iterator(dir))
      if (e.is_regular_file() && is_image(e.path())) files.push_back(e.path().string());
    std::sort(files.begin(), files.end());
    for (auto& f : files) {
      files_.push_back(std::move(f));
      labels_.push_back(int64_t(ci));
    }
  }
  for (const auto& f : found)
    KILN_CHECK(std::find(classes_.begin(), classes_.end(), f) != classes_.end(), root_, ": class '", f,
               "' is not among the training classes");
  KILN_CHECK(!files_.empty(), root_, ": no .jpg, .jpeg, .png or .bmp images under its class directories");
}

Batch ImageFolderDataset::get_batch(const std::vector<int64_t>& indices, uint64_t seed) const {
  const int64_t c = o_.channels, s = o_.size;
  std::vector<float> pixels;
  std::vector<int64_t> targets;
  std::vector<float> img;
  for (int64_t n : indices) {
    KILN_CHECK(n >= 0 && n < size(), root_, ": sample ", n, " out of range [0, ", size(), ")");
    Tensor raw;
    try {
      raw = decode_image(files_[size_t(n)], c);
    } catch (const Error&) {
      if (!o_.skip_bad) throw;
      bad_.fetch_add(1);
      continue;
    }
    const int64_t h = raw.size(1), w = raw.size(2);
    img.resize(size_t(c * h * w));
    const uint8_t* r = raw.data<uint8_t>();
    for (int64_t i = 0; i < c * h * w; ++i) img[size_t(i)] = float(r[i]) / 255.0f;
    double y0, x0, bh, bw;
    bool flip = false;
    if (o_.train) {
      PhiloxStream rng(seed, uint64_t(n) << 8);
      const double area = double(h) * double(w);
      bool done = false;
      for (int attempt = 0; attempt < 10 && !done; ++attempt) {
        const double scale = 0.08 + 0.92 * rng.uniform();
        const double ratio = std::exp(std::log(3.0 / 4.0) + (std::log(4.0 / 3.0) - std::log(3.0 / 4.0)) * rng.uniform());
        bw = std::round(std::sqrt(area * scale * ratio));
        bh = std::round(std::sqrt(area * scale / ratio));
        if (bw >= 1 && bh >= 1 && bw <= w && bh <= h) {
          y0 = std::floor(rng.uniform() * (double(h) - bh + 1));
          x0 = std::floor(rng.uniform() * (double(w) - bw + 1));
          done = true;
        }
      }
      if (!done) {  // no box fitted in 10 draws: the whole image
        bh = double(h);
        bw = double(w);
        y0 = x0 = 0;
      }
      flip = rng.uniform() < 0.5f;
    } else {
      // Resize the shorter side to `resize`, then take the centre size x size: in source pixels, a
      // centred box of size * (shorter / resize) on a side.
      const double k = double(std::min(h, w)) / double(o_.resize);
      bh = bw = double(s) * k;
      y0 = (double(h) - bh) / 2;
      x0 = (double(w) - bw) / 2;
    }
    const size_t at = pixels.size();
    pixels.resize(at + size_t(c * s * s));
    float* out = pixels.data() + at;
    resize_bilinear(img.data(), c, h, w, y0, x0, bh, bw, out, s, s);
    for (int64_t ch = 0; ch < c; ++ch) {
      float* p = out + ch * s * s;
      const float m = o_.mean[size_t(ch)], sd = o_.std[size_t(ch)];
      for (int64_t y = 0; y < s; ++y) {
        if (flip) std::reverse(p + y * s, p + (y + 1) * s);
        for (int64_t x = 0; x < s; ++x) p[y * s + x] = (p[y * s + x] - m) / sd;
      }
    }
    targets.push_back(labels_[size_t(n)]);
  }
  const int64_t b = int64_t(targets.size());
  KILN_CHECK(b > 0, root_, ": every image of a batch was unreadable (", indices.size(), " skipped)");
  Tensor x = make_tensor({b, c, s, s}, DType::f32, kCPU), y = make_tensor({b}, DType::i64, kCPU);
  std::copy(pixels.begin(), pixels.end(), x.data<float>());
  std::copy(targets.begin(), targets.end(), y.data<int64_t>());
  return {{"input", x}, {"target", y}};
}

}  // namespace kiln::io
