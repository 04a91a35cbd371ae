// `kiln doctor`: the pure parts (which of the build's CUDA architectures runs on a device, the
// driver version from /proc) and the command itself, run as a user would. Needs no GPU: the
// command's checks are compared with what this machine has.
#include <doctest/doctest.h>

#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "base/cpu_isa.h"
#include "base/thread_pool.h"
#include "kernels/cuda/runtime_info.h"
#include "test_util.h"
#include "tools/environment.h"

using kiln::cuda::ArchMatch;
using kiln::cuda::match_arch;
using kiln::testing::contains;
using kiln::testing::run_kiln;
using kiln::testing::TempDir;

TEST_CASE("doctor: machine code or PTX for a device, from CMAKE_CUDA_ARCHITECTURES") {
  const std::string def = "75-real;80-real;86-real;89-real;90";  // CMakeLists.txt's default
  // Exact SASS.
  CHECK(match_arch(def, 7, 5).arch == "sm_75");
  CHECK(match_arch(def, 8, 9).arch == "sm_89");
  const ArchMatch h100 = match_arch(def, 9, 0);
  CHECK(h100.kind == ArchMatch::sass);
  CHECK(h100.arch == "sm_90");  // "90" gives SASS as well as PTX; SASS wins
  // SASS is binary compatible within a major version, upward in minor: the highest that fits.
  const ArchMatch orin = match_arch(def, 8, 7);
  CHECK(orin.kind == ArchMatch::sass);
  CHECK(orin.arch == "sm_86");
  CHECK(contains(orin.text, "binary compatible"));
  CHECK(match_arch("80", 8, 6).arch == "sm_80");
  // A newer major: only PTX can run, JIT-compiled.
  const ArchMatch b200 = match_arch(def, 10, 0);
  CHECK(b200.kind == ArchMatch::ptx);
  CHECK(b200.arch == "compute_90");
  CHECK(contains(b200.text, "JIT"));
  CHECK(match_arch(def, 12, 0).arch == "compute_90");
  CHECK(match_arch("80", 9, 0).kind == ArchMatch::ptx);
  // -virtual: PTX only, even on the exact architecture.
  CHECK(match_arch("80-virtual", 8, 0).kind == ArchMatch::ptx);
  CHECK(match_arch("80-virtual", 8, 6).arch == "compute_80");
  // Nothing fits: an older device, or a newer one with SASS only.
  const ArchMatch v100 = match_arch(def, 7, 0);
  CHECK(v100.kind == ArchMatch::none);
  CHECK(v100.text == "no code for sm_70: rebuild with -DCMAKE_CUDA_ARCHITECTURES=70");
  CHECK(match_arch("80-real", 9, 0).text == "no code for sm_90: rebuild with -DCMAKE_CUDA_ARCHITECTURES=90");
  CHECK(match_arch("80-real", 7, 5).kind == ArchMatch::none);
  CHECK(match_arch("86-real", 8, 0).kind == ArchMatch::none);  // minor compatibility goes upward only
  // Arch-specific ("a") code runs on exactly that architecture; family ("f") code within the major.
  CHECK(match_arch("90a-real", 9, 0).arch == "sm_90a");
  CHECK(match_arch("90a", 10, 0).kind == ArchMatch::none);
  CHECK(match_arch("100f", 10, 3).arch == "sm_100f");
  CHECK(match_arch("100f-virtual", 12, 0).kind == ArchMatch::none);
  // Three-digit architectures and other separators.
  CHECK(match_arch("90,100-real,120-real", 12, 0).arch == "sm_120");
  CHECK(match_arch("90 100-real", 10, 3).arch == "sm_100");
  // CMake's keywords say nothing about the list; an empty list has nothing.
  CHECK(match_arch("native", 8, 0).kind == ArchMatch::unknown);
  CHECK(match_arch("all-major", 8, 0).kind == ArchMatch::unknown);
  CHECK(match_arch("", 8, 0).kind == ArchMatch::none);
}

