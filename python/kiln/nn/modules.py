"""kiln.nn modules in Python: Module (parameters, buffers and submodules by attribute, dotted names,
state_dict), Parameter, and the common layers over kiln.nn.functional. Initialisation follows
PyTorch's defaults (uniform in +-1/sqrt(fan_in) for Linear and Conv)."""
import collections
import math
import operator
from collections import OrderedDict

from .. import _C
from .._C import Tensor, KilnError, KilnValueError
from .._tensor import no_grad, tensor as _tensor
from . import functional as F


# What load_state_dict(strict=False) left out, as torch's named tuple: names of the module's tensors
# the state dict lacks, and names in the state dict the module does not have.
IncompatibleKeys = collections.namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])


class Parameter(Tensor):
    """A tensor that is a module's parameter: a leaf that requires grad, sharing `data`'s memory (a
    list, a number or a NumPy array is copied into a new tensor first; None gives an empty one)."""

    def __init__(self, data=None, requires_grad=True):
        if data is None:
            data = _C.empty(0)
        elif not isinstance(data, Tensor):
            data = _tensor(data)
        super().__init__(data.detach())
        self.requires_grad_(requires_grad)

    def __repr__(self):
        return "Parameter containing:\n" + super().__repr__()


class Module:
    """Base class of every module: assign Parameters, Modules and (register_buffer) buffers as
    attributes; forward() computes; calling the module calls forward."""

    def __init__(self):
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "training", True)

    # ---- attributes ----
    def __setattr__(self, name, value):
        if "_parameters" not in self.__dict__:
            raise KilnError(f"{type(self).__name__}: call super().__init__() before assigning attributes")
        if isinstance(value, (Parameter, Module)):
            for d in (self._parameters, self._buffers, self._modules, self.__dict__):
                d.pop(name, None)
            (self._parameters if isinstance(value, Parameter) else self._modules)[name] = value
        elif name in self._buffers:
            self._buffers[name] = value
        elif name in self._parameters:
            if value is not None:
                raise KilnError(f"cannot assign a {type(value).__name__} to parameter '{name}' "
                                "(wrap it in kiln.nn.Parameter)")
            self._parameters[name] = None
        else:
            object.__setattr__(self, name, value)

    def __getattr__(self, name):
        d = self.__dict__
        for store in ("_parameters", "_buffers", "_modules"):
            if store in d and name in d[store]:
                return d[store][name]
        raise AttributeError(f"'{type(self).__name__}' has no attribute '{name}'")

    def __delattr__(self, name):
        for d in (self._parameters, self._buffers, self._modules):
            if name in d:
                del d[name]
                return
        object.__delattr__(self, name)

    def register_parameter(self, name, param):
        if param is not None and not isinstance(param, Parameter):
            param = Parameter(param)
        self._parameters[name] = param

    def register_buffer(self, name, tensor):
        self._buffers[name] = tensor

    def add_module(self, name, module):
        self._modules[name] = module

    # ---- traversal ----
    def named_children(self):
        return iter(self._modules.items())

    def children(self):
        return iter(self._modules.values())

    def named_modules(self, prefix="", remove_duplicate=True):
        """Every module once (as PyTorch: a module reused under two names comes under its first), or every
        name with remove_duplicate=False."""
        seen = set()
        for name, m in self._all_modules(prefix):
            if remove_duplicate:
                if id(m) in seen:
                    continue
                seen.add(id(m))
            yield name, m

    def _all_modules(self, prefix):
        yield prefix, self
        for name, m in self._modules.items():
            if m is not None:
                yield from m._all_modules(f"{prefix}.{name}" if prefix else name)

    def modules(self):
        return (m for _, m in self.named_modules())

    def named_parameters(self, prefix="", remove_duplicate=True):
        """Every parameter once: a tied (shared) one under its first name, as PyTorch, so that an optimizer
        steps it once; remove_duplicate=False gives every name (what state_dict holds)."""
        seen = set()
        for mp, m in self.named_modules(prefix, remove_duplicate=False):
            for name, p in m._own_parameters():
                if p is None:
                    continue
                if remove_duplicate:
                    if id(p) in seen:
                        continue
                    seen.add(id(p))
                yield (f"{mp}.{name}" if mp else name), p

    def _own_parameters(self):
        return self._parameters.items()

    def _own_buffers(self):
        return self._buffers.items()

    def parameters(self):
        return [p for _, p in self.named_parameters()]

    def named_buffers(self, prefix="", remove_duplicate=True):
        for mp, m in self.named_modules(prefix, remove_duplicate=remove_duplicate):
            for name, b in m._own_buffers():
                if b is not None:
                    yield (f"{mp}.{name}" if mp else name), b

    def buffers(self):
        return [b for _, b in self.named_buffers()]

    def num_parameters(self):
        return sum(p.numel() for p in self.parameters())

    # ---- modes and conversions ----
    def train(self, mode=True):
        for m in self.modules():
            object.__setattr__(m, "training", bool(mode))
            m._set_mode(bool(mode))
        return self

    def _set_mode(self, mode):
        pass

    def eval(self):
        return self.train(False)

    def zero_grad(self):
        for p in self.parameters():
            p.grad = None

    def requires_grad_(self, requires_grad=True):
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    def to(self, *args, **kwargs):
        """Moves every parameter and buffer to a device and converts the floating ones to a dtype:
        to("cuda"), to(kiln.float64), to("cuda", kiln.bfloat16), to(device=..., dtype=...)."""
        device, dtype = _parse_to(args, kwargs)
        with no_grad():
            for m in self.modules():
                m._convert(device, dtype)
        return self

    def _convert(self, device, dtype):
        def conv(t):
            if device is not None:
                t = t.to(device)
            if dtype is not None and t.is_floating_point():
                t = t.to(dtype)
            return t

        for name, p in list(self._parameters.items()):
            if p is not None:
                q = conv(p)
                if q is not p:
                    self._parameters[name] = Parameter(q, p.requires_grad)
        for name, b in list(self._buffers.items()):
            if b is not None:
                self._buffers[name] = conv(b)

    def cpu(self):
        return self.to("cpu")

    def cuda(self, device=0):
        return self.to(f"cuda:{device}" if isinstance(device, int) else device)

    def float(self):
        return self.to(_C.dtype.float32)

    def double(self):
        return self.to(_C.dtype.float64)

    # ---- state ----
    def state_dict(self):
        """Parameters and buffers by dotted name, detached (they share memory with the module)."""
        sd = OrderedDict()
        for n, p in self.named_parameters(remove_duplicate=False):
            sd[n] = p.detach()
        for n, b in self.named_buffers(remove_duplicate=False):
            sd[n] = b.detach()
        return sd

    def load_state_dict(self, state_dict, strict=True):
        """Copies tensors into the parameters and buffers of the same names. With strict, a missing or
        unexpected name is an error that names them (and nothing is copied); a shape mismatch always is.
        Returns (missing_keys, unexpected_keys), as torch does: what strict=False left out."""
        _check_state_dict(state_dict)
        mine = self.state_dict()
        missing = [k for k in mine if k not in state_dict]
        unexpected = [k for k in state_dict if k not in mine]
        if strict and (missing or unexpected):
            raise KilnError(f"load_state_dict: missing {missing}, unexpected {unexpected}")
        for k, t in state_dict.items():
            if k in mine and tuple(t.shape) != tuple(mine[k].shape):
                raise KilnError(f"load_state_dict: {k} has shape {tuple(t.shape)}, the module's is {tuple(mine[k].shape)}")
        with no_grad():
            for k, t in state_dict.items():
                if k in mine:
                    mine[k].copy_(t)
        return IncompatibleKeys(missing, unexpected)

    # ---- calling ----
    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} must define forward")

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def extra_repr(self):
        return ""

    def __repr__(self):
        lines = [f"{type(self).__name__}({self.extra_repr()}"]
        for name, m in self._modules.items():
            sub = repr(m).replace("\n", "\n  ")
            lines.append(f"  ({name}): {sub}")
        return lines[0] + ")" if len(lines) == 1 else "\n".join(lines) + "\n)"


