// Tests for tensors: dtypes and promotion, factories, views and their strides, copies and casts,
// printing, in-place updates and versions, error messages, and reproducible random numbers.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "kiln.h"
#include "test_util.h"
#include "kernels/common/philox.h"

using namespace kiln;
using kiln::testing::contains;
using kiln::testing::error_of;

namespace {

const DType kAll[] = {DType::f32, DType::f16, DType::bf16,    DType::f64, DType::i32,
                      DType::i64, DType::u8,  DType::boolean, DType::i8,  DType::i16};

std::vector<double> iota(int64_t n, double start = 0) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = start + double(i);
  return v;
}

Tensor arange_f(int64_t n, DType dt = DType::f32) { return from_vector(iota(n), Shape{n}, TensorOptions(dt)); }

// Checks every element against `want` within atol + rtol * |want|; NaN matches NaN.
void check_values(const Tensor& t, const std::vector<double>& want, double atol = 0, double rtol = 0) {
  const std::vector<double> got = t.to_vector();
  REQUIRE(got.size() == want.size());
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const bool ok = (std::isnan(want[i]) && std::isnan(got[i])) ||
                    std::abs(got[i] - want[i]) <= atol + rtol * std::abs(want[i]) || got[i] == want[i];
    if (!ok && ++bad <= 8) FAIL_CHECK("element ", i, ": got ", got[i], " want ", want[i], " (", t.type_str(), ")");
  }
}

bool same_storage(const Tensor& a, const Tensor& b) { return a.storage().get() == b.storage().get(); }

}  // namespace

// ---- dtypes -----------------------------------------------------------------------------------------

TEST_CASE("tensor: dtype sizes and names") {
  CHECK(dtype_size(DType::f32) == 4);
  CHECK(dtype_size(DType::f16) == 2);
  CHECK(dtype_size(DType::bf16) == 2);
  CHECK(dtype_size(DType::f64) == 8);
  CHECK(dtype_size(DType::i32) == 4);
  CHECK(dtype_size(DType::i64) == 8);
  CHECK(dtype_size(DType::u8) == 1);
  CHECK(dtype_size(DType::boolean) == 1);
  CHECK(dtype_size(DType::i8) == 1);
  CHECK(dtype_size(DType::i16) == 2);
  const char* names[] = {"f32", "f16", "bf16", "f64", "i32", "i64", "u8", "bool", "i8", "i16"};
  for (int i = 0; i < kNumDTypes; ++i) {
    CHECK(std::string(dtype_name(kAll[i])) == names[i]);
    CHECK(dtype_from_name(names[i]) == kAll[i]);
    std::ostringstream os;
    os << kAll[i];
    CHECK(os.str() == names[i]);
  }
  CHECK(dtype_from_name("float32") == DType::f32);
  CHECK(dtype_from_name("float16") == DType::f16);
  CHECK(dtype_from_name("bfloat16") == DType::bf16);
  CHECK(dtype_from_name("float64") == DType::f64);
  CHECK(dtype_from_name("int64") == DType::i64);
  CHECK(dtype_from_name("int8") == DType::i8);
  CHECK(dtype_from_name("int16") == DType::i16);
  CHECK_THROWS_AS(dtype_from_name("complex128"), Error);
  CHECK(is_floating(DType::bf16));
  CHECK(!is_floating(DType::i32));
  CHECK(is_integral(DType::boolean));
  CHECK(is_low_precision(DType::f16));
  CHECK(!is_low_precision(DType::f32));
  CHECK(sizeof(Half) == 2);
}

TEST_CASE("tensor: promote_types table") {
  // Rows and columns in the order f32 f16 bf16 f64 i32 i64 u8 bool i8 i16, written out by hand from
  // the lattice bool < (u8 | i8) < i16 < i32 < i64 < (f16 | bf16) < f32 < f64 with f16 + bf16 = f32
  // and u8 + i8 = i16.
  using D = DType;
  const D F = D::f32, H = D::f16, B = D::bf16, F64 = D::f64, I = D::i32, L = D::i64, U = D::u8, O = D::boolean,
          C = D::i8, S = D::i16;
  const D table[10][10] = {
      /* f32  */ {F, F, F, F64, F, F, F, F, F, F},
      /* f16  */ {F, H, F, F64, H, H, H, H, H, H},
      /* bf16 */ {F, F, B, F64, B, B, B, B, B, B},
      /* f64  */ {F64, F64, F64, F64, F64, F64, F64, F64, F64, F64},
      /* i32  */ {F, H, B, F64, I, L, I, I, I, I},
      /* i64  */ {F, H, B, F64, L, L, L, L, L, L},
      /* u8   */ {F, H, B, F64, I, L, U, U, S, S},
      /* bool */ {F, H, B, F64, I, L, U, O, C, S},
      /* i8   */ {F, H, B, F64, I, L, S, C, C, S},
      /* i16  */ {F, H, B, F64, I, L, S, S, S, S},
  };
  static_assert(kNumDTypes == 10);
  for (int i = 0; i < 10; ++i)
    for (int j = 0; j < 10; ++j) {
      CAPTURE(std::string(dtype_name(kAll[i])));
      CAPTURE(std::string(dtype_name(kAll[j])));
      CHECK(promote_types(kAll[i], kAll[j]) == table[i][j]);
    }
  CHECK(promote_types(D::f16, D::bf16) == D::f32);
  CHECK(promote_types(D::boolean, D::u8) == D::u8);
  CHECK(promote_types(D::i32, D::f16) == D::f16);
}

TEST_CASE("tensor: devices print and parse") {
  CHECK(kCPU.str() == "cpu");
  CHECK(cuda_device(1).str() == "cuda:1");
  CHECK(Device::parse("cpu") == kCPU);
  CHECK(Device::parse("cuda:3") == cuda_device(3));
  CHECK(Device::parse("cuda") == cuda_device(0));
  CHECK_THROWS_AS(Device::parse("tpu"), Error);
  CHECK(ones({2}).device() == kCPU);
}

// ---- factories ------------------------------------------------------------------------------------

TEST_CASE("tensor: empty, zeros, ones, full in every dtype") {
  for (DType dt : kAll) {
    CAPTURE(std::string(dtype_name(dt)));
    Tensor e = empty({2, 3}, dt);
    CHECK(e.shape() == Shape{2, 3});
    CHECK(e.strides() == Shape{3, 1});
    CHECK(e.dtype() == dt);
    CHECK(e.numel() == 6);
    CHECK(e.dim() == 2);
    CHECK(e.nbytes() == 6 * dtype_size(dt));
    CHECK(e.element_size() == dtype_size(dt));
    CHECK(e.is_contiguous());
    CHECK(e.offset() == 0);
    check_values(zeros({2, 3}, dt), std::vector<double>(6, 0.0));
    check_values(ones({4}, dt), std::vector<double>(4, 1.0));
    const double v = dt == DType::boolean ? 1.0 : 3.0;
    check_values(full({3, 1, 2}, v, dt), std::vector<double>(6, v));
  }
  check_values(full({2}, -2.5), {-2.5, -2.5});
  check_values(full({2}, 0.1, DType::f64), {0.1, 0.1});
  check_values(full({2}, 0.1, DType::f32), {double(0.1f), double(0.1f)});
  check_values(full({1}, 7.0, DType::boolean), {1.0});  // non-zero is true
  Tensor like = full({3, 2}, 4.0, DType::i32);
  CHECK(zeros_like(like).dtype() == DType::i32);
  CHECK(zeros_like(like).shape() == Shape{3, 2});
  check_values(ones_like(like), std::vector<double>(6, 1.0));
  check_values(full_like(like, 9), std::vector<double>(6, 9.0));
  CHECK(empty_like(like).shape() == Shape{3, 2});
  CHECK(empty_like(like).dtype() == DType::i32);
  CHECK(ones({2, 3}, TensorOptions(DType::f32).with_grad()).requires_grad());
  CHECK(!ones({2, 3}).requires_grad());
  CHECK_THROWS_AS(empty({2, -1}), Error);
}

