# More of torch's tensor API against PyTorch itself: advanced indexing with several index tensors
# (values, gradients, assignment), and the functions and methods ported scripts use (bmm, index_add,
# bincount, lerp_, the dtype= reductions, ...). Random ops are checked statistically with a fixed
# seed, not for torch's exact numbers.
import math

import numpy as np
import pytest

import kiln

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(5)


def both(a, grad=False):
    return kiln.tensor(a, requires_grad=grad), torch.tensor(a, requires_grad=grad)


def same(k, t, tol=1e-10):
    assert tuple(k.shape) == tuple(t.shape), (tuple(k.shape), tuple(t.shape))
    kn, tn = np.asarray(k.detach().tolist()), t.detach().numpy()
    if t.dtype.is_floating_point:
        assert np.allclose(kn, tn, rtol=tol, atol=tol), np.abs(kn - tn).max()
    else:
        assert (kn == tn).all()


# ---- advanced indexing with several index tensors ----

def ix(a):
    return kiln.tensor(a), torch.tensor(a)


INDEX_CASES = [
    # (shape of x, a function of (module, i, j, m) building the key)
    ((4, 5), lambda i, j, m: (i, j)),                              # x[arange, y]
    ((4, 5, 3), lambda i, j, m: (i, j)),                           # trailing dim kept
    ((3, 4, 5, 6), lambda i, j, m: (slice(None), i, j)),           # adjacent, in place
    ((3, 4, 5, 6), lambda i, j, m: (slice(None), i, slice(None), j)),  # apart: index dims first
    ((3, 4, 5, 6), lambda i, j, m: (i, 0, j)),                     # an int between: adjacent after select
    ((3, 4, 5, 6), lambda i, j, m: (slice(None), i, None, j)),     # None between: apart
    ((4, 5, 6), lambda i, j, m: (i[:, None], j[None, :])),         # broadcast to a grid
    ((4, 5, 6), lambda i, j, m: (Ellipsis, i, j)),
    ((4, 5, 6), lambda i, j, m: (m, j[:2])),                       # a mask with an integer index
    ((4, 5, 6), lambda i, j, m: (i, slice(1, 4), j)),
    ((4, 5), lambda i, j, m: (i, None, True, j)),                  # a bool with tensors: an index of shape [1]
]


@pytest.mark.parametrize("case", range(len(INDEX_CASES)))
def test_several_index_tensors_read_and_gradient(case):
    shape, key = INDEX_CASES[case]
    a = RNG.standard_normal(shape)
    i = np.array([0, 2, -1, 2])  # a repeated index: the gradient accumulates there
    j = np.array([1, 4, 0, 1]) % shape[-1]
    m = np.array([True, False, True, False])
    kx, tx = both(a, grad=True)
    kk = key(kiln.tensor(i), kiln.tensor(j), kiln.tensor(m))
    tk = key(torch.tensor(i), torch.tensor(j), torch.tensor(m))
    ky, ty = kx[kk], tx[tk]
    same(ky, ty)
    w = RNG.standard_normal(tuple(ty.shape))
    (ky * kiln.tensor(w)).sum().backward()
    (ty * torch.tensor(w)).sum().backward()
    same(kx.grad, tx.grad)


@pytest.mark.parametrize("case", range(len(INDEX_CASES)))
def test_several_index_tensors_assignment(case):
    shape, key = INDEX_CASES[case]
    a = RNG.standard_normal(shape)
    i = np.array([0, 2, -1, 1])
    j = np.array([1, 4, 0, 2]) % shape[-1]
    m = np.array([True, False, True, False])
    kx, tx = both(a)
    kk = key(kiln.tensor(i), kiln.tensor(j), kiln.tensor(m))
    tk = key(torch.tensor(i), torch.tensor(j), torch.tensor(m))
    v = RNG.standard_normal(tuple(tx[tk].shape))
    kx[kk] = kiln.tensor(v)
    tx[tk] = torch.tensor(v)
    same(kx, tx)
    kx[kk] = 7.0
    tx[tk] = 7.0
    same(kx, tx)
    if tx[tk].dim() >= 1:  # a value broadcast along the last dim
        v1 = RNG.standard_normal(tuple(tx[tk].shape)[-1:])
        kx[kk] = kiln.tensor(v1)
        tx[tk] = torch.tensor(v1)
        same(kx, tx)


def test_cross_entropy_style_pick():
    logp = RNG.standard_normal((6, 10))
    y = np.array([3, 3, 0, 9, 1, 3])
    kx, tx = both(logp, grad=True)
    kl = -kx[kiln.arange(6), kiln.tensor(y)].mean()
    tl = -tx[torch.arange(6), torch.tensor(y)].mean()
    same(kl, tl)
    kl.backward()
    tl.backward()
    same(kx.grad, tx.grad)


def test_several_index_tensors_errors_as_torch():
    kx, tx = both(RNG.standard_normal((3, 4)))
    for key in [([0, 1, 2], [0, 1]), ([0, 1], [0, 7]), ([0, -4], [0, 1])]:
        with pytest.raises(IndexError) as te:
            tx[torch.tensor(key[0]), torch.tensor(key[1])]
        with pytest.raises(IndexError) as ke:
            kx[kiln.tensor(key[0]), kiln.tensor(key[1])]
        assert str(ke.value) == str(te.value)


# ---- functions and methods of torch's API ----

def test_bmm_baddbmm_and_their_errors():
    a, b, c = RNG.standard_normal((3, 2, 4)), RNG.standard_normal((3, 4, 5)), RNG.standard_normal((3, 2, 5))
    (ka, ta), (kb, tb), (kc, tc) = both(a, True), both(b, True), both(c, True)
    for kout, tout in [(kiln.bmm(ka, kb), torch.bmm(ta, tb)), (ka.bmm(kb), ta.bmm(tb)),
                       (kiln.baddbmm(kc, ka, kb, beta=0.5, alpha=2.0), torch.baddbmm(tc, ta, tb, beta=0.5, alpha=2.0))]:
        same(kout, tout)
        kout.sum().backward()
        tout.sum().backward()
    for k, t in [(ka, ta), (kb, tb), (kc, tc)]:
        same(k.grad, t.grad)
    bad = [(np.zeros((2, 3)), np.zeros((2, 3, 4))), (np.zeros((2, 3, 4)), np.zeros((3, 4, 5)))]
    for x, y in bad:
        with pytest.raises(RuntimeError) as te:
            torch.bmm(torch.tensor(x), torch.tensor(y))
        with pytest.raises(RuntimeError) as ke:
            kiln.bmm(kiln.tensor(x), kiln.tensor(y))
        assert str(ke.value) == str(te.value)


def _outcome(f):
    """f()'s values as a list, or "error" (torch: RuntimeError or OverflowError; Kiln: KilnError or OverflowError)."""
    try:
        return f().tolist()
    except (RuntimeError, OverflowError):
        return "error"


@pytest.mark.parametrize("dt", ["uint8", "int8", "int16", "int32", "int64"])
def test_integer_add_sub_alpha_as_torch(dt):
    # uint8 takes alpha from -255 to 255 (a negative one wrapping: a.add(b, alpha=-1) is a - b), a signed
    # dtype its own values; a float alpha (1.0 too) and a bool one are refused for an integer result, as
    # torch. uint8 add/sub/add_/sub_ with alpha=-1 were refused ("alpha -1 is not a value of u8").
    kd, td = getattr(kiln, dt), getattr(torch, dt)
    alphas = [1, -1, 2, -2, 127, -128, 128, -129, 255, -255, 256, -256, 300, 2**31 - 1, -2**31, 2**31, 2**40,
              -2**63, 2**63, 1.0, -1.0, 2.0, 1.5, True, False]
    for alpha in alphas:
        for op in ["add", "sub", "add_", "sub_"]:
            def run(lib, d, wide):
                a = lib.tensor([1, 2, 200 if dt == "uint8" else 100], dtype=d)
                b = lib.tensor([1, 3, 7], dtype=lib.int64 if wide else d)
                return lambda: getattr(a, op)(b, alpha=alpha)
            for wide in (False, True):  # an int64 other: the alpha check is in int64, an in-place sum wraps into a
                want = _outcome(run(torch, td, wide))
                got = _outcome(run(kiln, kd, wide))
                assert got == want, (dt, op, alpha, wide, got, want)
    a = kiln.tensor([1, 2], dtype=kiln.uint8)
    assert a.add(kiln.tensor([1, 1], dtype=kiln.uint8), alpha=-1).tolist() == [0, 1]
    assert kiln.sub(a, kiln.tensor([3, 3], dtype=kiln.uint8), alpha=-1).tolist() == [4, 5]
    assert kiln.add(a, 3, alpha=-1).tolist() == [254, 255]
    with pytest.raises(kiln.KilnError, match=r"sub_: alpha 256, negated, is not a value of u8 \(-255 to 255"):
        a.sub_(a, alpha=256)
    with pytest.raises(kiln.KilnError, match="add: alpha 1.0 is not an int, and the result is i64"):
        kiln.add(kiln.tensor([1]), kiln.tensor([1]), alpha=1.0)
    with pytest.raises(kiln.KilnError, match="add: alpha True is a bool"):
        kiln.add(kiln.tensor([1.0]), kiln.tensor([1.0]), alpha=True)
    assert kiln.add(kiln.tensor([True]), kiln.tensor([False]), alpha=True).tolist() == [True]
    # a bool result is a + alpha * b with alpha a bool: alpha False (or 0) gives a, as torch (it gave a | b)
    for alpha in [True, False, 1, 0]:
        for op in ["add", "add_"]:
            for other in ([True, False, True, False], True):
                def run(lib):
                    a = lib.tensor([False, False, True, True])
                    b = lib.tensor(other) if isinstance(other, list) else other
                    return lambda: getattr(a, op)(b, alpha=alpha)
                assert _outcome(run(kiln)) == _outcome(run(torch)), (op, alpha, other)
    assert kiln.add(kiln.tensor([False]), kiln.tensor([True]), alpha=0).tolist() == [False]
    assert kiln.add(a, kiln.tensor([0.5, 0.5]), alpha=1.5).tolist() == [1.75, 2.75]  # a float result takes any


def test_int64_alpha_a_double_cannot_hold_is_refused_not_changed():
    # alpha travels as a double: sub(alpha=-(2**63 - 1)) computed with -2**63 (torch: 2**63 - 1), add(alpha=
    # 2**63 - 1) was refused as out of range, 2**53 + 1 acted as 2**53. Such an alpha is now refused, naming
    # it; one a double holds gives torch's result.
    for alpha in [2**53, -2**53, 2**62, -2**63, 2**53 + 1, -(2**53 + 1), 2**63 - 1, -(2**63 - 1), 2**62 + 1]:
        for op in ["add", "sub", "add_", "sub_"]:
            def run(lib):
                a, b = lib.tensor([0, 1, -1]), lib.tensor([1, 0, 1])
                return getattr(a, op)(b, alpha=alpha).tolist()
            if float(alpha) == alpha:
                assert run(kiln) == run(torch), (op, alpha)
            else:
                with pytest.raises(kiln.KilnError, match=f"{op}: alpha {alpha} is an i64 that a double cannot hold"):
                    run(kiln)
    with pytest.raises(kiln.KilnError, match="add: alpha -9223372036854775809 is not a value of i64"):
        kiln.add(kiln.tensor([1]), kiln.tensor([1]), alpha=-(2**63 + 1))
    # a float result takes it as a float, as torch
    assert (kiln.add(kiln.tensor([1.0]), kiln.tensor([1.0]), alpha=2**53 + 1).tolist() ==
            torch.add(torch.tensor([1.0]), torch.tensor([1.0]), alpha=2**53 + 1).tolist())


def test_index_add_with_alpha_repeats_and_gradient():
    x, src = RNG.standard_normal((4, 5, 3)), RNG.standard_normal((4, 4, 3))
    idx = np.array([0, 4, 0, 2])
    (kx, tx), (ks, ts) = both(x, True), both(src, True)
    ko = kiln.index_add(kx, 1, kiln.tensor(idx), ks, alpha=-2.5)
    to = torch.index_add(tx, 1, torch.tensor(idx), ts, alpha=-2.5)
    same(ko, to)
    w = RNG.standard_normal(to.shape)
    (ko * kiln.tensor(w)).sum().backward()
    (to * torch.tensor(w)).sum().backward()
    same(kx.grad, tx.grad)
    same(ks.grad, ts.grad)
    kz, tz = both(np.zeros((5, 2)))
    kz.index_add_(0, kiln.tensor([1, 1, 3]), kiln.ones(3, 2))
    tz.index_add_(0, torch.tensor([1, 1, 3]), torch.ones(3, 2, dtype=torch.float64))
    same(kz, tz)
    ki, ti = kiln.zeros(4, dtype=kiln.int64), torch.zeros(4, dtype=torch.int64)
    same(ki.index_add(0, kiln.tensor([3, 3]), kiln.tensor([2**40, 1])),
         ti.index_add(0, torch.tensor([3, 3]), torch.tensor([2**40, 1])))
    with pytest.raises(IndexError, match="Index is supposed to be a vector"):
        kz.index_add(0, kiln.tensor([[0]]), kiln.ones(1, 2))
    # alpha on an integer input: add's rules, and the input's dtype kept (an int64 input with alpha came back f32)
    for alpha in [3, -2, 0, 2**40]:
        k = ki.index_add(0, kiln.tensor([3, 0, 3]), kiln.tensor([5, 7, 1]), alpha=alpha)
        t = ti.index_add(0, torch.tensor([3, 0, 3]), torch.tensor([5, 7, 1]), alpha=alpha)
        assert k.dtype == kiln.int64 and k.tolist() == t.tolist(), alpha
        k0 = kiln.tensor(4).index_add(0, kiln.tensor([0]), kiln.tensor(5), alpha=alpha)  # a 0-d input
        t0 = torch.tensor(4).index_add(0, torch.tensor([0]), torch.tensor(5), alpha=alpha)
        assert k0.dtype == kiln.int64 and k0.tolist() == t0.tolist(), alpha
    with pytest.raises(kiln.KilnError, match="index_add: alpha 2.0 is not an int, and the result is i64"):
        ki.index_add(0, kiln.tensor([0]), kiln.tensor([1]), alpha=2.0)
    for alpha in [True, False]:  # a bool input takes a bool alpha, as add
        kb = kiln.zeros(3, dtype=kiln.bool).index_add(0, kiln.tensor([0, 2]), kiln.tensor([True, True]), alpha=alpha)
        tb = torch.zeros(3, dtype=torch.bool).index_add(0, torch.tensor([0, 2]), torch.tensor([True, True]), alpha=alpha)
        assert kb.dtype == kiln.bool and kb.tolist() == tb.tolist(), alpha


