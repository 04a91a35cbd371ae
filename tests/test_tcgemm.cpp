// Kiln's Tensor Core GEMM checked without a GPU: its index arithmetic (kernels/common/tc_gemm_layout.h)
// proved piece by piece, then the host emulator of tests/tcgemm_emulator.h, which runs the kernel's grid
// with those same functions through a model of its cp.async pipeline (3-stage ring, commit/wait groups,
// barriers: a read before a copy has landed, or a copy into a stage a warp may still be reading, is
// reported), ldmatrix and mma.m16n8k16 from the PTX ISA's register layouts, and the kernel's own epilogue
// stores, against a reference GEMM: partial tiles, every K-tile count the pipeline's tail meets, all four
// layouts, batches with strides (broadcast included), ldc padding, f32/f16/bf16 outputs.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <sstream>
#include <vector>

#include "base/half.h"
#include "kernels/common/gemm_plan.h"
#include "kernels/common/tc_gemm_layout.h"
#include "tests/tcgemm_emulator.h"

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

// ---- the host emulator (tests/tcgemm_emulator.h) --------------------------------------------------------

TEST_CASE("tcgemm: the kernel's cp.async ring never reads a stage before it lands nor copies into one being read") {
  // Every K-tile count the loop's prologue, steady state and tail can meet (1 and 2 end inside the
  // prologue; 3 and more reach the steady state; 7 leaves a partial turn of the ring).
  for (int ktiles = 1; ktiles <= 12; ++ktiles) {
    CAPTURE(ktiles);
    std::string trace;
    CHECK(emu::check_schedule(ktiles, {}, &trace) == "");
    // Each k-tile is read once, from stage kt % 3, in order.
    for (int kt = 0; kt < ktiles; ++kt)
      CHECK(trace.find("read stage " + std::to_string(kt % kStages) + " k" + std::to_string(kt) + " ") !=
            std::string::npos);
  }
  // The schedule spelled out: which k-tile goes to which stage when, and the wait/barrier between.
  std::string trace;
  CHECK(emu::check_schedule(1, {}, &trace) == "");
  CHECK(trace ==
        "copy A stage 0 k0 copy B stage 0 k0 commit commit "  // prologue (the second group empty)
        "wait 1 sync commit read stage 0 k0 "                 // group 0 complete; an empty group
        "wait 0 ");
  CHECK(emu::check_schedule(4, {}, &trace) == "");
  CHECK(trace ==
        "copy A stage 0 k0 copy B stage 0 k0 commit copy A stage 1 k1 copy B stage 1 k1 commit "
        "wait 1 sync copy A stage 2 k2 copy B stage 2 k2 commit read stage 0 k0 "
        "wait 1 sync copy A stage 0 k3 copy B stage 0 k3 commit read stage 1 k1 "  // stage 0 freed by the barrier
        "wait 1 sync commit read stage 2 k2 "
        "wait 1 sync commit read stage 0 k3 "  // wait 1 covers k3's group: the empty ones after it are newer
        "wait 0 ");
  // A stricter wait (wait_group 0) is slower but as safe: the checks do not demand the kernel's exact depth.
  emu::Schedule strict;
  strict.wait_depth = 0;
  for (int ktiles : {1, 2, 3, 7}) CHECK(emu::check_schedule(ktiles, strict) == "");
}

TEST_CASE("tcgemm: the ring model reports a wrong wait depth, a missing or misplaced barrier and a too-deep prefetch") {
  emu::Schedule s;
  s.wait_depth = kStages - 1;  // wait_group 2: k-tile 0's group is still allowed to be pending
  CHECK(emu::check_schedule(3, s) ==
        "k-tile 0 read from A stage 0 while the copy of k-tile 0 (group 0) is in flight: no cp.async.wait_group has "
        "covered that group yet");
  s = {};
  s.barrier = emu::Schedule::Barrier::none;
  CHECK(emu::check_schedule(3, s) ==
        "k-tile 0 read from A stage 0 after the wait_group that landed k-tile 0 but before a __syncthreads: the other "
        "threads' chunks need not be visible");
  s = {};
  s.barrier = emu::Schedule::Barrier::after_copy;  // the copy for kt+2 races the slow warps still on kt-1
  CHECK(emu::check_schedule(4, s) ==
        "copy of k-tile 3 into A stage 0 issued while a warp may still be reading k-tile 0 from it (no "
        "__syncthreads since that read)");
  CHECK(emu::check_schedule(3, s) == "");  // with 3 k-tiles no stage is reused: nothing to race
  s = {};
  s.prefetch = kStages;  // k-tile kt+3 lands in the stage kt is read from
  CHECK(emu::check_schedule(4, s) ==
        "k-tile 0 read from A stage 0 while the copy of k-tile 3 (group 2) is in flight: no cp.async.wait_group has "
        "covered that group yet");
}

