# kiln.nn's Transformer family, Bilinear, EmbeddingBag, gumbel_softmax, fold / unfold, grid_sample /
# affine_grid, weight / spectral norm (both APIs) and kiln.utils.checkpoint against torch, from the
# same weights: outputs, gradients, state_dict keys, loading torch's state_dict, Adam steps, refusals.
import os
import subprocess
import sys

import numpy as np
import pytest

import kiln
from kiln import nn
from kiln.nn import functional as F

torch = pytest.importorskip("torch")
tnn, TF = torch.nn, torch.nn.functional


def k(a, grad=False):
    t = kiln.tensor(a.detach().numpy() if isinstance(a, torch.Tensor) else a)
    return t.requires_grad_(True) if grad else t


def close(kt, tt, tol=1e-5):
    if kt is None:  # no gradient reached it: torch's zeros
        kt = np.zeros(tuple(tt.shape), np.float32)
    np.testing.assert_allclose(np.asarray(kt), tt.detach().numpy(), rtol=tol, atol=tol)


def load_torch(km, tm):
    """Loads torch module tm's state_dict into kiln module km (strict: torch's names and shapes)."""
    assert list(km.state_dict()) == list(tm.state_dict())
    km.load_state_dict({n: k(v) for n, v in tm.state_dict().items()})
    return km


def rnd(*shape, seed=0):
    return torch.from_numpy(np.random.default_rng(seed + 7 * len(shape)).standard_normal(shape).astype(np.float32))


def check_grads(km, tm, tol=1e-4):
    kp, tp = dict(km.named_parameters()), dict(tm.named_parameters())
    assert list(kp) == list(tp)
    for name in tp:
        close(kp[name].grad, tp[name].grad, tol)


# ---- Transformer ----
@pytest.mark.filterwarnings("ignore:enable_nested_tensor is True")
@pytest.mark.parametrize("norm_first,activation,batch_first", [(False, "relu", False), (True, "gelu", True),
                                                                (False, "gelu", True)])
def test_transformer_matches_torch(norm_first, activation, batch_first):
    torch.manual_seed(0)
    tm = tnn.Transformer(16, 4, 2, 2, 32, dropout=0.0, activation=activation, batch_first=batch_first,
                         norm_first=norm_first)
    km = load_torch(nn.Transformer(16, 4, 2, 2, 32, dropout=0.0, activation=activation, batch_first=batch_first,
                                   norm_first=norm_first), tm)
    shape = (lambda n, s: (n, s, 16) if batch_first else (s, n, 16))
    src, tgt = rnd(*shape(3, 5)), rnd(*shape(3, 4), seed=1)
    tgt_mask = tnn.Transformer.generate_square_subsequent_mask(4)
    close(nn.Transformer.generate_square_subsequent_mask(4), tgt_mask)
    kpm = torch.tensor([[False] * 5, [False] * 4 + [True], [False] * 3 + [True] * 2])
    mem_mask = torch.rand(4, 5, generator=torch.Generator().manual_seed(0)) > 0.6
    mem_mask[:, 0] = False
    for kwargs in ({}, {"tgt_mask": tgt_mask, "tgt_is_causal": True},
                   {"tgt_mask": tgt_mask, "src_key_padding_mask": kpm, "memory_key_padding_mask": kpm},
                   {"memory_mask": mem_mask, "tgt_key_padding_mask": kpm[:, :4]}):
        ts, tt = src.clone().requires_grad_(True), tgt.clone().requires_grad_(True)
        ks, kt = k(src, True), k(tgt, True)
        tm.zero_grad()
        km.zero_grad()
        to = tm(ts, tt, **kwargs)
        ko = km(ks, kt, **{n: k(v) if isinstance(v, torch.Tensor) else v for n, v in kwargs.items()})
        close(ko, to, 1e-4)
        g = rnd(*to.shape, seed=5)
        to.backward(g)
        ko.backward(k(g))
        close(ks.grad, ts.grad, 1e-4)
        close(kt.grad, tt.grad, 1e-4)
        check_grads(km, tm)


