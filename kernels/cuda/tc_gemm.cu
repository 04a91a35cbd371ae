// Kiln's FP16/BF16 Tensor Core GEMM for sm_80+: mma.sync m16n8k16 with f32 accumulation,
// cp.async staging, ldmatrix fragments, fused epilogue.
//
// Launch: grid (ceil(N/128), ceil(M/128), batch), 256 threads = 8 warps (2 along m x 4 along n),
// 48 KB of dynamic shared memory (3 stages x (A 128x32 + B 32x128) halves).
// Block: the 128 x 128 tile of C at (blockIdx.y * 128, blockIdx.x * 128), K in steps of 32.
// Thread: per stage copies 2 aligned 16-byte chunks of A and 2 of B with cp.async (a chunk past
//   an edge copies only its valid bytes and zero-fills the rest: nothing outside A or B is read).
// Warp: a 64 x 32 sub-tile, 4 x 4 MMA tiles of 16 x 8; per k16 step it loads 4 A fragments and
//   2 x (two B fragments) with ldmatrix.x4 (.trans for operands whose tile is MN-major) and issues
//   16 mma.sync. Each thread holds 4 x 4 x 4 = 64 f32 accumulators.
// Pipeline: stages kt+1, kt+2 are in flight while kt is computed (cp.async.wait_group 1, then a
//   barrier, then the copy for kt+2 into the stage freed by kt-1).
// Memory traffic per block: (128 x K) x 2 operands x 2 bytes read once from global memory; C read
//   (beta, residual) and written once; each shared-memory element is read by 4 (A) or 2 (B) warps.
// Every index (chunk -> shared offset, swizzles, lane -> ldmatrix address, accumulator -> C) is a
// function from kernels/common/tc_gemm_layout.h, which tests/test_tcgemm.cpp proves on the CPU.
#include <cuda_runtime.h>

#include <cmath>
#include <random>
#include <sstream>
#include <vector>

#include "base/error.h"
#include "base/half.h"
#include "kernels/common/gemm_plan.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/tc_gemm.h"

namespace kiln::cuda {
namespace {

using namespace kiln::tcgemm;

struct Params {
  const uint16_t* a;
  const uint16_t* b;
  void* out;
  const void* c0;
  const float* bias;
  const void* residual;
  int64_t M, N, K, lda, ldb, ldc, stride_a, stride_b, stride_c;
  int out_kind;  // 0 f32, 1 f16, 2 bf16
  Epilogue ep;
};

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// One aligned 16-byte global -> shared copy, of which only `bytes` are read (the rest zero-filled).
__device__ __forceinline__ void cp_async16(const void* smem_dst, const void* gmem_src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(smem_dst)), "l"(gmem_src), "r"(bytes));
}

