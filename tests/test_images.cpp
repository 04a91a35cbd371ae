// Image folders: scanning and class ids, decoding PNG/BMP/JPEG with stb_image, the resize and crop
// transforms, corrupt files (an error naming the file, or skipped and counted), and `kiln train` on one.
#include <doctest/doctest.h>

#define STB_IMAGE_WRITE_STATIC
#define STB_IMAGE_WRITE_IMPLEMENTATION
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#pragma GCC diagnostic ignored "-Wunused-function"
#include <stb_image_write.h>
#pragma GCC diagnostic pop

#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "io/checkpoint.h"
#include "io/images.h"
#include "kiln.h"
#include "test_util.h"
#include "tools/train.h"

using namespace kiln;
using kiln::testing::contains;
using kiln::testing::error_of;
using kiln::testing::TempDir;
namespace fs = std::filesystem;

namespace {
// A w x h RGB image of one colour, with a bright pixel at its top-left corner.
void write_image(const std::string& path, int w, int h, unsigned char r, unsigned char g, unsigned char b) {
  std::vector<unsigned char> px(size_t(w * h * 3));
  for (int i = 0; i < w * h; ++i) {
    px[size_t(3 * i)] = r;
    px[size_t(3 * i + 1)] = g;
    px[size_t(3 * i + 2)] = b;
  }
  px[0] = 255;
  const std::string ext = fs::path(path).extension().string();
  int ok = 0;
  if (ext == ".png") ok = stbi_write_png(path.c_str(), w, h, 3, px.data(), w * 3);
  else if (ext == ".bmp") ok = stbi_write_bmp(path.c_str(), w, h, 3, px.data());
  else ok = stbi_write_jpg(path.c_str(), w, h, 3, px.data(), 95);
  REQUIRE(ok);
}

// A PNG chunk (length, type, data, CRC).
std::string png_chunk(const std::string& type, const std::string& data) {
  std::string c = {char(data.size() >> 24), char(data.size() >> 16), char(data.size() >> 8), char(data.size())};
  c += type + data;
  const uint32_t crc =
      uint32_t(crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const unsigned char*>(c.data() + 4), uInt(c.size() - 4)));
  return c + std::string{char(crc >> 24), char(crc >> 16), char(crc >> 8), char(crc)};
}

// root/{train,val}/{cat,dog}/ with `n` images per class in mixed formats and sizes.
void make_folder(const std::string& root, int n) {
  for (const char* split : {"train", "val"})
    for (int cls = 0; cls < 2; ++cls) {
      const fs::path dir = fs::path(root) / split / (cls ? "dog" : "cat");
      fs::create_directories(dir);
      for (int i = 0; i < n; ++i) {
        const char* ext = i % 3 == 0 ? ".png" : i % 3 == 1 ? ".bmp" : ".jpg";
        const unsigned char v = cls ? 200 : 40;
        write_image((dir / ("img" + std::to_string(i) + ext)).string(), 20 + i % 5, 16 + i % 7, v, v, v);
      }
    }
}
}  // namespace

TEST_CASE("image folder: classes, files, decoding, shapes and normalisation") {
  TempDir d("kiln_img");
  make_folder(d.p.string(), 4);
  std::ofstream(d / "train/cat/notes.txt") << "not an image";
  io::ImageFolderOptions o;
  o.size = 8;
  o.resize = 8;
  io::ImageFolderDataset ds(d / "train", o);
  CHECK(ds.classes() == std::vector<std::string>{"cat", "dog"});
  CHECK(ds.size() == 8);
  const io::Batch b = ds.get_batch({0, 5}, 0);
  CHECK(b.at("input").shape() == Shape{2, 3, 8, 8});
  CHECK(b.at("target").to_vector() == std::vector<double>{0, 1});
  // The centre of a uniform image is its colour, normalised per channel.
  const auto x = b.at("input").to_vector();
  CHECK(x[4 * 8 + 4] == doctest::Approx((40.0 / 255 - 0.485) / 0.229).epsilon(0.02));
  CHECK(x[64 + 4 * 8 + 4] == doctest::Approx((40.0 / 255 - 0.456) / 0.224).epsilon(0.02));
  const Tensor raw = io::decode_image(ds.file(1), 1);
  CHECK(raw.shape() == Shape{1, 17, 21});
  // Training crops and flips depend on (seed, sample) only.
  o.train = true;
  io::ImageFolderDataset tr(d / "train", o);
  CHECK(tr.get_batch({3}, 5).at("input").to_vector() == tr.get_batch({3}, 5).at("input").to_vector());
  const auto pair = tr.get_batch({1, 3}, 5).at("input").to_vector();
  const auto alone = tr.get_batch({3}, 5).at("input").to_vector();
  CHECK(std::equal(alone.begin(), alone.end(), pair.begin() + 3 * 64));
  // A validation folder takes the training folder's class ids; an unknown class is an error.
  fs::create_directories(d.p / "val/bird");
  write_image((d.p / "val/bird/x.png").string(), 4, 4, 1, 2, 3);
  CHECK(contains(error_of([&] { io::ImageFolderDataset(d / "val", o, ds.classes()); }), "class 'bird'"));
  CHECK(contains(error_of([&] { io::ImageFolderDataset(d / "nowhere", o); }), "nowhere: not a directory"));
}

TEST_CASE("image folder: a corrupt image is an error naming it, or is skipped and counted") {
  TempDir d("kiln_img");
  make_folder(d.p.string(), 3);
  std::ofstream(d / "train/dog/broken.png") << "\x89PNG\r\n\x1a\n garbage";
  io::ImageFolderOptions o;
  o.size = 8;
  o.resize = 9;
  // Its header is unreadable: found when the folder is scanned, before any batch.
  CHECK(contains(error_of([&] { io::ImageFolderDataset(d / "train", o); }), "broken.png: cannot decode the image"));
  o.skip_bad = true;
  io::ImageFolderDataset lenient(d / "train", o);
  CHECK(lenient.size() == 6);
  CHECK(lenient.bad_samples() == 1);
  std::vector<int64_t> all(size_t(lenient.size()));
  for (size_t i = 0; i < all.size(); ++i) all[i] = int64_t(i);
  CHECK(lenient.get_batch(all, 0).at("input").size(0) == 6);
}

TEST_CASE("image folder: an empty image file is called empty, not of an unknown type") {
  TempDir d("kiln_img");
  std::ofstream(d / "empty.png").flush();
  const std::string e = error_of([&] { io::decode_image(d / "empty.png", 3); });
  CHECK_MESSAGE(contains(e, d / "empty.png" + ": the file is empty (0 bytes), not an image"), e);
  std::ofstream(d / "junk.png") << "not an image";
  CHECK(contains(error_of([&] { io::decode_image(d / "junk.png", 3); }), "junk.png: cannot decode the image"));
}

namespace {
// A grey PNG of w x h, pixel (x, y) = px[y * w + x].
void write_grey(const fs::path& path, int w, int h, const std::vector<unsigned char>& px) {
  fs::create_directories(path.parent_path());
  REQUIRE(stbi_write_png(path.string().c_str(), w, h, 1, px.data(), w));
}
// A grey-scale image folder of one sample under root/a (and a second class, b, for the scan), read
// with the given transform and no normalisation: its one sample's pixels.
std::vector<float> one_sample(const fs::path& root, int w, int h, const std::vector<unsigned char>& px, int64_t size,
                              int64_t resize, bool train) {
  write_grey(root / "a" / "x.png", w, h, px);
  write_grey(root / "b" / "y.png", 2, 2, {0, 0, 0, 0});
  io::ImageFolderOptions o;
  o.size = size;
  o.resize = resize;
  o.channels = 1;
  o.mean = {0.f};
  o.std = {1.f};
  o.train = train;
  io::ImageFolderDataset ds(root.string(), o);
  REQUIRE(ds.file(0) == (root / "a" / "x.png").string());
  const Tensor x = ds.get_batch({0}, 7)["input"];
  return std::vector<float>(x.data<float>(), x.data<float>() + size * size);
}
}  // namespace

// The expectations are PIL 13's Image.resize(size, Image.BILINEAR[, box]) on the same data in mode
// "F" (float pixels), which torchvision's Resize calls (antialiased when shrinking).
TEST_CASE("resize_bilinear: PIL's bilinear resampling, antialiased when shrinking, with a box, and enlarging") {
  std::vector<float> src(35);  // 5 rows x 7 columns
  for (int y = 0; y < 5; ++y)
    for (int x = 0; x < 7; ++x) src[size_t(y * 7 + x)] = float((x * 3 + y * 5) % 7) * 0.1f + (x == y ? 0.5f : 0.f);
  std::vector<float> same(35);
  io::resize_bilinear(src.data(), 1, 5, 7, 0, 0, 5, 7, same.data(), 5, 7);
  CHECK(same == src);
  const auto near = [](const std::vector<float>& got, const std::vector<float>& want) {
    REQUIRE(got.size() == want.size());
    for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == doctest::Approx(want[i]).epsilon(2e-6));
  };
  std::vector<float> shrink(6), enlarge(80), box(6);
  io::resize_bilinear(src.data(), 1, 5, 7, 0, 0, 5, 7, shrink.data(), 2, 3);  // im.resize((3, 2))
  near(shrink, {0.4782468f, 0.3382353f, 0.3155844f, 0.3548701f, 0.4422460f, 0.3178571f});
  io::resize_bilinear(src.data(), 1, 5, 7, 0, 0, 5, 7, enlarge.data(), 8, 10);  // im.resize((10, 8))
  near(enlarge,
       {0.5000000f, 0.3900000f, 0.3750000f, 0.5850000f, 0.3400000f, 0.3050000f, 0.4800000f, 0.2000000f, 0.2350000f,
        0.4000000f, 0.5000000f, 0.4621875f, 0.4515625f, 0.5084375f, 0.2525000f, 0.2175000f, 0.4078125f, 0.3421875f,
        0.3159375f, 0.3125000f, 0.4875000f, 0.5493750f, 0.5546875f, 0.4278125f, 0.1668750f, 0.1209375f, 0.3025000f,
        0.5125000f, 0.4075000f, 0.1875000f, 0.3625000f, 0.4931250f, 0.6015625f, 0.6059375f, 0.4356250f, 0.2803125f,
        0.1775000f, 0.3875000f, 0.2825000f, 0.0625000f, 0.2375000f, 0.4025000f, 0.5234375f, 0.4840625f, 0.5543750f,
        0.4756250f, 0.2603125f, 0.3171875f, 0.2559375f, 0.1562500f, 0.1125000f, 0.2775000f, 0.3203125f, 0.0621875f,
        0.5231250f, 0.7068750f, 0.5509375f, 0.3015625f, 0.3278125f, 0.4687500f, 0.3812500f, 0.3296875f, 0.2859375f,
        0.2815625f, 0.3625000f, 0.5331250f, 0.7346875f, 0.2578125f, 0.2225000f, 0.3875000f, 0.6000000f, 0.3800000f,
        0.2750000f, 0.4850000f, 0.2400000f, 0.3800000f, 0.8550000f, 0.2250000f, 0.1350000f, 0.3000000f});
  // im.resize((2, 3), box=(1.5, 0.5, 6, 4.25)): the box as (left, top, right, bottom).
  io::resize_bilinear(src.data(), 1, 5, 7, 0.5, 1.5, 3.75, 4.5, box.data(), 3, 2);
  near(box, {0.3672764f, 0.3210417f, 0.4984991f, 0.2911538f, 0.3681051f, 0.4511538f});
}

