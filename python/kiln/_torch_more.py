"""More of torch's top-level functions and Tensor methods, written with Kiln's ops (so autograd differentiates
them as it does those): torch's aliases (absolute, arccos, divide, greater, concat, row_stack, fix, ...), the
in-place forms still missing (acos_, eq_, cumsum_, tril_, scatter_, index_put_, put_, t_, squeeze_, ...,
through kiln's in-place rule: refused on a tensor that requires grad outside kiln.no_grad(), naming the method,
a float result refused into an integer tensor), the top-level in-place functions (kiln.exp_(t), ...), the
random in-place fills (bernoulli_, random_, cauchy_, log_normal_, geometric_, from kiln's generator:
kiln.manual_seed governs them) and functions such as atleast_1d, hstack, diag, cross, isclose, histogram,
trapezoid, combinations, the *_scatter ops and the window functions."""
import builtins
import itertools
import math
import numbers
import sys
import warnings

import numpy as np

from . import _C
from ._C import Tensor
from ._tensor import _as_method, _inplace, return_types

_bool = builtins.bool
_float = builtins.float
_int = builtins.int
_range = builtins.range


def _k():
    """The kiln package, its names looked up at call time (other modules may add or replace them)."""
    return sys.modules[__package__]


def _tensor_arg(fn, arg, value):
    if not isinstance(value, Tensor):
        raise TypeError(f"{fn}(): argument '{arg}' must be a kiln.Tensor, not {type(value).__name__}")


def _floating(t):
    """t itself when floating, else t as float32 (torch's default dtype for integer inputs)."""
    return t if t.dtype.is_floating_point else t.to(_C.dtype.float32)


def _norm_dim(fn, dim, ndim):
    n = builtins.max(ndim, 1)
    if not -n <= dim < n:
        raise _C.KilnIndexError(f"{fn}(): Dimension out of range (expected to be in range of [{-n}, {n - 1}], "
                                f"but got {dim})")
    return dim % n


# ---------------------------------------------------------------- aliases

def _lazy(name):
    """A function that calls kiln.<name> when called (kiln.asinh and friends may come later)."""
    def fn(*args, **kwargs):
        target = getattr(_k(), name, None)
        if target is None:
            raise _C.KilnError(f"{name} is not available in this build of kiln")
        return target(*args, **kwargs)
    return fn


def _lazy_method(name):
    def method(self, *args, **kwargs):
        target = getattr(Tensor, name, None)
        if target is None:
            raise _C.KilnError(f"Tensor.{name} is not available in this build of kiln")
        return target(self, *args, **kwargs)
    return method


# alias -> kiln name; each becomes kiln.<alias>, Tensor.<alias> and Tensor.<alias>_
_ALIASES = {
    "absolute": "abs", "arccos": "acos", "arcsin": "asin", "arctan": "atan", "arctan2": "atan2",
    "arcsinh": "asinh", "arccosh": "acosh", "arctanh": "atanh",
    "divide": "div", "multiply": "mul", "subtract": "sub", "negative": "neg",
    "greater": "gt", "greater_equal": "ge", "less": "lt", "less_equal": "le", "not_equal": "ne", "fix": "trunc",
}


def positive(input):
    """torch.positive: input itself (refused for bool tensors, as torch)."""
    _tensor_arg("positive", "input", input)
    if input.dtype == _C.dtype.bool:
        raise _C.KilnError("positive(): the positive operation, on a bool tensor, is not supported")
    return input


def concat(tensors, dim=0):
    """torch.concat: torch.cat."""
    return _C.cat(list(tensors), dim)


def concatenate(tensors, axis=0):
    """torch.concatenate: torch.cat with numpy's `axis`."""
    return _C.cat(list(tensors), axis)


# ---------------------------------------------------------------- shapes and stacking

def _tensors(fn, tensors):
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
        tensors = tuple(tensors[0])
    for i, t in enumerate(tensors):
        if not isinstance(t, Tensor):
            raise TypeError(f"{fn}(): expected kiln.Tensors, but argument {i} is {type(t).__name__}")
    return tensors


def _atleast(fn, n, shape_of):
    def f(*tensors):
        single = len(tensors) == 1 and isinstance(tensors[0], Tensor)
        ts = _tensors(fn, tensors)
        out = tuple(t if t.dim() >= n else t.reshape(shape_of(tuple(t.shape))) for t in ts)
        return out[0] if single else out
    f.__name__ = fn
    f.__doc__ = f"torch.{fn}: each tensor viewed with at least {n} dimensions (one tensor in, one out)."
    return f


atleast_1d = _atleast("atleast_1d", 1, lambda s: (1,))
atleast_2d = _atleast("atleast_2d", 2, lambda s: (1,) * (2 - len(s)) + s)
atleast_3d = _atleast("atleast_3d", 3, lambda s: {0: (1, 1, 1), 1: (1,) + s + (1,), 2: s + (1,)}[len(s)])


def _stack_input(fn, tensors):
    if isinstance(tensors, Tensor) or not isinstance(tensors, (list, tuple)):
        raise TypeError(f"{fn}(): argument 'tensors' must be a tuple or list of kiln.Tensors, "
                        f"not {type(tensors).__name__}")
    if not tensors:
        raise _C.KilnValueError(f"{fn}(): expects a non-empty TensorList")
    return _tensors(fn, tuple(tensors))


def hstack(tensors):
    """torch.hstack: concatenated along dim 0 when all are 1-D (after atleast_1d), else along dim 1."""
    ts = atleast_1d(*_stack_input("hstack", tensors))
    ts = ts if isinstance(ts, tuple) else (ts,)
    return _C.cat(list(ts), 0 if ts[0].dim() == 1 else 1)


def vstack(tensors):
    """torch.vstack (row_stack): atleast_2d of each, concatenated along dim 0."""
    ts = atleast_2d(*_stack_input("vstack", tensors))
    return _C.cat(list(ts if isinstance(ts, tuple) else (ts,)), 0)


row_stack = vstack


def dstack(tensors):
    """torch.dstack: atleast_3d of each, concatenated along dim 2."""
    ts = atleast_3d(*_stack_input("dstack", tensors))
    return _C.cat(list(ts if isinstance(ts, tuple) else (ts,)), 2)


def column_stack(tensors):
    """torch.column_stack: 0-D and 1-D tensors as columns (n, 1), concatenated along dim 1."""
    ts = _stack_input("column_stack", tensors)
    return _C.cat([t.reshape(t.numel(), 1) if t.dim() <= 1 else t for t in ts], 1)


def broadcast_to(input, size):
    """torch.broadcast_to: input expanded to size (-1 keeps a dimension)."""
    _tensor_arg("broadcast_to", "input", input)
    return input.expand(*size)


def broadcast_tensors(*tensors):
    """torch.broadcast_tensors: the tensors expanded to their common broadcast shape."""
    ts = _tensors("broadcast_tensors", tensors)
    shape = _C.broadcast_shapes(*[tuple(t.shape) for t in ts])
    return tuple(t.expand(*shape) for t in ts)


def fliplr(input):
    """torch.fliplr: input reversed along dim 1 (at least 2-D)."""
    _tensor_arg("fliplr", "input", input)
    if input.dim() < 2:
        raise _C.KilnError(f"fliplr(): input must be >= 2-d, got a {input.dim()}-d tensor")
    return _C.flip(input, [1])


def flipud(input):
    """torch.flipud: input reversed along dim 0 (at least 1-D)."""
    _tensor_arg("flipud", "input", input)
    if input.dim() < 1:
        raise _C.KilnError("flipud(): input must be >= 1-d, got a 0-d tensor")
    return _C.flip(input, [0])


def as_strided(input, size, stride, storage_offset=None):
    """torch.as_strided: a view of input's memory with the given size, stride and storage offset (by
    default input's own, as torch's: as_strided(A[1], ...) starts where A[1] does)."""
    _tensor_arg("as_strided", "input", input)
    return input.as_strided(size, stride, input.storage_offset() if storage_offset is None else storage_offset)


def sum_to_size(self, *size):
    """Tensor.sum_to_size: self summed over its broadcast dimensions down to size (which must broadcast
    to self's shape)."""
    if len(size) == 1 and isinstance(size[0], (list, tuple)):
        size = tuple(size[0])
    shape = tuple(self.shape)
    lead = len(shape) - len(size)
    if lead < 0 or any(s != 1 and s != shape[lead + i] for i, s in enumerate(size)):
        raise _C.KilnError(f"sum_to_size: size {list(size)} is not expandable to size {list(shape)}")
    out = self
    if lead:
        out = out.sum(list(_range(lead)))
    dims = [i for i, s in enumerate(size) if s == 1 and out.shape[i] != 1]
    if dims:
        out = out.sum(dims, keepdim=True)
    return out


# ---------------------------------------------------------------- scatter with a scalar

def _scalar_of(dt, value):
    """A Python number as a value of dtype dt, as torch casts a scalar (a float into an integer dtype: truncated)."""
    if dt == _C.dtype.bool:
        return _bool(value)
    if dt.is_floating_point:
        return _float(value)
    return _int(value)


def scatter(input, dim, index, src=None, *, value=None, reduce=None):
    """torch.scatter: input with src's values (a tensor, or a number for every indexed place: torch's
    scatter(input, dim, index, value), `x.scatter_(1, idx, 1.0)` the one-hot idiom) written at index along dim;
    reduce= 'add' or 'multiply' combines instead of replacing."""
    _tensor_arg("scatter", "input", input)
    _tensor_arg("scatter", "index", index)
    if src is not None and value is not None:
        raise TypeError("scatter(): give src (a tensor or a number) or value (a number), not both")
    if src is None:
        src = value
    if src is None:
        raise TypeError("scatter(): missing the values to write: src (a tensor) or value (a number)")
    if not isinstance(src, Tensor):
        if not isinstance(src, numbers.Number) or isinstance(src, complex):
            raise TypeError(f"scatter(): argument 'src' must be a kiln.Tensor or a real number, not "
                            f"{type(src).__name__}")
        src = _C.full(list(index.shape), _scalar_of(input.dtype, src), dtype=input.dtype, device=input.device)
    return _C.scatter(input, dim, index, src, reduce=reduce)


