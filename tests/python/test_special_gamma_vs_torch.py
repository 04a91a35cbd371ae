# The gamma and Bessel family (engine ops: lgamma, digamma, polygamma, i0, i0e, i1, i1e, ndtri, log_ndtr,
# erfcx; mvlgamma written with lgamma) against PyTorch: f64 values to 1e-12 over wide ranges, the poles,
# infinities and NaN; f32 and the 16-bit types; int and bool inputs computing in f32; gradients and second
# derivatives; the methods, the in-place forms, kiln.special's names and the refusals.
import math

import numpy as np
import pytest

import kiln

torch = pytest.importorskip("torch")
mpmath = pytest.importorskip("mpmath")

INF, NAN = math.inf, math.nan
# (no subnormal inputs: the CPU kernels run with subnormals flushed, as docs/ops.md says)
EDGES = [0.0, -0.0, INF, -INF, NAN, 1e-300, -1e-300, 1e300, -1e300]
# wide ranges: tiny, around 1, negative non-integers, large
WIDE = np.concatenate([np.geomspace(1e-30, 1e-3, 15), np.linspace(0.01, 12, 120), np.geomspace(12, 1e15, 40),
                       -np.geomspace(1e-30, 1e-3, 8), np.linspace(-30.1, -0.05, 97)])
UNARY = {
    "lgamma": (kiln.lgamma, torch.lgamma),
    "digamma": (kiln.digamma, torch.digamma),
    "i0": (kiln.i0, torch.i0),
    "i0e": (kiln.special.i0e, torch.special.i0e),
    "i1": (kiln.special.i1, torch.special.i1),
    "i1e": (kiln.special.i1e, torch.special.i1e),
    "ndtri": (kiln.special.ndtri, torch.special.ndtri),
    "log_ndtr": (kiln.special.log_ndtr, torch.special.log_ndtr),
    "erfcx": (kiln.special.erfcx, torch.special.erfcx),
}
BESSEL = np.concatenate([np.linspace(-40, 40, 161), np.geomspace(1e-20, 700, 60), -np.geomspace(1e-20, 700, 20)])
PROB = np.concatenate([np.geomspace(1e-307, 0.49, 120), 1 - np.geomspace(1e-16, 0.5, 60), np.linspace(0, 1, 41),
                       [-0.1, 1.1, 0.5 + 1e-10, 0.5 - 1e-10]])
NORMAL = np.concatenate([np.linspace(-40, 10, 201), -np.geomspace(1, 1e150, 30), np.geomspace(1e-20, 30, 20)])
POINTS = {"lgamma": WIDE, "digamma": WIDE, "i0": BESSEL, "i0e": BESSEL, "i1": BESSEL, "i1e": BESSEL,
          "ndtri": PROB, "log_ndtr": NORMAL, "erfcx": np.concatenate([NORMAL, np.geomspace(30, 1e200, 20)])}


def check(k, t, rtol, atol=0.0):
    assert str(k.dtype).split(".")[-1] == str(t.dtype).split(".")[-1], (k.dtype, t.dtype)
    kn = k.detach().to(kiln.float64).numpy()
    tn = t.detach().double().numpy()
    np.testing.assert_allclose(kn, tn, rtol=rtol, atol=atol, equal_nan=True)


@pytest.mark.parametrize("name", sorted(UNARY))
def test_f64_values_as_torch(name):
    kf, tf = UNARY[name]
    x = np.concatenate([POINTS[name], EDGES])
    check(kf(kiln.tensor(x)), tf(torch.tensor(x)), 1e-12)


def test_poles_and_infinities():
    x = [0.0, -0.0, -1.0, -2.0, -30.0, INF, -INF, NAN]
    k, t = kiln.tensor(x, dtype=kiln.float64), torch.tensor(x, dtype=torch.float64)
    check(kiln.lgamma(k), torch.lgamma(t), 0)
    check(kiln.digamma(k), torch.digamma(t), 0)
    assert kiln.digamma(k)[0].item() == -INF and kiln.digamma(k)[1].item() == INF
    for n in (2, 3, 4, 7):
        check(kiln.polygamma(n, k), torch.polygamma(n, t), 0)
    # trigamma: inf at every pole (torch's own formula gives 6.6e32 at -1, 1/sin(pi x)^2 rounded)
    tri = kiln.polygamma(1, k).numpy()
    assert (tri[:5] == INF).all()
    check(kiln.polygamma(1, k)[5:], torch.polygamma(1, t)[5:], 0)


