// Data: IDX parsing (valid, gzip, damaged), the data loader (order, ranks, workers, seeking,
// errors), and the in-memory image data set's normalisation and augmentation.
#include <doctest/doctest.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <set>
#include <stdexcept>

#include "engine/random.h"
#include "io/data.h"
#include "io/idx.h"
#include "kiln.h"
#include "test_util.h"

using namespace kiln;
using kiln::testing::contains;
using kiln::testing::error_of;
using kiln::testing::TempDir;

namespace {

std::string idx_bytes(uint8_t type, const std::vector<uint32_t>& dims, const std::string& payload) {
  std::string s = {0, 0, char(type), char(dims.size())};
  for (uint32_t d : dims) {
    s += char(d >> 24);
    s += char(d >> 16);
    s += char(d >> 8);
    s += char(d);
  }
  return s + payload;
}

Tensor parse(const std::string& b) { return io::parse_idx(reinterpret_cast<const uint8_t*>(b.data()), b.size(), "mem.idx"); }

void write_file(const std::string& path, const std::string& bytes, bool gz) {
  if (gz) {
    gzFile f = gzopen(path.c_str(), "wb");
    REQUIRE(f);
    gzwrite(f, bytes.data(), unsigned(bytes.size()));
    gzclose(f);
  } else {
    std::ofstream(path, std::ios::binary) << bytes;
  }
}

// A data set whose batch is its indices, and which fails on request.
class IndexData final : public io::Dataset {
 public:
  explicit IndexData(int64_t n, int64_t fail_at = -1) : n_(n), fail_at_(fail_at) {}
  int64_t size() const override { return n_; }
  io::Batch get_batch(const std::vector<int64_t>& idx, uint64_t seed) const override {
    calls++;
    for (int64_t i : idx) KILN_CHECK(i != fail_at_, "sample ", i, " is unreadable");
    Tensor t = make_tensor({int64_t(idx.size())}, DType::i64, kCPU);
    std::copy(idx.begin(), idx.end(), t.data<int64_t>());
    return {{"index", t}, {"seed", scalar_tensor(double(seed % 1000003), DType::i64)}};
  }
  mutable std::atomic<int> calls{0};

 private:
  int64_t n_, fail_at_;
};

std::vector<int64_t> drain(io::DataLoader& l) {
  std::vector<int64_t> out;
  while (auto b = l.next()) {
    const Tensor& t = b->at("index");
    for (int64_t i = 0; i < t.numel(); ++i) out.push_back(t.data<int64_t>()[i]);
  }
  return out;
}

}  // namespace

TEST_CASE("idx: u8, i16, i32, f32 and f64 payloads, big-endian, plain and gzip") {
  Tensor u = parse(idx_bytes(0x08, {2, 3}, std::string("\x01\x02\x03\x04\x05\xff", 6)));
  CHECK(u.dtype() == DType::u8);
  CHECK(u.shape() == Shape{2, 3});
  CHECK(u.data<uint8_t>()[5] == 255);
  Tensor s = parse(idx_bytes(0x0B, {2}, std::string("\xff\xfe\x01\x00", 4)));
  CHECK(s.dtype() == DType::i32);
  CHECK(s.to_vector() == std::vector<double>{-2, 256});
  Tensor i = parse(idx_bytes(0x0C, {1}, std::string("\x00\x01\x00\x02", 4)));
  CHECK(i.item<int64_t>() == 65538);
  Tensor f = parse(idx_bytes(0x0D, {1}, std::string("\x3f\xc0\x00\x00", 4)));  // 1.5f
  CHECK(f.item<double>() == 1.5);
  Tensor d = parse(idx_bytes(0x0E, {1}, std::string("\xc0\x04\x00\x00\x00\x00\x00\x00", 8)));  // -2.5
  CHECK(d.item<double>() == -2.5);
  Tensor sb = parse(idx_bytes(0x09, {1}, std::string("\xfd", 1)));
  CHECK(sb.item<int64_t>() == -3);

  TempDir dir("kiln_idx");
  const std::string bytes = idx_bytes(0x08, {3, 2, 2}, std::string(12, '\x07'));
  write_file(dir / "plain", bytes, false);
  write_file(dir / "packed.gz", bytes, true);
  for (const char* name : {"plain", "packed.gz"}) {
    Tensor t = io::load_idx(dir / name);
    CHECK(t.shape() == Shape{3, 2, 2});
    CHECK(t.to_vector() == std::vector<double>(12, 7.0));
  }
}

