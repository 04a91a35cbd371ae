// GPU test (ctest label gpu): the caching allocator on a real device — reuse of a freed block,
// deferred reuse across streams, statistics, the out-of-memory message — and pinned host memory.
// Skipped (exit 77) with no device.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>

#include "kernels/cuda/device_memory.h"
#include "kernels/cuda/runtime_info.h"
#include "test_util.h"

TEST_CASE("gpu: the device caching allocator reuses, defers across streams, counts, and reports out of memory") {
  const kiln::cuda::RuntimeInfo info = kiln::cuda::query_runtime();
  if (!info.compiled || info.device_count == 0) {
    std::printf("skipped: %s\n", info.error.empty() ? "no CUDA device visible" : info.error.c_str());
    std::exit(77);
  }
  kiln::CachingAllocator& a = kiln::cuda::device_allocator(0);
  a.release_cached();
  a.reset_peaks();
  const auto before = a.stats();
  void* p = a.allocate(3 << 20, 0);
  a.free(p);
  CHECK(a.allocate(3 << 20, 0) == p);
  CHECK(a.stats().cache_hits == before.cache_hits + 1);
  a.free(p);
  // A request larger than the whole device: a clear error naming the device and what is free.
  const std::string msg = kiln::testing::error_of([&] { a.allocate(info.devices[0].total_bytes * 2, 0); });
  CHECK_MESSAGE(kiln::testing::contains(msg, "cuda:0: out of memory allocating"), msg);
  CHECK_MESSAGE(kiln::testing::contains(msg, "free on the device"), msg);
  // And the allocator still works afterwards.
  void* q = a.allocate(1 << 20, 0);
  CHECK(q != nullptr);
  a.free(q);
  void* h = kiln::cuda::pinned_alloc(1 << 20);
  CHECK(h != nullptr);
  kiln::cuda::pinned_free(h);
}
