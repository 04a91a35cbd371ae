"""The Python side of kiln.Tensor: the copying constructor, grad-mode contexts, NumPy and DLPack
protocols, dtype and device shortcuts, and the ops of kiln attached as methods."""
import builtins
import functools
import inspect
import numbers
import threading

from . import _C
from ._C import Tensor


def tensor(data, dtype=None, device=None, requires_grad=False):
    """A new tensor holding a copy of `data`: a (nested) list of numbers, a number, a NumPy array
    or anything NumPy accepts, or a tensor. Python floats give float32 and ints int64 (as PyTorch);
    NumPy arrays keep their dtype. With a dtype, Python numbers convert to it as torch.tensor's do:
    each float read as its double (kiln.tensor([0.3], dtype=kiln.float64) is 0.3, not float32's
    0.30000001192092896), each int as its exact int64."""
    t = data.detach().clone() if isinstance(data, Tensor) else _C._tensor_from(_python_numbers(data, dtype))
    if dtype is not None or device is not None:
        t = t.to(dtype=dtype, device=device) if dtype is not None and device is not None else (
            t.to(dtype) if dtype is not None else t.to(device))
    if requires_grad:
        t.requires_grad_(True)
    return t


def _python_numbers(data, dtype):
    """data, or where it is Python numbers (a number, or nested lists of them) given with a dtype, a
    NumPy array of them that converts to dtype as torch.tensor's: a float kept as its double (the
    engine would read it as float32 first), an int as int64; for float32, float16 and bfloat16 rounded
    from the double to float32, then (16-bit) from float32, as torch's stores do; for int64, each
    element converted on its own (an int beyond 2**53 beside a float stays exact)."""
    import numpy as np
    if dtype is None or isinstance(data, (np.ndarray, np.generic)):
        return data
    if not isinstance(dtype, _C.dtype):  # a name, a torch or NumPy dtype, float/int/bool
        dtype = _C.empty([0], dtype=dtype).dtype
    try:
        a = np.asarray(data)
    except (ValueError, TypeError, OverflowError):
        return data  # not numbers: _tensor_from says what is wrong with it
    if a.dtype.kind not in "biuf":
        return data
    if dtype.is_floating_point:
        a = a.astype(np.float64)  # an int as Python's float(int) gives it
        if dtype == _C.dtype.float64:
            return a
        with np.errstate(over="ignore"):  # beyond float32: inf, as torch's
            return a.astype(np.float32)
    if dtype == _C.dtype.int64 and a.dtype.kind == "f":
        try:
            return np.array(data, dtype=np.int64)  # each number on its own, floats toward zero
        except (ValueError, OverflowError):
            pass  # NaN or out of range: as the engine converts float64
    return a


def is_grad_enabled():
    return _C.is_grad_enabled()


def _wrap_generator(make_ctx, fn):
    """Runs every step of the generator fn makes inside a fresh make_ctx() (as torch's
    _wrap_generator): values sent in, exceptions thrown in and close() all reach it in that mode,
    and the caller's mode holds between steps."""
    @functools.wraps(fn)
    def generator_context(*args, **kwargs):
        gen = fn(*args, **kwargs)
        try:
            with make_ctx():
                response = gen.send(None)
            while True:
                try:
                    request = yield response
                except GeneratorExit:
                    with make_ctx():
                        gen.close()
                    raise
                except BaseException as exc:
                    with make_ctx():
                        response = gen.throw(exc)  # one argument: the three-argument form is deprecated
                else:
                    with make_ctx():
                        response = gen.send(request)
        except StopIteration as e:
            return e.value
    return generator_context


class _GradModeContext:
    """A grad mode as a context manager or a decorator: a decorated function (or each step of a
    decorated generator) runs in a fresh instance of it."""
    mode = True

    def __enter__(self):
        self.prev = _C.is_grad_enabled()
        _C._set_grad_enabled(self.mode)
        return self

    def __exit__(self, *exc):
        _C._set_grad_enabled(self.prev)
        return False

    def clone(self):
        return self.__class__()

    def __call__(self, fn):
        if inspect.isclass(fn) or not callable(fn):
            raise TypeError(f"{type(self).__name__} decorates a function, got {type(fn).__name__}")
        if inspect.isgeneratorfunction(fn):
            return _wrap_generator(self.clone, fn)

        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            with self.clone():
                return fn(*args, **kwargs)
        return wrapped


class _NoParamGradModeContext(_GradModeContext):
    """Also usable bare as a decorator (`@kiln.no_grad`, as torch's)."""

    def __new__(cls, orig_func=None):
        if orig_func is None:
            return super().__new__(cls)
        return cls()(orig_func)


class no_grad(_NoParamGradModeContext):
    """No gradient recording inside: `with kiln.no_grad(): ...`, `@kiln.no_grad()` or `@kiln.no_grad`."""
    mode = False


class enable_grad(_NoParamGradModeContext):
    """Gradient recording inside, also within no_grad."""
    mode = True


class set_grad_enabled(_GradModeContext):
    """Turns gradient recording on or off for this thread, as torch's: called as a function it sets
    the mode at once; as a context manager the mode holds inside and the previous one comes back on
    exit; as a decorator (`@kiln.set_grad_enabled(False)`) the mode holds only inside calls of the
    decorated function (the mode at decoration is left as it was)."""

    def __init__(self, mode):
        self.prev = _C.is_grad_enabled()
        self.mode = builtins.bool(mode)
        _C._set_grad_enabled(self.mode)

    def __call__(self, fn):
        _C._set_grad_enabled(self.prev)
        return super().__call__(fn)

    def __enter__(self):  # the previous mode was taken in __init__; __exit__ (the base's) restores it
        _C._set_grad_enabled(self.mode)
        return self

    def clone(self):
        return self.__class__(self.mode)


_inference = threading.local()  # this thread's inference mode (autograd's grad mode is the engine's)


def is_inference_mode_enabled():
    """Whether this thread is inside kiln.inference_mode() (torch.is_inference_mode_enabled)."""
    return getattr(_inference, "enabled", False)


