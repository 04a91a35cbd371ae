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


def test_conv_module_same_padding_stride():
    with pytest.raises(ValueError, match="padding='same' is not supported for strided convolutions"):
        nn.Conv2d(1, 1, 3, stride=2, padding="same")
    with pytest.raises(ValueError, match="strided"):
        tnn.Conv2d(1, 1, 3, stride=2, padding="same")
    tm = tnn.Conv2d(2, 3, (3, 4), padding="same", dilation=2)
    km = same_weights(nn.Conv2d(2, 3, (3, 4), padding="same", dilation=2), tm)
    x = rnd(1, 2, 7, 8)
    close(km(k(x)), tm(x))


# ---- 2. BatchNorm ----
def test_batchnorm_num_batches_tracked_and_cumulative_momentum():
    for momentum in (0.1, None):
        tm, km = tnn.BatchNorm1d(3, momentum=momentum), nn.BatchNorm1d(3, momentum=momentum)
        assert list(km.state_dict()) == list(tm.state_dict())
        same_weights(km, tm)  # strict load of torch's state dict, num_batches_tracked included
        for i in range(3):
            x = rnd(6, 3, seed=i)
            close(km(k(x)), tm(x))
        assert km.num_batches_tracked.dtype == kiln.int64 and km.num_batches_tracked.item() == 3
        close(km.running_mean, tm.running_mean)
        close(km.running_var, tm.running_var)
        km.eval(), tm.eval()
        close(km(k(x)), tm(x))
        assert km.num_batches_tracked.item() == 3
    km = nn.BatchNorm2d(3, track_running_stats=False)
    assert "num_batches_tracked" not in km.state_dict()
    tm = tnn.BatchNorm2d(3, bias=False, momentum=None)
    km = same_weights(nn.BatchNorm2d(3, bias=False, momentum=None), tm)
    x = rnd(2, 3, 4, 4)
    close(km(k(x)), tm(x))
    assert repr(km) == repr(tm)


def test_batchnorm_input_dims_as_torch():
    with pytest.raises(ValueError, match=r"expected 2D or 3D input \(got 4D input\)"):
        nn.BatchNorm1d(3)(kiln.randn(2, 3, 4, 4))
    with pytest.raises(ValueError, match=r"expected 4D input \(got 2D input\)"):
        nn.BatchNorm2d(3)(kiln.randn(2, 3))
    with pytest.raises(ValueError, match=r"expected 4D input \(got 3D input\)"):
        nn.BatchNorm2d(3)(kiln.randn(3, 4, 4))
    with pytest.raises(ValueError, match=r"expected 4D input \(got 3D input\)"):
        tnn.BatchNorm2d(3)(torch.randn(3, 4, 4))


# ---- 3. losses ----
@pytest.mark.filterwarnings("ignore:reduction")  # torch's note on kl_div's "mean"
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