def scatter_add(input, dim, index, src):
    """torch.scatter_add: input with src's values added at index along dim; src must be a tensor (torch refuses
    a number here)."""
    _tensor_arg("scatter_add", "input", input)
    if not isinstance(src, Tensor):
        raise TypeError(f"scatter_add(): argument 'src' must be a kiln.Tensor, not {type(src).__name__} (torch's "
                        f"scatter_add takes no scalar: use scatter(..., value, reduce='add'))")
    return _C.scatter_add(input, dim, index, src)


# ---------------------------------------------------------------- products

def mm(input, mat2):
    """torch.mm: the product of two 2-D matrices of one dtype."""
    for arg, t in (("input", input), ("mat2", mat2)):
        _tensor_arg("mm", arg, t)
        if t.dim() != 2:
            raise _C.KilnError(f"mm(): {arg} must be a matrix, got a {t.dim()}-D tensor")
    if input.shape[1] != mat2.shape[0]:
        raise _C.KilnError(f"mm(): mat1 and mat2 shapes cannot be multiplied ({input.shape[0]}x{input.shape[1]} "
                           f"and {mat2.shape[0]}x{mat2.shape[1]})")
    if input.dtype != mat2.dtype:
        raise _C.KilnError(f"mm(): expected input and mat2 to have the same dtype, but got {input.dtype.name} "
                           f"!= {mat2.dtype.name}")
    return _C.matmul(input, mat2)


def mv(input, vec):
    """torch.mv: a 2-D matrix times a 1-D vector."""
    _tensor_arg("mv", "input", input)
    _tensor_arg("mv", "vec", vec)
    if input.dim() != 2 or vec.dim() != 1:
        raise _C.KilnError(f"mv(): vector + matrix @ vector expected, got input {input.dim()}-D and vec "
                           f"{vec.dim()}-D")
    if input.shape[1] != vec.shape[0]:
        raise _C.KilnError(f"mv(): size mismatch, got input ({input.shape[0]}x{input.shape[1]}), "
                           f"vec ({vec.shape[0]})")
    if input.dtype != vec.dtype:
        raise _C.KilnError(f"mv(): expected input and vec to have the same dtype, but got {input.dtype.name} "
                           f"!= {vec.dtype.name}")
    return _C.matmul(input, vec)


def chain_matmul(*matrices):
    """torch.chain_matmul: the product of 2-D matrices, left to right (one matrix: a copy of it)."""
    ms = _tensors("chain_matmul", matrices)
    if not ms:
        raise _C.KilnError("chain_matmul(): Expected one or more matrices")
    for i, m in enumerate(ms):
        if m.dim() != 2:
            raise _C.KilnError(f"chain_matmul(): Tensor at position {i} must be 2-D, got {m.dim()}-D")
    out = ms[0] if len(ms) > 1 else ms[0].clone()
    for m in ms[1:]:
        out = mm(out, m)
    return out


def cross(input, other, dim=None):
    """torch.cross: the cross product of 3-vectors along dim (the operands broadcast); without dim, the first
    dimension of size 3 of the broadcast shape."""
    _tensor_arg("cross", "input", input)
    _tensor_arg("cross", "other", other)
    if dim is None:
        shape = _C.broadcast_shapes(tuple(input.shape), tuple(other.shape))
        dims = [i for i, s in enumerate(shape) if s == 3]
        if not dims:
            raise _C.KilnError(f"cross(): no dimension of size 3 in input {list(input.shape)} and other "
                               f"{list(other.shape)}")
        dim = dims[0]
    return _k().linalg.cross(input, other, dim=dim)


def diag(input, diagonal=0):
    """torch.diag: a 1-D input as the diagonal of a square matrix (offset by `diagonal`), a 2-D input's
    diagonal as a 1-D tensor."""
    _tensor_arg("diag", "input", input)
    if input.dim() == 1:
        return _k().diag_embed(input, diagonal)
    if input.dim() == 2:
        return _k().diagonal(input, diagonal)
    raise _C.KilnError(f"diag(): Supports 1D or 2D tensors. Got {input.dim()}D")


def diagflat(input, offset=0):
    """torch.diagflat: input flattened, as the diagonal of a square matrix."""
    _tensor_arg("diagflat", "input", input)
    return _k().diag_embed(input.reshape(-1), offset)


# ---------------------------------------------------------------- elementwise

def _both(fn, input, other):
    if not isinstance(input, Tensor) and not isinstance(other, Tensor):
        raise TypeError(f"{fn}(): argument 'input' must be a kiln.Tensor, not {type(input).__name__}")
    if not isinstance(input, Tensor):
        input = _C.full([], input, dtype=_C.result_type(other, input), device=other.device)
    if not isinstance(other, Tensor):
        other = _C.full([], other, dtype=_C.result_type(input, other), device=input.device)
    return input, other


def _fminmax(name, both_ways):
    def f(input, other):
        _tensor_arg(name, "input", input)
        _tensor_arg(name, "other", other)
        dt = _C.result_type(input, other)
        a, b = input.to(dt), other.to(dt)
        out = both_ways(a, b)  # ties share the gradient, as torch's
        if not dt.is_floating_point:
            return out
        return _C.where(_C.isnan(b), a, _C.where(_C.isnan(a), b, out))
    f.__name__ = name
    return f


fmax = _fminmax("fmax", _C.maximum)
fmax.__doc__ = "torch.fmax: the elementwise maximum, a NaN giving the other operand (NaN only where both are)."
fmin = _fminmax("fmin", _C.minimum)
fmin.__doc__ = "torch.fmin: the elementwise minimum, a NaN giving the other operand (NaN only where both are)."


def float_power(input, exponent):
    """torch.float_power: input ** exponent computed in float64."""
    if isinstance(input, Tensor):
        input = input.to(_C.dtype.float64)
    if isinstance(exponent, Tensor):
        exponent = exponent.to(_C.dtype.float64)
    if not isinstance(input, Tensor):
        if not isinstance(exponent, Tensor):
            raise TypeError(f"float_power(): argument 'input' must be a kiln.Tensor, not {type(input).__name__}")
        input = _C.full([], input, dtype=_C.dtype.float64, device=exponent.device)
    return _C.pow(input, exponent)


def _float_power_(self, exponent):
    if self.dtype != _C.dtype.float64:
        raise _C.KilnError(f"float_power_(): the base given to float_power_ has dtype {self.dtype.name} but the "
                           "operation's result requires dtype float64")
    return _inplace("float_power_", float_power)(self, exponent)


def deg2rad(input):
    """torch.deg2rad: degrees to radians (integers give float32)."""
    _tensor_arg("deg2rad", "input", input)
    return _floating(input) * (math.pi / 180.0)


def rad2deg(input):
    """torch.rad2deg: radians to degrees (integers give float32)."""
    _tensor_arg("rad2deg", "input", input)
    return _floating(input) * (180.0 / math.pi)


def sgn(input):
    """torch.sgn: the sign (for real tensors, torch.sign)."""
    _tensor_arg("sgn", "input", input)
    return _C.sign(input)


def sinc(input):
    """torch.sinc: sin(pi x) / (pi x), 1 at 0 (gradient 0 there); integers give float32; float16 and
    bfloat16 computed in float32 and rounded back, as torch (pi x in float16 is off by far more than sin's
    period allows: sinc(4) would be -3e-4, not 0)."""
    _tensor_arg("sinc", "input", input)
    x = _floating(input)
    low = x.dtype in (_C.dtype.float16, _C.dtype.bfloat16)
    if low:
        x = x.to(_C.dtype.float32)
    zero = x == 0
    safe = _C.where(zero, _C.ones_like(x), x) * math.pi
    out = _C.where(zero, _C.ones_like(x), _C.sin(safe) / safe)
    return out.to(input.dtype) if low else out


def logaddexp2(input, other):
    """torch.logaddexp2: log2(2**input + 2**other) without overflow."""
    _tensor_arg("logaddexp2", "input", input)
    _tensor_arg("logaddexp2", "other", other)
    ln2 = math.log(2.0)
    return _k().logaddexp(input * ln2, other * ln2) / ln2


def logical_xor(input, other):
    """torch.logical_xor: whether exactly one of input and other is nonzero (a bool tensor)."""
    input, other = _both("logical_xor", input, other)
    return (input != 0) != (other != 0)


def isclose(input, other, rtol=1e-05, atol=1e-08, equal_nan=False):
    """torch.isclose: |input - other| <= atol + rtol * |other| elementwise (equal values, infinities included,
    are close; NaN only with equal_nan)."""
    _tensor_arg("isclose", "input", input)
    _tensor_arg("isclose", "other", other)
    if input.dtype != other.dtype:
        raise _C.KilnError(f"isclose(): Expected input and other to have the same dtype, but got "
                           f"{input.dtype.name} != {other.dtype.name}")
    if rtol < 0 or atol < 0:
        raise _C.KilnValueError(f"isclose(): rtol and atol must be non-negative, got rtol={rtol}, atol={atol}")
    if input.dtype == _C.dtype.bool:
        return input == other
    a = input.detach()
    b = other.detach()
    if not a.dtype.is_floating_point:
        a, b = a.to(_C.dtype.float64), b.to(_C.dtype.float64)
    equal = a == b
    finite = _C.isfinite(a) & _C.isfinite(b)
    close = equal | (finite & (_C.abs(a - b) <= atol + rtol * _C.abs(b)))
    if equal_nan:
        close = close | (_C.isnan(a) & _C.isnan(b))
    return close


def allclose(input, other, rtol=1e-05, atol=1e-08, equal_nan=False):
    """torch.allclose: whether isclose holds everywhere (the operands broadcast), a Python bool."""
    return _bool(isclose(input, other, rtol, atol, equal_nan).all())


def equal(input, other):
    """torch.equal: whether the two tensors have the same shape and elements (a Python bool)."""
    _tensor_arg("equal", "input", input)
    _tensor_arg("equal", "other", other)
    if tuple(input.shape) != tuple(other.shape):
        return False
    return _bool((input.detach() == other.detach()).all())


def isposinf(input):
    """torch.isposinf: where input is +inf (all False for integers)."""
    _tensor_arg("isposinf", "input", input)
    return _C.isinf(input) & (input > 0)


