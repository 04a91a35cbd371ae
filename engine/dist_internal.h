// What the communicators share: one thread that runs collectives in the order they were issued
// (bucket all-reduces overlap the backward that issues them; every rank sees one sequence), and the
// message a collective that timed out leaves before the job is ended.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "engine/dist.h"
#include "engine/error.h"
#include "engine/thread_pool.h"

namespace kiln::dist::detail {

class Job final : public Work {
 public:
  explicit Job(std::function<void()> fn) : fn_(std::move(fn)) {}
  void run() {
    try {
      fn_();
    } catch (...) {
      error_ = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lk(m_);
      done_ = true;
    }
    cv_.notify_all();
  }
  void wait() override {
    std::unique_lock<std::mutex> lk(m_);
    cv_.wait(lk, [&] { return done_; });
    if (error_) std::rethrow_exception(error_);
  }

 private:
  std::function<void()> fn_;
  std::mutex m_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

class CommThread {
 public:
  CommThread() : thread_([this] { loop(); }) {}
  ~CommThread() { stop(); }
  // Finishes the queued jobs, then ends the thread.
  void stop() {
    {
      std::lock_guard<std::mutex> lk(m_);
      if (stop_) return;
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  std::shared_ptr<Job> submit(std::function<void()> fn) {
    auto job = std::make_shared<Job>(std::move(fn));
    {
      std::lock_guard<std::mutex> lk(m_);
      queue_.push_back(job);
    }
    cv_.notify_all();
    return job;
  }

 private:
  void loop() {
    run_inline_on_this_thread();  // the compute pool belongs to the training thread
    for (;;) {
      std::shared_ptr<Job> job;
      {
        std::unique_lock<std::mutex> lk(m_);
        cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        job = queue_.front();
        queue_.pop_front();
      }
      job->run();
    }
  }
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

// The argument rules every communicator enforces, with the same messages.
inline void check_tensor(const Tensor& t, const char* what) {
  KILN_CHECK(t.defined() && t.is_contiguous() && t.device().is_cpu(), what, ": needs a contiguous CPU tensor, got ",
             t.defined() ? t.type_str() : std::string("an undefined tensor"));
}
inline void check_root(int root, int size) {
  KILN_CHECK(root >= 0 && root < size, "broadcast: root ", root, " is not a rank of ", size);
}
// all_gather: out holds size blocks of in; reduce_scatter: in holds size blocks of out.
inline void check_blocks(const char* what, const Tensor& whole, const Tensor& block, int size) {
  check_tensor(whole, what);
  check_tensor(block, what);
  KILN_CHECK(whole.numel() == block.numel() * size && whole.dtype() == block.dtype(), what, ": ", whole.type_str(),
             " must hold ", size, " x ", block.numel(), " elements of ", block.dtype());
}

inline void report_timeout(const char* backend, int rank, int size, const char* what, long long bytes,
                           std::chrono::seconds timeout) {
  std::fprintf(stderr,
               "kiln: rank %d of %d (%s): %s of %lld bytes did not complete within %lld s (--dist-timeout); another "
               "rank has died, hangs, or issued different collectives. Aborting the job.\n",
               rank, size, backend, what, bytes, (long long)timeout.count());
  std::fflush(stderr);
}

}  // namespace kiln::dist::detail
