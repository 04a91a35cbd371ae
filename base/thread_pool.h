// The engine's own thread pool for CPU kernels: every CPU the process may run on unless set_num_threads says
// otherwise (the library reads no environment; `kiln` maps KILN_NUM_THREADS and --threads to it).
// parallel_for splits [begin, end) into chunks of at least `grain` items; nested calls run inline.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

namespace kiln {

int num_threads();
// The CPUs this process may run on: its affinity mask (taskset, a cgroup's cpuset, an MPI launcher's
// binding), or the hardware threads where that cannot be read, and at most what a cgroup CPU quota
// allows (a container started with --cpus 8 on a 64-core host gets 8). Read once, at the first call.
// The pool's default size, and the most
// threads that spin: Open MPI binds each of 2 ranks to one core of a 2-core machine, where a pool of
// all hardware threads ran 2 spinning threads on one core (BERT-tiny MLM at 265-281 samples/s
// against 332-348 with the mask's 1 thread).
int available_cpus();
// What available_cpus() is made of, read once: the hardware threads, the affinity mask's CPUs, and the
// cgroup CPU quota (0: none).
struct CpuLimits {
  int hardware = 1, affinity = 1, quota = 0;  // quota: rounded up
  double quota_exact = 0;                     // e.g. 1.5 for a quota of 150 ms per 100 ms
};
CpuLimits cpu_limits();
// The CPUs a cgroup CPU quota allows this process, rounded up (cgroup v2's cpu.max, v1's
// cpu.cfs_quota_us / cpu.cfs_period_us, on the process's cgroup and those above it; the smallest),
// or 0 for no quota. The cpu controller's mount and this process's cgroup come from
// /proc/self/mountinfo and /proc/self/cgroup (base/cgroup.h cgroup_dirs). `read(path)` gives a
// file's text, "" when it cannot be read.
int cgroup_cpu_limit(const std::function<std::string(const std::string&)>& read);
// The same quota as a fraction of CPUs (1.5 for 150 ms per 100 ms), 0 for none.
double cgroup_cpu_quota(const std::function<std::string(const std::string&)>& read);
// Resizes the pool (n >= 1). Not safe to call while a parallel_for is running.
void set_num_threads(int n);
// Calls fn(chunk_begin, chunk_end) on disjoint chunks covering [begin, end), in parallel.
// Chunk boundaries depend on the thread count, so a kernel whose result must not depend on it
// (a reduction) must pick its own fixed chunking and use parallel_for only to spread the chunks.
void parallel_for(int64_t begin, int64_t end, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);
// True inside a pool worker (or inside a parallel_for body on the calling thread).
bool in_parallel_region();
// Denormal (subnormal) floats are flushed to zero inside every parallel_for, on every thread that runs
// a chunk (x86 FTZ + DAZ), so results never depend on which thread ran what. Default on: a softmax
// row whose exp underflows to subnormals otherwise makes each GEMM that reads it up to 8x slower
// (microcode assists), and GPUs flush in their fast paths too. Off gives IEEE gradual underflow.
void set_flush_denormal(bool on);
bool flush_denormal();
// Makes every parallel_for on the calling thread run inline, for threads that must not queue on the
// compute pool (data-loader workers). Lasts for the thread's life.
void run_inline_on_this_thread();

}  // namespace kiln