TEST_CASE("tensor: arange with positive, negative and fractional steps") {
  Tensor a = arange(5);
  CHECK(a.dtype() == DType::i64);
  CHECK(a.shape() == Shape{5});
  check_values(a, {0, 1, 2, 3, 4});
  check_values(arange(2.0, 7.0, 2.0), {2, 4, 6});
  check_values(arange(1.0, 2.0, 0.25, DType::f32), {1, 1.25, 1.5, 1.75});
  Tensor n = arange(5.0, 0.0, -1.5, DType::f64);
  CHECK(n.shape() == Shape{4});  // ceil(-5 / -1.5) = 4
  check_values(n, {5, 3.5, 2, 0.5});
  check_values(arange(3.0, -3.0, -2.0), {3, 1, -1});
  Tensor f = arange(0.0, 1.0, 0.1, DType::f64);
  CHECK(f.numel() == 10);
  std::vector<double> want;
  for (int i = 0; i < 10; ++i) want.push_back(0.1 * i);
  check_values(f, want, 1e-12);
  check_values(arange(-1.0, 1.0, 0.5, DType::f32), {-1, -0.5, 0, 0.5});
  CHECK(arange(0.0, 1.0, 0.3, DType::f32).numel() == 4);  // ceil(3.33)
  CHECK(arange(3.0, 3.0).numel() == 0);
  // A step leading away from the end is an error, as PyTorch's (it was an empty range).
  CHECK_THROWS_WITH_AS(arange(0.0, -3.0), doctest::Contains("inconsistent with step sign"), Error);
  CHECK_THROWS_WITH_AS(arange(0.0, 3.0, -1.0),
                       doctest::Contains("arange: the step -1 leads from start 0 away from end 3"), Error);
  CHECK(arange(3.0, 3.0, -1.0).numel() == 0);
  CHECK(arange(int64_t(0)).numel() == 0);
  check_values(arange(int64_t(4), TensorOptions(DType::f16)), {0, 1, 2, 3});
  CHECK(arange(int64_t(4), TensorOptions(DType::f16)).dtype() == DType::f16);
  CHECK_THROWS_AS(arange(0.0, 1.0, 0.0), Error);
}

TEST_CASE("tensor: eye, scalar_tensor, from_vector, from_blob_copy") {
  Tensor e = eye(3);
  CHECK(e.shape() == Shape{3, 3});
  CHECK(e.dtype() == DType::f32);
  check_values(e, {1, 0, 0, 0, 1, 0, 0, 0, 1});
  check_values(eye(2, 4), {1, 0, 0, 0, 0, 1, 0, 0});
  check_values(eye(3, 2, DType::i64), {1, 0, 0, 1, 0, 0});
  CHECK(eye(0).numel() == 0);
  CHECK(eye(0).shape() == Shape{0, 0});

  Tensor s = scalar_tensor(2.5);
  CHECK(s.dim() == 0);
  CHECK(s.shape().empty());
  CHECK(s.numel() == 1);
  CHECK(s.item<double>() == 2.5);
  CHECK(scalar_tensor(-4, DType::i32).item<int>() == -4);

  Tensor v = from_vector({1, 2, 3, 4, 5, 6}, {3, 2}, DType::f64);
  CHECK(v.shape() == Shape{3, 2});
  CHECK(v.dtype() == DType::f64);
  CHECK(v.data<double>()[3] == 4.0);
  check_values(v, {1, 2, 3, 4, 5, 6});
  check_values(from_vector({1.5, -2.5}, {2}, DType::i32), {1, -2});  // converted like a C++ cast
  check_values(from_vector({0, 2, -1}, {3}, DType::boolean), {0, 1, 1});
  CHECK_THROWS_AS(from_vector({1, 2, 3}, {2, 2}), Error);
  CHECK(from_vector({}, {0}).numel() == 0);

  const int32_t raw[] = {7, 8, 9, 10};
  Tensor b = from_blob_copy(raw, {2, 2});
  CHECK(b.dtype() == DType::i32);
  check_values(b, {7, 8, 9, 10});
  CHECK_THROWS_AS(b.data<float>(), Error);
}

// ---- empty and 0-dim tensors ------------------------------------------------------------------------

TEST_CASE("tensor: 0-element tensors through ops") {
  Tensor a = zeros({0, 3});
  CHECK(a.numel() == 0);
  CHECK(a.shape() == Shape{0, 3});
  CHECK(a.to_vector().empty());
  CHECK((a + a).shape() == Shape{0, 3});
  CHECK((a * 2.0).shape() == Shape{0, 3});
  CHECK(add(a, ones({3})).shape() == Shape{0, 3});  // broadcast with an empty dim
  CHECK(add(a, ones({1, 1})).shape() == Shape{0, 3});
  for (Tensor u : {neg(a), abs(a), sign(a), exp(a), log(a), sqrt(a), rsqrt(a), tanh(a), sigmoid(a), relu(a), gelu(a),
                   gelu(a, GeluApprox::tanh), pow(a, 2.0), pow(a, a), clamp(a, 0.0, 1.0), maximum(a, a),
                   minimum(a, a), sub(a, a), div(a, a), cast(a, DType::f64), a.clone(), a.contiguous(),
                   a.to(DType::i32), where(eq(a, a), a, a)}) {
    CHECK(u.shape() == Shape{0, 3});
    CHECK(u.numel() == 0);
  }
  for (Tensor c : {eq(a, a), ne(a, a), lt(a, a), le(a, a), gt(a, a), ge(a, a), logical_and(a, a), logical_or(a, a),
                   logical_not(a)}) {
    CHECK(c.dtype() == DType::boolean);
    CHECK(c.shape() == Shape{0, 3});
  }
  // Reductions: over the empty dim the sum is 0; over the other dim the result is empty.
  Tensor s_all = sum(a);
  CHECK(s_all.dim() == 0);
  CHECK(s_all.item<double>() == 0.0);
  Tensor s0 = sum(a, {0});
  CHECK(s0.shape() == Shape{3});
  check_values(s0, {0, 0, 0});
  CHECK(sum(a, {1}).shape() == Shape{0});
  CHECK(sum(a, {0}, true).shape() == Shape{1, 3});
  CHECK(std::isnan(mean(a).item<double>()));  // 0 / 0
  CHECK(amax(a, {1}).shape() == Shape{0});
  CHECK_THROWS_AS(amax(a), Error);  // no largest element, as torch.amax refuses (docs/ops.md)
  CHECK_THROWS_AS(max(a, 0), Error);
  CHECK(max(a, 1).values.shape() == Shape{0});
  CHECK(sum(zeros({0}, DType::i32)).dtype() == DType::i64);
  // Matmul with empty dims: an empty inner dim gives zeros.
  CHECK(matmul(zeros({0, 3}), ones({3, 4})).shape() == Shape{0, 4});
  Tensor z = matmul(ones({2, 0}), ones({0, 3}));
  CHECK(z.shape() == Shape{2, 3});
  check_values(z, std::vector<double>(6, 0.0));
  CHECK(matmul(ones({5, 2, 0}), ones({0, 3})).shape() == Shape{5, 2, 3});
  check_values(matmul(ones({5, 2, 0}), ones({0, 3})), std::vector<double>(30, 0.0));
  // Views of empty tensors.
  CHECK(a.reshape({3, 0}).shape() == Shape{3, 0});
  CHECK(a.view({-1}).shape() == Shape{0});
  CHECK(a.t().shape() == Shape{3, 0});
  CHECK(a.transpose(0, 1).contiguous().shape() == Shape{3, 0});
  CHECK(a.unsqueeze(0).shape() == Shape{1, 0, 3});
  CHECK(a.slice(1, 0, 3, 2).shape() == Shape{0, 2});
  CHECK(a.narrow(1, 1, 2).shape() == Shape{0, 2});
  CHECK(ones({3}).slice(0, 2, 2).numel() == 0);
  CHECK(a.flatten().shape() == Shape{0});
  CHECK(zeros({0}).expand({2, 0}).shape() == Shape{2, 0});
  CHECK(contains(a.str(), "[0,3]"));
  Tensor dst = zeros({0, 3});
  dst.fill_(5.0).add_(a).mul_(2.0).copy_(a);
  CHECK(dst.numel() == 0);
  // Random draws of no elements consume nothing.
  Generator g(9);
  CHECK(rand({0}, {}, &g).numel() == 0);
  CHECK(randn({4, 0}, {}, &g).shape() == Shape{4, 0});
  CHECK(g.offset == 0);
}

