// GPU parity (ctest label gpu): every row of the op table (tests/op_table.cpp) on CUDA against the
// CPU on the same inputs, forward and backward; f32 with the row's tight tolerance, f16 and bf16
// with its 16-bit one, and non-contiguous inputs. ctest runs one entry per row (gpu_parity_<row>,
// listed at test time by `kiln_tests --list-op-rows`, KILN_PARITY_OP); without a device each
// reports skipped (exit 77). The same harness (optable::parity) runs in CI against the CUDA
// kernels under the emulator (tests/test_emulated.cpp).
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
  std::ostringstream who;
  who << dev;
  const auto run = [&](const std::vector<Tensor>& in, bool transposed) { return run_row(r, in, transposed, dev); };
  for (const std::string& err : parity(r, who.str(), run)) CHECK_MESSAGE(false, err);
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
  CHECK_MESSAGE(found, "no parity case named ", std::string(only ? only : ""));
  cuda::synchronize(0);
}
