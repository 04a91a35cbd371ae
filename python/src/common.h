// What the files of the extension module kiln._C share: the argument conversions (dtypes, devices,
// dims) and the functions each file registers with the module.
#pragma once
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "kiln.h"

namespace kiln::py {

namespace nb = nanobind;

// A Python object held from C++ code that may run without the GIL (a backward function, a hook, a
// deleter): the reference is dropped with the GIL held, and not at all once the interpreter is gone.
// Python's GC cannot see these references, so a cycle through one (a hook whose function's globals
// hold the tensor it hooks; a graph whose Function closure reaches the output holding the graph) is
// never collected: at interpreter exit (atexit, kiln._C._release_python_refs) every live PyRef lets
// go of its object, which breaks such cycles before nanobind checks for leaked instances. A PyRef
// released so holds None; callers check obj before calling it.
struct PyRef {
  nb::object obj;
  explicit PyRef(nb::object o);
  ~PyRef();
  PyRef(const PyRef&) = delete;
  PyRef& operator=(const PyRef&) = delete;
};
inline std::shared_ptr<PyRef> hold(nb::object o) { return std::make_shared<PyRef>(std::move(o)); }

// The GIL released around engine work: the bindings release it only through this (a scope, or
// nb::call_guard<GilRelease>). A daemon thread taking the GIL back once the interpreter is
// finalizing is ended there by pthread_exit, whose unwinding through these C++ frames (noexcept)
// aborts the process ("terminate called without an active exception"): a DataLoader worker thread
// still in a __getitem__ at exit. So the releases are counted, and kiln._C._exit_quiesce (kiln.data's
// atexit hook) waits for the threads inside one to leave it; from then on a thread other than the
// exiting one keeps the GIL through engine work, so finalization finds every thread in Python code,
// where ending it is safe. kiln.data registers that hook when a pass first starts worker threads, so
// a program's own daemon threads in engine work at exit are its own to join (as with any C++
// extension). _exit_quiesce's wait is bounded (10 s) and ends at Ctrl-C: engine work
// that never ends (a hook blocked for ever) must not keep the process from exiting.
class GilRelease {
 public:
  GilRelease();
  ~GilRelease();
  GilRelease(const GilRelease&) = delete;
  GilRelease& operator=(const GilRelease&) = delete;

 private:
  PyThreadState* saved_ = nullptr;  // null: the GIL kept (after _exit_quiesce)
};

// The GIL taken back to call Python from engine code (a hook, a Function's backward, kiln.train's
// callback, a tensor's owner dropped): the thread is in Python code while it holds it, so it is not
// counted inside a GilRelease meanwhile (else _exit_quiesce waited on a hook waiting on an Event).
// Going back into engine code once the exit has begun, it keeps the GIL (as GilRelease then does).
class GilAcquire {
 public:
  GilAcquire();
  ~GilAcquire();
  GilAcquire(const GilAcquire&) = delete;
  GilAcquire& operator=(const GilAcquire&) = delete;

