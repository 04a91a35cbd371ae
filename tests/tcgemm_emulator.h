// A host emulator of Kiln's Tensor Core GEMM kernel (kernels/cuda/tc_gemm.cu) for tests/test_tcgemm.cpp.
// It runs the kernel's grid block by block with the kernel's own index arithmetic (kernels/common/
// tc_gemm_layout.h) and follows its pipeline step by step: the cp.async copies of every thread into
// the 3-stage shared-memory ring, cp.async.commit_group / wait_group, __syncthreads, ldmatrix (plain
// and .trans) and mma.m16n8k16 from the register layouts the PTX ISA documents, then the epilogue.
//
// The ring is a model of what the hardware guarantees, not just a buffer: it knows for each stage of
// each operand whether it is empty, in flight with k-tile t (and in which commit group), landed with
// k-tile t in this thread (a wait_group covered its group), visible to the whole block (a barrier
// followed that wait), and whether a warp has read it since the last barrier. Every ldmatrix read and
// every cp.async write is checked against that state, so a schedule that reads a stage before its
// copy is known to have landed, or copies into a stage a warp may still be reading, is reported with
// the k-tile and the stage. Copied data reaches shared memory only when a wait_group covers it (the
// latest moment the hardware may deliver it), and shared memory starts as NaN, so an early read
// would also show in the numbers.
//
// The model tracks one thread's groups: every thread of a block runs the same commit sequence (the
// loop bounds depend only on K), so a wait_group covers the same groups in all threads, and the
// barrier after it makes all threads' chunks visible.
#pragma once

#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/common/tc_gemm_layout.h"

namespace kiln::tcgemm::emu {

// The kernel's pipeline, and knobs that break it on purpose (tests show each breakage is reported).
struct Schedule {
  enum class Barrier : uint8_t { before_copy, after_copy, none };
  int wait_depth = kWaitDepth;  // cp.async.wait_group N at the top of each iteration
  int prefetch = kPrefetch;     // the loop copies k-tile kt + prefetch while computing kt (prologue: kPrefetch)
  Barrier barrier = Barrier::before_copy;
};

// The block's dynamic shared memory as the kernel lays it out (A stages, then B stages) and the
// cp.async state of every stage.
class CpAsyncRing {
 public:
  static constexpr int kRegions = 2 * kStages;  // A stage 0..2, B stage 0..2, kTileHalves halves each

  // tracing: record the events (copies, commits, waits, barriers, stage reads) for trace().
  explicit CpAsyncRing(bool tracing = false)
      : smem_(size_t(kRegions) * kTileHalves, uint16_t(0xFFFF)), tracing_(tracing) {}  // NaN in f16 and bf16

