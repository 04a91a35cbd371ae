// GEMM through cuBLASLt. The engine's GEMM is row-major (C = alpha op(A) op(B) + beta C with row
// strides lda/ldb/ldc); cuBLASLt is column-major, so we compute the transpose C^T = op(B)^T op(A)^T,
// which is the same memory: B's buffer becomes cuBLASLt's first operand and A's the second. That
// mapping (operands, transposes, layouts, batch offsets, types, the k == 0 path) is a pure function,
// kernels/common/gemm_plan.h's plan_gemm: this file builds its descriptors from the plan alone, and
// the CUDA emulator executes the same plan on the CPU in CI.
// f32 (TF32 tensor cores only when cuda::set_allow_tf32(true)), f64, and f16/bf16 with f32
// accumulation. The heuristic's choice is cached per plan and pointer alignment.
//
// f16/bf16 products may instead run on Kiln's own Tensor Core kernel (kernels/cuda/tc_gemm.cu),
// chosen by cuda::set_gemm_backend (the `kiln` command maps KILN_GEMM to it): "cublaslt" (never), "kiln" (whenever
// the kernel can take the shape: sm_80+, K and leading dimensions multiples of 8, 16-byte aligned operands; the
// rules are plan_tc_gemm's), or "auto" (the default): both are timed once per shape on the device and the faster
// one is kept.
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>

#include <atomic>
#include <cstdlib>

#include "kernels/common/gemm_plan.h"
#include "kernels/cuda/context.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/ops_cuda.h"
#include "kernels/cuda/tc_gemm.h"

