// Dimension merging for elementwise kernels, shared by the CPU loops (kernels/cpu/loops.h) and the
// CUDA elementwise kernels (kernels/cuda/elementwise.cu): N operands of one shape (operand 0 is
// the output; broadcast dims have stride 0) become as few dims as they can.
#pragma once
#include <cstdint>

#include "kernels/backend.h"

namespace kiln {

template <int N> struct MergedDims {
  int ndim = 0;  // 0 when every dim has size 1 (a single element)
  int64_t numel = 1;
  int64_t shape[kMaxKernelDims] = {};
  int64_t stride[N][kMaxKernelDims] = {};  // element strides per operand
};

// Keeps the dims of size > 1, outermost first in the output's stride order (a contiguous output
// keeps its order; a permuted dense one such as channels_last runs as long rows again), and merges
// a dim into the one inside it when every operand steps over the pair as over one longer row
// (outer stride == inner stride * inner size; two broadcast dims merge too).
template <int N> MergedDims<N> merge_dims(const TensorDesc* const (&ds)[N]) {
  MergedDims<N> g;
  const TensorDesc& d0 = *ds[0];
  g.numel = d0.numel();
  // An insertion sort by the output's strides, descending: stable, and no allocation per op.
  int order[kMaxKernelDims];
  for (int i = 0; i < d0.ndim; ++i) {
    int j = i;
    for (; j > 0 && d0.strides[order[j - 1]] < d0.strides[i]; --j) order[j] = order[j - 1];
    order[j] = i;
  }
  for (int oi = 0; oi < d0.ndim; ++oi) {
    const int i = order[oi];
    if (d0.shape[i] == 1) continue;
    bool merge = g.ndim > 0;
    for (int k = 0; k < N && merge; ++k) merge = ds[k]->strides[i] * d0.shape[i] == g.stride[k][g.ndim - 1];
    if (merge) {
      for (int k = 0; k < N; ++k) g.stride[k][g.ndim - 1] = ds[k]->strides[i];
      g.shape[g.ndim - 1] *= d0.shape[i];
    } else {
      for (int k = 0; k < N; ++k) g.stride[k][g.ndim] = ds[k]->strides[i];
      g.shape[g.ndim] = d0.shape[i];
      ++g.ndim;
    }
  }
  return g;
}

}  // namespace kiln
