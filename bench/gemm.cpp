// bench_gemm: kiln::cpu::gemm_f32 on square and transformer-shaped problems, beside OpenBLAS when the build found it.
// Prints a table (ms, GFLOP/s, OpenBLAS GFLOP/s, and the ratio Kiln/OpenBLAS of GFLOP/s: above 1, Kiln is
// faster) and, with --json FILE, writes the rows with the ratio, the repetitions and the agreement check.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/thread_pool.h"
#include "bench/bench_main.h"
#include "bench/gemm_check.h"
#include "kernels/cpu/gemm.h"

#if defined(KILN_BENCH_HAVE_CBLAS)
#include <cblas.h>
#endif

namespace {

struct Shape {
  int64_t m, n, k;
  bool trans_a, trans_b;
  bool f64;
  const char* note;
};

std::string layout_name(const Shape& s) { return std::string(s.trans_a ? "T" : "N") + (s.trans_b ? "T" : "N"); }

// Median wall time of `reps` calls after two untimed ones, in seconds. The rep count grows for fast
// problems so each measurement spans at least `min_total_s`; *reps_out gets it.
double median_seconds(const std::function<void()>& fn, int min_reps, int max_reps, double min_total_s, int* reps_out) {
  using clock = std::chrono::steady_clock;
  auto t0 = clock::now();
  fn();  // warm-up: page faults, pack buffers, pool threads awake
  fn();
  const double once = std::chrono::duration<double>(clock::now() - t0).count() / 2;
  const int reps = std::clamp(int(min_total_s / std::max(once, 1e-9)), min_reps, max_reps);
  *reps_out = reps;
  std::vector<double> times;
  for (int r = 0; r < reps; ++r) {
    auto t = clock::now();
    fn();
    times.push_back(std::chrono::duration<double>(clock::now() - t).count());
  }
  return kiln::bench::median(std::move(times));
}

template <typename T>
std::vector<T> random_matrix(int64_t count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  std::vector<T> v(static_cast<size_t>(count));
  for (auto& x : v) x = T(dist(rng));
  return v;
}

struct Row {
  Shape shape;
  double ms, gflops;
  double openblas_gflops;  // NaN when not measured
  double max_rel_diff;     // Kiln vs OpenBLAS, NaN when not measured or when either result has a NaN
  bool compared = false;   // OpenBLAS ran and the results were compared
  int reps = 0, openblas_reps = 0;
};

template <typename T>
Row run_shape(const Shape& s, bool quick) {
  const int64_t a_count = s.m * s.k, b_count = s.k * s.n, c_count = s.m * s.n;
  const auto a = random_matrix<T>(a_count, 1), b = random_matrix<T>(b_count, 2);
  std::vector<T> c(size_t(c_count), T(0));
  // Leading dimensions of the stored (possibly transposed) operands, packed tight.
  const int64_t lda = s.trans_a ? s.m : s.k, ldb = s.trans_b ? s.k : s.n, ldc = s.n;
  const int min_reps = quick ? 3 : 7, max_reps = quick ? 5 : 50;
  const double min_total = quick ? 0.05 : 0.5;
  const double flops = 2.0 * double(s.m) * double(s.n) * double(s.k);

  auto kiln_call = [&] {
    if constexpr (std::is_same_v<T, float>)
      kiln::cpu::gemm_f32(s.trans_a, s.trans_b, s.m, s.n, s.k, 1.0f, a.data(), lda, b.data(), ldb, 0.0f, c.data(), ldc);
    else
      kiln::cpu::gemm_f64(s.trans_a, s.trans_b, s.m, s.n, s.k, 1.0, a.data(), lda, b.data(), ldb, 0.0, c.data(), ldc);
  };
  int reps = 0;
  const double t = median_seconds(kiln_call, min_reps, max_reps, min_total, &reps);
  Row row{s, t * 1e3, flops / t * 1e-9, NAN, NAN};
  row.reps = reps;

#if defined(KILN_BENCH_HAVE_CBLAS)
  std::vector<T> c_ref(size_t(c_count), T(0));
  const auto ta = s.trans_a ? CblasTrans : CblasNoTrans, tb = s.trans_b ? CblasTrans : CblasNoTrans;
  auto blas_call = [&] {
    if constexpr (std::is_same_v<T, float>)
      cblas_sgemm(CblasRowMajor, ta, tb, int(s.m), int(s.n), int(s.k), 1.0f, a.data(), int(lda), b.data(), int(ldb),
                  0.0f, c_ref.data(), int(ldc));
    else
      cblas_dgemm(CblasRowMajor, ta, tb, int(s.m), int(s.n), int(s.k), 1.0, a.data(), int(lda), b.data(), int(ldb),
                  0.0, c_ref.data(), int(ldc));
  };
  const double tb_s = median_seconds(blas_call, min_reps, max_reps, min_total, &row.openblas_reps);
  row.openblas_gflops = flops / tb_s * 1e-9;
  row.compared = true;
  row.max_rel_diff = kiln::bench::max_scaled_diff(c.data(), c_ref.data(), c_count, s.k);
  // OpenBLAS workers spin for a while after a call; let them settle so they don't steal the next Kiln run's cores.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
#endif
  return row;
}

// Kiln's result agrees with OpenBLAS's (bench/gemm_check.h: a NaN in either fails); true when not compared.
bool agree(const Row& r) { return !r.compared || kiln::bench::gemm_results_agree(r.max_rel_diff, r.shape.f64); }

#if defined(KILN_BENCH_HAVE_CBLAS)
constexpr bool have_openblas = true;
#else
constexpr bool have_openblas = false;
#endif

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("f32 GEMM: Kiln's GFLOP/s, against OpenBLAS when it is installed (a column and a check of the results)",
               "bench_gemm");
  kiln::bench::CommonFlags flags;
  kiln::bench::add_common_flags(app, flags);
  std::string only;
  app.add_option("--only", only, "Run the shapes whose note or m x n x k contains this text");
  if (const int rc = kiln::bench::start(app, flags, argc, argv); rc >= 0) return rc;
  const std::string& json_path = flags.json;
  if (!kiln::bench::json_path_ok("bench_gemm", json_path)) return 2;
  const bool quick = flags.quick;
  int threads = kiln::num_threads();
#if defined(KILN_BENCH_HAVE_CBLAS)
  openblas_set_num_threads(threads);
#endif

