#include "tools/plan.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>

#include "base/cgroup.h"
#include "engine/autocast.h"
#include "engine/autograd.h"
#include "engine/dist.h"
#include "engine/nn.h"
#include "engine/optim.h"
#include "engine/random.h"
#include "engine/zero.h"
#include "io/json_text.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/device_memory.h"
#include "kernels/cuda/runtime_info.h"
#include "tools/cli_checks.h"
#include "tools/train.h"
#include "tools/zoo.h"

namespace kiln::tools {

size_t parse_bytes(const std::string& s, const std::string& flag) {
  // A decimal number (no hex, inf or nan: stod would take them), then an optional unit.
  size_t i = 0;
  while (i < s.size() && s[i] == ' ') ++i;
  const size_t num_begin = i;
  if (i < s.size() && (s[i] == '-' || s[i] == '+')) ++i;
  const size_t digits_begin = i;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  const bool has_digits = i > digits_begin && s.find_first_of("0123456789", digits_begin) < i;
  if (has_digits && i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    size_t j = i + 1;
    if (j < s.size() && (s[j] == '-' || s[j] == '+')) ++j;
    if (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) {
      while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j;
      i = j;
    }
  }
  double v = 0;
  bool number = has_digits;
  if (number) try {
      size_t used = 0;
      v = std::stod(s.substr(num_begin, i - num_begin), &used);
      number = used == i - num_begin;
    } catch (const std::exception&) {
      number = false;
    }
  std::string unit = s.substr(i);
  unit.erase(std::remove(unit.begin(), unit.end(), ' '), unit.end());
  for (char& c : unit) c = char(std::tolower(static_cast<unsigned char>(c)));
  // KiB, MiB, GiB, TiB, Kubernetes' Ki, Mi, Gi, Ti and the bare K, M, G, T are powers of 1024; kB, MB,
  // GB, TB powers of 1000.
  double scale = 0;
  if (unit.empty() || unit == "b")
    scale = 1;
  else if (unit == "k" || unit == "ki" || unit == "kib")
    scale = 1024.0;
  else if (unit == "m" || unit == "mi" || unit == "mib")
    scale = 1024.0 * 1024;
  else if (unit == "g" || unit == "gi" || unit == "gib")
    scale = 1024.0 * 1024 * 1024;
  else if (unit == "t" || unit == "ti" || unit == "tib")
    scale = 1024.0 * 1024 * 1024 * 1024;
  else if (unit == "kb")
    scale = 1e3;
  else if (unit == "mb")
    scale = 1e6;
  else if (unit == "gb")
    scale = 1e9;
  else if (unit == "tb")
    scale = 1e12;
  KILN_CHECK(number && scale > 0 && std::isfinite(v), flag, " ", s,
             ": expected an amount of memory such as 16GiB, 512MiB, 1.5G or 8GB (KiB/MiB/GiB/TiB, Ki/Mi/Gi/Ti "
             "and K/M/G/T are powers of 1024, kB/MB/GB/TB of 1000)");
  KILN_CHECK(v > 0, flag, " ", s, ": must be positive");
  // 2^64 bytes and more do not fit a size (the conversion would be undefined, in practice ignored).
  KILN_CHECK(v * scale < 18446744073709551616.0, flag, " ", s,
             ": more than 16 EiB (2^64 bytes), the most a memory size can be");
  KILN_CHECK(v * scale >= 1, flag, " ", s, ": less than one byte");
  return size_t(v * scale);
}

namespace {

// A cgroup file's number; "max" (v2's no limit) and unreadable files are 0.
size_t read_cgroup_number(const std::string& path) {
  std::ifstream f(path);
  std::string v;
  if (!(f >> v) || v.empty() || !std::isdigit(static_cast<unsigned char>(v[0]))) return 0;
  try {
    return size_t(std::stoull(v));
  } catch (const std::exception&) {
    return 0;
  }
}

// A key's number in a cgroup's memory.stat ("inactive_file 123"), or 0.
size_t read_stat(const std::string& path, const std::string& key) {
  std::ifstream f(path);
  std::string k;
  size_t v = 0;
  while (f >> k >> v)
    if (k == key) return v;
  return 0;
}

}  // namespace

size_t HostMemory::usable() const {
  if (cgroup_limit == 0) return available;
  const size_t left = cgroup_limit > cgroup_used ? cgroup_limit - cgroup_used : 0;
  return available == 0 ? left : std::min(available, left);
}

HostMemory host_memory(const std::string& meminfo, const std::string& mountinfo, const std::string& self_cgroup) {
  HostMemory m;
  {
    std::ifstream f(meminfo);
    std::string key, unit;
    size_t kib = 0;
    while (f >> key >> kib >> unit) {
      if (key == "MemTotal:") m.total = kib << 10;
      if (key == "MemAvailable:") m.available = kib << 10;
    }
  }
  // The memory controller's cgroups over this process, its own first (base/cgroup.h): v1's where a
  // hierarchy names "memory" (also co-mounted, "cpu,memory"), else v2's (hybrid hosts mount it at
  // /sys/fs/cgroup/unified beside v1's).
  const CgroupDirs c = cgroup_dirs(
      [&](const std::string& path) {
        return read_small_file(path == "/proc/self/mountinfo" ? mountinfo
                               : path == "/proc/self/cgroup"  ? self_cgroup
                                                              : path);
      },
      "memory");
  if (c.version == 0) return m;
  const bool use_v1 = c.version == 1;
  const char* limit_file = use_v1 ? "memory.limit_in_bytes" : "memory.max";
  const char* usage_file = use_v1 ? "memory.usage_in_bytes" : "memory.current";
  const char* inactive_key = use_v1 ? "total_inactive_file" : "inactive_file";
  // Every cgroup on the way up limits this process: the one that leaves the least counts. Its usage
  // counts the page cache, which the kernel drops before it fails an allocation: the working set
  // (usage less inactive_file, as docker and kubernetes count it) is what holds memory.
  size_t least_left = 0;
  for (const std::string& dir : c.dirs) {
    const size_t lim = read_cgroup_number(dir + "/" + limit_file);
    // v1 writes "no limit" as a page-rounded 2^63: a limit past the machine's memory limits nothing.
    if (lim > 0 && (m.total == 0 || lim < m.total)) {
      const size_t usage = read_cgroup_number(dir + "/" + usage_file);
      const size_t inactive = read_stat(dir + "/memory.stat", inactive_key);
      const size_t used = usage > inactive ? usage - inactive : 0;
      const size_t left = lim > used ? lim - used : 0;
      if (m.cgroup_limit == 0 || left < least_left) {
        least_left = left;
        m.cgroup_limit = lim;
        m.cgroup_used = used;
        m.cgroup_file = dir + "/" + limit_file;
      }
    }
  }
  return m;
}

nlohmann::json MemoryPlan::to_json() const {
  nlohmann::json b = nlohmann::json::array();
  for (const auto& [n, bytes] : blocks) b.push_back({{"block", n}, {"bytes", bytes}});
  return {{"micro_batch", micro_batch},
          {"num_parameters", num_parameters},
          {"parameters", parameters},
          {"buffers", buffers},
          {"gradients", gradients},
          {"optimizer_state", optimizer_state},
          {"master_copies", master_copies},
          {"comm_buffers", comm_buffers},
          {"activations", activations},
          {"workspace", workspace},
          {"cudnn_workspace_counted", gpu ? nlohmann::json(cudnn_asked) : nlohmann::json()},
          {"peak", peak},
          {"blocks", b},
          {"batch_norms", norms},
          {"batch_norms_below_16_values", small_norms},
          {"fewest_batch_norm_values", fewest_norm_values}};
}

std::string small_norms_note(const MemoryPlan& p, const std::string& remedy) {
  if (p.small_norms == 0) return "";
  return std::to_string(p.small_norms) + " of the model's " + std::to_string(p.norms) +
         " batch norms normalise fewer than " + std::to_string(kFewNormValues) +
         " values per channel at a micro-batch of " + std::to_string(p.micro_batch) +
         " (the fewest: " + std::to_string(p.fewest_norm_values) +
         "): their batch statistics are mostly noise and training can diverge to NaN; " + remedy + " gives them more";
}

namespace {
// The batch norms' values per channel after a training forward, into p's counts.
void count_norms(const nn::Module& m, MemoryPlan& p) {
  if (const auto* bn = dynamic_cast<const nn::BatchNorm2d*>(&m); bn && bn->values_per_channel > 0) {
    ++p.norms;
    if (bn->values_per_channel < kFewNormValues) ++p.small_norms;
    if (p.fewest_norm_values == 0 || bn->values_per_channel < p.fewest_norm_values)
      p.fewest_norm_values = bn->values_per_channel;
  }
  for (const auto& [name, child] : m.children()) count_norms(*child, p);
}
}  // namespace

HostMemoryStats memory_stats(Device dev) {
  if (dev.is_cuda()) {  // the device's caching allocator: bytes handed out, before its rounding
    const AllocatorStats a = cuda::device_allocator(dev.index).stats();
    HostMemoryStats s;
    s.allocated = a.allocated;
    s.peak_allocated = a.peak_allocated;
    return s;
  }
  return dev.is_meta() ? meta_memory_stats() : cpu_memory_stats();
}

void reset_memory_peak(Device dev) {
  if (dev.is_cuda())
    cuda::device_allocator(dev.index).reset_peaks();
  else if (dev.is_meta())
    reset_meta_memory_peak();
  else
    reset_cpu_memory_peak();
}

namespace {

class DoneWork final : public dist::Work {
 public:
  void wait() override {}
  bool done() override { return true; }
};

// The collectives of `ranks` ranks as rank 0 sees them, every rank holding the same values, so that
// DataParallel and ZeroRedundancy run their own bucket code in a plan (on meta tensors: shapes only)
// and allocate what they allocate in a run. Each collective completes as it is issued, as when the
// ranks keep step; it allocates what the run's communicator takes for it: Kiln's TCP ring (kiln
// launch, CPU ranks) reduce-scatters in a copy of its input; NCCL (GPU ranks) works in place.
class PlanCommunicator final : public dist::Communicator {
 public:
  PlanCommunicator(int ranks, bool copies_reduce_scatter_input) : ranks_(ranks), copies_(copies_reduce_scatter_input) {}
  int rank() const override { return 0; }
  int world_size() const override { return ranks_; }
  const char* backend() const override { return "plan"; }
  std::shared_ptr<dist::Work> all_reduce_async(const Tensor& t, dist::ReduceOp op) override {
    if (op == dist::ReduceOp::sum && has_values(t)) {
      NoGradGuard no_grad;
      Tensor(t).mul_(double(ranks_));
    }
    return std::make_shared<DoneWork>();
  }
  void broadcast(const Tensor&, int) override {}  // rank 0's values are everyone's
  void all_gather(const Tensor& in, const Tensor& out) override {
    if (!has_values(out)) return;
    NoGradGuard no_grad;
    const Tensor flat = Tensor(out).view({out.numel()}), block = in.reshape({in.numel()});
    for (int r = 0; r < ranks_; ++r) flat.narrow(0, r * in.numel(), in.numel()).copy_(block);
  }
  void reduce_scatter(const Tensor& in, const Tensor& out, dist::ReduceOp op) override {
    reduce_scatter_async(in, out, op)->wait();
  }
  std::shared_ptr<dist::Work> reduce_scatter_async(const Tensor& in, const Tensor& out, dist::ReduceOp op) override {
    NoGradGuard no_grad;
    Tensor work = copies_ ? in.clone() : in;  // held while the collective runs
    if (has_values(out)) {
      Tensor(out).copy_(work.reshape({work.numel()}).narrow(0, 0, out.numel()).reshape(out.shape()));
      if (op == dist::ReduceOp::sum) Tensor(out).mul_(double(ranks_));
    }
    return std::make_shared<DoneWork>();
  }
  void barrier() override {}

