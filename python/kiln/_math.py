"""torch's math functions the engine has no op for, written with Kiln's ops (autograd differentiates them as
it does those ops): a Python number as the first argument of add, sub, mul, div, true_divide, floor_divide,
remainder and pow (torch.add(3, t)); trace, diag_embed, rot90, hypot, xlogy, diff, kron, meshgrid,
cartesian_prod, block_diag, tril_indices/triu_indices, aminmax, std_mean/var_mean, logcumsumexp, isin,
bucketize, searchsorted, histc, unique, unique_consecutive, quantile/nanquantile, take_along_dim without
dim, Tensor.new_tensor, Tensor.index_reduce; kiln.special and kiln.linalg (the norms, cross, vecdot,
matrix_power, diagonal; the spectral decompositions are attached by _linalg_spectral.py). The index-valued ones (bucketize, searchsorted, histc, unique,
isin's counts) are computed with NumPy on the host, as they have no gradient."""
import builtins
import collections
import math
import numbers
import sys
import types

import numpy as np

from . import _C
from ._C import Tensor
from ._tensor import _EXPORTS as _T, _as_method, _inplace, _numpy, return_types
from ._extras import _dropped, _scaled_sum, logaddexp

__all__ = ["add", "sub", "mul", "div", "true_divide", "floor_divide", "remainder", "pow", "trace", "diag_embed",
           "rot90", "hypot", "xlogy", "diff", "kron", "meshgrid", "cartesian_prod", "block_diag", "tril_indices",
           "triu_indices", "aminmax", "std_mean", "var_mean", "logcumsumexp", "isin", "bucketize", "searchsorted",
           "histc", "unique", "unique_consecutive", "quantile", "nanquantile", "take_along_dim", "special",
           "linalg"]

_c_add, _c_sub, _c_mul, _c_div = _C.add, _C.sub, _C.mul, _C.div
_c_floor_divide, _c_remainder, _c_pow, _c_take_along_dim = _C.floor_divide, _C.remainder, _C.pow, _C.take_along_dim


def _is_number(x):
    return isinstance(x, numbers.Number) or (isinstance(x, np.generic) and np.ndim(x) == 0)


def _number_first(x, other):
    """Whether torch's number-first form applies: x a Python (or NumPy) number, other a tensor."""
    return not isinstance(x, Tensor) and isinstance(other, Tensor) and _is_number(x)


def _scaled(number, t, alpha):
    """alpha * t in the dtype of number (op) t (torch's: add(0.5, int8 t, alpha=2) scales in float32, not
    int8), alpha checked as add's is against that dtype (a float alpha with an integer result refused):
    0 + alpha * t with a 0-dim zero of that dtype, which counts only by its category."""
    dt = _C.result_type(number, t)
    return _c_add(_C.zeros([], dtype=dt, device=t.device), t.to(dt), alpha=alpha)


def add(input, other, *, alpha=1):
    """input + alpha * other, as torch.add: input may be a number when other is a tensor (add(3, t))."""
    if _number_first(input, other):
        return (other if alpha == 1 else _scaled(input, other, alpha)).__radd__(input)
    return _c_add(input, other, alpha=alpha)


def sub(input, other, *, alpha=1):
    """input - alpha * other, as torch.sub: input may be a number when other is a tensor (sub(1.0, t))."""
    if _number_first(input, other):
        if alpha != 1 and other.dtype == _C.dtype.bool:  # refused by the engine, as torch's
            return _c_sub(_wrapped(input, other), other, alpha=alpha)
        return (other if alpha == 1 else _scaled(input, other, alpha)).__rsub__(input)
    return _c_sub(input, other, alpha=alpha)


def mul(input, other):
    """input * other, as torch.mul: input may be a number when other is a tensor (mul(2, t))."""
    if _number_first(input, other):
        return other.__rmul__(input)
    return _c_mul(input, other)


def _wrapped(number, t):
    """number as a 0-dim tensor of the dtype torch computes number (op) t in, on t's device."""
    return _C.full([], number, dtype=_C.result_type(number, t), device=t.device)


def div(input, other, *, rounding_mode=None):
    """input / other, as torch.div (rounding_mode None, 'trunc' or 'floor'): input may be a number when
    other is a tensor (div(1, t))."""
    if _number_first(input, other):
        if rounding_mode is None:
            return other.__rtruediv__(input)
        dt = _C.result_type(input, other)
        if not dt.is_floating_point and dt != _C.dtype.bool and isinstance(input, numbers.Integral):
            # an integer number is taken in the integer dtype as torch takes it, wrapping around (300 is 44 in
            # uint8: div(300, uint8 t, rounding_mode='trunc') is 44 // t), not refused by full
            number = _C.full([], int(input), dtype=_C.dtype.int64, device=other.device).to(dt)
        else:
            number = _wrapped(input, other)
        return _c_div(number, other, rounding_mode=rounding_mode)
    return _c_div(input, other, rounding_mode=rounding_mode)


def true_divide(input, other):
    """torch.true_divide: div without a rounding mode."""
    return div(input, other)


def floor_divide(input, other):
    """torch.floor_divide; input may be a number when other is a tensor."""
    if _number_first(input, other):
        return other.__rfloordiv__(input)
    return _c_floor_divide(input, other)


def remainder(input, other):
    """torch.remainder (Python's %, the sign of other); input may be a number when other is a tensor."""
    if _number_first(input, other):
        return other.__rmod__(input)
    return _c_remainder(input, other)


def pow(input, exponent):
    """torch.pow; input may be a number when exponent is a tensor (pow(2, t), as 2 ** t)."""
    if _number_first(input, exponent):
        return exponent.__rpow__(input)
    return _c_pow(input, exponent)


def _tensor_arg(fn, name, x):
    if not isinstance(x, Tensor):
        raise TypeError(f"{fn}(): argument '{name}' must be a kiln.Tensor, not {type(x).__name__}")


def _dim(d, n, fn):
    if not -builtins.max(n, 1) <= d < builtins.max(n, 1):
        raise _C.KilnIndexError(f"{fn}: dimension {d} is out of range for a {n}-D tensor (expected [-{max(n, 1)}, "
                                f"{max(n, 1) - 1}])")
    return d % builtins.max(n, 1)


def _pair_operands(fn, x, y, xname, yname):
    """Two operands of which at most one is a number, as tensors of their common float dtype."""
    if not isinstance(x, Tensor) and not isinstance(y, Tensor):
        raise TypeError(f"{fn}(): one of '{xname}' and '{yname}' must be a kiln.Tensor, got {type(x).__name__} "
                        f"and {type(y).__name__}")
    if not isinstance(x, Tensor):
        x = _wrapped(x, y)
    if not isinstance(y, Tensor):
        y = _wrapped(y, x)
    dt = _C.result_type(x, y)  # a 0-dim operand (a number) counts by its category only, as torch's
    dt = dt if dt.is_floating_point else _C.dtype.float32
    return x.to(dt), y.to(dt)


def trace(input):
    """torch.trace: the sum of a matrix's main diagonal (integers summed as int64, as torch's)."""
    _tensor_arg("trace", "input", input)
    if input.dim() != 2:
        raise _C.KilnValueError(f"trace: expected a matrix (2-D tensor), got a {input.dim()}-D tensor")
    return _T["sum"](_C.diagonal(input, 0, 0, 1))


def diag_embed(input, offset=0, dim1=-2, dim2=-1):
    """torch.diag_embed: input's last dimension as the diagonal (offset above it, below for negative) of
    matrices in dims dim1 and dim2 of the result, zeros elsewhere."""
    _tensor_arg("diag_embed", "input", input)
    nd = input.dim() + 1
    d1, d2 = _dim(dim1, nd, "diag_embed"), _dim(dim2, nd, "diag_embed")
    if d1 == d2:
        raise _C.KilnValueError(f"diag_embed: diagonal dimensions cannot be identical {dim1}, {dim2}")
    n = input.shape[-1] if input.dim() else 1
    x = input.reshape([1]) if input.dim() == 0 else input
    m = n + builtins.abs(offset)
    r, c = np.meshgrid(np.arange(m), np.arange(m), indexing="ij")
    on = (c - r == offset) & (r - builtins.max(-offset, 0) < n)
    src = np.where(on, r - builtins.max(-offset, 0), 0).reshape(-1)
    if n == 0:
        out = _C.zeros(list(x.shape[:-1]) + [m, m], dtype=x.dtype, device=x.device)
    else:
        picked = _C.index_select(x, -1, _C.from_numpy(src.astype(np.int64)).to(x.device))
        picked = picked.reshape(list(x.shape[:-1]) + [m, m])
        out = _C.where(_C.from_numpy(on).to(x.device), picked, _C.zeros_like(picked))
    return _T["movedim"](out, [-2, -1], [d1, d2])


def rot90(input, k=1, dims=(0, 1)):
    """torch.rot90: rotates by 90 degrees k times in the plane of dims, from the first towards the second."""
    _tensor_arg("rot90", "input", input)
    dims = list(dims)
    if len(dims) != 2:
        raise _C.KilnValueError(f"rot90: expected total rotation dims == 2, but got dims = {len(dims)}")
    if input.dim() < 2:
        raise _C.KilnValueError(f"rot90: expected total dims >= 2, but got total dims = {input.dim()}")
    a, b = _dim(dims[0], input.dim(), "rot90"), _dim(dims[1], input.dim(), "rot90")
    if a == b:
        raise _C.KilnValueError(f"rot90: expected rotation dims to be different, but got dim0 = {a} and dim1 = {b}")
    k %= 4
    if k == 1:
        return _C.flip(input, [b]).transpose(a, b)
    if k == 2:
        return _C.flip(input, [a, b])
    if k == 3:
        return _C.flip(input, [a]).transpose(a, b)
    return input.clone()


def hypot(input, other):
    """torch.hypot: sqrt(input^2 + other^2), floating tensors only (as torch's); inf beside NaN gives inf."""
    for name, t in (("input", input), ("other", other)):
        _tensor_arg("hypot", name, t)
        if not t.dtype.is_floating_point:
            raise _C.KilnValueError(f"hypot: {name} must be a floating-point tensor, got {t.dtype.name} (as torch)")
    x, y = (input, other) if input.dtype == other.dtype else _pair_operands("hypot", input, other, "input", "other")
    dtype = x.dtype
    inf = _C.logical_or(_C.isinf(x), _C.isinf(y))
    # inf inputs become 1 before the formula (the result there is inf anyway): with inf inside it the finite
    # operand's gradient was NaN (inf * 0); now it is 0, as torch's (finite / inf)
    x = _C.where(_C.isinf(x), _C.ones_like(x), x)
    y = _C.where(_C.isinf(y), _C.ones_like(y), y)
    if dtype != _C.dtype.float64:
        # float16, bfloat16, float32: computed in float64 and rounded once to dtype (each step in dtype
        # rounded again: float16 relative errors to 1.1e-3, twice torch's); their squares cannot overflow
        # or underflow in float64
        x, y = x.to(_C.dtype.float64), y.to(_C.dtype.float64)
    # m * sqrt(1 + (n / m)^2) with m the larger magnitude: no overflow or underflow of the squares (float64
    # hypot(1e200, 1e200), hypot(3e-300, 4e-300)); the gradient at (0, 0) is 0 (torch's is NaN)
    ax, ay = _C.abs(x), _C.abs(y)
    x_larger = ax >= ay  # ties take m from x and n from y, so each gets half of the gradient
    m, n = _C.where(x_larger, ax, ay), _C.where(x_larger, ay, ax)
    r = n / _C.where(m == 0, _C.ones_like(m), m)
    out = (m * _C.sqrt(1 + r * r)).to(dtype)
    return _C.where(inf, _C.full_like(out, math.inf), out)


def _xlog(fn, x, y, log, edge):
    """x * log(y) (log1p for xlog1py), 0 where x is 0 and y is not NaN; input's gradient there is log(y) (0
    for y <= edge, where the log is not finite), as torch's."""
    x, y = _pair_operands(fn, x, y, "input", "other")
    zero = _C.logical_and(x == 0, _C.logical_not(_C.isnan(y)))
    safe = _C.where(zero, _C.ones_like(y), y)
    out = x * log(safe)
    has_log = y.detach() > edge
    slope = _C.where(has_log, log(_C.where(has_log, y.detach(), _C.ones_like(safe))), _C.zeros_like(safe))
    return _C.where(zero, (x - x.detach()) * slope, out)


