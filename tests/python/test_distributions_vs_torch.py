# kiln.distributions (python/kiln/distributions) against torch.distributions, in float64: log_prob, cdf,
# icdf, entropy, mean/mode/variance/stddev, kl_divergence, gradients of log_prob and of rsample with
# respect to the parameters, the parameters' normalisation (probs/logits), the shapes of sample, rsample,
# expand and enumerate_support with batch broadcasting, sample statistics, reproducibility under
# kiln.manual_seed, and validate_args' errors.
import math
import re

import numpy as np
import pytest

import kiln
import kiln.distributions as KD

torch = pytest.importorskip("torch")
TD = torch.distributions

RNG = np.random.default_rng(11)
F64 = kiln.float64


def pair(a, grad=False):
    a = np.asarray(a, dtype=np.float64)
    return (kiln.tensor(a, dtype=F64, requires_grad=grad), torch.tensor(a, dtype=torch.float64, requires_grad=grad))


def same(k, t, tol=1e-9):
    if t is None or k is None:  # no gradient reaches that parameter
        assert k is None and t is None, (k, t)
        return
    t = t.detach() if isinstance(t, torch.Tensor) else torch.as_tensor(t)
    assert tuple(k.shape) == tuple(t.shape), (tuple(k.shape), tuple(t.shape))
    kn, tn = np.asarray(k.detach().numpy(), dtype=np.float64), t.numpy().astype(np.float64)
    assert np.allclose(kn, tn, rtol=tol, atol=tol, equal_nan=True), (kn, tn)


# name: (parameters as NumPy arrays, shaped to broadcast to the batch (2, 3); values inside the support)
LOC, SCALE = RNG.normal(size=(2, 1)), RNG.uniform(0.5, 2.0, size=(3,))
CONTINUOUS = {
    "Normal": ((LOC, SCALE), RNG.normal(size=(4, 2, 3))),
    "LogNormal": ((LOC, SCALE), RNG.uniform(0.1, 4.0, size=(4, 2, 3))),
    "Laplace": ((LOC, SCALE), RNG.normal(size=(4, 2, 3))),
    "Cauchy": ((LOC, SCALE), RNG.normal(size=(4, 2, 3)) * 3),
    "Gumbel": ((LOC, SCALE), RNG.normal(size=(4, 2, 3))),
    "Uniform": ((np.array([[-1.0], [0.5]]), np.array([1.0, 2.0, 3.0])), RNG.uniform(0.5, 0.99, size=(4, 2, 3))),
    "Exponential": ((RNG.uniform(0.5, 2.0, size=(2, 3)),), RNG.uniform(0.0, 3.0, size=(4, 2, 3))),
}


def make(name, params, grad=False):
    ks, ts = zip(*[pair(p, grad) for p in params])
    return getattr(KD, name)(*ks), getattr(TD, name)(*ts), ks, ts


@pytest.mark.parametrize("name", sorted(CONTINUOUS))
def test_continuous_values_and_log_prob_gradients(name):
    params, values = CONTINUOUS[name]
    kd, td, ks, ts = make(name, params, grad=True)
    assert kd.batch_shape == tuple(td.batch_shape) == (2, 3) and kd.event_shape == ()
    kv, tv = pair(values)
    same(kd.log_prob(kv), td.log_prob(tv))
    same(kd.cdf(kv), td.cdf(tv))
    q = RNG.uniform(0.05, 0.95, size=(4, 2, 3))
    kq, tq = pair(q)
    same(kd.icdf(kq), td.icdf(tq), 1e-8)
    same(kd.entropy(), td.entropy())
    for prop in ("mean", "mode", "variance", "stddev"):
        k, t = getattr(kd, prop), getattr(td, prop)
        same(k, t.expand(td.batch_shape) if tuple(t.shape) != (2, 3) else t)
    # gradients of log_prob, cdf and entropy with respect to the parameters (summed back over broadcasting).
    # A fresh distribution each time: Kiln frees a graph's nodes after backward, the broadcast of the
    # parameters included (torch keeps expand's, which saves nothing), so a second backward would need
    # retain_graph=True
    for fn in (lambda d, v: d.log_prob(v), lambda d, v: d.cdf(v), lambda d, v: d.entropy() * v.mean()):
        kd, td, ks, ts = make(name, params, grad=True)
        (fn(kd, kv) * kv).sum().backward()
        (fn(td, tv) * tv).sum().backward()
        for k, t in zip(ks, ts):
            same(k.grad, t.grad, 1e-8)