def isneginf(input):
    """torch.isneginf: where input is -inf (all False for integers)."""
    _tensor_arg("isneginf", "input", input)
    return _C.isinf(input) & (input < 0)


def isreal(input):
    """torch.isreal: True everywhere for Kiln's real dtypes."""
    _tensor_arg("isreal", "input", input)
    return _C.ones(list(input.shape), dtype=_C.dtype.bool, device=input.device)


def rsub(input, other, alpha=1):
    """torch.rsub: other - alpha * input."""
    _tensor_arg("rsub", "input", input)
    return _k().sub(other, input, alpha=alpha)


def dist(input, other, p=2):
    """torch.dist: the p-norm of input - other (broadcast), a 0-D tensor."""
    _tensor_arg("dist", "input", input)
    _tensor_arg("dist", "other", other)
    return _k().linalg.vector_norm(input - other, p)


def msort(input):
    """torch.msort: input sorted along dim 0."""
    _tensor_arg("msort", "input", input)
    return _k().sort(input, 0).values


# ---------------------------------------------------------------- predicates and small queries

def is_tensor(obj):
    """torch.is_tensor: whether obj is a kiln.Tensor."""
    return isinstance(obj, Tensor)


def is_floating_point(input):
    """torch.is_floating_point: whether input's dtype is a floating one."""
    _tensor_arg("is_floating_point", "input", input)
    return input.dtype.is_floating_point


def is_signed(input):
    """torch.is_signed: whether input's dtype is signed (all but uint8 and bool)."""
    _tensor_arg("is_signed", "input", input)
    return input.dtype not in (_C.dtype.uint8, _C.dtype.bool)


def is_nonzero(input):
    """torch.is_nonzero: whether a one-element tensor is nonzero (an error for other sizes)."""
    _tensor_arg("is_nonzero", "input", input)
    n = input.numel()
    if n == 0:
        raise _C.KilnError("is_nonzero(): Boolean value of Tensor with no values is ambiguous")
    if n > 1:
        raise _C.KilnError(f"is_nonzero(): Boolean value of Tensor with more than one value is ambiguous "
                           f"(shape {list(input.shape)})")
    return _bool(input.reshape(-1)[0].item() != 0)


def is_same_size(input, other):
    """torch.is_same_size: whether the two tensors have the same shape."""
    _tensor_arg("is_same_size", "input", input)
    _tensor_arg("is_same_size", "other", other)
    return tuple(input.shape) == tuple(other.shape)


def numel(input):
    """torch.numel: the number of elements of input."""
    _tensor_arg("numel", "input", input)
    return input.numel()


def get_default_dtype():
    """torch.get_default_dtype: kiln.float32, the dtype Kiln's factories give floating data (Kiln has no
    set_default_dtype)."""
    return _C.dtype.float32


_CATEGORY = {_C.dtype.bool: 0, _C.dtype.uint8: 1, _C.dtype.int8: 1, _C.dtype.int16: 1, _C.dtype.int32: 1,
             _C.dtype.int64: 1, _C.dtype.float16: 2, _C.dtype.bfloat16: 2, _C.dtype.float32: 2,
             _C.dtype.float64: 2}


def can_cast(from_, to):
    """torch.can_cast: whether an op may write a from_ result into a to tensor (no floating into integer,
    nor anything but bool into bool)."""
    for arg, d in (("from_", from_), ("to", to)):
        if not isinstance(d, _C.dtype):
            raise TypeError(f"can_cast(): argument '{arg}' must be a kiln.dtype, not {type(d).__name__}")
    return _CATEGORY[from_] <= _CATEGORY[to]


class finfo:
    """torch.finfo: the limits of a floating dtype (float32 with no argument): bits, eps, max, min, tiny
    (smallest_normal) and resolution, dtype its name."""

    def __init__(self, type=None):  # noqa: A002  (torch's name)
        type = _C.dtype.float32 if type is None else type
        if not isinstance(type, _C.dtype) or not type.is_floating_point:
            raise TypeError(f"kiln.finfo() requires a floating point dtype, got {type!r}; use kiln.iinfo for "
                            "integer ones")
        if type == _C.dtype.bfloat16:  # 8 exponent bits as float32, 8 significand bits
            self.bits, self.eps, self.max, self.tiny, self.resolution = (
                16, 2.0 ** -7, _float(np.finfo(np.float32).max) * (1 - 2.0 ** -8) / (1 - 2.0 ** -24), 2.0 ** -126,
                0.01)
        else:
            f = np.finfo(np.dtype(type.name))
            self.bits, self.eps, self.max, self.tiny, self.resolution = (
                f.bits, _float(f.eps), _float(f.max), _float(f.tiny), 10.0 ** -f.precision)
        self.min = -self.max
        self.smallest_normal = self.tiny
        self.dtype = type.name

    def __repr__(self):
        return (f"finfo(resolution={self.resolution:g}, min={self.min:g}, max={self.max:g}, eps={self.eps:g}, "
                f"smallest_normal={self.smallest_normal:g}, tiny={self.tiny:g}, dtype={self.dtype})")


class iinfo:
    """torch.iinfo: the limits of an integer dtype: bits, min, max, dtype its name (not bool, as torch)."""

    def __init__(self, type):  # noqa: A002
        if not isinstance(type, _C.dtype) or type.is_floating_point or type == _C.dtype.bool:
            raise TypeError(f"kiln.iinfo() requires an integer dtype (not bool), got {type!r}; use kiln.finfo "
                            "for floating ones")
        i = np.iinfo(np.dtype(type.name))
        self.bits, self.min, self.max, self.dtype = i.bits, _int(i.min), _int(i.max), type.name

    def __repr__(self):
        return f"iinfo(min={self.min:g}, max={self.max:g}, dtype={self.dtype})"


# ---------------------------------------------------------------- scatters into slices

def _scatter_along(fn, input, src, dim, positions):
    """input with src written at `positions` (a list of indices) along dim: differentiable in both."""
    idx = _k().tensor(positions, dtype=_C.dtype.int64, device=input.device) if positions else \
        _C.zeros([0], dtype=_C.dtype.int64, device=input.device)
    shape = [1] * input.dim()
    shape[dim] = len(positions)
    index = idx.reshape(shape).expand(*src.shape)
    return _C.scatter(input, dim, index, src)


def _check_src(fn, input, src, expected):
    _tensor_arg(fn, "input", input)
    _tensor_arg(fn, "src", src)
    if tuple(src.shape) != tuple(expected):
        raise _C.KilnError(f"{fn}(): expected src to have a size equal to the slice of self. src size = "
                           f"{list(src.shape)}, slice size = {list(expected)}")
    if src.dtype != input.dtype:
        raise _C.KilnError(f"{fn}(): expected src and input to have the same dtype, got {src.dtype.name} and "
                           f"{input.dtype.name}")


def select_scatter(input, src, dim, index):
    """torch.select_scatter: input with src written into input.select(dim, index)."""
    _tensor_arg("select_scatter", "input", input)
    dim = _norm_dim("select_scatter", dim, input.dim())
    n = input.shape[dim]
    if not -n <= index < n:
        raise _C.KilnIndexError(f"select_scatter(): index {index} out of range for tensor of size "
                                f"{list(input.shape)} at dimension {dim}")
    expected = tuple(s for i, s in enumerate(input.shape) if i != dim)
    _check_src("select_scatter", input, src, expected)
    return _scatter_along("select_scatter", input, src.unsqueeze(dim), dim, [index % n])


def slice_scatter(input, src, dim=0, start=None, end=None, step=1):
    """torch.slice_scatter: input with src written into input's slice start:end:step along dim."""
    _tensor_arg("slice_scatter", "input", input)
    dim = _norm_dim("slice_scatter", dim, input.dim())
    if step <= 0:
        raise _C.KilnValueError(f"slice_scatter(): step must be positive, got {step}")
    positions = list(_range(input.shape[dim]))[slice(start, end, step)]
    expected = list(input.shape)
    expected[dim] = len(positions)
    _check_src("slice_scatter", input, src, expected)
    return _scatter_along("slice_scatter", input, src, dim, positions)


def diagonal_scatter(input, src, offset=0, dim1=0, dim2=1):
    """torch.diagonal_scatter: input with src written into input.diagonal(offset, dim1, dim2)."""
    _tensor_arg("diagonal_scatter", "input", input)
    d1 = _norm_dim("diagonal_scatter", dim1, input.dim())
    d2 = _norm_dim("diagonal_scatter", dim2, input.dim())
    if d1 == d2:
        raise _C.KilnError(f"diagonal_scatter(): diagonal dimensions cannot be identical {dim1}, {dim2}")
    expected = tuple(_k().diagonal(input.detach(), offset, d1, d2).shape)
    _check_src("diagonal_scatter", input, src, expected)
    moved = _k().movedim(input, (d1, d2), (-2, -1))
    rows, cols = moved.shape[-2], moved.shape[-1]
    length = expected[-1]
    r0, c0 = (0, offset) if offset >= 0 else (-offset, 0)
    flat_pos = [(r0 + k) * cols + (c0 + k) for k in _range(length)]
    flat = moved.reshape(*moved.shape[:-2], rows * cols)
    out = _scatter_along("diagonal_scatter", flat, src, flat.dim() - 1, flat_pos)
    return _k().movedim(out.reshape(*moved.shape), (-2, -1), (d1, d2))


# ---------------------------------------------------------------- integration, combinations, indices

def _trapezoid_args(fn, y, x, dx, dim):
    _tensor_arg(fn, "y", y)
    if x is not None and dx is not None:
        raise TypeError(f"{fn}(): pass x or dx, not both")
    dim = _norm_dim(fn, dim, y.dim())
    n = y.shape[dim]
    lo, hi = y.narrow(dim, 0, builtins.max(n - 1, 0)), y.narrow(dim, builtins.min(1, n), builtins.max(n - 1, 0))
    if isinstance(x, Tensor):
        if x.dim() == 1:
            if x.shape[0] != n:
                raise _C.KilnError(f"{fn}(): There must be one `x` value for each sample point (x has "
                                   f"{x.shape[0]}, y has {n} along dim {dim})")
            d = _k().diff(x)
            shape = [1] * y.dim()
            shape[dim] = builtins.max(n - 1, 0)
            d = d.reshape(shape)
        else:
            d = _k().diff(x, dim=dim - y.dim() if x.dim() < y.dim() else dim)
    else:
        d = dx if dx is not None else (x if x is not None else 1)
    return dim, lo, hi, d


