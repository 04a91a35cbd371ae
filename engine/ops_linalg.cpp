// matmul with numpy semantics over the backend GEMM. Transposed operands (a stride-1 row dim)
// are passed to GEMM as transposes, not copied; 16-bit inputs compute in f32 on the CPU and natively
// (f32 accumulation) on CUDA.
#include "engine/autocast.h"
#include "engine/autograd.h"
#include "engine/internal.h"
#include "engine/nn_ops.h"
#include "engine/ops.h"
#include "base/thread_pool.h"

namespace kiln {
namespace {

struct MatLayout {
  bool trans = false;
  int64_t ld = 0;
  bool ok = false;
};

// How GEMM can read a rows x cols matrix with row stride rs and column stride cs. The stride of
// a dim of size 1 is never used, so it does not constrain the layout.
MatLayout layout_of(int64_t rows, int64_t cols, int64_t rs, int64_t cs) {
  if ((cs == 1 || cols == 1) && (rows == 1 || rs >= cols)) return {false, std::max<int64_t>(rows == 1 ? cols : rs, 1), true};
  if ((rs == 1 || rows == 1) && (cols == 1 || cs >= rows)) return {true, std::max<int64_t>(cols == 1 ? rows : cs, 1), true};
  return {};
}

// Whether the batch dims (the leading dims of t, of sizes `batch`) step through t by one stride;
// sets it (0 for a broadcast operand).
bool uniform_batch_stride(const Tensor& t, const Shape& batch, int64_t& stride) {
  int64_t expect = -1;  // the stride the next-outer dim must have, once one dim of size > 1 is seen
  stride = 0;
  for (int64_t d = int64_t(batch.size()) - 1; d >= 0; --d) {
    const int64_t size = batch[size_t(d)], st = t.strides()[size_t(d)];
    if (size == 1) continue;
    if (expect < 0) {
      stride = st;
    } else if (st != expect) {
      return false;
    }
    expect = st * size;
  }
  return true;
}

Tensor as_compute(const Tensor& t, DType dt) {
  Tensor x = t.detach();
  if (x.dtype() != dt) x = x.to(dt);
  return x;
}

// [..., m, k] x [..., k, n] with at least 2 dims each.
Tensor matmul_nd(const Tensor& a, const Tensor& b) {
  const Device dev = detail::common_device("matmul", {a, b});
  const DType t = promote_types(a.dtype(), b.dtype());
  KILN_CHECK(is_floating(t), "matmul: ", a.type_str(), " x ", b.type_str(), ": needs floating tensors");
  const int64_t m = a.size(-2), k = a.size(-1), k2 = b.size(-2), n = b.size(-1);
  KILN_CHECK(k == k2, "matmul: ", a.shape(), " x ", b.shape(), ": inner dimensions ", k, " and ", k2, " differ");
  Shape ab(a.shape().begin(), a.shape().end() - 2), bb(b.shape().begin(), b.shape().end() - 2);
  Shape batch;
  try {
    batch = broadcast_shapes(ab, bb);
  } catch (const Error& e) {
    KILN_FAIL("matmul: ", a.shape(), " x ", b.shape(), ": batch dims do not broadcast (", e.message(), ")");
  }
  const auto& be = detail::backend(dev);
  // The CPU computes 16-bit products in f32; CUDA takes them as they are (f32 accumulation).
  const DType ct = (t == DType::f64) ? DType::f64 : (is_low_precision(t) && be.native_16bit_gemm_conv) ? t : DType::f32;
  Shape ea = batch, eb = batch, oshape = batch;
  ea.insert(ea.end(), {m, k});
  eb.insert(eb.end(), {k, n});
  oshape.insert(oshape.end(), {m, n});
  Tensor x = as_compute(a, ct).expand(ea), y = as_compute(b, ct).expand(eb);
  MatLayout la = layout_of(m, k, x.stride(-2), x.stride(-1));
  if (!la.ok) {
    x = x.clone();  // contiguous() would keep odd strides on size-1 dims
    la = layout_of(m, k, x.stride(-2), x.stride(-1));
  }
  MatLayout lb = layout_of(k, n, y.stride(-2), y.stride(-1));
  if (!lb.ok) {
    y = y.clone();
    lb = layout_of(k, n, y.stride(-2), y.stride(-1));
  }
  Tensor out = make_tensor(oshape, ct, dev);
  const int64_t nbatch = batch.numel();
  const size_t es = dtype_size(ct);
  auto one = [&](int64_t bi) {
    int64_t offa = 0, offb = 0, rem = bi;
    for (int64_t d = int64_t(batch.size()) - 1; d >= 0; --d) {
      const int64_t i = rem % batch[size_t(d)];
      rem /= batch[size_t(d)];
      offa += i * x.strides()[size_t(d)];
      offb += i * y.strides()[size_t(d)];
    }
    be.gemm(ct, la.trans, lb.trans, m, n, k, 1.0, static_cast<const char*>(x.raw_data()) + offa * int64_t(es), la.ld,
            static_cast<const char*>(y.raw_data()) + offb * int64_t(es), lb.ld, 0.0,
            static_cast<char*>(out.raw_data()) + bi * m * n * int64_t(es), n);
  };
  int64_t sx = 0, sy = 0;
  if (nbatch > 1 && be.gemm_batched && uniform_batch_stride(x, batch, sx) && uniform_batch_stride(y, batch, sy)) {
    // One call for all products (CUDA): the batch dims step through each operand by one stride.
    be.gemm_batched(ct, la.trans, lb.trans, m, n, k, 1.0, x.raw_data(), la.ld, sx, y.raw_data(), lb.ld, sy, 0.0,
                    out.raw_data(), n, m * n, nbatch);
  } else if (nbatch > 1 && dev.is_cpu() && m * n * k < (int64_t(1) << 21)) {
    // Many small products: one per task (the GEMM inside then runs on its task's thread).
    parallel_for(0, nbatch, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t bi = b0; bi < b1; ++bi) one(bi);
    });
  } else {
    for (int64_t bi = 0; bi < nbatch; ++bi) one(bi);
  }
  if (out.dtype() != t) out = out.to(t);
  if (autograd::needs_grad({a, b})) {
    SavedTensor sa(a), sb(b);
    autograd::record("matmul", {a, b}, {out}, [sa, sb](const GradCtx& c) -> std::vector<Tensor> {
      Tensor ga, gb;
      if (c.needs_grad(0)) ga = matmul_nd(c.g(), sb.unpack("matmul").transpose(-1, -2));
      if (c.needs_grad(1)) gb = matmul_nd(sa.unpack("matmul").transpose(-1, -2), c.g());
      return {ga, gb};
    });
  }
  return out;
}

}  // namespace

