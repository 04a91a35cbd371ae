// `kiln ckpt inspect|verify|export|import|consolidate`: look into a checkpoint, check every byte of
// it, take its weights out as safetensors, make a weights-only checkpoint from safetensors trained
// elsewhere, or make a ZeRO run's sharded optimizer state whole again.
#include <cstdio>
#include <map>
#include <sstream>
#include <nlohmann/json.hpp>

#include <filesystem>

#include "engine/random.h"
#include "io/checkpoint.h"
#include "io/json_text.h"
#include "io/run_checkpoint.h"
#include "io/safetensors.h"
#include "io/weights.h"
#include "tools/cli_checks.h"
#include "tools/commands.h"
#include "tools/train.h"
#include "tools/zoo.h"

namespace kiln::tools {

void add_ckpt_commands(CLI::App& app, CkptOptions& o) {
  app.require_subcommand(1);
  auto* inspect = app.add_subcommand("inspect", "Summarise a checkpoint: format, step, epoch, config, tensors");
  inspect->add_option("file", o.file, "Checkpoint")->required();
  inspect->add_flag("--all", o.all, "List every tensor");
  inspect->callback([&o] { o.action = "inspect"; });
  auto* verify = app.add_subcommand("verify", "Check every checksum and byte; exit 1 naming what is damaged");
  verify->add_option("file", o.file, "Checkpoint")->required();
  verify->callback([&o] { o.action = "verify"; });
  auto* exp = app.add_subcommand("export", "Write a checkpoint's model weights as safetensors");
  exp->add_option("file", o.file, "Checkpoint")->required();
  exp->add_option("--safetensors", o.out, "Output file")->required();
  exp->add_flag("--overwrite", o.overwrite,
                "Replace the output file(s) if they exist (without it an existing one is refused)");
  exp->callback([&o] { o.action = "export"; });
  auto* imp = app.add_subcommand("import", "Make a weights-only checkpoint (to start `kiln train --resume`) from safetensors");
  imp->add_option("weights", o.file, "Weights (safetensors)")->required()->check(CLI::ExistingFile);
  imp->add_option("--model", o.model, "One of " + model_names_text())->required();
  imp->add_option("--set", o.sets, "Override a config field, key=value (repeatable)");
  imp->add_option("--hf-config", o.hf_config,
                  "A Hugging Face BERT config.json: its sizes as --set (a --set given wins); what Kiln's BERT "
                  "does not compute (hidden_act gelu_new, relative positions, ...) is refused")
      ->check(CLI::ExistingFile);
  imp->add_option("--out", o.out, "Checkpoint to write")->required();
  imp->add_flag("--allow-missing", o.allow_missing,
                "Start the model's tensors the file lacks (a new classifier) from its initialisation, and skip "
                "the file's tensors the model has no place for; each is named on stderr");
  imp->add_option("--seed", o.seed, "Seed of that initialisation (0 to 2^64 - 1), as kiln train's --seed")
      ->default_val(0);
  imp->add_flag("--overwrite", o.overwrite,
                "Replace the output file(s) if they exist (without it an existing one is refused)");
  imp->callback([&o] { o.action = "import"; });
  auto* con = app.add_subcommand("consolidate",
                                 "Make a --zero 1 checkpoint's sharded optimizer state whole: a "
                                 "checkpoint that an unsharded run resumes (and its weights as safetensors)");
  con->add_option("file", o.file, "Checkpoint written with --zero 1")->required()->check(CLI::ExistingFile);
  con->add_option("--out", o.out, "Checkpoint to write")->required();
  con->add_option("--safetensors", o.safetensors, "Also write the model weights here");
  con->add_flag("--overwrite", o.overwrite,
                "Replace the output file(s) if they exist (without it an existing one is refused)");
  con->callback([&o] { o.action = "consolidate"; });
}

namespace {

// A field of the state as text for inspect: a string as it is, anything else (a hand-edited or
// damaged state) as its JSON, never an exception.
std::string text_of(const nlohmann::json& obj, const char* key) {
  if (!obj.is_object() || !obj.contains(key)) return "?";
  const nlohmann::json& v = obj[key];
  return v.is_string() ? v.get<std::string>() : io::dump_json(v);
}
// A state's config, or null (a weights-only checkpoint's is {model, set}; a damaged state may have none).
nlohmann::json config_of(const nlohmann::json& state) {
  return state.is_object() ? state.value("config", nlohmann::json()) : nlohmann::json();
}

int inspect(const CkptOptions& o) {
  io::CheckpointReader r(o.file);
  const auto state = nlohmann::json::parse(r.state_json());
  uint64_t bytes = 0;
  for (const auto& e : r.entries()) bytes += e.nbytes;
  std::printf("%s: Kiln checkpoint format %u.%u, %llu bytes, %zu tensors (%.2f MB of data)\n", o.file.c_str(), r.major(),
              r.minor(), (unsigned long long)r.file_size(), r.entries().size(), double(bytes) / 1e6);
  std::printf("kind: %s\n", text_of(state, "kind").c_str());
  if (state.contains("run")) {
    const auto& run = state["run"];
    std::printf("step %s, epoch %s, batch %s of the epoch\n", text_of(run, "step").c_str(),
                text_of(run, "epoch").c_str(), text_of(run, "batch").c_str());
  }
  if (state.contains("optimizer")) std::printf("optimizer: %s\n", text_of(state["optimizer"], "name").c_str());
  // The CPU kernel set changes a run's last bits: a resume under another one is warned about.
  if (state.contains("config") && state["config"].is_object() && state["config"].contains("cpu_isa"))
    std::printf("cpu kernel set: %s\n", text_of(state["config"], "cpu_isa").c_str());
  if (state.contains("config")) std::printf("config: %s\n", io::dump_json(state["config"]).c_str());
  size_t shown = 0;
  for (const auto& e : r.entries()) {
    if (!o.all && shown == 20) {
      std::printf("... %zu more (--all lists them)\n", r.entries().size() - shown);
      break;
    }
    std::ostringstream s;
    s << e.shape;
    std::printf("  %-60s %-5s %-20s %12llu bytes\n", e.name.c_str(), dtype_name(e.dtype), s.str().c_str(),
                (unsigned long long)e.nbytes);
    ++shown;
  }
  return 0;
}

int verify(const CkptOptions& o) {
  std::error_code ec;
  if (!std::filesystem::exists(o.file, ec)) {  // not damaged: not there
    std::fprintf(stderr, "kiln ckpt verify: error: %s does not exist\n", o.file.c_str());
    return 2;
  }
  if (std::filesystem::is_directory(o.file, ec)) {  // not damaged: not a file (a run's checkpoints/)
    std::fprintf(stderr,
                 "kiln ckpt verify: error: %s is a directory, not a checkpoint file (name a step-*.kiln in it)\n",
                 o.file.c_str());
    return 2;
  }
  std::vector<std::string> problems;
  size_t n = 0;
  try {
    io::CheckpointReader r(o.file);
    n = r.entries().size();
    problems = r.verify();
  } catch (const io::UnsupportedCheckpointFormat& e) {  // intact, but not for this build: still a failure
    std::printf("%s: UNSUPPORTED\n  %s\n", o.file.c_str(), e.message().c_str());
    return 1;
  } catch (const Error& e) {
    problems.push_back(e.message());
  }
  if (problems.empty()) {
    std::printf("%s: OK (%zu tensors, every checksum matches)\n", o.file.c_str(), n);
    return 0;
  }
  std::printf("%s: DAMAGED\n", o.file.c_str());
  for (const auto& p : problems) std::printf("  %s\n", p.c_str());
  return 1;
}

int export_weights(const CkptOptions& o) {
  io::CheckpointReader r(o.file);
  std::map<std::string, Tensor> tensors;
  for (const auto& e : r.entries())
    if (e.name.rfind("model/", 0) == 0) tensors[e.name.substr(6)] = r.read(e.name);
  KILN_CHECK(!tensors.empty(), o.file, ": holds no model weights");
  const auto state = nlohmann::json::parse(r.state_json());
  std::map<std::string, std::string> meta = torch_compatible_metadata();
  meta.merge(weights_metadata(config_of(state)));  // as the run's model.safetensors
  io::save_safetensors(o.out, tensors, meta);
  std::printf("wrote %zu tensors to %s\n", tensors.size(), o.out.c_str());
  return 0;
}

int import_weights(const CkptOptions& o) {
  // Seeded as kiln train seeds its fresh model: what --allow-missing leaves at the initialisation
  // (a new classifier) is the same tensors a run with that --seed starts from.
  manual_seed(o.seed);
  const std::vector<std::string> sets = sets_with_hf_config(o.model, o.hf_config, o.sets);
  const std::shared_ptr<nn::Module> m = model_family(o.model).build(o.model, sets, /*deterministic=*/false).module;
  const io::SafetensorsFile f = io::load_safetensors(o.file);
  const nn::StateDict mine = m->state_dict();
  nn::StateDict given = normalise_checkpoint_names(f.tensors, mine, o.file);
  drop_unused_heads(*m, given, o.file, o.model, "kiln ckpt import");
  if (o.allow_missing) {
    // A fine-tune's start: an encoder-only or pretraining file lacks the new head. Tensors the model
    // has no place for are skipped (named), but a file none of whose tensors fit is the wrong file.
    nn::StateDict skipped, missing;
    for (auto it = given.begin(); it != given.end();) {
      if (mine.count(it->first)) {
        ++it;
        continue;
      }
      skipped.insert(*it);
      it = given.erase(it);
    }
    for (const auto& [n, t] : mine)
      if (!given.count(n)) missing.insert({n, t});
    KILN_CHECK(!given.empty(), o.file, ": none of its ", f.tensors.size(), " tensors is one of ", o.model,
               "'s (is it this model's file? are its names Kiln's or Hugging Face's?)");
    if (!skipped.empty())
      std::fprintf(stderr, "kiln ckpt import: skipped %zu tensor%s of %s that %s has no place for: %s\n",
                   skipped.size(), skipped.size() == 1 ? "" : "s", o.file.c_str(), o.model.c_str(),
                   io::names_with_shapes(skipped).c_str());
    if (!missing.empty())
      std::fprintf(stderr,
                   "kiln ckpt import: %zu tensor%s of %s not in %s start from the model's initialisation (--seed "
                   "%llu): %s\n",
                   missing.size(), missing.size() == 1 ? "" : "s", o.model.c_str(), o.file.c_str(),
                   (unsigned long long)o.seed, io::names_with_shapes(missing).c_str());
  }
  // The flag is named where a missing head is the likely case (a BERT file without the classifier),
  // not for weights of another ResNet.
  const bool heads = model_family(o.model).input == ModelInput::tokens;
  io::check_weights(*m, given, o.file, o.allow_missing,
                    heads ? ", use --allow-missing to start them from the initialisation" : "");
  m->load_state_dict(given, /*strict=*/!o.allow_missing);
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const auto& [n, t] : m->state_dict()) tensors.emplace_back("model/" + n, t);
  // No "run": a weights-only checkpoint, from which kiln train --resume starts at step 0, epoch 0.
  nlohmann::json state = {{"kind", "weights"}, {"config", {{"model", o.model}, {"set", sets}}}, {"source", o.file}};
  if (o.allow_missing) state["config"]["seed"] = o.seed;
  io::save_checkpoint(o.out, tensors, io::dump_json(state));
  std::printf("wrote %s: %zu tensors of %s from %s (start from it with kiln train --resume %s)\n", o.out.c_str(),
              tensors.size(), o.model.c_str(), o.file.c_str(), o.out.c_str());
  return 0;
}

int consolidate(const CkptOptions& o) {
  io::CheckpointReader r(o.file);
  nlohmann::json state = nlohmann::json::parse(r.state_json());
  // A weights-only checkpoint (kiln ckpt import's) has no optimizer state to make whole.
  KILN_CHECK(state.contains("zero") || state.contains("optimizer"), o.file,
             ": holds weights only, no optimizer state (as kiln ckpt import writes): there is nothing to consolidate");
  KILN_CHECK(state.contains("zero"), o.file,
             ": its optimizer state is not sharded (not written with --zero 1); "
             "it is whole already");
  const dist::ZeroLayout layout = io::zero_layout_from_json(state["zero"], o.file);
  std::vector<std::pair<std::string, Tensor>> tensors;
  std::map<std::string, Tensor> weights;
  for (const auto& e : r.entries())
    if (e.name.rfind("model/", 0) == 0) {
      tensors.emplace_back(e.name, r.read(e.name));
      weights[e.name.substr(6)] = tensors.back().second;
    }
  const optim::OptimizerState whole = dist::whole_optimizer_state(
      [&r](const std::string& n) { return r.read("optim-zero/" + n); }, io::zero_slots(r), layout,
      [&](const std::string& param) {
        auto it = weights.find(param);
        KILN_CHECK(it != weights.end(), o.file, ": the sharded layout names parameter ", param,
                   " but the checkpoint holds no model/", param);
        return it->second.shape();
      });
  for (const auto& [n, t] : whole.tensors) tensors.emplace_back("optim/" + n, t);
  // Each group's size ("group<g>.params"), which a sharded checkpoint leaves out (its rank's views are
  // not the parameters): the layout lists every parameter of every group once, so a resume checks the
  // groups against its optimizer's as it does any unsharded checkpoint's.
  if (state.contains("optimizer") && state["optimizer"].is_object() && state["optimizer"].contains("scalars") &&
      state["optimizer"]["scalars"].is_object()) {
    std::map<size_t, int64_t> sizes;
    for (const auto& b : layout.buckets)
      for (const auto& e : b.params) ++sizes[e.group];
    nlohmann::json& scalars = state["optimizer"]["scalars"];
    for (const auto& [g, n] : sizes) scalars["group" + std::to_string(g) + ".params"] = n;
  }
  state.erase("zero");
  if (state.contains("config")) state["config"]["zero"] = 0;
  io::save_checkpoint(o.out, tensors, io::dump_json(state));
  std::printf(
      "wrote %s: %zu optimizer tensors made whole from %d ranks' shards, %zu model tensors (resume it "
      "without --zero, with the same number of ranks)\n",
      o.out.c_str(), whole.tensors.size(), layout.world_size, weights.size());
  if (!o.safetensors.empty()) {
    std::map<std::string, std::string> meta = torch_compatible_metadata();
    meta.merge(weights_metadata(config_of(state)));  // as the run's model.safetensors
    io::save_safetensors(o.safetensors, weights, meta);
    std::printf("wrote %zu tensors to %s\n", weights.size(), o.safetensors.c_str());
  }
  return 0;
}

}  // namespace