def trapezoid(y, x=None, *, dx=None, dim=-1):
    """torch.trapezoid (trapz): the trapezoidal rule along dim, with sample points x (a tensor) or a
    constant spacing (x or dx a number, 1 by default)."""
    dim, lo, hi, d = _trapezoid_args("trapezoid", y, x, dx, dim)
    out = ((lo + hi) * d).sum(dim) / 2
    return out if out.dtype.is_floating_point else out.to(_C.dtype.float32)


def trapz(y, x=None, *, dx=None, dim=-1):
    """torch.trapz: torch.trapezoid."""
    return trapezoid(y, x, dx=dx, dim=dim)


def cumulative_trapezoid(y, x=None, *, dx=None, dim=-1):
    """torch.cumulative_trapezoid: the running trapezoidal rule along dim (one element fewer there)."""
    dim, lo, hi, d = _trapezoid_args("cumulative_trapezoid", y, x, dx, dim)
    out = _k().cumsum((lo + hi) * d / 2, dim)
    return out if out.dtype.is_floating_point else out.to(_C.dtype.float32)


def gradient(input, *, spacing=1, dim=None, edge_order=1):
    """torch.gradient: the derivative estimated by central differences in the interior and one-sided ones
    (first or second order, edge_order) at the ends, along each of dim (all dims by default): a tuple of
    tensors. spacing is one number for every dim, one number per dim, or one 1-D coordinate tensor per dim
    (unevenly spaced samples)."""
    _tensor_arg("gradient", "input", input)
    if edge_order not in (1, 2):
        raise _C.KilnValueError(f"gradient(): only edge_order 1 and 2 are supported, got {edge_order}")
    dims = list(_range(input.dim())) if dim is None else [dim] if isinstance(dim, numbers.Integral) else list(dim)
    dims = [_norm_dim("gradient", d, input.dim()) for d in dims]
    for i, d in enumerate(dims):
        if d in dims[:i]:
            raise _C.KilnError(f"gradient(): dim {d} appears multiple times in the list of dims")
    if isinstance(spacing, (list, tuple)):
        if len(spacing) != len(dims):
            raise _C.KilnValueError(f"gradient(): expected spacing to be unspecified, a scalar or a list of length "
                                    f"{len(dims)} (one per dim), but got a list of length {len(spacing)}")
        spacings = list(spacing)
    else:
        spacings = [spacing] * len(dims)
    f = _floating(input)
    out = []
    for d, h in zip(dims, spacings):
        n = f.shape[d]
        if n < edge_order + 1:
            raise _C.KilnValueError(f"gradient(): expected each dimension size to be at least edge_order+1, got "
                                    f"size {n} in dim {d}")

        def part(start, length=None):
            return f.narrow(d, start if start >= 0 else n + start, 1 if length is None else length)
        if isinstance(h, Tensor):
            if h.dim() != 1 or h.shape[0] != n:
                raise _C.KilnValueError(f"gradient(): the coordinates for dim {d} must be a 1-D tensor of "
                                        f"{n} elements, got shape {list(h.shape)}")
            shape = [1] * f.dim()
            # the result's dtype is input's and the coordinates' promoted, as torch's (float32 input with
            # float64 coordinates gives float64; integer coordinates count as float32); the coordinates'
            # differences are taken in their own dtype, as torch's
            xc = h if h.dtype.is_floating_point else h.to(_C.dtype.float32)
            target = _C.promote_types(input.dtype, xc.dtype)
            fd = f.to(target)

            def part(start, length=None, fd=fd):
                return fd.narrow(d, start if start >= 0 else n + start, 1 if length is None else length)

            def along(t):
                shape[d] = t.shape[0]
                return t.reshape(shape)
            dx = (xc[1:] - xc[:-1]).to(target)
            hl, hr = along(dx[:-1]), along(dx[1:])
            inner = (-hr / (hl * (hl + hr)) * part(0, n - 2) + (hr - hl) / (hl * hr) * part(1, n - 2)
                     + hl / (hr * (hl + hr)) * part(2, n - 2))
            if edge_order == 1:
                first = (part(1) - part(0)) / along(dx[:1])
                last = (part(-1) - part(-2)) / along(dx[-1:])
            else:
                a1, a2 = along(dx[:1]), along(dx[1:2])
                first = (-(2 * a1 + a2) / (a1 * (a1 + a2)) * part(0) + (a1 + a2) / (a1 * a2) * part(1)
                         - a1 / (a2 * (a1 + a2)) * part(2))
                b1, b2 = along(dx[-2:-1]), along(dx[-1:])
                last = (b2 / (b1 * (b1 + b2)) * part(-3) - (b1 + b2) / (b1 * b2) * part(-2)
                        + (2 * b2 + b1) / (b2 * (b1 + b2)) * part(-1))
        else:
            inner = (part(2, n - 2) - part(0, n - 2)) / (2 * h)
            if edge_order == 1:
                first, last = (part(1) - part(0)) / h, (part(-1) - part(-2)) / h
            else:
                first = (-1.5 * part(0) + 2 * part(1) - 0.5 * part(2)) / h
                last = (0.5 * part(-3) - 2 * part(-2) + 1.5 * part(-1)) / h
        out.append(_C.cat([first, inner, last], d))
    return tuple(out)


def combinations(input, r=2, with_replacement=False):
    """torch.combinations: the length-r combinations of a 1-D tensor's elements, one per row."""
    _tensor_arg("combinations", "input", input)
    if input.dim() != 1:
        raise _C.KilnError(f"combinations(): Expect a 1D vector, but got shape {list(input.shape)}")
    if r < 0:
        raise _C.KilnValueError(f"combinations(): Expect a non-negative number, but got {r}")
    if r == 0:
        return _C.zeros([0], dtype=input.dtype, device=input.device)
    make = itertools.combinations_with_replacement if with_replacement else itertools.combinations
    rows = list(make(_range(input.shape[0]), r))
    if not rows:
        return _C.zeros([0, r], dtype=input.dtype, device=input.device)
    idx = _k().tensor([i for row in rows for i in row], dtype=_C.dtype.int64, device=input.device)
    return input.index_select(0, idx).reshape(len(rows), r)


def unravel_index(indices, shape):
    """torch.unravel_index: the coordinates in `shape` of flat indices, a tuple of int64 tensors."""
    if isinstance(indices, numbers.Integral) and not isinstance(indices, _bool):
        indices = _k().tensor(_int(indices), dtype=_C.dtype.int64)
    _tensor_arg("unravel_index", "indices", indices)
    if indices.dtype.is_floating_point or indices.dtype == _C.dtype.bool:
        raise TypeError(f"unravel_index(): expected 'indices' to be an integer tensor, but got "
                        f"{indices.dtype.name}")
    shape = (shape,) if isinstance(shape, numbers.Integral) else tuple(shape)
    if any(s < 0 for s in shape):
        raise _C.KilnValueError(f"unravel_index(): 'shape' cannot have negative values, but got {shape}")
    total = math.prod(shape)
    idx = indices.to(_C.dtype.int64)
    if idx.numel() and (_bool((idx >= total).any()) or _bool((idx < -total).any())):
        raise _C.KilnIndexError(f"unravel_index(): 'indices' must be in range [{-total}, {total - 1}] for "
                                f"shape {shape}")
    idx = _C.where(idx < 0, idx + total, idx)
    out = []
    for s in reversed(shape):
        out.append(_k().remainder(idx, s))
        idx = _k().floor_divide(idx, s)
    return tuple(reversed(out))


def range(start=0, end=None, step=1, *, dtype=None, device=None, requires_grad=False):  # noqa: A001
    """torch.range (deprecated in torch; prefer arange): start to end inclusive in steps, float32 unless
    dtype says otherwise."""
    if end is None:
        start, end = 0, start
    if step == 0:
        raise _C.KilnValueError("range(): step must be nonzero")
    if (end - start) * step < 0:
        raise _C.KilnValueError(f"range(): upper bound and larger bound inconsistent with step sign "
                                f"(start={start}, end={end}, step={step})")
    n = _int(math.floor((end - start) / step)) + 1
    dt = dtype or _C.dtype.float32
    out = (_C.arange(0, n, dtype=_C.dtype.float64, device=device) * step + start).to(dt)
    if requires_grad:
        out.requires_grad_(True)
    return out


# ---------------------------------------------------------------- histogram

_histogram_type = __import__("collections").namedtuple("histogram", ["hist", "bin_edges"])
_histogram_type.__module__ = "kiln.return_types"
return_types.histogram = _histogram_type


