// The tensor operations of the core: factories, elementwise math with broadcasting and dtype
// promotion, reductions and matmul. Every differentiable op records its backward (engine/ops_*.cpp).
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "engine/random.h"
#include "engine/tensor.h"

namespace kiln {

struct TensorOptions {
  DType dtype = DType::f32;
  Device device = kCPU;
  bool requires_grad = false;
  TensorOptions() = default;
  TensorOptions(DType d) : dtype(d) {}
  TensorOptions(DType d, Device dev) : dtype(d), device(dev) {}
  TensorOptions& with_grad(bool r = true) {
    requires_grad = r;
    return *this;
  }
};

// ---- factories -------------------------------------------------------------------------------
Tensor empty(const Shape& shape, TensorOptions opts = {});
Tensor zeros(const Shape& shape, TensorOptions opts = {});
Tensor ones(const Shape& shape, TensorOptions opts = {});
Tensor full(const Shape& shape, double value, TensorOptions opts = {});
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
Tensor full_like(const Tensor& t, double value);
Tensor empty_like(const Tensor& t);
Tensor scalar_tensor(double value, TensorOptions opts = {});  // 0-dim
// [start, end) with `step`; the number of elements is ceil((end - start) / step). A step leading
// away from end is an error (start == end gives an empty range), as PyTorch's.
Tensor arange(double start, double end, double step = 1.0, TensorOptions opts = {DType::i64});
Tensor arange(int64_t end, TensorOptions opts = {DType::i64});
Tensor eye(int64_t n, int64_t m = -1, TensorOptions opts = {});
// From host values (row-major), converted to opts.dtype.
Tensor from_vector(const std::vector<double>& values, const Shape& shape, TensorOptions opts = {});
// A tensor over the caller's memory, no copy: `data` holds `shape` elements of `dtype` at `strides`
// (elements; empty: contiguous) on `device`. `deleter(data)` runs when the last tensor viewing it
// lets go (none: the caller keeps the memory alive at least as long). Writes through the tensor
// reach the caller's buffer. A null pointer is an error unless the shape has no elements.
Tensor from_blob(void* data, const Shape& shape, DType dtype, std::function<void(void*)> deleter = {},
                 Device device = kCPU, const Shape& strides = {});
template <typename T> Tensor from_blob_copy(const T* data, const Shape& shape) {
  Tensor t = empty(shape, TensorOptions(DTypeOf<T>::value));
  std::copy(data, data + t.numel(), t.data<T>());
  return t;
}

// Random numbers from the Philox stream of `gen` (default: the context's generator). Each call
// takes the next block of the stream, so the same seed gives the same tensors on CPU and GPU.
Tensor rand(const Shape& shape, TensorOptions opts = {}, Generator* gen = nullptr);  // U[0,1)
Tensor uniform(const Shape& shape, double low, double high, TensorOptions opts = {}, Generator* gen = nullptr);
Tensor randn(const Shape& shape, TensorOptions opts = {}, Generator* gen = nullptr);
Tensor normal(const Shape& shape, double mean, double std, TensorOptions opts = {}, Generator* gen = nullptr);
// Integers uniform in [low, high) (high - low at most 2^24), in opts.dtype (default i64).
Tensor randint(int64_t low, int64_t high, const Shape& shape, TensorOptions opts = {DType::i64}, Generator* gen = nullptr);
// 1 with probability p, else 0, in opts.dtype.
Tensor bernoulli(const Shape& shape, double p, TensorOptions opts = {}, Generator* gen = nullptr);

// ---- elementwise: broadcasting and type promotion ----------------------------------------------
Tensor add(const Tensor& a, const Tensor& b, double alpha = 1.0);  // a + alpha * b
Tensor sub(const Tensor& a, const Tensor& b, double alpha = 1.0);
// Whether add/sub computing in dtype t take alpha, as PyTorch's: any for a floating or bool t; for an integer t
// a whole number t holds (u8: -255 to 255, a negative one taken modulo 256). `subtracts`: -alpha must be one,
// as PyTorch's sub (add with -alpha, negated in int64) checks: i8 sub takes 128, not -128.
bool alpha_fits(DType t, double alpha, bool subtracts = false);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
// Division rounded to a whole number, in the operands' promoted type (integers stay integers):
// div_trunc toward zero (C's /), floor_divide toward -inf (Python's //, PyTorch's
// div(rounding_mode="floor"), computed as PyTorch does: floats from fmod so that 1 // 0.1 is 9, as
// in Python, not floor(1 / 0.1) = 10). An integer divisor of 0 is an error; a float one gives inf or
// NaN. The gradient is zero, as in PyTorch.
Tensor div_trunc(const Tensor& a, const Tensor& b);
Tensor floor_divide(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, double exponent);
// fmod: a - b trunc(a / b) (the sign of a, C's fmod); remainder: a - b floor(a / b) (the sign of b,
// Python's %). Exact for floats and integers; an integer divisor of 0 is an error. atan2(a, b): the
// angle of the point (b, a) in [-pi, pi] (floating results).
Tensor fmod(const Tensor& a, const Tensor& b);
Tensor fmod(const Tensor& a, double b);
Tensor remainder(const Tensor& a, const Tensor& b);
Tensor remainder(const Tensor& a, double b);
Tensor atan2(const Tensor& a, const Tensor& b);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
Tensor neg(const Tensor& a);
Tensor abs(const Tensor& a);
Tensor sign(const Tensor& a);
Tensor exp(const Tensor& a);
Tensor log(const Tensor& a);
Tensor sqrt(const Tensor& a);
Tensor rsqrt(const Tensor& a);
Tensor tanh(const Tensor& a);
Tensor sigmoid(const Tensor& a);
Tensor relu(const Tensor& a);
enum class GeluApprox { none, tanh };
Tensor gelu(const Tensor& a, GeluApprox approx = GeluApprox::none);
Tensor clamp(const Tensor& a, std::optional<double> min, std::optional<double> max);
// Elementwise math (floating results; integer inputs compute in f32, as exp does). floor, ceil, round
// (half to even) and trunc keep an integer tensor as it is; their gradient is 0; frac is x - trunc(x).
Tensor sin(const Tensor& a);
Tensor cos(const Tensor& a);
Tensor tan(const Tensor& a);
Tensor asin(const Tensor& a);
Tensor acos(const Tensor& a);
Tensor atan(const Tensor& a);
Tensor sinh(const Tensor& a);
Tensor cosh(const Tensor& a);
Tensor asinh(const Tensor& a);
Tensor acosh(const Tensor& a);
Tensor atanh(const Tensor& a);
Tensor erf(const Tensor& a);
Tensor erfc(const Tensor& a);
Tensor erfinv(const Tensor& a);
Tensor log1p(const Tensor& a);
// torch.special's gamma and Bessel functions (floating results; integer and bool inputs compute in
// f32, 16-bit ones in f32 rounded back). lgamma is log|Gamma(x)| (inf at the poles), digamma its
// derivative (-inf at +0, NaN at the negative integers), polygamma(n, x) digamma's n-th derivative
// (n >= 0); i0, i1 the modified Bessel functions of the first kind, i0e, i1e them times e^-|x|; ndtri the
// inverse of the normal CDF (+-inf at 0 and 1, NaN outside), log_ndtr the log of the CDF (accurate far
// below 0), erfcx e^(x^2) erfc(x). Their gradients are made of ops, so they differentiate again.
Tensor lgamma(const Tensor& a);
Tensor digamma(const Tensor& a);
Tensor polygamma(int64_t n, const Tensor& a);
Tensor i0(const Tensor& a);
Tensor i0e(const Tensor& a);
Tensor i1(const Tensor& a);
Tensor i1e(const Tensor& a);
Tensor ndtri(const Tensor& a);
Tensor log_ndtr(const Tensor& a);
Tensor erfcx(const Tensor& a);
Tensor expm1(const Tensor& a);
Tensor log2(const Tensor& a);
Tensor log10(const Tensor& a);
Tensor exp2(const Tensor& a);
Tensor reciprocal(const Tensor& a);
Tensor floor(const Tensor& a);
Tensor ceil(const Tensor& a);
Tensor round(const Tensor& a);
Tensor trunc(const Tensor& a);
Tensor frac(const Tensor& a);
// NaN and infinity tests (bool; an integer tensor is all finite), and nan_to_num: NaN -> nan, +inf ->
// posinf, -inf -> neginf (default: the dtype's largest and lowest finite values), as PyTorch.
Tensor isnan(const Tensor& a);
Tensor isinf(const Tensor& a);
Tensor isfinite(const Tensor& a);
Tensor nan_to_num(const Tensor& a, double nan = 0.0, std::optional<double> posinf = std::nullopt,
                  std::optional<double> neginf = std::nullopt);
// a + weight * (b - a), as b - (b - a) * (1 - weight) where |weight| >= 0.5 (exact at weight 1).
Tensor lerp(const Tensor& a, const Tensor& b, const Tensor& weight);
Tensor lerp(const Tensor& a, const Tensor& b, double weight);
// x + value * t1 * t2, and x + value * t1 / t2.
Tensor addcmul(const Tensor& x, const Tensor& t1, const Tensor& t2, double value = 1.0);
Tensor addcdiv(const Tensor& x, const Tensor& t1, const Tensor& t2, double value = 1.0);
// clamp with tensor bounds (broadcast; either may be undefined): min(max(a, min), max). NaN in a stays
// NaN; min > max gives max. The gradient is PyTorch's, ties split and NaN included (docs/ops.md).
Tensor clamp(const Tensor& a, const Tensor& min, const Tensor& max);
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
// Comparisons give bool tensors (not differentiable).
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
Tensor logical_and(const Tensor& a, const Tensor& b);
Tensor logical_or(const Tensor& a, const Tensor& b);
Tensor logical_not(const Tensor& a);
// Bitwise ops on integer and bool tensors (bool: logical and, or, xor, not), broadcasting, in result_type(a, b)
// (bool & bool is bool, i32 & i64 is i64, bool & i32 is i32), not differentiable, as PyTorch's. A floating
// operand is an error naming the op and the operand. The shifts take integer results only (two bool operands
// are refused); a shift by a negative amount or by the width or more gives 0 (to the right: the sign fill,
// 0 or -1), as PyTorch's.
Tensor bitwise_and(const Tensor& a, const Tensor& b);
Tensor bitwise_or(const Tensor& a, const Tensor& b);
Tensor bitwise_xor(const Tensor& a, const Tensor& b);
Tensor bitwise_not(const Tensor& a);
Tensor bitwise_left_shift(const Tensor& a, const Tensor& b);
Tensor bitwise_right_shift(const Tensor& a, const Tensor& b);
// A cast that autograd sees (the gradient is cast back).
Tensor cast(const Tensor& a, DType dtype);

// Scalars take the tensor's dtype when it is floating (a f16 tensor times 2.0 stays f16).
Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a);
Tensor operator+(const Tensor& a, double s);
Tensor operator-(const Tensor& a, double s);
Tensor operator*(const Tensor& a, double s);
Tensor operator/(const Tensor& a, double s);
Tensor operator+(double s, const Tensor& a);
Tensor operator-(double s, const Tensor& a);
Tensor operator*(double s, const Tensor& a);
Tensor operator/(double s, const Tensor& a);
Tensor scalar_like(double s, const Tensor& like);  // 0-dim tensor in the dtype a scalar gets next to `like`
// The type a binary op computes in (PyTorch's result_type): a 0-dim operand next to a dimensioned one
// counts only by its category (bool < integer < floating). int8 [n] + 0-dim i64 gives int8, f16 [n] +
// 0-dim f64 gives f16, but int8 [n] + 0-dim f64 gives f64; two operands of one kind promote_types.
DType result_type(const Tensor& a, const Tensor& b);

