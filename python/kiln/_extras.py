"""Small torch APIs over the engine's ops: Tensor.fill_diagonal_, clamp_min/clamp_max, the unary in-place
methods (exp_, sqrt_, pow_, ...), kiln.clip, logaddexp, addmm, cdist, get_rng_state/set_rng_state,
kiln.device and kiln.cuda.is_available. Each is torch's function written with Kiln's ops, so autograd
differentiates it as it does them; the in-place forms follow Kiln's rule for in-place ops (refused on a
tensor that requires grad, outside kiln.no_grad(), naming the method)."""
import builtins
import numbers
import sys
import types

import numpy as np

from . import _C
from ._C import Tensor, Device
from ._tensor import _clamp_named, _inplace

__all__ = ["clip", "clamp_min", "clamp_max", "logaddexp", "addmm", "cdist", "get_rng_state", "set_rng_state",
           "device", "cuda"]


def clamp_min(input, min):
    """torch.clamp_min: clamp(input, min=min)."""
    return _C.clamp(input, min, None)


def clamp_max(input, max):
    """torch.clamp_max: clamp(input, max=max)."""
    return _C.clamp(input, None, max)


clip = _C.clamp  # torch.clip is torch.clamp


def logaddexp(input, other):
    """log(exp(input) + exp(other)) without overflow, as torch.logaddexp: max + log1p(exp(-|input - other|)),
    equal infinities giving themselves (-inf for two -inf, not NaN)."""
    for arg, t in (("input", input), ("other", other)):
        if not isinstance(t, Tensor):
            raise TypeError(f"logaddexp(): argument '{arg}' must be a kiln.Tensor, not {type(t).__name__}")
    m = _C.maximum(input, other)
    same = input == other  # equal infinities: their difference is NaN, their logaddexp themselves
    diff = _C.where(same, _C.zeros_like(m), _C.abs(input - other))
    return m + _C.log1p(_C.exp(-diff))


def _dropped(t, like):
    """0 in like's shape where t is ignored (torch's beta=0 and alpha=0): t's NaN and inf do not reach the
    result, and t's gradient is zeros, not None, as torch's."""
    none = _C.zeros(list(like.shape), dtype=_C.dtype.bool, device=like.device)
    return _C.where(none, t, _C.zeros_like(like))


def addmm(input, mat1, mat2, *, beta=1, alpha=1):
    """beta * input + alpha * (mat1 @ mat2), as torch.addmm (mat1, mat2 2-D; input must broadcast to the
    result's (n, p)); with beta=0 input is ignored, NaN and inf in it too, and its gradient is zeros, as
    torch's; with alpha=0 so is mat1 @ mat2 (inf in mat1 gives input, not NaN)."""
    if not isinstance(input, Tensor):
        raise TypeError(f"addmm(): argument 'input' must be a kiln.Tensor, not {type(input).__name__}")
    for arg, t in (("mat1", mat1), ("mat2", mat2)):
        if not isinstance(t, Tensor) or t.dim() != 2:
            got = f"a {t.dim()}-D tensor" if isinstance(t, Tensor) else type(t).__name__
            raise _C.KilnValueError(f"addmm: {arg} must be a 2-D matrix, got {got}")
    if not input.dtype == mat1.dtype == mat2.dtype:
        raise _C.KilnError(f"addmm: input, mat1 and mat2 must have the same dtype, as in torch, got "
                           f"{input.dtype.name}, {mat1.dtype.name} and {mat2.dtype.name}")
    out = _C.matmul(mat1, mat2)
    n_p = (mat1.shape[0], mat2.shape[1])
    try:
        fits = input.dim() <= 2 and np.broadcast_shapes(tuple(input.shape), n_p) == n_p
    except ValueError:
        fits = False
    if not fits:
        raise _C.KilnValueError(f"addmm: input {list(input.shape)} cannot be broadcast to the product's shape "
                                f"{list(n_p)} (mat1 {list(mat1.shape)} @ mat2 {list(mat2.shape)})")
    return _scaled_sum(input, out, beta, alpha)