@pytest.mark.parametrize("n", [0, 2, 3, 5, 10, 30, 100, 200])
def test_polygamma_f64_as_torch(n):
    x = np.concatenate([np.geomspace(1e-5, 1e4, 60), np.linspace(-9.9, -0.1, 40) + 0.013])
    # where zeta(n + 1, x) ~ x^-(n+1) is subnormal, the flushing kernels give 0 (torch keeps a few bits)
    x = x[(x < 0) | (np.log10(np.abs(x)) * (n + 1) < 280)]
    check(kiln.polygamma(n, kiln.tensor(x)), torch.polygamma(n, torch.tensor(x)), 1e-12)


def test_trigamma_accurate():
    # torch's trigamma truncates its series (about 5e-10 relative error): mpmath is the reference, torch
    # agrees to its own precision
    x = np.concatenate([np.geomspace(1e-6, 1e6, 40), np.linspace(-7.9, -0.1, 25) + 0.013])
    got = kiln.polygamma(1, kiln.tensor(x)).numpy()
    mpmath.mp.dps = 30
    want = np.array([float(mpmath.polygamma(1, mpmath.mpf(float(v)))) for v in x])
    np.testing.assert_allclose(got, want, rtol=1e-12)
    np.testing.assert_allclose(got, torch.polygamma(1, torch.tensor(x)).numpy(), rtol=1e-8)


def test_accuracy_in_the_tails():
    # log_ndtr far below 0, ndtri of subnormal probabilities, erfcx of large x: against mpmath
    mpmath.mp.dps = 40
    x = [-1e3, -200.0, -40.0, -10.0, -3.0]
    got = kiln.special.log_ndtr(kiln.tensor(x, dtype=kiln.float64)).numpy()
    want = [float(mpmath.log(mpmath.ncdf(mpmath.mpf(v)))) for v in x]
    np.testing.assert_allclose(got, want, rtol=1e-13)
    p = [1e-307, 1e-300, 1e-100, 1e-20, 0.01, 0.3, 0.999999]
    got = kiln.special.ndtri(kiln.tensor(p, dtype=kiln.float64)).numpy()
    for g, q in zip(got, p):
        y = mpmath.mpf(float(g))
        # the error in y, from the CDF's: (ncdf(y) - q) / pdf(y)
        assert abs((mpmath.ncdf(y) - mpmath.mpf(q)) / mpmath.npdf(y) / y) < 1e-14
    assert list(kiln.special.ndtri(kiln.tensor([0.0, 1.0, -0.5, 2.0, NAN])).numpy()[:2]) == [-INF, INF]
    assert np.isnan(kiln.special.ndtri(kiln.tensor([-0.5, 2.0, NAN])).numpy()).all()


@pytest.mark.parametrize("name", sorted(UNARY) + ["polygamma2"])
def test_f32_and_16_bit(name):
    kf, tf = UNARY.get(name, (lambda x: kiln.polygamma(2, x), lambda x: torch.polygamma(2, x)))
    if name in ("ndtri",):
        x = np.linspace(0.01, 0.99, 61)
    elif name in ("i0", "i1", "i0e", "i1e", "log_ndtr", "erfcx"):
        x = np.linspace(-8, 8, 61)
    else:
        x = np.concatenate([np.linspace(0.05, 20, 50), np.linspace(-4.9, -0.1, 11) + 0.03])
    check(kf(kiln.tensor(x, dtype=kiln.float32)), tf(torch.tensor(x, dtype=torch.float32)), 2e-5, 1e-6)
    for kd, td in ((kiln.float16, torch.float16), (kiln.bfloat16, torch.bfloat16)):
        xs = torch.tensor(x, dtype=td)  # the 16-bit inputs, computed on in f64 by torch
        want = tf(xs.double()).to(td)
        got = kf(kiln.tensor(xs.double().numpy(), dtype=kd))
        check(got, want, 1e-2 if kd == kiln.float16 else 2e-2, 1e-3)


