// Training checkpoints on top of io/checkpoint: tensor names "model/<state dict name>" and
// "optim/<optimizer slot>", and a state object {kind, run, rng, optimizer, config}.
#include "io/run_checkpoint.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "engine/random.h"
#include "io/atomic_file.h"
#include "io/checkpoint.h"
#include "io/weights.h"
#include "kiln_build_info.h"

namespace kiln::io {
namespace fs = std::filesystem;
using json = nlohmann::json;

json WindowStats::to_json() const { return {loss, data_s, fb_s, opt_s, steps, samples, correct, count}; }
WindowStats WindowStats::from_json(const json& w, double comm) {
  WindowStats s;
  s.loss = w.at(0);
  s.data_s = w.at(1);
  s.fb_s = w.at(2);
  s.opt_s = w.at(3);
  s.comm_s = comm;
  s.steps = w.at(4);
  s.samples = w.at(5);
  s.correct = w.at(6);
  s.count = w.at(7);
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
  RunState r;
  r.step = j.at("step");
  r.epoch = j.at("epoch");
  r.batch = j.at("batch");
  r.micro_batch = j.value("micro_batch", int64_t(0));
  r.window = WindowStats::from_json(j.at("window"), j.value("window_comm", 0.0));
  r.rng_ranks = j.value("rng_ranks", json::array());
  r.epoch_sums = EpochStats::from_json(j.at("epoch_sums"));
  r.train_seconds = j.at("train_seconds");
  r.samples_seen = j.at("samples_seen");
  r.epochs_log = j.at("epochs_log");
  const auto& l = j.at("last_eval");
  r.last_eval_loss = l.at(0);
  r.last_eval_accuracy = l.at(1);
  r.last_eval_count = l.at(2);
  if (j.contains("scaler")) {  // checkpoints written before mixed precision have none: scale 1
    const auto& s = j.at("scaler");
    r.scaler = {s.at("scale").get<double>(), s.at("growth_tracker").get<int64_t>(), s.at("skipped").get<int64_t>()};
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
std::string save_run(const std::string& dir, const nn::Module& model, const optim::Optimizer& opt, const RunState& run,
                     const json& config, const ShardedOptimizerState* sharded) {
  fs::create_directories(dir);
  const nn::StateDict sd = model.state_dict();
  std::vector<std::pair<std::string, std::function<Tensor()>>> tensors;
  for (const auto& [n, t] : sd) tensors.emplace_back("model/" + n, [&t = t] { return t; });
  const optim::OptimizerState os = opt.state();
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
  io::save_checkpoint_lazy(path, tensors, state.dump());
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

std::string find_latest_checkpoint(const std::string& dir) {
  std::ifstream f(fs::path(dir) / "latest");
  std::string name;
  if (f && std::getline(f, name) && !name.empty() && name.find('/') == std::string::npos &&
      fs::is_regular_file(fs::path(dir) / name))
    return (fs::path(dir) / name).string();
  // No pointer (or a stale one): the newest file that opens as a valid checkpoint.
  auto files = step_files(dir);
  for (auto it = files.rbegin(); it != files.rend(); ++it) {
    try {
      io::CheckpointReader r(it->string());
      return it->string();
    } catch (const Error&) {
    }
  }
  return "";
}

void prune_checkpoints(const std::string& dir, int64_t keep) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().filename().string().find(".tmp.") != std::string::npos) fs::remove(e.path(), ec);
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
                              const LocalOptimizerState& local) {
  io::CheckpointReader r(path);
  json state = json::parse(r.state_json());
  LoadedRun out;
  const std::string kind = state.value("kind", "");
  KILN_CHECK(kind == "training" || kind == "weights", path, ": not a training checkpoint (kind '", kind, "')");
  out.weights_only = kind == "weights";
  // Model: every name and shape checked, all differences listed at once.
  nn::StateDict sd;
  std::set<std::string> model_names;
  const nn::StateDict mine = model.state_dict();
  std::vector<std::string> problems;
  for (const auto& e : r.entries()) {
    if (e.name.rfind("model/", 0) != 0) continue;
    const std::string n = e.name.substr(6);
    model_names.insert(n);
    auto it = mine.find(n);
    if (it == mine.end()) problems.push_back("unexpected " + n + " " + dtype_name(e.dtype) + " " + [&] { std::ostringstream s; s << e.shape; return s.str(); }());
    else if (it->second.shape() != e.shape) {
      std::ostringstream s;
      s << "shape of " << n << ": checkpoint " << e.shape << ", model " << it->second.shape();
      problems.push_back(s.str());
    } else if (std::string p = dtype_problem(n, e.dtype, it->second.dtype()); !p.empty()) {
      problems.push_back(p);
    }
  }
  for (const auto& [n, t] : mine)
    if (!model_names.count(n)) {
      std::ostringstream s;
      s << "missing " << n << " " << t.shape();
      problems.push_back(s.str());
    }
  if (!problems.empty()) {
    std::string msg;
    for (const auto& p : problems) msg += "\n  " + p;
    KILN_FAIL(path, " does not match the model:", msg);
  }
  for (const auto& n : model_names) sd[n] = r.read("model/" + n);
  model.load_state_dict(sd, /*strict=*/true);
  out.config = state.value("config", json::object());
  if (out.weights_only) return out;
  out.run = RunState::from_json(state.at("run"));
  check_run_state(out.run, path);
  const auto& rng = state.at("rng");
  default_generator().seed = rng.at("seed").get<uint64_t>();
  default_generator().offset = rng.at("offset").get<uint64_t>();
  if (opt) {
    const json& o = state.at("optimizer");
    KILN_CHECK(o.at("name").get<std::string>() == opt->name(), path, ": saved with optimizer ",
               o.at("name").get<std::string>(), ", this run uses ", opt->name());
    optim::OptimizerState os;
    for (const auto& [k, v] : o.at("scalars").items()) os.scalars[k] = v.get<double>();
    const json zero = state.value("zero", json());
    if (local) {
      os.tensors = local(r, zero).tensors;
    } else {
      KILN_CHECK(zero.is_null(), path, ": its optimizer state is sharded over ", zero.value("world_size", 0),
                 " ranks (written with --zero 1): resume it with --zero 1 and as many ranks, or make it whole with "
                 "`kiln ckpt consolidate ",
                 path, " --out FILE`");
      for (const auto& e : r.entries())
        if (e.name.rfind("optim/", 0) == 0) os.tensors[e.name.substr(6)] = r.read(e.name);
    }
    // An optimizer with per-parameter state (SGD with momentum, AdamW, LAMB) has some after its first
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

std::vector<std::string> config_differences(const json& saved, const json& now) {
  static const char* kKeys[] = {"model", "task", "set", "data", "data_dir", "augment", "image_size", "limit_train",
                                "text", "eval_text", "vocab", "train_tsv", "seq_len", "mask_prob", "lower_case",
                                "epochs", "batch", "accum_steps", "max_steps", "optimizer", "lr", "momentum", "nesterov",
                                "weight_decay", "label_smoothing", "clip_grad_norm", "schedule", "warmup", "seed",
                                "amp", "loss_scale_window", "world_size"};
  // Keys added after checkpoints were first written: a config without one ran with its default.
  const json later = {{"amp", "off"}, {"loss_scale_window", 2000}, {"world_size", 1}};
  std::vector<std::string> out;
  for (const char* k : kKeys) {
    json a = saved.value(k, json()), b = now.value(k, json());
    if (later.contains(k)) {
      if (a.is_null()) a = later[k];
      if (b.is_null()) b = later[k];
    }
    if (a != b) out.push_back(std::string(k) + ": checkpoint " + a.dump() + ", now " + b.dump());
  }
  return out;
}

// ---- mirror --------------------------------------------------------------------------------------

CheckpointMirror::CheckpointMirror(std::string dir, int64_t keep) : dir_(std::move(dir)), keep_(keep) {
  thread_ = std::thread([this] { loop(); });
}

CheckpointMirror::~CheckpointMirror() {
  {
    std::lock_guard<std::mutex> lk(m_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void CheckpointMirror::enqueue(const std::string& checkpoint_path) {
  {
    std::lock_guard<std::mutex> lk(m_);
    queue_.push_back(checkpoint_path);
  }
  cv_.notify_all();
}

void CheckpointMirror::loop() {
  for (;;) {
    std::string src;
    {
      std::unique_lock<std::mutex> lk(m_);
      cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      src = queue_.front();
      queue_.pop_front();
    }
    const std::string name = fs::path(src).filename().string();
    for (int attempt = 1;; ++attempt) {
      try {
        fs::create_directories(dir_);
        std::ifstream in(src, std::ios::binary);
        KILN_CHECK(in.good(), src, ": cannot open to mirror it");
        io::AtomicFile out((fs::path(dir_) / name).string());
        std::vector<char> buf(size_t(8) << 20);
        while (in) {
          in.read(buf.data(), std::streamsize(buf.size()));
          if (in.gcount() > 0) out.write(buf.data(), size_t(in.gcount()));
        }
        KILN_CHECK(in.eof(), src, ": read failed while mirroring");
        out.commit();
        io::write_file_atomic((fs::path(dir_) / "latest").string(), name + "\n");
        prune_checkpoints(dir_, keep_);
        break;
      } catch (const std::exception& e) {
        if (attempt >= 5) {
          std::fprintf(stderr, "kiln train: mirror: giving up on %s after %d attempts: %s\n", name.c_str(), attempt,
                       e.what());
          break;
        }
        const int wait_s = 1 << (attempt - 1);
        std::unique_lock<std::mutex> lk(m_);
        if (stop_ && attempt >= 2) {  // the run is over: one retry, then leave
          std::fprintf(stderr, "kiln train: mirror: could not copy %s to %s (%s); the checkpoint is still in the run "
                       "directory\n", name.c_str(), dir_.c_str(), e.what());
          break;
        }
        std::fprintf(stderr, "kiln train: mirror: copying %s to %s failed (%s); retrying in %d s\n", name.c_str(),
                     dir_.c_str(), e.what(), wait_s);
        cv_.wait_for(lk, std::chrono::seconds(wait_s), [&] { return stop_; });
      }
    }
  }
}

}  // namespace kiln::io