class inference_mode(_GradModeContext):
    """torch.inference_mode(mode=True): no gradient recording inside, as kiln.no_grad (Kiln has no
    inference tensors: what is made inside is an ordinary tensor without a grad_fn, usable in autograd
    later). `with kiln.inference_mode():`, `@kiln.inference_mode()` or `@kiln.inference_mode`;
    inference_mode(False) turns recording on (as torch's, also inside no_grad or an enabled
    inference_mode), and kiln.is_inference_mode_enabled() says whether an enabled one is current.
    Unlike torch's, an enable_grad() inside an enabled inference_mode records (torch's inference
    mode wins over it)."""

    def __new__(cls, mode=True):
        if mode is None or isinstance(mode, builtins.bool):
            return super().__new__(cls)
        return cls()(mode)  # bare @kiln.inference_mode

    def __init__(self, mode=True):
        self.mode = True if mode is None else mode

    def __enter__(self):
        self.prev, self.prev_inference = _C.is_grad_enabled(), is_inference_mode_enabled()
        _C._set_grad_enabled(not self.mode)  # torch's InferenceMode(mode) sets grad mode to !mode
        _inference.enabled = self.mode
        return self

    def __exit__(self, *exc):
        _C._set_grad_enabled(self.prev)
        _inference.enabled = self.prev_inference
        return False

    def clone(self):
        return self.__class__(self.mode)


# ---- protocols ----

def _numpy(self, force=False):
    """A NumPy array sharing this CPU tensor's memory (no copy); force=True detaches and copies to
    the CPU first when needed."""
    t = self
    if force:
        t = t.detach()
        if t.device.type != "cpu":
            t = t.to("cpu")
        if t.dtype == _C.dtype.bfloat16:
            t = t.to(_C.dtype.float32)
    return _C._numpy(t)


def _array(self, dtype=None, copy=None):
    a = _C._numpy(self.detach() if self.requires_grad else self)
    if dtype is not None:
        a = a.astype(dtype, copy=builtins.bool(copy))
    elif copy:
        a = a.copy()
    return a


def _dlpack(self, *, stream=None, max_version=None, dl_device=None, copy=None):
    """DLPack export: torch.from_dlpack(t), np.from_dlpack(t), without a copy unless `copy` is true or
    `dl_device` names another device (then a copy there; copy=False refuses that with BufferError). On
    CUDA the consumer's `stream` (None or 1: the legacy default stream, 2: the per-thread one, -1: no
    ordering) waits for Kiln's queued work, and Kiln reuses the memory only after that stream's work."""
    t = self.detach()
    if t.device.type == "meta":
        raise BufferError("__dlpack__: a meta tensor holds a shape but no memory: nothing to share")
    if dl_device is not None and tuple(dl_device) != _dlpack_device(t):
        if copy is False:
            raise BufferError(f"__dlpack__: dl_device {tuple(dl_device)} is not the tensor's device ({t.device}) "
                              "and copy=False")
        target = _device_of_dlpack(dl_device)
        if target != "cpu" and dl_device[1] >= _C.cuda_device_count():  # the array API's error for it
            raise BufferError(f"__dlpack__: cannot copy to {target}: this Kiln sees {_C.cuda_device_count()} "
                              "CUDA devices")
        t = t.to(target)
        if t.device.type == "cpu":
            stream = None
    elif copy:
        t = t.clone()
    view = _C._dlpack_view(t, stream)
    return view.__dlpack__() if max_version is None else view.__dlpack__(max_version=max_version)


def _device_of_dlpack(dl_device):
    kind, index = dl_device
    if kind == 1:
        return "cpu"
    if kind == 2:
        return f"cuda:{index}"
    raise BufferError(f"__dlpack__: Kiln makes memory on DLPack device types 1 (CPU) and 2 (CUDA), not {kind}")


def _dlpack_device(self):
    d = self.device
    if d.type == "meta":
        raise BufferError("__dlpack_device__: a meta tensor holds a shape but no memory")
    return (2, d.index) if d.type == "cuda" else (1, 0)


def _deepcopy(self, memo):
    # As torch: a leaf (a user's tensor, a parameter) is copied with its requires_grad and .grad, and
    # keeps its class (a Parameter stays one); a tensor inside a graph cannot be copied on its own.
    if id(self) in memo:
        return memo[id(self)]
    if self.grad_fn is not None:
        raise _C.KilnError("copy.deepcopy: only leaf tensors (made by the user, not by an op that records "
                           "a gradient) can be deep-copied; use t.detach().clone()")
    data = self.detach().clone()
    new = data if type(self) is Tensor else type(self)(data, requires_grad=self.requires_grad)
    if self.requires_grad and not new.requires_grad:
        new.requires_grad_(True)
    if self.grad is not None:
        new.grad = self.grad.detach().clone()
    memo[id(self)] = new
    return new


Tensor.__deepcopy__ = _deepcopy
Tensor.numpy = _numpy
Tensor.__array__ = _array
Tensor.__dlpack__ = _dlpack
Tensor.__dlpack_device__ = _dlpack_device
Tensor.__array_priority__ = 1000  # numpy_array + tensor -> Tensor.__radd__


def _cast(dt):
    def f(self):
        return self.to(dt)
    f.__name__ = dt.name
    return f


Tensor.float = _cast(_C.dtype.float32)
Tensor.double = _cast(_C.dtype.float64)
Tensor.half = _cast(_C.dtype.float16)
Tensor.bfloat16 = _cast(_C.dtype.bfloat16)
Tensor.long = _cast(_C.dtype.int64)
Tensor.int = _cast(_C.dtype.int32)
Tensor.bool = _cast(_C.dtype.bool)
Tensor.byte = _cast(_C.dtype.uint8)
Tensor.char = _cast(_C.dtype.int8)
Tensor.short = _cast(_C.dtype.int16)


