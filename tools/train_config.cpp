// The flags of `kiln train` and `kiln eval`, a JSON config file that supplies any of them, and the
// checks that reject an impossible run before any work starts.
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "engine/dist.h"
#include "engine/optim.h"
#include "io/json_parse.h"
#include "io/text.h"
#include "kernels/cuda/cuda_backend.h"
#include "tools/cli_checks.h"
#include "tools/environment.h"
#include "tools/plan.h"
#include "tools/train.h"
#include "tools/zoo.h"

namespace kiln::tools {
namespace {

void add_model_data_flags(CLI::App& app, TrainConfig& c) {
  // kiln eval takes these from the weights (kiln train's model.safetensors says what it holds).
  const std::string from_weights = c.evaluating ? "; kiln eval: default the weights' own, when they say it" : "";
  app.add_option("--model", c.model, "One of " + model_names_text() + from_weights)->capture_default_str();
  app.add_option("--task", c.task, "classify or mlm (default: classify for ResNet, mlm for BERT" + from_weights + ")")
      ->check(CLI::IsMember({"classify", "mlm"}));
  app.add_option("--set", c.sets, "Override a model config field, key=value (repeatable" + from_weights + ")");
  app.add_option("--data", c.data,
                 "fashion-mnist; mnist (an MNIST-format directory given by --data-dir); folder (--data-dir holds "
                 "train/ and val/, each with one sub-directory of .jpg/.png/.bmp/.ppm/.pgm images per class)")
      ->check(CLI::IsMember(data_names()))
      ->capture_default_str();
  app.add_option("--data-dir", c.data_dir, "Where the data set lives (default for fashion-mnist: Debian's package)");
  app.add_option("--image-size", c.image_size,
                 "Side of the images fed to the model (image folders; kiln eval: default the size the weights were "
                 "trained at)")
      ->check(at_least(1))
      ->capture_default_str();
  app.add_option("--mean", c.norm_mean,
                 "Image folders: the pixel mean to normalise with (of pixel / 255), R,G,B or one value (grey, or every "
                 "channel), as torchvision's Normalize (default ImageNet's 0.485,0.456,0.406; grey 0.449; kiln eval: "
                 "default the weights' own)");
  app.add_option("--std", c.norm_std,
                 "Image folders: the pixel standard deviation to divide by, as --mean (default ImageNet's "
                 "0.229,0.224,0.225; grey 0.226; kiln eval: default the weights' own)");
  app.add_flag("--skip-bad-samples", c.skip_bad_samples,
               "Leave unreadable images out (a warning naming each, once) and count them, instead of stopping");
  // Training-only flags are not kiln eval's at all (its --help does not list them, and giving one is
  // refused naming it): it would otherwise accept --memory-cap or --zero and silently not use them.
  if (!c.evaluating)
    app.add_option("--limit-train", c.limit_train,
                   "Use only N training samples (0: all): the first N; image folders: N spread over the classes")
        ->check(at_least(0));
  app.add_option("--limit-eval", c.limit_eval,
                 "Use only N evaluation samples (0: all): the first N; image folders: N spread over the classes")
      ->check(at_least(0));
  app.add_option("--text", c.text,
                 std::string("Masked-LM corpus: text files or directories of them, sub-directories included (links "
                             "to files followed; hidden and binary files skipped) (BERT --task mlm") +
                     (c.evaluating ? "; kiln eval scores its held-out split, every 50th sequence, as kiln train's "
                                     "test does: give --eval-text to score all of a file)"
                                   : ")"));
  app.add_option("--eval-text", c.eval_text,
                 c.evaluating ? "Masked-LM text to score, all of it (--text is then not read)"
                              : "Held-out masked-LM text (default: every 50th sequence of --text)");
  app.add_option("--vocab", c.vocab, "WordPiece vocab.txt (BERT; make one with `kiln vocab`)");
  app.add_option("--train-tsv", c.train_tsv,
                 "label<TAB>text training file, or one with a header line naming its 'label' and 'sentence' (or "
                 "'text') columns, or a sentence pair's two (GLUE's: sentence1/sentence2, question/sentence, "
                 "question1/question2, premise/hypothesis, #1 String/#2 String) (BERT --task classify); integer "
                 "labels are ordered numerically");
  app.add_option("--eval-tsv", c.eval_tsv, "Evaluation file, as --train-tsv (BERT --task classify)");
  app.add_option("--seq-len", c.seq_len,
                 "BERT sequence length (kiln eval: default the length the weights were trained at)")
      ->capture_default_str();
  // kiln eval's default is the weights' share, not 0.15: no default shown there.
  CLI::Option* mask_prob = app.add_option(
      "--mask-prob", c.mask_prob,
      "Share of tokens masked for masked-LM ([CLS], [SEP] and [UNK] never are); a sequence that drew "
      "none gets one, so the real share is higher on short sequences (16% for 15% on short texts at "
      "--seq-len 128, 24% at 8)" +
          std::string(c.evaluating ? "; kiln eval: default the share the weights were trained with" : ""));
  if (!c.evaluating) mask_prob->capture_default_str();
  add_on_off_flag(
      app, "--lower-case,!--no-lower-case", c.lower_case,
      std::string("Lower-case and strip accents before WordPiece (as BERT's uncased models; kiln eval: default as the "
                  "weights were trained, and the other is an error): ") +
          io::kLowerCaseScope);
  app.add_option("--batch", c.batch, "Batch size (default: 128; 32 for BERT models)");
  // kiln eval draws nothing (no initialisation, shuffling or dropout; a masked-LM evaluation's masks
  // are fixed) and runs on one process: a --seed or --dist-timeout given to it would do nothing.
  if (!c.evaluating)
    app.add_option("--seed", c.seed, "Seed of initialisation, shuffling, augmentation and dropout (0 to 2^64 - 1)")
        ->check(u64_number())
        ->capture_default_str();
  app.add_option("--threads", c.threads,
                 "CPU threads for the kernels (0: KILN_NUM_THREADS or the CPUs available; at most " +
                     std::to_string(max_threads()) +
                     ", the larger of 1024 and 4 x the CPUs: more only contend for the "
                     "cores, and each costs a stack and a slot of the process limit)")
      ->check(between(0, double(max_threads())));
  app.add_option("--workers", c.workers, "Data-loader threads (0: load on the training thread)")
      ->check(between(0, 64))
      ->capture_default_str();
  app.add_option("--device", c.device, "cpu, cuda, cuda:N, or auto (the GPU when one is visible)")->capture_default_str();
  if (!c.evaluating)
    app.add_option("--dist-timeout", c.dist_timeout,
                   "Seconds a collective between ranks may take before the job is ended with an error")
        ->check(at_least(1))
        ->capture_default_str();
  add_on_off_flag(app, "--channels-last,!--no-channels-last", c.channels_last,
                  "ResNet: feed batches as channels_last (NHWC) tensors, so every activation stays NHWC and cuDNN's "
                  "tensor-core convolutions need no layout transposes; on the CPU it only adds copies");
  if (!c.evaluating) {  // training-only, as --limit-train
    app.add_option("--micro-batch", c.micro_batch,
                   "auto, or a number dividing --batch: split each batch into micro-batches whose gradients "
                   "accumulate (auto: the largest that fits the memory, from the planner, `kiln plan`); a step that "
                   "runs out of memory is redone with half the micro-batch and twice the accumulation");
    app.add_option("--memory-cap", c.memory_cap,
                   "CPU: the most memory tensors may hold, e.g. 8GiB or 8GB (GiB: 2^30 bytes, GB: 10^9; an allocation "
                   "past it fails as on a full GPU; "
                   "--micro-batch auto plans for it)");
    app.add_option("--zero", c.zero,
                   "0, or 1: ZeRO stage 1 over the ranks (gradients reduce-scattered, each rank updates and keeps "
                   "the optimizer state of 1/N of the parameters, parameters all-gathered; sgd and adamw)")
        ->check(between(0, 1))
        ->capture_default_str();
    app.add_option("--recompute", c.recompute,
                   "Activation memory: none, or blocks (keep only each ResNet block's or BERT layer's input for "
                   "backward and run the block again there, with the same dropout masks: less memory, about one "
                   "more forward pass of time, the same gradients)")
        ->check(CLI::IsMember({"none", "blocks"}))
        ->capture_default_str();
  }
  app.add_option("--amp", c.amp,
                 "Mixed precision: off, fp16 (f16 GEMMs and convolutions, dynamic loss scaling) or bf16 (no scaling "
                 "needed); softmax, norms and losses stay f32, weights and optimizer f32")
      ->check(CLI::IsMember({"off", "fp16", "bf16"}))
      ->capture_default_str();
}

}  // namespace

// With several ranks on a machine (kiln launch, torchrun, mpirun), "cuda" and "auto" mean this
// rank's own GPU, cuda:LOCAL_RANK: one process per GPU.
Device TrainConfig::resolved_device() const {
  const int local = kiln::tools::dist_env().local_rank;
  if (device == "auto") return cuda::device_count() > 0 ? cuda_device(local % cuda::device_count()) : kCPU;
  if (device == "cuda" || device == "gpu") return cuda_device(local);
  return Device::parse(device);
}

namespace {

// --config FILE: a JSON object of the command's flags, read by finish_train_flags.
void add_config_flag(CLI::App& app, TrainConfig& c, const std::string& example) {
  app.add_option("--config", c.config_file, "A JSON object of flags (e.g. " + example + "); flags given here win")
      ->check(CLI::ExistingFile);
}

// A required flag may come from --config, which is read after the command line is parsed (CLI11
// checks required() while parsing): finish_train_flags checks these then. --help still says REQUIRED.
void defer_required_flags(CLI::App& app, TrainConfig& c) {
  for (CLI::Option* o : app.get_options())
    if (o->get_required()) {
      o->required(false)->option_text(o->get_type_name() + " REQUIRED");
      c.required_flags.push_back(o->get_name());
    }
}

}  // namespace

void add_train_flags(CLI::App& app, TrainConfig& c) {
  add_config_flag(app, c, "{\"epochs\": 5, \"lr\": 0.05}");
  add_model_data_flags(app, c);
  add_on_off_flag(
      app, "--augment,!--no-augment", c.augment,
      "Training-image augmentation: MNIST-format data, random crop (pad 2) and, for Fashion-MNIST, horizontal flip; "
      "image folders, random-resized crop (scale 0.08-1, aspect 3/4-4/3) and horizontal flip");
  app.add_option("--epochs", c.epochs, "Passes over the training set")->capture_default_str();
  app.add_option("--loss-scale", c.loss_scale, "--amp fp16: the initial loss scale")->capture_default_str();
  app.add_option("--loss-scale-window", c.loss_scale_window,
                 "--amp fp16: steps without inf/NaN gradients before the loss scale doubles")
      ->capture_default_str();
  app.add_option("--accum-steps", c.accum_steps,
                 "Micro-batches of --batch per optimizer step (gradient accumulation; the effective batch is K x B)")
      ->check(at_least(1))
      ->capture_default_str();
  app.add_option("--max-steps", c.max_steps, "Stop after this many optimizer steps (0: no limit)")->check(at_least(0));
  app.add_option("--optimizer", c.optimizer, "sgd, adamw or lamb (default: sgd; adamw for BERT models)")
      ->check(CLI::IsMember(optimizer_names()));
  app.add_option("--lr", c.lr, "Peak learning rate (default: 0.1; 5e-4 for BERT models)");
  app.add_option("--momentum", c.momentum, "SGD momentum")->capture_default_str();
  add_on_off_flag(app, "--nesterov,!--no-nesterov", c.nesterov, "Nesterov momentum for SGD");
  app.add_option("--betas", c.betas,
                 "AdamW and LAMB: the decay rates B1,B2 of the moment estimates, each in [0, 1) (as torch's betas)")
      ->delimiter(',')
      ->expected(2)
      ->capture_default_str();
  app.add_option("--eps", c.eps,
                 "AdamW and LAMB: the term added to the update's denominator, > 0 (default: 1e-8 for adamw, as "
                 "torch's AdamW; 1e-6 for lamb, as the LAMB paper's)");
  app.add_option("--weight-decay", c.weight_decay,
                 "Weight decay, not on biases and normalisation weights (default: 5e-4; 0.01 for BERT models)");
  app.add_option("--label-smoothing", c.label_smoothing, "Label smoothing of the classification loss, in [0, 1]")
      ->capture_default_str();
  app.add_option("--clip-grad-norm", c.clip_grad_norm,
                 "Clip gradients to this global L2 norm (0: off); the norm before clipping is logged as grad_norm")
      ->capture_default_str();
  std::vector<std::string> schedules;
  for (const auto& [name, kind] : optim::LrSchedule::kinds()) schedules.push_back(name);
  app.add_option("--schedule", c.schedule,
                 "LR schedule: constant, step, multistep, cosine, linear or polynomial (default: cosine; linear "
                 "for BERT models). Steps are optimizer steps; the run's total is epochs x steps per epoch, or "
                 "--max-steps if fewer (so --max-steps shortens the schedule). step: x0.1 every epoch's worth of "
                 "steps counted from the end of --warmup; multistep: x0.1 at 50% and again at 75% of the total, "
                 "counted from step 0 (warm-up included); cosine, linear, polynomial: from the lr at the end of "
                 "--warmup to 0 at the total")
      ->check(CLI::IsMember(schedules));
  app.add_option("--warmup", c.warmup, "Linear warmup steps (default: 0 for ResNet, 6% of the steps for BERT)")
      ->check(at_least(0));
  app.add_option("--out", c.out, "Run directory: metrics.jsonl, summary.json, model.safetensors")->required();
  app.add_option("--log-every", c.log_every, "Steps between metrics lines")->capture_default_str();
  add_on_off_flag(app, "--tensorboard,!--no-tensorboard", c.tensorboard,
                  "TensorBoard event files in --out beside metrics.jsonl (every number of its lines)");
  app.add_option("--save-every", c.save_every, "Checkpoint every N steps (0: off)")->check(at_least(0));
  app.add_option("--save-minutes", c.save_minutes, "Checkpoint every M minutes (0: off)")->check(at_least(0));
  add_on_off_flag(app, "--save-epochs,!--no-save-epochs", c.save_epochs, "Checkpoint at the end of every epoch");
  app.add_option("--keep-last", c.keep_last, "Checkpoints to keep (older ones are deleted; 0 keeps all)")
      ->check(at_least(0))
      ->capture_default_str();
  app.add_option("--resume", c.resume,
                 "auto (the newest intact checkpoint in OUT/checkpoints, else in --mirror; with none, a fresh start, "
                 "but an --out holding a run without one, e.g. one killed before its first checkpoint, is refused "
                 "unless --overwrite: restart loops use --resume auto --overwrite) or a checkpoint file")
      ->check(CLI::Validator(
          [](std::string& s) {  // `--resume ""` (an unset variable in a script) would start afresh unnoticed
            return s.empty() ? std::string("an empty path: give auto or a checkpoint file") : std::string();
          },
          "auto|FILE"));
  app.add_flag("--overwrite", c.overwrite,
               "Start a fresh run in an --out that already holds one (checkpoints, metrics.jsonl, "
               "model.safetensors), replacing it and deleting its checkpoints; without it such an --out is refused "
               "unless --resume continues the run");
  app.add_option("--mirror", c.mirror, "Copy every completed checkpoint here too, in the background");
  app.add_option("--progress", c.progress, "auto (a bar on a terminal, lines otherwise), bar or lines")
      ->check(CLI::IsMember({"auto", "bar", "lines"}))
      ->capture_default_str();
  defer_required_flags(app, c);
}

void add_eval_flags(CLI::App& app, TrainConfig& c, std::string& weights) {
  c.evaluating = true;
  add_config_flag(app, c, "{\"weights\": \"runs/r20/model.safetensors\", \"limit_eval\": 1000}");
  add_model_data_flags(app, c);
  app.add_option("--weights", weights, "Trained weights (safetensors, e.g. RUN/model.safetensors)")
      ->required()
      ->check(CLI::ExistingFile);
  app.add_option("--out", c.out, "Write the metrics to this JSON file too");
  defer_required_flags(app, c);
}

namespace {

// A true/false value of --config: JSON true/false, or as --set and --flag=VALUE take it, true/false
// (any case) or 1/0. CLI11 alone would also take "no", "off", 2 and -1 (as false).
std::optional<bool> config_bool(const nlohmann::json& v) {
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_number_integer() && (v == 0 || v == 1)) return v == 1;
  if (!v.is_string()) return std::nullopt;
  return strict_bool(v.get<std::string>());  // the command line's --flag=VALUE rule
}

}  // namespace

