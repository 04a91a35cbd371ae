// Kiln's Tensor Core GEMM checked without a GPU: its index arithmetic (kernels/common/tc_gemm_layout.h)
// proved piece by piece, then a host emulator that runs the kernel's tile schedule with those same
// functions — cp.async chunk copies with zero-fill, ldmatrix (plain and .trans) and mma.m16n8k16
// computed from the register layouts the PTX ISA documents — against a reference GEMM.
#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <set>
#include <vector>

#include "base/half.h"
#include "kernels/common/tc_gemm_layout.h"

using namespace kiln;
using namespace kiln::tcgemm;

namespace {

// 32 banks of 4 bytes: the banks a 16-byte access at byte offset `off` touches.
std::vector<int> banks16(int byte_off) {
  std::vector<int> b;
  for (int w = 0; w < 4; ++w) b.push_back((byte_off / 4 + w) % 32);
  return b;
}
// True when the 8 16-byte accesses (one phase of ldmatrix, or 8 threads of a 16-byte store) use 32
// distinct banks.
bool conflict_free(const std::vector<int>& half_offsets) {
  std::set<int> seen;
  for (int off : half_offsets)
    for (int b : banks16(off * 2)) seen.insert(b);
  return seen.size() == 32;
}

}  // namespace

TEST_CASE("tcgemm: both shared-memory swizzles are bijections onto the tile and keep chunks whole") {
  std::vector<int> hits(kTileHalves, 0);
  for (int r = 0; r < kBM; ++r)
    for (int k = 0; k < kBK; ++k) {
      const int o = smem_kmajor(r, k);
      REQUIRE((o >= 0 && o < kTileHalves));
      ++hits[size_t(o)];
      if (k % 8) CHECK(o == smem_kmajor(r, k - 1) + 1);  // 8 consecutive k stay one 16-byte chunk
    }
  for (int h : hits) CHECK(h == 1);
  std::fill(hits.begin(), hits.end(), 0);
  for (int k = 0; k < kBK; ++k)
    for (int x = 0; x < kBM; ++x) {
      const int o = smem_mnmajor(k, x);
      REQUIRE((o >= 0 && o < kTileHalves));
      ++hits[size_t(o)];
      if (x % 8) CHECK(o == smem_mnmajor(k, x - 1) + 1);
    }
  for (int h : hits) CHECK(h == 1);
}

TEST_CASE("tcgemm: every ldmatrix phase and every cp.async store group is free of bank conflicts") {
  for (bool kmajor : {true, false}) {
    CAPTURE(kmajor);
    // ldmatrix.x4: four phases, lanes 8q..8q+7 each; every fragment position a warp loads.
    auto phases_conflict_free = [&](auto lane_offset) {
      for (int q = 0; q < 4; ++q) {
        std::vector<int> offs;
        for (int l = 8 * q; l < 8 * q + 8; ++l) offs.push_back(lane_offset(l));
        CHECK(conflict_free(offs));
      }
    };
    for (int warp = 0; warp < kWarps; ++warp)
      for (int ks = 0; ks < kBK; ks += kMmaK) {
        for (int tm = 0; tm < kTilesM; ++tm)
          phases_conflict_free([&](int l) { return ldsm_a_offset(kmajor, l, warp_row0(warp) + tm * kMmaM, ks); });
        for (int tn = 0; tn < kTilesN; tn += 2)
          phases_conflict_free([&](int l) { return ldsm_b_offset(kmajor, l, warp_col0(warp) + tn * kMmaN, ks); });
      }
    // cp.async: 16-byte stores are served 8 threads at a time.
    for (int i = 0; i < kChunksPerThread; ++i)
      for (int t0 = 0; t0 < kThreads; t0 += 8) {
        std::vector<int> offs;
        for (int t = t0; t < t0 + 8; ++t) offs.push_back(chunk_smem_offset(kmajor, load_chunk(kmajor, t, i)));
        CHECK(conflict_free(offs));
      }
    // And the copies of one stage fill the tile exactly once.
    std::vector<int> hits(kTileHalves, 0);
    for (int t = 0; t < kThreads; ++t)
      for (int i = 0; i < kChunksPerThread; ++i)
        for (int e = 0; e < kChunk; ++e) ++hits[size_t(chunk_smem_offset(kmajor, load_chunk(kmajor, t, i)) + e)];
    for (int h : hits) CHECK(h == 1);
  }
}

