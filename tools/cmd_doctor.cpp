// `kiln doctor`: what this build is and what the machine offers, each check with a verdict and
// what to do when it fails; exit code 0 when the requested device is ready for training.
#include <Eigen/Core>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "base/cpu_isa.h"
#include "base/thread_pool.h"
#include "io/json_text.h"
#include "kernels/cuda/runtime_info.h"
#include "kiln_build_info.h"
#include "tools/cli_checks.h"
#include "tools/commands.h"
#include "tools/environment.h"
#include "tools/plan.h"

namespace kiln::tools {

namespace {
std::string cuda_version_str(int v) {
  if (v <= 0) return "none";
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

// Library versions: MAJOR*10000 + MINOR*100 + PATCH, or MAJOR*1000 + ... before NCCL 2.9 and cuDNN 9.
std::string lib_version_str(int v) {
  if (v <= 0) return "unknown";
  const int m = v < 10000 ? 1000 : 10000;
  return std::to_string(v / m) + "." + std::to_string((v % m) / 100) + "." + std::to_string(v % 100);
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
#if defined(__SSE4_2__) && !defined(__AVX__)
  f += "SSE4.2 ";
#endif
  if (f.empty()) f = "the compiler's default ";
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
  // What to do about the check printed just above; also collected for --json.
  void fix(const std::string& what) {
    if (!json) std::printf("  %-18s fix: %s\n", "", what.c_str());
    j["fixes"].push_back(what);
  }
};

std::string gib(size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GiB", double(bytes) / (1 << 30));
  return buf;
}

// What the CUDA checks found, for the verdict.
struct GpuFindings {
  std::string no_gpu;        // why no GPU can work at all (driver, visibility); "" otherwise
  std::vector<int> usable;   // GPUs with code for them that passed the self-test
  std::string lib_problem;   // a library the GPU backend needs that does not work
  std::string nccl_problem;  // why multi-GPU collectives do not work
};

void check_driver(Report& r, const cuda::RuntimeInfo& ci, GpuFindings& f) {
  const std::string rt = cuda_version_str(ci.runtime_version);
  r.line("runtime", rt + " (the version Kiln was built with)");
  const std::string drv = ci.driver_string.empty() ? "" : ci.driver_string + ", ";
  if (ci.driver_version == 0 && !ci.driver_string.empty()) {
    r.line("driver", "kernel module " + ci.driver_string + " is loaded, but its library libcuda.so.1 was not found");
    r.fix("in a container, start it with the NVIDIA Container Toolkit (docker run --gpus all); elsewhere install the "
          "driver's user-space libraries");
    f.no_gpu = "the NVIDIA driver's libcuda.so.1 was not found";
  } else if (ci.driver_version == 0) {
    r.line("driver", "none: no NVIDIA driver is loaded");
    f.no_gpu = "no GPU on this machine (no NVIDIA driver)";
  } else if (ci.driver_version >= ci.runtime_version) {
    r.line("driver", drv + "supports CUDA up to " + cuda_version_str(ci.driver_version) + ": OK");
  } else if (ci.driver_version / 1000 == ci.runtime_version / 1000) {
    // Minor-version compatibility: the runtime works, but the driver cannot JIT newer PTX.
    r.line("driver", drv + "supports CUDA up to " + cuda_version_str(ci.driver_version) +
                         ": OK (minor-version compatibility; JIT from PTX needs a driver for CUDA " + rt + ")");
  } else {
    r.line("driver", drv + "supports CUDA up to " + cuda_version_str(ci.driver_version) + ": TOO OLD for CUDA " + rt);
    r.fix("update the NVIDIA driver to one supporting CUDA " + rt);
    f.no_gpu = "the NVIDIA driver is too old for CUDA " + rt;
  }
  r.j["cuda"]["runtime_version"] = ci.runtime_version;
  r.j["cuda"]["driver_version"] = ci.driver_version;
  r.j["cuda"]["driver_string"] = ci.driver_string;
}

void check_devices(Report& r, const cuda::RuntimeInfo& ci, bool self_test, GpuFindings& f) {
  nlohmann::json devs = nlohmann::json::array();
  if (ci.devices.empty()) {
    if (f.no_gpu.empty()) {
      r.line("GPUs", "none visible (" + ci.error + ")");
      const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
      r.fix(visible ? std::string("CUDA_VISIBLE_DEVICES=") + visible + " hides the GPUs: unset it or name the right ones"
                    : "check that nvidia-smi lists the GPUs; in a container, start it with --gpus all");
      f.no_gpu = "no GPU visible";
    } else {
      r.line("GPUs", "none: " + f.no_gpu);
      if (ci.driver_version == 0 && ci.driver_string.empty())
        r.fix("train with the CPU backend (--device cpu); to use a GPU, install the NVIDIA driver on a machine that "
              "has one (nvidia-smi should list it)");
    }
  }
  const std::string rt = cuda_version_str(ci.runtime_version);
  for (const auto& d : ci.devices) {
    const std::string cc = std::to_string(d.cc_major) + "." + std::to_string(d.cc_minor);
    const std::string key = "GPU " + std::to_string(d.index);
    r.line(key.c_str(), d.name + ", compute capability " + cc + ", " + std::to_string(d.multiprocessors) + " SMs, " +
                            gib(d.total_bytes) + " total, " + gib(d.free_bytes) + " free");
    bool usable = d.code.kind != cuda::ArchMatch::none;
    std::string line = d.code.text, st = "not run";
    if (usable && self_test) {
      st = cuda::device_self_test(d.index);
      usable = st.empty();
      line += st.empty() ? "; self-test OK" : "; self-test FAILED: " + st;
    }
    r.line("", line);
    if (!st.empty() && st != "not run") {
      const std::string sm = std::to_string(d.cc_major * 10 + d.cc_minor);
      if (st.find("UnsupportedPtxVersion") != std::string::npos)
        r.fix("update the NVIDIA driver to one supporting CUDA " + rt + " (to JIT this build's PTX), or rebuild with "
              "-DCMAKE_CUDA_ARCHITECTURES=" + sm);
      else if (st.find("NoKernelImage") != std::string::npos)
        r.fix("rebuild with -DCMAKE_CUDA_ARCHITECTURES=" + sm);
      else
        r.fix("this GPU does not compute what the CPU does: check nvidia-smi -q for ECC and Xid errors, or use another GPU");
    }
    if (usable) f.usable.push_back(d.index);
    static const char* kinds[] = {"sass", "ptx", "none", "unknown"};
    devs.push_back({{"index", d.index},
                    {"name", d.name},
                    {"compute_capability", cc},
                    {"multiprocessors", d.multiprocessors},
                    {"total_bytes", d.total_bytes},
                    {"free_bytes", d.free_bytes},
                    {"code", {{"kind", kinds[d.code.kind]}, {"arch", d.code.arch}, {"text", d.code.text}}},
                    {"self_test", st.empty() ? "ok" : st},
                    {"usable", usable}});
  }
  if (!ci.devices.empty() && f.usable.empty()) f.no_gpu = "no usable GPU (see above)";
  r.j["cuda"]["device_count"] = ci.device_count;
  r.j["cuda"]["error"] = ci.error;
  r.j["cuda"]["devices"] = devs;
}

// One library line: version, the CUDA it was built for, where it was loaded from and, with a GPU,
// whether a handle (communicator for NCCL) worked. Returns the problem, "" when none.
std::string check_library(Report& r, const char* name, const cuda::LibraryInfo& l, int runtime_version,
                          const std::string& what_was_tried) {
  std::string line = lib_version_str(l.version);
  if (l.cuda_version) line += " for CUDA " + cuda_version_str(l.cuda_version);
  if (!l.path.empty()) line += " (" + l.path + ")";
  std::string problem;
  if (l.version <= 0) {
    problem = "not loaded";
  } else if (l.cuda_version && l.cuda_version / 1000 != runtime_version / 1000) {
    problem = "built for CUDA " + cuda_version_str(l.cuda_version) + ", but Kiln uses CUDA " +
              cuda_version_str(runtime_version);
  } else if (l.checked && !l.error.empty()) {
    problem = what_was_tried + " FAILED: " + l.error;
  }
  if (!problem.empty()) {
    line += ": " + problem;
  } else if (l.checked) {
    line += ": " + what_was_tried + " OK";
  } else {
    line += ": " + what_was_tried + " not checked (no GPU)";
  }
  if (l.version > 0 && l.version < l.header_version)
    line += "; older than the " + lib_version_str(l.header_version) + " headers Kiln was built with";
  r.line(name, line);
  r.j["libraries"][name] = {{"version", lib_version_str(l.version)},
                            {"header_version", lib_version_str(l.header_version)},
                            {"cuda_version", l.cuda_version ? cuda_version_str(l.cuda_version) : ""},
                            {"path", l.path},
                            {"checked", l.checked},
                            {"status", !problem.empty() ? "failed" : l.checked ? "ok" : "loaded, not checked (no GPU)"},
                            {"error", problem}};
  return problem;
}

void check_libraries(Report& r, const cuda::RuntimeInfo& ci, GpuFindings& f) {
  r.section("Libraries");
  const std::string major = std::to_string(ci.runtime_version / 1000);
  if (!check_library(r, "cuBLAS", ci.cublas, ci.runtime_version, "handle").empty()) {
    r.fix("install cuBLAS for CUDA " + major + " (the CUDA toolkit's libcublas package) and make libcublasLt.so." +
          major + " findable (ldconfig or LD_LIBRARY_PATH)");
    f.lib_problem = "cuBLAS does not work (see above)";
  }
  if (!check_library(r, "cuDNN", ci.cudnn, ci.runtime_version, "handle").empty()) {
    r.fix("install cuDNN 9 for CUDA " + major + " (pip install nvidia-cudnn-cu" + major +
          " or the distribution package) and make libcudnn.so.9 findable (ldconfig or LD_LIBRARY_PATH)");
    if (f.lib_problem.empty()) f.lib_problem = "cuDNN does not work (see above)";
  }
  const size_t gpus = ci.p2p.size();
  const std::string nccl = check_library(r, "NCCL", ci.nccl, ci.runtime_version,
                                         "all-reduce" + (gpus ? " over " + std::to_string(gpus) + " GPU(s)" : ""));
  if (!nccl.empty()) {
    r.fix("run with NCCL_DEBUG=INFO to see why; in a container allow shared memory (docker run --ipc=host or "
          "--shm-size=1g); where GPU peer access is broken (some VMs) try NCCL_P2P_DISABLE=1");
    f.nccl_problem = "NCCL " + nccl;
  } else if (!ci.nccl.checked) {
    f.nccl_problem = "NCCL not checked (no GPU)";
  }
}

void check_p2p(Report& r, const cuda::RuntimeInfo& ci) {
  const size_t n = ci.p2p.size();
  r.j["cuda"]["p2p"] = ci.p2p;
  if (n < 2) {
    r.line("P2P", n == 1 ? "n/a (one GPU)" : "n/a (no GPU)");
    return;
  }
  std::string pairs;
  size_t can = 0;
  for (size_t i = 0; i < n; ++i)
    for (size_t j = 0; j < n; ++j) {
      if (i == j || !ci.p2p[i][j]) continue;
      ++can;
      if (j < i && ci.p2p[j][i]) continue;  // already listed as j<->i
      pairs += (pairs.empty() ? "" : ", ") + std::to_string(i) + (ci.p2p[j][i] ? "<->" : "->") + std::to_string(j);
    }
  if (can == n * (n - 1))
    r.line("P2P", "all pairs");
  else if (can == 0)
    r.line("P2P", "none (all-reduce goes through host memory; expect lower multi-GPU bandwidth)");
  else
    r.line("P2P", "some pairs: " + pairs + " (the others go through host memory; expect lower bandwidth there)");
}
}  // namespace

void add_doctor_flags(CLI::App& app, DoctorOptions& o) {
  app.add_flag("--json", o.json, "Print the report as JSON");
  add_on_off_flag(app, "--self-test,!--no-self-test", o.self_test, "Run the shared math on each GPU (off: skip it)");
  app.add_option("--device", o.device, "What to check readiness for: auto, cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  // The environment is applied after parsing (tools/main.cpp), and a bad variable would stop the
  // program there; the diagnosis tool reports it instead, so it checks them first and sets the bad
  // ones aside.
  app.callback([&o] {
    for (int tries = 0; tries < 8; ++tries) {
      try {
        (void)environment_context();
        return;
      } catch (const Error& e) {
        const std::string m = e.message();
        o.env_problems.push_back(m);
        bool unset = false;
        for (const char* v : {"KILN_NUM_THREADS", "KILN_CPU_CACHE_MB", "KILN_GEMM", "KILN_CPU_ISA"})
          if (m.find(v) != std::string::npos && std::getenv(v)) {
            ::unsetenv(v);
            unset = true;
            break;
          }
        if (!unset) return;  // not one of ours to set aside: the program's own check reports it
      }
    }
  });
}

namespace {

// What a rented machine gives this process: memory (the cgroup's limit too: a container's --memory
// is not in free's numbers), the disk under the current directory (where a relative --out goes) and
// whether other processes are using the CPUs. Notes, not failures: the verdict is about the devices.
void check_machine(Report& r) {
  r.section("Machine");
  const HostMemory m = host_memory();
  nlohmann::json j;
  if (m.total > 0) {
    std::string v = gib(m.available) + " available of " + gib(m.total);
    if (m.cgroup_limit > 0)
      v += "; this process's cgroup is limited to " + gib(m.cgroup_limit) + " (" + gib(m.cgroup_used) + " used, " +
           m.cgroup_file + "): kiln train plans for " + gib(m.usable());
    r.line("memory", v);
    if (m.usable() < (size_t(2) << 30))
      r.fix("less than 2 GiB is free for training: stop other processes or use a smaller --batch");
    j["memory_total_bytes"] = m.total;
    j["memory_available_bytes"] = m.available;
    j["memory_usable_bytes"] = m.usable();
    j["cgroup_memory_limit_bytes"] = m.cgroup_limit;
  } else {
    r.line("memory", "unknown (no /proc/meminfo)");
  }
  std::error_code ec;
  const std::filesystem::path cwd = std::filesystem::current_path(ec);
  const std::filesystem::space_info sp = std::filesystem::space(ec ? std::filesystem::path(".") : cwd, ec);
  if (!ec) {
    r.line("disk", gib(sp.available) + " free of " + gib(sp.capacity) + " under " + cwd.string() +
                       " (a relative --out, checkpoints)");
    if (sp.available < (uintmax_t(5) << 30))
      r.fix(
          "less than 5 GiB free under the current directory: checkpoints (each kept one and its .bak) may fail; "
          "give --out (and --mirror) on a larger disk");
    j["disk_free_bytes"] = sp.available;
    j["disk_path"] = cwd.string();
  } else {
    r.line("disk", "unknown (" + ec.message() + ")");
  }
  double load = -1;
  if (std::ifstream la("/proc/loadavg"); !(la >> load)) load = -1;
  if (load >= 0) {
    // /proc/loadavg counts the whole machine (a container's too): compared with the machine's
    // hardware threads, not this process's share of them (a quota or an affinity mask).
    const int cpus = cpu_limits().hardware;
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.2f", load);
    std::string v =
        std::string("1-minute load ") + buf + " on the machine's " + std::to_string(cpus) + " hardware threads";
    // This process is idle while it reads: a load near the thread count is other work.
    if (load > 0.75 * cpus)
      v += ": other processes are using the CPUs; kiln train's threads will share them (slower steps, noisy timings)";
    r.line("load", v);
    j["load_1min"] = load;
  }
  r.j["machine"] = j;
}

}  // namespace

int run_doctor(const DoctorOptions& o) {
  Report r;
  r.json = o.json;
  r.j["fixes"] = nlohmann::json::array();
  const char* env_threads = std::getenv("KILN_NUM_THREADS");
  const int threads = num_threads();
  const CpuLimits cpus = cpu_limits();
  const tools::LocalRanks local = tools::local_ranks();

  if (!o.json) std::printf("Kiln %s (%s build, %s)\n", KILN_VERSION_STRING, KILN_BUILD_TYPE, KILN_CXX_COMPILER);
  r.section("Build");
  const std::string eigen = std::to_string(EIGEN_WORLD_VERSION) + "." + std::to_string(EIGEN_MAJOR_VERSION) + "." +
                            std::to_string(EIGEN_MINOR_VERSION);
  const std::string threads_reason =
      (env_threads && *env_threads ? std::string("KILN_NUM_THREADS=") + env_threads : "KILN_NUM_THREADS unset") +
      "; CPUs available " + std::to_string(available_cpus()) + " of " + std::to_string(cpus.hardware) +
      " hardware threads" + (cpus.affinity < cpus.hardware ? ", affinity mask " + std::to_string(cpus.affinity) : "") +
      (cpus.quota > 0 ? ", cgroup quota " + std::to_string(cpus.quota) : "") +
      (!(env_threads && *env_threads) && local.count > 1 && threads == tools::rank_threads(local, cpus) &&
               threads < available_cpus()
           ? ", shared by " + std::to_string(local.count) + " local ranks"
           : "");
  r.line("CPU backend", "Eigen " + eigen + ", " + std::to_string(threads) +
                            (threads == 1 ? " thread (" : " threads (") + threads_reason + ")");
  r.line("CPU code for", cpu_features() + " (KILN_MARCH=" KILN_MARCH_STRING +
                             (std::string(KILN_MARCH_FLAGS).empty() ? std::string() : ": " KILN_MARCH_FLAGS) + ")");
  const std::string isa = cpu_isa_name(cpu_isa());
  r.line("CPU kernels", isa + ": " + cpu_isa_reason() + (cpu_isa() == CpuIsa::generic ? " (Eigen)" : ""));
  if (std::string(KILN_SANITIZE_STRING).size()) r.line("sanitizers", KILN_SANITIZE_STRING);
  const cuda::RuntimeInfo ci = cuda::query_runtime(true);
  r.line("CUDA backend", ci.compiled ? std::string("compiled in (nvcc ") + KILN_CUDA_COMPILER_VERSION +
                                           ", architectures " + ci.archs + ")"
                                     : "not compiled in (KILN_CUDA=OFF or no nvcc at configure time)");
  if (!o.env_problems.empty()) {
    r.section("Environment");
    for (const auto& p : o.env_problems) {
      r.line("refused", p + " (this report uses the default instead; kiln train would stop on it)");
      r.fix("correct or unset that variable");
    }
  }
  r.j["version"] = KILN_VERSION_STRING;
  r.j["build"] = {{"type", KILN_BUILD_TYPE},
                  {"compiler", KILN_CXX_COMPILER},
                  {"eigen", eigen},
                  {"threads", threads},
                  {"cpu_features", cpu_features()},
                  {"cpu_kernels", isa},
                  {"cpu_kernels_supported", cpu_isa_name(cpu_isa_supported())},
                  {"cpu_kernels_reason", cpu_isa_reason()},
                  {"threads_reason", threads_reason},
                  {"cuda_compiled", ci.compiled},
                  {"cuda_architectures", ci.archs}};

  check_machine(r);

  GpuFindings f;
  if (ci.compiled) {
    r.section("CUDA");
    check_driver(r, ci, f);
    check_devices(r, ci, o.self_test, f);
    check_libraries(r, ci, f);
    check_p2p(r, ci);
  }

  const bool gpu_ready = ci.compiled && !f.usable.empty() && f.lib_problem.empty();
  const std::string no_gpu_why = !ci.compiled      ? "this build has no CUDA backend; rebuild with KILN_CUDA=ON"
                                 : !f.no_gpu.empty() ? f.no_gpu
                                                     : f.lib_problem;
  const size_t n_usable = f.usable.size();
  std::string verdict, ready_for = "none";
  int rc = 0;
  if (o.device == "cpu" || (o.device == "auto" && !gpu_ready)) {
    verdict = "ready for CPU training with " + std::to_string(threads) + (threads == 1 ? " thread" : " threads") +
              " (--device cpu)";
    if (o.device == "auto") verdict += "; " + no_gpu_why;
    ready_for = "cpu";
  } else if (gpu_ready && n_usable >= 2 && f.nccl_problem.empty()) {
    verdict = "ready for multi-GPU training (" + std::to_string(n_usable) + " GPUs, NCCL OK)";
    ready_for = "multi-gpu";
  } else if (gpu_ready) {
    verdict = "ready for single-GPU training (--device cuda)";
    if (n_usable >= 2)
      verdict += "; multi-GPU NOT ready: " + f.nccl_problem;
    else if (ci.devices.size() >= 2)
      verdict += "; multi-GPU NOT ready: only GPU " + std::to_string(f.usable[0]) + " of " +
                 std::to_string(ci.devices.size()) + " is usable (see above)";
    ready_for = "single-gpu";
  } else {
    verdict = "NOT ready for GPU training: " + no_gpu_why + "; the CPU backend works (--device cpu)";
    rc = 1;
  }
  if (!o.env_problems.empty()) {  // kiln train stops on such a variable: not ready whatever the machine offers
    verdict = "NOT ready: " + o.env_problems.front() +
              " (correct or unset it; the rest of this report is with the "
              "default)";
    ready_for = "none";
    rc = 1;
  }
  r.j["environment_problems"] = o.env_problems;
  r.j["ready_for"] = ready_for;
  r.j["gpus_usable"] = f.usable;
  r.j["verdict"] = verdict;
  r.j["ready"] = rc == 0;
  if (o.json) {
    std::printf("%s\n", io::dump_json(r.j, 2).c_str());
  } else {
    std::printf("Verdict: %s\n", verdict.c_str());
  }
  return rc;
}

}  // namespace kiln::tools
