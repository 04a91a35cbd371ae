// matmul with numpy semantics over the backend GEMM. Transposed operands (a stride-1 row dim)
// are passed to GEMM as transposes, not copied; 16-bit inputs compute in f32 on the CPU and natively
// (f32 accumulation) on CUDA.
#include <algorithm>
#include <string>

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

// Whether the last two dims of t are stored column by column (a transposed view of a row-major matrix).
bool column_major(const Tensor& t) {
  const int64_t rows = t.size(-2), cols = t.size(-1);
  return rows > 1 && cols > 1 && t.stride(-2) == 1 && t.stride(-1) >= rows;
}

Tensor as_compute(const Tensor& t, DType dt) {
  Tensor x = t.detach();
  if (x.dtype() != dt) x = x.to(dt);
  return x;
}

// [..., m, k] x [..., k, n] with at least 2 dims each. A bias [n] (linear's) is C of the GEMM (beta 1): added in
// the GEMM's f32 accumulation, so a 16-bit result is rounded once, as PyTorch's addmm, not once for the product
// and again for the sum.
Tensor matmul_nd(const Tensor& a, const Tensor& b, const Tensor& bias = Tensor()) {
  const Device dev =
      bias.defined() ? detail::common_device("linear", {a, b, bias}) : detail::common_device("matmul", {a, b});
  const DType t = bias.defined() ? promote_types(promote_types(a.dtype(), b.dtype()), bias.dtype())
                                 : promote_types(a.dtype(), b.dtype());
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
  // The bias's rows, copied: the GEMM writes into C.
  Tensor out = bias.defined() ? as_compute(bias, ct).expand(oshape).clone() : make_tensor(oshape, ct, dev);
  KILN_ASSERT(out.is_contiguous(), "matmul: the output (C) must be contiguous");
  const double beta = bias.defined() ? 1.0 : 0.0;
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
            static_cast<const char*>(y.raw_data()) + offb * int64_t(es), lb.ld, beta,
            static_cast<char*>(out.raw_data()) + bi * m * n * int64_t(es), n);
  };
  int64_t sx = 0, sy = 0;
  if (nbatch > 1 && be.gemm_batched && uniform_batch_stride(x, batch, sx) && uniform_batch_stride(y, batch, sy)) {
    // One call for all products (CUDA): the batch dims step through each operand by one stride.
    be.gemm_batched(ct, la.trans, lb.trans, m, n, k, 1.0, x.raw_data(), la.ld, sx, y.raw_data(), lb.ld, sy, beta,
                    out.raw_data(), n, m * n, nbatch);
  } else if (nbatch > 1 && dev.is_meta()) {
    one(0);  // the products differ only in addresses, which a meta kernel never reads: one stands for all
  } else if (nbatch > 1 && dev.is_cpu() && m * n * k < (int64_t(1) << 21)) {
    // Many small products: one per task (the GEMM inside then runs on its task's thread).
    parallel_for(0, nbatch, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t bi = b0; bi < b1; ++bi) one(bi);
    });
  } else {
    for (int64_t bi = 0; bi < nbatch; ++bi) one(bi);
  }
  if (out.dtype() != t) out = out.to(t);
  if (autograd::needs_grad({a, b, bias})) {
    SavedTensor sa(a), sb(b);
    // An operand that is a transposed view (column-major: a tied embedding read as W^T) gets its gradient
    // in the same layout, as the transpose of the product that gives it row-major, so that it reaches the
    // stored weight as a contiguous tensor, not as a transposed one added element by element (as PyTorch's
    // mm backward does).
    const bool a_cols = column_major(a), b_cols = column_major(b);
    const int64_t dims = int64_t(oshape.size());
    const bool has_bias = bias.defined();
    const auto node = [sa, sb, a_cols, b_cols, dims, has_bias](const GradCtx& c) -> std::vector<Tensor> {
      Tensor ga, gb, gbias;
      if (c.needs_grad(0))
        ga = a_cols ? matmul_nd(sb.unpack("matmul"), c.g().transpose(-1, -2)).transpose(-1, -2)
                    : matmul_nd(c.g(), sb.unpack("matmul").transpose(-1, -2));
      if (c.needs_grad(1))
        gb = b_cols ? matmul_nd(c.g().transpose(-1, -2), sa.unpack("matmul")).transpose(-1, -2)
                    : matmul_nd(sa.unpack("matmul").transpose(-1, -2), c.g());
      if (!has_bias) return {ga, gb};
      if (c.needs_grad(2)) {
        std::vector<int64_t> rows(size_t(dims - 1));
        for (int64_t d = 0; d < dims - 1; ++d) rows[size_t(d)] = d;
        gbias = sum(c.g(), rows);
      }
      return {ga, gb, gbias};
    };
    if (has_bias)
      autograd::record("linear", {a, b, bias}, {out}, node);
    else
      autograd::record("matmul", {a, b}, {out}, node);
  }
  return out;
}

