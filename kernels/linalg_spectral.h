// The spectral decompositions on the host with Eigen (kernels/cpu/linalg_spectral.cpp), for
// engine/ops_spectral.cpp: symmetric eigendecomposition, SVD and Householder QR of a batch of real
// matrices, f32 or f64, each stored row-major and contiguous, one after the other. Every function
// returns "" or a message saying what failed (a decomposition that did not converge, which LAPACK
// reports as torch's errors do); the engine adds the op's name. CUDA tensors come here through a copy
// to the host (no cuSOLVER).
#pragma once
#include <cstdint>
#include <string>

#include "base/dtype.h"

namespace kiln::spectral {

// a: [batch, n, n]; the lower (upper = false) or upper triangle is read. w: [batch, n] eigenvalues in
// ascending order; v: [batch, n, n] their orthonormal eigenvectors as columns (null: values only).
std::string eigh(DType dt, int64_t batch, int64_t n, const void* a, bool upper, void* w, void* v);
// a: [batch, m, n], k = min(m, n). s: [batch, k] singular values, descending. With u non-null:
// u [batch, m, full ? m : k] and vh [batch, full ? n : k, n].
std::string svd(DType dt, int64_t batch, int64_t m, int64_t n, const void* a, bool full, void* u, void* s, void* vh);
// a: [batch, m, n], k = min(m, n). complete: q [batch, m, m], r [batch, m, n]; otherwise q [batch, m, k]
// (null: not wanted, mode 'r') and r [batch, k, n]. R's diagonal is Householder's (any sign).
std::string qr(DType dt, int64_t batch, int64_t m, int64_t n, const void* a, bool complete, void* q, void* r);
// r: [batch, n, n] upper triangular (the strict lower part is not read); out: its inverse, upper
// triangular, by back substitution. A zero on the diagonal gives infinities, as a division by zero.
void upper_triangular_inverse(DType dt, int64_t batch, int64_t n, const void* r, void* out);

}  // namespace kiln::spectral
