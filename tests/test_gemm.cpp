// Tests for kiln::cpu::gemm_f32/f64: every transpose layout against a naive double-precision triple loop, on
// awkward and block-crossing sizes, padded leading dims, alpha/beta, zero sizes, bad arguments, thread counts.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "base/error.h"
#include "base/thread_pool.h"
#include "kernels/cpu/gemm.h"

namespace {

// A stored operand: rows x cols with leading dimension ld; the padding past cols holds NaN so a kernel that
// reads it poisons its result.
template <typename T>
struct Stored {
  int64_t rows, cols, ld;
  std::vector<T> data;
  T at(int64_t r, int64_t c) const { return data[size_t(r * ld + c)]; }
};

template <typename T>
Stored<T> make_stored(int64_t rows, int64_t cols, int64_t pad, std::mt19937& rng) {
  Stored<T> s{rows, cols, cols + pad, {}};
  s.data.assign(size_t(std::max<int64_t>(rows * s.ld, 1)), std::numeric_limits<T>::quiet_NaN());
  std::uniform_int_distribution<int> dist(-8, 8);
  // Small multiples of 1/8: exact in f32, so the reference differs from the kernel only by summation order.
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) s.data[size_t(r * s.ld + c)] = T(dist(rng)) / T(8);
  return s;
}

struct Case {
  bool trans_a, trans_b;
  int64_t m, n, k;
  double alpha, beta;
  int64_t pad_a = 0, pad_b = 0, pad_c = 0;
  bool nan_c = false;  // fill C with NaN (only meaningful with beta == 0)
};

std::string describe(const Case& c) {
  return std::string(c.trans_a ? "T" : "N") + (c.trans_b ? "T" : "N") + " m=" + std::to_string(c.m) +
         " n=" + std::to_string(c.n) + " k=" + std::to_string(c.k) + " alpha=" + std::to_string(c.alpha) +
         " beta=" + std::to_string(c.beta) + " pads=" + std::to_string(c.pad_a) + "," + std::to_string(c.pad_b) +
         "," + std::to_string(c.pad_c);
}

template <typename T>
void call_gemm(const Case& c, const Stored<T>& a, const Stored<T>& b, Stored<T>& out) {
  if constexpr (std::is_same_v<T, float>)
    kiln::cpu::gemm_f32(c.trans_a, c.trans_b, c.m, c.n, c.k, float(c.alpha), a.data.data(), a.ld, b.data.data(),
                        b.ld, float(c.beta), out.data.data(), out.ld);
  else
    kiln::cpu::gemm_f64(c.trans_a, c.trans_b, c.m, c.n, c.k, c.alpha, a.data.data(), a.ld, b.data.data(), b.ld,
                        c.beta, out.data.data(), out.ld);
}

// Runs one case and compares every element with a double-precision reference, within a bound that grows
// with k; also checks that the padding of C was not written.
template <typename T>
void check_case(const Case& c, uint32_t seed = 1) {
  std::mt19937 rng(seed);
  const auto a = make_stored<T>(c.trans_a ? c.k : c.m, c.trans_a ? c.m : c.k, c.pad_a, rng);
  const auto b = make_stored<T>(c.trans_b ? c.n : c.k, c.trans_b ? c.k : c.n, c.pad_b, rng);
  auto out = make_stored<T>(c.m, c.n, c.pad_c, rng);
  if (c.nan_c)
    for (auto& x : out.data) x = std::numeric_limits<T>::quiet_NaN();
  const auto before = out;
  call_gemm(c, a, b, out);

  auto op_a = [&](int64_t i, int64_t p) { return double(c.trans_a ? a.at(p, i) : a.at(i, p)); };
  auto op_b = [&](int64_t p, int64_t j) { return double(c.trans_b ? b.at(j, p) : b.at(p, j)); };
  const double eps = std::numeric_limits<T>::epsilon();
  int64_t bad = 0;
  for (int64_t i = 0; i < c.m; ++i) {
    for (int64_t j = 0; j < c.n; ++j) {
      double sum = 0, mag = 0;
      for (int64_t p = 0; p < c.k; ++p) {
        sum += op_a(i, p) * op_b(p, j);
        mag += std::abs(op_a(i, p) * op_b(p, j));
      }
      double ref = c.alpha * sum, bound = std::abs(c.alpha) * mag;
      if (c.beta != 0) {
        ref += c.beta * double(before.at(i, j));
        bound += std::abs(c.beta * double(before.at(i, j)));
      }
      const double got = double(out.at(i, j));
      const double tol = double(c.k + 4) * eps * bound + std::numeric_limits<T>::min();
      if (!(std::abs(got - ref) <= tol) && bad++ < 5)
        FAIL_CHECK(describe(c), ": C(", i, ",", j, ") = ", got, ", expected ", ref, " (tol ", tol, ")");
    }
    for (int64_t j = c.n; j < out.ld; ++j)
      if (std::isnan(double(before.at(i, j))) != std::isnan(double(out.at(i, j))) && bad++ < 5)
        FAIL_CHECK(describe(c), ": wrote C's padding at (", i, ",", j, ")");
  }
  CHECK_MESSAGE(bad == 0, describe(c), ": ", bad, " bad elements");
}

