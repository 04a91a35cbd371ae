// The leaf kernels of one CPU instruction set: what kernels/cpu/isa/<set>.cpp compiles with that
// set's flags and exports as a table of function pointers. Only plain data and function pointer
// types here (no default member initialisers either: they make constructors): a header compiled
// under several -m flags must define no function, or the linker could keep an AVX-512 copy for
// every caller (tests/isa_objects.cmake checks the objects for that). Tables are value-initialised.
//
// The drivers around them (blocking, threads, masks) stay in baseline code: kernels/cpu/gemm.cpp
// and conv.cpp.
#pragma once
#include <cstdint>

#include "kernels/common/optim_consts.h"

namespace kiln::cpu::isa {

inline constexpr int kGemmMR = 6;  // rows of a GEMM register tile, every set

// GEMM leaves for T (float or double), the Goto/BLIS scheme of gemm.cpp: B packed into panels of
// kc x NR (NR = w * nv: row q of a panel holds its NR values, a narrow last panel only as many
// vectors as it needs, zeros past the edge), A read in place (6 row pointers) or packed (kc x 6).
template <typename T> struct GemmLeaves {
  int w;           // lanes of one vector
  int nv;          // vectors of a full panel
  int64_t kc, nc;  // the largest K and N blocks (nc a multiple of NR)
  // micro[a_packed][v - 1]: C[0:rows, 0:cols] = alpha * A'B' + beta * C for a 6 x (v vectors) tile,
  // beta == 0 never reads C. a_row: 6 row pointers (rows of A in place, element q at [q]) or, packed,
  // 6 pointers into one kc x 6 panel (element q at [6 q]).
  using Micro = void (*)(int64_t kc, const T* const* a_row, const T* pb, T* c, int64_t ldc, int64_t rows, int64_t cols,
                         T alpha, T beta);
  Micro micro[2][4];
  // B[pc:pc+kc, j0:j0+nc] into panels (B stored k x n, or n x k when trans_b).
  void (*pack_b)(bool trans_b, const T* b, int64_t ldb, int64_t pc, int64_t kc, int64_t j0, int64_t nc, T* dst);
  // A[i0:i0+rows, pc:pc+kc] of a transposed A (stored k x m) into one kc x 6 panel, zeros past rows.
  void (*pack_a_trans)(const T* a, int64_t lda, int64_t i0, int64_t rows, int64_t pc, int64_t kc, T* dst);
};

// The implicit-GEMM convolution's packer (conv.cpp): one run is a stretch of output pixels within one
// output row, `len` long, starting at panel column `col`.
struct Im2colRun {
  int64_t col;    // first panel column
  int64_t image;  // offset of (image, group's channel 0) in x
  int64_t ih0;    // input row for ki = 0
  int64_t iw0;    // input column of the run's first element for kj = 0
  int64_t len;
};
struct Im2colGeometry {
  const float* x;
  int64_t plane, h, w, kh, kw, dh, dw, sw;
};

// The direct convolution (conv.cpp): 64-pixel tiles as 4 groups of 16 pixels, lanes masked by 16-bit
// masks (bit l: pixel l of the group). The weight gradient takes its masks in the set's own format
// (expand_masks), one entry of mask_bytes per 16 pixels.
using Mask16 = uint16_t;
inline constexpr int kDirectMaxTaps = 64;
inline constexpr int kWgradMaxRows = 8, kWgradMaxPairs = 4;
inline constexpr int kDirectOcMaxPixels = 12;

// See conv.cpp for the schemes. Null in the generic set.
struct ConvLeaves {
  int mask_bytes;
  void (*expand_masks)(const Mask16* in, int64_t n, void* out);
  // Rows q of one panel: for each row (c, ki, kj) stepped from row pc, every run's stretch of input
  // row (or zeros in the padding), then zeros from `cols` up to `stride`.
  void (*pack_im2col_panel)(const Im2colGeometry& g, const Im2colRun* runs, int nruns, int64_t pc, int64_t kc,
                            int64_t cols, int64_t stride, float* dst);
  // direct[rows - 1]: y[r, 0:64] (store-masked) = sum over c < cg and taps t of w[r * wstride + c * taps + t] *
  // x[c * plane + shift[t] + lane] (load-masked by masks[t][vector]), for rows = 1..6 output channels.
  // inside: every x[c * plane + shift[t] + l], l < 64, lies in x's buffer, so a set may load whole
  // vectors and clear the masked lanes instead of using masked loads.
  using Direct = void (*)(const float* x, int64_t plane, int64_t cg, const float* w, int64_t wstride, int64_t taps,
                          const int64_t* shift, const Mask16 (*masks)[4], float* y, int64_t ldy, const Mask16* store,
                          bool inside);
  Direct direct[6];
  // The direct convolution with vectors across output channels (conv.cpp's direct_conv_oc), for planes
  // too small to fill 64-pixel tiles: y for `pixels` (<= leaf.pixels) output pixels and leaf.channels
  // output channels: y[i][j * ldy] = sum over taps t and channels c < cg of w[(t * cg + c) * channels + j]
  // * px[t * leaf.pixels + i][c * plane], px holding each (tap, pixel)'s input address (a zero buffer of
  // cg * plane floats where the tap falls in the padding). Sums run over (t, c) in order.
  struct DirectOc {
    int channels = 0, pixels = 0;  // 0: none
    void (*fn)(int64_t cg, int64_t taps, int64_t plane, const float* const* px, const float* w, float* const* y,
               int64_t ldy, int pixels) = nullptr;
    bool input_grad_only = false;  // for the strided input gradient only (conv.cpp's input_grad_oc)
  };
  DirectOc direct_oc[3];  // the widest first
  // wgrad_rows x wgrad_pairs sums (sums[r * wgrad_pairs + j]) over images and 16-pixel groups of gy row
  // orow[r] times x pair j (see conv.cpp's direct_conv_wgrad); xmask[j] and plane_mask: `vecs` expanded
  // masks each. inside: as for direct, every x[n * x_image + xoff[j] + l], l < 16 * vecs, lies in x's buffer.
  int wgrad_rows, wgrad_pairs;  // at most kWgradMaxRows and kWgradMaxPairs
  void (*wgrad_tile)(const float* gy, int64_t gy_image, const float* x, int64_t x_image, int64_t images, int64_t vecs,
                     int64_t ohw, const int64_t* orow, const int64_t* xoff, const void* const* xmask,
                     const void* plane_mask, float* sums, bool inside);
};

// f32 rows of the nn ops (kernels/cpu/isa/rows.inc) and the 16-bit conversions, in every set, the
// generic one included.
struct RowLeaves {
  float (*max)(int64_t n, const float* x);
  // y = softmax(x) or log_softmax(x) of one contiguous row; x may be y.
  void (*softmax)(bool log, int64_t n, const float* x, float* y);
  // The input gradient of one row from y and the output gradient g (softmax: times scale).
  void (*softmax_bwd)(bool log, int64_t n, const float* y, const float* g, float scale, float* o);
  // The fused cross-entropy of one row (cross_entropy.cpp): its loss and, with g, its gradient.
  void (*cross_entropy)(int64_t classes, const float* x, int64_t target, double eps, float* loss, float* g,
                        double grad_scale);
  // Batch norm on one (image, channel) plane of n values (batch_norm.cpp): add the plane's sum of x and
  // of (x - m)^2 (either may be null); y = x * sc + sh, plus r where non-null, then ReLU with relu;
  // o = y <= 0 ? 0 : g (ReLU's gradient); add the sums of g and g * (x - m); and
  // o = k1 * g' + k2 * x + k3 (k1 * g' where x is null: eval mode) with g' = g, or y <= 0 ? 0 : g
  // where y is non-null.
  void (*bn_stats)(int64_t n, const float* x, float m, double* sum, double* sq);
  void (*bn_affine)(int64_t n, const float* x, float sc, float sh, const float* r, bool relu, float* y);
  void (*relu_mask)(int64_t n, const float* g, const float* y, float* o);
  void (*bn_grad_sums)(int64_t n, const float* g, const float* x, float m, double* sg, double* sgd);
  void (*bn_grad_apply)(int64_t n, const float* g, const float* y, const float* x, float k1, float k2, float k3,
                        float* o);
  // GELU (erf form) of a contiguous row, y may be x; its backward o = g * gelu'(x). erfc to about 1e-6
  // relative in f32 (rows.inc's verfc), where libm's erfcf is a scalar call per element.
  void (*gelu_erf)(int64_t n, const float* x, float* y);
  void (*gelu_erf_backward)(int64_t n, const float* g, const float* x, float* o);
  // Contiguous conversions with the bits of base/half.h's (kernels/cpu/isa/convert.inc).
  void (*f16_to_f32)(const uint16_t* in, float* out, int64_t n);
  void (*f32_to_f16)(const float* in, uint16_t* out, int64_t n);
  void (*bf16_to_f32)(const uint16_t* in, float* out, int64_t n);
  void (*f32_to_bf16)(const float* in, uint16_t* out, int64_t n);
  // The plain loops (kernels/cpu/isa/loops.inc): o = a op b and y = relu(x) over contiguous f32 rows (o may
  // be a or b); acc[j] += src[i * ld + j] over rows i in order (f64 column sums); layer norm of one row and
  // its input gradient, and the f64 sums of its parameter gradients over columns [b, e); the fused
  // optimizer steps over n elements (kernels/common/optim_math.h's arithmetic, the same bits in every set).
  void (*add)(int64_t n, const float* a, const float* b, float* o);
  void (*sub)(int64_t n, const float* a, const float* b, float* o);
  void (*mul)(int64_t n, const float* a, const float* b, float* o);
  void (*div)(int64_t n, const float* a, const float* b, float* o);
  void (*relu)(int64_t n, const float* x, float* y);
  void (*col_sums)(int64_t rows, int64_t cols, int64_t ld, const float* src, double* acc);
  void (*layer_norm)(int64_t d, double eps, const float* x, const float* gamma, const float* beta, float* y,
                     float* mean, float* rstd);
  void (*layer_norm_bwd)(int64_t d, const float* x, const float* gamma, float mean, float rstd, const float* gy,
                         float* gx);
  void (*layer_norm_param_sums)(int64_t rows, int64_t d, int64_t b, int64_t e, const float* x, const float* mean,
                                const float* rstd, const float* gy, double* sg, double* sb);
  void (*sgd)(int64_t n, float* w, const float* g, float* buf, bool fresh, const optim_math::SgdF& h);
  void (*adamw)(int64_t n, float* w, const float* g, float* m, float* v, const optim_math::AdamF& a);
  // LAMB: the moments, then *wsq = sum w^2 and *usq = sum u^2 (u its direction) in order in f64; the update.
  void (*lamb_moments)(int64_t n, const float* w, const float* g, float* m, float* v, const optim_math::AdamF& a,
                       double* wsq, double* usq);
  void (*lamb_apply)(int64_t n, float step, float* w, const float* m, const float* v, const optim_math::AdamF& a);
  // n f32 draws of Kiln's Philox stream from block `first` on (element i: lane i % 4 of block first + i / 4):
  // uniform in [p0, p1), or Bernoulli (1 with probability p0); the bits of kernels/common/random_draw.h.
  void (*random_f32)(bool bernoulli, uint64_t seed, uint64_t first, int64_t n, double p0, double p1, float* out);
};

struct Leaves {
  const char* name;
  RowLeaves rows;
  GemmLeaves<float> f32;
  GemmLeaves<double> f64;
  ConvLeaves conv;
};

// Defined in kernels/cpu/isa/avx512.cpp and avx2.cpp (x86-64 builds only).
const Leaves& avx512_leaves();
const Leaves& avx2_leaves();
// The generic set (kernels/cpu/kernel_sets.cpp, baseline flags): rows only, no GEMM or conv leaves.
const Leaves& generic_leaves();

}  // namespace kiln::cpu::isa
