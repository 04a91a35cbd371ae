"""Memory formats as torch's: kiln.contiguous_format, kiln.channels_last and kiln.preserve_format, taken
by Tensor.is_contiguous, Tensor.contiguous and Tensor.to (and by nn.Module.to), each also as torch's own
torch.memory_format object or as a name ("channels_last"). channels_last is the engine's NHWC layout of a
4-D [N, C, H, W] tensor (engine/tensor.h, MemoryFormat): conv2d, batch norm, pooling and the elementwise
ops keep it, so a channels_last input batch keeps the network in it."""
from . import _C
from ._C import Tensor

__all__ = ["memory_format", "contiguous_format", "channels_last", "preserve_format", "clone"]


class memory_format:
    """How a tensor lies in memory (torch.memory_format): kiln.contiguous_format (row-major),
    kiln.channels_last (a 4-D tensor's NHWC order) or kiln.preserve_format (as the input lies)."""
    __slots__ = ("_name",)

    def __init__(self, name):
        object.__setattr__(self, "_name", name)

    def __setattr__(self, key, value):
        raise AttributeError(f"kiln.{self._name} cannot be changed")

    def __repr__(self):
        return f"kiln.{self._name}"

    def __reduce__(self):  # pickles as the object itself: kiln.channels_last stays the one object
        return self._name


contiguous_format = memory_format("contiguous_format")
channels_last = memory_format("channels_last")
preserve_format = memory_format("preserve_format")
_BY_NAME = {"contiguous_format": contiguous_format, "contiguous": contiguous_format,
            "channels_last": channels_last, "preserve_format": preserve_format}


def _memory_format(value, op):
    """value (a kiln or torch memory format, or a name) as one of the three objects; op names the call."""
    if isinstance(value, memory_format):
        return _BY_NAME[value._name]  # a kiln.memory_format("channels_last") made by hand is the one object
    name = None
    if isinstance(value, str):
        name = value
    elif type(value).__name__ == "memory_format" and type(value).__module__ == "torch":
        name = str(value).replace("torch.", "", 1)
    else:
        raise TypeError(f"{op}: argument 'memory_format' must be a kiln.memory_format (kiln.contiguous_format, "
                        f"kiln.channels_last, kiln.preserve_format; torch's or their names too), not "
                        f"{type(value).__name__}")
    if name in _BY_NAME:
        return _BY_NAME[name]
    if name == "channels_last_3d":
        raise _C.KilnValueError(f"{op}: memory_format {value!r}: Kiln has no 5-D channels-last layout; use "
                                "kiln.contiguous_format (kiln.channels_last is the 4-D NHWC one)")
    raise _C.KilnValueError(f"{op}: unknown memory_format {value!r} (expected kiln.contiguous_format, "
                            "kiln.channels_last or kiln.preserve_format)")


def _needs_4d(x, fmt, op):
    if fmt is channels_last and x.dim() != 4:
        raise _C.KilnError(f"{op}(memory_format=kiln.channels_last): required rank 4 tensor to use channels_last "
                           f"format (an [N, C, H, W] tensor), got shape {list(x.shape)}")


def _is_contiguous(self, *, memory_format=contiguous_format):
    """Whether the elements lie densely in that format's order, as torch's (size-1 dims ignored, so a
    tensor can be both; channels_last is False for a tensor that is not 4-D)."""
    fmt = _memory_format(memory_format, "is_contiguous()")
    if fmt is channels_last:
        return _C._is_contiguous_channels_last(self)
    return _c_is_contiguous(self)


def _contiguous(self, memory_format=contiguous_format):
    """This tensor if it lies in that format, else a copy that does (autograd sees it), as torch's."""
    fmt = _memory_format(memory_format, "contiguous()")
    if fmt is preserve_format:
        raise _C.KilnError("contiguous(): preserve memory format is unsupported by the contiguous operator "
                           "(as torch's): give kiln.contiguous_format or kiln.channels_last")
    _needs_4d(self, fmt, "contiguous")
    return _in_format(self, fmt)


def _in_format(x, fmt):
    """x itself (the same object, as torch returns) when it lies in fmt, else its copy that does."""
    if fmt is channels_last:
        return x if _C._is_contiguous_channels_last(x) else _c_contiguous(x, "channels_last")
    return x if _c_is_contiguous(x) else _c_contiguous(x, "contiguous")


def _suggested_format(x):
    """torch's suggest_memory_format(): channels_last when a 4-D tensor's strides are ordered as NHWC's
    (C innermost; ambiguous size-1 cases count as NCHW), whether or not it is dense; else contiguous."""
    if x.dim() != 4:
        return contiguous_format
    sizes, strides = x.shape, x.stride()
    if strides[1] == 0:
        return contiguous_format
    low = 0
    for d in (1, 3, 2, 0):
        if sizes[d] == 0 or strides[d] < low or (d == 0 and low == strides[1]):
            return contiguous_format
        low = strides[d] * (sizes[d] if sizes[d] > 1 else 1)
    return channels_last