  // cp.async.cg 16 bytes into shared offset `dst` (halves) of k-tile kt: `valid` elements from src,
  // the rest zero-filled, delivered when a wait_group covers the group it joins.
  void cp_async(int dst, int kt, const uint16_t* src, int valid) {
    Region& g = regions_[dst / kTileHalves];
    const int64_t group = int64_t(groups_.size());  // the group the next commit closes
    if (g.state == State::in_flight && g.group != group)
      hazard("copy of k-tile ", kt, " into ", name(dst), " issued while the copy of k-tile ", g.kt, " into it (group ",
             g.group, ") may still be in flight");
    if (g.read_epoch == epoch_)
      hazard("copy of k-tile ", kt, " into ", name(dst), " issued while a warp may still be reading k-tile ", g.kt,
             " from it (no __syncthreads since that read)");
    g.state = State::in_flight;
    g.kt = kt;
    g.group = group;
    Chunk c{dst, {}};
    for (int e = 0; e < kChunk; ++e) c.v[e] = e < valid ? src[e] : uint16_t(0);
    pending_.push_back(c);
    if (tracing_) trace_ << "copy " << name(dst) << " k" << kt << ' ';
  }
  void commit_group() {
    groups_.push_back(std::move(pending_));
    pending_.clear();
    if (tracing_) trace_ << "commit ";
  }
  // Every committed group but the newest n has completed: its data lands in this thread.
  void wait_group(int n) {
    if (tracing_) trace_ << "wait " << n << ' ';
    const int64_t done = int64_t(groups_.size()) - n;
    for (; completed_ < done; ++completed_) {
      for (const Chunk& c : groups_[size_t(completed_)]) std::memcpy(&smem_[size_t(c.dst)], c.v, sizeof c.v);
      for (Region& g : regions_)
        if (g.state == State::in_flight && g.group == completed_) g.state = State::landed;
    }
  }
  // __syncthreads: what every thread has waited for is visible to all, and reads before it are over.
  void syncthreads() {
    if (tracing_) trace_ << "sync ";
    ++epoch_;
    for (Region& g : regions_)
      if (g.state == State::landed) g.state = State::visible;
  }
  // One ldmatrix row (8 halves at shared offset `src`) read for k-tile kt.
  const uint16_t* read_row(int src, int kt) {
    Region& g = regions_[src / kTileHalves];
    if (g.state != State::visible || g.kt != kt) {
      switch (g.state) {
        case State::empty: hazard("k-tile ", kt, " read from ", name(src), ", which no copy has filled"); break;
        case State::in_flight:
          hazard("k-tile ", kt, " read from ", name(src), " while the copy of k-tile ", g.kt, " (group ", g.group,
                 ") is in flight: no cp.async.wait_group has covered that group yet");
          break;
        case State::landed:
          hazard("k-tile ", kt, " read from ", name(src), " after the wait_group that landed k-tile ", g.kt,
                 " but before a __syncthreads: the other threads' chunks need not be visible");
          break;
        case State::visible: hazard("k-tile ", kt, " read from ", name(src), ", which holds k-tile ", g.kt); break;
      }
    }
    g.read_epoch = epoch_;
    return &smem_[size_t(src)];
  }
  void note_read(int stage, int kt) {
    if (tracing_) trace_ << "read stage " << stage << " k" << kt << ' ';
  }
  // At the kernel's end: nothing uncommitted, nothing in flight.
  void finish() {
    if (!pending_.empty()) hazard(pending_.size(), " cp.async chunk(s) never committed");
    for (int r = 0; r < kRegions; ++r)
      if (regions_[r].state == State::in_flight)
        hazard("the kernel ends with the copy of k-tile ", regions_[r].kt, " into ", name(r * kTileHalves),
               " in flight");
  }

  const std::string& first_hazard() const { return first_hazard_; }
  std::string trace() const { return trace_.str(); }

 private:
  enum class State : uint8_t { empty, in_flight, landed, visible };
  struct Region {
    State state = State::empty;
    int kt = -1;
    int64_t group = -1, read_epoch = -1;
  };
  struct Chunk {
    int dst;
    uint16_t v[kChunk];
  };

  static int stage_of(int off) { return (off / kTileHalves) % kStages; }
  static std::string name(int off) {
    return std::string(off / kTileHalves < kStages ? "A" : "B") + " stage " + std::to_string(stage_of(off));
  }
  // The first hazard only: later ones usually follow from it.
  template <typename... T> void hazard(const T&... parts) {
    if (!first_hazard_.empty()) return;
    std::ostringstream s;
    (s << ... << parts);
    first_hazard_ = s.str();
  }

