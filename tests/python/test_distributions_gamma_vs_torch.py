# kiln.distributions' gamma family (Gamma, Chi2, Beta, Dirichlet, StudentT), count distributions
# (Poisson, Binomial, NegativeBinomial), Weibull's tensor mean/variance and the KL pairs among them
# (Gamma, Beta, Dirichlet, Poisson, Gumbel) against torch.distributions in float64: log_prob, entropy,
# mean/variance/mode, KL values and their gradients w.r.t. the parameters; rsample's gradients against
# torch's _standard_gamma_grad and the exact rate gradient; sample shapes and moments; validate_args.
import math

import numpy as np
import pytest

import kiln
import kiln.distributions as KD

torch = pytest.importorskip("torch")
TD = torch.distributions

RNG = np.random.default_rng(31)
F64 = kiln.float64


def pair(a, grad=False):
    a = np.asarray(a, dtype=np.float64)
    return (kiln.tensor(a, dtype=F64, requires_grad=grad), torch.tensor(a, dtype=torch.float64, requires_grad=grad))


def same(k, t, tol=1e-9):
    if k is None or t is None:  # no gradient reached that parameter: on both sides
        assert k is None and t is None, (k, t)
        return
    t = t.detach() if isinstance(t, torch.Tensor) else torch.as_tensor(t)
    assert tuple(k.shape) == tuple(t.shape), (tuple(k.shape), tuple(t.shape))
    kn, tn = np.asarray(k.detach().numpy(), dtype=np.float64), t.numpy().astype(np.float64)
    assert np.allclose(kn, tn, rtol=tol, atol=tol, equal_nan=True), (kn, tn)


POS = lambda *s: RNG.uniform(0.3, 4.0, s)  # noqa: E731
# name: (parameter arrays, keyword names or None for positional, values in the support)
CASES = {
    "Gamma": ([POS(2, 3), POS(2, 3)], None, RNG.uniform(0.05, 5.0, (4, 2, 3))),
    "Chi2": ([POS(2, 3)], None, RNG.uniform(0.05, 5.0, (4, 2, 3))),
    "Beta": ([POS(2, 3), POS(2, 3)], None, RNG.uniform(0.02, 0.98, (4, 2, 3))),
    "Dirichlet": ([POS(2, 4)], None, RNG.dirichlet(np.ones(4), size=(3, 2))),
    "StudentT": ([RNG.uniform(0.5, 5.0, (2, 3)), RNG.normal(size=(2, 3)), POS(2, 3)], None,
                 RNG.normal(size=(4, 2, 3)) * 3),
    "Poisson": ([POS(2, 3)], None, RNG.integers(0, 8, (4, 2, 3)).astype(np.float64)),
    "BinomialProbs": ([np.full((2, 3), 7.0), RNG.uniform(0.05, 0.95, (2, 3))], ("total_count", "probs"),
                      RNG.integers(0, 8, (4, 2, 3)).astype(np.float64)),
    "BinomialLogits": ([np.array([[3.0, 5.0, 9.0]]), RNG.normal(size=(2, 3))], ("total_count", "logits"),
                       RNG.integers(0, 4, (4, 2, 3)).astype(np.float64)),
    "NegativeBinomialProbs": ([POS(2, 3), RNG.uniform(0.05, 0.9, (2, 3))], ("total_count", "probs"),
                              RNG.integers(0, 8, (4, 2, 3)).astype(np.float64)),
    "NegativeBinomialLogits": ([POS(2, 3), RNG.normal(size=(2, 3))], ("total_count", "logits"),
                               RNG.integers(0, 8, (4, 2, 3)).astype(np.float64)),
}
CASES["Gamma"][0][0][0, 0] = 0.4  # mode clamped at 0
GRAD_PARAMS = {"BinomialProbs": (1,), "BinomialLogits": (1,)}  # total_count is an integer count


def cls_name(name):
    for base in ("Binomial", "NegativeBinomial"):
        if name.startswith(base) and name[len(base):] in ("Probs", "Logits"):
            return base
    return name


