// The meta device: a Backend whose kernels do nothing, and an allocator that hands out no memory
// but counts what it was asked for, so a model runs on shapes alone and its memory can be read
// off (tools/plan.cpp).
#include <atomic>

#include "engine/internal.h"
#include "engine/tensor.h"
#include "kernels/backend.h"
#include "kernels/common/gemm_plan.h"
#include "kernels/cuda/cuda_backend.h"

namespace kiln {
namespace {

// Where a meta tensor's data would be: never read or written (meta kernels do nothing), but not null,
// so that a kernel sees which of its optional operands are there (a ReLU output, a residual).
alignas(64) char g_meta_address[64];

class MetaAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override {
    const size_t now = allocated_.fetch_add(nbytes) + nbytes;
    for (size_t peak = peak_.load(); now > peak && !peak_.compare_exchange_weak(peak, now);) {
    }
    ++allocations_;
    return g_meta_address;
  }
  void deallocate(void* /*p*/, size_t nbytes) noexcept override { allocated_ -= nbytes; }
  HostMemoryStats stats() const {
    HostMemoryStats s;
    s.allocated = allocated_.load();
    s.peak_allocated = peak_.load();
    s.allocations = allocations_.load();
    return s;
  }
  void reset_peak() { peak_ = allocated_.load(); }

 private:
  std::atomic<size_t> allocated_{0}, peak_{0};
  std::atomic<int64_t> allocations_{0};
};

MetaAllocator& meta_allocator_impl() {
  static MetaAllocator* a = new MetaAllocator;  // never destroyed, as the CPU allocator
  return *a;
}

std::atomic<bool> g_meta_gpu_like{false};
std::atomic<int> g_meta_cudnn_device{-1};
thread_local int t_meta_init = 0;

// Memory a CUDA kernel takes from the device's caching allocator for one call and gives back after
// it (a cuBLASLt or cuDNN workspace, a scratch buffer): on the meta device, counted as the peak would
// see it.
void transient(size_t bytes) {
  if (bytes == 0) return;
  MetaAllocator& a = meta_allocator_impl();
  a.deallocate(a.allocate(bytes), bytes);
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
Backend make_meta_backend(bool gpu_like) {
  Backend t{};
  t.name = gpu_like ? "meta (as a GPU)" : "meta (as the CPU)";
  t.gemm = [](DType dtype, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha, const void* a,
              int64_t lda, const void* b, int64_t ldb, double beta, void* c, int64_t ldc) {};
  t.gemm_batched = [](DType dtype, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
                      const void* a, int64_t lda, int64_t stride_a, const void* b, int64_t ldb, int64_t stride_b,
                      double beta, void* c, int64_t ldc, int64_t stride_c, int64_t batch) {};
#define KILN_KERNEL(name, params) t.name = [] params {};
#include "kernels/kernel_list.h"
#undef KILN_KERNEL
  // As the device being planned for lays out and converts its operands (kernels/backend.h).
  t.native_16bit_gemm_conv = gpu_like;
  t.native_channels_last = gpu_like;
  if (!gpu_like) return t;
  // What the CUDA kernels take for the call (kernels/cuda): cuBLASLt's workspace for every matmul
  // (gemm.cu), the masked gradient of batch_norm_relu's backward without a residual to hold it
  // (batch_norm.cu), and, where the planner has a device to ask (set_meta_like_gpu), the cuDNN
  // workspace of each convolution pass (conv.cu). Kiln's Tensor Core GEMM takes no workspace: where it
  // runs instead of cuBLASLt, the count is 32 MiB high.
  t.gemm = [](DType dtype, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha, const void* a,
              int64_t lda, const void* b, int64_t ldb, double beta, void* c, int64_t ldc) {
    if (m > 0 && n > 0 && k > 0) transient(libplan::kLtWorkspaceBytes);
  };
  t.gemm_batched = [](DType dtype, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
                      const void* a, int64_t lda, int64_t stride_a, const void* b, int64_t ldb, int64_t stride_b,
                      double beta, void* c, int64_t ldc, int64_t stride_c, int64_t batch) {
    if (m > 0 && n > 0 && k > 0 && batch > 0) transient(libplan::kLtWorkspaceBytes);
  };
  t.batch_norm_backward = [](DType dt, int64_t n, int64_t c, int64_t hw, bool training, double eps, const void* x,
                             const void* gamma, const void* mean, const void* rstd, const void* gy, void* gx,
                             void* ggamma, void* gbeta, bool nhwc, const void* y, void* gresidual) {
    if (y && !gresidual) transient(size_t(n * c * hw) * dtype_size(dt));
  };
  t.conv2d_forward = [](DType dt, const Conv2dParams& p, const void* x, const void* w, const void* bias, void* y) {
    if (const int d = g_meta_cudnn_device.load(); d >= 0)
      transient(cuda::conv_transient_bytes(d, dt, p, true, false, false));
  };
  t.conv2d_backward = [](DType dt, const Conv2dParams& p, const void* x, const void* w, const void* gy, void* gx,
                         void* gw) {
    if (const int d = g_meta_cudnn_device.load(); d >= 0 && (gx || gw))
      transient(cuda::conv_transient_bytes(d, dt, p, false, gx != nullptr, gw != nullptr));
  };
  return t;
}
#pragma GCC diagnostic pop

}  // namespace

HostMemoryStats meta_memory_stats() { return meta_allocator_impl().stats(); }
void reset_meta_memory_peak() { meta_allocator_impl().reset_peak(); }
void set_meta_like_gpu(bool on, int cudnn_device) {
  g_meta_gpu_like = on;
  g_meta_cudnn_device = on ? cudnn_device : -1;
}

MetaInitGuard::MetaInitGuard() { ++t_meta_init; }
MetaInitGuard::~MetaInitGuard() { --t_meta_init; }
bool MetaInitGuard::active() { return t_meta_init > 0; }

namespace detail {
Allocator& meta_allocator() { return meta_allocator_impl(); }
const Backend& meta_backend() {
  static const Backend cpu_like = make_meta_backend(false), gpu_like = make_meta_backend(true);
  return g_meta_gpu_like.load(std::memory_order_relaxed) ? gpu_like : cpu_like;
}
}  // namespace detail

}  // namespace kiln
