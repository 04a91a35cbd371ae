// The engine's thread pool (base/thread_pool.h): workers spin briefly between jobs, then sleep. Many
// jobs back to back (workers spinning) and after pauses longer than the spin (workers asleep), with
// every chunk count, exceptions and resizes: each index runs exactly once, and nothing hangs.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "base/thread_pool.h"

TEST_CASE("thread pool: jobs back to back and after sleeps, every size, exceptions, resizes") {
  const int saved = kiln::num_threads();
  for (const int threads : {1, 2, 3, 4}) {
    INFO(threads << " threads");
    kiln::set_num_threads(threads);
    int64_t bad = 0;
    for (int iter = 0; iter < 3000; ++iter) {
      const int64_t n = iter % 41;
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      // Every other job counts its indices through a nested parallel_for (run inline on the worker).
      kiln::parallel_for(0, n, 1 + iter % 3, [&](int64_t b, int64_t e) {
        if (iter % 2) {
          for (int64_t i = b; i < e; ++i) hits[size_t(i)].fetch_add(1);
          return;
        }
        kiln::parallel_for(b, e, 1, [&](int64_t b2, int64_t e2) {
          for (int64_t i = b2; i < e2; ++i) hits[size_t(i)].fetch_add(1);
        });
      });
      for (const auto& h : hits) bad += h.load() != 1;
      if (iter % 500 == 7) {
        // A throwing chunk reaches the caller; the pool goes on.
        CHECK_THROWS_WITH_AS(kiln::parallel_for(0, 64, 1,
                                                [](int64_t b, int64_t e) {
                                                  if (b <= 5 && 5 < e) throw std::runtime_error("chunk 5 failed");
                                                }),
                             "chunk 5 failed", std::runtime_error);
      }
      if (iter % 300 == 11) std::this_thread::sleep_for(std::chrono::milliseconds(2));  // past the spin: asleep
    }
    CHECK(bad == 0);
  }
  kiln::set_num_threads(saved);
}