def make(name, grad=True):
    arrays, kw, _ = CASES[name]
    which = GRAD_PARAMS.get(name, range(len(arrays)))
    ks, ts = zip(*[pair(a, grad=(i in which) and grad) for i, a in enumerate(arrays)])
    c = cls_name(name)
    if kw is None:
        return getattr(KD, c)(*ks), getattr(TD, c)(*ts), ks, ts
    return getattr(KD, c)(**dict(zip(kw, ks))), getattr(TD, c)(**dict(zip(kw, ts))), ks, ts


@pytest.mark.parametrize("name", sorted(CASES))
def test_values_and_gradients(name):
    kd, td, ks, ts = make(name)
    assert kd.batch_shape == tuple(td.batch_shape) and kd.event_shape == tuple(td.event_shape)
    assert kd.has_rsample == td.has_rsample
    kv, tv = pair(CASES[name][2])
    same(kd.log_prob(kv), td.log_prob(tv))
    props = ["mean", "variance", "stddev", "mode"]
    has_entropy = not name.startswith("NegativeBinomial") and name not in ("Poisson", "BinomialLogits")
    if has_entropy:
        same(kd.entropy(), td.entropy())
    elif name == "BinomialLogits":  # total_count differs along the batch: neither enumerates the support
        for d in (kd, td):
            with pytest.raises(NotImplementedError, match="(?i)inhomogeneous total.count"):
                d.entropy()
    for prop in props:
        same(getattr(kd, prop), getattr(td, prop))
    fns = [lambda d, v: d.log_prob(v).sum(), lambda d, v: (d.mean * d.variance.sqrt()).sum()]
    if has_entropy:
        fns.append(lambda d, v: (d.entropy() * 1.3).sum())
    for fn in fns:
        kd, td, ks, ts = make(name)
        fn(kd, kv).backward()
        fn(td, tv).backward()
        for k, t in zip(ks, ts):
            if t.requires_grad:
                same(k.grad, t.grad, 1e-8)


def test_expand_and_number_parameters():
    for name in CASES:
        kd, td, _, _ = make(name, grad=False)
        ke, te = kd.expand((5,) + kd.batch_shape), td.expand((5,) + tuple(td.batch_shape))
        assert ke.batch_shape == tuple(te.batch_shape)
        assert type(ke) is type(kd)
        kv, tv = pair(CASES[name][2])
        same(ke.log_prob(kv[:1]), te.log_prob(tv[:1]))
    for c, args in (("Gamma", (2.0, 3.0)), ("Chi2", (3.0,)), ("Beta", (2.0, 0.5)), ("StudentT", (3.0,)),
                    ("Poisson", (2.5,))):
        kd, td = getattr(KD, c)(*args), getattr(TD, c)(*args)
        assert kd.batch_shape == tuple(td.batch_shape) == ()
        assert kd.sample((3,)).shape == (3,)


# ------------------------------------------------------------------------------------------------ sampling
def _moments_ok(x, mean, var, n):
    """sample mean within 5 standard errors of mean, sample variance within 15% of var"""
    m, v = x.mean(0), x.var(0)
    assert np.all(np.abs(m - mean) < 5 * np.sqrt(var / n)), (m, mean)
    assert np.all(np.abs(v / var - 1) < 0.15), (v, var)


@pytest.mark.parametrize("name", ["Gamma", "Chi2", "Beta", "Dirichlet", "StudentT", "Poisson", "BinomialProbs",
                                  "NegativeBinomialProbs"])
def test_sample_shapes_and_moments(name):
    kiln.manual_seed(5)
    kd, td, _, _ = make(name, grad=False)
    if name == "StudentT":  # finite variance: df > 4 so the sample variance settles
        kd, td = KD.StudentT(kiln.tensor([5.0, 9.0], dtype=F64), 1.0, 2.0), TD.StudentT(torch.tensor([5.0, 9.0]), 1.0, 2.0)
    n = 20000
    x = kd.sample((n,))
    assert tuple(x.shape) == (n,) + tuple(td.batch_shape) + tuple(td.event_shape)
    assert x.requires_grad is False
    x = x.numpy()
    assert bool(kd.support.check(kiln.tensor(x)).all())
    _moments_ok(x, td.mean.double().numpy(), td.variance.double().numpy(), n)
    kiln.manual_seed(5)
    assert np.array_equal(kd.sample((n,)).numpy(), x)  # reproducible from kiln.manual_seed


