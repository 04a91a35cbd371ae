// nn kernel benchmark: conv2d on ResNet-20 and ResNet-50 layer shapes, each pass (forward, input gradient,
// weight gradient, each timed alone) and all three in one run, in ms and GFLOP/s; layer norm and softmax
// forward+backward, and the plain loops (add, a dropout mask, an AdamW step), in GB/s. No peer runs beside it (Kiln's
// rule asks for one): these layers are compared with PyTorch inside whole training steps by bench/train_vs_torch.py,
// where a per-layer torch timing would need a torch install this C++ program cannot assume. Prints a table; --json FILE
// writes the rows.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kiln.h"
#include "bench/bench_main.h"

using namespace kiln;

namespace {

using bench::median_ms;

struct ConvCase {
  const char* name;
  int64_t n, c, h, w, o, k, s, p;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("CPU convolution, pooling and normalisation layers", "bench_nn");
  bench::CommonFlags flags;
  bench::add_common_flags(app, flags);
  int reps_flag = 0;
  std::string only;
  app.add_option("--reps", reps_flag, "Timed repetitions of each case, the median reported (default 5; 2 with --quick)")
      ->check(bench::whole_number(0));
  app.add_option("--only", only, "Run the cases whose name contains this text");
  if (const int rc = bench::start(app, flags, argc, argv); rc >= 0) return rc;
  const std::string& json_path = flags.json;
  if (!bench::json_path_ok("bench_nn", json_path)) return 2;
  const bool quick = flags.quick;
  const int reps = reps_flag > 0 ? reps_flag : quick ? 2 : 5;
  auto wanted = [&](const char* name) { return only.empty() || std::string(name).find(only) != std::string::npos; };
  nlohmann::json rows = nlohmann::json::array();
  std::vector<ConvCase> convs = {
      {"resnet20 stage1 3x3 (32px)", 128, 16, 32, 32, 16, 3, 1, 1},
      {"resnet20 stage2 3x3 (32px)", 128, 32, 16, 16, 32, 3, 1, 1},
      {"resnet20 stage3 3x3 (32px)", 128, 64, 8, 8, 64, 3, 1, 1},
      {"resnet20 stage1 3x3 (28px)", 128, 16, 28, 28, 16, 3, 1, 1},
      {"resnet20 stage2 3x3 (28px)", 128, 32, 14, 14, 32, 3, 1, 1},
      {"resnet20 stage3 3x3 (28px)", 128, 64, 7, 7, 64, 3, 1, 1},
      {"resnet20 stage2 3x3/2 (28px)", 128, 16, 28, 28, 32, 3, 2, 1},
      {"resnet20 stage3 3x3/2 (28px)", 128, 32, 14, 14, 64, 3, 2, 1},
      {"resnet20 stage2 3x3/2 (32px)", 128, 16, 32, 32, 32, 3, 2, 1},
      {"resnet20 stage3 3x3/2 (32px)", 128, 32, 16, 16, 64, 3, 2, 1},
      {"resnet50 conv1 7x7/2", 8, 3, 224, 224, 64, 7, 2, 3},
      {"resnet50 layer1 3x3", 8, 64, 56, 56, 64, 3, 1, 1},
      {"resnet50 layer3 1x1", 8, 1024, 14, 14, 256, 1, 1, 0},
      {"resnet50 layer4 3x3", 8, 512, 7, 7, 512, 3, 1, 1},
  };
  if (quick) convs.resize(2);
  enum class MemOp { layer_norm, softmax, bn_relu, bn_add_relu };
  struct Mem {
    const char* name;
    MemOp op;
    Shape shape;
  };
  // Batch norm + ReLU, and with ResNet's shortcut added before the ReLU, on ResNet-20's first stage (one op,
  // batch_norm_relu: see kernels/cpu/batch_norm.cpp).
  std::vector<Mem> mems = {{"layer_norm (BERT-base)", MemOp::layer_norm, {4096, 768}},
                           {"softmax (attention)", MemOp::softmax, {8 * 12 * 128, 128}},
                           {"layer_norm (BERT-large)", MemOp::layer_norm, {4096, 1024}},
                           {"batch_norm_relu (ResNet-20)", MemOp::bn_relu, {128, 16, 32, 32}},
                           {"bn + add + relu (ResNet-20)", MemOp::bn_add_relu, {128, 16, 32, 32}}};
  if (quick) mems.resize(1);
  // The plain loops of the kernel set (kernels/cpu/isa/loops.inc) at BERT-tiny's sizes: an elementwise add of
  // its embedding gradient, the dropout mask of its attention probabilities, its AdamW step.
  struct Loop {
    const char* name;
    int64_t n;
    double bytes_per;  // bytes each element moves
    std::function<std::function<void()>(int64_t)> make;
  };
  const std::vector<Loop> loops = {
      {"add", 30522 * 128, 12,
       [](int64_t n) {
         auto a = std::make_shared<Tensor>(randn({n})), b = std::make_shared<Tensor>(randn({n}));
         return std::function<void()>([a, b] { (void)(*a + *b); });
       }},
      {"bernoulli (dropout mask)", 32 * 2 * 128 * 128, 4,
       [](int64_t n) { return std::function<void()>([n] { (void)bernoulli({n}, 0.9); }); }},
      {"adamw step", 30522 * 128 + 400000, 28,
       [](int64_t n) {
         Tensor w = randn({n}).set_requires_grad();
         w.set_grad(randn({n}) * 0.01);
         auto opt = std::make_shared<optim::AdamW>(std::vector<optim::ParamGroup>{optim::ParamGroup({w}, 1e-3, 0.01)});
         return std::function<void()>([opt] { opt->step(); });
       }},
  };
  // --only that selects nothing is an error before any table header is printed.
  int matched = 0;  // cases --only selected
  for (const ConvCase& cc : convs) matched += wanted(cc.name);
  for (const Mem& m : mems) matched += wanted(m.name);
  for (const Loop& l : loops) matched += wanted(l.name);
  if (matched == 0) {
    std::fprintf(stderr, "bench_nn: error: no case matches --only '%s'%s\n", only.c_str(),
                 quick ? " (--quick runs the first cases of each table only)" : "");
    return 2;
  }
  std::printf("bench_nn: %s\nconv2d forward + backward (f32, %d thread%s)\n", kiln::bench::cpu_line().c_str(),
              num_threads(), num_threads() == 1 ? "" : "s");
  std::printf("%-28s %-18s %9s %9s %9s %9s %8s %8s %8s %8s\n", "layer", "input", "fwd ms", "dgrad ms", "wgrad ms",
              "all ms", "fwd GF/s", "dgr GF/s", "wgr GF/s", "all GF/s");
  for (const ConvCase& cc : convs) {
    if (!wanted(cc.name)) continue;
    const Tensor x0 = randn({cc.n, cc.c, cc.h, cc.w});
    const Tensor w0 = randn({cc.o, cc.c, cc.k, cc.k}) * 0.05;
    const int64_t oh = (cc.h + 2 * cc.p - cc.k) / cc.s + 1, ow = (cc.w + 2 * cc.p - cc.k) / cc.s + 1;
    const double flops_fwd = 2.0 * double(cc.n) * cc.o * oh * ow * cc.c * cc.k * cc.k;
    const Tensor gy = randn({cc.n, cc.o, oh, ow});
    const double fwd = median_ms([&] {
      NoGradGuard ng;
      conv2d(x0, w0, {}, {cc.s, cc.s}, {cc.p, cc.p});
    }, reps);
    // Each backward pass timed alone: the forward that records it runs untimed before each rep. The
    // gradients are cleared inside the timed run (as a training step's zero_grad), so no rep adds
    // into the last one's.
    Tensor x = x0.detach(), w = w0.detach();
    const auto clear = [&] {
      x.set_grad(Tensor());
      w.set_grad(Tensor());
    };
    auto backward_ms = [&](bool gx, bool gw) {
      x = x0.detach().set_requires_grad(gx);
      w = w0.detach().set_requires_grad(gw);
      Tensor y;
      return median_ms(
          [&] {
            y.backward(gy);
            clear();
          },
          reps, {},
          [&] {
            y = conv2d(x, w, {}, {cc.s, cc.s}, {cc.p, cc.p});
          });
    };
    const double dgrad = backward_ms(true, false);
    const double wgrad = backward_ms(false, true);
    // All three passes in one timed run.
    x = x0.detach().set_requires_grad(true);
    w = w0.detach().set_requires_grad(true);
    const double both = median_ms(
        [&] {
          conv2d(x, w, {}, {cc.s, cc.s}, {cc.p, cc.p}).backward(gy);
          clear();
        },
        reps);
    auto gf = [&](double ms, double passes) { return passes * flops_fwd / (ms * 1e-3) / 1e9; };
    char shape[64];
    std::snprintf(shape, sizeof shape, "[%lld,%lld,%lld,%lld]", (long long)cc.n, (long long)cc.c, (long long)cc.h,
                  (long long)cc.w);
    std::printf("%-28s %-18s %9.2f %9.2f %9.2f %9.2f %8.1f %8.1f %8.1f %8.1f\n", cc.name, shape, fwd, dgrad, wgrad,
                both, gf(fwd, 1), gf(dgrad, 1), gf(wgrad, 1), gf(both, 3));
    rows.push_back({{"op", "conv2d"},
                    {"name", cc.name},
                    {"input", shape},
                    {"kernel", cc.k},
                    {"out_channels", cc.o},
                    {"fwd_ms", fwd},
                    {"dgrad_ms", dgrad},
                    {"wgrad_ms", wgrad},
                    {"fwd_bwd_ms", both},
                    {"gflops", gf(both, 3)},
                    {"fwd_gflops", gf(fwd, 1)},
                    {"dgrad_gflops", gf(dgrad, 1)},
                    {"wgrad_gflops", gf(wgrad, 1)}});
  }

