// `kiln train`: one run, top to bottom. Check the config, build the task (data + model), the loader,
// the optimizer and the LR schedule; then per step: fetch a batch, forward, loss, backward, clip,
// update, log; per epoch: evaluate; at the end: weights and a summary with the final metrics.
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include "engine/autograd.h"
#include "engine/optim.h"
#include "engine/thread_pool.h"
#include "io/safetensors.h"
#include "tools/commands.h"
#include "tools/train.h"

namespace kiln::tools {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string hms(double s) {
  const int64_t t = int64_t(s + 0.5);
  char buf[32];
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%lldh%02lldm", (long long)(t / 3600), (long long)(t % 3600 / 60));
  else std::snprintf(buf, sizeof buf, "%lldm%02llds", (long long)(t / 60), (long long)(t % 60));
  return buf;
}

// Writes `text` to `path` through a temporary file and a rename, so readers never see half a file.
void write_atomic(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    KILN_CHECK(f.good(), tmp, ": cannot open for writing");
    f << text;
    f.flush();
    KILN_CHECK(f.good(), tmp, ": write failed (disk full?)");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp);
    KILN_FAIL(path, ": cannot rename the temporary file into place: ", ec.message());
  }
}

std::unique_ptr<optim::Optimizer> make_optimizer(const TrainConfig& c, nn::Module& m) {
  auto groups = optim::decay_groups(m.named_parameters(), c.lr, c.weight_decay);
  if (c.optimizer == "sgd") return std::make_unique<optim::SGD>(groups, optim::SgdOptions{c.momentum, 0.0, c.nesterov});
  if (c.optimizer == "adamw") return std::make_unique<optim::AdamW>(groups);
  return std::make_unique<optim::LAMB>(groups);
}

// A progress bar on a terminal, plain lines otherwise.
class Progress {
 public:
  Progress(const std::string& mode, int64_t epochs, int64_t steps_per_epoch)
      : bar_(mode == "bar" || (mode == "auto" && ::isatty(STDOUT_FILENO))), epochs_(epochs), spe_(steps_per_epoch) {}
  void step(int64_t epoch, int64_t in_epoch, double loss, double lr, double sps, double eta_s, bool log_line) {
    if (bar_) {
      constexpr int kWidth = 24;
      const int filled = int(kWidth * in_epoch / std::max<int64_t>(spe_, 1));
      std::string b(size_t(filled), '=');
      if (filled < kWidth) b += '>' + std::string(size_t(kWidth - filled - 1), ' ');
      std::printf("\r\033[Kepoch %lld/%lld [%s] %lld/%lld loss %.4f lr %.4g %.0f samples/s ETA %s", (long long)epoch + 1,
                  (long long)epochs_, b.c_str(), (long long)in_epoch, (long long)spe_, loss, lr, sps, hms(eta_s).c_str());
      std::fflush(stdout);
    } else if (log_line) {
      std::printf("epoch %lld/%lld step %lld/%lld loss %.4f lr %.4g %.0f samples/s ETA %s\n", (long long)epoch + 1,
                  (long long)epochs_, (long long)in_epoch, (long long)spe_, loss, lr, sps, hms(eta_s).c_str());
      std::fflush(stdout);
    }
  }
  void line(const std::string& s) {
    if (bar_) std::printf("\r\033[K");
    std::printf("%s\n", s.c_str());
    std::fflush(stdout);
  }

 private:
  bool bar_;
  int64_t epochs_, spe_;
};

}  // namespace

