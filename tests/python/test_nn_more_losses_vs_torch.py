# kiln.nn's shrink / threshold / rrelu activations, the in-place activation functionals, alpha dropout,
# pdist and the margin / NLL losses (kiln/nn/_more_losses.py) against torch in float64: values, gradients
# with respect to every floating input (and weight, where torch has one), shapes, reductions, refusals.
import math

import numpy as np
import pytest

import kiln
from kiln import nn
from kiln.nn import functional as F

torch = pytest.importorskip("torch")
tnn, TF = torch.nn, torch.nn.functional

REDUCTIONS = ("none", "mean", "sum")


def arr(*shape, seed=0, low=None, high=None):
    g = np.random.default_rng(seed)
    if low is not None:
        return g.uniform(low, high, shape)
    return g.standard_normal(shape)


def both(a, grad):
    """(kiln, torch) tensors of a NumPy array: float64 (requiring grad if asked) or integer as it is."""
    a = np.asarray(a)
    kt, tt = kiln.tensor(a), torch.from_numpy(a.copy())
    if grad and a.dtype.kind == "f":
        kt.requires_grad_(True)
        tt.requires_grad_(True)
    return kt, tt


def compare(kfn, tfn, arrays, grad=True, tol=1e-10, nograd=()):
    """kfn(*kiln tensors) against tfn(*torch tensors): values and shape, then the gradients of a random
    weighting of the result with respect to each floating input (but those at the indices nograd)."""
    pairs = [both(a, grad and i not in nograd) for i, a in enumerate(arrays)]
    kout, tout = kfn(*[p[0] for p in pairs]), tfn(*[p[1] for p in pairs])
    assert tuple(kout.shape) == tuple(tout.shape)
    np.testing.assert_allclose(np.asarray(kout.detach()), tout.detach().numpy(), rtol=tol, atol=tol)
    if not grad or not tout.requires_grad:
        return
    up = arr(*tout.shape, seed=99) if tout.dim() else np.array(1.3)
    (tout * torch.from_numpy(up)).sum().backward()
    (kout * kiln.tensor(up)).sum().backward()
    for kt, tt in pairs:
        if tt.requires_grad:
            kg = np.zeros(tuple(tt.shape)) if kt.grad is None else np.asarray(kt.grad)
            tg = np.zeros(tuple(tt.shape)) if tt.grad is None else tt.grad.numpy()  # (a target only compared)
            np.testing.assert_allclose(kg, tg, rtol=tol, atol=tol)


# ---- activations ----
@pytest.mark.parametrize("name,kw", [("hardshrink", {}), ("hardshrink", {"lambd": 1.1}), ("softshrink", {}),
                                     ("softshrink", {"lambd": 0.8}), ("softshrink", {"lambd": 0.0}),
                                     ("tanhshrink", {})])
def test_shrinks_match_torch(name, kw):
    x = arr(4, 5) * 2
    compare(lambda a: getattr(F, name)(a, **kw), lambda a: getattr(TF, name)(a, **kw), [x])


def test_shrinks_threshold_and_rrelu_at_nan_and_infinities_as_torch():
    # torch's rule: 0 (or value) only inside the band, so a NaN stays NaN with gradient 1; rrelu in training
    # gives a NaN slope 1 (only x <= 0 draws one)
    x = np.array([np.nan, np.inf, -np.inf, 0.5, -0.5, 2.0, -2.0])
    for kf, tf in ((F.hardshrink, TF.hardshrink), (F.softshrink, TF.softshrink), (F.tanhshrink, TF.tanhshrink),
                   (lambda a: F.threshold(a, 0.1, 2.0), lambda a: TF.threshold(a, 0.1, 2.0))):
        kx, tx = both(x, True)
        ky, ty = kf(kx), tf(tx)
        np.testing.assert_array_equal(np.asarray(ky.detach()), ty.detach().numpy())
        ky.sum().backward()
        ty.sum().backward()
        np.testing.assert_array_equal(np.asarray(kx.grad), tx.grad.numpy())
    kx = kiln.tensor(x).requires_grad_(True)
    F.rrelu(kx, training=True).sum().backward()
    g = np.asarray(kx.grad)
    np.testing.assert_array_equal(g[[0, 1, 3, 5]], 1.0)
    assert np.all((g[[2, 4, 6]] >= 1 / 8) & (g[[2, 4, 6]] <= 1 / 3))


def test_shrink_modules_match_torch():
    x = arr(3, 6, seed=1) * 2
    for kcls, tcls in ((nn.Hardshrink, tnn.Hardshrink), (nn.Softshrink, tnn.Softshrink)):
        compare(kcls(0.7), tcls(0.7), [x])
        assert repr(kcls(0.7)) == repr(tcls(0.7))
    compare(nn.Tanhshrink(), tnn.Tanhshrink(), [x])
    with pytest.raises(ValueError, match="lambd must be >= 0, got -1"):
        F.softshrink(kiln.tensor(x), -1)
    # Softshrink is not a Hardshrink, as torch's
    assert not isinstance(nn.Softshrink(), nn.Hardshrink) and not isinstance(tnn.Softshrink(), tnn.Hardshrink)


