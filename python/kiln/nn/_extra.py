"""More of torch.nn, composed from Kiln's engine ops (so autograd differentiates them): F.bilinear
and nn.Bilinear, F.embedding_bag and nn.EmbeddingBag, F.gumbel_softmax, F.unfold / F.fold (im2col /
col2im) and nn.Unfold / nn.Fold, F.affine_grid and F.grid_sample."""
import math
import operator

import numpy as np

from .. import _C
from .._C import KilnError, KilnValueError
from .._tensor import no_grad, tensor as _tensor
from . import functional as F
from .modules import Module, Parameter, _embedding_weight, _place, _uniform


def _tuple2(name, what, v):
    t = tuple(v) if hasattr(v, "__len__") else (v, v)
    if len(t) != 2 or any(isinstance(e, bool) or not isinstance(e, (int, np.integer)) for e in t):
        raise KilnValueError(f"{name}: {what} must be an int or a pair of ints, got {v!r}")
    return tuple(int(e) for e in t)


# ---- bilinear ----
def bilinear(input1, input2, weight, bias=None):
    """torch.nn.functional.bilinear: y[..., o] = input1[..., i] * weight[o, i, j] * input2[..., j] + bias[o]."""
    if weight.dim() != 3:
        raise KilnValueError(f"bilinear: weight must be 3-D [out, in1, in2], got {tuple(weight.shape)}")
    out, in1, in2 = weight.shape
    if input1.shape[-1] != in1 or input2.shape[-1] != in2:
        raise KilnValueError(f"bilinear: input1's last dimension ({input1.shape[-1]}) and input2's "
                             f"({input2.shape[-1]}) must be weight's in1 ({in1}) and in2 ({in2})")
    if tuple(input1.shape[:-1]) != tuple(input2.shape[:-1]):
        raise KilnValueError(f"bilinear: input1 {tuple(input1.shape)} and input2 {tuple(input2.shape)} must have "
                             "the same leading dimensions")
    lead = list(input1.shape[:-1])
    x1 = input1.reshape([-1, in1])
    x2 = input2.reshape([-1, in2])
    # [N, in1] @ [in1, out * in2] -> [N, out, in2], then the dot with input2 over in2
    z = x1.matmul(weight.permute(1, 0, 2).reshape([in1, out * in2])).reshape([-1, out, in2])
    y = (z * x2.unsqueeze(1)).sum(-1)
    if bias is not None:
        y = y + bias
    return y.reshape(lead + [out])


class Bilinear(Module):
    """torch.nn.Bilinear: weight [out_features, in1_features, in2_features] and bias [out_features],
    both uniform in +-1/sqrt(in1_features) as torch's."""

    def __init__(self, in1_features, in2_features, out_features, bias=True, device=None, dtype=None):
        super().__init__()
        for what, v in (("in1_features", in1_features), ("in2_features", in2_features),
                        ("out_features", out_features)):
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise KilnValueError(f"Bilinear: {what} must be an int > 0, got {v!r}")
        self.in1_features, self.in2_features, self.out_features = in1_features, in2_features, out_features
        bound = 1.0 / math.sqrt(in1_features)
        self.weight = Parameter(_uniform((out_features, in1_features, in2_features), bound))
        self.bias = Parameter(_uniform((out_features,), bound)) if bias else None
        _place(self, device, dtype)

    def forward(self, input1, input2):
        return bilinear(input1, input2, self.weight, self.bias)

    def extra_repr(self):
        return (f"in1_features={self.in1_features}, in2_features={self.in2_features}, "
                f"out_features={self.out_features}, bias={self.bias is not None}")


# ---- embedding_bag ----
_BAG_MODES = ("sum", "mean", "max")


