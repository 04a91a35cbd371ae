// Storage, the CPU allocator, and Tensor's own methods: geometry, views (each recording its
// backward), copies, in-place updates and printing.
#include "engine/tensor.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <iomanip>
#include <mutex>
#include <unordered_map>
#include <numeric>
#include <sstream>

#include "engine/autograd.h"
#include "engine/context.h"
#include "engine/internal.h"
#include "engine/nn_ops.h"
#include "engine/ops.h"
#include "kernels/cuda/cuda_backend.h"

namespace kiln {

// ---- Shape, storage, allocator -------------------------------------------------------------------

int64_t Shape::numel() const {
  int64_t n = 1;
  bool overflow = false;
  for (int64_t s : *this) {
    if (s == 0) return 0;  // an empty tensor, however large its other sizes
    overflow |= __builtin_mul_overflow(n, s, &n);
  }
  KILN_CHECK(!overflow, "shape ", *this, " has more elements than fit in 64 bits");
  return n;
}

std::ostream& operator<<(std::ostream& os, const Shape& s) {
  os << '[';
  for (size_t i = 0; i < s.size(); ++i) os << (i ? "," : "") << s[i];
  return os << ']';
}

namespace {
// Large blocks are kept for reuse instead of going back to the system: a training step frees and
// allocates the same sizes every step, and fresh pages cost a page fault and a zeroing each. Blocks
// of 64 KiB and more are rounded up to one of 8 size classes per power of two (at most 12.5%
// slack) and cached up to a limit (set_cpu_cache_limit, default 4 GiB; 0 turns the cache off, as do
// AddressSanitizer builds, so a use after free is still caught).
class CpuAllocator final : public Allocator {
 public:
  CpuAllocator() {
    limit_ = size_t(4096) << 20;
#if defined(__SANITIZE_ADDRESS__)
    limit_ = 0;
#endif
  }
  size_t limit() const { return limit_.load(); }
  void set_limit(size_t bytes) {
#if !defined(__SANITIZE_ADDRESS__)
    limit_ = bytes;
#endif
    std::lock_guard<std::mutex> lk(m_);
    if (cached_ > limit_) release_cache_locked();
  }

  void* allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    const size_t now = allocated_.fetch_add(nbytes) + nbytes;
    if (const size_t cap = cap_.load(); cap > 0 && now > cap) {
      allocated_ -= nbytes;
      KILN_FAIL_OOM("CPU memory cap reached: allocating ", detail::mib(nbytes), " with ", detail::mib(now - nbytes),
                    " in use passes the cap of ", detail::mib(cap));
    }
    for (size_t peak = peak_.load(); now > peak && !peak_.compare_exchange_weak(peak, now);) {
    }
    ++allocations_;
    try {
      return take(nbytes);
    } catch (...) {
      allocated_ -= nbytes;
      throw;
    }
  }

  HostMemoryStats stats() {
    HostMemoryStats s;
    s.allocated = allocated_.load();
    s.peak_allocated = peak_.load();
    s.cap = cap_.load();
    s.allocations = allocations_.load();
    std::lock_guard<std::mutex> lk(m_);
    s.cached = cached_;
    return s;
  }
  void reset_peak() { peak_ = allocated_.load(); }
  void set_cap(size_t bytes) { cap_ = bytes; }

 private:
  void* take(size_t nbytes) {
    const size_t size = size_class(nbytes);
    if (size >= kMinCached && limit_ > 0) {
      std::lock_guard<std::mutex> lk(m_);
      auto it = free_.find(size);
      if (it != free_.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        cached_ -= size;
        return p;
      }
    }
    void* p = std::aligned_alloc(64, size);
    if (!p) {  // out of memory: give the cache back and try once more
      release_cache();
      p = std::aligned_alloc(64, size);
    }
    KILN_CHECK(p, "out of host memory allocating ", nbytes, " bytes");
    return p;
  }

 public:
  void deallocate(void* p, size_t nbytes) noexcept override {
    if (!p) return;
    allocated_ -= nbytes;
    const size_t size = size_class(nbytes);
    if (size >= kMinCached && limit_ > 0) {
      std::lock_guard<std::mutex> lk(m_);
      if (cached_ + size <= limit_) {
        try {
          free_[size].push_back(p);
          cached_ += size;
          return;
        } catch (...) {  // no memory for the list entry: free the block instead
        }
      }
    }
    std::free(p);
  }

 private:
  static constexpr size_t kMinCached = size_t(64) << 10;
  static size_t size_class(size_t n) {
    n = (n + 63) / 64 * 64;
    if (n < kMinCached) return n;
    const int top = 63 - __builtin_clzll(n);  // 2^top <= n < 2^(top+1)
    const size_t step = size_t(1) << (top - 3);
    return (n + step - 1) / step * step;
  }
  void release_cache() noexcept {
    std::lock_guard<std::mutex> lk(m_);
    release_cache_locked();
  }
  void release_cache_locked() noexcept {  // m_ held
    for (auto& [size, blocks] : free_)
      for (void* p : blocks) std::free(p);
    free_.clear();
    cached_ = 0;
  }

  std::mutex m_;
  std::unordered_map<size_t, std::vector<void*>> free_;
  size_t cached_ = 0;
  std::atomic<size_t> limit_{0};
  std::atomic<size_t> allocated_{0}, peak_{0}, cap_{0};
  std::atomic<int64_t> allocations_{0};
};

CpuAllocator& cpu_allocator_impl() {
  // Never destroyed: tensors held in other statics may be freed after this one's destructor would run.
  static CpuAllocator* a = new CpuAllocator;
  return *a;
}
}  // namespace

