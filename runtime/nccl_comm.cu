// NCCL communicator. Ordering: a collective first makes its NCCL stream wait for an event recorded
// on the compute stream (the gradients it reduces are written there), then runs on the NCCL stream,
// so bucket all-reduces overlap the rest of backward; Work::wait() polls for completion with the
// job's timeout and then orders the compute stream after it. Communicators are created with
// blocking = 0, so set-up and enqueueing never block past the timeout either.
#include <nccl.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "engine/dist_internal.h"
#include "engine/ops.h"
#include "kernels/cuda/context.h"
#include "kernels/cuda/cuda_backend.h"
#include "runtime/nccl_comm.h"

namespace kiln::cuda {
namespace {

using Clock = std::chrono::steady_clock;

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::f16: return ncclFloat16;
    case DType::bf16: return ncclBfloat16;
    case DType::f64: return ncclFloat64;
    case DType::i32: return ncclInt32;
    case DType::i64: return ncclInt64;
    case DType::u8: case DType::boolean: return ncclUint8;
    case DType::i8: return ncclInt8;
    case DType::i16: break;
  }
  KILN_FAIL("NCCL reduces no ", t, " tensors (it has no 16-bit integer type): reduce them as i32");
}

ncclRedOp_t nccl_op(dist::ReduceOp op) {
  switch (op) {
    case dist::ReduceOp::sum: return ncclSum;
    case dist::ReduceOp::avg: return ncclAvg;
    case dist::ReduceOp::max: return ncclMax;
    case dist::ReduceOp::min: return ncclMin;
  }
  return ncclSum;
}

class NcclComm;

// A collective already finished when it returns (one staged through host memory).
struct FinishedWork final : dist::Work {
  void wait() override {}
  bool done() override { return true; }
};

// A pending collective. It names its communicator through a weak token, so a wait() after the
// communicator was destroyed is an error, not a dangling pointer.
class NcclWork final : public dist::Work {
 public:
  NcclWork(NcclComm* c, std::weak_ptr<void> alive, cudaEvent_t done, std::string what, long long bytes)
      : c_(c), alive_(std::move(alive)), done_(done), what_(std::move(what)), bytes_(bytes) {}
  ~NcclWork() override { cudaEventDestroy(done_); }
  void wait() override;
  // The event has passed: the collective's kernels on the communicator's stream have finished.
  bool done() override { return query_done(cudaEventQuery(done_), "cudaEventQuery (NCCL work)"); }

 private:
  NcclComm* c_;
  std::weak_ptr<void> alive_;
  cudaEvent_t done_;
  std::string what_;
  long long bytes_;
};

class NcclComm final : public dist::Communicator {
 public:
  NcclComm(dist::Communicator& bootstrap, int device, std::chrono::seconds timeout)
      : rank_(bootstrap.rank()), size_(bootstrap.world_size()), device_(device), timeout_(timeout) {
    Context& ctx = use(device);
    KILN_CUDA_OK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    try {
      ncclUniqueId id;
      std::memset(&id, 0, sizeof id);
      if (rank_ == 0) ok(ncclGetUniqueId(&id), "ncclGetUniqueId");
      Tensor bytes = zeros({int64_t(sizeof id)}, DType::u8);
      std::memcpy(bytes.raw_data(), &id, sizeof id);
      bootstrap.broadcast(bytes, 0);
      std::memcpy(&id, bytes.raw_data(), sizeof id);
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 0;
      const ncclResult_t r = ncclCommInitRankConfig(&comm_, size_, id, rank_, &config);
      settle(r, "ncclCommInitRankConfig (setting up NCCL between the ranks)", 0);
    } catch (...) {
      // No destructor runs for a constructor that throws: the half-made communicator (an invalid-usage
      // answer, two ranks on one GPU, is thrown without an abort) and the stream go here.
      if (comm_) ncclCommAbort(comm_);
      comm_ = nullptr;
      cudaStreamDestroy(stream_);
      (void)cudaGetLastError();
      throw;
    }
    (void)ctx;
  }
  // Teardown of a non-blocking communicator: its device current, finalize (flushes what was issued),
  // poll until that settles, then destroy; abort instead when it does not settle in the timeout or
  // fails. Never throws (a destructor), whatever state NCCL or the device is in.
  ~NcclComm() override {
    cudaSetDevice(device_);
    if (comm_) {
      ncclResult_t r = ncclCommFinalize(comm_);
      const auto deadline = Clock::now() + timeout_;
      while (r == ncclInProgress && Clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
        if (ncclCommGetAsyncError(comm_, &r) != ncclSuccess) break;
      }
      if (r == ncclSuccess) ncclCommDestroy(comm_);
      else ncclCommAbort(comm_);
      comm_ = nullptr;
    }
    // The stream is left to the process, as Context's are: tensors broadcast or reduced on it (parameters,
    // ZeRO's flat buffers) are marked as used by it, and the allocator records an event on it when one of
    // them is freed, which may be after this communicator is gone. Its work is done first.
    if (stream_) cudaStreamSynchronize(stream_);
    (void)cudaGetLastError();
  }

