"""More of torch.nn's layers, each a thin module over kiln.nn.functional: transposed convolutions,
1-D and 3-D pooling, activations, instance norm, channel dropout, reshaping layers and
MultiheadAttention."""
import math

from .. import _C
from .._C import KilnValueError
from .._tensor import no_grad, tensor as _tensor
from . import functional as F
from .modules import Module, Parameter, Linear, Softmax, _ConvNd, _MaxPoolNd, _AvgPoolNd, _Inplace, _check_p, _place, \
    _uniform, _NormBase, _inplace_result


# ---- transposed convolution ----
class _ConvTransposeNd(_ConvNd):
    """weight [in_channels, out_channels / groups, *kernel_size] (torch's layout); forward's output_size
    picks the output_padding that gives that size, as torch."""
    _transposed = True

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, output_padding=0, groups=1,
                 bias=True, dilation=1, padding_mode="zeros", device=None, dtype=None):
        if isinstance(padding, str):
            raise KilnValueError(f"{type(self).__name__}: padding must be an int or ints, got {padding!r}")
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias, padding_mode,
                         device, dtype, output_padding)

    def _output_padding(self, x, output_size):
        if output_size is None:
            return self.output_padding
        n = self._dims
        output_size = list(output_size)[-n:]
        out = []
        for i in range(n):
            size = x.shape[x.dim() - n + i]
            least = ((size - 1) * self.stride[i] - 2 * self.padding[i] + self.dilation[i] * (self.kernel_size[i] - 1)
                     + 1)
            if not least <= output_size[i] < least + self.stride[i]:
                raise KilnValueError(f"{type(self).__name__}: requested an output size of {output_size}, but valid "
                                     f"sizes in dim {i} range from {least} to {least + self.stride[i] - 1}")
            out.append(output_size[i] - least)
        return tuple(out)

    def forward(self, x, output_size=None):
        n = self._dims
        if output_size is not None and len(output_size) not in (n, x.dim()):
            # As torch: the spatial sizes, or the input's every dim; any other length is an error, not cut.
            raise KilnValueError(f"{type(self).__name__}: for {x.dim()}D input, output_size must have {n} or "
                                 f"{x.dim()} elements (got {len(output_size)})")
        unbatched = self._unbatched(x)
        if unbatched:
            x = x.unsqueeze(0)
        op = self._output_padding(x, output_size)
        y = type(self)._fn(x, self.weight, self.bias, self.stride, self.padding, op, self.groups, self.dilation)
        return y.squeeze(0) if unbatched else y


class ConvTranspose1d(_ConvTransposeNd):
    _fn = staticmethod(F.conv_transpose1d)
    _dims = 1


class ConvTranspose2d(_ConvTransposeNd):
    _fn = staticmethod(F.conv_transpose2d)
    _dims = 2


# ---- pooling ----
class MaxPool1d(_MaxPoolNd):
    _fn = staticmethod(F.max_pool1d)


class MaxPool3d(_MaxPoolNd):
    _fn = staticmethod(F.max_pool3d)


class AvgPool1d(_AvgPoolNd):
    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True):
        one = (lambda v: tuple(v) if hasattr(v, "__len__") else (v,))  # torch keeps 1-tuples here
        super().__init__(one(kernel_size), one(stride if stride is not None else kernel_size), one(padding),
                         ceil_mode, count_include_pad)

    def forward(self, x):
        return F.avg_pool1d(x, self.kernel_size, self.stride, self.padding, self.ceil_mode, self.count_include_pad)


class AvgPool3d(_AvgPoolNd):
    _fn = staticmethod(F.avg_pool3d)


# ---- activations ----
def _activation(name, fn, doc):
    return type(name, (Module,), {"forward": lambda self, x: fn(x), "__doc__": doc, "__module__": __name__})


Softsign = _activation("Softsign", F.softsign, "x / (1 + |x|)")
Tanhshrink = _activation("Tanhshrink", lambda x: x - F.tanh(x), "x - tanh(x)")
LogSigmoid = _activation("LogSigmoid", F.logsigmoid, "log(sigmoid(x))")


class ReLU6(_Inplace):
    """min(max(x, 0), 6)"""
    _fn = staticmethod(F.relu6)


class Hardswish(_Inplace):
    """x * relu6(x + 3) / 6"""
    _fn = staticmethod(F.hardswish)

    def extra_repr(self):  # torch's Hardswish and Hardsigmoid do not show inplace
        return ""


class Hardsigmoid(_Inplace):
    """relu6(x + 3) / 6"""
    _fn = staticmethod(F.hardsigmoid)

    def extra_repr(self):
        return ""


