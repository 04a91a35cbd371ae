// The CUDA emulator as tests see it: the CUDA backend's kernels compiled as host C++ (the kernel
// files of kernels/cuda with KILN_CUDA_EMULATION; see cuda_runtime_emulated.h for how), gathered
// into a Backend table whose "device" memory is host memory. With it installed for CPU tensors
// (kiln::detail::BackendOverride), every op runs the CUDA kernel bodies on the CPU, so the op
// table can hold them against the CPU backend in CI, where no GPU is.
//
// GEMM (cuBLASLt, the Tensor Core GEMM) and convolution (cuDNN) are their call plans
// (kernels/common/gemm_plan.h, conv_plan.h, built by the same functions as on a GPU) executed on the
// CPU by library_interp.cpp. The table takes 16-bit products and convolutions and channels_last
// buffers natively, as the CUDA table does. Batch norm always takes its handwritten kernels
// (cuDNN's path needs a GPU).
#pragma once
#include <cstdint>
#include <map>
#include <string>

#include "base/allocator.h"
#include "kernels/backend.h"

namespace kiln::emu {

// The CUDA backend's kernels on host memory (CPU tensors under a BackendOverride, or cuda:0's under
// a DeviceEmulation). After each call, an error a kernel flagged (an index
// out of range, ...) is thrown as the real backend throws it at the next synchronisation.
const Backend& emulated_cuda_backend();

// The order in which the threads of a block run between barriers: forward (thread 0 first) or
// reverse. A kernel whose threads race (read what another writes with no barrier between) tends
// to give different results in the two orders.
enum class Order { forward, reverse };
void set_order(Order o);  // for the calling thread
Order order();

// The emulated device's memory: host memory the emulator hands out and keeps a list of. With
// pointer checks on, every pointer a kernel of the table is given (TensorDesc data, raw buffers,
// the optimizer's slices) must lie in it: a CPU tensor passed to a device kernel, which on a GPU is
// an illegal address, throws, naming the kernel. Tests make it cuda:0's memory with
// kiln::detail::DeviceEmulation (tests/test_emulated.cpp) and turn the checks on meanwhile.
Allocator& device_memory();
void check_device_pointers(bool on);

// `kiln doctor`'s device self-test (kernels/cuda/self_test.cu) run by the emulator, judged by the
// doctor's rule (kernels/common/self_test.h): "" when it passes, else the first mismatch.
std::string device_self_test();

// Launches per kernel name since the process started, and how many threads they ran in all.
struct KernelRuns {
  int64_t launches = 0;
  int64_t threads = 0;
};
std::map<std::string, KernelRuns> kernel_runs();

}  // namespace kiln::emu
