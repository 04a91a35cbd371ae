// CPU conv2d (NCHW) as im2col + GEMM over chunks of S images side by side, so late ResNet layers
// (8x8 maps) still give GEMMs wide enough to run near peak. S depends only on the shapes, and
// weight gradients are summed per chunk in chunk order, so results do not depend on threads.
//
// f32 under the AVX-512 and AVX2 kernel sets (base/cpu_isa.h) never stores the im2col matrix of the forward
// pass: the GEMM's B panels are packed straight from the images (implicit GEMM, pack_im2col below),
// stride-1 convolutions whose output rows are as wide as the input's run as direct convolutions, and
// small planes and strided filters take tiles across output channels (direct_conv_oc). The input gradient
// of a stride-1 convolution is the forward convolution of the output gradient with the flipped, transposed
// filters (padding k-1-p), so it takes the same paths instead of GEMM + col2im; a strided one goes phase by
// phase on the output-channel tiles (input_grad_oc) where the channels allow. The weight gradient of the
// direct-conv shapes, and of strided filters through x's phase planes, reads both operands in place
// (direct_conv_wgrad); the rest use the explicit im2col matrix. docs/architecture.md lists when each path is taken.
#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/loops.h"
#include "kernels/cpu/ops_cpu.h"
#include "kernels/cpu/scratch.h"

#include "kernels/cpu/kernel_sets.h"

