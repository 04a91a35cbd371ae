// CUDA kernels of the index ops, with the semantics of kernels/cpu/index.cpp: index_select/gather as
// copies, index_add by a stable key sort and chunked run sums, scatter (add, assign, reductions) as a gather.
#ifndef KILN_CUDA_EMULATION  // the emulated build: cuda_runtime_emulated.h
#include <cub/cub.cuh>
#endif

#include <algorithm>
#include <bit>
#include <cstdint>

#include "kernels/common/dispatch.h"
#include "kernels/common/scatter.h"
#include "kernels/cuda/context.h"
#include "kernels/cuda/nn_common.cuh"
#include "kernels/cuda/ops_cuda.h"

namespace kiln::cuda {
using namespace nn_detail;
namespace {

template <typename Fn> void dispatch_floating(DType dt, const char* op, Fn&& fn) {
  dispatch_one_of<float, double, Half, BFloat16>(dt, "cuda", op, fn);
}

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
// The op is a template argument: a kernel per op, whose combine folds to one instruction (with the op
// a kernel argument, the switch in the inner loop cost 48 bytes of spills at sm_80).
template <typename T, ScatterOp op> __global__ void __launch_bounds__(kThreads)
    scatter_kernel(bool include_self, int64_t outer, int64_t n_dst, int64_t inner, T* dst, int64_t n_idx,
                   const int64_t* idx, const T* src, int* err) {
  const int64_t nk = n_dst > 0 ? n_dst : 1, total = outer * nk * inner;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = e % inner, t = e / inner, k = t % nk, o = t / nk;
    const int64_t* ic = idx + o * n_idx * inner + j;
    const T* sc = src + o * n_idx * inner + j;
    T* d = dst + (o * n_dst + k) * inner + j;
    DAcc<T> acc = k < n_dst ? ld(d) : DAcc<T>(0);
    int64_t hits = 0;
#pragma unroll 1  // unrolled, the 16-bit amax/amin kernels spilled 8 bytes at sm_90
    for (int64_t i = 0; i < n_idx; ++i) {
      const int64_t v = ic[i * inner];
      if (v < 0 || v >= n_dst) {
        if (k == 0) flag_error(err, KernelError::scatter_add);
      } else if (v == k) {
        const DAcc<T> s = ld(sc + i * inner);
        acc = !include_self && hits == 0 ? s : scatter::combine(op, acc, s);
        ++hits;
      }
    }
    if (k < n_dst) st(d, scatter::finish(op, include_self, acc, hits));
  }
}

}  // namespace

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
  auto run = [&](auto tag) {
    using U = decltype(tag);
    launch("index_select_kernel", index_select_kernel<U>, grid_for(rows * units), kThreads, 0, ctx.stream, rows, n_idx,
           n_src, units, static_cast<const U*>(src), idx, static_cast<U*>(dst), ctx.error_word);
  };
  switch (unit) {
    case 16: run(uint4{}); break;
    case 8: run(uint2{}); break;
    case 4: run(uint32_t{}); break;
    case 2: run(uint16_t{}); break;
    default: run(uint8_t{}); break;
  }
}

void gather(DType dt, int64_t outer, int64_t n_src, int64_t inner, const void* src, int64_t n_idx, const int64_t* idx,
            void* dst) {
  const int64_t total = outer * n_idx * inner;
  if (total == 0) return;
  Context& ctx = current();
  auto run = [&](auto tag) {
    using U = decltype(tag);
    launch("gather_kernel", gather_kernel<U>, grid_for(total), kThreads, 0, ctx.stream, outer, n_src, n_idx, inner,
           static_cast<const U*>(src), idx, static_cast<U*>(dst), ctx.error_word);
  };
  switch (dtype_size(dt)) {
    case 1: run(uint8_t{}); break;
    case 2: run(uint16_t{}); break;
    case 4: run(uint32_t{}); break;
    case 8: run(uint64_t{}); break;
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
    launch("index_add_keys_kernel", index_add_keys_kernel, grid_for(n_idx), kThreads, 0, ctx.stream, n_idx, n_dst, idx,
           keys_in, pos_in, ctx.error_word);
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
    launch("index_add_runs_kernel", index_add_runs_kernel<T>, grid_for(outer * n_idx * inner), kThreads, 0, ctx.stream,
           outer, n_dst, inner, mp<T>(dst), n_idx, keys_out, pos_out, cp<T>(src), lead, cont);
    if (chunks == 1) return;
    launch("index_add_chunks_kernel", index_add_chunks_kernel<T>, grid_for(outer * chunks * inner), kThreads, 0,
           ctx.stream, outer, n_dst, inner, mp<T>(dst), n_idx, keys_out, lead, cont);
  });
}

void scatter(ScatterOp op, bool include_self, DType dt, int64_t outer, int64_t n_dst, int64_t inner, void* dst,
             int64_t n_idx, const int64_t* idx, const void* src) {
  if (outer * n_idx * inner == 0) return;
  Context& ctx = current();
  dispatch_floating(dt, "scatter", [&](auto tag) {
    using T = decltype(tag);
    const int64_t total = outer * std::max<int64_t>(n_dst, 1) * inner;
    auto run = [&](auto kernel) {
      launch("scatter_kernel", kernel, grid_for(total), kThreads, 0, ctx.stream, include_self, outer, n_dst, inner,
             mp<T>(dst), n_idx, idx, cp<T>(src), ctx.error_word);
    };
    switch (op) {
      case ScatterOp::assign: return run(scatter_kernel<T, ScatterOp::assign>);
      case ScatterOp::add: return run(scatter_kernel<T, ScatterOp::add>);
      case ScatterOp::mul: return run(scatter_kernel<T, ScatterOp::mul>);
      case ScatterOp::mean: return run(scatter_kernel<T, ScatterOp::mean>);
      case ScatterOp::amax: return run(scatter_kernel<T, ScatterOp::amax>);
      case ScatterOp::amin: return run(scatter_kernel<T, ScatterOp::amin>);
    }
    KILN_FAIL("cuda scatter: unknown op ", int(op));
  });
}

}  // namespace kiln::cuda
