// CUDA kernels of the neural-network ops, with the semantics of kernels/cpu/nn.cpp:
// pooling, softmax, layer and batch norm, fused cross-entropy and the index kernels.
//
// Determinism: no floating-point atomics anywhere. Every sum runs in an order fixed by the shape
// (warp shuffles and block trees of a fixed size, partial buffers summed in index order), so two
// runs give the same bits (batch-norm training goes to cuDNN, whose backward may vary, unless
// deterministic mode is on: see the batch norm section). The pooling backwards and the index adds
// gather instead of scatter: each output element is owned by one thread that adds its
// contributions in the CPU's order.
// Row kernels (softmax, layer norm, cross-entropy) give a row to one warp when it has at most
// kWarpRow elements and to a block of kThreads otherwise; statistics combine in f64 as on the CPU.
#include <cub/cub.cuh>

#include <algorithm>
#include <bit>
#include <climits>
#include <cstring>
#include <limits>

#include "kernels/common/pool_window.h"
#include "kernels/cuda/context.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/ops_cuda.h"

namespace kiln::cuda {
namespace {

constexpr int64_t kWarpRow = 1024;  // longest row a single warp owns (32 elements per lane)

template <typename Fn> void dispatch_nn(DType dt, const char* op, Fn&& fn) {
  switch (dt) {
    case DType::f32: return fn(float{});
    case DType::f64: return fn(double{});
    default: KILN_FAIL("cuda ", op, ": dtype ", dt, " is not supported (f32, f64)");
  }
}
template <typename Fn> void dispatch_floating(DType dt, const char* op, Fn&& fn) {
  switch (dt) {
    case DType::f32: return fn(float{});
    case DType::f64: return fn(double{});
    case DType::f16: return fn(Half{});
    case DType::bf16: return fn(BFloat16{});
    default: KILN_FAIL("cuda ", op, ": dtype ", dt, " is not supported (f32, f64, f16, bf16)");
  }
}

template <typename T> const T* cp(const void* p) { return static_cast<const T*>(p); }
template <typename T> T* mp(void* p) { return static_cast<T*>(p); }

template <typename T> __device__ __forceinline__ T dexp(T v) {
  if constexpr (std::is_same_v<T, float>) return expf(v);
  else return ::exp(v);
}
template <typename T> constexpr T kNegInf = -std::numeric_limits<T>::infinity();

// ---- row groups: a warp or a whole block reduces one row ------------------------------------------

// Rank of the thread in its row group, the group's size, the first row and the row step of a
// grid-stride loop over rows.
template <bool kBlock> struct RowGroup {
  __device__ static int rank() { return kBlock ? int(threadIdx.x) : int(threadIdx.x & 31); }
  __device__ static int size() { return kBlock ? int(blockDim.x) : 32; }
  __device__ static int64_t first() {
    return kBlock ? int64_t(blockIdx.x) : int64_t(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  }
  __device__ static int64_t step() { return kBlock ? int64_t(gridDim.x) : int64_t(gridDim.x) * (blockDim.x >> 5); }
};

template <bool kBlock, typename A> __device__ __forceinline__ A group_sum(A v, A* smem) {
  if constexpr (kBlock) return block_sum(v, smem);
  else return warp_sum(v);
}

// Online softmax state: the running maximum m and s = sum of exp(x - m). -inf entries add nothing
// (also while m is still -inf, where x - m would be NaN); a NaN entry makes s NaN for good.
template <typename A> struct MaxSum {
  A m, s;
};
template <typename A> __device__ __forceinline__ void ms_add(MaxSum<A>& a, A x) {
  if (x > a.m) {
    a.s = a.s * dexp(a.m - x) + A(1);
    a.m = x;
  } else if (x != kNegInf<A>) {
    a.s += dexp(x - a.m);
  }
}
template <typename A> __device__ __forceinline__ MaxSum<A> ms_merge(MaxSum<A> a, MaxSum<A> b) {
  const A m = a.m > b.m ? a.m : b.m;
  const A sa = a.s == A(0) ? A(0) : a.s * dexp(a.m - m);
  const A sb = b.s == A(0) ? A(0) : b.s * dexp(b.m - m);
  return {m, sa + sb};
}
template <typename A> __device__ __forceinline__ MaxSum<A> warp_merge(MaxSum<A> v) {
  for (int o = 16; o > 0; o >>= 1)
    v = ms_merge(v, MaxSum<A>{__shfl_xor_sync(0xffffffffu, v.m, o), __shfl_xor_sync(0xffffffffu, v.s, o)});
  return v;
}
// Every thread of the group gets the merged state. `smem` holds 32 states (block groups only).
template <bool kBlock, typename A> __device__ MaxSum<A> group_merge(MaxSum<A> v, MaxSum<A>* smem) {
  v = warp_merge(v);
  if constexpr (kBlock) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    __syncthreads();  // smem may still be read by a previous call
    if (lane == 0) smem[warp] = v;
    __syncthreads();
    v = warp_merge(lane < nwarps ? smem[lane] : MaxSum<A>{kNegInf<A>, A(0)});
  }
  return v;
}

// Launches `warp` (a warp per row) for rows of at most kWarpRow elements, else `block` (a block of
// kThreads per row): the two instantiations of one row kernel.
template <typename... P, typename... A>
void launch_rows(void (*warp)(P...), void (*block)(P...), const char* name, int64_t rows, int64_t len,
                 cudaStream_t s, A... args) {
  if (len <= kWarpRow) warp<<<grid_for(rows * 32), kThreads, 0, s>>>(args...);
  else block<<<grid_for(rows * kThreads), kThreads, 0, s>>>(args...);
  KILN_LAUNCH_OK(name);
}

// ---- pooling ---------------------------------------------------------------------------------------

// Outputs [lo, hi) along one axis whose windows may contain input position i (a superset for fixed
// windows; exact for adaptive ones). Backward kernels then test membership exactly.
__device__ __forceinline__ void candidates(int64_t i, int64_t in, int64_t out, int64_t k, int64_t s, int64_t pad,
                                           int64_t dil, bool adaptive, int64_t& lo, int64_t& hi) {
  if (adaptive) {
    lo = (i * out) / in;
    hi = min(out, ((i + 1) * out + in - 1) / in);
    return;
  }
  const int64_t a = i + pad - (k - 1) * dil;
  lo = a <= 0 ? 0 : (a + s - 1) / s;
  hi = min(out, (i + pad) / s + 1);
}

// Max pool forward. Launch: grid_for(planes*oh*ow) blocks of kThreads, grid-stride; a thread owns
// one output (adjacent threads adjacent ow). Traffic: each window read (cached across neighbours),
// one T and one i64 written per output. NaN handling and tie order are the CPU's loop, verbatim.
template <typename T>
__global__ void __launch_bounds__(kThreads) max_pool_fwd_kernel(Pool2dParams p, const T* x, T* y, int64_t* idx) {
  const int64_t total = p.planes * p.oh * p.ow;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t ow = e % p.ow, t = e / p.ow, oh = t % p.oh, pl = t / p.oh;
    const PoolWindow w = pool_window(p, oh, ow);
    const T* img = x + pl * p.h * p.w;
    T best = kNegInf<T>;
    int64_t bi = -1;
    for (int64_t ih = w.h0; ih < w.h1; ih += w.step_h) {
      if (ih < 0) continue;
      for (int64_t iw = w.w0; iw < w.w1; iw += w.step_w) {
        if (iw < 0) continue;
        const T v = img[ih * p.w + iw];
        if (bi < 0 || v > best || v != v) {
          best = v;
          bi = ih * p.w + iw;
          if (v != v) break;  // leaves this row only, as the CPU does
        }
      }
    }
    y[e] = best;
    idx[e] = bi;
  }
}

// Max pool backward as a gather. Launch: grid_for(planes*h*w) blocks of kThreads, grid-stride; a
// thread owns one input element and adds gy of every candidate output whose index names it, in
// output order (the CPU's scatter order, so the same bits). An index outside [0, h*w) is flagged,
// except -1: the forward's mark of a window with no position inside the image (dilated windows
// with padding can miss it), which the CPU skips too. Traffic: per input element about
// (kh/sh)*(kw/sw) candidate (i64 + T) reads, mostly cache hits; one T written.
template <typename T>
__global__ void __launch_bounds__(kThreads) max_pool_bwd_kernel(Pool2dParams p, const T* gy, const int64_t* idx,
                                                                T* gx, int* err) {
  const int64_t plane = p.h * p.w, total = p.planes * plane;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t iw = e % p.w, t = e / p.w, ih = t % p.h, pl = t / p.h, me = ih * p.w + iw;
    int64_t oh0, oh1, ow0, ow1;
    candidates(ih, p.h, p.oh, p.kh, p.sh, p.ph, p.dh, p.adaptive, oh0, oh1);
    candidates(iw, p.w, p.ow, p.kw, p.sw, p.pw, p.dw, p.adaptive, ow0, ow1);
    const int64_t* ip = idx + pl * p.oh * p.ow;
    const T* gp = gy + pl * p.oh * p.ow;
    T acc = T(0);
    for (int64_t oh = oh0; oh < oh1; ++oh)
      for (int64_t ow = ow0; ow < ow1; ++ow) {
        const int64_t k = ip[oh * p.ow + ow];
        if (k == me) acc += gp[oh * p.ow + ow];
        else if (k >= plane || k < -1) flag_error(err, KernelError::max_pool_index);
      }
    gx[e] = acc;
  }
}