def _wants_channels_last(x, fmt):
    """Whether a copy of x in fmt is channels_last: asked for, or preserve_format with x's strides suggesting it."""
    return fmt is channels_last or (fmt is preserve_format and _suggested_format(x) is channels_last)


def _to(self, *args, memory_format=preserve_format, **kwargs):
    # None is preserve_format, as torch's (and Module.to's)
    fmt = _memory_format(preserve_format if memory_format is None else memory_format, "to()")
    _needs_4d(self, fmt, "to")
    out = _c_to(self, *args, **kwargs)
    if kwargs.get("copy") and out.dtype == self.dtype and out.device == self.device:
        # copy=True: a new tensor even where nothing is converted, as torch's (writes into it leave self)
        if _wants_channels_last(self, fmt):
            return _copy_channels_last(self)
        return _c_clone(self)  # a contiguous copy
    if out.dtype == self.dtype and out.device == self.device:
        # Nothing converted: the tensor itself, as torch's, unless asked for a format its strides do not
        # suggest (torch's rule: a sliced NCHW tensor stays as it is under contiguous_format)
        if fmt is preserve_format or _suggested_format(self) is fmt:
            return self
        return _copy_channels_last(self) if fmt is channels_last else _c_clone(self)
    if fmt is channels_last:
        n, c, h, w = out.shape
        return out if out.stride() == (h * w * c, 1, w * c, c) else _copy_channels_last(out)
    return out if fmt is preserve_format or _c_is_contiguous(out) else _c_clone(out)


def _copy_channels_last(x):
    """A copy of a 4-D x with torch's NHWC strides, also where x's are channels_last already (C or more
    dims of size 1, whose strides the engine's contiguous(channels_last) keeps); recorded for autograd."""
    if x.numel():
        return _c_clone(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
    return _c_contiguous(_c_clone(x), "channels_last")  # NHWC strides with a size-0 dim counted as 0, as torch's


def clone(input, *, memory_format=preserve_format):
    """A copy of input (autograd sees it), as torch.clone: preserve_format (the default) keeps a
    channels_last tensor channels_last, contiguous_format or channels_last gives that layout."""
    fmt = _memory_format(memory_format, "clone()")
    _needs_4d(input, fmt, "clone")
    if _wants_channels_last(input, fmt):
        return _copy_channels_last(input)
    return _c_clone(input)


def _like(c_fn):
    """c_fn (one of the engine's *_like functions) taking torch's memory_format=: preserve_format (the
    default) gives a channels_last input a channels_last result, as torch's; the result is made NHWC and
    viewed as NCHW, so it stays a leaf (requires_grad=True)."""
    def fn(input, *args, memory_format=preserve_format, requires_grad=False, **kwargs):
        fmt = _memory_format(memory_format, f"{c_fn.__name__}()")
        _needs_4d(input, fmt, c_fn.__name__)
        if not _wants_channels_last(input, fmt):
            return c_fn(input, *args, requires_grad=requires_grad, **kwargs)
        out = c_fn(input.detach().permute(0, 2, 3, 1), *args, **kwargs).permute(0, 3, 1, 2).detach()
        return out.requires_grad_(True) if requires_grad else out

    fn.__name__ = fn.__qualname__ = c_fn.__name__
    fn.__doc__ = (c_fn.__doc__ or "") + (
        "\n\nmemory_format=kiln.preserve_format (the default) keeps a channels_last input's layout; "
        "kiln.contiguous_format or kiln.channels_last gives that layout, as torch's.")
    return fn


def _full_like_grad(input, fill_value, *, requires_grad=False, **kwargs):
    out = _C.full_like(input, fill_value, **kwargs)
    return out.requires_grad_(True) if requires_grad else out


_full_like_grad.__name__ = "full_like"
_full_like_grad.__doc__ = _C.full_like.__doc__
empty_like, zeros_like, ones_like, rand_like, randn_like = (
    _like(f) for f in (_C.empty_like, _C.zeros_like, _C.ones_like, _C.rand_like, _C.randn_like))
full_like = _like(_full_like_grad)

_c_is_contiguous = Tensor.is_contiguous
_c_contiguous = Tensor.contiguous
_c_to = Tensor.to
_c_clone = Tensor.clone
_to.__doc__ = (_c_to.__doc__ or "") + (
    "\n\nmemory_format=kiln.preserve_format (the default) keeps the layout (a cast keeps channels_last); "
    "kiln.contiguous_format or kiln.channels_last gives that layout, as torch's.")
Tensor.is_contiguous = _is_contiguous
Tensor.contiguous = _contiguous
Tensor.to = _to
Tensor.clone = clone