def test_transformer_layers_and_stacks_match_torch():
    torch.manual_seed(1)
    for bias in (True, False):
        tl = tnn.TransformerDecoderLayer(8, 2, 16, dropout=0.0, bias=bias)
        kl = load_torch(nn.TransformerDecoderLayer(8, 2, 16, dropout=0.0, bias=bias), tl)
        tgt, mem = rnd(4, 2, 8), rnd(6, 2, 8, seed=1)
        close(kl(k(tgt), k(mem)), tl(tgt, mem))
        td = tnn.TransformerDecoder(tl, 3, norm=tnn.LayerNorm(8, bias=bias))
        kd = load_torch(nn.TransformerDecoder(kl, 3, norm=nn.LayerNorm(8, bias=bias)), td)
        mask = tnn.Transformer.generate_square_subsequent_mask(4)
        close(kd(k(tgt), k(mem), tgt_mask=k(mask)), td(tgt, mem, tgt_mask=mask))
    # an encoder stack with a callable activation; torch's nested-tensor fast path is off (it would
    # give 0 at padded positions in eval mode)
    te_layer = tnn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, activation=TF.gelu, batch_first=True)
    ke_layer = load_torch(nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, activation=F.gelu, batch_first=True),
                          te_layer)
    te = tnn.TransformerEncoder(te_layer, 2, enable_nested_tensor=False)
    ke = load_torch(nn.TransformerEncoder(ke_layer, 2), te)
    x = rnd(2, 5, 8)
    kpm = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    te.eval()
    ke.eval()
    close(ke(k(x), src_key_padding_mask=k(kpm)), te(x, src_key_padding_mask=kpm))
    # unbatched
    close(ke(k(x[0])), te(x[0]))


@pytest.mark.filterwarnings("ignore:enable_nested_tensor is True")
def test_transformer_trains_like_torch_with_adam():
    torch.manual_seed(2)
    tm = tnn.Transformer(8, 2, 1, 1, 16, dropout=0.0, batch_first=True)
    km = load_torch(nn.Transformer(8, 2, 1, 1, 16, dropout=0.0, batch_first=True), tm)
    topt = torch.optim.Adam(tm.parameters(), lr=1e-2)
    kopt = kiln.optim.Adam(km.parameters(), lr=1e-2)
    src, tgt, y = rnd(2, 5, 8), rnd(2, 4, 8, seed=1), rnd(2, 4, 8, seed=2)
    mask = tnn.Transformer.generate_square_subsequent_mask(4)
    for _ in range(4):
        topt.zero_grad()
        kopt.zero_grad()
        tl = TF.mse_loss(tm(src, tgt, tgt_mask=mask), y)
        kl = F.mse_loss(km(k(src), k(tgt), tgt_mask=k(mask)), k(y))
        tl.backward()
        kl.backward()
        topt.step()
        kopt.step()
        assert abs(kl.item() - tl.item()) < 1e-4


def test_transformer_init_and_refusals():
    km = nn.Transformer(8, 2, 1, 1, 16)
    w = np.asarray(km.encoder.layers[0].linear1.weight)  # xavier-uniform: bound sqrt(6 / (8 + 16))
    assert np.abs(w).max() <= np.sqrt(6 / 24) + 1e-6
    assert w.shape == (16, 8)
    with pytest.raises(ValueError, match="activation should be relu/gelu, not tanh"):
        nn.TransformerEncoderLayer(8, 2, activation="tanh")
    with pytest.raises(ValueError, match="feature number of src"):
        km(kiln.randn(3, 2, 8), kiln.randn(3, 2, 6))
    with pytest.raises(ValueError, match="batch number of src"):
        km(kiln.randn(3, 2, 8), kiln.randn(3, 4, 8))
    with pytest.raises(ValueError, match="is_causal needs attn_mask"):
        km.decoder.layers[0](kiln.randn(3, 2, 8), kiln.randn(3, 2, 8), tgt_is_causal=True)


