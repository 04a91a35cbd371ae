// Kiln's checkpoint format (docs/checkpoint-format.md): a 64-byte header, 64-byte-aligned raw tensor
// blobs streamed one by one, then a JSON manifest (names, dtypes, shapes, offsets, CRC32C per
// tensor, and the caller's training state). Written atomically; every byte is checked on verify.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/tensor.h"

namespace kiln::io {

inline constexpr uint32_t kCheckpointMajor = 1, kCheckpointMinor = 0;
inline constexpr char kCheckpointMagic[8] = {'K', 'I', 'L', 'N', 'C', 'K', 'P', 'T'};

// CRC-32C (Castagnoli), as iSCSI and ext4 use it; `crc` continues an earlier call.
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);

struct CheckpointEntry {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  uint64_t offset = 0, nbytes = 0;
  uint32_t crc = 0;
};

// Writes `tensors` (any device or strides; each is made contiguous on the CPU one at a time, so
// there is never a second copy of the whole model) and `state_json` (a JSON object's text) to
// `path` through a temporary file, fsync and rename.
void save_checkpoint(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                     const std::string& state_json);
// The same with each tensor made when its turn comes (and dropped after it is written), in order:
// a sharded optimizer's state gathered one piece at a time never exists whole.
void save_checkpoint_lazy(const std::string& path,
                          const std::vector<std::pair<std::string, std::function<Tensor()>>>& tensors,
                          const std::string& state_json);

// What CheckpointReader throws for a checkpoint whose header is intact but whose format version this
// build does not read: unsupported, not damaged (kiln ckpt verify says which).
class UnsupportedCheckpointFormat : public Error {
 public:
  using Error::Error;
};

class CheckpointReader {
 public:
  // Opens `path` and validates the header, the manifest's checksum and every entry's geometry;
  // a damaged or truncated file is an error naming the file and the part that is wrong.
  explicit CheckpointReader(const std::string& path);
  ~CheckpointReader();
  CheckpointReader(const CheckpointReader&) = delete;
  CheckpointReader& operator=(const CheckpointReader&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<CheckpointEntry>& entries() const { return entries_; }
  const std::string& state_json() const { return state_; }
  uint32_t major() const { return major_; }
  uint32_t minor() const { return minor_; }
  uint64_t file_size() const { return size_; }
  const CheckpointEntry* find(const std::string& name) const;
  // The tensor's bytes, checked against its CRC (an error names the tensor when they differ).
  Tensor read(const std::string& name) const;
  // Checks every blob's CRC and that the padding between blobs is zero: the problems found, each
  // naming the tensor or byte range (empty when the file is intact).
  std::vector<std::string> verify() const;

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0, manifest_offset_ = 0, manifest_length_ = 0;
  uint32_t major_ = 0, minor_ = 0;
  std::vector<CheckpointEntry> entries_;
  std::string state_;
};

}  // namespace kiln::io