def _check_state_dict(state_dict):
    """load_state_dict's argument: a mapping of str -> kiln.Tensor."""
    if not hasattr(state_dict, "items"):
        raise TypeError(f"load_state_dict: expected a dict of name -> kiln.Tensor, got {type(state_dict).__name__}")
    for k, t in state_dict.items():
        if not isinstance(t, Tensor):
            raise TypeError(f"load_state_dict: '{k}' is a {type(t).__name__}, expected kiln.Tensor "
                            "(convert it with kiln.tensor)")


def _parse_to(args, kwargs):
    device, dtype = kwargs.get("device"), kwargs.get("dtype")
    for a in args:
        if isinstance(a, Tensor):
            device, dtype = a.device, a.dtype
        elif isinstance(a, _C.dtype):
            dtype = a
        elif isinstance(a, str):
            try:
                device = _C.Device(a)
            except ValueError:
                try:
                    dtype = _C.promote_types(a, a)
                except ValueError:
                    raise KilnValueError(f"to(): '{a}' is neither a device (\"cpu\", \"cuda\", \"cuda:N\") nor a dtype "
                                         "(float32, float16, bfloat16, float64, int64, int32, int16, int8, uint8, "
                                         "bool)") from None
        else:
            device = a
    return device, dtype


def _check_count(cls, name, value, minimum=0):
    try:
        n = operator.index(value)  # an int, or NumPy's integers (nn.Linear(np.prod(shape), 10))
    except TypeError:
        n = None
    if isinstance(value, bool) or n is None or n < minimum:
        raise KilnValueError(f"{cls}: {name} must be an int >= {minimum}, got {value!r}")
    return n


