# kiln.distributions.transforms, biject_to/transform_to, TransformedDistribution and the distributions
# built on it (HalfNormal, HalfCauchy, Pareto, Weibull, LogisticNormal), ContinuousBernoulli and the KL
# pairs added with them, against torch.distributions in float64: forward, inverse and
# log_abs_det_jacobian values and gradients, composition, caching, shapes, log_prob/cdf/icdf/entropy/
# mean/variance, rsample gradients, expand, biject_to round trips and validate_args' errors.
import math

import numpy as np
import pytest

import kiln
import kiln.distributions as KD

torch = pytest.importorskip("torch")
TD = torch.distributions
TT = torch.distributions.transforms

RNG = np.random.default_rng(23)
F64 = kiln.float64


def pair(a, grad=False):
    a = np.asarray(a, dtype=np.float64)
    return (kiln.tensor(a, dtype=F64, requires_grad=grad), torch.tensor(a, dtype=torch.float64, requires_grad=grad))


def same(k, t, tol=1e-9):
    if t is None or k is None:
        assert k is None and t is None, (k, t)
        return
    t = t.detach() if isinstance(t, torch.Tensor) else torch.as_tensor(t)
    assert tuple(k.shape) == tuple(t.shape), (tuple(k.shape), tuple(t.shape))
    kn, tn = np.asarray(k.detach().numpy(), dtype=np.float64), t.numpy().astype(np.float64)
    assert np.allclose(kn, tn, rtol=tol, atol=tol, equal_nan=True), (kn, tn)


# ---------------------------------------------------------------------------------------------- transforms
# name: (kiln factory, torch factory, its parameters as arrays (gradients checked), x inside the domain)
POS = RNG.uniform(0.2, 3.0, size=(4, 3))
REAL = RNG.normal(size=(4, 3))
SIMPLEX = RNG.dirichlet(np.ones(4), size=3)  # (3, 4)
REAL_ZEROS = REAL.copy()
REAL_ZEROS[0, :2] = [0.0, -0.0]  # softplus' and log-sigmoid's kink points of a clamp/abs form: gradient 0.5
TRANSFORMS = {
    "Exp": (lambda M, p: M.ExpTransform(), [], REAL),
    "Sigmoid": (lambda M, p: M.SigmoidTransform(), [], REAL_ZEROS),
    "Softplus": (lambda M, p: M.SoftplusTransform(), [], REAL_ZEROS * 3),
    "Tanh": (lambda M, p: M.TanhTransform(), [], REAL_ZEROS),
    "AffineNumbers": (lambda M, p: M.AffineTransform(0.5, -2.0), [], REAL),
    "AffineTensors": (lambda M, p: M.AffineTransform(p[0], p[1]), [RNG.normal(size=(3,)), RNG.uniform(0.5, 2, (4, 1))],
                      REAL),
    "AffineEvent1": (lambda M, p: M.AffineTransform(p[0], p[1], event_dim=1),
                     [RNG.normal(size=(3,)), RNG.uniform(-2, -0.5, (3,))], REAL),
    "PowerNumber": (lambda M, p: M.PowerTransform(2.5), [], POS),
    "PowerTensor": (lambda M, p: M.PowerTransform(p[0]), [RNG.uniform(-2, 2, (3,))], POS),
    "StickBreaking": (lambda M, p: M.StickBreakingTransform(), [], REAL),
    "IndependentExp": (lambda M, p: M.IndependentTransform(M.ExpTransform(), 1), [], REAL),
    "Reshape": (lambda M, p: M.ReshapeTransform((3,), (3, 1)), [], REAL),
    "ComposeExpAffine": (lambda M, p: M.ComposeTransform([M.ExpTransform(), M.AffineTransform(p[0], p[1])]),
                         [RNG.normal(size=(3,)), RNG.uniform(0.5, 2, (3,))], REAL),
    "ComposeAffineStick": (lambda M, p: M.ComposeTransform([M.AffineTransform(p[0], 2.0), M.StickBreakingTransform(),
                                                            M.AffineTransform(0.0, p[1], event_dim=1)]),
                           [RNG.normal(size=(3,)), RNG.uniform(0.5, 2, (4,))], REAL),
    "InverseSigmoid": (lambda M, p: M.SigmoidTransform().inv, [], RNG.uniform(0.05, 0.95, (4, 3))),
    "InverseStick": (lambda M, p: M.StickBreakingTransform().inv, [], SIMPLEX),
    "Cat": (lambda M, p: M.CatTransform([M.ExpTransform(), M.AffineTransform(p[0], 3.0)], dim=1, lengths=[1, 2]),
            [RNG.normal(size=(4, 2))], REAL),
    "Stack": (lambda M, p: M.StackTransform([M.ExpTransform(), M.TanhTransform(), M.SigmoidTransform()], dim=1),
              [], REAL),
}


def make_transform(name, grad=True):
    factory, params, _ = TRANSFORMS[name]
    ks, ts = zip(*[pair(p, grad) for p in params]) if params else ((), ())
    return factory(KD.transforms, ks), factory(TT, ts), ks, ts


