// The launcher's environment, the single-process communicator, the cross-rank model check and
// DataParallel's gradient buckets. The MPI communicator is in dist_mpi.cpp (built when MPI is found).
#include "engine/dist.h"

#include <algorithm>
#include <cstdlib>
#include <sstream>

#include "base/error.h"
#include "engine/autograd.h"
#include "engine/dist_internal.h"
#include "engine/ops.h"

namespace kiln::dist {

std::unique_ptr<Communicator> make_tcp_communicator(const DistEnv& env, std::chrono::seconds timeout);  // dist_tcp.cpp
#if KILN_WITH_MPI
std::unique_ptr<Communicator> make_mpi_communicator(std::chrono::seconds timeout);  // dist_mpi.cpp
bool have_mpi() { return true; }
#else
bool have_mpi() { return false; }
#endif

namespace {

bool env_int(const DistEnv::Lookup& get, const char* name, int& out) {
  const char* v = get(name);
  if (!v || !*v) return false;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  KILN_CHECK(end != v && *end == '\0' && x >= 0 && x < (1 << 24), "environment variable ", name, "='", v,
             "' is not a non-negative integer");
  out = int(x);
  return true;
}

class DoneWork final : public Work {
 public:
  void wait() override {}
  bool done() override { return true; }
};

class SingleCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  const char* backend() const override { return "single"; }
  std::shared_ptr<Work> all_reduce_async(const Tensor&, ReduceOp) override { return std::make_shared<DoneWork>(); }
  void broadcast(const Tensor&, int root) override {
    KILN_CHECK(root == 0, "broadcast: root ", root, " with a world of 1");
  }
  void all_gather(const Tensor& in, const Tensor& out) override {
    KILN_CHECK(out.numel() == in.numel(), "all_gather: output of ", out.numel(), " elements for ", in.numel());
    Tensor(out).copy_(in.reshape(out.shape()));
  }
  void reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp) override {
    KILN_CHECK(out.numel() == in.numel(), "reduce_scatter: output of ", out.numel(), " elements for ", in.numel());
    Tensor(out).copy_(in.reshape(out.shape()));
  }
  void barrier() override {}
};

std::string describe(const std::string& name, const Tensor& t) {
  std::ostringstream s;
  s << name << ' ' << t.dtype() << ' ' << t.shape();
  return s.str();
}

}  // namespace