def embedding_bag(input, weight, offsets=None, max_norm=None, norm_type=2, scale_grad_by_freq=False, mode="mean",
                  sparse=False, per_sample_weights=None, include_last_offset=False, padding_idx=None):
    """torch.nn.functional.embedding_bag: the sum, mean or max of each bag of weight's rows. input is
    2-D [B, L] (B bags of L indices; offsets must be None) or 1-D with offsets (bag b starts at
    offsets[b]; include_last_offset: offsets has B + 1 entries, the last the end). per_sample_weights
    (input's shape) scales each row, mode "sum" only; entries equal to padding_idx are left out (of
    the mean's count too); an empty bag gives zeros; mode "max" gives each (bag, dim)'s gradient to the
    first element in bag order holding the max, as torch. With include_last_offset, Kiln refuses a last
    offset other than input's length (torch's result there is ill-defined). max_norm renormalises the rows in place, as
    F.embedding. scale_grad_by_freq and sparse are refused."""
    for arg, v in (("scale_grad_by_freq", scale_grad_by_freq), ("sparse", sparse)):
        if v:
            raise KilnError(f"embedding_bag: {arg}=True is not supported by Kiln (leave it False)")
    if mode not in _BAG_MODES:
        raise KilnValueError(f"embedding_bag: mode must be 'sum', 'mean' or 'max', got {mode!r}")
    if weight.dim() != 2:
        raise KilnValueError(f"embedding_bag: weight must be 2-D [num_embeddings, dim], got {tuple(weight.shape)}")
    if input.is_floating_point() or input.dtype == _C.dtype.bool:
        raise KilnValueError(f"embedding_bag: input must hold integer indices, got {input.dtype}")
    if per_sample_weights is not None:
        if mode != "sum":
            raise KilnValueError(f"embedding_bag: per_sample_weights is only supported for mode='sum' (got mode="
                                 f"'{mode}'); use mode='sum' or leave per_sample_weights None")
        if tuple(per_sample_weights.shape) != tuple(input.shape):
            raise KilnValueError(f"embedding_bag: per_sample_weights {tuple(per_sample_weights.shape)} must have "
                                 f"input's shape {tuple(input.shape)}")
    num, dim = weight.shape
    if padding_idx is not None:
        padding_idx = operator.index(padding_idx)
        if not -num <= padding_idx < num:
            raise KilnValueError(f"embedding_bag: padding_idx {padding_idx} is outside [-{num}, {num})")
        if padding_idx < 0:
            padding_idx += num
    idx = np.asarray(input.detach().to("cpu")).astype(np.int64)
    if input.dim() == 2:
        if offsets is not None:
            raise KilnValueError("embedding_bag: offsets must be None when input is 2-D (each row is a bag), got "
                                 f"offsets of shape {tuple(offsets.shape)}")
        bags, length = idx.shape
        starts = np.arange(bags, dtype=np.int64) * length
        ends = starts + length
        idx = idx.reshape(-1)
    elif input.dim() == 1:
        if offsets is None:
            raise KilnValueError("embedding_bag: offsets is needed when input is 1-D")
        if offsets.dim() != 1:
            raise KilnValueError(f"embedding_bag: offsets must be 1-D, got {tuple(offsets.shape)}")
        off = np.asarray(offsets.detach().to("cpu")).astype(np.int64)
        if len(off) and off[0] != 0:
            raise KilnValueError(f"embedding_bag: offsets[0] has to be 0 (the first bag starts at position 0), "
                                 f"got {off[0]}")
        if len(off) and (np.any(np.diff(off) < 0) or off[-1] > len(idx)):
            raise KilnValueError(f"embedding_bag: offsets must be non-decreasing and at most input's length "
                                 f"({len(idx)}), got {off.tolist()}")
        if include_last_offset:
            if len(off) == 0:
                raise KilnValueError("embedding_bag: include_last_offset needs at least one offset")
            if off[-1] != len(idx):
                # Kiln's refusal: torch's docs say the last offset should equal input's length, and
                # torch's own results otherwise are ill-defined (sum, mean and max read different ranges)
                raise KilnValueError(f"embedding_bag: with include_last_offset=True the last offset must equal "
                                     f"input's length ({len(idx)}, the end of the last bag), got offsets[-1]="
                                     f"{off[-1]}; Kiln refuses this because torch's result there is ill-defined "
                                     f"(its modes read different ranges); pass offsets ending at {len(idx)}")
            starts, ends = off[:-1], off[1:]
        else:
            starts, ends = off, np.append(off[1:], len(idx)).astype(np.int64)
    else:
        raise KilnValueError(f"embedding_bag: input must be 1-D (with offsets) or 2-D, got {tuple(input.shape)}")
    if idx.size and (idx.min() < 0 or idx.max() >= num):
        bad = idx[(idx < 0) | (idx >= num)][0]
        raise KilnValueError(f"embedding_bag: index {bad} is out of range for weight with {num} rows")
    if max_norm is not None:
        F._embedding_renorm(weight, _tensor(idx, device=weight.device), max_norm, norm_type)
    bags = len(starts)
    # Only the rows used are gathered (memory O(indices x dim), not O(bags x longest bag x dim)): each
    # position of input that a bag holds, its bag's number, then the padding_idx entries left out.
    lengths = ends - starts
    bag_of = np.repeat(np.arange(bags, dtype=np.int64), lengths)
    first = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)  # a bag's start less its rank
    pos = first + np.arange(len(bag_of), dtype=np.int64)
    if padding_idx is not None and pos.size:
        keep = idx[pos] != padding_idx
        pos, bag_of = pos[keep], bag_of[keep]
    count = np.bincount(bag_of, minlength=bags)
    dev = weight.device
    emb = weight.index_select(0, _tensor(idx[pos], dtype=_C.dtype.int64, device=dev))  # [used, dim]
    bag = _tensor(bag_of, dtype=_C.dtype.int64, device=dev)
    zeros = _C.zeros(bags, dim, dtype=weight.dtype, device=dev)
    if mode == "max":
        # a segment max (an empty bag keeps its zeros, as torch's). As torch, the gradient goes to one
        # element per (bag, dim), the first in bag order that holds the max (scatter_reduce's amax would
        # split it among ties): that position is found without gradient (float64 positions are exact),
        # then emb is gathered there, differentiably.
        used = len(bag_of)
        if used == 0:
            return zeros
        bag2 = bag.unsqueeze(-1).expand([used, dim])
        with no_grad():
            e = emb.detach()
            best = zeros.scatter_reduce(0, bag2, e, "amax", include_self=False).index_select(0, bag)
            hit = (e == best) | (e.isnan() & best.isnan())
            where = _tensor(np.arange(used, dtype=np.float64), device=dev).unsqueeze(-1).expand([used, dim])
            where = where.masked_fill(hit.logical_not(), float(used))
            start = _C.full([bags, dim], float(used), dtype=_C.dtype.float64, device=dev)
            first = start.scatter_reduce(0, bag2, where, "amin", include_self=True)
            empty = first >= used
            first = first.clamp(0, used - 1).long()
        return emb.gather(0, first).masked_fill(empty, 0.0)
    if per_sample_weights is not None:
        psw = per_sample_weights.reshape([-1]).index_select(0, _tensor(pos, dtype=_C.dtype.int64, device=dev))
        emb = emb * psw.to(weight.dtype).unsqueeze(-1)
    out = zeros.index_add(0, bag, emb)
    if mode == "mean":
        out = out / _tensor(np.maximum(count, 1).astype(np.float32), device=dev).to(weight.dtype).unsqueeze(-1)
    return out


