// The CUDA backend's library calls as data (kernels/common/gemm_plan.h, conv_plan.h): the plans
// gemm.cu and conv.cu build their cuBLASLt and cuDNN descriptors from, executed by the emulator's
// interpreters (kernels/cuda/emulator/library_interp.cpp, which read operands as the libraries
// would) against naive f64 references written from the engine's contracts (kernels/backend.h), for
// transposed, batched (a broadcast operand), padded-ld, k == 0 and odd shapes, and grouped, strided,
// dilated, padded convolutions in NCHW and NHWC. Also the Tensor Core GEMM's dispatch: which
// products Kiln's kernel takes and why not, and that its arguments compute what cuBLASLt's plan does;
// conv.cu's cache key, and which batch norms cuDNN can take (bn_plan.h).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "base/half.h"
#include "kernels/common/bn_plan.h"
#include "kernels/common/conv_plan.h"
#include "kernels/common/gemm_plan.h"
#include "kernels/cuda/emulator/emulator.h"
#include "kernels/cuda/emulator/library_interp.h"

using namespace kiln;
using namespace kiln::libplan;

namespace {

// A host buffer of one floating dtype, written and read as doubles.
struct Buf {
  DType dt;
  std::vector<double> storage;  // 8-byte elements, so any dtype fits and the data is 16-byte aligned
  Buf(DType t, int64_t n) : dt(t), storage(size_t(std::max<int64_t>(n, 1)), 0.0) {}
  void* data() { return storage.data(); }
  void set(int64_t i, double v) {
    switch (dt) {
      case DType::f64: reinterpret_cast<double*>(data())[i] = v; break;
      case DType::f32: reinterpret_cast<float*>(data())[i] = float(v); break;
      case DType::f16: reinterpret_cast<uint16_t*>(data())[i] = f32_to_f16_bits(float(v)); break;
      default: reinterpret_cast<uint16_t*>(data())[i] = f32_to_bf16_bits(float(v)); break;
    }
  }
  double get(int64_t i) {
    switch (dt) {
      case DType::f64: return reinterpret_cast<double*>(data())[i];
      case DType::f32: return reinterpret_cast<float*>(data())[i];
      case DType::f16: return f16_bits_to_f32(reinterpret_cast<uint16_t*>(data())[i]);
      default: return bf16_bits_to_f32(reinterpret_cast<uint16_t*>(data())[i]);
    }
  }
  void fill_random(int64_t n, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> u(-1, 1);
    for (int64_t i = 0; i < n; ++i) set(i, u(rng));
  }
};

// Elements a row-major rows x cols operand with row stride ld spans over `batch` entries `stride` apart.
int64_t extent(int64_t rows, int64_t cols, int64_t ld, int64_t stride, int64_t batch) {
  return (batch - 1) * stride + (rows - 1) * ld + cols;
}

// The engine's contract (Backend::gemm_batched), naively: row-major C = alpha op(A) op(B) + beta C.
std::vector<double> reference_gemm(const GemmCall& g, Buf& a, Buf& b, Buf& c) {
  std::vector<double> out(c.storage.size());
  const int64_t nc = extent(g.m, g.n, g.ldc, g.stride_c, g.batch);
  for (int64_t i = 0; i < nc; ++i) out[size_t(i)] = c.get(i);
  for (int64_t e = 0; e < g.batch; ++e)
    for (int64_t i = 0; i < g.m; ++i)
      for (int64_t j = 0; j < g.n; ++j) {
        double acc = 0;
        for (int64_t p = 0; p < g.k; ++p)
          acc += a.get(e * g.stride_a + (g.trans_a ? p * g.lda + i : i * g.lda + p)) *
                 b.get(e * g.stride_b + (g.trans_b ? j * g.ldb + p : p * g.ldb + j));
        const int64_t ci = e * g.stride_c + i * g.ldc + j;
        out[size_t(ci)] = g.alpha * acc + (g.beta != 0 ? g.beta * c.get(ci) : 0.0);
      }
  return out;
}

// Runs the call's plan in the interpreter and compares every element of C with the reference.
void check_gemm(const GemmCall& g, double tol) {
  CAPTURE(describe(g));
  const int64_t na = extent(g.trans_a ? g.k : g.m, g.trans_a ? g.m : g.k, g.lda, g.stride_a, g.batch);
  const int64_t nb = extent(g.trans_b ? g.n : g.k, g.trans_b ? g.k : g.n, g.ldb, g.stride_b, g.batch);
  const int64_t nc = extent(g.m, g.n, g.ldc, g.stride_c, g.batch);
  Buf a(g.dtype, na), b(g.dtype, nb), c(g.dtype, nc);
  a.fill_random(na, 1);
  b.fill_random(nb, 2);
  c.fill_random(nc, 3);
  const std::vector<double> want = reference_gemm(g, a, b, c);
  emu::run_gemm_plan(plan_gemm(g, false), a.data(), b.data(), c.data());
  double worst = 0;
  for (int64_t i = 0; i < nc; ++i) worst = std::max(worst, std::abs(c.get(i) - want[size_t(i)]));
  CHECK(worst <= tol);
}

GemmCall call(DType dt, bool ta, bool tb, int64_t m, int64_t n, int64_t k, int64_t pad = 0) {
  GemmCall g;
  g.dtype = dt;
  g.trans_a = ta;
  g.trans_b = tb;
  g.m = m;
  g.n = n;
  g.k = k;
  g.lda = (ta ? m : k) + pad;
  g.ldb = (tb ? k : n) + pad;
  g.ldc = n + pad;
  return g;
}

const void* address(uintptr_t a) { return reinterpret_cast<const void*>(a); }

}  // namespace

