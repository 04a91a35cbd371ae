// CUDA kernels of layer norm, with the semantics of kernels/cpu/layer_norm.cpp: a row per warp or
// block; ggamma/gbeta as f64 column sums in fixed row chunks, added in chunk order.
#include <algorithm>
#include <cstdint>

#include "kernels/cuda/context.h"
#include "kernels/cuda/nn_common.cuh"
#include "kernels/cuda/ops_cuda.h"

namespace kiln::cuda {
using namespace nn_detail;
namespace {

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
    // The mean sums x - x[0], as the CPU's row: a constant row's mean is exact (its output 0), and a
    // row far from 0 with a small spread keeps its precision in the per-thread sums.
    const T pivot = d > 0 ? xr[0] : T(0);
    T acc = T(0);
    for (int64_t i = G::rank(); i < d; i += G::size()) acc += xr[i] - pivot;
    const double m = double(pivot) + group_sum<kBlock>(double(acc), sred) / dd;
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

}  // namespace

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
    launch("layer_norm_param_partial_kernel", layer_norm_param_partial_kernel<T>, grid, kThreads, 0, s, rows, d, chunk,
           cp<T>(x), cp<T>(mean), cp<T>(rstd), cp<T>(gy), partial.get<double>());
    launch("layer_norm_param_finish_kernel", layer_norm_param_finish_kernel<T>, grid_for(d), kThreads, 0, s, d, chunks,
           partial.get<double>(), mp<T>(ggamma), mp<T>(gbeta));
  });
}

}  // namespace kiln::cuda