 private:
  PyGILState_STATE state_;
  bool uncounted_ = false;  // this thread was counted in a GilRelease, and is not while it holds the GIL
};

// Argument conversions. Each raises kiln.KilnValueError (a ValueError) naming `what` on bad input.
DType to_dtype(nb::handle h, const char* what = "dtype");              // kiln.dtype or a name ("float32", "f32")
Device to_device(nb::handle h, const char* what = "device");           // kiln.Device or "cpu", "cuda", "cuda:1"
std::vector<int64_t> to_dims(nb::handle h, const char* what = "dim");  // None, an int or a sequence
Shape to_shape(nb::handle args);                                       // f(2, 3) or f((2, 3)) or f([2, 3])
// A Tensor from a Tensor, a Python number or bool (0-dim, in `like`'s dtype rules when given), a
// nested list or any array NumPy accepts (copied).
Tensor to_tensor(nb::handle h, const Tensor* like = nullptr, const char* what = "argument");
// The other operand of x += / -= / *= / /= o: a Python number beside a 16-bit x is a 0-dim f32 (the
// kernels compute in f32 and round once, as x * 0.1 does); anything else as to_tensor makes it.
// (Out of place, a number goes to the engine's double overloads, which also handle a 0-dim x.)
Tensor arith_operand(nb::handle h, const Tensor& like, const char* what);
// A Python number (a float, or an int a double holds exactly; not a bool) beside a 16-bit `like`:
// its value, which + - * / keep in f32 (arith_operand in place; the engine's double overloads out
// of place, which also handle a 0-dim tensor); else nothing.
std::optional<double> number_beside_16bit(nb::handle h, const Tensor& like, const char* what);
// a / b or b / a (number_first) for an integer or bool tensor a and a Python number b: true division in
// f32 with the number as it is (x / 300, x.div(300), kiln.div); nothing for other operands (tensor.cpp).
std::optional<Tensor> divide_by_number(const Tensor& a, nb::handle b, bool number_first);
// a ** b for x ** b, x.pow(b) and kiln.pow(x, b): one path, so the spellings agree (tensor.cpp).
Tensor pow_operand(const Tensor& a, nb::handle b);

// The comment above a function's declaration in engine/ops.h or nn_ops.h ("" when none).
const char* header_doc(std::string_view name);
// Module functions that take the header's comment as their docstring unless given one.
template <typename... E> inline constexpr bool kHasDoc = (std::is_convertible_v<E, const char*> || ...);
struct Defs {
  nb::module_& m;
  template <typename F, typename... E> Defs& def(const char* name, F&& f, const E&... extra) {
    if constexpr (kHasDoc<E...>)
      m.def(name, std::forward<F>(f), extra...);
    else
      m.def(name, std::forward<F>(f), extra..., header_doc(name));
    return *this;
  }
};

// Raised for bad arguments: subclasses of kiln.KilnError that are also ValueError / IndexError;
// TypeError and OverflowError for a wrong type or a Python int out of range. Messages are UTF-8
// with any invalid bytes (a damaged file's header quoted) shown as \xNN escapes.
[[noreturn]] void value_error(const std::string& msg);
[[noreturn]] void index_error(const std::string& msg);
[[noreturn]] void type_error(const std::string& msg);
[[noreturn]] void overflow_error(const std::string& msg);
// Sets a Python exception of `type` from a C++ message (errors="backslashreplace").
void set_error(PyObject* type, const std::string& msg);

// str(h) and type(h).__name__, for messages.
std::string str_of(nb::handle h);
std::string py_type_name(nb::handle h);
// A Python int (or anything with __index__, not a bool or a float) as int64; `what` names the
// argument in the error: TypeError for another type, OverflowError outside int64.
int64_t to_int64(nb::handle h, const char* what);
// A Python int as an exact int64, or nullopt when h is not an int (bools excluded); OverflowError
// naming `what` for an int outside int64.
std::optional<int64_t> exact_int(nb::handle h, const char* what);
// A real number (int or float, or anything with __float__; not a str); TypeError naming `what`.
double to_double(nb::handle h, const char* what);
// A fill value for a tensor of dtype t (fill_, full, masked_fill): to_double's, but a Python int from
// -255 to -1 for a uint8 tensor wraps to 1..255, as torch's (its check lets such ints through for
// uint8 and casts them: fill_(-1) is 255); a negative float stays out of range there, as torch's.
double fill_value(DType t, nb::handle h, const char* what);
// add/sub's alpha (add_, sub_ too) for a result of dtype t, as torch takes it: a bool only for a bool
// result, an int (not a float, not even 1.0) for an integer or bool one, and that a value of t (u8: -255
// to 255, a negative one wrapping; with `subtracts`, -alpha must be one, as torch's sub checks); a
// KilnValueError naming `op` otherwise.
double alpha_arg(nb::handle h, DType t, const char* op, bool subtracts = false);
// A 0-dim int64 tensor holding v exactly (scalar_tensor goes through double).
Tensor int64_scalar(int64_t v);
// An activation's inplace=True (nn_ops.cpp): whether x, given the out-of-place result `out`, now holds
// the result (written into it, or pointed at it inside a graph), so that the call returns x's own Python
// object, as torch's; a leaf that requires grad is refused, as torch's. False for inplace=False.
bool activation_into(const char* op, Tensor& x, bool inplace, const Tensor& out);
// What the activation `op` (compute(x), run without the GIL) called with inplace=`inplace` returns: x's
// own Python object where activation_into put the result in it (y is x, as torch's), else the new tensor.
template <class F> nb::object activation_out(const char* op, Tensor& x, bool inplace, F&& compute) {
  Tensor out;
  bool into = false;
  {
    GilRelease nogil;
    out = compute(x);
    into = activation_into(op, x, inplace, out);
  }
  return into ? nb::find(&x) : nb::cast(std::move(out));
}

// Each file's part of the module.
void bind_tensor(nb::module_& m);
void bind_interop(nb::module_& m);
void bind_ops(nb::module_& m);
void bind_nn_ops(nb::module_& m);
void bind_autograd(nb::module_& m);
void bind_train(nb::module_& m);
void bind_nn(nb::module_& m);
void bind_tensor_views(nb::module_& m);  // tensor_views.cpp: unfold, view(dtype), channels_last
void bind_linalg_lu(nb::module_& m);     // linalg_lu.cpp: LU, Cholesky, triangular solves (private names)
void bind_linalg_spectral(nb::module_& m);  // linalg_spectral.cpp: eigh, svd, qr (kiln.linalg)

// kiln.manual_seed in a torch DataLoader worker: the worker's seed counts as applied, so the first
// ds[i] there keeps the user's seed (nn.cpp).
void note_manual_seed_in_torch_worker();

// The module's exception types (set up by module.cpp).
extern PyObject* g_kiln_error;
extern PyObject* g_value_error;
extern PyObject* g_index_error;

}  // namespace kiln::py
