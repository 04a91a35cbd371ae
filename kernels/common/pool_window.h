// The input window of one pooling output, shared by the CPU and CUDA pooling kernels
// (kernels/cpu/pool.cpp, kernels/cuda/pool.cu): which rows and columns it visits and the divisor of
// average pooling, with the count of valid positions in closed form.
#pragma once
#include <cstdint>

#include "base/macros.h"
#include "kernels/backend.h"

namespace kiln {

struct PoolWindow {
  int64_t h0, h1, w0, w1;  // visited rows h0, h0 + step_h, ... < h1 (negative ones skipped); columns alike
  int64_t step_h, step_w;
  int64_t count;           // divisor for average pooling
};

KILN_HD PoolWindow pool_window(const Pool2dParams& p, int64_t oh, int64_t ow) {
  auto lesser = [](int64_t a, int64_t b) { return a < b ? a : b; };
  PoolWindow w;
  if (p.adaptive) {  // window i spans floor(i*H/OH) .. ceil((i+1)*H/OH)
    w.h0 = (oh * p.h) / p.oh;
    w.h1 = ((oh + 1) * p.h + p.oh - 1) / p.oh;
    w.w0 = (ow * p.w) / p.ow;
    w.w1 = ((ow + 1) * p.w + p.ow - 1) / p.ow;
    w.step_h = w.step_w = 1;
    w.count = (w.h1 - w.h0) * (w.w1 - w.w0);
    return w;
  }
  const int64_t hs = oh * p.sh - p.ph, ws = ow * p.sw - p.pw;
  const int64_t he = lesser(hs + (p.kh - 1) * p.dh + 1, p.h + p.ph), we = lesser(ws + (p.kw - 1) * p.dw + 1, p.w + p.pw);
  w.h0 = hs;
  w.h1 = lesser(he, p.h);
  w.w0 = ws;
  w.w1 = lesser(we, p.w);
  w.step_h = p.dh;
  w.step_w = p.dw;
  if (p.count_include_pad) {
    w.count = ((he - hs + p.dh - 1) / p.dh) * ((we - ws + p.dw - 1) / p.dw);
  } else {  // positions a, a + s, ... < b that are >= 0
    auto valid = [](int64_t a, int64_t b, int64_t s) {
      if (a < 0) a += ((-a + s - 1) / s) * s;
      return a < b ? (b - a + s - 1) / s : int64_t(0);
    };
    w.count = valid(w.h0, w.h1, p.dh) * valid(w.w0, w.w1, p.dw);
  }
  if (p.divisor > 0) w.count = p.divisor;
  return w;
}

}  // namespace kiln
