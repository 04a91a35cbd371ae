// The settings Kiln computes under, in one place: the CPU thread count and allocator cache,
// denormal flushing, and on CUDA deterministic algorithms, TF32, the cuDNN search and the GEMM
// choice. The library reads no environment: a program sets them (tools/environment.h maps the
// KILN_* variables onto a Context) and code that needs other settings for a while holds a
// ContextGuard, which puts every one back when the scope ends, also on an exception.
//
// They are process-wide, as the thread pool, the allocators and the cuDNN/cuBLAS state they steer
// are shared: change them between computations, not while another thread computes. Per-thread
// state has its own guards: autocast (amp::AutocastGuard), grad mode (NoGradGuard); the random
// stream is default_generator() (engine/random.h) or a Generator passed to the op.
#pragma once
#include <cstddef>
#include <string>

namespace kiln {

struct Context {
  int num_threads = 1;          // CPU kernel threads (>= 1)
  size_t cpu_cache_bytes = 0;   // host memory the CPU allocator keeps for reuse (0: none; always 0 under ASan)
  bool flush_denormal = true;   // CPU: subnormal results flushed to zero (x86 FTZ + DAZ)
  bool deterministic = false;   // CUDA: deterministic algorithms only (the CPU always is)
  bool allow_tf32 = false;      // CUDA: f32 GEMM and convolution on TF32 tensor cores
  bool cudnn_benchmark = false; // CUDA: time every cuDNN algorithm once per shape
  std::string gemm = "auto";    // CUDA f16/bf16 GEMM: "auto", "kiln" or "cublaslt"
  // CPU kernel set (base/cpu_isa.h): "avx512", "avx2" or "generic"; at most what the CPU
  // supports. Empty in a Context built by hand: keep the set in force (by default the best supported).
  std::string cpu_isa;

  // The settings in force now.
  static Context current();
  // Makes these the settings in force; a bad value (threads < 1, an unknown GEMM name) is an error
  // naming it, and then nothing is changed.
  void apply() const;
  bool operator==(const Context&) const = default;
};

// RAII: remembers the settings in force, optionally applies others, and restores the remembered
// ones at scope exit.
//   { ContextGuard g; Context c = Context::current(); c.deterministic = true; c.apply(); ... }
//   { ContextGuard g(c); ... }
class ContextGuard {
 public:
  ContextGuard() : saved_(Context::current()) {}
  explicit ContextGuard(const Context& c) : ContextGuard() { c.apply(); }
  ~ContextGuard();
  ContextGuard(const ContextGuard&) = delete;
  ContextGuard& operator=(const ContextGuard&) = delete;
  const Context& saved() const { return saved_; }

 private:
  Context saved_;
};

// A host program's interrupt (the Python package's Ctrl-C), polled between kernels on the thread
// that set it: at every tensor allocation and between the nodes of a backward pass. When it answers
// true, the computation in progress stops by throwing kiln::Interrupted. Null (the default): never
// polled.
using InterruptPoll = bool (*)();
void set_interrupt_poll(InterruptPoll poll);
namespace detail {
void poll_interrupt();
}  // namespace detail

}  // namespace kiln
