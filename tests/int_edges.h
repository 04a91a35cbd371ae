// The small integer dtypes (u8, i8, i16) next to i32 and i64: arithmetic that wraps as the integer
// types do, division and remainders, casts from floats (truncated toward zero through i64, then the
// low bits: docs/ops.md), promotion between them, reductions into i64, sorting, indexing. Every
// backend must give the same values: run on the CPU by test_ops.cpp and on the CUDA kernels by
// test_emulated.cpp.
#pragma once
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "kiln.h"

namespace kiln::testing {

inline void check_integer_dtypes() {
  using V = std::vector<double>;
  const auto t = [](const V& v, DType dt) { return from_vector(v, {int64_t(v.size())}, dt); };
  const auto same = [](const Tensor& x, DType dt, const V& want) {
    CHECK(x.dtype() == dt);
    CHECK(x.to_vector() == want);
  };
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();

  SUBCASE("arithmetic wraps at the type's width") {
    same(t({100, -128, 127}, DType::i8) + t({100, -1, 1}, DType::i8), DType::i8, {-56, 127, -128});
    same(t({200, 3, 0}, DType::u8) + t({100, 0, 0}, DType::u8), DType::u8, {44, 3, 0});
    same(t({3, 0}, DType::u8) - t({5, 1}, DType::u8), DType::u8, {254, 255});
    same(t({30000, -32768}, DType::i16) + t({30000, -1}, DType::i16), DType::i16, {-5536, 32767});
    same(t({16, -3, 100}, DType::i8) * t({16, 5, 3}, DType::i8), DType::i8, {0, -15, 44});
    same(-t({-128, 5, 0}, DType::i8), DType::i8, {-128, -5, 0});
    same(abs(t({-128, -5, 7}, DType::i8)), DType::i8, {-128, 5, 7});
    same(abs(t({-32768, -300}, DType::i16)), DType::i16, {-32768, 300});
    same(pow(t({2, 3, -2}, DType::i8), t({7, 5, 3}, DType::i8)), DType::i8, {-128, -13, -8});
    // A negative exponent: the truncated 1 / x ** -y, as PyTorch's (1, +-1 by parity for -1, else 0).
    same(pow(t({2, -2, 1, -1, -1, 0, 127}, DType::i8), t({-3, -3, -3, -3, -2, -1, -1}, DType::i8)), DType::i8,
         {0, 0, 1, -1, 1, 0, 0});
    same(pow(t({1, -1, 5}, DType::i64), t({-9223372036854775807.0 - 1, -9223372036854775807.0 - 1, -1}, DType::i64)),
         DType::i64, {1, 1, 0});
    same(maximum(t({-5, 100}, DType::i8), t({3, -100}, DType::i8)), DType::i8, {3, 100});
    same(minimum(t({250, 1}, DType::u8), t({3, 200}, DType::u8)), DType::u8, {3, 1});
    same(clamp(t({-100, 0, 100}, DType::i8), -10.0, 10.0), DType::i8, {-10, 0, 10});
    // Bounds past the dtype's range are no bounds; -inf/+inf likewise.
    same(clamp(t({-100, 5, 100}, DType::i8), 0.0, 200.0), DType::i8, {0, 5, 100});
    same(clamp(t({-100, 5, 100}, DType::i8), -inf, 50.0), DType::i8, {-100, 5, 50});
    same(clamp(t({0, 200}, DType::u8), -5.0, 1e9), DType::u8, {0, 200});
    same(clamp(t({-5, 7}, DType::i64), -1e300, 1e300), DType::i64, {-5, 7});
    // A whole-number scalar takes the tensor's dtype (and wraps, as PyTorch's does); a fraction makes f32.
    same(t({1, 2}, DType::i8) + 300.0, DType::i8, {45, 46});
    same(t({1, 2}, DType::i16) * 2.5, DType::f32, {2.5, 5});
  }

  SUBCASE("div is true division in f32; remainder takes the divisor's sign, fmod the dividend's") {
    for (DType dt : {DType::u8, DType::i8, DType::i16, DType::i32, DType::i64}) {
      INFO("dtype " << dt);
      const bool sgn = dt != DType::u8;
      same(div(t({sgn ? -7.0 : 7.0, 7, 9}, dt), t({2, sgn ? -2.0 : 2.0, 3}, dt)), DType::f32,
           {sgn ? -3.5 : 3.5, sgn ? -3.5 : 3.5, 3});
      if (sgn) {
        same(remainder(t({-7, 7, -8}, dt), t({2, -2, 3}, dt)), dt, {1, -1, 1});
        same(fmod(t({-7, 7, -8}, dt), t({2, -2, 3}, dt)), dt, {-1, 1, -2});
      }
      CHECK_THROWS_WITH_AS(remainder(t({1}, dt), t({0}, dt)), doctest::Contains("division by zero"), Error);
      CHECK_THROWS_WITH_AS(fmod(t({1}, dt), t({0}, dt)), doctest::Contains("division by zero"), Error);
    }
    same(remainder(t({255}, DType::u8), t({7}, DType::u8)), DType::u8, {3});
    same(fmod(t({-128}, DType::i8), t({-1}, DType::i8)), DType::i8, {0});
  }

  SUBCASE("comparisons and logic give bool") {
    same(lt(t({-1, 5}, DType::i8), t({0, 5}, DType::i8)), DType::boolean, {1, 0});
    same(eq(t({255}, DType::u8), t({255}, DType::u8)), DType::boolean, {1});
    same(ge(t({-300, 300}, DType::i16), t({-300, 301}, DType::i16)), DType::boolean, {1, 0});
    same(logical_and(t({0, 3}, DType::i8), t({2, 2}, DType::i8)), DType::boolean, {0, 1});
  }

  SUBCASE("mixed integer dtypes promote to the smallest type holding both") {
    same(t({-1, 100}, DType::i8) + t({255, 200}, DType::u8), DType::i16, {254, 300});
    same(t({-1}, DType::i8) + t({1}, DType::boolean), DType::i8, {0});
    same(t({1000}, DType::i16) * t({1000}, DType::i32), DType::i32, {1000000});
    same(t({-1}, DType::i16) + t({0.5}, DType::f16), DType::f16, {-0.5});
  }

  SUBCASE(
      "casts from floats truncate as x86-64 does (to i32, or i64 for i64; outside it or NaN the minimum), then keep "
      "the low bits") {
    const V x = {-1.0, 300.0, 127.9, -128.5, 2.99, -2.99, nan, inf, -inf, 1e30};
    for (DType from : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
      INFO("from " << from);
      // The 16-bit floats compute through f32; every value of the last two lines is exact in both.
      if (from == DType::f32 || from == DType::f64) {
        const double i32min = -2147483648.0, i64min = -9223372036854775808.0;
        same(t(x, from).to(DType::i8), DType::i8, {-1, 44, 127, -128, 2, -2, 0, 0, 0, 0});
        same(t(x, from).to(DType::u8), DType::u8, {255, 44, 127, 128, 2, 254, 0, 0, 0, 0});
        same(t(x, from).to(DType::i16), DType::i16, {-1, 300, 127, -128, 2, -2, 0, 0, 0, 0});
        same(t(x, from).to(DType::i32), DType::i32, {-1, 300, 127, -128, 2, -2, i32min, i32min, i32min, i32min});
        same(t(x, from).to(DType::i64), DType::i64, {-1, 300, 127, -128, 2, -2, i64min, i64min, i64min, i64min});
      }
      same(t({-1.0, 2.5, 300.0, nan}, from).to(DType::u8), DType::u8, {255, 2, 44, 0});
      same(t({-33024.0, 2.5, nan}, from).to(DType::i16), DType::i16, {32512, 2, 0});
    }
    same(t({3e9, -3e9, 2147483647.9}, DType::f64).to(DType::i32), DType::i32,
         {-2147483648.0, -2147483648.0, 2147483647});
    same(t({3e9, 65535.0, 5e9}, DType::f64).to(DType::u8), DType::u8, {0, 255, 0});
    same(t({3e9, 5e9, -4e9}, DType::f64).to(DType::i64), DType::i64, {3e9, 5e9, -4e9});
    // f64 -> i64 exactly below 2^63, then saturated
    const Tensor big = t({9007199254740993.0, -4611686018427387904.0}, DType::f64).to(DType::i64);
    CHECK(big.values<int64_t>() == std::vector<int64_t>{9007199254740992, -4611686018427387904});
  }

  SUBCASE("integer narrowing keeps the low bits; widening keeps the value") {
    same(t({300, -1, 128}, DType::i64).to(DType::i8), DType::i8, {44, -1, -128});
    same(t({-1, 256, 511}, DType::i16).to(DType::u8), DType::u8, {255, 0, 255});
    same(t({255, 128}, DType::u8).to(DType::i8), DType::i8, {-1, -128});
    same(t({-128, 127}, DType::i8).to(DType::i16), DType::i16, {-128, 127});
    same(t({-32768, 2}, DType::i16).to(DType::f32), DType::f32, {-32768, 2});
    same(t({-2, 0}, DType::i8).to(DType::boolean), DType::boolean, {1, 0});
    CHECK(t({-7}, DType::i8).values<int8_t>() == std::vector<int8_t>{-7});
    CHECK(t({-7}, DType::i16).item<int16_t>() == -7);
    CHECK(t({200}, DType::u8).item<int64_t>() == 200);
  }

  SUBCASE("reductions: sums in i64, extremes and indices in the dtype") {
    const Tensor x = from_vector({100, 100, 100, -128, 127, 0}, {2, 3}, DType::i8);
    same(sum(x), DType::i64, {299});
    same(sum(x, {1}), DType::i64, {300, -1});
    same(sum(from_vector(V(1000, 255), {1000}, DType::u8)), DType::i64, {255000});
    const Tensor m = mean(x, {1});
    CHECK(m.dtype() == DType::f32);
    CHECK(m.to_vector()[0] == 100);
    CHECK(m.to_vector()[1] == doctest::Approx(-1.0 / 3.0));
    same(amax(x, {1}), DType::i8, {100, 127});
    same(amin(x, {0}), DType::i8, {-128, 100, 0});
    same(argmax(x, 1), DType::i64, {0, 1});
    same(argmin(from_vector({40000 - 65536, 5, -32768}, {3}, DType::i16), 0), DType::i64, {2});
    same(cumsum(t({100, 100, 100}, DType::i8), 0), DType::i64, {100, 200, 300});
    same(prod(t({16, 16, 4}, DType::i8)), DType::i64, {1024});
    same(count_nonzero(t({0, -1, 2}, DType::i8)), DType::i64, {2});
  }

  SUBCASE("sorting, indexing, where and concatenation move the values") {
    const Tensor x = t({5, -128, 127, 0, -1}, DType::i8);
    same(sort(x, 0).values, DType::i8, {-128, -1, 0, 5, 127});
    same(argsort(x, 0, true), DType::i64, {2, 0, 3, 4, 1});
    same(topk(t({300, -300, 7}, DType::i16), 2).values, DType::i16, {300, 7});
    same(index_select(x, 0, from_vector({4, 0}, {2}, DType::i64)), DType::i8, {-1, 5});
    same(gather(x, 0, from_vector({1, 1, 2}, {3}, DType::i64)), DType::i8, {-128, -128, 127});
    same(where(t({1, 0}, DType::boolean), t({-5, -6}, DType::i8), t({7, 8}, DType::i8)), DType::i8, {-5, 8});
    same(cat({t({1}, DType::u8), t({255}, DType::u8)}, 0), DType::u8, {1, 255});
    same(flip(t({1, -2, 3}, DType::i16), {0}), DType::i16, {3, -2, 1});
    same(full({2}, -3, DType::i16), DType::i16, {-3, -3});
    same(arange(3, TensorOptions(DType::i8)), DType::i8, {0, 1, 2});
  }
}

// i32 and i64 at their overflow edges: every op that can overflow wraps, two's complement, as PyTorch's
// (kernels/common/int_arith.h; a signed overflow in C++ is undefined behaviour, which the sanitizer build
// of CI reports), INT_MIN / -1 gives INT_MIN without the trap of x86's idiv, and a zero divisor is an error
// naming the op. The expected values are PyTorch 2.15's on the CPU (torch.add, torch.sub(alpha=), *, neg,
// abs, sum, cumsum, cumprod, prod, //, div(rounding_mode='trunc'), remainder, fmod and pow on the same
// tensors), except div_trunc(INT_MIN, -1), where PyTorch's own CPU kernel dies of SIGFPE: Kiln gives what
// floor division gives, INT_MIN.
template <typename T> void check_integer_overflow_of() {
  using L = std::numeric_limits<T>;
  const T mn = L::min(), mx = L::max();
  const auto t = [](std::vector<T> v) { return from_blob_copy(v.data(), {int64_t(v.size())}); };
  const auto is = [](const Tensor& x, const std::vector<T>& want) {
    REQUIRE(x.dtype() == DTypeOf<T>::value);
    CHECK(x.template values<T>() == want);
  };
  const auto is64 = [](const Tensor& x, const std::vector<int64_t>& want) {
    REQUIRE(x.dtype() == DType::i64);
    CHECK(x.values<int64_t>() == want);
  };
  constexpr bool w64 = sizeof(T) == 8;

  is(t({mx, mn}) + t({1, -1}), {mn, mx});
  is(t({mn, mx}) - t({1, -1}), {mx, mn});
  is(add(t({mx}), t({mx}), 2.0), {T(mx - 2)});  // 3 * max - 0 wraps to max - 2
  is(sub(t({mn}), t({mx}), 3.0), {3});
  if constexpr (w64) {
    is(t({mx, mn, T(4294967297)}) * t({2, -1, T(4294967297)}), {-2, mn, T(8589934593)});  // (2^32 + 1)^2
  } else {
    is(t({mx, mn, 65537}) * t({2, -1, 65537}), {-2, mn, 131073});  // (2^16 + 1)^2
  }
  is(t({mx}) + 1.0, {mn});  // a whole-number scalar takes the dtype, then wraps
  is(t({mx}) * 2.0, {-2});
  is(-t({mn, mx}), {mn, T(-mx)});
  is(neg(t({mn})), {mn});
  is(abs(t({mn, -5})), {mn, 5});
  if constexpr (w64) {
    is(pow(t({mn, 3}), t({2, 41})), {0, T(-420491770248316829)});  // 3^41 wraps
  } else {
    is(pow(t({mn, 3}), t({2, 41})), {0, 2069870691});
  }

  // Sums, running sums and products accumulate in i64 (PyTorch's too): only i64 inputs overflow there.
  if constexpr (w64) {
    is64(sum(t({mx, mx, 1})), {-1});
    is64(sum(from_blob_copy(std::vector<T>{mx, 1, mx, 1, 1, 1}.data(), {3, 2}), {0}), {-1, 3});  // columns
    is64(sum(from_blob_copy(std::vector<T>{mx, mx, mx, mx, 1, 1}.data(), {3, 2}), {1}), {-2, -2, 2});
    std::vector<T> chunks(8193, 0);  // two summation chunks of 8192, each max: they overflow when combined
    chunks.front() = chunks.back() = mx;
    is64(sum(t(chunks)), {-2});
    is64(cumsum(t({mx, mx, 3}), 0), {mx, -2, 1});
    is64(cumprod(t({mx, mx, 3}), 0), {mx, 1, 3});
    is64(cumprod(t({T(1) << 40, T(1) << 40, 3}), 0), {int64_t(1) << 40, 0, 0});
    is64(prod(t({mx, mx, 3})), {3});
  } else {
    is64(sum(t({mx, mx, 1})), {4294967295});
    is64(cumsum(t({mx, mx, 3}), 0), {2147483647, 4294967294, 4294967297});
    is64(prod(t({mx, mx, 3})), {-4611686031312289789});  // (2^31 - 1)^2 * 3 wraps in i64
  }

  // Division: INT_MIN / -1 is the one quotient that overflows.
  is(floor_divide(t({mn, mn, 7}), t({-1, 1, -1})), {mn, mn, -7});
  is(div_trunc(t({mn, mn, mn}), t({-1, -2, 3})), {mn, T(-(mn / 2)), T(mn / 3)});
  is(remainder(t({mn, mn, mx}), t({-1, mx, mn})), {0, T(mx - 1), -1});
  is(fmod(t({mn, mn, mx}), t({-1, mx, mn})), {0, -1, mx});
  // A zero divisor is PyTorch's ZeroDivisionError; here an Error naming the op.
  CHECK_THROWS_WITH_AS(floor_divide(t({mn}), t({0})), doctest::Contains("floor_divide"), Error);
  CHECK_THROWS_WITH_AS(floor_divide(t({1}), t({0})), doctest::Contains("division by zero"), Error);
  CHECK_THROWS_WITH_AS(div_trunc(t({mx}), t({0})), doctest::Contains("div_trunc"), Error);
  CHECK_THROWS_WITH_AS(remainder(t({mn}), t({0})), doctest::Contains("remainder"), Error);
  CHECK_THROWS_WITH_AS(fmod(t({mn}), t({0})), doctest::Contains("fmod"), Error);
}

inline void check_integer_overflow() {
  SUBCASE("i32") { check_integer_overflow_of<int32_t>(); }
  SUBCASE("i64") { check_integer_overflow_of<int64_t>(); }
  SUBCASE("i8 and i16: INT_MIN / -1 and the zero divisor") {
    // Their arithmetic computes in int, where nothing overflows (check_integer_dtypes covers the wrapping).
    const auto t = [](const std::vector<double>& v, DType dt) { return from_vector(v, {int64_t(v.size())}, dt); };
    for (DType dt : {DType::i8, DType::i16}) {
      INFO("dtype " << dt);
      const double mn = dt == DType::i8 ? -128 : -32768;
      CHECK(floor_divide(t({mn, mn}, dt), t({-1, 1}, dt)).to_vector() == std::vector<double>{mn, mn});
      CHECK(div_trunc(t({mn, mn}, dt), t({-1, -2}, dt)).to_vector() == std::vector<double>{mn, -mn / 2});
      CHECK_THROWS_WITH_AS(floor_divide(t({mn}, dt), t({0}, dt)), doctest::Contains("division by zero"), Error);
    }
  }
}

}  // namespace kiln::testing
