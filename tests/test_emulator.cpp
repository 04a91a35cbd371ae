// The CUDA emulator itself (kernels/cuda/emulator): that its barriers, shuffles and votes do what
// CUDA defines, that the threads of a block share __shared__ memory and nothing else, and that
// what a GPU would hang on or compute wrongly (a barrier not every thread reaches, a shuffle that
// names an exited lane or one outside its mask, a launch CUDA refuses) is an error here, naming the
// kernel. The kernels below are compiled the way kernels/cuda's are in the emulated build.
#include <doctest/doctest.h>

#include <numeric>
#include <string>
#include <vector>

#include "base/error.h"
#define KILN_CUDA_EMULATION 1
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/emulator/cuda_runtime_emulated.h"
#include "kernels/cuda/emulator/emulator.h"

using kiln::emu::run;

namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const kiln::Error& e) {
    return e.what();
  }
  return "";
}

// Block sum through shared memory and a tree of barriers, then a warp-shuffle sum: thread 0 of each
// block writes both.
__global__ void sums(const int* x, int* tree, int* shuffled) {
  __shared__ int s[256];
  const unsigned t = threadIdx.x;
  s[t] = x[blockIdx.x * blockDim.x + t];
  __syncthreads();
  for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
    if (t < half) s[t] += s[t + half];
    __syncthreads();
  }
  int v = x[blockIdx.x * blockDim.x + t];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __shared__ int warps[8];
  if (t % 32 == 0) warps[t / 32] = v;
  __syncthreads();
  if (t == 0) {
    tree[blockIdx.x] = s[0];
    int w = 0;
    for (unsigned i = 0; i < blockDim.x / 32; ++i) w += warps[i];
    shuffled[blockIdx.x] = w;
  }
}

}  // namespace

TEST_CASE("emulator: barriers and shuffles sum a block; __shared__ is per block") {
  std::vector<int> x(4 * 256);
  std::iota(x.begin(), x.end(), 1);
  std::vector<int> tree(4), shuffled(4);
  for (kiln::emu::Order o : {kiln::emu::Order::forward, kiln::emu::Order::reverse}) {
    kiln::emu::set_order(o);
    run("sums", dim3(4), dim3(256), 0, [&] { sums(x.data(), tree.data(), shuffled.data()); });
    for (int b = 0; b < 4; ++b) {
      const int want = std::accumulate(x.begin() + b * 256, x.begin() + (b + 1) * 256, 0);
      CHECK(tree[b] == want);
      CHECK(shuffled[b] == want);
    }
  }
  kiln::emu::set_order(kiln::emu::Order::forward);
  CHECK(kiln::emu::kernel_runs().at("sums").launches == 2);
}

TEST_CASE("emulator: shuffle, vote and barrier-reduction semantics follow CUDA's definitions") {
  std::vector<int> idx(64), up(64), down(64), x4(64), ballot(64), any(64), all(64), orv(64), cnt(64), andv(64);
  run("semantics", dim3(1), dim3(64), 0, [&] {
    const int t = int(threadIdx.x), lane = t % 32;
    idx[t] = __shfl_sync(0xffffffffu, t, 5);               // lane 5 of the own warp
    up[t] = __shfl_up_sync(0xffffffffu, t, 3);             // lane - 3, own value below 3
    down[t] = __shfl_down_sync(0xffffffffu, t, 2, 16);     // lane + 2 within 16-lane segments
    x4[t] = __shfl_xor_sync(0xffffffffu, t, 4, 8);         // lane ^ 4 within 8-lane segments
    ballot[t] = int(__ballot_sync(0xffffffffu, lane % 3 == 0));
    any[t] = __any_sync(0xffffffffu, t == 40);
    all[t] = __all_sync(0xffffffffu, lane < 31);
    orv[t] = __syncthreads_or(t == 63);
    cnt[t] = __syncthreads_count(t % 2);
    andv[t] = __syncthreads_and(t < 64);
  });
  for (int t = 0; t < 64; ++t) {
    const int lane = t % 32, warp0 = t - lane;
    CHECK(idx[t] == warp0 + 5);
    CHECK(up[t] == (lane >= 3 ? t - 3 : t));
    CHECK(down[t] == (lane % 16 + 2 < 16 ? t + 2 : t));
    CHECK(x4[t] == (t ^ 4));
    unsigned b = 0;
    for (int k = 0; k < 32; k += 3) b |= 1u << k;
    CHECK(unsigned(ballot[t]) == b);
    CHECK(any[t] == (t >= 32 ? 1 : 0));
    CHECK(all[t] == 0);
    CHECK(orv[t] == 1);
    CHECK(cnt[t] == 32);
    CHECK(andv[t] == 1);
  }
}

