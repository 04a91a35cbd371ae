# torch's aliases, missing in-place forms, random in-place fills and small functions (python/kiln/_torch_more.py)
# against PyTorch itself: values, dtypes, shapes, in-place semantics (returns self, version bump, refusal on a
# tensor that requires grad), gradients and errors.
import math
import warnings

import numpy as np
import pytest

import kiln

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(5)


def arr(*shape, lo=-2.0, hi=2.0, dtype=np.float32):
    return RNG.uniform(lo, hi, shape).astype(dtype)


def both(a, grad=False):
    return kiln.tensor(a, requires_grad=grad), torch.tensor(a, requires_grad=grad)


def kdt(tdt):
    return getattr(kiln, str(tdt).split(".")[1])


def same(k, t, tol=1e-5):
    if isinstance(t, (tuple, list)):
        assert len(k) == len(t)
        for a, b in zip(k, t):
            same(a, b, tol)
        return
    assert tuple(k.shape) == tuple(t.shape), (tuple(k.shape), tuple(t.shape))
    assert k.dtype == kdt(t.dtype), (k.dtype, t.dtype)
    kn, tn = np.asarray(k.detach().cpu().numpy()), t.detach().numpy()
    if t.dtype.is_floating_point:
        assert np.allclose(kn, tn, rtol=tol, atol=tol, equal_nan=True), (kn, tn)
    else:
        assert (kn == tn).all(), (kn, tn)


# ---------------------------------------------------------------- aliases

@pytest.mark.parametrize("name,args", [
    ("absolute", 1), ("arccos", 1), ("arcsin", 1), ("arctan", 1), ("arctan2", 2), ("divide", 2), ("multiply", 2),
    ("subtract", 2), ("negative", 1), ("greater", 2), ("greater_equal", 2), ("less", 2), ("less_equal", 2),
    ("not_equal", 2), ("fix", 1), ("positive", 1)])
def test_aliases_function_method_inplace(name, args):
    a, b = arr(3, 4, lo=-0.9, hi=0.9), arr(3, 4, lo=-0.9, hi=0.9)
    b[0, 0] = a[0, 0]
    ts = [t for _, t in [both(a), both(b)][:args]]
    ks = [k for k, _ in [both(a), both(b)][:args]]
    same(getattr(kiln, name)(*ks), getattr(torch, name)(*ts))
    same(getattr(ks[0], name)(*ks[1:]), getattr(ts[0], name)(*ts[1:]))
    if hasattr(torch.Tensor, name + "_"):
        v = ks[0]._version
        assert getattr(ks[0], name + "_")(*ks[1:]) is ks[0]
        assert ks[0]._version > v
        getattr(ts[0], name + "_")(*ts[1:])
        same(ks[0], ts[0])


def test_alias_keywords_and_concat():
    (ka, ta), (kb, tb) = both(arr(2, 3)), both(arr(2, 3))
    same(kiln.divide(ka, kb, rounding_mode="floor"), torch.divide(ta, tb, rounding_mode="floor"))
    same(kiln.subtract(ka, kb, alpha=2), torch.subtract(ta, tb, alpha=2))
    same(kiln.concat([ka, kb], dim=1), torch.concat([ta, tb], dim=1))
    same(kiln.concatenate((ka, kb), axis=0), torch.concatenate((ta, tb), axis=0))
    same(kiln.row_stack([ka, kb]), torch.vstack([ta, tb]))
    with pytest.raises(kiln.KilnError, match="bool"):
        kiln.positive(kiln.tensor([True]))


def test_arc_hyperbolic_aliases_resolve_at_call_time():
    if not hasattr(kiln, "asinh"):
        with pytest.raises(kiln.KilnError, match="asinh is not available"):
            kiln.arcsinh(kiln.tensor([0.5]))
        pytest.skip("kiln.asinh is not in this build")
    (k, t) = both(arr(5, lo=1.1, hi=3.0))
    same(kiln.arcsinh(k), torch.arcsinh(t))
    same(kiln.arccosh(k), torch.arccosh(t))
    same((k / 4).arctanh(), (t / 4).arctanh())


# ---------------------------------------------------------------- in-place forms

UNARY_INPLACE = ["acos_", "asin_", "atan_", "cosh_", "sinh_", "tan_", "log2_", "log10_", "exp2_", "erfc_", "erfinv_",
                 "square_", "sgn_", "sinc_", "deg2rad_", "rad2deg_", "nan_to_num_", "logical_not_"]


@pytest.mark.parametrize("name", UNARY_INPLACE)
def test_unary_inplace(name):
    a = arr(3, 4, lo=0.05, hi=0.95)
    a[0, 0] = 0.0
    k, t = both(a)
    v = k._version
    assert getattr(k, name)() is k
    assert k._version == v + 1
    getattr(t, name)()
    same(k, t)
    leaf = kiln.tensor(a, requires_grad=True)
    with pytest.raises(kiln.KilnError, match=name):
        getattr(leaf, name)()


@pytest.mark.parametrize("name", ["eq_", "ne_", "lt_", "le_", "gt_", "ge_", "logical_and_", "logical_or_",
                                  "logical_xor_", "fmod_", "remainder_", "atan2_", "true_divide_", "floor_divide_",
                                  "greater_", "less_equal_", "not_equal_"])
def test_binary_inplace(name):
    a, b = arr(3, 4), arr(3, 4)
    b[1] = a[1]
    b[2, 0] = 0.0
    (k, t), (kb, tb) = both(a), both(b)
    assert getattr(k, name)(kb) is k
    getattr(t, name)(tb)
    same(k, t)
    # a number operand, broadcasting operands
    (k, t), (kb, tb) = both(a), both(b[:1])
    getattr(k, name)(kb)
    getattr(t, name)(tb)
    same(k, t)


def test_comparison_inplace_on_integers_and_shape_growth():
    k, t = both(np.array([1, 2, 3]))
    k.lt_(2)
    t.lt_(2)
    same(k, t)
    with pytest.raises(kiln.KilnError, match="true_divide_"):
        kiln.tensor([1, 2]).true_divide_(kiln.tensor([2, 2]))
    with pytest.raises(kiln.KilnError, match="eq_"):
        kiln.zeros(3).eq_(kiln.zeros(2, 3))


def test_cumulative_triangular_inplace():
    a = arr(3, 4)
    for name, args in (("cumsum_", (1,)), ("cumprod_", (0,)), ("tril_", (1,)), ("triu_", (-1,)), ("tril_", ())):
        k, t = both(a)
        assert getattr(k, name)(*args) is k
        getattr(t, name)(*args)
        same(k, t)


