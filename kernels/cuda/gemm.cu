// GEMM through cuBLASLt. The engine's GEMM is row-major (C = alpha op(A) op(B) + beta C with row
// strides lda/ldb/ldc); cuBLASLt is column-major, so we compute the transpose C^T = op(B)^T op(A)^T,
// which is the same memory: B's buffer becomes cuBLASLt's first operand and A's the second.
// f32 (TF32 tensor cores only when cuda::set_allow_tf32(true)), f64, and f16/bf16 with f32
// accumulation. The heuristic's choice is cached per shape, layout and pointer alignment.
//
// f16/bf16 products may instead run on Kiln's own Tensor Core kernel (kernels/cuda/tc_gemm.cu),
// chosen by cuda::set_gemm_backend (the `kiln` command maps KILN_GEMM to it): "cublaslt" (never), "kiln" (whenever the kernel can take the shape: sm_80+,
// K and leading dimensions multiples of 8, 16-byte aligned operands), or "auto" (the default):
// both are timed once per shape on the device and the faster one is kept.
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>

#include <atomic>
#include <cstdlib>

#include "kernels/cuda/context.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/ops_cuda.h"
#include "kernels/cuda/tc_gemm.h"

namespace kiln::cuda {
namespace {

constexpr size_t kWorkspaceBytes = size_t(32) << 20;  // what cuBLASLt asks for on Hopper

// Launch: grid-stride over the m x n matrix (row stride ldc), one thread per element.
// Memory: reads and writes each element once. Only for k == 0, where C = beta * C.
template <typename T> __global__ void scale_matrix(T* c, int64_t m, int64_t n, int64_t ldc, DAcc<T> beta) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < m * n; i += int64_t(gridDim.x) * blockDim.x) {
    T* p = c + (i / n) * ldc + i % n;
    st(p, beta == DAcc<T>(0) ? DAcc<T>(0) : DAcc<T>(ld(p) * beta));
  }
}

struct Types {
  cudaDataType_t data, scale;
  cublasComputeType_t compute;
};
Types types_of(DType dt) {
  switch (dt) {
    case DType::f32:
      return {CUDA_R_32F, CUDA_R_32F, allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F};
    case DType::f64: return {CUDA_R_64F, CUDA_R_64F, CUBLAS_COMPUTE_64F};
    case DType::f16: return {CUDA_R_16F, CUDA_R_32F, CUBLAS_COMPUTE_32F};
    case DType::bf16: return {CUDA_R_16BF, CUDA_R_32F, CUBLAS_COMPUTE_32F};
    default: KILN_FAIL("cuda gemm: dtype ", dt, " is not supported (f32, f64, f16, bf16)");
  }
}

int alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  for (int al = 256; al > 1; al /= 2)
    if (a % uintptr_t(al) == 0) return al;
  return 1;
}

