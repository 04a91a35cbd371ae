// CUDA elementwise kernels: copy/cast, fill, arange, unary, binary, where and random fills over
// strided, broadcast views, with the CPU's semantics (kernels/cpu/elementwise.cpp, random.cpp).
//
// Every op has two paths. Contiguous same-dtype operands aligned to 16 bytes take the vector path:
// each thread moves 16-byte packs (4 f32, 8 f16/bf16, 2 f64, 16 u8/bool) with one load per operand
// and one store. Everything else takes the strided path: the host first merges dims that are
// contiguous in every operand (so most broadcasts become 2-D), then each thread turns its flat index
// into per-operand offsets. Both are grid-stride loops over the elements; all traffic is one read
// per input element and one write per output element.
//
// The op is a runtime switch inside one kernel per dtype (not one kernel per op and dtype): the
// switch is uniform across a warp, the kernels stay memory-bound, and the binary stays small.
#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/common/dims.h"
#include "kernels/common/int_arith.h"
#include "kernels/common/int_pow.h"
#include "kernels/common/math.h"
#include "kernels/common/random_draw.h"
#include "kernels/cuda/context.h"
#include "kernels/cuda/ops_cuda.h"

namespace kiln::cuda {
namespace {

// ---- geometry ------------------------------------------------------------------------------------

template <int N> bool contiguous(const MergedDims<N>& g) {
  if (g.ndim == 0) return true;
  if (g.ndim > 1) return false;
  for (int k = 0; k < N; ++k)
    if (g.stride[k][0] != 1) return false;
  return true;
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <int N> __device__ __forceinline__ void offsets(const MergedDims<N>& g, int64_t i, int64_t (&off)[N]) {
  for (int k = 0; k < N; ++k) off[k] = 0;
  for (int d = g.ndim - 1; d >= 0; --d) {
    const int64_t s = g.shape[d];
    const int64_t q = i / s, idx = i - q * s;
    i = q;
    for (int k = 0; k < N; ++k) off[k] += idx * g.stride[k][d];
  }
}

// Launch: grid-stride, one thread per element; f gets the element offset of each operand.
template <int N, typename F> __global__ void strided_kernel(MergedDims<N> g, F f) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < g.numel; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t off[N];
    offsets(g, i, off);
    f(off);
  }
}

template <int N, typename F> void launch_strided(const MergedDims<N>& g, const F& f) {
  if (g.numel == 0) return;
  launch("strided_kernel", strided_kernel<N, F>, grid_for(g.numel), kThreads, 0, current().stream, g, f);
}

// 16 bytes of T.
template <typename T> struct alignas(16) Pack {
  static constexpr int n = 16 / int(sizeof(T));
  T v[n];
};

// Launch: grid-stride over 16-byte packs, then over the tail elements; f maps NIN input values
// (DAcc<T>) to one output value. Operands are contiguous, same dtype, 16-byte aligned.
template <typename T, int NIN, typename F>
__global__ void vector_kernel(T* out, const T* in0, const T* in1, int64_t n, F f) {
  constexpr int V = Pack<T>::n;
  const int64_t tid = blockIdx.x * int64_t(blockDim.x) + threadIdx.x, step = int64_t(gridDim.x) * blockDim.x;
  const int64_t npacks = n / V;
  for (int64_t j = tid; j < npacks; j += step) {
    const Pack<T> a = reinterpret_cast<const Pack<T>*>(in0)[j];
    Pack<T> b, o;
    if constexpr (NIN == 2) b = reinterpret_cast<const Pack<T>*>(in1)[j];
#pragma unroll
    for (int e = 0; e < V; ++e) {
      if constexpr (NIN == 1) {
        st(&o.v[e], f(ld(&a.v[e])));
      } else {
        st(&o.v[e], f(ld(&a.v[e]), ld(&b.v[e])));
      }
    }
    reinterpret_cast<Pack<T>*>(out)[j] = o;
  }
  for (int64_t i = npacks * V + tid; i < n; i += step) {
    if constexpr (NIN == 1) {
      st(out + i, f(ld(in0 + i)));
    } else {
      st(out + i, f(ld(in0 + i), ld(in1 + i)));
    }
  }
}

template <typename T, int NIN, typename F>
void launch_vector(T* out, const T* in0, const T* in1, int64_t n, const F& f) {
  if (n == 0) return;
  launch("vector_kernel", vector_kernel<T, NIN, F>, grid_for((n + Pack<T>::n - 1) / Pack<T>::n), kThreads, 0,
         current().stream, out, in0, in1, n, f);
}

// ---- copy ----------------------------------------------------------------------------------------

template <typename TO, typename TI> struct CopyF {
  char* o;
  const char* i;
  __device__ void operator()(const int64_t (&off)[2]) const {
    st(reinterpret_cast<TO*>(o) + off[0], ld(reinterpret_cast<const TI*>(i) + off[1]));
  }
};

// ---- unary ---------------------------------------------------------------------------------------

template <typename A> __device__ __forceinline__ bool negative(A x) {
  if constexpr (std::is_unsigned_v<A> || std::is_same_v<A, bool>) {
    return false;
  } else {
    return x < A(0);
  }
}

template <typename T> struct UnaryF {
  using A = DAcc<T>;
  UnaryOp op;
  A p0, p1;
  __device__ A operator()(A x) const {
    if constexpr (is_float_v<T>) {
      switch (op) {
        case UnaryOp::exp: return exp(x);
        case UnaryOp::log: return log(x);
        case UnaryOp::sqrt: return sqrt(x);
        case UnaryOp::rsqrt: return A(1) / sqrt(x);
        case UnaryOp::tanh: return tanh(x);
        case UnaryOp::sigmoid: return math::sigmoid(x);
        case UnaryOp::gelu_erf: return math::gelu_erf(x);
        case UnaryOp::gelu_tanh: return math::gelu_tanh(x);
        case UnaryOp::pow_scalar: return p0 == A(2) ? x * x : A(pow(x, p0));
        case UnaryOp::sin: return sin(x);
        case UnaryOp::cos: return cos(x);
        case UnaryOp::tan: return tan(x);
        case UnaryOp::asin: return asin(x);
        case UnaryOp::acos: return acos(x);
        case UnaryOp::atan: return atan(x);
        case UnaryOp::sinh: return sinh(x);
        case UnaryOp::cosh: return cosh(x);
        case UnaryOp::asinh: return asinh(x);
        case UnaryOp::acosh: return acosh(x);
        case UnaryOp::atanh: return atanh(x);
        case UnaryOp::erf: return erf(x);
        case UnaryOp::erfc: return erfc(x);
        case UnaryOp::erfinv: return math::erfinv(x);
        case UnaryOp::log1p: return log1p(x);
        case UnaryOp::lgamma: return lgamma(x);
        case UnaryOp::digamma: return math::digamma(x);
        case UnaryOp::polygamma: return math::polygamma(int(p0), x);
        case UnaryOp::i0: return math::bessel_i(0, x, false);
        case UnaryOp::i0e: return math::bessel_i(0, x, true);
        case UnaryOp::i1: return math::bessel_i(1, x, false);
        case UnaryOp::i1e: return math::bessel_i(1, x, true);
        case UnaryOp::ndtri: return math::ndtri(x);
        case UnaryOp::log_ndtr: return math::log_ndtr(x);
        case UnaryOp::erfcx: return math::erfcx(x);
        case UnaryOp::expm1: return expm1(x);
        case UnaryOp::log2: return log2(x);
        case UnaryOp::log10: return log10(x);
        case UnaryOp::exp2: return exp2(x);
        case UnaryOp::reciprocal: return A(1) / x;
        case UnaryOp::floor: return floor(x);
        case UnaryOp::ceil: return ceil(x);
        case UnaryOp::round: return rint(x);
        case UnaryOp::trunc: return trunc(x);
        case UnaryOp::frac: return math::frac(x);
        case UnaryOp::silu: return math::silu(x);
        case UnaryOp::mish: return math::mish(x);
        case UnaryOp::softsign: return math::softsign(x);
        case UnaryOp::logsigmoid: return math::logsigmoid(x);
        case UnaryOp::hardsigmoid: return math::hardsigmoid(x);
        case UnaryOp::hardswish: return math::hardswish(x);
        case UnaryOp::softplus: return math::softplus(x, p0, p1);
        case UnaryOp::leaky_relu: return math::leaky_relu(x, p0);
        case UnaryOp::elu: return math::elu(x, p0, p1);
        case UnaryOp::celu: return math::celu(x, p0);
        default: break;
      }
    }
    switch (op) {
      // Integers wrap (kernels/common/int_arith.h): neg and abs of INT_MIN give INT_MIN, as the CPU loop.
      case UnaryOp::neg: return math::wrap_neg(x);
      case UnaryOp::abs: return negative(x) || x == A(0) ? math::wrap_sub(A(0), x) : x;  // +0 for -0, as the CPU loop
      case UnaryOp::sign: return A((A(0) < x) - negative(x));
      case UnaryOp::relu: return x <= A(0) ? A(0) : x;
      case UnaryOp::logical_not: return A(!x);
      case UnaryOp::bitwise_not:
        // ~x for integers, !x for bool, as the CPU loop (the host refuses floating types)
        if constexpr (std::is_same_v<T, bool>) {
          return A(!x);
        } else if constexpr (!is_float_v<T>) {
          return A(~x);
        } else {
          return x;
        }
      case UnaryOp::clamp:
        // Both bounds given (an absent one is an infinity); a NaN bound makes every element NaN, as
        // PyTorch's (the host refuses one for integers), as the CPU loop.
        if constexpr (is_float_v<T>) {
          if (x != x) return x;  // NaN stays NaN
          if (p0 != p0) return p0;
          if (p1 != p1) return p1;
        }
        if (x < p0) x = p0;
        if (x > p1) x = p1;
        return x;
      default: return x;  // not reached: the host checks the op is defined for T
    }
  }
};

bool unary_defined(UnaryOp op, DType t) {
  switch (op) {
    case UnaryOp::neg: case UnaryOp::abs: case UnaryOp::sign: case UnaryOp::relu: case UnaryOp::logical_not:
    case UnaryOp::clamp:
      return true;
    case UnaryOp::bitwise_not: return !is_floating(t);
    default: return is_floating(t);
  }
}

template <typename T> struct UnaryStridedF {
  T* o;
  const T* a;
  UnaryF<T> f;
  __device__ void operator()(const int64_t (&off)[2]) const { st(o + off[0], f(ld(a + off[1]))); }
};

// ---- binary --------------------------------------------------------------------------------------

template <typename T> struct BinaryF {
  using A = DAcc<T>;
  BinaryOp op;
  A alpha;
  int* err;
  __device__ A operator()(A x, A y) const {
    if constexpr (std::is_same_v<T, bool>) {
      // bool arithmetic: + is or, * is and (the host rejects the rest); add is x + alpha * y with
      // alpha a bool too: alpha False gives x, as PyTorch's.
      if (op == BinaryOp::add) return x || (alpha && y);
      if (op == BinaryOp::bitwise_xor) return x != y;
      return op == BinaryOp::maximum || op == BinaryOp::bitwise_or ? (x || y) : (x && y);
    } else {
      switch (op) {
        // Integers wrap at the dtype's width, as the CPU loop (kernels/common/int_arith.h); floats as they were.
        case BinaryOp::add:
          if constexpr (is_float_v<T>) {
            return A(x + alpha * y);
          } else {
            return math::wrap_add(x, math::wrap_mul(alpha, y));
          }
        case BinaryOp::sub:
          if constexpr (is_float_v<T>) {
            return A(x - alpha * y);
          } else {
            return math::wrap_sub(x, math::wrap_mul(alpha, y));
          }
        case BinaryOp::mul: return math::wrap_mul(x, y);
        case BinaryOp::div:
          if constexpr (is_float_v<T>) {
            return x / y;
          } else {
            if (y == A(0)) {
              flag_error(err, KernelError::int_div_zero);
              return A(0);
            }
            return math::trunc_div(x, y);  // INT_MIN / -1 wraps to INT_MIN
          }
        case BinaryOp::fmod:
        case BinaryOp::remainder:
          if constexpr (!is_float_v<T>) {
            if (y == A(0)) {
              flag_error(err, KernelError::int_mod_zero);
              return A(0);
            }
          }
          return op == BinaryOp::fmod ? math::fmod_of(x, y) : math::remainder_of(x, y);
        case BinaryOp::maximum:
          if constexpr (is_float_v<T>) {
            if (x != x || y != y) return std::numeric_limits<A>::quiet_NaN();
          }
          return x > y ? x : y;
        case BinaryOp::minimum:
          if constexpr (is_float_v<T>) {
            if (x != x || y != y) return std::numeric_limits<A>::quiet_NaN();
          }
          return x < y ? x : y;
        case BinaryOp::pow:
          if constexpr (is_float_v<T>) {
            return pow(x, y);
          } else {
            return math::int_pow(x, y);
          }
        default: break;
      }
      if constexpr (!is_float_v<T>) {
        // Integers only (the host checks), as the CPU loop (kernels/common/int_arith.h for the shifts).
        switch (op) {
          case BinaryOp::bitwise_and: return A(x & y);
          case BinaryOp::bitwise_or: return A(x | y);
          case BinaryOp::bitwise_xor: return A(x ^ y);
          case BinaryOp::shift_left: return math::shift_left(x, y);
          case BinaryOp::shift_right: return math::shift_right(x, y);
          default: break;
        }
      }
      if constexpr (is_float_v<T>) {
        switch (op) {
          case BinaryOp::atan2: return atan2(x, y);
          case BinaryOp::relu_backward: return y <= A(0) ? A(0) : x;
          case BinaryOp::gelu_erf_backward: return x * math::gelu_erf_grad(y);
          case BinaryOp::gelu_tanh_backward: return x * math::gelu_tanh_grad(y);
          case BinaryOp::sigmoid_backward: return x * y * (A(1) - y);
          case BinaryOp::tanh_backward: return x * (A(1) - y * y);
          default: break;
        }
      }
      return A(0);  // not reached: the host checks the op is defined for T
    }
  }
};

bool is_comparison(BinaryOp op) { return op >= BinaryOp::eq && op <= BinaryOp::logical_or; }

bool binary_defined(BinaryOp op, DType t) {
  if (is_comparison(op)) return true;
  if (t == DType::boolean)
    return op == BinaryOp::add || op == BinaryOp::mul || op == BinaryOp::maximum || op == BinaryOp::minimum ||
           op == BinaryOp::bitwise_and || op == BinaryOp::bitwise_or || op == BinaryOp::bitwise_xor;
  switch (op) {
    case BinaryOp::bitwise_and:
    case BinaryOp::bitwise_or:
    case BinaryOp::bitwise_xor:
    case BinaryOp::shift_left:
    case BinaryOp::shift_right: return !is_floating(t);
    case BinaryOp::add: case BinaryOp::sub: case BinaryOp::mul: case BinaryOp::div: case BinaryOp::maximum:
    case BinaryOp::minimum:
    case BinaryOp::pow:
    case BinaryOp::fmod:
    case BinaryOp::remainder: return true;
    default: return is_floating(t);
  }
}

template <typename A> __device__ bool compare(BinaryOp op, A x, A y) {
  switch (op) {
    case BinaryOp::eq: return x == y;
    case BinaryOp::ne: return x != y;
    case BinaryOp::lt: return x < y;
    case BinaryOp::le: return x <= y;
    case BinaryOp::gt: return x > y;
    case BinaryOp::ge: return x >= y;
    case BinaryOp::logical_and: return x != A(0) && y != A(0);
    case BinaryOp::logical_or: return x != A(0) || y != A(0);
    default: return false;
  }
}

template <typename T> struct BinaryStridedF {
  T* o;
  const T* a;
  const T* b;
  BinaryF<T> f;
  __device__ void operator()(const int64_t (&off)[3]) const { st(o + off[0], f(ld(a + off[1]), ld(b + off[2]))); }
};
// A 16-bit tensor with a one-element f32 operand (a number, read once per element from device memory): the op
// runs in f32 with the number's f32 value and rounds once, as the CPU's binary_scalar_typed.
template <typename T> struct BinaryScalarF {
  BinaryF<T> f;
  const float* s;
  bool scalar_first;
  __device__ DAcc<T> operator()(DAcc<T> x) const { return scalar_first ? f(*s, x) : f(x, *s); }
};
template <typename T> struct BinaryScalarStridedF {
  T* o;
  const T* a;
  BinaryScalarF<T> f;
  __device__ void operator()(const int64_t (&off)[2]) const { st(o + off[0], f(ld(a + off[1]))); }
};
// An f32 or 16-bit tensor times a one-element f64 number in device memory: the product in f64, rounded
// once (binary's f64 pair, as the CPU's: kernels/cpu/elementwise.cpp).
template <typename T> struct MulF64F {
  const double* s;
  __device__ DAcc<T> operator()(DAcc<T> x) const { return convert_to<DAcc<T>>(double(x) * *s); }
};
template <typename T> struct MulF64StridedF {
  T* o;
  const T* a;
  MulF64F<T> f;
  __device__ void operator()(const int64_t (&off)[2]) const { st(o + off[0], f(ld(a + off[1]))); }
};
template <typename T> struct CompareStridedF {
  bool* o;
  const T* a;
  const T* b;
  BinaryOp op;
  __device__ void operator()(const int64_t (&off)[3]) const { o[off[0]] = compare(op, ld(a + off[1]), ld(b + off[2])); }
};

// ---- where, fill, arange, random ----------------------------------------------------------------

// Moves elements as unsigned words of the element size: where never converts.
template <typename W> struct WhereF {
  W* o;
  const bool* c;
  const W* a;
  const W* b;
  __device__ void operator()(const int64_t (&off)[4]) const { o[off[0]] = c[off[1]] ? a[off[2]] : b[off[3]]; }
};
template <typename T> struct FillF {
  T* o;
  T v;
  __device__ void operator()(const int64_t (&off)[1]) const { o[off[0]] = v; }
};

// Launch: grid-stride, one thread per element of the 1-D output.
template <typename T> __global__ void arange_kernel(T* o, int64_t n, int64_t stride, double start, double step) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    st(o + i * stride, start + double(i) * step);
}

