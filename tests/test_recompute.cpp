// Activation recomputation (autograd::checkpoint, --recompute blocks): ResNet basic and bottleneck
// blocks, BERT layers with dropout, and autocast give bit-for-bit the loss, gradients, running
// statistics and random stream of the normal run on the CPU, and hold less memory at the peak.
#include <doctest/doctest.h>

#include <thread>

#include "kiln.h"
#include "models/bert.h"
#include "models/resnet.h"

using namespace kiln;
using namespace kiln::models;

namespace {

struct Run {
  std::vector<double> values;  // loss, every gradient, every buffer
  size_t peak = 0;             // CPU bytes held at most during forward + backward, above the start
  uint64_t rng_offset = 0;
};

Run resnet_run(const std::string& name, bool recompute, int64_t batch, int64_t size) {
  Generator g(5);
  manual_seed(7);
  ResNetConfig c{name, 10, 3};
  c.recompute = recompute;
  auto r = make_resnet(c);
  r->train();
  const Tensor x = randn({batch, 3, size, size}, TensorOptions(DType::f32), &g);
  const Tensor y = randint(0, 10, {batch}, DType::i64, &g);
  Run run;
  reset_cpu_memory_peak();
  const size_t base = cpu_memory_stats().allocated;
  {
    const Tensor loss = cross_entropy((*r)(x), y);
    loss.backward();
    run.values.push_back(loss.item<double>());
  }
  run.peak = cpu_memory_stats().peak_allocated - base;
  for (const auto& [n, p] : r->named_parameters()) {
    const auto v = p.grad().to_vector();
    run.values.insert(run.values.end(), v.begin(), v.end());
  }
  for (const auto& [n, b] : r->named_buffers()) {
    const auto v = b.to_vector();
    run.values.insert(run.values.end(), v.begin(), v.end());
  }
  return run;
}

Run bert_run(bool recompute, const char* amp) {
  manual_seed(11);
  BertConfig c = bert_config("tiny");
  c.vocab_size = 120;
  c.max_position = 64;
  c.num_layers = 3;
  c.recompute = recompute;
  BertForMaskedLM m(c);
  m.train();  // dropout on: the recomputed layers must draw the same masks
  Generator g(3);
  const Tensor ids = randint(0, 120, {4, 32}, DType::i64, &g);
  Tensor labels = randint(0, 120, {4, 32}, DType::i64, &g);
  Run run;
  reset_cpu_memory_peak();
  const size_t base = cpu_memory_stats().allocated;
  {
    std::optional<amp::AutocastGuard> ac;
    if (std::string(amp) == "bf16") ac.emplace(DType::bf16);
    Tensor logits = m.forward(ids);
    ac.reset();
    const Tensor loss = cross_entropy(logits.reshape({-1, 120}).to(DType::f32), labels.reshape({-1}));
    loss.backward();
    run.values.push_back(loss.item<double>());
  }
  run.peak = cpu_memory_stats().peak_allocated - base;
  run.rng_offset = default_generator().offset;
  for (const auto& [n, p] : m.named_parameters()) {
    if (!p.grad().defined()) continue;
    const auto v = p.grad().to_vector();
    run.values.insert(run.values.end(), v.begin(), v.end());
  }
  return run;
}

}  // namespace

TEST_CASE("recompute: ResNet basic blocks give the normal run's loss, gradients and running statistics exactly") {
  const Run a = resnet_run("resnet20", false, 8, 16), b = resnet_run("resnet20", true, 8, 16);
  CHECK(a.values.size() == b.values.size());
  CHECK(a.values == b.values);
  MESSAGE("resnet20 b8 16x16 peak: normal ", a.peak >> 10, " KiB, recompute ", b.peak >> 10, " KiB");
  CHECK(b.peak < a.peak * 3 / 4);
}

TEST_CASE("recompute: ResNet bottleneck blocks too") {
  const Run a = resnet_run("resnet50", false, 2, 32), b = resnet_run("resnet50", true, 2, 32);
  CHECK(a.values == b.values);
  MESSAGE("resnet50 b2 32x32 peak: normal ", a.peak >> 10, " KiB, recompute ", b.peak >> 10, " KiB");
  CHECK(b.peak < a.peak);
}

TEST_CASE("recompute: BERT layers replay their dropout masks; the random stream ends where the normal run's does") {
  for (const char* amp : {"off", "bf16"}) {
    const std::string mode = amp;
    CAPTURE(mode);
    const Run a = bert_run(false, amp), b = bert_run(true, amp);
    CHECK(a.values.size() > 1000);
    CHECK(a.values == b.values);
    CHECK(a.rng_offset == b.rng_offset);
    MESSAGE("bert 3 layers b4x32 (", std::string(amp), ") peak: normal ", a.peak >> 10, " KiB, recompute ",
            b.peak >> 10, " KiB");
    CHECK(b.peak < a.peak);
  }
}

TEST_CASE("recompute: parameters inside get gradients when no input requires one; without grad mode it just runs") {
  nn::Linear fc(3, 2);
  const Tensor x = randn({4, 3});  // requires no grad
  int runs = 0;
  auto fn = [&](const std::vector<Tensor>& in) {
    ++runs;
    return std::vector<Tensor>{fc(in[0])};
  };
  Tensor out = autograd::checkpoint(fn, {x})[0];
  CHECK(out.requires_grad());
  sum(out).backward();
  CHECK(runs == 2);
  const Tensor expect_w = sum(x, {0}, true).expand({2, 3});
  CHECK(allclose(fc.weight.grad(), expect_w, 1e-6, 1e-6));
  CHECK(allclose(fc.bias.grad(), full({2}, 4.0), 0, 0));
  {
    NoGradGuard ng;
    Tensor plain = autograd::checkpoint(fn, {x})[0];
    CHECK(!plain.requires_grad());
  }
  CHECK(runs == 3);
}

TEST_CASE("recompute: another thread drawing during the replay shifts no mask and keeps its draw") {
  // The replay runs on a thread-local copy of the forward's stream: a draw made by another thread
  // meanwhile (a data loader) goes to the process-wide generator, as it would without checkpoint.
  manual_seed(3);
  const Tensor x = randn({64, 32}).set_requires_grad(true);
  auto fn = [](const std::vector<Tensor>& in) {
    if (autograd::recomputing()) std::thread([] { default_generator().reserve(4096); }).join();
    return std::vector<Tensor>{dropout(in[0], 0.5, true)};
  };
  const Tensor out = autograd::checkpoint(fn, {x})[0];
  const uint64_t before = default_generator().offset;
  sum(out).backward();
  // d(sum(dropout(x)))/dx is the forward's mask times 2: zero exactly where the output is.
  const std::vector<double> g = x.grad().to_vector(), o = out.to_vector();
  size_t differ = 0, dropped = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    differ += (g[i] == 0.0) != (o[i] == 0.0);
    dropped += o[i] == 0.0;
  }
  CHECK(differ == 0);
  CHECK(dropped > 0);
  CHECK(default_generator().offset == before + 4096);
}