void set_cpu_cache_limit(size_t bytes) { cpu_allocator_impl().set_limit(bytes); }
size_t cpu_cache_limit() { return cpu_allocator_impl().limit(); }
HostMemoryStats cpu_memory_stats() { return cpu_allocator_impl().stats(); }
void reset_cpu_memory_peak() { cpu_allocator_impl().reset_peak(); }
void set_cpu_memory_cap(size_t bytes) { cpu_allocator_impl().set_cap(bytes); }
Allocator& cpu_allocator() {
  return cpu_allocator_impl();
}

Storage::Storage(size_t n, Device dev, Allocator* alloc) : nbytes(n), device(dev), allocator(alloc) {
  data = alloc->allocate(n);
}
Storage::Storage(void* d, size_t n, Device dev, std::function<void(void*)> rel)
    : data(d), nbytes(n), device(dev), release(std::move(rel)) {}
Storage::~Storage() {
  if (allocator) {
    allocator->deallocate(data, nbytes);
  } else if (release) {
    release(data);
  }
}

Shape contiguous_strides(const Shape& shape) {
  Shape st(shape.size());
  int64_t s = 1;
  for (int64_t i = int64_t(shape.size()) - 1; i >= 0; --i) {
    st[size_t(i)] = s;
    // The product past dim 0 is no stride (an empty tensor's may overflow harmlessly); the others must fit.
    if (i > 0)
      KILN_CHECK(!__builtin_mul_overflow(s, std::max<int64_t>(shape[size_t(i)], 1), &s), "shape ", shape,
                 " has strides past 64 bits");
  }
  return st;
}

int64_t wrap_dim(int64_t d, int64_t ndim, const char* op) {
  const int64_t n = std::max<int64_t>(ndim, 1);  // a 0-dim tensor accepts dim 0 and -1
  KILN_CHECK(d >= -n && d < n, op, ": dim ", d, " is out of range for a tensor with ", ndim, " dims");
  return d < 0 ? d + n : d;
}

Tensor pin_memory(const Tensor& t) {
  if (!t.device().is_cpu() || t.nbytes() == 0 || cuda::device_count() == 0) return t;
  const Tensor c = t.contiguous();
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>(c.nbytes(), kCPU, &cuda::pinned_allocator());
  std::memcpy(impl->storage->data, c.raw_data(), c.nbytes());
  impl->shape = c.shape();
  impl->strides = contiguous_strides(c.shape());
  impl->dtype = c.dtype();
  return Tensor(std::move(impl));
}

namespace {
// detail::DeviceEmulation's backend and memory for cuda:0, while one lives.
struct Emulation {
  const Backend* backend;
  Allocator* memory;
};
std::atomic<const Emulation*> g_emulation{nullptr};
const Emulation* emulating(Device d) {
  if (!d.is_cuda()) return nullptr;
  const Emulation* e = g_emulation.load(std::memory_order_relaxed);
  KILN_CHECK(!e || d.index == 0, "the emulated device is cuda:0 only, got ", d);
  return e;
}

// A contiguous tensor whose storage comes from `alloc`.
Tensor make_tensor_in(const Shape& shape, DType dtype, Device device, Allocator& alloc) {
  detail::poll_interrupt();  // between kernels: every op allocates its output here
  KILN_CHECK(shape.size() <= size_t(kMaxDims), "tensors have at most ", kMaxDims, " dims, got shape ", shape);
  for (int64_t s : shape) KILN_CHECK(s >= 0, "negative size in shape ", shape);
  int64_t nbytes = 0;
  KILN_CHECK(!__builtin_mul_overflow(shape.numel(), int64_t(dtype_size(dtype)), &nbytes), "shape ", shape, " of ",
             dtype, " needs more bytes than fit in 64 bits");
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  impl->storage = std::make_shared<Storage>(size_t(nbytes), device, &alloc);
  return Tensor(std::move(impl));
}
}  // namespace

Tensor make_tensor(const Shape& shape, DType dtype, Device device) {
  if (device.is_meta()) return make_tensor_in(shape, dtype, device, detail::meta_allocator());
  if (const Emulation* e = emulating(device)) return make_tensor_in(shape, dtype, device, *e->memory);
  return make_tensor_in(shape, dtype, device, device.is_cpu() ? cpu_allocator() : cuda::tensor_allocator(device.index));
}

Tensor make_tensor(const Shape& shape, DType dtype, Device device, MemoryFormat format) {
  if (format == MemoryFormat::contiguous) return make_tensor(shape, dtype, device);
  KILN_CHECK(shape.size() == 4, "channels_last needs a 4-D [N, C, H, W] shape, got ", shape);
  Tensor t = make_tensor({shape[0], shape[2], shape[3], shape[1]}, dtype, device);
  TensorImpl& im = t.impl();
  im.shape = shape;
  im.strides = {shape[2] * shape[3] * shape[1], 1, shape[3] * shape[1], shape[1]};
  return t;
}

// ---- detail helpers -----------------------------------------------------------------------------

