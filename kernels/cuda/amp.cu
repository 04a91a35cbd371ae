// CUDA kernels of the loss scaler, with the semantics of kernels/cpu/amp.cpp: the fused unscale pass
// over a gradient (inf/NaN flagged on the device) and the end-of-step update of the scaler's
// device-resident state (kernels/common/amp_math.h). Neither waits for the host.
#include <algorithm>
#include <cstring>
#include <type_traits>

#include "kernels/common/amp_math.h"
#include "kernels/cuda/context.h"
#include "kernels/cuda/ops_cuda.h"

namespace kiln::cuda {
namespace {

// The CPU's arithmetic: in C (f64 for f64, f32 otherwise), the product rounded back to T (16-bit
// types convert with single cvt instructions in device code, base/half.h).
template <typename T, typename C> __device__ __forceinline__ void unscale_one(T& x, C s, bool& bad) {
  x = T(C(x) * s);
  bad |= !isfinite(C(x));  // the stored unscaled value: an overflow of the product, or of its 16-bit rounding
}

// x *= 1 / *scale over a contiguous buffer; any non-finite result stores 1.0f into *found_inf (a plain store:
// every writer writes the same value). Launch: grid_for(max(vectors, scalars)); a thread handles
// 16-byte vectors v, v + stride, ... of the aligned body, and the first threads the unaligned head
// and the tail element by element. Traffic: every byte read and written once, 128-bit accesses.
template <typename T, typename C>
__global__ void __launch_bounds__(kThreads) unscale_kernel(int64_t n, int64_t head, int64_t nvec, T* x,
                                                           const double* scale, float* found_inf) {
  constexpr int kVec = 16 / sizeof(T);
  const C s = C(1.0 / *scale);  // the CPU's factor: 1 / scale in f64, then rounded to C
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, stride = int64_t(gridDim.x) * blockDim.x;
  bool bad = false;
  uint4* xv = reinterpret_cast<uint4*>(x + head);
  for (int64_t v = tid; v < nvec; v += stride) {
    uint4 u = xv[v];
    T e[kVec];
    memcpy(e, &u, 16);
#pragma unroll
    for (int l = 0; l < kVec; ++l) unscale_one(e[l], s, bad);
    memcpy(&u, e, 16);
    xv[v] = u;
  }
  const int64_t tail0 = head + nvec * kVec, scalars = head + (n - tail0);
  for (int64_t q = tid; q < scalars; q += stride) unscale_one(x[q < head ? q : tail0 + (q - head)], s, bad);
  if (bad) *found_inf = 1.0f;
}

// One thread: the scaler's state is three numbers.
__global__ void update_scale_kernel(double* state, const float* found_inf, double growth, double backoff,
                                    int64_t interval) {
  amp_math::update_scale(state, *found_inf, growth, backoff, interval);
}

template <typename T> void unscale_typed(int64_t n, void* x, const double* scale, float* found_inf, cudaStream_t s) {
  using C = std::conditional_t<std::is_same_v<T, double>, double, float>;
  constexpr int64_t kVec = 16 / sizeof(T);
  const uintptr_t mis = uintptr_t(x) % 16;
  const int64_t head = std::min<int64_t>(n, mis == 0 ? 0 : int64_t(16 - mis) / int64_t(sizeof(T)));
  const int64_t nvec = (n - head) / kVec, scalars = n - nvec * kVec;
  launch("unscale_kernel", unscale_kernel<T, C>, grid_for(std::max(nvec, scalars)), kThreads, 0, s, n, head, nvec,
         static_cast<T*>(x), scale, found_inf);
}

}  // namespace

void unscale_check(DType dt, int64_t n, void* x, const double* scale, float* found_inf) {
  if (n == 0) return;
  const cudaStream_t s = current().stream;
  switch (dt) {
    case DType::f32: return unscale_typed<float>(n, x, scale, found_inf, s);
    case DType::f64: return unscale_typed<double>(n, x, scale, found_inf, s);
    case DType::f16: return unscale_typed<Half>(n, x, scale, found_inf, s);
    case DType::bf16: return unscale_typed<BFloat16>(n, x, scale, found_inf, s);
    default: KILN_FAIL("cuda unscale_check: gradients must be floating (f32, f64, f16, bf16), got ", dt);
  }
}

void amp_update_scale(double* state, const float* found_inf, double growth, double backoff, int64_t interval) {
  launch("update_scale_kernel", update_scale_kernel, 1, 1, 0, current().stream, state, found_inf, growth, backoff,
         interval);
}

}  // namespace kiln::cuda
