// CPU kernels of max and average pooling (fixed or adaptive 2-d windows), forward and backward;
// the windows are kernels/common/pool_window.h's, which the CUDA kernels share.
#include <algorithm>
#include <limits>

#include "kernels/common/pool_window.h"
#include "kernels/cpu/loops.h"
#include "kernels/cpu/nn_common.h"
#include "kernels/cpu/ops_cpu.h"

namespace kiln::cpu {
using namespace nn_detail;
namespace {

// Calls f(plane's input, flat output index, window) for every output of every plane; planes in
// parallel.
template <typename T, typename F> void each_window(const Pool2dParams& p, const T* x, F&& f) {
  parallel_for(0, p.planes, 1, [&](int64_t b, int64_t e) {
    for (int64_t pl = b; pl < e; ++pl)
      for (int64_t oh = 0; oh < p.oh; ++oh)
        for (int64_t ow = 0; ow < p.ow; ++ow) f(x + pl * p.h * p.w, (pl * p.oh + oh) * p.ow + ow, pool_window(p, oh, ow));
  });
}

template <typename T> void max_pool_fwd(const Pool2dParams& p, const T* x, T* y, int64_t* idx) {
  each_window(p, x, [&](const T* img, int64_t o, const PoolWindow& w) {
    T best = -std::numeric_limits<T>::infinity();
    int64_t bi = -1;
    const int64_t step_h = w.step_h, step_w = w.step_w;
    for (int64_t ih = w.h0; ih < w.h1; ih += step_h) {
      if (ih < 0) continue;
      for (int64_t iw = w.w0; iw < w.w1; iw += step_w) {
        if (iw < 0) continue;
        const T v = img[ih * p.w + iw];
        if (bi < 0 || v > best || v != v) {
          best = v;
          bi = ih * p.w + iw;
          if (v != v) break;
        }
      }
    }
    y[o] = best;
    idx[o] = bi;
  });
}

template <typename T> void max_pool_bwd(const Pool2dParams& p, const T* gy, const int64_t* idx, T* gx) {
  parallel_for(0, p.planes, 1, [&](int64_t b, int64_t e) {
    for (int64_t pl = b; pl < e; ++pl) {
      T* g = gx + pl * p.h * p.w;
      std::fill(g, g + p.h * p.w, T(0));
      for (int64_t i = 0; i < p.oh * p.ow; ++i) {
        const int64_t k = idx[pl * p.oh * p.ow + i];
        if (k >= 0) g[k] += gy[pl * p.oh * p.ow + i];
      }
    }
  });
}

template <typename T> void avg_pool_fwd(const Pool2dParams& p, const T* x, T* y) {
  each_window(p, x, [&](const T* img, int64_t o, const PoolWindow& w) {
    const int64_t step_h = w.step_h, step_w = w.step_w;
    double acc = 0;
    for (int64_t ih = std::max<int64_t>(w.h0, 0); ih < w.h1; ih += step_h)
      for (int64_t iw = std::max<int64_t>(w.w0, 0); iw < w.w1; iw += step_w) acc += double(img[ih * p.w + iw]);
    y[o] = T(w.count > 0 ? acc / double(w.count) : 0.0);
  });
}

template <typename T> void avg_pool_bwd(const Pool2dParams& p, const T* gy, T* gx) {
  parallel_for(0, p.planes, 1, [&](int64_t b, int64_t e) {
    for (int64_t pl = b; pl < e; ++pl) {
      T* g = gx + pl * p.h * p.w;
      std::fill(g, g + p.h * p.w, T(0));
      for (int64_t oh = 0; oh < p.oh; ++oh)
        for (int64_t ow = 0; ow < p.ow; ++ow) {
          const PoolWindow w = pool_window(p, oh, ow);
          if (w.count <= 0) continue;
          const T v = gy[(pl * p.oh + oh) * p.ow + ow] / T(w.count);
          const int64_t step_h = w.step_h, step_w = w.step_w;
          for (int64_t ih = std::max<int64_t>(w.h0, 0); ih < w.h1; ih += step_h)
            for (int64_t iw = std::max<int64_t>(w.w0, 0); iw < w.w1; iw += step_w) g[ih * p.w + iw] += v;
        }
    }
  });
}

}  // namespace

void max_pool2d_forward(DType dt, const Pool2dParams& p, const void* x, void* y, int64_t* idx) {
  dispatch_float(dt, "max_pool2d", [&](auto t) { max_pool_fwd(p, cp<decltype(t)>(x), mp<decltype(t)>(y), idx); });
}
void max_pool2d_backward(DType dt, const Pool2dParams& p, const void* gy, const int64_t* idx, void* gx) {
  dispatch_float(dt, "max_pool2d", [&](auto t) { max_pool_bwd(p, cp<decltype(t)>(gy), idx, mp<decltype(t)>(gx)); });
}
void avg_pool2d_forward(DType dt, const Pool2dParams& p, const void* x, void* y) {
  dispatch_float(dt, "avg_pool2d", [&](auto t) { avg_pool_fwd(p, cp<decltype(t)>(x), mp<decltype(t)>(y)); });
}
void avg_pool2d_backward(DType dt, const Pool2dParams& p, const void* gy, void* gx) {
  dispatch_float(dt, "avg_pool2d", [&](auto t) { avg_pool_bwd(p, cp<decltype(t)>(gy), mp<decltype(t)>(gx)); });
}

}  // namespace kiln::cpu