@pytest.mark.parametrize("name", sorted(TRANSFORMS))
def test_transform_values_and_gradients(name):
    kt, tt, ks, ts = make_transform(name)
    kx, tx = pair(TRANSFORMS[name][2], grad=True)
    ky, ty = kt(kx), tt(tx)
    same(ky, ty)
    kj, tj = kt.log_abs_det_jacobian(kx, ky), tt.log_abs_det_jacobian(tx, ty)
    same(kj, tj)
    # the inverse of a fresh copy of y (no cache), and its gradient
    ky2, ty2 = pair(ty.detach().numpy(), grad=True)
    same(kt.inv(ky2), tt.inv(ty2), 1e-8)
    # gradients of y and log|det J| with respect to x and the parameters
    wy = RNG.normal(size=tuple(ty.shape))
    wj = RNG.normal(size=tuple(tj.shape))
    ((ky * pair(wy)[0]).sum() + (kj * pair(wj)[0]).sum()).backward()
    ((ty * pair(wy)[1]).sum() + (tj * pair(wj)[1]).sum()).backward()
    same(kx.grad, tx.grad, 1e-8)
    for k, t in zip(ks, ts):
        same(k.grad, t.grad, 1e-8)
    (kt.inv(ky2) * pair(TRANSFORMS[name][2])[0]).sum().backward()
    (tt.inv(ty2) * pair(TRANSFORMS[name][2])[1]).sum().backward()
    same(ky2.grad, ty2.grad, 1e-7)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("name", ["Softplus", "Tanh", "Sigmoid"])
def test_softplus_based_transforms_over_the_whole_range(name, dtype):
    # forward and log_abs_det_jacobian values and gradients over +-800 (and at +-0, where torch's softplus
    # has gradient 0.5) against torch in float32 and float64
    x = np.concatenate([np.linspace(-800.0, 800.0, 3201), [0.0, -0.0, 20.0, 20.5, -20.0]]).astype(dtype)
    kt, tt = getattr(KD.transforms, name + "Transform")(), getattr(TT, name + "Transform")()
    eps = float(np.finfo(dtype).eps)
    for part in ("forward", "log_abs_det_jacobian"):
        kx = kiln.tensor(x, dtype=getattr(kiln, dtype), requires_grad=True)
        tx = torch.tensor(x, dtype=getattr(torch, dtype), requires_grad=True)
        ky, ty = kt(kx), tt(tx)
        if part == "log_abs_det_jacobian":
            ky, ty = kt.log_abs_det_jacobian(kx, ky), tt.log_abs_det_jacobian(tx, ty)
        ky.sum().backward()
        ty.sum().backward()
        kn, tn = ky.detach().numpy().astype(np.float64), ty.detach().numpy().astype(np.float64)
        finite = np.isfinite(tn)
        assert np.array_equal(kn[~finite], tn[~finite]), (part, kn[~finite], tn[~finite])
        assert np.all(np.abs(kn - tn)[finite] <= 16 * eps * np.maximum(1.0, np.abs(tn[finite]))), part
        kg, tg = kx.grad.numpy().astype(np.float64), tx.grad.numpy().astype(np.float64)
        assert np.allclose(kg, tg, rtol=4 * eps, atol=4 * eps), (part, np.abs(kg - tg).max())
        if name == "Softplus" and part == "forward":
            assert kg[-5] == 0.5 and kg[-4] == 0.5  # at 0.0 and -0.0


@pytest.mark.parametrize("name", sorted(TRANSFORMS))
def test_transform_attributes_and_shapes(name):
    kt, tt, _, _ = make_transform(name, grad=False)
    assert kt.bijective == tt.bijective
    assert repr(kt.domain) == repr(tt.domain) and repr(kt.codomain) == repr(tt.codomain)
    assert kt.domain.event_dim == tt.domain.event_dim and kt.codomain.event_dim == tt.codomain.event_dim
    for shape in [(4, 3), (2, 4, 3)]:
        if name.startswith("Cat") or name.startswith("Stack"):
            continue
        assert kt.forward_shape(shape) == tuple(tt.forward_shape(torch.Size(shape)))
        assert kt.inverse_shape(kt.forward_shape(shape)) == tuple(tt.inverse_shape(tt.forward_shape(torch.Size(shape))))
    try:
        tsign = tt.sign
    except NotImplementedError:
        with pytest.raises(NotImplementedError):
            kt.sign
        return
    ksign = kt.sign
    if isinstance(tsign, torch.Tensor):
        same(ksign, tsign)
    else:
        assert ksign == tsign
    assert kt.inv.inv is kt and kt.inv is kt.inv  # the inverse is a view, the same object while alive


def test_transform_equality_and_repr():
    T = KD.transforms
    assert T.ExpTransform() == T.ExpTransform() and T.ExpTransform() != T.SigmoidTransform()
    assert T.AffineTransform(1.0, 2.0) == T.AffineTransform(1.0, 2.0) != T.AffineTransform(1.0, 3.0)
    a = kiln.tensor([1.0, 2.0], dtype=F64)
    assert T.AffineTransform(a, 2.0) == T.AffineTransform(a.clone(), 2.0)
    assert T.AffineTransform(a, 2.0) != T.AffineTransform(a + 1, 2.0)
    assert T.PowerTransform(2.0) == T.PowerTransform(2.0) != T.PowerTransform(3.0)
    assert T.ComposeTransform([T.ExpTransform(), T.TanhTransform()]) == T.ComposeTransform([T.ExpTransform(),
                                                                                           T.TanhTransform()])
    assert T.ComposeTransform([T.ExpTransform()]) != T.ComposeTransform([T.TanhTransform()])
    assert T.ExpTransform().inv == T.ExpTransform().inv and T.ExpTransform().inv != T.ExpTransform()
    assert repr(T.ExpTransform().inv) == repr(TT.ExpTransform().inv) == "_InverseTransform(ExpTransform())"
    assert repr(T.ComposeTransform([T.ExpTransform(), T.TanhTransform()])) == repr(
        TT.ComposeTransform([TT.ExpTransform(), TT.TanhTransform()]))
    kc = T.ComposeTransform([T.ExpTransform(), T.AffineTransform(0.0, -1.0)])
    assert kc.sign == -1 and kc.inv.sign == -1 and kc.inv.inv is kc
    assert T.identity_transform(a) is a and T.identity_transform.bijective