TEST_CASE("library plans: the cuBLASLt plan swaps the operands and keeps each one's layout") {
  // Row-major C = A^T B (m 5, n 7, k 3; ld longer than rows) is column-major C^T = B^T A.
  const GemmPlan p = plan_gemm(call(DType::f32, true, false, 5, 7, 3, 2), false);
  CHECK(p.path == GemmPath::matmul);
  CHECK(p.a_from == GemmOperand::b);
  CHECK(p.b_from == GemmOperand::a);
  CHECK(p.trans_a == LtOp::n);                             // the engine's trans_b
  CHECK(p.trans_b == LtOp::t);                             // the engine's trans_a
  CHECK((p.a.rows == 7 && p.a.cols == 3 && p.a.ld == 9));  // B: k x n row-major = n x k column-major
  CHECK((p.b.rows == 5 && p.b.cols == 3 && p.b.ld == 7));  // A^T stored k x m = m x k column-major
  CHECK((p.c.rows == 7 && p.c.cols == 5 && p.c.ld == 9));
  CHECK(p.batch_count == 1);
  CHECK((p.a.batch_stride == 0 && p.b.batch_stride == 0 && p.c.batch_stride == 0));
  CHECK((p.data == LtType::r32f && p.scale == LtType::r32f && p.compute == LtCompute::f32));
  CHECK(plan_gemm(call(DType::f32, false, false, 2, 2, 2), true).compute == LtCompute::f32_fast_tf32);
  const GemmPlan h = plan_gemm(call(DType::bf16, false, false, 2, 2, 2), true);
  CHECK((h.data == LtType::r16bf && h.scale == LtType::r32f && h.compute == LtCompute::f32));
  const GemmPlan d = plan_gemm(call(DType::f64, false, false, 2, 2, 2), true);
  CHECK((d.data == LtType::r64f && d.scale == LtType::r64f && d.compute == LtCompute::f64));
}

TEST_CASE("library plans: cuBLASLt plans compute the engine's row-major products") {
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (int64_t pad : {0, 3}) {
        GemmCall g = call(DType::f64, ta, tb, 5, 7, 3, pad);
        g.alpha = 0.5;
        g.beta = -2;
        check_gemm(g, 1e-12);
        check_gemm(call(DType::f64, ta, tb, 1, 9, 13, pad), 1e-12);  // a single row
        check_gemm(call(DType::f32, ta, tb, 17, 1, 4, pad), 1e-5);   // a single column
      }
  SUBCASE("batched, A broadcast (stride 0), B and C padded between entries") {
    GemmCall g = call(DType::f64, false, true, 4, 6, 5, 1);
    g.batch = 3;
    g.stride_a = 0;
    g.stride_b = 6 * g.ldb + 2;
    g.stride_c = 4 * g.ldc + 5;
    g.beta = 1;
    check_gemm(g, 1e-12);
    const GemmPlan p = plan_gemm(g, false);
    CHECK((p.batch_count == 3 && p.a.batch_stride == g.stride_b && p.b.batch_stride == 0 &&
           p.c.batch_stride == g.stride_c));
  }
  SUBCASE("16-bit operands, f32 scale") {
    GemmCall g = call(DType::f16, true, true, 9, 5, 11, 1);
    g.alpha = 1.5;
    check_gemm(g, 1e-2);
    g.dtype = DType::bf16;
    check_gemm(g, 5e-2);
  }
}

