// The device caching allocator's policy on a fake device with a fixed capacity and hand-driven
// events: size classes, reuse per stream, deferred reuse across streams, release and retry on out
// of memory, the out-of-memory message, statistics.
#include <doctest/doctest.h>

#include <cstdlib>
#include <random>
#include <set>

#include "base/caching_allocator.h"
#include "test_util.h"

using namespace kiln;
using kiln::testing::contains;
using kiln::testing::error_of;

namespace {
struct FakeDevice : RawDevice {
  size_t capacity, used = 0;
  std::map<void*, size_t> blocks;
  std::set<void*> done_events;
  int next_event = 1;
  explicit FakeDevice(size_t cap) : capacity(cap) {}
  ~FakeDevice() override {
    for (auto& [p, n] : blocks) std::free(p);
  }
  void* allocate(size_t bytes) override {
    if (used + bytes > capacity) return nullptr;
    void* p = std::malloc(bytes);
    blocks[p] = bytes;
    used += bytes;
    return p;
  }
  void deallocate(void* p) override {
    used -= blocks.at(p);
    blocks.erase(p);
    std::free(p);
  }
  void* record_event(StreamId) override { return reinterpret_cast<void*>(uintptr_t(next_event++)); }
  bool event_done(void* e) override { return done_events.count(e) > 0; }
  void destroy_event(void*) override {}
  size_t free_bytes() override { return capacity - used; }
};
}  // namespace

TEST_CASE("allocator: size classes cover the request with at most 12.5% slack above 1 MiB") {
  CHECK(CachingAllocator::size_class(0) == 512);
  CHECK(CachingAllocator::size_class(1) == 512);
  CHECK(CachingAllocator::size_class(513) == 1024);
  CHECK(CachingAllocator::size_class(1 << 20) == (1 << 20));
  CHECK(CachingAllocator::size_class((1 << 20) + 1) == (1 << 20) + (1 << 17));
  std::mt19937_64 rng(3);
  for (int i = 0; i < 10000; ++i) {
    const size_t n = size_t(rng() % (size_t(1) << 34)) + 1;
    const size_t c = CachingAllocator::size_class(n);
    REQUIRE(c >= n);
    if (n > (1 << 20)) CHECK(double(c - n) <= 0.125 * double(n));
    else CHECK(c - n < 512);
  }
}

TEST_CASE("allocator: a freed block is reused on its stream, not on another; stats count it") {
  auto dev = std::make_unique<FakeDevice>(size_t(64) << 20);
  FakeDevice* d = dev.get();
  CachingAllocator a(std::move(dev), "fake:0");
  void* p = a.allocate(1000, 1);
  CHECK(a.stats().allocated == 1024);
  a.free(p);
  CHECK(a.stats().allocated == 0);
  CHECK(a.stats().reserved == 1024);  // cached, still held from the device
  CHECK(a.allocate(1000, 1) == p);    // same stream, same class: the cached block
  CHECK(a.stats().cache_hits == 1);
  void* q = a.allocate(1000, 2);      // another stream: a new block
  CHECK(q != p);
  CHECK(a.stats().device_allocations == 2);
  CHECK(a.stats().peak_allocated == 2048);
  a.free(p);
  a.free(q);
  a.release_cached();
  CHECK(a.stats().reserved == 0);
  CHECK(d->used == 0);
  CHECK(contains(error_of([&] { a.free(p); }), "did not hand out"));
}

TEST_CASE("allocator: a block used on another stream waits for that stream before reuse") {
  auto dev = std::make_unique<FakeDevice>(size_t(64) << 20);
  FakeDevice* d = dev.get();
  CachingAllocator a(std::move(dev), "fake:0");
  void* p = a.allocate(4096, 1);
  a.record_stream(p, 7);  // e.g. an all-reduce on the communication stream reads it
  a.free(p);
  void* q = a.allocate(4096, 1);
  CHECK(q != p);  // stream 7 may still be reading p
  d->done_events.insert(reinterpret_cast<void*>(uintptr_t(1)));  // the event recorded at free time
  a.free(q);
  void* r1 = a.allocate(4096, 1);
  void* r2 = a.allocate(4096, 1);
  CHECK(((r1 == p || r1 == q) && (r2 == p || r2 == q) && r1 != r2));  // both reusable now
  a.free(r1);
  a.free(r2);
}

TEST_CASE("allocator: out of memory releases the cache and retries; a real shortage says what is used and free") {
  auto dev = std::make_unique<FakeDevice>(size_t(10) << 20);
  FakeDevice* d = dev.get();
  CachingAllocator a(std::move(dev), "fake:0");
  void* p1 = a.allocate(size_t(4) << 20, 1);
  void* p2 = a.allocate(size_t(4) << 20, 1);
  a.free(p1);
  a.free(p2);  // 8 MiB cached, 2 MiB free on the device
  void* big = a.allocate(size_t(6) << 20, 1);  // fits only after the cache is released
  CHECK(big != nullptr);
  CHECK(a.stats().oom_retries == 1);
  CHECK(a.stats().reserved == size_t(6) << 20);
  CHECK(d->used == size_t(6) << 20);
  const std::string msg = error_of([&] { a.allocate(size_t(5) << 20, 1); });
  CHECK_MESSAGE(contains(msg, "fake:0: out of memory allocating 5.0 MiB"), msg);
  CHECK_MESSAGE(contains(msg, "in use 6.0 MiB, reserved by Kiln 6.0 MiB, free on the device 4.0 MiB"), msg);
  a.free(big);
}