// Restores the pool size when a test ends, even by exception.
struct ThreadCountGuard {
  int saved = kiln::num_threads();
  ~ThreadCountGuard() { kiln::set_num_threads(saved); }
};

const bool kLayouts[4][2] = {{false, false}, {false, true}, {true, false}, {true, true}};

}  // namespace

TEST_CASE("gemm: all four layouts on awkward sizes match a double reference") {
  const int64_t sizes[] = {1, 3, 17, 65, 129};
  for (const auto& lt : kLayouts)
    for (int64_t m : sizes)
      for (int64_t n : sizes)
        for (int64_t k : sizes) {
          check_case<float>({lt[0], lt[1], m, n, k, 1.0, 0.0});
          check_case<double>({lt[0], lt[1], m, n, k, 1.0, 0.0});
        }
}

TEST_CASE("gemm: sizes crossing the register tile and cache block boundaries") {
  // Register tile 6 x 64, K blocks of 384, N blocks of 384 in the AVX-512 kernel; Eigen's own edges too.
  struct Mnk {
    int64_t m, n, k;
  };
  const Mnk shapes[] = {{5, 63, 383},  {6, 64, 384},   {7, 65, 385},  {11, 127, 768}, {13, 383, 40},
                        {12, 384, 64}, {25, 385, 769}, {97, 449, 33}, {2, 800, 9},    {300, 2, 5}};
  for (const auto& lt : kLayouts)
    for (const auto& s : shapes) {
      check_case<float>({lt[0], lt[1], s.m, s.n, s.k, 1.0, 0.0});
      check_case<double>({lt[0], lt[1], s.m, s.n, s.k, 1.0, 0.0});
    }
}

TEST_CASE("gemm: padded leading dimensions leave padding unread and unwritten") {
  for (const auto& lt : kLayouts)
    for (int64_t pad : {1, 3, 16, 37}) {
      check_case<float>({lt[0], lt[1], 19, 70, 45, 1.0, 0.0, pad, pad + 1, pad + 2});
      check_case<float>({lt[0], lt[1], 67, 17, 130, 1.0, 0.5, pad + 2, pad, pad + 5});
      check_case<double>({lt[0], lt[1], 19, 70, 45, 1.0, 0.0, pad, pad + 1, pad + 2});
    }
}

TEST_CASE("gemm: alpha and beta") {
  const double pairs[][2] = {{1, 1}, {0.5, -1.25}, {-2, 1}, {0, 2}, {0, 0}, {3, 0}, {1, 0.5}};
  for (const auto& lt : kLayouts)
    for (const auto& ab : pairs) {
      // Sizes big enough that the f32 micro-kernel and its K blocking (beta applied once) are exercised.
      check_case<float>({lt[0], lt[1], 33, 130, 800, ab[0], ab[1], 2, 3, 4});
      check_case<float>({lt[0], lt[1], 3, 5, 7, ab[0], ab[1]});
      check_case<double>({lt[0], lt[1], 33, 130, 400, ab[0], ab[1], 2, 3, 4});
    }
}

