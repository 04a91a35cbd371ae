// `kiln train`: one run, top to bottom. Check the config, build the task (data + model), the loader,
// the optimizer and the LR schedule; then per step: fetch a batch, forward, loss, backward, clip,
// update, log; per epoch: evaluate; at the end: weights and a summary with the final metrics.
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include "engine/amp.h"
#include "engine/autocast.h"
#include "engine/autograd.h"
#include "engine/optim.h"
#include "engine/thread_pool.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "tools/commands.h"
#include "io/run_checkpoint.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/device_memory.h"
#include "kernels/cuda/nccl_comm.h"
#include "tools/train.h"

namespace kiln::tools {
using io::CheckpointMirror;
using io::RunState;
using io::LoadedRun;
using io::find_latest_checkpoint;
using io::load_run_checkpoint;
using io::prune_checkpoints;
using io::save_run_checkpoint;
using io::config_differences;
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

// The caching allocator's view of a GPU: what tensors hold, what it keeps from the device, peaks.
nlohmann::json gpu_memory_json(int device) {
  const AllocatorStats st = cuda::device_allocator(device).stats();
  const double mib = 1.0 / (1 << 20);
  return {{"allocated", double(st.allocated) * mib}, {"reserved", double(st.reserved) * mib},
          {"peak_allocated", double(st.peak_allocated) * mib}, {"peak_reserved", double(st.peak_reserved) * mib}};
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
  // mode "quiet": nothing (ranks other than 0).
  Progress(const std::string& mode, int64_t epochs, int64_t steps_per_epoch)
      : bar_(mode == "bar" || (mode == "auto" && ::isatty(STDOUT_FILENO))), quiet_(mode == "quiet"), epochs_(epochs),
        spe_(steps_per_epoch) {}
  void step(int64_t epoch, int64_t in_epoch, double loss, double lr, double sps, double eta_s, bool log_line) {
    if (quiet_) return;
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
    if (quiet_) return;
    if (bar_) std::printf("\r\033[K");
    std::printf("%s\n", s.c_str());
    std::fflush(stdout);
  }

 private:
  bool bar_, quiet_;
  int64_t epochs_, spe_;
};

// SIGINT, SIGTERM and SIGHUP ask the loop to save and stop after the current step; a second SIGINT
// leaves at once (the last complete checkpoint is never touched: writes go to temporary files).
volatile std::sig_atomic_t g_stop_signal = 0;

extern "C" void on_stop_signal(int sig) {
  if (g_stop_signal != 0 && sig == SIGINT) {
    const char msg[] = "\nkiln train: second interrupt, exiting now (the last complete checkpoint is intact)\n";
    (void)!::write(STDERR_FILENO, msg, sizeof msg - 1);
    ::_exit(130);
  }
  g_stop_signal = sig;
}

struct SignalScope {
  struct sigaction old_int{}, old_term{}, old_hup{};
  SignalScope() {
    g_stop_signal = 0;
    struct sigaction sa{};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGINT, &sa, &old_int);
    ::sigaction(SIGTERM, &sa, &old_term);
    ::sigaction(SIGHUP, &sa, &old_hup);
  }
  ~SignalScope() {
    ::sigaction(SIGINT, &old_int, nullptr);
    ::sigaction(SIGTERM, &old_term, nullptr);
    ::sigaction(SIGHUP, &old_hup, nullptr);
  }
};

const char* signal_name(int sig) { return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : sig == SIGHUP ? "SIGHUP" : "a signal"; }

// metrics.jsonl of a resumed run: the lines the checkpoint already accounts for, nothing after.
void trim_metrics(const std::string& path, const RunState& run) {
  std::ifstream in(path);
  std::string kept, line;
  while (std::getline(in, line)) {
    try {
      const auto j = nlohmann::json::parse(line);
      const bool eval = j.contains("eval_loss");
      if (eval ? j.value("epoch", int64_t(0)) <= run.epoch : j.value("step", int64_t(0)) <= run.step) kept += line + "\n";
    } catch (const std::exception&) {
      // a line cut by the kill: dropped
    }
  }
  io::write_file_atomic(path, kept);
}

}  // namespace