// Four 8x8 b16 matrices from the row addresses the lanes supply (.trans: each delivered transposed).
template <bool kTrans> __device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem_row) {
  const uint32_t addr = smem_u32(smem_row);
  if constexpr (kTrans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// d += a (16x16, row) * b (16x8, col), f32 accumulation.
template <bool kBf16>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (kBf16)
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <bool kBf16, bool kAMajorK, bool kBMajorK>
__global__ void __launch_bounds__(kThreads) tc_gemm_kernel(Params p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  extern __shared__ __align__(128) uint16_t smem[];
  uint16_t* const sa = smem;
  uint16_t* const sb = smem + kStages * kTileHalves;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int64_t bm = int64_t(blockIdx.y) * kBM, bn = int64_t(blockIdx.x) * kBN;
  const uint16_t* const A = p.a + int64_t(blockIdx.z) * p.stride_a;
  const uint16_t* const B = p.b + int64_t(blockIdx.z) * p.stride_b;
  const int ktiles = int((p.K + kBK - 1) / kBK);

  // This thread's chunks of one operand's tile (rows: M or N) into `stage`.
  auto load_tile = [&](bool kmajor, const uint16_t* g, int64_t ld, int64_t row0, int64_t rows, uint16_t* s,
                       int stage, int64_t k0) {
#pragma unroll
    for (int i = 0; i < kChunksPerThread; ++i) {
      const ChunkCoord c = load_chunk(kmajor, tid, i);
      const int v = chunk_valid(kmajor, c, row0, k0, rows, p.K);
      cp_async16(s + stage * kTileHalves + chunk_smem_offset(kmajor, c),
                 g + (v > 0 ? chunk_global_offset(kmajor, c, row0, k0, ld) : 0), v * 2);
    }
  };
  auto load_stage = [&](int stage, int kt) {
    load_tile(kAMajorK, A, p.lda, bm, p.M, sa, stage, int64_t(kt) * kBK);
    load_tile(kBMajorK, B, p.ldb, bn, p.N, sb, stage, int64_t(kt) * kBK);
  };

  float acc[kTilesM][kTilesN][4];
#pragma unroll
  for (int tm = 0; tm < kTilesM; ++tm)
#pragma unroll
    for (int tn = 0; tn < kTilesN; ++tn)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[tm][tn][i] = 0.0f;

  // The pipeline. tests/tcgemm_emulator.h's run_pipeline is this loop, statement for statement, checked
  // against a model of cp.async groups and barriers: a change here goes there too.
#pragma unroll
  for (int s = 0; s < kPrefetch; ++s) {
    if (s < ktiles) load_stage(s, s);
    asm volatile("cp.async.commit_group;\n" ::);
  }

  for (int kt = 0; kt < ktiles; ++kt) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kWaitDepth));
    __syncthreads();  // stage kt landed for every thread; stage kt-1 is no longer read by anyone
    const int next = kt + kPrefetch;
    if (next < ktiles) load_stage(next % kStages, next);
    asm volatile("cp.async.commit_group;\n" ::);
    const uint16_t* const ta = sa + (kt % kStages) * kTileHalves;
    const uint16_t* const tb = sb + (kt % kStages) * kTileHalves;
#pragma unroll
    for (int ks = 0; ks < kBK; ks += kMmaK) {
      uint32_t af[kTilesM][4], bf[kTilesN / 2][4];
#pragma unroll
      for (int tm = 0; tm < kTilesM; ++tm) {
        const int m0 = warp_row0(warp) + tm * kMmaM;
        ldmatrix_x4<!kAMajorK>(af[tm], ta + ldsm_a_offset(kAMajorK, lane, m0, ks));
      }
#pragma unroll
      for (int tp = 0; tp < kTilesN / 2; ++tp) {
        const int n0 = warp_col0(warp) + tp * 2 * kMmaN;
        ldmatrix_x4<!kBMajorK>(bf[tp], tb + ldsm_b_offset(kBMajorK, lane, n0, ks));
      }
#pragma unroll
      for (int tm = 0; tm < kTilesM; ++tm)
#pragma unroll
        for (int tn = 0; tn < kTilesN; ++tn)
          mma_16816<kBf16>(acc[tm][tn], af[tm], bf[tn / 2][2 * (tn % 2)], bf[tn / 2][2 * (tn % 2) + 1]);
    }
  }
  asm volatile("cp.async.wait_group 0;\n" ::);

  // Epilogue straight from the registers: each accumulator to its (row, col), predicated at the edges.
#pragma unroll
  for (int tm = 0; tm < kTilesM; ++tm)
#pragma unroll
    for (int tn = 0; tn < kTilesN; ++tn)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const RowCol x = epilogue_coord(warp, lane, tm, tn, i);
        const int64_t r = bm + x.r, c = bn + x.c;
        if (r >= p.M || c >= p.N) continue;
        epilogue_element(p.ep, p.out_kind, p.out, p.c0, p.bias, p.residual,
                         c_offset(blockIdx.z, p.stride_c, r, c, p.ldc), c, acc[tm][tn][i]);
      }
#else
  __trap();  // built for an architecture without m16n8k16 (sm_75): tc_gemm_supported() says no first
#endif
}


template <bool kBf16, bool kAMajorK, bool kBMajorK> void launch(const Params& p, dim3 grid, cudaStream_t s) {
  tc_gemm_kernel<kBf16, kAMajorK, kBMajorK><<<grid, kThreads, kSmemBytes, s>>>(p);
}

}  // namespace

bool tc_gemm_supported(int device, std::string* why) {
  cudaDeviceProp prop{};
  const cudaError_t e = cudaGetDeviceProperties(&prop, device);
  if (e != cudaSuccess) {
    if (why) *why = cuda_error(e);
    return false;
  }
  if (prop.major < 8) {
    if (why) *why = std::string(prop.name) + " is sm_" + std::to_string(prop.major) + std::to_string(prop.minor) +
                    "; the Tensor Core GEMM needs sm_80 or newer (mma.m16n8k16, cp.async)";
    return false;
  }
  // The image the device loads must come from sm_80 code: a build for sm_75 only runs its compute_75 PTX
  // here, in which the kernel's body is a trap (a sticky error: the context would be lost).
  const SavedContext keep;
  cudaFuncAttributes fa{};
  cudaError_t fe = cudaSetDevice(device);
  if (fe == cudaSuccess) fe = cudaFuncGetAttributes(&fa, tc_gemm_kernel<false, true, true>);
  if (fe != cudaSuccess) {
    (void)cudaGetLastError();
    if (why) *why = "no code for " + std::string(prop.name) + " in this build (" + cuda_error(fe) + ")";
    return false;
  }
  if (fa.ptxVersion < 80) {
    if (why)
      *why = "this build has no sm_80+ code for the Tensor Core GEMM (" + std::string(prop.name) +
             " would run compute_" + std::to_string(fa.ptxVersion) + " PTX; build with " +
             "CMAKE_CUDA_ARCHITECTURES including 80)";
    return false;
  }
  return true;
}

