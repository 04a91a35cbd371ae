// CPU random fills from Kiln's Philox stream: element i uses lane i % 4 of block offset/4 + i/4,
// exactly as the CUDA kernel does, so both devices draw the same numbers. f32 uniform and Bernoulli
// fills run the kernel set's lane-parallel Philox (kernels/cpu/isa/loops.inc, the same bits).
#include "kernels/common/random_draw.h"
#include "kernels/cpu/kernel_sets.h"
#include "kernels/cpu/loops.h"
#include "kernels/cpu/ops_cpu.h"

#include <algorithm>
#include <cmath>

namespace kiln::cpu {

void random(RandomKind kind, const TensorDesc& dst, uint64_t seed, uint64_t offset, double p0, double p1) {
  const int64_t n = dst.numel();
  const int64_t nblocks = (n + 3) / 4;
  const uint64_t first = offset / 4;
  if (dst.dtype == DType::f32 && kind != RandomKind::normal) {
    // The kernel set's lane-parallel Philox (kernels/cpu/isa/loops.inc), tasks cut at groups of 16 blocks.
    const auto fill = kernel_set().rows.random_f32;
    float* out = static_cast<float*>(dst.data);
    constexpr int64_t kGroup = 64;  // elements of 16 blocks
    parallel_for(0, (n + kGroup - 1) / kGroup, 64, [&](int64_t g0, int64_t g1) {
      const int64_t i0 = g0 * kGroup, i1 = std::min(n, g1 * kGroup);
      fill(kind == RandomKind::bernoulli, seed, first + uint64_t(i0 / 4), i1 - i0, p0, p1, out + i0);
    });
    return;
  }
  const int bits = uniform_bits(dst.dtype);
  visit_dtype(dst.dtype, [&](auto tag) {
    using T = decltype(tag);
    T* out = static_cast<T*>(dst.data);
    parallel_for(0, nblocks, 1024, [&](int64_t b0, int64_t b1) {
      for (int64_t blk = b0; blk < b1; ++blk) {
        float v[4];
        random_draw4(kind, philox_block(seed, first + uint64_t(blk)), p0, p1, v, bits);
        for (int l = 0; l < 4; ++l) {
          const int64_t i = blk * 4 + l;
          if (i < n) store(out + i, v[l]);
        }
      }
    });
  });
}

}  // namespace kiln::cpu
