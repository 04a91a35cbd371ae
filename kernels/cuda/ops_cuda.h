// The CUDA backend's kernels, gathered into the Backend table by context.cu. Every function queues
// work on the current device's compute stream (kernels/cuda/context.h) and returns without waiting.
#pragma once
#include "kernels/backend.h"

namespace kiln::cuda {

#include "kernels/kernel_decls.h"

void gemm(DType dtype, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha, const void* a,
          int64_t lda, const void* b, int64_t ldb, double beta, void* c, int64_t ldc);
void gemm_batched(DType dtype, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
                  const void* a, int64_t lda, int64_t stride_a, const void* b, int64_t ldb, int64_t stride_b,
                  double beta, void* c, int64_t ldc, int64_t stride_c, int64_t batch);
// C = beta * C for `batch` row-major m x n matrices (row stride ldc, `stride` elements apart): the
// GEMM with k == 0 (elementwise.cu).
void scale_matrices(DType dt, void* c, int64_t m, int64_t n, int64_t ldc, int64_t stride, int64_t batch, double beta);

}  // namespace kiln::cuda
