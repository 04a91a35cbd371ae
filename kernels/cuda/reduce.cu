// CUDA reductions over the middle dim of a contiguous [outer, r, inner] block: sum, max, min,
// argmax, argmin, with the CPU's semantics (kernels/cpu/reduce.cpp): floating sums accumulate in
// f64 and integer sums in i64; NaN wins max/min and argmax/argmin point at the first NaN; ties go to
// the first index.
//
// No atomics: r is cut into fixed-size chunks, each chunk reduced in a fixed order, and the chunk
// results combined by the same kernels in a second (or further) pass, so the bits never depend on
// scheduling, and the chunking depends only on the shape (not on the device).
#include "kernels/common/int_arith.h"
#include "kernels/cuda/context.h"
#include "kernels/cuda/ops_cuda.h"

namespace kiln::cuda {
namespace {

constexpr int64_t kRowChunk = 8192;  // elements of r per block when inner == 1
constexpr int64_t kColChunk = 64;    // elements of r per thread when inner > 1
// Rows this short (inner == 1) go to the column kernel, a thread per row: a block of kThreads with its
// barrier tree per row would leave most of its threads idle (a [65536, 2] sum took 65536 such blocks).
constexpr int64_t kShortRow = kColChunk;

// Running sum of elements of T; integers in i64, wrapping there as the CPU's (kernels/common/int_arith.h).
template <typename T> struct SumR {
  using State = std::conditional_t<is_float_v<T>, double, int64_t>;
  __device__ static State init() { return State(0); }
  __device__ static State from(const T* p, int64_t) { return State(ld(p)); }
  __device__ static State combine(State a, State b) { return math::wrap_add(a, b); }
};

// The best element so far and where it was (index along r; -1 when empty).
template <typename A> struct Best {
  A v;
  int64_t i;
};
template <typename T, bool IsMax> struct ExtremeR {
  using A = DAcc<T>;
  using State = Best<A>;
  __device__ static State init() { return {A(0), -1}; }
  __device__ static State from(const T* p, int64_t i) { return {ld(p), i}; }
  // Keeps the earlier element unless the later one is strictly better; NaN beats everything.
  __device__ static State combine(State a, State b) {
    if (a.i < 0) return b;
    if (b.i < 0) return a;
    const State& first = a.i < b.i ? a : b;
    const State& second = a.i < b.i ? b : a;
    if constexpr (is_float_v<T>) {
      if (first.v != first.v) return first;
      if (second.v != second.v) return second;
    }
    return (IsMax ? second.v > first.v : second.v < first.v) ? second : first;
  }
};

// Pass 2+ reads the states of pass 1.
template <typename R> struct StateR {
  using State = typename R::State;
  __device__ static State init() { return R::init(); }
  __device__ static State from(const State* p, int64_t) { return *p; }
  __device__ static State combine(State a, State b) { return R::combine(a, b); }
};

enum class Out : int { state, value, index };

template <typename S, typename TO> __device__ __forceinline__ void write_out(void* dst, int64_t at, const S& s, Out how) {
  if constexpr (requires { s.i; }) {
    if (how == Out::state) {
      static_cast<S*>(dst)[at] = s;
    } else if (how == Out::index) {
      static_cast<int64_t*>(dst)[at] = s.i;
    } else {
      st(static_cast<TO*>(dst) + at, s.v);
    }
  } else {
    if (how == Out::state) {
      static_cast<S*>(dst)[at] = s;
    } else {
      st(static_cast<TO*>(dst) + at, s);
    }
  }
}

// inner == 1, r > kShortRow. Launch: one block of kThreads per (row o, chunk c) of [outer, r]; thread t folds
// elements c*chunk + t, + kThreads, ... (coalesced), then the block combines its threads in a fixed
// tree. Memory: each element read once; one state written per block.
template <typename R, typename TIn, typename TO>
__global__ void rows_kernel(const TIn* src, void* dst, int64_t r, int64_t chunk, int64_t nchunks, Out how) {
  using S = typename R::State;
  __shared__ S buf[kThreads];
  const int64_t o = blockIdx.x / nchunks, c = blockIdx.x % nchunks;
  const int64_t i0 = c * chunk, i1 = min(r, i0 + chunk);
  const TIn* row = src + o * r;
  S acc = R::init();
  for (int64_t i = i0 + threadIdx.x; i < i1; i += blockDim.x) acc = R::combine(acc, R::from(row + i, i));
  buf[threadIdx.x] = acc;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (int(threadIdx.x) < s) buf[threadIdx.x] = R::combine(buf[threadIdx.x], buf[threadIdx.x + s]);
    __syncthreads();
  }
  if (threadIdx.x == 0) write_out<S, TO>(dst, blockIdx.x, buf[0], how);
}

// inner > 1, or rows of at most kShortRow. Launch: grid-stride, one thread per (o, c, j): it folds
// src[o, c*chunk .. , j] in order into out[o, c, j] (neighbouring threads read neighbouring j: coalesced;
// for short rows, inner == 1, each thread reads its own row, r elements after its neighbour's, so a warp
// touches a few cache lines). Memory: each element read once; one state written per thread.
template <typename R, typename TIn, typename TO>
__global__ void cols_kernel(const TIn* src, void* dst, int64_t outer, int64_t r, int64_t inner, int64_t chunk,
                            int64_t nchunks, Out how) {
  using S = typename R::State;
  const int64_t total = outer * nchunks * inner;
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < total; t += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = t % inner, oc = t / inner, c = oc % nchunks, o = oc / nchunks;
    const int64_t i0 = c * chunk, i1 = min(r, i0 + chunk);
    const TIn* p = src + (o * r) * inner + j;
    S acc = R::init();
    // Pass 1 indexes along r; later passes carry the index inside the state.
    for (int64_t i = i0; i < i1; ++i) acc = R::combine(acc, R::from(p + i * inner, i));
    write_out<S, TO>(dst, t, acc, how);
  }
}

