"""The count distributions: Poisson, Binomial, NegativeBinomial, Multinomial, with torch's log_prob formulas in Kiln's
ops (lgamma; gradients to rate, probs/logits and total_count flow). Samples are drawn on the host by
numpy's generator seeded from Kiln's random stream (Multinomial's: counts of Categorical draws on Kiln's
stream); kiln.manual_seed makes them reproducible; they carry no gradient (has_rsample is False)."""
import math

import numpy as np

from .. import _C
from .._math import xlogy
from .._tensor import no_grad
from . import constraints
from .distribution import Distribution
from .gamma import Gamma
from .utils import broadcast_all, expand_probs_or_logits, lazy_property, logits_to_probs, probs_to_logits

__all__ = ["Poisson", "Binomial", "NegativeBinomial", "Multinomial"]


def _is_number(x):
    return not isinstance(x, _C.Tensor)


def _host_rng(like):
    """A numpy Generator seeded from two draws of Kiln's random stream."""
    with no_grad():
        u = _C.rand((2,), dtype=_C.dtype.float64).numpy()
    return np.random.default_rng([int(u[0] * 2 ** 32), int(u[1] * 2 ** 32)])


def _to_kiln(arr, like):
    return _C.from_numpy(np.ascontiguousarray(arr, dtype=np.float64)).to(like.dtype).to(like.device)


def _host(t, shape):
    return np.broadcast_to(t.detach().to(_C.dtype.float64).cpu().numpy(), shape)


def _clamp_by_zero(x):
    return (_C.clamp(x, min=0) + x - _C.clamp(x, max=0)) / 2