# ---- Bilinear ----
def test_bilinear_matches_torch():
    torch.manual_seed(3)
    for bias in (True, False):
        tm = tnn.Bilinear(3, 4, 5, bias=bias)
        km = load_torch(nn.Bilinear(3, 4, 5, bias=bias), tm)
        x1, x2 = rnd(2, 6, 3).requires_grad_(True), rnd(2, 6, 4, seed=1).requires_grad_(True)
        k1, k2 = k(x1, True), k(x2, True)
        to, ko = tm(x1, x2), km(k1, k2)
        close(ko, to)
        to.sum().backward()
        ko.sum().backward()
        close(k1.grad, x1.grad)
        close(k2.grad, x2.grad)
        check_grads(km, tm)
    w = np.asarray(nn.Bilinear(4, 2, 3).weight)
    assert np.abs(w).max() <= 0.5 and w.shape == (3, 4, 2)
    with pytest.raises(ValueError, match="bilinear: input1's last dimension"):
        F.bilinear(kiln.randn(2, 4), kiln.randn(2, 4), kiln.randn(5, 3, 4))


# ---- EmbeddingBag ----
@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("padding_idx", [None, 2])
def test_embedding_bag_matches_torch(mode, padding_idx):
    torch.manual_seed(4)
    tm = tnn.EmbeddingBag(10, 3, mode=mode, padding_idx=padding_idx)
    km = load_torch(nn.EmbeddingBag(10, 3, mode=mode, padding_idx=padding_idx), tm)
    inp, off = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9, 2]), torch.tensor([0, 2, 2, 5])  # bag 1 is empty
    for args in ((inp, off), (torch.tensor([[1, 2, 3], [4, 2, 2]]),)):
        tm.zero_grad()
        km.zero_grad()
        to, ko = tm(*args), km(*[k(a) for a in args])
        close(ko, to)
        g = rnd(*to.shape, seed=6)
        to.backward(g)
        ko.backward(k(g))
        close(km.weight.grad, tm.weight.grad)
    last = torch.tensor([0, 2, 2, 5, 9])
    close(F.embedding_bag(k(inp), km.weight, k(last), mode=mode, include_last_offset=True, padding_idx=padding_idx),
          TF.embedding_bag(inp, tm.weight, last, mode=mode, include_last_offset=True, padding_idx=padding_idx))


def test_embedding_bag_per_sample_weights_and_refusals():
    w = rnd(10, 3).requires_grad_(True)
    kw = k(w, True)
    inp, off, psw = torch.tensor([1, 2, 4, 5, 4, 3]), torch.tensor([0, 2, 3]), rnd(6, seed=2).requires_grad_(True)
    kpsw = k(psw, True)
    to = TF.embedding_bag(inp, w, off, mode="sum", per_sample_weights=psw)
    ko = F.embedding_bag(k(inp), kw, k(off), mode="sum", per_sample_weights=kpsw)
    close(ko, to)
    to.sum().backward()
    ko.sum().backward()
    close(kw.grad, w.grad)
    close(kpsw.grad, psw.grad)
    with pytest.raises(ValueError, match="per_sample_weights is only supported for mode='sum'"):
        F.embedding_bag(k(inp), kw, k(off), mode="mean", per_sample_weights=kpsw)
    with pytest.raises(ValueError, match="offsets\\[0\\] has to be 0"):
        F.embedding_bag(k(inp), kw, kiln.tensor([1, 3]))
    with pytest.raises(ValueError, match="offsets is needed when input is 1-D"):
        F.embedding_bag(k(inp), kw)
    with pytest.raises(ValueError, match="mode must be 'sum', 'mean' or 'max'"):
        nn.EmbeddingBag(4, 2, mode="median")
    with pytest.raises(ValueError, match="index 10 is out of range"):
        F.embedding_bag(kiln.tensor([[1, 10]]), kw)


# ---- gumbel_softmax ----
@pytest.mark.parametrize("hard", [False, True])
def test_gumbel_softmax_is_torch_formula_with_straight_through_gradient(hard):
    logits = rnd(4, 5)
    kl = k(logits, True)
    kiln.manual_seed(11)
    ko = F.gumbel_softmax(kl, tau=0.5, hard=hard, dim=-1)
    kiln.manual_seed(11)
    gumbels = -kiln.empty_like(kl).exponential_().log()  # the draw gumbel_softmax made
    # torch's formula with the same noise
    tl = logits.clone().requires_grad_(True)
    y_soft = ((tl + torch.from_numpy(np.asarray(gumbels))) / 0.5).softmax(-1)
    if hard:
        y_hard = torch.zeros_like(y_soft).scatter_(-1, y_soft.argmax(-1, keepdim=True), 1.0)
        to = y_hard - y_soft.detach() + y_soft
        assert set(np.unique(np.asarray(ko))) <= {0.0, 1.0}
    else:
        to = y_soft
    close(ko, to)
    g = rnd(4, 5, seed=3)
    to.backward(g)
    ko.backward(k(g))
    close(kl.grad, tl.grad)
    np.testing.assert_allclose(np.asarray(ko).sum(-1), 1.0, rtol=1e-6)
    with pytest.raises(ValueError, match="tau must be > 0"):
        F.gumbel_softmax(kl, tau=0.0)