def xlogy(input, other):
    """torch.xlogy: input * log(other), 0 where input is 0 (unless other is NaN); either may be a number;
    integers compute in float32."""
    return _xlog("xlogy", input, other, _C.log, 0)


def diff(input, n=1, dim=-1, prepend=None, append=None):
    """torch.diff: the n-th forward difference along dim, prepend and append (tensors) joined first; bool
    tensors differ by logical xor, as torch's."""
    _tensor_arg("diff", "input", input)
    if input.dim() == 0:
        raise _C.KilnValueError("diff: expects input to be at least one-dimensional")
    if not isinstance(n, numbers.Integral) or n < 0:
        raise _C.KilnValueError(f"diff: order must be non-negative but got {n}")
    d = _dim(dim, input.dim(), "diff")
    for name, t in (("prepend", prepend), ("append", append)):
        if t is not None:
            _tensor_arg("diff", name, t)
            if t.dim() != input.dim():
                raise _C.KilnValueError(f"diff: {name} must have the same number of dimensions as input, got "
                                        f"{t.dim()} and {input.dim()}")
    x = _C.cat([t for t in (prepend, input, append) if t is not None], d) if prepend is not None or \
        append is not None else input
    for _ in range(n):
        length = x.shape[d]
        if length == 0:
            break
        hi, lo = x.narrow(d, 1, length - 1), x.narrow(d, 0, length - 1)
        x = _C.ne(hi, lo) if x.dtype == _C.dtype.bool else hi - lo
    return x


def kron(input, other):
    """torch.kron: the Kronecker product; the operands' shapes are padded with leading 1s to one length."""
    _tensor_arg("kron", "input", input)
    _tensor_arg("kron", "other", other)
    nd = builtins.max(input.dim(), other.dim())
    sa = [1] * (nd - input.dim()) + list(input.shape)
    sb = [1] * (nd - other.dim()) + list(other.shape)
    a = input.reshape([v for s in sa for v in (s, 1)])
    b = other.reshape([v for s in sb for v in (1, s)])
    return (a * b).reshape([x * y for x, y in zip(sa, sb)])


def _tensor_list(fn, tensors):
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
        tensors = tuple(tensors[0])
    for i, t in enumerate(tensors):
        if not isinstance(t, Tensor):
            raise TypeError(f"{fn}(): expected kiln.Tensor arguments, got {type(t).__name__} at position {i}")
    return tensors


def meshgrid(*tensors, indexing="ij"):
    """torch.meshgrid: N 1-D (or 0-dim) tensors give N tensors of their sizes' shape; indexing 'ij' (the
    default) or 'xy' (the first two dims swapped). The results are expanded views."""
    tensors = _tensor_list("meshgrid", tensors)
    if indexing not in ("ij", "xy"):
        raise _C.KilnValueError(f"meshgrid: indexing must be one of 'xy' or 'ij', but received: {indexing!r}")
    if not tensors:
        raise _C.KilnValueError("meshgrid: expects a non-empty list of tensors")
    for t in tensors:
        if t.dim() > 1:
            raise _C.KilnValueError(f"meshgrid: expects all tensors to be 0- or 1-dimensional, got a {t.dim()}-D "
                                    f"tensor")
        if t.dtype != tensors[0].dtype:
            raise _C.KilnValueError("meshgrid: expects all tensors to have the same dtype, got "
                                    f"{tensors[0].dtype.name} and {t.dtype.name}")
        if t.device != tensors[0].device:
            raise _C.KilnValueError(f"meshgrid: expects all tensors to be on the same device, got "
                                    f"{tensors[0].device} and {t.device}")
    swap = indexing == "xy" and len(tensors) >= 2
    order = list(tensors)
    if swap:
        order[0], order[1] = order[1], order[0]
    sizes = [t.numel() for t in order]
    out = []
    for i, t in enumerate(order):
        view = [1] * len(order)
        view[i] = -1
        out.append(t.reshape(view).expand(sizes))
    if swap:
        out[0], out[1] = out[1], out[0]
    return tuple(out)


def cartesian_prod(*tensors):
    """torch.cartesian_prod: the rows of every combination of the 1-D tensors' elements (one tensor: itself)."""
    tensors = _tensor_list("cartesian_prod", tensors)
    for t in tensors:
        if t.dim() != 1:
            raise _C.KilnValueError(f"cartesian_prod: expects 1-D tensors, got a {t.dim()}-D tensor")
    if len(tensors) == 1:
        return tensors[0]
    return _C.stack([g.reshape([-1]) for g in meshgrid(*tensors, indexing="ij")], 1)


def block_diag(*tensors):
    """torch.block_diag: the tensors (0-, 1- or 2-D; a 1-D one is a row) down the diagonal of one matrix,
    zeros elsewhere, in their promoted dtype."""
    tensors = _tensor_list("block_diag", tensors)
    mats = []
    for i, t in enumerate(tensors):
        if t.dim() > 2:
            raise _C.KilnValueError(f"block_diag: Input tensors must have 2 or fewer dimensions. Input {i} has "
                                    f"{t.dim()} dimensions")
        mats.append(t.reshape([1, 1]) if t.dim() == 0 else t.reshape([1, -1]) if t.dim() == 1 else t)
    if not mats:
        return _C.zeros(1, 0)
    dt = mats[0].dtype
    for m in mats[1:]:
        dt = _C.promote_types(dt, m.dtype)
    cols = builtins.sum(m.shape[1] for m in mats)
    rows, left = [], 0
    for m in mats:
        r, c = m.shape
        parts = [_C.zeros(r, left, dtype=dt, device=m.device), m.to(dt),
                 _C.zeros(r, cols - left - c, dtype=dt, device=m.device)]
        rows.append(_C.cat(parts, 1))
        left += c
    return _C.cat(rows, 0)


def _indices(fn, row, col, offset, dtype, device, lower):
    for name, v in (("row", row), ("col", col), ("offset", offset)):
        if not isinstance(v, numbers.Integral) or isinstance(v, builtins.bool):
            raise TypeError(f"{fn}(): argument '{name}' must be an int, not {type(v).__name__}")
    if row < 0 or col < 0:
        raise _C.KilnValueError(f"{fn}: row must be non-negative, got {row}; col must be non-negative, got {col}")
    r, c = (np.tril_indices if lower else np.triu_indices)(row, offset, col)
    out = _C.from_numpy(np.stack([r, c]).astype(np.int64).reshape(2, -1))
    return out.to(dtype if dtype is not None else _C.dtype.int64).to(device if device is not None else "cpu")


def tril_indices(row, col, offset=0, *, dtype=None, device=None):
    """torch.tril_indices: the (2, N) row and column indices of a row x col matrix's lower triangle."""
    return _indices("tril_indices", row, col, offset, dtype, device, True)


def triu_indices(row, col, offset=0, *, dtype=None, device=None):
    """torch.triu_indices: the (2, N) row and column indices of a row x col matrix's upper triangle."""
    return _indices("triu_indices", row, col, offset, dtype, device, False)


aminmax_result = collections.namedtuple("aminmax", ["min", "max"])


def aminmax(input, *, dim=None, keepdim=False):
    """torch.aminmax: (min, max), of all elements or along dim, as a named tuple."""
    _tensor_arg("aminmax", "input", input)
    if dim is None and input.numel() == 0:
        raise _C.KilnValueError("aminmax: Expected reduction dim to be specified for input.numel() == 0")
    return aminmax_result(_C.amin(input, dim, keepdim), _C.amax(input, dim, keepdim))


def _spread(fn, input, dim, unbiased, keepdim, correction):
    _tensor_arg(fn, "input", input)
    if isinstance(dim, builtins.bool):  # std_mean(x, False): torch's (input, unbiased) overload
        dim, unbiased = None, dim
    if correction is not None and not isinstance(correction, builtins.bool):
        if not isinstance(correction, numbers.Real) or not float(correction).is_integer():
            raise _C.KilnValueError(f"{fn}: correction must be a whole number (the engine's var and std take an "
                                    f"integer correction; torch also accepts fractional ones), got {correction!r}")
        correction = int(correction)
    spread = (_C.std if fn == "std_mean" else _C.var)(input, dim, unbiased, correction=correction, keepdim=keepdim)
    return spread, _T["mean"](input, dim, keepdim) if dim is not None else (
        _T["mean"](input).reshape([1] * input.dim()) if keepdim else _T["mean"](input))


def std_mean(input, dim=None, unbiased=None, keepdim=False, *, correction=None):
    """torch.std_mean: (std, mean) of input, both as std and mean would give them."""
    return _spread("std_mean", input, dim, unbiased, keepdim, correction)


def var_mean(input, dim=None, unbiased=None, keepdim=False, *, correction=None):
    """torch.var_mean: (var, mean) of input, both as var and mean would give them."""
    return _spread("var_mean", input, dim, unbiased, keepdim, correction)


def logcumsumexp(input, dim):
    """torch.logcumsumexp: log(cumsum(exp(input))) along dim without overflow or underflow: a log-space
    scan with logaddexp (log2(n) steps), floating tensors only (as torch's)."""
    _tensor_arg("logcumsumexp", "input", input)
    if not input.dtype.is_floating_point:
        raise _C.KilnValueError(f"logcumsumexp: expected a floating-point tensor, got {input.dtype.name} (as "
                                f"torch)")
    if input.dim() == 0:
        return input.clone()
    d = _dim(dim, input.dim(), "logcumsumexp")
    n, out, shift = input.shape[d], input, 1
    while shift < n:
        pad = list(out.shape)
        pad[d] = shift
        shifted = _C.cat([_C.full(pad, -math.inf, dtype=out.dtype, device=out.device), out.narrow(d, 0, n - shift)],
                         d)
        out = logaddexp(out, shifted)
        shift *= 2
    return input.clone() if out is input else out


def _host(t):
    """t's values as a NumPy array on the host (Tensor.numpy(force=True): bfloat16, which NumPy lacks, as
    float32, which holds each of its values exactly)."""
    return _numpy(t, force=True)


def isin(elements, test_elements, *, assume_unique=False, invert=False):
    """torch.isin: whether each of elements is among test_elements (either may be a number), a bool tensor
    of elements' shape; NaN is in nothing."""
    if not isinstance(elements, Tensor) and not isinstance(test_elements, Tensor):
        raise TypeError("isin(): one of 'elements' and 'test_elements' must be a kiln.Tensor")
    like = elements if isinstance(elements, Tensor) else test_elements
    e = _host(elements) if isinstance(elements, Tensor) else np.asarray(elements)
    t = _host(test_elements) if isinstance(test_elements, Tensor) else np.asarray(test_elements)
    out = np.isin(e, t, invert=builtins.bool(invert))
    return _C.from_numpy(np.array(out)).to(like.device)


def _search_result(idx, out_int32, device):
    return _C.from_numpy(np.array(idx.astype(np.int32 if out_int32 else np.int64))).to(device)


def bucketize(input, boundaries, *, out_int32=False, right=False):
    """torch.bucketize: for each element the index of its bucket in the sorted 1-D boundaries: the first i
    with x <= boundaries[i] (right=True: x < boundaries[i]); input may be a number."""
    _tensor_arg("bucketize", "boundaries", boundaries)
    if boundaries.dim() != 1:
        raise _C.KilnValueError(f"bucketize: boundaries tensor must be 1 dimension, but got dim({boundaries.dim()})")
    x = _host(input) if isinstance(input, Tensor) else np.asarray(input)
    idx = np.searchsorted(_host(boundaries), x, side="right" if right else "left")
    return _search_result(np.asarray(idx), out_int32, boundaries.device)


