// CUDA kernels of batch norm, with the semantics of kernels/cpu/batch_norm.cpp: cuDNN for training
// by default, handwritten kernels with sums in a fixed order for eval and deterministic mode.
//
// Why cuDNN for the training path by default: BN reduces each channel over N*H*W with only
// 64..2048 channels, so filling the GPU needs every channel split across many blocks and combined,
// a pass for the statistics and one for y, and in backward a fused pass for the two sums and gx.
// cuDNN ships that, tuned per architecture, and ResNet spends a real share of its step in it. Its
// conventions match the CPU's: exponentialAverageFactor = momentum (running = (1-m)*running +
// m*batch), the running variance takes the unbiased batch variance, and the saved inverse variance
// is 1/sqrt(biased var + eps), our rstd. But cudnnBatchNormalizationBackward is not guaranteed
// reproducible, and its one-pass variance loses digits on near-constant channels; so in
// deterministic mode (cuda::deterministic()) training uses the handwritten kernels below, with the
// CPU's two-pass formulas and sums in a fixed order. So does every call after a cuDNN batch-norm
// call returned an error on a healthy device (g_cudnn_bn): one line on stderr says so; and every
// call over more than 2^31-1 elements, which cuDNN's descriptors cannot hold, and every training call
// with an eps below CUDNN_BN_MIN_EPSILON, which cuDNN refuses (libplan::cudnn_bn_fits).
//
// The handwritten path splits each channel's n*hw values into fixed chunks (bn_chunking: the
// split depends on the shape only), reduces a chunk per block into an f64 partial, sums the
// partials of a channel in chunk order, then applies a per-channel affine map. Eval forward is
// that affine map alone; every backward that cuDNN does not take (eval mode, training without gx,
// deterministic mode) is partials + finish + apply.
#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <type_traits>

#include "kernels/common/bn_plan.h"
#include "kernels/cuda/context.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/nn_common.cuh"
#include "kernels/cuda/ops_cuda.h"

