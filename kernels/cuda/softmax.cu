// CUDA kernels of softmax, log-softmax and attention's masked softmax, with the semantics of
// kernels/cpu/softmax.cpp: contiguous rows by a warp or a block (online max and sum), else by columns.
#include <cstdint>

#include "kernels/cuda/context.h"
#include "kernels/cuda/nn_common.cuh"
#include "kernels/cuda/ops_cuda.h"

namespace kiln::cuda {
using namespace nn_detail;
namespace {

// Softmax / log-softmax of contiguous rows (inner == 1). Launch: launch_rows, a warp or a
// block per row, grid-stride over rows; lane r of the group owns elements r, r + group, ...
// Pass 1 folds the online (max, sum) state and merges it across the group; pass 2 writes y.
// A row whose maximum is not finite takes the CPU's path (max := 0, one more pass for the sum).
// Traffic: x read twice (the second time from L1/L2), y written once.
template <typename T, bool kBlock>
__global__ void __launch_bounds__(kThreads) softmax_rows_kernel(bool log, int64_t rows, int64_t n, const T* x, T* y) {
  using G = RowGroup<kBlock>;
  __shared__ MaxSum<T> red[32];
  __shared__ T sred[32];
  for (int64_t r = G::first(); r < rows; r += G::step()) {
    const T* xr = x + r * n;
    T* yr = y + r * n;
    MaxSum<T> ms{kNegInf<T>, T(0)};
    for (int64_t i = G::rank(); i < n; i += G::size()) ms_add(ms, xr[i]);
    ms = group_merge<kBlock>(ms, red);
    T m = ms.m, s = ms.s;
    if (m == kNegInf<T> && s == T(0)) {  // every element -inf (NaN would make s NaN): the CPU's 0 / -inf
      for (int64_t i = G::rank(); i < n; i += G::size()) yr[i] = log ? kNegInf<T> : T(0);
      continue;
    }
    if (!isfinite(m)) {  // the same for the whole group
      m = T(0);
      T t = T(0);
      for (int64_t i = G::rank(); i < n; i += G::size()) t += dexp(xr[i]);
      s = group_sum<kBlock>(t, sred);
    }
    if (log) {  // (x - max) - log(sum), as on the CPU: max + log(sum) would round to max's ulp
      const T ls = T(::log(double(s)));
      for (int64_t i = G::rank(); i < n; i += G::size()) yr[i] = (xr[i] - m) - ls;
    } else {
      const T inv = T(1.0 / double(s));
      for (int64_t i = G::rank(); i < n; i += G::size()) yr[i] = dexp(xr[i] - m) * inv;
    }
  }
}

// How the column kernels' blocks of 8 warps cover [outer, n, inner], inner > 1: a tile is w
// consecutive columns of one o (w = 32, or inner rounded up to a power of two when inner < 32).
// Lane l of warp ty takes column l % w and rows ty * 32 / w + l / w, then every 8 * 32 / w rows
// on, so a warp reads 32 consecutive elements however narrow the columns are (only the padding of
// inner up to w idles: 3 columns use 24 of 32 lanes, not 3).
struct ColTiles {
  int w = 1;
  int64_t per_o;  // tiles per o
  __host__ __device__ explicit ColTiles(int64_t inner) {
    while (w < 32 && w < inner) w <<= 1;
    per_o = (inner + w - 1) / w;
  }
  unsigned blocks(int64_t outer) const { return grid_for(outer * per_o * kThreads); }
};
// Per-thread range of the column kernels: first element, end, and step of this thread's rows of its
// column in tile t ([first, end) empty for a row past n; end == 0 for a column past inner's edge).
struct ColSlice {
  int64_t first, end, step;
};
__device__ __forceinline__ ColSlice col_slice(const ColTiles& ct, int64_t t, int64_t n, int64_t inner) {
  const int tx = threadIdx.x & 31, ty = threadIdx.x >> 5, rows_per_warp = 32 / ct.w;
  const int64_t o = t / ct.per_o, j = (t % ct.per_o) * ct.w + tx % ct.w;
  const int64_t row = int64_t(ty) * rows_per_warp + tx / ct.w;
  return {o * n * inner + row * inner + j, j < inner ? (o + 1) * n * inner : 0, int64_t(8 * rows_per_warp) * inner};
}
// Sum over the lanes of this warp that share a column (lane % w); every lane gets its column's sum.
template <typename A> __device__ __forceinline__ A col_lanes_sum(A v, int w) {
  for (int o = 16; o >= w; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Softmax over the middle dim of [outer, n, inner], inner > 1. Launch: ColTiles::blocks blocks of
// 256, grid-stride over tiles (ColTiles); each thread folds its rows of its column (ColSlice), the
// lanes of a warp that share a column merge by shuffles, then the 8 warps through shared memory in
// warp order. Traffic: x read twice, y written once.
template <typename T>
__global__ void __launch_bounds__(kThreads) softmax_cols_kernel(bool log, int64_t outer, int64_t n, int64_t inner,
                                                                const T* x, T* y) {
  __shared__ MaxSum<T> red[8][32];
  __shared__ T sred[8][32];
  const int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;
  const ColTiles ct(inner);
  for (int64_t t = blockIdx.x; t < outer * ct.per_o; t += gridDim.x) {
    const auto [first, end, step] = col_slice(ct, t, n, inner);
    MaxSum<T> ms{kNegInf<T>, T(0)};
    for (int64_t q = first; q < end; q += step) ms_add(ms, x[q]);
    red[ty][tx] = warp_merge(ms, ct.w);
    __syncthreads();
    ms = red[0][tx];
#pragma unroll 1
    for (int k = 1; k < 8; ++k) ms = ms_merge(ms, red[k][tx]);
    T m = ms.m, s = ms.s;
    const bool all_neg_inf = m == kNegInf<T> && s == T(0);  // the CPU's 0 / -inf for this column
    if (__syncthreads_or(end != 0 && !isfinite(m))) {  // some column takes the CPU's max := 0 path
      T acc = T(0);
      for (int64_t q = first; q < end; q += step) acc += dexp(x[q]);
      sred[ty][tx] = col_lanes_sum(acc, ct.w);
      __syncthreads();
      if (!isfinite(m)) {
        m = T(0);
        s = sred[0][tx];
        for (int k = 1; k < 8; ++k) s += sred[k][tx];
      }
    }
    if (all_neg_inf) {
      for (int64_t q = first; q < end; q += step) y[q] = log ? kNegInf<T> : T(0);
    } else if (log) {
      const T ls = T(::log(double(s)));
      for (int64_t q = first; q < end; q += step) y[q] = (x[q] - m) - ls;
    } else {
      const T inv = T(1.0 / double(s));
      for (int64_t q = first; q < end; q += step) y[q] = dexp(x[q] - m) * inv;
    }
    __syncthreads();  // red and sred are rewritten by the next tile
  }
}

// Softmax backward, contiguous rows. Launch: launch_rows; lane r owns elements r, r + group, ...
// s = sum(gy * y) (softmax) or sum(gy) (log-softmax), per-thread in T, across the group in f64.
// gx is multiplied by `scale` (1, or masked softmax's score scale: exact when 1).
// Traffic: y and gy read twice (second time cached), gx written once.
template <typename T, bool kBlock>
__global__ void __launch_bounds__(kThreads) softmax_bwd_rows_kernel(bool log, int64_t rows, int64_t n, const T* y,
                                                                    const T* gy, T scale, T* gx) {
  using G = RowGroup<kBlock>;
  __shared__ double sred[32];
  for (int64_t r = G::first(); r < rows; r += G::step()) {
    const T* yr = y + r * n;
    const T* g = gy + r * n;
    T* o = gx + r * n;
    T acc = T(0);
    for (int64_t i = G::rank(); i < n; i += G::size()) acc += log ? g[i] : g[i] * yr[i];
    const T s = T(group_sum<kBlock>(double(acc), sred));
    if (log) {
      for (int64_t i = G::rank(); i < n; i += G::size()) o[i] = scale * (g[i] - dexp(yr[i]) * s);
    } else {
      for (int64_t i = G::rank(); i < n; i += G::size()) o[i] = scale * (yr[i] * (g[i] - s));
    }
  }
}

// Softmax backward over the middle dim, inner > 1. Launch and ownership as softmax_cols_kernel; the
// per-thread sums (in T) combine in f64, across a warp's lanes of one column by shuffles, then over
// the 8 warps in warp order. Traffic: y and gy read twice, gx written once.
template <typename T>
__global__ void __launch_bounds__(kThreads) softmax_bwd_cols_kernel(bool log, int64_t outer, int64_t n, int64_t inner,
                                                                    const T* y, const T* gy, T* gx) {
  __shared__ double sred[8][32];
  const int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;
  const ColTiles ct(inner);
  for (int64_t t = blockIdx.x; t < outer * ct.per_o; t += gridDim.x) {
    const auto [first, end, step] = col_slice(ct, t, n, inner);
    T acc = T(0);
    for (int64_t q = first; q < end; q += step) acc += log ? gy[q] : gy[q] * y[q];
    sred[ty][tx] = col_lanes_sum(double(acc), ct.w);
    __syncthreads();
    double sum = sred[0][tx];
    for (int k = 1; k < 8; ++k) sum += sred[k][tx];
    const T s = T(sum);
    for (int64_t q = first; q < end; q += step) gx[q] = log ? gy[q] - dexp(y[q]) * s : y[q] * (gy[q] - s);
    __syncthreads();  // sred is rewritten by the next tile
  }
}

// Attention's softmax, y = softmax(scale * x + mask), contiguous rows. Launch: launch_rows, as
// softmax_rows_kernel (a warp or a block per row, lane r owning elements r, r + group, ...). The
// scaled, masked scores z are recomputed from x and the mask row in each pass instead of being stored:
// what the unfused ops would write and read back as two [rows, n] tensors never leaves registers.
// Traffic: x and the mask row read twice (the second time from L1/L2), y written once. Its backward
// is softmax_bwd_rows_kernel with the scale.
template <typename T, bool kBlock>
__global__ void __launch_bounds__(kThreads) masked_softmax_rows_kernel(int64_t rows, int64_t n, const T* x, T scale,
                                                                       const T* mask, MaskRows mr, T* y) {
  using G = RowGroup<kBlock>;
  __shared__ MaxSum<T> red[32];
  __shared__ T sred[32];
  for (int64_t r = G::first(); r < rows; r += G::step()) {
    const T* xr = x + r * n;
    T* yr = y + r * n;
    const T* mrow = mask ? mask + mask_row_offset(mr, r) : nullptr;
    const int64_t mstep = mr.step, cend = causal_end(mr, r, n);
    auto z = [&](int64_t i) {
      if (i >= cend) return kNegInf<T>;
      return mrow ? xr[i] * scale + mrow[i * mstep] : xr[i] * scale;
    };
    MaxSum<T> ms{kNegInf<T>, T(0)};
    for (int64_t i = G::rank(); i < n; i += G::size()) ms_add(ms, z(i));
    ms = group_merge<kBlock>(ms, red);
    T m = ms.m, s = ms.s;
    if (m == kNegInf<T> && s == T(0)) {  // a fully masked row: zeros, as on the CPU
      for (int64_t i = G::rank(); i < n; i += G::size()) yr[i] = T(0);
      continue;
    }
    if (!isfinite(m)) {  // the same for the whole group: the CPU's max := 0 path
      m = T(0);
      T t = T(0);
      for (int64_t i = G::rank(); i < n; i += G::size()) t += dexp(z(i));
      s = group_sum<kBlock>(t, sred);
    }
    const T inv = T(1.0 / double(s));
    for (int64_t i = G::rank(); i < n; i += G::size()) yr[i] = dexp(z(i) - m) * inv;
  }
}

}  // namespace

void softmax_forward(DType dt, bool log, int64_t outer, int64_t n, int64_t inner, const void* x, void* y) {
  if (outer * n * inner == 0) return;
  const cudaStream_t s = current().stream;
  dispatch_nn(dt, "softmax", [&](auto tag) {
    using T = decltype(tag);
    if (inner == 1) {
      launch_rows(softmax_rows_kernel<T, false>, softmax_rows_kernel<T, true>, "softmax_rows_kernel", outer, n, s,
                  log, outer, n, cp<T>(x), mp<T>(y));
    } else {
      launch("softmax_cols_kernel", softmax_cols_kernel<T>, ColTiles(inner).blocks(outer), kThreads, 0, s, log, outer,
             n, inner, cp<T>(x), mp<T>(y));
    }
  });
}

void softmax_backward(DType dt, bool log, int64_t outer, int64_t n, int64_t inner, const void* y, const void* gy,
                      void* gx) {
  if (outer * n * inner == 0) return;
  const cudaStream_t s = current().stream;
  dispatch_nn(dt, "softmax", [&](auto tag) {
    using T = decltype(tag);
    if (inner == 1) {
      launch_rows(softmax_bwd_rows_kernel<T, false>, softmax_bwd_rows_kernel<T, true>, "softmax_bwd_rows_kernel",
                  outer, n, s, log, outer, n, cp<T>(y), cp<T>(gy), T(1), mp<T>(gx));
    } else {
      launch("softmax_bwd_cols_kernel", softmax_bwd_cols_kernel<T>, ColTiles(inner).blocks(outer), kThreads, 0, s,
             log, outer, n, inner, cp<T>(y), cp<T>(gy), mp<T>(gx));
    }
  });
}

void masked_softmax_forward(DType dt, int64_t rows, int64_t n, const void* x, double scale, const void* mask,
                            const MaskRows& mask_rows, void* y) {
  if (rows * n == 0) return;
  const cudaStream_t s = current().stream;
  dispatch_nn(dt, "masked_softmax", [&](auto tag) {
    using T = decltype(tag);
    launch_rows(masked_softmax_rows_kernel<T, false>, masked_softmax_rows_kernel<T, true>, "masked_softmax_rows_kernel",
                rows, n, s, rows, n, cp<T>(x), T(scale), cp<T>(mask), mask_rows, mp<T>(y));
  });
}

void masked_softmax_backward(DType dt, int64_t rows, int64_t n, const void* y, const void* gy, double scale, void* gx) {
  if (rows * n == 0) return;
  const cudaStream_t s = current().stream;
  dispatch_nn(dt, "masked_softmax", [&](auto tag) {
    using T = decltype(tag);
    launch_rows(softmax_bwd_rows_kernel<T, false>, softmax_bwd_rows_kernel<T, true>, "softmax_bwd_rows_kernel", rows,
                n, s, false, rows, n, cp<T>(y), cp<T>(gy), T(scale), mp<T>(gx));
  });
}

}  // namespace kiln::cuda
