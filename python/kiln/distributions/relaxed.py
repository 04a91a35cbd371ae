"""RelaxedBernoulli and RelaxedOneHotCategorical (the Concrete / Gumbel-softmax distributions), written
directly rather than as torch's transformed LogitRelaxedBernoulli and ExpRelaxedCategorical: the same
rsample, log_prob and support."""
import math

from .. import _C
from . import constraints
from .discrete import Categorical, _Binary, _OverCategorical
from .distribution import Distribution
from .utils import broadcast_all, clamp_probs, eps, tiny

__all__ = ["RelaxedBernoulli", "RelaxedOneHotCategorical"]


def _uniform_probs(shape, like):
    return clamp_probs(_C.rand(tuple(shape), dtype=like.dtype, device=like.device))


class RelaxedBernoulli(_Binary):
    """RelaxedBernoulli(temperature, probs=p or logits=l): sigmoid((logit(u) + l) / temperature), u
    uniform: values in (0, 1) that tend to Bernoulli(p)'s as the temperature goes to 0."""
    support = constraints.unit_interval
    has_rsample = True

    def __init__(self, temperature, probs=None, logits=None, validate_args=None):
        self.temperature = temperature if isinstance(temperature, _C.Tensor) else None
        super().__init__(probs, logits, validate_args)
        if self.temperature is None:
            self.temperature = _C.full([], float(temperature), dtype=self._param.dtype, device=self._param.device)

    def expand(self, batch_shape, _instance=None):
        new = super().expand(batch_shape, self._get_checked_instance(RelaxedBernoulli, _instance))
        new.temperature = self.temperature
        return new

    def rsample(self, sample_shape=()):
        shape = self._extended_shape(sample_shape)
        probs = clamp_probs(self.probs.expand(*shape))
        u = _uniform_probs(shape, probs)
        logit = (_C.log(u) - _C.log1p(-u) + _C.log(probs) - _C.log1p(-probs)) / self.temperature
        return self._clipped(_C.sigmoid(logit))

    @staticmethod
    def _clipped(y):
        """y clamped to [tiny, 1 - eps], as torch's sigmoid transform and its inverse take it."""
        return _C.clamp(y, tiny(y.dtype), 1 - eps(y.dtype))

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        # the logit-space density (torch's LogitRelaxedBernoulli) at y = logit(value), less
        # log |d sigmoid / dy| = -softplus(-y) - softplus(y)
        v = self._clipped(value)
        y = _C.log(v) - _C.log1p(-v)
        logits, y = broadcast_all(self.logits, y)
        diff = logits - y * self.temperature
        base = _C.log(self.temperature) + diff - 2 * _C.log1p(_C.exp(diff))
        return base + _C.softplus(-y) + _C.softplus(y)


class RelaxedOneHotCategorical(_OverCategorical, Distribution):
    """RelaxedOneHotCategorical(temperature, probs=p or logits=l): softmax((l + Gumbel noise) /
    temperature), points of the simplex that tend to OneHotCategorical(p)'s as the temperature goes to 0."""
    arg_constraints = {"probs": constraints.simplex, "logits": constraints.independent(constraints.real, 1)}
    support = constraints.simplex
    has_rsample = True

    def __init__(self, temperature, probs=None, logits=None, validate_args=None):
        self._categorical = Categorical(probs, logits)
        param = self._categorical._param
        self.temperature = (temperature if isinstance(temperature, _C.Tensor)
                            else _C.full([], float(temperature), dtype=param.dtype, device=param.device))
        super().__init__(tuple(param.shape[:-1]), tuple(param.shape[-1:]), validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(RelaxedOneHotCategorical, _instance)
        batch_shape = tuple(batch_shape)
        new.temperature = self.temperature
        new._categorical = self._categorical.expand(batch_shape)
        Distribution.__init__(new, batch_shape, self._event_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    def rsample(self, sample_shape=()):
        shape = self._extended_shape(sample_shape)
        logits = self.logits
        gumbels = -_C.log(-_C.log(_uniform_probs(shape, logits)))
        scores = (logits + gumbels) / self.temperature
        return _C.exp(scores - _C.logsumexp(scores, -1, True))

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        # torch's ExpRelaxedCategorical density at log(value), less the log-Jacobian of exp
        k = self._categorical._num_events
        log_value = _C.log(value)
        log_scale = math.lgamma(k) + (k - 1) * _C.log(self.temperature)
        score = self.logits - log_value * self.temperature
        score = (score - _C.logsumexp(score, -1, True)).sum(-1)
        return score + log_scale - log_value.sum(-1)
