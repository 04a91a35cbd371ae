# torch functions research code calls that Kiln writes with its own ops (python/kiln/_math.py): linspace,
# logspace, as_tensor, asarray, outer/ger, dot, vdot, inner, tensordot, masked_select, repeat_interleave, take,
# argwhere, nansum, nanmean, nanmedian, signbit, copysign, logit, gcd, lcm, heaviside, addmv, addr, addbmm,
# renorm, cov, corrcoef, vander, frexp, ldexp, nextafter: values, dtypes and shapes, gradients and refusals
# against PyTorch itself.
import warnings

import numpy as np
import pytest

import kiln

torch = pytest.importorskip("torch")

NAN, INF = float("nan"), float("inf")


def k_of(t, grad=False):
    k = kiln.from_dlpack(t.detach().clone())
    return k.requires_grad_(True) if grad else k


def t_of(k):
    return torch.from_dlpack(k.detach().contiguous()).clone()


def dtname(d):
    return str(d).split(".")[-1]


def same(k, t, rtol=0.0, atol=0.0):
    """k (kiln) and t (torch): same dtype, shape and values (exact unless a tolerance is given; NaN where
    NaN)."""
    assert dtname(k.dtype) == dtname(t.dtype), (k.dtype, t.dtype)
    assert list(k.shape) == list(t.shape), (list(k.shape), list(t.shape))
    kn, tn = t_of(k), t.detach()
    if kn.dtype in (torch.bfloat16, torch.float16):
        kn, tn = kn.float(), tn.float()
    if t.dtype.is_floating_point:
        assert torch.allclose(kn, tn, rtol=rtol, atol=atol, equal_nan=True), (kn, tn)
    else:
        assert torch.equal(kn, tn), (kn, tn)


