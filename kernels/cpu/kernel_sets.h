// The leaves of the CPU kernel set in use (base/cpu_isa.h chooses it; kernels/cpu/isa/leaves.h says
// what a set holds).
#pragma once
#include "kernels/cpu/isa/leaves.h"

namespace kiln::cpu {

// Every set has rows; the generic set has no GEMM leaves (f32.w == 0) and no convolution leaves.
const isa::Leaves& kernel_set();

}  // namespace kiln::cpu
