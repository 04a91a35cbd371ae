"""The gamma family: Gamma, Chi2, Beta, Dirichlet, StudentT, with torch's formulas written in Kiln's ops
(lgamma, digamma), so log_prob, entropy, mean and variance differentiate through kiln's autograd.

Sampling: standard gamma variates by Marsaglia and Tsang's rejection method on Kiln's random stream
(kiln.manual_seed), a concentration below 1 boosted (Gamma(a + 1) * U ** (1 / a)). rsample's gradient
with respect to rate (and scale-like parameters) is exact (sample = standard_gamma / rate); with respect
to concentration it is the implicit reparameterisation gradient dx/da = -(dF(x; a)/da) / f(x; a), as
torch's _standard_gamma_grad, with dF/da summed from the series of the regularised lower incomplete gamma
function F (float64, on the host, to convergence of each entry). Beta and Dirichlet samples are
normalised gammas, so their rsample gradients follow; StudentT's go through Chi2's."""
import math

import numpy as np

from .. import _C
from .._math import xlogy
from .._tensor import no_grad
from . import constraints
from .distribution import Distribution
from .utils import broadcast_all, eps, tiny

__all__ = ["Gamma", "Chi2", "Beta", "Dirichlet", "StudentT"]


def _is_number(x):
    return not isinstance(x, _C.Tensor)


def _marsaglia_tsang(alpha):
    """Standard gamma variates of shape alpha.shape (alpha > 0, no gradient), from Kiln's random stream."""
    with no_grad():
        boost = alpha < 1
        a = _C.where(boost, alpha + 1, alpha)
        # NaN, nonpositive or infinite concentrations (validate_args=False) would never be accepted:
        # their draws are NaN
        bad = ~((alpha > 0) & (alpha < float("inf")))
        a = _C.where(bad, _C.ones_like(alpha), a)
        d = a - 1.0 / 3.0
        c = (9 * d).rsqrt()
        out = _C.full_like(alpha, float("nan"))
        done = bad
        if alpha.numel() == 0:
            return out
        while True:
            x = _C.randn(tuple(alpha.shape), dtype=alpha.dtype, device=alpha.device)
            u = _C.rand(tuple(alpha.shape), dtype=alpha.dtype, device=alpha.device)
            v = (1 + c * x) ** 3
            vpos = v > 0
            vsafe = _C.where(vpos, v, _C.ones_like(v))
            accept = vpos & (_C.log(u) < 0.5 * x * x + d - d * vsafe + d * _C.log(vsafe)) & ~done
            out = _C.where(accept, d * vsafe, out)
            done = done | accept
            if bool(done.all()):
                break
        u = _C.clamp(_C.rand(tuple(alpha.shape), dtype=alpha.dtype, device=alpha.device), min=tiny(alpha.dtype))
        scale = _C.where(boost, u ** alpha.reciprocal(), _C.ones_like(alpha))
        return _C.clamp(out * scale, min=tiny(alpha.dtype))  # NaN stays NaN


def _gamma_cdf_grad_alpha(x, a):
    """d/da of the regularised lower incomplete gamma P(a, x), elementwise (numpy float64 arrays), from
    P(a, x) = sum_n exp((a + n) log x - x - lgamma(a + n + 1)), each term's derivative the term times
    (log x - digamma(a + n + 1)); terms in log space (no underflow for large x), summed until every entry's
    terms past their peak (a + n > x: decreasing from there) fall below 1e-17 of its running sum."""
    with no_grad():
        at = _C.from_numpy(np.ascontiguousarray(a))
        lg = _C.lgamma(at + 1).numpy()
        psi = _C.digamma(at + 1).numpy()
    logx = np.log(x)
    logt = a * logx - x - lg
    total = np.zeros_like(x)
    absum = np.zeros_like(x)
    n = 0
    active = np.ones(x.shape, dtype=bool)
    while active.any():
        t = np.exp(logt)
        term = t * (logx - psi)
        total = np.where(active, total + term, total)
        absum = np.where(active, absum + np.abs(term) + t, absum)
        k = a + n + 1
        logt = logt + logx - np.log(k)
        psi = psi + 1.0 / k
        n += 1
        active = active & ~((a + n > x) & (np.abs(np.exp(logt)) * (np.abs(logx - psi) + 1) <= 1e-17 * absum))
    return total


def _standard_gamma_grad(x, alpha):
    """dx/dalpha of a standard gamma variate x of concentration alpha at fixed CDF value (tensors, no
    gradient): -(dP(alpha, x)/dalpha) / density(x; alpha)."""
    with no_grad():
        xn = np.ascontiguousarray(x.detach().to(_C.dtype.float64).cpu().numpy(), dtype=np.float64)
        an = np.ascontiguousarray(alpha.detach().to(_C.dtype.float64).cpu().numpy(), dtype=np.float64)
        an = np.broadcast_to(an, xn.shape).copy()
        lg = _C.lgamma(_C.from_numpy(an)).numpy()
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            log_density = (an - 1) * np.log(xn) - xn - lg
            dp = _gamma_cdf_grad_alpha(xn, an)
            grad = np.where(xn > 0, -dp / np.exp(log_density), 0.0)
        grad = np.nan_to_num(grad, nan=0.0, posinf=0.0, neginf=0.0)
        return _C.from_numpy(grad).to(x.dtype).to(x.device)