def test_bincount():
    v = np.array([0, 3, 3, 1, 7, 3])
    w = RNG.standard_normal(6)
    for kw in [{}, {"minlength": 10}, {"minlength": 2}]:
        same(kiln.bincount(kiln.tensor(v), **kw), torch.bincount(torch.tensor(v), **kw))
        same(kiln.bincount(kiln.tensor(v), kiln.tensor(w), **kw), torch.bincount(torch.tensor(v), torch.tensor(w), **kw))
    same(kiln.bincount(kiln.tensor(v), kiln.tensor(w).float()), torch.bincount(torch.tensor(v), torch.tensor(w).float()),
         tol=1e-6)
    same(kiln.bincount(kiln.tensor(np.zeros(0, np.int64))), torch.bincount(torch.tensor(np.zeros(0, np.int64))))
    with pytest.raises(RuntimeError, match="1-d non-negative integral"):
        kiln.bincount(kiln.tensor([0, -1]))


def test_multinomial_distribution_and_errors():
    kiln.manual_seed(3)
    p = kiln.tensor([[0.1, 0.0, 0.6, 0.3], [1.0, 1.0, 0.0, 2.0]])
    s = kiln.multinomial(p, 20000, replacement=True)
    assert tuple(s.shape) == (2, 20000) and s.dtype == kiln.int64
    for r, want in enumerate([[0.1, 0.0, 0.6, 0.3], [0.25, 0.25, 0.0, 0.5]]):
        freq = np.bincount(np.asarray(s[r].tolist()), minlength=4) / 20000
        assert np.abs(freq - want).max() < 0.015, freq
    # without replacement: distinct, zero weights last; the first draw follows the weights
    s = kiln.multinomial(kiln.tensor([1.0, 0.0, 3.0]), 3)
    assert sorted(s.tolist()) == [0, 1, 2] and s.tolist()[2] == 1
    firsts = [kiln.multinomial(kiln.tensor([1.0, 3.0]), 2).tolist()[0] for _ in range(2000)]
    assert abs(np.mean(firsts) - 0.75) < 0.04
    for args, kw in [(([1.0, -1.0], 1), {}), (([0.0, 0.0], 1), {}), (([1.0, 0.0, 1.0], 4), {})]:
        with pytest.raises(RuntimeError) as te:
            torch.multinomial(torch.tensor(args[0]), args[1], **kw)
        with pytest.raises(RuntimeError) as ke:
            kiln.multinomial(kiln.tensor(args[0]), args[1], **kw)
        assert str(ke.value) == str(te.value)


def test_randperm_and_randint_signatures():
    kiln.manual_seed(0)
    p = kiln.randperm(50)
    assert sorted(p.tolist()) == list(range(50)) and p.dtype == kiln.int64 and p.tolist() != list(range(50))
    a = kiln.randint(5, (1000,))
    b = kiln.randint(3, 6, (1000,))
    c = kiln.randint(10, size=(2, 3))
    assert a.dtype == kiln.int64 and set(a.tolist()) == {0, 1, 2, 3, 4}
    assert set(b.tolist()) == {3, 4, 5} and tuple(c.shape) == (2, 3)


def test_random_fills_in_place():
    kiln.manual_seed(1)
    x = kiln.empty(100000)
    assert x.normal_(2.0, 0.5) is x
    assert abs(float(x.mean()) - 2.0) < 0.01 and abs(float(x.std()) - 0.5) < 0.01
    x.uniform_(-1.0, 3.0)
    assert float(x.min()) >= -1.0 and float(x.max()) < 3.0 and abs(float(x.mean()) - 1.0) < 0.02
    x.uniform_(**{"from": 2.0, "to": 4.0})
    assert float(x.min()) >= 2.0
    x.exponential_(4.0)
    assert float(x.min()) > 0 and abs(float(x.mean()) - 0.25) < 0.005
    w = kiln.zeros(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="normal_"):
        w.normal_()


def test_lerp_addcmul_addcdiv_in_place():
    a, b, c = (RNG.standard_normal((3, 4)) for _ in range(3))
    for name, kargs, targs, kw in [
            ("lerp_", (kiln.tensor(b), 0.3), (torch.tensor(b), 0.3), {}),
            ("lerp_", (kiln.tensor(b), kiln.tensor(c)), (torch.tensor(b), torch.tensor(c)), {}),
            ("addcmul_", (kiln.tensor(b), kiln.tensor(c)), (torch.tensor(b), torch.tensor(c)), {"value": -0.5}),
            ("addcdiv_", (kiln.tensor(b), kiln.tensor(c)), (torch.tensor(b), torch.tensor(c)), {"value": 2.0})]:
        kx, tx = both(a)
        assert getattr(kx, name)(*kargs, **kw) is kx
        getattr(tx, name)(*targs, **kw)
        same(kx, tx)


# ---- 16-bit arithmetic rounds once, as torch's ----

DT16 = [(kiln.bfloat16, torch.bfloat16), (kiln.float16, torch.float16)]


def pair16(a, kdt, tdt):
    t = torch.tensor(a).to(tdt)
    return kiln.cast(kiln.tensor(t.float().numpy()), kdt), t


def f32_of(k):
    return kiln.cast(k, kiln.float32).numpy()


@pytest.mark.parametrize("kdt,tdt", DT16)
def test_a_number_in_16_bit_arithmetic_is_not_rounded_to_16_bits(kdt, tdt):
    # x * 0.1 computes in f32 with 0.1 in f32 and rounds the result once, as torch's; rounding 0.1 to bf16
    # first (0.10009765625) biased every product. torch's + and - round the number to 16 bits first (290 of
    # these x + 0.1 in bf16 are not correctly rounded); Kiln's are.
    a = np.random.default_rng(4).standard_normal(20000) * 3
    kx, tx = pair16(a, kdt, tdt)
    A = tx.double()
    for name, f, as_torch in [("x*(1/3)", lambda x: x * (1 / 3), True), ("x*0.1", lambda x: x * 0.1, True),
                              ("0.1*x", lambda x: 0.1 * x, True), ("x/3", lambda x: x / 3, True),
                              ("x+0.1", lambda x: x + 0.1, False), ("x-0.1", lambda x: x - 0.1, False),
                              ("0.1-x", lambda x: 0.1 - x, False)]:
        k = f(kx)
        assert k.dtype == kdt, name
        assert (f32_of(k) != f(A).to(tdt).float().numpy()).sum() == 0, name  # correctly rounded
        if as_torch:
            assert (f32_of(k) != f(tx).float().numpy()).sum() == 0, name
    # 3 / x: torch takes a reciprocal first; Kiln divides in f32 and rounds once.
    assert (f32_of(3 / kx) != (3 / tx.float()).to(tdt).float().numpy()).sum() == 0
    # A 0-dim 16-bit tensor keeps its dtype, and is rounded once too.
    k0 = kiln.cast(kiln.tensor(1.0), kdt) * (1 / 3)
    assert k0.dtype == kdt and f32_of(k0) == (torch.tensor(1.0, dtype=tdt) * (1 / 3)).float().numpy()


@pytest.mark.parametrize("kdt,tdt", DT16)
def test_a_number_in_16_bit_in_place_and_function_arithmetic_is_as_the_operators(kdt, tdt):
    # x *= 0.999 (an EMA's decay) as x * 0.999: rounding 0.999 to bf16 first made it 0.99609375.
    a = np.random.default_rng(5).standard_normal(20000) * 3
    for name, inplace, out in [("mul_", lambda x: x.mul_(0.999), lambda x: x * 0.999),
                               ("*=", lambda x: x.__imul__(0.1), lambda x: x * 0.1),
                               ("+=", lambda x: x.__iadd__(0.1), lambda x: x + 0.1),
                               ("-=", lambda x: x.__isub__(0.1), lambda x: x - 0.1),
                               ("/=", lambda x: x.__itruediv__(0.1), lambda x: x / 0.1),
                               ("add_ alpha", lambda x: x.add_(0.1, alpha=3.0), lambda x: x + 0.3),
                               ("*= 257", lambda x: x.__imul__(257), lambda x: x * 257),
                               ("kiln.mul", lambda x: kiln.mul(x, 0.1), lambda x: x * 0.1),
                               ("kiln.div", lambda x: kiln.div(x, 0.1), lambda x: x / 0.1),
                               ("kiln.add", lambda x: kiln.add(x, 0.1), lambda x: x + 0.1),
                               ("kiln.sub", lambda x: kiln.sub(x, 0.1), lambda x: x - 0.1),
                               ("x.mul", lambda x: x.mul(0.1), lambda x: x * 0.1)]:
        kx, tx = pair16(a, kdt, tdt)
        want = f32_of(out(kx))
        got = inplace(kx)
        assert got.dtype == kdt, name
        if name == "add_ alpha":  # 0.1 * 3 in f32 then added: within one rounding of x + 0.3
            assert np.abs(f32_of(got) - want).max() <= np.abs(want).max() * 2.0**-7, name
        else:
            assert (f32_of(got) != want).sum() == 0, name
    kx, tx = pair16(a, kdt, tdt)
    assert (f32_of(kx.mul_(0.999)) != tx.mul_(0.999).float().numpy()).sum() == 0  # as torch's
    # A 0-dim 16-bit tensor: the same single rounding in every form.
    x0 = kiln.cast(kiln.tensor(6.8125), kdt)
    n = 0.670305566414071
    want = f32_of(x0 + n)
    assert want == f32_of(kiln.cast(kiln.cast(x0, kiln.float32) + n, kdt))
    for name, got in [("kiln.add", kiln.add(x0, n)), ("+=", x0.clone().__iadd__(n)), ("add_", x0.clone().add_(n)),
                      ("kiln.sub", kiln.sub(x0, -n)), ("-=", x0.clone().__isub__(-n))]:
        assert got.dtype == kdt and got.dim() == 0, name
        assert f32_of(got) == want, name


@pytest.mark.parametrize("kdt,tdt", DT16)
def test_16_bit_lerp_addcmul_addcdiv_round_once(kdt, tdt):
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal(20000) * 3, rng.standard_normal(20000) * 3
    (ka, ta), (kb, tb) = pair16(a, kdt, tdt), pair16(b, kdt, tdt)
    kw, tw = pair16(rng.uniform(-0.2, 1.2, 20000), kdt, tdt)
    A, B, W = ta.double(), tb.double(), tw.double()
    for name, k, t, exact in [
            ("lerp .3", kiln.lerp(ka, kb, 0.3), torch.lerp(ta, tb, 0.3), A + 0.3 * (B - A)),
            ("lerp .7", kiln.lerp(ka, kb, 0.7), torch.lerp(ta, tb, 0.7), A + 0.7 * (B - A)),
            ("lerp w", kiln.lerp(ka, kb, kw), torch.lerp(ta, tb, tw), A + W * (B - A)),
            ("addcmul", kiln.addcmul(ka, ka, kb, value=0.5), torch.addcmul(ta, ta, tb, value=0.5), A + 0.5 * A * B),
            ("addcdiv", kiln.addcdiv(ka, ka, kb, value=0.5), torch.addcdiv(ta, ta, tb, value=0.5), A + 0.5 * A / B)]:
        assert k.dtype == kdt, name
        once = exact.to(tdt).float().numpy()
        assert (f32_of(k) != once).sum() <= (t.float().numpy() != once).sum(), name


@pytest.mark.parametrize("kdt,tdt", DT16)
def test_16_bit_linear_adds_the_bias_before_rounding(kdt, tdt):
    # Products and their sums exact in f32 (multiples of 1/32), so the one correct rounding is well defined.
    rng = np.random.default_rng(1)
    x, w, b = rng.integers(-8, 9, (64, 32)) / 4, rng.integers(-8, 9, (16, 32)) / 8, rng.standard_normal(16) * 3
    (kx, tx), (kw, tw), (kb, tb) = (pair16(v, kdt, tdt) for v in (x, w, b))
    once = (tx.double() @ tw.double().T + tb.double()).to(tdt).float().numpy()
    k = kiln.nn.functional.linear(kx, kw, kb)
    assert k.dtype == kdt
    assert (f32_of(k) != once).sum() == 0
    assert (torch.nn.functional.linear(tx, tw, tb).float().numpy() != once).sum() == 0
    # Under autocast from f32 inputs, on a [2, 32, 32] input, as torch's.
    x = rng.standard_normal((64, 32))
    x3 = x.reshape(2, 32, 32)
    with kiln.amp.autocast(kdt):
        k = kiln.nn.functional.linear(kiln.tensor(x3.astype(np.float32)), kiln.tensor(w.astype(np.float32)),
                                      kiln.tensor(b.astype(np.float32)))
    with torch.autocast("cpu", dtype=tdt):
        t = torch.nn.functional.linear(torch.tensor(x3, dtype=torch.float32), torch.tensor(w, dtype=torch.float32),
                                       torch.tensor(b, dtype=torch.float32))
    assert k.dtype == kdt and (f32_of(k) != t.float().numpy()).sum() == 0


