# torch's math functions that Kiln writes with its own ops (python/kiln/_math.py), against PyTorch itself:
# a number as the first argument of add/sub/mul/div/..., trace, diag_embed, rot90, hypot, xlogy, diff, kron,
# meshgrid, cartesian_prod, block_diag, tril/triu_indices, aminmax, std_mean/var_mean, logcumsumexp, isin,
# bucketize, searchsorted, histc, unique, unique_consecutive, quantile/nanquantile, take_along_dim without
# dim, Tensor.new_tensor, Tensor.index_reduce, kiln.special and kiln.linalg: values, dtypes, shapes,
# gradients and refusals.
import importlib
import math

import numpy as np
import pytest

import kiln

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(5)


def both(a, grad=False):
    return kiln.tensor(a, requires_grad=grad), torch.tensor(a, requires_grad=grad)


def dt(k):
    return str(k.dtype).split(".")[-1]


def same(k, t, tol=1e-5):
    if isinstance(t, (tuple, list)):
        assert len(k) == len(t)
        for a, b in zip(k, t):
            same(a, b, tol)
        return
    assert tuple(k.shape) == tuple(t.shape), (tuple(k.shape), tuple(t.shape))
    assert dt(k) == dt(t), (k.dtype, t.dtype)
    kn, tn = np.asarray(k.detach().numpy()), t.detach().numpy()
    if t.dtype.is_floating_point:
        assert np.allclose(kn, tn, rtol=tol, atol=tol, equal_nan=True), (kn, tn)
    else:
        assert (kn == tn).all(), (kn, tn)


def grads(kfn, tfn, *arrays, tol=1e-5):
    """kfn and tfn on the same float64 arrays: equal values and equal gradients of a weighted sum."""
    ks = [kiln.tensor(a, requires_grad=True) for a in arrays]
    ts = [torch.tensor(a, requires_grad=True) for a in arrays]
    ko, to = kfn(*ks), tfn(*ts)
    same(ko, to, tol)
    w = RNG.standard_normal(tuple(to.shape))
    (ko * kiln.tensor(w)).sum().backward()
    (to * torch.tensor(w)).sum().backward()
    for k, t in zip(ks, ts):
        assert t.grad is not None and k.grad is not None
        assert np.allclose(k.grad.numpy(), t.grad.numpy(), rtol=tol, atol=tol, equal_nan=True), \
            (k.grad.numpy(), t.grad.numpy())


@pytest.mark.parametrize("name", ["add", "sub", "mul", "div", "true_divide", "floor_divide", "remainder", "pow",
                                  "xlogy"])
@pytest.mark.parametrize("number", [3, 2.5, -2, True])
@pytest.mark.parametrize("dtype", ["float32", "float64", "int64", "int32", "bool"])
def test_number_first_as_torch(name, number, dtype):
    a = np.array([1, 2, 4, 0], dtype=dtype) if dtype != "bool" else np.array([True, False, True, True])
    k, t = both(a)
    try:
        want = getattr(torch, name)(number, t)
    except Exception as e:  # noqa: BLE001  (torch refuses it: so must Kiln)
        with pytest.raises(Exception):
            getattr(kiln, name)(number, k)
        return
    same(getattr(kiln, name)(number, k), want)


def test_number_first_alpha_rounding_and_grad():
    k, t = both(np.array([1.0, -2.0, 4.0]), True)
    same(kiln.add(3, k, alpha=2), torch.add(3, t, alpha=2))
    same(kiln.sub(3, k, alpha=0.5), torch.sub(3, t, alpha=0.5))
    ki, ti = both(np.array([3, -7, 2]))
    same(kiln.sub(1, ki, alpha=2), torch.sub(1, ti, alpha=2))
    with pytest.raises(Exception, match="alpha"):
        kiln.add(3, ki, alpha=0.5)
    for mode in ("trunc", "floor"):
        same(kiln.div(7, ki, rounding_mode=mode), torch.div(7, ti, rounding_mode=mode))
        same(kiln.div(7.5, ki, rounding_mode=mode), torch.div(7.5, ti, rounding_mode=mode))
    grads(lambda x: kiln.pow(2, x) + kiln.sub(1, x) * kiln.div(3, x), lambda x: torch.pow(2, x) + torch.sub(1, x) *
          torch.div(3, x), np.array([1.0, -2.0, 4.0]))
    # torch refuses a number first for these: Kiln's still take tensors only
    for name in ("maximum", "minimum", "atan2", "fmod"):
        with pytest.raises(TypeError):
            getattr(kiln, name)(2.0, k)
        with pytest.raises(TypeError):
            getattr(torch, name)(2.0, t)


def test_trace_diag_embed_rot90():
    a = RNG.standard_normal((3, 4))
    grads(kiln.trace, torch.trace, a)
    same(kiln.trace(kiln.tensor([[1, 2], [3, 4]], dtype=kiln.int32)), torch.trace(torch.tensor([[1, 2], [3, 4]],
                                                                                               dtype=torch.int32)))
    with pytest.raises(ValueError, match="matrix"):
        kiln.trace(kiln.ones(3))
    b = RNG.standard_normal((2, 3))
    for off, d1, d2 in [(0, -2, -1), (1, 0, 2), (-2, 2, 0), (0, 1, 2)]:
        grads(lambda x: kiln.diag_embed(x, off, d1, d2), lambda x: torch.diag_embed(x, off, d1, d2), b)
    same(kiln.diag_embed(kiln.zeros(2, 0), 1), torch.diag_embed(torch.zeros(2, 0), 1))
    c = RNG.standard_normal((2, 3, 4))
    for k in range(-2, 6):
        for dims in [(0, 1), (1, 2), (2, 0)]:
            grads(lambda x: kiln.rot90(x, k, dims), lambda x: torch.rot90(x, k, dims), c)
    assert tuple(kiln.tensor(c).rot90().shape) == tuple(torch.tensor(c).rot90().shape)
    with pytest.raises(ValueError, match="different"):
        kiln.rot90(kiln.tensor(c), 1, (1, 1))


