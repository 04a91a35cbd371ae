// CUDA kernels of max and average pooling, with the semantics of kernels/cpu/pool.cpp. The backward
// passes gather instead of scatter: a thread owns an input element and adds in the CPU's order.
#include <cstdint>

#include "kernels/common/pool_window.h"
#include "kernels/cuda/context.h"
#include "kernels/cuda/nn_common.cuh"
#include "kernels/cuda/ops_cuda.h"

namespace kiln::cuda {
using namespace nn_detail;
namespace {

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

}  // namespace

void max_pool2d_forward(DType dt, const Pool2dParams& p, const void* x, void* y, int64_t* idx) {
  const int64_t total = p.planes * p.oh * p.ow;
  if (total == 0) return;
  dispatch_nn(dt, "max_pool2d", [&](auto tag) {
    using T = decltype(tag);
    launch("max_pool_fwd_kernel", max_pool_fwd_kernel<T>, grid_for(total), kThreads, 0, current().stream, p, cp<T>(x),
           mp<T>(y), idx);
  });
}

void max_pool2d_backward(DType dt, const Pool2dParams& p, const void* gy, const int64_t* idx, void* gx) {
  const int64_t total = p.planes * p.h * p.w;
  if (total == 0) return;
  Context& ctx = current();
  dispatch_nn(dt, "max_pool2d", [&](auto tag) {
    using T = decltype(tag);
    launch("max_pool_bwd_kernel", max_pool_bwd_kernel<T>, grid_for(total), kThreads, 0, ctx.stream, p, cp<T>(gy), idx,
           mp<T>(gx), ctx.error_word);
  });
}

void avg_pool2d_forward(DType dt, const Pool2dParams& p, const void* x, void* y) {
  const int64_t total = p.planes * p.oh * p.ow;
  if (total == 0) return;
  dispatch_nn(dt, "avg_pool2d", [&](auto tag) {
    using T = decltype(tag);
    launch("avg_pool_fwd_kernel", avg_pool_fwd_kernel<T>, grid_for(total), kThreads, 0, current().stream, p, cp<T>(x),
           mp<T>(y));
  });
}

void avg_pool2d_backward(DType dt, const Pool2dParams& p, const void* gy, void* gx) {
  const int64_t total = p.planes * p.h * p.w;
  if (total == 0) return;
  dispatch_nn(dt, "avg_pool2d", [&](auto tag) {
    using T = decltype(tag);
    launch("avg_pool_bwd_kernel", avg_pool_bwd_kernel<T>, grid_for(total), kThreads, 0, current().stream, p, cp<T>(gy),
           mp<T>(gx));
  });
}

}  // namespace kiln::cuda