// Launch: grid-stride over Philox blocks; thread b draws block (offset/4 + b) and writes elements
// 4b .. 4b+3 of the contiguous output, exactly as the CPU does (so dropout masks are identical).
// Memory: 4 elements written per block, nothing read.
template <typename T> __global__ void random_kernel(T* out, int64_t n, RandomKind kind, uint64_t seed, uint64_t first,
                                                    double p0, double p1, int bits) {
  const int64_t nblocks = (n + 3) / 4;
  for (int64_t blk = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; blk < nblocks;
       blk += int64_t(gridDim.x) * blockDim.x) {
    float v[4];
    random_draw4(kind, philox_block(seed, first + uint64_t(blk)), p0, p1, v, bits);
    for (int l = 0; l < 4; ++l) {
      const int64_t i = blk * 4 + l;
      if (i < n) st(out + i, v[l]);
    }
  }
}

}  // namespace

void copy(const TensorDesc& dst, const TensorDesc& src) {
  const TensorDesc* ds[2] = {&dst, &src};
  const MergedDims<2> g = merge_dims(ds);
  if (g.numel == 0) return;
  visit_dtype(dst.dtype, [&](auto to) {
    using TO = decltype(to);
    visit_dtype(src.dtype, [&](auto ti) {
      using TI = decltype(ti);
      if constexpr (std::is_same_v<TO, TI>) {
        if (contiguous(g)) {
          KILN_CUDA_OK(cudaMemcpyAsync(dst.data, src.data, size_t(g.numel) * sizeof(TO), cudaMemcpyDeviceToDevice,
                                       current().stream));
          return;
        }
      }
      launch_strided(g, CopyF<TO, TI>{static_cast<char*>(dst.data), static_cast<const char*>(src.data)});
    });
  });
}