namespace detail {

TensorDesc desc(const Tensor& t) {
  TensorDesc d;
  d.data = t.raw_data();
  d.dtype = t.dtype();
  d.ndim = int(t.dim());
  KILN_CHECK(d.ndim <= kMaxKernelDims, "kernels take at most ", kMaxKernelDims, " dims, got ", t.shape());
  for (int i = 0; i < d.ndim; ++i) {
    d.shape[i] = t.shape()[size_t(i)];
    d.strides[i] = t.strides()[size_t(i)];
  }
  return d;
}

TensorDesc desc_broadcast(const Tensor& t, const Shape& shape) {
  TensorDesc d;
  d.data = t.raw_data();
  d.dtype = t.dtype();
  d.ndim = int(shape.size());
  const int64_t off = int64_t(shape.size()) - t.dim();
  KILN_ASSERT(off >= 0, "cannot broadcast ", t.shape(), " to ", shape);
  for (int i = 0; i < d.ndim; ++i) {
    d.shape[i] = shape[size_t(i)];
    const int64_t j = i - off;
    if (j < 0 || t.shape()[size_t(j)] == 1) {
      d.strides[i] = 0;
    } else {
      KILN_ASSERT(t.shape()[size_t(j)] == shape[size_t(i)], "cannot broadcast ", t.shape(), " to ", shape);
      d.strides[i] = t.strides()[size_t(j)];
    }
  }
  return d;
}

namespace {
std::atomic<const Backend*> g_cpu_override{nullptr};
}

const Backend& backend(Device d) {
  if (d.is_meta()) return meta_backend();
  if (const Emulation* e = emulating(d)) return *e->backend;
  if (!d.is_cpu()) return cuda::backend(d.index);
  const Backend* o = g_cpu_override.load(std::memory_order_relaxed);
  return o ? *o : cpu_backend();
}

BackendOverride::BackendOverride(const Backend& b) {
  KILN_CHECK(g_emulation.load() == nullptr, "BackendOverride: a DeviceEmulation is installed");
  const Backend* none = nullptr;
  KILN_CHECK(g_cpu_override.compare_exchange_strong(none, &b), "BackendOverride: one is already installed");
}
BackendOverride::~BackendOverride() { g_cpu_override.store(nullptr); }

DeviceEmulation::DeviceEmulation(const Backend& b, Allocator& memory) {
  static Emulation e;  // one at a time
  KILN_CHECK(g_cpu_override.load() == nullptr, "DeviceEmulation: a BackendOverride is installed");
  KILN_CHECK(g_emulation.load() == nullptr, "DeviceEmulation: one is already installed");
  e = Emulation{&b, &memory};
  g_emulation.store(&e);
}
DeviceEmulation::~DeviceEmulation() { g_emulation.store(nullptr); }

Device common_device(const char* op, const std::vector<Tensor>& ts) {
  Device d = ts.at(0).device();
  for (const Tensor& t : ts)
    KILN_CHECK(t.device() == d, op, ": tensors are on different devices (", d, " and ", t.device(), ")");
  return d;
}

std::vector<int64_t> normalize_dims(const std::vector<int64_t>& dims, int64_t ndim, const char* op) {
  std::vector<int64_t> out;
  for (int64_t d : dims) {
    const int64_t w = wrap_dim(d, ndim, op);
    KILN_CHECK(std::find(out.begin(), out.end(), w) == out.end(), op, ": dim ", d, " appears twice");
    out.push_back(w);
  }
  std::sort(out.begin(), out.end());
  return out;
}

Tensor make_view(const Tensor& t, const Shape& shape, const Shape& strides, int64_t offset) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = t.storage();
  impl->shape = shape;
  impl->strides = strides;
  impl->offset = offset;
  impl->dtype = t.dtype();
  return Tensor(std::move(impl));
}

void check_inplace(const Tensor& t, const char* op) {
  KILN_CHECK(!(GradMode::enabled() && t.requires_grad()), op, ": in-place update of a tensor that requires grad ",
             t.type_str(), "; do it under NoGradGuard (kiln.no_grad() in Python) or use the out-of-place op");
}

namespace {
// An in-place write is not recorded by autograd, so a source that requires grad would lose its gradient
// silently (z[1:2] = w * 3 with a plain z): refused while grad mode is on, as the destination is.
void check_inplace_source(const Tensor& t, const Tensor& src, const char* op) {
  check_inplace(t, op);
  KILN_CHECK(!(GradMode::enabled() && src.requires_grad()), op, ": the operand ", src.type_str(),
             " requires grad, and an in-place write is not recorded by autograd, so its gradient would be lost; "
             "use the out-of-place op (z = z + v, where(mask, v, z), cat), or do it under NoGradGuard (kiln.no_grad() "
             "in Python) "
             "if the gradient is not wanted");
}
}  // namespace

namespace {
// The bytes a tensor with at least one element can reach, [lo, hi): by address, since two storages
// (from_blob, DLPack) may hold the same memory.
std::pair<uintptr_t, uintptr_t> byte_extent(const Tensor& t) {
  int64_t lo = 0, hi = 0;
  for (int64_t i = 0; i < t.dim(); ++i)
    (t.strides()[size_t(i)] < 0 ? lo : hi) += (t.shape()[size_t(i)] - 1) * t.strides()[size_t(i)];
  const auto at = reinterpret_cast<uintptr_t>(t.raw_data());
  const auto es = int64_t(t.element_size());
  return {at + uintptr_t(lo * es), at + uintptr_t((hi + 1) * es)};
}
}  // namespace

void check_fill_value(const Tensor& t, double value, const char* op) {
  if (!is_integral(t.dtype()) || t.dtype() == DType::boolean) return;
  double lo = -9223372036854775808.0, end = 9223372036854775808.0;  // [lo, end)
  switch (t.dtype()) {
    case DType::u8: lo = 0, end = 256; break;
    case DType::i8: lo = -128, end = 128; break;
    case DType::i16: lo = -32768, end = 32768; break;
    case DType::i32: lo = -2147483648.0, end = 2147483648.0; break;
    default: break;
  }
  KILN_CHECK(std::isfinite(value) && value >= lo && value < end, op, ": ", value, " does not fit in ", t.type_str());
}

void check_inplace_result(const Tensor& t, const Tensor& other, const char* op) {
  const DType r = result_type(t, other);
  KILN_CHECK(can_cast(r, t.dtype()), op, ": the result type ", r, " cannot be written into ", t.type_str(),
             " in place (the operand is ", other.type_str(), ")");
}

