// Tensor: a refcounted view (shape, strides, offset, dtype) onto a refcounted Storage, plus the
// autograd state. Copying a Tensor copies the handle, never the data.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <ostream>
#include <string>
#include <type_traits>
#include <vector>

#include "base/allocator.h"
#include "base/dtype.h"
#include "base/error.h"

namespace kiln {

// A shape or a list of strides. A struct of its own so that printing it is found by ADL.
struct Shape : std::vector<int64_t> {
  using std::vector<int64_t>::vector;
  Shape() = default;
  Shape(const std::vector<int64_t>& v) : std::vector<int64_t>(v) {}
  int64_t numel() const;
};
std::ostream& operator<<(std::ostream& os, const Shape& s);  // [2,3,4]
constexpr int kMaxDims = 8;

Allocator& cpu_allocator();  // 64-byte aligned
class Tensor;
// A copy of a CPU tensor in page-locked memory (the tensor itself where no GPU is visible): what a
// data loader hands out so that host-to-device copies never block the host.
Tensor pin_memory(const Tensor& t);
// Host memory the CPU allocator keeps for reuse (default 4 GiB; 0: every block goes back at once).
void set_cpu_cache_limit(size_t bytes);
size_t cpu_cache_limit();
// What CPU tensors hold: bytes of live storage from the CPU allocator (as asked, before size
// classes), the most held at once since the last reset_cpu_memory_peak(), the bytes kept for reuse,
// and allocations made. What the memory planner's predictions are checked against.
struct HostMemoryStats {
  size_t allocated = 0, peak_allocated = 0, cached = 0, cap = 0;
  int64_t allocations = 0;
};
HostMemoryStats cpu_memory_stats();
void reset_cpu_memory_peak();  // the peak becomes what is allocated now
// A cap on the bytes CPU tensors may hold at once (0: none). An allocation past it throws
// OutOfMemory naming the cap, as a full device would: how `--memory-cap` tries on the CPU what a
// smaller device would do.
void set_cpu_memory_cap(size_t bytes);

// The meta device (base/dtype.h): the bytes its tensors would hold, counted as the CPU's are.
HostMemoryStats meta_memory_stats();
void reset_meta_memory_peak();
// Whether meta kernels take operands as a GPU does (16-bit GEMM and convolution operands as they
// are, channels_last buffers natively) or as the CPU does (f32 and NCHW copies first): the planner
// sets it for the device it plans. Process-wide; default: as the CPU. As a GPU, the meta kernels also
// count what the CUDA kernels take for a call (cuBLASLt's workspace, scratch buffers), and, with
// cudnn_device >= 0 (a CUDA device of this process), the workspace its cuDNN picks for each convolution.
void set_meta_like_gpu(bool on, int cudnn_device = -1);
// While one lives on this thread, the factories (zeros, randn, from_vector, ...) asked for CPU
// tensors make meta tensors: a model built in its scope has its parameters' shapes but not their
// memory (as PyTorch's `with torch.device("meta")`).
class MetaInitGuard {
 public:
  MetaInitGuard();
  ~MetaInitGuard();
  MetaInitGuard(const MetaInitGuard&) = delete;
  MetaInitGuard& operator=(const MetaInitGuard&) = delete;
  static bool active();
};

struct Storage {
  Storage(size_t nbytes, Device device, Allocator* alloc);
  // Wraps memory owned elsewhere; `release` runs when the last tensor lets go.
  Storage(void* data, size_t nbytes, Device device, std::function<void(void*)> release);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data = nullptr;
  size_t nbytes = 0;
  Device device;
  Allocator* allocator = nullptr;
  std::function<void(void*)> release;
  // Bumped by every in-place write; autograd compares it with the value seen when a tensor was saved.
  uint64_t version = 0;
  // How many of the tensors holding this memory are autograd's saved copies (SavedTensor), alive now.
  std::atomic<uint32_t> saved_aliases{0};
};

// Marks a TensorImpl as one of autograd's saved copies (SavedTensor) of its storage, counted in
// Storage::saved_aliases while it lives; weak, so the storage's holders are counted as before.
class SavedAliasMark {
 public:
  SavedAliasMark() = default;
  SavedAliasMark(SavedAliasMark&& o) noexcept : storage_(std::move(o.storage_)) { o.storage_.reset(); }
  SavedAliasMark& operator=(SavedAliasMark&& o) noexcept {
    if (this != &o) {
      release();
      storage_ = std::move(o.storage_);
      o.storage_.reset();
    }
    return *this;
  }
  ~SavedAliasMark() { release(); }
  void mark(const std::shared_ptr<Storage>& s) {
    release();
    storage_ = s;
    if (s) s->saved_aliases.fetch_add(1, std::memory_order_relaxed);
  }