def _scaled_sum(input, product, beta, alpha):
    """beta * input + alpha * product as torch's add-product family (addmm, addmv, addr, addbmm): a
    zero factor drops its term, NaN and inf included, with a zero gradient."""
    if alpha == 0:
        product = _dropped(product, product)
    elif alpha != 1:
        product = product * alpha
    if beta == 0:
        return product + _dropped(input, product)
    return product + (input if beta == 1 else input * beta)


def cdist(x1, x2, p=2.0, compute_mode="use_mm_for_euclid_dist_if_necessary"):
    """The p-norm distance of each row of x1 (..., P, M) to each row of x2 (..., R, M): (..., P, R), as
    torch.cdist (batch dims broadcast), values and gradients: 0 where two rows are equal; for 0 < p < 1 a
    coordinate where the rows agree contributes 0 (not NaN); for p=inf each coordinate tied at the maximum
    gets sign(difference), as torch's. For p=2 with more than 25 rows on either side (compute_mode
    'use_mm_for_euclid_dist_if_necessary', torch's default) or with 'use_mm_for_euclid_dist' the distance is
    torch's matrix-product form sqrt(max(|a|^2 + |b|^2 - 2 a.b, 0)), without the (..., P, R, M) difference
    tensor; 'donot_use_mm_for_euclid_dist' always takes the difference."""
    for arg, t in (("x1", x1), ("x2", x2)):
        if not isinstance(t, Tensor) or t.dim() < 2:
            got = f"a {t.dim()}-D tensor" if isinstance(t, Tensor) else type(t).__name__
            raise _C.KilnValueError(f"cdist: {arg} must be at least 2-D (..., rows, features), got {got}")
    if x1.shape[-1] != x2.shape[-1]:
        raise _C.KilnValueError(f"cdist: x1 and x2 must have the same number of columns (features): x1 "
                                f"{list(x1.shape)}, x2 {list(x2.shape)}")
    if not x1.dtype.is_floating_point or not x2.dtype.is_floating_point:
        raise _C.KilnValueError(f"cdist: only floating-point tensors are supported, got {x1.dtype.name} and "
                                f"{x2.dtype.name}")
    if x1.dtype != x2.dtype:
        raise _C.KilnValueError(f"cdist: x1 and x2 must have the same dtype, got {x1.dtype.name} and "
                                f"{x2.dtype.name} (as torch: convert one first)")
    p = float(p)
    if not p >= 0:
        raise _C.KilnValueError(f"cdist: p value for the p-norm distance must be >= 0, got {p}")
    if compute_mode not in ("use_mm_for_euclid_dist_if_necessary", "use_mm_for_euclid_dist",
                            "donot_use_mm_for_euclid_dist"):
        raise _C.KilnValueError(f"cdist: {compute_mode!r} is not a valid value for compute_mode")
    if x1.shape[-1] == 0:
        batch = list(np.broadcast_shapes(tuple(x1.shape[:-2]), tuple(x2.shape[:-2])))
        return _C.zeros(batch + [x1.shape[-2], x2.shape[-2]], dtype=x1.dtype, device=x1.device)
    if p == 2 and (compute_mode == "use_mm_for_euclid_dist" or (
            compute_mode == "use_mm_for_euclid_dist_if_necessary" and (x1.shape[-2] > 25 or x2.shape[-2] > 25))):
        # torch's _euclidean_dist: |a|^2 + |b|^2 - 2 a.b, clamped at 0 (rounding can take it below), its
        # square root 0 with gradient 0 where it is 0 (torch's clamp_min(1e-30) passes none there)
        sq = (x1 * x1).sum(-1, True) + (x2 * x2).sum(-1, True).transpose(-1, -2) \
            - 2 * _C.matmul(x1, x2.transpose(-1, -2))
        # NaN stays NaN (torch's clamp_min keeps it; `sq > 0` alone made a NaN distance 0)
        pos = sq > 0
        return _C.where(pos, _C.sqrt(_C.where(pos, sq, _C.ones_like(sq))),
                        _C.where(sq != sq, sq, _C.zeros_like(sq)))
    diff = x1.unsqueeze(-2) - x2.unsqueeze(-3)  # (..., P, R, M)
    # rows at distance 0 give 0 with gradient 0, as torch's (the p-norm's own is 0 / 0 there for p other
    # than 1 and 2): their differences are replaced by ones before the norm
    zero = (diff == 0).all(-1, True)
    safe = _C.where(zero, _C.ones_like(diff), diff)
    if p == float("inf"):
        # max |d|, its gradient sign(d) at every coordinate tied at the maximum (torch's), not shared
        a = _C.abs(safe)
        top = a.detach().amax(-1, True)
        tied = a.detach() == top
        dist = (top + _C.where(tied, a - a.detach(), _C.zeros_like(a)).sum(-1, True)).squeeze(-1)
    elif 0 < p < 1:
        # sum |d|^p with |d| taken as 1 where d is 0 and its term masked to 0: |d|^p's derivative is
        # infinite at 0 (times 0: NaN), torch's is 0 there
        nz = safe != 0
        a = _C.abs(_C.where(nz, safe, _C.ones_like(safe)))
        dist = _C.pow(_C.where(nz, _C.pow(a, p), _C.zeros_like(a)).sum(-1, False), 1.0 / p)
    else:
        dist = _C.norm(safe, p, -1, False)
    return _C.where(zero.squeeze(-1), _C.zeros_like(dist), dist)


