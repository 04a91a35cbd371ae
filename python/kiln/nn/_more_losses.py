"""More of torch.nn's activations, dropouts and losses, composed from Kiln's engine ops (so autograd
differentiates them), with torch.nn.functional's signatures and argument checks:

activations: hardshrink, softshrink, tanhshrink, threshold / threshold_, rrelu / rrelu_, the in-place
relu_, elu_, selu_, celu_, leaky_relu_, hardtanh_; dropouts: alpha_dropout, feature_alpha_dropout;
distances: pdist (and the CosineSimilarity / PairwiseDistance modules over F.cosine_similarity /
F.pairwise_distance); losses: gaussian_nll_loss, poisson_nll_loss, hinge_embedding_loss,
soft_margin_loss, multilabel_soft_margin_loss, multi_margin_loss, multilabel_margin_loss,
triplet_margin_loss, triplet_margin_with_distance_loss; and their modules. The functionals are
attached to kiln.nn.functional (see the end of this file)."""
import math
import numbers

import numpy as np

from .. import _C
from .._C import KilnValueError
from .._math import vector_norm as _vector_norm
from .._tensor import no_grad, tensor as _tensor
from . import functional as F
from .loss import _Loss, _WeightedLoss
from .modules import Module, _check_p

__all__ = [
    "Hardshrink", "Softshrink", "Threshold", "RReLU", "AlphaDropout", "FeatureAlphaDropout", "Softmax2d",
    "CosineSimilarity", "PairwiseDistance", "GaussianNLLLoss", "PoissonNLLLoss", "HingeEmbeddingLoss",
    "SoftMarginLoss", "MultiLabelSoftMarginLoss", "MultiLabelMarginLoss", "MultiMarginLoss", "TripletMarginLoss",
    "TripletMarginWithDistanceLoss",
]
_REDUCTIONS = ("none", "mean", "sum")


def _check_reduction(name, reduction):
    if reduction not in _REDUCTIONS:
        raise KilnValueError(f"{name}: {reduction} is not a valid value for reduction (expected one of "
                             f"{_REDUCTIONS})")


def _reduce(loss, reduction):
    if reduction == "none":
        return loss
    return loss.sum() if reduction == "sum" else loss.mean()


def _inplace(name, input, y, inplace):
    """inplace=True: y put into the input, the input returned (as the engine's activations' inplace=)."""
    if not inplace or y is input:
        return y
    return _C._activation_into(name, input, y)


def _zeros_of(x):
    return _C.zeros_like(x)


# ---- activations ----
def _float_input(name, input):
    """torch's shrink kernels are not implemented for integer or bool input: refused likewise."""
    if not input.is_floating_point():
        raise NotImplementedError(f"{name}: not implemented for input of dtype {input.dtype.name}: input must be "
                                  "floating point")


def hardshrink(input, lambd=0.5):
    """x where |x| > lambd, else 0 (torch.nn.functional.hardshrink: 0 only inside [-lambd, lambd], so a NaN
    stays NaN with gradient 1, torch's scalar / CUDA rule); floating input only, as torch's."""
    _float_input("hardshrink", input)
    inside = (input >= -lambd) & (input <= lambd)
    return _C.where(inside, _zeros_of(input), input)


def softshrink(input, lambd=0.5):
    """x - lambd where x > lambd, x + lambd where x < -lambd, else 0; lambd must be >= 0, as torch's."""
    if lambd < 0:
        raise KilnValueError(f"softshrink: lambd must be >= 0, got {lambd}")
    _float_input("softshrink", input)
    inside = (input >= -lambd) & (input <= lambd)  # as torch's: a NaN is outside (NaN, gradient 1)
    return _C.where(inside, input * 0, _C.where(input > lambd, input - lambd, input + lambd))


def tanhshrink(input):
    """x - tanh(x)."""
    return input - F.tanh(input)


