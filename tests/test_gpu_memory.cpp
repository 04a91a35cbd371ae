// GPU test (ctest label gpu): the caching allocator on a real device — reuse of a freed block,
// deferred reuse across streams, statistics, the out-of-memory message — and pinned host memory.
// Skipped (exit 77) with no device.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>

#include "kernels/cuda/device_memory.h"
#include "kernels/cuda/runtime_info.h"
#include "test_util.h"

TEST_CASE("gpu: the device caching allocator reuses, defers across streams, counts, and reports out of memory") {
  const kiln::cuda::RuntimeInfo info = kiln::cuda::query_runtime();
  if (!info.compiled || info.device_count == 0) {
    std::printf("skipped: %s\n", info.error.empty() ? "no CUDA device visible" : info.error.c_str());
    std::exit(77);
  }
  kiln::CachingAllocator& a = kiln::cuda::device_allocator(0);
  a.release_cached();
  a.reset_peaks();
  const auto before = a.stats();
  void* p = a.allocate(3 << 20, 0);
  a.free(p);
  CHECK(a.allocate(3 << 20, 0) == p);
  CHECK(a.stats().cache_hits == before.cache_hits + 1);
  a.free(p);
  // A request larger than the whole device: a clear error naming the device and what is free.
  const std::string msg = kiln::testing::error_of([&] { a.allocate(info.devices[0].total_bytes * 2, 0); });
  CHECK_MESSAGE(kiln::testing::contains(msg, "cuda:0: out of memory allocating"), msg);
  CHECK_MESSAGE(kiln::testing::contains(msg, "free on the device"), msg);
  // And the allocator still works afterwards.
  void* q = a.allocate(1 << 20, 0);
  CHECK(q != nullptr);
  a.free(q);
  void* h = kiln::cuda::pinned_alloc(1 << 20);
  CHECK(h != nullptr);
  kiln::cuda::pinned_free(h);
}

#if defined(KILN_TEST_WITH_CUDA)
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "engine/ops.h"
#include "engine/tensor.h"
#include "kernels/cuda/cuda_backend.h"

namespace {
// Holds a stream: a host function queued on it that returns once `release` is set (or after 30 s,
// so a failing test cannot hang the run).
void hold(void* stream, std::atomic<bool>* release) {
  REQUIRE(cudaLaunchHostFunc(
              static_cast<cudaStream_t>(stream),
              [](void* f) {
                const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
                while (!static_cast<std::atomic<bool>*>(f)->load() && std::chrono::steady_clock::now() < until)
                  std::this_thread::sleep_for(std::chrono::milliseconds(1));
              },
              release) == cudaSuccess);
}
// Whether everything queued on `stream` completes within `seconds`.
bool drains(void* stream, double seconds) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < until) {
    if (cudaStreamQuery(static_cast<cudaStream_t>(stream)) == cudaSuccess) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
}
}  // namespace

TEST_CASE("gpu: an upload from pinned memory runs beside the queued kernels, and its block waits for them") {
  const kiln::cuda::RuntimeInfo info = kiln::cuda::query_runtime();
  if (!info.compiled || info.device_count == 0) {
    std::printf("skipped: %s\n", info.error.empty() ? "no CUDA device visible" : info.error.c_str());
    std::exit(77);
  }
  const kiln::Device gpu = kiln::cuda_device(0);
  const kiln::Tensor host = kiln::arange(0.0, double(1 << 21), 1.0, {kiln::DType::f32});  // 8 MiB
  const auto same = [&](const kiln::Tensor& on_gpu, const kiln::Tensor& want) {
    return kiln::allclose(on_gpu.to(kiln::kCPU), want, 0.0, 0.0);
  };
  const kiln::Tensor pinned = kiln::pin_memory(host);
  void* compute = kiln::cuda::compute_stream(0);
  void* copies = kiln::cuda::copy_stream(0);
  kiln::cuda::synchronize(0);

  // With the compute stream held, the upload still completes: it does not queue behind the kernels.
  std::atomic<bool> release{false};
  hold(compute, &release);
  kiln::Tensor up = pinned.to(gpu);
  const void* first = up.raw_data();
  CHECK_MESSAGE(drains(copies, 10), "the upload waited for the compute stream");
  CHECK(cudaStreamQuery(static_cast<cudaStream_t>(compute)) == cudaErrorNotReady);
  // Its block is freed while the compute stream (which may still read it) is held: the next upload
  // must not reuse it yet.
  up = kiln::Tensor();
  kiln::Tensor second = pinned.to(gpu);
  const void* second_block = second.raw_data();
  CHECK(second_block != first);
  release = true;
  kiln::cuda::synchronize(0);
  CHECK(same(second, host));
  // Once the compute stream has passed, a block is reused.
  second = kiln::Tensor();
  const kiln::Tensor third = pinned.to(gpu);
  CHECK((third.raw_data() == first || third.raw_data() == second_block));
  CHECK(same(third, host));
  // Kernels queued after the upload see its data: scale it on the compute stream right away.
  std::atomic<bool> release2{false};
  hold(copies, &release2);  // the copy cannot start until released
  const kiln::Tensor late = pinned.to(gpu);
  const kiln::Tensor doubled = late * 2.0f;
  release2 = true;
  CHECK(same(doubled, host * 2.0f));
  // From pageable memory: on the compute stream, in order.
  CHECK(same(host.to(gpu), host));
}
#endif
