// CUDA runtime queries for `kiln doctor`, and the device self-test that runs kernels/common's
// scalar math on the device (its kernel: self_test.cu) so a user can see the GPU computes what the
// CPU reference does.
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <link.h>
#include <nccl.h>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "base/error.h"
#include "base/half.h"
#include "kernels/common/math.h"
#include "kernels/common/philox.h"
#include "kernels/common/self_test.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/runtime_info.h"
#include "kiln_build_info.h"

namespace kiln::cuda {
namespace {

std::string err(cudaError_t e) { return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e); }

// The path the loader found a library at, from the list of loaded objects (dladdr on a function
// would name the executable when it holds a PLT stub for it).
std::string loaded_path(const char* stem) {
  struct Find {
    const char* stem;
    std::string path;
  } f{stem, ""};
  dl_iterate_phdr(
      [](dl_phdr_info* i, size_t, void* data) {
        auto* f = static_cast<Find*>(data);
        const std::string name = i->dlpi_name ? i->dlpi_name : "";
        const size_t slash = name.rfind('/');
        if (name.compare(slash == std::string::npos ? 0 : slash + 1, std::string(f->stem).size(), f->stem) != 0) return 0;
        f->path = name;
        return 1;
      },
      &f);
  return f.path;
}

void query_libraries(RuntimeInfo& info) {
  info.cublas.version = int(cublasLtGetVersion());
  info.cublas.header_version = CUBLAS_VERSION;
  info.cublas.cuda_version = int(cublasLtGetCudartVersion());
  info.cublas.path = loaded_path("libcublasLt.so");
  info.cudnn.version = int(cudnnGetVersion());
  info.cudnn.header_version = CUDNN_VERSION;
  info.cudnn.cuda_version = int(cudnnGetCudartVersion());
  info.cudnn.path = loaded_path("libcudnn.so");
  int v = 0;
  if (ncclGetVersion(&v) == ncclSuccess) info.nccl.version = v;
  info.nccl.header_version = NCCL_VERSION_CODE;
  info.nccl.path = loaded_path("libnccl.so");
}

std::string nccl_error(const char* call, ncclResult_t r) {
  const std::string last = ncclGetLastError(nullptr);
  return std::string(call) + ": " + ncclGetErrorString(r) + (last.empty() ? "" : " (" + last + ")");
}

// NCCL's single-process mode over GPUs 0..n-1: every resource it takes, released however the
// check ends. A hung collective is aborted rather than destroyed, which would wait for it.
struct NcclRun {
  std::vector<ncclComm_t> comms;
  std::vector<cudaStream_t> streams;
  std::vector<float*> bufs;
  bool abort = false;
  explicit NcclRun(int n) : comms(n, nullptr), streams(n, nullptr), bufs(n, nullptr) {}
  ~NcclRun() {
    for (ncclComm_t c : comms) {
      if (c && abort) ncclCommAbort(c);
      if (c && !abort) ncclCommDestroy(c);
    }
    for (size_t d = 0; d < bufs.size(); ++d) {
      cudaSetDevice(int(d));
      if (bufs[d]) cudaFree(bufs[d]);
      if (streams[d]) cudaStreamDestroy(streams[d]);
    }
  }
};

// One small sum all-reduce across every visible GPU: NCCL loads, sees the devices and its
// transports (P2P, shared memory) work. Returns "" when each GPU got the right sum, else why.
std::string nccl_all_reduce_check(int n) {
  constexpr int count = 1024;
  constexpr auto limit = std::chrono::seconds(30);
  NcclRun run(n);
  std::vector<int> devs(n);
  for (int d = 0; d < n; ++d) devs[d] = d;
  ncclResult_t r = ncclCommInitAll(run.comms.data(), n, devs.data());
  if (r != ncclSuccess) {
    run.comms.assign(n, nullptr);  // may be half-made: leaking them beats destroying garbage
    return nccl_error("ncclCommInitAll", r);
  }
  for (int d = 0; d < n; ++d) {
    const std::vector<float> ones(count, float(d + 1));
    cudaError_t e = cudaSetDevice(d);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&run.streams[d], cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaMalloc(&run.bufs[d], count * sizeof(float));
    if (e == cudaSuccess) e = cudaMemcpy(run.bufs[d], ones.data(), count * sizeof(float), cudaMemcpyHostToDevice);
    if (e != cudaSuccess) return "GPU " + std::to_string(d) + ": " + err(e);
  }
  ncclGroupStart();
  for (int d = 0; d < n; ++d) {
    r = ncclAllReduce(run.bufs[d], run.bufs[d], count, ncclFloat, ncclSum, run.comms[d], run.streams[d]);
    if (r != ncclSuccess) break;
  }
  const ncclResult_t g = ncclGroupEnd();
  if (r != ncclSuccess) return nccl_error("ncclAllReduce", r);
  if (g != ncclSuccess) return nccl_error("ncclGroupEnd", g);
  // Poll rather than synchronize: a broken transport hangs the collective instead of failing it.
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (int d = 0; d < n;) {
    const cudaError_t e = cudaStreamQuery(run.streams[d]);
    if (e == cudaSuccess) {
      ++d;
      continue;
    }
    if (e == cudaErrorNotReady) (void)cudaGetLastError();  // left as the last error too (query_done says why)
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(run.comms[d], &async);
    if (e != cudaErrorNotReady || async != ncclSuccess || std::chrono::steady_clock::now() > deadline) {
      run.abort = true;
      if (async != ncclSuccess) return nccl_error("all-reduce", async);
      if (e != cudaErrorNotReady) return "GPU " + std::to_string(d) + ": " + err(e);
      return "the all-reduce did not finish within " + std::to_string(limit.count()) + " s";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const float want = float(n) * float(n + 1) / 2;
  for (int d = 0; d < n; ++d) {
    std::vector<float> got(count);
    cudaSetDevice(d);
    const cudaError_t e = cudaMemcpy(got.data(), run.bufs[d], count * sizeof(float), cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) return "GPU " + std::to_string(d) + ": " + err(e);
    for (float x : got)
      if (x != want)
        return "GPU " + std::to_string(d) + ": the all-reduce returned " + std::to_string(x) + ", expected " +
               std::to_string(want);
  }
  return "";
}

}  // namespace

RuntimeInfo query_runtime(bool check_libraries) {
  RuntimeInfo info;
  info.compiled = true;
  info.archs = KILN_CUDA_ARCHS;
  cudaRuntimeGetVersion(&info.runtime_version);
  if (cudaDriverGetVersion(&info.driver_version) != cudaSuccess) info.driver_version = 0;
  std::ifstream proc("/proc/driver/nvidia/version");
  std::stringstream text;
  text << proc.rdbuf();
  info.driver_string = parse_nvidia_driver_version(text.str());
  query_libraries(info);
  cudaError_t e = cudaGetDeviceCount(&info.device_count);
  if (e != cudaSuccess) {
    info.device_count = 0;
    info.error = err(e);
    return info;
  }
  const SavedContext keep;  // the free-memory query makes each device current in turn; the caller's goes back
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
    di.code = match_arch(info.archs, p.major, p.minor);
    if (cudaSetDevice(d) == cudaSuccess) {
      size_t fr = 0, tot = 0;
      if (cudaMemGetInfo(&fr, &tot) == cudaSuccess) di.free_bytes = fr;
    }
    info.devices.push_back(di);
  }
  const int n = info.device_count;
  info.p2p.assign(n, std::vector<bool>(n, true));
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) {
      int can = 0;
      if (i != j) info.p2p[i][j] = cudaDeviceCanAccessPeer(&can, i, j) == cudaSuccess && can;
    }
  if (n > 0 && check_libraries) {
    // The handles Kiln's context creates; cuDNN's loads its sub-libraries, the usual failure.
    cudaSetDevice(0);
    info.cublas.checked = info.cudnn.checked = info.nccl.checked = true;
    cublasLtHandle_t lt = nullptr;
    const cublasStatus_t bs = cublasLtCreate(&lt);
    if (bs == CUBLAS_STATUS_SUCCESS) {
      cublasLtDestroy(lt);
    } else {
      info.cublas.error = std::string("cublasLtCreate: ") + cublasLtGetStatusName(bs) + ": " + cublasLtGetStatusString(bs);
    }
    cudnnHandle_t dnn = nullptr;
    const cudnnStatus_t ds = cudnnCreate(&dnn);
    if (ds == CUDNN_STATUS_SUCCESS) {
      cudnnDestroy(dnn);
    } else {
      char last[512] = "";
      cudnnGetLastErrorString(last, sizeof last);
      info.cudnn.error = std::string("cudnnCreate: ") + cudnnGetErrorString(ds) + (last[0] ? std::string(" (") + last + ")" : "");
    }
    info.nccl.error = nccl_all_reduce_check(n);
  }
  return info;
}

std::string device_self_test(int index) {
  constexpr int n = 1024;
  cudaError_t e = cudaSetDevice(index);
  if (e != cudaSuccess) return err(e);
  uint32_t* d_out = nullptr;
  if ((e = cudaMalloc(&d_out, kSelfTestWords * n * sizeof(uint32_t))) != cudaSuccess) return err(e);
  std::string launch_error;
  try {
    launch_self_test(d_out, n);  // self_test.cu
  } catch (const Error& x) {
    launch_error = x.what();
  }
  std::vector<uint32_t> got(kSelfTestWords * n);
  if (!launch_error.empty()) {
    cudaFree(d_out);
    return launch_error;
  }
  e = cudaGetLastError();
  if (e == cudaSuccess) e = cudaMemcpy(got.data(), d_out, got.size() * sizeof(uint32_t), cudaMemcpyDeviceToHost);
  cudaFree(d_out);
  if (e != cudaSuccess) return err(e);
  return self_test_mismatch(got.data(), n);
}

}  // namespace kiln::cuda
