// What the communicators share: one thread that runs collectives in the order they were issued
// (bucket all-reduces overlap the backward that issues them; every rank sees one sequence), and the
// CollectiveError a collective that timed out or broke throws. After one, the thread fails every
// later job at once: the ranks no longer agree on the sequence, so nothing more may be sent.
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
#include "base/error.h"
#include "base/thread_pool.h"

namespace kiln::dist::detail {

class Job final : public Work {
 public:
  explicit Job(std::function<void()> fn) : fn_(std::move(fn)) {}
  // Runs the job, or fails it with `poison` (an earlier collective's error) without running it.
  // Returns the CollectiveError the job threw, if any.
  std::exception_ptr run(const std::exception_ptr& poison) {
    std::exception_ptr broke;
    try {
      if (poison) std::rethrow_exception(poison);
      fn_();
    } catch (const CollectiveError&) {
      error_ = std::current_exception();
      broke = error_;
    } catch (...) {
      error_ = std::current_exception();
    }
    fn_ = nullptr;  // the tensors it captured go now, not when the last holder of the Work lets go
    {
      std::lock_guard<std::mutex> lk(m_);
      done_ = true;
    }
    cv_.notify_all();
    return broke;
  }
  void wait() override {
    std::unique_lock<std::mutex> lk(m_);
    cv_.wait(lk, [&] { return done_; });
    if (error_) std::rethrow_exception(error_);
  }
  bool done() override {
    std::lock_guard<std::mutex> lk(m_);
    return done_;
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
      if (std::exception_ptr broke = job->run(poison_); broke && !poison_) poison_ = broke;
    }
  }
  std::exception_ptr poison_;  // the first CollectiveError; touched by the thread only
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

// What DataParallel and ZeroRedundancy share about their buckets (each has `pending`, the
// gradients still to come, and `work`, the collective in flight).
// Launches, in bucket order only, every bucket that is complete and not yet in flight, so every
// rank issues the same collectives in the same sequence.
template <typename Bucket, typename Launch> void launch_ready_buckets(std::vector<Bucket>& buckets, Launch launch) {
  for (auto& b : buckets) {
    if (b.work) continue;
    if (b.pending > 0) break;
    launch(b);
  }
}
// Hooks off, and buckets still in flight landed before their buffers go; a failed one has already
// thrown to finish() (a destructor never throws).
template <typename Bucket>
void release_buckets(std::vector<Tensor>& params, const std::vector<int>& hook_ids, std::vector<Bucket>& buckets) {
  for (size_t k = 0; k < hook_ids.size(); ++k) params[k].remove_grad_ready_hook(hook_ids[k]);
  for (auto& b : buckets)
    if (b.work) {
      try {
        b.work->wait();
      } catch (...) {
      }
    }
}

#define KILN_COLLECTIVE_FAIL(timed_out, ...) \
  throw ::kiln::dist::CollectiveError(::kiln::detail::str_cat(__VA_ARGS__), timed_out, __FILE__, __LINE__)

[[noreturn]] inline void throw_timeout(const char* backend, int rank, int size, const char* what, long long bytes,
                                       std::chrono::seconds timeout) {
  KILN_COLLECTIVE_FAIL(true, "rank ", rank, " of ", size, " (", backend, "): ", what, " of ", bytes,
                       " bytes did not complete within ", timeout.count(),
                       " s (--dist-timeout); another rank has died, hangs, or issued different collectives");
}

}  // namespace kiln::dist::detail