def _fill_diagonal_values(self, fill_value, wrap=False):
    if self.dim() < 2:
        raise _C.KilnValueError(f"fill_diagonal_: dimensions must be larger than 1, got a {self.dim()}-D tensor")
    if self.dim() > 2 and len(set(self.shape)) != 1:
        raise _C.KilnValueError(f"fill_diagonal_: all dimensions of input must be of equal length, got "
                                f"{list(self.shape)}")
    mask = np.zeros(tuple(self.shape), dtype=bool)
    np.fill_diagonal(mask, True, wrap=builtins.bool(wrap))  # torch's positions, wrap included, are NumPy's
    return _C.masked_fill(self, _C.from_numpy(mask).to(self.device), fill_value)


def get_rng_state():
    """The default generator's state as a uint8 tensor (its Philox seed and offset, 16 bytes), as
    torch.get_rng_state: set_rng_state(state) later makes the next draws repeat the ones after this."""
    seed, offset = _C._rng_state()
    return _C.from_numpy(np.frombuffer(np.array([seed, offset], dtype="<u8").tobytes(), dtype=np.uint8).copy())


def set_rng_state(new_state):
    """Restores a state get_rng_state() gave (a uint8 tensor of 16 bytes), as torch.set_rng_state."""
    if not isinstance(new_state, Tensor) or new_state.dtype != _C.dtype.uint8 or list(new_state.shape) != [16]:
        got = (f"{new_state.dtype.name} {list(new_state.shape)}" if isinstance(new_state, Tensor)
               else type(new_state).__name__)
        raise _C.KilnValueError(f"set_rng_state: new_state must be the uint8 tensor of 16 bytes that "
                                f"kiln.get_rng_state() gives (seed and offset), got {got}")
    seed, offset = np.frombuffer(new_state.cpu().numpy().tobytes(), dtype="<u8")
    if offset % 4:
        raise _C.KilnValueError(f"set_rng_state: the state's offset {int(offset)} is not a multiple of 4: not a "
                                f"state kiln.get_rng_state() gave")
    _C._set_rng_state(int(seed), int(offset))


class _DeviceType(type):
    def __instancecheck__(cls, obj):
        return isinstance(obj, Device)