def test_caching():
    T = KD.transforms
    x = kiln.tensor(RNG.normal(size=(5,)), dtype=F64)
    cached = T.ExpTransform(cache_size=1)
    y = cached(x)
    assert cached(x) is y and cached.inv(y) is x  # the last (x, y) pair is remembered
    y2 = kiln.tensor(y.numpy(), dtype=F64)
    assert cached.inv(y2) is not x  # a different object is computed
    assert cached.inv(y2) is cached.inv(y2)  # ... and then remembered
    plain = T.ExpTransform()
    y = plain(x)
    assert plain(x) is not y and plain.inv(y) is not x  # cache_size 0 recomputes
    assert plain.with_cache(1)._cache_size == 1 and plain.with_cache(0) is plain
    # a non-invertible transform known only through its cache: the inverse of its last output is exact
    tanh = T.TanhTransform(cache_size=1)
    big = kiln.tensor([30.0], dtype=F64)
    assert tanh.inv(tanh(big)) is big
    # the composite shares its parts' caches
    comp = T.ComposeTransform([T.ExpTransform(), T.AffineTransform(1.0, 2.0)], cache_size=1)
    y = comp(x)
    assert comp.inv(y) is x
    assert all(p._cache_size == 1 for p in comp.parts)
    with pytest.raises(ValueError, match="cache_size must be 0 or 1"):
        T.ExpTransform(cache_size=2)
    with pytest.raises(ValueError, match="cache_size must be 0 or 1"):
        T.AffineTransform(0.0, 1.0, cache_size=5)


def test_transform_argument_errors():
    T = KD.transforms
    with pytest.raises(TypeError, match="AffineTransform: loc must be a number or a kiln.Tensor"):
        T.AffineTransform("a", 1.0)
    with pytest.raises(ValueError, match="ReshapeTransform: in_shape \\(2, 3\\) and out_shape \\(4,\\)"):
        T.ReshapeTransform((2, 3), (4,))
    with pytest.raises(TypeError, match="ComposeTransform: parts\\[1\\] must be a Transform"):
        T.ComposeTransform([T.ExpTransform(), 3])
    with pytest.raises(ValueError, match="shape mismatch"):
        T.ReshapeTransform((2, 3), (6,)).forward_shape((4, 3))
    with pytest.raises(ValueError, match="CatTransform: x has size 2 in dim 0, expected 3"):
        T.CatTransform([T.ExpTransform(), T.ExpTransform()], lengths=[1, 2])(kiln.zeros(2, dtype=F64))
    with pytest.raises(NotImplementedError, match="AbsTransform does not implement log_abs_det_jacobian"):
        T.AbsTransform().log_abs_det_jacobian(kiln.zeros(2), kiln.zeros(2))
    with pytest.raises(ValueError, match="TransformedDistribution: transforms\\[0\\] must be a Transform"):
        KD.TransformedDistribution(KD.Normal(0.0, 1.0), [lambda x: x])
    with pytest.raises(TypeError, match="base_distribution must be a kiln.distributions.Distribution"):
        KD.TransformedDistribution(TD.Normal(0.0, 1.0), [T.ExpTransform()])


def test_numpy_integer_ndims_accepted():
    # event_dim / reinterpreted_batch_ndims accept any operator.index()-able int (numpy's), not bools
    T = KD.transforms
    kx, tx = pair(REAL)
    for n in (np.int64(1), np.int32(1)):
        k, t = T.IndependentTransform(T.ExpTransform(), n), TT.IndependentTransform(TT.ExpTransform(), 1)
        assert type(k.reinterpreted_batch_ndims) is int and k.domain.event_dim == 1
        same(k.log_abs_det_jacobian(kx, k(kx)), t.log_abs_det_jacobian(tx, t(tx)))
        k, t = T.AffineTransform(0.5, 2.0, event_dim=n), TT.AffineTransform(0.5, 2.0, event_dim=1)
        assert type(k.event_dim) is int and k.codomain.event_dim == 1
        same(k.log_abs_det_jacobian(kx, k(kx)), t.log_abs_det_jacobian(tx, t(tx)))
        assert KD.constraints.independent(KD.constraints.real, n).event_dim == 1
        ki = KD.Independent(KD.Normal(kiln.zeros(4, 3, dtype=F64), 1.0), n)
        assert ki.event_shape == (3,) and ki.support.event_dim == 1
    for bad, match in ((True, "got bool True"), (1.0, "got float 1.0"), (-1, "got -1"), (np.int64(-2), "got -2")):
        with pytest.raises(ValueError, match="IndependentTransform: reinterpreted_batch_ndims must be an int >= 0, "
                                             + match):
            T.IndependentTransform(T.ExpTransform(), bad)
        with pytest.raises(ValueError, match="AffineTransform: event_dim must be an int >= 0, " + match):
            T.AffineTransform(0.0, 1.0, event_dim=bad)
        with pytest.raises(ValueError, match="independent: reinterpreted_batch_ndims must be an int >= 0, " + match):
            KD.constraints.independent(KD.constraints.real, bad)
        with pytest.raises(ValueError, match="Independent: reinterpreted_batch_ndims must be an int >= 0, " + match):
            KD.Independent(KD.Normal(kiln.zeros(4, 3, dtype=F64), 1.0), bad)