Tensor inplace_operand(const Tensor& t, const Tensor& other, const char* op) {
  for (int64_t i = 0; i < t.dim(); ++i)
    KILN_CHECK(t.strides()[size_t(i)] != 0 || t.shape()[size_t(i)] <= 1, op, ": ", t.type_str(), " with strides ",
               t.strides(), " has elements that share memory (an expanded view); write into a contiguous copy");
  Tensor o = other.detach();
  if (o.device() != t.device() || !o.raw_data() || !t.raw_data() || o.numel() == 0 || t.numel() == 0) return o;
  if (o.raw_data() == t.raw_data() && o.dtype() == t.dtype() && o.shape() == t.shape() && o.strides() == t.strides())
    return o;  // x op= x: each element is read before it is written
  const auto [tlo, thi] = byte_extent(t);
  const auto [olo, ohi] = byte_extent(o);
  return olo < thi && tlo < ohi ? o.clone() : o;
}

}  // namespace detail

using detail::make_view;

// ---- geometry -------------------------------------------------------------------------------------

int64_t Tensor::size(int64_t d) const {
  KILN_CHECK(dim() > 0, "size(", d, "): tensor is 0-dim");
  return shape()[size_t(wrap_dim(d, dim(), "size"))];
}
int64_t Tensor::stride(int64_t d) const {
  KILN_CHECK(dim() > 0, "stride(", d, "): tensor is 0-dim");
  return strides()[size_t(wrap_dim(d, dim(), "stride"))];
}

bool Tensor::is_contiguous(MemoryFormat format) const {
  if (format == MemoryFormat::contiguous) return is_contiguous();
  if (dim() != 4) return false;
  // No exception for an empty tensor, as PyTorch's: its NCHW strides are not channels_last ones (so
  // contiguous(channels_last) gives it channels_last strides, which count a size-0 dim as 0).
  int64_t expected = 1;
  for (int64_t i : {1, 3, 2, 0}) {  // C, W, H, N: innermost first
    const int64_t s = shape()[size_t(i)];
    if (s == 1) continue;
    if (strides()[size_t(i)] != expected) return false;
    expected *= s;
  }
  return true;
}

bool Tensor::is_contiguous() const {
  // An empty tensor has no element to misplace: contiguous whatever its strides (PyTorch's rule; its
  // contiguous strides, like contiguous_strides', count a size-0 dim as 1).
  if (numel() == 0) return true;
  int64_t expected = 1;
  for (int64_t i = dim() - 1; i >= 0; --i) {
    const int64_t s = shape()[size_t(i)];
    if (s == 1) continue;
    if (strides()[size_t(i)] != expected) return false;
    expected *= s;
  }
  return true;
}

void* Tensor::raw_data() const {
  auto& im = impl();
  if (!im.storage->data) return nullptr;
  return static_cast<char*>(im.storage->data) + im.offset * int64_t(dtype_size(im.dtype));
}

namespace {
std::atomic<uint64_t> g_host_reads{0};
}  // namespace

uint64_t host_read_count() { return g_host_reads.load(std::memory_order_relaxed); }
void detail::count_host_read() { g_host_reads.fetch_add(1, std::memory_order_relaxed); }

double Tensor::item_double() const {
  KILN_CHECK(numel() == 1, "item(): tensor has ", numel(), " elements (shape ", shape(), "), expected 1");
  if (device().is_cpu()) detail::count_host_read();
  Tensor c = device().is_cpu() ? *this : to(kCPU);
  return visit_dtype(dtype(), [&](auto tag) -> double {
    using T = decltype(tag);
    return static_cast<double>(static_cast<const T*>(c.raw_data())[0]);
  });
}

std::vector<double> Tensor::to_vector() const {
  if (device().is_cpu()) detail::count_host_read();
  Tensor c = detach();
  if (!c.device().is_cpu()) c = c.to(kCPU);
  c = c.to(DType::f64).contiguous();
  const double* p = static_cast<const double*>(c.raw_data());
  return std::vector<double>(p, p + c.numel());
}

// ---- autograd accessors ---------------------------------------------------------------------------

Tensor& Tensor::set_requires_grad(bool r) {
  // As torch: flagging a non-leaf that already requires grad is a no-op; unflagging one is an error.
  if (!is_leaf() && r) return *this;
  KILN_CHECK(is_leaf(), "set_requires_grad: only leaf tensors can change requires_grad; this one was made by ",
             grad_fn()->name(),
             ", so it requires grad through its inputs. For a value outside the graph use "
             "detach() (x.detach() in Python)");
  KILN_CHECK(!r || is_floating(dtype()), "set_requires_grad: only floating tensors can require grad, got ", dtype());
  auto& im = impl();
  if (!im.autograd) im.autograd = std::make_unique<AutogradMeta>();
  im.autograd->requires_grad = r;
  return *this;
}

Tensor Tensor::grad() const {
  if (!impl_ || !impl_->autograd || !impl_->autograd->grad) return Tensor();
  return Tensor(impl_->autograd->grad);
}

void Tensor::set_grad(const Tensor& g) {
  auto& im = impl();
  if (!im.autograd) im.autograd = std::make_unique<AutogradMeta>();
  if (g.defined()) {
    KILN_CHECK(g.shape() == shape(), "set_grad: gradient shape ", g.shape(), " differs from tensor shape ", shape());
    KILN_CHECK(g.device() == device(), "set_grad: gradient on ", g.device(), " for a tensor on ", device());
    // Backward accumulates into it: an integer gradient would truncate every step.
    KILN_CHECK(is_floating(g.dtype()), "set_grad: a gradient must be floating, got ", g.type_str());
  }
  im.autograd->grad = g.defined() ? g.impl_ptr() : nullptr;
}