void apply_json_config(CLI::App& app, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  KILN_CHECK(in.good(), "--config ", path, ": cannot open");
  std::ostringstream text;
  text << in.rdbuf();
  // The whole file (`in >> j` read one value and ignored what followed it), each object's keys once
  // (a repeated one kept its last value silently); a UTF-8 byte order mark is skipped, as before.
  const nlohmann::json j = io::parse_json_file_text(text.str(), "--config " + path);
  KILN_CHECK(j.is_object(), "--config ", path, ": expected a JSON object of flag names and values");
  // The flags the command line gave (they win), and those this file set (two keys for one flag,
  // "augment" and "no_augment", would leave which one counts to the order of the keys).
  std::vector<const CLI::Option*> from_command_line, from_file;
  for (const CLI::Option* o : app.get_options())
    if (o->count() > 0) from_command_line.push_back(o);
  for (const auto& item : j.items()) {
    // Not a structured binding: clang 14 does not let the lambda below capture one.
    const std::string& key = item.key();
    const nlohmann::json& value = item.value();
    std::string name = key;
    for (char& ch : name)
      if (ch == '_') ch = '-';
    // Asking for help, or naming another config file, is the command line's business, not a run's flag.
    KILN_CHECK(name != "help" && name != "config" && name != "version", "--config ", path, ": '", key,
               "' is not a run flag (a config file holds the flags of `kiln ", app.get_name(), "`'s run)");
    CLI::Option* opt = app.get_option_no_throw("--" + name);
    const auto& lnames = opt ? opt->get_lnames() : std::vector<std::string>{};
    // A typo must not pass silently.
    KILN_CHECK(opt && std::find(lnames.begin(), lnames.end(), name) != lnames.end(), "--config ", path, ": '", key,
               "' is not a flag of `kiln ", app.get_name(), "`");
    const bool is_flag = opt->get_expected_max() == 0;
    // A negated name ("no_augment": true) means what --no-augment=true means on the command line, and
    // kiln.train(no_augment=True): the flag off.
    const bool negated = is_flag && opt->get_flag_value(name, "true") == "false";
    std::string positive = opt->get_single_name();
    for (char& ch : positive)
      if (ch == '-') ch = '_';
    KILN_CHECK(std::find(from_file.begin(), from_file.end(), opt) == from_file.end(), "--config ", path, ": '", key,
               "' sets '", positive, "' a second time (one key per flag)");
    from_file.push_back(opt);
    std::vector<std::string> inputs;
    if (is_flag) {
      const std::optional<bool> b = config_bool(value);
      KILN_CHECK(b.has_value(), "--config ", path, ": '", key, "' is true or false (or 1, 0), got ", value.dump());
      inputs.push_back(*b != negated ? "true" : "false");
    } else {
      auto str = [&](const nlohmann::json& x) -> std::string {
        if (x.is_string()) return x.get<std::string>();
        if (x.is_boolean()) return x.get<bool>() ? "true" : "false";
        if (x.is_number()) return x.dump();
        KILN_FAIL("--config ", path, ": the value of '", key,
                  "' must be a string, number, boolean or an array of them");
      };
      if (value.is_array() && (name == "mean" || name == "std")) {
        // One value on the command line, R,G,B: an array of numbers is joined with commas.
        std::string joined;
        for (const auto& e : value) {
          KILN_CHECK(e.is_number(), "--config ", path, ": '", key, "' takes a number or an array of numbers, got ",
                     value.dump());
          joined += (joined.empty() ? "" : ",") + e.dump();
        }
        KILN_CHECK(!joined.empty(), "--config ", path, ": '", key, "' gives no value (", value.dump(), ")");
        inputs.push_back(joined);
      } else if (value.is_array()) {
        for (const auto& e : value) inputs.push_back(str(e));
      } else if (value.is_object() && name == "set")  // {"in_channels": 1}, as kiln.train's set= dict
        for (const auto& f : value.items()) inputs.push_back(f.key() + "=" + str(f.value()));
      else
        inputs.push_back(str(value));
      // CLI11 would take an empty list as nothing given (and crash in the option's callback), and keep
      // the last of several for a one-value flag: both are a mistake in the file.
      const int least = std::max(1, opt->get_expected_min()), most = opt->get_expected_max();
      KILN_CHECK(int64_t(inputs.size()) >= least && int64_t(inputs.size()) <= most, "--config ", path, ": '", key,
                 "' takes ", most == 1 ? std::string("one value") : "at least " + std::to_string(least) + " value(s)",
                 ", got ", inputs.size(), " (", value.dump(), ")");
    }
    // The file's mistakes above are named even for a flag the command line gives (its value wins).
    if (std::find(from_command_line.begin(), from_command_line.end(), opt) != from_command_line.end())
      continue;  // given on the command line: that wins
    try {
      for (const auto& v : inputs) opt->add_result(v);
      opt->run_callback();
    } catch (const CLI::Error& e) {
      KILN_FAIL("--config ", path, ": '", key, "': ", e.what());
    }
  }
}

