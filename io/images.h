// Image folders in the common layout, root/<class name>/<image>.{jpg,jpeg,png,bmp,ppm,pgm}: decoded
// with stb_image, then resized and cropped (random-resized crop and flip for training, resize + centre
// crop for evaluation) and normalised. Hidden folders and files (a leading '.') are not read; an empty
// training class folder is an error (an empty validation one a note). Symbolic links are followed; one
// that loops, or leads into another class folder, is an error. Every image's header is checked when the folder is
// scanned, a PNG's chunk CRCs when it is decoded. A corrupt or unreadable image is an error naming the file, or, with
// skip_bad, is left out (of the data set, or of its batch) with a warning naming it, and counted once;
// so is an image of more pixels than max_image_pixels() (a decompression bomb). The transforms are
// torchvision's on a PIL image (antialiased bilinear resizing, RandomResizedCrop's centre fallback).
#pragma once
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
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
  bool check_headers = true;  // every image's header when the folder is scanned
};

class ImageFolderDataset final : public Dataset {
 public:
  // Scans root: class names are its sub-directories, sorted; `classes` (when given) fixes them, so a
  // validation folder uses the training folder's ids.
  ImageFolderDataset(const std::string& root, ImageFolderOptions o, std::vector<std::string> classes = {});
  int64_t size() const override { return int64_t(files_.size()); }
  Batch get_batch(const std::vector<int64_t>& indices, uint64_t seed) const override;
  bool random() const override { return o_.train; }
  const std::vector<std::string>& classes() const { return classes_; }
  const std::string& file(int64_t i) const { return files_.at(size_t(i)); }
  int64_t bad_samples() const { return bad_.load(); }  // distinct files skipped so far (skip_bad)
  // A line saying how many files of other extensions the scan left out ("" when none).
  std::string other_files_note() const;
  // Notes printed while scanning (an empty validation class folder, a link to a folder read already).
  const std::vector<std::string>& notes() const { return notes_; }

 private:
  void note_bad(const std::string& file, const std::string& why) const;
  void scan();
  void note(const std::string& line);

  std::string root_;
  ImageFolderOptions o_;
  std::vector<std::string> classes_, files_;
  std::vector<int64_t> labels_;
  std::vector<std::string> notes_;
  std::map<std::string, int64_t> other_;  // files left out, by extension
  mutable std::atomic<int64_t> bad_{0};
  mutable std::mutex bad_mu_;
  mutable std::set<std::string> bad_files_;
};

// Decodes an image file to u8 [channels, H, W]; errors name the file and stb_image's reason. A PNG's
// chunk CRCs are checked first (stb_image does not).
Tensor decode_image(const std::string& path, int64_t channels);

// What is wrong with the PNG in data[0, n) (a critical chunk's CRC, a file cut inside a chunk), or ""
// (also when it is not a PNG). *no_iend (when given): it ends after its image data without an IEND
// chunk, which is accepted, as libpng and PIL do. image_header_problem walks the chunks the same way.
std::string png_problem(const unsigned char* data, size_t n, bool* no_iend = nullptr);

// What is wrong with an image file's header (not a format stb_image decodes, no dimensions; a PNG's
// chunks by their lengths), or "": cheap, the pixels are not read.
std::string image_header_problem(const std::string& path);

// The most pixels an image may hold: PIL's limit (2 * Image.MAX_IMAGE_PIXELS, past which it raises a
// DecompressionBombError), or KILN_MAX_IMAGE_PIXELS (0: no limit of its own, stb_image's 2^30 bytes of
// pixels still hold; not a number: an error naming it).
// A larger image is refused by image_header_problem and decode_image, before its pixels are decoded.
constexpr int64_t kDefaultMaxImagePixels = 178956970;
int64_t max_image_pixels();

// PIL's bilinear resampling (Image.resize(size, BILINEAR, box), which torchvision's Resize calls) of
// the box (y0, x0, bh, bw) of a float image [C, H, W] to [C, out_h, out_w]: output pixel i is centred
// at y0 + (i + 0.5) * bh / out_h and averages the source pixels under a triangle filter whose support
// is one output pixel when shrinking (antialiased) and one source pixel when enlarging; the filter
// window may reach past the box but stops at the image's edges. The weights and sums are f32 (PIL's
// "F" mode sums in f64: the results agree to about 1e-6 relative). The source values must be finite
// (decoded images always are): the windows are padded with zero-weight taps over real pixels, and
// 0 * inf is NaN, so an inf gives NaN in outputs whose window PIL would not have let reach it.
void resize_bilinear(const float* src, int64_t c, int64_t h, int64_t w, double y0, double x0, double bh, double bw,
                     float* dst, int64_t out_h, int64_t out_w);
// The same from 8-bit pixels [C, H, W], each read as v / 255 (float(v) / 255.0f), without converting
// the image: only the pixels a filter window reads.
void resize_bilinear(const uint8_t* src, int64_t c, int64_t h, int64_t w, double y0, double x0, double bh, double bw,
                     float* dst, int64_t out_h, int64_t out_w);
// RandomResizedCrop's resize: the box of whole pixels (y0, x0, bh, bw) of the 8-bit image cut out and
// resampled to [C, out_h, out_w] as resize_bilinear does (so the filter windows stop at the box's
// edges), without copying the box.
void resize_box_bilinear(const uint8_t* src, int64_t c, int64_t h, int64_t w, int64_t y0, int64_t x0, int64_t bh,
                         int64_t bw, float* dst, int64_t out_h, int64_t out_w);

}  // namespace kiln::io
