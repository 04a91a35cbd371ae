// `kiln plan`: what a training step needs in memory, predicted by running the real model code on
// the meta device (shapes only, no data, no kernels): parameters, gradients, optimizer state,
// activations kept for backward (per block), workspace and the peak; whether it fits a memory,
// and the largest micro-batch that does. `kiln train --micro-batch auto` asks it too.
#pragma once
#include <CLI/CLI.hpp>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "engine/tensor.h"

namespace kiln::tools {

struct TrainConfig;  // tools/train.h
// kiln train's defaults that depend on the model (tools/train_config.cpp, which apply_model_defaults
// applies to the flags not given): BERT (a token model) trains with AdamW, lr 5e-4, weight decay 0.01,
// a linear schedule and batch 32; ResNet with the flags' defaults. `kiln plan` takes its optimizer.
TrainConfig model_defaults(const std::string& model);

struct PlanOptions {
  std::string model = "resnet20";
  std::vector<std::string> sets;
  int64_t batch = 0;  // the effective batch (0: the model family's default, as kiln bench train)
  int64_t seq_len = 128, image_size = 0, in_channels = 0;
  bool seq_len_given = false;  // not a flag: --seq-len was given (a ResNet plan refuses it)
  std::string amp = "off", recompute = "none";
  std::string optimizer;  // empty: kiln train's default for the model (model_defaults: adamw for BERT, else sgd)
  int ranks = 1, zero = 0;
  // With several ranks: the gradient buckets go out after the last micro-batch's backward (kiln train
  // --micro-batch auto, where every rank first learns whether one ran out of memory), not during it.
  bool reduce_after_backward = false;
  // Micro-batches per optimizer step: past 1, the gradients of the first are held while the next
  // run forward and backward (largest_micro_batch sets it to batch / micro-batch).
  int64_t accum_steps = 1;
  std::string memory;          // "16GiB", "512MiB" (empty: the device's, for --device cuda:N)
  std::string device = "cpu";  // what is planned for: cpu, cuda, cuda:N
  std::string json;
};

// The bytes of one step at one micro-batch, every figure from running the step on meta tensors; with
// several ranks (or ZeRO), the run's DataParallel or ZeroRedundancy runs in it over a communicator of
// `ranks` ranks whose collectives allocate what the run's do (tools/plan.cpp).
struct MemoryPlan {
  int64_t micro_batch = 0;
  int64_t num_parameters = 0;
  size_t parameters = 0, buffers = 0, gradients = 0, optimizer_state = 0, master_copies = 0, comm_buffers = 0,
         activations = 0, workspace = 0, peak = 0;
  std::vector<std::pair<std::string, size_t>> blocks;  // activations kept per block, largest first
  // Planned for a GPU: whether the workspace holds what cuDNN picks for each convolution (asked of a
  // device of this process), or leaves it out (no device to ask). cuBLASLt's is always in.
  bool gpu = false, cudnn_asked = false;
  // The batch norms of a training step: how many, how many normalise fewer than kFewNormValues values
  // per channel (N x H x W), and the fewest any normalises.
  int norms = 0, small_norms = 0;
  int64_t fewest_norm_values = 0;
  nlohmann::json to_json() const;
};
// Below this many values per channel a batch norm's statistics are mostly noise: ResNet-18 at a
// micro-batch of 2 on 16 px images (ten batch norms over 2 values each) reaches NaN in one step, in
// torch as in Kiln.
constexpr int64_t kFewNormValues = 16;
// A sentence on p's batch norms below kFewNormValues values per channel, "" when none; `remedy` says
// what gives them more ("a larger micro-batch or --image-size").
std::string small_norms_note(const MemoryPlan& p, const std::string& remedy);

// Tensor bytes held on a device now and at most since the last reset: the CPU allocator's count,
// the meta device's, or cuda:N's caching allocator (bytes handed out, before its rounding).
HostMemoryStats memory_stats(Device dev);
void reset_memory_peak(Device dev);
// Runs two training steps of o.model at `micro_batch` on `dev` (meta: predicted; cpu: measured by
// counting the CPU allocator; cuda:N: measured by the device's caching allocator, its bytes handed
// out before rounding) and returns the second step's memory.
MemoryPlan step_memory(const PlanOptions& o, int64_t micro_batch, Device dev);
// The plan on meta for the device o.device names.
MemoryPlan plan_memory(const PlanOptions& o, int64_t micro_batch);
// Whether a plan fits `memory` bytes on `device` (a GPU also needs its context and the caching
// allocator's rounding: 12.5% and 512 MiB of headroom).
bool plan_fits(const MemoryPlan& p, size_t memory, Device device);
// The bytes a plan needs past `memory` on `device` by plan_fits's rule (0 when it fits): with a
// GPU's headroom this can be positive while the peak alone is below `memory`.
size_t plan_shortfall(const MemoryPlan& p, size_t memory, Device device);
// The largest divisor of `batch` whose plan fits (0 when even 1 does not), with that plan: a divisor
// below `batch` is planned as o.accum_steps x batch / divisor micro-batches with their gradients held.
// `reserve_per_sample` bytes per sample of a candidate micro-batch are taken off `memory` for it
// first (the data loader's batches in flight, which grow with the micro-batch).
std::pair<int64_t, MemoryPlan> largest_micro_batch(const PlanOptions& o, int64_t batch, size_t memory, Device device,
                                                   size_t reserve_per_sample = 0);
// `memory` less `reserve_per_sample` bytes for each of `micro_batch` samples (0 when they take all of it).
size_t memory_after_reserve(size_t memory, size_t reserve_per_sample, int64_t micro_batch);
// The most values a planned step's largest tensor may hold: past 2^52 (16 PiB of f32) the byte counts
// of a step's tensors, summed, could overflow 64 bits; no machine holds such a step anyway.
inline constexpr int64_t kMaxPlannedValues = int64_t(1) << 52;
// An upper bound on the values per sample of the largest tensor of a step of o.model.
int64_t values_per_sample(const PlanOptions& o);
// An error naming `flag` when a step of `batch` samples has a tensor past kMaxPlannedValues.
void check_batch_size(const PlanOptions& o, int64_t batch, const std::string& flag);
// "16GiB", "16 GB", "512MiB", "1.5G", a plain byte count; an error names `flag` otherwise, or for
// 2^64 bytes or more.
size_t parse_bytes(const std::string& s, const std::string& flag);
using detail::mib;  // "12.5 MiB" (base/error.h)
// The memory this process can have: the machine's (/proc/meminfo) and the limits of its cgroup and
// the cgroups above it (a container's --memory, a job's slice), v2 (memory.max) or v1
// (memory.limit_in_bytes), found through /proc/self/mountinfo and /proc/self/cgroup (base/cgroup.h
// cgroup_dirs, which the CPU quota reads through too); 0 when unknown.
struct HostMemory {
  size_t total = 0;         // MemTotal
  size_t available = 0;     // MemAvailable: what the host can give without swapping
  size_t cgroup_limit = 0;  // the limit that leaves the least (0: no limit below the machine's memory)
  size_t cgroup_used = 0;   // that cgroup's working set: its usage less the page cache it can drop (inactive_file)
  std::string cgroup_file;  // that limit's file, for messages
  // What a new allocation can count on: MemAvailable, and under a limit no more than it leaves.
  size_t usable() const;
};
// `mountinfo` and `self_cgroup` are /proc/self/mountinfo and /proc/self/cgroup; tests give others.
HostMemory host_memory(const std::string& meminfo = "/proc/meminfo",
                       const std::string& mountinfo = "/proc/self/mountinfo",
                       const std::string& self_cgroup = "/proc/self/cgroup");

void add_plan_flags(CLI::App& app, PlanOptions& o);
int run_plan(const PlanOptions& o);

}  // namespace kiln::tools
