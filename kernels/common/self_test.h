// `kiln doctor`'s device self-test: the rows of kernels/common's scalar math a GPU computes
// (self_test_row, run by a kernel in kernels/cuda/runtime_info.cu) and the rule that compares them
// with the host's, here so the CPU tests cover the rule.
#pragma once
#include <cstdint>
#include <sstream>
#include <string>

#include "base/half.h"
#include "kernels/common/math.h"
#include "kernels/common/philox.h"

namespace kiln {

constexpr int kSelfTestWords = 5;

// Element i: philox lane i%4 of block i/4 (seed 42), the f16 and bf16 bits of x_i, f16 pattern
// i*61 widened to f32 (it sweeps the NaN patterns with payloads too), and gelu(x_i).
KILN_HD void self_test_row(int i, uint32_t* out) {
  const U32x4 r = philox_block(42, uint64_t(i) / 4);
  const float x = (float(i) - 512.0f) * 0.03125f;
  out[0] = r.v[i % 4];
  out[1] = f32_to_f16_bits(x * 1.001f);
  out[2] = f32_to_bf16_bits(x * 1.001f);
  out[3] = f32_bits(f16_bits_to_f32(uint16_t(i * 61)));
  out[4] = f32_bits(float(math::gelu_erf(double(x))));
}

inline bool self_test_is_nan(uint32_t f32) { return (f32 & 0x7f800000u) == 0x7f800000u && (f32 & 0x7fffffu) != 0; }

// "" when the device's n rows (`got`, kSelfTestWords words each) are the host's: bit for bit,
// except erf (libm and the device may differ by an ulp) and NaN (a device widening f16 returns the
// canonical NaN where the host keeps the payload: any NaN matches any NaN). Else the first mismatch.
inline std::string self_test_mismatch(const uint32_t* got, int n) {
  const char* what[kSelfTestWords] = {"philox", "f32->f16", "f32->bf16", "f16->f32", "gelu_erf"};
  for (int i = 0; i < n; ++i) {
    uint32_t want[kSelfTestWords];
    self_test_row(i, want);
    for (int j = 0; j < kSelfTestWords; ++j) {
      const uint32_t g = got[kSelfTestWords * i + j];
      const int64_t diff = int64_t(g) - int64_t(want[j]);
      if (diff == 0 || (j == 4 && diff >= -1 && diff <= 1)) continue;
      if (j == 3 && self_test_is_nan(g) && self_test_is_nan(want[j])) continue;
      std::ostringstream os;
      os << what[j] << " differs at element " << i << ": device 0x" << std::hex << g << ", host 0x" << want[j];
      return os.str();
    }
  }
  return "";
}

}  // namespace kiln