def test_gamma_small_concentration_samples():
    kiln.manual_seed(1)
    c = np.array([0.05, 0.3, 0.9])
    x = KD.Gamma(kiln.tensor(c), 1.0).sample((40000,)).numpy()
    assert np.all(x > 0)
    _moments_ok(x, c, c, 40000)


def test_gamma_invalid_concentration_samples_nan_without_validation():
    c = kiln.tensor([math.nan, -1.0, 0.0, 2.0], dtype=F64)
    x = KD.Gamma(c, 1.0, validate_args=False).sample((3,)).numpy()  # would loop forever if never accepted
    assert np.isnan(x[:, :3]).all() and (x[:, 3] > 0).all()
    x32 = KD.Gamma(kiln.tensor([0.5, 3.0]), kiln.tensor([1.0, 2.0])).sample((5,))
    assert x32.dtype == kiln.float32 and (x32.numpy() > 0).all()


def test_gamma_samples_follow_the_gamma_cdf():
    # Kolmogorov-Smirnov against torch's regularised incomplete gamma: a sampler with a wrong acceptance
    # step still has nearly the right mean and variance, not the right distribution
    kiln.manual_seed(7)
    n = 20000
    for a in (0.3, 1.0, 2.5, 30.0):
        x = np.sort(KD.Gamma(kiln.tensor([a], dtype=F64), 2.0).sample((n,)).numpy()[:, 0])
        f = torch.special.gammainc(torch.tensor(a, dtype=torch.float64), torch.tensor(x * 2.0)).numpy()
        d = max(np.max(np.arange(1, n + 1) / n - f), np.max(f - np.arange(n) / n))
        assert d < 1.95 / math.sqrt(n), (a, d)  # the 0.1% critical value


def test_poisson_sample_frequencies():
    kiln.manual_seed(8)
    n = 40000
    for rate in (0.7, 6.0):
        x = KD.Poisson(kiln.tensor([rate], dtype=F64)).sample((n,)).numpy()[:, 0]
        for k in range(int(rate) + 3):
            p = math.exp(k * math.log(rate) - rate - math.lgamma(k + 1))
            assert abs(np.mean(x == k) - p) < 5 * math.sqrt(p * (1 - p) / n), (rate, k)


def test_negative_binomial_zero_total_count():
    kn, tn = pair([0.0, 2.0, 0.0])
    kv, tv = pair([0.0, 0.0, 3.0])
    same(KD.NegativeBinomial(kn, probs=0.3, validate_args=False).log_prob(kv),
         TD.NegativeBinomial(tn, probs=0.3, validate_args=False).log_prob(tv))


def test_gamma_rsample_gradients():
    kiln.manual_seed(2)
    kc, tc = pair([0.2, 0.9, 1.0, 3.5, 40.0], grad=True)
    kr, tr = pair([2.0, 0.5, 1.0, 1.5, 0.3], grad=True)
    x = KD.Gamma(kc, kr).rsample((200,))
    assert x.shape == (200, 5)
    (x * kiln.tensor(np.arange(200.0)).reshape(200, 1)).sum().backward()
    xs = x.detach().numpy() * tr.detach().numpy()  # the standard gamma draws
    tx = torch.tensor(xs)
    w = torch.arange(200.0, dtype=torch.float64).reshape(200, 1)
    # rate: exact (x = s / rate); concentration: torch's implicit gradient of the same draws
    exp_rate = (-(w * tx) / tr.detach() ** 2).sum(0)
    exp_conc = (w * torch._standard_gamma_grad(tc.detach().expand(200, 5), tx) / tr.detach()).sum(0)
    same(kr.grad, exp_rate, 1e-9)
    same(kc.grad, exp_conc, 1e-3)  # torch's is an approximation (about 1e-4 relative); kiln's sums the series


