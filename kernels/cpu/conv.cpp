// CPU conv2d (NCHW) as im2col + GEMM over chunks of S images side by side, so late ResNet layers
// (8x8 maps) still give GEMMs wide enough to run near peak. S depends only on the shapes, and
// weight gradients are summed per chunk in chunk order, so results do not depend on threads.
#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/loops.h"
#include "kernels/cpu/ops_cpu.h"
#include "kernels/cpu/scratch.h"

namespace kiln::cpu {
namespace {

constexpr int64_t kTargetCols = 1024;  // columns of a chunk (S * OH * OW): its im2col matrix stays in L2
constexpr int64_t kMaxColElems = 1 << 23;  // cap on one chunk's im2col buffer (32 MiB of f32)
thread_local ScratchBuffer t_col, t_out;     // a chunk's im2col matrix and its [O, cols] GEMM operand

struct Geometry {
  const Conv2dParams& p;
  int64_t cg, og, ckk, ohw, s, nchunks;
  explicit Geometry(const Conv2dParams& q) : p(q) {
    cg = p.c / p.groups;
    og = p.o / p.groups;
    ckk = cg * p.kh * p.kw;
    ohw = p.oh * p.ow;
    s = (kTargetCols + ohw - 1) / std::max<int64_t>(ohw, 1);
    s = std::min(s, kMaxColElems / std::max<int64_t>(ckk * ohw, 1));
    s = std::clamp<int64_t>(s, 1, std::max<int64_t>(p.n, 1));
    nchunks = (p.n + s - 1) / s;
  }
};

// col[(c, ki, kj), (si, oh, ow)] for images n0 .. n0+ns of group g; cols = ns * OH * OW.
template <typename T> void im2col_channels(const Geometry& G, const T* x, int64_t n0, int64_t ns, int64_t g, T* col,
                                           int64_t c0, int64_t c1) {
  const auto& p = G.p;
  const int64_t cols = ns * G.ohw;
  for (int64_t c = c0; c < c1; ++c) {
    for (int64_t ki = 0; ki < p.kh; ++ki) {
      for (int64_t kj = 0; kj < p.kw; ++kj) {
        T* row = col + ((c * p.kh + ki) * p.kw + kj) * cols;
        for (int64_t si = 0; si < ns; ++si) {
          const T* img = x + ((n0 + si) * p.c + g * G.cg + c) * p.h * p.w;
          T* out = row + si * G.ohw;
          for (int64_t oh = 0; oh < p.oh; ++oh) {
            const int64_t ih = oh * p.sh - p.ph + ki * p.dh;
            T* o = out + oh * p.ow;
            if (ih < 0 || ih >= p.h) {
              std::fill(o, o + p.ow, T(0));
              continue;
            }
            const T* src = img + ih * p.w;
            const int64_t off = kj * p.dw - p.pw;
            if (p.sw == 1) {
              // valid ow range: 0 <= ow + off < W
              const int64_t lo = std::clamp<int64_t>(-off, 0, p.ow), hi = std::clamp<int64_t>(p.w - off, lo, p.ow);
              std::fill(o, o + lo, T(0));
              std::memcpy(o + lo, src + lo + off, size_t(hi - lo) * sizeof(T));
              std::fill(o + hi, o + p.ow, T(0));
            } else {
              for (int64_t ow = 0; ow < p.ow; ++ow) {
                const int64_t iw = ow * p.sw + off;
                o[ow] = (iw >= 0 && iw < p.w) ? src[iw] : T(0);
              }
            }
          }
        }
      }
    }
  }
}

// The adjoint of im2col: adds col back into gx (which the caller zeroed). Channels touch disjoint
// planes of gx, so they may run in parallel.
template <typename T> void col2im_channels(const Geometry& G, const T* col, int64_t n0, int64_t ns, int64_t g, T* gx,
                                           int64_t c0, int64_t c1) {
  const auto& p = G.p;
  const int64_t cols = ns * G.ohw;
  for (int64_t c = c0; c < c1; ++c) {
    for (int64_t ki = 0; ki < p.kh; ++ki) {
      for (int64_t kj = 0; kj < p.kw; ++kj) {
        const T* row = col + ((c * p.kh + ki) * p.kw + kj) * cols;
        for (int64_t si = 0; si < ns; ++si) {
          T* img = gx + ((n0 + si) * p.c + g * G.cg + c) * p.h * p.w;
          const T* in = row + si * G.ohw;
          for (int64_t oh = 0; oh < p.oh; ++oh) {
            const int64_t ih = oh * p.sh - p.ph + ki * p.dh;
            if (ih < 0 || ih >= p.h) continue;
            T* dst = img + ih * p.w;
            const T* o = in + oh * p.ow;
            const int64_t off = kj * p.dw - p.pw;
            if (p.sw == 1) {
              const int64_t lo = std::clamp<int64_t>(-off, 0, p.ow), hi = std::clamp<int64_t>(p.w - off, lo, p.ow);
              T* d = dst + off;
              for (int64_t ow = lo; ow < hi; ++ow) d[ow] += o[ow];
            } else {
              for (int64_t ow = 0; ow < p.ow; ++ow) {
                const int64_t iw = ow * p.sw + off;
                if (iw >= 0 && iw < p.w) dst[iw] += o[ow];
              }
            }
          }
        }
      }
    }
  }
}

// Whole-chunk versions: spread over the pool's threads by channel (inline when already inside a
// parallel region, i.e. when chunks themselves run in parallel).
template <typename T> void im2col(const Geometry& G, const T* x, int64_t n0, int64_t ns, int64_t g, T* col) {
  parallel_for(0, G.cg, 1, [&](int64_t c0, int64_t c1) { im2col_channels(G, x, n0, ns, g, col, c0, c1); });
}
template <typename T> void col2im(const Geometry& G, const T* col, int64_t n0, int64_t ns, int64_t g, T* gx) {
  parallel_for(0, G.cg, 1, [&](int64_t c0, int64_t c1) { col2im_channels(G, col, n0, ns, g, gx, c0, c1); });
}

template <typename T>
void gemm_t(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b,
            int64_t ldb, T beta, T* c, int64_t ldc) {
  if constexpr (std::is_same_v<T, float>) {
    gemm_f32(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  } else {
    gemm_f64(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
}

// Runs fn(chunk) for every chunk: spread over threads when there are enough chunks, otherwise in
// order on this thread so the GEMMs inside use the pool.
template <typename Fn> void for_chunks(const Geometry& G, Fn&& fn) {
  if (G.nchunks >= 2 * num_threads()) {
    parallel_for(0, G.nchunks, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) fn(i);
    });
  } else {
    for (int64_t i = 0; i < G.nchunks; ++i) fn(i);
  }
}

template <typename T> void forward_typed(const Conv2dParams& p, const T* x, const T* w, const T* bias, T* y) {
  const Geometry G(p);
  for_chunks(G, [&](int64_t chunk) {
    const int64_t n0 = chunk * G.s, ns = std::min(G.s, p.n - n0), cols = ns * G.ohw;
    T* col = t_col.get<T>(size_t(G.ckk * cols));
    T* tmp = t_out.get<T>(size_t(G.og * cols));
    for (int64_t g = 0; g < p.groups; ++g) {
      im2col(G, x, n0, ns, g, col);
      gemm_t<T>(false, false, G.og, cols, G.ckk, T(1), w + g * G.og * G.ckk, G.ckk, col, cols, T(0), tmp, cols);
      parallel_for(0, ns * G.og, 4, [&](int64_t b0, int64_t b1) {
        for (int64_t t = b0; t < b1; ++t) {
          const int64_t si = t / G.og, o = t % G.og;
          const T b = bias ? bias[g * G.og + o] : T(0);
          const T* src = tmp + o * cols + si * G.ohw;
          T* dst = y + ((n0 + si) * p.o + g * G.og + o) * G.ohw;
          for (int64_t i = 0; i < G.ohw; ++i) dst[i] = src[i] + b;
        }
      });
    }
  });
}

template <typename T>
void backward_typed(const Conv2dParams& p, const T* x, const T* w, const T* gy, T* gx, T* gw) {
  const Geometry G(p);
  const int64_t wsize = p.o * G.ckk;
  // Every chunk writes its own slice in full (beta = 0), so this needs no zeroing.
  std::unique_ptr<T[]> partial(gw ? new T[size_t(G.nchunks * wsize)] : nullptr);
  if (gx)
    parallel_for(0, p.n * p.c * p.h * p.w, 1 << 16, [&](int64_t b, int64_t e) { std::fill(gx + b, gx + e, T(0)); });
  for_chunks(G, [&](int64_t chunk) {
    const int64_t n0 = chunk * G.s, ns = std::min(G.s, p.n - n0), cols = ns * G.ohw;
    T* col = t_col.get<T>(size_t(G.ckk * cols));
    T* gyc = t_out.get<T>(size_t(G.og * cols));
    for (int64_t g = 0; g < p.groups; ++g) {
      // Gather this group's output gradient as [Og, ns * OH * OW].
      parallel_for(0, ns * G.og, 4, [&](int64_t b0, int64_t b1) {
        for (int64_t t = b0; t < b1; ++t) {
          const int64_t si = t / G.og, o = t % G.og;
          std::memcpy(gyc + o * cols + si * G.ohw, gy + ((n0 + si) * p.o + g * G.og + o) * G.ohw,
                      size_t(G.ohw) * sizeof(T));
        }
      });
      if (gw) {
        im2col(G, x, n0, ns, g, col);
        gemm_t<T>(false, true, G.og, G.ckk, cols, T(1), gyc, cols, col, cols, T(0),
                  partial.get() + chunk * wsize + g * G.og * G.ckk, G.ckk);
      }
      if (gx) {
        gemm_t<T>(true, false, G.ckk, cols, G.og, T(1), w + g * G.og * G.ckk, G.ckk, gyc, cols, T(0), col, cols);
        col2im(G, col, n0, ns, g, gx);
      }
    }
  });
  if (gw) {
    parallel_for(0, wsize, 4096, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        T acc = 0;
        for (int64_t c = 0; c < G.nchunks; ++c) acc += partial[size_t(c * wsize + i)];
        gw[i] = acc;
      }
    });
  }
}

}  // namespace

