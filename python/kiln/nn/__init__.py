"""kiln.nn: modules (Module, Parameter, the common layers, C++ models as CppModule) and the
functional ops (kiln.nn.functional)."""
from . import functional  # noqa: F401
from . import init  # noqa: F401
from .modules import (  # noqa: F401
    Module, Parameter, CppModule, Linear, Conv1d, Conv2d, Conv3d, BatchNorm1d, BatchNorm2d, BatchNorm3d, LayerNorm,
    RMSNorm, GroupNorm, Embedding, Dropout, ReLU, SiLU, GELU, Tanh, Sigmoid, LeakyReLU, Softmax, Identity, Flatten,
    MaxPool2d, AvgPool2d, AdaptiveAvgPool2d, Upsample, Sequential, ModuleList, IncompatibleKeys,
)
from .modules import (ModuleDict, ParameterList, ParameterDict)  # noqa: F401
from .loss import (  # noqa: F401
    CrossEntropyLoss, NLLLoss, MSELoss, L1Loss, SmoothL1Loss, HuberLoss, BCELoss, BCEWithLogitsLoss, KLDivLoss,
    CosineEmbeddingLoss, MarginRankingLoss, CTCLoss,
)
from .layers import (  # noqa: F401
    ConvTranspose1d, ConvTranspose2d, MaxPool1d, MaxPool3d, AvgPool1d, AvgPool3d, Mish, Softsign, Tanhshrink,
    LogSigmoid, ReLU6, Hardswish, Hardsigmoid, SELU, ELU, CELU, Hardtanh, Softplus, PReLU, GLU, LogSoftmax, Softmin,
    InstanceNorm1d, InstanceNorm2d, InstanceNorm3d, Dropout1d, Dropout2d, Dropout3d, Unflatten, PixelShuffle,
    PixelUnshuffle, MultiheadAttention,
)
import numbers

from .. import _C


def clip_grad_norm_(parameters, max_norm, norm_type=2.0):
    """Scales the gradients of `parameters` (a tensor, or an iterable of tensors: a list, a generator,
    module.parameters()) to a global norm of at most max_norm; norm_type: 2, any p > 0, or inf (the
    largest |g|). Returns the norm before clipping (an f64 0-dim tensor); parameters without a
    gradient are skipped."""
    if isinstance(parameters, _C.Tensor):
        parameters = [parameters]
    else:
        try:
            parameters = list(parameters)
        except TypeError:
            raise TypeError(f"clip_grad_norm_: parameters must be a tensor or an iterable of tensors, got "
                            f"{type(parameters).__name__}") from None
    for i, p in enumerate(parameters):
        if not isinstance(p, _C.Tensor):
            raise TypeError(f"clip_grad_norm_: parameters[{i}] is a {type(p).__name__}, not a tensor")
    if isinstance(norm_type, str) and norm_type.lower() in ("inf", "infinity"):  # as torch's float(norm_type)
        norm_type = float("inf")
    for name, v in (("max_norm", max_norm), ("norm_type", norm_type)):
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise TypeError(f"clip_grad_norm_: {name} must be a number, got {v!r}")
    return _C.clip_grad_norm_(parameters, float(max_norm), float(norm_type))