// Whether the batch dims of a (dim > 2) merge with its row dim into one strided dim, so that
// a.reshape({rows, k}) is a view: [..., m, k] @ [k, n] is then one [rows, k] @ [k, n] product. An expanded
// (stride 0) batch dim does not fold: the product would copy what the batched path reads in place.
bool batch_folds_into_rows(const Tensor& a) {
  const Shape batch(a.shape().begin(), a.shape().end() - 2);
  int64_t step = 0;  // between consecutive batch entries; for a single row (m == 1) any step but 0 folds
  if (!uniform_batch_stride(a, batch, step)) return false;
  return batch.numel() == 1 || (step != 0 && (a.size(-2) == 1 || step == a.stride(-2) * a.size(-2)));
}

}  // namespace

Tensor matmul(const Tensor& a_in, const Tensor& b_in) {
  const Tensor a = amp::autocast_arg(amp::AutocastOp::matmul, a_in), b = amp::autocast_arg(amp::AutocastOp::matmul, b_in);
  KILN_CHECK(a.dim() >= 1 && b.dim() >= 1, "matmul: ", a.shape(), " x ", b.shape(), ": 0-dim operands are not allowed");
  const bool va = a.dim() == 1, vb = b.dim() == 1;
  Tensor x = va ? a.unsqueeze(0) : a;
  Tensor y = vb ? b.unsqueeze(1) : b;
  if (x.dim() > 2 && y.dim() == 2 && batch_folds_into_rows(x)) {
    // A stack of matrices times one matrix (a linear layer on [batch, seq, features]) is one product over all
    // the rows, not a batch of products: its backward then gives the matrix's gradient as one GEMM over every
    // row, instead of a gradient per batch entry summed afterwards (an extra [batch, k, n] tensor and pass).
    Shape os = x.shape();
    os.back() = y.size(1);
    const int64_t rows = Shape(x.shape().begin(), x.shape().end() - 1).numel();  // -1 is ambiguous for k = 0
    Tensor out = matmul_nd(x.reshape({rows, x.size(-1)}), y).reshape(os);
    return vb ? out.squeeze(-1) : out;
  }
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
  if (!b.defined()) return matmul(x, w.t());
  // One [rows, in] x [in, out] product with the bias as the GEMM's C (matmul_nd): one rounding. Rows that do
  // not fold into one strided dim (a permuted or expanded batch) take the batched product, as matmul does,
  // rather than a copy that backward would keep.
  if (x.dim() > 2 && !batch_folds_into_rows(x)) return matmul_nd(x, w.t(), b);
  Shape os = x.shape();
  os.back() = w.size(0);
  const int64_t rows = Shape(x.shape().begin(), x.shape().end() - 1).numel();  // -1 is ambiguous for in = 0
  return matmul_nd(x.reshape({rows, x.size(-1)}), w.t(), b).reshape(os);
}

}  // namespace kiln

// ---- einsum: pairwise contractions by matmul ---------------------------------------------------------