def test_scatter_index_put_masked_scatter_put_inplace():
    a = arr(3, 4)
    idx = np.array([[0, 1, 2, 0], [2, 0, 1, 1]])
    src = arr(2, 4)
    (k, t), (ks, ts) = both(a), both(src)
    ki, ti = kiln.tensor(idx), torch.tensor(idx)
    same(k.clone().scatter_(0, ki, ks), t.clone().scatter_(0, ti, ts))
    same(k.clone().scatter_add_(0, ki, ks), t.clone().scatter_add_(0, ti, ts))
    same(k.clone().scatter_reduce_(0, ki, ks, "amax"), t.clone().scatter_reduce_(0, ti, ts, "amax"))
    same(k.clone().scatter_reduce_(0, ki, ks, "sum", include_self=False),
         t.clone().scatter_reduce_(0, ti, ts, "sum", include_self=False))
    rows, cols = np.array([0, 2, 0]), np.array([1, 3, 1])
    vals = arr(3)
    kk, tt = k.clone(), t.clone()
    assert kk.index_put_((kiln.tensor(rows), kiln.tensor(cols)), kiln.tensor(vals), accumulate=True) is kk
    tt.index_put_((torch.tensor(rows), torch.tensor(cols)), torch.tensor(vals), accumulate=True)
    same(kk, tt)
    mask = a > 0
    src12 = arr(12)
    kk, tt = k.clone(), t.clone()
    kk.masked_scatter_(kiln.tensor(mask), kiln.tensor(src12))
    tt.masked_scatter_(torch.tensor(mask), torch.tensor(src12))
    same(kk, tt)
    flat = np.array([0, -1, 5, 5])
    pv = arr(4)
    for acc in (False, True):
        kk, tt = k.clone(), t.clone()
        assert kk.put_(kiln.tensor(flat[:3] if not acc else flat), kiln.tensor(pv[:3] if not acc else pv),
                       accumulate=acc) is kk
        tt.put_(torch.tensor(flat[:3] if not acc else flat), torch.tensor(pv[:3] if not acc else pv),
                accumulate=acc)
        same(kk, tt)
        same(kiln.put(k, kiln.tensor(flat), kiln.tensor(pv), acc),
             torch.put(t, torch.tensor(flat), torch.tensor(pv), acc))
    with pytest.raises(kiln.KilnIndexError, match="put"):
        k.clone().put_(kiln.tensor([12]), kiln.tensor(arr(1)))
    with pytest.raises(kiln.KilnError, match="same number of elements"):
        k.clone().put_(kiln.tensor([1, 2]), kiln.tensor(arr(3)))


def test_addmm_baddbmm_inplace():
    (k, t), (k1, t1), (k2, t2) = both(arr(2, 3)), both(arr(2, 4)), both(arr(4, 3))
    assert k.addmm_(k1, k2, beta=0.5, alpha=2) is k
    t.addmm_(t1, t2, beta=0.5, alpha=2)
    same(k, t)
    (k, t), (k1, t1), (k2, t2) = both(arr(2, 2, 3)), both(arr(2, 2, 4)), both(arr(2, 4, 3))
    k.baddbmm_(k1, k2, alpha=-1)
    t.baddbmm_(t1, t2, alpha=-1)
    same(k, t)


def test_float_power_inplace_needs_float64():
    (k, t) = both(arr(4).astype(np.float64))
    k.float_power_(2)
    t.float_power_(2)
    same(k, t)
    with pytest.raises(kiln.KilnError, match="float_power_.*float32"):
        kiln.ones(2).float_power_(2)


def test_view_inplace_ops():
    a = arr(2, 1, 3)
    for name, args in (("squeeze_", ()), ("squeeze_", (1,)), ("unsqueeze_", (0,)), ("transpose_", (0, 2)),
                       ("swapaxes_", (0, 1)), ("swapdims_", (2, 1))):
        k, t = both(a)
        assert getattr(k, name)(*args) is k
        getattr(t, name)(*args)
        same(k, t)
    k, t = both(arr(2, 3))
    assert k.t_() is k
    t.t_()
    same(k, t)
    # a view rebound in place still writes its base
    base = kiln.zeros(2, 3)
    view = base[:, :]
    view.t_()
    view[2, 1] = 5.0
    assert base.numpy()[1, 2] == 5.0
    with pytest.raises(kiln.KilnError, match="t_"):
        kiln.zeros(2, 3, requires_grad=True).t_()
    with pytest.raises(kiln.KilnError, match="t_"):
        kiln.zeros(2, 3, 4).t_()


def test_inplace_refused_with_grad_allowed_under_no_grad():
    for name, args in (("acos_", ()), ("cumsum_", (0,)), ("scatter_", (0, kiln.tensor([0]), kiln.ones(1)))):
        x = kiln.zeros(3, requires_grad=True)
        with pytest.raises(kiln.KilnError, match=name):
            getattr(x, name)(*args)
        with kiln.no_grad():
            getattr(x, name)(*args)


def test_top_level_inplace_functions():
    a = arr(3, lo=0.1, hi=0.9)
    for name in ("abs_", "acos_", "exp_", "sqrt_", "square_", "sinc_", "deg2rad_", "arccos_", "negative_", "zero_"):
        k, t = both(a)
        assert getattr(kiln, name)(k) is k
        getattr(torch, name)(t)
        same(k, t)
    k, t = both(a)
    kiln.clamp_(k, 0.3, 0.5)
    torch.clamp_(t, 0.3, 0.5)
    same(k, t)
    with pytest.raises(TypeError, match="input"):
        kiln.exp_([1.0])


# ---------------------------------------------------------------- random in-place fills

