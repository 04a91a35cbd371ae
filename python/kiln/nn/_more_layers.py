"""Still more of torch.nn, composed from Kiln's engine ops (so autograd differentiates them): the padding
modules (ZeroPad, ConstantPad, ReflectionPad, ReplicationPad, CircularPad 1d/2d/3d), power-average
pooling (F.lp_pool1d/2d/3d, nn.LPPool1d/2d/3d), 3-d adaptive pooling (F.adaptive_avg_pool3d,
F.adaptive_max_pool3d, their modules), torch's *_with_indices pooling functions, nn.MaxUnpool1d/2d/3d,
F.conv_transpose3d and nn.ConvTranspose3d, F.channel_shuffle and nn.ChannelShuffle,
nn.LocalResponseNorm and nn.CrossMapLRN2d, nn.UpsamplingNearest2d / nn.UpsamplingBilinear2d with
F.upsample_nearest / F.upsample_bilinear; nn.Buffer, nn.UninitializedParameter / UninitializedBuffer and the
lazy modules (LazyLinear, LazyConv*, LazyConvTranspose*, LazyBatchNorm*, LazyInstanceNorm*); fractional max
pooling (F.fractional_max_pool2d/3d, nn.FractionalMaxPool2d/3d). The functionals
are attached to kiln.nn.functional here."""
import copy
import numbers
import warnings

import numpy as np

from .. import _C
from .._C import KilnValueError
from .._tensor import no_grad as _no_grad, tensor as _tensor
from . import functional as F
from .modules import Module, Upsample
from .layers import _ConvTransposeNd, _AdaptivePoolNd


def _int(v):
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _ints(name, what, v, n, minimum=None):
    """v as n ints (an int repeats), each >= minimum when given."""
    t = tuple(v) if isinstance(v, (tuple, list)) else (v,) * n
    if len(t) != n or not all(_int(e) and (minimum is None or e >= minimum) for e in t):
        lo = "" if minimum is None else f" >= {minimum}"
        raise KilnValueError(f"{name}: {what} must be an int{lo} or {n} ints{lo}, got {v!r}")
    return tuple(int(e) for e in t)


# ---- padding modules ----
class _PadNd(Module):
    """padding: an int (every side) or 2 * n ints in F.pad's order (left, right, top, bottom, front, back)."""
    _mode = "constant"
    _n = 1

    def __init__(self, padding):
        super().__init__()
        self.padding = _ints(type(self).__name__, "padding", padding, 2 * self._n)

    def _check_input(self, x):
        n = self._n
        if self._mode != "constant" and x.dim() not in (n + 1, n + 2):
            # torch: a NotImplementedError (reflect, replicate) or ValueError (circular) naming the dims
            raise KilnValueError(f"{type(self).__name__}: expected a {n + 1}D (unbatched) or {n + 2}D (batched) "
                                 f"input, got {x.dim()}D input {list(x.shape)}")
        if self._mode == "constant" and x.dim() < n:
            raise KilnValueError(f"{type(self).__name__}: padding length {2 * n} must be at most twice the input's "
                                 f"dims, got an input of {x.dim()}D {list(x.shape)}")

    def forward(self, input):
        self._check_input(input)
        return F.pad(input, list(self.padding), mode=self._mode)

    def extra_repr(self):
        return f"{self.padding}"


class _ConstantPadNd(_PadNd):
    def __init__(self, padding, value):
        super().__init__(padding)
        if not isinstance(value, numbers.Real) or isinstance(value, bool):
            raise KilnValueError(f"{type(self).__name__}: value must be a number, got {value!r}")
        self.value = value

    def forward(self, input):
        self._check_input(input)
        return F.pad(input, list(self.padding), mode="constant", value=self.value)

    def extra_repr(self):
        return f"padding={self.padding}, value={self.value}"


class ConstantPad1d(_ConstantPadNd):
    """torch.nn.ConstantPad1d(padding, value): pads the last dim with value."""
    _n = 1


class ConstantPad2d(_ConstantPadNd):
    """torch.nn.ConstantPad2d(padding, value): pads the last 2 dims with value."""
    _n = 2


class ConstantPad3d(_ConstantPadNd):
    """torch.nn.ConstantPad3d(padding, value): pads the last 3 dims with value."""
    _n = 3


class _ZeroPadNd(_ConstantPadNd):
    def __init__(self, padding):
        super().__init__(padding, 0.0)

    def extra_repr(self):
        return f"{self.padding}"


class ZeroPad1d(_ZeroPadNd):
    """torch.nn.ZeroPad1d(padding): pads the last dim with zeros."""
    _n = 1


class ZeroPad2d(_ZeroPadNd):
    """torch.nn.ZeroPad2d(padding): pads the last 2 dims with zeros."""
    _n = 2


class ZeroPad3d(_ZeroPadNd):
    """torch.nn.ZeroPad3d(padding): pads the last 3 dims with zeros."""
    _n = 3


class ReflectionPad1d(_PadNd):
    """torch.nn.ReflectionPad1d(padding): mirrors the last dim without repeating the edge (pad < size); input
    2-D or 3-D."""
    _mode, _n = "reflect", 1


class ReflectionPad2d(_PadNd):
    """torch.nn.ReflectionPad2d(padding): mirrors the last 2 dims; input 3-D or 4-D."""
    _mode, _n = "reflect", 2


class ReflectionPad3d(_PadNd):
    """torch.nn.ReflectionPad3d(padding): mirrors the last 3 dims; input 4-D or 5-D."""
    _mode, _n = "reflect", 3


class ReplicationPad1d(_PadNd):
    """torch.nn.ReplicationPad1d(padding): repeats the edge of the last dim; input 2-D or 3-D."""
    _mode, _n = "replicate", 1


class ReplicationPad2d(_PadNd):
    """torch.nn.ReplicationPad2d(padding): repeats the edges of the last 2 dims; input 3-D or 4-D."""
    _mode, _n = "replicate", 2


class ReplicationPad3d(_PadNd):
    """torch.nn.ReplicationPad3d(padding): repeats the edges of the last 3 dims; input 4-D or 5-D."""
    _mode, _n = "replicate", 3


class CircularPad1d(_PadNd):
    """torch.nn.CircularPad1d(padding): wraps the last dim around (pad <= size); input 2-D or 3-D."""
    _mode, _n = "circular", 1


class CircularPad2d(_PadNd):
    """torch.nn.CircularPad2d(padding): wraps the last 2 dims around; input 3-D or 4-D."""
    _mode, _n = "circular", 2


class CircularPad3d(_PadNd):
    """torch.nn.CircularPad3d(padding): wraps the last 3 dims around; input 4-D or 5-D."""
    _mode, _n = "circular", 3


# ---- power-average pooling ----
_AVG = {1: "avg_pool1d", 2: "avg_pool2d", 3: "avg_pool3d"}
_MAX = {1: "max_pool1d", 2: "max_pool2d", 3: "max_pool3d"}


