// Per-thread scratch memory for CPU kernels: grows to the largest request, is never zeroed (callers
// write before they read), and lives as long as its thread.
#pragma once
#include <cstddef>
#include <cstdlib>

#include "base/error.h"

namespace kiln::cpu {

struct ScratchBuffer {
  void* data = nullptr;
  size_t bytes = 0;
  ScratchBuffer() = default;
  ScratchBuffer(const ScratchBuffer&) = delete;
  ScratchBuffer& operator=(const ScratchBuffer&) = delete;
  ~ScratchBuffer() { std::free(data); }
  template <typename T> T* get(size_t count) {
    const size_t need = (count * sizeof(T) + 63) / 64 * 64;
    if (need > bytes) {
      std::free(data);
      data = std::aligned_alloc(64, need);
      bytes = data ? need : 0;
      KILN_CHECK(data != nullptr, "CPU kernel: out of memory allocating ", need, " bytes of scratch");
    }
    return static_cast<T*>(data);
  }
};

}  // namespace kiln::cpu