namespace kiln::cpu {
namespace {

constexpr int64_t kTargetCols = 1024;  // columns of a chunk (S * OH * OW): its im2col matrix stays in L2
constexpr int64_t kMaxColElems = 1 << 23;  // cap on one chunk's im2col buffer (32 MiB of f32)
thread_local ScratchBuffer t_col, t_out;     // a chunk's im2col matrix and its [O, cols] GEMM operand
// The calling thread's buffers of the direct paths (packed weights and zeros; packed weight-gradient
// operands), shared with the pool's threads for the call: kept, so a step does not fault in fresh pages.
// They keep their largest size for the thread's life: t_packed_x/gy hold a copy of a 7x7 layer's x and
// gy (ResNet-20 at batch 128: 1.6 MB each; ResNet-50's 512-channel 7x7 stage at batch 256: 26 MB).
thread_local ScratchBuffer t_packed_w, t_zeros, t_packed_gy, t_packed_x;
thread_local ScratchBuffer t_grad_band;  // input_grad_oc: a task's band of gx

struct Geometry {
  const Conv2dParams& p;
  int64_t cg, og, ckk, ohw, s, nchunks;
  explicit Geometry(const Conv2dParams& q) : p(q) {
    cg = p.c / p.groups;
    og = p.o / p.groups;
    ckk = cg * p.kh * p.kw;
    ohw = p.oh * p.ow;
    s = (kTargetCols + ohw - 1) / std::max<int64_t>(ohw, 1);
    s = std::min(s, kMaxColElems / std::max<int64_t>(ckk * ohw, 1));
    s = std::clamp<int64_t>(s, 1, std::max<int64_t>(p.n, 1));
    nchunks = (p.n + s - 1) / s;
  }
};

// col[(c, ki, kj), (si, oh, ow)] for images n0 .. n0+ns of group g; cols = ns * OH * OW.
template <typename T> void im2col_channels(const Geometry& G, const T* x, int64_t n0, int64_t ns, int64_t g, T* col,
                                           int64_t c0, int64_t c1) {
  const auto& p = G.p;
  const int64_t cols = ns * G.ohw;
  for (int64_t c = c0; c < c1; ++c) {
    for (int64_t ki = 0; ki < p.kh; ++ki) {
      for (int64_t kj = 0; kj < p.kw; ++kj) {
        T* row = col + ((c * p.kh + ki) * p.kw + kj) * cols;
        for (int64_t si = 0; si < ns; ++si) {
          const T* img = x + ((n0 + si) * p.c + g * G.cg + c) * p.h * p.w;
          T* out = row + si * G.ohw;
          for (int64_t oh = 0; oh < p.oh; ++oh) {
            const int64_t ih = oh * p.sh - p.ph + ki * p.dh;
            T* o = out + oh * p.ow;
            if (ih < 0 || ih >= p.h) {
              std::fill(o, o + p.ow, T(0));
              continue;
            }
            const T* src = img + ih * p.w;
            const int64_t off = kj * p.dw - p.pw;
            if (p.sw == 1) {
              // valid ow range: 0 <= ow + off < W
              const int64_t lo = std::clamp<int64_t>(-off, 0, p.ow), hi = std::clamp<int64_t>(p.w - off, lo, p.ow);
              std::fill(o, o + lo, T(0));
              std::memcpy(o + lo, src + lo + off, size_t(hi - lo) * sizeof(T));
              std::fill(o + hi, o + p.ow, T(0));
            } else {
              for (int64_t ow = 0; ow < p.ow; ++ow) {
                const int64_t iw = ow * p.sw + off;
                o[ow] = (iw >= 0 && iw < p.w) ? src[iw] : T(0);
              }
            }
          }
        }
      }
    }
  }
}

// The adjoint of im2col: adds col back into gx (which the caller zeroed). Channels touch disjoint
// planes of gx, so they may run in parallel.
template <typename T> void col2im_channels(const Geometry& G, const T* col, int64_t n0, int64_t ns, int64_t g, T* gx,
                                           int64_t c0, int64_t c1) {
  const auto& p = G.p;
  const int64_t cols = ns * G.ohw;
  for (int64_t c = c0; c < c1; ++c) {
    for (int64_t ki = 0; ki < p.kh; ++ki) {
      for (int64_t kj = 0; kj < p.kw; ++kj) {
        const T* row = col + ((c * p.kh + ki) * p.kw + kj) * cols;
        for (int64_t si = 0; si < ns; ++si) {
          T* img = gx + ((n0 + si) * p.c + g * G.cg + c) * p.h * p.w;
          const T* in = row + si * G.ohw;
          for (int64_t oh = 0; oh < p.oh; ++oh) {
            const int64_t ih = oh * p.sh - p.ph + ki * p.dh;
            if (ih < 0 || ih >= p.h) continue;
            T* dst = img + ih * p.w;
            const T* o = in + oh * p.ow;
            const int64_t off = kj * p.dw - p.pw;
            if (p.sw == 1) {
              const int64_t lo = std::clamp<int64_t>(-off, 0, p.ow), hi = std::clamp<int64_t>(p.w - off, lo, p.ow);
              T* d = dst + off;
              for (int64_t ow = lo; ow < hi; ++ow) d[ow] += o[ow];
            } else {
              for (int64_t ow = 0; ow < p.ow; ++ow) {
                const int64_t iw = ow * p.sw + off;
                if (iw >= 0 && iw < p.w) dst[iw] += o[ow];
              }
            }
          }
        }
      }
    }
  }
}

// Whole-chunk versions: spread over the pool's threads by channel (inline when already inside a
// parallel region, i.e. when chunks themselves run in parallel).
template <typename T> void im2col(const Geometry& G, const T* x, int64_t n0, int64_t ns, int64_t g, T* col) {
  parallel_for(0, G.cg, 1, [&](int64_t c0, int64_t c1) { im2col_channels(G, x, n0, ns, g, col, c0, c1); });
}
template <typename T> void col2im(const Geometry& G, const T* col, int64_t n0, int64_t ns, int64_t g, T* gx) {
  parallel_for(0, G.cg, 1, [&](int64_t c0, int64_t c1) { col2im_channels(G, col, n0, ns, g, gx, c0, c1); });
}

// The GEMM's B operand for images n0 .. n0+ns of group g, packed on demand (the layout gemm.h documents):
// element (r, j) of the im2col matrix, r = (c, ki, kj) and j = (si, oh, ow), is
// x[n0 + si, g * Cg + c, oh * sh - ph + ki * dh, ow * sw - pw + kj * dw], or 0 in the padding.
// A panel's columns (64 on AVX-512, 16 on AVX2) are cut into runs that stay within one output row; each row
// of the panel then copies, per run, a stretch of one input row (stride 1: a vector at a time, masked loads
// that touch only the in-bounds lanes) or zeros where the row is padding.
struct ImplicitCol {
  const Geometry* G;
  const float* x;
  int64_t n0, g;
};

// The convolution leaves of the kernel set in use, or null (the generic set).
const isa::ConvLeaves* conv_leaves() {
  const isa::Leaves& l = kernel_set();
  return l.conv.wgrad_tile ? &l.conv : nullptr;
}

void pack_im2col(const void* ctx, int64_t pc, int64_t kc, int64_t j0, int64_t nc, float* dst) {
  const auto& s = *static_cast<const ImplicitCol*>(ctx);
  const Geometry& G = *s.G;
  const Conv2dParams& p = G.p;
  const isa::Im2colGeometry geo{s.x, p.h * p.w, p.h, p.w, p.kh, p.kw, p.dh, p.dw, p.sw};
  const GemmPanels panels = gemm_panels();
  constexpr int64_t kMaxPanelCols = 64;
  KILN_ASSERT(panels.cols > 0 && panels.cols <= kMaxPanelCols, "pack_im2col: panels of ", panels.cols, " columns");
  isa::Im2colRun runs[kMaxPanelCols];
  for (int64_t jr = 0; jr < nc; jr += panels.cols, dst += kc * panels.cols) {
    const int64_t cols = std::min(panels.cols, nc - jr), stride = panels.stride(cols);
    int nruns = 0;
    for (int64_t j = j0 + jr, end = j0 + jr + cols; j < end;) {
      const int64_t si = j / G.ohw, rem = j - si * G.ohw, oh = rem / p.ow, ow0 = rem - oh * p.ow;
      const int64_t len = std::min(p.ow - ow0, end - j);
      runs[nruns++] = {j - (j0 + jr), ((s.n0 + si) * p.c + s.g * G.cg) * geo.plane, oh * p.sh - p.ph, ow0 * p.sw - p.pw,
                       len};
      j += len;
    }
    conv_leaves()->pack_im2col_panel(geo, runs, nruns, pc, kc, cols, stride, dst);
  }
}

// ---- direct convolution: stride 1, dilation 1, OW == W ------------------------------------------------
// Then output pixel p = oh * W + ow reads input x[c, p + (ki - ph) * W + (kj - pw)] for tap (ki, kj): a
// fixed shift of p, so 16 consecutive output pixels read 16 consecutive input floats, and only the lanes
// that fall in the padding (or past the plane, or wrap into a neighbouring row) must be masked off.
// The GEMM's B operand is loaded straight from the image: nothing is packed.
//
// A task is one image, one tile of 64 output pixels (4 vectors) and up to 48 output channels of one
// group (so even one image spreads over the threads). It computes its channels 6 at a time, the last 7..11
// in two tiles (register tile 6 x 4 vectors, as in the GEMM): for each input channel and tap t, 4 masked loads of x
// (the tap's masks precomputed per tile) and 6 broadcasts of w[o, c, t] feed 24 FMAs. Sums run over (c, ki, kj) in
// order, as the im2col GEMM's K does: results do not depend on threads. Channel-outer order keeps the taps of one
// channel on the same few lines of x (a tap-outer order strides by whole planes, and 4 KiB planes thrash L1's sets);
// the tile's slice of x (Cg planes x ~(64 + 2W) floats) stays in L1/L2 across the channel blocks.
using isa::kDirectMaxTaps;

bool direct_conv_applies(const Conv2dParams& p) {
  return p.sh == 1 && p.sw == 1 && p.dh == 1 && p.dw == 1 && p.ow == p.w && p.kh * p.kw > 1 &&
         p.kh * p.kw <= kDirectMaxTaps;
}

// Per tile of 64 output pixels (the same for every image): each tap's 4 load masks (lanes whose input
// pixel is inside the image) and the 4 store masks (lanes inside the output plane).
struct TileMasks {
  isa::Mask16 load[kDirectMaxTaps][4];
  isa::Mask16 store[4];
};

std::vector<TileMasks> tile_masks(const Conv2dParams& p) {
  const int64_t ohw = p.oh * p.ow, tiles = (ohw + 63) / 64, taps = p.kh * p.kw;
  std::vector<TileMasks> tm(static_cast<size_t>(tiles));
  parallel_for(0, tiles, 16, [&](int64_t b, int64_t e) {
    for (int64_t tile = b; tile < e; ++tile) {
      TileMasks& m = tm[size_t(tile)];
      const int64_t p0 = tile * 64;
      for (int v = 0; v < 4; ++v) m.store[v] = isa::Mask16(((1u << std::clamp<int64_t>(ohw - p0 - 16 * v, 0, 16)) - 1));
      for (int64_t t = 0; t < taps; ++t) {
        const int64_t di = t / p.kw - p.ph, dj = t % p.kw - p.pw;
        for (int v = 0; v < 4; ++v) {
          unsigned bits = 0;
          for (int l = 0; l < 16; ++l) {
            const int64_t px = p0 + 16 * v + l, ih = px / p.w + di, iw = px % p.w + dj;
            if (px < ohw && ih >= 0 && ih < p.h && iw >= 0 && iw < p.w) bits |= 1u << l;
          }
          m.load[t][v] = isa::Mask16(bits);
        }
      }
    }
  });
  return tm;
}

// Input offset of tap t relative to the output pixel: (ki - ph) * W + (kj - pw).
int64_t tap_shift(const Conv2dParams& p, int64_t t) { return (t / p.kw - p.ph) * p.w + (t % p.kw - p.pw); }

// y = conv(x, w) (no bias) for every image and group, by the direct leaves (up to 6 output channels at a time).
void direct_conv(const isa::ConvLeaves& L, const Conv2dParams& p, const float* x, const float* w, float* y) {
  const int64_t cg = p.c / p.groups, og = p.o / p.groups, taps = p.kh * p.kw, plane = p.h * p.w;
  const int64_t ohw = p.oh * p.ow, tiles = (ohw + 63) / 64, wstride = cg * taps;
  const std::vector<TileMasks> tm = tile_masks(p);
  int64_t base_shift[kDirectMaxTaps];
  int64_t lo_shift = 0, hi_shift = 0;
  for (int64_t t = 0; t < taps; ++t) {
    base_shift[t] = tap_shift(p, t);
    lo_shift = std::min(lo_shift, base_shift[t]);
    hi_shift = std::max(hi_shift, base_shift[t]);
  }
  const int64_t x_size = p.n * p.c * plane;
  // A task: one image, one tile, one group's output channels kOutSpan at a time (so a single image
  // still spreads over the threads); every output has one writer.
  constexpr int64_t kOutSpan = 48;
  const int64_t spans = (og + kOutSpan - 1) / kOutSpan, per_image = tiles * p.groups * spans;
  parallel_for(0, p.n * per_image, 1, [&](int64_t b, int64_t e) {
    int64_t shift[kDirectMaxTaps];
    for (int64_t task = b; task < e; ++task) {
      const int64_t n = task / per_image, rest = task % per_image, tile = rest / (p.groups * spans);
      const int64_t g = rest / spans % p.groups, o_begin = rest % spans * kOutSpan;
      const int64_t o_end = std::min(og, o_begin + kOutSpan), p0 = tile * 64;
      const auto& masks = tm[size_t(tile)].load;
      const isa::Mask16* store = tm[size_t(tile)].store;
      for (int64_t t = 0; t < taps; ++t) shift[t] = p0 + base_shift[t];
      const float* xg = x + (n * p.c + g * cg) * plane;
      float* yg = y + (n * p.o + g * og) * ohw + p0;
      const float* wg = w + g * og * wstride;
      // Whether the tile's reads, masked lanes included, stay inside x (all but the first and last tiles).
      const int64_t first = (n * p.c + g * cg) * plane + p0 + lo_shift;
      const int64_t last = (n * p.c + g * cg + cg - 1) * plane + p0 + 64 + hi_shift;
      const bool inside = first >= 0 && last <= x_size;
      for (int64_t o = o_begin, rows = 0; o < o_end; o += rows) {
        // 6 rows at a time, the last 7..11 split in two: a 2-row tile has 4 chains of FMAs, too few to hide
        // their latency (32 channels as 6 x 5 + 2 left one at half speed).
        const int64_t left = o_end - o;
        rows = left <= 6 ? left : left < 12 ? (left + 1) / 2 : 6;
        L.direct[rows - 1](xg, plane, cg, wg + o * wstride, wstride, taps, shift, masks, yg + o * ohw, ohw, store,
                           inside);
      }
    }
  });
}
// ---- direct convolution with vectors across output channels -------------------------------------------
// A 7x7 or 14x14 plane fills 64-pixel tiles to 77% (49 of 64, 196 of 256 lanes): the pixel-vector
// kernels above then spend a quarter of their FMAs on padding. Here a vector holds 16 output channels of
// one pixel and the tile is kP pixels of the flattened (image, pixel) space, each pixel's input read by
// broadcast from its own address, so tiles run across image boundaries and every lane is used (a tail
// of fewer than kP pixels repeats its last). Per (tap, channel): kV vectors of w (packed per tap, channel
// and output channel) and kP broadcasts feed kV * kP FMAs, as many per load as the pixel kernel; sums
// run over (tap, channel). A tap that falls in the padding reads a zero buffer instead of x.
// The widest output-channel leaf whose channels divide `outputs`, with a tile's weight block (`terms` =
// taps x summed channels, per output channel) within L2: every tile reads its block once (ResNet-20's
// 64 x 64 x 3 x 3 is 144 KiB; ResNet-50's 512-channel 7x7 stage, 1.2 MiB a block, is left to the others).
// The forward (and stride-1 input gradient) passes forward = true and skips the leaves meant only for the
// strided input gradient.
const isa::ConvLeaves::DirectOc* oc_leaf_for(const isa::ConvLeaves& L, int64_t outputs, int64_t terms, bool forward) {
  constexpr int64_t kMaxBlockBytes = 192 << 10;
  for (const auto& leaf : L.direct_oc)
    if (leaf.fn && !(forward && leaf.input_grad_only) && outputs % leaf.channels == 0 &&
        terms * leaf.channels * 4 <= kMaxBlockBytes)
      return &leaf;
  return nullptr;
}

// One tile of `leaf` through each of `blocks` blocks of leaf.channels outputs: the blocks lie channels * ldy
// apart from py, their weights (packed [block][tap][summed channel][channels]) taps * sums * channels apart
// from w.
void oc_tile_blocks(const isa::ConvLeaves::DirectOc& leaf, int64_t blocks, int64_t taps, int64_t sums,
                    int64_t in_stride, const float* const* px, const float* w, float* const* py, int64_t ldy,
                    int pixels) {
  const int64_t cw = leaf.channels;
  for (int64_t blk = 0; blk < blocks; ++blk) {
    float* pyb[isa::kDirectOcMaxPixels];
    for (int64_t i = 0; i < leaf.pixels; ++i) pyb[i] = py[i] + blk * cw * ldy;
    leaf.fn(sums, taps, in_stride, px, w + blk * taps * sums * cw, pyb, ldy, pixels);
  }
}

// Runs `leaf` over tiles of its pixels taken from `total` pixels, for every group: set_pixel(g, q, i, px)
// points px[t * leaf.pixels + i] (t < taps) at pixel q's inputs and returns its output in block 0; the
// blocks of leaf.channels outputs lie channels * ldy apart, their weights (packed [group][block][tap]
// [summed channel][channels]) taps * sums * channels apart. A tail tile repeats its last pixel, unstored.
template <typename SetPixel> void run_oc_tiles(const isa::ConvLeaves::DirectOc& leaf, int64_t groups, int64_t total,
                                               int64_t blocks, int64_t taps, int64_t sums, int64_t in_stride,
                                               int64_t ldy, const float* wp, SetPixel&& set_pixel) {
  const int64_t cw = leaf.channels, kp = leaf.pixels, tiles = (total + kp - 1) / kp;
  KILN_ASSERT(kp >= 1 && kp <= isa::kDirectOcMaxPixels && taps <= kDirectMaxTaps, "output-channel tiles of ", kp,
              " pixels, ", taps, " taps");
  parallel_for(0, tiles * groups, 4, [&](int64_t b, int64_t e) {
    const float* px[kDirectMaxTaps * isa::kDirectOcMaxPixels];
    float* py[isa::kDirectOcMaxPixels];
    for (int64_t task = b; task < e; ++task) {
      const int64_t tile = task / groups, g = task % groups, q0 = tile * kp;
      const int pixels = int(std::min(kp, total - q0));
      for (int64_t i = 0; i < kp; ++i) py[i] = set_pixel(g, q0 + std::min<int64_t>(i, pixels - 1), i, px);
      oc_tile_blocks(leaf, blocks, taps, sums, in_stride, px, wp + g * blocks * taps * sums * cw, py, ldy, pixels);
    }
  });
}

// Any stride and dilation: each (tap, pixel) has its own address. Against the pixel tiles (direct_conv
// applies) it is worth it where those waste over a tenth of their lanes; against the implicit GEMM
// (strided or dilated filters; a stride-1 1x1 or valid-padding filter stays a GEMM) where a tile's sums
// run over at least 64 (tap, channel) terms, so that the transposed store of the tile stays a small part
// of its work. Either way a tile sets up an address per (tap, pixel) and uses it for Cg channels: at
// least 16 of them (ResNet-50's 3-channel stem is not). The offsets are 32-bit.
const isa::ConvLeaves::DirectOc* direct_oc_leaf(const isa::ConvLeaves& L, const Conv2dParams& p) {
  const int64_t ohw = p.oh * p.ow, og = p.o / p.groups, cg = p.c / p.groups;
  const int64_t tiles = (ohw + 63) / 64;
  const bool strided = p.sh > 1 || p.sw > 1 || p.dh > 1 || p.dw > 1;
  if (cg < 16 || (direct_conv_applies(p) ? ohw * 10 > tiles * 64 * 9 : !strided || p.kh * p.kw * cg < 64))
    return nullptr;
  if (p.h * p.w >= (int64_t(1) << 31) || p.kh * p.kw > kDirectMaxTaps) return nullptr;
  return oc_leaf_for(L, og, p.kh * p.kw * cg, true);
}

void direct_conv_oc(const isa::ConvLeaves::DirectOc& leaf, const Conv2dParams& p, const float* x, const float* w,
                    float* y) {
  const int64_t cg = p.c / p.groups, og = p.o / p.groups, taps = p.kh * p.kw, plane = p.h * p.w;
  const int64_t ohw = p.oh * p.ow, cw = leaf.channels, kp = leaf.pixels, oblocks = og / cw;
  // w as [group][o-block][tap][channel][cw].
  float* const wp = t_packed_w.get<float>(size_t(p.o * cg * taps));
  parallel_for(0, p.groups * oblocks, 1, [&](int64_t b, int64_t e) {
    for (int64_t gb = b; gb < e; ++gb) {
      const int64_t g = gb / oblocks, ob = gb % oblocks;
      float* dst = wp + gb * taps * cg * cw;
      for (int64_t t = 0; t < taps; ++t)
        for (int64_t c = 0; c < cg; ++c)
          for (int64_t j = 0; j < cw; ++j) dst[(t * cg + c) * cw + j] = w[((g * og + ob * cw + j) * cg + c) * taps + t];
    }
  });
  // The leaf reads zeros[c * plane], c < cg: only those slots are written (and their pages touched).
  float* const zeros = t_zeros.get<float>(size_t((cg - 1) * plane + 1));
  for (int64_t c = 0; c < cg; ++c) zeros[c * plane] = 0.0f;
  // Per output pixel of a plane and tap: the input offset in the plane, or -1 in the padding.
  std::vector<int32_t> in_at(static_cast<size_t>(ohw * taps));
  for (int64_t l = 0; l < ohw; ++l)
    for (int64_t t = 0; t < taps; ++t) {
      const int64_t ih = l / p.ow * p.sh + t / p.kw * p.dh - p.ph, iw = l % p.ow * p.sw + t % p.kw * p.dw - p.pw;
      in_at[size_t(l * taps + t)] = ih >= 0 && ih < p.h && iw >= 0 && iw < p.w ? int32_t(ih * p.w + iw) : -1;
    }
  run_oc_tiles(leaf, p.groups, p.n * ohw, oblocks, taps, cg, plane, ohw, wp,
               [&](int64_t g, int64_t q, int64_t i, const float** px) {
                 const int64_t n = q / ohw, l = q % ohw;
                 const float* xn = x + (n * p.c + g * cg) * plane;
                 const int32_t* at = in_at.data() + l * taps;
                 for (int64_t t = 0; t < taps; ++t) px[t * kp + i] = at[t] >= 0 ? xn + at[t] : zeros;
                 return y + (n * p.o + g * og) * ohw + l;
               });
}

// The input gradient of a strided convolution on the same tiles: gx[n, c, ih, iw] sums w[o, c, ki, kj] *
// gy[n, o, oh, ow] over the taps with ih = oh * sh - ph + ki * dh (and so for iw). Which taps can reach
// an input pixel depends only on its phase (ih mod sh, iw mod sw): a 3x3 stride-2 filter gives phases of
// 1, 2, 2 and 4 taps, 9/4 on average where the im2col path multiplies all 9. So the pixels go phase by
// phase, each phase with its own packed filter taps, vectors across the input channels and the sums over
// (tap, output channel); a tap whose (oh, ow) falls outside gy reads the zero buffer, and a phase no tap
// reaches (a 1x1 stride-2 filter's odd pixels) is zeroed. A task is one image's group (or a band of its
// rows) and runs every phase over it, so its part of gx, written a phase at a time in strided stores, stays in L2
// (phase-major over the whole batch wrote each line of gx four times from memory: ResNet-20's 16-channel
// 28x28 layer took 3.2 ms on the Intel Xeon, avx2 set).
const isa::ConvLeaves::DirectOc* input_grad_oc_leaf(const isa::ConvLeaves& L, const Conv2dParams& p) {
  const int64_t og = p.o / p.groups, cg = p.c / p.groups;
  if (og < 16 || p.kh * p.kw > kDirectMaxTaps || p.h * p.w >= (int64_t(1) << 31) || p.oh * p.ow >= (int64_t(1) << 31))
    return nullptr;
  return oc_leaf_for(L, cg, p.kh * p.kw * og, false);
}

void input_grad_oc(const isa::ConvLeaves::DirectOc& leaf, const Conv2dParams& p, const float* w, const float* gy,
                   float* gx) {
  const int64_t cg = p.c / p.groups, og = p.o / p.groups, taps = p.kh * p.kw, plane = p.h * p.w;
  const int64_t ohw = p.oh * p.ow, cw = leaf.channels, kp = leaf.pixels, cblocks = cg / cw;
  KILN_ASSERT(kp >= 1 && kp <= isa::kDirectOcMaxPixels && taps <= kDirectMaxTaps, "output-channel tiles of ", kp,
              " pixels, ", taps, " taps");
  float* const zeros = t_zeros.get<float>(size_t((og - 1) * ohw + 1));  // read at o * ohw, o < og
  for (int64_t o = 0; o < og; ++o) zeros[o * ohw] = 0.0f;
  // The phases: pixels ih = a + sh * i, iw = b + sw * j (i < rows, j < cols), the taps that reach them with
  // their weights packed as [group][c-block][phase tap][o][cw] from w_at, and per pixel and tap the offset of
  // its gy pixel in the plane (or -1: outside gy) from at_at, and per pixel its offset in gx's plane.
  struct Phase {
    int64_t a, b, rows, cols, nt;
    size_t w_at, at_at, out_at;
  };
  std::vector<Phase> phases;
  std::vector<int64_t> phase_taps;
  std::vector<int32_t> in_at, out_at;
  size_t wsize = 0;
  for (int64_t a = 0; a < std::min(p.sh, p.h); ++a)
    for (int64_t b = 0; b < std::min(p.sw, p.w); ++b) {
      Phase ph{a, b, (p.h - a + p.sh - 1) / p.sh, (p.w - b + p.sw - 1) / p.sw, 0, wsize, in_at.size(), out_at.size()};
      const size_t first = phase_taps.size();
      for (int64_t t = 0; t < taps; ++t) {
        const int64_t rh = a + p.ph - t / p.kw * p.dh, rw = b + p.pw - t % p.kw * p.dw;
        if (((rh % p.sh) + p.sh) % p.sh == 0 && ((rw % p.sw) + p.sw) % p.sw == 0) phase_taps.push_back(t);
      }
      ph.nt = int64_t(phase_taps.size() - first);
      for (int64_t l = 0; l < ph.rows * ph.cols; ++l) {
        const int64_t ih = a + p.sh * (l / ph.cols), iw = b + p.sw * (l % ph.cols);
        out_at.push_back(int32_t(ih * p.w + iw));
        for (int64_t k = 0; k < ph.nt; ++k) {
          const int64_t t = phase_taps[first + size_t(k)], rh = ih + p.ph - t / p.kw * p.dh;
          const int64_t rw = iw + p.pw - t % p.kw * p.dw, oh = rh / p.sh, ow = rw / p.sw;
          in_at.push_back(rh >= 0 && rw >= 0 && oh < p.oh && ow < p.ow ? int32_t(oh * p.ow + ow) : -1);
        }
      }
      wsize += size_t(p.groups * cblocks * ph.nt * og * cw);
      phases.push_back(ph);
    }
  float* const wp = t_packed_w.get<float>(std::max<size_t>(wsize, 1));
  for (size_t f = 0, first = 0; f < phases.size(); first += size_t(phases[f].nt), ++f) {
    const Phase& ph = phases[f];
    for (int64_t g = 0; g < p.groups; ++g)
      for (int64_t cb = 0; cb < cblocks; ++cb)
        for (int64_t k = 0; k < ph.nt; ++k)
          for (int64_t o = 0; o < og; ++o)
            for (int64_t j = 0; j < cw; ++j)
              wp[ph.w_at + size_t((((g * cblocks + cb) * ph.nt + k) * og + o) * cw + j)] =
                  w[((g * og + o) * cg + cb * cw + j) * taps + phase_taps[first + size_t(k)]];
  }
  // Bands of phase rows: an image's gx of one group in one task up to 256 KiB, and at least 4 tasks a thread.
  constexpr int64_t kBandBytes = 256 << 10;
  const int64_t rmax = (p.h + p.sh - 1) / p.sh, per_image = p.n * p.groups;
  if (per_image == 0) return;
  int64_t bands = std::max<int64_t>((cg * plane * 4 + kBandBytes - 1) / kBandBytes,
                                    (4 * num_threads() + per_image - 1) / per_image);
  bands = std::clamp<int64_t>(bands, 1, rmax);
  const int64_t brows = (rmax + bands - 1) / bands;
  bands = (rmax + brows - 1) / brows;
  // Where gx's planes are a multiple of 2 KiB (32x32: 4 KiB puts the 16 channels of a tile's stores in one L1
  // set), a task's band of gx (input rows sh * i0 .. sh * (i0 + brows), every channel of the group) is summed
  // into a scratch copy first, its channels an odd number of 64-byte lines apart, then copied out: 5.6 ms
  // against 2.9 for ResNet-20's 16-channel 32x32 layer on the Intel Xeon (avx2 set). Else in place (the copy
  // cost the 28x28 layer 0.2 ms).
  const bool via_band = plane % 512 == 0;
  const int64_t band_len = std::min(p.h, p.sh * brows) * p.w, lines = (band_len + 15) / 16;
  const int64_t cstride = via_band ? (lines % 2 == 0 ? lines + 1 : lines) * 16 : plane;
  parallel_for(0, per_image * bands, 1, [&](int64_t b0, int64_t b1) {
    const float* px[kDirectMaxTaps * isa::kDirectOcMaxPixels];
    float* py[isa::kDirectOcMaxPixels];
    float* const band = via_band ? t_grad_band.get<float>(size_t(cg * cstride)) : nullptr;
    for (int64_t task = b0; task < b1; ++task) {
      const int64_t ng = task / bands, n = ng / p.groups, g = ng % p.groups, i0 = task % bands * brows;
      const int64_t first = p.sh * i0 * p.w, len = std::min(p.h, p.sh * (i0 + brows)) * p.w - first;
      const float* gyn = gy + (n * p.o + g * og) * ohw;
      float* const gxn = gx + (n * p.c + g * cg) * plane + first;
      float* const out = via_band ? band : gxn;  // this task's pixels from `first` on, channels cstride apart
      for (const Phase& ph : phases) {
        const int64_t l0 = i0 * ph.cols, l1 = std::min(i0 + brows, ph.rows) * ph.cols;
        if (ph.nt == 0) {  // no tap reaches these pixels: their gradient is 0
          for (int64_t c = 0; c < cg; ++c)
            for (int64_t l = l0; l < l1; ++l) out[c * cstride + out_at[ph.out_at + size_t(l)] - first] = 0.0f;
          continue;
        }
        for (int64_t q0 = l0; q0 < l1; q0 += kp) {
          const int pixels = int(std::min(kp, l1 - q0));
          for (int64_t i = 0; i < kp; ++i) {
            const int64_t l = q0 + std::min<int64_t>(i, pixels - 1);
            const int32_t* at = in_at.data() + ph.at_at + size_t(l * ph.nt);
            for (int64_t k = 0; k < ph.nt; ++k) px[k * kp + i] = at[k] >= 0 ? gyn + at[k] : zeros;
            py[i] = out + (out_at[ph.out_at + size_t(l)] - first);
          }
          oc_tile_blocks(leaf, cblocks, ph.nt, og, ohw, px, wp + ph.w_at + size_t(g * cblocks * ph.nt * og * cw), py,
                         cstride, pixels);
        }
      }
      if (via_band)
        for (int64_t c = 0; c < cg; ++c) std::memcpy(gxn + c * plane, band + c * cstride, size_t(len) * sizeof(float));
    }
  });
}

// The weight gradient of the same convolutions: gw[o, c, t] = sum over images n and output pixels q of
// gy[n, o, q] * x[n, c, q + shift(t)] (masked as above). Both operands are read in place, 16 pixels to a
// vector: a register tile of R output channels x P (c, t) pairs (8 x 3 in both kernel sets, the AVX2 set's
// in passes of 4 or 2 rows) keeps R * P lane-wise sums, fed per pixel vector by R loads
// of gy and P masked loads of x. Images go in fixed chunks of S (S * OH * OW ~ 4096, fewer where their x
// and gy would outgrow 256 KiB: a chunk stays in L2, and each tile's lanes are folded once per chunk, not
// per image); each task (chunk, R channels, P pairs) folds its
// lanes into one partial per weight, and the chunks' partials are added in chunk order: no result depends
// on threads.
//
// A strided filter reads x through its phases: phase (a, b) of a channel is the plane x[i sh + a, j sw + b],
// stored as an OH x OW plane (zeros past its edge), so that tap (ki, kj) reads phase ((ki - ph) mod sh,
// (kj - pw) mod sw) at a fixed shift of the output pixel, (floor((ki - ph) / sh), floor((kj - pw) / sw)), and
// the scheme above runs unchanged over C * sh * sw phase planes (direct_wgrad_applies says when). The
// split is one copy of x (t_phase_x, kept for the thread's life like the buffers above). ResNet-20 at batch
// 128 against im2col + GEMM, alternated: 28x28 -> 14x14, 4.9 -> 2.8 ms (AVX-512) and 4.9 -> 3.7 ms (AVX2);
// 32x32 -> 16x16, 6.1 -> 3.5 and 6.1 -> 4.4; 16x16 -> 8x8, 3.4 -> 2.5 and level (3.1 by GEMM, 3.3 by phases).
thread_local ScratchBuffer t_phase_x;

// Where the phase planes hold every input pixel a tap reaches: ceil((H - a) / sh) <= OH for each a, the
// same across.
bool phases_fit(const Conv2dParams& p) {
  for (int64_t a = 0; a < p.sh; ++a)
    if ((p.h - a + p.sh - 1) / p.sh > p.oh) return false;
  for (int64_t b = 0; b < p.sw; ++b)
    if ((p.w - b + p.sw - 1) / p.sw > p.ow) return false;
  return true;
}
// Strided: only where the output plane fills its 16-pixel vectors (14x14, not 7x7). On 7x7 outputs the
// phase planes would also need packing, and there im2col + GEMM measured faster under AVX2 (ResNet-20's
// 14x14 -> 7x7 layer: 2.5 ms against 3.2) and level under AVX-512.
// The phase copy is capped as the im2col buffer is (kMaxColElems, 32 MiB; ResNet-50's 56 -> 28 layer at
// batch 256 would need 411 MB): above it, im2col + GEMM.
// A chunk of images holds about 4096 output pixels, with its x (or its phase planes) and gy within
// kWgradChunkBytes as long as it still spans kWgradMinPixels (see direct_conv_wgrad). Stride-1 planes that
// leave over a tenth of their vectors idle (7x7) are packed across a chunk's images; where even
// kWgradMinPixels of them outgrow twice that budget (ResNet-50's 512-channel 7x7 layer at 512 pixels: 2 MiB)
// im2col + GEMM is faster: 11 ms against 17 under avx2, 7-11 against 13 under avx512 on the Intel Xeon.
constexpr int64_t kWgradChunkBytes = 256 << 10, kWgradMinPixels = 512;
bool wastes_vectors(int64_t ohw) { return (ohw + 15) / 16 * 16 * 9 > ohw * 10; }
bool direct_wgrad_applies(const Conv2dParams& p) {
  const int64_t taps = p.kh * p.kw, ohw = p.oh * p.ow;
  if (direct_conv_applies(p)) return !wastes_vectors(ohw) || kWgradMinPixels * 4 * (p.c + p.o) <= 2 * kWgradChunkBytes;
  return p.dh == 1 && p.dw == 1 && (p.sh > 1 || p.sw > 1) && p.sh <= 4 && p.sw <= 4 && taps > 1 &&
         taps <= kDirectMaxTaps && !wastes_vectors(ohw) && phases_fit(p) &&
         p.n * p.c * p.sh * p.sw * ohw <= kMaxColElems;
}

void direct_conv_wgrad(const isa::ConvLeaves& L, const Conv2dParams& p, const float* x_in, const float* gy, float* gw) {
  const int64_t cg = p.c / p.groups, og = p.o / p.groups, taps = p.kh * p.kw;
  const int64_t ohw = p.oh * p.ow, cols = cg * taps, wsize = p.o * cols;
  // The x planes the taps read: x itself (stride 1), or its phases (strided); per tap its plane among a
  // channel's phases, its shift (rows, columns) and the extent of that plane that holds pixels.
  const int64_t phases = p.sh * p.sw, xc = p.c * phases, xh = phases > 1 ? p.oh : p.h, xw = phases > 1 ? p.ow : p.w;
  const int64_t plane = xh * xw;
  const size_t nt = static_cast<size_t>(taps);
  std::vector<int64_t> tap_phase(nt), tap_di(nt), tap_dj(nt), tap_rows(nt), tap_cols(nt);
  auto floor_div = [](int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); };
  for (int64_t t = 0; t < taps; ++t) {
    const int64_t u = t / p.kw - p.ph, v = t % p.kw - p.pw;
    const int64_t di = floor_div(u, p.sh), dj = floor_div(v, p.sw), a = u - di * p.sh, b = v - dj * p.sw;
    tap_phase[size_t(t)] = a * p.sw + b;
    tap_di[size_t(t)] = di;
    tap_dj[size_t(t)] = dj;
    tap_rows[size_t(t)] = (p.h - a + p.sh - 1) / p.sh;
    tap_cols[size_t(t)] = (p.w - b + p.sw - 1) / p.sw;
  }
  auto shift_of = [&](int64_t t) { return tap_di[size_t(t)] * xw + tap_dj[size_t(t)]; };
  const float* x = x_in;
  if (phases > 1) {
    float* xp = t_phase_x.get<float>(size_t(p.n * xc * plane));
    // Row by row, each row's in-range columns as a plain strided copy (a bounds test per element had kept
    // it scalar: 29% of ResNet-20's strided weight gradient under avx512), then zeros past the edge.
    parallel_for(0, p.n * xc, 4, [&](int64_t b0, int64_t b1) {
      for (int64_t r = b0; r < b1; ++r) {
        const int64_t nc = r / phases, ph = r % phases, a = ph / p.sw, b = ph % p.sw;
        const float* src = x_in + nc * p.h * p.w;
        float* dst = xp + r * plane;
        const int64_t cols = std::clamp<int64_t>((p.w - b + p.sw - 1) / p.sw, 0, xw), sw = p.sw;  // j * sw + b < W
        for (int64_t i = 0; i < xh; ++i, dst += xw) {
          const int64_t ih = i * p.sh + a;
          if (ih >= p.h) {
            std::fill(dst, dst + xw, 0.0f);
            continue;
          }
          const float* row = src + ih * p.w + b;
          for (int64_t j = 0; j < cols; ++j) dst[j] = row[j * sw];
          std::fill(dst + cols, dst + xw, 0.0f);
        }
      }
    });
    x = xp;
  }
  // S * OH * OW ~ 4096, with a chunk's x (or its phase planes) and gy within kWgradChunkBytes as long as it
  // still spans kWgradMinPixels, but at most kMaxWgradChunks chunks: their partials take chunks x |w| floats. Without
  // the byte cap a 7x7 chunk was 83 images (2 MiB), and on the Intel Xeon under avx2 the 7x7 layer took 4.6
  // ms against 3.3, the 14x14 one 3.9 against 3.6, the strided 28x28 -> 14x14 one (x as 64 phase planes)
  // 3.1 against 2.6 (the 28x28 layer's 5 images, 490 KiB, to 2: level); avx512 level or a little ahead.
  // Without the floor, ResNet-50's 512-channel 7x7 layer went image by image, each task a 49-pixel sliver
  // (5x slower).
  constexpr int64_t kMaxWgradChunks = 128;
  const int64_t ohw1 = std::max<int64_t>(ohw, 1);
  int64_t s = 4 * kTargetCols / ohw1;
  s = std::min(s, std::max(kWgradChunkBytes / (4 * ohw1 * (xc + p.o)), (kWgradMinPixels + ohw1 - 1) / ohw1));
  s = std::max(s, (p.n + kMaxWgradChunks - 1) / kMaxWgradChunks);
  s = std::clamp<int64_t>(s, 1, std::max<int64_t>(p.n, 1));
  const int R = L.wgrad_rows, P = L.wgrad_pairs;
  KILN_ASSERT(R >= 1 && R <= isa::kWgradMaxRows && P >= 1 && P <= isa::kWgradMaxPairs, "wgrad tile ", R, "x", P);
  const int64_t nchunks = (p.n + s - 1) / s, oblocks = (og + R - 1) / R, jblocks = (cols + P - 1) / P;
  // Planes that end early in a 16-pixel vector (7x7: 49 pixels in 4 vectors) waste the rest of it in every
  // image. With "same" padding (the output plane is the input's) a chunk's images are packed instead,
  // each channel's planes end to end with zero margins, and the tiles run over the chunk as one tall
  // image whose taps are masked at the images' edges as at the plane's: every lane of a vector works.
  // Packing costs a copy of x and gy: worth it where over a tenth of the lanes would idle (7x7: 15 of 64;
  // not 14x14: 12 of 208).
  const bool packed = wastes_vectors(ohw) && s > 1 && p.oh == xh && p.ow == xw;
  const int64_t span = packed ? s * ohw : ohw, vecs = (span + 15) / 16, row = 16 * vecs;
  int64_t reach = 0;  // the largest |shift| of a tap
  for (int64_t t = 0; t < taps; ++t) reach = std::max(reach, std::abs(shift_of(t)));
  const int64_t margin = packed ? (reach + 15) / 16 * 16 : 0, xrow = row + 2 * margin;
  float* const gyp = packed ? t_packed_gy.get<float>(size_t(nchunks * p.o * row)) : nullptr;
  float* const xp = packed ? t_packed_x.get<float>(size_t(nchunks * xc * xrow)) : nullptr;
  if (packed) {
    parallel_for(0, nchunks * (p.o + xc), 8, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        const int64_t chunk = r / (p.o + xc), ch = r % (p.o + xc), n0 = chunk * s;
        const int64_t images = std::min(p.n, n0 + s) - n0;
        const bool is_gy = ch < p.o;
        const int64_t chans = is_gy ? p.o : xc, c = is_gy ? ch : ch - p.o, lead = is_gy ? 0 : margin;
        float* dst = is_gy ? gyp + (chunk * p.o + c) * row : xp + (chunk * xc + c) * xrow;
        const float* src = is_gy ? gy : x;
        std::fill(dst, dst + lead, 0.0f);
        for (int64_t si = 0; si < images; ++si)
          std::memcpy(dst + lead + si * ohw, src + ((n0 + si) * chans + c) * ohw, size_t(ohw) * sizeof(float));
        std::fill(dst + lead + images * ohw, dst + (is_gy ? row : xrow), 0.0f);
      }
    });
  }
  // The masks per tap along the vectors, tap_masks[t * vecs + v], and plane_mask[v]: lane l of vector v
  // is position q = 16 v + l of the plane (or the chunk's tall image).
  std::vector<isa::Mask16> tap_masks(static_cast<size_t>(taps * vecs)), plane_mask(static_cast<size_t>(vecs));
  for (int64_t v = 0; v < vecs; ++v)
    for (int l = 0; l < 16; ++l) {
      const int64_t q = 16 * v + l, local = q % ohw, oh = local / p.ow, ow = local % p.ow;
      if (q >= span) continue;
      plane_mask[size_t(v)] |= isa::Mask16(1u << l);
      for (int64_t t = 0; t < taps; ++t) {
        const int64_t ih = oh + tap_di[size_t(t)], iw = ow + tap_dj[size_t(t)];
        if (ih >= 0 && ih < tap_rows[size_t(t)] && iw >= 0 && iw < tap_cols[size_t(t)])
          tap_masks[size_t(t * vecs + v)] |= isa::Mask16(1u << l);
      }
    }
  // In the kernel set's own format (AVX-512: as they are; AVX2: lane vectors).
  const size_t mb = size_t(L.mask_bytes);
  std::unique_ptr<unsigned char[]> tap_x(new unsigned char[tap_masks.size() * mb]),
      plane_x(new unsigned char[plane_mask.size() * mb]);
  L.expand_masks(tap_masks.data(), int64_t(tap_masks.size()), tap_x.get());
  L.expand_masks(plane_mask.data(), int64_t(plane_mask.size()), plane_x.get());
  // Pair jj = (c, t) of a group: its tap and its offset in x (or the packed x) from the group's first channel:
  // the plane of channel c's phase that tap t reads, shifted.
  const int64_t cstride = packed ? xrow : plane;
  std::vector<int64_t> pair_tap(static_cast<size_t>(cols)), pair_off(static_cast<size_t>(cols));
  for (int64_t jj = 0; jj < cols; ++jj) {
    const int64_t t = jj % taps;
    pair_tap[size_t(jj)] = t;
    pair_off[size_t(jj)] = (jj / taps * phases + tap_phase[size_t(t)]) * cstride + margin + shift_of(t);
  }
  // Each chunk's operands: gy rows of ohw (or row) floats, images of x (or a packed chunk with margins).
  const float* gy_base = packed ? gyp : gy;
  const float* x_base = packed ? xp : x;
  const int64_t gy_chunk = packed ? p.o * row : s * p.o * ohw, gy_image = packed ? 0 : p.o * ohw;
  const int64_t x_chunk = packed ? xc * xrow : s * xc * plane, x_image = packed ? 0 : xc * plane;
  const int64_t x_size = packed ? nchunks * xc * xrow : p.n * xc * plane, gy_row = packed ? row : ohw;
  // Every partial is written before it is read: no zeroing.
  std::unique_ptr<float[]> partial(new float[size_t(nchunks * wsize)]);
  const int64_t per_chunk = p.groups * oblocks * jblocks;
  parallel_for(0, nchunks * per_chunk, 8, [&](int64_t b, int64_t e) {
    for (int64_t task = b; task < e; ++task) {
      const int64_t chunk = task / per_chunk, rest = task % per_chunk, g = rest / (oblocks * jblocks);
      const int64_t o0 = (rest / jblocks) % oblocks * R, j0 = rest % jblocks * P;
      const int64_t rows = std::min<int64_t>(R, og - o0), ncol = std::min<int64_t>(P, cols - j0);
      // Rows and pairs past the edge repeat the first: computed, never stored.
      int64_t orow[isa::kWgradMaxRows], xoff[isa::kWgradMaxPairs], tap[isa::kWgradMaxPairs];
      for (int r = 0; r < R; ++r) orow[r] = g * og + o0 + (r < rows ? r : 0);
      for (int j = 0; j < P; ++j) {
        const size_t jj = size_t(j0 + (j < ncol ? j : 0));
        tap[j] = pair_tap[jj];
        xoff[j] = g * cg * phases * cstride + pair_off[jj];
      }
      float sums[isa::kWgradMaxRows * isa::kWgradMaxPairs];
      const void* xmask[isa::kWgradMaxPairs];
      for (int j = 0; j < P; ++j) xmask[j] = tap_x.get() + size_t(tap[j] * vecs) * mb;
      // Whether every x address read, masked lanes included, lies inside x (always, packed: the margins).
      const int64_t images = packed ? 1 : std::min(p.n, chunk * s + s) - chunk * s, x0 = chunk * x_chunk;
      const int64_t lo = x0 + *std::min_element(xoff, xoff + P);
      const int64_t hi = x0 + (images - 1) * x_image + *std::max_element(xoff, xoff + P) + 16 * vecs;
      L.wgrad_tile(gy_base + chunk * gy_chunk, gy_image, x_base + x0, x_image, images, vecs, gy_row, orow, xoff, xmask,
                   plane_x.get(), sums, lo >= 0 && hi <= x_size);
      float* out = partial.get() + chunk * wsize;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < ncol; ++j) out[orow[r] * cols + j0 + j] = sums[r * P + j];
    }
  });
  parallel_for(0, wsize, 4096, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      float acc = 0;
      for (int64_t c = 0; c < nchunks; ++c) acc += partial[size_t(c * wsize + i)];
      gw[i] = acc;
    }
  });
}