class SELU(_Inplace):
    _fn = staticmethod(F.selu)


class Mish(_Inplace):
    """x * tanh(softplus(x))"""
    _fn = staticmethod(F.mish)


class ELU(Module):
    def __init__(self, alpha=1.0, inplace=False):
        super().__init__()
        self.alpha, self.inplace = alpha, inplace

    def forward(self, x):
        return _inplace_result(x, F.elu(x, self.alpha, self.inplace), self.inplace)

    def extra_repr(self):
        return f"alpha={self.alpha}" + (", inplace=True" if self.inplace else "")


class CELU(ELU):
    def forward(self, x):
        return _inplace_result(x, F.celu(x, self.alpha, self.inplace), self.inplace)


class Hardtanh(Module):
    def __init__(self, min_val=-1.0, max_val=1.0, inplace=False):
        super().__init__()
        if max_val <= min_val:
            raise KilnValueError(f"Hardtanh: max_val ({max_val}) must be greater than min_val ({min_val})")
        self.min_val, self.max_val, self.inplace = min_val, max_val, inplace

    def forward(self, x):
        return _inplace_result(x, F.hardtanh(x, self.min_val, self.max_val, self.inplace), self.inplace)

    def extra_repr(self):
        return f"min_val={self.min_val}, max_val={self.max_val}" + (", inplace=True" if self.inplace else "")


class Softplus(Module):
    def __init__(self, beta=1.0, threshold=20.0):
        super().__init__()
        self.beta, self.threshold = beta, threshold

    def forward(self, x):
        return F.softplus(x, self.beta, self.threshold)

    def extra_repr(self):
        return f"beta={self.beta}, threshold={self.threshold}"


class PReLU(Module):
    """max(0, x) + weight * min(0, x), weight learnable: one slope, or num_parameters (one per channel,
    dim 1 of the input)."""

    def __init__(self, num_parameters=1, init=0.25, device=None, dtype=None):
        super().__init__()
        self.num_parameters = num_parameters
        self.weight = Parameter(_C.full([num_parameters], float(init)))
        _place(self, device, dtype)

    def forward(self, x):
        if x.dim() == 0:  # as torch: a 0-d input gives a 0-d output
            return F.prelu(x.reshape([1]), self.weight).reshape([])
        return F.prelu(x, self.weight)

    def extra_repr(self):
        return f"num_parameters={self.num_parameters}"


class GLU(Module):
    def __init__(self, dim=-1):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return F.glu(x, self.dim)

    def extra_repr(self):
        return f"dim={self.dim}"


class LogSoftmax(Softmax):
    def forward(self, x):
        return F.log_softmax(x, self.dim)


class Softmin(Softmax):
    def forward(self, x):
        return F.softmin(x, self.dim)


# ---- normalisation ----
class _InstanceNorm(_NormBase):
    """torch's InstanceNorm: affine and track_running_stats off by default; an unbatched input
    ([C, ...]) gets a batch dim of one."""
    _dims = 1

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=False, track_running_stats=False, device=None,
                 dtype=None, *, bias=True):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype, bias)

    def forward(self, x):
        n = self._dims
        if x.dim() not in (n + 1, n + 2):
            raise KilnValueError(f"expected {n + 1}D or {n + 2}D input (got {x.dim()}D input)")
        unbatched = x.dim() == n + 1
        if unbatched:
            x = x.unsqueeze(0)
        use_input_stats = self.training or not self.track_running_stats
        # checkpoint's backward reruns the block: the running statistics were updated by the first run
        rerun = use_input_stats and _C._recomputing()
        y = F.instance_norm(x, None if rerun else self.running_mean, None if rerun else self.running_var,
                            self.weight, self.bias, use_input_stats,
                            self.momentum if self.momentum is not None else 0.0, self.eps)
        return y.squeeze(0) if unbatched else y


class InstanceNorm1d(_InstanceNorm):
    _dims = 1


class InstanceNorm2d(_InstanceNorm):
    _dims = 2


class InstanceNorm3d(_InstanceNorm):
    _dims = 3


# ---- dropout ----
class _DropoutNd(Module):
    _fn = None

    def __init__(self, p=0.5, inplace=False):
        super().__init__()
        self.p, self.inplace = _check_p(type(self).__name__, p), inplace

    def forward(self, x):
        return _inplace_result(x, type(self)._fn(x, self.p, self.training, self.inplace), self.inplace)

    def extra_repr(self):
        return f"p={self.p}, inplace={self.inplace}"


class Dropout1d(_DropoutNd):
    _fn = staticmethod(F.dropout1d)


