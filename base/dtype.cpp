// DType names, sizes and the promotion lattice; Device parsing and printing.
#include "base/dtype.h"

#include "base/error.h"

namespace kiln {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: case DType::i32: return 4;
    case DType::f16: case DType::bf16: return 2;
    case DType::f64: case DType::i64: return 8;
    case DType::u8:
    case DType::i8:
    case DType::boolean: return 1;
    case DType::i16: return 2;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::f64: return "f64";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::u8: return "u8";
    case DType::boolean: return "bool";
    case DType::i8: return "i8";
    case DType::i16: return "i16";
  }
  return "?";
}

DType dtype_from_name(const std::string& n) {
  if (n == "f32" || n == "float32" || n == "float" || n == "F32") return DType::f32;
  if (n == "f16" || n == "float16" || n == "half" || n == "fp16" || n == "F16") return DType::f16;
  if (n == "bf16" || n == "bfloat16" || n == "BF16") return DType::bf16;
  if (n == "f64" || n == "float64" || n == "double" || n == "F64") return DType::f64;
  if (n == "i32" || n == "int32" || n == "I32") return DType::i32;
  if (n == "i64" || n == "int64" || n == "long" || n == "I64") return DType::i64;
  if (n == "u8" || n == "uint8" || n == "U8") return DType::u8;
  if (n == "i8" || n == "int8" || n == "I8") return DType::i8;
  if (n == "i16" || n == "int16" || n == "short" || n == "I16") return DType::i16;
  if (n == "bool" || n == "BOOL") return DType::boolean;
  KILN_FAIL("unknown dtype '", n, "' (expected one of f32 f16 bf16 f64 i64 i32 i16 i8 u8 bool)");
}

namespace {
int rank_of(DType t) {
  switch (t) {
    case DType::boolean: return 0;
    case DType::u8:
    case DType::i8: return 1;
    case DType::i16: return 2;
    case DType::i32: return 3;
    case DType::i64: return 4;
    case DType::f16:
    case DType::bf16: return 5;
    case DType::f32: return 6;
    case DType::f64: return 7;
  }
  return 0;
}
}  // namespace

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  if (is_low_precision(a) && is_low_precision(b)) return DType::f32;
  if ((a == DType::u8 && b == DType::i8) || (a == DType::i8 && b == DType::u8)) return DType::i16;
  return rank_of(a) >= rank_of(b) ? a : b;
}

std::ostream& operator<<(std::ostream& os, DType t) { return os << dtype_name(t); }

std::string Device::str() const { return is_cpu() ? "cpu" : is_meta() ? "meta" : "cuda:" + std::to_string(index); }

Device Device::parse(const std::string& s) {
  if (s == "cpu") return kCPU;
  if (s == "meta") return kMeta;
  if (s == "cuda" || s == "gpu") return cuda_device(0);
  if (s.rfind("cuda:", 0) == 0) {
    const std::string idx = s.substr(5);
    KILN_CHECK(!idx.empty() && idx.find_first_not_of("0123456789") == std::string::npos && idx.size() < 6,
               "bad device '", s, "': expected cpu, cuda, cuda:N or meta");
    return cuda_device(std::stoi(idx));
  }
  KILN_FAIL("bad device '", s, "': expected cpu, cuda, cuda:N or meta");
}

std::ostream& operator<<(std::ostream& os, const Device& d) { return os << d.str(); }

}  // namespace kiln