TEST_CASE("gemm: beta = 0 does not read C, so NaNs in C vanish") {
  for (const auto& lt : kLayouts)
    for (double alpha : {1.0, 0.0, -0.5}) {
      check_case<float>({lt[0], lt[1], 29, 150, 500, alpha, 0.0, 0, 0, 3, true});
      check_case<float>({lt[0], lt[1], 1, 1, 1, alpha, 0.0, 0, 0, 0, true});
      check_case<double>({lt[0], lt[1], 29, 150, 100, alpha, 0.0, 0, 0, 3, true});
    }
  // k == 0 too: the result is beta * C = 0, not NaN.
  check_case<float>({false, false, 7, 9, 0, 1.0, 0.0, 0, 0, 1, true});
  check_case<double>({true, true, 7, 9, 0, 1.0, 0.0, 0, 0, 1, true});
}

TEST_CASE("gemm: zero-size m, n or k") {
  for (const auto& lt : kLayouts) {
    check_case<float>({lt[0], lt[1], 0, 5, 3, 1.0, 0.5});
    check_case<float>({lt[0], lt[1], 5, 0, 3, 1.0, 0.5});
    check_case<float>({lt[0], lt[1], 5, 7, 0, 1.0, 0.5});   // C = beta * C
    check_case<float>({lt[0], lt[1], 5, 7, 0, 1.0, 0.0});   // C = 0
    check_case<double>({lt[0], lt[1], 5, 7, 0, 2.0, -3.0});
    check_case<float>({lt[0], lt[1], 0, 0, 0, 1.0, 1.0});
  }
  // Nothing is read when there is nothing to compute: null pointers are fine.
  CHECK_NOTHROW(kiln::cpu::gemm_f32(false, false, 0, 4, 4, 1.0f, nullptr, 4, nullptr, 4, 0.0f, nullptr, 4));
  CHECK_NOTHROW(kiln::cpu::gemm_f64(true, true, 4, 0, 4, 1.0, nullptr, 4, nullptr, 4, 0.0, nullptr, 0));
  float c[4] = {1, 2, 3, 4};
  kiln::cpu::gemm_f32(false, false, 2, 2, 0, 1.0f, nullptr, 0, nullptr, 2, 2.0f, c, 2);
  CHECK(c[0] == 2.0f);
  CHECK(c[3] == 8.0f);
}

TEST_CASE("gemm: bad arguments throw kiln::Error naming the values") {
  std::vector<float> buf(1000, 1.0f);
  std::vector<double> dbuf(1000, 1.0);
  auto message_of = [](auto&& fn) -> std::string {
    try {
      fn();
    } catch (const kiln::Error& e) {
      return e.message();
    }
    return "<no exception>";
  };
  const float* f = buf.data();
  float* fc = buf.data() + 500;
  CHECK(message_of([&] { kiln::cpu::gemm_f32(false, false, -1, 4, 4, 1, f, 4, f, 4, 0, fc, 4); }).find("m=-1") !=
        std::string::npos);
  CHECK(message_of([&] { kiln::cpu::gemm_f32(false, false, 4, 4, -2, 1, f, 4, f, 4, 0, fc, 4); }).find("k=-2") !=
        std::string::npos);
  // lda below k (not transposed) and below m (transposed: A stored k x m).
  CHECK(message_of([&] { kiln::cpu::gemm_f32(false, false, 4, 4, 5, 1, f, 4, f, 4, 0, fc, 4); }).find("lda=4") !=
        std::string::npos);
  CHECK(message_of([&] { kiln::cpu::gemm_f32(true, false, 6, 4, 3, 1, f, 5, f, 4, 0, fc, 4); }).find("lda=5") !=
        std::string::npos);
  CHECK(message_of([&] { kiln::cpu::gemm_f32(false, false, 4, 6, 3, 1, f, 3, f, 5, 0, fc, 6); }).find("ldb=5") !=
        std::string::npos);
  CHECK(message_of([&] { kiln::cpu::gemm_f32(false, true, 4, 6, 3, 1, f, 3, f, 2, 0, fc, 6); }).find("ldb=2") !=
        std::string::npos);
  CHECK(message_of([&] { kiln::cpu::gemm_f32(false, false, 4, 6, 3, 1, f, 3, f, 6, 0, fc, 5); }).find("ldc=5") !=
        std::string::npos);
  CHECK_THROWS_AS(kiln::cpu::gemm_f64(false, false, 4, 4, 4, 1, dbuf.data(), 3, dbuf.data(), 4, 0, dbuf.data() + 500, 4),
                  kiln::Error);
  CHECK_THROWS_AS(kiln::cpu::gemm_f32(false, false, 4, 4, 4, 1, nullptr, 4, f, 4, 0, fc, 4), kiln::Error);
}