// RAII for the four cuBLASLt descriptors of one call.
struct Descs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  ~Descs() {
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

using Key = std::tuple<int, int, int, bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, bool, int64_t,
                       int64_t, int64_t, int64_t>;
std::mutex g_cache_mutex;
std::map<Key, cublasLtMatmulAlgo_t> g_algos;

enum class GemmChoice : int { cublaslt, kiln, automatic };
GemmChoice parse_choice(const std::string& v, const char* from) {
  if (v == "cublaslt") return GemmChoice::cublaslt;
  if (v == "kiln") return GemmChoice::kiln;
  KILN_CHECK(v == "auto" || v.empty(), from, v, ": expected kiln, cublaslt or auto");
  return GemmChoice::automatic;
}
std::atomic<int> g_choice{int(GemmChoice::automatic)};
GemmChoice gemm_choice() { return GemmChoice(g_choice.load()); }

// Whether the Tensor Core kernel runs on `device`, asked once per device (a machine may mix an
// sm_75 and an sm_80 GPU: each answers for itself).
bool tc_gemm_supported_cached(int device) {
  constexpr int kMaxDevices = 64;
  static std::atomic<int8_t> known[kMaxDevices] = {};  // 0: not asked yet, 1: yes, -1: no
  if (device < 0 || device >= kMaxDevices) return tc_gemm_supported(device);
  int8_t v = known[device].load(std::memory_order_relaxed);
  if (v == 0) {
    v = tc_gemm_supported(device) ? 1 : -1;
    known[device].store(v, std::memory_order_relaxed);
  }
  return v > 0;
}

// The Tensor Core kernel's arguments for a row-major product, when it can take it.
bool tc_args(DType dt, bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const void* a, int64_t lda,
             int64_t sa, const void* b, int64_t ldb, int64_t sb, double beta, void* c, int64_t ldc, int64_t sc,
             int64_t batch, TcGemmArgs& g) {
  if (!is_low_precision(dt) || k % 8 != 0 || lda % 8 != 0 || ldb % 8 != 0 || sa % 8 != 0 || sb % 8 != 0 ||
      batch > 65535 || reinterpret_cast<uintptr_t>(a) % 16 != 0 || reinterpret_cast<uintptr_t>(b) % 16 != 0)
    return false;
  // The kernel's grid is (N / kBN, M / kBM, batch): y and z stop at 65535 (cuBLASLt takes the rest).
  if ((m + tcgemm::kBM - 1) / tcgemm::kBM > 65535) return false;
  if (!tc_gemm_supported_cached(current().device)) return false;
  g.in_dtype = g.out_dtype = dt;
  g.la = ta ? tcgemm::Layout::col : tcgemm::Layout::row;  // A^T stored [k, m] is A column-major
  g.lb = tb ? tcgemm::Layout::col : tcgemm::Layout::row;  // B^T stored [n, k] is B column-major
  g.M = m;
  g.N = n;
  g.K = k;
  g.lda = lda;
  g.ldb = ldb;
  g.ldc = ldc;
  g.a = a;
  g.b = b;
  g.out = c;
  g.c0 = beta != 0.0 ? c : nullptr;
  g.batch = batch;
  g.stride_a = sa;
  g.stride_b = sb;
  g.stride_c = sc;
  g.ep.alpha = float(alpha);
  g.ep.beta = float(beta);
  return true;
}

using ShapeKey = std::tuple<int, int, bool, bool, int64_t, int64_t, int64_t, int64_t>;
std::mutex g_choice_mutex;
std::map<ShapeKey, bool> g_use_kiln;  // auto: the measured winner per shape

void cublaslt_gemm(DType dt, bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const void* a,
                   int64_t lda, int64_t sa, const void* b, int64_t ldb, int64_t sb, double beta, void* c, int64_t ldc,
                   int64_t sc, int64_t batch);

// auto: times both on this product (beta == 0, so running it twice is harmless) and keeps the faster.
bool measure_kiln_faster(const TcGemmArgs& g, DType dt, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                         double alpha, const void* a, int64_t lda, int64_t sa, const void* b, int64_t ldb, int64_t sb,
                         void* c, int64_t ldc, int64_t sc, int64_t batch) {
  cudaStream_t s = current().stream;
  cudaEvent_t e[3];
  for (auto& ev : e) KILN_CUDA_OK(cudaEventCreate(&ev));
  float ms_kiln = 0, ms_lt = 0;
  constexpr int kReps = 3;
  tc_gemm(g, s);  // warm-up (and the lazy module load)
  cublaslt_gemm(dt, ta, tb, m, n, k, alpha, a, lda, sa, b, ldb, sb, 0.0, c, ldc, sc, batch);
  KILN_CUDA_OK(cudaEventRecord(e[0], s));
  for (int i = 0; i < kReps; ++i) tc_gemm(g, s);
  KILN_CUDA_OK(cudaEventRecord(e[1], s));
  for (int i = 0; i < kReps; ++i) cublaslt_gemm(dt, ta, tb, m, n, k, alpha, a, lda, sa, b, ldb, sb, 0.0, c, ldc, sc, batch);
  KILN_CUDA_OK(cudaEventRecord(e[2], s));
  KILN_CUDA_OK(cudaEventSynchronize(e[2]));
  KILN_CUDA_OK(cudaEventElapsedTime(&ms_kiln, e[0], e[1]));
  KILN_CUDA_OK(cudaEventElapsedTime(&ms_lt, e[1], e[2]));
  for (auto& ev : e) cudaEventDestroy(ev);
  return ms_kiln < ms_lt;
}

}  // namespace