class EmbeddingBag(Module):
    """torch.nn.EmbeddingBag: weight [num_embeddings, embedding_dim] drawn from N(0, 1) (padding_idx's
    row zero), forward(input, offsets=None, per_sample_weights=None) as F.embedding_bag."""

    def __init__(self, num_embeddings, embedding_dim, max_norm=None, norm_type=2.0, scale_grad_by_freq=False,
                 mode="mean", sparse=False, _weight=None, include_last_offset=False, padding_idx=None, device=None,
                 dtype=None):
        super().__init__()
        for arg, v in (("scale_grad_by_freq", scale_grad_by_freq), ("sparse", sparse)):
            if v:
                raise KilnError(f"EmbeddingBag: {arg}=True is not supported by Kiln (leave it False)")
        if mode not in _BAG_MODES:
            raise KilnValueError(f"EmbeddingBag: mode must be 'sum', 'mean' or 'max', got {mode!r}")
        if padding_idx is not None:
            padding_idx = operator.index(padding_idx)
            if not -num_embeddings <= padding_idx < num_embeddings:
                raise KilnValueError(f"EmbeddingBag: padding_idx {padding_idx} is outside "
                                     f"[-{num_embeddings}, {num_embeddings})")
            if padding_idx < 0:
                padding_idx += num_embeddings
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.max_norm, self.norm_type, self.scale_grad_by_freq = max_norm, norm_type, scale_grad_by_freq
        self.mode, self.sparse, self.include_last_offset, self.padding_idx = mode, sparse, include_last_offset, \
            padding_idx
        self.weight = Parameter(_embedding_weight("EmbeddingBag", num_embeddings, embedding_dim, padding_idx, _weight))
        _place(self, device, dtype)

    @classmethod
    def from_pretrained(cls, embeddings, freeze=True, max_norm=None, norm_type=2.0, scale_grad_by_freq=False,
                        mode="mean", sparse=False, include_last_offset=False, padding_idx=None):
        if embeddings.dim() != 2:
            raise KilnValueError(f"EmbeddingBag.from_pretrained: embeddings must be 2-D, got "
                                 f"{tuple(embeddings.shape)}")
        rows, cols = embeddings.shape
        bag = cls(rows, cols, max_norm, norm_type, scale_grad_by_freq, mode, sparse, embeddings, include_last_offset,
                  padding_idx)
        bag.weight.requires_grad_(not freeze)
        return bag

    def forward(self, input, offsets=None, per_sample_weights=None):
        return embedding_bag(input, self.weight, offsets, self.max_norm, self.norm_type, self.scale_grad_by_freq,
                             self.mode, self.sparse, per_sample_weights, self.include_last_offset, self.padding_idx)

    def extra_repr(self):
        s = f"{self.num_embeddings}, {self.embedding_dim}, mode='{self.mode}'"
        if self.padding_idx is not None:
            s += f", padding_idx={self.padding_idx}"
        return s