TEST_CASE("tensor: 0-dim tensors") {
  Tensor s = scalar_tensor(3.0);
  CHECK(s.dim() == 0);
  CHECK(s.strides().empty());
  CHECK(s.is_contiguous());
  CHECK(s.item<float>() == 3.0f);
  CHECK(s.to_vector() == std::vector<double>{3.0});
  Tensor b = s + ones({2, 2});
  CHECK(b.shape() == Shape{2, 2});
  check_values(b, {4, 4, 4, 4});
  Tensor b2 = from_vector({1, 2, 3}, {3}) * s;
  CHECK(b2.shape() == Shape{3});
  check_values(b2, {3, 6, 9});
  CHECK((s * s).dim() == 0);
  CHECK((s * s).item<double>() == 9.0);
  CHECK(exp(s).dim() == 0);
  CHECK(sum(s).dim() == 0);
  CHECK(sum(s).item<double>() == 3.0);
  CHECK(sum(s, {0}).dim() == 0);  // a 0-dim tensor accepts dim 0
  CHECK(mean(s).item<double>() == 3.0);
  CHECK(amax(s).item<double>() == 3.0);
  CHECK(s.view({1}).shape() == Shape{1});
  CHECK(s.reshape({1, 1}).shape() == Shape{1, 1});
  CHECK(ones({1, 1}).reshape({}).dim() == 0);
  CHECK(ones({1}).view(Shape{}).dim() == 0);
  CHECK(s.unsqueeze(0).shape() == Shape{1});
  CHECK(s.flatten().shape() == Shape{1});
  CHECK(s.t().dim() == 0);
  CHECK(s.squeeze().dim() == 0);
  Tensor e = s.expand({2, 3});
  CHECK(e.shape() == Shape{2, 3});
  CHECK(e.strides() == Shape{0, 0});
  check_values(e, std::vector<double>(6, 3.0));
  CHECK(ones({1, 1, 1}).squeeze().dim() == 0);
  CHECK(contains(s.str(), "3"));
  CHECK(s.clone().dim() == 0);
  CHECK(s.to(DType::i32).item<int>() == 3);
  CHECK(where(scalar_tensor(1, DType::boolean), s, scalar_tensor(-1.0)).item<double>() == 3.0);
}

// ---- views ------------------------------------------------------------------------------------------

TEST_CASE("tensor: views share storage") {
  Tensor a = arange_f(24).view({2, 3, 4});
  CHECK(a.strides() == Shape{12, 4, 1});
  Tensor v = a.view({4, -1});
  CHECK(v.shape() == Shape{4, 6});
  CHECK(v.strides() == Shape{6, 1});
  CHECK(same_storage(a, v));
  CHECK(same_storage(a, a.permute({2, 0, 1})));
  CHECK(same_storage(a, a.transpose(0, 2)));
  CHECK(same_storage(a, a.narrow(1, 1, 2)));
  CHECK(same_storage(a, a.slice(2, 0, 4, 2)));
  CHECK(same_storage(a, a.select(0, 1)));
  CHECK(same_storage(a, a.unsqueeze(1)));
  CHECK(same_storage(a, a.flatten()));
  CHECK(same_storage(a, a.reshape({6, 4})));
  CHECK(same_storage(a, a.detach()));
  // A write through a view shows in the base, and the other way round.
  a.select(0, 1).select(0, 2).fill_(-1.0);  // a[1, 2, :]
  std::vector<double> want = iota(24);
  for (int k = 0; k < 4; ++k) want[size_t(12 + 8 + k)] = -1.0;
  check_values(a, want);
  a.narrow(2, 3, 1).fill_(100.0);  // a[:, :, 3]
  for (int i = 0; i < 6; ++i) want[size_t(i * 4 + 3)] = 100.0;
  check_values(v, want);
}

TEST_CASE("tensor: view geometry") {
  Tensor a = arange_f(24).view({2, 3, 4});
  SUBCASE("flatten") {
    Tensor f = a.flatten(1, 2);
    CHECK(f.shape() == Shape{2, 12});
    CHECK(f.strides() == Shape{12, 1});
    CHECK(a.flatten().shape() == Shape{24});
    CHECK(a.flatten(0, 1).shape() == Shape{6, 4});
    CHECK(a.flatten(-2, -1).shape() == Shape{2, 12});
    check_values(a.flatten(), iota(24));
  }
  SUBCASE("permute") {
    Tensor p = a.permute({2, 0, 1});
    CHECK(p.shape() == Shape{4, 2, 3});
    CHECK(p.strides() == Shape{1, 12, 4});
    CHECK(!p.is_contiguous());
    std::vector<double> want;
    for (int k = 0; k < 4; ++k)
      for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 3; ++j) want.push_back(i * 12 + j * 4 + k);
    check_values(p, want);
    CHECK(a.permute({-1, 0, 1}).shape() == Shape{4, 2, 3});
  }
  SUBCASE("transpose and t") {
    Tensor tr = a.transpose(0, 2);
    CHECK(tr.shape() == Shape{4, 3, 2});
    CHECK(tr.strides() == Shape{1, 4, 12});
    CHECK(a.transpose(-1, -3).strides() == Shape{1, 4, 12});
    Tensor m = arange_f(6).view({2, 3});
    Tensor mt = m.t();
    CHECK(mt.shape() == Shape{3, 2});
    CHECK(mt.strides() == Shape{1, 3});
    check_values(mt, {0, 3, 1, 4, 2, 5});
    CHECK(arange_f(3).t().shape() == Shape{3});
  }
  SUBCASE("narrow") {
    Tensor n = a.narrow(1, 1, 2);
    CHECK(n.shape() == Shape{2, 2, 4});
    CHECK(n.strides() == Shape{12, 4, 1});
    CHECK(n.offset() == 4);
    std::vector<double> want;
    for (int i = 0; i < 2; ++i)
      for (int j = 1; j < 3; ++j)
        for (int k = 0; k < 4; ++k) want.push_back(i * 12 + j * 4 + k);
    check_values(n, want);
    CHECK(a.narrow(-1, 2, 2).offset() == 2);
    CHECK_THROWS_AS(a.narrow(1, 2, 2), Error);
  }
  SUBCASE("slice with step") {
    Tensor s = a.slice(2, 0, 4, 2);
    CHECK(s.shape() == Shape{2, 3, 2});
    CHECK(s.strides() == Shape{12, 4, 2});
    CHECK(s.offset() == 0);
    Tensor s1 = a.slice(2, 1, 4, 2);
    CHECK(s1.shape() == Shape{2, 3, 2});
    CHECK(s1.offset() == 1);
    std::vector<double> want;
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 3; ++j)
        for (int k = 1; k < 4; k += 2) want.push_back(i * 12 + j * 4 + k);
    check_values(s1, want);
    Tensor s2 = a.slice(1, 0, 3, 2);  // rows 0 and 2
    CHECK(s2.shape() == Shape{2, 2, 4});
    CHECK(s2.strides() == Shape{12, 8, 1});
    Tensor s3 = arange_f(10).slice(0, 1, 8, 3);  // 1, 4, 7
    CHECK(s3.shape() == Shape{3});
    check_values(s3, {1, 4, 7});
    check_values(arange_f(10).slice(0, -3, 10), {7, 8, 9});  // negative start counts from the end
    check_values(arange_f(10).slice(0, 8, 100), {8, 9});      // end clamps
    check_values(arange_f(10).slice(0, 2, 9, 3).slice(0, 1, 3), {5, 8});  // slice of a slice
  }
  SUBCASE("select") {
    Tensor s = a.select(1, 2);
    CHECK(s.shape() == Shape{2, 4});
    CHECK(s.strides() == Shape{12, 1});
    CHECK(s.offset() == 8);
    check_values(s, {8, 9, 10, 11, 20, 21, 22, 23});
    Tensor last = a.select(-1, -1);
    CHECK(last.shape() == Shape{2, 3});
    check_values(last, {3, 7, 11, 15, 19, 23});
    CHECK_THROWS_AS(a.select(0, 2), Error);
    CHECK(a.select(0, 1).select(0, 1).select(0, 1).item<double>() == 17.0);
  }
  SUBCASE("expand") {
    Tensor c = from_vector({1, 2, 3}, {3, 1});
    Tensor e = c.expand({2, 3, 4});
    CHECK(e.shape() == Shape{2, 3, 4});
    CHECK(e.strides() == Shape{0, 1, 0});
    CHECK(same_storage(c, e));
    std::vector<double> want;
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 3; ++j)
        for (int k = 0; k < 4; ++k) want.push_back(j + 1);
    check_values(e, want);
    CHECK(c.expand({-1, 5}).shape() == Shape{3, 5});
    CHECK_THROWS_AS(c.expand({2, 4}), Error);
    CHECK(!e.is_contiguous());
    Tensor ec = e.contiguous();
    CHECK(ec.strides() == Shape{12, 4, 1});
    check_values(ec, want);
  }
  SUBCASE("squeeze and unsqueeze") {
    Tensor b = arange_f(6).view({2, 1, 3});
    CHECK(b.squeeze().shape() == Shape{2, 3});
    CHECK(b.squeeze(1).shape() == Shape{2, 3});
    CHECK(b.squeeze(1).strides() == Shape{3, 1});
    CHECK(b.squeeze(-2).shape() == Shape{2, 3});
    CHECK(b.squeeze(0).shape() == Shape{2, 1, 3});  // not size 1: unchanged
    CHECK(b.unsqueeze(0).shape() == Shape{1, 2, 1, 3});
    CHECK(b.unsqueeze(-1).shape() == Shape{2, 1, 3, 1});
    CHECK(b.unsqueeze(3).shape() == Shape{2, 1, 3, 1});
    CHECK(b.unsqueeze(2).shape() == Shape{2, 1, 1, 3});
    CHECK(b.unsqueeze(0).is_contiguous());
    check_values(b.unsqueeze(-1).squeeze(), iota(6));
    CHECK(same_storage(b, b.squeeze()));
    // Unsqueezing a transposed view keeps it a view with the old strides.
    Tensor t = arange_f(6).view({2, 3}).t();
    Tensor tu = t.unsqueeze(1);
    CHECK(tu.shape() == Shape{3, 1, 2});
    CHECK(tu.stride(0) == 1);
    CHECK(tu.stride(2) == 3);
    check_values(tu, {0, 3, 1, 4, 2, 5});
  }
  SUBCASE("as_strided") {
    Tensor base = arange_f(10);
    Tensor w = base.as_strided({3, 3}, {1, 1}, 0);  // sliding windows
    CHECK(w.shape() == Shape{3, 3});
    CHECK(w.strides() == Shape{1, 1});
    check_values(w, {0, 1, 2, 1, 2, 3, 2, 3, 4});
    Tensor w2 = base.as_strided({2, 2}, {4, 2}, 1);
    check_values(w2, {1, 3, 5, 7});
    CHECK(w2.offset() == 1);
    CHECK(same_storage(base, w2));
    CHECK_THROWS_AS(base.as_strided({2, 2}, {8, 2}, 1), Error);  // reaches element 11
    CHECK_THROWS_AS(base.as_strided({2}, {1, 1}, 0), Error);
  }
  SUBCASE("size and stride accessors") {
    CHECK(a.size(0) == 2);
    CHECK(a.size(-1) == 4);
    CHECK(a.stride(-1) == 1);
    CHECK(a.stride(0) == 12);
    CHECK_THROWS_AS(a.size(3), Error);
    CHECK_THROWS_AS(a.size(-4), Error);
  }
}

