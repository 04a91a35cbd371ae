// A caching allocator for device memory, written against a small RawDevice interface so its logic
// (size classes, per-stream reuse, deferred reuse across streams, release and retry on out of
// memory, statistics) runs and is tested on the CPU; kernels/cuda supplies the CUDA RawDevice.
//
// Size classes: requests round up to 512 B below 1 MiB, above that to a multiple of 1/8 of the
// request's power of two (at most 12.5% slack). A freed block goes to the free list of the stream
// it was allocated on and is reused for the same class on that stream at once (work on one stream
// is ordered). A block also used on other streams (record_stream) is reused only after an event
// recorded on each of them at free time has completed. When the device is out of memory, the host
// waits for the work that blocks freed on one stream and used on others still wait for (an
// all-reduce on the communication stream, say), then every cached block is released and the
// allocation retried once; if it still fails, the error says how much was asked, what is in use,
// what is reserved and what the device has free.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace kiln {

using StreamId = uintptr_t;  // a cudaStream_t as an integer (0: the default stream)

class RawDevice {
 public:
  virtual ~RawDevice() = default;
  virtual void* allocate(size_t bytes) = 0;  // nullptr when the device is out of memory
  virtual void deallocate(void* p) = 0;
  // An event recorded on `stream` now, and whether the device has passed it.
  virtual void* record_event(StreamId stream) = 0;
  virtual bool event_done(void* event) = 0;
  // Blocks the calling thread until the device has passed `event`.
  virtual void wait_event(void* event) = 0;
  virtual void destroy_event(void* event) = 0;
  virtual size_t free_bytes() = 0;  // what the device reports free
};

struct AllocatorStats {
  size_t allocated = 0, reserved = 0;  // bytes handed out (size classes) / held from the device
  size_t peak_allocated = 0, peak_reserved = 0;
  int64_t allocations = 0, cache_hits = 0, device_allocations = 0, device_frees = 0, oom_retries = 0;
};

class CachingAllocator {
 public:
  CachingAllocator(std::unique_ptr<RawDevice> device, std::string device_name);
  ~CachingAllocator();  // returns every block to the device (blocks still in use are a caller bug, reported)
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  static size_t size_class(size_t bytes);
  void* allocate(size_t bytes, StreamId stream);  // throws kiln::Error when the device is out of memory
  void free(void* p);
  // p is also used on `stream`: when freed, it waits for that stream's work before reuse.
  void record_stream(void* p, StreamId stream);
  // Returns every cached block to the device, first waiting (on the host) for the other streams' work that
  // freed blocks still wait on. What an out-of-memory retry does, and what memory allocated outside this
  // allocator (cuDNN's, cuBLASLt's and NCCL's own) can only get that way.
  void release_cached();
  AllocatorStats stats() const;
  void reset_peaks();

 private:
  struct Block {
    size_t size = 0;
    StreamId stream = 0;
    std::vector<StreamId> also_used_on;
  };
  struct Pending {
    void* ptr;
    std::vector<void*> events;
  };
  void release_cached_locked();
  void collect_pending_locked();

  std::unique_ptr<RawDevice> device_;
  std::string name_;
  mutable std::mutex m_;
  std::unordered_map<void*, Block> live_;                   // handed out
  std::map<std::pair<StreamId, size_t>, std::vector<void*>> free_;  // (stream, class) -> ready blocks
  std::unordered_map<void*, Block> cached_;                 // everything in free_ and pending_, by pointer
  std::vector<Pending> pending_;                            // freed, waiting for other streams
  AllocatorStats stats_;
};

}  // namespace kiln