def test_rsample_gradient_means_match_analytic():
    # d/dtheta E[f(x)] by pathwise gradients over many draws against the analytic gradient of the mean
    kiln.manual_seed(3)
    kc = kiln.tensor([0.6, 2.0], dtype=F64, requires_grad=True)
    kd = KD.Dirichlet(kc)
    x = kd.rsample((40000,))
    x[:, 0].mean().backward()  # E[x0] = c0 / (c0 + c1)
    c0, c1 = 0.6, 2.0
    exact = np.array([c1 / (c0 + c1) ** 2, -c0 / (c0 + c1) ** 2])
    assert np.allclose(kc.grad.numpy(), exact, rtol=0.05), (kc.grad.numpy(), exact)
    kiln.manual_seed(4)
    k1 = kiln.tensor(1.5, dtype=F64, requires_grad=True)
    KD.Beta(k1, 3.0).rsample((40000,)).mean().backward()
    assert abs(k1.grad.item() - 3.0 / 4.5 ** 2) < 0.05 * 3.0 / 4.5 ** 2
    kiln.manual_seed(6)
    loc = kiln.tensor(0.5, dtype=F64, requires_grad=True)
    scale = kiln.tensor(2.0, dtype=F64, requires_grad=True)
    df = kiln.tensor(6.0, dtype=F64, requires_grad=True)
    (KD.StudentT(df, loc, scale).rsample((40000,)) ** 2).mean().backward()
    # E[x^2] = loc^2 + scale^2 df / (df - 2)
    assert abs(loc.grad.item() - 1.0) < 0.1
    assert abs(scale.grad.item() - 2 * 2.0 * 6 / 4) < 0.1 * 6
    assert abs(df.grad.item() - (-2 * 4.0 / 16)) < 0.1


def test_poisson_binomial_samples_have_no_gradient():
    r = kiln.tensor([1.0, 2.0], dtype=F64, requires_grad=True)
    assert not KD.Poisson(r).has_rsample
    with pytest.raises(NotImplementedError, match="has no rsample"):
        KD.Poisson(r).rsample()


# ----------------------------------------------------------------------------------------------- Weibull
def test_weibull_tensor_concentration_mean_variance():
    ks, ts = pair(POS(2, 3), grad=True)
    kc, tc = pair(POS(2, 3), grad=True)
    kd, td = KD.Weibull(ks, kc), TD.Weibull(ts, tc)
    same(kd.mean, td.mean)
    same(kd.variance, td.variance)
    (kd.mean + kd.variance).sum().backward()
    (td.mean + td.variance).sum().backward()
    same(ks.grad, ts.grad, 1e-8)
    same(kc.grad, tc.grad, 1e-8)


# -------------------------------------------------------------------------------------------------- KL
KL_PAIRS = {
    "Gamma": lambda M, a, b, c, d: (M.Gamma(a, b), M.Gamma(c, d)),
    "Beta": lambda M, a, b, c, d: (M.Beta(a, b), M.Beta(c, d)),
    "Dirichlet": lambda M, a, b, c, d: (M.Dirichlet(M_stack(M, a, b)), M.Dirichlet(M_stack(M, c, d))),
    "Poisson": lambda M, a, b, c, d: (M.Poisson(a * b), M.Poisson(c)),
    "Gumbel": lambda M, a, b, c, d: (M.Gumbel(a - 1, b), M.Gumbel(c, d)),
    "ExponentialGamma": lambda M, a, b, c, d: (M.Exponential(a), M.Gamma(c, d)),
    "GammaExponential": lambda M, a, b, c, d: (M.Gamma(a, b), M.Exponential(c)),
    "Binomial": lambda M, a, b, c, d: (M.Binomial(5, probs=a / (a + b)), M.Binomial(5, logits=c - d)),
}


def M_stack(M, a, b):
    return (kiln if M is KD else torch).stack([a, b, a * b], -1)