TEST_CASE("tensor: reshape is a view when it can be, a copy otherwise") {
  Tensor a = arange_f(12).view({3, 4});
  Tensor r = a.reshape({2, 6});
  CHECK(same_storage(a, r));
  CHECK(r.strides() == Shape{6, 1});
  Tensor t = a.t();  // [4,3] strides [1,4]
  Tensor rc = t.reshape({12});
  CHECK(!same_storage(t, rc));
  CHECK(rc.is_contiguous());
  check_values(rc, {0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11});
  CHECK(t.reshape({2, 2, 3}).shape() == Shape{2, 2, 3});
  // Splitting a dim of a transposed tensor is possible without a copy.
  Tensor tv = t.view({2, 2, 3});
  CHECK(same_storage(t, tv));
  CHECK(tv.strides() == Shape{2, 1, 4});
  check_values(tv, t.to_vector());
  // Merging dims that are not contiguous with each other is not.
  CHECK_THROWS_AS(t.view({12}), Error);
  CHECK_THROWS_AS(t.view({3, 4}), Error);
  CHECK_THROWS_AS(a.slice(1, 0, 3).view({9}), Error);  // rows of 3 with row stride 4
  CHECK(!same_storage(a, a.slice(1, 0, 3).reshape({9})));
  check_values(a.slice(1, 0, 3).reshape({9}), {0, 1, 2, 4, 5, 6, 8, 9, 10});
  // Every other column: row stride 4 = 2 * column stride 2, so the dims merge without a copy.
  Tensor ev = a.slice(1, 0, 4, 2).view({6});
  CHECK(same_storage(a, ev));
  CHECK(ev.strides() == Shape{2});
  check_values(ev, {0, 2, 4, 6, 8, 10});
  // Merging dims that stay contiguous inside a sliced tensor works as a view.
  Tensor b = arange_f(24).view({4, 6}).narrow(0, 1, 2);  // rows 1..2, each contiguous, row stride 6
  Tensor bv = b.view({2, 2, 3});
  CHECK(same_storage(b, bv));
  CHECK(bv.offset() == 6);
  check_values(bv, iota(12, 6));
  CHECK_THROWS_AS(a.view({5, -1}), Error);
  CHECK_THROWS_AS(a.view({-1, -1}), Error);
  CHECK_THROWS_AS(a.reshape({7}), Error);
  CHECK(a.view({-1}).shape() == Shape{12});
  CHECK(a.view({2, -1, 3}).shape() == Shape{2, 2, 3});
}

TEST_CASE("tensor: contiguous and clone") {
  Tensor a = arange_f(6).view({2, 3});
  CHECK(same_storage(a, a.contiguous()));
  Tensor t = a.t();
  Tensor c = t.contiguous();
  CHECK(!same_storage(t, c));
  CHECK(c.strides() == Shape{2, 1});
  CHECK(c.is_contiguous());
  check_values(c, {0, 3, 1, 4, 2, 5});
  Tensor cl = a.clone();
  CHECK(!same_storage(a, cl));
  check_values(cl, iota(6));
  cl.fill_(7);
  check_values(a, iota(6));  // the original is untouched
  Tensor sc = arange_f(10).slice(0, 1, 10, 4).clone();  // 1, 5, 9
  CHECK(sc.is_contiguous());
  CHECK(sc.offset() == 0);
  check_values(sc, {1, 5, 9});
  for (DType dt : kAll) {
    Tensor x = full({2, 2}, 1, dt).t().clone();
    CHECK(x.dtype() == dt);
  }
}

// ---- casts ------------------------------------------------------------------------------------------

TEST_CASE("tensor: to(dtype) for all 100 dtype pairs") {
  const std::vector<double> vals = {0, 1, 2, 3, 100, 7, 0, 42};
  const std::vector<double> bools = {0, 1, 1, 1, 1, 1, 0, 1};
  for (DType from : kAll) {
    const std::vector<double>& src = from == DType::boolean ? bools : vals;
    Tensor x = from_vector(src, {2, 4}, from);
    CHECK(x.dtype() == from);
    for (DType to : kAll) {
      CAPTURE(std::string(dtype_name(from)));
      CAPTURE(std::string(dtype_name(to)));
      Tensor y = x.to(to);
      CHECK(y.dtype() == to);
      CHECK(y.shape() == Shape{2, 4});
      check_values(y, to == DType::boolean ? bools : src);
      // The same through a transposed (strided) source.
      Tensor yt = x.t().to(to);
      CHECK(yt.shape() == Shape{4, 2});
      std::vector<double> want;
      const std::vector<double>& w = to == DType::boolean ? bools : src;
      for (int j = 0; j < 4; ++j)
        for (int i = 0; i < 2; ++i) want.push_back(w[size_t(i * 4 + j)]);
      check_values(yt, want);
    }
  }
}