@pytest.mark.parametrize("name", ["lgamma", "digamma", "i0", "ndtri", "erfcx", "log_ndtr"])
def test_int_and_bool_compute_in_f32(name):
    kf, tf = UNARY[name]
    for v in ([1, 2, 3, 7], [0, 1]):
        k = kf(kiln.tensor(v))
        t = tf(torch.tensor(v))
        check(k, t, 1e-6)
    check(kf(kiln.tensor([True, False])), tf(torch.tensor([True, False])), 1e-6)
    check(kiln.polygamma(2, kiln.tensor([1, 3])), torch.polygamma(2, torch.tensor([1, 3])), 1e-6)
    check(kiln.mvlgamma(kiln.tensor([3, 4]), 2), torch.mvlgamma(torch.tensor([3, 4]), 2), 1e-6)


GRAD_POINTS = {
    "lgamma": [0.3, 1.7, 6.0, -2.5, -0.4],
    "digamma": [0.3, 1.7, 6.0, -2.5, -0.4],
    "i0": [-3.0, -0.2, 0.0, 0.7, 5.0],
    "i0e": [-3.0, -0.2, 0.7, 5.0],
    "i1": [-3.0, -0.2, 0.0, 0.7, 5.0],
    "i1e": [-3.0, -0.2, 0.0, 0.7, 5.0],
    "ndtri": [1e-10, 0.02, 0.3, 0.5, 0.9],
    "log_ndtr": [-30.0, -3.0, -0.5, 0.0, 2.0],
    "erfcx": [-2.0, -0.3, 0.0, 1.5, 8.0],
}
GRAD_FNS = dict(UNARY)
GRAD_FNS["polygamma1"] = (lambda x: kiln.polygamma(1, x), lambda x: torch.polygamma(1, x))
GRAD_FNS["polygamma3"] = (lambda x: kiln.special.polygamma(3, x), lambda x: torch.special.polygamma(3, x))
GRAD_FNS["mvlgamma"] = (lambda x: kiln.mvlgamma(x, 3), lambda x: torch.mvlgamma(x, 3))
GRAD_POINTS["polygamma1"] = GRAD_POINTS["polygamma3"] = [0.3, 1.7, 6.0, -2.5, -0.4]
GRAD_POINTS["mvlgamma"] = [1.3, 2.0, 4.5]


@pytest.mark.parametrize("name", sorted(GRAD_FNS))
def test_first_and_second_derivatives_as_torch(name):
    kf, tf = GRAD_FNS[name]
    x = np.array(GRAD_POINTS[name])
    k = kiln.tensor(x, requires_grad=True)
    t = torch.tensor(x, requires_grad=True)
    w = np.linspace(0.5, 1.5, len(x))
    (gk,) = kiln.autograd.grad((kf(k) * kiln.tensor(w)).sum(), k, create_graph=True)
    (gt,) = torch.autograd.grad((tf(t) * torch.tensor(w)).sum(), t, create_graph=True)
    # torch's trigamma (its series' 5e-10 error) is in the first derivative of digamma and the second of
    # lgamma, mvlgamma and polygamma(1, .)
    check(gk, gt, 1e-8 if name in ("digamma", "lgamma", "mvlgamma") else 1e-11)
    (hk,) = kiln.autograd.grad((gk * gk).sum(), k)
    (ht,) = torch.autograd.grad((gt * gt).sum(), t)
    check(hk, ht, 1e-8 if name in ("digamma", "lgamma", "mvlgamma", "polygamma1") else 1e-10)


def test_mvlgamma_as_torch():
    x = np.array([[1.1, 2.5, 7.0], [0.9, 3.3, 40.0]])
    for p in (1, 2, 3, 5):
        check(kiln.mvlgamma(kiln.tensor(x), p), torch.mvlgamma(torch.tensor(x), p), 1e-12)
        check(kiln.special.multigammaln(kiln.tensor(x), p), torch.special.multigammaln(torch.tensor(x), p), 1e-12)
    # below (p - 1) / 2 it meets lgamma's poles or its negative side, as torch's
    check(kiln.mvlgamma(kiln.tensor([0.5, 1.0, 0.25]), 3), torch.mvlgamma(torch.tensor([0.5, 1.0, 0.25]), 3), 1e-12)
    with pytest.raises(ValueError, match="p has to be greater than or equal to 1"):
        kiln.mvlgamma(kiln.tensor([2.0]), 0)
    with pytest.raises(ValueError, match="boolean"):
        kiln.mvlgamma(kiln.tensor([True]), 2)


