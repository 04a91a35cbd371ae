// Kiln's handwritten FP16/BF16 Tensor Core GEMM with fused epilogues (kernels/cuda/tc_gemm.cu),
// for sm_80 and newer. No CUDA headers here: device pointers and the stream travel as void*.
// Its index arithmetic is kernels/common/tc_gemm_layout.h, proved on the CPU by tests/test_tcgemm.cpp.
#pragma once
#include <cstdint>
#include <string>

#include "base/dtype.h"
#include "kernels/common/tc_gemm_layout.h"

namespace kiln::cuda {

// The kernel's arguments (tcgemm::GemmArgs in kernels/common/tc_gemm_layout.h): out[b] =
// act(alpha * A[b] B[b] + beta * c0[b] + bias) + residual[b], row-major M x N. gemm.cu fills them
// with kernels/common/gemm_plan.h's plan_tc_gemm.
using TcGemmArgs = tcgemm::GemmArgs;

// Checks the arguments (a clear error for each violated rule: dtypes, K % 8, leading dimensions
// multiples of 8, 16-byte aligned pointers) and launches on `stream` (a cudaStream_t; null: default).
void tc_gemm(const TcGemmArgs& args, void* stream);
// Whether `device` can run it (compute capability 8.0 or newer, and this build has code for it).
bool tc_gemm_supported(int device, std::string* why = nullptr);
// Runs the kernel on `device` for every layout, input dtype, output dtype and epilogue over awkward
// sizes, against a CPU reference. Returns "" when all agree, else what differed.
std::string tc_gemm_selftest(int device);

}  // namespace kiln::cuda
