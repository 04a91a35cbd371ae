// The CUDA backend's runtime: one Context per device (streams, library handles, the device error
// word), tensor memory from the caching allocator, copies between host and devices, and the
// backend table the engine dispatches to.
#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "kernels/cuda/context.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/device_memory.h"
#include "kernels/cuda/ops_cuda.h"

namespace kiln::cuda {

// ---- Context -----------------------------------------------------------------------------------

Context::Context(int d) : device(d) {
  KILN_CUDA_OK(cudaSetDevice(d));
  KILN_CUDA_OK(cudaGetDeviceProperties(&prop, d));
  // Non-blocking: the legacy default stream (used by other libraries) never serialises with ours.
  KILN_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  KILN_CUDA_OK(cudaStreamCreateWithFlags(&copy_stream, cudaStreamNonBlocking));
  allocator_ = &device_allocator(d);
  KILN_CUDA_OK(cudaMalloc(&error_word, sizeof(int)));
  KILN_CUDA_OK(cudaMemset(error_word, 0, sizeof(int)));
}

// Runs at process exit; errors are ignored because the driver may already be shutting down.
Context::~Context() {
  if (dnn_) cudnnDestroy(dnn_);
  if (lt_) cublasLtDestroy(lt_);
  cudaFree(error_word);
  cudaStreamDestroy(copy_stream);
  cudaStreamDestroy(stream);
}

cublasLtHandle_t Context::cublaslt() {
  std::lock_guard<std::mutex> lk(handles_mutex_);
  if (!lt_) KILN_CUBLAS_OK(cublasLtCreate(&lt_));
  return lt_;
}

cudnnHandle_t Context::cudnn() {
  std::lock_guard<std::mutex> lk(handles_mutex_);
  if (!dnn_) {
    cudnnHandle_t h = nullptr;
    KILN_CUDNN_OK(cudnnCreate(&h));
    KILN_CUDNN_OK(cudnnSetStream(h, stream));
    dnn_ = h;
  }
  return dnn_;
}

StreamId stream_id(cudaStream_t s) { return reinterpret_cast<StreamId>(s); }

namespace {
// The device backend() last made current on this thread, and its context: what current() returns
// on every launch, without a lock.
thread_local int t_current = -1;
thread_local Context* t_context = nullptr;

// One slot per device, filled once under the mutex and read without it afterwards (every op asks
// for its context). Never destroyed: at process exit the CUDA libraries may already be unloaded,
// and destroying handles then can crash; the driver reclaims everything anyway.
constexpr int kMaxDevices = 64;
std::atomic<Context*> g_contexts[kMaxDevices];
std::mutex g_contexts_mutex;
std::string g_no_device_reason;  // why cudaGetDeviceCount found nothing
std::atomic<bool> g_deterministic{false}, g_tf32{false};

// The driver's own current-context calls, through the runtime (Kiln does not link the driver): with
// them SavedContext puts back exactly what was current, no context at all included, where
// cudaGetDevice would answer 0 for a thread that never chose a device and restoring that would make
// a context on GPU 0. Null where the runtime cannot give them.
struct DriverContextCalls {
  int (*get)(void** ctx) = nullptr;  // cuCtxGetCurrent
  int (*set)(void* ctx) = nullptr;   // cuCtxSetCurrent
};
const DriverContextCalls& driver_context_calls() {
  static const DriverContextCalls calls = [] {
    DriverContextCalls c;
    void *get = nullptr, *set = nullptr;
    cudaDriverEntryPointQueryResult qg{}, qs{};
    if (cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &get, 12000, cudaEnableDefault, &qg) == cudaSuccess &&
        cudaGetDriverEntryPointByVersion("cuCtxSetCurrent", &set, 12000, cudaEnableDefault, &qs) == cudaSuccess &&
        qg == cudaDriverEntryPointSuccess && qs == cudaDriverEntryPointSuccess && get && set) {
      c.get = reinterpret_cast<int (*)(void**)>(get);
      c.set = reinterpret_cast<int (*)(void*)>(set);
    }
    (void)cudaGetLastError();
    return c;
  }();
  return calls;
}

}  // namespace