def histogram(input, bins=100, *, range=None, weight=None, density=False):  # noqa: A002
    """torch.histogram: (hist, bin_edges) of a floating tensor: `bins` equal bins over range (input's min
    and max by default) or the given edges (a 1-D increasing tensor); weight weighs each element, density
    normalizes to a probability density. Computed on the host (no gradient, as torch), the edges and bins in
    the input's dtype as torch's (float16 and bfloat16 in float32)."""
    _tensor_arg("histogram", "input", input)
    if not input.dtype.is_floating_point:
        raise _C.KilnError(f"histogram(): input must be a floating tensor, got {input.dtype.name}")
    data = input.detach().to(_C.dtype.float64).cpu().numpy().reshape(-1)
    # the input's dtype for the edges and the bins (float16 and bfloat16 in float32)
    work = np.float64 if input.dtype == _C.dtype.float64 else np.float32
    raw = data.astype(work)
    w = None
    if weight is not None:
        _tensor_arg("histogram", "weight", weight)
        if tuple(weight.shape) != tuple(input.shape):
            raise _C.KilnError(f"histogram(): if weight tensor is provided it should have the same shape as the "
                               f"input tensor, got weight {list(weight.shape)} and input {list(input.shape)}")
        w = weight.detach().to(_C.dtype.float64).cpu().numpy().reshape(-1)
    if isinstance(bins, Tensor):
        if bins.dim() != 1 or bins.numel() < 1:
            raise _C.KilnError(f"histogram(): bins must be a 1-D tensor with at least one edge, got shape "
                               f"{list(bins.shape)}")
        edges = bins.detach().to(_C.dtype.float64).cpu().numpy()
        if np.any(np.diff(edges) < 0):
            raise _C.KilnError("histogram(): bin edges must be monotonically increasing")
        if range is not None:
            raise _C.KilnError("histogram(): range is given with bins as a tensor of edges")
    else:
        if not isinstance(bins, numbers.Integral) or bins <= 0:
            raise _C.KilnValueError(f"histogram(): bins must be a positive int or a tensor of edges, got {bins!r}")
        if range is not None:
            lo, hi = _float(range[0]), _float(range[1])
        elif raw.size:
            lo, hi = _float(raw.min()), _float(raw.max())
        else:
            lo, hi = 0.0, 1.0  # torch's range for an empty input
        if not (math.isfinite(lo) and math.isfinite(hi)):
            raise _C.KilnValueError(f"histogram(): range of [{lo}, {hi}] is not finite")
        if lo > hi:
            raise _C.KilnValueError(f"histogram(): min should not exceed max, got range ({lo}, {hi})")
        if lo == hi:
            lo, hi = lo - 0.5, hi + 0.5
        # as torch: the edges are linspace(lo, hi) in the input's dtype (lo and hi rounded to it; each edge
        # start + step * i in the first half, end - step * (n - i) in the second), and an element's bin is
        # found in that dtype: (x - lo) * bins / (hi - lo), corrected by comparing x with the edges around it
        lo_t, hi_t = work(lo), work(hi)
        step = (hi_t - lo_t) / work(bins)
        i = np.arange(bins + 1)
        half = (bins + 1) // 2
        edges = np.where(i < half, lo_t + step * i.astype(work), hi_t - step * (bins - i).astype(work))
        edges = edges.astype(work)
        inside = (raw >= edges[0]) & (raw <= edges[-1])
        x = raw[inside]
        pos = ((x - edges[0]) * work(bins) / (edges[-1] - edges[0])).astype(np.int64)
        pos = np.clip(pos, 0, bins)
        # the local search: among edges pos - 1, pos and pos + 1, the last one <= x
        pos_min, pos_max = np.maximum(pos - 1, 0), np.minimum(pos + 2, bins + 1)
        count = builtins.sum(((pos_min + j < pos_max) & (edges[np.minimum(pos_min + j, bins)] <= x)).astype(np.int64)
                             for j in _range(3))
        pos = pos_min + count - 1
        pos = np.where(pos == bins, bins - 1, pos)
        hist = np.bincount(pos, weights=None if w is None else w[inside], minlength=bins)[:bins]
        edges = edges.astype(np.float64)
    if isinstance(bins, Tensor):
        hist, _ = np.histogram(data, bins=edges, weights=w)
    hist = hist.astype(np.float64)
    if density:
        total = hist.sum()
        hist = hist / (total * np.diff(edges)) if total else hist * np.nan
    dt, dev = input.dtype, input.device
    return _histogram_type(_C.from_numpy(np.ascontiguousarray(hist)).to(dt).to(dev),
                           _C.from_numpy(np.ascontiguousarray(edges)).to(dt).to(dev))


# ---------------------------------------------------------------- windows

def _window(fn, length, periodic, dtype, device, requires_grad, values):
    """The window computed in float64 and rounded once to dtype (torch computes in dtype: float16 values can
    differ from torch's in the last place)."""
    if not isinstance(length, numbers.Integral) or length < 0:
        raise _C.KilnValueError(f"{fn}(): window_length must be a non-negative int, got {length!r}")
    dt = dtype or _C.dtype.float32
    if not dt.is_floating_point:
        raise _C.KilnError(f"{fn}(): expects floating point dtypes, got: {dt.name}")
    if length == 0:
        out = _C.zeros([0], dtype=dt, device=device)
    elif length == 1:
        out = _C.ones([1], dtype=dt, device=device)
    else:
        n = length + 1 if periodic else length
        k = np.arange(length, dtype=np.float64)
        out = _C.from_numpy(np.ascontiguousarray(values(k, n))).to(dt)
        if device is not None:
            out = out.to(device)
    if requires_grad:
        out.requires_grad_(True)
    return out


def hann_window(window_length, periodic=True, *, dtype=None, device=None, requires_grad=False):
    """torch.hann_window: 0.5 - 0.5 cos(2 pi k / (N - 1)), N = window_length + 1 when periodic."""
    return _window("hann_window", window_length, periodic, dtype, device, requires_grad,
                   lambda k, n: 0.5 - 0.5 * np.cos(2 * np.pi * k / (n - 1)))


def hamming_window(window_length, periodic=True, alpha=0.54, beta=0.46, *, dtype=None, device=None,
                   requires_grad=False):
    """torch.hamming_window: alpha - beta cos(2 pi k / (N - 1)), N = window_length + 1 when periodic."""
    return _window("hamming_window", window_length, periodic, dtype, device, requires_grad,
                   lambda k, n: alpha - beta * np.cos(2 * np.pi * k / (n - 1)))


def blackman_window(window_length, periodic=True, *, dtype=None, device=None, requires_grad=False):
    """torch.blackman_window: 0.42 - 0.5 cos(2 pi k / (N - 1)) + 0.08 cos(4 pi k / (N - 1))."""
    return _window("blackman_window", window_length, periodic, dtype, device, requires_grad,
                   lambda k, n: 0.42 - 0.5 * np.cos(2 * np.pi * k / (n - 1)) + 0.08 * np.cos(4 * np.pi * k / (n - 1)))


def bartlett_window(window_length, periodic=True, *, dtype=None, device=None, requires_grad=False):
    """torch.bartlett_window: the triangular window 1 - |2k / (N - 1) - 1|."""
    return _window("bartlett_window", window_length, periodic, dtype, device, requires_grad,
                   lambda k, n: 1 - np.abs(2 * k / (n - 1) - 1))


# ---------------------------------------------------------------- random in-place fills

def _no_generator(fn, generator):
    if generator is not None:
        raise _C.KilnValueError(f"{fn}(): Kiln has one random generator (seeded by kiln.manual_seed); "
                                f"generator= must be None, got {type(generator).__name__}")


def _uniform64(self):
    return _C.rand(*self.shape, dtype=_C.dtype.float64, device=self.device)


def bernoulli(input, p=None, *, generator=None, **kwargs):
    """torch.bernoulli: 0/1 draws (input's dtype) with probability input (or p, a number, for every element).
    Kiln's own form bernoulli(size, p, dtype=, device=) (a shape first) stays."""
    if not isinstance(input, Tensor):
        return _C.bernoulli(input, p, **kwargs)
    if kwargs:
        raise TypeError(f"bernoulli() got an unexpected keyword argument '{next(iter(kwargs))}'")
    _no_generator("bernoulli", generator)
    probs = input.detach() if p is None else p
    if isinstance(probs, Tensor):
        if not _bool(((probs >= 0) & (probs <= 1)).all()):
            raise _C.KilnError("bernoulli(): all probabilities must be in [0, 1] (NaN is not), as torch's "
                               "'Expected p_in >= 0 && p_in <= 1'")
        probs = probs.to(_C.dtype.float64)
    elif not 0 <= probs <= 1:
        raise _C.KilnError(f"bernoulli(): p must be in [0, 1], got {probs}")
    return (_uniform64(input) < probs).to(input.dtype)


def _bernoulli_values(self, p=0.5, *, generator=None):
    _no_generator("bernoulli_", generator)
    if isinstance(p, Tensor):
        p = p.detach()
    return bernoulli(self.detach(), p)


_I64_MIN, _I64_MAX = -2 ** 63, 2 ** 63 - 1


def _to_float(value, dt):
    """value (an int) rounded to the floating dtype dt, back as a Python int (C++'s int64 -> scalar_t -> int64);
    None where dt cannot hold it (overflow to inf: the range check that follows refuses it)."""
    rounded = _C.full([1], _float(value), dtype=dt).to(_C.dtype.float64).item()
    return _int(rounded) if math.isfinite(rounded) else None


def _update_from(lo, dt, digits):
    """torch's update_from: from moved right to the next value whose rounding to dt stays >= from."""
    plus1 = _to_float(lo + 1, dt)
    if plus1 is not None and plus1 < lo:
        lo = plus1 + (1 << (builtins.abs(lo + 1).bit_length() - 1 - digits + 1))
    return lo


def _update_to(hi, dt, digits):
    """torch's update_to: to moved left to the next value whose rounding to dt stays < to."""
    minus1 = _to_float(hi - 1, dt)
    if minus1 is not None and minus1 >= hi:
        hi = minus1 - (1 << (builtins.abs(hi - 1).bit_length() - 1 - digits + 1))
    return hi


def _random_bounds_check(dt, lo, to_inc):
    """torch's check_from_to_in_range: from and to - 1 must be values of dt (floating dtypes: within its finite
    range, with torch's warning beyond the integers it holds exactly, +-2**digits)."""
    if dt.is_floating_point:
        fmax = {_C.dtype.float16: 65504.0, _C.dtype.bfloat16: 3.3895313892515355e38,
                _C.dtype.float32: 3.4028234663852886e38, _C.dtype.float64: 1.7976931348623157e308}[dt]
        tmin, tmax = -fmax, fmax
    elif dt == _C.dtype.bool:
        tmin, tmax = 0, 1
    else:
        ii = np.iinfo(np.dtype(dt.name))
        tmin, tmax = _int(ii.min), _int(ii.max)
    for value, name in ((lo, "from"), (to_inc, "to - 1")):
        if not tmin <= value <= tmax:
            raise _C.KilnError(f"random_(): {name} is out of bounds for {dt.name}: {name} = {value} is not in "
                               f"[{tmin}, {tmax}]")
    if dt.is_floating_point:
        digits = _MANTISSA[dt]
        for value, name in ((lo, "from"), (to_inc, "to - 1")):
            if value < -(1 << digits) or value > (1 << digits):
                warnings.warn(f"random_(): {name} is out of bounds [-(2^{digits}), 2^{digits}]. Due to precision "
                              f"limitations {dt.name} can support discrete uniform distribution only within this "
                              f"range.", UserWarning, stacklevel=4)