def _repeat(self, *sizes):
    """torch's Tensor.repeat: tile with at least as many repetitions as dims."""
    if len(sizes) == 1 and not isinstance(sizes[0], builtins.int):
        sizes = tuple(sizes[0])
    if len(sizes) < self.dim():
        raise ValueError(f"repeat: {len(sizes)} repetitions for a {self.dim()}-D tensor (need at least {self.dim()})")
    return _C.tile(self, sizes)


Tensor.repeat = _repeat
Tensor.cpu = lambda self: self.to("cpu")
Tensor.cuda = lambda self, device=0: self.to(f"cuda:{device}" if isinstance(device, builtins.int) else device)
Tensor.is_floating_point = lambda self: self.dtype.is_floating_point
Tensor.type_as = lambda self, other: self.to(other.dtype)

# The ops that are also methods (x.sum(), x.relu(), ...): the first argument is the tensor.
_METHODS = """
neg abs sign exp log sqrt rsqrt tanh sigmoid relu sin cos tan asin acos atan sinh cosh asinh acosh atanh erf erfc erfinv
log1p expm1 log2 log10 exp2 reciprocal floor ceil round trunc frac isnan isinf isfinite logical_not gelu
add sub mul div floor_divide pow fmod remainder atan2 maximum minimum eq ne lt le gt ge logical_and logical_or matmul
clamp nan_to_num lerp addcmul addcdiv sum mean amax amin logsumexp any all prod count_nonzero var std norm
max min argmax argmin cumsum cumprod cummax cummin sort argsort topk kthvalue median mode split chunk
unbind index_select gather scatter scatter_add scatter_reduce take_along_dim nonzero masked_fill
masked_scatter index_put tril triu flip roll tile softmax log_softmax
""".split()


def _a_type(value):
    """'a float', 'an int': the article and the name of value's type, for messages."""
    name = type(value).__name__
    return ("an " if name[:1].lower() in "aeiou" else "a ") + name


def _as_method(fn):
    @functools.wraps(fn)
    def method(self, *args, **kwargs):
        return fn(self, *args, **kwargs)
    return method


for _name in _METHODS:
    setattr(Tensor, _name, _as_method(getattr(_C, _name)))
Tensor.clip = Tensor.clamp
Tensor.mm = Tensor.matmul


def _contains(self, value):
    """`value in t`: whether any element equals value, as torch ((t == value).any())."""
    if not isinstance(value, (Tensor, numbers.Number)):
        raise TypeError(f"Tensor.__contains__ only supports a Tensor or a number, not {type(value).__name__}")
    return builtins.bool((self == value).any())


Tensor.__contains__ = _contains


# The cheap in-place forms: written through copy_/add_/mul_, so the same rules hold (refused on a tensor
# that requires grad, or with an operand that does, unless under kiln.no_grad()); checked first here so
# that the error names the method called, not the one underneath.
def _div_(self, other):
    _C._check_inplace(self, "div_", other)
    return Tensor.__itruediv__(self, other)


def _neg_(self):
    _C._check_inplace(self, "neg_")
    return self.mul_(-1)


def _clamp_named(name):
    def clamp_(self, min=None, max=None):
        _C._check_inplace(self, name, min)
        _C._check_inplace(self, name, max)
        out = _C.clamp(self, min, max)
        # float bounds promote an integer x (clamp gives f32), which copy_ would truncate back
        def shown(b):  # a tensor bound by its type, not its (multi-line) values
            return f"a {b.dtype.name} tensor of shape {list(b.shape)}" if isinstance(b, Tensor) else repr(b)
        _check_inplace_result(self, out, name, name[:-1],
                              f" (bounds {shown(min)}, {shown(max)} on {self.dtype.name})")
        return self.copy_(out)
    clamp_.__name__ = name
    return clamp_


def _check_inplace_result(self, out, name, out_of_place, detail=""):
    """Refuses writing `out` into self in place where torch does ("result type can't be cast to the desired
    output type"): a floating result into an integer or bool tensor, an integer one into a bool tensor (copy_
    would truncate it). A floating result into another floating dtype is written, as there."""
    if ((out.dtype.is_floating_point and not self.dtype.is_floating_point)
            or (self.dtype == _C.dtype.bool and out.dtype != _C.dtype.bool)):
        raise _C.KilnError(f"{name}: the result type {out.dtype.name}{detail} cannot be written into "
                           f"{self.dtype.name} in place, as in PyTorch (result type can't be cast to the desired "
                           f"output type); use the out-of-place {out_of_place} or convert the tensor first")


def _masked_fill_(self, mask, value):
    _C._check_inplace(self, "masked_fill_", value)
    return self.copy_(_C.masked_fill(self, mask, value))


Tensor.div_ = _div_
Tensor.neg_ = _neg_
Tensor.clamp_ = _clamp_named("clamp_")
Tensor.clip_ = _clamp_named("clip_")
Tensor.masked_fill_ = _masked_fill_
Tensor.mT = property(lambda self: self.transpose(-2, -1))
Tensor.view_as = lambda self, other: self.view(*other.shape)
Tensor.expand_as = lambda self, other: self.expand(*other.shape)


def _new(fill):
    def f(self, *size, dtype=None, device=None, requires_grad=False):
        if len(size) == 1 and not isinstance(size[0], builtins.int):
            size = tuple(size[0])
        t = _C.full(list(size), fill, dtype=self.dtype if dtype is None else dtype,
                    device=self.device if device is None else device)
        if requires_grad:
            t.requires_grad_(True)
        return t
    return f


Tensor.new_zeros = _new(0)
Tensor.new_ones = _new(1)


