// GPU parity (ctest label gpu): every row of the op table (tests/op_table.cpp) on CUDA against the
// CPU on the same inputs, forward and backward; f32 with the row's tight tolerance, f16 and bf16
// with its 16-bit one, and non-contiguous inputs. ctest runs one entry per row (gpu_parity_<row>,
// listed at test time by `kiln_tests --list-op-rows`, KILN_PARITY_OP); without a device each
// reports skipped (exit 77). The CPU test at the end runs the same comparison with the CPU on both
// sides, so the harness itself is tested in CI.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>

#include "engine/ops.h"
#include "kernels/cuda/cuda_backend.h"
#include "tests/op_table.h"

using namespace kiln;
using namespace kiln::optable;

namespace {

void compare_row(const Row& r, Device dev) {
  std::vector<DType> dts = {DType::f32};
  if (r.lowp) dts.insert(dts.end(), {DType::f16, DType::bf16});
  bool any = false;
  for (const In& in : r.inputs) any = any || transposable(in);
  for (DType dt : dts)
    for (bool transposed : {false, true}) {
      if (transposed && !any) continue;
      const std::vector<Tensor> in = make_inputs(r, dt, transposed);
      const RunResult want = run_row(r, in, transposed, kCPU);
      const RunResult got = run_row(r, in, transposed, dev);
      for (size_t i = 0; i < want.outputs.size() && i < got.outputs.size(); ++i)
        if (want.outputs[i].defined() && got.outputs[i].defined())
          CHECK_MESSAGE(want.outputs[i].dtype() == got.outputs[i].dtype(), r.name, " output ", i, ": dtypes differ");
      std::ostringstream what;
      what << dt << (transposed ? ", non-contiguous" : "") << ": " << dev << " against the CPU";
      const std::string err = compare(r, got, want, dt == DType::f32 ? r.tol32 : r.tol16, what.str());
      CHECK_MESSAGE(err.empty(), err);
    }
}

}  // namespace

TEST_CASE("gpu parity: the op named by KILN_PARITY_OP (all without it) matches the CPU") {
  if (cuda::device_count() == 0) {
    std::printf("skipped: %s\n", cuda::compiled() ? "no CUDA device visible" : "this build has no CUDA backend");
    std::exit(77);
  }
  const char* only = std::getenv("KILN_PARITY_OP");
  bool found = false;
  for (const Row& r : rows()) {
    if (only && r.name != only) continue;
    found = true;
    INFO("row ", r.name);
    compare_row(r, cuda_device(0));
  }
  CHECK_MESSAGE(found, "no parity case named ", only ? only : "");
  cuda::synchronize(0);
}

TEST_CASE("gpu parity table: the harness end to end with the CPU on both sides") {
  for (const Row& r : rows()) {
    INFO("row ", r.name);
    compare_row(r, kCPU);
  }
}
