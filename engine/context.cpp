// Context: reads and sets the process-wide settings that the thread pool, the CPU allocator and
// the CUDA backend keep, as one value.
#include "engine/context.h"

#include "base/cpu_isa.h"
#include "base/error.h"
#include "base/thread_pool.h"
#include "engine/tensor.h"
#include "kernels/cuda/cuda_backend.h"

namespace kiln {

Context Context::current() {
  Context c;
  c.num_threads = kiln::num_threads();
  c.cpu_cache_bytes = cpu_cache_limit();
  c.flush_denormal = kiln::flush_denormal();
  c.deterministic = cuda::deterministic();
  c.allow_tf32 = cuda::allow_tf32();
  c.cudnn_benchmark = cuda::cudnn_benchmark();
  c.gemm = cuda::gemm_backend();
  c.cpu_isa = cpu_isa_name(kiln::cpu_isa());
  return c;
}

void Context::apply() const {
  KILN_CHECK(num_threads >= 1, "Context: num_threads must be at least 1, got ", num_threads);
  KILN_CHECK(gemm == "auto" || gemm == "kiln" || gemm == "cublaslt", "Context: gemm must be auto, kiln or cublaslt, got '",
             gemm, "'");
  const CpuIsa isa = cpu_isa.empty() ? kiln::cpu_isa() : parse_cpu_isa(cpu_isa, "Context: cpu_isa");
  KILN_CHECK(isa <= cpu_isa_supported(), "Context: cpu_isa ", cpu_isa, ": this CPU supports at most ",
             cpu_isa_name(cpu_isa_supported()));
  if (num_threads != kiln::num_threads()) set_num_threads(num_threads);
  set_cpu_cache_limit(cpu_cache_bytes);
  set_flush_denormal(flush_denormal);
  cuda::set_deterministic(deterministic);
  cuda::set_allow_tf32(allow_tf32);
  cuda::set_cudnn_benchmark(cudnn_benchmark);
  cuda::set_gemm_backend(gemm);
  if (isa != kiln::cpu_isa()) set_cpu_isa(isa);
}

ContextGuard::~ContextGuard() {
  try {
    saved_.apply();
  } catch (...) {
    // The saved settings were valid when read; nothing can fail here, and a destructor must not throw.
  }
}

namespace {
thread_local InterruptPoll t_interrupt_poll = nullptr;
}  // namespace

void set_interrupt_poll(InterruptPoll poll) { t_interrupt_poll = poll; }

void detail::poll_interrupt() {
  if (t_interrupt_poll && t_interrupt_poll()) throw Interrupted("interrupted", __FILE__, __LINE__);
}

}  // namespace kiln
