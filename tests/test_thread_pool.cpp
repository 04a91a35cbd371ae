// The engine's thread pool (base/thread_pool.h): workers spin briefly between jobs, then sleep. Many
// jobs back to back (workers spinning) and after pauses longer than the spin (workers asleep), with
// every chunk count, exceptions and resizes: each index runs exactly once, and nothing hangs.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
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
  // An error raised on any thread of a parallel_for names the caller's op (OpScope), as on the caller's own.
  for (int64_t at = 0; at < 64; at += 7) {
    std::string what;
    try {
      const kiln::OpScope scope("myop");
      kiln::parallel_for(0, 64, 1, [at](int64_t b, int64_t e) {
        if (b <= at && at < e) KILN_FAIL("chunk ", at, " failed");
      });
    } catch (const kiln::Error& e) {
      what = e.message();
    }
    CHECK(what == "myop: chunk " + std::to_string(at) + " failed");
  }
  // A count no machine has is refused before a thread starts, and the pool keeps its size.
  kiln::set_num_threads(2);
  CHECK_THROWS_AS(kiln::set_num_threads(100000), kiln::Error);
  CHECK_THROWS_AS(kiln::set_num_threads(0), kiln::Error);
  CHECK(kiln::num_threads() == 2);
  kiln::set_num_threads(saved);
}

