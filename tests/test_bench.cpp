// The benchmark programs' shared pieces that need no timing (bench/bench_main.h,
// bench/allreduce_sizes.h); their refusals and JSON writes are ctest entries in bench/CMakeLists.txt.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "bench/allreduce_sizes.h"
#include "bench/bench_main.h"
#include "bench/gemm_check.h"

using namespace kiln;

TEST_CASE("bench: the median of an even count is the mean of the two middle values") {
  CHECK(bench::median({1, 2, 3, 4}) == 2.5);
  CHECK(bench::median({4, 1, 3, 2}) == 2.5);
  CHECK(bench::median({3, 1, 2}) == 2.0);
  CHECK(bench::median({7}) == 7.0);
  CHECK(std::isnan(bench::median({})));
}

TEST_CASE("bench: median_ms times what it is given, untimed preparation apart") {
  int prepared = 0, ran = 0;
  const double ms = bench::median_ms([&] { ++ran; }, 4, {}, [&] { ++prepared; });
  CHECK(ran == 5);  // one warm-up, four timed
  CHECK(prepared == 5);
  CHECK(ms >= 0);
}

TEST_CASE("bench: the all-reduce sizes end at --max-bytes") {
  const std::vector<int64_t> gib = bench::allreduce_sizes(int64_t(1) << 30);
  CHECK(gib.front() == 8);
  CHECK(gib.back() == int64_t(1) << 30);
  CHECK(gib[gib.size() - 2] == int64_t(1) << 29);  // 512 MiB, the last 8 * 4^k below it
  CHECK(bench::allreduce_sizes(100) == std::vector<int64_t>{8, 32, 100});
  CHECK(bench::allreduce_sizes(128) == std::vector<int64_t>{8, 32, 128});
  CHECK(bench::allreduce_sizes(1000) == std::vector<int64_t>{8, 32, 128, 512, 1000});
  CHECK(bench::allreduce_sizes(6) == std::vector<int64_t>{4});
  CHECK(bench::allreduce_sizes(8) == std::vector<int64_t>{8});
}

TEST_CASE("bench: the GEMM agreement check fails on a NaN in either result") {
  const float want[3] = {1.f, 2.f, 3.f}, same[3] = {1.f, 2.f, 3.f}, nan_got[3] = {1.f, NAN, 3.f};
  CHECK(bench::max_scaled_diff(same, want, 3, 4) == 0.0);
  CHECK(bench::gemm_results_agree(bench::max_scaled_diff(same, want, 3, 4), false));
  const double d = bench::max_scaled_diff(nan_got, want, 3, 4);
  CHECK(std::isnan(d));
  CHECK_FALSE(bench::gemm_results_agree(d, false));
  CHECK_FALSE(bench::gemm_results_agree(bench::max_scaled_diff(want, nan_got, 3, 4), false));  // NaN in OpenBLAS's
  const float off[3] = {1.f, 2.f, 4.f};
  CHECK_FALSE(bench::gemm_results_agree(bench::max_scaled_diff(off, want, 3, 4), false));
}