TEST_CASE("tensor: casts round floats correctly") {
  Tensor x = from_vector({0.1, 1.0 / 3, 1e-5, 70000.0, -0.0, 2.75, -2.75, 65504.0}, {8}, DType::f64);
  Tensor h = x.to(DType::f16);
  const Half* hp = h.data<Half>();
  CHECK(hp[0].bits == 0x2e66);
  CHECK(hp[1].bits == 0x3555);
  CHECK(hp[2].bits == f32_to_f16_bits(1e-5f));
  CHECK(hp[3].bits == 0x7c00);  // overflow to inf
  CHECK(hp[4].bits == 0x8000);  // -0 keeps its sign
  CHECK(hp[7].bits == 0x7bff);
  Tensor b = x.to(DType::bf16);
  const BFloat16* bp = b.data<BFloat16>();
  CHECK(bp[0].bits == 0x3dcd);
  CHECK(bp[1].bits == 0x3eab);
  CHECK(bp[4].bits == 0x8000);
  Tensor f = x.to(DType::f32);
  CHECK(f.data<float>()[0] == 0.1f);
  CHECK(f.data<float>()[1] == float(1.0 / 3));
  // Float to integer truncates toward zero, like a C++ conversion.
  Tensor i = x.narrow(0, 5, 2).to(DType::i64);
  check_values(i, {2, -2});
  check_values(x.narrow(0, 5, 2).to(DType::i32), {2, -2});
  // Everything non-zero is true, including NaN and -0.0 is false.
  check_values(from_vector({0.0, -0.0, 0.5, -3, std::nan("")}, {5}).to(DType::boolean), {0, 0, 1, 1, 1});
}

TEST_CASE("tensor: f32 -> f16 and bf16 casts match the scalar conversions, contiguous and strided") {
  std::mt19937 rng(99);
  std::vector<double> vals;
  std::uniform_real_distribution<float> u(-70000.0f, 70000.0f);
  for (int i = 0; i < 997; ++i) vals.push_back(double(u(rng)));
  for (int i = 0; i < 500; ++i) vals.push_back(double(f32_from_bits(static_cast<uint32_t>(rng()) & 0x7fffffffu) *
                                                      (i % 2 ? 1.0f : -1.0f)));
  // Exact ties and subnormals.
  for (int i = 0; i < 32; ++i) vals.push_back(1.0 + std::ldexp(1.0, -11) * (2 * i + 1));
  for (int i = 0; i < 32; ++i) vals.push_back(std::ldexp(1.0, -25) * (2 * i + 1));
  // bf16 ties (the low 16 bits exactly half way), with even and odd upper halves.
  for (uint32_t i = 0; i < 32; ++i) vals.push_back(double(f32_from_bits(0x3f808000u + (i << 16))));
  const int64_t n = int64_t(vals.size());
  for (double& v : vals)
    if (std::isnan(v)) v = 0.5;
  Tensor x = from_vector(vals, {n}, DType::f32);
  Tensor h = x.to(DType::f16);
  Tensor hs = x.slice(0, 1, n, 2).to(DType::f16);
  Tensor b = x.to(DType::bf16);
  const float* xp = x.data<float>();
  int bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (h.data<Half>()[i].bits != f32_to_f16_bits(xp[i]) && ++bad < 5) FAIL_CHECK("f16 element ", i, " of ", xp[i]);
    if (b.data<BFloat16>()[i].bits != f32_to_bf16_bits(xp[i]) && ++bad < 5) FAIL_CHECK("bf16 element ", i);
  }
  for (int64_t i = 0; i < hs.numel(); ++i)
    if (hs.data<Half>()[i].bits != f32_to_f16_bits(xp[1 + 2 * i]) && ++bad < 5) FAIL_CHECK("strided f16 element ", i);
  CHECK(bad == 0);
  // And back: f16 -> f32 is exact.
  Tensor back = h.to(DType::f32);
  for (int64_t i = 0; i < n; ++i)
    if (back.data<float>()[i] != f16_bits_to_f32(h.data<Half>()[i].bits) && !std::isnan(back.data<float>()[i]) &&
        ++bad < 5)
      FAIL_CHECK("f16 -> f32 element ", i);
  // bf16 -> f32 is exact too.
  Tensor bback = b.to(DType::f32);
  for (int64_t i = 0; i < n; ++i)
    if (f32_bits(bback.data<float>()[i]) != uint32_t(b.data<BFloat16>()[i].bits) << 16 && ++bad < 5)
      FAIL_CHECK("bf16 -> f32 element ", i);
  CHECK(bad == 0);
}

TEST_CASE("tensor: item") {
  for (DType dt : kAll) {
    CAPTURE(std::string(dtype_name(dt)));
    const double v = dt == DType::boolean ? 1.0 : 5.0;
    CHECK(full({1}, v, dt).item<double>() == v);
    CHECK(full({1, 1, 1}, v, dt).item_double() == v);
  }
  CHECK(scalar_tensor(2.5).item<float>() == 2.5f);
  CHECK(scalar_tensor(2.5).item<int>() == 2);
  CHECK(scalar_tensor(-1.5, DType::f16).item<double>() == -1.5);
  CHECK(arange_f(5).select(0, 3).item<double>() == 3.0);
  CHECK(arange_f(5).slice(0, 4, 5).item<double>() == 4.0);
  const std::string msg = error_of([] { (void)ones({2, 3}).item<double>(); });
  CHECK(contains(msg, "[2,3]"));
  CHECK_THROWS_AS((void)zeros({0}).item<double>(), Error);
}

// ---- printing -----------------------------------------------------------------------------------

TEST_CASE("tensor: printing shows dtype, device, shape and values") {
  Tensor a = from_vector({1.5, -2.25, 3, 4, 5, 6}, {2, 3});
  const std::string s = a.str();
  CHECK(contains(s, "f32"));
  CHECK(contains(s, "cpu"));
  CHECK(contains(s, "[2,3]"));
  CHECK(contains(s, "1.5"));
  CHECK(contains(s, "-2.25"));
  CHECK(contains(s, "6"));
  CHECK(!contains(s, "..."));
  std::ostringstream os;
  os << a;
  CHECK(os.str() == s);
  CHECK(a.type_str() == "f32 cpu [2,3]");
  CHECK(ones({4}, DType::i64).type_str() == "i64 cpu [4]");
  CHECK(scalar_tensor(1).type_str() == "f32 cpu []");

  Tensor i = from_vector({123, 4567}, {2}, DType::i32);
  CHECK(contains(i.str(), "i32"));
  CHECK(contains(i.str(), "4567"));
  CHECK(contains(i.str(), "123"));

  // Integer elements print exactly (they went through a double: 2^62 + 1 printed as 4611686018427387904).
  std::vector<int64_t> wide = {(int64_t(1) << 62) + 1, std::numeric_limits<int64_t>::max(),
                               std::numeric_limits<int64_t>::min(), -3};
  const Tensor w = from_blob(wide.data(), {4}, DType::i64, [](void*) {});
  CHECK(contains(w.str(), "[4611686018427387905, 9223372036854775807, -9223372036854775808, -3]"));
  CHECK(contains(w.select(0, 1).str(), "[9223372036854775807]"));  // 0-dim
  CHECK(contains(from_vector({-7, 2147483647}, {2}, DType::i32).str(), "[-7, 2147483647]"));
  CHECK(contains(from_vector({0, 255}, {2}, DType::u8).str(), "[0, 255]"));
  CHECK(contains(from_vector({1, 0}, {2}, DType::boolean).str(), "[true, false]"));

  // A large tensor shows its ends and elides the middle.
  Tensor big = arange(int64_t(1000)).to(DType::f64);
  const std::string b = big.str();
  CHECK(contains(b, "..."));
  CHECK(contains(b, "[1000]"));
  CHECK(contains(b, "999"));
  CHECK(contains(b, "998"));
  CHECK(!contains(b, "500"));
  CHECK(b.size() < 400);
  Tensor big2 = arange(int64_t(40000)).view({200, 200});
  const std::string b2 = big2.str();
  CHECK(contains(b2, "..."));
  CHECK(contains(b2, "39999"));
  CHECK(!contains(b2, "20100"));
  CHECK(b2.size() < 2000);
  // Bigger limits show more.
  CHECK(!contains(arange(int64_t(10)).str(20), "..."));
  // Non-contiguous tensors print in logical order.
  std::string t = from_vector({5, 6, 7, 8}, {2, 2}, DType::i64).t().str();
  t = t.substr(t.find(']') + 1);  // past the shape in the header
  CHECK(t.find('7') != std::string::npos);
  CHECK(t.find('7') < t.find('6'));
}