class Dropout2d(_DropoutNd):
    _fn = staticmethod(F.dropout2d)


class Dropout3d(_DropoutNd):
    _fn = staticmethod(F.dropout3d)


# ---- reshaping ----
class Unflatten(Module):
    """Splits dim into unflattened_size (one entry may be -1)."""

    def __init__(self, dim, unflattened_size):
        super().__init__()
        self.dim, self.unflattened_size = dim, tuple(unflattened_size)

    def forward(self, x):
        shape = list(x.shape)
        d = self.dim + len(shape) if self.dim < 0 else self.dim
        return x.reshape(shape[:d] + list(self.unflattened_size) + shape[d + 1:])

    def extra_repr(self):
        return f"dim={self.dim}, unflattened_size={self.unflattened_size}"


class PixelShuffle(Module):
    def __init__(self, upscale_factor):
        super().__init__()
        self.upscale_factor = upscale_factor

    def forward(self, x):
        return F.pixel_shuffle(x, self.upscale_factor)

    def extra_repr(self):
        return f"upscale_factor={self.upscale_factor}"


class PixelUnshuffle(Module):
    def __init__(self, downscale_factor):
        super().__init__()
        self.downscale_factor = downscale_factor

    def forward(self, x):
        return F.pixel_unshuffle(x, self.downscale_factor)

    def extra_repr(self):
        return f"downscale_factor={self.downscale_factor}"