def test_methods_inplace_and_special_names():
    x = np.array([0.7, 2.5, 9.0])
    k, t = kiln.tensor(x), torch.tensor(x)
    check(k.lgamma(), t.lgamma(), 1e-12)
    check(k.digamma(), t.digamma(), 1e-12)
    check(k.polygamma(2), t.polygamma(2), 1e-12)
    check(k.i0(), t.i0(), 1e-12)
    check(k.mvlgamma(2), t.mvlgamma(2), 1e-12)
    for name, args in (("lgamma_", ()), ("digamma_", ()), ("polygamma_", (3,)), ("i0_", ()), ("mvlgamma_", (2,))):
        kk, tt = kiln.tensor(x), torch.tensor(x)
        assert getattr(kk, name)(*args) is kk
        getattr(tt, name)(*args)
        check(kk, tt, 1e-12)
    for kname, tname in (("gammaln", "gammaln"), ("digamma", "digamma"), ("psi", "psi"), ("i0", "i0"),
                         ("i0e", "i0e"), ("i1", "i1"), ("i1e", "i1e"), ("log_ndtr", "log_ndtr"), ("erfcx", "erfcx")):
        check(getattr(kiln.special, kname)(k), getattr(torch.special, tname)(t), 1e-12)
    check(kiln.special.ndtri(k / 10), torch.special.ndtri(t / 10), 1e-12)
    check(kiln.special.polygamma(4, k), torch.special.polygamma(4, t), 1e-12)
    assert "No gammaln" not in kiln.special.__doc__


def test_refusals():
    with pytest.raises(kiln.KilnError, match=r"polygamma: n is -1"):
        kiln.polygamma(-1, kiln.tensor([1.0]))
    with pytest.raises(kiln.KilnError, match=r"polygamma: n is -2"):
        kiln.tensor([1.0]).polygamma(-2)
    ki = kiln.tensor([1, 2])
    with pytest.raises(Exception, match="lgamma_"):
        ki.lgamma_()


def test_polygamma_far_left_and_far_right():
    # Far left the direct zeta sum took |x| steps (-1e12 + 0.5 ran for hours) and lost digits by cancellation;
    # far right q^-s underflowed (trigamma 0 above 1.3e154, where it is about 1 / x). Checked with the
    # reflection psi1(x) = -psi1(1 - x) + pi^2 / sin(pi x)^2 and psi2(x) = psi2(1 - x) at half-integers.
    x = np.array([-1e12 + 0.5, -1e6 - 0.5, -1000.5, -20.5, -17.25, -33.7])
    k1 = np.array(kiln.polygamma(1, kiln.tensor(x, dtype=kiln.float64)).tolist())
    right = np.array(kiln.polygamma(1, kiln.tensor(1 - x, dtype=kiln.float64)).tolist())
    frac = x - np.floor(x)
    np.testing.assert_allclose(k1, -right + (math.pi / np.sin(math.pi * frac)) ** 2, rtol=1e-13)
    half = np.array([-1e6 - 0.5, -1000.5, -20.5])
    k2 = np.array(kiln.polygamma(2, kiln.tensor(half, dtype=kiln.float64)).tolist())
    r2 = np.array(kiln.polygamma(2, kiln.tensor(1 - half, dtype=kiln.float64)).tolist())
    np.testing.assert_allclose(k2, r2, rtol=1e-13)
    big = np.array([1e160, 1e200, 1e300])
    np.testing.assert_allclose(np.array(kiln.polygamma(1, kiln.tensor(big, dtype=kiln.float64)).tolist()), 1 / big,
                               rtol=1e-15)
    np.testing.assert_allclose(np.array(kiln.polygamma(2, kiln.tensor([1e100], dtype=kiln.float64)).tolist()),
                               [-1e-200], rtol=1e-15)


@pytest.mark.parametrize("name", ["i0", "i0e", "i1", "i1e"])
def test_bessel_near_the_top_of_the_range_as_torch(name):
    # sqrt(2 pi x) overflowed first: i0(6e37) in f32 was NaN (torch inf), i0e(1e38) 0 (torch 4e-20).
    kf, tf = getattr(kiln.special, name), getattr(torch.special, name)
    for dt, tdt, xs in ((kiln.float32, torch.float32, [6e37, 1e38, -3e38]),
                        (kiln.float64, torch.float64, [2.9e307, 1e308, -1.7e308])):
        k = np.array(kf(kiln.tensor(xs, dtype=dt)).tolist())
        t = tf(torch.tensor(xs, dtype=tdt)).numpy().astype(np.float64)
        np.testing.assert_allclose(k, t, rtol=2e-6 if dt == kiln.float32 else 1e-14)
