// Helpers shared by the engine's op files: kernel descriptors, backend lookup, argument checks.
// Not installed for users.
#pragma once
#include <vector>
#include "base/allocator.h"

#include "engine/tensor.h"
#include "kernels/backend.h"

namespace kiln::detail {

TensorDesc desc(const Tensor& t);
// The view of `t` broadcast to `shape` as a kernel descriptor (stride 0 on broadcast dims).
TensorDesc desc_broadcast(const Tensor& t, const Shape& shape);
const Backend& backend(Device d);
const Backend& meta_backend();  // engine/meta.cpp
Allocator& meta_allocator();
// Tests only: while one lives, CPU tensors run `b`'s kernels instead of the CPU backend's (the
// CUDA kernels under the emulator, kernels/cuda/emulator, on host memory). Not nested; not while
// another thread runs ops.
class BackendOverride {
 public:
  explicit BackendOverride(const Backend& b);
  ~BackendOverride();
  BackendOverride(const BackendOverride&) = delete;
  BackendOverride& operator=(const BackendOverride&) = delete;
};
// Tests only: while one lives, the device cuda:0 is emulated on the host, with or without a GPU:
// its tensors are host memory from `memory`, its kernels are `b`'s (the CUDA kernels under the
// emulator), and copies to and from it are memcpy. The engine's own device paths (uploads, host
// reads, device checks) run as they do on a GPU, so a kernel handed a CPU tensor shows up in CI
// (the emulator checks every pointer a kernel gets). Not nested; not while another thread runs ops.
class DeviceEmulation {
 public:
  DeviceEmulation(const Backend& b, Allocator& memory);
  ~DeviceEmulation();
  DeviceEmulation(const DeviceEmulation&) = delete;
  DeviceEmulation& operator=(const DeviceEmulation&) = delete;
};
// All tensors on one device; names the op and the devices otherwise.
Device common_device(const char* op, const std::vector<Tensor>& ts);
std::vector<int64_t> normalize_dims(const std::vector<int64_t>& dims, int64_t ndim, const char* op);
// A new tensor sharing t's storage with other geometry.
Tensor make_view(const Tensor& t, const Shape& shape, const Shape& strides, int64_t offset);
// Throws when an in-place write to t would break autograd.
void check_inplace(const Tensor& t, const char* op);
// Throws when `value` does not fit t's integer dtype (NaN, inf, out of range): no silent wrap-around.
void check_fill_value(const Tensor& t, double value, const char* op);
// Throws when the result of t op other (their promoted type) cannot be written into t: a float into an int.
void check_inplace_result(const Tensor& t, const Tensor& other, const char* op);
// The operand of an in-place op on t, detached: cloned when it shares memory with t other than as t itself,
// so that no element is read after it was written. Throws when t's elements share memory (an expanded view).
Tensor inplace_operand(const Tensor& t, const Tensor& other, const char* op);
// Throws, naming op, when alpha_fits(t, alpha, subtracts) (engine/ops.h) does not hold.
void check_alpha(const char* op, DType t, double alpha, bool subtracts = false);
// A checked alpha as the kernels of dtype t take it: for an integer t wrapped into t's values (modulo 2^bits),
// so that an i32 x.add_(i64 y, alpha=2**40) multiplies by 0 as PyTorch's i64 sum cast to i32 does.
double alpha_in(DType t, double alpha);
// `r` (a gradient computed in a backward with create_graph) made to depend on `x` with derivative 0, as
// torch's threshold_backward, leaky_relu_backward, hardtanh_backward and max_pool*_backward do on their
// saved input: their masks come from comparisons of x, which record nothing, so without this a second
// backward would find x unused (an error, or None) where torch gives zeros. r itself when x needs no
// gradient.
Tensor with_zero_edge(const Tensor& r, const Tensor& x);

}  // namespace kiln::detail
