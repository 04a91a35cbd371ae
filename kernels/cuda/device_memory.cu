// The CUDA side of device memory: a RawDevice over cudaMalloc/cudaFree and CUDA events for the
// caching allocator (base/caching_allocator.h holds the policy, tested on the CPU), and pinned
// host allocations.
#include <cuda_runtime.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "base/error.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_memory.h"

namespace kiln::cuda {
namespace {

// Runs the calls of one device with that device current, restoring the caller's.
// (What was current goes back as SavedContext keeps it: a thread that had no device gets none back.)
class DeviceScope {
 public:
  explicit DeviceScope(int d) {
    int cur = -1;
    if (cudaGetDevice(&cur) != cudaSuccess || cur != d) KILN_CUDA_OK(cudaSetDevice(d));
  }

 private:
  SavedContext keep_;
};

class CudaDevice final : public RawDevice {
 public:
  explicit CudaDevice(int d) : d_(d) {}
  void* allocate(size_t bytes) override {
    DeviceScope s(d_);
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, bytes);
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // clear the error state so the next call does not report it
      return nullptr;
    }
    KILN_CHECK(e == cudaSuccess, "cudaMalloc of ", bytes, " bytes on cuda:", d_, " failed: ", cuda_error(e));
    return p;
  }
  void deallocate(void* p) override {
    DeviceScope s(d_);
    KILN_CUDA_OK(cudaFree(p));
  }
  void* record_event(StreamId stream) override {
    DeviceScope s(d_);
    cudaEvent_t ev;
    KILN_CUDA_OK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    KILN_CUDA_OK(cudaEventRecord(ev, reinterpret_cast<cudaStream_t>(stream)));
    return ev;
  }
  bool event_done(void* ev) override {
    return query_done(cudaEventQuery(static_cast<cudaEvent_t>(ev)), "cudaEventQuery");
  }
  void wait_event(void* ev) override {
    KILN_CUDA_OK(cudaEventSynchronize(static_cast<cudaEvent_t>(ev)));
  }
  void destroy_event(void* ev) override { cudaEventDestroy(static_cast<cudaEvent_t>(ev)); }
  size_t free_bytes() override {
    DeviceScope s(d_);
    size_t free = 0, total = 0;
    return cudaMemGetInfo(&free, &total) == cudaSuccess ? free : 0;
  }

 private:
  int d_;
};

}  // namespace

// Process-lifetime state is never destroyed (here and in context.cu): at exit the CUDA runtime may
// already be unloading, a cudaFree from a static destructor then fails inside a noexcept path
// (std::terminate after any sticky error), and tensors released by other statics' destructors
// would reach a destroyed allocator. The driver reclaims everything when the process ends.
CachingAllocator& device_allocator(int device) {
  static auto* m = new std::mutex;
  static auto* allocators = new std::vector<std::unique_ptr<CachingAllocator>>;
  std::lock_guard<std::mutex> lk(*m);
  int count = 0;
  KILN_CUDA_OK(cudaGetDeviceCount(&count));
  KILN_CHECK(device >= 0 && device < count, "cuda:", device, " does not exist (", count, " device(s) visible)");
  if (allocators->size() < size_t(count)) allocators->resize(size_t(count));
  auto& a = (*allocators)[size_t(device)];
  if (!a) a = std::make_unique<CachingAllocator>(std::make_unique<CudaDevice>(device), "cuda:" + std::to_string(device));
  return *a;
}

void* pinned_alloc(size_t bytes) {
  void* p = nullptr;
  KILN_CUDA_OK(cudaHostAlloc(&p, bytes, cudaHostAllocPortable));  // pinned for every device's context
  return p;
}

void pinned_free(void* p) {
  if (p) KILN_CUDA_OK(cudaFreeHost(p));
}

}  // namespace kiln::cuda
