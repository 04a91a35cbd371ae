// kiln.Tensor: properties, views, indexing, the Python operators and the autograd entry points.
// The functions of ops.h and nn_ops.h are module functions (ops.cpp); the package attaches the
// usual ones as methods (python/kiln/_tensor_methods.py).
#include <algorithm>

#include <nanobind/stl/function.h>
#include <nanobind/stl/pair.h>

#include "common.h"
#include "engine/internal.h"

namespace kiln::py {
namespace {

nb::object scalar_of(const Tensor& t) {
  if (t.numel() != 1)  // as torch: no source location in the message
    value_error("a tensor with " + std::to_string(t.numel()) +
                " elements cannot be converted to a Python number (item(), float() and int() need exactly 1)");
  Tensor c;
  {
    GilRelease nogil;
    c = t.detach();
  }
  if (t.dtype() == DType::boolean) return nb::bool_(c.item<int64_t>() != 0);
  if (is_integral(t.dtype())) return nb::int_(c.item<int64_t>());
  return nb::float_(c.item_double());
}

nb::object to_list(const Tensor& t) {
  if (t.dim() == 0) return scalar_of(t);
  std::vector<double> vf;
  std::vector<int64_t> vi;
  const bool integral = is_integral(t.dtype());
  {
    GilRelease nogil;
    if (integral)
      vi = t.values<int64_t>();
    else
      vf = t.to_vector();
  }
  const Shape shape = t.shape();
  const bool is_bool = t.dtype() == DType::boolean;
  size_t pos = 0;
  std::function<nb::object(size_t)> build = [&](size_t d) -> nb::object {
    nb::list out;
    for (int64_t i = 0; i < shape[d]; ++i) {
      if (d + 1 == shape.size()) {
        if (is_bool)
          out.append(nb::bool_(vi[pos] != 0));
        else if (integral)
          out.append(nb::int_(vi[pos]));
        else
          out.append(nb::float_(vf[pos]));
        ++pos;
      } else {
        out.append(build(d + 1));
      }
    }
    return out;
  };
  return build(0);
}

nb::tuple shape_tuple(const Shape& s) {
  nb::list l;
  for (int64_t v : s) l.append(v);
  return nb::tuple(l);
}

// A float, or an int that a double holds exactly (|v| <= 2^53): such a number may go to an op as a
// double; a larger int goes as an exact int64 tensor, and one outside int64 is an OverflowError.
bool is_double_exact(nb::handle h, const char* what) {
  if (PyFloat_Check(h.ptr())) return true;
  if (!PyLong_Check(h.ptr()) || PyBool_Check(h.ptr())) return false;
  const int64_t v = *exact_int(h, what);
  return v >= -(int64_t(1) << 53) && v <= (int64_t(1) << 53);
}

// ---- indexing ---------------------------------------------------------------------------------

// The release of a .data alias's storage (_alias_no_version): keeps the storage it aliases alive, and
// names it (_data_shared finds there whether another tensor holds the alias's memory).
struct AliasRelease {
  std::shared_ptr<Storage> src;
  void operator()(void*) const {}
};

// An integer index: a Python int, or a scalar with __index__ that is not an array (a NumPy integer
// scalar drops its dim as an int does). Bools are not integer indices.
bool is_int_index(nb::handle h) {
  if (PyBool_Check(h.ptr())) return false;
  if (PyLong_Check(h.ptr())) return true;
  if (nb::isinstance<Tensor>(h)) {  // a 0-dim integer tensor acts as an int (select: a view), as in torch
    const Tensor& t = nb::cast<const Tensor&>(h);
    return t.dim() == 0 && is_integral(t.dtype()) && t.dtype() != DType::boolean && t.dtype() != DType::u8;
  }
  if (!PyIndex_Check(h.ptr())) return false;
  nb::object nd = nb::getattr(h, "ndim", nb::none());
  if (nd.is_none()) return true;
  if (!PyLong_Check(nd.ptr()) || PyLong_AsLong(nd.ptr()) != 0) return false;
  nb::object dt = nb::getattr(h, "dtype", nb::none());
  if (dt.is_none()) return true;
  const std::string kind = str_of(nb::getattr(dt, "kind", nb::str("")));
  return kind == "i" || kind == "u";
}

int64_t int_index(nb::handle h) {
  if (nb::isinstance<Tensor>(h)) return nb::cast<const Tensor&>(h).item<int64_t>();
  nb::object i = nb::steal(PyNumber_Index(h.ptr()));
  if (!i.is_valid()) throw nb::python_error();
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
  if (overflow != 0) index_error("index " + str_of(i) + " is out of range (an index must fit in int64)");
  return int64_t(v);
}

// The name of h's type where NumPy defines it ("ndarray", "float32", "bool"), else "".
std::string numpy_type(nb::handle h) {
  nb::handle type = nb::handle(reinterpret_cast<PyObject*>(Py_TYPE(h.ptr())));
  if (str_of(nb::getattr(type, "__module__", nb::str(""))) != "numpy") return "";
  return str_of(nb::getattr(type, "__name__", nb::str("")));
}

bool is_numpy_array(nb::handle h) { return numpy_type(h) == "ndarray"; }
// A NumPy scalar (np.float32(1.7), np.bool_): a number, not index data.
bool is_numpy_scalar(nb::handle h) {
  const std::string t = numpy_type(h);
  return !t.empty() && t != "ndarray";
}

// An index tensor or its data: a list, an array, or another non-string sequence (a tuple or range,
// as x[[(0, 1)]] and x[[range(2), [1, 2]]] hold once read as a tuple of indices), as torch's. A NumPy
// scalar that is not an integer (np.float64(2.5), np.bool_) is refused as torch refuses it, not
// truncated to an index.
bool is_tensor_index(nb::handle h) {
  if (nb::isinstance<Tensor>(h) || PyList_Check(h.ptr())) return true;
  if (is_numpy_scalar(h)) return false;
  if (nb::hasattr(h, "__array__")) return !is_int_index(h);
  return PySequence_Check(h.ptr()) && !PyUnicode_Check(h.ptr()) && !PyBytes_Check(h.ptr()) &&
         !PyByteArray_Check(h.ptr()) && !is_int_index(h);
}

void warn_user(const std::string& msg) {
  if (PyErr_WarnEx(PyExc_UserWarning, msg.c_str(), 1) < 0) throw nb::python_error();
}

// As torch: a uint8 index is a mask (deprecated there, with this warning), not integer indices.
void warn_uint8_index() {
  warn_user(
      "indexing with dtype uint8 is deprecated (as in torch, it is read as a bool mask), please use a dtype "
      "bool instead");
}

// An index tensor as torch takes one: int64 or int32 indices, or a bool mask (uint8 is read as one, with
// torch's deprecation warning when `warn`); other tensor dtypes (int8, int16, floats) are refused as there.
// Index data that is not a tensor (a list, a NumPy array of any other dtype: int8, int32, float, and []
// which comes out as floats) is converted to int64 as torch's indexing_tensor_from_data does; only bool
// and uint8 data stay a mask.
Tensor index_tensor(nb::handle h, bool warn = true) {
  nb::object data = nb::borrow(h);
  if (!nb::isinstance<Tensor>(h) && nb::hasattr(h, "__array__") && nb::hasattr(h, "astype")) {
    // A NumPy array of a dtype Kiln lacks (uint16, uint32, uint64, ...): its int64 values, as torch's.
    const nb::object dt = nb::getattr(h, "dtype", nb::none());
    const std::string kind = dt.is_none() ? "" : str_of(nb::getattr(dt, "kind", nb::str("")));
    const std::string name = dt.is_none() ? "" : str_of(nb::getattr(dt, "name", nb::str("")));
    if ((kind == "i" || kind == "u" || kind == "f") && name != "uint8") data = h.attr("astype")("int64");
  }
  Tensor t = to_tensor(data, nullptr, "index");
  // Python data and NumPy arrays only: another library's tensor (torch's) keeps its dtype's rule.
  const bool data_of_python = !nb::isinstance<Tensor>(h) && (!nb::hasattr(h, "__array__") || is_numpy_array(h));
  if (data_of_python && t.dtype() != DType::u8 && t.dtype() != DType::boolean && t.dtype() != DType::i64)
    t = t.to(DType::i64);
  if (t.dtype() == DType::u8) {
    if (warn) warn_uint8_index();
    return t.to(DType::boolean);
  }
  if (t.dtype() != DType::boolean && t.dtype() != DType::i64 && t.dtype() != DType::i32)
    index_error("tensors used as indices must be long, int, byte or bool tensors, not " +
                std::string(dtype_name(t.dtype())));
  return t;
}

// A Python bool, or a 0-dim bool tensor, which acts as one (a new dim of size 1 or 0, as in torch); a
// 0-dim uint8 tensor too, as torch's (without a warning there).
bool is_bool_index(nb::handle h) {
  if (PyBool_Check(h.ptr())) return true;
  if (!nb::isinstance<Tensor>(h)) return false;
  const Tensor& t = nb::cast<const Tensor&>(h);
  return t.dim() == 0 && (t.dtype() == DType::boolean || t.dtype() == DType::u8);
}

bool bool_index(nb::handle h) {
  if (PyBool_Check(h.ptr())) return h.is(Py_True);
  return nb::cast<const Tensor&>(h).item<int64_t>() != 0;
}

// Which dims of the indexed tensor an item consumes.
int64_t consumed_dims(nb::handle item) {
  if (item.is_none() || item.is(Py_Ellipsis) || is_bool_index(item)) return 0;
  if (is_int_index(item) || PySlice_Check(item.ptr())) return 1;
  if (is_tensor_index(item)) {
    Tensor t = index_tensor(item, false);
    return t.dtype() == DType::boolean ? std::max<int64_t>(t.dim(), 1) : 1;
  }
  index_error("only integers, slices, None, ..., and integer or bool tensors are valid indices (got " +
              nb::cast<std::string>(nb::str(nb::handle(reinterpret_cast<PyObject*>(Py_TYPE(item.ptr()))))) + ")");
}

struct Indexed {
  Tensor view;            // what the basic items (ints, slices, None, ...) select: a view of x
  bool advanced = false;  // tensor indices remain, applied at `adv_dims` of `view`
  Tensor adv;             // the first of them (the only one when `advs` has one)
  int64_t adv_dim = 0;
  std::vector<Tensor> advs;  // every tensor index, in subscript order
  std::vector<int64_t> adv_dims;
};

// torch's rule for a list used as an index: one that holds a sequence, a tensor, a slice, None or
// Ellipsis (and has fewer than 32 items) is read as a tuple of indices (x[[t0, t1]] is x[t0, t1]), with
// torch's warning; a list of plain ints or bools stays one index tensor.
nb::object index_key(nb::handle key) {
  if (!PyList_Check(key.ptr()) || PyList_GET_SIZE(key.ptr()) >= 32) return nb::borrow(key);
  for (nb::handle it : nb::borrow<nb::list>(key))
    if (nb::isinstance<Tensor>(it) || PySequence_Check(it.ptr()) || PySlice_Check(it.ptr()) || it.is_none() ||
        it.is(Py_Ellipsis)) {
      warn_user(
          "Using a non-tuple sequence for multidimensional indexing is deprecated (as in torch, it is read as "
          "a tuple of indices); use x[tuple(seq)] instead of x[seq]");
      return nb::steal(PyList_AsTuple(key.ptr()));
    }
  return nb::borrow(key);
}

// Applies the basic items of `key` to x as views; the tensor indices are kept for the caller.
// `for_write`: a negative-step slice (a copy) is refused, as a write through it would be lost.
Indexed apply_index(const Tensor& x, nb::handle key, bool for_write) {
  nb::tuple items = nb::isinstance<nb::tuple>(key) ? nb::borrow<nb::tuple>(key) : nb::make_tuple(key);
  int64_t used = 0, ellipses = 0;
  bool tensors = false;  // a tensor index among the items
  for (nb::handle it : items) {
    used += consumed_dims(it);
    if (it.is(Py_Ellipsis)) ++ellipses;
    if (!it.is_none() && !it.is(Py_Ellipsis) && !is_bool_index(it) && !is_int_index(it) && !PySlice_Check(it.ptr()))
      tensors = true;
  }
  if (ellipses > 1) index_error("an index can only have a single ellipsis ('...')");
  if (used > x.dim())
    index_error("too many indices for a tensor of dimension " + std::to_string(x.dim()) + " (" + std::to_string(used) +
                " given)");
  Indexed r;
  Tensor v = x;
  int64_t d = 0;    // the dim of v the next item applies to
  int64_t src = 0;  // the dim of x it applies to (for messages)
  for (nb::handle it : items) {
    if (it.is_none()) {
      v = v.unsqueeze(d++);
    } else if (is_bool_index(it)) {
      // As NumPy and torch: a new dim of size 1 (True) or 0 (False), like a 0-dim mask; with tensor
      // indices, an index into that new dim (of shape [1] or [0]) broadcast with them.
      v = v.unsqueeze(d);
      if (tensors) {
        const Tensor at = bool_index(it) ? zeros({1}, TensorOptions(DType::i64, x.device()))
                                         : zeros({0}, TensorOptions(DType::i64, x.device()));
        if (!r.advanced) r.adv = at, r.adv_dim = d;
        r.advanced = true;
        r.advs.push_back(at);
        r.adv_dims.push_back(d);
      } else if (!bool_index(it)) {
        v = v.narrow(d, 0, 0);
      }
      ++d;
    } else if (it.is(Py_Ellipsis)) {
      d += x.dim() - used;
      src += x.dim() - used;
    } else if (is_int_index(it)) {
      int64_t i = int_index(it);
      const int64_t n = v.size(d);
      if (i < -n || i >= n)
        index_error("index " + std::to_string(i) + " is out of bounds for dimension " + std::to_string(src) +
                    " with size " + std::to_string(n));
      v = v.select(d, i < 0 ? i + n : i);
      ++src;
    } else if (PySlice_Check(it.ptr())) {
      Py_ssize_t start, stop, step;
      if (PySlice_Unpack(it.ptr(), &start, &stop, &step) < 0) throw nb::python_error();
      const Py_ssize_t len = PySlice_AdjustIndices(Py_ssize_t(v.size(d)), &start, &stop, step);
      if (step > 0) {
        v = v.slice(d, start, start + len * step > v.size(d) ? v.size(d) : start + (len - 1) * step + 1, step);
        if (len == 0) v = v.narrow(d, 0, 0);
      } else {
        if (for_write) index_error("assignment through a negative-step slice is not supported (it selects a copy)");
        std::vector<int64_t> at;
        for (Py_ssize_t k = 0; k < len; ++k) at.push_back(int64_t(start + k * step));
        v = index_select(v, d, from_blob_copy(at.data(), {int64_t(at.size())}).to(v.device()));
      }
      ++d;
      ++src;
    } else {
      Tensor t = index_tensor(it);
      if (!r.advanced) r.adv = t, r.adv_dim = d;
      r.advanced = true;
      r.advs.push_back(t);
      r.adv_dims.push_back(d);
      const int64_t k = t.dtype() == DType::boolean ? std::max<int64_t>(t.dim(), 1) : 1;
      d += k;
      src += k;
    }
  }
  r.view = v;
  return r;
}

// x[idx] for one integer or bool tensor at dim d.
Tensor take_advanced(const Tensor& v, const Tensor& idx, int64_t d) {
  if (idx.dtype() == DType::boolean) {
    const int64_t k = std::max<int64_t>(idx.dim(), 1);
    for (int64_t j = 0; j < idx.dim(); ++j)
      if (idx.size(j) != v.size(d + j))
        index_error("the mask's shape " + detail::str_cat(idx.shape()) + " does not match the indexed dims at " +
                    std::to_string(d + j) + " (size " + std::to_string(v.size(d + j)) + ")");
    Shape s(v.shape().begin(), v.shape().begin() + d);
    s.push_back(-1);
    s.insert(s.end(), v.shape().begin() + d + k, v.shape().end());
    const Tensor flat = v.reshape(s);
    const Tensor where_true = nonzero(idx.reshape({-1})).select(1, 0);
    return index_select(flat, d, where_true);
  }
  const int64_t n = v.size(d);
  Tensor i = idx.to(DType::i64);
  const std::vector<int64_t> vals = i.values<int64_t>();
  for (int64_t x : vals)
    if (x < -n || x >= n)
      index_error("index " + std::to_string(x) + " is out of bounds for dimension " + std::to_string(d) +
                  " with size " + std::to_string(n));
  i = add(i, mul(lt(i, scalar_tensor(0, TensorOptions(DType::i64, i.device()))).to(DType::i64),
                 scalar_tensor(double(n), TensorOptions(DType::i64, i.device()))));
  if (i.device() != v.device()) i = i.to(v.device());
  Tensor picked = index_select(v, d, i.reshape({-1}));
  Shape s(v.shape().begin(), v.shape().begin() + d);
  s.insert(s.end(), idx.shape().begin(), idx.shape().end());
  s.insert(s.end(), v.shape().begin() + d + 1, v.shape().end());
  return picked.reshape(s);
}

std::string shape_list(const Shape& s) {
  std::string out = "[";
  for (size_t j = 0; j < s.size(); ++j) out += (j ? ", " : "") + std::to_string(s[j]);
  return out + "]";
}

// Several tensor indices in one subscript, resolved as torch does: a bool mask stands for the
// coordinates of its true elements, and the integer indices broadcast together to one shape.
struct Advanced {
  std::vector<Tensor> idx;    // i64, non-negative, on the view's device
  std::vector<int64_t> dims;  // the dims of the view they index, increasing
  Shape shape;                // their broadcast shape
  bool in_place = false;      // adjacent and not at dim 0: the result's index dims stand where the indexed
                              // dims stood; otherwise they come first (torch's and NumPy's rule)
  std::vector<int64_t> perm;  // the indexed dims first, then the others in order
  Shape rest;                 // the sizes of the others
};

Advanced resolve_advanced(const Tensor& v, const Indexed& r) {
  Advanced a;
  std::string shapes;
  for (size_t j = 0; j < r.advs.size(); ++j) {
    const Tensor& t = r.advs[j];
    const int64_t d = r.adv_dims[j];
    shapes += (j ? ", " : "") + shape_list(t.shape());
    if (t.dtype() == DType::boolean) {
      for (int64_t c = 0; c < t.dim(); ++c)
        if (t.size(c) != v.size(d + c))
          index_error("the mask's shape " + shape_list(t.shape()) + " does not match the indexed dims at " +
                      std::to_string(d + c) + " (size " + std::to_string(v.size(d + c)) + ")");
      Tensor nz = nonzero(t);
      if (nz.device() != v.device()) nz = nz.to(v.device());
      for (int64_t c = 0; c < t.dim(); ++c) {
        a.idx.push_back(nz.select(1, c));
        a.dims.push_back(d + c);
      }
      continue;
    }
    const int64_t n = v.size(d);
    Tensor i = t.to(DType::i64);
    if (i.numel() > 0) {
      const int64_t lo = amin(i).item<int64_t>(), hi = amax(i).item<int64_t>();
      if (hi >= n || lo < -n)
        index_error("index " + std::to_string(hi >= n ? hi : lo) + " is out of bounds for dimension " +
                    std::to_string(d) + " with size " + std::to_string(n));
    }
    if (i.device() != v.device()) i = i.to(v.device());
    const Tensor zero = scalar_tensor(0, TensorOptions(DType::i64, i.device()));
    a.idx.push_back(where(lt(i, zero), add(i, scalar_tensor(double(n), TensorOptions(DType::i64, i.device()))), i));
    a.dims.push_back(d);
  }
  try {
    for (const Tensor& t : a.idx) a.shape = broadcast_shapes(a.shape, t.shape());
  } catch (const Error&) {
    index_error("shape mismatch: indexing tensors could not be broadcast together with shapes " + shapes);
  }
  a.in_place = a.dims.front() > 0;
  for (size_t j = 1; j < a.dims.size(); ++j)
    if (a.dims[j] != a.dims[j - 1] + 1) a.in_place = false;
  a.perm = a.dims;
  for (int64_t j = 0; j < v.dim(); ++j)
    if (std::find(a.dims.begin(), a.dims.end(), j) == a.dims.end()) {
      a.perm.push_back(j);
      a.rest.push_back(v.size(j));
    }
  return a;
}

// The shape of v[a] with the index dims first, and the order that moves them to where torch puts them.
Shape front_shape(const Advanced& a) {
  Shape s = a.shape;
  s.insert(s.end(), a.rest.begin(), a.rest.end());
  return s;
}

std::vector<int64_t> result_order(const Advanced& a) {
  const int64_t nb = int64_t(a.shape.size()), pre = a.dims.front(), all = nb + int64_t(a.rest.size());
  std::vector<int64_t> order;
  for (int64_t j = 0; j < pre; ++j) order.push_back(nb + j);
  for (int64_t j = 0; j < nb; ++j) order.push_back(j);
  for (int64_t j = nb + pre; j < all; ++j) order.push_back(j);
  return order;
}

// v[i0, i1, ...] for several tensor indices: the indexed dims, moved to the front and flattened into
// one, are read by index_select at each index's flat position, so the gradient accumulates at
// repeated positions as index_select's does.
Tensor take_multi(const Tensor& v, const Advanced& a) {
  Shape flat{1};
  for (int64_t d : a.dims) flat[0] *= v.size(d);
  flat.insert(flat.end(), a.rest.begin(), a.rest.end());
  Tensor lin = zeros(a.shape, TensorOptions(DType::i64, v.device()));
  for (size_t j = 0; j < a.idx.size(); ++j) lin = lin * double(v.size(a.dims[j])) + a.idx[j];
  Tensor out = index_select(v.permute(a.perm).reshape(flat), 0, lin.reshape({-1})).reshape(front_shape(a));
  return a.in_place ? out.permute(result_order(a)) : out;
}

Tensor getitem(const Tensor& x, nb::handle key_in) {
  const nb::object key = index_key(key_in);
  Indexed r = apply_index(x, key, false);
  if (!r.advanced) return r.view;
  if (r.advs.size() > 1) return take_multi(r.view, resolve_advanced(r.view, r));
  return take_advanced(r.view, r.adv, r.adv_dim);
}

// Leading dims of size 1 beyond the target's rank dropped, as torch does (x[0] = t[None]).
Tensor drop_leading_ones(Tensor v, int64_t target_dim) {
  while (v.dim() > target_dim && v.size(0) == 1) v = v.squeeze(0);
  return v;
}

// The engine refuses an in-place write on a tensor that requires grad (or from an operand that does)
// under the name of the op it runs (copy_ for /=, fill_ for x[0] = 5.0); checked here first under the
// op the user called, with kiln.no_grad() as the way out.
void check_inplace(const Tensor& x, const char* op, nb::handle operand = nb::handle()) {
  if (!GradMode::enabled()) return;
  KILN_CHECK(!x.requires_grad(), op, ": in-place update of a tensor that requires grad ", x.type_str(),
             "; do it under kiln.no_grad() or use the out-of-place op");
  if (operand.is_valid() && nb::isinstance<Tensor>(operand)) {
    const Tensor& o = nb::cast<const Tensor&>(operand);
    KILN_CHECK(!o.requires_grad(), op, ": the operand ", o.type_str(),
               " requires grad, and an in-place write is not recorded by autograd, so its gradient would be lost; "
               "use the out-of-place op (z = z + v, kiln.where(mask, v, z), kiln.cat), or do it under "
               "kiln.no_grad() if the gradient is not wanted");
  }
}

void setitem(Tensor& x, nb::handle key_in, nb::handle value) {
  const nb::object key = index_key(key_in);
  check_inplace(x, "x[key] = value");
  // Kiln does not record in-place writes: a value that requires grad would lose its gradient silently.
  if (nb::isinstance<Tensor>(value) && GradMode::enabled() && nb::cast<const Tensor&>(value).requires_grad())
    value_error(
        "x[key] = value: the value requires grad, and Kiln does not record in-place writes, so its gradient "
        "would be lost; build the result out of place (x = kiln.where(mask, value, x), x = x + value, "
        "kiln.cat([...])), or assign under kiln.no_grad() if the gradient is not wanted");
  Indexed r = apply_index(x, key, true);
  // A NumPy integer is a number as a Python int is (x[idx] = np.int64(300) into i8 is refused, not wrapped).
  nb::object number = nb::borrow(value);
  if (!nb::isinstance<Tensor>(value) && !PyLong_Check(value.ptr()) && is_int_index(value)) {
    number = nb::steal(PyNumber_Index(value.ptr()));
    if (!number.is_valid()) throw nb::python_error();
  }
  const bool scalar = PyFloat_Check(number.ptr()) || (PyLong_Check(number.ptr()) && is_double_exact(number, "value"));
  if (!r.advanced) {
    if (scalar)
      r.view.fill_(fill_value(x.dtype(), number, "x[key] = value"));
    else
      r.view.copy_(drop_leading_ones(to_tensor(value, &x, "value"), r.view.dim()));
    return;
  }
  // A tensor index: index_put with the indexed dims moved to the front (a view of x), written back
  // in place. Values broadcast to what x[key] would give.
  // A number is written with fill_, as x[0] = v above is, so that one out of an integer dtype's range is
  // refused (i8 x[idx] = 300) rather than wrapped.
  Tensor vals = scalar ? empty({}, TensorOptions(r.view.dtype(), r.view.device()))
                             .fill_(fill_value(x.dtype(), number, "x[key] = value"))
                       : to_tensor(value, &x, "value");
  if (vals.dtype() != r.view.dtype()) vals = vals.to(r.view.dtype());
  if (vals.device() != r.view.device()) vals = vals.to(r.view.device());
  if (r.advs.size() > 1) {
    // Several tensor indices: index_put on a view of x with the indexed dims first, written back.
    const Advanced a = resolve_advanced(r.view, r);
    Shape result = front_shape(a);
    std::vector<int64_t> back(result.size());
    if (a.in_place) {
      const std::vector<int64_t> order = result_order(a);
      Shape moved;
      for (size_t j = 0; j < order.size(); ++j)
        moved.push_back(result[size_t(order[j])]), back[size_t(order[j])] = int64_t(j);
      result = moved;
    }
    vals = drop_leading_ones(vals, int64_t(result.size())).expand(result);
    if (a.in_place) vals = vals.permute(back);
    Tensor p = r.view.permute(a.perm);
    p.copy_(index_put(p.detach(), a.idx, vals.contiguous(), false));
    return;
  }
  const int64_t d = r.adv_dim;
  const int64_t k = r.adv.dtype() == DType::boolean ? std::max<int64_t>(r.adv.dim(), 1) : 1;  // dims indexed
  Tensor idx = r.adv;
  if (idx.dtype() != DType::boolean) {
    idx = idx.to(DType::i64);
    if (idx.device() != r.view.device()) idx = idx.to(r.view.device());
  }
  const Shape result = take_advanced(r.view, r.adv, d).shape();
  vals = drop_leading_ones(vals, int64_t(result.size()));
  const int64_t m = int64_t(result.size()) - (r.view.dim() - k);  // dims of the index in the result
  std::vector<int64_t> front, vfront;
  for (int64_t j = d; j < d + k; ++j) front.push_back(j);
  for (int64_t j = d; j < d + m; ++j) vfront.push_back(j);
  for (int64_t j = 0; j < r.view.dim(); ++j)
    if (j < d || j >= d + k) front.push_back(j);
  for (int64_t j = 0; j < int64_t(result.size()); ++j)
    if (j < d || j >= d + m) vfront.push_back(j);
  Tensor p = r.view.permute(front);
  vals = vals.expand(result).permute(vfront).contiguous();
  Tensor updated = index_put(p.detach(), {idx}, vals, false);
  p.copy_(updated);
}

// A number that goes to the engine's double overloads (x * v): beside a floating tensor only, where they
// keep the 16-bit rules. Beside an integer or bool tensor it goes through to_tensor, as PyTorch's wrapped
// numbers: a float makes the result f32 (the overloads take a whole float for an integer of x's dtype:
// i8 x * 300.0 wrapped), and an int wraps into x's dtype from its exact int64 value.
bool number_for_double_op(const Tensor& x, nb::handle h, const char* what) {
  return is_floating(x.dtype()) && is_double_exact(h, what);
}

// a OP b for a Tensor and a Tensor, a number or anything to_tensor takes; nogil around the op.
template <typename TT, typename TS> Tensor binary(const Tensor& a, nb::handle b, TT tensor_op, TS scalar_op) {
  if (number_for_double_op(a, b, "operand")) {
    const double v = nb::cast<double>(b);
    GilRelease nogil;
    return scalar_op(a, v);
  }
  const Tensor t = to_tensor(b, &a, "operand");
  GilRelease nogil;
  return tensor_op(a, t);
}
}  // namespace

// a / b or b / a (number_first) for an integer or bool tensor a and a Python number b: true division in
// f32 with the number as it is, as PyTorch's (to_tensor would wrap an int into a's dtype first: i8 x / 300
// divided by 44); an int beyond 2^53 converts to f32 from its exact int64. Nothing for other operands.
std::optional<Tensor> divide_by_number(const Tensor& a, nb::handle b, bool number_first) {
  if (is_floating(a.dtype())) return std::nullopt;
  Tensor n;
  if (PyFloat_Check(b.ptr()))
    n = scalar_tensor(PyFloat_AS_DOUBLE(b.ptr()), TensorOptions(DType::f32, a.device()));
  else if (PyLong_Check(b.ptr()) && !PyBool_Check(b.ptr()))
    n = int64_scalar(*exact_int(b, "operand")).to(DType::f32);
  else
    return std::nullopt;
  GilRelease nogil;
  return number_first ? div(n, a) : div(a, n);
}

namespace {

template <typename TT> Tensor binary(const Tensor& a, nb::handle b, TT tensor_op) {
  const Tensor t = to_tensor(b, &a, "operand");
  GilRelease nogil;
  return tensor_op(a, t);
}

using TT2 = Tensor (*)(const Tensor&, const Tensor&);

// x ** number for a 16-bit x: the exponent a 0-dim tensor of x's dtype (rounded to it), as torch's (a wrapped
// number of the op's dtype, measured over every bf16 and f16 value: bf16 x ** 0.1 is x ** 0.10009765625
// there). That is kiln.pow(x, 0.1)'s operand, and the same op: both spellings give the same value and
// gradient. Only + - * / keep a number in f32.
Tensor pow_number(const Tensor& x, double v) {
  if (!is_low_precision(x.dtype())) return pow(x, v);
  return pow(x, scalar_like(v, x));
}
}  // namespace

Tensor pow_operand(const Tensor& a, nb::handle b) {
  // An int exponent of an integer tensor stays a number for the engine's pow, which refuses a negative one
  // or one outside x's dtype as torch's (to_tensor would wrap it: x_i8 ** 257 was x ** 1).
  // A negative one is refused here, as torch's (the engine's double cannot tell -3 from -3.0, whose result is
  // f32), and a bool base is raised as int64, as torch's (bool ** 300 is int64).
  // The int is read exactly (a Python int or a NumPy integer; one past int64 is an OverflowError), so
  // x_i8 ** (2**60 + 1) and x_i8 ** np.int64(257) are refused rather than converted.
  // A NumPy bool is a float number to PyTorch (x_i64 ** np.True_ and mask ** np.True_ are f32 there).
  const std::string tn = py_type_name(b);
  if (tn == "numpy.bool" || tn == "numpy.bool_") return pow_operand(a, nb::float_(PyObject_IsTrue(b.ptr()) == 1));
  // bool ** a Python bool stays bool, as PyTorch's: mask ** True is mask, mask ** False all true (a bool
  // tensor exponent is refused below, as there).
  if (a.dtype() == DType::boolean && PyBool_Check(b.ptr())) return b.is(Py_True) ? a.clone() : ones_like(a);
  if (!is_floating(a.dtype()) && is_int_index(b) && !nb::isinstance<Tensor>(b)) {
    nb::object as_int = nb::steal(PyNumber_Index(b.ptr()));
    if (!as_int.is_valid()) throw nb::python_error();
    const int64_t v = *exact_int(as_int, "pow: the exponent");
    KILN_CHECK(v >= 0, "pow: integers to negative integer powers are not allowed (", a.type_str(), " ** ", v,
               "), as in PyTorch; use a float tensor or a float exponent");
    const Tensor base = a.dtype() == DType::boolean ? a.to(DType::i64) : a;
    if (base.dtype() != DType::i64) {
      const int64_t hi = base.dtype() == DType::u8    ? 255
                         : base.dtype() == DType::i8  ? 127
                         : base.dtype() == DType::i16 ? 32767
                                                      : 2147483647;
      KILN_CHECK(v <= hi, "pow: the exponent ", v, " does not fit in the dtype of the base, ", base.type_str(),
                 " (0 to ", hi, " for an int exponent)");
    }
    // A double holds it exactly up to 2^53; a larger one (an i64 base) goes as an exact i64 tensor.
    if (v > (int64_t(1) << 53)) {
      const Tensor e = to_tensor(b, &base, "operand");
      GilRelease nogil;
      return pow(base, e);
    }
    GilRelease nogil;
    return pow(base, double(v));
  }
  return binary(
      a, b, [](const Tensor& x, const Tensor& y) { return pow(x, y); },
      [](const Tensor& x, double v) { return pow_number(x, v); });
}

namespace {

// a OP b (b OP a where reflected) for the bitwise operators: b a Tensor, a Python int or bool (an int takes
// a's integer dtype, wrapped; beside a bool tensor it is i64, as torch's) or anything to_tensor takes. The
// engine refuses a floating operand, naming the op.
Tensor bitwise_operator(const Tensor& a, nb::handle b, TT2 fn, bool reflected) {
  const Tensor t = to_tensor(b, &a, "operand");
  GilRelease nogil;
  return reflected ? fn(t, a) : fn(a, t);
}

// x OP= o and x.bitwise_OP_(o): the result, in result_type(x, o), written into x, which must take it (PyTorch's
// rule: i32 &= an i64 tensor is taken; bool |= 1 is refused, the result being i64).
Tensor& bitwise_inplace(Tensor& x, nb::handle o, const char* op, TT2 fn) {
  check_inplace(x, op, o);
  const Tensor t = to_tensor(o, &x, "operand");
  // The result must have x's shape (checked before computing it, as add_ does)
  Shape shape;
  try {
    shape = broadcast_shapes(x.shape(), t.shape());
  } catch (const Error& e) {
    KILN_FAIL(op, ": ", e.message());
  }
  KILN_CHECK(shape == x.shape(), op, ": cannot broadcast ", t.shape(), " into ", x.shape(),
             " (the result would not fit x in place)");
  detail::check_inplace_result(x, t, op);  // the engine's in-place ops' rule, before the result is computed
  GilRelease nogil;
  return x.copy_(fn(x, t));
}

// What Tensor.register_hook returns: remove() takes the hook off, if the tensor still lives (the
// handle does not keep it alive).
struct HookHandle {
  std::weak_ptr<TensorImpl> tensor;
  int id;
  bool post_accumulate = false;  // a register_post_accumulate_grad_hook hook
  void remove() const {
    if (const std::shared_ptr<TensorImpl> t = tensor.lock()) {
      if (post_accumulate)
        Tensor(t).remove_grad_ready_hook(id);
      else
        Tensor(t).remove_hook(id);
    }
  }
};

}  // namespace

void bind_tensor(nb::module_& m) {
  m.def(
      "_check_inplace", [](const Tensor& x, const char* op, nb::handle operand) { check_inplace(x, op, operand); },
      nb::arg("x"), nb::arg("op"), nb::arg("operand") = nb::none(),
      "Refuses, naming op, an in-place update that autograd would miss (for the in-place methods written in "
      "Python).");
  m.def(
      "_rebind",
      [](Tensor& obj, const Tensor& other) {
        // copy.deepcopy of a kiln.models model (python/kiln/models.py): a parameter copied before the
        // model is a fresh tensor that other copied objects already hold; pointing that very object at
        // the new model's tensor makes all of them hold the copied model's parameter, as torch's memo does.
        if (obj.grad_fn()) value_error("_rebind: only a leaf tensor can be pointed at another");
        obj = other;
      },
      nb::arg("obj"), nb::arg("other"),
      "Points the Python tensor object `obj` at `other` (a second handle onto it); for copy.deepcopy.");
  nb::class_<HookHandle>(m, "RemovableHandle",
                         "Returned by Tensor.register_hook and register_post_accumulate_grad_hook; remove() takes "
                         "the hook off.")
      .def("remove", &HookHandle::remove)
      .def_ro("id", &HookHandle::id)
      .def(
          "__enter__", [](HookHandle& h) -> HookHandle& { return h; }, nb::rv_policy::reference)
      .def("__exit__", [](HookHandle& h, nb::args) { h.remove(); });
  nb::class_<Tensor> t(m, "Tensor",
                       "A strided view onto refcounted storage, with autograd state. Make one with kiln.tensor, "
                       "kiln.zeros, kiln.from_numpy, kiln.from_dlpack, ...");
  t.def(
       "__init__", [](Tensor* self, const Tensor& other) { new (self) Tensor(other); }, nb::arg("other"),
       "A second handle onto the same tensor (for subclasses such as kiln.nn.Parameter).")
      .def_prop_ro("shape", [](const Tensor& x) { return shape_tuple(x.shape()); })
      .def_prop_ro("dtype", &Tensor::dtype)
      .def_prop_ro("device", &Tensor::device)
      .def_prop_ro("ndim", &Tensor::dim)
      .def_prop_ro("is_cuda", [](const Tensor& x) { return x.device().is_cuda(); })
      .def_prop_ro("_version", &Tensor::version)
      .def_prop_ro(
          "_handles", [](const Tensor& x) { return x.impl_ptr().use_count(); },
          "How many handles hold this tensor (Python's, an optimizer's, the autograd graph's): Module.to warns "
          "when a parameter it replaces is still held.")
      .def_prop_ro("T",
                   [](const Tensor& x) {
                     std::vector<int64_t> d;
                     for (int64_t i = x.dim() - 1; i >= 0; --i) d.push_back(i);
                     return x.permute(d);
                   })
      .def("dim", &Tensor::dim)
      .def("numel", &Tensor::numel)
      .def("element_size", &Tensor::element_size)
      .def_prop_ro("nbytes", &Tensor::nbytes)  // a property, as torch's (numel() * element_size())
      .def(
          "size",
          [](const Tensor& x, std::optional<int64_t> d) -> nb::object {
            if (d) return nb::int_(x.size(*d));
            return shape_tuple(x.shape());
          },
          nb::arg("dim") = nb::none())
      .def(
          "stride",
          [](const Tensor& x, std::optional<int64_t> d) -> nb::object {
            if (d) return nb::int_(x.stride(*d));
            return shape_tuple(x.strides());
          },
          nb::arg("dim") = nb::none())
      .def("storage_offset", &Tensor::offset)
      .def("data_ptr", [](const Tensor& x) { return reinterpret_cast<uintptr_t>(x.raw_data()); })
      .def("is_contiguous", [](const Tensor& x) { return x.is_contiguous(); })
      .def("is_channels_last", &Tensor::is_channels_last)
      .def("item", &scalar_of, "The value of a one-element tensor as a Python number.")
      .def("tolist", &to_list)
      .def("__repr__",
           [](const Tensor& x) {
             std::string s = x.str();
             return s;
           })
      .def("__len__",
           [](const Tensor& x) {
             if (x.dim() == 0) throw nb::type_error("len() of a 0-d tensor");
             return x.size(0);
           })
      .def("__bool__",
           [](const Tensor& x) {
             if (x.numel() != 1)
               value_error("the truth value of a tensor with " + std::to_string(x.numel()) +
                           " elements is ambiguous (use any() or all())");
             return x.item_double() != 0;
           })
      .def("__float__", [](const Tensor& x) { return nb::float_(scalar_of(x)); })
      .def("__int__", [](const Tensor& x) { return nb::int_(scalar_of(x)); })
      .def("__index__",
           [](const Tensor& x) {
             if (!is_integral(x.dtype()) || x.numel() != 1)
               throw nb::type_error("only one-element integer tensors can be used as an index");
             return x.item<int64_t>();
           })
      .def("__hash__", [](nb::handle self) { return reinterpret_cast<intptr_t>(self.ptr()); })
      .def("__iter__",
           [](const Tensor& x) {
             if (x.dim() == 0) throw nb::type_error("iteration over a 0-d tensor");
             return nb::iter(nb::cast(unbind(x, 0)));
           })
      .def(
          "__getitem__", [](const Tensor& x, nb::handle key) { return getitem(x, key); }, nb::arg("key").none())
      .def(
          "__setitem__", [](Tensor& x, nb::handle key, nb::handle value) { setitem(x, key, value); },
          nb::arg("key").none(), nb::arg("value").none())

      // ---- views and copies ----
      .def("view", [](const Tensor& x, nb::args s) { return x.view(to_shape(s)); })
      .def("reshape", [](const Tensor& x, nb::args s) { return x.reshape(to_shape(s)); })
      .def("expand", [](const Tensor& x, nb::args s) { return x.expand(to_shape(s)); })
      .def("permute", [](const Tensor& x, nb::args s) { return x.permute(to_shape(s)); })
      .def("flatten", &Tensor::flatten, nb::arg("start_dim") = 0, nb::arg("end_dim") = -1)
      .def("transpose", &Tensor::transpose, nb::arg("dim0"), nb::arg("dim1"))
      .def("t", &Tensor::t)
      .def("narrow", &Tensor::narrow, nb::arg("dim"), nb::arg("start"), nb::arg("length"))
      .def("select", &Tensor::select, nb::arg("dim"), nb::arg("index"))
      .def(
          "squeeze", [](const Tensor& x, std::optional<int64_t> d) { return d ? x.squeeze(*d) : x.squeeze(); },
          nb::arg("dim") = nb::none())
      .def("unsqueeze", &Tensor::unsqueeze, nb::arg("dim"))
      .def(
          "as_strided",
          [](const Tensor& x, nb::handle size, nb::handle stride, int64_t offset) {
            return x.as_strided(Shape(to_dims(size, "size")), Shape(to_dims(stride, "stride")), offset);
          },
          nb::arg("size"), nb::arg("stride"), nb::arg("storage_offset") = 0)
      .def(
          "contiguous",
          [](const Tensor& x, const std::string& fmt) {
            if (fmt == "channels_last") return x.contiguous(MemoryFormat::channels_last);
            if (fmt != "contiguous")
              value_error("memory_format: expected \"contiguous\" or \"channels_last\", got \"" + fmt + "\"");
            return x.contiguous();
          },
          nb::arg("memory_format") = "contiguous")
      .def(
          "pin_memory", [](const Tensor& x) { return pin_memory(x); }, nb::call_guard<GilRelease>(),
          "A copy in page-locked memory (fast, asynchronous copies to a GPU) when a CUDA device is present; "
          "else, or for a tensor not on the CPU, the tensor itself.")
      .def("clone", &Tensor::clone, nb::call_guard<GilRelease>())
      .def("detach", &Tensor::detach)
      .def(
          "_alias_no_version",
          [](const Tensor& x) {
            // torch's .data: the same memory under a storage object of its own, so that an in-place
            // write through it (p.data.mul_(2)) neither bumps nor is checked against the version the
            // autograd graph saved for x. The original storage is kept alive by the alias's release.
            auto src = x.storage();
            auto st = std::make_shared<Storage>(src->data, src->nbytes, src->device, AliasRelease{src});
            auto impl = std::make_shared<TensorImpl>();
            impl->storage = std::move(st);
            impl->shape = x.shape();
            impl->strides = x.strides();
            impl->offset = x.offset();
            impl->dtype = x.dtype();
            return Tensor(std::move(impl));
          },
          "A detached alias with its own version counter (what .data returns).")
      .def(
          "_data_shared",
          [](const Tensor& x, const Tensor& value) {
            // Whether a tensor besides x (a view of it, the tensor it is a view of, another alias) holds
            // x's memory; autograd's saved copies do not count, nor does `value` (x.data = x.data.t():
            // value holds x's memory directly, or through the storage of a .data alias).
            const auto& st = x.storage();
            if (!st) return false;
            // x is itself a .data alias (d = p.data; d.data = t), perhaps of another alias (p.data.data):
            // the tensor it came from (or its views) holds the memory too, through the storage each alias
            // keeps alive (held once by that alias's release).
            for (const Storage* s = st.get(); const AliasRelease* a = s->release.target<AliasRelease>();
                 s = a->src.get())
              if (a->src.use_count() - 1 - long(a->src->saved_aliases.load(std::memory_order_relaxed)) > 0) return true;
            long others = st.use_count() - 1 - long(autograd::saved_aliases(x));
            if (value.defined() && value.storage() == st)
              --others;
            else if (value.defined() && value.storage()->data == st->data && value.storage()->nbytes == st->nbytes)
              --others;  // an alias's storage (what .data returns) holds x's once
            return others > 0;
          },
          nb::arg("value"), "Whether another tensor than value holds this tensor's memory (what .data = checks).")
      .def(
          "_rebind_data",
          [](const Tensor& x, const Tensor& value) {
            // torch's .data = value: x takes value's memory and layout, keeping its own autograd state
            // (requires_grad, .grad, hooks); the tensors that shared x's old memory keep it.
            TensorImpl& im = x.impl();
            const TensorImpl& from = value.impl();
            im.storage = from.storage;
            im.shape = from.shape;
            im.strides = from.strides;
            im.offset = from.offset;
            im.dtype = from.dtype;
          },
          nb::arg("value"), "x.data = value as torch's: x rebound to value's memory.")
      .def(
          "to",
          [](const Tensor& x, nb::args args, nb::kwargs kw) {
            std::optional<DType> dt;
            std::optional<Device> dev;
            auto take = [&](nb::handle a) {
              if (nb::isinstance<Tensor>(a)) {
                const Tensor o = nb::cast<Tensor>(a);
                dt = o.dtype();
                dev = o.device();
              } else if (nb::isinstance<DType>(a)) {
                dt = nb::cast<DType>(a);
              } else if (nb::isinstance<Device>(a)) {
                dev = nb::cast<Device>(a);
              } else if (nb::isinstance<nb::str>(a)) {
                const std::string s = nb::cast<std::string>(a);
                if (s == "cpu" || s == "meta" || s.rfind("cuda", 0) == 0) {
                  dev = to_device(a);
                } else {
                  try {
                    dt = dtype_from_name(s);
                  } catch (const Error& e) {
                    value_error("to(): '" + s + "' is neither a device (\"cpu\", \"cuda\", \"cuda:N\") nor a dtype (" +
                                e.message() + ")");
                  }
                }
              } else if (nb::hasattr(a, "itemsize") || a.is(reinterpret_cast<PyObject*>(&PyFloat_Type)) ||
                         a.is(reinterpret_cast<PyObject*>(&PyLong_Type)) ||
                         a.is(reinterpret_cast<PyObject*>(&PyBool_Type))) {
                // a NumPy or torch dtype, a NumPy scalar type, or float, int, bool as torch's x.to(float)
                dt = to_dtype(a);
              } else {
                dev = to_device(a);
              }
            };
            for (nb::handle a : args) take(a);
            for (auto [k, v] : kw) {
              const std::string key = nb::cast<std::string>(k);
              if (key == "dtype")
                dt = to_dtype(v);
              else if (key == "device")
                dev = to_device(v);
              else if (key != "non_blocking" && key != "copy")
                value_error("to(): unexpected keyword argument '" + key + "'");
            }
            GilRelease nogil;
            Tensor y = x;
            if (dev) y = y.to(*dev);
            if (dt) y = y.to(*dt);
            return y;
          },
          "to(dtype), to(device), to(device, dtype), to(other): a converted tensor (this one if nothing changes); "
          "autograd sees it.")

      // ---- in place (not recorded by autograd: under kiln.no_grad(), or on tensors without grad) ----
      .def(
          "copy_",
          [](Tensor& x, nb::handle src) -> Tensor& {
            check_inplace(x, "copy_", src);
            return x.copy_(to_tensor(src, &x, "src"));
          },
          nb::arg("src"), nb::rv_policy::reference)
      .def(
          "fill_",
          [](Tensor& x, nb::handle value) -> Tensor& {
            check_inplace(x, "fill_");
            const double v = fill_value(x.dtype(), value, "fill_: value");
            return x.fill_(v);
          },
          nb::arg("value"), nb::rv_policy::reference)
      .def(
          "zero_",
          [](Tensor& x) -> Tensor& {
            check_inplace(x, "zero_");
            return x.zero_();
          },
          nb::rv_policy::reference)
      .def(
          "add_",
          [](Tensor& x, nb::handle o, nb::handle alpha) -> Tensor& {
            check_inplace(x, "add_", o);
            const Tensor t = arith_operand(o, x, "other");
            return x.add_(t, alpha_arg(alpha, result_type(x, t), "add_"));
          },
          nb::arg("other"), nb::arg("alpha") = 1, nb::rv_policy::reference)
      .def(
          "sub_",
          [](Tensor& x, nb::handle o, nb::handle alpha) -> Tensor& {
            check_inplace(x, "sub_", o);
            const Tensor t = arith_operand(o, x, "other");
            // sub's refusal of a bool operand, as PyTorch's: a mask is inverted with ~ (logical_not)
            KILN_CHECK(x.dtype() != DType::boolean && t.dtype() != DType::boolean,
                       "sub_: subtraction with a bool tensor (", (x.dtype() == DType::boolean ? x : t).type_str(),
                       ") is not supported, as in PyTorch; to invert a mask use ~ or logical_not() instead");
            const double a = alpha_arg(alpha, result_type(x, t), "sub_", true);
            return x.add_(t, a == -0x1p63 ? a : -a);  // -alpha as torch's int64 negation (-2**63 stays)
          },
          nb::arg("other"), nb::arg("alpha") = 1, nb::rv_policy::reference)
      .def(
          "mul_",
          [](Tensor& x, nb::handle o) -> Tensor& {
            check_inplace(x, "mul_", o);
            // an integer x *= 2.0 is refused as x += 2.0 (the f32 result does not fit x), as PyTorch
            if (number_for_double_op(x, o, "other")) return x.mul_(nb::cast<double>(o));
            return x.mul_(to_tensor(o, &x, "other"));
          },
          nb::arg("other"), nb::rv_policy::reference)
      .def(
          "__iadd__",
          [](Tensor& x, nb::handle o) -> Tensor& {
            check_inplace(x, "+=", o);
            return x.add_(arith_operand(o, x, "operand"));
          },
          nb::rv_policy::reference, nb::is_operator())
      .def(
          "__isub__",
          [](Tensor& x, nb::handle o) -> Tensor& {
            check_inplace(x, "-=", o);
            const Tensor t = arith_operand(o, x, "operand");
            // -= is add_ with alpha -1, so sub's refusal of a bool operand (torch's) is repeated here.
            KILN_CHECK(x.dtype() != DType::boolean && t.dtype() != DType::boolean,
                       "-=: subtraction with a bool tensor (", (x.dtype() == DType::boolean ? x : t).type_str(),
                       ") is not supported, as in PyTorch; to invert a mask use ~ or logical_not() instead");
            return x.add_(t, -1.0);
          },
          nb::rv_policy::reference, nb::is_operator())
      .def(
          "__imul__",
          [](Tensor& x, nb::handle o) -> Tensor& {
            check_inplace(x, "*=", o);
            if (number_for_double_op(x, o, "operand")) return x.mul_(nb::cast<double>(o));
            return x.mul_(to_tensor(o, &x, "operand"));
          },
          nb::rv_policy::reference, nb::is_operator())
      .def(
          "__itruediv__",
          [](Tensor& x, nb::handle o) -> Tensor& {
            check_inplace(x, "/=", o);
            // True division gives floats, which an integer tensor cannot take in place (PyTorch's rule).
            KILN_CHECK(is_floating(x.dtype()), "/=: true division gives a float result, which cannot be written into ",
                       x.type_str(), " in place; use x = x / y");
            // a true division, not a product with 1 / o (which differs in the last bit for o = 3)
            return x.copy_(div(x, arith_operand(o, x, "operand")));
          },
          nb::rv_policy::reference, nb::is_operator())
      .def(
          "__ifloordiv__",
          [](Tensor& x, nb::handle o) -> Tensor& {
            check_inplace(x, "//=", o);
            const Tensor q = floor_divide(x, to_tensor(o, &x, "operand"));
            KILN_CHECK(can_cast(q.dtype(), x.dtype()), "//=: the result type ", q.dtype(), " cannot be written into ",
                       x.type_str(), " in place");
            return x.copy_(q);
          },
          nb::rv_policy::reference, nb::is_operator())

      // ---- operators ----
      .def(
          "__add__",
          [](const Tensor& a, nb::handle b) {
            return binary(
                a, b, [](const Tensor& x, const Tensor& y) { return x + y; },
                [](const Tensor& x, double v) { return x + v; });
          },
          nb::is_operator())
      .def(
          "__radd__",
          [](const Tensor& a, nb::handle b) {
            return binary(
                a, b, [](const Tensor& x, const Tensor& y) { return y + x; },
                [](const Tensor& x, double v) { return v + x; });
          },
          nb::is_operator())
      .def(
          "__sub__",
          [](const Tensor& a, nb::handle b) {
            return binary(
                a, b, [](const Tensor& x, const Tensor& y) { return x - y; },
                [](const Tensor& x, double v) { return x - v; });
          },
          nb::is_operator())
      .def(
          "__rsub__",
          [](const Tensor& a, nb::handle b) {
            return binary(
                a, b, [](const Tensor& x, const Tensor& y) { return y - x; },
                [](const Tensor& x, double v) { return v - x; });
          },
          nb::is_operator())
      .def(
          "__mul__",
          [](const Tensor& a, nb::handle b) {
            return binary(
                a, b, [](const Tensor& x, const Tensor& y) { return x * y; },
                [](const Tensor& x, double v) { return x * v; });
          },
          nb::is_operator())
      .def(
          "__rmul__",
          [](const Tensor& a, nb::handle b) {
            return binary(
                a, b, [](const Tensor& x, const Tensor& y) { return y * x; },
                [](const Tensor& x, double v) { return v * x; });
          },
          nb::is_operator())
      .def(
          "__truediv__",
          [](const Tensor& a, nb::handle b) {
            if (std::optional<Tensor> q = divide_by_number(a, b, false)) return *q;
            return binary(
                a, b, [](const Tensor& x, const Tensor& y) { return x / y; },
                [](const Tensor& x, double v) { return x / v; });
          },
          nb::is_operator())
      .def(
          "__rtruediv__",
          [](const Tensor& a, nb::handle b) {
            if (std::optional<Tensor> q = divide_by_number(a, b, true)) return *q;
            return binary(
                a, b, [](const Tensor& x, const Tensor& y) { return y / x; },
                [](const Tensor& x, double v) { return v / x; });
          },
          nb::is_operator())
      .def(
          "__pow__", [](const Tensor& a, nb::handle b) { return pow_operand(a, b); }, nb::is_operator())
      .def(
          "__rpow__",
          [](const Tensor& a, nb::handle b) {
            // A NumPy bool base is a float number, as in __pow__ (np.True_ ** mask is f32 [1, 1] in PyTorch).
            const std::string tn = py_type_name(b);
            const nb::object base =
                tn == "numpy.bool" || tn == "numpy.bool_" ? nb::float_(PyObject_IsTrue(b.ptr()) == 1) : nb::borrow(b);
            return binary(a, base, [](const Tensor& x, const Tensor& y) { return pow(y, x); });
          },
          nb::is_operator())
      .def(
          "__mod__",
          [](const Tensor& a, nb::handle b) {
            return binary(a, b, static_cast<TT2>(&remainder),
                          [](const Tensor& x, double v) { return remainder(x, v); });
          },
          nb::is_operator())
      .def(
          "__rmod__",
          [](const Tensor& a, nb::handle b) {
            return binary(a, b, [](const Tensor& x, const Tensor& y) { return remainder(y, x); });
          },
          nb::is_operator())
      .def(
          "__floordiv__", [](const Tensor& a, nb::handle b) { return binary(a, b, static_cast<TT2>(&floor_divide)); },
          nb::is_operator())
      .def(
          "__rfloordiv__",
          [](const Tensor& a, nb::handle b) {
            return binary(a, b, [](const Tensor& x, const Tensor& y) { return floor_divide(y, x); });
          },
          nb::is_operator())
      .def(
          "__matmul__", [](const Tensor& a, nb::handle b) { return binary(a, b, static_cast<TT2>(&matmul)); },
          nb::is_operator())
      .def(
          "__rmatmul__",
          [](const Tensor& a, nb::handle b) {
            return binary(a, b, [](const Tensor& x, const Tensor& y) { return matmul(y, x); });
          },
          nb::is_operator())
      .def(
          "__neg__", [](const Tensor& a) { return -a; }, nb::is_operator())
      .def(
          "__pos__", [](const Tensor& a) { return a; }, nb::is_operator())
      .def(
          "__abs__", [](const Tensor& a) { return abs(a); }, nb::is_operator())
      // ~ & | ^ << >> are bitwise on integer and bool tensors (on bool: logical), as torch's; a floating
      // operand is refused (~ with torch's TypeError, the others by the engine, naming the op).
      .def(
          "__invert__",
          [](const Tensor& a) {
            if (is_floating(a.dtype()))
              type_error("~ (bitwise_not) on " + a.type_str() +
                         ": ~ is only implemented on integer and bool tensors, as in PyTorch; to invert a mask "
                         "use a bool tensor (x > 0, x.bool())");
            GilRelease nogil;
            return bitwise_not(a);
          },
          nb::is_operator())
      .def(
          "__and__", [](const Tensor& a, nb::handle b) { return bitwise_operator(a, b, &bitwise_and, false); },
          nb::is_operator())
      .def(
          "__rand__", [](const Tensor& a, nb::handle b) { return bitwise_operator(a, b, &bitwise_and, true); },
          nb::is_operator())
      .def(
          "__or__", [](const Tensor& a, nb::handle b) { return bitwise_operator(a, b, &bitwise_or, false); },
          nb::is_operator())
      .def(
          "__ror__", [](const Tensor& a, nb::handle b) { return bitwise_operator(a, b, &bitwise_or, true); },
          nb::is_operator())
      .def(
          "__xor__", [](const Tensor& a, nb::handle b) { return bitwise_operator(a, b, &bitwise_xor, false); },
          nb::is_operator())
      .def(
          "__rxor__", [](const Tensor& a, nb::handle b) { return bitwise_operator(a, b, &bitwise_xor, true); },
          nb::is_operator())
      .def(
          "__lshift__",
          [](const Tensor& a, nb::handle b) { return bitwise_operator(a, b, &bitwise_left_shift, false); },
          nb::is_operator())
      .def(
          "__rlshift__",
          [](const Tensor& a, nb::handle b) { return bitwise_operator(a, b, &bitwise_left_shift, true); },
          nb::is_operator())
      .def(
          "__rshift__",
          [](const Tensor& a, nb::handle b) { return bitwise_operator(a, b, &bitwise_right_shift, false); },
          nb::is_operator())
      .def(
          "__rrshift__",
          [](const Tensor& a, nb::handle b) { return bitwise_operator(a, b, &bitwise_right_shift, true); },
          nb::is_operator())
      .def(
          "__iand__", [](Tensor& x, nb::handle o) -> Tensor& { return bitwise_inplace(x, o, "&=", &bitwise_and); },
          nb::rv_policy::reference, nb::is_operator())
      .def(
          "__ior__", [](Tensor& x, nb::handle o) -> Tensor& { return bitwise_inplace(x, o, "|=", &bitwise_or); },
          nb::rv_policy::reference, nb::is_operator())
      .def(
          "__ixor__", [](Tensor& x, nb::handle o) -> Tensor& { return bitwise_inplace(x, o, "^=", &bitwise_xor); },
          nb::rv_policy::reference, nb::is_operator())
      .def(
          "__ilshift__",
          [](Tensor& x, nb::handle o) -> Tensor& { return bitwise_inplace(x, o, "<<=", &bitwise_left_shift); },
          nb::rv_policy::reference, nb::is_operator())
      .def(
          "__irshift__",
          [](Tensor& x, nb::handle o) -> Tensor& { return bitwise_inplace(x, o, ">>=", &bitwise_right_shift); },
          nb::rv_policy::reference, nb::is_operator())
      .def(
          "bitwise_and_",
          [](Tensor& x, nb::handle o) -> Tensor& { return bitwise_inplace(x, o, "bitwise_and_", &bitwise_and); },
          nb::arg("other"), nb::rv_policy::reference)
      .def(
          "bitwise_or_",
          [](Tensor& x, nb::handle o) -> Tensor& { return bitwise_inplace(x, o, "bitwise_or_", &bitwise_or); },
          nb::arg("other"), nb::rv_policy::reference)
      .def(
          "bitwise_xor_",
          [](Tensor& x, nb::handle o) -> Tensor& { return bitwise_inplace(x, o, "bitwise_xor_", &bitwise_xor); },
          nb::arg("other"), nb::rv_policy::reference)
      .def(
          "bitwise_left_shift_",
          [](Tensor& x, nb::handle o) -> Tensor& {
            return bitwise_inplace(x, o, "bitwise_left_shift_", &bitwise_left_shift);
          },
          nb::arg("other"), nb::rv_policy::reference)
      .def(
          "bitwise_right_shift_",
          [](Tensor& x, nb::handle o) -> Tensor& {
            return bitwise_inplace(x, o, "bitwise_right_shift_", &bitwise_right_shift);
          },
          nb::arg("other"), nb::rv_policy::reference)
      .def(
          "bitwise_not_",
          [](Tensor& x) -> Tensor& {
            check_inplace(x, "bitwise_not_");
            GilRelease nogil;
            return x.copy_(bitwise_not(x));
          },
          nb::rv_policy::reference)
      .def(
          "__eq__", [](const Tensor& a, nb::handle b) { return binary(a, b, static_cast<TT2>(&eq)); },
          nb::is_operator())
      .def(
          "__ne__", [](const Tensor& a, nb::handle b) { return binary(a, b, static_cast<TT2>(&ne)); },
          nb::is_operator())
      .def(
          "__lt__", [](const Tensor& a, nb::handle b) { return binary(a, b, static_cast<TT2>(&lt)); },
          nb::is_operator())
      .def(
          "__le__", [](const Tensor& a, nb::handle b) { return binary(a, b, static_cast<TT2>(&le)); },
          nb::is_operator())
      .def(
          "__gt__", [](const Tensor& a, nb::handle b) { return binary(a, b, static_cast<TT2>(&gt)); },
          nb::is_operator())
      .def(
          "__ge__", [](const Tensor& a, nb::handle b) { return binary(a, b, static_cast<TT2>(&ge)); },
          nb::is_operator())

      // ---- autograd ----
      .def_prop_rw("requires_grad", &Tensor::requires_grad,
                   [](Tensor& x, bool r) {
                     // As torch: only requires_grad_(True) is a no-op on a non-leaf; assigning is refused.
                     KILN_CHECK(x.is_leaf(),
                                "requires_grad: only leaf tensors can change requires_grad; this one "
                                "was made by ",
                                x.grad_fn()->name(),
                                ", so it requires grad through its inputs. "
                                "For a value outside the graph use x.detach()");
                     x.set_requires_grad(r);
                   })
      .def(
          "requires_grad_", [](Tensor& x, bool r) -> Tensor& { return x.set_requires_grad(r); },
          nb::arg("requires_grad") = true, nb::rv_policy::reference)
      .def_prop_rw(
          "grad",
          [](const Tensor& x) -> std::optional<Tensor> {
            Tensor g = x.grad();
            if (!g.defined()) return std::nullopt;
            return g;
          },
          [](Tensor& x, std::optional<Tensor> g) {
            // As torch, refused at assignment (backward would keep accumulating in that dtype). The
            // engine's set_grad allows it, so that an optimizer's own check can be tested.
            KILN_CHECK(!g || !is_floating(g->dtype()) || g->dtype() == x.dtype(), "grad: the assigned gradient ",
                       g->type_str(), " has another dtype than the tensor ", x.type_str(),
                       "; a gradient must have its tensor's dtype (convert it with .to(", x.dtype(), "))");
            x.set_grad(g ? *g : Tensor());
          },
          nb::arg("grad").none())
      .def_prop_ro("is_leaf", &Tensor::is_leaf)
      .def_prop_ro(
          "grad_fn",
          [](const Tensor& x) -> std::optional<std::string> {
            auto f = x.grad_fn();
            if (!f) return std::nullopt;
            return f->name();
          },
          "The name of the op that made this tensor (None for a leaf).")
      .def(
          "backward",
          [](const Tensor& x, std::optional<Tensor> gradient, std::optional<bool> retain_graph, bool create_graph) {
            GilRelease nogil;
            x.backward(gradient ? *gradient : Tensor(), retain_graph.value_or(create_graph), create_graph);
          },
          nb::arg("gradient") = nb::none(), nb::arg("retain_graph") = nb::none(), nb::arg("create_graph") = false,
          "Reverse-mode autograd from this tensor (one element, or pass `gradient`); leaves accumulate .grad. "
          "create_graph=True records the backward too, so .grad can be differentiated again (it keeps the graph).")
      .def(
          "register_post_accumulate_grad_hook",
          [](Tensor& x, nb::callable fn) {
            auto ref = hold(fn);
            const int id = x.register_grad_ready_hook([ref](Tensor& leaf) {
              GilAcquire gil;
              if (ref->obj.is_none()) return;  // released at exit
              ref->obj(leaf);
            });
            return HookHandle{x.impl_ptr(), id, true};
          },
          nb::arg("hook"),
          "Calls hook(tensor) once this leaf's .grad is complete in a backward pass. Returns a handle whose "
          "remove() takes the hook off, as torch's.")
      .def(
          "remove_post_accumulate_grad_hook",
          [](Tensor& x, nb::handle h) {
            x.remove_grad_ready_hook(nb::isinstance<HookHandle>(h) ? nb::cast<HookHandle&>(h).id : nb::cast<int>(h));
          },
          nb::arg("handle"), "Takes off a hook by its handle (or the handle's id).")
      .def(
          "register_hook",
          [](Tensor& x, nb::callable fn) {
            auto ref = hold(fn);
            const int id = x.register_hook([ref](const Tensor& grad) -> Tensor {
              GilAcquire gil;
              if (ref->obj.is_none()) return Tensor();  // released at exit
              nb::object res = ref->obj(grad);
              if (res.is_none()) return Tensor();
              KILN_CHECK(nb::isinstance<Tensor>(res), "a hook registered with register_hook returned a ",
                         nb::cast<std::string>(nb::str(nb::handle(reinterpret_cast<PyObject*>(Py_TYPE(res.ptr()))))),
                         ", expected kiln.Tensor or None");
              return nb::cast<Tensor>(res);
            });
            return HookHandle{x.impl_ptr(), id};
          },
          nb::arg("hook"),
          "Calls hook(grad) with the gradient reaching this tensor in each backward pass, before it is used; "
          "a returned tensor (same shape, dtype and device) replaces it. Returns a handle whose remove() "
          "takes the hook off. As torch.Tensor.register_hook.")
      .def("retain_grad", &Tensor::retain_grad,
           "Keeps this non-leaf's gradient in .grad after backward (a no-op on a leaf).")
      .def_prop_ro("retains_grad", &Tensor::retains_grad);
}

}  // namespace kiln::py