namespace kiln {
namespace {

struct Labeled {
  Tensor t;
  std::string labels;  // one char per dim
};

// Sums out the labels of `a` that are in neither `keep` nor repeated elsewhere.
Labeled sum_unused(Labeled a, const std::string& keep) {
  std::vector<int64_t> dims;
  std::string rest;
  for (size_t i = 0; i < a.labels.size(); ++i) {
    if (keep.find(a.labels[i]) == std::string::npos)
      dims.push_back(int64_t(i));
    else
      rest += a.labels[i];
  }
  if (!dims.empty()) a = {sum(a.t, dims), rest};
  return a;
}

// A (labels la) times B (lb), keeping the labels in `keep`: batch (in both, kept), contracted (in
// both, not kept), free (in one) -> [batch, freeA, freeB].
Labeled contract(Labeled a, Labeled b, const std::string& keep) {
  a = sum_unused(a, keep + b.labels);
  b = sum_unused(b, keep + a.labels);
  std::string batch, con, fa, fb;
  for (char c : a.labels) {
    if (b.labels.find(c) == std::string::npos)
      fa += c;
    else if (keep.find(c) != std::string::npos)
      batch += c;
    else
      con += c;
  }
  for (char c : b.labels)
    if (a.labels.find(c) == std::string::npos) fb += c;
  const auto size_of = [](const Labeled& x, char c) { return x.t.size(int64_t(x.labels.find(c))); };
  // Broadcast batch dims of size 1 against the other operand's (ellipsis dims).
  Shape ea = a.t.shape(), eb = b.t.shape();
  for (char c : batch) {
    const int64_t sa = size_of(a, c), sb = size_of(b, c);
    KILN_CHECK(sa == sb || sa == 1 || sb == 1, "einsum: label '", c, "' has sizes ", sa, " and ", sb);
    ea[a.labels.find(c)] = eb[b.labels.find(c)] = std::max(sa, sb);
  }
  for (char c : con)
    KILN_CHECK(size_of(a, c) == size_of(b, c), "einsum: label '", c, "' has sizes ", size_of(a, c), " and ",
               size_of(b, c));
  const Tensor ta = a.t.expand(ea), tb = b.t.expand(eb);
  const auto perm = [](const std::string& labels, const std::string& order) {
    std::vector<int64_t> p;
    for (char c : order) p.push_back(int64_t(labels.find(c)));
    return p;
  };
  int64_t nb = 1, m = 1, n = 1, k = 1;
  Shape out_shape;
  for (char c : batch)
    nb *= ta.size(int64_t(a.labels.find(c))), out_shape.push_back(ta.size(int64_t(a.labels.find(c))));
  for (char c : fa) m *= ta.size(int64_t(a.labels.find(c))), out_shape.push_back(ta.size(int64_t(a.labels.find(c))));
  for (char c : fb) n *= tb.size(int64_t(b.labels.find(c))), out_shape.push_back(tb.size(int64_t(b.labels.find(c))));
  for (char c : con) k *= ta.size(int64_t(a.labels.find(c)));
  const Tensor am = ta.permute(perm(a.labels, batch + fa + con)).reshape({nb, m, k});
  const Tensor bm = tb.permute(perm(b.labels, batch + con + fb)).reshape({nb, k, n});
  return {matmul(am, bm).reshape(out_shape), batch + fa + fb};
}

}  // namespace

Tensor einsum(const std::string& equation, const std::vector<Tensor>& operands) {
  const OpScope scope("einsum");
  std::string eq;
  for (char c : equation)
    if (c != ' ') eq += c;
  const size_t arrow = eq.find("->");
  const std::string lhs = eq.substr(0, arrow);
  std::vector<std::string> terms;
  for (size_t s = 0;;) {
    const size_t comma = lhs.find(',', s);
    terms.push_back(lhs.substr(s, comma == std::string::npos ? std::string::npos : comma - s));
    if (comma == std::string::npos) break;
    s = comma + 1;
  }
  KILN_CHECK(terms.size() == operands.size(), "einsum: '", equation, "' names ", terms.size(), " operands, got ",
             operands.size());
  // "..." becomes one upper-case label per broadcast dim, right-aligned across the operands.
  int64_t ell = 0;
  for (size_t i = 0; i < terms.size(); ++i)
    if (terms[i].find("...") != std::string::npos)
      ell = std::max<int64_t>(ell, operands[i].dim() - int64_t(terms[i].size() - 3));
  const std::string ell_all = std::string("ABCDEFGHIJKLMNOPQRSTUVWXYZ").substr(0, size_t(std::max<int64_t>(ell, 0)));
  std::vector<Labeled> ops;
  for (size_t i = 0; i < terms.size(); ++i) {
    std::string t = terms[i];
    if (const size_t e = t.find("..."); e != std::string::npos) {
      const int64_t here = operands[i].dim() - int64_t(t.size() - 3);
      KILN_CHECK(here >= 0, "einsum: operand ", i, " ", operands[i].shape(), " has fewer dims than '", terms[i], "'");
      t = t.substr(0, e) + ell_all.substr(ell_all.size() - size_t(here)) + t.substr(e + 3);
    }
    for (char c : t)
      KILN_CHECK((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z' && ell_all.find(c) != std::string::npos), "einsum: '",
                 equation, "': labels are lower-case letters (and '...'), got '", c, "'");
    KILN_CHECK(int64_t(t.size()) == operands[i].dim(), "einsum: operand ", i, " ", operands[i].shape(), " has ",
               operands[i].dim(), " dims but '", terms[i], "' names ", t.size());
    for (size_t a = 0; a < t.size(); ++a)
      KILN_CHECK(t.find(t[a], a + 1) == std::string::npos, "einsum: label '", t[a], "' repeats within operand ", i,
                 " (diagonals are not supported)");
    ops.push_back({operands[i], t});
  }
  std::string out;
  if (arrow != std::string::npos) {
    out = eq.substr(arrow + 2);
    if (const size_t e = out.find("..."); e != std::string::npos) out = out.substr(0, e) + ell_all + out.substr(e + 3);
  } else {  // implicit: the ellipsis labels, then the labels used once, alphabetically
    std::string once;
    for (char c = 'a'; c <= 'z'; ++c) {
      int n = 0;
      for (const Labeled& o : ops) n += int(std::count(o.labels.begin(), o.labels.end(), c));
      if (n == 1) once += c;
    }
    out = ell_all + once;
  }
  for (char c : out) {
    bool found = false;
    for (const Labeled& o : ops) found = found || o.labels.find(c) != std::string::npos;
    KILN_CHECK(found, "einsum: output label '", c, "' of '", equation, "' is in no operand");
  }
  // Left to right, keeping what the output or a later operand still needs.
  Labeled acc = ops[0];
  for (size_t i = 1; i < ops.size(); ++i) {
    std::string keep = out;
    for (size_t j = i + 1; j < ops.size(); ++j) keep += ops[j].labels;
    acc = contract(acc, ops[i], keep);
  }
  acc = sum_unused(acc, out);
  std::vector<int64_t> perm;
  for (char c : out) perm.push_back(int64_t(acc.labels.find(c)));
  return acc.t.permute(perm).contiguous();
}

}  // namespace kiln