def test_linear_with_bias_gradients_as_torch():
    rng = np.random.default_rng(2)
    # The last: a sequence-first input permuted to batch-first, whose rows do not fold into one matrix
    # (the batched product, no copy kept for backward), with the same values and gradients.
    for xshape, out, permute in [((5,), 3, False), ((4, 5), 3, False), ((2, 3, 5), 3, False), ((3, 2, 5), 4, True)]:
        (kx, tx), (kw, tw), (kb, tb) = (both(rng.standard_normal(s), grad=True) for s in (xshape, (out, 5), (out,)))
        kin, tin = (kx.permute(1, 0, 2), tx.permute(1, 0, 2)) if permute else (kx, tx)
        kout, tout = kiln.nn.functional.linear(kin, kw, kb), torch.nn.functional.linear(tin, tw, tb)
        same(kout, tout)
        g = rng.standard_normal(tout.shape)
        (kout * kiln.tensor(g)).sum().backward()
        (tout * torch.tensor(g)).sum().backward()
        for k, t in [(kx, tx), (kw, tw), (kb, tb)]:
            same(k.grad, t.grad)


def test_shape_functions():
    a = RNG.standard_normal((2, 1, 3, 1, 4))
    (kx, tx) = both(a, True)
    cases = [
        (lambda m, x: m.flatten(x, 1, 3), None),
        (lambda m, x: m.flatten(x), None),
        (lambda m, x: x.unflatten(2, (3, 1)), None),
        (lambda m, x: m.unflatten(x, -1, (2, -1)), None),
        (lambda m, x: x.squeeze((1, 3)), None),
        (lambda m, x: m.squeeze(x, (0, -2)), None),
        (lambda m, x: m.movedim(x, 0, -1), None),
        (lambda m, x: x.movedim((0, 2), (3, 0)), None),
        (lambda m, x: m.diagonal(x[:, 0, :, 0, :], 1, 1, 2), None),
        (lambda m, x: m.diagonal(x[:, 0, :, 0, :], -1, 2, 0), None),
        (lambda m, x: x[:, 0, :, 0, :].diagonal(), None),
    ]
    for fn, _ in cases:
        same(fn(kiln, kx), fn(torch, tx))
    parts_k = kiln.split(kx, [1, 2], dim=2)
    parts_t = torch.split(tx, [1, 2], dim=2)
    assert len(parts_k) == 2
    for k, t in zip(parts_k, parts_t):
        same(k, t)
    for k, t in zip(kx.split([3, 1], -1), tx.split([3, 1], -1)):
        same(k, t)
    loss_k = sum((fn(kiln, kx) ** 2).sum() for fn, _ in cases)
    loss_t = sum((fn(torch, tx) ** 2).sum() for fn, _ in cases)
    loss_k.backward()
    loss_t.backward()
    same(kx.grad, tx.grad)
    with pytest.raises(RuntimeError) as te:
        torch.split(torch.zeros(5), [1, 2])
    with pytest.raises(RuntimeError) as ke:
        kiln.split(kiln.zeros(5), [1, 2])
    assert str(ke.value) == str(te.value)


def test_reductions_with_dtype():
    a = np.array([[100, 100, 100], [-128, 5, 7]], dtype=np.int8)
    kx, tx = kiln.tensor(a), torch.tensor(a)
    same(kiln.sum(kx, dtype=kiln.int64), torch.sum(tx, dtype=torch.int64))
    same(kx.sum(1, dtype=kiln.int64), tx.sum(1, dtype=torch.int64))
    same(kiln.cumsum(kx, 1, dtype=kiln.int64), torch.cumsum(tx, 1, dtype=torch.int64))
    same(kx.cumsum(0, dtype=kiln.float64), tx.cumsum(0, dtype=torch.float64))
    same(kiln.mean(kx, dtype=kiln.float64), torch.mean(tx, dtype=torch.float64))
    same(kx.mean(0, True, dtype=kiln.float64), tx.mean(0, True, dtype=torch.float64))


def test_where_one_argument_and_nonzero_as_tuple():
    a = np.array([[0.0, 1.5, 0.0], [2.0, 0.0, -1.0]])
    kx, tx = kiln.tensor(a), torch.tensor(a)
    for k, t in [(kiln.where(kx > 0), torch.where(tx > 0)), (kiln.nonzero(kx, as_tuple=True),
                                                             torch.nonzero(tx, as_tuple=True)),
                 (kx.nonzero(as_tuple=True), tx.nonzero(as_tuple=True))]:
        assert isinstance(k, tuple) and len(k) == len(t) == 2
        for kk, tt in zip(k, t):
            same(kk, tt)
    same(kiln.where(kx > 0, kx, 0.0), torch.where(tx > 0, tx, 0.0))
    same(kiln.nonzero(kx), torch.nonzero(tx))
    r, c = kiln.where(kx != 0)
    same(kx[r, c], tx[torch.where(tx != 0)])


@pytest.mark.parametrize("name,args", [
    ("max", (1,)), ("min", (0, True)), ("sort", (1,)), ("topk", (2,)), ("median", (1,)), ("mode", (1,)),
    ("kthvalue", (2, 1)), ("cummax", (1,)), ("cummin", (0,))])
def test_value_index_pairs_are_named_tuples(name, args):
    a = np.array([[3.0, 1.0, 2.0, 1.0], [0.5, 4.0, 4.0, -1.0], [2.0, 2.0, 0.0, 7.0]])
    if name in ("topk", "kthvalue"):  # which of equal values they pick is not specified: none here
        a = np.array([[3.0, 1.0, 2.0, 1.5], [0.5, 4.0, 4.5, -1.0], [2.0, 2.5, 0.0, 7.0]])
    kx, tx = kiln.tensor(a), torch.tensor(a)
    for k, t in [(getattr(kiln, name)(kx, *args), getattr(torch, name)(tx, *args)),
                 (getattr(kx, name)(*args), getattr(tx, name)(*args))]:
        assert type(k).__name__ == name and isinstance(k, tuple)
        same(k.values, t.values)
        same(k.indices, t.indices)
        v, i = k
        same(v, t[0])
        same(i, t[1])
    assert isinstance(getattr(kiln, name), object)
    if name in ("max", "min"):
        same(getattr(kiln, name)(kx), getattr(torch, name)(tx))  # no dim: one tensor


def test_format_of_a_zero_dim_tensor():
    k, t = kiln.tensor(0.123456), torch.tensor(0.123456)
    assert f"{k:.4f}" == f"{t:.4f}" == "0.1235"
    assert f"{kiln.tensor(7):>4d}" == f"{torch.tensor(7):>4d}"
    assert format(kiln.tensor([1.0, 2.0])) == str(kiln.tensor([1.0, 2.0]))
    with pytest.raises(TypeError):
        f"{kiln.tensor([1.0, 2.0]):.4f}"


@pytest.mark.parametrize("name", ["clamp", "clamp_min", "clamp_max"])
def test_clamp_gradient_at_a_bound_is_zero_as_torch(name):
    a = np.array([0.0, 1.0, 0.5, -1.0, 2.0])
    kx, tx = both(a, True)
    k_fn = {"clamp": lambda x: x.clamp(0.0, 1.0), "clamp_min": lambda x: x.clamp(min=0.0),
            "clamp_max": lambda x: x.clamp(max=1.0)}[name]
    k_fn(kx).sum().backward()
    getattr(tx, name)(*((0.0, 1.0) if name == "clamp" else (1.0,) if name == "clamp_max" else (0.0,))).sum().backward()
    same(kx.grad, tx.grad)
    F, TF = kiln.nn.functional, torch.nn.functional
    kx.grad, tx.grad = None, None
    (F.hardtanh(kx, 0.0, 1.0) + F.relu6(kx * 6.0) + F.relu(kx)).sum().backward()
    (TF.hardtanh(tx, 0.0, 1.0) + TF.relu6(tx * 6.0) + TF.relu(tx)).sum().backward()
    same(kx.grad, tx.grad)


def test_clamp_with_tensor_bounds_splits_the_gradient_at_a_tie_as_torch():
    a = np.array([0.0, 1.0, 0.5, -1.0, 2.0, float("nan")])
    (kx, tx), (klo, tlo), (khi, thi) = both(a, True), both(np.array(0.0), True), both(np.array([1.0]), True)
    for kargs, targs in [((klo, khi), (tlo, thi)), ((klo, None), (tlo, None)), ((None, khi), (None, thi))]:
        ko, to = kx.clamp(*kargs), tx.clamp(*targs)
        assert np.allclose(ko.detach().numpy(), to.detach().numpy(), equal_nan=True)
        (ko * kiln.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 0.0])).sum().backward()
        (to * torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 0.0], dtype=torch.float64)).sum().backward()
    for k, t in [(kx, tx), (klo, tlo), (khi, thi)]:
        same(k.grad, t.grad)


ACTIVATIONS = [("relu", {}), ("relu6", {}), ("elu", {"alpha": 0.7}), ("selu", {}), ("celu", {"alpha": 1.3}),
               ("leaky_relu", {"negative_slope": 0.2}), ("hardtanh", {"min_val": -0.5, "max_val": 0.8}),
               ("hardsigmoid", {}), ("hardswish", {}), ("silu", {}), ("mish", {})]


@pytest.mark.parametrize("name,kw", ACTIVATIONS)
def test_activation_inplace_argument(name, kw):
    # (1e-6: celu and hardsigmoid differ from torch's in the last float digits)
    F, TF = kiln.nn.functional, torch.nn.functional
    a = RNG.standard_normal((3, 5)) * 3
    # a tensor that needs no gradient is changed in place, as torch's
    kx, tx = both(a)
    ko = getattr(F, name)(kx, inplace=True, **kw)
    to = getattr(TF, name)(tx, inplace=True, **kw)
    same(ko, to, 1e-6)
    same(kx, tx, 1e-6)
    # inside a graph (x requires grad): the result is a new tensor (Kiln records no in-place op), with
    # torch's values and gradients
    kw_, tw_ = both(a, True)
    kh, th = kw_ * 2.0, tw_ * 2.0
    ko = getattr(F, name)(kh, inplace=True, **kw)
    to = getattr(TF, name)(th, inplace=True, **kw)
    same(ko, to, 1e-6)
    ko.sum().backward()
    to.sum().backward()
    same(kw_.grad, tw_.grad, 1e-6)
    same(getattr(F, name)(kiln.tensor(a), **kw), getattr(TF, name)(torch.tensor(a), **kw), 1e-6)


def test_binary_cross_entropy_refuses_probabilities_outside_0_1():
    F, TF = kiln.nn.functional, torch.nn.functional
    y = [1.0, 0.0, 1.0]
    for p in ([1.5, 0.2, 0.3], [0.5, -0.1, 0.3], [float("nan"), 0.2, 0.3]):
        with pytest.raises(RuntimeError, match="all elements of input should be between 0 and 1"):
            TF.binary_cross_entropy(torch.tensor(p), torch.tensor(y))
        with pytest.raises(RuntimeError, match="all elements of input should be between 0 and 1") as e:
            F.binary_cross_entropy(kiln.tensor(p), kiln.tensor(y))
    assert "min 0.2 and max 1.5" in str(kiln_error(F, [1.5, 0.2, 0.3], y))
    p = [0.0, 1.0, 0.25]  # the bounds themselves are fine
    same(F.binary_cross_entropy(kiln.tensor(p), kiln.tensor(y)), TF.binary_cross_entropy(torch.tensor(p),
                                                                                         torch.tensor(y)), tol=1e-6)


def test_binary_cross_entropy_refuses_a_bool_or_integer_target_as_torch():
    # torch refuses them on every path; Kiln's engine path took them, its weighted path failed in `1 - target`.
    F, TF = kiln.nn.functional, torch.nn.functional
    x = [0.3, -1.2, 2.0]
    for y in ([True, False, True], [1, 0, 1]):
        calls = [(F.binary_cross_entropy, TF.binary_cross_entropy, [0.5, 0.2, 0.9], {})] + [
            (F.binary_cross_entropy_with_logits, TF.binary_cross_entropy_with_logits, x, kw)
            for kw in ({}, {"weight": [1.0, 2.0, 1.0]}, {"pos_weight": [2.0, 2.0, 2.0]})]
        for kf, tf, inp, kw in calls:
            with pytest.raises(RuntimeError):
                tf(torch.tensor(inp), torch.tensor(y), **{k: torch.tensor(v) for k, v in kw.items()})
            with pytest.raises(RuntimeError, match="target must be a floating tensor"):
                kf(kiln.tensor(inp), kiln.tensor(y), **{k: kiln.tensor(v) for k, v in kw.items()})