@pytest.mark.parametrize("name", sorted(CONTINUOUS))
def test_rsample_is_reparameterised(name):
    """x = rsample() moves with the parameters so that F(x) stays fixed (the noise is fixed): its gradient
    is -dF/dtheta / f(x), computed here from torch's cdf and density at kiln's draws."""
    params, _ = CONTINUOUS[name]
    kd, td, ks, ts = make(name, params, grad=True)
    assert kd.has_rsample
    kiln.manual_seed(3)
    x = kd.rsample((50,))
    assert x.shape == (50, 2, 3) and x.requires_grad
    assert not kd.sample((2,)).requires_grad  # sample() is taken outside autograd, as torch's
    x.sum().backward()
    tx = torch.tensor(x.detach().numpy())
    density = td.log_prob(tx).exp().detach()
    (-(td.cdf(tx) / density).sum()).backward()
    for k, t in zip(ks, ts):
        same(k.grad, t.grad, 1e-6)


@pytest.mark.parametrize("name", sorted(CONTINUOUS))
def test_sample_statistics_and_seed(name):
    """The empirical cdf of many draws at torch's 10%, 50% and 90% quantiles (each draw's own distribution
    in the batch): within 0.015 of the level, which a wrong sampling formula misses."""
    params, _ = CONTINUOUS[name]
    kd, td, _, _ = make(name, params)
    kiln.manual_seed(7)
    x = kd.sample((20000,))
    assert x.shape == (20000, 2, 3) and not x.requires_grad
    xn = x.numpy()
    for level in (0.1, 0.5, 0.9):
        q = td.icdf(torch.full((2, 3), level, dtype=torch.float64)).numpy()
        frac = (xn <= q).mean(0)
        assert np.abs(frac - level).max() < 0.015, (level, frac)
    kiln.manual_seed(7)
    assert np.array_equal(kd.sample((20000,)).numpy(), xn)


def test_16_bit_samples_stay_inside_the_support():
    # kiln.rand in float16/bfloat16 reached 1.0 (24 random bits rounded to nearest), so Laplace gave -inf
    # and Uniform(0, 1) gave its high
    kiln.manual_seed(5)
    n = 1 << 20
    for dt in (kiln.float16, kiln.bfloat16):
        r = kiln.rand((n,), dtype=dt).to(kiln.float32).numpy()
        assert r.min() >= 0 and r.max() < 1, (dt, r.max())
        lap = KD.Laplace(kiln.tensor([0.0], dtype=dt), 1.0).sample((n,)).to(kiln.float32).numpy()
        assert np.isfinite(lap).all(), (dt, lap[~np.isfinite(lap)][:3])
        uni = KD.Uniform(kiln.tensor([0.0], dtype=dt), 1.0).sample((n,)).to(kiln.float32).numpy()
        assert uni.min() >= 0 and uni.max() < 1, (dt, uni.max())