def _new_full(self, size, fill_value, *, dtype=None, device=None, requires_grad=False):
    """torch's Tensor.new_full: a tensor of `size` (a sequence of ints) filled with fill_value (a number or
    a 0-dim tensor), with this tensor's dtype and device unless given; the value must fit the dtype as
    full's (uint8 takes -1 as 255)."""
    if isinstance(size, (builtins.int, float)) or not hasattr(size, "__iter__"):
        raise TypeError(f"new_full(): argument 'size' (position 1) must be tuple of ints, not {type(size).__name__}")
    if isinstance(fill_value, Tensor):
        if fill_value.dim() != 0:
            raise TypeError(f"new_full(): argument 'fill_value' (position 2) must be Number, not a "
                            f"{list(fill_value.shape)} Tensor")
        fill_value = fill_value.item()
    t = _C.full(list(size), fill_value, dtype=self.dtype if dtype is None else dtype,
                device=self.device if device is None else device)
    if requires_grad:
        t.requires_grad_(True)
    return t


Tensor.new_full = _new_full


# ---- .data ----

def _get_data(self):
    """A detached alias (same memory, requires_grad False) with a version counter of its own, as torch's
    .data: an in-place write through it (p.data.mul_(2) between forward and backward) is not seen by
    autograd's check that saved tensors are unchanged."""
    return self._alias_no_version()


def _span(t):
    lo = hi = t.data_ptr()
    for n, s in zip(t.shape, t.stride()):
        if n > 1:
            (lo, hi) = (lo + (n - 1) * s * t.element_size(), hi) if s < 0 else (lo, hi + (n - 1) * s * t.element_size())
    return lo, hi + t.element_size()


def _set_data(self, value):
    # torch rebinds the tensor to value's memory (and layout: shape, dtype and device may change). Kiln
    # does that where another tensor shares self's memory (base[1].data = t leaves base alone, as torch's;
    # a .data alias's .data = t leaves the tensor it came from alone) and where the layout changes, except
    # for a parameter (a leaf that requires grad): ZeRO keeps those in a flat buffer its optimizer updates,
    # which a rebound parameter would leave, so the values are copied in there (shape, dtype and device
    # must match), as they are for a tensor that holds its memory alone (the handle an optimizer holds and
    # a graph's saved copies then see them).
    if not isinstance(value, Tensor):
        raise TypeError(f"data: expected a kiln.Tensor, got {type(value).__name__}")
    parameter = self.requires_grad and self.is_leaf
    if (tuple(value.shape), value.dtype, value.device) != (tuple(self.shape), self.dtype, self.device):
        if not parameter:
            self._rebind_data(value.detach())
            return
        raise _C.KilnValueError(
            f"data: cannot assign a {list(value.shape)} {value.dtype.name} tensor on {value.device} to the .data of "
            f"a {list(self.shape)} {self.dtype.name} parameter on {self.device} (a leaf that requires grad): Kiln "
            "copies a parameter's values in place (ZeRO keeps them in its flat buffer; torch rebinds it), so shape, "
            "dtype and device must match; make a new Parameter (and optimizer) instead")
    shared = self._data_shared(value)  # before detach(), which would hold the memory once more
    value = value.detach()
    if shared and not parameter:
        self._rebind_data(value)
        return
    if shared and not self.is_contiguous():
        # torch rebinds a view (base[:, 1:3].data = v leaves base alone); copying in would write base.
        raise _C.KilnValueError(
            f"data: cannot assign to the .data of a non-contiguous {list(self.shape)} parameter that is a view "
            "(such as base[:, 1:3]): torch would rebind the view and leave its base alone, Kiln copies into a "
            "parameter's memory and would write through to the base; assign to base[...] (under kiln.no_grad()) "
            "instead")
    if value.numel() and self.numel():
        (a, b), (c, d) = _span(self), _span(value)
        if a < d and c < b:  # overlapping memory (p.data = p.data.t()): copy from a snapshot
            value = value.clone()
    # Without bumping the version, as torch's: a graph that saved this tensor sees the new values then
    # (p.data = v between forward and backward gives torch's gradient, not an error).
    with no_grad():
        self._alias_no_version().copy_(value)


Tensor.data = property(_get_data, _set_data)


# ---- pickling ----

def _rebuild(cls, array, dtype, device, requires_grad, state):
    t = _C._tensor_from(array)
    dtype = getattr(_C.dtype, dtype)
    if t.dtype != dtype:
        t = t.to(dtype)
    if device != "cpu":
        t = t.to(device)
    if cls is not Tensor:
        t = cls(t, requires_grad=requires_grad)
    if requires_grad and not t.requires_grad:
        t.requires_grad_(True)
    if state:
        for k, v in state.items():
            setattr(t, k, v)
    return t


def _reduce_ex(self, protocol):
    # As torch: the values (through NumPy, so on the CPU and bfloat16 widened to float32, restored on
    # load), dtype, device, requires_grad and the class (a Parameter stays one).
    if self.grad_fn is not None:
        raise _C.KilnError("pickle: only leaf tensors (made by the user, not by an op that records a gradient) can "
                           "be pickled; use t.detach()")
    return (_rebuild, (type(self), _numpy(self, force=True).copy(), self.dtype.name, str(self.device), self.requires_grad,
                       getattr(self, "__dict__", None) or None))


Tensor.__reduce_ex__ = _reduce_ex


# ---- more of torch's tensor API, written over the engine's ops ----
# Functions here are exported from kiln by name (_EXPORTS, see __init__) and, where torch has the
# method too, attached to Tensor (_MORE_METHODS, at the end).
import collections as _collections


class return_types:
    """The named (values, indices) tuples of the ops that return two tensors, as torch.return_types:
    `r.values`, `r.indices`, and still unpacked as `values, indices = ...`."""


for _name in ("max", "min", "sort", "topk", "kthvalue", "median", "mode", "cummax", "cummin"):
    _t = _collections.namedtuple(_name, ["values", "indices"])
    _t.__module__ = "kiln.return_types"
    _t.__qualname__ = _name
    setattr(return_types, _name, _t)


def _named_pair(name):
    fn, kind = getattr(_C, name), getattr(return_types, name)

    @functools.wraps(fn)
    def op(*args, **kwargs):
        out = fn(*args, **kwargs)
        return kind(*out) if isinstance(out, tuple) else out
    return op