// ---- reductions ---------------------------------------------------------------------------------
// An empty `dims` reduces over every dim. Sums of integers and bools give i64.
Tensor sum(const Tensor& a, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor mean(const Tensor& a, const std::vector<int64_t>& dims = {}, bool keepdim = false);
// Variance with Bessel-style `correction` (1: unbiased, 0: population).
Tensor var(const Tensor& a, const std::vector<int64_t>& dims = {}, int64_t correction = 1, bool keepdim = false);
// Max/min over dims; the gradient is shared equally among tied maxima. Over an empty slice a floating
// tensor gives -inf (amax) / +inf (amin), the identities of the reductions; an integer one is an error.
Tensor amax(const Tensor& a, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor amin(const Tensor& a, const std::vector<int64_t>& dims = {}, bool keepdim = false);
struct ValuesIndices {
  Tensor values, indices;
};
// Max/min along one dim with the (first) index of each; the gradient goes to that index.
ValuesIndices max(const Tensor& a, int64_t dim, bool keepdim = false);
ValuesIndices min(const Tensor& a, int64_t dim, bool keepdim = false);
Tensor argmax(const Tensor& a, int64_t dim, bool keepdim = false);
Tensor argmin(const Tensor& a, int64_t dim, bool keepdim = false);
Tensor argmax(const Tensor& a);  // index into the flattened tensor
// log(sum(exp(a))) over dims, as max + log(sum(exp(a - max))); -inf for a slice of all -inf, and
// for an empty one.
Tensor logsumexp(const Tensor& a, const std::vector<int64_t>& dims = {}, bool keepdim = false);
// The p-norm over dims (all by default): p = 2 (Frobenius over several dims), 1, inf (max |a|), -inf
// (min |a|), 0 (the count of non-zeros), or any other p > 0: sum(|a|^p)^(1/p). The 2-norm's gradient
// at 0 is 0, as PyTorch's.
Tensor norm(const Tensor& a, double p = 2.0, const std::vector<int64_t>& dims = {}, bool keepdim = false);
// Whether any / every element over dims is non-zero (bool; empty: false / true), and how many are (i64).
Tensor any(const Tensor& a, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor all(const Tensor& a, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor count_nonzero(const Tensor& a, const std::vector<int64_t>& dims = {});
// Standard deviation, sqrt(var(...)) (torch.std; a function cannot be called std in C++).
Tensor stddev(const Tensor& a, const std::vector<int64_t>& dims = {}, int64_t correction = 1, bool keepdim = false);
// The product over dims (all by default): integers and bool give i64, an empty product is 1. Its
// gradient is exact where a holds zeros (through cumprod's).
Tensor prod(const Tensor& a, const std::vector<int64_t>& dims = {}, bool keepdim = false);

// ---- scans and sorting along one dim -------------------------------------------------------------
// Running sum / product (integers and bool give i64; floats accumulate in f64, one rounding per
// output). cumprod's gradient is exact where x holds zeros.
Tensor cumsum(const Tensor& x, int64_t dim);
Tensor cumprod(const Tensor& x, int64_t dim);
// The running maximum / minimum and where it is: ties take the latest index, and a NaN, once met,
// stays (each later NaN takes the index), as PyTorch. The gradient goes to the picked elements.
ValuesIndices cummax(const Tensor& x, int64_t dim);
ValuesIndices cummin(const Tensor& x, int64_t dim);
// A stable sort along dim (equal values keep their order; NaN sorts after every number, equal to NaN
// in both directions: last ascending, first descending). Values are gathered from x, so their gradient
// goes back to the sorted positions.
ValuesIndices sort(const Tensor& x, int64_t dim = -1, bool descending = false);
Tensor argsort(const Tensor& x, int64_t dim = -1, bool descending = false);
// The k largest (or smallest) along dim, in sorted order (ties in index order), 0 <= k <= size.
ValuesIndices topk(const Tensor& x, int64_t k, int64_t dim = -1, bool largest = true);
// The k-th smallest along dim (1-based), and the lower median (element (n - 1) / 2 in sorted order; a
// slice holding NaN gives NaN and its first NaN's index, as torch.median). median(x): over all elements.
ValuesIndices kthvalue(const Tensor& x, int64_t k, int64_t dim = -1, bool keepdim = false);
ValuesIndices median(const Tensor& x, int64_t dim, bool keepdim = false);
// The most frequent value along dim (the smallest among equally frequent ones) and its last position,
// from the sorted runs.
ValuesIndices mode(const Tensor& x, int64_t dim = -1, bool keepdim = false);
Tensor median(const Tensor& x);

// Sums `a` down to `shape` (the inverse of broadcasting `shape` up to a.shape()).
Tensor sum_to(const Tensor& a, const Shape& shape);

// ---- linear algebra -----------------------------------------------------------------------------
// numpy semantics: 1-D operands are promoted and the added dim removed; batch dims broadcast.
Tensor matmul(const Tensor& a, const Tensor& b);
// Einstein summation, e.g. "bhld,bhmd->bhlm" or "bi,ij,bj->b": lower-case labels, "..." for broadcast
// leading dims, an implicit output (the labels used once, alphabetically) without "->". Operands are
// contracted left to right, each pair as one batched matmul (labels no later operand or the output
// needs are summed out first). A label repeated within one operand (a diagonal) is refused.
Tensor einsum(const std::string& equation, const std::vector<Tensor>& operands);

// ---- matrix decompositions (engine/ops_decomp.cpp): LU, Cholesky, triangular solves ----------------
// Square matrices in the last two dims, batched over the leading ones (A and B broadcast), f32 or f64
// (16-bit and integer tensors are refused, as torch.linalg). On the CPU through Eigen; a CUDA tensor is
// copied to the host, decomposed there and the result copied back. Gradients are PyTorch's, made of these
// ops, so they differentiate again (create_graph). A singular or non-positive-definite input is an error
// naming the op and, in a batch, the element, with PyTorch's wording.
struct LUFactor {
  Tensor LU;      // L below the diagonal (unit diagonal, not stored), U on and above it
  Tensor pivots;  // i32 [..., n], LAPACK's 1-based row swaps: P A = L U
};
// torch.linalg.lu_factor; a zero on U's diagonal (singular A) is an error.
LUFactor linalg_lu_factor(const Tensor& A);
// Solves A X = B (left) or X A = B from lu_factor's result; adjoint: with A^T instead of A.
Tensor linalg_lu_solve(const Tensor& LU, const Tensor& pivots, const Tensor& B, bool left = true, bool adjoint = false);
// A X = B (left) or X A = B. B is a vector (a batch of them) when 1-D or shaped as A without its last dim.
Tensor linalg_solve(const Tensor& A, const Tensor& B, bool left = true);
Tensor linalg_inv(const Tensor& A);
// det(A). Where A is numerically singular (min |U_ii| <= n eps max |U_ii| in its LU, per matrix) the gradient
// is the adjugate's transpose from one SVD (finite, differentiable), as PyTorch's; elsewhere det A^-T.
Tensor linalg_det(const Tensor& A);
struct SignLogAbsDet {
  Tensor sign, logabsdet;  // sign 0 and logabsdet -inf for a singular matrix
};
// At a singular A (an exact zero in U) logabsdet's gradient A^-T has inf/NaN entries, as PyTorch's.
SignLogAbsDet linalg_slogdet(const Tensor& A);
// log(det A): NaN where det < 0, -inf where det is 0.
Tensor logdet(const Tensor& A);
// A = L L^T from A's lower triangle (upper: A = U^T U from its upper triangle, U returned), as LAPACK's
// potrf. A not positive-definite (a pivot <= 0 or NaN) is an error naming the leading minor.
Tensor linalg_cholesky(const Tensor& A, bool upper = false);
struct CholeskyEx {
  Tensor L;
  Tensor info;  // i32 [...]: 0, or the order of the first leading minor that is not positive-definite
};
// cholesky without the error: where info = j > 0, L holds LAPACK's partial factor, as PyTorch's: the first
// j - 1 columns (upper: rows) factored, the failing pivot's value at (j, j), the input's entries after it.
CholeskyEx linalg_cholesky_ex(const Tensor& A, bool upper = false);
// X = A^-1 B with A = L L^T (upper: U^T U) given its factor (torch.cholesky_solve's argument order).
Tensor cholesky_solve(const Tensor& B, const Tensor& L, bool upper = false);
// A^-1 from A's Cholesky factor.
Tensor cholesky_inverse(const Tensor& L, bool upper = false);
// A X = B (left) or X A = B with A upper or lower triangular (the other triangle is not read);
// unitriangular: A's diagonal is taken as ones.
Tensor linalg_solve_triangular(const Tensor& A, const Tensor& B, bool upper, bool left = true,
                               bool unitriangular = false);
// ---- spectral decompositions (engine/ops_spectral.cpp) -------------------------------------------
// torch.linalg's eigh, eigvalsh, svd, svdvals and qr for real f32/f64 matrices in the last two dims,
// batched over the leading ones (16-bit and integer inputs are refused, as torch's CPU kernels refuse
// them). Computed on the host with Eigen (SelfAdjointEigenSolver, BDCSVD, HouseholderQR): a CUDA tensor
// is copied to the host and the results back, no cuSOLVER. Eigen's signs of eigenvectors, singular
// vectors and of R's diagonal may differ from LAPACK's (torch's); the decompositions agree up to those
// signs. Gradients are torch's formulas, made of engine ops, so they differentiate again (create_graph);
// the ones through the vectors need distinct eigenvalues / singular values (repeated ones give
// infinities or NaN, as torch's). NaN or infinity in the input of eigh or svd is an error, as torch's.
struct EighResult {
  Tensor eigenvalues, eigenvectors;  // [..., n] ascending, [..., n, n] as columns
};
// A = V diag(L) V^T from the lower triangle of A (upper: the upper one).
EighResult linalg_eigh(const Tensor& a, bool upper = false);
// linalg_eigh's eigenvalues; the gradient is V diag(g) V^T.
Tensor linalg_eigvalsh(const Tensor& a, bool upper = false);
struct SvdResult {
  Tensor U, S, Vh;  // [..., m, m or k], [..., k] descending, [..., n or k, n]; k = min(m, n)
};
// A = U diag(S) Vh; full_matrices: U and Vh square (their extra columns / rows get no gradient, as torch's).
SvdResult linalg_svd(const Tensor& a, bool full_matrices = true);
// linalg_svd's singular values; the gradient is U diag(g) Vh.
Tensor linalg_svdvals(const Tensor& a);
enum class QrMode { reduced, complete, r };
struct QrResult {
  Tensor Q, R;  // mode r: Q is an empty [0] tensor, as torch's
};
// A = QR by Householder reflections: reduced Q [..., m, k], R [..., k, n]; complete Q [..., m, m],
// R [..., m, n]. Differentiable for m >= n in mode reduced (and complete with m == n), as torch's.
QrResult linalg_qr(const Tensor& a, QrMode mode = QrMode::reduced);

// ---- shape ops as free functions (also on Tensor) -----------------------------------------------
Shape broadcast_shapes(const Shape& a, const Shape& b);
// |a - b| <= atol + rtol |b| everywhere, PyTorch's: the shapes broadcast, an infinity matches only
// itself, NaN matches NaN only with equal_nan.
bool allclose(const Tensor& a, const Tensor& b, double rtol = 1e-5, double atol = 1e-8, bool equal_nan = false);

}  // namespace kiln