SavedContext::SavedContext() {
  const DriverContextCalls& d = driver_context_calls();
  exact_ = d.get && d.get(&context_) == 0;
  if (!exact_ && cudaGetDevice(&device_) != cudaSuccess) {
    (void)cudaGetLastError();
    device_ = -1;
  }
}

SavedContext::~SavedContext() {
  if (exact_)
    driver_context_calls().set(context_);  // errors ignored: nothing here may throw
  else if (device_ >= 0 && cudaSetDevice(device_) != cudaSuccess)
    (void)cudaGetLastError();
}

Context& context(int d) {
  if (d >= 0 && d < kMaxDevices)
    if (Context* c = g_contexts[d].load(std::memory_order_acquire)) return *c;
  const int count = device_count();
  KILN_CHECK(d >= 0 && d < count, "cuda:", d, " does not exist (", count, " CUDA device(s) visible",
             g_no_device_reason.empty() ? "" : ": " + g_no_device_reason, "; `kiln doctor` checks the machine)");
  KILN_CHECK(d < kMaxDevices, "cuda:", d, ": Kiln supports at most ", kMaxDevices, " devices per process");
  std::lock_guard<std::mutex> lk(g_contexts_mutex);
  Context* c = g_contexts[d].load(std::memory_order_relaxed);
  if (!c) {
    {
      const SavedContext keep;  // the Context's set-up makes d current; the caller's goes back
      c = new Context(d);
    }
    g_contexts[d].store(c, std::memory_order_release);
  }
  return *c;
}

Context& current() {
  KILN_ASSERT(t_context, "no CUDA device is current on this thread (call cuda::backend(device) first)");
  return *t_context;
}

DeviceBuffer::DeviceBuffer(size_t bytes) : ctx_(&current()) {
  if (bytes) p_ = ctx_->allocator().allocate(bytes, stream_id(ctx_->stream));
}
void DeviceBuffer::reset() noexcept {
  if (!p_) return;
  try {
    ctx_->allocator().free(p_);
  } catch (...) {
    // Never throws from a destructor; the block stays with the allocator.
  }
  p_ = nullptr;
}

// ---- what the engine calls ---------------------------------------------------------------------

bool compiled() { return true; }

int device_count() {
  static const int n = [] {
    int c = 0;
    const cudaError_t e = cudaGetDeviceCount(&c);
    if (e != cudaSuccess) {
      cudaGetLastError();  // no driver or no device: not an error for a CPU user
      g_no_device_reason = cuda_error(e);
      c = 0;
    }
    return c;
  }();
  return n;
}

namespace {
// Tensor storage from the device's caching allocator. Compute: blocks of the compute stream's pool.
// Upload (the destinations of uploads from page-locked memory, upload_allocator): blocks of the copy
// stream's pool, so the copy into one waits only for earlier copies, never for the compute stream's
// queue; marked as used on the compute stream too, so once freed a block is reused only after the
// compute stream has passed its last reader.
template <bool kUpload> class StreamAllocator final : public Allocator {
 public:
  explicit StreamAllocator(int d) : d_(d) {}
  void* allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    Context& c = context(d_);
    void* p = c.allocator().allocate(nbytes, stream_id(kUpload ? c.copy_stream : c.stream));
    if (kUpload) c.allocator().record_stream(p, stream_id(c.stream));
    return p;
  }
  void deallocate(void* p, size_t) noexcept override {
    if (!p) return;
    try {
      context(d_).allocator().free(p);
    } catch (...) {
      // A destructor never throws; the block stays with the allocator until process exit.
    }
  }

 private:
  int d_;
};
using TensorAllocator = StreamAllocator<false>;
using UploadAllocator = StreamAllocator<true>;

// The engine reads results on the host only after these waits, so this is where errors that
// kernels flagged on the device become exceptions.
void check_error_word(Context& c) {
  int word = 0;
  KILN_CUDA_OK(cudaMemcpyAsync(&word, c.error_word, sizeof(int), cudaMemcpyDeviceToHost, c.stream));
  KILN_CUDA_OK(cudaStreamSynchronize(c.stream));
  if (word != 0) {
    KILN_CUDA_OK(cudaMemsetAsync(c.error_word, 0, sizeof(int), c.stream));
    KILN_FAIL("cuda:", c.device, ": ", kernel_error_text(KernelError(word)),
              " (found by a kernel; the results of that op are undefined)");
  }
}