def test_hypot_xlogy_special():
    x = np.array([3.0, 0.0, -1.5, np.inf, 2.0, 0.0])
    y = np.array([4.0, 2.0, 0.5, np.nan, 0.0, np.nan])
    kx, tx = both(x)
    ky, ty = both(y)
    same(kiln.hypot(kx, ky), torch.hypot(tx, ty))
    same(kx.hypot(ky), tx.hypot(ty))
    grads(kiln.hypot, torch.hypot, np.array([3.0, -1.0]), np.array([4.0, 2.0]))
    with pytest.raises(ValueError, match="floating"):
        kiln.hypot(kiln.tensor([1]), kiln.tensor([2]))
    same(kiln.xlogy(kx, ky), torch.xlogy(tx, ty))
    same(kiln.xlogy(kiln.tensor([0, 2]), 3), torch.xlogy(torch.tensor([0, 2]), 3))
    same(kiln.special.xlog1py(kx, ky), torch.special.xlog1py(tx, ty))
    grads(kiln.xlogy, torch.xlogy, np.array([0.0, 2.0, -1.0]), np.array([3.0, 0.5, 2.0]))
    grads(kiln.special.xlog1py, torch.special.xlog1py, np.array([0.0, 2.0, -1.0]), np.array([3.0, 0.5, 2.0]))
    p = np.array([0.0, 0.2, 0.5, 1.0, -0.5, np.nan, 3.0])
    kp, tp = both(p)
    for name in ("expit", "erf", "erfc", "erfinv", "entr", "sinc", "ndtr", "round", "exp2", "expm1", "log1p"):
        same(getattr(kiln.special, name)(kp), getattr(torch.special, name)(tp))
    same(kiln.special.logit(kp), torch.special.logit(tp))
    same(kiln.special.logit(kp, 1e-3), torch.special.logit(tp, 1e-3))
    for name in ("softmax", "log_softmax"):
        same(getattr(kiln.special, name)(kiln.tensor([[1.0, 2.0]]), 1, dtype=kiln.float64),
             getattr(torch.special, name)(torch.tensor([[1.0, 2.0]]), 1, dtype=torch.float64))
    same(kiln.special.logsumexp(kiln.tensor([[1.0, 2.0]]), 1), torch.special.logsumexp(torch.tensor([[1.0, 2.0]]), 1))
    # entr's gradient at 0 is 0 (torch's -inf): not compared
    points = {"sinc": [0.0, 0.3, 1.5], "entr": [0.1, 0.7, 1.5], "ndtr": [0.0, -0.3, 1.5], "logit": [0.2, 0.3, 0.7],
              "expit": [0.0, 0.3, -1.5]}
    for name, at in points.items():
        grads(getattr(kiln.special, name), getattr(torch.special, name), np.array(at))
    # the gamma and Bessel family: tests/python/test_special_gamma_vs_torch.py
    assert kiln.special.gammaln is kiln.lgamma and kiln.special.psi is kiln.digamma


def test_diff_kron_meshgrid_cartesian_block_diag():
    a = RNG.standard_normal((3, 5))
    for n, dim in [(1, -1), (2, 1), (0, 0), (3, 0), (7, 1)]:
        grads(lambda x: kiln.diff(x, n, dim), lambda x: torch.diff(x, n, dim), a)
    grads(lambda x, p, q: kiln.diff(x, 1, 0, p, q), lambda x, p, q: torch.diff(x, 1, 0, p, q), a,
          RNG.standard_normal((1, 5)), RNG.standard_normal((2, 5)))
    kb, tb = both(np.array([True, False, False, True]))
    same(kiln.diff(kb), torch.diff(tb))
    ki, ti = both(np.array([1, 4, 9], dtype=np.int32))
    same(ki.diff(), ti.diff())
    with pytest.raises(ValueError, match="one-dimensional"):
        kiln.diff(kiln.tensor(1.0))
    grads(kiln.kron, torch.kron, RNG.standard_normal((2, 3)), RNG.standard_normal((4, 1, 2)))
    same(kiln.kron(kiln.tensor([1, 2]), kiln.tensor([[1], [3]])), torch.kron(torch.tensor([1, 2]),
                                                                             torch.tensor([[1], [3]])))
    kx, tx = both(np.arange(3.0))
    ky, ty = both(np.arange(4.0))
    kz, tz = both(np.arange(2.0))
    for ind in ("ij", "xy"):
        same(kiln.meshgrid(kx, ky, kz, indexing=ind), torch.meshgrid(tx, ty, tz, indexing=ind))
        same(kiln.meshgrid([kx, ky], indexing=ind), torch.meshgrid([tx, ty], indexing=ind))
    same(kiln.meshgrid(kx), torch.meshgrid(tx, indexing="ij"))
    same(kiln.cartesian_prod(kx, ky, kz), torch.cartesian_prod(tx, ty, tz))
    same(kiln.cartesian_prod(kx), torch.cartesian_prod(tx))
    grads(lambda a, b: kiln.cartesian_prod(a, b), lambda a, b: torch.cartesian_prod(a, b), np.arange(3.0),
          np.arange(2.0))
    grads(lambda a, b, c: kiln.block_diag(a, b, c), lambda a, b, c: torch.block_diag(a, b, c),
          RNG.standard_normal((2, 3)), RNG.standard_normal(4), np.array(5.0))
    same(kiln.block_diag(kiln.tensor([[1, 2]]), kiln.tensor([[0.5]])),
         torch.block_diag(torch.tensor([[1, 2]]), torch.tensor([[0.5]])))
    for r, c, off in [(3, 3, 0), (4, 2, 1), (3, 5, -1), (0, 3, 0), (3, 3, 5)]:
        same(kiln.tril_indices(r, c, off), torch.tril_indices(r, c, off))
        same(kiln.triu_indices(r, c, off), torch.triu_indices(r, c, off))
    with pytest.raises(ValueError, match="indexing"):
        kiln.meshgrid(kx, indexing="yx")


def test_reductions_aminmax_std_mean_logcumsumexp():
    a = RNG.standard_normal((3, 4))
    k, t = both(a)
    same(kiln.aminmax(k), tuple(torch.aminmax(t)))
    r = kiln.aminmax(k, dim=1, keepdim=True)
    same((r.min, r.max), tuple(torch.aminmax(t, dim=1, keepdim=True)))
    same(k.aminmax(dim=0), tuple(t.aminmax(dim=0)))
    for kw in [{}, {"dim": 1}, {"dim": 0, "keepdim": True}, {"dim": 1, "correction": 0}]:
        same(kiln.std_mean(k, **kw), torch.std_mean(t, **kw))
        same(kiln.var_mean(k, **kw), torch.var_mean(t, **kw))
    same(kiln.var_mean(k, False), torch.var_mean(t, False))
    for dim in (0, 1, -1):
        grads(lambda x: kiln.logcumsumexp(x, dim), lambda x: torch.logcumsumexp(x, dim), a)
    x = np.array([-1000.0, 0.0, 1000.0, -np.inf, np.nan, 3.0])
    same(kiln.logcumsumexp(kiln.tensor(x), 0), torch.logcumsumexp(torch.tensor(x), 0))
    x = np.array([-np.inf, -np.inf, 2.0, np.inf, 1.0])
    same(kiln.tensor(x).logcumsumexp(0), torch.tensor(x).logcumsumexp(0))
    same(kiln.logcumsumexp(kiln.zeros(0, 3), 0), torch.logcumsumexp(torch.zeros(0, 3), 0))
    with pytest.raises(ValueError, match="floating"):
        kiln.logcumsumexp(kiln.tensor([1, 2]), 0)