  int rank() const override { return rank_; }
  int world_size() const override { return size_; }
  const char* backend() const override { return "nccl"; }

  std::shared_ptr<dist::Work> all_reduce_async(const Tensor& t, dist::ReduceOp op) override {
    if (t.device().is_cpu()) return staged(t, [&](const Tensor& d) { all_reduce(d, op); });
    check(t, "all_reduce");
    before(t);
    settle(ncclAllReduce(t.raw_data(), t.raw_data(), size_t(t.numel()), nccl_type(t.dtype()), nccl_op(op), comm_, stream_),
           "ncclAllReduce", t.nbytes());
    return after("all_reduce", t.nbytes());
  }
  void broadcast(const Tensor& t, int root) override {
    dist::detail::check_root(root, size_);
    if (t.device().is_cpu()) return staged(t, [&](const Tensor& d) { broadcast(d, root); })->wait();
    check(t, "broadcast");
    before(t);
    settle(ncclBroadcast(t.raw_data(), t.raw_data(), t.nbytes(), ncclUint8, root, comm_, stream_), "ncclBroadcast",
           t.nbytes());
    after("broadcast", t.nbytes())->wait();
  }
  void all_gather(const Tensor& in, const Tensor& out) override {
    KILN_CHECK(out.numel() == in.numel() * size_ && out.dtype() == in.dtype(), "all_gather: ", out.type_str(),
               " must hold ", size_, " x ", in.numel(), " elements of ", in.dtype());
    if (in.device().is_cpu() || out.device().is_cpu()) {
      const Tensor di = in.to(cuda_device(device_)), dout = zeros(out.shape(), TensorOptions(out.dtype(), cuda_device(device_)));
      all_gather(di, dout);
      Tensor(out).copy_(dout);
      synchronize(device_);
      return;
    }
    check(in, "all_gather");
    check(out, "all_gather");
    before(in);
    before(out);
    settle(ncclAllGather(in.raw_data(), out.raw_data(), in.nbytes(), ncclUint8, comm_, stream_), "ncclAllGather",
           out.nbytes());
    after("all_gather", out.nbytes())->wait();
  }
  void reduce_scatter(const Tensor& in, const Tensor& out, dist::ReduceOp op) override {
    reduce_scatter_async(in, out, op)->wait();
  }
  // On the NCCL stream, returning at once (ZeRO's buckets go out while backward runs).
  std::shared_ptr<dist::Work> reduce_scatter_async(const Tensor& in, const Tensor& out, dist::ReduceOp op) override {
    KILN_CHECK(in.numel() == out.numel() * size_ && out.dtype() == in.dtype(), "reduce_scatter: ", in.type_str(),
               " must hold ", size_, " x ", out.numel(), " elements of ", out.dtype());
    if (in.device().is_cpu() || out.device().is_cpu()) {
      const Tensor di = in.to(cuda_device(device_)), dout = zeros(out.shape(), TensorOptions(out.dtype(), cuda_device(device_)));
      reduce_scatter(di, dout, op);
      Tensor(out).copy_(dout);
      synchronize(device_);
      return std::make_shared<FinishedWork>();
    }
    check(in, "reduce_scatter");
    check(out, "reduce_scatter");
    before(in);
    before(out);
    settle(ncclReduceScatter(in.raw_data(), out.raw_data(), size_t(out.numel()), nccl_type(out.dtype()), nccl_op(op),
                             comm_, stream_),
           "ncclReduceScatter", in.nbytes());
    return after("reduce_scatter", in.nbytes());
  }
  void barrier() override {
    Tensor one = ones({1}, TensorOptions(DType::f32, cuda_device(device_)));
    all_reduce(one, dist::ReduceOp::sum);
    synchronize(device_);
  }

  // Polls until `done` has passed or the job's timeout; NCCL's own errors end the wait early.
  void wait_for(cudaEvent_t done, const std::string& what, long long bytes) {
    use(device_);
    live(what.c_str());  // an aborted communicator's earlier events may still complete: not a result
    const auto deadline = Clock::now() + timeout_;
    while (true) {
      const cudaError_t e = cudaEventQuery(done);
      if (e == cudaSuccess) break;
      KILN_CHECK(e == cudaErrorNotReady, "NCCL ", what, " on cuda:", device_, ": ", cuda_error(e));
      (void)cudaGetLastError();  // not ready is also left as the last error (query_done says why)
      live(what.c_str());
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress) broken(what.c_str(), async);
      if (Clock::now() > deadline) abort_job(what.c_str(), bytes);
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
    // Later work on the compute stream reads the result.
    KILN_CUDA_OK(cudaStreamWaitEvent(context(device_).stream, done, 0));
  }

