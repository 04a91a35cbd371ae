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
};
void add_doctor_flags(CLI::App& app, DoctorOptions& o);
int run_doctor(const DoctorOptions& o);

struct ForwardOptions {
  std::string model, weights, inputs, out, grad_output;
  std::vector<std::string> sets;
  bool train = false;
  bool allow_missing = false;
};
void add_forward_flags(CLI::App& app, ForwardOptions& o);
int run_forward(const ForwardOptions& o);

struct CkptOptions {
  std::string action, file, out, model;
  std::vector<std::string> sets;
  bool all = false;
};
void add_ckpt_commands(CLI::App& app, CkptOptions& o);
int run_ckpt(const CkptOptions& o);

}  // namespace kiln::tools