# ------------------------------------------------------------------------------------- biject_to
def _constraints(C):
    return [C.real, C.positive, C.nonnegative, C.greater_than(1.5), C.greater_than_eq(-1.0), C.less_than(-2.0),
            C.interval(-1.0, 3.0), C.unit_interval, C.half_open_interval(0.5, 2.0), C.simplex,
            C.independent(C.positive, 1), C.real_vector, C.cat([C.positive, C.real, C.unit_interval], 1, [1, 1, 2]),
            C.stack([C.positive, C.interval(0.0, 2.0), C.real, C.unit_interval], 1)]


@pytest.mark.parametrize("registry", ["biject_to", "transform_to"])
@pytest.mark.parametrize("i", range(14))
def test_biject_to_and_transform_to_round_trips(registry, i):
    kc, tc = _constraints(KD.constraints)[i], _constraints(TD.constraints)[i]
    kt, tt = getattr(KD, registry)(kc), getattr(TD, registry)(tc)
    assert repr(kt) == repr(tt)
    x = RNG.normal(size=(3, 4))
    kx, tx = pair(x, grad=True)
    ky, ty = kt(kx), tt(tx)
    same(ky, ty)
    assert bool(kc.check(ky).all())
    if kt.bijective:
        same(kt.inv(ky), kx, 1e-8)  # the round trip
        kj, tj = kt.log_abs_det_jacobian(kx, ky), tt.log_abs_det_jacobian(tx, ty)
        same(kj, tj)
        (ky.sum() + kj.sum()).backward()
        (ty.sum() + tj.sum()).backward()
        same(kx.grad, tx.grad, 1e-8)


def test_biject_to_unregistered_and_register():
    with pytest.raises(NotImplementedError, match="Cannot transform _Boolean constraints"):
        KD.biject_to(KD.constraints.boolean)
    reg = KD.constraint_registry.ConstraintRegistry()
    reg.register(KD.constraints.positive, lambda c: KD.transforms.ExpTransform())
    assert reg(KD.constraints.greater_than(3.0)) == KD.transforms.ExpTransform()
    with pytest.raises(TypeError, match="constraint must be a Constraint subclass or instance"):
        reg.register(3, lambda c: None)


# -------------------------------------------------------------------------- TransformedDistribution
def test_transformed_distribution_matches_torch():
    kl, tl = pair(RNG.normal(size=(2, 3)), grad=True)
    ks, ts = pair(RNG.uniform(0.5, 1.5, (3,)), grad=True)
    kd = KD.TransformedDistribution(KD.Normal(kl, ks), [KD.transforms.ExpTransform(),
                                                         KD.transforms.AffineTransform(1.0, -2.0)])
    td = TD.TransformedDistribution(TD.Normal(tl, ts), [TT.ExpTransform(), TT.AffineTransform(1.0, -2.0)])
    assert kd.batch_shape == tuple(td.batch_shape) == (2, 3) and kd.event_shape == ()
    assert repr(kd.support) == repr(td.support) and kd.has_rsample
    kv, tv = pair(1.0 - 2.0 * RNG.uniform(0.2, 3.0, (4, 2, 3)))
    same(kd.log_prob(kv), td.log_prob(tv))
    same(kd.cdf(kv), td.cdf(tv))  # the decreasing affine part flips the cdf
    kq, tq = pair(RNG.uniform(0.05, 0.95, (4, 2, 3)))
    same(kd.icdf(kq), td.icdf(tq), 1e-8)
    (kd.log_prob(kv).sum() + kd.cdf(kv).sum()).backward()
    (td.log_prob(tv).sum() + td.cdf(tv).sum()).backward()
    same(kl.grad, tl.grad, 1e-8)
    same(ks.grad, ts.grad, 1e-8)
    assert kd.sample((5,)).shape == (5, 2, 3) and not kd.sample().requires_grad
    e = kd.expand((4, 2, 3))
    te = td.expand((4, 2, 3))
    assert e.batch_shape == tuple(te.batch_shape) and e.base_dist.batch_shape == tuple(te.base_dist.batch_shape)
    same(e.log_prob(kv), te.log_prob(tv))


def test_transformed_distribution_shapes():
    T = KD.transforms
    # a vector transform over a scalar base: the base's rightmost batch dim becomes an event dim
    k = KD.TransformedDistribution(KD.Normal(kiln.zeros(2, 3, dtype=F64), 1.0), T.StickBreakingTransform())
    t = TD.TransformedDistribution(TD.Normal(torch.zeros(2, 3, dtype=torch.float64), 1.0), TT.StickBreakingTransform())
    assert (k.batch_shape, k.event_shape) == (tuple(t.batch_shape), tuple(t.event_shape)) == ((2,), (4,))
    assert type(k.base_dist) is KD.Independent and repr(k.support) == repr(t.support)
    assert k.sample((5,)).shape == (5, 2, 4)
    # reshape: event (6,) -> (2, 3)
    base = KD.Independent(KD.Normal(kiln.zeros(4, 6, dtype=F64), 1.0), 1)
    tbase = TD.Independent(TD.Normal(torch.zeros(4, 6, dtype=torch.float64), 1.0), 1)
    k = KD.TransformedDistribution(base, T.ReshapeTransform((6,), (2, 3)))
    t = TD.TransformedDistribution(tbase, TT.ReshapeTransform((6,), (2, 3)))
    assert (k.batch_shape, k.event_shape) == (tuple(t.batch_shape), tuple(t.event_shape)) == ((4,), (2, 3))
    v = RNG.normal(size=(4, 2, 3))
    same(k.log_prob(pair(v)[0]), t.log_prob(pair(v)[1]))
    # a transform whose parameters broadcast the base (AffineTransform with a (5, 1) scale)
    sc = RNG.uniform(0.5, 2, (5, 1))
    k = KD.TransformedDistribution(KD.Normal(kiln.zeros(3, dtype=F64), 1.0), T.AffineTransform(0.0, pair(sc)[0]))
    t = TD.TransformedDistribution(TD.Normal(torch.zeros(3, dtype=torch.float64), 1.0),
                                   TT.AffineTransform(0.0, pair(sc)[1]))
    assert k.batch_shape == tuple(t.batch_shape) == (5, 3) and k.base_dist.batch_shape == (5, 3)
    with pytest.raises(ValueError, match="base_distribution needs a shape of at least 1 dims"):
        KD.TransformedDistribution(KD.Normal(0.0, 1.0), T.StickBreakingTransform())
    with pytest.raises(ValueError, match="The right-most size of value must match event_shape"):
        KD.TransformedDistribution(KD.Normal(kiln.zeros(2, 3, dtype=F64), 1.0),
                                   T.StickBreakingTransform()).log_prob(kiln.zeros(2, 3, dtype=F64))