void Tensor::backward(const Tensor& grad_output, bool retain_graph, bool create_graph) const {
  autograd::backward({*this}, {grad_output}, retain_graph, create_graph);
}

Tensor Tensor::detach() const { return make_view(*this, shape(), strides(), offset()); }

int Tensor::register_grad_ready_hook(GradHook hook) {
  KILN_CHECK(is_leaf() && requires_grad(), "register_grad_ready_hook: needs a leaf that requires grad");
  auto& m = *impl().autograd;
  const int id = m.next_hook_id++;
  m.grad_ready_hooks.emplace_back(id, std::move(hook));
  return id;
}

void Tensor::remove_grad_ready_hook(int id) {
  if (!impl_ || !impl_->autograd) return;
  auto& h = impl_->autograd->grad_ready_hooks;
  h.erase(std::remove_if(h.begin(), h.end(), [id](const auto& p) { return p.first == id; }), h.end());
}

// ---- views ------------------------------------------------------------------------------------------

namespace {

// Records that `out` is a view of `in` whose gradient maps back through `back`.
void record_view(const char* name, const Tensor& in, const Tensor& out, std::function<Tensor(const Tensor&)> back) {
  if (!autograd::needs_grad({in})) return;
  autograd::record(name, {in}, {out}, [back = std::move(back)](const GradCtx& c) -> std::vector<Tensor> {
    return {back(c.g())};
  });
}

Shape infer_shape(const Shape& want, int64_t numel, const Shape& from) {
  Shape s = want;
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      KILN_CHECK(infer < 0, "view: only one dim may be -1, got ", want);
      infer = int64_t(i);
    } else {
      KILN_CHECK(s[i] >= 0, "view: invalid size in ", want);
      known *= s[i];
    }
  }
  if (infer >= 0) {
    KILN_CHECK(known > 0 && numel % known == 0, "view: shape ", want, " is invalid for ", from, " (", numel,
               " elements)");
    s[size_t(infer)] = numel / known;
  }
  KILN_CHECK(s.numel() == numel, "view: shape ", want, " is invalid for ", from, " (", numel, " elements)");
  return s;
}

// Strides for viewing (shape, strides) as new_shape without a copy, if that is possible.
bool view_strides(const Shape& shape, const Shape& strides, const Shape& ns, Shape& out) {
  out.assign(ns.size(), 0);
  if (shape.numel() == 0 || shape.empty()) {
    out = contiguous_strides(ns);
    return true;
  }
  // Walk chunks of old dims that are contiguous among themselves and match them to new dims.
  int64_t view_d = int64_t(ns.size()) - 1;
  int64_t chunk_base_stride = strides.empty() ? 1 : strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t d = int64_t(shape.size()) - 1; d >= 0; --d) {
    tensor_numel *= shape[size_t(d)];
    if (d == 0 || (shape[size_t(d - 1)] != 1 && strides[size_t(d - 1)] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || ns[size_t(view_d)] == 1)) {
        out[size_t(view_d)] = view_numel * chunk_base_stride;
        view_numel *= ns[size_t(view_d)];
        --view_d;
      }
      if (view_numel != tensor_numel) return false;
      if (d > 0) {
        chunk_base_stride = strides[size_t(d - 1)];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  return view_d == -1;
}

}  // namespace

Tensor Tensor::view(const Shape& want) const {
  const Shape ns = infer_shape(want, numel(), shape());
  Shape st;
  KILN_CHECK(view_strides(shape(), strides(), ns, st), "view: cannot view ", shape(), " with strides ", strides(),
             " as ", ns, " without a copy; use reshape()");
  Tensor out = make_view(*this, ns, st, offset());
  const Shape in_shape = shape();
  record_view("view", *this, out, [in_shape](const Tensor& g) { return g.reshape(in_shape); });
  return out;
}

Tensor Tensor::reshape(const Shape& want) const {
  const Shape ns = infer_shape(want, numel(), shape());
  Shape st;
  if (view_strides(shape(), strides(), ns, st)) return view(ns);
  return contiguous().view(ns);
}

Tensor Tensor::flatten(int64_t start, int64_t end) const {
  if (dim() == 0) return reshape({1});
  start = wrap_dim(start, dim(), "flatten");
  end = wrap_dim(end, dim(), "flatten");
  KILN_CHECK(start <= end, "flatten: start_dim ", start, " is after end_dim ", end);
  Shape ns;
  for (int64_t i = 0; i < start; ++i) ns.push_back(shape()[size_t(i)]);
  int64_t m = 1;
  for (int64_t i = start; i <= end; ++i) m *= shape()[size_t(i)];
  ns.push_back(m);
  for (int64_t i = end + 1; i < dim(); ++i) ns.push_back(shape()[size_t(i)]);
  return reshape(ns);
}

Tensor Tensor::permute(const std::vector<int64_t>& dims) const {
  KILN_CHECK(int64_t(dims.size()) == dim(), "permute: got ", dims.size(), " dims for a tensor of shape ", shape());
  Shape ns(dims.size()), st(dims.size());
  std::vector<int64_t> inv(dims.size(), -1);
  for (size_t i = 0; i < dims.size(); ++i) {
    const int64_t d = wrap_dim(dims[i], dim(), "permute");
    KILN_CHECK(inv[size_t(d)] < 0, "permute: dim ", dims[i], " repeats");
    inv[size_t(d)] = int64_t(i);
    ns[i] = shape()[size_t(d)];
    st[i] = strides()[size_t(d)];
  }
  Tensor out = make_view(*this, ns, st, offset());
  record_view("permute", *this, out, [inv](const Tensor& g) { return g.permute(inv); });
  return out;
}