TEST_CASE("gemm: results are bitwise identical with 1, 2 and 3 threads") {
  ThreadCountGuard guard;
  struct Mnk {
    int64_t m, n, k;
  };
  // Big enough to be split across threads: along N (n >= m) and along M, with ragged edges.
  const Mnk shapes[] = {{300, 700, 500}, {1000, 64, 576}, {517, 130, 900}, {129, 1030, 260}, {640, 520, 300}};
  for (const auto& lt : kLayouts)
    for (const auto& s : shapes) {
      for (int dtype = 0; dtype < 2; ++dtype) {
        std::vector<std::vector<unsigned char>> results;
        for (int threads : {1, 2, 3}) {
          kiln::set_num_threads(threads);
          const Case c{lt[0], lt[1], s.m, s.n, s.k, 0.75, 0.5, 1, 2, 3};
          std::mt19937 rng(7);
          std::vector<unsigned char> bytes;
          if (dtype == 0) {
            const auto a = make_stored<float>(c.trans_a ? c.k : c.m, c.trans_a ? c.m : c.k, c.pad_a, rng);
            const auto b = make_stored<float>(c.trans_b ? c.n : c.k, c.trans_b ? c.k : c.n, c.pad_b, rng);
            auto out = make_stored<float>(c.m, c.n, c.pad_c, rng);
            // Inexact values, so a different summation order would show.
            for (auto& x : out.data) x = std::sin(x + 0.1f);
            auto a2 = a, b2 = b;
            for (auto& x : a2.data) x = x * 1.1f + 0.013f;
            for (auto& x : b2.data) x = x * 0.9f - 0.007f;
            call_gemm(c, a2, b2, out);
            bytes.resize(out.data.size() * sizeof(float));
            std::memcpy(bytes.data(), out.data.data(), bytes.size());
          } else {
            auto a = make_stored<double>(c.trans_a ? c.k : c.m, c.trans_a ? c.m : c.k, c.pad_a, rng);
            auto b = make_stored<double>(c.trans_b ? c.n : c.k, c.trans_b ? c.k : c.n, c.pad_b, rng);
            auto out = make_stored<double>(c.m, c.n, c.pad_c, rng);
            for (auto& x : a.data) x = x * 1.1 + 0.013;
            for (auto& x : b.data) x = x * 0.9 - 0.007;
            for (auto& x : out.data) x = std::sin(x + 0.1);
            call_gemm(c, a, b, out);
            bytes.resize(out.data.size() * sizeof(double));
            std::memcpy(bytes.data(), out.data.data(), bytes.size());
          }
          results.push_back(std::move(bytes));
        }
        const std::string what = std::string(dtype == 0 ? "f32 " : "f64 ") + (lt[0] ? "T" : "N") + (lt[1] ? "T" : "N") +
                                 " " + std::to_string(s.m) + "x" + std::to_string(s.n) + "x" + std::to_string(s.k);
        CHECK_MESSAGE(results[0] == results[1], what, ": 1 and 2 threads differ");
        CHECK_MESSAGE(results[0] == results[2], what, ": 1 and 3 threads differ");
      }
    }
}

TEST_CASE("gemm: large multi-threaded problems match the reference") {
  ThreadCountGuard guard;
  kiln::set_num_threads(2);
  for (const auto& lt : kLayouts) {
    check_case<float>({lt[0], lt[1], 257, 515, 400, 1.0, 0.25, 1, 0, 2});
    check_case<float>({lt[0], lt[1], 1031, 70, 200, -1.0, 0.0, 0, 5, 0});
    check_case<double>({lt[0], lt[1], 600, 520, 50, 1.0, 0.0});
  }
}