# ---- gumbel_softmax ----
def gumbel_softmax(logits, tau=1.0, hard=False, eps=1e-10, dim=-1):
    """torch.nn.functional.gumbel_softmax: softmax((logits + g) / tau) with g Gumbel(0, 1) noise
    (-log of an Exponential(1) draw, from Kiln's generator); hard=True returns the one-hot of the
    argmax with the soft sample's gradient (straight-through: y_hard - y_soft.detach() + y_soft)."""
    if not logits.is_floating_point():
        raise KilnValueError(f"gumbel_softmax: logits must be floating point, got {logits.dtype}")
    if tau <= 0:
        raise KilnValueError(f"gumbel_softmax: tau must be > 0, got {tau}")
    with no_grad():
        gumbels = -_C.empty_like(logits).exponential_().log()
    y_soft = ((logits + gumbels) / tau).softmax(dim)
    if not hard:
        return y_soft
    index = y_soft.max(dim, keepdim=True)[1]
    ones = _C.ones(list(index.shape), dtype=logits.dtype, device=logits.device)
    y_hard = _C.zeros_like(logits).scatter(dim, index, ones)
    return y_hard - y_soft.detach() + y_soft


# ---- unfold / fold (im2col / col2im) ----
def _im2col_index(name, spatial, kernel_size, dilation, padding, stride):
    """For a padded [Hp, Wp] plane: the flat index of each (kernel offset, output position) pair,
    [kh * kw * L], and (Hp, Wp, L)."""
    kh, kw = _tuple2(name, "kernel_size", kernel_size)
    dh, dw = _tuple2(name, "dilation", dilation)
    ph, pw = _tuple2(name, "padding", padding)
    sh, sw = _tuple2(name, "stride", stride)
    if min(kh, kw, dh, dw, sh, sw) <= 0 or min(ph, pw) < 0:
        raise KilnValueError(f"{name}: kernel_size, dilation and stride must be > 0 and padding >= 0, got "
                             f"kernel_size={kernel_size}, dilation={dilation}, padding={padding}, stride={stride}")
    h, w = spatial
    hp, wp = h + 2 * ph, w + 2 * pw
    oh = (hp - dh * (kh - 1) - 1) // sh + 1
    ow = (wp - dw * (kw - 1) - 1) // sw + 1
    if oh <= 0 or ow <= 0:
        raise KilnValueError(f"{name}: the kernel ({kh}, {kw}) with dilation ({dh}, {dw}) does not fit the padded "
                             f"input ({hp}, {wp}): no output blocks")
    rows = (np.arange(kh)[:, None, None, None] * dh + np.arange(oh)[None, None, :, None] * sh)
    cols = (np.arange(kw)[None, :, None, None] * dw + np.arange(ow)[None, None, None, :] * sw)
    flat = (rows * wp + cols).reshape(-1)
    return flat.astype(np.int64), (hp, wp, oh * ow), (kh, kw), (ph, pw)