@pytest.mark.parametrize("name", ["hardshrink", "softshrink"])
@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.bool_])
def test_shrinks_refuse_integer_input_as_torch(name, dtype):
    a = np.array([-2, 0, 1, 3]).astype(dtype)
    with pytest.raises(NotImplementedError):
        getattr(TF, name)(torch.from_numpy(a))
    with pytest.raises(NotImplementedError, match=f"{name}: not implemented for input of dtype .*floating point"):
        getattr(F, name)(kiln.tensor(a))


@pytest.mark.parametrize("th,value", [(0.1, 20.0), (-0.5, -2.0), (0.0, 0.0)])
def test_threshold_matches_torch(th, value):
    x = arr(4, 5, seed=2)
    compare(lambda a: F.threshold(a, th, value), lambda a: TF.threshold(a, th, value), [x])
    compare(nn.Threshold(th, value), tnn.Threshold(th, value), [x])
    assert repr(nn.Threshold(th, value, True)) == repr(tnn.Threshold(th, value, True))
    kx, tx = both(x, False)
    assert F.threshold_(kx, th, value) is kx
    TF.threshold_(tx, th, value)
    np.testing.assert_array_equal(np.asarray(kx), tx.numpy())


@pytest.mark.parametrize("name,args", [("relu_", ()), ("elu_", (0.7,)), ("selu_", ()), ("celu_", (1.3,)),
                                       ("leaky_relu_", (0.2,)), ("hardtanh_", (-0.5, 0.8))])
def test_inplace_activations_modify_and_return_the_input(name, args):
    x = arr(3, 4, seed=3) * 2
    kx, tx = both(x, False)
    out = getattr(F, name)(kx, *args)
    assert out is kx
    getattr(TF, name)(tx, *args)
    np.testing.assert_allclose(np.asarray(kx), tx.numpy(), rtol=1e-12, atol=1e-12)
    # inside a graph: the gradient of the in-place result is torch's
    # (the engine's celu backward differs from torch's by ~4e-8 relative in float64: not this file's code)
    compare(lambda a: getattr(F, name)(a * 1.0, *args), lambda a: getattr(TF, name)(a * 1.0, *args), [x],
            tol=1e-6 if name == "celu_" else 1e-10)
    leaf = kiln.tensor(x).requires_grad_(True)
    with pytest.raises(RuntimeError):
        getattr(F, name)(leaf, *args)


def test_rrelu_eval_is_leaky_relu_with_the_mean_slope():
    x = arr(5, 6, seed=4)
    compare(lambda a: F.rrelu(a, 0.1, 0.3), lambda a: TF.rrelu(a, 0.1, 0.3), [x])
    km, tm = nn.RReLU(0.2, 0.4), tnn.RReLU(0.2, 0.4)
    km.eval(), tm.eval()
    compare(km, tm, [x])
    assert repr(km) == repr(tm)
    # deterministic out of training
    kx = kiln.tensor(x)
    np.testing.assert_array_equal(np.asarray(km(kx)), np.asarray(km(kx)))
    with pytest.raises(ValueError, match="lower bound .* upper bound"):
        F.rrelu(kx, 0.5, 0.2, training=True)


def test_rrelu_training_draws_slopes_in_range_with_their_gradient():
    kiln.manual_seed(0)
    x = -np.abs(arr(200, 50, seed=5)) - 0.1
    x[:, :5] = np.abs(x[:, :5])  # some positive columns: slope 1
    kx = kiln.tensor(x).requires_grad_(True)
    y = F.rrelu(kx, 0.1, 0.3, training=True)
    slope = np.asarray(y.detach()) / x
    neg = slope[:, 5:]
    np.testing.assert_allclose(slope[:, :5], 1.0)
    assert neg.min() >= 0.1 and neg.max() <= 0.3
    assert abs(neg.mean() - 0.2) < 0.005 and abs(neg.std() - 0.2 / math.sqrt(12)) < 0.005
    assert len(np.unique(np.round(neg, 12))) > neg.size // 2  # one draw per element
    y.sum().backward()
    np.testing.assert_allclose(np.asarray(kx.grad), slope, rtol=1e-12)
    # rrelu_ writes into the input; the module in training draws too
    kz = kiln.tensor(x)
    assert F.rrelu_(kz, 0.1, 0.3, training=True) is kz
    assert not np.array_equal(np.asarray(kz), x)
    m = nn.RReLU(0.1, 0.3)
    assert m.training and not np.array_equal(np.asarray(m(kiln.tensor(x))), np.asarray(m(kiln.tensor(x))))