def _uniform(shape, bound):
    return _C.rand(*shape) * (2 * bound) - bound


def _bound(fan_in):
    """PyTorch's default init bound 1/sqrt(fan_in); 0 for no inputs (the weight has no elements)."""
    return 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0


def _place(module, device, dtype):
    """The device= and dtype= that torch's layers take: the parameters are made, then moved."""
    if device is not None or dtype is not None:
        module.to(device=device, dtype=dtype)


def _ntuple(v, n):
    return tuple(v) if hasattr(v, "__len__") else (v,) * n


class Linear(Module):
    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None):
        super().__init__()
        in_features = _check_count("Linear", "in_features", in_features)
        out_features = _check_count("Linear", "out_features", out_features)
        self.in_features, self.out_features = in_features, out_features
        bound = _bound(in_features)
        self.weight = Parameter(_uniform((out_features, in_features), bound))
        self.bias = Parameter(_uniform((out_features,), bound)) if bias else None
        _place(self, device, dtype)

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


_PADDING_MODES = ("zeros", "reflect", "replicate", "circular")


class _ConvNd(Module):
    """Convolution layers (and, with _transposed, the transposed ones): stride, padding, dilation and
    output_padding stored as tuples, as torch. padding_mode other than "zeros" pads the input with
    F.pad first and convolves without padding (torch's way); an unbatched input ([C, ...]) gets a batch
    dim of one for the call."""
    _fn = None
    _dims = 2
    _transposed = False

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1, bias=True,
                 padding_mode="zeros", device=None, dtype=None, output_padding=0):
        super().__init__()
        name = type(self).__name__
        n = self._dims
        k = _ntuple(kernel_size, n)
        in_channels = _check_count(name, "in_channels", in_channels)
        out_channels = _check_count(name, "out_channels", out_channels)
        groups = _check_count(name, "groups", groups, 1)
        if len(k) != n:
            raise KilnValueError(f"{name}: kernel_size must be an int or {n} ints, got {kernel_size!r}")
        k = tuple(_check_count(name, "kernel_size", v, 1) for v in k)
        if in_channels % groups or out_channels % groups:
            raise KilnValueError(f"{name}: in_channels ({in_channels}) and out_channels ({out_channels}) must be "
                                 f"divisible by groups ({groups})")
        if padding_mode not in _PADDING_MODES:
            raise KilnValueError(f"{name}: padding_mode must be one of {_PADDING_MODES}, got {padding_mode!r}")
        stride, dilation = _ntuple(stride, n), _ntuple(dilation, n)
        if isinstance(padding, str):
            if padding not in ("same", "valid"):
                raise KilnValueError(f"{name}: padding must be an int, {n} ints, 'same' or 'valid', got {padding!r}")
            if padding == "same" and any(s != 1 for s in stride):
                raise KilnValueError(f"{name}: padding='same' is not supported for strided convolutions")
        else:
            padding = _ntuple(padding, n)
        if self._transposed and padding_mode != "zeros":
            raise KilnValueError(f"{name}: only 'zeros' padding mode is supported, got {padding_mode!r}")
        self.stride, self.padding, self.dilation, self.groups = stride, padding, dilation, groups
        self.output_padding = _ntuple(output_padding, n)
        self.in_channels, self.out_channels, self.kernel_size = in_channels, out_channels, k
        self.padding_mode = padding_mode
        # torch's kaiming_uniform(a=sqrt(5)) bound: 1/sqrt(fan_in), fan_in from the weight's dim 1
        wshape = ((in_channels, out_channels // groups) if self._transposed
                  else (out_channels, in_channels // groups)) + k
        bound = _bound(wshape[1] * math.prod(k))
        self.weight = Parameter(_uniform(wshape, bound))
        self.bias = Parameter(_uniform((out_channels,), bound)) if bias else None
        _place(self, device, dtype)

    def _pad_amounts(self):
        """F.pad's list (last dim first) for a padding_mode other than zeros; 'same' puts the odd element
        on the right, as torch."""
        out = []
        for i in reversed(range(self._dims)):
            if self.padding == "same":
                total = self.dilation[i] * (self.kernel_size[i] - 1)
                out += [total // 2, total - total // 2]
            elif self.padding == "valid":
                out += [0, 0]
            else:
                out += [self.padding[i], self.padding[i]]
        return out

    def _unbatched(self, x):
        if x.dim() == self._dims + 1:
            return True
        if x.dim() != self._dims + 2:
            raise KilnValueError(f"{type(self).__name__}: expected a {self._dims + 1}-D (unbatched) or "
                                 f"{self._dims + 2}-D (batched) input, got {tuple(x.shape)}")
        return False

    def forward(self, x):
        unbatched = self._unbatched(x)
        if unbatched:
            x = x.unsqueeze(0)
        if self.padding_mode != "zeros":
            x = F.pad(x, self._pad_amounts(), mode=self.padding_mode)
            y = type(self)._fn(x, self.weight, self.bias, self.stride, 0, self.dilation, self.groups)
        else:
            y = type(self)._fn(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)
        return y.squeeze(0) if unbatched else y

    def extra_repr(self):
        s = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"
        if self.padding != (0,) * len(self.padding):
            s += f", padding={self.padding}"
        if self.dilation != (1,) * len(self.dilation):
            s += f", dilation={self.dilation}"
        if self.output_padding != (0,) * len(self.output_padding):
            s += f", output_padding={self.output_padding}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        if self.bias is None:
            s += ", bias=False"
        if self.padding_mode != "zeros":
            s += f", padding_mode={self.padding_mode}"
        return s


class Conv1d(_ConvNd):
    _fn = staticmethod(F.conv1d)
    _dims = 1


class Conv2d(_ConvNd):
    _fn = staticmethod(F.conv2d)
    _dims = 2


class Conv3d(_ConvNd):
    _fn = staticmethod(F.conv3d)
    _dims = 3


class _BatchNorm(Module):
    """torch's BatchNorm: running_mean/running_var and num_batches_tracked (int64, counted in training)
    when track_running_stats; momentum=None is the cumulative average (factor 1/num_batches_tracked)."""
    _expected = ()

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True, device=None,
                 dtype=None, *, bias=True):
        super().__init__()
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.affine, self.track_running_stats = affine, track_running_stats
        self.weight = Parameter(_C.ones(num_features)) if affine else None
        self.bias = Parameter(_C.zeros(num_features)) if affine and bias else None
        if track_running_stats:
            self.register_buffer("running_mean", _C.zeros(num_features))
            self.register_buffer("running_var", _C.ones(num_features))
            self.register_buffer("num_batches_tracked", _tensor(0, dtype=_C.dtype.int64))
        else:
            self.register_buffer("running_mean", None)
            self.register_buffer("running_var", None)
            self.register_buffer("num_batches_tracked", None)
        _place(self, device, dtype)

    def _check_input_dim(self, x):
        if x.dim() not in self._expected:
            want = " or ".join(f"{d}D" for d in self._expected)
            raise KilnValueError(f"expected {want} input (got {x.dim()}D input)")

    def forward(self, x):
        self._check_input_dim(x)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            with no_grad():
                self.num_batches_tracked.add_(1)
            factor = 1.0 / self.num_batches_tracked.item() if self.momentum is None else self.momentum
        training = self.training or self.running_mean is None
        use_running = not self.training or self.track_running_stats
        return F.batch_norm(x, self.running_mean if use_running else None, self.running_var if use_running else None,
                            self.weight, self.bias, training, factor, self.eps)

    def extra_repr(self):
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
                f"bias={self.bias is not None}, track_running_stats={self.track_running_stats}")


class BatchNorm1d(_BatchNorm):
    _expected = (2, 3)


class BatchNorm2d(_BatchNorm):
    _expected = (4,)


class BatchNorm3d(_BatchNorm):
    _expected = (5,)


class LayerNorm(Module):
    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True, device=None, dtype=None):
        super().__init__()
        self.normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.eps, self.elementwise_affine = eps, elementwise_affine
        self.weight = Parameter(_C.ones(self.normalized_shape)) if elementwise_affine else None
        self.bias = Parameter(_C.zeros(self.normalized_shape)) if elementwise_affine and bias else None
        _place(self, device, dtype)

    def forward(self, x):
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self):
        return (f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}, "
                f"bias={self.bias is not None}")


