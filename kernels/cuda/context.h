// Per-device state of the CUDA backend and what every .cu file shares: the Context (streams,
// library handles, the device error word), scratch memory, launch helpers and the element types
// as device code sees them. Only for .cu files: it includes the CUDA headers (or, in the emulated
// build of the kernels, kernels/cuda/emulator/cuda_runtime_emulated.h).
#pragma once
#ifdef KILN_CUDA_EMULATION
#include "kernels/cuda/emulator/cuda_runtime_emulated.h"
#else
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#endif

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <string>
#include <type_traits>

#include "base/caching_allocator.h"
#include "kernels/backend.h"
#include "base/half.h"
#include "kernels/cuda/cuda_check.h"

// The libraries' own allocation failures are out-of-memory errors too (OutOfMemory, as KILN_CUDA_OK's).
#define KILN_CUBLAS_OK(call)                                                                                       \
  do {                                                                                                             \
    const cublasStatus_t kiln_cublas_s_ = (call);                                                                  \
    if (kiln_cublas_s_ == CUBLAS_STATUS_ALLOC_FAILED) {                                                            \
      (void)cudaGetLastError();                                                                                    \
      KILN_FAIL_OOM(#call, " failed: ", cublasLtGetStatusName(kiln_cublas_s_), ": ",                               \
                    cublasLtGetStatusString(kiln_cublas_s_));                                                      \
    }                                                                                                              \
    KILN_CHECK(kiln_cublas_s_ == CUBLAS_STATUS_SUCCESS, #call, " failed: ", cublasLtGetStatusName(kiln_cublas_s_), \
               ": ", cublasLtGetStatusString(kiln_cublas_s_));                                                     \
  } while (0)

#define KILN_CUDNN_OK(call)                                                                                    \
  do {                                                                                                         \
    const cudnnStatus_t kiln_cudnn_s_ = (call);                                                                \
    if (kiln_cudnn_s_ == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED) {                               \
      (void)cudaGetLastError();                                                                                \
      KILN_FAIL_OOM(#call, " failed: ", cudnnGetErrorString(kiln_cudnn_s_));                                   \
    }                                                                                                          \
    KILN_CHECK(kiln_cudnn_s_ == CUDNN_STATUS_SUCCESS, #call, " failed: ", cudnnGetErrorString(kiln_cudnn_s_)); \
  } while (0)

// After a kernel launch: a bad configuration or a sticky device error surfaces here, naming the kernel.
#define KILN_LAUNCH_OK(what) KILN_CUDA_OK_NAMED(cudaGetLastError(), what)
#define KILN_CUDA_OK_NAMED(call, what)                                                                                 \
  do {                                                                                                                 \
    const cudaError_t kiln_cuda_e_ = (call);                                                                           \
    if (kiln_cuda_e_ == cudaErrorMemoryAllocation) {                                                                   \
      (void)cudaGetLastError();                                                                                        \
      KILN_FAIL_OOM(what, ": kernel launch failed: ", ::kiln::cuda::cuda_error(kiln_cuda_e_));                         \
    }                                                                                                                  \
    KILN_CHECK(kiln_cuda_e_ == cudaSuccess, what, ": kernel launch failed: ", ::kiln::cuda::cuda_error(kiln_cuda_e_)); \
  } while (0)

namespace kiln::cuda {

// What a kernel found wrong with its input; written to the device error word (first one wins) and
// reported by the next synchronisation (item(), to(cpu), synchronize()). An integer pow with a negative
// exponent is no error: it gives torch's truncated result, as the CPU (kernels/common/int_pow.h).
enum class KernelError : int {
  none = 0,
  index_select,  // an index outside [0, n)
  index_add,
  gather,
  scatter_add,
  max_pool_index,  // a max-pool index outside its plane
  ce_target,       // a cross-entropy target outside [0, classes) that is not ignore_index
  int_div_zero,    // integer division by zero
  int_mod_zero,    // fmod/remainder of integers by zero
};
inline const char* kernel_error_text(KernelError e) {
  switch (e) {
    case KernelError::none: return "no error";
    case KernelError::index_select: return "index_select/embedding: an index is out of range";
    case KernelError::index_add: return "index_add (index_select/embedding backward): an index is out of range";
    case KernelError::gather: return "gather: an index is out of range";
    case KernelError::scatter_add: return "scatter/scatter_add: an index is out of range";
    case KernelError::max_pool_index: return "max_pool2d backward: a saved index is outside its plane";
    case KernelError::ce_target: return "cross_entropy: a target is outside [0, classes) and is not ignore_index";
    case KernelError::int_div_zero: return "div: integer division by zero";
    case KernelError::int_mod_zero: return "fmod/remainder: integer division by zero";
  }
  return "unknown kernel error";
}

// One per device, created on first use and kept until the process exits.
struct Context {
  int device = 0;
  cudaDeviceProp prop{};
  cudaStream_t stream = nullptr;       // compute: every kernel and library call of the backend
  cudaStream_t copy_stream = nullptr;  // side stream for copies that overlap compute
  int* error_word = nullptr;           // device int, a KernelError
  cublasLtHandle_t cublaslt();         // created on first use
  cudnnHandle_t cudnn();               // created on first use (loading cuDNN takes a while), on `stream`
  CachingAllocator& allocator() const { return *allocator_; }  // device_allocator(device), looked up once

  explicit Context(int device);
  ~Context();  // not run at process exit (contexts live until the driver reclaims them)
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

 private:
  CachingAllocator* allocator_ = nullptr;
  std::mutex handles_mutex_;
  cublasLtHandle_t lt_ = nullptr;
  cudnnHandle_t dnn_ = nullptr;
};

Context& context(int device);
// The context of `device`, made current on this thread first (streams and events of a device are
// used with that device current).
Context& use(int device);
// The context of the device that backend(device) last made current on this thread.
Context& current();
StreamId stream_id(cudaStream_t s);

// Temporary device memory for one op on the compute stream; freed in stream order, so it may be
// released as soon as the kernels that use it are queued.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(o.p_), ctx_(o.ctx_) { o.p_ = nullptr; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      p_ = o.p_;
      ctx_ = o.ctx_;
      o.p_ = nullptr;
    }
    return *this;
  }
  void reset() noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  template <typename T = void> T* get() const { return static_cast<T*>(p_); }

 private:
  void* p_ = nullptr;
  Context* ctx_ = nullptr;
};