# ---------------------------------------------------------------------------- the new distributions
A = RNG.uniform(0.5, 2.0, size=(2, 1))
B = RNG.uniform(0.7, 3.0, size=(3,))
NEW = {  # name: (parameters, values inside the support, shape (4, 2, 3))
    "HalfNormal": ((B,), RNG.uniform(0.0, 3.0, (4, 2, 3))),
    "HalfCauchy": ((B,), RNG.uniform(0.0, 5.0, (4, 2, 3))),
    "Pareto": ((A, B + 1.5), 2.0 + RNG.uniform(0.0, 3.0, (4, 2, 3))),
    "Weibull": ((A, B), RNG.uniform(0.05, 3.0, (4, 2, 3))),
}


def make(name, params, grad=False, **kw):
    ks, ts = zip(*[pair(p, grad) for p in params])
    return getattr(KD, name)(*ks, **kw), getattr(TD, name)(*ts, **kw), ks, ts


@pytest.mark.parametrize("name", sorted(NEW))
def test_new_distributions_values_and_gradients(name):
    params, values = NEW[name]
    kd, td, ks, ts = make(name, params, grad=True)
    batch = tuple(td.batch_shape)
    assert kd.batch_shape == batch and kd.event_shape == () and kd.has_rsample
    kv, tv = pair(values[:, 0] if len(batch) == 1 else values)
    same(kd.log_prob(kv), td.log_prob(tv))
    same(kd.cdf(kv), td.cdf(tv))
    kq, tq = pair(RNG.uniform(0.05, 0.95, tuple(tv.shape)))
    same(kd.icdf(kq), td.icdf(tq), 1e-8)
    same(kd.entropy(), td.entropy())
    for prop in ("mode", "stddev", "variance", "mean"):
        same(getattr(kd, prop), getattr(td, prop).expand(td.batch_shape))
    for fn in (lambda d, v: d.log_prob(v), lambda d, v: d.cdf(v), lambda d, v: d.entropy() * v.mean()):
        kd, td, ks, ts = make(name, params, grad=True)
        (fn(kd, kv) * kv).sum().backward()
        (fn(td, tv) * tv).sum().backward()
        for k, t in zip(ks, ts):
            same(k.grad, t.grad, 1e-8)
    # rsample: x moves with the parameters so that F(x) stays fixed: dx/dtheta = -dF/dtheta / f(x)
    kd, td, ks, ts = make(name, params, grad=True)
    kiln.manual_seed(3)
    x = kd.rsample((50,))
    assert x.shape == (50,) + batch and x.requires_grad and not kd.sample((2,)).requires_grad
    assert bool(kd.support.check(x).all())
    x.sum().backward()
    tx = torch.tensor(x.detach().numpy())
    density = td.log_prob(tx).exp().detach()
    (-(td.cdf(tx) / density).sum()).backward()
    for k, t in zip(ks, ts):
        same(k.grad, t.grad, 1e-6)
    # expand
    kd, td, _, _ = make(name, params)
    ke, te = kd.expand((5,) + batch), td.expand((5,) + batch)
    assert type(ke) is type(kd) and ke.batch_shape == tuple(te.batch_shape)
    kv5, tv5 = pair(np.broadcast_to(kv.numpy()[0], (5,) + batch))
    same(ke.log_prob(kv5), te.log_prob(tv5))
    same(ke.entropy(), te.entropy())


@pytest.mark.parametrize("name", sorted(NEW) + ["ContinuousBernoulli"])
def test_sample_statistics_and_seed(name):
    """The empirical cdf of many draws at torch's 10%, 50% and 90% quantiles (each batch member's own):
    within 0.015 of the level, which a wrong sampling formula misses."""
    if name == "ContinuousBernoulli":
        kd, td = KD.ContinuousBernoulli(pair(CB_PROBS)[0]), TD.ContinuousBernoulli(pair(CB_PROBS)[1])
    else:
        kd, td, _, _ = make(name, NEW[name][0])
    kiln.manual_seed(7)
    x = kd.sample((20000,))
    assert x.shape == (20000,) + tuple(td.batch_shape) and not x.requires_grad
    xn = x.numpy()
    for level in (0.1, 0.5, 0.9):
        q = td.icdf(torch.full(tuple(td.batch_shape), level, dtype=torch.float64)).numpy()
        frac = (xn <= q).mean(0)
        assert np.abs(frac - level).max() < 0.015, (level, frac)
    kiln.manual_seed(7)
    assert np.array_equal(kd.sample((20000,)).numpy(), xn)


