// The meta device: a Backend whose kernels do nothing, and an allocator that hands out no memory
// but counts what it was asked for, so a model runs on shapes alone and its memory can be read
// off (tools/plan.cpp).
#include <atomic>

#include "engine/internal.h"
#include "engine/tensor.h"
#include "kernels/backend.h"

namespace kiln {
namespace {

class MetaAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override {
    const size_t now = allocated_.fetch_add(nbytes) + nbytes;
    for (size_t peak = peak_.load(); now > peak && !peak_.compare_exchange_weak(peak, now);) {
    }
    ++allocations_;
    return nullptr;
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
  return t;
}
#pragma GCC diagnostic pop

std::atomic<bool> g_meta_gpu_like{false};
thread_local int t_meta_init = 0;

}  // namespace

HostMemoryStats meta_memory_stats() { return meta_allocator_impl().stats(); }
void reset_meta_memory_peak() { meta_allocator_impl().reset_peak(); }
void set_meta_like_gpu(bool on) { g_meta_gpu_like = on; }

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
