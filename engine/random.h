// A Philox generator is just (seed, offset): draws reserve blocks of the counter space, so the
// state is two integers that a checkpoint saves and any device can reproduce.
#pragma once
#include <atomic>
#include <cstdint>

namespace kiln {

struct Generator {
  uint64_t seed = 0;
  uint64_t offset = 0;  // next unused element of the stream; always a multiple of 4

  Generator() = default;
  explicit Generator(uint64_t s) : seed(s) {}
  // Reserves `n` elements and returns where they start. Atomic: dropout draws without the GIL while
  // ds[i] draws under it, and a plain read-then-add could hand two callers the same Philox blocks.
  uint64_t reserve(uint64_t n) {
    return std::atomic_ref<uint64_t>(offset).fetch_add((n + 3) / 4 * 4, std::memory_order_relaxed);
  }
};

// The process-wide default generator of the current Context (or this thread's ThreadGenerator).
Generator& default_generator();
void manual_seed(uint64_t seed);

// While it lives, default_generator() on this thread is a private copy of `g`: a checkpoint's
// recompute replays the forward's stream through it, so draws other threads make meanwhile (a data
// loader, ds[i]) neither shift the replayed masks nor are lost when the replay ends.
class ThreadGenerator {
 public:
  explicit ThreadGenerator(const Generator& g);
  ~ThreadGenerator();
  ThreadGenerator(const ThreadGenerator&) = delete;
  ThreadGenerator& operator=(const ThreadGenerator&) = delete;

 private:
  Generator g_;
  Generator* prev_;
};

}  // namespace kiln

#include "kernels/common/philox.h"

namespace kiln {

// Sequential host-side draws from one Philox stream: key `seed`, counters from `first_block` on.
// Data loaders use it so a shuffle or an augmentation is a pure function of (seed, stream), never
// of thread timing.
// The high 64 bits of the 128-bit product a * b, from 32-bit halves (ISO C++ has no 128-bit integer:
// unsigned __int128 here warned under -Wpedantic in every file that includes ops.h); the same value.
inline uint64_t mul_high(uint64_t a, uint64_t b) {
  const uint64_t a_lo = a & 0xFFFFFFFFull, a_hi = a >> 32, b_lo = b & 0xFFFFFFFFull, b_hi = b >> 32;
  const uint64_t lo_hi = a_lo * b_hi, hi_lo = a_hi * b_lo;
  // at most (2^32 - 1) * 2 + (2^32 - 1)^2 = 2^64 - 1: no carry lost
  const uint64_t mid = ((a_lo * b_lo) >> 32) + (hi_lo & 0xFFFFFFFFull) + lo_hi;
  return a_hi * b_hi + (hi_lo >> 32) + (mid >> 32);
}

class PhiloxStream {
 public:
  PhiloxStream(uint64_t seed, uint64_t first_block) : seed_(seed), block_(first_block) {}
  uint32_t next_u32() {
    if (lane_ == 4) {
      cur_ = philox_block(seed_, block_++);
      lane_ = 0;
    }
    return cur_.v[lane_++];
  }
  // Uniform in [0, n) for n >= 1 (64-bit multiply-shift; the bias is below 2^-32 for the sizes used).
  uint64_t below(uint64_t n) {
    const uint64_t x = uint64_t(next_u32()) << 32 | next_u32();
    return mul_high(x, n);
  }
  float uniform() { return u32_to_uniform(next_u32()); }  // [0, 1)

 private:
  uint64_t seed_, block_;
  U32x4 cur_{};
  int lane_ = 4;
};

// Mixes two 64-bit values into a seed (splitmix64 finaliser), for per-epoch and per-purpose keys.
inline uint64_t mix_seed(uint64_t a, uint64_t b) {
  uint64_t z = a + 0x9E3779B97F4A7C15ull * (b + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace kiln
