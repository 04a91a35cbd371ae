// The subcommands of `kiln`, each in its own tools/cmd_<name>.cpp.
#pragma once
#include <CLI/CLI.hpp>
#include <string>

namespace kiln::tools {

struct DoctorOptions {
  bool json = false;
  bool self_test = true;
  std::string device = "auto";
};
void add_doctor_flags(CLI::App& app, DoctorOptions& o);
int run_doctor(const DoctorOptions& o);

}  // namespace kiln::tools