namespace {

// A 16-bit value's bits from f32 (f16 or bf16), and back.
uint16_t bits16(DType d, float x) { return d == DType::f16 ? f32_to_f16_bits(x) : f32_to_bf16_bits(x); }
float value16(DType d, uint16_t b) { return d == DType::f16 ? f16_bits_to_f32(b) : bf16_bits_to_f32(b); }

// A buffer of the output dtype (out, c0, residual), read and written with the kernel's own conversions.
struct OutBuffer {
  DType dt;
  std::vector<unsigned char> storage;
  OutBuffer(DType d, int64_t n) : dt(d), storage(size_t(n) * dtype_size(d)) {}
  void* data() { return storage.data(); }
  float get(int64_t i) const { return load_out(storage.data(), i, out_kind(dt)); }
  void set(int64_t i, float v) { store_out(storage.data(), i, out_kind(dt), v); }
  uint32_t bits(int64_t i) const {
    uint32_t b = 0;
    std::memcpy(&b, storage.data() + size_t(i) * dtype_size(dt), dtype_size(dt));
    return b;
  }
};

enum class Strides { packed, gaps, broadcast_a, broadcast_b };

struct Case {
  DType in = DType::f16, out = DType::f32;
  Layout la = Layout::row, lb = Layout::row;
  int64_t M = 1, N = 1, K = 8, batch = 1;
  Strides strides = Strides::packed;
  int variant = 0;         // the epilogue: 0 plain, 1 bias + relu, 2 beta + bias + gelu_tanh, 3 alpha + residual +
                           // gelu_erf, 4 beta + bias + residual
  bool c0_is_out = false;  // C = alpha A B + beta C in place, as plan_tc_gemm asks for it
};

std::string describe(const Case& c) {
  std::ostringstream s;
  s << "in " << dtype_name(c.in) << " out " << dtype_name(c.out) << " A " << (c.la == Layout::row ? "row" : "col")
    << " B " << (c.lb == Layout::row ? "row" : "col") << " M " << c.M << " N " << c.N << " K " << c.K << " batch "
    << c.batch << " strides " << int(c.strides) << " epilogue " << c.variant << (c.c0_is_out ? " in place" : "");
  return s.str();
}

// Builds the operands of `c` (padding and gaps poisoned with NaN, so reading one would show), runs the
// emulated kernel, and checks the result against a double-precision reference, the store count of every
// element of the output buffer (in range: once; ldc padding and gaps between batch entries: never, and
// their bits unchanged) and the pipeline's hazards.
void run_case(const Case& c, std::mt19937& rng) {
  INFO(describe(c));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const bool akm = a_is_kmajor(c.la), bkm = b_is_kmajor(c.lb);
  GemmArgs g;
  g.in_dtype = c.in, g.out_dtype = c.out, g.la = c.la, g.lb = c.lb, g.M = c.M, g.N = c.N, g.K = c.K, g.batch = c.batch;
  const int64_t a_outer = akm ? c.M : c.K, a_inner = akm ? c.K : c.M;
  const int64_t b_outer = bkm ? c.N : c.K, b_inner = bkm ? c.K : c.N;
  const bool gaps = c.strides != Strides::packed;
  g.lda = (a_inner + 7) / 8 * 8 + (gaps ? 8 : 0);
  g.ldb = (b_inner + 7) / 8 * 8 + (gaps ? 16 : 0);
  g.ldc = c.N + (gaps ? 5 : 0);
  g.stride_a = c.strides == Strides::broadcast_a ? 0 : a_outer * g.lda + (gaps ? 24 : 0);
  g.stride_b = c.strides == Strides::broadcast_b ? 0 : b_outer * g.ldb + (gaps ? 8 : 0);
  g.stride_c = c.M * g.ldc + (gaps ? 3 : 0);
  // Exact extents: the last row of the last batch entry is not padded, so an overread leaves the buffer.
  emu::Extents ext;
  ext.a = (c.batch - 1) * g.stride_a + (a_outer - 1) * g.lda + a_inner;
  ext.b = (c.batch - 1) * g.stride_b + (b_outer - 1) * g.ldb + b_inner;
  ext.c = (c.batch - 1) * g.stride_c + (c.M - 1) * g.ldc + c.N;
  const uint16_t nan16 = c.in == DType::f16 ? uint16_t(0x7E00) : uint16_t(0x7FC0);
  std::vector<uint16_t> A(size_t(ext.a), nan16), B(size_t(ext.b), nan16);
  const int64_t a_entries = g.stride_a == 0 ? 1 : c.batch, b_entries = g.stride_b == 0 ? 1 : c.batch;
  for (int64_t z = 0; z < a_entries; ++z)
    for (int64_t o = 0; o < a_outer; ++o)
      for (int64_t i = 0; i < a_inner; ++i) A[size_t(z * g.stride_a + o * g.lda + i)] = bits16(c.in, u(rng));
  for (int64_t z = 0; z < b_entries; ++z)
    for (int64_t o = 0; o < b_outer; ++o)
      for (int64_t i = 0; i < b_inner; ++i) B[size_t(z * g.stride_b + o * g.ldb + i)] = bits16(c.in, u(rng));
  auto a_at = [&](int64_t z, int64_t m, int64_t k) {
    return value16(c.in, A[size_t(z * g.stride_a + (akm ? m * g.lda + k : k * g.lda + m))]);
  };
  auto b_at = [&](int64_t z, int64_t k, int64_t n) {
    return value16(c.in, B[size_t(z * g.stride_b + (bkm ? n * g.ldb + k : k * g.ldb + n))]);
  };
  auto in_range = [&](int64_t o, int64_t* z, int64_t* r, int64_t* col) {
    *z = o / g.stride_c;
    const int64_t w = o % g.stride_c;
    *r = w / g.ldc, *col = w % g.ldc;
    return *z < c.batch && *r < c.M && *col < c.N;
  };
  // out starts as a NaN sentinel except, in place, where it is C0; c0 and residual hold random values
  // and NaN in their padding (read only in range).
  OutBuffer out(c.out, ext.c), c0(c.out, ext.c), res(c.out, ext.c);
  for (int64_t o = 0; o < ext.c; ++o) {
    int64_t z, r, col;
    const bool in = in_range(o, &z, &r, &col);
    c0.set(o, in ? u(rng) : NAN);
    res.set(o, in ? u(rng) : NAN);
    out.set(o, c.c0_is_out && in ? c0.get(o) : NAN);
  }
  const OutBuffer out_before = out;
  std::vector<float> bias(size_t(c.N));
  for (auto& x : bias) x = u(rng);
  g.ep.act = Activation(c.variant % 4);
  g.ep.alpha = c.variant == 3 ? 0.5f : 1.0f;
  g.ep.beta = c.variant == 2 || c.variant == 4 ? -0.75f : 0.0f;
  g.a = A.data(), g.b = B.data(), g.out = out.data();
  g.c0 = g.ep.beta == 0.0f ? nullptr : c.c0_is_out ? out.data() : c0.data();
  g.bias = c.variant == 1 || c.variant == 2 || c.variant == 4 ? bias.data() : nullptr;
  g.residual = c.variant >= 3 ? res.data() : nullptr;
  libplan::check_tc_gemm_args(g, "emulated tc_gemm");  // arguments the kernel is given
  const emu::Result got = emu::run_kernel(g, ext);
  REQUIRE_MESSAGE(got.hazard.empty(), got.hazard);

  // f32 sums of products of 16-bit values: only the summation order differs from the reference; a
  // 16-bit output adds its half ulp (2^-11 of the value for f16, 2^-8 for bf16).
  const double tol = 2e-5 * std::sqrt(double(c.K)) + (c.out == DType::f16    ? std::ldexp(1.0, -11)
                                                      : c.out == DType::bf16 ? std::ldexp(1.0, -8)
                                                                             : 0.0);
  double worst = 0;
  int64_t bad_writes = 0, clobbered = 0;
  for (int64_t o = 0; o < ext.c; ++o) {
    int64_t z, r, col;
    if (!in_range(o, &z, &r, &col)) {
      bad_writes += got.writes[size_t(o)] != 0;
      clobbered += out.bits(o) != out_before.bits(o);
      continue;
    }
    bad_writes += got.writes[size_t(o)] != 1;
    double s = 0;
    for (int64_t k = 0; k < c.K; ++k) s += double(a_at(z, r, k)) * double(b_at(z, k, col));
    const float want = apply_epilogue(g.ep, float(s), g.c0 ? c0.get(o) : 0.0f, g.bias ? bias[size_t(col)] : 0.0f,
                                      g.residual ? res.get(o) : 0.0f);
    const double err = std::abs(double(out.get(o)) - double(want)) / (1.0 + std::abs(double(want)));
    worst = std::isnan(err) ? INFINITY : std::max(worst, err);
  }
  CHECK_MESSAGE(worst <= tol, "worst relative error ", worst, " (tolerance ", tol, ")");
  CHECK_MESSAGE(bad_writes == 0, bad_writes, " element(s) of the output buffer stored a wrong number of times");
  CHECK_MESSAGE(clobbered == 0, clobbered, " padding element(s) of the output changed");
}

}  // namespace

