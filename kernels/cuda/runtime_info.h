// What the CUDA runtime sees on this machine, for `kiln doctor`. No CUDA headers here: CPU-only
// translation units include it, and builds without CUDA get an implementation that says so.
#pragma once
#include <string>
#include <vector>

namespace kiln::cuda {

struct DeviceInfo {
  int index = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0;
  size_t total_bytes = 0, free_bytes = 0;
  int multiprocessors = 0;
};

struct RuntimeInfo {
  bool compiled = false;     // this build has the CUDA backend
  std::string archs;         // CMAKE_CUDA_ARCHITECTURES it was built for
  int runtime_version = 0;   // CUDA runtime Kiln links, e.g. 13000
  int driver_version = 0;    // highest CUDA version the driver supports, 0 when no driver
  int device_count = 0;
  std::string error;         // why no device is usable, from the runtime
  std::vector<DeviceInfo> devices;
};

RuntimeInfo query_runtime();

// Runs the shared scalar math (kernels/common: half/bf16 conversion, Philox, GELU) on device
// `index` and compares it bit for bit with the host. Returns "" when equal, else what differed.
std::string device_self_test(int index);

}  // namespace kiln::cuda
