// Tensor factories, the default random generator, and the random fills.
#include <cmath>

#include "engine/autograd.h"
#include "engine/internal.h"
#include "engine/ops.h"

namespace kiln {

namespace {
thread_local Generator* t_generator = nullptr;  // a ThreadGenerator's, while one lives
}  // namespace

Generator& default_generator() {
  static Generator g(0x4b494c4eull);  // "KILN"
  return t_generator ? *t_generator : g;
}
ThreadGenerator::ThreadGenerator(const Generator& g) : g_(g), prev_(t_generator) { t_generator = &g_; }
ThreadGenerator::~ThreadGenerator() { t_generator = prev_; }
void manual_seed(uint64_t seed) { default_generator() = Generator(seed); }

namespace {
// Where a factory's tensor goes: meta instead of the CPU inside a MetaInitGuard.
Device place(Device d) { return d.is_cpu() && MetaInitGuard::active() ? kMeta : d; }
Tensor finish(Tensor t, const TensorOptions& o) {
  if (o.requires_grad) t.set_requires_grad(true);
  return t;
}
}  // namespace

Tensor empty(const Shape& shape, TensorOptions o) { return finish(make_tensor(shape, o.dtype, place(o.device)), o); }

namespace {
Tensor filled(const Shape& shape, double value, TensorOptions o, const char* op) {
  Tensor t = make_tensor(shape, o.dtype, place(o.device));
  if (op) detail::check_fill_value(t, value, op);
  detail::backend(t.device()).fill(detail::desc(t), value);
  return finish(t, o);
}
}  // namespace

Tensor full(const Shape& shape, double value, TensorOptions o) { return filled(shape, value, o, "full"); }
Tensor zeros(const Shape& shape, TensorOptions o) { return full(shape, 0.0, o); }
Tensor ones(const Shape& shape, TensorOptions o) { return full(shape, 1.0, o); }
Tensor zeros_like(const Tensor& t) { return zeros(t.shape(), TensorOptions(t.dtype(), t.device())); }
Tensor ones_like(const Tensor& t) { return ones(t.shape(), TensorOptions(t.dtype(), t.device())); }
Tensor full_like(const Tensor& t, double v) { return full(t.shape(), v, TensorOptions(t.dtype(), t.device())); }
Tensor empty_like(const Tensor& t) { return empty(t.shape(), TensorOptions(t.dtype(), t.device())); }
// Unchecked: a whole-number scalar operand wraps into an integer tensor's dtype (docs/ops.md: i8 1 + 300 = 45).
Tensor scalar_tensor(double v, TensorOptions o) { return filled(Shape{}, v, o, nullptr); }

Tensor arange(double start, double end, double step, TensorOptions o) {
  KILN_CHECK(step != 0 && std::isfinite(step), "arange: step must be finite and non-zero, got ", step);
  KILN_CHECK(std::isfinite(start) && std::isfinite(end), "arange: start ", start, " and end ", end, " must be finite");
  // As PyTorch: a step that leads away from the end is an error, not an empty range (start == end is).
  KILN_CHECK(step > 0 ? end >= start : end <= start, "arange: the step ", step, " leads from start ", start,
             " away from end ", end, " (upper bound and lower bound inconsistent with step sign)");
  const double n = std::ceil((end - start) / step);
  KILN_CHECK(n < 9.0e15, "arange: ", n, " elements is too many");
  Tensor t = make_tensor(Shape{std::max<int64_t>(0, int64_t(n))}, o.dtype, place(o.device));
  detail::backend(t.device()).arange(detail::desc(t), start, step);
  return finish(t, o);
}
Tensor arange(int64_t end, TensorOptions o) { return arange(0.0, double(end), 1.0, o); }

Tensor eye(int64_t n, int64_t m, TensorOptions o) {
  if (m < 0) m = n;
  KILN_CHECK(n >= 0, "eye: negative size ", n);
  Tensor t = zeros({n, m}, TensorOptions(o.dtype, o.device));
  const int64_t d = std::min(n, m);
  if (d > 0) t.as_strided({d}, {m + 1}, 0).fill_(1.0);
  return finish(t, o);
}

Tensor from_blob(void* data, const Shape& shape, DType dtype, std::function<void(void*)> deleter, Device device,
                 const Shape& strides) {
  for (int64_t s : shape) KILN_CHECK(s >= 0, "from_blob: negative size in shape ", shape);
  const Shape st = strides.empty() ? contiguous_strides(shape) : strides;
  KILN_CHECK(st.size() == shape.size(), "from_blob: ", st.size(), " strides ", st, " for the ", shape.size(),
             "-d shape ", shape);
  // The extent of the elements the view can reach, in elements past data.
  int64_t extent = shape.numel() > 0 ? 1 : 0;
  for (size_t i = 0; i < shape.size() && extent > 0; ++i) {
    KILN_CHECK(st[i] >= 0, "from_blob: negative stride in ", st);
    extent += (shape[i] - 1) * st[i];
  }
  KILN_CHECK(data != nullptr || extent == 0, "from_blob: null data for shape ", shape);
  auto storage = std::make_shared<Storage>(data, size_t(extent) * dtype_size(dtype), device, std::move(deleter));
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::move(storage);
  impl->shape = shape;
  impl->strides = st;
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor from_vector(const std::vector<double>& values, const Shape& shape, TensorOptions o) {
  KILN_CHECK(int64_t(values.size()) == shape.numel(), "from_vector: ", values.size(), " values for shape ", shape,
             " (", shape.numel(), " elements)");
  if (place(o.device).is_meta() || o.device.is_meta()) return finish(make_tensor(shape, o.dtype, kMeta), o);
  Tensor src = make_tensor(shape, DType::f64, kCPU);
  std::copy(values.begin(), values.end(), src.data<double>());
  // Converted on the host, then one transfer: a backend's copy kernel reads only its own memory.
  Tensor t = make_tensor(shape, o.dtype, kCPU);
  detail::backend(kCPU).copy(detail::desc(t), detail::desc(src));
  return finish(o.device.is_cpu() ? t : t.to(o.device), o);
}

namespace {
Tensor random_fill(RandomKind kind, const Shape& shape, double p0, double p1, TensorOptions o, Generator* gen) {
  Generator& g = gen ? *gen : default_generator();
  KILN_CHECK(is_floating(o.dtype) || kind == RandomKind::bernoulli, "random tensors must be floating, got ", o.dtype);
  Tensor t = make_tensor(shape, o.dtype, place(o.device));
  const uint64_t offset = g.reserve(uint64_t(t.numel()));
  detail::backend(t.device()).random(kind, detail::desc(t), g.seed, offset, p0, p1);
  return finish(t, o);
}
}  // namespace

Tensor rand(const Shape& shape, TensorOptions o, Generator* g) { return random_fill(RandomKind::uniform, shape, 0, 1, o, g); }
Tensor uniform(const Shape& shape, double lo, double hi, TensorOptions o, Generator* g) {
  KILN_CHECK(lo <= hi, "uniform: low ", lo, " is greater than high ", hi);
  return random_fill(RandomKind::uniform, shape, lo, hi, o, g);
}
Tensor randn(const Shape& shape, TensorOptions o, Generator* g) { return random_fill(RandomKind::normal, shape, 0, 1, o, g); }
Tensor normal(const Shape& shape, double mean, double std, TensorOptions o, Generator* g) {
  KILN_CHECK(std >= 0, "normal: std must be >= 0, got ", std);
  return random_fill(RandomKind::normal, shape, mean, std, o, g);
}
Tensor randint(int64_t low, int64_t high, const Shape& shape, TensorOptions o, Generator* g) {
  // high - low in unsigned arithmetic: as int64 it overflows for a range such as [-2^63, 2^63 - 1).
  KILN_CHECK(low < high && uint64_t(high) - uint64_t(low) <= (uint64_t(1) << 24),
             "randint: need low < high and high - low <= 2^24, got [", low, ", ", high, ")");
  // 24 random bits per element: floor(u * range) is exact and below range.
  const Tensor u = random_fill(RandomKind::uniform, shape, 0, 1, TensorOptions(DType::f64, o.device), g);
  if (u.device().is_meta()) return finish(make_tensor(shape, o.dtype, kMeta), o);
  const std::vector<double> v = u.to_vector();
  std::vector<double> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = double(low) + std::floor(v[i] * double(high - low));
  return finish(from_vector(r, shape, TensorOptions(o.dtype, o.device)), o);
}

Tensor bernoulli(const Shape& shape, double p, TensorOptions o, Generator* g) {
  KILN_CHECK(p >= 0 && p <= 1, "bernoulli: p must be in [0, 1], got ", p);
  return random_fill(RandomKind::bernoulli, shape, p, 0, o, g);
}

}  // namespace kiln