void tc_gemm(const TcGemmArgs& g, void* stream) {
  libplan::check_tc_gemm_args(g, "tc_gemm");
  Params p{static_cast<const uint16_t*>(g.a), static_cast<const uint16_t*>(g.b), g.out, g.c0, g.bias, g.residual,
           g.M, g.N, g.K, g.lda, g.ldb, g.ldc, g.stride_a, g.stride_b, g.stride_c,
           out_kind(g.out_dtype), g.ep};
  const dim3 grid(unsigned((g.N + kBN - 1) / kBN), unsigned((g.M + kBM - 1) / kBM), unsigned(g.batch));
  auto s = static_cast<cudaStream_t>(stream);
  const bool bf = g.in_dtype == DType::bf16, ak = a_is_kmajor(g.la), bk = b_is_kmajor(g.lb);
  if (bf) {
    if (ak && bk) launch<true, true, true>(p, grid, s);
    else if (ak) launch<true, true, false>(p, grid, s);
    else if (bk) launch<true, false, true>(p, grid, s);
    else launch<true, false, false>(p, grid, s);
  } else {
    if (ak && bk) launch<false, true, true>(p, grid, s);
    else if (ak) launch<false, true, false>(p, grid, s);
    else if (bk) launch<false, false, true>(p, grid, s);
    else launch<false, false, false>(p, grid, s);
  }
  KILN_CUDA_OK(cudaGetLastError());
}

// ---- self-test against the CPU ----------------------------------------------------------------------