# ---- 4. new layers ----
def test_new_layers_match_torch():
    x1, x2, x3 = rnd(2, 4, 9), rnd(2, 4, 6, 7), rnd(2, 4, 4, 5, 6)
    cases = [
        (nn.ConvTranspose1d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2, dilation=2),
         tnn.ConvTranspose1d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2, dilation=2), x1),
        (nn.ConvTranspose2d(4, 3, (2, 3), stride=(2, 1), padding=(0, 1), bias=False),
         tnn.ConvTranspose2d(4, 3, (2, 3), stride=(2, 1), padding=(0, 1), bias=False), x2),
        (nn.MaxPool1d(3, 2, 1), tnn.MaxPool1d(3, 2, 1), x1),
        (nn.MaxPool3d(2, ceil_mode=True), tnn.MaxPool3d(2, ceil_mode=True), x3),
        (nn.AvgPool1d(3, 2, 1, count_include_pad=False), tnn.AvgPool1d(3, 2, 1, count_include_pad=False), x1),
        (nn.AvgPool3d(2, divisor_override=3), tnn.AvgPool3d(2, divisor_override=3), x3),
        (nn.ELU(0.5), tnn.ELU(0.5), x2), (nn.CELU(0.5), tnn.CELU(0.5), x2), (nn.SELU(), tnn.SELU(), x2),
        (nn.PReLU(4, 0.1), tnn.PReLU(4, 0.1), x2), (nn.PReLU(), tnn.PReLU(), x2),
        (nn.Mish(), tnn.Mish(), x2), (nn.Hardswish(), tnn.Hardswish(), x2 * 4),
        (nn.Hardsigmoid(), tnn.Hardsigmoid(), x2 * 4), (nn.ReLU6(inplace=True), tnn.ReLU6(inplace=True), x2 * 5),
        (nn.Softplus(2.0, 5.0), tnn.Softplus(2.0, 5.0), x2 * 4), (nn.LogSoftmax(1), tnn.LogSoftmax(1), x2),
        (nn.Softmin(-1), tnn.Softmin(-1), x2), (nn.GLU(1), tnn.GLU(1), x2),
        (nn.Hardtanh(-0.5, 2.0), tnn.Hardtanh(-0.5, 2.0), x2 * 2), (nn.Softsign(), tnn.Softsign(), x2),
        (nn.Tanhshrink(), tnn.Tanhshrink(), x2), (nn.LogSigmoid(), tnn.LogSigmoid(), x2),
        (nn.InstanceNorm1d(4, affine=True), tnn.InstanceNorm1d(4, affine=True), x1),
        (nn.InstanceNorm1d(4), tnn.InstanceNorm1d(4), x1[0]),
        (nn.InstanceNorm2d(4), tnn.InstanceNorm2d(4), x2),
        (nn.Unflatten(1, (2, -1)), tnn.Unflatten(1, (2, -1)), x2),
        (nn.PixelShuffle(2), tnn.PixelShuffle(2), x2), (nn.PixelUnshuffle(2), tnn.PixelUnshuffle(2), rnd(1, 2, 4, 6)),
    ]
    for km, tm, x in cases:
        same_weights(km, tm)
        close(km(k(x)), tm(x))
        assert repr(km) == repr(tm)
    tm, km = tnn.ConvTranspose2d(4, 3, 3, stride=2), nn.ConvTranspose2d(4, 3, 3, stride=2)
    same_weights(km, tm)
    close(km(k(x2), output_size=[14, 16]), tm(x2, output_size=[14, 16]))
    close(km(k(x2[0])), tm(x2[0]))


def test_instance_norm_running_stats():
    tm = tnn.InstanceNorm2d(4, momentum=0.3, track_running_stats=True)
    km = same_weights(nn.InstanceNorm2d(4, momentum=0.3, track_running_stats=True), tm)
    for i in range(2):
        x = rnd(3, 4, 5, 5, seed=i)
        close(km(k(x)), tm(x))
    close(km.running_mean, tm.running_mean)
    close(km.running_var, tm.running_var)
    km.eval(), tm.eval()
    close(km(k(x)), tm(x))


def test_channel_dropout():
    x = kiln.ones(8, 16, 3, 3)
    for mod, xs in ((nn.Dropout2d(0.5), x), (nn.Dropout1d(0.5), x[:, :, 0]), (nn.Dropout3d(0.5), x.unsqueeze(2))):
        y = np.asarray(mod(xs)).reshape(8, 16, -1)
        assert set(np.unique(y)) <= {0.0, 2.0}
        assert (y.min(-1) == y.max(-1)).all()  # a whole channel is dropped or kept
        assert 0 < (y[:, :, 0] == 0).sum() < 8 * 16
        mod.eval()
        assert np.asarray(mod(xs)).tolist() == np.asarray(xs).tolist()
    assert repr(nn.Dropout2d(0.2)) == repr(tnn.Dropout2d(0.2))
    with pytest.raises(ValueError, match="between 0 and 1"):
        nn.Dropout2d(1.5)