class RMSNorm(Module):
    def __init__(self, normalized_shape, eps=None, elementwise_affine=True, device=None, dtype=None):
        super().__init__()
        self.normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.eps, self.elementwise_affine = eps, elementwise_affine
        self.weight = Parameter(_C.ones(self.normalized_shape)) if elementwise_affine else None
        _place(self, device, dtype)

    def forward(self, x):
        return F.rms_norm(x, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self):
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


class GroupNorm(Module):
    def __init__(self, num_groups, num_channels, eps=1e-5, affine=True, device=None, dtype=None, *, bias=True):
        super().__init__()
        if num_channels % num_groups:
            raise KilnValueError(f"GroupNorm: num_channels ({num_channels}) must be divisible by num_groups "
                                 f"({num_groups})")
        self.num_groups, self.num_channels, self.eps, self.affine = num_groups, num_channels, eps, affine
        self.weight = Parameter(_C.ones(num_channels)) if affine else None
        self.bias = Parameter(_C.zeros(num_channels)) if affine and bias else None
        _place(self, device, dtype)

    def forward(self, x):
        return F.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)

    def extra_repr(self):
        return (f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}, "
                f"bias={self.bias is not None}")


class Embedding(Module):
    """torch's Embedding: padding_idx's row starts at 0 (it still gets gradients here: torch zeroes
    them). max_norm, scale_grad_by_freq and sparse are not supported and are refused by name."""

    def __init__(self, num_embeddings, embedding_dim, padding_idx=None, max_norm=None, norm_type=2.0,
                 scale_grad_by_freq=False, sparse=False, _weight=None, _freeze=False, device=None, dtype=None):
        super().__init__()
        for arg, v, default in (("max_norm", max_norm, None), ("scale_grad_by_freq", scale_grad_by_freq, False),
                                ("sparse", sparse, False)):
            if v != default:
                raise KilnError(f"Embedding: {arg}={v!r} is not supported by Kiln (leave it at {default!r})")
        if padding_idx is not None:
            # as torch: a negative index counts from the end and is stored as the row it names
            padding_idx = operator.index(padding_idx)
            if not -num_embeddings <= padding_idx < num_embeddings:
                raise ValueError(
                    f"Embedding: padding_idx {padding_idx} is outside "
                    f"[-{num_embeddings}, {num_embeddings})")
            if padding_idx < 0:
                padding_idx += num_embeddings
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.padding_idx, self.max_norm, self.norm_type = padding_idx, max_norm, norm_type
        self.scale_grad_by_freq, self.sparse = scale_grad_by_freq, sparse
        if _weight is None:
            w = _C.randn(num_embeddings, embedding_dim)
            if padding_idx is not None:
                w[padding_idx] = 0.0
        else:
            if tuple(_weight.shape) != (num_embeddings, embedding_dim):
                raise KilnValueError(f"Embedding: _weight has shape {tuple(_weight.shape)}, expected "
                                     f"({num_embeddings}, {embedding_dim})")
            w = _weight
        self.weight = Parameter(w, requires_grad=not _freeze)
        _place(self, device, dtype)

    @classmethod
    def from_pretrained(cls, embeddings, freeze=True, padding_idx=None, max_norm=None, norm_type=2.0,
                        scale_grad_by_freq=False, sparse=False):
        """An Embedding whose weight is `embeddings` (2-D, shared); freeze: no gradient (as torch)."""
        if embeddings.dim() != 2:
            raise KilnValueError(f"Embedding.from_pretrained: embeddings must be 2-D, got {tuple(embeddings.shape)}")
        rows, cols = embeddings.shape
        return cls(rows, cols, padding_idx, max_norm, norm_type, scale_grad_by_freq, sparse, _weight=embeddings,
                   _freeze=freeze)

    def forward(self, idx):
        return F.embedding(idx, self.weight, self.padding_idx)

    def extra_repr(self):
        s = f"{self.num_embeddings}, {self.embedding_dim}"
        if self.padding_idx is not None:
            s += f", padding_idx={self.padding_idx}"
        if self.max_norm is not None:
            s += f", max_norm={self.max_norm}"
        if self.norm_type != 2:
            s += f", norm_type={self.norm_type}"
        return s


