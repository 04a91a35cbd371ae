// CPU fused optimizer steps: one pass over each parameter's weight, gradient and state with the
// shared arithmetic of kernels/common/optim_math.h. LAMB's norms are summed in f64 over fixed
// chunks combined in order, so they do not depend on the thread count.
#include <vector>

#include "base/thread_pool.h"
#include "kernels/common/optim_math.h"
#include "kernels/cpu/ops_cpu.h"

namespace kiln::cpu {

namespace {
constexpr int64_t kChunk = 16384;

void lamb_one(const OptimSlice& s, const OptimHyper& h, const optim_math::AdamF& a) {
  const int64_t nchunks = (s.n + kChunk - 1) / kChunk;
  std::vector<double> wsq(size_t(nchunks), 0.0), usq(size_t(nchunks), 0.0);
  parallel_for(0, nchunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      double ws = 0, us = 0;
      for (int64_t i = c * kChunk, e = std::min(s.n, (c + 1) * kChunk); i < e; ++i) {
        optim_math::adam_moments(s.g[i], s.s0[i], s.s1[i], a);
        const float u = optim_math::lamb_direction(s.w[i], s.s0[i], s.s1[i], a);
        ws += double(s.w[i] * s.w[i]);
        us += double(u * u);
      }
      wsq[size_t(c)] = ws;
      usq[size_t(c)] = us;
    }
  });
  double ws = 0, us = 0;
  for (int64_t c = 0; c < nchunks; ++c) {
    ws += wsq[size_t(c)];
    us += usq[size_t(c)];
  }
  const float step = optim_math::lamb_step(h, optim_math::lamb_trust(ws, us));
  parallel_for(0, s.n, kChunk, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      optim_math::lamb_apply(s.w[i], step, optim_math::lamb_direction(s.w[i], s.s0[i], s.s1[i], a));
  });
}
}  // namespace

void optimizer_step(OptimKind kind, const OptimSlice* slices, int64_t count, const OptimHyper& h) {
  if (optim_math::skipped(h)) return;
  for (int64_t t = 0; t < count; ++t) {
    const OptimSlice& s = slices[t];
    switch (kind) {
      case OptimKind::sgd: {
        const optim_math::SgdF c = optim_math::sgd_constants(h);
        parallel_for(0, s.n, kChunk, [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) optim_math::sgd(s.w[i], s.g[i], s.s0 ? s.s0 + i : nullptr, s.fresh, c);
        });
        break;
      }
      case OptimKind::adamw: {
        const optim_math::AdamF a = optim_math::adam_constants(h);
        parallel_for(0, s.n, kChunk, [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) {
            optim_math::adam_moments(s.g[i], s.s0[i], s.s1[i], a);
            optim_math::adamw_apply(s.w[i], s.s0[i], s.s1[i], a);
          }
        });
        break;
      }
      case OptimKind::lamb: lamb_one(s, h, optim_math::adam_constants(h)); break;
    }
  }
}

}  // namespace kiln::cpu
