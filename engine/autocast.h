// Autocast: inside an AutocastGuard(f16 or bf16), the GEMM ops (matmul, linear, conv2d, and so the
// attention products) run on 16-bit inputs with f32 accumulation, while softmax, layer norm and the
// losses run in f32. The policy is the table below (and docs/amp.md, which a test keeps in step).
#pragma once
#include <cstdint>
#include <optional>
#include <span>

#include "engine/tensor.h"

namespace kiln::amp {

enum class CastPolicy : uint8_t {
  lower,   // floating inputs cast to the autocast dtype; the output is in it
  fp32,    // 16-bit inputs cast to f32; the output is f32
  native,  // no cast: runs in its input's dtype (16-bit storage, f32 math inside), mixed inputs promote
};

enum class AutocastOp : uint8_t {
  matmul,
  linear,
  conv2d,
  softmax,
  log_softmax,
  layer_norm,
  cross_entropy,
  nll_loss,
  mse_loss,
  binary_cross_entropy_with_logits,
  batch_norm,
  embedding,
  dropout,
  pooling,
  elementwise,
  reductions,
  attention,
};

struct AutocastRule {
  AutocastOp op;
  const char* name;
  CastPolicy policy;
  const char* why;
};
// Every rule, in AutocastOp order.
std::span<const AutocastRule> autocast_policy();
const char* policy_name(CastPolicy p);

// The dtype autocast casts to on this thread, or nullopt when autocast is off. Backward passes run
// with autocast off: gradients take the dtypes the forward chose.
std::optional<DType> autocast_dtype();

// RAII: turns autocast on (f16 or bf16) or off (enabled = false) for this thread; nests.
class AutocastGuard {
 public:
  explicit AutocastGuard(DType dtype, bool enabled = true);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  std::optional<DType> prev_;
};

// What `op` computes on in place of the floating tensor `t` under the current autocast state:
// `t` itself when autocast is off, `t` is undefined or not floating, or the policy keeps it.
// The cast is differentiable, so gradients reach f32 master weights in f32.
Tensor autocast_arg(AutocastOp op, const Tensor& t);

}  // namespace kiln::amp
