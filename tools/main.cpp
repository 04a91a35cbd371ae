// The `kiln` command line: one binary, one subcommand per job.
#include <CLI/CLI.hpp>

#include <csignal>
#include <cstdio>
#include <exception>

#include "base/error.h"
#include "engine/dist.h"
#include "kiln_build_info.h"
#include "tools/cli_checks.h"
#include "tools/commands.h"
#include "tools/environment.h"
#include "tools/plan.h"
#include "tools/report.h"
#include "tools/train.h"

int main(int argc, char** argv) {
  // Past a file-size limit (ulimit -f, some quota setups) a write should fail with an error Kiln
  // reports and survives, not kill the process.
  std::signal(SIGXFSZ, SIG_IGN);
  CLI::App app{"Kiln: a from-scratch deep-learning training engine"};
  app.require_subcommand(0, 1);
  bool version = false;
  app.add_flag("--version", version, "Print the version and exit");
  kiln::tools::DoctorOptions doctor_opts;
  CLI::App* doctor = app.add_subcommand("doctor", "Report the build and what this machine offers for training");
  kiln::tools::add_doctor_flags(*doctor, doctor_opts);
  kiln::tools::ForwardOptions forward_opts;
  CLI::App* forward = app.add_subcommand("forward", "Run a model on inputs from a safetensors file and write its outputs");
  kiln::tools::add_forward_flags(*forward, forward_opts);
  kiln::tools::TrainConfig train_cfg;
  CLI::App* train = app.add_subcommand("train", "Train a model (ResNet on Fashion-MNIST by default) and evaluate it");
  kiln::tools::add_train_flags(*train, train_cfg);
  kiln::tools::TrainConfig eval_cfg;
  std::string eval_weights;
  CLI::App* eval = app.add_subcommand("eval", "Evaluate trained weights on a data set's test split");
  kiln::tools::add_eval_flags(*eval, eval_cfg, eval_weights);
  kiln::tools::VocabOptions vocab_opts;
  CLI::App* vocab = app.add_subcommand("vocab", "Learn a WordPiece vocabulary (vocab.txt) from text");
  kiln::tools::add_vocab_flags(*vocab, vocab_opts);
  kiln::tools::CkptOptions ckpt_opts;
  CLI::App* ckpt = app.add_subcommand("ckpt", "Inspect, verify, export or import checkpoints");
  kiln::tools::add_ckpt_commands(*ckpt, ckpt_opts);
  kiln::tools::LaunchOptions launch_opts;
  CLI::App* launch = app.add_subcommand("launch", "Start the ranks of a data-parallel job on this machine (-- kiln train ...)");
  kiln::tools::add_launch_flags(*launch, launch_opts);
  kiln::tools::PlanOptions plan_opts;
  CLI::App* plan =
      app.add_subcommand("plan", "Predict a training step's memory (meta tensors) and the micro-batch that fits");
  kiln::tools::add_plan_flags(*plan, plan_opts);
  kiln::tools::ReportOptions report_opts;
  CLI::App* report =
      app.add_subcommand("report", "One HTML page of runs' curves (loss, accuracy, lr, throughput, phases)");
  kiln::tools::add_report_flags(*report, report_opts);
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks");
  bench->require_subcommand(1);
  kiln::tools::BenchTrainOptions bench_train_opts;
  CLI::App* bench_train = bench->add_subcommand("train", "Time full training steps (forward, backward, optimizer)");
  kiln::tools::add_bench_train_flags(*bench_train, bench_train_opts);
  kiln::tools::BenchMemoryOptions bench_memory_opts;
  CLI::App* bench_memory =
      bench->add_subcommand("memory", "Peak memory and step time with and without --recompute blocks and --zero 1");
  kiln::tools::add_bench_memory_flags(*bench_memory, bench_memory_opts);
  kiln::tools::BenchScalingOptions bench_scaling_opts;
  CLI::App* bench_scaling =
      bench->add_subcommand("scaling", "Data-parallel training throughput for 1..N ranks and its efficiency");
  kiln::tools::add_bench_scaling_flags(*bench_scaling, bench_scaling_opts);
  // A flag given twice takes its last value, in every command (so `scripts/demo --epochs 5` overrides
  // the script's own): set once every flag is added.
  kiln::tools::take_last_value(app);
  try {
    // A true/false flag's --flag=VALUE by --set's and --config's rule, not CLI11's looser one.
    if (const std::string bad = kiln::tools::bad_flag_value(app, std::vector<std::string>(argv + 1, argv + argc));
        !bad.empty()) {
      std::fprintf(stderr, "%s\n", bad.c_str());
      return 2;
    }
    app.parse(argc, argv);
    // --config, the required flags and the model's defaults, for kiln train and kiln eval alike.
    for (const auto& [cmd, cfg] : {std::pair{train, &train_cfg}, std::pair{eval, &eval_cfg}}) {
      if (!cmd->parsed()) continue;
      try {
        kiln::tools::finish_train_flags(*cmd, *cfg);
      } catch (const kiln::Error& e) {
        std::fprintf(stderr, "kiln %s: error: %s\n", cmd->get_name().c_str(), e.message().c_str());
        return 2;
      }
    }
  } catch (const CLI::ExtrasError&) {
    // A word no flag takes: one line naming it (CLI11's own is two, without the command's prefix).
    std::fprintf(stderr, "%s\n",
                 kiln::tools::extras_message(app, *train, std::vector<std::string>(argv + 1, argv + argc)).c_str());
    return 2;
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --help-all: CLI11 prints them
    // Bad flags: one line naming the command (CLI11's own is two, without it) and exit code 2, before
    // any work starts.
    const std::string cmd = kiln::tools::command_path(kiln::tools::deepest_parsed(app));
    std::fprintf(stderr, "%s: error: %s (see %s --help)\n", cmd.c_str(), e.what(), cmd.c_str());
    return 2;
  }
  try {
    kiln::tools::apply_environment();
    if (version) {
      std::printf("kiln %s\n", KILN_VERSION_STRING);
      return 0;
    }
    if (doctor->parsed()) return kiln::tools::run_doctor(doctor_opts);
    if (forward->parsed()) return kiln::tools::run_forward(forward_opts);
    if (train->parsed()) return kiln::tools::run_train(train_cfg);
    if (eval->parsed()) return kiln::tools::run_eval(eval_cfg, eval_weights);
    if (vocab->parsed()) return kiln::tools::run_vocab(vocab_opts);
    if (ckpt->parsed()) return kiln::tools::run_ckpt(ckpt_opts);
    if (launch->parsed()) return kiln::tools::run_launch(launch_opts);
    if (report->parsed()) return kiln::tools::run_report(report_opts);
    if (plan->parsed()) return kiln::tools::run_plan(plan_opts);
    if (bench_train->parsed()) return kiln::tools::run_bench_train(bench_train_opts);
    if (bench_scaling->parsed()) return kiln::tools::run_bench_scaling(bench_scaling_opts);
    if (bench_memory->parsed()) return kiln::tools::run_bench_memory(bench_memory_opts);
    std::printf("%s", app.help().c_str());
    return 0;
  } catch (const kiln::dist::CollectiveError& e) {
    // The other ranks are gone or hang: leave now, without the destructors of a communicator (MPI
    // finalisation, NCCL teardown) that would wait for them. `kiln launch` then stops the rest.
    std::fprintf(stderr, "kiln: error: %s\n", e.message().c_str());
    std::fflush(nullptr);
    std::_Exit(3);
  } catch (const kiln::Error& e) {
    std::fprintf(stderr, "kiln: error: %s\n", e.message().c_str());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kiln: error: %s\n", e.what());
    return 1;
  }
}