def searchsorted(sorted_sequence, input, *, out_int32=False, right=False, side=None, sorter=None):
    """torch.searchsorted: where each of input's values would go in sorted_sequence's last dimension (1-D,
    or with the same leading dims as input) to keep it sorted: side 'left' (the first such place) or
    'right' (right=True); sorter, the indices that sort sorted_sequence; input may be a number."""
    _tensor_arg("searchsorted", "sorted_sequence", sorted_sequence)
    if side is not None and side not in ("left", "right"):
        raise _C.KilnValueError(f"searchsorted: side can only be 'left' or 'right' but got {side!r}")
    if side == "left" and right:
        raise _C.KilnValueError("searchsorted: side and right can't be set to opposites, got side of left while "
                                "right was True")
    side = side or ("right" if right else "left")
    seq = _host(sorted_sequence)
    if sorter is not None:
        _tensor_arg("searchsorted", "sorter", sorter)
        if tuple(sorter.shape) != seq.shape:
            raise _C.KilnValueError(f"searchsorted: boundary and sorter must have the same size, but got boundary "
                                    f"{list(seq.shape)} and sorter {list(sorter.shape)}")
        if sorter.dtype != _C.dtype.int64:
            raise _C.KilnValueError(f"searchsorted: sorter must be a tensor of long dtype, got {sorter.dtype.name}")
        order = _host(sorter)
        if seq.size and (order.min() < 0 or order.max() >= seq.shape[-1]):
            raise _C.KilnValueError("searchsorted: sorter index out of range")
        seq = np.take_along_axis(seq, order, -1)
    scalar = not isinstance(input, Tensor)
    vals = np.asarray(input) if scalar else _host(input)
    if seq.ndim == 1 or seq.ndim == 0:
        if seq.ndim == 0:
            raise _C.KilnValueError("searchsorted: boundaries tensor should be 1 dimension or the first N-1 "
                                    "dimensions of boundaries tensor and input value tensor must match, but we got "
                                    "a 0-D boundaries tensor")
        idx = np.searchsorted(seq, vals, side=side)
    else:
        if scalar or vals.shape[:-1] != seq.shape[:-1]:
            raise _C.KilnValueError(f"searchsorted: boundaries tensor should be 1 dimension or the first N-1 "
                                    f"dimensions of boundaries tensor and input value tensor must match, but we got "
                                    f"boundaries tensor {list(seq.shape)} and input value tensor "
                                    f"{list(vals.shape)}")
        rows_s, rows_v = seq.reshape(-1, seq.shape[-1]), vals.reshape(-1, vals.shape[-1])
        idx = np.stack([np.searchsorted(s, v, side=side) for s, v in zip(rows_s, rows_v)]) if rows_s.shape[0] \
            else np.zeros(rows_v.shape, np.int64)
        idx = idx.reshape(vals.shape)
    return _search_result(np.asarray(idx), out_int32, sorted_sequence.device)


def histc(input, bins=100, min=0, max=0):
    """torch.histc: counts of input's elements in `bins` equal-width bins over [min, max] (min == max: the
    data's range; still equal: widened by 1 each side); elements outside are ignored, max falls in the last
    bin. Floating tensors only, the counts in input's dtype, as torch's."""
    _tensor_arg("histc", "input", input)
    if not input.dtype.is_floating_point:
        raise _C.KilnValueError(f"histc: expected a floating-point tensor, got {input.dtype.name} (as torch)")
    if bins <= 0:
        raise _C.KilnValueError(f"histc: bins must be > 0, but got {bins}")
    x = _host(input.float() if input.dtype == _C.dtype.float16 else input)
    lo, hi = x.dtype.type(min), x.dtype.type(max)
    if lo == hi and x.size:
        lo, hi = x.min(), x.max()
    if lo == hi:
        lo, hi = lo - 1, hi + 1
    if not (np.isfinite(lo) and np.isfinite(hi)):
        raise _C.KilnValueError(f"histc: range of [{lo}, {hi}] is not finite")
    if lo > hi:
        raise _C.KilnValueError(f"histc: max must be larger than min, got min={min}, max={max}")
    keep = x[(x >= lo) & (x <= hi)]
    # multiplied before dividing, as torch's: a value at an interior bin edge of a range whose width is not 1
    # falls in torch's bin, where dividing first rounded it into another (30 bins over [-1, 2]: float64
    # 0.3 * 3 - 1 = -0.10000000000000009 is bin 8, was 9; float32 0.7 * 3 - 1 = 1.0999999 is bin 20, was 21)
    pos = ((keep - lo) * x.dtype.type(bins) / (hi - lo)).astype(np.int64)
    pos[pos == bins] = bins - 1
    counts = np.bincount(pos, minlength=bins).astype(x.dtype)
    return _C.from_numpy(counts).to(input.dtype).to(input.device)


def _unique_result(vals, inverse, counts, return_inverse, return_counts, input):
    # the values in input's dtype (a bfloat16 input's came back from the host as float32) and device
    out = [_C.from_numpy(np.array(vals)).to(input.device).to(input.dtype)]
    if return_inverse:
        out.append(_C.from_numpy(np.array(inverse.astype(np.int64))).to(input.device))
    if return_counts:
        out.append(_C.from_numpy(np.array(counts.astype(np.int64))).to(input.device))
    return out[0] if len(out) == 1 else tuple(out)


def _unique_dim_sizes(fn, x, d):
    """Refuses a zero-sized dimension other than dim (no slices to tell apart), as torch's."""
    if builtins.any(s == 0 for i, s in enumerate(x.shape) if i != d):
        raise _C.KilnValueError(f"{fn}: input of shape {list(x.shape)} has a 0-sized dimension other than dim {d}, "
                                f"so unique cannot be applied along it (There are 0 sized dimensions, and they "
                                f"aren't selected, as in PyTorch)")


def unique(input, sorted=True, return_inverse=False, return_counts=False, dim=None):
    """torch.unique: the distinct elements (dim=None, flattened) or slices along dim, sorted (sorted=False
    sorts too, which torch allows), with return_inverse (each element's index in the result, input's shape)
    and return_counts; every NaN is distinct, as torch's."""
    _tensor_arg("unique", "input", input)
    x = _host(input)
    if dim is None:
        flat = x.reshape(-1)
        vals, inverse, counts = np.unique(flat, return_inverse=True, return_counts=True, equal_nan=False)
        inverse = inverse.reshape(x.shape)
    else:
        d = _dim(dim, input.dim(), "unique")
        _unique_dim_sizes("unique", x, d)
        if x.shape[d] == 0:
            vals, inverse, counts = x, np.zeros(0, np.int64), np.zeros(0, np.int64)
        else:
            vals, inverse, counts = np.unique(x, return_inverse=True, return_counts=True, axis=d)
            inverse = inverse.reshape(-1)
    return _unique_result(vals, inverse, counts, return_inverse, return_counts, input)


def unique_consecutive(input, return_inverse=False, return_counts=False, dim=None):
    """torch.unique_consecutive: each run of equal consecutive elements (dim=None, flattened) or slices along
    dim kept once, with return_inverse and return_counts."""
    _tensor_arg("unique_consecutive", "input", input)
    x = _host(input)
    if dim is None:
        flat = x.reshape(-1)
        start = np.ones(flat.shape[0], bool)
        start[1:] = flat[1:] != flat[:-1]
        vals, shape = flat[start], x.shape
    else:
        d = _dim(dim, input.dim(), "unique_consecutive")
        _unique_dim_sizes("unique_consecutive", x, d)
        moved = np.moveaxis(x, d, 0).reshape(
            x.shape[d], int(np.prod([s for i, s in enumerate(x.shape) if i != d])))
        start = np.ones(moved.shape[0], bool)
        start[1:] = (moved[1:] != moved[:-1]).any(1)
        vals, shape = np.compress(start, x, axis=d), (x.shape[d],)
    inverse = (np.cumsum(start) - 1).reshape(shape)
    counts = np.diff(np.append(np.flatnonzero(start), start.shape[0]))
    return _unique_result(vals, inverse, counts, return_inverse, return_counts, input)


_INTERPOLATIONS = ("linear", "lower", "higher", "midpoint", "nearest")


def _quantile(fn, input, q, dim, keepdim, interpolation, ignore_nan):
    _tensor_arg(fn, "input", input)
    if input.dtype not in (_C.dtype.float32, _C.dtype.float64):
        raise _C.KilnValueError(f"{fn}: input tensor must be either float or double dtype, got {input.dtype.name}")
    if interpolation not in _INTERPOLATIONS:
        raise _C.KilnValueError(f"{fn}: interpolation must be one of linear, lower, higher, midpoint or nearest. "
                                f"Got {interpolation!r}")
    scalar_q = not isinstance(q, Tensor)
    qs = np.asarray([q], dtype=np.float64) if scalar_q else _host(q).astype(np.float64)
    if not scalar_q:
        if q.dim() > 1:
            raise _C.KilnValueError(f"{fn}: q must be a scalar or 1D tensor, got a {q.dim()}-D tensor")
        if q.dtype != input.dtype:
            raise _C.KilnValueError(f"{fn}: q tensor must be same dtype as the input tensor, got {q.dtype.name} "
                                    f"and {input.dtype.name}")
        scalar_q = q.dim() == 0
        qs = qs.reshape(-1)
    if qs.size and not ((qs >= 0) & (qs <= 1)).all():
        raise _C.KilnValueError(f"{fn}: q values must be in the range [0, 1]")
    if input.numel() == 0:  # as torch's, along any dim
        raise _C.KilnValueError(f"{fn}: input tensor must be non-empty")
    x = input.reshape([-1]) if dim is None else input
    d = -1 if dim is None else _dim(dim, input.dim(), fn)
    if x.dim() == 0:
        x, d = x.reshape([1]), 0
    x = x.movedim(d, -1) if x.dim() else x
    n = x.shape[-1]
    srt = _T["sort"](x, -1)[0]  # NaN sorts last
    nan = _C.isnan(x)
    valid = (n - nan.sum(-1, True)) if ignore_nan else _C.full(list(x.shape[:-1]) + [1], n, dtype=_C.dtype.int64,
                                                                device=x.device)
    last = (valid - 1).clamp(0, None).to(x.dtype)  # (..., 1)
    outs = []
    for qv in (qs if qs.size else [0.0]):  # no q: one computed for its shape, then narrowed away
        rank = last * float(qv)
        if interpolation == "nearest":
            rank = _C.round(rank)
        below = _C.floor(rank).to(_C.dtype.int64)
        above = _C.ceil(rank).to(_C.dtype.int64)
        lo, hi = _C.gather(srt, -1, below), _C.gather(srt, -1, above)
        if interpolation in ("lower", "nearest"):
            v = lo
        elif interpolation == "higher":
            v = hi
        else:
            w = _C.full_like(rank, 0.5) if interpolation == "midpoint" else rank - _C.floor(rank)
            v = _C.lerp(lo, hi, w)
        bad = (valid == 0) if ignore_nan else nan.any(-1, True)
        outs.append(_C.where(bad, _C.full_like(v, math.nan), v).squeeze(-1))
    out = _C.stack(outs, 0)
    if not qs.size:
        out = out.narrow(0, 0, 0)
    if keepdim:
        if dim is None:
            out = out.reshape([out.shape[0]] + [1] * input.dim())
        else:
            out = out.unsqueeze(d + 1 if input.dim() else 1) if input.dim() else out
    return out.squeeze(0) if scalar_q else out


def quantile(input, q, dim=None, keepdim=False, *, interpolation="linear"):
    """torch.quantile: the q-th quantiles (q a number or a 1-D tensor, in [0, 1]; a tensor's quantiles are the
    result's first dim) of all elements or along dim, interpolation linear, lower, higher, midpoint or
    nearest (half to even); a slice holding NaN gives NaN. Float32 and float64 only, as torch's."""
    return _quantile("quantile", input, q, dim, keepdim, interpolation, False)


def nanquantile(input, q, dim=None, keepdim=False, *, interpolation="linear"):
    """torch.nanquantile: quantile ignoring NaN (an all-NaN slice gives NaN)."""
    return _quantile("nanquantile", input, q, dim, keepdim, interpolation, True)


def take_along_dim(input, indices, dim=None):
    """torch.take_along_dim; without dim both tensors are taken flattened."""
    if dim is None:
        _tensor_arg("take_along_dim", "input", input)
        _tensor_arg("take_along_dim", "indices", indices)
        return _c_take_along_dim(input.reshape([-1]), indices.reshape([-1]), 0)
    return _c_take_along_dim(input, indices, dim)


def _new_tensor(self, data, dtype=None, device=None, requires_grad=False):
    """Tensor.new_tensor: a copy of data with this tensor's dtype and device unless given (a tensor's
    values are copied, detached)."""
    if isinstance(data, Tensor):
        data = _host(data)
    from ._tensor import tensor
    return tensor(data, dtype=dtype if dtype is not None else self.dtype,
                  device=device if device is not None else self.device, requires_grad=requires_grad)