def randn(*shape, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(tuple(shape), generator=g, dtype=dtype)


def grads_match(kfn, tfn, *ts, rtol=1e-10, atol=1e-12):
    """kfn on kiln copies of ts and tfn on ts: same values, and the same gradients of (out * w).sum()."""
    tl = [t.detach().clone().requires_grad_(True) for t in ts]
    kl = [k_of(t, grad=True) for t in ts]
    to, ko = tfn(*tl), kfn(*kl)
    same(ko, to, rtol, atol)
    w = randn(*to.shape, dtype=to.dtype, seed=7)
    (to * w).sum().backward()
    (ko * k_of(w)).sum().backward()
    for t, k in zip(tl, kl):
        if t.grad is None:
            assert k.grad is None or not t_of(k.grad).any()
        else:
            assert k.grad is not None
            same(k.grad, t.grad, rtol, atol)


# ---- factories ----

@pytest.mark.parametrize("args", [(0, 1, 5), (-3.5, 2.25, 7), (1, 0, 4), (2, 2, 3), (0, 1, 1), (0, 1, 0),
                                  (0.1, 0.9, 100), (-1e3, 1e3, 33)])
@pytest.mark.parametrize("dt", [None, "float64", "float32", "int64", "int32"])
def test_linspace_is_torchs(args, dt):
    kw = {} if dt is None else {"dtype": getattr(torch, dt)}
    t = torch.linspace(*args, **kw)
    k = kiln.linspace(*args, **({} if dt is None else {"dtype": getattr(kiln, dt)}))
    same(k, t, rtol=1e-6 if t.dtype == torch.float32 else 1e-15)


@pytest.mark.parametrize("args", [(0, 2, 5), (-1, 1, 4, 2.0), (1, 3, 3, 3)])
@pytest.mark.parametrize("dt", [None, "float64"])
def test_logspace_is_torchs(args, dt):
    t = torch.logspace(*args, **({} if dt is None else {"dtype": getattr(torch, dt)}))
    k = kiln.logspace(*args, **({} if dt is None else {"dtype": getattr(kiln, dt)}))
    same(k, t, rtol=1e-6 if t.dtype == torch.float32 else 1e-13)


def test_linspace_refuses_as_torch():
    with pytest.raises(RuntimeError):
        torch.linspace(0, 1, -1)
    with pytest.raises(RuntimeError):
        kiln.linspace(0, 1, -1)
    with pytest.raises(TypeError):
        kiln.linspace(0, 1, 2.5)
    assert kiln.linspace(0, 1, 3, requires_grad=True).requires_grad


def test_as_tensor_and_asarray_share_as_torch():
    x = kiln.tensor([1.0, 2.0])
    assert kiln.as_tensor(x) is x and kiln.asarray(x) is x
    assert kiln.as_tensor(x, dtype=kiln.float32) is x
    assert kiln.as_tensor(x, dtype=kiln.float64).dtype == kiln.float64
    c = kiln.asarray(x, copy=True)
    assert c is not x and c.tolist() == x.tolist()
    with pytest.raises(ValueError):
        torch.asarray(torch.tensor([1.0]), dtype=torch.float64, copy=False)
    with pytest.raises(ValueError):
        kiln.asarray(x, dtype=kiln.float64, copy=False)
    a = np.arange(4.0)
    for k in (kiln.as_tensor(a), kiln.asarray(a)):  # the array's memory, as torch's
        assert k.dtype == kiln.float64
        a[0] = 7.0
        assert k[0].item() == 7.0
    a = np.arange(3.0)
    assert kiln.asarray(a, copy=True).tolist() == [0.0, 1.0, 2.0]
    for data in ([0.3, 1], [[1, 2]], 0.3, [True]):
        for dt in (None, torch.float64):
            t = torch.as_tensor(data, dtype=dt)
            k = kiln.as_tensor(data, dtype=None if dt is None else kiln.float64)
            same(k, t)
            same(kiln.asarray(data, dtype=None if dt is None else kiln.float64), torch.asarray(data, dtype=dt))


# ---- products ----

@pytest.mark.parametrize("dt", [torch.float64, torch.float32, torch.int64])
def test_outer_dot_vdot_inner_values_and_dtypes(dt):
    a, b = (randn(4, seed=1) * 5).to(dt), (randn(4, seed=2) * 5).to(dt)
    ka, kb = k_of(a), k_of(b)
    tol = 1e-6 if dt == torch.float32 else 1e-14
    same(kiln.outer(ka, kb), torch.outer(a, b))
    same(kiln.ger(ka, kb), torch.ger(a, b))
    same(ka.outer(kb), a.outer(b))
    same(kiln.dot(ka, kb), torch.dot(a, b), tol)
    same(ka.dot(kb), a.dot(b), tol)
    same(kiln.vdot(ka, kb), torch.vdot(a, b), tol)
    same(kiln.inner(ka, kb), torch.inner(a, b), tol)
    m, n = (randn(2, 3, 4, seed=3) * 5).to(dt), (randn(5, 4, seed=4) * 5).to(dt)
    same(kiln.inner(k_of(m), k_of(n)), torch.inner(m, n), tol)
    same(kiln.inner(k_of(m), kiln.tensor(2)), torch.inner(m, torch.tensor(2)), tol)


def test_outer_promotes_as_torch():
    a, b = torch.tensor([1, 2]), torch.tensor([0.5, 1.5, 2.5], dtype=torch.float64)
    same(kiln.outer(k_of(a), k_of(b)), torch.outer(a, b))


def test_products_refuse_as_torch():
    a = randn(3)
    for fn, args in ((lambda m, x, y: m.dot(x, y), (a, a.float())), (lambda m, x, y: m.dot(x, y), (a, randn(4))),
                     (lambda m, x, y: m.dot(x, y), (a.reshape(1, 3), a)),
                     (lambda m, x, y: m.outer(x, y), (a.reshape(1, 3), a)),
                     (lambda m, x, y: m.inner(x, y), (randn(2, 3), randn(2, 4))),
                     (lambda m, x, y: m.tensordot(x, y, 1), (randn(2, 3), randn(4, 3))),
                     (lambda m, x, y: m.tensordot(x, y, ([0], [0, 1])), (randn(2, 3), randn(2, 3))),
                     (lambda m, x, y: m.tensordot(x, y, -1), (randn(2, 3), randn(3, 2)))):
        with pytest.raises(RuntimeError):
            fn(torch, *args)
        with pytest.raises(RuntimeError):
            fn(kiln, *[k_of(x) for x in args])


@pytest.mark.parametrize("dims", [0, 1, 2, ([1, 0], [0, 1]), ([2], [0]), [[0, 2], [1, 0]]])
def test_tensordot_values_and_gradients(dims):
    a, b = randn(3, 4, 5, seed=1), randn(4, 3, 2, seed=2)
    if dims == 1:
        a, b = randn(3, 4, 4, seed=1), randn(4, 3, 2, seed=2)
    if dims == 2:
        a, b = randn(2, 4, 3, seed=1), randn(4, 3, 2, seed=2)
    if dims == ([2], [0]):
        a, b = randn(3, 4, 4, seed=1), randn(4, 3, 2, seed=2)
    if dims == [[0, 2], [1, 0]]:
        a, b = randn(3, 4, 5, seed=1), randn(5, 3, 2, seed=2)
    grads_match(lambda x, y: kiln.tensordot(x, y, dims), lambda x, y: torch.tensordot(x, y, dims), a, b)


def test_tensordot_integers():
    a, b = torch.arange(24).reshape(2, 3, 4), torch.arange(12).reshape(3, 4)
    same(kiln.tensordot(k_of(a), k_of(b)), torch.tensordot(a, b))


def test_products_gradients():
    a, b = randn(4, seed=1), randn(4, seed=2)
    grads_match(kiln.outer, torch.outer, a, b)
    grads_match(kiln.dot, torch.dot, a, b)
    grads_match(kiln.inner, torch.inner, randn(2, 4, seed=3), randn(3, 4, seed=4))
    inp, m, v = randn(3, seed=5), randn(3, 4, seed=6), randn(4, seed=7)
    for beta, alpha in ((1, 1), (0.5, -2.0), (0, 1)):
        grads_match(lambda i, x, y: kiln.addmv(i, x, y, beta=beta, alpha=alpha),
                    lambda i, x, y: torch.addmv(i, x, y, beta=beta, alpha=alpha), inp, m, v)
        grads_match(lambda i, x, y: kiln.addr(i, x, y, beta=beta, alpha=alpha),
                    lambda i, x, y: torch.addr(i, x, y, beta=beta, alpha=alpha), randn(3, 4, seed=8), inp, v)
        grads_match(lambda i, x, y: kiln.addbmm(i, x, y, beta=beta, alpha=alpha),
                    lambda i, x, y: torch.addbmm(i, x, y, beta=beta, alpha=alpha),
                    randn(3, 2, seed=9), randn(5, 3, 4, seed=10), randn(5, 4, 2, seed=11))


def test_beta_zero_ignores_nan_as_torch():
    inp = torch.full((3,), NAN, dtype=torch.float64)
    m, v = randn(3, 4), randn(4)
    same(kiln.addmv(k_of(inp), k_of(m), k_of(v), beta=0), torch.addmv(inp, m, v, beta=0), 1e-14)
    same(k_of(inp).addmv(k_of(m), k_of(v), beta=0), inp.addmv(m, v, beta=0), 1e-14)


def test_addmv_addr_addbmm_refuse_as_torch():
    cases = [("addmv", (randn(3), randn(3, 4), randn(5))), ("addmv", (randn(3), randn(3, 4, 1), randn(4))),
             ("addr", (randn(3, 4), randn(3, 1), randn(4))), ("addbmm", (randn(3, 2), randn(5, 3, 4),
                                                                            randn(4, 4, 2))),
             ("addmv", (randn(3), randn(3, 4).float(), randn(4)))]
    for name, args in cases:
        with pytest.raises(RuntimeError):
            getattr(torch, name)(*args)
        with pytest.raises(RuntimeError):
            getattr(kiln, name)(*[k_of(a) for a in args])


@pytest.mark.parametrize("beta,alpha", [(1.5, 1), (1, 2.5), (0.5, 0.5), (-1.5, -2.5), (1.9, 0.0), (2, 3), (True, 2)])
def test_integer_addmv_addr_addbmm_take_beta_alpha_as_torch(beta, alpha):
    # integer tensors keep their dtype: addmv and addbmm truncate a float beta/alpha, addr refuses one
    t = torch.tensor
    cases = [("addmv", (t([1, 2]), t([[1, 2], [3, 4]]), t([1, -1]))),
             ("addbmm", (t([[1, 2], [3, 4]]), t([[[1, 2], [3, 4]], [[0, 1], [1, 0]]]), t([[[1, 0], [2, 1]]] * 2))),
             ("addr", (t([[1, 2], [3, 4]]), t([1, 2]), t([3, -4]))),
             ("addr", (t([[1, 2], [3, 4]], dtype=torch.int32), t([1, 2], dtype=torch.int32),
                       t([3, -4], dtype=torch.int32)))]
    for name, args in cases:
        try:
            want = getattr(torch, name)(*args, beta=beta, alpha=alpha)
        except RuntimeError:
            with pytest.raises(RuntimeError, match="beta|alpha"):
                getattr(kiln, name)(*[k_of(a) for a in args], beta=beta, alpha=alpha)
            continue
        same(getattr(kiln, name)(*[k_of(a) for a in args], beta=beta, alpha=alpha), want)


# ---- selection ----

def test_masked_select_broadcasts_and_differentiates():
    x, mask = randn(3, 4), torch.tensor([True, False, True, True])
    same(kiln.masked_select(k_of(x), k_of(mask)), torch.masked_select(x, mask))
    same(k_of(x).masked_select(k_of(mask)), x.masked_select(mask))
    grads_match(lambda a: kiln.masked_select(a, k_of(mask)), lambda a: torch.masked_select(a, mask), x)
    with pytest.raises(RuntimeError):
        torch.masked_select(x, mask.long())
    with pytest.raises(RuntimeError):
        kiln.masked_select(k_of(x), k_of(mask.long()))


@pytest.mark.parametrize("repeats,dim", [(2, None), (3, 0), (2, 1), ([1, 0, 2], 0), ([2, 1, 0, 3], 1),
                                         ([3], 1), (0, 0)])
def test_repeat_interleave_is_torchs(repeats, dim):
    x = randn(3, 4)
    r_t = torch.tensor(repeats) if isinstance(repeats, list) else repeats
    r_k = kiln.tensor(repeats) if isinstance(repeats, list) else repeats
    same(kiln.repeat_interleave(k_of(x), r_k, dim), torch.repeat_interleave(x, r_t, dim))
    same(k_of(x).repeat_interleave(r_k, dim=dim), x.repeat_interleave(r_t, dim=dim))
    grads_match(lambda a: kiln.repeat_interleave(a, r_k, dim), lambda a: torch.repeat_interleave(a, r_t, dim), x)


def test_repeat_interleave_forms_and_refusals():
    counts = torch.tensor([2, 0, 3])
    same(kiln.repeat_interleave(k_of(counts)), torch.repeat_interleave(counts))
    x = torch.tensor([1, 2, 3])
    same(kiln.repeat_interleave(k_of(x), k_of(counts), 0, output_size=5),
         torch.repeat_interleave(x, counts, 0, output_size=5))
    same(kiln.repeat_interleave(kiln.tensor(5), 2), torch.repeat_interleave(torch.tensor(5), 2))
    for r in (torch.tensor([1, -1, 2]), torch.tensor([1, 2])):
        with pytest.raises(RuntimeError):
            torch.repeat_interleave(x, r, 0)
        with pytest.raises(RuntimeError):
            kiln.repeat_interleave(k_of(x), k_of(r), 0)
    with pytest.raises(RuntimeError):
        torch.repeat_interleave(x, -1)
    with pytest.raises(RuntimeError):
        kiln.repeat_interleave(k_of(x), -1)
    with pytest.raises(IndexError):
        kiln.repeat_interleave(k_of(x), 2, 3)


def test_take_and_argwhere_are_torchs():
    x, idx = randn(3, 4), torch.tensor([[0, 11], [-1, 5]])
    same(kiln.take(k_of(x), k_of(idx)), torch.take(x, idx))
    same(k_of(x).take(k_of(idx)), x.take(idx))
    grads_match(lambda a: kiln.take(a, k_of(idx)), lambda a: torch.take(a, idx), x)
    with pytest.raises(IndexError):
        torch.take(x, torch.tensor([12]))
    with pytest.raises(IndexError):
        kiln.take(k_of(x), kiln.tensor([12]))
    with pytest.raises(RuntimeError):
        torch.take(x, idx.int())
    with pytest.raises(RuntimeError):
        kiln.take(k_of(x), k_of(idx.int()))
    y = torch.tensor([[0.0, 1.5, 0.0], [NAN, 0.0, -2.0]])
    same(kiln.argwhere(k_of(y)), torch.argwhere(y))
    same(k_of(y).argwhere(), y.argwhere())
    same(kiln.argwhere(kiln.tensor(3)), torch.argwhere(torch.tensor(3)))


# ---- NaN-aware reductions ----

X_NAN = torch.tensor([[1.0, NAN, 3.0, -2.0], [NAN, NAN, NAN, NAN], [4.0, 0.5, NAN, 7.0]], dtype=torch.float64)


@pytest.mark.parametrize("dim,keepdim", [(None, False), (0, False), (1, True), ((0, 1), False), (-1, False)])
def test_nansum_nanmean_are_torchs(dim, keepdim):
    kw = {} if dim is None else {"dim": dim, "keepdim": keepdim}
    for name in ("nansum", "nanmean"):
        grads_match(lambda a: getattr(kiln, name)(a, **kw), lambda a: getattr(torch, name)(a, **kw), X_NAN,
                    rtol=1e-14, atol=0)
        same(getattr(k_of(X_NAN), name)(**kw), getattr(X_NAN, name)(**kw), 1e-14)


def test_nansum_dtypes_and_nanmean_refuses_integers():
    i = torch.tensor([[1, 2], [3, 4]])
    same(kiln.nansum(k_of(i)), torch.nansum(i))
    same(kiln.nansum(k_of(X_NAN), dtype=kiln.float32), torch.nansum(X_NAN, dtype=torch.float32), 1e-6)
    with pytest.raises(RuntimeError):
        torch.nanmean(i)
    with pytest.raises(RuntimeError):
        kiln.nanmean(k_of(i))


@pytest.mark.parametrize("dim,keepdim", [(0, False), (1, False), (1, True), (-1, False)])
def test_nanmedian_is_torchs(dim, keepdim):
    x = torch.tensor([[1.0, NAN, 3.0, -2.0, 8.0], [NAN, NAN, NAN, NAN, NAN], [4.0, 0.5, NAN, 7.0, 9.0]],
                     dtype=torch.float64)
    kv, ki = kiln.nanmedian(k_of(x), dim, keepdim)
    tv, ti = torch.nanmedian(x, dim, keepdim)
    same(kv, tv)
    # indices: where the values are not NaN (an all-NaN row's index is unspecified)
    ok = ~torch.isnan(tv)
    assert torch.equal(t_of(ki)[ok], ti[ok])
    r = k_of(x).nanmedian(dim, keepdim)
    same(r.values, tv)
    grads_match(lambda a: kiln.nanmedian(a, dim, keepdim).values, lambda a: torch.nanmedian(a, dim, keepdim).values,
                x)


def test_nanmedian_global_and_integers():
    for x in (X_NAN, torch.tensor([NAN, NAN]), torch.tensor([3.0, 1.0, 2.0, 5.0]), torch.tensor([[4, 1], [3, 2]])):
        same(kiln.nanmedian(k_of(x)), torch.nanmedian(x))
    grads_match(kiln.nanmedian, torch.nanmedian, X_NAN)
    with pytest.raises(IndexError):
        torch.nanmedian(X_NAN, 2)
    with pytest.raises(IndexError):
        kiln.nanmedian(k_of(X_NAN), 2)


def test_nanmedian_index_of_an_all_nan_row_is_torchs():
    # torch's CPU kernel returns what std::nth_element leaves first: 0, 0, 0, 2, 2, 3, 5, ... (not the middle)
    for n in list(range(1, 40)) + [64, 100, 257]:
        x = torch.full((2, n), NAN, dtype=torch.float64)
        x[1, n // 2] = 1.0
        kv, ki = kiln.nanmedian(k_of(x), 1)
        tv, ti = torch.nanmedian(x, 1)
        same(kv, tv)
        same(ki, ti)
        same(kiln.nanmedian(k_of(x.t()), 0).indices, torch.nanmedian(x.t(), 0).indices)


# ---- number functions ----

SIGNED = torch.tensor([-0.0, 0.0, -1.5, 2.0, INF, -INF, NAN, -NAN, 1e-310, -1e-310], dtype=torch.float64)


@pytest.mark.parametrize("dt", [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64,
                                torch.int32, torch.uint8, torch.bool])
def test_signbit_is_torchs(dt):
    x = SIGNED.to(dt) if dt.is_floating_point else torch.tensor([-3, 0, 5, 1]).to(dt)
    same(kiln.signbit(k_of(x)), torch.signbit(x))
    same(k_of(x).signbit(), x.signbit())


def test_copysign_is_torchs():
    a = torch.tensor([1.0, -2.0, 0.0, -0.0, 3.0, NAN, INF], dtype=torch.float64)
    b = torch.tensor([-1.0, 2.0, -0.0, 1.0, NAN, -1.0, -0.0], dtype=torch.float64)
    k = kiln.copysign(k_of(a), k_of(b))
    same(k, torch.copysign(a, b))
    assert torch.equal(torch.signbit(t_of(k)), torch.signbit(torch.copysign(a, b)))
    same(kiln.copysign(k_of(a), -1), torch.copysign(a, -1))
    same(kiln.copysign(kiln.tensor([1, -2]), kiln.tensor([-1, 1])), torch.copysign(torch.tensor([1, -2]),
                                                                                    torch.tensor([-1, 1])))
    same(kiln.copysign(kiln.tensor([1, -2]), kiln.tensor([-1.0, 1.0], dtype=kiln.float64)),
         torch.copysign(torch.tensor([1, -2]), torch.tensor([-1.0, 1.0], dtype=torch.float64)))
    x, y = torch.tensor([1.5, -2.0, 0.0, 4.0], dtype=torch.float64), torch.tensor([-1.0, -3.0, 2.0, 5.0],
                                                                                   dtype=torch.float64)
    grads_match(kiln.copysign, torch.copysign, x, y)
    k = k_of(x)
    k.copysign_(k_of(y))
    same(k, torch.copysign(x, y))


@pytest.mark.parametrize("eps", [None, 0.0, 1e-6, 0.2])
def test_logit_is_torchs(eps):
    x = torch.tensor([0.0, 0.1, 0.5, 0.9, 1.0, 1.2, -0.1, NAN], dtype=torch.float64)
    same(kiln.logit(k_of(x), eps), torch.logit(x, eps), 1e-14)
    same(k_of(x).logit(eps), x.logit(eps), 1e-14)
    inner = torch.tensor([0.05, 0.3, 0.5, 0.97], dtype=torch.float64)
    grads_match(lambda a: kiln.logit(a, eps), lambda a: torch.logit(a, eps), inner)
    same(kiln.logit(kiln.tensor([0, 1])), torch.logit(torch.tensor([0, 1])))


@pytest.mark.parametrize("eps", [0.1, 0.25, 0.5, 0.6, 0.9, 1.0, 1.5, -0.1])
def test_logit_eps_ends_and_eps_above_half_are_torchs(eps):
    # the gradient passes where eps <= x <= 1 - eps, the ends included; eps > 0.5 moves every x, element by
    # element (to eps below eps, to 1 - eps from eps up), as torch's kernel
    x = torch.tensor([0.05, 0.1, 0.25, 0.4, 0.5, 0.6, 0.75, 0.9, 0.95], dtype=torch.float64)
    grads_match(lambda a: kiln.logit(a, eps), lambda a: torch.logit(a, eps), x, rtol=1e-12)
    same(kiln.logit(k_of(x.float()), eps), torch.logit(x.float(), eps), 1e-6)


def test_gcd_lcm_are_torchs():
    a = torch.tensor([12, -18, 0, 7, 0, 2**40, -9])
    b = torch.tensor([18, 12, 5, 0, 0, 2**20 * 3, -6])
    for name in ("gcd", "lcm"):
        same(getattr(kiln, name)(k_of(a), k_of(b)), getattr(torch, name)(a, b))
        same(getattr(k_of(a), name)(k_of(b)), getattr(a, name)(b))
        same(getattr(kiln, name)(k_of(a.int()), k_of(b[:1].int())), getattr(torch, name)(a.int(), b[:1].int()))
        with pytest.raises(RuntimeError):
            getattr(torch, name)(a.double(), b.double())
        with pytest.raises(RuntimeError):
            getattr(kiln, name)(k_of(a.double()), k_of(b.double()))


def test_heaviside_is_torchs():
    x = torch.tensor([-1.5, 0.0, -0.0, 2.0, NAN, INF], dtype=torch.float64)
    v = torch.tensor([0.5], dtype=torch.float64)
    same(kiln.heaviside(k_of(x), k_of(v)), torch.heaviside(x, v))
    same(k_of(x).heaviside(k_of(v)), x.heaviside(v))
    i = torch.tensor([-2, 0, 3])
    same(kiln.heaviside(k_of(i), k_of(torch.tensor(7))), torch.heaviside(i, torch.tensor(7)))
    with pytest.raises(RuntimeError):
        torch.heaviside(x, v.float())
    with pytest.raises(RuntimeError):
        kiln.heaviside(k_of(x), k_of(v.float()))


@pytest.mark.parametrize("dt", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
def test_frexp_is_torchs(dt):
    x = torch.tensor([3.0, -0.375, 0.0, -0.0, 1e-40, 1000.0, INF, -INF, NAN], dtype=torch.float64).to(dt)
    km, ke = kiln.frexp(k_of(x))
    tm, te = torch.frexp(x)
    same(km, tm)
    ok = torch.isfinite(x)
    assert dtname(ke.dtype) == "int32" and torch.equal(t_of(ke)[ok], te[ok])
    r = k_of(x).frexp()
    same(r.mantissa, tm)
    with pytest.raises(RuntimeError):
        torch.frexp(torch.tensor([1, 2]))
    with pytest.raises(RuntimeError):
        kiln.frexp(kiln.tensor([1, 2]))


def test_frexp_gradient_is_torchs():
    grads_match(lambda a: kiln.frexp(a).mantissa, lambda a: torch.frexp(a).mantissa,
                torch.tensor([3.0, -0.375, 1000.0, 5e-3], dtype=torch.float64))


def test_frexp_of_the_largest_values_is_torchs():
    # 2 ** exponent overflowed the dtype there (2 ** 16 in float16, 2 ** 128 in float32 and bfloat16), which made
    # the mantissa 0
    for dt, v in ((torch.float16, [40000.0, 65504.0, -33000.0]), (torch.float32, [3e38, 2.0**127, -1.7e38]),
                  (torch.float64, [1.7e308, 2.0**1023, -9e307]), (torch.bfloat16, [3e38, 2.0**127])):
        x = torch.tensor(v, dtype=torch.float64).to(dt)
        km, ke = kiln.frexp(k_of(x))
        tm, te = torch.frexp(x)
        same(km, tm)
        same(ke, te)


def test_ldexp_is_torchs():
    x = torch.tensor([1.0, -0.75, 3.0, 0.0], dtype=torch.float64)
    e = torch.tensor([2, -3, 10, 5])
    same(kiln.ldexp(k_of(x), k_of(e)), torch.ldexp(x, e))
    same(k_of(x).ldexp(k_of(e)), x.ldexp(e))
    same(kiln.ldexp(k_of(x.float()), k_of(e)), torch.ldexp(x.float(), e))
    same(kiln.ldexp(kiln.tensor([1, 3]), kiln.tensor([2, 1])), torch.ldexp(torch.tensor([1, 3]), torch.tensor([2, 1])))
    grads_match(lambda a: kiln.ldexp(a, k_of(e)), lambda a: torch.ldexp(a, e), x)


def test_ldexp_keeps_16_bit_dtypes_and_does_not_overflow_early():
    for dt in (torch.float16, torch.bfloat16):
        x, e = torch.tensor([1.0, -0.75, 3.0], dtype=dt), torch.tensor([3, -2, 4])
        same(kiln.ldexp(k_of(x), k_of(e)), torch.ldexp(x, e))
        same(kiln.ldexp(k_of(x), k_of(e.int())), torch.ldexp(x, e.int()))
        same(kiln.ldexp(k_of(x), k_of(e.float())), torch.ldexp(x, e.float()))  # float32 exponent: float32
        grads_match(lambda a: kiln.ldexp(a, k_of(e)), lambda a: torch.ldexp(a, e), x)
    same(kiln.ldexp(k_of(torch.tensor([1e-3], dtype=torch.bfloat16)), k_of(torch.tensor([140]))),
         torch.ldexp(torch.tensor([1e-3], dtype=torch.bfloat16), torch.tensor([140])))
    # 2 ** 200 overflows float32, the product does not (subnormal results left out: the engine flushes them)
    for x, e in (([1e-30, 1.0, 3.0, 0.0, 1e30], [200, 200, -100, 2000, -200]), ([5.0, -1.0], [2**31 - 1, 300])):
        xt, et = torch.tensor(x), torch.tensor(e)
        same(kiln.ldexp(k_of(xt), k_of(et)), torch.ldexp(xt, et), 1e-6)
    xt, et = torch.tensor([1e-300, 0.0, 1.0], dtype=torch.float64), torch.tensor([1500, 3000, -1000])
    same(kiln.ldexp(k_of(xt), k_of(et)), torch.ldexp(xt, et), 1e-15)
    xt, et = torch.tensor([3.0, 1e-30], dtype=torch.float64), torch.tensor([2.5, 150.25], dtype=torch.float64)
    grads_match(kiln.ldexp, torch.ldexp, xt, et)


@pytest.mark.parametrize("dt", [torch.float64, torch.float32])
def test_nextafter_is_torchs(dt):
    a = torch.tensor([0.0, 1.0, 1.0, -0.0, INF, NAN, 1e-45, 3.0], dtype=dt)
    b = torch.tensor([1.0, 2.0, 0.0, -1.0, 0.0, 1.0, 0.0, 3.0], dtype=dt)
    k = kiln.nextafter(k_of(a), k_of(b))
    same(k, torch.nextafter(a, b))
    assert torch.equal(t_of(k).view(torch.int64 if dt == torch.float64 else torch.int32)[~torch.isnan(a)],
                       torch.nextafter(a, b).view(torch.int64 if dt == torch.float64 else torch.int32)[~torch.isnan(a)])
    same(k_of(a).nextafter(k_of(b)), a.nextafter(b))
    other = b.to(torch.float64 if dt == torch.float32 else torch.float32)
    same(kiln.nextafter(k_of(a), k_of(other)), torch.nextafter(a, other))  # promoted, as torch
    h = torch.tensor([1.0, 0.0, -2.0], dtype=torch.float16)
    same(kiln.nextafter(k_of(h), k_of(-h - 1)), torch.nextafter(h, -h - 1))
    with pytest.raises(RuntimeError):
        torch.nextafter(torch.tensor([1]), torch.tensor([2]))
    with pytest.raises(RuntimeError):
        kiln.nextafter(kiln.tensor([1]), kiln.tensor([2]))


# ---- renorm, cov, corrcoef, vander ----

@pytest.mark.parametrize("p,dim,maxnorm", [(2, 0, 1.0), (1, 1, 0.5), (3, -1, 2.0), (2, 0, 100.0)])
def test_renorm_is_torchs(p, dim, maxnorm):
    x = randn(3, 4, seed=5) * 2
    grads_match(lambda a: kiln.renorm(a, p, dim, maxnorm), lambda a: torch.renorm(a, p, dim, maxnorm), x,
                rtol=1e-12, atol=1e-14)
    same(k_of(x).renorm(p, dim, maxnorm), x.renorm(p, dim, maxnorm), 1e-12, 1e-14)
    k = k_of(x)
    k.renorm_(p, dim, maxnorm)
    same(k, x.renorm(p, dim, maxnorm), 1e-12, 1e-14)


def test_renorm_refuses_as_torch():
    x = randn(3, 4)
    for args in ((2, 0, -1.0), (0, 0, 1.0), (2, 2, 1.0)):
        with pytest.raises((RuntimeError, IndexError)):
            torch.renorm(x, *args)
        with pytest.raises((RuntimeError, IndexError)):
            kiln.renorm(k_of(x), *args)


@pytest.mark.parametrize("correction", [1, 0, 2])
@pytest.mark.parametrize("weights", ["none", "f", "a", "fa"])
def test_cov_is_torchs(correction, weights):
    x = randn(3, 6, seed=2)
    fw = torch.tensor([1, 2, 1, 3, 1, 2]) if "f" in weights else None
    aw = torch.tensor([0.5, 1.0, 2.0, 0.1, 1.5, 1.0], dtype=torch.float64) if "a" in weights else None
    grads_match(lambda a: kiln.cov(a, correction=correction, fweights=None if fw is None else k_of(fw),
                                   aweights=None if aw is None else k_of(aw)),
                lambda a: torch.cov(a, correction=correction, fweights=fw, aweights=aw), x, rtol=1e-12, atol=1e-14)
    same(k_of(x).cov(correction=correction), x.cov(correction=correction), 1e-12, 1e-14)


def test_cov_corrcoef_shapes_dtypes_and_refusals():
    v = torch.tensor([1.0, 4.0, 2.0, 8.0], dtype=torch.float64)
    same(kiln.cov(k_of(v)), torch.cov(v), 1e-14)
    same(kiln.cov(kiln.tensor([[1, 2, 4], [3, 1, 0]])), torch.cov(torch.tensor([[1, 2, 4], [3, 1, 0]])), 1e-6)
    x = randn(4, 7, seed=3)
    grads_match(kiln.corrcoef, torch.corrcoef, x, rtol=1e-12, atol=1e-14)
    same(k_of(x).corrcoef(), x.corrcoef(), 1e-12, 1e-14)
    same(kiln.corrcoef(k_of(v)), torch.corrcoef(v), 1e-14)
    for kw in ({"fweights": torch.tensor([1.0, 2, 1, 1])}, {"fweights": torch.tensor([1, -2, 1, 1])},
               {"aweights": torch.tensor([1, 2, 1, 1])}, {"aweights": torch.tensor([1.0, 2.0])}):
        with pytest.raises(RuntimeError):
            torch.cov(v, **kw)
        with pytest.raises(RuntimeError):
            kiln.cov(k_of(v), **{k: k_of(w) for k, w in kw.items()})
    with pytest.raises(RuntimeError):
        torch.cov(randn(2, 2, 2))
    with pytest.raises(RuntimeError):
        kiln.cov(k_of(randn(2, 2, 2)))


def test_cov_corrcoef_of_one_variable_are_0_dim_as_torch():
    # torch squeezes the result: one row of a 2-D input gives a 0-dim tensor, as a 1-D input does
    for x in (randn(1, 5, seed=4), randn(1, 1, seed=4), randn(5, seed=4), torch.tensor([[2, 5, 1]])):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's degrees-of-freedom warning for one observation
            tc, tr = torch.cov(x), torch.corrcoef(x)
        same(kiln.cov(k_of(x)), tc, 1e-12)
        same(kiln.corrcoef(k_of(x)), tr, 1e-12)
    x = randn(1, 6, seed=5)
    grads_match(kiln.cov, torch.cov, x, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("N,increasing", [(None, False), (4, True), (1, False), (0, False), (2, True)])
def test_vander_is_torchs(N, increasing):
    for x in (torch.tensor([1.5, -2.0, 3.0], dtype=torch.float64), torch.tensor([2, 3, -1]),
              torch.tensor([True, False])):
        same(kiln.vander(k_of(x), N, increasing), torch.vander(x, N, increasing))
    if N not in (0, 1):  # (N=1: ones, no graph in the reference)
        # torch.vander's own backward fails (it writes in place into what its cumprod saved): its formula
        def reference(a):
            n = 3 if N is None else N
            cols = [torch.ones(3, 1, dtype=a.dtype)] + ([torch.cumprod(a.unsqueeze(1).expand(3, n - 1), 1)]
                                                        if n > 1 else [])
            out = torch.cat(cols, 1)
            return out if increasing else out.flip(1)
        grads_match(lambda a: kiln.vander(a, N, increasing), reference,
                    torch.tensor([1.5, -2.0, 3.0], dtype=torch.float64))
    with pytest.raises(RuntimeError):
        torch.vander(torch.ones(2, 2))
    with pytest.raises(RuntimeError):
        kiln.vander(kiln.ones([2, 2]))


def test_the_names_are_there_as_in_torch():
    fns = ("linspace logspace as_tensor asarray outer ger dot vdot inner tensordot masked_select repeat_interleave "
           "take argwhere nansum nanmean nanmedian signbit copysign logit gcd lcm heaviside addmv addr addbmm renorm "
           "cov corrcoef vander frexp ldexp nextafter").split()
    for name in fns:
        assert callable(getattr(kiln, name)), name
        assert hasattr(kiln.Tensor, name) == hasattr(torch.Tensor, name), name
    for name in "copysign_ logit_ gcd_ lcm_ heaviside_ addmv_ addr_ addbmm_ renorm_ ldexp_ nextafter_".split():
        assert hasattr(torch.Tensor, name) and hasattr(kiln.Tensor, name), name


def test_in_place_forms_are_torchs():
    x, y = torch.tensor([0.2, 0.7, 0.5], dtype=torch.float64), torch.tensor([1.0, -2.0, 0.0], dtype=torch.float64)
    for name, args in (("logit_", (0.1,)), ("copysign_", (y,)), ("ldexp_", (torch.tensor([1, 2, -1]),)),
                       ("nextafter_", (y,)), ("heaviside_", (y,))):
        t, k = x.clone(), k_of(x)
        getattr(t, name)(*args)
        getattr(k, name)(*[k_of(a) if isinstance(a, torch.Tensor) else a for a in args])
        same(k, t, 1e-15)
    a, b = torch.tensor([12, 18, 7]), torch.tensor([8, 12, 0])
    for name in ("gcd_", "lcm_"):
        t, k = a.clone(), k_of(a)
        getattr(t, name)(b)
        getattr(k, name)(k_of(b))
        same(k, t)
    m, v = randn(3, 4), randn(4)
    t, k = x.clone(), k_of(x)
    t.addmv_(m, v, beta=0.5)
    k.addmv_(k_of(m), k_of(v), beta=0.5)
    same(k, t, 1e-14)
    with pytest.raises(RuntimeError):
        torch.tensor([1, 2]).logit_()
    with pytest.raises(RuntimeError):
        kiln.tensor([1, 2]).logit_()
