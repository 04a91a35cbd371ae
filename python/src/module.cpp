// The extension module kiln._C: exceptions, dtypes and devices, settings, and the argument
// conversions every binding uses. The Python package (python/kiln) builds its API on it.
#include <nanobind/stl/pair.h>
#include <nanobind/stl/tuple.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <mutex>
#include <set>
#include <thread>
#include <utility>

#include "common.h"
#include "kernels/cuda/cuda_backend.h"
#include "python_docs.h"
#include "tools/environment.h"

namespace kiln::py {

PyObject* g_kiln_error = nullptr;
PyObject* g_value_error = nullptr;
PyObject* g_index_error = nullptr;

namespace {
// Every live PyRef (see common.h), for the release at exit.
std::mutex g_refs_mu;
std::set<PyRef*>& live_refs() {
  static auto* refs = new std::set<PyRef*>();  // never destroyed: PyRefs may outlive static destruction
  return *refs;
}
}  // namespace

PyRef::PyRef(nb::object o) : obj(std::move(o)) {
  std::lock_guard<std::mutex> lock(g_refs_mu);
  live_refs().insert(this);
}

PyRef::~PyRef() {
  {
    std::lock_guard<std::mutex> lock(g_refs_mu);
    live_refs().erase(this);
  }
  if (!obj.is_valid() || !Py_IsInitialized()) {
    (void)obj.release();  // the interpreter is gone: nothing to give back
    return;
  }
  GilAcquire gil;
  obj.reset();
}

namespace {
std::atomic<int> g_released{0};  // threads inside a GilRelease that let the GIL go
std::atomic<bool> g_exiting{false};
std::atomic<unsigned long> g_exiting_thread{0};  // the thread that ran _exit_quiesce (it finalizes)
thread_local bool t_counted = false;             // this thread is counted in g_released now
thread_local bool t_kept_gil = false;            // a GilAcquire kept the GIL at exit: its GilRelease has it already

bool exiting_elsewhere() { return g_exiting.load() && PyThread_get_thread_ident() != g_exiting_thread.load(); }
}  // namespace

GilRelease::GilRelease() {
  // Counted before the check: _exit_quiesce either sees this thread inside or this thread sees the
  // flag (both sequentially consistent), never neither.
  g_released.fetch_add(1);
  if (exiting_elsewhere()) {
    g_released.fetch_sub(1);
    return;
  }
  t_counted = true;
  saved_ = PyEval_SaveThread();
}

GilRelease::~GilRelease() {
  if (!saved_) return;
  if (t_kept_gil)
    t_kept_gil = false;  // held since a callback inside this scope returned during the exit
  else
    PyEval_RestoreThread(saved_);
  if (t_counted) {
    t_counted = false;
    g_released.fetch_sub(1);
  }
}

GilAcquire::GilAcquire() : state_(PyGILState_Ensure()) {
  if (t_counted) {
    t_counted = false;
    uncounted_ = true;
    g_released.fetch_sub(1);
  }
}

GilAcquire::~GilAcquire() {
  if (uncounted_) {
    g_released.fetch_add(1);  // before the check, as GilRelease's
    if (exiting_elsewhere()) {
      // Letting the GIL go now, the thread would take it back in GilRelease's end while Python
      // finalizes (an abort): it keeps it through the rest of the engine work instead.
      g_released.fetch_sub(1);
      t_kept_gil = true;
      return;
    }
    t_counted = true;
  }
  PyGILState_Release(state_);
}

void set_error(PyObject* type, const std::string& msg) {
  // PyErr_SetString decodes strictly: a message quoting a damaged file's bytes would turn into a
  // UnicodeDecodeError instead of the error it describes.
  PyObject* text = PyUnicode_DecodeUTF8(msg.data(), Py_ssize_t(msg.size()), "backslashreplace");
  if (!text) return;  // MemoryError is set
  PyErr_SetObject(type, text);
  Py_DECREF(text);
}

void value_error(const std::string& msg) {
  set_error(g_value_error, msg);
  throw nb::python_error();
}
void index_error(const std::string& msg) {
  set_error(g_index_error, msg);
  throw nb::python_error();
}
void type_error(const std::string& msg) {
  set_error(PyExc_TypeError, msg);
  throw nb::python_error();
}
void overflow_error(const std::string& msg) {
  set_error(PyExc_OverflowError, msg);
  throw nb::python_error();
}

std::string str_of(nb::handle h) {
  PyObject* s = PyObject_Str(h.ptr());
  if (!s) {
    PyErr_Clear();
    return "<" + py_type_name(h) + ">";
  }
  Py_ssize_t n = 0;
  const char* c = PyUnicode_AsUTF8AndSize(s, &n);
  std::string out = c ? std::string(c, size_t(n)) : std::string("?");
  if (!c) PyErr_Clear();
  Py_DECREF(s);
  return out;
}

std::string py_type_name(nb::handle h) { return Py_TYPE(h.ptr())->tp_name; }

namespace {
// A Python int's decimal digits, shortened for a message.
std::string int_text(nb::handle h) {
  std::string s = str_of(h);
  if (s.size() > 40) s = s.substr(0, 20) + "..." + s.substr(s.size() - 10);
  return s;
}
}  // namespace

std::optional<int64_t> exact_int(nb::handle h, const char* what) {
  if (!PyLong_Check(h.ptr()) || PyBool_Check(h.ptr())) return std::nullopt;
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(h.ptr(), &overflow);
  if (overflow != 0)
    overflow_error(std::string(what) + ": " + int_text(h) + " does not fit in int64 (Kiln's integers are 64-bit)");
  if (v == -1 && PyErr_Occurred()) throw nb::python_error();
  return int64_t(v);
}

int64_t to_int64(nb::handle h, const char* what) {
  if (PyBool_Check(h.ptr()) || PyFloat_Check(h.ptr()) || !PyIndex_Check(h.ptr()))
    type_error(std::string(what) + ": expected an int, got " + py_type_name(h));
  if (PyLong_Check(h.ptr())) return *exact_int(h, what);
  nb::object i = nb::steal(PyNumber_Index(h.ptr()));
  if (!i.is_valid()) throw nb::python_error();
  return *exact_int(i, what);
}

double to_double(nb::handle h, const char* what) {
  if (PyFloat_Check(h.ptr())) return PyFloat_AS_DOUBLE(h.ptr());
  if (PyLong_Check(h.ptr()) && !PyBool_Check(h.ptr())) {
    const double v = PyLong_AsDouble(h.ptr());
    if (v == -1.0 && PyErr_Occurred()) {
      PyErr_Clear();
      overflow_error(std::string(what) + ": " + int_text(h) + " is too large for a float");
    }
    return v;
  }
  if (nb::isinstance<nb::str>(h) || nb::isinstance<nb::bytes>(h) || !nb::hasattr(h, "__float__"))
    type_error(std::string(what) + ": expected a number, got " + py_type_name(h) + " (" + str_of(h).substr(0, 40) +
               ")");
  const double v = PyFloat_AsDouble(h.ptr());
  if (v == -1.0 && PyErr_Occurred()) throw nb::python_error();
  return v;
}

double fill_value(DType t, nb::handle h, const char* what) {
  // uint8 takes an int from -255 to -1 wrapped, as torch's: a Python int or an integer-like one
  // (np.int64, a 0-d integer tensor: operator.index), as masked_fill and x[key] = v take them.
  if (t == DType::u8 && !PyBool_Check(h.ptr()) && !PyFloat_Check(h.ptr()) && PyIndex_Check(h.ptr())) {
    nb::object i = nb::steal(PyNumber_Index(h.ptr()));
    if (!i.is_valid()) {
      PyErr_Clear();  // (a float tensor's __index__ refuses: it is a number below)
    } else if (!PyBool_Check(i.ptr())) {
      int overflow = 0;
      const long long v = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
      if (overflow == 0 && v >= -255 && v < 0) return double(v + 256);
      if (v == -1 && PyErr_Occurred()) PyErr_Clear();
    }
  }
  return to_double(h, what);
}

double alpha_arg(nb::handle h, DType t, const char* op, bool subtracts) {
  const std::string type = py_type_name(h);
  if (PyBool_Check(h.ptr()) || type == "numpy.bool" || type == "numpy.bool_") {  // NumPy's bools are bools too
    if (t != DType::boolean)
      value_error(std::string(op) + ": alpha " + str_of(h) + " is a bool, which only a bool result takes, and the " +
                  "result is " + dtype_name(t) + " (as PyTorch); give a number");
    return PyObject_IsTrue(h.ptr()) == 1 ? 1.0 : 0.0;
  }
  if (!is_floating(t) && !PyIndex_Check(h.ptr()))
    value_error(std::string(op) + ": alpha " + str_of(h).substr(0, 40) + " is not an int, and the result is " +
                dtype_name(t) + ", an integral dtype (PyTorch refuses a floating-point alpha there, 1.0 too)");
  if (t == DType::i64) {
    // alpha reaches the kernels as a double, exact for integers up to 2**53: one it cannot hold would
    // compute with another value (2**53 + 1 as 2**53, -(2**63 - 1) as -2**63), so it is refused.
    nb::object i = nb::steal(PyNumber_Index(h.ptr()));
    if (!i.is_valid()) throw nb::python_error();
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
    if (v == -1 && PyErr_Occurred()) throw nb::python_error();
    // sub negates alpha as PyTorch does, in int64: 2**63 becomes -2**63 (a double holds both)
    if (overflow > 0 && subtracts) {
      const unsigned long long u = PyLong_AsUnsignedLongLong(i.ptr());
      if (!PyErr_Occurred() && u == 1ULL << 63) return 0x1p63;
      PyErr_Clear();
    }
    if (overflow != 0) value_error(std::string(op) + ": alpha " + str_of(i).substr(0, 40) + " is not a value of i64");
    const double d = double(v);
    if (!(d >= -0x1p63 && d < 0x1p63) || static_cast<long long>(d) != v) {
      char as[32];
      std::snprintf(as, sizeof as, "%.0f", d);  // the integer the double is, exactly
      value_error(std::string(op) + ": alpha " + std::to_string(v) + " is an i64 that a double cannot hold (it " +
                  "would act as " + as + "); Kiln carries alpha as a double, exact for integers up to 2**53 in " +
                  "magnitude");
    }
  }
  const double a = to_double(h, (std::string(op) + ": alpha").c_str());
  // The engine's rule (alpha_fits), checked here too so that sub_'s error names sub_ and the alpha given.
  if (!alpha_fits(t, a, subtracts))
    value_error(std::string(op) + ": alpha " + str_of(h).substr(0, 40) + (subtracts ? ", negated," : "") +
                " is not a value of " + dtype_name(t) + (t == DType::u8 ? " (-255 to 255, as PyTorch's)" : ""));
  return a;
}

Tensor int64_scalar(int64_t v) { return from_blob_copy(&v, Shape{}); }

DType to_dtype(nb::handle h, const char* what) {
  if (nb::isinstance<DType>(h)) return nb::cast<DType>(h);
  std::string name;
  if (h.is(reinterpret_cast<PyObject*>(&PyFloat_Type))) return DType::f64;  // as torch: dtype=float
  if (h.is(reinterpret_cast<PyObject*>(&PyLong_Type))) return DType::i64;
  if (h.is(reinterpret_cast<PyObject*>(&PyBool_Type))) return DType::boolean;
  if (nb::isinstance<nb::str>(h)) {
    name = nb::cast<std::string>(h);
  } else if (nb::hasattr(h, "name") && nb::hasattr(h, "itemsize")) {  // a NumPy dtype
    name = nb::cast<std::string>(h.attr("name"));
  } else if (PyType_Check(h.ptr()) && nb::hasattr(h, "itemsize") &&
             PyObject_IsSubclass(h.ptr(), nb::module_::import_("numpy").attr("generic").ptr()) == 1) {
    // A NumPy scalar type (np.float32, np.int64) names its dtype as np.dtype(np.float32) does, which is
    // taken above: NumPy code spells dtypes either way.
    try {
      name = nb::cast<std::string>(nb::module_::import_("numpy").attr("dtype")(h).attr("name"));
    } catch (const nb::python_error&) {  // an abstract type (np.generic, np.floating) is no dtype
      value_error(std::string(what) + ": " + nb::cast<std::string>(nb::str(h)) + " is not a dtype (an abstract " +
                  "NumPy type; name one, e.g. numpy.float32)");
    }
  } else if (nb::hasattr(h, "is_floating_point") && nb::hasattr(h, "itemsize")) {  // a torch.dtype
    name = nb::cast<std::string>(nb::str(h));
    if (name.rfind("torch.", 0) == 0) name = name.substr(6);
  } else {
    value_error(std::string(what) + ": expected a kiln.dtype or a dtype name, got " +
                nb::cast<std::string>(nb::str(nb::handle(reinterpret_cast<PyObject*>(Py_TYPE(h.ptr()))))));
  }
  try {
    return dtype_from_name(name);
  } catch (const Error& e) {
    value_error(std::string(what) + ": " + e.message());
  }
}

Device to_device(nb::handle h, const char* what) {
  if (nb::isinstance<Device>(h)) return nb::cast<Device>(h);
  std::string s;
  if (nb::isinstance<nb::str>(h)) {
    s = nb::cast<std::string>(h);
  } else if (nb::hasattr(h, "type") && nb::hasattr(h, "index")) {  // a torch.device
    s = nb::cast<std::string>(nb::str(h));
  } else {
    value_error(std::string(what) + ": expected a kiln.Device or a name such as \"cpu\" or \"cuda:0\"");
  }
  try {
    return Device::parse(s);
  } catch (const Error& e) {
    value_error(std::string(what) + ": " + e.message());
  }
}

std::vector<int64_t> to_dims(nb::handle h, const char* what) {
  if (h.is_none()) return {};
  if (PyLong_Check(h.ptr()) && !PyBool_Check(h.ptr())) return {*exact_int(h, what)};
  if (PySequence_Check(h.ptr()) && !nb::isinstance<nb::str>(h)) {
    std::vector<int64_t> out;
    for (nb::handle x : nb::iter(h)) {
      if (!PyLong_Check(x.ptr()) || PyBool_Check(x.ptr()))
        value_error(std::string(what) + ": expected integers, got " + py_type_name(x));
      out.push_back(*exact_int(x, what));
    }
    return out;
  }
  value_error(std::string(what) + ": expected None, an int or a sequence of ints");
}

Shape to_shape(nb::handle args) {
  nb::tuple t = nb::borrow<nb::tuple>(args);
  if (t.size() == 1 && !PyLong_Check(t[0].ptr())) return Shape(to_dims(t[0], "size"));
  Shape s;
  for (nb::handle x : t) {
    if (!PyLong_Check(x.ptr()) || PyBool_Check(x.ptr())) value_error("size: expected integers");
    s.push_back(*exact_int(x, "size"));
  }
  return s;
}

const char* header_doc(std::string_view name) {
  for (const auto& [n, d] : kHeaderDocs)
    if (n == name) return d;
  return "";
}

Tensor numpy_to_tensor_copy(nb::handle array, const char* what);  // interop.cpp

std::optional<double> number_beside_16bit(nb::handle h, const Tensor& like, const char* what) {
  if (!like.defined() || !is_low_precision(like.dtype())) return std::nullopt;
  if (PyFloat_Check(h.ptr())) return PyFloat_AS_DOUBLE(h.ptr());
  if (PyLong_Check(h.ptr()) && !PyBool_Check(h.ptr())) {
    const int64_t v = *exact_int(h, what);
    if (v >= -(int64_t(1) << 53) && v <= (int64_t(1) << 53)) return double(v);  // a double holds it exactly
  }
  return std::nullopt;
}

Tensor arith_operand(nb::handle h, const Tensor& like, const char* what) {
  if (const auto v = number_beside_16bit(h, like, what))
    return scalar_tensor(*v, TensorOptions(DType::f32, like.device()));
  return to_tensor(h, &like, what);
}

Tensor to_tensor(nb::handle h, const Tensor* like, const char* what) {
  if (nb::isinstance<Tensor>(h)) return nb::cast<Tensor>(h);
  // A NumPy bool beside a tensor is a float number to PyTorch, 0. or 1. (x_i32 + np.True_ is f32 [2.], where
  // Python's True keeps i32), as pow_operand takes it; it was a bool, and x_i32 + np.True_ stayed i32.
  if (like && like->defined()) {
    const std::string tn = py_type_name(h);
    if (tn == "numpy.bool" || tn == "numpy.bool_")
      return to_tensor(nb::float_(PyObject_IsTrue(h.ptr()) == 1), like, what);
    // A NumPy integer beside a bool tensor is an int to PyTorch, so i64 (mask + np.int32(2) was i32);
    // beside other tensors its own dtype already gives PyTorch's result.
    if (like->dtype() == DType::boolean && tn.rfind("numpy.", 0) == 0 && PyIndex_Check(h.ptr())) {
      PyObject* i = PyNumber_Index(h.ptr());
      if (!i) nb::raise_python_error();
      return to_tensor(nb::steal(i), like, what);
    }
  }
  if (PyBool_Check(h.ptr())) return scalar_tensor(h.is(Py_True) ? 1.0 : 0.0, TensorOptions(DType::boolean));
  if (PyLong_Check(h.ptr())) {
    // Exact: an int64 beyond 2^53 does not survive a trip through double.
    const int64_t v = *exact_int(h, what);
    if (like && like->defined() && is_floating(like->dtype())) return scalar_like(double(v), *like);
    // Beside an integer tensor the int takes its dtype, wrapped from the exact int64 (PyTorch keeps the low
    // bits: i32 x + (2**32 + 5) adds 5); beside a bool tensor it is i64.
    if (like && like->defined() && like->dtype() != DType::boolean) return int64_scalar(v).to(like->dtype());
    return int64_scalar(v);
  }
  if (PyFloat_Check(h.ptr())) {
    const double v = PyFloat_AS_DOUBLE(h.ptr());
    if (like && like->defined() && is_floating(like->dtype())) return scalar_like(v, *like);
    return scalar_tensor(v, TensorOptions(DType::f32));
  }
  return numpy_to_tensor_copy(h, what);
}

namespace {

// Ctrl-C between kernels: a C-level SIGINT handler in front of Python's own marks the interrupt for
// the engine's poll (engine/context.h), and passes the signal on, so Python raises
// KeyboardInterrupt as usual. The package's Python-level handler clears the mark when Python
// handles the signal itself (python/kiln/__init__.py).
std::atomic<int> g_sigint{0};
PyOS_sighandler_t g_python_sigint = nullptr;

extern "C" void on_sigint(int sig) {
  g_sigint.store(1, std::memory_order_relaxed);
  if (g_python_sigint && g_python_sigint != SIG_DFL && g_python_sigint != SIG_IGN) g_python_sigint(sig);
}
bool interrupt_pending() { return g_sigint.load(std::memory_order_relaxed) != 0; }

void translate_errors(const std::exception_ptr& p, void*) {
  try {
    std::rethrow_exception(p);
  } catch (const Interrupted& e) {
    g_sigint.store(0);
    // Python's handler runs now (KeyboardInterrupt, or whatever the program installed).
    if (PyErr_CheckSignals() != 0) return;
    PyErr_SetString(PyExc_KeyboardInterrupt, "interrupted between kernels");
  } catch (const Error& e) {
    set_error(g_kiln_error, e.what());
  }
}

}  // namespace
}  // namespace kiln::py

