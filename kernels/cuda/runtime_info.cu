// CUDA runtime queries for `kiln doctor`, and a self-test kernel that runs kernels/common's
// scalar math on the device so a user can see the GPU computes what the CPU reference does.
#include <cuda_runtime.h>

#include <cstdint>
#include <sstream>
#include <vector>

#include "kernels/common/half.h"
#include "kernels/common/math.h"
#include "kernels/common/philox.h"
#include "kernels/cuda/runtime_info.h"
#include "kiln_build_info.h"

namespace kiln::cuda {
namespace {

// Launch: 1-D grid, one thread per test element i (n elements). Thread i writes 5 words:
// philox lane i%4 of block i/4 (seed 42), f16 and bf16 bits of x_i, and gelu(x_i) bits.
// Memory: 20 bytes written per thread; nothing read but the index.
__global__ void self_test_kernel(uint32_t* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const U32x4 r = philox_block(42, uint64_t(i) / 4);
  const float x = (float(i) - 512.0f) * 0.03125f;
  out[5 * i + 0] = r.v[i % 4];
  out[5 * i + 1] = f32_to_f16_bits(x * 1.001f);
  out[5 * i + 2] = f32_to_bf16_bits(x * 1.001f);
  out[5 * i + 3] = f32_bits(f16_bits_to_f32(uint16_t(i * 61)));
  out[5 * i + 4] = f32_bits(float(math::gelu_erf(double(x))));
}

std::string err(cudaError_t e) { return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e); }

}  // namespace

RuntimeInfo query_runtime() {
  RuntimeInfo info;
  info.compiled = true;
  info.archs = KILN_CUDA_ARCHS;
  cudaRuntimeGetVersion(&info.runtime_version);
  if (cudaDriverGetVersion(&info.driver_version) != cudaSuccess) info.driver_version = 0;
  cudaError_t e = cudaGetDeviceCount(&info.device_count);
  if (e != cudaSuccess) {
    info.device_count = 0;
    info.error = err(e);
    return info;
  }
  for (int d = 0; d < info.device_count; ++d) {
    cudaDeviceProp p{};
    if ((e = cudaGetDeviceProperties(&p, d)) != cudaSuccess) {
      info.error = err(e);
      continue;
    }
    DeviceInfo di;
    di.index = d;
    di.name = p.name;
    di.cc_major = p.major;
    di.cc_minor = p.minor;
    di.total_bytes = p.totalGlobalMem;
    di.multiprocessors = p.multiProcessorCount;
    if (cudaSetDevice(d) == cudaSuccess) {
      size_t fr = 0, tot = 0;
      if (cudaMemGetInfo(&fr, &tot) == cudaSuccess) di.free_bytes = fr;
    }
    info.devices.push_back(di);
  }
  return info;
}

std::string device_self_test(int index) {
  constexpr int n = 1024;
  cudaError_t e = cudaSetDevice(index);
  if (e != cudaSuccess) return err(e);
  uint32_t* d_out = nullptr;
  if ((e = cudaMalloc(&d_out, 5 * n * sizeof(uint32_t))) != cudaSuccess) return err(e);
  self_test_kernel<<<(n + 255) / 256, 256>>>(d_out, n);
  std::vector<uint32_t> got(5 * n);
  e = cudaGetLastError();
  if (e == cudaSuccess) e = cudaMemcpy(got.data(), d_out, got.size() * sizeof(uint32_t), cudaMemcpyDeviceToHost);
  cudaFree(d_out);
  if (e != cudaSuccess) return err(e);
  const char* what[5] = {"philox", "f32->f16", "f32->bf16", "f16->f32", "gelu_erf"};
  for (int i = 0; i < n; ++i) {
    const U32x4 r = philox_block(42, uint64_t(i) / 4);
    const float x = (float(i) - 512.0f) * 0.03125f;
    const uint32_t want[5] = {r.v[i % 4], f32_to_f16_bits(x * 1.001f), f32_to_bf16_bits(x * 1.001f),
                              f32_bits(f16_bits_to_f32(uint16_t(i * 61))), f32_bits(float(math::gelu_erf(double(x))))};
    for (int j = 0; j < 5; ++j) {
      // erf may differ by an ulp between libm and the device; everything else must be exact.
      const int64_t diff = int64_t(got[5 * i + j]) - int64_t(want[j]);
      if (diff != 0 && !(j == 4 && diff >= -1 && diff <= 1)) {
        std::ostringstream os;
        os << what[j] << " differs at element " << i << ": device 0x" << std::hex << got[5 * i + j] << ", host 0x"
           << want[j];
        return os.str();
      }
    }
  }
  return "";
}

}  // namespace kiln::cuda