int run_train(const TrainConfig& c) {
  const auto t_start = Clock::now();
  // ---- 1. the config, the output directory, the task: every problem before any work starts ----
  const auto problems = validate(c);
  for (const auto& p : problems) std::fprintf(stderr, "kiln train: error: %s\n", p.c_str());
  if (!problems.empty()) return 2;
  if (c.threads > 0) set_num_threads(c.threads);
  manual_seed(c.seed);
  Task task;
  try {
    task = make_task(c);
  } catch (const Error& e) {
    std::fprintf(stderr, "kiln train: error: %s\n", e.message().c_str());
    return 2;
  }
  io::LoaderOptions lo;
  lo.batch_size = c.batch;
  lo.seed = c.seed;
  lo.workers = c.workers;
  lo.drop_last = true;  // equal batches: batch-norm statistics from a handful of samples would be noise
  io::DataLoader loader(task.train_data, lo);
  const int64_t spe = loader.batches_per_epoch();
  if (spe < 1) {
    std::fprintf(stderr, "kiln train: error: --batch %lld is larger than the %lld training samples\n",
                 (long long)c.batch, (long long)task.train_data->size());
    return 2;
  }
  std::error_code ec;
  std::filesystem::create_directories(c.out, ec);
  if (ec || ::access(c.out.c_str(), W_OK) != 0) {
    std::fprintf(stderr, "kiln train: error: --out %s: cannot create or write the directory (%s)\n", c.out.c_str(),
                 ec ? ec.message().c_str() : "not writable");
    return 2;
  }

  // ---- 2. optimizer and schedule ----
  nn::Module& model = *task.model;
  auto opt = make_optimizer(c, model);
  const int64_t total_steps = c.max_steps > 0 ? std::min(c.max_steps, c.epochs * spe) : c.epochs * spe;
  optim::LrSchedule sched;
  sched.kind = optim::LrSchedule::parse(c.schedule);
  sched.base_lr = c.lr;
  sched.warmup_steps = c.warmup >= 0 ? c.warmup : task.name == "mlm" || c.model.rfind("bert-", 0) == 0 ? total_steps * 6 / 100 : 0;
  sched.total_steps = total_steps;
  sched.step_size = std::max<int64_t>(spe, 1);  // "step": decay once per epoch
  sched.milestones = {total_steps / 2, total_steps * 3 / 4};
  const std::vector<Tensor> params = model.parameters();

  nlohmann::json resolved = c.to_json();
  resolved["task"] = task.name;
  resolved["threads"] = num_threads();
  resolved["warmup"] = sched.warmup_steps;
  resolved["steps_per_epoch"] = spe;
  resolved["total_steps"] = total_steps;
  resolved["parameters"] = model.num_parameters();
  resolved["data_info"] = task.data_info;
  std::ofstream metrics(c.out + "/metrics.jsonl", std::ios::trunc);
  KILN_CHECK(metrics.good(), c.out, "/metrics.jsonl: cannot open for writing");
  Progress progress(c.progress, c.epochs, spe);
  progress.line("kiln train: " + c.model + " (" + task.name + ") on " + task.data_info.value("name", c.data) + " (" + std::to_string(task.train_data->size()) +
                " samples), " + std::to_string(model.num_parameters()) + " parameters, " +
                std::to_string(num_threads()) + " threads, " + std::to_string(total_steps) + " steps");

  // ---- 3. the loop ----
  int64_t step = 0;
  double train_seconds = 0;
  int64_t samples_seen = 0;
  EvalResult last_eval;
  nlohmann::json epochs_log = nlohmann::json::array();
  for (int64_t epoch = 0; epoch < c.epochs && step < total_steps; ++epoch) {
    model.train();
    loader.seek({epoch, 0});
    double win_loss = 0, win_data = 0, win_fb = 0, win_opt = 0;
    int64_t win_steps = 0, win_samples = 0, win_correct = 0, win_count = 0, epoch_correct = 0, epoch_count = 0;
    double epoch_loss = 0;
    auto win_start = Clock::now();
    const auto epoch_start = Clock::now();
    while (step < total_steps) {
      auto t0 = Clock::now();
      std::optional<io::Batch> batch = loader.next();
      if (!batch) break;
      win_data += since(t0);
      const double lr = sched.at(step);
      opt->set_lr(lr);

      t0 = Clock::now();
      StepResult r = task.step(*batch);
      const double loss = r.loss.item<double>();
      if (!std::isfinite(loss)) {
        progress.line("");
        std::fprintf(stderr,
                     "kiln train: error: the loss is %s at step %lld (epoch %lld, lr %g); stopping. Lower --lr, add "
                     "--warmup or --clip-grad-norm. Metrics so far are in %s/metrics.jsonl\n",
                     std::isnan(loss) ? "NaN" : "infinite", (long long)step, (long long)epoch + 1, lr, c.out.c_str());
        return 1;
      }
      opt->zero_grad();
      r.loss.backward();
      win_fb += since(t0);

      t0 = Clock::now();
      if (c.clip_grad_norm > 0) optim::clip_grad_norm(params, c.clip_grad_norm);
      opt->step();
      win_opt += since(t0);
      ++step;

      const int64_t bs = batch->begin()->second.size(0);
      win_loss += loss;
      ++win_steps;
      win_samples += bs;
      samples_seen += bs;
      win_correct += r.correct;
      win_count += r.count;
      epoch_correct += r.correct;
      epoch_count += r.count;
      epoch_loss += loss;
      const int64_t in_epoch = loader.position().batch;
      const bool log_now = step % c.log_every == 0 || in_epoch == spe || step == total_steps;
      const double win_s = since(win_start);
      const double sps = win_samples / std::max(win_s, 1e-9);
      const double elapsed = train_seconds + since(epoch_start);
      const double eta = elapsed / double(step) * double(total_steps - step);
      progress.step(epoch, in_epoch, win_loss / win_steps, lr, sps, eta, log_now);
      if (log_now) {
        nlohmann::json m = {{"step", step},
                            {"epoch", epoch + 1},
                            {"epoch_progress", double(in_epoch) / double(spe)},
                            {"loss", win_loss / win_steps},
                            {"train_" + task.metric, win_count ? double(win_correct) / double(win_count) : 0.0},
                            {"lr", lr},
                            {"samples_per_s", sps},
                            {"data_wait_s", win_data},
                            {"forward_backward_s", win_fb},
                            {"optimizer_s", win_opt},
                            {"elapsed_s", since(t_start)}};
        metrics << m.dump() << "\n";
        metrics.flush();
        win_loss = win_data = win_fb = win_opt = 0;
        win_steps = win_samples = win_correct = win_count = 0;
        win_start = Clock::now();
      }
    }
    const double epoch_s = since(epoch_start);
    train_seconds += epoch_s;

    // ---- 4. evaluation at the end of every epoch ----
    last_eval = evaluate(task, c);
    char buf[256];
    std::snprintf(buf, sizeof buf, "epoch %lld: train loss %.4f %s %.2f%% | test loss %.4f %s %.2f%% | %.1f s (+%.1f s eval)",
                  (long long)epoch + 1, epoch_loss / std::max<int64_t>(loader.position().batch, 1), task.metric.c_str(),
                  100.0 * epoch_correct / std::max<int64_t>(epoch_count, 1), last_eval.loss, task.metric.c_str(),
                  100.0 * last_eval.accuracy, epoch_s, last_eval.seconds);
    progress.line(buf);
    nlohmann::json em = {{"step", step},
                         {"epoch", epoch + 1},
                         {"eval_loss", last_eval.loss},
                         {"eval_" + task.metric, last_eval.accuracy},
                         {"eval_samples", last_eval.count},
                         {"epoch_seconds", epoch_s},
                         {"eval_seconds", last_eval.seconds}};
    metrics << em.dump() << "\n";
    metrics.flush();
    epochs_log.push_back(em);
  }

  // ---- 5. weights and summary ----
  std::map<std::string, std::string> meta = {{"model", c.model}, {"task", task.name}, {"format", "kiln"}};
  if (task.data_info.contains("labels")) meta["labels"] = task.data_info["labels"].dump();
  io::save_safetensors(c.out + "/model.safetensors", model.state_dict(), meta);
  const double wall = since(t_start);
  nlohmann::json summary = {{"model", c.model},
                            {"task", task.name},
                            {"steps", step},
                            {"epochs", epochs_log.size()},
                            {"test_loss", last_eval.loss},
                            {"test_" + task.metric, last_eval.accuracy},
                            {"test_samples", last_eval.count},
                            {"bad_samples_skipped", task.bad_samples ? task.bad_samples() : 0},
                            {"wall_seconds", wall},
                            {"train_seconds", train_seconds},
                            {"samples_per_s", samples_seen / std::max(train_seconds, 1e-9)},
                            {"per_epoch", epochs_log},
                            {"config", resolved}};
  write_atomic(c.out + "/summary.json", summary.dump(2) + "\n");
  char buf[256];
  std::snprintf(buf, sizeof buf, "test %s %.2f%% (%lld samples), %lld steps in %s, %.0f samples/s; wrote %s",
                task.metric.c_str(), 100.0 * last_eval.accuracy, (long long)last_eval.count, (long long)step,
                hms(wall).c_str(), samples_seen / std::max(train_seconds, 1e-9), c.out.c_str());
  progress.line(buf);
  return 0;
}

