// The MPI communicator for CPU ranks. Every collective runs on one communication thread, in the
// order it was issued (so bucket all-reduces overlap the backward that issues them, and all ranks
// see one sequence), as a non-blocking MPI call polled against a deadline: a collective that does
// not complete in time throws CollectiveError naming it and the rank instead of hanging. MPI is then
// left as it is (a pending request, peers that may be gone): the process should exit without
// finalising it, which is what `kiln` does.
#include <mpi.h>

#include <atomic>
#include <cstdio>
#include <functional>
#include <initializer_list>
#include <vector>
#include <thread>

#include "engine/autograd.h"
#include "engine/dist.h"
#include "engine/dist_internal.h"
#include "base/error.h"
#include "engine/ops.h"

namespace kiln::dist {
namespace {

#define KILN_MPI_CHECK(call)                                                         \
  do {                                                                               \
    const int rc_ = (call);                                                          \
    if (rc_ != MPI_SUCCESS) {                                                        \
      char msg_[MPI_MAX_ERROR_STRING];                                               \
      int len_ = 0;                                                                  \
      MPI_Error_string(rc_, msg_, &len_);                                            \
      KILN_FAIL(#call, " failed: ", std::string(msg_, size_t(len_)));                \
    }                                                                                \
  } while (0)

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::i32: return MPI_INT32_T;
    case DType::i64: return MPI_INT64_T;
    case DType::u8: case DType::boolean: return MPI_UINT8_T;
    case DType::i8: return MPI_INT8_T;
    case DType::i16: return MPI_INT16_T;
    default:
      KILN_FAIL("MPI collectives take f32, f64, i64, i32, i16, i8, u8 or bool tensors, got ", t,
                " (reduce 16-bit floats in f32)");
  }
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: case ReduceOp::avg: return MPI_SUM;
    case ReduceOp::max: return MPI_MAX;
    case ReduceOp::min: return MPI_MIN;
  }
  return MPI_SUM;
}

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(std::chrono::seconds timeout) : timeout_(timeout) {
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
      int provided = 0;
      KILN_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided));
      KILN_CHECK(provided >= MPI_THREAD_SERIALIZED, "MPI: the library gives thread level ", provided,
                 ", Kiln needs MPI_THREAD_SERIALIZED");
      owns_mpi_ = true;
    }
    KILN_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm_));
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }

  ~MpiCommunicator() override {
    thread_.stop();
    if (failed_) return;  // a request is still pending and peers may be gone: freeing or finalising could hang
    MPI_Comm_free(&comm_);
    if (owns_mpi_) MPI_Finalize();
  }

  int rank() const override { return rank_; }
  int world_size() const override { return size_; }
  const char* backend() const override { return "mpi"; }

  std::shared_ptr<Work> all_reduce_async(const Tensor& t, ReduceOp op) override {
    check(t, "all_reduce");
    const bool low = is_low_precision(t.dtype());
    return submit([this, t, op, low] {
      Tensor buf = low ? t.to(DType::f32) : t;  // 16-bit: reduce in f32, round once
      run("all_reduce", buf.numel() * int64_t(dtype_size(buf.dtype())), {buf}, [&](MPI_Request* r) {
        return MPI_Iallreduce(MPI_IN_PLACE, buf.raw_data(), int(buf.numel()), mpi_type(buf.dtype()), mpi_op(op), comm_, r);
      });
      if (op == ReduceOp::avg) {
        NoGradGuard g;
        Tensor(buf).mul_(1.0 / double(size_));
      }
      if (low) Tensor(t).copy_(buf);
    });
  }

  void broadcast(const Tensor& t, int root) override {
    check(t, "broadcast");
    detail::check_root(root, size_);
    submit([this, t, root] {
      run("broadcast", t.numel() * int64_t(dtype_size(t.dtype())), {t}, [&](MPI_Request* r) {
        return MPI_Ibcast(t.raw_data(), int(t.numel() * int64_t(dtype_size(t.dtype()))), MPI_BYTE, root, comm_, r);
      });
    })->wait();
  }

  void all_gather(const Tensor& in, const Tensor& out) override {
    detail::check_blocks("all_gather", out, in, size_);
    check(out, "all_gather");
    submit([this, in, out] {
      const int bytes = int(in.numel() * int64_t(dtype_size(in.dtype())));
      run("all_gather", int64_t(bytes) * size_, {in, out}, [&](MPI_Request* r) {
        return MPI_Iallgather(in.raw_data(), bytes, MPI_BYTE, out.raw_data(), bytes, MPI_BYTE, comm_, r);
      });
    })->wait();
  }

  void reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op) override {
    reduce_scatter_async(in, out, op)->wait();
  }

  std::shared_ptr<Work> reduce_scatter_async(const Tensor& in, const Tensor& out, ReduceOp op) override {
    detail::check_blocks("reduce_scatter", in, out, size_);
    check(in, "reduce_scatter");
    return submit([this, in, out, op] {
      run("reduce_scatter", in.numel() * int64_t(dtype_size(in.dtype())), {in, out}, [&](MPI_Request* r) {
        return MPI_Ireduce_scatter_block(in.raw_data(), out.raw_data(), int(out.numel()), mpi_type(in.dtype()), mpi_op(op),
                                         comm_, r);
      });
      if (op == ReduceOp::avg) {
        NoGradGuard g;
        Tensor(out).mul_(1.0 / double(size_));
      }
    });
  }

  void barrier() override {
    submit([this] { run("barrier", 0, {}, [&](MPI_Request* r) { return MPI_Ibarrier(comm_, r); }); })->wait();
  }

 private:
  static void check(const Tensor& t, const char* what) {
    detail::check_tensor(t, what);
    KILN_CHECK(t.numel() * int64_t(dtype_size(t.dtype())) < (int64_t(1) << 31), what, ": ", t.type_str(),
               " is 2 GiB or more; split it");
  }

  std::shared_ptr<detail::Job> submit(std::function<void()> fn) { return thread_.submit(std::move(fn)); }

  // Starts a non-blocking collective on the buffers of `uses` and polls it to completion or the
  // deadline. A request that timed out cannot be cancelled (MPI has no cancel for collectives) and
  // may still write into its buffers: they are kept alive for the rest of the process.
  template <typename Start>
  void run(const char* what, int64_t bytes, std::initializer_list<Tensor> uses, Start start) {
    MPI_Request req;
    KILN_MPI_CHECK(start(&req));
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    int spins = 0;
    for (;;) {
      int done = 0;
      KILN_MPI_CHECK(MPI_Test(&req, &done, MPI_STATUS_IGNORE));
      if (done) return;
      if (std::chrono::steady_clock::now() > deadline) {
        failed_ = true;
        static auto* abandoned = new std::vector<Tensor>;  // never freed: see above
        abandoned->insert(abandoned->end(), uses.begin(), uses.end());
        detail::throw_timeout("mpi", rank_, size_, what, (long long)bytes, timeout_);
      }
      // Spin briefly (latency), then yield the core to the compute threads.
      if (++spins > 200) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  std::chrono::seconds timeout_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  bool owns_mpi_ = false;
  std::atomic<bool> failed_{false};
  detail::CommThread thread_;  // last member: started after, stopped before the rest
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(std::chrono::seconds timeout) {
  return std::make_unique<MpiCommunicator>(timeout);
}

}  // namespace kiln::dist