TEST_CASE("doctor: the driver version from /proc/driver/nvidia/version") {
  using kiln::cuda::parse_nvidia_driver_version;
  CHECK(parse_nvidia_driver_version("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  Sun Jul 27 06:54:38 "
                                    "UTC 2025\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n") == "580.65.06");
  CHECK(parse_nvidia_driver_version("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.124.06  Release "
                                    "Build  (dvs-builder@U16-I3-B03-4-3)  Tue Mar  4 12:02:33 UTC 2025\n") ==
        "570.124.06");
  CHECK(parse_nvidia_driver_version("NVRM version: NVIDIA UNIX aarch64 Kernel Module  550.54.15  Tue Mar  5 2024") ==
        "550.54.15");
  CHECK(parse_nvidia_driver_version("") == "");
  CHECK(parse_nvidia_driver_version("GCC version: 12.2.0\n") == "");
}

TEST_CASE("doctor: the report, its JSON and its exit codes match this machine") {
  const kiln::cuda::RuntimeInfo ci = kiln::cuda::query_runtime();
  const bool no_gpu = !ci.compiled || ci.device_count == 0;
  TempDir d;

  const auto text = run_kiln("doctor --no-self-test", d.p.string());
  CHECK_MESSAGE(text.code == 0, text.output);  // auto is always ready for something: the CPU at least
  CHECK(contains(text.output, "Verdict: ready for "));
  if (ci.compiled) {
    for (const char* line : {"runtime ", "driver ", "cuBLAS ", "cuDNN ", "NCCL ", "P2P "})
      CHECK_MESSAGE(contains(text.output, line), line, " missing from:\n", text.output);
  }
  if (no_gpu) {
    // Plainly: no GPU, and the CPU backend is what works.
    CHECK_MESSAGE(contains(text.output, "Verdict: ready for CPU training"), text.output);
    CHECK(contains(text.output, "--device cpu"));
    if (ci.compiled) {
      CHECK(contains(text.output, "not checked (no GPU)"));
      CHECK(contains(text.output, "n/a (no GPU)"));
    }
    const auto cuda = run_kiln("doctor --device cuda", d.p.string());
    CHECK(cuda.code == 1);
    CHECK_MESSAGE(contains(cuda.output, "Verdict: NOT ready for GPU training: "), cuda.output);
    CHECK(contains(cuda.output, "the CPU backend works (--device cpu)"));
  }

  const auto js = run_kiln("doctor --json --no-self-test", d.p.string());
  REQUIRE(js.code == 0);
  const auto j = nlohmann::json::parse(js.output);
  CHECK(j.at("ready") == true);
  CHECK(j.at("build").at("cuda_compiled") == ci.compiled);
  CHECK(j.at("gpus_usable").is_array());
  if (no_gpu) CHECK(j.at("ready_for") == "cpu");
  if (ci.compiled) {
    CHECK(j.at("cuda").at("driver_string").is_string());
    CHECK(j.at("cuda").at("devices").size() == size_t(ci.device_count));
    CHECK(j.at("cuda").at("p2p").size() == size_t(ci.device_count));
    for (const char* lib : {"cuBLAS", "cuDNN", "NCCL"}) {
      const auto& l = j.at("libraries").at(lib);
      CHECK_MESSAGE(l.at("version") != "unknown", lib);  // linked, so loaded even without a GPU
      CHECK(l.at("checked") == !no_gpu);
    }
    for (const auto& dev : j.at("cuda").at("devices")) CHECK(dev.at("code").at("kind").is_string());
  }
}

