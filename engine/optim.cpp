// Optimizer bookkeeping, the update rules (SGD, AdamW, LAMB, RMSprop, Adagrad), gradient clipping and LR schedules.
// Updates are tensor ops under NoGradGuard, so they run on whatever device holds the parameters;
// state tensors are f32 for f32 parameters (and f32 for 16-bit ones: master precision), f64 for f64 ones.
#include "engine/optim.h"

#include <cmath>
#include <limits>

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include "engine/autograd.h"
#include "engine/internal.h"

namespace kiln::optim {

namespace {
void check_lr(double lr, size_t group) {
  KILN_CHECK(std::isfinite(lr) && lr >= 0, "optimizer: group ", group, "'s lr must be finite and >= 0, got ", lr);
}
// The dtype of a parameter's state and of its update's arithmetic: f32 at least, f64 for an f64 parameter
// (an f64 weight updated in f32 was rounded to f32 each step: SGD's 1 - 0.01 * 0.1 gave 0.99900001287).
DType state_dtype(const Tensor& p) { return p.dtype() == DType::f64 ? DType::f64 : DType::f32; }
// A state slot of Kiln's optimizers is shaped as its parameter, in its state dtype, on its device; any
// other (a parameter converted or moved in place after its state was made) is refused before a kernel
// gets a pointer to it. `where` names the parameter.
bool slot_fits(const Tensor& s, const Tensor& p) {
  return s.shape() == p.shape() && s.dtype() == state_dtype(p) && s.device() == p.device();
}
void check_slot(const Tensor& s, const std::string& slot, const Tensor& p, const std::string& where) {
  KILN_CHECK(slot_fits(s, p), where, ": state '", slot, "' is ", s.type_str(), ", its parameter (", p.type_str(),
             ") needs ", state_dtype(p), " ", p.device(), " ", p.shape(),
             "; a parameter converted or moved in place after its state was made needs a new optimizer (made "
             "after Module::to; to keep the state, give the new one the old one's state() through load_state, "
             "which converts dtype and device)");
}
}  // namespace

Optimizer::Optimizer(std::vector<ParamGroup> groups) : groups_(std::move(groups)) {
  KILN_CHECK(!groups_.empty(), "optimizer: needs at least one parameter group");
  std::map<const void*, std::pair<size_t, size_t>> seen;  // a parameter stepped twice would move twice as far
  for (size_t g = 0; g < groups_.size(); ++g) {
    check_lr(groups_[g].lr, g);
    KILN_CHECK(std::isfinite(groups_[g].weight_decay) && groups_[g].weight_decay >= 0, "optimizer: group ", g,
               "'s weight decay must be finite and >= 0, got ", groups_[g].weight_decay);
    for (size_t i = 0; i < groups_[g].params.size(); ++i) {
      const Tensor& p = groups_[g].params[i];
      // A frozen parameter (requires_grad off) is taken, as torch takes it: it gets no gradient, so
      // step() skips it, and once unfrozen it trains (its state made at its first gradient).
      KILN_CHECK(p.defined() && p.is_leaf(), "optimizer: parameter ", i, " of group ", g,
                 " must be a leaf tensor (a parameter), got ", p.defined() ? "one computed from others" : "none",
                 p.defined() ? " (" + p.type_str() + ")" : "");
      const auto [at, fresh] = seen.try_emplace(p.impl_ptr().get(), g, i);
      KILN_CHECK(fresh, "optimizer: parameter ", i, " of group ", g, " is also parameter ", at->second.second,
                 " of group ", at->second.first, " (", p.type_str(), ")");
    }
    slots_.emplace_back(groups_[g].params.size());
    ids_.emplace_back();
    for (const Tensor& p : groups_[g].params) ids_.back().emplace_back(p.impl_ptr());
    first_.push_back(nparams_);
    nparams_ += groups_[g].params.size();
  }
}

void Optimizer::place_counts(Device dev) {
  if (!counts_.defined()) counts_ = zeros({int64_t(nparams_)}, TensorOptions(DType::f64, dev));
  if (counts_.device() != dev) counts_ = counts_.to(dev);
}

void Optimizer::check_layout() const {
  // groups() is mutable; the number of groups and their sizes must stay as they were made (the
  // per-parameter state and counts are laid out by them).
  KILN_CHECK(groups_.size() == first_.size(), name(), ": ", groups_.size(), " parameter groups, made with ",
             first_.size(), "; groups cannot be added or removed after the optimizer is made (make a new one)");
  for (size_t g = 0; g < groups_.size(); ++g) {
    const size_t made = (g + 1 < first_.size() ? first_[g + 1] : nparams_) - first_[g];
    KILN_CHECK(groups_[g].params.size() == made, name(), ": group ", g, " has ", groups_[g].params.size(),
               " parameters, made with ", made,
               "; parameters cannot be added or removed after the optimizer is "
               "made (make a new one)");
  }
}

std::vector<int64_t> Optimizer::moved() const {
  const auto same = [](const std::weak_ptr<TensorImpl>& a, const std::shared_ptr<TensorImpl>& b) {
    return !a.owner_before(b) && !b.owner_before(a);
  };
  bool replaced = false;
  for (size_t g = 0; g < groups_.size() && !replaced; ++g)
    for (size_t i = 0; i < groups_[g].params.size() && !replaced; ++i)
      replaced = !same(ids_[g][i], groups_[g].params[i].impl_ptr());
  if (!replaced) return {};
  // The constructor's checks for the tensors there now, and where each one's state was.
  std::map<std::weak_ptr<TensorImpl>, int64_t, std::owner_less<std::weak_ptr<TensorImpl>>> was;
  for (size_t g = 0; g < groups_.size(); ++g)
    for (size_t i = 0; i < ids_[g].size(); ++i) was.emplace(ids_[g][i], int64_t(first_[g] + i));
  std::map<const void*, std::pair<size_t, size_t>> seen;
  std::vector<int64_t> from(nparams_, -1);
  for (size_t g = 0; g < groups_.size(); ++g)
    for (size_t i = 0; i < groups_[g].params.size(); ++i) {
      const Tensor& p = groups_[g].params[i];
      KILN_CHECK(p.defined() && p.is_leaf(), name(), ": parameter ", i, " of group ", g,
                 " was replaced by a tensor that is not a leaf (a parameter), got ",
                 p.defined() ? "one computed from others (" + p.type_str() + ")" : std::string("none"));
      const auto [at, fresh] = seen.try_emplace(p.impl_ptr().get(), g, i);
      KILN_CHECK(fresh, name(), ": parameter ", i, " of group ", g, " is also parameter ", at->second.second,
                 " of group ", at->second.first, " (", p.type_str(), "); a tensor is stepped once, in one place");
      const auto it = was.find(std::weak_ptr<TensorImpl>(p.impl_ptr()));
      if (it != was.end()) from[first_[g] + i] = it->second;
    }
  return from;
}

void Optimizer::rebind(const std::vector<int64_t>& from) {
  if (from.empty()) return;
  std::vector<std::map<std::string, Tensor>*> old(nparams_);
  for (size_t g = 0; g < groups_.size(); ++g)
    for (size_t i = 0; i < slots_[g].size(); ++i) old[first_[g] + i] = &slots_[g][i];
  std::vector<std::vector<std::map<std::string, Tensor>>> slots(groups_.size());
  for (size_t g = 0; g < groups_.size(); ++g) {
    slots[g].resize(groups_[g].params.size());
    for (size_t i = 0; i < groups_[g].params.size(); ++i)  // each old index is taken once at most
      if (from[first_[g] + i] >= 0) slots[g][i] = std::move(*old[size_t(from[first_[g] + i])]);
  }
  if (counts_.defined()) {  // once, when a parameter was replaced: its count goes with its state
    const std::vector<double> before = counts_.to_vector();
    std::vector<double> after(nparams_, 0.0);
    for (size_t k = 0; k < nparams_; ++k) after[k] = from[k] >= 0 ? before[size_t(from[k])] : 0.0;
    counts_ = from_vector(after, {int64_t(nparams_)}, TensorOptions(DType::f64, counts_.device()));
  }
  mask_ = Tensor();
  mask_host_.clear();
  slots_ = std::move(slots);
  for (size_t g = 0; g < groups_.size(); ++g)
    for (size_t i = 0; i < groups_[g].params.size(); ++i) ids_[g][i] = groups_[g].params[i].impl_ptr();
}

void Optimizer::check_lrs() const {
  // A group's lr may be set below 0 (a schedule past its end gives one, which torch's loop never uses); a
  // step with it would ascend the loss where descent was meant, so it is refused. Every group is checked,
  // with a gradient or not: under ZeRO a rank whose shard holds no parameter of a group with gradients
  // would otherwise step on where the other ranks refuse, and the collectives would hang.
  for (size_t g = 0; g < groups_.size(); ++g)
    KILN_CHECK(std::isfinite(groups_[g].lr) && groups_[g].lr >= 0, name(), ": group ", g, "'s lr is ", groups_[g].lr,
               " at this step; a step needs a finite lr >= 0 (a negative lr would ascend the gradient where "
               "torch's loop with a schedule past its end never steps; to ascend, minimize the negated loss)");
}

void Optimizer::step(const Tensor& skip_if) {
  NoGradGuard ng;
  check_lrs();
  // Every check before anything changes: the parameters with gradients share one device (the
  // step count's and the flag's), and their gradients match them in shape and dtype (an f64
  // gradient of an f32 parameter is refused, as torch does, not rounded silently).
  check_layout();
  // A tensor put in a parameter's place through groups() takes its own state (as torch): where each
  // one's state is now, checked here and applied after every other check, so a refused step changes nothing.
  const std::vector<int64_t> from = moved();
  const auto state_of = [&](size_t g, size_t i) -> const std::map<std::string, Tensor>* {
    if (from.empty()) return &slots_[g][i];
    const int64_t k = from[first_[g] + i];
    if (k < 0) return nullptr;  // a new tensor: fresh state
    size_t h = 0;
    while (h + 1 < groups_.size() && first_[h + 1] <= size_t(k)) ++h;
    return &slots_[h][size_t(k) - first_[h]];
  };
  check_group_options();  // groups() may have changed a group's own momentum or betas since the last step
  // Kiln's optimizers keep state shaped as each parameter (one written outside Kiln may keep others).
  const bool own_slots = dynamic_cast<const AdamFamily*>(this) || dynamic_cast<const SGD*>(this) ||
                         dynamic_cast<const RMSprop*>(this) || dynamic_cast<const Adagrad*>(this);
  std::optional<Device> dev;
  std::vector<double> mask(nparams_, 0.0);  // which parameters have a gradient (their counts advance)
  for (size_t g = 0; g < groups_.size(); ++g)
    for (size_t i = 0; i < groups_[g].params.size(); ++i) {
      const Tensor& p = groups_[g].params[i];
      const Tensor grad = p.grad();
      if (!grad.defined()) continue;
      KILN_CHECK(grad.shape() == p.shape(), name(), ": parameter ", i, " of group ", g, ": gradient ", grad.shape(),
                 " does not match parameter ", p.shape());
      KILN_CHECK(grad.dtype() == p.dtype(), name(), ": parameter ", i, " of group ", g, " (", p.type_str(), ") has a ",
                 grad.dtype(), " gradient; a gradient must have its parameter's dtype");
      if (!dev) dev = p.device();
      KILN_CHECK(p.device() == *dev && grad.device() == *dev, name(), ": parameters and gradients on ", *dev, " and ",
                 p.device() == *dev ? grad.device() : p.device(), "; one optimizer serves one device");
      if (const std::map<std::string, Tensor>* state = own_slots ? state_of(g, i) : nullptr)
        for (const auto& [slot, t] : *state)  // the message is built only for a misfit (a hot loop)
          if (!slot_fits(t, p))
            check_slot(t, slot, p, name() + ": parameter " + std::to_string(i) + " of group " + std::to_string(g));
      mask[first_[g] + i] = 1.0;
    }
  if (!dev) return;  // no gradient anywhere: nothing moves and nothing is counted (as torch)
  if (skip_if.defined())
    KILN_CHECK(skip_if.numel() == 1 && skip_if.dtype() == DType::f32 && skip_if.device() == *dev, name(),
               ": the skip flag must be one f32 element on ", *dev, ", got ", skip_if.dtype(), " ", skip_if.shape(),
               " on ", skip_if.device());
  rebind(from);
  // The step count lives with the parameters (it follows them when they move: a CPU checkpoint
  // resumed on a GPU) and counts this step unless the flag is set, on the device.
  if (!step_count_.defined()) step_count_ = zeros({}, TensorOptions(DType::f64, *dev));
  if (step_count_.device() != *dev) step_count_ = step_count_.to(*dev);
  // 1 unless the flag is set (a [] of the flag's one element, whatever its shape)
  const Tensor counted = skip_if.defined() ? eq(skip_if, scalar_like(0.0, skip_if)).reshape({}) : Tensor();
  step_count_.add_(counted.defined() ? counted : scalar_like(1.0, step_count_));
  // Each parameter with a gradient counts the step too (its own bias corrections); the mask goes to
  // the device only when it changes (every parameter with a gradient every step: uploaded once).
  if (counts_steps()) {
    place_counts(*dev);
    if (!mask_.defined() || mask_.device() != *dev || mask != mask_host_) {
      mask_ = from_vector(mask, {int64_t(nparams_)}, TensorOptions(DType::f64, *dev));
      mask_host_ = std::move(mask);
    }
    counts_.add_(counted.defined() ? mask_ * counted : mask_);
  }
  // The host reads the flag and the count, once, only where it must: for the per-tensor path, and
  // when a parameter's state is made this step (a skipped step makes none, as if it never ran:
  // SGD's first momentum is the direction itself). A parameter whose slots are still empty after
  // its slice is made has no state to make (SGD without momentum): its steps read nothing.
  std::optional<bool> host_skip;
  auto skip_on_host = [&] {
    if (!host_skip) host_skip = skip_if.defined() && skip_if.item<double>() != 0.0;
    return *host_skip;
  };
  std::vector<double> host_counts;  // counts_ on the host, read once if the per-tensor path needs it
  for (size_t g = 0; g < groups_.size(); ++g) {
    OptimKind kind{};
    OptimHyper h;
    const bool fuse = use_fused && fused(groups_[g], kind, h);
    std::vector<OptimSlice> slices;
    for (size_t i = 0; i < groups_[g].params.size(); ++i) {
      Tensor& p = groups_[g].params[i];
      const Tensor grad = p.grad();
      if (!grad.defined()) continue;
      if (fuse && p.dtype() == DType::f32 && grad.dtype() == DType::f32 && p.is_contiguous() && grad.is_contiguous()) {
        auto& slots = slots_[g][i];
        const bool had_state = !slots.empty();
        OptimSlice slice = fused_slice(groups_[g], p, grad, slots);
        if (counts_steps()) slice.step = counts_.data<double>() + (first_[g] + i);
        if (!had_state && !slots.empty() && skip_if.defined() && skip_on_host()) {
          slots.clear();  // skipped: the state just made is dropped (no kernel has touched it)
          continue;
        }
        slices.push_back(slice);
        p.bump_version();
      } else if (!skip_on_host()) {
        if (host_steps() && host_counts.empty()) host_counts = counts_.to_vector();  // once a step
        steps_ = host_steps() ? int64_t(host_counts[first_[g] + i]) : 0;             // this parameter's step number
        step_t_ = counts_steps() ? counts_.narrow(0, int64_t(first_[g] + i), 1).reshape({}) : Tensor();
        update(groups_[g], p, grad, slots_[g][i]);
      }
    }
    h.step = step_count_.data<double>();
    h.skip_if = skip_if.defined() ? skip_if.data<float>() : nullptr;
    if (!slices.empty()) detail::backend(*dev).optimizer_step(kind, slices.data(), int64_t(slices.size()), h);
  }
}

int64_t Optimizer::steps() const { return step_count_.defined() ? int64_t(step_count_.item<double>()) : 0; }

int64_t Optimizer::steps(size_t group, size_t index) const {
  check_layout();
  KILN_CHECK(group < groups_.size() && index < groups_[group].params.size(), name(), ": no parameter ", index,
             " in group ", group);
  if (!counts_.defined()) return 0;
  const std::vector<int64_t> from = moved();  // a tensor put there through groups(): its own count
  const int64_t at = from.empty() ? int64_t(first_[group] + index) : from[first_[group] + index];
  return at < 0 ? 0 : int64_t(counts_.narrow(0, at, 1).item<double>());
}

void Optimizer::zero_grad(bool set_to_none) {
  NoGradGuard ng;
  for (auto& g : groups_)
    for (auto& p : g.params) {
      if (set_to_none) {
        p.set_grad(Tensor());
      } else {
        Tensor grad = p.grad();
        if (grad.defined()) grad.zero_();
      }
    }
}

void Optimizer::set_lr(double lr) {
  // Any finite lr is kept, as torch keeps what a schedule sets (OneCycleLR's and a LambdaLR's last lr past the
  // end is below 0 and never used); step() refuses a negative one.
  KILN_CHECK(std::isfinite(lr), "optimizer: set_lr: lr must be finite, got ", lr);
  for (auto& g : groups_) g.lr = lr;
}

OptimizerState Optimizer::state() const {
  check_layout();
  // The state of the tensors there now: one put in a parameter's place through groups() since the
  // last step saves its own (none for a new one), as step() will use it.
  const std::vector<int64_t> from = moved();
  std::vector<const std::map<std::string, Tensor>*> flat(nparams_);
  for (size_t g = 0; g < groups_.size(); ++g)
    for (size_t i = 0; i < slots_[g].size(); ++i) flat[first_[g] + i] = &slots_[g][i];
  const std::map<std::string, Tensor> none;
  OptimizerState s;
  s.scalars["steps"] = double(steps());
  for (const auto& [k, v] : hyper()) s.scalars[k] = v;
  // Each parameter's own count, where it is not what a state without it would give: "steps" for a
  // parameter with state, 0 for one without (so a run whose parameters all step together saves none,
  // and a ZeRO rank's views need no names of their own).
  std::vector<double> counts =
      counts_steps() && counts_.defined() ? counts_.to_vector() : std::vector<double>(nparams_, 0.0);
  if (!from.empty()) {
    const std::vector<double> before = counts;
    for (size_t k = 0; k < nparams_; ++k) counts[k] = from[k] >= 0 ? before[size_t(from[k])] : 0.0;
  }
  for (size_t g = 0; g < groups_.size(); ++g) {
    const std::string pre = "group" + std::to_string(g) + ".";
    s.scalars[pre + "lr"] = groups_[g].lr;
    s.scalars[pre + "weight_decay"] = groups_[g].weight_decay;
    s.scalars[pre + "params"] = double(groups_[g].params.size());
    for (const auto& [k, v] : groups_[g].options) s.scalars[pre + k] = v;
    for (size_t i = 0; i < slots_[g].size(); ++i) {
      const std::string at = std::to_string(g) + "." + std::to_string(i) + ".";
      const int64_t src = from.empty() ? int64_t(first_[g] + i) : from[first_[g] + i];
      const std::map<std::string, Tensor>& mine = src < 0 ? none : *flat[size_t(src)];
      for (const auto& [slot, t] : mine) s.tensors[at + slot] = t;
      const double fallback = mine.empty() ? 0.0 : s.scalars["steps"];
      if (counts_steps() && counts[first_[g] + i] != fallback) s.scalars[at + "step"] = counts[first_[g] + i];
    }
  }
  return s;
}

void Optimizer::set_hyper(const std::map<std::string, double>& h) { check_hyper(h, "optimizer state's"); }

void Optimizer::check_hyper(const std::map<std::string, double>& h, const std::string& where) const {
  for (const auto& [k, v] : hyper()) {
    const auto it = h.find(k);
    KILN_CHECK(it == h.end() || it->second == v, name(), ": ", where, " ", k, " is ", it->second,
               ", this optimizer has ", v, " and cannot take another");
  }
}

std::map<std::string, double> Optimizer::with_group_options(std::map<std::string, double> h, size_t g,
                                                            const std::map<std::string, double>& options) const {
  for (const auto& [k, v] : options) {
    const auto it = h.find(k);
    if (it == h.end()) {
      std::string known;
      for (const auto& e : h) known += (known.empty() ? "" : ", ") + e.first;
      KILN_FAIL(name(), ": group ", g, " sets '", k, "', which is not an option of this optimizer (",
                known.empty() ? std::string("it has none") : "its options: " + known, ")");
    }
    it->second = v;
  }
  return h;
}

std::map<std::string, double> Optimizer::group_hyper(size_t g) const {
  KILN_CHECK(g < groups_.size(), name(), ": no parameter group ", g, " (it has ", groups_.size(), ")");
  return with_group_options(hyper(), g, groups_[g].options);
}

void Optimizer::check_group_options() const {
  for (size_t g = 0; g < groups_.size(); ++g)
    if (!groups_[g].options.empty()) check_hyper(group_hyper(g), "group " + std::to_string(g) + "'s");
}

void Optimizer::set_group_options(size_t g, const std::map<std::string, double>& options) {
  KILN_CHECK(g < groups_.size(), name(), ": no parameter group ", g, " (it has ", groups_.size(), ")");
  check_hyper(with_group_options(hyper(), g, options), "group " + std::to_string(g) + "'s");
  groups_[g].options = options;
}

namespace {
// The state slots an optimizer of Kiln's keeps per parameter; nullopt for one of the caller's own
// (its names are its business). A slot name it does not use would load, be ignored by step(), and
// the moment it meant (a misspelt exp_avg) would silently restart from zero.
std::optional<std::set<std::string>> slot_names(const Optimizer& o, const std::map<std::string, double>& hyper) {
  if (dynamic_cast<const AdamFamily*>(&o)) return std::set<std::string>{"exp_avg", "exp_avg_sq"};
  // SGD's buffer whatever the momentum now: a group whose momentum was set to 0 after it had a buffer
  // keeps it (and saves it), as torch's does.
  if (dynamic_cast<const SGD*>(&o)) return std::set<std::string>{"momentum_buffer"};
  // RMSprop's, whatever its momentum and centered now (as SGD's buffer)
  if (dynamic_cast<const RMSprop*>(&o)) return std::set<std::string>{"square_avg", "momentum_buffer", "grad_avg"};
  if (dynamic_cast<const Adagrad*>(&o)) return std::set<std::string>{"sum"};
  return std::nullopt;
}
}  // namespace

void Optimizer::load_state(const OptimizerState& s) {
  // Everything is checked before anything changes: a refused state leaves the optimizer as it was.
  // The state is laid out by the groups as they are now (a parameter replaced through groups() takes
  // the state saved at its index), which must be as the optimizer was made.
  check_layout();
  (void)moved();  // the constructor's checks of any tensor put in a parameter's place
  auto it = s.scalars.find("steps");
  KILN_CHECK(it != s.scalars.end(), name(), ": optimizer state has no step count");
  KILN_CHECK(std::isfinite(it->second) && it->second >= 0 && it->second == std::trunc(it->second), name(),
             ": optimizer state's step count ", it->second, " is not a whole number >= 0");
  // The hyper-parameters as saved (torch's load_state_dict restores them too): momentum 0.5 saved
  // and 0.9 constructed continues with 0.5. set_hyper() checks them below, before anything changes.
  std::map<std::string, double> hyp = hyper();
  for (auto& [k, v] : hyp) {
    auto h = s.scalars.find(k);
    KILN_CHECK(h != s.scalars.end(), name(), ": optimizer state lacks '", k, "' (saved by another optimizer?)");
    v = h->second;
  }
  // The groups: as many as this optimizer's (each saves its lr), each as large as its counterpart
  // (state written before "group<g>.params" was saved is checked by its tensors' names only).
  size_t saved_groups = 0;
  std::map<size_t, double> per_param_steps;  // first_[g] + i -> "<g>.<i>.step"
  for (const auto& entry : s.scalars) {
    const std::string& key = entry.first;
    if (key.rfind("group", 0) == 0) {
      const size_t dot = key.find('.');
      size_t g = 0;
      bool digits = dot != std::string::npos && dot > 5 && dot - 5 <= 9;
      for (size_t k = 5; digits && k < dot; ++k) {
        digits = key[k] >= '0' && key[k] <= '9';
        g = g * 10 + size_t(key[k] - '0');
      }
      if (digits) saved_groups = std::max(saved_groups, g + 1);
    } else if (!key.empty() && key[0] >= '0' && key[0] <= '9') {  // "<group>.<index>.step"
      const size_t a = key.find('.'), b = a == std::string::npos ? a : key.find('.', a + 1);
      size_t g = 0, i = 0;
      bool ok = b != std::string::npos && key.substr(b + 1) == "step" && a <= 9 && b - a - 1 <= 9 && b > a + 1;
      for (size_t k = 0; ok && k < b; ++k) {
        if (k == a) continue;
        ok = key[k] >= '0' && key[k] <= '9';
        size_t& out = k < a ? g : i;
        out = out * 10 + size_t(key[k] - '0');
      }
      KILN_CHECK(ok, name(), ": bad optimizer state scalar '", key, "' (expected group.index.step)");
      KILN_CHECK(g < groups_.size() && i < groups_[g].params.size(), name(), ": optimizer state '", key,
                 "' names a parameter this optimizer does not have");
      KILN_CHECK(std::isfinite(entry.second) && entry.second >= 0 && entry.second == std::trunc(entry.second), name(),
                 ": optimizer state's ", key, " ", entry.second, " is not a whole number >= 0");
      per_param_steps[first_[g] + i] = entry.second;
    }
  }
  KILN_CHECK(saved_groups == 0 || saved_groups == groups_.size(), name(), ": optimizer state has ", saved_groups,
             " parameter group", saved_groups == 1 ? "" : "s", ", this optimizer has ", groups_.size());
  for (size_t g = 0; g < groups_.size(); ++g) {
    const auto n = s.scalars.find("group" + std::to_string(g) + ".params");
    KILN_CHECK(n == s.scalars.end() || n->second == double(groups_[g].params.size()), name(),
               ": optimizer state's group ", g, " has ", n->second, " parameter", n->second == 1 ? "" : "s",
               ", this optimizer's group ", g, " has ", groups_[g].params.size());
  }
  // Each group's lr and weight decay, as state() saves them, held to the constructor's checks (a NaN
  // lr loaded and made every parameter NaN at the next step; the weight decay was not restored).
  std::vector<std::pair<double, double>> lr_wd(groups_.size());
  for (size_t g = 0; g < groups_.size(); ++g) {
    const std::string pre = "group" + std::to_string(g) + ".";
    const auto lr = s.scalars.find(pre + "lr"), wd = s.scalars.find(pre + "weight_decay");
    lr_wd[g] = {lr != s.scalars.end() ? lr->second : groups_[g].lr,
                wd != s.scalars.end() ? wd->second : groups_[g].weight_decay};
    // a negative lr is kept (a schedule's last, which no step used, as torch saves it); step() refuses it
    KILN_CHECK(std::isfinite(lr_wd[g].first), name(), ": optimizer state's ", pre, "lr must be finite, got ",
               lr_wd[g].first);
    KILN_CHECK(std::isfinite(lr_wd[g].second) && lr_wd[g].second >= 0, name(), ": optimizer state's ", pre,
               "weight_decay must be finite and >= 0, got ", lr_wd[g].second);
  }
  // Each group's own options ("group<g>.<key>", as state() saves them; a state without them gives
  // every group the optimizer's values, as torch's load_state_dict replaces the groups' settings),
  // checked as set_group_options checks them; the slots a group keeps follow its own momentum.
  std::vector<std::map<std::string, double>> options(groups_.size());
  std::vector<std::optional<std::set<std::string>>> known(groups_.size());
  for (size_t g = 0; g < groups_.size(); ++g) {
    const std::string pre = "group" + std::to_string(g) + ".";
    for (const auto& [k, v] : hyp) {
      const auto o = s.scalars.find(pre + k);
      if (o != s.scalars.end()) options[g][k] = o->second;
    }
    const std::map<std::string, double> merged = with_group_options(hyp, g, options[g]);
    if (!options[g].empty()) check_hyper(merged, "optimizer state's group " + std::to_string(g) + "'s");
    known[g] = slot_names(*this, merged);
  }
  std::vector<std::vector<std::map<std::string, Tensor>>> slots(groups_.size());
  for (size_t g = 0; g < groups_.size(); ++g) slots[g].resize(groups_[g].params.size());
  for (const auto& entry : s.tensors) {
    // Not a structured binding: clang 14 (the fuzz build) does not let a lambda capture one.
    const std::string& key = entry.first;
    const Tensor& t = entry.second;
    // "<group>.<index>.<slot>", both numbers in decimal
    const size_t a = key.find('.'), b = a == std::string::npos ? a : key.find('.', a + 1);
    const auto number = [&key](size_t from, size_t to, size_t& out) {
      if (to <= from || to - from > 9) return false;
      out = 0;
      for (size_t k = from; k < to; ++k) {
        if (key[k] < '0' || key[k] > '9') return false;
        out = out * 10 + size_t(key[k] - '0');
      }
      return true;
    };
    size_t g = 0, i = 0;
    KILN_CHECK(b != std::string::npos && number(0, a, g) && number(a + 1, b, i), name(), ": bad optimizer state name '",
               key, "' (expected group.index.slot)");
    KILN_CHECK(g < groups_.size() && i < groups_[g].params.size(), name(), ": optimizer state '", key,
               "' names a parameter this optimizer does not have");
    // Kiln's optimizers keep state shaped as the parameter; one written outside Kiln may keep other
    // shapes (docs/extending.md's SignSGD counts its updates in a 0-dim slot), so only theirs is checked.
    KILN_CHECK(!known[g] || t.shape() == groups_[g].params[i].shape(), name(), ": optimizer state '", key,
               "' has shape ", t.shape(), ", parameter has ", groups_[g].params[i].shape());
    KILN_CHECK(is_floating(t.dtype()), name(), ": optimizer state '", key, "' is ", t.type_str(),
               "; the optimizer keeps floating-point state");
    const std::string slot = key.substr(b + 1);
    if (known[g] && !known[g]->count(slot)) {
      std::string expected;
      for (const auto& k : *known[g]) expected += (expected.empty() ? "'" : ", '") + k + "'";
      KILN_FAIL(name(), ": optimizer state '", key, "' names a slot '", slot, "' this optimizer does not keep (",
                expected.empty() ? std::string("it keeps none") : "it keeps " + expected, ")");
    }
    const Tensor& p = groups_[g].params[i];  // state follows its parameter (a CPU checkpoint resumes on a GPU)
    // The slots are f32, f64 for an f64 parameter (what step() makes): a state saved in another float type is
    // widened or rounded once here.
    slots[g][i][slot] = t.to(p.device()).to(state_dtype(p)).clone();
  }
  // The count goes where the parameters are (the first one of any group: a group may be empty);
  // an optimizer without parameters keeps it on the CPU. step() moves it if they move later.
  Device dev = kCPU;
  for (const ParamGroup& g : groups_)
    if (!g.params.empty()) {
      dev = g.params.front().device();
      break;
    }
  // Each parameter's own count: its "<g>.<i>.step", else "steps" for a parameter with state (all a
  // state written before per-parameter counts has) and 0 for one without.
  Tensor counts;
  if (counts_steps()) {
    std::vector<double> c(nparams_, 0.0);
    for (size_t g = 0; g < groups_.size(); ++g)
      for (size_t i = 0; i < groups_[g].params.size(); ++i) {
        const auto e = per_param_steps.find(first_[g] + i);
        c[first_[g] + i] = e != per_param_steps.end() ? e->second : (slots[g][i].empty() ? 0.0 : it->second);
      }
    counts = from_vector(c, {int64_t(nparams_)}, TensorOptions(DType::f64, dev));
  }
  set_hyper(hyp);  // the last check, and the first change
  step_count_ = full({}, it->second, TensorOptions(DType::f64, dev));
  counts_ = counts;
  mask_ = Tensor();
  mask_host_.clear();
  for (size_t g = 0; g < groups_.size(); ++g) {
    std::tie(groups_[g].lr, groups_[g].weight_decay) = lr_wd[g];
    groups_[g].options = std::move(options[g]);
    for (size_t i = 0; i < groups_[g].params.size(); ++i) ids_[g][i] = groups_[g].params[i].impl_ptr();
  }
  slots_ = std::move(slots);
}

namespace {
Tensor& slot(std::map<std::string, Tensor>& slots, const char* name, const Tensor& like) {
  auto it = slots.find(name);
  if (it == slots.end())
    it = slots.emplace(name, zeros(like.shape(), TensorOptions(state_dtype(like), like.device()))).first;
  else if (!slot_fits(it->second, like))
    check_slot(it->second, name, like, "optimizer");  // step() checked it; this guards every caller
  return it->second;
}
// t in the update's dtype for parameter p (state_dtype).
Tensor in_state_dtype(const Tensor& t, const Tensor& p) {
  return t.dtype() == state_dtype(p) ? t : t.to(state_dtype(p));
}
void write_back(Tensor& p, const Tensor& v) {
  if (v.same(p)) return;
  p.copy_(v);
}

// Adam's moment update, shared by AdamW and LAMB: m and v (f32 slots) and the bias corrections.
struct Moments {
  Tensor m, v;
  double bc1, bc2;
};
Moments adam_moments(const AdamOptions& o, int64_t steps, const Tensor& p, const Tensor& grad,
                     std::map<std::string, Tensor>& slots) {
  const Tensor gr = in_state_dtype(grad, p);
  Tensor& m = slot(slots, "exp_avg", p);
  Tensor& v = slot(slots, "exp_avg_sq", p);
  m.mul_(o.beta1).add_(gr, 1.0 - o.beta1);
  v.mul_(o.beta2).add_(gr * gr, 1.0 - o.beta2);
  const double t = double(steps);
  return {m, v, 1.0 - std::pow(o.beta1, t), 1.0 - std::pow(o.beta2, t)};
}
}  // namespace

// ---- SGD ---------------------------------------------------------------------------------------------

SGD::SGD(std::vector<ParamGroup> groups, SgdOptions o) : Optimizer(std::move(groups)), o_(o) {
  KILN_CHECK(o.momentum >= 0, "sgd: momentum must be >= 0, got ", o.momentum);
  KILN_CHECK(!o.nesterov || (o.momentum > 0 && o.dampening == 0), "sgd: nesterov needs momentum > 0 and no dampening");
  check_group_options();
}

SgdOptions SGD::options(const ParamGroup& g) const {
  SgdOptions o = o_;
  for (const auto& [k, v] : g.options) {
    if (k == "momentum") o.momentum = v;
    if (k == "dampening") o.dampening = v;
    if (k == "nesterov") o.nesterov = v != 0;
  }
  return o;
}

std::map<std::string, double> SGD::hyper() const {
  return {{"momentum", o_.momentum}, {"dampening", o_.dampening}, {"nesterov", o_.nesterov ? 1.0 : 0.0}};
}

void SGD::update(const ParamGroup& g, Tensor& p, const Tensor& grad, std::map<std::string, Tensor>& slots) {
  const SgdOptions o = options(g);
  Tensor w = in_state_dtype(p, p);
  Tensor d = in_state_dtype(grad, p);
  if (g.weight_decay != 0) d = d + w * g.weight_decay;
  if (o.momentum != 0) {
    const bool fresh = !slots.count("momentum_buffer");
    Tensor& buf = slot(slots, "momentum_buffer", p);
    if (fresh) {
      buf.copy_(d);
    } else {
      buf.mul_(o.momentum).add_(d, 1.0 - o.dampening);
    }
    d = o.nesterov ? d + buf * o.momentum : buf;
  }
  if (w.same(p)) {
    p.add_(d, -g.lr);
  } else {
    write_back(p, w - d * g.lr);
  }
}

void SGD::check_hyper(const std::map<std::string, double>& h, const std::string& where) const {
  const double momentum = h.at("momentum"), dampening = h.at("dampening"), nesterov = h.at("nesterov");
  KILN_CHECK(std::isfinite(momentum) && momentum >= 0, "sgd: ", where, " momentum must be >= 0, got ", momentum);
  KILN_CHECK(std::isfinite(dampening), "sgd: ", where, " dampening must be finite, got ", dampening);
  KILN_CHECK(nesterov == 0 || nesterov == 1, "sgd: ", where, " nesterov must be 0 or 1, got ", nesterov);
  KILN_CHECK(nesterov == 0 || (momentum > 0 && dampening == 0), "sgd: ", where, " nesterov needs momentum > 0 and ",
             "no dampening, got momentum ", momentum, " and dampening ", dampening);
}

void SGD::set_hyper(const std::map<std::string, double>& h) {
  check_hyper(h, "optimizer state's");
  o_.momentum = h.at("momentum");
  o_.dampening = h.at("dampening");
  o_.nesterov = h.at("nesterov") == 1;
}

bool SGD::fused(const ParamGroup& g, OptimKind& kind, OptimHyper& h) const {
  const SgdOptions o = options(g);
  kind = OptimKind::sgd;
  h.lr = g.lr;
  h.weight_decay = g.weight_decay;
  h.momentum = o.momentum;
  h.dampening = o.dampening;
  h.nesterov = o.nesterov;
  return true;
}

OptimSlice SGD::fused_slice(const ParamGroup& g, Tensor& p, const Tensor& grad, std::map<std::string, Tensor>& slots) {
  OptimSlice s{p.data<float>(), grad.data<float>(), nullptr, nullptr, p.numel(), false};
  if (options(g).momentum != 0) {
    s.fresh = !slots.count("momentum_buffer");
    s.s0 = slot(slots, "momentum_buffer", p).data<float>();
  }
  return s;
}

// ---- AdamW and LAMB ----------------------------------------------------------------------------------

AdamFamily::AdamFamily(std::vector<ParamGroup> groups, AdamOptions o, OptimKind kind, const char* name)
    : Optimizer(std::move(groups)), o_(o), kind_(kind) {
  KILN_CHECK(o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1 && o.eps >= 0 && std::isfinite(o.eps), name,
             ": betas must be in [0, 1) and eps finite and >= 0");
  // LAMB's trust ratio takes the norm of the whole update: one 0 / 0 there (a parameter whose gradients
  // were all 0) would silently turn every other element's ratio to 1, so LAMB keeps eps > 0
  KILN_CHECK(kind != OptimKind::lamb || o.eps > 0, name, ": eps must be > 0 (LAMB's trust ratio needs it), got 0");
  check_group_options();
}

AdamOptions AdamFamily::options(const ParamGroup& g) const {
  AdamOptions o = o_;
  for (const auto& [k, v] : g.options) {
    if (k == "beta1") o.beta1 = v;
    if (k == "beta2") o.beta2 = v;
    if (k == "eps") o.eps = v;
  }
  return o;
}

std::map<std::string, double> AdamFamily::hyper() const {
  return {{"beta1", o_.beta1}, {"beta2", o_.beta2}, {"eps", o_.eps}};
}

void AdamFamily::check_hyper(const std::map<std::string, double>& h, const std::string& where) const {
  const AdamOptions o{h.at("beta1"), h.at("beta2"), h.at("eps")};
  // eps 0 is allowed, as torch (the step then divides by sqrt(v_hat) alone)
  KILN_CHECK(o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1 && o.eps >= 0 && std::isfinite(o.eps), name(),
             ": ", where, " betas must be in [0, 1) and eps finite and >= 0, got beta1 ", o.beta1, ", beta2 ", o.beta2,
             ", eps ", o.eps);
  KILN_CHECK(kind_ != OptimKind::lamb || o.eps > 0, name(), ": ", where,
             " eps must be > 0 (LAMB's trust ratio needs it), got 0");
}

void AdamFamily::set_hyper(const std::map<std::string, double>& h) {
  check_hyper(h, "optimizer state's");
  o_ = AdamOptions{h.at("beta1"), h.at("beta2"), h.at("eps")};
}

// The bias corrections come from each parameter's device-side step count (OptimSlice::step), set by step().
bool AdamFamily::fused(const ParamGroup& g, OptimKind& kind, OptimHyper& h) const {
  const AdamOptions o = options(g);
  kind = kind_;
  h.lr = g.lr;
  h.weight_decay = g.weight_decay;
  h.beta1 = o.beta1;
  h.beta2 = o.beta2;
  h.eps = o.eps;
  return true;
}

OptimSlice AdamFamily::fused_slice(const ParamGroup& /*g*/, Tensor& p, const Tensor& grad,
                                   std::map<std::string, Tensor>& slots) {
  float* m = slot(slots, "exp_avg", p).data<float>();
  float* v = slot(slots, "exp_avg_sq", p).data<float>();
  return {p.data<float>(), grad.data<float>(), m, v, p.numel(), false};
}

void AdamW::update(const ParamGroup& g, Tensor& p, const Tensor& grad, std::map<std::string, Tensor>& slots) {
  const AdamOptions o = options(g);
  const auto [m, v, bc1, bc2] = adam_moments(o, steps_, p, grad, slots);
  Tensor w = in_state_dtype(p, p);
  if (!w.same(p)) w = w.clone();
  if (g.weight_decay != 0) w.mul_(1.0 - g.lr * g.weight_decay);
  const Tensor denom = sqrt(v * (1.0 / bc2)) + o.eps;
  w.add_(m / denom, -g.lr / bc1);
  write_back(p, w);
}

void LAMB::update(const ParamGroup& g, Tensor& p, const Tensor& grad, std::map<std::string, Tensor>& slots) {
  const AdamOptions o = options(g);
  const auto [m, v, bc1, bc2] = adam_moments(o, steps_, p, grad, slots);
  Tensor w = in_state_dtype(p, p);
  Tensor u = (m * (1.0 / bc1)) / (sqrt(v * (1.0 / bc2)) + o.eps);
  if (g.weight_decay != 0) u = u + w * g.weight_decay;
  const double wn = std::sqrt(sum(w * w).item<double>()), un = std::sqrt(sum(u * u).item<double>());
  const double trust = (wn > 0 && un > 0) ? wn / un : 1.0;
  if (!w.same(p)) w = w.clone();
  w.add_(u, -g.lr * trust);
  write_back(p, w);
}

// ---- RMSprop and Adagrad ----------------------------------------------------------------------------
// Tensor ops per parameter (a fused backend kernel, as SGD's and the Adam family's, would be faster:
// one pass over the parameter instead of several), in the order of torch's single-tensor rules, with
// no value read on the host except a GradScaler's skip flag (step()'s skip_if, read once a step, as for
// every per-tensor update).

RMSprop::RMSprop(std::vector<ParamGroup> groups, RmspropOptions o) : Optimizer(std::move(groups)), o_(o) {
  check_hyper(hyper(), "its");
  check_group_options();
}

RmspropOptions RMSprop::options(const ParamGroup& g) const {
  RmspropOptions o = o_;
  for (const auto& [k, v] : g.options) {
    if (k == "alpha") o.alpha = v;
    if (k == "eps") o.eps = v;
    if (k == "momentum") o.momentum = v;
    if (k == "centered") o.centered = v != 0;
  }
  return o;
}

std::map<std::string, double> RMSprop::hyper() const {
  return {{"alpha", o_.alpha}, {"eps", o_.eps}, {"momentum", o_.momentum}, {"centered", o_.centered ? 1.0 : 0.0}};
}

void RMSprop::check_hyper(const std::map<std::string, double>& h, const std::string& where) const {
  // torch's bounds (each >= 0), and finite
  for (const char* k : {"alpha", "eps", "momentum"}) {
    const double v = h.at(k);
    KILN_CHECK(std::isfinite(v) && v >= 0, "rmsprop: ", where, " ", k, " must be finite and >= 0, got ", v);
  }
  const double centered = h.at("centered");
  KILN_CHECK(centered == 0 || centered == 1, "rmsprop: ", where, " centered must be 0 or 1, got ", centered);
}

void RMSprop::set_hyper(const std::map<std::string, double>& h) {
  check_hyper(h, "optimizer state's");
  o_ = RmspropOptions{h.at("alpha"), h.at("eps"), h.at("momentum"), h.at("centered") == 1};
}

void RMSprop::update(const ParamGroup& g, Tensor& p, const Tensor& grad, std::map<std::string, Tensor>& slots) {
  const RmspropOptions o = options(g);
  Tensor w = in_state_dtype(p, p);
  Tensor d = in_state_dtype(grad, p);  // may be the gradient itself: only read
  if (g.weight_decay != 0) d = d + w * g.weight_decay;
  Tensor& sq = slot(slots, "square_avg", p);
  sq.mul_(o.alpha).add_(d * d, 1.0 - o.alpha);
  Tensor avg;
  if (o.centered) {
    Tensor& ga = slot(slots, "grad_avg", p);
    ga.add_(d - ga, 1.0 - o.alpha);  // torch's lerp_(g, 1 - alpha)
    avg = sqrt(sq - ga * ga);
  } else {
    avg = sqrt(sq);
  }
  avg = avg + o.eps;
  Tensor step;
  if (o.momentum > 0) {
    Tensor& buf = slot(slots, "momentum_buffer", p);
    buf.mul_(o.momentum).add_(d / avg);
    step = buf;
  } else {
    step = d / avg;
  }
  if (w.same(p)) {
    p.add_(step, -g.lr);
  } else {
    write_back(p, w - step * g.lr);
  }
}

Adagrad::Adagrad(std::vector<ParamGroup> groups, AdagradOptions o) : Optimizer(std::move(groups)), o_(o) {
  check_hyper(hyper(), "its");
  check_group_options();
}

AdagradOptions Adagrad::options(const ParamGroup& g) const {
  AdagradOptions o = o_;
  for (const auto& [k, v] : g.options) {
    if (k == "lr_decay") o.lr_decay = v;
    if (k == "eps") o.eps = v;
    if (k == "initial_accumulator_value") o.initial_accumulator_value = v;
  }
  return o;
}

std::map<std::string, double> Adagrad::hyper() const {
  return {{"lr_decay", o_.lr_decay}, {"eps", o_.eps}, {"initial_accumulator_value", o_.initial_accumulator_value}};
}

void Adagrad::check_hyper(const std::map<std::string, double>& h, const std::string& where) const {
  for (const char* k : {"lr_decay", "eps", "initial_accumulator_value"}) {
    const double v = h.at(k);
    KILN_CHECK(std::isfinite(v) && v >= 0, "adagrad: ", where, " ", k, " must be finite and >= 0, got ", v);
  }
}

void Adagrad::set_hyper(const std::map<std::string, double>& h) {
  check_hyper(h, "optimizer state's");
  o_ = AdagradOptions{h.at("lr_decay"), h.at("eps"), h.at("initial_accumulator_value")};
}

void Adagrad::update(const ParamGroup& g, Tensor& p, const Tensor& grad, std::map<std::string, Tensor>& slots) {
  const AdagradOptions o = options(g);
  Tensor w = in_state_dtype(p, p);
  Tensor d = in_state_dtype(grad, p);
  if (g.weight_decay != 0) d = d + w * g.weight_decay;
  const bool fresh = !slots.count("sum");
  Tensor& acc = slot(slots, "sum", p);
  // torch 2.x fills a new sum with the optimizer's initial_accumulator_value (its defaults), never a group's
  if (fresh && o_.initial_accumulator_value != 0) acc.fill_(o_.initial_accumulator_value);
  acc.add_(d * d);
  const Tensor std_ = sqrt(acc) + o.eps;
  Tensor step = d / std_;
  double alpha = -g.lr;
  if (o.lr_decay != 0) {
    // lr / (1 + (t - 1) * lr_decay) from this parameter's device-side step count t, in f64 as torch's
    // Python float, then in the update's dtype
    const Tensor clr = g.lr / ((step_t_ - 1.0) * o.lr_decay + 1.0);
    step = step * clr.to(step.dtype());
    alpha = -1.0;
  }
  if (w.same(p)) {
    p.add_(step, alpha);
  } else {
    write_back(p, w + step * alpha);
  }
}

// ---- clipping, groups --------------------------------------------------------------------------------

Tensor clip_grad_norm(const std::vector<Tensor>& params, double max_norm, double norm_type,
                      const std::function<void(Tensor& partial, bool is_max)>& reduce_partial,
                      bool error_if_nonfinite) {
  // 0 is allowed, as torch (every gradient zeroed); a negative max_norm would flip the gradients.
  KILN_CHECK(max_norm >= 0, "clip_grad_norm: max_norm must be >= 0, got ", max_norm);
  KILN_CHECK(norm_type > 0, "clip_grad_norm: norm_type must be > 0 (2 for L2, inf for the largest |g|), got ",
             norm_type);
  NoGradGuard ng;
  const bool is_max = std::isinf(norm_type);
  // Every step on the device: the partials (sums of |g|^p in f64, or the largest |g|) combined in
  // parameter order, the factor chosen there, the gradients scaled by it. The powers are taken in
  // f64 too: an f32 square overflows for |g| > ~1.8e19, which made the norm inf.
  Tensor part;
  for (const Tensor& p : params) {
    const Tensor g = p.grad();
    if (!g.defined()) continue;
    Tensor term;
    if (is_max)
      term = (g.numel() == 0 ? zeros({}, TensorOptions(DType::f32, g.device()))
                             : amax(abs(g.dtype() == DType::f64 ? g : g.to(DType::f32))))
                 .to(DType::f64);
    else if (norm_type == 1)
      term = sum(abs(g.to(DType::f64)));
    else if (norm_type == 2) {
      const Tensor gd = g.to(DType::f64);
      term = sum(gd * gd);
    } else
      term = sum(pow(abs(g.to(DType::f64)), norm_type));
    part = !part.defined() ? term : (is_max ? maximum(part, term) : part + term);
  }
  if (reduce_partial) {  // every rank joins, with or without gradients of its own
    if (!part.defined()) part = zeros({}, TensorOptions(DType::f64, params.empty() ? kCPU : params[0].device()));
    part = part.contiguous().clone();
    reduce_partial(part, is_max);
  }
  if (!part.defined()) return zeros({}, DType::f64);  // no gradients: norm 0, on the CPU
  const Tensor norm = is_max ? part : (norm_type == 2 ? sqrt(part) : pow(part, 1.0 / norm_type));
  if (error_if_nonfinite) {  // torch's check and message (a value to the host, only when asked for)
    const double n = norm.item<double>();
    KILN_CHECK(std::isfinite(n), "The total norm of order ", norm_type,
               " for gradients from `parameters` is non-finite, so it cannot be clipped. To disable this error and "
               "scale the gradients by the non-finite norm anyway, set `error_if_nonfinite=False`");
  }
  // torch's factor, min(max_norm / (norm + 1e-6), 1): an inf norm gives 0 (the gradients zeroed, an inf
  // element NaN), a NaN norm NaN; written so that a NaN quotient stays NaN.
  const Tensor q = max_norm / (norm + 1e-6);
  const Tensor factor = where(ge(q, scalar_like(1.0, q)), scalar_like(1.0, q), q);
  // A factor below FLT_MIN (a norm past ~8.5e37 x max_norm) is subnormal in an f32 (bf16) gradient's
  // multiply, and the CPU kernels flush subnormals (FTZ + DAZ): the gradients became 0 where torch's
  // come out near max_norm. On the CPU a non-f64 gradient is therefore multiplied, in one pass, by an f64
  // number (the CPU kernel's f64 pair, kernels/cpu/elementwise.cpp: the product in f64, rounded once):
  // the factor rounded to the gradient's dtype where it is normal, so the product is bit for bit torch's
  // (that dtype's multiply), and the f64 factor itself below FLT_MIN. Chosen on the device, without a
  // host read (it was two passes, by sqrt(factor) twice or by factor then 1). CUDA keeps subnormals:
  // the factor in the gradient's dtype there, as an f64 gradient's everywhere.
  const bool cpu = norm.device().is_cpu();
  const Tensor small = cpu ? lt(factor, scalar_like(double(std::numeric_limits<float>::min()), factor)) : Tensor();
  std::map<DType, Tensor> in_dtype;  // the factor as each gradient dtype takes it, made once per dtype
  for (const Tensor& p : params) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    KILN_CHECK(g.device() == norm.device(), "clip_grad_norm: gradients on ", norm.device(), " and ", g.device());
    const bool f64_pair = cpu && g.dtype() != DType::f64;
    auto it = in_dtype.find(g.dtype());
    if (it == in_dtype.end()) {
      const Tensor f = g.dtype() == DType::f64 ? factor
                       : f64_pair              ? where(small, factor, factor.to(g.dtype()).to(DType::f64))
                                               : factor.to(g.dtype());
      it = in_dtype.emplace(g.dtype(), f).first;
    }
    if (!f64_pair) {
      g.mul_(it->second);
      continue;
    }
    // mul_ would cast the number to g's dtype first; its check that g's elements do not share memory
    // (an expanded view, which one write per element would scale twice) is kept.
    detail::inplace_operand(g, it->second, "clip_grad_norm");
    detail::backend(g.device()).binary(BinaryOp::mul, detail::desc(g), detail::desc(g), detail::desc(it->second), 1.0);
    g.bump_version();
  }
  return norm;
}