def _standard_gamma(alpha):
    """A standard gamma sample of concentration alpha (its shape), differentiable in alpha by implicit
    reparameterisation when alpha requires grad."""
    x = _marsaglia_tsang(alpha.detach())
    if not (alpha.requires_grad and _C.is_grad_enabled()):
        return x
    g = _standard_gamma_grad(x, alpha)
    return x + (alpha - alpha.detach()) * g  # the value x exactly; gradient g to alpha


class Gamma(Distribution):
    """Gamma(concentration, rate): density rate^a x^(a-1) exp(-rate x) / Gamma(a) on x > 0. rsample is
    differentiable in both parameters (module docstring); cdf and icdf are not provided (no incomplete
    gamma op)."""
    arg_constraints = {"concentration": constraints.positive, "rate": constraints.positive}
    support = constraints.nonnegative
    has_rsample = True

    def __init__(self, concentration, rate, validate_args=None):
        self.concentration, self.rate = broadcast_all(concentration, rate)
        shape = () if _is_number(concentration) and _is_number(rate) else tuple(self.concentration.shape)
        super().__init__(shape, validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(Gamma, _instance)
        batch_shape = tuple(batch_shape)
        new.concentration = self.concentration.expand(*batch_shape)
        new.rate = self.rate.expand(*batch_shape)
        Distribution.__init__(new, batch_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    @property
    def mean(self):
        return self.concentration / self.rate

    @property
    def mode(self):
        return _C.clamp((self.concentration - 1) / self.rate, min=0)

    @property
    def variance(self):
        return self.concentration / self.rate.pow(2)

    def rsample(self, sample_shape=()):
        shape = self._extended_shape(sample_shape)
        value = _standard_gamma(self.concentration.expand(*shape)) / self.rate.expand(*shape)
        # torch's clamp of the value (not of the gradient) away from 0
        return value + (_C.clamp(value.detach(), min=tiny(value.dtype)) - value.detach())

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        return (xlogy(self.concentration, self.rate) + xlogy(self.concentration - 1, value)
                - self.rate * value - _C.lgamma(self.concentration))

    def entropy(self):
        a = self.concentration
        return a - _C.log(self.rate) + _C.lgamma(a) + (1.0 - a) * _C.digamma(a)


class Chi2(Gamma):
    """Chi2(df): Gamma(df / 2, 1 / 2)."""
    arg_constraints = {"df": constraints.positive}

    def __init__(self, df, validate_args=None):
        (df_t,) = broadcast_all(df)
        Gamma.__init__(self, 0.5 * df_t, _C.full_like(df_t, 0.5), validate_args=validate_args)
        if _is_number(df):
            self._batch_shape = ()

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(Chi2, _instance)
        return super().expand(batch_shape, new)

    @property
    def df(self):
        return self.concentration * 2


class Dirichlet(Distribution):
    """Dirichlet(concentration): over the simplex of the last dim's K entries; concentration's last dim is
    the event (K >= 1), the rest the batch. rsample normalises K gammas (gradients to concentration by
    implicit reparameterisation)."""
    arg_constraints = {"concentration": constraints.independent(constraints.positive, 1)}
    support = constraints.simplex
    has_rsample = True

    def __init__(self, concentration, validate_args=None):
        if _is_number(concentration) or concentration.dim() < 1:
            raise ValueError("Dirichlet: `concentration` parameter must be at least one-dimensional, got "
                             f"{concentration!r}")
        self.concentration = concentration
        shape = tuple(concentration.shape)
        super().__init__(shape[:-1], shape[-1:], validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(Dirichlet, _instance)
        batch_shape = tuple(batch_shape)
        new.concentration = self.concentration.expand(*(batch_shape + self._event_shape))
        Distribution.__init__(new, batch_shape, self._event_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    def rsample(self, sample_shape=()):
        shape = self._extended_shape(sample_shape)
        g = _standard_gamma(self.concentration.expand(*shape))
        x = g / g.sum(-1, True)
        d = x.detach()
        return x + (_C.clamp(d, tiny(x.dtype), 1 - eps(x.dtype)) - d)

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        c = self.concentration
        return (xlogy(c - 1.0, value).sum(-1) + _C.lgamma(c.sum(-1)) - _C.lgamma(c).sum(-1))

    @property
    def mean(self):
        return self.concentration / self.concentration.sum(-1, True)

    @property
    def mode(self):
        cm1 = _C.clamp(self.concentration - 1, min=0)
        mode = cm1 / cm1.sum(-1, True)
        # every concentration below 1: torch puts the mode at the vertex of the largest one
        all_low = (self.concentration < 1).all(-1, True)
        idx = self.concentration.argmax(-1)
        vertex = _C.one_hot(idx, self._event_shape[0]).to(mode.dtype)
        return _C.where(all_low.expand(*mode.shape), vertex, mode)

    @property
    def variance(self):
        c0 = self.concentration.sum(-1, True)
        return self.concentration * (c0 - self.concentration) / (c0.pow(2) * (c0 + 1))

    def entropy(self):
        k = self.concentration.shape[-1]
        a0 = self.concentration.sum(-1)
        return (_C.lgamma(self.concentration).sum(-1) - _C.lgamma(a0) - (k - a0) * _C.digamma(a0)
                - ((self.concentration - 1.0) * _C.digamma(self.concentration)).sum(-1))


class Beta(Distribution):
    """Beta(concentration1, concentration0): density x^(c1-1) (1-x)^(c0-1) / B(c1, c0) on [0, 1]; a
    Dirichlet over (x, 1 - x)."""
    arg_constraints = {"concentration1": constraints.positive, "concentration0": constraints.positive}
    support = constraints.unit_interval
    has_rsample = True

    def __init__(self, concentration1, concentration0, validate_args=None):
        c1, c0 = broadcast_all(concentration1, concentration0)
        self._dirichlet = Dirichlet(_C.stack([c1, c0], -1), validate_args=validate_args)
        shape = () if _is_number(concentration1) and _is_number(concentration0) else tuple(c1.shape)
        super().__init__(shape, validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(Beta, _instance)
        batch_shape = tuple(batch_shape)
        new._dirichlet = self._dirichlet.expand(batch_shape)
        Distribution.__init__(new, batch_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    @property
    def concentration1(self):
        return self._dirichlet.concentration[..., 0]

    @property
    def concentration0(self):
        return self._dirichlet.concentration[..., 1]

    @property
    def mean(self):
        return self.concentration1 / (self.concentration1 + self.concentration0)

    @property
    def mode(self):
        return self._dirichlet.mode[..., 0]

    @property
    def variance(self):
        total = self.concentration1 + self.concentration0
        return self.concentration1 * self.concentration0 / (total.pow(2) * (total + 1))

    def rsample(self, sample_shape=()):
        return self._dirichlet.rsample(sample_shape)[..., 0]

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        heads_tails = _C.stack(list(broadcast_all(value, 1.0 - value)), -1)
        return self._dirichlet.log_prob(heads_tails)

    def entropy(self):
        return self._dirichlet.entropy()

    def __repr__(self):
        return f"Beta(concentration1: {tuple(self.concentration1.shape)}, concentration0: " \
               f"{tuple(self.concentration0.shape)})"


class StudentT(Distribution):
    """StudentT(df, loc=0, scale=1): loc + scale * X / sqrt(Z / df) for X ~ Normal(0, 1), Z ~ Chi2(df)."""
    arg_constraints = {"df": constraints.positive, "loc": constraints.real, "scale": constraints.positive}
    support = constraints.real
    has_rsample = True

    def __init__(self, df, loc=0.0, scale=1.0, validate_args=None):
        self.df, self.loc, self.scale = broadcast_all(df, loc, scale)
        self._chi2 = Chi2(self.df, validate_args=False)
        shape = () if all(_is_number(v) for v in (df, loc, scale)) else tuple(self.df.shape)
        super().__init__(shape, validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(StudentT, _instance)
        batch_shape = tuple(batch_shape)
        new.df = self.df.expand(*batch_shape)
        new.loc = self.loc.expand(*batch_shape)
        new.scale = self.scale.expand(*batch_shape)
        new._chi2 = self._chi2.expand(batch_shape)
        Distribution.__init__(new, batch_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    @property
    def mean(self):
        return _C.where(self.df > 1, self.loc, _C.full_like(self.loc, math.nan))

    @property
    def mode(self):
        return self.loc

    @property
    def variance(self):
        df = self.df
        v = self.scale.pow(2) * df / (df - 2)
        v = _C.where(df > 2, v, _C.full_like(v, math.inf))
        return _C.where(df > 1, v, _C.full_like(v, math.nan))

    def rsample(self, sample_shape=()):
        shape = self._extended_shape(sample_shape)
        x = _C.randn(shape, dtype=self.df.dtype, device=self.df.device)
        z = self._chi2.rsample(sample_shape)
        y = x * (self.df / z).sqrt()
        return self.loc + self.scale * y

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        y = (value - self.loc) / self.scale
        z = (_C.log(self.scale) + 0.5 * _C.log(self.df) + 0.5 * math.log(math.pi)
             + _C.lgamma(0.5 * self.df) - _C.lgamma(0.5 * (self.df + 1.0)))
        return -0.5 * (self.df + 1.0) * _C.log1p(y * y / self.df) - z

    def entropy(self):
        lbeta = _C.lgamma(0.5 * self.df) + math.lgamma(0.5) - _C.lgamma(0.5 * (self.df + 1))
        return (_C.log(self.scale) + 0.5 * (self.df + 1) * (_C.digamma(0.5 * (self.df + 1))
                                                            - _C.digamma(0.5 * self.df))
                + 0.5 * _C.log(self.df) + lbeta)
