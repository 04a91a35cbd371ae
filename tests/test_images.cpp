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

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

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
  CHECK(ds.size() == 6);  // cat: img0.png grey.pgm rgb.ppm; dog: img0.png linked/m.png one.bmp
  std::vector<int64_t> all = {0, 1, 2, 3, 4, 5};
  CHECK(ds.get_batch(all, 0).at("target").to_vector() == std::vector<double>{0, 0, 0, 1, 1, 1});
  CHECK(ds.other_files_note() ==
        d / "train" + ": left out 3 file(s) that are not .jpg, .jpeg, .png, .bmp, .ppm or .pgm (.gif 1, .webp 2)");
  fs::create_symlink(d.p / "elsewhere/gone.png", d.p / "train/cat/gone.png");
  const std::string e = error_of([&] { io::ImageFolderDataset(d / "train", o); });
  CHECK_MESSAGE(contains(e, d / "train/cat/gone.png" + ": a broken symbolic link"), e);
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

TEST_CASE("train: an image folder's class names and image size travel with the weights to kiln eval") {
  TempDir d("kiln_img");
  make_folder(d.p.string(), 4);
  const std::string data = " --model resnet20 --data folder --data-dir " + d.p.string() + " --threads 1";
  auto r = kiln::testing::run_kiln(
      "train" + data + " --image-size 16 --batch 4 --max-steps 1 --progress lines --out " + d / "run", d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  fs::rename(d.p / "train", d.p / "train.away");  // not needed: the names come with the weights
  r = kiln::testing::run_kiln("eval" + data + " --weights " + d / "run/model.safetensors" + " --out " + d / "e.json",
                              d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  const auto j = nlohmann::json::parse(kiln::testing::read_text(d / "e.json"));
  CHECK(j["data"]["image_size"] == 16);
  CHECK(j["data"]["classes"] == nlohmann::json({"cat", "dog"}));
  CHECK(j["test_samples"] == 8);
  // A size given explicitly wins, with a warning.
  r = kiln::testing::run_kiln(
      "eval" + data + " --image-size 24 --weights " + d / "run/model.safetensors" + " --out " + d / "e24.json",
      d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  CHECK_MESSAGE(contains(r.output, "--image-size 24, but " + d / "run/model.safetensors" + " was trained at 16"),
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

namespace {
// A PNG chunk (length, type, data, CRC).
std::string png_chunk(const std::string& type, const std::string& data) {
  std::string c = {char(data.size() >> 24), char(data.size() >> 16), char(data.size() >> 8), char(data.size())};
  c += type + data;
  const uint32_t crc =
      uint32_t(crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const unsigned char*>(c.data() + 4), uInt(c.size() - 4)));
  return c + std::string{char(crc >> 24), char(crc >> 16), char(crc >> 8), char(crc)};
}
}  // namespace

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