int run_eval(const TrainConfig& c0, const std::string& weights) {
  TrainConfig c = c0;
  auto problems = validate(c);
  for (const auto& p : problems) std::fprintf(stderr, "kiln eval: error: %s\n", p.c_str());
  if (!problems.empty()) return 2;
  if (c.threads > 0) set_num_threads(c.threads);
  Task task;
  try {
    const io::SafetensorsFile f = io::load_safetensors(weights);
    // A classifier's label names travel with its weights, so ids mean the same classes here.
    if (auto it = f.metadata.find("labels"); it != f.metadata.end())
      c.label_names = nlohmann::json::parse(it->second).get<std::vector<std::string>>();
    task = make_task(c);
    task.model->load_state_dict(f.tensors, /*strict=*/true);
  } catch (const Error& e) {
    std::fprintf(stderr, "kiln eval: error: %s\n", e.message().c_str());
    return 2;
  }
  const EvalResult r = evaluate(task, c);
  nlohmann::json j = {{"model", c.model},           {"weights", weights},     {"data", task.data_info},
                      {"test_loss", r.loss},        {"test_" + task.metric, r.accuracy},
                      {"test_samples", r.count},    {"seconds", r.seconds}};
  std::printf("test %s %.2f%% loss %.4f (%lld samples, %.1f s)\n", task.metric.c_str(), 100.0 * r.accuracy, r.loss,
              (long long)r.count, r.seconds);
  if (!c.out.empty()) write_atomic(c.out, j.dump(2) + "\n");
  return 0;
}

}  // namespace kiln::tools