def kiln_error(F, p, y):
    try:
        F.binary_cross_entropy(kiln.tensor(p), kiln.tensor(y))
    except RuntimeError as e:
        return e
    return None


# ---- a number beside a 16-bit tensor in the other ops: as torch's ----
# Measured over every finite bf16 and f16 value: torch rounds the number to the tensor's dtype first in
# comparisons, pow, fmod and remainder (bf16 x == 0.1 is x == 0.10009765625, True for that x); clamp, where
# and masked_fill give the number's 16-bit rounding whatever the order.

def all16(kdt, tdt):
    t = torch.arange(0, 1 << 16, dtype=torch.int32).to(torch.int16).view(tdt)
    t = t[torch.isfinite(t)]
    return kiln.cast(kiln.tensor(t.float().numpy()), kdt), t


def differ(k, t, keep=None):
    a = f32_of(k) if k.dtype != kiln.bool else k.numpy()
    b = t.float().numpy() if t.dtype != torch.bool else t.numpy()
    bad = ~((a == b) | (np.isnan(a) & np.isnan(b)))
    return int(bad[keep].sum() if keep is not None else bad.sum())


NUMBERS = [0.1, 1 / 3, 0.999, -0.3, 2.5, 65519.0, 1e10, 257]


@pytest.mark.parametrize("kdt,tdt", DT16)
def test_16_bit_comparisons_with_a_number_are_torchs(kdt, tdt):
    kx, tx = all16(kdt, tdt)
    for s in NUMBERS:
        for name, kf, tf in [("==", lambda x: x == s, lambda x: x == s), ("!=", lambda x: x != s, lambda x: x != s),
                             ("<", lambda x: x < s, lambda x: x < s), ("<=", lambda x: x <= s, lambda x: x <= s),
                             (">", lambda x: x > s, lambda x: x > s), (">=", lambda x: x >= s, lambda x: x >= s),
                             ("eq", lambda x: kiln.eq(x, s), lambda x: torch.eq(x, s)),
                             ("ne", lambda x: kiln.ne(x, s), lambda x: torch.ne(x, s)),
                             ("lt", lambda x: kiln.lt(x, s), lambda x: torch.lt(x, s)),
                             ("le", lambda x: kiln.le(x, s), lambda x: torch.le(x, s)),
                             ("gt", lambda x: kiln.gt(x, s), lambda x: torch.gt(x, s)),
                             ("ge", lambda x: kiln.ge(x, s), lambda x: torch.ge(x, s))]:
            k, t = kf(kx), tf(tx)
            assert k.dtype == kiln.bool and differ(k, t) == 0, (name, s)
    # The brief's case: bf16 0.10009765625 == 0.1 is True in torch (0.1 rounds to it), and a 0-dim tensor too.
    x0 = kiln.cast(kiln.tensor(0.1), kdt)
    assert bool(x0 == 0.1) == bool(torch.tensor(0.1).to(tdt) == 0.1) is True
    assert bool(x0 > 0.1) == bool(torch.tensor(0.1).to(tdt) > 0.1) is False


@pytest.mark.parametrize("kdt,tdt", DT16)
def test_16_bit_pow_fmod_remainder_clamp_where_with_a_number_are_torchs(kdt, tdt):
    kiln.set_flush_denormal(False)  # as torch's default: bf16 has f32's subnormals, inputs and results
    try:
        check_16_bit_ops_with_a_number(kdt, tdt)
    finally:
        kiln.set_flush_denormal(True)


def check_16_bit_ops_with_a_number(kdt, tdt):
    kx, tx = all16(kdt, tdt)
    km, tm = kx > 0, tx > 0
    xv = tx.double().numpy()
    ops = [("pow", lambda x, s: kiln.pow(x, s), lambda x, s: torch.pow(x, s)),
           ("**", lambda x, s: x ** s, lambda x, s: x ** s), ("r**", lambda x, s: s ** x, lambda x, s: s ** x),
           ("fmod", lambda x, s: kiln.fmod(x, s), lambda x, s: torch.fmod(x, s)),
           ("remainder", lambda x, s: kiln.remainder(x, s), lambda x, s: torch.remainder(x, s)),
           ("%", lambda x, s: x % s, lambda x, s: x % s), ("r%", lambda x, s: s % x, lambda x, s: s % x),
           ("clamp", lambda x, s: kiln.clamp(x, min=-abs(s), max=abs(s)),
            lambda x, s: torch.clamp(x, min=-abs(s), max=abs(s))),
           ("where", lambda x, s: kiln.where(km, x, s), lambda x, s: torch.where(tm, x, s)),
           ("masked_fill", lambda x, s: x.masked_fill(km, s), lambda x, s: x.masked_fill(tm, s))]
    for s in [0.1, 1 / 3, 0.999, 1.7, -0.3, 2.5, 0.5, -0.5, 2.0, -1.0, 3.0]:
        for name, kf, tf in ops:
            # torch's bf16 x ** 3 is x * x * x, rounded after each product, and x ** -0.5 is 1 / sqrt(x)
            # (-inf at -0, where pow gives inf); Kiln's computes pow in f32 and rounds once.
            if name in ("pow", "**") and tdt == torch.bfloat16 and s in (3.0, -0.5):
                continue
            k, t = kf(kx, s), tf(tx, s)
            assert k.dtype == kdt, (name, s)
            # torch's bf16 fmod and remainder divide in f32 first: a quotient beyond f32 (|x| > 3e37 by 0.1,
            # 0.1 by a subnormal x) gives NaN there; Kiln's is the exact remainder.
            with np.errstate(divide="ignore"):
                q = np.abs(xv / s) if name in ("fmod", "remainder", "%") else np.abs(s / xv) if name == "r%" else None
            keep = None if q is None or tdt != torch.bfloat16 else q < 2.0**120
            assert differ(k, t, keep) == 0, (name, s)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_16_bit_conv_transpose2d_bias_rounds_once_on_the_cpu_and_as_torch_on_cuda(device):
    # On the CPU the pass computes in f32 and adds the bias before the one rounding (this guards that
    # result); on CUDA the bias is added to the 16-bit cuDNN output, as torch's CUDA convolutions do, so
    # there the result is the product rounded, plus the bias, rounded (docs/ops.md). Products and sums
    # exact in f32, so both roundings are well defined (torch's bf16 CPU gives the one; its f16 does not).
    # Rounding the product first misses the one rounding in about a third of these outputs.
    if device == "cuda" and not kiln.cuda_is_available():
        pytest.skip("needs a GPU")
    rng = np.random.default_rng(2)
    x, w, b = rng.integers(-60, 61, (2, 8, 5, 5)), rng.integers(-11, 12, (8, 4, 3, 3)) / 256, rng.standard_normal(4)
    for kdt, tdt in DT16:
        (kx, tx), (kw, tw), (kb, tb) = (pair16(v, kdt, tdt) for v in (x, w, b))
        once = torch.nn.functional.conv_transpose2d(tx.double(), tw.double(), tb.double()).to(tdt).float().numpy()
        twice = (torch.nn.functional.conv_transpose2d(tx.double(), tw.double()).to(tdt).double()
                 + tb.double()[None, :, None, None]).to(tdt).float().numpy()
        assert (twice != once).sum() > 0  # the data tells the two rules apart
        k = kiln.nn.functional.conv_transpose2d(kx.to(device), kw.to(device), kb.to(device))
        assert k.dtype == kdt and str(k.device).startswith(device)
        assert (f32_of(k.cpu()) != (once if device == "cpu" else twice)).sum() == 0
        if tdt == torch.bfloat16 and device == "cpu":
            assert (torch.nn.functional.conv_transpose2d(tx, tw, tb).float().numpy() != once).sum() == 0


@pytest.mark.parametrize("kdt,tdt", DT16)
def test_16_bit_baddbmm_rounds_once_and_autocasts_as_torch(kdt, tdt):
    rng = np.random.default_rng(3)
    a, b1, b2 = rng.standard_normal((4, 8, 8)), rng.standard_normal((4, 8, 16)), rng.standard_normal((4, 16, 8))
    # Under autocast from f32: torch's lower-precision list has baddbmm, so the result is 16-bit.
    f = [np.asarray(v, np.float32) for v in (a, b1, b2)]
    for kw in [{}, {"beta": 0.5, "alpha": 2.0}]:
        with kiln.amp.autocast(kdt):
            k = kiln.baddbmm(*(kiln.tensor(v) for v in f), **kw)
        with torch.autocast("cpu", dtype=tdt):
            t = torch.baddbmm(*(torch.tensor(v) for v in f), **kw)
        assert t.dtype == tdt and k.dtype == kdt, kw
        assert differ(k, t) == 0, kw
    # 16-bit inputs: the product joins the sum in f32 and the result is rounded once (torch's).
    (ka, ta), (k1, t1), (k2, t2) = (pair16(v, kdt, tdt) for v in (a, b1, b2))
    once = (ta.double() + t1.double() @ t2.double()).to(tdt)
    k = kiln.baddbmm(ka, k1, k2)
    assert k.dtype == kdt and differ(k, once) == 0 and differ(k, torch.baddbmm(ta, t1, t2)) == 0
    # The gradients still reach every operand.
    ka, k1, k2 = (v.detach().requires_grad_(True) for v in (ka, k1, k2))
    kiln.baddbmm(ka, k1, k2).sum().backward()
    assert all(v.grad is not None and v.grad.dtype == kdt for v in (ka, k1, k2))


@pytest.mark.parametrize("kdt,tdt", DT16)
def test_16_bit_pow_of_a_number_is_one_op_in_both_spellings(kdt, tdt):
    # x ** e and kiln.pow(x, e) are one op (e a 0-dim tensor of x's dtype): the same values and gradients.
    # torch's two spellings differ in the gradient: its x ** e multiplies by e - 1 unrounded, its
    # torch.pow(x, e_tensor) by e - 1 rounded to 16 bits (as Kiln's, whose gradient is this one's).
    rng = np.random.default_rng(7)
    v = np.concatenate([rng.uniform(0.05, 4.0, 500), [0.0, 1.0, 2.0]])
    for e in [0.1, 1 / 3, 2.5, -0.3, 0.0, 1.0, 2.0]:
        kx, tx = pair16(v, kdt, tdt)
        ka, kb = (kx.detach().requires_grad_(True) for _ in range(2))
        ya, yb = ka ** e, kiln.pow(kb, e)
        assert differ(ya.detach(), torch.tensor(f32_of(yb.detach()))) == 0, e
        ya.sum().backward()
        yb.sum().backward()
        ga, gb = f32_of(ka.grad), f32_of(kb.grad)
        assert np.array_equal(ga, gb, equal_nan=True), e
        tt = tx.detach().requires_grad_(True)
        torch.pow(tt, torch.tensor(e, dtype=tdt)).sum().backward()
        keep = v != 0 if e < 1 else None  # 0 ** (e - 1) is inf there: inf or NaN as the order of rounding goes
        assert differ(ka.grad, tt.grad, keep) == 0, e
        if e == 0.0:
            assert (ga == 0).all()  # a ** 0 is constant: 0, not 0 * inf, at a == 0 too (torch's)


@pytest.mark.parametrize("kdt,tdt", DT16 + [(kiln.float32, torch.float32)])
def test_baddbmm_with_beta_0_does_not_read_input_and_gives_it_a_zero_gradient(kdt, tdt):
    rng = np.random.default_rng(4)
    a, b1, b2 = rng.standard_normal((2, 3, 3)), rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 4, 3))
    a[0, 0, 0] = np.nan  # not read: no NaN in the result
    (ka, ta), (k1, t1), (k2, t2) = (pair16(v, kdt, tdt) if kdt != kiln.float32 else
                                    (kiln.tensor(np.float32(v)), torch.tensor(np.float32(v))) for v in (a, b1, b2))
    for alpha in [1, 0.5]:
        ki, ti = ka.detach().requires_grad_(True), ta.detach().requires_grad_(True)
        k, t = kiln.baddbmm(ki, k1, k2, beta=0, alpha=alpha), torch.baddbmm(ti, t1, t2, beta=0, alpha=alpha)
        kv = k.detach()
        assert k.dtype == kdt and differ(kv, t.detach()) == 0 and not np.isnan(f32_of(kv)).any()
        if alpha == 1:  # the plain bmm
            assert differ(kv, torch.tensor(f32_of(kiln.bmm(k1, k2)))) == 0
        k.sum().backward()  # only input requires grad, as torch's: zeros
        t.sum().backward()
        assert ki.grad is not None and ki.grad.dtype == kdt and (f32_of(ki.grad) == 0).all()
        assert (ti.grad == 0).all()


