// How scatter combines each write with its element, shared by the CPU and CUDA kernels: the same
// operations in the same (index) order give the same bits on both.
#pragma once
#include <cstdint>

#include "base/macros.h"
#include "kernels/backend.h"

namespace kiln::scatter {

// acc (op) s. amax/amin propagate NaN (from either side), as PyTorch's scatter_reduce.
template <typename A> KILN_HD A combine(ScatterOp op, A acc, A s) {
  switch (op) {
    case ScatterOp::assign: return s;
    case ScatterOp::mul: return acc * s;
    case ScatterOp::amax:
      if (acc != acc || s != s) return acc != acc ? acc : s;
      return s > acc ? s : acc;
    case ScatterOp::amin:
      if (acc != acc || s != s) return acc != acc ? acc : s;
      return s < acc ? s : acc;
    default: return acc + s;  // add, mean
  }
}

// One element after `hits` writes: acc (the running value) becomes the mean where asked.
template <typename A> KILN_HD A finish(ScatterOp op, bool include_self, A acc, int64_t hits) {
  if (op == ScatterOp::mean && hits > 0) return acc / A(hits + (include_self ? 1 : 0));
  return acc;
}

}  // namespace kiln::scatter