def test_embedding_from_pretrained():
    w = rnd(5, 3)
    km, tm = nn.Embedding.from_pretrained(k(w)), tnn.Embedding.from_pretrained(w)
    idx = torch.tensor([[0, 4], [2, 2]])
    close(km(k(idx)), tm(idx))
    assert not km.weight.requires_grad
    assert nn.Embedding.from_pretrained(k(w), freeze=False, padding_idx=1).weight.requires_grad
    assert repr(nn.Embedding.from_pretrained(k(w), padding_idx=1)) == "Embedding(5, 3, padding_idx=1)"


# ---- 5. constructor arguments torch code passes ----
def test_torch_constructor_arguments():
    x = rnd(2, 3, 6, 6)
    assert nn.ReLU(inplace=True)(k(x)).tolist() == torch.relu(x).tolist()
    assert repr(nn.ReLU(inplace=True)) == repr(tnn.ReLU(inplace=True))
    assert nn.Dropout(0.3, inplace=True).eval()(k(x)).shape == (2, 3, 6, 6)
    assert isinstance(nn.Identity(54, unused="x"), nn.Identity)
    with pytest.warns(UserWarning):
        close(nn.Softmax()(k(x)), tnn.Softmax(dim=1)(x))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for shape in ((4,), (2, 3, 4)):  # dim 0 for 1- and 3-D inputs
            close(nn.Softmax()(k(rnd(*shape))), tnn.Softmax()(rnd(*shape)))
    tm = tnn.LayerNorm(6, bias=False)
    km = same_weights(nn.LayerNorm(6, bias=False), tm)
    assert km.bias is None
    close(km(k(x)), tm(x))
    lin = nn.Linear(3, 2, dtype=kiln.float64, device="cpu")
    assert lin.weight.dtype == kiln.float64 and lin.weight.requires_grad
    assert nn.Conv2d(3, 2, 3, dtype=kiln.float64).weight.dtype == kiln.float64
    assert nn.LayerNorm(3, dtype=kiln.float64).weight.dtype == kiln.float64
    assert nn.Embedding(3, 2, dtype=kiln.float64).weight.dtype == kiln.float64
    for mode in ("zeros", "reflect", "replicate", "circular"):
        for padding in (1, (2, 1), "same"):
            tm = tnn.Conv2d(3, 4, 3, padding=padding, padding_mode=mode)
            km = same_weights(nn.Conv2d(3, 4, 3, padding=padding, padding_mode=mode), tm)
            close(km(k(x)), tm(x))
            assert repr(km) == repr(tm)
    tm = tnn.MaxPool2d(2, return_indices=True)
    kv, ki = nn.MaxPool2d(2, return_indices=True)(k(x))
    tv, ti = tm(x)
    close(kv, tv)
    assert ki.tolist() == ti.tolist()
    close(nn.AvgPool2d(3, 2, 1, divisor_override=2)(k(x)), tnn.AvgPool2d(3, 2, 1, divisor_override=2)(x))
    with pytest.raises(kiln.KilnError, match="sparse"):
        nn.Embedding(4, 3, sparse=True)


def test_unbatched_conv():
    for km, tm, x in ((nn.Conv2d(3, 4, 3, padding=1), tnn.Conv2d(3, 4, 3, padding=1), rnd(3, 5, 6)),
                      (nn.Conv1d(3, 4, 3), tnn.Conv1d(3, 4, 3), rnd(3, 7))):
        same_weights(km, tm)
        close(km(k(x)), tm(x))


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
    close(F.instance_norm(k(img), krm, krv, use_input_stats=False),
          TF.instance_norm(img, rm, rv, use_input_stats=False))