class Poisson(Distribution):
    """Poisson(rate): P(k) = rate^k exp(-rate) / k! on k = 0, 1, 2, ..."""
    arg_constraints = {"rate": constraints.nonnegative}
    support = constraints.nonnegative_integer

    def __init__(self, rate, validate_args=None):
        (self.rate,) = broadcast_all(rate)
        super().__init__(() if _is_number(rate) else tuple(self.rate.shape), validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(Poisson, _instance)
        batch_shape = tuple(batch_shape)
        new.rate = self.rate.expand(*batch_shape)
        Distribution.__init__(new, batch_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    @property
    def mean(self):
        return self.rate

    @property
    def mode(self):
        return _C.floor(self.rate)

    @property
    def variance(self):
        return self.rate

    def sample(self, sample_shape=()):
        shape = self._extended_shape(sample_shape)
        rng = _host_rng(self.rate)
        return _to_kiln(rng.poisson(_host(self.rate, shape)), self.rate)

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        rate, value = broadcast_all(self.rate, value)
        return xlogy(value, rate) - rate - _C.lgamma(value + 1)


class _CountsProbs(Distribution):
    """total_count with probs= or logits= (one of them; the other computed on first read)."""

    def _init_counts(self, total_count, probs, logits, validate_args):
        if (probs is None) == (logits is None):
            raise ValueError("Either `probs` or `logits` must be specified, but not both.")
        given = probs if probs is not None else logits
        if probs is not None:
            self.total_count, self.probs = broadcast_all(total_count, probs)
            self.total_count = self.total_count.to(self.probs.dtype)
            param = self.probs
        else:
            self.total_count, self.logits = broadcast_all(total_count, logits)
            self.total_count = self.total_count.to(self.logits.dtype)
            param = self.logits
        self._param = param
        shape = () if _is_number(given) and _is_number(total_count) else tuple(param.shape)
        Distribution.__init__(self, shape, validate_args=validate_args)

    def _expand_counts(self, cls, batch_shape, _instance):
        new = self._get_checked_instance(cls, _instance)
        batch_shape = tuple(batch_shape)
        new.total_count = self.total_count.expand(*batch_shape)
        expand_probs_or_logits(self, new, batch_shape)
        Distribution.__init__(new, batch_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    @lazy_property
    def logits(self):
        return probs_to_logits(self.probs, is_binary=True)

    @lazy_property
    def probs(self):
        return logits_to_probs(self.logits, is_binary=True)


class Binomial(_CountsProbs):
    """Binomial(total_count=1, probs=p or logits=l): successes in total_count Bernoulli(p) trials."""
    arg_constraints = {"total_count": constraints.nonnegative_integer, "probs": constraints.unit_interval,
                       "logits": constraints.real}
    has_enumerate_support = True

    def __init__(self, total_count=1, probs=None, logits=None, validate_args=None):
        self._init_counts(total_count, probs, logits, validate_args)

    def expand(self, batch_shape, _instance=None):
        return self._expand_counts(Binomial, batch_shape, _instance)

    @constraints.dependent_property(is_discrete=True, event_dim=0)
    def support(self):
        return constraints.integer_interval(0, self.total_count)

    @property
    def mean(self):
        return self.total_count * self.probs

    @property
    def mode(self):
        return _C.minimum(_C.floor((self.total_count + 1) * self.probs), self.total_count)

    @property
    def variance(self):
        return self.total_count * self.probs * (1 - self.probs)

    def sample(self, sample_shape=()):
        shape = self._extended_shape(sample_shape)
        rng = _host_rng(self._param)
        n = _host(self.total_count, shape).astype(np.int64)
        p = np.clip(_host(self.probs, shape), 0.0, 1.0)
        return _to_kiln(rng.binomial(n, p), self._param)

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        n = self.total_count
        log_factorial_n = _C.lgamma(n + 1)
        log_factorial_k = _C.lgamma(value + 1)
        log_factorial_nmk = _C.lgamma(n - value + 1)
        normalize_term = (n * _clamp_by_zero(self.logits) + n * _C.log1p(_C.exp(-_C.abs(self.logits)))
                          - log_factorial_n)
        return value * self.logits - log_factorial_k - log_factorial_nmk - normalize_term

    def enumerate_support(self, expand=True):
        total = self.total_count.detach().max().item() if self.total_count.numel() else 0
        if self.total_count.numel() and not bool((self.total_count == total).all()):
            raise NotImplementedError("Binomial.enumerate_support (and entropy): inhomogeneous total count "
                                      f"(total_count of shape {tuple(self.total_count.shape)} holds different "
                                      "values) not supported")
        values = _C.arange(1 + int(total), dtype=self._param.dtype, device=self._param.device)
        values = values.reshape((-1,) + (1,) * len(self._batch_shape))
        return values.expand(-1, *self._batch_shape) if expand else values

    def entropy(self):
        values = self.enumerate_support(False)
        log_prob = self.log_prob(values)
        return -(_C.exp(log_prob) * log_prob).sum(0)


class NegativeBinomial(_CountsProbs):
    """NegativeBinomial(total_count, probs=p or logits=l): the number of successes of Bernoulli(p) trials
    before total_count failures (torch's parameterisation); total_count may be any real >= 0."""
    arg_constraints = {"total_count": constraints.greater_than_eq(0),
                       "probs": constraints.half_open_interval(0.0, 1.0), "logits": constraints.real}
    support = constraints.nonnegative_integer

    def __init__(self, total_count, probs=None, logits=None, validate_args=None):
        self._init_counts(total_count, probs, logits, validate_args)

    def expand(self, batch_shape, _instance=None):
        return self._expand_counts(NegativeBinomial, batch_shape, _instance)

    @property
    def mean(self):
        return self.total_count * _C.exp(self.logits)

    @property
    def mode(self):
        return _C.clamp(_C.floor((self.total_count - 1) * _C.exp(self.logits)), min=0.0)

    @property
    def variance(self):
        return self.mean / _C.sigmoid(-self.logits)

    def sample(self, sample_shape=()):
        with no_grad():
            rate = Gamma(self.total_count, _C.exp(-self.logits), validate_args=False).sample(sample_shape)
            return Poisson(rate, validate_args=False).sample()

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        n = self.total_count
        log_unnormalized = n * _C.logsigmoid(-self.logits) + value * _C.logsigmoid(self.logits)
        log_normalization = -_C.lgamma(n + value) + _C.lgamma(1.0 + value) + _C.lgamma(n)
        log_normalization = _C.where(n + value == 0.0, _C.zeros_like(log_normalization), log_normalization)
        return log_unnormalized - log_normalization


class Multinomial(Distribution):
    """Multinomial(total_count=1, probs=p or logits=l): counts of total_count draws of
    Categorical(probs/logits) over the last dim's K categories (event_shape (K,)); total_count is an int.
    log_prob needs only the counts (any total, as torch's); sample draws on Kiln's random stream."""
    arg_constraints = {"probs": constraints.simplex, "logits": constraints.independent(constraints.real, 1)}

    def __init__(self, total_count=1, probs=None, logits=None, validate_args=None):
        from .discrete import Categorical
        if not isinstance(total_count, int) or isinstance(total_count, bool) or total_count < 0:
            raise ValueError(f"Multinomial: total_count must be a nonnegative int, got {total_count!r}")
        self.total_count = total_count
        self._categorical = Categorical(probs=probs, logits=logits, validate_args=validate_args)
        self._binomial = Binomial(total_count=total_count, probs=self.probs, validate_args=False)
        batch_shape = tuple(self._categorical.batch_shape)
        event_shape = tuple(self._categorical.param_shape[-1:])
        super().__init__(batch_shape, event_shape, validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(Multinomial, _instance)
        batch_shape = tuple(batch_shape)
        new.total_count = self.total_count
        new._categorical = self._categorical.expand(batch_shape)
        new._binomial = Binomial(total_count=self.total_count, probs=new._categorical.probs, validate_args=False)
        Distribution.__init__(new, batch_shape, self._event_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    @constraints.dependent_property(is_discrete=True, event_dim=1)
    def support(self):
        return constraints.multinomial(self.total_count)

    @property
    def logits(self):
        return self._categorical.logits

    @property
    def probs(self):
        return self._categorical.probs

    @property
    def param_shape(self):
        return self._categorical.param_shape

    @property
    def mean(self):
        return self.probs * self.total_count

    @property
    def variance(self):
        return self.total_count * self.probs * (1 - self.probs)

    def sample(self, sample_shape=()):
        if isinstance(sample_shape, int):
            sample_shape = (sample_shape,)
        shape = self._extended_shape(sample_shape)
        k = self._event_shape[0]
        with no_grad():
            if self.total_count == 0:
                return _C.zeros(shape, dtype=self.probs.dtype, device=self.probs.device)
            draws = self._categorical.sample((self.total_count,) + tuple(sample_shape))  # [n, *sample, *batch]
            return _C.one_hot(draws, k).to(self.probs.dtype).sum(0)

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        logits, value = broadcast_all(self.logits, value)
        log_factorial_n = _C.lgamma(value.sum(-1) + 1)
        log_factorial_xs = _C.lgamma(value + 1).sum(-1)
        # a category of probability 0 counted 0 times contributes 0 (not 0 * -inf)
        logits = _C.where((value == 0) & (logits == float("-inf")), _C.zeros_like(logits), logits)
        return log_factorial_n - log_factorial_xs + (logits * value).sum(-1)

    def entropy(self):
        n = float(self.total_count)
        term1 = n * self._categorical.entropy() - math.lgamma(n + 1)
        support = self._binomial.enumerate_support(expand=False)[1:]
        binomial_probs = _C.exp(self._binomial.log_prob(support))
        weights = _C.lgamma(support + 1)
        return term1 + (binomial_probs * weights).sum(-1).sum(0)