def _as_requested(out, dtype):
    # An integer or bool sum is int64 in the engine; a requested narrower dtype takes it back, which wraps
    # as summing in that dtype would (torch: int8 [100, 100].sum(dtype=int8) is -56; a bool sum is any).
    return out if dtype is None or out.dtype == dtype else out.to(dtype)


def _sum(input, dim=None, keepdim=False, *, dtype=None):
    """torch.sum: dtype= converts the input first and gives that dtype (summing int8 as int64 with
    dtype=int64, float16 in float32; dtype=int8 wraps in int8)."""
    return _as_requested(_C.sum(input if dtype is None else input.to(dtype), dim, keepdim), dtype)


def _mean(input, dim=None, keepdim=False, *, dtype=None):
    """torch.mean: dtype= converts the input first and must be floating, as torch's (a mean is no integer)."""
    if dtype is not None:
        # .to() resolves the dtype (a kiln, NumPy or torch dtype, or a name such as "float32") before it is
        # looked at: dtype.is_floating_point was an AttributeError for all but a kiln.dtype.
        input = input.to(dtype)
        if not input.dtype.is_floating_point:
            raise NotImplementedError(f"mean(): could not infer output dtype. Optional dtype must be a floating "
                                      f"point dtype, got {input.dtype.name}; convert the mean with .to() for an "
                                      f"integer")
    return _C.mean(input, dim, keepdim)


def _cumsum(input, dim, *, dtype=None):
    return _as_requested(_C.cumsum(input if dtype is None else input.to(dtype), dim), dtype)


def _nonzero(input, *, as_tuple=False):
    """torch.nonzero: the (n, ndim) coordinates of the nonzero elements; as_tuple=True gives one 1-D
    tensor per dim instead (a 0-dim input counts as 1-D)."""
    if not as_tuple:
        return _C.nonzero(input)
    nz = _C.nonzero(input if input.dim() > 0 else input.unsqueeze(0))
    return tuple(nz.select(1, d) for d in range(nz.shape[1]))


def _where(condition, input=None, other=None):
    """torch.where: where(condition, input, other) picks elementwise; where(condition) is
    nonzero(condition, as_tuple=True)."""
    if input is None and other is None:
        return _nonzero(condition, as_tuple=True)
    if input is None or other is None:
        raise TypeError("where: give both input and other, or neither (where(condition) = nonzero(as_tuple=True))")
    return _C.where(condition, input, other)


def _norm_dim(d, n, what="dim"):
    lo, hi = (-n, n - 1) if n > 0 else (-1, 0)
    if not lo <= d <= hi:
        raise IndexError(f"Dimension out of range (expected to be in range of [{lo}, {hi}], but got {d})")
    return d % n if n > 0 else 0


def _split(tensor, split_size_or_sections, dim=0):
    """torch.split: pieces of split_size (the last may be smaller), or of the listed sizes."""
    if isinstance(split_size_or_sections, numbers.Integral):
        return tuple(_C.split(tensor, split_size_or_sections, dim))
    sizes = [builtins.int(s) for s in split_size_or_sections]
    d = _norm_dim(dim, tensor.dim())
    n = tensor.shape[d]
    if builtins.sum(sizes) != n or builtins.any(s < 0 for s in sizes):
        raise _C.KilnError(f"split_with_sizes expects split_sizes to sum exactly to {n} (input tensor's size at "
                           f"dimension {dim}), but got split_sizes={sizes}")
    out, at = [], 0
    for s in sizes:
        out.append(tensor.narrow(d, at, s))
        at += s
    return tuple(out)


_c_squeeze = Tensor.squeeze


def _squeeze(input, dim=None):
    """torch.squeeze: every size-1 dim, the one given, or those of a tuple of dims (others are kept)."""
    if dim is None or isinstance(dim, numbers.Integral):
        return _c_squeeze(input, dim)
    n = input.dim()
    dims = sorted({_norm_dim(builtins.int(d), n) for d in dim}, reverse=True)
    for d in dims:
        if input.shape[d] == 1:
            input = _c_squeeze(input, d)
    return input


def _flatten(input, start_dim=0, end_dim=-1):
    return input.flatten(start_dim, end_dim)


def _unflatten(input, dim, sizes):
    """torch.unflatten: dim split into `sizes` (one of them may be -1)."""
    d = _norm_dim(dim, input.dim())
    sizes = [builtins.int(s) for s in sizes]
    if len(sizes) == 0:
        raise _C.KilnValueError("unflatten: sizes must be non-empty")
    n = input.shape[d]
    known = functools.reduce(lambda a, b: a * b, [s for s in sizes if s != -1], 1)
    if sizes.count(-1) > 1:
        raise _C.KilnError("unflatten: only one dimension can be inferred")
    if -1 in sizes:
        if known == 0 or n % known:
            raise _C.KilnError(f"unflatten: Provided sizes {sizes} don't multiply up to the size of dim {dim} ({n}) "
                               "in the input tensor")
        sizes[sizes.index(-1)] = n // known
    elif known != n:
        raise _C.KilnError(f"unflatten: Provided sizes {sizes} don't multiply up to the size of dim {dim} ({n}) in "
                           "the input tensor")
    shape = list(input.shape)
    return input.reshape(*(shape[:d] + sizes + shape[d + 1:]))


def _movedim(input, source, destination):
    """torch.movedim: the dims `source` moved to `destination` (ints or sequences), the others kept in
    order: a view."""
    n = input.dim()
    src = [source] if isinstance(source, numbers.Integral) else list(source)
    dst = [destination] if isinstance(destination, numbers.Integral) else list(destination)
    if len(src) != len(dst):
        raise _C.KilnError(f"movedim: Invalid source or destination dims: source ({src} dims) should contain the "
                           f"same number of dims as destination ({dst} dims)")
    src = [_norm_dim(builtins.int(d), n) for d in src]
    dst = [_norm_dim(builtins.int(d), n) for d in dst]
    if len(set(src)) != len(src):
        raise _C.KilnError(f"movedim: repeated dim in `source` ({src})")
    if len(set(dst)) != len(dst):
        raise _C.KilnError(f"movedim: repeated dim in `destination` ({dst})")
    order = [-1] * n
    for s, d in zip(src, dst):
        order[d] = s
    rest = iter(d for d in range(n) if d not in src)
    order = [o if o >= 0 else next(rest) for o in order]
    return input.permute(*order)


