// The autograd engine: FunctionNode runs an op's recorded backward, AccumulateGrad sums into a
// leaf's .grad and fires its grad-ready hooks, and backward() runs ready nodes newest first.
#include "engine/autograd.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <mutex>
#include <optional>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "engine/autocast.h"
#include "engine/context.h"
#include "engine/ops.h"
#include "engine/random.h"

namespace kiln {

namespace {
thread_local bool t_grad_enabled = true;
std::atomic<uint64_t> g_next_sequence{0};
}  // namespace

bool GradMode::enabled() { return t_grad_enabled; }
void GradMode::set_enabled(bool on) { t_grad_enabled = on; }

Node::Node() : sequence_nr(g_next_sequence.fetch_add(1)) {}

Node::~Node() {
  // Take each node behind this one that dies with it (nothing else holds it), empty its edges so
  // its own destructor finds nothing, and let it go: the depth of the graph never reaches the stack.
  std::vector<std::shared_ptr<Node>> dying;
  const auto take = [&dying](std::vector<Edge>& edges) {
    for (Edge& e : edges)
      if (e.fn && e.fn.use_count() == 1) dying.push_back(std::move(e.fn));
    edges.clear();
  };
  take(next_edges);
  while (!dying.empty()) {
    std::shared_ptr<Node> n = std::move(dying.back());
    dying.pop_back();
    take(n->next_edges);
  }  // n goes here, with no edges left
}

const Tensor& GradCtx::g(size_t i) const {
  KILN_CHECK(i < grads->size(), op, " backward: asked for the gradient of output ", i, ", but the op recorded ",
             grads->size(), " output(s)");
  return (*grads)[i];
}

bool GradCtx::needs_grad(size_t i) const {
  KILN_CHECK(i < needs->size(), op, " backward: asked whether input ", i, " needs a gradient, but the op recorded ",
             needs->size(), " input(s)");
  return (*needs)[i];
}

namespace {

std::atomic<int> g_next_tensor_hook{0};

// A hook's answer: the gradient it returned, or `g` when it returned none.
Tensor run_hook(const TensorHook& hook, const Tensor& g) {
  Tensor r = hook(g);
  if (!r.defined()) return g;
  KILN_CHECK(r.shape() == g.shape() && r.dtype() == g.dtype() && r.device() == g.device(),
             "a hook registered with register_hook returned a gradient ", r.type_str(), " for the gradient ",
             g.type_str(), "; return None, or a tensor of the same shape, dtype and device");
  return r;
}

// Guards a tensor's AutogradMeta where threads meet on it: the get-or-create of a leaf's
// accumulator (threads building graphs on a shared leaf) and the read-modify-write of .grad (threads
// running backward into a shared leaf, or through a shared retained tensor). Torch keeps a mutex in
// its AutogradMeta; here a fixed pool of mutexes is picked by the meta's address, which leaves the
// layout of TensorImpl alone. Only leaf-level work runs under it (no hook, no other meta's lock), so
// two metas sharing a mutex cannot deadlock, and one thread pays one uncontended lock per leaf. No
// tensor another owner may have lent (a NumPy or DLPack buffer, whose release takes Python's GIL) may
// die under it either: a thread holding the GIL waiting here for the mutex while this one waits for
// the GIL would hang both. So the gradients a locked region reads stay alive past it (the caller's).
std::mutex& meta_mutex(const AutogradMeta& m) {
  static std::array<std::mutex, 64> pool;
  // Heap addresses share their low bits (16-byte alignment, metas allocated 128 bytes apart): a
  // multiplicative hash of the address spreads them over the whole pool.
  const uint64_t a = uint64_t(reinterpret_cast<uintptr_t>(&m)) >> 4;
  return pool[size_t((a * 0x9E3779B97F4A7C15ull) >> 58)];
}

// Keeps `g` as the .grad of a tensor that retains its gradient: a copy the first time, then summed.
void keep_grad(TensorImpl& im, const Tensor& g) {
  if (!im.autograd || !im.autograd->retains_grad) return;
  NoGradGuard ng;
  const std::lock_guard<std::mutex> lock(meta_mutex(*im.autograd));
  if (!im.autograd->grad)
    im.autograd->grad = g.clone().impl_ptr();
  else
    Tensor(im.autograd->grad).add_(g);
}

}  // namespace

void Node::run_tensor_hooks(std::vector<Tensor>& grads) {
  if (!output_hooks.empty()) {
    const std::vector<OutputHook> hooks = output_hooks;  // a hook may add or remove hooks
    for (const OutputHook& h : hooks)
      if (h.output_nr < grads.size() && grads[h.output_nr].defined())
        grads[h.output_nr] = run_hook(h.fn, grads[h.output_nr]);
  }
  for (const auto& [nr, weak] : retained)
    if (nr < grads.size() && grads[nr].defined())
      if (const std::shared_ptr<TensorImpl> im = weak.lock()) keep_grad(*im, grads[nr]);
}

int Tensor::register_hook(TensorHook hook) {
  KILN_CHECK(requires_grad(), "register_hook: the tensor ", type_str(),
             " does not require grad, so no gradient reaches it");
  KILN_CHECK(hook != nullptr, "register_hook: the hook is empty");
  const int id = g_next_tensor_hook.fetch_add(1);
  if (is_leaf())
    impl().autograd->grad_hooks.emplace_back(id, std::move(hook));
  else
    grad_fn()->output_hooks.push_back({id, output_nr(), std::move(hook)});
  return id;
}

void Tensor::remove_hook(int id) {
  if (!impl_ || !impl_->autograd) return;
  AutogradMeta& m = *impl_->autograd;
  std::erase_if(m.grad_hooks, [id](const auto& h) { return h.first == id; });
  if (m.grad_fn) std::erase_if(m.grad_fn->output_hooks, [id](const Node::OutputHook& h) { return h.id == id; });
}

void Tensor::retain_grad() {
  KILN_CHECK(requires_grad(), "retain_grad: the tensor ", type_str(), " does not require grad");
  if (is_leaf()) return;  // a leaf keeps its gradient anyway
  AutogradMeta& m = *impl().autograd;
  if (m.retains_grad) return;
  m.retains_grad = true;
  m.grad_fn->retained.emplace_back(output_nr(), impl_ptr());
}

// Where a saved tensor's gradient goes in a backward that is differentiated again (see SavedTensor).
struct SavedTensor::History {
  std::shared_ptr<TensorImpl> leaf;  // a leaf that requires grad: the tensor itself
  // An earlier op's output: its node (weakly: a strong hold inside a backward closure, which
  // Node::~Node cannot see, would make a long chain free itself by recursion) and output. An input's
  // node lives as long as the recording node's edges; an intermediate the op computed with a history
  // of its own and saved may lose it, and a create_graph backward then refuses rather than treat it
  // as a constant.
  std::weak_ptr<Node> fn;
  bool has_fn = false;
  uint32_t output_nr = 0;
  std::weak_ptr<TensorImpl> origin;  // neither yet: perhaps an output of the op about to record
  int64_t own_output = -1;           // set by record(): which of that op's outputs it is
};

namespace {
// Saved tensors without a history yet, on this thread, for the next record() to recognise its own
// outputs among them.
thread_local std::vector<std::weak_ptr<SavedTensor::History>> t_unclaimed;
// The node whose backward runs on this thread now: the owner of a saved output.
thread_local Node* t_applying = nullptr;
}  // namespace

SavedTensor::SavedTensor(const Tensor& t) {
  if (!t.defined()) return;
  data_ = t.detach();
  version_ = t.version();
  data_.impl_ptr()->saved_alias.mark(data_.impl().storage);  // a new impl (detach): counted while it lives
  if (!is_floating(t.dtype())) return;
  history_ = std::make_shared<History>();
  if (t.requires_grad() && !t.grad_fn()) {
    history_->leaf = t.impl_ptr();
    return;
  }
  if (t.requires_grad()) {
    history_->fn = t.grad_fn();
    history_->has_fn = true;
    history_->output_nr = t.output_nr();
    return;
  }
  history_->origin = t.impl_ptr();
  if (t_unclaimed.size() >= 64)  // saved constants that no record() claimed (an op that did not record)
    std::erase_if(t_unclaimed, [](const auto& w) { return w.expired(); });
  t_unclaimed.push_back(history_);
}

size_t autograd::saved_aliases(const Tensor& x) {
  return x.defined() && x.storage() ? x.storage()->saved_aliases.load(std::memory_order_relaxed) : 0;
}

Tensor SavedTensor::unpack(const char* op) const {
  if (!data_.defined()) return data_;
  KILN_CHECK(data_.version() == version_, op, ": a tensor ", data_.type_str(),
             " saved for its backward was modified in place afterwards (version ", data_.version(), ", saved at ",
             version_, "); clone() it before modifying, or modify a copy");
  // Grad mode is off in an ordinary backward, on in one with create_graph.
  if (!history_ || !GradMode::enabled()) return data_;
  if (history_->leaf) return Tensor(history_->leaf);
  std::shared_ptr<Node> fn = history_->fn.lock();
  KILN_CHECK(fn || !history_->has_fn, op, ": a tensor ", data_.type_str(),
             " saved for its backward had a history that has since been freed (it is neither an input nor an "
             "output of ", op, ", and nothing else kept the ops that made it); a backward with create_graph cannot "
             "differentiate through it: save an input or an output of the op instead");
  uint32_t nr = history_->output_nr;
  if (!fn && history_->own_output >= 0 && t_applying) {
    fn = t_applying->shared_from_this();
    nr = uint32_t(history_->own_output);
  }
  if (!fn) return data_;  // a constant
  Tensor t = data_.detach();
  auto m = std::make_unique<AutogradMeta>();
  m->requires_grad = true;
  m->grad_fn = std::move(fn);
  m->output_nr = nr;
  t.impl().autograd = std::move(m);
  return t;
}

namespace {

Edge gradient_edge(const Tensor& t);

class FunctionNode final : public Node {
 public:
  FunctionNode(const char* name, BackwardFn fn, bool once_differentiable)
      : name_(name), fn_(std::move(fn)), once_(once_differentiable) {}
  std::string name() const override { return name_; }
  void release() override {
    fn_ = nullptr;
    released_ = true;
  }

  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    KILN_CHECK(!released_, "backward through ", name_,
               " a second time: its saved tensors were freed by an earlier backward through it (one that finished, "
               "or one that failed partway); pass retain_graph=true to the first call, or run the forward again");
    std::vector<bool> reached(grads.size(), true);
    for (size_t i = 0; i < grads.size(); ++i)
      if (!grads[i].defined()) {
        reached[i] = false;
        grads[i] = zeros(out_meta[i].shape, TensorOptions(out_meta[i].dtype, out_meta[i].device));
      }
    std::vector<bool> needs(next_edges.size());
    for (size_t i = 0; i < needs.size(); ++i) needs[i] = next_edges[i].fn != nullptr;
    GradCtx ctx{&grads, &needs, name_, &reached};
    std::vector<Tensor> res;
    {
      struct Applying {  // whose saved outputs unpack() resolves to (a backward may run a nested one)
        Node* prev = t_applying;
        explicit Applying(Node* n) { t_applying = n; }
        ~Applying() { t_applying = prev; }
      } applying(this);
      // A once-differentiable backward runs unrecorded (its kernels' buffers are written in place).
      std::optional<NoGradGuard> unrecorded;
      if (once_) unrecorded.emplace();
      res = fn_(ctx);
    }
    KILN_CHECK(res.size() == next_edges.size(), name_, " backward returned ", res.size(), " gradient(s) for its ",
               next_edges.size(), " input(s): return one per input, in order (an undefined Tensor where none)");
    for (size_t i = 0; i < res.size(); ++i) {
      if (!needs[i] || !res[i].defined()) {
        res[i] = Tensor();
        continue;
      }
      const TensorMeta& m = in_meta[i];
      if (res[i].shape() != m.shape) {
        // A broadcast output with a zero-size dim has fewer elements than its input ([2, 0, 3] from [1, 3]):
        // its gradient sums to zeros, so only a non-empty gradient must be at least as large.
        // A gradient may be broadcast over its input (sum_to folds it back); any other shape is the
        // backward's mistake, named here rather than as sum_to's.
        bool reduces = res[i].numel() == 0 || res[i].numel() >= m.shape.numel();
        if (reduces) try {
            res[i] = sum_to(res[i], m.shape);
          } catch (const Error&) {
            reduces = false;
          }
        KILN_CHECK(reduces, name_, " backward: the gradient for input ", i, " has shape ", res[i].shape(),
                   ", which is neither the input's shape ", m.shape, " nor a broadcast of it");
      }
      if (res[i].dtype() != m.dtype) res[i] = res[i].to(m.dtype);
    }
    if (once_ && GradMode::enabled()) refuse_second_derivative(res, grads);
    return res;
  }

