// The CPU's kernel sets: which instruction set the hand-written CPU kernels (GEMM micro-kernels,
// the direct convolution) run with. All sets are compiled into every x86-64 build
// (kernels/cpu/isa/), whatever -march the rest of the build has; the set in use is the best the CPU
// and the operating system support, from CPUID, unless set_cpu_isa (Context::cpu_isa, which the
// `kiln` command and the test runners take from KILN_CPU_ISA) asks for a lower one.
//   avx512   AVX-512 F/BW/VL/DQ + FMA (Intel Skylake-SP and later, AMD Zen 4 and later)
//   avx2     AVX2 + FMA + F16C (Intel Haswell and later, AMD Zen 1-3)
//   generic  Eigen's kernels for what the compiler targets (NEON on ARM64)
#pragma once
#include <string>

namespace kiln {

enum class CpuIsa { generic, avx2, avx512 };

const char* cpu_isa_name(CpuIsa isa);
// "avx512", "avx2" or "generic"; anything else throws kiln::Error naming `what` (a flag, a variable).
CpuIsa parse_cpu_isa(const std::string& name, const char* what);
// The best set this CPU and OS can run (AVX state enabled by the OS, XGETBV), whatever was asked for.
CpuIsa cpu_isa_supported();
// The set in use: cpu_isa_supported() unless set_cpu_isa chose another.
CpuIsa cpu_isa();
// Uses `isa` from now on (the Context of engine/context.h sets it); above cpu_isa_supported() throws.
// Between ops, not while another thread runs CPU kernels: ops read the set as they run, and a
// convolution whose GEMM and packer saw different sets would disagree on the panel layout.
void set_cpu_isa(CpuIsa isa);
// Why the set in use was chosen, for `kiln doctor`.
std::string cpu_isa_reason();

}  // namespace kiln
