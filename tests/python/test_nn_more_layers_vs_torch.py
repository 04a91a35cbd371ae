# kiln.nn's padding modules, LP pooling, 3-d adaptive pooling, the *_with_indices pooling functions,
# MaxUnpool modules, conv_transpose3d / ConvTranspose3d, channel_shuffle, LocalResponseNorm, CrossMapLRN2d
# and the Upsampling*2d modules (kiln/nn/_more_layers.py) against torch in float64: values, gradients,
# shapes, reprs, state_dicts and refusals.
import warnings

import numpy as np
import pytest

import kiln
from kiln import nn
from kiln.nn import functional as F

torch = pytest.importorskip("torch")
tnn, TF = torch.nn, torch.nn.functional


def rnd(*shape, seed=0, positive=False):
    a = np.random.default_rng(seed + 11 * len(shape)).standard_normal(shape)
    return torch.from_numpy(np.abs(a) + 0.1 if positive else a)


def pair(t):
    """(kiln leaf, torch leaf) of the same float64 values, both requiring grad."""
    return kiln.tensor(t.numpy()).requires_grad_(True), t.clone().requires_grad_(True)


def close(kt, tt, tol=1e-10):
    np.testing.assert_allclose(np.asarray(kt.detach()), tt.detach().numpy(), rtol=tol, atol=tol)


def same_fwd_bwd(kfn, tfn, *inputs, seed=1):
    """kfn and tfn on the same inputs: equal outputs, and equal gradients of a random weighting of them."""
    kin, tin = zip(*(pair(t) for t in inputs))
    ky, ty = kfn(*kin), tfn(*tin)
    assert tuple(ky.shape) == tuple(ty.shape)
    close(ky, ty)
    g = rnd(*ty.shape, seed=seed)
    ty.backward(g)
    ky.backward(kiln.tensor(g.numpy()))
    for a, b in zip(kin, tin):
        close(a.grad, b.grad)
    return ky, ty


# ---- padding modules ----
_PADS = [("ZeroPad", ()), ("ConstantPad", (2.5,)), ("ReflectionPad", ()), ("ReplicationPad", ()),
         ("CircularPad", ())]


@pytest.mark.parametrize("kind,extra", _PADS)
@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("batched", [False, True])
def test_padding_modules_match_torch(kind, extra, n, batched):
    name = f"{kind}{n}d"
    padding = (2, 1, 0, 1, 1, 2)[:2 * n]
    shape = ((2,) if batched else ()) + (3,) + (4, 5, 3)[:n]
    km, tm = getattr(nn, name)(padding, *extra), getattr(tnn, name)(padding, *extra)
    assert repr(km) == repr(tm)
    same_fwd_bwd(km, tm, rnd(*shape))
    # an int pads every side
    ki, ti = getattr(nn, name)(1, *extra), getattr(tnn, name)(1, *extra)
    assert repr(ki) == repr(ti) and ki.padding == ti.padding
    same_fwd_bwd(ki, ti, rnd(*shape))
    assert ki.state_dict() == {} and tm.state_dict() == {}


@pytest.mark.parametrize("kind", ["ReflectionPad", "ReplicationPad", "CircularPad"])
def test_padding_modules_refuse_input_dims_as_torch(kind):
    for n, shape in ((1, (2, 2, 2, 3)), (2, (3, 3)), (3, (2, 3))):
        km, tm = getattr(nn, f"{kind}{n}d")(1), getattr(tnn, f"{kind}{n}d")(1)
        with pytest.raises((ValueError, NotImplementedError, RuntimeError)):
            tm(torch.zeros(shape))
        with pytest.raises(ValueError, match=f"{kind}{n}d: expected a {n + 1}D .* or {n + 2}D .*got {len(shape)}D"):
            km(kiln.zeros(*shape))


def test_padding_arguments_checked():
    with pytest.raises(ValueError, match=r"ZeroPad2d: padding must be an int or 4 ints, got \(1, 2\)"):
        nn.ZeroPad2d((1, 2))
    with pytest.raises(ValueError, match="ConstantPad1d: value must be a number"):
        nn.ConstantPad1d(1, "a")
    # constant padding takes any rank that has the dims to pad, as torch
    x = rnd(2, 2, 2, 3)
    close(nn.ConstantPad1d((1, 2), -1.0)(kiln.tensor(x.numpy())), tnn.ConstantPad1d((1, 2), -1.0)(x))
    # negative amounts crop, as torch's
    close(nn.ZeroPad2d((-1, 1, 0, -1))(kiln.tensor(x.numpy())), tnn.ZeroPad2d((-1, 1, 0, -1))(x))


# ---- LP pooling ----
@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("p", [1, 2, 1.5, 3, float("inf")])
def test_lp_pool_matches_torch(n, p):
    fk, ft = getattr(F, f"lp_pool{n}d"), getattr(TF, f"lp_pool{n}d")
    shape = (2, 3) + (7, 6, 5)[:n]
    x = rnd(*shape, positive=not float(p).is_integer())  # x^1.5 of a negative is NaN in both
    same_fwd_bwd(lambda t: fk(t, p, 2), lambda t: ft(t, p, 2), x)
    k = (3, 2, 2)[:n] if n > 1 else 3  # torch's lp_pool1d takes an int only
    s = (2, 1, 3)[:n] if n > 1 else 2
    same_fwd_bwd(lambda t: fk(t, p, k, s, True), lambda t: ft(t, p, k, s, True), x)
    same_fwd_bwd(lambda t: fk(t, p, 2), lambda t: ft(t, p, 2), x[0])  # unbatched
    km, tm = getattr(nn, f"LPPool{n}d")(p, 2, 1), getattr(tnn, f"LPPool{n}d")(p, 2, 1)
    assert repr(km) == repr(tm)
    same_fwd_bwd(km, tm, x)