// ---- in-place ops -------------------------------------------------------------------------------

TEST_CASE("tensor: in-place ops write values and bump version") {
  Tensor a = zeros({2, 3});
  Tensor view = a.select(0, 1);
  uint64_t v = a.version();
  a.fill_(2.0);
  CHECK(a.version() > v);
  check_values(a, std::vector<double>(6, 2.0));
  v = a.version();
  a.zero_();
  CHECK(a.version() > v);
  check_values(a, std::vector<double>(6, 0.0));
  v = a.version();
  a.add_(from_vector({1, 2, 3}, {3}), 2.0);  // broadcast with alpha
  CHECK(a.version() > v);
  check_values(a, {2, 4, 6, 2, 4, 6});
  v = a.version();
  a.mul_(from_vector({1, -1}, {2, 1}));
  CHECK(a.version() > v);
  check_values(a, {2, 4, 6, -2, -4, -6});
  v = a.version();
  a.mul_(0.5);
  CHECK(a.version() > v);
  check_values(a, {1, 2, 3, -1, -2, -3});
  v = a.version();
  a.copy_(from_vector({9, 8, 7, 6, 5, 4}, {2, 3}, DType::f64));  // converts the dtype
  CHECK(a.version() > v);
  check_values(a, {9, 8, 7, 6, 5, 4});
  // A write through a view bumps the shared version seen by the base.
  v = a.version();
  view.fill_(0.0);
  CHECK(a.version() > v);
  CHECK(view.version() == a.version());
  check_values(a, {9, 8, 7, 0, 0, 0});
  // copy_ into a transposed view writes the transposed places.
  Tensor m = zeros({2, 3});
  m.t().copy_(from_vector({1, 2, 3, 4, 5, 6}, {3, 2}));
  check_values(m, {1, 3, 5, 2, 4, 6});
  // copy_ broadcasts the source.
  Tensor r = zeros({2, 2});
  r.copy_(from_vector({7, 8}, {2}));
  check_values(r, {7, 8, 7, 8});
  // In-place add on a strided slice touches only its elements.
  Tensor s = zeros({6});
  s.slice(0, 0, 6, 2).add_(ones({3}));
  check_values(s, {1, 0, 1, 0, 1, 0});
  // Out-of-place ops do not bump.
  v = a.version();
  (void)(a + a);
  (void)a.clone();
  (void)a.to(DType::f64);
  CHECK(a.version() == v);
  // Integer tensors take integer operands in place (an i32 one converts); a float result cannot be written
  // back (PyTorch's rule), nor can a fractional alpha or scale.
  Tensor ii = from_vector({1, 2}, {2}, DType::i64);
  ii.add_(from_vector({3, 4}, {2}, DType::i32));
  CHECK(ii.dtype() == DType::i64);
  check_values(ii, {4, 6});
  CHECK(contains(error_of([&] { ii.add_(from_vector({3, 4}, {2})); }), "result type f32 cannot be written into i64"));
  CHECK(contains(error_of([&] { ii.add_(ii, 0.5); }), "alpha 0.5"));
  CHECK(contains(error_of([&] { ii.mul_(1.5); }), "cannot be written into i64"));
  ii.mul_(3.0);  // a whole number stays an integer scalar
  check_values(ii, {12, 18});
  CHECK(contains(error_of([] {
                   from_vector({1, 0}, {2}, DType::boolean).add_(ones({2}, DType::i64));
                 }),
                 "cannot be written into bool"));
  CHECK(error_of([&] { ii.fill_(2.5e19); }) != "NO ERROR");  // past i64
  CHECK(contains(error_of([] { zeros({2}, DType::i8).fill_(300); }), "300 does not fit in i8"));
  CHECK(error_of([] { full({2}, std::nan(""), DType::i32); }) != "NO ERROR");
  CHECK_THROWS_AS(zeros({2}).add_(ones({3})), Error);
  CHECK_THROWS_AS(zeros({2}).add_(ones({2, 2})), Error);  // cannot broadcast into a smaller shape
}

TEST_CASE("tensor: in-place ops read an operand that shares memory before writing it") {
  // Each case against the same op on a copy of the operand.
  Tensor x = arange_f(9).view({3, 3});
  Tensor want = x + x.t();
  x.add_(x.t());
  check_values(x, want.to_vector());
  Tensor r = ones({5});
  r.slice(0, 1, 5).add_(r.slice(0, 0, 4));  // a running sum if read after writing
  check_values(r, {1, 2, 2, 2, 2});
  Tensor m = arange_f(6).view({2, 3}) + 1.0;
  m.mul_(m.select(0, 0));  // row 0 multiplies both rows, itself included
  check_values(m, {1, 4, 9, 4, 10, 18});
  Tensor c = arange_f(5);
  c.slice(0, 1, 5).copy_(c.slice(0, 0, 4));
  check_values(c, {0, 0, 1, 2, 3});
  Tensor same = arange_f(4);
  same.add_(same);  // the same elements: no copy needed, and right
  check_values(same, {0, 2, 4, 6});
  // An expanded tensor cannot be written elementwise: its elements share memory.
  Tensor z = zeros({1, 3});
  CHECK(contains(error_of([&] { z.expand({3, 3}).add_(ones({3, 3})); }), "share memory"));
  CHECK(contains(error_of([&] { z.expand({3, 3}).copy_(ones({3, 3})); }), "share memory"));
  check_values(z, {0, 0, 0});
}

TEST_CASE("tensor: var with a correction past the count divides by 0, and set_grad checks the gradient") {
  const Tensor v = var(from_vector({1, 2, 4}, {3}), {0}, 5);
  CHECK(std::isinf(v.item<double>()));  // PyTorch's answer; never a negative variance
  CHECK(std::isnan(var(ones({3}), {0}, 5).item<double>()));
  Tensor w = ones({3});
  w.set_requires_grad();
  CHECK(contains(error_of([&] { w.set_grad(ones({3}, DType::i64)); }), "a gradient must be floating"));
  CHECK(contains(error_of([&] { w.set_grad(ones({3}, TensorOptions(DType::f32, kMeta))); }), "gradient on meta"));
  CHECK(contains(error_of([&] { w.set_grad(ones({2})); }), "gradient shape [2]"));
  CHECK(!w.grad().defined());
}

TEST_CASE("tensor: sizes whose products overflow 64 bits are refused, not wrapped") {
  const int64_t big = int64_t(1) << 32;
  CHECK(contains(error_of([&] { zeros({big, big}); }), "more elements than fit in 64 bits"));
  CHECK(contains(error_of([&] { empty({int64_t(1) << 60, 4}); }), "more bytes than fit in 64 bits"));
  CHECK(contains(error_of([&] { ones({1, 1}).expand({big, big}); }), "more elements than fit in 64 bits"));
  CHECK(Shape{big, big, 0}.numel() == 0);  // empty, however large the other sizes
  CHECK(error_of([] { zeros({1}).expand({-5}); }) != "NO ERROR");
  CHECK(error_of([] { broadcast_shapes({-2, 3}, {1, 3}); }) != "NO ERROR");
  const int64_t top = std::numeric_limits<int64_t>::max();
  CHECK(error_of([&] { arange_f(4).narrow(0, 1, top); }) != "NO ERROR");
  CHECK(error_of([&] { arange_f(4).narrow(0, top - 2, 3); }) != "NO ERROR");
  check_values(arange_f(10).slice(0, 0, 10, top), {0});
  check_values(arange_f(10).slice(0, 9, -11, std::numeric_limits<int64_t>::min()), {9});
  check_values(arange_f(10).slice(0, 9, -11, -4), {9, 5, 1});
}

// ---- errors -------------------------------------------------------------------------------------

