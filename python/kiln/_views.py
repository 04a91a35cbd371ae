"""More of torch's Tensor API: unfold (sliding windows, a view), tensor_split (and hsplit, vsplit,
dsplit), swapaxes/swapdims, index_copy/index_copy_, view(dtype), and the small ones ported code calls
(square, ravel, reshape_as, new_empty, nelement, ndimension; clamp_min/clamp_max are in
kiln/_extras.py), as functions (kiln.<name>, _EXPORTS) and Tensor methods, with torch's arguments, results, gradients and errors."""
import builtins
import numbers

from . import _C
from ._C import Tensor
from ._tensor import _as_method, _inplace, _movedim, _norm_dim
from .autograd import Function


def _unfold(self, dimension, size, step):
    """Tensor.unfold: every window of `size` elements along `dimension`, `step` apart, as a new last dim
    (shape [..., (n - size) // step + 1, ..., size]). A view, as torch's: it shares the input's memory,
    and the gradient of an element is the sum over the windows that hold it."""
    n = self.dim()
    d = _norm_dim(builtins.int(dimension), n)
    length = self.shape[d] if n else 1
    size, step = builtins.int(size), builtins.int(step)
    if size < 0:
        raise _C.KilnError(f"unfold: size is {size} but must be >= 0")
    if size > length:
        raise _C.KilnError(f"unfold: maximum size for tensor at dimension {d} is {length} but size is {size}")
    if step <= 0:
        raise _C.KilnError(f"unfold: step is {step} but must be > 0")
    return _C._unfold(self, d, size, step)


def _tensor_split(input, indices_or_sections, dim=0):
    """torch.tensor_split: views of input along dim, `sections` pieces as equal as can be (the first
    size % sections one longer), or cut before each of the listed indices (a list, tuple or int64
    tensor; slices as x[a:b] reads them: negative counts from the end, out of range is clamped)."""
    if input.dim() == 0:
        raise _C.KilnError("tensor_split expected at least a 1-dimensional tensor, but got a tensor with 0 dims")
    d = _norm_dim(builtins.int(dim), input.dim())
    what = indices_or_sections
    if isinstance(what, Tensor):
        if what.dtype != _C.dtype.int64:
            raise _C.KilnError("tensor_split expected tensor_indices_or_sections to have dtype of long, but got "
                               f"{what.dtype.name}")
        if what.dim() > 1:
            raise _C.KilnError("tensor_split expected tensor_indices_or_sections to be a zero-dimensional or "
                               f"one-dimensional tensor, but got a tensor with {what.dim()} dims")
        what = what.item() if what.dim() == 0 else what.tolist()
    lead = (builtins.slice(None),) * d
    if isinstance(what, numbers.Integral) and not isinstance(what, builtins.bool):
        sections, n = builtins.int(what), input.shape[d]
        if sections <= 0:
            raise _C.KilnError(f"number of sections must be larger than 0, got {sections}")
        small, extra = divmod(n, sections)
        out, at = [], 0
        for i in range(sections):
            size = small + (1 if i < extra else 0)
            out.append(input.narrow(d, at, size))
            at += size
        return tuple(out)
    if not isinstance(what, (list, tuple)) or not builtins.all(
            isinstance(i, numbers.Integral) and not isinstance(i, builtins.bool) for i in what):
        raise TypeError("tensor_split(): argument 'indices_or_sections' must be an int, a sequence of ints or an "
                        f"int64 tensor, not {type(indices_or_sections).__name__}")
    cuts = [None] + [builtins.int(i) for i in what] + [None]
    return tuple(input[lead + (builtins.slice(a, b),)] for a, b in zip(cuts[:-1], cuts[1:]))


def _swapaxes(input, axis0, axis1):
    """torch.swapaxes (NumPy's name for transpose): a view with the two dims exchanged."""
    n = input.dim()
    return input.transpose(_norm_dim(builtins.int(axis0), n), _norm_dim(builtins.int(axis1), n))


def _swapdims(input, dim0, dim1):
    """torch.swapdims: transpose's other name."""
    return _swapaxes(input, dim0, dim1)


def _index_copy(input, dim, index, source):
    """torch.index_copy: input with the slices of source along dim written at the positions index names
    (an int64 vector, or 0-dim; each in [0, size)). Differentiable in input (no gradient at the written
    positions) and in source (the gradient at the positions it was written to)."""
    n = input.dim()
    d = _norm_dim(builtins.int(dim), n)
    if not isinstance(index, Tensor) or index.dtype != _C.dtype.int64:
        got = index.dtype.name if isinstance(index, Tensor) else type(index).__name__
        raise _C.KilnError(f"index_copy_(): Expected a long tensor for index, but got {got}")
    if index.dim() > 1:
        raise _C.KilnIndexError(f"index_copy_(): Index should have dimension 1 or 0 (got {index.dim()})")
    if not isinstance(source, Tensor):
        raise TypeError(f"index_copy(): argument 'source' must be a Tensor, not {type(source).__name__}")
    if n and source.dim() and source.dim() != n:
        raise _C.KilnIndexError("index_copy_(): When source and destination are not scalars, their dimensionality "
                                f"must match. Source dimensionality ({source.dim()}), destination dimensionality "
                                f"({n})")
    if source.dtype != input.dtype:
        raise _C.KilnError("index_copy_(): self and source expected to have the same dtype, but got (self) "
                           f"{input.dtype.name} and (source) {source.dtype.name}")
    index = index.reshape(-1)
    count = index.shape[0]
    size = input.shape[d] if n else 1
    src_count = source.shape[d] if source.dim() else 1
    if count != src_count:
        raise _C.KilnIndexError(f"index_copy_(): Number of indices ({count}) should be equal to source.size(dim) "
                                f"({src_count})")
    rest_in = list(input.shape[:d]) + list(input.shape[d + 1:])
    rest_src = list(source.shape[:d]) + list(source.shape[d + 1:]) if source.dim() else []
    if rest_in != rest_src:
        raise _C.KilnError(f"index_copy_(): Source/destination tensor must have same slice shapes: the input "
                           f"{list(input.shape)} and the source {list(source.shape)} differ outside dim {d}")
    if count:
        lo, hi = _C.stack([index.min(), index.max()]).tolist()  # one read from the device, not two
        if lo < 0 or hi >= size:
            raise _C.KilnIndexError(f"index_copy_(): index {lo if lo < 0 else hi} is out of bounds for dimension "
                                    f"{d} with size {size}")
    if index.device != input.device:
        index = index.to(input.device)
    if n == 0:
        return _IndexCopy.apply(input.reshape(1), index, source.reshape(1)).reshape([])
    if source.dim() == 0:  # a 1-D input's one slice
        source = source.reshape(1)
    return _movedim(_IndexCopy.apply(_movedim(input, d, 0), index, _movedim(source, d, 0)), 0, d)


