// Kiln's random fills as one function of a Philox block, shared by the CPU and CUDA kernels: element
// i of a fill uses lane i % 4 of block offset/4 + i/4. The affine maps are explicit fused
// multiply-adds (one rounding on both devices, whatever the compiler contracts), so uniform and
// Bernoulli draws are bit-identical on CPU and GPU; normal draws go through log/cos/sin, whose last
// bit may differ between libm and CUDA.
#pragma once
#include <cmath>

#include "kernels/backend.h"
#include "kernels/common/philox.h"

namespace kiln {

KILN_HD void random_draw4(RandomKind kind, const U32x4& r, double p0, double p1, float v[4]) {
  if (kind == RandomKind::normal) {
    philox_normal4(r, v);
    for (int l = 0; l < 4; ++l) v[l] = float(std::fma(p1, double(v[l]), p0));  // mean p0, std p1
  } else if (kind == RandomKind::uniform) {
    for (int l = 0; l < 4; ++l) v[l] = float(std::fma(p1 - p0, double(u32_to_uniform(r.v[l])), p0));  // [p0, p1)
  } else {
    for (int l = 0; l < 4; ++l) v[l] = double(u32_to_uniform(r.v[l])) < p0 ? 1.0f : 0.0f;  // probability p0
  }
}

}  // namespace kiln
