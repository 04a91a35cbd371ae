"""kiln.nn.init: torch.nn.init's initialisers. Each fills a tensor in place under no_grad (a
parameter that requires grad included) and returns it; the fans are torch's (dim 1 is fan in, dim 0
fan out, both times the receptive field: the product of the dims after the second), so a layer
initialised by name gets the same distribution as in torch. The random numbers come from Kiln's
generator (kiln.manual_seed), not torch's: the same statistics, not the same values."""
import math
import warnings

import numpy as np

from .. import _C
from .._tensor import no_grad

__all__ = ["calculate_gain", "uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_",
           "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_"]


def _check(tensor, who):
    if not isinstance(tensor, _C.Tensor):
        raise TypeError(f"kiln.nn.init.{who}: expected a kiln.Tensor, got {type(tensor).__name__}")


def _no_generator(generator, who):
    if generator is not None:
        raise TypeError(f"kiln.nn.init.{who}: generator is not supported (Kiln draws from its global generator: "
                        f"seed it with kiln.manual_seed)")


def _fill(tensor, values):
    with no_grad():
        tensor.copy_(values)
    return tensor


def _rand(tensor):
    return _C.rand(*tensor.shape, dtype=tensor.dtype, device=tensor.device)


def _randn(tensor):
    return _C.randn(*tensor.shape, dtype=tensor.dtype, device=tensor.device)