def _lp_pool(n, input, norm_type, kernel_size, stride, ceil_mode):
    name = f"lp_pool{n}d"
    if not isinstance(norm_type, numbers.Real) or isinstance(norm_type, bool) or norm_type == 0:
        raise KilnValueError(f"{name}: norm_type must be a non-zero number, got {norm_type!r}")
    k = _ints(name, "kernel_size", kernel_size, n, 1)
    if stride is not None:
        stride = _ints(name, "stride", stride, n, 1)
    if input.dim() not in (n + 1, n + 2):
        raise KilnValueError(f"{name}: expected a {n + 1}D (unbatched) or {n + 2}D (batched) input, got "
                             f"{input.dim()}D input {list(input.shape)}")
    if not input.is_floating_point():
        # as torch's: an integer input gives a float32 result (the default dtype), except for p = +-inf (a max
        # pool), which keeps the input's dtype (computed in float64: exact for |x| < 2^53)
        if abs(norm_type) == float("inf"):
            return _lp_pool(n, input.to(_C.dtype.float64), norm_type, k, stride, ceil_mode).to(input.dtype)
        if float(norm_type).is_integer() and norm_type > 0:
            # torch's x.pow(p) stays integer there, and its integer avg_pool truncates each window's sum / count:
            # the same, through float64 (exact sums below 2^53)
            out = getattr(F, _AVG[n])(input.to(_C.dtype.float64).pow(norm_type), k, stride, 0, ceil_mode)
            r = out.round()
            out = _C.where((out - r).abs() <= (r.abs() + 1) * 1e-9, r, out.trunc()).to(_C.dtype.float32)
            return _lp_finish(out, norm_type, k)
        input = input.to(_C.dtype.float32)
    if norm_type == float("inf"):
        return getattr(F, _MAX[n])(input.abs(), k, stride, 0, 1, ceil_mode)
    if norm_type == -float("inf"):
        return -getattr(F, _MAX[n])(-input.abs(), k, stride, 0, 1, ceil_mode)
    return _lp_finish(getattr(F, _AVG[n])(input.pow(norm_type), k, stride, 0, ceil_mode), norm_type, k)


def _lp_finish(out, norm_type, k):
    count = 1
    for e in k:
        count *= e
    # torch's sign(out) * relu(|out|): a window whose p-th powers sum to 0 gives 0 and a zero gradient
    zero = out == 0
    safe = _C.where(zero, _C.ones_like(out), out)
    return _C.where(zero, _C.zeros_like(out), (safe * count).pow(1.0 / norm_type))


def lp_pool1d(input, norm_type, kernel_size, stride=None, ceil_mode=False):
    """torch.nn.functional.lp_pool1d: (sum over each window of x^p)^(1/p) (p = norm_type; +-inf: the max of
    +-|x|), no padding; stride defaults to kernel_size. A window summing to 0 gets a zero gradient, as torch."""
    return _lp_pool(1, input, norm_type, kernel_size, stride, ceil_mode)


def lp_pool2d(input, norm_type, kernel_size, stride=None, ceil_mode=False):
    """torch.nn.functional.lp_pool2d: lp_pool1d over the last 2 dims."""
    return _lp_pool(2, input, norm_type, kernel_size, stride, ceil_mode)


def lp_pool3d(input, norm_type, kernel_size, stride=None, ceil_mode=False):
    """torch.nn.functional.lp_pool3d: lp_pool1d over the last 3 dims."""
    return _lp_pool(3, input, norm_type, kernel_size, stride, ceil_mode)


class _LPPoolNd(Module):
    _n = 1

    def __init__(self, norm_type, kernel_size, stride=None, ceil_mode=False):
        super().__init__()
        self.norm_type, self.kernel_size, self.stride, self.ceil_mode = norm_type, kernel_size, stride, ceil_mode

    def forward(self, input):
        return _lp_pool(self._n, input, self.norm_type, self.kernel_size, self.stride, self.ceil_mode)

    def extra_repr(self):
        return (f"norm_type={self.norm_type}, kernel_size={self.kernel_size}, stride={self.stride}, "
                f"ceil_mode={self.ceil_mode}")


class LPPool1d(_LPPoolNd):
    """torch.nn.LPPool1d(norm_type, kernel_size, stride=None, ceil_mode=False): F.lp_pool1d."""
    _n = 1


class LPPool2d(_LPPoolNd):
    """torch.nn.LPPool2d(norm_type, kernel_size, stride=None, ceil_mode=False): F.lp_pool2d."""
    _n = 2


class LPPool3d(_LPPoolNd):
    """torch.nn.LPPool3d(norm_type, kernel_size, stride=None, ceil_mode=False): F.lp_pool3d."""
    _n = 3


# ---- 3-d adaptive pooling ----
def _adaptive3(name, input, output_size):
    sizes = F._adaptive_size(name, output_size, 3)
    F._adaptive_input(name, input, 3)
    return tuple(input.shape[-3 + i] if s is None else s for i, s in enumerate(sizes))


def adaptive_avg_pool3d(input, output_size):
    """torch.nn.functional.adaptive_avg_pool3d: the mean over torch's adaptive bins of the last 3 dims,
    (N, C, D, H, W) or (C, D, H, W) to (..., od, oh, ow); an int output_size for all three, None keeps a dim."""
    od, oh, ow = _adaptive3("adaptive_avg_pool3d", input, output_size)
    if 0 in (od, oh, ow):
        return F._adaptive_max_empty(input, list(input.shape[:-3]) + [od, oh, ow], False)
    # each box is a d-bin times an (h, w) bin: the mean over d, then the 2-d adaptive mean
    planes = [F.adaptive_avg_pool2d(input[..., s:e, :, :].mean(-3), (oh, ow)) for s, e in F._bins(input.shape[-3], od)]
    return _C.stack(planes, -3)


def adaptive_max_pool3d(input, output_size, return_indices=False):
    """torch.nn.functional.adaptive_max_pool3d: the maximum over torch's adaptive bins of the last 3 dims;
    with return_indices=True also where each is, as an index into D * H * W, as torch's."""
    od, oh, ow = _adaptive3("adaptive_max_pool3d", input, output_size)
    if 0 in (od, oh, ow):
        return F._adaptive_max_empty(input, list(input.shape[:-3]) + [od, oh, ow], return_indices)
    d, h, w = input.shape[-3:]
    lead = list(input.shape[:-3])

    def positions(length, out):
        # [out, longest bin] positions of each bin along one dim, a short bin padded with its first position
        # (a repeat, which changes neither the maximum nor, coming after it, which position is first)
        bins = F._bins(length, out)
        pos = np.empty((out, max(e - s for s, e in bins)), dtype=np.int64)
        for i, (s, e) in enumerate(bins):
            pos[i, :e - s] = np.arange(s, e)
            pos[i, e - s:] = s
        return pos

    pd, ph, pw = positions(d, od), positions(h, oh), positions(w, ow)
    # every bin's flat input positions at once: [od * oh * ow, bin size], gathered in one op (as much memory as
    # the output times the longest bin, instead of one small op per bin)
    flat = ((pd[:, None, None, :, None, None] * h + ph[None, :, None, None, :, None]) * w
            + pw[None, None, :, None, None, :]).reshape(od * oh * ow, -1)
    b = int(np.prod(lead)) if lead else 1
    flat_t = _tensor(flat, dtype=_C.dtype.int64, device=input.device)
    windows = input.reshape([b, d * h * w]).index_select(1, flat_t.reshape([-1])).reshape([b] + list(flat.shape))
    values, arg = _C.max(windows, -1)
    values = values.reshape(lead + [od, oh, ow])
    if not return_indices:
        return values
    where = flat_t.unsqueeze(0).expand([b] + list(flat.shape)).gather(2, arg.unsqueeze(-1)).squeeze(-1)
    return values, where.reshape(lead + [od, oh, ow])