def _index_reduce(self, dim, index, source, reduce, *, include_self=True):
    """Tensor.index_reduce: source's slices along dim reduced into self's at index ('prod', 'mean', 'amax'
    or 'amin'; include_self=False leaves self's values out where an index lands), scatter_reduce's
    reductions."""
    if reduce not in ("prod", "mean", "amax", "amin"):
        raise _C.KilnValueError(f"index_reduce: reduce argument must be either prod, mean, amax or amin, got "
                                f"{reduce!r}")
    _tensor_arg("index_reduce", "index", index)
    _tensor_arg("index_reduce", "source", source)
    d = _dim(dim, self.dim(), "index_reduce")
    if index.dim() > 1 or index.dtype not in (_C.dtype.int64, _C.dtype.int32):
        raise _C.KilnValueError(f"index_reduce: index must be a 1-D int64 or int32 tensor, got "
                                f"{index.dtype.name} {list(index.shape)}")
    if source.dim() != builtins.max(self.dim(), 1) and not (self.dim() == 0 and source.dim() <= 1):
        raise _C.KilnValueError(f"index_reduce: source must have the same number of dimensions as self, got "
                                f"{source.dim()} and {self.dim()}")
    src = source.reshape([-1]) if source.dim() == 0 else source
    n = index.numel()
    if self.dim() and (src.shape[d] != n or builtins.any(
            src.shape[i] != self.shape[i] for i in range(self.dim()) if i != d)):
        raise _C.KilnValueError(f"index_reduce: source {list(source.shape)} must be self's shape "
                                f"{list(self.shape)} with {n} (index's length) at dim {d}")
    if source.dtype != self.dtype:
        raise _C.KilnValueError(f"index_reduce: self and source must have the same dtype, got {self.dtype.name} "
                                f"and {source.dtype.name}")
    view = [1] * src.dim()
    view[d] = -1
    idx = index.to(_C.dtype.int64).reshape(view).expand(list(src.shape))
    base = self.reshape([1]) if self.dim() == 0 else self
    out = _C.scatter_reduce(base, d, idx, src, reduce, include_self=include_self)
    return out.reshape([]) if self.dim() == 0 else out


# ---- kiln.special ----
def _logit(input, eps=None):
    """torch.special.logit: log(p / (1 - p)); with eps >= 0, p below eps taken as eps and p above 1 - eps as
    1 - eps, element by element as torch's kernel (not torch.clamp: with eps > 0.5 every p is moved, to eps
    below eps and to 1 - eps from eps up). The gradient is 1 / (p (1 - p)) where p is kept (eps <= p <= 1 - eps,
    the ends included) and 0 where it is moved, as torch's."""
    x = input if input.dtype.is_floating_point else input.to(_C.dtype.float32)
    if eps is not None and eps >= 0:
        lo, hi = eps, 1 - eps
        x = _C.where(x < lo, _C.full_like(x, lo), _C.where(x > hi, _C.full_like(x, hi), x))
    return _C.log(x / (1 - x))


def _xlog1py(input, other):
    """torch.special.xlog1py: input * log1p(other), 0 where input is 0 (unless other is NaN)."""
    return _xlog("xlog1py", input, other, _C.log1p, -1)


def _entr(input):
    """torch.special.entr: -x log x for x > 0, 0 at 0, -inf below 0, NaN for NaN. The gradient at 0 is 0
    (torch's is -inf)."""
    x = input if input.dtype.is_floating_point else input.to(_C.dtype.float32)
    pos = x > 0
    val = -x * _C.log(_C.where(pos, x, _C.ones_like(x)))
    out = _C.where(pos, val, _C.where(x == 0, _C.zeros_like(x), _C.full_like(x, -math.inf)))
    return _C.where(_C.isnan(x), x, out)


def _sinc(input):
    """torch.special.sinc: sin(pi x) / (pi x), 1 at 0 (gradient 0 there)."""
    x = input if input.dtype.is_floating_point else input.to(_C.dtype.float32)
    zero = x == 0
    px = _C.where(zero, _C.ones_like(x), x) * math.pi
    return _C.where(zero, _C.ones_like(x), _C.sin(px) / px)


def _ndtr(input):
    """torch.special.ndtr: the standard normal CDF, erfc(-x / sqrt(2)) / 2."""
    x = input if input.dtype.is_floating_point else input.to(_C.dtype.float32)
    return 0.5 * _C.erfc(x * (-1 / math.sqrt(2)))


def _softmax_dtype(fn):
    def wrapped(input, dim, *, dtype=None):
        return fn(input if dtype is None else input.to(dtype), dim)
    wrapped.__doc__ = f"torch.special.{fn.__name__}: kiln.{fn.__name__}, dtype= converting the input first."
    return wrapped


def mvlgamma(input, p):
    """torch.mvlgamma: the log of the multivariate gamma function of dimension p, sum_j lgamma(x - j/2)
    (j = p-1 .. 0) + p (p - 1) / 4 log(pi), elementwise (inf where an lgamma meets a pole, as torch's; torch
    2.x no longer refuses x <= (p - 1) / 2)."""
    if input.dtype == _C.dtype.bool:
        raise _C.KilnValueError("mvlgamma: the input tensor may not be a boolean tensor")
    if isinstance(p, builtins.bool) or not isinstance(p, numbers.Integral):
        raise TypeError(f"mvlgamma(): argument 'p' must be int, not {type(p).__name__}")
    if p < 1:
        raise _C.KilnValueError(f"mvlgamma: p is {p}; p has to be greater than or equal to 1")
    x = input if input.dtype.is_floating_point else input.to(_C.dtype.float32)
    out = None
    for j in builtins.range(p - 1, -1, -1):
        term = _C.lgamma(x - j * 0.5 if j else x)
        out = term if out is None else out + term
    return out + p * (p - 1) * 0.25 * math.log(math.pi)


def _polygamma_method(self, n):
    """Tensor.polygamma(n): torch's argument order, the tensor first."""
    return _C.polygamma(n, self)


Tensor.mvlgamma = mvlgamma
Tensor.mvlgamma_ = _inplace("mvlgamma_", mvlgamma)
Tensor.polygamma = _polygamma_method
Tensor.polygamma_ = _inplace("polygamma_", _polygamma_method)
for _name in ("lgamma", "digamma", "i0"):
    setattr(Tensor, _name, _as_method(getattr(_C, _name)))
    setattr(Tensor, _name + "_", _inplace(_name + "_", getattr(_C, _name)))
__all__ += ["mvlgamma"]

special = types.ModuleType("kiln.special", "torch.special's functions that Kiln has: expit, logit, erf, erfc, "
                                           "erfinv, erfcx, xlogy, xlog1py, entr, sinc, ndtr, ndtri, log_ndtr, "
                                           "gammaln, digamma, psi, polygamma, multigammaln, i0, i0e, i1, i1e, "
                                           "round, exp2, expm1, log1p, log_softmax, softmax, logsumexp.")
special.gammaln, special.digamma, special.psi, special.polygamma = _C.lgamma, _C.digamma, _C.digamma, _C.polygamma
special.multigammaln = mvlgamma
special.i0, special.i0e, special.i1, special.i1e = _C.i0, _C.i0e, _C.i1, _C.i1e
special.ndtri, special.log_ndtr, special.erfcx = _C.ndtri, _C.log_ndtr, _C.erfcx
special.expit = _C.sigmoid
special.logit = _logit
special.erf, special.erfc, special.erfinv = _C.erf, _C.erfc, _C.erfinv
special.xlogy = xlogy
special.xlog1py = _xlog1py
special.entr = _entr
special.sinc = _sinc
special.ndtr = _ndtr
special.round = _C.round
special.exp2, special.expm1, special.log1p = _C.exp2, _C.expm1, _C.log1p
special.log_softmax = _softmax_dtype(_C.log_softmax)
special.softmax = _softmax_dtype(_C.softmax)
special.logsumexp = _C.logsumexp
sys.modules[special.__name__] = special


# ---- kiln.linalg ----
def _float_only(fn, x):
    _tensor_arg(fn, "input", x)
    if not x.dtype.is_floating_point:
        raise _C.KilnValueError(f"linalg.{fn}: Expected a floating point tensor as input. Got {x.dtype.name}")


def vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None):
    """torch.linalg.vector_norm: the ord-norm of all elements (dim None), or over dim (an int or a tuple):
    ord inf (max |x|), -inf (min |x|), 0 (the count of nonzeros), any other p (sum |x|^p)^(1/p)."""
    _float_only("vector_norm", x)
    if dtype is not None:
        x = x.to(dtype)
    if isinstance(ord, str) or not isinstance(ord, numbers.Real):
        raise TypeError(f"linalg.vector_norm(): argument 'ord' must be a number, not {type(ord).__name__}")
    dims = None if dim is None else ([dim] if isinstance(dim, numbers.Integral) else list(dim))
    if dims == []:
        dims = None
    a = _C.abs(x)
    if ord == math.inf or ord == -math.inf:
        if x.numel() == 0 and (dims is None or builtins.any(x.shape[i] == 0 for i in dims)):
            raise _C.KilnValueError(f"linalg.vector_norm: Expected a non-empty tensor for ord={ord}")
        return (_C.amax if ord > 0 else _C.amin)(a, dims, keepdim)
    if ord == 0:
        return _C.ne(x, 0).to(x.dtype).sum(dims, keepdim) if dims is not None else \
            _T["sum"](_C.ne(x, 0).to(x.dtype)).reshape([1] * x.dim() if keepdim else [])
    if ord == 1:
        return a.sum(dims, keepdim) if dims is not None else (
            _T["sum"](a).reshape([1] * x.dim()) if keepdim else _T["sum"](a))
    if ord == 2:
        if dims is None:
            out = _C.norm(x.reshape([-1]), 2, 0, False)
            return out.reshape([1] * x.dim()) if keepdim else out
        return _C.norm(x, 2, dims if len(dims) > 1 else dims[0], keepdim)
    # (sum |x|^p)^(1/p) with the zeros masked, so their gradient is 0 as torch's rather than NaN: |x|^p of a
    # zero is 0 (p > 0) or inf (p < 0, making the norm 0) with no gradient, and a zero sum (p > 0) gives 0
    zero = a == 0
    safe = _C.where(zero, _C.ones_like(a), a)
    powered = _C.where(zero, _C.full_like(a, 0.0 if ord > 0 else math.inf), _C.pow(safe, float(ord)))
    s = powered.sum(dims, keepdim) if dims is not None else _T["sum"](powered)
    if ord > 0:
        s_zero = s == 0
        out = _C.where(s_zero, _C.zeros_like(s), _C.pow(_C.where(s_zero, _C.ones_like(s), s), 1.0 / ord))
    else:
        out = _C.pow(s, 1.0 / ord)
    return out.reshape([1] * x.dim()) if keepdim and dims is None else out


def matrix_norm(A, ord="fro", dim=(-2, -1), keepdim=False, *, dtype=None):
    """torch.linalg.matrix_norm for ord 'fro', 1, -1, inf and -inf over the two dims, and 'nuc', 2 and -2 from the
    singular values (linalg.svdvals)."""
    _float_only("matrix_norm", A)
    if dtype is not None:
        A = A.to(dtype)
    dims = list(dim)
    if len(dims) != 2:
        raise _C.KilnValueError(f"linalg.matrix_norm: dim must be a 2-tuple. Got {tuple(dims)}")
    if A.dim() < 2:
        raise _C.KilnValueError(f"linalg.matrix_norm: The input tensor A must have at least 2 dimensions, got "
                                f"{A.dim()}")
    d0, d1 = _dim(dims[0], A.dim(), "linalg.matrix_norm"), _dim(dims[1], A.dim(), "linalg.matrix_norm")
    if d0 == d1:
        raise _C.KilnValueError(f"linalg.matrix_norm: dims must be different. Got ({dims[0]}, {dims[1]})")
    if ord == "fro":
        return vector_norm(A, 2, (d0, d1), keepdim)
    if ord in ("nuc", 2, -2):
        # from the singular values (kiln._linalg_spectral's svdvals) of A with d0, d1 moved last
        from ._linalg_spectral import svdvals
        lo, hi = builtins.min(d0, d1), builtins.max(d0, d1)
        s = svdvals(_T["movedim"](A, [d0, d1], [-2, -1]))
        if ord == -2 and s.shape[-1] == 0:
            raise _C.KilnValueError(f"linalg.matrix_norm(ord=-2): the smallest singular value of an empty matrix "
                                    f"({A.shape[d0]} by {A.shape[d1]}) is undefined (as torch's amin refusal)")
        if ord == "nuc" or s.shape[-1] == 0:  # an empty matrix's 2-norm is 0 (the empty sum), as torch's
            out = s.sum([-1], False)
        else:
            out = (_C.amax if ord == 2 else _C.amin)(s, [-1], False)
        return out.unsqueeze(lo).unsqueeze(hi) if keepdim else out
    if ord not in (1, -1, math.inf, -math.inf):
        raise _C.KilnValueError(f"linalg.matrix_norm: Order {ord} not supported.")
    # 1 / -1: max / min column sum (over rows, d0); inf / -inf: max / min row sum (over columns, d1)
    sum_dim, red_dim = (d0, d1) if ord in (1, -1) else (d1, d0)
    s = _C.abs(A).sum([sum_dim], True)
    out = (_C.amax if ord > 0 else _C.amin)(s, [red_dim], True)
    return out if keepdim else out.squeeze(builtins.max(d0, d1)).squeeze(builtins.min(d0, d1))


