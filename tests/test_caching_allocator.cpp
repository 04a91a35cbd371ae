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
  void wait_event(void* e) override { done_events.insert(e); }
  void destroy_event(void*) override {}
  size_t free_bytes() override { return capacity - used; }
};

// A device on a simulated timeline: each stream is a queue of work items; an event recorded on a
// stream completes when the items queued on it before the event have run, and only run() (the
// device making progress) or a host wait (wait_event drains the stream up to the event) runs them.
// Memory is a fixed capacity, as in FakeDevice.
struct TimelineDevice : FakeDevice {
  std::map<StreamId, int64_t> queued, ran;     // items queued / run per stream
  std::map<void*, std::pair<StreamId, int64_t>> events;  // event -> (stream, items before it)
  int64_t host_waits = 0;
  explicit TimelineDevice(size_t cap) : FakeDevice(cap) {}
  void enqueue(StreamId s, int64_t items) { queued[s] += items; }
  void run(StreamId s, int64_t items) { ran[s] = std::min(queued[s], ran[s] + items); }
  void* record_event(StreamId s) override {
    void* e = reinterpret_cast<void*>(uintptr_t(next_event++));
    events[e] = {s, queued[s]};
    return e;
  }
  bool event_done(void* e) override {
    const auto& [s, before] = events.at(e);
    return ran[s] >= before;
  }
  void wait_event(void* e) override {
    ++host_waits;
    const auto& [s, before] = events.at(e);
    ran[s] = std::max(ran[s], before);
  }
  void destroy_event(void* e) override { events.erase(e); }
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

TEST_CASE("allocator: a block whose other stream cannot take an event stays in use, not handed out") {
  struct Refusing : FakeDevice {
    using FakeDevice::FakeDevice;
    void* record_event(StreamId s) override {
      if (s == 9) throw kiln::Error("stream 9 was destroyed", __FILE__, __LINE__);
      return FakeDevice::record_event(s);
    }
  };
  auto dev = std::make_unique<Refusing>(size_t(64) << 20);
  CachingAllocator a(std::move(dev), "fake:0");
  void* p = a.allocate(4096, 1);
  a.record_stream(p, 9);
  CHECK_THROWS_AS(a.free(p), kiln::Error);
  CHECK(a.stats().allocated == 4096);  // still counted as in use
  void* q = a.allocate(4096, 1);
  CHECK(q != p);
  a.free(q);
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

TEST_CASE("allocator on a timeline: an all-reduce's buffer is reused only after the communication stream ran") {
  constexpr StreamId compute = 1, comm = 2;
  auto dev = std::make_unique<TimelineDevice>(size_t(64) << 20);
  TimelineDevice* d = dev.get();
  CachingAllocator a(std::move(dev), "timeline:0");
  // A gradient bucket written on the compute stream, all-reduced on the communication stream (three
  // items queued there: NCCL's kernel and what came before it), freed by the host at once.
  void* bucket = a.allocate(size_t(1) << 20, compute);
  d->enqueue(compute, 1);
  d->enqueue(comm, 3);
  a.record_stream(bucket, comm);
  a.free(bucket);
  // The next step's allocations on the compute stream must not get it while comm may still read.
  d->run(comm, 2);
  void* next = a.allocate(size_t(1) << 20, compute);
  CHECK(next != bucket);
  a.free(next);
  // Once the all-reduce has run, the bucket is a free block of the compute stream again.
  d->run(comm, 1);
  void* again = a.allocate(size_t(1) << 20, compute);
  void* again2 = a.allocate(size_t(1) << 20, compute);
  CHECK(((again == bucket) || (again2 == bucket)));
  CHECK(d->host_waits == 0);  // no host wait while memory was plentiful
  a.free(again);
  a.free(again2);
}

TEST_CASE("allocator on a timeline: out of memory waits for pending blocks' streams, then retries") {
  constexpr StreamId compute = 1, comm = 2;
  auto dev = std::make_unique<TimelineDevice>(size_t(10) << 20);
  TimelineDevice* d = dev.get();
  CachingAllocator a(std::move(dev), "timeline:0");
  void* live = a.allocate(size_t(4) << 20, compute);
  void* bucket = a.allocate(size_t(4) << 20, compute);
  d->enqueue(comm, 5);
  a.record_stream(bucket, comm);
  a.free(bucket);  // pending: comm has run none of its 5 items
  // 4 MiB live, 4 MiB pending, 2 MiB free on the device. A 6 MiB request fits only once the pending
  // block's stream has run and the block has gone back to the device.
  void* big = a.allocate(size_t(6) << 20, compute);
  CHECK(big != nullptr);
  CHECK(d->host_waits == 1);
  CHECK(d->ran[comm] == 5);
  CHECK(a.stats().oom_retries == 1);
  CHECK(a.stats().reserved == size_t(10) << 20);
  // With nothing pending or cached left, a real shortage is still the clear error.
  const std::string msg = error_of([&] { a.allocate(size_t(4) << 20, compute); });
  CHECK_MESSAGE(contains(msg, "timeline:0: out of memory allocating 4.0 MiB"), msg);
  a.free(big);
  a.free(live);
  // Asked to give its cache back (as a training step that ran out of memory does, for the libraries'
  // own allocations), it gives pending blocks back too, after waiting for their streams.
  void* read_elsewhere = a.allocate(size_t(2) << 20, compute);
  d->enqueue(comm, 2);
  a.record_stream(read_elsewhere, comm);
  a.free(read_elsewhere);
  a.release_cached();
  CHECK(d->host_waits == 2);
  CHECK(d->ran[comm] == 7);
  CHECK(a.stats().reserved == 0);
  CHECK(d->used == 0);
}

TEST_CASE("caching allocator: byte counts in messages keep small amounts readable") {
  CHECK(detail::mib(300) == "300 B");
  CHECK(detail::mib(1024) == "1.0 KiB");
  CHECK(detail::mib(40 << 10) == "40.0 KiB");
  CHECK(detail::mib(size_t(5) << 20) == "5.0 MiB");
  CHECK(detail::mib((size_t(3) << 30) + (size_t(1) << 29)) == "3584.0 MiB");
}
