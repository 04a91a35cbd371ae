"""Helpers of kiln.distributions, as torch.distributions.utils: broadcast_all, probs/logits conversions,
clamp_probs, sum_rightmost, and the float dtypes' eps and tiny (Kiln has no finfo)."""
import math
import numbers

from .. import _C
from .._C import Tensor

__all__ = ["broadcast_all", "probs_to_logits", "logits_to_probs", "clamp_probs", "sum_rightmost", "eps", "tiny",
           "float_min"]

# (eps, tiny, lowest finite) of each floating dtype
_FINFO = {
    _C.dtype.float64: (2.220446049250313e-16, 2.2250738585072014e-308, -1.7976931348623157e308),
    _C.dtype.float32: (1.1920928955078125e-07, 1.1754943508222875e-38, -3.4028234663852886e38),
    _C.dtype.float16: (0.0009765625, 6.103515625e-05, -65504.0),
    _C.dtype.bfloat16: (0.0078125, 1.1754943508222875e-38, -3.3895313892515355e38),
}


def _finfo(dtype, i):
    if dtype not in _FINFO:
        raise ValueError(f"kiln.distributions: parameters must be floating point tensors, got {dtype}")
    return _FINFO[dtype][i]


def eps(dtype):
    return _finfo(dtype, 0)


def tiny(dtype):
    return _finfo(dtype, 1)


def float_min(dtype):
    return _finfo(dtype, 2)


def broadcast_all(*values):
    """The values (tensors or numbers) as tensors broadcast to one shape, as torch's: numbers take the
    dtype and device of the first tensor among them, float32 on the CPU when there is none."""
    ref = None
    for v in values:
        if isinstance(v, Tensor):
            ref = v if ref is None else ref
        elif not isinstance(v, numbers.Number):
            raise ValueError("Input arguments must all be instances of numbers.Number or kiln.Tensor, got "
                             f"{type(v).__name__}")
    dtype = ref.dtype if ref is not None else _C.dtype.float32
    device = ref.device if ref is not None else None
    tensors = [v if isinstance(v, Tensor) else _C.full([], float(v), dtype=dtype, device=device) for v in values]
    shape = tuple(_C.broadcast_shapes(*[tuple(t.shape) for t in tensors]))
    return tuple(t if tuple(t.shape) == shape else t.expand(*shape) for t in tensors)


def clamp_probs(probs):
    """probs clamped to [eps, 1 - eps] of its dtype."""
    e = eps(probs.dtype)
    return _C.clamp(probs, e, 1 - e)


def probs_to_logits(probs, is_binary=False):
    """log-odds of probs (is_binary) or their log (categorical), probs clamped away from 0 and 1 first."""
    ps = clamp_probs(probs)
    if is_binary:
        return _C.log(ps) - _C.log1p(-ps)
    return _C.log(ps)


def logits_to_probs(logits, is_binary=False):
    """sigmoid(logits) (is_binary) or softmax over the last dim."""
    if is_binary:
        return _C.sigmoid(logits)
    return _C.softmax(logits, -1)


def sum_rightmost(value, dim):
    """value summed over its dim rightmost dims (value itself for dim 0)."""
    if dim == 0:
        return value
    return value.reshape(tuple(value.shape[:value.dim() - dim]) + (-1,)).sum(-1)


class lazy_property:
    """A property computed once, on first read, and then stored on the instance (probs from logits and
    the other way round): torch's lazy_property."""

    def __init__(self, fn):
        self.fn = fn
        self.__doc__ = fn.__doc__
        self.__name__ = fn.__name__

    def __get__(self, instance, owner=None):
        if instance is None:
            return self
        value = self.fn(instance)
        instance.__dict__[self.fn.__name__] = value
        return value


EULER_GAMMA = 0.57721566490153286060
LOG_SQRT_2PI = math.log(math.sqrt(2 * math.pi))


def expand_probs_or_logits(src, new, shape):
    """expand()'s shared step for distributions given probs= or logits=: copies whichever of the two src has
    computed to new, expanded to shape, and makes the last one copied new._param (logits when both are)."""
    for name in ("probs", "logits"):
        if name in src.__dict__:
            setattr(new, name, getattr(src, name).expand(*shape))
            new._param = getattr(new, name)
