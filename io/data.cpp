// The data loader's ordering and worker threads, and the in-memory image data sets.
#include "io/data.h"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <numeric>
#include <sstream>

#include "base/thread_pool.h"
#include "engine/random.h"
#include "io/checkpoint.h"
#include "io/idx.h"

namespace kiln::io {

// ---- DataLoader ----------------------------------------------------------------------------------

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, LoaderOptions options)
    : ds_(std::move(dataset)), o_(options) {
  KILN_CHECK(ds_, "DataLoader: no dataset");
  KILN_CHECK(o_.batch_size >= 1, "DataLoader: batch size must be at least 1, got ", o_.batch_size);
  KILN_CHECK(o_.world_size >= 1 && o_.rank >= 0 && o_.rank < o_.world_size, "DataLoader: rank ", o_.rank,
             " is not in a world of ", o_.world_size);
  KILN_CHECK(o_.workers >= 0 && o_.prefetch >= 1, "DataLoader: workers ", o_.workers, " and prefetch ", o_.prefetch,
             " (need workers >= 0, prefetch >= 1)");
  KILN_CHECK(ds_->size() >= 1, "DataLoader: the dataset is empty");
  seek({0, 0});
}

DataLoader::~DataLoader() { stop_workers(); }

int64_t DataLoader::samples_per_epoch() const {
  const int64_t n = ds_->size(), w = o_.world_size;
  if (o_.pad_ranks) return (n + w - 1) / w;
  return n / w + (o_.rank < n % w ? 1 : 0);
}

int64_t DataLoader::batches_per_epoch() const {
  const int64_t s = samples_per_epoch();
  return o_.drop_last ? s / o_.batch_size : (s + o_.batch_size - 1) / o_.batch_size;
}

std::vector<int64_t> DataLoader::epoch_order(int64_t epoch) const {
  const int64_t n = ds_->size();
  std::vector<int64_t> perm(static_cast<size_t>(n));
  std::iota(perm.begin(), perm.end(), 0);
  if (o_.shuffle) {
    // Fisher-Yates from a stream keyed by (seed, epoch): the same order on every rank and every run.
    PhiloxStream rng(mix_seed(o_.seed, 0x5348554646ull), uint64_t(epoch) << 32);
    for (int64_t i = n - 1; i > 0; --i) std::swap(perm[size_t(i)], perm[size_t(rng.below(uint64_t(i) + 1))]);
  }
  if (o_.pad_ranks)
    for (int64_t i = 0; int64_t(perm.size()) % o_.world_size != 0; ++i) perm.push_back(perm[size_t(i)]);
  std::vector<int64_t> mine;
  for (size_t i = size_t(o_.rank); i < perm.size(); i += size_t(o_.world_size)) mine.push_back(perm[i]);
  return mine;
}

void DataLoader::seek(LoaderPosition pos) {
  KILN_CHECK(pos.epoch >= 0 && pos.batch >= 0 && pos.batch <= batches_per_epoch(), "DataLoader: position (epoch ",
             pos.epoch, ", batch ", pos.batch, ") is outside an epoch of ", batches_per_epoch(), " batches");
  stop_workers();
  pos_ = pos;
  order_ = epoch_order(pos.epoch);
  epoch_seed_ = mix_seed(o_.seed, 0x4155474dull + uint64_t(pos.epoch));
  next_to_build_ = pos.batch;
  ready_.clear();
  stop_ = false;
  started_ = false;  // the workers start with the first next(): a seek right after another builds nothing twice
}

