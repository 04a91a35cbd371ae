// CUDA fused optimizer steps (multi-tensor apply): one launch updates every parameter of a group.
// The host cuts each parameter into chunks of kChunk elements and uploads a table of
// (parameter, first element) pairs; block b updates chunk b. The per-element arithmetic is
// kernels/common/optim_math.h, shared with the CPU.
//
// Memory traffic per element: SGD reads w, g (and the momentum buffer) and writes w (and it):
// 12-16 bytes; AdamW reads w, g, m, v and writes w, m, v: 28 bytes. LAMB takes two passes (the
// trust ratio needs the norms of the whole tensor first): 28 + 20 bytes, and its per-tensor
// norms are reduced on the device in a fixed order, so nothing waits for the host. The step number
// (Adam's bias corrections) and the loss scaler's skip flag are read on the device too: each
// thread derives the f32 constants once, from OptimHyper and its chunk's parameter's own step number.
#include <vector>

#include "kernels/common/optim_math.h"
#include "kernels/cuda/context.h"
#include "kernels/cuda/ops_cuda.h"

namespace kiln::cuda {
namespace {

constexpr int64_t kChunk = 65536;

struct Chunk {
  int32_t slice;
  int64_t begin, end;
};

// Launch: one block of kThreads per chunk; thread t updates elements begin + t, + kThreads, ...
__global__ void sgd_kernel(const OptimSlice* slices, const Chunk* chunks, OptimHyper hy) {
  if (optim_math::skipped(hy)) return;
  const optim_math::SgdF h = optim_math::sgd_constants(hy);
  const Chunk c = chunks[blockIdx.x];
  const OptimSlice s = slices[c.slice];
  for (int64_t i = c.begin + threadIdx.x; i < c.end; i += blockDim.x)
    optim_math::sgd(s.w[i], s.g[i], s.s0 ? s.s0 + i : nullptr, s.fresh, h);
}

// Launch: as sgd_kernel.
__global__ void adamw_kernel(const OptimSlice* slices, const Chunk* chunks, OptimHyper hy) {
  if (optim_math::skipped(hy)) return;
  const Chunk c = chunks[blockIdx.x];
  const OptimSlice s = slices[c.slice];
  const optim_math::AdamF h = optim_math::adam_constants(hy, s.step);
  for (int64_t i = c.begin + threadIdx.x; i < c.end; i += blockDim.x) {
    float w = s.w[i], m = s.s0[i], v = s.s1[i];
    optim_math::adam_moments(s.g[i], m, v, h);
    optim_math::adamw_apply(w, m, v, h);
    s.w[i] = w;
    s.s0[i] = m;
    s.s1[i] = v;
  }
}

// LAMB pass 1. Launch: as sgd_kernel; updates the moments and writes the chunk's sums of w^2 and
// u^2 (f64, a fixed tree per block) to partial[2 * chunk].
__global__ void lamb_moments_kernel(const OptimSlice* slices, const Chunk* chunks, OptimHyper hy, double* partial) {
  if (optim_math::skipped(hy)) return;
  __shared__ double smem[32];
  const Chunk c = chunks[blockIdx.x];
  const OptimSlice s = slices[c.slice];
  const optim_math::AdamF h = optim_math::adam_constants(hy, s.step);
  double ws = 0, us = 0;
  for (int64_t i = c.begin + threadIdx.x; i < c.end; i += blockDim.x) {
    float m = s.s0[i], v = s.s1[i];
    optim_math::adam_moments(s.g[i], m, v, h);
    s.s0[i] = m;
    s.s1[i] = v;
    const float w = s.w[i];
    const float u = optim_math::lamb_direction(w, m, v, h);
    ws += double(w * w);
    us += double(u * u);
  }
  ws = block_sum(ws, smem);
  us = block_sum(us, smem);
  if (threadIdx.x == 0) {
    partial[2 * blockIdx.x] = ws;
    partial[2 * blockIdx.x + 1] = us;
  }
}

// LAMB pass 2. Launch: grid-stride, one thread per parameter; sums its chunks' partials in order
// and writes its step factor -lr * trust as f32.
__global__ void lamb_trust_kernel(const int64_t* chunk_begin, int64_t count, const double* partial, OptimHyper hy,
                                  float* step) {
  if (optim_math::skipped(hy)) return;
  const double lr = hy.lr;
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < count; t += int64_t(gridDim.x) * blockDim.x) {
    double ws = 0, us = 0;
    for (int64_t c = chunk_begin[t]; c < chunk_begin[t + 1]; ++c) {
      ws += partial[2 * c];
      us += partial[2 * c + 1];
    }
    step[t] = float(-lr * optim_math::lamb_trust(ws, us));
  }
}

// LAMB pass 3. Launch: as sgd_kernel; w += step * u, with u recomputed from the new moments.
__global__ void lamb_apply_kernel(const OptimSlice* slices, const Chunk* chunks, OptimHyper hy, const float* step) {
  if (optim_math::skipped(hy)) return;
  const Chunk c = chunks[blockIdx.x];
  const OptimSlice s = slices[c.slice];
  const optim_math::AdamF h = optim_math::adam_constants(hy, s.step);
  const float f = step[c.slice];
  for (int64_t i = c.begin + threadIdx.x; i < c.end; i += blockDim.x)
    optim_math::lamb_apply(s.w[i], f, optim_math::lamb_direction(s.w[i], s.s0[i], s.s1[i], h));
}

// Uploads host data for kernels queued next on the compute stream (pageable memory is staged by
// the time cudaMemcpyAsync returns, so the vector may go away).
template <typename T> DeviceBuffer upload(const std::vector<T>& v) {
  DeviceBuffer b(v.size() * sizeof(T));
  if (!v.empty())
    KILN_CUDA_OK(cudaMemcpyAsync(b.get(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice, current().stream));
  return b;
}

}  // namespace

void optimizer_step(OptimKind kind, const OptimSlice* slices, int64_t count, const OptimHyper& h) {
  std::vector<OptimSlice> sl(slices, slices + count);
  std::vector<Chunk> chunks;
  std::vector<int64_t> chunk_begin{0};
  for (int64_t t = 0; t < count; ++t) {
    for (int64_t b = 0; b < sl[size_t(t)].n; b += kChunk)
      chunks.push_back({int32_t(t), b, std::min(sl[size_t(t)].n, b + kChunk)});
    chunk_begin.push_back(int64_t(chunks.size()));
  }
  if (chunks.empty()) return;
  KILN_CHECK(chunks.size() < (size_t(1) << 31), "cuda optimizer step: too many chunks");
  cudaStream_t stream = current().stream;
  const DeviceBuffer d_slices = upload(sl), d_chunks = upload(chunks);
  const auto* ps = d_slices.get<const OptimSlice>();
  const auto* pc = d_chunks.get<const Chunk>();
  const unsigned nblocks = unsigned(chunks.size());
  switch (kind) {
    case OptimKind::sgd: launch("sgd_kernel", sgd_kernel, nblocks, kThreads, 0, stream, ps, pc, h); break;
    case OptimKind::adamw: launch("adamw_kernel", adamw_kernel, nblocks, kThreads, 0, stream, ps, pc, h); break;
    case OptimKind::lamb: {
      const DeviceBuffer partial(chunks.size() * 2 * sizeof(double)), step(size_t(count) * sizeof(float));
      const DeviceBuffer d_begin = upload(chunk_begin);
      launch("lamb_moments_kernel", lamb_moments_kernel, nblocks, kThreads, 0, stream, ps, pc, h,
             partial.get<double>());
      launch("lamb_trust_kernel", lamb_trust_kernel, grid_for(count), kThreads, 0, stream, d_begin.get<const int64_t>(),
             count, partial.get<const double>(), h, step.get<float>());
      launch("lamb_apply_kernel", lamb_apply_kernel, nblocks, kThreads, 0, stream, ps, pc, h, step.get<const float>());
      break;
    }
  }
}

}  // namespace kiln::cuda
