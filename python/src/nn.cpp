// The C++ side of kiln.nn modules, kiln.models, kiln.optim, kiln.amp, kiln.io and kiln.data: a C++
// module (its parameters are the tensors the Python side sees, shared, not copied), the model
// families of `kiln train`, the optimizers and LR schedules, autocast and the loss scaler,
// safetensors and checkpoint files, and the data sets and loader.
#include <nanobind/stl/filesystem.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "common.h"
#include "engine/random.h"
#include "io/checkpoint.h"
#include "io/data.h"
#include "io/safetensors.h"
#include "io/text.h"
#include "tools/zoo.h"

namespace kiln::py {
namespace {

using R = GilRelease;
auto nogil = nb::call_guard<GilRelease>();

// "a list", "an int": a value's Python type with its article, for messages.
std::string a_type(nb::handle h) {
  const std::string t = py_type_name(h);
  return (t.empty() || std::string("aeiouAEIOU").find(t[0]) == std::string::npos ? "a " : "an ") + t;
}

nb::list named(const nn::NamedTensors& v) {
  nb::list out;
  for (const auto& [n, t] : v) out.append(nb::make_tuple(n, t));
  return out;
}

// Parameters as the C++ optimizers take them: a list of tensors, or of dicts
// {"params": [...], "lr": ..., "weight_decay": ..., "name": ...} (missing values: the defaults).
std::vector<optim::ParamGroup> groups_of(nb::handle params, double lr, double weight_decay) {
  std::vector<optim::ParamGroup> groups;
  std::vector<Tensor> plain;
  for (nb::handle item : nb::iter(params)) {
    if (nb::isinstance<Tensor>(item)) {
      plain.push_back(nb::cast<Tensor>(item));
    } else if (nb::isinstance<nb::dict>(item)) {
      nb::dict d = nb::borrow<nb::dict>(item);
      const std::string g = "optimizer: parameter group " + std::to_string(groups.size());
      if (!d.contains("params")) value_error(g + " needs \"params\"");
      for (auto [k, v] : d) {
        const std::string key = nb::isinstance<nb::str>(k) ? nb::cast<std::string>(k) : str_of(k);
        if (key != "params" && key != "lr" && key != "weight_decay" && key != "name")
          value_error(g + ": unknown key '" + key +
                      "' (a group takes params, lr, weight_decay and name; the other options are the "
                      "optimizer's, for every group)");
      }
      std::vector<Tensor> ps;
      nb::object plist = d["params"];
      if (nb::isinstance<Tensor>(plist)) plist = nb::make_tuple(plist);
      for (nb::handle p : nb::iter(plist)) {
        if (!nb::isinstance<Tensor>(p)) type_error(g + ": \"params\" holds " + a_type(p) + ", expected kiln.Tensor");
        ps.push_back(nb::cast<Tensor>(p));
      }
      const double glr = d.contains("lr") ? to_double(d["lr"], (g + ": lr").c_str()) : lr;
      const double gwd =
          d.contains("weight_decay") ? to_double(d["weight_decay"], (g + ": weight_decay").c_str()) : weight_decay;
      std::string name;
      if (d.contains("name")) {
        if (!nb::isinstance<nb::str>(d["name"])) type_error(g + ": name must be a str, got " + py_type_name(d["name"]));
        name = nb::cast<std::string>(d["name"]);
      }
      groups.emplace_back(std::move(ps), glr, gwd, name);
    } else {
      type_error("optimizer: params must be tensors or dicts of parameter groups, got " + a_type(item));
    }
  }
  if (!plain.empty()) groups.emplace(groups.begin(), std::move(plain), lr, weight_decay);
  if (groups.empty()) value_error("optimizer: got an empty parameter list");
  // A frozen parameter (requires_grad_(False)) is taken, as torch takes it: the engine skips a
  // parameter without a gradient, and trains it once it is unfrozen.
  return groups;
}

// A dict of str -> kiln.Tensor for a file; `what` names the function in errors.
std::map<std::string, Tensor> tensor_dict(nb::handle h, const char* what) {
  if (!nb::isinstance<nb::dict>(h))
    type_error(std::string(what) + ": tensors must be a dict of str -> kiln.Tensor, got " + py_type_name(h));
  std::map<std::string, Tensor> out;
  for (auto [k, v] : nb::borrow<nb::dict>(h)) {
    if (!nb::isinstance<nb::str>(k))
      type_error(std::string(what) + ": tensor names must be str, got the " + py_type_name(k) + " key " + str_of(k));
    const std::string key = nb::cast<std::string>(k);
    if (!nb::isinstance<Tensor>(v))
      type_error(std::string(what) + ": '" + key + "' is " + a_type(v) + ", expected kiln.Tensor");
    out[key] = nb::cast<Tensor>(v);
  }
  return out;
}

// A checkpoint's state holds JSON values. JSON has no NaN or infinity, so a non-finite float is
// written as the object {"$float": "inf"}, "-inf", "nan" (Python's float("nan")) or, for any other
// NaN, "nan:0x<its 16 hex digits>", and load_checkpoint turns each back into the same float. A dict
// whose only key is "$float" would read back as such a float, so it is refused.
constexpr const char* kFloatKey = "$float";

nb::object non_finite_to_json(double v) {
  std::string text;
  if (std::isinf(v)) {
    text = v > 0 ? "inf" : "-inf";
  } else {
    uint64_t bits = 0, quiet = 0;
    const double canonical = std::numeric_limits<double>::quiet_NaN();
    std::memcpy(&bits, &v, sizeof bits);
    std::memcpy(&quiet, &canonical, sizeof quiet);
    if (bits == quiet) {
      text = "nan";
    } else {
      char hex[19];
      std::snprintf(hex, sizeof hex, "0x%016llx", static_cast<unsigned long long>(bits));
      text = std::string("nan:") + hex;
    }
  }
  nb::dict d;
  d[kFloatKey] = text;
  return d;
}

// The state as it is written: a copy with str keys and JSON values, non-finite floats encoded as above;
// `at` is the path to the value, for the message.
nb::object state_to_json(nb::handle h, const std::string& at) {
  if (PyFloat_Check(h.ptr())) {
    const double v = PyFloat_AS_DOUBLE(h.ptr());
    if (std::isnan(v) || std::isinf(v)) return non_finite_to_json(v);
    return nb::borrow(h);
  }
  if (nb::isinstance<nb::dict>(h)) {
    nb::dict in = nb::borrow<nb::dict>(h), out;
    if (nb::len(in) == 1 && in.contains(kFloatKey))
      value_error("save_checkpoint: " + at + " is a dict whose only key is '" + kFloatKey +
                  "', the form load_checkpoint reads a NaN or an infinity from; give it another key as well, or "
                  "rename it");
    for (auto [k, v] : in) {
      if (!nb::isinstance<nb::str>(k))
        type_error("save_checkpoint: " + at + " has the " + py_type_name(k) + " key " + str_of(k) +
                   "; JSON keys are strings (it would come back as '" + str_of(k) + "')");
      out[k] = state_to_json(v, at + "['" + nb::cast<std::string>(k) + "']");
    }
    return out;
  }
  if (nb::isinstance<nb::list>(h) || nb::isinstance<nb::tuple>(h)) {
    nb::list out;
    size_t i = 0;
    for (nb::handle v : nb::iter(h)) out.append(state_to_json(v, at + "[" + std::to_string(i++) + "]"));
    return out;
  }
  if (!h.is_none() && !PyBool_Check(h.ptr()) && !PyLong_Check(h.ptr()) && !nb::isinstance<nb::str>(h))
    type_error("save_checkpoint: " + at + " is " + a_type(h) +
               "; the state holds JSON values (dict, list, str, int, float, bool, None)");
  return nb::borrow(h);
}

// json.loads' object_hook for load_checkpoint: {"$float": "inf"} and the other forms back to floats.
nb::object float_from_json(nb::dict d) {
  if (nb::len(d) != 1 || !d.contains(kFloatKey) || !nb::isinstance<nb::str>(d[kFloatKey])) return d;
  const std::string text = nb::cast<std::string>(d[kFloatKey]);
  if (text == "inf") return nb::float_(std::numeric_limits<double>::infinity());
  if (text == "-inf") return nb::float_(-std::numeric_limits<double>::infinity());
  if (text == "nan") return nb::float_(std::numeric_limits<double>::quiet_NaN());
  if (text.size() == 22 && text.compare(0, 6, "nan:0x") == 0 &&
      text.find_first_not_of("0123456789abcdef", 6) == std::string::npos) {
    const uint64_t bits = std::stoull(text.substr(6), nullptr, 16);
    double v = 0;
    std::memcpy(&v, &bits, sizeof v);
    if (std::isnan(v)) return nb::float_(v);
  }
  value_error("load_checkpoint: the state holds {\"" + std::string(kFloatKey) + "\": \"" + text +
              "\"}, which is not a float this format writes (\"inf\", \"-inf\", \"nan\" or \"nan:0x\" and the 16 "
              "hex digits of a NaN)");
}

// An autocast region as a context manager object.
struct Autocast {
  DType dtype;
  bool enabled;
  std::unique_ptr<amp::AutocastGuard> guard;
};

// The loader as a Python iterator over epochs.
struct Loader {
  std::unique_ptr<io::DataLoader> loader;
  int64_t epoch = -1;
};

nb::dict batch_dict(const io::Batch& b) {
  nb::dict d;
  for (const auto& [k, v] : b) d[k.c_str()] = v;
  return d;
}

// The worker seed of the torch DataLoader worker process this is (torch imported, get_worker_info()
// set), or none. torch is never imported here, only looked up.
std::optional<uint64_t> torch_worker_seed() {
  nb::dict modules = nb::borrow<nb::dict>(nb::module_::import_("sys").attr("modules"));
  if (!modules.contains("torch.utils.data")) return std::nullopt;
  nb::object info = modules["torch.utils.data"].attr("get_worker_info")();
  if (info.is_none()) return std::nullopt;
  return nb::cast<uint64_t>(info.attr("seed"));
}

// The worker seed this process took, or the one current when the user seeded Kiln in the worker (fork
// copies it unset: the parent is no worker).
std::optional<uint64_t> applied_worker_seed;

// In a torch DataLoader's worker process, Kiln's generator is seeded once from the worker's seed, as
// torch seeds its own and `random` there: a forked worker otherwise inherits the parent's generator,
// and every epoch's workers repeat one augmentation. A kiln.manual_seed already made in the worker
// (its worker_init_fn) is the user's choice and stays (note_manual_seed_in_torch_worker).
void seed_torch_worker() {
  const std::optional<uint64_t> seed = torch_worker_seed();
  if (!seed || applied_worker_seed == seed) return;
  manual_seed(*seed);
  applied_worker_seed = seed;
}

// kiln.data.Subset (random_split's parts) of an engine data set, for the C++ loader: batch i of it is
// the base set's batch of indices_[i] with the same seed, so its samples and their augmentation are
// the base set's.
class SubsetDataset final : public io::Dataset {
 public:
  SubsetDataset(std::shared_ptr<const io::Dataset> base, std::vector<int64_t> indices)
      : base_(std::move(base)), indices_(std::move(indices)) {
    const int64_t n = base_->size();
    for (size_t i = 0; i < indices_.size(); ++i) {
      int64_t& j = indices_[i];
      if (j < -n || j >= n)
        index_error("Subset: index " + std::to_string(j) + " (at position " + std::to_string(i) +
                    " of its indices) is out of range for a data set of " + std::to_string(n) + " samples");
      if (j < 0) j += n;  // as the Python Subset's dataset[indices[i]]
    }
  }
  int64_t size() const override { return int64_t(indices_.size()); }
  io::Batch get_batch(const std::vector<int64_t>& idx, uint64_t seed) const override {
    std::vector<int64_t> mapped;
    mapped.reserve(idx.size());
    for (int64_t i : idx) mapped.push_back(indices_.at(size_t(i)));
    return base_->get_batch(mapped, seed);
  }
  bool random() const override { return base_->random(); }