def _diagonal(input, offset=0, dim1=0, dim2=1):
    """torch.diagonal: the diagonal of the dims dim1, dim2 (above it for offset > 0, below for offset < 0)
    as the last dim. A view, as torch's: writes into it (x.diagonal().add_(1), x.diagonal()[:] = 5) reach
    the input."""
    return _C.diagonal(input, offset, dim1, dim2)


def _bmm(input, mat2):
    """torch.bmm: a batch of matrix products, (b, n, m) @ (b, m, p); no broadcasting."""
    if input.dim() != 3:
        raise _C.KilnError("batch1 must be a 3D tensor")
    if mat2.dim() != 3:
        raise _C.KilnError("batch2 must be a 3D tensor")
    b, _, m = input.shape
    if tuple(mat2.shape[:2]) != (b, m):
        raise _C.KilnError(f"Expected size for first two dimensions of batch2 tensor to be: [{b}, {m}] but got: "
                           f"[{mat2.shape[0]}, {mat2.shape[1]}].")
    return _C.matmul(input, mat2)


_DT16 = (_C.dtype.float16, _C.dtype.bfloat16)


def _baddbmm(input, batch1, batch2, *, beta=1, alpha=1):
    """torch.baddbmm: beta * input + alpha * bmm(batch1, batch2); with beta = 0 input is not read (its
    NaN do not show; it gets a zero gradient), as torch. Under autocast all three are cast to its dtype
    (torch's lower-precision list has baddbmm; f64 stays, as matmul's rule), so the result is 16-bit,
    not 16-bit product + f32 input = f32. A 16-bit result is computed in f32 and rounded once, as
    torch's (rounding the product before the sum rounded twice)."""
    ac = _C.autocast_dtype()
    if ac is not None:
        input, batch1, batch2 = (t if not t.dtype.is_floating_point or t.dtype in (ac, _C.dtype.float64)
                                 else _C.cast(t, ac) for t in (input, batch1, batch2))
    out = _C.promote_types(_C.promote_types(input.dtype, batch1.dtype), batch2.dtype)
    if out in _DT16 and not (beta == 0 and alpha == 1):  # else the plain 16-bit bmm, which rounds once
        f32 = _C.dtype.float32
        with _C.autocast(out, enabled=False):  # the f32 products stay f32
            # input not read (beta = 0) is not cast either
            r = _baddbmm_direct(input if beta == 0 else _C.cast(input, f32), _C.cast(batch1, f32),
                                _C.cast(batch2, f32), beta, alpha)
        return _C.cast(r, out)
    return _baddbmm_direct(input, batch1, batch2, beta, alpha)


def _baddbmm_direct(input, batch1, batch2, beta, alpha):
    prod = _bmm(batch1, batch2)
    if alpha != 1:
        prod = prod * alpha
    if beta == 0:
        # input only broadcasts the shape; one that requires grad gets zeros (where, not 0 * input,
        # which would carry its NaN), so backward() reaches it as torch's.
        zero = _C.zeros_like(input)
        if input.requires_grad:
            zero = _C.where(_C.ne(zero, zero), input, zero)
        return prod + zero
    return prod + (input if beta == 1 else input * beta)


def _index_add(input, dim, index, source, *, alpha=1):
    """torch.index_add: input with alpha * source added along dim at index (repeated indices add up);
    differentiable in input and source."""
    if index.dim() > 1:
        raise _C.KilnIndexError(f"index_add_(): Index is supposed to be a vector, but got dim: {index.dim()} with "
                                f"size: {list(index.shape)}")
    if index.dtype not in (_C.dtype.int64, _C.dtype.int32):
        raise _C.KilnError(f"index_add_(): Expected dtype int32/int64 for index but got: {index.dtype.name}")
    n = input.dim()
    d = _norm_dim(dim, n)
    index = index.reshape(-1)
    # As torch: an index outside [0, size) is refused (a negative one too; index_put would count it from the end).
    size = input.shape[d] if n else 1
    if index.numel():
        lo, hi = _C.stack([index.min(), index.max()]).tolist()  # one read from the device, not two
        if lo < 0 or hi >= size:
            raise _C.KilnIndexError(f"index_add_(): index {lo if lo < 0 else hi} is out of bounds for dimension {d} "
                                    f"with size {size}")
    want = list(input.shape)
    if n:
        want[d] = index.shape[0]
    if list(source.shape) != want and not (n == 0 and source.numel() == 1):
        raise _C.KilnError(f"index_add_(): source {list(source.shape)} does not match the input {list(input.shape)} "
                           f"with dim {dim} of the index's length {index.shape[0]}")
    # alpha as add takes it for input's dtype (an integral input takes an int it holds, a bool one a bool),
    # and alpha * source stays in that dtype: an int64 input with alpha=2 came back f32
    a = _C._alpha(alpha, input.dtype, "index_add")
    if input.dtype == _C.dtype.bool:
        s = source if a else _C.zeros_like(source)
    elif a == 1:
        s = source
    else:
        s = source * (a if input.dtype.is_floating_point else builtins.int(a))
    if n == 0:
        return _C.index_put(input.unsqueeze(0), [index], s.reshape(1), True).squeeze(0)
    out = _C.index_put(_movedim(input, d, 0), [index], _movedim(s, d, 0), True)
    return _movedim(out, 0, d)