TEST_CASE("library plans: k == 0 scales C by beta, never reading it when beta is 0") {
  GemmCall g = call(DType::f32, false, false, 3, 4, 0, 2);
  g.batch = 2;
  g.stride_c = 3 * g.ldc + 1;
  g.beta = 0.5;
  CHECK(plan_gemm(g, false).path == GemmPath::scale);
  check_gemm(g, 1e-7);
  g.beta = 1;
  CHECK(plan_gemm(g, false).path == GemmPath::nothing);
  g.beta = 0;
  const int64_t nc = extent(g.m, g.n, g.ldc, g.stride_c, g.batch);
  std::vector<float> c(size_t(nc), NAN);
  emu::run_gemm_plan(plan_gemm(g, false), nullptr, nullptr, c.data());
  for (int64_t e = 0; e < 2; ++e)
    for (int64_t i = 0; i < 3; ++i)
      for (int64_t j = 0; j < 4; ++j) CHECK(c[size_t(e * g.stride_c + i * g.ldc + j)] == 0.0f);
  CHECK(std::isnan(c[4]));  // the padding between rows is not C's
  CHECK(plan_gemm(call(DType::f32, false, false, 0, 4, 5), false).path == GemmPath::nothing);
}

TEST_CASE("library plans: bad GEMM calls fail naming the call") {
  GemmCall g = call(DType::f32, false, true, 4, 6, 5);
  g.ldb = 4;  // B^T is n x k: a row holds k = 5
  CHECK_THROWS_WITH_AS(plan_gemm(g, false), doctest::Contains("ldb 4 is shorter than a row of B^T (k), 5"), Error);
  CHECK_THROWS_WITH_AS(plan_gemm(g, false), doctest::Contains("m=4 n=6 k=5"), Error);
  g = call(DType::f32, false, false, 4, 6, 5);
  g.ldc = 5;
  CHECK_THROWS_WITH_AS(plan_gemm(g, false), doctest::Contains("ldc 5 is shorter than a row of C (6)"), Error);
  CHECK_THROWS_WITH_AS(plan_gemm(call(DType::i32, false, false, 2, 2, 2), false),
                       doctest::Contains("dtype i32 is not supported"), Error);
  g = call(DType::f32, false, false, 2, 2, 2);
  g.batch = INT32_MAX;
  CHECK_THROWS_WITH_AS(plan_gemm(g, false), doctest::Contains("products in one batch is too many"), Error);
}

TEST_CASE("library plans: cuBLASLt is told the operands' true alignment") {
  GemmPlan p = plan_gemm(call(DType::f32, false, false, 4, 4, 4), false);
  CHECK(lt_alignment(p, address(0x1000), address(0x2000), address(0x3000)) == 256);
  CHECK(lt_alignment(p, address(0x1000), address(0x2008), address(0x3000)) == 8);
  GemmCall g = call(DType::f32, false, false, 4, 4, 4);
  g.batch = 2;
  g.stride_a = 16;
  g.stride_b = 3;  // 12 bytes: 4-byte aligned entries
  p = plan_gemm(g, false);
  CHECK(lt_alignment(p, address(0x1000), address(0x2000), address(0x3000)) == 4);
}

