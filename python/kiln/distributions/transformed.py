"""The distributions torch builds as TransformedDistribution: HalfNormal, HalfCauchy, Pareto, Weibull,
LogisticNormal, with torch's formulas in Kiln's ops (log_prob, cdf, icdf, entropy and rsample
differentiate through Kiln's autograd)."""
import math
import numbers

from .. import _C
from . import constraints
from .continuous import Cauchy, Exponential, Normal
from .transformed_distribution import TransformedDistribution
from .transforms import AbsTransform, AffineTransform, ExpTransform, PowerTransform, StickBreakingTransform
from .utils import broadcast_all, EULER_GAMMA

__all__ = ["HalfNormal", "HalfCauchy", "Pareto", "Weibull", "LogisticNormal"]


class _Half(TransformedDistribution):
    """|X| for X of a base symmetric about 0 (Normal, Cauchy) of the given scale."""
    arg_constraints = {"scale": constraints.positive}
    support = constraints.nonnegative
    has_rsample = True
    _base = None

    def __init__(self, scale, validate_args=None):
        super().__init__(self._base(0.0, scale, validate_args=False), AbsTransform(), validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(_Half, _instance)
        return super().expand(batch_shape, _instance=new)

    @property
    def scale(self):
        return self.base_dist.scale

    @property
    def mode(self):
        return _C.zeros_like(self.scale)

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        log_prob = self.base_dist.log_prob(value) + math.log(2)
        return _C.where(value >= 0, log_prob, _C.full_like(log_prob, -math.inf))

    def cdf(self, value):
        if self._validate_args:
            self._validate_sample(value)
        return 2 * self.base_dist.cdf(value) - 1

    def icdf(self, prob):
        return self.base_dist.icdf((prob + 1) / 2)

    def entropy(self):
        return self.base_dist.entropy() - math.log(2)


class HalfNormal(_Half):
    """HalfNormal(scale): |X| for X ~ Normal(0, scale)."""
    _base = Normal

    @property
    def mean(self):
        return self.scale * math.sqrt(2 / math.pi)

    @property
    def variance(self):
        return self.scale.pow(2) * (1 - 2 / math.pi)


class HalfCauchy(_Half):
    """HalfCauchy(scale): |X| for X ~ Cauchy(0, scale); mean and variance inf, as torch's."""
    _base = Cauchy

    @property
    def mean(self):
        return _C.full(self._extended_shape(), math.inf, dtype=self.scale.dtype, device=self.scale.device)

    @property
    def variance(self):
        return _C.full(self._extended_shape(), math.inf, dtype=self.scale.dtype, device=self.scale.device)


class Pareto(TransformedDistribution):
    """Pareto(scale, alpha): scale * exp(E) for E ~ Exponential(alpha); support [scale, inf)."""
    arg_constraints = {"alpha": constraints.positive, "scale": constraints.positive}

    def __init__(self, scale, alpha, validate_args=None):
        self.scale, self.alpha = broadcast_all(scale, alpha)
        super().__init__(Exponential(self.alpha, validate_args=validate_args),
                         [ExpTransform(), AffineTransform(loc=0, scale=self.scale)], validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(Pareto, _instance)
        batch_shape = tuple(batch_shape)
        new.scale = self.scale.expand(*batch_shape)
        new.alpha = self.alpha.expand(*batch_shape)
        return super().expand(batch_shape, _instance=new)

    @property
    def mean(self):
        a = (self.alpha).clamp_min(1)  # inf for alpha <= 1
        return a * self.scale / (a - 1)

    @property
    def mode(self):
        return self.scale

    @property
    def variance(self):
        a = (self.alpha).clamp_min(2)  # inf for alpha <= 2
        return self.scale.pow(2) * a / ((a - 1).pow(2) * (a - 2))

    @constraints.dependent_property(is_discrete=False, event_dim=0)
    def support(self):
        return constraints.greater_than_eq(self.scale)

    def entropy(self):
        return _C.log(self.scale / self.alpha) + (1 + self.alpha.reciprocal())


class Weibull(TransformedDistribution):
    """Weibull(scale, concentration): scale * E ** (1 / concentration) for E ~ Exponential(1).
    mean and variance are scale * Gamma(1 + n / concentration) terms, through the lgamma op (gradients
    to concentration included)."""
    arg_constraints = {"scale": constraints.positive, "concentration": constraints.positive}
    support = constraints.positive

    def __init__(self, scale, concentration, validate_args=None):
        self.scale, self.concentration = broadcast_all(scale, concentration)
        self._concentration_number = float(concentration) if isinstance(concentration, numbers.Number) else None
        self.concentration_reciprocal = self.concentration.reciprocal()
        base_dist = Exponential(_C.ones_like(self.scale), validate_args=validate_args)
        super().__init__(base_dist, [PowerTransform(exponent=self.concentration_reciprocal),
                                     AffineTransform(loc=0, scale=self.scale)], validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(Weibull, _instance)
        batch_shape = tuple(batch_shape)
        new.scale = self.scale.expand(*batch_shape)
        new.concentration = self.concentration.expand(*batch_shape)
        new._concentration_number = self._concentration_number
        new.concentration_reciprocal = new.concentration.reciprocal()
        base_dist = self.base_dist.expand(batch_shape)
        TransformedDistribution.__init__(new, base_dist, [PowerTransform(exponent=new.concentration_reciprocal),
                                                          AffineTransform(loc=0, scale=new.scale)],
                                         validate_args=False)
        new._validate_args = self._validate_args
        return new

    def _gamma_ratio(self, n, what):
        """Gamma(1 + n / concentration): math.lgamma for a number concentration, the lgamma op (with its
        gradient) for a tensor one."""
        if self._concentration_number is not None:
            return math.exp(math.lgamma(1 + n / self._concentration_number))
        return _C.exp(_C.lgamma(1 + n / self.concentration))

    @property
    def mean(self):
        return self.scale * self._gamma_ratio(1, "mean")

    @property
    def mode(self):
        return self.scale * ((self.concentration - 1) / self.concentration) ** self.concentration.reciprocal()

    @property
    def variance(self):
        g1 = self._gamma_ratio(1, "variance")
        return self.scale.pow(2) * (self._gamma_ratio(2, "variance") - g1 * g1)

    def entropy(self):
        return (EULER_GAMMA * (1 - self.concentration_reciprocal) + _C.log(self.scale * self.concentration_reciprocal)
                + 1)


class LogisticNormal(TransformedDistribution):
    """LogisticNormal(loc, scale): StickBreakingTransform of Normal(loc, scale) over the last dim, a
    distribution on the simplex of one more entry (event_shape (K + 1,) for K-vectors loc)."""
    arg_constraints = {"loc": constraints.real, "scale": constraints.positive}
    support = constraints.simplex
    has_rsample = True

    def __init__(self, loc, scale, validate_args=None):
        base_dist = Normal(loc, scale, validate_args=validate_args)
        if not base_dist.batch_shape:
            base_dist = base_dist.expand([1])
        super().__init__(base_dist, StickBreakingTransform(), validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(LogisticNormal, _instance)
        return super().expand(batch_shape, _instance=new)

    @property
    def loc(self):
        return self.base_dist.base_dist.loc

    @property
    def scale(self):
        return self.base_dist.base_dist.scale

    # no closed form (NotImplementedError, as torch's), each naming what is missing
    def entropy(self):
        raise NotImplementedError("LogisticNormal has no entropy (no closed form; torch's has none either)")

    def cdf(self, value):
        raise NotImplementedError("LogisticNormal has no cdf (StickBreakingTransform is not a monotone "
                                  "elementwise transform; torch's has none either)")

    def icdf(self, value):
        raise NotImplementedError("LogisticNormal has no icdf (StickBreakingTransform is not a monotone "
                                  "elementwise transform; torch's has none either)")