def test_shapes_expand_and_number_parameters():
    kd = KD.Normal(0.0, 1.0)
    td = TD.Normal(0.0, 1.0)
    assert kd.batch_shape == () == tuple(td.batch_shape)
    assert kd.loc.dtype == kiln.float32  # numbers give float32, as torch's default dtype
    assert kd.sample().shape == () and kd.sample((3, 4)).shape == (3, 4) and kd.rsample(5).shape == (5,)
    kl, tl = pair(RNG.normal(size=(3, 1)), grad=True)
    ke = KD.Normal(kl, 1.0).expand((2, 3, 4))
    te = TD.Normal(tl, 1.0).expand((2, 3, 4))
    assert ke.batch_shape == (2, 3, 4) == tuple(te.batch_shape)
    assert ke.sample((5,)).shape == (5, 2, 3, 4)
    v = RNG.normal(size=(2, 3, 4))
    kv, tv = pair(v)
    ke.log_prob(kv).sum().backward()
    te.log_prob(tv).sum().backward()
    same(kl.grad, tl.grad)
    assert ke.log_prob(kiln.zeros(4, dtype=F64)).shape == (2, 3, 4)
    assert ke.log_prob(kiln.zeros(7, 1, 1, 1, dtype=F64)).shape == (7, 2, 3, 4)
    ku = KD.Uniform(kiln.zeros(3, dtype=F64), 2.0).expand((5, 3))
    assert ku.batch_shape == (5, 3) and ku.rsample((2,)).shape == (2, 5, 3)
    p = RNG.uniform(0.1, 0.9, size=(3,))
    for name, by, value in [("Bernoulli", "probs", 1.0), ("Geometric", "logits", 2.0), ("Exponential", None, 0.5),
                            ("Gumbel", None, 0.5)]:
        kp, tp = pair(p)
        args = {by: kp} if by else {}
        kd = getattr(KD, name)(*([] if by else [kp] * (2 if name == "Gumbel" else 1)), **args).expand((4, 3))
        targs = {by: tp} if by else {}
        td = getattr(TD, name)(*([] if by else [tp] * (2 if name == "Gumbel" else 1)), **targs).expand((4, 3))
        assert kd.batch_shape == (4, 3) and type(kd) is getattr(KD, name) and kd.sample((2,)).shape == (2, 4, 3)
        same(kd.log_prob(kiln.full((4, 3), value, dtype=F64)), td.log_prob(torch.full((4, 3), value,
                                                                                      dtype=torch.float64)))

    class Plain(KD.Normal):  # torch's rule: a subclass keeps expand unless it has an __init__ of its own
        pass

    class Custom(KD.Normal):
        def __init__(self, loc):
            super().__init__(loc, 1.0)

    assert type(Plain(0.0, 1.0).expand((2,))) is Plain
    with pytest.raises(NotImplementedError, match="Subclass Custom of Normal that defines a custom __init__"):
        Custom(0.0).expand((2,))


BINARY = {"Bernoulli": np.array([0.2, 0.5, 0.9]), "Geometric": np.array([0.2, 0.5, 0.9])}