using namespace kiln;
using namespace kiln::py;

NB_MODULE(_C, m) {
  m.doc() = "Kiln's engine (C++): tensors, ops, autograd. Use it through the `kiln` package.";

  g_kiln_error = PyErr_NewException("kiln.KilnError", PyExc_RuntimeError, nullptr);
  nb::object bases_v = nb::make_tuple(nb::handle(g_kiln_error), nb::handle(PyExc_ValueError));
  g_value_error = PyErr_NewException("kiln.KilnValueError", bases_v.ptr(), nullptr);
  nb::object bases_i = nb::make_tuple(nb::handle(g_kiln_error), nb::handle(PyExc_IndexError));
  g_index_error = PyErr_NewException("kiln.KilnIndexError", bases_i.ptr(), nullptr);
  m.attr("KilnError") = nb::handle(g_kiln_error);
  m.attr("KilnValueError") = nb::handle(g_value_error);
  m.attr("KilnIndexError") = nb::handle(g_index_error);
  nb::register_exception_translator(translate_errors);

  // The settings of the `kiln` command: KILN_NUM_THREADS (default: the CPUs available),
  // KILN_CPU_CACHE_MB, KILN_GEMM, KILN_CPU_ISA.
  tools::apply_environment();

  nb::enum_<DType>(m, "dtype",
                   "Element types. float32 (f32), float16, bfloat16, float64, int64, int32, int16, int8, uint8, bool.")
      .value("float32", DType::f32)
      .value("float16", DType::f16)
      .value("bfloat16", DType::bf16)
      .value("float64", DType::f64)
      .value("int32", DType::i32)
      .value("int64", DType::i64)
      .value("uint8", DType::u8)
      .value("bool", DType::boolean)
      .value("int8", DType::i8)
      .value("int16", DType::i16)
      .def_prop_ro("is_floating_point", [](DType d) { return is_floating(d); })
      .def_prop_ro("itemsize", [](DType d) { return dtype_size(d); })
      .def_prop_ro("short_name", [](DType d) { return std::string(dtype_name(d)); });
  m.def(
      "promote_types", [](nb::handle a, nb::handle b) { return promote_types(to_dtype(a), to_dtype(b)); },
      "The dtype two operands of these dtypes compute in.");

  nb::class_<Device>(m, "Device", "A device: kiln.Device(\"cpu\"), kiln.Device(\"cuda:1\").")
      .def(
          "__init__", [](Device* d, nb::handle spec) { new (d) Device(to_device(spec)); }, nb::arg("spec"))
      .def_prop_ro("type", [](const Device& d) { return d.is_cpu()    ? "cpu"
                                                        : d.is_meta() ? "meta"
                                                                      : "cuda"; })
      .def_prop_ro("index", [](const Device& d) { return d.index; })
      .def("__str__", &Device::str)
      .def("__repr__", [](const Device& d) { return "kiln.Device('" + d.str() + "')"; })
      .def("__eq__",
           [](const Device& a, nb::handle b) {
             if (!nb::isinstance<Device>(b) && !nb::isinstance<nb::str>(b)) return false;
             return a == to_device(b);
           })
      .def("__hash__", [](const Device& d) { return std::hash<std::string>()(d.str()); });
  nb::implicitly_convertible<nb::str, Device>();

  m.def(
      "manual_seed",
      [](nb::handle seed) {
        if (!PyLong_Check(seed.ptr()) || PyBool_Check(seed.ptr()))
          type_error("manual_seed: seed must be an int, got " + py_type_name(seed));
        // As torch: any int, taken modulo 2^64 (a negative seed wraps: -1 is 2^64 - 1).
        nb::object wrapped = nb::steal(PyNumber_And(seed.ptr(), nb::int_(~0ULL).ptr()));
        if (!wrapped.is_valid()) throw nb::python_error();
        manual_seed(uint64_t(PyLong_AsUnsignedLongLong(wrapped.ptr())));
        note_manual_seed_in_torch_worker();  // a worker_init_fn's seed wins over the worker's
      },
      nb::arg("seed"),
      "Seeds the default random stream (Philox; the same on CPU and GPU). Any int: taken modulo 2**64, "
      "as torch.manual_seed (a negative seed wraps).");
  m.def(
      "_rng_state",
      [] {
        const Generator& g = default_generator();
        return nb::make_tuple(g.seed, g.offset);
      },
      "The default generator's (seed, offset): kiln.get_rng_state's bytes.");
  m.def(
      "_set_rng_state",
      [](uint64_t seed, uint64_t offset) {
        Generator& g = default_generator();
        g.seed = seed;
        g.offset = offset;
      },
      nb::arg("seed"), nb::arg("offset"), "Restores a (seed, offset) that _rng_state gave (kiln.set_rng_state).");
  m.def(
      "cuda_device_count", [] { return cuda::device_count(); },
      "CUDA devices visible (0 without a GPU or a CUDA build).");
  m.def(
      "cuda_synchronize",
      [](int device) {
        GilRelease nogil;
        cuda::synchronize(device);
      },
      nb::arg("device") = 0, "Waits for the device's queued work.");
  m.def(
      "_alpha", [](nb::handle alpha, DType t, const std::string& op) { return alpha_arg(alpha, t, op.c_str()); },
      nb::arg("alpha"), nb::arg("dtype"), nb::arg("op"),
      "add's alpha rules for a result of dtype: the alpha as a float (an integral dtype takes only an int it "
      "holds, a float dtype no bool), or an error naming op.");
  m.def("get_num_threads", [] { return Context::current().num_threads; });
  m.def(
      "set_num_threads",
      [](int n) {
        Context c = Context::current();
        c.num_threads = n;
        c.apply();
      },
      nb::arg("n"), "CPU kernel threads.");
  m.def(
      "set_flush_denormal",
      [](bool on) {
        Context c = Context::current();
        c.flush_denormal = on;
        c.apply();
        return true;
      },
      nb::arg("mode"),
      "CPU kernels flush subnormal inputs and results to zero (x86 FTZ + DAZ; on by default: subnormals "
      "made GEMMs 8x slower). Returns True, as torch.set_flush_denormal where it is supported.");
  // torch.use_deterministic_algorithms: the Context's deterministic flag. Every Kiln kernel has a
  // deterministic path (no floating atomics: index_add and embedding's backward sort their indices,
  // scatter_add's CUDA kernel is a gather that scans the indices in order; the CPU always is); the flag
  // picks it where a faster one exists on CUDA (cuDNN convolution and batch norm algorithms, the GEMM
  // choice), so no op is refused and warn_only changes nothing but its getter. cuDNN benchmark mode may
  // still time and pick a different deterministic convolution algorithm from run to run.
  static bool g_deterministic_warn_only = false;
  m.def(
      "use_deterministic_algorithms",
      [](nb::handle mode, nb::handle warn_only) {
        if (!PyBool_Check(mode.ptr()))
          type_error("use_deterministic_algorithms: mode must be a bool, got " + py_type_name(mode));
        if (!PyBool_Check(warn_only.ptr()))
          type_error("use_deterministic_algorithms: warn_only must be a bool, got " + py_type_name(warn_only));
        Context c = Context::current();
        c.deterministic = mode.ptr() == Py_True;
        c.apply();
        g_deterministic_warn_only = warn_only.ptr() == Py_True;
      },
      nb::arg("mode"), nb::kw_only(), nb::arg("warn_only") = false,
      "Deterministic algorithms only (the Context's deterministic flag): on CUDA the deterministic cuDNN "
      "convolution and handwritten batch norm kernels and a fixed GEMM choice; the CPU always is. Every Kiln "
      "op has a deterministic path (no floating atomics: index_add and embedding's backward sort their "
      "indices, scatter_add's CUDA kernel is a gather scan), so none is refused (warn_only is recorded). With "
      "cuDNN benchmark mode on, the timing may still pick a different deterministic convolution algorithm "
      "from run to run, whose bits can differ.");
  m.def("are_deterministic_algorithms_enabled", [] { return Context::current().deterministic; });
  m.def("is_deterministic_algorithms_warn_only_enabled", [] { return g_deterministic_warn_only; });
  m.def(
      "cpu_isa", [] { return Context::current().cpu_isa; }, "The CPU kernel set in use: avx512, avx2 or generic.");
  m.def("host_read_count", &host_read_count);
  m.def(
      "_install_interrupt",
      [] {
        PyOS_sighandler_t prev = PyOS_setsig(SIGINT, on_sigint);
        if (prev != on_sigint) g_python_sigint = prev;
        set_interrupt_poll(&interrupt_pending);
      },
      "Lets Ctrl-C stop a long call between kernels (on this thread, the main one).");
  m.def("_clear_interrupt", [] { g_sigint.store(0); });
  m.def(
      "_exit_quiesce",
      [](int64_t timeout_ms) {
        g_exiting_thread.store(PyThread_get_thread_ident());
        g_exiting.store(true);
        // Bounded, and Ctrl-C ends it: engine work that never ends (a hook blocked for ever inside a
        // backward) must not keep the process from exiting. A thread left inside may abort the
        // process as Python finalizes (GilRelease): said on stderr. The GIL is let go meanwhile (not
        // through GilRelease: this thread is not inside engine work), so they can take it back.
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
        bool interrupted = false;
        while (g_released.load() > 0 && std::chrono::steady_clock::now() < deadline && !interrupted) {
          PyThreadState* s = PyEval_SaveThread();
          for (int i = 0; i < 20 && g_released.load() > 0; ++i)
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
          PyEval_RestoreThread(s);
          if (PyErr_CheckSignals() != 0) {
            PyErr_Clear();  // the exit goes on: Ctrl-C only ends the wait
            interrupted = true;
          }
        }
        const int left = g_released.load();
        if (left > 0)
          PySys_WriteStderr("kiln: exit did not wait for %d thread%s still in Kiln code (%s)\n", left,
                            left > 1 ? "s" : "", interrupted ? "interrupted" : "still there after the exit's wait");
        return left;
      },
      nb::arg("timeout_ms") = 10000,
      "At interpreter exit: waits (timeout_ms at most; Ctrl-C ends it) for the threads inside engine code without "
      "the GIL, and returns how many are left; after it, threads other than this one keep the GIL in engine code "
      "(a thread taking it back while Python finalizes aborts the process).");
  m.def(
      "_gil_releases_after_fork", [] { g_released.store(0); },
      "In a forked child (os.register_at_fork): the threads counted inside engine code are not there, and the "
      "one that forked held the GIL, so none is (else _exit_quiesce would wait for them for ever).");
  m.def(
      "_release_python_refs",
      [] {
        // Taken out under the lock, dropped outside it: dropping one may free tensors whose own
        // PyRefs unregister themselves.
        std::vector<nb::object> drop;
        {
          std::lock_guard<std::mutex> lock(g_refs_mu);
          for (PyRef* r : live_refs())
            if (r->obj.is_valid() && !r->obj.is_none()) drop.push_back(std::exchange(r->obj, nb::none()));
        }
        drop.clear();
      },
      "At interpreter exit: every Python object held by the engine (hooks, Function backward closures) is let "
      "go, breaking the reference cycles through C++ that Python's GC cannot see.");

  // kiln.amp.GradScaler's state_dict() and load_state_dict() (python/kiln/amp.py): the scale, growth
  // tracker and skipped-step count, read from and written to the scaler's device.
  m.def("_grad_scaler_state", [](const amp::GradScaler& g) {
    const amp::GradScalerState s = g.state();
    return nb::make_tuple(s.scale, s.growth_tracker, s.skipped);
  });
  m.def(
      "_grad_scaler_load_state",
      [](amp::GradScaler& g, double scale, int64_t growth_tracker, int64_t skipped) {
        g.load_state({scale, growth_tracker, skipped});
      },
      nb::arg("scaler"), nb::arg("scale"), nb::arg("growth_tracker"), nb::arg("skipped"));

  bind_tensor(m);
  bind_interop(m);
  bind_ops(m);
  bind_nn_ops(m);
  bind_autograd(m);
  bind_train(m);
  bind_nn(m);
  bind_tensor_views(m);
  bind_linalg_lu(m);
  bind_linalg_spectral(m);
}