# ---- fold / unfold ----
@pytest.mark.parametrize("args", [(2, 1, 0, 1), ((3, 2), (1, 2), (1, 0), (2, 1)), (3, 2, 2, 3)])
def test_fold_unfold_match_torch(args):
    ks, dil, pad, st = args
    x = rnd(2, 3, 7, 8).requires_grad_(True)
    kx = k(x, True)
    tu, ku = TF.unfold(x, ks, dil, pad, st), nn.Unfold(ks, dil, pad, st)(kx)
    close(ku, tu)
    g = rnd(*tu.shape, seed=1)
    tu.backward(g)
    ku.backward(k(g))
    close(kx.grad, x.grad)
    y = rnd(*tu.shape, seed=2).requires_grad_(True)
    ky = k(y, True)
    tf, kf = TF.fold(y, (7, 8), ks, dil, pad, st), nn.Fold((7, 8), ks, dil, pad, st)(ky)
    close(kf, tf)
    g = rnd(*tf.shape, seed=3)
    tf.backward(g)
    kf.backward(k(g))
    close(ky.grad, y.grad)
    close(F.unfold(k(x[0]), ks, dil, pad, st), TF.unfold(x[0], ks, dil, pad, st))  # unbatched


def test_fold_refusals():
    with pytest.raises(ValueError, match="must be the number of sliding blocks"):
        F.fold(kiln.randn(1, 4, 5), (3, 3), 2)
    with pytest.raises(ValueError, match="divisible by the kernel's size"):
        F.fold(kiln.randn(1, 5, 4), (3, 3), 2)
    with pytest.raises(ValueError, match="unfold: input must be 3-D"):
        F.unfold(kiln.randn(4, 4), 2)


# ---- affine_grid / grid_sample ----
@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
def test_grid_sample_matches_torch(align_corners, mode, padding_mode):
    x = rnd(2, 3, 5, 6).requires_grad_(True)
    grid = (torch.rand(2, 4, 7, 2, generator=torch.Generator().manual_seed(1)) * 3 - 1.5).requires_grad_(True)
    kx, kg = k(x, True), k(grid, True)
    to = TF.grid_sample(x, grid, mode=mode, padding_mode=padding_mode, align_corners=align_corners)
    ko = F.grid_sample(kx, kg, mode=mode, padding_mode=padding_mode, align_corners=align_corners)
    close(ko, to)
    g = rnd(*to.shape, seed=4)
    to.backward(g)
    ko.backward(k(g))
    close(kx.grad, x.grad)
    close(kg.grad, grid.grad, 1e-4)


@pytest.mark.parametrize("align_corners", [False, True])
def test_affine_grid_matches_torch(align_corners):
    theta = rnd(2, 2, 3).requires_grad_(True)
    kt = k(theta, True)
    to, ko = TF.affine_grid(theta, (2, 3, 5, 6), align_corners=align_corners), \
        F.affine_grid(kt, (2, 3, 5, 6), align_corners=align_corners)
    close(ko, to)
    x = rnd(2, 3, 5, 6)
    ts = TF.grid_sample(x, to, align_corners=align_corners)
    ks = F.grid_sample(k(x), ko, align_corners=align_corners)
    close(ks, ts)
    ts.sum().backward()
    ks.sum().backward()
    close(kt.grad, theta.grad, 1e-4)
    with pytest.raises(ValueError, match="expected theta of shape"):
        F.affine_grid(kiln.randn(2, 3, 3), (2, 3, 5, 6))
    with pytest.raises(kiln.KilnError, match="bicubic' is not supported"):
        F.grid_sample(k(x), ko, mode="bicubic")