# ---- alpha dropout ----
def test_alpha_dropout_eval_is_identity_and_p_checked():
    x = kiln.tensor(arr(4, 5))
    assert F.alpha_dropout(x, 0.5) is x  # training=False by default, as torch's
    assert F.feature_alpha_dropout(x, 0.5, training=False) is x
    m = nn.AlphaDropout(0.3).eval()
    assert m(x) is x
    assert repr(m) == repr(tnn.AlphaDropout(0.3))
    with pytest.raises(ValueError, match="between 0 and 1, but got 1.5"):
        F.alpha_dropout(x, 1.5, True)
    with pytest.raises(ValueError, match="between 0 and 1"):
        nn.FeatureAlphaDropout(-0.1)
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        F.feature_alpha_dropout(kiln.tensor(arr(5)), 0.5, True)
    np.testing.assert_array_equal(np.asarray(F.alpha_dropout(x, 1.0, True)), np.zeros((4, 5)))
    # FeatureAlphaDropout is not an AlphaDropout, as torch's
    assert not isinstance(nn.FeatureAlphaDropout(), nn.AlphaDropout)
    assert not isinstance(tnn.FeatureAlphaDropout(), tnn.AlphaDropout)


@pytest.mark.parametrize("p,training", [(0.5, False), (0.0, True), (1.0, True)])
def test_feature_alpha_dropout_of_1d_input_without_noise_as_torch(p, training):
    # torch checks the dims only where it draws noise: out of training, p 0 and p 1 take a 1-D input
    x = arr(5)
    kx = kiln.tensor(x)
    ky, ty = F.feature_alpha_dropout(kx, p, training), TF.feature_alpha_dropout(torch.from_numpy(x), p, training)
    np.testing.assert_array_equal(np.asarray(ky), ty.numpy())
    if p < 1:
        assert ky is kx