Tensor matmul(const Tensor& a_in, const Tensor& b_in) {
  const Tensor a = amp::autocast_arg(amp::AutocastOp::matmul, a_in), b = amp::autocast_arg(amp::AutocastOp::matmul, b_in);
  KILN_CHECK(a.dim() >= 1 && b.dim() >= 1, "matmul: ", a.shape(), " x ", b.shape(), ": 0-dim operands are not allowed");
  const bool va = a.dim() == 1, vb = b.dim() == 1;
  Tensor x = va ? a.unsqueeze(0) : a;
  Tensor y = vb ? b.unsqueeze(1) : b;
  Tensor out = matmul_nd(x, y);
  if (vb) out = out.squeeze(-1);
  if (va) out = out.squeeze(vb ? -1 : -2);
  return out;
}

Tensor linear(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in) {
  using amp::AutocastOp;
  const Tensor x = amp::autocast_arg(AutocastOp::linear, x_in), w = amp::autocast_arg(AutocastOp::linear, weight_in),
               b = amp::autocast_arg(AutocastOp::linear, bias_in);
  KILN_CHECK(w.dim() == 2 && x.dim() >= 1 && x.size(-1) == w.size(1), "linear: input ", x.shape(), " and weight ",
             w.shape(), ": the weight must be [out, in] and the input end with in");
  KILN_CHECK(!b.defined() || (b.dim() == 1 && b.size(0) == w.size(0)), "linear: bias ", b.shape(), " must be [",
             w.size(0), "]");
  const Tensor y = matmul(x, w.t());
  return b.defined() ? y + b : y;
}

}  // namespace kiln
