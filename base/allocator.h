// The interface a memory source gives tensors and buffers: the CPU allocator, a device's caching
// allocator, the page-locked host pool. Allocators are owned by whoever made them and outlive the
// storages that use them.
#pragma once
#include <cstddef>

namespace kiln {

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t nbytes) = 0;
  virtual void deallocate(void* p, size_t nbytes) noexcept = 0;
};

}  // namespace kiln
