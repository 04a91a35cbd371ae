// GPU test (ctest label gpu): Kiln's Tensor Core GEMM on every visible sm_80+ device against the CPU
// reference, for every layout, input and output dtype and epilogue over awkward sizes. With no
// device (or no CUDA in this build) it reports skipped (exit 77) and says why.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>

#include "kernels/cuda/runtime_info.h"
#include "kernels/cuda/tc_gemm.h"

TEST_CASE("gpu: Tensor Core GEMM matches the CPU reference on every layout, dtype and epilogue") {
  const kiln::cuda::RuntimeInfo info = kiln::cuda::query_runtime();
  if (!info.compiled || info.device_count == 0) {
    std::printf("skipped: %s\n", info.error.empty() ? "no CUDA device visible" : info.error.c_str());
    std::exit(77);
  }
  int ran = 0;
  for (const auto& d : info.devices) {
    std::string why;
    if (!kiln::cuda::tc_gemm_supported(d.index, &why)) {
      std::printf("device %d: %s\n", d.index, why.c_str());
      continue;
    }
    const std::string report = kiln::cuda::tc_gemm_selftest(d.index);
    CHECK_MESSAGE(report.empty(), "device ", d.index, " (", d.name, "):\n", report);
    ++ran;
  }
  if (ran == 0) {
    std::printf("skipped: no device of compute capability 8.0 or newer\n");
    std::exit(77);
  }
}
