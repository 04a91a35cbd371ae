// Training checkpoints on top of io/checkpoint: tensor names "model/<state dict name>" and
// "optim/<optimizer slot>", and a state object {kind, run, rng, optimizer, config}.
#include "io/run_checkpoint.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include "engine/random.h"
#include "io/atomic_file.h"
#include "io/checkpoint.h"
#include "io/json_text.h"
#include "io/weights.h"
#include "kiln_build_info.h"

namespace kiln::io {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {
// Typed reads of the state a checkpoint keeps, each error naming the field ("state.run.step is
// "3", expected an integer") instead of nlohmann's "type must be number, but is string".
std::string brief(const json& v) {
  std::string s = io::dump_json(v);
  return s.size() > 40 ? s.substr(0, 40) + "..." : s;
}
const json& need(const json& obj, const char* key, const std::string& where) {
  KILN_CHECK(obj.is_object(), where, " is ", brief(obj), ", expected an object");
  auto it = obj.find(key);
  KILN_CHECK(it != obj.end(), where, ".", key, " is missing");
  return *it;
}
const json& item(const json& arr, size_t i, const std::string& where) {
  KILN_CHECK(arr.is_array() && i < arr.size(), where, " is ", brief(arr), ", expected an array of at least ", i + 1,
             " numbers");
  return arr[i];
}
int64_t as_int(const json& v, const std::string& name) {
  KILN_CHECK(v.is_number_integer() && !(v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX)), name,
             " is ", brief(v), ", expected an integer");
  return v.get<int64_t>();
}
uint64_t as_u64(const json& v, const std::string& name) {
  KILN_CHECK(v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0), name, " is ", brief(v),
             ", expected an integer >= 0");
  return v.get<uint64_t>();
}
double as_num(const json& v, const std::string& name) {
  KILN_CHECK(v.is_number(), name, " is ", brief(v), ", expected a number");
  return v.get<double>();
}
}  // namespace

json WindowStats::to_json() const { return {loss, data_s, fb_s, opt_s, steps, samples, correct, count}; }
WindowStats WindowStats::from_json(const json& w, double comm) {
  const std::string at = "state.run.window";
  auto n = [&](size_t i) { return as_num(item(w, i, at), at + "[" + std::to_string(i) + "]"); };
  auto c = [&](size_t i) { return as_int(item(w, i, at), at + "[" + std::to_string(i) + "]"); };
  WindowStats s;
  s.loss = n(0);
  s.data_s = n(1);
  s.fb_s = n(2);
  s.opt_s = n(3);
  s.comm_s = comm;
  s.steps = c(4);
  s.samples = c(5);
  s.correct = c(6);
  s.count = c(7);
  return s;
}

json RunState::to_json() const {
  return {
      {"step", step},
      {"epoch", epoch},
      {"batch", batch},
      {"micro_batch", micro_batch},
      {"window", window.to_json()},
      {"window_comm", window.comm_s},
      {"rng_ranks", rng_ranks},
      {"epoch_sums", epoch_sums.to_json()},
      {"train_seconds", train_seconds},
      {"samples_seen", samples_seen},
      {"epochs_log", epochs_log},
      {"last_eval", {last_eval_loss, last_eval_accuracy, last_eval_count}},
      {"scaler", {{"scale", scaler.scale}, {"growth_tracker", scaler.growth_tracker}, {"skipped", scaler.skipped}}}};
}

RunState RunState::from_json(const json& j) {
  const std::string at = "state.run";
  auto i64 = [&](const char* k) { return as_int(need(j, k, at), at + "." + k); };
  auto num = [&](const char* k) { return as_num(need(j, k, at), at + "." + k); };
  RunState r;
  r.step = i64("step");
  r.epoch = i64("epoch");
  r.batch = i64("batch");
  r.micro_batch = j.contains("micro_batch") ? i64("micro_batch") : 0;
  r.window = WindowStats::from_json(need(j, "window", at), j.contains("window_comm") ? num("window_comm") : 0.0);
  r.rng_ranks = j.value("rng_ranks", json::array());
  const json& e = need(j, "epoch_sums", at);
  r.epoch_sums = {as_num(item(e, 0, at + ".epoch_sums"), at + ".epoch_sums[0]"),
                  as_int(item(e, 1, at + ".epoch_sums"), at + ".epoch_sums[1]"),
                  as_int(item(e, 2, at + ".epoch_sums"), at + ".epoch_sums[2]")};
  r.train_seconds = num("train_seconds");
  r.samples_seen = i64("samples_seen");
  r.epochs_log = need(j, "epochs_log", at);
  const json& l = need(j, "last_eval", at);
  r.last_eval_loss = as_num(item(l, 0, at + ".last_eval"), at + ".last_eval[0]");
  r.last_eval_accuracy = as_num(item(l, 1, at + ".last_eval"), at + ".last_eval[1]");
  r.last_eval_count = as_int(item(l, 2, at + ".last_eval"), at + ".last_eval[2]");
  if (j.contains("scaler")) {  // checkpoints written before mixed precision have none: scale 1
    const json& s = j.at("scaler");
    r.scaler = {as_num(need(s, "scale", at + ".scaler"), at + ".scaler.scale"),
                as_int(need(s, "growth_tracker", at + ".scaler"), at + ".scaler.growth_tracker"),
                as_int(need(s, "skipped", at + ".scaler"), at + ".scaler.skipped")};
  } else {
    r.scaler = {1.0, 0, 0};
  }
  return r;
}