TEST_CASE("library plans: the Tensor Core GEMM takes aligned 16-bit products and says why not otherwise") {
  GemmCall g = call(DType::f16, false, true, 200, 72, 64);
  const void* a = address(0x10000);
  const void* b = address(0x20000);
  void* c = const_cast<void*>(address(0x30000));
  tcgemm::GemmArgs args;
  REQUIRE(plan_tc_gemm(g, a, b, c, &args) == TcRefusal::none);
  CHECK((args.la == tcgemm::Layout::row && args.lb == tcgemm::Layout::col));
  CHECK((args.M == 200 && args.N == 72 && args.K == 64 && args.lda == 64 && args.ldb == 64 && args.ldc == 72));
  CHECK((args.a == a && args.b == b && args.out == c && args.c0 == nullptr));
  g.beta = 1;
  REQUIRE(plan_tc_gemm(g, a, b, c, &args) == TcRefusal::none);
  CHECK(args.c0 == c);
  const auto refusal = [&](auto change, const void* pa = nullptr, const void* pb = nullptr) {
    GemmCall h = call(DType::f16, false, false, 200, 72, 64);
    change(h);
    return plan_tc_gemm(h, pa ? pa : a, pb ? pb : b, c, nullptr);
  };
  CHECK(refusal([](GemmCall& h) { h.dtype = DType::f32; }) == TcRefusal::not_16bit);
  CHECK(refusal([](GemmCall& h) { h.k = 0; }) == TcRefusal::empty);
  CHECK(refusal([](GemmCall& h) { h.k = 12, h.lda = 16; }) == TcRefusal::k_alignment);
  CHECK(refusal([](GemmCall& h) { h.lda = 68; }) == TcRefusal::lda_alignment);
  CHECK(refusal([](GemmCall& h) { h.ldb = 76; }) == TcRefusal::ldb_alignment);
  CHECK(refusal([](GemmCall& h) { h.batch = 2, h.stride_b = 72 * 64 + 4; }) == TcRefusal::stride_alignment);
  CHECK(refusal([](GemmCall&) {}, address(0x10002)) == TcRefusal::a_misaligned);
  CHECK(refusal([](GemmCall&) {}, nullptr, address(0x20008)) == TcRefusal::b_misaligned);
  CHECK(refusal([](GemmCall& h) { h.batch = 2, h.stride_c = 0; }) == TcRefusal::c_overlap);  // one C for both
  CHECK(refusal([](GemmCall& h) { h.batch = 2, h.stride_c = 199 * 72 + 71; }) == TcRefusal::c_overlap);
  CHECK(refusal([](GemmCall& h) { h.batch = 2, h.stride_c = 199 * 72 + 72, h.stride_a = 0; }) == TcRefusal::none);
  CHECK(refusal([](GemmCall& h) { h.batch = 65536, h.stride_c = 200 * 72; }) == TcRefusal::batch_over_grid);
  CHECK(refusal([](GemmCall& h) { h.batch = 65535, h.stride_c = 200 * 72; }) == TcRefusal::none);
  CHECK(refusal([](GemmCall& h) { h.m = 65535 * 128 + 1; }) == TcRefusal::rows_over_grid);
  CHECK(refusal([](GemmCall& h) { h.m = 65535 * 128; }) == TcRefusal::none);
  CHECK(std::string(tc_refusal_text(TcRefusal::k_alignment)) == "K is not a multiple of 8");
  CHECK(std::string(tc_refusal_text(TcRefusal::device)).find("sm_80") != std::string::npos);
}

TEST_CASE("library plans: the Tensor Core GEMM's arguments compute what the cuBLASLt plan does") {
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      GemmCall g = call(DType::bf16, ta, tb, 9, 13, 24, 8);  // ld = rows + 8: multiples of 8 only where rows are
      g.lda = 32;
      g.ldb = 32;
      g.batch = 2;
      g.stride_a = 0;
      g.stride_b = 32 * 32;
      g.stride_c = 16 * g.ldc;
      g.beta = 0.25;
      CAPTURE(describe(g));
      const int64_t n = 2 * 32 * 32;
      Buf a(g.dtype, n), b(g.dtype, n), c(g.dtype, n), c_lt(g.dtype, n);
      a.fill_random(n, 4);
      b.fill_random(n, 5);
      c.fill_random(n, 6);
      c_lt.storage = c.storage;
      tcgemm::GemmArgs args;
      REQUIRE(plan_tc_gemm(g, a.data(), b.data(), c.data(), &args) == TcRefusal::none);
      emu::run_tc_gemm(args);
      emu::run_gemm_plan(plan_gemm(g, false), a.data(), b.data(), c_lt.data());
      CHECK(emu::first_difference(g.dtype, c.data(), c_lt.data(), g.m, g.n, g.ldc, g.stride_c, g.batch) == "");
    }
}