TEST_CASE("tcgemm: the fragments and accumulators of the warps cover the block tile exactly once") {
  // Accumulators: every (r, c) of the 128 x 128 tile belongs to one (warp, lane, tm, tn, i).
  std::vector<int> hits(kBM * kBN, 0);
  for (int w = 0; w < kWarps; ++w)
    for (int l = 0; l < 32; ++l)
      for (int tm = 0; tm < kTilesM; ++tm)
        for (int tn = 0; tn < kTilesN; ++tn)
          for (int i = 0; i < 4; ++i) {
            const RowCol p = epilogue_coord(w, l, tm, tn, i);
            REQUIRE((p.r >= 0 && p.r < kBM && p.c >= 0 && p.c < kBN));
            ++hits[size_t(p.r * kBN + p.c)];
          }
  for (int h : hits) CHECK(h == 1);
  // One MMA's A (16 x 16, 8 per lane), B (16 x 8, 4 per lane) and D (16 x 8, 4 per lane).
  std::vector<int> a(256, 0), b(128, 0), d(128, 0);
  for (int l = 0; l < 32; ++l) {
    for (int j = 0; j < 8; ++j) ++a[size_t(a_frag_coord(l, j).r * 16 + a_frag_coord(l, j).c)];
    for (int j = 0; j < 4; ++j) ++b[size_t(b_frag_coord(l, j).r * 8 + b_frag_coord(l, j).c)];
    for (int i = 0; i < 4; ++i) ++d[size_t(acc_coord(l, i).r * 8 + acc_coord(l, i).c)];
  }
  for (int h : a) CHECK(h == 1);
  for (int h : b) CHECK(h == 1);
  for (int h : d) CHECK(h == 1);
}

TEST_CASE("tcgemm: edge predicates never address outside the matrices") {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t rows = 1 + rng() % 300, K = 8 * (1 + rng() % 40);
    for (bool kmajor : {true, false}) {
      const int64_t inner = kmajor ? K : rows;             // the contiguous extent
      const int64_t ld = (inner + 7) / 8 * 8 + 8 * (rng() % 3);  // a multiple of 8 at least that
      const int64_t outer = kmajor ? rows : K;
      const int64_t alloc = (outer - 1) * ld + inner;      // the last row need not be padded
      for (int64_t row0 = 0; row0 < rows; row0 += kBM)
        for (int64_t k0 = 0; k0 < K; k0 += kBK)
          for (int t = 0; t < kThreads; ++t)
            for (int i = 0; i < kChunksPerThread; ++i) {
              const ChunkCoord c = load_chunk(kmajor, t, i);
              const int v = chunk_valid(kmajor, c, row0, k0, rows, K);
              if (v == 0) continue;
              const int64_t off = chunk_global_offset(kmajor, c, row0, k0, ld);
              CHECK(off % 8 == 0);  // 16-byte aligned source
              for (int e = 0; e < v; ++e) {
                const int64_t r = kmajor ? row0 + c.r : row0 + c.r + e, k = kmajor ? k0 + c.k + e : k0 + c.k;
                if (!(r < rows && k < K && off + e < alloc)) {
                  FAIL_CHECK("element ", e, " of a chunk at (", r, ", ", k, ") is outside ", rows, " x ", K);
                  return;
                }
              }
              // Elements past `v` would be outside: the predicate stops exactly at the edge.
              if (v < kChunk) CHECK((kmajor ? k0 + c.k + v == K : row0 + c.r + v == rows));
            }
    }
  }
}

// ---- the host emulator --------------------------------------------------------------------------------