_MANTISSA = {_C.dtype.float16: 11, _C.dtype.bfloat16: 8, _C.dtype.float32: 24, _C.dtype.float64: 53}


def _random_values(self, *args, generator=None, **kwargs):
    _no_generator("random_", generator)
    bounds = dict(zip(("from", "to"), args) if len(args) == 2 else zip(("to",), args))
    bounds.update(kwargs)
    if set(bounds) - {"from", "to"}:
        raise TypeError(f"random_() got an unexpected keyword argument '{(set(bounds) - {'from', 'to'}).pop()}'")
    dt = self.dtype
    lo, hi = bounds.get("from", 0), bounds.get("to")
    for value, name in ((lo, "from"), (hi, "to")):
        if value is None and name == "to":
            continue
        if not isinstance(value, numbers.Integral) or isinstance(value, _bool):
            raise TypeError(f"random_(): argument '{name}' must be an int, not {type(value).__name__}")
        if not _I64_MIN <= value <= _I64_MAX:
            raise _C.KilnValueError(f"random_(): argument '{name}' = {value} does not fit in int64")
    lo = _int(lo)
    if hi is not None:
        hi = _int(hi)
        # [from, to)
        if lo >= hi:
            raise _C.KilnError(f"random_ expects 'from' to be less than 'to', but got from={lo} >= to={hi}")
        if dt.is_floating_point:
            lo, hi = _update_from(lo, dt, _MANTISSA[dt]), _update_to(hi, dt, _MANTISSA[dt])
            if lo >= hi:
                raise _C.KilnError(f"random_ expects 'from' casted to dtype to be less than 'to' casted to dtype, "
                                   f"but got from={lo} >= to={hi}")
        _random_bounds_check(dt, lo, hi - 1)
    elif lo != _I64_MIN:
        # [from, the dtype's largest value]
        if dt.is_floating_point:
            to_inc = builtins.min(1 << _MANTISSA[dt], _I64_MAX)
            lo = _update_from(lo, dt, _MANTISSA[dt])
            if lo >= to_inc:
                raise _C.KilnError(f"random_ expects 'from' casted to dtype to be less than or equal to 'to_inc' "
                                   f"casted to dtype, but got from={lo} > to_inc={to_inc}")
        elif dt == _C.dtype.bool:
            to_inc = 1
        else:
            to_inc = _int(np.iinfo(np.dtype(dt.name)).max)
        _random_bounds_check(dt, lo, to_inc)
        hi = to_inc + 1
    else:
        # the full int64 range, 2**64 values: int64 and the floating dtypes torch allows
        if dt not in (_C.dtype.int64, _C.dtype.float64, _C.dtype.float32, _C.dtype.bfloat16):
            raise _C.KilnError(f"random_(): from=-2**63 with to=None (the full 64-bit range) handles only int64, "
                               f"float64, float32 and bfloat16, not {dt.name}")
        hi = 2 ** 63
    span = hi - lo
    shape, dev, i64 = tuple(self.shape), self.device, _C.dtype.int64
    if dt.is_floating_point and span <= 2 ** 53:
        u = _uniform64(self)
        return (_k().floor(u * _float(span)) + lo).clamp(lo, hi - 1).to(dt)
    if span <= 2 ** 24:  # the engine's randint draws spans up to 2**24
        return _k().randint(lo, hi, shape, dtype=i64, device=dev).to(dt)
    # 64 random bits u = b * 2**63 + u63 (u63 from three 21-bit draws, b one more bit), reduced modulo the
    # span as torch does for wide ranges, in int64 without overflow: the result is lo + (u mod span)
    u63 = _k().randint(0, 2 ** 21, shape, dtype=i64, device=dev)
    for _ in _range(2):
        u63 = u63 * 2 ** 21 + _k().randint(0, 2 ** 21, shape, dtype=i64, device=dev)
    top = _k().randint(0, 2, shape, dtype=i64, device=dev) == 1
    if span <= 2 ** 63:
        # (u63 mod span + b * (2**63 mod span)) mod span, both terms below span
        a = u63 if span == 2 ** 63 else _k().remainder(u63, span)
        c = (2 ** 63) % span
        r = _C.where(top, _C.where(a >= span - c, a - (span - c), a + c), a) if c else a
        out = r + lo
    else:
        # span > 2**63 (so lo < 0 < hi): u < 2 * span, u mod span is u or u - span
        below = u63 + lo                            # b = 0: u = u63 < span
        fits = u63 + (lo + 2 ** 63)                 # b = 1, u < span: lo + 2**63 + u63
        if span == 2 ** 64:
            high = fits
        else:
            over = span - 2 ** 63
            high = _C.where(u63 < over, fits, (u63 - over) + lo)  # else lo + u - span
        out = _C.where(top, high, below)
    return out.to(dt)


def _cauchy_values(self, median=0.0, sigma=1.0, *, generator=None):
    _no_generator("cauchy_", generator)
    if not sigma > 0:
        raise _C.KilnError(f"cauchy_ expects sigma > 0.0, but found sigma={sigma}")
    return (median + sigma * _C.tan(math.pi * (_uniform64(self) - 0.5))).to(self.dtype)


def _log_normal_values(self, mean=1.0, std=2.0, *, generator=None):
    _no_generator("log_normal_", generator)
    if not std > 0:
        raise _C.KilnError(f"log_normal_ expects std > 0.0, but found std={std}")
    z = _C.normal(0.0, 1.0, self.shape, dtype=_C.dtype.float64, device=self.device)
    return _C.exp(z * std + mean).to(self.dtype)


def _geometric_values(self, p, *, generator=None):
    _no_generator("geometric_", generator)
    if not 0 < p < 1:
        raise _C.KilnError(f"geometric_ expects p to be in (0, 1), but got p={p}")
    u = _uniform64(self)
    return _k().ceil(_C.log1p(-u) / math.log1p(-p)).clamp(1, None).to(self.dtype)


# ---------------------------------------------------------------- Tensor-only methods

_TYPE_NAMES = {_C.dtype.float32: "FloatTensor", _C.dtype.float64: "DoubleTensor", _C.dtype.float16: "HalfTensor",
               _C.dtype.bfloat16: "BFloat16Tensor", _C.dtype.int64: "LongTensor", _C.dtype.int32: "IntTensor",
               _C.dtype.int16: "ShortTensor", _C.dtype.int8: "CharTensor", _C.dtype.uint8: "ByteTensor",
               _C.dtype.bool: "BoolTensor"}
_TYPE_DTYPES = {v: k for k, v in _TYPE_NAMES.items()}


def _type(self, dtype=None, non_blocking=False, **kwargs):
    """Tensor.type: with no dtype the type's name ('kiln.FloatTensor', 'kiln.cuda.FloatTensor'); with a
    dtype or such a name ('torch.' or 'kiln.' prefix) self converted to it (self itself when it already
    is)."""
    if dtype is None:
        where = "kiln.cuda." if self.device.type == "cuda" else "kiln."
        return where + _TYPE_NAMES[self.dtype]
    if isinstance(dtype, str):
        parts = dtype.split(".")
        if len(parts) not in (2, 3) or parts[0] not in ("torch", "kiln") or parts[-1] not in _TYPE_DTYPES \
                or (len(parts) == 3 and parts[1] != "cuda"):
            raise _C.KilnValueError(f"type(): invalid type: '{dtype}' (expected a name such as 'torch.FloatTensor' "
                                    "or 'kiln.cuda.LongTensor')")
        out = self.to(_TYPE_DTYPES[parts[-1]])
        return out.to("cuda") if len(parts) == 3 else out.to("cpu") if self.device.type == "cuda" else out
    if not isinstance(dtype, _C.dtype):
        raise TypeError(f"type(): dtype must be a kiln.dtype or a type name, not {type(dtype).__name__}")
    return self if dtype == self.dtype else self.to(dtype)


def _new(self, *args, **kwargs):
    """Tensor.new (torch's legacy constructor): new(*sizes) uninitialized of self's dtype and device, new()
    empty, new(data) a list or tuple of numbers as a tensor of self's dtype."""
    unknown = set(kwargs) - {"device"}
    if unknown:
        raise TypeError(f"new() got an unexpected keyword argument '{unknown.pop()}'")
    device = kwargs.get("device", self.device)
    if not args:
        return _C.empty([0], dtype=self.dtype, device=device)
    if len(args) == 1 and isinstance(args[0], (list, tuple)):
        return _k().tensor(list(args[0]), dtype=self.dtype, device=device)
    if all(isinstance(a, numbers.Integral) and not isinstance(a, _bool) for a in args):
        return _C.empty(list(args), dtype=self.dtype, device=device)
    raise TypeError(f"new(): expected sizes (ints) or a list of data, got "
                    f"({', '.join(type(a).__name__ for a in args)}); use new_tensor, new_empty or clone")


def _get_device(self):
    """Tensor.get_device: the CUDA device's index, -1 on the CPU."""
    return self.device.index if self.device.type == "cuda" else -1


def _where_method(self, condition, y):
    """Tensor.where(condition, y): kiln.where(condition, self, y)."""
    return _k().where(condition, self, y)


def _prelu(self, weight):
    """Tensor.prelu: kiln.nn.functional.prelu(self, weight)."""
    return _k().nn.functional.prelu(self, weight)


# ---------------------------------------------------------------- in-place forms

def _view_inplace(name, make):
    """An in-place view op (t_, transpose_, squeeze_, ...): self rebound to the view of its own memory (a
    view of a base still writes the base), refused on a tensor that requires grad as kiln's other in-place
    ops are."""
    def method(self, *args, **kwargs):
        _C._check_inplace(self, name)
        view = make(self.detach(), *args, **kwargs)
        self._rebind_data(view)
        return self
    method.__name__ = name
    return method


def _t(t):
    if t.dim() > 2:
        raise _C.KilnError(f"t_(): expects a tensor with <= 2 dimensions, but self is {t.dim()}D")
    return t.t() if t.dim() == 2 else t


