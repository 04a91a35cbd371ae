"""ContinuousBernoulli(probs=|logits=): the density proportional to p^x (1 - p)^(1 - x) on [0, 1]
(Loaiza-Ganem and Cunningham, 2019), with torch's formulas, Taylor expansions within lims of 1/2
included; rsample by the inverse cdf."""
import math
import numbers

from .. import _C
from . import constraints
from .discrete import _bce_with_logits
from .distribution import Distribution
from .utils import broadcast_all, expand_probs_or_logits, clamp_probs, lazy_property, logits_to_probs, probs_to_logits

__all__ = ["ContinuousBernoulli"]


class ContinuousBernoulli(Distribution):
    """probs (in [0, 1], clamped to [eps, 1 - eps] after validation) or logits; lims=(lo, hi): inside it
    the normaliser, mean and variance use torch's Taylor expansions around probs 1/2."""
    arg_constraints = {"probs": constraints.unit_interval, "logits": constraints.real}
    support = constraints.unit_interval
    has_rsample = True

    def __init__(self, probs=None, logits=None, lims=(0.499, 0.501), validate_args=None):
        if (probs is None) == (logits is None):
            raise ValueError("Either `probs` or `logits` must be specified, but not both.")
        if probs is not None:
            is_scalar = isinstance(probs, numbers.Number)
            (self.probs,) = broadcast_all(probs)
            # checked before the clamp, which would make any probs pass
            if (validate_args if validate_args is not None else Distribution._validate_args) \
                    and not bool(constraints.unit_interval.check(self.probs).all()):
                raise ValueError(f"ContinuousBernoulli: parameter probs (of shape {tuple(self.probs.shape)}) must "
                                 f"lie in [0, 1], found invalid values:\n{self.probs}")
            self.probs = clamp_probs(self.probs)
        else:
            is_scalar = isinstance(logits, numbers.Number)
            (self.logits,) = broadcast_all(logits)
        self._param = self.probs if probs is not None else self.logits
        self._lims = lims
        super().__init__(() if is_scalar else tuple(self._param.shape), validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(ContinuousBernoulli, _instance)
        new._lims = self._lims
        batch_shape = tuple(batch_shape)
        expand_probs_or_logits(self, new, batch_shape)
        Distribution.__init__(new, batch_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    @lazy_property
    def logits(self):
        return probs_to_logits(self.probs, is_binary=True)

    @lazy_property
    def probs(self):
        return clamp_probs(logits_to_probs(self.logits, is_binary=True))

    @property
    def param_shape(self):
        return tuple(self._param.shape)

    def _outside_unstable_region(self):
        return (self.probs <= self._lims[0]) | (self.probs > self._lims[1])

    def _cut_probs(self):
        return _C.where(self._outside_unstable_region(), self.probs, self._lims[0] * _C.ones_like(self.probs))

    def _cont_bern_log_norm(self):
        """The log normalising constant as a function of probs."""
        cut_probs = self._cut_probs()
        below = _C.where(cut_probs <= 0.5, cut_probs, _C.zeros_like(cut_probs))
        above = _C.where(cut_probs >= 0.5, cut_probs, _C.ones_like(cut_probs))
        log_norm = _C.log(_C.abs(_C.log1p(-cut_probs) - _C.log(cut_probs))) - _C.where(
            cut_probs <= 0.5, _C.log1p(-2.0 * below), _C.log(2.0 * above - 1.0))
        x = (self.probs - 0.5).pow(2)
        taylor = math.log(2.0) + (4.0 / 3.0 + 104.0 / 45.0 * x) * x
        return _C.where(self._outside_unstable_region(), log_norm, taylor)

    @property
    def mean(self):
        cut_probs = self._cut_probs()
        mus = cut_probs / (2.0 * cut_probs - 1.0) + 1.0 / (_C.log1p(-cut_probs) - _C.log(cut_probs))
        x = self.probs - 0.5
        taylor = 0.5 + (1.0 / 3.0 + 16.0 / 45.0 * x.pow(2)) * x
        return _C.where(self._outside_unstable_region(), mus, taylor)

    @property
    def stddev(self):
        return _C.sqrt(self.variance)

    @property
    def variance(self):
        cut_probs = self._cut_probs()
        var = (cut_probs * (cut_probs - 1.0) / (1.0 - 2.0 * cut_probs).pow(2)
               + 1.0 / (_C.log1p(-cut_probs) - _C.log(cut_probs)).pow(2))
        x = (self.probs - 0.5).pow(2)
        taylor = 1.0 / 12.0 - (1.0 / 15.0 - 128.0 / 945.0 * x) * x
        return _C.where(self._outside_unstable_region(), var, taylor)

    def rsample(self, sample_shape=()):
        u = _C.rand(self._extended_shape(sample_shape), dtype=self.probs.dtype, device=self.probs.device)
        return self.icdf(u)

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        logits, value = broadcast_all(self.logits, value)
        return -_bce_with_logits(logits, value) + self._cont_bern_log_norm()

    def cdf(self, value):
        if self._validate_args:
            self._validate_sample(value)
        cut_probs = self._cut_probs()
        cdfs = (cut_probs.pow(value) * (1.0 - cut_probs).pow(1.0 - value) + cut_probs - 1.0) / (2.0 * cut_probs - 1.0)
        unbounded = _C.where(self._outside_unstable_region(), cdfs, value)
        return _C.where(value <= 0.0, _C.zeros_like(unbounded),
                        _C.where(value >= 1.0, _C.ones_like(unbounded), unbounded))

    def icdf(self, value):
        cut_probs = self._cut_probs()
        return _C.where(self._outside_unstable_region(),
                        (_C.log1p(-cut_probs + value * (2.0 * cut_probs - 1.0)) - _C.log1p(-cut_probs))
                        / (_C.log(cut_probs) - _C.log1p(-cut_probs)),
                        value)

    def entropy(self):
        log_probs0 = _C.log1p(-self.probs)
        log_probs1 = _C.log(self.probs)
        return self.mean * (log_probs0 - log_probs1) - self._cont_bern_log_norm() - log_probs0
