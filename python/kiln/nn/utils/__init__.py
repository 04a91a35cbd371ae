"""kiln.nn.utils: torch.nn.utils' gradient clipping, flat parameter vectors, parametrize / parametrizations
(weight_norm, spectral_norm), the older weight_norm / spectral_norm hooks and (in kiln.nn.utils.rnn) the
packed and padded sequences of the recurrent layers. The clipping runs in
the engine (optim::clip_grad_norm / clip_grad_value), on the gradients' device, without a host read:
one pass to sum the norm, then the gradients scaled in place (clip_grad_norm_ on the CPU scales an
f32/f16/bf16 gradient in two multiplies, so that a factor below f32's smallest normal is not flushed
to 0)."""
import numbers

from ... import _C
from ..._tensor import _a_type, no_grad as _no_grad


def _tensors(fn, parameters):
    """parameters as a list of tensors: one tensor, or an iterable of them (a list, a generator,
    module.parameters())."""
    if isinstance(parameters, _C.Tensor):
        return [parameters]
    try:
        parameters = list(parameters)
    except TypeError:
        raise TypeError(f"{fn}: parameters must be a tensor or an iterable of tensors, got "
                        f"{type(parameters).__name__}") from None
    for i, p in enumerate(parameters):
        if not isinstance(p, _C.Tensor):
            raise TypeError(f"{fn}: parameters[{i}] is {_a_type(p)}, not a tensor")
    return parameters


def _number(fn, name, v):
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise TypeError(f"{fn}: {name} must be a number, got {v!r}")
    return float(v)


def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False, foreach=None):
    """torch's clip_grad_norm_: every gradient times min(max_norm / (norm + 1e-6), 1), where norm is the
    global norm of all gradients (norm_type: 2, any p > 0, or inf for the largest |g|; the powers summed
    in f64, so that |g| past f32's square root does not overflow). As torch: max_norm 0 zeroes the
    gradients, an inf norm scales them by 0 and a NaN norm by NaN, unless error_if_nonfinite, which
    raises instead (a KilnError, a RuntimeError, with torch's words) and scales nothing; a negative
    max_norm is refused. Returns the norm before clipping (an f64 0-dim tensor); parameters without a
    gradient are skipped. foreach is accepted and changes nothing (the engine scales every gradient
    itself: one multiply each, two for a non-f64 gradient on the CPU, by sqrt(factor) twice when the
    factor is below f32's smallest normal, else by the factor then 1, so the result is the single
    product's)."""
    parameters = _tensors("clip_grad_norm_", parameters)
    if isinstance(norm_type, str) and norm_type.lower() in ("inf", "infinity"):  # as torch's float(norm_type)
        norm_type = float("inf")
    max_norm = _number("clip_grad_norm_", "max_norm", max_norm)
    norm_type = _number("clip_grad_norm_", "norm_type", norm_type)
    if foreach is not None and not isinstance(foreach, bool):
        raise TypeError(f"clip_grad_norm_: foreach must be None, True or False, got {foreach!r}")
    return _C.clip_grad_norm_(parameters, max_norm, norm_type, bool(error_if_nonfinite))


def clip_grad_value_(parameters, clip_value, foreach=None):
    """torch's clip_grad_value_: every gradient clamped to [-clip_value, clip_value] in place (clip_value
    >= 0: 0 zeroes them, as torch's); parameters without a gradient are skipped. foreach is accepted and changes nothing."""
    parameters = _tensors("clip_grad_value_", parameters)
    if foreach is not None and not isinstance(foreach, bool):
        raise TypeError(f"clip_grad_value_: foreach must be None, True or False, got {foreach!r}")
    _C.clip_grad_value_(parameters, _number("clip_grad_value_", "clip_value", clip_value))


def parameters_to_vector(parameters):
    """torch's parameters_to_vector: the parameters flattened and concatenated into one 1-D tensor (a copy)."""
    parameters = _tensors("parameters_to_vector", parameters)
    if not parameters:
        raise _C.KilnValueError("parameters_to_vector: no parameters")
    return _C.cat([p.reshape(-1) for p in parameters], 0)


def vector_to_parameters(vec, parameters):
    """torch's vector_to_parameters: copies consecutive slices of the 1-D vec into the parameters, in place
    (without recording a gradient); vec's length must be their total size."""
    parameters = _tensors("vector_to_parameters", parameters)
    if not isinstance(vec, _C.Tensor):
        raise TypeError(f"vector_to_parameters: expected vec to be a tensor, got {type(vec).__name__}")
    total = sum(p.numel() for p in parameters)
    if vec.dim() != 1 or vec.numel() != total:
        raise _C.KilnValueError(f"vector_to_parameters: vec must be 1-D with the parameters' {total} elements, got "
                                f"shape {list(vec.shape)}")
    at = 0
    with _no_grad():
        for p in parameters:
            n = p.numel()
            p.copy_(vec[at:at + n].reshape(list(p.shape)))
            at += n


from . import rnn  # noqa: E402,F401  (kiln.nn.utils.rnn, torch's path)
# torch.nn.utils.parametrize / parametrizations (kiln/nn/parametrize.py, kiln/nn/parametrizations.py)
from .. import parametrize, parametrizations  # noqa: E402,F401
import sys as _sys  # noqa: E402

# They live in kiln.nn: these make torch's import paths work too
# (`from kiln.nn.utils.parametrizations import weight_norm`, `import kiln.nn.utils.parametrize as P`)
_sys.modules[__name__ + ".parametrize"] = parametrize
_sys.modules[__name__ + ".parametrizations"] = parametrizations
from .._norm_hooks import weight_norm, remove_weight_norm, spectral_norm, remove_spectral_norm  # noqa: E402,F401
