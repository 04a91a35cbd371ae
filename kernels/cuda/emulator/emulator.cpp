// The CUDA emulator's grid runner: every thread of a block is a fiber with a stack of its own;
// the block runs until each thread has finished or waits at a barrier, a shuffle or a vote,
// then the groups whose members have all arrived are released together and the block runs again.
// Blocks run one after another on the calling thread. What CUDA leaves undefined and a real GPU
// would hang on or silently get wrong (a barrier some threads never reach, a shuffle naming a lane
// that exited or is not in the mask, disagreeing masks) is an error naming the kernel and block.
#include "kernels/cuda/emulator/emulator.h"

#include "kernels/cuda/emulator/cuda_runtime_emulated.h"



#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <vector>

#include "base/error.h"

#if defined(__SANITIZE_ADDRESS__)
#define KILN_EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KILN_EMU_ASAN 1
#endif
#endif
#ifdef KILN_EMU_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif
// The hand-written switch below: x86-64 ELF without CET shadow stacks (a `ret` into another fiber's
// stack would fault where the kernel enforces them; glibc's swapcontext handles that case).
#if defined(__x86_64__) && defined(__ELF__) && !(defined(__CET__) && (__CET__ & 2))
#define KILN_EMU_ASM_SWITCH 1
#else
#include <ucontext.h>
#endif

// Fiber switch. swapcontext also saves and restores the signal mask, a system call each way: most
// of the emulator's time. On x86-64 the switch is this instead: the callee-saved registers, the SSE
// and x87 control words and the stack pointer (System V ABI), a few nanoseconds.
#ifdef KILN_EMU_ASM_SWITCH
extern "C" void kiln_emu_switch(void** save_sp, void* load_sp);
asm(R"(
  .text
  .globl kiln_emu_switch
  .type kiln_emu_switch, @function
kiln_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size kiln_emu_switch, .-kiln_emu_switch
  .section .note.GNU-stack,"",@progbits
  .text
)");
#endif