namespace {

template <typename H> float to_f(uint16_t bits) {
  return std::is_same_v<H, Half> ? f16_bits_to_f32(bits) : bf16_bits_to_f32(bits);
}

// ldmatrix.sync.aligned.m8n8.x4[.trans].b16 as the PTX ISA defines it: lanes 8q..8q+7 give the row
// addresses of matrix q; lane l receives, in register q, elements (l/4, 2(l%4)) and (l/4, 2(l%4)+1)
// of matrix q, or with .trans elements (2(l%4), l/4) and (2(l%4)+1, l/4).
void ldmatrix_x4(const std::vector<uint16_t>& smem, const int addr[32], bool trans, uint16_t regs[32][4][2]) {
  for (int q = 0; q < 4; ++q)
    for (int l = 0; l < 32; ++l)
      for (int h = 0; h < 2; ++h) {
        const int row = trans ? 2 * (l % 4) + h : l / 4, col = trans ? l / 4 : 2 * (l % 4) + h;
        regs[l][q][h] = smem[size_t(addr[8 * q + row] + col)];
      }
}

struct Problem {
  Layout la, lb;
  int64_t M, N, K, lda, ldb;
  Epilogue ep;
  bool has_c0 = false, has_bias = false, has_residual = false;
};

// Runs every block of the kernel's schedule. A, B as 16-bit bits; c0/residual/bias in f32; returns f32.
template <typename H>
std::vector<float> emulate(const Problem& p, const std::vector<uint16_t>& A, const std::vector<uint16_t>& B,
                           const std::vector<float>& c0, const std::vector<float>& bias, const std::vector<float>& res) {
  std::vector<float> out(size_t(p.M * p.N), 0.0f);
  const bool akm = a_is_kmajor(p.la), bkm = b_is_kmajor(p.lb);
  std::vector<uint16_t> sa(kTileHalves), sb(kTileHalves);
  for (int64_t bm = 0; bm < p.M; bm += kBM)
    for (int64_t bn = 0; bn < p.N; bn += kBN) {
      static float acc[kWarps][32][kTilesM][kTilesN][4];
      std::fill(&acc[0][0][0][0][0], &acc[0][0][0][0][0] + sizeof acc / sizeof(float), 0.0f);
      for (int64_t k0 = 0; k0 < p.K; k0 += kBK) {
        // cp.async: each thread's chunks, `valid` elements copied and the rest zero-filled.
        auto load = [&](bool km, const std::vector<uint16_t>& g, int64_t ld, int64_t row0, int64_t rows,
                        std::vector<uint16_t>& s) {
          std::fill(s.begin(), s.end(), uint16_t(0xFFFF));  // poison: an unfilled element would show
          for (int t = 0; t < kThreads; ++t)
            for (int i = 0; i < kChunksPerThread; ++i) {
              const ChunkCoord c = load_chunk(km, t, i);
              const int v = chunk_valid(km, c, row0, k0, rows, p.K);
              const int64_t off = v > 0 ? chunk_global_offset(km, c, row0, k0, ld) : 0;
              const int so = chunk_smem_offset(km, c);
              for (int e = 0; e < kChunk; ++e) s[size_t(so + e)] = e < v ? g[size_t(off + e)] : uint16_t(0);
            }
        };
        load(akm, A, p.lda, bm, p.M, sa);
        load(bkm, B, p.ldb, bn, p.N, sb);
        for (int w = 0; w < kWarps; ++w)
          for (int ks = 0; ks < kBK; ks += kMmaK) {
            uint16_t afr[kTilesM][32][4][2], bfr[kTilesN / 2][32][4][2];
            for (int tm = 0; tm < kTilesM; ++tm) {
              int addr[32];
              for (int l = 0; l < 32; ++l) addr[l] = ldsm_a_offset(akm, l, warp_row0(w) + tm * kMmaM, ks);
              ldmatrix_x4(sa, addr, !akm, afr[tm]);
            }
            for (int tp = 0; tp < kTilesN / 2; ++tp) {
              int addr[32];
              for (int l = 0; l < 32; ++l) addr[l] = ldsm_b_offset(bkm, l, warp_col0(w) + tp * 2 * kMmaN, ks);
              ldmatrix_x4(sb, addr, !bkm, bfr[tp]);
            }
            // mma.m16n8k16.row.col: gather A (16x16) and B (16x8) from the lanes by the documented
            // layouts, multiply in f32, scatter D back by the accumulator layout.
            for (int tm = 0; tm < kTilesM; ++tm)
              for (int tn = 0; tn < kTilesN; ++tn) {
                float a[16][16], b[16][8];
                for (int l = 0; l < 32; ++l) {
                  for (int j = 0; j < 8; ++j) {
                    const RowCol x = a_frag_coord(l, j);
                    a[x.r][x.c] = to_f<H>(afr[tm][l][j / 2][j % 2]);
                  }
                  for (int j = 0; j < 4; ++j) {
                    const RowCol x = b_frag_coord(l, j);
                    // registers 0,1 of an x4 B load are n-tile 2*tp, registers 2,3 n-tile 2*tp+1
                    b[x.r][x.c] = to_f<H>(bfr[tn / 2][l][2 * (tn % 2) + j / 2][j % 2]);
                  }
                }
                for (int l = 0; l < 32; ++l)
                  for (int i = 0; i < 4; ++i) {
                    const RowCol x = acc_coord(l, i);
                    float s = 0;
                    for (int kk = 0; kk < 16; ++kk) s += a[x.r][kk] * b[kk][x.c];
                    acc[w][l][tm][tn][i] += s;
                  }
              }
          }
      }
      for (int w = 0; w < kWarps; ++w)
        for (int l = 0; l < 32; ++l)
          for (int tm = 0; tm < kTilesM; ++tm)
            for (int tn = 0; tn < kTilesN; ++tn)
              for (int i = 0; i < 4; ++i) {
                const RowCol x = epilogue_coord(w, l, tm, tn, i);
                const int64_t r = bm + x.r, c = bn + x.c;
                if (r >= p.M || c >= p.N) continue;  // the store predicate
                const size_t o = size_t(r * p.N + c);
                out[o] = apply_epilogue(p.ep, acc[w][l][tm][tn][i], p.has_c0 ? c0[o] : 0.0f,
                                        p.has_bias ? bias[size_t(c)] : 0.0f, p.has_residual ? res[o] : 0.0f);
              }
    }
  return out;
}

template <typename H> uint16_t to_bits(float x) {
  return std::is_same_v<H, Half> ? f32_to_f16_bits(x) : f32_to_bf16_bits(x);
}

template <typename H> void run_case(const Problem& p, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  // Stored matrices, with padding columns (ld > extent) filled with NaN: a read of one would show.
  const bool akm = a_is_kmajor(p.la), bkm = b_is_kmajor(p.lb);
  const int64_t a_outer = akm ? p.M : p.K, b_outer = bkm ? p.N : p.K;
  const int64_t a_inner = akm ? p.K : p.M, b_inner = bkm ? p.K : p.N;
  std::vector<uint16_t> A(size_t((a_outer - 1) * p.lda + a_inner)), B(size_t((b_outer - 1) * p.ldb + b_inner));
  for (int64_t o = 0; o < a_outer; ++o)
    for (int64_t i = 0; i < p.lda && o * p.lda + i < int64_t(A.size()); ++i)
      A[size_t(o * p.lda + i)] = i < a_inner ? to_bits<H>(u(rng)) : uint16_t(0x7FC0);
  for (int64_t o = 0; o < b_outer; ++o)
    for (int64_t i = 0; i < p.ldb && o * p.ldb + i < int64_t(B.size()); ++i)
      B[size_t(o * p.ldb + i)] = i < b_inner ? to_bits<H>(u(rng)) : uint16_t(0x7FC0);
  auto a_at = [&](int64_t m, int64_t k) { return to_f<H>(A[size_t(akm ? m * p.lda + k : k * p.lda + m)]); };
  auto b_at = [&](int64_t k, int64_t n) { return to_f<H>(B[size_t(bkm ? n * p.ldb + k : k * p.ldb + n)]); };
  std::vector<float> c0(size_t(p.M * p.N)), bias(size_t(p.N)), res(size_t(p.M * p.N));
  for (auto& x : c0) x = u(rng);
  for (auto& x : bias) x = u(rng);
  for (auto& x : res) x = u(rng);
  const std::vector<float> got = emulate<H>(p, A, B, c0, bias, res);
  double worst = 0;
  for (int64_t m = 0; m < p.M; ++m)
    for (int64_t n = 0; n < p.N; ++n) {
      double s = 0;
      for (int64_t k = 0; k < p.K; ++k) s += double(a_at(m, k)) * double(b_at(k, n));
      const size_t o = size_t(m * p.N + n);
      const float want = apply_epilogue(p.ep, float(s), p.has_c0 ? c0[o] : 0.0f, p.has_bias ? bias[size_t(n)] : 0.0f,
                                        p.has_residual ? res[o] : 0.0f);
      worst = std::max(worst, std::abs(double(got[o]) - double(want)) / (1.0 + std::abs(double(want))));
    }
  // f32 sums of products of 16-bit values: only the summation order differs from the reference.
  CHECK_MESSAGE(worst < 2e-5 * std::sqrt(double(p.K)), "M ", p.M, " N ", p.N, " K ", p.K, " worst ", worst);
}

}  // namespace