@pytest.mark.parametrize("name", sorted(KL_PAIRS))
def test_kl_values_and_gradients(name):
    arrays = [POS(2, 3) for _ in range(4)]
    kp, tp = zip(*[pair(a, grad=True) for a in arrays])
    kl_k = KD.kl_divergence(*KL_PAIRS[name](KD, *kp))
    kl_t = TD.kl_divergence(*KL_PAIRS[name](TD, *tp))
    same(kl_k, kl_t)
    assert np.all(kl_k.detach().numpy() >= -1e-12)
    kl_k.sum().backward()
    kl_t.sum().backward()
    for k, t in zip(kp, tp):
        same(k.grad, t.grad, 1e-8)
    if name in ("ExponentialGamma", "GammaExponential"):
        return
    p, _ = KL_PAIRS[name](KD, *kp)
    same(KD.kl_divergence(p, p), torch.zeros(tuple(kl_t.shape), dtype=torch.float64), 1e-9)


def test_kl_binomial_total_counts():
    (kp, tp), (kq, tq) = pair([0.3, 0.6]), pair([0.5, 0.2])
    kn, tn = pair([5.0, 3.0])
    same(KD.kl_divergence(KD.Binomial(kn, kp), KD.Binomial(3.0, kq)),
         TD.kl_divergence(TD.Binomial(tn, tp), TD.Binomial(3.0, tq)))  # inf where p has more trials
    for M, a, b in ((KD, kp, kq), (TD, tp, tq)):
        with pytest.raises(NotImplementedError, match="q.total_count > p.total_count"):
            M.kl_divergence(M.Binomial(2.0, a), M.Binomial(3.0, b))


# --------------------------------------------------------------------------------------------- validation
@pytest.mark.parametrize("case", [
    (lambda M: M.Gamma(-1.0, 1.0), "Expected parameter concentration"),
    (lambda M: M.Gamma(1.0, 0.0), "Expected parameter rate"),
    (lambda M: M.Chi2(-2.0), "Expected parameter df"),
    (lambda M: M.Beta(1.0, -0.5), "Expected parameter concentration"),
    (lambda M: M.StudentT(-1.0), "Expected parameter df"),
    (lambda M: M.StudentT(2.0, 0.0, -1.0), "Expected parameter scale"),
    (lambda M: M.Poisson(-1.0), "Expected parameter rate"),
    (lambda M: M.Gamma(2.0, 1.0).log_prob(_t(M, [-1.0])), "Expected value argument"),
    (lambda M: M.Poisson(2.0).log_prob(_t(M, [1.5])), "Expected value argument"),
    (lambda M: M.Beta(2.0, 1.0).log_prob(_t(M, [1.5])), "Expected value argument"),
    (lambda M: M.Binomial(3.0, probs=_t(M, [0.5])).log_prob(_t(M, [4.0])), "Expected value argument"),
    (lambda M: M.Binomial(3.0, probs=_t(M, [1.5])), "Expected parameter probs"),
    (lambda M: M.NegativeBinomial(-1.0, probs=_t(M, [0.5])), "Expected parameter total_count"),
    (lambda M: M.Binomial(3.0, probs=_t(M, [0.5]), logits=_t(M, [0.5])), "Either `probs` or `logits`"),
])
def test_validate_args_errors(case):
    fn, msg = case
    for M in (TD, KD):
        with pytest.raises(ValueError, match=msg):
            fn(M)


def _t(M, v):
    return kiln.tensor(v, dtype=F64) if M is KD else torch.tensor(v, dtype=torch.float64)


def test_dirichlet_errors():
    with pytest.raises(ValueError, match="concentration.*one-dimensional"):
        KD.Dirichlet(kiln.tensor(1.0, dtype=F64))
    with pytest.raises(ValueError, match="Expected parameter concentration"):
        KD.Dirichlet(kiln.tensor([1.0, -1.0], dtype=F64))
    with pytest.raises(ValueError, match="Expected value argument"):
        KD.Dirichlet(kiln.tensor([1.0, 2.0], dtype=F64)).log_prob(kiln.tensor([0.5, 0.6], dtype=F64))