def unfold(input, kernel_size, dilation=1, padding=0, stride=1):
    """torch.nn.functional.unfold (im2col): [N, C, H, W] ([C, H, W] unbatched) to
    [N, C * kh * kw, L], each column one sliding block, channels outermost as torch."""
    if input.dim() not in (3, 4):
        raise KilnValueError(f"unfold: input must be 3-D (unbatched) or 4-D [N, C, H, W], got {tuple(input.shape)}")
    unbatched = input.dim() == 3
    x = input.unsqueeze(0) if unbatched else input
    n, c, h, w = x.shape
    flat, (hp, wp, L), (kh, kw), (ph, pw) = _im2col_index("unfold", (h, w), kernel_size, dilation, padding, stride)
    if ph or pw:
        x = F.pad(x, [pw, pw, ph, ph])
    cols = x.reshape([n, c, hp * wp]).index_select(2, _tensor(flat, device=x.device))
    out = cols.reshape([n, c * kh * kw, L])
    return out.squeeze(0) if unbatched else out


def fold(input, output_size, kernel_size, dilation=1, padding=0, stride=1):
    """torch.nn.functional.fold (col2im): [N, C * kh * kw, L] ([C * kh * kw, L] unbatched) to
    [N, C, H, W], overlapping blocks summed; L must be the number of blocks output_size holds."""
    if input.dim() not in (2, 3):
        raise KilnValueError(f"fold: input must be 2-D (unbatched) or 3-D [N, C * kh * kw, L], got "
                             f"{tuple(input.shape)}")
    unbatched = input.dim() == 2
    x = input.unsqueeze(0) if unbatched else input
    h, w = _tuple2("fold", "output_size", output_size)
    flat, (hp, wp, L), (kh, kw), (ph, pw) = _im2col_index("fold", (h, w), kernel_size, dilation, padding, stride)
    n, ck, length = x.shape
    if ck % (kh * kw):
        raise KilnValueError(f"fold: input's dimension 1 ({ck}) must be divisible by the kernel's size "
                             f"({kh} * {kw} = {kh * kw})")
    if length != L:
        raise KilnValueError(f"fold: input's dimension 2 ({length}) must be the number of sliding blocks ({L}) for "
                             f"output_size=({h}, {w}), kernel_size=({kh}, {kw}) and these dilation, padding and "
                             "stride")
    c = ck // (kh * kw)
    out = _C.zeros([n, c, hp * wp], dtype=x.dtype, device=x.device)
    out = out.index_add(2, _tensor(flat, device=x.device), x.reshape([n, c, kh * kw * L]))
    out = out.reshape([n, c, hp, wp])
    if ph or pw:
        out = out[:, :, ph:ph + h, pw:pw + w]
    return out.squeeze(0) if unbatched else out


class Unfold(Module):
    """torch.nn.Unfold: F.unfold."""

    def __init__(self, kernel_size, dilation=1, padding=0, stride=1):
        super().__init__()
        self.kernel_size, self.dilation, self.padding, self.stride = kernel_size, dilation, padding, stride

    def forward(self, input):
        return unfold(input, self.kernel_size, self.dilation, self.padding, self.stride)

    def extra_repr(self):
        return (f"kernel_size={self.kernel_size}, dilation={self.dilation}, padding={self.padding}, "
                f"stride={self.stride}")


class Fold(Module):
    """torch.nn.Fold: F.fold."""

    def __init__(self, output_size, kernel_size, dilation=1, padding=0, stride=1):
        super().__init__()
        self.output_size, self.kernel_size = output_size, kernel_size
        self.dilation, self.padding, self.stride = dilation, padding, stride

    def forward(self, input):
        return fold(input, self.output_size, self.kernel_size, self.dilation, self.padding, self.stride)

    def extra_repr(self):
        return (f"output_size={self.output_size}, kernel_size={self.kernel_size}, dilation={self.dilation}, "
                f"padding={self.padding}, stride={self.stride}")