Tensor Tensor::transpose(int64_t d0, int64_t d1) const {
  if (dim() == 0) return permute({});
  std::vector<int64_t> p(static_cast<size_t>(dim()));
  std::iota(p.begin(), p.end(), 0);
  std::swap(p[size_t(wrap_dim(d0, dim(), "transpose"))], p[size_t(wrap_dim(d1, dim(), "transpose"))]);
  return permute(p);
}

Tensor Tensor::t() const {
  KILN_CHECK(dim() <= 2, "t(): expects at most 2 dims, got ", shape());
  return dim() < 2 ? transpose(0, 0) : transpose(0, 1);  // always a new view, as for 2-D
}

Tensor Tensor::slice(int64_t d, int64_t start, int64_t end, int64_t step) const {
  KILN_CHECK(dim() > 0, "slice: tensor is 0-dim");
  d = wrap_dim(d, dim(), "slice");
  KILN_CHECK(step != 0, "slice: step must not be 0");
  const int64_t n = shape()[size_t(d)];
  if (step < 0) {
    // NumPy's rule: start, start + step, ... while > end, both taken from the end when negative and
    // clamped to [-1, n - 1]. A copy (index_select), whose gradient scatters back.
    if (start < 0) start += n;
    if (end < 0) end += n;
    start = std::clamp<int64_t>(start, -1, n - 1);
    end = std::clamp<int64_t>(end, -1, n - 1);
    // Counted in unsigned steps: start + step may pass INT64_MIN when the step is huge.
    const uint64_t stride = uint64_t(0) - uint64_t(step);
    const uint64_t count = start > end ? (uint64_t(start - end) - 1) / stride + 1 : 0;
    std::vector<int64_t> at(count);
    for (uint64_t k = 0; k < count; ++k) at[k] = start - int64_t(k * stride);
    return index_select(*this, d, from_blob_copy(at.data(), {int64_t(at.size())}).to(device()));
  }
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  Shape ns = shape(), st = strides();
  ns[size_t(d)] = end == start ? 0 : (end - start - 1) / step + 1;  // (end - start + step - 1) could overflow
  if (ns[size_t(d)] > 1)
    st[size_t(d)] *= step;  // one element or none: its stride is never stepped (and a huge
                            // step times the stride could overflow)
  Tensor out = make_view(*this, ns, st, offset() + start * strides()[size_t(d)]);
  const Shape in_shape = shape();
  const DType dt = dtype();
  record_view("slice", *this, out, [=](const Tensor& g) {
    Tensor gi = zeros(in_shape, TensorOptions(dt, g.device()));
    {
      NoGradGuard ng;
      gi.slice(d, start, end, step).copy_(g);
    }
    // In a backward with create_graph: recorded, its own gradient the same slice.
    if (autograd::needs_grad({g}))
      autograd::record("slice_backward", {g}, {gi},
                       [=](const GradCtx& c) -> std::vector<Tensor> { return {c.g().slice(d, start, end, step)}; });
    return gi;
  });
  return out;
}

Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const {
  KILN_CHECK(dim() > 0, "narrow: tensor is 0-dim");
  const int64_t dd = wrap_dim(d, dim(), "narrow");
  const int64_t n = shape()[size_t(dd)];
  if (start < 0) start += n;
  KILN_CHECK(start >= 0 && length >= 0 && length <= n - start, "narrow: start ", start, " length ", length,
             " is out of range for dim ", d, " of ", shape());
  return slice(dd, start, start + length);
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  KILN_CHECK(dim() > 0, "select: tensor is 0-dim");
  d = wrap_dim(d, dim(), "select");
  const int64_t n = shape()[size_t(d)];
  KILN_CHECK(index >= -n && index < n, "select: index ", index, " is out of range for dim ", d, " of ", shape());
  if (index < 0) index += n;
  return narrow(d, index, 1).squeeze(d);
}

Tensor Tensor::expand(const Shape& want) const {
  KILN_CHECK(int64_t(want.size()) >= dim(), "expand: cannot expand ", shape(), " to fewer dims ", want);
  const int64_t off = int64_t(want.size()) - dim();
  Shape ns(want.size()), st(want.size());
  for (int64_t i = 0; i < int64_t(want.size()); ++i) {
    const int64_t j = i - off;
    const int64_t cur = j >= 0 ? shape()[size_t(j)] : 1;
    const int64_t w = want[size_t(i)] == -1 ? cur : want[size_t(i)];
    KILN_CHECK(j >= 0 || want[size_t(i)] != -1, "expand: -1 is not allowed for new leading dims, got ", want);
    KILN_CHECK(w >= 0, "expand: negative size ", w, " in ", want);
    KILN_CHECK(cur == w || cur == 1, "expand: cannot expand ", shape(), " to ", want, " (dim ", i, ": ", cur, " vs ",
               w, ")");
    ns[size_t(i)] = w;
    st[size_t(i)] = (j >= 0 && cur == w) ? strides()[size_t(j)] : 0;
  }
  (void)ns.numel();  // a shape whose element count overflows is refused here, not by a later kernel
  Tensor out = make_view(*this, ns, st, offset());
  // The generic sum_to in autograd::record undoes the broadcast.
  record_view("expand", *this, out, [](const Tensor& g) { return g; });
  return out;
}

Tensor Tensor::squeeze() const {
  Shape ns;
  for (int64_t s : shape())
    if (s != 1) ns.push_back(s);
  return ns.size() == shape().size() ? *this : reshape(ns);
}