namespace {

struct ConvCase {
  Conv2dParams p;
  DType dt;
};
Conv2dParams conv_params(int64_t n, int64_t c, int64_t h, int64_t w, int64_t o, int64_t kh, int64_t kw, int64_t sh,
                         int64_t sw, int64_t ph, int64_t pw, int64_t dh, int64_t dw, int64_t groups, bool nhwc) {
  Conv2dParams p{n, c, h, w, o, kh, kw, sh, sw, ph, pw, dh, dw, groups, 0, 0, nhwc};
  p.oh = conv_output_size(h, ph, kh, sh, dh);
  p.ow = conv_output_size(w, pw, kw, sw, dw);
  return p;
}

// Memory offsets as the engine lays the buffers out (kernels/backend.h: NCHW, or channels_last
// [n, h, w, c] with filters [o, kh, kw, c/groups]), written here independently of the plan.
int64_t act_at(const Conv2dParams& p, int64_t C, int64_t H, int64_t W, int64_t n, int64_t c, int64_t h, int64_t w) {
  return p.nhwc ? ((n * H + h) * W + w) * C + c : ((n * C + c) * H + h) * W + w;
}
int64_t filter_at(const Conv2dParams& p, int64_t o, int64_t c, int64_t r, int64_t s) {
  const int64_t cg = p.c / p.groups;
  return p.nhwc ? ((o * p.kh + r) * p.kw + s) * cg + c : ((o * cg + c) * p.kh + r) * p.kw + s;
}

// All three passes of one convolution through their plans, against the direct sums.
void check_conv(const Conv2dParams& p, DType dt, double tol) {
  CAPTURE(describe(dt, p));
  const int64_t cg = p.c / p.groups, og = p.o / p.groups;
  const int64_t nx = p.n * p.c * p.h * p.w, nw = p.o * cg * p.kh * p.kw, ny = p.n * p.o * p.oh * p.ow;
  Buf x(dt, nx), w(dt, nw), bias(dt, p.o), dy(dt, ny), y(dt, ny), dx(dt, nx), dw(dt, nw);
  x.fill_random(nx, 7);
  w.fill_random(nw, 8);
  bias.fill_random(p.o, 9);
  dy.fill_random(ny, 10);
  std::vector<double> want_y(static_cast<size_t>(ny)), want_dx(static_cast<size_t>(nx)),
      want_dw(static_cast<size_t>(nw));
  for (int64_t n = 0; n < p.n; ++n)
    for (int64_t o = 0; o < p.o; ++o)
      for (int64_t oy = 0; oy < p.oh; ++oy)
        for (int64_t ox = 0; ox < p.ow; ++ox) {
          const int64_t yi = act_at(p, p.o, p.oh, p.ow, n, o, oy, ox);
          double acc = bias.get(o);
          for (int64_t c = 0; c < cg; ++c)
            for (int64_t r = 0; r < p.kh; ++r)
              for (int64_t s = 0; s < p.kw; ++s) {
                const int64_t iy = oy * p.sh - p.ph + r * p.dh, ix = ox * p.sw - p.pw + s * p.dw;
                if (iy < 0 || iy >= p.h || ix < 0 || ix >= p.w) continue;
                const int64_t xi = act_at(p, p.c, p.h, p.w, n, (o / og) * cg + c, iy, ix),
                              wi = filter_at(p, o, c, r, s);
                acc += x.get(xi) * w.get(wi);
                want_dx[size_t(xi)] += dy.get(yi) * w.get(wi);
                want_dw[size_t(wi)] += x.get(xi) * dy.get(yi);
              }
          want_y[size_t(yi)] = acc;
        }
  emu::run_conv_plan(plan_conv(dt, p, ConvPass::forward, false), {x.data(), w.data(), nullptr, bias.data(), y.data()});
  emu::run_conv_plan(plan_conv(dt, p, ConvPass::backward_data, false),
                     {x.data(), w.data(), dy.data(), nullptr, dx.data()});
  emu::run_conv_plan(plan_conv(dt, p, ConvPass::backward_filter, false),
                     {x.data(), w.data(), dy.data(), nullptr, dw.data()});
  const auto worst = [](Buf& got, const std::vector<double>& want) {
    double e = 0;
    for (size_t i = 0; i < want.size(); ++i) e = std::max(e, std::abs(got.get(int64_t(i)) - want[i]));
    return e;
  };
  CHECK(worst(y, want_y) <= tol);
  CHECK(worst(dx, want_dx) <= tol);
  CHECK(worst(dw, want_dw) <= tol);
}

}  // namespace

