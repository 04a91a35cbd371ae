"""The continuous distributions: Normal, LogNormal, Uniform, Exponential, Laplace, Cauchy, Gumbel, with
torch's formulas written in Kiln's ops (log_prob, cdf, icdf, entropy and rsample differentiate through
kiln's autograd)."""
import math

from .. import _C
from . import constraints
from .distribution import Distribution
from .utils import broadcast_all, eps, tiny, EULER_GAMMA, LOG_SQRT_2PI

__all__ = ["Normal", "LogNormal", "Uniform", "Exponential", "Laplace", "Cauchy", "Gumbel"]


def _is_number(x):
    return not isinstance(x, _C.Tensor)


def _batch_shape(*args):
    """() when every argument was a number (torch's rule), else the broadcast parameters' shape."""
    params, given = args[:len(args) // 2], args[len(args) // 2:]
    return () if all(_is_number(g) for g in given) else tuple(params[0].shape)


def _rand(shape, like):
    return _C.rand(tuple(shape), dtype=like.dtype, device=like.device)


def _uniform_open(shape, like):
    """Uniform noise in [tiny, 1 - eps) of like's dtype: log(u) and log(1 - u) stay finite."""
    return _C.clamp(_rand(shape, like), tiny(like.dtype), 1 - eps(like.dtype))


class _LocScale(Distribution):
    """A distribution given by loc (real) and scale (positive), broadcast together."""
    arg_constraints = {"loc": constraints.real, "scale": constraints.positive}
    support = constraints.real

    def __init__(self, loc, scale, validate_args=None):
        self.loc, self.scale = broadcast_all(loc, scale)
        super().__init__(_batch_shape(self.loc, self.scale, loc, scale), validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(_LocScale, _instance)
        batch_shape = tuple(batch_shape)
        new.loc = self.loc.expand(*batch_shape)
        new.scale = self.scale.expand(*batch_shape)
        Distribution.__init__(new, batch_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    def _checked(self, value):
        if self._validate_args:
            self._validate_sample(value)
        return value


class Normal(_LocScale):
    """Normal(loc, scale): the Gaussian of mean loc and standard deviation scale."""
    has_rsample = True

    @property
    def mean(self):
        return self.loc

    @property
    def mode(self):
        return self.loc

    @property
    def stddev(self):
        return self.scale

    @property
    def variance(self):
        return self.scale.pow(2)

    def rsample(self, sample_shape=()):
        shape = self._extended_shape(sample_shape)
        noise = _C.randn(shape, dtype=self.loc.dtype, device=self.loc.device)
        return self.loc + noise * self.scale

    def log_prob(self, value):
        self._checked(value)
        return -((value - self.loc) ** 2) / (2 * self.variance) - _C.log(self.scale) - LOG_SQRT_2PI

    def cdf(self, value):
        self._checked(value)
        return 0.5 * (1 + _C.erf((value - self.loc) * self.scale.reciprocal() / math.sqrt(2)))

    def icdf(self, value):
        return self.loc + self.scale * _C.erfinv(2 * value - 1) * math.sqrt(2)

    def entropy(self):
        return 0.5 + 0.5 * math.log(2 * math.pi) + _C.log(self.scale)


class LogNormal(_LocScale):
    """LogNormal(loc, scale): exp of Normal(loc, scale) (written directly, not as a transformed
    distribution)."""
    has_rsample = True
    support = constraints.positive

    @property
    def mean(self):
        return _C.exp(self.loc + self.scale.pow(2) / 2)

    @property
    def mode(self):
        return _C.exp(self.loc - self.scale.pow(2))

    @property
    def variance(self):
        s2 = self.scale.pow(2)
        return _C.expm1(s2) * _C.exp(2 * self.loc + s2)

    def rsample(self, sample_shape=()):
        shape = self._extended_shape(sample_shape)
        noise = _C.randn(shape, dtype=self.loc.dtype, device=self.loc.device)
        return _C.exp(self.loc + noise * self.scale)

    def log_prob(self, value):
        self._checked(value)
        y = _C.log(value)
        return -((y - self.loc) ** 2) / (2 * self.scale.pow(2)) - _C.log(self.scale) - LOG_SQRT_2PI - y

    def cdf(self, value):
        self._checked(value)
        return 0.5 * (1 + _C.erf((_C.log(value) - self.loc) * self.scale.reciprocal() / math.sqrt(2)))

    def icdf(self, value):
        return _C.exp(self.loc + self.scale * _C.erfinv(2 * value - 1) * math.sqrt(2))

    def entropy(self):
        return 0.5 + 0.5 * math.log(2 * math.pi) + _C.log(self.scale) + self.loc


class Uniform(Distribution):
    """Uniform(low, high): uniform on [low, high)."""
    has_rsample = True

    @property
    def arg_constraints(self):
        return {"low": constraints.less_than(self.high), "high": constraints.greater_than(self.low)}

    def __init__(self, low, high, validate_args=None):
        self.low, self.high = broadcast_all(low, high)
        super().__init__(_batch_shape(self.low, self.high, low, high), validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(Uniform, _instance)
        batch_shape = tuple(batch_shape)
        new.low = self.low.expand(*batch_shape)
        new.high = self.high.expand(*batch_shape)
        Distribution.__init__(new, batch_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    @constraints.dependent_property(is_discrete=False, event_dim=0)
    def support(self):
        return constraints.interval(self.low, self.high)

    @property
    def mean(self):
        return (self.high + self.low) / 2

    @property
    def mode(self):
        return math.nan * self.high

    @property
    def stddev(self):
        return (self.high - self.low) / 12 ** 0.5

    @property
    def variance(self):
        return (self.high - self.low).pow(2) / 12

    def rsample(self, sample_shape=()):
        u = _rand(self._extended_shape(sample_shape), self.low)
        return self.low + u * (self.high - self.low)

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        lb = (self.low <= value).to(self.low.dtype)
        ub = (self.high > value).to(self.low.dtype)
        return _C.log(lb * ub) - _C.log(self.high - self.low)

    def cdf(self, value):
        if self._validate_args:
            self._validate_sample(value)
        return _C.clamp((value - self.low) / (self.high - self.low), 0, 1)

    def icdf(self, value):
        return value * (self.high - self.low) + self.low

    def entropy(self):
        return _C.log(self.high - self.low)


class Exponential(Distribution):
    """Exponential(rate): density rate * exp(-rate * x) on x >= 0."""
    arg_constraints = {"rate": constraints.positive}
    support = constraints.nonnegative
    has_rsample = True

    def __init__(self, rate, validate_args=None):
        (self.rate,) = broadcast_all(rate)
        super().__init__(() if _is_number(rate) else tuple(self.rate.shape), validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(Exponential, _instance)
        batch_shape = tuple(batch_shape)
        new.rate = self.rate.expand(*batch_shape)
        Distribution.__init__(new, batch_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    @property
    def mean(self):
        return self.rate.reciprocal()

    @property
    def mode(self):
        return _C.zeros_like(self.rate)

    @property
    def stddev(self):
        return self.rate.reciprocal()

    @property
    def variance(self):
        return self.rate.pow(-2)

    def rsample(self, sample_shape=()):
        e = _C.empty(self._extended_shape(sample_shape), dtype=self.rate.dtype, device=self.rate.device)
        return e.exponential_() / self.rate

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        return _C.log(self.rate) - self.rate * value

    def cdf(self, value):
        if self._validate_args:
            self._validate_sample(value)
        return 1 - _C.exp(-self.rate * value)

    def icdf(self, value):
        return -_C.log1p(-value) / self.rate

    def entropy(self):
        return 1.0 - _C.log(self.rate)


class Laplace(_LocScale):
    """Laplace(loc, scale): density exp(-|x - loc| / scale) / (2 scale)."""
    has_rsample = True

    @property
    def mean(self):
        return self.loc

    @property
    def mode(self):
        return self.loc

    @property
    def variance(self):
        return 2 * self.scale.pow(2)

    @property
    def stddev(self):
        return math.sqrt(2) * self.scale

    def rsample(self, sample_shape=()):
        # torch's: u uniform in (-1, 1), loc - scale * sign(u) * log1p(-|u|)
        u = _rand(self._extended_shape(sample_shape), self.loc) * (2 - eps(self.loc.dtype)) - 1 + eps(self.loc.dtype)
        return self.loc - self.scale * _C.sign(u) * _C.log1p(-_C.abs(u))

    def log_prob(self, value):
        self._checked(value)
        return -_C.log(2 * self.scale) - _C.abs(value - self.loc) / self.scale

    def cdf(self, value):
        self._checked(value)
        return 0.5 - 0.5 * _C.sign(value - self.loc) * _C.expm1(-_C.abs(value - self.loc) / self.scale)

    def icdf(self, value):
        term = value - 0.5
        return self.loc - self.scale * _C.sign(term) * _C.log1p(-2 * _C.abs(term))

    def entropy(self):
        return 1 + _C.log(2 * self.scale)


class Cauchy(_LocScale):
    """Cauchy(loc, scale): density 1 / (pi scale (1 + ((x - loc) / scale)^2)); no mean, infinite
    variance."""
    has_rsample = True

    @property
    def mean(self):
        return _C.full(self._extended_shape(), math.nan, dtype=self.loc.dtype, device=self.loc.device)

    @property
    def mode(self):
        return self.loc

    @property
    def variance(self):
        return _C.full(self._extended_shape(), math.inf, dtype=self.loc.dtype, device=self.loc.device)

    def rsample(self, sample_shape=()):
        u = _uniform_open(self._extended_shape(sample_shape), self.loc)
        return self.loc + self.scale * _C.tan(math.pi * (u - 0.5))

    def log_prob(self, value):
        self._checked(value)
        return -math.log(math.pi) - _C.log(self.scale) - _C.log1p(((value - self.loc) / self.scale) ** 2)

    def cdf(self, value):
        self._checked(value)
        return _C.atan((value - self.loc) / self.scale) / math.pi + 0.5

    def icdf(self, value):
        return _C.tan(math.pi * (value - 0.5)) * self.scale + self.loc

    def entropy(self):
        return math.log(4 * math.pi) + _C.log(self.scale)


class Gumbel(_LocScale):
    """Gumbel(loc, scale): cdf exp(-exp(-(x - loc) / scale))."""
    has_rsample = True

    @property
    def mean(self):
        return self.loc + self.scale * EULER_GAMMA

    @property
    def mode(self):
        return self.loc

    @property
    def stddev(self):
        return (math.pi / math.sqrt(6)) * self.scale

    @property
    def variance(self):
        return self.stddev.pow(2)

    def rsample(self, sample_shape=()):
        u = _uniform_open(self._extended_shape(sample_shape), self.loc)
        return self.loc - self.scale * _C.log(-_C.log(u))

    def log_prob(self, value):
        self._checked(value)
        y = (self.loc - value) / self.scale
        return (y - _C.exp(y)) - _C.log(self.scale)

    def cdf(self, value):
        self._checked(value)
        return _C.exp(-_C.exp(-(value - self.loc) / self.scale))

    def icdf(self, value):
        return self.loc - self.scale * _C.log(-_C.log(value))

    def entropy(self):
        return _C.log(self.scale) + (1 + EULER_GAMMA)