def test_activation_gradients_at_nan_and_infinities_as_torch():
    # hardtanh and relu6 gave 0 at NaN; torch's hardtanh_backward passes the gradient there (0 only at or
    # past a bound). elu, selu and celu gave NaN at NaN; torch gives their positive side's slope. Each point is
    # its own one-element tensor: torch's vectorised CPU loop differs from its scalar one (and its CUDA
    # kernel) at NaN, and the scalar rule is the one Kiln follows. softsign at +-inf is left out: Kiln gives
    # the limit 0, torch NaN (its composite x / (1 + |x|) differentiates to inf / inf there).
    F, TF = kiln.nn.functional, torch.nn.functional
    points = [float("nan"), float("inf"), float("-inf"), -1.0, 1.0, 0.0, 6.0, -0.5, 0.5, 3.0, -3.0, 20.0, -20.0]
    fns = {"hardtanh": ({},), "relu6": ({},), "relu": ({},), "leaky_relu": ({"negative_slope": 0.1},),
           "elu": ({"alpha": 0.7},), "selu": ({},), "celu": ({"alpha": 1.3},), "hardsigmoid": ({},),
           "hardswish": ({},), "softplus": ({},), "softsign": ({},), "logsigmoid": ({},), "silu": ({},),
           "mish": ({},), "hardshrink": ({},), "softshrink": ({},), "tanhshrink": ({},)}
    wrong = []
    for name, (kw,) in fns.items():
        if not hasattr(F, name):
            continue
        for p in points:
            if name == "softsign" and math.isinf(p):
                continue
            kx, tx = both(np.array([p]), True)
            getattr(F, name)(kx, **kw).sum().backward()
            getattr(TF, name)(tx, **kw).sum().backward()
            kg, tg = kx.grad.tolist()[0], tx.grad.tolist()[0]
            if not (kg == tg or (math.isnan(kg) and math.isnan(tg)) or abs(kg - tg) <= 1e-6 * abs(tg)):
                wrong.append((name, p, kg, tg))
    assert not wrong, wrong


def test_batch_norm_refuses_a_negative_zero_or_nan_eps_as_torch():
    # A negative eps gave NaN channels silently; torch refuses eps <= 0 in training and eps < 0 in eval. A NaN
    # eps, which torch takes (every output NaN), is refused too. eps=0 in eval mode is fine in both.
    F, TF = kiln.nn.functional, torch.nn.functional
    a = RNG.standard_normal((4, 3))
    kx, tx = both(a)
    krm, trm = both(np.zeros(3))
    krv, trv = both(np.ones(3))
    for training, eps, why in ((True, -1.0, "positive during training"), (True, 0.0, "positive during training"),
                               (False, -1e-5, "non-negative")):
        with pytest.raises(ValueError, match=f"eps must be {why}"):
            TF.batch_norm(tx, trm, trv, training=training, eps=eps)
        with pytest.raises(RuntimeError, match=f"batch_norm: eps must be {why}, got"):
            F.batch_norm(kx, krm, krv, training=training, eps=eps)
    for training in (True, False):
        with pytest.raises(RuntimeError, match="batch_norm: eps is NaN"):
            F.batch_norm(kx, krm, krv, training=training, eps=float("nan"))
    same(F.batch_norm(kx, krm, krv, training=False, eps=0.0), TF.batch_norm(tx, trm, trv, training=False, eps=0.0))
    # the modules, as torch: built with any eps, refused when run
    kx, tx = both(a.astype(np.float32))
    for km, tm, x, xt in ((kiln.nn.BatchNorm1d(3, eps=-1.0), torch.nn.BatchNorm1d(3, eps=-1.0), kx, tx),
                          (kiln.nn.BatchNorm2d(3, eps=-1.0), torch.nn.BatchNorm2d(3, eps=-1.0),
                           kx.reshape(4, 3, 1, 1), tx.reshape(4, 3, 1, 1))):
        for train in (True, False):
            km.train(train), tm.train(train)
            with pytest.raises(ValueError, match="eps must be"):
                tm(xt)
            with pytest.raises(RuntimeError, match="batch_norm: eps must be"):
                km(x)


def test_instance_norm_with_running_stats_takes_any_eps_as_torch():
    # It runs as a batch norm, whose eps check (positive in training) refused InstanceNorm2d(eps=0,
    # track_running_stats=True) naming batch_norm; torch takes it.
    a = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    kx, tx = both(a)
    km = kiln.nn.InstanceNorm2d(3, eps=0.0, affine=True, track_running_stats=True)
    tm = torch.nn.InstanceNorm2d(3, eps=0.0, affine=True, track_running_stats=True)
    for train in (True, False):
        km.train(train), tm.train(train)
        same(km(kx), tm(tx), tol=1e-5)
        same(km.running_mean, tm.running_mean, tol=1e-6)
        same(km.running_var, tm.running_var, tol=1e-6)
    F, TF = kiln.nn.functional, torch.nn.functional
    krm, trm = both(np.zeros(3, np.float32))
    krv, trv = both(np.ones(3, np.float32))
    same(F.instance_norm(kx, krm, krv, eps=0.0), TF.instance_norm(tx, trm, trv, eps=0.0), tol=1e-5)
    same(krm, trm, tol=1e-6)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_binary_cross_entropy_gradient_at_p_0_and_1_is_torchs(reduction):
    # A saturated sigmoid gives p exactly 0 or 1; the gradient through maximum(log(p), -100) was NaN
    # there (log's infinite derivative times 0). torch's backward, (p - y) / max(p (1 - p), 1e-12), is not.
    F, TF = kiln.nn.functional, torch.nn.functional
    kx = kiln.tensor([20.0, -120.0, 3.0], requires_grad=True)
    tx = torch.tensor([20.0, -120.0, 3.0], requires_grad=True)
    y = [1.0, 0.0, 1.0]
    F.binary_cross_entropy(kiln.sigmoid(kx), kiln.tensor(y), reduction=reduction).sum().backward()
    TF.binary_cross_entropy(torch.sigmoid(tx), torch.tensor(y), reduction=reduction).sum().backward()
    np.testing.assert_allclose(kx.grad.numpy(), tx.grad.numpy(), rtol=1e-5, atol=1e-7)
    # p itself at the bounds, with a weight, and the target's gradient
    p, y = [0.0, 1.0, 0.0, 0.3], [1.0, 0.0, 0.5, 0.25]
    kp, tp = kiln.tensor(p, requires_grad=True), torch.tensor(p, requires_grad=True)
    ky, ty = kiln.tensor(y, requires_grad=True), torch.tensor(y, requires_grad=True)
    w = [0.5, 2.0, 1.0, 3.0]
    kl = F.binary_cross_entropy(kp, ky, weight=kiln.tensor(w), reduction=reduction)
    tl = TF.binary_cross_entropy(tp, ty, weight=torch.tensor(w), reduction=reduction)
    np.testing.assert_allclose(kl.detach().numpy(), tl.detach().numpy(), rtol=1e-6)
    kl.sum().backward()
    tl.sum().backward()
    assert np.isfinite(kp.grad.numpy()).all()
    np.testing.assert_allclose(kp.grad.numpy(), tp.grad.numpy(), rtol=1e-6)
    # the target's gradient is the clamped forward's own, log(1 - p) - log(p) with each log at least -100:
    # finite at the bounds, where torch's (unclamped) is inf; the same inside
    np.testing.assert_allclose(ky.grad.numpy()[3], ty.grad.numpy()[3], rtol=1e-6)
    scale = {"mean": 0.25, "sum": 1.0, "none": 1.0}[reduction]
    np.testing.assert_allclose(ky.grad.numpy()[:3], np.array([0.5 * 100, 2.0 * -100, 100]) * scale, rtol=1e-6)


def test_cross_entropy_and_nll_take_a_uint8_target_as_torch():
    # torch takes Long or Byte class indices; Kiln refused uint8 ("target must hold class indices (i64)")
    F, TF = kiln.nn.functional, torch.nn.functional
    x = np.random.default_rng(3).standard_normal((6, 5)).astype(np.float32)
    y = np.array([0, 4, 2, 3, 1, 2], np.uint8)
    kx, tx = kiln.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    kl = F.cross_entropy(kx, kiln.tensor(y), label_smoothing=0.1) + F.nll_loss(kx, kiln.tensor(y), reduction="sum")
    tl = TF.cross_entropy(tx, torch.tensor(y), label_smoothing=0.1) + TF.nll_loss(tx, torch.tensor(y), reduction="sum")
    np.testing.assert_allclose(kl.item(), tl.item(), rtol=1e-6)
    kl.backward()
    tl.backward()
    np.testing.assert_allclose(kx.grad.numpy(), tx.grad.numpy(), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(kiln.nn.CrossEntropyLoss()(kx, kiln.tensor(y)).item(),
                               torch.nn.CrossEntropyLoss()(tx, torch.tensor(y)).item(), rtol=1e-6)


def test_index_fill_as_torch():
    # index_fill / index_fill_ were missing: value (a number or a 0-d tensor) written along dim at index
    x = RNG.standard_normal((3, 4, 2))
    cases = [(1, [0, 2]), (-2, [3, 3, -1]), (0, [1]), (2, [-2]), (1, []), (0, 2)]
    for dim, idx in cases:
        for value in [-1.5, 7, True, float("nan"), "t"]:
            (kx, tx) = both(x, True)
            ki = kiln.tensor(idx, dtype=kiln.int64)
            ti = torch.tensor(idx, dtype=torch.int64)
            kv, tv = (kiln.tensor(2.5), torch.tensor(2.5)) if value == "t" else (value, value)
            ko, to = kx.index_fill(dim, ki, kv), tx.index_fill(dim, ti, tv)
            np.testing.assert_array_equal(ko.detach().numpy(), to.detach().numpy())
            w = RNG.standard_normal(x.shape)
            (ko * kiln.tensor(w)).sum().backward()
            (to * torch.tensor(w)).sum().backward()
            np.testing.assert_array_equal(kx.grad.numpy(), tx.grad.numpy())  # 0 at the filled positions
    # a 0-d value tensor that requires grad gets the gradient summed over the filled positions
    (kv, tv) = both(np.array(3.0), True)
    kiln.index_fill(kiln.tensor(x), 1, kiln.tensor([0, 3]), kv).sum().backward()
    torch.index_fill(torch.tensor(x), 1, torch.tensor([0, 3]), tv).sum().backward()
    assert kv.grad.item() == tv.grad.item() == 12.0
    # dtypes: the value in the tensor's dtype, as torch (2.7 is 2 in int64, -1 is 255 in uint8)
    for dt, value in [("int64", 2.7), ("uint8", -1), ("int32", kiln.tensor(2.7)), ("bool", 2.5), ("float16", 0.1),
                      ("bfloat16", 0.1)]:
        tval = torch.tensor(value.item()) if isinstance(value, kiln.Tensor) else value
        k = kiln.arange(6).to(getattr(kiln, dt)).index_fill(0, kiln.tensor([0, 2]), value)
        t = torch.arange(6).to(getattr(torch, dt)).index_fill(0, torch.tensor([0, 2]), tval)
        assert k.dtype == getattr(kiln, dt) and k.float().tolist() == t.float().tolist(), dt
    # in place, and on a 0-d tensor
    kz, tz = kiln.zeros(2, 3), torch.zeros(2, 3)
    assert kz.index_fill_(-1, kiln.tensor([0, 2]), 1) is kz
    tz.index_fill_(-1, torch.tensor([0, 2]), 1)
    assert kz.tolist() == tz.tolist()
    assert kiln.tensor(3.0).index_fill(-1, kiln.tensor([0]), 1).item() == 1.0
    with pytest.raises(kiln.KilnError, match="index_fill_"):
        kiln.zeros(2, 3, requires_grad=True).index_fill_(1, kiln.tensor([0]), 1.0)
    # errors as torch's
    kx = kiln.zeros(2, 3)
    with pytest.raises(IndexError, match=r"index_fill_\(\): Expected dtype int64 for index"):
        kx.index_fill(1, kiln.tensor([0, 2], dtype=kiln.int32), 5)
    with pytest.raises(IndexError, match="index 3 is out of bounds for dimension 1 with size 3"):
        kx.index_fill(1, kiln.tensor([3]), 5)
    with pytest.raises(IndexError, match="index -4 is out of bounds for dimension 1 with size 3"):
        kx.index_fill(1, kiln.tensor([0, -4]), 5)
    with pytest.raises(IndexError, match=r"Dimension out of range \(expected to be in range of \[-2, 1\], but got 2\)"):
        kx.index_fill(2, kiln.tensor([0]), 5)
    # the dimension normalised, as torch's message (it said "dimension -1")
    with pytest.raises(IndexError) as te:
        torch.zeros(2, 3).index_fill(-1, torch.tensor([3]), 5)
    with pytest.raises(IndexError) as ke:
        kx.index_fill(-1, kiln.tensor([3]), 5)
    assert "for dimension 1 with size 3" in str(te.value) and "for dimension 1 with size 3" in str(ke.value)
    with pytest.raises(IndexError, match="Index has to be a vector/scalar"):
        kx.index_fill(1, kiln.tensor([[0, 2]]), 5)
    with pytest.raises(kiln.KilnError, match="only supports a 0-dimensional value tensor, but got tensor with 1 dim"):
        kx.index_fill(1, kiln.tensor([0]), kiln.tensor([5.0]))
    with pytest.raises(kiln.KilnError, match="u8"):  # 300 does not fit uint8 (torch: overflow)
        kiln.zeros(3, dtype=kiln.uint8).index_fill(0, kiln.tensor([0]), 300)


def test_new_full_as_torch():
    for kt, tt in [(kiln.zeros(2, dtype=kiln.int32), torch.zeros(2, dtype=torch.int32)), (kiln.zeros(2), torch.zeros(2))]:
        for args, kw in [(((2, 3), 5), {}), (([2], 2.5), {}), (((), 7), {}), (((2,), True), {}),
                         (((2,), -1), {"dtype": "uint8"}), (((2, 1), 2.5), {"dtype": "float64"}),
                         (((2,), "t"), {})]:
            kargs = (args[0], kiln.tensor(3.5)) if args[1] == "t" else args
            targs = (args[0], torch.tensor(3.5)) if args[1] == "t" else args
            k = kt.new_full(*kargs, **{n: getattr(kiln, v) for n, v in kw.items()})
            t = tt.new_full(*targs, **{n: getattr(torch, v) for n, v in kw.items()})
            assert k.dtype == getattr(kiln, str(t.dtype).split(".")[-1]), (args, kw, k.dtype, t.dtype)
            assert tuple(k.shape) == tuple(t.shape) and k.tolist() == t.tolist(), (args, kw)
            assert not k.requires_grad and k.device == kt.device
    k = kiln.zeros(2, dtype=kiln.int32).new_full(size=(3,), fill_value=2.5, dtype=kiln.float32, requires_grad=True)
    assert k.requires_grad and k.is_leaf and k.tolist() == [2.5] * 3
    with pytest.raises(TypeError, match="must be tuple of ints, not int"):
        kiln.zeros(2).new_full(3, 5)
    with pytest.raises(TypeError, match="fill_value"):
        kiln.zeros(2).new_full((2,), kiln.tensor([3.5]))
    with pytest.raises(kiln.KilnError):  # 300 does not fit uint8, as torch
        kiln.zeros(2).new_full((2,), 300, dtype=kiln.uint8)
    with pytest.raises(kiln.KilnError):  # an integer tensor cannot require grad, as torch
        kiln.zeros(2).new_full((2,), 2, dtype=kiln.int64, requires_grad=True)


# ---- the long tail: allclose, empty matmuls, bool attention masks, argument checks ----
def near(k, t, tol=1e-10):
    """same() for floating results of any shape (an empty one too: tolist() loses its shape)."""
    assert tuple(k.shape) == tuple(t.shape), (tuple(k.shape), tuple(t.shape))
    kn, tn = k.detach().double().numpy(), t.detach().double().numpy()
    assert np.allclose(kn, tn, rtol=tol, atol=tol), np.abs(kn - tn).max()


@pytest.mark.parametrize("a, b, kw", [
    ([1.0, 1.0], [1.0], {}),  # broadcasts
    ([float("nan")], [float("nan")], {}),  # NaN is not close to NaN by default
    ([float("nan")], [float("nan")], {"equal_nan": True}),
    ([float("inf")], [float("-inf")], {}),
    ([float("inf")], [float("inf")], {}),
    ([float("inf")], [1.0], {}),
    ([1e10], [float("inf")], {}),
    ([1.0, 2.0], [1.0, 2.00001], {}),
    ([1.0, 2.0], [1.0, 2.1], {"rtol": 0.1}),
])
def test_allclose_as_torch(a, b, kw):
    assert kiln.allclose(kiln.tensor(a), kiln.tensor(b), **kw) == torch.allclose(torch.tensor(a), torch.tensor(b), **kw)


def test_allclose_refuses_shapes_that_do_not_broadcast():
    with pytest.raises(kiln.KilnError, match=r"\[2\].*\[3\]|broadcast"):
        kiln.allclose(kiln.ones(2), kiln.ones(3))


def test_empty_tensors_are_contiguous_with_torchs_strides():
    for shape in [(2, 0), (0, 3), (2, 0, 3), (0,)]:
        k, t = kiln.zeros(*shape), torch.zeros(*shape)
        assert k.is_contiguous() and t.is_contiguous()
        assert tuple(k.stride()) == tuple(t.stride()), shape


@pytest.mark.parametrize("fn", [
    lambda m, a, b: m.nn.functional.linear(a, b),
    lambda m, a, b: a @ b.t(),
    lambda m, a, b: m.bmm(a.unsqueeze(0), b.t().unsqueeze(0)),
])
@pytest.mark.parametrize("sa, sb", [((2, 4), (0, 4)), ((0, 4), (3, 4)), ((2, 0), (3, 0))])
def test_matmuls_with_empty_operands_as_torch(fn, sa, sb):
    a, b = RNG.standard_normal(sa), RNG.standard_normal(sb)
    ka, ta = both(a, grad=True)
    kb, tb = both(b, grad=True)
    ko, to = fn(kiln, ka, kb), fn(torch, ta, tb)
    near(ko, to)  # [2, 0] @ [0, 3] is zeros [2, 3], as torch
    ko.sum().backward()
    to.sum().backward()
    near(ka.grad, ta.grad)
    near(kb.grad, tb.grad)


def test_linear_with_no_inputs_trains_as_torch():
    km, tm = kiln.nn.Linear(0, 3), torch.nn.Linear(0, 3)
    with torch.no_grad():
        tm.bias.copy_(torch.from_numpy(km.bias.detach().numpy()))
    ky, ty = km(kiln.zeros(2, 0, requires_grad=True)), tm(torch.zeros(2, 0, requires_grad=True))
    near(ky, ty.double())
    ky.sum().backward()
    ty.sum().backward()
    assert tuple(km.weight.grad.shape) == (3, 0)
    near(km.bias.grad, tm.bias.grad.double())


def test_bool_attention_masks_keep_their_true_places_as_torchs_sdpa():
    q, k, v = arr_qkv = [RNG.standard_normal(s) for s in [(1, 2, 3, 4), (1, 2, 5, 4), (1, 2, 5, 4)]]
    mask = np.array([[True, False, True, False, True], [False] * 5, [True] * 5])  # a row of nothing: zeros
    kq, kk, kv = [kiln.tensor(a) for a in arr_qkv]
    tq, tk, tv = [torch.tensor(a) for a in arr_qkv]
    want = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, attn_mask=torch.tensor(mask))
    want = torch.nan_to_num(want)  # torch's math path may give NaN for the fully masked row; Kiln's zeros
    km = kiln.tensor(mask)
    F = kiln.nn.functional
    near(F.scaled_dot_product_attention(kq, kk, kv, attn_mask=km), want)
    near(F.attention(kq, kk, kv, km), want)
    scores = kiln.tensor(RNG.standard_normal((3, 5)))
    tw = torch.softmax(torch.tensor(scores.numpy()).masked_fill(~torch.tensor(mask), float("-inf")), -1)
    near(F.masked_softmax(scores, km), torch.nan_to_num(tw))