// Average pool forward. Launch and ownership as max_pool_fwd_kernel; sums in f64 like the CPU.
// Traffic: each window read (cached across neighbours), one T written per output.
template <typename T>
__global__ void __launch_bounds__(kThreads) avg_pool_fwd_kernel(Pool2dParams p, const T* x, T* y) {
  const int64_t total = p.planes * p.oh * p.ow;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t ow = e % p.ow, t = e / p.ow, oh = t % p.oh, pl = t / p.oh;
    const PoolWindow w = pool_window(p, oh, ow);
    const T* img = x + pl * p.h * p.w;
    double acc = 0;
    for (int64_t ih = max(w.h0, int64_t(0)); ih < w.h1; ih += w.step_h)
      for (int64_t iw = max(w.w0, int64_t(0)); iw < w.w1; iw += w.step_w) acc += double(img[ih * p.w + iw]);
    y[e] = T(w.count > 0 ? acc / double(w.count) : 0.0);
  }
}

// Average pool backward as a gather. Launch and ownership as max_pool_bwd_kernel: a thread adds
// gy / count of every output whose window visits its element, in output order (the CPU's bits).
// Traffic: one T read per candidate output (cached), one T written.
template <typename T>
__global__ void __launch_bounds__(kThreads) avg_pool_bwd_kernel(Pool2dParams p, const T* gy, T* gx) {
  const int64_t total = p.planes * p.h * p.w;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t iw = e % p.w, t = e / p.w, ih = t % p.h, pl = t / p.h;
    int64_t oh0, oh1, ow0, ow1;
    candidates(ih, p.h, p.oh, p.kh, p.sh, p.ph, p.dh, p.adaptive, oh0, oh1);
    candidates(iw, p.w, p.ow, p.kw, p.sw, p.pw, p.dw, p.adaptive, ow0, ow1);
    const T* gp = gy + pl * p.oh * p.ow;
    T acc = T(0);
    for (int64_t oh = oh0; oh < oh1; ++oh)
      for (int64_t ow = ow0; ow < ow1; ++ow) {
        const PoolWindow w = pool_window(p, oh, ow);
        if (w.count <= 0) continue;
        const int64_t hb = max(w.h0, int64_t(0)), wb = max(w.w0, int64_t(0));
        if (ih < hb || ih >= w.h1 || (ih - hb) % w.step_h != 0) continue;
        if (iw < wb || iw >= w.w1 || (iw - wb) % w.step_w != 0) continue;
        acc += gp[oh * p.ow + ow] / T(w.count);
      }
    gx[e] = acc;
  }
}

// ---- softmax ---------------------------------------------------------------------------------------

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
    if (!isfinite(m)) {  // the same for the whole group
      m = T(0);
      T t = T(0);
      for (int64_t i = G::rank(); i < n; i += G::size()) t += dexp(xr[i]);
      s = group_sum<kBlock>(t, sred);
    }
    if (log) {
      const T lse = T(::log(double(s))) + m;
      for (int64_t i = G::rank(); i < n; i += G::size()) yr[i] = xr[i] - lse;
    } else {
      const T inv = T(1.0 / double(s));
      for (int64_t i = G::rank(); i < n; i += G::size()) yr[i] = dexp(xr[i] - m) * inv;
    }
  }
}