def _put(input, index, source, accumulate=False):
    """torch.put: input (flattened) with source written at the flat indices `index` (summed with accumulate)."""
    _tensor_arg("put", "input", input)
    _tensor_arg("put", "index", index)
    _tensor_arg("put", "source", source)
    if index.dtype != _C.dtype.int64:
        raise _C.KilnError(f"put(): Expected a long tensor for index, but got {index.dtype.name}")
    if index.numel() != source.numel():
        raise _C.KilnError(f"put(): Expected source and index to have the same number of elements, but got "
                           f"source {source.numel()} and index {index.numel()}")
    if source.dtype != input.dtype:
        raise _C.KilnError(f"put(): self ({input.dtype.name}) and source ({source.dtype.name}) must have the same "
                           "dtype")
    n = input.numel()
    idx = index.reshape(-1)
    if idx.numel() and (_bool((idx >= n).any()) or _bool((idx < -n).any())):
        raise _C.KilnIndexError(f"put(): index out of range for a tensor of {n} elements")
    flat = input.reshape(-1)
    return _C.index_put(flat, [idx], source.reshape(-1), accumulate).reshape(*input.shape)


_put.__name__ = "put"


def _cum_inplace(name, fn):
    def compute(self, dim, *, dtype=None):
        if dtype is not None and dtype != self.dtype:
            raise _C.KilnError(f"{name}: dtype {dtype.name} differs from self's {self.dtype.name}; in place the "
                               "result is self's dtype")
        return fn(self, dim).to(self.dtype)
    return _inplace(name, compute)


def _compare_inplace(name, fn):
    """eq_, logical_and_, ...: the bool result written into self's dtype (1/0, by copy_), as torch."""
    return _inplace(name, fn)


def _tensor_other(name, fn):
    """fn(self, other) with other required to be a tensor, as torch's logical_and_/or_/xor_ (no Python scalar)."""
    def compute(self, other):
        if not isinstance(other, Tensor):
            raise TypeError(f"{name}(): argument 'other' (position 1) must be a kiln.Tensor, not "
                            f"{type(other).__name__}")
        return fn(self, other)
    return compute


class _Missing:
    """Tensor's attributes set only where Tensor lacks them (another module's definition stays)."""

    def __setattr__(self, name, value):
        if not hasattr(Tensor, name):
            setattr(Tensor, name, value)


def _install():
    k = _k()
    g = globals()
    T = _Missing()
    # aliases: kiln.<alias>, Tensor.<alias>, Tensor.<alias>_
    for alias, name in _ALIASES.items():
        if name in ("asinh", "acosh", "atanh"):
            fn, meth = _lazy(name), _lazy_method(name)
            meth_ = _lazy_method(name + "_")
        else:
            fn = getattr(k, name)
            meth = getattr(Tensor, name)
            meth_ = None
        g[alias] = fn
        setattr(T, alias, meth)
        if meth_ is not None:
            setattr(T, alias + "_", meth_)

    # in-place forms of elementwise ops
    for name in ("acos", "asin", "atan", "cosh", "sinh", "tan", "log2", "log10", "exp2", "erfc", "erfinv",
                 "atan2", "fmod", "remainder", "floor_divide", "nan_to_num"):
        setattr(T, name + "_", _inplace(name + "_", getattr(k, name)))
    for alias in ("absolute", "arccos", "arcsin", "arctan", "arctan2", "divide", "multiply", "subtract", "negative",
                  "fix"):
        setattr(T, alias + "_", _inplace(alias + "_", getattr(k, _ALIASES[alias])))
    T.true_divide_ = _inplace("true_divide_", k.true_divide)
    T.square_ = _inplace("square_", lambda self: self * self)
    T.sgn_ = _inplace("sgn_", sgn)
    T.sinc_ = _inplace("sinc_", sinc)
    T.deg2rad_ = _inplace("deg2rad_", deg2rad)
    T.rad2deg_ = _inplace("rad2deg_", rad2deg)
    T.float_power_ = _float_power_
    for name in ("eq", "ne", "lt", "le", "gt", "ge"):
        setattr(T, name + "_", _compare_inplace(name + "_", getattr(k, name)))
    T.logical_and_ = _compare_inplace("logical_and_", _tensor_other("logical_and_", k.logical_and))
    T.logical_or_ = _compare_inplace("logical_or_", _tensor_other("logical_or_", k.logical_or))
    for alias in ("greater", "greater_equal", "less", "less_equal", "not_equal"):
        setattr(T, alias + "_", _compare_inplace(alias + "_", getattr(k, _ALIASES[alias])))
    T.logical_xor_ = _compare_inplace("logical_xor_", _tensor_other("logical_xor_", logical_xor))
    T.logical_not_ = _compare_inplace("logical_not_", k.logical_not)
    T.cumsum_ = _cum_inplace("cumsum_", k.cumsum)
    T.cumprod_ = _cum_inplace("cumprod_", k.cumprod)
    T.tril_ = _inplace("tril_", k.tril)
    T.triu_ = _inplace("triu_", k.triu)
    # scatter with a number as src (or value=), which the engine's scatter takes only as a tensor
    k.scatter, k.scatter_add = scatter, scatter_add
    Tensor.scatter = _as_method(scatter)
    Tensor.scatter_add = _as_method(scatter_add)
    T.scatter_ = _inplace("scatter_", scatter)

    def _scatter_add_(self, dim, index, src):
        if not isinstance(src, Tensor):
            raise TypeError(f"scatter_add_(): argument 'src' must be a kiln.Tensor, not {type(src).__name__}")
        return scatter_add(self, dim, index, src)
    T.scatter_add_ = _inplace("scatter_add_", _scatter_add_)
    T.scatter_reduce_ = _inplace("scatter_reduce_", k.scatter_reduce)
    T.index_put_ = _inplace("index_put_", k.index_put)
    T.masked_scatter_ = _inplace("masked_scatter_", k.masked_scatter)
    T.put_ = _inplace("put_", _put)
    T.put = _as_method(_put)
    T.addmm_ = _inplace("addmm_", k.addmm)
    T.baddbmm_ = _inplace("baddbmm_", k.baddbmm)
    # in-place view ops
    T.t_ = _view_inplace("t_", _t)
    T.transpose_ = _view_inplace("transpose_", lambda t, d0, d1: t.transpose(d0, d1))
    T.swapaxes_ = _view_inplace("swapaxes_", lambda t, d0, d1: t.transpose(d0, d1))
    T.swapdims_ = _view_inplace("swapdims_", lambda t, d0, d1: t.transpose(d0, d1))
    T.squeeze_ = _view_inplace("squeeze_", lambda t, dim=None: k.squeeze(t, dim))
    T.unsqueeze_ = _view_inplace("unsqueeze_", lambda t, dim: t.unsqueeze(dim))
    # random fills
    T.bernoulli = lambda self, p=None, *, generator=None: bernoulli(self, p, generator=generator)
    bernoulli_ = _inplace("bernoulli_", _bernoulli_values)

    def _bernoulli_(self, p=0.5, *, generator=None):
        # p may require grad, as torch allows (a draw has no gradient): detached before the in-place rule,
        # which refuses an operand that requires grad
        return bernoulli_(self, p.detach() if isinstance(p, Tensor) else p, generator=generator)
    _bernoulli_.__name__ = "bernoulli_"
    T.bernoulli_ = _bernoulli_
    T.random_ = _inplace("random_", _random_values)
    T.cauchy_ = _inplace("cauchy_", _cauchy_values)
    T.log_normal_ = _inplace("log_normal_", _log_normal_values)
    T.geometric_ = _inplace("geometric_", _geometric_values)

    # methods of the new functions
    for fn in (broadcast_to, fliplr, flipud, mv, cross, diag, diagflat, fmax, fmin, float_power, deg2rad, rad2deg,
               sgn, sinc, logaddexp2, logical_xor, isclose, allclose, equal, isposinf, isneginf, isreal, dist,
               msort, is_nonzero, is_same_size, is_signed, select_scatter, slice_scatter, diagonal_scatter,
               histogram, positive):
        setattr(T, fn.__name__, _as_method(fn))
    for fn in (split_with_sizes, unsafe_split, unsafe_chunk, unsafe_split_with_sizes, nonzero_static,
               g["narrow_copy"]):
        setattr(T, fn.__name__, _as_method(fn))
    T.sum_to_size = sum_to_size
    T.type = _type
    T.new = _new
    T.get_device = _get_device
    T.where = _where_method
    T.prelu = _prelu
    T.is_cpu = property(lambda self: self.device.type == "cpu")
    T.is_meta = property(lambda self: self.device.type == "meta")
    T.itemsize = property(lambda self: self.element_size())
    T.mH = property(lambda self: self.transpose(-2, -1))
    T.H = property(_H)
    T.adjoint = lambda self: self.transpose(-2, -1)

    # top-level in-place functions torch has: kiln.exp_(t) is t.exp_()
    for name in _TOP_INPLACE:
        g[name] = _top_inplace(name)


def _H(self):
    if self.dim() not in (0, 2):
        raise _C.KilnError(f"tensor.H is only supported on matrices (2-D tensors). Got {self.dim()}-D tensor.")
    return self.transpose(0, 1) if self.dim() == 2 else self


def adjoint(input):
    """torch.adjoint: the transpose of the last two dimensions (real tensors)."""
    _tensor_arg("adjoint", "input", input)
    return input.transpose(-2, -1)


_TOP_INPLACE = ("abs_", "acos_", "asin_", "atan_", "ceil_", "clamp_", "clamp_max_", "clamp_min_", "clip_", "cos_",
                "cosh_", "deg2rad_", "erf_", "erfc_", "exp_", "exp2_", "expm1_", "fix_", "floor_", "frac_", "gcd_",
                "lcm_", "ldexp_", "log_", "log10_", "log1p_", "log2_", "logit_", "nan_to_num_", "neg_", "negative_",
                "rad2deg_", "reciprocal_", "relu_", "round_", "rsqrt_", "sigmoid_", "sin_", "sinc_", "sinh_",
                "sqrt_", "square_", "tan_", "tanh_", "trunc_", "xlogy_", "zero_", "fill_", "index_put_", "addmv_",
                "arccos_", "arcsin_", "arctan_", "arcsinh_", "arccosh_", "arctanh_")