def norm(A, ord=None, dim=None, keepdim=False, *, dtype=None):
    """torch.linalg.norm: a matrix norm when ord is a string or dim a 2-tuple (or A 2-D with ord given and no
    dim), otherwise a vector norm (ord None: the 2-norm of all elements, flattened)."""
    _float_only("norm", A)
    if dim is not None and not isinstance(dim, numbers.Integral):
        dim = tuple(dim)
        if len(dim) == 2:
            return matrix_norm(A, "fro" if ord is None else ord, dim, keepdim, dtype=dtype)
        if len(dim) != 1:
            raise _C.KilnValueError(f"linalg.norm: If dim is specified, it must be of length 1 or 2. Got {dim}")
    if ord is not None and dim is None:
        if A.dim() == 2:
            return matrix_norm(A, ord, (-2, -1), keepdim, dtype=dtype)
        if A.dim() != 1:
            raise _C.KilnValueError(f"linalg.norm: If dim is not specified but ord is, the input must be 1D or "
                                    f"2D. Got {A.dim()}D.")
    if isinstance(ord, str):
        raise _C.KilnValueError(f"linalg.norm: ord={ord!r} is a matrix norm and needs a 2-D input or a 2-tuple "
                                f"dim")
    return vector_norm(A, 2 if ord is None else ord, dim, keepdim, dtype=dtype)


def cross(input, other, *, dim=-1):
    """torch.linalg.cross: the cross product of 3-vectors along dim (the operands broadcast)."""
    _tensor_arg("linalg.cross", "input", input)
    _tensor_arg("linalg.cross", "other", other)
    shape = list(np.broadcast_shapes(tuple(input.shape), tuple(other.shape)))
    a, b = input.expand(shape), other.expand(shape)
    d = _dim(dim, len(shape), "linalg.cross")
    if input.dim() != other.dim():
        raise _C.KilnValueError(f"linalg.cross: inputs must have the same number of dimensions, got {input.dim()} "
                                f"and {other.dim()}")
    if shape[d] != 3 or input.shape[d] != 3 or other.shape[d] != 3:
        raise _C.KilnValueError(f"linalg.cross: inputs dimension {dim} must have length 3. Got "
                                f"{input.shape[d]} and {other.shape[d]}")
    a0, a1, a2 = (a.narrow(d, i, 1) for i in range(3))
    b0, b1, b2 = (b.narrow(d, i, 1) for i in range(3))
    return _C.cat([a1 * b2 - a2 * b1, a2 * b0 - a0 * b2, a0 * b1 - a1 * b0], d)


def vecdot(x, y, *, dim=-1):
    """torch.linalg.vecdot: the dot product of x and y (broadcast) along dim."""
    _tensor_arg("linalg.vecdot", "x", x)
    _tensor_arg("linalg.vecdot", "y", y)
    if x.dtype != y.dtype:
        raise _C.KilnValueError(f"linalg.vecdot: Expected x and y to have the same dtype, but found x of type "
                                f"{x.dtype.name} and y of type {y.dtype.name} instead")
    return (x * y).sum([dim], False)