TEST_CASE("library plans: the cuDNN descriptors say NCHW/KCRS or NHWC/KRSC and the convolution's parameters") {
  const Conv2dParams p = conv_params(2, 6, 9, 7, 4, 3, 2, 2, 1, 1, 0, 1, 2, 2, true);
  const ConvPlan c = plan_conv(DType::f16, p, ConvPass::backward_filter, false);
  CHECK(c.path == ConvPath::convolve);
  CHECK((c.x.format == DnnFormat::nhwc && c.x.n == 2 && c.x.c == 6 && c.x.h == 9 && c.x.w == 7));
  CHECK((c.x.stride[0] == 9 * 7 * 6 && c.x.stride[1] == 1 && c.x.stride[2] == 7 * 6 && c.x.stride[3] == 6));
  CHECK((c.y.c == 4 && c.y.h == p.oh && c.y.w == p.ow && c.y.stride[3] == 4));
  CHECK((c.w.format == DnnFormat::nhwc && c.w.k == 4 && c.w.c == 3 && c.w.r == 3 && c.w.s == 2));
  CHECK((c.w.stride[0] == 3 * 2 * 3 && c.w.stride[1] == 1 && c.w.stride[2] == 2 * 3 && c.w.stride[3] == 3));
  CHECK((c.bias.n == 1 && c.bias.c == 4 && c.bias.h == 1 && c.bias.w == 1));
  CHECK((c.conv.pad_h == 1 && c.conv.pad_w == 0 && c.conv.stride_h == 2 && c.conv.stride_w == 1 &&
         c.conv.dilation_h == 1 && c.conv.dilation_w == 2 && c.conv.groups == 2));
  CHECK((c.conv.mode == DnnMode::cross_correlation && c.data == DnnType::f16 && c.conv.compute == DnnType::f32 &&
         c.conv.math == DnnMath::tensor_op));
  Conv2dParams q = p;
  q.nhwc = false;
  const ConvPlan n = plan_conv(DType::f64, q, ConvPass::forward, true);
  CHECK((n.x.format == DnnFormat::nchw && n.x.stride[0] == 6 * 9 * 7 && n.x.stride[1] == 9 * 7 && n.x.stride[3] == 1));
  CHECK((n.w.format == DnnFormat::nchw && n.w.stride[0] == 3 * 3 * 2 && n.w.stride[1] == 3 * 2 && n.w.stride[3] == 1));
  CHECK((n.conv.compute == DnnType::f64 && n.conv.math == DnnMath::fma));
  CHECK(plan_conv(DType::f32, q, ConvPass::forward, true).conv.math == DnnMath::default_math);
  CHECK(plan_conv(DType::f32, q, ConvPass::forward, false).conv.math == DnnMath::fma);
}

TEST_CASE("library plans: cuDNN plans compute the engine's convolutions in NCHW and NHWC") {
  for (bool nhwc : {false, true}) {
    check_conv(conv_params(2, 3, 11, 10, 5, 3, 3, 1, 1, 1, 1, 1, 1, 1, nhwc), DType::f64, 1e-12);
    check_conv(conv_params(2, 4, 12, 9, 6, 3, 2, 2, 1, 1, 0, 1, 2, 2, nhwc), DType::f64, 1e-12);  // strided, grouped
    check_conv(conv_params(1, 6, 9, 8, 9, 2, 3, 1, 2, 2, 1, 2, 1, 3, nhwc), DType::f64, 1e-12);   // dilated, padded
    check_conv(conv_params(3, 4, 7, 5, 4, 1, 1, 2, 2, 0, 0, 1, 1, 4, nhwc), DType::f32, 1e-5);    // depthwise 1x1
    check_conv(conv_params(2, 4, 8, 6, 4, 3, 3, 1, 1, 1, 1, 1, 1, 2, nhwc), DType::f16, 3e-2);
  }
}

TEST_CASE("library plans: convolutions cuDNN cannot take (zero sizes) and bad parameters") {
  Conv2dParams p = conv_params(2, 0, 5, 5, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, true);
  ConvPlan plan = plan_conv(DType::f32, p, ConvPass::forward, false);
  REQUIRE(plan.path == ConvPath::bias_only);  // no input channels: y is the bias
  std::vector<float> y(size_t(2 * 3 * 25), NAN);
  const float bias[3] = {1, 2, 3};
  emu::run_conv_plan(plan, {nullptr, nullptr, nullptr, bias, y.data()});
  for (size_t i = 0; i < y.size(); ++i) CHECK(y[i] == bias[i % 3]);  // NHWC: channels innermost
  CHECK(plan_conv(DType::f32, p, ConvPass::backward_data, false).path == ConvPath::zero_output);
  p = conv_params(0, 2, 5, 5, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, false);
  CHECK(plan_conv(DType::f32, p, ConvPass::forward, false).path == ConvPath::nothing);
  plan = plan_conv(DType::f32, p, ConvPass::backward_filter, false);
  REQUIRE(plan.path == ConvPath::zero_output);  // an empty batch: the filter gradient is zeros
  std::vector<float> gw(size_t(3 * 2 * 9), NAN);
  emu::run_conv_plan(plan, {nullptr, nullptr, nullptr, nullptr, gw.data()});
  for (float v : gw) CHECK(v == 0.0f);

  p = conv_params(2, 4, 8, 8, 6, 3, 3, 1, 1, 1, 1, 1, 1, 2, false);
  p.oh = 7;
  CHECK_THROWS_WITH_AS(plan_conv(DType::f32, p, ConvPass::forward, false),
                       doctest::Contains("the output must be [8,8]: f32 input [2,4,8,8] weight [6,2,3,3]"), Error);
  p = conv_params(2, 4, 8, 8, 6, 3, 3, 1, 1, 1, 1, 1, 1, 3, false);
  CHECK_THROWS_WITH_AS(plan_conv(DType::f32, p, ConvPass::forward, false),
                       doctest::Contains("groups 3 must divide the input and output channels"), Error);
  p.groups = 2;
  CHECK_THROWS_WITH_AS(plan_conv(DType::i64, p, ConvPass::forward, false),
                       doctest::Contains("dtype i64 is not supported"), Error);
}