class device(metaclass=_DeviceType):
    """torch.device: kiln.device("cpu"), kiln.device("cuda", 0), kiln.device("cuda:1"), kiln.device(0) (cuda:0,
    as torch's), kiln.device("cpu", 0) give a kiln.Device (isinstance(d, kiln.device) holds for any
    kiln.Device). A Device always has an index: "cuda" is cuda:0 (index 0, torch's has None and prints
    "cuda"), "cpu" has index 0 and prints "cpu" (torch's "cpu:0" prints its index)."""

    def __new__(cls, type, index=None):
        if isinstance(type, Device):
            if index is not None:
                raise TypeError("device(): an index cannot be given with a device")
            return type
        if isinstance(type, numbers.Integral) and not isinstance(type, builtins.bool):
            if index is not None:
                raise TypeError("device(): an index cannot be given with a device ordinal")
            if type < 0:
                raise _C.KilnValueError(f"device(): device ordinal must be non-negative, got {type}")
            return Device(f"cuda:{int(type)}")  # torch.device(0) is cuda:0
        if not isinstance(type, str):
            raise TypeError(f"device(): argument 'type' must be a str, not {builtins.type(type).__name__}")
        if index is not None:
            if ":" in type:
                raise _C.KilnValueError(f"device(): type (string) must not include an index because index was "
                                        f"passed explicitly: {type}")
            if not isinstance(index, numbers.Integral) or isinstance(index, builtins.bool) or index < 0:
                raise _C.KilnValueError(f"device(): index must be a non-negative int, got {index!r}")
            if type in ("cpu", "meta"):
                # Kiln's CPU and meta devices are one each, index 0 (torch's "cpu:0" prints its index)
                if index != 0:
                    raise _C.KilnValueError(f"device(): Kiln has one {type} device, index 0; got index {index}")
                return Device(type)
            type = f"{type}:{index}"
        return Device(type)


def _cuda_is_available():
    """Whether a CUDA device is visible to this build (torch.cuda.is_available)."""
    return _C.cuda_device_count() > 0


def _cuda_device_count():
    """CUDA devices visible (torch.cuda.device_count)."""
    return _C.cuda_device_count()


cuda = types.ModuleType("kiln.cuda", "torch.cuda's queries: is_available(), device_count(), synchronize().")
cuda.is_available = _cuda_is_available
cuda.device_count = _cuda_device_count


def _cuda_synchronize(device=None):
    """Waits for the work queued on a CUDA device (torch.cuda.synchronize): device None (device 0), an int,
    a "cuda"/"cuda:N" string or a CUDA kiln.device; a CPU device is refused."""
    if device is None:
        device = 0
    if isinstance(device, str):
        device = Device(device)
    if isinstance(device, Device):
        if device.type != "cuda":
            raise _C.KilnValueError(f"cuda.synchronize: expected a CUDA device, got {str(device)!r}")
        device = device.index
    if not isinstance(device, numbers.Integral) or isinstance(device, builtins.bool):
        raise TypeError(f"cuda.synchronize(): argument 'device' must be a kiln.device, str or int, not "
                        f"{type(device).__name__}")
    _C.cuda_synchronize(int(device))


cuda.synchronize = _cuda_synchronize
# a module in sys.modules, as torch.cuda: `import kiln.cuda` and `from kiln.cuda import is_available` work
sys.modules[cuda.__name__] = cuda

_UNARY = ("exp", "sqrt", "log", "abs", "sigmoid", "tanh", "sin", "cos", "rsqrt", "reciprocal", "log1p", "expm1",
          "floor", "ceil", "round", "trunc", "frac", "sign", "relu", "erf")


def _clamp_inplace(name, side):
    """Tensor.clamp_min_ / clamp_max_: clamp_ with one bound, its in-place refusals naming name."""
    clamp = _clamp_named(name)

    def method(self, bound):
        return clamp(self, bound, None) if side == "min" else clamp(self, None, bound)
    method.__name__ = name
    return method


def _install():
    for name in _UNARY:
        setattr(Tensor, name + "_", _inplace(name + "_", getattr(_C, name)))
    Tensor.pow_ = _inplace("pow_", _C.pow)
    Tensor.clamp_min = lambda self, min: clamp_min(self, min)
    Tensor.clamp_max = lambda self, max: clamp_max(self, max)
    Tensor.clamp_min_ = _clamp_inplace("clamp_min_", "min")
    Tensor.clamp_max_ = _clamp_inplace("clamp_max_", "max")
    Tensor.logaddexp = lambda self, other: logaddexp(self, other)
    Tensor.addmm = lambda self, mat1, mat2, *, beta=1, alpha=1: addmm(self, mat1, mat2, beta=beta, alpha=alpha)
    Tensor.fill_diagonal_ = _inplace("fill_diagonal_", _fill_diagonal_values)


_install()