def _index_fill(input, dim, index, value):
    """torch.index_fill: input with value written along dim at the positions index names (an int64 vector
    or 0-dim tensor; negative indices count from the end; repeats are allowed). value is a number or a
    0-dim tensor, in input's dtype as masked_fill's (an int tensor takes 2.7 as 2, uint8 -1 as 255).
    Differentiable in input (no gradient at the filled positions) and in a 0-dim value tensor that
    requires grad (the sum of the gradient over the filled positions)."""
    n = input.dim()
    d = _norm_dim(dim, n)
    if not isinstance(index, Tensor) or index.dtype != _C.dtype.int64:
        raise _C.KilnIndexError("index_fill_(): Expected dtype int64 for index, got "
                                f"{getattr(index, 'dtype', type(index).__name__)}")
    if index.dim() > 1:
        raise _C.KilnIndexError(f"index_fill_(): Index has to be a vector/scalar, but got dim: {index.dim()} with "
                                f"size: {list(index.shape)}")
    if isinstance(value, Tensor) and value.dim() != 0:
        raise _C.KilnError(f"index_fill_ only supports a 0-dimensional value tensor, but got tensor with {value.dim()} "
                           "dimension(s).")
    size = input.shape[d] if n else 1
    index = index.reshape(-1)
    if index.device != input.device:
        index = index.to(input.device)
    mask = _C.zeros(size, dtype=_C.dtype.bool, device=input.device)
    if index.numel():
        lo, hi = _C.stack([index.min(), index.max()]).tolist()  # one read from the device, not two
        if lo < -size or hi >= size:
            bad = lo if lo < -size else hi
            # the dimension as torch names it: normalised (dim=-1 of a 2-d input is dimension 1)
            raise _C.KilnIndexError(f"index_fill_(): index {bad} is out of bounds for dimension {d} with size {size}")
        index = _C.where(_C.lt(index, 0), index + size, index)
        mask = _C.index_put(mask, [index], _C.ones(index.shape[0], dtype=_C.dtype.bool, device=input.device))
    mask = mask.reshape([size] + [1] * (n - d - 1)) if n else mask.reshape([])
    if isinstance(value, Tensor) and value.requires_grad and input.dtype.is_floating_point:
        return _C.where(mask, value.to(input.dtype), input)  # value's gradient: g summed over the filled positions
    return _C.masked_fill(input, mask, value)


def _bincount(input, weights=None, minlength=0):
    """torch.bincount: how often each value 0..max occurs in a 1-D non-negative integer tensor (at
    least minlength bins); with weights, the sum of the weights of each value."""
    if input.dim() != 1 or input.dtype.is_floating_point or input.dtype == _C.dtype.bool or (
            input.numel() and builtins.int(input.min()) < 0):
        raise _C.KilnError("bincount only supports 1-d non-negative integral inputs.")
    if minlength < 0:
        raise _C.KilnError("minlength should be >= 0")
    if weights is not None and (weights.dim() != 1 or weights.shape[0] != input.shape[0]):
        raise _C.KilnError("weights should be 1-d and have the same length as input")
    bins = builtins.max(builtins.int(input.max()) + 1 if input.numel() else 0, minlength)
    if weights is None:
        dt, vals = _C.dtype.int64, _C.ones(input.shape[0], dtype=_C.dtype.int64, device=input.device)
    else:
        dt = weights.dtype if weights.dtype.is_floating_point else _C.dtype.float64
        vals = weights.to(dt)
    out = _C.zeros(bins, dtype=dt, device=input.device)
    return _C.index_put(out, [input.to(_C.dtype.int64)], vals, True) if input.numel() else out


