// The plans of kernels/common/gemm_plan.h and conv_plan.h executed on the CPU, reading operands as
// cuBLASLt, Kiln's Tensor Core GEMM and cuDNN would (see library_interp.h). Deliberately naive: a
// loop per output element over the sum, every operand read through the plan's own layout, so the
// code says what the library computes rather than how fast.
#include "kernels/cuda/emulator/library_interp.h"

#include <algorithm>
#include <cmath>
#include <mutex>
#include <vector>

#include "base/half.h"
#include "kernels/common/math.h"

namespace kiln::emu {
namespace {

using libplan::ConvPass;
using libplan::ConvPath;
using libplan::ConvPlan;
using libplan::DnnFilter;
using libplan::DnnTensor;
using libplan::GemmPath;
using libplan::GemmPlan;
using libplan::LtLayout;
using libplan::LtOp;

std::mutex g_calls_mutex;
std::map<std::string, int64_t>& calls() {
  static auto* m = new std::map<std::string, int64_t>;  // never destroyed: counted from any thread until exit
  return *m;
}

double load(DType dt, const void* p, int64_t i) {
  switch (dt) {
    case DType::f32: return static_cast<const float*>(p)[i];
    case DType::f64: return static_cast<const double*>(p)[i];
    case DType::f16: return f16_bits_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::bf16: return bf16_bits_to_f32(static_cast<const uint16_t*>(p)[i]);
    default: KILN_FAIL("emulated library: dtype ", dt, " is not a floating type it takes");
  }
}
// Rounded once from the f64 sum: through f32 for the 16-bit types, as the libraries' f32 results are.
void store(DType dt, void* p, int64_t i, double v) {
  switch (dt) {
    case DType::f32: static_cast<float*>(p)[i] = float(v); return;
    case DType::f64: static_cast<double*>(p)[i] = v; return;
    case DType::f16: static_cast<uint16_t*>(p)[i] = f32_to_f16_bits(float(v)); return;
    case DType::bf16: static_cast<uint16_t*>(p)[i] = f32_to_bf16_bits(float(v)); return;
    default: KILN_FAIL("emulated library: dtype ", dt, " is not a floating type it takes");
  }
}

DType dtype_of(libplan::DnnType t) {
  switch (t) {
    case libplan::DnnType::f32: return DType::f32;
    case libplan::DnnType::f64: return DType::f64;
    case libplan::DnnType::f16: return DType::f16;
    case libplan::DnnType::bf16: return DType::bf16;
  }
  return DType::f32;
}

// Element (r, c) of a column-major layout in batch entry i.
int64_t at(const LtLayout& l, int64_t i, int64_t r, int64_t c) { return i * l.batch_stride + c * l.ld + r; }

// ---- convolution ----------------------------------------------------------------------------------

int64_t at(const DnnTensor& t, int64_t n, int64_t c, int64_t h, int64_t w) {
  return n * t.stride[0] + c * t.stride[1] + h * t.stride[2] + w * t.stride[3];
}
int64_t at(const DnnFilter& f, int64_t k, int64_t c, int64_t r, int64_t s) {
  return k * f.stride[0] + c * f.stride[1] + r * f.stride[2] + s * f.stride[3];
}
std::string dims(const DnnTensor& t) { return detail::str_cat("[", t.n, ",", t.c, ",", t.h, ",", t.w, "]"); }
std::string dims(const DnnFilter& f) { return detail::str_cat("[", f.k, ",", f.c, ",", f.r, ",", f.s, "]"); }

// cuDNN's checks on the descriptors of a convolution (cudnnGetConvolution2dForwardOutputDim and the
// pass calls' own): the filter's channels times the groups are x's, its count is y's, and y's size
// is the convolution's.
void check_descriptors(const ConvPlan& p) {
  const auto& c = p.conv;
  const std::string what = detail::str_cat("emulated cuDNN ", libplan::pass_name(p.pass), ": x ", dims(p.x), " w ",
                                           dims(p.w), " y ", dims(p.y), " groups ", c.groups);
  KILN_CHECK(c.groups >= 1 && c.stride_h >= 1 && c.stride_w >= 1 && c.dilation_h >= 1 && c.dilation_w >= 1 &&
                 c.pad_h >= 0 && c.pad_w >= 0,
             what, ": bad convolution descriptor");
  KILN_CHECK(libplan::elements(p.x) > 0 && libplan::elements(p.w) > 0 && libplan::elements(p.y) > 0, what,
             ": cuDNN rejects empty tensors");
  KILN_CHECK(p.w.c * c.groups == p.x.c && p.w.k % c.groups == 0 && p.w.k == p.y.c && p.x.n == p.y.n, what,
             ": the descriptors do not fit together");
  KILN_CHECK(p.y.h == libplan::conv_output_size(p.x.h, c.pad_h, p.w.r, c.stride_h, c.dilation_h) &&
                 p.y.w == libplan::conv_output_size(p.x.w, c.pad_w, p.w.s, c.stride_w, c.dilation_w),
             what, ": y is not the convolution's output size");
}

// y += bias over every (n, h, w): cudnnAddTensor with alpha = beta = 1.
void add_bias(const ConvPlan& p, DType dt, const void* bias, void* y) {
  count_library_call("cudnn add bias");
  KILN_CHECK(p.bias.n == 1 && p.bias.h == 1 && p.bias.w == 1 && p.bias.c == p.y.c, "emulated cuDNN add tensor: bias ",
             dims(p.bias), " does not broadcast to y ", dims(p.y));
  for (int64_t n = 0; n < p.y.n; ++n)
    for (int64_t k = 0; k < p.y.c; ++k)
      for (int64_t h = 0; h < p.y.h; ++h)
        for (int64_t w = 0; w < p.y.w; ++w) {
          const int64_t i = at(p.y, n, k, h, w);
          store(dt, y, i, load(dt, y, i) + load(dt, bias, at(p.bias, 0, k, 0, 0)));
        }
}

// The pass's output, from sums kept in its logical order ([n, c, h, w] or [k, c, r, s]).
void write_output(const ConvPlan& p, DType dt, const std::vector<double>& acc, void* out) {
  int64_t i = 0;
  if (p.pass == ConvPass::backward_filter) {
    for (int64_t k = 0; k < p.w.k; ++k)
      for (int64_t c = 0; c < p.w.c; ++c)
        for (int64_t r = 0; r < p.w.r; ++r)
          for (int64_t s = 0; s < p.w.s; ++s) store(dt, out, at(p.w, k, c, r, s), acc[size_t(i++)]);
    return;
  }
  const DnnTensor& t = p.pass == ConvPass::forward ? p.y : p.x;
  for (int64_t n = 0; n < t.n; ++n)
    for (int64_t c = 0; c < t.c; ++c)
      for (int64_t h = 0; h < t.h; ++h)
        for (int64_t w = 0; w < t.w; ++w) store(dt, out, at(t, n, c, h, w), acc[size_t(i++)]);
}

void convolve(const ConvPlan& p, DType dt, const ConvBuffers& b) {
  check_descriptors(p);
  const auto& cv = p.conv;
  const int64_t groups = cv.groups, cg = p.w.c, kg = p.w.k / groups;
  const int64_t R = p.w.r, S = p.w.s, H = p.x.h, W = p.x.w, OH = p.y.h, OW = p.y.w;
  const bool flip = cv.mode == libplan::DnnMode::convolution;
  std::vector<double> acc(size_t(libplan::output_elements(p)), 0.0);
  // Every (output position, filter tap) pair once; the pass decides which two operands multiply and
  // which sum the product joins. Sums run in this fixed order for every pass.
  for (int64_t n = 0; n < p.y.n; ++n)
    for (int64_t g = 0; g < groups; ++g)
      for (int64_t kk = 0; kk < kg; ++kk) {
        const int64_t k = g * kg + kk;
        for (int64_t oy = 0; oy < OH; ++oy)
          for (int64_t ox = 0; ox < OW; ++ox) {
            const int64_t yi = at(p.y, n, k, oy, ox);
            for (int64_t cc = 0; cc < cg; ++cc) {
              const int64_t c = g * cg + cc;
              for (int64_t r = 0; r < R; ++r) {
                const int64_t iy = oy * cv.stride_h - cv.pad_h + r * cv.dilation_h;
                if (iy < 0 || iy >= H) continue;
                for (int64_t s = 0; s < S; ++s) {
                  const int64_t ix = ox * cv.stride_w - cv.pad_w + s * cv.dilation_w;
                  if (ix < 0 || ix >= W) continue;
                  const int64_t fr = flip ? R - 1 - r : r, fs = flip ? S - 1 - s : s;
                  const int64_t xi = at(p.x, n, c, iy, ix), wi = at(p.w, k, cc, fr, fs);
                  switch (p.pass) {
                    case ConvPass::forward:
                      acc[size_t(((n * p.y.c + k) * OH + oy) * OW + ox)] += load(dt, b.x, xi) * load(dt, b.w, wi);
                      break;
                    case ConvPass::backward_data:
                      acc[size_t(((n * p.x.c + c) * H + iy) * W + ix)] += load(dt, b.dy, yi) * load(dt, b.w, wi);
                      break;
                    case ConvPass::backward_filter:
                      acc[size_t(((k * cg + cc) * R + fr) * S + fs)] += load(dt, b.x, xi) * load(dt, b.dy, yi);
                      break;
                  }
                }
              }
            }
          }
      }
  write_output(p, dt, acc, b.out);
}

void zero_output(const ConvPlan& p, DType dt, void* out) {
  write_output(p, dt, std::vector<double>(size_t(libplan::output_elements(p)), 0.0), out);
}

}  // namespace

void count_library_call(const std::string& what) {
  std::lock_guard<std::mutex> lk(g_calls_mutex);
  ++calls()[what];
}
std::map<std::string, int64_t> library_calls() {
  std::lock_guard<std::mutex> lk(g_calls_mutex);
  return calls();
}

void run_gemm_plan(const GemmPlan& p, const void* a, const void* b, void* c) {
  const DType dt = libplan::dtype_of(p.data);
  // alpha and beta reach the library in the plan's scale type.
  const bool f64_scale = p.scale == libplan::LtType::r64f;
  const double alpha = f64_scale ? p.alpha : double(float(p.alpha)), beta = f64_scale ? p.beta : double(float(p.beta));
  switch (p.path) {
    case GemmPath::nothing: return;
    case GemmPath::scale:
      // gemm.cu's scale kernel over C^T (its rows are the engine's columns); beta 0 never reads C.
      count_library_call("gemm scale (k == 0)");
      for (int64_t i = 0; i < p.batch_count; ++i)
        for (int64_t col = 0; col < p.c.cols; ++col)
          for (int64_t row = 0; row < p.c.rows; ++row) {
            const int64_t ci = at(p.c, i, row, col);
            store(dt, c, ci, beta == 0.0 ? 0.0 : load(dt, c, ci) * beta);
          }
      return;
    case GemmPath::matmul: break;
  }
  count_library_call("cublasLt matmul");
  // cuBLASLt's rules: op(A) is M x K, op(B) K x N, C and D M x N; ld >= rows of each stored matrix.
  const bool ta = p.trans_a == LtOp::t, tb = p.trans_b == LtOp::t;
  const int64_t M = p.c.rows, N = p.c.cols, K = ta ? p.a.rows : p.a.cols;
  const int64_t am = ta ? p.a.cols : p.a.rows, bk = tb ? p.b.cols : p.b.rows, bn = tb ? p.b.rows : p.b.cols;
  KILN_CHECK(am == M && bk == K && bn == N, "emulated cublasLt: op(A) ", am, " x ", K, ", op(B) ", bk, " x ", bn,
             " and C ", M, " x ", N, " do not chain");
  for (const LtLayout* l : {&p.a, &p.b, &p.c})
    KILN_CHECK(l->ld >= std::max<int64_t>(1, l->rows), "emulated cublasLt: leading dimension ", l->ld,
               " is less than the rows ", l->rows, " of a ", l->rows, " x ", l->cols, " layout");
  KILN_CHECK(p.batch_count >= 1 && p.batch_count < INT32_MAX, "emulated cublasLt: batch count ", p.batch_count);
  const void* A = libplan::operand(p.a_from, a, b);
  const void* B = libplan::operand(p.b_from, a, b);
  for (int64_t i = 0; i < p.batch_count; ++i)
    for (int64_t col = 0; col < N; ++col)
      for (int64_t row = 0; row < M; ++row) {
        double acc = 0;
        for (int64_t k = 0; k < K; ++k)
          acc += load(dt, A, ta ? at(p.a, i, k, row) : at(p.a, i, row, k)) *
                 load(dt, B, tb ? at(p.b, i, col, k) : at(p.b, i, k, col));
        const int64_t ci = at(p.c, i, row, col);
        store(dt, c, ci, alpha * acc + (beta != 0.0 ? beta * load(dt, c, ci) : 0.0));
      }
}

void run_tc_gemm(const tcgemm::GemmArgs& g) {
  // tc_gemm's own checks, so arguments it would refuse fail here too.
  libplan::check_tc_gemm_args(g, "emulated tc_gemm");
  const bool a_row = g.la == tcgemm::Layout::row, b_row = g.lb == tcgemm::Layout::row;
  count_library_call("tc_gemm");
  const double alpha = g.ep.alpha, beta = g.ep.beta;
  for (int64_t i = 0; i < g.batch; ++i) {
    const int64_t oa = i * g.stride_a, ob = i * g.stride_b, oc = i * g.stride_c;
    for (int64_t m = 0; m < g.M; ++m)
      for (int64_t n = 0; n < g.N; ++n) {
        double acc = 0;
        for (int64_t k = 0; k < g.K; ++k)
          acc += load(g.in_dtype, g.a, oa + (a_row ? m * g.lda + k : k * g.lda + m)) *
                 load(g.in_dtype, g.b, ob + (b_row ? k * g.ldb + n : n * g.ldb + k));
        const int64_t ci = oc + m * g.ldc + n;
        double v = alpha * acc + (g.bias ? double(g.bias[n]) : 0.0);
        if (beta != 0.0) v += beta * load(g.out_dtype, g.c0, ci);
        switch (g.ep.act) {
          case tcgemm::Activation::none: break;
          case tcgemm::Activation::relu: v = math::relu(v); break;
          case tcgemm::Activation::gelu_tanh: v = math::gelu_tanh(v); break;
          case tcgemm::Activation::gelu_erf: v = math::gelu_erf(v); break;
        }
        if (g.residual) v += load(g.out_dtype, g.residual, ci);
        store(g.out_dtype, g.out, ci, v);
      }
  }
}

std::string first_difference(DType dt, const void* x, const void* y, int64_t m, int64_t n, int64_t ld, int64_t stride,
                             int64_t batch) {
  for (int64_t i = 0; i < batch; ++i)
    for (int64_t r = 0; r < m; ++r)
      for (int64_t c = 0; c < n; ++c) {
        const double u = load(dt, x, i * stride + r * ld + c), v = load(dt, y, i * stride + r * ld + c);
        if (!(u == v || (std::isnan(u) && std::isnan(v))))
          return detail::str_cat("batch entry ", i, " row ", r, " column ", c, ": ", u, " vs ", v);
      }
  return "";
}

void run_conv_plan(const ConvPlan& p, const ConvBuffers& b) {
  const DType dt = dtype_of(p.data);
  switch (p.path) {
    case ConvPath::nothing: return;
    case ConvPath::zero_output:
      count_library_call("conv zero output");
      if (b.out) zero_output(p, dt, b.out);
      return;
    case ConvPath::bias_only: {
      count_library_call("conv bias only (no input channels)");
      ConvPlan y_only = p;
      y_only.pass = ConvPass::forward;
      zero_output(y_only, dt, b.out);
      if (b.bias) add_bias(p, dt, b.bias, b.out);
      return;
    }
    case ConvPath::convolve: break;
  }
  count_library_call(std::string("cudnn ") + libplan::pass_name(p.pass));
  convolve(p, dt, b);
  if (p.pass == ConvPass::forward && b.bias) add_bias(p, dt, b.bias, b.out);
}

}  // namespace kiln::emu
