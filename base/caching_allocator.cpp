// The caching allocator's bookkeeping; see caching_allocator.h for the policy.
#include "base/caching_allocator.h"

#include <algorithm>
#include <cstdio>

#include "base/error.h"

namespace kiln {
using detail::mib;

CachingAllocator::CachingAllocator(std::unique_ptr<RawDevice> device, std::string device_name)
    : device_(std::move(device)), name_(std::move(device_name)) {}

CachingAllocator::~CachingAllocator() {
  std::lock_guard<std::mutex> lk(m_);
  for (auto& p : pending_)
    for (void* e : p.events) device_->destroy_event(e);
  pending_.clear();
  for (auto& [ptr, b] : cached_) device_->deallocate(ptr);
  cached_.clear();
  free_.clear();
  if (!live_.empty())
    std::fprintf(stderr, "kiln: %s allocator destroyed with %zu blocks still in use (freed now)\n", name_.c_str(),
                 live_.size());
  for (auto& [ptr, b] : live_) device_->deallocate(ptr);
  live_.clear();
}

size_t CachingAllocator::size_class(size_t bytes) {
  if (bytes == 0) bytes = 1;
  constexpr size_t kSmall = size_t(1) << 20;
  if (bytes <= kSmall) return (bytes + 511) / 512 * 512;
  size_t p2 = 1;
  while (p2 * 2 <= bytes) p2 *= 2;  // the largest power of two <= bytes
  const size_t step = p2 / 8;
  return (bytes + step - 1) / step * step;
}

void CachingAllocator::collect_pending_locked() {
  for (size_t i = 0; i < pending_.size();) {
    Pending& p = pending_[i];
    bool ready = true;
    for (void* e : p.events) ready = ready && device_->event_done(e);
    if (!ready) {
      ++i;
      continue;
    }
    for (void* e : p.events) device_->destroy_event(e);
    const Block& b = cached_.at(p.ptr);
    free_[{b.stream, b.size}].push_back(p.ptr);
    pending_[i] = pending_.back();
    pending_.pop_back();
  }
}

void* CachingAllocator::allocate(size_t bytes, StreamId stream) {
  const size_t size = size_class(bytes);
  std::lock_guard<std::mutex> lk(m_);
  ++stats_.allocations;
  collect_pending_locked();
  void* p = nullptr;
  auto it = free_.find({stream, size});
  if (it != free_.end() && !it->second.empty()) {
    p = it->second.back();
    it->second.pop_back();
    cached_.erase(p);
    ++stats_.cache_hits;
  } else {
    p = device_->allocate(size);
    if (!p && !cached_.empty()) {  // out of memory: give the cache back and try once more
      ++stats_.oom_retries;
      release_cached_locked();
      p = device_->allocate(size);
    }
    if (!p)
      KILN_FAIL_OOM(name_, ": out of memory allocating ", mib(size), " (asked ", bytes, " bytes); in use ",
                    mib(stats_.allocated), ", reserved by Kiln ", mib(stats_.reserved), ", free on the device ",
                    mib(device_->free_bytes()), ". Lower the batch size, or use --amp to halve activations");
    ++stats_.device_allocations;
    stats_.reserved += size;
    stats_.peak_reserved = std::max(stats_.peak_reserved, stats_.reserved);
  }
  live_[p] = Block{size, stream, {}};
  stats_.allocated += size;
  stats_.peak_allocated = std::max(stats_.peak_allocated, stats_.allocated);
  return p;
}

void CachingAllocator::free(void* p) {
  if (!p) return;
  std::lock_guard<std::mutex> lk(m_);
  auto it = live_.find(p);
  KILN_CHECK(it != live_.end(), name_, ": free of a pointer this allocator did not hand out (or freed twice)");
  // The other streams' events first: if one cannot be recorded (a stream destroyed while the block was
  // still recorded on it), the block stays in use, never handed out while that stream may read it.
  std::vector<void*> events;
  try {
    for (StreamId s : it->second.also_used_on) events.push_back(device_->record_event(s));
  } catch (...) {
    for (void* e : events) device_->destroy_event(e);
    throw;
  }
  Block b = std::move(it->second);
  live_.erase(it);
  stats_.allocated -= b.size;
  b.also_used_on.clear();
  const StreamId stream = b.stream;
  const size_t size = b.size;
  cached_[p] = std::move(b);
  if (events.empty()) free_[{stream, size}].push_back(p);
  else pending_.push_back({p, std::move(events)});
}

void CachingAllocator::record_stream(void* p, StreamId stream) {
  std::lock_guard<std::mutex> lk(m_);
  auto it = live_.find(p);
  KILN_CHECK(it != live_.end(), name_, ": record_stream on a pointer that is not allocated");
  Block& b = it->second;
  if (stream != b.stream && std::find(b.also_used_on.begin(), b.also_used_on.end(), stream) == b.also_used_on.end())
    b.also_used_on.push_back(stream);
}

void CachingAllocator::release_cached_locked() {
  // Blocks still waiting for another stream's work are memory too: wait for that work, so that they
  // are given back with the rest.
  for (const Pending& q : pending_)
    for (void* e : q.events) device_->wait_event(e);
  collect_pending_locked();
  for (auto& [key, ptrs] : free_)
    for (void* p : ptrs) {
      stats_.reserved -= cached_.at(p).size;
      cached_.erase(p);
      device_->deallocate(p);
      ++stats_.device_frees;
    }
  free_.clear();
}

void CachingAllocator::release_cached() {
  std::lock_guard<std::mutex> lk(m_);
  release_cached_locked();
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lk(m_);
  return stats_;
}

void CachingAllocator::reset_peaks() {
  std::lock_guard<std::mutex> lk(m_);
  stats_.peak_allocated = stats_.allocated;
  stats_.peak_reserved = stats_.reserved;
}

}  // namespace kiln