def test_multihead_attention_bool_masks_leave_out_their_true_places_as_torch():
    torch.manual_seed(0)
    tm = torch.nn.MultiheadAttention(4, 2).double()
    km = kiln.nn.MultiheadAttention(4, 2)
    km.load_state_dict({n: kiln.tensor(p.detach().numpy()).float() for n, p in tm.state_dict().items()})
    x = RNG.standard_normal((3, 2, 4))
    attn = np.array([[False, True, False], [False, False, True], [False, False, False]])
    pad = np.array([[False, False, True], [False, False, False]])
    ko = km(*[kiln.tensor(x).float()] * 3, attn_mask=kiln.tensor(attn), key_padding_mask=kiln.tensor(pad))[0]
    to = tm(*[torch.tensor(x)] * 3, attn_mask=torch.tensor(attn), key_padding_mask=torch.tensor(pad))[0]
    near(ko.double(), to, tol=1e-5)


def test_atan2_gradient_at_the_origin_is_torchs():
    ka, ta = both([0.0, 1.0, 0.0], grad=True)
    kb, tb = both([0.0, 1.0, -2.0], grad=True)
    kiln.atan2(ka, kb).sum().backward()
    torch.atan2(ta, tb).sum().backward()
    near(ka.grad, ta.grad)
    near(kb.grad, tb.grad)


@pytest.mark.parametrize("value", [3, True, 2.5, -7])
def test_full_infers_the_dtype_from_the_value_as_torch(value):
    k, t = kiln.full((2,), value), torch.full((2,), value)
    assert str(k.dtype).split(".")[-1] == str(t.dtype).split(".")[-1]
    assert k.tolist() == t.tolist()
    assert kiln.full((2,), 3, dtype=kiln.float32).dtype == kiln.float32
    # a 0-d tensor gives the default dtype of its kind, as torch.full (not its own: f64 -> float32)
    for kd, td in [(kiln.int64, torch.int64), (kiln.int32, torch.int32), (kiln.float64, torch.float64),
                   (kiln.float16, torch.float16), (kiln.bfloat16, torch.bfloat16), (kiln.bool, torch.bool)]:
        k, t = kiln.full((2,), kiln.tensor(1, dtype=kd)), torch.full((2,), torch.tensor(1, dtype=td))
        assert str(k.dtype).split(".")[-1] == str(t.dtype).split(".")[-1], (kd, k.dtype, t.dtype)
    with pytest.raises(TypeError, match="0-d tensor"):
        kiln.full((2,), kiln.tensor([3]))


def test_conv_transpose_takes_output_padding_below_the_dilation_as_torch():
    x, w, b = RNG.standard_normal((1, 2, 5, 5)), RNG.standard_normal((2, 3, 3, 3)), RNG.standard_normal(3)
    kx, tx = both(x, grad=True)
    kw, tw = both(w, grad=True)
    kb, tb = both(b, grad=True)
    F, TF = kiln.nn.functional, torch.nn.functional
    # padding past the stride - 1 crops rows that hold data (a review found them zeroed).
    for kwargs in [
        dict(dilation=2, output_padding=1),
        dict(stride=(2, 1), dilation=3, output_padding=(1, 2)),
        dict(dilation=3, output_padding=(2, 0), padding=(1, 1)),
        dict(dilation=2, output_padding=1, padding=3),
        dict(stride=(2, 1), dilation=3, output_padding=(2, 2), padding=(1, 2)),
    ]:
        ko, to = F.conv_transpose2d(kx, kw, kb, **kwargs), TF.conv_transpose2d(tx, tw, tb, **kwargs)
        near(ko, to)
        (ko * ko).sum().backward()
        (to * to).sum().backward()
        for kg, tg in [(kx, tx), (kw, tw), (kb, tb)]:
            near(kg.grad, tg.grad, tol=1e-9)
            kg.grad, tg.grad = None, None
    for kwargs in [dict(dilation=2, output_padding=1), dict(padding=1, dilation=3, output_padding=2)]:
        k1 = F.conv_transpose1d(kiln.tensor(x[..., 0]), kiln.tensor(w[..., 0]), **kwargs)
        near(k1, TF.conv_transpose1d(torch.tensor(x[..., 0]), torch.tensor(w[..., 0]), **kwargs))
    with pytest.raises(kiln.KilnError, match=r"conv_transpose1d: output_padding 2 .*stride 1 or the dilation 2"):
        F.conv_transpose1d(kiln.tensor(x[..., 0]), kiln.tensor(w[..., 0]), dilation=2, output_padding=2)


def test_arguments_torch_refuses_are_refused():
    F = kiln.nn.functional
    x, p = kiln.randn(4, 3), kiln.randn(4, 3).softmax(-1)
    with pytest.raises(kiln.KilnError, match="cross_entropy: ignore_index 1 .*floating target"):
        F.cross_entropy(x, p, ignore_index=1)
    F.cross_entropy(x, p)  # the default still passes
    with pytest.raises(ValueError, match=r"pad: mode \"reflect\" takes no value"):
        F.pad(kiln.randn(1, 2, 4), (1, 1), mode="reflect", value=9.0)
    F.pad(kiln.randn(1, 2, 4), (1, 1), mode="reflect", value=0.0)  # torch takes 0
    with pytest.raises(kiln.KilnError, match="amax: cannot reduce over an empty dim"):
        kiln.amax(kiln.zeros(0, 3), 0)
    with pytest.raises(kiln.KilnError, match="amin: cannot reduce over an empty dim"):
        kiln.amin(kiln.zeros(0, 3), 0)
    assert tuple(kiln.amax(kiln.zeros(0, 3), 1).shape) == (0,)
    with pytest.raises(kiln.KilnError, match="arange: the step -1 .*inconsistent with step sign"):
        kiln.arange(0, 5, -1)
    assert tuple(kiln.arange(5, 5, -1).shape) == (0,)
    with pytest.raises(ValueError, match="clamp: give min or max"):
        kiln.clamp(kiln.arange(3.0))
    with pytest.raises(TypeError, match="batch_norm: momentum must be a number, got None"):
        F.batch_norm(kiln.randn(4, 3), kiln.zeros(3), kiln.ones(3), training=True, momentum=None)


def test_kl_div_with_a_negative_target_is_nan_as_torch():
    for t in [[-0.1, 0.5], [0.0, 0.5], [0.2, 0.8]]:
        ki, ti = both([-1.0, -2.0], grad=True)
        kt, tt = both(t)
        ko = kiln.nn.functional.kl_div(ki, kt, reduction="none")
        to = torch.nn.functional.kl_div(ti, tt, reduction="none")
        assert np.array_equal(np.isnan(ko.detach().numpy()), np.isnan(to.detach().numpy())), t
        assert np.allclose(ko.detach().numpy(), to.detach().numpy(), equal_nan=True), t
        ko.sum().backward()
        to.sum().backward()
        near(ki.grad, ti.grad)


def test_dropout_inplace_writes_into_the_input_as_torch():
    F = kiln.nn.functional
    for drop in [lambda x: kiln.nn.Dropout(0.5, inplace=True)(x), lambda x: F.dropout(x, 0.5, True, True),
                 lambda x: F.dropout(x, p=0.5, inplace=True), lambda x: kiln.nn.Dropout2d(0.5, inplace=True)(x)]:
        x = kiln.ones(4, 8, 2, 2)
        y = drop(x)
        assert np.array_equal(x.numpy(), y.numpy())
        assert (x.numpy() == 0).any() and (x.numpy() == 2).any()
    x = kiln.ones(4, 8)
    y = F.dropout(x, 0.5)  # not in place by default
    assert (x.numpy() == 1).all() and (y.numpy() == 0).any()
    for drop in [lambda x: F.dropout(x, 0.5, inplace=True), lambda x: F.dropout2d(x, 0.5, inplace=True)]:
        x = kiln.ones(4, 8, 2, requires_grad=True)  # a leaf needing a gradient: refused, as torch and the activations
        with pytest.raises(kiln.KilnError, match="dropout.*inplace=True on a leaf tensor that requires grad"):
            drop(x)
        with pytest.raises(RuntimeError, match="leaf Variable"):
            torch.nn.functional.dropout(torch.ones(4, 8, 2, requires_grad=True), 0.5, inplace=True)
        y = drop(x * 1.0)  # inside a graph: a new tensor, the input unchanged
        y.sum().backward()
        assert (x.detach().numpy() == 1).all() and x.grad is not None