void set_gemm_backend(const std::string& which) { g_choice = int(parse_choice(which, "set_gemm_backend: ")); }
std::string gemm_backend() {
  switch (gemm_choice()) {
    case GemmChoice::cublaslt: return "cublaslt";
    case GemmChoice::kiln: return "kiln";
    default: return "auto";
  }
}

void gemm(DType dt, bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const void* a, int64_t lda,
          const void* b, int64_t ldb, double beta, void* c, int64_t ldc) {
  gemm_batched(dt, ta, tb, m, n, k, alpha, a, lda, 0, b, ldb, 0, beta, c, ldc, 0, 1);
}

void gemm_batched(DType dt, bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const void* a,
                  int64_t lda, int64_t sa, const void* b, int64_t ldb, int64_t sb, double beta, void* c, int64_t ldc,
                  int64_t sc, int64_t batch) {
  if (m == 0 || n == 0 || batch == 0) return;
  TcGemmArgs g;
  const GemmChoice choice = gemm_choice();
  if (k > 0 && choice != GemmChoice::cublaslt &&
      tc_args(dt, ta, tb, m, n, k, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc, sc, batch, g)) {
    bool use = choice == GemmChoice::kiln;
    // Deterministic mode takes no timing race (its winner can differ between runs and ranks): Kiln's
    // kernel, which sums in a fixed order, wherever it takes the shape.
    if (choice == GemmChoice::automatic && deterministic()) {
      use = true;
    } else if (choice == GemmChoice::automatic) {
      const ShapeKey key{current().device, int(dt), ta, tb, m, n, k, batch};
      std::lock_guard<std::mutex> lk(g_choice_mutex);
      auto it = g_use_kiln.find(key);
      if (it == g_use_kiln.end() && beta == 0.0)
        it = g_use_kiln.emplace(key, measure_kiln_faster(g, dt, ta, tb, m, n, k, alpha, a, lda, sa, b, ldb, sb, c, ldc,
                                                         sc, batch)).first;
      use = it != g_use_kiln.end() && it->second;
    }
    if (use) return tc_gemm(g, current().stream);
  }
  cublaslt_gemm(dt, ta, tb, m, n, k, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc, sc, batch);
}