Batch DataLoader::build(int64_t batch) const {
  const int64_t b0 = batch * o_.batch_size, b1 = std::min<int64_t>(b0 + o_.batch_size, int64_t(order_.size()));
  const std::vector<int64_t> indices(order_.begin() + b0, order_.begin() + b1);
  Batch b;
  try {
    b = ds_->get_batch(indices, epoch_seed_);
  } catch (const Interrupted&) {
    throw;  // the host stopping the run, not a bad sample: its type must reach the host unchanged
  } catch (const OutOfMemory&) {
    throw;  // under a memory cap: kiln train shrinks the step and redoes it, which needs the type
  } catch (...) {
    // A data set's error names a sample at best; the loader adds which batch and samples it was
    // building, and keeps the original text (and the exception, nested).
    std::ostringstream where;
    where << "DataLoader: batch " << batch << " of epoch " << pos_.epoch << " (indices ";
    const size_t shown = std::min<size_t>(indices.size(), 8);
    for (size_t i = 0; i < shown; ++i) where << (i ? ", " : "") << indices[i];
    if (shown < indices.size()) where << ", ... " << indices.size() << " in all";
    where << "): ";
    std::string original = "an exception that is not a std::exception";
    try {
      throw;
    } catch (const Error& e) {
      original = e.message();
    } catch (const std::exception& e) {
      original = e.what();
    } catch (...) {
    }
    std::throw_with_nested(Error(where.str() + original, __FILE__, __LINE__));
  }
  if (o_.pin_memory)
    for (auto& [name, t] : b) t = pin_memory(t);
  return b;
}

void DataLoader::start_workers() {
  for (int i = 0; i < o_.workers; ++i) threads_.emplace_back([this] { worker_loop(); });
}