TEST_CASE("idx: wrong magic, unknown type, bad rank, truncation and trailing bytes are named errors") {
  const std::string good = idx_bytes(0x08, {4, 5}, std::string(20, '\x01'));
  CHECK(contains(error_of([&] { parse("\x01\x00\x08\x01" + good.substr(4)); }), "not an IDX file"));
  CHECK(contains(error_of([&] { parse(idx_bytes(0x0A, {1}, "x")); }), "unknown IDX element type"));
  CHECK(contains(error_of([&] { parse(idx_bytes(0x08, {}, "")); }), "rank 0"));
  // Every cut short of the full file is an error that names the source; none crashes.
  for (size_t cut = 0; cut < good.size(); ++cut) {
    const std::string e = error_of([&] { parse(good.substr(0, cut)); });
    CHECK_MESSAGE(contains(e, "mem.idx"), "cut at ", cut, ": ", e);
  }
  CHECK(contains(error_of([&] { parse(good.substr(0, good.size() - 3)); }), "truncated"));
  CHECK(contains(error_of([&] { parse(good + "zz"); }), "2 unexpected bytes"));
  CHECK(contains(error_of([&] { parse(idx_bytes(0x08, {0xffffffff, 0xffffffff, 0xffff}, "")); }), "too many"));

  TempDir dir("kiln_idx");
  CHECK(contains(error_of([&] { io::load_idx(dir / "absent"); }), "absent: cannot open"));
  // A gzip stream cut in half: zlib's error surfaces, naming the file.
  const std::string big = idx_bytes(0x08, {64, 64}, std::string(4096, '\x05'));
  write_file(dir / "full.gz", big, true);
  const std::string gz = testing::read_text(dir / "full.gz");
  write_file(dir / "half.gz", gz.substr(0, gz.size() / 2), false);
  CHECK(contains(error_of([&] { io::load_idx(dir / "half.gz"); }), "half.gz"));
}

