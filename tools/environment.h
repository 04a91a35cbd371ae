// The environment variables Kiln's programs honour, read in one place: the library itself reads
// none (docs/architecture.md, "Explicit settings"), so the `kiln` command, the test runners and
// the benchmarks call apply_environment() once at start. Header-only for those separate programs.
//   KILN_NUM_THREADS   CPU threads for the kernels (default: the CPUs the process may run on, split
//                      between the ranks a launcher started on this machine; rank_threads below)
//   KILN_CPU_CACHE_MB  host memory the CPU allocator keeps for reuse (default 4096; 0: none)
//   KILN_GEMM          f16/bf16 GEMM on CUDA: kiln, cublaslt or auto (default auto)
//   KILN_CPU_ISA       CPU kernel set: avx512, avx2 or generic (default: the best the CPU supports)
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <thread>

#include "base/cpu_isa.h"
#include "base/error.h"
#include "base/thread_pool.h"
#include "engine/context.h"
#include "engine/dist.h"

namespace kiln::tools {

// An integer environment variable in [lo, hi], or `fallback` when unset or empty.
inline int64_t env_integer(const char* name, int64_t lo, int64_t hi, int64_t fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const long long x = std::strtoll(v, &end, 10);
  KILN_CHECK(end != v && *end == '\0' && x >= lo && x <= hi, name, " must be an integer between ", lo, " and ", hi,
             ", got '", v, "'");
  return x;
}

// Rank and world size as the launcher (kiln launch, torchrun, mpirun, srun) set them.
inline dist::DistEnv dist_env() {
  return dist::DistEnv::from_variables([](const char* name) -> const char* { return std::getenv(name); });
}

// The ranks a launcher says run on this machine (1 outside one, where it does not say: Slurm without
// --ntasks-per-node, a WORLD_SIZE alone; or where its variables do not make sense: `kiln train` reports
// those), and whether it may have bound each to CPUs of its own (Open MPI, Slurm; torchrun never does).
struct LocalRanks {
  int count = 1;
  bool may_bind = false;
};
inline LocalRanks local_ranks() {
  try {
    const dist::DistEnv e = dist_env();
    if (!e.local_world_size_given) return {};
    return {std::max(1, e.local_world_size), e.launcher == "openmpi" || e.launcher == "slurm"};
  } catch (const Error&) {
    return {};
  }
}

// CPU threads of a process without KILN_NUM_THREADS: the CPUs it may run on (its affinity mask,
// capped by a cgroup CPU quota), shared with the other ranks on this machine. Ranks with all-core
// pools take turns on the same cores (BERT-tiny MLM, 2 ranks by `mpirun --bind-to none` on a 2-core
// machine: 274-280 samples/s with 2 threads each, 344-353 with 1). torchrun never binds, so its ranks
// split their mask (a container's cpuset included). Open MPI and Slurm may have bound each rank to
// its own CPUs (a mask smaller than the machine) but also bind several to one socket: such a rank
// keeps its mask up to its share of the machine's hardware threads. A quota belongs to the whole
// cgroup: always split. `kiln launch` sets KILN_NUM_THREADS itself.
inline int rank_threads(const LocalRanks& r, const CpuLimits& l) {
  const int cpus = l.quota > 0 ? std::min(l.affinity, l.quota) : l.affinity;
  if (r.count <= 1) return cpus;
  if (!r.may_bind) return std::max(1, cpus / r.count);
  int share = l.hardware / r.count;
  if (l.quota > 0) share = std::min(share, l.quota / r.count);
  return std::max(1, std::min(l.affinity, share));
}

// The Context the environment asks for, over the one in force (unset variables keep its values).
inline Context environment_context() {
  Context c = Context::current();
  // The bound of --threads (tools::max_threads(), here without the CLI): the larger of 1024 and 4 x
  // the CPUs, at most the thread pool's 4096.
  const int64_t cpus = std::max<int64_t>(1, int64_t(std::thread::hardware_concurrency()));
  const int64_t max_threads = std::min<int64_t>(4096, std::max<int64_t>(1024, 4 * cpus));
  if (const int64_t n = env_integer("KILN_NUM_THREADS", 1, max_threads, 0); n > 0)
    c.num_threads = int(n);
  else if (const LocalRanks local = local_ranks(); local.count > 1)
    c.num_threads = rank_threads(local, cpu_limits());
  if (const int64_t mb = env_integer("KILN_CPU_CACHE_MB", 0, int64_t(1) << 30, -1); mb >= 0)
    c.cpu_cache_bytes = size_t(mb) << 20;
  if (const char* g = std::getenv("KILN_GEMM"); g && *g) {
    KILN_CHECK(std::string(g) == "auto" || std::string(g) == "kiln" || std::string(g) == "cublaslt", "KILN_GEMM must be "
               "kiln, cublaslt or auto, got '", g, "'");
    c.gemm = g;
  }
  if (const char* isa = std::getenv("KILN_CPU_ISA"); isa && *isa) {
    const CpuIsa want = parse_cpu_isa(isa, "KILN_CPU_ISA");
    KILN_CHECK(want <= cpu_isa_supported(), "KILN_CPU_ISA=", isa, ": this CPU supports at most ",
               cpu_isa_name(cpu_isa_supported()));
    c.cpu_isa = isa;
  }
  return c;
}

inline void apply_environment() { environment_context().apply(); }

}  // namespace kiln::tools
