// The autocast policy table and the per-thread autocast state.
#include "engine/autocast.h"

#include "base/error.h"
#include "engine/ops.h"

namespace kiln::amp {
namespace {

using P = CastPolicy;
using O = AutocastOp;
constexpr AutocastRule kRules[] = {
    {O::matmul, "matmul", P::lower,
     "GEMM: 16-bit inputs, f32 accumulation (Tensor Cores on GPU); also bmm and baddbmm, whose added input is cast "
     "too, so the output stays 16-bit"},
    {O::linear, "linear", P::lower, "GEMM + bias; the bias is cast too, so the output stays 16-bit"},
    {O::conv2d, "conv2d", P::lower,
     "implicit GEMM: 16-bit inputs, f32 accumulation; also conv_transpose2d, and conv1d/conv3d through it (conv3d sums "
     "its depth planes in f32)"},
    {O::softmax, "softmax", P::fp32, "exp of large logits overflows f16"},
    {O::log_softmax, "log_softmax", P::fp32, "as softmax"},
    {O::layer_norm, "layer_norm, group_norm, instance_norm, rms_norm, local_response_norm", P::fp32,
     "mean and variance of a row need f32; its output feeds the residual stream"},
    {O::cross_entropy, "cross_entropy", P::fp32, "losses are reductions over many terms"},
    {O::nll_loss, "nll_loss, ctc_loss", P::fp32, "as cross_entropy"},
    {O::mse_loss, "mse_loss, l1_loss, smooth_l1_loss, huber_loss", P::fp32, "squares overflow f16"},
    {O::binary_cross_entropy_with_logits, "binary_cross_entropy(_with_logits)", P::fp32, "as cross_entropy"},
    {O::batch_norm, "batch_norm", P::native, "statistics and running buffers in f32; output in the input's dtype"},
    {O::embedding, "embedding", P::native, "a gather: the f32 table gives f32 rows"},
    {O::dropout, "dropout", P::native, "mask and scale in the input's dtype"},
    {O::pooling, "max/avg/adaptive pooling", P::native, "f32 sums inside, output in the input's dtype"},
    {O::elementwise, "elementwise and data movement (add, mul, relu, gelu, pad, gather, cat, ...)", P::native,
     "computed in f32, stored in the input's dtype; mixed dtypes promote (f16 + f32 -> f32)"},
    {O::reductions, "sum, mean, max, ...", P::native,
     "sums accumulate in f64 on the CPU; the result keeps the input's dtype"},
    {O::attention, "scaled_dot_product_attention, attention", P::lower,
     "its two products are GEMMs; the softmax between them computes in f32"},
};
static_assert(sizeof(kRules) / sizeof(kRules[0]) == size_t(O::attention) + 1, "one rule per AutocastOp");

constexpr bool rules_in_order() {
  for (size_t i = 0; i < sizeof(kRules) / sizeof(kRules[0]); ++i)
    if (size_t(kRules[i].op) != i) return false;
  return true;
}
static_assert(rules_in_order(), "kRules must list the ops in AutocastOp order");

thread_local std::optional<DType> t_autocast;

}  // namespace

std::span<const AutocastRule> autocast_policy() { return kRules; }

const char* policy_name(CastPolicy p) {
  switch (p) {
    case P::lower: return "lower";
    case P::fp32: return "fp32";
    case P::native: return "native";
  }
  return "?";
}

std::optional<DType> autocast_dtype() { return t_autocast; }

AutocastGuard::AutocastGuard(DType dtype, bool enabled) : prev_(t_autocast) {
  KILN_CHECK(!enabled || is_low_precision(dtype), "AutocastGuard: the autocast dtype must be f16 or bf16, got ",
             dtype);
  t_autocast = enabled ? std::optional<DType>(dtype) : std::nullopt;
}

AutocastGuard::~AutocastGuard() { t_autocast = prev_; }

Tensor autocast_arg(AutocastOp op, const Tensor& t) {
  if (!t_autocast || !t.defined() || !is_floating(t.dtype())) return t;
  switch (kRules[size_t(op)].policy) {
    case P::lower:  // f64 stays f64: it asks for precision on purpose (gradient checks)
      return t.dtype() == *t_autocast || t.dtype() == DType::f64 ? t : cast(t, *t_autocast);
    case P::fp32: return is_low_precision(t.dtype()) ? cast(t, DType::f32) : t;
    case P::native: return t;
  }
  return t;
}

}  // namespace kiln::amp
