// Checkpoints of a training run: what is saved (model, optimizer, RNG, loader position, the run's
// counters, the loss scaler and its config), where (OUT/checkpoints/step-N.kiln and a `latest` pointer), pruning
// to the last K, and a background mirror to a second location.
#pragma once
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <thread>

#include "engine/amp.h"
#include "engine/nn.h"
#include "engine/optim.h"
#include "engine/zero.h"
#include "io/checkpoint.h"

namespace kiln::io {

// The counters of a run that a resume restores, so it logs and ends exactly as the uninterrupted run.
// One optimizer step's numbers, summed over its micro-batches and over the ranks.
struct StepStats {
  double loss = 0;  // mean over the step's samples
  int64_t samples = 0, correct = 0, count = 0;
};
// The sums of one logging window (reset after each metrics line): losses, scored items and where
// the time went (seconds waiting for data, in forward+backward, in communication, in the optimizer).
struct WindowStats {
  double loss = 0, data_s = 0, fb_s = 0, opt_s = 0, comm_s = 0;
  int64_t steps = 0, samples = 0, correct = 0, count = 0;
  void add(const StepStats& s) {
    loss += s.loss;
    ++steps;
    samples += s.samples;
    correct += s.correct;
    count += s.count;
  }
  double mean_loss() const { return steps ? loss / double(steps) : 0.0; }
  double accuracy() const { return count ? double(correct) / double(count) : 0.0; }
  // The checkpoint's layout: [loss, data, fb, opt, steps, samples, correct, count]; comm apart.
  nlohmann::json to_json() const;
  static WindowStats from_json(const nlohmann::json& w, double comm_s);
};
// The sums of the current epoch, for the line printed at its end.
struct EpochStats {
  double loss = 0;
  int64_t correct = 0, count = 0;
  void add(const StepStats& s) {
    loss += s.loss;
    correct += s.correct;
    count += s.count;
  }
  nlohmann::json to_json() const { return {loss, correct, count}; }
  static EpochStats from_json(const nlohmann::json& e) { return {e.at(0), e.at(1), e.at(2)}; }
};

struct RunState {
  int64_t step = 0, epoch = 0, batch = 0;  // optimizer steps done; where the loader continues
  int64_t micro_batch = 0;                 // the loader's batch size that `batch` counts in (0: the config's --batch)
  WindowStats window;
  EpochStats epoch_sums;
  double train_seconds = 0;
  int64_t samples_seen = 0;
  nlohmann::json epochs_log = nlohmann::json::array();
  double last_eval_loss = 0, last_eval_accuracy = 0;
  int64_t last_eval_count = 0;
  amp::GradScalerState scaler;  // loss scaling of --amp fp16 (scale 1 when off)
  nlohmann::json rng_ranks = nlohmann::json::array();  // data parallel: [seed, offset] of every rank's generator
  nlohmann::json to_json() const;
  static RunState from_json(const nlohmann::json& j);
};

// OUT/checkpoints/step-<step, 9 digits>.kiln, written atomically, then `latest` updated atomically.
// Returns the checkpoint's path.
std::string save_run_checkpoint(const std::string& dir, const nn::Module& model, const optim::Optimizer& opt,
                                const RunState& run, const nlohmann::json& config);

// The optimizer state of a ZeRO run (dist::ZeroRedundancy): every rank's chunks as tensors made on
// demand, written as `optim-zero/<name>` in their order (each make() is a collective: the other
// ranks call theirs in the same order), and the layout, kept as the state's `zero` key.
struct ShardedOptimizerState {
  std::vector<std::pair<std::string, std::function<Tensor()>>> entries;
  nlohmann::json layout;
};
// A ZeRO layout as a checkpoint keeps it, and back (a malformed one is an error naming `what`).
nlohmann::json zero_layout_json(const dist::ZeroLayout& l);
dist::ZeroLayout zero_layout_from_json(const nlohmann::json& j, const std::string& what);
// The slot names ("exp_avg", ...) of a sharded checkpoint's optim-zero/ entries.
std::vector<std::string> zero_slots(const CheckpointReader& r);
// save_run_checkpoint with the optimizer's tensors from `sharded` instead of opt.state()'s.
std::string save_run_checkpoint(const std::string& dir, const nn::Module& model, const optim::Optimizer& opt,
                                const RunState& run, const nlohmann::json& config,
                                const ShardedOptimizerState& sharded);
// The checkpoint `latest` names in `dir`, else the newest step-*.kiln, or "" when there is none. The
// file is not opened (it may be damaged): find_intact_checkpoint reads and checks it.
std::string find_latest_checkpoint(const std::string& dir);
// The checkpoint --resume auto continues from: the first of the file `latest` names and then every
// step-*.kiln, newest first, whose every byte checks out (CheckpointReader and verify(): each tensor's
// CRC, so it reads each file it tries once). `skipped` names each damaged file tried before it and
// what is wrong ("<file>: <problem>"); `path` is "" when none is intact (or there is none).
struct IntactCheckpoint {
  std::string path;
  std::vector<std::string> skipped;
};
IntactCheckpoint find_intact_checkpoint(const std::string& dir);
// Deletes all but the newest `keep` step-*.kiln files in `dir`, and the temporary files Kiln's atomic
// writes leave there (step-*.kiln.tmp.<pid>, latest.tmp.<pid>); any other file is not Kiln's and stays.
void prune_checkpoints(const std::string& dir, int64_t keep);

struct LoadedRun {
  RunState run;
  nlohmann::json config;
  bool weights_only = false;  // made by `kiln ckpt import`: weights, no optimizer or progress
};
// Restores model, optimizer and the default RNG from `path`; names and shapes must match the
// model (a mismatch lists every difference).
//
// `local`, in a ZeRO run: this rank's optimizer tensors from the checkpoint (`zero`: its layout, null
// for an unsharded checkpoint, which `local` then splits into chunks itself). Without it a sharded
// checkpoint is an error that says how to go on (--zero 1, or `kiln ckpt consolidate`).
//
// `check_config`, for a training checkpoint: called with its config before anything is loaded (it
// throws to refuse another run's checkpoint before the model's weights are compared).
//
// `model_name`, the model the run builds (tools::trained_model_name of its --model and --task, not
// the --model text): weights that do not match, saved from another model (a weights-only checkpoint's
// config names it), are said to be that model's first ("X holds bert-tiny-mlm weights, not
// resnet20"), before the lists of missing and unexpected tensors. `same_model`, given the checkpoint's
// config, says whether its model, though named otherwise, is the run's (bert-tiny-cls's weights under
// --model bert-tiny --task classify): a mismatch there is the model's config, listed without the names.
using LocalOptimizerState = std::function<optim::OptimizerState(const CheckpointReader& r, const nlohmann::json& zero)>;
using ConfigCheck = std::function<void(const nlohmann::json& config)>;
using SameModel = std::function<bool(const nlohmann::json& config)>;
LoadedRun load_run_checkpoint(const std::string& path, nn::Module& model, optim::Optimizer* opt,
                              const LocalOptimizerState& local = {}, const ConfigCheck& check_config = {},
                              const std::string& model_name = {}, const SameModel& same_model = {});

// Config keys that change the numbers of a run, and what they made of the data (data_info's labels,
// classes, files, sample counts): a resume with any of them different is refused.
std::vector<std::string> config_differences(const nlohmann::json& saved, const nlohmann::json& now);

// The data_info keys config_differences compares (what the same flags made of the data: labels,
// classes, the files' contents, sample counts, the vocabulary, the shape, an image folder's mean and std); the ranks of
// one run compare them at its start too (kiln train).
std::span<const char* const> data_info_keys();

// `v` as text for a message: its JSON (a string bare, without quotes, when `bare`), cut after 150
// characters when longer than 160, naming its length.
std::string short_json(const nlohmann::json& v, bool bare = false);

// The absolute form of `path` as the file system resolves it, so one folder compares equal however it
// is written (relative, with `.`, `..`, `//`, a trailing `/`, through a link): every symbolic link
// among its parts followed, a dangling one too (to where it points), then links in its longest existing
// prefix (weakly_canonical of the absolute path), the rest normalised lexically.
std::string resolved_path(const std::string& path);

// The run a --mirror folder belongs to: DIR/kiln-mirror.json, {"out": its --out resolved, "host"},
// written by the first run that uses DIR, so that no other run deletes (--overwrite, pruning), replaces
// (`latest`) or resumes from its copies. Returns "" when DIR is the run's in `out` (claimed now if it
// had no owner), else the refusal naming the owner. The --out decides, not the host: a run restarted on
// another node of a shared file system keeps its mirror. A folder without the file (a mirror from
// before owners) is adopted unless one of its checkpoints' config names another --out (a relative one
// resolved from the current directory). A folder that cannot be written is left to the copies' own
// warnings: a mirror is never fatal. With `other_run`, another run's mirror is not refused here: its
// owner and the refusal are put there, for the caller to take the mirror over (take_over_mirror) once
// it has resumed from the mirror's checkpoints, or else refuse.
struct MirrorOwner {
  std::string out, host;  // the other run's --out (resolved) and host
  std::string refusal;    // the message that refuses this run the mirror
};
std::string claim_mirror(const std::string& dir, const std::string& out, MirrorOwner* other_run = nullptr);
// DIR becomes the run's in `out` (its kiln-mirror.json rewritten), said in one line on stderr: the run
// continues `from`'s checkpoints from the mirror (its own folder lost, moved, or named another way).
void take_over_mirror(const std::string& dir, const std::string& out, const MirrorOwner& from);

// Copies each completed checkpoint (and `latest`) to a second directory in a background thread,
// atomically there too; a failed copy is logged and retried with back-off, never fatal.
class CheckpointMirror {
 public:
  // `wait_s`: how long the end of the run waits for a copy under way that makes no progress.
  CheckpointMirror(std::string dir, int64_t keep, double wait_s = 60);
  // Finishes the queue (each copy still gets its retries) while the copies make progress: after a few
  // seconds it says what it waits for, and after `wait_s` without a chunk copied (a mount that stopped
  // answering blocks a write for good) it leaves with a warning that the mirror copy is incomplete.
  // The copying thread, which cannot be joined then, is detached: it owns what it uses (State), so
  // nothing it touches is freed under it, and it commits nothing after (a later run may own DIR).
  ~CheckpointMirror();
  void enqueue(const std::string& checkpoint_path);

 private:
  struct State;
  static void loop(const std::shared_ptr<State>& s);
  std::shared_ptr<State> s_;
  double wait_s_;
  std::thread thread_;
};

}  // namespace kiln::io