void finish_train_flags(CLI::App& app, TrainConfig& c) {
  if (!c.config_file.empty()) apply_json_config(app, c.config_file);
  for (const std::string& name : c.required_flags)
    KILN_CHECK(app.get_option(name)->count() > 0, name, " is required (on the command line or in --config)");
  apply_model_defaults(app, c);
}

std::string run_in_folder(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::vector<std::string> found;
  int64_t checkpoints = 0;
  for (const auto& e : fs::directory_iterator(fs::path(dir) / "checkpoints", ec)) {
    const std::string n = e.path().filename().string();
    checkpoints += n.rfind("step-", 0) == 0 && e.path().extension() == ".kiln";
  }
  if (checkpoints > 0)
    found.push_back("checkpoints/ (" + std::to_string(checkpoints) + " checkpoint" + (checkpoints > 1 ? "s" : "") +
                    ")");
  const fs::path metrics = fs::path(dir) / "metrics.jsonl";
  if (fs::is_regular_file(metrics, ec) && fs::file_size(metrics, ec) > 0) found.push_back("metrics.jsonl");
  for (const char* f : {"model.safetensors", "summary.json"})
    if (fs::exists(fs::path(dir) / f, ec)) found.push_back(f);
  std::string s;
  for (const auto& f : found) s += (s.empty() ? "" : ", ") + f;
  return s;
}