TEST_CASE("mnist directory: images and labels must agree, labels must be classes") {
  TempDir dir("kiln_mnist");
  auto images = [](uint32_t n) { return idx_bytes(0x08, {n, 4, 4}, std::string(n * 16, '\x80')); };
  auto labels = [](const std::string& l) { return idx_bytes(0x08, {uint32_t(l.size())}, l); };
  io::ImageTransform t{{0.5f}, {0.25f}, 0, false};
  CHECK(contains(error_of([&] { io::load_mnist_dir(dir.p.string(), t, "m"); }), "train-images-idx3-ubyte"));
  write_file(dir / "train-images-idx3-ubyte.gz", images(3), true);
  write_file(dir / "train-labels-idx1-ubyte", labels(std::string("\x01\x02\x03", 3)), false);
  write_file(dir / "t10k-images-idx3-ubyte", images(2), false);
  write_file(dir / "t10k-labels-idx1-ubyte", labels(std::string("\x00\x01\x02", 3)), false);
  CHECK(contains(error_of([&] { io::load_mnist_dir(dir.p.string(), t, "m"); }), "3 labels, but"));
  write_file(dir / "t10k-labels-idx1-ubyte", labels(std::string("\x00\x0c", 2)), false);
  CHECK(contains(error_of([&] { io::load_mnist_dir(dir.p.string(), t, "m"); }), "label 12 of sample 1"));
  // A file of another rank is said as such before its dims are read: a labels file of rank 3 whose
  // dims are garbage "held too many elements", an images file given for the labels failed later.
  write_file(dir / "t10k-labels-idx1-ubyte", std::string("\0\0\x08\x03\0\0\0\x40\x09\0\0\x03\0\x02\x07\x02", 16),
             false);
  CHECK(contains(error_of([&] { io::load_mnist_dir(dir.p.string(), t, "m"); }),
                 "t10k-labels-idx1-ubyte: IDX rank 3, expected a 1-D labels file: u8 labels [N]"));
  write_file(dir / "t10k-labels-idx1-ubyte", images(2), false);
  CHECK(contains(error_of([&] { io::load_mnist_dir(dir.p.string(), t, "m"); }),
                 "t10k-labels-idx1-ubyte: IDX rank 3, expected a 1-D labels file"));
  write_file(dir / "t10k-images-idx3-ubyte", labels(std::string("\x00\x09", 2)), false);
  CHECK(contains(error_of([&] { io::load_mnist_dir(dir.p.string(), t, "m"); }),
                 "t10k-images-idx3-ubyte: IDX rank 1, expected an images file: u8 images [N, H, W]"));
  write_file(dir / "t10k-images-idx3-ubyte", images(2), false);
  write_file(dir / "t10k-labels-idx1-ubyte", labels(std::string("\x00\x09", 2)), false);
  io::ImageClassData d = io::load_mnist_dir(dir.p.string(), t, "m");
  CHECK(d.train->size() == 3);
  CHECK(d.test->size() == 2);
  io::Batch b = d.train->get_batch({2, 0}, 1);
  CHECK(b.at("input").shape() == Shape{2, 1, 4, 4});
  CHECK(b.at("target").to_vector() == std::vector<double>{3, 1});
  // (128/255 - 0.5) / 0.25
  CHECK(b.at("input").to_vector()[0] == doctest::Approx((128.0 / 255.0 - 0.5) / 0.25).epsilon(1e-6));
}

TEST_CASE("image augmentation: crops and flips are a function of (seed, sample), not of the batch") {
  Tensor images = make_tensor({5, 1, 6, 6}, DType::u8, kCPU);
  for (int64_t i = 0; i < images.numel(); ++i) images.data<uint8_t>()[i] = uint8_t(i * 7 % 251);
  Tensor labels = from_vector({0, 1, 2, 3, 4}, {5}, DType::i64);
  io::TensorImageDataset plain(images, labels, {{0.f}, {1.f}, 0, false}, "plain");
  io::TensorImageDataset aug(images, labels, {{0.f}, {1.f}, 2, true}, "aug");
  const std::vector<double> p = plain.get_batch({3}, 9).at("input").to_vector();
  CHECK(p[0] == doctest::Approx(images.data<uint8_t>()[3 * 36] / 255.0));
  const std::vector<double> alone = aug.get_batch({3}, 9).at("input").to_vector();
  const std::vector<double> in_batch = aug.get_batch({1, 3, 4}, 9).at("input").to_vector();
  CHECK(std::equal(alone.begin(), alone.end(), in_batch.begin() + 36));
  // Over many seeds the sample is sometimes shifted or flipped, and always keeps its shape and value range.
  int changed = 0;
  for (uint64_t seed = 0; seed < 40; ++seed) {
    const std::vector<double> a = aug.get_batch({3}, seed).at("input").to_vector();
    REQUIRE(a.size() == 36);
    changed += a != p;
    for (double v : a) CHECK((v >= 0.0 && v <= 1.0));
  }
  CHECK(changed > 20);
  CHECK(contains(error_of([&] { io::TensorImageDataset(images, labels, {{0.f, 0.f}, {1.f, 1.f}, 0, false}, "x"); }),
                 "2 means and 2 stds for 1 channels"));
}

