// Image folders in the common layout, root/<class name>/<image>.{jpg,jpeg,png,bmp}: decoded with
// stb_image, then resized and cropped (random-resized crop and flip for training, resize + centre
// crop for evaluation) and normalised. A corrupt or unreadable image is an error naming the file,
// or, with skip_bad, is left out of its batch and counted.
#pragma once
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "io/data.h"

namespace kiln::io {

struct ImageFolderOptions {
  int64_t size = 224;    // output side
  int64_t resize = 256;  // evaluation: the shorter side is resized to this, then centre-cropped to size
  int64_t channels = 3;  // 1 (grey) or 3 (RGB); images are converted to it
  bool train = false;    // random-resized crop (scale 0.08-1, aspect 3/4-4/3) and horizontal flip
  std::vector<float> mean = {0.485f, 0.456f, 0.406f}, std = {0.229f, 0.224f, 0.225f};
  bool skip_bad = false;
};

class ImageFolderDataset final : public Dataset {
 public:
  // Scans root: class names are its sub-directories, sorted; `classes` (when given) fixes them, so a
  // validation folder uses the training folder's ids.
  ImageFolderDataset(const std::string& root, ImageFolderOptions o, std::vector<std::string> classes = {});
  int64_t size() const override { return int64_t(files_.size()); }
  Batch get_batch(const std::vector<int64_t>& indices, uint64_t seed) const override;
  const std::vector<std::string>& classes() const { return classes_; }
  const std::string& file(int64_t i) const { return files_.at(size_t(i)); }
  int64_t bad_samples() const { return bad_.load(); }  // skipped so far (skip_bad)

 private:
  std::string root_;
  ImageFolderOptions o_;
  std::vector<std::string> classes_, files_;
  std::vector<int64_t> labels_;
  mutable std::atomic<int64_t> bad_{0};
};

// Decodes an image file to u8 [channels, H, W]; errors name the file and stb_image's reason.
Tensor decode_image(const std::string& path, int64_t channels);

// Bilinear resampling of the box (y0, x0, h, w) of a float image [C, H, W] to [C, out_h, out_w]
// (pixel centres aligned, as common image libraries do without antialiasing).
void resize_bilinear(const float* src, int64_t c, int64_t h, int64_t w, double y0, double x0, double bh, double bw,
                     float* dst, int64_t out_h, int64_t out_w);

}  // namespace kiln::io
