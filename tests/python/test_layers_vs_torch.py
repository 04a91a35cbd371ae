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


# ---- 3. losses ----
def test_loss_modules_match_torch():
    x, y = rnd(5, 4), rnd(5, 4, seed=1)
    cls = torch.tensor([0, 3, 1, 1, 2])
    w = torch.tensor([0.5, 1.0, 2.0, 1.5])
    for red in ("mean", "sum", "none"):
        cases = [
            (nn.CrossEntropyLoss(k(w), ignore_index=1, reduction=red, label_smoothing=0.1),
             tnn.CrossEntropyLoss(w, ignore_index=1, reduction=red, label_smoothing=0.1), (x, cls)),
            (nn.NLLLoss(k(w), reduction=red), tnn.NLLLoss(w, reduction=red), (TF.log_softmax(x, 1), cls)),
            (nn.MSELoss(reduction=red), tnn.MSELoss(reduction=red), (x, y)),
            (nn.L1Loss(reduction=red), tnn.L1Loss(reduction=red), (x, y)),
            (nn.SmoothL1Loss(reduction=red, beta=0.5), tnn.SmoothL1Loss(reduction=red, beta=0.5), (x, y)),
            (nn.HuberLoss(reduction=red, delta=0.7), tnn.HuberLoss(reduction=red, delta=0.7), (x, y)),
            (nn.BCELoss(k(w), reduction=red), tnn.BCELoss(w, reduction=red), (x.sigmoid(), y.sigmoid())),
            (nn.BCEWithLogitsLoss(reduction=red), tnn.BCEWithLogitsLoss(reduction=red), (x, y.sigmoid())),
            (nn.KLDivLoss(reduction=red, log_target=True), tnn.KLDivLoss(reduction=red, log_target=True),
             (TF.log_softmax(x, 1), TF.log_softmax(y, 1))),
            (nn.CosineEmbeddingLoss(0.2, reduction=red), tnn.CosineEmbeddingLoss(0.2, reduction=red),
             (x, y, torch.tensor([1.0, -1, 1, -1, 1]))),
            (nn.MarginRankingLoss(0.1, reduction=red), tnn.MarginRankingLoss(0.1, reduction=red),
             (x[:, 0], y[:, 0], torch.tensor([1.0, -1, 1, -1, 1]))),
        ]
        for km, tm, args in cases:
            close(km(*[k(a) for a in args]), tm(*args))
    kl = nn.KLDivLoss(reduction="batchmean")
    close(kl(k(TF.log_softmax(x, 1)), k(y.softmax(1))), tnn.KLDivLoss(reduction="batchmean")(x.log_softmax(1),
                                                                                          y.softmax(1)))
    assert list(nn.CrossEntropyLoss(k(w)).state_dict()) == list(tnn.CrossEntropyLoss(w).state_dict())
    with pytest.raises(ValueError, match="reduction"):
        nn.MSELoss(reduction="avg")


def test_bce_with_logits_weight_and_pos_weight():
    x, y = rnd(6, 3) * 8, torch.rand(6, 3)
    w, pw = torch.rand(6, 1) + 0.5, torch.tensor([0.5, 2.0, 3.0])
    for red in ("mean", "sum", "none"):
        for kw in ({"weight": w}, {"pos_weight": pw}, {"weight": w, "pos_weight": pw}):
            want = TF.binary_cross_entropy_with_logits(x, y, reduction=red, **kw)
            close(F.binary_cross_entropy_with_logits(k(x), k(y), reduction=red, **{n: k(v) for n, v in kw.items()}),
                  want)
            tm = tnn.BCEWithLogitsLoss(reduction=red, **kw)
            km = nn.BCEWithLogitsLoss(reduction=red, **{n: k(v) for n, v in kw.items()})
            close(km(k(x), k(y)), tm(x, y))
    # the gradient goes through the composed form
    xk = k(x).requires_grad_()
    F.binary_cross_entropy_with_logits(xk, k(y), pos_weight=k(pw)).backward()
    xt = x.clone().requires_grad_()
    TF.binary_cross_entropy_with_logits(xt, y, pos_weight=pw).backward()
    close(xk.grad, xt.grad)


# ---- 6. functional signatures ----
def test_functional_signatures():
    x = rnd(3, 4, 5)
    close(F.softmax(k(x), dim=1, dtype=kiln.float64), TF.softmax(x, dim=1, dtype=torch.float64))
    assert F.softmax(k(x), dim=1, dtype=kiln.float64).dtype == kiln.float64
    close(F.log_softmax(k(x), 2, dtype=kiln.float64), TF.log_softmax(x, 2, dtype=torch.float64))
    close(F.softmin(k(x), 1), TF.softmin(x, 1))
    t = torch.tensor([[0, 2], [5, 1]])
    assert F.one_hot(k(t)).tolist() == TF.one_hot(t).tolist()
    assert F.one_hot(k(t), 7).tolist() == TF.one_hot(t, 7).tolist()
    for p, dim in ((2.0, 1), (1.0, -1), (3.0, 0)):
        close(F.normalize(k(x), p, dim), TF.normalize(x, p, dim))
    close(F.normalize(k(torch.zeros(2, 3))), TF.normalize(torch.zeros(2, 3)))
    a, b = rnd(4, 6), rnd(4, 6, seed=3)
    close(F.pairwise_distance(k(a), k(b)), TF.pairwise_distance(a, b))
    close(F.pairwise_distance(k(a), k(b), 1.0, 1e-3, True), TF.pairwise_distance(a, b, 1.0, 1e-3, True))
    img = rnd(2, 3, 7, 9)
    for size in ((None, 4), (3, None), 5):
        close(F.adaptive_avg_pool2d(k(img), size), TF.adaptive_avg_pool2d(img, size))
    close(nn.AdaptiveAvgPool2d((None, 2))(k(img)), tnn.AdaptiveAvgPool2d((None, 2))(img))
    w, bias = rnd(3), rnd(3, seed=5)
    close(F.instance_norm(k(img), None, None, k(w), k(bias)), TF.instance_norm(img, None, None, w, bias))
    rm, rv = torch.zeros(3), torch.ones(3)
    krm, krv = k(rm), k(rv)
    close(F.instance_norm(k(img), krm, krv, k(w), k(bias), True, 0.2, 1e-3),
          TF.instance_norm(img, rm, rv, w, bias, True, 0.2, 1e-3))
    close(krm, rm)
    close(krv, rv)
    close(F.instance_norm(k(img), krm, krv, use_input_stats=False), TF.instance_norm(img, rm, rv, use_input_stats=False))