def test_random_fills_ranges_and_seed():
    kiln.manual_seed(3)
    a = kiln.zeros(2000).bernoulli_(0.25)
    kiln.manual_seed(3)
    b = kiln.zeros(2000).bernoulli_(0.25)
    assert (a.numpy() == b.numpy()).all()
    assert set(np.unique(a.numpy())) <= {0.0, 1.0}
    assert 0.15 < a.numpy().mean() < 0.35
    p = kiln.tensor([0.0, 1.0, 0.0, 1.0])
    assert kiln.bernoulli(p).numpy().tolist() == [0, 1, 0, 1]
    assert kiln.zeros(4).bernoulli_(p).numpy().tolist() == [0, 1, 0, 1]
    assert p.bernoulli().dtype == kiln.float32
    own = kiln.bernoulli((2, 3), 1.0, dtype=kiln.float64)  # Kiln's own bernoulli(size, p) stays
    assert tuple(own.shape) == (2, 3) and own.dtype == kiln.float64 and own.numpy().tolist() == [[1] * 3] * 2
    r = kiln.zeros(1000, dtype=kiln.int64).random_(3, 7).numpy()
    assert r.min() == 3 and r.max() == 6
    r = kiln.zeros(1000).random_(5).numpy()
    assert r.min() == 0 and r.max() == 4 and (r == np.floor(r)).all()
    assert set(np.unique(kiln.zeros(100, dtype=kiln.bool).random_().numpy())) == {False, True}
    r = kiln.zeros(1000, dtype=kiln.int64).random_().numpy()  # [0, 2**63 - 1]
    assert r.min() >= 0 and r.max() > 2 ** 60
    r = kiln.zeros(1000, dtype=kiln.int64).random_(-2 ** 40, 2 ** 40).numpy()
    assert r.min() >= -2 ** 40 and r.max() < 2 ** 40 and r.min() < -2 ** 38 and r.max() > 2 ** 38
    r = kiln.zeros(1000, dtype=kiln.uint8).random_().numpy()
    assert r.min() == 0 and r.max() == 255
    c = kiln.zeros(4001).cauchy_(1.0, 2.0).numpy()
    assert abs(np.median(c) - 1.0) < 0.3
    ln = kiln.zeros(4001).log_normal_(0.5, 0.25).numpy()
    assert (ln > 0).all() and abs(np.median(np.log(ln)) - 0.5) < 0.05
    g = kiln.zeros(4000).geometric_(0.5).numpy()
    assert g.min() >= 1 and (g == np.floor(g)).all() and abs(g.mean() - 2.0) < 0.2
    with pytest.raises(kiln.KilnError, match="bernoulli"):
        kiln.bernoulli(kiln.tensor([1.5]))
    with pytest.raises(kiln.KilnError, match="from=5 >= to=5"):
        kiln.zeros(3).random_(5, 5)
    with pytest.raises(kiln.KilnError, match="geometric_"):
        kiln.zeros(3).geometric_(1.5)
    with pytest.raises(kiln.KilnValueError, match="generator"):
        kiln.zeros(3).bernoulli_(0.5, generator=object())
    with pytest.raises(kiln.KilnError, match="bernoulli_"):
        kiln.zeros(3, requires_grad=True).bernoulli_()


# ---------------------------------------------------------------- functions

def test_atleast_and_stacking():
    for shape in ((), (3,), (2, 3), (2, 3, 4)):
        k, t = both(arr(*shape) if shape else np.float32(1.5))
        for name in ("atleast_1d", "atleast_2d", "atleast_3d"):
            same(getattr(kiln, name)(k), getattr(torch, name)(t))
    (k1, t1), (k2, t2) = both(arr(3)), both(arr(3))
    same(kiln.atleast_2d(k1, k2), torch.atleast_2d(t1, t2))
    same(kiln.atleast_3d([k1, k2]), torch.atleast_3d([t1, t2]))
    for name in ("hstack", "vstack", "dstack", "column_stack", "row_stack"):
        same(getattr(kiln, name)([k1, k2]), getattr(torch, name)([t1, t2]))
    (k3, t3), (k4, t4) = both(arr(3, 2)), both(arr(3, 1))
    same(kiln.hstack((k3, k4)), torch.hstack((t3, t4)))
    same(kiln.column_stack([k1, k3]), torch.column_stack([t1, t3]))
    same(kiln.dstack([k3, k4[:, :1].expand(3, 2)]), torch.dstack([t3, t4[:, :1].expand(3, 2)]))
    with pytest.raises(TypeError, match="hstack"):
        kiln.hstack(k1)
    with pytest.raises(kiln.KilnError, match="non-empty"):
        kiln.vstack([])


def test_broadcast_flip_diag_and_products():
    (k, t) = both(arr(3, 1))
    same(kiln.broadcast_to(k, (2, 3, 4)), torch.broadcast_to(t, (2, 3, 4)))
    same(k.broadcast_to((3, -1)), t.broadcast_to((3, -1)))
    (k2, t2) = both(arr(4))
    same(kiln.broadcast_tensors(k, k2), torch.broadcast_tensors(t, t2))
    (m, tm) = both(arr(3, 4))
    same(kiln.fliplr(m), torch.fliplr(tm))
    same(kiln.flipud(m), torch.flipud(tm))
    with pytest.raises(kiln.KilnError, match="fliplr"):
        kiln.fliplr(k2)
    for off in (-1, 0, 2):
        same(kiln.diag(k2, off), torch.diag(t2, off))
        same(kiln.diag(m, off), torch.diag(tm, off))
        same(kiln.diagflat(m, off), torch.diagflat(tm, off))
    with pytest.raises(kiln.KilnError, match="1D or 2D"):
        kiln.diag(kiln.zeros(2, 2, 2))
    (a, ta), (b, tb), (v, tv) = both(arr(3, 4)), both(arr(4, 2)), both(arr(4))
    same(kiln.mm(a, b), torch.mm(ta, tb))
    same(kiln.mv(a, v), torch.mv(ta, tv))
    same(a.mv(v), ta.mv(tv))
    same(kiln.chain_matmul(a, b, kiln.tensor(arr(2, 2))[:2] * 0 + 1), torch.chain_matmul(ta, tb, torch.ones(2, 2)))
    with pytest.raises(kiln.KilnError, match="cannot be multiplied"):
        kiln.mm(a, a)
    with pytest.raises(kiln.KilnError, match="mv"):
        kiln.mv(a, a)
    with pytest.raises(kiln.KilnError, match="same dtype"):
        kiln.mm(a, b.double())


def test_cross_dims():
    (a, ta), (b, tb) = both(arr(4, 3)), both(arr(1, 3))
    same(kiln.cross(a, b), torch.cross(ta, tb, dim=1))
    (c, tc), (d, td) = both(arr(3, 3)), both(arr(3, 3))
    same(kiln.cross(c, d), torch.cross(tc, td, dim=0))
    same(kiln.cross(c, d, dim=1), torch.cross(tc, td, dim=1))
    same(c.cross(d, dim=-1), tc.cross(td, dim=-1))
    with pytest.raises(kiln.KilnError, match="size 3"):
        kiln.cross(kiln.zeros(2, 2), kiln.zeros(2, 2))


