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
  static const Backend b = [] {
    Backend t{};
    t.name = "cpu";
    t.gemm = gemm_any;
    t.gemm_batched = nullptr;  // the engine loops over gemm
#define KILN_KERNEL(name, params) t.name = cpu::name;
#include "kernels/kernel_list.h"
#undef KILN_KERNEL
    return t;
  }();
  return b;
}

}  // namespace kiln
