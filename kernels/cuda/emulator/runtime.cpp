// The CUDA backend's runtime as the emulator provides it: one Context whose "device" memory is host
// memory and whose streams are nothing (every call is synchronous), scratch buffers from the host
// heap (so AddressSanitizer sees a kernel that reads past one), and the Backend table of the
// kernels compiled from kernels/cuda (with KILN_CUDA_EMULATION; this file and those are built with
// the namespace kiln::cuda renamed, so they sit beside a real CUDA backend in one test binary).
#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "kernels/common/self_test.h"
#include "kernels/cuda/context.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/emulator/emulator.h"
#include "kernels/cuda/emulator/library_interp.h"
#include "kernels/cuda/ops_cuda.h"
#include "kernels/cuda/runtime_info.h"

namespace kiln::cuda {

Context::Context(int d) : device(d) { error_word = new int(0); }
Context::~Context() { delete error_word; }

Context& context(int) {
  static Context* c = new Context(0);  // never destroyed, as the real contexts
  return *c;
}
Context& use(int device) { return context(device); }
Context& current() { return context(0); }

DeviceBuffer::DeviceBuffer(size_t bytes) : ctx_(&current()) {
  if (bytes) {
    p_ = std::malloc(bytes);
    KILN_CHECK(p_, "cuda emulator: out of host memory for a ", bytes, "-byte scratch buffer");
  }
}
void DeviceBuffer::reset() noexcept {
  std::free(p_);
  p_ = nullptr;
}

// The handwritten kernels everywhere: batch norm's cuDNN path needs a GPU.
bool deterministic() { return true; }

// cuBLASLt and Kiln's Tensor Core GEMM on a GPU; here the plans gemm.cu issues (kernels/common/
// gemm_plan.h, built by the same functions) executed on the CPU by library_interp.cpp. The route
// is gemm.cu's under KILN_GEMM=auto in deterministic mode (the emulator's): Kiln's kernel wherever
// plan_tc_gemm takes the product (an sm_80+ device assumed), else cuBLASLt; every product records
// the dispatch in emu::library_calls(). Where Kiln's kernel takes it, the cuBLASLt plan runs too, on
// a copy of C, and the two must agree exactly (both sum in f64 in the same order): every 16-bit
// product that reaches this table checks both mappings (the op table's 16-bit rows, and
// tests/test_library_plans.cpp's 16-bit plans). TF32 stays off:
// f32 is exact, as the CPU's.
void gemm_batched(DType dt, bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const void* a, int64_t lda,
                  int64_t sa, const void* b, int64_t ldb, int64_t sb, double beta, void* c, int64_t ldc, int64_t sc,
                  int64_t batch) {
  const libplan::GemmCall call{dt, ta, tb, m, n, k, alpha, lda, sa, ldb, sb, beta, ldc, sc, batch};
  const libplan::GemmPlan plan = libplan::plan_gemm(call, /*allow_tf32=*/false);
  if (plan.path == libplan::GemmPath::scale)  // gemm.cu's scale kernel, emulated (not the interpreter's loop)
    return scale_matrices(dt, c, plan.c.cols, plan.c.rows, plan.c.ld, plan.c.batch_stride, plan.batch_count, plan.beta);
  if (plan.path != libplan::GemmPath::matmul) return emu::run_gemm_plan(plan, a, b, c);
  tcgemm::GemmArgs g;
  const libplan::TcRefusal r = libplan::plan_tc_gemm(call, a, b, c, &g);
  emu::count_library_call(std::string("tc_gemm dispatch: ") + libplan::tc_refusal_text(r));
  if (r != libplan::TcRefusal::none) return emu::run_gemm_plan(plan, a, b, c);
  // C as it was, for the cuBLASLt plan (beta may read it): every element the call touches.
  const size_t bytes = size_t((batch - 1) * sc + (m - 1) * ldc + n) * dtype_size(dt);
  std::vector<char> lt_c(static_cast<const char*>(c), static_cast<const char*>(c) + bytes);
  emu::run_tc_gemm(g);
  emu::run_gemm_plan(plan, a, b, lt_c.data());
  const std::string diff = emu::first_difference(dt, c, lt_c.data(), m, n, ldc, sc, batch);
  KILN_CHECK(diff.empty(), "cuda emulator: Kiln's Tensor Core GEMM and the cuBLASLt plan disagree for ",
             libplan::describe(call), " at ", diff);
}
void gemm(DType dt, bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const void* a, int64_t lda,
          const void* b, int64_t ldb, double beta, void* c, int64_t ldc) {
  gemm_batched(dt, ta, tb, m, n, k, alpha, a, lda, 0, b, ldb, 0, beta, c, ldc, 0, 1);
}

// cuDNN on a GPU; here the plans conv.cu builds (kernels/common/conv_plan.h) executed on the CPU.
// conv.cu's NHWC-through-NCHW-copies path (taken when cuDNN offers no NHWC algorithm) has no
// counterpart: the emulated library takes every layout.
void conv2d_forward(DType dt, const Conv2dParams& p, const void* x, const void* w, const void* bias, void* y) {
  emu::run_conv_plan(libplan::plan_conv(dt, p, libplan::ConvPass::forward, /*allow_tf32=*/false),
                     emu::ConvBuffers{x, w, nullptr, bias, y});
}
void conv2d_backward(DType dt, const Conv2dParams& p, const void* x, const void* w, const void* gy, void* gx,
                     void* gw) {
  const libplan::ConvPlan data = libplan::plan_conv(dt, p, libplan::ConvPass::backward_data, false);
  const libplan::ConvPlan filter = libplan::plan_conv(dt, p, libplan::ConvPass::backward_filter, false);
  if (gx) emu::run_conv_plan(data, emu::ConvBuffers{x, w, gy, nullptr, gx});
  if (gw) emu::run_conv_plan(filter, emu::ConvBuffers{x, w, gy, nullptr, gw});
}

namespace {

// What check_error_word does at a real synchronisation, after every call.
void check_error_word() {
  Context& c = current();
  const int word = *c.error_word;
  if (word == 0) return;
  *c.error_word = 0;
  KILN_FAIL("cuda:", c.device, ": ", kernel_error_text(KernelError(word)),
            " (found by a kernel; the results of that op are undefined)");
}

// The emulated device's memory (emu::device_memory): every block it handed out and not yet took back,
// by address, so that a pointer can be told apart from host memory.
struct DeviceBlocks {
  std::mutex mutex;
  std::map<uintptr_t, size_t> blocks;
  std::atomic<bool> checking{false};
};
DeviceBlocks& device_blocks() {
  static auto* b = new DeviceBlocks;  // never destroyed: tensors may outlive static destructors
  return *b;
}

// Throws unless p is null or inside (or one past) a block of the emulated device's memory.
void check_device_pointer(const char* kernel, const char* what, const void* p) {
  if (!p) return;
  DeviceBlocks& d = device_blocks();
  const auto a = reinterpret_cast<uintptr_t>(p);
  {
    std::lock_guard<std::mutex> lk(d.mutex);
    auto it = d.blocks.upper_bound(a);
    if (it != d.blocks.begin() && a <= std::prev(it)->first + std::prev(it)->second) return;
  }
  KILN_FAIL("cuda emulator: ", kernel, " was given ", what, " ", p,
            ", which is not the device's memory: a host buffer handed to a device kernel (on a GPU, an "
            "illegal address)");
}

template <typename T> void check_argument(const char* kernel, const T& a) {
  if constexpr (std::is_same_v<T, TensorDesc>) {
    check_device_pointer(kernel, "a tensor at", a.data);
  } else if constexpr (std::is_same_v<T, OptimHyper>) {
    check_device_pointer(kernel, "the step count at", a.step);
    check_device_pointer(kernel, "the skip flag at", a.skip_if);
  } else if constexpr (std::is_pointer_v<T> && !std::is_same_v<T, const OptimSlice*> &&
                       !std::is_same_v<std::remove_cv_t<std::remove_pointer_t<T>>, char>) {
    check_device_pointer(kernel, "a buffer at", a);
  }
}
// optimizer_step's slices are a host array of device pointers.
void check_slices(const char* kernel, const OptimSlice* s, int64_t count) {
  for (int64_t i = 0; i < count; ++i)
    for (const void* p : {static_cast<const void*>(s[i].w), static_cast<const void*>(s[i].g),
                          static_cast<const void*>(s[i].s0), static_cast<const void*>(s[i].s1)})
      check_device_pointer(kernel, "an optimizer slice's buffer at", p);
}

template <auto F> struct Checked;
template <typename... A, void (*F)(A...)> struct Checked<F> {
  static inline const char* kernel_name = "a kernel";
  static void call(A... a) {
    if (device_blocks().checking.load(std::memory_order_relaxed)) {
      (check_argument(kernel_name, static_cast<const std::decay_t<A>&>(a)), ...);
      if constexpr (std::is_same_v<std::tuple<std::decay_t<A>...>,
                                   std::tuple<OptimKind, const OptimSlice*, int64_t, OptimHyper>>)
        check_slices(kernel_name, std::get<1>(std::tie(a...)), std::get<2>(std::tie(a...)));
    }
    F(a...);
    check_error_word();
  }
};

// Host memory standing for the emulated device's, listed in device_blocks().
class DeviceMemory final : public Allocator {
 public:
  void* allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    void* p = std::malloc(nbytes);
    KILN_CHECK(p, "cuda emulator: out of host memory for ", nbytes, " bytes of device memory");
    std::lock_guard<std::mutex> lk(device_blocks().mutex);
    device_blocks().blocks[reinterpret_cast<uintptr_t>(p)] = nbytes;
    return p;
  }
  void deallocate(void* p, size_t) noexcept override {
    if (!p) return;
    {
      std::lock_guard<std::mutex> lk(device_blocks().mutex);
      device_blocks().blocks.erase(reinterpret_cast<uintptr_t>(p));
    }
    std::free(p);
  }
};
DeviceMemory& device_memory() {
  static auto* m = new DeviceMemory;  // never destroyed, as device_blocks()
  return *m;
}

}  // namespace
}  // namespace kiln::cuda