class _MyHalfNormal(KD.HalfNormal):
    def __init__(self, scale):
        super().__init__(scale)


def test_subclass_with_its_own_init_must_define_expand():
    with pytest.raises(NotImplementedError, match="must also define a custom .expand"):
        _MyHalfNormal(1.0).expand((2,))
    assert type(KD.HalfCauchy(kiln.ones(3, dtype=F64)).expand((2, 3))) is KD.HalfCauchy


def test_weibull_mean_and_variance_with_a_number_concentration():
    ks, ts = pair(B, grad=True)
    kd, td = KD.Weibull(ks, 1.7), TD.Weibull(ts, 1.7)
    same(kd.mean, td.mean)
    same(kd.variance, td.variance)
    same(kd.stddev, td.stddev)
    kd.mean.sum().backward()
    td.mean.sum().backward()
    same(ks.grad, ts.grad)
    same(kd.expand((2, 3)).variance, td.expand((2, 3)).variance)


def test_new_distributions_number_parameters():
    for name, params in (("HalfNormal", (2.0,)), ("HalfCauchy", (0.5,)), ("Pareto", (1.0, 3.0)),
                         ("Weibull", (2.0, 0.7))):
        kd, td = getattr(KD, name)(*params), getattr(TD, name)(*params)
        assert kd.batch_shape == tuple(td.batch_shape) == ()
        assert kd.sample().shape == () and kd.rsample((3,)).shape == (3,)
        assert kd.sample().dtype == kiln.float32


@pytest.mark.parametrize("shape", [(3,), (2, 3)])
def test_logistic_normal(shape):
    kl, tl = pair(RNG.normal(size=shape), grad=True)
    ks, ts = pair(RNG.uniform(0.5, 1.5, shape), grad=True)
    kd, td = KD.LogisticNormal(kl, ks), TD.LogisticNormal(tl, ts)
    assert (kd.batch_shape, kd.event_shape) == (tuple(td.batch_shape), tuple(td.event_shape))
    assert repr(kd.support) == repr(td.support) == "Simplex()"
    v = RNG.dirichlet(np.ones(shape[-1] + 1), size=(4,) + shape[:-1])
    kv, tv = pair(v)
    same(kd.log_prob(kv), td.log_prob(tv))
    kd.log_prob(kv).sum().backward()
    td.log_prob(tv).sum().backward()
    same(kl.grad, tl.grad, 1e-8)
    same(ks.grad, ts.grad, 1e-8)
    # rsample: the sample's base noise, recovered through the inverse, fed to torch's transform
    kd, td = KD.LogisticNormal(kl, ks), TD.LogisticNormal(tl, ts)
    kl.grad = ks.grad = tl.grad = ts.grad = None
    kiln.manual_seed(4)
    y = kd.rsample((6,))
    assert y.shape == (6,) + tuple(td.batch_shape) + tuple(td.event_shape)
    assert np.allclose(y.detach().numpy().sum(-1), 1.0) and bool(kd.support.check(y).all())
    w = RNG.normal(size=tuple(y.shape))
    (y * pair(w)[0]).sum().backward()
    z = TT.StickBreakingTransform().inv(torch.tensor(y.detach().numpy()))
    noise = (z - tl.detach()) / ts.detach()
    ty = TT.StickBreakingTransform()(tl + ts * noise)
    (ty * pair(w)[1]).sum().backward()
    same(kl.grad, tl.grad, 1e-7)
    same(ks.grad, ts.grad, 1e-7)
    assert KD.LogisticNormal(0.0, 1.0).event_shape == tuple(TD.LogisticNormal(0.0, 1.0).event_shape) == (2,)
    same(KD.LogisticNormal(kl, ks).expand((5,) + kd.batch_shape).log_prob(kv[:1]),
         TD.LogisticNormal(tl, ts).expand((5,) + td.batch_shape).log_prob(tv[:1]))
    # no entropy, mean, mode, variance, cdf or icdf: NotImplementedError, as torch's, with a message
    for name, match in (("entropy", "LogisticNormal has no entropy"), ("mean", "LogisticNormal'> does not implement"),
                        ("mode", "does not implement mode"), ("variance", "does not implement variance"),
                        ("cdf", "LogisticNormal has no cdf"), ("icdf", "LogisticNormal has no icdf")):
        with pytest.raises(NotImplementedError):
            getattr(td, name)() if name == "entropy" else (
                getattr(td, name)(tv) if name in ("cdf", "icdf") else getattr(td, name))
        with pytest.raises(NotImplementedError, match=match):
            getattr(kd, name)() if name == "entropy" else (
                getattr(kd, name)(kv) if name in ("cdf", "icdf") else getattr(kd, name))


CB_PROBS = np.array([[0.02, 0.3, 0.4995, 0.5, 0.5007, 0.93]])  # inside and outside lims of 1/2