def _check_p(cls, p):
    if not 0 <= p <= 1:
        raise KilnValueError(f"{cls}: dropout probability has to be between 0 and 1, but got {p}")
    return p


class Dropout(Module):
    """inplace=True is accepted for torch code; the result is computed out of place (the input is
    left as it was)."""

    def __init__(self, p=0.5, inplace=False):
        super().__init__()
        self.p, self.inplace = _check_p(type(self).__name__, p), inplace

    def forward(self, x):
        return F.dropout(x, self.p, self.training)

    def extra_repr(self):
        return f"p={self.p}, inplace={self.inplace}"


class _Inplace(Module):
    """An activation that takes torch's inplace= (accepted; computed out of place, the input is left
    as it was)."""
    _fn = None

    def __init__(self, inplace=False):
        super().__init__()
        self.inplace = inplace

    def forward(self, x):
        return type(self)._fn(x)

    def extra_repr(self):
        return "inplace=True" if self.inplace else ""


class ReLU(_Inplace):
    """x <= 0 ? 0 : x (NaN stays NaN, as torch.relu)"""
    _fn = staticmethod(F.relu)


class SiLU(_Inplace):
    """x * sigmoid(x)"""
    _fn = staticmethod(F.silu)


class Tanh(Module):
    """tanh(x)"""

    def forward(self, x):
        return F.tanh(x)


