// The CPU row of the backend table.
#include "base/error.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/ops_cpu.h"

namespace kiln {
namespace {

void gemm_any(DType dtype, bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const void* a, int64_t lda,
              const void* b, int64_t ldb, double beta, void* c, int64_t ldc) {
  if (dtype == DType::f32) {
    cpu::gemm_f32(ta, tb, m, n, k, float(alpha), static_cast<const float*>(a), lda, static_cast<const float*>(b), ldb,
                  float(beta), static_cast<float*>(c), ldc);
  } else if (dtype == DType::f64) {
    cpu::gemm_f64(ta, tb, m, n, k, alpha, static_cast<const double*>(a), lda, static_cast<const double*>(b), ldb, beta,
                  static_cast<double*>(c), ldc);
  } else {
    KILN_FAIL("gemm: the CPU computes f32 and f64 only, got ", dtype);
  }
}

}  // namespace

const Backend& cpu_backend() {
  static const Backend b{
      .name = "cpu",
      .copy = cpu::copy,
      .fill = cpu::fill,
      .arange = cpu::arange,
      .unary = cpu::unary,
      .binary = cpu::binary,
      .where = cpu::where,
      .reduce = cpu::reduce,
      .gemm = gemm_any,
      .gemm_batched = nullptr,
      .random = cpu::random,
      .conv2d_forward = cpu::conv2d_forward,
      .conv2d_backward = cpu::conv2d_backward,
      .max_pool2d_forward = cpu::max_pool2d_forward,
      .max_pool2d_backward = cpu::max_pool2d_backward,
      .avg_pool2d_forward = cpu::avg_pool2d_forward,
      .avg_pool2d_backward = cpu::avg_pool2d_backward,
      .softmax_forward = cpu::softmax_forward,
      .softmax_backward = cpu::softmax_backward,
      .masked_softmax_forward = cpu::masked_softmax_forward,
      .masked_softmax_backward = cpu::masked_softmax_backward,
      .layer_norm_forward = cpu::layer_norm_forward,
      .layer_norm_backward = cpu::layer_norm_backward,
      .batch_norm_forward = cpu::batch_norm_forward,
      .batch_norm_backward = cpu::batch_norm_backward,
      .cross_entropy = cpu::cross_entropy,
      .index_select = cpu::index_select,
      .index_add = cpu::index_add,
      .gather = cpu::gather,
      .scatter_add = cpu::scatter_add,
      .unscale_check = cpu::unscale_check,
      .optimizer_step = cpu::optimizer_step,
  };
  return b;
}

}  // namespace kiln
