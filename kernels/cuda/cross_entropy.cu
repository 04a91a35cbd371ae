// CUDA kernel of the fused cross-entropy (log-softmax + NLL with label smoothing and ignore_index),
// with the semantics of kernels/cpu/cross_entropy.cpp: a row per warp or block, two passes.
#include <cstdint>
#include <limits>
#include <type_traits>

#include "kernels/cuda/context.h"
#include "kernels/cuda/nn_common.cuh"
#include "kernels/cuda/ops_cuda.h"

namespace kiln::cuda {
using namespace nn_detail;
namespace {

// Fused log-softmax + NLL with label smoothing. Launch: launch_rows over rows of `classes`
// logits; lane r owns logits r, r + group, ... Pass 1: online (max, sum of exp) and the sum of
// logits, merged across the group; lse and the loss in f64 (rank 0 writes it). Pass 2 writes
// glogits = grad_scale * (softmax - target distribution). Ignored rows write 0; a target outside
// [0, classes) flags ce_target and writes 0. A non-finite maximum gives NaN, as on the CPU.
// Traffic: logits read twice (second time cached), glogits written once, one i64 target per row.
template <typename T, bool kBlock>
__global__ void __launch_bounds__(kThreads) cross_entropy_kernel(int64_t rows, int64_t classes, const T* logits,
                                                                 const int64_t* target, int64_t ignore, double eps,
                                                                 T* loss, T* glogits, double grad_scale, int* err) {
  using G = RowGroup<kBlock>;
  __shared__ MaxSum<T> red[32];
  __shared__ double sred[32];
  for (int64_t r = G::first(); r < rows; r += G::step()) {
    const T* x = logits + r * classes;
    T* g = glogits ? glogits + r * classes : nullptr;
    const int64_t t = target[r];
    const bool bad = t != ignore && (t < 0 || t >= classes);
    if (t == ignore || bad) {
      if (G::rank() == 0) {
        if (bad) flag_error(err, KernelError::ce_target);
        loss[r] = T(0);
      }
      if (g)
        for (int64_t i = G::rank(); i < classes; i += G::size()) g[i] = T(0);
      continue;
    }
    // Everything relative to the maximum, as the CPU's row: the loss is (max - x[t]) + log(sum), and
    // the smoothing term's sum of x - max comes from a sum of x - x[0] (the max is known only after
    // the merge): max + log(sum) would absorb log(sum) into a large max, and a sum of x itself lose
    // the term's digits.
    MaxSum<T> ms{kNegInf<T>, T(0)};
    const T x0 = isfinite(double(x[0])) ? x[0] : T(0);  // a -inf pivot would make the sum NaN
    T sx = T(0);
    for (int64_t i = G::rank(); i < classes; i += G::size()) {
      const T v = x[i];
      ms_add(ms, v);
      sx += v - x0;
    }
    ms = group_merge<kBlock>(ms, red);
    const double dc = double(classes);
    const double sum_d = group_sum<kBlock>(double(sx), sred) + dc * (double(x0) - double(ms.m));
    const double log_s = isfinite(ms.m) ? ::log(double(ms.s)) : std::numeric_limits<double>::quiet_NaN();
    if (G::rank() == 0) {
      const double nll = (double(ms.m) - double(x[t])) + log_s;
      // The smoothing term only when asked for: with a -inf logit sum_d is -inf, and 0 * inf is NaN.
      loss[r] = T(eps != 0 ? (1 - eps) * nll + eps * (log_s - sum_d / dc) : nll);
    }
    if (g) {
      if constexpr (std::is_same_v<T, float>) {  // the CPU's f32 row: f32 terms, the target's in f64
        // log(sum) beside the max, as the CPU's row does; NaN when the max is not finite.
        const float ls = float(log_s);
        const float sc = float(grad_scale), off = float(grad_scale * eps / dc);
        for (int64_t i = G::rank(); i < classes; i += G::size())
          g[i] = i == t ? float(grad_scale * (::exp((double(x[t]) - double(ms.m)) - log_s) - (1 - eps) - eps / dc))
                        : sc * expf((x[i] - ms.m) - ls) - off;
      } else {
        // The target distribution's two values, hoisted (and the loop kept rolled: unrolled, the
        // f64 kernel spilled on sm_90).
        const double on = (1 - eps) + eps / dc, off = eps / dc, m = double(ms.m), ls = log_s;
#pragma unroll 1
        for (int64_t i = G::rank(); i < classes; i += G::size())
          g[i] = T(grad_scale * (::exp((double(x[i]) - m) - ls) - (i == t ? on : off)));
      }
    }
  }
}

}  // namespace

void cross_entropy(DType dt, int64_t rows, int64_t classes, const void* logits, const int64_t* target,
                   int64_t ignore_index, double smoothing, void* loss, void* glogits, double grad_scale) {
  if (rows == 0) return;
  Context& ctx = current();
  dispatch_nn(dt, "cross_entropy", [&](auto tag) {
    using T = decltype(tag);
    launch_rows(cross_entropy_kernel<T, false>, cross_entropy_kernel<T, true>, "cross_entropy_kernel", rows, classes,
                ctx.stream, rows, classes, cp<T>(logits), target, ignore_index, smoothing, mp<T>(loss),
                mp<T>(glogits), grad_scale, ctx.error_word);
  });
}

}  // namespace kiln::cuda
