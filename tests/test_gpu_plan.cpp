// GPU test (ctest label gpu): the memory planner's prediction for a GPU (meta tensors laid out as
// the GPU lays them out) against the bytes the device's caching allocator hands out for the same
// training steps on cuda:0. Skipped (exit 77) with no device.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>

#include "kernels/cuda/runtime_info.h"
#include "kiln.h"
#include "tools/plan.h"

using namespace kiln;

TEST_CASE("gpu: planned peaks are within 10% of the measured device peaks of the same steps") {
  const cuda::RuntimeInfo info = cuda::query_runtime();
  if (!info.compiled || info.device_count == 0) {
    std::printf("skipped: %s\n", info.error.empty() ? "no CUDA device visible" : info.error.c_str());
    std::exit(77);
  }
  struct Case {
    const char* model;
    int64_t batch, seq_len, image_size;
    const char* optimizer;
    const char* amp;
  };
  for (const Case& c : {Case{"resnet20", 64, 128, 32, "sgd", "off"}, Case{"resnet50", 8, 128, 224, "sgd", "off"},
                        Case{"bert-tiny", 16, 128, 0, "adamw", "off"}, Case{"bert-base", 8, 128, 0, "adamw", "bf16"}}) {
    tools::PlanOptions o;
    o.model = c.model;
    o.seq_len = c.seq_len;
    o.image_size = c.image_size;
    o.optimizer = c.optimizer;
    o.amp = c.amp;
    o.device = "cuda";
    const tools::MemoryPlan planned = tools::plan_memory(o, c.batch);
    const tools::MemoryPlan measured = tools::step_memory(o, c.batch, cuda_device(0));
    const double ratio = double(planned.peak) / double(measured.peak);
    MESSAGE(std::string(c.model), " batch ", c.batch, " amp ", std::string(c.amp), ": planned ",
            tools::mib(planned.peak), ", measured ", tools::mib(measured.peak), " (", ratio, "); activations ",
            tools::mib(planned.activations), " vs ", tools::mib(measured.activations));
    CHECK(ratio > 0.9);
    CHECK(ratio < 1.1);
  }
}
