// The CUDA backend's GEMM calls as data: pure functions from the engine's row-major product
// (kernels/backend.h Backend::gemm / gemm_batched) to a plain struct describing the cuBLASLt matmul
// exactly as kernels/cuda/gemm.cu issues it, and to the arguments of Kiln's Tensor Core GEMM (or
// the reason it cannot take the product). gemm.cu builds its descriptors from these structs and
// nothing else; the CUDA emulator (kernels/cuda/emulator/library_interp.cpp) builds the same
// structs and executes them on the CPU, reading operands as the library would, so every product
// of the op table checks the mapping in CI. No CUDA headers: this compiles with any C++ compiler.
//
// The mapping: the engine's C = alpha op(A) op(B) + beta C is row-major; cuBLASLt is column-major.
// A row-major matrix with row stride ld is the column-major transpose with the same ld, so we ask
// cuBLASLt for C^T = op(B)^T op(A)^T: B's buffer becomes cuBLASLt's first operand (its "A") and A's
// the second, each with the engine's own transpose flag, and C^T is n x m with leading dimension ldc.
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>

#include "base/dtype.h"
#include "base/error.h"
#include "kernels/common/tc_gemm_layout.h"

namespace kiln::libplan {

// cuBLASLt's enums as plain values; gemm.cu maps each to the library's (cudaDataType_t,
// cublasComputeType_t, cublasOperation_t) one to one.
enum class LtType : uint8_t { r16f, r16bf, r32f, r64f };
enum class LtCompute : uint8_t { f32, f32_fast_tf32, f64 };
enum class LtOp : uint8_t { n, t };
// One of the engine's two operand buffers.
enum class GemmOperand : uint8_t { a, b };
// nothing: the call changes nothing (an empty product, or k == 0 with beta == 1);
// scale: k == 0, so C = beta * C (cuBLASLt rejects k == 0; gemm.cu runs its own scale kernel);
// matmul: one cublasLtMatmul.
enum class GemmPath : uint8_t { nothing, scale, matmul };

// The workspace every cublasLtMatmul call gets (what cuBLASLt asks for on Hopper), taken from the
// device's caching allocator for the call: the memory planner counts it at each matmul as well.
constexpr size_t kLtWorkspaceBytes = size_t(32) << 20;

// A cublasLtMatrixLayout: column-major rows x cols with leading dimension ld (elements), and the
// strided batch offset between consecutive matrices (set on the layout only when batch_count > 1,
// and 0 here otherwise).
struct LtLayout {
  int64_t rows = 0, cols = 0, ld = 0, batch_stride = 0;
};

// The engine's call: the arguments of Backend::gemm_batched without the pointers (gemm is batch 1).
struct GemmCall {
  DType dtype = DType::f32;
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  double alpha = 1.0;
  int64_t lda = 0, stride_a = 0, ldb = 0, stride_b = 0;
  double beta = 0.0;
  int64_t ldc = 0, stride_c = 0, batch = 1;
};

// The cuBLASLt call: D = alpha op_a(A) op_b(B) + beta C with D = C in place (cuBLASLt's A, B, C).
struct GemmPlan {
  GemmPath path = GemmPath::nothing;
  LtType data = LtType::r32f;   // A, B, C and D
  LtType scale = LtType::r32f;  // alpha and beta: double for f64, float otherwise
  LtCompute compute = LtCompute::f32;
  LtOp trans_a = LtOp::n, trans_b = LtOp::n;                     // CUBLASLT_MATMUL_DESC_TRANSA / TRANSB
  GemmOperand a_from = GemmOperand::b, b_from = GemmOperand::a;  // whose buffer cuBLASLt's A and B are
  LtLayout a, b, c;  // c: C and D (also what the scale path scales: cols x rows of the engine's C)
  int64_t batch_count = 1;
  double alpha = 1.0, beta = 0.0;
};

inline std::string describe(const GemmCall& g) {
  return detail::str_cat(
      g.dtype, g.trans_a ? " A^T" : " A", g.trans_b ? " B^T" : " B", " m=", g.m, " n=", g.n, " k=", g.k, " lda=", g.lda,
      " ldb=", g.ldb, " ldc=", g.ldc,
      g.batch != 1 ? detail::str_cat(" batch=", g.batch, " strides ", g.stride_a, "/", g.stride_b, "/", g.stride_c)
                   : std::string());
}

// The buffer the plan names, of the engine's two.
inline const void* operand(GemmOperand which, const void* a, const void* b) { return which == GemmOperand::a ? a : b; }

// The cuBLASLt call for the engine's product. allow_tf32: f32 may run on TF32 tensor cores
// (cuda::allow_tf32()). Throws naming the call for what cuBLASLt would refuse: an unsupported
// dtype, a negative size, a leading dimension shorter than its row, a batch beyond int32.
inline GemmPlan plan_gemm(const GemmCall& g, bool allow_tf32) {
  KILN_CHECK(g.m >= 0 && g.n >= 0 && g.k >= 0 && g.batch >= 0, "cuda gemm: negative size in ", describe(g));
  GemmPlan p;
  if (g.m == 0 || g.n == 0 || g.batch == 0) return p;
  switch (g.dtype) {
    case DType::f32:
      p.data = p.scale = LtType::r32f;
      p.compute = allow_tf32 ? LtCompute::f32_fast_tf32 : LtCompute::f32;
      break;
    case DType::f64:
      p.data = p.scale = LtType::r64f;
      p.compute = LtCompute::f64;
      break;
    // 16-bit operands accumulate in f32 (and alpha, beta are f32): the tensor cores' own mode.
    case DType::f16:
    case DType::bf16:
      p.data = g.dtype == DType::f16 ? LtType::r16f : LtType::r16bf;
      p.scale = LtType::r32f;
      p.compute = LtCompute::f32;
      break;
    default: KILN_FAIL("cuda gemm: dtype ", g.dtype, " is not supported (f32, f64, f16, bf16): ", describe(g));
  }
  p.alpha = g.alpha;
  p.beta = g.beta;
  p.batch_count = g.batch;
  const bool batched = g.batch > 1;
  // Row-major C (m x n, row stride ldc) is column-major C^T: n rows, m columns, ld ldc.
  KILN_CHECK(g.ldc >= std::max<int64_t>(1, g.n), "cuda gemm: ldc ", g.ldc, " is shorter than a row of C (", g.n,
             "): ", describe(g));
  p.c = {g.n, g.m, g.ldc, batched ? g.stride_c : 0};
  if (g.k == 0) {
    // An empty sum: C = beta * C, nothing at all when beta is 1.
    p.path = g.beta == 1.0 ? GemmPath::nothing : GemmPath::scale;
    return p;
  }
  KILN_CHECK(g.batch < INT32_MAX, "cuda gemm: ", g.batch, " products in one batch is too many: ", describe(g));
  // cuBLASLt's A is the engine's B: stored k x n (n x k when transposed) row-major, that is n x k
  // (k x n) column-major, and op_a = the engine's trans_b turns it into op(B)^T (n x k).
  const int64_t b_row = g.trans_b ? g.k : g.n, a_row = g.trans_a ? g.m : g.k;
  KILN_CHECK(g.ldb >= std::max<int64_t>(1, b_row), "cuda gemm: ldb ", g.ldb, " is shorter than a row of ",
             g.trans_b ? "B^T (k)" : "B (n)", ", ", b_row, ": ", describe(g));
  KILN_CHECK(g.lda >= std::max<int64_t>(1, a_row), "cuda gemm: lda ", g.lda, " is shorter than a row of ",
             g.trans_a ? "A^T (m)" : "A (k)", ", ", a_row, ": ", describe(g));
  p.path = GemmPath::matmul;
  p.a_from = GemmOperand::b;
  p.b_from = GemmOperand::a;
  p.trans_a = g.trans_b ? LtOp::t : LtOp::n;
  p.trans_b = g.trans_a ? LtOp::t : LtOp::n;
  p.a = {b_row, g.trans_b ? g.n : g.k, g.ldb, batched ? g.stride_b : 0};
  p.b = {a_row, g.trans_a ? g.k : g.m, g.lda, batched ? g.stride_a : 0};
  return p;
}

inline size_t lt_type_size(LtType t) {
  switch (t) {
    case LtType::r16f:
    case LtType::r16bf: return 2;
    case LtType::r32f: return 4;
    case LtType::r64f: return 8;
  }
  return 0;
}

inline DType dtype_of(LtType t) {
  switch (t) {
    case LtType::r16f: return DType::f16;
    case LtType::r16bf: return DType::bf16;
    case LtType::r32f: return DType::f32;
    case LtType::r64f: return DType::f64;
  }
  return DType::f32;
}

// The largest power of two up to 256 dividing an address (or a byte offset).
inline int alignment_of(uintptr_t a) {
  for (int al = 256; al > 1; al /= 2)
    if (a % uintptr_t(al) == 0) return al;
  return 1;
}

// The operand alignment to promise cuBLASLt (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES): it
// assumes 256 bytes unless told otherwise, and views and batch strides are often less aligned, so
// we tell it the truth (it then skips kernels that need more). a, b, c: the three buffers.
inline int lt_alignment(const GemmPlan& p, const void* a, const void* b, const void* c) {
  int al = std::min({alignment_of(reinterpret_cast<uintptr_t>(a)), alignment_of(reinterpret_cast<uintptr_t>(b)),
                     alignment_of(reinterpret_cast<uintptr_t>(c))});
  const auto es = int64_t(lt_type_size(p.data));
  for (const LtLayout* l : {&p.a, &p.b, &p.c}) al = std::min(al, alignment_of(uintptr_t(l->batch_stride * es)));
  return al;
}

// ---- Kiln's Tensor Core GEMM: which products it takes ----------------------------------------------

// Why the Tensor Core kernel (kernels/cuda/tc_gemm.cu) cannot take a product; cuBLASLt takes it then.
enum class TcRefusal : uint8_t {
  none,           // it can
  not_16bit,      // operands are not f16 or bf16
  empty,          // m, n, k or batch is 0 (gemm.cu handles those before)
  k_alignment,    // K is not a multiple of 8 (the kernel copies 8-element chunks along K)
  lda_alignment,  // lda is not a multiple of 8 (every chunk must be 16-byte aligned)
  ldb_alignment,
  stride_alignment,  // a batch stride of A or B is not a multiple of 8
  a_misaligned,      // A's pointer is not 16-byte aligned
  b_misaligned,
  c_overlap,        // batches of C overlap (stride_c below one output, 0 say): its batches write in parallel
  batch_over_grid,  // batch > 65535: the grid's z dimension
  rows_over_grid,   // more than 65535 row blocks of 128: the grid's y dimension
  device,           // the device cannot run it (before sm_80, or no code for it in this build)
};

inline const char* tc_refusal_text(TcRefusal r) {
  switch (r) {
    case TcRefusal::none: return "taken";
    case TcRefusal::not_16bit: return "operands are not f16 or bf16";
    case TcRefusal::empty: return "an empty product";
    case TcRefusal::k_alignment: return "K is not a multiple of 8";
    case TcRefusal::lda_alignment: return "lda is not a multiple of 8";
    case TcRefusal::ldb_alignment: return "ldb is not a multiple of 8";
    case TcRefusal::stride_alignment: return "a batch stride of A or B is not a multiple of 8";
    case TcRefusal::a_misaligned: return "A is not 16-byte aligned";
    case TcRefusal::b_misaligned: return "B is not 16-byte aligned";
    case TcRefusal::c_overlap: return "the batch stride of C is smaller than one output: the batches overlap";
    case TcRefusal::batch_over_grid: return "batch is more than the grid's z dimension (65535)";
    case TcRefusal::rows_over_grid: return "M needs more than 65535 row blocks (the grid's y dimension)";
    case TcRefusal::device: return "the device cannot run it (sm_80 or newer)";
  }
  return "unknown";
}

// Whether the Tensor Core kernel takes the engine's product (the device aside: gemm.cu asks it only
// when the shape passes, and answers TcRefusal::device itself), and if so its arguments in *out:
// A^T stored [k, m] is A column-major, B^T stored [n, k] is B column-major; C is both C0 (when beta
// is not 0) and the output.
inline TcRefusal plan_tc_gemm(const GemmCall& g, const void* a, const void* b, void* c, tcgemm::GemmArgs* out) {
  if (!is_low_precision(g.dtype)) return TcRefusal::not_16bit;
  if (g.m <= 0 || g.n <= 0 || g.k <= 0 || g.batch <= 0) return TcRefusal::empty;
  if (g.k % 8 != 0) return TcRefusal::k_alignment;
  if (g.lda % 8 != 0) return TcRefusal::lda_alignment;
  if (g.ldb % 8 != 0) return TcRefusal::ldb_alignment;
  if (g.stride_a % 8 != 0 || g.stride_b % 8 != 0) return TcRefusal::stride_alignment;
  if (reinterpret_cast<uintptr_t>(a) % 16 != 0) return TcRefusal::a_misaligned;
  if (reinterpret_cast<uintptr_t>(b) % 16 != 0) return TcRefusal::b_misaligned;
  // check_tc_gemm_args' rule: the kernel's batches would race on a shared C, so cuBLASLt takes those.
  if (g.batch > 1 && g.stride_c < (g.m - 1) * g.ldc + g.n) return TcRefusal::c_overlap;
  if (g.batch > 65535) return TcRefusal::batch_over_grid;
  if ((g.m + tcgemm::kBM - 1) / tcgemm::kBM > 65535) return TcRefusal::rows_over_grid;
  if (out) {
    tcgemm::GemmArgs& t = *out;
    t = tcgemm::GemmArgs{};
    t.in_dtype = t.out_dtype = g.dtype;
    t.la = g.trans_a ? tcgemm::Layout::col : tcgemm::Layout::row;
    t.lb = g.trans_b ? tcgemm::Layout::col : tcgemm::Layout::row;
    t.M = g.m;
    t.N = g.n;
    t.K = g.k;
    t.lda = g.lda;
    t.ldb = g.ldb;
    t.ldc = g.ldc;
    t.a = a;
    t.b = b;
    t.out = c;
    t.c0 = g.beta != 0.0 ? c : nullptr;
    t.batch = g.batch;
    t.stride_a = g.stride_a;
    t.stride_b = g.stride_b;
    t.stride_c = g.stride_c;
    t.ep.alpha = float(g.alpha);
    t.ep.beta = float(g.beta);
  }
  return TcRefusal::none;
}

// The rules the Tensor Core kernel's arguments must keep, each a clear error prefixed by `who`:
// tc_gemm (kernels/cuda/tc_gemm.cu) checks them before every launch and the emulator's interpreter
// before it runs them, so both refuse the same arguments.
inline void check_tc_gemm_args(const tcgemm::GemmArgs& g, const char* who) {
  KILN_CHECK(g.in_dtype == DType::f16 || g.in_dtype == DType::bf16, who, ": inputs must be f16 or bf16, got ",
             g.in_dtype);
  KILN_CHECK(g.out_dtype == DType::f32 || g.out_dtype == DType::f16 || g.out_dtype == DType::bf16, who,
             ": the output must be f32, f16 or bf16, got ", g.out_dtype);
  KILN_CHECK(g.M > 0 && g.N > 0 && g.K > 0 && g.batch > 0, who, ": empty problem M ", g.M, " N ", g.N, " K ", g.K);
  KILN_CHECK(g.K % 8 == 0, who, ": K must be a multiple of 8, got ", g.K);
  const int64_t a_inner = g.la == tcgemm::Layout::row ? g.K : g.M, b_inner = g.lb == tcgemm::Layout::col ? g.K : g.N;
  KILN_CHECK(g.lda % 8 == 0 && g.lda >= a_inner, who, ": lda ", g.lda, " must be a multiple of 8 and >= ", a_inner);
  KILN_CHECK(g.ldb % 8 == 0 && g.ldb >= b_inner, who, ": ldb ", g.ldb, " must be a multiple of 8 and >= ", b_inner);
  KILN_CHECK(g.ldc >= g.N, who, ": ldc ", g.ldc, " must be >= N ", g.N);
  KILN_CHECK(reinterpret_cast<uintptr_t>(g.a) % 16 == 0 && reinterpret_cast<uintptr_t>(g.b) % 16 == 0, who,
             ": A and B must be 16-byte aligned");
  KILN_CHECK(g.stride_a % 8 == 0 && g.stride_b % 8 == 0, who, ": batch strides of A and B must be multiples of 8");
  KILN_CHECK(g.ep.beta == 0.0f || g.c0, who, ": beta is ", g.ep.beta, " but no C0 was given");
  KILN_CHECK(g.out, who, ": no output");
  // Each batch's blocks write their own C: output batches that overlap would race.
  KILN_CHECK(g.batch == 1 || g.stride_c >= (g.M - 1) * g.ldc + g.N, who, ": batch stride of C ", g.stride_c,
             " is smaller than one output (", g.M, " rows of ldc ", g.ldc, "): the batches would overwrite each other");
  KILN_CHECK(g.batch <= 65535, who, ": batch ", g.batch, " is more than a grid's z dimension (65535)");
  KILN_CHECK((g.M + tcgemm::kBM - 1) / tcgemm::kBM <= 65535, who, ": M ", g.M, " needs more than 65535 row blocks of ",
             tcgemm::kBM, " (a grid's y dimension)");
}

}  // namespace kiln::libplan