Tensor Tensor::squeeze(int64_t d) const {
  if (dim() == 0) return *this;
  d = wrap_dim(d, dim(), "squeeze");
  if (shape()[size_t(d)] != 1) return *this;
  Shape ns = shape(), st = strides();
  ns.erase(ns.begin() + d);
  st.erase(st.begin() + d);
  Tensor out = make_view(*this, ns, st, offset());
  const Shape in_shape = shape();
  record_view("squeeze", *this, out, [in_shape](const Tensor& g) { return g.reshape(in_shape); });
  return out;
}

Tensor Tensor::unsqueeze(int64_t d) const {
  d = wrap_dim(d, dim() + 1, "unsqueeze");
  Shape ns = shape(), st = strides();
  const int64_t s = d < dim() ? strides()[size_t(d)] * shape()[size_t(d)] : 1;
  ns.insert(ns.begin() + d, 1);
  st.insert(st.begin() + d, s);
  Tensor out = make_view(*this, ns, st, offset());
  record_view("unsqueeze", *this, out, [d](const Tensor& g) { return g.squeeze(d); });
  return out;
}

Tensor Tensor::as_strided(const Shape& ns, const Shape& st, int64_t off) const {
  KILN_CHECK(ns.size() == st.size(), "as_strided: shape ", ns, " and strides ", st, " differ in length");
  KILN_CHECK(!autograd::needs_grad({*this}),
             "as_strided: not differentiable; build the view from view/permute/slice/expand instead");
  int64_t hi = off, lo = off;
  for (size_t i = 0; i < ns.size(); ++i) {
    KILN_CHECK(ns[i] >= 0, "as_strided: negative size in ", ns);
    if (ns[i] == 0) return make_view(*this, ns, st, off);
  }
  for (size_t i = 0; i < ns.size(); ++i) {
    int64_t reach = 0;
    KILN_CHECK(!__builtin_mul_overflow(ns[i] - 1, st[i], &reach) &&
                   !__builtin_add_overflow(st[i] >= 0 ? hi : lo, reach, st[i] >= 0 ? &hi : &lo),
               "as_strided: shape ", ns, " strides ", st, " offset ", off, " reach past 64-bit offsets");
  }
  const int64_t cap = int64_t(storage()->nbytes / element_size());
  KILN_CHECK(lo >= 0 && hi < cap, "as_strided: shape ", ns, " strides ", st, " offset ", off,
             " reaches outside the storage of ", cap, " elements");
  return make_view(*this, ns, st, off);
}

// ---- copies -----------------------------------------------------------------------------------------

namespace {
Tensor copy_as(const Tensor& src, DType dt) {
  Tensor out = make_tensor(src.shape(), dt, src.device());
  detail::backend(src.device()).copy(detail::desc(out), detail::desc(src));
  return out;
}
}  // namespace

Tensor Tensor::contiguous() const { return is_contiguous() ? *this : clone(); }

Tensor Tensor::contiguous(MemoryFormat format) const {
  if (format == MemoryFormat::contiguous) return contiguous();
  KILN_CHECK(dim() == 4, "contiguous(channels_last): needs a 4-D [N, C, H, W] tensor, got ", shape());
  if (is_contiguous(format)) return *this;
  Tensor out = make_tensor(shape(), dtype(), device(), format);
  detail::backend(device()).copy(detail::desc(out), detail::desc(*this));
  record_view("contiguous", *this, out, [](const Tensor& g) { return g; });
  return out;
}

Tensor Tensor::clone() const {
  Tensor out = copy_as(*this, dtype());
  record_view("clone", *this, out, [](const Tensor& g) { return g; });
  return out;
}

Tensor Tensor::to(DType dt) const { return dt == dtype() ? *this : cast(*this, dt); }

Tensor Tensor::to(Device d) const {
  if (d == device()) return *this;
  KILN_CHECK(!device().is_meta(), "a meta tensor ", type_str(), " holds a shape but no values: nothing to copy to ", d,
             " (meta tensors are for planning memory)");
  // A channels_last tensor moves as it is laid out (dense NHWC bytes): its copy keeps the layout, as
  // torch's (made NCHW, a model fed channels_last inputs ran its NCHW kernels on the device).
  const bool nhwc = is_channels_last();
  const Tensor src = nhwc ? *this : contiguous();
  Tensor out;
  if (d.is_meta()) {  // the shape goes, not the values
    out = make_tensor(shape(), dtype(), d);
  } else if (emulating(d) || emulating(device())) {  // host memory on both sides
    out = make_tensor(shape(), dtype(), d);
    if (d.is_cpu()) detail::count_host_read();
    if (nbytes()) std::memcpy(out.raw_data(), src.raw_data(), nbytes());
  } else if (src.device().is_cpu() && d.is_cuda()) {
    // Returns at once; a page-locked source stays alive until the device has read it, and its copy
    // overlaps the kernels already queued (cuda_backend.h).
    out = make_tensor_in(shape(), dtype(), d, cuda::upload_allocator(d.index, src.raw_data()));
    cuda::copy_to_device_async(out.raw_data(), d.index, src.raw_data(), nbytes(), src.storage());
  } else {
    out = make_tensor(shape(), dtype(), d);
    if (d.is_cpu()) detail::count_host_read();  // waits for the device
    cuda::copy_bytes(out.raw_data(), d, src.raw_data(), src.device(), nbytes());
  }
  if (nhwc) {
    const Shape& s = shape();
    out.impl().strides = {s[2] * s[3] * s[1], 1, s[3] * s[1], s[1]};
  }
  record_view("to", *this, out, [from = device()](const Tensor& g) { return g.to(from); });
  return out;
}

