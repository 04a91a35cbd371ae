// `kiln doctor`: what this build is and what the machine offers, each check with a verdict and
// what to do when it fails; exit code 0 when the requested device is ready for training.
#include <Eigen/Core>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "engine/thread_pool.h"
#include "kernels/cuda/runtime_info.h"
#include "kiln_build_info.h"
#include "tools/commands.h"

namespace kiln::tools {

namespace {
std::string cuda_version_str(int v) {
  if (v <= 0) return "none";
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

std::string cpu_features() {
  std::string f;
#if defined(__AVX512F__)
  f += "AVX-512 ";
#endif
#if defined(__AVX512BF16__)
  f += "AVX512-BF16 ";
#endif
#if defined(__AVX2__)
  f += "AVX2 ";
#endif
#if defined(__FMA__)
  f += "FMA ";
#endif
#if defined(__F16C__)
  f += "F16C ";
#endif
  if (f.empty()) f = "baseline x86-64 ";
  f.pop_back();
  return f;
}

struct Report {
  nlohmann::json j;
  bool json = false;
  void line(const char* key, const std::string& value) {
    if (!json) std::printf("  %-18s %s\n", key, value.c_str());
  }
  void section(const char* name) {
    if (!json) std::printf("%s\n", name);
  }
};
}  // namespace

void add_doctor_flags(CLI::App& app, DoctorOptions& o) {
  app.add_flag("--json", o.json, "Print the report as JSON");
  app.add_flag("!--no-self-test", o.self_test, "Skip running the shared math on each GPU");
  app.add_option("--device", o.device, "What to check readiness for: auto, cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
}

int run_doctor(const DoctorOptions& o) {
  Report r;
  r.json = o.json;
  const char* env_threads = std::getenv("KILN_NUM_THREADS");
  const int threads = num_threads();
  const unsigned hw = std::thread::hardware_concurrency();

  if (!o.json) std::printf("Kiln %s (%s build, %s)\n", KILN_VERSION_STRING, KILN_BUILD_TYPE, KILN_CXX_COMPILER);
  r.section("Build");
  const std::string eigen = std::to_string(EIGEN_WORLD_VERSION) + "." + std::to_string(EIGEN_MAJOR_VERSION) + "." +
                            std::to_string(EIGEN_MINOR_VERSION);
  r.line("CPU backend", "Eigen " + eigen + ", " + std::to_string(threads) + " threads (" +
                            (env_threads ? std::string("KILN_NUM_THREADS=") + env_threads : "KILN_NUM_THREADS unset") +
                            "; hardware threads " + std::to_string(hw) + ")");
  r.line("CPU code for", cpu_features() + (std::string(KILN_NATIVE_STRING) == "ON" ? " (-march=native)" : ""));
  if (std::string(KILN_SANITIZE_STRING).size()) r.line("sanitizers", KILN_SANITIZE_STRING);
  const cuda::RuntimeInfo ci = cuda::query_runtime();
  r.line("CUDA backend", ci.compiled ? std::string("compiled in (nvcc ") + KILN_CUDA_COMPILER_VERSION +
                                           ", architectures " + ci.archs + ")"
                                     : "not compiled in (KILN_CUDA=OFF or no nvcc at configure time)");
  r.j["version"] = KILN_VERSION_STRING;
  r.j["build"] = {{"type", KILN_BUILD_TYPE},      {"compiler", KILN_CXX_COMPILER}, {"eigen", eigen},
                  {"threads", threads},           {"cpu_features", cpu_features()},
                  {"cuda_compiled", ci.compiled}, {"cuda_architectures", ci.archs}};

  bool gpu_ready = false;
  if (ci.compiled) {
    r.section("CUDA");
    r.line("runtime", cuda_version_str(ci.runtime_version) + " (the version Kiln was built with)");
    if (ci.driver_version == 0) {
      r.line("driver", "none found: no NVIDIA driver is loaded (install the driver to use a GPU)");
    } else {
      const bool ok = ci.driver_version >= ci.runtime_version;
      r.line("driver", "supports CUDA up to " + cuda_version_str(ci.driver_version) +
                           (ok ? ": OK" : ": TOO OLD for this runtime; update the NVIDIA driver"));
    }
    if (ci.device_count == 0) {
      r.line("GPUs", "none visible (" + ci.error + ")");
    }
    nlohmann::json devs = nlohmann::json::array();
    for (const auto& d : ci.devices) {
      char buf[256];
      std::snprintf(buf, sizeof buf, "%s, sm_%d%d, %d SMs, %.1f GiB total, %.1f GiB free", d.name.c_str(), d.cc_major,
                    d.cc_minor, d.multiprocessors, double(d.total_bytes) / (1 << 30), double(d.free_bytes) / (1 << 30));
      std::string line = buf;
      nlohmann::json jd = {{"index", d.index}, {"name", d.name}, {"compute_capability", std::to_string(d.cc_major) + "." + std::to_string(d.cc_minor)},
                           {"total_bytes", d.total_bytes}, {"free_bytes", d.free_bytes}};
      if (o.self_test) {
        const std::string st = cuda::device_self_test(d.index);
        line += st.empty() ? "; self-test OK" : "; self-test FAILED: " + st;
        jd["self_test"] = st.empty() ? "ok" : st;
        if (st.empty()) gpu_ready = true;
      } else {
        gpu_ready = true;
      }
      devs.push_back(jd);
      r.line(("GPU " + std::to_string(d.index)).c_str(), line);
    }
    r.j["cuda"] = {{"runtime_version", ci.runtime_version}, {"driver_version", ci.driver_version},
                   {"device_count", ci.device_count}, {"error", ci.error}, {"devices", devs}};
  }

  std::string verdict;
  int rc = 0;
  if (o.device == "cpu" || (o.device == "auto" && !gpu_ready)) {
    verdict = "ready for CPU training with " + std::to_string(threads) + " threads (--device cpu)";
    if (o.device == "auto")
      verdict += ci.compiled ? "; no usable GPU, see above" : "; this build has no CUDA backend";
  } else if (gpu_ready) {
    verdict = "ready for single-GPU training (--device cuda)";
  } else {
    verdict = ci.compiled ? "NOT ready for GPU training: no usable GPU (see above); the CPU backend works (--device cpu)"
                          : "NOT ready for GPU training: this build has no CUDA backend; rebuild with KILN_CUDA=ON";
    rc = 1;
  }
  r.j["verdict"] = verdict;
  r.j["ready"] = rc == 0;
  if (o.json) {
    std::printf("%s\n", r.j.dump(2).c_str());
  } else {
    std::printf("Verdict: %s\n", verdict.c_str());
  }
  return rc;
}

}  // namespace kiln::tools
