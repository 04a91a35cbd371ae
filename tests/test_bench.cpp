// The benchmark programs' shared pieces that need no timing (bench/bench_main.h,
// bench/allreduce_sizes.h, bench/ops_row.h); their refusals and JSON writes are ctest entries in
// bench/CMakeLists.txt.
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <thread>
#include <vector>

#include "bench/allreduce_sizes.h"
#include "bench/bench_main.h"
#include "bench/gemm_check.h"
#include "bench/ops_row.h"

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
  // A 20 ms preparation and an empty call: a time near 0, not 20 ms (CHECK(ms >= 0) could not fail).
  const double ms = bench::median_ms([&] { ++ran; }, 4, {},
                                     [&] {
                                       ++prepared;
                                       std::this_thread::sleep_for(std::chrono::milliseconds(20));
                                     });
  CHECK(ran == 5);  // one warm-up, four timed
  CHECK(prepared == 5);
  CHECK(ms >= 0);
  CHECK(ms < 10);
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
  // Near the top of int64: no overflow of the x4 step (it looped forever above 2^61).
  const int64_t top = std::numeric_limits<int64_t>::max();
  const std::vector<int64_t> big = bench::allreduce_sizes(top);
  REQUIRE(big.size() == 31);  // 2^3, 2^5, ..., 2^61, then the last
  CHECK(big[29] == int64_t(1) << 61);
  CHECK(big.back() == top / 4 * 4);
  CHECK(bench::allreduce_sizes((int64_t(1) << 61) + 4).back() == (int64_t(1) << 61) + 4);
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

TEST_CASE("bench: bench_ops' JSON keeps the forward and forward+backward ratios apart") {
  const bench::OpTiming cpu_grad{2.0, 8.0, true}, cuda_grad{1.0, 2.0, true};
  const bench::OpTiming cpu_nograd{3.0, 0.0, false}, cuda_nograd{1.5, 0.0, false};
  const nlohmann::json g = bench::ops_row_json("matmul", cpu_grad, &cuda_grad);
  CHECK(g["cpu_over_cuda_fwd"].get<double>() == 2.0);
  CHECK(g["cpu_over_cuda_fwd_bwd"].get<double>() == 4.0);
  CHECK(!g.contains("cpu_over_cuda"));  // was the fwd+bwd ratio here, the forward's for other rows
  // A row without gradients: its fwd+bwd ratio is null, not the forward's under another name.
  const nlohmann::json n = bench::ops_row_json("argmax", cpu_nograd, &cuda_nograd);
  CHECK(n["cpu_over_cuda_fwd"].get<double>() == 2.0);
  CHECK(n["cpu_over_cuda_fwd_bwd"].is_null());
  CHECK(n["cpu_fwd_bwd_ms"].is_null());
  CHECK(n["cuda_fwd_bwd_ms"].is_null());
  // No GPU: the CPU columns only.
  const nlohmann::json c = bench::ops_row_json("argmax", cpu_nograd, nullptr);
  CHECK(c["cpu_fwd_ms"].get<double>() == 3.0);
  CHECK(!c.contains("cpu_over_cuda_fwd"));
  CHECK(!c.contains("cuda_fwd_ms"));
}
