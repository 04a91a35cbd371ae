"""The Python side of kiln.Tensor: the copying constructor, grad-mode contexts, NumPy and DLPack
protocols, dtype and device shortcuts, and the ops of kiln attached as methods."""
import builtins
import functools
import inspect
import numbers

from . import _C
from ._C import Tensor


def tensor(data, dtype=None, device=None, requires_grad=False):
    """A new tensor holding a copy of `data`: a (nested) list of numbers, a number, a NumPy array
    or anything NumPy accepts, or a tensor. Python floats give float32 and ints int64 (as PyTorch);
    NumPy arrays keep their dtype."""
    t = data.detach().clone() if isinstance(data, Tensor) else _C._tensor_from(data)
    if dtype is not None or device is not None:
        t = t.to(dtype=dtype, device=device) if dtype is not None and device is not None else (
            t.to(dtype) if dtype is not None else t.to(device))
    if requires_grad:
        t.requires_grad_(True)
    return t


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
neg abs sign exp log sqrt rsqrt tanh sigmoid relu sin cos tan asin acos atan sinh cosh erf erfc erfinv
log1p expm1 log2 log10 exp2 reciprocal floor ceil round trunc frac isnan isinf isfinite logical_not gelu
add sub mul div floor_divide pow fmod remainder atan2 maximum minimum eq ne lt le gt ge logical_and logical_or matmul
clamp nan_to_num lerp addcmul addcdiv sum mean amax amin logsumexp any all prod count_nonzero var std norm
max min argmax argmin cumsum cumprod cummax cummin sort argsort topk kthvalue median mode split chunk
unbind index_select gather scatter scatter_add scatter_reduce take_along_dim nonzero masked_fill
masked_scatter index_put tril triu flip roll tile softmax log_softmax
""".split()


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
def _sub_(self, other, alpha=1):
    _C._check_inplace(self, "sub_", other)
    return self.add_(other, alpha=-alpha)


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
        return self.copy_(_C.clamp(self, min, max))
    clamp_.__name__ = name
    return clamp_


def _masked_fill_(self, mask, value):
    _C._check_inplace(self, "masked_fill_", value)
    return self.copy_(_C.masked_fill(self, mask, value))


Tensor.sub_ = _sub_
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


# ---- .data ----

def _get_data(self):
    """A detached alias (same memory, requires_grad False), as torch's .data."""
    return self.detach()


def _span(t):
    lo = hi = t.data_ptr()
    for n, s in zip(t.shape, t.stride()):
        if n > 1:
            (lo, hi) = (lo + (n - 1) * s * t.element_size(), hi) if s < 0 else (lo, hi + (n - 1) * s * t.element_size())
    return lo, hi + t.element_size()


def _set_data(self, value):
    # torch rebinds the tensor to value's memory; a Kiln tensor cannot be rebound without breaking the
    # handle an optimizer holds, so the values are copied in (same shape, dtype and device only).
    if not isinstance(value, Tensor):
        raise TypeError(f"data: expected a kiln.Tensor, got {type(value).__name__}")
    if (tuple(value.shape), value.dtype, value.device) != (tuple(self.shape), self.dtype, self.device):
        raise _C.KilnValueError(
            f"data: cannot assign a {list(value.shape)} {value.dtype.name} tensor on {value.device} to a "
            f"{list(self.shape)} {self.dtype.name} one on {self.device}: Kiln copies the values in place (torch "
            "rebinds the tensor), so shape, dtype and device must match; make a new Parameter (and optimizer) instead")
    value = value.detach()
    if value.numel() and self.numel():
        (a, b), (c, d) = _span(self), _span(value)
        if a < d and c < b:  # overlapping memory (p.data = p.data.t()): copy from a snapshot
            value = value.clone()
    with no_grad():
        self.detach().copy_(value)


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