 private:
  std::shared_ptr<const io::Dataset> base_;
  std::vector<int64_t> indices_;
};

}  // namespace

void note_manual_seed_in_torch_worker() {
  if (std::optional<uint64_t> seed = torch_worker_seed()) applied_worker_seed = seed;
}

namespace {
int64_t special_id(const io::WordPieceTokenizer& t, int64_t id, const char* token) {
  if (id < 0) value_error("WordPieceTokenizer: " + t.vocab().source() + " has no " + token + " token");
  return id;
}

std::string wordpiece_decode(const io::WordPieceTokenizer& t, const std::vector<int64_t>& ids, bool skip_special_tokens,
                             bool clean_up_tokenization_spaces) {
  std::vector<int64_t> kept;
  for (int64_t id : ids) {
    if (id < 0 || id >= t.vocab().size())
      value_error("decode: id " + std::to_string(id) + " is not in the vocabulary (0.." +
                  std::to_string(t.vocab().size() - 1) + ")");
    if (!skip_special_tokens ||
        !(id == t.pad_id || id == t.unk_id || id == t.cls_id || id == t.sep_id || id == t.mask_id))
      kept.push_back(id);
  }
  std::string out = t.decode(kept);
  if (clean_up_tokenization_spaces)  // Hugging Face's clean_up_tokenization, in its order
    for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{{" .", "."},
                                                                                   {" ?", "?"},
                                                                                   {" !", "!"},
                                                                                   {" ,", ","},
                                                                                   {" ' ", "'"},
                                                                                   {" n't", "n't"},
                                                                                   {" 'm", "'m"},
                                                                                   {" 's", "'s"},
                                                                                   {" 've", "'ve"},
                                                                                   {" 're", "'re"}})
      for (size_t at = 0; (at = out.find(from, at)) != std::string::npos;) {
        out.replace(at, from.size(), to);
        at += to.size();
      }
  return out;
}

// tokenizer(text, text_pair, ...) for one string or a list of them.
nb::dict wordpiece_call(const io::WordPieceTokenizer& t, nb::handle text, nb::handle text_pair,
                        std::optional<int64_t> max_length, nb::handle padding, bool truncation) {
  auto texts_of = [](nb::handle h, const char* what) {
    std::vector<std::string> out;
    if (nb::isinstance<nb::str>(h)) return std::make_pair(true, std::vector<std::string>{nb::cast<std::string>(h)});
    if (!nb::isinstance<nb::list>(h) && !nb::isinstance<nb::tuple>(h))
      type_error(std::string("tokenizer: ") + what + " must be a str or a list of str, got " + py_type_name(h));
    for (nb::handle x : h) {
      if (!nb::isinstance<nb::str>(x))
        type_error(std::string("tokenizer: ") + what + " holds " + a_type(x) + ", expected str");
      out.push_back(nb::cast<std::string>(x));
    }
    return std::make_pair(false, out);
  };
  const auto [one, a] = texts_of(text, "text");
  std::vector<std::string> b;
  const bool pair = !text_pair.is_none();
  if (pair) {
    const auto tp = texts_of(text_pair, "text_pair");
    if (tp.first != one || tp.second.size() != a.size())
      value_error("tokenizer: text_pair must be " + std::string(one ? "a str" : "a list of as many str") +
                  " as text (" + std::to_string(a.size()) + ")");
    b = tp.second;
  }
  std::string pad = "no";
  if (nb::isinstance<nb::bool_>(padding))
    pad = nb::cast<bool>(padding) ? "longest" : "no";
  else if (nb::isinstance<nb::str>(padding))
    pad = nb::cast<std::string>(padding);
  if (pad == "do_not_pad") pad = "no";
  if (pad != "no" && pad != "longest" && pad != "max_length")
    value_error("tokenizer: padding must be False, True, 'longest' or 'max_length', got " + str_of(padding));
  if ((truncation || pad == "max_length") && !max_length)
    value_error(std::string("tokenizer: ") + (truncation ? "truncation=True" : "padding='max_length'") +
                " needs max_length");
  if (max_length && *max_length < 1)
    value_error("tokenizer: max_length must be >= 1, got " + std::to_string(*max_length));
  const int64_t specials = pair ? 3 : 2;
  if (truncation && *max_length < specials)
    value_error("tokenizer: max_length " + std::to_string(*max_length) + " leaves no room beside the " +
                std::to_string(specials) + " special tokens");
  const int64_t cls = special_id(t, t.cls_id, "[CLS]"), sep = special_id(t, t.sep_id, "[SEP]");
  std::vector<std::vector<int64_t>> ids(a.size()), types(a.size());
  size_t longest = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    std::vector<int64_t> x = t.encode(a[i]), y;
    if (pair) y = t.encode(b[i]);
    if (truncation) {
      const size_t room = size_t(*max_length - specials);
      if (pair) {
        const auto [nx, ny] = io::longest_first(x.size(), y.size(), room);
        x.resize(nx);
        y.resize(ny);
      } else {
        x.resize(std::min(x.size(), room));
      }
    }
    ids[i] = {cls};
    ids[i].insert(ids[i].end(), x.begin(), x.end());
    ids[i].push_back(sep);
    types[i].assign(ids[i].size(), 0);
    if (pair) {
      ids[i].insert(ids[i].end(), y.begin(), y.end());
      ids[i].push_back(sep);
      types[i].resize(ids[i].size(), 1);
    }
    longest = std::max(longest, ids[i].size());
  }
  const size_t to = pad == "max_length" ? size_t(*max_length) : pad == "longest" ? longest : 0;
  std::vector<std::vector<int64_t>> mask(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    mask[i].assign(ids[i].size(), 1);
    if (ids[i].size() < to) {
      const size_t n = to - ids[i].size();
      ids[i].insert(ids[i].end(), n, special_id(t, t.pad_id, "[PAD]"));
      types[i].insert(types[i].end(), n, 0);
      mask[i].insert(mask[i].end(), n, 0);
    }
  }
  nb::dict out;
  if (one) {
    out["input_ids"] = nb::cast(ids[0]);
    out["token_type_ids"] = nb::cast(types[0]);
    out["attention_mask"] = nb::cast(mask[0]);
  } else {
    out["input_ids"] = nb::cast(ids);
    out["token_type_ids"] = nb::cast(types);
    out["attention_mask"] = nb::cast(mask);
  }
  return out;
}
}  // namespace