TEST_CASE("emulator: what would hang or misbehave on a GPU is an error naming the kernel") {
  // A barrier inside a branch that half of the block skips (it waits in a second barrier instead).
  const std::string divergent = error_of([] {
    run("divergent", dim3(2), dim3(64), 0, [] {
      if (threadIdx.x < 32) __syncthreads();
      __syncwarp();
      __syncthreads();
    });
  });
  CHECK_MESSAGE(divergent.find("divergent, block (0, 0, 0): threads wait at different __syncthreads calls") !=
                    std::string::npos,
                divergent);
  // A shuffle whose source lane has already returned.
  const std::string exited = error_of([] {
    run("exited", dim3(1), dim3(32), 0, [] {
      if (threadIdx.x == 7) return;
      (void)__shfl_xor_sync(0xffffffffu, 1.0f, 1);
    });
  });
  CHECK_MESSAGE(exited.find("exited") != std::string::npos, exited);
  CHECK_MESSAGE(exited.find("which has exited") != std::string::npos, exited);
  // A lane reading another outside the mask.
  const std::string unmasked = error_of([] {
    run("unmasked", dim3(1), dim3(32), 0, [] {
      if (threadIdx.x < 16) (void)__shfl_sync(0x0000ffffu, int(threadIdx.x), 20);
    });
  });
  CHECK_MESSAGE(unmasked.find("not in the mask") != std::string::npos, unmasked);
  // A mask that leaves out the calling lane.
  const std::string own = error_of([] {
    run("own_lane", dim3(1), dim3(32), 0, [] { (void)__shfl_sync(0x1u, 1, 0); });
  });
  CHECK_MESSAGE(own.find("does not name its own lane") != std::string::npos, own);
  // Threads of one block at different barrier kinds.
  const std::string mixed = error_of([] {
    run("mixed", dim3(1), dim3(64), 0, [] {
      if (threadIdx.x < 32) __syncthreads();
      else (void)__syncthreads_or(1);
    });
  });
  CHECK_MESSAGE(mixed.find("__syncthreads and __syncthreads_or") != std::string::npos, mixed);
}

TEST_CASE("emulator: a launch CUDA refuses runs nothing and leaves cudaErrorInvalidConfiguration") {
  int ran = 0;
  (void)cudaGetLastError();
  for (const auto& [grid, block] : std::vector<std::pair<dim3, dim3>>{{dim3(1, 65536), dim3(32)},
                                                                       {dim3(1, 1, 65536), dim3(32)},
                                                                       {dim3(1), dim3(1025)},
                                                                       {dim3(1), dim3(32, 2, 65)},
                                                                       {dim3(0), dim3(32)}}) {
    run("refused", grid, block, 0, [&] { ++ran; });
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
    CHECK(cudaGetLastError() == cudaSuccess);  // read once
  }
  run("too_much_shared", dim3(1), dim3(32), 48 * 1024 + 1, [&] { ++ran; });
  CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
  CHECK(ran == 0);
  // The largest legal grid in y: 65535 blocks of one thread each.
  run("tall", dim3(1, 65535), dim3(1), 0, [&] { ++ran; });
  CHECK(cudaGetLastError() == cudaSuccess);
  CHECK(ran == 65535);
}

TEST_CASE("emulator: device built-ins outside a kernel are an error") {
  CHECK(error_of([] { __syncthreads(); }).find("called outside a kernel") != std::string::npos);
}

// A device out of memory is OutOfMemory (what `kiln train --micro-batch` shrinks on), any other CUDA
// error a plain Error; both name the call and the runtime's message.
TEST_CASE("emulator: KILN_CUDA_OK throws OutOfMemory for cudaErrorMemoryAllocation, Error otherwise") {
  auto fails = [](cudaError_t e) { KILN_CUDA_OK(e); };
  CHECK_NOTHROW(fails(cudaSuccess));
  CHECK_THROWS_AS(fails(cudaErrorMemoryAllocation), kiln::OutOfMemory);
  CHECK(error_of([&] { fails(cudaErrorMemoryAllocation); }).find("cudaErrorMemoryAllocation") != std::string::npos);
  try {
    fails(cudaErrorInvalidValue);
    FAIL("no error thrown");
  } catch (const kiln::Error& e) {
    CHECK(dynamic_cast<const kiln::OutOfMemory*>(&e) == nullptr);
    CHECK(std::string(e.what()).find("cudaErrorInvalidValue") != std::string::npos);
  }
}

// The runtime keeps a non-sticky error (out of memory, an event not yet done) as the thread's last error
// too; left there, the next launch check reads it and fails an innocent kernel. A refused launch stands in
// for that leftover here (the emulator records only launches' errors).
TEST_CASE("emulator: an out-of-memory throw and a not-ready query leave no last error behind") {
  auto leftover = [] { kiln::emu::run("refused", dim3(1), dim3(1025), 0, [] {}); };
  leftover();
  CHECK_THROWS_AS(KILN_CUDA_OK(cudaErrorMemoryAllocation), kiln::OutOfMemory);
  CHECK(cudaGetLastError() == cudaSuccess);
  leftover();
  CHECK_FALSE(kiln::cuda::query_done(cudaErrorNotReady, "cudaEventQuery"));
  CHECK(cudaGetLastError() == cudaSuccess);
  CHECK(kiln::cuda::query_done(cudaSuccess, "cudaEventQuery"));
  CHECK(error_of([] {
          kiln::cuda::query_done(cudaErrorLaunchFailure, "cudaEventQuery");
        }).find("cudaEventQuery failed: cudaErrorLaunchFailure") != std::string::npos);
}