TEST_CASE(
    "tcgemm: the emulated kernel matches a reference GEMM over partial tiles, K-tile counts, layouts and batches") {
  std::mt19937 rng(11);
  struct Size {
    int64_t M, N, K, batch;
  };
  // K / 32 = 1 (partial), 1, 1, 2 (partial), 3 (partial), 4, 3, 7 (partial), 7 (partial, on a 3 x 3 grid);
  // M and N off the 128 tile but for one exact tile.
  const Size sizes[] = {{1, 1, 8, 1},      {13, 7, 24, 3},   {128, 128, 32, 1}, {130, 129, 40, 2}, {257, 200, 72, 2},
                        {64, 300, 128, 1}, {200, 33, 96, 2}, {45, 140, 216, 2}, {260, 300, 200, 2}};
  const DType ins[] = {DType::f16, DType::bf16}, outs[] = {DType::f32, DType::f16, DType::bf16};
  int n = 0;
  for (const Size& sz : sizes)
    for (Layout la : {Layout::row, Layout::col})
      for (Layout lb : {Layout::row, Layout::col}) {
        // Every (input, output) dtype pair meets every layout over the sizes; strides and epilogue rotate.
        Case c;
        c.in = ins[n % 2];
        c.out = outs[(n / 2) % 3];
        c.la = la, c.lb = lb;
        c.M = sz.M, c.N = sz.N, c.K = sz.K, c.batch = sz.batch;
        c.strides = Strides(n % 4);
        c.variant = int(rng() % 5);
        c.c0_is_out = n % 3 == 0;
        run_case(c, rng);
        ++n;
      }
}