namespace kiln::emu {

const Backend& emulated_cuda_backend() {
  static const Backend b = [] {
    Backend t = cpu_backend();
    t.name = "cuda-emulated";
#define KILN_KERNEL(name, params)             \
  t.name = &cuda::Checked<&cuda::name>::call; \
  cuda::Checked<& cuda::name>::kernel_name = #name;
#include "kernels/kernel_list.h"
#undef KILN_KERNEL
    t.gemm = &cuda::Checked<&cuda::gemm>::call;
    t.gemm_batched = &cuda::Checked<&cuda::gemm_batched>::call;
    cuda::Checked<& cuda::gemm>::kernel_name = "gemm";
    cuda::Checked<& cuda::gemm_batched>::kernel_name = "gemm_batched";
    // As the CUDA table: channels_last convolutions and batch norms get NHWC buffers and KRSC filters,
    // and 16-bit products and convolutions stay 16-bit (f32 accumulation), so the op table's 16-bit
    // rows check what a GPU computes: on an H200 (2026-12-04) the channels_last row's 16-bit
    // gradients missed their bound by the very numbers this table gave (an argmax tie flipped by an
    // ulp), and the row was mended here, before a second GPU run.
    t.native_16bit_gemm_conv = true;
    t.native_channels_last = true;
    return t;
  }();
  return b;
}

Allocator& device_memory() { return cuda::device_memory(); }
void check_device_pointers(bool on) { cuda::device_blocks().checking = on; }

std::string device_self_test() {
  constexpr int n = 1024;  // as cuda::device_self_test
  std::vector<uint32_t> out(size_t(kSelfTestWords) * n);
  cuda::launch_self_test(out.data(), n);
  return self_test_mismatch(out.data(), n);
}

}  // namespace kiln::emu