TEST_CASE("tensor: errors name the shapes") {
  const std::string mm = error_of([] { matmul(ones({2, 3}), ones({4, 5})); });
  CHECK(contains(mm, "[2,3]"));
  CHECK(contains(mm, "[4,5]"));
  CHECK(contains(mm, "matmul"));
  CHECK(contains(mm, ".cpp:"));  // file:line
  try {
    matmul(ones({2, 3}), ones({4, 5}));
  } catch (const Error& e) {
    CHECK(contains(e.message(), "[2,3]"));
    CHECK(!contains(e.message(), ".cpp:"));
  }
  const std::string ad = error_of([] { add(ones({2, 3}), ones({4})); });
  CHECK(contains(ad, "[2,3]"));
  CHECK(contains(ad, "[4]"));
  const std::string vw = error_of([] { arange_f(12).view({3, 4}).t().view({12}); });
  CHECK(contains(vw, "[4,3]"));
  CHECK(contains(vw, "[12]"));
  const std::string rs = error_of([] { ones({2, 3}).reshape({4, 2}); });
  CHECK(contains(rs, "[2,3]"));
  CHECK(contains(rs, "[4,2]"));
  const std::string ex = error_of([] { ones({3, 2}).expand({3, 4}); });
  CHECK(contains(ex, "[3,2]"));
  CHECK(contains(ex, "[3,4]"));
  const std::string bm = error_of([] { matmul(ones({2, 2, 3}), ones({3, 3, 4})); });
  CHECK(contains(bm, "[2,2,3]"));
  CHECK(contains(bm, "[3,3,4]"));
  CHECK(error_of([] { ones({2, 3}).permute({0}); }) != "NO ERROR");
  CHECK(error_of([] { ones({2, 3}).permute({0, 0}); }) != "NO ERROR");
  CHECK(error_of([] { ones({2, 3}).transpose(0, 2); }) != "NO ERROR");
  CHECK(error_of([] { sum(ones({2, 3}), {2}); }) != "NO ERROR");
  CHECK(error_of([] { sum(ones({2, 3}), {1, -1}); }) != "NO ERROR");  // the same dim twice
  CHECK(error_of([] { Tensor().shape(); }) != "NO ERROR");
  CHECK(!contains(error_of([] { ones({2, 3}).view({5}); }), "NOT A kiln::Error"));
  Shape sh{2, 3, 4};
  std::ostringstream os;
  os << sh;
  CHECK(os.str() == "[2,3,4]");
  std::ostringstream os0;
  os0 << Shape{};
  CHECK(os0.str() == "[]");
  CHECK(Shape{2, 3, 4}.numel() == 24);
  CHECK(Shape{}.numel() == 1);
  CHECK(Shape{2, 0}.numel() == 0);
  CHECK(contiguous_strides({2, 3, 4}) == Shape{12, 4, 1});
  CHECK(wrap_dim(-1, 3, "t") == 2);
  CHECK(wrap_dim(0, 0, "t") == 0);
  CHECK_THROWS_AS(wrap_dim(3, 3, "t"), Error);
  CHECK(contains(error_of([] { wrap_dim(5, 2, "myop"); }), "myop"));
}

TEST_CASE("tensor: an error inside a composite op names the op that was called") {
  const Tensor logp = from_vector({-1, -2, -3, -1, -2, -3}, {2, 3});
  const std::string nll = error_of([&] { nll_loss(logp, from_vector({9, 1}, {2}, DType::i64)); });
  CHECK(contains(nll, "nll_loss: "));
  CHECK(contains(nll, "9"));
  CHECK(contains(error_of([] { embedding(ones({3, 4}), from_vector({5}, {1}, DType::i64)); }), "embedding: "));
  CHECK(contains(error_of([] { clamp(ones({3}), ones({4}), ones({3})); }), "clamp: "));
  CHECK(contains(error_of([] { lerp(ones({3}), ones({4}), 0.5); }), "lerp: "));
  CHECK(contains(error_of([] { cosine_similarity(ones({3, 4}), ones({3, 5}), 1, 1e-8); }), "cosine_similarity: "));
  CHECK(contains(error_of([] { zeros({4}).copy_(ones({3})); }), "copy_: "));
  // The outermost scope alone names it, and a message that begins with the op is left as it is.
  const std::string nested = error_of([] {
    const OpScope outer("outer_op");
    const OpScope inner("inner_op");
    KILN_FAIL("inner failure");
  });
  CHECK(contains(nested, "outer_op: inner failure"));
  CHECK(!contains(nested, "inner_op"));
  CHECK(!contains(error_of([] {
                    const OpScope s("myop");
                    KILN_FAIL("myop: bad");
                  }),
                  "myop: myop"));
  CHECK(!contains(error_of([] { KILN_FAIL("plain"); }), "outer_op"));  // the scope ended with its block
}

// ---- random -------------------------------------------------------------------------------------

TEST_CASE("tensor: random draws are reproducible from manual_seed and from a Generator") {
  manual_seed(5);
  CHECK(default_generator().seed == 5);
  CHECK(default_generator().offset == 0);
  const std::vector<double> a = rand({1000}).to_vector();
  const std::vector<double> a2 = rand({1000}).to_vector();
  CHECK(default_generator().offset == 2000);
  CHECK(a != a2);  // consecutive draws differ
  manual_seed(5);
  CHECK(rand({1000}).to_vector() == a);
  CHECK(rand({1000}).to_vector() == a2);
  // An explicit generator with the same seed gives the same stream and leaves the default alone.
  manual_seed(77);
  Generator g(5);
  CHECK(rand({1000}, {}, &g).to_vector() == a);
  CHECK(g.offset == 1000);
  CHECK(default_generator().offset == 0);
  CHECK(rand({1000}, {}, &g).to_vector() == a2);
  Generator g2(6);
  CHECK(rand({1000}, {}, &g2).to_vector() != a);  // another seed, another stream
  for (auto draw : {+[](Generator* gen) { return randn({37}, {}, gen); },
                    +[](Generator* gen) { return bernoulli({37}, 0.5, {}, gen); },
                    +[](Generator* gen) { return normal({37}, 1.0, 2.0, {}, gen); },
                    +[](Generator* gen) { return uniform({37}, -1.0, 3.0, {}, gen); }}) {
    Generator x(11), y(11);
    const std::vector<double> first = draw(&x).to_vector();
    CHECK(draw(&y).to_vector() == first);
    CHECK(draw(&x).to_vector() != first);
    manual_seed(11);
    CHECK(draw(nullptr).to_vector() == first);
  }
}

TEST_CASE("tensor: generator offsets advance in multiples of 4") {
  Generator g(3);
  rand({10}, {}, &g);
  CHECK(g.offset == 12);
  randn({3}, {}, &g);
  CHECK(g.offset == 16);
  bernoulli({2, 2}, 0.5, {}, &g);
  CHECK(g.offset == 20);
  rand({1}, {}, &g);
  CHECK(g.offset == 24);
  rand({2, 3}, DType::f64, &g);
  CHECK(g.offset == 32);
  CHECK(g.offset % 4 == 0);
  Generator h(3);
  CHECK(h.reserve(5) == 0);
  CHECK(h.reserve(1) == 8);
  CHECK(h.offset == 12);
}

// Dropout reserves without the GIL while ds[i] reserves under it: concurrent reservations must never
// share a Philox block (a lost update hands two callers the same start).
TEST_CASE("tensor: concurrent generator reservations get disjoint ranges") {
  Generator g(3);
  constexpr int kThreads = 4, kEach = 50000;
  std::vector<std::vector<uint64_t>> starts(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&g, &starts, t] {
      for (int k = 0; k < kEach; ++k) starts[size_t(t)].push_back(g.reserve(1 + uint64_t(k % 4)));  // 4 each
    });
  for (auto& th : threads) th.join();
  std::vector<uint64_t> all;
  for (const auto& v : starts) all.insert(all.end(), v.begin(), v.end());
  std::sort(all.begin(), all.end());
  CHECK(std::adjacent_find(all.begin(), all.end()) == all.end());  // no start handed out twice
  CHECK(g.offset == uint64_t(kThreads) * kEach * 4);
  for (size_t i = 0; i < all.size(); ++i) REQUIRE(all[i] == 4 * i);  // each 4-element block exactly once
}