def test_elementwise_functions_values_and_dtypes():
    a, b = arr(4, 5), arr(4, 5)
    a[0, :3] = [np.nan, 1.0, np.nan]
    b[0, :3] = [1.0, np.nan, np.nan]
    (ka, ta), (kb, tb) = both(a), both(b)
    for name in ("fmax", "fmin", "logaddexp2", "logical_xor", "float_power"):
        same(getattr(kiln, name)(ka, kb), getattr(torch, name)(ta, tb))
    for name in ("deg2rad", "rad2deg", "sgn", "sinc", "isposinf", "isneginf", "isreal", "msort"):
        same(getattr(kiln, name)(ka), getattr(torch, name)(ta))
    ki, ti = both(np.array([[3, -1, 0], [2, 5, -4]]))
    for name in ("deg2rad", "rad2deg", "sinc", "sgn", "isposinf", "msort"):
        same(getattr(kiln, name)(ki), getattr(torch, name)(ti))
    same(kiln.fmax(ki, kb[:2, :3]), torch.fmax(ti, tb[:2, :3]))
    same(kiln.float_power(ki, 2), torch.float_power(ti, 2))
    same(kiln.float_power(2, ka), torch.float_power(2, ta))
    same(kiln.logical_xor(ki, 0.0), torch.logical_xor(ti, torch.tensor(0.0)))
    inf = both(np.array([np.inf, -np.inf, 1.0, np.nan], dtype=np.float32))
    same(kiln.isposinf(inf[0]), torch.isposinf(inf[1]))
    same(kiln.isneginf(inf[0]), torch.isneginf(inf[1]))
    same(kiln.rsub(ka, kb, alpha=2), torch.rsub(ta, tb, alpha=2))
    same(kiln.rsub(ka, 3.0), torch.rsub(ta, 3.0))
    for p in (1, 2, 3.5, math.inf, 0):
        same(kiln.dist(ka.nan_to_num(), kb[:1].nan_to_num(), p), torch.dist(ta.nan_to_num(), tb[:1].nan_to_num(), p))


def test_isclose_allclose_equal():
    a = np.array([1.0, np.nan, np.inf, -np.inf, 1e-9, 1.0], dtype=np.float32)
    b = np.array([1.0 + 1e-6, np.nan, np.inf, np.inf, 0.0, 1.1], dtype=np.float32)
    (ka, ta), (kb, tb) = both(a), both(b)
    for kw in ({}, {"equal_nan": True}, {"rtol": 0.2}, {"atol": 0.0, "rtol": 0.0}):
        same(kiln.isclose(ka, kb, **kw), torch.isclose(ta, tb, **kw))
        assert kiln.allclose(ka[:1], kb[:1], **kw) == torch.allclose(ta[:1], tb[:1], **kw)
    same(ka.isclose(kb), ta.isclose(tb))
    ki, ti = both(np.array([1, 5, 100]))
    same(kiln.isclose(ki, ki + 1, atol=1), torch.isclose(ti, ti + 1, atol=1))
    assert kiln.equal(ki, ki.clone()) is True and kiln.equal(ki, ki[:2]) is False
    assert kiln.equal(ka, ka) == torch.equal(ta, ta)  # NaN != NaN
    with pytest.raises(kiln.KilnError, match="same dtype"):
        kiln.isclose(ka, ka.double())


def test_predicates_and_queries():
    k = kiln.zeros(2, 3, dtype=kiln.int16)
    assert kiln.is_tensor(k) and not kiln.is_tensor(np.zeros(2))
    assert kiln.numel(k) == 6 and kiln.is_floating_point(k) is False
    assert kiln.is_signed(k) and not kiln.is_signed(kiln.zeros(1, dtype=kiln.uint8)) and k.is_signed()
    assert kiln.is_same_size(k, kiln.ones(2, 3)) and not k.is_same_size(kiln.ones(3, 2))
    assert kiln.is_nonzero(kiln.tensor([2.0])) and not kiln.tensor(0).is_nonzero()
    with pytest.raises(kiln.KilnError, match="more than one value"):
        kiln.is_nonzero(k)
    with pytest.raises(kiln.KilnError, match="no values"):
        kiln.is_nonzero(kiln.zeros(0))
    assert kiln.get_default_dtype() == kiln.float32
    for f, t in ((kiln.int64, kiln.float32), (kiln.float32, kiln.int64), (kiln.bool, kiln.uint8),
                 (kiln.int8, kiln.bool), (kiln.float64, kiln.float16)):
        assert kiln.can_cast(f, t) == torch.can_cast(getattr(torch, f.name), getattr(torch, t.name))
    assert k.itemsize == 2 and k.is_cpu and not k.is_meta and k.get_device() == -1
    assert k.type() == "kiln.ShortTensor"
    assert k.type(kiln.float64).dtype == kiln.float64 and k.type(kiln.int16) is k
    assert k.type("torch.DoubleTensor").dtype == kiln.float64
    with pytest.raises(kiln.KilnValueError, match="invalid type"):
        k.type("torch.Floaty")
    n = k.new(4, 5)
    assert tuple(n.shape) == (4, 5) and n.dtype == kiln.int16
    assert k.new([1, 2]).numpy().tolist() == [1, 2] and tuple(k.new().shape) == (0,)


def test_transposes_sum_to_size_where_prelu():
    (k, t) = both(arr(2, 3, 4))
    same(k.mH, t.mH)
    same(k.adjoint(), t.adjoint())
    same(kiln.adjoint(k), torch.adjoint(t))
    same(k[0].H, t[0].H)
    with pytest.raises(kiln.KilnError, match="matrices"):
        k.H
    for size in ((3, 1), (1, 3, 4), (4,), (2, 1, 1), (1,)):
        same(k.sum_to_size(*size), t.sum_to_size(*size))
    same(k.sum_to_size((3, 4)), t.sum_to_size((3, 4)))
    with pytest.raises(kiln.KilnError, match="not expandable"):
        k.sum_to_size(5)
    same(k.where(k > 0, 0.0), t.where(t > 0, 0.0))
    (w, tw) = both(np.array([0.25], dtype=np.float32))
    same(k.prelu(w), t.prelu(tw))
    for name, args in (("narrow", (1, 1, 2)), ("permute", ((2, 0, 1),)), ("reshape", ((6, 4),)), ("select", (1, 2)),
                       ("transpose", (0, 2)), ("unsqueeze", (1,)), ("detach", ())):
        same(getattr(kiln, name)(k, *args), getattr(torch, name)(t, *args))
    same(kiln.t(k[0]), torch.t(t[0]))