def test_isin_bucketize_searchsorted_histc():
    e = np.array([[1, 2, 3], [4, 5, 2]])
    ke, te = both(e)
    kt, tt = both(np.array([2, 5, 9]))
    same(kiln.isin(ke, kt), torch.isin(te, tt))
    same(kiln.isin(ke, kt, invert=True), torch.isin(te, tt, invert=True))
    same(kiln.isin(ke, 2), torch.isin(te, 2))
    same(kiln.isin(kiln.tensor([np.nan, 1.0]), kiln.tensor([np.nan, 1.0])),
         torch.isin(torch.tensor([np.nan, 1.0]), torch.tensor([np.nan, 1.0])))
    b = np.array([0.0, 1.0, 1.0, 2.5])
    kb, tb = both(b)
    kx, tx = both(np.array([[-1.0, 1.0, 2.0], [2.5, 9.0, np.nan]]))
    for right in (False, True):
        same(kiln.bucketize(kx, kb, right=right), torch.bucketize(tx, tb, right=right))
        same(kiln.bucketize(kx, kb, right=right, out_int32=True), torch.bucketize(tx, tb, right=right,
                                                                                  out_int32=True))
        same(kiln.searchsorted(kb, kx, right=right), torch.searchsorted(tb, tx, right=right))
    same(kiln.bucketize(1.0, kb), torch.bucketize(1.0, tb))
    same(kiln.searchsorted(kb, 1.0, side="right"), torch.searchsorted(tb, 1.0, side="right"))
    seq = np.sort(RNG.standard_normal((2, 3, 5)), -1)
    vals = RNG.standard_normal((2, 3, 4))
    same(kiln.searchsorted(kiln.tensor(seq), kiln.tensor(vals)), torch.searchsorted(torch.tensor(seq),
                                                                                   torch.tensor(vals)))
    unsorted = np.array([3.0, 1.0, 2.0])
    order = np.argsort(unsorted)
    same(kiln.searchsorted(kiln.tensor(unsorted), kiln.tensor([1.5, 3.0]), sorter=kiln.tensor(order)),
         torch.searchsorted(torch.tensor(unsorted), torch.tensor([1.5, 3.0]), sorter=torch.tensor(order)))
    with pytest.raises(ValueError, match="opposites"):
        kiln.searchsorted(kb, kx, side="left", right=True)
    with pytest.raises(ValueError, match="must match"):
        kiln.searchsorted(kiln.tensor(seq), kiln.tensor([1.0]))
    with pytest.raises(ValueError, match="1 dimension"):
        kiln.bucketize(kx, kiln.tensor(seq))
    h = np.array([1.0, 2.0, 1.0, 3.0, -4.0, 2.999, 0.0])
    kh, th = both(h)
    for bins, lo, hi in [(4, 0, 3), (5, 0, 0), (3, 1, 2), (100, 0, 0)]:
        same(kiln.histc(kh, bins, lo, hi), torch.histc(th, bins, lo, hi))
    same(kh.histc(bins=3), th.histc(bins=3))
    same(kiln.histc(kiln.tensor([2.0, 2.0]), 4), torch.histc(torch.tensor([2.0, 2.0]), 4))
    with pytest.raises(ValueError, match="floating"):
        kiln.histc(kiln.tensor([1, 2]))


def test_unique_and_unique_consecutive():
    a = np.array([[3, 1, 3], [2, 1, 1], [3, 1, 3]])
    k, t = both(a)
    for inv in (False, True):
        for cnt in (False, True):
            same(kiln.unique(k, return_inverse=inv, return_counts=cnt),
                 torch.unique(t, return_inverse=inv, return_counts=cnt))
            same(kiln.unique_consecutive(k, return_inverse=inv, return_counts=cnt),
                 torch.unique_consecutive(t, return_inverse=inv, return_counts=cnt))
            for dim in (0, 1):
                same(kiln.unique(k, return_inverse=inv, return_counts=cnt, dim=dim),
                     torch.unique(t, return_inverse=inv, return_counts=cnt, dim=dim))
                same(kiln.unique_consecutive(k, return_inverse=inv, return_counts=cnt, dim=dim),
                     torch.unique_consecutive(t, return_inverse=inv, return_counts=cnt, dim=dim))
    f = np.array([2.0, np.nan, 1.0, np.nan, 2.0])
    same(kiln.unique(kiln.tensor(f), return_counts=True), torch.unique(torch.tensor(f), return_counts=True))
    same(kiln.tensor(f).unique(), torch.tensor(f).unique())
    same(kiln.unique(kiln.tensor([True, False, True])), torch.unique(torch.tensor([True, False, True])))
    same(kiln.unique(kiln.zeros(0), return_counts=True), torch.unique(torch.zeros(0), return_counts=True))
    same(kiln.unique_consecutive(kiln.zeros(0)), torch.unique_consecutive(torch.zeros(0)))


@pytest.mark.parametrize("interpolation", ["linear", "lower", "higher", "midpoint", "nearest"])
def test_quantile_as_torch(interpolation):
    a = RNG.standard_normal((4, 5))
    tied = a.copy()
    tied[1, 1] = tied[1, 3] = tied[1, 4]  # ties: values only (which of the tied elements gets the gradient
    for dim in (None, 1):                   # depends on the sort's order among equal values)
        same(kiln.quantile(kiln.tensor(tied), 0.5, dim, interpolation=interpolation),
             torch.quantile(torch.tensor(tied), 0.5, dim, interpolation=interpolation))
    for q in (0.0, 0.3, 0.5, 1.0, np.array([0.1, 0.625, 0.9])):
        for dim, keepdim in [(None, False), (None, True), (1, False), (0, True), (-1, True)]:
            def kf(x):
                qq = kiln.tensor(q) if isinstance(q, np.ndarray) else q
                return kiln.quantile(x, qq, dim, keepdim, interpolation=interpolation)

            def tf(x):
                qq = torch.tensor(q) if isinstance(q, np.ndarray) else q
                return torch.quantile(x, qq, dim, keepdim, interpolation=interpolation)
            grads(kf, tf, a)
    n = a.copy()
    n[0, 2] = np.nan
    n[2, :] = np.nan
    kn, tn = both(n)
    for dim in (None, 0, 1):
        same(kiln.quantile(kn, 0.4, dim, interpolation=interpolation),
             torch.quantile(tn, 0.4, dim, interpolation=interpolation))
        same(kiln.nanquantile(kn, 0.4, dim, interpolation=interpolation),
             torch.nanquantile(tn, 0.4, dim, interpolation=interpolation))
        same(kn.nanquantile(kiln.tensor([0.25, 0.75], dtype=kiln.float64), dim, interpolation=interpolation),
             tn.nanquantile(torch.tensor([0.25, 0.75], dtype=torch.float64), dim, interpolation=interpolation))
    same(kiln.quantile(kiln.tensor(2.0), 0.5), torch.quantile(torch.tensor(2.0), 0.5))


