// The library calls of the CUDA backend, executed on the CPU from their plans: cuBLASLt's matmul
// from a libplan::GemmPlan, Kiln's Tensor Core GEMM from its arguments, cuDNN's convolution passes
// from a libplan::ConvPlan (kernels/common/gemm_plan.h, conv_plan.h). Each reads its operands
// exactly as the library would from what the plan says (column-major with the plan's leading
// dimensions, transposes and batch offsets; the descriptors' formats and strides, groups,
// dilation and padding), so a wrong mapping gives wrong numbers, and refuses (throws) what the
// library would refuse (a leading dimension shorter than its column, mismatched descriptors).
// Sums are f64, rounded once to the output dtype.
//
// The emulated backend (runtime.cpp) builds its plans with the same functions as gemm.cu and
// conv.cu and runs them here; tests/test_library_plans.cpp runs plans here against references.
// Plain types only (no CUDA backend types), so the emulated build and the tests share these symbols.
#pragma once
#include <cstdint>
#include <map>
#include <string>

#include "kernels/common/conv_plan.h"
#include "kernels/common/gemm_plan.h"
#include "kernels/common/tc_gemm_layout.h"

namespace kiln::emu {

// What gemm.cu does with a plan on host memory: nothing, C = beta C (k == 0), or cublasLtMatmul
// with D = C. a and b are the engine's buffers: the plan says which is cuBLASLt's A and which its B.
void run_gemm_plan(const libplan::GemmPlan& plan, const void* a, const void* b, void* c);

// Kiln's Tensor Core GEMM (tc_gemm) on host memory: out = act(alpha A B + beta c0 + bias) + residual
// with A and B in the layouts the arguments give; checks the arguments as tc_gemm does.
void run_tc_gemm(const tcgemm::GemmArgs& g);

// The buffers of a convolution pass: forward reads x and w (and adds bias when not null) into out
// (y); backward data reads w and dy into out (dx); backward filter reads x and dy into out (dw).
struct ConvBuffers {
  const void* x = nullptr;
  const void* w = nullptr;
  const void* dy = nullptr;
  const void* bias = nullptr;
  void* out = nullptr;
};
// What conv.cu does with a plan on host memory: nothing, zeros, y = bias (no input channels), or
// the cuDNN pass (beta 0) followed, for the forward, by cudnnAddTensor of the bias.
void run_conv_plan(const libplan::ConvPlan& plan, const ConvBuffers& buffers);

// Where two row-major results of a product (m x n with row stride ld, batch entries `stride` apart)
// first differ, as text naming the entry, row and column; "" when every element agrees (NaN agrees
// with NaN, and -0 with 0).
std::string first_difference(DType dt, const void* x, const void* y, int64_t m, int64_t n, int64_t ld, int64_t stride,
                             int64_t batch);

// How many calls of each kind the emulated library executed since the process started: "cublasLt
// matmul", "gemm scale (k == 0)", "tc_gemm", "tc_gemm refused: <reason>", "cudnn forward", ...
// The emulated backend records the Tensor Core dispatch of every product here too.
std::map<std::string, int64_t> library_calls();
void count_library_call(const std::string& what);

}  // namespace kiln::emu