TEST_CASE("library plans: a convolution with more than 2^31-1 elements in one tensor is refused, naming it") {
  // Each dimension fits in int32 but a total does not: cudnnSetTensor4dDescriptor would refuse it with a bare
  // status. The plan is arithmetic, so nothing is allocated.
  Conv2dParams p = conv_params(1024, 64, 256, 256, 8, 1, 1, 1, 1, 0, 0, 1, 1, 1, false);  // x: 2^32 elements
  for (ConvPass pass : {ConvPass::forward, ConvPass::backward_data, ConvPass::backward_filter})
    CHECK_THROWS_WITH_AS(plan_conv(DType::f16, p, pass, false),
                         doctest::Contains("at most 2^31-1 elements per tensor, but the input has 4294967296, the "
                                           "weight 512 and the output 536870912: f16 input [1024,64,256,256]"),
                         Error);
  p = conv_params(1, 1, 256, 256, 65536, 1, 1, 1, 1, 0, 0, 1, 1, 1, true);  // y: 2^32 elements
  CHECK_THROWS_WITH_AS(plan_conv(DType::f32, p, ConvPass::forward, false),
                       doctest::Contains("the output 4294967296: f32 input [1,1,256,256] weight [65536,1,1,1]"), Error);
  p = conv_params(1, 65536, 1, 1, 65536, 1, 1, 1, 1, 0, 0, 1, 1, 1, false);  // w: 2^32 elements
  CHECK_THROWS_WITH_AS(plan_conv(DType::f32, p, ConvPass::backward_filter, false),
                       doctest::Contains("the weight 4294967296"), Error);
  p.groups = 2;  // w: 2^31 elements
  CHECK_THROWS_WITH_AS(plan_conv(DType::f32, p, ConvPass::backward_filter, false),
                       doctest::Contains("the weight 2147483648"), Error);
  p.groups = 4;  // 2^30 elements in each: cuDNN takes it
  CHECK(plan_conv(DType::f32, p, ConvPass::backward_filter, false).path == ConvPath::convolve);
}

TEST_CASE("library plans: conv.cu's algorithm caches key on benchmark mode, determinism, TF32 and the shape") {
  const Conv2dParams p = conv_params(2, 4, 8, 8, 6, 3, 3, 1, 1, 1, 1, 1, 1, 2, false);
  const ConvKey heuristic = conv_key(0, ConvPass::forward, DType::f32, p, {false, false, false});
  // set_cudnn_benchmark(true) after a shape ran on cuDNN's heuristic choice: that choice must not be reused.
  CHECK(heuristic != conv_key(0, ConvPass::forward, DType::f32, p, {false, false, true}));
  CHECK(heuristic != conv_key(0, ConvPass::forward, DType::f32, p, {true, false, false}));
  CHECK(heuristic != conv_key(0, ConvPass::forward, DType::f32, p, {false, true, false}));
  CHECK(heuristic != conv_key(1, ConvPass::forward, DType::f32, p, {false, false, false}));
  CHECK(heuristic != conv_key(0, ConvPass::backward_data, DType::f32, p, {false, false, false}));
  CHECK(heuristic != conv_key(0, ConvPass::forward, DType::f16, p, {false, false, false}));
  Conv2dParams q = p;
  q.nhwc = true;
  CHECK(heuristic != conv_key(0, ConvPass::forward, DType::f32, q, {false, false, false}));
  CHECK(heuristic == conv_key(0, ConvPass::forward, DType::f32, p, {false, false, false}));
}

TEST_CASE("library plans: batch norm over more than 2^31-1 elements takes the handwritten kernels, not cuDNN") {
  const double eps = 1e-5;
  CHECK_FALSE(cudnn_bn_fits(128, 64, 512 * 512, eps));  // [128,64,512,512]: 2^31 elements
  CHECK(cudnn_bn_fits(128, 64, 512 * 512 - 1, eps));
  CHECK_FALSE(cudnn_bn_fits(1, 1, INT32_MAX + int64_t(1), eps));
  CHECK(cudnn_bn_fits(1, 1, INT32_MAX, eps));
  CHECK_FALSE(cudnn_bn_fits(INT64_MAX / 2, 4, 3, eps));  // the product would overflow int64
  CHECK_FALSE(cudnn_bn_fits(1, INT32_MAX + int64_t(1), 1, eps));
  CHECK(cudnn_bn_fits(32, 64, 56 * 56, eps));
  CHECK(cudnn_bn_fits(0, 64, 1 << 30, eps));  // empty
}

