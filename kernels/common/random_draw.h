// Kiln's random fills as one function of a Philox block, shared by the CPU and CUDA kernels: element
// i of a fill uses lane i % 4 of block offset/4 + i/4. The affine maps are explicit fused
// multiply-adds (one rounding on both devices, whatever the compiler contracts), so uniform and
// Bernoulli draws are bit-identical on CPU and GPU; normal draws go through log/cos/sin, whose last
// bit may differ between libm and CUDA. A uniform draw keeps as many random bits as the output dtype's
// significand holds (uniform_bits): 24 for f32 and f64 (the same stream for both), 11 for f16 and 8 for
// bf16, so that [0, 1) draws stay below 1 once stored (24 bits rounded to nearest reach 1.0 in f16/bf16).
#pragma once
#include <cmath>

#include "kernels/backend.h"
#include "kernels/common/philox.h"

namespace kiln {

KILN_HD int uniform_bits(DType dt) { return dt == DType::f16 ? 11 : dt == DType::bf16 ? 8 : 24; }

KILN_HD void random_draw4(RandomKind kind, const U32x4& r, double p0, double p1, float v[4], int bits = 24) {
  if (kind == RandomKind::normal) {
    philox_normal4(r, v);
    for (int l = 0; l < 4; ++l) v[l] = float(std::fma(p1, double(v[l]), p0));  // mean p0, std p1
  } else if (kind == RandomKind::uniform) {
    for (int l = 0; l < 4; ++l)
      v[l] = float(std::fma(p1 - p0, double(u32_to_uniform_bits(r.v[l], bits)), p0));  // [p0, p1)
  } else {
    for (int l = 0; l < 4; ++l) v[l] = double(u32_to_uniform(r.v[l])) < p0 ? 1.0f : 0.0f;  // probability p0
  }
}

}  // namespace kiln
