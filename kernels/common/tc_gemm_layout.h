// The index arithmetic of Kiln's FP16/BF16 Tensor Core GEMM (kernels/cuda/tc_gemm.cu), as
// __host__ __device__ functions: the kernel calls them, and CPU tests prove them (the swizzles are
// bijections and free of bank conflicts, the fragments of a warp cover its tile once, edge
// predicates never address outside the matrices) and run the whole tile schedule in a host
// emulator against a reference GEMM.
//
// Problem: C[M,N] = epilogue(alpha * A[M,K] B[K,N] + beta * C0), A and B f16 or bf16, f32 sums.
// A is "row" (M x K, k contiguous, lda >= K) or "col" (stored K x M, m contiguous, lda >= M); B is
// "row" (K x N, n contiguous) or "col" (stored N x K, k contiguous). Leading dimensions are
// multiples of 8 elements and pointers 16-byte aligned (every 16-byte chunk is aligned); K is a
// multiple of 8; M and N are anything.
//
// Tiling (sm_80+): a block computes a 128 x 128 tile of C with 8 warps (256 threads) arranged
// 2 (m) x 4 (n), each warp a 64 x 32 sub-tile = 4 x 4 mma.m16n8k16 tiles, 64 f32 accumulators per
// thread. K advances 32 at a time through a 3-stage cp.async pipeline; each stage holds A as
// 128 x 32 and B as 32 x 128 halves (8 KB each, 48 KB for 3 stages).
// Shared-memory layouts follow the global ones so every cp.async moves an aligned 16-byte chunk:
//   K-major tile  [rows=128][32]: row r holds its 32 k values (64 B = 4 chunks); chunk c of row r
//     sits at chunk c ^ ((r >> 1) & 3): for the 8 rows an ldmatrix phase reads, even rows use banks
//     0-15 and odd rows 16-31, each at 4 distinct chunks, so no two rows share a bank.
//   MN-major tile [k=32][128]: row k holds 128 m (or n) values (256 B = 16 chunks); chunk c sits at
//     c ^ (k & 7): the 8 consecutive k rows of an ldmatrix phase land on 8 distinct 16-byte bank
//     groups of one 128-byte line.
// ldmatrix.x4 fills a warp's fragments from either layout (.trans for MN-major), giving exactly the
// register layouts the PTX ISA defines for mma.m16n8k16 .row.col.
#pragma once
#include <math.h>

#include <cstdint>

#include "base/dtype.h"
#include "base/half.h"
#include "base/macros.h"
#include "kernels/common/math.h"