int run_train(const TrainConfig& c) {
  const auto t_start = Clock::now();
  // ---- 1. the config, the output directory, the task: every problem before any work starts ----
  const auto problems = validate(c);
  for (const auto& p : problems) std::fprintf(stderr, "kiln train: error: %s\n", p.c_str());
  if (!problems.empty()) return 2;
  if (c.threads > 0) set_num_threads(c.threads);
  // Data parallel: one process per rank (mpirun/srun); rank 0 alone writes files and logs.
  std::unique_ptr<dist::Communicator> comm;
  try {
    comm = dist::make_cpu_communicator(dist::DistEnv::from_environment(), std::chrono::seconds(c.dist_timeout));
  } catch (const Error& e) {
    std::fprintf(stderr, "kiln train: error: %s\n", e.message().c_str());
    return 2;
  }
  const int rank = comm->rank(), world = comm->world_size();
  const bool lead = rank == 0;
  // GPU ranks reduce gradients with NCCL (one GPU per process, cuda:LOCAL_RANK); small host-side
  // agreements (flags, counters) stay on the CPU communicator, which also carries NCCL's id.
  std::unique_ptr<dist::Communicator> gpu_comm;
  if (world > 1 && c.resolved_device().is_cuda()) {
    try {
      gpu_comm = cuda::make_nccl_communicator(*comm, c.resolved_device().index, std::chrono::seconds(c.dist_timeout));
    } catch (const Error& e) {
      std::fprintf(stderr, "kiln train: error: rank %d: NCCL: %s\n", rank, e.message().c_str());
      return 2;
    }
  }
  dist::Communicator& grad_comm = gpu_comm ? *gpu_comm : *comm;
  // Flags every rank must agree on (a signal, a save due by the clock): true when any rank says so.
  auto any_rank = [&](bool mine) {
    if (world == 1) return mine;
    Tensor f = from_vector({mine ? 1.0 : 0.0}, {1}, DType::f64);
    comm->all_reduce(f, dist::ReduceOp::max);
    return f.data<double>()[0] != 0.0;
  };
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
  lo.rank = rank;        // rank r takes every world-th sample of the epoch's order: the ranks' batches
  lo.world_size = world; // together are the one-process batch of world x --batch
  lo.pin_memory = c.resolved_device().is_cuda();  // batch copies to the GPU never block the host
  io::DataLoader loader(task.train_data, lo);
  // Optimizer steps per epoch: each takes --accum-steps micro-batches; a last partial group is dropped.
  const int64_t accum = c.accum_steps;
  const int64_t spe = loader.batches_per_epoch() / accum;
  if (spe < 1) {
    if (accum == 1)
      std::fprintf(stderr, "kiln train: error: --batch %lld is larger than the %lld training samples\n",
                   (long long)c.batch, (long long)task.train_data->size());
    else
      std::fprintf(stderr, "kiln train: error: --accum-steps %lld x --batch %lld is more than the %lld training samples\n",
                   (long long)accum, (long long)c.batch, (long long)task.train_data->size());
    return 2;
  }
  std::error_code ec;
  std::filesystem::create_directories(c.out, ec);
  if (any_rank(ec || ::access(c.out.c_str(), W_OK) != 0)) {
    std::fprintf(stderr, "kiln train: error: --out %s: cannot create or write the directory (%s)\n", c.out.c_str(),
                 ec ? ec.message().c_str() : "not writable");
    return 2;
  }
  const std::string ckpt_dir = c.out + "/checkpoints";
  const Device train_device = c.resolved_device();

  // ---- 2. optimizer and schedule ----
  nn::Module& model = *task.model;
  auto opt = make_optimizer(c, model);
  const int64_t total_steps = c.max_steps > 0 ? std::min(c.max_steps, c.epochs * spe) : c.epochs * spe;
  optim::LrSchedule sched;
  sched.kind = optim::LrSchedule::parse(c.schedule);
  sched.base_lr = c.lr;
  sched.warmup_steps = c.warmup >= 0 ? c.warmup : c.model.rfind("bert-", 0) == 0 ? total_steps * 6 / 100 : 0;
  sched.total_steps = total_steps;
  sched.step_size = std::max<int64_t>(spe, 1);  // "step": decay once per epoch
  sched.milestones = {total_steps / 2, total_steps * 3 / 4};
  const std::vector<Tensor> params = model.parameters();
  // Mixed precision: forward and loss under autocast; f32 weights and optimizer; for f16 a dynamic
  // loss scale (bf16 has f32's range and needs none: the scaler is then a pass-through).
  const std::optional<DType> amp_dt = amp_dtype(c.amp);
  amp::GradScalerOptions scaler_options;
  scaler_options.enabled = amp_dt == DType::f16;
  scaler_options.init_scale = c.loss_scale;
  scaler_options.growth_interval = c.loss_scale_window;
  amp::GradScaler scaler(scaler_options);

  nlohmann::json resolved = c.to_json();
  resolved["task"] = task.name;
  resolved["threads"] = num_threads();
  resolved["warmup"] = sched.warmup_steps;
  resolved["steps_per_epoch"] = spe;
  resolved["total_steps"] = total_steps;
  resolved["parameters"] = model.num_parameters();
  resolved["world_size"] = world;
  const int64_t global_batch = c.batch * accum * world;  // samples per optimizer step, all ranks
  resolved["global_batch"] = global_batch;
  resolved["data_info"] = task.data_info;

  // ---- 3. resume: the newest complete checkpoint (auto) or the one named ----
  RunState run;
  std::string resumed_from;
  if (!c.resume.empty()) {
    const std::string path = c.resume == "auto" ? find_latest_checkpoint(ckpt_dir) : c.resume;
    if (!path.empty()) {
      try {
        LoadedRun lr = load_run_checkpoint(path, model, opt.get());
        if (!lr.weights_only) {
          const auto diffs = config_differences(lr.config, resolved);
          if (!diffs.empty()) {
            std::string msg;
            for (const auto& d : diffs) msg += "\n  " + d;
            KILN_FAIL(path, " was written by a run with another configuration; resuming would not continue it:", msg);
          }
          run = lr.run;
          if (int64_t(run.rng_ranks.size()) == world) {  // this rank's own generator
            default_generator().seed = run.rng_ranks[size_t(rank)][0].get<uint64_t>();
            default_generator().offset = run.rng_ranks[size_t(rank)][1].get<uint64_t>();
          }
          if (scaler.enabled()) scaler.load_state(run.scaler);
        }
      } catch (const Error& e) {
        std::fprintf(stderr, "kiln train: error: --resume: %s\n", e.message().c_str());
        return 2;
      }
      resumed_from = path;
    } else if (c.resume != "auto") {
      std::fprintf(stderr, "kiln train: error: --resume %s: no such checkpoint\n", c.resume.c_str());
      return 2;
    }
  }
  const std::string metrics_path = c.out + "/metrics.jsonl";
  std::ofstream metrics;  // rank 0's; on other ranks never opened (writes go nowhere)
  if (lead) {
    if (resumed_from.empty() || run.step == 0) {
      std::ofstream(metrics_path, std::ios::trunc);
    } else {
      trim_metrics(metrics_path, run);
    }
    metrics.open(metrics_path, std::ios::app);
    KILN_CHECK(metrics.good(), metrics_path, ": cannot open for writing");
    prune_checkpoints(ckpt_dir, 0);  // temporary files a killed writer left behind
  }
  Progress progress(lead ? c.progress : "quiet", c.epochs, spe);
  std::unique_ptr<CheckpointMirror> mirror;
  if (!c.mirror.empty() && lead) mirror = std::make_unique<CheckpointMirror>(c.mirror, c.keep_last);
  // Every rank starts from rank 0's weights and buffers; gradients are averaged over ranks in
  // buckets while backward runs.
  std::unique_ptr<dist::DataParallel> dp;
  if (world > 1) {
    try {
      dp = std::make_unique<dist::DataParallel>(model, grad_comm);
    } catch (const Error& e) {
      std::fprintf(stderr, "kiln train: error: rank %d: %s\n", rank, e.message().c_str());
      return 2;
    }
    scaler.agree = [&](Tensor& found_inf) { grad_comm.all_reduce(found_inf, dist::ReduceOp::max); };
  }
  std::string last_saved;
  // A periodic checkpoint that cannot be written (a full disk) is reported and training goes on:
  // the previous checkpoints are intact and the next save point tries again. Returns success.
  auto save = [&]() {
    if (world > 1) {  // every rank's generator goes into rank 0's checkpoint
      Tensor mine = zeros({2}, DType::i64), all = zeros({world, 2}, DType::i64);
      mine.data<int64_t>()[0] = int64_t(default_generator().seed);
      mine.data<int64_t>()[1] = int64_t(default_generator().offset);
      comm->all_gather(mine, all);
      run.rng_ranks = nlohmann::json::array();
      for (int q = 0; q < world; ++q)
        run.rng_ranks.push_back({uint64_t(all.data<int64_t>()[2 * q]), uint64_t(all.data<int64_t>()[2 * q + 1])});
    }
    if (!lead) return true;  // rank 0 writes for all: every rank holds the same weights and state
    try {
      run.scaler = scaler.state();
      last_saved = save_run_checkpoint(ckpt_dir, model, *opt, run, resolved);
    } catch (const Error& e) {
      progress.line("kiln train: error: checkpoint at step " + std::to_string(run.step) + " failed: " + e.message() +
                    (last_saved.empty() ? "" : "; the last good one is " + last_saved));
      return false;
    }
    prune_checkpoints(ckpt_dir, c.keep_last);
    if (mirror) mirror->enqueue(last_saved);
    return true;
  };
  auto last_save_time = Clock::now();

  progress.line("kiln train: " + c.model + " (" + task.name + ") on " + task.data_info.value("name", c.data) + " (" +
                std::to_string(task.train_data->size()) + " samples), " + std::to_string(model.num_parameters()) +
                " parameters, " + std::to_string(num_threads()) + " threads, " +
                (world > 1 ? std::to_string(world) + " ranks (" + comm->backend() + "), global batch " +
                                 std::to_string(global_batch) + ", "
                           : std::string()) +
                std::to_string(total_steps) + " steps" +
                (amp_dt ? ", mixed precision " + c.amp + (scaler.enabled() ? " with dynamic loss scaling" : "") : "") +
                (resumed_from.empty() ? "" : ", resumed at step " + std::to_string(run.step) + " from " + resumed_from));
  SignalScope signals;

  // ---- 4. the loop ----
  while (run.epoch < c.epochs && run.step < total_steps) {
    model.train();
    loader.seek({run.epoch, run.batch});
    auto win_start = Clock::now();
    const auto epoch_start = Clock::now();
    double epoch_seconds_before = 0;  // time of this epoch spent before a resume is not known: counted from here
    while (run.step < total_steps && run.batch < spe * accum) {
      // One optimizer step: `accum` micro-batches, each loss scaled by 1/accum so the gradients add up
      // to those of one batch of accum x batch samples.
      const double lr = sched.at(run.step);
      opt->set_lr(lr);
      opt->zero_grad();
      double loss = 0;
      int64_t bs = 0, correct = 0, count = 0;
      for (int64_t k = 0; k < accum; ++k) {
        auto t0 = Clock::now();
        std::optional<io::Batch> batch = loader.next();
        KILN_ASSERT(batch.has_value(), "the loader ran out inside an optimizer step at batch ", loader.position().batch);
        run.win_data += since(t0);
        t0 = Clock::now();
        if (dp) dp->set_sync(k == accum - 1);  // reduce once, after the last micro-batch
        StepResult r;
        {
          amp::AutocastGuard autocast(amp_dt.value_or(DType::f16), amp_dt.has_value());
          r = task.step(*batch);
        }
        const double micro = r.loss.item<double>();
        scaler.scale(accum == 1 ? r.loss : r.loss * (1.0 / double(accum))).backward();
        // GPU kernels run after their launch: wait for them, so the time is the device's and not
        // charged to the next phase (the cost is one launch latency per step).
        if (train_device.is_cuda()) cuda::synchronize(train_device.index);
        run.win_fb += since(t0);
        loss += micro / double(accum);
        bs += batch->begin()->second.size(0);
        correct += r.correct;
        count += r.count;
      }

      auto t0 = Clock::now();
      if (dp) dp->finish();
      // The step's numbers over all ranks, and the decisions they must take together.
      bool stop_now = g_stop_signal != 0;
      bool time_due = c.save_minutes > 0 && since(last_save_time) >= 60.0 * c.save_minutes;
      if (world > 1) {
        Tensor st = from_vector({loss, double(correct), double(count), double(bs), stop_now ? 1.0 : 0.0,
                                 time_due && lead ? 1.0 : 0.0},
                                {6}, DType::f64);
        comm->all_reduce(st, dist::ReduceOp::sum);
        const double* v = st.data<double>();
        loss = v[0] / double(world);
        correct = int64_t(v[1]);
        count = int64_t(v[2]);
        bs = int64_t(v[3]);
        stop_now = v[4] > 0;
        time_due = v[5] > 0;  // rank 0's clock decides
      }
      run.win_comm += since(t0);
      if (!std::isfinite(loss)) {
        progress.line("");
        if (lead)
          std::fprintf(stderr,
                       "kiln train: error: the loss is %s at step %lld (epoch %lld, lr %g); stopping. Lower --lr, add "
                       "--warmup or --clip-grad-norm%s. Metrics so far are in %s\n",
                       std::isnan(loss) ? "NaN" : "infinite", (long long)run.step, (long long)run.epoch + 1, lr,
                       amp_dt == DType::f16 ? " (the forward pass overflowed f16: try --amp bf16)" : "",
                       metrics_path.c_str());
        return 1;
      }
      t0 = Clock::now();
      // One scaler decision per optimizer step: unscale (before clipping), skip on inf/NaN, update.
      if (c.clip_grad_norm > 0) {
        scaler.unscale(params);
        optim::clip_grad_norm(params, c.clip_grad_norm);
      }
      scaler.step(*opt, params);
      scaler.update();
      if (train_device.is_cuda()) cuda::synchronize(train_device.index);
      run.win_opt += since(t0);
      ++run.step;
      run.batch = loader.position().batch;

      run.win_loss += loss;
      ++run.win_steps;
      run.win_samples += bs;
      run.samples_seen += bs;
      run.win_correct += correct;
      run.win_count += count;
      run.epoch_correct += correct;
      run.epoch_count += count;
      run.epoch_loss += loss;
      const int64_t in_epoch = run.batch / accum;  // optimizer steps done in this epoch
      const bool log_now = run.step % c.log_every == 0 || in_epoch == spe || run.step == total_steps;
      const double win_s = since(win_start);
      const double sps = double(run.win_samples) / std::max(win_s, 1e-9);
      const double elapsed = run.train_seconds + since(epoch_start) - epoch_seconds_before;
      const double eta = elapsed / double(std::max<int64_t>(run.step, 1)) * double(total_steps - run.step);
      progress.step(run.epoch, in_epoch, run.win_loss / double(run.win_steps), lr, sps, eta, log_now);
      if (log_now) {
        nlohmann::json m = {{"step", run.step},
                            {"epoch", run.epoch + 1},
                            {"epoch_progress", double(in_epoch) / double(spe)},
                            {"loss", run.win_loss / double(run.win_steps)},
                            {"train_" + task.metric, run.win_count ? double(run.win_correct) / double(run.win_count) : 0.0},
                            {"lr", lr},
                            {"samples_per_s", sps},
                            {"data_wait_s", run.win_data},
                            {"forward_backward_s", run.win_fb},
                            {"optimizer_s", run.win_opt},
                            {"elapsed_s", since(t_start)}};
        if (world > 1) {
          // Where each rank's time went: the rank that waits least for communication is the slow one.
          Tensor mine = from_vector({run.win_data, run.win_fb, run.win_comm, run.win_opt}, {4}, DType::f64);
          Tensor all = zeros({world, 4}, DType::f64);
          comm->all_gather(mine, all);
          nlohmann::json ranks = nlohmann::json::array();
          for (int q = 0; q < world; ++q) {
            const double* v = all.data<double>() + 4 * q;
            ranks.push_back({{"data_wait_s", v[0]}, {"forward_backward_s", v[1]}, {"comm_wait_s", v[2]}, {"optimizer_s", v[3]}});
          }
          m["comm_wait_s"] = run.win_comm;
          m["ranks"] = ranks;
        }
        if (amp_dt) {
          m["loss_scale"] = scaler.get_scale();
          m["skipped_steps"] = scaler.skipped_steps();
        }
        if (train_device.is_cuda()) m["gpu_memory_mib"] = gpu_memory_json(train_device.index);
        metrics << m.dump() << "\n";
        metrics.flush();
        run.win_loss = run.win_data = run.win_fb = run.win_opt = run.win_comm = 0;
        run.win_steps = run.win_samples = run.win_correct = run.win_count = 0;
        win_start = Clock::now();
      }
      const bool due = (c.save_every > 0 && run.step % c.save_every == 0) || time_due;
      if (due || stop_now) {
        run.train_seconds += since(epoch_start) - epoch_seconds_before;
        epoch_seconds_before = since(epoch_start);
        const bool ok = save();
        last_save_time = Clock::now();
        if (stop_now && !ok) return 1;
      }
      if (stop_now) {
        progress.line("kiln train: caught " + std::string(signal_name(g_stop_signal ? int(g_stop_signal) : SIGTERM)) + " at step " +
                      std::to_string(run.step) + "; saved " + last_saved + "; continue with --resume auto");
        return 0;
      }
    }
    run.train_seconds += since(epoch_start) - epoch_seconds_before;
    const double epoch_s = since(epoch_start);

    // ---- 5. evaluation at the end of every epoch ----
    const EvalResult ev = evaluate(task, c, comm.get());
    char buf[256];
    std::snprintf(buf, sizeof buf, "epoch %lld: train loss %.4f %s %.2f%% | test loss %.4f %s %.2f%% | %.1f s (+%.1f s eval)",
                  (long long)run.epoch + 1, run.epoch_loss / double(std::max<int64_t>(run.batch / accum, 1)), task.metric.c_str(),
                  100.0 * double(run.epoch_correct) / double(std::max<int64_t>(run.epoch_count, 1)), ev.loss,
                  task.metric.c_str(), 100.0 * ev.accuracy, epoch_s, ev.seconds);
    progress.line(buf);
    nlohmann::json em = {{"step", run.step},           {"epoch", run.epoch + 1},
                         {"eval_loss", ev.loss},       {"eval_" + task.metric, ev.accuracy},
                         {"eval_samples", ev.count},   {"epoch_seconds", epoch_s},
                         {"eval_seconds", ev.seconds}};
    metrics << em.dump() << "\n";
    metrics.flush();
    run.epochs_log.push_back(em);
    run.last_eval_loss = ev.loss;
    run.last_eval_accuracy = ev.accuracy;
    run.last_eval_count = ev.count;
    ++run.epoch;
    run.batch = 0;
    run.epoch_loss = 0;
    run.epoch_correct = run.epoch_count = 0;
    const bool stop_epoch = any_rank(g_stop_signal != 0);
    if (c.save_every > 0 || c.save_minutes > 0 || c.save_epochs || stop_epoch) {
      const bool ok = save();
      last_save_time = Clock::now();
      if (stop_epoch && !ok) return 1;
    }
    if (stop_epoch) {
      progress.line("kiln train: caught " + std::string(signal_name(g_stop_signal ? int(g_stop_signal) : SIGTERM)) + " after epoch " +
                    std::to_string(run.epoch) + "; saved " + last_saved + "; continue with --resume auto");
      return 0;
    }
  }

  // ---- 6. weights and summary ----
  if (!lead) return 0;  // rank 0 writes the weights and the summary
  std::map<std::string, std::string> meta = {{"model", c.model}, {"task", task.name}, {"format", "kiln"}};
  if (task.data_info.contains("labels")) meta["labels"] = task.data_info["labels"].dump();
  io::save_safetensors(c.out + "/model.safetensors", model.state_dict(), meta);
  const double wall = since(t_start);
  nlohmann::json summary = {{"model", c.model},
                            {"task", task.name},
                            {"steps", run.step},
                            {"epochs", run.epochs_log.size()},
                            {"test_loss", run.last_eval_loss},
                            {"test_" + task.metric, run.last_eval_accuracy},
                            {"test_samples", run.last_eval_count},
                            {"bad_samples_skipped", task.bad_samples ? task.bad_samples() : 0},
                            {"amp", c.amp},
                            {"loss_scale", scaler.get_scale()},
                            {"skipped_steps", scaler.skipped_steps()},
                            {"wall_seconds", wall},
                            {"device", train_device.str()},
                            {"train_seconds", run.train_seconds},
                            {"samples_per_s", double(run.samples_seen) / std::max(run.train_seconds, 1e-9)},
                            {"resumed_from", resumed_from},
                            {"last_checkpoint", last_saved},
                            {"per_epoch", run.epochs_log},
                            {"config", resolved}};
  if (train_device.is_cuda()) summary["gpu_memory_mib"] = gpu_memory_json(train_device.index);
  io::write_file_atomic(c.out + "/summary.json", summary.dump(2) + "\n");
  char buf[384];
  char skipped[96] = "";
  if (scaler.enabled())
    std::snprintf(skipped, sizeof skipped, " (%lld skipped for inf/NaN gradients, loss scale %g)",
                  (long long)scaler.skipped_steps(), scaler.get_scale());
  std::snprintf(buf, sizeof buf, "test %s %.2f%% (%lld samples), %lld steps%s in %s, %.0f samples/s; wrote %s",
                task.metric.c_str(), 100.0 * run.last_eval_accuracy, (long long)run.last_eval_count,
                (long long)run.step, skipped, hms(wall).c_str(),
                double(run.samples_seen) / std::max(run.train_seconds, 1e-9), c.out.c_str());
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
  if (!c.out.empty()) io::write_file_atomic(c.out, j.dump(2) + "\n");
  return 0;
}

}  // namespace kiln::tools