// Softmax over the middle dim of [outer, n, inner], inner > 1. Launch: grid_for(tiles * kThreads)
// blocks of 256 = 32 columns x 8 row-slices, grid-stride over tiles (o, 32 consecutive j); thread
// (tx, ty) folds rows ty, ty + 8, ... of column j (a warp reads 32 consecutive elements), the 8
// slices merge through shared memory in slice order. Traffic: x read twice, y written once.
template <typename T>
__global__ void __launch_bounds__(kThreads) softmax_cols_kernel(bool log, int64_t outer, int64_t n, int64_t inner,
                                                                const T* x, T* y) {
  __shared__ MaxSum<T> red[8][32];
  __shared__ T sred[8][32];
  const int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;
  const int64_t col_tiles = (inner + 31) / 32, tiles = outer * col_tiles, step = 8 * inner;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t o = t / col_tiles, j = (t % col_tiles) * 32 + tx;
    // This thread's slice: rows ty, ty + 8, ... of column j; empty for a column past the edge.
    const int64_t first = o * n * inner + j + ty * inner, end = j < inner ? (o + 1) * n * inner : 0;
    MaxSum<T> ms{kNegInf<T>, T(0)};
    for (int64_t q = first; q < end; q += step) ms_add(ms, x[q]);
    red[ty][tx] = ms;
    __syncthreads();
    ms = red[0][tx];
#pragma unroll 1
    for (int k = 1; k < 8; ++k) ms = ms_merge(ms, red[k][tx]);
    T m = ms.m, s = ms.s;
    if (__syncthreads_or(j < inner && !isfinite(m))) {  // some column takes the CPU's max := 0 path
      T acc = T(0);
      for (int64_t q = first; q < end; q += step) acc += dexp(x[q]);
      sred[ty][tx] = acc;
      __syncthreads();
      if (!isfinite(m)) {
        m = T(0);
        s = sred[0][tx];
        for (int k = 1; k < 8; ++k) s += sred[k][tx];
      }
    }
    if (log) {
      const T lse = T(::log(double(s))) + m;
      for (int64_t q = first; q < end; q += step) y[q] = x[q] - lse;
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
// 8 slice sums (in T) combine in f64 in slice order. Traffic: y and gy read twice, gx written once.
template <typename T>
__global__ void __launch_bounds__(kThreads) softmax_bwd_cols_kernel(bool log, int64_t outer, int64_t n, int64_t inner,
                                                                    const T* y, const T* gy, T* gx) {
  __shared__ double sred[8][32];
  const int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;
  const int64_t col_tiles = (inner + 31) / 32, tiles = outer * col_tiles, step = 8 * inner;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t o = t / col_tiles, j = (t % col_tiles) * 32 + tx;
    const int64_t first = o * n * inner + j + ty * inner, end = j < inner ? (o + 1) * n * inner : 0;
    T acc = T(0);
    for (int64_t q = first; q < end; q += step) acc += log ? gy[q] : gy[q] * y[q];
    sred[ty][tx] = double(acc);
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
    const int64_t mstep = mr.step;
    auto z = [&](int64_t i) { return mrow ? xr[i] * scale + mrow[i * mstep] : xr[i] * scale; };
    MaxSum<T> ms{kNegInf<T>, T(0)};
    for (int64_t i = G::rank(); i < n; i += G::size()) ms_add(ms, z(i));
    ms = group_merge<kBlock>(ms, red);
    T m = ms.m, s = ms.s;
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

// ---- layer norm ------------------------------------------------------------------------------------

// Layer norm forward. Launch: launch_rows over rows of length d; lane r owns elements r,
// r + group, ... Two passes like the CPU: mean, then the sum of squared deviations from it (no
// cancellation), per-thread in T and across the group in f64; a third pass writes y.
// Traffic: x read three times (twice from cache), y written once, mean and rstd once per row.
template <typename T, bool kBlock>
__global__ void __launch_bounds__(kThreads) layer_norm_fwd_kernel(int64_t rows, int64_t d, double eps, const T* x,
                                                                  const T* gamma, const T* beta, T* y, T* mean,
                                                                  T* rstd) {
  using G = RowGroup<kBlock>;
  __shared__ double sred[32];
  const double dd = double(d > 0 ? d : 1);
  for (int64_t r = G::first(); r < rows; r += G::step()) {
    const T* xr = x + r * d;
    T acc = T(0);
    for (int64_t i = G::rank(); i < d; i += G::size()) acc += xr[i];
    const double m = group_sum<kBlock>(double(acc), sred) / dd;
    const T mf = T(m);
    acc = T(0);
    for (int64_t i = G::rank(); i < d; i += G::size()) {
      const T t = xr[i] - mf;
      acc += t * t;
    }
    const double v = group_sum<kBlock>(double(acc), sred) / dd;
    const double rs = 1.0 / ::sqrt(v + eps);
    const T rsf = T(rs);
    T* yr = y + r * d;
    for (int64_t i = G::rank(); i < d; i += G::size()) {
      T h = (xr[i] - mf) * rsf;
      if (gamma) h *= gamma[i];
      if (beta) h += beta[i];
      yr[i] = h;
    }
    if (G::rank() == 0) {
      mean[r] = T(m);
      rstd[r] = T(rs);
    }
  }
}

// Layer norm backward, gx. Launch: launch_rows; lane r owns elements r, r + group, ...
// gx = rstd * (gh - mean(gh) - xhat * mean(gh * xhat)), gh = gy * gamma.
// Traffic: x, gy (and gamma) read twice (second time cached), gx written once.
template <typename T, bool kBlock>
__global__ void __launch_bounds__(kThreads) layer_norm_bwd_kernel(int64_t rows, int64_t d, const T* x,
                                                                  const T* gamma, const T* mean, const T* rstd,
                                                                  const T* gy, T* gx) {
  using G = RowGroup<kBlock>;
  __shared__ double sred[32];
  for (int64_t r = G::first(); r < rows; r += G::step()) {
    const T* xr = x + r * d;
    const T* g = gy + r * d;
    const T m = mean[r], rs = rstd[r];
    T a1 = T(0), a2 = T(0);
    for (int64_t i = G::rank(); i < d; i += G::size()) {
      const T h = gamma ? g[i] * gamma[i] : g[i];
      a1 += h;
      a2 += h * ((xr[i] - m) * rs);
    }
    const T s1 = T(group_sum<kBlock>(double(a1), sred) / double(d));
    const T s2 = T(group_sum<kBlock>(double(a2), sred) / double(d));
    T* o = gx + r * d;
    for (int64_t i = G::rank(); i < d; i += G::size()) {
      const T h = gamma ? g[i] * gamma[i] : g[i];
      o[i] = rs * (h - s1 - (xr[i] - m) * rs * s2);
    }
  }
}

constexpr int64_t kLnChunkMin = 64;    // rows per partial-sum chunk, at least
constexpr int64_t kLnMaxChunks = 256;  // chunks per column, at most (bounds the partial buffer)

// Layer norm backward, ggamma/gbeta partial sums. Launch: grid (ceil(d/32), chunks), 256 threads =
// 32 columns x 8 row-slices; thread (tx, ty) sums rows chunk_start + ty, + 8, ... of column j in
// f64 (as the CPU); the 8 slices add up in slice order into partial[chunk][j] (gamma) and
// partial[chunks + chunk][j] (beta). The chunking depends on the shape only, so the bits never vary.
// Traffic: x and gy read once (coalesced along j), mean/rstd once per row per column tile.
template <typename T>
__global__ void __launch_bounds__(kThreads) layer_norm_param_partial_kernel(int64_t rows, int64_t d, int64_t chunk,
                                                                            const T* x, const T* mean,
                                                                            const T* rstd, const T* gy,
                                                                            double* partial) {
  __shared__ double sg[8][32], sb[8][32];
  const int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;
  const int64_t j = int64_t(blockIdx.x) * 32 + tx;
  const int64_t r0 = int64_t(blockIdx.y) * chunk, r1 = min(rows, r0 + chunk);
  double ag = 0, ab = 0;
  if (j < d)
    for (int64_t r = r0 + ty; r < r1; r += 8) {
      const double g = double(gy[r * d + j]);
      ag += g * (double(x[r * d + j]) - double(mean[r])) * double(rstd[r]);
      ab += g;
    }
  sg[ty][tx] = ag;
  sb[ty][tx] = ab;
  __syncthreads();
  if (ty == 0 && j < d) {
    for (int k = 1; k < 8; ++k) {
      ag += sg[k][tx];
      ab += sb[k][tx];
    }
    partial[int64_t(blockIdx.y) * d + j] = ag;
    partial[(int64_t(gridDim.y) + blockIdx.y) * d + j] = ab;
  }
}

// Sums the chunk partials of each column in chunk order. Launch: grid_for(d), a thread per column;
// reads chunks x 2 doubles per column (coalesced), writes ggamma/gbeta where non-null.
template <typename T>
__global__ void __launch_bounds__(kThreads) layer_norm_param_finish_kernel(int64_t d, int64_t chunks,
                                                                           const double* partial, T* ggamma,
                                                                           T* gbeta) {
  for (int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < d; j += int64_t(gridDim.x) * blockDim.x) {
    double sg = 0, sb = 0;
    for (int64_t k = 0; k < chunks; ++k) {
      sg += partial[k * d + j];
      sb += partial[(chunks + k) * d + j];
    }
    if (ggamma) ggamma[j] = T(sg);
    if (gbeta) gbeta[j] = T(sb);
  }
}

// ---- batch norm ------------------------------------------------------------------------------------
//
// Why cuDNN for the training path by default: BN reduces each channel over N*H*W with only
// 64..2048 channels, so filling the GPU needs every channel split across many blocks and combined,
// a pass for the statistics and one for y, and in backward a fused pass for the two sums and gx.
// cuDNN ships that, tuned per architecture, and ResNet spends a real share of its step in it. Its
// conventions match the CPU's: exponentialAverageFactor = momentum (running = (1-m)*running +
// m*batch), the running variance takes the unbiased batch variance, and the saved inverse variance
// is 1/sqrt(biased var + eps), our rstd. But cudnnBatchNormalizationBackward is not guaranteed
// reproducible, and its one-pass variance loses digits on near-constant channels; so in
// deterministic mode (cuda::deterministic()) training uses the handwritten kernels below, with the
// CPU's two-pass formulas and sums in a fixed order.
//
// The handwritten path splits each channel's n*hw values into fixed chunks (bn_chunking: the
// split depends on the shape only), reduces a chunk per block into an f64 partial, sums the
// partials of a channel in chunk order, then applies a per-channel affine map. Eval forward is
// that affine map alone; every backward that cuDNN does not take (eval mode, training without gx,
// deterministic mode) is partials + finish + apply.

constexpr int64_t kBnChunkMin = 8192;  // values of a channel per block, at least (32 per thread)
constexpr int64_t kBnMaxChunks = 256;  // chunks per channel, at most (gridDim.y, partial buffer size)

struct BnChunking {
  int64_t chunk, chunks;
};
inline BnChunking bn_chunking(int64_t c, int64_t count) {
  KILN_CHECK(c <= INT_MAX, "cuda batch_norm: at most 2^31-1 channels, got ", c);
  const int64_t chunk = std::max(kBnChunkMin, (count + kBnMaxChunks - 1) / kBnMaxChunks);
  return {chunk, std::max<int64_t>(1, (count + chunk - 1) / chunk)};
}

// Bytes of one per-channel slot in a scratch buffer: c values rounded up to 256 bytes, so that every
// slot cuDNN reads starts aligned.
inline size_t bn_slot_bytes(int64_t c, size_t elem) { return (size_t(c) * elem + 255) / 256 * 256; }

struct BnTensor {
  cudnnTensorDescriptor_t d = nullptr;
  // [n, c, h, 1] in NCHW, or in NHWC (memory [n, h, c]) when nhwc.
  BnTensor(cudnnDataType_t t, int64_t n, int64_t c, int64_t h, bool nhwc = false) {
    KILN_CUDNN_OK(cudnnCreateTensorDescriptor(&d));
    const cudnnStatus_t s = cudnnSetTensor4dDescriptor(d, nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW, t, int(n),
                                                       int(c), int(h), 1);
    if (s != CUDNN_STATUS_SUCCESS) cudnnDestroyTensorDescriptor(d);
    KILN_CUDNN_OK(s);
  }
  ~BnTensor() { cudnnDestroyTensorDescriptor(d); }
  BnTensor(const BnTensor&) = delete;
  BnTensor& operator=(const BnTensor&) = delete;
};

void check_cudnn_bn(int64_t n, int64_t c, int64_t hw, double eps) {
  KILN_CHECK(n * c * hw <= INT_MAX, "cuda batch_norm: cuDNN takes at most 2^31-1 elements, got [", n, ", ", c,
             ", ", hw, "]");
  KILN_CHECK(eps >= CUDNN_BN_MIN_EPSILON, "cuda batch_norm: eps ", eps, " is below cuDNN's minimum ",
             CUDNN_BN_MIN_EPSILON);
}

// Writes v to n elements. Launch: grid_for(n); one T written per element.
template <typename T> __global__ void __launch_bounds__(kThreads) fill_kernel(int64_t n, T v, T* p) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = v;
}

// Value q of a channel's n*hw values is at image i = q / hw, offset j = q % hw; steps q by a fixed
// stride with one compare instead of a 64-bit division per step.
struct BnWalk {
  int64_t i, j, di, dj;
  __device__ BnWalk(int64_t q, int64_t stride, int64_t hw)
      : i(q / hw), j(q - (q / hw) * hw), di(stride / hw), dj(stride - (stride / hw) * hw) {}
  __device__ void next(int64_t hw) {
    i += di;
    j += dj;
    if (j >= hw) {
      j -= hw;
      ++i;
    }
  }
};

enum class BnSum : int {
  x,        // sum x                                 (forward, pass 1)
  dev2,     // sum (x - mean)^2                      (forward, pass 2: no cancellation)
  grad,     // sum gy and sum gy * (x - mean)        (backward)
};

// Partial sums of one chunk of one channel. Launch: grid (c, chunks) blocks of kThreads; block
// (ch, k) owns values [k*chunk, min((k+1)*chunk, n*hw)) of channel ch, thread t the values t,
// t + kThreads, ... of it (a warp reads 32 consecutive elements of an image row, split only where
// an image's hw values end). Per-thread sums in T as the CPU's lanes, the block tree in f64; thread 0
// writes partial[ch*chunks + k] (and, for grad, the second sum at partial[(c + ch)*chunks + k]).
// mean is read as T, the CPU's mf. Traffic: x (and gy) read once; 8 or 16 bytes written per block.
template <typename T, BnSum kSum>
__global__ void __launch_bounds__(kThreads) bn_partial_kernel(int64_t n, int64_t c, int64_t hw, int64_t chunk,
                                                              const T* x, const T* gy, const T* mean,
                                                              double* partial) {
  __shared__ double sred[32];
  const int64_t ch = blockIdx.x, k = blockIdx.y, chunks = gridDim.y;
  const int64_t q1 = min(n * hw, (k + 1) * chunk);
  const T mf = kSum == BnSum::x ? T(0) : mean[ch];
  T a = T(0), b = T(0);
  BnWalk w(k * chunk + threadIdx.x, blockDim.x, hw);
  for (int64_t q = k * chunk + threadIdx.x; q < q1; q += blockDim.x, w.next(hw)) {
    const int64_t off = (w.i * c + ch) * hw + w.j;
    if constexpr (kSum == BnSum::x) {
      a += x[off];
    } else if constexpr (kSum == BnSum::dev2) {
      const T d = x[off] - mf;
      a += d * d;
    } else {
      const T g = gy[off];
      a += g;
      b += g * (x[off] - mf);
    }
  }
  const double ta = block_sum(double(a), sred);
  if constexpr (kSum == BnSum::grad) {
    const double tb = block_sum(double(b), sred);
    if (threadIdx.x == 0) partial[(c + ch) * chunks + k] = tb;
  }
  if (threadIdx.x == 0) partial[ch * chunks + k] = ta;
}

// Forward, between the two passes: mean[ch] = (sum of the channel's partials, in chunk order) / count.
// Launch: grid_for(c), a thread per channel. Traffic: chunks doubles read, one T written per channel.
template <typename T>
__global__ void __launch_bounds__(kThreads) bn_mean_kernel(int64_t c, int64_t chunks, int64_t count,
                                                           const double* partial, T* mean) {
  for (int64_t ch = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; ch < c; ch += int64_t(gridDim.x) * blockDim.x) {
    double s = 0;
    for (int64_t k = 0; k < chunks; ++k) s += partial[ch * chunks + k];
    mean[ch] = T(s / double(count));
  }
}

// Channel ch's saved statistics and its affine map y = x * sc + sh (sc = rstd * gamma,
// sh = beta - mean * sc), in f64 as on the CPU, into mean, rstd and affine [2, c].
template <typename T>
__device__ void bn_write_stats(int64_t ch, int64_t c, double m, double rs, const T* gamma, const T* beta, T* mean,
                               T* rstd, T* affine) {
  mean[ch] = T(m);
  rstd[ch] = T(rs);
  const T sc = T(rs * (gamma ? double(gamma[ch]) : 1.0));
  affine[ch] = sc;
  affine[c + ch] = T((beta ? double(beta[ch]) : 0.0) - m * double(sc));
}

// Forward, training, after both passes: the CPU's per-channel arithmetic in f64. m and the sum of
// squared deviations q from the partials (in chunk order; m the same bits as bn_mean_kernel's),
// the running buffers updated with momentum (unbiased variance), mean, rstd and the affine pair
// (sc, sh) into `affine` [2, c]. Launch: grid_for(c), a thread per channel. Traffic per channel:
// 2*chunks doubles and up to 4 T read; up to 6 T written.
template <typename T>
__global__ void __launch_bounds__(kThreads) bn_stats_finish_kernel(int64_t c, int64_t chunks, int64_t count,
                                                                   double eps, double momentum, const double* partial,
                                                                   const T* gamma, const T* beta, T* rmean, T* rvar,
                                                                   T* mean, T* rstd, T* affine) {
  for (int64_t ch = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; ch < c; ch += int64_t(gridDim.x) * blockDim.x) {
    double s = 0, q = 0;
    for (int64_t k = 0; k < chunks; ++k) s += partial[ch * chunks + k];
    for (int64_t k = 0; k < chunks; ++k) q += partial[(c + ch) * chunks + k];
    const double m = s / double(count), v = q / double(count);
    if (rmean) rmean[ch] = T((1 - momentum) * double(rmean[ch]) + momentum * m);
    if (rvar) {
      const double unbiased = count > 1 ? q / double(count - 1) : v;
      rvar[ch] = T((1 - momentum) * double(rvar[ch]) + momentum * unbiased);
    }
    bn_write_stats(ch, c, m, 1.0 / ::sqrt(v + eps), gamma, beta, mean, rstd, affine);
  }
}

// Eval forward, per channel: mean/rstd from the running buffers and the affine map y = x*sc + sh,
// computed in f64 as on the CPU. Launch: grid_for(c), a thread per channel. Traffic per channel:
// up to 4 T read; mean, rstd and the (sc, sh) pair into `affine` [2, c] written.
template <typename T>
__global__ void __launch_bounds__(kThreads) bn_eval_prepare_kernel(int64_t c, double eps, const T* gamma,
                                                                   const T* beta, const T* rmean, const T* rvar,
                                                                   T* mean, T* rstd, T* affine) {
  for (int64_t ch = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; ch < c; ch += int64_t(gridDim.x) * blockDim.x) {
    bn_write_stats(ch, c, double(rmean[ch]), 1.0 / ::sqrt(double(rvar[ch]) + eps), gamma, beta, mean, rstd, affine);
  }
}

// Forward (eval, and training in deterministic mode), elementwise: y = x*sc + sh with the pair of
// `affine` [2, c]. Launch: grid_for(n*c*hw), grid-stride; a thread per element.
// Traffic: one T read and one written per element (sc/sh are cache hits).
template <typename T>
__global__ void __launch_bounds__(kThreads) bn_apply_kernel(int64_t total, int64_t c, int64_t hw, const T* x,
                                                            const T* affine, T* y) {
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t ch = (e / hw) % c;
    y[e] = x[e] * affine[ch] + affine[c + ch];
  }
}

// Backward, per channel, after bn_partial_kernel<grad> (or with chunks == 0 when no sum is needed:
// eval mode without ggamma/gbeta): sg = sum gy and sgd = sum gy*(x - mean) in chunk order, then
// the CPU's arithmetic in f64: ggamma = sgd*rstd, gbeta = sg where non-null, and the coefficients
// of gx = k1*gy + k2*x + k3 into coef [3, c] where non-null (eval: k2 = k3 = 0, still applied, so
// that an inf/NaN in x propagates exactly as on the CPU). Launch: grid_for(c), a thread per
// channel. Traffic per channel: 2*chunks doubles and 3 T read, up to 5 T written.
template <typename T>
__global__ void __launch_bounds__(kThreads) bn_backward_finish_kernel(int64_t c, int64_t chunks, int64_t count,
                                                                      bool training, const double* partial,
                                                                      const T* gamma, const T* mean, const T* rstd,
                                                                      T* ggamma, T* gbeta, T* coef) {
  for (int64_t ch = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; ch < c; ch += int64_t(gridDim.x) * blockDim.x) {
    double sg = 0, sgd = 0;
    for (int64_t k = 0; k < chunks; ++k) sg += partial[ch * chunks + k];
    for (int64_t k = 0; k < chunks; ++k) sgd += partial[(c + ch) * chunks + k];
    const double rs = double(rstd[ch]), sgx = sgd * rs;
    if (ggamma) ggamma[ch] = T(sgx);
    if (gbeta) gbeta[ch] = T(sg);
    if (!coef) continue;
    const double m = double(mean[ch]), gm = gamma ? double(gamma[ch]) : 1.0;
    const double cnt = double(count > 1 ? count : 1);
    const double k1 = gm * rs;
    const double k2 = training ? -gm * rs * rs * sgx / cnt : 0.0;
    const double k3 = training ? -gm * rs * sg / cnt - k2 * m : 0.0;
    coef[ch] = T(k1);
    coef[c + ch] = T(k2);
    coef[2 * c + ch] = T(k3);
  }
}

// Backward, elementwise: gx = k1*gy + k2*x + k3 with the coefficients of coef [3, c]. Launch:
// grid_for(n*c*hw), grid-stride; a thread per element. Traffic: x and gy read once, gx written once.
template <typename T>
__global__ void __launch_bounds__(kThreads) bn_backward_apply_kernel(int64_t total, int64_t c, int64_t hw,
                                                                     const T* x, const T* gy, const T* coef, T* gx) {
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t ch = (e / hw) % c;
    gx[e] = coef[ch] * gy[e] + coef[c + ch] * x[e] + coef[2 * c + ch];
  }
}