void fill(const TensorDesc& dst, double value) {
  const TensorDesc* ds[1] = {&dst};
  const MergedDims<1> g = merge_dims(ds);
  visit_dtype(dst.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T v = value_as<T>(value);
    launch_strided(g, FillF<T>{static_cast<T*>(dst.data), v});
  });
}

void arange(const TensorDesc& dst, double start, double step) {
  KILN_ASSERT(dst.ndim == 1, "arange writes a 1-D tensor");
  const int64_t n = dst.shape[0];
  if (n == 0) return;
  visit_dtype(dst.dtype, [&](auto tag) {
    using T = decltype(tag);
    launch("arange_kernel", arange_kernel<T>, grid_for(n), kThreads, 0, current().stream, static_cast<T*>(dst.data), n,
           dst.strides[0], start, step);
  });
}

void unary(UnaryOp op, const TensorDesc& dst, const TensorDesc& src, double p0, double p1) {
  KILN_CHECK(unary_defined(op, src.dtype), "unary op ", int(op), " is not defined for dtype ", dtype_name(src.dtype));
  const TensorDesc* ds[2] = {&dst, &src};
  const MergedDims<2> g = merge_dims(ds);
  visit_dtype(src.dtype, [&](auto tag) {
    using T = decltype(tag);
    using A = DAcc<T>;
    const bool c = op == UnaryOp::clamp;  // clamp's bounds are saturated into A's range (math::clamp_bound)
    const UnaryF<T> f{op, c ? math::clamp_bound<A>(p0, true) : convert_to<A>(p0),
                      c ? math::clamp_bound<A>(p1, false) : convert_to<A>(p1)};
    T* o = static_cast<T*>(dst.data);
    const T* a = static_cast<const T*>(src.data);
    if (contiguous(g) && aligned16(o) && aligned16(a)) {
      launch_vector<T, 1>(o, a, nullptr, g.numel, f);
    } else {
      launch_strided(g, UnaryStridedF<T>{o, a, f});
    }
  });
}

