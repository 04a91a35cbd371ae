// A Philox generator is just (seed, offset): draws reserve blocks of the counter space, so the
// state is two integers that a checkpoint saves and any device can reproduce.
#pragma once
#include <cstdint>

namespace kiln {

struct Generator {
  uint64_t seed = 0;
  uint64_t offset = 0;  // next unused element of the stream; always a multiple of 4

  Generator() = default;
  explicit Generator(uint64_t s) : seed(s) {}
  // Reserves `n` elements and returns where they start.
  uint64_t reserve(uint64_t n) {
    const uint64_t start = offset;
    offset += (n + 3) / 4 * 4;
    return start;
  }
};

// The process-wide default generator of the current Context.
Generator& default_generator();
void manual_seed(uint64_t seed);

}  // namespace kiln