def test_scatters_into_slices_values_and_gradients():
    x = arr(3, 4, 5)
    for name, src_shape, args in (("select_scatter", (3, 5), (1, -2)), ("slice_scatter", (3, 2, 5), (1, 1, None, 2)),
                                  ("slice_scatter", (3, 4, 5), ()), ("diagonal_scatter", (5, 3), (0, 0, 1)),
                                  ("diagonal_scatter", (3, 4), (1, 1, 2)), ("diagonal_scatter", (4, 3), (-1, 2, 0))):
        (k, t), (ks, ts) = both(x, True), both(arr(*src_shape), True)
        ko, to = getattr(kiln, name)(k, ks, *args), getattr(torch, name)(t, ts, *args)
        same(ko, to)
        g = arr(*x.shape)
        (ko * kiln.tensor(g)).sum().backward()
        (to * torch.tensor(g)).sum().backward()
        same(k.grad, t.grad)
        same(ks.grad, ts.grad)
    with pytest.raises(kiln.KilnError, match="src size"):
        kiln.select_scatter(kiln.zeros(3, 4), kiln.zeros(3), 0, 0)
    with pytest.raises(kiln.KilnIndexError, match="index 5"):
        kiln.select_scatter(kiln.zeros(3, 4), kiln.zeros(4), 0, 5)


def test_gradients_of_composed_functions():
    a, b = arr(3, 4), arr(3, 4)
    b[0, 0] = a[0, 0]
    a[1, 1] = 0.0
    cases = [("fmax", 2), ("fmin", 2), ("logaddexp2", 2), ("float_power", 2), ("sinc", 1), ("deg2rad", 1),
             ("rad2deg", 1), ("dist", 2), ("trapezoid", 1), ("cumulative_trapezoid", 1), ("diag", 1), ("fliplr", 1),
             ("hstack", 0), ("atleast_3d", 1), ("rsub", 2), ("diagflat", 1), ("cross", 2), ("vstack", 0),
             ("dstack", 0), ("column_stack", 0), ("flipud", 1), ("msort", 1), ("mm", 3)]
    for name, n in cases:
        (ka, ta), (kb, tb) = both(np.abs(a) + 0.5 if name == "float_power" else a, True), both(b, True)
        if n == 0:
            ko, to = getattr(kiln, name)([ka, kb]), getattr(torch, name)([ta, tb])
        elif n == 3:  # a 3x4 by 4x3 product
            ko, to = getattr(kiln, name)(ka, kb.t()), getattr(torch, name)(ta, tb.t())
        else:
            ko, to = getattr(kiln, name)(*[ka, kb][:n]), getattr(torch, name)(*[ta, tb][:n])
        g = RNG.standard_normal(tuple(to.shape)).astype(np.float64 if to.dtype == torch.float64 else np.float32)
        (ko * kiln.tensor(g)).sum().backward()
        (to * torch.tensor(g)).sum().backward()
        same(ka.grad, ta.grad, 1e-4)
        if n != 1:
            same(kb.grad, tb.grad, 1e-4)


def test_trapezoid_and_cumulative():
    y = arr(3, 5)
    (ky, ty) = both(y)
    (kx, tx) = both(np.sort(arr(5)))
    for kw_k, kw_t in (({}, {}), ({"dx": 0.5}, {"dx": 0.5}), ({"dim": 0}, {"dim": 0})):
        same(kiln.trapezoid(ky, **kw_k), torch.trapezoid(ty, **kw_t))
        same(kiln.cumulative_trapezoid(ky, **kw_k), torch.cumulative_trapezoid(ty, **kw_t))
    same(kiln.trapezoid(ky, kx), torch.trapezoid(ty, tx))
    same(kiln.trapz(ky, kx), torch.trapz(ty, tx))
    same(kiln.cumulative_trapezoid(ky, kx), torch.cumulative_trapezoid(ty, tx))
    (kx2, tx2) = both(np.sort(arr(3, 5), axis=1))
    same(kiln.trapezoid(ky, kx2), torch.trapezoid(ty, tx2))
    ki, ti = both(np.array([1, 4, 9]))
    same(kiln.trapezoid(ki), torch.trapezoid(ti))
    with pytest.raises(kiln.KilnError, match="one `x` value"):
        kiln.trapezoid(ky, kiln.tensor(arr(4)))


