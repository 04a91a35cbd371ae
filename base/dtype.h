// Element types, devices and the promotion rule for mixed-dtype arithmetic.
// f16 and bf16 are stored as 16 bits everywhere and computed in f32 on the CPU.
#pragma once
#include <cstdint>
#include <ostream>
#include <string>

#include "base/half.h"

namespace kiln {

// New dtypes go at the end: the numbers are stable (Python, DLPack tables and tests index them).
enum class DType : uint8_t { f32, f16, bf16, f64, i32, i64, u8, boolean, i8, i16 };
constexpr int kNumDTypes = 10;

size_t dtype_size(DType t);
const char* dtype_name(DType t);
DType dtype_from_name(const std::string& name);  // "f32", "float32", "bf16", "bool", ...
inline bool is_floating(DType t) { return t == DType::f32 || t == DType::f16 || t == DType::bf16 || t == DType::f64; }
inline bool is_low_precision(DType t) { return t == DType::f16 || t == DType::bf16; }
inline bool is_integral(DType t) { return !is_floating(t); }  // bool counts as integral
// The type both operands convert to: bool < (u8 | i8) < i16 < i32 < i64 < (f16 | bf16) < f32 < f64;
// u8 with i8 gives i16 (the smallest type holding both), f16 with bf16 gives f32.
DType promote_types(DType a, DType b);
// Whether an in-place op may write a result of type `from` into a tensor of type `to` (PyTorch's rule):
// not floating into integral, not anything but bool into bool.
inline bool can_cast(DType from, DType to) {
  return to == DType::boolean ? from == DType::boolean : is_floating(to) || !is_floating(from);
}
std::ostream& operator<<(std::ostream& os, DType t);

template <typename T> struct DTypeOf;
template <> struct DTypeOf<float> { static constexpr DType value = DType::f32; };
template <> struct DTypeOf<double> { static constexpr DType value = DType::f64; };
template <> struct DTypeOf<Half> { static constexpr DType value = DType::f16; };
template <> struct DTypeOf<BFloat16> { static constexpr DType value = DType::bf16; };
template <> struct DTypeOf<int32_t> { static constexpr DType value = DType::i32; };
template <> struct DTypeOf<int64_t> { static constexpr DType value = DType::i64; };
template <> struct DTypeOf<uint8_t> { static constexpr DType value = DType::u8; };
template <> struct DTypeOf<int8_t> { static constexpr DType value = DType::i8; };
template <> struct DTypeOf<int16_t> { static constexpr DType value = DType::i16; };
template <> struct DTypeOf<bool> { static constexpr DType value = DType::boolean; };

// Calls fn(T{}) with T the C++ type of `t`.
template <typename Fn> decltype(auto) visit_dtype(DType t, Fn&& fn) {
  switch (t) {
    case DType::f32: return fn(float{});
    case DType::f16: return fn(Half{});
    case DType::bf16: return fn(BFloat16{});
    case DType::f64: return fn(double{});
    case DType::i32: return fn(int32_t{});
    case DType::i64: return fn(int64_t{});
    case DType::u8: return fn(uint8_t{});
    case DType::boolean: return fn(bool{});
    case DType::i8: return fn(int8_t{});
    case DType::i16: return fn(int16_t{});
  }
  return fn(float{});
}

// meta: tensors with a shape, a dtype and strides but no memory; kernels on them do nothing, and
// their bytes are counted (meta_memory_stats). What the memory planner runs models on.
enum class DeviceType : uint8_t { cpu, cuda, meta };
struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;
  bool operator==(const Device&) const = default;
  bool is_cpu() const { return type == DeviceType::cpu; }
  bool is_cuda() const { return type == DeviceType::cuda; }
  bool is_meta() const { return type == DeviceType::meta; }
  std::string str() const;                    // "cpu", "cuda:0", "meta"
  static Device parse(const std::string& s);  // "cpu", "cuda", "cuda:1", "meta"
};
inline const Device kCPU{DeviceType::cpu, 0};
inline const Device kMeta{DeviceType::meta, 0};
inline Device cuda_device(int index = 0) { return Device{DeviceType::cuda, index}; }
std::ostream& operator<<(std::ostream& os, const Device& d);

}  // namespace kiln