TEST_CASE("loader: a seeded permutation per epoch, batches, drop_last") {
  auto ds = std::make_shared<IndexData>(10);
  io::LoaderOptions o;
  o.batch_size = 4;
  o.seed = 7;
  io::DataLoader a(ds, o), b(ds, o);
  CHECK(a.batches_per_epoch() == 3);
  const auto ea = drain(a), eb = drain(b);
  CHECK(ea == eb);  // same seed, same order
  CHECK(std::set<int64_t>(ea.begin(), ea.end()).size() == 10);
  CHECK(ea.size() == 10);
  a.seek({1, 0});
  const auto e1 = drain(a);
  CHECK(e1 != ea);  // another epoch, another order
  CHECK(std::set<int64_t>(e1.begin(), e1.end()).size() == 10);
  o.seed = 8;
  io::DataLoader c(ds, o);
  CHECK(drain(c) != ea);
  o.drop_last = true;
  o.shuffle = false;
  io::DataLoader d(ds, o);
  CHECK(d.batches_per_epoch() == 2);
  CHECK(drain(d) == std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7});
  CHECK(!d.next().has_value());
}

TEST_CASE("loader: ranks get disjoint slices; padded for training, exactly once for evaluation") {
  auto ds = std::make_shared<IndexData>(11);
  for (bool pad : {true, false}) {
    std::multiset<int64_t> all;
    std::vector<size_t> sizes;
    for (int r = 0; r < 4; ++r) {
      io::LoaderOptions o;
      o.batch_size = 2;
      o.seed = 3;
      o.rank = r;
      o.world_size = 4;
      o.pad_ranks = pad;
      io::DataLoader l(ds, o);
      const auto e = drain(l);
      CHECK(int64_t(e.size()) == l.samples_per_epoch());
      sizes.push_back(e.size());
      all.insert(e.begin(), e.end());
    }
    if (pad) {
      CHECK(sizes == std::vector<size_t>{3, 3, 3, 3});
      CHECK(all.size() == 12);  // one sample repeated to even the ranks out
    } else {
      CHECK(all.size() == 11);
      for (int64_t i = 0; i < 11; ++i) CHECK(all.count(i) == 1);
    }
    CHECK(std::set<int64_t>(all.begin(), all.end()).size() == 11);
  }
}

TEST_CASE("loader: workers, prefetch and seeking give the same batches as loading inline") {
  auto ds = std::make_shared<IndexData>(37);
  io::LoaderOptions o;
  o.batch_size = 5;
  o.seed = 11;
  o.workers = 0;
  io::DataLoader inline_loader(ds, o);
  inline_loader.seek({2, 0});
  const auto want = drain(inline_loader);
  for (int workers : {1, 3}) {
    o.workers = workers;
    o.prefetch = 2;
    io::DataLoader l(ds, o);
    l.seek({2, 0});
    CHECK(drain(l) == want);
    // Resume at batch 3 of epoch 2: the rest of that epoch, exactly.
    l.seek({2, 3});
    CHECK(l.position() == io::LoaderPosition{2, 3});
    const auto rest = drain(l);
    CHECK(rest == std::vector<int64_t>(want.begin() + 15, want.end()));
    CHECK(l.position() == io::LoaderPosition{2, l.batches_per_epoch()});
  }
  // The augmentation seed differs per epoch and is the same for every batch of one.
  o.workers = 1;
  io::DataLoader l(ds, o);
  const double s0 = l.next()->at("seed").item<double>();
  CHECK(l.next()->at("seed").item<double>() == s0);
  l.seek({1, 0});
  CHECK(l.next()->at("seed").item<double>() != s0);
  CHECK(contains(error_of([&] { l.seek({0, 99}); }), "outside an epoch"));
}