class Sigmoid(Module):
    """1 / (1 + exp(-x))"""

    def forward(self, x):
        return F.sigmoid(x)


class Identity(Module):
    """x; takes and ignores any arguments, as torch's."""

    def __init__(self, *args, **kwargs):
        super().__init__()

    def forward(self, x):
        return x


class GELU(Module):
    def __init__(self, approximate="none"):
        super().__init__()
        self.approximate = approximate

    def forward(self, x):
        return F.gelu(x, self.approximate)

    def extra_repr(self):
        return f"approximate={self.approximate!r}"


class LeakyReLU(Module):
    def __init__(self, negative_slope=0.01, inplace=False):
        super().__init__()
        self.negative_slope, self.inplace = negative_slope, inplace

    def forward(self, x):
        return F.leaky_relu(x, self.negative_slope)

    def extra_repr(self):
        return f"negative_slope={self.negative_slope}" + (", inplace=True" if self.inplace else "")


class Softmax(Module):
    """dim=None: torch's legacy choice (0 for 0-, 1- and 3-D inputs, else 1), with its warning."""

    def __init__(self, dim=None):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return F.softmax(x, self.dim)

    def extra_repr(self):
        return f"dim={self.dim}"


class Flatten(Module):
    def __init__(self, start_dim=1, end_dim=-1):
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, x):
        return x.flatten(self.start_dim, self.end_dim)

    def extra_repr(self):
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"


