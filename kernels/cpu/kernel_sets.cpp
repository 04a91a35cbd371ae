// The generic CPU kernel set (compiled with the build's own flags) and the choice between sets.
#include "kernels/cpu/kernel_sets.h"

#include <math.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "base/cpu_isa.h"
#include "base/half.h"
#include "base/macros.h"
#include "kernels/backend.h"

namespace kiln::cpu {
namespace isa {
namespace {
#include "kernels/cpu/isa/rows.inc"
// clang-format off: convert.inc follows rows.inc
#include "kernels/cpu/isa/convert.inc"
#include "kernels/cpu/isa/loops.inc"
// clang-format on

Leaves make() {
  Leaves l{};
  l.name = "generic";
  l.rows = row_leaves();
  add_conversions(l.rows);
  add_loops(l.rows);
  return l;
}
}  // namespace

const Leaves& generic_leaves() {
  static const Leaves leaves = make();
  return leaves;
}
}  // namespace isa

const isa::Leaves& kernel_set() {
#if defined(__x86_64__)
  switch (cpu_isa()) {
    case CpuIsa::avx512: return isa::avx512_leaves();
    case CpuIsa::avx2: return isa::avx2_leaves();
    case CpuIsa::generic: break;
  }
#endif
  return isa::generic_leaves();
}

}  // namespace kiln::cpu