Tensor& Tensor::copy_(const Tensor& src) {
  detail::check_inplace_source(*this, src, "copy_");
  Tensor s = detail::inplace_operand(*this, src, "copy_");
  if (s.device() != device()) s = s.to(device());  // across devices: one transfer, then a local copy
  if (s.shape() != shape()) {
    const OpScope scope("copy_");  // "copy_: expand: cannot expand [3] to [4]", not a bare expand
    s = s.expand(shape());
  }
  detail::backend(device()).copy(detail::desc(*this), detail::desc(s));
  bump_version();
  return *this;
}

Tensor& Tensor::fill_(double value) {
  detail::check_inplace(*this, "fill_");
  detail::check_fill_value(*this, value, "fill_");
  detail::backend(device()).fill(detail::desc(*this), value);
  bump_version();
  return *this;
}

namespace {
// x op= other: PyTorch's rules (the result type must fit x, x is not an expanded view, other broadcasts into x),
// and an operand that overlaps x is read from a copy, so x += x.T gives NumPy's answer.
void binary_inplace(Tensor& t, BinaryOp op, const Tensor& other, double alpha, const char* name) {
  detail::check_inplace_source(t, other, name);
  detail::common_device(name, {t, other});  // a kernel reads only its own device's memory
  detail::check_inplace_result(t, other, name);
  // alpha as the out-of-place op takes it in the type the two compute in (PyTorch's check), then in t's
  // dtype, which the kernel computes in: integer sums wrap alike (u8 x.add_(y, alpha=-1) is x - y).
  detail::check_alpha(name, result_type(t, other), alpha);
  alpha = detail::alpha_in(t.dtype(), alpha);
  Tensor o = detail::inplace_operand(t, other, name);
  // A 0-dim f32 operand (a number) of a 16-bit x += / *= stays f32, as in x + n and x * n (run_binary):
  // the kernel computes in f32 and rounds once (bf16 x *= 0.999 was x *= 0.99609375).
  const bool number = is_low_precision(t.dtype()) && o.dim() == 0 && o.dtype() == DType::f32;
  if (o.dtype() != t.dtype() && !number) o = o.to(t.dtype());
  KILN_CHECK(broadcast_shapes(t.shape(), o.shape()) == t.shape(), name, ": cannot broadcast ", other.shape(), " into ",
             t.shape());
  detail::backend(t.device())
      .binary(op, detail::desc(t), detail::desc(t), number ? detail::desc(o) : detail::desc_broadcast(o, t.shape()),
              alpha);
  t.bump_version();
}
}  // namespace

Tensor& Tensor::add_(const Tensor& other, double alpha) {
  binary_inplace(*this, BinaryOp::add, other, alpha, "add_");
  return *this;
}

Tensor& Tensor::mul_(const Tensor& other) {
  binary_inplace(*this, BinaryOp::mul, other, 1.0, "mul_");
  return *this;
}

Tensor& Tensor::mul_(double v) {
  // 16-bit: the number in f32, rounding only the product (as x * v)
  return mul_(is_low_precision(dtype()) ? scalar_tensor(v, TensorOptions(DType::f32, device()))
                                        : scalar_like(v, *this));
}

// ---- printing ---------------------------------------------------------------------------------------

std::string Tensor::type_str() const {
  std::ostringstream os;
  os << dtype() << ' ' << device() << ' ' << shape();
  return os.str();
}

namespace {
// v holds the elements of a floating or boolean tensor, iv those of an integer one (read as i64, exactly:
// through a double, 2^62 + 1 printed as 4611686018427387904).
void print_rec(std::ostream& os, const std::vector<double>& v, const std::vector<int64_t>& iv, const Shape& shape,
               size_t d, int64_t base, int64_t max_per_dim, DType dt, int indent) {
  const int64_t n = shape[d];
  int64_t inner = 1;
  for (size_t i = d + 1; i < shape.size(); ++i) inner *= shape[i];
  const bool elide = n > max_per_dim;
  const int64_t head = elide ? max_per_dim / 2 : n;
  os << '[';
  for (int64_t i = 0; i < n; ++i) {
    if (elide && i == head) {
      os << (d + 1 == shape.size() ? "..., " : "...,\n" + std::string(size_t(indent + 1), ' '));
      i = n - (max_per_dim - head) - 1;
      continue;
    }
    if (d + 1 == shape.size()) {
      if (dt == DType::boolean) {
        os << (v[size_t(base + i)] != 0 ? "true" : "false");
      } else if (is_floating(dt)) {
        os << std::setprecision(5) << v[size_t(base + i)];
      } else {
        os << iv[size_t(base + i)];
      }
    } else {
      print_rec(os, v, iv, shape, d + 1, base + i * inner, max_per_dim, dt, indent + 1);
    }
    if (i + 1 < n) os << (d + 1 == shape.size() ? ", " : ",\n" + std::string(size_t(indent + 1), ' '));
  }
  os << ']';
}
}  // namespace

std::string Tensor::str(int64_t max_per_dim) const {
  if (!defined()) return "tensor(undefined)";
  std::ostringstream os;
  os << "tensor(" << dtype() << ", " << device() << ", " << shape();
  if (requires_grad()) os << ", requires_grad";
  if (grad_fn()) os << ", grad_fn=" << grad_fn()->name();
  os << ")\n";
  const bool integral = !is_floating(dtype()) && dtype() != DType::boolean;
  const std::vector<double> v = integral ? std::vector<double>() : to_vector();
  const std::vector<int64_t> iv = integral ? values<int64_t>() : std::vector<int64_t>();
  if (dim() == 0) {
    print_rec(os, v, iv, Shape{1}, 0, 0, max_per_dim, dtype(), 0);
  } else if (numel() == 0) {
    os << "[]";
  } else {
    print_rec(os, v, iv, shape(), 0, 0, std::max<int64_t>(max_per_dim, 2), dtype(), 0);
  }
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.str(); }

}  // namespace kiln