@pytest.mark.parametrize("name", sorted(BINARY))
@pytest.mark.parametrize("by", ["probs", "logits"])
def test_binary_distributions(name, by):
    p = BINARY[name]
    arg = p if by == "probs" else np.log(p) - np.log1p(-p)
    kp, tp = pair(np.broadcast_to(arg, (2, 3)).copy(), grad=True)
    kd, td = getattr(KD, name)(**{by: kp}), getattr(TD, name)(**{by: tp})
    same(kd.probs, td.probs)
    same(kd.logits, td.logits)
    values = np.array([[0.0, 1.0, 1.0], [1.0, 0.0, 0.0]]) if name == "Bernoulli" else np.array([[0.0, 1.0, 4.0],
                                                                                               [2.0, 0.0, 7.0]])
    kv, tv = pair(values)
    same(kd.log_prob(kv), td.log_prob(tv))
    same(kd.entropy(), td.entropy())
    for prop in ("mean", "mode", "variance", "stddev"):
        same(getattr(kd, prop), getattr(td, prop))
    (kd.log_prob(kv).sum() + kd.entropy().sum()).backward()
    (td.log_prob(tv).sum() + td.entropy().sum()).backward()
    same(kp.grad, tp.grad)
    kiln.manual_seed(1)
    x = kd.sample((20000,))
    assert x.shape == (20000, 2, 3) and x.dtype == F64 and not x.requires_grad
    xn = x.numpy()
    for k in ((0, 1) if name == "Bernoulli" else (0, 1, 2)):
        freq = (xn == k).mean(0)
        expected = td.log_prob(torch.full((2, 3), float(k), dtype=torch.float64)).exp().detach().numpy()
        assert np.abs(freq - expected).max() < 0.015, (k, freq, expected)


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_log_prob_and_entropy_at_large_logits_are_torchs(name):
    # softplus(l) with no threshold: the engine's softplus returns l (gradient 1) above 20, which was off by
    # exp(-l) in the values and by up to 1 in the gradients near probs = 1 in float64
    logits = np.array([-40.0, -33.0, -25.0, -20.5, -19.5, -3.0, 0.0, 3.0, 19.5, 20.5, 25.0, 33.0, 40.0])
    values = np.arange(logits.size) % 2.0 if name == "Bernoulli" else np.arange(logits.size) % 3.0
    kl, tl = pair(logits, grad=True)
    kd, td = getattr(KD, name)(logits=kl), getattr(TD, name)(logits=tl)
    kv, tv = pair(values)
    same(kd.log_prob(kv), td.log_prob(tv), 1e-12)
    same(kd.entropy(), td.entropy(), 1e-12)
    (kd.log_prob(kv).sum() + kd.entropy().sum()).backward()
    (td.log_prob(tv).sum() + td.entropy().sum()).backward()
    same(kl.grad, tl.grad, 1e-12)
    probs = np.array([1 - 1e-12, 1 - 1e-9, 0.5, 1e-9])
    kp, tp = pair(probs, grad=True)
    kd, td = getattr(KD, name)(probs=kp), getattr(TD, name)(probs=tp)
    kv, tv = pair([1.0, 0.0, 1.0, 0.0])
    (kd.log_prob(kv).sum() + kd.entropy().sum()).backward()
    (td.log_prob(tv).sum() + td.entropy().sum()).backward()
    same(kp.grad, tp.grad, 1e-6)


def test_bernoulli_enumerate_support():
    kd, td = KD.Bernoulli(probs=kiln.full((2, 3), 0.3, dtype=F64)), TD.Bernoulli(probs=torch.full((2, 3), 0.3,
                                                                                                  dtype=torch.float64))
    same(kd.enumerate_support(), td.enumerate_support())
    same(kd.enumerate_support(expand=False), td.enumerate_support(expand=False))


