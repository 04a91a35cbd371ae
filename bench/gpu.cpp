// GPU benchmark: the memory-bound kernels (elementwise, cast, reduction, softmax, masked softmax, layer norm,
// cross-entropy) in GB/s against the device's measured copy bandwidth and its datasheet peak;
// cuBLASLt GEMM in TFLOP/s (f16, bf16, f32 and TF32) against the datasheet peak; cuDNN convolutions
// of ResNet-50 forward + backward. Prints tables; --json FILE writes every row. With no GPU it says
// so and measures nothing.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/runtime_info.h"
#include "kernels/cuda/tc_gemm.h"
#include "kiln.h"
#include "bench/bench_main.h"

using namespace kiln;

namespace {

const Device kGpu = cuda_device(0);

// Median milliseconds of fn over reps runs, each timed from an idle device to an idle device.
double median_ms(const std::function<void()>& fn, int reps) {
  return bench::median_ms(fn, reps, [] { cuda::synchronize(0); });
}

// Datasheet numbers by device name (dense, no sparsity): memory TB/s, f16/bf16 and TF32 tensor
// TFLOP/s, f32 TFLOP/s. Unknown devices get 0 and their rows show no percentage.
struct Peak {
  const char* name_part;
  double tbps, tf16, tf32_tc, tf32;
};
constexpr Peak kPeaks[] = {
    {"H200", 4.8, 989, 494, 67},   {"H100 SXM", 3.35, 989, 494, 67}, {"H100 PCIe", 2.0, 756, 378, 51},
    {"H100", 3.35, 989, 494, 67},  {"A100-SXM4-80GB", 2.04, 312, 156, 19.5}, {"A100", 1.56, 312, 156, 19.5},
    {"L40S", 0.864, 362, 183, 91.6}, {"L4", 0.3, 121, 60, 30}, {"A10", 0.6, 125, 62.5, 31.2},
    {"T4", 0.32, 65, 0, 8.1},      {"RTX 4090", 1.0, 165, 82.6, 82.6},
};
Peak peak_of(const std::string& name) {
  for (const Peak& p : kPeaks)
    if (name.find(p.name_part) != std::string::npos) return p;
  return {"", 0, 0, 0, 0};
}

std::string pct(double x, double of) {
  if (of <= 0) return "-";
  char b[32];
  std::snprintf(b, sizeof b, "%.0f%%", 100.0 * x / of);
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("GPU kernels against bandwidth and cuBLASLt/cuDNN", "bench_gpu");
  bench::CommonFlags flags;
  bench::add_common_flags(app, flags, /*threads=*/false);
  if (const int rc = bench::start(app, flags, argc, argv); rc >= 0) return rc;
  const std::string& json_path = flags.json;
  if (!bench::json_path_ok("bench_gpu", json_path)) return 2;
  const bool quick = flags.quick;
  nlohmann::json out;
  if (cuda::device_count() == 0) {
    const std::string why = cuda::compiled() ? "no CUDA device visible" : "this build has no CUDA backend";
    std::printf("bench_gpu: %s; nothing measured\n", why.c_str());
    out = {{"skipped", why}};
    return bench::write_json("bench_gpu", json_path, out) ? 0 : 1;
  }
  const cuda::RuntimeInfo info = cuda::query_runtime();
  const std::string dev_name = info.devices.at(0).name;
  const Peak peak = peak_of(dev_name);
  const int reps = quick ? 3 : 10;
  NoGradGuard no_grad;
  out["device"] = dev_name;
  out["datasheet"] = {{"memory_TBps", peak.tbps}, {"f16_TFLOPs", peak.tf16}, {"tf32_TFLOPs", peak.tf32_tc},
                      {"f32_TFLOPs", peak.tf32}};

  // ---- memory-bound kernels ----
  const int64_t n = quick ? (int64_t(1) << 24) : (int64_t(1) << 26);  // 64 Mi f32 = 256 MiB
  const TensorOptions f32(DType::f32, kGpu);
  Tensor a = randn({n}, f32), b = randn({n}, f32);
  const double copy_ms = median_ms([&] { (void)a.clone(); }, reps);
  const double copy_gbps = 2.0 * 4 * double(n) / copy_ms / 1e6;
  const int64_t rows = n / 1024, cols = 1024;
  Tensor x2 = randn({rows, cols}, f32), g2 = randn({rows, cols}, f32), gamma = ones({cols}, f32), beta = zeros({cols}, f32);
  const Tensor row_mask = randn({cols}, f32);  // an attention padding mask shared by every row
  const int64_t ce_rows = n / 32768;
  Tensor logits = randn({ce_rows, 32768}, f32), target = randint(0, 32768, {ce_rows}, TensorOptions(DType::i64, kGpu));
  struct Mem {
    const char* name;
    double bytes;
    std::function<void()> fn;
  };
  const double fb = 4.0 * double(n);
  std::vector<Mem> mems = {
      {"copy (clone)", 2 * fb, [&] { (void)a.clone(); }},
      {"add a + b", 3 * fb, [&] { (void)(a + b); }},
      {"gelu", 2 * fb, [&] { (void)gelu(a); }},
      {"cast f32 -> bf16", fb * 1.5, [&] { (void)a.to(DType::bf16); }},
      {"sum (all)", fb, [&] { (void)sum(a); }},
      {"sum over rows [R,1024]", fb, [&] { (void)sum(x2, {0}); }},
      {"softmax fwd [R,1024]", 2 * fb, [&] { (void)softmax(x2, 1); }},
      // Attention's scores: the fused kernel against scale, mask add and softmax as three ops (same
      // useful bytes, so the GB/s columns compare the two directly).
      {"masked_softmax fwd [R,1024]", 2 * fb, [&] { (void)masked_softmax(x2, row_mask, 0.125); }},
      {"x*s + mask, softmax (3 ops)", 2 * fb, [&] { (void)softmax(x2 * 0.125 + row_mask, 1); }},
      {"layer_norm fwd [R,1024]", 2 * fb, [&] { (void)layer_norm(x2, {cols}, gamma, beta); }},
      {"cross_entropy fwd [R,32768]", fb, [&] { (void)cross_entropy(logits, target); }},
  };
  std::printf("%s: memory-bound kernels, f32, %lld elements (measured copy bandwidth %.0f GB/s, datasheet %.0f GB/s)\n",
              dev_name.c_str(), (long long)n, copy_gbps, peak.tbps * 1000);
  std::printf("%-30s %10s %10s %10s %10s\n", "kernel", "ms", "GB/s", "% copy", "% peak");
  nlohmann::json mem_rows = nlohmann::json::array();
  for (const Mem& m : mems) {
    const double ms = median_ms(m.fn, reps), gbps = m.bytes / ms / 1e6;
    std::printf("%-30s %10.3f %10.0f %10s %10s\n", m.name, ms, gbps, pct(gbps, copy_gbps).c_str(),
                pct(gbps, peak.tbps * 1000).c_str());
    mem_rows.push_back({{"kernel", m.name}, {"ms", ms}, {"GBps", gbps}, {"bytes", m.bytes}});
  }
  // Backward passes: gradients through autograd (forward excluded from the time).
  {
    GradMode::set_enabled(true);
    Tensor xs = x2.detach().set_requires_grad(true);
    struct Bwd {
      const char* name;
      double bytes;
      std::function<Tensor()> fwd;
    };
    std::vector<Bwd> bwds = {
        {"softmax bwd [R,1024]", 3 * fb, [&] { return softmax(xs, 1); }},
        {"layer_norm bwd [R,1024]", 3 * fb, [&] { return layer_norm(xs, {cols}, gamma, beta); }},
    };
    for (const Bwd& bw : bwds) {
      // The forward runs untimed before each rep (and the device settles), so the backward is timed
      // alone, not as a difference of two medians.
      Tensor y;
      const double bms = bench::median_ms(
          [&] {
            y.backward(g2);
            xs.set_grad(Tensor());
          },
          reps, [] { cuda::synchronize(0); }, [&] { y = bw.fwd(); });
      const double gbps = bw.bytes / bms / 1e6;
      std::printf("%-30s %10.3f %10.0f %10s %10s\n", bw.name, bms, gbps, pct(gbps, copy_gbps).c_str(),
                  pct(gbps, peak.tbps * 1000).c_str());
      mem_rows.push_back({{"kernel", bw.name}, {"ms", bms}, {"GBps", gbps}, {"bytes", bw.bytes}});
      xs.set_grad(Tensor());
    }
    GradMode::set_enabled(false);
  }
  out["memory_bound"] = mem_rows;
  out["copy_GBps"] = copy_gbps;
  a = b = x2 = g2 = logits = Tensor();

  // ---- GEMM through cuBLASLt ----
  std::printf("\ncuBLASLt GEMM (C = A B, row-major, TFLOP/s)\n");
  std::printf("%-8s %-18s %10s %10s %10s\n", "dtype", "m x n x k", "ms", "TFLOP/s", "% peak");
  nlohmann::json gemm_rows = nlohmann::json::array();
  const std::vector<int64_t> sizes = quick ? std::vector<int64_t>{2048, 4096} : std::vector<int64_t>{2048, 4096, 8192};
  struct G {
    const char* name;
    DType dt;
    bool tf32;
    double peak;
  };
  for (const G& g : {G{"f16", DType::f16, false, peak.tf16}, G{"bf16", DType::bf16, false, peak.tf16},
                     G{"tf32", DType::f32, true, peak.tf32_tc}, G{"f32", DType::f32, false, peak.tf32}}) {
    cuda::set_allow_tf32(g.tf32);
    for (int64_t s : sizes) {
      const Tensor A = randn({s, s}, TensorOptions(g.dt, kGpu)), B = randn({s, s}, TensorOptions(g.dt, kGpu));
      const double ms = median_ms([&] { (void)matmul(A, B); }, reps);
      const double tf = 2.0 * double(s) * double(s) * double(s) / ms / 1e9;
      std::printf("%-8s %-18s %10.3f %10.1f %10s\n", g.name,
                  (std::to_string(s) + "^3").c_str(), ms, tf, pct(tf, g.peak).c_str());
      gemm_rows.push_back({{"dtype", g.name}, {"m", s}, {"n", s}, {"k", s}, {"ms", ms}, {"TFLOPs", tf}});
    }
  }
  cuda::set_allow_tf32(false);
  out["gemm"] = gemm_rows;

  // ---- Kiln's Tensor Core GEMM against cuBLASLt ----
  std::string why_not;
  if (cuda::tc_gemm_supported(0, &why_not)) {
    std::printf("\nKiln Tensor Core GEMM vs cuBLASLt (f16 in, f16 out, f32 accumulation; TFLOP/s)\n");
    std::printf("%-26s %-20s %10s %10s %10s %10s\n", "shape", "m x n x k", "kiln", "cuBLASLt", "kiln/Lt", "% peak");
    struct S {
      std::string name;
      int64_t m, n, k;
    };
    std::vector<S> shapes;
    for (int64_t s2 : quick ? std::vector<int64_t>{1024, 4096} : std::vector<int64_t>{512, 1024, 2048, 4096, 8192})
      shapes.push_back({"square", s2, s2, s2});
    shapes.insert(shapes.end(), {{"BERT-base FFN up", 4096, 3072, 768}, {"BERT-base FFN down", 4096, 768, 3072},
                                 {"BERT-base QKV", 4096, 2304, 768},    {"BERT-large FFN up", 4096, 4096, 1024},
                                 {"BERT-large FFN down", 4096, 1024, 4096}, {"ResNet-50 1x1 56px", 100352, 256, 64},
                                 {"ResNet-50 1x1 14px", 6272, 1024, 256}});
    nlohmann::json tc_rows = nlohmann::json::array();
    for (const S& sh : shapes) {
      const Tensor A = randn({sh.m, sh.k}, TensorOptions(DType::f16, kGpu)), B = randn({sh.k, sh.n}, TensorOptions(DType::f16, kGpu));
      cuda::set_gemm_backend("kiln");
      const double ms_k = median_ms([&] { (void)matmul(A, B); }, reps);
      cuda::set_gemm_backend("cublaslt");
      const double ms_l = median_ms([&] { (void)matmul(A, B); }, reps);
      const double fl = 2.0 * double(sh.m) * double(sh.n) * double(sh.k);
      char dims[48];
      std::snprintf(dims, sizeof dims, "%lldx%lldx%lld", (long long)sh.m, (long long)sh.n, (long long)sh.k);
      std::printf("%-26s %-20s %10.1f %10.1f %9.0f%% %10s\n", sh.name.c_str(), dims, fl / ms_k / 1e9, fl / ms_l / 1e9,
                  100.0 * ms_l / ms_k, pct(fl / ms_k / 1e9, peak.tf16).c_str());
      tc_rows.push_back({{"shape", sh.name}, {"m", sh.m}, {"n", sh.n}, {"k", sh.k}, {"kiln_ms", ms_k}, {"cublaslt_ms", ms_l}});
    }
    // Fusion: Linear + bias + GELU as one kernel against cuBLASLt GEMM, then bias add and GELU.
    std::printf("\nLinear + bias + GELU, BERT FFN up-projections (ms)\n");
    std::printf("%-26s %12s %22s %10s\n", "shape", "kiln fused", "cuBLASLt + bias + gelu", "speed-up");
    for (const S& sh : {S{"BERT-base FFN up", 4096, 3072, 768}, S{"BERT-large FFN up", 4096, 4096, 1024}}) {
      const Tensor A = randn({sh.m, sh.k}, TensorOptions(DType::f16, kGpu)), B = randn({sh.k, sh.n}, TensorOptions(DType::f16, kGpu));
      const Tensor bias32 = randn({sh.n}, f32), bias16 = bias32.to(DType::f16);
      Tensor o = empty({sh.m, sh.n}, TensorOptions(DType::f16, kGpu));
      cuda::TcGemmArgs g;
      g.in_dtype = g.out_dtype = DType::f16;
      g.M = sh.m;
      g.N = sh.n;
      g.K = sh.k;
      g.lda = sh.k;
      g.ldb = g.ldc = sh.n;
      g.a = A.raw_data();
      g.b = B.raw_data();
      g.out = o.raw_data();
      g.bias = bias32.data<float>();
      g.ep.act = tcgemm::Activation::gelu_erf;
      const double fused = median_ms([&] { cuda::tc_gemm(g, cuda::compute_stream(0)); }, reps);
      const double split = median_ms([&] { (void)gelu(matmul(A, B) + bias16); }, reps);
      std::printf("%-26s %12.3f %22.3f %9.2fx\n", sh.name.c_str(), fused, split, split / fused);
      tc_rows.push_back({{"shape", sh.name + " + bias + gelu"}, {"kiln_fused_ms", fused}, {"cublaslt_bias_gelu_ms", split}});
    }
    cuda::set_gemm_backend("auto");
    out["tc_gemm"] = tc_rows;
  } else {
    std::printf("\nKiln Tensor Core GEMM: not measured (%s)\n", why_not.c_str());
    out["tc_gemm"] = {{"skipped", why_not}};
  }

  // ---- ResNet-50 convolutions, forward + backward ----
  struct Conv {
    const char* name;
    int64_t c, h, o, k, s, p;
  };
  const std::vector<Conv> convs = {{"conv1 7x7/2", 3, 224, 64, 7, 2, 3},       {"layer1 1x1", 64, 56, 64, 1, 1, 0},
                                   {"layer1 3x3", 64, 56, 64, 3, 1, 1},        {"layer2 3x3", 128, 28, 128, 3, 1, 1},
                                   {"layer3 3x3", 256, 14, 256, 3, 1, 1},      {"layer4 3x3", 512, 7, 512, 3, 1, 1},
                                   {"layer4 1x1 expand", 512, 7, 2048, 1, 1, 0}};
  const int64_t batch = quick ? 32 : 128;
  std::printf("\ncuDNN conv2d, ResNet-50 layers, batch %lld, forward + backward (data and filter)\n", (long long)batch);
  std::printf("(NHWC: input and output gradient channels_last, as `kiln train --channels-last` runs them)\n");
  std::printf("%-20s %-6s %-6s %10s %10s %10s %10s\n", "layer", "dtype", "layout", "fwd ms", "fwd+bwd ms", "TFLOP/s",
              "% peak");
  nlohmann::json conv_rows = nlohmann::json::array();
  GradMode::set_enabled(true);
  struct Variant {
    DType dt;
    MemoryFormat fmt;
  };
  for (const Variant& var : {Variant{DType::f16, MemoryFormat::contiguous}, Variant{DType::f16, MemoryFormat::channels_last},
                             Variant{DType::f32, MemoryFormat::contiguous}}) {
    const DType dt = var.dt;
    const char* layout = var.fmt == MemoryFormat::channels_last ? "NHWC" : "NCHW";
    for (const Conv& c : convs) {
      const TensorOptions o(dt, kGpu);
      Tensor x = randn({batch, c.c, c.h, c.h}, o).contiguous(var.fmt).detach().set_requires_grad(true);
      Tensor w = (randn({c.o, c.c, c.k, c.k}, o) * 0.05).detach().set_requires_grad(true);
      const int64_t oh = (c.h + 2 * c.p - c.k) / c.s + 1;
      const Tensor gy = randn({batch, c.o, oh, oh}, o).contiguous(var.fmt);
      const double fwd = median_ms([&] { (void)conv2d(x.detach(), w.detach(), {}, {c.s, c.s}, {c.p, c.p}); }, reps);
      const double all = median_ms(
          [&] {
            conv2d(x, w, {}, {c.s, c.s}, {c.p, c.p}).backward(gy);
            x.set_grad(Tensor());
            w.set_grad(Tensor());
          },
          reps);
      const double flops = 3.0 * 2.0 * double(batch * c.o * oh * oh) * double(c.c * c.k * c.k);
      const double tf = flops / all / 1e9;
      const double pk = dt == DType::f16 ? peak.tf16 : peak.tf32;
      std::printf("%-20s %-6s %-6s %10.3f %10.3f %10.1f %10s\n", c.name, dtype_name(dt), layout, fwd, all, tf,
                  pct(tf, pk).c_str());
      conv_rows.push_back({{"layer", c.name}, {"dtype", dtype_name(dt)}, {"layout", layout}, {"batch", batch},
                           {"fwd_ms", fwd}, {"fwd_bwd_ms", all}, {"TFLOPs", tf}});
    }
  }
  out["conv"] = conv_rows;
  return bench::write_json("bench_gpu", json_path, out) ? 0 : 1;
}
