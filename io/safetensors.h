// Safetensors import/export: the interchange format for weights (an 8-byte header length, a JSON
// header, then packed little-endian tensor bytes). Every file is validated in full before use.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

#include "engine/tensor.h"

namespace kiln::io {

struct SafetensorsFile {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> metadata;  // the header's "__metadata__"
};

// Writes `tensors` in name order (any device, any strides; written contiguous) and `metadata`.
// Atomic: the bytes go to "<path>.tmp.<pid>", are fsynced and renamed over `path`, so a crash never
// leaves a half-written file at `path`. On failure the temporary file is removed.
void save_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// Reads and validates `path`; the tensors are CPU tensors, read into memory: the file may be
// changed or removed as soon as this returns. With `mmap` the file is mapped copy-on-write instead
// and each tensor whose data is aligned to its element size is a zero-copy view that keeps the
// mapping alive (writing to it never changes the file); the others are copied. A mapped file must
// not be changed while its tensors live: bytes rewritten in place change their values, and a
// truncated file kills the process with SIGBUS when they are read (replacing it by rename, as
// save_safetensors does, is safe). Use it where the tensors are short-lived or copied at once.
SafetensorsFile load_safetensors(const std::string& path, bool mmap = false);

// The same from bytes in memory (fuzzing, tests); the tensors are copies. `what` names the source
// in errors.
SafetensorsFile parse_safetensors(const uint8_t* data, size_t size, const std::string& what);

}  // namespace kiln::io
