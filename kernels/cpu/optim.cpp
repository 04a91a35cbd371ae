// CPU fused optimizer steps: one pass over each parameter's weight, gradient and state in chunks, each
// chunk through the kernel set's loop (kernels/cpu/isa/loops.inc) with the shared arithmetic of
// kernels/common/optim_math.h, so every set gives the same bits. LAMB's norms are summed in f64 over
// fixed chunks combined in order, so they do not depend on the thread count.
#include <vector>

#include "base/thread_pool.h"
#include "kernels/common/optim_math.h"
#include "kernels/cpu/kernel_sets.h"
#include "kernels/cpu/loops.h"
#include "kernels/cpu/ops_cpu.h"

namespace kiln::cpu {

namespace {
constexpr int64_t kChunk = 16384;

void lamb_one(const isa::RowLeaves& rows, const OptimSlice& s, const OptimHyper& h, const optim_math::AdamF& a) {
  // parallel_for_fixed's chunks (fixed by s.n, so the sums' order is too), each chunk's sums kept apart.
  const int64_t chunk = fixed_chunk(s.n, kChunk), nchunks = (s.n + chunk - 1) / chunk;
  std::vector<double> wsq(size_t(nchunks), 0.0), usq(size_t(nchunks), 0.0);
  parallel_for(0, nchunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t i = c * chunk, n = std::min(s.n - i, chunk);
      rows.lamb_moments(n, s.w + i, s.g + i, s.s0 + i, s.s1 + i, a, &wsq[size_t(c)], &usq[size_t(c)]);
    }
  });
  double ws = 0, us = 0;
  for (int64_t c = 0; c < nchunks; ++c) {
    ws += wsq[size_t(c)];
    us += usq[size_t(c)];
  }
  const float step = optim_math::lamb_step(h, optim_math::lamb_trust(ws, us));
  parallel_for_fixed(0, s.n, kChunk,
                     [&](int64_t b, int64_t e) { rows.lamb_apply(e - b, step, s.w + b, s.s0 + b, s.s1 + b, a); });
}
}  // namespace

void optimizer_step(OptimKind kind, const OptimSlice* slices, int64_t count, const OptimHyper& h) {
  if (optim_math::skipped(h)) return;
  const isa::RowLeaves& rows = kernel_set().rows;
  for (int64_t t = 0; t < count; ++t) {
    const OptimSlice& s = slices[t];
    switch (kind) {
      case OptimKind::sgd: {
        const optim_math::SgdF c = optim_math::sgd_constants(h);
        parallel_for_fixed(0, s.n, kChunk, [&](int64_t b, int64_t e) {
          rows.sgd(e - b, s.w + b, s.g + b, s.s0 ? s.s0 + b : nullptr, s.fresh, c);
        });
        break;
      }
      case OptimKind::adamw: {
        const optim_math::AdamF a = optim_math::adam_constants(h, s.step);
        parallel_for_fixed(0, s.n, kChunk,
                           [&](int64_t b, int64_t e) { rows.adamw(e - b, s.w + b, s.g + b, s.s0 + b, s.s1 + b, a); });
        break;
      }
      case OptimKind::lamb: lamb_one(rows, s, h, optim_math::adam_constants(h, s.step)); break;
    }
  }
}

}  // namespace kiln::cpu
