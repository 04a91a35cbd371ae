// The Context of settings: what apply() sets current() reads back, a guard restores every setting
// (also when an exception leaves its scope), bad values are errors that change nothing, and the
// environment variables of the programs map onto it.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "base/cpu_isa.h"
#include "base/thread_pool.h"
#include "engine/context.h"
#include "test_util.h"
#include "tools/environment.h"

using namespace kiln;
using kiln::testing::contains;
using kiln::testing::error_of;

namespace {
Context changed(const Context& c) {
  Context d = c;
  d.num_threads = c.num_threads == 1 ? 2 : 1;
  d.cpu_cache_bytes = c.cpu_cache_bytes + (size_t(64) << 20);
  d.flush_denormal = !c.flush_denormal;
  d.deterministic = !c.deterministic;
  d.allow_tf32 = !c.allow_tf32;
  d.cudnn_benchmark = !c.cudnn_benchmark;
  d.gemm = c.gemm == "kiln" ? "cublaslt" : "kiln";
  d.cpu_isa = c.cpu_isa == "generic" ? cpu_isa_name(cpu_isa_supported()) : "generic";
  return d;
}
}  // namespace

TEST_CASE("context: apply() sets what current() reads; a guard restores every setting, also on an exception") {
  const Context before = Context::current();
  const Context other = changed(before);
  REQUIRE(other != before);
  Context want = other;
#if defined(__SANITIZE_ADDRESS__)
  want.cpu_cache_bytes = 0;  // AddressSanitizer builds keep no CPU cache, so a use after free stays visible
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
  want.cpu_cache_bytes = 0;
#endif
#endif
  {
    ContextGuard g(other);
    CHECK(Context::current() == want);
    CHECK(g.saved() == before);
  }
  CHECK(Context::current() == before);
  try {
    ContextGuard g(other);
    throw std::runtime_error("leaves the scope");
  } catch (const std::runtime_error&) {
  }
  CHECK(Context::current() == before);
}

TEST_CASE("context: a bad value is an error naming it, and nothing changes") {
  const Context before = Context::current();
  Context bad = changed(before);
  bad.num_threads = 0;
  CHECK(contains(error_of([&] { bad.apply(); }), "num_threads must be at least 1, got 0"));
  bad = changed(before);
  bad.gemm = "fastest";
  CHECK(contains(error_of([&] { bad.apply(); }), "gemm must be auto, kiln or cublaslt, got 'fastest'"));
  bad = changed(before);
  bad.cpu_isa = "sse9";
  CHECK(contains(error_of([&] { bad.apply(); }), "Context: cpu_isa: 'sse9' is not a CPU kernel set"));
  if (cpu_isa_supported() != CpuIsa::avx512) {
    bad = changed(before);
    bad.cpu_isa = "avx512";
    CHECK(contains(error_of([&] { bad.apply(); }), "this CPU supports at most"));
  }
  CHECK(Context::current() == before);
}

TEST_CASE("context: the CPU kernel set: the best supported unless asked, every lower set can be asked for") {
  const ContextGuard g;
  if (!std::getenv("KILN_CPU_ISA")) {  // the runner applied none
    CHECK(cpu_isa() == cpu_isa_supported());
    CHECK(contains(cpu_isa_reason(), "the best this CPU supports"));
  }
  for (CpuIsa isa : {CpuIsa::generic, CpuIsa::avx2, CpuIsa::avx512}) {
    if (isa > cpu_isa_supported()) {
      CHECK(contains(error_of([&] { set_cpu_isa(isa); }), "this CPU supports at most"));
      continue;
    }
    Context c = Context::current();
    c.cpu_isa = cpu_isa_name(isa);
    c.apply();
    CHECK(cpu_isa() == isa);
    CHECK(Context::current().cpu_isa == cpu_isa_name(isa));
    CHECK(contains(cpu_isa_reason(), isa == cpu_isa_supported() ? "the best" : "asked for"));
  }
  // A Context built by hand (cpu_isa empty) keeps the set in force.
  set_cpu_isa(CpuIsa::generic);
  Context hand;
  hand.num_threads = kiln::num_threads();
  hand.apply();
  CHECK(cpu_isa() == CpuIsa::generic);
}

