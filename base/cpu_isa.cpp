// Choosing the CPU kernel set (cpu_isa.h).
#include "base/cpu_isa.h"

#include <atomic>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#endif

#include "base/error.h"

namespace kiln {
namespace {

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// F16C from CPUID leaf 1 (clang 14's __builtin_cpu_supports does not know "f16c"); the OS side is
// AVX's, which the AVX2 check below covers.
bool has_f16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
}
#endif

CpuIsa detect() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  // The compiler runtime's CPU model checks the CPUID bits and that the OS saves the AVX / AVX-512
  // state (XGETBV).
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("fma") && has_f16c())
    return CpuIsa::avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c()) return CpuIsa::avx2;
#endif
  return CpuIsa::generic;
}

// The set in use (a function-local static: kernels may run from other files' static initialisers).
std::atomic<CpuIsa>& current() {
  static std::atomic<CpuIsa> isa{cpu_isa_supported()};
  return isa;
}
std::atomic<bool> g_forced{false};  // set_cpu_isa chose a set below the best
}  // namespace

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::avx512: return "avx512";
    case CpuIsa::avx2: return "avx2";
    case CpuIsa::generic: return "generic";
  }
  return "?";
}

CpuIsa parse_cpu_isa(const std::string& name, const char* what) {
  for (CpuIsa i : {CpuIsa::generic, CpuIsa::avx2, CpuIsa::avx512})
    if (name == cpu_isa_name(i)) return i;
  KILN_FAIL(what, ": '", name, "' is not a CPU kernel set (avx512, avx2 or generic)");
}

CpuIsa cpu_isa_supported() {
  static const CpuIsa best = detect();
  return best;
}

CpuIsa cpu_isa() { return current().load(std::memory_order_relaxed); }

void set_cpu_isa(CpuIsa isa) {
  KILN_CHECK(isa <= cpu_isa_supported(), "CPU kernel set ", cpu_isa_name(isa), ": this CPU supports at most ",
             cpu_isa_name(cpu_isa_supported()));
  current() = isa;
  g_forced = isa != cpu_isa_supported();
}

std::string cpu_isa_reason() {
  if (!g_forced) return "the best this CPU supports (CPUID)";
  return std::string("asked for (KILN_CPU_ISA or Context::cpu_isa); this CPU supports ") +
         cpu_isa_name(cpu_isa_supported());
}

}  // namespace kiln