def test_quantile_refusals():
    with pytest.raises(ValueError, match="float or double"):
        kiln.quantile(kiln.tensor([1, 2]), 0.5)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        kiln.quantile(kiln.tensor([1.0, 2.0]), 1.5)
    with pytest.raises(ValueError, match="interpolation"):
        kiln.quantile(kiln.tensor([1.0, 2.0]), 0.5, interpolation="cubic")
    with pytest.raises(ValueError, match="non-empty"):
        kiln.quantile(kiln.zeros(0), 0.5)


def test_take_along_dim_flat_new_tensor_index_reduce():
    a = RNG.standard_normal((3, 4))
    idx = np.array([[0, 11], [5, 3]])
    grads(lambda x: kiln.take_along_dim(x, kiln.tensor(idx)), lambda x: torch.take_along_dim(x, torch.tensor(idx)),
          a)
    k, t = both(a)
    same(k.take_along_dim(kiln.tensor(idx)), t.take_along_dim(torch.tensor(idx)))
    ki = kiln.zeros(2, dtype=kiln.int32)
    n = ki.new_tensor([1, 2])
    assert n.dtype == kiln.int32 and n.numpy().tolist() == [1, 2]
    assert k.new_tensor(3.5).dtype == kiln.float64
    assert k.new_tensor([1], dtype=kiln.int64).dtype == kiln.int64
    src = RNG.standard_normal((3, 4))
    index = np.array([0, 2, 0, 0])
    for reduce in ("prod", "mean", "amax", "amin"):
        for include_self in (True, False):
            grads(lambda x, s: x.index_reduce(1, kiln.tensor(index), s, reduce, include_self=include_self),
                  lambda x, s: x.index_reduce(1, torch.tensor(index), s, reduce, include_self=include_self),
                  a, src)
    ki, ti = both(np.array([5, 1, 7], dtype=np.int32))
    for reduce in ("prod", "mean", "amax", "amin"):
        same(ki.index_reduce(0, kiln.tensor([0, 0]), kiln.tensor([2, 3], dtype=kiln.int32), reduce),
             ti.index_reduce(0, torch.tensor([0, 0]), torch.tensor([2, 3], dtype=torch.int32), reduce))
    x = kiln.ones(3)
    assert x.index_reduce_(0, kiln.tensor([1]), kiln.tensor([4.0]), "prod") is x
    assert x.numpy().tolist() == [1, 4, 1]
    with pytest.raises(ValueError, match="prod, mean, amax or amin"):
        x.index_reduce(0, kiln.tensor([1]), kiln.tensor([4.0]), "sum")


def test_linalg_as_torch():
    a = RNG.standard_normal((2, 3, 4))
    for ord in (2, 1, 3, 0.5, -1, np.inf, -np.inf, 0):
        for dim in (None, 1, (0, 2)):
            for keepdim in (False, True):
                same(kiln.linalg.vector_norm(kiln.tensor(a), ord, dim, keepdim),
                     torch.linalg.vector_norm(torch.tensor(a), ord, dim, keepdim))
        if ord != 0:
            grads(lambda x: kiln.linalg.vector_norm(x, ord, (1, 2)), lambda x: torch.linalg.vector_norm(x, ord, (1, 2)),
                  a)
    for ord in ("fro", 1, -1, np.inf, -np.inf, "nuc", 2, -2):  # the last three from the singular values
        grads(lambda x: kiln.linalg.matrix_norm(x, ord), lambda x: torch.linalg.matrix_norm(x, ord), a)
        same(kiln.linalg.matrix_norm(kiln.tensor(a), ord, (0, 2), True),
             torch.linalg.matrix_norm(torch.tensor(a), ord, (0, 2), True))
        same(kiln.linalg.norm(kiln.tensor(a[0]), ord), torch.linalg.norm(torch.tensor(a[0]), ord))
    same(kiln.linalg.norm(kiln.tensor(a)), torch.linalg.norm(torch.tensor(a)))
    same(kiln.linalg.norm(kiln.tensor(a), 3, 1), torch.linalg.norm(torch.tensor(a), 3, 1))
    same(kiln.linalg.norm(kiln.tensor(a), dim=(1, 2)), torch.linalg.norm(torch.tensor(a), dim=(1, 2)))
    with pytest.raises(ValueError, match="floating"):
        kiln.linalg.vector_norm(kiln.tensor([1, 2]))
    grads(lambda x, y: kiln.linalg.cross(x, y), lambda x, y: torch.linalg.cross(x, y), RNG.standard_normal((2, 3)),
          RNG.standard_normal((1, 3)))
    grads(lambda x, y: kiln.linalg.cross(x, y, dim=0), lambda x, y: torch.linalg.cross(x, y, dim=0),
          RNG.standard_normal((3, 2)), RNG.standard_normal((3, 2)))
    with pytest.raises(ValueError, match="length 3"):
        kiln.linalg.cross(kiln.ones(2, 4), kiln.ones(2, 4))
    grads(kiln.linalg.vecdot, torch.linalg.vecdot, RNG.standard_normal((2, 3)), RNG.standard_normal((2, 3)))
    m = RNG.standard_normal((2, 3, 3))
    for n in (0, 1, 2, 5):
        grads(lambda x: kiln.linalg.matrix_power(x, n) * 1, lambda x: torch.linalg.matrix_power(x, n) * 1, m)
    # a negative n (through the inverse), inv, solve, det and cholesky: tests/python/test_linalg_lu_vs_torch.py
    same(kiln.linalg.diagonal(kiln.tensor(a), offset=1), torch.linalg.diagonal(torch.tensor(a), offset=1))


