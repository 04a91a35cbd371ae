// Vectorisable float math for CPU kernels: loops over these compile to SIMD code without
// -ffast-math. Accuracy is stated per function; CPU and GPU results agree to those tolerances.
#pragma once
#include <cstdint>
#include <cstring>

namespace kiln::cpu {

#include "kernels/cpu/isa/vexp.inc"

}  // namespace kiln::cpu