  std::vector<TensorMeta> in_meta, out_meta;

 private:
  // A backward with create_graph through an op whose backward is not made of recorded ops: each
  // gradient gets a node of its own that fails when a second backward reaches it (the gradient
  // depends on the op's inputs and on the incoming gradients, which its edges name).
  void refuse_second_derivative(std::vector<Tensor>& res, const std::vector<Tensor>& grads);

  const char* name_;
  BackwardFn fn_;
  bool once_ = false;
  bool released_ = false;
};

class NotDifferentiable final : public Node {
 public:
  explicit NotDifferentiable(const char* op) : op_(op) {}
  std::string name() const override { return std::string(op_) + " (its backward, not differentiable)"; }
  std::vector<Tensor> apply(std::vector<Tensor>&&) override {
    KILN_FAIL("backward through the gradient of ", op_, ": a backward with create_graph ran through ", op_,
              ", whose backward is not differentiable in Kiln, and a second derivative came back to it (second "
              "derivatives of ", op_, " are not implemented; the first derivative is right)");
  }

 private:
  const char* op_;
};

void FunctionNode::refuse_second_derivative(std::vector<Tensor>& res, const std::vector<Tensor>& grads) {
  for (Tensor& r : res) {
    if (!r.defined() || !is_floating(r.dtype())) continue;
    auto node = std::make_shared<NotDifferentiable>(name_);
    node->next_edges = next_edges;
    for (const Tensor& g : grads)
      if (g.defined() && g.requires_grad()) node->next_edges.push_back(gradient_edge(g));
    Tensor alias = r.detach();
    auto m = std::make_unique<AutogradMeta>();
    m->requires_grad = true;
    m->grad_fn = std::move(node);
    alias.impl().autograd = std::move(m);
    r = alias;
  }
}

class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(std::shared_ptr<TensorImpl> leaf) : leaf_(std::move(leaf)) {}
  std::string name() const override { return "AccumulateGrad"; }
  void run_tensor_hooks(std::vector<Tensor>& grads) override {
    const AutogradMeta* m = leaf_->autograd.get();
    if (!m || m->grad_hooks.empty() || grads.empty() || !grads[0].defined()) return;
    const auto hooks = m->grad_hooks;  // a hook may add or remove hooks
    for (const auto& [id, hook] : hooks) grads[0] = run_hook(hook, grads[0]);
  }

  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    Tensor g = std::move(grads.at(0));
    if (!g.defined()) return {};
    Tensor leaf(leaf_);
    AutogradMeta& m = *leaf_->autograd;
    {
      // Another thread's backward may be accumulating into this leaf too. `g` outlives the lock (its
      // buffer may be one only Python can free: see meta_mutex).
      const std::lock_guard<std::mutex> lock(meta_mutex(m));
      accumulate(leaf, m, g);
    }
    for (auto& [id, hook] : m.grad_ready_hooks) hook(leaf);
    return {};
  }

 private:
  static void accumulate(const Tensor& leaf, AutogradMeta& m, const Tensor& g) {
    // create_graph: .grad keeps the gradient's history, and is summed out of place. A first gradient
    // is a recorded copy, dense in the leaf's layout: g itself may be another leaf's gradient too
    // (add's backward hands one tensor to both inputs), the caller's grad_output, or a broadcast view.
    // A .grad with a history is never written in place (a graph may have saved it).
    if (GradMode::enabled() || (m.grad && Tensor(m.grad).requires_grad())) {
      const MemoryFormat fmt = leaf.is_channels_last() ? MemoryFormat::channels_last : MemoryFormat::contiguous;
      Tensor own = g.dtype() == leaf.dtype() ? g : g.to(leaf.dtype());
      if (m.grad) {
        m.grad = add(Tensor(m.grad), own).impl_ptr();
        return;
      }
      own = own.clone();
      if (!own.is_contiguous(fmt)) own = own.contiguous(fmt);
      m.grad = own.impl_ptr();
      return;
    }
    if (!m.grad) {
      // Keep the incoming buffer when nobody else can see it; otherwise own a copy. Either way dense
      // in the leaf's layout (a channels_last leaf gets a channels_last gradient).
      const MemoryFormat fmt = leaf.is_channels_last() ? MemoryFormat::channels_last : MemoryFormat::contiguous;
      const bool exclusive = g.impl_ptr().use_count() == 1 && g.storage().use_count() == 1 && g.is_contiguous(fmt);
      Tensor own = g;
      if (!exclusive) {
        own = make_tensor(g.shape(), g.dtype(), g.device(), fmt);
        NoGradGuard ng;
        own.copy_(g);
      }
      if (own.dtype() != leaf.dtype()) own = own.to(leaf.dtype());
      m.grad = own.impl_ptr();
    } else {
      Tensor(m.grad).add_(g);
    }
  }

  std::shared_ptr<TensorImpl> leaf_;
};

