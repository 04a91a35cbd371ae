// CPU kernels of the index ops: index_select/index_add along one dim, gather/scatter_add with a full
// index tensor. Every add runs in index order, so the sums do not depend on the thread count.
#include <algorithm>
#include <cstring>

#include <vector>

#include "kernels/common/scatter.h"
#include "kernels/cpu/loops.h"
#include "kernels/cpu/nn_common.h"
#include "kernels/cpu/ops_cpu.h"

namespace kiln::cpu {
using namespace nn_detail;
namespace {

// Index kernels move any dtype; they dispatch on every storage type.
template <typename Fn> void dispatch_any(DType dt, Fn&& fn) {
  visit_dtype(dt, [&](auto t) { fn(t); });
}

template <typename T>
void index_select_typed(int64_t outer, int64_t n_src, int64_t inner, const T* src, int64_t n_idx, const int64_t* idx,
                        T* dst) {
  for (int64_t i = 0; i < n_idx; ++i)
    KILN_CHECK(idx[i] >= 0 && idx[i] < n_src, "index ", idx[i], " at position ", i, " is out of range [0, ", n_src, ")");
  parallel_for(0, outer * n_idx, std::max<int64_t>(1, 16384 / std::max<int64_t>(inner, 1)), [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const int64_t o = t / n_idx, i = t % n_idx;
      std::memcpy(dst + t * inner, src + (o * n_src + idx[i]) * inner, size_t(inner) * sizeof(T));
    }
  });
}

template <typename T>
void index_add_typed(int64_t outer, int64_t n_dst, int64_t inner, T* dst, int64_t n_idx, const int64_t* idx,
                     const T* src) {
  for (int64_t i = 0; i < n_idx; ++i)
    KILN_CHECK(idx[i] >= 0 && idx[i] < n_dst, "index ", idx[i], " at position ", i, " is out of range [0, ", n_dst, ")");
  // Parallel over (outer, column blocks); each column is summed in index order.
  const int64_t blk = 256, nblk = (inner + blk - 1) / blk;
  parallel_for(0, outer * nblk, 1, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const int64_t o = t / nblk, j0 = (t % nblk) * blk, j1 = std::min(inner, j0 + blk);
      for (int64_t i = 0; i < n_idx; ++i) {
        T* d = dst + (o * n_dst + idx[i]) * inner;
        const T* s = src + (o * n_idx + i) * inner;
        for (int64_t j = j0; j < j1; ++j) d[j] += s[j];
      }
    }
  });
}

template <typename T>
void gather_typed(int64_t outer, int64_t n_src, int64_t inner, const T* src, int64_t n_idx, const int64_t* idx, T* dst) {
  parallel_for(0, outer, 1, [&](int64_t b, int64_t e) {
    for (int64_t o = b; o < e; ++o)
      for (int64_t i = 0; i < n_idx; ++i)
        for (int64_t j = 0; j < inner; ++j) {
          const int64_t k = idx[(o * n_idx + i) * inner + j];
          KILN_CHECK(k >= 0 && k < n_src, "gather: index ", k, " is out of range [0, ", n_src, ")");
          dst[(o * n_idx + i) * inner + j] = src[(o * n_src + k) * inner + j];
        }
  });
}

template <typename T> void scatter_typed(ScatterOp op, bool include_self, int64_t outer, int64_t n_dst, int64_t inner,
                                         T* dst, int64_t n_idx, const int64_t* idx, const T* src) {
  const char* name = op == ScatterOp::add ? "scatter_add" : "scatter";
  for (int64_t i = 0; i < outer * n_idx * inner; ++i)
    KILN_CHECK(idx[i] >= 0 && idx[i] < n_dst, name, ": index ", idx[i], " is out of range [0, ", n_dst, ")");
  // Writes per element, where the op needs them (mean's divisor, the first write without self).
  const bool count = op == ScatterOp::mean || !include_self;
  std::vector<int64_t> hits(count ? size_t(outer * n_dst * inner) : 0, 0);
  parallel_for(0, outer, 1, [&](int64_t b, int64_t e) {
    for (int64_t o = b; o < e; ++o) {
      for (int64_t i = 0; i < n_idx; ++i)
        for (int64_t j = 0; j < inner; ++j) {
          const int64_t at = (o * n_dst + idx[(o * n_idx + i) * inner + j]) * inner + j;
          const T s = src[(o * n_idx + i) * inner + j];
          if (op == ScatterOp::add && include_self) {
            dst[at] += s;
            continue;
          }
          const int64_t h = count ? hits[size_t(at)]++ : 1;
          dst[at] = !include_self && h == 0 ? s : scatter::combine(op, dst[at], s);
        }
      if (op == ScatterOp::mean)
        for (int64_t at = o * n_dst * inner; at < (o + 1) * n_dst * inner; ++at)
          dst[at] = scatter::finish(op, include_self, dst[at], hits[size_t(at)]);
    }
  });
}

}  // namespace

void index_select(DType dt, int64_t outer, int64_t n_src, int64_t inner, const void* src, int64_t n_idx,
                  const int64_t* idx, void* dst) {
  dispatch_any(dt, [&](auto t) {
    using T = decltype(t);
    index_select_typed(outer, n_src, inner, cp<T>(src), n_idx, idx, mp<T>(dst));
  });
}
void index_add(DType dt, int64_t outer, int64_t n_dst, int64_t inner, void* dst, int64_t n_idx, const int64_t* idx,
               const void* src) {
  dispatch_float(dt, "index_add", [&](auto t) {
    using T = decltype(t);
    index_add_typed(outer, n_dst, inner, mp<T>(dst), n_idx, idx, cp<T>(src));
  });
}
void gather(DType dt, int64_t outer, int64_t n_src, int64_t inner, const void* src, int64_t n_idx, const int64_t* idx,
            void* dst) {
  dispatch_any(dt, [&](auto t) {
    using T = decltype(t);
    gather_typed(outer, n_src, inner, cp<T>(src), n_idx, idx, mp<T>(dst));
  });
}
void scatter(ScatterOp op, bool include_self, DType dt, int64_t outer, int64_t n_dst, int64_t inner, void* dst,
             int64_t n_idx, const int64_t* idx, const void* src) {
  dispatch_float(dt, "scatter", [&](auto t) {
    using T = decltype(t);
    scatter_typed(op, include_self, outer, n_dst, inner, mp<T>(dst), n_idx, idx, cp<T>(src));
  });
}

}  // namespace kiln::cpu