// ---- cross-entropy -----------------------------------------------------------------------------------

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
    MaxSum<T> ms{kNegInf<T>, T(0)};
    T sx = T(0);
    for (int64_t i = G::rank(); i < classes; i += G::size()) {
      const T v = x[i];
      ms_add(ms, v);
      sx += v;
    }
    ms = group_merge<kBlock>(ms, red);
    const double sum_x = group_sum<kBlock>(double(sx), sred);
    const double lse = isfinite(ms.m) ? ::log(double(ms.s)) + double(ms.m) : std::numeric_limits<double>::quiet_NaN();
    const double dc = double(classes);
    if (G::rank() == 0) {
      const double nll = lse - double(x[t]);
      // The smoothing term only when asked for: with a -inf logit sum_x is -inf, and 0 * inf is NaN.
      loss[r] = T(eps != 0 ? (1 - eps) * nll + eps * (lse - sum_x / dc) : nll);
    }
    if (g) {
      if constexpr (std::is_same_v<T, float>) {  // the CPU's f32 row: f32 terms, the target's in f64
        const float lse_f = float(lse), sc = float(grad_scale), off = float(grad_scale * eps / dc);
        for (int64_t i = G::rank(); i < classes; i += G::size())
          g[i] = i == t ? float(grad_scale * (::exp(double(x[t]) - lse) - (1 - eps) - eps / dc))
                        : sc * expf(x[i] - lse_f) - off;
      } else {
        // The target distribution's two values, hoisted (and the loop kept rolled: unrolled, the
        // f64 kernel spilled on sm_90).
        const double on = (1 - eps) + eps / dc, off = eps / dc;
#pragma unroll 1
        for (int64_t i = G::rank(); i < classes; i += G::size())
          g[i] = T(grad_scale * (::exp(double(x[i]) - lse) - (i == t ? on : off)));
      }
    }
  }
}

