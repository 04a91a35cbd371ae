// All-reduce bandwidth between ranks, as nccl-tests defines it: for S bytes in time t,
// algbw = S / t and busbw = algbw x 2(n-1)/n (what each link carries in a ring). Run it under a
// launcher: `mpirun -np 4 bench_allreduce` (CPU ranks, MPI), `kiln launch --nproc-per-node 4 --
// bench_allreduce` (TCP ring), or with --device cuda one rank per GPU over NCCL. Sizes from 8 B (x4)
// up to and including --max-bytes (default 1 GiB); rank 0 prints the table, naming the CPU and its
// threads (or the GPU), and with --json FILE writes it. One rank has nothing to reduce: refused.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/allreduce_sizes.h"
#include "bench/bench_main.h"
#include "engine/dist.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/runtime_info.h"
#include "kiln.h"
#include "runtime/nccl_comm.h"

using namespace kiln;

int main(int argc, char** argv) {
  CLI::App app("All-reduce bandwidth over the ranks of this job (mpirun -np N, or kiln launch)", "bench_allreduce");
  bench::CommonFlags flags;
  bench::add_common_flags(app, flags, /*threads=*/false, /*quick=*/false);
  int64_t max_bytes = int64_t(1) << 30;
  int iters = 20;
  std::string device = "cpu";
  app.add_option("--max-bytes", max_bytes, "Largest message")
      ->check(bench::whole_number(1, std::numeric_limits<int64_t>::max()));
  app.add_option("--iters", iters, "Timed repetitions per size")->check(bench::whole_number(1));
  app.add_option("--device", device, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  if (const int rc = bench::start(app, flags, argc, argv); rc >= 0) return rc;
  const std::string& json_path = flags.json;
  const bool gpu = device == "cuda";
  if (!bench::json_path_ok("bench_allreduce", json_path)) return 2;
  const dist::DistEnv env = kiln::tools::dist_env();
  auto host_comm = dist::make_cpu_communicator(env, std::chrono::seconds(600));
  if (host_comm->world_size() < 2) {
    std::fprintf(stderr,
                 "bench_allreduce: error: this job has %d rank: an all-reduce over one rank moves nothing, so there "
                 "is no bandwidth to measure; run it under a launcher (mpirun -np N bench_allreduce, or kiln launch "
                 "--nproc-per-node N -- bench_allreduce)\n",
                 host_comm->world_size());
    return 2;
  }
  std::unique_ptr<dist::Communicator> gpu_comm;
  if (gpu) {
    if (cuda::device_count() == 0) {
      std::fprintf(stderr, "bench_allreduce: --device cuda but no CUDA device is visible\n");
      return 2;
    }
    gpu_comm = cuda::make_nccl_communicator(*host_comm, env.local_rank % cuda::device_count(), std::chrono::seconds(600));
  }
  dist::Communicator* comm = gpu ? gpu_comm.get() : host_comm.get();
  const Device dev = gpu ? cuda_device(env.local_rank % cuda::device_count()) : kCPU;
  const int n = comm->world_size();
  const bool lead = comm->rank() == 0;
  // What the ranks ran on: each rank's CPU and threads, or its GPU (rank 0's, as the others').
  const std::string where = gpu ? cuda::query_runtime().devices.at(size_t(dev.index)).name
                                : bench::cpu_line() + ", " + std::to_string(num_threads()) + " thread" +
                                      (num_threads() == 1 ? "" : "s") + " per rank";
  if (lead)
    std::printf(
        "all-reduce (sum, f32) over %d ranks, backend %s, on %s; median of the size's reps (--iters %d, a quarter of "
        "it, at least 3, from 64 MiB) after 3 warm-up; each size's sums checked\n"
        "%12s %6s %12s %14s %14s\n",
        n, comm->backend(), where.c_str(), iters, "bytes", "reps", "time us", "algbw GB/s", "busbw GB/s");
  nlohmann::json rows = nlohmann::json::array();
  bool ok = true;
  for (const int64_t bytes : bench::allreduce_sizes(max_bytes)) {
    const int64_t count = bytes / 4;
    Tensor t = ones({count}, TensorOptions(DType::f32, dev));
    // Large sizes take fewer iterations so the sweep stays in minutes.
    const int reps = bytes >= (int64_t(64) << 20) ? std::max(3, iters / 4) : iters;
    std::vector<double> us;
    for (int i = 0; i < reps + 3; ++i) {
      comm->barrier();
      const auto a = std::chrono::steady_clock::now();
      comm->all_reduce(t, dist::ReduceOp::sum);
      if (gpu) cuda::synchronize(dev.index);
      const double dt = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - a).count();
      if (i >= 3) us.push_back(dt);
    }
    // This size's sums, untimed: rank r gives r + 1, so every element is n (n + 1) / 2, exact in f32.
    // A transport that drops, repeats or misplaces a rank's part at this size (a chunking boundary)
    // fails here, not only at one small size.
    t = Tensor();  // its memory back before the check's
    Tensor chk = full({count}, double(comm->rank() + 1), TensorOptions(DType::f32, dev));
    comm->all_reduce(chk, dist::ReduceOp::sum);
    const double want = double(n) * double(n + 1) / 2.0;
    const bool size_ok =
        chk.slice(0, 0, 1).to_vector()[0] == want && chk.slice(0, count - 1, count).to_vector()[0] == want;
    ok = ok && size_ok;
    // The slowest rank's time is the collective's time.
    Tensor mine = from_vector(us, {int64_t(us.size())}, DType::f64);
    comm->all_reduce(mine, dist::ReduceOp::max);
    const double med = bench::median(mine.to_vector());
    const double algbw = double(bytes) / (med * 1e-6) / 1e9;
    const double busbw = algbw * 2.0 * double(n - 1) / double(n);
    if (lead) {
      std::printf("%12lld %6d %12.1f %14.3f %14.3f%s\n", (long long)bytes, reps, med, algbw, busbw,
                  size_ok ? "" : "  WRONG SUMS");
      rows.push_back({{"bytes", bytes},
                      {"reps", reps},
                      {"time_us", med},
                      {"algbw_GBps", algbw},
                      {"busbw_GBps", busbw},
                      {"sum_correct", size_ok}});
    }
  }
  // sums_correct: every size's check held, so a broken transport never reports a bandwidth as good.
  if (lead) {
    std::printf("check: %s\n", ok ? "sums correct" : "WRONG SUMS");
    nlohmann::json doc = {
        {"benchmark", "allreduce"}, {"backend", comm->backend()}, {"ranks", n}, {"sums_correct", ok}, {"rows", rows}};
    if (gpu) {
      doc["device"] = where;
    } else {
      doc["cpu"] = tools::cpu_model();
      doc["cpu_kernels"] = cpu_isa_name(cpu_isa());
      doc["threads"] = num_threads();
    }
    if (!bench::write_json("bench_allreduce", json_path, doc)) return 1;
  }
  return ok ? 0 : 1;
}