class AdaptiveAvgPool3d(_AdaptivePoolNd):
    """torch.nn.AdaptiveAvgPool3d: F.adaptive_avg_pool3d."""

    def __init__(self, output_size):
        super().__init__(output_size)
        del self.return_indices

    def forward(self, x):
        return adaptive_avg_pool3d(x, self.output_size)


class AdaptiveMaxPool3d(_AdaptivePoolNd):
    """torch.nn.AdaptiveMaxPool3d: F.adaptive_max_pool3d."""

    def forward(self, x):
        return adaptive_max_pool3d(x, self.output_size, self.return_indices)


# ---- torch's *_with_indices pooling functions: always (values, indices) ----
def max_pool1d_with_indices(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
                            return_indices=False):
    """torch.nn.functional.max_pool1d_with_indices: F.max_pool1d's (values, indices), whatever return_indices."""
    return F.max_pool1d(input, kernel_size, stride, padding, dilation, ceil_mode, True)


def max_pool2d_with_indices(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
                            return_indices=False):
    """torch.nn.functional.max_pool2d_with_indices: F.max_pool2d's (values, indices), whatever return_indices."""
    return F.max_pool2d(input, kernel_size, stride, padding, dilation, ceil_mode, True)


def max_pool3d_with_indices(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
                            return_indices=False):
    """torch.nn.functional.max_pool3d_with_indices: F.max_pool3d's (values, indices), whatever return_indices."""
    return F.max_pool3d(input, kernel_size, stride, padding, dilation, ceil_mode, True)


def adaptive_max_pool1d_with_indices(input, output_size, return_indices=False):
    """torch.nn.functional.adaptive_max_pool1d_with_indices: (values, indices), whatever return_indices."""
    return F.adaptive_max_pool1d(input, output_size, True)


def adaptive_max_pool2d_with_indices(input, output_size, return_indices=False):
    """torch.nn.functional.adaptive_max_pool2d_with_indices: (values, indices), whatever return_indices."""
    return F.adaptive_max_pool2d(input, output_size, True)


def adaptive_max_pool3d_with_indices(input, output_size, return_indices=False):
    """torch.nn.functional.adaptive_max_pool3d_with_indices: (values, indices), whatever return_indices."""
    return adaptive_max_pool3d(input, output_size, True)


# ---- max unpooling modules ----
class _MaxUnpoolNd(Module):
    _n = 1

    def __init__(self, kernel_size, stride=None, padding=0):
        super().__init__()
        name, n = type(self).__name__, self._n
        self.kernel_size = _ints(name, "kernel_size", kernel_size, n, 1)
        self.stride = _ints(name, "stride", stride if stride is not None else kernel_size, n, 1)
        self.padding = _ints(name, "padding", padding, n, 0)

    def forward(self, input, indices, output_size=None):
        n = self._n
        if output_size is not None:
            # as torch: the n output sizes, or n + 2 sizes (a batched shape) of which the last n count
            output_size = list(output_size)
            if len(output_size) == n + 2:
                output_size = output_size[2:]
            if len(output_size) != n:
                raise KilnValueError(f"{type(self).__name__}: output_size should have {n} or {n + 2} elements, "
                                     f"got {len(output_size)} ({output_size})")
            if n == 1:
                output_size = output_size[0]
        fn = getattr(F, f"max_unpool{n}d")
        return fn(input, indices, self.kernel_size, self.stride, self.padding, output_size)

    def extra_repr(self):
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class MaxUnpool1d(_MaxUnpoolNd):
    """torch.nn.MaxUnpool1d(kernel_size, stride=None, padding=0): forward(input, indices, output_size=None)
    as F.max_unpool1d."""
    _n = 1


class MaxUnpool2d(_MaxUnpoolNd):
    """torch.nn.MaxUnpool2d(kernel_size, stride=None, padding=0): F.max_unpool2d."""
    _n = 2


class MaxUnpool3d(_MaxUnpoolNd):
    """torch.nn.MaxUnpool3d(kernel_size, stride=None, padding=0): F.max_unpool3d."""
    _n = 3


# ---- conv_transpose3d ----
def _dilate(x, dim, s):
    """x with s - 1 zeros between neighbours along dim (the transposed convolution's stride)."""
    if s == 1 or x.shape[dim] == 0:
        return x
    length = x.shape[dim]
    shape = list(x.shape)
    y = x.unsqueeze(dim + 1)
    zshape = shape[:dim + 1] + [s - 1] + shape[dim + 1:]
    y = _C.cat([y, _C.zeros(zshape, dtype=x.dtype, device=x.device)], dim + 1)
    y = y.reshape(shape[:dim] + [length * s] + shape[dim + 1:])
    return y.narrow(dim, 0, (length - 1) * s + 1)