std::vector<UnusedFlag> unused_flags(const TrainConfig& c) {
  const ModelFamily* family = find_model_family(c.model);
  const bool images = family != nullptr && family->input == ModelInput::images;
  const bool tokens = family != nullptr && family->input == ModelInput::tokens;
  std::vector<UnusedFlag> out;
  auto unused = [&](std::initializer_list<const char*> flags, const std::string& why) {
    for (const char* f : flags) out.push_back({f, why});
  };
  if (images)
    unused({"seq-len", "mask-prob", "lower-case", "text", "eval-text", "vocab", "train-tsv", "eval-tsv"},
           "for BERT models; --model " + c.model + " reads images");
  if (images && c.data != "folder") {
    unused({"image-size", "skip-bad-samples"},
           "for image folders (--data folder); --data " + c.data + " reads its images at their own size");
    unused({"mean", "std"},
           "--mean/--std are for --data folder; MNIST and Fashion-MNIST normalise with their own fixed values "
           "(or use kiln.data.mnist_dir / fashion_mnist(mean=..., std=...) in Python)");
  }
  if (tokens)
    unused({"data", "data-dir", "image-size", "mean", "std", "augment", "skip-bad-samples"},
           "for ResNet models' images; --model " + c.model + " reads text");
  if (tokens && (c.task.empty() || c.task == "mlm"))
    unused({"train-tsv", "eval-tsv"}, "for --task classify; masked-LM reads --text");
  if (tokens && c.task == "classify")
    unused({"text", "eval-text", "mask-prob"}, "for --task mlm; classification reads --train-tsv and --eval-tsv");
  if (c.optimizer != "sgd")
    unused({"momentum", "nesterov"}, "for --optimizer sgd (" + c.optimizer + " keeps its own moment estimates)");
  else
    unused({"betas", "eps"}, "for --optimizer adamw or lamb (sgd keeps no moment estimates)");
  if (c.amp != "fp16")
    unused({"loss-scale", "loss-scale-window"},
           "the dynamic loss scale of --amp fp16 (--amp " + c.amp + " needs none: f32's exponent range)");
  return out;
}