INPLACE_MODULES = [("ReLU", {}), ("ReLU6", {}), ("LeakyReLU", {"negative_slope": 0.2}), ("ELU", {"alpha": 0.7}),
                   ("CELU", {"alpha": 1.3}), ("SELU", {}), ("SiLU", {}), ("Mish", {}), ("Hardswish", {}),
                   ("Hardsigmoid", {}), ("Hardtanh", {"min_val": -0.5, "max_val": 0.8}),
                   ("Dropout", {"p": 0.4}), ("Dropout1d", {"p": 0.4}), ("Dropout2d", {"p": 0.4}),
                   ("Dropout3d", {"p": 0.4})]


@pytest.mark.parametrize("name,kw", INPLACE_MODULES)
def test_module_inplace_writes_into_the_input_as_torch(name, kw):
    km_, tm_ = getattr(kiln.nn, name)(inplace=True, **kw), getattr(torch.nn, name)(inplace=True, **kw)
    assert repr(km_) == repr(tm_)
    assert repr(getattr(kiln.nn, name)(**kw)) == repr(getattr(torch.nn, name)(**kw))
    dropout = name.startswith("Dropout")
    shape = {"Dropout1d": (2, 3, 4), "Dropout2d": (2, 3, 4, 5)}.get(name, (2, 3, 4, 5, 2))
    a = RNG.standard_normal(shape) * 3
    if dropout:
        km_.eval(), tm_.eval()  # eval: no randomness, the input returned (y is x, as torch)
    # a tensor that needs no gradient (or under no_grad): written in place and returned itself, as torch
    for grad_off in [False, True]:
        kx, tx = both(a)
        if grad_off:
            kx.requires_grad = True
            with kiln.no_grad():
                ky = km_(kx)
            with torch.no_grad():
                tx.requires_grad = True
                ty = tm_(tx)
        else:
            ky, ty = km_(kx), tm_(tx)
        assert ky is kx and ty is tx
        same(kx, tx, 1e-6)
        if not dropout:
            same(kx, getattr(torch.nn, name)(**kw)(torch.tensor(a)), 1e-6)
    if dropout:  # training: the input holds the dropped and scaled values
        kx = kiln.ones(*((8, 16) + shape[2:]))
        ky = getattr(kiln.nn, name)(inplace=True, **kw)(kx)
        assert ky is kx and (kx.numpy() == 0).any() and np.allclose(kx.numpy().max(), 1 / 0.6)
        km_.train(), tm_.train()
    # a leaf that requires grad: refused, as torch
    kl, tl = both(a, True)
    with pytest.raises(RuntimeError, match="leaf Variable"):
        tm_(tl)
    with pytest.raises(kiln.KilnError, match="inplace=True on a leaf tensor that requires grad"):
        km_(kl)
    # inside a graph: torch's values and gradients (a new tensor in Kiln, which records no in-place op)
    if not dropout:
        kh, th = kl * 2.0, tl * 2.0
        ko, to = km_(kh), tm_(th)
        same(ko, to, 1e-6)
        ko.sum().backward()
        to.sum().backward()
        same(kl.grad, tl.grad, 1e-6)
    # inplace=False leaves the input alone
    kx, tx = both(a)
    ky = getattr(kiln.nn, name)(**kw).eval()(kx)
    assert np.array_equal(np.asarray(kx.tolist()), a)


def test_empty_prod_and_zero_norm_stay_in_the_graph_as_torch():
    for kfn, tfn, shape in [(kiln.prod, torch.prod, (0,)), (lambda x: kiln.norm(x, 0), lambda x: torch.norm(x, 0), (3,)),
                            (lambda x: kiln.prod(x, 1), lambda x: torch.prod(x, 1), (2, 0))]:
        kx, tx = both(np.ones(shape), grad=True)
        ko, to = kfn(kx), tfn(tx)
        assert ko.requires_grad == to.requires_grad is True
        near(ko, to)
        ko.sum().backward()
        to.sum().backward()
        near(kx.grad, torch.zeros(shape, dtype=torch.float64) if tx.grad is None else tx.grad)  # torch: None is 0


def test_nbytes_is_a_property_as_torch():
    assert kiln.ones(3).nbytes == torch.ones(3).nbytes == 12
    assert kiln.ones(2, 3, dtype=kiln.float64).t().nbytes == 48


# ---- torch 2.15 spellings: inplace= returns the input object, unbatched conv/pool, broadcasting losses,
# round(decimals=), sort(stable=) ----

@pytest.mark.parametrize("name,kw", ACTIVATIONS + [("dropout", {"p": 0.4}), ("dropout1d", {"p": 0.4}),
                                                   ("dropout2d", {"p": 0.4}), ("dropout3d", {"p": 0.4})])
def test_functional_inplace_returns_the_input_object_as_torch(name, kw):
    F, TF = kiln.nn.functional, torch.nn.functional
    dropout = name.startswith("dropout")
    a = RNG.standard_normal({"dropout1d": (2, 3, 4), "dropout2d": (2, 3, 4, 5)}.get(name, (2, 3, 4, 5, 2))) * 3
    # no gradient needed, or under no_grad: written in place, and the call returns x itself (y is x)
    kx, tx = both(a)
    ky, ty = getattr(F, name)(kx, inplace=True, **kw), getattr(TF, name)(tx, inplace=True, **kw)
    assert ky is kx and ty is tx
    if not dropout:
        same(kx, tx, 1e-6)
    kx.requires_grad = True
    with kiln.no_grad():
        assert getattr(F, name)(kx, inplace=True, **kw) is kx
    # inside a graph (a non-leaf): x itself comes back holding the result, with torch's values and
    # gradients, also where the result is not used (F.relu(h, inplace=True); h.sum())
    kl, tl = both(a, True)
    for use_result in [True, False]:
        kh, th = kl * 2.0, tl * 2.0
        ko, to = getattr(F, name)(kh, inplace=True, **kw), getattr(TF, name)(th, inplace=True, **kw)
        assert ko is kh and to is th
        if not dropout:
            same(kh, th, 1e-6)
            kl.grad, tl.grad = None, None
            ((ko if use_result else kh) * 1.5).sum().backward()
            ((to if use_result else th) * 1.5).sum().backward()
            same(kl.grad, tl.grad, 1e-6)
    # dropout with training=False and inplace=True: the input itself, unchanged (torch's dropout_)
    if dropout:
        kx, tx = both(a)
        assert getattr(F, name)(kx, training=False, inplace=True, **kw) is kx
        assert getattr(TF, name)(tx, training=False, inplace=True, **kw) is tx
        same(kx, tx)
    else:  # a module inside a graph returns its input object too
        mod = {n.lower(): n for n, _ in INPLACE_MODULES}.get(name.replace("_", ""))
        if mod is not None:
            mkw = {k: v for k, v in kw.items()}
            kh = kl * 2.0
            assert getattr(kiln.nn, mod)(inplace=True, **mkw)(kh) is kh


UNBATCHED = [  # (op, input shape, extra arguments: a weight's shape or the op's own)
    ("conv1d", (3, 9), {"weight": (4, 3, 2)}, {"stride": 2, "padding": 1}),
    ("conv2d", (3, 7, 6), {"weight": (4, 3, 3, 2)}, {"padding": 1, "dilation": (1, 2)}),
    ("conv3d", (2, 5, 4, 6), {"weight": (3, 2, 2, 2, 3), "bias": (3,)}, {"stride": (1, 2, 1)}),
    ("conv_transpose1d", (3, 5), {"weight": (3, 2, 3)}, {"stride": 2, "output_padding": 1}),
    ("conv_transpose2d", (3, 4, 5), {"weight": (3, 2, 2, 3), "bias": (2,)}, {"stride": (2, 1)}),
    ("max_pool1d", (3, 9), {}, {"kernel_size": 3, "stride": 2}),
    ("max_pool2d", (3, 7, 6), {}, {"kernel_size": 2, "ceil_mode": True}),
    ("max_pool3d", (2, 5, 4, 6), {}, {"kernel_size": (2, 2, 3)}),
    ("avg_pool1d", (3, 9), {}, {"kernel_size": 3, "padding": 1}),
    ("avg_pool2d", (3, 7, 6), {}, {"kernel_size": 3, "stride": 2, "count_include_pad": False}),
    ("avg_pool3d", (2, 5, 4, 6), {}, {"kernel_size": 2}),
]


@pytest.mark.parametrize("name,shape,tensors,kw", UNBATCHED, ids=[c[0] for c in UNBATCHED])
def test_unbatched_conv_and_pool_as_torch(name, shape, tensors, kw):
    F, TF = kiln.nn.functional, torch.nn.functional
    kx, tx = both(RNG.standard_normal(shape), True)
    kt, tt = {}, {}
    for arg, s in tensors.items():
        kt[arg], tt[arg] = both(RNG.standard_normal(s), True)
    ko, to = getattr(F, name)(kx, **kt, **kw), getattr(TF, name)(tx, **tt, **kw)
    assert to.dim() == len(shape)
    same(ko, to)
    g = RNG.standard_normal(tuple(to.shape))
    (ko * kiln.tensor(g)).sum().backward()
    (to * torch.tensor(g)).sum().backward()
    same(kx.grad, tx.grad)
    for arg in tensors:
        same(kt[arg].grad, tt[arg].grad)
    if name.startswith("max_pool"):  # return_indices: both unbatched
        kv, ki = getattr(F, name)(kx, **kw, return_indices=True)
        tv, ti = getattr(TF, name)(tx, **kw, return_indices=True)
        same(kv, tv)
        same(ki, ti)


@pytest.mark.parametrize("cls,kw,shape", [
    ("MaxPool1d", {"kernel_size": 2}, (3, 8)), ("MaxPool2d", {"kernel_size": 2, "stride": 1}, (3, 5, 4)),
    ("MaxPool3d", {"kernel_size": 2}, (2, 4, 4, 4)), ("AvgPool1d", {"kernel_size": 3}, (3, 8)),
    ("AvgPool2d", {"kernel_size": 2}, (3, 5, 4)), ("AvgPool3d", {"kernel_size": 2}, (2, 4, 4, 4)),
    ("Conv2d", {"in_channels": 3, "out_channels": 2, "kernel_size": 3}, (3, 5, 6)),
    ("ConvTranspose1d", {"in_channels": 3, "out_channels": 2, "kernel_size": 3}, (3, 5)),
])
def test_unbatched_pool_and_conv_modules_as_torch(cls, kw, shape):
    km, tm = getattr(kiln.nn, cls)(**kw), getattr(torch.nn, cls)(**kw).double()
    if "in_channels" in kw:  # float64 weights for the float64 input (mixed dtypes are refused, as torch's)
        km = getattr(kiln.nn, cls)(**kw, dtype=kiln.float64)
        km.load_state_dict({k: kiln.tensor(v.detach().numpy()) for k, v in tm.state_dict().items()})
    kx, tx = both(RNG.standard_normal(shape), True)
    ko, to = km(kx), tm(tx)
    same(ko, to)
    ko.sum().backward()
    to.sum().backward()
    same(kx.grad, tx.grad)


@pytest.mark.parametrize("name,kw", [("mse_loss", {}), ("l1_loss", {}), ("smooth_l1_loss", {"beta": 0.5}),
                                     ("huber_loss", {"delta": 0.7})])