TEST_CASE("tensor: random elements are the documented Philox lanes") {
  const uint64_t seed = 0x1234567890abcdefull;
  Generator g(seed);
  g.offset = 40;  // start mid-stream
  Tensor u = rand({7, 3}, {}, &g);
  const std::vector<double> uv = u.to_vector();
  for (int64_t i = 0; i < 21; ++i) {
    const U32x4 r = philox_block(seed, 40 / 4 + uint64_t(i) / 4);
    CHECK(uv[size_t(i)] == double(u32_to_uniform(r.v[i % 4])));
  }
  // The next draw starts at offset 64 (21 rounded up to 24).
  CHECK(g.offset == 64);
  Tensor z = randn({10}, {}, &g);
  const std::vector<double> zv = z.to_vector();
  for (int64_t i = 0; i < 10; ++i) {
    float out[4];
    philox_normal4(philox_block(seed, 64 / 4 + uint64_t(i) / 4), out);
    CHECK(zv[size_t(i)] == double(out[i % 4]));
  }
  manual_seed(42);
  const std::vector<double> d = randn({6}).to_vector();
  for (int64_t i = 0; i < 6; ++i) {
    float out[4];
    philox_normal4(philox_block(42, uint64_t(i) / 4), out);
    CHECK(d[size_t(i)] == double(out[i % 4]));
  }
}

TEST_CASE("tensor: f16 and bf16 uniform fills stay below 1 (the dtype's top bits); f32 and f64 draw one stream") {
  // 24 random bits rounded to nearest reached 1.0 in f16 (about 240 draws a million) and in bf16; each 16-bit
  // element is now the top 11 (f16) or 8 (bf16) bits of its Philox lane, exact in the dtype.
  const uint64_t seed = 77;
  const int64_t n = int64_t(1) << 20;
  for (DType dt : {DType::f16, DType::bf16}) {
    const int bits = dt == DType::f16 ? 11 : 8;
    CAPTURE(bits);
    Generator g(seed);
    const std::vector<double> v = rand({n}, TensorOptions(dt), &g).to_vector();
    int64_t out_of_range = 0;
    double hi = 0;
    for (double x : v) {
      out_of_range += !(x >= 0.0 && x < 1.0);
      hi = std::max(hi, x);
    }
    CHECK(out_of_range == 0);
    CHECK(hi == 1.0 - std::ldexp(1.0, -bits));  // the largest draw is reached (all but certain in 2^20)
    for (int64_t i = 0; i < 64; ++i) {
      const U32x4 r = philox_block(seed, uint64_t(i) / 4);
      CHECK(v[size_t(i)] == std::ldexp(double(r.v[i % 4] >> (32 - bits)), -bits));
    }
    Generator g2(seed);
    const std::vector<double> w = uniform({n}, -2.0, 6.0, TensorOptions(dt), &g2).to_vector();
    CHECK(*std::max_element(w.begin(), w.end()) < 6.0);
  }
  Generator a(seed), b(seed);
  CHECK(rand({1000}, TensorOptions(DType::f64), &a).to_vector() == rand({1000}, {}, &b).to_vector());
}

TEST_CASE("tensor: moments of 100k random samples") {
  Generator g(2024);
  const int64_t n = 100000;
  auto moments = [](const std::vector<double>& v, double& mean, double& var, double& lo, double& hi) {
    double s = 0, s2 = 0;
    lo = v[0];
    hi = v[0];
    for (double x : v) {
      s += x;
      lo = std::min(lo, x);
      hi = std::max(hi, x);
    }
    mean = s / double(v.size());
    for (double x : v) s2 += (x - mean) * (x - mean);
    var = s2 / double(v.size() - 1);
  };
  double m, v, lo, hi;
  moments(rand({n}, {}, &g).to_vector(), m, v, lo, hi);
  CHECK(std::abs(m - 0.5) < 0.005);
  CHECK(std::abs(v - 1.0 / 12) < 0.002);
  CHECK(lo >= 0.0);
  CHECK(hi < 1.0);
  moments(randn({n}, {}, &g).to_vector(), m, v, lo, hi);
  CHECK(std::abs(m) < 0.02);
  CHECK(std::abs(v - 1.0) < 0.02);
  CHECK(lo < -3.0);
  CHECK(hi > 3.0);
  moments(normal({n}, 3.0, 2.0, {}, &g).to_vector(), m, v, lo, hi);
  CHECK(std::abs(m - 3.0) < 0.04);
  CHECK(std::abs(v - 4.0) < 0.08);
  moments(uniform({n}, -2.0, 5.0, {}, &g).to_vector(), m, v, lo, hi);
  CHECK(std::abs(m - 1.5) < 0.04);
  CHECK(std::abs(v - 49.0 / 12) < 0.1);
  CHECK(lo >= -2.0);
  CHECK(hi <= 5.0);
  CHECK(lo < -1.99);
  CHECK(hi > 4.99);
  moments(bernoulli({n}, 0.3, {}, &g).to_vector(), m, v, lo, hi);
  CHECK(std::abs(m - 0.3) < 0.01);
  CHECK(lo == 0.0);
  CHECK(hi == 1.0);
  for (double x : bernoulli({1000}, 0.3, {}, &g).to_vector()) CHECK((x == 0.0 || x == 1.0));
  check_values(bernoulli({100}, 0.0, {}, &g), std::vector<double>(100, 0.0));
  check_values(bernoulli({100}, 1.0, {}, &g), std::vector<double>(100, 1.0));
  CHECK(bernoulli({4}, 0.5, DType::boolean, &g).dtype() == DType::boolean);
  CHECK(bernoulli({4}, 0.5, DType::u8, &g).dtype() == DType::u8);
  // Every floating dtype, values in range.
  for (DType dt : {DType::f16, DType::bf16, DType::f64}) {
    Tensor r = rand({1000}, dt, &g);
    CHECK(r.dtype() == dt);
    moments(r.to_vector(), m, v, lo, hi);
    CHECK(lo >= 0.0);
    CHECK(hi <= 1.0);
    CHECK(std::abs(m - 0.5) < 0.05);
    CHECK(randn({8}, dt, &g).dtype() == dt);
  }
  CHECK_THROWS_AS(randn({4}, DType::i32, &g), Error);
  CHECK_THROWS_AS(bernoulli({4}, 1.5, {}, &g), Error);
  CHECK(rand({2, 3}, TensorOptions(DType::f32).with_grad(), &g).requires_grad());
}

TEST_CASE("from_blob wraps the caller's memory with its strides; values<T> reads back exactly") {
  std::vector<double> buf = iota(12);
  int released = 0;
  {
    // A transposed view of a 3x4 row-major buffer: [4, 3] with strides [1, 4].
    Tensor t = from_blob(buf.data(), {4, 3}, DType::f64, [&released](void*) { ++released; }, kCPU, {1, 4});
    CHECK(t.raw_data() == buf.data());
    CHECK(t.to_vector() == std::vector<double>{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11});
    Tensor row = t.select(0, 1);  // shares the storage: the deleter waits for it too
    t = Tensor();
    CHECK(released == 0);
    row.fill_(-1.0);
    CHECK(buf[1] == -1.0);
    CHECK(buf[5] == -1.0);
    CHECK(buf[9] == -1.0);
  }
  CHECK(released == 1);
  CHECK(contains(error_of([] { from_blob(nullptr, {2}, DType::f32); }), "from_blob: null data for shape [2]"));
  CHECK(from_blob(nullptr, {0, 3}, DType::f32).numel() == 0);
  float f[4] = {};
  CHECK(contains(error_of([&] { from_blob(f, {2, 2}, DType::f32, {}, kCPU, {1}); }), "1 strides [1] for the 2-d shape"));
  CHECK(contains(error_of([&] { from_blob(f, {2}, DType::f32, {}, kCPU, {-1}); }), "negative stride"));

  const int64_t big = (int64_t(1) << 62) + 1;  // not representable in f64
  Tensor i = from_vector({0, 0}, {2}, DType::i64);
  i.data<int64_t>()[0] = big;
  CHECK(i.values<int64_t>()[0] == big);
  CHECK(i.select(0, 0).item<int64_t>() == big);
  CHECK(i.values<int32_t>()[1] == 0);
  CHECK(from_vector({1.5, -2.5}, {2}).values<float>() == std::vector<float>{1.5f, -2.5f});
  CHECK(contains(error_of([&] { (void)i.item<int64_t>(); }), "item(): the tensor has 2 elements"));
}

TEST_CASE("set_cpu_cache_limit: lowering the limit below what is cached gives the blocks back") {
  for (int i = 0; i < 4; ++i) (void)empty({1 << 20});  // 4 MiB blocks, freed into the cache
  set_cpu_cache_limit(0);  // must not wait on its own lock
  Tensor t = full({1 << 20}, 2.0);
  CHECK(sum(t).item<double>() == double(1 << 21));
  set_cpu_cache_limit(size_t(4096) << 20);
}