TEST_CASE("loader: an error building a batch surfaces from next(), and the loader stays usable") {
  auto ds = std::make_shared<IndexData>(20, /*fail_at=*/13);
  io::LoaderOptions o;
  o.batch_size = 4;
  o.shuffle = false;
  o.workers = 2;
  io::DataLoader l(ds, o);
  int ok = 0;
  std::string err;
  for (;;) {
    try {
      if (!l.next()) break;
      ++ok;
    } catch (const Error& e) {
      err = e.what();
    }
  }
  CHECK(ok == 4);
  CHECK(contains(err, "sample 13 is unreadable"));  // the data set's own text, kept
  CHECK(contains(err, "DataLoader: batch 3 of epoch 0 (indices 12, 13, 14, 15)"));
  CHECK(contains(error_of([&] { io::LoaderOptions bad; bad.batch_size = 0; io::DataLoader(ds, bad); }),
                 "batch size must be at least 1"));
  CHECK(contains(error_of([&] { io::LoaderOptions bad; bad.rank = 2; bad.world_size = 2; io::DataLoader(ds, bad); }),
                 "rank 2 is not in a world of 2"));
}

namespace {
// A data set of the user's own that fails with a standard exception, not a kiln::Error.
class ThrowingData final : public io::Dataset {
 public:
  int64_t size() const override { return 40; }
  io::Batch get_batch(const std::vector<int64_t>& idx, uint64_t) const override {
    for (int64_t i : idx)
      if (i == 37) throw std::runtime_error("cannot decode sample.jpg");
    return {{"x", zeros({int64_t(idx.size())})}};
  }
};
// A batch that does not fit under a memory cap: its type must reach kiln train, which shrinks the step.
class OutOfMemoryData final : public io::Dataset {
 public:
  int64_t size() const override { return 8; }
  io::Batch get_batch(const std::vector<int64_t>&, uint64_t) const override {
    throw OutOfMemory("CPU memory cap reached: allocating 49.0 KiB", __FILE__, __LINE__);
  }
};
}  // namespace

TEST_CASE("loader: running out of memory while building a batch keeps its type (the step is redone smaller)") {
  for (int workers : {0, 1}) {
    CAPTURE(workers);
    io::LoaderOptions o;
    o.batch_size = 4;
    o.workers = workers;
    io::DataLoader l(std::make_shared<OutOfMemoryData>(), o);
    CHECK_THROWS_AS(l.next(), OutOfMemory);
  }
}

TEST_CASE("loader: a data set's exception names the batch and its indices, keeping the original") {
  for (int workers : {0, 1}) {
    CAPTURE(workers);
    io::LoaderOptions o;
    o.batch_size = 12;
    o.shuffle = false;
    o.workers = workers;
    io::DataLoader l(std::make_shared<ThrowingData>(), o);
    l.seek({2, 0});
    std::string err;
    bool nested = false;
    try {
      while (l.next()) {
      }
    } catch (const Error& e) {
      err = e.what();
      try {
        std::rethrow_if_nested(e);
      } catch (const std::runtime_error& inner) {
        nested = std::string(inner.what()) == "cannot decode sample.jpg";
      }
    }
    CHECK(contains(err, "DataLoader: batch 3 of epoch 2 (indices 36, 37, 38, 39): cannot decode sample.jpg"));
    CHECK(nested);
  }
  // A long batch lists its first indices and the count.
  io::LoaderOptions o;
  o.batch_size = 40;
  o.shuffle = false;
  o.workers = 0;
  io::DataLoader l(std::make_shared<ThrowingData>(), o);
  CHECK(contains(error_of([&] { l.next(); }), "(indices 0, 1, 2, 3, 4, 5, 6, 7, ... 40 in all): cannot decode"));
}

TEST_CASE("loader: the prefetch queue is bounded") {
  auto ds = std::make_shared<IndexData>(400);
  io::LoaderOptions o;
  o.batch_size = 1;
  o.workers = 2;
  o.prefetch = 3;
  io::DataLoader l(ds, o);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  CHECK(ds->calls.load() <= 3);
  l.next();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(ds->calls.load() <= 4);
}