std::string tc_gemm_selftest(int device) {
  std::string why;
  if (!tc_gemm_supported(device, &why)) return why;
  KILN_CUDA_OK(cudaSetDevice(device));
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::ostringstream report;
  int failures = 0;
  struct Size {
    int64_t M, N, K;
  };
  const Size sizes[] = {{1, 1, 8}, {13, 7, 24}, {128, 128, 32}, {130, 129, 40}, {257, 200, 72}, {512, 768, 256}};
  for (DType in : {DType::f16, DType::bf16})
    for (DType out : {DType::f32, DType::f16, DType::bf16})
      for (Layout la : {Layout::row, Layout::col})
        for (Layout lb : {Layout::row, Layout::col})
          for (const Size& sz : sizes) {
            const int variant = int(rng() % 5);
            TcGemmArgs g;
            g.in_dtype = in;
            g.out_dtype = out;
            g.la = la;
            g.lb = lb;
            g.M = sz.M, g.N = sz.N, g.K = sz.K;
            const bool ak = a_is_kmajor(la), bk = b_is_kmajor(lb);
            g.lda = ((ak ? sz.K : sz.M) + 7) / 8 * 8;
            g.ldb = ((bk ? sz.K : sz.N) + 7) / 8 * 8;
            g.ldc = sz.N;
            g.batch = 2;
            g.ep.act = Activation(variant % 4);
            g.ep.alpha = variant == 3 ? 0.5f : 1.0f;
            g.ep.beta = variant == 2 || variant == 4 ? -0.75f : 0.0f;
            const int64_t na = (ak ? sz.M : sz.K) * g.lda, nb = (bk ? sz.N : sz.K) * g.ldb, nc = sz.M * sz.N;
            g.stride_a = na, g.stride_b = nb, g.stride_c = nc;
            auto bits = [&](float x) { return in == DType::f16 ? f32_to_f16_bits(x) : f32_to_bf16_bits(x); };
            auto val = [&](uint16_t b) { return in == DType::f16 ? f16_bits_to_f32(b) : bf16_bits_to_f32(b); };
            auto obits = [&](float x) {
              return out == DType::f16 ? f32_to_f16_bits(x) : out == DType::bf16 ? f32_to_bf16_bits(x) : uint16_t(0);
            };
            auto oval = [&](const std::vector<char>& v, int64_t i) {
              if (out == DType::f32) return reinterpret_cast<const float*>(v.data())[i];
              const uint16_t b = reinterpret_cast<const uint16_t*>(v.data())[i];
              return out == DType::f16 ? f16_bits_to_f32(b) : bf16_bits_to_f32(b);
            };
            const size_t osz = out == DType::f32 ? 4 : 2;
            std::vector<uint16_t> A(size_t(2 * na)), B(size_t(2 * nb));
            for (auto& x : A) x = bits(u(rng));
            for (auto& x : B) x = bits(u(rng));
            std::vector<float> bias(size_t(sz.N));
            for (auto& x : bias) x = u(rng);
            std::vector<char> c0(size_t(2 * nc) * osz), res(size_t(2 * nc) * osz);
            for (int64_t i = 0; i < 2 * nc; ++i) {
              const float x = u(rng), y = u(rng);
              if (out == DType::f32) {
                reinterpret_cast<float*>(c0.data())[i] = x;
                reinterpret_cast<float*>(res.data())[i] = y;
              } else {
                reinterpret_cast<uint16_t*>(c0.data())[i] = obits(x);
                reinterpret_cast<uint16_t*>(res.data())[i] = obits(y);
              }
            }
            const bool use_bias = variant >= 1, use_res = variant >= 3;
            void *dA, *dB, *dC, *dC0, *dR, *dBias;
            KILN_CUDA_OK(cudaMalloc(&dA, A.size() * 2));
            KILN_CUDA_OK(cudaMalloc(&dB, B.size() * 2));
            KILN_CUDA_OK(cudaMalloc(&dC, c0.size()));
            KILN_CUDA_OK(cudaMalloc(&dC0, c0.size()));
            KILN_CUDA_OK(cudaMalloc(&dR, res.size()));
            KILN_CUDA_OK(cudaMalloc(&dBias, bias.size() * 4));
            KILN_CUDA_OK(cudaMemcpy(dA, A.data(), A.size() * 2, cudaMemcpyHostToDevice));
            KILN_CUDA_OK(cudaMemcpy(dB, B.data(), B.size() * 2, cudaMemcpyHostToDevice));
            KILN_CUDA_OK(cudaMemcpy(dC0, c0.data(), c0.size(), cudaMemcpyHostToDevice));
            KILN_CUDA_OK(cudaMemcpy(dR, res.data(), res.size(), cudaMemcpyHostToDevice));
            KILN_CUDA_OK(cudaMemcpy(dBias, bias.data(), bias.size() * 4, cudaMemcpyHostToDevice));
            g.a = dA, g.b = dB, g.out = dC, g.c0 = dC0;
            g.bias = use_bias ? static_cast<const float*>(dBias) : nullptr;
            g.residual = use_res ? dR : nullptr;
            tc_gemm(g, nullptr);
            KILN_CUDA_OK(cudaDeviceSynchronize());
            std::vector<char> got(c0.size());
            KILN_CUDA_OK(cudaMemcpy(got.data(), dC, got.size(), cudaMemcpyDeviceToHost));
            for (void* p : {dA, dB, dC, dC0, dR, dBias}) cudaFree(p);
            double worst = 0;
            for (int64_t z = 0; z < 2; ++z)
              for (int64_t m = 0; m < sz.M; ++m)
                for (int64_t n = 0; n < sz.N; ++n) {
                  double s = 0;
                  for (int64_t k = 0; k < sz.K; ++k) {
                    const float a = val(A[size_t(z * na + (ak ? m * g.lda + k : k * g.lda + m))]);
                    const float b = val(B[size_t(z * nb + (bk ? n * g.ldb + k : k * g.ldb + n))]);
                    s += double(a) * double(b);
                  }
                  const int64_t o = z * nc + m * sz.N + n;
                  const float want = apply_epilogue(g.ep, float(s), oval(c0, o), use_bias ? bias[size_t(n)] : 0.0f,
                                                    use_res ? oval(res, o) : 0.0f);
                  worst = std::max(worst, std::abs(double(oval(got, o)) - double(want)) / (1.0 + std::abs(double(want))));
                }
            const double tol = out == DType::f32 ? 1e-4 * std::sqrt(double(sz.K)) : out == DType::f16 ? 2e-3 : 1.6e-2;
            if (!(worst <= tol) && ++failures <= 10)
              report << "in " << dtype_name(in) << " out " << dtype_name(out) << " A " << (ak ? "row" : "col") << " B "
                     << (bk ? "col" : "row") << " M " << sz.M << " N " << sz.N << " K " << sz.K << " epilogue "
                     << variant << ": worst relative error " << worst << " (tolerance " << tol << ")\n";
          }
  if (failures) report << failures << " case(s) differ from the CPU reference\n";
  return report.str();
}

}  // namespace kiln::cuda
