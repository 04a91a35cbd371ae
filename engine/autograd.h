// Reverse-mode autograd on a dynamic graph. An op that wants gradients records a Node holding a
// backward function; Tensor::backward walks the graph in reverse creation order.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/tensor.h"

namespace kiln {

// Gradient recording is on by default, per thread.
struct GradMode {
  static bool enabled();
  static void set_enabled(bool on);
};
class NoGradGuard {
 public:
  NoGradGuard() : prev_(GradMode::enabled()) { GradMode::set_enabled(false); }
  ~NoGradGuard() { GradMode::set_enabled(prev_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

struct Edge {
  std::shared_ptr<Node> fn;  // null: that input needs no gradient
  uint32_t input_nr = 0;
};

struct TensorMeta {
  Shape shape;
  DType dtype = DType::f32;
  Device device;
};

class Node : public std::enable_shared_from_this<Node> {
 public:
  Node();
  // Frees the nodes behind it one at a time, not by recursion: a chain of 200000 ops overflowed the
  // stack when its last tensor went.
  virtual ~Node();
  // One gradient per output in, one per input (next_edges) out; undefined means zero.
  virtual std::vector<Tensor> apply(std::vector<Tensor>&& grad_outputs) = 0;
  virtual std::string name() const = 0;
  // Drops saved tensors after a backward pass that did not ask to retain the graph.
  virtual void release() {}
  // Runs the hooks on the gradients reaching this node (Tensor::register_hook, retain_grad) before
  // apply; a leaf's accumulator runs the leaf's.
  virtual void run_tensor_hooks(std::vector<Tensor>& grads);

  std::vector<Edge> next_edges;
  uint64_t sequence_nr;  // creation order; backward runs the newest ready node first

  // register_hook on a non-leaf output of this node, and the outputs that keep their gradient.
  struct OutputHook {
    int id;
    uint32_t output_nr;
    TensorHook fn;
  };
  std::vector<OutputHook> output_hooks;
  std::vector<std::pair<uint32_t, std::weak_ptr<TensorImpl>>> retained;
};

// What a backward function sees: the gradient of each output (zeros when an output was unused)
// and which inputs need a gradient.
struct GradCtx {
  const std::vector<Tensor>* grads;
  const std::vector<bool>* needs;
  const char* op = "";  // the recorded name, for errors
  // Which outputs a gradient reached; the others' are zeros in grads (null: all reached).
  const std::vector<bool>* reached = nullptr;
  // The gradient of output i; an index past the outputs is an error naming the op.
  const Tensor& g(size_t i = 0) const;
  // Whether input i needs a gradient; an index past the inputs is an error naming the op.
  bool needs_grad(size_t i) const;
};
using BackwardFn = std::function<std::vector<Tensor>(const GradCtx&)>;

// A tensor kept for backward; unpack() fails with a clear error if it was modified in place since.
// In an ordinary backward unpack() gives the tensor without its history. In one that builds a graph
// of its own (create_graph), it gives the tensor with its history, so the backward's ops record how
// the gradient depends on it: a leaf's accumulator, an earlier op's node, or, for an output of the
// op that saved it (recognised when that op records), the op's own node.
class SavedTensor {
 public:
  SavedTensor() = default;
  explicit SavedTensor(const Tensor& t);
  Tensor unpack(const char* op) const;
  bool defined() const { return data_.defined(); }
  struct History;

 private:
  Tensor data_;
  uint64_t version_ = 0;
  std::shared_ptr<History> history_;  // null: not a floating tensor
};

namespace autograd {

// True when grad mode is on and some input requires a gradient.
bool needs_grad(const std::vector<Tensor>& inputs);

struct RecordOptions {
  // An output may be an input itself, one the op modified in place (torch's mark_dirty): its history
  // becomes this node (its old one is this node's input edge). Such an input must not be a leaf that
  // requires grad.
  bool inputs_modified = false;
  // The backward is not made of differentiable ops (it calls kernels directly, or runs a backward of
  // its own): in a backward with create_graph its gradients get a node that refuses to be
  // differentiated, so a second derivative through this op is an error naming it, never a silently
  // missing term. Without it, the backward's own ops are recorded in such a pass, as torch's custom
  // functions' (so a backward must use engine ops on what GradCtx and SavedTensor give it).
  bool once_differentiable = false;
};
// Records `fn` as the backward of `outputs` w.r.t. `inputs`. Gradients it returns are summed down
// to each input's shape (undoing broadcasting) and cast to its dtype. A no-op when !needs_grad.
// An output is a new tensor, unless opts.inputs_modified.
void record(const char* name, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs, BackwardFn fn,
            RecordOptions opts = {});
// Called with the op's name each time record() records a backward; null removes it. Process-wide,
// for tests and tools (the op table checks that every recorded op has a row).
using RecordObserver = void (*)(const char* name);
void set_record_observer(RecordObserver observer);
// How many of the tensors that autograd keeps for backward (SavedTensor, alive now) hold x's memory:
// aliases that the version counter guards, not views with a history of their own. For the refusal of
// ctx.mark_dirty on an input whose memory another tensor shares.
size_t saved_aliases(const Tensor& x);
// Runs backward from several roots at once. With create_graph the backward runs with grad mode on
// and its ops are recorded: leaves' .grad then have a history (differentiate them again with
// backward or grad), summed out of place; the graph is kept (create_graph implies retain_graph: the
// second pass goes back through this graph's nodes). As with torch, a .grad with a history keeps the graph, and with it the leaf,
// alive until .grad is reset (zero_grad with set_to_none), so prefer grad() for higher derivatives.
void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads, bool retain_graph = false,
              bool create_graph = false);
// Gradients of `outputs` w.r.t. `inputs` without touching .grad of leaves. An input no gradient
// reaches gets zeros, or an undefined tensor with materialize = false (torch's allow_unused). With
// create_graph, the gradients have a history (Hessian-vector products, gradient penalties) and the
// graph is kept.
std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs = {}, bool retain_graph = false,
                         bool materialize = true, bool create_graph = false);

// Activation recomputation. Runs fn(inputs) keeping none of its intermediate tensors for backward:
// only the inputs, the default generator's state and the autocast state. Backward runs fn again
// with gradients on, the same random draws (dropout masks come out the same) and the same autocast,
// and backpropagates through it: parameters used inside fn get their gradients as usual, the inputs
// theirs. On the CPU the gradients are bit-identical to running fn directly. Without grad mode,
// just fn(inputs). While fn reruns, recomputing() is true, so a module with a side effect (batch
// norm's running statistics) leaves it out the second time. Random draws inside fn must come from
// the default generator (a module given its own Generator would draw different masks).
using RecomputeFn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;
std::vector<Tensor> checkpoint(const RecomputeFn& fn, const std::vector<Tensor>& inputs);
bool recomputing();

}  // namespace autograd
}  // namespace kiln