# ------------------------------------------------------------------------------------- MultivariateNormal
def _spd(*batch, n=3):
    a = RNG.normal(size=batch + (n, n))
    return a @ np.swapaxes(a, -1, -2) + n * np.eye(n)


def _mvn(M, loc, mat, kind):
    return M.MultivariateNormal(loc, **{kind: mat})


MVN_KINDS = {"covariance_matrix": lambda m: m, "precision_matrix": np.linalg.inv,
             "scale_tril": np.linalg.cholesky}


@pytest.mark.parametrize("kind", sorted(MVN_KINDS))
def test_mvn_values_and_gradients(kind):
    mat = MVN_KINDS[kind](_spd(2))
    loc = RNG.normal(size=(4, 1, 3))  # broadcast against the matrices' batch (2,)
    value = RNG.normal(size=(5, 4, 2, 3))
    for fn in (lambda d, v: d.log_prob(v).sum(), lambda d, v: d.entropy().sum() * 1.7,
               lambda d, v: (d.variance * d.mean).sum() + d.covariance_matrix.sum() + d.precision_matrix.sum()
               + d.scale_tril.sum()):
        (kl, tl), (km, tm) = pair(loc, True), pair(mat, True)
        kd, td = _mvn(KD, kl, km, kind), _mvn(TD, tl, tm, kind)
        assert kd.batch_shape == tuple(td.batch_shape) == (4, 2) and kd.event_shape == (3,)
        kv, tv = pair(value)
        same(fn(kd, kv), fn(td, tv))
        fn(kd, kv).backward()
        fn(td, tv).backward()
        same(kl.grad, tl.grad, 1e-8)
        same(km.grad, tm.grad, 1e-8)
    same(kd.log_prob(kv), td.log_prob(tv))
    same(kd.entropy(), td.entropy())
    for prop in ("mean", "mode", "variance", "stddev", "covariance_matrix", "precision_matrix", "scale_tril"):
        same(getattr(kd, prop), getattr(td, prop))
    same(kd.expand((5, 4, 2)).log_prob(kv), td.expand((5, 4, 2)).log_prob(tv))


def test_mvn_rsample_moments_and_gradient():
    kiln.manual_seed(9)
    cov = _spd(n=3)
    kl, km = kiln.tensor([1.0, -2.0, 0.5], dtype=F64, requires_grad=True), kiln.tensor(cov, requires_grad=True)
    d = KD.MultivariateNormal(kl, covariance_matrix=km)
    n = 40000
    x = d.rsample((n,))
    assert tuple(x.shape) == (n, 3)
    xn = x.detach().numpy()
    assert np.all(np.abs(xn.mean(0) - [1.0, -2.0, 0.5]) < 5 * np.sqrt(np.diag(cov) / n))
    assert np.allclose(np.cov(xn.T), cov, rtol=0.05, atol=0.05 * np.sqrt(np.outer(np.diag(cov), np.diag(cov))).max())
    # d/dSigma E[x x^T][0, 1] = d/dSigma (Sigma_01 + mu_0 mu_1): the pathwise gradient's mean is close
    (x[:, 0] * x[:, 1]).mean().backward()
    assert np.allclose(kl.grad.numpy(), [-2.0, 1.0, 0.0], atol=0.1)
    g = km.grad.numpy()  # symmetric part of the gradient: 1/2 at (0, 1) and (1, 0)
    assert abs((g[0, 1] + g[1, 0]) - 1.0) < 0.1 and abs(g[0, 0]) < 0.1


def test_mvn_kl_values_and_gradients():
    (kl1, tl1), (kl2, tl2) = pair(RNG.normal(size=(2, 3)), True), pair(RNG.normal(size=(3,)), True)
    (ka, ta), (kb, tb) = pair(np.linalg.cholesky(_spd(2)), True), pair(_spd(), True)
    kk = KD.kl_divergence(KD.MultivariateNormal(kl1, scale_tril=ka), KD.MultivariateNormal(kl2, covariance_matrix=kb))
    tk = TD.kl_divergence(TD.MultivariateNormal(tl1, scale_tril=ta), TD.MultivariateNormal(tl2, covariance_matrix=tb))
    same(kk, tk)
    kk.sum().backward()
    tk.sum().backward()
    for k, t in ((kl1, tl1), (kl2, tl2), (ka, ta), (kb, tb)):
        same(k.grad, t.grad, 1e-8)
    p = KD.MultivariateNormal(kl1.detach(), scale_tril=ka.detach())
    same(KD.kl_divergence(p, p), torch.zeros(2, dtype=torch.float64))


