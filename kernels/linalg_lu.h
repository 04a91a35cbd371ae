// CPU kernels of the matrix decompositions (kernels/cpu/linalg_lu.cpp, Eigen): LU with partial pivoting,
// triangular solves and Cholesky on `batch` row-major n x n matrices stored back to back, f32 or f64.
// engine/ops_decomp.cpp calls them; a CUDA tensor is copied to the host for them and its result back.
#pragma once
#include <cstdint>

#include "base/dtype.h"

namespace kiln::cpu {

// ---- LU, triangular solves, Cholesky (linalg_lu.cpp) ----
// P A = L U in place: L (unit diagonal, not stored) below the diagonal, U on and above it. piv [batch, n]
// gets LAPACK's 1-based pivots (row i was swapped with row piv[i] - 1, in order i = 0, 1, ...); info
// [batch] 0, or the 1-based index of the first zero on U's diagonal (the matrix is singular).
void lu_factor(DType dt, int64_t batch, int64_t n, void* a, int32_t* piv, int32_t* info);
// A X = B for triangular A [batch, n, n] (the other triangle is not read; unit: the diagonal is taken as
// ones), B [batch, n, k] overwritten with X.
void triangular_solve(DType dt, int64_t batch, int64_t n, int64_t k, const void* a, void* b, bool upper, bool unit);
// A = L L^T in place from the lower triangle: L there, the upper one zeroed. info [batch]: 0, or the order
// j of the first leading minor that is not positive-definite (a pivot <= 0 or NaN); A then holds LAPACK's
// partial factor (columns < j factored, the failing pivot on the diagonal, the rest as it was).
void cholesky(DType dt, int64_t batch, int64_t n, void* a, int32_t* info);

}  // namespace kiln::cpu
