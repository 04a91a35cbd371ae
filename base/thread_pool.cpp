// A fixed pool of workers that run the chunks of one parallel_for at a time; the calling thread
// takes part. Chunks are handed out through an atomic counter, so fast threads take more of them.
// Between jobs the threads spin briefly before they sleep (kSpin below).
#include "base/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <new>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "base/cgroup.h"
#include "base/error.h"

#include <cerrno>
#include <cmath>
#include <sstream>

#if defined(__linux__)
#include <sched.h>
#endif
#if defined(__unix__)
#include <pthread.h>
#endif

#if defined(__SSE2__)
#include <xmmintrin.h>
#endif

namespace kiln {
namespace {

thread_local bool t_in_parallel = false;
std::atomic<bool> g_flush_denormal{true};

// Sets FTZ (flush results) and DAZ (treat inputs as zero) for a scope, restoring the caller's mode.
class DenormalScope {
 public:
  DenormalScope() {
#if defined(__SSE2__)
    saved_ = _mm_getcsr();
    constexpr unsigned kFtzDaz = 0x8040u;
    const unsigned want = g_flush_denormal.load(std::memory_order_relaxed) ? (saved_ | kFtzDaz) : (saved_ & ~kFtzDaz);
    if (want != saved_) _mm_setcsr(want);
#endif
  }
  ~DenormalScope() {
#if defined(__SSE2__)
    if (_mm_getcsr() != saved_) _mm_setcsr(saved_);
#endif
  }
  DenormalScope(const DenormalScope&) = delete;
  DenormalScope& operator=(const DenormalScope&) = delete;

 private:
  unsigned saved_ = 0;
};

int default_threads() { return available_cpus(); }

// Spins for up to this long (pause instructions, no system call) before blocking on a condition
// variable: waking a thread that sleeps in the kernel took 50-100 us on the 2-core VMs Kiln is tested on,
// longer than most ops' chunks, so without the spin the caller ran every chunk itself. A worker waits
// this long for the next job, the caller this long for the workers' last chunks (as OpenMP runtimes
// spin-wait by default). Not when the pool has more threads than the process has CPUs (available_cpus): a
// spinning thread would hold a core another one needs.
constexpr auto kSpin = std::chrono::microseconds(200);

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// Spins until pred() or kSpin has passed (only checks pred() once without spin); whether pred() held.
template <typename Pred> bool spin_until(bool spin, Pred&& pred) {
  if (!spin) return pred();
  const auto until = std::chrono::steady_clock::now() + kSpin;
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (pred()) return true;
      cpu_relax();
    }
    if (std::chrono::steady_clock::now() >= until) return pred();
  }
}

// More threads than any machine Kiln runs on has cores (x86 servers top out near 512 hardware threads): a
// larger count is a typo, and starting it would exhaust the process's threads before failing. The same
// bound as KILN_NUM_THREADS's (tools/environment.h).
constexpr int kMaxThreads = 4096;

class Pool {
 public:
  explicit Pool(int n) { resize(n); }
  ~Pool() { stop(); }

  int size() const { return n_; }

  // resize() while no parallel work runs: set_num_threads, and a forked child's pool (see pool())
  // back to the parent's size at its first use.
  void resize_between_runs(int n) {
    std::lock_guard<std::mutex> lk(run_mutex_);
    resize(n);
  }

  void resize(int n) {
    KILN_CHECK(n >= 1 && n <= kMaxThreads, "set_num_threads: need 1 to ", kMaxThreads, " threads, got ", n);
    const int before = n_;
    stop();
    try {
      start(n);
    } catch (const std::system_error& e) {  // the system would not start that many: back to the pool before
      stop();
      start(std::max(before, 1));
      KILN_FAIL("set_num_threads: could not start ", n, " threads (", e.what(), "); the pool keeps ", n_);
    }
  }

