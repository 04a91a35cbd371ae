// The CUDA runtime and the device built-ins as the CUDA emulator provides them: what the kernel
// files of kernels/cuda use, so that they compile as host C++ (KILN_CUDA_EMULATION) and the tests
// run every handwritten kernel body on the CPU, from the same source. Included by cuda_check.h and
// context.h in place of <cuda_runtime.h>, <cublasLt.h> and <cudnn.h>.
//
// "Device" memory is host memory and every call is synchronous. A launch runs its grid block by
// block on the calling thread, each CUDA thread a fiber with its own stack that runs until it
// reaches a barrier, a shuffle or a vote (emulator.cpp): so threads of a block interleave only
// where CUDA guarantees an order, and a barrier that not every thread reaches, a shuffle that names
// a lane which exited or waits elsewhere, is reported as the kernel's error instead of a hang.
// __shared__ variables become thread_local statics: one copy per kernel for the block that runs.
#pragma once
#ifndef KILN_CUDA_EMULATION
#error "cuda_runtime_emulated.h is only for the emulated build of the CUDA kernels"
#endif
#include <math.h>  // the float overloads of sqrt, exp, ... in the global namespace, as in CUDA

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <source_location>
#include <type_traits>
#include <vector>

// ---- qualifiers ------------------------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
#define __shared__ static thread_local
#define __align__(n) __attribute__((aligned(n)))

// ---- runtime types and calls (C++ functions: their names never meet the C API's in one binary) --------
enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorNotReady = 600,
  cudaErrorLaunchFailure = 719,
};
const char* cudaGetErrorName(cudaError_t e);
const char* cudaGetErrorString(cudaError_t e);
// The error of the last launch on this thread, cleared by reading it (as the runtime's).
cudaError_t cudaGetLastError();

struct CUstream_st;
using cudaStream_t = CUstream_st*;
struct CUevent_st;
using cudaEvent_t = CUevent_st*;
using cublasLtHandle_t = void*;
using cudnnHandle_t = void*;

struct cudaDeviceProp {
  char name[256] = "Kiln CUDA emulator";
  int major = 8, minor = 0;
  int multiProcessorCount = 2;  // small, so that grid-stride loops go round more than once
  int maxThreadsPerBlock = 1024;
  int warpSize = 32;
  size_t sharedMemPerBlock = 48 * 1024;
};

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};
inline cudaError_t cudaMemsetAsync(void* p, int v, size_t n, cudaStream_t = nullptr) {
  if (n) std::memset(p, v, n);
  return cudaSuccess;
}
inline cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind, cudaStream_t = nullptr) {
  if (n) std::memmove(dst, src, n);
  return cudaSuccess;
}

// ---- launch geometry -------------------------------------------------------------------------------
struct uint3 {
  unsigned x, y, z;
};
struct alignas(8) uint2 {
  unsigned x, y;
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
// The running thread's coordinates: set by the emulator each time it resumes a thread's fiber.
inline thread_local uint3 threadIdx{0, 0, 0};
inline thread_local uint3 blockIdx{0, 0, 0};
inline thread_local dim3 blockDim{1, 1, 1};
inline thread_local dim3 gridDim{1, 1, 1};

namespace kiln::emu {

// What a thread waits for; its group (the block or the lanes of `mask`) is released together.
enum class Sync : uint8_t {
  block,
  block_or,
  block_and,
  block_count,
  warp,
  shfl,
  shfl_up,
  shfl_down,
  shfl_xor,
  ballot,
  any,
  all
};
// Suspends the calling emulated thread until its group arrives; returns this thread's result
// (the value read from the source lane, the vote, the barrier's reduction). `where` is the call's
// place in the source: the threads of a block must meet at one __syncthreads, not merely at as many
// (a GPU counts arrivals, so a barrier in a branch some threads skip can appear to work there; CUDA
// leaves it undefined).
uint64_t arrive(Sync op, unsigned mask, uint64_t value, int param, int width,
                const std::source_location& where = std::source_location::current());

// Runs `thread` for every thread of the grid (emulator.cpp). A configuration CUDA would refuse
// (block over 1024 threads, grid y or z over 65535, ...) runs nothing and leaves
// cudaErrorInvalidConfiguration for cudaGetLastError, as a real launch does.
void run(const char* name, dim3 grid, dim3 block, size_t shared_bytes, const std::function<void()>& thread);

template <typename T> uint64_t to_bits(T v) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>, "shuffles move at most 8 bytes");
  uint64_t b = 0;
  std::memcpy(&b, &v, sizeof(T));
  return b;
}
template <typename T> T from_bits(uint64_t b) {
  T v;
  std::memcpy(&v, &b, sizeof(T));
  return v;
}

}  // namespace kiln::emu

