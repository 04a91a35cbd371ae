// `kiln bench train`: full training steps (forward, backward, optimizer) on synthetic batches,
// timed after warm-up. Prints median ms/step and samples/s, and writes JSON with --json.
#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "base/thread_pool.h"
#include "engine/amp.h"
#include "engine/autocast.h"
#include "engine/dist.h"
#include "engine/optim.h"
#include "engine/zero.h"
#include "io/json_text.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/device_memory.h"
#include "models/bert.h"
#include "models/resnet.h"
#include "runtime/nccl_comm.h"
#include "tools/cli_checks.h"
#include "tools/environment.h"
#include "tools/machine.h"
#include "tools/plan.h"
#include "tools/train.h"
#include "tools/zoo.h"

namespace kiln::tools {

void add_bench_train_flags(CLI::App& app, BenchTrainOptions& o) {
  app.add_option("--model", o.models, "Models to time (repeatable; default: resnet20 and bert-tiny)");
  app.add_option("--batch", o.batch, "Batch size (default: 128 for ResNet, 32 for BERT)")->check(at_least(1));
  app.add_option("--seq-len", o.seq_len, "BERT sequence length")->check(at_least(1))->capture_default_str();
  app.add_option("--image-size", o.image_size, "ResNet input size (default: 32 for small ResNets, 224 otherwise)")
      ->check(at_least(1));
  app.add_option("--in-channels", o.in_channels, "ResNet input channels (default 3)")->check(at_least(1));
  app.add_option("--steps", o.steps, "Timed steps")->check(at_least(1))->capture_default_str();
  app.add_option("--warmup", o.warmup,
                 "Untimed steps first; the peak memory is of the timed steps, after them, with the optimizer's "
                 "state in place (--warmup 0 leaves the peak out: the first step runs before that state exists)")
      ->check(at_least(0))
      ->capture_default_str();
  app.add_option("--threads", o.threads,
                 "CPU threads (0: KILN_NUM_THREADS or the CPUs available; at most " + std::to_string(max_threads()) +
                     ", the larger of 1024 and 4 x the CPUs: more only contend for the "
                     "cores, and each costs a stack and a slot of the process limit)")
      ->check(between(0, double(max_threads())));
  app.add_option("--amp", o.amp, "off, fp16 or bf16 (repeatable: each is timed; default off)")
      ->check(CLI::IsMember({"off", "fp16", "bf16"}));
  app.add_option("--device", o.device, "cpu, or cuda / cuda:N (GPU ranks take cuda:LOCAL_RANK)")->capture_default_str();
  app.add_option("--recompute", o.recompute, "none or blocks (activation recomputation)")
      ->check(CLI::IsMember({"none", "blocks"}))
      ->capture_default_str();
  app.add_option("--zero", o.zero, "0, or 1: ZeRO stage 1 over the ranks")->check(between(0, 1))->capture_default_str();
  app.add_option("--dist-timeout", o.dist_timeout,
                 "Under kiln launch: seconds a collective between ranks may take before the run ends with an error")
      ->check(at_least(1))
      ->capture_default_str();
  app.add_option("--json", o.json, "Write the rows to this JSON file");
}

namespace {

// A benchmark's rows as JSON: {"bench": kind, ...extra, "rows": [...]}.
void write_bench_json(const std::string& path, nlohmann::json head, const nlohmann::json& rows) {
  std::ofstream f(path);
  KILN_CHECK(f.good(), path, ": cannot open for writing");
  head["rows"] = rows;
  f << io::dump_json(head, 2) << "\n";
}

// The checks every bench makes on its flags before any work, each "" when the value is fine: a
// --json whose directory is missing or not writable (found only after the benchmark ran, before).
std::string check_json_out(const std::string& path) {
  return path.empty() ? "" : output_file_problem("--json", path, "JSON file to write");
}
std::string check_models(const std::vector<std::string>& names) {
  for (const auto& n : names)
    if (!find_model_family(n)) return unknown_model_message(n);
  return "";
}
// --device: one this machine has (a GPU device when none is visible fails in the children otherwise).
std::string check_device(const std::string& device) {
  try {
    const Device d = Device::parse(device);
    if (d.is_meta()) return "--device meta: benchmarks run on cpu or cuda";
    if (d.is_cuda()) {
      const int n = cuda::device_count();
      if (n == 0) return "--device " + device + ": no CUDA GPU is visible (this build or machine has none)";
      if (device != "cuda" && d.index >= n)
        return "--device " + device + ": only " + std::to_string(n) + " GPU" + (n == 1 ? "" : "s") + " visible";
    }
  } catch (const Error& e) {
    return "--device " + device + ": " + e.message();
  }
  return "";
}
// The ports a bench hands its runs: first+1 .. first+runs, each in 1..65535.
std::string check_ports(int first, int runs) {
  if (first < 1 || int64_t(first) + runs > 65535)
    return "--master-port " + std::to_string(first) + ": the runs take ports " + std::to_string(first + 1) + ".." +
           std::to_string(int64_t(first) + runs) + ", which must lie in 1..65535";
  return "";
}
// Prints the first complaint as "kiln bench KIND: error: ..." and says whether there was one.
bool refuse(const char* kind, std::initializer_list<std::string> complaints) {
  for (const auto& c : complaints)
    if (!c.empty()) {
      std::fprintf(stderr, "kiln bench %s: error: %s\n", kind, c.c_str());
      return true;
    }
  return false;
}

struct Timing {
  std::string input;
  int64_t batch = 0;  // samples per step, over all ranks
  double median_ms = 0, min_ms = 0, max_ms = 0;
  size_t peak = 0;          // CPU bytes held at most during the timed steps (the most of any rank)
  size_t planned_peak = 0;  // the planner's prediction of the same step (per rank; 0 under --amp)
};

// Full training steps of one model in one precision, on a fresh model seeded the same for each.
// `comm` agrees on host numbers; `grads` reduces the gradients (NCCL for GPU ranks).
Timing time_steps(const BenchTrainOptions& o, const std::string& name, const std::string& amp_mode,
                  dist::Communicator& comm, dist::Communicator& grads, Device dev) {
  const int world = comm.world_size();
  manual_seed(1);
  std::vector<std::string> sets;
  if (o.recompute == "blocks") sets.push_back("recompute=1");
  const SyntheticStep st = synthetic_step(name, o.batch, o.seq_len, o.image_size, o.in_channels, sets, dev);
  const std::shared_ptr<nn::Module> model = st.model;
  const std::function<Tensor()> step_loss = st.loss;
  const std::string input = st.input;
  const int64_t batch = st.batch;
  const ModelFamily& family = model_family(name);
  model->train();
  auto groups = optim::decay_groups(model->named_parameters(), 0.01, 1e-4);
  std::unique_ptr<dist::ZeroRedundancy> zero;
  if (o.zero == 1) {
    zero = std::make_unique<dist::ZeroRedundancy>(*model, groups, grads);
    groups = zero->shard_groups();
  }
  std::unique_ptr<optim::Optimizer> opt;
  if (family.input == ModelInput::images) opt = std::make_unique<optim::SGD>(groups, optim::SgdOptions{0.9, 0, true});
  else opt = std::make_unique<optim::AdamW>(groups);
  // The step `kiln train --amp` takes: forward and loss under autocast, scaled backward, scaler step.
  const std::optional<DType> low = amp_dtype(amp_mode);
  amp::GradScalerOptions so;
  so.enabled = low == DType::f16;
  amp::GradScaler scaler(so);
  const std::vector<Tensor> params = zero ? zero->shard_params() : model->parameters();
  std::unique_ptr<dist::DataParallel> dp;
  if (world > 1) {
    if (!zero) dp = std::make_unique<dist::DataParallel>(*model, grads);
    scaler.agree = [&](Tensor& f) { grads.all_reduce(f, dist::ReduceOp::max); };
  }
  std::vector<double> ms;
  for (int64_t i = 0; i < o.warmup + o.steps; ++i) {
    if (i == o.warmup) reset_memory_peak(dev);  // the timed steps' peak, optimizer state in place
    const auto t0 = std::chrono::steady_clock::now();
    opt->zero_grad();
    if (zero) zero->zero_grad();
    Tensor loss;
    {
      amp::AutocastGuard autocast(low.value_or(DType::f16), low.has_value());
      loss = step_loss();
    }
    scaler.scale(loss).backward();
    loss = Tensor();
    if (dp) dp->finish();
    if (zero) zero->finish();
    scaler.step(*opt, params);
    scaler.update();
    if (zero) zero->gather();
    if (dev.is_cuda()) cuda::synchronize(dev.index);  // the device's time, not the launches'
    const double t = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (i >= o.warmup) ms.push_back(t);
  }
  if (world > 1) {  // a step takes as long as its slowest rank
    Tensor t = from_vector(ms, {int64_t(ms.size())}, DType::f64);
    comm.all_reduce(t, dist::ReduceOp::max);
    ms = t.to_vector();
  }
  size_t peak = memory_stats(dev).peak_allocated;
  if (world > 1) {
    Tensor t = from_vector({double(peak)}, {1}, DType::i64);
    comm.all_reduce(t, dist::ReduceOp::max);
    peak = size_t(t.item<int64_t>());
  }
  size_t planned = 0;
  if (!low) {  // the planner on the same step (its optimizer as kiln train's default per family)
    PlanOptions po;
    po.ranks = world;
    po.zero = o.zero;
    po.model = name;
    po.seq_len = o.seq_len;
    po.image_size = o.image_size;
    po.in_channels = o.in_channels;
    po.recompute = o.recompute;
    po.optimizer = family.input == ModelInput::images ? "sgd" : "adamw";
    po.device = dev.str();
    planned = plan_memory(po, batch).peak;
  }
  std::sort(ms.begin(), ms.end());
  // The median: the mean of the two middle steps for an even count (as the peers' scripts and
  // bench::median take it), so train_vs_torch compares like with like.
  const size_t h = ms.size() / 2;
  const double median = ms.size() % 2 == 1 ? ms[h] : (ms[h - 1] + ms[h]) / 2.0;
  return {input, batch * world, median, ms.front(), ms.back(), peak, planned};
}

}  // namespace

int run_bench_train(const BenchTrainOptions& o) {
  if (refuse("train", {check_models(o.models), check_device(o.device), check_json_out(o.json)})) return 2;
  if (o.threads > 0) set_num_threads(o.threads);
  // Under `kiln launch` or mpirun: data parallel, --batch per rank; rank 0 prints the global numbers.
  const dist::DistEnv env = kiln::tools::dist_env();
  auto comm = dist::make_cpu_communicator(env, std::chrono::seconds(o.dist_timeout));
  const int world = comm->world_size();
  const bool lead = comm->rank() == 0;
  // GPU ranks: cuda:LOCAL_RANK (or the one named), gradients through NCCL as kiln train does.
  Device dev = Device::parse(o.device);
  KILN_CHECK(!dev.is_meta(), "--device meta: benchmarks run on cpu or cuda");
  if (dev.is_cuda() && o.device == "cuda") dev = cuda_device(env.local_rank);
  std::unique_ptr<dist::Communicator> gpu;
  if (dev.is_cuda() && world > 1)
    gpu = cuda::make_nccl_communicator(*comm, dev.index, std::chrono::seconds(o.dist_timeout));
  dist::Communicator& grads = gpu ? *gpu : *comm;
  if (!lead) std::freopen("/dev/null", "w", stdout);
  std::vector<std::string> names = o.models.empty() ? std::vector<std::string>{"resnet20", "bert-tiny"} : o.models;
  nlohmann::json rows = nlohmann::json::array();
  std::printf(
      "kiln bench train: %s; %d thread%s, %lld warm-up + %lld timed steps, SGD momentum (ResNet) / AdamW "
      "(BERT)%s\n",
      tools::cpu_line().c_str(), num_threads(), num_threads() == 1 ? "" : "s", (long long)o.warmup, (long long)o.steps,
      world > 1 ? (", " + std::to_string(world) + " ranks (" + comm->backend() + "), batch per rank, samples/s global")
                      .c_str()
                : "");
  const std::vector<std::string> amps = o.amp.empty() ? std::vector<std::string>{"off"} : o.amp;
  std::printf("%-12s %-5s %-22s %10s %10s %10s %12s %8s %10s\n", "model", "amp", "input", "median ms", "min ms",
              "max ms", "samples/s", "vs off", "peak MiB");
  for (const auto& name : names) {
    double off_ms = 0;
    for (const auto& amp_mode : amps) {
      const Timing t = time_steps(o, name, amp_mode, *comm, grads, dev);
      const double med = t.median_ms, sps = double(t.batch) * 1000.0 / med;
      if (amp_mode == "off") off_ms = med;
      const std::string vs = off_ms > 0 ? std::to_string(off_ms / med).substr(0, 4) + "x" : "-";
      // Without a warm-up step the first timed step ran before the optimizer's state existed: its peak
      // is not a training step's, so none is reported.
      char peak[32] = "-";
      if (o.warmup > 0) std::snprintf(peak, sizeof peak, "%.1f", double(t.peak) / double(1 << 20));
      std::printf("%-12s %-5s %-22s %10.1f %10.1f %10.1f %12.1f %8s %10s\n", name.c_str(), amp_mode.c_str(),
                  t.input.c_str(), med, t.min_ms, t.max_ms, sps, vs.c_str(), peak);
      nlohmann::json row = {{"model", name},        {"amp", amp_mode},          {"input", t.input},
                            {"batch", t.batch},     {"threads", num_threads()}, {"ranks", world},
                            {"median_ms", med},     {"min_ms", t.min_ms},       {"max_ms", t.max_ms},
                            {"samples_per_s", sps}, {"steps", o.steps},         {"recompute", o.recompute},
                            {"zero", o.zero}};
      if (o.warmup > 0) row["peak_mib"] = double(t.peak) / double(1 << 20);
      if (t.planned_peak) row["planned_peak_mib"] = double(t.planned_peak) / double(1 << 20);
      if (off_ms > 0) row["speedup_vs_off"] = off_ms / med;
      rows.push_back(row);
    }
  }
  if (!o.json.empty() && lead)
    write_bench_json(o.json,
                     {{"bench", "train"}, {"cpu", tools::cpu_model()}, {"cpu_kernels", cpu_isa_name(cpu_isa())}}, rows);
  return 0;
}

void add_bench_scaling_flags(CLI::App& app, BenchScalingOptions& o) {
  app.add_option("--model", o.model, "Model to time")->capture_default_str();
  app.add_option("--batch", o.batch, "Batch per rank (default: as bench train)")->check(at_least(0));
  app.add_option("--steps", o.steps, "Timed steps")->check(at_least(1))->capture_default_str();
  app.add_option("--warmup", o.warmup, "Untimed steps first")->check(at_least(0))->capture_default_str();
  app.add_option("--max-ranks", o.max_ranks, "Time 1..N ranks")->check(between(1, 256))->capture_default_str();
  app.add_option("--threads-per-rank", o.threads_per_rank, "Compute threads of each rank")
      ->check(between(1, double(max_threads())))
      ->capture_default_str();
  app.add_option("--master-port", o.master_port, "First rendezvous port (one per run)")->capture_default_str();
  app.add_option("--json", o.json, "Write the rows to this JSON file");
}

namespace {
// What a benchmark that runs `kiln bench train` children needs: this binary, and a scratch
// directory for their JSON and logs.
struct Children {
  std::string kiln, dir;
  explicit Children(const char* what) {
    char self[4096];
    const ssize_t len = ::readlink("/proc/self/exe", self, sizeof self - 1);
    KILN_CHECK(len > 0, "bench ", what, ": cannot find the kiln binary (/proc/self/exe)");
    kiln.assign(self, size_t(len));
    dir = (std::filesystem::temp_directory_path() / (std::string("kiln_") + what + "_" + std::to_string(::getpid())))
              .string();
    std::filesystem::create_directories(dir);
  }
};
}  // namespace

int run_bench_scaling(const BenchScalingOptions& o) {
  if (refuse("scaling", {check_models({o.model}), check_ports(o.master_port, o.max_ranks), check_json_out(o.json)}))
    return 2;
  const Children ch("scaling");
  const std::string &kiln = ch.kiln, &dir = ch.dir;
  std::printf(
      "kiln bench scaling: %s; %s, %d thread%s per rank, data parallel through kiln launch (tcp)\n%6s %14s %12s "
      "%12s\n",
      tools::cpu_line().c_str(), o.model.c_str(), o.threads_per_rank, o.threads_per_rank == 1 ? "" : "s", "ranks",
      "samples/s", "speed-up", "efficiency");
  nlohmann::json rows = nlohmann::json::array();
  double one = 0;
  for (int n = 1; n <= o.max_ranks; ++n) {
    const std::string out = dir + "/ranks" + std::to_string(n) + ".json";
    std::string cmd = kiln + " launch --nproc-per-node " + std::to_string(n) + " --master-port " +
                      std::to_string(o.master_port + n) + " -- " + kiln + " bench train --model " + o.model +
                      " --steps " + std::to_string(o.steps) + " --warmup " + std::to_string(o.warmup) + " --threads " +
                      std::to_string(o.threads_per_rank) + " --json " + out;
    if (o.batch > 0) cmd += " --batch " + std::to_string(o.batch);
    cmd += " > " + dir + "/ranks" + std::to_string(n) + ".log 2>&1";
    const int rc = std::system(cmd.c_str());
    std::ifstream f(out);
    KILN_CHECK(rc == 0 && f.good(), "bench scaling: the run with ", n, " rank(s) failed; its output is in ", dir,
               "/ranks", n, ".log");
    nlohmann::json j;
    f >> j;
    const double sps = j.at("rows").at(0).at("samples_per_s").get<double>();
    if (n == 1) one = sps;
    const double eff = sps / (double(n) * one);
    std::printf("%6d %14.1f %11.2fx %11.1f%%\n", n, sps, sps / one, 100.0 * eff);
    std::fflush(stdout);
    rows.push_back({{"ranks", n}, {"samples_per_s", sps}, {"speedup", sps / one}, {"efficiency", eff},
                    {"median_ms", j["rows"][0]["median_ms"]}, {"global_batch", j["rows"][0]["batch"]}});
  }
  std::filesystem::remove_all(dir);
  if (!o.json.empty())
    write_bench_json(o.json,
                     {{"bench", "scaling"},
                      {"model", o.model},
                      {"threads_per_rank", o.threads_per_rank},
                      {"cpu", tools::cpu_model()},
                      {"cpu_kernels", cpu_isa_name(cpu_isa())}},
                     rows);
  return 0;
}

void add_bench_memory_flags(CLI::App& app, BenchMemoryOptions& o) {
  app.add_option("--model", o.models, "Models (repeatable; default: resnet50 and bert-base)");
  app.add_option("--batch", o.batch, "Batch per rank (default: 8 for ResNets at 224x224, 2 for BERT)")
      ->check(at_least(0));
  app.add_option("--seq-len", o.seq_len, "BERT sequence length")->check(at_least(1))->capture_default_str();
  app.add_option("--steps", o.steps, "Timed steps")->check(at_least(1))->capture_default_str();
  app.add_option("--warmup", o.warmup,
                 "Untimed steps first, at least 1: the peak is measured after them, with the optimizer's state "
                 "(momentum, Adam's moments) in place, which the first step creates")
      ->check(at_least(1))
      ->capture_default_str();
  app.add_option("--ranks", o.ranks, "Ranks of the data-parallel and ZeRO runs")
      ->check(between(2, 64))
      ->capture_default_str();
  app.add_option("--master-port", o.master_port, "First rendezvous port")->capture_default_str();
  app.add_option("--device", o.device, "cpu, or cuda (one GPU per rank)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  app.add_option("--json", o.json, "Write the rows to this JSON file");
}

int run_bench_memory(const BenchMemoryOptions& o) {
  {
    const std::vector<std::string> models =
        o.models.empty() ? std::vector<std::string>{"resnet50", "bert-base"} : o.models;
    if (refuse("memory", {check_models(models), check_device(o.device),
                          check_ports(o.master_port, 2 * int(models.size())), check_json_out(o.json)}))
      return 2;
  }
  const Children ch("memory");
  const std::string &kiln = ch.kiln, &dir = ch.dir;
  const std::vector<std::string> models =
      o.models.empty() ? std::vector<std::string>{"resnet50", "bert-base"} : o.models;
  const unsigned hw = unsigned(available_cpus());  // the CPUs this process (and its children) may run on
  std::printf(
      "kiln bench memory: %s; CPU bytes held at the peak of a training step (the most of any rank), "
      "median step time; %lld warm-up + %lld timed steps\n",
      tools::cpu_line().c_str(), (long long)o.warmup, (long long)o.steps);
  std::printf("%-10s %-22s %-26s %11s %11s %10s %12s %10s\n", "model", "input", "run", "peak MiB", "planned", "step ms",
              "memory", "time");
  nlohmann::json rows = nlohmann::json::array();
  int port = o.master_port;
  for (const auto& name : models) {
    const bool images = model_family(name).input == ModelInput::images;
    const int64_t batch = o.batch > 0 ? o.batch : images ? 8 : 2;
    struct Run {
      const char* label;
      int ranks;
      const char* flags;
      int ref;  // the row it is compared with (-1: none)
    };
    const std::string dp = std::to_string(o.ranks) + " ranks, data parallel",
                      zr = std::to_string(o.ranks) + " ranks, --zero 1";
    const std::vector<Run> runs = {{"1 rank", 1, "", -1},
                                   {"1 rank, --recompute blocks", 1, " --recompute blocks", 0},
                                   {dp.c_str(), o.ranks, "", -1},
                                   {zr.c_str(), o.ranks, " --zero 1", 2}};
    std::vector<nlohmann::json> got;
    for (size_t k = 0; k < runs.size(); ++k) {
      const Run& r = runs[k];
      if (o.device == "cuda" && r.ranks > cuda::device_count()) {
        std::printf("%-10s %-22s %-26s (needs %d GPUs, %d visible)\n", name.c_str(), "", r.label, r.ranks,
                    cuda::device_count());
        got.push_back(nlohmann::json());
        continue;
      }
      if (r.ref >= 0 && got[size_t(r.ref)].is_null()) continue;
      const std::string out = dir + "/" + name + std::to_string(k) + ".json";
      const unsigned threads = std::max(1u, hw / unsigned(r.ranks));
      std::string cmd = kiln + " bench train --model " + name + " --batch " + std::to_string(batch) + " --seq-len " +
                        std::to_string(o.seq_len) + " --steps " + std::to_string(o.steps) + " --warmup " +
                        std::to_string(o.warmup) + " --threads " + std::to_string(threads) + " --device " + o.device +
                        r.flags + " --json " + out;
      if (r.ranks > 1)
        cmd = kiln + " launch --nproc-per-node " + std::to_string(r.ranks) + " --master-port " +
              std::to_string(++port) + " -- " + cmd;
      cmd += " > " + dir + "/" + name + std::to_string(k) + ".log 2>&1";
      const int rc = std::system(cmd.c_str());
      std::ifstream f(out);
      KILN_CHECK(rc == 0 && f.good(), "bench memory: ", name, " (", r.label, ") failed; its output is in ", dir, "/",
                 name, k, ".log");
      nlohmann::json j;
      f >> j;
      nlohmann::json row = j.at("rows").at(0);
      row["run"] = r.label;
      const double peak = row["peak_mib"].get<double>(), ms = row["median_ms"].get<double>();
      std::string mem = "-", time = "-";
      if (r.ref >= 0) {
        const double rp = got[size_t(r.ref)]["peak_mib"].get<double>(),
                     rms = got[size_t(r.ref)]["median_ms"].get<double>();
        row["memory_saved_mib"] = rp - peak;
        row["time_cost_percent"] = 100.0 * (ms / rms - 1.0);
        char b[64];
        std::snprintf(b, sizeof b, "%+.1f MiB", peak - rp);
        mem = b;
        std::snprintf(b, sizeof b, "%+.1f%%", 100.0 * (ms / rms - 1.0));
        time = b;
      }
      char planned[32] = "-";
      if (row.contains("planned_peak_mib"))
        std::snprintf(planned, sizeof planned, "%.1f", row["planned_peak_mib"].get<double>());
      std::printf("%-10s %-22s %-26s %11.1f %11s %10.1f %12s %10s\n", name.c_str(),
                  row["input"].get<std::string>().c_str(), r.label, peak, planned, ms, mem.c_str(), time.c_str());
      std::fflush(stdout);
      got.push_back(row);
      rows.push_back(row);
    }
  }
  std::filesystem::remove_all(dir);
  if (!o.json.empty())
    write_bench_json(
        o.json, {{"bench", "memory"}, {"cpu", tools::cpu_model()}, {"cpu_kernels", cpu_isa_name(cpu_isa())}}, rows);
  return 0;
}

}  // namespace kiln::tools