class _MaxPoolNd(Module):
    _fn = None

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, return_indices=False, ceil_mode=False):
        super().__init__()
        self.kernel_size, self.stride = kernel_size, stride if stride is not None else kernel_size
        self.padding, self.dilation, self.return_indices, self.ceil_mode = padding, dilation, return_indices, ceil_mode

    def forward(self, x):
        return type(self)._fn(x, self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode,
                              self.return_indices)

    def extra_repr(self):
        return (f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
                f"dilation={self.dilation}, ceil_mode={self.ceil_mode}")


class MaxPool2d(_MaxPoolNd):
    _fn = staticmethod(F.max_pool2d)


class _AvgPoolNd(Module):
    _fn = None

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
                 divisor_override=None):
        super().__init__()
        self.kernel_size, self.stride = kernel_size, stride if stride is not None else kernel_size
        self.padding, self.ceil_mode, self.count_include_pad = padding, ceil_mode, count_include_pad
        self.divisor_override = divisor_override

    def forward(self, x):
        return type(self)._fn(x, self.kernel_size, self.stride, self.padding, self.ceil_mode, self.count_include_pad,
                              self.divisor_override)

    def extra_repr(self):
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class AvgPool2d(_AvgPoolNd):
    _fn = staticmethod(F.avg_pool2d)


class AdaptiveAvgPool2d(Module):
    def __init__(self, output_size):
        super().__init__()
        self.output_size = output_size

    def forward(self, x):
        return F.adaptive_avg_pool2d(x, self.output_size)

    def extra_repr(self):
        return f"output_size={self.output_size}"


class Upsample(Module):
    def __init__(self, size=None, scale_factor=None, mode="nearest", align_corners=None,
                 recompute_scale_factor=None):
        super().__init__()
        self.size, self.scale_factor, self.mode, self.align_corners = size, scale_factor, mode, align_corners
        self.recompute_scale_factor = recompute_scale_factor

    def forward(self, x):
        return F.interpolate(x, self.size, self.scale_factor, self.mode, self.align_corners,
                             self.recompute_scale_factor)


class Sequential(Module):
    def __init__(self, *layers):
        super().__init__()
        for i, layer in enumerate(layers):
            self.add_module(str(i), layer)

    def forward(self, x):
        for m in self._modules.values():
            x = m(x)
        return x

    def __getitem__(self, i):
        return list(self._modules.values())[i]

    def __len__(self):
        return len(self._modules)


class ModuleList(Module):
    def __init__(self, modules=()):
        super().__init__()
        for m in modules:
            self.append(m)

    def append(self, m):
        self.add_module(str(len(self._modules)), m)
        return self

    def __getitem__(self, i):
        return list(self._modules.values())[i]

    def __iter__(self):
        return iter(self._modules.values())

    def __len__(self):
        return len(self._modules)


class CppModule(Module):
    """A module built in C++ (kiln.models): its parameters and buffers are the C++ module's own
    tensors (shared: an optimizer step from Python updates the C++ model); train/eval, to and
    load_state_dict go to C++."""

    def __init__(self, cmodule):
        super().__init__()
        object.__setattr__(self, "_c", cmodule)

    def _own_parameters(self):
        return self._c.named_parameters()

    def _own_buffers(self):
        return self._c.named_buffers()

    def _set_mode(self, mode):
        self._c.train(mode)

    def _convert(self, device, dtype):
        if device is not None:
            self._c.to_device(device)
        if dtype is not None:
            self._c.to_dtype(dtype)

    def load_state_dict(self, state_dict, strict=True):
        _check_state_dict(state_dict)
        return IncompatibleKeys(*self._c.load_state_dict(dict(state_dict), strict))

    def extra_repr(self):
        return f"{self._c.type_name}, {self._c.num_parameters()} parameters"
