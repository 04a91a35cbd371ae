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

// ---- f32 GEMM with a B operand that is never stored (the AVX-512 and AVX2 kernel sets) ---------------
// For a convolution's im2col matrix: the GEMM asks `pack` for the blocks of B it is about to use, in the
// layout its micro-kernel reads, so the matrix is built once, straight into cache, instead of being written
// out whole and then copied into that layout. Same blocking and kernels as gemm_f32: C gets the bits
// gemm_f32 would give on the materialised B.
//
// The panel layout (of the kernel set in use: `gemm_panels()`) that `pack(ctx, pc, kc, j0, nc, dst)` must
// write for B[pc:pc+kc, j0:j0+nc]: ceil(nc / cols) panels, kc * cols floats apart; panel t covers columns
// j0 + t * cols .. + c (c = min(cols, nc - t * cols)); its row q starts at q * stride(c) and holds those
// c values, then zeros up to the stride. dst is 64-byte aligned. `pack` may run on any of the pool's
// threads, several at once.
struct GemmPanels {
  int64_t cols = 0;   // columns of a full panel (0: the set has no packed kernels)
  int64_t lanes = 1;  // a narrow panel's rows are padded to a multiple of this
  int64_t stride(int64_t c) const { return c >= cols ? cols : (c + lanes - 1) / lanes * lanes; }
};
GemmPanels gemm_panels();
struct PackedB {
  void (*pack)(const void* ctx, int64_t pc, int64_t kc, int64_t j0, int64_t nc, float* dst);
  const void* ctx;
};
// Whether gemm_f32_packed_b can run: the kernel set in use (base/cpu_isa.h) has packed kernels.
bool gemm_has_packed_b();
// C[m,n] = alpha * op(A) * B + beta * C, B (k x n) supplied by b.pack. Throws if !gemm_has_packed_b().
void gemm_f32_packed_b(bool trans_a, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                       const PackedB& b, float beta, float* c, int64_t ldc);

}  // namespace kiln::cpu