def threshold(input, threshold, value, inplace=False):
    """value where x <= threshold, else x (a NaN kept, as torch.nn.functional.threshold); inplace=True
    writes into the input and returns it."""
    y = _C.where(input <= threshold, _C.full_like(input, value), input)
    return _inplace("threshold", input, y, inplace)


def threshold_(input, threshold, value):
    """threshold written into the input, which is returned."""
    return _threshold(input, threshold, value, inplace=True)


_threshold = threshold


def rrelu(input, lower=1.0 / 8, upper=1.0 / 3, training=False, inplace=False):
    """Randomized leaky ReLU: in training, x * a for x < 0 with a ~ U(lower, upper) drawn per element from
    Kiln's generator (the gradient there is a); out of training leaky_relu with slope (lower + upper) / 2."""
    if lower > upper:
        raise KilnValueError(f"rrelu: lower bound ({lower}) should be less than or equal to the upper bound "
                             f"({upper})")
    if not input.is_floating_point():
        raise KilnValueError(f"rrelu: input must be floating point, got {input.dtype}")
    if not training:
        y = F.leaky_relu(input, (lower + upper) / 2.0)
    else:
        with no_grad():
            a = _C.rand_like(input) * (upper - lower) + lower
            slope = _C.where(input <= 0, a, _C.ones_like(input))  # torch's rule: a NaN keeps slope 1
        y = input * slope
    return _inplace("rrelu", input, y, inplace)


def rrelu_(input, lower=1.0 / 8, upper=1.0 / 3, training=False):
    return rrelu(input, lower, upper, training, inplace=True)


def relu_(input):
    """relu written into the input, which is returned (torch.relu_)."""
    return F.relu(input, inplace=True)


def elu_(input, alpha=1.0):
    return F.elu(input, alpha, inplace=True)


def selu_(input):
    return F.selu(input, inplace=True)


def celu_(input, alpha=1.0):
    return F.celu(input, alpha, inplace=True)


def leaky_relu_(input, negative_slope=0.01):
    return F.leaky_relu(input, negative_slope, inplace=True)


def hardtanh_(input, min_val=-1.0, max_val=1.0):
    return F.hardtanh(input, min_val, max_val, inplace=True)


# ---- alpha dropout ----
_SELU_ALPHA_PRIME = 1.7580993408473766  # -selu's scale * alpha: the value SELU saturates to


def _alpha_dropout(name, input, p, training, inplace, feature):
    if not 0 <= p <= 1:
        raise KilnValueError(f"{name}: dropout probability has to be between 0 and 1, but got {p}")
    if not training or p == 0 or input.numel() == 0:
        return input
    if p == 1:
        return _inplace(name, input, input * 0, inplace)
    # (as torch's _dropout_impl: checked only here, where the per-channel noise is drawn)
    if feature and input.dim() < 2:
        raise KilnValueError(f"{name}: Feature dropout requires at least 2 dimensions in the input, got "
                             f"{list(input.shape)}")
    # torch's _dropout_impl: keep with probability 1 - p, dropped elements set to SELU's saturation value,
    # then an affine map a * y + b that keeps zero mean and unit variance
    shape = list(input.shape[:2]) + [1] * (input.dim() - 2) if feature else list(input.shape)
    with no_grad():
        keep = (_C.rand(*shape, dtype=input.dtype, device=input.device) >= p).to(input.dtype)
        a = 1.0 / math.sqrt((_SELU_ALPHA_PRIME ** 2 * p + 1) * (1 - p))
        b = (keep - 1) * (_SELU_ALPHA_PRIME * a) + _SELU_ALPHA_PRIME * a * p
        scale = keep * a
    return _inplace(name, input, input * scale + b, inplace)


def alpha_dropout(input, p=0.5, training=False, inplace=False):
    """torch.nn.functional.alpha_dropout (SELU-preserving dropout; training=False by default, as torch's)."""
    return _alpha_dropout("alpha_dropout", input, p, training, inplace, False)