bool is_pinned(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return a.type == cudaMemoryTypeHost;
}

const Backend& table() {
  static const Backend b = [] {
    Backend t{};
    t.name = "cuda";
    t.gemm = cuda::gemm;
    t.gemm_batched = cuda::gemm_batched;
#define KILN_KERNEL(name, params) t.name = cuda::name;
#include "kernels/kernel_list.h"
#undef KILN_KERNEL
    t.native_16bit_gemm_conv = true;
    t.native_channels_last = true;
    return t;
  }();
  return b;
}
}  // namespace

const Backend& backend(int d) {
  if (t_current != d) context(d);  // validates d, creates the context on first use
  // Other code (a library, `kiln doctor`) may have switched the device since: ask the runtime.
  int cur = -1;
  if (cudaGetDevice(&cur) != cudaSuccess || cur != d) KILN_CUDA_OK(cudaSetDevice(d));
  t_current = d;
  t_context = &context(d);
  return table();
}

Context& use(int d) {
  backend(d);
  return context(d);
}

// Never destroyed, as every process-lifetime piece of the CUDA runtime (device_memory.cu says why).
namespace {
template <typename A> Allocator& per_device(int d) {
  static auto* m = new std::mutex;
  static auto* all = new std::vector<std::unique_ptr<A>>;
  std::lock_guard<std::mutex> lk(*m);
  context(d);
  if (all->size() <= size_t(d)) all->resize(size_t(d) + 1);
  if (!(*all)[size_t(d)]) (*all)[size_t(d)] = std::make_unique<A>(d);
  return *(*all)[size_t(d)];
}
}  // namespace

Allocator& tensor_allocator(int d) { return per_device<TensorAllocator>(d); }

Allocator& upload_allocator(int d, const void* src) {
  return is_pinned(src) ? per_device<UploadAllocator>(d) : per_device<TensorAllocator>(d);
}

namespace {
void release_finished();
}  // namespace

void copy_bytes(void* dst, Device dd, const void* src, Device sd, size_t n) {
  if (n == 0) return;
  if (dd.is_cuda() && sd.is_cpu()) {
    Context& c = use(dd.index);
    KILN_CUDA_OK(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, c.stream));
    // From pageable memory the runtime has staged the data when the call returns; from pinned
    // memory the DMA reads the source later, so wait before the caller may free it.
    if (is_pinned(src)) KILN_CUDA_OK(cudaStreamSynchronize(c.stream));
  } else if (dd.is_cpu() && sd.is_cuda()) {
    Context& c = use(sd.index);
    KILN_CUDA_OK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, c.stream));
    check_error_word(c);  // synchronises the stream
    release_finished();   // so memory lent to Kiln goes back once a read has waited for its work
  } else if (dd.is_cuda() && sd.is_cuda()) {
    Context& cd = use(dd.index);
    if (dd.index == sd.index) {
      KILN_CUDA_OK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, cd.stream));
    } else {
      Context& cs = context(sd.index);
      KILN_CUDA_OK(cudaStreamSynchronize(cs.stream));  // the source is complete
      KILN_CUDA_OK(cudaMemcpyPeerAsync(dst, dd.index, src, sd.index, n, cd.stream));
      KILN_CUDA_OK(cudaStreamSynchronize(cd.stream));  // the source may be freed on its own stream
    }
  } else {
    std::memcpy(dst, src, n);
  }
}