@pytest.mark.parametrize("by", ["probs", "logits"])
def test_categorical_and_one_hot(by):
    raw = RNG.uniform(0.1, 2.0, size=(2, 3, 4)) if by == "probs" else RNG.normal(size=(2, 3, 4))
    kp, tp = pair(raw, grad=True)
    kc, tc = KD.Categorical(**{by: kp}), TD.Categorical(**{by: tp})
    assert kc.batch_shape == (2, 3) and kc.event_shape == () and kc.param_shape == (2, 3, 4)
    same(kc.probs, tc.probs)  # torch's normalisation: probs / sum, logits - logsumexp
    same(kc.logits, tc.logits)
    idx = RNG.integers(0, 4, size=(5, 2, 3))
    ki, ti = kiln.tensor(idx), torch.tensor(idx)
    same(kc.log_prob(ki), tc.log_prob(ti))
    same(kc.log_prob(kiln.tensor([1, 3, 0])), tc.log_prob(torch.tensor([1, 3, 0])))  # broadcast with the batch
    same(kc.entropy(), tc.entropy())
    same(kc.mode, tc.mode)
    same(kc.mean, tc.mean)
    same(kc.variance, tc.variance)
    same(kc.enumerate_support(), tc.enumerate_support())
    same(kc.enumerate_support(expand=False), tc.enumerate_support(expand=False))
    (kc.log_prob(ki).sum() + kc.entropy().sum()).backward()
    (tc.log_prob(ti).sum() + tc.entropy().sum()).backward()
    same(kp.grad, tp.grad)
    assert kc.sample().shape == (2, 3) and kc.sample((5, 6)).shape == (5, 6, 2, 3)
    assert kc.sample().dtype == kiln.int64 and kc.expand((7, 2, 3)).sample((2,)).shape == (2, 7, 2, 3)
    kiln.manual_seed(2)
    x = kc.sample((20000,)).numpy()
    freq = np.stack([(x == k).mean(0) for k in range(4)], -1)
    assert np.abs(freq - tc.probs.detach().numpy()).max() < 0.015

    kp.grad = tp.grad = None
    ko, to = KD.OneHotCategorical(**{by: kp}), TD.OneHotCategorical(**{by: tp})
    assert ko.batch_shape == (2, 3) and ko.event_shape == (4,)
    s = ko.sample((5,))
    assert s.shape == (5, 2, 3, 4) and s.dtype == F64 and np.all(s.numpy().sum(-1) == 1)
    oh = np.eye(4)[idx]
    kv, tv = pair(oh)
    same(ko.log_prob(kv), to.log_prob(tv))
    same(ko.entropy(), to.entropy())
    for prop in ("mean", "mode", "variance"):
        same(getattr(ko, prop), getattr(to, prop))
    same(ko.enumerate_support(), to.enumerate_support())
    same(ko.enumerate_support(expand=False), to.enumerate_support(expand=False))
    ko.log_prob(kv).sum().backward()
    to.log_prob(tv).sum().backward()
    same(kp.grad, tp.grad)
    assert ko.expand((6, 2, 3)).sample().shape == (6, 2, 3, 4)


def test_independent():
    kl, tl = pair(RNG.normal(size=(2, 3)), grad=True)
    ks, ts = pair(RNG.uniform(0.5, 2, size=(2, 3)), grad=True)
    ki, ti = KD.Independent(KD.Normal(kl, ks), 1), TD.Independent(TD.Normal(tl, ts), 1)
    assert ki.batch_shape == (2,) == tuple(ti.batch_shape) and ki.event_shape == (3,) == tuple(ti.event_shape)
    assert ki.has_rsample and ki.rsample((4,)).shape == (4, 2, 3)
    kv, tv = pair(RNG.normal(size=(5, 2, 3)))
    same(ki.log_prob(kv), ti.log_prob(tv))
    same(ki.entropy(), ti.entropy())
    same(ki.mean, ti.mean)
    same(ki.variance, ti.variance)
    ki.log_prob(kv).sum().backward()
    ti.log_prob(tv).sum().backward()
    same(kl.grad, tl.grad)
    same(ks.grad, ts.grad)
    e = ki.expand((4, 2))
    assert e.batch_shape == (4, 2) and e.event_shape == (3,) and e.sample().shape == (4, 2, 3)
    assert repr(ki.support) == "IndependentConstraint(Real(), 1)" == repr(ti.support)
    with pytest.raises(ValueError, match=re.escape("Expected reinterpreted_batch_ndims <= "
                                                   "len(base_distribution.batch_shape), actual 3 vs 2")):
        KD.Independent(KD.Normal(kl, ks), 3)