Edge gradient_edge(const Tensor& t) {
  if (!t.defined() || !t.requires_grad()) return {};
  AutogradMeta& m = *t.impl().autograd;
  if (m.grad_fn) return {m.grad_fn, m.output_nr};
  // Threads building graphs on one leaf must share one accumulator (and not tear the weak_ptr).
  const std::lock_guard<std::mutex> lock(meta_mutex(m));
  std::shared_ptr<Node> acc = m.grad_accumulator.lock();
  if (!acc) {
    acc = std::make_shared<AccumulateGrad>(t.impl_ptr());
    m.grad_accumulator = acc;
  }
  return {acc, 0};
}

size_t num_outputs(Node* n) {
  if (auto* f = dynamic_cast<FunctionNode*>(n)) return f->out_meta.size();
  return 1;
}

struct Capture {
  Node* node;
  uint32_t output_nr;
  size_t slot;
};

// The engine. With `captures`, gradients reaching those (node, output) pairs are returned instead
// of accumulated, and leaves' .grad are left alone.
// With create_graph the backward's ops are recorded (grad mode on) and the graph is kept.
std::vector<Tensor> run_backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads_in,
                                 bool retain_graph, const std::vector<Capture>* captures, size_t ncapture,
                                 bool create_graph) {
  KILN_CHECK(roots.size() == grads_in.size() || grads_in.empty(), "backward: ", roots.size(), " outputs but ",
             grads_in.size(), " gradients");
  struct Mode {
    bool prev = GradMode::enabled();
    explicit Mode(bool on) { GradMode::set_enabled(on); }
    ~Mode() { GradMode::set_enabled(prev); }
  } mode(create_graph);
  retain_graph = retain_graph || create_graph;
  // Backward ops take the dtypes the forward chose; an autocast region around backward() changes nothing.
  amp::AutocastGuard no_autocast(DType::f16, /*enabled=*/false);
  std::unordered_map<Node*, std::vector<Tensor>> buffers;
  std::unordered_map<Node*, int> deps;
  std::vector<std::shared_ptr<Node>> root_nodes;

  auto add_to = [&](Node* n, uint32_t slot, Tensor g) {
    auto& buf = buffers[n];
    if (buf.empty()) buf.resize(num_outputs(n));
    if (!g.defined()) return;
    if (!buf[slot].defined()) {
      buf[slot] = std::move(g);
    } else {
      buf[slot] = add(buf[slot], g);
    }
  };

  for (size_t i = 0; i < roots.size(); ++i) {
    const Tensor& r = roots[i];
    KILN_CHECK(r.defined() && r.requires_grad(), "backward: output ", i,
               " does not require grad (no input of the computation requires grad, or it ran under NoGradGuard)");
    Tensor g = grads_in.empty() ? Tensor() : grads_in[i];
    if (!g.defined()) {
      KILN_CHECK(r.numel() == 1, "backward: output ", i, " has shape ", r.shape(),
                 "; pass grad_output for a non-scalar output");
      g = ones_like(r);
    }
    KILN_CHECK(g.shape() == r.shape(), "backward: grad_output shape ", g.shape(), " differs from output shape ",
               r.shape());
    Edge e = gradient_edge(r);
    add_to(e.fn.get(), e.input_nr, g.dtype() == r.dtype() ? g : g.to(r.dtype()));
    root_nodes.push_back(e.fn);
  }

  // Count, for every node reachable from the roots, how many edges point at it.
  {
    std::vector<Node*> stack;
    std::unordered_set<Node*> seen;
    for (auto& n : root_nodes)
      if (seen.insert(n.get()).second) stack.push_back(n.get());
    while (!stack.empty()) {
      Node* n = stack.back();
      stack.pop_back();
      for (const Edge& e : n->next_edges) {
        if (!e.fn) continue;
        ++deps[e.fn.get()];
        if (seen.insert(e.fn.get()).second) stack.push_back(e.fn.get());
      }
    }
  }

  std::vector<Tensor> captured(ncapture);
  auto cmp = [](Node* a, Node* b) { return a->sequence_nr < b->sequence_nr; };
  std::priority_queue<Node*, std::vector<Node*>, decltype(cmp)> ready(cmp);
  {
    std::unordered_set<Node*> pushed;
    for (auto& n : root_nodes)
      if (deps[n.get()] == 0 && pushed.insert(n.get()).second) ready.push(n.get());
  }
  while (!ready.empty()) {
    detail::poll_interrupt();
    Node* n = ready.top();
    ready.pop();
    std::vector<Tensor> in = std::move(buffers[n]);
    buffers.erase(n);
    if (in.empty()) in.resize(num_outputs(n));
    // autograd::grad leaves leaves alone: a leaf's accumulator runs nothing, not even the leaf's
    // hooks, unless the leaf is one of the inputs asked for (as torch).
    const bool accumulator = dynamic_cast<AccumulateGrad*>(n) != nullptr;
    const bool skip = captures && accumulator;
    bool wanted = !skip;
    if (captures)
      for (const Capture& c : *captures) wanted = wanted || c.node == n;
    if (wanted) n->run_tensor_hooks(in);
    if (captures) {
      for (const Capture& c : *captures)
        if (c.node == n && c.output_nr < in.size()) captured[c.slot] = in[c.output_nr];
    }
    bool any = false;
    for (const Tensor& t : in) any = any || t.defined();
    std::vector<Tensor> out;
    if (any && !skip) out = n->apply(std::move(in));
    if (!retain_graph) n->release();
    for (size_t i = 0; i < n->next_edges.size(); ++i) {
      const Edge& e = n->next_edges[i];
      if (!e.fn) continue;
      add_to(e.fn.get(), e.input_nr, i < out.size() ? out[i] : Tensor());
      if (--deps[e.fn.get()] == 0) ready.push(e.fn.get());
    }
  }
  return captured;
}

}  // namespace