# ---- attention ----
class MultiheadAttention(Module):
    """torch.nn.MultiheadAttention's parameters (in_proj_weight [3E, E], or q/k/v_proj_weight when kdim
    or vdim differ from embed_dim; in_proj_bias; out_proj; bias_k/bias_v with add_bias_kv) and forward:
    inputs [L, N, E] ([N, L, E] with batch_first, [L, E] unbatched); key_padding_mask [N, S] and
    attn_mask [L, S] or [N * heads, L, S], bool (True: not attended) or added to the scores;
    need_weights also returns the attention weights, averaged over the heads unless
    average_attn_weights=False. Computed by Kiln's attention; differences from torch: the weights
    returned are those before dropout, and a query that may attend nothing gives zeros, not NaN."""

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False, add_zero_attn=False,
                 kdim=None, vdim=None, batch_first=False, device=None, dtype=None):
        super().__init__()
        if embed_dim <= 0 or num_heads <= 0:
            raise KilnValueError(f"MultiheadAttention: embed_dim ({embed_dim}) and num_heads ({num_heads}) must be "
                                 "greater than 0")
        if embed_dim % num_heads:
            raise KilnValueError(f"MultiheadAttention: embed_dim ({embed_dim}) must be divisible by num_heads "
                                 f"({num_heads})")
        self.embed_dim, self.num_heads, self.dropout, self.batch_first = embed_dim, num_heads, dropout, batch_first
        self.kdim = kdim if kdim is not None else embed_dim
        self.vdim = vdim if vdim is not None else embed_dim
        self.head_dim = embed_dim // num_heads
        self.add_zero_attn = add_zero_attn
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        e = embed_dim

        def xavier(rows, cols):  # torch's xavier_uniform_ bound
            return _uniform((rows, cols), math.sqrt(6.0 / (rows + cols)))

        if self._qkv_same_embed_dim:
            self.in_proj_weight = Parameter(xavier(3 * e, e))
            self.register_parameter("q_proj_weight", None)
            self.register_parameter("k_proj_weight", None)
            self.register_parameter("v_proj_weight", None)
        else:
            self.register_parameter("in_proj_weight", None)
            self.q_proj_weight = Parameter(xavier(e, e))
            self.k_proj_weight = Parameter(xavier(e, self.kdim))
            self.v_proj_weight = Parameter(xavier(e, self.vdim))
        self.in_proj_bias = Parameter(_C.zeros(3 * e)) if bias else None
        self.out_proj = Linear(e, e, bias=bias)
        if bias:
            with no_grad():
                self.out_proj.bias.zero_()
        if add_bias_kv:
            self.bias_k = Parameter(_C.randn(1, 1, e) * math.sqrt(2.0 / (1 + e)))  # torch's xavier_normal_
            self.bias_v = Parameter(_C.randn(1, 1, e) * math.sqrt(2.0 / (1 + e)))
        else:
            self.bias_k = self.bias_v = None
        _place(self, device, dtype)

    def _projections(self):
        e = self.embed_dim
        if self._qkv_same_embed_dim:
            w = self.in_proj_weight
            ws = (w[0:e], w[e:2 * e], w[2 * e:3 * e])
        else:
            ws = (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight)
        b = self.in_proj_bias
        bs = (None, None, None) if b is None else (b[0:e], b[e:2 * e], b[2 * e:3 * e])
        return ws, bs

    @staticmethod
    def _additive(mask, dtype, what):
        if mask is None:
            return None
        if mask.dtype == _C.dtype.bool:  # torch's rule here: True is left out
            return _C.zeros(list(mask.shape), dtype=dtype, device=mask.device).masked_fill(mask, float("-inf"))
        if not mask.is_floating_point():
            raise KilnValueError(f"MultiheadAttention: {what} must be bool or floating, got {mask.dtype}")
        return mask.to(dtype)

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True, is_causal=False):
        if query.dim() not in (2, 3):
            raise KilnValueError(f"MultiheadAttention: query must be 2-D (unbatched) or 3-D, got "
                                 f"{tuple(query.shape)}")
        unbatched = query.dim() == 2
        if unbatched:
            query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        elif self.batch_first:
            query, key, value = (t.transpose(0, 1) for t in (query, key, value))
        if is_causal and attn_mask is None:
            raise KilnValueError("MultiheadAttention: is_causal needs attn_mask (torch's rule: it is a hint)")
        tgt, n, e = query.shape
        h, d = self.num_heads, self.head_dim
        (wq, wk, wv), (bq, bk, bv) = self._projections()
        q, k, v = F.linear(query, wq, bq), F.linear(key, wk, bk), F.linear(value, wv, bv)
        mask = self._additive(attn_mask, q.dtype, "attn_mask")
        if mask is not None and mask.dim() == 2:
            mask = mask.unsqueeze(0)
        kpm = self._additive(key_padding_mask, q.dtype, "key_padding_mask")
        if self.bias_k is not None:
            k = _C.cat([k, self.bias_k.expand([1, n, e])], 0)
            v = _C.cat([v, self.bias_v.expand([1, n, e])], 0)
            mask = None if mask is None else F.pad(mask, [0, 1])
            kpm = None if kpm is None else F.pad(kpm, [0, 1])
        # [L, N, E] -> [N, H, L, D]
        q, k, v = (t.reshape([t.shape[0], n, h, d]).permute(1, 2, 0, 3) for t in (q, k, v))
        if self.add_zero_attn:
            k = _C.cat([k, _C.zeros([n, h, 1, d], dtype=k.dtype, device=k.device)], 2)
            v = _C.cat([v, _C.zeros([n, h, 1, d], dtype=v.dtype, device=v.device)], 2)
            mask = None if mask is None else F.pad(mask, [0, 1])
            kpm = None if kpm is None else F.pad(kpm, [0, 1])
        src = k.shape[2]
        if mask is not None:
            mask = mask.reshape([n, h, tgt, src]) if mask.shape[0] == n * h and n * h > 1 else mask.unsqueeze(0)
        if kpm is not None:
            kpm = kpm.reshape([n, 1, 1, src])
            mask = kpm if mask is None else mask + kpm
        p = self.dropout if self.training else 0.0
        res = F.attention(q, k, v, mask, dropout_p=p, training=self.training, need_weights=need_weights)
        out, weights = res if need_weights else (res, None)
        out = self.out_proj(out.permute(2, 0, 1, 3).reshape([tgt, n, e]))  # [L, N, E]
        if weights is not None and average_attn_weights:
            weights = weights.mean(1)
        if unbatched:
            out = out.squeeze(1)
            weights = None if weights is None else weights.squeeze(0)
        elif self.batch_first:
            out = out.transpose(0, 1)
        return out, weights


class _AdaptivePoolNd(Module):
    def __init__(self, output_size, return_indices=False):
        super().__init__()
        self.output_size, self.return_indices = output_size, return_indices

    def extra_repr(self):
        return f"output_size={self.output_size}"


class AdaptiveAvgPool1d(_AdaptivePoolNd):
    """torch.nn.AdaptiveAvgPool1d: F.adaptive_avg_pool1d."""

    def __init__(self, output_size):
        super().__init__(output_size)
        del self.return_indices

    def forward(self, x):
        return F.adaptive_avg_pool1d(x, self.output_size)


class AdaptiveMaxPool1d(_AdaptivePoolNd):
    """torch.nn.AdaptiveMaxPool1d: F.adaptive_max_pool1d."""

    def forward(self, x):
        return F.adaptive_max_pool1d(x, self.output_size, self.return_indices)


class AdaptiveMaxPool2d(_AdaptivePoolNd):
    """torch.nn.AdaptiveMaxPool2d: F.adaptive_max_pool2d."""

    def forward(self, x):
        return F.adaptive_max_pool2d(x, self.output_size, self.return_indices)