def calculate_gain(nonlinearity, param=None):
    """The recommended gain for a nonlinearity, as torch's: 1 for linear, conv and sigmoid, 5/3 for
    tanh, sqrt(2) for relu, sqrt(2 / (1 + slope**2)) for leaky_relu (slope param, default 0.01), 3/4
    for selu."""
    linear = ["linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d"]
    if nonlinearity in linear or nonlinearity == "sigmoid":
        return 1
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        if param is None:
            slope = 0.01
        elif not isinstance(param, bool) and isinstance(param, (int, float)):
            slope = param
        else:
            raise ValueError(f"calculate_gain: negative_slope {param} is not a valid number")
        return math.sqrt(2.0 / (1 + slope ** 2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise ValueError(f"calculate_gain: unsupported nonlinearity {nonlinearity!r}")


def _calculate_fan_in_and_fan_out(tensor):
    if len(tensor.shape) < 2:
        raise ValueError(f"kiln.nn.init: fan in and fan out cannot be computed for a tensor with fewer than 2 "
                         f"dimensions (shape {tuple(tensor.shape)})")
    receptive = math.prod(tensor.shape[2:])
    return tensor.shape[1] * receptive, tensor.shape[0] * receptive


def _calculate_correct_fan(tensor, mode):
    mode = mode.lower()
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"kiln.nn.init: mode {mode!r} not supported, use 'fan_in' or 'fan_out'")
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    return fan_in if mode == "fan_in" else fan_out


def uniform_(tensor, a=0.0, b=1.0, generator=None):
    """Fills tensor with values drawn from U(a, b)."""
    _check(tensor, "uniform_")
    _no_generator(generator, "uniform_")
    return _fill(tensor, _rand(tensor) * (b - a) + a)


def normal_(tensor, mean=0.0, std=1.0, generator=None):
    """Fills tensor with values drawn from N(mean, std**2)."""
    _check(tensor, "normal_")
    _no_generator(generator, "normal_")
    return _fill(tensor, _randn(tensor) * std + mean)


def trunc_normal_(tensor, mean=0.0, std=1.0, a=-2.0, b=2.0, generator=None):
    """Fills tensor from N(mean, std**2) truncated to [a, b], by torch's inverse-CDF method: a uniform
    value between the bounds' CDFs mapped back through erfinv."""
    _check(tensor, "trunc_normal_")
    _no_generator(generator, "trunc_normal_")
    if mean < a - 2 * std or mean > b + 2 * std:
        warnings.warn("mean is more than 2 std from [a, b] in nn.init.trunc_normal_. The distribution of values "
                      "may be incorrect.", stacklevel=2)
    cdf = lambda x: (1.0 + math.erf(x / math.sqrt(2.0))) / 2.0  # noqa: E731
    lo, hi = cdf((a - mean) / std), cdf((b - mean) / std)
    u = _rand(tensor) * (2 * hi - 2 * lo) + (2 * lo - 1)
    return _fill(tensor, _C.clamp(_C.erfinv(u) * (std * math.sqrt(2.0)) + mean, a, b))


def constant_(tensor, val):
    """Fills tensor with val."""
    _check(tensor, "constant_")
    with no_grad():
        tensor.fill_(val)
    return tensor


def ones_(tensor):
    return constant_(tensor, 1.0)


def zeros_(tensor):
    return constant_(tensor, 0.0)


def eye_(tensor):
    """Fills a 2-D tensor with the identity (ones on the diagonal, as torch.eye)."""
    _check(tensor, "eye_")
    if len(tensor.shape) != 2:
        raise ValueError(f"kiln.nn.init.eye_: only tensors with 2 dimensions are supported, got shape "
                         f"{tuple(tensor.shape)}")
    return _fill(tensor, _C.eye(tensor.shape[0], tensor.shape[1], dtype=tensor.dtype, device=tensor.device))


def xavier_uniform_(tensor, gain=1.0, generator=None):
    """U(-a, a) with a = gain * sqrt(6 / (fan_in + fan_out)) (Glorot & Bengio, 2010)."""
    _check(tensor, "xavier_uniform_")
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    a = math.sqrt(3.0) * gain * math.sqrt(2.0 / float(fan_in + fan_out))
    return uniform_(tensor, -a, a, generator)


def xavier_normal_(tensor, gain=1.0, generator=None):
    """N(0, std**2) with std = gain * sqrt(2 / (fan_in + fan_out))."""
    _check(tensor, "xavier_normal_")
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    return normal_(tensor, 0.0, gain * math.sqrt(2.0 / float(fan_in + fan_out)), generator)


def _kaiming_std(tensor, a, mode, nonlinearity, who):
    _check(tensor, who)
    if 0 in tensor.shape:
        warnings.warn("Initializing zero-element tensors is a no-op", stacklevel=3)
        return None
    return calculate_gain(nonlinearity, a) / math.sqrt(_calculate_correct_fan(tensor, mode))


def kaiming_uniform_(tensor, a=0, mode="fan_in", nonlinearity="leaky_relu", generator=None):
    """U(-bound, bound) with bound = gain * sqrt(3 / fan) (He et al., 2015); a: leaky_relu's slope;
    mode: 'fan_in' (forward variance) or 'fan_out' (backward)."""
    std = _kaiming_std(tensor, a, mode, nonlinearity, "kaiming_uniform_")
    if std is None:
        return tensor
    bound = math.sqrt(3.0) * std
    return uniform_(tensor, -bound, bound, generator)


def kaiming_normal_(tensor, a=0, mode="fan_in", nonlinearity="leaky_relu", generator=None):
    """N(0, std**2) with std = gain / sqrt(fan)."""
    std = _kaiming_std(tensor, a, mode, nonlinearity, "kaiming_normal_")
    if std is None:
        return tensor
    return normal_(tensor, 0.0, std, generator)


def orthogonal_(tensor, gain=1, generator=None):
    """A (semi-)orthogonal matrix, as torch's: the QR of a normal matrix (on the host, in float64),
    signs fixed by R's diagonal, dims after the first flattened (Saxe et al., 2013)."""
    _check(tensor, "orthogonal_")
    _no_generator(generator, "orthogonal_")
    if len(tensor.shape) < 2:
        raise ValueError(f"kiln.nn.init.orthogonal_: only tensors with 2 or more dimensions are supported, got "
                         f"shape {tuple(tensor.shape)}")
    if tensor.numel() == 0:
        return tensor
    rows = tensor.shape[0]
    cols = tensor.numel() // rows
    flat = _C.randn(rows, cols, dtype=_C.dtype.float64).numpy()
    if rows < cols:
        flat = flat.T
    q, r = np.linalg.qr(flat)
    q = q * np.sign(np.diag(r))
    if rows < cols:
        q = q.T
    q = np.ascontiguousarray(q.reshape(tuple(tensor.shape)) * gain)
    return _fill(tensor, _C.from_numpy(q).to(tensor.dtype).to(tensor.device))
