#include "engine/zero.h"

#include <chrono>
#include <map>
#include <unordered_map>

#include "engine/autograd.h"
#include "engine/dist_internal.h"
#include "engine/ops.h"

namespace kiln::dist {

ZeroRedundancy::ZeroRedundancy(nn::Module& model, const std::vector<optim::ParamGroup>& groups, Communicator& comm,
                               DataParallelOptions o)
    : model_(model), comm_(comm) {
  replicate_model(model, comm, "ZeRO");
  const int world = comm.world_size(), rank = comm.rank();
  std::unordered_map<const TensorImpl*, std::pair<size_t, size_t>> where;  // impl -> (group, index)
  for (size_t g = 0; g < groups.size(); ++g) {
    groups_.push_back(optim::ParamGroup({}, groups[g].lr, groups[g].weight_decay, groups[g].name));
    groups_.back().options = groups[g].options;
    for (size_t i = 0; i < groups[g].params.size(); ++i)
      KILN_CHECK(where.emplace(&groups[g].params[i].impl(), std::make_pair(g, i)).second, "ZeRO: a parameter is in ",
                 "two optimizer groups");
  }
  for (const auto& [n, t] : model.named_parameters()) {
    if (!t.requires_grad()) continue;
    auto it = where.find(&t.impl());
    KILN_CHECK(it != where.end(), "ZeRO: parameter ", n, " is in no optimizer group");
    KILN_CHECK(t.dtype() == DType::f32 && t.is_contiguous(), "ZeRO: parameter ", n, " is ", t.type_str(),
               "; the flat buckets hold contiguous f32 parameters (keep master weights in f32)");
    params_.push_back(t);
    names_.push_back(n);
    group_of_.push_back(it->second);
  }
  KILN_CHECK(where.size() == params_.size(),
             "ZeRO: an optimizer group holds a tensor that is not a trainable "
             "parameter of the model");
  const Device dev = params_.empty() ? kCPU : params_[0].device();
  for (const Tensor& p : params_)
    KILN_CHECK(p.device() == dev, "ZeRO: parameters on ", dev, " and ", p.device(), "; one device per rank");

  // Buckets in reverse registration order (the order backward produces gradients), the first small,
  // as DataParallel's; inside a bucket the pieces are ordered by group.
  bucket_of_.assign(params_.size(), 0);
  std::vector<std::vector<size_t>> members;
  int64_t bytes = 0;
  for (size_t k = params_.size(); k-- > 0;) {
    const int64_t limit = members.size() <= 1 ? o.first_bucket_bytes : o.bucket_bytes;
    if (members.empty() || (bytes > 0 && bytes + params_[k].numel() * 4 > limit)) {
      members.emplace_back();
      bytes = 0;
    }
    members.back().push_back(k);
    bytes += params_[k].numel() * 4;
    bucket_of_[k] = members.size() - 1;
  }
  layout_.world_size = world;
  NoGradGuard no_grad;
  for (auto& m : members) {
    std::stable_sort(m.begin(), m.end(), [&](size_t a, size_t b) { return group_of_[a].first < group_of_[b].first; });
    Bucket& b = buckets_.emplace_back();
    ZeroLayout::Bucket& lb = layout_.buckets.emplace_back();
    for (size_t k : m) {
      b.pieces.push_back({k, b.numel, params_[k].numel()});
      lb.params.push_back({names_[k], group_of_[k].first, group_of_[k].second, b.numel, params_[k].numel()});
      b.numel += params_[k].numel();
    }
    b.chunk = (b.numel + world - 1) / world;
    lb.chunk = b.chunk;
    b.pending = int(b.pieces.size());
    // The parameters move into the flat: same values, the Module's handles see the new storage.
    b.flat = zeros({b.chunk * world}, TensorOptions(DType::f32, dev));
    for (const Piece& pc : b.pieces) {
      Tensor& p = params_[pc.param];
      b.flat.narrow(0, pc.offset, pc.numel).copy_(p.detach().reshape({pc.numel}));
      TensorImpl& im = p.impl();
      im.storage = b.flat.storage();
      im.offset = b.flat.offset() + pc.offset;
    }
    // This rank's chunk, cut where the group changes: one optimizer tensor per (bucket, group).
    const int64_t lo = b.chunk * rank, hi = std::min(b.chunk * (rank + 1), b.numel);
    for (size_t i = 0; i < b.pieces.size();) {
      const size_t g = group_of_[b.pieces[i].param].first;
      const int64_t start = b.pieces[i].offset;
      while (i < b.pieces.size() && group_of_[b.pieces[i].param].first == g) ++i;
      const int64_t end = i < b.pieces.size() ? b.pieces[i].offset : b.numel;
      const int64_t s = std::max(start, lo), e = std::min(end, hi);
      if (s >= e) continue;
      view_info_.push_back({buckets_.size() - 1, g, s, e - s});
      Tensor view = b.flat.narrow(0, s, e - s);
      view.set_requires_grad(true);  // a leaf the optimizer takes (its .grad is set by finish())
      views_.push_back(view);
    }
  }
  if (world > 1)
    for (size_t k = 0; k < params_.size(); ++k)
      hook_ids_.push_back(params_[k].register_grad_ready_hook([this, k](Tensor&) { on_grad_ready(k); }));
}

ZeroRedundancy::~ZeroRedundancy() { detail::release_buckets(params_, hook_ids_, buckets_); }

std::vector<optim::ParamGroup> ZeroRedundancy::shard_groups() const {
  std::vector<optim::ParamGroup> out = groups_;
  for (size_t v = 0; v < views_.size(); ++v) out[view_info_[v].group].params.push_back(views_[v]);
  return out;
}

void ZeroRedundancy::on_grad_ready(size_t index) {
  if (!sync_) return;
  if (--buckets_[bucket_of_[index]].pending > 0) return;
  detail::launch_ready_buckets(buckets_, [this](Bucket& b) { launch(b); });
}

void ZeroRedundancy::launch(Bucket& b) {
  NoGradGuard no_grad;
  // Buckets whose reduce-scatter has finished need only this rank's chunk: their full flats go
  // before this one's is made (finish() still waits on them, for errors).
  for (Bucket& done : buckets_)
    if (done.work && done.grads.defined() && done.work->done()) done.grads = Tensor();
  const int world = comm_.world_size();
  b.grads = zeros({b.chunk * world}, TensorOptions(DType::f32, b.flat.device()));
  for (const Piece& pc : b.pieces) {
    const Tensor g = params_[pc.param].grad();
    if (g.defined()) b.grads.narrow(0, pc.offset, pc.numel).copy_(g.detach().reshape({pc.numel}));
    // The bucket holds it now, and the optimizer reads this rank's chunk of the bucket: the
    // parameter's own gradient goes, so the gradients are held once, not twice, to the end of backward.
    params_[pc.param].set_grad(Tensor());
  }
  b.grad_chunk = make_tensor({b.chunk}, DType::f32, b.flat.device());
  b.work = comm_.reduce_scatter_async(b.grads, b.grad_chunk, ReduceOp::avg);
}

void ZeroRedundancy::finish() {
  const auto t0 = std::chrono::steady_clock::now();
  NoGradGuard no_grad;
  // Buckets not yet out: every one with a single rank (no hooks), else those with a parameter that
  // got no gradient in this backward.
  for (auto& b : buckets_)
    if (!b.work) launch(b);
  for (auto& b : buckets_) {
    b.work->wait();
    b.work.reset();
    b.grads = Tensor();
    b.pending = int(b.pieces.size());
  }
  const int64_t base = comm_.rank();
  for (size_t v = 0; v < views_.size(); ++v) {
    const View& vi = view_info_[v];
    const Bucket& b = buckets_[vi.bucket];
    views_[v].set_grad(b.grad_chunk.narrow(0, vi.offset - b.chunk * base, vi.numel));
  }
  wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

Tensor ZeroRedundancy::clip_grad_norm(double max_norm) {
  return optim::clip_grad_norm(views_, max_norm, 2.0, [this](Tensor& partial, bool is_max) {
    comm_.all_reduce(partial, is_max ? ReduceOp::max : ReduceOp::sum);
  });
}

void ZeroRedundancy::gather() {
  NoGradGuard no_grad;
  const int rank = comm_.rank();
  for (auto& b : buckets_) {
    b.grad_chunk = Tensor();
    if (comm_.world_size() > 1) comm_.all_gather(b.flat.narrow(0, b.chunk * rank, b.chunk).clone(), b.flat);
    b.flat.bump_version();
  }
}

void ZeroRedundancy::zero_grad() {
  for (Tensor& p : params_) p.set_grad(Tensor());
}

double ZeroRedundancy::take_wait_seconds() {
  const double s = wait_seconds_;
  wait_seconds_ = 0;
  return s;
}

namespace {
// The slot names of an optimizer's state ("momentum", "exp_avg", ...) and, per (group, index), its tensors.
std::map<std::string, std::map<std::pair<size_t, size_t>, Tensor>> by_slot(const optim::OptimizerState& s) {
  std::map<std::string, std::map<std::pair<size_t, size_t>, Tensor>> out;
  for (const auto& [key, t] : s.tensors) {
    const size_t a = key.find('.'), b = key.find('.', a + 1);
    out[key.substr(b + 1)][{std::stoul(key.substr(0, a)), std::stoul(key.substr(a + 1, b - a - 1))}] = t;
  }
  return out;
}
}  // namespace

std::vector<std::pair<std::string, std::function<Tensor()>>> ZeroRedundancy::state_entries(
    const optim::Optimizer& opt) const {
  auto slots =
      std::make_shared<std::map<std::string, std::map<std::pair<size_t, size_t>, Tensor>>>(by_slot(opt.state()));
  std::vector<std::string> names;
  for (const auto& [s, m] : *slots) names.push_back(s);
  check_same_on_all_ranks(comm_, names, "the optimizer's state slots");
  // Each view's index inside its group, as shard_groups() numbers them.
  std::vector<size_t> index(views_.size());
  {
    std::vector<size_t> next(groups_.size(), 0);
    for (size_t v = 0; v < views_.size(); ++v) index[v] = next[view_info_[v].group]++;
  }
  std::vector<std::pair<std::string, std::function<Tensor()>>> out;
  for (size_t bi = 0; bi < buckets_.size(); ++bi)
    for (const std::string& s : names)
      out.emplace_back("zero." + std::to_string(bi) + "." + s, [this, slots, s, bi, index]() {
        NoGradGuard no_grad;
        const Bucket& b = buckets_[bi];
        const int64_t base = b.chunk * comm_.rank();
        Tensor mine = zeros({b.chunk}, TensorOptions(DType::f32, b.flat.device()));
        const auto& per = slots->at(s);
        for (size_t v = 0; v < views_.size(); ++v) {
          const View& vi = view_info_[v];
          if (vi.bucket != bi) continue;
          auto it = per.find({vi.group, index[v]});
          if (it != per.end()) mine.narrow(0, vi.offset - base, vi.numel).copy_(it->second);
        }
        Tensor all = make_tensor({b.chunk * comm_.world_size()}, DType::f32, b.flat.device());
        if (comm_.world_size() > 1)
          comm_.all_gather(mine, all);
        else
          all.copy_(mine);
        return all;
      });
  return out;
}

optim::OptimizerState ZeroRedundancy::local_state(const std::function<Tensor(const std::string&)>& read,
                                                  const std::vector<std::string>& slots, const ZeroLayout& saved,
                                                  const std::string& what) const {
  KILN_CHECK(saved.world_size == layout_.world_size, what, ": its optimizer state is sharded over ", saved.world_size,
             " ranks, this run has ", layout_.world_size, " (kiln ckpt consolidate makes it whole)");
  KILN_CHECK(saved == layout_, what,
             ": its optimizer state is sharded over another layout of the parameters "
             "(another model, optimizer groups or bucket size)");
  optim::OptimizerState out;
  std::vector<size_t> next(groups_.size(), 0);
  std::map<std::string, Tensor> cache;  // the flats of the bucket at hand (its views are adjacent)
  for (size_t v = 0; v < views_.size(); ++v) {
    const View& vi = view_info_[v];
    const size_t index = next[vi.group]++;
    if (v > 0 && view_info_[v - 1].bucket != vi.bucket) cache.clear();
    for (const std::string& s : slots) {
      const std::string name = "zero." + std::to_string(vi.bucket) + "." + s;
      auto it = cache.find(name);
      if (it == cache.end()) it = cache.emplace(name, read(name)).first;
      const Tensor& full = it->second;
      const int64_t want = buckets_[vi.bucket].chunk * layout_.world_size;
      KILN_CHECK(full.dim() == 1 && full.size(0) == want && full.dtype() == DType::f32, what, ": ", name, " is ",
                 full.type_str(), ", expected f32 [", want, "]");
      out.tensors[std::to_string(vi.group) + "." + std::to_string(index) + "." + s] =
          full.narrow(0, vi.offset, vi.numel).clone();
    }
  }
  return out;
}

optim::OptimizerState ZeroRedundancy::local_state_from_whole(const optim::OptimizerState& whole,
                                                             const std::string& what) const {
  std::vector<std::string> slots;
  for (const auto& [s, m] : by_slot(whole)) slots.push_back(s);
  auto read = [&](const std::string& name) {  // "zero.<bucket>.<slot>" assembled from the parameters' own
    const size_t a = name.find('.'), b = name.find('.', a + 1);
    const size_t bi = std::stoul(name.substr(a + 1, b - a - 1));
    const std::string slot = name.substr(b + 1);
    const ZeroLayout::Bucket& lb = layout_.buckets[bi];
    Tensor flat = zeros({lb.chunk * layout_.world_size}, TensorOptions(DType::f32, buckets_[bi].flat.device()));
    NoGradGuard no_grad;
    for (const ZeroLayout::Entry& e : lb.params) {
      auto it = whole.tensors.find(std::to_string(e.group) + "." + std::to_string(e.index) + "." + slot);
      if (it == whole.tensors.end()) continue;
      KILN_CHECK(it->second.numel() == e.numel, what, ": optimizer state ", it->first, " of ", e.name, " is ",
                 it->second.type_str(), ", the parameter has ", e.numel, " elements");
      flat.narrow(0, e.offset, e.numel).copy_(it->second.reshape({e.numel}));
    }
    return flat;
  };
  return local_state(read, slots, layout_, what);
}

optim::OptimizerState whole_optimizer_state(const std::function<Tensor(const std::string&)>& read,
                                            const std::vector<std::string>& slots, const ZeroLayout& layout,
                                            const std::function<Shape(const std::string& param)>& shape_of) {
  optim::OptimizerState out;
  for (size_t bi = 0; bi < layout.buckets.size(); ++bi)
    for (const std::string& s : slots) {
      const Tensor full = read("zero." + std::to_string(bi) + "." + s);
      for (const ZeroLayout::Entry& e : layout.buckets[bi].params)
        out.tensors[std::to_string(e.group) + "." + std::to_string(e.index) + "." + s] =
            full.narrow(0, e.offset, e.numel).reshape(shape_of(e.name)).clone();
    }
  return out;
}

}  // namespace kiln::dist