// The loader's paths read 8-bit pixels where they are (no float copy of the image, no copy of a
// RandomResizedCrop box): they give the numbers of the float path on the converted image and on the
// box cut out, shrinking by 10 and more (windows of 20+ taps), enlarging, and at a box on the edge.
TEST_CASE("resize_bilinear: 8-bit pixels and a box resampled in place give the float path's numbers") {
  const int64_t c = 3, h = 75, w = 130;
  std::vector<uint8_t> px(size_t(c * h * w));
  for (size_t i = 0; i < px.size(); ++i) px[i] = uint8_t((i * 2654435761u) >> 24);
  std::vector<float> unit(px.size());
  for (size_t i = 0; i < px.size(); ++i) unit[i] = float(px[i]) / 255.0f;
  const auto same = [](const std::vector<float>& got, const std::vector<float>& want) {
    REQUIRE(got.size() == want.size());
    int wrong = 0;
    for (size_t i = 0; i < got.size(); ++i) wrong += !(got[i] == doctest::Approx(want[i]).epsilon(2e-6));
    CHECK(wrong == 0);
  };
  struct Box {
    int64_t y0, x0, bh, bw, out_h, out_w;
  };
  for (const Box b :
       {Box{0, 0, h, w, 7, 6}, Box{10, 21, 60, 99, 5, 9}, Box{50, 120, 25, 10, 40, 33}, Box{0, 3, 1, 1, 4, 4}}) {
    CAPTURE(b.y0);
    CAPTURE(b.x0);
    CAPTURE(b.bh);
    CAPTURE(b.bw);
    const size_t n = size_t(c * b.out_h * b.out_w);
    std::vector<float> want(n), got(n), cut(size_t(c * b.bh * b.bw));
    // Resize's box: the windows reach past it.
    io::resize_bilinear(unit.data(), c, h, w, double(b.y0) + 0.25, double(b.x0), double(b.bh) - 0.5, double(b.bw),
                        want.data(), b.out_h, b.out_w);
    io::resize_bilinear(px.data(), c, h, w, double(b.y0) + 0.25, double(b.x0), double(b.bh) - 0.5, double(b.bw),
                        got.data(), b.out_h, b.out_w);
    same(got, want);
    // RandomResizedCrop's: the box cut out first.
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t y = 0; y < b.bh; ++y)
        std::copy_n(unit.data() + (ch * h + b.y0 + y) * w + b.x0, b.bw, cut.data() + (ch * b.bh + y) * b.bw);
    io::resize_bilinear(cut.data(), c, b.bh, b.bw, 0, 0, double(b.bh), double(b.bw), want.data(), b.out_h, b.out_w);
    io::resize_box_bilinear(px.data(), c, h, w, b.y0, b.x0, b.bh, b.bw, got.data(), b.out_h, b.out_w);
    same(got, want);
  }
  // Every 8-bit value reads as float(v) / 255.0f exactly (the resampler multiplies by 1/255 in f64):
  // a 1x1 image resized to 1x1 is the pixel.
  for (int v = 0; v < 256; ++v) {
    const uint8_t p = uint8_t(v);
    float got1 = -1;
    io::resize_bilinear(&p, 1, 1, 1, 0, 0, 1, 1, &got1, 1, 1);
    CHECK(got1 == float(v) / 255.0f);
  }
  std::vector<float> out(3);
  CHECK(contains(error_of([&] { io::resize_box_bilinear(px.data(), c, h, w, 70, 0, 6, 5, out.data(), 1, 1); }),
                 "box 5x6 at (0, 70) is not inside the 130x75 image"));
}

// An independent PIL reference for the 8-bit path at 3 channels, shrunk by about 12 (windows of 24+
// taps, wider than the 8 rows the horizontal pass reads side by side). Made with PIL 13.0.0 in the
// venv: per channel c, Image.fromarray(px[c].astype(np.float32) / np.float32(255), mode="F")
// .resize((4, 3), Image.BILINEAR), px[c, y, x] = (6y + x*x // 9 + 50c + (7x + 3y) % 13) % 256, printed
// to 7 decimals.
TEST_CASE("resize_bilinear: 3 channels of 37x47 8-bit pixels shrunk to 3x4 give PIL's numbers") {
  const int64_t c = 3, h = 37, w = 47;
  std::vector<uint8_t> px(size_t(c * h * w));
  for (int64_t ch = 0; ch < c; ++ch)
    for (int64_t y = 0; y < h; ++y)
      for (int64_t x = 0; x < w; ++x)
        px[size_t((ch * h + y) * w + x)] = uint8_t((6 * y + x * x / 9 + 50 * ch + (7 * x + 3 * y) % 13) % 256);
  const std::vector<float> want = {
      0.2084479f, 0.3209320f, 0.5537905f, 0.6408301f, 0.4711965f, 0.5831090f, 0.6681758f, 0.3680460f, 0.7334443f,
      0.7390205f, 0.3922482f, 0.4005204f, 0.4045263f, 0.5170104f, 0.6885764f, 0.4229147f, 0.6668587f, 0.7195686f,
      0.4902297f, 0.3633752f, 0.6603476f, 0.4015343f, 0.3111418f, 0.5879098f, 0.6006047f, 0.7009569f, 0.5866673f,
      0.3233364f, 0.7229696f, 0.5612283f, 0.3201879f, 0.5211307f, 0.2578144f, 0.2646390f, 0.4703669f, 0.6809768f};
  std::vector<float> got(want.size()), boxed(want.size());
  io::resize_bilinear(px.data(), c, h, w, 0, 0, double(h), double(w), got.data(), 3, 4);
  io::resize_box_bilinear(px.data(), c, h, w, 0, 0, h, w, boxed.data(), 3, 4);
  for (size_t i = 0; i < want.size(); ++i) {
    CAPTURE(i);
    CHECK(got[i] == doctest::Approx(want[i]).epsilon(2e-6));
    CHECK(boxed[i] == doctest::Approx(want[i]).epsilon(2e-6));
  }
}

// torchvision's Resize(7) then CenterCrop(6) on a 23x17 image (resized to 9x7, the crop's offset
// round(1.5) = 2 across, round(0.5) = 0 down: Python rounds half to even), from PIL in mode "F".
TEST_CASE("image folder: the evaluation transform is torchvision's Resize then CenterCrop (PIL, antialiased)") {
  const int w = 23, h = 17;
  std::vector<unsigned char> wide(size_t(w * h)), tall(size_t(w * h));
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      wide[size_t(y * w + x)] = (unsigned char)((x * 37 + y * 11 + x * y) % 256);
      tall[size_t(x * h + y)] = wide[size_t(y * w + x)];  // its transpose, 17 wide and 23 tall
    }
  const std::vector<float> want = {
      0.542200f, 0.303096f, 0.646666f, 0.445350f, 0.428606f, 0.642784f, 0.405447f, 0.458158f, 0.578822f,
      0.321981f, 0.602484f, 0.471103f, 0.358020f, 0.612910f, 0.396213f, 0.494307f, 0.539915f, 0.367025f,
      0.412704f, 0.583944f, 0.351917f, 0.640561f, 0.414206f, 0.594072f, 0.534686f, 0.488101f, 0.477461f,
      0.452319f, 0.446595f, 0.560629f, 0.633346f, 0.410471f, 0.612056f, 0.378947f, 0.614211f, 0.430072f};
  TempDir d1("kiln_img_eval_wide"), d2("kiln_img_eval_tall");
  const std::vector<float> got_wide = one_sample(d1.p, w, h, wide, 6, 7, false);
  const std::vector<float> got_tall = one_sample(d2.p, h, w, tall, 6, 7, false);
  for (int y = 0; y < 6; ++y)
    for (int x = 0; x < 6; ++x) {
      CHECK(got_wide[size_t(y * 6 + x)] == doctest::Approx(want[size_t(y * 6 + x)]).epsilon(2e-6));
      CHECK(got_tall[size_t(x * 6 + y)] == doctest::Approx(want[size_t(y * 6 + x)]).epsilon(2e-6));
    }
}