// The variables each launcher sets: world size, rank, local rank, ranks on this node.
struct LauncherVars {
  const char* name;
  const char* size;
  const char* rank;
  const char* local_rank;
  const char* local_size;
};
constexpr LauncherVars kLaunchers[] = {
    {"torchrun", "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},  // also `kiln launch`
    {"openmpi", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {"slurm", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
};

DistEnv DistEnv::from_variables(const Lookup& get) {
  DistEnv e;
  for (const LauncherVars& l : kLaunchers) {
    if (!env_int(get, l.size, e.world_size)) continue;
    e.launcher = l.name;
    KILN_CHECK(env_int(get, l.rank, e.rank) || e.world_size == 1, "the ", l.name, " environment sets ", l.size, "=",
               e.world_size, " but not ", l.rank, ": every rank of the job needs its own");
    e.local_rank = e.rank;
    env_int(get, l.local_rank, e.local_rank);
    e.local_world_size = e.world_size;
    e.local_world_size_given = env_int(get, l.local_size, e.local_world_size);
    break;
  }
  // RANK alone would train as a job of one, and the real job would wait for this rank in vain.
  const char* lone_rank = e.launcher == "none" ? get("RANK") : nullptr;
  KILN_CHECK(!lone_rank || !*lone_rank, "the environment sets RANK=", lone_rank ? lone_rank : "",
             " but not WORLD_SIZE: a rank started torchrun-style needs WORLD_SIZE, MASTER_ADDR and MASTER_PORT "
             "too (unset RANK for a one-process run)");
  if (e.launcher == "torchrun") {
    if (const char* a = get("MASTER_ADDR")) e.master_addr = a;
    // A port past 65535 wrapped (95536 listened on 30000) and 0 read as "not set": refused as given.
    if (env_int(get, "MASTER_PORT", e.master_port))
      KILN_CHECK(e.master_port >= 1 && e.master_port <= 65535, "environment variable MASTER_PORT='", get("MASTER_PORT"),
                 "' is not a TCP port: expected 1..65535 (the port rank 0 listens on)");
  }
  if (const char* k = get("KILN_DIST_SECRET")) e.secret = k;
  KILN_CHECK(e.world_size >= 1 && e.rank < e.world_size && e.local_rank < std::max(e.local_world_size, 1),
             "the ", e.launcher, " environment says rank ", e.rank, " (local ", e.local_rank, ") of ", e.world_size,
             " (", e.local_world_size, " on this node): inconsistent");
  return e;
}

std::unique_ptr<Communicator> make_single_communicator() { return std::make_unique<SingleCommunicator>(); }

std::unique_ptr<Communicator> make_cpu_communicator(const DistEnv& env, std::chrono::seconds timeout) {
  if (env.world_size == 1) return make_single_communicator();
  if (env.launcher == "torchrun") return make_tcp_communicator(env, timeout);  // `kiln launch`: no MPI runtime
#if KILN_WITH_MPI
  auto c = make_mpi_communicator(timeout);
  KILN_CHECK(c->world_size() == env.world_size && c->rank() == env.rank, "MPI says rank ", c->rank(), " of ",
             c->world_size(), " but the ", env.launcher, " environment says rank ", env.rank, " of ", env.world_size);
  return c;
#else
  KILN_FAIL("this process is rank ", env.rank, " of ", env.world_size, " (", env.launcher,
            ") but Kiln was built without MPI (install libopenmpi-dev and rebuild, or start the ranks with kiln launch)");
#endif
}

std::shared_ptr<Work> Communicator::reduce_scatter_async(const Tensor& in, const Tensor& out, ReduceOp op) {
  reduce_scatter(in, out, op);
  return std::make_shared<DoneWork>();
}

// ---- the cross-rank check --------------------------------------------------------------------------

void check_same_on_all_ranks(Communicator& comm, const std::vector<std::string>& entries, const std::string& what) {
  if (comm.world_size() == 1) return;
  std::string mine;
  for (const auto& e : entries) mine += e + "\n";
  Tensor len = from_vector({double(mine.size())}, {1}, DType::i64);
  comm.broadcast(len, 0);
  Tensor bytes = zeros({len.data<int64_t>()[0]}, DType::u8);
  if (comm.rank() == 0) std::copy(mine.begin(), mine.end(), bytes.data<uint8_t>());
  comm.broadcast(bytes, 0);
  std::vector<std::string> root;
  {
    std::istringstream in(std::string(reinterpret_cast<const char*>(bytes.data<uint8_t>()), size_t(bytes.numel())));
    for (std::string line; std::getline(in, line);) root.push_back(line);
  }
  int64_t first = -1;
  for (size_t i = 0; i < std::max(root.size(), entries.size()); ++i)
    if (i >= root.size() || i >= entries.size() || root[i] != entries[i]) {
      first = int64_t(i);
      break;
    }
  Tensor firsts = zeros({comm.world_size()}, DType::i64);
  comm.all_gather(from_vector({double(first)}, {1}, DType::i64), firsts);
  std::vector<int> bad;
  int64_t where = -1;
  for (int r = 0; r < comm.world_size(); ++r)
    if (firsts.data<int64_t>()[r] >= 0) {
      bad.push_back(r);
      if (where < 0) where = firsts.data<int64_t>()[r];
    }
  if (bad.empty()) return;
  auto at = [](const std::vector<std::string>& v, int64_t i) {
    return size_t(i) < v.size() ? "'" + v[size_t(i)] + "'" : std::string("nothing (the list ends)");
  };
  std::string ranks;
  for (int r : bad) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  if (first >= 0)
    KILN_FAIL(what, " differs between ranks: at entry ", first, " rank ", comm.rank(), " has ", at(entries, first),
              ", rank 0 has ", at(root, first));
  KILN_FAIL(what, " differs between ranks: rank(s) ", ranks, " differ from rank 0 at entry ", where,
            " (rank 0 has ", at(root, where), ")");
}

// ---- DataParallel ------------------------------------------------------------------------------------

void replicate_model(nn::Module& model, Communicator& comm, const char* who) {
  const nn::NamedTensors named = model.named_parameters(), buffers = model.named_buffers();
  std::vector<std::string> entries;
  for (const auto& [n, t] : named) entries.push_back("parameter " + describe(n, t));
  for (const auto& [n, t] : buffers) entries.push_back("buffer " + describe(n, t));
  check_same_on_all_ranks(comm, entries, "the model");
  NoGradGuard no_grad;
  for (const auto& [n, t] : named) {
    KILN_CHECK(t.is_contiguous(), who, ": parameter ", n, " is not contiguous");
    comm.broadcast(t, 0);
    Tensor(t).bump_version();
  }
  for (const auto& [n, t] : buffers) {
    KILN_CHECK(t.is_contiguous(), who, ": buffer ", n, " is not contiguous");
    comm.broadcast(t, 0);
  }
}

DataParallel::DataParallel(nn::Module& model, Communicator& comm, DataParallelOptions o) : model_(model), comm_(comm) {
  replicate_model(model, comm, "DataParallel");
  const nn::NamedTensors named = model.named_parameters();
  for (const auto& [n, t] : named)
    if (t.requires_grad()) {
      KILN_CHECK(t.dtype() == DType::f32, "DataParallel: parameter ", n, " is ", t.dtype(),
                 "; gradients are reduced in f32 buckets (keep master weights in f32)");
      params_.push_back(t);
    }
  // Buckets in reverse registration order (the order backward produces gradients), the first small.
  bucket_of_.assign(params_.size(), 0);
  int64_t bytes = 0;
  for (size_t k = params_.size(); k-- > 0;) {
    const int64_t limit = buckets_.size() <= 1 ? o.first_bucket_bytes : o.bucket_bytes;
    if (buckets_.empty() || (bytes > 0 && bytes + params_[k].numel() * 4 > limit)) {
      buckets_.emplace_back();
      bytes = 0;
    }
    Bucket& b = buckets_.back();
    b.params.push_back(k);
    b.numel += params_[k].numel();
    bytes += params_[k].numel() * 4;
    bucket_of_[k] = buckets_.size() - 1;
  }
  const Device dev = params_.empty() ? kCPU : params_[0].device();
  for (const Tensor& p : params_)
    KILN_CHECK(p.device() == dev, "DataParallel: parameters on ", dev, " and ", p.device(), "; one device per rank");
  for (auto& b : buckets_) {
    b.flat = zeros({b.numel}, TensorOptions(DType::f32, dev));
    b.pending = int(b.params.size());
  }
  if (comm.world_size() > 1)
    for (size_t k = 0; k < params_.size(); ++k)
      hook_ids_.push_back(params_[k].register_grad_ready_hook([this, k](Tensor&) { on_grad_ready(k); }));
}

DataParallel::~DataParallel() { detail::release_buckets(params_, hook_ids_, buckets_); }

void DataParallel::on_grad_ready(size_t index) {
  if (!sync_) return;
  if (--buckets_[bucket_of_[index]].pending > 0) return;
  detail::launch_ready_buckets(buckets_, [this](Bucket& b) { launch(b); });
}

// Gradients are packed into the bucket and unpacked by tensor copies, so the same code serves CPU
// ranks and GPU ranks (where the copies are kernels on the compute stream, ordered before NCCL).
void DataParallel::launch(Bucket& b) {
  NoGradGuard no_grad;
  int64_t off = 0;
  for (size_t k : b.params) {
    const Tensor g = params_[k].grad();
    const int64_t n = params_[k].numel();
    Tensor dst = b.flat.narrow(0, off, n);
    if (g.defined()) {
      dst.copy_(g.detach().reshape({n}));
    } else {
      dst.zero_();  // no gradient on this rank this step: contributes zeros
    }
    off += n;
  }
  b.work = comm_.all_reduce_async(b.flat, ReduceOp::avg);
}

void DataParallel::finish() {
  if (comm_.world_size() == 1) return;
  const auto t0 = std::chrono::steady_clock::now();
  for (auto& b : buckets_)
    if (!b.work) launch(b);  // buckets with a parameter that got no gradient in this backward
  NoGradGuard no_grad;
  for (auto& b : buckets_) {
    b.work->wait();
    b.work.reset();
    b.pending = int(b.params.size());
    int64_t off = 0;
    for (size_t k : b.params) {
      Tensor& p = params_[k];
      Tensor g = p.grad();
      if (!g.defined() || !g.is_contiguous() || g.dtype() != DType::f32) {
        g = zeros(p.shape(), TensorOptions(DType::f32, p.device()));
        p.set_grad(g);
      }
      g.view({p.numel()}).copy_(b.flat.narrow(0, off, p.numel()));
      off += p.numel();
    }
  }
  wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double DataParallel::take_wait_seconds() {
  const double s = wait_seconds_;
  wait_seconds_ = 0;
  return s;
}

}  // namespace kiln::dist
