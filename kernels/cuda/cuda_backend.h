// The CUDA backend as the engine sees it: the backend table, tensor memory, copies between host and
// device, synchronisation. No CUDA headers: engine code includes this, and builds without CUDA get
// versions (kernels/cpu/no_cuda.cpp) that say so.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "base/allocator.h"
#include "base/dtype.h"
#include "kernels/backend.h"
#include "kernels/common/conv_plan.h"

namespace kiln::cuda {

// Whether this build has the CUDA backend, and how many devices the driver shows (0 without a
// driver or a device; never throws).
bool compiled();
int device_count();

// The CUDA backend table. Makes `device` the current device of the calling thread first, so the
// kernels it runs go to that device's compute stream.
const Backend& backend(int device);
// Storage for tensors on `device`: the caching allocator, stream-ordered on the compute stream.
Allocator& tensor_allocator(int device);
// Copies n bytes; either side may be the host or a device. Returns when dst holds the data (a
// host-to-device copy from pageable memory has been staged; device-to-host has completed).
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t n);
// A host-to-device copy that returns at once. From page-locked memory it runs on the copy stream,
// beside the kernels already queued (work queued on the compute stream afterwards waits for it), and
// `keep_alive` (the source's storage) is held until the device has read it; from pageable memory it
// runs on the compute stream, and the runtime has staged the data when the call returns. `dst` must
// come from upload_allocator(device, src): for a page-locked source that is the copy stream's pool
// (a block the compute stream freed may still be read by its queued kernels).
void copy_to_device_async(void* dst, int device, const void* src, size_t n, std::shared_ptr<void> keep_alive);
Allocator& upload_allocator(int device, const void* src);
// Page-locked host memory, kept for reuse (cudaFreeHost would wait for the whole device): what
// kiln::pin_memory (engine/tensor.h) copies a loader's batches into.
Allocator& pinned_allocator();

// Waits for everything queued on the device's compute stream, then reports an error that a kernel
// flagged on the device (an index out of range), naming the op.
void synchronize(int device);

// The compute stream of `device` (a cudaStream_t), for callers launching their own kernels in order
// with Kiln's.
void* compute_stream(int device);
// The device's free memory (cudaMemGetInfo) with it current for the call only: query_runtime asks every
// visible device, which in a rank of a multi-GPU job would start a context on each GPU.
size_t free_bytes(int device);
// What is current on the calling thread, put back when this goes: the driver's current context (none
// included), through the runtime's entry points to the driver, else the runtime's device. Restoring
// "device 0" for a thread that never chose a device, as cudaGetDevice answers then, would make a
// context on GPU 0. Never throws.
class SavedContext {
 public:
  SavedContext();
  ~SavedContext();
  SavedContext(const SavedContext&) = delete;
  SavedContext& operator=(const SavedContext&) = delete;

 private:
  // Unused where CUDA is off (kernels/cpu/no_cuda.cpp).
  [[maybe_unused]] void* context_ = nullptr;
  [[maybe_unused]] int device_ = -1;
  [[maybe_unused]] bool exact_ = false;
};
// Makes `device` the calling thread's current CUDA device (as backend(device) does) for the scope, then
// puts back what was current before (SavedContext) and Kiln's own record of it: a DLPack producer's
// stream handshake runs on the current device. The destructor never throws.
class DeviceScope {
 public:
  explicit DeviceScope(int device);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  SavedContext saved_;  // restored after the destructor's body
  [[maybe_unused]] int prev_kiln_device_ = -1;
  [[maybe_unused]] void* prev_kiln_context_ = nullptr;
};
// DLPack, from Kiln's side (the Python package). Handing a tensor of `device` to a consumer that reads it
// on `stream` (a cudaStream_t as an integer; 1: the legacy default stream; 2, the per-thread default
// stream, is refused): that stream waits for Kiln's work queued so far (an event, no host wait), and
// `block` (the storage's allocation from Kiln's allocator; null for memory Kiln did not allocate) is not
// reused until the work queued on that stream by the time Kiln frees it has run, so that stream must
// outlive the tensor handed over (as with PyTorch's record_stream). Taking memory in: `keep_alive` (the
// lender's hold on it) is dropped once Kiln's work queued so far on `device` has run, outside Kiln's
// locks, on a later hold, upload, read to the host or synchronize(); where no event can be made, after
// waiting for the stream.
void hand_to_stream(int device, void* block, uintptr_t stream);
void release_after_queued_work(int device, std::shared_ptr<void> keep_alive) noexcept;
// The side stream that uploads from page-locked memory run on (a cudaStream_t).
void* copy_stream(int device);
// Which GEMM runs f16/bf16 products: "kiln" (the Tensor Core kernel where it takes the shape),
// "cublaslt", or "auto" (timed once per shape, except in deterministic mode, where a timing race
// could pick differently between runs: Kiln's kernel wherever it takes the shape). Default auto;
// the `kiln` command maps KILN_GEMM to it.
void set_gemm_backend(const std::string& which);
std::string gemm_backend();

// Deterministic mode: reductions without atomics and fixed cuDNN algorithms, so that two runs give
// the same bits. Off by default (cuDNN then picks its fastest algorithm by heuristics).
void set_deterministic(bool on);
bool deterministic();
// The device memory a convolution call on `device` takes for itself and gives back (bytes), for the
// memory planner: cuDNN's workspace, as the algorithm that ran for the shape, else the first usable one
// of cuDNN's heuristic list (benchmark mode, until it has timed the shape: at least the buffer it times
// in); for backward (`forward` false), the larger of the two passes asked for (`gx`, `gw`); and an NHWC
// call that cuDNN has no algorithm for adds the NCHW copies of its buffers it runs on. 0 where no cuDNN
// call runs.
size_t conv_transient_bytes(int device, DType dt, const Conv2dParams& p, bool forward, bool gx, bool gw);
// Opt-in cuDNN benchmark mode: time every algorithm once per shape and keep the fastest.
void set_cudnn_benchmark(bool on);
bool cudnn_benchmark();
// TF32 tensor cores for f32 GEMM and convolution (about 10 mantissa bits). Off unless asked for.
void set_allow_tf32(bool on);
bool allow_tf32();

}  // namespace kiln::cuda