def _multinomial(input, num_samples, replacement=False):
    """torch.multinomial: num_samples category indices per row of non-negative weights (1-D or 2-D),
    drawn from Kiln's random stream (kiln.manual_seed): with replacement by inverting the cumulative
    weights, without by the k largest of weight / Exp(1) keys (a weighted draw without replacement)."""
    if input.dim() not in (1, 2):
        raise _C.KilnError("prob_dist must be 1 or 2 dim")
    if not input.dtype.is_floating_point:
        raise _C.KilnError(f"multinomial only supports floating-point dtypes for input, got: {input.dtype}")
    if num_samples <= 0:
        raise _C.KilnError("cannot sample n_sample <= 0 samples")
    p = (input if input.dim() == 2 else input.unsqueeze(0)).detach().to(_C.dtype.float64)
    rows, n = p.shape
    if not replacement and num_samples > n:
        raise _C.KilnError("cannot sample n_sample > prob_dist.size(-1) samples without replacement")
    if not builtins.bool(_C.isfinite(p).all()) or builtins.bool((p < 0).any()):
        raise _C.KilnError("probability tensor contains either `inf`, `nan` or element < 0")
    if builtins.bool((p.sum(-1) <= 0).any()):
        raise _C.KilnError("invalid multinomial distribution (sum of probabilities <= 0)")
    if replacement:
        cdf = p.cumsum(-1)
        u = _C.rand(rows, num_samples, dtype=_C.dtype.float64, device=p.device) * cdf[:, -1:]
        # category c where cdf[c-1] <= u < cdf[c]: how many cdf values are <= u (in chunks of samples,
        # so that rows * chunk * n booleans stay small)
        step = builtins.max(1, (1 << 22) // builtins.max(1, rows * n))
        picks = [(cdf.unsqueeze(1) <= u[:, s:s + step].unsqueeze(2)).sum(-1)
                 for s in range(0, num_samples, step)]
        out = _C.cat(picks, 1).clamp(None, n - 1)
    else:
        e = -_C.log1p(-_C.rand(rows, n, dtype=_C.dtype.float64, device=p.device))
        out = _C.topk(p / e, num_samples, -1)[1]
    out = out.to(_C.dtype.int64)
    return out if input.dim() == 2 else out.squeeze(0)


def _randperm(n, *, dtype=None, device=None, requires_grad=False):
    """torch.randperm: a random permutation of 0..n-1 from Kiln's random stream."""
    if n < 0:
        raise _C.KilnError(f"n must be non-negative, got{n}")
    out = _C.argsort(_C.rand(n, dtype=_C.dtype.float64, device=device))
    if dtype is not None:
        out = out.to(dtype)
    if requires_grad:
        out.requires_grad_(True)
    return out


def _randint(*args, low=None, high=None, size=None, dtype=None, device=None, requires_grad=False):
    """torch.randint: randint(high, size) or randint(low, high, size), integers uniform in [low, high)."""
    args = list(args)
    if size is None:
        if not args:
            raise TypeError("randint() missing the argument 'size'")
        size = args.pop()
    if high is None:
        if not args:
            raise TypeError("randint() missing the argument 'high'")
        high = args.pop()
    if low is None:
        low = args.pop() if args else 0
    if args:
        raise TypeError("randint() takes (high, size) or (low, high, size)")
    if isinstance(size, numbers.Integral):
        raise TypeError("randint(): argument 'size' must be a tuple of ints, not int")
    out = _C.randint(low, high, size, dtype=dtype, device=device)
    if requires_grad:
        out.requires_grad_(True)
    return out


def _inplace(name, compute):
    """A torch in-place method: `compute(self, ...)` written into self through copy_ (refused, naming
    the method, where autograd would miss the write; where torch refuses it: a float result into an integer
    tensor, which copy_ would truncate, or a result of another shape, operands broadcasting self larger)."""
    def method(self, *args, **kwargs):
        _C._check_inplace(self, name)
        for a in list(args) + list(kwargs.values()):
            if isinstance(a, Tensor):
                _C._check_inplace(self, name, a)
        out = compute(self, *args, **kwargs)
        _check_inplace_result(self, out, name, name[:-1])
        if list(out.shape) != list(self.shape):
            raise _C.KilnValueError(f"{name}: output with shape {list(self.shape)} doesn't match the broadcast "
                                    f"shape {list(out.shape)} (self cannot grow in place)")
        return self.copy_(out)
    method.__name__ = name
    return method


def _normal_values(self, mean=0.0, std=1.0):
    return _C.normal(mean, std, self.shape, dtype=self.dtype, device=self.device)


def _uniform_values(self, *args, **kwargs):
    bounds = dict(zip(("from", "to"), args))
    bounds.update(kwargs)
    extra = set(bounds) - {"from", "to"}
    if extra:
        raise TypeError(f"uniform_() got an unexpected keyword argument '{extra.pop()}'")
    lo, hi = bounds.get("from", 0.0), bounds.get("to", 1.0)
    if lo > hi:
        raise _C.KilnError(f"uniform_ expects to return a [from, to) range, but found from={lo} > to={hi}")
    return _C.uniform(lo, hi, self.shape, dtype=self.dtype, device=self.device)


def _exponential_values(self, lambd=1.0):
    if not lambd > 0:
        raise _C.KilnError(f"exponential_ expects lambda > 0.0, but found lambda={lambd}")
    u = _C.rand(*self.shape, dtype=_C.dtype.float64, device=self.device)
    return (-_C.log1p(-u) / lambd).to(self.dtype)


def _format(self, format_spec):
    """format(t, spec), f"{t:.4f}": a 0-dim tensor formats as its Python number, as torch's; others as
    object does (str(t) for an empty spec, TypeError otherwise)."""
    if self.dim() == 0 and self.device.type != "meta":
        return self.item().__format__(format_spec)
    return object.__format__(self, format_spec)


_PAIRS = {name: _named_pair(name) for name in
          ("max", "min", "sort", "topk", "kthvalue", "median", "mode", "cummax", "cummin")}

_EXPORTS = dict(_PAIRS, sum=_sum, mean=_mean, cumsum=_cumsum, nonzero=_nonzero, where=_where, split=_split,
                squeeze=_squeeze, flatten=_flatten, unflatten=_unflatten, movedim=_movedim, moveaxis=_movedim,
                diagonal=_diagonal, bmm=_bmm, baddbmm=_baddbmm, index_add=_index_add, index_fill=_index_fill,
                bincount=_bincount, multinomial=_multinomial, randperm=_randperm, randint=_randint, return_types=return_types)

for _name, _fn in _EXPORTS.items():  # the engine's documentation (from engine/ops.h) stays with the name
    _c_fn = getattr(_C, _name, None)
    if _c_fn is not None and _c_fn.__doc__ and _fn not in _PAIRS.values():
        _fn.__doc__ = f"{_fn.__doc__ or ''}\n\nThe engine's op underneath:\n{_c_fn.__doc__}"

_MORE_METHODS = dict(_PAIRS, sum=_sum, mean=_mean, cumsum=_cumsum, nonzero=_nonzero, split=_split,
                     squeeze=_squeeze, unflatten=_unflatten, movedim=_movedim, moveaxis=_movedim,
                     diagonal=_diagonal, bmm=_bmm, baddbmm=_baddbmm, index_add=_index_add, index_fill=_index_fill,
                     bincount=_bincount, multinomial=_multinomial)
for _name, _fn in _MORE_METHODS.items():
    setattr(Tensor, _name, _as_method(_fn))
Tensor.index_add_ = _inplace("index_add_", _index_add)
Tensor.index_fill_ = _inplace("index_fill_", _index_fill)
Tensor.lerp_ = _inplace("lerp_", _C.lerp)
Tensor.addcmul_ = _inplace("addcmul_", _C.addcmul)
Tensor.addcdiv_ = _inplace("addcdiv_", _C.addcdiv)
Tensor.normal_ = _inplace("normal_", _normal_values)
Tensor.uniform_ = _inplace("uniform_", _uniform_values)
Tensor.exponential_ = _inplace("exponential_", _exponential_values)
Tensor.__format__ = _format

# The bitwise ops as methods (x.bitwise_and(y), ...), as torch's; the operators and the in-place forms
# (& | ^ ~ << >>, &= ..., x.bitwise_and_(y)) are the engine's own (python/src/tensor.cpp).
for _name in ("bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not", "bitwise_left_shift", "bitwise_right_shift"):
    setattr(Tensor, _name, _as_method(getattr(_C, _name)))
