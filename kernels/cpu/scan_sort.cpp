// CPU kernels of the scans (cumsum, cumprod, cummax, cummin, cumprod's gradient) and of the stable
// argsort: one column at a time, columns in parallel, with the arithmetic of kernels/common/scan.h.
#include <algorithm>
#include <numeric>
#include <vector>

#include "kernels/common/dispatch.h"
#include "kernels/common/scan.h"
#include "kernels/cpu/loops.h"
#include "kernels/cpu/ops_cpu.h"

namespace kiln::cpu {
namespace {

template <typename Fn> void dispatch_sortable(DType dt, const char* op, Fn&& fn) {
  dispatch_one_of<float, double, int32_t, int64_t>(dt, "cpu", op, fn);
}

// Runs fn(base offset of the column) for each of the outer * inner columns of [outer, n, inner].
template <typename Fn> void for_columns(int64_t outer, int64_t n, int64_t inner, Fn&& fn) {
  parallel_for(0, outer * inner, std::max<int64_t>(1, 16384 / std::max<int64_t>(n, 1)), [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) fn((c / inner) * n * inner + c % inner);
  });
}

}  // namespace

void scan(ScanOp op, DType dt, int64_t outer, int64_t n, int64_t inner, const void* src, void* dst, int64_t* idx) {
  dispatch_sortable(dt, "scan", [&](auto tag) {
    using T = decltype(tag);
    const T* x = static_cast<const T*>(src);
    T* y = static_cast<T*>(dst);
    for_columns(outer, n, inner,
                [&](int64_t base) { scan::scan_column(op, n, inner, x + base, y + base, idx ? idx + base : nullptr); });
  });
}

void cumprod_backward(DType dt, int64_t outer, int64_t n, int64_t inner, const void* x, const void* gy, void* gx) {
  dispatch_one_of<float, double>(dt, "cpu", "cumprod backward", [&](auto tag) {
    using T = decltype(tag);
    for_columns(outer, n, inner, [&](int64_t base) {
      scan::cumprod_backward_column(n, inner, static_cast<const T*>(x) + base, static_cast<const T*>(gy) + base,
                                    static_cast<T*>(gx) + base);
    });
  });
}

void argsort(DType dt, int64_t outer, int64_t n, int64_t inner, const void* src, bool descending, int64_t* idx) {
  dispatch_sortable(dt, "argsort", [&](auto tag) {
    using T = decltype(tag);
    const T* x = static_cast<const T*>(src);
    for_columns(outer, n, inner, [&](int64_t base) {
      std::vector<int64_t> order(static_cast<size_t>(n));
      std::iota(order.begin(), order.end(), int64_t(0));
      const T* col = x + base;
      std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
        return scan::sorts_before(col[a * inner], a, col[b * inner], b, descending);
      });
      for (int64_t i = 0; i < n; ++i) idx[base + i * inner] = order[size_t(i)];
    });
  });
}

}  // namespace kiln::cpu