def _both_or_neither(kfn, tfn):
    """kfn's result equals tfn's, or both raise."""
    try:
        want = tfn()
    except Exception:  # noqa: BLE001
        with pytest.raises(Exception):
            kfn()
        return
    same(kfn(), want)


@pytest.mark.parametrize("shape", [(0,), (0, 3), (2, 0), (0, 0)])
def test_empty_and_integer_inputs_as_torch(shape):
    for dtype in ("float64", "int32"):
        a = np.zeros(shape, dtype=dtype)
        k, t = both(a)
        _both_or_neither(lambda: kiln.trace(k), lambda: torch.trace(t))
        _both_or_neither(lambda: kiln.diff(k, 1, 0), lambda: torch.diff(t, 1, 0))
        _both_or_neither(lambda: kiln.kron(k, k), lambda: torch.kron(t, t))
        _both_or_neither(lambda: kiln.isin(k, k), lambda: torch.isin(t, t))
        _both_or_neither(lambda: kiln.bucketize(k, kiln.tensor([0.5, 1.0])),
                         lambda: torch.bucketize(t, torch.tensor([0.5, 1.0])))
        _both_or_neither(lambda: kiln.aminmax(k), lambda: tuple(torch.aminmax(t)))
        _both_or_neither(lambda: kiln.block_diag(k, k), lambda: torch.block_diag(t, t))
        _both_or_neither(lambda: kiln.unique(k, return_counts=True), lambda: torch.unique(t, return_counts=True))
        _both_or_neither(lambda: kiln.xlogy(k, k), lambda: torch.xlogy(t, t))
        _both_or_neither(lambda: kiln.diag_embed(k), lambda: torch.diag_embed(t))
        if len(shape) == 2:
            _both_or_neither(lambda: kiln.rot90(k), lambda: torch.rot90(t))
            _both_or_neither(lambda: kiln.linalg.matrix_norm(k), lambda: torch.linalg.matrix_norm(t))
            _both_or_neither(lambda: kiln.quantile(k, 0.5, 1), lambda: torch.quantile(t, 0.5, 1))
            _both_or_neither(lambda: kiln.aminmax(k, dim=1), lambda: tuple(torch.aminmax(t, dim=1)))
        _both_or_neither(lambda: kiln.linalg.vector_norm(k), lambda: torch.linalg.vector_norm(t))
        _both_or_neither(lambda: kiln.logcumsumexp(k, 0), lambda: torch.logcumsumexp(t, 0))
        _both_or_neither(lambda: kiln.histc(k, 3), lambda: torch.histc(t, 3))


def test_inplace_methods_and_import_paths():
    k, t = both(np.array([3.0, 0.0, 2.0]))
    ky, ty = both(np.array([4.0, 5.0, 0.5]))
    assert k.hypot_(ky) is k
    t.hypot_(ty)
    same(k, t)
    k2, t2 = both(np.array([0.0, 2.0]))
    assert k2.xlogy_(kiln.tensor([0.0, 3.0], dtype=kiln.float64)) is k2
    same(k2, t2.xlogy_(torch.tensor([0.0, 3.0], dtype=torch.float64)))
    with pytest.raises(Exception, match="xlogy_"):
        kiln.ones(2, requires_grad=True).xlogy_(kiln.ones(2))
    # `import kiln.linalg`, `from kiln.special import expit` work, as torch's
    assert importlib.import_module("kiln.linalg") is kiln.linalg
    assert importlib.import_module("kiln.special").expit is kiln.special.expit


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_hypot_no_overflow_or_underflow(dtype):
    # the squares of sqrt(x*x + y*y) overflow (f16 300^2, f32 1e30^2, bf16 3e20^2) or underflow (3e-30^2)
    kd, td = getattr(kiln, dtype), getattr(torch, dtype)
    xs = [300.0, 3.0, 0.0, -3.0, 1e30, 3e-30, 3e20, 0.0, 5e-5]
    ys = [400.0, -4.0, 0.0, 4.0, 1e30, 4e-30, 4e20, 2.0, 0.0]
    tx, ty = torch.tensor(xs, dtype=td), torch.tensor(ys, dtype=td)
    kx, ky = kiln.tensor(tx.float().numpy()).to(kd), kiln.tensor(ty.float().numpy()).to(kd)
    ko, to = kiln.hypot(kx, ky), torch.hypot(tx, ty)
    assert str(ko.dtype).split(".")[-1] == dtype
    kn, tn = ko.float().numpy(), to.float().numpy()
    assert np.allclose(kn, tn, rtol=1e-2 if dtype in ("float16", "bfloat16") else 1e-6, atol=0), (kn, tn)
    assert (kn[0] == 500.0) if dtype == "float16" else True
    # gradients, ties |x| == |y| included; at (0, 0) it is 0 (documented; torch's is NaN)
    grads(kiln.hypot, torch.hypot, np.array([3e-30, 2.0, -1.0, 1e200]), np.array([4e-30, -2.0, 1.0, 1e200]))
    kx, ky = kiln.tensor([0.0, 3.0], requires_grad=True), kiln.tensor([0.0, 4.0], requires_grad=True)
    kiln.hypot(kx, ky).sum().backward()
    assert kx.grad.numpy().tolist() == [0.0, pytest.approx(0.6)] and ky.grad.numpy().tolist()[0] == 0.0
    k = kiln.tensor([300.0, 0.0], dtype=kiln.float16)
    k.hypot_(kiln.tensor([400.0, 0.0], dtype=kiln.float16))
    assert k.float().numpy().tolist() == [500.0, 0.0]


def test_inplace_xlogy_hypot_result_type_and_shape():
    # an integer self cannot hold xlogy's float result (copy_ truncated it), as torch refuses
    for fn in ("xlogy_",):
        k = kiln.tensor([1, 2], dtype=kiln.int64)
        with pytest.raises(Exception, match=f"{fn}: the result type float32 cannot be written into int64"):
            getattr(k, fn)(kiln.tensor([2.0, 3.0]))
        with pytest.raises(RuntimeError, match="can't be cast"):
            getattr(torch.tensor([1, 2]), fn)(torch.tensor([2.0, 3.0]))
        assert k.numpy().tolist() == [1, 2]
    for fn in ("xlogy_", "hypot_"):
        with pytest.raises(Exception, match=f"{fn}: output with shape \\[2\\] doesn't match the broadcast shape "
                                            f"\\[2, 2\\]"):
            getattr(kiln.ones(2), fn)(kiln.ones(2, 2))
        with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
            getattr(torch.ones(2), fn)(torch.ones(2, 2))
    # self broadcasts nothing: other [3] into self [2, 3] is fine
    k, t = both(np.full((2, 3), 2.0))
    same(k.xlogy_(kiln.tensor(np.array([1.0, 2.0, 3.0]))), t.xlogy_(torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)))