template <typename R, typename T, typename TO>
void run(const T* src, void* dst, int64_t outer, int64_t r, int64_t inner, Out final_how) {
  using S = typename R::State;
  cudaStream_t stream = current().stream;
  const bool rows = inner == 1 && r > kShortRow;
  const int64_t chunk = rows ? kRowChunk : kColChunk;
  int64_t nchunks = std::max<int64_t>(1, (r + chunk - 1) / chunk);
  // The row kernels take a block per (row, chunk): a grid's x dimension stops at 2^31 - 1.
  KILN_CHECK(!rows || outer * nchunks <= int64_t(INT32_MAX), "cuda reduce: ", outer, " rows of ", r,
             " elements need more than 2^31 - 1 blocks; reduce in parts");
  if (nchunks == 1) {
    if (rows) {
      launch("rows_kernel", rows_kernel<R, T, TO>, unsigned(outer), kThreads, 0, stream, src, dst, r, chunk, 1,
             final_how);
    } else {
      launch("cols_kernel", cols_kernel<R, T, TO>, grid_for(outer * inner), kThreads, 0, stream, src, dst, outer, r,
             inner, chunk, 1, final_how);
    }
    return;
  }
  // Pass 1 into states [outer, nchunks, inner], then fold the states until one chunk is left.
  DeviceBuffer states(size_t(outer * nchunks * inner) * sizeof(S));
  if (rows) {
    launch("rows_kernel", rows_kernel<R, T, TO>, unsigned(outer * nchunks), kThreads, 0, stream, src, states.get(), r,
           chunk, nchunks, Out::state);
  } else {
    launch("cols_kernel", cols_kernel<R, T, TO>, grid_for(outer * nchunks * inner), kThreads, 0, stream, src,
           states.get(), outer, r, inner, chunk, nchunks, Out::state);
  }
  DeviceBuffer next;
  const S* cur = states.get<S>();
  int64_t n = nchunks;
  while (true) {
    const int64_t nc = std::max<int64_t>(1, (n + chunk - 1) / chunk);
    const bool last = nc == 1;
    DeviceBuffer out(last ? 0 : size_t(outer * nc * inner) * sizeof(S));
    void* target = last ? dst : out.get();
    const Out how = last ? final_how : Out::state;
    if (rows) {
      launch("rows_kernel", rows_kernel<StateR<R>, S, TO>, unsigned(outer * nc), kThreads, 0, stream, cur, target, n,
             chunk, nc, how);
    } else {
      launch("cols_kernel", cols_kernel<StateR<R>, S, TO>, grid_for(outer * nc * inner), kThreads, 0, stream, cur,
             target, outer, n, inner, chunk, nc, how);
    }
    if (last) return;
    next = std::move(out);
    cur = next.get<S>();
    n = nc;
  }
}

}  // namespace

void reduce(ReduceOp op, void* dst, DType dst_dtype, const void* src, DType src_dtype, int64_t outer, int64_t r,
            int64_t inner) {
  if (outer * inner == 0) return;
  KILN_ASSERT(r > 0 || op == ReduceOp::sum, "max/min over an empty dim");
  visit_dtype(src_dtype, [&](auto ti) {
    using T = decltype(ti);
    const T* s = static_cast<const T*>(src);
    switch (op) {
      case ReduceOp::sum: {
        using TO = std::conditional_t<is_float_v<T>, T, int64_t>;
        KILN_ASSERT(dst_dtype == DTypeOf<TO>::value, "cuda reduce: sum of ", src_dtype, " writes ", DTypeOf<TO>::value,
                    ", not ", dst_dtype);
        return run<SumR<T>, T, TO>(s, dst, outer, r, inner, Out::value);
      }
      case ReduceOp::max: return run<ExtremeR<T, true>, T, T>(s, dst, outer, r, inner, Out::value);
      case ReduceOp::min: return run<ExtremeR<T, false>, T, T>(s, dst, outer, r, inner, Out::value);
      case ReduceOp::argmax: return run<ExtremeR<T, true>, T, int64_t>(s, dst, outer, r, inner, Out::index);
      case ReduceOp::argmin: return run<ExtremeR<T, false>, T, int64_t>(s, dst, outer, r, inner, Out::index);
    }
  });
}

}  // namespace kiln::cuda