namespace {
// Sources of asynchronous copies, and memory other frameworks lent (release_after_queued_work), held
// until an event after the work that reads them has passed.
struct InFlight {
  cudaEvent_t done;
  std::shared_ptr<void> keep_alive;
};
// Never destroyed: a destroyed list would drop page-locked sources into a destroyed pool at exit
// (the order of namespace-scope destructors across this file is the reverse of definition).
struct InFlightList {
  std::mutex mutex;
  std::vector<InFlight> list;
};
InFlightList& in_flight() {
  static auto* l = new InFlightList;
  return *l;
}

// Moves the holds whose event has passed into `done`, for the caller to drop after unlocking: a hold's
// release may take other locks (the pinned pool's; a lender's, the Python GIL).
void take_finished_locked(std::vector<std::shared_ptr<void>>& done) {
  std::erase_if(in_flight().list, [&done](InFlight& f) {
    const cudaError_t e = cudaEventQuery(f.done);
    if (e == cudaErrorNotReady) (void)cudaGetLastError();  // not yet: no last error left (query_done says why)
    if (e != cudaSuccess) return false;                    // not yet, or an error the next sync reports
    cudaEventDestroy(f.done);
    done.push_back(std::move(f.keep_alive));
    return true;
  });
}
void release_finished() {
  std::vector<std::shared_ptr<void>> done;
  std::lock_guard<std::mutex> lk(in_flight().mutex);
  take_finished_locked(done);
}

// Holds keep_alive until `ev` (recorded after the work that reads what it holds) has passed; the holds
// that have passed go, outside the lock.
void hold_until(cudaEvent_t ev, std::shared_ptr<void> keep_alive) {
  std::vector<std::shared_ptr<void>> done;  // dropped after the lock
  std::lock_guard<std::mutex> lk(in_flight().mutex);
  take_finished_locked(done);
  in_flight().list.push_back({ev, std::move(keep_alive)});
}

// A DLPack stream number as a stream: 1 and 2 are the legacy and per-thread default streams.
cudaStream_t dlpack_stream(uintptr_t s) {
  return s == 1 ? cudaStreamLegacy : s == 2 ? cudaStreamPerThread : reinterpret_cast<cudaStream_t>(s);
}
}  // namespace

void copy_to_device_async(void* dst, int device, const void* src, size_t n, std::shared_ptr<void> keep_alive) {
  if (n == 0) return;
  Context& c = use(device);
  if (!is_pinned(src)) {  // staged by the runtime before the call returns: in order on the compute stream
    KILN_CUDA_OK(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, c.stream));
    return;
  }
  // On the copy stream, so the DMA runs beside the kernels already queued; work queued on the
  // compute stream from now on waits for it. dst came from upload_allocator (the copy stream's pool).
  KILN_CUDA_OK(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, c.copy_stream));
  cudaEvent_t ev = nullptr;
  try {
    KILN_CUDA_OK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    KILN_CUDA_OK(cudaEventRecord(ev, c.copy_stream));
    KILN_CUDA_OK(cudaStreamWaitEvent(c.stream, ev, 0));
  } catch (...) {
    // The copy is queued and reads src, which keep_alive is about to let go, and the compute stream is not
    // ordered after it: let it finish before the error goes up (an out-of-memory error here is one the
    // micro-batch retry catches and carries on from).
    (void)cudaStreamSynchronize(c.copy_stream);
    (void)cudaGetLastError();
    if (ev) cudaEventDestroy(ev);
    throw;
  }
  hold_until(ev, std::move(keep_alive));
}

DeviceScope::DeviceScope(int device) : prev_kiln_device_(t_current), prev_kiln_context_(t_context) { use(device); }

DeviceScope::~DeviceScope() {
  t_current = prev_kiln_device_;
  t_context = static_cast<Context*>(prev_kiln_context_);
}

void hand_to_stream(int device, void* block, uintptr_t stream) {
  KILN_CHECK(
      stream != 2,
      "DLPack: the per-thread default stream (2) is not supported (it is a different stream on "
      "each thread, so Kiln cannot keep its memory from reuse while that stream reads it); pass a stream handle");
  DeviceScope scope(device);
  Context& c = context(device);
  const cudaStream_t s = dlpack_stream(stream);
  if (s != c.stream) {
    cudaEvent_t ev;
    KILN_CUDA_OK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    cudaError_t e = cudaEventRecord(ev, c.stream);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(s, ev, 0);
    cudaEventDestroy(ev);  // the wait is queued: the event may go
    KILN_CUDA_OK(e);
  }
  if (block) c.allocator().record_stream(block, stream_id(s));
}