  std::printf("\nmemory-bound ops, forward + backward (f32)\n");
  std::printf("%-28s %-22s %10s %10s\n", "op", "shape", "ms", "GB/s");
  for (const Mem& m : mems) {
    if (!wanted(m.name)) continue;
    const bool bn = m.op == MemOp::bn_relu || m.op == MemOp::bn_add_relu, shortcut = m.op == MemOp::bn_add_relu;
    Tensor x = randn(m.shape).set_requires_grad();
    const int64_t d = bn ? m.shape[1] : m.shape.back();
    Tensor g = ones({d}).set_requires_grad(), b = zeros({d}).set_requires_grad();
    Tensor res = shortcut ? randn(m.shape).set_requires_grad() : Tensor();
    const Tensor rm = zeros({d}), rv = ones({d});
    const Tensor gy = randn(m.shape);
    const double ms = median_ms([&] {
      x.set_grad(Tensor());
      if (shortcut) res.set_grad(Tensor());
      Tensor y = m.op == MemOp::layer_norm ? layer_norm(x, {d}, g, b)
                 : bn                      ? batch_norm_relu(x, rm, rv, g, b, true, 0.1, 1e-5, res)
                                           : softmax(x, -1);
      y.backward(gy);
    }, reps * 2);
    // Bytes the fused kernels must move: forward reads x, writes y; backward reads x (or y) and gy, writes gx.
    // Batch norm + ReLU: backward reads x, y and gy; the shortcut adds its read and its gradient's write.
    const double bytes = double(x.numel()) * 4.0 * (bn ? (shortcut ? 8.0 : 6.0) : 5.0);
    const double gbs = bytes / (ms * 1e-3) / 1e9;
    std::printf("%-28s %-22s %10.3f %10.1f\n", m.name, Tensor(x).type_str().c_str(), ms, gbs);
    const char* op = m.op == MemOp::layer_norm ? "layer_norm"
                     : m.op == MemOp::softmax  ? "softmax"
                     : shortcut                ? "bn_add_relu"
                                               : "batch_norm_relu";
    rows.push_back({{"op", op}, {"name", m.name}, {"shape", m.shape}, {"ms", ms}, {"gbps", gbs}});
  }
  std::printf("\nplain loops (f32)\n");
  std::printf("%-28s %-22s %10s %10s\n", "op", "shape", "ms", "GB/s");
  for (const Loop& l : loops) {
    if (!wanted(l.name)) continue;
    const double ms = median_ms(l.make(l.n), reps * 2);
    const double gbs = double(l.n) * l.bytes_per / (ms * 1e-3) / 1e9;
    char shape[64];
    std::snprintf(shape, sizeof shape, "f32 [%lld]", (long long)l.n);
    std::printf("%-28s %-22s %10.3f %10.1f\n", l.name, shape, ms, gbs);
    rows.push_back({{"op", l.name}, {"name", l.name}, {"shape", {l.n}}, {"ms", ms}, {"gbps", gbs}});
  }
  const nlohmann::json doc = {{"benchmark", "nn"},
                              {"cpu", tools::cpu_model()},
                              {"cpu_kernels", cpu_isa_name(cpu_isa())},
                              {"threads", num_threads()},
                              {"rows", rows}};
  return bench::write_json("bench_nn", json_path, doc) ? 0 : 1;
}