def test_lp_pool_zero_window_has_zero_gradient_and_errors():
    x = torch.zeros(1, 1, 4, dtype=torch.float64)
    x[0, 0, 2:] = torch.tensor([1.0, 2.0])
    kx, tx = pair(x)
    ky, ty = F.lp_pool1d(kx, 2, 2), TF.lp_pool1d(tx, 2, 2)
    close(ky, ty)
    ky.sum().backward()
    ty.sum().backward()
    close(kx.grad, tx.grad)
    assert np.isfinite(np.asarray(kx.grad)).all()
    with pytest.raises(ValueError, match="lp_pool2d: norm_type must be a non-zero number, got 0"):
        F.lp_pool2d(kiln.zeros(1, 4, 4), 0, 2)
    with pytest.raises(ValueError, match=r"lp_pool2d: expected a 3D \(unbatched\) or 4D \(batched\) input, got 2D"):
        F.lp_pool2d(kiln.zeros(4, 4), 2, 2)


# ---- 3-d adaptive pooling, *_with_indices ----
@pytest.mark.parametrize("size", [2, (3, 2, 4), (1, None, 2), (5, 4, 3)])
def test_adaptive_pool3d_matches_torch(size):
    x = rnd(2, 3, 5, 7, 4)
    same_fwd_bwd(lambda t: F.adaptive_avg_pool3d(t, size), lambda t: TF.adaptive_avg_pool3d(t, size), x)
    same_fwd_bwd(lambda t: F.adaptive_max_pool3d(t, size), lambda t: TF.adaptive_max_pool3d(t, size), x)
    same_fwd_bwd(lambda t: F.adaptive_avg_pool3d(t, size), lambda t: TF.adaptive_avg_pool3d(t, size), x[0])
    kv, ki = F.adaptive_max_pool3d(kiln.tensor(x.numpy()), size, return_indices=True)
    tv, ti = TF.adaptive_max_pool3d(x, size, return_indices=True)
    close(kv, tv)
    np.testing.assert_array_equal(np.asarray(ki), ti.numpy())
    assert ki.dtype == kiln.int64
    for km, tm in ((nn.AdaptiveAvgPool3d(size), tnn.AdaptiveAvgPool3d(size)),
                   (nn.AdaptiveMaxPool3d(size), tnn.AdaptiveMaxPool3d(size))):
        assert repr(km) == repr(tm)
        same_fwd_bwd(km, tm, x)
    kv, ki = nn.AdaptiveMaxPool3d(size, return_indices=True)(kiln.tensor(x.numpy()))
    np.testing.assert_array_equal(np.asarray(ki), tnn.AdaptiveMaxPool3d(size, return_indices=True)(x)[1].numpy())


def test_adaptive_pool3d_errors():
    with pytest.raises(ValueError, match=r"adaptive_avg_pool3d: expected a 4-D or 5-D input"):
        F.adaptive_avg_pool3d(kiln.zeros(3, 4, 4), 2)
    with pytest.raises(ValueError, match="adaptive_max_pool3d: output_size must be an int or 3 ints"):
        F.adaptive_max_pool3d(kiln.zeros(1, 3, 4, 4), (2, 2))
    # a 0 output size is an empty result, as torch's
    assert tuple(F.adaptive_avg_pool3d(kiln.zeros(1, 2, 3, 4, 4), (0, 2, 2)).shape) == (1, 2, 0, 2, 2)


def test_with_indices_functions_match_torch():
    x = rnd(2, 3, 6, 5, 4)
    cases = [("max_pool1d_with_indices", x[:, :, 0, 0], (3,), dict(stride=2, padding=1)),
             ("max_pool2d_with_indices", x[:, :, 0], (2,), dict(stride=1, dilation=2, ceil_mode=True)),
             ("max_pool3d_with_indices", x, (2,), dict()),
             ("adaptive_max_pool1d_with_indices", x[:, :, 0, 0], (3,), dict()),
             ("adaptive_max_pool2d_with_indices", x[:, :, 0], ((3, 2),), dict()),
             ("adaptive_max_pool3d_with_indices", x, ((3, 2, 3),), dict())]
    for name, t, args, kw in cases:
        kv, ki = getattr(F, name)(kiln.tensor(t.numpy()), *args, **kw)
        tv, ti = getattr(TF, name)(t, *args, **kw)
        close(kv, tv)
        np.testing.assert_array_equal(np.asarray(ki), ti.numpy())


# ---- MaxUnpool modules ----
@pytest.mark.parametrize("n", [1, 2, 3])
def test_max_unpool_modules_match_torch(n):
    x = rnd(*((2, 3) + (6, 4, 6)[:n]))
    pool_t = getattr(tnn, f"MaxPool{n}d")(2, stride=2, return_indices=True)
    tv, ti = pool_t(x)
    km, tm = getattr(nn, f"MaxUnpool{n}d")(2), getattr(tnn, f"MaxUnpool{n}d")(2)
    assert repr(km) == repr(tm)
    kidx = kiln.tensor(ti.numpy())
    same_fwd_bwd(lambda v: km(v, kidx), lambda v: tm(v, ti), tv.detach())
    out = tuple(x.shape)  # an output_size (the pooled input's, one larger here) as torch takes it
    big = tuple(s + 1 for s in out[2:])
    same_fwd_bwd(lambda v: km(v, kidx, output_size=big), lambda v: tm(v, ti, output_size=big), tv.detach())
    full = out[:2] + big  # or the whole batched shape
    same_fwd_bwd(lambda v: km(v, kidx, output_size=full), lambda v: tm(v, ti, output_size=full), tv.detach())
    with pytest.raises(ValueError, match=f"MaxUnpool{n}d: output_size should have {n} or {n + 2} elements"):
        km(kiln.tensor(tv.detach().numpy()), kidx, output_size=(1,) * (n + 1))
    with pytest.raises(ValueError, match=f"MaxUnpool{n}d: kernel_size must be an int >= 1"):
        getattr(nn, f"MaxUnpool{n}d")(0)