void binary(BinaryOp op, const TensorDesc& dst, const TensorDesc& a, const TensorDesc& b, double alpha) {
  if (a.dtype != b.dtype && b.dtype == DType::f64 && op == BinaryOp::mul) {
    // The f64 pair (MulF64F): what engine/optim.cpp's clip_grad_norm gives the CPU, taken here too so that
    // the CUDA kernels in its place (the emulator's BackendOverride) compute the same.
    KILN_ASSERT(is_floating(a.dtype) && a.dtype != DType::f64 && dst.dtype == a.dtype && b.ndim == 0,
                "binary op mul: operands ", a.dtype, " and ", b.dtype, " (output ", dst.dtype, ") do not pair");
    const TensorDesc* ds[2] = {&dst, &a};
    const MergedDims<2> g = merge_dims(ds);
    const auto run = [&](auto tag) {
      using T = decltype(tag);
      const MulF64F<T> f{static_cast<const double*>(b.data)};
      T* o = static_cast<T*>(dst.data);
      const T* x = static_cast<const T*>(a.data);
      if (contiguous(g) && aligned16(o) && aligned16(x)) {
        launch_vector<T, 1>(o, x, nullptr, g.numel, f);
      } else {
        launch_strided(g, MulF64StridedF<T>{o, x, f});
      }
    };
    if (a.dtype == DType::f32) return run(float{});
    if (a.dtype == DType::f16) return run(Half{});
    return run(BFloat16{});
  }
  if (a.dtype != b.dtype) {
    // The only mixed pair: a 16-bit tensor and a one-element f32 number (BinaryScalarF).
    const bool first = a.dtype == DType::f32;
    const TensorDesc& t = first ? b : a;
    const TensorDesc& s = first ? a : b;
    KILN_ASSERT(is_low_precision(t.dtype) && s.dtype == DType::f32 && dst.dtype == t.dtype && s.ndim == 0 &&
                    (op == BinaryOp::add || op == BinaryOp::sub || op == BinaryOp::mul || op == BinaryOp::div),
                "binary op ", int(op), ": operands ", a.dtype, " and ", b.dtype, " (output ", dst.dtype,
                ") do not pair");
    const TensorDesc* ds[2] = {&dst, &t};
    const MergedDims<2> g = merge_dims(ds);
    const auto run = [&](auto tag) {
      using T = decltype(tag);
      const BinaryScalarF<T> f{{op, DAcc<T>(alpha), current().error_word}, static_cast<const float*>(s.data), first};
      T* o = static_cast<T*>(dst.data);
      const T* x = static_cast<const T*>(t.data);
      if (contiguous(g) && aligned16(o) && aligned16(x)) {
        launch_vector<T, 1>(o, x, nullptr, g.numel, f);
      } else {
        launch_strided(g, BinaryScalarStridedF<T>{o, x, f});
      }
    };
    if (t.dtype == DType::f16) return run(Half{});
    return run(BFloat16{});
  }
  KILN_CHECK(binary_defined(op, a.dtype), "binary op ", int(op), " is not defined for dtype ", dtype_name(a.dtype));
  const TensorDesc* ds[3] = {&dst, &a, &b};
  const MergedDims<3> g = merge_dims(ds);
  visit_dtype(a.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* x = static_cast<const T*>(a.data);
    const T* y = static_cast<const T*>(b.data);
    if (is_comparison(op)) {
      launch_strided(g, CompareStridedF<T>{static_cast<bool*>(dst.data), x, y, op});
      return;
    }
    KILN_ASSERT(dst.dtype == a.dtype, "binary op output dtype ", dst.dtype, " differs from input ", a.dtype);
    const BinaryF<T> f{op, convert_to<DAcc<T>>(alpha), current().error_word};
    T* o = static_cast<T*>(dst.data);
    if (contiguous(g) && aligned16(o) && aligned16(x) && aligned16(y)) {
      launch_vector<T, 2>(o, x, y, g.numel, f);
    } else {
      launch_strided(g, BinaryStridedF<T>{o, x, y, f});
    }
  });
}