namespace kiln::cuda {
using namespace nn_detail;
namespace {

constexpr int64_t kBnChunkMin = 8192;  // values of a channel per block, at least (32 per thread)
constexpr int64_t kBnMaxChunks = 256;  // chunks per channel, at most (gridDim.y, partial buffer size)

struct BnChunking {
  int64_t chunk, chunks;
};
inline BnChunking bn_chunking(int64_t c, int64_t count) {
  KILN_CHECK(c <= INT_MAX, "cuda batch_norm: at most 2^31-1 channels, got ", c);
  const int64_t chunk = std::max(kBnChunkMin, (count + kBnMaxChunks - 1) / kBnMaxChunks);
  return {chunk, std::max<int64_t>(1, (count + chunk - 1) / chunk)};
}

// Bytes of one per-channel slot in a scratch buffer: c values rounded up to 256 bytes, so that every
// slot cuDNN reads starts aligned.
inline size_t bn_slot_bytes(int64_t c, size_t elem) { return (size_t(c) * elem + 255) / 256 * 256; }

#ifndef KILN_CUDA_EMULATION  // the emulator has no cuDNN: batch norm takes the handwritten kernels there
static_assert(libplan::kCudnnBnMinEpsilon == CUDNN_BN_MIN_EPSILON,
              "kernels/common/bn_plan.h: kCudnnBnMinEpsilon must be cudnn.h's CUDNN_BN_MIN_EPSILON");

struct BnTensor {
  cudnnTensorDescriptor_t d = nullptr;
  // [n, c, h, 1] in NCHW, or in NHWC (memory [n, h, c]) when nhwc.
  BnTensor(cudnnDataType_t t, int64_t n, int64_t c, int64_t h, bool nhwc = false) {
    KILN_CUDNN_OK(cudnnCreateTensorDescriptor(&d));
    const cudnnStatus_t s = cudnnSetTensor4dDescriptor(d, nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW, t, int(n),
                                                       int(c), int(h), 1);
    if (s != CUDNN_STATUS_SUCCESS) cudnnDestroyTensorDescriptor(d);
    KILN_CUDNN_OK(s);
  }
  ~BnTensor() { cudnnDestroyTensorDescriptor(d); }
  BnTensor(const BnTensor&) = delete;
  BnTensor& operator=(const BnTensor&) = delete;
};

void check_cudnn_bn(int64_t n, int64_t c, int64_t hw, double eps) {
  // bn_forward_core and bn_backward_core send larger shapes and a smaller eps to the handwritten
  // kernels (libplan::cudnn_bn_fits): these name a caller that did not ask it.
  KILN_CHECK(libplan::cudnn_bn_fits(n, c, hw, CUDNN_BN_MIN_EPSILON),
             "cuda batch_norm: cuDNN takes at most 2^31-1 elements, got [", n, ", ", c, ", ", hw, "]");
  KILN_CHECK(eps >= CUDNN_BN_MIN_EPSILON, "cuda batch_norm: eps ", eps, " is below cuDNN's minimum ",
             CUDNN_BN_MIN_EPSILON);
}

// Cleared for the process when a cuDNN batch-norm call returns an error on a healthy device (a
// cuDNN build whose kernels this driver cannot load, say): batch norm then runs on the handwritten
// kernels, which compute the same statistics (the saved mean and rstd mean the same in both, so a
// forward of one and a backward of the other agree). A failure that leaves the device in an error
// state (an earlier kernel's bad access) is reported as that, not hidden.
std::atomic<bool> g_cudnn_bn{true};

bool cudnn_bn_runs(cudnnStatus_t st, const char* call) {
  if (st == CUDNN_STATUS_SUCCESS) return true;
  const cudaError_t launch = cudaGetLastError();  // clears a launch error; a sticky one stays
  const cudaError_t now = cudaStreamSynchronize(current().stream);
  KILN_CHECK(now == cudaSuccess, "cuda batch_norm: ", call, " failed: ", cudnnGetErrorString(st),
             "; the device is in an error state (", cudaGetErrorName(now), ": ", cudaGetErrorString(now),
             "), which an earlier kernel left: rerun with CUDA_LAUNCH_BLOCKING=1 to find it");
  if (g_cudnn_bn.exchange(false))
    std::fprintf(stderr, "kiln: cuda batch_norm: %s failed (%s%s%s); batch norm runs on Kiln's kernels from now on\n",
                 call, cudnnGetErrorString(st), launch == cudaSuccess ? "" : ", ",
                 launch == cudaSuccess ? "" : cudaGetErrorString(launch));
  return false;
}

bool cudnn_bn_usable() { return !deterministic() && g_cudnn_bn.load(); }

// c ones of T for cuDNN's stand-in scale (the backend's fill kernel).
template <typename T> void fill_ones(T* p, int64_t c) {
  TensorDesc d;
  d.data = p;
  d.dtype = std::is_same_v<T, double> ? DType::f64 : DType::f32;
  d.ndim = 1;
  d.shape[0] = c;
  d.strides[0] = 1;
  fill(d, 1.0);
}
#else
bool cudnn_bn_usable() { return false; }  // the emulator has no cuDNN
#endif

// Value q of a channel's n*hw values is at image i = q / hw, offset j = q % hw; steps q by a fixed
// stride with one compare instead of a 64-bit division per step.
struct BnWalk {
  int64_t i, j, di, dj;
  __device__ BnWalk(int64_t q, int64_t stride, int64_t hw)
      : i(q / hw), j(q - (q / hw) * hw), di(stride / hw), dj(stride - (stride / hw) * hw) {}
  __device__ void next(int64_t hw) {
    i += di;
    j += dj;
    if (j >= hw) {
      j -= hw;
      ++i;
    }
  }
};

enum class BnSum : int {
  x,        // sum x                                 (forward, pass 1)
  dev2,     // sum (x - mean)^2                      (forward, pass 2: no cancellation)
  grad,     // sum gy and sum gy * (x - mean)        (backward)
};

// One value's share of the sums of kind kSum: x at off (and gy), the channel's mean mf as T.
template <typename T, BnSum kSum>
__device__ __forceinline__ void bn_accumulate(T& a, T& b, const T* x, const T* gy, int64_t off, T mf) {
  if constexpr (kSum == BnSum::x) {
    a += x[off];
  } else if constexpr (kSum == BnSum::dev2) {
    const T d = x[off] - mf;
    a += d * d;
  } else {
    const T g = gy[off];
    a += g;
    b += g * (x[off] - mf);
  }
}

// Partial sums of one chunk of one channel. Launch: grid (c, chunks) blocks of kThreads; block
// (ch, k) owns values [k*chunk, min((k+1)*chunk, n*hw)) of channel ch, thread t the values t,
// t + kThreads, ... of it (a warp reads 32 consecutive elements of an image row, split only where
// an image's hw values end). Per-thread sums in T as the CPU's lanes, the block tree in f64; thread 0
// writes partial[ch*chunks + k] (and, for grad, the second sum at partial[(c + ch)*chunks + k]).
// mean is read as T, the CPU's mf. Traffic: x (and gy) read once; 8 or 16 bytes written per block.
template <typename T, BnSum kSum>
__global__ void __launch_bounds__(kThreads) bn_partial_kernel(int64_t n, int64_t c, int64_t hw, int64_t chunk,
                                                              const T* x, const T* gy, const T* mean,
                                                              double* partial) {
  __shared__ double sred[32];
  const int64_t ch = blockIdx.x, k = blockIdx.y, chunks = gridDim.y;
  const int64_t q1 = min(n * hw, (k + 1) * chunk);
  const T mf = kSum == BnSum::x ? T(0) : mean[ch];
  T a = T(0), b = T(0);
  BnWalk w(k * chunk + threadIdx.x, blockDim.x, hw);
  for (int64_t q = k * chunk + threadIdx.x; q < q1; q += blockDim.x, w.next(hw)) {
    bn_accumulate<T, kSum>(a, b, x, gy, (w.i * c + ch) * hw + w.j, mf);
  }
  const double ta = block_sum(double(a), sred);
  if constexpr (kSum == BnSum::grad) {
    const double tb = block_sum(double(b), sred);
    if (threadIdx.x == 0) partial[(c + ch) * chunks + k] = tb;
  }
  if (threadIdx.x == 0) partial[ch * chunks + k] = ta;
}

// The partial sums of bn_partial_kernel for hw == 1: memory [rows, c] (channels_last, whose [n, hw,
// c] the handwritten path takes as [n*hw, c, 1], and BatchNorm1d's [n, c]), where a channel's values
// lie c apart and a thread per value of one channel would read uncoalesced. Launch: grid
// (ceil(c/32), chunks) blocks of 256 = 32 channels x 8 row slices; thread (tx, ty) sums rows
// k*chunk + ty, + 8, ... of channel 32*blockIdx.x + tx in T (a warp reads 32 consecutive channels of
// a row), the 8 slices add up in f64 in slice order; writes partial as bn_partial_kernel does.
// Traffic: x (and gy) read once, coalesced; 8 or 16 bytes written per channel and chunk.
template <typename T, BnSum kSum>
__global__ void __launch_bounds__(kThreads) bn_partial_rows_kernel(int64_t rows, int64_t c, int64_t chunk,
                                                                   const T* x, const T* gy, const T* mean,
                                                                   double* partial) {
  __shared__ double sa[8][32], sb[8][32];
  const int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;
  const int64_t ch = int64_t(blockIdx.x) * 32 + tx, k = blockIdx.y, chunks = gridDim.y;
  T a = T(0), b = T(0);
  if (ch < c) {
    const T mf = kSum == BnSum::x ? T(0) : mean[ch];
    for (int64_t r = k * chunk + ty, r1 = min(rows, (k + 1) * chunk); r < r1; r += 8)
      bn_accumulate<T, kSum>(a, b, x, gy, r * c + ch, mf);
  }
  sa[ty][tx] = double(a);
  sb[ty][tx] = double(b);
  __syncthreads();
  if (ty == 0 && ch < c) {
    double ta = sa[0][tx], tb = sb[0][tx];
    for (int s = 1; s < 8; ++s) {
      ta += sa[s][tx];
      tb += sb[s][tx];
    }
    partial[ch * chunks + k] = ta;
    if constexpr (kSum == BnSum::grad) partial[(c + ch) * chunks + k] = tb;
  }
}

// Launches the partial sums of one kind over [n, c, hw]: channel-major blocks, or rows of channels
// when hw == 1.
template <typename T, BnSum kSum>
void bn_partials(Context& ctx, int64_t n, int64_t c, int64_t hw, const BnChunking& ck, const T* x, const T* gy,
                 const T* mean, double* partial) {
  if (hw == 1)
    launch("bn_partial_rows_kernel", bn_partial_rows_kernel<T, kSum>, dim3(unsigned((c + 31) / 32), unsigned(ck.chunks)),
           kThreads, 0, ctx.stream, n, c, ck.chunk, x, gy, mean, partial);
  else
    launch("bn_partial_kernel", bn_partial_kernel<T, kSum>, dim3(unsigned(c), unsigned(ck.chunks)), kThreads, 0,
           ctx.stream, n, c, hw, ck.chunk, x, gy, mean, partial);
}

// Forward, between the two passes: mean[ch] = (sum of the channel's partials, in chunk order) / count.
// Launch: grid_for(c), a thread per channel. Traffic: chunks doubles read, one T written per channel.
template <typename T>
__global__ void __launch_bounds__(kThreads) bn_mean_kernel(int64_t c, int64_t chunks, int64_t count,
                                                           const double* partial, T* mean) {
  for (int64_t ch = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; ch < c; ch += int64_t(gridDim.x) * blockDim.x) {
    double s = 0;
    for (int64_t k = 0; k < chunks; ++k) s += partial[ch * chunks + k];
    mean[ch] = T(s / double(count));
  }
}

// Channel ch's saved statistics and its affine map y = x * sc + sh (sc = rstd * gamma,
// sh = beta - mean * sc), in f64 as on the CPU, into mean, rstd and affine [2, c].
template <typename T>
__device__ void bn_write_stats(int64_t ch, int64_t c, double m, double rs, const T* gamma, const T* beta, T* mean,
                               T* rstd, T* affine) {
  mean[ch] = T(m);
  rstd[ch] = T(rs);
  const T sc = T(rs * (gamma ? double(gamma[ch]) : 1.0));
  affine[ch] = sc;
  affine[c + ch] = T((beta ? double(beta[ch]) : 0.0) - m * double(sc));
}

// Forward, training, after both passes: the CPU's per-channel arithmetic in f64. m and the sum of
// squared deviations q from the partials (in chunk order; m the same bits as bn_mean_kernel's),
// the running buffers updated with momentum (unbiased variance), mean, rstd and the affine pair
// (sc, sh) into `affine` [2, c]. Launch: grid_for(c), a thread per channel. Traffic per channel:
// 2*chunks doubles and up to 4 T read; up to 6 T written.
template <typename T>
__global__ void __launch_bounds__(kThreads) bn_stats_finish_kernel(int64_t c, int64_t chunks, int64_t count,
                                                                   double eps, double momentum, const double* partial,
                                                                   const T* gamma, const T* beta, T* rmean, T* rvar,
                                                                   T* mean, T* rstd, T* affine) {
  for (int64_t ch = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; ch < c; ch += int64_t(gridDim.x) * blockDim.x) {
    double s = 0, q = 0;
    for (int64_t k = 0; k < chunks; ++k) s += partial[ch * chunks + k];
    for (int64_t k = 0; k < chunks; ++k) q += partial[(c + ch) * chunks + k];
    const double m = s / double(count), v = q / double(count);
    if (rmean) rmean[ch] = T((1 - momentum) * double(rmean[ch]) + momentum * m);
    if (rvar) {
      const double unbiased = count > 1 ? q / double(count - 1) : v;
      rvar[ch] = T((1 - momentum) * double(rvar[ch]) + momentum * unbiased);
    }
    bn_write_stats(ch, c, m, 1.0 / ::sqrt(v + eps), gamma, beta, mean, rstd, affine);
  }
}

// Eval forward, per channel: mean/rstd from the running buffers and the affine map y = x*sc + sh,
// computed in f64 as on the CPU. Launch: grid_for(c), a thread per channel. Traffic per channel:
// up to 4 T read; mean, rstd and the (sc, sh) pair into `affine` [2, c] written.
template <typename T>
__global__ void __launch_bounds__(kThreads) bn_eval_prepare_kernel(int64_t c, double eps, const T* gamma,
                                                                   const T* beta, const T* rmean, const T* rvar,
                                                                   T* mean, T* rstd, T* affine) {
  for (int64_t ch = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; ch < c; ch += int64_t(gridDim.x) * blockDim.x) {
    bn_write_stats(ch, c, double(rmean[ch]), 1.0 / ::sqrt(double(rvar[ch]) + eps), gamma, beta, mean, rstd, affine);
  }
}

// Forward (eval, and training in deterministic mode), elementwise: y = x*sc + sh with the pair of
// `affine` [2, c]. Launch: grid_for(n*c*hw), grid-stride; a thread per element.
// Traffic: one T read and one written per element (sc/sh are cache hits).
template <typename T>
__global__ void __launch_bounds__(kThreads) bn_apply_kernel(int64_t total, int64_t c, int64_t hw, const T* x,
                                                            const T* affine, T* y) {
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t ch = (e / hw) % c;
    y[e] = x[e] * affine[ch] + affine[c + ch];
  }
}

// Backward, per channel, after bn_partial_kernel<grad> (or with chunks == 0 when no sum is needed:
// eval mode without ggamma/gbeta): sg = sum gy and sgd = sum gy*(x - mean) in chunk order, then
// the CPU's arithmetic in f64: ggamma = sgd*rstd, gbeta = sg where non-null, and the coefficients
// of gx = k1*gy + k2*x + k3 into coef [3, c] where non-null (eval: k2 = k3 = 0, still applied, so
// that an inf/NaN in x propagates exactly as on the CPU). Launch: grid_for(c), a thread per
// channel. Traffic per channel: 2*chunks doubles and 3 T read, up to 5 T written.
template <typename T>
__global__ void __launch_bounds__(kThreads) bn_backward_finish_kernel(int64_t c, int64_t chunks, int64_t count,
                                                                      bool training, const double* partial,
                                                                      const T* gamma, const T* mean, const T* rstd,
                                                                      T* ggamma, T* gbeta, T* coef) {
  for (int64_t ch = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; ch < c; ch += int64_t(gridDim.x) * blockDim.x) {
    double sg = 0, sgd = 0;
    for (int64_t k = 0; k < chunks; ++k) sg += partial[ch * chunks + k];
    for (int64_t k = 0; k < chunks; ++k) sgd += partial[(c + ch) * chunks + k];
    const double rs = double(rstd[ch]), sgx = sgd * rs;
    if (ggamma) ggamma[ch] = T(sgx);
    if (gbeta) gbeta[ch] = T(sg);
    if (!coef) continue;
    const double m = double(mean[ch]), gm = gamma ? double(gamma[ch]) : 1.0;
    const double cnt = double(count > 1 ? count : 1);
    const double k1 = gm * rs;
    const double k2 = training ? -gm * rs * rs * sgx / cnt : 0.0;
    const double k3 = training ? -gm * rs * sg / cnt - k2 * m : 0.0;
    coef[ch] = T(k1);
    coef[c + ch] = T(k2);
    coef[2 * c + ch] = T(k3);
  }
}

// Backward, elementwise: gx = k1*gy + k2*x + k3 with the coefficients of coef [3, c], or k1*gy where
// x is null (eval mode: an inf or NaN x must not reach gx through 0 * x). Launch:
// grid_for(n*c*hw), grid-stride; a thread per element. Traffic: x and gy read once, gx written once.
template <typename T>
__global__ void __launch_bounds__(kThreads) bn_backward_apply_kernel(int64_t total, int64_t c, int64_t hw,
                                                                     const T* x, const T* gy, const T* coef, T* gx) {
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t ch = (e / hw) % c;
    gx[e] = x ? coef[ch] * gy[e] + coef[c + ch] * x[e] + coef[2 * c + ch] : coef[ch] * gy[e];
  }
}

