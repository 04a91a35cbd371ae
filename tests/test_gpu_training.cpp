// GPU training (ctest label gpu): a few steps of ResNet-20 (SGD with momentum) and of BERT-tiny
// masked-LM (AdamW, dropout on) on CUDA follow the CPU run from the same initial weights, data and
// random streams: losses per step and the final weights agree within f32 tolerances. Skipped
// (exit 77) with no device.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <functional>

#include "engine/nn.h"
#include "engine/optim.h"
#include "kernels/cuda/cuda_backend.h"
#include "models/bert.h"
#include "io/checkpoint.h"
#include "models/resnet.h"
#include "test_util.h"

using namespace kiln;

namespace {

void skip_without_gpu() {
  if (cuda::device_count() == 0) {
    std::printf("skipped: %s\n", cuda::compiled() ? "no CUDA device visible" : "this build has no CUDA backend");
    std::exit(77);
  }
}

// Runs `steps` of training on `dev` and returns the losses; the model is built on the CPU from
// `seed` (so both runs start from the same weights) and moved.
template <typename Model>
std::vector<double> train(Device dev, const std::function<std::shared_ptr<Model>()>& build,
                          const std::function<Tensor(Model&, int, Device)>& loss_at,
                          const std::function<std::unique_ptr<optim::Optimizer>(Model&)>& make_opt, int steps,
                          nn::StateDict* final_state) {
  manual_seed(11);
  auto model = build();
  model->to(dev);
  auto opt = make_opt(*model);
  manual_seed(12);  // dropout draws the same masks on both devices
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s) {
    opt->zero_grad();
    Tensor loss = loss_at(*model, s, dev);
    loss.backward();
    opt->step();
    losses.push_back(loss.item<double>());
  }
  for (auto& [name, t] : model->state_dict()) (*final_state)[name] = t.detach().to(kCPU);
  return losses;
}

void compare_states(const nn::StateDict& cpu, const nn::StateDict& gpu, double tol) {
  REQUIRE(cpu.size() == gpu.size());
  for (const auto& [name, t] : cpu) {
    const Tensor& g = gpu.at(name);
    const Tensor diff = abs(cast(g, DType::f64) - cast(t, DType::f64));
    const double worst = diff.numel() ? amax(diff).item<double>() : 0.0;
    const double scale = t.numel() ? amax(abs(cast(t, DType::f64))).item<double>() : 0.0;
    CHECK_MESSAGE(worst <= tol * (1.0 + scale), name, ": largest difference ", worst, " (largest value ", scale, ")");
  }
}

// Losses step by step, then every weight and buffer at the end.
void compare_runs(const std::vector<double>& want, const std::vector<double>& got, const nn::StateDict& cpu_state,
                  const nn::StateDict& gpu_state) {
  REQUIRE(want.size() == got.size());
  for (size_t i = 0; i < want.size(); ++i)
    CHECK_MESSAGE(std::abs(got[i] - want[i]) <= 1e-3 * (1 + std::abs(want[i])), "step ", i, ": CPU loss ", want[i],
                  ", CUDA loss ", got[i]);
  compare_states(cpu_state, gpu_state, 2e-3);
}

}  // namespace

TEST_CASE("gpu training: ResNet-20 steps on CUDA follow the CPU") {
  skip_without_gpu();
  using M = models::ResNet;
  Generator g(3);
  const Tensor images = randn({8, 3, 32, 32}, DType::f32, &g);
  const Tensor labels = randint(0, 10, {8}, DType::i64, &g);
  auto build = [] { return models::make_resnet({"resnet20", 10, 3}); };
  auto loss_at = [&](M& m, int, Device dev) { return cross_entropy(m(images.to(dev)), labels.to(dev)); };
  auto make_opt = [](M& m) -> std::unique_ptr<optim::Optimizer> {
    return std::make_unique<optim::SGD>(std::vector<optim::ParamGroup>{{m.parameters(), 0.05, 5e-4}},
                                        optim::SgdOptions{0.9, 0.0, false});
  };
  nn::StateDict cpu_state, gpu_state;
  const auto want = train<M>(kCPU, build, loss_at, make_opt, 4, &cpu_state);
  const auto got = train<M>(cuda_device(0), build, loss_at, make_opt, 4, &gpu_state);
  compare_runs(want, got, cpu_state, gpu_state);
}