TEST_CASE("tcgemm: the emulated epilogue stores f32, f16 and bf16 with every epilogue, stride and ldc") {
  std::mt19937 rng(12);
  for (DType in : {DType::f16, DType::bf16})
    for (DType out : {DType::f32, DType::f16, DType::bf16})
      for (int variant = 0; variant < 5; ++variant)
        for (Strides st : {Strides::packed, Strides::gaps, Strides::broadcast_a, Strides::broadcast_b}) {
          Case c;
          c.in = in, c.out = out, c.variant = variant, c.strides = st;
          c.la = Layout(variant % 2), c.lb = Layout((variant / 2) % 2);
          c.M = 37, c.N = 45, c.K = 40, c.batch = 3;
          c.c0_is_out = variant == 4;
          run_case(c, rng);
        }
}

TEST_CASE("tcgemm: a broken pipeline shows in the emulated kernel's report and in its numbers") {
  // wait_group 2: the first k-tile is read before it lands; shared memory still holds its NaN poison.
  GemmArgs g;
  g.M = 20, g.N = 20, g.K = 64, g.lda = 64, g.ldb = 24;
  std::vector<uint16_t> A(size_t(g.M * g.lda), f32_to_f16_bits(1.0f)), B(size_t(g.K * g.ldb), f32_to_f16_bits(1.0f));
  std::vector<float> C(size_t(g.M * g.N), 0.0f);
  g.ldc = g.N, g.a = A.data(), g.b = B.data(), g.out = C.data();
  emu::Extents ext{int64_t(A.size()), int64_t(B.size()), int64_t(C.size())};
  CHECK(emu::run_kernel(g, ext).hazard == "");
  CHECK(C[0] == 64.0f);
  emu::Schedule s;
  s.wait_depth = kStages - 1;
  const emu::Result r = emu::run_kernel(g, ext, s);
  CHECK(r.hazard ==
        "block (0, 0, 0): k-tile 0 read from A stage 0 while the copy of k-tile 0 (group 0) is in flight: "
        "no cp.async.wait_group has covered that group yet");
  CHECK(std::isnan(C[0]));
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

TEST_CASE("tcgemm: output batches that overlap are refused (the kernel's blocks would race on C)") {
  alignas(16) static uint16_t a[16 * 16], b[16 * 16];
  static float out[2 * 16 * 16];
  GemmArgs g;
  g.M = g.N = g.K = 16;
  g.lda = g.ldb = g.ldc = 16;
  g.a = a, g.b = b, g.out = out;
  g.batch = 2;
  g.stride_c = 16 * 16;  // one whole output apart: fine
  CHECK_NOTHROW(libplan::check_tc_gemm_args(g, "tc_gemm"));
  for (int64_t s : {int64_t(0), int64_t(15 * 16 + 15)}) {
    g.stride_c = s;
    CHECK_THROWS_WITH(libplan::check_tc_gemm_args(g, "tc_gemm"), doctest::Contains("would overwrite each other"));
  }
}