std::vector<double> normalisation_values(const char* flag, const std::string& text) {
  const bool is_std = std::string(flag) == "--std";
  std::vector<double> out;
  size_t at = 0;
  for (;;) {
    const size_t comma = std::min(text.find(',', at), text.size());
    std::string v = text.substr(at, comma - at);
    v.erase(0, v.find_first_not_of(" \t"));
    v.erase(v.find_last_not_of(" \t") + 1);
    char* end = nullptr;
    errno = 0;
    const double x = v.empty() ? 0.0 : std::strtod(v.c_str(), &end);
    // strtod's ERANGE is an overflow (inf: not finite) or an underflow (a denormal or 0): such a value
    // is a number, but none a mean or std could be.
    KILN_CHECK(!(errno == ERANGE && std::isfinite(x) && *end == '\0'), flag, " '", text, "': ", v,
               " is too small: below the smallest normal double (", detail::str_cat(DBL_MIN), ")");
    KILN_CHECK(!v.empty() && *end == '\0' && errno == 0 && std::isfinite(x), flag, " '", text, "': '", v,
               "' is not a finite number (give one value, or one per channel: R,G,B)");
    KILN_CHECK(!is_std || x > 0, flag, " '", text, "': ", v,
               " is not above 0 (the pixels are divided by each standard deviation)");
    out.push_back(x);
    if (comma == text.size()) break;
    at = comma + 1;
  }
  KILN_CHECK(out.size() == 1 || out.size() == 3, flag, " '", text, "': ", out.size(),
             " values; give one (grey, or every channel) or three (R,G,B)");
  return out;
}