TEST_CASE("gpu training: BERT-tiny masked-LM steps on CUDA follow the CPU") {
  skip_without_gpu();
  using M = models::BertForMaskedLM;
  models::BertConfig c = models::bert_config("tiny");
  c.vocab_size = 1000;
  Generator g(4);
  const Tensor ids = randint(5, 1000, {4, 32}, DType::i64, &g);
  // Labels: the token at about 15% of positions, -100 (ignored) elsewhere.
  const Tensor picked = lt(rand({4, 32}, DType::f32, &g), scalar_tensor(0.15));
  const Tensor labels = where(picked, ids, full({4, 32}, -100.0, DType::i64));
  auto build = [c] { return std::make_shared<M>(c); };
  auto loss_at = [&](M& m, int, Device dev) {
    const Tensor logits = m.forward(ids.to(dev));
    return cross_entropy(logits.reshape({-1, c.vocab_size}), labels.to(dev).reshape({-1}));
  };
  auto make_opt = [](M& m) -> std::unique_ptr<optim::Optimizer> {
    return std::make_unique<optim::AdamW>(std::vector<optim::ParamGroup>{{m.parameters(), 1e-3, 0.01}});
  };
  nn::StateDict cpu_state, gpu_state;
  const auto want = train<M>(kCPU, build, loss_at, make_opt, 4, &cpu_state);
  const auto got = train<M>(cuda_device(0), build, loss_at, make_opt, 4, &gpu_state);
  // Adam normalises each update, so a tiny gradient difference can move a weight by up to lr.
  compare_runs(want, got, cpu_state, gpu_state);
}

TEST_CASE("gpu training: a kernel-detected bad index is reported at the next synchronisation") {
  skip_without_gpu();
  const Tensor w = randn({10, 4}, TensorOptions(DType::f32, cuda_device(0)));
  const Tensor idx = from_vector({1, 12, 3}, {3}, TensorOptions(DType::i64, cuda_device(0)));
  const std::string msg = testing::error_of([&] { embedding(w, idx).to(kCPU); });
  CHECK_MESSAGE(testing::contains(msg, "out of range"), msg);
  // The device error word is cleared: the next op works.
  CHECK(sum(w).to(kCPU).numel() == 1);
}

TEST_CASE("gpu training: a page-locked batch copied asynchronously arrives intact after its host copy is gone") {
  skip_without_gpu();
  Generator g(9);
  const Tensor host = randn({256, 1024}, DType::f32, &g);
  Tensor dev;
  {
    const Tensor pinned = pin_memory(host);
    CHECK(pinned.storage() != host.storage());
    dev = pinned.to(cuda_device(0));  // returns before the DMA is done
  }  // the pinned block goes back to the cache only after the copy has passed
  const Tensor again = pin_memory(randn({256, 1024}, DType::f32, &g));  // likely reuses the block
  (void)again;
  CHECK(allclose(dev.to(kCPU), host, 0, 0));
}

TEST_CASE("gpu training: a checkpoint written from the GPU loads on the CPU and back, optimizer state included") {
  skip_without_gpu();
  testing::TempDir d("kiln_gpu_ckpt");
  manual_seed(5);
  nn::Linear gpu_model(12, 7);
  gpu_model.to(cuda_device(0));
  optim::AdamW opt({{gpu_model.parameters(), 1e-2, 0.0}});
  const Tensor x = randn({5, 12}, TensorOptions(DType::f32, cuda_device(0)));
  sum(gpu_model(x)).backward();
  opt.step();
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const auto& [n, t] : gpu_model.state_dict()) tensors.push_back({"model." + n, t});
  for (const auto& [n, t] : opt.state().tensors) tensors.push_back({"optim." + n, t});
  io::save_checkpoint(d / "c.ckpt", tensors, "{}");

  // Onto the CPU: the same weights; then an optimizer there takes the same next step as on the GPU.
  io::CheckpointReader r(d / "c.ckpt");
  manual_seed(6);
  nn::Linear cpu_model(12, 7);
  nn::StateDict sd;
  for (const auto& [n, t] : gpu_model.state_dict()) sd[n] = r.read("model." + n);
  cpu_model.load_state_dict(sd);
  CHECK(allclose(cpu_model.weight, gpu_model.weight.to(kCPU), 0, 0));
  optim::AdamW cpu_opt({{cpu_model.parameters(), 1e-2, 0.0}});
  optim::OptimizerState st = opt.state();
  for (auto& [k, t] : st.tensors) t = r.read("optim." + k);
  cpu_opt.load_state(st);
  sum(cpu_model(x.to(kCPU))).backward();
  cpu_opt.step();
  opt.zero_grad();
  sum(gpu_model(x)).backward();
  opt.step();
  CHECK(allclose(cpu_model.weight, gpu_model.weight.to(kCPU), 1e-5, 1e-6));
  // And a CPU state dict loads into the GPU model in place.
  gpu_model.load_state_dict(cpu_model.state_dict());
  CHECK(gpu_model.weight.device() == cuda_device(0));
  CHECK(allclose(gpu_model.weight.to(kCPU), cpu_model.weight, 0, 0));
}