template <typename T>
void gemm_t(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b,
            int64_t ldb, T beta, T* c, int64_t ldc) {
  if constexpr (std::is_same_v<T, float>) {
    gemm_f32(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  } else {
    gemm_f64(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
}

// Runs fn(chunk) for every chunk: spread over threads when there are enough chunks, otherwise in
// order on this thread so the GEMMs inside use the pool.
template <typename Fn> void for_chunks(const Geometry& G, Fn&& fn) {
  if (G.nchunks >= 2 * num_threads()) {
    parallel_for(0, G.nchunks, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) fn(i);
    });
  } else {
    for (int64_t i = 0; i < G.nchunks; ++i) fn(i);
  }
}

// The convolution leaves when T takes the hand-written paths (f32 under the AVX-512 and AVX2 sets), or null.
template <typename T> const isa::ConvLeaves* implicit_leaves() {
  if constexpr (std::is_same_v<T, float>) return gemm_has_packed_b() ? conv_leaves() : nullptr;
  return nullptr;
}

template <typename T> void forward_typed(const Conv2dParams& p, const T* x, const T* w, const T* bias, T* y) {
  const Geometry G(p);
  const isa::ConvLeaves* leaves = implicit_leaves<T>();
  const bool implicit = leaves != nullptr;
  if constexpr (std::is_same_v<T, float>) {
    const isa::ConvLeaves::DirectOc* oc = leaves ? direct_oc_leaf(*leaves, p) : nullptr;
    if (oc || (leaves && direct_conv_applies(p))) {
      if (oc)
        direct_conv_oc(*oc, p, x, w, y);
      else
        direct_conv(*leaves, p, x, w, y);
      if (bias)
        parallel_for(0, p.n * p.o, 4, [&](int64_t b0, int64_t b1) {
          for (int64_t t = b0; t < b1; ++t) {
            float* dst = y + t * G.ohw;
            for (int64_t i = 0; i < G.ohw; ++i) dst[i] += bias[t % p.o];
          }
        });
      return;
    }
  }
  for_chunks(G, [&](int64_t chunk) {
    const int64_t n0 = chunk * G.s, ns = std::min(G.s, p.n - n0), cols = ns * G.ohw;
    // One image: the GEMM writes y's [Og, OH*OW] block in place; several: a [Og, cols] scratch first.
    T* tmp = ns == 1 ? nullptr : t_out.get<T>(size_t(G.og * cols));
    T* col = implicit ? nullptr : t_col.get<T>(size_t(G.ckk * cols));
    for (int64_t g = 0; g < p.groups; ++g) {
      T* c = tmp ? tmp : y + (n0 * p.o + g * G.og) * G.ohw;
      const T* wg = w + g * G.og * G.ckk;
      if constexpr (std::is_same_v<T, float>) {
        if (implicit) {
          const ImplicitCol ctx{&G, x, n0, g};
          const PackedB packed{pack_im2col, &ctx};
          gemm_f32_packed_b(false, G.og, cols, G.ckk, 1.0f, wg, G.ckk, packed, 0.0f, c, cols);
        }
      }
      if (!implicit) {
        im2col(G, x, n0, ns, g, col);
        gemm_t<T>(false, false, G.og, cols, G.ckk, T(1), wg, G.ckk, col, cols, T(0), c, cols);
      }
      if (!tmp && !bias) continue;
      parallel_for(0, ns * G.og, 4, [&](int64_t b0, int64_t b1) {
        for (int64_t t = b0; t < b1; ++t) {
          const int64_t si = t / G.og, o = t % G.og;
          const T b = bias ? bias[g * G.og + o] : T(0);
          const T* src = c + o * cols + si * G.ohw;
          T* dst = y + ((n0 + si) * p.o + g * G.og + o) * G.ohw;
          for (int64_t i = 0; i < G.ohw; ++i) dst[i] = src[i] + b;
        }
      });
    }
  });
}

// The input gradient of a stride-1, dilation-1 convolution as a forward convolution of gy: filters
// w'[g*Cg + c, o, ki, kj] = w[g*Og + o, c, KH-1-ki, KW-1-kj], padding K-1-P (negative when P >= K).
template <typename T> void input_grad_as_conv(const Conv2dParams& p, const T* w, const T* gy, T* gx) {
  const int64_t cg = p.c / p.groups, og = p.o / p.groups, kk = p.kh * p.kw;
  // A transpose of [Og, Cg] per group: by 16 x 16 blocks, so that reads and writes each stay on 16 lines (row by
  // row, ResNet-50's 1x1 layers wrote every float to its own line: 0.6 ms of a 4.5 ms input gradient).
  std::vector<T> wf(size_t(p.c * og * kk));
  constexpr int64_t kB = 16;
  const int64_t oblocks = (og + kB - 1) / kB, cblocks = (cg + kB - 1) / kB;
  parallel_for(0, p.groups * oblocks * cblocks, 4, [&](int64_t b, int64_t e) {
    for (int64_t blk = b; blk < e; ++blk) {
      const int64_t g = blk / (oblocks * cblocks), o0 = blk / cblocks % oblocks * kB, c0 = blk % cblocks * kB;
      for (int64_t c = c0; c < std::min(cg, c0 + kB); ++c)
        for (int64_t o = o0; o < std::min(og, o0 + kB); ++o)
          for (int64_t t = 0; t < kk; ++t)
            wf[size_t(((g * cg + c) * og + o) * kk + t)] = w[((g * og + o) * cg + c) * kk + (kk - 1 - t)];
    }
  });
  Conv2dParams q = p;
  q.c = p.o;
  q.h = p.oh;
  q.w = p.ow;
  q.o = p.c;
  q.ph = p.kh - 1 - p.ph;
  q.pw = p.kw - 1 - p.pw;
  q.oh = p.h;
  q.ow = p.w;
  forward_typed(q, gy, wf.data(), static_cast<const T*>(nullptr), gx);
}

template <typename T>
void backward_typed(const Conv2dParams& p, const T* x, const T* w, const T* gy, T* gx, T* gw) {
  const Geometry G(p);
  const isa::ConvLeaves* leaves = implicit_leaves<T>();
  const bool gx_as_conv = gx && leaves && p.sh == 1 && p.sw == 1 && p.dh == 1 && p.dw == 1;
  if (gx_as_conv) {
    input_grad_as_conv(p, w, gy, gx);
    gx = nullptr;
  }
  if constexpr (std::is_same_v<T, float>) {
    if (gx && leaves)
      if (const auto* oc = input_grad_oc_leaf(*leaves, p)) {
        input_grad_oc(*oc, p, w, gy, gx);
        gx = nullptr;
      }
    if (gw && leaves && direct_wgrad_applies(p)) {
      direct_conv_wgrad(*leaves, p, x, gy, gw);
      gw = nullptr;
    }
  }
  if (!gx && !gw) return;
  const int64_t wsize = p.o * G.ckk;
  // Every chunk writes its own slice in full (beta = 0), so this needs no zeroing.
  std::unique_ptr<T[]> partial(gw ? new T[size_t(G.nchunks * wsize)] : nullptr);
  if (gx)
    parallel_for(0, p.n * p.c * p.h * p.w, 1 << 16, [&](int64_t b, int64_t e) { std::fill(gx + b, gx + e, T(0)); });
  for_chunks(G, [&](int64_t chunk) {
    const int64_t n0 = chunk * G.s, ns = std::min(G.s, p.n - n0), cols = ns * G.ohw;
    T* col = t_col.get<T>(size_t(G.ckk * cols));
    T* gyc = ns == 1 ? nullptr : t_out.get<T>(size_t(G.og * cols));
    for (int64_t g = 0; g < p.groups; ++g) {
      // This group's output gradient as [Og, ns * OH * OW]: in place for one image, else gathered.
      const T* gyg = gy + (n0 * p.o + g * G.og) * G.ohw;
      if (gyc) {
        parallel_for(0, ns * G.og, 4, [&](int64_t b0, int64_t b1) {
          for (int64_t t = b0; t < b1; ++t) {
            const int64_t si = t / G.og, o = t % G.og;
            std::memcpy(gyc + o * cols + si * G.ohw, gy + ((n0 + si) * p.o + g * G.og + o) * G.ohw,
                        size_t(G.ohw) * sizeof(T));
          }
        });
        gyg = gyc;
      }
      if (gw) {
        im2col(G, x, n0, ns, g, col);
        gemm_t<T>(false, true, G.og, G.ckk, cols, T(1), gyg, cols, col, cols, T(0),
                  partial.get() + chunk * wsize + g * G.og * G.ckk, G.ckk);
      }
      if (gx) {
        gemm_t<T>(true, false, G.ckk, cols, G.og, T(1), w + g * G.og * G.ckk, G.ckk, gyg, cols, T(0), col, cols);
        col2im(G, col, n0, ns, g, gx);
      }
    }
  });
  if (gw) {
    parallel_for(0, wsize, 4096, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        T acc = 0;
        for (int64_t c = 0; c < G.nchunks; ++c) acc += partial[size_t(c * wsize + i)];
        gw[i] = acc;
      }
    });
  }
}

}  // namespace