// The handwritten training forward (deterministic mode): pass 1 sums x, bn_mean_kernel makes the
// mean, pass 2 sums the squared deviations from it, the finish kernel makes the statistics, running
// buffers and the affine map, and bn_apply_kernel writes y. 5 launches, x read three times.
template <typename T>
void bn_forward_handwritten(Context& ctx, int64_t n, int64_t c, int64_t hw, double eps, double momentum, const T* x,
                            const T* gamma, const T* beta, T* rmean, T* rvar, T* y, T* mean, T* rstd) {
  const int64_t count = n * hw;
  const BnChunking ck = bn_chunking(c, count);
  DeviceBuffer partial(size_t(2 * c * ck.chunks) * sizeof(double));
  DeviceBuffer affine(size_t(2 * c) * sizeof(T));
  double* part = partial.get<double>();
  bn_partials<T, BnSum::x>(ctx, n, c, hw, ck, x, nullptr, nullptr, part);
  launch("bn_mean_kernel", bn_mean_kernel<T>, grid_for(c), kThreads, 0, ctx.stream, c, ck.chunks, count, part, mean);
  bn_partials<T, BnSum::dev2>(ctx, n, c, hw, ck, x, nullptr, mean, part + c * ck.chunks);
  launch("bn_stats_finish_kernel", bn_stats_finish_kernel<T>, grid_for(c), kThreads, 0, ctx.stream, c, ck.chunks, count,
         eps, momentum, part, gamma, beta, rmean, rvar, mean, rstd, affine.get<T>());
  launch("bn_apply_kernel", bn_apply_kernel<T>, grid_for(n * c * hw), kThreads, 0, ctx.stream, n * c * hw, c, hw, x,
         affine.get<T>(), y);
}