def _kl_pairs():
    a, b = RNG.normal(size=(2, 3)), RNG.normal(size=(2, 3))
    s, t = RNG.uniform(0.5, 2, size=(2, 3)), RNG.uniform(0.5, 2, size=(2, 3))
    p, q = np.array([[0.0, 0.3, 1.0], [0.5, 0.2, 0.7]]), np.array([[0.4, 0.0, 1.0], [0.5, 0.9, 0.1]])
    cp, cq = RNG.uniform(0, 1, size=(2, 3, 4)), RNG.uniform(0, 1, size=(2, 3, 4))
    cq[0, 0, 1] = 0.0  # KL infinite there
    return {
        "Normal": (("Normal", (a, s)), ("Normal", (b, t))),
        "Laplace": (("Laplace", (a, s)), ("Laplace", (b, t))),
        "Exponential": (("Exponential", (s,)), ("Exponential", (t,))),
        "Uniform": (("Uniform", (a - s, a + s)), ("Uniform", (a - 2 * s, a + 2 * s + RNG.uniform(-1, 0, (2, 3))))),
        "Bernoulli": (("Bernoulli", (p,)), ("Bernoulli", (q,))),
        "Categorical": (("Categorical", (cp,)), ("Categorical", (cq,))),
        "OneHotCategorical": (("OneHotCategorical", (cp,)), ("OneHotCategorical", (cq,))),
    }


@pytest.mark.parametrize("case", sorted(_kl_pairs()))
def test_kl_divergence(case):
    (pn, pp), (qn, qp) = _kl_pairs()[case]
    kps, tps = zip(*[pair(x, grad=True) for x in pp])
    kqs, tqs = zip(*[pair(x, grad=True) for x in qp])
    kp, kq = getattr(KD, pn)(*kps, validate_args=False), getattr(KD, qn)(*kqs, validate_args=False)
    tp, tq = getattr(TD, pn)(*tps, validate_args=False), getattr(TD, qn)(*tqs, validate_args=False)
    kk, tk = KD.kl_divergence(kp, kq), TD.kl_divergence(tp, tq)
    same(kk, tk)
    if case == "Uniform":
        assert np.isinf(kk.detach().numpy()).any() and np.isfinite(kk.detach().numpy()).any()
    if case in ("Normal", "Laplace", "Exponential"):
        kk.sum().backward()
        tk.sum().backward()
        for k, t in zip(kps + kqs, tps + tqs):
            same(k.grad, t.grad)
    ki = KD.kl_divergence(KD.Independent(kp, 1), KD.Independent(kq, 1))
    same(ki, TD.kl_divergence(TD.Independent(tp, 1), TD.Independent(tq, 1)))


def test_kl_dispatch_and_unregistered_pair():
    kd, td = KD.Normal(0.0, 1.0), TD.Normal(0.0, 1.0)
    kc, tc = KD.Cauchy(0.0, 1.0), TD.Cauchy(0.0, 1.0)
    with pytest.raises(NotImplementedError) as torch_err:
        TD.kl_divergence(td, tc)
    with pytest.raises(NotImplementedError, match=re.escape(str(torch_err.value))):
        KD.kl_divergence(kd, kc)
    with pytest.raises(NotImplementedError):
        KD.kl_divergence(KD.Independent(KD.Normal(kiln.zeros(2, 3), 1.0), 1),
                         KD.Independent(KD.Normal(kiln.zeros(2, 3), 1.0), 2))

    class Wide(KD.Normal):
        pass

    @KD.register_kl(Wide, KD.Normal)
    def _kl_wide(p, q):
        return kiln.full(p.batch_shape, 42.0)

    assert KD.kl_divergence(Wide(0.0, 1.0), KD.Normal(0.0, 1.0)).item() == 42.0
    assert KD.kl_divergence(KD.Normal(0.0, 1.0), Wide(0.0, 1.0)).item() == 0.0  # Normal-Normal still
    with pytest.raises(TypeError, match="Expected type_p to be a Distribution subclass"):
        KD.register_kl(int, KD.Normal)


def _torch_message(err):
    """torch's message with torch.Size([..]) written as a tuple, up to the first tensor it prints."""
    msg = re.sub(r"torch\.Size\(\[([^\]]*)\]\)",
                 lambda m: str(tuple(int(x) for x in m.group(1).split(",") if x.strip())), str(err))
    return msg.split("tensor(")[0].split(":\n")[0]