namespace {
void cublaslt_gemm(DType dt, bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const void* a,
                   int64_t lda, int64_t sa, const void* b, int64_t ldb, int64_t sb, double beta, void* c, int64_t ldc,
                   int64_t sc, int64_t batch) {
  Context& ctx = current();
  const Types ty = types_of(dt);
  if (k == 0) {
    if (beta == 1.0) return;
    visit_dtype(dt, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (is_float_v<T>) {
        for (int64_t i = 0; i < batch; ++i)
          launch("scale_matrix", scale_matrix<T>, grid_for(m * n), kThreads, 0, ctx.stream, static_cast<T*>(c) + i * sc,
                 m, n, ldc, DAcc<T>(beta));
      }
    });
    return;
  }
  // Column-major view: D (n x m, ld ldc) = opA'(B) (n x k) * opB'(A) (k x m).
  const cublasOperation_t op_first = tb ? CUBLAS_OP_T : CUBLAS_OP_N, op_second = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  Descs d;
  KILN_CUBLAS_OK(cublasLtMatmulDescCreate(&d.op, ty.compute, ty.scale));
  KILN_CUBLAS_OK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_first, sizeof(op_first)));
  KILN_CUBLAS_OK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_second, sizeof(op_second)));
  // Stored shapes (rows x cols, column-major): the first operand is B's buffer, the second A's.
  KILN_CUBLAS_OK(cublasLtMatrixLayoutCreate(&d.a, ty.data, tb ? k : n, tb ? n : k, ldb));
  KILN_CUBLAS_OK(cublasLtMatrixLayoutCreate(&d.b, ty.data, ta ? m : k, ta ? k : m, lda));
  KILN_CUBLAS_OK(cublasLtMatrixLayoutCreate(&d.c, ty.data, n, m, ldc));
  if (batch > 1) {
    const int32_t count = int32_t(batch);
    KILN_CHECK(batch < INT32_MAX, "cuda gemm: ", batch, " products in one batch is too many");
    const std::pair<cublasLtMatrixLayout_t, int64_t> layouts[3] = {{d.a, sb}, {d.b, sa}, {d.c, sc}};
    for (const auto& [layout, stride] : layouts) {
      KILN_CUBLAS_OK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
      KILN_CUBLAS_OK(
          cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
    }
  }

  // cuBLASLt assumes 256-byte aligned operands unless told otherwise; views and batch strides are
  // often less aligned, so tell it the truth (it then skips kernels that need more).
  int al = std::min({alignment(a), alignment(b), alignment(c)});
  if (batch > 1) {
    const auto es = int64_t(dtype_size(dt));
    for (int64_t stride : {sa, sb, sc}) al = std::min(al, alignment(reinterpret_cast<const void*>(stride * es)));
  }
  const Key key{ctx.device, int(dt), int(ty.compute), ta, tb, m, n, k, lda, ldb, ldc, al, beta != 0.0, batch, sa, sb, sc};
  cublasLtMatmulAlgo_t algo;
  bool found = false;
  {
    std::lock_guard<std::mutex> lk(g_cache_mutex);
    auto it = g_algos.find(key);
    if (it != g_algos.end()) {
      algo = it->second;
      found = true;
    }
  }
  if (!found) {
    cublasLtMatmulPreference_t pref = nullptr;
    KILN_CUBLAS_OK(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws = kWorkspaceBytes;
    const uint32_t align = uint32_t(al);
    cublasStatus_t ps = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
    for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
      if (ps == CUBLAS_STATUS_SUCCESS) ps = cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof(align));
    if (ps != CUBLAS_STATUS_SUCCESS) cublasLtMatmulPreferenceDestroy(pref);
    KILN_CUBLAS_OK(ps);
    cublasLtMatmulHeuristicResult_t res{};
    int count = 0;
    const cublasStatus_t s =
        cublasLtMatmulAlgoGetHeuristic(ctx.cublaslt(), d.op, d.a, d.b, d.c, d.c, pref, 1, &res, &count);
    cublasLtMatmulPreferenceDestroy(pref);
    KILN_CHECK(s == CUBLAS_STATUS_SUCCESS && count > 0, "cuda gemm: cuBLASLt has no algorithm for ", dt, " m=", m,
               " n=", n, " k=", k, " lda=", lda, " ldb=", ldb, " ldc=", ldc, " (", cublasLtGetStatusString(s), ")");
    algo = res.algo;
    std::lock_guard<std::mutex> lk(g_cache_mutex);
    g_algos.emplace(key, algo);
  }
  DeviceBuffer ws(kWorkspaceBytes);
  const float af = float(alpha), bf = float(beta);
  const void* pa = dt == DType::f64 ? static_cast<const void*>(&alpha) : &af;
  const void* pb = dt == DType::f64 ? static_cast<const void*>(&beta) : &bf;
  KILN_CUBLAS_OK(cublasLtMatmul(ctx.cublaslt(), d.op, pa, b, d.a, a, d.b, pb, c, d.c, c, d.c, &algo, ws.get(),
                                kWorkspaceBytes, ctx.stream));
}

}  // namespace

}  // namespace kiln::cuda
