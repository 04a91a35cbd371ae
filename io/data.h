// Datasets and the data loader. A Dataset builds a batch from sample indices; the DataLoader owns
// the order (a seeded shuffle per epoch, a disjoint slice per rank), batching, and background
// workers that keep a bounded number of batches ready. Its position (epoch, batch) is what a
// checkpoint saves, and seeking there reproduces the rest of the epoch exactly.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "engine/tensor.h"

namespace kiln::io {

using Batch = std::map<std::string, Tensor>;  // "input", "target", "input_ids", ...

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  // The batch holding samples `indices`, in that order. Random augmentation must be a function of
  // (seed, sample index) alone. Called from several loader threads at once.
  virtual Batch get_batch(const std::vector<int64_t>& indices, uint64_t seed) const = 0;
  // Whether get_batch depends on its seed (random augmentation or masking). Python's ds[i] draws a
  // seed from Kiln's generator only then, so indexing a fixed set (a test split) leaves the
  // generator, and so model init and a DataLoader's default seed, as they were.
  virtual bool random() const { return true; }
};

struct LoaderOptions {
  int64_t batch_size = 32;
  bool shuffle = true;
  bool drop_last = false;
  uint64_t seed = 0;
  int workers = 1;    // background threads; 0 builds batches on the calling thread
  int prefetch = 4;   // batches built ahead of the consumer, at most
  int rank = 0, world_size = 1;
  // With several ranks: pad the order (repeating its start) so every rank gets as many samples
  // (training); without, each sample is seen exactly once and ranks may differ by one (evaluation).
  bool pad_ranks = true;
  // Batches in page-locked memory (built by the workers), so that their copy to a GPU is queued
  // behind the previous step's kernels without the host waiting for it. Ignored without a GPU.
  bool pin_memory = false;
};

struct LoaderPosition {
  int64_t epoch = 0;
  int64_t batch = 0;  // the next batch to hand out in that epoch
  bool operator==(const LoaderPosition&) const = default;
};

class DataLoader {
 public:
  DataLoader(std::shared_ptr<const Dataset> dataset, LoaderOptions options);
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  int64_t samples_per_epoch() const;  // this rank's
  int64_t batches_per_epoch() const;
  const LoaderOptions& options() const { return o_; }
  const Dataset& dataset() const { return *ds_; }
  // This rank's sample order in `epoch`.
  std::vector<int64_t> epoch_order(int64_t epoch) const;

  // Continues from `pos` (stops and restarts the workers).
  void seek(LoaderPosition pos);
  // The next batch of the current epoch, or nullopt when the epoch is over (seek to go on). An error
  // raised while building a batch is rethrown here.
  std::optional<Batch> next();
  LoaderPosition position() const { return pos_; }
  // Seconds the last next() waited for its batch (what tells a user the GPU or CPU sat idle).
  double last_wait_seconds() const { return last_wait_; }

 private:
  Batch build(int64_t batch) const;
  void start_workers();
  void stop_workers();
  void worker_loop();

  std::shared_ptr<const Dataset> ds_;
  LoaderOptions o_;
  LoaderPosition pos_;
  std::vector<int64_t> order_;  // of pos_.epoch
  uint64_t epoch_seed_ = 0;
  double last_wait_ = 0;

  std::mutex m_;
  std::condition_variable cv_;
  std::vector<std::thread> threads_;
  bool stop_ = false;
  bool started_ = false;
  int64_t next_to_build_ = 0;
  std::map<int64_t, std::pair<Batch, std::exception_ptr>> ready_;
};

// ---- image classification in memory (IDX data sets) ----------------------------------------------

struct ImageTransform {
  std::vector<float> mean, std;  // per channel, applied to pixel / 255
  int64_t pad_crop = 0;          // random crop after zero padding by this many pixels (0: off)
  bool hflip = false;            // random horizontal flip
};

// Images u8 [N, C, H, W] and labels i64 [N]; batches are {"input": f32 [B, C, H, W], "target": i64 [B]}.
class TensorImageDataset final : public Dataset {
 public:
  TensorImageDataset(Tensor images, Tensor labels, ImageTransform transform, std::string name);
  int64_t size() const override { return images_.size(0); }
  Batch get_batch(const std::vector<int64_t>& indices, uint64_t seed) const override;
  bool random() const override { return t_.pad_crop > 0 || t_.hflip; }
  const Tensor& images() const { return images_; }
  const Tensor& labels() const { return labels_; }

 private:
  Tensor images_, labels_;
  ImageTransform t_;
  std::string name_;
};

struct ImageClassData {
  std::shared_ptr<TensorImageDataset> train, test;
  int64_t num_classes = 0;
  int64_t channels = 0, height = 0, width = 0;
  std::vector<std::string> class_names;
  // What the idx files hold, training images and labels first: "stem: N bytes, crc32c X" over the
  // decoded bytes (a gunzipped or re-gzipped copy of the same data gives the same entries).
  std::vector<std::string> contents;
};

// Where Debian's dataset-fashion-mnist package puts the files.
inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";
// Loads {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz] from `dir` (MNIST or Fashion-MNIST),
// checking that images and labels agree and labels are below 10. `train_transform` applies to the
// training split; the test split is only normalised. An uncompressed file is read when both it and its
// .gz are there. test_only (`kiln eval`): the train-* files are not read, and `train` is the test split.
// train_rows / test_rows (0: all): keep only the first that many samples of the split (--limit-train,
// --limit-eval). The whole file is still read and checked, but only those rows stay in memory, so a
// run's --memory-cap counts the data it uses, not the whole set.
ImageClassData load_mnist_dir(const std::string& dir, const ImageTransform& train_transform, const std::string& name,
                              bool test_only = false, int64_t train_rows = 0, int64_t test_rows = 0);

}  // namespace kiln::io