  // BERT-base with 4096 tokens: QKV/out projection (768 -> 768), FFN up (768 -> 3072), FFN down (3072 -> 768),
  // and FFN-up's backward: dX = dY W^T (NT) and dW = X^T dY (TN). Plus a convolution's im2col GEMM, and the
  // shapes of the two models the training-step targets name.
  std::vector<Shape> shapes;
  if (quick) {
    shapes = {{256, 256, 256, false, false, false, "square"},
              {256, 256, 256, false, true, false, "square"},
              {256, 256, 256, true, false, false, "square"},
              {512, 64, 576, false, false, false, "conv-like"}};
  } else {
    shapes = {{256, 256, 256, false, false, false, "square"},
              {512, 512, 512, false, false, false, "square"},
              {1024, 1024, 1024, false, false, false, "square"},
              {2048, 2048, 2048, false, false, false, "square"},
              {4096, 768, 768, false, false, false, "bert attn proj"},
              {4096, 3072, 768, false, false, false, "bert ffn up"},
              {4096, 768, 3072, false, false, false, "bert ffn down"},
              {4096, 768, 3072, false, true, false, "ffn up dX=dY*W^T"},
              {768, 3072, 4096, true, false, false, "ffn up dW=X^T*dY"},
              {2048, 64, 576, false, false, false, "conv-like im2col"},
              // BERT-tiny (b32 x 128 tokens, hidden 128, FFN 512; the MLM head on 614 masked positions against
              // the 30522-word embedding it shares): the [cpu-speed] target's shapes.
              {4096, 128, 128, false, false, false, "bert-tiny proj"},
              {4096, 512, 128, false, false, false, "bert-tiny ffn up"},
              {4096, 128, 512, false, false, false, "bert-tiny ffn down"},
              {614, 30522, 128, false, true, false, "bert-tiny mlm logits"},
              {30522, 128, 614, true, false, false, "bert-tiny mlm dW"},
              // ResNet-20 (b128, 1x28x28): the stride-2 convolutions' weight gradients, dW = dY * im2col(X)^T.
              {32, 144, 25088, false, true, false, "resnet20 s2 wgrad"},
              {64, 288, 6272, false, true, false, "resnet20 s2 wgrad"},
              {1024, 1024, 1024, false, false, true, "square f64"}};
  }