BAD = [
    ("Normal", lambda m, x: m.Normal(x([0.0, 1.0]), x([1.0, -1.0]))),
    ("Exponential", lambda m, x: m.Exponential(x([0.0, 1.0]))),
    ("Uniform", lambda m, x: m.Uniform(x([0.0, 1.0]), x([1.0, 1.0]))),
    ("Bernoulli", lambda m, x: m.Bernoulli(probs=x([0.5, 1.5]))),
    ("Bernoulli logits", lambda m, x: m.Bernoulli(logits=x([0.5, math.nan]))),
    ("Geometric", lambda m, x: m.Geometric(probs=x([0.0, 0.5]))),
    ("Categorical", lambda m, x: m.Categorical(probs=x([[0.5, -0.5], [1.0, 1.0]]))),
    ("Laplace", lambda m, x: m.Laplace(x([0.0, 1.0]), x([0.0, 1.0]))),
    ("log_prob outside the support", lambda m, x: m.Exponential(x([1.0, 2.0])).log_prob(x([1.0, -1.0]))),
    ("Bernoulli value", lambda m, x: m.Bernoulli(probs=x([0.5, 0.5])).log_prob(x([1.0, 0.5]))),
    ("Categorical value", lambda m, x: m.Categorical(probs=x([0.5, 0.5])).log_prob(x([1.0, 2.0]))),
    ("cdf outside the support", lambda m, x: m.Uniform(x([0.0, 0.0]), x([1.0, 1.0])).cdf(x([0.5, 2.0]))),
    ("not broadcastable", lambda m, x: m.Normal(x([0.0, 1.0]), x([1.0, 1.0])).log_prob(x([0.0, 1.0, 2.0]))),
    ("event shape", lambda m, x: m.OneHotCategorical(probs=x([0.5, 0.5])).log_prob(x([1.0, 0.0, 0.0]))),
    ("not a tensor", lambda m, x: m.Normal(x([0.0, 1.0]), x([1.0, 1.0])).log_prob(0.5)),
    ("probs and logits", lambda m, x: m.Bernoulli(probs=x([0.5]), logits=x([0.0]))),
    ("0-dim probs", lambda m, x: m.Categorical(probs=x(0.5))),
]


@pytest.mark.parametrize("case", [c[0] for c in BAD])
def test_validate_args_errors_as_torch(case):
    fn = dict(BAD)[case]
    with pytest.raises(ValueError) as torch_err:
        fn(TD, lambda v: torch.tensor(v, dtype=torch.float64))
    with pytest.raises(ValueError) as kiln_err:
        fn(KD, lambda v: kiln.tensor(v, dtype=F64))
    expected = _torch_message(torch_err.value)
    assert str(kiln_err.value).startswith(expected), (str(kiln_err.value), expected)


def test_validate_args_off():
    d = KD.Normal(kiln.tensor([0.0]), kiln.tensor([-1.0]), validate_args=False)
    assert math.isnan(d.log_prob(kiln.tensor([0.0])).item())
    assert KD.Exponential(kiln.tensor([1.0]), validate_args=False).log_prob(kiln.tensor([-1.0])).item() == 1.0
    KD.Distribution.set_default_validate_args(False)
    try:
        KD.Normal(0.0, -1.0)
    finally:
        KD.Distribution.set_default_validate_args(True)
    with pytest.raises(ValueError):
        KD.Normal(0.0, -1.0)


def test_import_path():
    """kiln.distributions comes with `import kiln`, as torch.distributions with `import torch`."""
    import subprocess
    import sys

    code = "import kiln; print(kiln.distributions.Normal(0.0, 1.0).log_prob(kiln.tensor(0.0)).item())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert abs(float(out) + 0.5 * math.log(2 * math.pi)) < 1e-6


