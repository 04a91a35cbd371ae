// make_nccl_communicator in a build without the CUDA backend: it says so.
#include "base/error.h"
#include "runtime/nccl_comm.h"

#if !defined(KILN_WITH_CUDA)
namespace kiln::cuda {
std::unique_ptr<dist::Communicator> make_nccl_communicator(dist::Communicator&, int device, std::chrono::seconds) {
  KILN_FAIL("NCCL communicator for cuda:", device, ": this build of Kiln has no CUDA backend (configured with "
            "KILN_CUDA=OFF or without nvcc, cuDNN and NCCL); use --device cpu, or rebuild with the CUDA toolkit installed");
}
}  // namespace kiln::cuda
#endif