// The handwritten backward: the two sums per channel (skipped when nothing needs them), the finish
// kernel (ggamma, gbeta, gx's coefficients) and, with gx, the elementwise pass.
template <typename T>
void bn_backward_handwritten(Context& ctx, int64_t n, int64_t c, int64_t hw, bool training, const T* x,
                             const T* gamma, const T* mean, const T* rstd, const T* gy, T* gx, T* ggamma, T* gbeta) {
  const int64_t count = n * hw, total = n * c * hw;
  const bool sums = count > 0 && (ggamma || gbeta || (training && gx));
  const BnChunking ck = bn_chunking(c, count);
  const int64_t chunks = sums ? ck.chunks : 0;
  DeviceBuffer partial(size_t(2 * c * chunks) * sizeof(double));
  DeviceBuffer coef(gx && total > 0 ? size_t(3 * c) * sizeof(T) : 0);
  if (sums) bn_partials<T, BnSum::grad>(ctx, n, c, hw, ck, x, gy, mean, partial.get<double>());
  launch("bn_backward_finish_kernel", bn_backward_finish_kernel<T>, grid_for(c), kThreads, 0, ctx.stream, c, chunks,
         count, training, partial.get<double>(), gamma, mean, rstd, ggamma, gbeta, coef.get<T>());
  if (!coef.get<T>()) return;
  launch("bn_backward_apply_kernel", bn_backward_apply_kernel<T>, grid_for(total), kThreads, 0, ctx.stream, total, c,
         hw, training ? x : nullptr, gy, coef.get<T>(), gx);
}

