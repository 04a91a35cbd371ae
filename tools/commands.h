// The subcommands of `kiln`, each in its own tools/cmd_<name>.cpp.
#pragma once
#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace kiln::tools {

struct DoctorOptions {
  bool json = false;
  bool self_test = true;
  std::string device = "auto";
  // Set while parsing: the environment variables Kiln refuses (each its error), unset so that the
  // report runs on the defaults and names them instead of failing.
  std::vector<std::string> env_problems;
};
void add_doctor_flags(CLI::App& app, DoctorOptions& o);
int run_doctor(const DoctorOptions& o);

struct ForwardOptions {
  std::string model, weights, inputs, out, grad_output;
  std::string hf_config;  // a Hugging Face config.json whose sizes come before --set
  std::vector<std::string> sets;
  bool train = false;
  bool allow_missing = false;
};
void add_forward_flags(CLI::App& app, ForwardOptions& o);
int run_forward(const ForwardOptions& o);

struct CkptOptions {
  std::string action, file, out, model, safetensors;
  std::string hf_config;  // import: a Hugging Face config.json whose sizes come before --set
  std::vector<std::string> sets;
  bool all = false;
  bool overwrite = false;  // replace an existing output file
  // import: the model's tensors the file lacks start from its initialisation (seeded by `seed`, as
  // kiln train's fresh model), and the file's tensors the model lacks are skipped; each is named.
  bool allow_missing = false;
  uint64_t seed = 0;
};
void add_ckpt_commands(CLI::App& app, CkptOptions& o);
int run_ckpt(const CkptOptions& o);

struct LaunchOptions {
  int nproc_per_node = 1, nnodes = 1, node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  double grace_seconds = 10;
  std::vector<std::string> command;
};
void add_launch_flags(CLI::App& app, LaunchOptions& o);
int run_launch(const LaunchOptions& o);

}  // namespace kiln::tools
