// The CUDA runtime queries in a build without the CUDA backend: they say so.
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/runtime_info.h"
#include "kernels/cuda/device_memory.h"
#include "kernels/cuda/tc_gemm.h"

#include "base/error.h"

#if !defined(KILN_WITH_CUDA)
namespace kiln::cuda {
namespace {
[[noreturn]] void no_cuda(const char* what, int device) {
  KILN_FAIL(what, " cuda:", device, ": this build of Kiln has no CUDA backend (configured with KILN_CUDA=OFF or "
            "without nvcc, cuDNN and NCCL); use --device cpu, or rebuild with the CUDA toolkit installed");
}
}  // namespace
bool compiled() { return false; }
int device_count() { return 0; }
const Backend& backend(int device) { no_cuda("compute on", device); }
Allocator& tensor_allocator(int device) { no_cuda("allocate on", device); }
void copy_bytes(void*, Device dd, const void*, Device sd, size_t) { no_cuda("copy to", dd.is_cuda() ? dd.index : sd.index); }
void synchronize(int device) { no_cuda("synchronize", device); }
void* compute_stream(int device) { no_cuda("the compute stream of", device); }
size_t free_bytes(int device) { no_cuda("the free memory of", device); }
SavedContext::SavedContext() = default;
SavedContext::~SavedContext() = default;
DeviceScope::DeviceScope(int device) { no_cuda("make current", device); }
DeviceScope::~DeviceScope() = default;
void hand_to_stream(int device, void*, uintptr_t) { no_cuda("hand over memory of", device); }
// Nothing of Kiln's can be reading lent CUDA memory without a CUDA backend.
void release_after_queued_work(int, std::shared_ptr<void>) noexcept {}
// Without a CUDA backend the CUDA settings do nothing, but keep their values, so a Context reads
// back what was set (and names like "auto" are still checked).
namespace {
std::string g_gemm = "auto";
bool g_deterministic = false, g_benchmark = false, g_tf32 = false;
}  // namespace
void set_gemm_backend(const std::string& which) {
  KILN_CHECK(which == "auto" || which == "kiln" || which == "cublaslt" || which.empty(), "set_gemm_backend: ", which,
             ": expected kiln, cublaslt or auto");
  g_gemm = which.empty() ? "auto" : which;
}
std::string gemm_backend() { return g_gemm; }
void copy_to_device_async(void*, int device, const void*, size_t, std::shared_ptr<void>) {
  no_cuda("copy to", device);
}
Allocator& upload_allocator(int device, const void*) { no_cuda("allocate on", device); }
void* copy_stream(int device) { no_cuda("the copy stream of", device); }
Allocator& pinned_allocator() { no_cuda("pinned memory for", 0); }
size_t conv_transient_bytes(int device, DType, const Conv2dParams&, bool, bool, bool) {
  no_cuda("the cuDNN workspace on", device);
}
void set_deterministic(bool on) { g_deterministic = on; }
bool deterministic() { return g_deterministic; }
void set_cudnn_benchmark(bool on) { g_benchmark = on; }
bool cudnn_benchmark() { return g_benchmark; }
void set_allow_tf32(bool on) { g_tf32 = on; }
bool allow_tf32() { return g_tf32; }
RuntimeInfo query_runtime(bool) {
  RuntimeInfo info;
  info.error = "this build of Kiln has no CUDA backend (configured with KILN_CUDA=OFF or without nvcc)";
  return info;
}
std::string device_self_test(int) { return "this build of Kiln has no CUDA backend"; }
void tc_gemm(const TcGemmArgs&, void*) { KILN_FAIL("tc_gemm: this build of Kiln has no CUDA backend"); }
bool tc_gemm_supported(int, std::string* why) {
  if (why) *why = "this build of Kiln has no CUDA backend";
  return false;
}
std::string tc_gemm_selftest(int) { return "this build of Kiln has no CUDA backend"; }
CachingAllocator& device_allocator(int device) {
  KILN_FAIL("cuda:", device, ": this build of Kiln has no CUDA backend");
}
void* pinned_alloc(size_t) { KILN_FAIL("pinned memory: this build of Kiln has no CUDA backend"); }
void pinned_free(void*) {}
}  // namespace kiln::cuda
#endif
