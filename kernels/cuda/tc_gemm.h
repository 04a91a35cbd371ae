// Kiln's handwritten FP16/BF16 Tensor Core GEMM with fused epilogues (kernels/cuda/tc_gemm.cu),
// for sm_80 and newer. No CUDA headers here: device pointers and the stream travel as void*.
// Its index arithmetic is kernels/common/tc_gemm_layout.h, proved on the CPU by tests/test_tcgemm.cpp.
#pragma once
#include <cstdint>
#include <string>

#include "base/dtype.h"
#include "kernels/common/tc_gemm_layout.h"

namespace kiln::cuda {

// out[b] = act(alpha * A[b] B[b] + beta * c0[b] + bias) + residual[b] for b < batch, all row-major
// M x N with leading dimension ldc (c0 and residual in the output dtype; bias f32 [N]).
struct TcGemmArgs {
  DType in_dtype = DType::f16;   // f16 or bf16, for A and B
  DType out_dtype = DType::f32;  // f16, bf16 or f32
  tcgemm::Layout la = tcgemm::Layout::row, lb = tcgemm::Layout::row;
  int64_t M = 0, N = 0, K = 0, lda = 0, ldb = 0, ldc = 0;
  const void* a = nullptr;
  const void* b = nullptr;
  void* out = nullptr;
  const void* c0 = nullptr;        // used when ep.beta != 0
  const float* bias = nullptr;     // optional
  const void* residual = nullptr;  // optional
  int64_t batch = 1, stride_a = 0, stride_b = 0, stride_c = 0;  // elements between batch entries
  tcgemm::Epilogue ep;
};

// Checks the arguments (a clear error for each violated rule: dtypes, K % 8, leading dimensions
// multiples of 8, 16-byte aligned pointers) and launches on `stream` (a cudaStream_t; null: default).
void tc_gemm(const TcGemmArgs& args, void* stream);
// Whether `device` can run it (compute capability 8.0 or newer, and this build has code for it).
bool tc_gemm_supported(int device, std::string* why = nullptr);
// Runs the kernel on `device` for every layout, input dtype, output dtype and epilogue over awkward
// sizes, against a CPU reference. Returns "" when all agree, else what differed.
std::string tc_gemm_selftest(int device);

}  // namespace kiln::cuda