@pytest.mark.parametrize("case", [
    (lambda M, t: M.MultivariateNormal(t([0.0, 0.0]), covariance_matrix=t([[1.0, 2.0], [2.0, 1.0]])),
     "Expected parameter covariance_matrix"),
    (lambda M, t: M.MultivariateNormal(t([0.0, 0.0]), scale_tril=t([[1.0, 0.5], [0.0, 1.0]])),
     "Expected parameter scale_tril"),
    (lambda M, t: M.MultivariateNormal(t([0.0, 0.0]), precision_matrix=t([[1.0, 0.3], [0.0, 1.0]])),
     "Expected parameter precision_matrix"),
    (lambda M, t: M.MultivariateNormal(t([0.0, 0.0]), covariance_matrix=t([[1.0, 0.0], [0.0, 1.0]]),
                                       scale_tril=t([[1.0, 0.0], [0.0, 1.0]])), "Exactly one of"),
])
def test_mvn_validate_args_errors(case):
    fn, msg = case
    for M in (TD, KD):
        with pytest.raises(ValueError, match=msg):
            fn(M, lambda v: _t(M, v))
    with pytest.raises(ValueError, match="loc must be at least one-dimensional"):
        KD.MultivariateNormal(kiln.tensor(0.0, dtype=F64), covariance_matrix=kiln.eye(1, dtype=F64))
    with pytest.raises(ValueError, match=r"covariance_matrix must be of shape \(\.\.\., 2, 2\)"):
        KD.MultivariateNormal(kiln.zeros(2, dtype=F64), covariance_matrix=kiln.eye(3, dtype=F64))


# ------------------------------------------------------------------------------------------- Multinomial
@pytest.mark.parametrize("by", ["probs", "logits"])
def test_multinomial_values_and_gradients(by):
    p = RNG.dirichlet(np.ones(4), size=(2,))
    arr = p if by == "probs" else np.log(p) + 0.3
    counts = np.stack([RNG.multinomial(6, q, size=3) for q in p], 1).astype(np.float64)  # (3, 2, 4)
    for fn in (lambda d, v: d.log_prob(v).sum(), lambda d, v: d.entropy().sum(),
               lambda d, v: (d.mean * d.variance).sum()):
        kp, tp = pair(arr, True)
        kd, td = KD.Multinomial(6, **{by: kp}), TD.Multinomial(6, **{by: tp})
        assert kd.batch_shape == tuple(td.batch_shape) == (2,) and kd.event_shape == (4,)
        kv, tv = pair(counts)
        same(fn(kd, kv), fn(td, tv))
        fn(kd, kv).backward()
        fn(td, tv).backward()
        same(kp.grad, tp.grad, 1e-8)
    same(kd.log_prob(kv), td.log_prob(tv))
    same(kd.entropy(), td.entropy())
    same(kd.expand((3, 2)).log_prob(kv), td.expand((3, 2)).log_prob(tv))
    # a zero-probability category counted zero times
    zp = kiln.tensor([0.5, 0.0, 0.5], dtype=F64)
    same(KD.Multinomial(2, probs=zp).log_prob(kiln.tensor([1.0, 0.0, 1.0], dtype=F64)),
         TD.Multinomial(2, probs=torch.tensor([0.5, 0.0, 0.5], dtype=torch.float64)).log_prob(
             torch.tensor([1.0, 0.0, 1.0], dtype=torch.float64)))
    zl = [0.0, -math.inf, 0.2]  # logits -inf: 0 * -inf taken as 0
    same(KD.Multinomial(2, logits=kiln.tensor(zl, dtype=F64)).log_prob(kiln.tensor([1.0, 0.0, 1.0], dtype=F64)),
         TD.Multinomial(2, logits=torch.tensor(zl, dtype=torch.float64)).log_prob(
             torch.tensor([1.0, 0.0, 1.0], dtype=torch.float64)))