void conv2d_forward(DType dt, const Conv2dParams& p, const void* x, const void* w, const void* bias, void* y) {
  KILN_CHECK(!p.nhwc, "conv2d: the CPU kernels take NCHW buffers (the engine converts channels_last)");
  if (dt == DType::f32) {
    forward_typed(p, static_cast<const float*>(x), static_cast<const float*>(w), static_cast<const float*>(bias),
                  static_cast<float*>(y));
  } else if (dt == DType::f64) {
    forward_typed(p, static_cast<const double*>(x), static_cast<const double*>(w), static_cast<const double*>(bias),
                  static_cast<double*>(y));
  } else {
    KILN_FAIL("conv2d: the CPU computes f32 and f64, got ", dt);
  }
}

void conv2d_backward(DType dt, const Conv2dParams& p, const void* x, const void* w, const void* gy, void* gx, void* gw) {
  KILN_CHECK(!p.nhwc, "conv2d backward: the CPU kernels take NCHW buffers (the engine converts channels_last)");
  if (dt == DType::f32) {
    backward_typed(p, static_cast<const float*>(x), static_cast<const float*>(w), static_cast<const float*>(gy),
                   static_cast<float*>(gx), static_cast<float*>(gw));
  } else if (dt == DType::f64) {
    backward_typed(p, static_cast<const double*>(x), static_cast<const double*>(w), static_cast<const double*>(gy),
                   static_cast<double*>(gx), static_cast<double*>(gw));
  } else {
    KILN_FAIL("conv2d backward: the CPU computes f32 and f64, got ", dt);
  }
}

}  // namespace kiln::cpu
