// Autograd from Python: grad mode, backward and grad over several tensors, custom functions with a
// Python backward (kiln.autograd.Function records through _record_function), and gradcheck.
#include <nanobind/stl/function.h>

#include <mutex>
#include <set>
#include <sstream>

#include "common.h"

namespace kiln::py {
namespace {

// Node names live as long as the process (autograd keeps a const char*); one copy per distinct name.
const char* intern(const std::string& name) {
  static std::mutex mu;
  static std::set<std::string> names;
  std::lock_guard<std::mutex> lock(mu);
  return names.insert(name).first->c_str();
}

std::vector<Tensor> tensors_or_empty(const std::optional<std::vector<std::optional<Tensor>>>& v) {
  std::vector<Tensor> out;
  if (v)
    for (const auto& t : *v) out.push_back(t ? *t : Tensor());
  return out;
}

}  // namespace

void bind_autograd(nb::module_& m) {
  m.def("is_grad_enabled", &GradMode::enabled);
  m.def("_set_grad_enabled", &GradMode::set_enabled, nb::arg("enabled"));

  nb::class_<SavedTensor>(m, "_SavedTensor",
                          "A tensor kept for a Python Function's backward: unpack() gives it back, with its "
                          "history in a backward with create_graph (an output of the Function: the Function's "
                          "node, once it records).")
      .def(nb::init<const Tensor&>(), nb::arg("tensor"))
      .def(
          "unpack", [](const SavedTensor& s, const std::string& op) { return s.unpack(op.c_str()); }, nb::arg("op"));

  m.def(
      "_record_function",
      [](const std::string& name, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
         nb::callable backward, bool inputs_modified, bool once_differentiable) {
        auto fn = hold(backward);
        const size_t n_in = inputs.size();
        const std::string label = name;
        autograd::record(
            intern(name), inputs, outputs,
            [fn, n_in, label](const GradCtx& c) -> std::vector<Tensor> {
              GilAcquire gil;
              KILN_CHECK(!fn->obj.is_none(), label, ": the Python backward was released at interpreter exit");
              nb::list grads;
              for (const Tensor& g : *c.grads) grads.append(nb::cast(g));
              nb::list needs;
              for (size_t i = 0; i < n_in; ++i) needs.append(c.needs_grad(i));
              nb::list reached;
              for (size_t i = 0; i < c.grads->size(); ++i) reached.append(!c.reached || (*c.reached)[i]);
              nb::object res = fn->obj(grads, needs, reached);
              if (nb::isinstance<Tensor>(res) || res.is_none()) res = nb::make_tuple(res);
              std::vector<Tensor> out;
              for (nb::handle h : nb::iter(res)) {
                if (h.is_none()) {
                  out.push_back(Tensor());
                } else if (nb::isinstance<Tensor>(h)) {
                  out.push_back(nb::cast<Tensor>(h));
                } else {
                  KILN_FAIL(label, ".backward returned a ",
                            nb::cast<std::string>(nb::str(nb::handle(reinterpret_cast<PyObject*>(Py_TYPE(h.ptr()))))),
                            ", expected kiln.Tensor or None");
                }
              }
              KILN_CHECK(out.size() == n_in, label, ".backward returned ", out.size(), " gradients for ", n_in,
                         " tensor inputs of forward");
              for (size_t i = 0; i < n_in; ++i)
                if (out[i].defined() && !c.needs_grad(i)) out[i] = Tensor();
              return out;
            },
            {.inputs_modified = inputs_modified, .once_differentiable = once_differentiable});
      },
      nb::arg("name"), nb::arg("inputs"), nb::arg("outputs"), nb::arg("backward"), nb::arg("inputs_modified") = false,
      nb::arg("once_differentiable") = false,
      "Records backward(grads, needs_input_grad, reached) -> one gradient (or None) per input as the backward of "
      "outputs (reached: whether a gradient reached each output; the others' are zeros). inputs_modified: an "
      "output may be an input modified in place, whose history becomes this node. once_differentiable: a "
      "second derivative through it is an error (otherwise, with create_graph, backward's ops are recorded).");

  m.def(
      "_shared_memory",
      [](const Tensor& x, const std::vector<Tensor>& own) -> std::string {
        // Who holds x's memory besides x: the aliases autograd saved for backward (its version counter
        // catches a stale one) and those in `own` (the ctx's saved tensors) are fine; anything else is
        // a view of x, the tensor x is a view of, or another alias, whose history Kiln cannot move.
        if (!x.defined() || !x.storage()) return "";
        const Storage* s = x.storage().get();
        std::set<const TensorImpl*> mine;
        for (const Tensor& t : own)
          if (t.defined() && t.storage().get() == s && &t.impl() != &x.impl()) mine.insert(&t.impl());
        const long holders = x.storage().use_count();
        const long others = holders - 1 - long(mine.size()) - long(autograd::saved_aliases(x));
        if (others <= 0) return "";
        std::ostringstream os;
        const size_t storage_bytes = x.storage()->nbytes;
        if (x.offset() != 0 || x.nbytes() < storage_bytes) {
          os << "is a view of a larger tensor (it covers " << x.nbytes() << " of the " << storage_bytes
             << " bytes of its memory, which " << others << " other tensor" << (others == 1 ? "" : "s") << " also hold"
             << (others == 1 ? "s" : "") << ")";
        } else {
          os << "shares its memory with " << others << " other tensor" << (others == 1 ? "" : "s")
             << " (a view of it, the tensor it is a view of, or an alias such as x.detach())";
        }
        return os.str();
      },
      nb::arg("x"), nb::arg("own"),
      "Empty when only x, autograd's saved tensors and `own` hold x's memory; otherwise what else does.");

  m.def("_recomputing", &autograd::recomputing,
        "True while checkpoint's backward reruns its block on this thread (batch norm then leaves its running "
        "statistics alone: they were counted in the first run).");

  m.def(
      "_checkpoint",
      [](nb::callable fn, const std::vector<Tensor>& inputs) {
        auto held = hold(fn);
        auto run = [held](const std::vector<Tensor>& xs) -> std::vector<Tensor> {
          GilAcquire gil;  // backward reruns it without the GIL held
          KILN_CHECK(!held->obj.is_none(), "checkpoint: the function was released at interpreter exit");
          nb::list args;
          for (const Tensor& x : xs) args.append(nb::cast(x));
          nb::object res = held->obj(*nb::tuple(args));
          if (nb::isinstance<Tensor>(res)) return {nb::cast<Tensor>(res)};
          if (!nb::isinstance<nb::tuple>(res) && !nb::isinstance<nb::list>(res)) res = nb::make_tuple(res);
          std::vector<Tensor> out;
          for (nb::handle h : nb::iter(res)) {
            KILN_CHECK(nb::isinstance<Tensor>(h), "checkpoint: the function returned a ",
                       nb::cast<std::string>(nb::str(nb::handle(reinterpret_cast<PyObject*>(Py_TYPE(h.ptr()))))),
                       "; it must return kiln.Tensor or a tuple of them");
            out.push_back(nb::cast<Tensor>(h));
          }
          return out;
        };
        return autograd::checkpoint(run, inputs);
      },
      nb::arg("fn"), nb::arg("inputs"),
      "Runs fn(*inputs) keeping only the inputs for backward; backward reruns it (same random draws).");

  m.def(
      "backward",
      [](const std::vector<Tensor>& tensors, std::optional<std::vector<std::optional<Tensor>>> grads,
         bool retain_graph, bool create_graph) {
        std::vector<Tensor> g = tensors_or_empty(grads);
        if (g.empty()) g.resize(tensors.size());
        GilRelease nogil;
        autograd::backward(tensors, g, retain_graph, create_graph);
      },
      nb::arg("tensors"), nb::arg("grad_tensors") = nb::none(), nb::arg("retain_graph") = false,
      nb::arg("create_graph") = false);

  m.def(
      "grad",
      [](const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
         std::optional<std::vector<std::optional<Tensor>>> grad_outputs, bool retain_graph, bool create_graph) {
        // kiln.autograd.grad (Python) wraps this: tensors or sequences, allow_unused, materialize_grads.
        const std::vector<Tensor> go = tensors_or_empty(grad_outputs);
        std::vector<Tensor> res;
        {
          GilRelease nogil;
          res = autograd::grad(outputs, inputs, go, retain_graph, /*materialize=*/false, create_graph);
        }
        nb::list out;
        for (const Tensor& g : res) out.append(g.defined() ? nb::cast(g) : nb::none());
        return nb::tuple(out);
      },
      nb::arg("outputs"), nb::arg("inputs"), nb::arg("grad_outputs") = nb::none(), nb::arg("retain_graph") = false,
      nb::arg("create_graph") = false,
      "The gradients of outputs with respect to inputs, without touching .grad; None for an input no gradient "
      "reaches.");

  m.def(
      "_gradcheck",
      [](nb::callable fn, const std::vector<std::optional<Tensor>>& given, double eps, double atol, double rtol,
         int64_t max_checks, const std::vector<bool>& differentiate) {
        // None stands for an argument that is not a tensor (kiln.autograd.gradcheck puts it back), so
        // the input an error names is the argument's position.
        const std::vector<Tensor> inputs = tensors_or_empty(given);
        GradcheckOptions o;
        o.differentiate = differentiate;
        o.eps = eps;
        o.atol = atol;
        o.rtol = rtol;
        o.max_checks = max_checks;
        return gradcheck(
            [&fn](const std::vector<Tensor>& xs) {
              nb::list args;
              for (const Tensor& x : xs) args.append(x.defined() ? nb::cast(x) : nb::none());
              nb::object r = fn(args);
              if (!nb::isinstance<Tensor>(r)) value_error("gradcheck: the function must return one kiln.Tensor");
              return nb::cast<Tensor>(r);
            },
            inputs, o);
      },
      nb::arg("fn"), nb::arg("inputs"), nb::arg("eps"), nb::arg("atol"), nb::arg("rtol"), nb::arg("max_checks"),
      nb::arg("differentiate"));
}

}  // namespace kiln::py
