// `kiln train`, `kiln eval` and `kiln bench train`: the run configuration, the tasks (what a batch
// means for a model and how it is scored), and the training loop.
#pragma once
#include <CLI/CLI.hpp>
#include <algorithm>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "engine/dist.h"
#include "engine/nn.h"
#include "engine/optim.h"
#include "io/data.h"

namespace kiln::tools {

struct TrainConfig {
  // model and task
  std::string model = "resnet20";
  std::string task;  // classify | mlm (default: classify for ResNet, mlm for BERT)
  std::vector<std::string> sets;
  // data
  std::string data = "fashion-mnist";  // fashion-mnist | mnist (an MNIST-format directory via --data-dir)
  std::string data_dir;
  bool augment = true;
  int64_t image_size = 224;  // image folders
  // --mean / --std (image folders): the text given, one value or one per channel, comma-separated ("":
  // ImageNet's); read by normalisation_values.
  std::string norm_mean, norm_std;
  bool skip_bad_samples = false;
  int64_t limit_train = 0, limit_eval = 0;  // use only the first N samples (0: all)
  // text (BERT)
  std::vector<std::string> text, eval_text;  // masked-LM corpus files or directories
  std::string vocab, train_tsv, eval_tsv;
  int64_t seq_len = 128;
  double mask_prob = 0.15;
  bool lower_case = true;
  // Not a flag: the long names of the flags given, on the command line or by --config ("seq-len",
  // "lower-case" for --no-lower-case too), filled by apply_model_defaults: `kiln eval` takes the
  // weights' --image-size/--seq-len/--lower-case unless given, and validate refuses flags the run
  // would ignore.
  std::vector<std::string> given;
  bool was_given(const std::string& flag) const { return std::find(given.begin(), given.end(), flag) != given.end(); }
  std::vector<std::string> label_names;  // not a flag: fixed by a trained model's metadata in `kiln eval`
  // not a flag: `kiln eval`, where a classifier's labels may come from its weights and MNIST-format
  // data reads only its test files
  bool evaluating = false;
  // schedule of the run
  int64_t epochs = 1, batch = 128, max_steps = 0;
  int64_t accum_steps = 1;  // micro-batches per optimizer step
  // "" (the loader's batch is --batch), "auto" (the largest that fits, from the memory planner) or a
  // number dividing --batch; then --batch is split into micro-batches whose gradients accumulate,
  // and a step that runs out of memory is redone with half the micro-batch.
  std::string micro_batch;
  std::string memory_cap;  // CPU: the most bytes tensors may hold ("8GiB"), as a smaller machine would
  std::string optimizer = "sgd";
  double lr = 0.1, momentum = 0.9, weight_decay = 5e-4, label_smoothing = 0.0, clip_grad_norm = 0.0;
  bool nesterov = true;
  // AdamW and LAMB: the moments' decay rates, and the term added to the denominator (0: the
  // optimizer's own, adam_eps: 1e-8 for AdamW, 1e-6 for LAMB)
  std::vector<double> betas = {0.9, 0.999};
  double eps = 0;
  double adam_eps() const { return eps > 0 ? eps : optimizer == "lamb" ? 1e-6 : 1e-8; }
  std::string schedule = "cosine";
  int64_t warmup = -1;  // -1: 0 for ResNet, 6% of the steps for BERT
  // machine
  uint64_t seed = 0;
  int threads = 0;  // 0: KILN_NUM_THREADS or the CPUs available (available_cpus)
  int workers = 1;
  std::string device = "cpu";  // cpu | cuda | cuda:N | auto (a GPU when one is visible)
  Device resolved_device() const;
  int dist_timeout = 600;  // seconds a collective may take before the job is ended
  std::string amp = "off";  // off | fp16 | bf16: autocast dtype (fp16 adds dynamic loss scaling)
  bool channels_last = false;  // ResNet batches as channels_last (NHWC) tensors
  int zero = 0;                // 1: ZeRO stage 1, each rank keeps the optimizer state of 1/N of the parameters
  std::string recompute = "none";    // none | blocks: keep only each block's input, rerun it in backward
  double loss_scale = 65536.0;       // fp16: the initial loss scale
  int64_t loss_scale_window = 2000;  // fp16: clean steps before the scale doubles
  // output
  std::string out;
  // checkpoints
  int64_t save_every = 0;      // steps (0: off)
  double save_minutes = 0;     // (0: off)
  bool save_epochs = true;     // at the end of every epoch
  int64_t keep_last = 3;
  std::string resume;          // "", "auto" or a checkpoint path
  bool overwrite = false;      // a fresh run may replace the run already in `out`
  std::string mirror;          // a second directory for every completed checkpoint
  int64_t log_every = 50;
  bool tensorboard = true;        // TensorBoard event files beside metrics.jsonl
  std::string progress = "auto";  // auto | bar | lines
  std::string config_file;
  // Not a flag: the names of the required flags ("--out"), checked once --config is read.
  std::vector<std::string> required_flags;