# ---- weight_norm / spectral_norm ----
@pytest.mark.parametrize("dim", [0, 1, None])
def test_parametrizations_weight_norm_matches_torch(dim):
    P = tnn.utils.parametrizations
    tm = P.weight_norm(tnn.Linear(4, 3), dim=dim)
    km = load_torch(nn.utils.parametrizations.weight_norm(nn.Linear(4, 3), dim=dim), tm)
    assert list(km.state_dict()) == ["bias", "parametrizations.weight.original0", "parametrizations.weight.original1"]
    x = rnd(2, 4)
    to, ko = tm(x), km(k(x))
    close(ko, to)
    close(km.weight, tm.weight)
    to.sum().backward()
    ko.sum().backward()
    check_grads(km, tm)
    topt, kopt = torch.optim.Adam(tm.parameters(), lr=0.05), kiln.optim.Adam(km.parameters(), lr=0.05)
    for _ in range(3):
        topt.zero_grad()
        kopt.zero_grad()
        tl, kl = (tm(x) ** 2).mean(), (km(k(x)) ** 2).mean()
        tl.backward()
        kl.backward()
        topt.step()
        kopt.step()
        assert abs(kl.item() - tl.item()) < 1e-5
    nn.utils.parametrize.remove_parametrizations(km, "weight")
    tnn.utils.parametrize.remove_parametrizations(tm, "weight")
    assert type(km) is nn.Linear and list(km.state_dict()) == list(tm.state_dict()) == ["bias", "weight"]
    close(km.weight, tm.weight)


def test_parametrizations_spectral_norm_matches_torch():
    torch.manual_seed(5)
    tm = tnn.utils.parametrizations.spectral_norm(tnn.Conv2d(3, 4, 3))
    km = load_torch(nn.utils.parametrizations.spectral_norm(nn.Conv2d(3, 4, 3)), tm)
    assert list(km.state_dict()) == ["bias", "parametrizations.weight.original", "parametrizations.weight.0._u",
                                     "parametrizations.weight.0._v"]
    x = rnd(2, 3, 5, 5)
    for _ in range(3):  # a power iteration per training forward
        to, ko = tm(x), km(k(x))
        close(ko, to, 1e-4)
    to.sum().backward()
    ko.sum().backward()
    check_grads(km, tm, 1e-3)
    close(km.parametrizations.weight[0]._u, tm.parametrizations.weight[0]._u)
    tm.eval()
    km.eval()
    close(km(k(x)), tm(x), 1e-4)
    with pytest.raises(ValueError, match="n_power_iterations to be positive"):
        nn.utils.parametrizations.spectral_norm(nn.Linear(3, 3), n_power_iterations=0)


def test_register_parametrization_custom_and_assignment():
    from kiln.nn.utils.parametrizations import weight_norm  # torch's import paths
    import kiln.nn.utils.parametrize as P
    assert weight_norm is nn.utils.parametrizations.weight_norm and P is nn.utils.parametrize

    class Symmetric(nn.Module):
        def forward(self, x):
            return x.triu() + x.triu(1).transpose(0, 1)

    m = nn.Linear(3, 3)
    nn.utils.parametrize.register_parametrization(m, "weight", Symmetric())
    w = np.asarray(m.weight)
    np.testing.assert_allclose(w, w.T)
    assert nn.utils.parametrize.is_parametrized(m, "weight") and not nn.utils.parametrize.is_parametrized(m, "bias")
    assert list(m.state_dict()) == ["bias", "parametrizations.weight.original"]
    with pytest.raises(ValueError, match="does not have a parameter, a buffer, or a parametrized element with name"):
        nn.utils.parametrize.register_parametrization(m, "nope", Symmetric())
    with pytest.raises(ValueError, match="has no right_inverse"):
        m.weight = kiln.zeros(3, 3)
    nn.utils.parametrize.remove_parametrizations(m, "weight", leave_parametrized=False)
    assert type(m) is nn.Linear