// The fused form's epilogue, elementwise in any layout: y = relu(y + residual) (either part optional).
// Launch: grid_for(total), grid-stride. Traffic: y read and written, residual read.
template <typename T> __global__ void __launch_bounds__(kThreads)
    bn_epilogue_kernel(int64_t total, const T* residual, bool relu, T* y) {
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    T v = y[e];
    if (residual) v = v + residual[e];
    y[e] = relu ? (v <= T(0) ? T(0) : v) : v;
  }
}
// ReLU's gradient from its output: o = y <= 0 ? 0 : g. Launch: grid_for(total), grid-stride.
template <typename T> __global__ void __launch_bounds__(kThreads)
    bn_relu_mask_kernel(int64_t total, const T* g, const T* y, T* o) {
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x)
    o[e] = y[e] <= T(0) ? T(0) : g[e];
}

void bn_forward_core(DType dt, int64_t n, int64_t c, int64_t hw, double eps, double momentum, bool training,
                     const void* x, const void* gamma, const void* beta, void* running_mean, void* running_var, void* y,
                     void* mean, void* rstd, bool nhwc) {
  if (c == 0) return;
  Context& ctx = current();
  // NHWC memory [n, hw, c] is NCHW [n*hw, c, 1] with the same values of each channel in the same
  // order: the handwritten kernels (eval, and training in deterministic mode) take it as that and
  // compute exactly what they compute on the NCHW layout. Only cuDNN's path gets NHWC descriptors.
  // cuDNN's descriptors take at most 2^31-1 elements, and cuDNN refuses an eps below
  // CUDNN_BN_MIN_EPSILON: such calls take the handwritten kernels.
  const bool cudnn = cudnn_bn_usable() && libplan::cudnn_bn_fits(n, c, hw, eps);
  if (nhwc && (!training || !cudnn))
    return bn_forward_core(dt, n * hw, c, 1, eps, momentum, training, x, gamma, beta, running_mean, running_var, y,
                           mean, rstd, false);
  dispatch_nn(dt, "batch_norm", [&](auto tag) {
    using T = decltype(tag);
    if (!training) {
      KILN_CHECK(running_mean && running_var, "cuda batch_norm: eval mode needs running_mean and running_var");
      DeviceBuffer affine(size_t(2 * c) * sizeof(T));
      launch("bn_eval_prepare_kernel", bn_eval_prepare_kernel<T>, grid_for(c), kThreads, 0, ctx.stream, c, eps,
             cp<T>(gamma), cp<T>(beta), cp<T>(running_mean), cp<T>(running_var), mp<T>(mean), mp<T>(rstd),
             affine.get<T>());
      const int64_t total = n * c * hw;
      if (total == 0) return;
      launch("bn_apply_kernel", bn_apply_kernel<T>, grid_for(total), kThreads, 0, ctx.stream, total, c, hw, cp<T>(x),
             affine.get<T>(), mp<T>(y));
      return;
    }
    KILN_CHECK(n * hw > 1, "cuda batch_norm: training needs more than one value per channel, got [", n, ", ", c, ", ",
               hw, "]");
    if (!cudnn) {
      bn_forward_handwritten<T>(ctx, n, c, hw, eps, momentum, cp<T>(x), cp<T>(gamma), cp<T>(beta),
                                mp<T>(running_mean), mp<T>(running_var), mp<T>(y), mp<T>(mean), mp<T>(rstd));
      return;
    }
#ifndef KILN_CUDA_EMULATION
    check_cudnn_bn(n, c, hw, eps);
    // cuDNN needs scale and bias, and both running buffers or neither: stand-ins for what is missing
    // (a zeroed one for the missing running buffer: cuDNN reads it before it blends in the batch).
    const bool stand_in_running = (running_mean == nullptr) != (running_var == nullptr);
    const size_t slot = bn_slot_bytes(c, sizeof(T));
    DeviceBuffer scratch(3 * slot);
    T* ones = scratch.get<T>();
    T* zeros = reinterpret_cast<T*>(scratch.get<char>() + slot);
    T* spare = reinterpret_cast<T*>(scratch.get<char>() + 2 * slot);
    if (!gamma) fill_ones(ones, c);
    if (!beta) KILN_CUDA_OK(cudaMemsetAsync(zeros, 0, size_t(c) * sizeof(T), ctx.stream));
    if (stand_in_running) KILN_CUDA_OK(cudaMemsetAsync(spare, 0, size_t(c) * sizeof(T), ctx.stream));
    void* rm = stand_in_running && !running_mean ? spare : running_mean;
    void* rv = stand_in_running && !running_var ? spare : running_var;
    const cudnnDataType_t type = std::is_same_v<T, double> ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
    const BnTensor xd(type, n, c, hw, nhwc), pd(type, 1, c, 1);
    const T one = T(1), zero = T(0);  // blend factors: double for double data, float otherwise
    if (!cudnn_bn_runs(cudnnBatchNormalizationForwardTraining(ctx.cudnn(), CUDNN_BATCHNORM_SPATIAL, &one, &zero, xd.d,
                                                              x, xd.d, y, pd.d, gamma ? gamma : ones,
                                                              beta ? beta : zeros, momentum, rm, rv, eps, mean, rstd),
                       "cudnnBatchNormalizationForwardTraining"))
      bn_forward_core(dt, n, c, hw, eps, momentum, training, x, gamma, beta, running_mean, running_var, y, mean, rstd,
                      nhwc);  // now on the handwritten kernels
#endif
  });
}

