// Strided N-operand loops for the CPU kernels: drop size-1 dims, merge dims that are contiguous in
// every operand, then run the innermost dim as a row, rows spread over the thread pool.
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <type_traits>

#include "base/error.h"
#include "base/thread_pool.h"
#include "kernels/backend.h"
#include "kernels/common/dims.h"
#include "kernels/cpu/kernel_sets.h"

namespace kiln::cpu {

// Arithmetic happens in Acc<T>: f32 for the 16-bit floats, T otherwise.
template <typename T> struct AccOf { using type = T; };
template <> struct AccOf<Half> { using type = float; };
template <> struct AccOf<BFloat16> { using type = float; };
template <typename T> using Acc = typename AccOf<T>::type;

template <typename T> inline Acc<T> load(const T* p) { return static_cast<Acc<T>>(*p); }
template <typename T, typename V> inline void store(T* p, V v) { *p = convert_to<T>(v); }

// 16-bit rows are computed in f32 blocks: a block is converted in (contiguous runs by the kernel set's
// conversion leaves: F16C, 8 at a time, on AVX2 and AVX-512), the op runs on plain floats (which the
// compiler vectorises), and the result is converted out.
template <typename T> constexpr bool is_f16_or_bf16_v = std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;
constexpr int64_t kStageBlock = 256;

template <typename T> inline void load_block_f32(const T* in, int64_t s, float* out, int64_t n) {
  if (s == 1) {
    if constexpr (std::is_same_v<T, Half>) {
      kernel_set().rows.f16_to_f32(reinterpret_cast<const uint16_t*>(in), out, n);
      return;
    } else if constexpr (std::is_same_v<T, BFloat16>) {
      kernel_set().rows.bf16_to_f32(reinterpret_cast<const uint16_t*>(in), out, n);
      return;
    }
    for (int64_t i = 0; i < n; ++i) out[i] = float(in[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = float(in[i * s]);
  }
}

template <typename T> inline void store_block_f32(const float* in, T* out, int64_t s, int64_t n) {
  if (s == 1) {
    if constexpr (std::is_same_v<T, Half>) {
      kernel_set().rows.f32_to_f16(in, reinterpret_cast<uint16_t*>(out), n);
      return;
    } else if constexpr (std::is_same_v<T, BFloat16>) {
      kernel_set().rows.f32_to_bf16(in, reinterpret_cast<uint16_t*>(out), n);
      return;
    }
    for (int64_t i = 0; i < n; ++i) out[i] = T(in[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) out[i * s] = T(in[i]);
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
  const TensorDesc* ds[N];
  for (int k = 0; k < N; ++k) ds[k] = d[k];
  const MergedDims<N> g = merge_dims<N>(ds);
  L.numel = g.numel;
  L.nd = g.ndim;
  for (int i = 0; i < g.ndim; ++i) {
    L.shape[i] = g.shape[i];
    for (int k = 0; k < N; ++k) L.st[k][i] = g.stride[k][i];
  }
  if (L.nd == 0) {  // a single element
    L.nd = 1;
    L.shape[0] = 1;
    for (int k = 0; k < N; ++k) L.st[k][0] = 1;
  }
  return L;
}

// The chunk parallel_for_fixed cuts [0, n) into for a target of `target` elements: ceil(n / target)
// equal chunks, each rounded up to a multiple of 64 elements (a vector body's whole steps), the last
// taking the rest. It depends on n only, not on the thread count; and the chunks are even, so two
// threads share 100000 elements as 50048 and 49952, not 65536 and 34464 of fixed 32768-element ones.
inline int64_t fixed_chunk(int64_t n, int64_t target) {
  const int64_t pieces = std::max<int64_t>(1, (n + target - 1) / target);
  return std::max<int64_t>(64, ((n + pieces - 1) / pieces + 63) / 64 * 64);
}

// Calls fn(b, e) once per chunk [begin + i*c, min(end, begin + (i+1)*c)) of c = fixed_chunk(end - begin,
// target), the chunks spread over the threads. parallel_for's split points move with the thread count;
// these do not, so a vectorised leaf sees the same body/tail partition (and gives the same bits)
// whatever the threads.
template <typename Fn> void parallel_for_fixed(int64_t begin, int64_t end, int64_t target, Fn&& fn) {
  if (end <= begin) return;
  const int64_t chunk = fixed_chunk(end - begin, target);
  parallel_for(0, (end - begin + chunk - 1) / chunk, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t b = begin + c * chunk;
      fn(b, std::min(end, b + chunk));
    }
  });
}

// Calls row(ptrs, inner_strides, n) for every innermost row; ptrs are byte pointers.
template <int N, typename RowFn> void run_rows(const Loop<N>& L, RowFn&& row) {
  if (L.numel == 0) return;
  const int nd = L.nd;
  const int64_t inner = L.shape[nd - 1];
  const int64_t rows = L.numel / inner;
  std::array<int64_t, N> inner_st;
  for (int k = 0; k < N; ++k) inner_st[k] = L.st[k][nd - 1];
  if (rows == 1 && inner >= 65536) {
    // One long row (a contiguous tensor): split it, so every thread takes a piece. The pieces are
    // fixed (not per thread count): a leaf's vector body and scalar tail may round differently, so
    // thread-dependent split points changed the last bits (GELU backward did).
    parallel_for_fixed(0, inner, 32768, [&](int64_t i0, int64_t i1) {
      std::array<char*, N> p;
      for (int k = 0; k < N; ++k) p[k] = L.base[k] + i0 * L.st[k][nd - 1] * L.esize[k];
      row(p, inner_st, i1 - i0);
    });
    return;
  }
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