@pytest.mark.parametrize("by", ["probs", "logits"])
def test_continuous_bernoulli(by):
    param = CB_PROBS if by == "probs" else np.log(CB_PROBS) - np.log1p(-CB_PROBS)
    kp, tp = pair(param, grad=True)
    kd, td = KD.ContinuousBernoulli(**{by: kp}), TD.ContinuousBernoulli(**{by: tp})
    assert kd.batch_shape == tuple(td.batch_shape) == (1, 6)
    kv, tv = pair(RNG.uniform(0.0, 1.0, (4, 1, 6)))
    same(kd.log_prob(kv), td.log_prob(tv))
    same(kd.cdf(kv), td.cdf(tv))
    kq, tq = pair(RNG.uniform(0.01, 0.99, (4, 1, 6)))
    same(kd.icdf(kq), td.icdf(tq))
    same(kd.entropy(), td.entropy())
    for prop in ("mean", "variance", "stddev", "probs", "logits"):
        same(getattr(kd, prop), getattr(td, prop))
    (kd.log_prob(kv).sum() + kd.cdf(kv).sum() + kd.entropy().sum() + kd.icdf(kq).sum() + kd.mean.sum()
     + kd.variance.sum()).backward()
    (td.log_prob(tv).sum() + td.cdf(tv).sum() + td.entropy().sum() + td.icdf(tq).sum() + td.mean.sum()
     + td.variance.sum()).backward()
    same(kp.grad, tp.grad, 1e-7)
    kiln.manual_seed(5)
    x = kd.rsample((7,))
    assert x.shape == (7, 1, 6) and x.requires_grad and bool(kd.support.check(x).all())
    e, te = kd.expand((3, 6)), td.expand((3, 6))
    assert e.batch_shape == tuple(te.batch_shape)
    same(e.log_prob(kv[0]), te.log_prob(tv[0]))
    assert KD.ContinuousBernoulli(0.3).batch_shape == () and KD.ContinuousBernoulli(0.3).sample().shape == ()
    # wide lims: the Taylor expansions' higher terms matter (with the default lims they are below 1e-12)
    kd = KD.ContinuousBernoulli(**{by: kp}, lims=(0.25, 0.75))
    td = TD.ContinuousBernoulli(**{by: tp}, lims=(0.25, 0.75))
    for k, t in ((kd.log_prob(kv), td.log_prob(tv)), (kd.mean, td.mean), (kd.variance, td.variance),
                 (kd.entropy(), td.entropy()), (kd.cdf(kv), td.cdf(tv)), (kd.icdf(kq), td.icdf(tq))):
        same(k, t)


# ------------------------------------------------------------------------------------------------ KL
def _dist(M, name, params):
    kind = kiln if M is KD else torch
    ts = [kind.tensor(np.asarray(p, dtype=np.float64), dtype=kiln.float64 if M is KD else torch.float64,
                      requires_grad=True) for p in params]
    if name == "ContinuousBernoulli":
        return M.ContinuousBernoulli(probs=ts[0]), ts
    return getattr(M, name)(*ts), ts


LOCS, SCALES = RNG.normal(size=(3,)), RNG.uniform(0.5, 2.0, (3,))
KL_PARAMS = {
    "Normal": (LOCS, SCALES), "Laplace": (LOCS[::-1].copy(), SCALES[::-1].copy()), "Gumbel": (LOCS * 0.5, SCALES + 0.3),
    "Cauchy": (LOCS + 1, SCALES), "LogNormal": (LOCS, SCALES),
    "Exponential": (SCALES,), "HalfNormal": (SCALES,), "Geometric": (np.array([0.2, 0.5, 0.7]),),
    "ContinuousBernoulli": (np.array([0.2, 0.4996, 0.8]),),
    "Uniform": (np.array([0.1, 1.2, 0.3]), np.array([0.9, 2.5, 0.7])),
    "Pareto": (np.array([0.5, 1.5, 1.0]), np.array([2.5, 3.5, 0.8])),
}
KL_PAIRS = [("ContinuousBernoulli", "ContinuousBernoulli"), ("Geometric", "Geometric"), ("HalfNormal", "HalfNormal"),
            ("LogNormal", "LogNormal"), ("Pareto", "Pareto"), ("Cauchy", "Cauchy"),
            ("ContinuousBernoulli", "Pareto"), ("ContinuousBernoulli", "Exponential"),
            ("ContinuousBernoulli", "Normal"), ("ContinuousBernoulli", "Uniform"),
            ("Exponential", "ContinuousBernoulli"),
            ("Exponential", "Pareto"), ("Exponential", "Uniform"), ("Exponential", "Gumbel"), ("Exponential", "Normal"),
            ("Gumbel", "ContinuousBernoulli"), ("Gumbel", "Exponential"), ("Gumbel", "Pareto"), ("Gumbel", "Uniform"),
            ("Gumbel", "Normal"), ("Laplace", "ContinuousBernoulli"), ("Laplace", "Exponential"), ("Laplace", "Pareto"),
            ("Laplace", "Uniform"), ("Laplace", "Normal"), ("Normal", "ContinuousBernoulli"), ("Normal", "Exponential"),
            ("Normal", "Pareto"), ("Normal", "Uniform"), ("Normal", "Gumbel"), ("Normal", "Laplace"),
            ("Pareto", "ContinuousBernoulli"), ("Pareto", "Uniform"), ("Pareto", "Exponential"), ("Pareto", "Normal"),
            ("Uniform", "ContinuousBernoulli"), ("Uniform", "Exponential"), ("Uniform", "Gumbel"),
            ("Uniform", "Normal"), ("Uniform", "Pareto")]