@pytest.mark.parametrize("p", [0.2, 0.5])
def test_alpha_dropout_keeps_selu_statistics_and_matches_torchs_affine_map(p):
    kiln.manual_seed(1)
    x = arr(400, 250, seed=6)  # zero mean, unit variance: alpha dropout keeps both
    kx = kiln.tensor(x).requires_grad_(True)
    y = F.alpha_dropout(kx, p, True)
    yv = np.asarray(y.detach())
    assert abs(yv.mean()) < 0.02 and abs(yv.var() - 1) < 0.03
    alpha = 1.7580993408473766
    a = 1 / math.sqrt((alpha ** 2 * p + 1) * (1 - p))
    b = alpha * a * p
    dropped = np.isclose(yv, -alpha * a + b)
    assert abs(dropped.mean() - p) < 0.01
    kept = ~dropped
    np.testing.assert_allclose(yv[kept], x[kept] * a + b, rtol=1e-12, atol=1e-12)
    y.sum().backward()
    np.testing.assert_allclose(np.asarray(kx.grad), kept * a, rtol=1e-12)
    # torch's output (its own draw): where both keep an element, and where both drop one, kiln's equals it
    ty = TF.alpha_dropout(torch.from_numpy(x), p, True).numpy()
    t_dropped = np.isclose(ty, -alpha * a + b)
    assert abs(t_dropped.mean() - p) < 0.01
    both_kept, both_dropped = kept & ~t_dropped, dropped & t_dropped
    assert both_kept.sum() > 1000 and both_dropped.sum() > 1000
    np.testing.assert_allclose(yv[both_kept], ty[both_kept], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(yv[both_dropped], ty[both_dropped], rtol=1e-12, atol=1e-12)


def test_feature_alpha_dropout_drops_whole_channels():
    kiln.manual_seed(2)
    x = arr(50, 40, 3, 4, seed=7)
    y = np.asarray(nn.FeatureAlphaDropout(0.5)(kiln.tensor(x)))
    alpha = 1.7580993408473766
    a = 1 / math.sqrt((alpha ** 2 * 0.5 + 1) * 0.5)
    dropped = np.isclose(y, -alpha * a + alpha * a * 0.5)
    per_channel = dropped.reshape(50, 40, -1)
    assert np.all(per_channel.all(-1) | ~per_channel.any(-1))
    assert abs(per_channel.all(-1).mean() - 0.5) < 0.06


# ---- distances ----
@pytest.mark.parametrize("p", [2, 1, 3.0, 0.5, float("inf")])
def test_pdist_matches_torch(p):
    x = arr(6, 4, seed=8)
    compare(lambda a: F.pdist(a, p), lambda a: TF.pdist(a, p), [x])


@pytest.mark.parametrize("p", [0.5, 1.5, 3.0])
def test_pdist_gradient_at_equal_rows_and_shared_coordinates_as_torch(p):
    # rows 0 and 1 are equal (a zero difference), rows 0 and 2 share two coordinates: torch's gradient is 0
    # there, not NaN
    x = np.array([[1.0, 2.0, 3.0, -1.0], [1.0, 2.0, 3.0, -1.0], [1.0, 5.0, 3.0, 0.5], [0.2, -2.0, 9.0, 4.0]])
    compare(lambda a: F.pdist(a, p), lambda a: TF.pdist(a, p), [x], tol=1e-12)


@pytest.mark.parametrize("p", [2, 0.5, 1, float("inf"), 0])
def test_pdist_in_several_chunks_matches_torch(p, monkeypatch):
    # the pairs are taken a chunk at a time: a chunk of 7 pairs (28 // 4) splits the 45 pairs of 10 rows
    from kiln.nn import _more_losses
    monkeypatch.setattr(_more_losses, "_PDIST_CHUNK", 28)
    x = arr(10, 4, seed=11)
    x[6] = x[2]
    compare(lambda a: F.pdist(a, p), lambda a: TF.pdist(a, p), [x], tol=1e-12)


def _spy_on_built_tensors(monkeypatch):
    """The sizes of the tensors _more_losses builds from NumPy arrays (its pair indices and masks)."""
    from kiln.nn import _more_losses
    sizes, build = [], _more_losses._tensor

    def spy(a, *args, **kw):
        sizes.append(np.asarray(a).size)
        return build(a, *args, **kw)
    monkeypatch.setattr(_more_losses, "_tensor", spy)
    return _more_losses, sizes


def test_pdist_gathers_a_chunk_of_pairs_at_a_time(monkeypatch):
    # no [N (N - 1) / 2, M] difference at once: each index tensor covers at most a chunk (28 // 4 = 7 pairs)
    mod, sizes = _spy_on_built_tensors(monkeypatch)
    monkeypatch.setattr(mod, "_PDIST_CHUNK", 28)
    x = arr(10, 4, seed=13)
    compare(lambda a: F.pdist(a, 3), lambda a: TF.pdist(a, 3), [x], tol=1e-12)
    assert sizes and max(sizes) <= 7


def test_multilabel_margin_loss_terms_are_n_by_most_targets_by_c(monkeypatch):
    # the masks are [N, k_max, C] (k_max = 3 here), not [N, C, C]
    _, sizes = _spy_on_built_tensors(monkeypatch)
    x, t = arr(2, 300, seed=14), np.full((2, 300), -1)
    t[0, :3], t[1, :2] = [4, 250, 4], [17, 3]
    compare(lambda a, b: F.multilabel_margin_loss(a, b, reduction="none"),
            lambda a, b: TF.multilabel_margin_loss(a, b, reduction="none"), [x, t], tol=1e-12)
    assert sizes and max(sizes) <= 2 * 3 * 300


def test_pdist_and_distance_modules():
    compare(lambda a: F.pdist(a), lambda a: TF.pdist(a), [arr(1, 3)], grad=False)
    with pytest.raises(ValueError, match="2-D"):
        F.pdist(kiln.tensor(arr(4)))
    with pytest.raises(ValueError, match="non-negative"):
        F.pdist(kiln.tensor(arr(3, 2)), -1)
    x1, x2 = arr(4, 5, seed=9), arr(4, 5, seed=10)
    compare(nn.CosineSimilarity(), tnn.CosineSimilarity(), [x1, x2])
    compare(nn.CosineSimilarity(dim=0, eps=1e-3), tnn.CosineSimilarity(dim=0, eps=1e-3), [x1, x2])
    compare(nn.PairwiseDistance(), tnn.PairwiseDistance(), [x1, x2])
    compare(nn.PairwiseDistance(1.0, 1e-3, True), tnn.PairwiseDistance(1.0, 1e-3, True), [x1, x2])


def test_softmax2d_matches_torch():
    compare(nn.Softmax2d(), tnn.Softmax2d(), [arr(2, 3, 4, 5)])
    compare(nn.Softmax2d(), tnn.Softmax2d(), [arr(3, 4, 5)])
    with pytest.raises(ValueError, match="expected input to be 3D or 4D, got 2D"):
        nn.Softmax2d()(kiln.tensor(arr(3, 4)))


# ---- losses ----
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("full", [False, True])
@pytest.mark.parametrize("var_shape", [(4, 3), (4,), (4, 1)])
def test_gaussian_nll_loss_matches_torch(reduction, full, var_shape):
    x, t = arr(4, 3), arr(4, 3, seed=1)
    v = arr(*var_shape, seed=2, low=0.1, high=2.0)
    v.flat[0] = 1e-9  # clamped to eps (the gradient passes at the clamped value, as torch's)
    kw = dict(full=full, eps=1e-6, reduction=reduction)
    compare(lambda a, b, c: F.gaussian_nll_loss(a, b, c, **kw), lambda a, b, c: TF.gaussian_nll_loss(a, b, c, **kw),
            [x, t, v])
    compare(nn.GaussianNLLLoss(full=full, reduction=reduction), tnn.GaussianNLLLoss(full=full, reduction=reduction),
            [x, t, v])


def test_gaussian_nll_loss_float_var_and_refusals():
    x, t = arr(4, 3), arr(4, 3, seed=1)
    compare(lambda a, b: F.gaussian_nll_loss(a, b, 0.7), lambda a, b: TF.gaussian_nll_loss(a, b, 0.7), [x, t])
    compare(lambda a, b, c: F.gaussian_nll_loss(a, b, c), lambda a, b, c: TF.gaussian_nll_loss(a, b, c),
            [arr(2, 3, 4), arr(2, 3, 4, seed=3), arr(2, 1, 4, low=0.5, high=1.0)])
    kx = kiln.tensor(x)
    # an integer var, a number or a tensor, is refused, as torch's
    tx = torch.from_numpy(x)
    for kv, tv in ((2, 2), (True, True), (kiln.tensor(np.full((4, 3), 2)), torch.full((4, 3), 2))):
        with pytest.raises((TypeError, RuntimeError)):
            TF.gaussian_nll_loss(tx, tx * 0.5, tv)
        with pytest.raises(ValueError, match="gaussian_nll_loss: var must be a floating-point tensor"):
            F.gaussian_nll_loss(kx, kx * 0.5, kv)
    with pytest.raises(ValueError, match="var is of incorrect size"):
        F.gaussian_nll_loss(kx, kx, kiln.ones(3, 3, dtype=kiln.float64))
    with pytest.raises(ValueError, match="var has negative entry"):
        F.gaussian_nll_loss(kx, kx, -kiln.ones(4, 3, dtype=kiln.float64))
    with pytest.raises(ValueError, match="var has negative entry"):
        F.gaussian_nll_loss(kx, kx, -1.0)
    with pytest.raises(ValueError, match="bad is not a valid value for reduction"):
        F.gaussian_nll_loss(kx, kx, 1.0, reduction="bad")


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("log_input,full", [(True, False), (True, True), (False, False), (False, True)])
def test_poisson_nll_loss_matches_torch(reduction, log_input, full):
    x = arr(5, 4) if log_input else arr(5, 4, low=0.1, high=3.0)
    t = np.random.default_rng(3).poisson(2.0, (5, 4)).astype(np.float64) + 0.5  # > 0: torch's target grad is finite
    kw = dict(log_input=log_input, full=full, eps=1e-4, reduction=reduction)
    compare(lambda a, b: F.poisson_nll_loss(a, b, **kw), lambda a, b: TF.poisson_nll_loss(a, b, **kw), [x, t])
    compare(nn.PoissonNLLLoss(log_input, full, eps=1e-4, reduction=reduction),
            tnn.PoissonNLLLoss(log_input, full, eps=1e-4, reduction=reduction), [x, t])


def test_poisson_nll_loss_full_at_zero_target_and_refusals():
    x, t = arr(6), np.array([0.0, 1.0, 0.5, 2.0, 3.0, 0.0])
    compare(lambda a, b: F.poisson_nll_loss(a, b, full=True), lambda a, b: TF.poisson_nll_loss(a, b, full=True),
            [x, t], grad=False)
    kx, kt = both(x, True)[0], kiln.tensor(t)
    F.poisson_nll_loss(kx, kt, full=True).backward()
    tx = torch.from_numpy(x).requires_grad_(True)
    TF.poisson_nll_loss(tx, torch.from_numpy(t), full=True).backward()
    np.testing.assert_allclose(np.asarray(kx.grad), tx.grad.numpy(), rtol=1e-12)
    with pytest.raises(ValueError, match="x is not a valid value for reduction"):
        F.poisson_nll_loss(kx, kt, reduction="x")
    with pytest.raises(ValueError, match="not a valid value for reduction"):
        nn.PoissonNLLLoss(reduction="x")


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("margin", [1.0, 0.3])
def test_hinge_embedding_and_soft_margin_losses_match_torch(reduction, margin):
    x = arr(4, 5) * 2
    y = np.where(arr(4, 5, seed=1) > 0, 1.0, -1.0)
    compare(lambda a, b: F.hinge_embedding_loss(a, b, margin, reduction=reduction),
            lambda a, b: TF.hinge_embedding_loss(a, b, margin, reduction=reduction), [x, y])
    compare(nn.HingeEmbeddingLoss(margin, reduction=reduction), tnn.HingeEmbeddingLoss(margin, reduction=reduction),
            [x, y])
    compare(lambda a, b: F.soft_margin_loss(a, b, reduction=reduction),
            lambda a, b: TF.soft_margin_loss(a, b, reduction=reduction), [x, y], nograd=(1,))
    compare(nn.SoftMarginLoss(reduction=reduction), tnn.SoftMarginLoss(reduction=reduction), [x, arr(4, 5, seed=2)],
            nograd=(1,))  # (torch's soft_margin_loss has no gradient for the target)
    # a target of another (broadcastable) shape, as torch
    compare(lambda a, b: F.soft_margin_loss(a, b), lambda a, b: TF.soft_margin_loss(a, b), [x, y[0]], nograd=(1,))
    compare(lambda a, b: F.hinge_embedding_loss(a, b), lambda a, b: TF.hinge_embedding_loss(a, b), [x, y[0]])


def test_hinge_and_soft_margin_refusals():
    kx = kiln.tensor(arr(3, 4))
    with pytest.raises(ValueError, match="target of size \\[5\\] do not broadcast"):
        F.hinge_embedding_loss(kx, kiln.ones(5, dtype=kiln.float64))
    with pytest.raises(ValueError, match="bad is not a valid value for reduction"):
        F.soft_margin_loss(kx, kx, reduction="bad")
    with pytest.raises(RuntimeError, match="size_average and reduce"):
        F.soft_margin_loss(kx, kx, size_average=True)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("weighted", [False, True])
def test_multilabel_soft_margin_loss_matches_torch(reduction, weighted):
    x, y = arr(4, 5), (arr(4, 5, seed=1) > 0).astype(np.float64)
    arrays = [x, y] + ([arr(5, seed=2, low=0.2, high=2.0)] if weighted else [])
    compare(lambda a, b, *w: F.multilabel_soft_margin_loss(a, b, *w, reduction=reduction),
            lambda a, b, *w: TF.multilabel_soft_margin_loss(a, b, *w, reduction=reduction), arrays)
    # unbatched [C]
    compare(lambda a, b: F.multilabel_soft_margin_loss(a, b, reduction=reduction),
            lambda a, b: TF.multilabel_soft_margin_loss(a, b, reduction=reduction), [x[0], y[0]])
    if weighted:
        w = arrays[2]
        km = nn.MultiLabelSoftMarginLoss(kiln.tensor(w), reduction=reduction)
        assert list(km.state_dict()) == ["weight"]
        compare(km, tnn.MultiLabelSoftMarginLoss(torch.from_numpy(w), reduction=reduction), [x, y])
        with pytest.raises(ValueError, match="the loss of size \\[4, 5\\] and weight of size \\[2, 5\\] do not "
                                             "broadcast"):
            F.multilabel_soft_margin_loss(kiln.tensor(x), kiln.tensor(y), kiln.ones(2, 5, dtype=kiln.float64))
        # a weight wider than the input widens the loss, as torch's (summed over input's class dim)
        compare(lambda a, b, c: F.multilabel_soft_margin_loss(a, b, c, reduction=reduction),
                lambda a, b, c: TF.multilabel_soft_margin_loss(a, b, c, reduction=reduction),
                [x, y, arr(3, 4, 5, seed=4, low=0.2, high=2.0)])
        compare(lambda a, b, c: F.multilabel_soft_margin_loss(a, b, c, reduction=reduction),
                lambda a, b, c: TF.multilabel_soft_margin_loss(a, b, c, reduction=reduction),
                [x[0], y[0], arr(2, 5, seed=5, low=0.2, high=2.0)])


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("p,margin,weighted", [(1, 1.0, False), (2, 1.0, False), (1, 0.4, True), (2, 2.0, True)])
def test_multi_margin_loss_matches_torch(reduction, p, margin, weighted):
    x, t = arr(6, 4), np.array([0, 3, 1, 1, 2, 3])
    kw = dict(p=p, margin=margin, reduction=reduction)
    if weighted:
        w = arr(4, seed=3, low=0.3, high=2.0)
        kw_k, kw_t = dict(kw, weight=kiln.tensor(w)), dict(kw, weight=torch.from_numpy(w))
    else:
        kw_k = kw_t = kw
    compare(lambda a, b: F.multi_margin_loss(a, b, **kw_k), lambda a, b: TF.multi_margin_loss(a, b, **kw_t), [x, t])
    compare(nn.MultiMarginLoss(**kw_k), tnn.MultiMarginLoss(**kw_t), [x, t])
    # unbatched: [C] with a 0-D or a [1] target
    compare(lambda a, b: F.multi_margin_loss(a, b, **kw_k), lambda a, b: TF.multi_margin_loss(a, b, **kw_t),
            [x[1], t[1]])
    compare(lambda a, b: F.multi_margin_loss(a, b, **kw_k), lambda a, b: TF.multi_margin_loss(a, b, **kw_t),
            [x[1], t[1:2]])


def test_multi_margin_loss_refusals():
    kx = kiln.tensor(arr(3, 4))
    t = kiln.tensor(np.array([0, 1, 2]))
    for bad, match in ((dict(target=kiln.tensor(np.array([0, 1, 4]))), "target 4 is out of range for 4 classes"),
                       (dict(target=kiln.tensor(np.array([0, 1]))),
                        "target should be 1-D .* got target of size \\[2\\]"),
                       (dict(target=kiln.tensor(np.array([0.0, 1, 2]))), "target must hold int64 class indices"),
                       (dict(target=kiln.tensor(np.array([0, 1, 2], dtype=np.int32))),
                        "target must hold int64 class indices, got int32"),
                       (dict(weight=kiln.ones(3, dtype=kiln.float64)), "weight must have one entry per class \\(4\\)"),
                       (dict(weight=kiln.ones(2, 2, dtype=kiln.float64)), "weight must be one-dimensional"),
                       (dict(p=3), "only p == 1 and p == 2"),
                       (dict(input=kiln.tensor(arr(2, 3, 4))), "non-empty vector or matrix")):
        args = dict(input=kx, target=t)
        args.update(bad)
        with pytest.raises(ValueError, match=match):
            F.multi_margin_loss(**args)
    with pytest.raises(ValueError, match="expected weight to be None or 1D tensor, got 2D"):
        nn.MultiMarginLoss(weight=kiln.ones(2, 2))


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_multilabel_margin_loss_matches_torch(reduction):
    x = arr(4, 5)
    t = np.array([[3, 0, -1, 1, 4], [0, 1, 2, 4, -1], [2, 2, -1, -1, -1], [-1, 0, 0, 0, 0]])  # a repeat counts twice
    compare(lambda a, b: F.multilabel_margin_loss(a, b, reduction=reduction),
            lambda a, b: TF.multilabel_margin_loss(a, b, reduction=reduction), [x, t])
    compare(nn.MultiLabelMarginLoss(reduction=reduction), tnn.MultiLabelMarginLoss(reduction=reduction), [x, t])
    compare(lambda a, b: F.multilabel_margin_loss(a, b, reduction=reduction),
            lambda a, b: TF.multilabel_margin_loss(a, b, reduction=reduction), [x[1], t[1]])


def test_multilabel_margin_loss_refusals():
    kx = kiln.tensor(arr(3, 4))
    with pytest.raises(ValueError, match="inconsistent target size \\[3\\] for input of size \\[3, 4\\]"):
        F.multilabel_margin_loss(kx, kiln.tensor(np.array([0, 1, 2])))
    with pytest.raises(ValueError, match="target 5 is out of range"):
        F.multilabel_margin_loss(kx, kiln.tensor(np.array([[0, 1, 5, -1]] * 3)))
    with pytest.raises(ValueError, match="target -2 is out of range"):
        F.multilabel_margin_loss(kx, kiln.tensor(np.array([[0, 1, -2, -1]] * 3)))
    with pytest.raises(ValueError, match="int64 class indices"):
        F.multilabel_margin_loss(kx, kiln.zeros(3, 4, dtype=kiln.float64))
    # int32 targets: torch's kernels take int64 only
    t32 = np.array([[0, 1, -1, 0]] * 3, dtype=np.int32)
    with pytest.raises(RuntimeError, match="expected scalar type Long"):
        TF.multilabel_margin_loss(torch.from_numpy(arr(3, 4)), torch.from_numpy(t32))
    with pytest.raises(ValueError, match="target must hold int64 class indices, got int32"):
        F.multilabel_margin_loss(kx, kiln.tensor(t32))


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("p", [1, 2])
def test_margin_losses_skip_nan_terms_as_torch(reduction, p):
    # torch's kernels add a term only if it is > 0: a NaN logit's terms add nothing (and no gradient)
    x = np.array([[1.0, 2.0, np.nan], [0.3, np.nan, -0.2], [np.nan, 0.5, 0.1]])
    t = np.array([0, 2, 0])  # row 2's own logit is NaN: every term is NaN, its loss 0
    compare(lambda a, b: F.multi_margin_loss(a, b, p=p, reduction=reduction),
            lambda a, b: TF.multi_margin_loss(a, b, p=p, reduction=reduction), [x, t], tol=1e-12)
    loss = F.multi_margin_loss(kiln.tensor(x[:1]), kiln.tensor(t[:1]), p=p)
    assert abs(float(loss) - (2 / 3 if p == 1 else 4 / 3)) < 1e-12
    tm = np.array([[0, -1, 0], [2, 0, -1], [0, 2, -1]])
    compare(lambda a, b: F.multilabel_margin_loss(a, b, reduction=reduction),
            lambda a, b: TF.multilabel_margin_loss(a, b, reduction=reduction), [x, tm], tol=1e-12)


def test_multilabel_margin_loss_with_many_classes_and_uneven_target_counts():
    # one row with many targets (k_max 40), one with none, repeats: the [N, k_max, C] terms as torch's
    g = np.random.default_rng(12)
    x = g.standard_normal((5, 300))
    t = np.full((5, 300), -1)
    t[0, :3] = [7, 7, 299]
    t[1, :40] = g.integers(0, 300, 40)
    t[3, :1] = [0]
    t[4, 2] = 5  # after the first -1: not a target
    compare(lambda a, b: F.multilabel_margin_loss(a, b, reduction="none"),
            lambda a, b: TF.multilabel_margin_loss(a, b, reduction="none"), [x, t], tol=1e-12)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("p,eps,swap,margin", [(2, 1e-6, False, 1.0), (1, 1e-3, True, 0.5), (3.0, 0.0, True, 2.0),
                                               (2, 1e-6, True, 1.5)])
def test_triplet_margin_loss_matches_torch(reduction, p, eps, swap, margin):
    a, pos, neg = arr(6, 5), arr(6, 5, seed=1), arr(6, 5, seed=2) * 0.7
    kw = dict(margin=margin, p=p, eps=eps, swap=swap, reduction=reduction)
    compare(lambda *x: F.triplet_margin_loss(*x, **kw), lambda *x: TF.triplet_margin_loss(*x, **kw), [a, pos, neg])
    compare(nn.TripletMarginLoss(**kw), tnn.TripletMarginLoss(**kw), [a, pos, neg])
    compare(lambda *x: F.triplet_margin_loss(*x, **kw), lambda *x: TF.triplet_margin_loss(*x, **kw),
            [a[0], pos[0], neg[0]])


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("swap", [False, True])
def test_triplet_margin_with_distance_loss_matches_torch(reduction, swap):
    a, pos, neg = arr(6, 5), arr(6, 5, seed=1), arr(6, 5, seed=2) * 0.7
    cosine = (lambda x, y: 1 - F.cosine_similarity(x, y), lambda x, y: 1 - TF.cosine_similarity(x, y))
    for kd, td in ((None, None), cosine):
        compare(lambda *x: F.triplet_margin_with_distance_loss(*x, distance_function=kd, margin=0.8, swap=swap,
                                                               reduction=reduction),
                lambda *x: TF.triplet_margin_with_distance_loss(*x, distance_function=td, margin=0.8, swap=swap,
                                                                reduction=reduction), [a, pos, neg])
        compare(nn.TripletMarginWithDistanceLoss(distance_function=kd, margin=0.8, swap=swap, reduction=reduction),
                tnn.TripletMarginWithDistanceLoss(distance_function=td, margin=0.8, swap=swap, reduction=reduction),
                [a, pos, neg])


def test_triplet_refusals():
    a, b = kiln.tensor(arr(3, 4)), kiln.tensor(arr(4))
    with pytest.raises(ValueError, match="same number of dimensions, but got: anchor 2D, positive 2D, and negative 1D"):
        F.triplet_margin_loss(a, a, b)
    with pytest.raises(ValueError, match="same number of dimensions"):
        F.triplet_margin_with_distance_loss(a, b, a)
    with pytest.raises(ValueError, match="margin must be greater than 0, got 0"):
        F.triplet_margin_loss(a, a, a, margin=0)
    with pytest.raises(ValueError, match="margin must be greater than 0, got -1"):
        F.triplet_margin_with_distance_loss(a, a, a, margin=-1)
    with pytest.raises(ValueError, match="expected margin to be greater than 0, got 0 instead"):
        nn.TripletMarginLoss(margin=0)
    with pytest.raises(ValueError, match="expected margin to be greater than 0"):
        nn.TripletMarginWithDistanceLoss(margin=0)
    with pytest.raises(ValueError, match="x is not a valid value for reduction"):
        F.triplet_margin_loss(a, a, a, reduction="x")
    with pytest.raises(ValueError, match="distance_function must be callable"):
        F.triplet_margin_with_distance_loss(a, a, a, distance_function=3)


def test_every_new_name_is_in_kiln_nn():
    for name in ("hardshrink", "softshrink", "tanhshrink", "threshold", "threshold_", "rrelu", "rrelu_", "relu_",
                 "elu_", "selu_", "celu_", "leaky_relu_", "hardtanh_", "alpha_dropout", "feature_alpha_dropout",
                 "pdist", "gaussian_nll_loss", "poisson_nll_loss", "hinge_embedding_loss", "soft_margin_loss",
                 "multilabel_soft_margin_loss", "multi_margin_loss", "multilabel_margin_loss", "triplet_margin_loss",
                 "triplet_margin_with_distance_loss"):
        assert callable(getattr(F, name)) and hasattr(TF, name), name
    for name in ("Hardshrink", "Softshrink", "Tanhshrink", "Threshold", "RReLU", "AlphaDropout", "FeatureAlphaDropout",
                 "Softmax2d", "CosineSimilarity", "PairwiseDistance", "GaussianNLLLoss", "PoissonNLLLoss",
                 "HingeEmbeddingLoss", "SoftMarginLoss", "MultiLabelSoftMarginLoss", "MultiLabelMarginLoss",
                 "MultiMarginLoss", "TripletMarginLoss", "TripletMarginWithDistanceLoss"):
        assert issubclass(getattr(nn, name), nn.Module) and hasattr(tnn, name), name