# ---- affine_grid / grid_sample (2-D) ----
def _base_coords(n, align_corners):
    if align_corners:
        return np.linspace(-1.0, 1.0, n) if n > 1 else np.zeros(n)
    return (np.arange(n) * 2.0 + 1.0) / n - 1.0


def affine_grid(theta, size, align_corners=None):
    """torch.nn.functional.affine_grid, 2-D: theta [N, 2, 3] and size (N, C, H, W) give the sampling
    grid [N, H, W, 2] (x, y in [-1, 1]) that grid_sample takes; differentiable in theta.
    align_corners=None is False, as torch (which warns)."""
    align_corners = bool(align_corners)
    if not theta.is_floating_point():
        raise KilnValueError(f"affine_grid: theta must be floating point, got {theta.dtype}")
    size = tuple(int(s) for s in size)
    if len(size) == 5:
        raise KilnError("affine_grid: 3-D (5-D size) grids are not supported by Kiln; only 2-D (N, C, H, W)")
    if len(size) != 4:
        raise KilnValueError(f"affine_grid: size must be (N, C, H, W), got {size}")
    n, _, h, w = size
    if theta.dim() != 3 or tuple(theta.shape) != (n, 2, 3):
        raise KilnValueError(f"affine_grid: expected theta of shape (N, 2, 3) = ({n}, 2, 3) for size {size}, got "
                             f"{tuple(theta.shape)}")
    if min(h, w) <= 0:
        raise KilnValueError(f"affine_grid: size's H and W must be > 0, got {size}")
    xs, ys = _base_coords(w, align_corners), _base_coords(h, align_corners)
    base = np.stack(np.broadcast_arrays(xs[None, :], ys[:, None], np.ones((1, 1))), -1)  # [H, W, 3]
    # built in theta's dtype, as torch's (a float32 base would round float64 grids)
    base = _tensor(base.reshape(1, h * w, 3), dtype=theta.dtype, device=theta.device)
    grid = base.expand([n, h * w, 3]).matmul(theta.transpose(1, 2))  # [N, H * W, 2]
    return grid.reshape([n, h, w, 2])


_GRID_MODES = ("bilinear", "nearest")
_GRID_PADDING = ("zeros", "border", "reflection")


def _reflect(coord, twice_low, twice_high):
    # torch's reflect_coordinates: reflect coord into [twice_low / 2, twice_high / 2]
    if twice_low == twice_high:
        return coord * 0.0
    low = twice_low / 2.0
    span = (twice_high - twice_low) / 2.0
    coord = (coord - low).abs()
    with no_grad():
        flips = (coord / span).floor()
        even = (flips - (flips / 2.0).floor() * 2.0) == 0
    extra = coord - flips * span  # fmod(coord, span), its gradient 1 with respect to coord
    return _C.where(even, extra + low, span - extra + low)


def _source_index(coord, size, padding_mode, align_corners):
    # torch's grid_sampler_compute_source_index: [-1, 1] to pixel coordinates, then the padding rule
    if align_corners:
        coord = (coord + 1.0) / 2.0 * (size - 1)
    else:
        coord = ((coord + 1.0) * size - 1.0) / 2.0
    if padding_mode == "border":
        coord = coord.clamp(0.0, size - 1.0)
    elif padding_mode == "reflection":
        if align_corners:
            coord = _reflect(coord, 0.0, 2.0 * (size - 1))
        else:
            coord = _reflect(coord, -1.0, 2.0 * size - 1.0)
        coord = coord.clamp(0.0, size - 1.0)
    if padding_mode != "zeros":
        # torch's clip_coordinates takes a NaN (from a NaN grid point, or +-inf reflected) to 0
        coord = coord.masked_fill(coord.isnan(), 0.0)
    return coord