void DataLoader::stop_workers() {
  {
    std::lock_guard<std::mutex> lk(m_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
  threads_.clear();
}

void DataLoader::worker_loop() {
  run_inline_on_this_thread();  // kernels called while building a batch must not queue on the compute pool
  const int64_t end = batches_per_epoch();
  for (;;) {
    int64_t b;
    {
      std::unique_lock<std::mutex> lk(m_);
      cv_.wait(lk, [&] { return stop_ || (next_to_build_ < end && next_to_build_ < pos_.batch + o_.prefetch); });
      if (stop_) return;
      b = next_to_build_++;
    }
    std::pair<Batch, std::exception_ptr> out;
    try {
      out.first = build(b);
    } catch (...) {
      out.second = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lk(m_);
      ready_.emplace(b, std::move(out));
    }
    cv_.notify_all();
  }
}

std::optional<Batch> DataLoader::next() {
  const auto t0 = std::chrono::steady_clock::now();
  if (pos_.batch >= batches_per_epoch()) return std::nullopt;
  std::pair<Batch, std::exception_ptr> got;
  if (!started_) {
    started_ = true;
    start_workers();
  }
  if (o_.workers == 0) {
    got.first = build(pos_.batch);
    ++pos_.batch;
  } else {
    std::unique_lock<std::mutex> lk(m_);
    cv_.wait(lk, [&] { return ready_.count(pos_.batch) != 0; });
    auto it = ready_.find(pos_.batch);
    got = std::move(it->second);
    ready_.erase(it);
    ++pos_.batch;  // under the lock: the workers' wait reads it
  }
  cv_.notify_all();
  last_wait_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (got.second) std::rethrow_exception(got.second);
  return std::move(got.first);
}

// ---- in-memory images ----------------------------------------------------------------------------

TensorImageDataset::TensorImageDataset(Tensor images, Tensor labels, ImageTransform transform, std::string name)
    : images_(images.contiguous()), labels_(labels.to(DType::i64).contiguous()), t_(std::move(transform)),
      name_(std::move(name)) {
  KILN_CHECK(images_.dtype() == DType::u8 && images_.dim() == 4, name_, ": images must be u8 [N, C, H, W], got ",
             images_.type_str());
  KILN_CHECK(labels_.dim() == 1 && labels_.size(0) == images_.size(0), name_, ": ", labels_.size(0), " labels for ",
             images_.size(0), " images");
  const int64_t c = images_.size(1);
  KILN_CHECK(t_.mean.size() == size_t(c) && t_.std.size() == size_t(c), name_, ": normalisation has ", t_.mean.size(),
             " means and ", t_.std.size(), " stds for ", c, " channels");
  for (float s : t_.std) KILN_CHECK(s > 0, name_, ": normalisation std must be positive, got ", s);
  KILN_CHECK(t_.pad_crop >= 0, name_, ": crop padding must be >= 0, got ", t_.pad_crop);
  // A crop shifted by more than the image shows only padding; the bound also keeps 2 * pad + 1 from
  // overflowing in get_batch.
  KILN_CHECK(t_.pad_crop <= std::max(images_.size(2), images_.size(3)), name_, ": crop padding (pad) ", t_.pad_crop,
             " is larger than the ", images_.size(2), "x", images_.size(3), " images");
}

Batch TensorImageDataset::get_batch(const std::vector<int64_t>& indices, uint64_t seed) const {
  const int64_t b = int64_t(indices.size()), c = images_.size(1), h = images_.size(2), w = images_.size(3);
  Tensor x = make_tensor({b, c, h, w}, DType::f32, kCPU), y = make_tensor({b}, DType::i64, kCPU);
  float* xd = x.data<float>();
  const uint8_t* src = images_.data<uint8_t>();
  std::vector<float> scale(static_cast<size_t>(c)), shift(static_cast<size_t>(c));
  for (int64_t ch = 0; ch < c; ++ch) {
    scale[size_t(ch)] = 1.0f / (255.0f * t_.std[size_t(ch)]);
    shift[size_t(ch)] = -t_.mean[size_t(ch)] / t_.std[size_t(ch)];
  }
  for (int64_t i = 0; i < b; ++i) {
    const int64_t n = indices[size_t(i)];
    KILN_CHECK(n >= 0 && n < size(), name_, ": sample ", n, " out of range [0, ", size(), ")");
    y.data<int64_t>()[i] = labels_.data<int64_t>()[n];
    int64_t dy = 0, dx = 0;
    bool flip = false;
    if (t_.pad_crop > 0 || t_.hflip) {
      PhiloxStream rng(seed, uint64_t(n) << 8);  // this sample's augmentation, whatever thread builds it
      if (t_.pad_crop > 0) {
        dy = int64_t(rng.below(uint64_t(2 * t_.pad_crop + 1))) - t_.pad_crop;
        dx = int64_t(rng.below(uint64_t(2 * t_.pad_crop + 1))) - t_.pad_crop;
      }
      if (t_.hflip) flip = rng.uniform() < 0.5f;
    }
    for (int64_t ch = 0; ch < c; ++ch) {
      const uint8_t* img = src + (n * c + ch) * h * w;
      float* out = xd + (i * c + ch) * h * w;
      const float sc = scale[size_t(ch)], sh = shift[size_t(ch)];
      for (int64_t r = 0; r < h; ++r) {
        const int64_t sr = r + dy;
        for (int64_t q = 0; q < w; ++q) {
          const int64_t sq = (flip ? w - 1 - q : q) + dx;
          // Padding is zero pixels, i.e. the normalised value of black.
          const float v = (sr >= 0 && sr < h && sq >= 0 && sq < w) ? float(img[sr * w + sq]) : 0.0f;
          out[r * w + q] = v * sc + sh;
        }
      }
    }
  }
  return {{"input", x}, {"target", y}};
}

namespace {

// The uncompressed file when both it and a .gz are there (a gunzip that kept its input: the unpacked
// copy is the one read, and it needs no decompression).
std::string find_idx(const std::string& dir, const std::string& stem) {
  struct stat st{};
  for (const char* ext : {"", ".gz"}) {
    const std::string p = dir + "/" + stem + ext;
    if (::stat(p.c_str(), &st) == 0) return p;
  }
  KILN_FAIL(dir, ": no ", stem, " or ", stem, ".gz (an MNIST-format data set directory holds train-images-idx3-ubyte, "
            "train-labels-idx1-ubyte, t10k-images-idx3-ubyte and t10k-labels-idx1-ubyte, gzipped or not)");
}

// The split's images [N, 1, H, W] and labels, only the first `rows` of them when 0 < rows < N:
// copied out, so the file's whole tensor is freed here.
std::pair<Tensor, Tensor> load_split(const std::string& dir, const std::string& split, int64_t rows,
                                     std::vector<std::string>& files) {
  const std::string is = split + "-images-idx3-ubyte", ls = split + "-labels-idx1-ubyte";
  const std::string ip = find_idx(dir, is), lp = find_idx(dir, ls);
  // The rank first: an images file given for the labels read its dims as too many elements.
  Tensor images = load_idx(ip, 3, "an images file: u8 images [N, H, W]"),
         labels = load_idx(lp, 1, "a 1-D labels file: u8 labels [N]");
  auto content = [&files](const std::string& stem, const Tensor& t) {
    char hex[9];
    std::snprintf(hex, sizeof hex, "%08x", crc32c(t.data<uint8_t>(), t.nbytes()));
    files.push_back(stem + ": " + std::to_string(t.nbytes()) + " bytes, crc32c " + hex);
  };
  content(is, images);
  content(ls, labels);
  KILN_CHECK(images.dtype() == DType::u8 && images.dim() == 3, ip, ": expected u8 images [N, H, W], got ",
             images.type_str());
  KILN_CHECK(labels.dtype() == DType::u8 && labels.dim() == 1, lp, ": expected u8 labels [N], got ", labels.type_str());
  KILN_CHECK(labels.size(0) == images.size(0), lp, ": ", labels.size(0), " labels, but ", ip, " holds ", images.size(0),
             " images");
  KILN_CHECK(images.size(0) >= 1, ip, ": holds no images (0 samples): nothing to ",
             split == "train" ? "train" : "evaluate", " on");
  const uint8_t* l = labels.data<uint8_t>();
  for (int64_t i = 0; i < labels.size(0); ++i)
    KILN_CHECK(l[i] < 10, lp, ": label ", int(l[i]), " of sample ", i, " is not a class 0..9");
  if (rows > 0 && rows < images.size(0)) {
    images = images.narrow(0, 0, rows).clone();
    labels = labels.narrow(0, 0, rows);  // to(i64) below copies it
  }
  return {images.unsqueeze(1), labels.to(DType::i64)};
}

}  // namespace

ImageClassData load_mnist_dir(const std::string& dir, const ImageTransform& train_transform, const std::string& name,
                              bool test_only, int64_t train_rows, int64_t test_rows) {
  Tensor xtr, ytr;  // the training files first: a problem with them is named before the test files'
  std::vector<std::string> files;
  if (!test_only) std::tie(xtr, ytr) = load_split(dir, "train", train_rows, files);
  auto [xte, yte] = load_split(dir, "t10k", test_rows, files);
  if (test_only) xtr = xte, ytr = yte;
  KILN_CHECK(xtr.size(2) == xte.size(2) && xtr.size(3) == xte.size(3), dir, ": train images are ", xtr.size(2), "x",
             xtr.size(3), " but test images ", xte.size(2), "x", xte.size(3));
  ImageClassData d;
  ImageTransform test_transform{train_transform.mean, train_transform.std, 0, false};
  d.test = std::make_shared<TensorImageDataset>(xte, yte, test_transform, name + " test");
  d.train = test_only ? d.test : std::make_shared<TensorImageDataset>(xtr, ytr, train_transform, name + " train");
  d.num_classes = 10;
  d.channels = 1;
  d.height = xtr.size(2);
  d.width = xtr.size(3);
  d.contents = std::move(files);
  if (name == "fashion-mnist")
    d.class_names = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"};
  else
    for (int i = 0; i < 10; ++i) d.class_names.push_back(std::to_string(i));
  return d;
}

}  // namespace kiln::io