def test_legacy_weight_norm_and_spectral_norm_match_torch():
    U = tnn.utils
    with pytest.warns(FutureWarning):
        tm = U.weight_norm(tnn.Linear(4, 3))
    km = load_torch(nn.utils.weight_norm(nn.Linear(4, 3)), tm)
    assert list(km.state_dict()) == ["bias", "weight_g", "weight_v"]
    x = rnd(2, 4)
    to, ko = tm(x), km(k(x))
    close(ko, to)
    to.sum().backward()
    ko.sum().backward()
    check_grads(km, tm)
    U.remove_weight_norm(tm)
    nn.utils.remove_weight_norm(km)
    assert list(km.state_dict()) == ["bias", "weight"]
    close(km.weight, tm.weight)
    with pytest.raises(ValueError, match="weight_norm of 'weight' not found"):
        nn.utils.remove_weight_norm(km)

    tm = U.spectral_norm(tnn.Linear(5, 3))
    km = load_torch(nn.utils.spectral_norm(nn.Linear(5, 3)), tm)
    assert list(km.state_dict()) == ["bias", "weight_orig", "weight_u", "weight_v"]
    x = rnd(2, 5)
    for _ in range(3):
        to, ko = tm(x), km(k(x))
        close(ko, to)
    to.sum().backward()
    ko.sum().backward()
    check_grads(km, tm)
    with pytest.raises(kiln.KilnError, match="cannot register two"):
        nn.utils.spectral_norm(km)
    U.remove_spectral_norm(tm)
    nn.utils.remove_spectral_norm(km)
    close(km.weight, tm.weight)


# ---- kiln.utils.checkpoint ----
def _grads(m, x, run):
    m.zero_grad()
    kiln.manual_seed(3)
    xx = x.clone().requires_grad_(True)
    y = run(m, xx)
    (y * y).sum().backward()
    return [np.asarray(p.grad).copy() for p in m.parameters()] + [np.asarray(xx.grad), np.asarray(y.detach())]


def test_checkpoint_gradients_equal_the_plain_run_with_dropout():
    from kiln.utils.checkpoint import checkpoint, checkpoint_sequential
    kiln.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Dropout(0.5), nn.Linear(8, 8), nn.GELU(), nn.Dropout(0.3),
                      nn.Linear(8, 2))
    x = kiln.randn(5, 4)
    plain = _grads(m, x, lambda m, t: m(t))
    for run in (lambda m, t: checkpoint(m, t, use_reentrant=False),
                lambda m, t: checkpoint(m, t, use_reentrant=True, preserve_rng_state=True),
                lambda m, t: checkpoint_sequential(m, 3, t, use_reentrant=False)):
        for a, b in zip(plain, _grads(m, x, run)):
            np.testing.assert_array_equal(a, b)


def test_checkpoint_arguments_outputs_and_refusals():
    from kiln.utils.checkpoint import checkpoint
    x = kiln.randn(3).requires_grad_(True)
    out = checkpoint(lambda t, s, scale=1.0: (t * s * scale,), x, 2.0, scale=3.0, use_reentrant=False)
    assert isinstance(out, tuple) and len(out) == 1
    out[0].sum().backward()
    np.testing.assert_allclose(np.asarray(x.grad), 6.0)
    two = checkpoint(lambda t: [t * 2, t + 1], x, use_reentrant=False)
    assert isinstance(two, list) and len(two) == 2
    with pytest.raises(ValueError, match="output 1 is a int"):
        checkpoint(lambda t: (t, 1), x, use_reentrant=False)
    with pytest.raises(kiln.KilnError, match="context_fn is not supported"):
        checkpoint(lambda t: t, x, context_fn=lambda: None)


