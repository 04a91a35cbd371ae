// Tensors in and out without copies: NumPy (.numpy(), kiln.from_numpy) and DLPack both ways
// (__dlpack__ / __dlpack_device__, kiln.from_dlpack), and kiln.tensor, the copying constructor.
// A tensor handed out keeps its storage alive through the owner it carries (a heap copy of the
// Tensor handle); a buffer taken in is held by the storage's release function until the last
// Kiln tensor viewing it lets go.
#include <nanobind/ndarray.h>
#include <nanobind/stl/filesystem.h>
#include <nanobind/stl/map.h>

#include "common.h"
#include "io/safetensors.h"
#include "kernels/cuda/cuda_backend.h"

namespace kiln::py {
namespace {

enum { kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3, kDLCUDAManaged = 13 };
constexpr const char* kNoKilnDtype =
    " has no Kiln dtype (Kiln has float32, float16, bfloat16, float64, int64, int32, int16, int8, uint8, bool)";

nb::dlpack::dtype dl_dtype(DType d) {
  using nb::dlpack::dtype_code;
  switch (d) {
    case DType::f32: return {uint8_t(dtype_code::Float), 32, 1};
    case DType::f16: return {uint8_t(dtype_code::Float), 16, 1};
    case DType::bf16: return {uint8_t(dtype_code::Bfloat), 16, 1};
    case DType::f64: return {uint8_t(dtype_code::Float), 64, 1};
    case DType::i32: return {uint8_t(dtype_code::Int), 32, 1};
    case DType::i64: return {uint8_t(dtype_code::Int), 64, 1};
    case DType::u8: return {uint8_t(dtype_code::UInt), 8, 1};
    case DType::boolean: return {uint8_t(dtype_code::Bool), 8, 1};
    case DType::i8: return {uint8_t(dtype_code::Int), 8, 1};
    case DType::i16: return {uint8_t(dtype_code::Int), 16, 1};
  }
  return {};
}

std::string describe(nb::dlpack::dtype t) {
  static const char* codes[] = {"int", "uint", "float", "opaque", "bfloat", "complex", "bool"};
  const char* c = t.code < 7 ? codes[t.code] : "code?";
  return std::string(c) + std::to_string(t.bits) + (t.lanes != 1 ? "x" + std::to_string(t.lanes) : "");
}

DType kiln_dtype(nb::dlpack::dtype t, const char* what) {
  using nb::dlpack::dtype_code;
  if (t.lanes == 1) {
    if (t.code == uint8_t(dtype_code::Float) && t.bits == 32) return DType::f32;
    if (t.code == uint8_t(dtype_code::Float) && t.bits == 16) return DType::f16;
    if (t.code == uint8_t(dtype_code::Float) && t.bits == 64) return DType::f64;
    if (t.code == uint8_t(dtype_code::Bfloat) && t.bits == 16) return DType::bf16;
    if (t.code == uint8_t(dtype_code::Int) && t.bits == 32) return DType::i32;
    if (t.code == uint8_t(dtype_code::Int) && t.bits == 64) return DType::i64;
    if (t.code == uint8_t(dtype_code::Int) && t.bits == 16) return DType::i16;
    if (t.code == uint8_t(dtype_code::Int) && t.bits == 8) return DType::i8;
    if (t.code == uint8_t(dtype_code::UInt) && t.bits == 8) return DType::u8;
    if (t.code == uint8_t(dtype_code::Bool) && t.bits == 8) return DType::boolean;
  }
  value_error(std::string(what) + ": element type " + describe(t) + kNoKilnDtype);
}

// The device a CUDA tensor of device id `index` is on for Kiln, checked against the devices it sees.
Device visible_cuda(int index, const char* what) {
  const int n = cuda::device_count();
  if (index < 0 || index >= n)
    value_error(std::string(what) + ": the memory is on cuda:" + std::to_string(index) + ", which this Kiln does not " +
                "see (" + std::to_string(n) + " CUDA devices" + (cuda::compiled() ? "" : "; built without CUDA") + ")");
  return cuda_device(index);
}

// A Kiln tensor over an ndarray's memory; the ndarray (and through it the producer) stays alive
// until the storage is released, and is let go with the GIL held (or kept, once the interpreter
// has shut down). Device memory is let go only once the Kiln work queued on it has run: the lender
// (PyTorch's caching allocator, CuPy's pool) may hand it out again at once, on its own stream.
template <typename... A> Tensor wrap(const nb::ndarray<A...>& a, const char* what) {
  const DType dt = kiln_dtype(a.dtype(), what);
  Device dev = kCPU;
  if (a.device_type() == kDLCUDA || a.device_type() == kDLCUDAManaged)
    dev = visible_cuda(a.device_id(), what);
  else if (a.device_type() != kDLCPU && a.device_type() != kDLCUDAHost)
    value_error(std::string(what) + ": memory on DLPack device type " + std::to_string(a.device_type()) +
                " (Kiln takes CPU, CUDA, CUDA host and CUDA managed memory)");
  Shape shape, strides;
  for (size_t i = 0; i < a.ndim(); ++i) {
    shape.push_back(int64_t(a.shape(i)));
    strides.push_back(a.stride(i));
    if (a.stride(i) < 0)
      value_error(std::string(what) + ": the array has a negative stride (dimension " + std::to_string(i) +
                  ", a reversed view); Kiln's strides are non-negative: pass a copy (NumPy: a.copy(), PyTorch: " +
                  "t.contiguous())");
  }
  using Held = nb::ndarray<nb::ro>;
  // One owner, moved out when the storage lets go: a buffer from_blob refuses (or a storage that dies
  // inside it) is dropped exactly once, with the release function or its last copy.
  std::shared_ptr<void> held(new Held(a), [](void* p) {
    if (!Py_IsInitialized()) return;
    GilAcquire gil;
    delete static_cast<Held*>(p);
  });
  std::function<void(void*)> release;
  if (dev.is_cuda())
    release = [held, d = dev.index](void*) mutable { cuda::release_after_queued_work(d, std::move(held)); };
  else
    release = [held](void*) mutable { held.reset(); };
  held.reset();  // the release function holds it now
  return from_blob(const_cast<void*>(static_cast<const void*>(a.data())), shape, dt, std::move(release), dev, strides);
}

// An ndarray view of `t` whose owner holds a copy of the handle (so the storage outlives every
// consumer), in framework F.
template <typename... F> nb::ndarray<F...> view_of(const Tensor& t) {
  auto* held = new Tensor(t.detach());
  nb::capsule owner(held, [](void* p) noexcept { delete static_cast<Tensor*>(p); });
  std::vector<size_t> shape;
  std::vector<int64_t> strides;
  for (int64_t i = 0; i < t.dim(); ++i) {
    shape.push_back(size_t(t.size(i)));
    strides.push_back(t.stride(i));
  }
  if (t.device().is_meta()) value_error("a meta tensor holds a shape but no memory: nothing to share");
  const int dev_type = t.device().is_cuda() ? kDLCUDA : kDLCPU;
  return nb::ndarray<F...>(t.raw_data(), shape.size(), shape.data(), owner, strides.data(), dl_dtype(t.dtype()),
                           dev_type, t.device().index);
}

nb::object numpy_of(const Tensor& t) {
  if (t.requires_grad())
    value_error("numpy(): the tensor requires grad; call .detach().numpy() (the array would not be part of the graph)");
  if (!t.device().is_cpu()) value_error("numpy(): the tensor is on " + t.device().str() + "; call .cpu() first");
  if (t.dtype() == DType::bf16)
    value_error("numpy(): NumPy has no bfloat16; convert first (.float()) or share it with kiln.to_dlpack consumers");
  return nb::cast(view_of<nb::numpy>(t));
}

}  // namespace

Tensor numpy_to_tensor_copy(nb::handle obj, const char* what) {
  nb::module_ np = nb::module_::import_("numpy");
  nb::object arr;
  try {
    arr = np.attr("asarray")(obj);
  } catch (nb::python_error& e) {
    value_error(std::string(what) + ": cannot make a tensor from " +
                nb::cast<std::string>(nb::repr(obj)).substr(0, 80) + " (" + e.what() + ")");
  }
  const std::string kind = nb::cast<std::string>(arr.attr("dtype").attr("kind"));
  if (kind == "O" || kind == "U" || kind == "S")
    value_error(std::string(what) + ": cannot make a tensor from " +
                nb::cast<std::string>(nb::repr(obj)).substr(0, 80) + " (not numbers)");
  // NumPy arrays and scalars (np.float64(2), np.int32(4)) keep their dtype, as in torch.tensor.
  const bool from_python = !nb::isinstance(obj, np.attr("ndarray")) && !nb::isinstance(obj, np.attr("generic"));
  // Python floats are float32 in Kiln, as in PyTorch.
  if (from_python && kind == "f") arr = arr.attr("astype")("float32");
  if (from_python && kind == "i") arr = arr.attr("astype")("int64");
  // A copy may as well be in the machine's byte order (a big-endian array, as read from a file).
  if (str_of(arr.attr("dtype").attr("byteorder")) == ">" && kind != "V")
    arr = arr.attr("astype")(arr.attr("dtype").attr("newbyteorder")("="));
  // Not np.ascontiguousarray: it makes a 0-d array 1-d, and kiln.tensor(np.array(3.)) is 0-d.
  if (!nb::cast<bool>(arr.attr("flags").attr("c_contiguous"))) arr = arr.attr("copy")("C");
  nb::ndarray<nb::ro> a;
  try {
    a = nb::cast<nb::ndarray<nb::ro>>(arr);
  } catch (const std::exception&) {
    value_error(std::string(what) + ": NumPy dtype " + str_of(arr.attr("dtype")) + kNoKilnDtype);
  }
  return wrap(a, what).clone();
}

void bind_interop(nb::module_& m) {
  // kiln.load / kiln.load_safetensors (python/kiln/__init__.py): read into memory, or with mmap the
  // tensors are copy-on-write views of the mapped file (io/safetensors.h says what that asks of it).
  m.def(
      "_load_safetensors",
      [](const std::filesystem::path& path, bool mmap) {
        io::SafetensorsFile f;
        {
          GilRelease nogil;
          f = io::load_safetensors(path.string(), mmap);
        }
        return nb::make_tuple(f.tensors, f.metadata);
      },
      nb::arg("path"), nb::arg("mmap") = false);
  m.def(
      "from_numpy",
      [](nb::handle obj) {
        nb::module_ np = nb::module_::import_("numpy");
        if (!nb::isinstance(obj, np.attr("ndarray"))) value_error("from_numpy: expected a numpy.ndarray");
        if (!nb::cast<bool>(obj.attr("flags").attr("writeable")))
          value_error("from_numpy: the array is read-only (kiln tensors are writable); use kiln.tensor(a) to copy it");
        const nb::object dt = obj.attr("dtype");
        if (str_of(dt.attr("byteorder")) == ">")
          value_error("from_numpy: the array is big-endian (dtype " + str_of(dt) +
                      "); Kiln shares memory only in the machine's byte order: use kiln.tensor(a) (a copy), or "
                      "a.astype(a.dtype.newbyteorder('='))");
        const int64_t itemsize = nb::cast<int64_t>(dt.attr("itemsize"));
        const nb::tuple strides = nb::borrow<nb::tuple>(obj.attr("strides"));
        for (size_t i = 0; i < strides.size(); ++i)
          if (itemsize > 0 && nb::cast<int64_t>(strides[i]) % itemsize != 0)
            value_error("from_numpy: the array's stride in dimension " + std::to_string(i) + " is " +
                        str_of(strides[i]) + " bytes, not a multiple of its item size (" + std::to_string(itemsize) +
                        "); Kiln's strides count elements: pass a copy (a.copy()) or use kiln.tensor(a)");
        nb::ndarray<> a;
        try {
          a = nb::cast<nb::ndarray<>>(obj);
        } catch (const std::exception&) {
          value_error("from_numpy: NumPy dtype " + str_of(obj.attr("dtype")) + kNoKilnDtype);
        }
        return wrap(a, "from_numpy");
      },
      nb::arg("array"), "A tensor sharing the array's memory (no copy); each keeps the memory alive.");

  m.def(
      "from_dlpack",
      [](nb::handle obj) {
        if (nb::isinstance<Tensor>(obj)) return nb::cast<Tensor>(obj);
        if (!nb::hasattr(obj, "__dlpack__") && !PyObject_CheckBuffer(obj.ptr()) && !(PyCapsule_CheckExact(obj.ptr())))
          value_error("from_dlpack: expected an object with __dlpack__ (a NumPy array, a torch.Tensor, ...)");
        // A CUDA producer is asked for its memory on Kiln's compute stream (DLPack's stream argument),
        // so that its pending writes are ordered before the Kiln kernels that read them.
        // The producer's device is made current for the call, and a versioned capsule is asked for
        // first (it carries the read-only flag), as nanobind does for the CPU.
        nb::object src = nb::borrow(obj);
        if (nb::hasattr(obj, "__dlpack_device__") && nb::hasattr(obj, "__dlpack__")) {
          nb::tuple dev = nb::cast<nb::tuple>(obj.attr("__dlpack_device__")());
          const int type = nb::cast<int>(dev[0]);
          if (type == kDLCUDA || type == kDLCUDAManaged) {
            const int index = visible_cuda(nb::cast<int>(dev[1]), "from_dlpack").index;
            // The producer's device current for the call (PyTorch refuses to export a tensor of another).
            const cuda::DeviceScope current(index);
            const intptr_t stream = reinterpret_cast<intptr_t>(cuda::compute_stream(index));
            try {
              src = obj.attr("__dlpack__")(nb::arg("stream") = stream, nb::arg("max_version") = nb::make_tuple(1, 0));
            } catch (nb::python_error& e) {
              if (!e.matches(PyExc_TypeError)) throw;  // a producer older than DLPack 1.0's keywords
              src = obj.attr("__dlpack__")(nb::arg("stream") = stream);
            }
          }
        }
        nb::ndarray<> a;
        try {
          a = nb::cast<nb::ndarray<>>(src);
        } catch (nb::python_error&) {
          throw;
        } catch (const std::exception& e) {
          nb::object dt = nb::getattr(obj, "dtype", nb::none());
          value_error(
              std::string("from_dlpack: cannot take this ") +
              nb::cast<std::string>(nb::str(nb::handle(reinterpret_cast<PyObject*>(Py_TYPE(obj.ptr()))))) +
              (dt.is_none() ? std::string() : " of dtype " + str_of(dt)) +
              " (an unsupported dtype, a read-only array, or a tensor that requires grad in its own framework)");
        }
        return wrap(a, "from_dlpack");
      },
      nb::arg("obj"), "A tensor sharing the memory of any DLPack producer (NumPy, PyTorch, CuPy, JAX): no copy.");

  m.def("_numpy", &numpy_of, nb::arg("tensor"));
  m.def(
      "_dlpack_view",
      [](const Tensor& t, nb::handle stream) {
        if (t.device().is_meta())
          throw nb::buffer_error("__dlpack__: a meta tensor holds a shape but no memory: nothing to share");
        if (t.device().is_cuda()) {
          // DLPack's stream: the consumer's (None: the legacy default stream, 1 too; 2: the per-thread
          // one), made to wait for Kiln's queued work, and kept from Kiln's reuse of the memory until
          // what it queued has run; -1: the consumer orders itself.
          intptr_t s = 1;
          if (!stream.is_none()) {
            if (!nb::isinstance<nb::int_>(stream)) throw nb::type_error("__dlpack__: stream must be an int or None");
            s = nb::cast<intptr_t>(stream);
            if (s == 0 || s < -1)
              value_error("__dlpack__: stream " + std::to_string(s) + " is not a CUDA stream (0 is ambiguous)");
            if (s == 2)
              throw nb::buffer_error(
                  "__dlpack__: the per-thread default stream (2) is not supported: pass the "
                  "consumer stream's handle");
          }
          if (s != -1) {
            const Storage& st = *t.storage();
            cuda::hand_to_stream(t.device().index, st.allocator && st.nbytes ? st.data : nullptr, uintptr_t(s));
          }
        }
        return view_of<nb::array_api>(t);
      },
      nb::arg("tensor"), nb::arg("stream").none() = nb::none(),
      "An array-API object over the tensor (it implements __dlpack__).");

  m.def(
      "_tensor_from",
      [](nb::handle data) {
        // A NumPy float64 scalar is a Python float too; as data it keeps its dtype (torch.tensor's rule).
        if (PyFloat_Check(data.ptr()) && !PyFloat_CheckExact(data.ptr())) return numpy_to_tensor_copy(data, "data");
        return to_tensor(data, nullptr, "data");
      },
      nb::arg("data").none());
}

}  // namespace kiln::py