class _IndexCopy(Function):
    """index_copy along dim 0: source's rows written into input's rows `index`. Its backward is torch's:
    input's gradient without the written rows, and each source row the gradient of the row it was
    written to, also where an index repeats (index_put's backward gives a repeated row's gradient to
    its last write only)."""

    @staticmethod
    def forward(ctx, input, index, source):
        ctx.save_for_backward(index)
        ctx.source_shape = list(source.shape)
        return _C.index_put(input, [index], source, False)

    @staticmethod
    def backward(ctx, g):
        (index,) = ctx.saved_tensors
        g_input = _C.index_put(g, [index], _C.zeros(ctx.source_shape, dtype=g.dtype, device=g.device), False)
        return g_input, None, g.index_select(0, index)


def _split_along(name, dim, least):
    def split(input, indices_or_sections):
        n = input.dim()
        if n < least:
            raise _C.KilnError(f"torch.{name} requires a tensor with at least {least} dimension, but got a tensor "
                               f"with {n} dimensions!")
        d = 0 if name == "hsplit" and n == 1 else dim
        if isinstance(indices_or_sections, Tensor) and indices_or_sections.dim() == 0:
            indices_or_sections = indices_or_sections.item()  # a number of sections, checked as one
        if isinstance(indices_or_sections, numbers.Integral) and not isinstance(indices_or_sections, builtins.bool):
            size = input.shape[d]
            if indices_or_sections == 0 or size % indices_or_sections:
                raise _C.KilnError(f"torch.{name} attempted to split along dimension {d}, but the size of the "
                                   f"dimension {size} is not divisible by the split_size {indices_or_sections}!")
        return _tensor_split(input, indices_or_sections, d)
    split.__name__ = name
    split.__doc__ = (f"torch.{name}: tensor_split along dim {dim}" + (" (dim 0 for a 1-D input)" if name == "hsplit"
                     else "") + f" of an input of at least {least} dims; a number of sections must divide the dim.")
    return split


_hsplit = _split_along("hsplit", 1, 1)
_vsplit = _split_along("vsplit", 0, 2)
_dsplit = _split_along("dsplit", 2, 3)


def _square(input):
    """torch.square: input ** 2 (a bool input gives int64, as torch's)."""
    return _C.pow(input, 2)


def _new_empty(self, *size, dtype=None, device=None, requires_grad=False):
    """Tensor.new_empty: a tensor of that size with self's dtype and device unless given (zero-filled:
    its values are unspecified in torch)."""
    return self.new_zeros(*size, dtype=dtype, device=device, requires_grad=requires_grad)


_c_view = Tensor.view


def _view(self, *shape, dtype=None):
    """Tensor.view(*shape) as before, or view(dtype) as torch's: the same memory read as another dtype
    (of the same element size the same shape; of a smaller one the last dim, which must have stride 1,
    longer by the ratio; of a larger one shorter, its size, the offset and the other strides divisible by
    the ratio). A view that shares the memory and needs no gradient (as torch's)."""
    # A dtype: anything but a size (a NumPy scalar type such as np.int32 is a class with __index__)
    if dtype is None and len(shape) == 1 and (isinstance(shape[0], type) or not isinstance(
            shape[0], (numbers.Integral, list, tuple)) and not hasattr(shape[0], "__index__")):
        dtype = shape[0]
        shape = ()
    if dtype is not None:
        if shape:
            raise TypeError("view(): give a shape or a dtype, not both")
        return _C._view_dtype(self, dtype)
    return _c_view(self, *shape)


Tensor.unfold = _unfold
Tensor.view = _view
Tensor.tensor_split = _as_method(_tensor_split)
Tensor.swapaxes = _as_method(_swapaxes)
Tensor.swapdims = _as_method(_swapdims)
Tensor.index_copy = _as_method(_index_copy)
Tensor.index_copy_ = _inplace("index_copy_", _index_copy)
Tensor.hsplit = _as_method(_hsplit)
Tensor.vsplit = _as_method(_vsplit)
Tensor.dsplit = _as_method(_dsplit)
Tensor.square = _as_method(_square)
Tensor.new_empty = _new_empty
Tensor.reshape_as = lambda self, other: self.reshape(*other.shape)
Tensor.ravel = lambda self: self.reshape(-1)
Tensor.nelement = lambda self: self.numel()
Tensor.ndimension = lambda self: self.dim()

_EXPORTS = dict(tensor_split=_tensor_split, swapaxes=_swapaxes, swapdims=_swapdims, index_copy=_index_copy,
                hsplit=_hsplit, vsplit=_vsplit, dsplit=_dsplit, square=_square, ravel=lambda input: input.reshape(-1))