def test_histc_values_on_bin_edges():
    grid = np.round(np.arange(0, 11) * 0.1, 10)
    for dtype in ("float32", "float64"):
        k, t = kiln.tensor(grid).to(getattr(kiln, dtype)), torch.tensor(grid, dtype=getattr(torch, dtype))
        same(kiln.histc(k, 10, 0, 1), torch.histc(t, 10, 0, 1))
        same(kiln.histc(k * 3 - 1, 30, -1, 2), torch.histc(t * 3 - 1, 30, -1, 2))
        same(kiln.histc(k, 5, 0, 1), torch.histc(t, 5, 0, 1))


def test_number_first_alpha_in_result_dtype():
    cases = [("add", 0.5, "int8", [100], 2), ("sub", 0.5, "uint8", [100], 3), ("add", 1, "bool", [True], 2),
             ("add", 1.5, "int64", [2**40], -2), ("add", 2, "int8", [100], 2), ("sub", 2.5, "int16", [-7], 4)]
    for name, number, dtype, values, alpha in cases:
        k = kiln.tensor(np.array(values)).to(getattr(kiln, dtype))
        t = torch.tensor(values, dtype=getattr(torch, dtype))
        same(getattr(kiln, name)(number, k, alpha=alpha), getattr(torch, name)(number, t, alpha=alpha))
    # bool subtraction and a float alpha with an integer result are still refused, as torch's
    with pytest.raises(Exception, match="sub: subtraction with a bool tensor"):
        kiln.sub(2, kiln.tensor([True, False]), alpha=3)
    with pytest.raises(Exception, match="alpha"):
        kiln.add(1, kiln.tensor([1], dtype=kiln.int64), alpha=0.5)


@pytest.mark.parametrize("ord", [0.5, 0.25, -1, -2.5, 3, 1.5])
def test_vector_norm_gradient_at_zeros(ord):
    grads(lambda x: kiln.linalg.vector_norm(x, ord), lambda x: torch.linalg.vector_norm(x, ord),
          np.array([0.0, 1.0, -2.0, 0.0]))
    grads(lambda x: kiln.linalg.vector_norm(x, ord, dim=1), lambda x: torch.linalg.vector_norm(x, ord, dim=1),
          np.array([[0.0, 1.0, -2.0], [0.5, 3.0, -1.0]]))
    if ord > 0:
        grads(lambda x: kiln.linalg.vector_norm(x, ord), lambda x: torch.linalg.vector_norm(x, ord),
              np.array([0.0, 0.0]))


def test_unique_empty_dims_as_torch():
    k, t = kiln.zeros(0, 3), torch.zeros(0, 3)
    for name in ("unique", "unique_consecutive"):
        same(getattr(kiln, name)(k, dim=0, return_inverse=True, return_counts=True),
             getattr(torch, name)(t, dim=0, return_inverse=True, return_counts=True))
        same(getattr(kiln, name)(kiln.zeros(2, 0), dim=1, return_inverse=True, return_counts=True),
             getattr(torch, name)(torch.zeros(2, 0), dim=1, return_inverse=True, return_counts=True))
        with pytest.raises(RuntimeError, match="0 sized dimensions"):
            getattr(torch, name)(torch.zeros(2, 0), dim=0)
        with pytest.raises(Exception, match=f"{name}: input of shape \\[2, 0\\] has a 0-sized dimension"):
            getattr(kiln, name)(kiln.zeros(2, 0), dim=0)


def test_quantile_empty_q():
    k, t = both(RNG.standard_normal((3, 4)))
    kq, tq = kiln.tensor(np.zeros(0)), torch.tensor(np.zeros(0))
    same(kiln.quantile(k, kq), torch.quantile(t, tq))
    same(kiln.quantile(k, kq, dim=1), torch.quantile(t, tq, dim=1))
    same(kiln.quantile(k, kq, dim=1, keepdim=True), torch.quantile(t, tq, dim=1, keepdim=True))
    same(kiln.quantile(k, kq, keepdim=True), torch.quantile(t, tq, keepdim=True))
    same(kiln.nanquantile(k, kq, dim=0), torch.nanquantile(t, tq, dim=0))


def test_bfloat16_host_inputs():
    kb = kiln.tensor([1.5, 2.0, 3.0, -1.0]).to(kiln.bfloat16)
    tb = torch.tensor([1.5, 2.0, 3.0, -1.0], dtype=torch.bfloat16)
    same(kiln.isin(kb, kiln.tensor([2.0, 3.0]).to(kiln.bfloat16)),
         torch.isin(tb, torch.tensor([2.0, 3.0], dtype=torch.bfloat16)))
    same(kiln.isin(kb, 2.0), torch.isin(tb, 2.0))
    same(kiln.bucketize(kb, kiln.tensor([0.0, 2.0, 4.0]).to(kiln.bfloat16)),
         torch.bucketize(tb, torch.tensor([0.0, 2.0, 4.0], dtype=torch.bfloat16)))
    same(kiln.searchsorted(kiln.tensor([0.0, 2.0, 4.0]).to(kiln.bfloat16), kb, right=True),
         torch.searchsorted(torch.tensor([0.0, 2.0, 4.0], dtype=torch.bfloat16), tb, right=True))
    same(kiln.ones(1).new_tensor(kb), torch.ones(1).new_tensor(tb))
    copied = kb.new_tensor(kb)
    assert copied.dtype == kiln.bfloat16 and copied.float().numpy().tolist() == tb.float().tolist()


def test_logcumsumexp_gradient_at_minus_inf_is_logaddexps():
    # documented (docs/python.md): leading -inf inputs take logaddexp's halves at (-inf, -inf), torch's NaN
    k = kiln.tensor([-math.inf, -math.inf, 0.0], requires_grad=True)
    kiln.logcumsumexp(k, 0).sum().backward()
    assert k.grad.numpy().tolist() == [0.5, 0.25, 1.0]


def test_div_number_first_integer_wraps_as_torch():
    for number, dtype, values, mode in [(300, "uint8", [7, 50], "trunc"), (300, "int8", [7, -3], "floor"),
                                        (-3, "uint8", [2, 5], "floor"), (1000, "int16", [7, -9], "trunc"),
                                        (5, "int32", [2, -2], "floor")]:
        k = kiln.tensor(np.array(values)).to(getattr(kiln, dtype))
        t = torch.tensor(values, dtype=getattr(torch, dtype))
        same(kiln.div(number, k, rounding_mode=mode), torch.div(number, t, rounding_mode=mode))