 private:
  void release() {
    if (const std::shared_ptr<Storage> s = storage_.lock()) s->saved_aliases.fetch_sub(1, std::memory_order_relaxed);
    storage_.reset();
  }
  std::weak_ptr<Storage> storage_;
};

// How a 4-D [N, C, H, W] tensor lies in memory: contiguous (NCHW) or channels_last (NHWC, strides
// [H*W*C, 1, W*C, C]), the layout tensor-core convolutions prefer. Shapes and indices are NCHW either
// way. conv2d, batch norm, pooling and elementwise ops given channels_last inputs return
// channels_last outputs, so a channels_last input batch keeps the whole network in it (parameters
// stay NCHW); cuDNN runs on it natively, the CPU through NCHW copies.
enum class MemoryFormat { contiguous, channels_last };

class Tensor;

// Synchronising reads so far, process-wide: item(), to_vector() and values() of CPU tensors, and
// every copy from a device to the host (which waits for the device). A training step outside its
// logging steps makes none, on the CPU as on a GPU (tests/test_amp.cpp checks it), so a step can
// run ahead of the host and be captured as a CUDA graph.
uint64_t host_read_count();
namespace detail {
void count_host_read();
}  // namespace detail
class Node;
using GradHook = std::function<void(Tensor& leaf)>;
// Sees the gradient flowing into a tensor in backward; a defined return replaces it.
using TensorHook = std::function<Tensor(const Tensor& grad)>;

struct AutogradMeta {
  bool requires_grad = false;
  std::shared_ptr<Node> grad_fn;  // null for leaves
  uint32_t output_nr = 0;
  std::shared_ptr<struct TensorImpl> grad;  // accumulated gradient of a leaf
  std::weak_ptr<Node> grad_accumulator;
  std::vector<std::pair<int, GradHook>> grad_ready_hooks;
  int next_hook_id = 0;
  std::vector<std::pair<int, TensorHook>> grad_hooks;  // a leaf's register_hook hooks (a non-leaf's live on its node)
  bool retains_grad = false;                           // a non-leaf that keeps its gradient in .grad (retain_grad)
};

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  Shape shape;
  Shape strides;  // in elements
  int64_t offset = 0;  // in elements
  DType dtype = DType::f32;
  std::unique_ptr<AutogradMeta> autograd;
  SavedAliasMark saved_alias;  // set on autograd's saved copies only
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl().shape; }
  const Shape& strides() const { return impl().strides; }
  int64_t dim() const { return static_cast<int64_t>(impl().shape.size()); }
  int64_t size(int64_t d) const;  // negative d counts from the end
  int64_t stride(int64_t d) const;
  int64_t numel() const { return impl().shape.numel(); }
  int64_t offset() const { return impl().offset; }
  DType dtype() const { return impl().dtype; }
  Device device() const { return impl().storage->device; }
  size_t element_size() const { return dtype_size(dtype()); }
  size_t nbytes() const { return size_t(numel()) * element_size(); }
  bool is_contiguous() const;
  // Whether the elements lie densely in that layout's order (size-1 dims are ignored, so a tensor can
  // be both); channels_last needs 4 dims.
  bool is_contiguous(MemoryFormat format) const;
  // Dense NHWC-ordered (channels_last) and not NCHW-contiguous: the layout the conv, batch norm and
  // elementwise ops keep (see MemoryFormat).
  bool is_channels_last() const { return dim() == 4 && !is_contiguous() && is_contiguous(MemoryFormat::channels_last); }
  const std::shared_ptr<Storage>& storage() const { return impl().storage; }
  uint64_t version() const { return impl().storage->version; }
  void bump_version() const { ++impl().storage->version; }

  void* raw_data() const;  // address of element 0 (offset applied)
  template <typename T> T* data() const {
    KILN_CHECK(DTypeOf<T>::value == dtype(), "data<", dtype_name(DTypeOf<T>::value), ">(): tensor is ", dtype());
    return static_cast<T*>(raw_data());
  }
  // The value of a one-element tensor, converted to T (copied from the device if needed); integer
  // types are read exactly (an i64 above 2^53 survives), floats through f64.
  template <typename T> T item() const {
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      KILN_CHECK(numel() == 1, "item(): the tensor has ", numel(), " elements, not 1");
      if constexpr (requires { DTypeOf<T>::value; }) return values<T>()[0];
      else return static_cast<T>(values<int64_t>()[0]);  // size_t, long long, ...: through i64
    } else {
      return static_cast<T>(item_double());
    }
  }
  double item_double() const;
  // All elements in row-major order, converted (copied from the device if needed).
  std::vector<double> to_vector() const;
  // All elements in row-major order as T, converted as to(dtype) converts: exact when the tensor
  // already holds T's dtype (no detour through f64).
  template <typename T> std::vector<T> values() const {
    if (device().is_cpu()) detail::count_host_read();
    const Tensor c = detach().to(kCPU).to(DTypeOf<T>::value).contiguous();
    const T* p = c.data<T>();
    return std::vector<T>(p, p + c.numel());
  }

  // ---- autograd ----
  bool requires_grad() const { return impl_ && impl_->autograd && impl_->autograd->requires_grad; }
  // Only leaves may be flagged; returns *this for chaining.
  Tensor& set_requires_grad(bool r = true);
  bool is_leaf() const { return !grad_fn(); }
  std::shared_ptr<Node> grad_fn() const { return impl_ && impl_->autograd ? impl_->autograd->grad_fn : nullptr; }
  uint32_t output_nr() const { return impl_ && impl_->autograd ? impl_->autograd->output_nr : 0; }
  Tensor grad() const;
  void set_grad(const Tensor& g);
  // Runs reverse-mode autograd from this tensor. With no gradient the tensor must have one element.
  // create_graph: record the backward too (see autograd::backward).
  void backward(const Tensor& grad_output = Tensor(), bool retain_graph = false, bool create_graph = false) const;
  // A tensor sharing the data, cut from the graph.
  Tensor detach() const;
  // Called after the gradient of this leaf has been fully accumulated in a backward pass. Returns an id.
  int register_grad_ready_hook(GradHook hook);
  void remove_grad_ready_hook(int id);
  // Calls hook(grad) with the gradient reaching this tensor in every backward pass, before it is used
  // (summed into a leaf's .grad, or passed back through the op that made this tensor); a defined
  // return of the same shape, dtype and device replaces it. Not called when no gradient reaches the
  // tensor. Hooks run in the order registered. Returns an id for remove_hook. As PyTorch's register_hook.
  int register_hook(TensorHook hook);
  void remove_hook(int id);
  // A non-leaf keeps its gradient in .grad (summed over backward passes, as a leaf's), taken after its
  // hooks; a no-op on a leaf.
  void retain_grad();
  bool retains_grad() const { return impl_ && impl_->autograd && impl_->autograd->retains_grad; }

  // ---- views (no copies) ----
  Tensor view(const Shape& shape) const;  // one dim may be -1; needs compatible strides
  Tensor reshape(const Shape& shape) const;  // a view when possible, else a copy
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  Tensor permute(const std::vector<int64_t>& dims) const;
  Tensor transpose(int64_t d0, int64_t d1) const;
  Tensor t() const;  // 2-D transpose
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  // A view for step > 0; a negative step (NumPy's rule: start, start + step, ... > end, negative
  // start/end counted from the end) gives a copy.
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor select(int64_t dim, int64_t index) const;  // removes the dim
  Tensor expand(const Shape& shape) const;  // -1 keeps a size
  Tensor squeeze() const;
  Tensor squeeze(int64_t dim) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor as_strided(const Shape& shape, const Shape& strides, int64_t offset) const;

  // ---- copies ----
  Tensor contiguous() const;
  // This tensor, or a copy of it, laid out in `format` (differentiable, as clone).
  Tensor contiguous(MemoryFormat format) const;
  Tensor clone() const;
  Tensor to(DType dtype) const;
  Tensor to(Device device) const;

  // ---- in-place (bump the version; not recorded by autograd) ----
  Tensor& copy_(const Tensor& src);
  Tensor& fill_(double value);
  Tensor& zero_() { return fill_(0.0); }
  Tensor& add_(const Tensor& other, double alpha = 1.0);
  Tensor& mul_(const Tensor& other);
  Tensor& mul_(double value);

  std::string str(int64_t max_per_dim = 6) const;
  std::string type_str() const;  // "f32 cpu [2,3]"

  TensorImpl& impl() const {
    KILN_CHECK(impl_, "use of an undefined tensor");
    return *impl_;
  }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool same(const Tensor& o) const { return impl_ == o.impl_; }

 private:
  std::shared_ptr<TensorImpl> impl_;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);

// Builds a tensor over fresh storage; `strides` empty means contiguous.
Tensor make_tensor(const Shape& shape, DType dtype, Device device);
// The same in a memory format (channels_last: a 4-D shape, NHWC in memory).
Tensor make_tensor(const Shape& shape, DType dtype, Device device, MemoryFormat format);
Shape contiguous_strides(const Shape& shape);
// Normalises a possibly negative dim against `ndim`, naming `op` in the error.
int64_t wrap_dim(int64_t d, int64_t ndim, const char* op);

}  // namespace kiln