def test_combinations_unravel_range():
    (k, t) = both(np.array([3.0, 1.0, 4.0, 1.5], dtype=np.float32))
    for r in (0, 1, 2, 3, 5):
        for rep in (False, True):
            same(kiln.combinations(k, r, rep), torch.combinations(t, r, rep))
    (kc, tc) = both(arr(4), True)
    (kiln.combinations(kc, 2) * kiln.tensor(np.arange(12.0, dtype=np.float32).reshape(6, 2))).sum().backward()
    (torch.combinations(tc, 2) * torch.arange(12.0).reshape(6, 2)).sum().backward()
    same(kc.grad, tc.grad)
    with pytest.raises(kiln.KilnError, match="1D vector"):
        kiln.combinations(kiln.zeros(2, 2))
    idx = np.array([0, 7, 23, -1, 11])
    same(kiln.unravel_index(kiln.tensor(idx), (2, 3, 4)), torch.unravel_index(torch.tensor(idx), (2, 3, 4)))
    same(kiln.unravel_index(5, (3, 2)), torch.unravel_index(torch.tensor(5), (3, 2)))
    with pytest.raises(kiln.KilnIndexError, match="range"):
        kiln.unravel_index(kiln.tensor([24]), (2, 3, 4))
    with pytest.raises(TypeError, match="integer"):
        kiln.unravel_index(kiln.tensor([1.0]), (2,))
    for args in ((1, 4), (0, 1, 0.25), (5, 1, -1), (3,)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch.range is deprecated
            tr = torch.range(*args) if len(args) > 1 else torch.range(0, args[0])
        same(kiln.range(*args), tr)
    same(kiln.range(1, 3, dtype=kiln.int64), torch.range(1, 3, dtype=torch.int64))
    with pytest.raises(kiln.KilnValueError, match="step"):
        kiln.range(0, 1, 0)


def test_histogram():
    x = arr(100, lo=-3, hi=3)
    (k, t) = both(x)
    (w, tw) = both(arr(100, lo=0, hi=1))
    for kw in ({}, {"range": (-1.0, 2.0)}, {"density": True}):
        for bins in (7, 1):
            same(kiln.histogram(k, bins, **kw), torch.histogram(t, bins, **kw))
    same(kiln.histogram(k, 5, weight=w), torch.histogram(t, 5, weight=tw))
    edges = np.array([-3.0, -1.0, 0.0, 0.5, 3.0], dtype=np.float32)
    r = kiln.histogram(k, kiln.tensor(edges), density=True)
    same(r, torch.histogram(t, torch.tensor(edges), density=True))
    assert r.hist is r[0] and r.bin_edges is r[1]
    same(k.histogram(4), t.histogram(4))
    same(kiln.histogram(kiln.zeros(0), 3), torch.histogram(torch.zeros(0), 3))
    same(kiln.histogram(kiln.full((5,), 2.0), 4), torch.histogram(torch.full((5,), 2.0), 4))
    with pytest.raises(kiln.KilnError, match="floating"):
        kiln.histogram(kiln.tensor([1, 2]), 3)
    with pytest.raises(kiln.KilnError, match="same shape"):
        kiln.histogram(k, 3, weight=kiln.ones(3))


@pytest.mark.parametrize("name", ["hann_window", "hamming_window", "blackman_window", "bartlett_window"])
def test_windows(name):
    for n in (0, 1, 2, 7, 8):
        for periodic in (True, False):
            same(getattr(kiln, name)(n, periodic), getattr(torch, name)(n, periodic))
    same(getattr(kiln, name)(6, dtype=kiln.float64), getattr(torch, name)(6, dtype=torch.float64))
    with pytest.raises(kiln.KilnError, match="floating"):
        getattr(kiln, name)(4, dtype=kiln.int64)


def test_small_top_level_functions():
    (k, t) = both(arr(2, 3))
    same(kiln.fill(k, 2.5), torch.fill(t, 2.5))
    same(kiln.as_strided(k, (2, 2), (1, 2), 1), torch.as_strided(t, (2, 2), (1, 2), 1))
    r = kiln.randint_like(kiln.zeros(3, 4, dtype=kiln.int32), 2, 5)
    assert r.dtype == kiln.int32 and tuple(r.shape) == (3, 4) and r.numpy().min() >= 2 and r.numpy().max() < 5
    (ki, ti) = both(np.zeros((3, 2), dtype=np.float32))
    idx = np.array([0, 2, 0])
    (ks, ts) = both(arr(3, 2))
    same(kiln.index_reduce(ki, 0, kiln.tensor(idx), ks, "amax"),
         torch.index_reduce(ti, 0, torch.tensor(idx), ts, "amax"))


def test_aliases_are_the_functions_they_name():
    assert kiln.absolute is kiln.abs and kiln.multiply is kiln.mul and kiln.row_stack is kiln.vstack
    assert kiln.Tensor.exp_.__name__ == "exp_" and kiln.abs.__name__ == "abs"


def test_finfo_iinfo():
    for name in ("float16", "bfloat16", "float32", "float64"):
        k, t = kiln.finfo(getattr(kiln, name)), torch.finfo(getattr(torch, name))
        for attr in ("bits", "eps", "max", "min", "tiny", "smallest_normal", "resolution", "dtype"):
            assert getattr(k, attr) == getattr(t, attr), (name, attr)
        assert repr(k) == repr(t)
    assert kiln.finfo().eps == torch.finfo().eps
    for name in ("uint8", "int8", "int16", "int32", "int64"):
        k, t = kiln.iinfo(getattr(kiln, name)), torch.iinfo(getattr(torch, name))
        assert (k.bits, k.min, k.max, k.dtype, repr(k)) == (t.bits, t.min, t.max, t.dtype, repr(t))
    with pytest.raises(TypeError, match="floating"):
        kiln.finfo(kiln.int32)
    with pytest.raises(TypeError, match="integer"):
        kiln.iinfo(kiln.bool)


@pytest.mark.parametrize("name,args", [
    ("alias_copy", ()), ("detach_copy", ()), ("diagonal_copy", (1, 1, 2)), ("expand_copy", ((2, 2, 3, 4),)),
    ("permute_copy", ((2, 0, 1),)), ("select_copy", (1, -1)), ("slice_copy", (2, 1, None, 2)), ("slice_copy", ()),
    ("squeeze_copy", ()), ("t_copy", ()), ("transpose_copy", (0, 2)), ("unbind_copy", (1,)),
    ("unfold_copy", (2, 2, 1)), ("unsqueeze_copy", (0,)), ("view_copy", ((6, 4),)), ("split_copy", (2, 1)),
    ("split_with_sizes_copy", ([1, 2], 1)), ("as_strided_copy", ((2, 2), (1, 4), 1))])
def test_copy_variants(name, args):
    x = arr(2, 3, 4) if name != "t_copy" else arr(3, 4)
    differentiable = name not in ("detach_copy", "as_strided_copy")  # Kiln's as_strided has no gradient
    (k, t) = both(x, grad=differentiable)
    ko, to = getattr(kiln, name)(k, *args), getattr(torch, name)(t, *args)
    same(ko, to)
    outs = ko if isinstance(ko, tuple) else (ko,)
    touts = to if isinstance(to, tuple) else (to,)
    for o in outs:
        assert o.is_contiguous()
        if o.numel():
            assert o.data_ptr() != k.data_ptr()
    if differentiable:
        sum(o.sum() for o in outs).backward()
        sum(o.sum() for o in touts).backward()
        same(k.grad, t.grad)
    with kiln.no_grad():
        outs[0].zero_()
    assert (k.detach().numpy() == x).all()  # a copy: writing it leaves the input alone


def test_gradient():
    x = arr(4, 5)
    (k, t) = both(x)
    for kw in ({}, {"spacing": 0.5}, {"dim": 1}, {"dim": [0], "edge_order": 2}, {"spacing": [2.0, 0.25]},
               {"edge_order": 2, "spacing": 3.0}):
        same(kiln.gradient(k, **kw), torch.gradient(t, **kw))
    cx = np.sort(arr(5, lo=0, hi=10))
    for order in (1, 2):
        same(kiln.gradient(k, spacing=[kiln.tensor(cx)], dim=1, edge_order=order),
             torch.gradient(t, spacing=[torch.tensor(cx)], dim=1, edge_order=order), 1e-4)
    ki, ti = both(np.array([1, 4, 9, 16]))
    same(kiln.gradient(ki), torch.gradient(ti))
    (kg, tg) = both(x, True)
    sum(g.sum() * (i + 1) for i, g in enumerate(kiln.gradient(kg, edge_order=2))).backward()
    sum(g.sum() * (i + 1) for i, g in enumerate(torch.gradient(tg, edge_order=2))).backward()
    same(kg.grad, tg.grad, 1e-4)
    with pytest.raises(kiln.KilnValueError, match="at least edge_order"):
        kiln.gradient(kiln.zeros(2), edge_order=2)


def test_empty_strided_typename_bilinear_constant_pad_nd():
    e = kiln.empty_strided((2, 3), (1, 2), dtype=kiln.float64)
    assert tuple(e.shape) == (2, 3) and e.stride() == (1, 2) and e.dtype == kiln.float64 and not e.is_contiguous()
    assert tuple(kiln.empty_strided((0, 3), (3, 1)).shape) == (0, 3)
    with pytest.raises(kiln.KilnValueError, match="length of strides"):
        kiln.empty_strided((2, 3), (1,))
    assert kiln.typename(kiln.zeros(2)) == "kiln.FloatTensor" and kiln.typename(3) == torch.typename(3)
    assert kiln.typename(kiln.nn.Linear(2, 2)) == type(kiln.nn.Linear(2, 2)).__module__ + ".Linear"
    (a, ta), (b, tb), (w, tw), (bias, tbias) = both(arr(4, 3)), both(arr(4, 2)), both(arr(5, 3, 2)), both(arr(5))
    same(kiln.bilinear(a, b, w, bias), torch.bilinear(ta, tb, tw, tbias), 1e-4)
    for pad, value in (((1, 2), 0.0), ((1, 0, -1, 2), 3.5)):
        same(kiln.constant_pad_nd(a, pad, value), torch.constant_pad_nd(ta, pad, value))


def test_split_forms_narrow_copy_nonzero_static():
    (k, t) = both(arr(5, 4), True)
    for name, args in (("split_with_sizes", ([2, 3],)), ("unsafe_split", (2,)), ("unsafe_chunk", (2, 1)),
                       ("unsafe_split_with_sizes", ([1, 3], 1)), ("narrow_copy", (1, 1, 2))):
        same(getattr(kiln, name)(k, *args), getattr(torch, name)(t, *args))
        same(getattr(k, name)(*args), getattr(t, name)(*args))
    with pytest.raises(kiln.KilnError, match="sum exactly to 5"):
        kiln.split_with_sizes(k, [2, 2])
    m = np.array([[0, 1, 0], [2, 0, 3]])
    (km, tm) = both(m)
    for size, fill in ((2, -1), (3, -1), (5, 7), (0, -1)):
        same(kiln.nonzero_static(km, size=size, fill_value=fill), torch.nonzero_static(tm, size=size, fill_value=fill))
    same(km.nonzero_static(size=4), tm.nonzero_static(size=4))


# ---------------------------------------------------------------- review fixes (each against torch)

def test_random_wide_int64_spans_reach_the_whole_range():
    # spans over 2**63 draw 64 bits (torch's random64() % span): random_(-2**63, None) covers all of int64,
    # half of it positive, where 63 bits gave only [lo, lo + 2**63), all negative
    kiln.manual_seed(11)
    r = kiln.zeros(4000, dtype=kiln.int64).random_(-2 ** 63, None).numpy()
    t = torch.zeros(4000, dtype=torch.int64).random_(-2 ** 63, None).numpy()
    for a in (r, t):
        assert 0.4 < (a > 0).mean() < 0.6 and a.min() < -2 ** 62 and a.max() > 2 ** 62
    # [-2**63, 2**62): u mod span over 64 bits puts a quarter above 0, as torch's does
    r = kiln.zeros(8000, dtype=kiln.int64).random_(-2 ** 63, 2 ** 62).numpy()
    t = torch.zeros(8000, dtype=torch.int64).random_(-2 ** 63, 2 ** 62).numpy()
    for a in (r, t):
        assert 0.2 < (a > 0).mean() < 0.3 and a.max() < 2 ** 62 and a.min() < -2 ** 62
    r = kiln.zeros(4000, dtype=kiln.int64).random_(-7, 2 ** 63 - 1).numpy()
    assert r.min() >= -7 and r.max() > 2 ** 62 and 0.4 < (r > 2 ** 62).mean() < 0.6
    r = kiln.zeros(2000, dtype=kiln.int64).random_(-2 ** 62, 2 ** 62).numpy()  # span 2**63 exactly
    assert r.min() >= -2 ** 62 and r.max() < 2 ** 62 and 0.4 < (r > 0).mean() < 0.6


@pytest.mark.parametrize("dt,args", [
    ("uint8", (0, 300)), ("uint8", (-3, 3)), ("uint8", (300,)), ("int8", (0, 200)), ("int8", (200, None)),
    ("bool", (0, 5)), ("bool", (-1, 1)), ("bool", (5, None)), ("float16", (0, 100000)), ("float16", (-70000, 0)),
    ("int32", (0, 2 ** 40)), ("int16", (-2 ** 20, 0)), ("uint8", (-2 ** 63, None)), ("float16", (-2 ** 63, None)),
    ("uint8", (0, 256)), ("int8", (-128, 128)), ("bool", (0, 2)), ("float16", (0, 2049)),
    ("int32", (-2 ** 31, 2 ** 31)), ("bfloat16", (0, 300)), ("float32", (0, 2 ** 30)), ("bfloat16", (-2 ** 63, None))])
def test_random_from_to_checked_against_the_dtype(dt, args):
    # torch's check_from_to: from and to - 1 must be values of the dtype (an error naming which), floating
    # dtypes within their finite range, with torch's warning past the integers they hold exactly
    def run(lib):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                x = lib.zeros(64, dtype=getattr(lib, dt)).random_(*args)
                err = None
            except (RuntimeError, NotImplementedError) as e:
                x, err = None, str(e)
        return x, err, [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    kx, kerr, kwarn = run(kiln)
    tx, terr, twarn = run(torch)
    assert (kerr is None) == (terr is None), (kerr, terr)
    if terr is not None:
        for phrase in ("from is out of bounds", "to - 1 is out of bounds"):
            assert (phrase in kerr) == (phrase in terr), (kerr, terr)
        return
    assert bool(kwarn) == bool(twarn), (kwarn, twarn)
    lo, hi = (0, args[0]) if len(args) == 1 else args
    k = kx.to(kiln.float64).numpy()
    if hi is not None:
        assert k.min() >= lo and k.max() <= hi - 1
    assert np.isfinite(k).all()


def test_histogram_range_ends_and_edges_in_the_input_dtype():
    # range= is rounded to the input's dtype and the bins found in it, as torch: float32 values at the ends of
    # a range that float32 cannot hold exactly were dropped, and values on the edges fell in other bins
    k, t = kiln.tensor([-3.7, 0.0, 6.3]), torch.tensor([-3.7, 0.0, 6.3])
    same(kiln.histogram(k, 2, range=(-3.7, 6.3)), torch.histogram(t, 2, range=(-3.7, 6.3)))
    k, t = kiln.tensor([0.1, 0.2, 0.3]), torch.tensor([0.1, 0.2, 0.3])
    same(kiln.histogram(k, 2, range=(0.1, 0.3)), torch.histogram(t, 2, range=(0.1, 0.3)))
    rng = np.random.default_rng(7)
    for ndt in (np.float32, np.float64):
        for trial in range(40):
            bins = int(rng.integers(1, 6))  # torch's linspace rounds more bins differently with its vector width
            lo = float(rng.choice([0.0, -1.0, 0.1, -3.7])) + float(rng.uniform(-1, 1))
            hi = lo + float(rng.choice([1.0, 0.3, 7.0, 10.0]))
            d = np.concatenate([np.linspace(lo, hi, bins + 1), rng.uniform(lo, hi, 20), [lo, hi]]).astype(ndt)
            for kw in ({"range": (lo, hi)}, {}):
                kr = kiln.histogram(kiln.from_numpy(d.copy()), bins, **kw)
                tr = torch.histogram(torch.from_numpy(d.copy()), bins, **kw)
                assert (kr.bin_edges.numpy() == tr.bin_edges.numpy()).all(), (ndt, bins, lo, hi, kw)
                assert (kr.hist.numpy() == tr.hist.numpy()).all(), (ndt, bins, lo, hi, kw)


def test_as_strided_default_offset_is_the_inputs():
    a = np.arange(24.0).reshape(2, 3, 4)
    (k, t) = both(a)
    same(kiln.as_strided(k[1], (2, 2), (1, 2)), torch.as_strided(t[1], (2, 2), (1, 2)))
    same(kiln.as_strided_copy(k[1], (2, 2), (1, 2)), torch.as_strided_copy(t[1], (2, 2), (1, 2)))
    same(kiln.as_strided(k[1], (2, 2), (1, 2), 1), torch.as_strided(t[1], (2, 2), (1, 2), 1))
    same(kiln.as_strided_copy(k[1], (2, 2), (1, 2), 0), torch.as_strided_copy(t[1], (2, 2), (1, 2), 0))


def test_scatter_with_a_scalar_value():
    idx = np.array([[0], [2], [1]])
    ki, ti = kiln.tensor(idx), torch.tensor(idx)
    for dt in (np.float32, np.int32):
        (k, t) = both(np.zeros((3, 4), dtype=dt))
        same(k.scatter_(1, ki, 1.0), t.scatter_(1, ti, 1.0))  # the one-hot idiom
        same(kiln.scatter(k, 1, ki, value=2), torch.scatter(t, 1, ti, value=2))
        same(k.scatter(1, ki, 3), t.scatter(1, ti, 3))
        same(k.scatter_(1, ki, value=1.5), t.scatter_(1, ti, value=1.5))  # truncated into int32, as torch
        same(kiln.ones(3, 4).scatter_(1, ki, 3.0, reduce="multiply"),
             torch.ones(3, 4).scatter_(1, ti, 3.0, reduce="multiply"))
    (k, t) = both(np.zeros((3, 4), dtype=np.float32))
    src = np.ones((3, 1), dtype=np.float32)
    same(k.scatter_add_(1, ki, kiln.tensor(src)), t.scatter_add_(1, ti, torch.tensor(src)))
    for fn in (lambda lib, x, i: x.scatter_add_(1, i, 1.0), lambda lib, x, i: lib.scatter_add(x, 1, i, 1.0)):
        with pytest.raises(TypeError):
            fn(torch, t, ti)
        with pytest.raises(TypeError, match="argument 'src' must be a kiln.Tensor, not float"):
            fn(kiln, k, ki)


def test_typename_of_classes_and_functions():
    class Local:
        pass
    for obj in (np.ndarray, len, int, np.zeros(1), 3, "s", Local, Local(), math.sqrt, np.float32(1.0), warnings.warn):
        assert kiln.typename(obj) == torch.typename(obj), obj


def test_gradient_dtype_with_coordinates_and_repeated_dims():
    y = np.array([1.0, 4.0, 9.0, 16.0])
    c = np.array([0.0, 1.0, 3.0, 4.0])
    for ydt, cdt in ((np.float32, np.float64), (np.float16, np.int64), (np.int64, np.float16), (np.int64, np.int64),
                     (np.float64, np.float32), (np.float32, np.float32)):
        (k, t), (kc, tc) = both(y.astype(ydt)), both(c.astype(cdt))
        for order in (1, 2):
            same(kiln.gradient(k, spacing=(kc,), edge_order=order), torch.gradient(t, spacing=(tc,), edge_order=order),
                 1e-3)
    x = arr(3, 3)
    for dims in ((0, 0), (1, -1)):
        with pytest.raises(RuntimeError, match="appears multiple times"):
            torch.gradient(torch.tensor(x), dim=dims)
        with pytest.raises(kiln.KilnError, match=f"dim {dims[0] % 2} appears multiple times in the list of dims"):
            kiln.gradient(kiln.tensor(x), dim=dims)


def test_sinc_low_precision_computed_in_float32():
    v = np.array([4.0, 0.5, 1.0, 0.0, -3.0, 2.5, 100.0, 1000.0])
    for dt in (torch.float16, torch.bfloat16):
        k, t = kiln.tensor(v, dtype=kdt(dt)), torch.tensor(v, dtype=dt)
        for ko, to in ((kiln.sinc(k), torch.sinc(t)), (kiln.tensor(v, dtype=kdt(dt)).sinc_(), t.clone().sinc_())):
            assert ko.dtype == kdt(dt)
            same(ko.to(kiln.float32), to.float(), 1e-6)


def test_bernoulli_nan_logical_inplace_scalar_and_bernoulli_p_with_grad():
    for p in ([float("nan")], [0.5, float("nan")]):
        with pytest.raises(RuntimeError):
            torch.bernoulli(torch.tensor(p))
        with pytest.raises(kiln.KilnError, match=r"in \[0, 1\]"):
            kiln.bernoulli(kiln.tensor(p))
        with pytest.raises(kiln.KilnError, match=r"in \[0, 1\]"):
            kiln.zeros(2).bernoulli_(kiln.tensor(p))
    for name in ("logical_and_", "logical_or_", "logical_xor_"):
        for other in (1, 1.0, True):
            with pytest.raises(TypeError):
                getattr(torch.tensor([1.0, 0.0]), name)(other)
            with pytest.raises(TypeError, match=f"{name}\\(\\): argument 'other'"):
                getattr(kiln.tensor([1.0, 0.0]), name)(other)
        (k, t), (ko, to) = both(np.array([1.0, 0.0, 2.0])), both(np.array([1.0, 1.0, 0.0]))
        same(getattr(k, name)(ko), getattr(t, name)(to))
    kp, tp = both(np.array([0.0, 1.0, 1.0]), grad=True)
    tr = torch.zeros(3).bernoulli_(tp)
    kr = kiln.zeros(3).bernoulli_(kp)
    assert kr.numpy().tolist() == tr.detach().numpy().tolist() == [0.0, 1.0, 1.0]
    assert kiln.bernoulli(kp).numpy().tolist() == [0.0, 1.0, 1.0]