def test_std_var_mean_correction():
    k, t = both(np.array([[1.0, 2.0, 4.0], [0.5, -1.0, 3.0]]))
    for name in ("std_mean", "var_mean"):
        same(getattr(kiln, name)(k, 1, correction=0), getattr(torch, name)(t, 1, correction=0))
        same(getattr(kiln, name)(k, 1, correction=2.0), getattr(torch, name)(t, 1, correction=2.0))
        with pytest.raises(Exception, match=f"{name}: correction must be a whole number .* got 0.5"):
            getattr(kiln, name)(k, correction=0.5)


def test_meshgrid_device_mismatch_names_devices():
    with pytest.raises(Exception, match="meshgrid: expects all tensors to have the same dtype, got float32 and "
                                        "float64"):
        kiln.meshgrid(kiln.ones(2), kiln.ones(2, dtype=kiln.float64))
    if not kiln.cuda_is_available():
        pytest.skip("needs a CUDA device for the device mismatch")
    with pytest.raises(Exception, match="meshgrid: expects all tensors to be on the same device, got cpu and cuda"):
        kiln.meshgrid(kiln.ones(2), kiln.ones(2, device="cuda"))


def test_matrix_power_integer_as_torch():
    # the engine's matmul is floating only: integer powers are exact broadcast products, wrapping as torch's
    for dtype, values in [("int32", [[1, 2], [3, 4]]), ("int64", [[1, -2, 0], [3, 4, 1], [0, 2, -1]]),
                          ("uint8", [[10, 20], [30, 40]])]:
        k = kiln.tensor(np.array(values)).to(getattr(kiln, dtype))
        t = torch.tensor(values, dtype=getattr(torch, dtype))
        for n in (0, 1, 2, 3, 5):
            same(kiln.linalg.matrix_power(k, n), torch.linalg.matrix_power(t, n))
    kb = kiln.tensor(np.arange(8).reshape(2, 2, 2)).to(kiln.int64)
    same(kiln.linalg.matrix_power(kb, 3), torch.linalg.matrix_power(torch.arange(8).reshape(2, 2, 2), 3))
    with pytest.raises(Exception, match="linalg.matrix_power: A must be a floating-point or integer tensor, got "
                                        "bool"):
        kiln.linalg.matrix_power(kiln.ones(2, 2, dtype=kiln.bool), 2)


def _ulps(a, b, dtype):
    """|a - b| in units in the last place of dtype, for same-signed finite torch tensors a and b."""
    view = torch.int32 if dtype == torch.float32 else torch.int16
    return (a.to(dtype).view(view).long() - b.to(dtype).view(view).long()).abs()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_hypot_rounds_once_as_torch(dtype):
    # computed in float64 and rounded once to dtype: m * sqrt(1 + r * r) rounded in dtype at each step was
    # off from torch's on 35% of float16 values (relative errors to 1.1e-3, torch's 4.8e-4)
    rng = np.random.default_rng(11)
    kd, td = getattr(kiln, dtype), getattr(torch, dtype)
    a, b = (rng.standard_normal(4000) * np.exp(rng.uniform(-3, 3, 4000)) for _ in range(2))
    tx, ty = torch.tensor(a).to(td), torch.tensor(b).to(td)
    kx, ky = kiln.tensor(tx.double().numpy()).to(kd), kiln.tensor(ty.double().numpy()).to(kd)
    ko, to = kiln.hypot(kx, ky), torch.hypot(tx, ty)
    assert dt(ko) == dtype
    ko = torch.tensor(ko.to(kiln.float64).numpy()).to(td)
    ulps = _ulps(ko, to, td)
    assert ulps.max().item() <= 1 and (ulps != 0).double().mean().item() < 0.01, \
        (ulps.max().item(), (ulps != 0).double().mean().item())
    # hypot_ the same
    k = kx.clone()
    k.hypot_(ky)
    assert _ulps(torch.tensor(k.to(kiln.float64).numpy()).to(td), to, td).max().item() <= 1


def test_hypot_gradient_beside_infinity_as_torch():
    # the finite operand's gradient where the other is inf is 0 (finite / inf), as torch's; it was NaN
    kx, tx = both(np.array([math.inf, 3.0, -math.inf]), grad=True)
    ky, ty = both(np.array([1.0, math.inf, 2.0]), grad=True)
    ko, to = kiln.hypot(kx, ky), torch.hypot(tx, ty)
    same(ko, to)
    ko.sum().backward()
    to.sum().backward()
    assert ky.grad.numpy()[[0, 2]].tolist() == ty.grad.numpy()[[0, 2]].tolist() == [0.0, 0.0]
    assert kx.grad.numpy()[1] == tx.grad.numpy()[1] == 0.0
    for dtype in (kiln.float32, kiln.float16):
        x, y = kiln.tensor([math.inf, 3.0]).to(dtype), kiln.tensor([1.0, math.inf]).to(dtype)
        assert kiln.hypot(x, y).float().numpy().tolist() == [math.inf, math.inf]


@pytest.mark.parametrize("name, args", [
    ("addcmul_", lambda L: (L.tensor([1.5, 2.0]), L.tensor([1.0, 1.0]))),
    ("addcdiv_", lambda L: (L.tensor([1.5, 2.0]), L.tensor([1.0, 2.0]))),
    ("index_add_", lambda L: (0, L.tensor([0]), L.tensor([2.5]))),
    ("xlogy_", lambda L: (L.tensor([2.0, 3.0]),)),
])
def test_inplace_float_result_into_integer_self_refused_as_torch(name, args):
    # _inplace wrote every result through copy_, which truncated a float result into an int self
    with pytest.raises(RuntimeError):
        getattr(torch.tensor([1, 2]), name)(*args(torch))
    k = kiln.tensor([1, 2])
    with pytest.raises(Exception, match=f"{name}"):
        getattr(k, name)(*args(kiln))
    assert k.numpy().tolist() == [1, 2]


@pytest.mark.parametrize("name, args", [
    ("addcmul_", lambda L: (L.ones(2, 2), L.ones(2))),
    ("addcdiv_", lambda L: (L.ones(2), L.ones(2, 2))),
    ("lerp_", lambda L: (L.ones(2, 2), 0.5)),
    ("xlogy_", lambda L: (L.ones(2, 2),)),
    ("hypot_", lambda L: (L.ones(2, 2),)),
])
def test_inplace_result_larger_than_self_refused_as_torch(name, args):
    with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
        getattr(torch.ones(2), name)(*args(torch))
    with pytest.raises(Exception, match=f"{name}: output with shape \\[2\\] doesn't match the broadcast shape "
                                        f"\\[2, 2\\]"):
        getattr(kiln.ones(2), name)(*args(kiln))


