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
// clang-format on

// Philox (loops.inc) in 128-bit vectors (SSE2, NEON), the products and the transpose lane by lane.
typedef uint32_t PhiloxV __attribute__((vector_size(16)));
constexpr int kPhiloxLanes = 4;
inline PhiloxV philox_mulhi(PhiloxV a, uint32_t m) {
  PhiloxV h;
  for (int l = 0; l < kPhiloxLanes; ++l) h[l] = uint32_t((uint64_t(a[l]) * m) >> 32);
  return h;
}
inline void philox_store(const PhiloxV (&c)[4], uint32_t* out) {
  for (int l = 0; l < kPhiloxLanes; ++l)
    for (int q = 0; q < 4; ++q) out[4 * l + q] = c[q][l];
}
#include "kernels/cpu/isa/loops.inc"

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