namespace kiln::cuda {
namespace {

constexpr size_t kWorkspaceBytes = libplan::kLtWorkspaceBytes;

using libplan::GemmCall;
using libplan::GemmPath;
using libplan::GemmPlan;
using libplan::TcRefusal;

// The plan's plain enums as cuBLASLt's.
cudaDataType_t lt_type(libplan::LtType t) {
  switch (t) {
    case libplan::LtType::r16f: return CUDA_R_16F;
    case libplan::LtType::r16bf: return CUDA_R_16BF;
    case libplan::LtType::r32f: return CUDA_R_32F;
    case libplan::LtType::r64f: return CUDA_R_64F;
  }
  KILN_FAIL("cuda gemm: unknown data type ", int(t));
}
cublasComputeType_t lt_compute(libplan::LtCompute c) {
  switch (c) {
    case libplan::LtCompute::f32: return CUBLAS_COMPUTE_32F;
    case libplan::LtCompute::f32_fast_tf32: return CUBLAS_COMPUTE_32F_FAST_TF32;
    case libplan::LtCompute::f64: return CUBLAS_COMPUTE_64F;
  }
  KILN_FAIL("cuda gemm: unknown compute type ", int(c));
}
cublasOperation_t lt_op(libplan::LtOp o) { return o == libplan::LtOp::t ? CUBLAS_OP_T : CUBLAS_OP_N; }

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

// The algorithm depends on everything the descriptors say, and on the alignment promised.
using Key = std::tuple<int, int, int, int, int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                       int64_t, int64_t, int, bool, int64_t, int64_t, int64_t>;
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

// Whether the Tensor Core kernel takes the product on this device, and its arguments in g when it does.
TcRefusal tc_route(const GemmCall& call, const void* a, const void* b, void* c, TcGemmArgs& g) {
  TcRefusal r = libplan::plan_tc_gemm(call, a, b, c, &g);
  if (r == TcRefusal::none && !tc_gemm_supported_cached(current().device)) r = TcRefusal::device;
  return r;
}

using ShapeKey = std::tuple<int, int, bool, bool, int64_t, int64_t, int64_t, int64_t>;
std::mutex g_choice_mutex;
std::map<ShapeKey, bool> g_use_kiln;  // auto: the measured winner per shape

void cublaslt_gemm(const GemmCall& call, const GemmPlan& p, const void* a, const void* b, void* c);

// auto: times both on this product (beta == 0, so running it twice is harmless; a beta != 0 product is
// timed on a scratch C) and keeps the faster.
bool measure_kiln_faster(const TcGemmArgs& g, const GemmCall& call, const GemmPlan& plan, const void* a, const void* b,
                         void* c) {
  cudaStream_t s = current().stream;
  cudaEvent_t e[3];
  for (auto& ev : e) KILN_CUDA_OK(cudaEventCreate(&ev));
  float ms_kiln = 0, ms_lt = 0;
  constexpr int kReps = 3;
  tc_gemm(g, s);  // warm-up (and the lazy module load)
  cublaslt_gemm(call, plan, a, b, c);
  KILN_CUDA_OK(cudaEventRecord(e[0], s));
  for (int i = 0; i < kReps; ++i) tc_gemm(g, s);
  KILN_CUDA_OK(cudaEventRecord(e[1], s));
  for (int i = 0; i < kReps; ++i) cublaslt_gemm(call, plan, a, b, c);
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
  const GemmCall call{dt, ta, tb, m, n, k, alpha, lda, sa, ldb, sb, beta, ldc, sc, batch};
  const GemmPlan plan = libplan::plan_gemm(call, allow_tf32());
  if (plan.path == GemmPath::nothing) return;
  TcGemmArgs g;
  const GemmChoice choice = gemm_choice();
  if (plan.path == GemmPath::matmul && choice != GemmChoice::cublaslt &&
      tc_route(call, a, b, c, g) == TcRefusal::none) {
    bool use = choice == GemmChoice::kiln;
    // Deterministic mode takes no timing race (its winner can differ between runs and ranks): Kiln's
    // kernel, which sums in a fixed order, wherever it takes the shape.
    if (choice == GemmChoice::automatic && deterministic()) {
      use = true;
    } else if (choice == GemmChoice::automatic) {
      const ShapeKey key{current().device, int(dt), ta, tb, m, n, k, batch};
      std::lock_guard<std::mutex> lk(g_choice_mutex);
      auto it = g_use_kiln.find(key);
      if (it == g_use_kiln.end() && beta == 0.0) {
        it = g_use_kiln.emplace(key, measure_kiln_faster(g, call, plan, a, b, c)).first;
      } else if (it == g_use_kiln.end()) {
        // beta != 0 (linear's bias as C): C holds values the product adds to, so the race runs with
        // beta 0 on a scratch C of the same layout; a shape seen only with a bias is timed too.
        GemmCall scratch_call = call;
        scratch_call.beta = 0.0;
        const int64_t span = (batch - 1) * sc + (m - 1) * ldc + n;
        DeviceBuffer scratch;
        try {
          scratch = DeviceBuffer(size_t(span) * dtype_size(dt));
        } catch (const OutOfMemory&) {
          // No room for the race: cuBLASLt takes this call, and the shape is timed when room is made.
        }
        TcGemmArgs gs;
        if (scratch.get() != nullptr && tc_route(scratch_call, a, b, scratch.get(), gs) == TcRefusal::none)
          it = g_use_kiln
                   .emplace(key, measure_kiln_faster(gs, scratch_call, libplan::plan_gemm(scratch_call, allow_tf32()),
                                                     a, b, scratch.get()))
                   .first;
      }
      use = it != g_use_kiln.end() && it->second;
    }
    if (use) return tc_gemm(g, current().stream);
  }
  cublaslt_gemm(call, plan, a, b, c);
}

namespace {
// Issues the plan: the scale kernel for k == 0, else one cublasLtMatmul with the plan's descriptors.
void cublaslt_gemm(const GemmCall& call, const GemmPlan& p, const void* a, const void* b, void* c) {
  Context& ctx = current();
  if (p.path == GemmPath::nothing) return;
  if (p.path == GemmPath::scale) {
    // p.c is C^T (n x m, ld ldc), which the kernel takes as the engine's row-major m x n with row stride ldc.
    scale_matrices(libplan::dtype_of(p.data), c, p.c.cols, p.c.rows, p.c.ld, p.c.batch_stride, p.batch_count, p.beta);
    return;
  }
  Descs d;
  KILN_CUBLAS_OK(cublasLtMatmulDescCreate(&d.op, lt_compute(p.compute), lt_type(p.scale)));
  const cublasOperation_t op_a = lt_op(p.trans_a), op_b = lt_op(p.trans_b);
  KILN_CUBLAS_OK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
  KILN_CUBLAS_OK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
  const cudaDataType_t data = lt_type(p.data);
  KILN_CUBLAS_OK(cublasLtMatrixLayoutCreate(&d.a, data, uint64_t(p.a.rows), uint64_t(p.a.cols), p.a.ld));
  KILN_CUBLAS_OK(cublasLtMatrixLayoutCreate(&d.b, data, uint64_t(p.b.rows), uint64_t(p.b.cols), p.b.ld));
  KILN_CUBLAS_OK(cublasLtMatrixLayoutCreate(&d.c, data, uint64_t(p.c.rows), uint64_t(p.c.cols), p.c.ld));
  if (p.batch_count > 1) {
    const int32_t count = int32_t(p.batch_count);  // plan_gemm checked it fits
    const std::pair<cublasLtMatrixLayout_t, int64_t> layouts[3] = {
        {d.a, p.a.batch_stride}, {d.b, p.b.batch_stride}, {d.c, p.c.batch_stride}};
    for (const auto& [layout, stride] : layouts) {
      KILN_CUBLAS_OK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
      KILN_CUBLAS_OK(
          cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
    }
  }
  const void* lt_a = libplan::operand(p.a_from, a, b);
  const void* lt_b = libplan::operand(p.b_from, a, b);

  // cuBLASLt assumes 256-byte aligned operands unless told otherwise (plan's lt_alignment says why we tell it).
  const int al = libplan::lt_alignment(p, a, b, c);
  const Key key{ctx.device, int(p.data),   int(p.compute),   int(p.trans_a),   int(p.trans_b),
                p.a.rows,   p.a.cols,      p.a.ld,           p.b.rows,         p.b.cols,
                p.b.ld,     p.c.rows,      p.c.cols,         p.c.ld,           p.batch_count,
                al,         p.beta != 0.0, p.a.batch_stride, p.b.batch_stride, p.c.batch_stride};
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
    KILN_CHECK(s == CUBLAS_STATUS_SUCCESS && count > 0, "cuda gemm: cuBLASLt has no algorithm for ",
               libplan::describe(call), " (", cublasLtGetStatusString(s), ")");
    algo = res.algo;
    std::lock_guard<std::mutex> lk(g_cache_mutex);
    g_algos.emplace(key, algo);
  }
  DeviceBuffer ws(kWorkspaceBytes);
  const float af = float(p.alpha), bf = float(p.beta);
  const bool f64_scale = p.scale == libplan::LtType::r64f;
  const void* pa = f64_scale ? static_cast<const void*>(&p.alpha) : &af;
  const void* pb = f64_scale ? static_cast<const void*>(&p.beta) : &bf;
  KILN_CUBLAS_OK(cublasLtMatmul(ctx.cublaslt(), d.op, pa, lt_a, d.a, lt_b, d.b, pb, c, d.c, c, d.c, &algo, ws.get(),
                                kWorkspaceBytes, ctx.stream));
}

}  // namespace

}  // namespace kiln::cuda