void release_after_queued_work(int device, std::shared_ptr<void> keep_alive) noexcept {
  try {
    DeviceScope scope(device);
    Context& c = context(device);
    cudaEvent_t ev;
    KILN_CUDA_OK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    if (const cudaError_t e = cudaEventRecord(ev, c.stream); e != cudaSuccess) {
      cudaEventDestroy(ev);
      KILN_CUDA_OK(e);
    }
    hold_until(ev, std::move(keep_alive));
  } catch (...) {
    // No event (a device error, or the runtime shutting down): wait for the stream, as far as it still runs.
    try {
      cudaStreamSynchronize(context(device).stream);
    } catch (...) {
    }
    keep_alive.reset();  // the stream has run, as far as it still runs
  }
}

namespace {
// Page-locked blocks are kept for reuse: cudaFreeHost waits for the whole device, which would stall
// every step, and a loader asks for the same sizes again and again.
// Never destroyed (a pinned batch may be released by another static's destructor at exit).
struct PinnedPool {
  std::mutex mutex;
  std::multimap<size_t, void*> free;
};
PinnedPool& pinned_pool() {
  static auto* p = new PinnedPool;
  return *p;
}

// Runs f with the first device that has a Kiln context current (a rank's own GPU), where one has: pinned
// memory is allocated and freed on loader threads, whose current device is 0 until they choose one, and
// cudaHostAlloc there would start a context on GPU 0 in every rank's process (the pool's blocks are
// portable: any device's context may own them). Where no device has a context yet, the thread's own.
template <typename F> auto on_home_device(F&& f) {
  for (int d = 0; d < kMaxDevices; ++d)
    if (g_contexts[d].load(std::memory_order_acquire)) {
      const DeviceScope scope(d);
      return f();
    }
  return f();
}

void* pinned_take(size_t n) {
  PinnedPool& pool = pinned_pool();
  {
    std::lock_guard<std::mutex> lk(pool.mutex);
    auto it = pool.free.find(n);
    if (it != pool.free.end()) {
      void* p = it->second;
      pool.free.erase(it);
      return p;
    }
  }
  try {
    return on_home_device([&] { return pinned_alloc(n); });
  } catch (const OutOfMemory&) {
    // The pool keeps blocks of the sizes asked before (a larger micro-batch's, after a shrink): give
    // them back and try once more before calling host memory full.
    std::multimap<size_t, void*> kept;
    {
      std::lock_guard<std::mutex> lk(pool.mutex);
      kept.swap(pool.free);
    }
    if (kept.empty()) throw;
    return on_home_device([&] {
      for (auto& [size, p] : kept) pinned_free(p);
      return pinned_alloc(n);
    });
  }
}
void pinned_give_back(void* p, size_t n) {
  PinnedPool& pool = pinned_pool();
  std::lock_guard<std::mutex> lk(pool.mutex);
  pool.free.emplace(n, p);
}
}  // namespace

namespace {
class PinnedAllocator final : public Allocator {
 public:
  void* allocate(size_t n) override { return pinned_take(n); }
  void deallocate(void* p, size_t n) noexcept override { pinned_give_back(p, n); }
};
}  // namespace

Allocator& pinned_allocator() {
  static auto* a = new PinnedAllocator;  // never destroyed: storages may outlive every static
  return *a;
}

void synchronize(int d) {
  check_error_word(use(d));
  release_finished();
}

void* compute_stream(int d) { return context(d).stream; }

size_t free_bytes(int d) {
  const DeviceScope scope(d);
  size_t free = 0, total = 0;
  KILN_CUDA_OK(cudaMemGetInfo(&free, &total));
  return free;
}
void* copy_stream(int d) { return context(d).copy_stream; }

void set_deterministic(bool on) { g_deterministic = on; }
bool deterministic() { return g_deterministic; }
void set_allow_tf32(bool on) { g_tf32 = on; }
bool allow_tf32() { return g_tf32; }

}  // namespace kiln::cuda