// A 400x10 image fits no box of 8% of its area at an aspect within [3/4, 4/3]: torchvision then takes
// the centre 13x10 (10 * 4/3 rounded), columns 193-205, here the only white ones; a sample of the
// whole image, or a resampling window that reached past the box, would bring in black.
TEST_CASE("image folder: RandomResizedCrop's fallback is torchvision's centre crop at the clamped aspect") {
  std::vector<unsigned char> px(400 * 10, 0);
  for (int y = 0; y < 10; ++y)
    for (int x = 193; x <= 205; ++x) px[size_t(y * 400 + x)] = 255;
  TempDir d("kiln_img_fallback");
  for (const float v : one_sample(d.p, 400, 10, px, 5, 5, true)) CHECK(v == doctest::Approx(1.0f));
}

namespace {
// KILN_MAX_IMAGE_PIXELS set for a scope (unset when `value` is null), then put back.
struct PixelLimit {
  std::string old;
  bool had;
  explicit PixelLimit(const char* value) : had(std::getenv("KILN_MAX_IMAGE_PIXELS") != nullptr) {
    if (had) old = std::getenv("KILN_MAX_IMAGE_PIXELS");
    if (value)
      setenv("KILN_MAX_IMAGE_PIXELS", value, 1);
    else
      unsetenv("KILN_MAX_IMAGE_PIXELS");
  }
  ~PixelLimit() {
    if (had)
      setenv("KILN_MAX_IMAGE_PIXELS", old.c_str(), 1);
    else
      unsetenv("KILN_MAX_IMAGE_PIXELS");
  }
};
}  // namespace

TEST_CASE("image folder: an image above the pixel limit (a decompression bomb) is refused before it is decoded") {
  TempDir d("kiln_img_bomb");
  {
    // 14000x14000 RGB in a few dozen bytes: only the header says so, and that is all that is read.
    PixelLimit limit(nullptr);
    std::string ihdr(13, '\0');
    for (int i = 0; i < 2; ++i) ihdr[size_t(4 * i + 2)] = char(14000 >> 8), ihdr[size_t(4 * i + 3)] = char(14000 & 255);
    ihdr[8] = 8;  // bit depth
    ihdr[9] = 2;  // RGB
    std::ofstream(d / "bomb.png", std::ios::binary) << std::string("\x89PNG\r\n\x1a\n", 8) + png_chunk("IHDR", ihdr) +
                                                           png_chunk("IDAT", std::string("\x78\x9c", 2)) +
                                                           png_chunk("IEND", "");
    const std::string header = io::image_header_problem(d / "bomb.png");
    CHECK(contains(header, "14000x14000 is 196000000 pixels, above the limit of 178956970"));
    CHECK(contains(header, "KILN_MAX_IMAGE_PIXELS"));
    CHECK(contains(error_of([&] { io::decode_image(d / "bomb.png", 3); }),
                   "bomb.png: 14000x14000 is 196000000 pixels, above the limit of 178956970"));
  }
  make_folder(d / "set", 1);  // 20x16 images
  io::ImageFolderOptions o;
  o.size = 4;
  o.resize = 4;
  {
    PixelLimit limit("300");
    CHECK(contains(error_of([&] { io::ImageFolderDataset(d / "set/train", o); }),
                   "cat/img0.png: 20x16 is 320 pixels, above the limit of 300"));
    CHECK(contains(error_of([&] { io::decode_image(d / "set/train/cat/img0.png", 3); }),
                   "img0.png: 20x16 is 320 pixels, above the limit of 300"));
    o.skip_bad = true;
    CHECK(contains(error_of([&] { io::ImageFolderDataset(d / "set/train", o); }),
                   "every image is unreadable (2 skipped)"));
    o.skip_bad = false;
  }
  {
    PixelLimit limit("320");  // at the limit is allowed
    CHECK(io::ImageFolderDataset(d / "set/train", o).size() == 2);
  }
  {
    PixelLimit limit("0");  // no limit
    CHECK(io::max_image_pixels() == INT64_MAX);
    CHECK(io::ImageFolderDataset(d / "set/train", o).size() == 2);
  }
  {
    PixelLimit limit("lots");
    CHECK(contains(error_of([&] { io::ImageFolderDataset(d / "set/train", o); }),
                   "KILN_MAX_IMAGE_PIXELS=lots: not a whole number of pixels"));
  }
}

// A PNG past stb_image's own limit (2^30 bytes of pixels) failed stb's header read, then every other
// format's: "cannot decode the image (unknown image type)", with KILN_MAX_IMAGE_PIXELS=0 too.
TEST_CASE("image folder: a PNG past stb_image's 2^30-byte limit is called too large, with its size") {
  TempDir d("kiln_img_stb_limit");
  const auto png = [&](const std::string& name, uint32_t w, uint32_t h, char color) {
    std::string ihdr(13, '\0');
    for (int i = 0; i < 4; ++i) {
      ihdr[size_t(i)] = char(w >> (24 - 8 * i));
      ihdr[size_t(4 + i)] = char(h >> (24 - 8 * i));
    }
    ihdr[8] = 8;  // bit depth
    ihdr[9] = color;
    std::ofstream(d / name, std::ios::binary) << std::string("\x89PNG\r\n\x1a\n", 8) + png_chunk("IHDR", ihdr) +
                                                     png_chunk("IDAT", std::string("\x78\x9c", 2)) +
                                                     png_chunk("IEND", "");
  };
  png("huge.png", 100000, 100000, 2);  // RGB: 3e10 bytes
  png("rgba.png", 16384, 16385, 6);    // RGBA: just past 2^30 bytes, 268 million pixels
  png("wide.png", 20000000, 1, 0);     // a side past 2^24
  {
    PixelLimit limit("0");  // no limit of Kiln's: stb_image's still holds
    for (const auto& file_size : {std::pair{"huge.png", "100000x100000"}, std::pair{"rgba.png", "16384x16385"},
                                  std::pair{"wide.png", "20000000x1"}}) {
      const std::string name = file_size.first;  // not a structured binding: clang 14's lambdas cannot capture one
      const std::string says = std::string(file_size.second) + ": too large to decode (stb_image's limit of 2^30 bytes";
      const std::string header = io::image_header_problem(d / name);
      CHECK_MESSAGE(contains(header, says), header);
      const std::string e = error_of([&] { io::decode_image(d / name, 3); });
      CHECK_MESSAGE(contains(e, std::string(name) + ": " + says), e);
      CHECK_MESSAGE(!contains(e, "unknown image type"), e);
    }
  }
  {
    PixelLimit limit(nullptr);  // the default limit is said first, as for any image over it
    CHECK(contains(io::image_header_problem(d / "huge.png"),
                   "100000x100000 is 10000000000 pixels, above the limit of 178956970"));
  }
}

TEST_CASE("image folder: a bad KILN_MAX_IMAGE_PIXELS is an error when scanning, with the header checks off too") {
  TempDir d("kiln_img_bad_limit");
  make_folder(d / "set", 1);
  io::ImageFolderOptions o;
  o.size = 4;
  o.resize = 4;
  o.check_headers = false;
  o.skip_bad = true;  // not a reason to skip every image with a warning
  PixelLimit limit("12x");
  CHECK(contains(error_of([&] { io::ImageFolderDataset(d / "set/train", o); }),
                 "KILN_MAX_IMAGE_PIXELS=12x: not a whole number of pixels"));
}