void bn_backward_core(DType dt, int64_t n, int64_t c, int64_t hw, bool training, double eps, const void* x,
                      const void* gamma, const void* mean, const void* rstd, const void* gy, void* gx, void* ggamma,
                      void* gbeta, bool nhwc) {
  if (c == 0) return;
  Context& ctx = current();
  // NHWC as NCHW [n*hw, c, 1] for the handwritten backward, as in the forward.
  const bool cudnn = cudnn_bn_usable() && libplan::cudnn_bn_fits(n, c, hw, eps);  // as in the forward
  if (nhwc && (!training || !gx || n * hw == 0 || !cudnn))
    return bn_backward_core(dt, n * hw, c, 1, training, eps, x, gamma, mean, rstd, gy, gx, ggamma, gbeta, false);
  dispatch_nn(dt, "batch_norm", [&](auto tag) {
    using T = decltype(tag);
    if (!training || !gx || n * hw == 0 || !cudnn) {
      bn_backward_handwritten<T>(ctx, n, c, hw, training, cp<T>(x), cp<T>(gamma), cp<T>(mean), cp<T>(rstd),
                                 cp<T>(gy), mp<T>(gx), mp<T>(ggamma), mp<T>(gbeta));
      return;
    }
#ifndef KILN_CUDA_EMULATION
    // cuDNN asks for the forward's epsilon (it uses the saved statistics, but the value must agree);
    // one below its minimum took the handwritten kernels above.
    check_cudnn_bn(n, c, hw, eps);
    const size_t slot = bn_slot_bytes(c, sizeof(T));
    DeviceBuffer scratch(3 * slot);
    T* ones = scratch.get<T>();
    if (!gamma) fill_ones(ones, c);
    void* dg = ggamma ? ggamma : scratch.get<char>() + slot;
    void* db = gbeta ? gbeta : scratch.get<char>() + 2 * slot;
    const cudnnDataType_t type = std::is_same_v<T, double> ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
    const BnTensor xd(type, n, c, hw, nhwc), pd(type, 1, c, 1);
    const T one = T(1), zero = T(0);
    if (!cudnn_bn_runs(
            cudnnBatchNormalizationBackward(ctx.cudnn(), CUDNN_BATCHNORM_SPATIAL, &one, &zero, &one, &zero, xd.d, x,
                                            xd.d, gy, xd.d, gx, pd.d, gamma ? gamma : ones, dg, db, eps, mean, rstd),
            "cudnnBatchNormalizationBackward"))
      bn_backward_core(dt, n, c, hw, training, eps, x, gamma, mean, rstd, gy, gx, ggamma, gbeta,
                       nhwc);  // now on the handwritten kernels
#endif
  });
}

}  // namespace