@pytest.mark.parametrize("case", KL_PAIRS, ids=lambda c: f"{c[0]}-{c[1]}")
def test_kl_pairs(case):
    p_name, q_name = case
    q_params = KL_PARAMS[q_name]
    if p_name == q_name:  # a second distribution of the same family
        q_params = tuple(np.roll(a, 1) for a in q_params)
    kp, kpp = _dist(KD, p_name, KL_PARAMS[p_name])
    kq, kqp = _dist(KD, q_name, q_params)
    tp, tpp = _dist(TD, p_name, KL_PARAMS[p_name])
    tq, tqp = _dist(TD, q_name, q_params)
    k, t = KD.kl_divergence(kp, kq), TD.kl_divergence(tp, tq)
    same(k, t)
    if not t.requires_grad:  # an infinite KL (q gives zero density where p has mass): a constant
        assert not k.requires_grad and bool(kiln.isinf(k).all())
        return
    finite = torch.isfinite(t.detach())
    w = np.where(finite.numpy(), RNG.normal(size=tuple(t.shape)), 0.0)
    (k * pair(w)[0]).sum().backward()
    (torch.where(finite, t, 0.0) * pair(w)[1]).sum().backward()
    for a, b in zip(kpp + kqp, tpp + tqp):
        if b.grad is None:
            assert a.grad is None or not np.any(a.grad.numpy())
        else:
            same(a.grad, b.grad, 1e-7)


def test_kl_transformed_distributions_and_gumbel_left_out():
    base = [KD.Normal(kiln.tensor(LOCS, dtype=F64), kiln.tensor(SCALES, dtype=F64)), KD.Normal(0.5, 2.0)]
    tbase = [TD.Normal(torch.tensor(LOCS), torch.tensor(SCALES)), TD.Normal(0.5, 2.0)]
    kt = [KD.TransformedDistribution(b, [KD.transforms.ExpTransform()]) for b in base]
    tt = [TD.TransformedDistribution(b, [TT.ExpTransform()]) for b in tbase]
    same(KD.kl_divergence(*kt), TD.kl_divergence(*tt))
    other = KD.TransformedDistribution(base[1], [KD.transforms.TanhTransform()])
    with pytest.raises(NotImplementedError, match="needs equal transforms"):
        KD.kl_divergence(kt[0], other)
    # kiln's LogNormal is written directly (not a TransformedDistribution), but pairs with exp of a Normal
    # as torch's LogNormal does: the Normals' KL, with gradients
    kb, tb = zip(pair(LOCS, True), pair(SCALES, True))  # (kiln loc, kiln scale), (torch loc, torch scale)
    kq, tq = KD.LogNormal(0.3, 1.5), TD.LogNormal(0.3, 1.5)
    kexp = KD.TransformedDistribution(KD.Normal(kb[0], kb[1]), [KD.transforms.ExpTransform()])
    texp = TD.TransformedDistribution(TD.Normal(tb[0], tb[1]), [TT.ExpTransform()])
    w = RNG.normal(size=(3,))
    for k, t in ((KD.kl_divergence(kexp, kq), TD.kl_divergence(texp, tq)),
                 (KD.kl_divergence(kq, kexp), TD.kl_divergence(tq, texp))):
        same(k, t)
        (k * pair(w)[0]).sum().backward()
        (t * pair(w)[1]).sum().backward()
    same(kb[0].grad, tb[0].grad)
    same(kb[1].grad, tb[1].grad)
    with pytest.raises(NotImplementedError, match="needs equal transforms"):
        KD.kl_divergence(kq, other)
    with pytest.raises(NotImplementedError, match="needs equal transforms"):
        KD.kl_divergence(KD.HalfNormal(1.0), kq)


# --------------------------------------------------------------------------------------- validation
@pytest.mark.parametrize("case", [
    (lambda M: M.HalfNormal(-1.0), "Expected parameter scale"),
    (lambda M: M.HalfCauchy(0.0), "Expected parameter scale"),
    (lambda M: M.Pareto(1.0, -2.0), "Expected parameter rate"),  # the base Exponential checks first, as in torch
    (lambda M: M.Pareto(-1.0, 2.0), "Expected parameter scale"),
    (lambda M: M.Weibull(-1.0, 2.0), "Expected parameter scale"),
    (lambda M: M.LogisticNormal(0.0, -1.0), "Expected parameter scale"),
    (lambda M: M.HalfNormal(1.0).log_prob(M is KD and kiln.tensor([-1.0]) or torch.tensor([-1.0])),
     "Expected value argument"),
    (lambda M: M.Pareto(2.0, 1.0).log_prob(M is KD and kiln.tensor([1.0]) or torch.tensor([1.0])),
     "Expected value argument"),
    (lambda M: M.ContinuousBernoulli(logits=0.3).log_prob(M is KD and kiln.tensor([1.5]) or torch.tensor([1.5])),
     "Expected value argument"),
])
def test_validate_args_errors(case):
    fn, match = case
    with pytest.raises(ValueError, match=match):
        fn(TD)
    with pytest.raises(ValueError, match=match):
        fn(KD)


def test_continuous_bernoulli_probs_checked_before_the_clamp():
    with pytest.raises(ValueError, match="ContinuousBernoulli: parameter probs .* must lie in \\[0, 1\\]"):
        KD.ContinuousBernoulli(probs=kiln.tensor([0.5, 1.5], dtype=F64))
    KD.ContinuousBernoulli(probs=kiln.tensor([0.5, 1.5], dtype=F64), validate_args=False)  # off: clamped


def test_import_path():
    import kiln.distributions.transforms as T
    from kiln.distributions import biject_to, constraint_registry, transform_to  # noqa: F401
    assert T.ExpTransform is KD.ExpTransform and KD.transforms is T
    for name in ("Transform", "ComposeTransform", "ExpTransform", "AffineTransform", "SigmoidTransform",
                 "TanhTransform", "SoftmaxTransform", "StickBreakingTransform", "PowerTransform", "AbsTransform",
                 "ReshapeTransform", "IndependentTransform", "CatTransform", "StackTransform", "SoftplusTransform"):
        assert hasattr(T, name) and hasattr(TT, name)