def test_inplace_allowed_as_torch():
    # what torch writes is written: an int result into int, a float value filled into int, other [3] into [2, 3]
    k, t = kiln.tensor([1, 2]), torch.tensor([1, 2])
    same(k.addcmul_(kiln.tensor([3, 4]), kiln.tensor([1, 2])), t.addcmul_(torch.tensor([3, 4]), torch.tensor([1, 2])))
    same(kiln.tensor([1, 2, 3]).index_fill_(0, kiln.tensor([0]), 2.5),
         torch.tensor([1, 2, 3]).index_fill_(0, torch.tensor([0]), 2.5))
    same(kiln.tensor([True, False]).index_fill_(0, kiln.tensor([1]), 1),
         torch.tensor([True, False]).index_fill_(0, torch.tensor([1]), 1))
    k, t = both(np.full((2, 3), 2.0))
    same(k.lerp_(kiln.tensor(np.array([1.0, 2.0, 3.0])), 0.5), t.lerp_(torch.tensor([1.0, 2.0, 3.0],
                                                                                   dtype=torch.float64), 0.5))


def test_integer_matrix_power_in_blocks_of_the_inner_dimension(monkeypatch):
    # the integer product built the whole n x k x m broadcast product (1000 x 1000 int64: 8 GB); now blocks
    # of the inner dimension, each temporary at most kiln._math._PRODUCT_BLOCK_ELEMENTS elements
    import kiln._math as kmath
    monkeypatch.setattr(kmath, "_PRODUCT_BLOCK_ELEMENTS", 5000, raising=False)
    sizes = []
    mul = kiln.Tensor.__mul__

    def recording_mul(a, b):
        out = mul(a, b)
        sizes.append(out.numel())
        return out
    monkeypatch.setattr(kiln.Tensor, "__mul__", recording_mul)
    rng = np.random.default_rng(3)
    for dtype, n in (("int64", 3), ("int32", 5), ("int16", 2)):
        a = rng.integers(-50, 50, (2, 37, 37)).astype(dtype)
        ko = kiln.linalg.matrix_power(kiln.tensor(a), n)
        to = torch.linalg.matrix_power(torch.tensor(a), n)
        same(ko, to)  # exact, wrapping around in int32/int16 as torch's
    assert sizes and max(sizes) <= 5000, max(sizes)


@pytest.mark.parametrize("name", ["asinh", "acosh", "atanh"])
def test_inverse_hyperbolic_as_torch(name):
    # Values over each domain and past it (NaN), the poles, inf; gradients and second derivatives in f64;
    # f32 and an integer input (promoted to f32, as torch's).
    a = {"asinh": np.concatenate([np.linspace(-30, 30, 61), [1e-300, -1e-8, 1e300, np.inf, -np.inf, np.nan]]),
         "acosh": np.concatenate([np.linspace(1, 40, 40), [1 + 1e-12, 0.5, -2.0, 1e300, np.inf, np.nan]]),
         "atanh": np.concatenate([np.linspace(-0.99, 0.99, 45), [1e-12, 1.0, -1.0, 1.5, np.nan]])}[name]
    k, t = getattr(kiln, name)(kiln.tensor(a, dtype=kiln.float64)), getattr(torch, name)(torch.tensor(a))
    np.testing.assert_allclose(np.array(k.tolist()), t.numpy(), rtol=1e-15, atol=0)
    k32 = getattr(kiln, name)(kiln.tensor(a, dtype=kiln.float32))
    np.testing.assert_allclose(np.array(k32.tolist()), getattr(torch, name)(torch.tensor(a, dtype=torch.float32)).numpy(),
                               rtol=2e-7, atol=0)
    ints = [1, 2, 3] if name == "acosh" else [0, -1, 1]
    ki, ti = getattr(kiln, name)(kiln.tensor(ints)), getattr(torch, name)(torch.tensor(ints))
    assert dt(ki) == dt(ti) == "float32"
    np.testing.assert_allclose(np.array(ki.tolist()), ti.numpy(), rtol=1e-7)
    inside = {"asinh": [-3.0, -0.5, 0.0, 2.0], "acosh": [1.5, 2.0, 7.0], "atanh": [-0.7, 0.0, 0.3, 0.9]}[name]
    grads = []
    for lib in (kiln, torch):
        x = lib.tensor(inside, dtype=lib.float64, requires_grad=True)
        y = getattr(x, name)()  # the method
        (g,) = lib.autograd.grad((y * y).sum(), x, create_graph=True)
        (h,) = lib.autograd.grad(g.sum(), x)
        grads.append(np.array(g.detach().tolist() + h.tolist()))
    np.testing.assert_allclose(grads[0], grads[1], rtol=1e-13, atol=0)


@pytest.mark.parametrize("p", [0.5, 1.5, 3.0])
def test_general_p_norm_gradient_at_zeros_as_torch(p):
    # A zero row (norm 0) and zero elements in a non-zero row: torch's gradient is 0 there, where the plain
    # composite pow(sum(pow(|x|, p)), 1/p) gave NaN (so did F.normalize and pairwise_distance built on it).
    a = [[0.0, 0.0, 0.0], [0.0, 1.0, -2.0], [0.5, -0.25, 3.0]]
    w = [[1.0, 2.0, 3.0]]
    got = []
    for lib in (kiln, torch):
        x = lib.tensor(a, dtype=lib.float64, requires_grad=True)
        n = x.norm(p, dim=1)
        (g,) = lib.autograd.grad((n * lib.tensor(w[0], dtype=lib.float64)).sum(), x)
        got.append((np.array(n.detach().tolist()), np.array(g.tolist())))
    np.testing.assert_allclose(got[0][0], got[1][0], rtol=1e-14)
    np.testing.assert_allclose(got[0][1], got[1][1], rtol=1e-13, atol=0)
    if p > 1:
        got = []
        for lib in (kiln, torch):
            x = lib.tensor(a, dtype=lib.float64, requires_grad=True)
            (g,) = lib.autograd.grad(lib.nn.functional.normalize(x, p=p, dim=1).sum(), x)
            got.append(np.array(g.tolist()))
        np.testing.assert_allclose(got[0], got[1], rtol=1e-12, atol=1e-15)