// The optimizer's parameters for GradScaler.unscale_/step. An enabled scaler refuses f16 gradients
// (as torch's "Attempting to unscale FP16 gradients"): unscaling in f16 underflows.
// Checked here too so that Python gets a KilnValueError naming the group and parameter.
static std::vector<Tensor> scaler_params(const amp::GradScaler& g, const optim::Optimizer& o, const char* what) {
  std::vector<Tensor> ps;
  for (size_t gi = 0; gi < o.groups().size(); ++gi) {
    const auto& gr = o.groups()[gi];
    for (size_t pi = 0; pi < gr.params.size(); ++pi) {
      const Tensor& grad = gr.params[pi].grad();
      if (g.enabled() && grad.defined() && grad.dtype() == DType::f16)  // as torch: bf16 has f32's range
        value_error(detail::str_cat("GradScaler.", what, ": param_groups[", gi, "] parameter ", pi, " (shape ",
                                    gr.params[pi].shape(), ") has a ", grad.dtype(),
                                    " gradient; unscaling f16 gradients loses them to underflow (torch: "
                                    "\"Attempting to unscale FP16 gradients\"): keep float32 parameters and run "
                                    "the forward under kiln.amp.autocast"));
    }
    ps.insert(ps.end(), gr.params.begin(), gr.params.end());
  }
  return ps;
}