# ---- 7. reprs and construction checks ----
def test_reprs_and_construction_errors():
    pairs = [
        (nn.LayerNorm(4), tnn.LayerNorm(4)), (nn.LayerNorm((2, 3), elementwise_affine=False),
                                             tnn.LayerNorm((2, 3), elementwise_affine=False)),
        (nn.Embedding(10, 3, padding_idx=0), tnn.Embedding(10, 3, padding_idx=0)),
        (nn.Dropout(0.2), tnn.Dropout(0.2)), (nn.MaxPool2d(2), tnn.MaxPool2d(2)),
        (nn.MaxPool2d(3, 1, 1, 2, ceil_mode=True), tnn.MaxPool2d(3, 1, 1, 2, ceil_mode=True)),
        (nn.AvgPool2d(2), tnn.AvgPool2d(2)), (nn.GroupNorm(2, 4), tnn.GroupNorm(2, 4)),
        (nn.Conv2d(1, 2, 3), tnn.Conv2d(1, 2, 3)),
        (nn.Conv2d(4, 2, 3, 2, 1, 2, 2, bias=False), tnn.Conv2d(4, 2, 3, 2, 1, 2, 2, bias=False)),
        (nn.Conv1d(1, 2, 3, padding="same"), tnn.Conv1d(1, 2, 3, padding="same")),
        (nn.BatchNorm2d(3), tnn.BatchNorm2d(3)), (nn.Softmax(1), tnn.Softmax(1)),
        (nn.Linear(3, 2), tnn.Linear(3, 2)), (nn.GELU(), tnn.GELU()), (nn.Flatten(), tnn.Flatten()),
        (nn.LeakyReLU(0.2), tnn.LeakyReLU(0.2)),
    ]
    for km, tm in pairs:
        assert repr(km) == repr(tm)
    with pytest.raises(ValueError, match="between 0 and 1, but got 1.5"):
        nn.Dropout(1.5)
    with pytest.raises(ValueError, match="divisible by num_groups"):
        nn.GroupNorm(3, 4)


# ---- MultiheadAttention ----
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("kv", [None, (5, 3)])
def test_multihead_attention_matches_torch(batch_first, kv):
    kdim, vdim = kv or (None, None)
    tm = tnn.MultiheadAttention(8, 2, kdim=kdim, vdim=vdim, batch_first=batch_first)
    km = same_weights(nn.MultiheadAttention(8, 2, kdim=kdim, vdim=vdim, batch_first=batch_first), tm)
    assert [n for n, _ in km.named_parameters()] == [n for n, _ in tm.named_parameters()]
    L, S, N = 4, 6, 3
    shape = (lambda n, s, e: (n, s, e) if batch_first else (s, n, e))
    q = rnd(*shape(N, L, 8))
    key, val = rnd(*shape(N, S, kdim or 8), seed=1), rnd(*shape(N, S, vdim or 8), seed=2)
    kpm = torch.tensor([[False] * 5 + [True], [False] * 6, [True, False] * 3])
    am_bool = torch.rand(L, S, generator=torch.Generator().manual_seed(0)) > 0.7
    am_bool[:, 0] = False  # every query attends something
    am_float = rnd(N * 2, L, S, seed=4)
    for kwargs in ({}, {"key_padding_mask": kpm}, {"attn_mask": am_bool}, {"attn_mask": am_float},
                   {"attn_mask": am_bool, "key_padding_mask": kpm, "average_attn_weights": False},
                   {"need_weights": False}):
        ko, kw = km(k(q), k(key), k(val), **{n: k(v) for n, v in kwargs.items() if isinstance(v, torch.Tensor)},
                    **{n: v for n, v in kwargs.items() if not isinstance(v, torch.Tensor)})
        to, tw = tm(q, key, val, **kwargs)
        close(ko, to)
        if tw is None:
            assert kw is None
        else:
            close(kw, tw)
    # unbatched, bias=False, add_bias_kv, add_zero_attn
    tm = tnn.MultiheadAttention(8, 4, bias=False, add_bias_kv=True, add_zero_attn=True)
    km = same_weights(nn.MultiheadAttention(8, 4, bias=False, add_bias_kv=True, add_zero_attn=True), tm)
    q2, kv2 = rnd(4, 8), rnd(6, 8, seed=7)
    ko, kw = km(k(q2), k(kv2), k(kv2), key_padding_mask=k(kpm[0]))
    to, tw = tm(q2, kv2, kv2, key_padding_mask=kpm[0])
    close(ko, to)
    close(kw, tw)