 private:
  void ok(ncclResult_t r, const char* what) {
    KILN_CHECK(r == ncclSuccess, what, " failed on rank ", rank_, ": ", ncclGetErrorString(r));
  }
  // Non-blocking communicators may answer ncclInProgress: poll until the call has settled.
  void settle(ncclResult_t r, const char* what, long long bytes) {
    const auto deadline = Clock::now() + timeout_;
    while (r == ncclInProgress) {
      if (Clock::now() > deadline) abort_job(what, bytes);
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      ncclCommGetAsyncError(comm_, &r);
    }
    // A bad argument is the caller's error; anything else (a peer, the network, NCCL itself) breaks
    // the communicator.
    if (r == ncclInvalidArgument || r == ncclInvalidUsage)
      KILN_FAIL(what, " failed on rank ", rank_, " of ", size_, ": ", ncclGetErrorString(r),
                comm_ ? std::string(" (") + ncclGetLastError(comm_) + ")" : std::string());
    if (r != ncclSuccess) broken(what, r);
  }
  // A collective that failed: abort the communicator (later calls fail at once) and throw.
  [[noreturn]] void broken(const char* what, ncclResult_t r) {
    const std::string detail = comm_ ? std::string(" (") + ncclGetLastError(comm_) + ")" : std::string();
    if (comm_) ncclCommAbort(comm_);
    comm_ = nullptr;
    KILN_COLLECTIVE_FAIL(false, "NCCL ", what, " failed on rank ", rank_, " of ", size_, ": ", ncclGetErrorString(r),
                         detail);
  }
  // A timed-out collective: abort the communicator (its kernels return, later calls fail) and throw.
  [[noreturn]] void abort_job(const char* what, long long bytes) {
    if (comm_) ncclCommAbort(comm_);
    comm_ = nullptr;
    dist::detail::throw_timeout("nccl", rank_, size_, what, bytes, timeout_);
  }
  // After a timed-out collective aborted the communicator, every later one throws.
  void live(const char* what) const {
    if (!comm_)
      KILN_COLLECTIVE_FAIL(false, "NCCL ", what, " on rank ", rank_, " of ", size_,
                           ": the communicator was aborted after an earlier collective timed out");
  }
  void check(const Tensor& t, const char* what) {
    live(what);
    KILN_CHECK(t.defined() && t.is_contiguous() && t.device() == cuda_device(device_), what,
               ": the NCCL communicator of cuda:", device_, " needs a contiguous tensor there, got ",
               t.defined() ? t.type_str() : std::string("an undefined tensor"));
  }
  // The NCCL stream waits for what the compute stream has queued; the tensor's memory is not
  // reused before the NCCL stream is done with it.
  void before(const Tensor& t) {
    Context& ctx = use(device_);
    cudaEvent_t ready;
    KILN_CUDA_OK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
    KILN_CUDA_OK(cudaEventRecord(ready, ctx.stream));
    KILN_CUDA_OK(cudaStreamWaitEvent(stream_, ready, 0));
    cudaEventDestroy(ready);  // released once the wait has been enqueued
    // Memory the caching allocator owns is not reused before the NCCL stream is done with it; a
    // from_blob tensor's memory is its owner's to keep alive.
    if (t.nbytes() > 0 && t.storage()->allocator) ctx.allocator().record_stream(t.storage()->data, stream_id(stream_));
  }
  std::shared_ptr<dist::Work> after(const char* what, long long bytes) {
    use(device_);
    cudaEvent_t done;
    KILN_CUDA_OK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    KILN_CUDA_OK(cudaEventRecord(done, stream_));
    return std::make_shared<NcclWork>(this, alive_, done, what, bytes);
  }
  // A CPU tensor goes through the device and back (small agreements: flags, counters, ids).
  template <typename F> std::shared_ptr<dist::Work> staged(const Tensor& t, F&& fn) {
    KILN_CHECK(t.defined() && t.is_contiguous(), "NCCL communicator: needs a contiguous tensor");
    const Tensor d = t.to(cuda_device(device_));
    fn(d);
    Tensor(t).copy_(d);  // to(cpu) inside waits for the device
    return std::make_shared<FinishedWork>();
  }

  int rank_, size_, device_;
  std::chrono::seconds timeout_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  std::shared_ptr<void> alive_ = std::make_shared<int>(0);  // expires with the communicator
};

void NcclWork::wait() {
  if (alive_.expired())
    KILN_COLLECTIVE_FAIL(false, "NCCL ", what_, ": the communicator was destroyed before wait() on its work");
  c_->wait_for(done_, what_, bytes_);
}

}  // namespace

std::unique_ptr<dist::Communicator> make_nccl_communicator(dist::Communicator& bootstrap, int device,
                                                           std::chrono::seconds timeout) {
  return std::make_unique<NcclComm>(bootstrap, device, timeout);
}

}  // namespace kiln::cuda
