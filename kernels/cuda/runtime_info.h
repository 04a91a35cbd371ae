// What the CUDA runtime sees on this machine, for `kiln doctor`. No CUDA headers here: CPU-only
// translation units include it, and builds without CUDA get an implementation that says so.
#pragma once
#include <cctype>
#include <cstdint>
#include <string>
#include <vector>

namespace kiln::cuda {

// How this binary's device code runs on a GPU: machine code (SASS) for its architecture, PTX the
// driver compiles at first launch, nothing usable, or unknown (CMAKE_CUDA_ARCHITECTURES=native/all).
struct ArchMatch {
  enum Kind { sass, ptx, none, unknown } kind = none;
  std::string arch;  // the entry used: "sm_80" or "compute_90"; "" for none and unknown
  std::string text;  // one line for the user, with what to do when the device is not usable
};

// `archs` is CMAKE_CUDA_ARCHITECTURES ("75-real;80-real;90": NN gives sm_NN SASS and compute_NN
// PTX, NN-real SASS only, NN-virtual PTX only; an "a" suffix is arch-specific, an "f" suffix
// family-specific). CUDA's compatibility rules: sm_XY SASS runs on major X with minor >= Y;
// compute_XY PTX is JIT-compiled on any cc >= XY; "a" code runs on exactly XY, "f" code on major X.
inline ArchMatch match_arch(const std::string& archs, int major, int minor) {
  const int dev = major * 10 + minor;
  int best_sass = -1, best_ptx = -1;
  std::string sass_name, ptx_name;
  bool parsed_any = false;
  size_t i = 0;
  while (i < archs.size()) {
    size_t end = archs.find_first_of(";, ", i);
    if (end == std::string::npos) end = archs.size();
    const std::string entry = archs.substr(i, end - i);
    i = end + 1;
    size_t p = 0;
    while (p < entry.size() && std::isdigit(static_cast<unsigned char>(entry[p]))) ++p;
    if (p == 0) continue;  // "native", "all", "all-major", or empty
    const int cc = std::stoi(entry.substr(0, p));
    const char suffix = p < entry.size() && (entry[p] == 'a' || entry[p] == 'f') ? entry[p] : 0;
    const std::string kind = entry.substr(p + (suffix ? 1 : 0));
    if (!kind.empty() && kind != "-real" && kind != "-virtual") continue;
    parsed_any = true;
    const std::string name = std::to_string(cc) + (suffix ? std::string(1, suffix) : "");
    const bool same_major_newer = cc / 10 == major && cc % 10 <= minor;
    if (kind != "-virtual" && (suffix == 'a' ? cc == dev : same_major_newer) && cc > best_sass) {
      best_sass = cc;
      sass_name = "sm_" + name;
    }
    const bool jit_ok = suffix == 'a' ? cc == dev : suffix == 'f' ? same_major_newer : cc <= dev;
    if (kind != "-real" && jit_ok && cc > best_ptx) {
      best_ptx = cc;
      ptx_name = "compute_" + name;
    }
  }
  const std::string want = std::to_string(dev);
  if (best_sass >= 0) {
    const bool exact = best_sass == dev;
    return {ArchMatch::sass, sass_name,
            "machine code (" + sass_name + (exact ? "" : ", binary compatible with sm_" + want) + ")"};
  }
  if (best_ptx >= 0)
    return {ArchMatch::ptx, ptx_name,
            "no machine code: the driver JIT-compiles " + ptx_name + " PTX at first launch (slow start; add " +
                want + " to -DCMAKE_CUDA_ARCHITECTURES for machine code)"};
  if (!parsed_any && !archs.empty())
    return {ArchMatch::unknown, "",
            "built for '" + archs + "': cannot tell from the architecture list (the self-test shows whether it runs)"};
  return {ArchMatch::none, "", "no code for sm_" + want + ": rebuild with -DCMAKE_CUDA_ARCHITECTURES=" + want};
}

// The driver version in the text of /proc/driver/nvidia/version ("NVRM version: NVIDIA UNIX x86_64
// Kernel Module  580.65.06  Sun Jul 27 ..."): the first word of digits and dots. "" when none.
inline std::string parse_nvidia_driver_version(const std::string& text) {
  const std::string line = text.substr(0, text.find('\n'));
  if (line.rfind("NVRM version:", 0) != 0) return "";
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && std::isspace(static_cast<unsigned char>(line[i]))) ++i;
    size_t end = i;
    while (end < line.size() && !std::isspace(static_cast<unsigned char>(line[end]))) ++end;
    const std::string word = line.substr(i, end - i);
    const bool version = !word.empty() && std::isdigit(static_cast<unsigned char>(word[0])) &&
                         word.find('.') != std::string::npos && word.find_first_not_of("0123456789.") == std::string::npos;
    if (version) return word;
    i = end;
  }
  return "";
}

struct DeviceInfo {
  int index = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0;
  size_t total_bytes = 0, free_bytes = 0;
  int multiprocessors = 0;
  ArchMatch code;  // match_arch(archs, cc_major, cc_minor)
};

// A vendor library as loaded at run time. Versions are MAJOR*10000 + MINOR*100 + PATCH.
struct LibraryInfo {
  int version = 0;         // what the loaded library reports
  int header_version = 0;  // the headers Kiln was compiled against
  int cuda_version = 0;    // CUDA runtime the library was built for (0: the library does not say)
  std::string path;        // the shared object the loader picked
  bool checked = false;    // a handle or communicator was tried (needs a GPU)
  std::string error;       // why that failed; "" when it worked or was not tried
};

struct RuntimeInfo {
  bool compiled = false;     // this build has the CUDA backend
  std::string archs;         // CMAKE_CUDA_ARCHITECTURES it was built for
  int runtime_version = 0;   // CUDA runtime Kiln links, e.g. 13000
  int driver_version = 0;    // highest CUDA version the driver supports, 0 when no driver
  std::string driver_string; // the driver's own version ("580.65.06"), "" when unknown
  int device_count = 0;
  std::string error;         // why no device is usable, from the runtime
  std::vector<DeviceInfo> devices;
  LibraryInfo cublas, cudnn, nccl;  // cublasLt handle, cuDNN handle, an all-reduce over every GPU
  std::vector<std::vector<bool>> p2p;  // p2p[i][j]: GPU i can access GPU j's memory directly
};

// `check_libraries`: also create a cuBLASLt and a cuDNN handle and run one NCCL all-reduce over the
// visible GPUs (seconds; what `kiln doctor` wants, not what a test's device check needs).
RuntimeInfo query_runtime(bool check_libraries = false);

// Runs the shared scalar math (kernels/common: half/bf16 conversion, Philox, GELU) on device
// `index` and compares it bit for bit with the host. Returns "" when equal, else what differed.
std::string device_self_test(int index);
// Queues the self-test kernel (self_test.cu): rows 0..n-1 of kernels/common/self_test.h into `out`,
// kSelfTestWords * n words of device memory, on the current device's default stream.
void launch_self_test(uint32_t* out, int n);

}  // namespace kiln::cuda