// Batch norm (cuDNN or the handwritten kernels, above), then the residual and ReLU of the fused form as
// one elementwise pass. The CPU fuses them into batch norm's own passes; here cuDNN's fused
// batch-norm + add + activation (NHWC only) would be the next step.
void batch_norm_forward(DType dt, int64_t n, int64_t c, int64_t hw, double eps, double momentum, bool training,
                        const void* x, const void* gamma, const void* beta, void* running_mean, void* running_var,
                        void* y, void* mean, void* rstd, bool nhwc, const void* residual, bool relu) {
  bn_forward_core(dt, n, c, hw, eps, momentum, training, x, gamma, beta, running_mean, running_var, y, mean, rstd,
                  nhwc);
  const int64_t total = n * c * hw;
  if ((!residual && !relu) || total == 0) return;
  dispatch_nn(dt, "batch_norm", [&](auto tag) {
    using T = decltype(tag);
    launch("bn_epilogue_kernel", bn_epilogue_kernel<T>, grid_for(total), kThreads, 0, current().stream, total,
           cp<T>(residual), relu, mp<T>(y));
  });
}

// The fused form's backward: gy masked, y <= 0 ? 0 : gy (into gresidual, or a scratch buffer), then batch norm's.
void batch_norm_backward(DType dt, int64_t n, int64_t c, int64_t hw, bool training, double eps, const void* x,
                         const void* gamma, const void* mean, const void* rstd, const void* gy, void* gx, void* ggamma,
                         void* gbeta, bool nhwc, const void* y, void* gresidual) {
  const int64_t total = n * c * hw;
  if (!y || total == 0) {
    if (gresidual && total > 0)  // a residual without ReLU: its gradient is gy
      KILN_CUDA_OK(
          cudaMemcpyAsync(gresidual, gy, size_t(total) * dtype_size(dt), cudaMemcpyDeviceToDevice, current().stream));
    bn_backward_core(dt, n, c, hw, training, eps, x, gamma, mean, rstd, gy, gx, ggamma, gbeta, nhwc);
    return;
  }
  dispatch_nn(dt, "batch_norm", [&](auto tag) {
    using T = decltype(tag);
    DeviceBuffer scratch(gresidual ? 0 : size_t(total) * sizeof(T));
    T* masked = gresidual ? mp<T>(gresidual) : scratch.get<T>();
    launch("bn_relu_mask_kernel", bn_relu_mask_kernel<T>, grid_for(total), kThreads, 0, current().stream, total,
           cp<T>(gy), cp<T>(y), masked);
    bn_backward_core(dt, n, c, hw, training, eps, x, gamma, mean, rstd, masked, gx, ggamma, gbeta, nhwc);
  });
}

}  // namespace kiln::cuda