def test_multihead_attention_bool_mask_made_on_the_mask_device(monkeypatch):
    # The additive mask from a bool mask must be made where the mask lives (a CUDA mask otherwise met
    # a CPU tensor): every factory call on the way passes device=.
    from kiln.nn import layers
    calls = []
    zeros = layers._C.zeros

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return zeros(*args, **kwargs)

    monkeypatch.setattr(layers._C, "zeros", spy)
    tm = tnn.MultiheadAttention(8, 2, add_zero_attn=True)
    km = same_weights(nn.MultiheadAttention(8, 2, add_zero_attn=True), tm)
    q = rnd(4, 2, 8)
    am = torch.zeros(4, 4, dtype=torch.bool)
    am[:, 1] = True
    kpm = torch.tensor([[False, False, False, True], [False] * 4])
    calls.clear()  # the constructor's (its tensors are placed after)
    ko, kw = km(k(q), k(q), k(q), attn_mask=k(am), key_padding_mask=k(kpm))
    to, tw = tm(q, q, q, attn_mask=am, key_padding_mask=kpm)
    close(ko, to)
    close(kw, tw)
    assert len(calls) >= 2 and all("device" in c for c in calls)


def test_loss_weight_must_broadcast_to_the_input():
    x, t = rnd(3, 4), torch.rand(3, 4, generator=torch.Generator().manual_seed(0))
    for kc, tc, xin in ((nn.BCEWithLogitsLoss, tnn.BCEWithLogitsLoss, x), (nn.BCELoss, tnn.BCELoss, t)):
        with pytest.raises(RuntimeError):
            tc(weight=torch.ones(2, 3, 4))(xin, t)
        with pytest.raises(ValueError, match=r"weight of size \[2, 3, 4\] does not broadcast to the input size \[3, 4\]"):
            kc(weight=kiln.ones(2, 3, 4))(k(xin), k(t))
        w = rnd(3, 1, seed=3).abs()
        close(kc(weight=k(w), reduction="none")(k(xin), k(t)), tc(weight=w, reduction="none")(xin, t))


def test_conv_transpose_output_size_length_checked():
    tm = tnn.ConvTranspose1d(2, 3, 3, stride=2)
    km = same_weights(nn.ConvTranspose1d(2, 3, 3, stride=2), tm)
    x = rnd(1, 2, 5)
    for osz in ([12], [1, 3, 12]):
        close(km(k(x), output_size=osz), tm(x, output_size=osz))
    close(km(k(x[0]), output_size=[3, 12]), tm(x[0], output_size=[3, 12]))  # unbatched: 1 or 2
    for osz in ([3, 12], [1, 1, 3, 12]):
        with pytest.raises(ValueError, match="output_size must have 1 or 3"):
            tm(x, output_size=osz)
        with pytest.raises(ValueError, match=f"for 3D input, output_size must have 1 or 3 elements \\(got {len(osz)}\\)"):
            km(k(x), output_size=osz)


def test_unbatched_cosine_embedding_prelu_pixel_shuffle():
    a, b = rnd(4), rnd(4, seed=1)
    for red in ("none", "mean", "sum"):
        for y in (1.0, -1.0):
            out = nn.CosineEmbeddingLoss(margin=0.1, reduction=red)(k(a), k(b), kiln.tensor(y))
            ref = tnn.CosineEmbeddingLoss(margin=0.1, reduction=red)(a, b, torch.tensor(y))
            assert tuple(out.shape) == tuple(ref.shape) == ()
            close(out, ref)
    out = nn.PReLU()(kiln.tensor(-2.0))
    assert tuple(out.shape) == () and abs(out.item() + 0.5) < 1e-7
    x = rnd(2, 3, 8, 2, 3)
    for xi in (x, x[0, 0]):  # several batch dims, unbatched
        close(nn.PixelShuffle(2)(k(xi)), tnn.PixelShuffle(2)(xi))
        y = tnn.PixelShuffle(2)(xi)
        close(nn.PixelUnshuffle(2)(k(y)), tnn.PixelUnshuffle(2)(y))
    with pytest.raises(ValueError, match="at least 3 dims"):
        nn.PixelShuffle(2)(kiln.ones(4, 4))