TEST_CASE("context: the programs' environment variables map onto it, and unset ones keep the settings") {
  const ContextGuard g;
  const Context before = Context::current();
  // The variables as this process got them, restored when the test case ends, however it ends.
  struct Saved {
    const char* name;
    std::string value;
    bool set;
  };
  struct Restore {
    std::vector<Saved> saved;
    ~Restore() {
      for (const Saved& v : saved) v.set ? ::setenv(v.name, v.value.c_str(), 1) : ::unsetenv(v.name);
    }
  } restore;
  std::vector<Saved>& saved = restore.saved;
  for (const char* n :
       {"KILN_NUM_THREADS", "KILN_CPU_CACHE_MB", "KILN_GEMM", "KILN_CPU_ISA", "WORLD_SIZE", "RANK", "LOCAL_RANK",
        "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"}) {
    const char* v = std::getenv(n);
    saved.push_back({n, v ? v : "", v != nullptr});
    if (std::string(n).find("KILN_") != 0) ::unsetenv(n);  // a launcher's, if ctest runs under one
  }
  ::setenv("KILN_NUM_THREADS", "3", 1);
  ::setenv("KILN_CPU_CACHE_MB", "5", 1);
  ::setenv("KILN_GEMM", "cublaslt", 1);
  ::setenv("KILN_CPU_ISA", "generic", 1);
  const Context c = tools::environment_context();
  CHECK(c.cpu_isa == "generic");
  CHECK(c.num_threads == 3);
  CHECK(c.cpu_cache_bytes == size_t(5) << 20);
  CHECK(c.gemm == "cublaslt");
  CHECK(c.flush_denormal == before.flush_denormal);
  CHECK(c.deterministic == before.deterministic);
  ::setenv("KILN_GEMM", "best", 1);
  CHECK(contains(error_of([] { tools::environment_context(); }), "KILN_GEMM must be kiln, cublaslt or auto, got 'best'"));
  ::setenv("KILN_GEMM", "auto", 1);
  ::setenv("KILN_CPU_ISA", "avx3", 1);
  CHECK(contains(error_of([] { tools::environment_context(); }), "KILN_CPU_ISA: 'avx3' is not a CPU kernel set"));
  ::unsetenv("KILN_NUM_THREADS");
  ::unsetenv("KILN_CPU_CACHE_MB");
  ::unsetenv("KILN_GEMM");
  ::unsetenv("KILN_CPU_ISA");
  CHECK(tools::environment_context() == before);
  // Ranks an MPI launcher started on this machine without binding them share its CPUs.
  ::setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
  ::setenv("OMPI_COMM_WORLD_RANK", "1", 1);
  ::setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2", 1);
  const int hw = int(std::max(1u, std::thread::hardware_concurrency()));
  CHECK(tools::environment_context().num_threads == tools::rank_threads({2, true}, cpu_limits()));
  if (available_cpus() == hw && hw >= 2) CHECK(tools::environment_context().num_threads == hw / 2);
  ::setenv("KILN_NUM_THREADS", "3", 1);  // the user's choice wins
  CHECK(tools::environment_context().num_threads == 3);
  ::unsetenv("KILN_NUM_THREADS");
  ::setenv("OMPI_COMM_WORLD_RANK", "5", 1);  // nonsense: kiln train says so; the threads stay
  CHECK(tools::environment_context() == before);
  // A launcher that does not say how many ranks share this machine: no split (the world may span many).
  ::unsetenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  ::setenv("OMPI_COMM_WORLD_RANK", "1", 1);
  CHECK(tools::environment_context() == before);
}

TEST_CASE("context: threads per rank split the CPUs a launcher left to every rank, not those it bound") {
  auto limits = [](int hardware, int affinity, int quota) { return CpuLimits{hardware, affinity, quota}; };
  CHECK(tools::rank_threads({1, true}, limits(8, 8, 0)) == 8);
  CHECK(tools::rank_threads({2, true}, limits(2, 2, 0)) == 1);
  CHECK(tools::rank_threads({4, true}, limits(16, 16, 0)) == 4);
  CHECK(tools::rank_threads({3, true}, limits(2, 2, 0)) == 1);    // more ranks than CPUs: one thread each
  CHECK(tools::rank_threads({2, true}, limits(2, 1, 0)) == 1);    // bound to one CPU each
  CHECK(tools::rank_threads({4, true}, limits(16, 4, 0)) == 4);   // bound to four each
  CHECK(tools::rank_threads({8, true}, limits(64, 32, 0)) == 8);  // a socket's mask, shared by 4 ranks
  // A container's quota is shared by its ranks, bound or not.
  CHECK(tools::rank_threads({1, true}, limits(64, 64, 8)) == 8);
  CHECK(tools::rank_threads({2, true}, limits(64, 64, 8)) == 4);
  CHECK(tools::rank_threads({2, true}, limits(64, 16, 8)) == 4);  // bound to 16 each, 8 CPUs of quota in all
  CHECK(tools::rank_threads({2, true}, limits(64, 2, 8)) == 2);
  CHECK(tools::rank_threads({4, true}, limits(64, 64, 2)) == 1);
  // torchrun never binds: its ranks split their mask, a container's cpuset included.
  CHECK(tools::rank_threads({4, false}, limits(64, 4, 0)) == 1);
  CHECK(tools::rank_threads({2, false}, limits(64, 64, 0)) == 32);
  CHECK(tools::rank_threads({2, false}, limits(64, 64, 8)) == 4);
  CHECK(tools::rank_threads({1, false}, limits(64, 4, 0)) == 4);
  const CpuLimits here = cpu_limits();
  CHECK(available_cpus() == (here.quota > 0 ? std::min(here.affinity, here.quota) : here.affinity));
  CHECK(available_cpus() >= 1);
  CHECK(available_cpus() <= int(std::max(1u, std::thread::hardware_concurrency())));
}
