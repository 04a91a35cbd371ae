// `kiln ckpt inspect|verify|export|import`: look into a checkpoint, check every byte of it, take its
// weights out as safetensors, or make a weights-only checkpoint from safetensors trained elsewhere.
#include <cstdio>
#include <map>
#include <sstream>
#include <nlohmann/json.hpp>

#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "tools/commands.h"
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
  exp->callback([&o] { o.action = "export"; });
  auto* imp = app.add_subcommand("import", "Make a weights-only checkpoint (to start `kiln train --resume`) from safetensors");
  imp->add_option("weights", o.file, "Weights (safetensors)")->required()->check(CLI::ExistingFile);
  imp->add_option("--model", o.model, "One of " + model_names_text())->required();
  imp->add_option("--set", o.sets, "Override a config field, key=value (repeatable)");
  imp->add_option("--out", o.out, "Checkpoint to write")->required();
  imp->callback([&o] { o.action = "import"; });
}

namespace {

int inspect(const CkptOptions& o) {
  io::CheckpointReader r(o.file);
  const auto state = nlohmann::json::parse(r.state_json());
  uint64_t bytes = 0;
  for (const auto& e : r.entries()) bytes += e.nbytes;
  std::printf("%s: Kiln checkpoint format %u.%u, %llu bytes, %zu tensors (%.2f MB of data)\n", o.file.c_str(), r.major(),
              r.minor(), (unsigned long long)r.file_size(), r.entries().size(), double(bytes) / 1e6);
  std::printf("kind: %s\n", state.value("kind", "?").c_str());
  if (state.contains("run")) {
    const auto& run = state["run"];
    std::printf("step %lld, epoch %lld, batch %lld of the epoch\n", run.value("step", 0LL), run.value("epoch", 0LL),
                run.value("batch", 0LL));
  }
  if (state.contains("optimizer")) std::printf("optimizer: %s\n", state["optimizer"].value("name", "?").c_str());
  if (state.contains("config")) std::printf("config: %s\n", state["config"].dump().c_str());
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
  std::vector<std::string> problems;
  size_t n = 0;
  try {
    io::CheckpointReader r(o.file);
    n = r.entries().size();
    problems = r.verify();
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
  std::map<std::string, std::string> meta = {{"format", "kiln"}};
  if (state.contains("config")) meta["model"] = state["config"].value("model", "");
  io::save_safetensors(o.out, tensors, meta);
  std::printf("wrote %zu tensors to %s\n", tensors.size(), o.out.c_str());
  return 0;
}

int import_weights(const CkptOptions& o) {
  const std::shared_ptr<nn::Module> m = model_family(o.model).build(o.model, o.sets, /*deterministic=*/false).module;
  const io::SafetensorsFile f = io::load_safetensors(o.file);
  const nn::StateDict mine = m->state_dict();
  nn::StateDict given = normalise_checkpoint_names(f.tensors, mine);
  drop_unused_heads(*m, given, o.file, o.model, "kiln ckpt import");
  m->load_state_dict(given, /*strict=*/true);
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const auto& [n, t] : m->state_dict()) tensors.emplace_back("model/" + n, t);
  const nlohmann::json state = {{"kind", "weights"}, {"config", {{"model", o.model}, {"set", o.sets}}}, {"source", o.file}};
  io::save_checkpoint(o.out, tensors, state.dump());
  std::printf("wrote %s: %zu tensors of %s from %s (start from it with kiln train --resume %s)\n", o.out.c_str(),
              tensors.size(), o.model.c_str(), o.file.c_str(), o.out.c_str());
  return 0;
}

}  // namespace

int run_ckpt(const CkptOptions& o) {
  if (o.action == "inspect") return inspect(o);
  if (o.action == "verify") return verify(o);
  if (o.action == "export") return export_weights(o);
  return import_weights(o);
}

}  // namespace kiln::tools