def test_multinomial_samples():
    kiln.manual_seed(10)
    p = np.array([[0.1, 0.2, 0.7], [0.5, 0.25, 0.25]])
    d = KD.Multinomial(5, probs=kiln.tensor(p))
    n = 20000
    x = d.sample((n,)).numpy()
    assert x.shape == (n, 2, 3)
    assert np.all(x.sum(-1) == 5)
    _moments_ok(x, 5 * p, 5 * p * (1 - p), n)
    with pytest.raises(ValueError, match="total_count must be a nonnegative int"):
        KD.Multinomial(2.5, probs=kiln.tensor(p))
    for M in (TD, KD):
        with pytest.raises(ValueError, match="Expected value argument"):
            M.Multinomial(2, probs=_t(M, [0.5, 0.5])).log_prob(_t(M, [3.0, 1.0]))


# ------------------------------------------------------------------------------- LowRankMultivariateNormal
def test_lowrank_mvn_values_and_gradients():
    loc, W, D = RNG.normal(size=(4, 1, 3)), RNG.normal(size=(2, 3, 2)), RNG.uniform(0.5, 2.0, (3,))
    value = RNG.normal(size=(5, 4, 2, 3))
    for fn in (lambda d, v: d.log_prob(v).sum(), lambda d, v: d.entropy().sum() * 1.7,
               lambda d, v: (d.variance * d.mean).sum() + d.covariance_matrix.sum() + d.precision_matrix.sum()
               + d.scale_tril.sum()):
        ks, ts = zip(*[pair(a, True) for a in (loc, W, D)])
        kd, td = KD.LowRankMultivariateNormal(*ks), TD.LowRankMultivariateNormal(*ts)
        assert kd.batch_shape == tuple(td.batch_shape) == (4, 2) and kd.event_shape == (3,)
        kv, tv = pair(value)
        same(fn(kd, kv), fn(td, tv))
        fn(kd, kv).backward()
        fn(td, tv).backward()
        for k, t in zip(ks, ts):
            same(k.grad, t.grad, 1e-8)
    same(kd.log_prob(kv), td.log_prob(tv))
    same(kd.entropy(), td.entropy())
    for prop in ("mean", "mode", "variance", "stddev", "covariance_matrix", "precision_matrix", "scale_tril"):
        same(getattr(kd, prop), getattr(td, prop))
    same(kd.expand((5, 4, 2)).log_prob(kv), td.expand((5, 4, 2)).log_prob(tv))


def test_lowrank_mvn_rsample_and_errors():
    kiln.manual_seed(11)
    W, D = RNG.normal(size=(3, 2)), np.array([0.5, 1.0, 2.0])
    d = KD.LowRankMultivariateNormal(kiln.tensor([1.0, 0.0, -1.0], dtype=F64), kiln.tensor(W), kiln.tensor(D))
    n = 40000
    x = d.rsample((n,)).numpy()
    assert x.shape == (n, 3)
    cov = W @ W.T + np.diag(D)
    assert np.all(np.abs(x.mean(0) - [1.0, 0.0, -1.0]) < 5 * np.sqrt(np.diag(cov) / n))
    assert np.allclose(np.cov(x.T), cov, atol=0.05 * np.abs(cov).max())
    for M in (TD, KD):
        with pytest.raises(ValueError, match="Expected parameter cov_diag"):
            M.LowRankMultivariateNormal(_t(M, [0.0, 0.0]), _t(M, [[1.0], [1.0]]), _t(M, [1.0, -1.0]))
        with pytest.raises(ValueError, match="cov_factor must be a batch of matrices with shape"):
            M.LowRankMultivariateNormal(_t(M, [0.0, 0.0]), _t(M, [[1.0], [1.0], [1.0]]), _t(M, [1.0, 1.0]))