json zero_layout_json(const dist::ZeroLayout& l) {
  json buckets = json::array();
  for (const auto& b : l.buckets) {
    json params = json::array();
    for (const auto& e : b.params) params.push_back({e.name, e.group, e.index, e.offset, e.numel});
    buckets.push_back({{"chunk", b.chunk}, {"params", params}});
  }
  return {{"world_size", l.world_size}, {"buckets", buckets}};
}

dist::ZeroLayout zero_layout_from_json(const json& j, const std::string& what) {
  try {
    dist::ZeroLayout l;
    l.world_size = j.at("world_size").get<int>();
    for (const auto& b : j.at("buckets")) {
      dist::ZeroLayout::Bucket& lb = l.buckets.emplace_back();
      lb.chunk = b.at("chunk").get<int64_t>();
      for (const auto& e : b.at("params"))
        lb.params.push_back({e.at(0).get<std::string>(), e.at(1).get<size_t>(), e.at(2).get<size_t>(),
                             e.at(3).get<int64_t>(), e.at(4).get<int64_t>()});
    }
    return l;
  } catch (const json::exception& e) {
    KILN_FAIL(what, ": the sharded optimizer's layout (state key 'zero') is malformed: ", e.what());
  }
}

std::vector<std::string> zero_slots(const CheckpointReader& r) {
  std::set<std::string> slots;
  for (const auto& e : r.entries())
    if (e.name.rfind("optim-zero/zero.", 0) == 0) {
      const size_t dot = e.name.find('.', 16);
      if (dot != std::string::npos) slots.insert(e.name.substr(dot + 1));
    }
  return {slots.begin(), slots.end()};
}

namespace {
// The optimizer scalars that describe its own parameters one by one: each group's size and the
// per-parameter step counts. A ZeRO optimizer's parameters are its rank's views of the buckets, so
// they do not go into (or come from) a checkpoint, whose other ranks and consolidated form have other
// views. Every view steps each step (ZeRO gives each a gradient): "steps" is each one's count.
void drop_per_view_scalars(std::map<std::string, double>& scalars) {
  for (auto it = scalars.begin(); it != scalars.end();) {
    const std::string& k = it->first;
    const bool per_view = (k.rfind("group", 0) == 0 && k.size() > 7 && k.compare(k.size() - 7, 7, ".params") == 0) ||
                          (!k.empty() && k[0] >= '0' && k[0] <= '9');
    it = per_view ? scalars.erase(it) : std::next(it);
  }
}

std::string save_run(const std::string& dir, const nn::Module& model, const optim::Optimizer& opt, const RunState& run,
                     const json& config, const ShardedOptimizerState* sharded) {
  fs::create_directories(dir);
  const nn::StateDict sd = model.state_dict();
  std::vector<std::pair<std::string, std::function<Tensor()>>> tensors;
  for (const auto& [n, t] : sd) tensors.emplace_back("model/" + n, [&t = t] { return t; });
  optim::OptimizerState os = opt.state();
  if (sharded) drop_per_view_scalars(os.scalars);  // rank 0's views' (consolidate counts the groups' own)
  if (sharded) {
    for (const auto& [n, make] : sharded->entries) tensors.emplace_back("optim-zero/" + n, make);
  } else {
    for (const auto& [n, t] : os.tensors) tensors.emplace_back("optim/" + n, [&t = t] { return t; });
  }
  const Generator& g = default_generator();
  json state = {{"kind", "training"},
                {"kiln_version", KILN_VERSION_STRING},
                {"run", run.to_json()},
                {"rng", {{"seed", g.seed}, {"offset", g.offset}}},
                {"optimizer", {{"name", opt.name()}, {"scalars", os.scalars}}},
                {"config", config}};
  if (sharded) state["zero"] = sharded->layout;
  char name[64];
  std::snprintf(name, sizeof name, "step-%09lld.kiln", (long long)run.step);
  const std::string path = (fs::path(dir) / name).string();
  io::save_checkpoint_lazy(path, tensors, io::dump_json(state));
  io::write_file_atomic((fs::path(dir) / "latest").string(), std::string(name) + "\n");
  return path;
}
}  // namespace

std::string save_run_checkpoint(const std::string& dir, const nn::Module& model, const optim::Optimizer& opt,
                                const RunState& run, const json& config) {
  return save_run(dir, model, opt, run, config, nullptr);
}

std::string save_run_checkpoint(const std::string& dir, const nn::Module& model, const optim::Optimizer& opt,
                                const RunState& run, const json& config, const ShardedOptimizerState& sharded) {
  return save_run(dir, model, opt, run, config, &sharded);
}

namespace {
std::vector<fs::path> step_files(const std::string& dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (e.is_regular_file() && n.rfind("step-", 0) == 0 && n.size() > 5 && n.compare(n.size() - 5, 5, ".kiln") == 0)
      out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}
}  // namespace

namespace {
// The checkpoint files of `dir` in the order --resume auto tries them: the one `latest` names (a run
// killed between writing a checkpoint and updating `latest` leaves a newer one: `latest` still
// wins, as it always has), then every step-*.kiln, newest first.
std::vector<std::string> checkpoint_candidates(const std::string& dir) {
  std::vector<std::string> out;
  std::ifstream f(fs::path(dir) / "latest");
  std::string name;
  if (f && std::getline(f, name) && !name.empty() && name.find('/') == std::string::npos &&
      fs::is_regular_file(fs::path(dir) / name))
    out.push_back((fs::path(dir) / name).string());
  auto files = step_files(dir);
  for (auto it = files.rbegin(); it != files.rend(); ++it)
    if (std::find(out.begin(), out.end(), it->string()) == out.end()) out.push_back(it->string());
  return out;
}
}  // namespace