# ---- conv_transpose3d ----
_CT3 = [dict(), dict(stride=2), dict(stride=(2, 1, 3), padding=(1, 0, 2), output_padding=(1, 0, 1), groups=2,
                                     dilation=(1, 2, 1)),
        dict(padding=(2, 1, 1), dilation=1), dict(stride=3, output_padding=2, dilation=2, padding=1)]


@pytest.mark.parametrize("kw", _CT3)
def test_conv_transpose3d_matches_torch(kw):
    g = kw.get("groups", 1)
    x, w, b = rnd(2, 4, 4, 5, 6), rnd(4, 6 // g, 2, 3, 2, seed=2), rnd(6, seed=3)
    same_fwd_bwd(lambda *t: F.conv_transpose3d(*t, **kw), lambda *t: TF.conv_transpose3d(*t, **kw), x, w, b)
    same_fwd_bwd(lambda *t: F.conv_transpose3d(*t, **kw), lambda *t: TF.conv_transpose3d(*t, **kw), x[0], w)


def test_conv_transpose3d_module_matches_torch():
    torch.manual_seed(0)
    tm = tnn.ConvTranspose3d(4, 6, (2, 3, 2), stride=2, padding=1, output_padding=1, groups=2, dtype=torch.float64)
    km = nn.ConvTranspose3d(4, 6, (2, 3, 2), stride=2, padding=1, output_padding=1, groups=2, dtype=kiln.float64)
    assert repr(km) == repr(tm)
    assert {n: tuple(v.shape) for n, v in km.state_dict().items()} == \
        {n: tuple(v.shape) for n, v in tm.state_dict().items()}
    km.load_state_dict({n: kiln.tensor(v.numpy()) for n, v in tm.state_dict().items()})
    x = rnd(2, 4, 3, 4, 3)
    same_fwd_bwd(km, tm, x)
    close(km.weight.grad, tm.weight.grad)
    close(km.bias.grad, tm.bias.grad)
    # forward's output_size picks the output_padding, as torch's
    kx = kiln.tensor(x.numpy())
    for size in ([5, 7, 5], [2, 6, 5, 7, 5]):
        close(km(kx, output_size=size), tm(x, output_size=size))


def test_conv_transpose3d_errors():
    x, w = kiln.zeros(1, 4, 2, 2, 2), kiln.zeros(4, 3, 2, 2, 2)
    with pytest.raises(ValueError, match="conv_transpose3d: output_padding .* must be smaller than either stride"):
        F.conv_transpose3d(x, w, output_padding=1)
    with pytest.raises(ValueError, match="conv_transpose3d: the input's 3 channels must be weight's dim 0"):
        F.conv_transpose3d(kiln.zeros(1, 3, 2, 2, 2), w)
    with pytest.raises(ValueError, match=r"conv_transpose3d: expected a 4D \(unbatched\) or 5D"):
        F.conv_transpose3d(kiln.zeros(4, 2, 2), w)
    with pytest.raises(ValueError, match="conv_transpose3d: bias must be 1-D of C_out = 3"):
        F.conv_transpose3d(x, w, kiln.zeros(4))


# ---- channel shuffle, LRN ----
def test_channel_shuffle_matches_torch():
    x = rnd(2, 6, 3, 2)
    for g in (1, 2, 3, 6):
        same_fwd_bwd(lambda t: F.channel_shuffle(t, g), lambda t: TF.channel_shuffle(t, g), x)
        km, tm = nn.ChannelShuffle(g), tnn.ChannelShuffle(g)
        assert repr(km) == repr(tm)
        same_fwd_bwd(km, tm, x)
    # (torch's native_channel_shuffle has no derivative: its values only)
    close(F.native_channel_shuffle(kiln.tensor(x.numpy()), 3), TF.native_channel_shuffle(x, 3))
    with pytest.raises(ValueError, match=r"channel_shuffle: the number of channels \(6\) must be divisible by groups"):
        F.channel_shuffle(kiln.zeros(2, 6, 3), 4)
    with pytest.raises(ValueError, match="channel_shuffle: groups must be a positive int"):
        F.channel_shuffle(kiln.zeros(2, 6, 3), 0)


@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_local_response_norm_module_matches_torch(size):
    km, tm = nn.LocalResponseNorm(size, 0.2, 0.6, 1.5), tnn.LocalResponseNorm(size, 0.2, 0.6, 1.5)
    assert repr(km) == repr(tm) and repr(nn.LocalResponseNorm(3)) == repr(tnn.LocalResponseNorm(3))
    same_fwd_bwd(km, tm, rnd(2, 5, 3, 4))
    same_fwd_bwd(km, tm, rnd(2, 5, 3, 2, 2))


def _torch_cross_map_autograd(x, size, alpha, beta, k):
    """torch's CrossMapLRN2d forward written with differentiable torch ops (its running-sum window)."""
    c = x.shape[1]
    pre = int((size - 1) / 2 + 1)
    rows = []
    for ch in range(c):
        chans = set(range(0, min(pre, c)))
        for j in range(1, ch + 1):
            if j < c - pre + 1:
                chans.add(j + pre - 1)
            if j > pre:
                chans.discard(j - pre)
        rows.append(sum(x[:, i] ** 2 for i in sorted(chans)))
    return x * (torch.stack(rows, 1) * (alpha / size) + k) ** -beta


@pytest.mark.parametrize("c,size", [(1, 3), (2, 4), (3, 2), (5, 3), (8, 5), (8, 1)])
def test_cross_map_lrn2d_matches_torch_forward_and_true_gradient(c, size):
    x = rnd(2, c, 3, 2)
    km, tm = nn.CrossMapLRN2d(size, 0.3, 0.7, 2), tnn.CrossMapLRN2d(size, 0.3, 0.7, 2)
    assert repr(km) == repr(tm)
    close(km(kiln.tensor(x.numpy())), tm(x))
    # gradients: the true gradient of torch's forward (torch's own backward fails gradcheck where the window
    # is cut at an end, so it is compared only where it passes)
    same_fwd_bwd(km, lambda t: _torch_cross_map_autograd(t, size, 0.3, 0.7, 2), x)
    try:
        torch_grad_ok = torch.autograd.gradcheck(tm, (x.clone().requires_grad_(),), raise_exception=False)
    except RuntimeError:  # torch's backward raises for some (channels, size)
        torch_grad_ok = False
    if torch_grad_ok:
        same_fwd_bwd(km, tm, x)
    with pytest.raises(ValueError, match="CrossMapLRN2d: expected a 4D input"):
        km(kiln.zeros(2, c, 3))


# ---- upsampling ----
@pytest.mark.parametrize("kw", [dict(scale_factor=2), dict(size=(5, 7)), dict(size=4), dict(scale_factor=(1.5, 2))])
def test_upsampling_modules_match_torch(kw):
    x = rnd(2, 3, 3, 4)
    for name in ("UpsamplingNearest2d", "UpsamplingBilinear2d"):
        km, tm = getattr(nn, name)(**kw), getattr(tnn, name)(**kw)
        assert repr(km) == repr(tm)
        same_fwd_bwd(km, tm, x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in ("upsample_nearest", "upsample_bilinear"):
            same_fwd_bwd(lambda t: getattr(F, name)(t, **kw), lambda t: getattr(TF, name)(t, **kw), x)
    with pytest.warns(UserWarning, match="upsample_bilinear` is deprecated"):
        F.upsample_bilinear(kiln.tensor(x.numpy()), **kw)


def test_new_names_are_in_kiln_nn():
    for name in ("ZeroPad1d", "CircularPad3d", "LPPool3d", "AdaptiveAvgPool3d", "AdaptiveMaxPool3d", "MaxUnpool3d",
                 "ConvTranspose3d", "ChannelShuffle", "LocalResponseNorm", "CrossMapLRN2d", "UpsamplingNearest2d",
                 "UpsamplingBilinear2d"):
        assert hasattr(nn, name) and hasattr(tnn, name)
    assert not hasattr(nn, "numbers") and not hasattr(nn, "np")  # only the module's __all__ is taken


# ---- nn.Buffer ----
def test_buffer_registers_as_torch():
    km, tm = nn.Module(), tnn.Module()
    for m, B, ones in ((km, nn.Buffer, lambda n: kiln.ones(n)), (tm, tnn.Buffer, lambda n: torch.ones(n))):
        m.a = B(ones(2), persistent=False)
        m.b = B(ones(1))
        m.b = ones(3)  # a plain tensor on a buffer's name stays a buffer, with its flag
        m.x = 1
        m.p = (nn.Parameter if m is km else tnn.Parameter)(ones(1))
    assert list(km.state_dict()) == list(tm.state_dict()) == ["p", "b"]
    assert list(dict(km.named_buffers())) == list(dict(tm.named_buffers())) == ["a", "b"]
    assert tuple(km.b.shape) == (3,)
    km.b = nn.Buffer(kiln.zeros(3), persistent=False)  # the flag of a new Buffer counts
    tm.b = tnn.Buffer(torch.zeros(3), persistent=False)
    assert list(km.state_dict()) == list(tm.state_dict()) == ["p"]
    with pytest.raises(KeyError, match="attribute 'x' already exists"):
        km.x = nn.Buffer(kiln.ones(1))
    with pytest.raises(TypeError, match="cannot assign .* as parameter 'p'"):
        km.p = nn.Buffer(kiln.ones(1))
    src = kiln.ones(2).requires_grad_(True)
    assert nn.Buffer(src).requires_grad and tnn.Buffer(torch.ones(2, requires_grad=True)).requires_grad
    assert isinstance(nn.Buffer(kiln.ones(1)), kiln.Tensor) and tuple(nn.Buffer().shape) == (0,)


# ---- lazy modules ----
_LAZY = [("LazyLinear", (3,), {}, (2, 5)),
         ("LazyConv1d", (4, 3), dict(padding=1), (2, 3, 7)),
         ("LazyConv2d", (4, 3), dict(stride=2, groups=2), (2, 6, 7, 6)),
         ("LazyConv3d", (4, 2), {}, (3, 4, 4, 5)),  # unbatched: in_channels from dim 0
         ("LazyConvTranspose1d", (4, 3), dict(stride=2), (2, 3, 5)),
         ("LazyConvTranspose2d", (6, 3), dict(groups=2), (4, 5, 5)),
         ("LazyConvTranspose3d", (4, 2), dict(stride=2, output_padding=1), (1, 2, 3, 3, 2)),
         ("LazyBatchNorm1d", (), {}, (4, 3)),
         ("LazyBatchNorm2d", (), dict(momentum=0.2), (4, 3, 2, 2)),
         ("LazyBatchNorm3d", (), dict(affine=False), (2, 3, 2, 2, 2)),
         ("LazyInstanceNorm1d", (), dict(affine=True, track_running_stats=True), (2, 3, 5)),
         ("LazyInstanceNorm2d", (), {}, (2, 3, 4, 4)),
         ("LazyInstanceNorm3d", (), dict(affine=True), (2, 3, 2, 3, 2))]


@pytest.mark.parametrize("name,args,kw,shape", _LAZY, ids=[c[0] for c in _LAZY])
def test_lazy_modules_match_torch(name, args, kw, shape):
    km, tm = getattr(nn, name)(*args, **kw, dtype=kiln.float64), getattr(tnn, name)(*args, **kw, dtype=torch.float64)
    base = getattr(nn, name[4:])
    assert repr(km) == repr(tm) and isinstance(km, base)
    assert list(km.state_dict()) == list(tm.state_dict())
    assert km.has_uninitialized_params() and tm.has_uninitialized_params()
    x = rnd(*shape)
    ty = tm(x)
    ky = km(kiln.tensor(x.numpy()))
    # the first forward infers the sizes and makes it the eager module, as torch's
    assert type(km) is base and type(tm).__name__ == base.__name__ and repr(km) == repr(tm)
    assert not any(isinstance(t, (nn.UninitializedParameter, nn.UninitializedBuffer))
                   for t in list(km.parameters()) + list(km.buffers()))
    assert tuple(ky.shape) == tuple(ty.shape)
    assert {k: tuple(v.shape) for k, v in km.state_dict().items()} == {k: tuple(v.shape) for k, v in
                                                                       tm.state_dict().items()}
    assert all(p.dtype == kiln.float64 for p in km.parameters())
    # with torch's values loaded, the same outputs and gradients
    km.load_state_dict({k: kiln.tensor(v.numpy()) for k, v in tm.state_dict().items()})
    km.eval(), tm.eval()
    same_fwd_bwd(km, tm, x)
    for (n, kp), (_, tp) in zip(km.named_parameters(), tm.named_parameters()):
        close(kp.grad, tp.grad)


def test_lazy_module_loads_a_state_dict_before_its_first_forward():
    src = tnn.Linear(5, 3, dtype=torch.float64)
    tl = tnn.LazyLinear(3, dtype=torch.float64)
    tl.load_state_dict(src.state_dict())
    kseq = nn.Sequential(nn.LazyLinear(3, dtype=kiln.float64), nn.ReLU())
    kseq.load_state_dict({"0." + k: kiln.tensor(v.detach().numpy()) for k, v in src.state_dict().items()})
    kl = kseq[0]
    assert type(kl).__name__ == "LazyLinear" and not kl.has_uninitialized_params()
    assert tuple(kl.weight.shape) == (3, 5) and kl.in_features == 5  # torch's in_features stays 0 here
    x = rnd(4, 5)
    close(kseq(kiln.tensor(x.numpy())), torch.relu(tl(x)))
    assert type(kl) is nn.Linear and type(tl) is tnn.Linear


def test_lazy_modules_errors_and_uninitialized_parameter():
    with pytest.raises(ValueError, match=r"LazyConv2d: expected a 3D \(unbatched\) or 4D \(batched\) input"):
        nn.LazyConv2d(4, 3)(kiln.zeros(2, 3))
    with pytest.raises(ValueError, match=r"LazyConv2d: the input's 3 channels \(in_channels\) must be divisible by "
                                         r"groups \(2\)"):
        nn.LazyConv2d(4, 3, groups=2)(kiln.zeros(1, 3, 5, 5))
    with pytest.raises(ValueError, match="LazyLinear: the input must have at least 1 dim"):
        nn.LazyLinear(3)(kiln.tensor(1.0))
    p = nn.UninitializedParameter()
    assert repr(p) == repr(tnn.UninitializedParameter()) == "<UninitializedParameter>"
    tp = tnn.UninitializedParameter()
    assert p.materialize((2, 3)) is None and tp.materialize((2, 3)) is None  # in place, as torch's
    assert type(p) is nn.Parameter and type(tp) is tnn.Parameter
    assert tuple(p.shape) == tuple(tp.shape) == (2, 3) and p.requires_grad and p.is_leaf


def test_lazy_module_moved_or_cast_before_its_first_forward_stays_lazy():
    # Module.to()/double()/half() used to rebuild the UninitializedParameters as plain [0] Parameters: the
    # module then counted as initialized and its forward failed on the empty weight
    for conv in ("double", "float", "half", "cpu"):
        km, tm = getattr(nn.LazyLinear(3), conv)(), getattr(tnn.LazyLinear(3), conv)()
        assert km.has_uninitialized_params() and tm.has_uninitialized_params()
        assert type(km.weight) is nn.UninitializedParameter and type(tm.weight) is tnn.UninitializedParameter
        assert km.weight.dtype.name == str(tm.weight.dtype)[6:]
    x = rnd(2, 5)
    km, tm = nn.LazyLinear(3).double(), tnn.LazyLinear(3).double()
    ky, ty = km(kiln.tensor(x.numpy())), tm(x)
    assert ky.dtype == kiln.float64 and ty.dtype == torch.float64 and tuple(ky.shape) == tuple(ty.shape)
    assert type(km) is nn.Linear and type(km.weight) is nn.Parameter
    km, tm = nn.LazyBatchNorm2d().double(), tnn.LazyBatchNorm2d().double()
    assert type(km.running_mean) is nn.UninitializedBuffer
    x = rnd(2, 3, 4, 4)
    same_fwd_bwd(km, tm, x)
    close(km.running_mean, tm.running_mean)
    assert km.running_var.dtype == kiln.float64


@pytest.mark.parametrize("opt", ["SGD", "Adam"])
def test_optimizer_made_before_a_lazy_modules_first_forward_trains_it(opt):
    # the first forward used to swap in new Parameter objects, leaving the optimizer with the old empty ones
    # (silently no training); now the parameters are materialized in place, as torch's
    x = rnd(4, 5)
    km, tm = nn.LazyLinear(3, dtype=kiln.float64), tnn.LazyLinear(3, dtype=torch.float64)
    kopt = getattr(kiln.optim, opt)(km.parameters(), lr=0.1)
    topt = getattr(torch.optim, opt)(tm.parameters(), lr=0.1)
    held = list(km.parameters())
    km(kiln.tensor(x.numpy()))
    tm(x)
    assert [id(p) for p in km.parameters()] == [id(p) for p in held]
    km.load_state_dict({k: kiln.tensor(v.detach().numpy()) for k, v in tm.state_dict().items()})
    for _ in range(2):
        kopt.zero_grad(), topt.zero_grad()
        (km(kiln.tensor(x.numpy())) ** 2).sum().backward()
        (tm(x) ** 2).sum().backward()
        kopt.step(), topt.step()
    close(km.weight, tm.weight)
    close(km.bias, tm.bias)


class _KBufLazy(nn.Module):  # at module level for pickle
    def __init__(self):
        super().__init__()
        self.a = nn.Buffer(kiln.ones(2))
        self.b = nn.Buffer(kiln.zeros(3), persistent=False)
        self.l = nn.LazyLinear(2, dtype=kiln.float64)


class _TBufLazy(tnn.Module):
    def __init__(self):
        super().__init__()
        self.a = tnn.Buffer(torch.ones(2))
        self.b = tnn.Buffer(torch.zeros(3), persistent=False)
        self.l = tnn.LazyLinear(2, dtype=torch.float64)


def test_buffer_and_lazy_modules_deepcopy_and_pickle():
    import copy
    import pickle
    KM, TM = _KBufLazy, _TBufLazy

    # the module holds a plain tensor, as torch's (Buffer is only the marker)
    assert type(KM().a) is kiln.Tensor and type(TM().a) is torch.Tensor
    x = rnd(3, 4)
    for cp in (copy.deepcopy, lambda m: pickle.loads(pickle.dumps(m))):
        km, tm = cp(KM()), cp(TM())
        assert [n for n, _ in km.named_buffers()] == [n for n, _ in tm.named_buffers()] == ["a", "b"]
        assert list(km.state_dict()) == list(tm.state_dict()) == ["a", "l.weight", "l.bias"]
        assert type(km.l).__name__ == type(tm.l).__name__ == "LazyLinear"
        assert type(km.l.weight) is nn.UninitializedParameter and km.l.weight.dtype == kiln.float64
        # (torch's copy of an UninitializedParameter forgets its float64; Kiln's keeps it)
        assert tuple(km.l(kiln.tensor(x.numpy())).shape) == tuple(tm.l(x.to(tm.l.weight.dtype)).shape) == (3, 2)
        assert type(km.l) is nn.Linear
    for cp in (copy.deepcopy, lambda t: pickle.loads(pickle.dumps(t))):
        b = cp(nn.Buffer(kiln.ones(2), persistent=False))
        assert type(b) is nn.Buffer and not b.persistent and np.asarray(b).tolist() == [1.0, 1.0]
        p = cp(nn.UninitializedParameter(requires_grad=False, dtype=kiln.float64))
        assert type(p) is nn.UninitializedParameter and not p.requires_grad and p.dtype == kiln.float64
        assert type(cp(nn.UninitializedBuffer())) is nn.UninitializedBuffer
    am = kiln.optim.swa_utils.AveragedModel(KM())
    assert type(am.module.l).__name__ == "LazyLinear"
    tam = torch.optim.swa_utils.AveragedModel(TM())
    assert type(tam.module.l).__name__ == "LazyLinear"


def test_lazy_module_load_state_dict_keeps_its_dtype_and_takes_an_uninitialized_one():
    src = tnn.Linear(5, 3, dtype=torch.float64)
    km, tm = nn.LazyLinear(3), tnn.LazyLinear(3)
    km.load_state_dict({k: kiln.tensor(v.detach().numpy()) for k, v in src.state_dict().items()})
    tm.load_state_dict(src.state_dict())
    assert km.weight.dtype == kiln.float32 and tm.weight.dtype == torch.float32  # the module's, not the file's
    x = rnd(2, 5)
    np.testing.assert_allclose(np.asarray(km(kiln.tensor(x.numpy(), dtype=kiln.float32))), tm(x.float()).detach().numpy(),
                               rtol=1e-6, atol=1e-6)
    # another uninitialized lazy module's state dict: accepted, and this one stays uninitialized
    km, tm = nn.LazyLinear(3), tnn.LazyLinear(3)
    ksd, tsd = nn.LazyLinear(3).state_dict(), tnn.LazyLinear(3).state_dict()
    assert [type(v).__name__ for v in ksd.values()] == [type(v).__name__ for v in tsd.values()]
    km.load_state_dict(ksd)
    tm.load_state_dict(tsd)
    assert km.has_uninitialized_params() and tm.has_uninitialized_params()
    assert tuple(km(kiln.tensor(x.numpy(), dtype=kiln.float32)).shape) == tuple(tm(x.float()).shape) == (2, 3)
    bn = nn.LazyBatchNorm1d()
    bn.load_state_dict(nn.LazyBatchNorm1d().state_dict())
    assert bn.has_uninitialized_params()


# ---- fractional max pooling ----
@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("kw", [dict(output_size=4), dict(output_ratio=0.5), dict(output_size=(3, 5, 2))],
                         ids=["size", "ratio", "sizes"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_fractional_max_pool_matches_torch_with_the_same_samples(n, kw, dtype):
    kw = {k: (v[:n] if isinstance(v, tuple) else (v,) * n if k == "output_ratio" else v) for k, v in kw.items()}
    x = rnd(2, 3, 9, 8, 7)[(slice(None), slice(None)) + ((0,) if n == 2 else ())].to(dtype)
    s = torch.from_numpy(np.random.default_rng(5).random((2, 3, n))).to(dtype)
    k = (2, 3) if n == 2 else 2
    fk, ft = getattr(F, f"fractional_max_pool{n}d"), getattr(TF, f"fractional_max_pool{n}d")
    ks = kiln.tensor(s.numpy())
    kv, ki = fk(kiln.tensor(x.numpy()), k, return_indices=True, _random_samples=ks, **kw)
    tv, ti = ft(x, k, return_indices=True, _random_samples=s, **kw)
    close(kv, tv)
    np.testing.assert_array_equal(np.asarray(ki), ti.numpy())
    kw2 = getattr(F, f"fractional_max_pool{n}d_with_indices")(kiln.tensor(x.numpy()), k, _random_samples=ks, **kw)
    np.testing.assert_array_equal(np.asarray(kw2[1]), ti.numpy())
    if dtype == torch.float64:
        same_fwd_bwd(lambda t: fk(t, k, _random_samples=ks, **kw), lambda t: ft(t, k, _random_samples=s, **kw), x)
        # unbatched: [C, ...] with samples [1, C, n]
        same_fwd_bwd(lambda t: fk(t, k, _random_samples=ks[:1], **kw), lambda t: ft(t, k, _random_samples=s[:1], **kw),
                     x[0])


@pytest.mark.parametrize("n", [2, 3])
def test_fractional_max_pool_modules_and_errors(n):
    name = f"FractionalMaxPool{n}d"
    s = torch.rand(2, 3, n, dtype=torch.float64)
    km = getattr(nn, name)(2, output_size=3, _random_samples=kiln.tensor(s.numpy()))
    tm = getattr(tnn, name)(2, output_size=3, _random_samples=s)
    assert repr(km) == repr(tm)
    assert list(km.state_dict()) == list(tm.state_dict()) == ["_random_samples"]
    x = rnd(*((2, 3) + (7, 6, 5)[:n]))
    same_fwd_bwd(km, tm, x)
    assert list(getattr(nn, name)(2, output_ratio=0.5).state_dict()) == []
    # samples drawn from Kiln's generator: the same seed, the same windows
    kx = kiln.tensor(x.numpy())
    kiln.manual_seed(3)
    a = getattr(F, f"fractional_max_pool{n}d")(kx, 2, output_ratio=0.6)
    kiln.manual_seed(3)
    b = getattr(F, f"fractional_max_pool{n}d")(kx, 2, output_ratio=0.6)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert tuple(a.shape) == (2, 3) + tuple(int(v * 0.6) for v in (7, 6, 5)[:n])
    with pytest.raises(ValueError, match=f"{name} requires specifying either an output size, or a pooling ratio"):
        getattr(nn, name)(2)
    with pytest.raises(ValueError, match=f"{name}: only one of output_size and output_ratio may be specified"):
        getattr(nn, name)(2, output_size=2, output_ratio=0.5)
    with pytest.raises(ValueError, match=rf"{name}: output_ratio must be between 0 and 1 \(got 1.5\)"):
        getattr(nn, name)(2, output_ratio=1.5)
    fn = getattr(F, f"fractional_max_pool{n}d")
    with pytest.raises(ValueError, match=f"fractional_max_pool{n}d: the pool size 4 is too large for the input size"):
        fn(kx, 4, output_size=5)
    with pytest.raises(ValueError, match=rf"fractional_max_pool{n}d: _random_samples must be \[N, C, {n}\]"):
        fn(kx, 2, output_size=2, _random_samples=kiln.zeros(1, 3, n))
    with pytest.raises(ValueError, match=f"fractional_max_pool{n}d requires specifying either an output_size or"):
        fn(kx, 2)


# ---- negative padding in every mode, empty fractional batches, integer lp_pool and other edges ----
@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular"])
def test_pad_negative_amounts_crop_in_every_mode_as_torch(mode):
    x = rnd(3, 5, 6)
    for p in [(-1, 2), (2, -1), (-1, -2), (-2, 1, 3, -1), (-4, 3) if mode != "circular" else (-4, 2), (-1, 0)]:
        same_fwd_bwd(lambda t: F.pad(t, p, mode=mode), lambda t: TF.pad(t, p, mode=mode), x)
    if mode == "circular":  # a circular crop may leave nothing, as torch's
        assert tuple(F.pad(kiln.tensor(x.numpy()), (-3, -3), mode=mode).shape) == \
            tuple(TF.pad(x, (-3, -3), mode=mode).shape) == (3, 5, 0)
    else:
        with pytest.raises(ValueError, match=rf"pad: padding \(-3, -3\) \({mode}\) crops dim 2 of the input "
                                             r"\[3, 5, 6\] to size 0"):
            F.pad(kiln.tensor(x.numpy()), (-3, -3), mode=mode)
        with pytest.raises(RuntimeError, match="too small"):
            TF.pad(x, (-3, -3), mode=mode)
    kind = {"reflect": "ReflectionPad", "replicate": "ReplicationPad", "circular": "CircularPad"}[mode]
    for n, shape in [(1, (2, 3, 5)), (2, (2, 3, 4, 5)), (3, (2, 3, 4, 5, 4)), (2, (3, 4, 5))]:
        pad = tuple([-1] + [1] * (2 * n - 2) + [-2])
        km, tm = getattr(nn, f"{kind}{n}d")(pad), getattr(tnn, f"{kind}{n}d")(pad)
        same_fwd_bwd(km, tm, rnd(*shape))


@pytest.mark.parametrize("n", [2, 3])
def test_fractional_max_pool_empty_batch_and_errors_as_torch(n):
    fk, ft = getattr(F, f"fractional_max_pool{n}d"), getattr(TF, f"fractional_max_pool{n}d")
    name = f"fractional_max_pool{n}d"
    x = rnd(*((0, 2) + (5,) * n))
    kv, ki = fk(kiln.tensor(x.numpy()), 2, output_size=3, return_indices=True)
    tv, ti = ft(x, 2, output_size=3, return_indices=True)
    assert tuple(kv.shape) == tuple(tv.shape) == tuple(ki.shape) == tuple(ti.shape) == (0, 2) + (3,) * n
    assert ki.dtype == kiln.int64 and kv.dtype == kiln.float64
    # an unbatched input of 0 channels too; 0 channels of a batch, or an empty spatial dim, is refused as torch's
    x0 = rnd(*((0,) + (5,) * n))
    assert tuple(fk(kiln.tensor(x0.numpy()), 2, output_size=3).shape) == tuple(ft(x0, 2, output_size=3).shape)
    for shape, dim in [((2, 0) + (5,) * n, 1), ((1, 1, 0) + (5,) * (n - 1), 2)]:
        with pytest.raises(ValueError, match=rf"{name}: expected input to have non-zero size for non-batch "
                                             rf"dimensions, but got \[{', '.join(map(str, shape))}\] with dimension "
                                             rf"{dim} being empty"):
            fk(kiln.zeros(*shape), 1, output_size=(0,) + (1,) * (n - 1))
        with pytest.raises(RuntimeError, match="non-zero size for non-batch dimensions"):
            ft(torch.zeros(*shape), 1, output_size=(0,) + (1,) * (n - 1))
    # samples of another dtype than the input: refused, as torch's
    x = rnd(*((1, 1) + (5,) * n)).float()
    s = torch.rand(1, 1, n, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="Expect _random_samples to have the same dtype as input"):
        ft(x, 2, output_size=3, _random_samples=s)
    with pytest.raises(ValueError, match=rf"{name}: expect _random_samples to have the same dtype as input "
                                         r"\(torch's error\), got float64 samples for a float32 input"):
        fk(kiln.tensor(x.numpy()), 2, output_size=3, _random_samples=kiln.tensor(s.numpy()))


@pytest.mark.parametrize("n", [1, 2, 3])
def test_lp_pool_integer_input_as_torch(n):
    x = torch.arange(2 * 4 ** n).reshape((2,) + (4,) * n) - 3
    fk, ft = getattr(F, f"lp_pool{n}d"), getattr(TF, f"lp_pool{n}d")
    for p in (1, 2, 3, 1.5) + ((float("inf"),) if n > 1 else ()):  # (torch's max_pool1d refuses int64)
        xp = x.abs() if p == 1.5 else x
        ky, ty = fk(kiln.tensor(xp.numpy()), p, 2), ft(xp, p, 2)
        assert ky.dtype.name == str(ty.dtype)[6:]  # float32, or the input's int64 for p = inf
        # (torch's integer avg_pool truncates each window's mean: the same numbers)
        np.testing.assert_allclose(np.asarray(ky), ty.numpy(), rtol=1e-6, atol=1e-5)


def test_conv_transpose3d_output_size_checked_and_local_response_norm_size_as_torch():
    x, w = rnd(1, 2, 2, 3, 3), rnd(2, 3, 2, 2, 2)
    msg = r"Given input size per channel: \(2 x 3 x 3\). Calculated output size per channel: \(-1 x 4 x 4\). " \
          r"Output size is too small"
    with pytest.raises(RuntimeError, match=msg):
        TF.conv_transpose3d(x, w, padding=(2, 0, 0))
    with pytest.raises(ValueError, match="conv_transpose3d: " + msg):
        F.conv_transpose3d(kiln.tensor(x.numpy()), kiln.tensor(w.numpy()), padding=(2, 0, 0))
    # a size < 1 is accepted at construction and refused by the forward, as torch's
    km, tm = nn.LocalResponseNorm(0), tnn.LocalResponseNorm(0)
    assert repr(km) == repr(tm)
    with pytest.raises(RuntimeError, match="kernel size should be greater than zero"):
        tm(torch.zeros(2, 3, 4))
    with pytest.raises(RuntimeError, match="local_response_norm: size must be >= 1, got 0"):
        km(kiln.zeros(2, 3, 4))
    with pytest.raises(ValueError, match="LocalResponseNorm: size must be an int, got 1.5"):
        nn.LocalResponseNorm(1.5)
    with pytest.raises(ValueError, match="CrossMapLRN2d: size must be >= 1, got 0"):
        nn.CrossMapLRN2d(0)(kiln.zeros(1, 2, 2, 2))


def test_adaptive_max_pool3d_one_gather_keeps_torchs_first_maximum_on_ties_and_nan():
    # all bins at once, short bins padded with a repeat of their first position: ties (many equal values) and
    # NaN still give torch's values and indices, over uneven bins
    x = torch.from_numpy(np.random.default_rng(3).integers(0, 3, (2, 3, 5, 7, 6)).astype(np.float64))
    x[0, 1, 2, 3, 4] = float("nan")
    for size in [(2, 3, 4), (3, 5, 4), (5, 7, 6), (4, 2, 5)]:
        kv, ki = F.adaptive_max_pool3d(kiln.tensor(x.numpy()), size, True)
        tv, ti = TF.adaptive_max_pool3d(x, size, True)
        np.testing.assert_array_equal(np.asarray(kv), tv.numpy())
        np.testing.assert_array_equal(np.asarray(ki), ti.numpy())