def _matrix_product(a, b):
    """a @ b; integer matrices (which the engine's matmul refuses) as the broadcast product summed over the
    inner dimension, in their dtype (wrapping around as torch's)."""
    if a.dtype.is_floating_point:
        return _C.matmul(a, b)
    # over blocks of the inner dimension: the broadcast product of the whole of it is n x k x m per matrix
    # (1000 x 1000 int64: 8 GB); a block's is at most about _PRODUCT_BLOCK_ELEMENTS elements
    k = a.shape[-1]
    rows_cols = builtins.max(1, a.numel() // builtins.max(1, k)) * b.shape[-1]
    block = builtins.max(1, builtins.min(k, _PRODUCT_BLOCK_ELEMENTS // builtins.max(1, rows_cols)))
    out = None
    for start in range(0, k, block):
        size = builtins.min(block, k - start)
        part = (a.narrow(-1, start, size).unsqueeze(-1) * b.narrow(-2, start, size).unsqueeze(-3)).sum([-2], False)
        out = part if out is None else out + part
    if out is None:  # k == 0: zeros, as the empty sum
        return (a.unsqueeze(-1) * b.unsqueeze(-3)).sum([-2], False).to(a.dtype)
    return out.to(a.dtype)


_PRODUCT_BLOCK_ELEMENTS = 1 << 24


def matrix_power(A, n):
    """torch.linalg.matrix_power: A^n by repeated squaring (n = 0 the identity), floating or integer (not bool,
    as torch's); a negative n inverts A first (linalg.inv, _linalg_lu.py: floating A only, as torch's)."""
    _tensor_arg("linalg.matrix_power", "A", A)
    if A.dtype == _C.dtype.bool:
        raise _C.KilnValueError("linalg.matrix_power: A must be a floating-point or integer tensor, got bool (as "
                                "torch)")
    if A.dim() < 2:
        raise _C.KilnValueError("linalg.matrix_power: The input tensor A must have at least 2 dimensions.")
    if A.shape[-1] != A.shape[-2]:
        raise _C.KilnValueError(f"linalg.matrix_power: A must be batches of square matrices, but they are "
                                f"{A.shape[-2]} by {A.shape[-1]} matrices")
    if not isinstance(n, numbers.Integral) or isinstance(n, builtins.bool):
        raise TypeError(f"linalg.matrix_power(): argument 'n' must be an int, not {type(n).__name__}")
    if n < 0:
        if not A.dtype.is_floating_point:
            raise _C.KilnValueError(f"linalg.matrix_power: n={n} < 0 inverts A (linalg.inv): Expected a floating "
                                    f"point tensor as input. Got {A.dtype.name}")
        from ._linalg_lu import inv  # noqa: PLC0415 (_linalg_lu imports this module)
        A, n = inv(A), -n
    if n == 0:
        # the identity, its gradient to A zeros (not None), as torch's
        return _C.eye(A.shape[-1], dtype=A.dtype, device=A.device).expand(list(A.shape)) + _dropped(A, A)
    result, base = None, A
    while n:
        if n & 1:
            result = base if result is None else _matrix_product(result, base)
        n >>= 1
        if n:
            base = _matrix_product(base, base)
    return result if result is not A else A.clone()


def _linalg_diagonal(A, *, offset=0, dim1=-2, dim2=-1):
    """torch.linalg.diagonal: kiln.diagonal with dim1=-2, dim2=-1 by default."""
    return _C.diagonal(A, offset, dim1, dim2)


linalg = types.ModuleType("kiln.linalg", """torch.linalg in Kiln, f32 and f64 (matrix_power also integer),
batched over the leading dims, with torch's signatures and gradients.
Norms and products (here, _math.py): vector_norm, matrix_norm ('fro', 'nuc', 1, -1, 2, -2, inf, -inf), norm,
cross, vecdot, matrix_power (a negative n through inv), diagonal.
LU and Cholesky decompositions and their solves (_linalg_lu.py): lu_factor, lu_solve, solve, inv, det, slogdet,
cholesky, cholesky_ex, solve_triangular.
Spectral decompositions and what is built on them (_linalg_spectral.py): eigh, eigvalsh, svd, svdvals, qr, pinv,
lstsq, matrix_rank, cond.""")
linalg.vector_norm, linalg.matrix_norm, linalg.norm = vector_norm, matrix_norm, norm
linalg.cross, linalg.vecdot, linalg.matrix_power, linalg.diagonal = cross, vecdot, matrix_power, _linalg_diagonal
sys.modules[linalg.__name__] = linalg


def _install():
    for fn in (histc, diff, kron, unique, unique_consecutive, quantile, nanquantile, logcumsumexp, trace,
               diag_embed, rot90, hypot, xlogy, aminmax, take_along_dim, true_divide):
        setattr(Tensor, fn.__name__, _as_method(fn))
    Tensor.new_tensor = _new_tensor
    Tensor.index_reduce = _index_reduce
    Tensor.index_reduce_ = _inplace("index_reduce_", _index_reduce)
    Tensor.xlogy_ = _inplace("xlogy_", xlogy)
    Tensor.hypot_ = _inplace("hypot_", hypot)


_install()


# ---- more of torch's functions research code calls: factories, products, NaN-aware reductions, number
# functions, statistics; written with the engine's ops (autograd differentiates them where torch does) or,
# for the integer- and bit-valued ones without a gradient (gcd, lcm, nextafter, frexp's exponent), NumPy ----

for _name, _fields in (("nanmedian", ["values", "indices"]), ("frexp", ["mantissa", "exponent"])):
    _t = collections.namedtuple(_name, _fields)
    _t.__module__, _t.__qualname__ = "kiln.return_types", _name
    setattr(return_types, _name, _t)


def _factory_dtype(dtype):
    return _C.dtype.float32 if dtype is None else _C.empty([0], dtype=dtype).dtype


def _number_arg(fn, name, x):
    if isinstance(x, Tensor):
        if x.numel() != 1:
            raise _C.KilnValueError(f"{fn}: {name} must be a number or a one-element tensor, got a tensor of shape "
                                    f"{list(x.shape)}")
        return x.item()
    if not _is_number(x) or isinstance(x, complex):
        raise TypeError(f"{fn}(): argument '{name}' must be a number, not {type(x).__name__}")
    return x


def _steps_arg(fn, steps):
    if not isinstance(steps, numbers.Integral) or isinstance(steps, builtins.bool):
        raise TypeError(f"{fn}(): argument 'steps' must be an int, not {type(steps).__name__}")
    if steps < 0:
        raise _C.KilnValueError(f"{fn}: number of steps must be non-negative, got steps={steps}")
    return int(steps)


def _linspace_host(start, end, steps, step_t):
    """torch's linspace kernel on the host: step = (end - start) / (steps - 1) in step_t (the dtype, or float64
    for an integer dtype); the first half start + i * step, the second end - (steps - 1 - i) * step."""
    s, e = step_t(start), step_t(end)
    i = np.arange(steps, dtype=step_t)
    if steps == 1:
        return np.full([1], s, dtype=step_t)
    step = step_t((e - s) / step_t(steps - 1))
    half = steps // 2
    return np.where(i < half, s + step * i, e - step * (step_t(steps - 1) - i)).astype(step_t)


def linspace(start, end, steps, *, dtype=None, device=None, requires_grad=False):
    """torch.linspace: steps values from start to end evenly spaced (both included), float32 unless dtype is
    given, computed as torch's kernel (in the dtype; float64 for an integer dtype, then truncated)."""
    start, end = _number_arg("linspace", "start", start), _number_arg("linspace", "end", end)
    steps = _steps_arg("linspace", steps)
    dt = _factory_dtype(dtype)
    step_t = np.float64 if dt == _C.dtype.float64 or not dt.is_floating_point else np.float32
    with np.errstate(invalid="ignore", over="ignore"):
        values = _linspace_host(start, end, steps, step_t)
    out = _C.from_numpy(np.ascontiguousarray(values)).to(dt)
    out = out.to(device) if device is not None else out
    return out.requires_grad_(True) if requires_grad else out


def logspace(start, end, steps, base=10.0, *, dtype=None, device=None, requires_grad=False):
    """torch.logspace: base ** linspace(start, end, steps), float32 unless dtype is given."""
    start, end = _number_arg("logspace", "start", start), _number_arg("logspace", "end", end)
    base = _number_arg("logspace", "base", base)
    steps = _steps_arg("logspace", steps)
    dt = _factory_dtype(dtype)
    step_t = np.float64 if dt == _C.dtype.float64 or not dt.is_floating_point else np.float32
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        values = np.power(step_t(base), _linspace_host(start, end, steps, step_t)).astype(step_t)
    out = _C.from_numpy(np.ascontiguousarray(values)).to(dt)
    out = out.to(device) if device is not None else out
    return out.requires_grad_(True) if requires_grad else out


def as_tensor(data, dtype=None, device=None):
    """torch.as_tensor: data itself when it is a tensor of that dtype and device (else converted, keeping its
    graph); a writable NumPy array of a Kiln dtype shares its memory on the CPU; anything else is copied
    (kiln.tensor)."""
    if isinstance(data, Tensor):
        dt = None if dtype is None else _C.empty([0], dtype=dtype).dtype
        out = data if dt is None or data.dtype == dt else data.to(dt)
        return out if device is None else out.to(device)
    if isinstance(data, np.ndarray) and data.flags.writeable and data.dtype.byteorder in "=|" and (
            dtype is None and device is None) and data.dtype.kind in "biuf":
        try:
            return _C.from_numpy(data)
        except (ValueError, _C.KilnError):
            pass  # strides or a dtype Kiln does not share: a copy
    from ._tensor import tensor
    return tensor(data, dtype=dtype, device=device)


def asarray(obj, *, dtype=None, device=None, copy=None, requires_grad=False):
    """torch.asarray: obj itself where it is a tensor (or a NumPy array's memory) that needs no conversion and
    copy is not True; copy=True always copies; copy=False refuses (ValueError) where a copy is needed."""
    from ._tensor import tensor
    if isinstance(obj, Tensor):
        dt = None if dtype is None else _C.empty([0], dtype=dtype).dtype
        converts = (dt is not None and dt != obj.dtype) or (device is not None and str(_C.empty(
            [0], device=device).device) != str(obj.device))
        if copy is False and converts:
            raise ValueError(f"asarray: obj ({obj.dtype.name} on {obj.device}) needs a copy to become "
                             f"{dt.name if dt is not None else obj.dtype.name} on {device or obj.device}, and "
                             f"copy=False")
        out = obj.to(dtype=dt or obj.dtype, device=device or obj.device) if converts else obj
        if copy and out is obj:
            out = obj.clone()
    elif isinstance(obj, np.ndarray) and not copy:
        out = as_tensor(obj, dtype=dtype, device=device)
        if copy is False and (str(out.device) != "cpu" or not np.shares_memory(obj, _numpy(out))):
            raise ValueError(f"asarray: the {obj.dtype} array needs a copy to become a tensor of dtype {dtype} on "
                             f"{device or 'cpu'}, and copy=False")
    else:
        if copy is False:
            raise ValueError(f"asarray: a {type(obj).__name__} cannot be shared without a copy, and copy=False")
        out = tensor(obj, dtype=dtype, device=device)
    if requires_grad and not out.requires_grad:  # (a tensor that does not is a leaf)
        out.requires_grad_(True)
    return out


def _vector_arg(fn, name, t):
    _tensor_arg(fn, name, t)
    if t.dim() != 1:
        raise _C.KilnValueError(f"{fn}: {name} must be 1-D, but got a {t.dim()}-D tensor of shape {list(t.shape)}")


def outer(input, vec2):
    """torch.outer (torch.ger): input[i] * vec2[j], both 1-D, in their promoted dtype."""
    _vector_arg("outer", "input", input)
    _vector_arg("outer", "vec2", vec2)
    return input.unsqueeze(1) * vec2.unsqueeze(0)


def ger(input, vec2):
    """torch.ger: outer."""
    return outer(input, vec2)


def dot(input, other):
    """torch.dot: the sum of input * other, both 1-D of one size and one dtype (as torch: no promotion)."""
    _vector_arg("dot", "input", input)
    _vector_arg("dot", "other", other)
    if input.dtype != other.dtype:
        raise _C.KilnError(f"dot: expected both vectors to have same dtype, but found {input.dtype.name} and "
                           f"{other.dtype.name}")
    if input.shape[0] != other.shape[0]:
        raise _C.KilnError(f"dot: inconsistent tensor size, expected input [{input.shape[0]}] and other "
                           f"[{other.shape[0]}] to have the same number of elements")
    if input.dtype == _C.dtype.bool:
        raise _C.KilnError("dot: not implemented for bool, as torch")
    return _T["sum"](input * other)


def vdot(input, other):
    """torch.vdot for real tensors: dot (the conjugate of a real vector is itself)."""
    return dot(input, other)


def _dims_list(fn, dims, n, name):
    out = []
    for d in dims:
        if not isinstance(d, numbers.Integral) or isinstance(d, builtins.bool):
            raise TypeError(f"{fn}(): dims must be ints, got {type(d).__name__} in {name}'s")
        out.append(_dim(int(d), n, fn))
    if len(set(out)) != len(out):
        raise _C.KilnError(f"{fn}: dim {out} appears multiple times in the list of dims of {name}")
    return out


def tensordot(a, b, dims=2, out=None):
    """torch.tensordot: the sum over a's dims[0] and b's dims[1] (dims an int: a's last dims and b's first
    dims), the rest of a's dims then the rest of b's; in their promoted dtype."""
    _tensor_arg("tensordot", "a", a)
    _tensor_arg("tensordot", "b", b)
    if out is not None:
        raise TypeError("tensordot(): out= is not supported by Kiln")
    if isinstance(dims, Tensor):
        dims = dims.tolist()
    if isinstance(dims, numbers.Integral) and not isinstance(dims, builtins.bool):
        if dims < 0:
            raise _C.KilnError(f"tensordot: expects dims >= 0, but got dims={dims}")
        if dims > a.dim() or dims > b.dim():
            raise _C.KilnError(f"tensordot: expects dims <= the number of dims of a ({a.dim()}) and b "
                               f"({b.dim()}), but got dims={dims}")
        da, db = list(range(a.dim() - dims, a.dim())), list(range(dims))
    elif isinstance(dims, (list, tuple)) and len(dims) == 2:
        da = [dims[0]] if isinstance(dims[0], numbers.Integral) else list(dims[0])
        db = [dims[1]] if isinstance(dims[1], numbers.Integral) else list(dims[1])
        if len(da) != len(db):
            raise _C.KilnError(f"tensordot: both dimension lists should have same length, got {len(da)} and "
                               f"{len(db)}")
        da, db = _dims_list("tensordot", da, a.dim(), "a"), _dims_list("tensordot", db, b.dim(), "b")
    else:
        raise TypeError(f"tensordot(): argument 'dims' must be an int or a pair of lists of ints, not {dims!r}")
    for i, j in zip(da, db):
        if a.shape[i] != b.shape[j]:
            raise _C.KilnError(f"tensordot: contracted dimensions need to match, but first has size {a.shape[i]} "
                               f"in dim {i} and second has size {b.shape[j]} in dim {j}")
    dt = _C.result_type(a, b)
    a, b = a.to(dt), b.to(dt)
    free_a = [d for d in range(a.dim()) if d not in da]
    free_b = [d for d in range(b.dim()) if d not in db]
    k = math.prod(a.shape[d] for d in da)
    ma = a.permute(free_a + da).reshape([math.prod(a.shape[d] for d in free_a), k])
    mb = b.permute(db + free_b).reshape([k, math.prod(b.shape[d] for d in free_b)])
    return _matrix_product(ma, mb).reshape([a.shape[d] for d in free_a] + [b.shape[d] for d in free_b])


def inner(input, other):
    """torch.inner: the sum over the last dim of both (a 0-dim operand multiplies), shape input.shape[:-1] +
    other.shape[:-1]."""
    _tensor_arg("inner", "input", input)
    _tensor_arg("inner", "other", other)
    if input.dim() == 0 or other.dim() == 0:
        return input * other
    if input.shape[-1] != other.shape[-1]:
        raise _C.KilnError(f"inner: inner() the last dimension must match on both input tensors but got shapes "
                           f"{list(input.shape)} and {list(other.shape)}")
    return tensordot(input, other, ([input.dim() - 1], [other.dim() - 1]))


def masked_select(input, mask):
    """torch.masked_select: input's elements where the bool mask is True (the two broadcast), 1-D."""
    _tensor_arg("masked_select", "input", input)
    _tensor_arg("masked_select", "mask", mask)
    if mask.dtype != _C.dtype.bool:
        raise _C.KilnError(f"masked_select: expected BoolTensor for mask, got {mask.dtype.name}")
    shape = list(_C.broadcast_shapes(list(input.shape), list(mask.shape)))
    return input.expand(shape)[mask.expand(shape)]


def _repeats_array(fn, repeats, n):
    r = _host(repeats).astype(np.int64).reshape([-1]) if isinstance(repeats, Tensor) else np.asarray([repeats])
    if isinstance(repeats, Tensor) and (repeats.dim() > 1 or repeats.dtype.is_floating_point or
                                        repeats.dtype == _C.dtype.bool):
        raise _C.KilnError(f"{fn}: repeats must be a 0-dim or 1-D integer tensor, got {repeats.dtype.name} of shape "
                           f"{list(repeats.shape)}")
    if (r < 0).any():
        raise _C.KilnError(f"{fn}: repeats can not be negative, got {r[r < 0][0]}")
    if r.size == 1:
        r = np.full([n], r[0], dtype=np.int64)
    elif r.size != n:
        raise _C.KilnError(f"{fn}: repeats must have the same size as input along dim, but got repeats.size(0) = "
                           f"{r.size} and input.size({n})")
    return r


def repeat_interleave(input, repeats=None, dim=None, *, output_size=None):
    """torch.repeat_interleave: each element (slice along dim; input flattened without dim) repeated repeats
    times, repeats an int or a tensor with one count per slice; repeat_interleave(counts) alone gives
    arange's indices repeated by counts."""
    _tensor_arg("repeat_interleave", "input", input)
    if repeats is None:  # the one-argument form: counts
        if input.dim() > 1 or input.dtype.is_floating_point or input.dtype == _C.dtype.bool:
            raise _C.KilnError(f"repeat_interleave: repeats must be a 0-dim or 1-D integer tensor, got "
                               f"{input.dtype.name} of shape {list(input.shape)}")
        r = _repeats_array("repeat_interleave", input, builtins.max(1, input.numel()))
        return _C.from_numpy(np.repeat(np.arange(r.size, dtype=np.int64), r)).to(input.device)
    if isinstance(repeats, numbers.Integral) and not isinstance(repeats, builtins.bool):
        pass
    elif not isinstance(repeats, Tensor):
        raise TypeError(f"repeat_interleave(): argument 'repeats' must be an int or a kiln.Tensor, not "
                        f"{type(repeats).__name__}")
    x = input.reshape([-1]) if dim is None else input
    d = 0 if dim is None else _dim(dim, input.dim(), "repeat_interleave")
    if x.dim() == 0:
        x = x.reshape([1])
    r = _repeats_array("repeat_interleave", repeats, x.shape[d])
    total = int(r.sum())
    if output_size is not None and output_size != total:
        raise _C.KilnError(f"repeat_interleave: allocated size does not match required size: output_size="
                           f"{output_size}, the repeats sum to {total}")
    index = _C.from_numpy(np.repeat(np.arange(x.shape[d], dtype=np.int64), r)).to(input.device)
    return _C.index_select(x, d, index)


def take(input, index):
    """torch.take: input as if flattened, at index (int64; negative counts from the end), index's shape."""
    _tensor_arg("take", "input", input)
    _tensor_arg("take", "index", index)
    if index.dtype != _C.dtype.int64:
        raise _C.KilnError(f"take: expected a long tensor for index, but got {index.dtype.name}")
    n = input.numel()
    flat = index.reshape([-1])
    if flat.numel():
        lo, hi = int(_T["min"](flat).item()), int(_T["max"](flat).item())
        for i in (lo, hi):
            if not -n <= i < n:
                raise _C.KilnIndexError(f"take: out of range: tried to access index {i} on a tensor of {n} "
                                        f"elements")
    flat = _C.where(flat < 0, flat + n, flat)
    return _C.index_select(input.reshape([-1]), 0, flat).reshape(list(index.shape))


def argwhere(input):
    """torch.argwhere: the indices of the non-zero elements, one row each, [count, input.dim()]."""
    _tensor_arg("argwhere", "input", input)
    return _C.nonzero(input)


_NAN_TO_ZERO = []


def _nan_zeroed(x):
    """x with NaN as 0; its gradient grad * (x is not NaN), a product as torch's nansum's (an inf or NaN
    gradient at a NaN gives NaN there, not 0: nanmean of an all-NaN row)."""
    if not x.dtype.is_floating_point:
        return x
    if not _NAN_TO_ZERO:
        from .autograd import Function

        class NanToZero(Function):
            @staticmethod
            def forward(ctx, t):
                keep = _C.logical_not(_C.isnan(t))
                ctx.save_for_backward(keep)
                return _C.where(keep, t, _C.zeros([], dtype=t.dtype, device=t.device))

            @staticmethod
            def backward(ctx, grad):
                (keep,) = ctx.saved_tensors
                return grad * keep.to(grad.dtype)
        _NAN_TO_ZERO.append(NanToZero)
    return _NAN_TO_ZERO[0].apply(x) if x.requires_grad else _C.where(
        _C.isnan(x), _C.zeros([], dtype=x.dtype, device=x.device), x)


def nansum(input, dim=None, keepdim=False, *, dtype=None):
    """torch.nansum: sum treating NaN as 0 (its gradient 0 there)."""
    _tensor_arg("nansum", "input", input)
    x = _nan_zeroed(input)
    if dtype is not None:
        x = x.to(dtype)
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        s = _T["sum"](x)
        return s.reshape([1] * input.dim()) if keepdim else s
    return x.sum(dim if isinstance(dim, (list, tuple)) else [dim], keepdim)


def nanmean(input, dim=None, keepdim=False, *, dtype=None):
    """torch.nanmean: the mean of the non-NaN elements (NaN where there are none); floating input only."""
    _tensor_arg("nanmean", "input", input)
    if not input.dtype.is_floating_point and dtype is None:
        raise _C.KilnError(f"nanmean(): expected input to have floating point dtype but got {input.dtype.name}")
    kept = _C.logical_not(_C.isnan(input))
    count = nansum(kept.to(dtype or input.dtype), dim, keepdim)
    return nansum(input, dim, keepdim, dtype=dtype) / count


def _all_nan_index(n):
    """The index torch.nanmedian returns along a dim of n NaNs: its CPU kernel runs std::nth_element with nth at
    position (0 - 1) / 2 == 0 over the indices 0..n-1, all equivalent under its comparator, and returns what
    libstdc++'s introselect leaves first: each round over a range longer than 3 swaps the middle to the front
    (median of three among equals) and partitions by swapping pairs from both ends inward, keeping the lower
    part; an insertion sort of the last 3 or fewer moves nothing (0 for n <= 3, 2 for 4 and 5, 3 for 6, 5
    for 7)."""
    idx = list(range(n))
    first, last = 0, n
    while last - first > 3:
        mid = first + (last - first) // 2
        idx[first], idx[mid] = idx[mid], idx[first]
        lo, hi = first + 1, last
        while True:  # __unguarded_partition with a comparator that is always false
            hi -= 1
            if not lo < hi:
                break
            idx[lo], idx[hi] = idx[hi], idx[lo]
            lo += 1
        last = lo  # the cut is past nth (position 0): keep [first, cut)
    return idx[first]


def nanmedian(input, dim=None, keepdim=False):
    """torch.nanmedian: the median of the non-NaN elements (the lower of the two middle ones; NaN where all
    are NaN); with dim, (values, indices) as torch.return_types.nanmedian."""
    _tensor_arg("nanmedian", "input", input)
    if dim is None:
        x = input.reshape([-1])
        if x.numel() == 0:
            return _C.full([], float("nan"), dtype=input.dtype, device=input.device)
        return nanmedian(x, 0)[0]
    d = _dim(dim, input.dim(), "nanmedian")
    x = input if input.dim() else input.reshape([1])
    if x.shape[d] == 0:
        raise _C.KilnIndexError(f"nanmedian(): Expected reduction dim {d} to have non-zero size")
    srt, order = _T["sort"](x, d)  # NaN sorts last
    if x.dtype.is_floating_point:
        count = _C.logical_not(_C.isnan(x)).to(_C.dtype.int64).sum([d], True)
    else:
        count = _C.full([1] * x.dim(), x.shape[d], dtype=_C.dtype.int64, device=x.device)
    # the lower middle of the non-NaN values; where all are NaN, the index torch's CPU kernel leaves first
    pos = _C.where(count == 0, _C.full([], _all_nan_index(x.shape[d]), dtype=_C.dtype.int64, device=x.device),
                   (count - 1) // 2)
    pos = pos.expand([*x.shape[:d], 1, *x.shape[d + 1:]])
    values, indices = _C.gather(srt, d, pos), _C.gather(order, d, pos)
    if not keepdim or input.dim() == 0:
        values, indices = values.squeeze(d), indices.squeeze(d)
    return return_types.nanmedian(values, indices)


_SIGN_VIEW = {_C.dtype.float64: _C.dtype.int64, _C.dtype.float32: _C.dtype.int32,
              _C.dtype.float16: _C.dtype.int16, _C.dtype.bfloat16: _C.dtype.int16}


def signbit(input):
    """torch.signbit: whether the sign bit is set (True for -0.0 and a negative NaN; False for unsigned and
    bool)."""
    _tensor_arg("signbit", "input", input)
    if input.dtype in _SIGN_VIEW:
        bits = _C._view_dtype(input.detach().contiguous(), _SIGN_VIEW[input.dtype])
        return bits < 0
    if input.dtype in (_C.dtype.bool, _C.dtype.uint8):
        return _C.zeros(list(input.shape), dtype=_C.dtype.bool, device=input.device)
    return input < 0


def _float_result(fn, *ts):
    dt = _C.result_type(*ts) if builtins.len(ts) > 1 else ts[0].dtype
    return dt if dt.is_floating_point else _C.dtype.float32


def copysign(input, other):
    """torch.copysign: input's magnitude with other's sign (its sign bit: -0.0 counts as negative), floating;
    the gradient to input is sign(result / input) (0 where input is 0), to other zeros, as torch's."""
    if not isinstance(input, Tensor) and not isinstance(other, Tensor):
        raise TypeError(f"copysign(): argument 'input' must be a kiln.Tensor, not {type(input).__name__}")
    if not isinstance(other, Tensor):
        other = _C.full([], other, dtype=_C.dtype.float64 if isinstance(other, builtins.float) else
                        _C.dtype.int64, device=input.device)
        dt = _float_result("copysign", input)
    else:
        _tensor_arg("copysign", "input", input)
        dt = _float_result("copysign", input, other)
    x = input.to(dt)
    negative = signbit(other)
    mag = _C.abs(x)
    out = _C.where(negative, -mag, mag)
    if isinstance(other, Tensor) and other.requires_grad and other.dtype.is_floating_point:
        out = out + _dropped(other, out)
    return out


def logit(input, eps=None):
    """torch.logit (torch.special.logit): log(p / (1 - p)), p moved into [eps, 1 - eps] where eps >= 0 is given
    (its gradient 0 where moved, 1 / (p (1 - p)) at the ends; eps > 0.5 as torch's, element by element); an
    integer input gives float32."""
    _tensor_arg("logit", "input", input)
    return _logit(input, eps)


def _host_binary(fn, input, other, compute, check):
    if not isinstance(input, Tensor) and not isinstance(other, Tensor):
        raise TypeError(f"{fn}(): argument 'input' must be a kiln.Tensor, not {type(input).__name__}")
    ref = input if isinstance(input, Tensor) else other
    a = input if isinstance(input, Tensor) else _wrapped(input, other)
    b = other if isinstance(other, Tensor) else _wrapped(other, input)
    dt = _C.result_type(a, b)
    check(dt)
    shape = list(_C.broadcast_shapes(list(a.shape), list(b.shape)))
    host_dt = _numpy(_C.empty([0], dtype=dt)).dtype
    with np.errstate(all="ignore"):  # converted on the host: the engine's casts flush subnormals
        host = np.asarray(compute(_host(a).astype(host_dt), _host(b).astype(host_dt)))
    out = _C.from_numpy(np.ascontiguousarray(np.broadcast_to(host, shape)).astype(host.dtype)).to(dt)
    return out.to(ref.device)


def _integer_only(fn):
    def check(dt):
        if dt.is_floating_point or dt == _C.dtype.bool:
            raise _C.KilnError(f"{fn}: not implemented for {dt.name} (integer tensors only, as torch)")
    return check


def gcd(input, other):
    """torch.gcd: the greatest common divisor, element by element, of integer tensors (non-negative)."""
    return _host_binary("gcd", input, other, np.gcd, _integer_only("gcd"))


def lcm(input, other):
    """torch.lcm: the least common multiple, element by element, of integer tensors (non-negative; 0 with a
    0)."""
    return _host_binary("lcm", input, other, np.lcm, _integer_only("lcm"))


def heaviside(input, values):
    """torch.heaviside: 0 where input < 0 (and NaN), values where input == 0, 1 where input > 0; input and
    values of one dtype, as torch's; no gradient (torch has none)."""
    _tensor_arg("heaviside", "input", input)
    _tensor_arg("heaviside", "values", values)
    if input.dtype != values.dtype:
        raise _C.KilnError(f"heaviside is not yet implemented for tensors with different dtypes: input "
                           f"{input.dtype.name}, values {values.dtype.name}")
    x, v = input.detach(), values.detach()
    return _C.where(x == 0, v, (x > 0).to(x.dtype))


def _beta_alpha(fn, input, product, beta, alpha):
    """beta * input + alpha * product, as addmm: beta=0 ignores input (NaN too, its gradient zeros), alpha=0
    the product."""
    shape = list(product.shape)
    try:
        fits = list(_C.broadcast_shapes(list(input.shape), shape)) == shape
    except Exception:
        fits = False
    if not fits:
        raise _C.KilnError(f"{fn}: input {list(input.shape)} cannot be broadcast to the product's shape {shape}")
    dt = _C.result_type(input, product)
    if not dt.is_floating_point and dt != _C.dtype.bool:
        # integer tensors keep their dtype, as torch's: addr refuses a float or bool beta/alpha, addmv and
        # addbmm convert them to the integer type (truncated towards zero: beta=1.5 is 1, 0.5 is 0)
        if fn == "addr":
            for name, v in (("beta", beta), ("alpha", alpha)):
                if isinstance(v, builtins.bool):
                    raise _C.KilnError(f"addr: Boolean {name} only supported for Boolean results, got {name}={v} "
                                       f"for {dt.name} tensors")
                if isinstance(v, builtins.float):
                    raise _C.KilnError(f"addr: For integral input tensors, argument {name} must not be a floating "
                                       f"point number, got {name}={v} for {dt.name} tensors")
        else:
            beta, alpha = builtins.int(beta), builtins.int(alpha)
    return _scaled_sum(input, product, beta, alpha)


def _same_dtype(fn, **ts):
    dts = {t.dtype for t in ts.values()}
    if len(dts) > 1:
        raise _C.KilnError(f"{fn}: expected " + ", ".join(ts) + " to have the same dtype, but got " +
                           ", ".join(t.dtype.name for t in ts.values()))


def addmv(input, mat, vec, *, beta=1, alpha=1):
    """torch.addmv: beta * input + alpha * (mat @ vec), mat 2-D, vec 1-D."""
    for name, t in (("input", input), ("mat", mat), ("vec", vec)):
        _tensor_arg("addmv", name, t)
    if mat.dim() != 2 or vec.dim() != 1 or input.dim() > 1:
        raise _C.KilnError(f"addmv: vector + matrix @ vector expected, got {input.dim()}, {mat.dim()}, {vec.dim()}")
    if mat.shape[1] != vec.shape[0]:
        raise _C.KilnError(f"addmv: size mismatch, got input ({input.shape[0] if input.dim() else 1}), mat "
                           f"({mat.shape[0]}x{mat.shape[1]}), vec ({vec.shape[0]})")
    _same_dtype("addmv", input=input, mat=mat, vec=vec)
    return _beta_alpha("addmv", input, _matrix_product(mat, vec.unsqueeze(1)).squeeze(1), beta, alpha)


def addr(input, vec1, vec2, *, beta=1, alpha=1):
    """torch.addr: beta * input + alpha * outer(vec1, vec2)."""
    for name, t in (("input", input), ("vec1", vec1), ("vec2", vec2)):
        _tensor_arg("addr", name, t)
    for name, t in (("vec1", vec1), ("vec2", vec2)):
        if t.dim() != 1:
            raise _C.KilnError(f"addr: expected 1-D argument {name}, but got {t.dim()}-D")
    return _beta_alpha("addr", input, outer(vec1, vec2), beta, alpha)


def addbmm(input, batch1, batch2, *, beta=1, alpha=1):
    """torch.addbmm: beta * input + alpha * the sum over the batch of batch1[i] @ batch2[i]."""
    for name, t in (("input", input), ("batch1", batch1), ("batch2", batch2)):
        _tensor_arg("addbmm", name, t)
    if batch1.dim() != 3 or batch2.dim() != 3:
        raise _C.KilnError(f"addbmm: batch1 and batch2 must be 3-D tensors, got {batch1.dim()}-D and "
                           f"{batch2.dim()}-D")
    if batch1.shape[0] != batch2.shape[0] or batch1.shape[2] != batch2.shape[1]:
        raise _C.KilnError(f"addbmm: batch1 {list(batch1.shape)} and batch2 {list(batch2.shape)} do not multiply "
                           f"(same batch size, batch1.size(2) == batch2.size(1))")
    _same_dtype("addbmm", input=input, batch1=batch1, batch2=batch2)
    product = _matrix_product(batch1, batch2).sum([0], False)
    return _beta_alpha("addbmm", input, product, beta, alpha)


def renorm(input, p, dim, maxnorm):
    """torch.renorm: each slice along dim whose p-norm exceeds maxnorm scaled to norm maxnorm (by
    maxnorm / (norm + 1e-7), as torch's)."""
    _tensor_arg("renorm", "input", input)
    if not input.dtype.is_floating_point:
        raise _C.KilnError(f"renorm: expected a floating point input, got {input.dtype.name}")
    if not p > 0:
        raise _C.KilnError(f"renorm: non-positive-norm not supported, got p={p}")
    if maxnorm < 0:
        raise _C.KilnError(f"renorm: expected maxnorm to be >= 0 but got {maxnorm}")
    if input.dim() <= 1:
        raise _C.KilnError(f"renorm: input needs at least 2 dimensions, got {input.dim()} dimensions")
    d = _dim(dim, input.dim(), "renorm")
    others = [i for i in range(input.dim()) if i != d]
    norm = vector_norm(input, p, others, True)
    one = _C.ones([], dtype=input.dtype, device=input.device)
    factor = _C.where(norm > maxnorm, maxnorm / (norm + 1e-7), one)
    return input * factor


def cov(input, *, correction=1, fweights=None, aweights=None):
    """torch.cov: the covariance of input's rows (variables) over its columns (observations), 1-D input one
    variable; fweights (integer frequencies) and aweights (weights) as torch's."""
    _tensor_arg("cov", "input", input)
    if input.dim() > 2:
        raise _C.KilnError(f"cov(): expected input to have two or fewer dimensions but got an input with "
                           f"{input.dim()} dimensions")
    x = input.reshape([1, -1]) if input.dim() < 2 else input
    if not x.dtype.is_floating_point:
        x = x.to(_C.dtype.float32)
    n = x.shape[1]
    w = None
    if fweights is not None:
        _tensor_arg("cov", "fweights", fweights)
        if fweights.dim() > 1 or fweights.numel() != n:
            raise _C.KilnError(f"cov(): expected fweights to have one dimension and {n} elements, got shape "
                               f"{list(fweights.shape)}")
        if fweights.dtype.is_floating_point or fweights.dtype == _C.dtype.bool:
            raise _C.KilnError(f"cov(): expected fweights to have integral dtype, got {fweights.dtype.name}")
        if fweights.numel() and bool(_T["min"](fweights).item() < 0):
            raise _C.KilnError("cov(): fweights cannot be negative")
        w = fweights.reshape([-1]).to(x.dtype)
    if aweights is not None:
        _tensor_arg("cov", "aweights", aweights)
        if aweights.dim() > 1 or aweights.numel() != n:
            raise _C.KilnError(f"cov(): expected aweights to have one dimension and {n} elements, got shape "
                               f"{list(aweights.shape)}")
        if not aweights.dtype.is_floating_point:
            raise _C.KilnError(f"cov(): expected aweights to have floating point dtype, got {aweights.dtype.name}")
        if aweights.numel() and bool(_T["min"](aweights).item() < 0):
            raise _C.KilnError("cov(): aweights cannot be negative")
        aw = aweights.reshape([-1]).to(x.dtype)
        w = aw if w is None else w * aw
    if w is None:
        w_sum = _C.full([], n, dtype=x.dtype, device=x.device)
        avg = _T["mean"](x, [1], True) if n else _T["sum"](x, [1], True) / 0.0
    else:
        w_sum = _T["sum"](w)
        avg = _T["sum"](x * w, [1], True) / w_sum
    if w is None:
        norm_factor = w_sum - correction
    elif correction == 0:
        norm_factor = w_sum
    elif aweights is None:
        norm_factor = w_sum - correction
    else:
        norm_factor = w_sum - correction * _T["sum"](w * aw) / w_sum
    norm_factor = _C.clamp(norm_factor, 0, None)
    xm = x - avg
    c = _matrix_product(xm * w if w is not None else xm, xm.transpose(0, 1)) / norm_factor
    return c.reshape([]) if c.shape[0] == 1 else c  # torch squeezes: one variable gives a 0-dim result


def corrcoef(input):
    """torch.corrcoef: the Pearson correlation coefficients of input's rows (cov normalised by the standard
    deviations, clipped to [-1, 1])."""
    _tensor_arg("corrcoef", "input", input)
    c = cov(input)
    if c.dim() == 0:
        return c / c
    d = _C.diagonal(c, 0, 0, 1)
    std = _C.sqrt(d)
    c = c / std.unsqueeze(1)
    c = c / std.unsqueeze(0)
    return _C.clamp(c, -1, 1)


def vander(x, N=None, increasing=False):
    """torch.vander: the columns x ** (N - 1), ..., x ** 0 (increasing: the other order), by cumprod as
    torch's; integer and bool x give int64."""
    _tensor_arg("vander", "x", x)
    if x.dim() != 1:
        raise _C.KilnError(f"vander: x must be a one-dimensional tensor, got {x.dim()}-D")
    if N is None:
        N = x.shape[0]
    if N < 0:
        raise _C.KilnError(f"vander: N must be non-negative, got N={N}")
    dt = x.dtype if x.dtype.is_floating_point else _C.dtype.int64
    xs = x.to(dt)
    ones = _C.ones([x.shape[0], builtins.min(N, 1)], dtype=dt, device=x.device)
    if N > 1:
        rest = _C.cumprod(xs.unsqueeze(1).expand([x.shape[0], N - 1]), 1)
        out = _C.cat([ones, rest], 1)
    else:
        out = ones
    return out if increasing else _C.flip(out, [1])


def frexp(input):
    """torch.frexp: (mantissa, exponent) with input = mantissa * 2 ** exponent, |mantissa| in [0.5, 1)
    (0, inf and NaN keep theirs with exponent 0); exponent int32; the mantissa's gradient is
    grad / 2 ** exponent, as torch's."""
    _tensor_arg("frexp", "input", input)
    if not input.dtype.is_floating_point:
        raise _C.KilnError(f"torch.frexp() only supports floating-point dtypes, got {input.dtype.name}")
    host = _host(input.detach())
    host_mantissa, exponent = np.frexp(host)
    exponent = exponent.astype(np.int32)
    # divided by 2 ** exponent in two exact steps, 2 ** (exponent // 2) then the rest: 2 ** exponent itself
    # overflows the dtype near its largest values (2 ** 16 in float16, 2 ** 128 in float32 and bfloat16,
    # 2 ** 1024 in float64), which made the mantissa 0 there
    half = exponent // 2
    mantissa = input
    for part in (half, exponent - half):
        power = _C.from_numpy(np.ascontiguousarray(np.ldexp(np.ones_like(part, dtype=np.float64), part)))
        mantissa = mantissa / power.to(input.dtype).to(input.device)
    tiny = np.abs(host) < np.finfo(host.dtype if input.dtype != _C.dtype.float16 else np.float16).tiny
    if input.dtype == _C.dtype.bfloat16:
        tiny = np.abs(host) < np.finfo(np.float32).tiny
    tiny &= host != 0
    if tiny.any():  # subnormals, which the engine's arithmetic flushes to 0: the host's mantissa (no gradient)
        mantissa = _C.where(_C.from_numpy(np.ascontiguousarray(tiny)).to(input.device),
                            _C.from_numpy(np.ascontiguousarray(host_mantissa)).to(input.dtype).to(input.device),
                            mantissa)
    return return_types.frexp(
        mantissa, _C.from_numpy(np.ascontiguousarray(exponent)).to(input.device))


def ldexp(input, other):
    """torch.ldexp: input * 2 ** other in the dtype of input and other promoted (an integer exponent keeps
    input's float16/bfloat16; integers alone give float32), as torch's. Computed in float32 (16-bit results)
    or float64 with the exponent clamped and split in three, so that no factor overflows before the product
    does (1e-30 * 2 ** 200 is 1.6e30 in float32, not inf)."""
    _tensor_arg("ldexp", "input", input)
    if not isinstance(other, Tensor):
        raise TypeError(f"ldexp(): argument 'other' must be a kiln.Tensor, not {type(other).__name__}")
    dt = _float_result("ldexp", input, other)
    narrow = dt in (_C.dtype.float16, _C.dtype.bfloat16)
    work = _C.dtype.float32 if narrow else _C.dtype.float64
    # past +-limit the product is 0 or inf whatever the finite input (log2 spans: float32 from -149 to 128,
    # which holds the 16-bit types, float64 from -1074 to 1024); each third stays inside the work dtype's range
    limit = 300 if narrow else 2200
    e = _C.clamp(other.to(work), -limit, limit)
    third = _C.trunc(e.detach() / 3)
    out = input.to(work)
    for part in (third, third, e - 2 * third):  # the last part carries a float exponent's fraction and gradient
        out = out * pow(2.0, part)
    return out.to(dt)


def nextafter(input, other):
    """torch.nextafter: the next floating-point value after input towards other, in their promoted dtype,
    float32, float64 or float16 (not bfloat16, which torch has and NumPy lacks); no gradient (torch has
    none)."""
    _tensor_arg("nextafter", "input", input)
    _tensor_arg("nextafter", "other", other)

    def check(dt):
        if dt not in (_C.dtype.float32, _C.dtype.float64, _C.dtype.float16):
            raise _C.KilnError(f"nextafter: not implemented for {dt.name} (float32, float64 and float16 in Kiln)")
    return _host_binary("nextafter", input.detach(), other.detach(), np.nextafter, check)


__all__ += ["linspace", "logspace", "as_tensor", "asarray", "outer", "ger", "dot", "vdot", "inner", "tensordot",
            "masked_select", "repeat_interleave", "take", "argwhere", "nansum", "nanmean", "nanmedian", "signbit",
            "copysign", "logit", "gcd", "lcm", "heaviside", "addmv", "addr", "addbmm", "renorm", "cov", "corrcoef",
            "vander", "frexp", "ldexp", "nextafter"]


def _install_more():
    for fn in (outer, ger, dot, vdot, inner, masked_select, repeat_interleave, take, argwhere, nansum, nanmean,
               nanmedian, signbit, copysign, logit, gcd, lcm, heaviside, addmv, addr, addbmm, renorm, cov,
               corrcoef, frexp, ldexp, nextafter):
        setattr(Tensor, fn.__name__, _as_method(fn))
    for fn in (copysign, logit, gcd, lcm, heaviside, addmv, addr, addbmm, renorm, ldexp, nextafter):
        setattr(Tensor, fn.__name__ + "_", _inplace(fn.__name__ + "_", fn))


_install_more()
