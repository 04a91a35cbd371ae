// CUDA kernels of the scans and the stable argsort, with the arithmetic of kernels/common/scan.h
// (the CPU kernels' own), so both devices give the same bits.
#include <algorithm>
#include <cstdint>

#include "kernels/common/dispatch.h"
#include "kernels/common/scan.h"
#include "kernels/cuda/context.h"
#include "kernels/cuda/ops_cuda.h"

namespace kiln::cuda {
namespace {

template <typename Fn> void dispatch_sortable(DType dt, const char* op, Fn&& fn) {
  dispatch_one_of<float, double, int32_t, int64_t>(dt, "cuda", op, fn);
}

// A thread per column of [outer, n, inner], walking its n elements in order (a scan is sequential
// along its dim; the columns give the parallelism). Launch: grid_for(outer * inner), grid-stride.
template <typename T> __global__ void __launch_bounds__(kThreads)
    scan_kernel(ScanOp op, int64_t outer, int64_t n, int64_t inner, const T* x, T* y, int64_t* idx) {
  const int64_t cols = outer * inner;
  for (int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < cols; c += int64_t(gridDim.x) * blockDim.x) {
    const int64_t base = (c / inner) * n * inner + c % inner;
    scan::scan_column(op, n, inner, x + base, y + base, idx ? idx + base : nullptr);
  }
}

template <typename T> __global__ void __launch_bounds__(kThreads)
    cumprod_backward_kernel(int64_t outer, int64_t n, int64_t inner, const T* x, const T* gy, T* gx) {
  const int64_t cols = outer * inner;
  for (int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < cols; c += int64_t(gridDim.x) * blockDim.x) {
    const int64_t base = (c / inner) * n * inner + c % inner;
    scan::cumprod_backward_column(n, inner, x + base, gy + base, gx + base);
  }
}

// A block per column (grid-stride over columns): a bottom-up merge sort of positions in `a`/`b`
// (n each per block, ping-pong, reused column after column). In a pass of width w, each element of a run pair goes to its
// rank in its own run plus the count of the other run's elements that sort before it (a binary
// search); the order is total (ties broken by position), so every position is written once.
// log2(n) passes, each O(n log n) work over the block's threads.
template <typename T> __global__ void __launch_bounds__(kThreads)
    argsort_kernel(int64_t outer, int64_t n, int64_t inner, const T* x, bool descending, int64_t* a, int64_t* b,
                   int64_t* idx) {
  const int64_t cols = outer * inner;
  for (int64_t c = blockIdx.x; c < cols; c += gridDim.x) {
    const int64_t base = (c / inner) * n * inner + c % inner;
    const T* col = x + base;
    int64_t* src = a + int64_t(blockIdx.x) * n;
    int64_t* dst = b + int64_t(blockIdx.x) * n;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) src[i] = i;
    __syncthreads();
    for (int64_t w = 1; w < n; w *= 2) {
      for (int64_t p = threadIdx.x; p < n; p += blockDim.x) {
        const int64_t s = p / (2 * w) * (2 * w), mid = min(s + w, n), end = min(s + 2 * w, n);
        const bool left = p < mid;
        const int64_t e = src[p];
        const T v = col[e * inner];
        // The other run: [lo, hi); count its elements that sort before e.
        int64_t lo = left ? mid : s, hi = left ? end : mid;
        const int64_t first = lo;
        while (lo < hi) {
          const int64_t m = lo + (hi - lo) / 2, o = src[m];
          if (scan::sorts_before(col[o * inner], o, v, e, descending))
            lo = m + 1;
          else
            hi = m;
        }
        dst[s + (p - (left ? s : mid)) + (lo - first)] = e;
      }
      __syncthreads();
      int64_t* t = src;
      src = dst;
      dst = t;
    }
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) idx[base + i * inner] = src[i];
    __syncthreads();
  }
}

}  // namespace

void scan(ScanOp op, DType dt, int64_t outer, int64_t n, int64_t inner, const void* src, void* dst, int64_t* idx) {
  const int64_t cols = outer * inner;
  if (cols == 0 || n == 0) return;
  Context& ctx = current();
  dispatch_sortable(dt, "scan", [&](auto tag) {
    using T = decltype(tag);
    launch("scan_kernel", scan_kernel<T>, grid_for(cols), kThreads, 0, ctx.stream, op, outer, n, inner,
           static_cast<const T*>(src), static_cast<T*>(dst), idx);
  });
}

void cumprod_backward(DType dt, int64_t outer, int64_t n, int64_t inner, const void* x, const void* gy, void* gx) {
  const int64_t cols = outer * inner;
  if (cols == 0 || n == 0) return;
  KILN_CHECK(dt == DType::f32 || dt == DType::f64, "cuda cumprod backward: dtype ", dt, " is not supported (f32, f64)");
  Context& ctx = current();
  dispatch_sortable(dt, "cumprod backward", [&](auto tag) {
    using T = decltype(tag);
    launch("cumprod_backward_kernel", cumprod_backward_kernel<T>, grid_for(cols), kThreads, 0, ctx.stream, outer, n,
           inner, static_cast<const T*>(x), static_cast<const T*>(gy), static_cast<T*>(gx));
  });
}

void argsort(DType dt, int64_t outer, int64_t n, int64_t inner, const void* src, bool descending, int64_t* idx) {
  const int64_t cols = outer * inner;
  if (cols == 0 || n == 0) return;
  Context& ctx = current();
  const unsigned blocks = unsigned(std::min<int64_t>(cols, int64_t(ctx.prop.multiProcessorCount) * 8));
  const DeviceBuffer scratch(size_t(2 * int64_t(blocks) * n) * sizeof(int64_t));  // two runs of n per block
  int64_t* a = scratch.get<int64_t>();
  dispatch_sortable(dt, "argsort", [&](auto tag) {
    using T = decltype(tag);
    launch("argsort_kernel", argsort_kernel<T>, blocks, kThreads, 0, ctx.stream, outer, n, inner,
           static_cast<const T*>(src), descending, a, a + int64_t(blocks) * n, idx);
  });
}

}  // namespace kiln::cuda