TEST_CASE("tcgemm: the host emulator of the kernel's schedule reproduces a reference GEMM (layouts, sizes, epilogues)") {
  std::mt19937 rng(11);
  struct Size {
    int64_t M, N, K;
  };
  const Size sizes[] = {{1, 1, 8}, {13, 7, 24}, {128, 128, 32}, {130, 129, 40}, {257, 200, 72}, {64, 300, 8}};
  for (Layout la : {Layout::row, Layout::col})
    for (Layout lb : {Layout::row, Layout::col})
      for (const Size& s : sizes) {
        Problem p{la, lb, s.M, s.N, s.K, 0, 0, {}};
        const int64_t a_inner = a_is_kmajor(la) ? s.K : s.M, b_inner = b_is_kmajor(lb) ? s.K : s.N;
        p.lda = (a_inner + 7) / 8 * 8 + 8 * int64_t(rng() % 2);
        p.ldb = (b_inner + 7) / 8 * 8 + 8 * int64_t(rng() % 2);
        const int variant = int(rng() % 5);
        p.ep.act = Activation(variant % 4);
        p.has_bias = variant >= 1;
        p.has_c0 = variant == 2 || variant == 4;
        p.ep.alpha = variant == 3 ? 0.5f : 1.0f;
        p.ep.beta = p.has_c0 ? -0.75f : 0.0f;
        p.has_residual = variant >= 3;
        CAPTURE(int(la));
        CAPTURE(int(lb));
        CAPTURE(variant);
        run_case<Half>(p, rng);
        run_case<BFloat16>(p, rng);
      }
}

TEST_CASE("tcgemm: every activation of the epilogue is the shared scalar math") {
  Epilogue e;
  e.alpha = 2.0f;
  e.act = Activation::relu;
  CHECK(apply_epilogue(e, -1.0f, 0.0f, 0.5f, 0.25f) == 0.25f);  // relu(-2 + 0.5) + 0.25
  e.act = Activation::gelu_tanh;
  CHECK(apply_epilogue(e, 0.5f, 0.0f, 0.0f, 0.0f) == doctest::Approx(0.841192));
  e.act = Activation::gelu_erf;
  CHECK(apply_epilogue(e, 0.5f, 0.0f, 0.0f, 0.0f) == doctest::Approx(0.841345));
  e.act = Activation::none;
  e.beta = 1.0f;
  CHECK(apply_epilogue(e, 1.0f, 3.0f, 0.0f, 0.0f) == 5.0f);
}