_MEMORY_SCRIPT = """
import os, sys
import kiln
from kiln.utils.checkpoint import checkpoint
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
x = kiln.randn(1024, 1024).requires_grad_(True)
def block(t):
    for _ in range(16):  # each tanh keeps its 4 MiB output for backward
        t = (t * 1.01).tanh()
    return t
before = rss()
y = checkpoint(block, x, use_reentrant=False) if sys.argv[1] == "ckpt" else block(x)
print((rss() - before) / 2**20)
y.sum().backward()
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads the resident size from /proc")
def test_checkpoint_drops_the_saved_activations():
    # Kiln has no memory statistic on the CPU: the process' resident size after the forward tells.
    # Without checkpointing the 16 tanh outputs (64 MiB) stay for backward; with it only the input.
    def grown(how):
        out = subprocess.run([sys.executable, "-c", _MEMORY_SCRIPT, how], capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 0, out.stderr
        return float(out.stdout.split()[-1])

    plain, ckpt = grown("plain"), grown("ckpt")
    assert plain > 48, plain
    assert ckpt < plain - 40, (plain, ckpt)


# ---- review fixes ----
@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [False, True])
def test_grid_sample_nan_and_inf_grid_points_match_torch(mode, padding_mode, align_corners):
    # a NaN (or, reflected, +-inf) coordinate made the gather index -2**63; torch samples as below
    x = rnd(1, 2, 3, 4).double()
    for bad in (float("nan"), float("inf"), -float("inf")):
        if padding_mode == "border" and bad != bad:
            continue  # torch's border clip of a NaN reads outside the input (its backward crashes)
        grid = torch.tensor([[[[bad, 0.2], [0.3, bad], [0.1, -0.4]]]], dtype=torch.float64)
        to = TF.grid_sample(x, grid, mode=mode, padding_mode=padding_mode, align_corners=align_corners)
        ko = F.grid_sample(k(x), k(grid), mode=mode, padding_mode=padding_mode, align_corners=align_corners)
        np.testing.assert_allclose(np.asarray(ko), to.numpy(), rtol=1e-12, atol=1e-12, err_msg=f"grid point {bad}")
    kx, kg = k(x, True), k(grid, True)  # the backward runs too
    F.grid_sample(kx, kg, mode=mode, padding_mode=padding_mode, align_corners=align_corners).sum().backward()
    assert kx.grad is not None


def test_grid_sample_dtypes_and_nearest_grid_gradient():
    x, grid = rnd(1, 2, 3, 4), rnd(1, 2, 2, 2, seed=1)
    refused = "expected input and grid to have the same dtype"
    with pytest.raises(ValueError, match=refused):
        F.grid_sample(k(x), k(grid.double()), align_corners=False)
    with pytest.raises(RuntimeError):
        TF.grid_sample(x, grid.double(), align_corners=False)
    tg, kg = grid.clone().requires_grad_(True), k(grid, True)
    TF.grid_sample(x, tg, mode="nearest", align_corners=False).sum().backward()
    F.grid_sample(k(x), kg, mode="nearest", align_corners=False).sum().backward()
    assert kg.grad is not None  # torch's zeros, not None
    np.testing.assert_array_equal(np.asarray(kg.grad), tg.grad.numpy())


def test_grid_sample_mixed_dtypes_under_autocast_run_in_float32_as_torch():
    # a spatial transformer under mixed precision: float32 image, bfloat16 grid
    x, theta = rnd(2, 3, 5, 6), rnd(2, 2, 3, seed=3) * 0.5
    grid = TF.affine_grid(theta, (2, 3, 4, 5), align_corners=False).to(torch.bfloat16)
    tx, tg = x.clone().requires_grad_(True), grid.clone().requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        to = TF.grid_sample(tx, tg, align_corners=False)
    assert to.dtype == torch.float32
    to.sum().backward()
    kx, kg = k(x, True), kiln.tensor(grid.float().numpy()).to(kiln.bfloat16).requires_grad_(True)
    with kiln.amp.autocast(kiln.bfloat16):
        ko = F.grid_sample(kx, kg, align_corners=False)
    assert ko.dtype == kiln.float32
    ko.sum().backward()
    close(ko, to)
    close(kx.grad, tx.grad)
    assert kg.grad.dtype == kiln.bfloat16
    close(kg.grad.float(), tg.grad.float(), tol=2e-2)
    with pytest.raises(ValueError, match="run under kiln.amp.autocast"):
        F.grid_sample(k(x), kiln.tensor(grid.float().numpy()).to(kiln.bfloat16), align_corners=False)


@pytest.mark.parametrize("align_corners", [False, True])
def test_affine_grid_float64_is_built_in_float64(align_corners):
    theta = rnd(2, 2, 3).double()
    to = TF.affine_grid(theta, (2, 1, 7, 9), align_corners=align_corners)
    ko = F.affine_grid(k(theta), (2, 1, 7, 9), align_corners=align_corners)
    assert ko.dtype == kiln.float64
    np.testing.assert_allclose(np.asarray(ko), to.numpy(), rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag_uneven_bags_match_torch(mode):
    # one long bag among short and empty ones: only the rows used are gathered (index_add / a segment
    # max by bag), values and weight gradients as torch's
    rng = np.random.default_rng(8)
    lengths = [1] * 30 + [0, 200] + [2] * 10 + [0]
    inp = torch.from_numpy(rng.integers(0, 50, sum(lengths)))
    off = torch.tensor(np.concatenate([[0], np.cumsum(lengths)[:-1]]))
    w = rnd(50, 6).requires_grad_(True)
    kw = k(w, True)
    for padding_idx in (None, 3):
        w.grad, kw.grad = None, None
        to = TF.embedding_bag(inp, w, off, mode=mode, padding_idx=padding_idx)
        ko = F.embedding_bag(k(inp), kw, k(off), mode=mode, padding_idx=padding_idx)
        close(ko, to)
        g = rnd(*to.shape, seed=9)
        to.backward(g)
        ko.backward(k(g))
        close(kw.grad, w.grad)
    psw = rnd(len(inp), seed=3)
    close(F.embedding_bag(k(inp), kw, k(off), mode="sum", per_sample_weights=k(psw)),
          TF.embedding_bag(inp, w, off, mode="sum", per_sample_weights=psw))


@pytest.mark.parametrize("padding_idx", [None, 0])
def test_embedding_bag_max_ties_give_the_gradient_to_one_element_as_torch(padding_idx):
    # rows 0, 1 and 3 tie in places: torch's gradient goes whole to the first tied element in bag
    # order, not split; empty bags give 0 and no gradient
    w = torch.tensor([[1., 2., 0.], [1., 2., 3.], [0., 5., 3.], [1., -1., 3.], [2., 2., 2.]], requires_grad=True)
    inp = torch.tensor([2, 0, 1, 3, 1, 0, 3, 3, 4, 0, 1])
    off = torch.tensor([0, 4, 4, 7, 9])  # bag 1 empty; bag 3 repeats row 3
    kw = k(w, True)
    to = TF.embedding_bag(inp, w, off, mode="max", padding_idx=padding_idx)
    ko = F.embedding_bag(k(inp), kw, k(off), mode="max", padding_idx=padding_idx)
    close(ko, to)
    g = rnd(*to.shape, seed=2)
    to.backward(g)
    ko.backward(k(g))
    np.testing.assert_allclose(np.asarray(kw.grad), w.grad.numpy(), rtol=1e-6, atol=1e-6)
    w.grad, kw.grad = None, None
    two_d = torch.tensor([[1, 0, 3], [3, 3, 1]])
    to, ko = TF.embedding_bag(two_d, w, mode="max"), F.embedding_bag(k(two_d), kw, mode="max")
    close(ko, to)
    to.sum().backward()
    ko.sum().backward()
    np.testing.assert_allclose(np.asarray(kw.grad), w.grad.numpy(), rtol=1e-6, atol=1e-6)


def test_embedding_bag_include_last_offset_must_end_at_the_input():
    w = rnd(10, 3)
    inp = torch.tensor([1, 2, 4, 5, 4, 3])
    with pytest.raises(ValueError, match=r"include_last_offset=True the last offset must equal input's length \(6"
                                         r".*Kiln refuses this because torch's result there is ill-defined"):
        F.embedding_bag(k(inp), k(w), kiln.tensor([0, 2, 4]), include_last_offset=True)
    close(F.embedding_bag(k(inp), k(w), kiln.tensor([0, 2, 6]), include_last_offset=True),
          TF.embedding_bag(inp, w, torch.tensor([0, 2, 6]), include_last_offset=True))


def test_transformer_xavier_fans_of_higher_dimensional_parameters():
    # torch's fans: fan_in = shape[1] * prod(shape[2:]), fan_out = shape[0] * prod(shape[2:])
    class Conv(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(kiln.zeros(4, 3, 5))

        def forward(self, x, mask=None, src_key_padding_mask=None, is_causal=None):
            return x

    km = nn.Transformer(8, 2, 1, 1, 16, custom_encoder=Conv())
    w = np.abs(np.asarray(km.encoder.weight))
    bound = np.sqrt(6 / (3 * 5 + 4 * 5))  # the old fans (15, 4) gave sqrt(6 / 19)
    assert w.max() <= bound + 1e-6 and w.max() > 0.8 * bound