@pytest.mark.parametrize("by", ["probs", "logits"])
def test_relaxed_bernoulli(by):
    p = np.array([[0.2, 0.5, 0.9], [0.7, 0.4, 0.1]])
    arg = p if by == "probs" else np.log(p) - np.log1p(-p)
    kp, tp = pair(arg, grad=True)
    kt, tt = pair(0.7, grad=True)
    kd, td = KD.RelaxedBernoulli(kt, **{by: kp}), TD.RelaxedBernoulli(tt, **{by: tp})
    assert kd.batch_shape == (2, 3) and kd.has_rsample
    kv, tv = pair(RNG.uniform(0.01, 0.99, size=(4, 2, 3)))
    same(kd.log_prob(kv), td.log_prob(tv))
    kd.log_prob(kv).sum().backward()
    td.log_prob(tv).sum().backward()
    same(kp.grad, tp.grad)
    same(kt.grad, tt.grad)
    # x = sigmoid(y), y = (logit(u) + logits) / T: dx/dlogits = x (1 - x) / T, dx/dT = -x (1 - x) y / T
    kl, kt = kiln.tensor(np.log(p) - np.log1p(-p), dtype=F64, requires_grad=True), kiln.tensor(0.7, dtype=F64,
                                                                                             requires_grad=True)
    kiln.manual_seed(4)
    x = KD.RelaxedBernoulli(kt, logits=kl).rsample((50,))
    assert x.shape == (50, 2, 3)
    x.sum().backward()
    xn = x.detach().numpy()
    y = np.log(xn) - np.log1p(-xn)
    assert np.allclose(kl.grad.numpy(), (xn * (1 - xn) / 0.7).sum(0), rtol=1e-6)
    assert np.allclose(kt.grad.item(), (-xn * (1 - xn) * y / 0.7).sum(), rtol=1e-6)
    kiln.manual_seed(5)
    s = kd.sample((20000,)).numpy()
    assert s.min() > 0 and s.max() < 1
    assert np.abs((s > 0.5).mean(0) - p).max() < 0.015  # P(x > 1/2) = P(logit(u) + logits > 0) = p


@pytest.mark.parametrize("by", ["probs", "logits"])
def test_relaxed_one_hot_categorical(by):
    raw = RNG.uniform(0.1, 2.0, size=(2, 4)) if by == "probs" else RNG.normal(size=(2, 4))
    kp, tp = pair(raw, grad=True)
    kt, tt = pair(0.6, grad=True)
    kd, td = KD.RelaxedOneHotCategorical(kt, **{by: kp}), TD.RelaxedOneHotCategorical(tt, **{by: tp})
    assert kd.batch_shape == (2,) and kd.event_shape == (4,)
    same(kd.probs, td.probs)
    v = RNG.uniform(0.05, 1.0, size=(3, 2, 4))
    v /= v.sum(-1, keepdims=True)
    kv, tv = pair(v)
    same(kd.log_prob(kv), td.log_prob(tv))
    kd.log_prob(kv).sum().backward()
    td.log_prob(tv).sum().backward()
    same(kp.grad, tp.grad)
    same(kt.grad, tt.grad)
    kiln.manual_seed(6)
    x = kd.rsample((20000,))
    assert x.shape == (20000, 2, 4) and x.requires_grad and not kd.sample().requires_grad
    xn = x.detach().numpy()
    assert np.allclose(xn.sum(-1), 1)
    # Gumbel-max: the largest coordinate is a draw of Categorical(probs)
    am = xn.argmax(-1)
    freq = np.stack([(am == k).mean(0) for k in range(4)], -1)
    assert np.abs(freq - td.probs.detach().numpy()).max() < 0.015
    assert kd.expand((3, 2)).rsample().shape == (3, 2, 4)
    with pytest.raises(ValueError, match="to be within the support"):
        kd.log_prob(kiln.tensor([0.5, 0.6, 0.0, 0.0], dtype=F64))
