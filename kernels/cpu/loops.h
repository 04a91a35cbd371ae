// Strided N-operand loops for the CPU kernels: drop size-1 dims, merge dims that are contiguous in
// every operand, then run the innermost dim as a row, rows spread over the thread pool.
#pragma once
#include <array>
#include <cstdint>

#include "engine/error.h"
#include "engine/thread_pool.h"
#include "kernels/backend.h"

namespace kiln::cpu {

// Arithmetic happens in Acc<T>: f32 for the 16-bit floats, T otherwise.
template <typename T> struct AccOf { using type = T; };
template <> struct AccOf<Half> { using type = float; };
template <> struct AccOf<BFloat16> { using type = float; };
template <typename T> using Acc = typename AccOf<T>::type;

template <typename T> inline Acc<T> load(const T* p) { return static_cast<Acc<T>>(*p); }
template <typename T, typename V> inline void store(T* p, V v) {
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
    *p = T(static_cast<float>(v));
  } else {
    *p = static_cast<T>(v);
  }
}

template <int N> struct Loop {
  int nd = 0;
  int64_t shape[kMaxKernelDims];
  int64_t st[N][kMaxKernelDims];  // element strides per operand
  char* base[N];
  int64_t esize[N];
  int64_t numel = 1;
};

// All descs share a shape (broadcast already applied through stride 0).
template <int N> Loop<N> make_loop(const std::array<const TensorDesc*, N>& d) {
  Loop<N> L;
  const TensorDesc& d0 = *d[0];
  for (int k = 0; k < N; ++k) {
    KILN_ASSERT(d[k]->ndim == d0.ndim, "operand ", k, " has ", d[k]->ndim, " dims, expected ", d0.ndim);
    L.base[k] = static_cast<char*>(d[k]->data);
    L.esize[k] = int64_t(dtype_size(d[k]->dtype));
  }
  for (int i = 0; i < d0.ndim; ++i) {
    L.numel *= d0.shape[i];
    if (d0.shape[i] == 1) continue;
    if (L.nd > 0) {
      bool mergeable = true;
      for (int k = 0; k < N; ++k)
        if (L.st[k][L.nd - 1] != d[k]->strides[i] * d0.shape[i]) mergeable = false;
      if (mergeable) {
        L.shape[L.nd - 1] *= d0.shape[i];
        for (int k = 0; k < N; ++k) L.st[k][L.nd - 1] = d[k]->strides[i];
        continue;
      }
    }
    L.shape[L.nd] = d0.shape[i];
    for (int k = 0; k < N; ++k) L.st[k][L.nd] = d[k]->strides[i];
    ++L.nd;
  }
  if (L.nd == 0) {  // a single element
    L.nd = 1;
    L.shape[0] = 1;
    for (int k = 0; k < N; ++k) L.st[k][0] = 1;
  }
  return L;
}

// Calls row(ptrs, inner_strides, n) for every innermost row; ptrs are byte pointers.
template <int N, typename RowFn> void run_rows(const Loop<N>& L, RowFn&& row) {
  if (L.numel == 0) return;
  const int nd = L.nd;
  const int64_t inner = L.shape[nd - 1];
  const int64_t rows = L.numel / inner;
  std::array<int64_t, N> inner_st;
  for (int k = 0; k < N; ++k) inner_st[k] = L.st[k][nd - 1];
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(inner, 1));
  parallel_for(0, rows, grain, [&](int64_t r0, int64_t r1) {
    int64_t idx[kMaxKernelDims] = {};
    int64_t rem = r0;
    for (int i = nd - 2; i >= 0; --i) {
      idx[i] = rem % L.shape[i];
      rem /= L.shape[i];
    }
    std::array<char*, N> p;
    for (int k = 0; k < N; ++k) {
      int64_t off = 0;
      for (int i = 0; i < nd - 1; ++i) off += idx[i] * L.st[k][i];
      p[k] = L.base[k] + off * L.esize[k];
    }
    for (int64_t r = r0; r < r1; ++r) {
      row(p, inner_st, inner);
      // odometer increment of the outer index
      for (int i = nd - 2; i >= 0; --i) {
        if (++idx[i] < L.shape[i]) {
          for (int k = 0; k < N; ++k) p[k] += L.st[k][i] * L.esize[k];
          break;
        }
        for (int k = 0; k < N; ++k) p[k] -= (L.shape[i] - 1) * L.st[k][i] * L.esize[k];
        idx[i] = 0;
      }
    }
  });
}

}  // namespace kiln::cpu