def _top_inplace(name):
    def fn(input, *args, **kwargs):
        _tensor_arg(name, "input", input)
        method = getattr(Tensor, name, None)
        if method is None:
            raise _C.KilnError(f"{name} is not available in this build of kiln")
        return method(input, *args, **kwargs)
    fn.__name__ = name
    fn.__doc__ = f"torch.{name}: input.{name}(...), input updated in place and returned."
    return fn


def fill(input, value):
    """torch.fill: a tensor of input's shape, dtype and device filled with value."""
    _tensor_arg("fill", "input", input)
    return _C.full(list(input.shape), value.item() if isinstance(value, Tensor) else value,
                   dtype=input.dtype, device=input.device)


def put(input, index, source, accumulate=False):
    """torch.put: input (flattened) with source written at the flat indices `index` (summed with accumulate)."""
    return _put(input, index, source, accumulate)


def index_reduce(input, dim, index, source, reduce, *, include_self=True):
    """torch.index_reduce: input.index_reduce(dim, index, source, reduce, include_self=...)."""
    _tensor_arg("index_reduce", "input", input)
    return input.index_reduce(dim, index, source, reduce, include_self=include_self)


def randint_like(input, low=0, high=None, *, dtype=None, device=None, requires_grad=False):
    """torch.randint_like: integers uniform in [low, high) in input's shape (randint_like(input, high) too),
    input's dtype and device unless given."""
    _tensor_arg("randint_like", "input", input)
    if high is None:
        low, high = 0, low
    return _k().randint(low, high, tuple(input.shape), dtype=dtype or input.dtype,
                        device=device or input.device, requires_grad=requires_grad)


def empty_strided(size, stride, *, dtype=None, device=None, requires_grad=False):
    """torch.empty_strided: an uninitialized tensor of this size laid out with these strides (non-negative)."""
    size, stride = tuple(size), tuple(stride)
    if len(size) != len(stride):
        raise _C.KilnValueError(f"empty_strided(): mismatch in length of strides and shape: size {list(size)}, "
                                f"stride {list(stride)}")
    if any(s < 0 for s in size) or any(s < 0 for s in stride):
        raise _C.KilnValueError(f"empty_strided(): sizes and strides must be non-negative, got size {list(size)}, "
                                f"stride {list(stride)}")
    span = 0 if 0 in size else 1 + builtins.sum((n - 1) * st for n, st in zip(size, stride))
    out = _C.empty([span], dtype=dtype or _C.dtype.float32, device=device).as_strided(size, stride, 0)
    if requires_grad:
        out.requires_grad_(True)
    return out


def typename(obj):
    """torch.typename: a tensor's type name ('kiln.FloatTensor'); else, as torch's, the object's own
    module-qualified name where it has one (a class or function: typename(np.ndarray) is 'numpy.ndarray',
    typename(len) 'len'), or its class's ('numpy.ndarray' for an array); no module for builtins."""
    if isinstance(obj, Tensor):
        return obj.type()
    module = getattr(obj, "__module__", "") or ""
    if hasattr(obj, "__qualname__"):
        qualname = obj.__qualname__
    elif hasattr(obj, "__name__"):
        qualname = obj.__name__
    else:
        module = obj.__class__.__module__ or ""
        qualname = obj.__class__.__qualname__
    return qualname if module in ("", "builtins") else f"{module}.{qualname}"


def bilinear(input1, input2, weight, bias=None):
    """torch.bilinear: kiln.nn.functional.bilinear."""
    return _k().nn.functional.bilinear(input1, input2, weight, bias)


def constant_pad_nd(input, pad, value=0):
    """torch.constant_pad_nd: kiln.nn.functional.pad(input, pad, value=value) (negative pads crop)."""
    return _k().nn.functional.pad(input, list(pad), mode="constant", value=value)


def split_with_sizes(input, split_sizes, dim=0):
    """torch.split_with_sizes: input split along dim into pieces of these sizes (which must sum to its size)."""
    _tensor_arg("split_with_sizes", "input", input)
    sizes = list(split_sizes)
    d = _norm_dim("split_with_sizes", dim, input.dim())
    if builtins.sum(sizes) != input.shape[d] or any(n < 0 for n in sizes):
        raise _C.KilnError(f"split_with_sizes expects split_sizes to sum exactly to {input.shape[d]} (input tensor's "
                           f"size at dimension {dim}), but got split_sizes={sizes}")
    return _k().split(input, sizes, d)


def unsafe_split(input, split_size, dim=0):
    """torch.unsafe_split: kiln.split (Kiln's pieces are ordinary views)."""
    return _k().split(input, split_size, dim)


def unsafe_chunk(input, chunks, dim=0):
    """torch.unsafe_chunk: kiln.chunk (Kiln's pieces are ordinary views)."""
    return _k().chunk(input, chunks, dim)


def unsafe_split_with_sizes(input, split_sizes, dim=0):
    """torch.unsafe_split_with_sizes: split_with_sizes (Kiln's pieces are ordinary views)."""
    return split_with_sizes(input, split_sizes, dim)


def nonzero_static(input, *, size, fill_value=-1):
    """torch.nonzero_static: nonzero's (n, ndim) indices cut or padded with fill_value to exactly size rows."""
    _tensor_arg("nonzero_static", "input", input)
    if not isinstance(size, numbers.Integral) or size < 0:
        raise _C.KilnValueError(f"nonzero_static: 'size' must be a non-negative integer, got {size!r}")
    idx = _k().nonzero(input)
    n = idx.shape[0]
    if n >= size:
        return idx[:size]
    pad = _C.full([size - n, input.dim()], fill_value, dtype=_C.dtype.int64, device=input.device)
    return _C.cat([idx, pad], 0)


def _forward(name, doc):
    def fn(input, *args, **kwargs):
        _tensor_arg(name, "input", input)
        return getattr(input, name)(*args, **kwargs)
    fn.__name__ = name
    fn.__doc__ = doc
    return fn


def _copy_of(name, view):
    """torch.<name>: view(input, ...) as a new contiguous tensor (never input's memory), differentiable."""
    def fn(input, *args, **kwargs):
        _tensor_arg(name, "input", input)
        out = view(input, *args, **kwargs)
        fresh = lambda t: _k().clone(t, memory_format=_k().contiguous_format)  # noqa: E731
        return tuple(fresh(t) for t in out) if isinstance(out, (tuple, list)) else fresh(out)
    fn.__name__ = name
    fn.__doc__ = f"torch.{name}: {name[:-5]}(input, ...) copied into new contiguous memory."
    return fn


_COPIES = {
    "alias_copy": lambda x: x, "detach_copy": lambda x: x.detach(),
    "diagonal_copy": lambda x, offset=0, dim1=0, dim2=1: _k().diagonal(x, offset, dim1, dim2),
    "expand_copy": lambda x, size: x.expand(*size), "permute_copy": lambda x, dims: x.permute(*dims),
    "select_copy": lambda x, dim, index: x.select(dim, index),
    "slice_copy": lambda x, dim=0, start=None, end=None, step=1: x[(slice(None),) * _norm_dim("slice_copy", dim,
                                                                                                x.dim())
                                                                   + (slice(start, end, step),)],
    "squeeze_copy": lambda x, dim=None: _k().squeeze(x, dim), "t_copy": lambda x: x.t(),
    "transpose_copy": lambda x, dim0, dim1: x.transpose(dim0, dim1), "unbind_copy": lambda x, dim=0: x.unbind(dim),
    "unfold_copy": lambda x, dimension, size, step: x.unfold(dimension, size, step),
    "unsqueeze_copy": lambda x, dim: x.unsqueeze(dim), "view_copy": lambda x, size: x.view(*size),
    "split_copy": lambda x, split_size, dim=0: _k().split(x, split_size, dim),
    "split_with_sizes_copy": lambda x, split_sizes, dim=0: _k().split(x, list(split_sizes), dim),
    "as_strided_copy": lambda x, size, stride, storage_offset=None: as_strided(x, size, stride, storage_offset),
    "narrow_copy": lambda x, dim, start, length: x.narrow(dim, start, length),
}
globals().update({name: _copy_of(name, view) for name, view in _COPIES.items()})


# torch's top-level forms of methods Kiln had only on Tensor
narrow = _forward("narrow", "torch.narrow: input.narrow(dim, start, length).")
permute = _forward("permute", "torch.permute: input.permute(dims).")
reshape = _forward("reshape", "torch.reshape: input.reshape(shape).")
select = _forward("select", "torch.select: input.select(dim, index).")
t = _forward("t", "torch.t: input.t().")
transpose = _forward("transpose", "torch.transpose: input.transpose(dim0, dim1).")
unsqueeze = _forward("unsqueeze", "torch.unsqueeze: input.unsqueeze(dim).")
detach = _forward("detach", "torch.detach: input.detach().")

__all__ = (list(_ALIASES) + [
    "positive", "concat", "concatenate", "atleast_1d", "atleast_2d", "atleast_3d", "hstack", "vstack", "row_stack",
    "dstack", "column_stack", "broadcast_to", "broadcast_tensors", "fliplr", "flipud", "as_strided", "mm", "mv",
    "chain_matmul", "cross", "diag", "diagflat", "fmax", "fmin", "float_power", "deg2rad", "rad2deg", "sgn", "sinc",
    "logaddexp2", "logical_xor", "isclose", "allclose", "equal", "isposinf", "isneginf", "isreal", "rsub", "dist",
    "msort", "is_tensor", "is_floating_point", "is_signed", "is_nonzero", "is_same_size", "numel",
    "get_default_dtype", "can_cast", "finfo", "iinfo", "select_scatter", "slice_scatter", "diagonal_scatter",
    "trapezoid", "trapz", "cumulative_trapezoid", "gradient", "combinations", "unravel_index", "range", "histogram",
    "hann_window", "hamming_window", "blackman_window", "bartlett_window", "adjoint", "fill", "put", "index_reduce",
    "randint_like", "empty_strided", "typename", "bilinear", "constant_pad_nd", "narrow", "permute", "reshape",
    "select", "t", "transpose", "unsqueeze", "detach", "split_with_sizes", "unsafe_split", "unsafe_chunk",
    "unsafe_split_with_sizes", "nonzero_static"]
           + list(_TOP_INPLACE) + list(_COPIES))


_install()