std::vector<std::string> validate(const TrainConfig& c) {
  std::vector<std::string> e;
  for (const auto& norm : {std::pair{"--mean", &c.norm_mean}, std::pair{"--std", &c.norm_std}}) {
    if (norm.second->empty()) {
      // Empty is the default's (ImageNet's values): given so, it would mean them silently.
      if (c.was_given(norm.first + 2))
        e.push_back(std::string(norm.first) +
                    ": an empty value; give one value or three (R,G,B), or leave the flag out for ImageNet's");
      continue;
    }
    try {
      normalisation_values(norm.first, *norm.second);
    } catch (const Error& err) {
      e.push_back(err.message());
    }
  }
  if (c.batch < 1) e.push_back("--batch must be at least 1, got " + std::to_string(c.batch));
  if (c.epochs < 1) e.push_back("--epochs must be at least 1, got " + std::to_string(c.epochs));
  // Written so that nan fails each test (every comparison with it is false) and inf the finite ones.
  // 0 is a frozen run (step-0 metrics, as torch's lr=0): no optimizer or schedule divides by the lr.
  if (!(c.lr >= 0 && std::isfinite(c.lr))) e.push_back("--lr must be >= 0 and finite, got " + std::to_string(c.lr));
  if (!(c.momentum >= 0 && c.momentum < 1))
    e.push_back("--momentum must be in [0, 1), got " + std::to_string(c.momentum));
  else if (c.optimizer == "sgd" && c.nesterov && c.momentum == 0)
    e.push_back(
        "--momentum 0 with Nesterov momentum (on by default for SGD): add --no-nesterov "
        "(kiln.train: nesterov=False), or give --momentum > 0");
  if (c.betas.size() != 2 || !(c.betas[0] >= 0 && c.betas[0] < 1 && c.betas[1] >= 0 && c.betas[1] < 1)) {
    std::string got;
    for (const double b : c.betas) got += (got.empty() ? "" : ",") + detail::str_cat(b);
    e.push_back("--betas must be two numbers B1,B2, each in [0, 1), got " + got);
  }
  // 0 would divide by sqrt(v_hat) alone (torch's AdamW allows it; LAMB's trust ratio does not): a
  // parameter whose gradient was 0 so far gets 0/0.
  if (c.was_given("eps") && !(c.eps > 0 && std::isfinite(c.eps)))
    e.push_back(detail::str_cat("--eps must be > 0 and finite, got ", c.eps));
  if (!(c.weight_decay >= 0 && std::isfinite(c.weight_decay)))
    e.push_back("--weight-decay must be >= 0 and finite, got " + std::to_string(c.weight_decay));
  // 1 included, as torch's cross_entropy (the target then uniform over the classes)
  if (!(c.label_smoothing >= 0 && c.label_smoothing <= 1))
    e.push_back("--label-smoothing must be in [0, 1], got " + std::to_string(c.label_smoothing));
  if (!(c.clip_grad_norm >= 0 && std::isfinite(c.clip_grad_norm)))
    e.push_back("--clip-grad-norm must be >= 0 and finite (0: off), got " + std::to_string(c.clip_grad_norm));
  if (!(c.save_minutes >= 0 && std::isfinite(c.save_minutes)))
    e.push_back("--save-minutes must be >= 0 and finite (0: off), got " + std::to_string(c.save_minutes));
  if (c.threads < 0 || c.threads > max_threads())
    e.push_back("--threads must be in 0.." + std::to_string(max_threads()) + ", got " + std::to_string(c.threads));
  if (!(c.loss_scale >= 0x1p-126 && c.loss_scale <= 3.4028234663852886e38))  // a normal f32: [FLT_MIN, FLT_MAX]
    e.push_back(detail::str_cat("--loss-scale must be a normal f32 value in [", 0x1p-126, ", ", 3.4028234663852886e38,
                                "], got ", c.loss_scale));
  if (c.loss_scale_window < 1)
    e.push_back("--loss-scale-window must be at least 1, got " + std::to_string(c.loss_scale_window));
  if (c.log_every < 1) e.push_back("--log-every must be at least 1, got " + std::to_string(c.log_every));
  if (c.device != "auto") {
    try {
      const Device d = Device::parse(c.device);
      if (d.is_meta())
        e.push_back(
            "--device meta: tensors with shapes and no values, for `kiln plan`; training and evaluation need "
            "values (cpu, cuda, cuda:N or auto)");
      else if (d.is_cuda() && !cuda::compiled())
        e.push_back("--device " + c.device + ": this build has no CUDA backend (rebuild with the CUDA toolkit, or use "
                    "--device cpu)");
      else if (d.is_cuda() && d.index >= cuda::device_count())
        e.push_back("--device " + c.device + ": " + std::to_string(cuda::device_count()) +
                    " CUDA device(s) visible (`kiln doctor` says why; --device cpu trains on the CPU)");
    } catch (const Error&) {  // (Device::parse's own message also offers meta, which trains nothing)
      e.push_back("--device " + c.device + ": unknown device (expected cpu, cuda, cuda:N or auto)");
    }
  }
  const ModelFamily* family = find_model_family(c.model);
  const bool images = family != nullptr && family->input == ModelInput::images;
  const bool tokens = family != nullptr && family->input == ModelInput::tokens;
  if (family == nullptr) e.push_back(unknown_model_message(c.model));
  if (!c.micro_batch.empty() && c.micro_batch != "auto") {
    int64_t m = 0;
    try {
      size_t used = 0;
      m = std::stoll(c.micro_batch, &used);
      if (used != c.micro_batch.size()) m = 0;
    } catch (const std::exception&) {
      m = 0;
    }
    if (m <= 0 || c.batch % m != 0)
      e.push_back("--micro-batch " + c.micro_batch + ": expected auto or a number dividing --batch " +
                  std::to_string(c.batch));
  }
  // The flag's own range before the batch's size is reckoned from it (0 divided by zero there, a
  // negative length gave a negative size).
  const bool seq_len_ok = !tokens || c.seq_len >= 8;
  if (!seq_len_ok) e.push_back("--seq-len must be at least 8, got " + std::to_string(c.seq_len));
  if (family != nullptr && c.batch >= 1 &&
      seq_len_ok) {  // the cap `kiln plan` has: past it a step's byte counts overflow
    PlanOptions po;
    po.model = c.model;
    po.sets = c.sets;
    po.seq_len = c.seq_len;
    try {
      check_batch_size(po, c.batch, "--batch");
    } catch (const Error& err) {
      e.push_back(err.message());
    }
  }
  if (!c.micro_batch.empty() && c.accum_steps > 1)
    e.push_back("--micro-batch with --accum-steps " + std::to_string(c.accum_steps) +
                ": --micro-batch splits --batch into accumulation steps itself (give the whole batch as --batch)");
  if (!c.memory_cap.empty()) {
    try {
      parse_bytes(c.memory_cap, "--memory-cap");
    } catch (const Error& err) {
      e.push_back(err.message());
    }
    if (c.device != "cpu")
      e.push_back("--memory-cap " + c.memory_cap +
                  ": caps CPU memory (--device cpu); a GPU's "
                  "own memory is its cap");
  }
  if (c.zero == 1 && c.optimizer == "lamb")
    e.push_back(
        "--zero 1: LAMB's trust ratio needs whole tensors, and ZeRO splits them over the ranks (use "
        "--optimizer adamw or sgd, or --zero 0)");
  if (!images && c.channels_last)
    e.push_back("--channels-last: only ResNets take image batches (--model " + c.model + ")");
  // A flag the run would not use is refused, not dropped: a user who sets --momentum for AdamW or
  // --seq-len for a ResNet believes the run uses it.
  // Without --task a BERT model trains masked-LM: a TSV file given there gets the fix ("add --task
  // classify") rather than "--task mlm needs --text". The task is not inferred from it: which task
  // runs (and which head kiln eval loads) should not hang on which data flags happen to be given.
  const bool train_tsv = c.was_given("train-tsv"), eval_tsv = c.was_given("eval-tsv");
  const bool tsv_without_task = tokens && c.task.empty() && (train_tsv || eval_tsv);
  for (const UnusedFlag& u : unused_flags(c))
    if (c.was_given(u.flag) && !(tsv_without_task && (u.flag == "train-tsv" || u.flag == "eval-tsv")))
      e.push_back("--" + u.flag + ": " + u.why);
  if (images && !c.task.empty() && c.task != "classify")
    e.push_back("--task " + c.task + ": a " + family->name + " classifies images (--task classify)");
  if (images && c.data == "mnist" && c.data_dir.empty())
    e.push_back("--data mnist needs --data-dir (an MNIST-format directory)");
  if (images && c.data == "folder" && c.data_dir.empty())
    e.push_back("--data folder needs --data-dir (a directory with train/ and val/ image folders)");
  if (tokens) {
    const std::string task = c.task.empty() ? "mlm" : c.task;
    if (c.vocab.empty()) e.push_back("--model " + c.model + " needs --vocab (make one: kiln vocab --text FILE --size 8000 --out vocab.txt)");
    if (tsv_without_task)
      e.push_back(std::string(train_tsv && eval_tsv ? "--train-tsv and --eval-tsv are"
                              : train_tsv           ? "--train-tsv is"
                                                    : "--eval-tsv is") +
                  " for --task classify: add --task classify (without --task, --model " + c.model +
                  " is masked-LM on --text)");
    else if (task == "mlm" && c.text.empty() && !(c.evaluating && !c.eval_text.empty()))
      e.push_back(c.evaluating ? "--task mlm needs --eval-text (scored whole) or --text (its held-out split: every "
                                 "50th sequence)"
                               : "--task mlm needs --text (a corpus: files or directories)");
    // kiln eval takes the label names from the weights (a run's model.safetensors carries them); it
    // reads --train-tsv for them only when they are not there.
    if (task == "classify" && c.evaluating && c.eval_tsv.empty())
      e.push_back("--task classify needs --eval-tsv (label<TAB>text lines)");
    else if (task == "classify" && !c.evaluating && (c.train_tsv.empty() || c.eval_tsv.empty()))
      e.push_back("--task classify needs --train-tsv and --eval-tsv (label<TAB>text lines)");
    if (task == "mlm" && c.label_smoothing != 0)
      e.push_back("--label-smoothing " + std::to_string(c.label_smoothing) +
                  ": applies to the classification loss (--task classify); masked-LM training does not smooth its "
                  "targets");
    if (!(c.mask_prob > 0 && c.mask_prob < 1)) e.push_back("--mask-prob must be in (0, 1), got " + std::to_string(c.mask_prob));
  }
  return e;
}