  // --only must select something: checked before any work, as bench_ops checks --rows.
  const auto name_of = [](const Shape& s) {
    return std::to_string(s.m) + "x" + std::to_string(s.n) + "x" + std::to_string(s.k) + " " + s.note;
  };
  if (!only.empty() && std::none_of(shapes.begin(), shapes.end(),
                                    [&](const Shape& s) { return name_of(s).find(only) != std::string::npos; })) {
    std::fprintf(stderr,
                 "bench_gemm: error: no shape matches --only '%s' (a note or m x n x k such as 512x512x512%s)\n",
                 only.c_str(), quick ? "; --quick has the 256 squares and one conv-like shape only" : "");
    return 2;
  }
  std::printf("bench_gemm: %s; %d thread%s%s\n", kiln::bench::cpu_line().c_str(), threads, threads == 1 ? "" : "s",
#if defined(KILN_BENCH_HAVE_CBLAS)
              ", OpenBLAS beside Kiln"
#else
              " (built without OpenBLAS: Kiln only)"
#endif
  );
  std::printf("%-20s %-6s %-18s %10s %10s %14s %13s\n", "shape (m x n x k)", "layout", "note", "ms", "GFLOP/s",
              "OpenBLAS GF/s", "Kiln/OpenBLAS");
  nlohmann::json rows = nlohmann::json::array();
  bool mismatch = false;
  for (const auto& s : shapes) {
    if (!only.empty() && name_of(s).find(only) == std::string::npos) continue;
    const Row r = s.f64 ? run_shape<double>(s, quick) : run_shape<float>(s, quick);
    const std::string dims = std::to_string(s.m) + "x" + std::to_string(s.n) + "x" + std::to_string(s.k);
    const std::string layout = layout_name(s) + (s.f64 ? " f64" : "");
    if (std::isnan(r.openblas_gflops)) {
      std::printf("%-20s %-6s %-18s %10.3f %10.1f %14s %13s\n", dims.c_str(), layout.c_str(), s.note, r.ms, r.gflops,
                  "-", "-");
    } else {
      std::printf("%-20s %-6s %-18s %10.3f %10.1f %14.1f %12.2fx\n", dims.c_str(), layout.c_str(), s.note, r.ms,
                  r.gflops, r.openblas_gflops, r.gflops / r.openblas_gflops);
      // Loose: only a wrong result, not rounding, trips it; a NaN in either result always does.
      if (!agree(r)) {
        std::printf("  ^ Kiln and OpenBLAS disagree: max scaled difference %.3g\n", r.max_rel_diff);
        mismatch = true;
      }
    }
    std::fflush(stdout);
    nlohmann::json j = {{"m", s.m},
                        {"n", s.n},
                        {"k", s.k},
                        {"layout", layout_name(s)},
                        {"ms", r.ms},
                        {"gflops", r.gflops},
                        {"dtype", s.f64 ? "f64" : "f32"},
                        {"note", s.note},
                        {"reps", r.reps}};
    // Not measured: null (built without OpenBLAS).
    const nlohmann::json none(nullptr);
    j["openblas_gflops"] = r.compared ? nlohmann::json(r.openblas_gflops) : none;
    j["openblas_reps"] = r.compared ? nlohmann::json(r.openblas_reps) : none;
    j["kiln_over_openblas"] = r.compared ? nlohmann::json(r.gflops / r.openblas_gflops) : none;
    j["max_scaled_diff"] = !r.compared                  ? none
                           : std::isnan(r.max_rel_diff) ? nlohmann::json("nan")
                                                        : nlohmann::json(r.max_rel_diff);
    j["check"] = !r.compared ? "not compared (no OpenBLAS)" : agree(r) ? "agree" : "DISAGREE";
    rows.push_back(j);
  }
  const nlohmann::json doc = {
      {"benchmark", "gemm"},
      {"ratio", "kiln_over_openblas: Kiln GFLOP/s over OpenBLAS GFLOP/s (above 1: Kiln faster)"},
      {"peer", have_openblas ? nlohmann::json("OpenBLAS") : nlohmann::json(nullptr)},
      {"results_agree", !mismatch},
      {"cpu", kiln::bench::cpu_model()},
      {"cpu_kernels", kiln::cpu_isa_name(kiln::cpu_isa())},
      {"threads", threads},
      {"rows", rows}};
  if (!kiln::bench::write_json("bench_gemm", json_path, doc)) return 1;
  return mismatch ? 1 : 0;
}
