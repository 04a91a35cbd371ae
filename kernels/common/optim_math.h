// The per-element arithmetic of the fused optimizer steps, shared by the CPU and CUDA kernels so
// both devices update a weight with the same f32 operations in the same order (the order of the
// unfused tensor-op versions in engine/optim.cpp).
//
// Every a * b + c is written as an explicit fused multiply-add (fmaf: one rounding) and no other
// sum is left where a product could be fused into it: nvcc contracts a * b + c into an FMA by
// default and the host compiler does where the target has FMA (GCC's default for C++), each at
// places of its own choosing, so the two devices differed in the last bit. Written out, both
// compute the same bits. (The unfused tensor ops round the product apart: they agree to an ulp.)
#pragma once
#include <math.h>

#include <cmath>

#include "base/macros.h"
#include "kernels/backend.h"
#include "kernels/common/optim_consts.h"

namespace kiln::optim_math {

// clang-format off: the functions, shared with the CPU kernel sets
#include "kernels/common/optim_math.inc"
// clang-format on

}  // namespace kiln::optim_math
