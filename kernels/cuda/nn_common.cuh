// Helpers shared by the CUDA kernels of the nn ops (pool, softmax, layer_norm, batch_norm,
// cross_entropy and index .cu, each with the semantics of the kernels/cpu/ file of its name).
//
// Determinism: no floating-point atomics anywhere. Every sum runs in an order fixed by the shape
// (warp shuffles and block trees of a fixed size, partial buffers summed in index order), so two
// runs give the same bits (batch-norm training goes to cuDNN, whose backward may vary, unless
// deterministic mode is on: see batch_norm.cu). The pooling backwards and the index adds
// gather instead of scatter: each output element is owned by one thread that adds its
// contributions in the CPU's order.
// Row kernels (softmax, layer norm, cross-entropy) give a row to one warp when it has at most
// kWarpRow elements and to a block of kThreads otherwise; statistics combine in f64 as on the CPU.
#pragma once
#include <cstdint>
#include <limits>
#include <type_traits>

#include "kernels/common/dispatch.h"
#include "kernels/cuda/context.h"
#include "kernels/cuda/ops_cuda.h"

namespace kiln::cuda::nn_detail {

inline constexpr int64_t kWarpRow = 1024;  // longest row a single warp owns (32 elements per lane)

template <typename Fn> void dispatch_nn(DType dt, const char* op, Fn&& fn) {
  dispatch_one_of<float, double>(dt, "cuda", op, fn);
}

template <typename T> const T* cp(const void* p) { return static_cast<const T*>(p); }
template <typename T> T* mp(void* p) { return static_cast<T*>(p); }

template <typename T> __device__ __forceinline__ T dexp(T v) {
  if constexpr (std::is_same_v<T, float>) return expf(v);
  else return ::exp(v);
}
template <typename T> inline constexpr T kNegInf = -std::numeric_limits<T>::infinity();

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
// Merges the lanes of a warp that agree in lane % w (w a power of two, 1 for the whole warp): each
// lane gets its class's state.
template <typename A> __device__ __forceinline__ MaxSum<A> warp_merge(MaxSum<A> v, int w = 1) {
  for (int o = 16; o >= w; o >>= 1)
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
  if (len <= kWarpRow)
    launch(name, warp, grid_for(rows * 32), kThreads, 0, s, args...);
  else
    launch(name, block, grid_for(rows * kThreads), kThreads, 0, s, args...);
}

}  // namespace kiln::cuda::nn_detail