void clip_grad_value(const std::vector<Tensor>& params, double clip) {
  // 0 zeroes the gradients (torch accepts it); a negative clip would give an empty range
  KILN_CHECK(clip >= 0, "clip_grad_value: clip must be >= 0, got ", clip);
  NoGradGuard ng;
  for (const Tensor& p : params) {
    Tensor g = p.grad();
    if (g.defined()) g.copy_(clamp(g, -clip, clip));
  }
}

std::vector<ParamGroup> decay_groups(const std::vector<std::pair<std::string, Tensor>>& named, double lr,
                                     double weight_decay) {
  ParamGroup decay{{}, lr, weight_decay, "decay"}, no_decay{{}, lr, 0.0, "no_decay"};
  for (const auto& [n, t] : named) (t.dim() <= 1 ? no_decay : decay).params.push_back(t);
  std::vector<ParamGroup> out;
  if (!decay.params.empty()) out.push_back(decay);
  if (!no_decay.params.empty()) out.push_back(no_decay);
  return out;
}

// ---- schedules -------------------------------------------------------------------------------------

const std::vector<std::pair<std::string, ScheduleKind>>& LrSchedule::kinds() {
  static const std::vector<std::pair<std::string, ScheduleKind>> table = {
      {"constant", ScheduleKind::constant}, {"step", ScheduleKind::step},     {"multistep", ScheduleKind::multistep},
      {"cosine", ScheduleKind::cosine},     {"linear", ScheduleKind::linear}, {"polynomial", ScheduleKind::polynomial},
  };
  return table;
}

