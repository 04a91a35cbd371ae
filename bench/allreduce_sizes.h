// The message sizes bench_allreduce sweeps, apart so a test can check the list without ranks.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

namespace kiln::bench {

// 8 B, 32 B, ... (x4) below `max_bytes`, then `max_bytes` itself as the last size (rounded down to
// whole f32 values, at least one): --max-bytes 1 GiB ends at 1 GiB, not at 512 MiB.
inline std::vector<int64_t> allreduce_sizes(int64_t max_bytes) {
  const int64_t last = std::max<int64_t>(4, max_bytes / 4 * 4);
  std::vector<int64_t> sizes;
  // The next size only while it stays below `last`: b * 4 overflowed (and looped forever) for a
  // --max-bytes above 2^61.
  for (int64_t b = 8; b < last; b = b <= (last - 1) / 4 ? b * 4 : last) sizes.push_back(b);
  sizes.push_back(last);
  return sizes;
}

}  // namespace kiln::bench