// [cpu-speed]: doctor names the CPU kernel set in use and why, in the text and the JSON, whether CPUID chose it
// or KILN_CPU_ISA asked for a lower one; a name that is not a set is an error naming the variable.
TEST_CASE("doctor: names the CPU kernel set in use and why") {
  TempDir d;
  const std::string best = kiln::cpu_isa_name(kiln::cpu_isa_supported());
  struct Env {  // KILN_CPU_ISA for the child processes, restored afterwards
    const char* saved = std::getenv("KILN_CPU_ISA");
    std::string keep = saved ? saved : "";
    ~Env() { saved ? setenv("KILN_CPU_ISA", keep.c_str(), 1) : unsetenv("KILN_CPU_ISA"); }
  } env;
  unsetenv("KILN_CPU_ISA");
  auto text = run_kiln("doctor --no-self-test", d.p.string());
  CHECK_MESSAGE(contains(text.output, "CPU kernels        " + best + ": the best this CPU supports (CPUID)"),
                text.output);
  auto js = nlohmann::json::parse(run_kiln("doctor --json --no-self-test", d.p.string()).output);
  CHECK(js.at("build").at("cpu_kernels") == best);
  CHECK(js.at("build").at("cpu_kernels_supported") == best);

  std::vector<std::string> lower;  // the sets strictly below the best
  if (kiln::cpu_isa_supported() != kiln::CpuIsa::generic) lower.push_back("generic");
  if (kiln::cpu_isa_supported() == kiln::CpuIsa::avx512) lower.push_back("avx2");
  for (const std::string& set : lower) {
    INFO("KILN_CPU_ISA=" << set);
    setenv("KILN_CPU_ISA", set.c_str(), 1);
    text = run_kiln("doctor --no-self-test", d.p.string());
    CHECK(text.code == 0);
    CHECK_MESSAGE(contains(text.output, "CPU kernels        " + set + ": asked for (KILN_CPU_ISA"), text.output);
    CHECK(contains(text.output, "this CPU supports " + best));
    js = nlohmann::json::parse(run_kiln("doctor --json --no-self-test", d.p.string()).output);
    CHECK(js.at("build").at("cpu_kernels") == set);
    CHECK(js.at("build").at("cpu_kernels_supported") == best);
  }
  setenv("KILN_CPU_ISA", "avx1024", 1);
  text = run_kiln("doctor --no-self-test", d.p.string());
  CHECK(text.code == 1);
  CHECK_MESSAGE(contains(text.output, "KILN_CPU_ISA: 'avx1024' is not a CPU kernel set (avx512, avx2 or generic)"),
                text.output);
}

// The CPU threads without KILN_NUM_THREADS: the CPUs the affinity mask allows (taskset here, an MPI
// launcher's binding in a job), split between the ranks a launcher says share the machine.
TEST_CASE("doctor: threads follow the affinity mask and a launcher's local ranks") {
  TempDir d;
  const std::string doctor = std::string(KILN_BINARY) + " doctor --json --no-self-test";
  auto threads = [&](const std::string& prefix) {
    const std::string log = (d / "threads.json");
    const int rc = std::system((prefix + " " + doctor + " > " + log + " 2> /dev/null < /dev/null").c_str());
    (void)rc;  // no GPU: doctor's own exit code says so; the JSON is what counts
    return nlohmann::json::parse(kiln::testing::read_text(log)).at("build").at("threads").get<int>();
  };
  const int hw = int(std::max(1u, std::thread::hardware_concurrency()));
  // No launcher's variables from the environment the tests run in.
  std::string clean = "env -u KILN_NUM_THREADS";
  for (const char* n : {"WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_SIZE",
                        "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
                        "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"})
    clean += std::string(" -u ") + n;
  CHECK(threads(clean) == kiln::available_cpus());
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (std::system("command -v taskset > /dev/null 2>&1") == 0 && sched_getaffinity(0, sizeof mask, &mask) == 0)
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
      if (CPU_ISSET(cpu, &mask)) {  // one CPU of this process's mask
        CHECK(threads(clean + " taskset -c " + std::to_string(cpu)) == 1);
        break;
      }
  const std::string ompi = clean + " OMPI_COMM_WORLD_SIZE=4 OMPI_COMM_WORLD_RANK=1 OMPI_COMM_WORLD_LOCAL_SIZE=2";
  CHECK(threads(ompi) == kiln::tools::rank_threads({2, true}, kiln::cpu_limits()));
  if (kiln::available_cpus() == hw && hw % 2 == 0) CHECK(threads(ompi) == hw / 2);
  CHECK(threads(ompi + " KILN_NUM_THREADS=3") == 3);
}
