// Helpers shared by the CPU kernels of the nn ops (pool, softmax, layer_norm, batch_norm,
// cross_entropy and index .cpp): the f32/f64 dispatch, the void* casts and the fixed-lane row sums.
// Statistics accumulate in f64; every loop that sums over rows runs in a fixed order.
#pragma once
#include <cstdint>
#include <type_traits>

#include "kernels/common/dispatch.h"
#include "kernels/cpu/ops_cpu.h"

namespace kiln::cpu::nn_detail {

template <typename Fn> void dispatch_float(DType dt, const char* op, Fn&& fn) {
  dispatch_one_of<float, double>(dt, "cpu", op, fn);
}

template <typename T> const T* cp(const void* p) { return static_cast<const T*>(p); }
template <typename T> T* mp(void* p) { return static_cast<T*>(p); }

// Per-row sums in a fixed lane order (16 independent accumulators the compiler keeps in one vector
// register), added up in double per row: fast, and the same bits whatever the thread count.
template <typename T> using LaneAcc = std::conditional_t<std::is_same_v<T, double>, double, float>;
inline constexpr int kLanes = 16;

template <typename T, typename F> double lane_sum(int64_t hw, F&& term) {
  using A = LaneAcc<T>;
  A acc[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= hw; j += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += term(j + l);
  double s = 0;
  for (; j < hw; ++j) s += double(term(j));
  for (int l = 0; l < kLanes; ++l) s += double(acc[l]);
  return s;
}

}  // namespace kiln::cpu::nn_detail