// A container's CPU quota (docker --cpus, a Kubernetes limit) caps the pool: the quota over its period,
// rounded up, from the process's cgroup or one above it (the smallest), cgroup v2 or v1.
TEST_CASE("thread pool: a cgroup CPU quota caps the CPUs, v2 and v1, on the cgroup or a parent") {
  // The mounts of a v2 host unless a case gives its own.
  const std::string v2_mounts = "30 23 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate\n";
  auto limit = [&](std::map<std::string, std::string> files) {
    files.emplace("/proc/self/mountinfo", v2_mounts);
    return kiln::cgroup_cpu_limit([&](const std::string& path) {
      const auto it = files.find(path);
      return it == files.end() ? std::string() : it->second;
    });
  };
  CHECK(kiln::cgroup_cpu_limit([](const std::string&) { return std::string(); }) == 0);  // nothing to read
  CHECK(limit({}) == 0);
  CHECK(limit({{"/proc/self/cgroup", "0::/job\n"}, {"/sys/fs/cgroup/job/cpu.max", "200000 100000\n"}}) == 2);
  CHECK(limit({{"/proc/self/cgroup", "0::/job\n"}, {"/sys/fs/cgroup/job/cpu.max", "150000 100000\n"}}) == 2);
  CHECK(limit({{"/proc/self/cgroup", "0::/job\n"}, {"/sys/fs/cgroup/job/cpu.max", "20000 100000\n"}}) == 1);
  CHECK(limit({{"/proc/self/cgroup", "0::/job\n"}, {"/sys/fs/cgroup/job/cpu.max", "max 100000\n"}}) == 0);
  // On a parent, and the smallest of several.
  CHECK(limit({{"/proc/self/cgroup", "0::/a/b\n"},
               {"/sys/fs/cgroup/a/b/cpu.max", "max 100000\n"},
               {"/sys/fs/cgroup/a/cpu.max", "400000 100000\n"}}) == 4);
  CHECK(limit({{"/proc/self/cgroup", "0::/a/b\n"},
               {"/sys/fs/cgroup/a/b/cpu.max", "600000 100000\n"},
               {"/sys/fs/cgroup/a/cpu.max", "300000 100000\n"},
               {"/sys/fs/cgroup/cpu.max", "max 100000\n"}}) == 3);
  // Inside a container the path may not exist under the mount: its root is the container's.
  CHECK(limit({{"/proc/self/cgroup", "0::/docker/abc\n"}, {"/sys/fs/cgroup/cpu.max", "800000 100000\n"}}) == 8);
  // cgroup v1: the cpu controller, alone or with cpuacct; -1 is no quota.
  const std::string v1_cpuacct =
      "35 31 0:32 / /sys/fs/cgroup/cpu,cpuacct rw shared:9 - cgroup cgroup rw,cpu,cpuacct\n"
      "36 31 0:33 / /sys/fs/cgroup/memory rw shared:10 - cgroup cgroup rw,memory\n";
  const std::string v1_cpu =
      "35 31 0:32 / /sys/fs/cgroup/cpu rw shared:9 - cgroup cgroup rw,cpu\n"
      "36 31 0:33 / /sys/fs/cgroup/cpuacct rw shared:10 - cgroup cgroup rw,cpuacct\n";
  CHECK(limit({{"/proc/self/mountinfo", v1_cpuacct},
               {"/proc/self/cgroup", "4:cpu,cpuacct:/docker/abc\n3:memory:/docker/abc\n"},
               {"/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "50000\n"},
               {"/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us", "100000\n"}}) == 1);
  CHECK(limit({{"/proc/self/mountinfo", v1_cpu},
               {"/proc/self/cgroup", "1:cpu:/k\n2:cpuacct:/\n"},
               {"/sys/fs/cgroup/cpu/k/cpu.cfs_quota_us", "250000\n"},
               {"/sys/fs/cgroup/cpu/k/cpu.cfs_period_us", "100000\n"},
               {"/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "-1\n"},
               {"/sys/fs/cgroup/cpu/cpu.cfs_period_us", "100000\n"}}) == 3);
  CHECK(limit({{"/proc/self/mountinfo", v1_cpu},
               {"/proc/self/cgroup", "1:cpuacct:/k\n"},  // cpuacct is not cpu
               {"/sys/fs/cgroup/cpu/k/cpu.cfs_quota_us", "100000\n"},
               {"/sys/fs/cgroup/cpu/k/cpu.cfs_period_us", "100000\n"}}) == 0);
  // A path with ':' in it, the root alone, a path outside the namespace's root, and nonsense.
  CHECK(limit({{"/proc/self/cgroup", "0::/a:b\n"}, {"/sys/fs/cgroup/a:b/cpu.max", "300000 100000\n"}}) == 3);
  CHECK(limit({{"/proc/self/cgroup", "0::/\n"}, {"/sys/fs/cgroup/cpu.max", "100000 100000\n"}}) == 1);
  CHECK(limit({{"/proc/self/cgroup", "0::/../x\n"}, {"/sys/fs/cgroup/cpu.max", "100000 100000\n"}}) == 0);
  for (const char* bad : {"100000", "abc 100000", "100000 0", "-5 100000", "1e30 1"})
    CHECK_MESSAGE(limit({{"/proc/self/cgroup", "0::/\n"}, {"/sys/fs/cgroup/cpu.max", bad}}) == 0, bad);
  const double q = kiln::cgroup_cpu_quota([&](const std::string& path) {
    return path == "/proc/self/cgroup"      ? std::string("0::/\n")
           : path == "/proc/self/mountinfo" ? v2_mounts
                                            : std::string("150000 100000\n");
  });
  CHECK(q == doctest::Approx(1.5));
  // This process: at least one CPU, at most the machine's.
  CHECK(kiln::available_cpus() >= 1);
}

// Where the cpu controller is mounted comes from mountinfo, not from /sys/fs/cgroup's usual names.
TEST_CASE(
    "thread pool: a cgroup CPU quota is read where mountinfo says cpu is mounted (hybrid v2, v1 container root)") {
  auto limit = [](std::map<std::string, std::string> files) {
    return kiln::cgroup_cpu_limit([&](const std::string& path) {
      const auto it = files.find(path);
      return it == files.end() ? std::string() : it->second;
    });
  };
  // A hybrid host: v1 hierarchies under /sys/fs/cgroup (a tmpfs), v2 at /sys/fs/cgroup/unified with
  // the cpu controller (no v1 hierarchy names cpu).
  const std::string hybrid =
      "25 24 0:22 / /sys/fs/cgroup ro,nosuid shared:5 - tmpfs tmpfs ro,mode=755\n"
      "26 25 0:23 / /sys/fs/cgroup/unified rw,nosuid shared:6 - cgroup2 cgroup2 rw\n"
      "30 25 0:27 / /sys/fs/cgroup/memory rw,nosuid shared:11 - cgroup cgroup rw,memory\n";
  CHECK(limit({{"/proc/self/mountinfo", hybrid},
               {"/proc/self/cgroup", "5:memory:/job\n0::/job\n"},
               {"/sys/fs/cgroup/unified/job/cpu.max", "200000 100000\n"}}) == 2);
  CHECK(limit({{"/proc/self/mountinfo", hybrid},
               {"/proc/self/cgroup", "5:memory:/a/b\n0::/a/b\n"},
               {"/sys/fs/cgroup/unified/a/b/cpu.max", "max 100000\n"},
               {"/sys/fs/cgroup/unified/a/cpu.max", "300000 100000\n"}}) == 3);
  // A container without a cgroup namespace: v1's cpu hierarchy mounted with the container's cgroup
  // as its root, under another name; a quota on a cgroup inside the container (the mount's /job)
  // counts, and the host's paths above the container are not read.
  const std::string container =
      "1200 1100 0:32 /docker/abc /sys/fs/cgroup/cpuacct,cpu ro,nosuid shared:9 - cgroup cgroup rw,cpuacct,cpu\n";
  CHECK(limit({{"/proc/self/mountinfo", container},
               {"/proc/self/cgroup", "4:cpuacct,cpu:/docker/abc\n"},
               {"/sys/fs/cgroup/cpuacct,cpu/cpu.cfs_quota_us", "150000\n"},
               {"/sys/fs/cgroup/cpuacct,cpu/cpu.cfs_period_us", "100000\n"}}) == 2);
  const std::string renamed =
      "1200 1100 0:32 /docker/abc /sys/fs/cgroup/cpu,cpuacct ro,nosuid shared:9 - cgroup "
      "cgroup rw,cpu,cpuacct\n";
  CHECK(limit({{"/proc/self/mountinfo", renamed},
               {"/proc/self/cgroup", "4:cpu,cpuacct:/docker/abc/job\n"},
               {"/sys/fs/cgroup/cpu,cpuacct/job/cpu.cfs_quota_us", "300000\n"},
               {"/sys/fs/cgroup/cpu,cpuacct/job/cpu.cfs_period_us", "100000\n"},
               {"/sys/fs/cgroup/cpu,cpuacct/docker/cpu.cfs_quota_us", "100000\n"},
               {"/sys/fs/cgroup/cpu,cpuacct/docker/cpu.cfs_period_us", "100000\n"}}) == 3);
}