// ---- barriers, shuffles, votes -----------------------------------------------------------------------
inline void __syncthreads(std::source_location w = std::source_location::current()) {
  kiln::emu::arrive(kiln::emu::Sync::block, 0, 0, 0, 0, w);
}
inline int __syncthreads_or(int p, std::source_location w = std::source_location::current()) {
  return int(kiln::emu::arrive(kiln::emu::Sync::block_or, 0, p != 0, 0, 0, w));
}
inline int __syncthreads_and(int p, std::source_location w = std::source_location::current()) {
  return int(kiln::emu::arrive(kiln::emu::Sync::block_and, 0, p != 0, 0, 0, w));
}
inline int __syncthreads_count(int p, std::source_location w = std::source_location::current()) {
  return int(kiln::emu::arrive(kiln::emu::Sync::block_count, 0, p != 0, 0, 0, w));
}
inline void __syncwarp(unsigned mask = 0xffffffffu) { kiln::emu::arrive(kiln::emu::Sync::warp, mask, 0, 0, 32); }
template <typename T> T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
  return kiln::emu::from_bits<T>(kiln::emu::arrive(kiln::emu::Sync::shfl, mask, kiln::emu::to_bits(v), src, width));
}
template <typename T> T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  return kiln::emu::from_bits<T>(
      kiln::emu::arrive(kiln::emu::Sync::shfl_up, mask, kiln::emu::to_bits(v), int(delta), width));
}
template <typename T> T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  return kiln::emu::from_bits<T>(
      kiln::emu::arrive(kiln::emu::Sync::shfl_down, mask, kiln::emu::to_bits(v), int(delta), width));
}
template <typename T> T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  return kiln::emu::from_bits<T>(
      kiln::emu::arrive(kiln::emu::Sync::shfl_xor, mask, kiln::emu::to_bits(v), lane_mask, width));
}
inline unsigned __ballot_sync(unsigned mask, int p) {
  return unsigned(kiln::emu::arrive(kiln::emu::Sync::ballot, mask, p != 0, 0, 32));
}
inline int __any_sync(unsigned mask, int p) {
  return int(kiln::emu::arrive(kiln::emu::Sync::any, mask, p != 0, 0, 32));
}
inline int __all_sync(unsigned mask, int p) {
  return int(kiln::emu::arrive(kiln::emu::Sync::all, mask, p != 0, 0, 32));
}

// ---- atomics: the grid runs on one host thread and fibers switch only at the calls above, so a
// plain read-modify-write is atomic here ----
template <typename T> T atomicCAS(T* p, T compare, T v) {
  const T old = *p;
  if (old == compare) *p = v;
  return old;
}
template <typename T> T atomicAdd(T* p, T v) {
  const T old = *p;
  *p = old + v;
  return old;
}
template <typename T> T atomicExch(T* p, T v) {
  const T old = *p;
  *p = v;
  return old;
}
template <typename T> T atomicMax(T* p, T v) {
  const T old = *p;
  if (v > old) *p = v;
  return old;
}
template <typename T> T atomicMin(T* p, T v) {
  const T old = *p;
  if (v < old) *p = v;
  return old;
}

// ---- device math that is not in <math.h> ---------------------------------------------------------------
template <typename A, typename B> constexpr std::common_type_t<A, B> min(A a, B b) {
  return b < a ? std::common_type_t<A, B>(b) : std::common_type_t<A, B>(a);
}
template <typename A, typename B> constexpr std::common_type_t<A, B> max(A a, B b) {
  return a < b ? std::common_type_t<A, B>(b) : std::common_type_t<A, B>(a);
}
inline float __uint_as_float(unsigned u) { return kiln::emu::from_bits<float>(u); }
inline unsigned __float_as_uint(float f) { return unsigned(kiln::emu::to_bits(f)); }
inline double __longlong_as_double(long long v) { return kiln::emu::from_bits<double>(uint64_t(v)); }
inline long long __double_as_longlong(double d) { return (long long)kiln::emu::to_bits(d); }
template <typename T> T __ldg(const T* p) { return *p; }

// ---- CUB, as far as kernels/cuda uses it: a library call, made on the host (in Kiln's namespace, so
// that it never meets the real CUB's symbols in one binary) ------------------------------------------------
namespace kiln::emu::cub {
struct DeviceRadixSort {
  // Stable sort of (key, value) pairs by bits [begin_bit, end_bit) of the keys (non-negative here,
  // as CUB orders them); the first call (temp null) asks for no scratch space.
  template <typename K, typename V>
  static cudaError_t SortPairs(void* temp, size_t& temp_bytes, const K* keys_in, K* keys_out, const V* values_in,
                               V* values_out, int64_t n, int begin_bit = 0, int end_bit = int(sizeof(K) * 8),
                               cudaStream_t = nullptr) {
    if (!temp) {
      temp_bytes = 1;
      return cudaSuccess;
    }
    const uint64_t mask = end_bit - begin_bit >= 64 ? ~uint64_t(0) : (uint64_t(1) << (end_bit - begin_bit)) - 1;
    auto digit = [&](const K& k) { return (uint64_t(k) >> begin_bit) & mask; };
    std::vector<int64_t> order(size_t(n > 0 ? n : 0));
    for (size_t i = 0; i < order.size(); ++i) order[i] = int64_t(i);
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return digit(keys_in[a]) < digit(keys_in[b]); });
    std::vector<K> k(order.size());
    std::vector<V> v(order.size());
    for (size_t i = 0; i < order.size(); ++i) {
      k[i] = keys_in[order[i]];
      v[i] = values_in[order[i]];
    }
    std::copy(k.begin(), k.end(), keys_out);
    std::copy(v.begin(), v.end(), values_out);
    return cudaSuccess;
  }
};
}  // namespace kiln::emu::cub
namespace cub = kiln::emu::cub;
