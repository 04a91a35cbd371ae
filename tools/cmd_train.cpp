// `kiln train`: one run in phases (class Trainer): setup checks the config and builds the task (data
// + model), the loader, the optimizer and the LR schedule, and resumes; then per optimizer step:
// fetch batches, forward, loss, backward, reduce, clip, update, log, maybe checkpoint; per epoch:
// evaluate; at the end: weights and a summary with the final metrics.
#include <fcntl.h>
#include <pthread.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include "base/cpu_isa.h"
#include "base/thread_pool.h"
#include "engine/amp.h"
#include "engine/autocast.h"
#include "engine/autograd.h"
#include "engine/optim.h"
#include "io/atomic_file.h"
#include "io/json_text.h"
#include "io/run_checkpoint.h"
#include "io/safetensors.h"
#include "io/tensorboard.h"
#include "io/weights.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/device_memory.h"
#include "kernels/cuda/runtime_info.h"
#include "runtime/nccl_comm.h"
#include "tools/cli_checks.h"
#include "tools/commands.h"
#include "tools/environment.h"
#include "tools/plan.h"
#include "tools/report.h"
#include "tools/train.h"
#include "tools/zoo.h"

namespace kiln::tools {
using io::CheckpointMirror;
using io::RunState;
using io::StepStats;
using io::WindowStats;
using io::EpochStats;
using io::LoadedRun;
using io::find_latest_checkpoint;
using io::load_run_checkpoint;
using io::prune_checkpoints;
using io::save_run_checkpoint;
using io::config_differences;
namespace {

// A masked-LM's perplexity as the printed lines give it: exp of the mean masked-token loss.
std::string perplexity_text(double loss) {
  const double p = std::exp(loss);
  char buf[48];
  std::snprintf(buf, sizeof buf, p < 1e9 ? "%.2f" : "%.3g", p);
  return buf;
}

// The step a checkpoint's file name gives (step-NNNNNNNNN.kiln), -1 for "" or another name.
int64_t checkpoint_step(const std::string& path) {
  const std::string n = std::filesystem::path(path).filename().string();
  if (n.size() < 11 || n.rfind("step-", 0) != 0 || n.compare(n.size() - 5, 5, ".kiln") != 0) return -1;
  const std::string digits = n.substr(5, n.size() - 10);
  if (digits.empty() || digits.size() > 18 ||
      !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return -1;
  return std::stoll(digits);
}

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

// A progress bar on a terminal, plain lines otherwise.
class Progress {
 public:
  // mode "quiet": nothing (ranks other than 0). `total_steps`: the run's optimizer steps; when
  // --max-steps ends it before its epochs do, each line also shows the run's step of its total.
  Progress(const std::string& mode, int64_t epochs, int64_t steps_per_epoch, int64_t total_steps)
      : bar_(mode == "bar" || (mode == "auto" && ::isatty(STDOUT_FILENO))),
        quiet_(mode == "quiet"),
        epochs_(epochs),
        spe_(steps_per_epoch),
        total_(total_steps) {}
  void step(int64_t epoch, int64_t in_epoch, int64_t run_step, double loss, double lr, double sps, double eta_s,
            bool log_line) {
    if (quiet_) return;
    char run[64] = "";
    if (total_ < epochs_ * spe_)
      std::snprintf(run, sizeof run, " (run %lld/%lld)", (long long)run_step, (long long)total_);
    if (bar_) {
      constexpr int kWidth = 24;
      const int filled = int(kWidth * in_epoch / std::max<int64_t>(spe_, 1));
      std::string b(size_t(filled), '=');
      if (filled < kWidth) b += '>' + std::string(size_t(kWidth - filled - 1), ' ');
      std::printf("\r\033[Kepoch %lld/%lld [%s] %lld/%lld%s loss %.4f lr %.4g %.0f samples/s ETA %s",
                  (long long)epoch + 1, (long long)epochs_, b.c_str(), (long long)in_epoch, (long long)spe_, run, loss,
                  lr, sps, hms(eta_s).c_str());
      std::fflush(stdout);
    } else if (log_line) {
      std::printf("epoch %lld/%lld step %lld/%lld%s loss %.4f lr %.4g %.0f samples/s ETA %s\n", (long long)epoch + 1,
                  (long long)epochs_, (long long)in_epoch, (long long)spe_, run, loss, lr, sps, hms(eta_s).c_str());
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
  int64_t epochs_, spe_, total_;
};

// SIGINT, SIGTERM and SIGHUP ask the loop to save and stop after the current step; a second SIGINT
// leaves at once (the last complete checkpoint is never touched: writes go to temporary files).
volatile std::sig_atomic_t g_stop_signal = 0;
volatile std::sig_atomic_t g_exit_on_second = 1;

// The second interrupt's message names the last complete checkpoint. A handler may not format, so it
// is written beforehand (set_second_interrupt_message) into the buffer the handler is not reading.
char g_second_msg[2][1024];
volatile std::sig_atomic_t g_second_msg_at = 0;

void set_second_interrupt_message(const std::string& last_checkpoint) {
  const int next = 1 - int(g_second_msg_at);
  const std::string msg =
      last_checkpoint.empty()
          ? "\nkiln train: second interrupt, exiting now (no checkpoint of this run was written yet)\n"
          : "\nkiln train: second interrupt, exiting now (the last complete checkpoint, " + last_checkpoint +
                ", is intact)\n";
  std::snprintf(g_second_msg[next], sizeof g_second_msg[next], "%s", msg.c_str());
  g_second_msg_at = next;
}

extern "C" void on_stop_signal(int sig) {
  if (g_stop_signal != 0 && sig == SIGINT && g_exit_on_second) {
    const char* msg = g_second_msg[g_second_msg_at];
    (void)!::write(STDERR_FILENO, msg, std::strlen(msg));
    ::_exit(130);
  }
  g_stop_signal = sig;
}

// SIGPIPE is ignored while training: output into a pipe nobody reads any more (kiln launch killed
// outright, `kiln train | head`) must not kill a run on its way to saving; the writes just fail.
// A stop signal ignored on entry stays ignored, as CPython does: `nohup kiln train &` ignores SIGHUP,
// and a shell script's `&` job SIGINT, on purpose.
struct SignalScope {
  struct sigaction old_int {
  }, old_term{}, old_hup{}, old_pipe{};
  SignalScope() {
    g_stop_signal = 0;
    struct sigaction sa{};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    catch_unless_ignored(SIGINT, sa, &old_int);
    catch_unless_ignored(SIGTERM, sa, &old_term);
    catch_unless_ignored(SIGHUP, sa, &old_hup);
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    sigemptyset(&ignore.sa_mask);
    ::sigaction(SIGPIPE, &ignore, &old_pipe);
  }
  ~SignalScope() {
    ::sigaction(SIGINT, &old_int, nullptr);
    ::sigaction(SIGTERM, &old_term, nullptr);
    ::sigaction(SIGHUP, &old_hup, nullptr);
    ::sigaction(SIGPIPE, &old_pipe, nullptr);
  }
  static void catch_unless_ignored(int sig, const struct sigaction& sa, struct sigaction* old) {
    ::sigaction(sig, nullptr, old);
    if (old->sa_handler != SIG_IGN) ::sigaction(sig, &sa, nullptr);
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

// Removes `path` when it is a signal stop's summary.json (it has "stopped"); a finished run's, or one that
// cannot be read, is left alone.
void remove_stopped_summary(const std::string& path) {
  std::ifstream in(path);
  if (!in) return;
  try {
    if (!nlohmann::json::parse(in).contains("stopped")) return;
  } catch (const std::exception&) {
    return;
  }
  std::error_code ec;
  std::filesystem::remove(path, ec);
}

// The exclusive lock on OUT/.lock (rank 0): flock's lock goes with the descriptor, so it is released
// when the run ends, and by the kernel when the process dies (a crash leaves no stale lock).
struct OutLock {
  int fd = -1;
  std::string take(const std::string& out) {
    const std::string path = out + "/.lock";
    fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return path + ": cannot open the run's lock file: " + std::strerror(errno);
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      char buf[32] = "";
      const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
      std::string pid = n > 0 ? std::string(buf, size_t(n)) : "";
      while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
      ::close(fd);
      fd = -1;
      if (err == ENOSYS || err == EOPNOTSUPP || err == ENOLCK) {  // a file system without locks (Lustre, some NFS)
        std::fprintf(stderr,
                     "kiln train: warning: %s: cannot lock it (%s); a second kiln train in this --out would "
                     "not be refused\n",
                     path.c_str(), std::strerror(err));
        return "";
      }
      if (err != EWOULDBLOCK) return path + ": cannot lock it: " + std::strerror(err);
      return "--out " + out + " is in use by another kiln train (pid " + (pid.empty() ? "unknown" : pid) +
             "): two runs in one folder delete each other's checkpoints; wait for it, stop it, or give "
             "another --out";
    }
    // Who holds it, for the refusal above (should the note fail, the lock holds all the same).
    const std::string mine = std::to_string(::getpid()) + "\n";
    (void)!::ftruncate(fd, 0);
    (void)!::pwrite(fd, mine.data(), mine.size(), 0);
    return "";
  }
  // False once OUT/.lock is no longer the file this run locked: OUT deleted, renamed or replaced
  // (the run's later files would go to a new OUT, and another run could take it meanwhile).
  bool still_in_place(const std::string& out) const {
    if (fd < 0) return true;  // nothing locked (a file system without locks): nothing to compare
    struct stat held {
    }, there{};
    if (::fstat(fd, &held) != 0) return true;
    return held.st_nlink > 0 && ::stat((out + "/.lock").c_str(), &there) == 0 && there.st_dev == held.st_dev &&
           there.st_ino == held.st_ino;
  }
  void release() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
  ~OutLock() { release(); }
};

// OUT/NAME.tmp.PID files of Kiln's own outputs (io::write_file_atomic's, and save_safetensors')
// whose writer is gone: a kill during the final write leaves one for good. Called under the folder's
// lock. Only the names kiln train writes through a temporary file, and only a file untouched for a
// minute: a live writer on another host (whose pid means nothing here) is still writing to its file,
// and a user's results.tmp.2023 is not Kiln's.
void remove_dead_temp_files(const std::string& out) {
  std::error_code ec;
  const auto now = std::filesystem::file_time_type::clock::now();
  for (const auto& e : std::filesystem::directory_iterator(out, ec)) {
    const std::string n = e.path().filename().string();
    const size_t at = n.rfind(".tmp.");
    if (at == std::string::npos || !e.is_regular_file(ec)) continue;
    const std::string base = n.substr(0, at);
    if (base != "model.safetensors" && base != "summary.json" && base != "metrics.jsonl" && base != "report.html")
      continue;
    const std::string digits = n.substr(at + 5);
    long long pid = 0;
    const auto parsed = std::from_chars(digits.data(), digits.data() + digits.size(), pid);
    if (digits.empty() || parsed.ec != std::errc() || parsed.ptr != digits.data() + digits.size() || pid <= 0) continue;
    if (::kill(pid_t(pid), 0) == 0 || errno != ESRCH) continue;  // alive (or not ours to ask): kept
    const auto written = e.last_write_time(ec);
    if (ec || now - written < std::chrono::minutes(1)) continue;  // maybe another host's writer, still at it
    std::error_code rm;
    std::filesystem::remove(e.path(), rm);
  }
}

// The run in phases: setup() checks the config and builds everything (or answers an exit code);
// then per optimizer step step(), log_step() and maybe checkpoint(); per epoch evaluate_epoch();
// at the end finish(). Every member a phase shares lives here, named once.
// Whether the resolved `path` lies inside the resolved folder `dir` (not `dir` itself).
bool inside_folder(const std::string& dir, const std::string& path) {
  if (dir == "/") return path.size() > 1 && path[0] == '/';
  return path.size() > dir.size() && path.compare(0, dir.size(), dir) == 0 && path[dir.size()] == '/';
}

// A metrics.jsonl left with part of a line at its end (a failed write whose cut-back failed, or a file put
// back in its place): the part cut off, so the next line starts on a line of its own and every line parses.
// Removes from a run's config (as TrainConfig::to_json writes it) the keys of the flags `c` does
// not use.
void erase_unused_flags(nlohmann::json& config, const TrainConfig& c) {
  for (const UnusedFlag& u : unused_flags(c)) {
    std::string key = u.flag;
    std::replace(key.begin(), key.end(), '-', '_');
    config.erase(key);
  }
}

void cut_partial_line(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return;
  struct stat st {};
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
    const off_t size = st.st_size, from = std::max<off_t>(0, size - 65536);  // a line is far shorter
    std::string tail(size_t(size - from), '\0');
    if (::pread(fd, tail.data(), tail.size(), from) == ssize_t(tail.size()) && tail.back() != '\n') {
      const size_t nl = tail.rfind('\n');
      if (nl != std::string::npos)
        (void)!::ftruncate(fd, from + off_t(nl) + 1);
      else if (from == 0)
        (void)!::ftruncate(fd, 0);
      else
        (void)!::pwrite(fd, "\n", 1, size);
    }
  }
  ::close(fd);
}

class Trainer {
 public:
  Trainer(const TrainConfig& c, const TrainHooks& hooks, TrainOutcome* outcome)
      : c_(c), hooks_(hooks), outcome_(outcome) {}
  ~Trainer() {
    if (metrics_fd_ >= 0) ::close(metrics_fd_);
  }
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;
  void release_out_lock() { lock_.release(); }

  int run() {
    if (const int rc = setup(); rc >= 0) return rc;
    g_exit_on_second = hooks_.exit_on_second_interrupt ? 1 : 0;
    set_second_interrupt_message(last_saved_);
    SignalScope signals;  // before the first output line: SIGPIPE ignored
    announce();
    // run_.batch > 0 at the last step: a checkpoint saved before its epoch's evaluation (an evaluation that
    // failed, or was killed), which is still to do.
    while (run_.epoch < c_.epochs && (run_.step < total_steps_ || run_.batch > 0)) {
      model().train();
      loader_->seek({run_.epoch, run_.batch});
      win_start_ = epoch_start_ = Clock::now();
      epoch_seconds_before_ = 0;  // time of this epoch spent before a resume is not known: counted from here
      while (run_.step < total_steps_ && run_.batch < spe_ * accum_) {
        const double lr = sched_.at(run_.step);
        StepStats s;
        if (const int rc = step(lr, s); rc >= 0) return rc;
        if (const int rc = log_step(lr); rc >= 0) return rc;
        // A stop the host asked for at this step's metrics line (one process: no ranks to agree).
        if (world_ == 1 && !stop_now_) stop_now_ = stop_wanted();
        const bool due = (c_.save_every > 0 && run_.step % c_.save_every == 0) || time_due_;
        if (due || stop_now_) {
          run_.train_seconds += since(epoch_start_) - epoch_seconds_before_;
          epoch_seconds_before_ = since(epoch_start_);
          if (const int rc = checkpoint(stop_now_, " at step " + std::to_string(run_.step)); rc >= 0) return rc;
        }
      }
      run_.train_seconds += since(epoch_start_) - epoch_seconds_before_;
      if (const int rc = fold(); rc >= 0) return rc;
      try {
        evaluate_epoch(since(epoch_start_));
      } catch (const Error& eval_error) {
        // The epoch's training is not lost to an evaluation that fails (a bad validation file): one
        // process saves it first (resumed, the run evaluates this epoch again). Ranks cannot agree on it.
        // A save that fails too is reported with it, and the evaluation's error is the one thrown.
        if (world_ == 1) {
          const std::string failed = "kiln train: evaluation after epoch " + std::to_string(run_.epoch + 1) + " failed";
          try {
            if (save())
              progress_->line(failed + "; saved the trained epoch as " + last_saved_ +
                              " (fix the data, then continue with " + hooks_.resume_hint + ")");
          } catch (const Error& save_error) {
            progress_->line(failed + ", and saving the trained epoch failed too: " + save_error.message());
          } catch (const std::exception& save_error) {
            progress_->line(failed + ", and saving the trained epoch failed too: " + save_error.what());
          }
        }
        throw;
      }
      const bool stop = any_rank(stop_wanted());
      if (c_.save_every > 0 || c_.save_minutes > 0 || c_.save_epochs || stop)
        if (const int rc = checkpoint(stop, " after epoch " + std::to_string(run_.epoch)); rc >= 0) return rc;
    }
    return finish();
  }

 private:
  nn::Module& model() { return *task_.model; }

  // True when any rank says so (a signal, a save due by the clock).
  bool any_rank(bool mine) {
    if (world_ == 1) return mine;
    Tensor f = from_vector({mine ? 1.0 : 0.0}, {1}, DType::f64);
    comm_->all_reduce(f, dist::ReduceOp::max);
    return f.data<double>()[0] != 0.0;
  }
  int fail(const std::string& msg, int rc = 2) {
    std::fprintf(stderr, "kiln train: error: %s\n", msg.c_str());
    if (hooks_.on_error) hooks_.on_error(msg);
    return rc;
  }
  // Every number of a metrics line as a TensorBoard scalar at its step: "train/loss", "eval/accuracy"
  // (the train_/eval_ prefix of a key dropped), "rank1/comm_wait_s" for the per-rank phases,
  // "gpu_memory_mib/peak" for an object's fields.
  void write_events(const nlohmann::json& line, const std::string& prefix) {
    if (!tb_) return;
    std::vector<std::pair<std::string, float>> values;
    auto add = [&](const std::string& tag, const nlohmann::json& v) {
      if (v.is_number()) values.emplace_back(tag, v.get<float>());
    };
    for (const auto& [k, v] : line.items()) {
      if (k == "step") continue;
      std::string name = k;
      for (const char* p : {"train_", "eval_"})
        if (name.rfind(p, 0) == 0) name = name.substr(std::strlen(p));
      if (v.is_object()) {
        for (const auto& [k2, v2] : v.items()) add(k + "/" + k2, v2);
      } else if (v.is_array() && k == "ranks") {
        for (size_t r = 0; r < v.size(); ++r)
          for (const auto& [k2, v2] : v[r].items()) add("rank" + std::to_string(r) + "/" + k2, v2);
      } else if (k == "epoch_seconds") {
        add("train/" + name, v);  // the training epoch's time, though an eval line carries it
      } else {
        add(prefix + name, v);
      }
    }
    // A write that fails (a full disk) is said once and tried again at every later line, as
    // metrics.jsonl's; the file keeps whole records only.
    tb_->scalars(line.value("step", int64_t(0)), values);
    for (const std::string& n : tb_->take_notices()) progress_->line("kiln train: " + n);
  }

  // One line of metrics.jsonl (rank 0), in one write(2) on an O_APPEND descriptor (looped if short).
  // A write that fails (a disk full for a moment) is reported once, and its part of a line cut off
  // at once (ftruncate to the size before it): a buffered stream would write its buffer again on
  // close and glue the part to the next line. Each later line tries again.
  void write_metrics_line(const nlohmann::json& line) {
    if (!lead_ || metrics_fd_ < 0) return;
    if (metrics_failed_) {  // after a failure, by its path again: the file may have been replaced meanwhile
      cut_partial_line(metrics_path_);
      const int fd = ::open(metrics_path_.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
      if (fd >= 0) {
        ::close(metrics_fd_);
        metrics_fd_ = fd;
      }
    }
    const std::string text = io::dump_json(line) + "\n";
    const int err = io::append_whole(metrics_fd_, text);
    if (err == 0) {
      if (metrics_failed_)
        progress_->line("kiln train: " + metrics_path_ + ": writing again at step " + std::to_string(run_.step) +
                        " (the lines since step " + std::to_string(metrics_failed_at_) + " are missing)");
      metrics_failed_ = false;
      return;
    }
    if (!metrics_failed_)
      progress_->line("kiln train: warning: " + metrics_path_ + ": cannot write the metrics line of step " +
                      std::to_string(run_.step) + " (" + std::strerror(err) +
                      "); training goes on, and each later line tries again");
    if (!metrics_failed_) metrics_failed_at_ = run_.step;
    metrics_failed_ = true;
  }

  // OUT/report.html, the run's curves so far (rank 0): one file to open on a remote machine. A
  // failure is a warning; training goes on.
  void refresh_report() {
    if (!lead_) return;
    try {
      std::vector<std::string> notes;
      io::write_file_atomic(c_.out + "/report.html", render_report({c_.out}, "kiln train: " + c_.model, notes));
    } catch (const std::exception& e) {
      progress_->line(std::string("kiln train: warning: report.html: ") + e.what());
    }
  }

  // A signal, or the host's stop request (asked once per call; a request is remembered).
  bool stop_wanted() {
    if (!asked_stop_ && hooks_.stop_requested && hooks_.stop_requested()) asked_stop_ = true;
    return g_stop_signal != 0 || asked_stop_;
  }

  // ---- setup: every problem before any work starts; -1 when the run can begin ----
  int setup() {
    auto problems = validate(c_);
    // A fresh run would truncate the metrics and replace the weights and checkpoints of the run
    // already there (and break its resume): only when asked.
    // --resume auto without a checkpoint to continue from starts fresh too.
    // (With the local ones lost, the --mirror's copies continue the run: see resume().)
    const bool has_checkpoint =
        !find_latest_checkpoint(c_.out + "/checkpoints").empty() ||
        (c_.resume == "auto" && !c_.mirror.empty() && !find_latest_checkpoint(c_.mirror).empty());
    // A mirror in the run's own checkpoints folder would be no second copy, and its pruning the run's;
    // one anywhere else in --out is no backup either, and its pruning races with the run's own files.
    // Both compared resolved (./so3//checkpoints/. and $PWD/so3/checkpoints are so3/checkpoints).
    if (!c_.mirror.empty()) {
      const std::string m = io::resolved_path(c_.mirror), out = io::resolved_path(c_.out),
                        own = io::resolved_path(c_.out + "/checkpoints");
      if (m == own)
        problems.push_back("--mirror " + c_.mirror + " is this run's own checkpoints folder (" + own +
                           "): a mirror there is no backup; give a folder on another disk or machine");
      else if (m == out || inside_folder(out, m))
        problems.push_back("--mirror " + c_.mirror + " (" + m + ") is inside this run's --out " + c_.out + " (" + out +
                           "): a mirror there is no backup, and its pruning races with the run's own files; give a "
                           "folder outside --out, on another disk or machine");
    }
    if (!c_.mirror.empty()) {
      const char* wait = std::getenv("KILN_MIRROR_WAIT");
      char* end = nullptr;
      if (wait && *wait) mirror_wait_s_ = std::strtod(wait, &end);
      if (wait && *wait && (*end != '\0' || !std::isfinite(mirror_wait_s_) || mirror_wait_s_ < 0))
        problems.push_back(std::string("KILN_MIRROR_WAIT=") + wait +
                           ": expected the seconds the end of a run waits for the --mirror's copies (>= 0)");
    }
    // The run starts over (no --resume, or --resume auto with no checkpoint): a run already in --out
    // is replaced only with --overwrite.
    const bool fresh_start = c_.resume.empty() || (c_.resume == "auto" && !has_checkpoint);
    if (fresh_start && !c_.overwrite)
      if (const std::string there = run_in_folder(c_.out); !there.empty()) {
        const bool resumable = c_.resume.empty() && has_checkpoint;
        problems.push_back("--out " + c_.out + " already holds a run (" + there + ")" +
                           (c_.resume == "auto" ? ", but no checkpoint to continue from" : "") + ": " +
                           (resumable ? "continue it with --resume auto, or " : "") +
                           "add --overwrite (kiln.train: overwrite=True) to replace it with a new run");
      }
    for (const auto& p : problems) fail(p);
    if (!problems.empty()) return 2;
    if (c_.threads > 0) set_num_threads(c_.threads);
    // Data parallel: one process per rank; rank 0 alone writes files and logs.
    try {
      comm_ = dist::make_cpu_communicator(kiln::tools::dist_env(), std::chrono::seconds(c_.dist_timeout));
    } catch (const Error& e) {
      return fail(e.message());
    }
    rank_ = comm_->rank();
    world_ = comm_->world_size();
    lead_ = rank_ == 0;
    if (world_ > 1)
      if (const int rc = agree_on_config(); rc >= 0) return rc;
    device_ = c_.resolved_device();
    // GPU ranks reduce gradients with NCCL (one GPU per process, cuda:LOCAL_RANK); small host-side
    // agreements (flags, counters) stay on the CPU communicator, which also carries NCCL's id.
    if (world_ > 1 && device_.is_cuda()) {
      try {
        gpu_comm_ = cuda::make_nccl_communicator(*comm_, device_.index, std::chrono::seconds(c_.dist_timeout));
      } catch (const dist::CollectiveError&) {
        throw;  // main() ends the process at once
      } catch (const Error& e) {
        return fail("rank " + std::to_string(rank_) + ": NCCL: " + e.message());
      }
    }
    manual_seed(c_.seed);
    try {
      task_ = make_task(c_);
    } catch (const Error& e) {
      return fail(e.message());
    }
    if (world_ > 1)
      if (const int rc = agree_on_data(); rc >= 0) return rc;
    // The batch against the data before any planning: an optimizer step takes --accum-steps x --batch
    // samples on each rank, ranks x that in all. Compared by division: the product of huge flags
    // overflows (--accum-steps 2^62 --batch 2 wrapped negative and passed).
    {
      const int64_t n = task_.train_data->size();
      if (c_.batch > n / world_ / c_.accum_steps) {  // world x accum x batch > n, for positive integers
        const std::string ranks = world_ > 1 ? " x " + std::to_string(world_) + " ranks" : "";
        return fail(c_.accum_steps == 1 && world_ == 1
                        ? "--batch " + std::to_string(c_.batch) + " is larger than the " + std::to_string(n) +
                              " training samples"
                        : (c_.accum_steps > 1 ? "--accum-steps " + std::to_string(c_.accum_steps) + " x " : "") +
                              "--batch " + std::to_string(c_.batch) + ranks + " is more than the " + std::to_string(n) +
                              " training samples");
      }
    }
    // The loader's batch: --batch, or a micro-batch of it (--micro-batch N, or auto from the planner).
    micro_ = c_.batch;
    if (!c_.memory_cap.empty()) cap_.set(parse_bytes(c_.memory_cap, "--memory-cap"));
    if (c_.micro_batch == "auto") {
      if (const int rc = plan_micro_batch(); rc >= 0) return rc;
    } else if (!c_.micro_batch.empty()) {
      micro_ = std::stoll(c_.micro_batch);
    }
    // A forward of one sample that the model cannot train on (batch norm over one value per channel: a
    // ResNet's 1x1 stage) is a flag error before any file is written, as `kiln plan` says it: found by
    // planning the step (on the meta device, a fraction of a second). Two samples or more always give
    // a batch norm two values.
    // The same plan says whether some batch norms normalise a handful of values per channel (noise
    // statistics: a run that may end in NaN), a note at the start and in the NaN message.
    if (model_family(c_.model).input == ModelInput::images && (micro_ == 1 || lead_)) {
      try {
        norms_note_ = plan_norms_note(micro_);
      } catch (const Error& e) {
        if (micro_ == 1)
          return fail((c_.micro_batch.empty() ? "--batch 1" : "--micro-batch 1") +
                      std::string(": the model cannot train on one sample at a time (") + e.message() +
                      "); give 2 or more" + (c_.data == "folder" ? ", or a larger --image-size" : ""));
        // larger micro-batches: the training step itself says what is wrong, as it did without the note
      }
      if (lead_ && !norms_note_.empty()) std::fprintf(stderr, "kiln train: note: %s\n", norms_note_.c_str());
    }
    io::LoaderOptions lo;
    lo.batch_size = micro_;
    lo.seed = c_.seed;
    lo.workers = c_.workers;
    lo.drop_last = true;  // equal batches: batch-norm statistics from a handful of samples would be noise
    lo.rank = rank_;        // rank r takes every world-th sample of the epoch's order: the ranks' batches
    lo.world_size = world_; // together are the one-process batch of world x --batch
    lo.pin_memory = device_.is_cuda();  // batch copies to the GPU never block the host
    loader_ = std::make_unique<io::DataLoader>(task_.train_data, lo);
    // Optimizer steps per epoch: those the epoch's samples fill for all ranks together, floor(n / (ranks x
    // accum x batch)), as one process with the whole batch takes; the rest of the epoch is dropped. Rank r's
    // micro-batch k is then every world-th sample of the one process's micro-batch k, and no rank reaches
    // the samples the loader repeats to give every rank an equal share (each rank dropping only its own
    // partial batch took an extra step over them when n is not a multiple: 15 samples, 2 ranks x batch 4
    // took 2 steps, one process x batch 8 one).
    accum_ = c_.accum_steps * (c_.batch / micro_);
    spe_ = task_.train_data->size() / world_ / c_.accum_steps / c_.batch;  // no product to overflow
    KILN_ASSERT(spe_ >= 1 && spe_ * accum_ <= loader_->batches_per_epoch(), "steps per epoch ", spe_, " x ", accum_,
                " micro-batches, the loader has ", loader_->batches_per_epoch());
    std::error_code ec;
    std::filesystem::create_directories(c_.out, ec);
    if (any_rank(ec || ::access(c_.out.c_str(), W_OK) != 0))
      return fail("--out " + c_.out + ": cannot create or write the directory (" +
                  (ec ? ec.message() : std::string("not writable")) + ")");
    // One trainer per --out: two would delete each other's checkpoint temporary files and mix their
    // metrics. Rank 0 alone writes the folder (ranks of a job on one machine share it), so it alone
    // takes the lock, before anything in the folder is deleted.
    const std::string lock_problem = lead_ ? lock_.take(c_.out) : std::string();
    if (any_rank(!lock_problem.empty()))
      return fail(lead_ ? lock_problem : "rank 0 could not take --out " + c_.out + " (its message says why)");
    ckpt_dir_ = c_.out + "/checkpoints";
    if (lead_) remove_dead_temp_files(c_.out);
    // The mirror is this run's alone, before anything in it is deleted (--overwrite) or resumed from:
    // another run's copies would be pruned, their `latest` replaced, and --resume auto could take them.
    // A run that may continue from the mirror (--resume auto, or a --resume FILE in it) with no
    // checkpoint in its own folder (lost, moved, or another path to it) may take another run's mirror
    // over, once it has resumed from it (after resume() below): the mirror is for exactly that rescue.
    // A fresh run never does.
    std::string mirror_problem;
    if (lead_ && !c_.mirror.empty()) {
      const std::string m = io::resolved_path(c_.mirror), from = io::resolved_path(c_.resume);
      const bool from_mirror = c_.resume == "auto" || (!c_.resume.empty() && inside_folder(m, from));
      const bool may_take = from_mirror && io::find_latest_checkpoint(ckpt_dir_).empty();
      mirror_problem = io::claim_mirror(c_.mirror, c_.out, may_take ? &mirror_owner_ : nullptr);
    }
    if (any_rank(!mirror_problem.empty()))
      return fail(lead_ ? mirror_problem : "rank 0 refused --mirror " + c_.mirror + " (its message says why)");
    if (lead_ && c_.overwrite && c_.resume.empty()) remove_old_checkpoints();

    // optimizer and schedule; with --zero 1 over this rank's chunks of the flattened parameters
    if (c_.zero == 1 && world_ == 1)
      std::fprintf(stderr,
                   "kiln train: note: --zero 1 with one rank keeps the whole optimizer state on it (ZeRO "
                   "splits it over the ranks of a launch)\n");
    if (c_.zero == 1) {
      try {
        zero_ = std::make_unique<dist::ZeroRedundancy>(
            model(), optim::decay_groups(model().named_parameters(), c_.lr, c_.weight_decay),
            gpu_comm_ ? *gpu_comm_ : *comm_);
      } catch (const dist::CollectiveError&) {
        throw;  // main() ends the process at once
      } catch (const Error& e) {
        return fail("rank " + std::to_string(rank_) + ": " + e.message());
      }
      opt_ = make_optimizer(c_, zero_->shard_groups());
    } else {
      opt_ = make_optimizer(c_, model());
    }
    total_steps_ = c_.max_steps > 0 ? std::min(c_.max_steps, c_.epochs * spe_) : c_.epochs * spe_;
    sched_.kind = optim::LrSchedule::parse(c_.schedule);
    sched_.base_lr = c_.lr;
    sched_.warmup_steps = c_.warmup >= 0 ? c_.warmup : model_family(c_.model).input == ModelInput::tokens ? total_steps_ * 6 / 100 : 0;
    sched_.total_steps = total_steps_;
    // The rules --help and the README state; fixed, as a resumed checkpoint replays them. "step": x gamma
    // (0.1) once per epoch's worth of steps, counted from the end of warm-up (LrSchedule::at); "multistep":
    // x 0.1 at 50% and 75% of total_steps_ (--max-steps if fewer), counted from step 0.
    sched_.step_size = std::max<int64_t>(spe_, 1);
    sched_.milestones = {total_steps_ / 2, total_steps_ * 3 / 4};
    params_ = zero_ ? zero_->shard_params() : model().parameters();
    // Mixed precision: forward and loss under autocast; f32 weights and optimizer; for f16 a dynamic
    // loss scale (bf16 has f32's range and needs none: the scaler is then a pass-through).
    amp_dt_ = amp_dtype(c_.amp);
    amp::GradScalerOptions so;
    so.enabled = amp_dt_ == DType::f16;
    so.init_scale = c_.loss_scale;
    so.growth_interval = c_.loss_scale_window;
    scaler_ = std::make_unique<amp::GradScaler>(so);

    resolved_ = c_.to_json();
    // The record holds what the run used: a flag it does not use (--image-size of a Fashion-MNIST
    // run, --betas of SGD) would read as a setting of the run (its default, 224, was written for
    // 28 x 28 images). A resume ignores such keys on both sides.
    erase_unused_flags(resolved_, c_);
    resolved_["task"] = task_.name;
    resolved_["threads"] = num_threads();
    resolved_["warmup"] = sched_.warmup_steps;
    resolved_["steps_per_epoch"] = spe_;
    resolved_["total_steps"] = total_steps_;
    resolved_["parameters"] = model().num_parameters();
    resolved_["world_size"] = world_;
    global_batch_ = micro_ * accum_ * world_;  // samples per optimizer step, all ranks
    if (!c_.micro_batch.empty()) resolved_["micro_batch_used"] = micro_;
    resolved_["global_batch"] = global_batch_;
    resolved_["data_info"] = task_.data_info;
    // The CPU kernel set rounds differently in the last bits (KILN_CPU_ISA, or the CPU's best): a
    // resume under another set continues with a warning, since its numbers will not be bit-identical.
    resolved_["cpu_isa"] = cpu_isa_name(cpu_isa());

    if (const int rc = resume(); rc >= 0) return rc;
    if (lead_ && !mirror_owner_.out.empty()) {
      const std::string m = io::resolved_path(c_.mirror), from = io::resolved_path(resumed_from_);
      if (inside_folder(m, from))
        io::take_over_mirror(c_.mirror, c_.out, mirror_owner_);
      else
        mirror_problem = mirror_owner_.refusal;  // not resumed from its copies: still the other run's
    }
    if (any_rank(!mirror_problem.empty()))
      return fail(lead_ ? mirror_problem : "rank 0 refused --mirror " + c_.mirror + " (its message says why)");
    load_sums();
    session_step0_ = run_.step;
    session_samples0_ = run_.samples_seen;
    session_train0_ = run_.train_seconds;
    shown_loss_ = run_.window.mean_loss();  // a resumed run shows its window's loss until the next line
    metrics_path_ = c_.out + "/metrics.jsonl";
    const bool fresh = resumed_from_.empty() || run_.step == 0;
    // A resumed run's last good checkpoint is the one it continues from, until it saves one.
    if (!fresh) last_saved_ = resumed_from_;
    // A new run from a weights file (--resume FILE without a training state) replaces what --out holds,
    // which only --overwrite may do (a fresh run without --resume was refused in the flag checks).
    const std::string held = lead_ && fresh && !c_.resume.empty() && !c_.overwrite ? run_in_folder(c_.out) : "";
    if (any_rank(!held.empty()))
      return fail(lead_ ? "--out " + c_.out + " already holds a run (" + held + "), and --resume " + c_.resume +
                              " starts a new run from its weights: add --overwrite (kiln.train: overwrite=True) to "
                              "replace that run, or give another --out"
                        : "rank 0 refused --out " + c_.out + " (its message says why)");
    if (lead_ && fresh && c_.overwrite && !c_.resume.empty()) remove_old_checkpoints();
    if (lead_) {  // on other ranks never opened: writes go nowhere
      if (fresh) {
        // Every output of a run this one replaces: a summary, weights or report left from it would
        // stand beside this run's curves (in `kiln report`, report.html, TensorBoard) until this run
        // writes its own, and for good if it stops first (a NaN loss, a signal).
        std::ofstream(metrics_path_, std::ios::trunc);
        for (const char* f : {"summary.json", "model.safetensors", "report.html"})
          std::filesystem::remove(c_.out + "/" + f, ec);
        io::EventWriter::remove_old(c_.out);
      } else {
        trim_metrics(metrics_path_, run_);
        // A signal stop's summary ("stopped") no longer says where the run is: it goes on.
        remove_stopped_summary(c_.out + "/summary.json");
      }
      metrics_fd_ = ::open(metrics_path_.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
      KILN_CHECK(metrics_fd_ >= 0, metrics_path_, ": cannot open for writing (", std::strerror(errno), ")");
      if (c_.tensorboard) {
        // A resumed run adds an event file that begins with a restart at its step, so TensorBoard
        // drops what the old files logged after it.
        tb_ = std::make_unique<io::EventWriter>(c_.out);
        if (!fresh) tb_->restart(run_.step + 1);  // TensorBoard drops the old events from this step on
      } else if (!fresh && io::EventWriter::any_old(c_.out)) {
        // Without a new file nothing tells TensorBoard where the run went back to.
        std::fprintf(stderr,
                     "kiln train: warning: --no-tensorboard on a run resumed at step %lld: the event files in %s "
                     "still hold the steps logged after it, and TensorBoard will show them beside nothing new "
                     "(resume with TensorBoard on to mark the restart, or delete them)\n",
                     (long long)run_.step, c_.out.c_str());
      }
      prune_checkpoints(ckpt_dir_, 0);  // temporary files a killed writer left behind
    }
    progress_ = std::make_unique<Progress>(lead_ ? c_.progress : "quiet", c_.epochs, spe_, total_steps_);
    if (!c_.mirror.empty() && lead_)
      mirror_ = std::make_unique<CheckpointMirror>(c_.mirror, c_.keep_last, mirror_wait_s_);
    // Every rank starts from rank 0's weights and buffers; gradients are averaged over ranks in
    // buckets while backward runs.
    dist::Communicator& grad_comm = gpu_comm_ ? *gpu_comm_ : *comm_;
    if (world_ > 1) {
      try {
        if (!zero_) dp_ = std::make_unique<dist::DataParallel>(model(), grad_comm);
      } catch (const dist::CollectiveError&) {
        throw;  // main() ends the process at once
      } catch (const Error& e) {
        return fail("rank " + std::to_string(rank_) + ": " + e.message());
      }
      dist::Communicator* agree_on = &grad_comm;
      scaler_->agree = [agree_on](Tensor& found_inf) { agree_on->all_reduce(found_inf, dist::ReduceOp::max); };
    }
    last_save_time_ = Clock::now();
    return -1;
  }

  // The newest complete checkpoint (--resume auto) or the one named; -1 to go on.
  int resume() {
    if (c_.resume.empty()) return -1;
    std::string path = c_.resume;
    if (c_.resume == "auto") {
      // Every byte of a candidate is checked before it is chosen: a damaged newest checkpoint falls
      // back to the newest intact one, and the user hears which files were passed over and why. Rank 0
      // alone chooses and tells the others (one read of the files, and no rank resumes from another step).
      std::string problem;
      if (lead_) {
        io::IntactCheckpoint found = io::find_intact_checkpoint(ckpt_dir_);
        for (const auto& s : found.skipped)
          std::fprintf(stderr, "kiln train: warning: --resume auto: skipped damaged checkpoint %s\n", s.c_str());
        if (!c_.mirror.empty()) {
          // The newest intact checkpoint of the two places: the local ones lost, all damaged, or the
          // newest damaged while the mirror holds an intact copy of it. The mirror's files are read
          // only when its newest is newer than the local choice (on a tie the local file is taken).
          const int64_t local_step = checkpoint_step(found.path);
          if (found.path.empty() || checkpoint_step(io::find_latest_checkpoint(c_.mirror)) > local_step) {
            const io::IntactCheckpoint mirrored = io::find_intact_checkpoint(c_.mirror);
            for (const auto& s : mirrored.skipped)
              std::fprintf(stderr, "kiln train: warning: --resume auto: skipped damaged mirror copy %s\n", s.c_str());
            if (found.path.empty() && !mirrored.path.empty()) {
              std::fprintf(stderr,
                           "kiln train: --resume auto: no intact checkpoint in %s; continuing from the mirror's "
                           "copy %s\n",
                           ckpt_dir_.c_str(), mirrored.path.c_str());
              found.path = mirrored.path;
            } else if (!mirrored.path.empty() && checkpoint_step(mirrored.path) > local_step &&
                       !std::filesystem::exists(std::filesystem::path(ckpt_dir_) /
                                                std::filesystem::path(mirrored.path).filename())) {
              // This folder has no file of that step: the mirror's may be another run's (a run started
              // afresh into the same --out and --mirror), so the local choice stands; the user decides.
              std::fprintf(stderr,
                           "kiln train: --resume auto: note: the mirror holds %s, newer than %s, but %s has no "
                           "file of that step (the mirror's may be another run's copy); continuing from the "
                           "newest intact checkpoint here. To continue from the mirror's, give --resume %s\n",
                           mirrored.path.c_str(), std::filesystem::path(found.path).filename().c_str(),
                           ckpt_dir_.c_str(), mirrored.path.c_str());
            } else if (!mirrored.path.empty() && checkpoint_step(mirrored.path) > local_step) {
              std::fprintf(stderr,
                           "kiln train: --resume auto: continuing from the mirror's copy %s, newer than %s, the "
                           "newest intact checkpoint in %s (%s)\n",
                           mirrored.path.c_str(), std::filesystem::path(found.path).filename().c_str(),
                           ckpt_dir_.c_str(), "its copy of that step is damaged, above");
              found.path = mirrored.path;
            }
            found.skipped.insert(found.skipped.end(), mirrored.skipped.begin(), mirrored.skipped.end());
          }
        }
        if (found.path.empty() && !found.skipped.empty()) {
          for (const auto& s : found.skipped) problem += "\n  " + s;
          problem = "--resume auto: no intact checkpoint in " + ckpt_dir_ +
                    (c_.mirror.empty() ? "" : " or the --mirror " + c_.mirror) + ", every one is damaged:" + problem +
                    "\ncontinue from an intact copy elsewhere with --resume FILE, or start a new run with --overwrite "
                    "and without --resume";
        }
        path = found.path;
      }
      if (world_ > 1) {
        path = broadcast_string(path);
        problem = broadcast_string(problem);
      }
      if (!problem.empty()) return fail(lead_ ? problem : "rank 0 found no intact checkpoint to resume from");
    }
    if (path.empty()) return c_.resume == "auto" ? -1 : fail("--resume " + c_.resume + ": no such checkpoint");
    std::string problem;  // this rank's, then the job's
    try {
      io::LocalOptimizerState local;
      if (zero_)  // this rank's chunks, from a sharded checkpoint or an unsharded one
        local = [this, &path](const io::CheckpointReader& r, const nlohmann::json& zero) {
          if (zero.is_null()) {
            optim::OptimizerState whole;
            for (const auto& e : r.entries())
              if (e.name.rfind("optim/", 0) == 0) whole.tensors[e.name.substr(6)] = r.read(e.name);
            return zero_->local_state_from_whole(whole, path);
          }
          return zero_->local_state([&r](const std::string& n) { return r.read("optim-zero/" + n); }, io::zero_slots(r),
                                    io::zero_layout_from_json(zero, path), path);
        };
      const auto refuse = [&path](const std::vector<std::string>& diffs) {
        if (diffs.empty()) return;
        std::string msg;
        for (const auto& d : diffs) msg += "\n  " + d;
        KILN_FAIL(path, " was written by a run with another configuration; resuming would not continue it:", msg);
      };
      // The flags first (a resnet20 checkpoint under --model resnet32 is named as such, not as 72
      // tensors that do not match), the micro-batch once the run's state is read.
      const auto check_config = [&](const nlohmann::json& saved) {
        // Keys of flags this run does not use are not compared: an older Kiln accepted them (and
        // saved them) without using them, and they cannot be given again now.
        // Compared as written: the checkpoint's strings hold U+FFFD for each byte that is not UTF-8.
        nlohmann::json was = saved, now = io::as_written(resolved_);  // resolved_ holds none
        erase_unused_flags(was, c_);
        // --set compared as the model config it makes, not as text: the same keys in another order,
        // zero_init_residual=1 for =true, continue the run; a difference is named by its field.
        std::vector<std::string> diffs;
        try {
          const auto was_sets = was.value("set", std::vector<std::string>{}),
                     now_sets = now.value("set", std::vector<std::string>{});
          if (was.value("model", "") == now.value("model", "") && was_sets != now_sets) {
            const auto a = model_config_fields(c_.model, was_sets), b = model_config_fields(c_.model, now_sets);
            for (size_t i = 0; i < a.size() && i < b.size(); ++i)
              if (a[i] != b[i])
                diffs.push_back("set " + a[i].first + ": checkpoint " + a[i].second + ", now " + b[i].second);
            was.erase("set");
            now.erase("set");
          }
        } catch (const std::exception&) {  // a checkpoint's --set this version cannot read: compared as text
        }
        for (const std::string& d : config_differences(was, now)) diffs.push_back(d);
        refuse(diffs);
        // The same flags and data with epochs of another length: the rule that makes them changed
        // (a checkpoint from before floor(n / (ranks x accum x batch))). Its position is then in
        // other epochs and its schedule over other total steps: at an epoch's last step it read as
        // edited, elsewhere it went on with another step size, silently.
        const nlohmann::json spe_was = saved.value("steps_per_epoch", nlohmann::json());
        if (spe_was.is_number_integer() && spe_was != nlohmann::json(spe_))
          KILN_FAIL(path, ": this checkpoint's epochs are ", spe_was.dump(), " steps, this build makes ", spe_,
                    ": the rule for a sample count that is no multiple of ranks x --accum-steps x --batch (here ",
                    world_, " x ", c_.accum_steps, " x ", c_.batch, ") changed, an epoch is now floor(",
                    task_.train_data->size(), " / ", world_ * c_.accum_steps * c_.batch,
                    ") steps; start a new run, or finish this one with the Kiln version that wrote it");
        const std::string isa_was = saved.value("cpu_isa", std::string()), isa_now = resolved_.value("cpu_isa", "");
        // Only the CPU's kernels differ between sets: a GPU run's numbers come from the GPU.
        if (lead_ && !device_.is_cuda() && !isa_was.empty() && isa_was != isa_now)
          std::fprintf(stderr,
                       "kiln train: warning: %s was written under the CPU kernel set %s, this run uses %s: it "
                       "continues, but its numbers will differ from the original run's in the last bits "
                       "(KILN_CPU_ISA=%s gives the same set, where this CPU has it)\n",
                       path.c_str(), isa_was.c_str(), isa_now.c_str(), isa_was.c_str());
      };
      // Another model's weights (a weights-only checkpoint of it) are named as that model's first;
      // the same model under another name (bert-tiny-cls's, resumed by --model bert-tiny --task
      // classify) is not: what differs there is its config (num_labels), listed as such.
      const std::string mine = trained_model_name(c_.model, task_.name);
      const io::SameModel same_model = [&mine](const nlohmann::json& config) {
        const nlohmann::json model = config.value("model", nlohmann::json()),
                             task = config.value("task", nlohmann::json());
        if (!model.is_string() || !find_model_family(model.get<std::string>())) return false;
        // A weights-only checkpoint (kiln ckpt import's) has no task: its --model names the model whole.
        if (!task.is_string()) return model.get<std::string>() == mine;
        return trained_model_name(model.get<std::string>(), task.get<std::string>()) == mine;
      };
      // Compared with the model the run builds, not the --model text: --model bert-tiny-cls without
      // --task classify builds bert-tiny-mlm, which bert-tiny-cls weights are not.
      LoadedRun lr = load_run_checkpoint(path, model(), opt_.get(), local, check_config, mine, same_model);
      if (lr.weights_only && same_model(lr.config)) check_imported_config(path, lr.config);
      if (!lr.weights_only) {
        if (const std::string d = resume_micro_batch(lr); !d.empty()) refuse({d});
        run_ = lr.run;  // its position counts micro-batches of micro_, as resume_micro_batch made sure
        run_.micro_batch = micro_;
        // Where the checkpoint says the run is must be a place this run's flags reach: past them the
        // loop would train nothing and exit 0.
        auto within = [&](const char* field, int64_t v, int64_t most, const std::string& why) {
          KILN_CHECK(v <= most, path, ": state.run.", field, " is ", v, ", past the ", most, " ", why,
                     " of this run: the checkpoint is damaged or was edited");
        };
        within("step", run_.step, total_steps_, "steps (--epochs, --max-steps)");
        within("epoch", run_.epoch, c_.epochs, "epochs (--epochs)");
        within("batch", run_.batch, spe_ * accum_, "micro-batches per epoch");
        if (int64_t(run_.rng_ranks.size()) == world_) {  // this rank's own generator
          default_generator().seed = run_.rng_ranks[size_t(rank_)][0].get<uint64_t>();
          default_generator().offset = run_.rng_ranks[size_t(rank_)][1].get<uint64_t>();
        }
        if (scaler_->enabled()) scaler_->load_state(run_.scaler);
      }
    } catch (const Error& e) {
      problem = e.message();
    }
    if (world_ > 1) problem = agree_on_resume(path, problem);
    if (!problem.empty()) return fail("--resume: " + problem);
    resumed_from_ = path;
    return -1;
  }
  // A weights-only checkpoint (kiln ckpt import's) of this model says the config it was built with
  // (model, set): a field that changes what the weights compute without changing a shape (num_heads,
  // layer_norm_eps) must be the run's too, or they load and give other numbers. Dropout and the
  // initialisation (zero_init_residual) are the new run's to choose, and num_labels only a classifier's.
  // A file without a config, or one this version cannot read, is compared by its shapes only, as before.
  void check_imported_config(const std::string& path, const nlohmann::json& saved) const {
    const nlohmann::json model = saved.value("model", nlohmann::json()), set = saved.value("set", nlohmann::json());
    if (!model.is_string() || !set.is_array()) return;
    std::vector<std::pair<std::string, std::string>> was, now;
    try {
      was = model_config_fields(model.get<std::string>(), set.get<std::vector<std::string>>());
      now = model_config_fields(c_.model, task_.model_sets);  // the sets the run built its model with
    } catch (const std::exception&) {
      return;
    }
    std::string msg;
    for (size_t i = 0; i < was.size() && i < now.size(); ++i) {
      const std::string& field = was[i].first;
      if (!weights_config_field(field, task_.name == "classify")) continue;
      if (was[i] != now[i])
        msg += "\n  " + field + ": checkpoint " + was[i].second + ", this run " + now[i].second + " (--set " + field +
               "=" + was[i].second + " builds the checkpoint's)";
    }
    KILN_CHECK(msg.empty(), path, " holds ", model.get<std::string>(),
               " weights built with another model config (its kiln ckpt import's --set or --hf-config); loaded into "
               "this run's model they would compute other numbers:",
               msg);
  }

  // The micro-batch of a resumed run is the checkpoint's run's: batch-norm statistics and dropout
  // draws are per micro-batch, so another one would not continue the run. `auto` takes it when it
  // still fits; an explicit --micro-batch equal to the saving run's flag takes what that run had
  // halved it to at an out-of-memory error. Any other difference is the refusal's line ("" if none).
  std::string resume_micro_batch(const LoadedRun& lr) {
    const int64_t saved = lr.run.micro_batch > 0 ? lr.run.micro_batch : c_.batch;  // 0: an older file's --batch
    if (saved == micro_) return "";
    const nlohmann::json flag = lr.config.value("micro_batch", nlohmann::json());
    const std::string saved_flag = flag.is_string() ? flag.get<std::string>() : std::string();
    const std::string was = "checkpoint's run used micro-batch " + std::to_string(saved) + " (--micro-batch " +
                            (saved_flag.empty() ? "not given" : saved_flag) + ")";
    if (c_.batch % saved != 0)
      return "micro-batch: " + was + ", which does not divide this run's --batch " + std::to_string(c_.batch);
    std::string why;
    if (c_.micro_batch == "auto") {
      MemoryPlan p;
      try {
        p = plan_micro_batch(saved);
      } catch (const Error& e) {
        return "micro-batch: " + was + ", which this run cannot plan: " + e.message();
      }
      // Not another configuration: the same flags with less memory. Said as such, with what it needs,
      // by the plan's own rule (a GPU's headroom included) and with the loader's batches of `saved` taken off.
      const size_t budget = memory_after_reserve(plan_budget_, loader_per_sample_, saved);
      KILN_CHECK(
          plan_fits(p, budget, device_), "--micro-batch auto: the checkpoint's run used micro-batch ", saved,
          ", which needs ", mib(p.peak), " at the peak",
          device_.is_cuda() ? " (and the GPU's headroom: 12.5% and 512 MiB)" : "", ", more than the ", mib(budget),
          " this run has for it (",
          device_.is_cuda() ? "free on " + device_.str() : std::string("under --memory-cap, or available"),
          "); another micro-batch (the plan's ", micro_, ") would not continue the run: give it ",
          mib(plan_shortfall(p, budget, device_)), " more",
          device_.is_cuda() ? " (free memory on " + device_.str() + ")" : std::string(" (a larger --memory-cap)"));
      why = "--micro-batch auto: resuming with the checkpoint's micro-batch " + std::to_string(saved) +
            " (it fits; the plan's " + std::to_string(micro_) + " would not continue the run)";
    } else if (!c_.micro_batch.empty() && c_.micro_batch == saved_flag && saved < micro_) {
      why = "--micro-batch " + c_.micro_batch + ": resuming with micro-batch " + std::to_string(saved) +
            ", to which the checkpoint's run had halved it when it ran out of memory";
    } else {
      return "micro-batch: " + was + ", now " + std::to_string(micro_) + " (--micro-batch " +
             (c_.micro_batch.empty() ? "not given" : c_.micro_batch) + ")";
    }
    if (lead_) std::printf("kiln train: %s\n", why.c_str());
    use_micro_batch(saved);
    return "";
  }

  // Every rank reads its own copy of the checkpoint. One whose copy is missing or damaged would leave
  // the others waiting at the first collective, and one that read another file (a stale copy on
  // another machine) would train on from other weights or another step, silently: the ranks compare
  // a fingerprint of what they loaded (the position and every weight and buffer's bytes) with rank 0's.
  std::string agree_on_resume(const std::string& path, const std::string& mine_problem) {
    uint64_t h = 1469598103934665603ull;
    auto mix = [&h](uint64_t v) {
      h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
      h *= 1099511628211ull;
    };
    if (mine_problem.empty()) {
      for (int64_t v : {run_.step, run_.epoch, run_.batch}) mix(uint64_t(v));
      NoGradGuard no_grad;
      auto add = [&](const Tensor& t) {
        const Tensor c = t.detach().to(kCPU).contiguous();
        const auto* b = static_cast<const unsigned char*>(c.raw_data());
        const size_t n = c.nbytes();
        size_t i = 0;
        for (; i + 8 <= n; i += 8) {
          uint64_t w;
          std::memcpy(&w, b + i, 8);
          mix(w);
        }
        for (; i < n; ++i) mix(b[i]);
      };
      for (const auto& [name, t] : model().named_parameters()) add(t);
      for (const auto& [name, t] : model().named_buffers()) add(t);
    }
    Tensor mine = zeros({2}, DType::i64), all = zeros({world_, 2}, DType::i64);
    mine.data<int64_t>()[0] = mine_problem.empty();
    mine.data<int64_t>()[1] = int64_t(h);
    comm_->all_gather(mine, all);
    const int64_t* a = all.data<int64_t>();
    std::string failed, differ;
    auto note = [](std::string& list, int q) { list += (list.empty() ? "" : ", ") + std::to_string(q); };
    for (int q = 0; q < world_; ++q)
      if (!a[2 * q])
        note(failed, q);
      else if (a[0] && a[2 * q + 1] != a[1])
        note(differ, q);
    if (!mine_problem.empty()) return mine_problem;
    if (!failed.empty()) return "rank(s) " + failed + " could not load " + path + " (their messages say why)";
    if (!differ.empty())
      return path + " is not the same checkpoint on every rank: rank(s) " + differ +
             " loaded other weights or another step than rank 0 (a stale copy on another machine?); every "
             "machine needs the same file";
    return "";
  }

  void announce() {
    progress_->line(
        "kiln train: " + c_.model + " (" + task_.name + ") on " + task_.data_info.value("name", c_.data) + " (" +
        std::to_string(task_.train_data->size()) + " samples), " + std::to_string(model().num_parameters()) +
        " parameters, " + std::to_string(num_threads()) + " threads, " +
        (world_ > 1 ? std::to_string(world_) + " ranks (" + comm_->backend() + "), global batch " +
                          std::to_string(global_batch_) + ", "
                    : std::string()) +
        std::to_string(total_steps_) + " steps" +
        (amp_dt_ ? ", mixed precision " + c_.amp + (scaler_->enabled() ? " with dynamic loss scaling" : "") : "") +
        (resumed_from_.empty() ? "" : ", resumed at step " + std::to_string(run_.step) + " from " + resumed_from_));
  }

  // ---- one optimizer step: `accum` micro-batches, each loss scaled by 1/accum so the gradients
  // add up to those of one batch of accum x batch samples; then the ranks agree and the weights
  // move. -1 to go on, else the exit code.
  int step(double lr, StepStats& s) {
    if (c_.micro_batch.empty()) return step_once(lr, s);
    // With micro-batches: a micro-batch that runs out of memory frees the step, halves the
    // micro-batch and redoes the step on the same samples, from the same state: the random stream
    // and the buffers (batch-norm statistics) as they were when it began. With several ranks every
    // rank learns whether any ran out before a gradient leaves it (step_once), and all redo the step
    // together. Only forward and backward are redone: after them the step has moved sums and the
    // scaler on.
    // The step's first sample of the epoch, in samples: a second shrink counts in the first's micro-batches.
    const int64_t start = run_.batch * micro_;
    const Generator rng = default_generator();
    std::vector<std::pair<Tensor, Tensor>> buffers;  // (buffer, its value at the start)
    {
      NoGradGuard ng;
      for (const auto& [n, t] : model().named_buffers()) buffers.emplace_back(t, t.clone());
    }
    for (;;) {
      try {
        return step_once(lr, s);
      } catch (const OutOfMemory& e) {
        if (!redoable_) throw;
        default_generator() = rng;
        {
          NoGradGuard ng;
          for (auto& [t, v] : buffers) Tensor(t).copy_(v);
        }
        if (const int rc = shrink_micro_batch(e, start); rc >= 0) return rc;
        s = StepStats{};
      }
    }
  }

  // The planner's micro-batch for the memory there is: a GPU's free memory, the --memory-cap less
  // what the data already holds, or the host's available memory; every rank takes the smallest.
  // The planner's options for the step this run takes (the data's own image shape).
  PlanOptions step_plan_options() const {
    PlanOptions po;
    po.model = trained_model_name(c_.model, task_.name);  // plan the step this run takes
    po.sets = task_.model_sets;
    po.seq_len = c_.seq_len;
    po.amp = c_.amp;
    po.optimizer = c_.optimizer;
    po.recompute = c_.recompute;
    po.accum_steps = c_.accum_steps;  // --accum-steps' micro-batches hold their gradients too
    po.ranks = world_;
    po.zero = c_.zero;
    po.reduce_after_backward = true;  // with micro-batches every bucket goes out after them (step_once)
    po.device = device_.str();                                 // this rank's own GPU answers for its cuDNN workspaces
    if (model_family(c_.model).input == ModelInput::images) {  // the data's own image shape
      const io::Batch one = task_.train_data->get_batch({0}, 0);
      const Tensor& x = one.at("input");
      po.in_channels = x.size(1);
      po.image_size = std::max(x.size(2), x.size(3));
    }
    return po;
  }

  int plan_micro_batch() {
    const PlanOptions po = step_plan_options();
    size_t memory = 0;
    std::string from;  // where `memory` comes from
    if (device_.is_cuda()) {
      memory = cuda::free_bytes(device_.index);  // this rank's GPU only: no context on the others
      from = "free on " + device_.str();
    } else if (cap_.bytes > 0) {
      const size_t held = cpu_memory_stats().allocated;
      memory = cap_.bytes > held ? cap_.bytes - held : 0;
      from = "free under --memory-cap " + c_.memory_cap + " (the data and model already hold " + mib(held) + ")";
    } else {
      const HostMemory hm = host_memory();
      memory = hm.usable();
      from = hm.cgroup_limit > 0 ? "available to this process (its cgroup's limit " + mib(hm.cgroup_limit) + ", " +
                                       mib(hm.cgroup_used) + " used; " + hm.cgroup_file + ")"
                                 : std::string("available on this machine");
    }
    // The data loader starts after the plan, and then holds batches the plan does not count: up to
    // its prefetch depth built ahead (workers > 0) and the one in hand, each a micro-batch (the loader's
    // batch_size, io/data.cpp's worker_loop). Taken off the host's memory for each candidate micro-batch
    // (a GPU's holds none of them).
    int64_t in_flight = 0;
    loader_per_sample_ = 0;
    if (!device_.is_cuda()) {
      size_t sample_bytes = 0;
      for (const auto& [n, t] : task_.train_data->get_batch({0}, 0)) sample_bytes += t.nbytes();
      in_flight = (c_.workers > 0 ? io::LoaderOptions().prefetch : 0) + 1;  // the loader below takes the default
      loader_per_sample_ = size_t(in_flight) * sample_bytes;
    }
    // The plan counts the model's parameters and buffers, which are already held (and so not in
    // the memory measured above): give them back to it. Not the buffers, though: each step holds a copy
    // of them (step()'s, to redo a step that runs out of memory) that the plan does not count, so
    // they are held twice (ResNet-50: 8 bytes per batch-norm channel, 208 KiB; a plan that filled the
    // memory ran out at step 2).
    size_t model_bytes = 0;
    for (const auto& [n, t] : model().named_parameters()) model_bytes += t.nbytes();
    const size_t budget = memory + model_bytes;
    // "15.0 MiB for the step at a micro-batch of 8: 13.2 MiB free under --memory-cap 16MiB (...) less the
    // data loader's 1.0 MiB (2 batches of 8 in flight) + the model's 2.8 MiB, which the plan counts"
    auto budget_text = [&](int64_t m) {
      // What the loader holds at m (saturating), not what is left of the budget: it may exceed it.
      const size_t loader_bytes =
          m > 0 && loader_per_sample_ > SIZE_MAX / size_t(m) ? SIZE_MAX : loader_per_sample_ * size_t(m);
      const std::string loader_text =
          loader_per_sample_ ? " less the data loader's " + mib(loader_bytes) + " (" + std::to_string(in_flight) +
                                   (in_flight == 1 ? " batch of " : " batches of ") + std::to_string(m) + " in flight)"
                             : std::string();
      return mib(memory_after_reserve(budget, loader_per_sample_, m)) + " for the step at a micro-batch of " +
             std::to_string(m) + ": " + mib(memory) + " " + from + loader_text + " + the model's " + mib(model_bytes) +
             " of weights, which the plan counts";
    };
    plan_options_ = po;  // a resume plans the checkpoint's micro-batch against the same memory
    plan_budget_ = budget;
    std::pair<int64_t, MemoryPlan> found;
    try {
      found = largest_micro_batch(po, c_.batch, budget, device_, loader_per_sample_);
    } catch (const Error& e) {  // no micro-batch the model can train on: the same on every rank
      return fail("--micro-batch auto: " + e.message());
    }
    auto& [m, p] = found;
    // Every rank takes the smallest; with several, the lowest rank that cannot fit one sample is named.
    const int64_t mine = m;
    int64_t short_rank = m == 0 ? rank_ : world_;
    if (world_ > 1) {
      Tensor t = from_vector({double(m), double(short_rank)}, {2}, DType::i64);
      comm_->all_reduce(t, dist::ReduceOp::min);
      const std::vector<double> v = t.to_vector();
      m = int64_t(v[0]);
      short_rank = int64_t(v[1]);
    }
    if (m == 0 && mine > 0)
      return fail("--micro-batch auto: rank " + std::to_string(short_rank) +
                  " cannot fit even the smallest micro-batch (its own error says what it needs and has); " +
                  "this rank, " + std::to_string(rank_) + ", fits " + std::to_string(mine) + " in " +
                  budget_text(mine));
    if (m == 0)  // p: the smallest micro-batch the model trains on (1, or 2 past a batch norm over 1x1)
      return fail((world_ > 1 ? "rank " + std::to_string(rank_) + ": " : std::string()) +
                  "--micro-batch auto: even a micro-batch of " + std::to_string(p.micro_batch) +
                  (p.micro_batch > 1 ? " (the smallest the model can train on)" : "") + " needs " + mib(p.peak) +
                  " at the peak (`kiln plan` shows where it goes), more than the " + budget_text(p.micro_batch));
    micro_ = m;
    // Another rank agreed a smaller micro-batch than this one fits: the peak printed is the plan's at it.
    if (m != mine) p = plan_micro_batch(m);
    if (lead_)
      std::printf(
          "kiln train: --micro-batch auto: %lld x %lld accumulation steps for the batch of %lld (planned "
          "step peak %s of the %s)\n",
          (long long)m, (long long)(c_.batch / m), (long long)c_.batch, mib(p.peak).c_str(), budget_text(m).c_str());
    return -1;
  }

  // --micro-batch auto's plan of one step at micro-batch m: below --batch, its micro-batches accumulate.
  MemoryPlan plan_micro_batch(int64_t m) const {
    PlanOptions q = plan_options_;
    if (m < c_.batch) q.accum_steps = c_.accum_steps * (c_.batch / m);
    return plan_memory(q, m);
  }

  // After an out-of-memory error inside a step that began at the epoch's sample `start`: the next smaller
  // micro-batch (half, or the next divisor of --batch), the accumulation to match, and the loader
  // back at the step's first sample. -1 to redo the step, else the exit code.
  int shrink_micro_batch(const OutOfMemory& e, int64_t start) {
    opt_->zero_grad();
    if (zero_) zero_->zero_grad();
    // The failed step's blocks are back in the device allocator's cache, sized for the larger micro-batch;
    // Kiln's own allocations would get them back by retrying, but cuDNN's, cuBLASLt's and NCCL's only once
    // they are returned to the device.
    if (device_.is_cuda()) cuda::device_allocator(device_.index).release_cached();
    int64_t next = micro_ % 2 == 0 ? micro_ / 2 : 0;
    if (next == 0)
      for (int64_t d = micro_ - 1; d >= 1; --d)
        if (c_.batch % d == 0) {
          next = d;
          break;
        }
    if (next < 1) return fail("out of memory with a micro-batch of 1: " + e.message(), 1);
    // A smaller micro-batch helps only if the model can train on it (halving went on to 1, where a batch
    // norm over 1x1 died with its own error) and, on the CPU, its step needs less: below the batch the
    // micro-batches hold their gradients, which can outweigh the activations they save (ResNet-50 on
    // 28 px: 274.8 MiB planned at 8, 281.5 at 2).
    {
      std::string why;
      try {
        const MemoryPlan smaller = plan_model_step(next);
        if (!device_.is_cuda()) {
          const MemoryPlan now = plan_model_step(micro_);
          if (smaller.peak >= now.peak)
            why = "a micro-batch of " + std::to_string(next) + " needs no less (planned " + mib(smaller.peak) +
                  " against " + mib(now.peak) + " at " + std::to_string(micro_) +
                  ": below the batch the micro-batches hold their accumulated gradients)";
        }
      } catch (const Error& pe) {
        why = "the model cannot train on a micro-batch of " + std::to_string(next) + " (" + pe.message() + ")";
      }
      if (!why.empty())
        return fail("out of memory with a micro-batch of " + std::to_string(micro_) + " (" + e.message() + "), and " +
                        why + "; give the run more memory" + (c_.memory_cap.empty() ? "" : " (--memory-cap)") +
                        " or a smaller model or input",
                    1);
    }
    progress_->line("kiln train: out of memory with micro-batch " + std::to_string(micro_) + " (" + e.message() +
                    "): redoing step " + std::to_string(run_.step + 1) + " with micro-batch " + std::to_string(next) +
                    " x " + std::to_string(c_.batch / next) + " accumulation steps");
    run_.batch = start / next;
    use_micro_batch(next);
    loader_->seek({run_.epoch, run_.batch});
    return -1;
  }

  // The loader's batch from now on, and the accumulation that makes up --batch with it.
  void use_micro_batch(int64_t m) {
    micro_ = m;
    accum_ = c_.accum_steps * (c_.batch / micro_);
    io::LoaderOptions lo = loader_->options();
    lo.batch_size = micro_;
    loader_ = std::make_unique<io::DataLoader>(task_.train_data, lo);
    resolved_["micro_batch_used"] = micro_;
    if (lead_ && model_family(c_.model).input == ModelInput::images) {  // the NaN message's note, for this size
      try {
        norms_note_ = plan_norms_note(micro_);
      } catch (const Error&) {
        norms_note_.clear();  // the step itself will say what is wrong
      }
    }
  }

  // small_norms_note of a micro-batch of m on the meta device, with the remedy this run's flags allow.
  std::string plan_norms_note(int64_t m) const {
    return small_norms_note(plan_model_step(m), c_.data == "folder" ? "a larger micro-batch (--batch, --micro-batch) "
                                                                      "or --image-size"
                                                                    : "a larger micro-batch (--batch, --micro-batch)");
  }

  // The step at micro-batch m as the model alone makes it, on the meta device: planned for the CPU (the
  // question is the model's, not the device's: no cuDNN asked), one rank (each normalises its own
  // micro-batch), no ZeRO; below --batch its micro-batches accumulate.
  MemoryPlan plan_model_step(int64_t m) const {
    PlanOptions q = step_plan_options();
    q.device = "cpu";
    q.ranks = 1;
    q.zero = 0;
    if (m < c_.batch) q.accum_steps = c_.accum_steps * (c_.batch / m);
    return plan_memory(q, m);
  }

  int step_once(double lr, StepStats& s) {
    redoable_ = true;
    opt_->set_lr(lr);
    opt_->zero_grad();
    if (zero_) zero_->zero_grad();
    // Several ranks with micro-batches: no gradient leaves a rank during backward (finish() sends every
    // bucket after the micro-batches), so a rank that runs out of memory can stop without leaving the
    // others waiting in a collective; all ranks then agree on one flag (agree_on_memory). The price is
    // the overlap of the last micro-batch's backward with its all-reduce.
    const bool agree = world_ > 1 && !c_.micro_batch.empty();
    Tensor step_loss, step_correct;  // over the micro-batches, on the device
    std::string out_of_memory;       // this rank's error, with agree
    try {
      micro_batches(step_loss, step_correct, s, agree);
    } catch (const OutOfMemory& e) {
      if (!agree) throw;
      out_of_memory = e.message();
    }
    if (agree) agree_on_memory(out_of_memory);
    redoable_ = false;  // from here on the step moves sums and the scaler: not redone
    return finish_step(step_loss, step_correct, s);
  }

  // Rank 0's `s` on every rank (the others' argument is ignored), over the CPU communicator.
  std::string broadcast_string(const std::string& s) {
    Tensor len = from_vector({lead_ ? double(s.size()) : 0.0}, {1}, DType::f64);
    comm_->broadcast(len, 0);
    const size_t n = size_t(len.data<double>()[0]);
    Tensor bytes = zeros({int64_t(std::max<size_t>(n, 1))}, DType::u8);  // never an empty message
    if (lead_ && n) std::memcpy(bytes.raw_data(), s.data(), n);
    comm_->broadcast(bytes, 0);
    return std::string(static_cast<const char*>(bytes.raw_data()), n);
  }

  // Every rank runs the same recipe: rank 0 sends its flags, each rank compares them with its own, and
  // all stop together if any differs (otherwise a rank with another --batch or --max-steps trains on
  // silently, or leaves the others waiting in a collective). Paths and per-machine settings may differ
  // (each node has its own data folder, threads and device).
  int agree_on_config() {
    static const std::set<std::string> local = {"data_dir", "text",   "eval_text", "vocab",       "train_tsv",
                                                "eval_tsv", "out",    "mirror",    "tensorboard", "threads",
                                                "workers",  "device", "memory_cap"};
    nlohmann::json mine = c_.to_json();
    for (const auto& k : local) mine.erase(k);
    // Not a setting of the run (a resumed run's config equals the saved one), but every rank must
    // take the same path through resume(): its collectives would not pair up otherwise. The file
    // itself may sit at another path on each machine.
    mine["resume"] = c_.resume.empty() ? "none" : c_.resume == "auto" ? "auto" : "a checkpoint file";
    // No --task: the model's (to_json says classify, a BERT model's is mlm).
    if (c_.task.empty()) mine["task"] = model_family(c_.model).input == ModelInput::tokens ? "mlm" : "classify";
    mine = io::as_written(mine);  // as rank 0's arrives: U+FFFD for each byte that is not UTF-8
    const std::string text = broadcast_string(io::dump_json(mine));
    // A flag left at a default that stands for a rule (--warmup -1: by model; no --micro-batch) is
    // named as --help names it, not by its internal value.
    const auto shown = [](const std::string& k, const nlohmann::json& v) -> std::string {
      if (k == "warmup" && v == -1) return "default";
      if (k == "micro_batch" && v == "") return "default";
      return io::dump_json(v);
    };
    std::string diff;
    if (!lead_) {
      const nlohmann::json lead = nlohmann::json::parse(text);
      for (const auto& [k, v] : mine.items())
        if (!lead.contains(k) || lead[k] != v) {
          std::string flag = "--" + k;
          std::replace(flag.begin(), flag.end(), '_', '-');
          diff += (diff.empty() ? "" : ", ") + flag + " " + shown(k, v) +
                  " (rank 0: " + (lead.contains(k) ? shown(k, lead[k]) : "unset") + ")";
        }
    }
    Tensor bad = from_vector({diff.empty() ? 0.0 : 1.0}, {1}, DType::f64);
    comm_->all_reduce(bad, dist::ReduceOp::sum);
    if (bad.data<double>()[0] == 0) return -1;
    if (!diff.empty())
      return fail("rank " + std::to_string(rank_) + " runs another configuration than rank 0: " + diff +
                  ". Every rank must run the same kiln train command (paths, --threads, --workers and --device may "
                  "differ)");
    const int64_t n = int64_t(bad.data<double>()[0]);
    return fail(std::to_string(n) + (n == 1 ? " other rank runs" : " other ranks run") +
                " another configuration than rank 0 (each names its flags); every rank must run the same kiln "
                "train command");
  }

  // Every rank must read the same data, each its share of one order: rank 0 sends each split's sample
  // count and the contents it read (the fingerprint a checkpoint keeps, data_info.contents), and all
  // stop together if any differs. Ranks with other data took other step counts: their collectives
  // paired up wrongly, one rank printed a test loss of 0 and another ended silently.
  int agree_on_data() {
    // What a resume compares of the data (io::data_info_keys): the same counts and files read
    // through another --vocab, or with other label names or classes, train another model per rank.
    // The files' contents are compared file by file below, and the sample counts as the loaders have them.
    std::vector<const char*> keys;
    for (const char* k : io::data_info_keys())
      if (std::string_view(k) != "contents" && std::string_view(k) != "train_samples") keys.push_back(k);
    nlohmann::json mine = {{"train", task_.train_data ? task_.train_data->size() : 0},
                           {"eval", task_.eval_data ? task_.eval_data->size() : 0},
                           {"contents", task_.data_info.value("contents", nlohmann::json::array())}};
    for (const char* k : keys) mine[k] = task_.data_info.value(k, nlohmann::json());
    mine = io::as_written(mine);  // as rank 0's arrives: a class folder not UTF-8 is named with U+FFFD
    const nlohmann::json lead = nlohmann::json::parse(broadcast_string(io::dump_json(mine)));
    std::string diff;
    const auto add = [&diff](const std::string& what, const nlohmann::json& here, const nlohmann::json& there) {
      diff += (diff.empty() ? "" : ", ") + what + " " + io::short_json(here, true) +
              " (rank 0: " + io::short_json(there, true) + ")";
    };
    if (mine["train"] != lead["train"]) add("training samples", mine["train"], lead["train"]);
    if (mine["eval"] != lead["eval"]) add("evaluation samples", mine["eval"], lead["eval"]);
    for (const char* k : keys)
      if (mine[k] != lead.value(k, nlohmann::json()))
        add(std::string("data ") + k, mine[k], lead.value(k, nlohmann::json()));
    const nlohmann::json &a = mine["contents"], &b = lead["contents"];
    for (size_t i = 0; i < std::max(a.size(), b.size()); ++i)
      if (i >= a.size() || i >= b.size() || a[i] != b[i])
        add("data file", i < a.size() ? a[i] : nlohmann::json("none"), i < b.size() ? b[i] : nlohmann::json("none"));
    Tensor bad = from_vector({diff.empty() ? 0.0 : 1.0}, {1}, DType::f64);
    comm_->all_reduce(bad, dist::ReduceOp::sum);
    if (bad.data<double>()[0] == 0) return -1;
    if (!diff.empty())
      return fail("rank " + std::to_string(rank_) + " reads other data than rank 0: " + diff +
                  ". Every rank must read the same data set (its own copy, at any path)");
    const int64_t n = int64_t(bad.data<double>()[0]);
    return fail(std::to_string(n) + (n == 1 ? " other rank reads" : " other ranks read") +
                " other data than rank 0 (each names its counts and files); every rank must read the same data set");
  }

  // Every rank says whether it ran out of memory in this step's micro-batches; if any did, each
  // throws OutOfMemory naming the ranks (and its own message), and step() redoes the step everywhere.
  void agree_on_memory(const std::string& mine) {
    std::vector<double> flags(size_t(world_), 0.0);
    flags[size_t(rank_)] = mine.empty() ? 0.0 : 1.0;
    Tensor t = from_vector(flags, {world_}, DType::f64);
    comm_->all_reduce(t, dist::ReduceOp::sum);
    std::string ranks;
    for (int r = 0; r < world_; ++r)
      if (t.data<double>()[r] > 0) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    if (ranks.empty()) return;
    throw OutOfMemory(mine.empty() ? "on rank " + ranks : mine + ", on rank " + ranks, __FILE__, __LINE__);
  }

  void micro_batches(Tensor& step_loss, Tensor& step_correct, StepStats& s, bool agree) {
    // Each micro-batch's mean loss weighs 1 / accum, or, where the task counts its terms (MLM's masked
    // tokens differ from batch to batch), its share of the step's terms over all ranks, times the
    // number of ranks (the gradients are averaged over ranks): the step's batches are read first for
    // that (token ids: small), and the ranks sum their counts. So N ranks give one process's loss of
    // the whole global batch, as micro-batches give the whole batch's.
    std::vector<io::Batch> ahead;
    std::vector<double> weight(size_t(accum_), 1.0 / double(accum_));
    if (task_.terms && (accum_ > 1 || world_ > 1)) {
      auto t0 = Clock::now();
      double total = 0;
      for (int64_t k = 0; k < accum_; ++k) {
        std::optional<io::Batch> b = loader_->next();
        KILN_ASSERT(b.has_value(), "the loader ran out inside an optimizer step at batch ", loader_->position().batch);
        weight[size_t(k)] = double(task_.terms(*b));
        total += weight[size_t(k)];
        ahead.push_back(std::move(*b));
      }
      run_.window.data_s += since(t0);
      if (world_ > 1) {
        t0 = Clock::now();
        Tensor all = from_vector({total}, {1}, DType::f64);
        comm_->all_reduce(all, dist::ReduceOp::sum);
        // Weights c_k / (C / N): the average over ranks of each rank's weighted sum is the global mean.
        total = all.data<double>()[0] / double(world_);
        run_.window.comm_s += since(t0);
      }
      for (double& w : weight) w = total > 0 ? w / total : 1.0 / double(accum_);
    }
    for (int64_t k = 0; k < accum_; ++k) {
      auto t0 = Clock::now();
      std::optional<io::Batch> batch =
          ahead.empty() ? loader_->next() : std::optional<io::Batch>(std::move(ahead[size_t(k)]));
      KILN_ASSERT(batch.has_value(), "the loader ran out inside an optimizer step at batch ", loader_->position().batch);
      run_.window.data_s += since(t0);
      t0 = Clock::now();
      // Reduce once, in the last micro-batch's backward; with agree, after all of them (finish()).
      if (dp_) dp_->set_sync(!agree && k == accum_ - 1);
      if (zero_) zero_->set_sync(!agree && k == accum_ - 1);
      StepResult r;
      {
        amp::AutocastGuard autocast(amp_dt_.value_or(DType::f16), amp_dt_.has_value());
        r = task_.step(*batch);
      }
      {
        NoGradGuard ng;  // the sums stay on the device: nothing here waits for it
        const Tensor l64 = r.loss.detach().to(DType::f64);
        const Tensor micro = ahead.empty() ? l64 / double(accum_) : l64 * weight[size_t(k)];
        step_loss = step_loss.defined() ? step_loss + micro : micro;
        step_correct = step_correct.defined() ? step_correct + r.correct : r.correct;
      }
      scaler_->scale(ahead.empty() && accum_ == 1 ? r.loss : r.loss * weight[size_t(k)]).backward();
      // GPU kernels run after their launch: wait for them, so the time is the device's and not
      // charged to the next phase (the cost is one launch latency per step).
      if (device_.is_cuda()) cuda::synchronize(device_.index);
      run_.window.fb_s += since(t0);
      s.samples += batch->begin()->second.size(0);
      s.count += r.count;
    }
  }

  int finish_step(const Tensor& step_loss, const Tensor& step_correct, StepStats& s) {
    {
      NoGradGuard ng;
      win_loss_.add_(step_loss);
      epoch_loss_.add_(step_loss);
      win_correct_.add_(step_correct);
      epoch_correct_.add_(step_correct);
    }

    auto t0 = Clock::now();
    if (dp_) dp_->finish();
    if (zero_) zero_->finish();
    // The step's numbers over all ranks, and the decisions they must take together.
    stop_now_ = stop_wanted();
    time_due_ = c_.save_minutes > 0 && since(last_save_time_) >= 60.0 * c_.save_minutes;
    if (world_ > 1) {  // host numbers only: the loss and the correct count are summed over ranks by fold()
      Tensor st = from_vector({double(s.count), double(s.samples), stop_now_ ? 1.0 : 0.0, time_due_ && lead_ ? 1.0 : 0.0},
                              {4}, DType::f64);
      comm_->all_reduce(st, dist::ReduceOp::sum);
      const double* v = st.data<double>();
      s.count = int64_t(v[0]);
      s.samples = int64_t(v[1]);
      stop_now_ = v[2] > 0;
      time_due_ = v[3] > 0;  // rank 0's clock decides
    }
    run_.window.comm_s += since(t0);
    t0 = Clock::now();
    // One scaler decision per optimizer step: unscale (before clipping), skip on inf/NaN, update.
    if (c_.clip_grad_norm > 0) {
      scaler_->unscale(*opt_, params_);
      // kept on the device for the next metrics line ("grad_norm"): no read per step
      if (zero_)
        grad_norm_ = zero_->clip_grad_norm(c_.clip_grad_norm);  // the norm over every rank's chunks
      else
        grad_norm_ = optim::clip_grad_norm(params_, c_.clip_grad_norm);
    }
    scaler_->step(*opt_, params_);
    scaler_->update();
    if (zero_) zero_->gather();  // every rank's updated chunks to every rank
    if (device_.is_cuda()) cuda::synchronize(device_.index);
    run_.window.opt_s += since(t0);
    ++run_.step;
    run_.batch = loader_->position().batch;
    run_.micro_batch = micro_;
    run_.window.add(s);
    run_.epoch_sums.add(s);
    run_.samples_seen += s.samples;
    return -1;
  }

  // ---- the progress line after every step (with the loss of the last metrics line: reading the
  // loss every step would make each step wait for the device); a metrics line every --log-every
  // steps. -1 to go on, else the exit code (a loss that is not finite).
  int log_step(double lr) {
    const int64_t in_epoch = run_.batch / accum_;  // optimizer steps done in this epoch
    const bool log_now = run_.step % c_.log_every == 0 || in_epoch == spe_ || run_.step == total_steps_;
    const double win_s = since(win_start_);
    const double sps = double(run_.window.samples) / std::max(win_s, 1e-9);
    const double elapsed = run_.train_seconds + since(epoch_start_) - epoch_seconds_before_;
    const double eta = elapsed / double(std::max<int64_t>(run_.step, 1)) * double(total_steps_ - run_.step);
    if (!log_now) {
      progress_->step(run_.epoch, in_epoch, run_.step, shown_loss_, lr, sps, eta, false);
      return -1;
    }
    if (const int rc = fold(lr); rc >= 0) return rc;
    shown_loss_ = run_.window.mean_loss();
    progress_->step(run_.epoch, in_epoch, run_.step, shown_loss_, lr, sps, eta, true);
    const WindowStats& w = run_.window;
    nlohmann::json m = {{"step", run_.step},
                        {"epoch", run_.epoch + 1},
                        {"epoch_progress", double(in_epoch) / double(spe_)},
                        {"loss", w.mean_loss()},
                        {"train_" + task_.metric, w.accuracy()},
                        {"lr", lr},
                        {"samples_per_s", sps},
                        {"data_wait_s", w.data_s},
                        {"forward_backward_s", w.fb_s},
                        {"optimizer_s", w.opt_s},
                        {"elapsed_s", since(t_start_)},
                        {"host_reads", host_read_count() - reads_at_log_}};
    if (world_ > 1) {
      // Where each rank's time went: the rank that waits least for communication is the slow one.
      Tensor mine = from_vector({w.data_s, w.fb_s, w.comm_s, w.opt_s}, {4}, DType::f64);
      Tensor all = zeros({world_, 4}, DType::f64);
      comm_->all_gather(mine, all);
      nlohmann::json ranks = nlohmann::json::array();
      for (int q = 0; q < world_; ++q) {
        const double* v = all.data<double>() + 4 * q;
        ranks.push_back({{"data_wait_s", v[0]}, {"forward_backward_s", v[1]}, {"comm_wait_s", v[2]}, {"optimizer_s", v[3]}});
      }
      m["comm_wait_s"] = w.comm_s;
      m["ranks"] = ranks;
    }
    // The total gradient norm of the line's last step, before clipping (null in JSON when inf or NaN: a
    // step the scaler skipped).
    if (grad_norm_.defined()) m["grad_norm"] = grad_norm_.item<double>();
    if (amp_dt_) {
      const amp::GradScalerState st = scaler_->state();  // one read
      m["loss_scale"] = st.scale;
      m["skipped_steps"] = st.skipped;
    }
    if (device_.is_cuda()) m["gpu_memory_mib"] = gpu_memory_json(device_.index);
    write_metrics_line(m);
    write_events(m, "train/");
    if (lead_ && hooks_.on_metrics) hooks_.on_metrics(m);
    run_.window = {};
    win_loss_.zero_();
    win_correct_.zero_();
    win_start_ = Clock::now();
    reads_at_log_ = host_read_count();
    return -1;
  }

  // ---- the device-side sums of losses and correct predictions ----
  // Each rank adds its own on the device; fold() reads them (one synchronising read), sums them
  // over ranks and sets run_.window's and run_.epoch_sums' loss (the mean over ranks) and correct
  // count, at a metrics line, at the end of an epoch and before a checkpoint: on every rank at the
  // same step. It replaces, not adds, so a sum is added up in one order however often it is read,
  // and a resumed run continues it exactly. -1 to go on, else the exit code (a loss that is not
  // finite: stop before anything is saved).
  int fold(double lr = 0) {
    const std::vector<double> v =
        stack({win_loss_, epoch_loss_, win_correct_.to(DType::f64), epoch_correct_.to(DType::f64)}, 0).to_vector();
    Tensor all = from_vector(v, {4}, DType::f64);
    if (world_ > 1) comm_->all_reduce(all, dist::ReduceOp::sum);
    const double* a = all.data<double>();
    run_.window.loss = world_ > 1 ? a[0] / double(world_) : a[0];
    run_.epoch_sums.loss = world_ > 1 ? a[1] / double(world_) : a[1];
    run_.window.correct = int64_t(a[2]);
    run_.epoch_sums.correct = int64_t(a[3]);
    if (std::isfinite(run_.window.loss) && std::isfinite(run_.epoch_sums.loss)) return -1;
    progress_->line("");
    if (lead_) {  // through fail(): kiln.train raises it (a notebook may not show stderr)
      char msg[512];
      char lr_text[48] = "";
      if (lr > 0) std::snprintf(lr_text, sizeof lr_text, ", lr %g", lr);
      std::snprintf(msg, sizeof msg,
                    "the loss is %s in the steps up to step %lld (epoch %lld%s); stopping. Lower --lr, add --warmup "
                    "or --clip-grad-norm%s. Metrics so far are in %s",
                    std::isnan(run_.window.loss) || std::isnan(run_.epoch_sums.loss) ? "NaN" : "infinite",
                    (long long)run_.step, (long long)run_.epoch + 1, lr_text,
                    amp_dt_ == DType::f16 ? " (the forward pass overflowed f16: try --amp bf16)" : "",
                    metrics_path_.c_str());
      fail(norms_note_.empty() ? std::string(msg) : std::string(msg) + ". Also: " + norms_note_, 1);
    }
    return 1;
  }
  // The device sums from run_ (zero, or a resumed run's): rank 0 holds the correct counts so far,
  // every rank the loss (fold() takes the mean over ranks).
  void load_sums() {
    const TensorOptions f(DType::f64, device_), i(DType::i64, device_);
    win_loss_ = full({}, run_.window.loss, f);
    epoch_loss_ = full({}, run_.epoch_sums.loss, f);
    win_correct_ = full({}, lead_ ? double(run_.window.correct) : 0.0, i);
    epoch_correct_ = full({}, lead_ ? double(run_.epoch_sums.correct) : 0.0, i);
    reads_at_log_ = host_read_count();
  }

  // ---- the end of an epoch: evaluate, print and log it ----
  void evaluate_epoch(double epoch_s) {
    sync_buffers();
    TrainConfig ec = c_;
    ec.batch = micro_;  // what fits for training fits for evaluation
    const EvalResult ev = evaluate(task_, ec, comm_.get());
    const EpochStats& e = run_.epoch_sums;
    char buf[256];
    // Masked-LM: the test perplexity too, exp of the mean loss over the masked tokens.
    const std::string ppl = task_.terms ? " perplexity " + perplexity_text(ev.loss) : std::string();
    std::snprintf(buf, sizeof buf,
                  "epoch %lld: train loss %.4f %s %.2f%% | test loss %.4f%s %s %.2f%% | %.1f s (+%.1f s eval)",
                  (long long)run_.epoch + 1, e.loss / double(std::max<int64_t>(run_.batch / accum_, 1)),
                  task_.metric.c_str(), 100.0 * double(e.correct) / double(std::max<int64_t>(e.count, 1)), ev.loss,
                  ppl.c_str(), task_.metric.c_str(), 100.0 * ev.accuracy, epoch_s, ev.seconds);
    progress_->line(buf);
    if (lead_ && !std::isfinite(ev.loss))
      std::fprintf(stderr,
                   "kiln train: warning: the test loss is %s after epoch %lld while the training loss is finite: the "
                   "model gives non-finite outputs in evaluation mode on the test data%s%s\n",
                   std::isnan(ev.loss) ? "NaN" : "infinite", (long long)run_.epoch + 1,
                   amp_dt_ == DType::f16 ? " (f16 autocast overflows: try --amp bf16)" : "",
                   norms_note_.empty() ? "" : (" (the running statistics may be broken: " + norms_note_ + ")").c_str());
    nlohmann::json em = {{"step", run_.step},          {"epoch", run_.epoch + 1},
                         {"eval_loss", ev.loss},       {"eval_" + task_.metric, ev.accuracy},
                         {"eval_samples", ev.samples}, {"epoch_seconds", epoch_s},
                         {"eval_seconds", ev.seconds}};
    if (task_.terms) {  // masked-LM: the metric is over masked tokens
      em["eval_scored_tokens"] = ev.count;
      em["eval_perplexity"] = std::exp(ev.loss);
    }
    write_metrics_line(em);
    write_events(em, "eval/");
    if (lead_ && hooks_.on_metrics) hooks_.on_metrics(em);
    refresh_report();
    run_.epochs_log.push_back(em);
    run_.last_eval_loss = ev.loss;
    run_.last_eval_accuracy = ev.accuracy;
    run_.last_eval_count = ev.samples;
    ++run_.epoch;
    run_.batch = 0;
    run_.epoch_sums = {};
    epoch_loss_.zero_();
    epoch_correct_.zero_();
  }

  // ---- a checkpoint, and the stop a signal asked for (`where`: " at step N" / " after epoch N").
  // -1 to go on, else the exit code. A periodic checkpoint that cannot be written (a full disk) is
  // reported and training goes on: the previous ones are intact and the next save point tries again.
  int checkpoint(bool stopping, const std::string& where) {
    if (const int rc = fold(); rc >= 0) return rc;
    if (stopping) agree_on_stop();
    // A signal stop is one before anything else can fail (a moved --out): kiln.train raises
    // KeyboardInterrupt / SystemExit for it, not a KilnError, on the rank that caught it; the other
    // ranks return {"stopped": True} as their `kiln train` exits 0 (a SystemExit(143) on every rank
    // made kiln launch blame rank 0).
    if (stopping && outcome_) {
      outcome_->stop_signal = own_signal_;
      outcome_->stop_asked = stop_signal_ == 0;
    }
    if (const int rc = check_out_in_place(); rc >= 0) return rc;
    // The end of the epoch right after the step's own checkpoint failed: tried once, not twice (the
    // next save point tries again). A stop still tries: it is what the stop saves for.
    // Rank 0 alone knows (the others' save() succeeds without writing): its decision is every rank's, or
    // rank 0 would skip the collective the others enter in save().
    bool skip = !stopping && ckpt_failed_at_ == run_.step && ckpt_failed_at_ >= 0;
    if (world_ > 1 && !stopping) skip = broadcast_string(lead_ && skip ? "skip" : "") == "skip";
    if (skip) return -1;
    bool ok = save();
    last_save_time_ = Clock::now();
    if (!stopping) return -1;
    std::string saved = ok ? last_saved_ : "";
    if (world_ > 1) {  // rank 0 wrote it for all: every rank's kiln.train returns its path
      const std::string lead = broadcast_string(lead_ ? std::string(ok ? "1" : "0") + saved : std::string());
      ok = lead[0] == '1';
      saved = lead.substr(1);
    }
    if (outcome_) outcome_->saved = saved;
    const std::string why =
        stop_signal_ ? (stop_rank_ > 0 ? "rank " + std::to_string(stop_rank_) + " caught " : std::string("caught ")) +
                           signal_name(stop_signal_)
                     : std::string("stop requested");
    if (stop_signal_) {
      record_stop(signal_name(stop_signal_));
      write_stopped_summary(signal_name(stop_signal_));
    }
    if (!ok && !lead_)  // rank 0 said why; a rank that exits 1 saying nothing looks like the cause
      return fail("rank 0 could not save the checkpoint (" + why + where + "): see rank 0's messages", 1);
    if (!ok) {
      progress_->line("kiln train: " + why + where + " and stopped, but its checkpoint failed (above): " +
                      (last_saved_.empty()
                           ? "this run has no checkpoint to continue from"
                           : "the last good one is " + last_saved_ + "; continue with " + hooks_.resume_hint));
      return 1;
    }
    progress_->line("kiln train: " + why + where + "; saved " + last_saved_ + "; continue with " + hooks_.resume_hint);
    return 0;
  }
  // Why the run stops, the same on every rank (a collective when there are several): the signal of
  // the lowest rank that caught one, and that rank; 0 when none did (the host's stop request). A
  // rank's own g_stop_signal is 0 when the signal went to another machine's launcher: rank 0 alone
  // would have reported no signal at all (no stop line, no summary).
  void agree_on_stop() {
    const int mine = int(g_stop_signal);  // read once: a signal may come in meanwhile
    own_signal_ = stop_signal_ = mine;
    stop_rank_ = mine ? rank_ : -1;
    if (world_ == 1) return;
    Tensor m = zeros({1}, DType::i64), all = zeros({world_}, DType::i64);
    m.data<int64_t>()[0] = mine;
    comm_->all_gather(m, all);
    stop_signal_ = 0;
    stop_rank_ = -1;
    for (int q = 0; q < world_ && !stop_signal_; ++q)
      if (const int sig = int(all.data<int64_t>()[q]); sig != 0) {
        stop_signal_ = sig;
        stop_rank_ = q;
      }
  }
  // Why a run stopped early, for whoever reads its folder later: a metrics line {"stopped": "SIGHUP",
  // "step": N, "checkpoint": the last good one} (kiln report skips it; the resume keeps it), with
  // "rank": the rank that caught the signal when there are several.
  void record_stop(const std::string& signal) {
    if (!lead_) return;
    nlohmann::json line = {{"stopped", signal}, {"step", run_.step}, {"checkpoint", last_saved_}};
    if (world_ > 1) line["rank"] = stop_rank_;
    write_metrics_line(line);
  }
  // And a summary.json as a finished run's, with "stopped": the signal, so a tool that waits for the
  // summary sees the stop (and the step reached, the last checkpoint) instead of waiting for ever; the
  // test numbers are the last evaluation's, null before the first. The resumed run removes it. One
  // that cannot be written is a warning: the checkpoint is what the stop is for.
  void write_stopped_summary(const std::string& signal) {
    if (!lead_) return;
    try {
      nlohmann::json summary = summary_json(since(t_start_));
      summary["stopped"] = signal;
      if (run_.epochs_log.empty()) {
        for (const std::string& k : {std::string("test_loss"), "test_" + task_.metric, std::string("test_samples")})
          summary[k] = nullptr;
        // exp of the loss not yet measured (0) would read as a perfect perplexity of 1.
        if (summary.contains("test_perplexity")) summary["test_perplexity"] = nullptr;
      }
      io::write_file_atomic(c_.out + "/summary.json", io::dump_json(summary, 2) + "\n");
    } catch (const std::exception& e) {
      const auto* error = dynamic_cast<const Error*>(&e);
      progress_->line("kiln train: warning: summary.json of the stop not written: " +
                      (error ? error->message() : std::string(e.what())));
    }
  }
  // -1 while OUT/.lock is still this run's lock file, else the exit code; every rank asks, unless
  // `rank0_only` (rank 0 tells).
  int check_out_in_place(bool rank0_only = false) {
    const bool gone = lead_ && !lock_.still_in_place(c_.out);
    if (rank0_only ? !gone : !any_rank(gone)) return -1;
    if (!lead_) return 1;
    return fail("--out " + c_.out +
                    " was deleted or moved while the run was writing to it (its lock file is gone): stopping; the "
                    "run's files so far are where the folder went",
                1);
  }
  // Buffers (batch-norm running statistics) are not averaged as gradients are: each rank's follow its own
  // batches. Before an evaluation and a checkpoint every rank takes rank 0's, the ones saved, so the test
  // loss is the saved model's and a resumed run goes on from the same buffers on every rank (as DDP's
  // broadcast_buffers, which does it before every forward).
  void sync_buffers() {
    if (world_ == 1) return;
    dist::Communicator& c = gpu_comm_ ? *gpu_comm_ : *comm_;
    NoGradGuard no_grad;
    for (const auto& [name, t] : model().named_buffers()) c.broadcast(t, 0);
  }
  bool save() {
    sync_buffers();
    if (world_ > 1) {  // every rank's generator goes into rank 0's checkpoint
      Tensor mine = zeros({2}, DType::i64), all = zeros({world_, 2}, DType::i64);
      mine.data<int64_t>()[0] = int64_t(default_generator().seed);
      mine.data<int64_t>()[1] = int64_t(default_generator().offset);
      comm_->all_gather(mine, all);
      run_.rng_ranks = nlohmann::json::array();
      for (int q = 0; q < world_; ++q)
        run_.rng_ranks.push_back({uint64_t(all.data<int64_t>()[2 * q]), uint64_t(all.data<int64_t>()[2 * q + 1])});
    }
    // ZeRO: every rank's optimizer chunks go into rank 0's checkpoint, gathered one bucket and slot
    // at a time while it writes; the other ranks join each gather in the same order.
    std::vector<std::pair<std::string, std::function<Tensor()>>> gathers;
    size_t gathered = 0;
    if (zero_)
      for (auto& [name, make] : zero_->state_entries(*opt_))
        gathers.emplace_back(name, [&gathered, make = make] {
          Tensor t = make();
          ++gathered;
          return t;
        });
    auto join_the_rest = [&] {  // a rank that is not writing, or a writer that failed halfway
      while (gathered < gathers.size()) gathers[gathered].second();
    };
    if (!lead_) {  // rank 0 writes for all: every rank holds the same weights and state
      join_the_rest();
      return true;
    }
    try {
      run_.scaler = scaler_->state();
      if (zero_)
        last_saved_ = save_run_checkpoint(ckpt_dir_, model(), *opt_, run_, resolved_,
                                          io::ShardedOptimizerState{gathers, io::zero_layout_json(zero_->layout())});
      else
        last_saved_ = save_run_checkpoint(ckpt_dir_, model(), *opt_, run_, resolved_);
    } catch (const std::exception& e) {  // an Error, or the file system's (a checkpoints folder made a file)
      join_the_rest();
      const auto* error = dynamic_cast<const Error*>(&e);
      progress_->line("kiln train: error: checkpoint at step " + std::to_string(run_.step) +
                      " failed: " + (error ? error->message() : std::string(e.what())) +
                      (last_saved_.empty() ? "" : "; the last good one is " + last_saved_));
      if (ckpt_failed_since_ < 0) ckpt_failed_since_ = run_.step;
      ckpt_failed_at_ = run_.step;
      return false;
    }
    ckpt_failed_since_ = ckpt_failed_at_ = -1;
    set_second_interrupt_message(last_saved_);
    prune_checkpoints(ckpt_dir_, c_.keep_last);
    if (mirror_) mirror_->enqueue(last_saved_);
    return true;
  }

  // ---- weights and summary (rank 0) ----
  int finish() {
    nlohmann::json summary;
    int rc = lead_ ? check_out_in_place(/*rank0_only=*/true) : 0;
    if (lead_ && rc < 0) {
      try {
        rc = write_outputs(summary);
      } catch (const Error& e) {  // said as kiln train's, and to kiln.train's on_error
        rc = fail(e.message(), 1);
      } catch (const std::exception& e) {
        rc = fail(e.what(), 1);
      }
    }
    // The summary, rank 0's on every rank once its writes are done (kiln.train returns it there too;
    // rank 0 alone writes it), or nothing when they failed: the other ranks fail with it. A path that
    // is not UTF-8 (--out) is written with U+FFFD, as in summary.json.
    const auto text = [](const nlohmann::json& j) { return io::dump_json(j); };
    if (world_ > 1) {
      const std::string lead = broadcast_string(lead_ && rc == 0 ? text(summary) : std::string());
      if (!lead_ && lead.empty()) return fail("rank 0 could not write the run's outputs: see rank 0's messages", 1);
      if (!lead_) summary = nlohmann::json::parse(lead);
    }
    if (outcome_ && rc == 0) {
      outcome_->finished = true;
      outcome_->summary = text(summary);
    }
    return rc;
  }
  int write_outputs(nlohmann::json& summary) {
    std::map<std::string, std::string> meta = torch_compatible_metadata();
    meta["model"] = c_.model;
    meta["task"] = task_.name;
    meta.merge(weights_metadata(resolved_));  // the rest as kiln ckpt export writes it from a checkpoint
    io::save_safetensors(c_.out + "/model.safetensors", model().state_dict(), meta);
    summary = summary_json(since(t_start_));  // after the weights: wall_seconds is the whole run's
    const double wall = summary["wall_seconds"].get<double>();
    io::write_file_atomic(c_.out + "/summary.json", io::dump_json(summary, 2) + "\n");
    refresh_report();
    char buf[384];
    char skipped[96] = "";
    if (scaler_->enabled())
      std::snprintf(skipped, sizeof skipped, " (%lld skipped for inf/NaN gradients, loss scale %g)",
                    (long long)scaler_->skipped_steps(), scaler_->get_scale());
    // The time and rate are this process's (a resumed run's session), and say so when the steps are more.
    const int64_t session_steps = run_.step - session_step0_;
    char steps[96];
    if (session_steps == run_.step)
      std::snprintf(steps, sizeof steps, "%lld steps", (long long)run_.step);
    else
      std::snprintf(steps, sizeof steps, "%lld steps (%lld in this session)", (long long)run_.step,
                    (long long)session_steps);
    const std::string ppl = task_.terms ? " perplexity " + perplexity_text(run_.last_eval_loss) : std::string();
    std::snprintf(buf, sizeof buf, "test %s %.2f%%%s (%lld samples), %s%s in %s, %.0f samples/s; wrote %s",
                  task_.metric.c_str(), 100.0 * run_.last_eval_accuracy, ppl.c_str(), (long long)run_.last_eval_count,
                  steps, skipped, hms(wall).c_str(), summary["session_samples_per_s"].get<double>(), c_.out.c_str());
    progress_->line(buf);
    // Checkpoints that failed to the end (a full disk): the run's results are written (exit 0), but
    // what a resume would continue from is older; summary.json says it too (checkpoints_failed_since).
    if (ckpt_failed_since_ >= 0)
      progress_->line("kiln train: warning: checkpoints failed since step " + std::to_string(ckpt_failed_since_) +
                      (last_saved_.empty() ? ": this run has no checkpoint to continue from"
                                           : " (last good: " + last_saved_ + ")"));
    return 0;
  }

  // summary.json's contents: the run's final numbers (at the end, or where a signal stopped it).
  nlohmann::json summary_json(double wall) {
    const double sps = double(run_.samples_seen) / std::max(run_.train_seconds, 1e-9);
    const double session_sps =
        double(run_.samples_seen - session_samples0_) / std::max(run_.train_seconds - session_train0_, 1e-9);
    nlohmann::json summary = {{"model", c_.model},
                              {"task", task_.name},
                              {"steps", run_.step},
                              {"epochs", run_.epochs_log.size()},
                              {"test_loss", run_.last_eval_loss},
                              {"test_" + task_.metric, run_.last_eval_accuracy},
                              {"test_samples", run_.last_eval_count},
                              {"bad_samples_skipped", task_.bad_samples ? task_.bad_samples() : 0},
                              {"amp", c_.amp},
                              {"loss_scale", scaler_->get_scale()},
                              {"skipped_steps", scaler_->skipped_steps()},
                              {"wall_seconds", wall},
                              {"device", device_.str()},
                              {"cpu_isa", cpu_isa_name(cpu_isa())},
                              {"train_seconds", run_.train_seconds},
                              {"samples_per_s", sps},
                              {"session_steps", run_.step - session_step0_},
                              {"session_samples_per_s", session_sps},
                              {"resumed_from", resumed_from_},
                              {"last_checkpoint", last_saved_},
                              {"per_epoch", run_.epochs_log},
                              {"config", resolved_}};
    if (device_.is_cuda()) summary["gpu_memory_mib"] = gpu_memory_json(device_.index);
    if (task_.terms) summary["test_perplexity"] = std::exp(run_.last_eval_loss);  // masked-LM
    // The step of the first checkpoint that failed since the last good one (last_checkpoint); null
    // when the last one saved.
    summary["checkpoints_failed_since"] =
        ckpt_failed_since_ >= 0 ? nlohmann::json(ckpt_failed_since_) : nlohmann::json(nullptr);
    return summary;
  }

  const TrainConfig& c_;
  const TrainHooks& hooks_;
  TrainOutcome* outcome_;
  OutLock lock_;  // first member: released after everything else (the mirror's copies) has finished
  // The replaced run's checkpoints, here and in the mirror (a fresh run with --overwrite): their higher
  // step numbers would outrank this run's in pruning and in --resume auto. Its other outputs go when
  // the metrics are opened, as for every fresh run.
  void remove_old_checkpoints() {
    std::error_code ec;
    for (const std::string& dir : {ckpt_dir_, c_.mirror}) {
      if (dir.empty()) continue;
      for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
        const std::string n = e.path().filename().string();
        std::error_code same_ec;
        if (!c_.resume.empty() && std::filesystem::equivalent(e.path(), c_.resume, same_ec)) continue;  // its weights
        if (n == "latest" || (n.rfind("step-", 0) == 0 && e.path().extension() == ".kiln"))
          std::filesystem::remove(e.path(), ec);
      }
    }
  }
  bool asked_stop_ = false;
  const Clock::time_point t_start_ = Clock::now();
  // who and where
  std::unique_ptr<dist::Communicator> comm_, gpu_comm_;
  int rank_ = 0, world_ = 1;
  bool lead_ = true;
  Device device_;
  // what is trained, on what, how
  Task task_;
  std::unique_ptr<io::DataLoader> loader_;
  int64_t accum_ = 1, spe_ = 0, total_steps_ = 0, global_batch_ = 0;
  int64_t micro_ = 0;  // the loader's batch: --batch, or its micro-batch
  PlanOptions plan_options_;  // --micro-batch auto's plan and the memory it had (plan_budget_ bytes)
  size_t plan_budget_ = 0;
  size_t loader_per_sample_ = 0;  // the data loader's host bytes per sample of a micro-batch (0 on a GPU)
  bool redoable_ = false;  // the step in progress is still in its micro-batches (out of memory: redo it)
  struct CpuCap {      // --memory-cap, lifted when the run ends (kiln.train shares the process)
    size_t bytes = 0;
    void set(size_t b) {
      bytes = b;
      set_cpu_memory_cap(b);
    }
    ~CpuCap() {
      if (bytes) set_cpu_memory_cap(0);
    }
  } cap_;
  std::unique_ptr<optim::Optimizer> opt_;
  optim::LrSchedule sched_;
  std::vector<Tensor> params_;
  std::optional<DType> amp_dt_;
  std::unique_ptr<amp::GradScaler> scaler_;
  std::unique_ptr<dist::DataParallel> dp_;
  std::unique_ptr<dist::ZeroRedundancy> zero_;
  nlohmann::json resolved_;
  // progress, output, checkpoints
  RunState run_;
  std::string ckpt_dir_, metrics_path_, resumed_from_, last_saved_;
  std::string norms_note_;        // small_norms_note of the micro-batch (image models), "" when none
  io::MirrorOwner mirror_owner_;  // another run's --mirror, which this run takes over if it resumes from it
  int metrics_fd_ = -1;           // metrics.jsonl, O_APPEND (rank 0)
  bool metrics_failed_ = false;  // the last metrics line was not written: reopen before the next
  int64_t metrics_failed_at_ = 0;
  // Checkpoints failing (a full disk): the step of the first of the failures since the last good
  // one (-1 while the last one saved), and of the latest failure (the end of an epoch does not try
  // the step that just failed a second time).
  int64_t ckpt_failed_since_ = -1, ckpt_failed_at_ = -1;
  // Where this process's session began (a resumed run: the checkpoint's step, samples and seconds).
  int64_t session_step0_ = 0, session_samples0_ = 0;
  double session_train0_ = 0;
  std::unique_ptr<io::EventWriter> tb_;  // rank 0, unless --no-tensorboard
  std::unique_ptr<Progress> progress_;
  std::unique_ptr<CheckpointMirror> mirror_;
  double mirror_wait_s_ =
      60;  // how long the end of the run waits for a mirror copy without progress (KILN_MIRROR_WAIT)
  Clock::time_point last_save_time_, win_start_, epoch_start_;
  double epoch_seconds_before_ = 0;
  bool stop_now_ = false, time_due_ = false;
  int stop_signal_ = 0, stop_rank_ = -1;  // the stop the ranks agreed on (agree_on_stop)
  int own_signal_ = 0;                    // the signal this rank caught itself, or 0
  // this rank's sums since the window's and the epoch's start, on the device (see fold())
  Tensor win_loss_, epoch_loss_, win_correct_, epoch_correct_;
  Tensor grad_norm_;           // the last step's, with --clip-grad-norm
  double shown_loss_ = 0;      // the progress line's loss: the last metrics line's
  uint64_t reads_at_log_ = 0;  // host_read_count() at the last metrics line
};

}  // namespace

namespace {

// One run at a time in a process: runs share the default random generator (each seeds it, and saves
// and restores its state around evaluation) and the process-wide signal handlers (each installs its
// own and puts back what it found), so two at once changed each other's losses and left Ctrl-C
// ignored. 0: none running; else the OS thread id of the one that is (threading.get_native_id()).
// A forked child has none running: the thread that ran one is not in it.
std::atomic<long> g_running_train{0};
[[maybe_unused]] const int g_running_train_atfork =
    ::pthread_atfork(nullptr, nullptr, [] { g_running_train.store(0); });

struct OneRunAtATime {
  OneRunAtATime() {
    long none = 0;
    const long me = static_cast<long>(::gettid());
    if (g_running_train.compare_exchange_strong(none, me)) return;
    KILN_CHECK(none != me,
               "kiln.train was called from inside the running kiln.train (its callback, on the same thread); "
               "runs in one process share the random generator and the signal handlers: start the next run "
               "after this one returns");
    KILN_FAIL("kiln.train is already running in this process (thread ", none,
              "); runs in one process share the random generator and the signal handlers: run them one after "
              "another or in separate processes");
  }
  ~OneRunAtATime() { g_running_train.store(0); }
  OneRunAtATime(const OneRunAtATime&) = delete;
  OneRunAtATime& operator=(const OneRunAtATime&) = delete;
};

}  // namespace

int run_train(const TrainConfig& c, const TrainHooks& hooks, TrainOutcome* outcome) {
  const OneRunAtATime one_run;
  auto trainer = std::make_unique<Trainer>(c, hooks, outcome);
  try {
    return trainer->run();
  } catch (const OutOfMemory& e) {
    if (c.memory_cap.empty()) throw;
    // Past what the run can shrink (--micro-batch auto halves a step's micro-batch): the cap itself.
    const std::string msg = "--memory-cap " + c.memory_cap + " is too small for this run: " + e.message();
    std::fprintf(stderr, "kiln train: error: %s\n", msg.c_str());
    if (hooks.on_error) hooks.on_error(msg);
    return 1;
  } catch (const dist::CollectiveError&) {
    // The peers are gone or hang: the Trainer's destructors (DataParallel's pending buckets, NCCL
    // and MPI teardown, the checkpoint mirror) could wait for them. main() prints and exits with
    // code 3 without running them; the Trainer is deliberately never destroyed.
    // The folder's lock is let go all the same: kiln.train may try again in this process.
    trainer->release_out_lock();
    (void)trainer.release();
    throw;
  }
}

namespace {

// A kiln eval setting as its flag takes it, for a warning: a number's shortest text that reads back as it (%g
// could print two different values alike).
std::string setting_text(const std::string& v) { return v; }
std::string setting_text(int64_t v) { return std::to_string(v); }
std::string setting_text(double v) {
  char b[32];
  return std::string(b, std::to_chars(b, b + sizeof b, v).ptr);
}

// What kiln train's model.safetensors (and kiln ckpt export's) says it holds, metadata "model",
// "task" and "set": the defaults of kiln eval's --model, --task and --set, so the weights evaluate as
// the model they are. A flag given that builds another model is refused naming both, before the
// vocabulary or the label names (another model's) are looked at.
void take_trained_model(TrainConfig& c, const std::map<std::string, std::string>& meta, const std::string& weights) {
  const auto model_it = meta.find("model");
  if (model_it == meta.end() || !find_model_family(model_it->second)) return;  // not Kiln's, or a newer model
  const std::string& model = model_it->second;
  const auto task_it = meta.find("task");
  std::string task;
  if (task_it != meta.end()) {
    task = task_it->second;
  } else if (c.was_given("task")) {
    // Older builds' files and kiln ckpt import's name no task: a guess from the name would refuse the
    // --task given (bert-tiny guesses mlm); the weights' shapes say whether it is right.
    task = c.task;
  } else {
    // A BERT name says its head (bert-tiny-cls), others classify: the --model given, else the file's.
    const std::string& named = c.was_given("model") && find_model_family(c.model) ? c.model : model;
    task = model_family(named).input == ModelInput::tokens && parse_bert_name(named).head != "cls" ? "mlm" : "classify";
  }
  KILN_CHECK(task == "classify" || task == "mlm", weights, ": damaged metadata: task is '", task,
             "', not classify or mlm");
  const std::string theirs = trained_model_name(model, task);
  if (c.was_given("task") && c.task != task)
    KILN_FAIL("--task ", c.task, ": ", weights, " holds ", theirs, " weights, trained for --task ", task);
  if (!c.was_given("task")) c.task = task;
  if (!c.was_given("model")) {
    c.model = model;
    if (!c.was_given("batch")) c.batch = model_defaults(model).batch;
  }
  const std::string mine = trained_model_name(c.model, c.task);
  KILN_CHECK(mine == theirs, weights, " holds ", theirs, " weights, not ", mine, " (--model ", c.model,
             c.was_given("task") ? " --task " + c.task : std::string(),
             "): leave --model out to evaluate them as the model they are");
  // The run's --amp, as its evaluations ran (files before it was stored: the flag as given).
  if (const auto amp_it = meta.find("amp"); amp_it != meta.end() && !c.was_given("amp")) {
    KILN_CHECK(amp_it->second == "off" || amp_it->second == "fp16" || amp_it->second == "bf16", weights,
               ": damaged metadata: amp is '", amp_it->second, "', not off, fp16 or bf16");
    c.amp = amp_it->second;
  }
  // The run's --set (files before it was stored: none known, the flags as given).
  const auto set_it = meta.find("set");
  if (set_it == meta.end()) return;
  std::vector<std::string> trained;
  try {
    trained = nlohmann::json::parse(set_it->second).get<std::vector<std::string>>();
  } catch (const std::exception&) {
    KILN_FAIL(weights, ": damaged metadata: set is '", set_it->second, "', not a JSON list of key=value texts");
  }
  if (!c.was_given("set")) {
    c.sets = trained;
    return;
  }
  // Compared as the config each makes (keys in another order are the same), only in the fields the
  // --set given names: the others are not the user's choice. Dropout and the start's
  // zero_init_residual do not change what the weights compute in evaluation; num_labels is the
  // classifier's, which a masked LM does not have.
  const auto was = model_config_fields(c.model, trained), now = model_config_fields(c.model, c.sets);
  std::set<std::string> named;
  for (const auto& kv : c.sets) named.insert(split_set(kv).first);  // well-formed: model_config_fields read them
  for (size_t i = 0; i < was.size() && i < now.size(); ++i) {
    const std::string& field = was[i].first;
    if (!named.count(field) || !weights_config_field(field, c.task == "classify")) continue;
    KILN_CHECK(was[i] == now[i], "--set ", field, "=", now[i].second, ": ", weights, " was trained with ", field, "=",
               was[i].second, " (leave --set out to take the weights' own)");
  }
  // The weights' own sets under the given ones: a field the --set given does not name keeps its
  // trained value (num_classes=12 weights evaluated with another --set still build 12 classes).
  std::vector<std::string> sets;
  for (const auto& kv : trained)
    if (!named.count(split_set(kv).first)) sets.push_back(kv);
  sets.insert(sets.end(), c.sets.begin(), c.sets.end());
  c.sets = std::move(sets);
}

}  // namespace

int run_eval(const TrainConfig& c0, const std::string& weights) {
  TrainConfig c = c0;
  c.evaluating = true;
  // The weights first: their model, task and --set are the flags' defaults. A file that does not
  // load is said first, then the flags' problems that do not hang on its model.
  std::optional<io::SafetensorsFile> file;
  std::string unreadable;
  try {
    file = io::load_safetensors(weights);
    take_trained_model(c, file->metadata, weights);
  } catch (const Error& e) {
    if (!file)
      unreadable = e.message();
    else {
      std::fprintf(stderr, "kiln eval: error: %s\n", e.message().c_str());
      return 2;
    }
  }
  auto problems = validate(c);
  if (!unreadable.empty() && !c.was_given("model")) {
    // The model is the file's, which did not load (c.model fell back to the default, resnet20): only
    // the problems every model family has are the flags' own ("--vocab: for BERT models" was not).
    TrainConfig other = c;
    other.model = model_family(c.model).input == ModelInput::tokens ? "resnet20" : "bert-tiny";
    const auto theirs = validate(other);
    std::erase_if(problems, [&theirs](const std::string& p) {
      return std::find(theirs.begin(), theirs.end(), p) == theirs.end();
    });
  }
  if (std::string clash = output_is_input("--out", c.out, {weights}); !clash.empty()) problems.push_back(clash);
  // A file that does not load is said first: the flags' problems may follow from it.
  if (!unreadable.empty()) problems.insert(problems.begin(), unreadable);
  for (const auto& p : problems) std::fprintf(stderr, "kiln eval: error: %s\n", p.c_str());
  if (!problems.empty()) return 2;
  if (c.threads > 0) set_num_threads(c.threads);
  Task task;
  try {
    const io::SafetensorsFile& f = *file;
    // A classifier's label names travel with its weights, so ids mean the same classes here.
    if (auto it = f.metadata.find("labels"); it != f.metadata.end())
      c.label_names = nlohmann::json::parse(it->second).get<std::vector<std::string>>();
    // Only Kiln's files have them (kiln train's model.safetensors and kiln ckpt export's of its
    // checkpoints, with their "task"; not an import's); a file without them needs the labels' file, said with the
    // file's name and where it came from: elsewhere, or an older kiln train (another task's file was refused
    // by take_trained_model, as another model's).
    if (c.task == "classify" && c.label_names.empty() && c.train_tsv.empty() &&
        model_family(c.model).input == ModelInput::tokens) {
      const std::string why = f.metadata.count("task") == 0 ? "it was not written by kiln train (Hugging Face's "
                                                              "model.safetensors carries none, nor do the weights of "
                                                              "a kiln ckpt import, exported or not)"
                                                            : "it was written by a kiln train older than them";
      KILN_FAIL("--task classify: ", weights, " carries no label names: ", why,
                ". Give --train-tsv, the file the model was trained on (or any with its labels: integer labels 0..N-1 "
                "are classes 0..N-1, as Hugging Face numbers them)");
    }
    // A setting the model was trained with (metadata `key`, read by `parse`, which throws on text that is not
    // `what`): taken unless its flag was given; another one given is a legitimate choice (longer texts, larger
    // images, another masking rate) and is used, with a warning: the numbers then differ from the run's test's.
    const auto take_trained = [&](const char* key, const char* flag, bool given, auto& value, const char* what,
                                  const auto& parse, const auto& same) {
      const auto it = f.metadata.find(key);
      if (it == f.metadata.end()) return;  // weights from before the setting: the flag as given
      std::optional<std::decay_t<decltype(value)>> trained;
      try {
        trained = parse(it->second);
      } catch (const Error&) {
      }
      KILN_CHECK(trained, weights, ": damaged metadata: ", key, " is '", it->second, "', not ", what);
      if (!given)
        value = *trained;
      else if (!same(value, *trained))
        std::fprintf(stderr, "kiln eval: warning: %s %s, but %s was trained with %s %s\n", flag,
                     setting_text(value).c_str(), weights.c_str(), flag, setting_text(*trained).c_str());
    };
    const auto equal = [](const auto& a, const auto& b) { return a == b; };
    const auto size = [](const std::string& v) {
      int64_t n = 0;
      const auto parsed = std::from_chars(v.data(), v.data() + v.size(), n);
      KILN_CHECK(parsed.ec == std::errc() && parsed.ptr == v.data() + v.size() && n >= 1, "not a size");
      return n;
    };
    // An image folder's model evaluates at the size it was trained at, and normalises as it was trained.
    if (c.data == "folder") {
      take_trained("image_size", "--image-size", c.was_given("image-size"), c.image_size, "a positive whole number",
                   size, equal);
      for (const auto& norm : {std::tuple{"mean", "--mean", &c.norm_mean}, std::tuple{"std", "--std", &c.norm_std}}) {
        const char* flag = std::get<1>(norm);
        const auto values = [flag](const std::string& v) { return normalisation_values(flag, v); };
        take_trained(
            std::get<0>(norm), flag, !std::get<2>(norm)->empty(), *std::get<2>(norm), "one or three numbers",
            [&values](const std::string& v) {
              values(v);  // checked: the text is kept as it was given
              return v;
            },
            [&values](const std::string& given, const std::string& trained) {
              std::vector<double> g = values(given), t = values(trained);
              if (g.size() == 1) g.resize(t.size(), g[0]);
              return g == t;
            });
      }
    }
    // A BERT model's text settings (weights from before them carry none: the flags as given).
    if (auto it = f.metadata.find("lower_case"); it != f.metadata.end()) {
      KILN_CHECK(it->second == "true" || it->second == "false", weights, ": damaged metadata: lower_case is '",
                 it->second, "', not true or false");
      const bool trained = it->second == "true";
      const auto flag = [](bool on) { return on ? "--lower-case" : "--no-lower-case"; };
      KILN_CHECK(!c.was_given("lower-case") || c.lower_case == trained, flag(c.lower_case), ": ", weights,
                 " was trained with ", flag(trained), " (its ids come from that text)");
      c.lower_case = trained;
    }
    take_trained("seq_len", "--seq-len", c.was_given("seq-len"), c.seq_len, "a positive whole number", size, equal);
    if (c.task == "mlm")
      take_trained(
          "mask_prob", "--mask-prob", c.was_given("mask-prob"), c.mask_prob, "a number in (0, 1)",
          [](const std::string& v) {
            char* end = nullptr;
            const double p = std::strtod(v.c_str(), &end);
            KILN_CHECK(!v.empty() && end == v.c_str() + v.size() && p > 0 && p < 1, "not a probability");
            return p;
          },
          equal);
    task = make_task(c);
    if (auto it = f.metadata.find("vocab_fingerprint"); it != f.metadata.end()) {
      const std::string here = task.data_info.value("vocab_fingerprint", "");
      const auto meta = [&f](const char* k) {
        const auto m = f.metadata.find(k);
        return m == f.metadata.end() ? std::string("?") : m->second;
      };
      KILN_CHECK(here == it->second, "--vocab ", c.vocab, " (", task.data_info.value("vocab_size", int64_t(0)),
                 " tokens) is not the vocabulary ", weights, " was trained with (", meta("vocab"), ", ",
                 meta("vocab_size"), " tokens): the same text would give other ids");
    }
    // As kiln forward reads it: a BERT masked-LM file written from Python (kiln.save(model.state_dict()))
    // or by Hugging Face lists the tied decoder, loaded when it equals the word embeddings.
    nn::StateDict given = normalise_checkpoint_names(f.tensors, task.model->state_dict(), weights);
    drop_unused_heads(*task.model, given, weights, c.model, "kiln eval");
    io::check_weights(*task.model, given, weights);
    task.model->load_state_dict(given, /*strict=*/true);
  } catch (const Error& e) {
    std::fprintf(stderr, "kiln eval: error: %s\n", e.message().c_str());
    return 2;
  }
  // Which sequences a masked-LM evaluation scores: --text alone gives kiln train's held-out split.
  if (task.data_info.contains("eval_split")) {
    // --limit-eval cuts either to its first N: "all of" would then be false.
    const int64_t n = task.eval_data->size();
    const std::string first =
        c.limit_eval > 0 && c.limit_eval <= n ? " (the first " + std::to_string(n) + ": --limit-eval)" : "";
    std::fprintf(stderr, "kiln eval: scoring %s, %lld samples%s%s\n",
                 task.data_info["eval_split"].get<std::string>().c_str(), (long long)n, first.c_str(),
                 !c.text.empty() && !c.eval_text.empty() ? " (--text is not read)" : "");
  }
  const EvalResult r = evaluate(task, c);
  // An evaluation has no training set: the task's train side is the eval data, so its count would
  // only echo eval_samples (or, cut by another limit, contradict it).
  nlohmann::json data = task.data_info;
  data.erase("train_samples");
  nlohmann::json j = {{"model", c.model},
                      {"weights", weights},
                      {"amp", c.amp},
                      {"data", data},
                      {"test_loss", r.loss},
                      {"test_" + task.metric, r.accuracy},
                      {"test_samples", r.samples},
                      {"seconds", r.seconds}};
  // Masked-LM: the perplexity, exp of the mean loss over the masked tokens.
  if (task.terms) {
    j["test_scored_tokens"] = r.count;
    j["test_perplexity"] = std::exp(r.loss);
  }
  const std::string ppl = task.terms ? " perplexity " + perplexity_text(r.loss) : std::string();
  const std::string tokens = task.terms ? ", " + std::to_string(r.count) + " masked tokens" : std::string();
  std::printf("test %s %.2f%% loss %.4f%s (%lld samples%s, %.1f s)\n", task.metric.c_str(), 100.0 * r.accuracy, r.loss,
              ppl.c_str(), (long long)r.samples, tokens.c_str(), r.seconds);
  if (!c.out.empty()) io::write_file_atomic(c.out, io::dump_json(j, 2) + "\n");
  if (!std::isfinite(r.loss)) {
    std::fprintf(stderr, "kiln eval: error: the test loss is %s: %s gives non-finite outputs on this data\n",
                 std::isnan(r.loss) ? "NaN" : "infinite", weights.c_str());
    return 1;
  }
  return 0;
}

}  // namespace kiln::tools
