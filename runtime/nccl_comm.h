// The NCCL communicator: collectives between ranks that each drive one GPU. No CUDA headers here;
// builds without CUDA get a version that says so (kernels/cpu/no_cuda.cpp).
#pragma once
#include <chrono>
#include <memory>

#include "engine/dist.h"

namespace kiln::cuda {

// Collectives on tensors of cuda:`device` (CPU tensors are staged through the device), run by NCCL
// on a stream of their own that waits for the compute stream's work and that the compute stream
// waits for when a Work is waited on. Rank 0's NCCL id reaches the others through `bootstrap` (the
// TCP ring or MPI). A collective or the set-up that does not complete within `timeout` ends the job
// with a message, as the CPU communicators do.
std::unique_ptr<dist::Communicator> make_nccl_communicator(dist::Communicator& bootstrap, int device,
                                                           std::chrono::seconds timeout);

}  // namespace kiln::cuda