TEST_CASE("philox stream: reproducible, uniform in range") {
  PhiloxStream a(5, 0), b(5, 0), c(6, 0);
  std::vector<uint64_t> va, vb, vc;
  for (int i = 0; i < 100; ++i) {
    va.push_back(a.below(10));
    vb.push_back(b.below(10));
    vc.push_back(c.below(10));
  }
  CHECK(va == vb);
  CHECK(va != vc);
  std::vector<int> hist(10, 0);
  PhiloxStream d(1, 0);
  for (int i = 0; i < 100000; ++i) hist[size_t(d.below(10))]++;
  for (int h : hist) CHECK((h > 9500 && h < 10500));
  CHECK(mix_seed(1, 2) != mix_seed(2, 1));
}

TEST_CASE("philox stream: mul_high (32-bit halves) is the 128-bit product's high half, so below() draws as before") {
  __extension__ typedef unsigned __int128 u128;  // the reference (the header no longer uses it: -Wpedantic)
  const auto ref = [](uint64_t a, uint64_t b) { return uint64_t((u128(a) * b) >> 64); };
  const uint64_t edges[] = {0,
                            1,
                            2,
                            0xFFFFFFFFull,
                            0x100000000ull,
                            0xFFFFFFFFFFFFFFFFull,
                            0x8000000000000000ull,
                            0xFFFFFFFF00000000ull,
                            0x00000000FFFFFFFFull,
                            0x123456789ABCDEF0ull};
  for (uint64_t a : edges)
    for (uint64_t b : edges) CHECK(mul_high(a, b) == ref(a, b));
  PhiloxStream s(7, 3);
  for (int i = 0; i < 10000; ++i) {
    const uint64_t a = uint64_t(s.next_u32()) << 32 | s.next_u32(), b = uint64_t(s.next_u32()) << 32 | s.next_u32();
    CHECK(mul_high(a, b) == ref(a, b));
  }
  for (uint64_t n : {uint64_t(1), uint64_t(10), uint64_t(1) << 40, ~uint64_t(0)}) {
    PhiloxStream u(9, 1), v(9, 1);
    for (int i = 0; i < 100; ++i) {
      const uint64_t x = uint64_t(v.next_u32()) << 32 | v.next_u32();
      CHECK(u.below(n) == ref(x, n));
    }
  }
}

TEST_CASE("mnist directory: the uncompressed file wins over its .gz; eval reads no train files; a fake gzip is named") {
  TempDir dir("kiln_mnist");
  auto images = [](uint32_t n) { return idx_bytes(0x08, {n, 4, 4}, std::string(n * 16, '\x80')); };
  auto labels = [](const std::string& l) { return idx_bytes(0x08, {uint32_t(l.size())}, l); };
  io::ImageTransform t{{0.5f}, {0.25f}, 0, false};
  write_file(dir / "t10k-images-idx3-ubyte", images(2), false);
  write_file(dir / "t10k-labels-idx1-ubyte", labels(std::string("\x00\x09", 2)), false);
  // Evaluation needs the test split only.
  io::ImageClassData d = io::load_mnist_dir(dir.p.string(), t, "m", /*test_only=*/true);
  CHECK(d.test->size() == 2);
  CHECK(d.train->size() == 2);
  CHECK(contains(error_of([&] { io::load_mnist_dir(dir.p.string(), t, "m"); }), "train-images-idx3-ubyte"));
  // Both a file and its .gz: the uncompressed one is read.
  write_file(dir / "train-images-idx3-ubyte", images(3), false);
  write_file(dir / "train-images-idx3-ubyte.gz", images(5), true);
  write_file(dir / "train-labels-idx1-ubyte", labels(std::string("\x01\x02\x03", 3)), false);
  CHECK(io::load_mnist_dir(dir.p.string(), t, "m").train->size() == 3);
  // gzip's magic, then not a deflate stream.
  write_file(dir / "fake.gz", std::string("\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03", 10) + std::string(64, '\x7f'),
             false);
  const std::string e = error_of([&] { io::load_idx(dir / "fake.gz"); });
  CHECK_MESSAGE(contains(e, dir / "fake.gz" + ": not a valid gzip file"), e);
}