void conv2d_forward(DType dt, const Conv2dParams& p, const void* x, const void* w, const void* bias, void* y) {
  if (dt == DType::f32) {
    forward_typed(p, static_cast<const float*>(x), static_cast<const float*>(w), static_cast<const float*>(bias),
                  static_cast<float*>(y));
  } else if (dt == DType::f64) {
    forward_typed(p, static_cast<const double*>(x), static_cast<const double*>(w), static_cast<const double*>(bias),
                  static_cast<double*>(y));
  } else {
    KILN_FAIL("conv2d: the CPU computes f32 and f64, got ", dt);
  }
}

void conv2d_backward(DType dt, const Conv2dParams& p, const void* x, const void* w, const void* gy, void* gx, void* gw) {
  if (dt == DType::f32) {
    backward_typed(p, static_cast<const float*>(x), static_cast<const float*>(w), static_cast<const float*>(gy),
                   static_cast<float*>(gx), static_cast<float*>(gw));
  } else if (dt == DType::f64) {
    backward_typed(p, static_cast<const double*>(x), static_cast<const double*>(w), static_cast<const double*>(gy),
                   static_cast<double*>(gx), static_cast<double*>(gw));
  } else {
    KILN_FAIL("conv2d backward: the CPU computes f32 and f64, got ", dt);
  }
}

}  // namespace kiln::cpu