def grid_sample(input, grid, mode="bilinear", padding_mode="zeros", align_corners=None):
    """torch.nn.functional.grid_sample, 2-D: input [N, C, H, W] sampled at grid [N, Ho, Wo, 2] (x, y
    in [-1, 1]) to [N, C, Ho, Wo]; mode bilinear or nearest, padding_mode zeros, border or
    reflection; align_corners=None is False, as torch. Differentiable in input and (bilinear) grid,
    with torch's gradients (nearest: the grid's is zero). input and grid must have the same dtype,
    except under autocast, where (as torch) both are converted to float32 and the result is float32; a
    NaN grid point samples as torch's (zeros padding: NaN for bilinear, 0 for nearest; border and
    reflection: coordinate 0, as +-inf gives with reflection). Bicubic and 5-D (volumetric) inputs are refused."""
    align_corners = bool(align_corners)
    if mode == "bicubic":
        raise KilnError("grid_sample: mode='bicubic' is not supported by Kiln; use 'bilinear' or 'nearest'")
    if mode not in _GRID_MODES:
        raise KilnValueError(f"grid_sample: mode must be 'bilinear' or 'nearest', got {mode!r}")
    if padding_mode not in _GRID_PADDING:
        raise KilnValueError(f"grid_sample: padding_mode must be 'zeros', 'border' or 'reflection', got "
                             f"{padding_mode!r}")
    if input.dim() == 5:
        raise KilnError("grid_sample: 5-D (volumetric) input is not supported by Kiln; only 4-D [N, C, H, W]")
    if input.dim() != 4 or grid.dim() != 4 or grid.shape[-1] != 2:
        raise KilnValueError(f"grid_sample: expected input [N, C, H, W] and grid [N, Ho, Wo, 2], got input "
                             f"{tuple(input.shape)} and grid {tuple(grid.shape)}")
    if input.shape[0] != grid.shape[0]:
        raise KilnValueError(f"grid_sample: input and grid must have the same batch size, got input "
                             f"{tuple(input.shape)} and grid {tuple(grid.shape)}")
    if not input.is_floating_point() or not grid.is_floating_point():
        raise KilnValueError(f"grid_sample: input and grid must be floating point, got {input.dtype} and "
                             f"{grid.dtype}")
    if _C.autocast_dtype() is not None:
        # as torch's autocast (grid_sampler is on its float32 list): both run in float32
        input, grid = input.to(_C.dtype.float32), grid.to(_C.dtype.float32)
    elif input.dtype != grid.dtype:
        raise KilnValueError(f"grid_sample: expected input and grid to have the same dtype, but input has "
                             f"{input.dtype} and grid has {grid.dtype}; as torch, neither is converted outside "
                             f"autocast: convert one (e.g. grid.to(input.dtype)) or run under kiln.amp.autocast")
    n, c, h, w = input.shape
    _, ho, wo, _ = grid.shape
    ix = _source_index(grid[..., 0], w, padding_mode, align_corners).reshape([n, 1, ho * wo])
    iy = _source_index(grid[..., 1], h, padding_mode, align_corners).reshape([n, 1, ho * wo])
    flat = input.reshape([n, c, h * w])

    def tap(x, y):
        # input at integer pixel (x, y) (no gradient through them), 0 outside: [N, C, Ho * Wo]. A NaN
        # (grid point NaN, zeros padding) is outside; the index is built from a NaN-free copy.
        inside = (x >= 0) & (x <= w - 1) & (y >= 0) & (y <= h - 1)
        x, y = x.masked_fill(x.isnan(), 0.0), y.masked_fill(y.isnan(), 0.0)
        index = (y.clamp(0, h - 1) * w + x.clamp(0, w - 1)).long()
        vals = flat.gather(2, index.expand([n, c, ho * wo]))
        return vals * inside.to(input.dtype)

    if mode == "nearest":
        with no_grad():
            x, y = ix.round(), iy.round()  # half to even, as torch's nearbyint
        out = tap(x, y)
        if grid.requires_grad and _C.is_grad_enabled():
            # as torch, the grid gets a zero gradient (not none): a zero-valued term that depends on it
            everywhere = _C.ones(*grid.shape, dtype=_C.dtype.bool, device=grid.device)
            out = out + grid.masked_fill(everywhere, 0.0).sum()
    else:
        with no_grad():
            x0, y0 = ix.floor(), iy.floor()
        x1, y1 = x0 + 1, y0 + 1
        wx1, wy1 = ix - x0, iy - y0
        wx0, wy0 = 1.0 - wx1, 1.0 - wy1
        out = (tap(x0, y0) * (wx0 * wy0) + tap(x1, y0) * (wx1 * wy0) + tap(x0, y1) * (wx0 * wy1)
               + tap(x1, y1) * (wx1 * wy1))
    return out.reshape([n, c, ho, wo])