std::string find_latest_checkpoint(const std::string& dir) {
  const auto files = checkpoint_candidates(dir);
  return files.empty() ? "" : files.front();
}

IntactCheckpoint find_intact_checkpoint(const std::string& dir) {
  IntactCheckpoint out;
  for (const std::string& path : checkpoint_candidates(dir)) {
    std::string problem;
    try {
      const io::CheckpointReader r(path);
      const auto problems = r.verify();
      if (!problems.empty()) problem = problems.front();
    } catch (const Error& e) {
      problem = e.message();
    }
    if (problem.empty()) {
      out.path = path;
      return out;
    }
    // The reader's messages begin with the path; the entry names it once.
    if (problem.rfind(path + ": ", 0) == 0) problem = problem.substr(path.size() + 2);
    out.skipped.push_back(path + ": " + problem);
  }
  return out;
}

namespace {
// A temporary file of Kiln's atomic writes (io/atomic_file.h) in a checkpoints folder:
// step-*.kiln.tmp.<pid> or latest.tmp.<pid>. A user's notes.tmp.txt is not one.
bool kiln_temp_file(const std::string& n) {
  const size_t at = n.rfind(".tmp.");
  if (at == std::string::npos || at + 5 == n.size()) return false;
  if (!std::all_of(n.begin() + std::ptrdiff_t(at) + 5, n.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return false;
  const std::string base = n.substr(0, at);
  return base == "latest" ||
         (base.rfind("step-", 0) == 0 && base.size() > 10 && base.compare(base.size() - 5, 5, ".kiln") == 0);
}
}  // namespace

void prune_checkpoints(const std::string& dir, int64_t keep) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (kiln_temp_file(e.path().filename().string())) fs::remove(e.path(), ec);
  if (keep <= 0) return;
  auto files = step_files(dir);
  for (size_t i = 0; i + size_t(keep) < files.size(); ++i) fs::remove(files[i], ec);
}

namespace {
// The counters of a run as a checkpoint holds them: none negative, the times and the loss scale
// finite. A damaged or hand-edited value is named with the file here, not met later as "LR
// schedule: negative step -5" or a run that trains 0 steps.
void check_run_state(const RunState& r, const std::string& path) {
  auto count = [&](const char* field, int64_t v) {
    KILN_CHECK(v >= 0, path, ": state.run.", field, " is ", v,
               ", a count that cannot be negative (the checkpoint is damaged or was edited)");
  };
  count("step", r.step);
  count("epoch", r.epoch);
  count("batch", r.batch);
  count("micro_batch", r.micro_batch);
  count("samples_seen", r.samples_seen);
  count("window[4] (steps)", r.window.steps);
  count("window[5] (samples)", r.window.samples);
  count("window[6] (correct)", r.window.correct);
  count("window[7] (count)", r.window.count);
  count("epoch_sums[1] (correct)", r.epoch_sums.correct);
  count("epoch_sums[2] (count)", r.epoch_sums.count);
  count("last_eval[2] (count)", r.last_eval_count);
  count("scaler.growth_tracker", r.scaler.growth_tracker);
  count("scaler.skipped", r.scaler.skipped);
  KILN_CHECK(std::isfinite(r.train_seconds) && r.train_seconds >= 0, path, ": state.run.train_seconds is ",
             r.train_seconds, ", expected a finite number of seconds >= 0 (the checkpoint is damaged or was edited)");
  KILN_CHECK(std::isfinite(r.scaler.scale) && r.scaler.scale > 0, path, ": state.run.scaler.scale is ", r.scaler.scale,
             ", expected a finite loss scale > 0 (the checkpoint is damaged or was edited)");
}
}  // namespace

LoadedRun load_run_checkpoint(const std::string& path, nn::Module& model, optim::Optimizer* opt,
                              const LocalOptimizerState& local, const ConfigCheck& check_config,
                              const std::string& model_name, const SameModel& same_model) {
  io::CheckpointReader r(path);
  json state = json::parse(r.state_json());
  LoadedRun out;
  // Reads of the state's fields; a wrong type or a missing field is an error naming the file and it.
  auto field = [&](auto&& read) {
    try {
      return read();
    } catch (const Error& e) {
      KILN_FAIL(path, ": ", e.message(), " (the checkpoint's state is damaged or was edited)");
    }
  };
  const std::string kind = field([&] {
    const json& k = state.contains("kind") ? state["kind"] : json("");
    KILN_CHECK(k.is_string(), "state.kind is ", brief(k), ", expected \"training\" or \"weights\"");
    return k.get<std::string>();
  });
  KILN_CHECK(kind == "training" || kind == "weights", path, ": not a training checkpoint (kind '", kind, "')");
  out.weights_only = kind == "weights";
  out.config = field([&] {
    const json c = state.value("config", json::object());
    KILN_CHECK(c.is_object(), "state.config is ", brief(c), ", expected an object of the run's flags");
    return c;
  });
  // Another run's checkpoint is named as such (another --model) before its weights are compared.
  if (check_config && !out.weights_only) check_config(out.config);
  // Model: every name, shape and dtype checked, all differences listed at once (each list cut short).
  nn::StateDict sd;
  std::set<std::string> model_names;
  std::map<std::string, StoredTensor> stored;
  for (const auto& e : r.entries())
    if (e.name.rfind("model/", 0) == 0) {
      model_names.insert(e.name.substr(6));
      stored[e.name.substr(6)] = {e.shape, e.dtype};
    }
  if (const auto lines = weights_mismatch(model.state_dict(), stored, false, "checkpoint"); !lines.empty()) {
    std::string msg;
    for (const auto& l : lines) msg += "\n  " + l;
    const json saved = out.config.value("model", json());
    if (!model_name.empty() && saved.is_string() && saved.get<std::string>() != model_name &&
        !(same_model && same_model(out.config)))
      KILN_FAIL(path, " holds ", saved.get<std::string>(), " weights, not ", model_name, ": they do not match:", msg);
    KILN_FAIL(path, " does not match the model:", msg);
  }
  for (const auto& n : model_names) sd[n] = r.read("model/" + n);
  model.load_state_dict(sd, /*strict=*/true);
  // The read copies go before the optimizer's state is read: held to the end, they made a resume
  // under the run's own --memory-cap pass it (the run itself never holds the weights twice).
  sd.clear();
  if (out.weights_only) return out;
  out.run = field([&] { return RunState::from_json(need(state, "run", "state")); });
  check_run_state(out.run, path);
  field([&] {
    const json& rng = need(state, "rng", "state");
    const uint64_t seed = as_u64(need(rng, "seed", "state.rng"), "state.rng.seed");
    const uint64_t offset = as_u64(need(rng, "offset", "state.rng"), "state.rng.offset");
    default_generator().seed = seed;
    default_generator().offset = offset;
    return 0;
  });
  if (opt) {
    optim::OptimizerState os;
    const std::string saved_with = field([&] {
      const json& o = need(state, "optimizer", "state");
      const json& name = need(o, "name", "state.optimizer");
      KILN_CHECK(name.is_string(), "state.optimizer.name is ", brief(name), ", expected a string");
      const json& scalars = need(o, "scalars", "state.optimizer");
      KILN_CHECK(scalars.is_object(), "state.optimizer.scalars is ", brief(scalars), ", expected an object");
      for (const auto& [k, v] : scalars.items()) os.scalars[k] = as_num(v, "state.optimizer.scalars." + k);
      return name.get<std::string>();
    });
    KILN_CHECK(saved_with == opt->name(), path, ": saved with optimizer ", saved_with, ", this run uses ", opt->name());
    const json zero = state.value("zero", json());
    if (local) {
      os.tensors = local(r, zero).tensors;
      // A sharded optimizer's parameters are this rank's views of the buckets, not the saved
      // optimizer's: its groups' sizes and per-parameter step counts (rank 0's, or the whole model's)
      // do not apply. Every view steps each step (ZeRO gives each a gradient), so "steps" is each one's.
      drop_per_view_scalars(os.scalars);
    } else {
      KILN_CHECK(zero.is_null(), path, ": its optimizer state is sharded over ", zero.value("world_size", 0),
                 " ranks (written with --zero 1): resume it with --zero 1 and as many ranks, or make it whole with "
                 "`kiln ckpt consolidate ",
                 path, " --out FILE`");
      for (const auto& e : r.entries())
        if (e.name.rfind("optim/", 0) == 0) os.tensors[e.name.substr(6)] = r.read(e.name);
    }
    // An optimizer with per-parameter state (SGD with momentum, AdamW, LAMB, RMSprop, Adagrad) has some after its first
    // step: a training checkpoint without any would resume from a fresh optimizer and silently not
    // continue the run.
    const auto steps = os.scalars.find("steps");
    const auto momentum = os.scalars.find("momentum");
    const bool keeps_state = opt->name() != "sgd" || (momentum != os.scalars.end() && momentum->second != 0);
    KILN_CHECK(!keeps_state || os.tensors.size() > 0 || steps == os.scalars.end() || steps->second == 0, path,
               ": a training checkpoint after ", steps->second, " ", opt->name(),
               " steps without the optimizer's state (no optim/ tensors): resuming would start ", opt->name(),
               "'s state from zero and not continue the run; to start a new run from its weights, `kiln ckpt export` "
               "them and `kiln ckpt import` the result");
    opt->load_state(os);
  }
  return out;
}

std::span<const char* const> data_info_keys() {
  static const char* const kKeys[] = {"labels",     "classes",           "contents", "train_samples", "corpus_tokens",
                                      "vocab_size", "vocab_fingerprint", "shape",    "mean",          "std"};
  return kKeys;
}

std::string short_json(const json& v, bool bare) {
  const std::string s = bare && v.is_string() ? v.get<std::string>() : io::dump_json(v);
  return s.size() > 160 ? s.substr(0, 150) + " ... (" + std::to_string(s.size()) + " characters)" : s;
}

std::vector<std::string> config_differences(const json& saved_given, const json& now_given) {
  // Compared as written: the checkpoint's config holds U+FFFD where a live string (a class folder's name,
  // a path) has a byte that is not UTF-8.
  const json saved = io::as_written(saved_given), now = io::as_written(now_given);
  // The data's paths (--data-dir, --text, --eval-text, --vocab, --train-tsv) are not compared: the
  // same files under another path (./txt, an absolute path, a copy) continue the run. What they hold
  // is, through data_info below (each file's size and CRC-32C, the vocabulary's fingerprint).
  // clang-format off
  static const char* kKeys[] = {"model", "task", "set", "data", "augment", "image_size", "limit_train",
                                "seq_len", "mask_prob", "lower_case",
                                "epochs", "batch", "accum_steps", "max_steps", "optimizer", "lr", "momentum", "nesterov", "betas", "eps",
                                "weight_decay", "label_smoothing", "clip_grad_norm", "schedule", "warmup", "seed",
                                "amp", "loss_scale_window", "world_size"};
  // clang-format on
  // Keys added after checkpoints were first written: a config without one ran with its default.
  // eps's depends on the optimizer: AdamW's 1e-8, LAMB's 1e-6 (SGD's config records AdamW's, unused).
  const json later = {{"amp", "off"}, {"loss_scale_window", 2000}, {"world_size", 1}, {"betas", {0.9, 0.999}}};
  const auto old_eps = [](const json& config) {
    return json(config.value("optimizer", json()) == "lamb" ? 1e-6 : 1e-8);
  };
  std::vector<std::string> out;
  for (const char* k : kKeys) {
    json a = saved.value(k, json()), b = now.value(k, json());
    if (later.contains(k)) {
      if (a.is_null()) a = later[k];
      if (b.is_null()) b = later[k];
    }
    if (std::string(k) == "eps") {
      if (a.is_null()) a = old_eps(saved);
      if (b.is_null()) b = old_eps(now);
    }
    if (a != b) out.push_back(std::string(k) + ": checkpoint " + io::dump_json(a) + ", now " + io::dump_json(b));
  }
  // What the same flags made of the data (label names and their order, classes, the files' contents,
  // sample counts, the vocabulary): data read another way (a newer version's rules, a changed file)
  // does not continue the run either. A key the checkpoint lacks (written by an older version) is not
  // compared; "files" (their paths) no longer is.
  const json saved_data = saved.value("data_info", json::object()), now_data = now.value("data_info", json::object());
  // A checkpoint without the contents (an older version's) is compared by the data's paths as it was
  // then, each path normalised (./x, x and its absolute path are one): nothing else tells its data.
  if (!saved_data.is_object() || !saved_data.contains("contents")) {
    const auto normal = [](const json& v) {
      const auto one = [](const json& p) {
        if (!p.is_string() || p.get<std::string>().empty()) return p;
        std::error_code ec;
        // Absolute first: weakly_canonical leaves a relative path whose first part does not exist as it is.
        const std::filesystem::path abs = std::filesystem::absolute(p.get<std::string>(), ec);
        const std::filesystem::path w = ec ? std::filesystem::path() : std::filesystem::weakly_canonical(abs, ec);
        std::string n = ec ? std::filesystem::path(p.get<std::string>()).lexically_normal().string() : w.string();
        while (n.size() > 1 && n.back() == '/') n.pop_back();  // data/ is data
        return json(n);
      };
      if (!v.is_array()) return one(v);
      json out = json::array();
      for (const json& p : v) out.push_back(one(p));
      return out;
    };
    for (const char* k : {"data_dir", "text", "eval_text", "vocab", "train_tsv"}) {
      const json a = saved.value(k, json()), b = now.value(k, json());
      if (normal(a) != normal(b))
        out.push_back(std::string(k) + ": checkpoint " + io::dump_json(a) + ", now " + io::dump_json(b) +
                      " (the checkpoint records no data contents, so its paths are compared)");
    }
  }
  if (saved_data.is_object() && now_data.is_object())
    for (const char* k : data_info_keys())
      if (saved_data.contains(k) && now_data.value(k, json()) != saved_data[k]) {
        const json &a = saved_data[k], b = now_data.value(k, json());
        std::string where;  // a long list's first difference, which the cut values may not show
        if (a.is_array() && b.is_array()) {
          size_t i = 0;
          while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
          where = " (first difference at entry " + std::to_string(i) + ": checkpoint " +
                  (i < a.size() ? short_json(a[i]) : "none") + ", now " + (i < b.size() ? short_json(b[i]) : "none") +
                  "; " + std::to_string(a.size()) + " and " + std::to_string(b.size()) + " entries)";
        }
        out.push_back(std::string("data ") + k + ": checkpoint " + short_json(a) + ", now " + short_json(b) + where);
      }
  return out;
}

// ---- mirror --------------------------------------------------------------------------------------

namespace {
// `p` (absolute) with every symbolic link among its parts replaced by its target, a relative target
// read from the link's folder, until none is left (40 at most, as the kernel's limit). weakly_canonical
// stops at the first part that does not exist, and a link whose target does not exist yet (a mirror
// folder a run is about to make) reads to it as a plain name: the link's own path, not where it points.
fs::path follow_links(fs::path p) {
  for (int hops = 0; hops < 40; ++hops) {
    fs::path done;
    bool followed = false;
    for (auto it = p.begin(); it != p.end() && !followed; ++it) {
      if (it->empty()) continue;  // "DIR/": a trailing separator
      const fs::path next = done / *it;
      std::error_code ec;
      if (fs::is_symlink(fs::symlink_status(next, ec))) {
        const fs::path target = fs::read_symlink(next, ec);
        if (ec) return p;
        fs::path rest;
        for (auto r = std::next(it); r != p.end(); ++r) rest /= *r;
        p = (target.is_absolute() ? target : done / target) / rest;
        followed = true;
      }
      done = next;
    }
    if (!followed) return p;
  }
  return p;  // a loop of links: left as it is, which weakly_canonical then keeps
}
}  // namespace

std::string resolved_path(const std::string& path) {
  std::error_code ec;
  // Absolute first: weakly_canonical leaves a relative path whose first part does not exist as it is.
  fs::path p = fs::absolute(path, ec);
  if (ec) p = fs::path(path);
  p = follow_links(p);
  fs::path w = fs::weakly_canonical(p, ec);
  if (ec) w = p;
  std::string s = w.lexically_normal().string();
  while (s.size() > 1 && s.back() == '/') s.pop_back();  // "DIR/" and "DIR/." are DIR
  return s;
}

namespace {
const char kMirrorOwner[] = "kiln-mirror.json";

std::string host_name() {
  char host[256] = "";
  if (::gethostname(host, sizeof host - 1) != 0) return "unknown";
  return host;
}

// `kept`: why the run in `other` keeps its mirror even from a rescue (its checkpoints, its live
// process); empty when a run resuming from the mirror's copies may take it over.
std::string not_ours(const std::string& dir, const std::string& other, const std::string& host, bool owner_file,
                     const std::string& kept) {
  const std::string release = owner_file ? "delete " + (fs::path(dir) / kMirrorOwner).string() + " if that run is gone"
                                         : "if that run is gone, move its step-*.kiln out of " + dir;
  std::string msg = "--mirror " + dir + " holds the checkpoints of the run in " + other + " (host " + host +
                    "): give each run its own mirror folder (" + release;
  if (kept.empty())
    msg += "; or continue that run here: --resume auto into an --out without checkpoints takes the mirror over)";
  else
    msg += "); it is not taken over, since " + kept;
  return msg;
}

// The bytes of s in lower-case hex: the owner file's "out_hex", the run's path exactly as it is on disk
// ("out" is written with U+FFFD for each byte that is not UTF-8, which names no folder and matches other
// such paths: $'run\xfe' and $'run\xff' both read "run\uFFFD").
std::string to_hex(const std::string& s) {
  static const char digits[] = "0123456789abcdef";
  std::string h;
  h.reserve(2 * s.size());
  for (const unsigned char c : s) {
    h += digits[c >> 4];
    h += digits[c & 15];
  }
  return h;
}

// The bytes `hex` spells (to_hex's inverse); false if it is not an even run of hex digits.
bool from_hex(const std::string& hex, std::string& out) {
  const auto digit = [](char c) {
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
  };
  if (hex.size() % 2 != 0) return false;
  std::string bytes;
  for (size_t i = 0; i < hex.size(); i += 2) {
    const int hi = digit(hex[i]), lo = digit(hex[i + 1]);
    if (hi < 0 || lo < 0) return false;
    bytes += char(hi << 4 | lo);
  }
  out = std::move(bytes);
  return true;
}

// A path read from a JSON file Kiln wrote that holds U+FFFD: a byte that was not UTF-8, or U+FFFD itself.
bool has_replacement(const std::string& s) { return s.find("\xef\xbf\xbd") != std::string::npos; }

// The owner file's content naming `me`: "out" as JSON can hold it, "out_hex" its exact bytes.
json owner_json(const std::string& me) { return {{"out", me}, {"out_hex", to_hex(me)}, {"host", host_name()}}; }

// DIR/kiln-mirror.json naming `me`, replacing what is there; false if it cannot be written.
bool write_owner(const fs::path& file, const std::string& me) {
  const json owner = owner_json(me);
  try {
    io::write_file_atomic(file.string(), io::dump_json(owner, 2) + "\n");
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

// Why the run in `out` still owns its mirror, or "" when it is gone: its folder, as seen from here,
// holds an intact checkpoint (damaged ones continue nothing), or another process holds its OUT/.lock,
// which kiln train flocks for as long as it runs (the pid it wrote there named).
std::string other_run_still_there(const std::string& out) {
  const std::string ckpt = find_intact_checkpoint(out + "/checkpoints").path;
  if (!ckpt.empty()) return "its folder " + out + " still holds the intact checkpoint " + ckpt;
  const int fd = ::open((out + "/.lock").c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  const bool held = ::flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK;
  char buf[32] = "";
  const ssize_t n = held ? ::pread(fd, buf, sizeof buf - 1, 0) : 0;
  ::close(fd);
  if (!held) return "";
  std::string pid = n > 0 ? std::string(buf, size_t(n)) : "";
  while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
  return "that run is running now (pid " + (pid.empty() ? std::string("unknown") : pid) + ", holding " + out +
         "/.lock)";
}
}  // namespace

std::string claim_mirror(const std::string& dir, const std::string& out, MirrorOwner* other_run) {
  const std::string me = resolved_path(out);
  const fs::path file = fs::path(dir) / kMirrorOwner;
  std::error_code ec;
  // Another run's mirror, which this run may take over (the caller decides once it has resumed), but
  // only while that run's folder, as seen from here, holds no checkpoint and no live run (its .lock
  // free): a run started with --resume auto into a new or misspelt --out must not take the mirror from
  // a run that still has its own checkpoints or is running.
  // `exact`: `other` is the path's own bytes (an owner file's out_hex, or a path with no U+FFFD); a
  // path read with U+FFFD names no folder, so whether its run is still there cannot be seen.
  const auto other_owner = [&](const std::string& other, const std::string& host, bool owner_file,
                               const std::string& host_said, bool exact) {
    if (!other_run) return not_ours(dir, other, host_said, owner_file, "");
    if (!exact)
      return not_ours(dir, other, host_said, owner_file,
                      "that path is not UTF-8 and is named with U+FFFD for its bad bytes (a " +
                          std::string(kMirrorOwner) +
                          " without \"out_hex\", or a checkpoint's config): whether that run's folder still holds "
                          "checkpoints, or the run is running, cannot be checked");
    if (const std::string kept = other_run_still_there(other); !kept.empty())
      return not_ours(dir, other, host_said, owner_file, kept);
    *other_run = MirrorOwner{other, host, not_ours(dir, other, host_said, owner_file, "")};
    return std::string();
  };
  for (int tries = 0; tries < 2; ++tries) {
    if (fs::exists(file, ec)) {
      json owner;
      try {
        std::ifstream f(file);
        std::stringstream text;
        text << f.rdbuf();
        owner = json::parse(text.str());
      } catch (const std::exception& e) {
        return file.string() + ": cannot read the mirror's owner (" + e.what() + "); if " + dir +
               " holds this run's copies, delete the file, and this run claims the folder";
      }
      std::string other = owner.is_object() ? owner.value("out", std::string()) : std::string();
      // "out_hex": the path's exact bytes, compared and checked as they are. An owner file without it
      // (an older Kiln's) names "out" as written: a path not UTF-8 has U+FFFD, which names no folder.
      const auto hex = owner.is_object() ? owner.find("out_hex") : owner.end();
      const bool exact = hex != owner.end() && hex->is_string() && from_hex(hex->get<std::string>(), other);
      // Without it the file is an older Kiln's, which could not write a path that is not UTF-8 (its dump
      // threw): its "out" is a UTF-8 path, this run's only if equal. A path matching it only once written
      // with U+FFFD (--out $'run\xff' against an owner "run\uFFFD") is another run's.
      if (other == me) return "";
      const std::string host = owner.is_object() ? owner.value("host", std::string("unknown")) : std::string("unknown");
      const std::string named = other.empty() ? "(none named)" : other;
      return other_owner(named, host, true, host, exact || !has_replacement(other));
    }
    // A mirror from before owners: its checkpoints' config names the run (a damaged copy names none).
    for (const fs::path& p : step_files(dir)) {
      std::string other;
      try {
        const json state = json::parse(CheckpointReader(p.string()).state_json());
        const json config = state.value("config", json::object());
        if (config.is_object() && config.contains("out") && config["out"].is_string())
          other = resolved_path(config["out"].get<std::string>());
      } catch (const std::exception&) {
      }
      if (!other.empty() && other != me && other != as_json_text(me))
        return other_owner(
            other, "unknown", false,
            "unknown: " + p.filename().string() + " names it, and " + dir + " has no " + kMirrorOwner + " yet",
            !has_replacement(other));
    }
    // Claimed by a hard link of a complete file: of two runs claiming at once, one link fails (EEXIST),
    // and that run reads the winner's file on the second pass.
    const json owner = owner_json(me);
    const std::string tmp = file.string() + ".tmp." + std::to_string(::getpid());
    fs::create_directories(dir, ec);
    {
      // Not writable (a mount down, no permission): never fatal, as the copies are not, but said, since
      // the folder stays unclaimed until a copy succeeds (the copies' own config then names this run).
      errno = 0;
      std::ofstream f(tmp, std::ios::trunc);
      f << io::dump_json(owner, 2) << "\n";
      if (!f.flush()) {
        const int err = errno;
        fs::remove(tmp, ec);
        std::fprintf(stderr,
                     "kiln train: warning: --mirror %s: cannot write %s (%s), the file that records which run the "
                     "mirror belongs to: the run goes on, and its copies to the mirror try again\n",
                     dir.c_str(), file.c_str(), err ? std::strerror(err) : "write failed");
        return "";
      }
    }
    const int linked = ::link(tmp.c_str(), file.c_str());
    const int err = errno;
    if (linked != 0 && err != EEXIST) fs::rename(tmp, file, ec);  // a file system without hard links
    fs::remove(tmp, ec);
    if (linked == 0 || err != EEXIST) return "";
  }
  return "";
}

void take_over_mirror(const std::string& dir, const std::string& out, const MirrorOwner& from) {
  std::fprintf(stderr,
               "kiln train: --mirror %s: taking it over from the run in %s (host %s): this run resumes from its "
               "checkpoints\n",
               dir.c_str(), from.out.c_str(), from.host.c_str());
  write_owner(fs::path(dir) / kMirrorOwner, resolved_path(out));  // not writable: the copies will say so
}

struct CheckpointMirror::State {
  std::string dir;
  int64_t keep;
  std::mutex m;
  std::condition_variable cv;
  std::deque<std::string> queue;
  std::string copying;     // the checkpoint being copied now
  bool stop = false;       // the run is over: finish the queue
  bool done = false;       // the thread has nothing left to do
  bool abandoned = false;  // the run left without it: copy nothing more, say nothing
  uint64_t progress = 0;   // chunks copied so far: the end of the run waits while this grows
};

CheckpointMirror::CheckpointMirror(std::string dir, int64_t keep, double wait_s)
    : s_(std::make_shared<State>()), wait_s_(wait_s) {
  s_->dir = std::move(dir);
  s_->keep = keep;
  thread_ = std::thread([s = s_] { loop(s); });
}

CheckpointMirror::~CheckpointMirror() {
  std::unique_lock<std::mutex> lk(s_->m);
  s_->stop = true;
  s_->cv.notify_all();
  using Seconds = std::chrono::duration<double>;
  const auto start = std::chrono::steady_clock::now();
  const auto finished = [&] { return s_->done; };
  if (!s_->cv.wait_until(lk, start + Seconds(std::min(5.0, wait_s_ / 2)), finished)) {
    const std::string what = !s_->copying.empty() ? s_->copying
                             : !s_->queue.empty() ? s_->queue.front()
                                                  : std::string("the last checkpoint");
    std::fprintf(stderr, "kiln train: waiting for the mirror copy of %s to %s (Ctrl-C to leave it)\n", what.c_str(),
                 s_->dir.c_str());
    // A slow copy that goes on (a multi-GB checkpoint over a slow link) is waited for: only wait_s_
    // without a chunk copied gives up.
    auto since = start;
    uint64_t seen = s_->progress;
    while (!s_->cv.wait_until(lk, since + Seconds(wait_s_), finished)) {
      if (s_->progress != seen) {
        seen = s_->progress;
        since = std::chrono::steady_clock::now();
        continue;
      }
      s_->abandoned = true;
      const std::string now = !s_->copying.empty() ? s_->copying : what;
      std::fprintf(stderr,
                   "kiln train: warning: mirror: %s made no progress for %g s: the mirror copy of %s is incomplete "
                   "(the checkpoint in the run directory is intact; KILN_MIRROR_WAIT sets how long to wait)\n",
                   s_->dir.c_str(), wait_s_, now.c_str());
      lk.unlock();
      thread_.detach();  // blocked in the file system: it holds its own State, and ends with the process
      return;
    }
  }
  lk.unlock();
  thread_.join();
}

void CheckpointMirror::enqueue(const std::string& checkpoint_path) {
  {
    std::lock_guard<std::mutex> lk(s_->m);
    s_->queue.push_back(checkpoint_path);
  }
  s_->cv.notify_all();
}

void CheckpointMirror::loop(const std::shared_ptr<State>& s) {
  for (;;) {
    std::string src;
    {
      std::unique_lock<std::mutex> lk(s->m);
      s->copying.clear();
      s->cv.wait(lk, [&] { return s->stop || !s->queue.empty(); });
      if (s->queue.empty() || s->abandoned) {
        s->done = true;
        s->cv.notify_all();
        return;
      }
      // The mirror keeps the newest --keep-last: copies that would be pruned at once are not made
      // (--keep-last may already have deleted their source).
      while (s->keep > 0 && int64_t(s->queue.size()) > s->keep) s->queue.pop_front();
      src = s->queue.front();
      s->queue.pop_front();
      s->copying = fs::path(src).filename().string();
    }
    const std::string name = fs::path(src).filename().string();
    const std::string& dir = s->dir;
    for (int attempt = 1;; ++attempt) {
      try {
        fs::create_directories(dir);
        std::ifstream in(src, std::ios::binary);
        KILN_CHECK(in.good(), src, ": cannot open to mirror it (", std::strerror(errno), ")");
        io::AtomicFile out((fs::path(dir) / name).string());
        std::vector<char> buf(size_t(8) << 20);
        while (in) {
          in.read(buf.data(), std::streamsize(buf.size()));
          if (in.gcount() > 0) out.write(buf.data(), size_t(in.gcount()));
          std::lock_guard<std::mutex> lk(s->m);
          ++s->progress;
        }
        KILN_CHECK(in.eof(), src, ": read failed while mirroring");
        // A copy the run left behind (blocked past KILN_MIRROR_WAIT, then unblocked) neither commits nor
        // touches `latest` or prunes: the process may run another run by now (kiln.train again), whose
        // mirror this may be.
        const auto left_behind = [&] {
          std::lock_guard<std::mutex> lk(s->m);
          return s->abandoned;
        };
        if (left_behind()) break;
        out.commit();
        if (left_behind()) break;
        io::write_file_atomic((fs::path(dir) / "latest").string(), name + "\n");
        prune_checkpoints(dir, s->keep);
        break;
      } catch (const std::exception& e) {
        std::error_code ec;
        const bool there = fs::exists(src, ec);
        std::unique_lock<std::mutex> lk(s->m);
        if (s->abandoned) break;  // the run has left, and said so
        // Pruned from the run directory (--keep-last) while waiting, with a newer one queued: nothing lost.
        if (!there && !s->queue.empty()) break;
        const std::string where = there ? "; the checkpoint is still in the run directory"
                                        : "; the run directory no longer has it either (pruned by --keep-last?)";
        if (attempt >= 5) {
          std::fprintf(stderr, "kiln train: mirror: giving up on %s after %d attempts: %s%s\n", name.c_str(), attempt,
                       e.what(), where.c_str());
          break;
        }
        const int wait_s = 1 << (attempt - 1);
        if (s->stop && attempt >= 2) {  // the run is over: one retry, then leave
          std::fprintf(stderr, "kiln train: mirror: could not copy %s to %s (%s)%s\n", name.c_str(), dir.c_str(),
                       e.what(), where.c_str());
          break;
        }
        std::fprintf(stderr, "kiln train: mirror: copying %s to %s failed (%s); retrying in %d s\n", name.c_str(),
                     dir.c_str(), e.what(), wait_s);
        s->cv.wait_for(lk, std::chrono::seconds(wait_s), [&] { return s->stop; });
      }
    }
  }
}

}  // namespace kiln::io