def conv_transpose3d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    """torch.nn.functional.conv_transpose3d, the adjoint of conv3d: x [N, C_in, D, H, W] (or unbatched
    [C_in, D, H, W]), weight [C_in, C_out / groups, kd, kh, kw], bias [C_out]; each output size
    (in - 1) stride - 2 padding + dilation (k - 1) + output_padding + 1, output_padding smaller than the
    stride or the dilation. Composed as conv3d of the stride-dilated, padded input with the flipped weight."""
    name = "conv_transpose3d"
    if input.dim() == 4:
        return conv_transpose3d(input.unsqueeze(0), weight, bias, stride, padding, output_padding, groups,
                                dilation).squeeze(0)
    if input.dim() != 5:
        raise KilnValueError(f"{name}: expected a 4D (unbatched) or 5D (batched) input, got {input.dim()}D "
                             f"input {list(input.shape)}")
    if weight.dim() != 5:
        raise KilnValueError(f"{name}: weight must be 5-D [C_in, C_out / groups, kd, kh, kw], got "
                             f"{list(weight.shape)}")
    s = _ints(name, "stride", stride, 3, 1)
    p = _ints(name, "padding", padding, 3, 0)
    op = _ints(name, "output_padding", output_padding, 3, 0)
    d = _ints(name, "dilation", dilation, 3, 1)
    if not _int(groups) or groups < 1:
        raise KilnValueError(f"{name}: groups must be an int >= 1, got {groups!r}")
    cin = input.shape[1]
    if weight.shape[0] != cin:
        raise KilnValueError(f"{name}: the input's {cin} channels must be weight's dim 0 (C_in), got weight "
                             f"{list(weight.shape)}")
    if cin % groups:
        raise KilnValueError(f"{name}: the input's {cin} channels must be divisible by groups ({groups})")
    for i in range(3):
        if op[i] >= s[i] and op[i] >= d[i]:
            raise KilnValueError(f"{name}: output_padding {op} must be smaller than either stride {s} or dilation "
                                 f"{d} in each dim")
    k = list(weight.shape[2:])
    cout_g = weight.shape[1]
    size_in = list(input.shape[2:])
    size_out = [(size_in[i] - 1) * s[i] - 2 * p[i] + d[i] * (k[i] - 1) + op[i] + 1 for i in range(3)]
    if min(size_out) <= 0:
        raise KilnValueError(f"{name}: Given input size per channel: ({' x '.join(map(str, size_in))}). Calculated "
                             f"output size per channel: ({' x '.join(map(str, size_out))}). Output size is too small")
    if bias is not None and tuple(bias.shape) != (cout_g * groups,):
        raise KilnValueError(f"{name}: bias must be 1-D of C_out = {cout_g * groups} elements, got "
                             f"{list(bias.shape)}")
    x = input
    for i in range(3):
        x = _dilate(x, 2 + i, s[i])
    # a side of dilation (k - 1) - padding (negative: cropped), output_padding more at the end
    amounts = []
    for i in reversed(range(3)):
        q = d[i] * (k[i] - 1) - p[i]
        amounts += [q, q + op[i]]
    x = F.pad(x, amounts)
    w = weight.reshape([groups, cin // groups, cout_g] + k).transpose(1, 2)
    w = w.reshape([groups * cout_g, cin // groups] + k).flip([2, 3, 4])
    return F.conv3d(x, w, bias, 1, 0, d, groups)


class ConvTranspose3d(_ConvTransposeNd):
    """torch.nn.ConvTranspose3d: weight [in_channels, out_channels / groups, kd, kh, kw]; forward(x,
    output_size=None) as F.conv_transpose3d."""
    _fn = staticmethod(conv_transpose3d)
    _dims = 3


# ---- channel shuffle, local response norm ----
def channel_shuffle(input, groups):
    """torch.nn.functional.channel_shuffle: [N, C, *] with C = groups * m -> channel c of group g moves to
    m' = c * groups + g (the [groups, m] channel grid transposed)."""
    if not _int(groups) or groups <= 0:
        raise KilnValueError(f"channel_shuffle: groups must be a positive int, got {groups!r}")
    if input.dim() < 3:
        raise KilnValueError(f"channel_shuffle: expected an input of at least 3 dims [N, C, *], got "
                             f"{list(input.shape)}")
    n, c = input.shape[0], input.shape[1]
    if c % groups:
        raise KilnValueError(f"channel_shuffle: the number of channels ({c}) must be divisible by groups ({groups})")
    rest = list(input.shape[2:])
    return input.reshape([n, groups, c // groups] + rest).transpose(1, 2).reshape([n, c] + rest)


class ChannelShuffle(Module):
    """torch.nn.ChannelShuffle(groups): F.channel_shuffle."""

    def __init__(self, groups):
        super().__init__()
        if not _int(groups) or groups <= 0:
            raise KilnValueError(f"ChannelShuffle: groups must be a positive int, got {groups!r}")
        self.groups = groups

    def forward(self, input):
        return channel_shuffle(input, self.groups)

    def extra_repr(self):
        return f"groups={self.groups}"


class LocalResponseNorm(Module):
    """torch.nn.LocalResponseNorm(size, alpha=1e-4, beta=0.75, k=1.0): F.local_response_norm over the
    channels (dim 1) of [N, C, *]."""

    def __init__(self, size, alpha=1e-4, beta=0.75, k=1.0):
        super().__init__()
        if not _int(size):
            raise KilnValueError(f"{type(self).__name__}: size must be an int, got {size!r}")
        # a size < 1 is refused by the forward (F.local_response_norm), as torch's: not at construction
        self.size, self.alpha, self.beta, self.k = size, alpha, beta, k

    def forward(self, input):
        return F.local_response_norm(input, self.size, self.alpha, self.beta, self.k)

    def extra_repr(self):
        return f"{self.size}, alpha={self.alpha}, beta={self.beta}, k={self.k}"


class CrossMapLRN2d(LocalResponseNorm):
    """torch.nn.CrossMapLRN2d(size, alpha=1e-4, beta=0.75, k=1): x * (k + alpha / size * s)^-beta over a 4-D
    [N, C, H, W] input, s the sum of x^2 over a window of channels exactly as torch's (a port of Lua Torch's
    running sum): channels c - pre + 1 .. c + pre - 1 (pre = (size - 1) // 2 + 1, cut at the ends), and channel
    0 is never taken out of the running sum, so for c > pre it stays in the window (torch's result, kept).
    The gradient is this forward's true gradient (autograd); torch's hand-written backward differs from it
    whenever the window is cut at an end (it fails torch.autograd.gradcheck, and raises for size=1)."""

    def __init__(self, size, alpha=1e-4, beta=0.75, k=1):
        super().__init__(size, alpha, beta, k)

    def forward(self, input):
        if input.dim() != 4:
            raise KilnValueError(f"CrossMapLRN2d: expected a 4D input [N, C, H, W], got {input.dim()}D input "
                                 f"{list(input.shape)}")
        if self.size < 1:
            raise KilnValueError(f"CrossMapLRN2d: size must be >= 1, got {self.size}")
        n, c, h, w = input.shape
        window = np.zeros((c, c))
        pre = int((self.size - 1) / 2 + 1)
        window[0, :min(pre, c)] = 1
        for ch in range(1, c):  # torch's running sum, replayed on the window
            window[ch] = window[ch - 1]
            if ch < c - pre + 1:
                window[ch, ch + pre - 1] += 1
            if ch > pre:
                window[ch, ch - pre] -= 1
        sq = (input * input).reshape([n, c, h * w])
        s = _tensor(window, dtype=input.dtype, device=input.device).matmul(sq).reshape([n, c, h, w])
        return input * (s * (self.alpha / self.size) + self.k).pow(-self.beta)


# ---- the older upsampling names ----
def upsample_nearest(input, size=None, scale_factor=None):
    """torch.nn.functional.upsample_nearest (deprecated in torch, with its warning): interpolate(mode="nearest")."""
    warnings.warn("`nn.functional.upsample_nearest` is deprecated. Use `nn.functional.interpolate` instead.",
                  stacklevel=2)
    return F.interpolate(input, size, scale_factor, mode="nearest")


def upsample_bilinear(input, size=None, scale_factor=None):
    """torch.nn.functional.upsample_bilinear (deprecated in torch, with its warning): interpolate(mode="bilinear",
    align_corners=True)."""
    warnings.warn("`nn.functional.upsample_bilinear` is deprecated. Use `nn.functional.interpolate` instead.",
                  stacklevel=2)
    return F.interpolate(input, size, scale_factor, mode="bilinear", align_corners=True)


class _Upsampling2d(Upsample):
    def extra_repr(self):
        if self.scale_factor is not None:
            info = f"scale_factor={self.scale_factor!r}"
        else:
            info = f"size={self.size!r}"
        return info + f", mode={self.mode!r}"


class UpsamplingNearest2d(_Upsampling2d):
    """torch.nn.UpsamplingNearest2d(size=None, scale_factor=None): nearest upsampling of [N, C, H, W]."""

    def __init__(self, size=None, scale_factor=None):
        super().__init__(size, None if scale_factor is None else _float_scale(scale_factor), mode="nearest")


class UpsamplingBilinear2d(_Upsampling2d):
    """torch.nn.UpsamplingBilinear2d(size=None, scale_factor=None): bilinear upsampling of [N, C, H, W] with
    align_corners=True, as torch's."""

    def __init__(self, size=None, scale_factor=None):
        super().__init__(size, None if scale_factor is None else _float_scale(scale_factor), mode="bilinear",
                         align_corners=True)


def _float_scale(s):
    # torch's Upsample stores scale_factor as float (or a tuple of floats)
    return tuple(float(e) for e in s) if isinstance(s, (tuple, list)) else float(s)


# ---- onto kiln.nn.functional ----
for _fn in (lp_pool1d, lp_pool2d, lp_pool3d, adaptive_avg_pool3d, adaptive_max_pool3d, max_pool1d_with_indices,
            max_pool2d_with_indices, max_pool3d_with_indices, adaptive_max_pool1d_with_indices,
            adaptive_max_pool2d_with_indices, adaptive_max_pool3d_with_indices, conv_transpose3d, channel_shuffle,
            upsample_nearest, upsample_bilinear):
    setattr(F, _fn.__name__, _fn)
F.native_channel_shuffle = channel_shuffle
del _fn

# what kiln.nn takes from here (kiln/nn/__init__.py's one import line)
__all__ = [
    "ZeroPad1d", "ZeroPad2d", "ZeroPad3d", "ConstantPad1d", "ConstantPad2d", "ConstantPad3d", "ReflectionPad1d",
    "ReflectionPad2d", "ReflectionPad3d", "ReplicationPad1d", "ReplicationPad2d", "ReplicationPad3d", "CircularPad1d",
    "CircularPad2d", "CircularPad3d", "LPPool1d", "LPPool2d", "LPPool3d", "AdaptiveAvgPool3d", "AdaptiveMaxPool3d",
    "MaxUnpool1d", "MaxUnpool2d", "MaxUnpool3d", "ConvTranspose3d", "ChannelShuffle", "LocalResponseNorm",
    "CrossMapLRN2d", "UpsamplingNearest2d", "UpsamplingBilinear2d",
]


# ---- nn.Buffer, uninitialized parameters and the lazy modules ----
from .._C import Tensor  # noqa: E402
from .modules import (  # noqa: E402
    Parameter, Linear, Conv1d, Conv2d, Conv3d, BatchNorm1d, BatchNorm2d, BatchNorm3d, _bound, _uniform,
)
from .layers import ConvTranspose1d, ConvTranspose2d, InstanceNorm1d, InstanceNorm2d, InstanceNorm3d  # noqa: E402


class Buffer(Tensor):
    """torch.nn.Buffer(data=None, *, persistent=True) (torch 2.5's marker): a tensor that, assigned to a Module
    attribute (or given to register_buffer), is registered as a buffer (persistent=False keeps it out of
    state_dict). As torch's, the module stores a plain tensor (a detached alias of data, sharing its memory and
    keeping its requires_grad), not the Buffer object; the marker itself copies and pickles as a Buffer with its
    flag. None gives an empty tensor."""
    _is_buffer = True

    def __init__(self, data=None, *, persistent=True):
        if data is None:
            data = _C.empty(0)
        elif not isinstance(data, Tensor):
            data = _tensor(data)
        super().__init__(data.detach())
        self.requires_grad_(data.requires_grad)
        self.persistent = persistent

    def _plain(self):
        """The plain tensor a module stores for this Buffer: same memory, same requires_grad."""
        t = self.detach()
        if self.requires_grad:
            t.requires_grad_(True)
        return t

    def __deepcopy__(self, memo):
        if id(self) in memo:
            return memo[id(self)]
        new = Buffer(copy.deepcopy(self._plain(), memo), persistent=self.persistent)
        memo[id(self)] = new
        return new

    def __reduce_ex__(self, protocol):
        return (_rebuild_buffer, (self._plain(), self.persistent))


def _rebuild_buffer(data, persistent):
    return Buffer(data, persistent=persistent)


def _empty_like_spec(device, dtype):
    return _to(_C.empty(0), device, dtype)


def _to(t, device, dtype):
    kw = {k: v for k, v in (("device", device), ("dtype", dtype)) if v is not None}
    return t.to(**kw) if kw else t


def _rebuild_uninitialized(cls, requires_grad, device, dtype):
    return cls(requires_grad=requires_grad, device=device, dtype=getattr(_C.dtype, dtype))


class _UninitializedMixin:
    """What UninitializedParameter and UninitializedBuffer share: a copy, a pickle and Module.to() keep the
    class with requires_grad, device and dtype (torch's do the same)."""
    _is_uninitialized = True

    def _like(self, device, dtype):
        return type(self)(requires_grad=self.requires_grad, device=str(device), dtype=dtype)

    def __deepcopy__(self, memo):
        if id(self) in memo:
            return memo[id(self)]
        new = memo[id(self)] = self._like(self.device, self.dtype)
        return new

    def __reduce_ex__(self, protocol):
        return (_rebuild_uninitialized, (type(self), self.requires_grad, str(self.device), self.dtype.name))


class UninitializedParameter(_UninitializedMixin, Parameter):
    """torch.nn.UninitializedParameter: an empty [0] parameter standing for one whose shape is not known yet (a
    lazy module's, until its first forward or load_state_dict). materialize(shape) turns this very object into a
    Parameter of that shape (uninitialized values), as torch's does, so an optimizer made before the lazy
    module's first forward holds the parameter that trains."""
    cls_to_become = Parameter

    def __init__(self, requires_grad=True, device=None, dtype=None):
        super().__init__(_empty_like_spec(device, dtype), requires_grad)

    def materialize(self, shape, device=None, dtype=None):
        self._rebind_data(_to(_C.empty(*shape), device or str(self.device), dtype or self.dtype))
        object.__setattr__(self, "__class__", self.cls_to_become)  # Parameter.__setattr__ refuses Tensor names

    def __repr__(self):
        return "<UninitializedParameter>"


class UninitializedBuffer(_UninitializedMixin, Tensor):
    """torch.nn.UninitializedBuffer, as far as Kiln allows: an empty [0] buffer of a lazy module until its shape
    is known. Kiln cannot turn this object into a plain kiln.Tensor (torch's materialize does), so
    materialize(shape) returns the new tensor and the lazy module puts it in this one's place (buffers are not
    held by optimizers)."""

    def __init__(self, requires_grad=False, device=None, dtype=None):
        super().__init__(_empty_like_spec(device, dtype))
        self.requires_grad_(requires_grad)

    def materialize(self, shape, device=None, dtype=None):
        return _to(_C.empty(*shape), device or str(self.device), dtype or self.dtype)

    def __repr__(self):
        return "<UninitializedBuffer>"


def _lazy_infer(module, args):
    module.initialize_parameters(*args)
    module._lazy_hook.remove()
    del module._lazy_hook
    module.__class__ = module.cls_to_become


class _LazyMixin:
    """torch's LazyModuleMixin: the parameters (and buffers) are uninitialized until the first forward, which
    infers their shapes from the input, initialises them as the eager module would, and turns the module into
    cls_to_become (LazyLinear into Linear). load_state_dict into an uninitialized module takes the shapes it
    is given (and Kiln sets in_features / in_channels / num_features from them, where torch leaves 0)."""
    cls_to_become = None

    def _lazy_start(self, params, buffers, device, dtype):
        for name in params:
            if getattr(self, name) is not None:
                setattr(self, name, UninitializedParameter(device=device, dtype=dtype))
        for name in buffers:
            if getattr(self, name) is not None:
                self._buffers[name] = UninitializedBuffer(device=device, dtype=dtype)
        self._lazy_hook = self.register_forward_pre_hook(_lazy_infer)

    def _uninitialized(self):
        return [(store, n) for store in (self._parameters, self._buffers) for n, v in store.items()
                if isinstance(v, (UninitializedParameter, UninitializedBuffer))]

    def has_uninitialized_params(self):
        return bool(self._uninitialized())

    def _materialize(self, shapes):
        for store, name in self._uninitialized():
            if name not in shapes:
                continue
            v = store[name]
            if isinstance(v, UninitializedParameter):
                v.materialize(shapes[name])  # in place: the object an optimizer may hold
            else:
                store[name] = v.materialize(shapes[name])

    def _materialize_from_state_dict(self, state_dict, prefix):
        # the shapes from the state dict, the module's own dtype and device (the load converts), as torch's; an
        # uninitialized entry (another lazy module's state dict) leaves this one uninitialized
        self._materialize({name: tuple(state_dict[prefix + name].shape) for store, name in self._uninitialized()
                           if isinstance(state_dict.get(prefix + name), Tensor)
                           and not isinstance(state_dict[prefix + name], _UninitializedMixin)})
        self._set_sizes_from_state()

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        # as torch's: an uninitialized parameter or buffer is saved as itself (an UninitializedParameter), so
        # that loading it into another lazy module leaves that one uninitialized
        super()._save_to_state_dict(destination, prefix, keep_vars)
        for store, name in self._uninitialized():
            if prefix + name in destination:
                destination[prefix + name] = store[name]

    def _extra_lazy_repr(self):
        return None


class LazyLinear(_LazyMixin, Linear):
    """torch.nn.LazyLinear(out_features, bias=True): a Linear whose in_features (input.shape[-1]) is taken at
    the first forward; then it is a Linear."""
    cls_to_become = Linear

    def __init__(self, out_features, bias=True, device=None, dtype=None):
        Linear.__init__(self, 0, out_features, bias, device, dtype)
        self._lazy_start(("weight", "bias"), (), device, dtype)

    def initialize_parameters(self, input, *args, **kwargs):
        if not self.has_uninitialized_params():
            return
        if input.dim() < 1:
            raise KilnValueError(f"LazyLinear: the input must have at least 1 dim (its last is in_features), got "
                                 f"{list(input.shape)}")
        self.in_features = input.shape[-1]
        self._materialize({"weight": (self.out_features, self.in_features), "bias": (self.out_features,)})
        self._reset()

    def _reset(self):
        bound = _bound(self.in_features)
        with _no_grad():
            self.weight.copy_(_uniform(tuple(self.weight.shape), bound))
            if self.bias is not None:
                self.bias.copy_(_uniform(tuple(self.bias.shape), bound))

    def _set_sizes_from_state(self):
        if not isinstance(self.weight, UninitializedParameter):
            self.in_features = self.weight.shape[1]


class _LazyConvMixin(_LazyMixin):
    def _lazy_conv_start(self, device, dtype):
        self._lazy_start(("weight", "bias"), (), device, dtype)

    def initialize_parameters(self, input, *args, **kwargs):
        if not self.has_uninitialized_params():
            return
        n, name = self._dims, type(self).__name__
        if input.dim() not in (n + 1, n + 2):
            raise KilnValueError(f"{name}: expected a {n + 1}D (unbatched) or {n + 2}D (batched) input, got "
                                 f"{list(input.shape)}")
        cin = input.shape[1] if input.dim() == n + 2 else input.shape[0]
        if cin % self.groups:
            raise KilnValueError(f"{name}: the input's {cin} channels (in_channels) must be divisible by groups "
                                 f"({self.groups})")
        self.in_channels = cin
        g = self.groups
        wshape = ((cin, self.out_channels // g) if self._transposed else (self.out_channels, cin // g)) \
            + tuple(self.kernel_size)
        self._materialize({"weight": wshape, "bias": (self.out_channels,)})
        bound = _bound(wshape[1] * _prod(self.kernel_size))
        with _no_grad():
            self.weight.copy_(_uniform(wshape, bound))
            if self.bias is not None:
                self.bias.copy_(_uniform((self.out_channels,), bound))

    def _set_sizes_from_state(self):
        if not isinstance(self.weight, UninitializedParameter):
            self.in_channels = self.weight.shape[0] if self._transposed else self.weight.shape[1] * self.groups


def _prod(t):
    out = 1
    for e in t:
        out *= e
    return out


def _lazy_conv(name, base):
    def __init__(self, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1, bias=True,
                 padding_mode="zeros", device=None, dtype=None):
        base.__init__(self, 0, out_channels, kernel_size, stride, padding, dilation, groups, bias, padding_mode,
                      device, dtype)
        self._lazy_conv_start(device, dtype)
    return type(name, (_LazyConvMixin, base), {
        "__init__": __init__, "cls_to_become": base, "__module__": __name__,
        "__doc__": f"torch.nn.{name}(out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1, bias=True, "
                   f"padding_mode='zeros'): a {base.__name__} whose in_channels is taken from the first input."})


def _lazy_conv_transpose(name, base):
    def __init__(self, out_channels, kernel_size, stride=1, padding=0, output_padding=0, groups=1, bias=True,
                 dilation=1, padding_mode="zeros", device=None, dtype=None):
        base.__init__(self, 0, out_channels, kernel_size, stride, padding, output_padding, groups, bias, dilation,
                      padding_mode, device, dtype)
        self._lazy_conv_start(device, dtype)
    return type(name, (_LazyConvMixin, base), {
        "__init__": __init__, "cls_to_become": base, "__module__": __name__,
        "__doc__": f"torch.nn.{name}(out_channels, kernel_size, stride=1, padding=0, output_padding=0, groups=1, "
                   f"bias=True, dilation=1, padding_mode='zeros'): a {base.__name__} whose in_channels is taken from "
                   "the first input."})


LazyConv1d, LazyConv2d, LazyConv3d = (_lazy_conv(f"LazyConv{i + 1}d", b) for i, b in enumerate((Conv1d, Conv2d,
                                                                                                  Conv3d)))
LazyConvTranspose1d, LazyConvTranspose2d, LazyConvTranspose3d = (
    _lazy_conv_transpose(f"LazyConvTranspose{i + 1}d", b)
    for i, b in enumerate((ConvTranspose1d, ConvTranspose2d, ConvTranspose3d)))


class _LazyNormMixin(_LazyMixin):
    def initialize_parameters(self, input, *args, **kwargs):
        if not self.has_uninitialized_params():
            return
        name = type(self).__name__
        # the channels: dim 1 of a batched input; an unbatched instance-norm input's dim 0 (torch takes dim 1
        # there too, which then fails its own check)
        unbatched = getattr(self, "_dims", None) is not None and input.dim() == self._dims + 1
        if input.dim() < (1 if unbatched else 2):
            raise KilnValueError(f"{name}: expected an input [N, C, ...], got {list(input.shape)}")
        c = input.shape[0] if unbatched else input.shape[1]
        self.num_features = c
        self._materialize({k: (c,) for k in ("weight", "bias", "running_mean", "running_var")})
        with _no_grad():
            for k, fill in (("weight", 1.0), ("bias", 0.0), ("running_mean", 0.0), ("running_var", 1.0)):
                t = getattr(self, k)
                if t is not None:
                    t.fill_(fill)

    def _set_sizes_from_state(self):
        for k in ("weight", "running_mean"):
            t = getattr(self, k)
            if t is not None and not isinstance(t, (UninitializedParameter, UninitializedBuffer)):
                self.num_features = t.shape[0]


def _lazy_norm(name, base, affine, track):
    def __init__(self, eps=1e-5, momentum=0.1, affine=affine, track_running_stats=track, device=None, dtype=None):
        base.__init__(self, 0, eps, momentum, affine, track_running_stats, device, dtype)
        self._lazy_start(("weight", "bias"), ("running_mean", "running_var"), device, dtype)
    return type(name, (_LazyNormMixin, base), {
        "__init__": __init__, "cls_to_become": base, "__module__": __name__,
        "__doc__": f"torch.nn.{name}(eps=1e-5, momentum=0.1, affine={affine}, track_running_stats={track}): a "
                   f"{base.__name__} whose num_features is taken from the first input."})


LazyBatchNorm1d, LazyBatchNorm2d, LazyBatchNorm3d = (_lazy_norm(f"LazyBatchNorm{i + 1}d", b, True, True)
                                                     for i, b in enumerate((BatchNorm1d, BatchNorm2d, BatchNorm3d)))
LazyInstanceNorm1d, LazyInstanceNorm2d, LazyInstanceNorm3d = (
    _lazy_norm(f"LazyInstanceNorm{i + 1}d", b, True, True)  # torch's defaults here, unlike InstanceNorm's
    for i, b in enumerate((InstanceNorm1d, InstanceNorm2d, InstanceNorm3d)))

__all__ += [
    "Buffer", "UninitializedParameter", "UninitializedBuffer", "LazyLinear", "LazyConv1d", "LazyConv2d", "LazyConv3d",
    "LazyConvTranspose1d", "LazyConvTranspose2d", "LazyConvTranspose3d", "LazyBatchNorm1d", "LazyBatchNorm2d",
    "LazyBatchNorm3d", "LazyInstanceNorm1d", "LazyInstanceNorm2d", "LazyInstanceNorm3d",
]


# ---- fractional max pooling ----
def _fractional_intervals(samples, in_size, out_size, pool, ftype):
    """torch's generate_intervals, in the input's float type, for every plane at once: samples [N, C] (one dim's
    numbers) -> the window starts [N, C, out_size] of that dim."""
    samples = np.asarray(samples, dtype=ftype)
    seq = np.zeros(samples.shape + (out_size,), dtype=np.int64)
    if out_size > 1:
        alpha = ftype(in_size - pool) / ftype(out_size - 1)
        s = samples[..., None]
        i = np.arange(out_size - 1, dtype=ftype)
        # each product in ftype, truncated to int as torch's (all non-negative: truncation is floor)
        seq[..., :out_size - 1] = ((i + s) * alpha).astype(np.int64) - (s * alpha).astype(np.int64)
    if out_size > 0:
        seq[..., out_size - 1] = in_size - pool
    return seq


def _fractional_max_pool(n, input, kernel_size, output_size, output_ratio, return_indices, _random_samples):
    name = f"fractional_max_pool{n}d"
    if input.dim() not in (n + 1, n + 2):
        raise KilnValueError(f"{name}: expected a {n + 1}D (unbatched) or {n + 2}D (batched) input, got "
                             f"{input.dim()}D input {list(input.shape)}")
    if output_size is None and output_ratio is None:
        raise KilnValueError(f"{name} requires specifying either an output_size or an output_ratio")
    k = _ints(name, "kernel_size", kernel_size, n, 1)
    spatial = list(input.shape[-n:])
    if output_size is None:
        ratio = tuple(output_ratio) if isinstance(output_ratio, (tuple, list)) else (output_ratio,) * n
        if len(ratio) != n:
            raise KilnValueError(f"{name}: output_ratio must be a number or {n} numbers, got {output_ratio!r}")
        output_size = [int(s * r) for s, r in zip(spatial, ratio)]
    out = _ints(name, "output_size", output_size, n, 0)
    for i in range(n):
        if out[i] + k[i] - 1 > spatial[i]:
            raise KilnValueError(f"{name}: the pool size {k[i]} is too large for the input size {spatial[i]} and "
                                 f"the output size {out[i]} in spatial dim {i} (output + pool - 1 must be <= input)")
    unbatched = input.dim() == n + 1
    # as torch's: every dim but the first (the batch, or an unbatched input's channels) must be non-empty
    for i in range(1, input.dim()):
        if input.shape[i] == 0:
            raise KilnValueError(f"{name}: expected input to have non-zero size for non-batch dimensions, but got "
                                 f"{list(input.shape)} with dimension {i} being empty")
    x = input.unsqueeze(0) if unbatched else input
    nb, c = x.shape[0], x.shape[1]
    if _random_samples is None:
        kw = {"dtype": x.dtype} if x.is_floating_point() else {}  # torch draws them in the input's dtype
        samples = _C.rand(nb, c, n, device=x.device, **kw)
    else:
        samples = _random_samples
        if tuple(samples.shape) != (nb, c, n):
            raise KilnValueError(f"{name}: _random_samples must be [N, C, {n}] = {[nb, c, n]} for this input, got "
                                 f"{list(samples.shape)}")
        if samples.dtype != x.dtype:
            raise KilnValueError(f"{name}: expect _random_samples to have the same dtype as input (torch's error), "
                                 f"got {samples.dtype.name} samples for a {x.dtype.name} input")
    if nb * c == 0:  # an empty batch (or an unbatched input of 0 channels): an empty result, as torch's
        values = _C.zeros([nb, c] + list(out), dtype=x.dtype, device=x.device) + x.sum() * 0
        where = _C.zeros([nb, c] + list(out), dtype=_C.dtype.int64, device=x.device)
        if unbatched:
            values, where = values.squeeze(0), where.squeeze(0)
        return (values, where) if return_indices else values
    ftype = np.float64 if x.dtype == _C.dtype.float64 else np.float32
    u = np.asarray(samples.detach().to("cpu").to(_C.dtype.float64)).astype(ftype)
    # the flat input positions of every window element, per plane: [N, C, *out, prod(k)]
    strides = [int(np.prod(spatial[i + 1:])) for i in range(n)]
    offs = np.zeros([1] * n + list(k), dtype=np.int64)
    for i in range(n):
        shape = [1] * (2 * n)
        shape[n + i] = k[i]
        offs = offs + np.arange(k[i]).reshape(shape) * strides[i]
    offs = offs.reshape([1] * n + [-1])
    order = (1, 0) if n == 2 else (0, 1, 2)  # torch's kernels: 2-d (width, height), 3-d (depth, height, width)
    # the window starts of all N * C planes at once: [N, C, *out] flat positions
    start = np.zeros((nb, c) + (1,) * n, dtype=np.int64)
    for i in range(n):
        seq = _fractional_intervals(u[:, :, order[i]], spatial[i], out[i], k[i], ftype)  # [N, C, out[i]]
        shape = [nb, c] + [1] * n
        shape[2 + i] = out[i]
        start = start + seq.reshape(shape) * strides[i]
    idx = start[..., None] + offs  # [N, C, *out, prod(k)]
    tot = int(np.prod(out))
    flat_idx = _tensor(idx.reshape(nb, c, -1), dtype=_C.dtype.int64, device=x.device)
    windows = x.reshape([nb, c, -1]).gather(2, flat_idx).reshape([nb, c, tot, offs.shape[-1]])
    if tot == 0:
        values = windows.sum(-1)
        where = _C.zeros([nb, c, tot], dtype=_C.dtype.int64, device=x.device)
    else:
        values, arg = _C.max(windows, -1)
        where = flat_idx.reshape([nb, c, tot, offs.shape[-1]]).gather(3, arg.unsqueeze(-1)).squeeze(-1)
    values = values.reshape([nb, c] + list(out))
    where = where.reshape([nb, c] + list(out))
    if unbatched:
        values, where = values.squeeze(0), where.squeeze(0)
    return (values, where) if return_indices else values


def fractional_max_pool2d(input, kernel_size, output_size=None, output_ratio=None, return_indices=False,
                          _random_samples=None):
    """torch.nn.functional.fractional_max_pool2d: max pooling over kernel_size windows at pseudo-random starts
    (Graham's fractional max pooling): an output of output_size, or int(input size * output_ratio). Each
    (sample, channel) plane's starts come from its two numbers in [0, 1) of _random_samples [N, C, 2] (width
    first, then height, as torch's kernel), drawn from Kiln's generator when None; the same samples give torch's
    windows, values and indices (into H * W)."""
    return _fractional_max_pool(2, input, kernel_size, output_size, output_ratio, return_indices, _random_samples)


def fractional_max_pool3d(input, kernel_size, output_size=None, output_ratio=None, return_indices=False,
                          _random_samples=None):
    """torch.nn.functional.fractional_max_pool3d: as fractional_max_pool2d over the last 3 dims, _random_samples
    [N, C, 3] (depth, height, width); indices into D * H * W."""
    return _fractional_max_pool(3, input, kernel_size, output_size, output_ratio, return_indices, _random_samples)


def fractional_max_pool2d_with_indices(input, kernel_size, output_size=None, output_ratio=None, return_indices=False,
                                       _random_samples=None):
    """torch.nn.functional.fractional_max_pool2d_with_indices: (values, indices), whatever return_indices."""
    return _fractional_max_pool(2, input, kernel_size, output_size, output_ratio, True, _random_samples)


def fractional_max_pool3d_with_indices(input, kernel_size, output_size=None, output_ratio=None, return_indices=False,
                                       _random_samples=None):
    """torch.nn.functional.fractional_max_pool3d_with_indices: (values, indices), whatever return_indices."""
    return _fractional_max_pool(3, input, kernel_size, output_size, output_ratio, True, _random_samples)


class _FractionalMaxPoolNd(Module):
    _n = 2

    def __init__(self, kernel_size, output_size=None, output_ratio=None, return_indices=False,
                 _random_samples=None):
        super().__init__()
        name, n = type(self).__name__, self._n
        self.kernel_size = _ints(name, "kernel_size", kernel_size, n, 1)
        self.return_indices = return_indices
        self.register_buffer("_random_samples", _random_samples)
        self.output_size = _ints(name, "output_size", output_size, n, 0) if output_size is not None else None
        self.output_ratio = None
        if output_ratio is not None:
            ratio = tuple(output_ratio) if isinstance(output_ratio, (tuple, list)) else (output_ratio,) * n
            if len(ratio) != n:
                raise KilnValueError(f"{name}: output_ratio must be a number or {n} numbers, got {output_ratio!r}")
            self.output_ratio = ratio
        if output_size is None and output_ratio is None:
            raise KilnValueError(f"{name} requires specifying either an output size, or a pooling ratio")
        if output_size is not None and output_ratio is not None:
            raise KilnValueError(f"{name}: only one of output_size and output_ratio may be specified")
        if self.output_ratio is not None and not all(0 < r < 1 for r in self.output_ratio):
            raise KilnValueError(f"{name}: output_ratio must be between 0 and 1 (got {output_ratio})")

    def forward(self, input):
        return _fractional_max_pool(self._n, input, self.kernel_size, self.output_size, self.output_ratio,
                                    self.return_indices, self._random_samples)


class FractionalMaxPool2d(_FractionalMaxPoolNd):
    """torch.nn.FractionalMaxPool2d(kernel_size, output_size=None, output_ratio=None, return_indices=False,
    _random_samples=None): F.fractional_max_pool2d (the samples a buffer, as torch's)."""
    _n = 2


class FractionalMaxPool3d(_FractionalMaxPoolNd):
    """torch.nn.FractionalMaxPool3d: F.fractional_max_pool3d."""
    _n = 3


for _fn in (fractional_max_pool2d, fractional_max_pool3d, fractional_max_pool2d_with_indices,
            fractional_max_pool3d_with_indices):
    setattr(F, _fn.__name__, _fn)
del _fn
__all__ += ["FractionalMaxPool2d", "FractionalMaxPool3d"]