// ---- launch shapes -----------------------------------------------------------------------------
constexpr int kThreads = 256;

// Queues kernel k on stream s with the given shape and checks the launch, naming the kernel (`name`,
// its source name: the emulator's coverage list goes by it). In the emulated build, runs every
// thread of the grid on the host before it returns.
template <typename... P, typename... A>
void launch(const char* name, void (*k)(P...), dim3 grid, dim3 block, size_t shared, cudaStream_t s, A... args) {
#ifdef KILN_CUDA_EMULATION
  (void)s;
  emu::run(name, grid, block, shared, [&] { k(args...); });
#else
  k<<<grid, block, shared, s>>>(args...);
#endif
  KILN_LAUNCH_OK(name);
}
// Blocks for a grid-stride loop over n items: enough to fill the device, never more than needed.
inline unsigned grid_for(int64_t n, int threads = kThreads) {
  const int64_t want = (n + threads - 1) / threads;
  const int64_t cap = int64_t(current().prop.multiProcessorCount) * 32;
  return unsigned(std::max<int64_t>(1, std::min(want, cap)));
}

// ---- element types in device code --------------------------------------------------------------
// Arithmetic in DAcc<T>: f32 for the 16-bit floats, T otherwise (as on the CPU).
template <typename T> struct DAccOf { using type = T; };
template <> struct DAccOf<Half> { using type = float; };
template <> struct DAccOf<BFloat16> { using type = float; };
template <typename T> using DAcc = typename DAccOf<T>::type;
template <typename T> constexpr bool is_float_v =
    std::is_floating_point_v<T> || std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;

template <typename T> __device__ __forceinline__ DAcc<T> ld(const T* p) { return static_cast<DAcc<T>>(*p); }
template <typename T, typename V> __device__ __forceinline__ void st(T* p, V v) { *p = convert_to<T>(v); }

// Records the first kernel error of the device (later ones are dropped: one clear message).
__device__ __forceinline__ void flag_error(int* word, KernelError e) { atomicCAS(word, 0, int(e)); }

// Warp and block sums for reductions, in a fixed order (the same bits every run).
template <typename A> __device__ __forceinline__ A warp_sum(A v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
// Sum over a block of blockDim.x threads (a multiple of 32, at most 1024); every thread gets the
// result. `smem` holds 32 values of A. Safe to call repeatedly.
template <typename A> __device__ A block_sum(A v, A* smem) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // smem may still be read by a previous call
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  v = lane < nwarps ? smem[lane] : A(0);
  return warp_sum(v);
}

}  // namespace kiln::cuda