namespace autograd {

bool needs_grad(const std::vector<Tensor>& inputs) {
  if (!GradMode::enabled()) return false;
  for (const Tensor& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

namespace {
std::atomic<RecordObserver> g_record_observer{nullptr};
}  // namespace

void set_record_observer(RecordObserver observer) { g_record_observer.store(observer); }

void record(const char* name, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs, BackwardFn fn,
            RecordOptions opts) {
  // The saved tensors made since the last record() that are this op's outputs belong to its node.
  std::vector<std::weak_ptr<SavedTensor::History>> unclaimed;
  unclaimed.swap(t_unclaimed);
  if (!needs_grad(inputs)) return;
  for (const auto& w : unclaimed) {
    const auto h = w.lock();
    if (!h) continue;
    if (const auto origin = h->origin.lock())
      for (size_t i = 0; i < outputs.size(); ++i)
        if (outputs[i].defined() && outputs[i].impl_ptr() == origin) h->own_output = int64_t(i);
  }
  if (const RecordObserver obs = g_record_observer.load(std::memory_order_relaxed)) obs(name);
  for (size_t i = 0; i < outputs.size(); ++i) {
    KILN_CHECK(outputs[i].defined(), name, ": output ", i, " given to autograd::record is an undefined tensor");
    for (size_t j = 0; j < inputs.size(); ++j) {
      if (!inputs[j].defined() || &outputs[i].impl() != &inputs[j].impl()) continue;
      KILN_CHECK(opts.inputs_modified, name, ": output ", i, " is input ", j,
                 " itself; an op returns a new tensor (a view, x.detach() or a copy) so the input "
                 "keeps its own place in the graph");
      KILN_CHECK(!(inputs[j].requires_grad() && inputs[j].is_leaf()), name, ": input ", j, " ", inputs[j].type_str(),
                 " is a leaf that requires grad and was modified in place; its gradient would be lost (modify a "
                 "copy, or do it under no_grad outside the op)");
    }
  }
  auto node = std::make_shared<FunctionNode>(name, std::move(fn), opts.once_differentiable);
  for (const Tensor& in : inputs) {
    node->next_edges.push_back(gradient_edge(in));
    if (in.defined()) {
      node->in_meta.push_back({in.shape(), in.dtype(), in.device()});
    } else {
      node->in_meta.push_back({});
    }
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Tensor& out = outputs[i];
    node->out_meta.push_back({out.shape(), out.dtype(), out.device()});
    if (!is_floating(out.dtype())) continue;  // indices and masks carry no gradient
    TensorImpl& im = out.impl();
    if (!im.autograd) im.autograd = std::make_unique<AutogradMeta>();
    im.autograd->requires_grad = true;
    im.autograd->grad_fn = node;
    im.autograd->output_nr = uint32_t(i);
  }
}

void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads, bool retain_graph,
              bool create_graph) {
  run_backward(roots, grads, retain_graph, nullptr, 0, create_graph);
}

std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs, bool retain_graph, bool materialize,
                         bool create_graph) {
  std::vector<Capture> caps;
  std::vector<std::shared_ptr<Node>> keep;  // accumulators created here must live through the pass
  for (size_t i = 0; i < inputs.size(); ++i) {
    KILN_CHECK(inputs[i].requires_grad(), "autograd::grad: input ", i, " ", inputs[i].type_str(),
               " does not require grad");
    Edge e = gradient_edge(inputs[i]);
    keep.push_back(e.fn);
    caps.push_back({e.fn.get(), e.input_nr, i});
  }
  std::vector<Tensor> res = run_backward(outputs, grad_outputs, retain_graph, &caps, inputs.size(), create_graph);
  if (materialize)
    for (size_t i = 0; i < res.size(); ++i)
      if (!res[i].defined()) res[i] = zeros_like(inputs[i]);
  return res;
}

namespace {
thread_local int t_recomputing = 0;
}  // namespace

bool recomputing() { return t_recomputing > 0; }

std::vector<Tensor> checkpoint(const RecomputeFn& fn, const std::vector<Tensor>& inputs) {
  if (!GradMode::enabled()) return fn(inputs);
  const Generator rng = default_generator();
  const std::optional<DType> cast = amp::autocast_dtype();
  std::vector<uint64_t> versions;
  for (const Tensor& t : inputs) versions.push_back(t.defined() ? t.version() : 0);
  std::vector<Tensor> outs;
  {
    NoGradGuard ng;
    outs = fn(inputs);
  }
  // Backward recomputes the block from its inputs: one it wrote into in place (an inplace=True
  // activation or dropout first) would be recomputed from the written values, twice applied, and the
  // gradients silently wrong (torch refuses such a block too).
  for (size_t i = 0; i < inputs.size(); ++i)
    KILN_CHECK(!inputs[i].defined() || inputs[i].version() == versions[i], "checkpoint: input ", i, " ",
               inputs[i].type_str(),
               " (or memory it shares) was written in place during the block (an in-place op such as an "
               "inplace=True activation or dropout, or a buffer update such as batch norm's running statistics); "
               "backward recomputes the block from that input, which would give wrong gradients: make the write "
               "out of place, or pass a clone()");
  for (Tensor& o : outs) o = o.detach();  // fresh handles: record() gives them their grad_fn
  std::vector<SavedTensor> saved;
  std::vector<bool> wanted;
  for (const Tensor& t : inputs) saved.emplace_back(t), wanted.push_back(t.defined() && t.requires_grad());
  // Parameters inside fn need gradients even when no input does, but a node is recorded only when
  // an input requires grad: then it gets one more input, an empty leaf that does.
  std::vector<Tensor> rec_inputs = inputs;
  Tensor anchor;
  if (!needs_grad(inputs)) {
    anchor = zeros({0});
    anchor.set_requires_grad(true);
    rec_inputs.push_back(anchor);
  }
  record("checkpoint", rec_inputs, outs,
         [fn, saved = std::move(saved), wanted, rng, cast, n = inputs.size()](const GradCtx& ctx) {
           std::vector<Tensor> xs;
           for (size_t i = 0; i < n; ++i) {
             Tensor x = saved[i].unpack("checkpoint");
             if (x.defined()) x = x.detach();
             if (wanted[i]) x.set_requires_grad(true);
             xs.push_back(x);
           }
           std::vector<Tensor> again;
           {
             // The forward's random stream, on this thread only (the process-wide generator goes on
             // for other threads and is where it was afterwards), and grad mode, put back afterwards.
             ThreadGenerator stream(rng);
             struct Replay {
               bool grad = GradMode::enabled();
               Replay() {
                 GradMode::set_enabled(true);
                 ++t_recomputing;
               }
               ~Replay() {
                 GradMode::set_enabled(grad);
                 --t_recomputing;
               }
             } replay;
             amp::AutocastGuard ac(cast.value_or(DType::f16), cast.has_value());
             again = fn(xs);
           }
           KILN_CHECK(again.size() == ctx.grads->size(), "checkpoint: the recomputed block returned ", again.size(),
                      " tensors, the first run ", ctx.grads->size());
           std::vector<Tensor> roots, grads;
           for (size_t i = 0; i < again.size(); ++i)
             if (again[i].defined() && again[i].requires_grad()) roots.push_back(again[i]), grads.push_back(ctx.g(i));
           if (!roots.empty()) backward(roots, grads);
           std::vector<Tensor> res(ctx.needs->size());
           for (size_t i = 0; i < n; ++i)
             if (wanted[i] && ctx.needs_grad(i)) res[i] = xs[i].grad();
           return res;
         },
         {.once_differentiable = true});  // its backward runs a backward of its own
  return outs;
}

}  // namespace autograd
}  // namespace kiln
