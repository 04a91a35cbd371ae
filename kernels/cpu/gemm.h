// The CPU matrix multiply every Kiln op uses: C = alpha * op(A) * op(B) + beta * C, row-major with
// leading dimensions, parallelised over output blocks on the engine's pool; results never depend on the thread count.
#pragma once
#include <cstdint>

namespace kiln::cpu {

// C[m,n] = alpha * op(A) * op(B) + beta * C.  op(A) is m x k: if !trans_a, element (i,p) is a[i*lda + p];
// if trans_a, A is stored k x m and element (i,p) is a[p*lda + i]. Same for B (k x n).
// beta == 0 means C is not read (NaNs in C are not propagated). m, n or k may be 0 (k == 0: C = beta*C).
// C must not overlap A or B. Throws kiln::Error for negative sizes or a leading dimension below its row width.
void gemm_f32(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
              const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
void gemm_f64(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha, const double* a, int64_t lda,
              const double* b, int64_t ldb, double beta, double* c, int64_t ldc);

}  // namespace kiln::cpu
