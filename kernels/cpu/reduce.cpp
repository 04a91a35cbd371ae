// CPU reductions over the middle dim of a contiguous [outer, r, inner] block. Floating sums
// accumulate in f64 over fixed-size chunks combined in order, so results never depend on the
// thread count.
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/common/int_arith.h"
#include "kernels/cpu/kernel_sets.h"
#include "kernels/cpu/loops.h"
#include "kernels/cpu/ops_cpu.h"

namespace kiln::cpu {
namespace {

constexpr int64_t kChunk = 8192;  // fixed summation chunk along r when inner == 1
constexpr int64_t kColBlock = 256;  // columns per task when inner > 1

template <typename T> constexpr bool is_float_v =
    std::is_floating_point_v<T> || std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;

// Integers sum in i64 and wrap there (math::wrap_add), as PyTorch's: a signed overflow would be undefined.
template <typename T> using SumAcc = std::conditional_t<is_float_v<T>, double, int64_t>;

template <typename TO, typename T> void sum_typed(TO* dst, const T* src, int64_t outer, int64_t r, int64_t inner) {
  using S = SumAcc<T>;
  if (inner == 1) {
    const int64_t nchunks = std::max<int64_t>(1, (r + kChunk - 1) / kChunk);
    std::vector<S> partial(size_t(outer * nchunks), S(0));
    parallel_for(0, outer * nchunks, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, std::min(r, kChunk))), [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        const int64_t o = t / nchunks, c = t % nchunks;
        const T* p = src + o * r;
        const int64_t i0 = c * kChunk, i1 = std::min(r, i0 + kChunk);
        S acc = 0;
        for (int64_t i = i0; i < i1; ++i) acc = math::wrap_add(acc, S(load(p + i)));
        partial[size_t(t)] = acc;
      }
    });
    for (int64_t o = 0; o < outer; ++o) {
      S acc = 0;
      for (int64_t c = 0; c < nchunks; ++c) acc = math::wrap_add(acc, partial[size_t(o * nchunks + c)]);
      store(dst + o, acc);
    }
    return;
  }
  const int64_t nblk = (inner + kColBlock - 1) / kColBlock;
  const auto col_sums = kernel_set().rows.col_sums;
  parallel_for(0, outer * nblk, 1, [&](int64_t b, int64_t e) {
    std::vector<S> acc(static_cast<size_t>(kColBlock));
    for (int64_t t = b; t < e; ++t) {
      const int64_t o = t / nblk, j0 = (t % nblk) * kColBlock, j1 = std::min(inner, j0 + kColBlock);
      std::fill(acc.begin(), acc.end(), S(0));
      if constexpr (std::is_same_v<T, float>) {
        col_sums(r, j1 - j0, inner, src + o * r * inner + j0, acc.data());  // the kernel set's loop, same bits
      } else {
        for (int64_t i = 0; i < r; ++i) {
          const T* p = src + (o * r + i) * inner;
          for (int64_t j = j0; j < j1; ++j) acc[size_t(j - j0)] = math::wrap_add(acc[size_t(j - j0)], S(load(p + j)));
        }
      }
      for (int64_t j = j0; j < j1; ++j) store(dst + o * inner + j, acc[size_t(j - j0)]);
    }
  });
}

// NaN wins: max and min propagate it, argmax/argmin point at the first one.
template <typename A> bool better(A x, A best, bool is_max) {
  if constexpr (std::is_floating_point_v<A>) {
    if (best != best) return false;
    if (x != x) return true;
  }
  return is_max ? x > best : x < best;
}

template <typename TO, typename T>
void extreme_typed(TO* dst, const T* src, int64_t outer, int64_t r, int64_t inner, bool is_max, bool want_index) {
  using A = Acc<T>;
  const int64_t total = outer * inner;
  parallel_for(0, total, std::max<int64_t>(1, 16384 / std::max<int64_t>(r, 1)), [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const int64_t o = t / inner, j = t % inner;
      const T* p = src + o * r * inner + j;
      A best = load(p);
      int64_t bi = 0;
      for (int64_t i = 1; i < r; ++i) {
        const A x = load(p + i * inner);
        if (better(x, best, is_max)) {
          best = x;
          bi = i;
        }
      }
      if (want_index) {
        store(dst + t, bi);
      } else {
        store(dst + t, best);
      }
    }
  });
}

}  // namespace

void reduce(ReduceOp op, void* dst, DType dst_dtype, const void* src, DType src_dtype, int64_t outer, int64_t r,
            int64_t inner) {
  if (outer * inner == 0) return;
  KILN_ASSERT(r > 0 || op == ReduceOp::sum, "max/min over an empty dim");
  visit_dtype(src_dtype, [&](auto ti) {
    using T = decltype(ti);
    visit_dtype(dst_dtype, [&](auto to) {
      using TO = decltype(to);
      auto* d = static_cast<TO*>(dst);
      auto* s = static_cast<const T*>(src);
      switch (op) {
        case ReduceOp::sum: return sum_typed<TO, T>(d, s, outer, r, inner);
        case ReduceOp::max: return extreme_typed<TO, T>(d, s, outer, r, inner, true, false);
        case ReduceOp::min: return extreme_typed<TO, T>(d, s, outer, r, inner, false, false);
        case ReduceOp::argmax: return extreme_typed<TO, T>(d, s, outer, r, inner, true, true);
        case ReduceOp::argmin: return extreme_typed<TO, T>(d, s, outer, r, inner, false, true);
      }
    });
  });
}

}  // namespace kiln::cpu
