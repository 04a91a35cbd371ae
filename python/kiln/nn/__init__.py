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
from ._more_losses import *  # noqa: F401,F403  (torch.nn's shrinks, RReLU, alpha dropouts, margin/NLL losses)
from .layers import (  # noqa: F401
    ConvTranspose1d, ConvTranspose2d, MaxPool1d, MaxPool3d, AvgPool1d, AvgPool3d, Mish, Softsign, Tanhshrink,
    LogSigmoid, ReLU6, Hardswish, Hardsigmoid, SELU, ELU, CELU, Hardtanh, Softplus, PReLU, GLU, LogSoftmax, Softmin,
    InstanceNorm1d, InstanceNorm2d, InstanceNorm3d, Dropout1d, Dropout2d, Dropout3d, Unflatten, PixelShuffle,
    PixelUnshuffle, MultiheadAttention, AdaptiveAvgPool1d, AdaptiveMaxPool1d, AdaptiveMaxPool2d,
)
from .rnn import RNNBase, RNN, LSTM, GRU, RNNCellBase, RNNCell, LSTMCell, GRUCell  # noqa: F401
from . import utils  # noqa: F401  (kiln.nn.utils, torch.nn.utils' clipping and vectors)
from .utils import clip_grad_norm_, clip_grad_value_  # noqa: F401
from .transformer import (  # noqa: F401
    TransformerEncoderLayer, TransformerEncoder, TransformerDecoderLayer, TransformerDecoder, Transformer,
)
from ._extra import Bilinear, EmbeddingBag, Fold, Unfold  # noqa: F401
from ._more_layers import *  # noqa: F401,F403  (padding, LP / 3-d adaptive pooling, MaxUnpool, ConvTranspose3d, ...)
