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
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"

#if defined(__linux__)
#include <sched.h>
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

class Pool {
 public:
  explicit Pool(int n) { resize(n); }
  ~Pool() { stop(); }

  int size() const { return n_; }

  void resize(int n) {
    KILN_CHECK(n >= 1, "set_num_threads: need at least 1 thread, got ", n);
    stop();
    n_ = n;
    spin_ = n <= default_threads();
    quit_.store(false);
    for (int i = 0; i + 1 < n; ++i) workers_.emplace_back([this] { worker_loop(); });
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

Pool& pool() {
  static Pool p(default_threads());
  return p;
}

}  // namespace

int available_cpus() {
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
#endif
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(hw);
}

int num_threads() { return pool().size(); }

void set_num_threads(int n) {
  KILN_CHECK(!t_in_parallel, "set_num_threads: cannot resize the pool from inside a parallel_for");
  pool().resize(n);
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
  pool().run(nchunks, [&](int64_t i) {
    int64_t b = begin + i * chunk;
    fn(b, std::min(end, b + chunk));
  });
}

}  // namespace kiln
