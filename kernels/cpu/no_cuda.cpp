// The CUDA runtime queries in a build without the CUDA backend: they say so.
#include "kernels/cuda/runtime_info.h"

#if !defined(KILN_WITH_CUDA)
namespace kiln::cuda {
RuntimeInfo query_runtime() {
  RuntimeInfo info;
  info.error = "this build of Kiln has no CUDA backend (configured with KILN_CUDA=OFF or without nvcc)";
  return info;
}
std::string device_self_test(int) { return "this build of Kiln has no CUDA backend"; }
}  // namespace kiln::cuda
#endif