TrainConfig model_defaults(const std::string& model) {
  // Token models (BERT) train with the transformer recipe; image models keep the flags' defaults.
  TrainConfig d;
  const ModelFamily* family = find_model_family(model);
  if (family == nullptr || family->input != ModelInput::tokens) return d;
  d.optimizer = "adamw";
  d.lr = 5e-4;
  d.weight_decay = 0.01;
  d.schedule = "linear";
  d.batch = 32;
  return d;
}

void apply_model_defaults(const CLI::App& app, TrainConfig& c) {
  c.given.clear();
  for (const CLI::Option* o : app.get_options())
    if (o->count() > 0 && !o->get_lnames().empty()) c.given.push_back(o->get_lnames().front());
  const TrainConfig d = model_defaults(c.model);
  if (!c.was_given("optimizer")) c.optimizer = d.optimizer;
  if (!c.was_given("lr")) c.lr = d.lr;
  if (!c.was_given("weight-decay")) c.weight_decay = d.weight_decay;
  if (!c.was_given("schedule")) c.schedule = d.schedule;
  if (!c.was_given("batch")) c.batch = d.batch;
}

nlohmann::json TrainConfig::to_json() const {
  return {{"model", model},
          {"task", task.empty() ? "classify" : task},
          {"set", sets},
          {"data", data},
          {"data_dir", data_dir},
          {"augment", augment},
          {"image_size", image_size},
          {"mean", norm_mean},
          {"std", norm_std},
          {"skip_bad_samples", skip_bad_samples},
          {"limit_train", limit_train},
          {"limit_eval", limit_eval},
          {"text", text},
          {"eval_text", eval_text},
          {"vocab", vocab},
          {"train_tsv", train_tsv},
          {"eval_tsv", eval_tsv},
          {"seq_len", seq_len},
          {"mask_prob", mask_prob},
          {"lower_case", lower_case},
          {"epochs", epochs},
          {"batch", batch},
          {"accum_steps", accum_steps},
          {"max_steps", max_steps},
          {"optimizer", optimizer},
          {"lr", lr},
          {"momentum", momentum},
          {"nesterov", nesterov},
          {"betas", betas},
          {"eps", adam_eps()},
          {"weight_decay", weight_decay},
          {"label_smoothing", label_smoothing},
          {"clip_grad_norm", clip_grad_norm},
          {"schedule", schedule},
          {"warmup", warmup},
          {"seed", seed},
          {"threads", threads},
          {"workers", workers},
          {"device", device},
          {"amp", amp},
          {"channels_last", channels_last},
          {"recompute", recompute},
          {"zero", zero},
          {"micro_batch", micro_batch},
          {"memory_cap", memory_cap},
          {"loss_scale", loss_scale},
          {"loss_scale_window", loss_scale_window},
          {"out", out},
          {"log_every", log_every},
          {"save_every", save_every},
          {"save_minutes", save_minutes},
          {"keep_last", keep_last},
          {"mirror", mirror},
          {"tensorboard", tensorboard}};
}

std::optional<DType> amp_dtype(const std::string& amp) {
  if (amp == "fp16") return DType::f16;
  if (amp == "bf16") return DType::bf16;
  KILN_CHECK(amp == "off", "--amp ", amp, ": expected off, fp16 or bf16");
  return std::nullopt;
}

}  // namespace kiln::tools
