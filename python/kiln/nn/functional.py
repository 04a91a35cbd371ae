"""kiln.nn.functional: convolution, pooling, normalisation, activations, softmax, losses,
embedding, dropout, attention, padding and resampling, with torch.nn.functional's argument names."""
from .._C import (  # noqa: F401
    linear, conv1d, conv2d, conv3d, conv_transpose1d, conv_transpose2d,
    max_pool1d, max_pool2d, max_pool3d, avg_pool1d, avg_pool2d, avg_pool3d, max_unpool1d, max_unpool2d,
    max_unpool3d,
    adaptive_avg_pool2d, batch_norm, batch_norm_relu, layer_norm, group_norm, instance_norm, rms_norm, local_response_norm,
    relu, gelu, sigmoid, tanh, silu, mish, softsign, logsigmoid, selu, relu6, hardsigmoid, hardswish, softplus,
    leaky_relu, elu, celu, hardtanh, prelu, glu, softmax, log_softmax,
    cross_entropy, nll_loss, mse_loss, l1_loss, binary_cross_entropy_with_logits, binary_cross_entropy,
    smooth_l1_loss, huber_loss, kl_div, margin_ranking_loss, cosine_embedding_loss, cosine_similarity, ctc_loss,
    embedding, dropout, scaled_dot_product_attention, pad, interpolate, pixel_shuffle, pixel_unshuffle,
    one_hot, masked_softmax, attention,
)

swish = silu


def upsample(input, size=None, scale_factor=None, mode="nearest", align_corners=None,
             recompute_scale_factor=None):
    """torch.nn.functional.upsample: interpolate under its older name."""
    return interpolate(input, size=size, scale_factor=scale_factor, mode=mode, align_corners=align_corners,
                       recompute_scale_factor=recompute_scale_factor)


# ---- torch.nn.functional's signatures over the ops above ----
import numbers as _numbers
import warnings as _warnings

from .. import _C

_pad = pad


