// GPU test (ctest label gpu): the NCCL communicator on one GPU as a world of one (every code path
// of set-up, stream ordering, staging of CPU tensors and waiting; the multi-GPU arithmetic is
// NCCL's). DataParallel's bucket packing is device-independent tensor copies, tested with CPU
// ranks in tests/dist. Skipped (exit 77) with no device.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>

#include "engine/dist.h"
#include "kernels/cuda/cuda_backend.h"
#include "runtime/nccl_comm.h"
#include "kiln.h"
#include "test_util.h"

using namespace kiln;

TEST_CASE("gpu nccl: a one-rank NCCL communicator runs every collective and orders them with compute") {
  if (cuda::device_count() == 0) {
    std::printf("skipped: %s\n", cuda::compiled() ? "no CUDA device visible" : "this build has no CUDA backend");
    std::exit(77);
  }
  auto boot = dist::make_single_communicator();
  auto comm = cuda::make_nccl_communicator(*boot, 0, std::chrono::seconds(60));
  CHECK(comm->world_size() == 1);
  CHECK(std::string(comm->backend()) == "nccl");
  const TensorOptions o(DType::f32, cuda_device(0));
  // Written on the compute stream right before the collective: NCCL must see these values.
  Tensor t = arange(0.0, 1000.0, 1.0, o) * 2.0;
  comm->all_reduce(t, dist::ReduceOp::avg);
  CHECK(sum(t).item<double>() == doctest::Approx(999.0 * 1000.0));
  Tensor h = from_vector({1, 2, 3}, {3}, DType::f64);  // a CPU tensor is staged through the device
  comm->all_reduce(h, dist::ReduceOp::max);
  CHECK(h.to_vector() == std::vector<double>{1, 2, 3});
  Tensor b = full({5}, 7.0, TensorOptions(DType::bf16, cuda_device(0)));
  comm->broadcast(b, 0);
  CHECK(b.to_vector() == std::vector<double>(5, 7.0));
  Tensor in = arange(0.0, 4.0, 1.0, o), out = zeros({4}, o);
  comm->all_gather(in, out);
  CHECK(out.to_vector() == std::vector<double>{0, 1, 2, 3});
  Tensor rs = zeros({4}, o);
  comm->reduce_scatter(in, rs, dist::ReduceOp::sum);
  CHECK(rs.to_vector() == std::vector<double>{0, 1, 2, 3});
  comm->barrier();
  const std::string msg = testing::error_of([&] { comm->broadcast(t, 3); });
  CHECK_MESSAGE(testing::contains(msg, "root 3"), msg);
}
