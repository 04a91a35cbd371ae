// Device and pinned host memory for the CUDA backend. No CUDA headers: CPU-only translation units
// include this, and builds without CUDA get versions that say so.
#pragma once
#include <cstddef>

#include "base/caching_allocator.h"

namespace kiln::cuda {

// The caching allocator of `device`, created on first use (cudaMalloc/cudaFree and CUDA events
// underneath). Throws when there is no such device.
CachingAllocator& device_allocator(int device);
// Page-locked host memory, for copies that overlap compute (cudaHostAlloc / cudaFreeHost).
void* pinned_alloc(size_t bytes);
void pinned_free(void* p);

}  // namespace kiln::cuda