namespace kiln::tcgemm {

constexpr int kBM = 128, kBN = 128, kBK = 32;
constexpr int kWarpsM = 2, kWarpsN = 4, kWarps = kWarpsM * kWarpsN, kThreads = 32 * kWarps;
constexpr int kWM = kBM / kWarpsM, kWN = kBN / kWarpsN;  // 64 x 32 per warp
constexpr int kMmaM = 16, kMmaN = 8, kMmaK = 16;
constexpr int kTilesM = kWM / kMmaM, kTilesN = kWN / kMmaN;  // 4 x 4 MMAs per warp per k16
constexpr int kStages = 3;
// The pipeline (tc_gemm_kernel's main loop; tests/tcgemm_emulator.h checks it): the prologue copies k-tiles
// 0 .. kPrefetch-1, iteration kt waits until at most kWaitDepth groups are pending (so k-tile kt has
// landed), and after the barrier copies k-tile kt + kPrefetch into stage (kt + kPrefetch) % kStages, the
// stage k-tile kt-1 was read from before that barrier.
constexpr int kPrefetch = kStages - 1, kWaitDepth = kStages - 2;
constexpr int kChunk = 8;  // halves per 16-byte chunk
constexpr int kTileHalves = kBM * kBK;  // one operand tile of one stage (A and B tiles are the same size)
static_assert(kBM == kBN, "A and B stage tiles share one size");
constexpr int kSmemBytes = kStages * 2 * kTileHalves * 2;  // 48 KB

enum class Layout : uint8_t { row, col };

// ---- shared-memory offsets (in halves) --------------------------------------------------------------

// K-major tile [128][32]: element (r, k).
KILN_HD int smem_kmajor(int r, int k) {
  const int chunk = (k >> 3) ^ ((r >> 1) & 3);
  return r * kBK + chunk * kChunk + (k & 7);
}
// MN-major tile [32][128]: element (k, x) with x the m (or n) index.
KILN_HD int smem_mnmajor(int k, int x) {
  const int chunk = (x >> 3) ^ (k & 7);
  return k * kBM + chunk * kChunk + (x & 7);
}

// Whether an operand's tile is K-major in shared memory (k contiguous in global memory).
KILN_HD bool a_is_kmajor(Layout a) { return a == Layout::row; }
KILN_HD bool b_is_kmajor(Layout b) { return b == Layout::col; }

// ---- global -> shared: which chunk each thread copies -----------------------------------------------

// A tile has kTileHalves / 8 = 512 chunks, 2 per thread. For copy i (0 or 1) of thread t:
// K-major: chunk j = t + 256 i is row j / 4, k chunk j % 4; MN-major: k row j / 16, chunk j % 16.
struct ChunkCoord {
  int r, k;  // tile-relative: row (m or n) and k of the chunk's first element
};
KILN_HD ChunkCoord load_chunk(bool kmajor, int thread, int i) {
  const int j = thread + kThreads * i;
  if (kmajor) return {j >> 2, (j & 3) * kChunk};
  return {(j & 15) * kChunk, j >> 4};
}
constexpr int kChunksPerThread = kTileHalves / kChunk / kThreads;
static_assert(kChunksPerThread == 2, "two 16-byte copies per thread per operand per stage");

// How many of the chunk's 8 elements lie inside the matrix (0..8): cp.async copies that many
// bytes x 2 and zero-fills the rest, so nothing outside [0, rows) x [0, K) is ever read.
// row0/k0: the tile's origin; rows: M (or N); K: the depth.
KILN_HD int chunk_valid(bool kmajor, ChunkCoord c, int64_t row0, int64_t k0, int64_t rows, int64_t K) {
  const int64_t r = row0 + c.r, k = k0 + c.k;
  if (kmajor) {  // 8 consecutive k of one row
    if (r >= rows || k >= K) return 0;
    const int64_t n = K - k;
    return n >= kChunk ? kChunk : int(n);
  }
  // 8 consecutive rows of one k
  if (k >= K || r >= rows) return 0;
  const int64_t n = rows - r;
  return n >= kChunk ? kChunk : int(n);
}
// Element offset of a chunk's first element in global memory (meaningful when chunk_valid > 0).
KILN_HD int64_t chunk_global_offset(bool kmajor, ChunkCoord c, int64_t row0, int64_t k0, int64_t ld) {
  const int64_t r = row0 + c.r, k = k0 + c.k;
  return kmajor ? r * ld + k : k * ld + r;
}
KILN_HD int chunk_smem_offset(bool kmajor, ChunkCoord c) {
  return kmajor ? smem_kmajor(c.r, c.k) : smem_mnmajor(c.k, c.r);
}

// ---- warps and fragments ----------------------------------------------------------------------------

KILN_HD int warp_row0(int warp) { return (warp / kWarpsN) * kWM; }  // within the block tile
KILN_HD int warp_col0(int warp) { return (warp % kWarpsN) * kWN; }

// ldmatrix.x4: the row address lane `lane` supplies, as a tile-relative (r, k) of the 8-element
// row it points at. A 16x16 A fragment at (m0, k0), or two 8-column B fragments at (n0, k0).
// K-major A: matrices (m 0-7,k 0-7) (m 8-15,k 0-7) (m 0-7,k 8-15) (m 8-15,k 8-15) -> a0a1 a2a3 a4a5 a6a7.
KILN_HD ChunkCoord ldsm_a_kmajor(int lane, int m0, int k0) {
  return {m0 + (lane & 7) + ((lane >> 3) & 1) * 8, k0 + (lane >> 4) * 8};
}
// MN-major A (.trans): each address is 8 consecutive m at one k; same register order as above.
KILN_HD ChunkCoord ldsm_a_mnmajor(int lane, int m0, int k0) {
  return {m0 + ((lane >> 3) & 1) * 8, k0 + (lane & 7) + (lane >> 4) * 8};
}
// K-major B (rows are n): matrices (n 0-7,k 0-7) (n 0-7,k 8-15) (n 8-15,k 0-7) (n 8-15,k 8-15)
// -> b0b1, b2b3 of n-tile 0, then of n-tile 1.
KILN_HD ChunkCoord ldsm_b_kmajor(int lane, int n0, int k0) {
  return {n0 + (lane & 7) + (lane >> 4) * 8, k0 + ((lane >> 3) & 1) * 8};
}
// MN-major B (.trans): addresses are 8 consecutive n at one k; same register order.
KILN_HD ChunkCoord ldsm_b_mnmajor(int lane, int n0, int k0) {
  return {n0 + (lane >> 4) * 8, k0 + (lane & 7) + ((lane >> 3) & 1) * 8};
}
// The shared-memory offset (halves) of lane's ldmatrix row address.
KILN_HD int ldsm_offset(bool kmajor, ChunkCoord c) { return kmajor ? smem_kmajor(c.r, c.k) : smem_mnmajor(c.k, c.r); }
// Lane's ldmatrix row address (shared offset in halves) for the A fragment at (m0, k0) or the pair of
// B fragments at (n0, k0), in whichever layout the operand's tile has.
KILN_HD int ldsm_a_offset(bool kmajor, int lane, int m0, int k0) {
  return ldsm_offset(kmajor, kmajor ? ldsm_a_kmajor(lane, m0, k0) : ldsm_a_mnmajor(lane, m0, k0));
}
KILN_HD int ldsm_b_offset(bool kmajor, int lane, int n0, int k0) {
  return ldsm_offset(kmajor, kmajor ? ldsm_b_kmajor(lane, n0, k0) : ldsm_b_mnmajor(lane, n0, k0));
}

// mma.m16n8k16 accumulator layout (PTX ISA): register i (0..3) of lane holds
// D[(lane >> 2) + 8 * (i >> 1)][2 * (lane & 3) + (i & 1)].
struct RowCol {
  int r, c;
};
KILN_HD RowCol acc_coord(int lane, int i) { return {(lane >> 2) + 8 * (i >> 1), 2 * (lane & 3) + (i & 1)}; }
// A fragment element j (0..7, two per register) of lane: A[(lane>>2) + 8*((j>>1)&1)][2*(lane&3) + (j&1) + 8*(j>>2)].
KILN_HD RowCol a_frag_coord(int lane, int j) {
  return {(lane >> 2) + 8 * ((j >> 1) & 1), 2 * (lane & 3) + (j & 1) + 8 * (j >> 2)};
}
// B fragment element j (0..3) of lane: B[k = 2*(lane&3) + (j&1) + 8*(j>>1)][n = lane>>2].
KILN_HD RowCol b_frag_coord(int lane, int j) { return {2 * (lane & 3) + (j & 1) + 8 * (j >> 1), lane >> 2}; }

// Where accumulator i of MMA tile (tm, tn) of lane in warp lands in the block tile.
KILN_HD RowCol epilogue_coord(int warp, int lane, int tm, int tn, int i) {
  const RowCol a = acc_coord(lane, i);
  return {warp_row0(warp) + tm * kMmaM + a.r, warp_col0(warp) + tn * kMmaN + a.c};
}

// ---- epilogue ---------------------------------------------------------------------------------------

enum class Activation : uint8_t { none, relu, gelu_tanh, gelu_erf };

// What happens to one f32 sum on its way out: out = act(alpha * acc + beta * c0 + bias) + residual.
// (c0, bias and residual are 0 when absent.) The kernel and the emulator both call this.
struct Epilogue {
  float alpha = 1.0f, beta = 0.0f;
  Activation act = Activation::none;
};
// The multiply-adds are written out as fmaf (one rounding each), so the kernel (nvcc would contract
// them by its own choice) and the host's emulator of it compute the same bits.
KILN_HD float apply_epilogue(const Epilogue& e, float acc, float c0, float bias, float residual) {
  float v = fmaf(e.alpha, acc, bias);
  if (e.beta != 0.0f) v = fmaf(e.beta, c0, v);
  switch (e.act) {
    case Activation::none: break;
    case Activation::relu: v = math::relu(v); break;
    case Activation::gelu_tanh: v = math::gelu_tanh(v); break;
    case Activation::gelu_erf: v = math::gelu_erf(v); break;
  }
  return v + residual;
}

// The output dtype as the epilogue switches on it (c0 and residual are in it too): 0 f32, 1 f16, 2 bf16.
KILN_HD int out_kind(DType d) { return d == DType::f32 ? 0 : d == DType::f16 ? 1 : 2; }
KILN_HD float load_out(const void* p, int64_t i, int kind) {
  if (kind == 0) return static_cast<const float*>(p)[i];
  const uint16_t bits = static_cast<const uint16_t*>(p)[i];
  return kind == 1 ? f16_bits_to_f32(bits) : bf16_bits_to_f32(bits);
}
KILN_HD void store_out(void* p, int64_t i, int kind, float v) {
  if (kind == 0)
    static_cast<float*>(p)[i] = v;
  else
    static_cast<uint16_t*>(p)[i] = kind == 1 ? f32_to_f16_bits(v) : f32_to_bf16_bits(v);
}
// Element (r, c) of batch entry z in C (and in c0 and residual, which share its layout).
KILN_HD int64_t c_offset(int64_t z, int64_t stride_c, int64_t r, int64_t c, int64_t ldc) {
  return z * stride_c + r * ldc + c;
}
// One output element of column c at offset o in C from its f32 sum: everything in f32, one rounding at the
// store. c0 is read only when beta is not 0 (so a NaN there cannot leak through 0 * NaN); bias and residual
// are optional (null).
KILN_HD void epilogue_element(const Epilogue& ep, int kind, void* out, const void* c0, const float* bias,
                              const void* residual, int64_t o, int64_t c, float acc) {
  const float c0v = ep.beta != 0.0f ? load_out(c0, o, kind) : 0.0f;
  const float b = bias ? bias[c] : 0.0f;
  const float res = residual ? load_out(residual, o, kind) : 0.0f;
  store_out(out, o, kind, apply_epilogue(ep, acc, c0v, b, res));
}

// ---- the kernel's arguments ------------------------------------------------------------------------

// out[b] = act(alpha * A[b] B[b] + beta * c0[b] + bias) + residual[b] for b < batch, all row-major
// M x N with leading dimension ldc (c0 and residual in the output dtype; bias f32 [N]). Plain data
// outside the CUDA backend's namespace (kiln::cuda::TcGemmArgs names it), so the host dispatch that
// fills it (kernels/common/gemm_plan.h) and the CUDA emulator that interprets it share one type.
struct GemmArgs {
  DType in_dtype = DType::f16;   // f16 or bf16, for A and B
  DType out_dtype = DType::f32;  // f16, bf16 or f32
  Layout la = Layout::row, lb = Layout::row;
  int64_t M = 0, N = 0, K = 0, lda = 0, ldb = 0, ldc = 0;
  const void* a = nullptr;
  const void* b = nullptr;
  void* out = nullptr;
  const void* c0 = nullptr;                                     // used when ep.beta != 0
  const float* bias = nullptr;                                  // optional
  const void* residual = nullptr;                               // optional
  int64_t batch = 1, stride_a = 0, stride_b = 0, stride_c = 0;  // elements between batch entries
  Epilogue ep;
};

}  // namespace kiln::tcgemm