// cuDNN refuses an eps below CUDNN_BN_MIN_EPSILON (check_cudnn_bn threw for it): such a batch norm takes
// the handwritten kernels, which take any eps, as the CPU does. The minimum itself is cuDNN's.
TEST_CASE("library plans: batch norm with an eps below cuDNN's minimum takes the handwritten kernels") {
  CHECK(cudnn_bn_fits(32, 64, 56 * 56, kCudnnBnMinEpsilon));
  CHECK(cudnn_bn_fits(32, 64, 56 * 56, 1e-3));
  CHECK_FALSE(cudnn_bn_fits(32, 64, 56 * 56, std::nextafter(kCudnnBnMinEpsilon, -1.0)));
  CHECK_FALSE(cudnn_bn_fits(32, 64, 56 * 56, kCudnnBnMinEpsilon - 1e-3));
  CHECK_FALSE(cudnn_bn_fits(32, 64, 56 * 56, std::nan("")));
  CHECK_FALSE(cudnn_bn_fits(0, 64, 1 << 30, -1.0));  // empty, but the eps decides first
}

TEST_CASE("library plans: which of cuDNN's candidate algorithms conv.cu may use") {
  const DnnCandidate fma{true, 1024, true, DnnMath::fma}, tensor{true, 1024, false, DnnMath::tensor_op};
  CHECK(usable(fma, DType::f32, true, false));
  CHECK_FALSE(usable(tensor, DType::f32, false, false));  // f32 stays f32 without TF32
  CHECK(usable(tensor, DType::f32, false, true));
  const DnnCandidate converting{true, 1024, true, DnnMath::tensor_op_allow_conversion};
  CHECK_FALSE(usable(converting, DType::f32, false, true));  // TF32 allowed, f16 rounding not
  CHECK_FALSE(usable(converting, DType::f64, false, true));
  CHECK(usable(converting, DType::f16, false, false));
  CHECK(usable(tensor, DType::f16, false, false));
  CHECK_FALSE(usable(tensor, DType::f16, true, false));                           // not deterministic
  CHECK_FALSE(usable({false, 0, true, DnnMath::fma}, DType::f32, false, false));  // failed in the search
  CHECK_FALSE(usable({true, kConvMaxWorkspace + 1, true, DnnMath::fma}, DType::f32, false, false));
}

TEST_CASE("library plans: the emulated backend routes 16-bit products as gemm.cu does and records why") {
  // The op table reaches the emulated table with 16-bit products converted to f32 (emu runtime.cpp
  // says why), so the 16-bit route is driven here through the table itself.
  const Backend& be = emu::emulated_cuda_backend();
  const auto calls = [](const char* what) {
    const auto m = emu::library_calls();
    const auto it = m.find(what);
    return it == m.end() ? int64_t(0) : it->second;
  };
  for (int64_t k : {32, 12}) {
    GemmCall g = call(DType::f16, false, true, 10, 24, k);
    g.batch = 3;
    g.stride_a = 10 * k;
    g.stride_b = 24 * k;
    g.stride_c = 10 * 24;
    Buf a(g.dtype, 3 * 10 * k), b(g.dtype, 3 * 24 * k), c(g.dtype, 3 * 240);
    a.fill_random(3 * 10 * k, 11);
    b.fill_random(3 * 24 * k, 12);
    const std::vector<double> want = reference_gemm(g, a, b, c);
    const int64_t taken = calls("tc_gemm dispatch: taken"),
                  refused = calls("tc_gemm dispatch: K is not a multiple of 8");
    be.gemm_batched(g.dtype, g.trans_a, g.trans_b, g.m, g.n, g.k, 1.0, a.data(), g.lda, g.stride_a, b.data(), g.ldb,
                    g.stride_b, 0.0, c.data(), g.ldc, g.stride_c, g.batch);
    CHECK(calls("tc_gemm dispatch: taken") == taken + (k == 32 ? 1 : 0));
    CHECK(calls("tc_gemm dispatch: K is not a multiple of 8") == refused + (k == 12 ? 1 : 0));
    double worst = 0;
    for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::abs(c.get(int64_t(i)) - want[i]));
    CHECK(worst <= 1e-2);
  }
  CHECK(be.native_channels_last);
}