 private:
  static bool has_values(const Tensor& t) { return !t.device().is_meta(); }
  int ranks_;
  bool copies_;
};

}  // namespace

MemoryPlan step_memory(const PlanOptions& o, int64_t micro_batch, Device dev) {
  std::vector<std::string> sets = o.sets;
  if (o.recompute == "blocks") sets.push_back("recompute=1");
  const std::optional<DType> low = amp_dtype(o.amp);
  MemoryPlan p;
  p.micro_batch = micro_batch;
  const size_t base = memory_stats(dev).allocated;
  struct KeepRandomStream {  // a plan inside a run must not move the run's random stream
    Generator saved = default_generator();
    ~KeepRandomStream() { default_generator() = saved; }
  } keep;
  manual_seed(1);
  SyntheticStep st = synthetic_step(o.model, micro_batch, o.seq_len, o.image_size, o.in_channels, sets, dev);
  st.model->train();
  for (const auto& [n, t] : st.model->named_parameters()) {
    p.parameters += t.nbytes();
    p.num_parameters += t.numel();
  }
  for (const auto& [n, t] : st.model->named_buffers()) p.buffers += t.nbytes();
  TrainConfig tc = model_defaults(o.model);
  if (!o.optimizer.empty()) tc.optimizer = o.optimizer;
  // The gradient each parameter ends backward with (the ZeRO buckets take them over as they come).
  const std::vector<Tensor> params = st.model->parameters();
  std::vector<size_t> grad_bytes(params.size(), 0);
  std::vector<int> grad_hooks;
  for (size_t k = 0; k < params.size(); ++k)
    grad_hooks.push_back(Tensor(params[k]).register_grad_ready_hook(
        [&grad_bytes, k](Tensor& leaf) { grad_bytes[k] = leaf.grad().defined() ? leaf.grad().nbytes() : 0; }));
  // Several ranks (or ZeRO on one): the run's own DataParallel or ZeroRedundancy over a communicator
  // of o.ranks ranks, built as kiln train builds them, so their buckets, shards and collectives'
  // buffers are allocated and released when the run's are.
  std::optional<PlanCommunicator> comm;
  std::unique_ptr<dist::ZeroRedundancy> zero;
  std::unique_ptr<dist::DataParallel> dp;
  std::vector<optim::ParamGroup> groups = optim::decay_groups(st.model->named_parameters(), tc.lr, tc.weight_decay);
  if (o.ranks > 1 || o.zero == 1) comm.emplace(o.ranks, o.ranks > 1 && !Device::parse(o.device).is_cuda());
  const size_t before_comm = memory_stats(dev).allocated;
  if (o.zero == 1) {
    zero = std::make_unique<dist::ZeroRedundancy>(*st.model, groups, *comm);
    groups = zero->shard_groups();
  } else if (o.ranks > 1) {
    dp = std::make_unique<dist::DataParallel>(*st.model, *comm);
  }
  {  // DataParallel's flat gradient buckets; ZeRO's flat parameters' padding (the parameters move in)
    const size_t now = memory_stats(dev).allocated;
    p.comm_buffers = now > before_comm ? now - before_comm : 0;
  }
  std::unique_ptr<optim::Optimizer> opt = make_optimizer(tc, groups);
  // With accumulation every micro-batch after the first runs forward and backward while the gradients
  // of those before are held: the step is planned as two micro-batches, the second with them in place
  // (the peak of any later one is the same).
  const int micro_batches = o.accum_steps > 1 ? 2 : 1;
  for (int step = 0; step < 2; ++step) {  // the second step runs with the optimizer state in place
    opt->zero_grad();
    if (zero) zero->zero_grad();
    if (step == 1) {
      reset_memory_peak(dev);
      p.blocks.clear();
    }
    for (int k = 0; k < micro_batches; ++k) {
      if (k > 0) p.blocks.clear();
      // The buckets go out during the last micro-batch's backward, or all after it (finish()).
      const bool sync = !o.reduce_after_backward && k == micro_batches - 1;
      if (dp) dp->set_sync(sync);
      if (zero) zero->set_sync(sync);
      const size_t before = memory_stats(dev).allocated;
      std::vector<std::pair<std::string, size_t>> open;
      nn::set_block_observer([&](const std::string& name, bool begin) {
        const size_t now = memory_stats(dev).allocated;
        if (begin) {
          open.emplace_back(name, now);
        } else if (!open.empty() && open.back().first == name) {
          p.blocks.emplace_back(name, now > open.back().second ? now - open.back().second : 0);
          open.pop_back();
        }
      });
      Tensor loss;
      {
        // removed however the forward ends: a plan that throws (a micro-batch the model cannot train
        // on) must not leave this thread an observer of this frame's locals
        struct Unobserve {
          ~Unobserve() { nn::set_block_observer({}); }
        } unobserve;
        amp::AutocastGuard autocast(low.value_or(DType::f16), low.has_value());
        loss = st.loss();
      }
      const size_t after = memory_stats(dev).allocated;
      p.activations = after > before ? after - before : 0;
      loss.backward();
      loss = Tensor();
    }
    p.gradients = 0;
    for (size_t b : grad_bytes) p.gradients += b;
    if (dp) dp->finish();
    if (zero) zero->finish();
    const size_t before_step = memory_stats(dev).allocated;
    opt->step();
    if (step == 0) {  // the state the first step creates (state() would read the step count)
      const size_t now = memory_stats(dev).allocated;
      p.optimizer_state = now > before_step ? now - before_step : 0;
    }
    if (zero) zero->gather();
  }
  for (size_t k = 0; k < params.size(); ++k) Tensor(params[k]).remove_grad_ready_hook(grad_hooks[k]);
  count_norms(*st.model, p);
  const size_t peak = memory_stats(dev).peak_allocated;
  p.peak = peak > base ? peak - base : 0;
  std::stable_sort(p.blocks.begin(), p.blocks.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  const size_t held = p.parameters + p.buffers + p.optimizer_state + p.comm_buffers + p.activations;
  p.workspace = p.peak > held ? p.peak - held : 0;
  return p;
}

MemoryPlan plan_memory(const PlanOptions& o, int64_t micro_batch) {
  const Device target = Device::parse(o.device);
  // A GPU of this process answers what its cuDNN would pick for each convolution.
  const int ask = target.is_cuda() && target.index < cuda::device_count() ? target.index : -1;
  struct Like {
    Like(bool gpu, int ask) { set_meta_like_gpu(gpu, ask); }
    ~Like() { set_meta_like_gpu(false); }
  } like(target.is_cuda(), ask);
  MemoryPlan p = step_memory(o, micro_batch, kMeta);
  p.gpu = target.is_cuda();
  p.cudnn_asked = ask >= 0;
  return p;
}

namespace {
// What a plan needs of `device`'s memory: the peak, and on a GPU its headroom.
double plan_needs(const MemoryPlan& p, Device device) {
  if (!device.is_cuda()) return double(p.peak);
  return double(p.peak) * 1.125 + double(size_t(512) << 20);
}
}  // namespace

bool plan_fits(const MemoryPlan& p, size_t memory, Device device) {
  if (!device.is_cuda()) return p.peak <= memory;  // exact: a double would round bytes past 2^53
  return plan_needs(p, device) <= double(memory);
}

size_t plan_shortfall(const MemoryPlan& p, size_t memory, Device device) {
  if (plan_fits(p, memory, device)) return 0;
  if (!device.is_cuda()) return p.peak - memory;
  return std::max<size_t>(1, size_t(std::ceil(plan_needs(p, device) - double(memory))));
}

size_t memory_after_reserve(size_t memory, size_t reserve_per_sample, int64_t micro_batch) {
  if (reserve_per_sample == 0 || micro_batch <= 0) return memory;
  if (size_t(micro_batch) > memory / reserve_per_sample) return 0;  // also where the product would overflow
  return memory - reserve_per_sample * size_t(micro_batch);
}

std::pair<int64_t, MemoryPlan> largest_micro_batch(const PlanOptions& o, int64_t batch, size_t memory, Device device,
                                                   size_t reserve_per_sample) {
  auto fits = [&](const MemoryPlan& p) {
    return plan_fits(p, memory_after_reserve(memory, reserve_per_sample, p.micro_batch), device);
  };
  // The divisors in order, in O(sqrt(batch)) (a loop to `batch` took minutes for --batch 1e12).
  std::vector<int64_t> divisors, upper;
  for (int64_t d = 1; d <= batch / d; ++d)
    if (batch % d == 0) {
      divisors.push_back(d);
      if (d != batch / d) upper.push_back(batch / d);
    }
  divisors.insert(divisors.end(), upper.rbegin(), upper.rend());
  // A micro-batch the model cannot train on (batch norm needs more than one value per channel: a
  // ResNet's last 1x1 stage at a micro-batch of 1) does not fit either. Those are the smallest
  // divisors: the search starts past them, and with none left the model's own error says why.
  auto trainable = [&](size_t i, MemoryPlan& p) {
    PlanOptions q = o;  // below the batch, the micro-batches of one step accumulate their gradients
    if (divisors[i] < batch) q.accum_steps = o.accum_steps * (batch / divisors[i]);
    try {
      p = plan_memory(q, divisors[i]);
      return true;
    } catch (const Interrupted&) {
      throw;  // Ctrl-C (Python's) ends the search; it is not a micro-batch the model cannot train on
    } catch (const Error& e) {
      if (i + 1 == divisors.size())
        KILN_FAIL("--batch ", batch, ": the model cannot train on any micro-batch of it (", e.message(), ")");
      return false;
    }
  };
  int64_t lo = 0, hi = int64_t(divisors.size()) - 1;
  MemoryPlan smallest;
  while (!trainable(size_t(lo), smallest)) ++lo;
  // The whole batch holds no gradients across micro-batches, so it may fit where half of it with
  // accumulation does not: asked first. Below it memory grows with the micro-batch: bisect.
  std::pair<int64_t, MemoryPlan> best{0, smallest};  // none fits: what the smallest trainable one needs
  if (o.accum_steps == 1 && lo < hi) {
    MemoryPlan whole = plan_memory(o, batch);
    if (fits(whole)) return {batch, whole};
    --hi;
  }
  if (!fits(smallest)) return best;
  while (lo <= hi) {
    const int64_t mid = (lo + hi) / 2;
    MemoryPlan p;
    if (trainable(size_t(mid), p) && fits(p)) {
      best = {divisors[size_t(mid)], p};
      lo = mid + 1;
    } else {
      hi = mid - 1;
    }
  }
  return best;
}

void add_plan_flags(CLI::App& app, PlanOptions& o) {
  app.add_option("--model", o.model, "One of " + model_names_text())->capture_default_str();
  app.add_option("--set", o.sets, "Override a model config field, key=value (repeatable)");
  app.add_option("--batch", o.batch,
                 "The batch of one optimizer step (default: 128 small-image ResNets, 32 ImageNet "
                 "ResNets and BERT)")
      ->check(at_least(0));
  app.add_option("--seq-len", o.seq_len, "BERT: tokens per sequence")
      ->check(at_least(1))
      ->each([&o](const std::string&) { o.seq_len_given = true; })
      ->capture_default_str();
  app.add_option("--image-size", o.image_size, "ResNet: image side (default 32 small-image, 224 ImageNet)")
      ->check(at_least(0));
  app.add_option("--in-channels", o.in_channels,
                 "ResNet: image channels (default 0: the model config's, 3 unless --set in_channels=N)")
      ->check(at_least(0));
  app.add_option("--amp", o.amp, "off, fp16 or bf16")
      ->check(CLI::IsMember({"off", "fp16", "bf16"}))
      ->capture_default_str();
  app.add_option("--optimizer", o.optimizer,
                 "sgd (momentum), adamw or lamb (default: kiln train's for the model: sgd; adamw for BERT models)")
      ->check(CLI::IsMember({"sgd", "adamw", "lamb"}));
  app.add_option("--recompute", o.recompute, "none or blocks")
      ->check(CLI::IsMember({"none", "blocks"}))
      ->capture_default_str();
  app.add_option("--accum-steps", o.accum_steps,
                 "Micro-batches of --batch per optimizer step, as kiln train's: their gradients are held across "
                 "them")
      ->check(at_least(1))
      ->capture_default_str();
  app.add_option("--ranks", o.ranks, "Data-parallel processes")->check(between(1, 65536))->capture_default_str();
  app.add_option("--zero", o.zero, "0, or 1: ZeRO stage 1 over the ranks")->check(between(0, 1))->capture_default_str();
  app.add_option("--memory", o.memory,
                 "The memory to fit, e.g. 16GiB or 16GB (GiB/G: 2^30 bytes, GB: 10^9); default: the device's, with "
                 "--device cuda:N. Exit code 3 when not even a micro-batch of 1 fits it");
  app.add_option("--device", o.device,
                 "What to plan for: cpu, or cuda / cuda:N (GPU layouts and headroom; with no "
                 "--memory, that GPU's memory)")
      ->capture_default_str();
  app.add_option("--json", o.json, "Also write the plan as JSON here");
}

int64_t values_per_sample(const PlanOptions& o) {
  const ModelFamily& family = model_family(o.model);
  if (family.input == ModelInput::images) {
    const models::ResNetConfig rc = resnet_config_from(o.model, o.sets);
    const bool imagenet = !(o.model == "resnet20" || o.model == "resnet32" || o.model == "resnet44" ||
                            o.model == "resnet56" || o.model == "resnet110");
    const int64_t s = o.image_size > 0 ? o.image_size : imagenet ? 224 : 32;
    // The widest activation holds 16 values per input pixel (16 channels at full size in the small
    // ResNets; 64 at half size or 256 at a quarter in the ImageNet ones), or the input if wider.
    const double values =
        double(std::max<int64_t>(16, o.in_channels > 0 ? o.in_channels : rc.in_channels)) * double(s) * double(s);
    return values >= 0x1p63 ? std::numeric_limits<int64_t>::max() : int64_t(values);
  }
  const models::BertConfig bc = bert_config_from(parse_bert_name(o.model).size, o.sets);
  // In doubles: a --seq-len of 2^40 would overflow the product (past 2^63 it saturates, and is refused
  // by check_batch_size as past kMaxPlannedValues).
  const double values = double(o.seq_len) * std::max({double(bc.hidden_size), double(bc.intermediate_size),
                                                      double(bc.vocab_size), double(bc.num_heads) * double(o.seq_len)});
  return values >= 0x1p63 ? std::numeric_limits<int64_t>::max() : int64_t(values);
}

void check_batch_size(const PlanOptions& o, int64_t batch, const std::string& flag) {
  const int64_t per_sample = values_per_sample(o);
  // Only a --seq-len of 0 or less gives none (images hold at least one pixel): it would divide by zero
  // below (SIGFPE), or pass a negative count. Callers check the flag first; this is the last guard.
  KILN_CHECK(per_sample > 0, "--seq-len ", o.seq_len, ": a sample of --model ", o.model, " would hold ", per_sample,
             " values, so ", flag, " ", batch, " cannot be sized; give a --seq-len of at least 1");
  KILN_CHECK(per_sample <= kMaxPlannedValues && batch <= kMaxPlannedValues / per_sample, flag, " ", batch,
             ": a step's largest tensor would hold about ", double(batch) * double(per_sample), " values (", per_sample,
             " per sample), more than the 2^52 a plan counts (sizes past that overflow); give a smaller ", flag);
}

int run_plan(const PlanOptions& given) {
  PlanOptions o = given;
  if (o.optimizer.empty()) o.optimizer = model_defaults(o.model).optimizer;  // as kiln train would run
  // The flags' checks: exit 2 before any planning.
  try {
    const ModelFamily& f = model_family(o.model);
    Device d = kCPU;
    try {
      d = Device::parse(o.device);
    } catch (const Error&) {
      KILN_FAIL("--device ", o.device, ": expected cpu, cuda or cuda:N");
    }
    KILN_CHECK(!d.is_meta(), "--device meta: plan for the device the run will use (cpu, cuda or cuda:N)");
    if (!o.memory.empty()) parse_bytes(o.memory, "--memory");
    // The model's config (--set's fields, each named when out of range) before any planning builds it.
    if (f.input == ModelInput::images) resnet_config_from(o.model, o.sets);
    // A flag of the other family would be dropped from the plan: refused, as kiln train refuses it.
    KILN_CHECK(!(f.input == ModelInput::images && o.seq_len_given), "--seq-len: for BERT models; --model ", o.model,
               " reads images (--image-size)");
    KILN_CHECK(!(f.input == ModelInput::tokens && (o.image_size > 0 || o.in_channels > 0)),
               o.image_size > 0 ? "--image-size" : "--in-channels", ": for ResNet models; --model ", o.model,
               " reads text (--seq-len)");
    if (f.input == ModelInput::tokens) {
      const models::BertConfig bc = bert_config_from(parse_bert_name(o.model).size, o.sets);
      KILN_CHECK(o.seq_len <= bc.max_position, "--seq-len ", o.seq_len, ": more than the ", bc.max_position,
                 " positions --model ", o.model, " has (--set max_position=N for more)");
    }
    KILN_CHECK(!(o.zero == 1 && o.optimizer == "lamb"),
               "--zero 1 with --optimizer lamb: LAMB's trust ratio needs whole tensors (use adamw or sgd)");
    if (o.batch > 0) check_batch_size(o, o.batch, "--batch");
  } catch (const Error& e) {
    std::fprintf(stderr, "kiln plan: error: %s\n", e.message().c_str());
    return 2;
  }
  const ModelFamily& family = model_family(o.model);
  const Device target = Device::parse(o.device);
  size_t memory = 0;
  std::string memory_from;
  if (!o.memory.empty()) {
    memory = parse_bytes(o.memory, "--memory");
    memory_from = "--memory " + o.memory;
  } else if (target.is_cuda()) {
    const cuda::RuntimeInfo info = cuda::query_runtime();
    KILN_CHECK(target.index < int(info.devices.size()), "--device ", o.device, ": ", info.devices.size(),
               " CUDA device(s) visible", info.error.empty() ? "" : " (" + info.error + ")",
               "; give the memory to plan for with --memory 16GiB");
    memory = info.devices[size_t(target.index)].total_bytes;
    memory_from = o.device + " (" + info.devices[size_t(target.index)].name + ")";
  }
  const int64_t batch = o.batch > 0 ? o.batch : synthetic_step(o.model, 0, 1, 1, 0, o.sets, kMeta).batch;
  check_batch_size(o, batch, "--batch");
  // A batch the model cannot train on (batch norm over one value per channel) is a flag error too;
  // found only by planning it.
  MemoryPlan p;
  try {
    p = plan_memory(o, batch);
  } catch (const Error& e) {
    std::fprintf(stderr, "kiln plan: error: --batch %lld: the model cannot train on it (%s)\n", (long long)batch,
                 e.message().c_str());
    return 2;
  }
  const bool images = family.input == ModelInput::images;
  std::printf("kiln plan: %s, batch %lld%s, %s, amp %s, recompute %s, %d rank(s)%s, for %s%s\n", o.model.c_str(),
              (long long)batch, images ? "" : (" x " + std::to_string(o.seq_len) + " tokens").c_str(),
              o.optimizer.c_str(), o.amp.c_str(), o.recompute.c_str(), o.ranks,
              o.ranks > 1 ? (o.zero ? " with ZeRO-1" : " data parallel") : "", target.is_cuda() ? "a GPU" : "the CPU",
              " (the model's own code on meta tensors: shapes, no data)");
  auto row = [](const char* what, size_t bytes, const std::string& note) {
    std::printf("  %-22s %12s   %s\n", what, mib(bytes).c_str(), note.c_str());
  };
  row("parameters", p.parameters, std::to_string(p.num_parameters) + " f32 values");
  row("buffers", p.buffers, "batch-norm statistics and the like");
  row("gradients", p.gradients, "made by backward: at the peak they are in the workspace row, not added");
  row("optimizer state", p.optimizer_state, o.ranks > 1 && o.zero ? "this rank's 1/" + std::to_string(o.ranks) : "");
  row("f32 master copies", p.master_copies, "none: weights stay f32; autocast's 16-bit copies are activations");
  row("communication", p.comm_buffers,
      o.zero        ? "the flat buckets' padding (the parameters move into them); the gradients' buckets, the "
                      "reduce-scatter's copy and this rank's averaged 1/N are in the workspace row"
      : o.ranks > 1 ? "the gradient buckets' flat f32 copy, held throughout"
                    : "one process");
  row("activations", p.activations, "kept for backward; by block, largest first:");
  size_t shown = 0;
  for (const auto& [n, b] : p.blocks) {
    if (shown++ == 8) {
      std::printf("    ... %zu more blocks\n", p.blocks.size() - 8);
      break;
    }
    std::printf("    %-20s %12s\n", n.c_str(), mib(b).c_str());
  }
  row("workspace", p.workspace,
      std::string("at the peak: gradients as backward makes them") +
          (o.accum_steps > 1 ? " and those held from the earlier micro-batches" : "") +
          (o.zero ? ", ZeRO's gradient buckets and chunks" : "") +
          ", temporaries (the rows but gradients sum to the peak)");
  if (p.gpu)
    std::printf("    %s\n", p.cudnn_asked ? "with cuBLASLt's 32 MiB per matmul and each convolution's cuDNN workspace "
                                            "(as this device's cuDNN picks it)"
                                          : "with cuBLASLt's 32 MiB per matmul; not the convolutions' cuDNN "
                                            "workspaces (no CUDA device here to ask: up to 1 GiB per pass)");
  row("predicted peak", p.peak, target.is_cuda() ? "(a GPU adds its context and the allocator's rounding)" : "");
  if (const std::string note = small_norms_note(p, "a larger --batch or --image-size"); !note.empty())
    std::printf("note: %s\n", note.c_str());
  nlohmann::json j = {{"model", o.model}, {"batch", batch}, {"device", o.device}, {"plan", p.to_json()}};
  bool nofit = false;
  if (memory > 0) {
    const bool fits = plan_fits(p, memory, target);
    std::printf("memory %s from %s: %s\n", mib(memory).c_str(), memory_from.c_str(), fits ? "fits" : "does not fit");
    j["memory"] = memory;
    j["fits"] = fits;
    std::pair<int64_t, MemoryPlan> found{batch, p};
    if (!fits) try {
        found = largest_micro_batch(o, batch, memory, target);
      } catch (const Error& e) {  // no micro-batch the model can train on
        std::fprintf(stderr, "kiln plan: error: %s\n", e.message().c_str());
        return 2;
      }
    const auto& [micro, mp] = found;
    if (micro == 0) {
      std::printf("even a micro-batch of %lld%s does not fit: it needs %s at the peak\n", (long long)mp.micro_batch,
                  mp.micro_batch > 1 ? " (the smallest the model can train on)" : "", mib(mp.peak).c_str());
    } else {
      std::printf(
          "largest micro-batch that fits: %lld (peak %s), with --accum-steps %lld for the batch of %lld "
          "(or kiln train --micro-batch auto)\n",
          (long long)micro, mib(mp.peak).c_str(), (long long)(o.accum_steps * batch / micro),
          (long long)(o.accum_steps * batch));
      if (const std::string note = small_norms_note(mp, "a larger micro-batch or --image-size");
          micro < batch && !note.empty())
        std::printf("note: %s\n", note.c_str());
      if (micro < batch) j["micro_plan"] = mp.to_json();  // its batch-norm counts are the run's
    }
    j["micro_batch"] = micro;
    j["accum_steps"] = micro ? o.accum_steps * batch / micro : 0;
    nofit = micro == 0;
  }
  if (!o.json.empty()) {
    std::ofstream f(o.json);
    f << io::dump_json(j, 2) << "\n";
    KILN_CHECK(f.good(), "--json ", o.json, ": cannot write");
  }
  return nofit ? 3 : 0;  // 3: not even one sample fits the memory
}

}  // namespace kiln::tools