ScheduleKind LrSchedule::parse(const std::string& n) {
  std::string known;
  for (const auto& [name, kind] : kinds()) {
    if (n == name) return kind;
    known += (known.empty() ? "" : ", ") + name;
  }
  if (n == "poly") return ScheduleKind::polynomial;
  KILN_FAIL("unknown LR schedule '", n, "' (expected one of ", known, ")");
}

void LrSchedule::check() const {
  KILN_CHECK(std::isfinite(base_lr) && base_lr >= 0, "LR schedule: base lr must be finite and >= 0, got ", base_lr);
  KILN_CHECK(std::isfinite(min_lr) && min_lr >= 0, "LR schedule: min lr must be finite and >= 0, got ", min_lr);
  KILN_CHECK(warmup_steps >= 0, "LR schedule: warmup steps must be >= 0, got ", warmup_steps);
  const bool ends = kind == ScheduleKind::cosine || kind == ScheduleKind::linear || kind == ScheduleKind::polynomial;
  // A warmup as long as the run or longer is allowed: the run warms up throughout (a short test run of a long
  // recipe); no end at all would make the rate min_lr from the first step after warmup.
  KILN_CHECK(!ends || total_steps > 0, "LR schedule: a ",
             kind == ScheduleKind::cosine   ? "cosine"
             : kind == ScheduleKind::linear ? "linear"
                                            : "polynomial",
             " schedule needs its total steps (> 0), got ", total_steps);
  KILN_CHECK(kind != ScheduleKind::polynomial || (std::isfinite(power) && power > 0),
             "LR schedule: polynomial power must be finite and > 0, got ", power);
  KILN_CHECK(kind != ScheduleKind::step || step_size >= 1, "LR schedule: step size must be >= 1, got ", step_size);
  KILN_CHECK(std::isfinite(gamma) && gamma >= 0, "LR schedule: gamma must be finite and >= 0, got ", gamma);
}

double LrSchedule::at(int64_t step) const {
  KILN_CHECK(step >= 0, "LR schedule: negative step ", step);
  check();
  if (warmup_steps > 0 && step < warmup_steps) return base_lr * double(step + 1) / double(warmup_steps);
  const int64_t s = step - warmup_steps;
  const int64_t span = std::max<int64_t>(total_steps - warmup_steps, 1);
  const double frac = std::clamp(double(s) / double(span), 0.0, 1.0);
  switch (kind) {
    case ScheduleKind::constant: return base_lr;
    case ScheduleKind::step: return base_lr * std::pow(gamma, double(s / step_size));
    case ScheduleKind::multistep: {
      int64_t passed = 0;
      for (int64_t m : milestones) passed += step >= m ? 1 : 0;
      return base_lr * std::pow(gamma, double(passed));
    }
    case ScheduleKind::cosine: return min_lr + (base_lr - min_lr) * 0.5 * (1.0 + std::cos(M_PI * frac));
    case ScheduleKind::linear: return min_lr + (base_lr - min_lr) * (1.0 - frac);
    case ScheduleKind::polynomial: return min_lr + (base_lr - min_lr) * std::pow(1.0 - frac, power);
  }
  return base_lr;
}

}  // namespace kiln::optim