def feature_alpha_dropout(input, p=0.5, training=False, inplace=False):
    """alpha dropout of whole channels: one draw per (n, c) of an [N, C, ...] input."""
    return _alpha_dropout("feature_alpha_dropout", input, p, training, inplace, True)


# ---- distances ----
_PDIST_CHUNK = 1 << 21  # elements of one chunk's [pairs, M] differences (16 MiB in float64)


def pdist(input, p=2):
    """The p-norm distance between each pair of rows i < j of a 2-D [N, M] input: [N (N - 1) / 2], in
    torch's order (row-major over the upper triangle). The row differences are taken a chunk of pairs at a
    time (each row pair gathered once; a zero difference, or a zero coordinate of one, has gradient 0 for every p,
    as torch's), then the chunks' distances joined."""
    if input.dim() != 2:
        raise KilnValueError(f"pdist: input must be a 2-D tensor [N, M], got {input.dim()}D {list(input.shape)}")
    if p < 0:
        raise KilnValueError(f"pdist: p must be non-negative, got {p}")
    if not input.is_floating_point():
        raise KilnValueError(f"pdist: input must be floating point, got {input.dtype}")
    n, m = input.shape
    i, j = np.triu_indices(n, 1)
    dev = input.device
    step = max(1, _PDIST_CHUNK // max(m, 1))
    parts = []
    for start in range(0, max(i.size, 1), step):  # (one empty chunk when there are no pairs)
        ii = _tensor(i[start:start + step].astype(np.int64), device=dev)
        jj = _tensor(j[start:start + step].astype(np.int64), device=dev)
        diff = input.index_select(0, ii) - input.index_select(0, jj)
        # the engine's norm for 0, 1, 2 and inf (its backward is 0 at a zero difference there); the
        # zero-masked vector_norm for any other p, where the engine's general-p backward gives NaN
        parts.append(_C.norm(diff, float(p), -1, False) if p in (0, 1, 2, math.inf)
                     else _vector_norm(diff, float(p), -1))
        del diff
    return parts[0] if len(parts) == 1 else _C.cat(parts, 0)


# ---- losses ----
def _check_broadcast(name, what_a, a, what_b, b):
    try:
        return list(_C.broadcast_shapes(tuple(a.shape), tuple(b.shape)))
    except Exception:
        raise KilnValueError(f"{name}: {what_a} of size {list(a.shape)} and {what_b} of size {list(b.shape)} do not "
                             "broadcast together") from None


def gaussian_nll_loss(input, target, var, full=False, eps=1e-6, reduction="mean"):
    """0.5 (log(max(var, eps)) + (input - target)^2 / max(var, eps)) (+ 0.5 log(2 pi) with full=True), as
    torch's: var has input's shape, or one dim fewer (the last dropped), or input's shape with one dim of
    size 1 (homoscedastic), or is a float number; an integer var (tensor or number) is refused, as torch's.
    The clamp at eps is outside autograd (var's gradient is taken at the clamped value), as torch's."""
    if isinstance(var, numbers.Integral):  # (bool too) torch's var.clamp_ fails on an integer var
        raise KilnValueError(f"gaussian_nll_loss: var must be a floating-point tensor or a float, got the "
                             f"{type(var).__name__} {var!r}")
    if isinstance(var, numbers.Real):
        if var < 0:
            raise KilnValueError(f"gaussian_nll_loss: var has negative entry/entries (var={var})")
        var = _C.full_like(input, float(var))
    elif not isinstance(var, _C.Tensor):
        raise KilnValueError(f"gaussian_nll_loss: var must be a tensor or a number, got {type(var).__name__}")
    elif not var.is_floating_point():
        raise KilnValueError(f"gaussian_nll_loss: var must be a floating-point tensor, got {var.dtype.name}")
    elif bool((var < 0).any()):
        raise KilnValueError("gaussian_nll_loss: var has negative entry/entries")
    in_shape, var_shape = list(input.shape), list(var.shape)
    if var_shape != in_shape:
        if in_shape[:-1] == var_shape:
            var = var.unsqueeze(-1)
        elif not (len(var_shape) == len(in_shape) and sum(v for i, v in zip(in_shape, var_shape) if i != v) == 1):
            raise KilnValueError(f"gaussian_nll_loss: var is of incorrect size {var_shape} for input of size "
                                 f"{in_shape}: it must be input's size, input's size without the last dim, or "
                                 "input's size with one dim of size 1")
    _check_reduction("gaussian_nll_loss", reduction)
    # torch clamps a clone in place under no_grad: the value is clamped, the gradient passes as identity
    with no_grad():
        lift = var.clamp(min=eps) - var
    var = var + lift
    loss = 0.5 * (var.log() + (input - target) ** 2 / var)
    if full:
        loss = loss + 0.5 * math.log(2 * math.pi)
    return _reduce(loss, reduction)


def poisson_nll_loss(input, target, log_input=True, full=False, size_average=None, eps=1e-8, reduce=None,
                     reduction="mean"):
    """exp(input) - target * input (log_input=True), or input - target * log(input + eps); full=True adds
    the Stirling term target log(target) - target + 0.5 log(2 pi target) where target > 1, as torch's."""
    F._refuse_legacy_reduction("poisson_nll_loss", size_average, reduce)
    _check_reduction("poisson_nll_loss", reduction)
    _check_broadcast("poisson_nll_loss", "input", input, "target", target)
    if log_input:
        loss = input.exp() - target * input
    else:
        loss = input - target * (input + eps).log()
    if full:
        big = target > 1
        # the term at a safe target (1) where it is masked out: no log(0) in the forward or the backward
        t = _C.where(big, target, _C.ones_like(target))
        stirling = t * t.log() - t + 0.5 * (2 * math.pi * t).log()
        loss = loss + stirling * big.to(stirling.dtype)
    return _reduce(loss, reduction)


def hinge_embedding_loss(input, target, margin=1.0, size_average=None, reduce=None, reduction="mean"):
    """x where target is 1, max(0, margin - x) where target is -1 (torch's: the first term where target !=
    -1, the second where target != 1)."""
    F._refuse_legacy_reduction("hinge_embedding_loss", size_average, reduce)
    _check_reduction("hinge_embedding_loss", reduction)
    _check_broadcast("hinge_embedding_loss", "input", input, "target", target)
    zero = _zeros_of(input)
    loss = (_C.where(target != 1, (margin - input).clamp(min=0), zero)
            + _C.where(target != -1, input, zero))
    return _reduce(loss, reduction)


def soft_margin_loss(input, target, size_average=None, reduce=None, reduction="mean"):
    """log(1 + exp(-target * input)), computed as softplus (no overflow)."""
    F._refuse_legacy_reduction("soft_margin_loss", size_average, reduce)
    _check_reduction("soft_margin_loss", reduction)
    _check_broadcast("soft_margin_loss", "input", input, "target", target)
    return _reduce(F.softplus(-target * input), reduction)


def multilabel_soft_margin_loss(input, target, weight=None, size_average=None, reduce=None, reduction="mean"):
    """-(y log sigmoid(x) + (1 - y) log sigmoid(-x)) (times weight), averaged over the class (last) dim:
    one loss per sample."""
    F._refuse_legacy_reduction("multilabel_soft_margin_loss", size_average, reduce)
    _check_reduction("multilabel_soft_margin_loss", reduction)
    if input.dim() == 0:
        raise KilnValueError("multilabel_soft_margin_loss: input must have a class dim (1-D [C] or [N, C]), got 0-D")
    _check_broadcast("multilabel_soft_margin_loss", "input", input, "target", target)
    loss = -(target * F.logsigmoid(input) + (1 - target) * F.logsigmoid(-input))
    if weight is not None:  # as torch's: weight broadcasts with the loss, beyond the input's shape too
        _check_broadcast("multilabel_soft_margin_loss", "the loss", loss, "weight", weight)
        loss = loss * weight
    loss = loss.sum(input.dim() - 1) / input.shape[-1]  # over input's class dim, as torch's, even where weight widened the loss
    return _reduce(loss, reduction)


def _class_input(name, input):
    """input as [nframe, dim] (torch's multi-margin rule: 0-D, 1-D [C] or 2-D [N, C], non-empty)."""
    if input.dim() > 2 or (input.dim() > 0 and input.shape[-1] == 0) or (input.dim() == 1 and input.numel() == 0):
        raise KilnValueError(f"{name}: expected a non-empty vector or matrix with optional 0-dim batch size as input, "
                             f"got {list(input.shape)}")
    if not input.is_floating_point():
        raise KilnValueError(f"{name}: input must be floating point, got {input.dtype}")
    nframe = input.shape[0] if input.dim() == 2 else 1
    dim = input.shape[-1] if input.dim() >= 1 else 1
    return input.reshape([nframe, dim]), nframe, dim


def _int_target(name, target):
    if target.dtype != _C.dtype.int64:  # torch's kernels take int64 (Long) only
        raise KilnValueError(f"{name}: target must hold int64 class indices, got {target.dtype.name}")
    return np.asarray(target.detach().to("cpu")).astype(np.int64)


def multi_margin_loss(input, target, p=1, margin=1.0, weight=None, size_average=None, reduce=None,
                      reduction="mean"):
    """Per sample: sum over the classes j != y of max(0, margin - x[y] + x[j])^p (times weight[y]), over
    the number of classes; input [N, C] (or [C]), target [N] (or 0-D) class indices, p 1 or 2."""
    F._refuse_legacy_reduction("multi_margin_loss", size_average, reduce)
    _check_reduction("multi_margin_loss", reduction)
    if p not in (1, 2):
        raise KilnValueError(f"multi_margin_loss: only p == 1 and p == 2 are supported, got p={p}")
    if weight is not None and weight.dim() != 1:
        raise KilnValueError(f"multi_margin_loss: weight must be one-dimensional, got {list(weight.shape)}")
    x, nframe, dim = _class_input("multi_margin_loss", input)
    if target.dim() > 1 or target.numel() != nframe:
        raise KilnValueError(f"multi_margin_loss: target should be 1-D (or 0-D) with as many entries as input has "
                             f"samples ({nframe}), got target of size {list(target.shape)} for input of size "
                             f"{list(input.shape)}")
    if weight is not None and weight.numel() != dim:
        raise KilnValueError(f"multi_margin_loss: weight must have one entry per class ({dim}), got "
                             f"{list(weight.shape)}")
    t = _int_target("multi_margin_loss", target).reshape(-1)
    if t.size and (t.min() < 0 or t.max() >= dim):
        bad = t[(t < 0) | (t >= dim)][0]
        raise KilnValueError(f"multi_margin_loss: target {bad} is out of range for {dim} classes")
    dev = x.device
    idx = _tensor(t, device=dev).reshape([nframe, 1])
    xy = x.gather(1, idx)
    z = margin - xy + x
    others = np.ones((nframe, dim), dtype=bool)
    others[np.arange(nframe), t] = False
    # torch's kernel adds a term only if z > 0: a NaN term (a NaN logit) adds nothing, and gets no gradient
    z = _C.where((z > 0) & _tensor(others, device=dev), z, _zeros_of(z))
    if p == 2:
        z = z * z
    if weight is not None:
        z = z * weight.index_select(0, idx.reshape([nframe])).unsqueeze(1)
    loss = z.sum(1) / dim
    if reduction == "none":
        return loss if target.dim() > 0 else loss.reshape([])
    return _reduce(loss, reduction)


def multilabel_margin_loss(input, target, size_average=None, reduce=None, reduction="mean"):
    """Per sample: sum over the target classes j and the non-target classes k of max(0, 1 - (x[j] - x[k])),
    over the number of classes. target has input's shape and holds class indices, ended by the first -1
    (torch's layout)."""
    F._refuse_legacy_reduction("multilabel_margin_loss", size_average, reduce)
    _check_reduction("multilabel_margin_loss", reduction)
    x, nframe, dim = _class_input("multilabel_margin_loss", input)
    if list(target.shape) != list(input.shape):
        raise KilnValueError(f"multilabel_margin_loss: inconsistent target size {list(target.shape)} for input of "
                             f"size {list(input.shape)} (they must be the same)")
    t = _int_target("multilabel_margin_loss", target).reshape(nframe, dim)
    if t.size and (t.min() < -1 or t.max() >= dim):
        bad = t[(t < -1) | (t >= dim)][0]
        raise KilnValueError(f"multilabel_margin_loss: target {bad} is out of range: it must be a class index in "
                             f"[0, {dim}) or -1 (the end of the targets)")
    # each row's targets are those before its first -1 (a repeated one counted each time), k_max the most
    # any row has: the terms are [N, k_max, C], a target j's logit against every class k not a target
    valid = np.cumprod(t >= 0, axis=1).astype(bool)
    k_max = max(int(valid.sum(1).max()) if valid.size else 0, 1)
    valid = valid[:, :k_max]
    is_target = np.zeros((nframe, dim), dtype=bool)
    rows, cols = np.nonzero(valid)
    is_target[rows, t[rows, cols]] = True
    dev = x.device
    tgt = _tensor(np.where(valid, t[:, :k_max], 0), device=dev)  # (a padded slot: class 0, masked out)
    pairs = _tensor(valid[:, :, None] & ~is_target[:, None, :], device=dev)  # [N, k_max, C]
    z = 1 - x.gather(1, tgt).unsqueeze(2) + x.unsqueeze(1)
    # as torch's kernel, a term only if z > 0: a NaN term (a NaN logit) adds nothing, and gets no gradient
    loss = _C.where((z > 0) & pairs, z, _zeros_of(z)).sum((1, 2)) / dim
    if reduction == "none":
        return loss if input.dim() == 2 else loss.reshape([])
    return _reduce(loss, reduction)


def _check_triplet_dims(anchor, positive, negative):
    a, p, n = anchor.dim(), positive.dim(), negative.dim()
    if not a == p == n:
        raise KilnValueError(f"The anchor, positive, and negative tensors are expected to have the same number of "
                             f"dimensions, but got: anchor {a}D, positive {p}D, and negative {n}D inputs")


def _triplet(name, anchor, positive, negative, distance, margin, swap, reduction):
    _check_reduction(name, reduction)
    if margin <= 0:
        raise KilnValueError(f"{name}: margin must be greater than 0, got {margin}")
    _check_triplet_dims(anchor, positive, negative)
    d_pos = distance(anchor, positive)
    d_neg = distance(anchor, negative)
    if swap:
        d_neg = _C.minimum(d_neg, distance(positive, negative))
    return _reduce((margin + d_pos - d_neg).clamp(min=0), reduction)


def triplet_margin_loss(anchor, positive, negative, margin=1.0, p=2, eps=1e-6, swap=False, size_average=None,
                        reduce=None, reduction="mean"):
    """max(d(a, p) - d(a, n) + margin, 0) with d the pairwise p-norm distance (F.pairwise_distance with
    eps); swap=True takes d(a, n) as min(d(a, n), d(p, n))."""
    F._refuse_legacy_reduction("triplet_margin_loss", size_average, reduce)
    return _triplet("triplet_margin_loss", anchor, positive, negative,
                    lambda x1, x2: F.pairwise_distance(x1, x2, p, eps), margin, swap, reduction)


def triplet_margin_with_distance_loss(anchor, positive, negative, *, distance_function=None, margin=1.0,
                                      swap=False, reduction="mean"):
    """triplet_margin_loss with any distance_function(x1, x2) (default F.pairwise_distance)."""
    if distance_function is not None and not callable(distance_function):
        raise KilnValueError(f"triplet_margin_with_distance_loss: distance_function must be callable, got "
                             f"{type(distance_function).__name__}")
    return _triplet("triplet_margin_with_distance_loss", anchor, positive, negative,
                    distance_function if distance_function is not None else F.pairwise_distance, margin, swap,
                    reduction)


# ---- modules ----
class _Shrink(Module):
    def __init__(self, lambd=0.5):
        super().__init__()
        self.lambd = lambd

    def extra_repr(self):
        return f"{self.lambd}"


class Hardshrink(_Shrink):
    def forward(self, input):
        return hardshrink(input, self.lambd)


class Softshrink(_Shrink):  # (not a Hardshrink: isinstance as torch's)
    def forward(self, input):
        return softshrink(input, self.lambd)


class Threshold(Module):
    def __init__(self, threshold, value, inplace=False):
        super().__init__()
        self.threshold, self.value, self.inplace = threshold, value, inplace

    def forward(self, input):
        return _threshold(input, self.threshold, self.value, self.inplace)

    def extra_repr(self):
        return f"threshold={self.threshold}, value={self.value}" + (", inplace=True" if self.inplace else "")


class RReLU(Module):
    """Random slopes in U(lower, upper) in training, the mean slope in eval mode."""

    def __init__(self, lower=1.0 / 8, upper=1.0 / 3, inplace=False):
        super().__init__()
        self.lower, self.upper, self.inplace = lower, upper, inplace

    def forward(self, input):
        return rrelu(input, self.lower, self.upper, self.training, self.inplace)

    def extra_repr(self):
        return f"lower={self.lower}, upper={self.upper}" + (", inplace=True" if self.inplace else "")


class _AlphaDropoutBase(Module):

    def __init__(self, p=0.5, inplace=False):
        super().__init__()
        self.p, self.inplace = _check_p(type(self).__name__, p), inplace

    def forward(self, input):
        return type(self)._fn(input, self.p, self.training, self.inplace)

    def extra_repr(self):
        return f"p={self.p}, inplace={self.inplace}"


class AlphaDropout(_AlphaDropoutBase):
    _fn = staticmethod(alpha_dropout)


class FeatureAlphaDropout(_AlphaDropoutBase):  # (not an AlphaDropout: isinstance as torch's)
    _fn = staticmethod(feature_alpha_dropout)


class Softmax2d(Module):
    """softmax over the channels of [N, C, H, W] (or [C, H, W])."""

    def forward(self, input):
        if input.dim() not in (3, 4):
            raise KilnValueError(f"Softmax2d: expected input to be 3D or 4D, got {input.dim()}D instead")
        return F.softmax(input, -3)


class CosineSimilarity(Module):
    def __init__(self, dim=1, eps=1e-8):
        super().__init__()
        self.dim, self.eps = dim, eps

    def forward(self, x1, x2):
        return F.cosine_similarity(x1, x2, self.dim, self.eps)


class PairwiseDistance(Module):
    def __init__(self, p=2.0, eps=1e-6, keepdim=False):
        super().__init__()
        self.norm, self.eps, self.keepdim = p, eps, keepdim

    def forward(self, x1, x2):
        return F.pairwise_distance(x1, x2, self.norm, self.eps, self.keepdim)


class GaussianNLLLoss(_Loss):
    def __init__(self, *, full=False, eps=1e-6, reduction="mean"):
        super().__init__(reduction=reduction)
        self.full, self.eps = full, eps

    def forward(self, input, target, var):
        return gaussian_nll_loss(input, target, var, self.full, self.eps, self.reduction)


class PoissonNLLLoss(_Loss):
    def __init__(self, log_input=True, full=False, size_average=None, eps=1e-8, reduce=None, reduction="mean"):
        super().__init__(size_average, reduce, reduction)
        self.log_input, self.full, self.eps = log_input, full, eps

    def forward(self, log_input, target):
        return poisson_nll_loss(log_input, target, self.log_input, self.full, eps=self.eps,
                                reduction=self.reduction)


class HingeEmbeddingLoss(_Loss):
    def __init__(self, margin=1.0, size_average=None, reduce=None, reduction="mean"):
        super().__init__(size_average, reduce, reduction)
        self.margin = margin

    def forward(self, input, target):
        return hinge_embedding_loss(input, target, self.margin, reduction=self.reduction)


class SoftMarginLoss(_Loss):
    def forward(self, input, target):
        return soft_margin_loss(input, target, reduction=self.reduction)


class MultiLabelSoftMarginLoss(_WeightedLoss):
    def forward(self, input, target):
        return multilabel_soft_margin_loss(input, target, self.weight, reduction=self.reduction)


class MultiLabelMarginLoss(_Loss):
    def forward(self, input, target):
        return multilabel_margin_loss(input, target, reduction=self.reduction)


class MultiMarginLoss(_WeightedLoss):
    def __init__(self, p=1, margin=1.0, weight=None, size_average=None, reduce=None, reduction="mean"):
        if p not in (1, 2):
            raise KilnValueError(f"MultiMarginLoss: only p == 1 and p == 2 are supported, got p={p}")
        if weight is not None and weight.dim() != 1:
            raise KilnValueError(f"MultiMarginLoss: expected weight to be None or 1D tensor, got {weight.dim()}D "
                                 "instead")
        super().__init__(weight, size_average, reduce, reduction)
        self.p, self.margin = p, margin

    def forward(self, input, target):
        return multi_margin_loss(input, target, self.p, self.margin, self.weight, reduction=self.reduction)


class TripletMarginLoss(_Loss):
    def __init__(self, margin=1.0, p=2.0, eps=1e-6, swap=False, size_average=None, reduce=None, reduction="mean"):
        super().__init__(size_average, reduce, reduction)
        if margin <= 0:
            raise KilnValueError(f"TripletMarginLoss: expected margin to be greater than 0, got {margin} instead")
        self.margin, self.p, self.eps, self.swap = margin, p, eps, swap

    def forward(self, anchor, positive, negative):
        return triplet_margin_loss(anchor, positive, negative, self.margin, self.p, self.eps, self.swap,
                                   reduction=self.reduction)


class TripletMarginWithDistanceLoss(_Loss):
    def __init__(self, *, distance_function=None, margin=1.0, swap=False, reduction="mean"):
        super().__init__(reduction=reduction)
        if margin <= 0:
            raise KilnValueError(f"TripletMarginWithDistanceLoss: expected margin to be greater than 0, got {margin} "
                                 "instead")
        self.distance_function = distance_function if distance_function is not None else PairwiseDistance()
        self.margin, self.swap = margin, swap

    def forward(self, anchor, positive, negative):
        return triplet_margin_with_distance_loss(anchor, positive, negative, distance_function=self.distance_function,
                                                 margin=self.margin, swap=self.swap, reduction=self.reduction)


# the functionals, as torch.nn.functional's
for _name in ("hardshrink", "softshrink", "tanhshrink", "threshold", "threshold_", "rrelu", "rrelu_", "relu_", "elu_",
              "selu_", "celu_", "leaky_relu_", "hardtanh_", "alpha_dropout", "feature_alpha_dropout", "pdist",
              "gaussian_nll_loss", "poisson_nll_loss", "hinge_embedding_loss", "soft_margin_loss",
              "multilabel_soft_margin_loss", "multi_margin_loss", "multilabel_margin_loss", "triplet_margin_loss",
              "triplet_margin_with_distance_loss"):
    setattr(F, _name, globals()[_name])
del _name