  std::vector<uint16_t> smem_;
  Region regions_[kRegions];
  std::vector<Chunk> pending_;
  std::vector<std::vector<Chunk>> groups_;
  int64_t completed_ = 0, epoch_ = 0;
  std::string first_hazard_;
  bool tracing_;
  std::ostringstream trace_;
};

// The kernel's main loop (tc_gemm_kernel, from the prologue to the wait_group 0 before the epilogue),
// statement for statement: load_stage(stage, kt) issues one stage's copies, compute(stage, kt) its
// ldmatrix/mma work.
template <typename LoadStage, typename Compute>
void run_pipeline(int ktiles, const Schedule& s, CpAsyncRing& ring, LoadStage load_stage, Compute compute) {
  for (int st = 0; st < kPrefetch; ++st) {
    if (st < ktiles) load_stage(st, st);
    ring.commit_group();
  }
  for (int kt = 0; kt < ktiles; ++kt) {
    ring.wait_group(s.wait_depth);
    if (s.barrier == Schedule::Barrier::before_copy) ring.syncthreads();
    const int next = kt + s.prefetch;
    if (next < ktiles) load_stage(next % kStages, next);
    ring.commit_group();
    if (s.barrier == Schedule::Barrier::after_copy) ring.syncthreads();
    ring.note_read(kt % kStages, kt);
    compute(kt % kStages, kt);
  }
  ring.wait_group(0);
  ring.finish();
}

// The schedule alone (no data): each stage's copy is one chunk, each read one row. Returns the first
// hazard ("" when none) and, in *trace, the events in order.
inline std::string check_schedule(int ktiles, const Schedule& s, std::string* trace = nullptr) {
  CpAsyncRing ring(trace != nullptr);
  const uint16_t zeros[kChunk] = {};
  run_pipeline(
      ktiles, s, ring,
      [&](int stage, int kt) {
        ring.cp_async(stage * kTileHalves, kt, zeros, kChunk);
        ring.cp_async((kStages + stage) * kTileHalves, kt, zeros, kChunk);
      },
      [&](int stage, int kt) {
        ring.read_row(stage * kTileHalves, kt);
        ring.read_row((kStages + stage) * kTileHalves, kt);
      });
  if (trace) *trace = ring.trace();
  return ring.first_hazard();
}

// The sizes, in elements, of the buffers behind a GemmArgs' pointers, so every access is checked.
struct Extents {
  int64_t a = 0, b = 0, c = 0;  // c: out, and c0 and residual when given
};

struct Result {
  std::string hazard;       // the first pipeline hazard or out-of-bounds access, "" when none
  std::vector<int> writes;  // stores per element of out (Extents::c of them)
};

// ldmatrix.sync.aligned.m8n8.x4[.trans].b16 as the PTX ISA defines it: lanes 8q..8q+7 give the row
// addresses of matrix q; lane l receives, in register q, elements (l/4, 2(l%4)) and (l/4, 2(l%4)+1)
// of matrix q, or with .trans elements (2(l%4), l/4) and (2(l%4)+1, l/4).
inline void ldmatrix_x4(CpAsyncRing& ring, int kt, const int addr[32], bool trans, uint16_t regs[32][4][2]) {
  const uint16_t* rows[32];
  for (int l = 0; l < 32; ++l) rows[l] = ring.read_row(addr[l], kt);
  for (int q = 0; q < 4; ++q)
    for (int l = 0; l < 32; ++l)
      for (int h = 0; h < 2; ++h) {
        const int row = trans ? 2 * (l % 4) + h : l / 4, col = trans ? l / 4 : 2 * (l % 4) + h;
        regs[l][q][h] = rows[8 * q + row][col];
      }
}

// Runs tc_gemm_kernel over its whole grid (ceil(N/128) x ceil(M/128) x batch) on host memory: reads A
// and B, reads c0/bias/residual and writes out exactly as the kernel does, with arguments the kernel
// accepts (libplan::check_tc_gemm_args; the caller checks).
inline Result run_kernel(const GemmArgs& g, const Extents& ext, const Schedule& sched = {}) {
  Result res;
  res.writes.assign(size_t(ext.c), 0);
  auto oob = [&](auto... parts) {
    if (!res.hazard.empty()) return;
    std::ostringstream s;
    (s << ... << parts);
    res.hazard = s.str();
  };
  const bool akm = a_is_kmajor(g.la), bkm = b_is_kmajor(g.lb), bf = g.in_dtype == DType::bf16;
  const int kind = out_kind(g.out_dtype);
  auto value = [&](uint16_t bits) { return bf ? bf16_bits_to_f32(bits) : f16_bits_to_f32(bits); };
  const int ktiles = int((g.K + kBK - 1) / kBK);
  const int64_t grid_x = (g.N + kBN - 1) / kBN, grid_y = (g.M + kBM - 1) / kBM;
  static float acc[kWarps][32][kTilesM][kTilesN][4];
  for (int64_t z = 0; z < g.batch; ++z)
    for (int64_t by = 0; by < grid_y; ++by)
      for (int64_t bx = 0; bx < grid_x; ++bx) {
        const int64_t bm = by * kBM, bn = bx * kBN;
        const auto* const A = static_cast<const uint16_t*>(g.a) + z * g.stride_a;
        const auto* const B = static_cast<const uint16_t*>(g.b) + z * g.stride_b;
        CpAsyncRing ring;
        std::fill(&acc[0][0][0][0][0], &acc[0][0][0][0][0] + sizeof acc / sizeof(float), 0.0f);
        // load_tile of the kernel: each thread's chunks of one operand's tile.
        // `buffer`/`extent`: the whole allocation, for the bounds check of what is read.
        auto load_tile = [&](bool km, const uint16_t* base, const void* buffer, int64_t extent, int64_t ld,
                             int64_t row0, int64_t rows, int smem0, int stage, int kt) {
          const int64_t k0 = int64_t(kt) * kBK;
          for (int t = 0; t < kThreads; ++t)
            for (int i = 0; i < kChunksPerThread; ++i) {
              const ChunkCoord c = load_chunk(km, t, i);
              const int v = chunk_valid(km, c, row0, k0, rows, g.K);
              const int64_t off = v > 0 ? chunk_global_offset(km, c, row0, k0, ld) : 0;
              const uint16_t* src = base + off;
              if (reinterpret_cast<uintptr_t>(src) % 16 != 0) oob("a cp.async source is not 16-byte aligned");
              const int64_t first = src - static_cast<const uint16_t*>(buffer);
              if (v > 0 && (first < 0 || first + v > extent))
                oob("a cp.async reads elements ", first, "..", first + v - 1, " of a buffer of ", extent);
              else
                ring.cp_async(smem0 + stage * kTileHalves + chunk_smem_offset(km, c), kt, src, v);
            }
        };
        auto load_stage = [&](int stage, int kt) {
          load_tile(akm, A, g.a, ext.a, g.lda, bm, g.M, 0, stage, kt);
          load_tile(bkm, B, g.b, ext.b, g.ldb, bn, g.N, kStages * kTileHalves, stage, kt);
        };
        auto compute = [&](int stage, int kt) {
          const int ta = stage * kTileHalves, tb = (kStages + stage) * kTileHalves;
          for (int w = 0; w < kWarps; ++w)
            for (int ks = 0; ks < kBK; ks += kMmaK) {
              uint16_t afr[kTilesM][32][4][2], bfr[kTilesN / 2][32][4][2];
              for (int tm = 0; tm < kTilesM; ++tm) {
                int addr[32];
                for (int l = 0; l < 32; ++l) addr[l] = ta + ldsm_a_offset(akm, l, warp_row0(w) + tm * kMmaM, ks);
                ldmatrix_x4(ring, kt, addr, !akm, afr[tm]);
              }
              for (int tp = 0; tp < kTilesN / 2; ++tp) {
                int addr[32];
                for (int l = 0; l < 32; ++l) addr[l] = tb + ldsm_b_offset(bkm, l, warp_col0(w) + tp * 2 * kMmaN, ks);
                ldmatrix_x4(ring, kt, addr, !bkm, bfr[tp]);
              }
              // mma.m16n8k16.row.col: gather A (16x16) and B (16x8) from the lanes by the documented
              // layouts, multiply in f32, scatter D back by the accumulator layout.
              for (int tm = 0; tm < kTilesM; ++tm)
                for (int tn = 0; tn < kTilesN; ++tn) {
                  float a[16][16], b[16][8];
                  for (int l = 0; l < 32; ++l) {
                    for (int j = 0; j < 8; ++j) {
                      const RowCol x = a_frag_coord(l, j);
                      a[x.r][x.c] = value(afr[tm][l][j / 2][j % 2]);
                    }
                    for (int j = 0; j < 4; ++j) {
                      const RowCol x = b_frag_coord(l, j);
                      // registers 0,1 of an x4 B load are n-tile 2*tp, registers 2,3 n-tile 2*tp+1
                      b[x.r][x.c] = value(bfr[tn / 2][l][2 * (tn % 2) + j / 2][j % 2]);
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
        };
        run_pipeline(ktiles, sched, ring, load_stage, compute);
        if (res.hazard.empty() && !ring.first_hazard().empty())
          res.hazard = "block (" + std::to_string(bx) + ", " + std::to_string(by) + ", " + std::to_string(z) +
                       "): " + ring.first_hazard();
        // The epilogue: every accumulator to its (row, col), predicated at the edges.
        for (int w = 0; w < kWarps; ++w)
          for (int l = 0; l < 32; ++l)
            for (int tm = 0; tm < kTilesM; ++tm)
              for (int tn = 0; tn < kTilesN; ++tn)
                for (int i = 0; i < 4; ++i) {
                  const RowCol x = epilogue_coord(w, l, tm, tn, i);
                  const int64_t r = bm + x.r, c = bn + x.c;
                  if (r >= g.M || c >= g.N) continue;
                  const int64_t o = c_offset(z, g.stride_c, r, c, g.ldc);
                  if (o < 0 || o >= ext.c) {
                    oob("the epilogue of (", z, ", ", r, ", ", c, ") addresses element ", o, " of ", ext.c);
                    continue;
                  }
                  ++res.writes[size_t(o)];
                  epilogue_element(g.ep, kind, g.out, g.c0, g.bias, g.residual, o, c, acc[w][l][tm][tn][i]);
                }
      }
  return res;
}

}  // namespace kiln::tcgemm::emu
