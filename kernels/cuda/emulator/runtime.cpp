// The CUDA backend's runtime as the emulator provides it: one Context whose "device" memory is host
// memory and whose streams are nothing (every call is synchronous), scratch buffers from the host
// heap (so AddressSanitizer sees a kernel that reads past one), and the Backend table of the
// kernels compiled from kernels/cuda (with KILN_CUDA_EMULATION; this file and those are built with
// the namespace kiln::cuda renamed, so they sit beside a real CUDA backend in one test binary).
#include <cstdlib>

#include "kernels/cuda/context.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/emulator/emulator.h"
#include "kernels/cuda/ops_cuda.h"

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

// Convolution is cuDNN's on a GPU: the CPU backend's here, on the same host buffers.
void conv2d_forward(DType dt, const Conv2dParams& p, const void* x, const void* w, const void* bias, void* y) {
  cpu_backend().conv2d_forward(dt, p, x, w, bias, y);
}
void conv2d_backward(DType dt, const Conv2dParams& p, const void* x, const void* w, const void* gy, void* gx,
                     void* gw) {
  cpu_backend().conv2d_backward(dt, p, x, w, gy, gx, gw);
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

template <auto F> struct Checked;
template <typename... A, void (*F)(A...)> struct Checked<F> {
  static void call(A... a) {
    F(a...);
    check_error_word();
  }
};

}  // namespace
}  // namespace kiln::cuda

namespace kiln::emu {

const Backend& emulated_cuda_backend() {
  static const Backend b = [] {
    Backend t = cpu_backend();  // GEMM (cuBLASLt and Kiln's Tensor Core GEMM on a GPU) stays the CPU's
    t.name = "cuda-emulated";
#define KILN_KERNEL(name, params) t.name = &cuda::Checked<&cuda::name>::call;
#include "kernels/kernel_list.h"
#undef KILN_KERNEL
    t.native_16bit_gemm_conv = false;
    t.native_channels_last = false;
    return t;
  }();
  return b;
}

}  // namespace kiln::emu