TEST_CASE("train: ResNet on an image folder; a corrupt image stops the run or is skipped with the flag") {
  TempDir d("kiln_img");
  make_folder(d.p.string(), 6);
  std::ofstream(d / "train/cat/broken.jpg") << "not a jpeg";
  const std::string common = "train --model resnet20 --data folder --data-dir " + d.p.string() +
                             " --image-size 16 --batch 4 --epochs 1 --threads 1 --progress lines --out " + d / "run";
  auto r = kiln::testing::run_kiln(common, d.p.string());
  CHECK(r.code == 2);  // found by the header check, before any training
  CHECK_MESSAGE(contains(r.output, "broken.jpg: cannot decode the image"), r.output);
  r = kiln::testing::run_kiln(common + " --skip-bad-samples", d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  const auto s = nlohmann::json::parse(kiln::testing::read_text(d / "run/summary.json"));
  CHECK(s["bad_samples_skipped"] == 1);
  CHECK(s["test_samples"] == 12);
  r = kiln::testing::run_kiln("train --model resnet20 --data folder --out " + d / "x", d.p.string());
  CHECK(r.code == 2);
  CHECK(contains(r.output, "--data folder needs --data-dir"));
}

namespace {
std::string bytes_of(const std::string& path) { return kiln::testing::read_text(path); }
void put_bytes(const std::string& path, const std::string& b) { std::ofstream(path, std::ios::binary) << b; }
// Flips one bit of the pixel data (the first IDAT chunk's) of a PNG file: its CRC no longer matches.
void flip_idat_bit(const std::string& path) {
  std::string b = bytes_of(path);
  const size_t at = b.find("IDAT");
  REQUIRE(at != std::string::npos);
  b[at + 4 + 2] = char(b[at + 4 + 2] ^ 0x10);
  put_bytes(path, b);
}
}  // namespace

TEST_CASE("image folder: hidden folders are not classes; an empty class folder and a single class are errors") {
  TempDir d("kiln_img");
  make_folder(d.p.string(), 2);
  fs::create_directories(d.p / "train/.ipynb_checkpoints");
  write_image(d / "train/.ipynb_checkpoints/x.png", 4, 4, 1, 2, 3);
  write_image(d / "train/cat/.hidden.png", 4, 4, 1, 2, 3);
  io::ImageFolderOptions o;
  o.size = 8;
  o.resize = 8;
  io::ImageFolderDataset ds(d / "train", o);
  CHECK(ds.classes() == std::vector<std::string>{"cat", "dog"});
  CHECK(ds.size() == 4);
  fs::create_directories(d.p / "train/empty");
  std::string e = error_of([&] { io::ImageFolderDataset(d / "train", o); });
  CHECK_MESSAGE(contains(e, d / "train/empty" + ": the class folder holds no .jpg"), e);
  fs::remove_all(d.p / "train/empty");
  fs::remove_all(d.p / "train/dog");
  e = error_of([&] { io::ImageFolderDataset(d / "train", o); });
  CHECK_MESSAGE(contains(e, "only one class folder ('cat')"), e);
}

TEST_CASE("image folder: a PNG's chunk CRCs are checked; a PNG cut short is found when the folder is scanned") {
  TempDir d("kiln_img");
  make_folder(d.p.string(), 1);
  write_image(d / "train/cat/flip.png", 20, 16, 90, 90, 90);
  CHECK(io::decode_image(d / "train/cat/flip.png", 3).shape() == Shape{3, 16, 20});
  flip_idat_bit(d / "train/cat/flip.png");
  std::string e = error_of([&] { io::decode_image(d / "train/cat/flip.png", 3); });
  CHECK_MESSAGE(contains(e, d / "train/cat/flip.png" + ": corrupt PNG: chunk IDAT at byte"), e);
  CHECK(contains(e, "fails its CRC check"));
  io::ImageFolderOptions o;
  o.size = 8;
  o.resize = 8;
  io::ImageFolderDataset ds(d / "train", o);  // the headers are sound: found when decoded
  CHECK(ds.size() == 3);
  // Cut short (head -c 50): stbi_info reads its header, but the chunks run past the end.
  write_image(d / "val/dog/cut.png", 20, 16, 90, 90, 90);
  put_bytes(d / "val/dog/cut.png", bytes_of(d / "val/dog/cut.png").substr(0, 50));
  e = error_of([&] { io::ImageFolderDataset(d / "val", o, ds.classes()); });
  CHECK_MESSAGE(contains(e, d / "val/dog/cut.png" + ": corrupt PNG: chunk IDAT at byte 33 runs past the end"), e);
  o.skip_bad = true;
  io::ImageFolderDataset lenient(d / "val", o, ds.classes());
  CHECK(lenient.size() == 2);
  CHECK(lenient.bad_samples() == 1);
}

TEST_CASE("image folder: .ppm/.pgm, other extensions noted, symbolic links followed, a broken one an error") {
  TempDir d("kiln_img");
  make_folder(d.p.string(), 1);
  put_bytes(d / "train/cat/grey.pgm", std::string("P5\n3 2\n255\n") + std::string(6, char(100)));
  put_bytes(d / "train/cat/rgb.ppm", std::string("P6\n2 2\n255\n") + std::string(12, char(30)));
  put_bytes(d / "train/cat/anim.gif", "GIF89a");
  put_bytes(d / "train/dog/a.webp", "RIFF");
  put_bytes(d / "train/dog/b.webp", "RIFF");
  fs::create_directories(d.p / "elsewhere/more");
  write_image(d / "elsewhere/more/m.png", 5, 5, 1, 2, 3);
  write_image(d / "elsewhere/one.bmp", 5, 5, 1, 2, 3);
  fs::create_directory_symlink(d.p / "elsewhere/more", d.p / "train/dog/linked");
  fs::create_symlink(d.p / "elsewhere/one.bmp", d.p / "train/dog/one.bmp");
  io::ImageFolderOptions o;
  o.size = 8;
  o.resize = 8;
  io::ImageFolderDataset ds(d / "train", o);
  CHECK(ds.size() == 6);  // cat: img0.png grey.pgm rgb.ppm; dog: img0.png one.bmp linked/m.png
  std::vector<int64_t> all = {0, 1, 2, 3, 4, 5};
  CHECK(ds.get_batch(all, 0).at("target").to_vector() == std::vector<double>{0, 0, 0, 1, 1, 1});
  CHECK(ds.other_files_note() ==
        d / "train" + ": left out 3 file(s) that are not .jpg, .jpeg, .png, .bmp, .ppm or .pgm (.gif 1, .webp 2)");
  fs::create_symlink(d.p / "elsewhere/gone.png", d.p / "train/cat/gone.png");
  const std::string e = error_of([&] { io::ImageFolderDataset(d / "train", o); });
  CHECK_MESSAGE(contains(e, d / "train/cat/gone.png" + ": a broken symbolic link"), e);
}

TEST_CASE("image folder: a PGM/PPM of maxval below 255 is scaled to 0-255, as PIL") {
  TempDir d("kiln_img");
  fs::create_directories(d.p);
  // The expected values are PIL 13's (Image.open(...).getdata(), .convert('L')): round(v / maxval * 255),
  // half to even (30 -> 76.5 -> 76, 70 -> 178.5 -> 178), a value above maxval 255. Comments in the header.
  const std::string grey =
      std::string("P5\n# a comment\n6 1 # more\n100\n") + std::string("\x00\x01\x1e\x32\x46\x96", 6);
  put_bytes(d / "g.pgm", grey);
  const Tensor g = io::decode_image(d / "g.pgm", 1);
  REQUIRE(g.shape() == Shape{1, 1, 6});
  CHECK(std::vector<int>(g.data<uint8_t>(), g.data<uint8_t>() + 6) == std::vector<int>{0, 3, 76, 128, 178, 255});
  put_bytes(d / "c.ppm", std::string("P6 2 1 100\n") + std::string("\x32\x00\x64\x01\x02\x03", 6));
  const Tensor c = io::decode_image(d / "c.ppm", 3), l = io::decode_image(d / "c.ppm", 1);
  REQUIRE(c.shape() == Shape{3, 1, 2});
  CHECK(std::vector<int>(c.data<uint8_t>(), c.data<uint8_t>() + 6) == std::vector<int>{128, 3, 0, 5, 255, 8});
  CHECK(std::vector<int>(l.data<uint8_t>(), l.data<uint8_t>() + 2) == std::vector<int>{67, 5});
  // maxval 255 keeps every value; maxval 0 PIL refuses.
  std::string all;
  for (int v = 0; v < 256; ++v) all += char(v);
  put_bytes(d / "full.pgm", "P5\n256 1\n255\n" + all);
  const Tensor f = io::decode_image(d / "full.pgm", 1);
  for (int v = 0; v < 256; ++v) CHECK(f.data<uint8_t>()[v] == v);
  put_bytes(d / "zero.pgm", std::string("P5\n1 1\n0\n") + std::string(1, '\0'));
  CHECK(contains(error_of([&] { io::decode_image(d / "zero.pgm", 1); }),
                 "zero.pgm: cannot decode the image (a PGM/PPM maxval of 0"));
}

TEST_CASE("image folder: a PGM/PPM header's numbers are read whole, a cut header is called so") {
  TempDir d("kiln_img");
  fs::create_directories(d.p);
  // A side of 700000 px (over 65535) was read as 70000 then a height of 0: decoded as maxval 1 (all 255).
  std::string pixels(700000, '\0');
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = char(i % 251);
  put_bytes(d / "wide.pgm", "P5\n700000 1\n255\n" + pixels);
  const Tensor g = io::decode_image(d / "wide.pgm", 1);
  REQUIRE(g.shape() == Shape{1, 1, 700000});
  CHECK(std::equal(pixels.begin(), pixels.end(), reinterpret_cast<const char*>(g.data<uint8_t>())));
  put_bytes(d / "wide.ppm", "P6 700000 1 255\n" + std::string(3 * 700000, char(100)));
  const Tensor c = io::decode_image(d / "wide.ppm", 3);
  REQUIRE(c.shape() == Shape{3, 1, 700000});
  CHECK(std::all_of(c.data<uint8_t>(), c.data<uint8_t>() + 3 * 700000, [](uint8_t v) { return v == 100; }));
  // A header cut before its maxval: truncated, not a maxval of 0.
  put_bytes(d / "cut.pgm", "P5\n3 2");
  const std::string e = error_of([&] { io::decode_image(d / "cut.pgm", 1); });
  CHECK_MESSAGE(contains(e, "cut.pgm: cannot decode the image (truncated header"), e);
  CHECK_MESSAGE(!contains(e, "maxval of 0"), e);
  // The folder scan runs the same check: a maxval-0 file is found there, not at its batch.
  make_folder(d / "f", 2);
  put_bytes(d / "f/train/cat/zero.pgm", std::string("P5\n1 1\n0\n") + std::string(1, '\0'));
  CHECK(contains(io::image_header_problem(d / "f/train/cat/zero.pgm"), "a PGM/PPM maxval of 0"));
  CHECK(!io::image_header_problem(d / "cut.pgm").empty());  // stb_image's own refusal of the header
  CHECK(io::image_header_problem(d / "wide.pgm").empty());
  io::ImageFolderOptions o;
  const std::string scan = error_of([&] { io::ImageFolderDataset(d / "f/train", o); });
  CHECK_MESSAGE(contains(scan, "zero.pgm: cannot decode the image (a PGM/PPM maxval of 0"), scan);
}

TEST_CASE("image folder: a 16-bit PGM/PPM (maxval above 255) decodes as PIL's convert") {
  TempDir d("kiln_img");
  fs::create_directories(d.p);
  // Big-endian samples. The expected values are PIL 13's, from these files: a PPM's convert('RGB') is
  // min(255, round(v / maxval * 255)) (half to even: 300 of 1000 is 76.5 -> 76); a PGM is mode I,
  // round(v / maxval * 65535), which convert('L') and convert('RGB') clip to 255.
  const auto be16 = [](const std::vector<int>& vs) {
    std::string b;
    for (int v : vs) b += std::string{char(v >> 8), char(v & 0xff)};
    return b;
  };
  const std::vector<int> vs = {0, 1, 127, 128, 129, 255, 256, 257, 300, 1000};
  std::vector<int> rgb;
  for (int v : vs) rgb.insert(rgb.end(), {v, v, v});
  put_bytes(d / "c.ppm", "P6 10 1 1000\n" + be16(rgb));
  const Tensor c = io::decode_image(d / "c.ppm", 3), cl = io::decode_image(d / "c.ppm", 1);
  REQUIRE(c.shape() == Shape{3, 1, 10});
  const std::vector<int> want_c = {0, 0, 32, 33, 33, 65, 65, 66, 76, 255};
  for (int ch = 0; ch < 3; ++ch)
    CHECK(std::vector<int>(c.data<uint8_t>() + ch * 10, c.data<uint8_t>() + ch * 10 + 10) == want_c);
  CHECK(std::vector<int>(cl.data<uint8_t>(), cl.data<uint8_t>() + 10) == want_c);
  put_bytes(d / "rgb.ppm", "P6 1 1 1000\n" + be16({1000, 500, 100}));
  const Tensor one = io::decode_image(d / "rgb.ppm", 3), onel = io::decode_image(d / "rgb.ppm", 1);
  CHECK(std::vector<int>(one.data<uint8_t>(), one.data<uint8_t>() + 3) == std::vector<int>{255, 128, 26});
  CHECK(onel.data<uint8_t>()[0] == 154);
  const std::vector<int> gv = {0, 1, 127, 128, 129, 255, 256, 257, 300, 1000, 32767, 32768, 65534, 65535};
  put_bytes(d / "g.pgm", "P5 14 1 65535\n" + be16(gv));
  const Tensor g = io::decode_image(d / "g.pgm", 1), g3 = io::decode_image(d / "g.pgm", 3);
  const std::vector<int> want_g = {0, 1, 127, 128, 129, 255, 255, 255, 255, 255, 255, 255, 255, 255};
  CHECK(std::vector<int>(g.data<uint8_t>(), g.data<uint8_t>() + 14) == want_g);
  CHECK(std::vector<int>(g3.data<uint8_t>() + 28, g3.data<uint8_t>() + 42) == want_g);
  put_bytes(d / "g300.pgm", "P5 4 1 300\n" + be16({0, 1, 2, 300}));
  const Tensor h = io::decode_image(d / "g300.pgm", 1);
  CHECK(std::vector<int>(h.data<uint8_t>(), h.data<uint8_t>() + 4) == std::vector<int>{0, 218, 255, 255});
  put_bytes(d / "short.ppm", "P6 2 1 1000\n" + be16({1, 2, 3}));
  const std::string e = error_of([&] { io::decode_image(d / "short.ppm", 3); });
  CHECK_MESSAGE(contains(e, "short.ppm: cut short: a 16-bit PPM of 2x1 needs 12 bytes"), e);
}

TEST_CASE("image folder: --skip-bad-samples counts a bad file once however often it is read") {
  TempDir d("kiln_img");
  make_folder(d.p.string(), 2);
  write_image(d / "train/cat/flip.png", 20, 16, 90, 90, 90);
  flip_idat_bit(d / "train/cat/flip.png");
  io::ImageFolderOptions o;
  o.size = 8;
  o.resize = 8;
  o.skip_bad = true;
  io::ImageFolderDataset ds(d / "train", o);
  REQUIRE(ds.size() == 5);
  const std::vector<int64_t> all = {0, 1, 2, 3, 4};
  for (int epoch = 0; epoch < 3; ++epoch) CHECK(ds.get_batch(all, uint64_t(epoch)).at("input").size(0) == 4);
  CHECK(ds.bad_samples() == 1);
}

TEST_CASE("image folder: --limit-train / --limit-eval take samples spread over the classes, the same each run") {
  TempDir d("kiln_img");
  make_folder(d.p.string(), 2);
  for (const char* cls : {"bird", "fish", "frog"})
    for (const char* split : {"train", "val"}) {
      fs::create_directories(d.p / split / cls);
      for (int i = 0; i < 4; ++i)
        write_image(d / (std::string(split) + "/" + cls + "/" + std::to_string(i) + ".png"), 6, 6, 9, 9, 9);
    }
  tools::TrainConfig c;
  c.data = "folder";
  c.data_dir = d.p.string();
  c.image_size = 8;
  c.limit_train = 6;
  c.limit_eval = 6;
  c.device = "cpu";
  auto classes_in = [](const io::Dataset& ds) {
    std::vector<int64_t> idx(size_t(ds.size()));
    for (size_t i = 0; i < idx.size(); ++i) idx[i] = int64_t(i);
    const auto t = ds.get_batch(idx, 0).at("target").to_vector();
    return std::set<double>(t.begin(), t.end());
  };
  tools::Task t = tools::make_task(c);
  REQUIRE(t.train_data->size() == 6);
  REQUIRE(t.eval_data->size() == 6);
  CHECK(classes_in(*t.train_data).size() >= 3);
  CHECK(classes_in(*t.eval_data).size() >= 3);
  c.seed = 99;
  tools::Task again = tools::make_task(c);
  std::vector<int64_t> idx = {0, 1, 2, 3, 4, 5};
  CHECK(again.eval_data->get_batch(idx, 0).at("target").to_vector() ==
        t.eval_data->get_batch(idx, 0).at("target").to_vector());
}

TEST_CASE("image folder: --set in_channels is read as the model reads it, spaces around key and value too") {
  TempDir d("kiln_img");
  make_folder(d.p.string(), 2);
  tools::TrainConfig c;
  c.data = "folder";
  c.data_dir = d.p.string();
  c.image_size = 8;
  c.device = "cpu";
  // A prefix match of "in_channels=" missed these: the folder loaded 3 channels and the run was
  // refused ("the folder images have 3 channel(s)") for the model's 1.
  const std::pair<const char*, int64_t> cases[] = {
      {" in_channels = 1", 1}, {"in_channels =1", 1}, {"in_channels=1", 1}, {" in_channels=3 ", 3}};
  const std::vector<int64_t> first = {0};
  for (const auto& one : cases) {
    CAPTURE(one.first);
    c.sets = {"in_channels=3", one.first};  // the last one wins, as in the model's config
    tools::Task t = tools::make_task(c);
    CHECK(t.train_data->get_batch(first, 0).at("input").size(1) == one.second);
    CHECK(t.eval_data->get_batch(first, 0).at("input").size(1) == one.second);
  }
}

TEST_CASE("train: a bad validation image after an epoch keeps its checkpoint; a bad header stops before work") {
  TempDir d("kiln_img");
  make_folder(d.p.string(), 6);
  write_image(d / "val/dog/flip.png", 20, 16, 90, 90, 90);
  flip_idat_bit(d / "val/dog/flip.png");
  const std::string flags = "train --model resnet20 --data folder --data-dir " + d.p.string() +
                            " --image-size 16 --batch 4 --epochs 2 --threads 1 --progress lines --out ";
  const std::string common = flags + d / "run";
  auto r = kiln::testing::run_kiln(common, d.p.string());
  CHECK(r.code == 1);
  CHECK_MESSAGE(contains(r.output, "flip.png: corrupt PNG: chunk IDAT"), r.output);
  CHECK_MESSAGE(contains(r.output, "evaluation after epoch 1 failed; saved the trained epoch as"), r.output);
  REQUIRE(fs::exists(d.p / "run/checkpoints/latest"));
  // Fixed, the run goes on from there: the first epoch is evaluated again, then the second trained.
  write_image(d / "val/dog/flip.png", 20, 16, 90, 90, 90);
  r = kiln::testing::run_kiln(common + " --resume auto", d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  CHECK(contains(r.output, "resumed at step 3"));
  CHECK(contains(r.output, "epoch 1:"));
  CHECK(contains(r.output, "epoch 2:"));
  // At the run's last step (--max-steps): the resumed run still owes that evaluation, and does it.
  flip_idat_bit(d / "val/dog/flip.png");
  r = kiln::testing::run_kiln(flags + d / "run3 --max-steps 2", d.p.string());
  CHECK_MESSAGE(contains(r.output, "evaluation after epoch 1 failed; saved"), r.output);
  flip_idat_bit(d / "val/dog/flip.png");  // flipped back
  r = kiln::testing::run_kiln(flags + d / "run3 --max-steps 2 --resume auto", d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  CHECK_MESSAGE(contains(r.output, "epoch 1:"), r.output);
  CHECK(nlohmann::json::parse(kiln::testing::read_text(d / "run3/summary.json"))["test_samples"] == 13);
  // A header stb_image cannot read: the error names the file before any training.
  put_bytes(d / "val/dog/flip.png", "not a png");
  r = kiln::testing::run_kiln(flags + d / "run2", d.p.string());
  CHECK(r.code == 2);
  CHECK_MESSAGE(contains(r.output, d / "val/dog/flip.png" + ": cannot decode the image"), r.output);
  CHECK_MESSAGE(!contains(r.output, "step 1"), r.output);
}

// A resume does not compare --data-dir's path but what the folder holds (its files' names and sizes):
// a copy continues the run, another folder with the same classes and counts is refused, naming it.
TEST_CASE("train: a resume from an image folder compares its files, not its path") {
  TempDir d("kiln_img_resume");
  make_folder((d.p / "a").string(), 4);
  fs::copy(d.p / "a", d.p / "b", fs::copy_options::recursive);
  fs::copy(d.p / "a", d.p / "c", fs::copy_options::recursive);
  write_image(d / "c/train/dog/img1.bmp", 30, 30, 90, 90, 90);  // the same names and counts, another image
  const std::string flags =
      "train --model resnet20 --data folder --image-size 16 --batch 4 --max-steps 2 --save-every 1 --threads 1 "
      "--no-tensorboard --data-dir ";
  auto r = kiln::testing::run_kiln(flags + d / "a --out " + d / "run", d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  const std::string ckpt = d / "run/checkpoints/step-000000001.kiln";
  r = kiln::testing::run_kiln(flags + d / "b --resume " + ckpt + " --out " + d / "copy", d.p.string());
  CHECK_MESSAGE(r.code == 0, r.output);
  CHECK_MESSAGE(contains(r.output, "resumed at step 1"), r.output);
  r = kiln::testing::run_kiln(flags + d / "c --resume " + ckpt + " --out " + d / "other", d.p.string());
  CHECK_MESSAGE(r.code == 2, r.output);
  CHECK_MESSAGE(contains(r.output, "data contents: checkpoint [\"train/: 8 files, "), r.output);
  CHECK_MESSAGE(contains(r.output, "first difference at entry 0"), r.output);
}

// An image folder's data_info.contents entry as versions before the sub-folder order change wrote it:
// the files' paths below `dir`, sorted, and sizes, hashed (FNV-1a 64).
std::string sorted_fingerprint(const fs::path& dir, const std::string& label) {
  std::vector<std::pair<std::string, uint64_t>> files;
  uint64_t total = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) {
      files.emplace_back(e.path().lexically_relative(dir).generic_string(), uint64_t(e.file_size()));
      total += files.back().second;
    }
  std::sort(files.begin(), files.end());
  uint64_t h = 14695981039346656037ull;
  for (const auto& f : files)
    for (const char ch : f.first + "\t" + std::to_string(f.second) + "\n")
      h = (h ^ static_cast<unsigned char>(ch)) * 1099511628211ull;
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return label + ": " + std::to_string(files.size()) + " files, " + std::to_string(total) + " bytes, names and sizes " +
         hex;
}

// A folder with files in a class folder's sub-folders changed its sample order (a class folder's own
// files first): a checkpoint fingerprinting it the old way (sorted) must not resume on the new
// index -> file mapping. A folder without sub-folders keeps its old fingerprint, so its runs resume.
TEST_CASE("train: a resume from an image folder with sub-folders compares its files in sample order") {
  TempDir d("kiln_img_nested");
  make_folder((d.p / "a").string(), 4);
  fs::create_directories(d.p / "a/train/dog/b");
  write_image(d / "a/train/dog/b/x.bmp", 20, 16, 90, 90, 90);  // before dog/img0.png sorted, after it now
  const std::string flags =
      "train --model resnet20 --data folder --image-size 16 --batch 4 --max-steps 1 --save-every 1 --threads 1 "
      "--no-tensorboard --data-dir ";
  auto r = kiln::testing::run_kiln(flags + d / "a --out " + d / "run", d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  const std::string ckpt = d / "run/checkpoints/step-000000001.kiln";
  std::vector<std::pair<std::string, Tensor>> tensors;
  std::string js;
  {
    io::CheckpointReader reader(ckpt);
    for (const auto& e : reader.entries()) tensors.emplace_back(e.name, reader.read(e.name));
    js = reader.state_json();
  }
  const size_t at = js.find("\"train/: ");
  REQUIRE(at != std::string::npos);
  const std::string entry = js.substr(at + 1, js.find('"', at + 1) - at - 1);
  const std::string old = sorted_fingerprint(d.p / "a/train", "train/");
  CHECK_MESSAGE(entry != old, entry);
  CHECK_MESSAGE(contains(entry, "train/: 9 files, "), entry);
  // The checkpoint as the old order's version would have written it: refused, naming the contents.
  js.replace(at + 1, entry.size(), old);
  io::save_checkpoint(d / "old.kiln", tensors, js);
  r = kiln::testing::run_kiln(flags + d / "a --resume " + d / "old.kiln --out " + d / "old", d.p.string());
  CHECK_MESSAGE(r.code == 2, r.output);
  CHECK_MESSAGE(contains(r.output, "data contents: checkpoint [\"" + old + "\""), r.output);
  // The val/ folder has no sub-folders: its entry is the sorted one, as older versions wrote it.
  CHECK_MESSAGE(contains(js, "\"" + sorted_fingerprint(d.p / "a/val", "val/") + "\""), js);
}

TEST_CASE("train: an image folder's class names and image size travel with the weights to kiln eval") {
  TempDir d("kiln_img");
  make_folder(d.p.string(), 4);
  const std::string data = " --model resnet20 --data folder --data-dir " + d.p.string() + " --threads 1";
  auto r = kiln::testing::run_kiln(
      "train" + data + " --image-size 16 --batch 4 --max-steps 1 --save-every 1 --progress lines --out " + d / "run",
      d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  // The weights kiln ckpt export takes from the run's checkpoint carry them too.
  r = kiln::testing::run_kiln(
      "ckpt export " + d / "run/checkpoints/step-000000001.kiln --safetensors " + d / "exp.safetensors", d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  fs::rename(d.p / "train", d.p / "train.away");  // not needed: the names come with the weights
  r = kiln::testing::run_kiln("eval" + data + " --weights " + d / "run/model.safetensors" + " --out " + d / "e.json",
                              d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  const auto j = nlohmann::json::parse(kiln::testing::read_text(d / "e.json"));
  CHECK(j["data"]["image_size"] == 16);
  CHECK(j["data"]["classes"] == nlohmann::json({"cat", "dog"}));
  CHECK(j["test_samples"] == 8);
  r = kiln::testing::run_kiln("eval" + data + " --weights " + d / "exp.safetensors" + " --out " + d / "exp.json",
                              d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  const auto je = nlohmann::json::parse(kiln::testing::read_text(d / "exp.json"));
  CHECK(je["data"] == j["data"]);
  CHECK(je["test_loss"] == j["test_loss"]);
  // A size given explicitly wins, with a warning.
  r = kiln::testing::run_kiln(
      "eval" + data + " --image-size 24 --weights " + d / "run/model.safetensors" + " --out " + d / "e24.json",
      d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  CHECK_MESSAGE(
      contains(r.output, "--image-size 24, but " + d / "run/model.safetensors" + " was trained with --image-size 16"),
      r.output);
  CHECK(nlohmann::json::parse(kiln::testing::read_text(d / "e24.json"))["data"]["image_size"] == 24);
  fs::create_directories(d.p / "val/bird");
  write_image(d / "val/bird/b.png", 5, 5, 1, 2, 3);
  r = kiln::testing::run_kiln("eval" + data + " --weights " + d / "run/model.safetensors", d.p.string());
  CHECK(r.code == 2);
  CHECK_MESSAGE(contains(r.output, "class 'bird' is not among the training classes"), r.output);
  fs::remove_all(d.p / "val/bird");
  // Damaged metadata is named with the file and the key.
  std::string b = bytes_of(d / "run/model.safetensors");
  const size_t key = b.find("\"image_size\"");
  REQUIRE(key != std::string::npos);
  const size_t v = b.find("\"16\"", key);
  REQUIRE(v != std::string::npos);
  b.replace(v, 4, "\"1x\"");  // the same length: the header stays well formed
  put_bytes(d / "run/model.safetensors", b);
  r = kiln::testing::run_kiln("eval" + data + " --weights " + d / "run/model.safetensors", d.p.string());
  CHECK(r.code == 2);
  CHECK_MESSAGE(contains(r.output, d / "run/model.safetensors" + ": damaged metadata: image_size is '1x'"), r.output);
}

TEST_CASE("train: an image folder's --mean/--std are kept by a resume and travel with the weights to kiln eval") {
  TempDir d("kiln_img");
  make_folder(d.p.string(), 4);
  const std::string data =
      " --model resnet20 --data folder --data-dir " + d.p.string() + " --threads 1 --image-size 16";
  const std::string train = "train" + data + " --batch 4 --max-steps 1 --save-every 1 --no-tensorboard";
  auto r = kiln::testing::run_kiln(train + " --mean 0.5 --std 0.25,0.5,0.25 --out " + d / "run", d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  // kiln eval normalises as the run did, unless told otherwise (then with a warning).
  const std::string weights = d / "run/model.safetensors";
  r = kiln::testing::run_kiln("eval" + data + " --weights " + weights + " --out " + d / "e.json", d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  const auto j = nlohmann::json::parse(kiln::testing::read_text(d / "e.json"));
  CHECK(j["data"]["mean"] == nlohmann::json({0.5, 0.5, 0.5}));
  CHECK(j["data"]["std"] == nlohmann::json({0.25, 0.5, 0.25}));
  r = kiln::testing::run_kiln(
      "eval" + data + " --mean 0.5,0.5,0.5 --std 0.25,0.5,0.25 --weights " + weights + " --out " + d / "same.json",
      d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  CHECK_MESSAGE(!contains(r.output, "warning"), r.output);
  CHECK(nlohmann::json::parse(kiln::testing::read_text(d / "same.json"))["test_loss"] == j["test_loss"]);
  r = kiln::testing::run_kiln(
      "eval" + data + " --mean 0.485,0.456,0.406 --weights " + weights + " --out " + d / "o.json", d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  CHECK_MESSAGE(contains(r.output, "--mean 0.485,0.456,0.406, but " + weights + " was trained with --mean 0.5,0.5,0.5"),
                r.output);
  const auto o = nlohmann::json::parse(kiln::testing::read_text(d / "o.json"));
  CHECK(o["data"]["mean"] == nlohmann::json({0.485, 0.456, 0.406}));
  CHECK(o["data"]["std"] == j["data"]["std"]);
  CHECK(o["test_loss"] != j["test_loss"]);
  // A resume with other values is refused, naming both; with the same ones it continues.
  const std::string ckpt = d / "run/checkpoints/step-000000001.kiln";
  r = kiln::testing::run_kiln(train + " --mean 0.5 --std 0.25,0.5,0.25 --resume " + ckpt + " --out " + d / "again",
                              d.p.string());
  CHECK_MESSAGE(r.code == 0, r.output);
  r = kiln::testing::run_kiln(train + " --resume " + ckpt + " --out " + d / "imagenet", d.p.string());
  CHECK_MESSAGE(r.code == 2, r.output);
  CHECK_MESSAGE(contains(r.output, "data mean: checkpoint [0.5,0.5,0.5], now [0.485,0.456,0.406]"), r.output);
  CHECK_MESSAGE(contains(r.output, "data std: checkpoint [0.25,0.5,0.25], now [0.229,0.224,0.225]"), r.output);
  // Bad values name the flag and what is wrong. A config file's array is the flag's R,G,B.
  std::ofstream(d / "two.json") << R"({"mean": [0.5, 0.5]})";
  std::ofstream(d / "three.json") << R"({"mean": [0.5, 0.5, 0.5], "std": [0.25, 0.5, 0.25]})";
  r = kiln::testing::run_kiln(train + " --config " + d / "three.json" + " --resume " + ckpt + " --out " + d / "cfg",
                              d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  for (const auto& bad : std::vector<std::pair<std::string, std::string>>{
           {"--mean 0.1,0.2", "--mean '0.1,0.2': 2 values; give one (grey, or every channel) or three (R,G,B)"},
           {"--std 0.2,0,0.2", "--std '0.2,0,0.2': 0 is not above 0"},
           {"--std=-1", "--std '-1': -1 is not above 0"},
           {"--mean 0.5,x,0.5", "--mean '0.5,x,0.5': 'x' is not a finite number"},
           {"--mean nan", "--mean 'nan': 'nan' is not a finite number"},
           {"--mean 0.5,", "--mean '0.5,': '' is not a finite number"},
           {"--std 1e-320", "--std '1e-320': 1e-320 is too small: below the smallest normal double"},
           {"--mean ''", "--mean: an empty value; give one value or three (R,G,B), or leave the flag out"},
           {"--config " + d / "two.json", "--mean '0.5,0.5': 2 values; give one (grey, or every channel)"},
           {"--set in_channels=1 --mean 0.1,0.2,0.3",
            "--mean '0.1,0.2,0.3': 3 values, but the images load as 1 channel (grey, --set in_channels=1)"}}) {
    r = kiln::testing::run_kiln(train + " " + bad.first + " --out " + d / "bad", d.p.string());
    CHECK_MESSAGE(r.code == 2, bad.first, r.output);
    CHECK_MESSAGE(contains(r.output, bad.second), bad.first, r.output);
  }
  // Grey images take ImageNet's grey values by default, and one value given.
  r = kiln::testing::run_kiln(train + " --set in_channels=1 --std 0.3 --out " + d / "grey", d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  r = kiln::testing::run_kiln("eval" + data + " --weights " + d / "grey/model.safetensors --out " + d / "g.json",
                              d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  const auto g = nlohmann::json::parse(kiln::testing::read_text(d / "g.json"));
  CHECK(g["data"]["mean"] == nlohmann::json({0.449}));
  CHECK(g["data"]["std"] == nlohmann::json({0.3}));
  // Only image folders normalise with them.
  r = kiln::testing::run_kiln(
      "train --model resnet20 --data mnist --data-dir " + d.p.string() + " --mean 0.5 --out " + d / "mnist",
      d.p.string());
  CHECK(r.code == 2);
  CHECK_MESSAGE(contains(r.output,
                         "--mean: --mean/--std are for --data folder; MNIST and Fashion-MNIST normalise "
                         "with their own fixed values"),
                r.output);
  CHECK_MESSAGE(!contains(r.output, "at their own size"), r.output);
}

TEST_CASE("train: kiln eval --data mnist reads only the t10k files") {
  TempDir d("kiln_img");
  auto idx = [&](const std::string& name, std::vector<uint32_t> dims, const std::string& payload) {
    std::string b = {0, 0, 8, char(dims.size())};
    for (uint32_t n : dims) b += std::string{char(n >> 24), char(n >> 16), char(n >> 8), char(n)};
    std::ofstream(d / name, std::ios::binary) << b + payload;
  };
  std::string px(16 * 28 * 28, '\0'), labels;
  for (int i = 0; i < 16; ++i) {
    labels += char(i % 10);
    px[size_t(i * 784 + 100 + i)] = char(255);
  }
  for (const char* split : {"train", "t10k"}) {
    idx(std::string(split) + "-images-idx3-ubyte", {16, 28, 28}, px);
    idx(std::string(split) + "-labels-idx1-ubyte", {16}, labels);
  }
  const std::string data = " --model resnet20 --data mnist --data-dir " + d.p.string() + " --threads 1";
  auto r = kiln::testing::run_kiln("train" + data + " --batch 8 --max-steps 1 --progress lines --out " + d / "run",
                                   d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  fs::remove(d.p / "train-images-idx3-ubyte");
  fs::remove(d.p / "train-labels-idx1-ubyte");
  r = kiln::testing::run_kiln("eval" + data + " --weights " + d / "run/model.safetensors", d.p.string());
  CHECK_MESSAGE(r.code == 0, r.output);
  CHECK_MESSAGE(contains(r.output, "(16 samples"), r.output);
}

TEST_CASE("image folder: a symbolic link that loops or leads into another class is an error naming it") {
  TempDir d("kiln_img");
  make_folder(d.p.string(), 1);
  io::ImageFolderOptions o;
  o.size = 8;
  o.resize = 8;
  // A loop: before, the files were listed again and again until ELOOP, then a std::filesystem_error.
  fs::create_directory_symlink(".", d.p / "train/cat/self");
  std::string e = error_of([&] { io::ImageFolderDataset(d / "train", o); });
  CHECK_MESSAGE(contains(e, d / "train/cat/self" + ": a symbolic link to "), e);
  CHECK_MESSAGE(contains(e, "a folder it is inside"), e);
  fs::remove(d.p / "train/cat/self");
  // Into a sibling class: before, dog's images were read under both labels, silently.
  fs::create_directory_symlink("../dog", d.p / "train/cat/more");
  e = error_of([&] { io::ImageFolderDataset(d / "train", o); });
  CHECK_MESSAGE(contains(e, d / "train/cat/more" + ": a symbolic link into the class folder 'dog'"), e);
  fs::remove(d.p / "train/cat/more");
  // A link to itself (ELOOP): a std::filesystem_error before, now a Kiln error naming the flag and the link.
  fs::create_symlink("knot", d.p / "train/cat/knot");
  e = error_of([&] { io::ImageFolderDataset(d / "train", o); });  // "NOT A kiln::Error" before
  CHECK_MESSAGE(contains(e, d / "train" + ": cannot read the image folder (--data-dir): " + d / "train/cat/knot"), e);
  fs::remove(d.p / "train/cat/knot");
  // Two links to one folder: read once, the second left out with a note.
  fs::create_directories(d.p / "elsewhere");
  write_image(d / "elsewhere/x.png", 5, 5, 1, 2, 3);
  fs::create_directory_symlink(d.p / "elsewhere", d.p / "train/cat/a");
  fs::create_directory_symlink(d.p / "elsewhere", d.p / "train/cat/b");
  io::ImageFolderDataset ds(d / "train", o);
  CHECK(ds.size() == 3);  // cat: a/x.png img0.png; dog: img0.png
  REQUIRE(ds.notes().size() == 1);
  CHECK_MESSAGE(contains(ds.notes()[0], d / "train/cat/b" + ": left out"), ds.notes()[0]);
  // The same folder linked from two classes: its images would get two labels.
  fs::create_directory_symlink(d.p / "elsewhere", d.p / "train/dog/c");
  e = error_of([&] { io::ImageFolderDataset(d / "train", o); });
  CHECK_MESSAGE(contains(e, d / "train/dog/c" + ": a link to "), e);
  CHECK_MESSAGE(contains(e, "which the class 'cat' reads already"), e);
  fs::remove(d.p / "train/dog/c");
  // A file linked into another class, and a link to a folder that holds a class folder.
  fs::create_symlink(d.p / "train/dog/img0.png", d.p / "train/cat/stolen.png");
  e = error_of([&] { io::ImageFolderDataset(d / "train", o); });
  CHECK_MESSAGE(contains(e, d / "train/cat/stolen.png" + ": a symbolic link into the class folder 'dog'"), e);
  fs::remove(d.p / "train/cat/stolen.png");
  fs::create_directories(d.p / "animals");
  fs::rename(d.p / "train/dog", d.p / "animals/dog");
  fs::create_directory_symlink(d.p / "animals/dog", d.p / "train/dog");
  fs::create_directory_symlink(d.p / "animals", d.p / "train/cat/all");
  e = error_of([&] { io::ImageFolderDataset(d / "train", o); });
  CHECK_MESSAGE(contains(e, d / "train/cat/all" + ": a symbolic link to "), e);
  CHECK_MESSAGE(contains(e, "which holds the class folder 'dog'"), e);
}

TEST_CASE("image folder: an empty validation class folder is a note; an empty training one an error") {
  TempDir d("kiln_img");
  make_folder(d.p.string(), 1);
  io::ImageFolderOptions o;
  o.size = 8;
  o.resize = 8;
  io::ImageFolderDataset train(d / "train", o);
  fs::remove_all(d.p / "val/dog");
  fs::create_directories(d.p / "val/dog");
  io::ImageFolderDataset val(d / "val", o, train.classes());
  CHECK(val.size() == 1);
  REQUIRE(val.notes().size() == 1);
  CHECK_MESSAGE(contains(val.notes()[0], d / "val/dog" + ": the class folder holds no images"), val.notes()[0]);
  fs::remove_all(d.p / "train/dog");
  fs::create_directories(d.p / "train/dog");
  CHECK(contains(error_of([&] { io::ImageFolderDataset(d / "train", o); }), "the class folder holds no .jpg"));
}

TEST_CASE("image folder: PNG rules as libpng's: an ancillary chunk's bad CRC and a missing IEND are accepted") {
  TempDir d("kiln_img");
  make_folder(d.p.string(), 1);
  write_image(d / "train/cat/p.png", 20, 16, 90, 90, 90);
  const std::string good = bytes_of(d / "train/cat/p.png");
  const size_t idat = good.find("IDAT") - 4;
  // A tEXt chunk with a wrong CRC before the image data: libpng warns, PIL reads it.
  std::string text = png_chunk("tEXt", std::string("Comment\0hi", 10));
  text[text.size() - 1] = char(text.back() ^ 1);
  put_bytes(d / "train/cat/p.png", good.substr(0, idat) + text + good.substr(idat));
  CHECK(io::decode_image(d / "train/cat/p.png", 3).shape() == Shape{3, 16, 20});
  // A critical one's is still an error.
  std::string ihdr_bad = good;
  ihdr_bad[8 + 8 + 12] = char(ihdr_bad[8 + 8 + 12] ^ 1);  // IHDR's CRC
  put_bytes(d / "train/cat/q.png", ihdr_bad);
  CHECK(contains(error_of([&] { io::decode_image(d / "train/cat/q.png", 3); }), "chunk IHDR at byte 8 fails its CRC"));
  fs::remove(d.p / "train/cat/q.png");
  // No IEND after the image data (ends at a chunk boundary): decoded, and passes the header check.
  const size_t iend = good.find("IEND") - 4;
  put_bytes(d / "train/cat/n.png", good.substr(0, iend));
  CHECK(io::decode_image(d / "train/cat/n.png", 3).shape() == Shape{3, 16, 20});
  CHECK(io::image_header_problem(d / "train/cat/n.png") == "");
  io::ImageFolderOptions o;
  o.size = 8;
  o.resize = 8;
  CHECK(io::ImageFolderDataset(d / "train", o).size() == 4);
  // Cut inside a chunk: still an error, in both the header check and the decode.
  put_bytes(d / "train/cat/n.png", good.substr(0, iend + 5));
  CHECK(contains(io::image_header_problem(d / "train/cat/n.png"), "corrupt PNG: cut short"));
  CHECK(contains(error_of([&] { io::decode_image(d / "train/cat/n.png", 3); }), "corrupt PNG: cut short"));
}

TEST_CASE("image folder: grey is PIL's convert('L'), rounded; a grey PNG keeps its values") {
  TempDir d("kiln_img");
  fs::create_directories(d.p);
  // Every (r, g, b) here is where stb_image's truncating (77 r + 150 g + 29 b) >> 8 and PIL's rounded
  // L differ or sit at an edge; and 64 more pseudo-random pixels.
  std::vector<unsigned char> rgb = {255, 0, 0, 0, 255, 0, 0, 0, 255, 255, 255, 255, 0, 0, 0, 1, 2, 3, 200, 100, 50};
  uint32_t x = 12345;
  for (int i = 0; i < 64 * 3; ++i) {
    x = x * 1664525u + 1013904223u;
    rgb.push_back(static_cast<unsigned char>(x >> 24));
  }
  const int w = int(rgb.size() / 3);
  REQUIRE(stbi_write_png((d / "rgb.png").c_str(), w, 1, 3, rgb.data(), w * 3));
  std::vector<unsigned char> rgba;
  for (int i = 0; i < w; ++i) {
    rgba.insert(rgba.end(), rgb.begin() + 3 * i, rgb.begin() + 3 * i + 3);
    rgba.push_back(static_cast<unsigned char>(i * 37));  // alpha is dropped, as PIL's convert('L')
  }
  REQUIRE(stbi_write_png((d / "rgba.png").c_str(), w, 1, 4, rgba.data(), w * 4));
  int differ = 0;
  for (const char* file : {"rgb.png", "rgba.png"}) {
    const Tensor g = io::decode_image(d / file, 1);
    REQUIRE(g.shape() == Shape{1, 1, w});
    for (int i = 0; i < w; ++i) {
      const unsigned r = rgb[size_t(3 * i)], gr = rgb[size_t(3 * i + 1)], b = rgb[size_t(3 * i + 2)];
      const unsigned pil = (19595 * r + 38470 * gr + 7471 * b + 0x8000) >> 16;  // PIL's L24 >> 16
      differ += pil != (77 * r + 150 * gr + 29 * b) >> 8;
      CHECK_MESSAGE(g.data<uint8_t>()[i] == pil, std::string(file), " pixel ", i, " (", r, ", ", gr, ", ", b, ")");
    }
  }
  CHECK(differ > 0);  // the test would not tell the two conversions apart otherwise
  // A grey PNG: every value kept, in one channel or three.
  std::vector<unsigned char> grey(256);
  for (int i = 0; i < 256; ++i) grey[size_t(i)] = static_cast<unsigned char>(i);
  REQUIRE(stbi_write_png((d / "grey.png").c_str(), 256, 1, 1, grey.data(), 256));
  const Tensor g1 = io::decode_image(d / "grey.png", 1), g3 = io::decode_image(d / "grey.png", 3);
  for (int i = 0; i < 256; ++i) {
    CHECK(g1.data<uint8_t>()[i] == i);
    for (int c = 0; c < 3; ++c) CHECK(g3.data<uint8_t>()[c * 256 + i] == i);
  }
}

TEST_CASE("image folder: a class folder's own files come before its sub-folders', as torchvision's ImageFolder") {
  TempDir d("kiln_img");
  // torchvision lists sorted(os.walk(class folder)): by folder path, then each folder's files by name.
  // Folder paths sort "c", "c/b", "c/b-x", "c/b/d" ('-' comes before '/').
  for (const char* f : {"c/z.png", "c/a.png", "c/b/x.png", "c/b/d/w.png", "c/b-x/y.png", "other/o.png"}) {
    fs::create_directories((d.p / "train" / f).parent_path());
    write_image((d.p / "train" / f).string(), 4, 4, 1, 2, 3);
  }
  io::ImageFolderOptions o;
  o.size = 4;
  o.resize = 4;
  io::ImageFolderDataset ds(d / "train", o);
  std::vector<std::string> got;
  for (int64_t i = 0; i < ds.size(); ++i) got.push_back(fs::relative(ds.file(i), d.p / "train").string());
  CHECK(got ==
        std::vector<std::string>{"c/a.png", "c/z.png", "c/b/x.png", "c/b-x/y.png", "c/b/d/w.png", "other/o.png"});
}

TEST_CASE("Fashion-MNIST: an interrupt while it is read stays an interrupt, without the install hint") {
  // kiln.train's Ctrl-C during the read was reported as an error with "apt-get install
  // dataset-fashion-mnist" appended (the package was installed), and Python's KeyboardInterrupt lost
  // its message. The hint is for a missing folder only.
  tools::TrainConfig c;
  c.data = "fashion-mnist";
  c.limit_train = 4;
  c.limit_eval = 4;
  c.device = "cpu";
  set_interrupt_poll([] { return true; });
  std::string what;
  bool interrupted = false;
  try {
    tools::make_task(c);
  } catch (const Interrupted& e) {
    interrupted = true;
    what = e.what();
  } catch (const Error& e) {
    what = e.what();
  }
  set_interrupt_poll(nullptr);
  CHECK_MESSAGE(interrupted, what);
  CHECK_MESSAGE(what.find("apt-get") == std::string::npos, what);
  c.data_dir = "/nonexistent/kiln-fashion";  // a folder given: its own error, no package hint
  CHECK_THROWS_WITH(tools::make_task(c), doctest::Contains("/nonexistent/kiln-fashion"));
}

TEST_CASE("train: a class folder whose name is not UTF-8 resumes, agrees across ranks and is found by kiln eval") {
  // The saved JSON (checkpoint config, weights' labels, rank 0's broadcast) names the class $'cat\xff' as
  // "cat\uFFFD" while the live value keeps the byte: a resume was refused ("data classes: checkpoint
  // ["cat�","dog"], now ["cat�","dog"]"), rank 1 of two "reads other data than rank 0", and kiln eval
  // said "class 'cat�' is not among the training classes".
  TempDir d("kiln_img_utf8");
  make_folder(d.p.string(), 4);
  for (const char* split : {"train", "val"}) fs::rename(d.p / split / "cat", d.p / split / "cat\xff");
  const std::string data = " --model resnet20 --data folder --data-dir " + d.p.string() +
                           " --threads 1 --workers 0 --image-size 16 --batch 4",
                    train = "train" + data + " --progress lines --no-tensorboard --max-steps 2 --save-every 1";
  auto r = kiln::testing::run_kiln(train + " --out " + d / "run", d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  fs::remove(d.p / "run/checkpoints/step-000000002.kiln");
  fs::remove(d.p / "run/summary.json");
  r = kiln::testing::run_kiln(train + " --resume auto --out " + d / "run", d.p.string());
  CHECK_MESSAGE(r.code == 0, r.output);
  CHECK_MESSAGE(contains(r.output, "resumed at step 1"), r.output);
  CHECK_MESSAGE(!contains(r.output, "another configuration"), r.output);
  r = kiln::testing::run_kiln("eval" + data + " --weights " + d / "run/model.safetensors" + " --out " + d / "e.json",
                              d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  const auto j = nlohmann::json::parse(kiln::testing::read_text(d / "e.json"));
  CHECK(j["data"]["classes"] == nlohmann::json({"cat\xef\xbf\xbd", "dog"}));  // U+FFFD for the byte 0xFF
  CHECK(j["test_samples"] == 8);
  // Two ranks read the same folder and agree on its classes.
  r = kiln::testing::run_kiln("launch --nproc-per-node 2 --master-port " + std::to_string(kiln::testing::free_port()) +
                                  " -- kiln " + train + " --limit-train 16 --out " + d / "two",
                              d.p.string());
  CHECK_MESSAGE(r.code == 0, r.output);
  CHECK_MESSAGE(!contains(r.output, "reads other data"), r.output);
  CHECK(fs::exists(d / "two/model.safetensors"));
}