void bind_nn(nb::module_& m) {
  // ---- C++ modules ----
  nb::class_<nn::Module>(m, "_CModule", "A module built in C++ (a model of kiln.models).")
      .def_prop_ro("type_name", &nn::Module::type_name)
      .def("named_parameters", [](const nn::Module& x) { return named(x.named_parameters()); })
      .def("named_buffers", [](const nn::Module& x) { return named(x.named_buffers()); })
      .def(
          "own_tensors",
          [](const nn::Module& x, bool params) {
            // This module's own parameters (or buffers), not its children's, in registration order:
            // (name, tensor, key), the key naming the tensor itself (two names of one tied tensor share
            // it), so the Python CppModule wraps each tensor once. A child's name ends every one of its
            // tensors' names with the child's prefix; the module's own come first in collect's order, so
            // the subtree's first-name dedup drops none of them but a second name in this very module,
            // which state_dict (every name) gives back.
            std::vector<std::string> kids;
            for (const auto& [n, c] : x.children()) kids.push_back(n + ".");
            auto own = [&](const std::string& n) {
              return std::none_of(kids.begin(), kids.end(), [&](const std::string& k) { return n.rfind(k, 0) == 0; });
            };
            const nn::NamedTensors all = params ? x.named_parameters() : x.named_buffers();
            std::set<const TensorImpl*> kind;
            std::set<std::string> listed;
            nb::list out;
            for (const auto& [n, t] : all) {
              kind.insert(&t.impl());
              if (!own(n)) continue;
              listed.insert(n);
              out.append(nb::make_tuple(n, t, uintptr_t(&t.impl())));
            }
            for (const auto& [n, t] : x.state_dict())
              if (own(n) && !listed.count(n) && kind.count(&t.impl()))
                out.append(nb::make_tuple(n, t, uintptr_t(&t.impl())));
            return out;
          },
          nb::arg("params"))
      .def(
          "forward",
          [](nn::Module& x, const Tensor& in) {
            auto* layer = dynamic_cast<nn::Layer*>(&x);
            if (!layer)
              type_error("a " + x.type_name() +
                         " of a kiln.models model cannot be called on its own (its forward takes more than one "
                         "tensor); call the whole model");
            R r;
            return layer->forward(in);
          },
          nb::arg("input"))
      .def("children",
           [](const nn::Module& x) {
             nb::list out;
             for (const auto& [n, c] : x.children()) out.append(nb::make_tuple(n, c));
             return out;
           })
      .def(
          "train", [](nn::Module& x, bool on) { x.train(on); }, nb::arg("mode") = true)
      .def_prop_ro("training", &nn::Module::is_training)
      .def("zero_grad", &nn::Module::zero_grad)
      .def("to_dtype", [](nn::Module& x, nb::handle d) { x.to(to_dtype(d)); })
      .def("to_device",
           [](nn::Module& x, nb::handle d) {
             const Device dev = to_device(d);
             R r;
             x.to(dev);
           })
      .def("state_dict", &nn::Module::state_dict)
      .def(
          "load_state_dict",
          [](nn::Module& m, const nn::StateDict& sd, bool strict) {
            const nn::Module::IncompatibleKeys k = m.load_state_dict(sd, strict);
            return std::make_pair(k.missing, k.unexpected);
          },
          nb::arg("state_dict"), nb::arg("strict") = true, nogil)
      .def("num_parameters", &nn::Module::num_parameters);

  // ---- the model families of `kiln train` ----
  struct ZooModel {
    tools::BuiltModel built;
    std::string name;
  };
  nb::class_<ZooModel>(m, "_ZooModel")
      .def_prop_ro("module", [](const ZooModel& z) { return z.built.module; })
      .def_prop_ro("input_names", [](const ZooModel& z) { return z.built.input_names; })
      .def(
          "run",
          [](const ZooModel& z, const std::map<std::string, Tensor>& in) {
            R r;
            return z.built.run(in, z.name);
          },
          nb::arg("inputs"));
  m.def(
      "_create_model",
      [](const std::string& name, const std::vector<std::string>& sets, bool deterministic) {
        const tools::ModelFamily* fam = tools::find_model_family(name);
        if (!fam) value_error(tools::unknown_model_message(name));
        return ZooModel{fam->build(name, sets, deterministic), name};
      },
      nb::arg("name"), nb::arg("sets") = std::vector<std::string>{}, nb::arg("deterministic") = false);
  m.def(
      "_normalise_checkpoint_names",
      [](const nn::StateDict& in, const nn::StateDict& mine, const std::string& file) {
        return tools::normalise_checkpoint_names(in, mine, file);
      },
      nb::arg("state_dict"), nb::arg("mine"), nb::arg("file") = std::string(),
      "tools::normalise_checkpoint_names: a checkpoint's names mapped onto a model's (`mine`: its state dict), "
      "as `kiln forward` loads one: Hugging Face's \"bert.\" prefix, gamma/beta, the tied decoder.");
  m.def(
      "_drop_unused_heads",
      [](const nn::Module& module, nn::StateDict in, const std::string& file, const std::string& model) {
        std::string said = tools::remove_unused_heads(module, in, file, model);
        return std::make_pair(std::move(in), std::move(said));
      },
      nb::arg("module"), nb::arg("state_dict"), nb::arg("file"), nb::arg("model"),
      "tools::remove_unused_heads: a checkpoint's state dict (names normalised) without the heads the model never "
      "uses (a pretraining file's pooler and next-sentence head for a masked-LM model, as kiln ckpt import drops "
      "them), and the sentence naming them (\"\" if none).");
  m.def(
      "_hf_bert_config_sets", [](const std::string& path) { return tools::hf_bert_config_sets(path); }, nb::arg("path"),
      "tools::hf_bert_config_sets: a Hugging Face BERT config.json as Kiln's key=value overrides; what Kiln's "
      "BERT does not compute is an error naming the key and value.");
  m.def("_model_names", [] {
    std::vector<std::string> out;
    for (const auto& f : tools::model_families()) out.insert(out.end(), f.names.begin(), f.names.end());
    return out;
  });

  // ---- optimizers ----
  nb::class_<optim::Optimizer>(m, "_Optimizer")
      .def_prop_ro("name", &optim::Optimizer::name)
      .def(
          "step",
          [](optim::Optimizer& o) {
            R r;
            o.step();
          },
          "One update of every parameter that has a gradient (the fused kernel where it applies).")
      .def("zero_grad", &optim::Optimizer::zero_grad, nb::arg("set_to_none") = true)
      .def("set_lr", &optim::Optimizer::set_lr, nb::arg("lr"))
      .def_prop_ro("lrs",
                   [](const optim::Optimizer& o) {
                     std::vector<double> v;
                     for (const auto& g : o.groups()) v.push_back(g.lr);
                     return v;
                   })
      .def("set_group_lr",
           [](optim::Optimizer& o, size_t i, double lr) {
             if (i >= o.groups().size()) index_error("optimizer: no parameter group " + std::to_string(i));
             // any finite lr is kept, as torch keeps a schedule's last (below 0 past its end); step() refuses
             // a negative one
             if (!std::isfinite(lr))
               value_error("optimizer: group " + std::to_string(i) + "'s lr must be finite, got " +
                           str_of(nb::float_(lr)));
             o.groups()[i].lr = lr;
           })
      .def("set_group_weight_decay",
           [](optim::Optimizer& o, size_t i, double wd) {
             if (i >= o.groups().size()) index_error("optimizer: no parameter group " + std::to_string(i));
             if (!std::isfinite(wd) || wd < 0)
               value_error("optimizer: group " + std::to_string(i) + "'s weight_decay must be finite and >= 0, got " +
                           str_of(nb::float_(wd)));
             o.groups()[i].weight_decay = wd;
           })
      .def(
          "set_group_options",
          [](optim::Optimizer& o, size_t i, const std::map<std::string, double>& options) {
            try {
              o.set_group_options(i, options);
            } catch (const Error& e) {
              value_error(e.message());  // a bad value, as torch's ValueError
            }
          },
          "Sets group i's own hyper-parameters (the engine's names: momentum, dampening, nesterov; beta1, "
          "beta2, eps), replacing those it had; a key not given takes the optimizer's value.")
      .def(
          "group_hyper", [](const optim::Optimizer& o, size_t i) { return o.group_hyper(i); },
          "Group i's hyper-parameters: the optimizer's, with the group's own in their place.")
      .def_prop_ro("groups",
                   [](const optim::Optimizer& o) {
                     nb::list out;  // (params, lr, weight_decay, name) per group
                     for (const auto& g : o.groups())
                       out.append(nb::make_tuple(g.params, g.lr, g.weight_decay, g.name));
                     return out;
                   })
      .def("group_steps", [](const optim::Optimizer& o, size_t g, size_t i) { return o.steps(g, i); })
      .def_prop_ro("steps", [](const optim::Optimizer& o) { return o.steps(); })
      .def("state",
           [](const optim::Optimizer& o) {
             const optim::OptimizerState s = o.state();
             return nb::make_tuple(s.tensors, s.scalars);
           })
      .def("load_state",
           [](optim::Optimizer& o, const std::map<std::string, Tensor>& t, const std::map<std::string, double>& sc) {
             optim::OptimizerState s;
             s.tensors = t;
             s.scalars = sc;
             o.load_state(s);
           });
  m.def("_sgd", [](nb::handle params, double lr, double momentum, double dampening, bool nesterov, double wd) {
    optim::SgdOptions o;
    o.momentum = momentum;
    o.dampening = dampening;
    o.nesterov = nesterov;
    return std::unique_ptr<optim::Optimizer>(new optim::SGD(groups_of(params, lr, wd), o));
  });
  m.def("_adamw", [](nb::handle params, double lr, double b1, double b2, double eps, double wd, bool lamb) {
    optim::AdamOptions o{b1, b2, eps};
    auto groups = groups_of(params, lr, wd);
    if (lamb) return std::unique_ptr<optim::Optimizer>(new optim::LAMB(std::move(groups), o));
    return std::unique_ptr<optim::Optimizer>(new optim::AdamW(std::move(groups), o));
  });
  m.def("_rmsprop",
        [](nb::handle params, double lr, double alpha, double eps, double momentum, bool centered, double wd) {
          optim::RmspropOptions o{alpha, eps, momentum, centered};
          return std::unique_ptr<optim::Optimizer>(new optim::RMSprop(groups_of(params, lr, wd), o));
        });
  m.def("_adagrad",
        [](nb::handle params, double lr, double lr_decay, double eps, double initial_accumulator_value, double wd) {
          optim::AdagradOptions o{lr_decay, eps, initial_accumulator_value};
          return std::unique_ptr<optim::Optimizer>(new optim::Adagrad(groups_of(params, lr, wd), o));
        });
  m.def(
      "clip_grad_norm_",
      [](const std::vector<Tensor>& ps, double max_norm, double norm_type, bool error_if_nonfinite) {
        return optim::clip_grad_norm(ps, max_norm, norm_type, {}, error_if_nonfinite);
      },
      nb::arg("parameters"), nb::arg("max_norm"), nb::arg("norm_type") = 2.0, nb::arg("error_if_nonfinite") = false,
      nogil,
      "Scales gradients by min(max_norm / (norm + 1e-6), 1) (norm_type: 2, any p > 0, or inf for the "
      "largest |g|); returns the norm before clipping.");
  m.def(
      "clip_grad_value_", [](const std::vector<Tensor>& ps, double clip) { optim::clip_grad_value(ps, clip); },
      nb::arg("parameters"), nb::arg("clip_value"), nogil, "Clamps every gradient to [-clip_value, clip_value].");
  m.def("_decay_groups", [](const std::vector<std::pair<std::string, Tensor>>& named, double lr, double wd) {
    nb::list out;
    for (const auto& g : optim::decay_groups(named, lr, wd)) {
      nb::dict d;
      d["params"] = g.params;
      d["lr"] = g.lr;
      d["weight_decay"] = g.weight_decay;
      d["name"] = g.name;
      out.append(d);
    }
    return out;
  });
  nb::class_<optim::LrSchedule>(m, "LrSchedule", "The learning rate per optimizer step (the schedules of kiln train).")
      .def(
          "__init__",
          [](optim::LrSchedule* s, const std::string& kind, double base_lr, int64_t warmup_steps, int64_t total_steps,
             double min_lr, int64_t step_size, double gamma, std::vector<int64_t> milestones, double power) {
            new (s) optim::LrSchedule();
            try {
              s->kind = optim::LrSchedule::parse(kind);
            } catch (const Error& e) {
              value_error(e.message());
            }
            s->base_lr = base_lr;
            s->warmup_steps = warmup_steps;
            s->total_steps = total_steps;
            s->min_lr = min_lr;
            s->step_size = step_size;
            s->gamma = gamma;
            s->milestones = std::move(milestones);
            s->power = power;
            try {  // checked here, not first at at()
              s->check();
            } catch (const Error& e) {
              value_error(e.message());
            }
          },
          nb::arg("kind"), nb::arg("base_lr"), nb::arg("warmup_steps") = 0, nb::arg("total_steps") = 0,
          nb::arg("min_lr") = 0.0, nb::arg("step_size") = 1, nb::arg("gamma") = 0.1,
          nb::arg("milestones") = std::vector<int64_t>{}, nb::arg("power") = 1.0)
      .def(
          "at", [](const optim::LrSchedule& s, nb::handle step) { return s.at(to_int64(step, "LrSchedule: step")); },
          nb::arg("step"), "The rate of optimizer step `step` (0-based).")
      .def(
          "__call__",
          [](const optim::LrSchedule& s, nb::handle step) { return s.at(to_int64(step, "LrSchedule: step")); },
          nb::arg("step"));

  // ---- mixed precision ----
  nb::class_<Autocast>(m, "autocast", "Autocast region: with kiln.amp.autocast(kiln.bfloat16): ... (per thread).")
      .def(
          "__init__",
          [](Autocast* a, nb::handle dtype, bool enabled) {
            const DType d = to_dtype(dtype);
            if (!is_low_precision(d)) value_error("autocast: dtype must be float16 or bfloat16");
            new (a) Autocast{d, enabled, nullptr};
          },
          nb::arg("dtype") = "bfloat16", nb::arg("enabled") = true)
      .def(
          "__enter__",
          [](Autocast& a) {
            if (a.guard) value_error("autocast: this region is already entered");
            a.guard = std::make_unique<amp::AutocastGuard>(a.dtype, a.enabled);
            return &a;
          },
          nb::rv_policy::reference)
      .def("__exit__", [](Autocast& a, nb::args) {
        a.guard.reset();
        return false;
      });
  m.def("autocast_dtype", [] { return amp::autocast_dtype(); });
  nb::class_<amp::GradScaler>(m, "_GradScaler", "Dynamic loss scaling for float16 training (as torch.amp.GradScaler).")
      .def(
          "__init__",
          [](amp::GradScaler* g, double init_scale, double growth_factor, double backoff_factor,
             int64_t growth_interval, bool enabled) {
            amp::GradScalerOptions o;
            o.init_scale = init_scale;
            o.growth_factor = growth_factor;
            o.backoff_factor = backoff_factor;
            o.growth_interval = growth_interval;
            o.enabled = enabled;
            new (g) amp::GradScaler(o);
          },
          nb::arg("init_scale") = 65536.0, nb::arg("growth_factor") = 2.0, nb::arg("backoff_factor") = 0.5,
          nb::arg("growth_interval") = 2000, nb::arg("enabled") = true)
      .def("scale", &amp::GradScaler::scale, nb::arg("loss"), nogil)
      .def(
          "unscale_",
          [](amp::GradScaler& g, optim::Optimizer& o) {
            const std::vector<Tensor> ps = scaler_params(g, o, "unscale_");
            R r;
            g.unscale(o, ps);
          },
          nb::arg("optimizer"))
      .def(
          "step",
          [](amp::GradScaler& g, optim::Optimizer& o) {
            const std::vector<Tensor> ps = scaler_params(g, o, "step");
            R r;
            g.step(o, ps);
          },
          nb::arg("optimizer"), "Unscales (unless unscale_ ran), then steps unless a gradient is inf/NaN.")
      .def("_rename_optimizer", &amp::GradScaler::rename_optimizer, nb::arg("was"), nb::arg("now"))
      .def("update", &amp::GradScaler::update, nogil)
      .def("get_scale", &amp::GradScaler::get_scale)
      .def_prop_ro("skipped_steps", &amp::GradScaler::skipped_steps)
      .def_prop_ro("last_step_skipped", &amp::GradScaler::last_step_skipped);

  // ---- files ----
  m.def(
      "save_safetensors",
      [](const std::filesystem::path& path_, nb::handle tensors_, nb::handle metadata_) {
        const std::string path = path_.string();
        const std::map<std::string, Tensor> tensors = tensor_dict(tensors_, "save");
        std::map<std::string, std::string> metadata;
        if (!metadata_.is_none()) {
          if (!nb::isinstance<nb::dict>(metadata_))
            type_error("save: metadata must be a dict of str -> str, got " + py_type_name(metadata_));
          for (auto [k, v] : nb::borrow<nb::dict>(metadata_)) {
            if (!nb::isinstance<nb::str>(k) || !nb::isinstance<nb::str>(v))
              type_error("save: metadata must map str to str (safetensors), got " + py_type_name(k) + " " + str_of(k) +
                         " -> " + py_type_name(v));
            metadata[nb::cast<std::string>(k)] = nb::cast<std::string>(v);
          }
        }
        R r;
        io::save_safetensors(path, tensors, metadata);
      },
      nb::arg("path"), nb::arg("tensors"), nb::arg("metadata").none() = nb::none(),
      "Writes a dict of tensors (any device and layout) atomically: a crash never leaves half a file.");
  m.def(
      "load_safetensors",
      [](const std::filesystem::path& path_) {
        const std::string path = path_.string();
        io::SafetensorsFile f;
        {
          R r;
          f = io::load_safetensors(path);
        }
        return nb::make_tuple(f.tensors, f.metadata);
      },
      nb::arg("path"), "(tensors, metadata) of a safetensors file; damaged files are errors naming the part.");
  m.def(
      "_parse_safetensors",
      [](nb::bytes data, const std::string& what) {
        io::SafetensorsFile f;
        {
          R r;
          f = io::parse_safetensors(reinterpret_cast<const uint8_t*>(data.c_str()), data.size(), what);
        }
        return nb::make_tuple(f.tensors, f.metadata);
      },
      nb::arg("data"), nb::arg("what"));
  m.def(
      "save_checkpoint",
      [](const std::filesystem::path& path_, nb::handle tensors_, nb::handle state) {
        const std::string path = path_.string();
        const std::map<std::string, Tensor> tensors = tensor_dict(tensors_, "save_checkpoint");
        if (!nb::isinstance<nb::dict>(state))
          type_error("save_checkpoint: state must be a dict (a JSON object), got " + py_type_name(state));
        const nb::object json_state = state_to_json(state, "state");
        const std::string js =
            nb::cast<std::string>(nb::module_::import_("json").attr("dumps")(json_state, nb::arg("allow_nan") = false));
        std::vector<std::pair<std::string, Tensor>> v(tensors.begin(), tensors.end());
        R r;
        io::save_checkpoint(path, v, js);
      },
      nb::arg("path"), nb::arg("tensors"), nb::arg("state") = nb::dict(),
      "Kiln's checkpoint format (docs/checkpoint-format.md): tensors with CRC32C checksums plus a JSON state; atomic.");
  m.def(
      "load_checkpoint",
      [](const std::filesystem::path& path_) {
        const std::string path = path_.string();
        std::map<std::string, Tensor> tensors;
        std::string js;
        {
          R r;
          io::CheckpointReader reader(path);
          for (const auto& e : reader.entries()) tensors[e.name] = reader.read(e.name);
          js = reader.state_json();
        }
        return nb::make_tuple(tensors, nb::module_::import_("json").attr("loads")(
                                           js, nb::arg("object_hook") = nb::cpp_function(float_from_json)));
      },
      nb::arg("path"), "(tensors, state) of a Kiln checkpoint, every checksum verified.");

  // ---- data ----
  nb::class_<io::Dataset>(m, "Dataset", "A data set of the engine: size, and batches by index.")
      .def("__len__", &io::Dataset::size)
      .def(
          "get_batch",
          [](const io::Dataset& d, const std::vector<int64_t>& idx, uint64_t seed) {
            io::Batch b;
            {
              R r;
              b = d.get_batch(idx, seed);
            }
            return batch_dict(b);
          },
          nb::arg("indices"), nb::arg("seed") = 0)
      .def(
          "__getitem__",
          [](const io::Dataset& d, int64_t i) {
            // One sample, as get_batch([i]) without the batch dim (Python's negative indices too), so a
            // Subset, random_split or a Python wrapper can index an engine data set.
            const int64_t n = d.size();
            if (i < -n || i >= n)
              index_error("Dataset: index " + std::to_string(i) + " is out of range for " + std::to_string(n) +
                          " samples");
            // A fresh augmentation each call, as a torch data set's random transform draws from torch's
            // generator: the seed comes from Kiln's (kiln.manual_seed), taken here with the GIL held. A
            // fixed seed froze one augmented sample per index for a loop or a torch DataLoader over it.
            // A set without augmentation (a test split) draws nothing: peeking at it must not move the
            // generator that model init and a DataLoader's default seed draw from next.
            uint64_t seed = 0;
            if (d.random()) {
              seed_torch_worker();
              Generator& g = default_generator();
              PhiloxStream draw(g.seed, g.reserve(4) / 4);
              seed = uint64_t(draw.next_u32()) << 32 | draw.next_u32();
            }
            io::Batch b;
            {
              R r;
              b = d.get_batch({i < 0 ? i + n : i}, seed);
              for (auto& kv : b) kv.second = kv.second.select(0, 0);
            }
            return batch_dict(b);
          },
          nb::arg("index"),
          "Sample `index` as a dict of tensors: get_batch([index], seed) without the batch dim, the seed "
          "drawn from Kiln's generator (kiln.manual_seed), so each call is a fresh augmentation. (A "
          "DataLoader over an engine data set or a Subset of one reads it in batches, augmented per "
          "epoch from its own seed.)");
  m.def("_subset", [](std::shared_ptr<io::Dataset> base, std::vector<int64_t> indices) {
    return std::static_pointer_cast<io::Dataset>(std::make_shared<SubsetDataset>(std::move(base), std::move(indices)));
  });
  m.def("_load_mnist_dir", [](const std::string& dir, const std::string& name, int64_t pad_crop, bool hflip,
                              std::vector<float> mean, std::vector<float> std) {
    io::ImageTransform t;
    t.pad_crop = pad_crop;
    t.hflip = hflip;
    t.mean = std::move(mean);
    t.std = std::move(std);
    io::ImageClassData d;
    {
      R r;
      d = io::load_mnist_dir(dir, t, name);
    }
    nb::dict out;
    out["train"] = std::static_pointer_cast<io::Dataset>(d.train);
    out["test"] = std::static_pointer_cast<io::Dataset>(d.test);
    out["num_classes"] = d.num_classes;
    out["shape"] = nb::make_tuple(d.channels, d.height, d.width);
    out["class_names"] = d.class_names;
    return out;
  });
  // kiln.data's worker threads left inside a __getitem__ at exit (blocked past its wait for them)
  // keep what their frames hold (the dataset module's globals with them): not the binding's leaks,
  // so kiln.data turns the report off then; and in a forked child of a parent with other Python
  // threads, whose frames the child never frees.
  m.def("_set_leak_warnings", [](bool on) { nb::set_leak_warnings(on); });
  nb::class_<Loader>(m, "_Loader")
      .def("__init__",
           [](Loader* l, std::shared_ptr<io::Dataset> ds, int64_t batch_size, bool shuffle, bool drop_last,
              uint64_t seed, int workers, bool pin_memory, int rank, int world_size, int prefetch) {
             io::LoaderOptions o;
             if (prefetch > 0) o.prefetch = prefetch;  // prefetch_factor * workers (0: the default, 4 in all)
             o.rank = rank;
             o.world_size = world_size;  // each rank a disjoint part, padded to equal sizes (pad_ranks)
             o.batch_size = batch_size;
             o.shuffle = shuffle;
             o.drop_last = drop_last;
             o.seed = seed;
             o.workers = workers;
             o.pin_memory = pin_memory;
             new (l) Loader{std::make_unique<io::DataLoader>(std::move(ds), o), -1};
           })
      .def("__len__", [](const Loader& l) { return l.loader->batches_per_epoch(); })
      .def(
          "start_epoch",
          [](Loader& l, std::optional<int64_t> epoch) {
            l.epoch = epoch ? *epoch : l.epoch + 1;
            R r;
            l.loader->seek({l.epoch, 0});
          },
          nb::arg("epoch") = nb::none())
      .def("next",
           [](Loader& l) -> nb::object {
             std::optional<io::Batch> b;
             {
               R r;
               b = l.loader->next();
             }
             if (!b) return nb::none();
             return batch_dict(*b);
           })
      .def_prop_ro("epoch", [](const Loader& l) { return l.epoch; });

  // ---- text: WordPiece, the masked-LM corpus, label<TAB>text files ----
  nb::class_<io::WordPieceTokenizer>(m, "WordPieceTokenizer", "BERT's WordPiece over a vocab.txt.")
      .def(
          "__init__",
          [](io::WordPieceTokenizer* t, const std::string& vocab, bool lower_case) {
            io::BasicTokenizerOptions o;
            o.lower_case = o.strip_accents = lower_case;
            io::Vocab v;
            {
              R r;
              v = io::Vocab::load(vocab);
            }
            new (t) io::WordPieceTokenizer(std::move(v), o);
          },
          nb::arg("vocab"), nb::arg("lower_case") = true)
      .def("tokenize", [](const io::WordPieceTokenizer& t, const std::string& s) { return t.tokenize(s); })
      .def(
          "encode",
          [](const io::WordPieceTokenizer& t, const std::string& s, bool add_special_tokens) {
            std::vector<int64_t> ids = t.encode(s);
            if (add_special_tokens) {
              ids.insert(ids.begin(), special_id(t, t.cls_id, "[CLS]"));
              ids.push_back(special_id(t, t.sep_id, "[SEP]"));
            }
            return ids;
          },
          nb::arg("text"), nb::arg("add_special_tokens") = true,
          "Token ids, [CLS] ... [SEP] around them as Hugging Face's encode (add_special_tokens=False: the "
          "text's alone).")
      .def("decode", &wordpiece_decode, nb::arg("ids"), nb::arg("skip_special_tokens") = false,
           nb::arg("clean_up_tokenization_spaces") = true,
           "Text of `ids` as Hugging Face's decode: tokens joined with spaces, ## pieces glued to the one "
           "before; skip_special_tokens drops [PAD] [UNK] [CLS] [SEP] [MASK]; clean_up_tokenization_spaces "
           "removes the space before . ? ! , and in ' , n't 'm 's 've 're.")
      .def("__call__", &wordpiece_call, nb::arg("text"), nb::arg("text_pair") = nb::none(),
           nb::arg("max_length") = nb::none(), nb::arg("padding") = false, nb::arg("truncation") = false,
           "As Hugging Face's tokenizer(text, text_pair): a dict of input_ids, token_type_ids and "
           "attention_mask lists (lists of lists for a list of texts): [CLS] a [SEP] (b [SEP]), type 1 from "
           "b on. truncation=True cuts to max_length ('longest_first' for a pair); padding='max_length' "
           "pads to max_length, True or 'longest' to the longest of the texts ([PAD], type 0, mask 0).")
      .def_prop_ro("vocab_size", [](const io::WordPieceTokenizer& t) { return t.vocab().size(); })
      .def("token", [](const io::WordPieceTokenizer& t, int64_t id) { return t.vocab().token(id); })
      .def("id", [](const io::WordPieceTokenizer& t, const std::string& tok) { return t.vocab().id(tok); });
  m.def(
      "build_vocab",
      [](const std::vector<std::string>& files, const std::string& out, int64_t size, int64_t min_frequency,
         bool lower_case) {
        io::BasicTokenizerOptions o;
        o.lower_case = o.strip_accents = lower_case;
        R r;
        io::build_wordpiece_vocab(files, size, o, min_frequency).save(out);
      },
      nb::arg("files"), nb::arg("out"), nb::arg("size") = 8000, nb::arg("min_frequency") = 2,
      nb::arg("lower_case") = true, "Learns a WordPiece vocab.txt from text files (as `kiln vocab`).");
  m.def(
      "_mlm_dataset",
      [](std::shared_ptr<io::WordPieceTokenizer> tok, const std::vector<std::string>& files, int64_t seq_len,
         double mask_prob) {
        io::MlmOptions o;
        o.seq_len = seq_len;
        o.mask_prob = mask_prob;
        R r;
        return std::static_pointer_cast<io::Dataset>(std::make_shared<io::MlmDataset>(tok, files, o));
      },
      nb::arg("tokenizer"), nb::arg("files"), nb::arg("seq_len"), nb::arg("mask_prob"));
  m.def(
      "_tsv_dataset",
      [](std::shared_ptr<io::WordPieceTokenizer> tok, const std::string& path, int64_t seq_len,
         std::vector<std::string> labels) {
        std::shared_ptr<io::TsvClassificationDataset> d;
        {
          R r;
          d = std::make_shared<io::TsvClassificationDataset>(tok, path, seq_len, std::move(labels));
        }
        return nb::make_tuple(std::static_pointer_cast<io::Dataset>(d), d->label_names());
      },
      nb::arg("tokenizer"), nb::arg("path"), nb::arg("seq_len"), nb::arg("label_names"));
}

}  // namespace kiln::py
