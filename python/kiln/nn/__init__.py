"""kiln.nn: modules (Module, Parameter, the common layers, C++ models as CppModule) and the
functional ops (kiln.nn.functional)."""
from . import functional  # noqa: F401
from .modules import (  # noqa: F401
    Module, Parameter, CppModule, Linear, Conv1d, Conv2d, Conv3d, BatchNorm1d, BatchNorm2d, BatchNorm3d, LayerNorm,
    RMSNorm, GroupNorm, Embedding, Dropout, ReLU, SiLU, GELU, Tanh, Sigmoid, LeakyReLU, Softmax, Identity, Flatten,
    MaxPool2d, AvgPool2d, AdaptiveAvgPool2d, Upsample, Sequential, ModuleList, IncompatibleKeys,
)
from .._C import clip_grad_norm_  # noqa: F401