// ---- index kernels -----------------------------------------------------------------------------------

// index_select as a copy of U-sized units (U up to 16 bytes when rows and pointers allow).
// Launch: grid_for(outer*n_idx*units), grid-stride; a thread moves one unit (a warp 32 consecutive
// units of a row: coalesced). Traffic: one unit read and written, one cached i64 index per unit.
template <typename U>
__global__ void __launch_bounds__(kThreads) index_select_kernel(int64_t rows, int64_t n_idx, int64_t n_src,
                                                                int64_t units, const U* src, const int64_t* idx,
                                                                U* dst, int* err) {
  const int64_t total = rows * units;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = e / units, col = e - row * units, o = row / n_idx, i = row - o * n_idx;
    const int64_t k = idx[i];
    U v{};
    if (k >= 0 && k < n_src) v = src[(o * n_src + k) * units + col];
    else if (col == 0) flag_error(err, KernelError::index_select);
    dst[e] = v;
  }
}

// gather with a full index tensor. Launch: grid_for(outer*n_idx*inner); a thread per element.
// Traffic: one i64 index and one element read (the element at an arbitrary row), one written.
template <typename U>
__global__ void __launch_bounds__(kThreads) gather_kernel(int64_t outer, int64_t n_src, int64_t n_idx, int64_t inner,
                                                          const U* src, const int64_t* idx, U* dst, int* err) {
  const int64_t total = outer * n_idx * inner;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = e % inner, o = e / (n_idx * inner), k = idx[e];
    U v{};
    if (k >= 0 && k < n_src) v = src[(o * n_src + k) * inner + j];
    else flag_error(err, KernelError::gather);
    dst[e] = v;
  }
}

// index_add step 1: sort keys (an out-of-range index becomes n_dst, flagged, and sorts last) and
// positions. Launch: grid_for(n_idx); a thread per index. Traffic: 8 bytes read, 16 written per index.
__global__ void __launch_bounds__(kThreads) index_add_keys_kernel(int64_t n_idx, int64_t n_dst, const int64_t* idx,
                                                                  uint64_t* keys, int64_t* pos, int* err) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n_idx; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t k = idx[i];
    const bool ok = k >= 0 && k < n_dst;
    if (!ok) flag_error(err, KernelError::index_add);
    keys[i] = uint64_t(ok ? k : n_dst);
    pos[i] = i;
  }
}

// index_add works on the sorted slots in fixed chunks of kRunChunk: a run of equal keys longer than
// a chunk is summed chunk by chunk in parallel, and the chunk sums are added in chunk order, so a
// run of 500k padding tokens costs ~2k serial adds instead of 500k, and the bits depend on the
// indices only.
constexpr int64_t kRunChunk = 256;

// index_add step 3, after a stable radix sort of (key, position). Launch: grid_for(outer*n_idx*inner);
// thread (o, s, j) does work only when sorted slot s starts a segment: a stretch of equal keys
// within one chunk of kRunChunk slots (it starts at a new key or at the chunk's first slot). It adds
// the segment's source rows in position order (the CPU's order) in DAcc<T>. A segment that is its
// whole run (the run does not cross a chunk edge) starts from dst and stores onto dst[o, key, j]:
// the bits of a serial sum. A run that crosses chunk edges leaves its segment sums, each started
// from 0, for step 4: the first segment in lead[o, chunk, j], each later one in cont[o, chunk, j].
// Traffic: dst read and written once per short run's element, src read once (coalesced in j),
// sorted keys/positions cached, one DAcc<T> written per crossing segment.
template <typename T>
__global__ void __launch_bounds__(kThreads) index_add_runs_kernel(int64_t outer, int64_t n_dst, int64_t inner, T* dst,
                                                                  int64_t n_idx, const uint64_t* keys,
                                                                  const int64_t* pos, const T* src, DAcc<T>* lead,
                                                                  DAcc<T>* cont) {
  const int64_t total = outer * n_idx * inner, nch = (n_idx + kRunChunk - 1) / kRunChunk;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = e % inner, t = e / inner, s = t % n_idx, o = t / n_idx;
    const uint64_t k = keys[s];
    const int64_t ck = s / kRunChunk, end = min(n_idx, (ck + 1) * kRunChunk);
    const bool chunk_first = s == ck * kRunChunk;
    if (k >= uint64_t(n_dst) || (!chunk_first && keys[s - 1] == k)) continue;
    const bool from_prev = chunk_first && s > 0 && keys[s - 1] == k;
    const bool to_next = end < n_idx && keys[end] == k;  // keys are sorted: then [s, end] all hold k
    T* d = dst + (o * n_dst + int64_t(k)) * inner + j;
    const bool whole = !from_prev && !to_next;
    DAcc<T> acc = whole ? ld(d) : DAcc<T>(0);
    for (int64_t q = s; q < end && keys[q] == k; ++q) acc += ld(src + (o * n_idx + pos[q]) * inner + j);
    if (whole) st(d, acc);
    else (from_prev ? cont : lead)[(o * nch + ck) * inner + j] = acc;
  }
}