  nlohmann::json to_json() const;
};

// Registers every flag of `kiln train` (and --config FILE, a JSON object of the same flags;
// flags on the command line win).
void add_train_flags(CLI::App& app, TrainConfig& c);
// Fills every flag of `app` not given on the command line from the JSON object in `path`; an
// unknown key, a bad value or a broken file is an error naming the file and the key.
void apply_json_config(CLI::App& app, const std::string& path);
// After `app` (kiln train's or kiln eval's) is parsed: applies --config (if given), checks the required
// flags (given on the command line or by the file) and applies the model's defaults. Errors are
// kiln::Error, each one line.
void finish_train_flags(CLI::App& app, TrainConfig& c);
// Defaults that depend on the model, for flags the user did not give: BERT trains with AdamW,
// lr 5e-4, weight decay 0.01 and a linear schedule; ResNet with the defaults above.
void apply_model_defaults(const CLI::App& app, TrainConfig& c);
// Flags of `kiln eval`: the model and data flags of train plus --weights, --out and --config (as train's).
void add_eval_flags(CLI::App& app, TrainConfig& c, std::string& weights);
// The checks that need no data: one message per problem, empty when the config is sound.
std::vector<std::string> validate(const TrainConfig& c);
// The values of --mean or --std (`flag`): one, or three (R,G,B), comma-separated, finite (a standard
// deviation above 0); an error naming the flag otherwise.
std::vector<double> normalisation_values(const char* flag, const std::string& text);
// The flags this run would not use (their long names, "seq-len") and why: validate refuses them when
// given, and a resume does not compare them with the checkpoint's (a run that an older Kiln started
// with such a flag, then dropped, resumes without it).
struct UnusedFlag {
  std::string flag, why;
};
std::vector<UnusedFlag> unused_flags(const TrainConfig& c);
// What of a training run `dir` holds ("checkpoints/ (2 checkpoints), metrics.jsonl (12 lines),
// model.safetensors"), or "" when none: what a fresh run there would replace.
std::string run_in_folder(const std::string& dir);

// What a batch means for a model, and how a prediction is scored.
struct StepResult {
  Tensor loss;     // mean over the batch's scored items
  Tensor correct;  // i64 0-dim, on the model's device: counted there, read only when logged
  int64_t count = 0;
};
struct Task {
  std::string name;    // "classify" or "mlm"
  std::string metric;  // "accuracy" or "mlm_accuracy"
  std::shared_ptr<nn::Module> model;
  std::shared_ptr<const io::Dataset> train_data, eval_data;
  std::function<StepResult(const io::Batch&)> step;  // forward + loss in the model's current mode
  nlohmann::json data_info;
  std::function<int64_t()> bad_samples;  // unreadable samples skipped so far (image folders), if it applies
  // The loss's terms in a batch where that is not the batch size (MLM: its masked tokens): micro-batches
  // of one step then weigh their mean losses by it, so the step's loss and gradient are the mean over
  // all its terms, as one batch would give.
  std::function<int64_t(const io::Batch&)> terms;
  std::vector<std::string> model_sets;   // the --set overrides the model was built with (the data's sizes
                                         // and the user's), for the memory planner
};
// Builds the task the config names (the first row of task_kinds() that takes it), its model moved
// to the run's device.
Task make_task(const TrainConfig& c);

// The safetensors metadata that travels with a run's weights, from its resolved config (what a
// checkpoint's state holds as "config"): model, task, a classifier's label names, an image folder's
// classes and image size, a BERT model's case setting, seq_len and vocabulary (name, size, fingerprint),
// so `kiln eval` makes the same ids at the same size. One function for model.safetensors, kiln ckpt
// export and consolidate: a file exported from a checkpoint evaluates as the run's own. A key the config
// lacks (an older or weights-only checkpoint) is left out. The "format" key is the caller's.
std::map<std::string, std::string> weights_metadata(const nlohmann::json& config);

// Name -> factory tables: a new task, data set or optimizer is one row (tools/tasks.cpp).
struct TaskKind {
  const char* name;                       // what `kiln train` prints: "classify/images", "mlm", ...
  bool (*takes)(const TrainConfig& c);    // whether this row builds the run `c` asks for
  Task (*make)(const TrainConfig& c);
};
const std::vector<TaskKind>& task_kinds();
// --data values (image data sets; BERT reads --text or --train-tsv instead).
const std::vector<std::string>& data_names();
struct OptimizerKind {
  const char* name;  // --optimizer
  std::unique_ptr<optim::Optimizer> (*make)(const TrainConfig& c, std::vector<optim::ParamGroup> groups);
};
const std::vector<OptimizerKind>& optimizer_kinds();
std::vector<std::string> optimizer_names();
// The optimizer --optimizer names over the model's parameters (no decay on biases and norms).
std::unique_ptr<optim::Optimizer> make_optimizer(const TrainConfig& c, nn::Module& m);
// The same over given groups (a ZeRO run's shards of them).
std::unique_ptr<optim::Optimizer> make_optimizer(const TrainConfig& c, std::vector<optim::ParamGroup> groups);

struct EvalResult {
  double loss = 0, accuracy = 0;
  int64_t count = 0;    // scored items: samples, or masked tokens for masked-LM
  int64_t samples = 0;  // the data set's samples (sequences, images) evaluated
  double seconds = 0;
};
// Runs the whole eval split once, in eval mode and without gradients. With several ranks each
// evaluates its share (every sample exactly once over all ranks) and the sums are combined.
EvalResult evaluate(Task& task, const TrainConfig& c, dist::Communicator* comm = nullptr);

// What a program hosting a run (the Python package's kiln.train) hooks into it. Empty: the command's
// behaviour.
struct TrainHooks {
  // Every metrics line as it is written to metrics.jsonl (rank 0).
  std::function<void(const nlohmann::json&)> on_metrics;
  // Asked after every step: true saves a checkpoint and stops, as SIGINT does.
  std::function<bool()> stop_requested;
  // Every error the run reports (also printed to stderr).
  std::function<void(const std::string&)> on_error;
  // A second SIGINT ends the process at once (the command's rule); false: it only repeats the stop
  // request (an interpreter hosting the run must survive it).
  bool exit_on_second_interrupt = true;
  // How the messages tell the user to continue a stopped run, in the caller's terms.
  std::string resume_hint = "--resume auto";
};
struct TrainOutcome {
  int stop_signal = 0;      // the signal that stopped the run early (SIGINT, SIGTERM, SIGHUP), or 0
  bool stop_asked = false;  // stop_requested() stopped it
  std::string saved;        // the checkpoint it saved on stopping (rank 0's, on every rank)
  bool finished = false;    // the run reached its end (not stopped, not failed)
  std::string summary;      // then summary.json's contents as JSON text (rank 0's, on every rank)
};
// One run at a time per process: a call while another thread's run is going is refused (an Error
// naming that thread), as runs share the default random generator and the signal handlers.
int run_train(const TrainConfig& c, const TrainHooks& hooks = {}, TrainOutcome* outcome = nullptr);
// `kiln vocab`: learn a WordPiece vocabulary from text.
struct VocabOptions {
  std::vector<std::string> text;
  int64_t size = 8000, min_frequency = 2;
  bool lower_case = true;
  std::string out;
  bool overwrite = false;  // replace an existing --out
};
void add_vocab_flags(CLI::App& app, VocabOptions& o);
int run_vocab(const VocabOptions& o);
// Text files named by the user: files as they are (one holding a NUL byte in its first 4 KiB is an
// error); a directory gives every text file in it and in its sub-directories, sorted by path:
// symbolic links to files are followed (a file reached twice is read once), links to directories
// are not; hidden entries and files holding NUL bytes, like fortune's .dat indexes, are skipped.
std::vector<std::string> expand_text_paths(const std::vector<std::string>& paths, const std::string& flag);
int run_eval(const TrainConfig& c, const std::string& weights);

// `kiln bench train`: median step time of full training steps on synthetic batches.
// One model's training step on a synthetic batch, as `kiln bench train` times it and `kiln plan`
// measures it: a ResNet on [batch, C, S, S] images (S: image_size, else 32 for the small-image
// ResNets and 224 for the ImageNet ones) with labels; BERT's masked LM on [batch, seq_len] token
// ids with 15% of the positions (rounded) through the vocabulary projection and the loss (a -cls
// name: sequence classification of the whole sequences). On meta
// (`dev`), the model and batch are built as shapes only. `sets` are --set overrides.
struct SyntheticStep {
  std::shared_ptr<nn::Module> model;
  std::function<Tensor()> loss;  // forward and loss of one batch
  std::string input;             // "128x3x32x32", "32x128 tokens"
  int64_t batch = 0;
  bool images = false;
};
SyntheticStep synthetic_step(const std::string& name, int64_t batch, int64_t seq_len, int64_t image_size,
                             int64_t in_channels, const std::vector<std::string>& sets, Device dev);

struct BenchTrainOptions {
  std::vector<std::string> models;
  int64_t batch = 0, seq_len = 128, steps = 10, warmup = 3, image_size = 0, in_channels = 0;
  int threads = 0;
  int64_t dist_timeout = 600;    // seconds a collective between ranks may take (as kiln train's)
  std::vector<std::string> amp;  // off | fp16 | bf16, each timed (default: off)
  std::string recompute = "none";  // none | blocks
  int zero = 0;                    // 1: ZeRO stage 1 over the ranks
  std::string device = "cpu";      // cpu | cuda | cuda:N
  std::string json;
};
void add_bench_train_flags(CLI::App& app, BenchTrainOptions& o);
// The autocast dtype of an --amp value: f16, bf16, or none for "off".
std::optional<DType> amp_dtype(const std::string& amp);
int run_bench_train(const BenchTrainOptions& o);

// `kiln bench scaling`: `kiln bench train` under `kiln launch` for 1..N ranks; throughput and
// efficiency against N x one rank.
struct BenchScalingOptions {
  std::string model = "resnet20";
  int64_t batch = 0, steps = 10, warmup = 3;
  int max_ranks = 2, threads_per_rank = 1, master_port = 29800;
  std::string json;
};
void add_bench_scaling_flags(CLI::App& app, BenchScalingOptions& o);
int run_bench_scaling(const BenchScalingOptions& o);

// `kiln bench memory`: peak memory and step time of `kiln bench train` for each model with and
// without --recompute blocks (one rank) and --zero 1 (against data parallel, `ranks` ranks): the
// memory saved in MiB and the time it costs in percent, with the planner's prediction beside the
// measured peak.
struct BenchMemoryOptions {
  std::vector<std::string> models;  // default: resnet50 (batch 8, 224x224) and bert-base (batch 2, seq 512)
  int64_t batch = 0, seq_len = 512, steps = 2, warmup = 1;
  int ranks = 2, master_port = 29850;
  std::string device = "cpu";  // cuda: one GPU per rank (the data-parallel rows need as many GPUs)
  std::string json;
};
void add_bench_memory_flags(CLI::App& app, BenchMemoryOptions& o);
int run_bench_memory(const BenchMemoryOptions& o);

}  // namespace kiln::tools
