// Data-parallel training: who this process is (rank, world size, from the launcher's environment),
// a Communicator for collectives on tensors (MPI for CPU ranks, a no-op one for a single process),
// and DataParallel, which averages gradients over ranks in buckets while backward is still running.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/error.h"
#include "engine/nn.h"
#include "engine/tensor.h"

namespace kiln::dist {

// Rank and world size as the launcher set them: torchrun / `kiln launch` (RANK, WORLD_SIZE,
// LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), Open MPI (OMPI_COMM_WORLD_*), or Slurm
// (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID); none of them: one process. The library reads no
// environment: `get` looks a variable up (null when unset); tools pass std::getenv
// (tools/environment.h, dist_env()).
struct DistEnv {
  int rank = 0, world_size = 1, local_rank = 0, local_world_size = 1;
  // Whether the launcher said how many ranks run on this machine (else local_world_size is the
  // world size, as for one machine).
  bool local_world_size_given = false;
  std::string master_addr;
  int master_port = 0;
  std::string launcher = "none";  // torchrun | openmpi | slurm | none
  // The job's secret (KILN_DIST_SECRET; `kiln launch` makes one for a single-machine job). Ranks of
  // the TCP communicator prove to each other that they know it (HMAC-SHA256 over fresh nonces, the
  // secret itself never sent) before a connection counts as a rank; any other connection is
  // refused and logged, and the job goes on. Empty: the handshake still runs, with an empty key,
  // and rank 0 logs that anyone who can reach the ports could join.
  std::string secret;
  // Where the TCP communicator reports what it refused (null: standard error, "kiln: ..." lines).
  std::function<void(const std::string&)> log;
  // Called when a TCP listener is up, before it accepts: rank 0's "rendezvous" listener and each
  // rank's "ring" listener, with the address and port bound. For tests and tools; may be null.
  std::function<void(const char* what, const std::string& addr, int port)> on_listen;
  // Called on rank 0 when a rank has joined the rendezvous (proved the secret and was admitted), with
  // that rank. For tests and tools; may be null. It runs inside rank 0's accept loop: it must be quick
  // (its time counts against --dist-timeout) and must not throw (the joined ranks would not be told why).
  std::function<void(int rank)> on_join;
  using Lookup = std::function<const char*(const char*)>;
  static DistEnv from_variables(const Lookup& get);
};

enum class ReduceOp : uint8_t { sum, avg, max, min };

// A collective that failed: it did not complete within the communicator's timeout (a rank died,
// hangs or issued different collectives), or a peer's connection broke. The communicator is then
// unusable: every later collective on it throws this too. The library never ends the process; a
// tool that catches this should exit at once (`kiln` exits with code 3) rather than run the
// destructors of a communicator whose peers are gone.
class CollectiveError : public Error {
 public:
  CollectiveError(const std::string& what, bool timed_out, const char* file, int line)
      : Error(what, file, line), timed_out_(timed_out) {}
  bool timed_out() const { return timed_out_; }

 private:
  bool timed_out_;
};

// A collective in flight; wait() returns when its result is in the tensor.
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
  // True once the collective has finished (wait() then returns at once, or throws its error) and
  // released its buffers; false while it runs. A poll, never a wait.
  virtual bool done() = 0;
};

// Collectives on contiguous tensors, in place. Every rank must issue the same collectives in the
// same order; one that does not complete within the timeout throws CollectiveError naming the
// collective and the rank (a dead or diverged rank must not hang the others forever).
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual const char* backend() const = 0;  // "single", "mpi", "tcp"
  virtual std::shared_ptr<Work> all_reduce_async(const Tensor& t, ReduceOp op) = 0;
  void all_reduce(const Tensor& t, ReduceOp op) { all_reduce_async(t, op)->wait(); }
  virtual void broadcast(const Tensor& t, int root) = 0;
  // out holds world_size blocks of in's size, rank r's in block r.
  virtual void all_gather(const Tensor& in, const Tensor& out) = 0;
  // in holds world_size blocks of out's size; rank r gets the reduction of every rank's block r.
  virtual void reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op) = 0;
  // The same, returning while it runs (on the communicator's thread where it has one; the default
  // runs it now). `in` and `out` must stay untouched until wait() returns.
  virtual std::shared_ptr<Work> reduce_scatter_async(const Tensor& in, const Tensor& out, ReduceOp op);
  virtual void barrier() = 0;
};

// The communicator for `env` on CPU tensors: under mpirun or srun, MPI (the build must have it);
// started by `kiln launch` or torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), Kiln's own TCP
// ring, which needs no MPI runtime; one process: the single-process one.
std::unique_ptr<Communicator> make_cpu_communicator(const DistEnv& env, std::chrono::seconds timeout);
std::unique_ptr<Communicator> make_single_communicator();
// Whether this build has the MPI backend.
bool have_mpi();

struct DataParallelOptions {
  int64_t bucket_bytes = 25 << 20;       // about 25 MB per all-reduce
  int64_t first_bucket_bytes = 1 << 20;  // the last layers' gradients go out early
};

// Wraps a model for data-parallel training. The constructor checks that every rank built the same
// model (names, shapes, dtypes: a mismatch is an error naming the first difference, on every rank)
// and copies rank 0's parameters and buffers to all. During backward, each bucket of gradients
// (reverse parameter order) is averaged over ranks as soon as its last gradient is ready, on the
// communicator's thread; finish() waits for all of them (call it before the optimizer step).
class DataParallel {
 public:
  DataParallel(nn::Module& model, Communicator& comm, DataParallelOptions o = {});
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  // Gradient accumulation: with sync off, backward only accumulates locally; turn it on for the
  // last micro-batch of an optimizer step.
  void set_sync(bool on) { sync_ = on; }
  // Waits for every bucket's all-reduce and writes the averaged gradients back. Parameters that got
  // no gradient on some rank take zeros there, so all ranks end with the same gradients.
  void finish();
  // Seconds finish() spent waiting for communication since the last call (what overlap did not hide).
  double take_wait_seconds();
  int64_t num_buckets() const { return int64_t(buckets_.size()); }

 private:
  struct Bucket {
    std::vector<size_t> params;  // indices into params_
    int64_t numel = 0;
    int pending = 0;
    Tensor flat;
    std::shared_ptr<Work> work;
  };
  void on_grad_ready(size_t index);
  void launch(Bucket& b);

  nn::Module& model_;
  Communicator& comm_;
  std::vector<Tensor> params_;
  std::vector<int> hook_ids_;
  std::vector<size_t> bucket_of_;
  std::vector<Bucket> buckets_;
  bool sync_ = true;
  double wait_seconds_ = 0;
};

// Checks that every rank built the same model (names, shapes, dtypes of parameters and buffers; a
// mismatch is an error naming the first difference, on every rank) and copies rank 0's parameters
// and buffers to all. `who` names the caller in errors.
void replicate_model(nn::Module& model, Communicator& comm, const char* who);

// Checks that every rank holds the same list of (name, shape, dtype) entries; throws on every rank,
// naming the first difference, when they do not. `what` names the list in the message.
void check_same_on_all_ranks(Communicator& comm, const std::vector<std::string>& entries, const std::string& what);

}  // namespace kiln::dist