// index_add step 4: each run that crosses a chunk edge onto dst, its chunk sums in chunk order.
// Launch: grid_for(outer*chunks*inner); thread (o, ck, j) works only when chunk ck holds the first
// segment of a crossing run (its last slot's key continues into the next chunk and did not come
// from the previous one). It finds the run's last chunk by a binary search of the sorted keys and
// adds dst + lead[ck] + cont[ck+1] + ... + cont[last]. Traffic: per crossing run and column, one
// DAcc<T> read per chunk it spans (coalesced in j), dst read and written once; keys cached.
template <typename T>
__global__ void __launch_bounds__(kThreads) index_add_chunks_kernel(int64_t outer, int64_t n_dst, int64_t inner,
                                                                    T* dst, int64_t n_idx, const uint64_t* keys,
                                                                    const DAcc<T>* lead, const DAcc<T>* cont) {
  const int64_t nch = (n_idx + kRunChunk - 1) / kRunChunk, total = outer * nch * inner;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = e % inner, t = e / inner, ck = t % nch, o = t / nch;
    const int64_t first = ck * kRunChunk, end = first + kRunChunk;
    if (end >= n_idx) continue;  // the last chunk: nothing continues past it
    const uint64_t k = keys[end - 1];
    if (k >= uint64_t(n_dst) || keys[end] != k) continue;           // no run crosses this chunk's end
    if (first > 0 && keys[first] == k && keys[first - 1] == k) continue;  // a continuation, not a first segment
    int64_t lo = end, hi = n_idx;  // the run's end: the first slot after `end` whose key is not k
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (keys[mid] == k) lo = mid + 1;
      else hi = mid;
    }
    const int64_t last = (lo - 1) / kRunChunk;
    T* d = dst + (o * n_dst + int64_t(k)) * inner + j;
    DAcc<T> acc = ld(d) + lead[(o * nch + ck) * inner + j];
    for (int64_t u = ck + 1; u <= last; ++u) acc += cont[(o * nch + u) * inner + j];
    st(d, acc);
  }
}

// scatter_add as a gather: a thread owns dst[o, k, j] and scans all n_idx indices of column (o, j)
// in order, adding src where the index is k: O(n_dst * n_idx) index reads per column, traded for
// determinism without atomics or a sort per column. The k == 0 thread (one exists even when
// n_dst == 0) flags out-of-range indices. Launch: grid_for(outer*max(n_dst,1)*inner); adjacent
// threads adjacent j, so index and src reads coalesce. Traffic: dst read and written once.
template <typename T>
__global__ void __launch_bounds__(kThreads) scatter_add_kernel(int64_t outer, int64_t n_dst, int64_t inner, T* dst,
                                                               int64_t n_idx, const int64_t* idx, const T* src,
                                                               int* err) {
  const int64_t nk = n_dst > 0 ? n_dst : 1, total = outer * nk * inner;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = e % inner, t = e / inner, k = t % nk, o = t / nk;
    const int64_t* ic = idx + o * n_idx * inner + j;
    const T* sc = src + o * n_idx * inner + j;
    T* d = dst + (o * n_dst + k) * inner + j;
    DAcc<T> acc = k < n_dst ? ld(d) : DAcc<T>(0);
    for (int64_t i = 0; i < n_idx; ++i) {
      const int64_t v = ic[i * inner];
      if (v < 0 || v >= n_dst) {
        if (k == 0) flag_error(err, KernelError::scatter_add);
      } else if (v == k) {
        acc += ld(sc + i * inner);
      }
    }
    if (k < n_dst) st(d, acc);
  }
}

}  // namespace

// ---- pooling ---------------------------------------------------------------------------------------

void max_pool2d_forward(DType dt, const Pool2dParams& p, const void* x, void* y, int64_t* idx) {
  const int64_t total = p.planes * p.oh * p.ow;
  if (total == 0) return;
  dispatch_nn(dt, "max_pool2d", [&](auto tag) {
    using T = decltype(tag);
    max_pool_fwd_kernel<T><<<grid_for(total), kThreads, 0, current().stream>>>(p, cp<T>(x), mp<T>(y), idx);
    KILN_LAUNCH_OK("max_pool_fwd_kernel");
  });
}

void max_pool2d_backward(DType dt, const Pool2dParams& p, const void* gy, const int64_t* idx, void* gx) {
  const int64_t total = p.planes * p.h * p.w;
  if (total == 0) return;
  Context& ctx = current();
  dispatch_nn(dt, "max_pool2d", [&](auto tag) {
    using T = decltype(tag);
    max_pool_bwd_kernel<T><<<grid_for(total), kThreads, 0, ctx.stream>>>(p, cp<T>(gy), idx, mp<T>(gx), ctx.error_word);
    KILN_LAUNCH_OK("max_pool_bwd_kernel");
  });
}

void avg_pool2d_forward(DType dt, const Pool2dParams& p, const void* x, void* y) {
  const int64_t total = p.planes * p.oh * p.ow;
  if (total == 0) return;
  dispatch_nn(dt, "avg_pool2d", [&](auto tag) {
    using T = decltype(tag);
    avg_pool_fwd_kernel<T><<<grid_for(total), kThreads, 0, current().stream>>>(p, cp<T>(x), mp<T>(y));
    KILN_LAUNCH_OK("avg_pool_fwd_kernel");
  });
}

void avg_pool2d_backward(DType dt, const Pool2dParams& p, const void* gy, void* gx) {
  const int64_t total = p.planes * p.h * p.w;
  if (total == 0) return;
  dispatch_nn(dt, "avg_pool2d", [&](auto tag) {
    using T = decltype(tag);
    avg_pool_bwd_kernel<T><<<grid_for(total), kThreads, 0, current().stream>>>(p, cp<T>(gy), mp<T>(gx));
    KILN_LAUNCH_OK("avg_pool_bwd_kernel");
  });
}

// ---- softmax ---------------------------------------------------------------------------------------