int run_ckpt(const CkptOptions& o) {
  // An output that is the input would replace the file being read; consolidate's two outputs must be
  // two files (one replaced the other: the checkpoint was lost).
  std::string clash;
  if (o.action == "export") clash = output_is_input("--safetensors", o.out, {o.file});
  if (o.action == "import" || o.action == "consolidate") clash = output_is_input("--out", o.out, {o.file});
  if (clash.empty() && o.action == "consolidate") clash = same_output("--out", o.out, "--safetensors", o.safetensors);
  if (clash.empty() && o.action == "consolidate") clash = output_is_input("--safetensors", o.safetensors, {o.file});
  // An existing output may be a training checkpoint (optimizer state, progress) that a weights-only
  // one would silently replace: only when asked.
  if (clash.empty() && !o.overwrite) {
    std::vector<std::pair<const char*, std::string>> outputs;
    if (o.action == "export") outputs = {{"--safetensors", o.out}};
    if (o.action == "import" || o.action == "consolidate") outputs = {{"--out", o.out}};
    if (o.action == "consolidate" && !o.safetensors.empty()) outputs.emplace_back("--safetensors", o.safetensors);
    for (const auto& [flag, path] : outputs) {
      std::error_code ec;
      if (std::filesystem::exists(path, ec)) {
        clash =
            std::string(flag) + " " + path + " already exists: add --overwrite to replace it, or write to another path";
        break;
      }
    }
  }
  if (!clash.empty()) {
    std::fprintf(stderr, "kiln ckpt %s: error: %s\n", o.action.c_str(), clash.c_str());
    return 2;
  }
  if (o.action == "consolidate") return consolidate(o);
  if (o.action == "inspect") return inspect(o);
  if (o.action == "verify") return verify(o);
  if (o.action == "export") return export_weights(o);
  return import_weights(o);
}

}  // namespace kiln::tools