def pad(input, pad, mode="constant", value=None):
    """torch.nn.functional.pad(input, pad, mode='constant', value=None): pads the last len(pad) / 2 dims, in
    torch's order ({left, right} of the last dim, then {before, after} of the one before it, ...). A negative
    amount crops that side, in every mode as torch's: reflect and replicate pad the positive sides first
    (reflecting about the whole input, as torch's indices do) and then crop the negative ones; circular crops
    first and wraps around what is left (torch's _pad_circular)."""
    amounts = list(pad) if isinstance(pad, (tuple, list)) else pad
    if mode == "constant" or not isinstance(amounts, list) or not any(
            isinstance(a, _numbers.Integral) and a < 0 for a in amounts):
        return _pad(input, pad, mode, value)

    def crop(t):
        for i in range(len(amounts) // 2):
            dim = t.dim() - 1 - i
            if dim < 0:
                break  # too short an input: _pad's own error names it
            lo, hi = -min(int(amounts[2 * i]), 0), -min(int(amounts[2 * i + 1]), 0)
            size = t.shape[dim] - lo - hi
            if size < 0 or (size == 0 and mode != "circular"):  # torch: circular may leave 0, the others not
                raise ValueError(f"pad: padding {tuple(amounts)} ({mode}) crops dim {dim} of the input "
                                 f"{list(input.shape)} to size {size}: the input is too small")
            t = t.narrow(dim, lo, size)
        return t

    positive = [max(int(a), 0) for a in amounts]
    if mode == "circular":
        cropped = crop(input)
        return _pad(cropped, positive, mode, value) if any(positive) else cropped
    return crop(_pad(input, positive, mode, value))
from .._tensor import no_grad as _no_grad

_softmax, _log_softmax, _one_hot = softmax, log_softmax, one_hot
_adaptive_avg_pool2d, _instance_norm = adaptive_avg_pool2d, instance_norm
_bce_with_logits = binary_cross_entropy_with_logits
_engine_cross_entropy, _engine_nll_loss = cross_entropy, nll_loss


def _class_target(target):
    # torch takes uint8 class indices as well as int64 (and refuses int32, which Kiln's engine has always
    # taken); the engine's index kernels are i64/i32, so a uint8 target is widened
    if isinstance(target, _C.Tensor) and target.dtype == _C.dtype.uint8:
        return target.to(_C.dtype.int64)
    return target


def cross_entropy(input, target, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0):
    return _engine_cross_entropy(input, _class_target(target), weight, ignore_index, reduction, label_smoothing)


def nll_loss(input, target, weight=None, ignore_index=-100, reduction="mean"):
    return _engine_nll_loss(input, _class_target(target), weight, ignore_index, reduction)


cross_entropy.__doc__ = _engine_cross_entropy.__doc__ + "\nA uint8 target is taken as int64, as torch's."
nll_loss.__doc__ = _engine_nll_loss.__doc__ + "\nA uint8 target is taken as int64, as torch's."


def _softmax_dim(name, ndim):
    """torch's _get_softmax_dim: dim=None (legacy) is 0 for 0-, 1- and 3-D inputs, else 1."""
    _warnings.warn(f"Implicit dimension choice for {name} has been deprecated. Change the call to include dim=X "
                   "as an argument.", stacklevel=4)
    return 0 if ndim in (0, 1, 3) else 1


def _softmax_family(name, op, input, dim, dtype, negate=False):
    # torch's legacy dim when none is given; dtype converts the input first (softmax in f32 of an f16 tensor)
    if dim is None:
        dim = _softmax_dim(name, input.dim())
    x = input if dtype is None else input.to(dtype)
    return op(-x if negate else x, dim)


def softmax(input, dim=None, _stacklevel=3, dtype=None):
    """exp(x) / sum(exp(x)) over dim; dtype converts the input first (softmax in f32 of an f16 tensor)."""
    return _softmax_family("softmax", _softmax, input, dim, dtype)


def log_softmax(input, dim=None, _stacklevel=3, dtype=None):
    return _softmax_family("log_softmax", _log_softmax, input, dim, dtype)


def softmin(input, dim=None, _stacklevel=3, dtype=None):
    """softmax(-x)."""
    return _softmax_family("softmin", _softmax, input, dim, dtype, negate=True)


def _refuse_legacy_reduction(name, size_average, reduce):
    """torch's deprecated size_average / reduce (before reduction=): refused by name."""
    if size_average is not None or reduce is not None:
        raise _C.KilnError(f"{name}: size_average and reduce are deprecated in torch and not supported; use "
                           "reduction=")


def one_hot(tensor, num_classes=-1, *, out_of_range="error"):
    """[..., num_classes] int64 rows of 0 with a 1 at each index; num_classes=-1 (torch's default) is the
    largest index + 1. out_of_range (Kiln's): "error" as torch, or "zeros" (an all-0 row)."""
    return _one_hot(tensor, num_classes, out_of_range=out_of_range)


def normalize(input, p=2.0, dim=1, eps=1e-12, out=None):
    """input / max(||input||_p over dim, eps), as torch.nn.functional.normalize."""
    if out is not None:
        raise _C.KilnError("normalize: out= is not supported (assign the result)")
    return input / _C.norm(input, p, dim, True).clamp(min=eps)


def pairwise_distance(x1, x2, p=2.0, eps=1e-6, keepdim=False):
    """||x1 - x2 + eps||_p over the last dim, as torch."""
    return _C.norm(x1 - x2 + eps, p, -1, keepdim)


def adaptive_avg_pool2d(input, output_size):
    """output_size: an int, or (H, W) where None keeps the input's size in that dim (as torch); NumPy ints
    taken, and a size of 0 gives torch's empty result."""
    oh, ow = _adaptive_size("adaptive_avg_pool2d", output_size, 2)
    oh = input.shape[-2] if oh is None else oh
    ow = input.shape[-1] if ow is None else ow
    if oh == 0 or ow == 0:
        return _adaptive_max_empty(input, list(input.shape[:-2]) + [oh, ow], False)
    return _adaptive_avg_pool2d(input, (oh, ow))


def instance_norm(input, running_mean=None, running_var=None, weight=None, bias=None, use_input_stats=True,
                  momentum=0.1, eps=1e-5):
    """Normalises each (sample, channel) over its spatial dims, torch's argument order. With running
    stats: use_input_stats updates them with the batch mean of the per-instance statistics (torch's
    batch_norm over [1, N*C, ...]); use_input_stats=False normalises with them."""
    if running_mean is None and running_var is None:
        if not use_input_stats:
            raise _C.KilnValueError("instance_norm: use_input_stats=False needs running_mean and running_var")
        return _instance_norm(input, weight, bias, eps)
    if input.dim() < 3:
        raise _C.KilnValueError(f"instance_norm: expected an input [N, C, ...] of 3 or more dims, got {input.dim()}D")
    n, c = input.shape[0], input.shape[1]
    rep = (lambda t: None if t is None else t.repeat(n))
    rm, rv = rep(running_mean), rep(running_var)
    # batch_norm's eps rule (positive in training) is not instance_norm's: torch takes eps=0 here.
    out = _C._instance_norm_running(input.reshape([1, n * c] + list(input.shape[2:])), rm, rv, rep(weight),
                                    rep(bias), use_input_stats, momentum, eps)
    if use_input_stats:
        with _no_grad():
            for run, new in ((running_mean, rm), (running_var, rv)):
                if run is not None:
                    run.copy_(new.reshape([n, c]).mean(0))
    return out.reshape(input.shape)


def _check_weight_fits(name, weight, input):
    """torch's rule for a loss weight: it broadcasts to the input's shape, not beyond it (a [2, 3, 4]
    weight on a [3, 4] input is an error, not a [2, 3, 4] loss)."""
    w, x = list(weight.shape), list(input.shape)
    if len(w) > len(x) or any(a not in (1, b) for a, b in zip(w[::-1], x[::-1])):
        raise _C.KilnValueError(f"{name}: weight of size {w} does not broadcast to the input size {x}")


def binary_cross_entropy_with_logits(input, target, weight=None, size_average=None, reduce=None, reduction="mean",
                                     pos_weight=None):
    """-w [pos_weight y log sigmoid(x) + (1 - y) log(1 - sigmoid(x))], computed stably from the logits as
    torch; weight broadcasts to the loss, pos_weight (one per class) along the last dim."""
    _refuse_legacy_reduction("binary_cross_entropy_with_logits", size_average, reduce)
    if weight is None and pos_weight is None:
        return _bce_with_logits(input, target, reduction)
    if not target.dtype.is_floating_point:  # as the engine's path (and torch): named here, not as `1 - target`
        raise _C.KilnError(f"binary_cross_entropy_with_logits: target must be a floating tensor, got {target.dtype}")
    if tuple(target.shape) != tuple(input.shape):
        raise _C.KilnValueError(f"binary_cross_entropy_with_logits: target size {tuple(target.shape)} must be the "
                                f"same as input size {tuple(input.shape)}")
    if reduction not in ("mean", "sum", "none"):
        raise _C.KilnValueError(f"binary_cross_entropy_with_logits: reduction must be \"mean\", \"sum\" or "
                                f"\"none\", got \"{reduction}\"")
    # log(1 + exp(-x)) = log1p(exp(-|x|)) + max(-x, 0): no overflow for large |x|
    softplus_neg = (-input.abs()).exp().log1p() + relu(-input)
    if pos_weight is not None:
        loss = (1 - target) * input + ((pos_weight - 1) * target + 1) * softplus_neg
    else:
        loss = (1 - target) * input + softplus_neg
    if weight is not None:
        _check_weight_fits("binary_cross_entropy_with_logits", weight, input)
        loss = loss * weight
    if reduction == "none":
        return loss
    return loss.sum() if reduction == "sum" else loss.mean()


def _channel_dropout(name, input, p, training, batched_dim, inplace):
    """Zeroes whole channels (every element of a [N, C, ...] input's (n, c) slice) with probability p
    and scales the others by 1 / (1 - p); an unbatched input (one dim fewer) is a batch of one.
    inplace=True puts the result into the input and returns the input itself (as F.dropout)."""
    y = _channel_dropout_out(name, input, p, training, batched_dim)
    if not inplace or y is input:
        return y
    return _C._activation_into(name, input, y)  # the input itself, as torch's (a leaf needing grad refused)


def _channel_dropout_out(name, input, p, training, batched_dim):
    if not 0 <= p <= 1:
        raise _C.KilnValueError(f"{name}: dropout probability has to be between 0 and 1, but got {p}")
    if input.dim() not in (batched_dim - 1, batched_dim):
        raise _C.KilnValueError(f"{name}: expected an unbatched {batched_dim - 1}D or batched {batched_dim}D input, "
                                f"got {input.dim()}D")
    if not training or p == 0:
        return input
    if p == 1:
        return input * 0
    # torch's dropout2d reads a 3-D input as [N, C, L] (1-D channel dropout, with a warning), not as [C, H, W]
    unbatched = input.dim() == batched_dim - 1 and name != "dropout2d"
    x = input.unsqueeze(0) if unbatched else input
    keep = _C.rand(*(list(x.shape[:2]) + [1] * (x.dim() - 2)), device=x.device) >= p
    y = x * (keep.to(x.dtype) / (1 - p))
    return y.squeeze(0) if unbatched else y


def dropout1d(input, p=0.5, training=True, inplace=False):
    """Channel dropout of [N, C, L] (or [C, L]); inplace=True writes into the input where Kiln may."""
    return _channel_dropout("dropout1d", input, p, training, 3, inplace)


def dropout2d(input, p=0.5, training=True, inplace=False):
    """Channel dropout of [N, C, H, W] (or [C, H, W]); inplace=True writes into the input where Kiln may."""
    return _channel_dropout("dropout2d", input, p, training, 4, inplace)


def dropout3d(input, p=0.5, training=True, inplace=False):
    """Channel dropout of [N, C, D, H, W] (or [C, D, H, W]); inplace=True writes into the input where Kiln may."""
    return _channel_dropout("dropout3d", input, p, training, 5, inplace)


_pixel_shuffle, _pixel_unshuffle = pixel_shuffle, pixel_unshuffle


def _over_last3(fn, name, input, factor):
    # torch takes [*, C, H, W]: the leading dims (none for an unbatched input, or several) as one batch dim.
    if input.dim() < 3:
        raise _C.KilnValueError(f"{name}: expected an input of at least 3 dims [*, C, H, W], got {list(input.shape)}")
    lead = list(input.shape[:-3])
    y = fn(input.reshape([-1] + list(input.shape[-3:])), factor)
    return y.reshape(lead + list(y.shape[1:]))


def pixel_shuffle(input, upscale_factor):
    """[*, C r^2, H, W] -> [*, C, H r, W r], as torch (an unbatched [C r^2, H, W] included)."""
    return _over_last3(_pixel_shuffle, "pixel_shuffle", input, upscale_factor)


def pixel_unshuffle(input, downscale_factor):
    """[*, C, H r, W r] -> [*, C r^2, H, W], as torch (an unbatched [C, H r, W r] included)."""
    return _over_last3(_pixel_unshuffle, "pixel_unshuffle", input, downscale_factor)


_cosine_embedding_loss = cosine_embedding_loss


def cosine_embedding_loss(input1, input2, target, margin=0.0, size_average=None, reduce=None, reduction="mean"):
    """As torch: x1, x2 [N, D] with y [N], or unbatched [D], [D] with a 0-d y."""
    _refuse_legacy_reduction("cosine_embedding_loss", size_average, reduce)
    if input1.dim() == 1 and input2.dim() == 1 and target.dim() == 0:
        loss = _cosine_embedding_loss(input1.unsqueeze(0), input2.unsqueeze(0), target.reshape([1]), margin, reduction)
        return loss.reshape([]) if reduction == "none" else loss
    return _cosine_embedding_loss(input1, input2, target, margin, reduction)


# ---- convolution of an unbatched input, as torch's: [C, *spatial] is a batch of one, the result without
# the batch dim ----
def _takes_unbatched(op, spatial):
    def fn(input, *args, **kwargs):
        if isinstance(input, _C.Tensor) and input.dim() == spatial + 1:
            out = op(input.unsqueeze(0), *args, **kwargs)
            return tuple(o.squeeze(0) for o in out) if isinstance(out, tuple) else out.squeeze(0)
        return op(input, *args, **kwargs)
    fn.__name__ = fn.__qualname__ = op.__name__
    fn.__doc__ = ((op.__doc__ or "").rstrip() + f"\nAn unbatched input ({spatial + 1}-D, [C, ...]) gives an unbatched "
                  "result, as torch's (its gradient has the input's shape).")
    return fn


# (the pooling ops take an unbatched input in the engine already)
conv1d, conv_transpose1d = _takes_unbatched(conv1d, 1), _takes_unbatched(conv_transpose1d, 1)
conv2d, conv_transpose2d = _takes_unbatched(conv2d, 2), _takes_unbatched(conv_transpose2d, 2)
conv3d = _takes_unbatched(conv3d, 3)


# ---- mse_loss, l1_loss, smooth_l1_loss, huber_loss: a target of another shape broadcasts, as torch's ----
def _broadcast_loss(op):
    name = op.__name__

    def fn(input, target, *args, **kwargs):
        if isinstance(input, _C.Tensor) and isinstance(target, _C.Tensor) and \
                tuple(target.shape) != tuple(input.shape):
            _warnings.warn(f"Using a target size ({_size(target)}) that is different to the input size "
                           f"({_size(input)}). This will likely lead to incorrect results due to broadcasting. "
                           "Please ensure they have the same size.", stacklevel=2)
            try:
                shape = list(_C.broadcast_shapes(tuple(input.shape), tuple(target.shape)))
            except Exception:
                raise _C.KilnValueError(f"{name}: the target size {list(target.shape)} and the input size "
                                        f"{list(input.shape)} do not broadcast together") from None
            input, target = input.expand(*shape), target.expand(*shape)
        return op(input, target, *args, **kwargs)
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = ((op.__doc__ or "").rstrip() + "\nA target of another shape broadcasts with the input, with torch's "
                  "UserWarning; each gradient is summed back to its tensor's shape.")
    return fn


def _size(t):
    return f"kiln.Size({list(t.shape)})"


mse_loss, l1_loss, smooth_l1_loss, huber_loss = (_broadcast_loss(f) for f in (mse_loss, l1_loss, smooth_l1_loss,
                                                                              huber_loss))


# ---- embedding with torch's max_norm ----
_embedding = embedding


def embedding(input, weight, padding_idx=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=False,
              sparse=False):
    """The rows of weight at the indices in input. max_norm renormalises, in place and outside autograd as
    torch's embedding_renorm_, each looked-up row whose norm_type-norm exceeds it to max_norm / (norm + 1e-7)
    times itself, before the lookup. scale_grad_by_freq and sparse are refused by name."""
    for arg, v in (("scale_grad_by_freq", scale_grad_by_freq), ("sparse", sparse)):
        if v:
            raise _C.KilnError(f"embedding: {arg}=True is not supported by Kiln (leave it False)")
    if max_norm is not None:
        _embedding_renorm(weight, input, max_norm, norm_type)
    return _embedding(input, weight, padding_idx)


def _embedding_renorm(weight, input, max_norm, norm_type):
    if weight.dim() != 2:  # the lookup's own error names it
        return
    with _no_grad():
        flat = input.reshape([-1])
        if flat.dtype != _C.dtype.int64:
            flat = flat.to(_C.dtype.int64)
        rows = weight[flat]  # a repeated index writes the same row twice below, as renormalising it once
        norm = _C.norm(rows, float(norm_type), -1, True)
        scale = _C.where(norm > max_norm, max_norm / (norm + 1e-7), _C.ones_like(norm))
        weight[flat] = rows * scale


# ---- adaptive pooling of 1-d inputs, and adaptive max pooling: torch's bins ----
def _adaptive_size(name, output_size, n):
    """output_size as n ints (an int repeats; None keeps the input's size: given back as None)."""
    size = tuple(output_size) if isinstance(output_size, (tuple, list)) else (output_size,) * n
    # a NumPy integer is an int, as torch takes it
    if len(size) != n or not all(s is None or (isinstance(s, _numbers.Integral) and not isinstance(s, bool)
                                               and s >= 0) for s in size):
        raise _C.KilnValueError(f"{name}: output_size must be {'an int' if n == 1 else f'an int or {n} ints'} "
                                f">= 0{'' if n == 1 else ' (or None)'}, got {output_size!r}")
    return tuple(None if s is None else int(s) for s in size)


def _adaptive_max_empty(input, out_shape, return_indices):
    """torch's result of an adaptive (max or average) pool with an output size of 0: empty, of out_shape (the input's
    leading dims and the output sizes), connected to input for autograd, int64 indices."""
    none = input.reshape([-1])[:0].reshape(out_shape)
    if not return_indices:
        return none
    return none, _C.zeros(out_shape, dtype=_C.dtype.int64, device=input.device)


def _adaptive_input(name, input, n):
    if input.dim() not in (n + 1, n + 2):
        raise _C.KilnValueError(f"{name}: expected a {n + 1}-D or {n + 2}-D input (unbatched or batched), got "
                                f"{list(input.shape)}")
    if any(s == 0 for s in input.shape[-n:]):
        raise _C.KilnValueError(f"{name}: the input's last {n} dim{'s' if n > 1 else ''} must be non-empty, got "
                                f"{list(input.shape)}")


def _bins(length, out):
    """torch's adaptive bins: [floor(i * length / out), ceil((i + 1) * length / out)) for i < out."""
    return [((i * length) // out, -((-(i + 1) * length) // out)) for i in range(out)]


def adaptive_avg_pool1d(input, output_size):
    """The mean over torch's adaptive bins of the last dim: (N, C, L) or (C, L) to (..., output_size)."""
    (out,) = _adaptive_size("adaptive_avg_pool1d", output_size, 1)
    _adaptive_input("adaptive_avg_pool1d", input, 1)
    if out is None:
        out = input.shape[-1]
    if out == 0:
        return _adaptive_max_empty(input, list(input.shape[:-1]) + [0], False)
    return _adaptive_avg_pool2d(input.unsqueeze(-2), (1, out)).squeeze(-2)


def _adaptive_max(bins, return_indices):
    """The maximum over each of bins (slices of the flattened last dims, with their (start, width)
    conversion to flat input indices) and, with return_indices, where it is."""
    values, indices = [], []
    for window, flat in bins:
        v, i = _C.max(window, -1)
        values.append(v)
        if return_indices:
            indices.append(flat(i))
    out = _C.stack(values, -1)
    return (out, _C.stack(indices, -1)) if return_indices else out


def adaptive_max_pool1d(input, output_size, return_indices=False):
    """The maximum over torch's adaptive bins of the last dim: (N, C, L) or (C, L) to (..., output_size);
    with return_indices=True also where each is in L, as torch's."""
    (out,) = _adaptive_size("adaptive_max_pool1d", output_size, 1)
    _adaptive_input("adaptive_max_pool1d", input, 1)
    length = input.shape[-1]
    out = length if out is None else out
    if out == 0:
        return _adaptive_max_empty(input, list(input.shape[:-1]) + [0], return_indices)
    bins = [(input[..., s:e], lambda i, s=s: i + s) for s, e in _bins(length, out)]
    return _adaptive_max(bins, return_indices)


def adaptive_max_pool2d(input, output_size, return_indices=False):
    """The maximum over torch's adaptive bins of the last two dims: (N, C, H, W) or (C, H, W) to
    (..., oh, ow) (an int output_size for both; None keeps that dim); with return_indices=True also where
    each is, as an index into H * W, as torch's."""
    oh, ow = _adaptive_size("adaptive_max_pool2d", output_size, 2)
    _adaptive_input("adaptive_max_pool2d", input, 2)
    h, w = input.shape[-2], input.shape[-1]
    oh, ow = h if oh is None else oh, w if ow is None else ow
    if oh == 0 or ow == 0:
        return _adaptive_max_empty(input, list(input.shape[:-2]) + [oh, ow], return_indices)
    rows = []
    for hs, he in _bins(h, oh):
        bins = []
        for ws, we in _bins(w, ow):
            window = input[..., hs:he, ws:we]
            window = window.reshape(list(window.shape[:-2]) + [(he - hs) * (we - ws)])
            bins.append((window, lambda i, hs=hs, ws=ws, bw=we - ws: (i // bw + hs) * w + i % bw + ws))
        rows.append(_adaptive_max(bins, return_indices))
    if return_indices:
        return _C.stack([r[0] for r in rows], -2), _C.stack([r[1] for r in rows], -2)
    return _C.stack(rows, -2)


# torch.nn.functional's bilinear, embedding_bag, gumbel_softmax, fold / unfold (kiln/nn/_extra.py)
from ._extra import (  # noqa: E402,F401
    bilinear, embedding_bag, gumbel_softmax, fold, unfold, affine_grid, grid_sample,
)