void softmax_forward(DType dt, bool log, int64_t outer, int64_t n, int64_t inner, const void* x, void* y) {
  if (outer * n * inner == 0) return;
  const cudaStream_t s = current().stream;
  dispatch_nn(dt, "softmax", [&](auto tag) {
    using T = decltype(tag);
    if (inner == 1) {
      launch_rows(softmax_rows_kernel<T, false>, softmax_rows_kernel<T, true>, "softmax_rows_kernel", outer, n, s,
                  log, outer, n, cp<T>(x), mp<T>(y));
    } else {
      const int64_t tiles = outer * ((inner + 31) / 32);
      softmax_cols_kernel<T><<<grid_for(tiles * kThreads), kThreads, 0, s>>>(log, outer, n, inner, cp<T>(x), mp<T>(y));
      KILN_LAUNCH_OK("softmax_cols_kernel");
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
      const int64_t tiles = outer * ((inner + 31) / 32);
      softmax_bwd_cols_kernel<T><<<grid_for(tiles * kThreads), kThreads, 0, s>>>(log, outer, n, inner, cp<T>(y),
                                                                                 cp<T>(gy), mp<T>(gx));
      KILN_LAUNCH_OK("softmax_bwd_cols_kernel");
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

// ---- layer norm ------------------------------------------------------------------------------------

void layer_norm_forward(DType dt, int64_t rows, int64_t d, double eps, const void* x, const void* gamma,
                        const void* beta, void* y, void* mean, void* rstd) {
  if (rows == 0) return;
  const cudaStream_t s = current().stream;
  dispatch_nn(dt, "layer_norm", [&](auto tag) {
    using T = decltype(tag);
    launch_rows(layer_norm_fwd_kernel<T, false>, layer_norm_fwd_kernel<T, true>, "layer_norm_fwd_kernel", rows, d, s,
                rows, d, eps, cp<T>(x), cp<T>(gamma), cp<T>(beta), mp<T>(y), mp<T>(mean), mp<T>(rstd));
  });
}

void layer_norm_backward(DType dt, int64_t rows, int64_t d, const void* x, const void* gamma, const void* mean,
                         const void* rstd, const void* gy, void* gx, void* ggamma, void* gbeta) {
  if (d == 0) return;
  const cudaStream_t s = current().stream;
  dispatch_nn(dt, "layer_norm", [&](auto tag) {
    using T = decltype(tag);
    if (rows == 0) {  // empty column sums
      if (ggamma) KILN_CUDA_OK(cudaMemsetAsync(ggamma, 0, size_t(d) * sizeof(T), s));
      if (gbeta) KILN_CUDA_OK(cudaMemsetAsync(gbeta, 0, size_t(d) * sizeof(T), s));
      return;
    }
    if (gx)
      launch_rows(layer_norm_bwd_kernel<T, false>, layer_norm_bwd_kernel<T, true>, "layer_norm_bwd_kernel", rows, d,
                  s, rows, d, cp<T>(x), cp<T>(gamma), cp<T>(mean), cp<T>(rstd), cp<T>(gy), mp<T>(gx));
    if (!ggamma && !gbeta) return;
    const int64_t chunk = std::max(kLnChunkMin, (rows + kLnMaxChunks - 1) / kLnMaxChunks);
    const int64_t chunks = (rows + chunk - 1) / chunk;
    DeviceBuffer partial(size_t(2 * chunks * d) * sizeof(double));
    const dim3 grid(unsigned((d + 31) / 32), unsigned(chunks));
    layer_norm_param_partial_kernel<T><<<grid, kThreads, 0, s>>>(rows, d, chunk, cp<T>(x), cp<T>(mean), cp<T>(rstd),
                                                                 cp<T>(gy), partial.get<double>());
    KILN_LAUNCH_OK("layer_norm_param_partial_kernel");
    layer_norm_param_finish_kernel<T><<<grid_for(d), kThreads, 0, s>>>(d, chunks, partial.get<double>(),
                                                                       mp<T>(ggamma), mp<T>(gbeta));
    KILN_LAUNCH_OK("layer_norm_param_finish_kernel");
  });
}

// ---- batch norm ------------------------------------------------------------------------------------

namespace {

// The handwritten training forward (deterministic mode): pass 1 sums x, bn_mean_kernel makes the
// mean, pass 2 sums the squared deviations from it, the finish kernel makes the statistics, running
// buffers and the affine map, and bn_apply_kernel writes y. 5 launches, x read three times.
template <typename T>
void bn_forward_handwritten(Context& ctx, int64_t n, int64_t c, int64_t hw, double eps, double momentum, const T* x,
                            const T* gamma, const T* beta, T* rmean, T* rvar, T* y, T* mean, T* rstd) {
  const int64_t count = n * hw;
  const BnChunking ck = bn_chunking(c, count);
  DeviceBuffer partial(size_t(2 * c * ck.chunks) * sizeof(double));
  DeviceBuffer affine(size_t(2 * c) * sizeof(T));
  double* part = partial.get<double>();
  const dim3 grid(unsigned(c), unsigned(ck.chunks));
  bn_partial_kernel<T, BnSum::x><<<grid, kThreads, 0, ctx.stream>>>(n, c, hw, ck.chunk, x, nullptr, nullptr, part);
  KILN_LAUNCH_OK("bn_partial_kernel");
  bn_mean_kernel<T><<<grid_for(c), kThreads, 0, ctx.stream>>>(c, ck.chunks, count, part, mean);
  KILN_LAUNCH_OK("bn_mean_kernel");
  bn_partial_kernel<T, BnSum::dev2><<<grid, kThreads, 0, ctx.stream>>>(n, c, hw, ck.chunk, x, nullptr, mean,
                                                                       part + c * ck.chunks);
  KILN_LAUNCH_OK("bn_partial_kernel");
  bn_stats_finish_kernel<T><<<grid_for(c), kThreads, 0, ctx.stream>>>(c, ck.chunks, count, eps, momentum, part, gamma,
                                                                      beta, rmean, rvar, mean, rstd, affine.get<T>());
  KILN_LAUNCH_OK("bn_stats_finish_kernel");
  bn_apply_kernel<T><<<grid_for(n * c * hw), kThreads, 0, ctx.stream>>>(n * c * hw, c, hw, x, affine.get<T>(), y);
  KILN_LAUNCH_OK("bn_apply_kernel");
}

// The handwritten backward: the two sums per channel (skipped when nothing needs them), the finish
// kernel (ggamma, gbeta, gx's coefficients) and, with gx, the elementwise pass.
template <typename T>
void bn_backward_handwritten(Context& ctx, int64_t n, int64_t c, int64_t hw, bool training, const T* x,
                             const T* gamma, const T* mean, const T* rstd, const T* gy, T* gx, T* ggamma, T* gbeta) {
  const int64_t count = n * hw, total = n * c * hw;
  const bool sums = count > 0 && (ggamma || gbeta || (training && gx));
  const BnChunking ck = bn_chunking(c, count);
  const int64_t chunks = sums ? ck.chunks : 0;
  DeviceBuffer partial(size_t(2 * c * chunks) * sizeof(double));
  DeviceBuffer coef(gx && total > 0 ? size_t(3 * c) * sizeof(T) : 0);
  if (sums) {
    bn_partial_kernel<T, BnSum::grad><<<dim3(unsigned(c), unsigned(chunks)), kThreads, 0, ctx.stream>>>(
        n, c, hw, ck.chunk, x, gy, mean, partial.get<double>());
    KILN_LAUNCH_OK("bn_partial_kernel");
  }
  bn_backward_finish_kernel<T><<<grid_for(c), kThreads, 0, ctx.stream>>>(
      c, chunks, count, training, partial.get<double>(), gamma, mean, rstd, ggamma, gbeta, coef.get<T>());
  KILN_LAUNCH_OK("bn_backward_finish_kernel");
  if (!coef.get<T>()) return;
  bn_backward_apply_kernel<T><<<grid_for(total), kThreads, 0, ctx.stream>>>(total, c, hw, x, gy, coef.get<T>(), gx);
  KILN_LAUNCH_OK("bn_backward_apply_kernel");
}

}  // namespace

void batch_norm_forward(DType dt, int64_t n, int64_t c, int64_t hw, double eps, double momentum, bool training,
                        const void* x, const void* gamma, const void* beta, void* running_mean, void* running_var,
                        void* y, void* mean, void* rstd, bool nhwc) {
  if (c == 0) return;
  Context& ctx = current();
  // NHWC memory [n, hw, c] is NCHW [n*hw, c, 1] with the same values of each channel in the same
  // order: the handwritten kernels (eval, and training in deterministic mode) take it as that and
  // compute exactly what they compute on the NCHW layout. Only cuDNN's path gets NHWC descriptors.
  if (nhwc && (!training || deterministic()))
    return batch_norm_forward(dt, n * hw, c, 1, eps, momentum, training, x, gamma, beta, running_mean, running_var, y,
                              mean, rstd, false);
  dispatch_nn(dt, "batch_norm", [&](auto tag) {
    using T = decltype(tag);
    if (!training) {
      KILN_CHECK(running_mean && running_var, "cuda batch_norm: eval mode needs running_mean and running_var");
      DeviceBuffer affine(size_t(2 * c) * sizeof(T));
      bn_eval_prepare_kernel<T><<<grid_for(c), kThreads, 0, ctx.stream>>>(
          c, eps, cp<T>(gamma), cp<T>(beta), cp<T>(running_mean), cp<T>(running_var), mp<T>(mean), mp<T>(rstd),
          affine.get<T>());
      KILN_LAUNCH_OK("bn_eval_prepare_kernel");
      const int64_t total = n * c * hw;
      if (total == 0) return;
      bn_apply_kernel<T><<<grid_for(total), kThreads, 0, ctx.stream>>>(total, c, hw, cp<T>(x), affine.get<T>(),
                                                                       mp<T>(y));
      KILN_LAUNCH_OK("bn_apply_kernel");
      return;
    }
    KILN_CHECK(n * hw > 1, "cuda batch_norm: training needs more than one value per channel, got [", n, ", ", c, ", ",
               hw, "]");
    if (deterministic()) {
      bn_forward_handwritten<T>(ctx, n, c, hw, eps, momentum, cp<T>(x), cp<T>(gamma), cp<T>(beta),
                                mp<T>(running_mean), mp<T>(running_var), mp<T>(y), mp<T>(mean), mp<T>(rstd));
      return;
    }
    check_cudnn_bn(n, c, hw, eps);
    // cuDNN needs scale and bias, and both running buffers or neither: stand-ins for what is missing
    // (a zeroed one for the missing running buffer: cuDNN reads it before it blends in the batch).
    const bool stand_in_running = (running_mean == nullptr) != (running_var == nullptr);
    const size_t slot = bn_slot_bytes(c, sizeof(T));
    DeviceBuffer scratch(3 * slot);
    T* ones = scratch.get<T>();
    T* zeros = reinterpret_cast<T*>(scratch.get<char>() + slot);
    T* spare = reinterpret_cast<T*>(scratch.get<char>() + 2 * slot);
    if (!gamma) {
      fill_kernel<T><<<grid_for(c), kThreads, 0, ctx.stream>>>(c, T(1), ones);
      KILN_LAUNCH_OK("fill_kernel");
    }
    if (!beta) KILN_CUDA_OK(cudaMemsetAsync(zeros, 0, size_t(c) * sizeof(T), ctx.stream));
    if (stand_in_running) KILN_CUDA_OK(cudaMemsetAsync(spare, 0, size_t(c) * sizeof(T), ctx.stream));
    void* rm = stand_in_running && !running_mean ? spare : running_mean;
    void* rv = stand_in_running && !running_var ? spare : running_var;
    const cudnnDataType_t type = std::is_same_v<T, double> ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
    const BnTensor xd(type, n, c, hw, nhwc), pd(type, 1, c, 1);
    const T one = T(1), zero = T(0);  // blend factors: double for double data, float otherwise
    KILN_CUDNN_OK(cudnnBatchNormalizationForwardTraining(
        ctx.cudnn(), CUDNN_BATCHNORM_SPATIAL, &one, &zero, xd.d, x, xd.d, y, pd.d, gamma ? gamma : ones,
        beta ? beta : zeros, momentum, rm, rv, eps, mean, rstd));
  });
}

void batch_norm_backward(DType dt, int64_t n, int64_t c, int64_t hw, bool training, double eps, const void* x,
                         const void* gamma, const void* mean, const void* rstd, const void* gy, void* gx, void* ggamma,
                         void* gbeta, bool nhwc) {
  if (c == 0) return;
  Context& ctx = current();
  // NHWC as NCHW [n*hw, c, 1] for the handwritten backward, as in the forward.
  if (nhwc && (!training || !gx || n * hw == 0 || deterministic()))
    return batch_norm_backward(dt, n * hw, c, 1, training, eps, x, gamma, mean, rstd, gy, gx, ggamma, gbeta, false);
  dispatch_nn(dt, "batch_norm", [&](auto tag) {
    using T = decltype(tag);
    if (!training || !gx || n * hw == 0 || deterministic()) {
      bn_backward_handwritten<T>(ctx, n, c, hw, training, cp<T>(x), cp<T>(gamma), cp<T>(mean), cp<T>(rstd),
                                 cp<T>(gy), mp<T>(gx), mp<T>(ggamma), mp<T>(gbeta));
      return;
    }
    // cuDNN asks for the forward's epsilon (it uses the saved statistics, but the value must agree).
    const double bn_eps = std::max(eps, double(CUDNN_BN_MIN_EPSILON));
    check_cudnn_bn(n, c, hw, bn_eps);
    const size_t slot = bn_slot_bytes(c, sizeof(T));
    DeviceBuffer scratch(3 * slot);
    T* ones = scratch.get<T>();
    if (!gamma) {
      fill_kernel<T><<<grid_for(c), kThreads, 0, ctx.stream>>>(c, T(1), ones);
      KILN_LAUNCH_OK("fill_kernel");
    }
    void* dg = ggamma ? ggamma : scratch.get<char>() + slot;
    void* db = gbeta ? gbeta : scratch.get<char>() + 2 * slot;
    const cudnnDataType_t type = std::is_same_v<T, double> ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
    const BnTensor xd(type, n, c, hw, nhwc), pd(type, 1, c, 1);
    const T one = T(1), zero = T(0);
    KILN_CUDNN_OK(cudnnBatchNormalizationBackward(ctx.cudnn(), CUDNN_BATCHNORM_SPATIAL, &one, &zero, &one, &zero,
                                                  xd.d, x, xd.d, gy, xd.d, gx, pd.d, gamma ? gamma : ones, dg, db,
                                                  bn_eps, mean, rstd));
  });
}

// ---- cross-entropy -----------------------------------------------------------------------------------

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

// ---- index kernels -----------------------------------------------------------------------------------

void index_select(DType dt, int64_t outer, int64_t n_src, int64_t inner, const void* src, int64_t n_idx,
                  const int64_t* idx, void* dst) {
  const int64_t rows = outer * n_idx;
  if (rows * inner == 0) return;
  Context& ctx = current();
  // The widest unit that divides a row and both base pointers' alignment.
  const uint64_t row_bytes = uint64_t(inner) * dtype_size(dt);
  const uint64_t align = row_bytes | uintptr_t(src) | uintptr_t(dst);
  const int64_t unit = align % 16 == 0 ? 16 : align % 8 == 0 ? 8 : align % 4 == 0 ? 4 : align % 2 == 0 ? 2 : 1;
  const int64_t units = int64_t(row_bytes) / unit;
  auto launch = [&](auto tag) {
    using U = decltype(tag);
    index_select_kernel<U><<<grid_for(rows * units), kThreads, 0, ctx.stream>>>(
        rows, n_idx, n_src, units, static_cast<const U*>(src), idx, static_cast<U*>(dst), ctx.error_word);
    KILN_LAUNCH_OK("index_select_kernel");
  };
  switch (unit) {
    case 16: launch(uint4{}); break;
    case 8: launch(uint2{}); break;
    case 4: launch(uint32_t{}); break;
    case 2: launch(uint16_t{}); break;
    default: launch(uint8_t{}); break;
  }
}

void gather(DType dt, int64_t outer, int64_t n_src, int64_t inner, const void* src, int64_t n_idx, const int64_t* idx,
            void* dst) {
  const int64_t total = outer * n_idx * inner;
  if (total == 0) return;
  Context& ctx = current();
  auto launch = [&](auto tag) {
    using U = decltype(tag);
    gather_kernel<U><<<grid_for(total), kThreads, 0, ctx.stream>>>(
        outer, n_src, n_idx, inner, static_cast<const U*>(src), idx, static_cast<U*>(dst), ctx.error_word);
    KILN_LAUNCH_OK("gather_kernel");
  };
  switch (dtype_size(dt)) {
    case 1: launch(uint8_t{}); break;
    case 2: launch(uint16_t{}); break;
    case 4: launch(uint32_t{}); break;
    case 8: launch(uint64_t{}); break;
    default: KILN_FAIL("cuda gather: dtype ", dt, " is not supported");
  }
}

void index_add(DType dt, int64_t outer, int64_t n_dst, int64_t inner, void* dst, int64_t n_idx, const int64_t* idx,
               const void* src) {
  if (outer * n_idx * inner == 0) return;
  Context& ctx = current();
  dispatch_floating(dt, "index_add", [&](auto tag) {
    using T = decltype(tag);
    DeviceBuffer keys(size_t(n_idx) * 8 * 4);
    uint64_t* keys_in = keys.get<uint64_t>();
    uint64_t* keys_out = keys_in + n_idx;
    int64_t* pos_in = reinterpret_cast<int64_t*>(keys_out + n_idx);
    int64_t* pos_out = pos_in + n_idx;
    index_add_keys_kernel<<<grid_for(n_idx), kThreads, 0, ctx.stream>>>(n_idx, n_dst, idx, keys_in, pos_in,
                                                                        ctx.error_word);
    KILN_LAUNCH_OK("index_add_keys_kernel");
    // Keys lie in [0, n_dst]: sort only their bits. The radix sort is stable, so a run of equal keys
    // keeps its positions in ascending order.
    const int end_bit = std::max(1, int(std::bit_width(uint64_t(n_dst))));
    size_t temp_bytes = 0;
    KILN_CUDA_OK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys_in, keys_out, pos_in, pos_out, n_idx, 0,
                                                 end_bit, ctx.stream));
    DeviceBuffer temp(std::max<size_t>(temp_bytes, 16));
    KILN_CUDA_OK(cub::DeviceRadixSort::SortPairs(temp.get(), temp_bytes, keys_in, keys_out, pos_in, pos_out, n_idx, 0,
                                                 end_bit, ctx.stream));
    // Chunk sums of runs that cross a chunk edge: [2][outer, chunks, inner] in DAcc<T> (none with one chunk).
    const int64_t chunks = (n_idx + kRunChunk - 1) / kRunChunk;
    const size_t part = chunks > 1 ? size_t(outer * chunks * inner) : 0;
    DeviceBuffer sums(2 * part * sizeof(DAcc<T>));
    DAcc<T>* lead = sums.get<DAcc<T>>();
    DAcc<T>* cont = lead ? lead + part : nullptr;
    index_add_runs_kernel<T><<<grid_for(outer * n_idx * inner), kThreads, 0, ctx.stream>>>(
        outer, n_dst, inner, mp<T>(dst), n_idx, keys_out, pos_out, cp<T>(src), lead, cont);
    KILN_LAUNCH_OK("index_add_runs_kernel");
    if (chunks == 1) return;
    index_add_chunks_kernel<T><<<grid_for(outer * chunks * inner), kThreads, 0, ctx.stream>>>(
        outer, n_dst, inner, mp<T>(dst), n_idx, keys_out, lead, cont);
    KILN_LAUNCH_OK("index_add_chunks_kernel");
  });
}

void scatter_add(DType dt, int64_t outer, int64_t n_dst, int64_t inner, void* dst, int64_t n_idx, const int64_t* idx,
                 const void* src) {
  if (outer * n_idx * inner == 0) return;
  Context& ctx = current();
  dispatch_floating(dt, "scatter_add", [&](auto tag) {
    using T = decltype(tag);
    const int64_t total = outer * std::max<int64_t>(n_dst, 1) * inner;
    scatter_add_kernel<T><<<grid_for(total), kThreads, 0, ctx.stream>>>(outer, n_dst, inner, mp<T>(dst), n_idx, idx,
                                                                        cp<T>(src), ctx.error_word);
    KILN_LAUNCH_OK("scatter_add_kernel");
  });
}

// ---- mixed precision ---------------------------------------------------------------------------------

}  // namespace kiln::cuda