  void run(int64_t nchunks, const std::function<void(int64_t)>& chunk_fn) {
    std::unique_lock<std::mutex> run_lock(run_mutex_);  // one parallel_for at a time
    {
      std::lock_guard<std::mutex> lk(m_);
      job_ = &chunk_fn;
      nchunks_ = nchunks;
      next_.store(0);
      done_.store(0);
      error_ = nullptr;
      generation_.fetch_add(1, std::memory_order_release);
    }
    cv_.notify_all();  // no system call when every worker is spinning
    work_on_job();
    auto finished = [&] { return done_.load(std::memory_order_acquire) == nchunks && active_.load() == 0; };
    spin_until(spin_, finished);
    // Confirmed under m_, where workers join a job: one that joined after the spin saw it finished is
    // waited for (it finds no chunk left), so no worker is inside this job when it is cleared.
    std::unique_lock<std::mutex> lk(m_);
    done_cv_.wait(lk, finished);
    job_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void start(int n) {
    n_ = n;
    // Spinning under a CPU quota spends it: only as many threads as the quota holds whole CPUs.
    const CpuLimits l = cpu_limits();
    spin_ = n <= l.affinity && (l.quota_exact <= 0 || double(n) <= l.quota_exact);
    quit_.store(false);
    for (int i = 0; i + 1 < n; ++i) workers_.emplace_back([this] { worker_loop(); });
  }

  void stop() {
    {
      std::lock_guard<std::mutex> lk(m_);
      quit_.store(true);
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
    workers_.clear();
  }

  void worker_loop() {
    t_in_parallel = true;
    uint64_t seen = 0;
    for (;;) {
      // A new generation (or quit): briefly by spinning, else asleep on cv_.
      auto posted = [&] { return quit_.load() || generation_.load(std::memory_order_acquire) != seen; };
      const bool hot = spin_until(spin_, posted);
      {
        std::unique_lock<std::mutex> lk(m_);
        if (!hot) cv_.wait(lk, posted);
        if (quit_.load()) return;
        seen = generation_.load();
        if (job_ == nullptr) continue;  // that job finished before this worker got here
        active_.fetch_add(1);
      }
      work_on_job();
      {
        std::lock_guard<std::mutex> lk(m_);
        active_.fetch_sub(1);
      }
      done_cv_.notify_all();
    }
  }

  void work_on_job() {
    DenormalScope denormals;
    const bool was = t_in_parallel;
    t_in_parallel = true;
    for (;;) {
      int64_t i = next_.fetch_add(1);
      if (i >= nchunks_) break;
      try {
        (*job_)(i);
      } catch (...) {
        std::lock_guard<std::mutex> lk(m_);
        if (!error_) error_ = std::current_exception();
      }
      done_.fetch_add(1, std::memory_order_release);
    }
    t_in_parallel = was;
  }

  int n_ = 1;
  bool spin_ = true;  // set while no worker runs (resize)
  std::vector<std::thread> workers_;
  std::mutex run_mutex_;
  std::mutex m_;
  std::condition_variable cv_, done_cv_;
  // job_ and nchunks_ change under m_ while no worker is active_ in a job; a worker joins one under m_.
  const std::function<void(int64_t)>* job_ = nullptr;
  int64_t nchunks_ = 0;
  std::atomic<int64_t> next_{0}, done_{0};
  std::atomic<int> active_{0};
  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> quit_{false};
  std::exception_ptr error_;
};

std::atomic<int> g_threads_after_fork{0};  // a forked child's pool size to start at its first use

Pool& pool() {
  static Pool p(default_threads());
  // In a forked child only the forking thread runs: the workers, and the locks and conditions they
  // held or waited on, are the parent's. Its pool's destructor at exit waited for them for ever
  // (pthread_cond_destroy), as did its next parallel work. So the child gets a fresh pool in place
  // (the old one's memory let go without its destructor) of 1 thread, started to the parent's size
  // at its first use (not in the fork itself: a fork to exec starts none).
#if defined(__unix__)
  static const bool at_fork = [] {
    pthread_atfork(nullptr, nullptr, [] {
      // a child forking again before its first use passes on the size its parent was to start at
      const int pending = g_threads_after_fork.load();
      const int n = pending != 0 ? pending : p.size();
      new (&p) Pool(1);
      g_threads_after_fork.store(n);
    });
    return true;
  }();
  (void)at_fork;
#endif
  if (g_threads_after_fork.load(std::memory_order_relaxed) != 0) {
    const int n = g_threads_after_fork.exchange(0);
    try {
      if (n > 1) p.resize_between_runs(n);
    } catch (const std::exception&) {  // threads the child may not start (pids.max): it runs on 1
    }
  }
  return p;
}

}  // namespace

namespace {
// The CPUs of the affinity mask (a mask sized for the machine: beyond 1024 CPUs the fixed cpu_set_t
// is too small), or 0 where it cannot be read.
int affinity_cpus() {
#if defined(__linux__)
  for (int n = 1024; n <= (1 << 16); n *= 2) {
    cpu_set_t* set = CPU_ALLOC(n);
    if (!set) return 0;
    const size_t bytes = CPU_ALLOC_SIZE(n);
    CPU_ZERO_S(bytes, set);
    const int rc = sched_getaffinity(0, bytes, set);
    const int err = errno;
    const int count = rc == 0 ? CPU_COUNT_S(bytes, set) : 0;
    CPU_FREE(set);
    if (rc == 0) return count;
    if (err != EINVAL) return 0;  // EINVAL: the mask is larger than n CPUs
  }
#endif
  return 0;
}

// "quota period" (cgroup v2's cpu.max; "max ..." is none) or two numbers from v1's files, as CPUs;
// 0 for none (also for nonsense: not positive, or beyond any machine).
double quota_cpus(double quota, double period) {
  if (!(quota > 0) || !(period > 0)) return 0;
  const double r = quota / period;
  return r < double(1 << 20) ? r : 0;
}
}  // namespace

double cgroup_cpu_quota(const std::function<std::string(const std::string&)>& read) {
  double limit = 0;
  auto take = [&](double n) {
    if (n > 0) limit = limit == 0 ? n : std::min(limit, n);
  };
  // The process's cgroup and each one above it (a quota may sit on a parent), where the cpu
  // controller is mounted (base/cgroup.h).
  const CgroupDirs c = cgroup_dirs(read, "cpu");
  for (const std::string& dir : c.dirs) {
    if (c.version == 2) {
      std::istringstream f(read(dir + "/cpu.max"));
      std::string q;
      double period = 0;
      if (f >> q >> period && q != "max") take(quota_cpus(std::atof(q.c_str()), period));
    } else {
      const std::string q = read(dir + "/cpu.cfs_quota_us");
      const std::string p = read(dir + "/cpu.cfs_period_us");
      if (!q.empty() && !p.empty()) take(quota_cpus(std::atof(q.c_str()), std::atof(p.c_str())));
    }
  }
  return limit;
}

namespace {
int whole_cpus(double quota) { return quota > 0 ? std::max(1, int(std::ceil(quota - 1e-9))) : 0; }
}  // namespace

int cgroup_cpu_limit(const std::function<std::string(const std::string&)>& read) {
  return whole_cpus(cgroup_cpu_quota(read));
}

CpuLimits cpu_limits() {
  static const CpuLimits l = [] {
    CpuLimits c;
    c.hardware = std::max(1, int(std::thread::hardware_concurrency()));
    c.affinity = affinity_cpus();
    if (c.affinity <= 0) c.affinity = c.hardware;
    c.quota_exact = cgroup_cpu_quota(read_small_file);
    c.quota = whole_cpus(c.quota_exact);
    return c;
  }();
  return l;
}

int available_cpus() {
  const CpuLimits l = cpu_limits();
  return l.quota > 0 ? std::min(l.affinity, l.quota) : l.affinity;
}

int num_threads() { return pool().size(); }

void set_num_threads(int n) {
  KILN_CHECK(!t_in_parallel, "set_num_threads: cannot resize the pool from inside a parallel_for");
  pool().resize_between_runs(n);
}

bool in_parallel_region() { return t_in_parallel; }

void run_inline_on_this_thread() { t_in_parallel = true; }

void set_flush_denormal(bool on) { g_flush_denormal.store(on); }
bool flush_denormal() { return g_flush_denormal.load(); }

void parallel_for(int64_t begin, int64_t end, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (end <= begin) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t n = end - begin;
  const int threads = t_in_parallel ? 1 : pool().size();
  if (threads == 1 || n <= grain) {
    DenormalScope denormals;
    fn(begin, end);
    return;
  }
  // Up to 4 chunks per thread balances uneven work without much scheduling overhead.
  int64_t nchunks = std::min<int64_t>((n + grain - 1) / grain, int64_t(threads) * 4);
  const int64_t chunk = (n + nchunks - 1) / nchunks;
  nchunks = (n + chunk - 1) / chunk;
  const char* op = OpScope::current();  // an error a worker raises names the caller's op too
  pool().run(nchunks, [&](int64_t i) {
    const OpScope scope(op);
    int64_t b = begin + i * chunk;
    fn(b, std::min(end, b + chunk));
  });
}

}  // namespace kiln