void where(const TensorDesc& dst, const TensorDesc& cond, const TensorDesc& a, const TensorDesc& b) {
  const TensorDesc* ds[4] = {&dst, &cond, &a, &b};
  const MergedDims<4> g = merge_dims(ds);
  auto run = [&](auto word) {
    using W = decltype(word);
    launch_strided(g, WhereF<W>{static_cast<W*>(dst.data), static_cast<const bool*>(cond.data),
                                static_cast<const W*>(a.data), static_cast<const W*>(b.data)});
  };
  switch (dtype_size(dst.dtype)) {
    case 1: return run(uint8_t{});
    case 2: return run(uint16_t{});
    case 4: return run(uint32_t{});
    default: return run(uint64_t{});
  }
}

void random(RandomKind kind, const TensorDesc& dst, uint64_t seed, uint64_t offset, double p0, double p1) {
  const int64_t n = dst.numel();
  if (n == 0) return;
  visit_dtype(dst.dtype, [&](auto tag) {
    using T = decltype(tag);
    launch("random_kernel", random_kernel<T>, grid_for((n + 3) / 4), kThreads, 0, current().stream,
           static_cast<T*>(dst.data), n, kind, seed, offset / 4, p0, p1, uniform_bits(dst.dtype));
  });
}

// ---- GEMM's k == 0: C = beta * C -------------------------------------------------------------------

namespace {
// Launch: grid-stride over the m x n matrix (row stride ldc), one thread per element.
// Memory: reads and writes each element once (beta == 0 never reads C, as the GEMM contract says).
template <typename T> __global__ void scale_matrix(T* c, int64_t m, int64_t n, int64_t ldc, DAcc<T> beta) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < m * n; i += int64_t(gridDim.x) * blockDim.x) {
    T* p = c + (i / n) * ldc + i % n;
    st(p, beta == DAcc<T>(0) ? DAcc<T>(0) : DAcc<T>(ld(p) * beta));
  }
}
}  // namespace

void scale_matrices(DType dt, void* c, int64_t m, int64_t n, int64_t ldc, int64_t stride, int64_t batch,
                    double beta) {
  if (m * n == 0) return;
  visit_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (is_float_v<T>) {
      for (int64_t i = 0; i < batch; ++i)
        launch("scale_matrix", scale_matrix<T>, grid_for(m * n), kThreads, 0, current().stream,
               static_cast<T*>(c) + i * stride, m, n, ldc, DAcc<T>(beta));
    } else {
      KILN_FAIL("cuda gemm: dtype ", dt, " is not a floating type");
    }
  });
}

}  // namespace kiln::cuda