namespace kiln::emu {
namespace {

// Big enough for the kernels' locals under -O0 and AddressSanitizer; only touched pages are used.
constexpr size_t kStackBytes = 256 * 1024;

enum class State : uint8_t { ready, waiting, done };

// A fiber's stack from mmap, with an inaccessible page below it: a kernel that overflows its stack
// faults there instead of writing over the heap (another fiber's stack, say).
class FiberStack {
 public:
  FiberStack() = default;
  FiberStack(FiberStack&& o) noexcept : base_(o.base_) { o.base_ = nullptr; }
  FiberStack& operator=(FiberStack&& o) noexcept {
    std::swap(base_, o.base_);
    return *this;
  }
  ~FiberStack() {
    if (base_) munmap(base_, kStackBytes + guard());
  }
  char* get() {
    if (!base_) {
      void* p = mmap(nullptr, kStackBytes + guard(), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      KILN_CHECK(p != MAP_FAILED, "cuda emulator: no memory for a ", kStackBytes, "-byte fiber stack");
      KILN_CHECK(mprotect(p, guard(), PROT_NONE) == 0, "cuda emulator: mprotect of a stack guard page failed");
      base_ = static_cast<char*>(p);
    }
    return base_ + guard();
  }

 private:
  static size_t guard() { return size_t(sysconf(_SC_PAGESIZE)); }
  char* base_ = nullptr;
};

struct Context {
#ifdef KILN_EMU_ASM_SWITCH
  void* sp = nullptr;
#else
  ucontext_t uc{};
#endif
};

struct Thread {
  Context ctx;
  FiberStack stack;
  State state = State::ready;
  uint3 idx{0, 0, 0};
  // What it waits for (valid while waiting) and what it gets back.
  Sync op = Sync::block;
  unsigned mask = 0;
  uint64_t value = 0;
  int param = 0, width = 32;
  const char* file = "";
  unsigned line = 0;
  uint64_t result = 0;
};

struct Launch {
  const char* name = "";
  const std::function<void()>* body = nullptr;
  std::vector<Thread>* threads = nullptr;
  size_t n = 0;  // threads per block
  Thread* current = nullptr;
  Context scheduler;
  std::exception_ptr error;
#ifdef KILN_EMU_ASAN
  const void* sched_stack = nullptr;
  size_t sched_stack_size = 0;
#endif
};

thread_local Launch* g_launch = nullptr;
thread_local cudaError_t g_last_error = cudaSuccess;
thread_local Order g_order = Order::forward;

std::mutex g_stats_mutex;
std::map<std::string, KernelRuns>& stats() {
  static auto* m = new std::map<std::string, KernelRuns>;  // never destroyed: read at exit by tests
  return *m;
}

bool is_block_op(Sync op) {
  return op == Sync::block || op == Sync::block_or || op == Sync::block_and || op == Sync::block_count;
}

const char* op_name(Sync op) {
  switch (op) {
    case Sync::block: return "__syncthreads";
    case Sync::block_or: return "__syncthreads_or";
    case Sync::block_and: return "__syncthreads_and";
    case Sync::block_count: return "__syncthreads_count";
    case Sync::warp: return "__syncwarp";
    case Sync::shfl: return "__shfl_sync";
    case Sync::shfl_up: return "__shfl_up_sync";
    case Sync::shfl_down: return "__shfl_down_sync";
    case Sync::shfl_xor: return "__shfl_xor_sync";
    case Sync::ballot: return "__ballot_sync";
    case Sync::any: return "__any_sync";
    case Sync::all: return "__all_sync";
  }
  return "?";
}

void thread_main();

void switch_to(Context& save, Context& load) {
#ifdef KILN_EMU_ASM_SWITCH
  kiln_emu_switch(&save.sp, load.sp);
#else
  swapcontext(&save.uc, &load.uc);
#endif
}

// A fresh fiber on `stack` that starts in thread_main.
void make_fiber(Context& c, char* stack, size_t bytes) {
#ifdef KILN_EMU_ASAN
  // The stack is reused from the last block: frames that never returned (thread_main, a fiber
  // abandoned after an error) left their redzones poisoned.
  __asan_unpoison_memory_region(stack, bytes);
#endif
#ifdef KILN_EMU_ASM_SWITCH
  // What kiln_emu_switch pops, from the bottom: the control words (MXCSR 0x1f80, x87 0x037f: the
  // defaults), r15, r14, r13, r12, rbx, rbp, then thread_main as the return address, above it a null
  // "return address" of thread_main (which never returns) so that its entry sees the ABI alignment.
  uintptr_t top = (reinterpret_cast<uintptr_t>(stack) + bytes) & ~uintptr_t(15);
  auto* p = reinterpret_cast<uint64_t*>(top);
  *--p = 0;
  *--p = reinterpret_cast<uint64_t>(&thread_main);
  for (int i = 0; i < 6; ++i) *--p = 0;
  *--p = 0x1f80ull | (0x037full << 32);
  c.sp = p;
#else
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = stack;
  c.uc.uc_stack.ss_size = bytes;
  c.uc.uc_link = nullptr;
  makecontext(&c.uc, thread_main, 0);
#endif
}

// Fiber switches, told to AddressSanitizer so that it follows the stacks.
void enter(Launch& l, Thread& t) {
#ifdef KILN_EMU_ASAN
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(&fake, t.stack.get(), kStackBytes);
  switch_to(l.scheduler, t.ctx);
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#else
  switch_to(l.scheduler, t.ctx);
#endif
}

void leave(Launch& l, Thread& t, bool finished) {
#ifdef KILN_EMU_ASAN
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(finished ? nullptr : &fake, l.sched_stack, l.sched_stack_size);
  switch_to(t.ctx, l.scheduler);
  __sanitizer_finish_switch_fiber(fake, &l.sched_stack, &l.sched_stack_size);
#else
  (void)finished;
  switch_to(t.ctx, l.scheduler);
#endif
}

void thread_main() {
  Launch& l = *g_launch;
  Thread& t = *l.current;
#ifdef KILN_EMU_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &l.sched_stack, &l.sched_stack_size);
#endif
  try {
    (*l.body)();
  } catch (...) {
    if (!l.error) l.error = std::current_exception();
  }
  t.state = State::done;
  leave(l, t, true);
}

std::string block_text(const Launch& l) {
  std::ostringstream s;
  s << l.name << ", block (" << blockIdx.x << ", " << blockIdx.y << ", " << blockIdx.z << ")";
  return s.str();
}

// Source lane of a shuffle, as CUDA defines it for width-wide segments of the warp.
unsigned source_lane(Sync op, unsigned lane, int param, int width) {
  const unsigned w = unsigned(width), base = lane / w * w;
  switch (op) {
    case Sync::shfl: return base + unsigned(param) % w;
    case Sync::shfl_up: return lane >= base + unsigned(param) ? lane - unsigned(param) : lane;
    case Sync::shfl_down: return lane + unsigned(param) < base + w ? lane + unsigned(param) : lane;
    case Sync::shfl_xor: {
      const unsigned src = lane ^ unsigned(param);
      return src < base + w ? src : lane;
    }
    default: return lane;
  }
}

// Releases the lanes of warp `w` that wait on a warp-level op once every lane of their mask does.
bool release_warp(Launch& l, size_t w) {
  std::vector<Thread>& ts = *l.threads;
  const size_t first = w * 32, last = std::min(l.n, first + 32);
  bool released = false;
  for (size_t i = first; i < last; ++i) {
    Thread& t = ts[i];
    if (t.state != State::waiting || is_block_op(t.op)) continue;
    const unsigned lane = unsigned(i - first), mask = t.mask;
    KILN_CHECK(mask >> lane & 1u, "cuda emulator: ", block_text(l), ": thread ", i, " calls ", op_name(t.op),
               " with mask ", std::hex, mask, " that does not name its own lane ", std::dec, lane);
    KILN_CHECK(t.width > 0 && t.width <= 32 && (t.width & (t.width - 1)) == 0, "cuda emulator: ", block_text(l), ": ",
               op_name(t.op), " width ", t.width, " is not a power of two up to 32");
    bool all = true;
    for (unsigned k = 0; k < 32; ++k) {
      if (!(mask >> k & 1u)) continue;
      KILN_CHECK(first + k < l.n, "cuda emulator: ", block_text(l), ": ", op_name(t.op), " mask ", std::hex, mask,
                 std::dec, " names lane ", k, " of warp ", w, ", which the block (", l.n, " threads) does not have");
      const Thread& o = ts[first + k];
      KILN_CHECK(o.state != State::done, "cuda emulator: ", block_text(l), ": thread ", i, " waits in ", op_name(t.op),
                 " for lane ", k, ", which has exited");
      if (o.state != State::waiting || is_block_op(o.op)) {
        all = false;
        continue;
      }
      KILN_CHECK(o.op == t.op && o.mask == mask && o.width == t.width, "cuda emulator: ", block_text(l), ": lanes ",
                 lane, " and ", k,
                 " of warp ", w, " meet at different warp ops (", op_name(t.op), " mask ", std::hex, mask, ", ",
                 op_name(o.op), " mask ", o.mask, std::dec, ")");
    }
    if (!all) continue;
    // The whole group has arrived: every member's result from the values as they stand.
    uint64_t votes = 0;
    for (unsigned k = 0; k < 32; ++k)
      if (mask >> k & 1u && ts[first + k].value != 0) votes |= 1ull << k;
    for (unsigned k = 0; k < 32; ++k) {
      if (!(mask >> k & 1u)) continue;
      Thread& m = ts[first + k];
      switch (m.op) {
        case Sync::ballot: m.result = votes; break;
        case Sync::any: m.result = votes != 0; break;
        case Sync::all: m.result = votes == mask; break;
        case Sync::warp: m.result = 0; break;
        default: {
          const unsigned src = source_lane(m.op, k, m.param, m.width);
          KILN_CHECK(mask >> src & 1u, "cuda emulator: ", block_text(l), ": lane ", k, " of warp ", w, " reads lane ",
                     src, " in ", op_name(m.op), ", which is not in the mask ", std::hex, mask);
          m.result = ts[first + src].value;
        }
      }
    }
    for (unsigned k = 0; k < 32; ++k)
      if (mask >> k & 1u) ts[first + k].state = State::ready;
    released = true;
  }
  return released;
}

// Releases the block barrier once every thread that has not exited waits at it.
bool release_block(Launch& l) {
  std::vector<Thread>& ts = *l.threads;
  const Thread* first_waiting = nullptr;
  uint64_t count = 0, any = 0;
  for (size_t i = 0; i < l.n; ++i) {
    const Thread& t = ts[i];
    if (t.state == State::done) continue;
    if (t.state != State::waiting || !is_block_op(t.op)) return false;
    if (!first_waiting) first_waiting = &t;
    KILN_CHECK(t.op == first_waiting->op, "cuda emulator: ", block_text(l), ": threads meet at ",
               op_name(first_waiting->op), " and ", op_name(t.op), " at once");
    KILN_CHECK(t.line == first_waiting->line && std::strcmp(t.file, first_waiting->file) == 0,
               "cuda emulator: ", block_text(l), ": threads wait at different ", op_name(t.op), " calls (",
               first_waiting->file, ":", first_waiting->line, " and ", t.file, ":", t.line,
               "): a barrier in a branch that not every thread takes");
    count += t.value != 0;
    any = 1;
  }
  if (!any) return false;
  size_t waiting = 0;
  for (size_t i = 0; i < l.n; ++i) waiting += ts[i].state == State::waiting;
  for (size_t i = 0; i < l.n; ++i) {
    Thread& t = ts[i];
    if (t.state != State::waiting) continue;
    switch (t.op) {
      case Sync::block_or: t.result = count != 0; break;
      case Sync::block_and: t.result = count == waiting; break;
      case Sync::block_count: t.result = count; break;
      default: t.result = 0;
    }
    t.state = State::ready;
  }
  return true;
}

std::string describe_waits(const Launch& l) {
  std::ostringstream s;
  const std::vector<Thread>& ts = *l.threads;
  size_t shown = 0;
  for (size_t i = 0; i < l.n && shown < 4; ++i) {
    if (ts[i].state != State::waiting) continue;
    s << (shown ? ", " : "") << "thread " << i << " in " << op_name(ts[i].op);
    ++shown;
  }
  size_t done = 0;
  for (size_t i = 0; i < l.n; ++i) done += ts[i].state == State::done;
  s << "; " << done << " of " << l.n << " threads have exited";
  return s.str();
}

void run_block(Launch& l) {
  std::vector<Thread>& ts = *l.threads;
  for (size_t i = 0; i < l.n; ++i) {
    Thread& t = ts[i];
    make_fiber(t.ctx, t.stack.get(), kStackBytes);
    t.state = State::ready;
    t.idx = uint3{unsigned(i % blockDim.x), unsigned(i / blockDim.x % blockDim.y),
                  unsigned(i / (size_t(blockDim.x) * blockDim.y))};
  }
  for (;;) {
    bool ran = false;
    for (size_t k = 0; k < l.n; ++k) {
      Thread& t = ts[g_order == Order::forward ? k : l.n - 1 - k];
      if (t.state != State::ready) continue;
      l.current = &t;
      threadIdx = t.idx;
      enter(l, t);
      ran = true;
      if (l.error) std::rethrow_exception(l.error);
    }
    bool released = false;
    for (size_t w = 0; w * 32 < l.n; ++w) released = release_warp(l, w) || released;
    released = release_block(l) || released;
    bool finished = true;
    for (size_t i = 0; i < l.n && finished; ++i) finished = ts[i].state == State::done;
    if (finished) return;
    KILN_CHECK(ran || released, "cuda emulator: ", block_text(l), ": the threads wait for each other for ever (",
               describe_waits(l), ")");
  }
}

}  // namespace

uint64_t arrive(Sync op, unsigned mask, uint64_t value, int param, int width, const std::source_location& where) {
  Launch* l = g_launch;
  KILN_CHECK(l && l->current, "cuda emulator: ", op_name(op), " called outside a kernel");
  Thread& t = *l->current;
  t.op = op;
  t.mask = mask;
  t.value = value;
  t.param = param;
  t.width = width;
  t.file = where.file_name();
  t.line = where.line();
  t.state = State::waiting;
  leave(*l, t, false);
  return t.result;
}

void run(const char* name, dim3 grid, dim3 block, size_t shared_bytes, const std::function<void()>& body) {
  const uint64_t threads = uint64_t(block.x) * block.y * block.z;
  if (threads == 0 || threads > 1024 || block.x > 1024 || block.y > 1024 || block.z > 64 || grid.x == 0 ||
      grid.y == 0 || grid.z == 0 || grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535 ||
      shared_bytes > 48 * 1024) {
    g_last_error = cudaErrorInvalidConfiguration;
    return;
  }
  KILN_CHECK(!g_launch, "cuda emulator: ", name, " launched from inside kernel ", g_launch->name);
  thread_local std::vector<Thread> pool;
  if (pool.size() < threads) pool.resize(threads);
  Launch l;
  l.name = name;
  l.body = &body;
  l.threads = &pool;
  l.n = size_t(threads);
  struct Reset {
    dim3 bd, gd;
    ~Reset() {
      g_launch = nullptr;
      blockDim = bd;
      gridDim = gd;
    }
  } reset{blockDim, gridDim};
  g_launch = &l;
  blockDim = block;
  gridDim = grid;
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        blockIdx = uint3{x, y, z};
        run_block(l);
      }
  std::lock_guard<std::mutex> lk(g_stats_mutex);
  KernelRuns& s = stats()[name];
  ++s.launches;
  s.threads += threads * grid.x * grid.y * grid.z;
}

void set_order(Order o) { g_order = o; }
Order order() { return g_order; }

std::map<std::string, KernelRuns> kernel_runs() {
  std::lock_guard<std::mutex> lk(g_stats_mutex);
  return stats();
}

}  // namespace kiln::emu

const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
  }
  return "cudaErrorUnknown";
}

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
  }
  return "unknown error";
}

cudaError_t cudaGetLastError() {
  const cudaError_t e = kiln::emu::g_last_error;
  kiln::emu::g_last_error = cudaSuccess;
  return e;
}
