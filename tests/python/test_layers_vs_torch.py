# kiln.nn's layers, losses and functional ops against torch.nn with the same weights and inputs.
import warnings

import numpy as np
import pytest

import kiln
from kiln import nn
from kiln.nn import functional as F

torch = pytest.importorskip("torch")
tnn, TF = torch.nn, torch.nn.functional


def k(a):
    """A kiln tensor from a torch tensor or a NumPy array (same dtype)."""
    return kiln.tensor(a.detach().numpy() if isinstance(a, torch.Tensor) else a)


def close(kt, tt, tol=1e-5):
    np.testing.assert_allclose(np.asarray(kt), tt.detach().numpy(), rtol=tol, atol=tol)


def same_weights(km, tm):
    """Loads torch module tm's state into kiln module km (strict: the names must match torch's)."""
    km.load_state_dict({n: k(v) for n, v in tm.state_dict().items()})
    return km


def rnd(*shape, seed=0):
    return torch.from_numpy(np.random.default_rng(seed + len(shape)).standard_normal(shape).astype(np.float32))


# ---- 1. padding="same" with a stride ----
@pytest.mark.parametrize("fn,x,w", [(F.conv1d, (1, 1, 5), (1, 1, 3)), (F.conv2d, (1, 1, 5, 5), (1, 1, 3, 3)),
                                    (F.conv3d, (1, 1, 5, 5, 5), (1, 1, 3, 3, 3))])
def test_same_padding_with_stride_is_refused(fn, x, w):
    with pytest.raises(ValueError, match="padding='same' is not supported for strided convolutions"):
        fn(kiln.randn(*x), kiln.randn(*w), stride=2, padding="same")
    with pytest.raises(RuntimeError, match="not supported for strided"):  # torch's
        getattr(TF, fn.__name__)(torch.randn(*x), torch.randn(*w), stride=2, padding="same")
    assert fn(kiln.randn(*x), kiln.randn(*w), stride=1, padding="same").shape == x