@pytest.mark.parametrize("xs,ts", [((4, 3), (4, 1)), ((4, 1), (3,)), ((2, 3), ())], ids=["col", "outer", "0d"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_losses_broadcast_a_target_of_another_shape_as_torch(name, kw, xs, ts, reduction):
    F, TF = kiln.nn.functional, torch.nn.functional
    kx, tx = both(RNG.standard_normal(xs), True)
    ky, ty = both(RNG.standard_normal(ts), True)
    with pytest.warns(UserWarning, match="different to the input size") as kw_warn:
        ko = getattr(F, name)(kx, ky, reduction=reduction, **kw)
    with pytest.warns(UserWarning, match="different to the input size"):
        to = getattr(TF, name)(tx, ty, reduction=reduction, **kw)
    assert kw_warn[0].filename == __file__  # the warning points at the caller, as torch's
    same(ko, to)
    g = RNG.standard_normal(tuple(to.shape))
    (ko * kiln.tensor(g)).sum().backward()
    (to * torch.tensor(g)).sum().backward()
    same(kx.grad, tx.grad)
    same(ky.grad, ty.grad)
    # the modules too
    cls = {"mse_loss": "MSELoss", "l1_loss": "L1Loss", "smooth_l1_loss": "SmoothL1Loss", "huber_loss": "HuberLoss"}
    with pytest.warns(UserWarning, match="different to the input size"):
        same(getattr(kiln.nn, cls[name])(reduction=reduction, **kw)(kx, ky), to)


@pytest.mark.parametrize("name", ["mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss"])
def test_losses_refuse_shapes_that_do_not_broadcast_as_torch(name):
    with pytest.raises(RuntimeError, match="must match"), pytest.warns(UserWarning):
        getattr(torch.nn.functional, name)(torch.ones(4, 3), torch.ones(4, 2))
    with pytest.raises(ValueError, match=f"{name}: the target size \\[4, 2\\] and the input size \\[4, 3\\] do "
                       "not broadcast"), pytest.warns(UserWarning):
        getattr(kiln.nn.functional, name)(kiln.ones(4, 3), kiln.ones(4, 2))


def test_round_decimals_as_torch():
    a = np.array([1.25, 2.5, -0.555, 1234.5, 0.125, -7.45, 3.14159, 1e-3, 0.0, -0.0, float("inf"), float("nan")])
    for dt in [np.float32, np.float64]:
        for n in [0, 1, 2, 3, -1, -2]:
            kx, tx = kiln.tensor(a.astype(dt)), torch.tensor(a.astype(dt))
            ko, to = kx.round(decimals=n), tx.round(decimals=n)
            assert ko.dtype == kx.dtype
            assert np.array_equal(ko.numpy(), to.numpy(), equal_nan=True), (dt, n, ko.numpy(), to.numpy())
            assert np.array_equal(kiln.round(kx, decimals=n).numpy(), torch.round(tx, decimals=n).numpy(),
                                  equal_nan=True)
    kx, tx = both(RNG.standard_normal((3, 4)), True)  # the gradient: zero, as torch's
    kiln.round(kx * 3.0, decimals=1).sum().backward()
    torch.round(tx * 3.0, decimals=1).sum().backward()
    same(kx.grad, tx.grad)
    with pytest.raises(NotImplementedError):
        torch.round(torch.tensor([15, 25]), decimals=-1)
    with pytest.raises(kiln.KilnError, match="round: decimals=-1 needs a floating tensor, got i64"):
        kiln.round(kiln.tensor([15, 25]), decimals=-1)
    assert kiln.tensor([15, 25]).round().tolist() == [15, 25]


def test_round_decimals_16bit_in_float32_as_torch():
    # torch computes x * 10^n in float32 for f16/bf16 and rounds back once: f16 1234.5 * 100 is inf in 16 bits
    a = np.array([1234.5, 1.25, -0.555, 65504.0, 3.14159, 0.125, -7.45, 1e-3, 300.7])
    for kdt, tdt in DT16:
        tx = torch.tensor(a).to(tdt)
        kx = kiln.tensor(tx.float().numpy()).to(kdt)
        for n in [1, 2, 3, 4, -1, -2]:
            ko, to = kx.round(decimals=n), tx.round(decimals=n)
            assert ko.dtype == kdt
            assert np.array_equal(ko.float().numpy(), to.float().numpy(), equal_nan=True), \
                (tdt, n, ko.float().numpy(), to.float().numpy())
    assert kiln.tensor([1234.5], dtype=kiln.float16).round(decimals=2).tolist() == [1234.0]


def test_sort_and_argsort_stable_as_torch():
    a = RNG.integers(0, 4, size=(5, 40))  # many ties
    for dt in [np.int64, np.float32]:
        kx, tx = kiln.tensor(a.astype(dt)), torch.tensor(a.astype(dt))
        for dim in [0, 1, -1]:
            for desc in [False, True]:
                kv, ki = kx.sort(dim=dim, descending=desc, stable=True)
                tv, ti = tx.sort(dim=dim, descending=desc, stable=True)
                same(kv, tv)
                same(ki, ti)
                kr = kiln.sort(kx, stable=True, dim=dim, descending=desc)
                same(kr.indices, ti)
                same(kiln.argsort(kx, dim, desc, stable=True), torch.argsort(tx, dim=dim, descending=desc, stable=True))
                same(kx.argsort(dim=dim, descending=desc, stable=True), ti)
    same(kiln.sort(kiln.tensor([2, 1, 2, 1]), stable=False).indices, torch.tensor([1, 3, 0, 2]))
    with pytest.raises(TypeError):  # stable is keyword-only, as torch's
        kiln.argsort(kiln.tensor([1, 2]), 0, False, True)


@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.0])
def test_embedding_max_norm_renormalises_the_rows_in_place_as_torch(norm_type):
    w = RNG.standard_normal((6, 4)) * 2
    idx = np.array([[0, 2, 2], [5, 0, 3]])
    for module in [False, True]:
        kw, tw = both(w, True)
        ki, ti = kiln.tensor(idx), torch.tensor(idx)
        if module:
            km = kiln.nn.Embedding.from_pretrained(kw, freeze=False, max_norm=1.5, norm_type=norm_type)
            tm = torch.nn.Embedding.from_pretrained(tw, freeze=False, max_norm=1.5, norm_type=norm_type)
            assert repr(km) == repr(tm)
            kw, tw = km.weight, tm.weight
            ko, to = km(ki), tm(ti)
        else:
            ko = kiln.nn.functional.embedding(ki, kw, max_norm=1.5, norm_type=norm_type)
            to = torch.nn.functional.embedding(ti, tw, max_norm=1.5, norm_type=norm_type)
        same(ko, to, 1e-6)
        same(kw, tw, 1e-6)  # the looked-up rows renormalised in the weight itself; rows 1 and 4 left
        assert np.array_equal(kw.detach().numpy()[[1, 4]], w[[1, 4]])
        g = RNG.standard_normal(tuple(to.shape))
        (ko * kiln.tensor(g)).sum().backward()
        (to * torch.tensor(g)).sum().backward()
        same(kw.grad, tw.grad, 1e-6)
    with pytest.raises(kiln.KilnError, match="embedding: sparse=True is not supported"):
        kiln.nn.functional.embedding(kiln.tensor([0]), kiln.ones(2, 2), sparse=True)


# ---- inplace= inside a graph: the state kept on the tensor object, views, dtypes, p=0 ----

@pytest.mark.parametrize("how", ["F.relu", "nn.ReLU", "F.elu", "F.dropout2d"])
def test_inplace_activation_keeps_retain_grad_as_torch(how):
    def act(lib, h):
        if how == "F.relu":
            return lib.nn.functional.relu(h, inplace=True)
        if how == "nn.ReLU":
            return lib.nn.ReLU(inplace=True)(h)
        if how == "F.elu":
            return lib.nn.functional.elu(h, inplace=True)
        return lib.nn.functional.dropout2d(h, 0.0, inplace=True)
    a = RNG.standard_normal((2, 3, 4))
    kx, tx = both(a, True)
    kh, th = kx * 2.0, tx * 2.0
    kh.retain_grad(), th.retain_grad()
    act(kiln, kh), act(torch, th)
    assert kh.retains_grad and th.retains_grad and kh.requires_grad and not kh.is_leaf
    (kh * 3.0).sum().backward(retain_graph=True)
    (th * 3.0).sum().backward(retain_graph=True)
    assert th.grad is not None and kh.grad is not None
    same(kh.grad, th.grad)
    same(kx.grad, tx.grad, 1e-6)
    (kh * 3.0).sum().backward()  # accumulated on the same object, as torch's
    (th * 3.0).sum().backward()
    same(kh.grad, th.grad)


def test_inplace_activation_keeps_hooks_registered_before_as_torch():
    a = RNG.standard_normal((3, 4))
    seen = {}
    for lib in (kiln, torch):
        x = lib.tensor(a, requires_grad=True)
        h = x * 2.0
        got = []
        h.register_hook(lambda g, got=got: got.append(g.tolist()))  # sees the gradient of the old value
        lib.nn.functional.relu(h, inplace=True)
        (h * 3.0).sum().backward()
        seen[lib.__name__] = got
    assert seen["kiln"] == seen["torch"] and len(seen["kiln"]) == 1


@pytest.mark.parametrize("view", ["select", "slice", "base"])
def test_inplace_activation_on_shared_memory_in_a_graph_is_refused(view):
    F = kiln.nn.functional
    x = kiln.tensor(RNG.standard_normal((2, 3, 4, 5)), requires_grad=True)
    h = x * 2.0
    v = h[0] if view == "select" else h[:, 1:3]
    target = h if view == "base" else v
    before = h.tolist()
    for call in [lambda t: F.relu(t, inplace=True), lambda t: kiln.nn.ReLU(inplace=True)(t),
                 lambda t: F.dropout(t, 0.5, inplace=True), lambda t: F.dropout2d(t, 0.5, inplace=True)]:
        with pytest.raises(kiln.KilnError, match="memory another tensor still holds.*out-of-place"):
            call(target)
    assert h.tolist() == before and v.tolist() == (h[0] if view == "select" else h[:, 1:3]).tolist()
    # torch: a view of a leaf that requires grad is refused; Kiln refuses it as a view
    tl = torch.tensor(RNG.standard_normal((3, 4)), requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf Variable"):
        torch.nn.functional.relu(tl[0], inplace=True)
    with pytest.raises(kiln.KilnError, match="memory another tensor still holds"):
        F.relu(x[0], inplace=True)
    # a tensor alone (the graph's saved copies do not count): still pointed at the result
    h = kiln.relu(x) * 2.0
    assert F.relu(h, inplace=True) is h
    # no gradient needed: a view is written in place, through to its base, as torch's
    kb, tb = both(RNG.standard_normal((3, 4)))
    F.relu(kb[1], inplace=True), torch.nn.functional.relu(tb[1], inplace=True)
    same(kb, tb)


def test_inplace_activation_in_common_model_code_is_accepted_as_torch():
    # The refusal above must not reach torch model code whose input nothing else holds: Conv-BN-ReLU
    # (inplace), a view whose base is gone before the activation, softmax then Dropout(p=0, inplace).
    def body(nn):
        return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(inplace=True), nn.Conv2d(4, 4, 1),
                             nn.BatchNorm2d(4))

    kb, tb = body(kiln.nn), body(torch.nn)
    tb.load_state_dict({k: torch.from_numpy(v.numpy().copy()) for k, v in kb.state_dict().items()})

    def run(lib, model):
        x = lib.tensor(np.random.default_rng(7).standard_normal((2, 3, 6, 6)), dtype=lib.float32,
                       requires_grad=True)
        h = model(x).flatten(1)  # the base is gone once flatten returns
        h = lib.nn.functional.relu(h, inplace=True)
        h = h.view(2, 4, -1).transpose(1, 2) * 1.0
        h = lib.nn.Dropout(0.0, inplace=True)(lib.softmax(h, dim=-1))
        (h * h).sum().backward()
        return h.detach().numpy(), x.grad.numpy()

    (kh, kg), (th, tg) = run(kiln, kb), run(torch, tb)
    np.testing.assert_allclose(kh, th, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(kg, tg, rtol=1e-4, atol=1e-6)


def test_dropout_p0_inplace_returns_the_input_as_torch():
    F = kiln.nn.functional
    for lib in (kiln, torch):
        x = lib.ones(3, 4, requires_grad=True)
        assert lib.nn.functional.dropout(x, p=0.0, training=True, inplace=True) is x
        assert lib.nn.Dropout(p=0.0, inplace=True)(x) is x
        e = lib.ones(0, 4, requires_grad=True)
        assert lib.nn.functional.dropout(e, p=0.5, training=True, inplace=True) is e
    with pytest.raises(kiln.KilnError, match="leaf tensor that requires grad"):
        F.dropout(kiln.ones(3, requires_grad=True), p=1.0, inplace=True)


@pytest.mark.parametrize("name,kw", [("SiLU", {}), ("LeakyReLU", {"negative_slope": 0.2}), ("ELU", {}),
                                     ("Hardswish", {}), ("Mish", {})])
def test_inplace_activation_refuses_a_result_of_another_dtype(name, kw):
    with pytest.raises(RuntimeError, match="not implemented for 'Long'"):
        getattr(torch.nn, name)(inplace=True, **kw)(torch.tensor([-2, 3, 5]))
    kx = kiln.tensor([-2, 3, 5])
    with pytest.raises(kiln.KilnError, match="inplace=True on .*i64.*(float32|f32).*pass inplace=False"):
        getattr(kiln.nn, name)(inplace=True, **kw)(kx)
    assert kx.tolist() == [-2, 3, 5]
    for mod, mkw in [("ReLU", {}), ("ReLU6", {}), ("Hardtanh", {}), ("Hardtanh", {"min_val": -0.5, "max_val": 2.7})]:
        kx, tx = kiln.tensor([-2, 3, 5]), torch.tensor([-2, 3, 5])  # clamps: torch runs them on integers
        ko, to = getattr(kiln.nn, mod)(inplace=True, **mkw)(kx), getattr(torch.nn, mod)(inplace=True, **mkw)(tx)
        assert ko is kx and kx.dtype == kiln.int64 and kx.tolist() == to.tolist(), (mod, mkw, kx.tolist(), to.tolist())


def test_dropout_checks_p_out_of_training_and_inplace_as_torch():
    # F.dropout(x, 1.5, training=False, inplace=True) returned x without a word; torch checks p first.
    for kw in ({"training": False, "inplace": True}, {"training": False}, {"inplace": True}, {}):
        with pytest.raises(ValueError, match="dropout probability has to be between 0 and 1"):
            torch.nn.functional.dropout(torch.ones(3), 1.5, **kw)
        with pytest.raises(ValueError, match="dropout probability has to be between 0 and 1, but got 1.5"):
            kiln.nn.functional.dropout(kiln.ones(3), 1.5, **kw)
