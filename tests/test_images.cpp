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

#include <filesystem>
#include <nlohmann/json.hpp>

#include "io/images.h"
#include "kiln.h"
#include "test_util.h"

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
  io::ImageFolderDataset strict(d / "train", o);
  std::vector<int64_t> all(size_t(strict.size()));
  for (size_t i = 0; i < all.size(); ++i) all[i] = int64_t(i);
  CHECK(contains(error_of([&] { strict.get_batch(all, 0); }), "broken.png: cannot decode the image"));
  o.skip_bad = true;
  io::ImageFolderDataset lenient(d / "train", o);
  const io::Batch b = lenient.get_batch(all, 0);
  CHECK(b.at("input").size(0) == strict.size() - 1);
  CHECK(lenient.bad_samples() == 1);
}

TEST_CASE("image folder: an empty image file is called empty, not of an unknown type") {
  TempDir d("kiln_img");
  std::ofstream(d / "empty.png").flush();
  const std::string e = error_of([&] { io::decode_image(d / "empty.png", 3); });
  CHECK_MESSAGE(contains(e, d / "empty.png" + ": the file is empty (0 bytes), not an image"), e);
  std::ofstream(d / "junk.png") << "not an image";
  CHECK(contains(error_of([&] { io::decode_image(d / "junk.png", 3); }), "junk.png: cannot decode the image"));
}

TEST_CASE("resize_bilinear: identity at the same size, averages when halving a ramp") {
  std::vector<float> src(16);
  for (int i = 0; i < 16; ++i) src[size_t(i)] = float(i % 4);  // columns 0 1 2 3
  std::vector<float> same(16), half(4);
  io::resize_bilinear(src.data(), 1, 4, 4, 0, 0, 4, 4, same.data(), 4, 4);
  CHECK(same == src);
  io::resize_bilinear(src.data(), 1, 4, 4, 0, 0, 4, 4, half.data(), 2, 2);
  CHECK(half[0] == doctest::Approx(0.5));
  CHECK(half[1] == doctest::Approx(2.5));
}

TEST_CASE("train: ResNet on an image folder; a corrupt image stops the run or is skipped with the flag") {
  TempDir d("kiln_img");
  make_folder(d.p.string(), 6);
  std::ofstream(d / "train/cat/broken.jpg") << "not a jpeg";
  const std::string common = "train --model resnet20 --data folder --data-dir " + d.p.string() +
                             " --image-size 16 --batch 4 --epochs 1 --threads 1 --progress lines --out " + d / "run";
  auto r = kiln::testing::run_kiln(common, d.p.string());
  CHECK(r.code == 1);
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
