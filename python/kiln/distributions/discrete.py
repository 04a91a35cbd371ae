"""The discrete distributions: Bernoulli, Geometric, Categorical, OneHotCategorical, each given probs= or
logits= (one of them; the other is computed on first read, as torch's)."""
import math

from .. import _C
from .._tensor import _multinomial, no_grad
from . import constraints
from .distribution import Distribution
from .utils import broadcast_all, expand_probs_or_logits, float_min, lazy_property, logits_to_probs, probs_to_logits, tiny

__all__ = ["Bernoulli", "Geometric", "Categorical", "OneHotCategorical"]


def _one_of(probs, logits):
    if (probs is None) == (logits is None):
        raise ValueError("Either `probs` or `logits` must be specified, but not both.")


def _bce_with_logits(logits, target):
    """binary cross-entropy of target against sigmoid(logits), elementwise, as torch's
    binary_cross_entropy_with_logits: the value (1 - t) * l + log1p(exp(-|l|)) + max(-l, 0), in that order
    (so it rounds as torch's; no threshold, where the engine's softplus returns l above 20), and torch's
    gradients sigmoid(l) - t to the logits and -l to the target, from -logsigmoid(-l) - l * t (whose
    backward is sigmoid(l) - t in one rounding: summing the value formula's own gradients leaves residues
    that, divided by a tiny probs in Geometric's entropy, came out 1 or 2 off near probs 0 or 1 in
    float64). The gradient graph is that function's, so higher derivatives hold too."""
    pos = logits > 0
    soft = _C.log1p(_C.exp(_C.where(pos, -logits, logits)))
    value = (1 - target) * logits + soft + _C.where(pos, _C.zeros_like(logits), -logits)
    if not (logits.requires_grad or target.requires_grad):
        return value
    smooth = -_C.logsigmoid(-logits) - logits * target
    return value.detach() + (smooth - smooth.detach())  # the value exactly (an exact zero added), smooth's gradient


class _Binary(Distribution):
    arg_constraints = {"probs": constraints.unit_interval, "logits": constraints.real}

    def __init__(self, probs=None, logits=None, validate_args=None):
        _one_of(probs, logits)
        given = probs if probs is not None else logits
        if probs is not None:
            (self.probs,) = broadcast_all(probs)
        else:
            (self.logits,) = broadcast_all(logits)
        self._param = self.probs if probs is not None else self.logits
        super().__init__(() if not isinstance(given, _C.Tensor) else tuple(self._param.shape),
                         validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(_Binary, _instance)
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
        return logits_to_probs(self.logits, is_binary=True)


class Bernoulli(_Binary):
    """Bernoulli(probs=p) or Bernoulli(logits=l): 1 with probability p (sigmoid(l)), else 0."""
    support = constraints.boolean
    has_enumerate_support = True

    @property
    def mean(self):
        return self.probs

    @property
    def mode(self):
        mode = (self.probs >= 0.5).to(self.probs.dtype)
        return _C.where(self.probs == 0.5, _C.full_like(mode, math.nan), mode)

    @property
    def variance(self):
        return self.probs * (1 - self.probs)

    def sample(self, sample_shape=()):
        shape = self._extended_shape(sample_shape)
        with no_grad():
            p = self.probs.expand(*shape)
            return (_C.rand(shape, dtype=p.dtype, device=p.device) < p).to(p.dtype)

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        logits, value = broadcast_all(self.logits, value)
        return -_bce_with_logits(logits, value)

    def entropy(self):
        return _bce_with_logits(self.logits, self.probs)

    def enumerate_support(self, expand=True):
        values = _C.arange(2, dtype=self._param.dtype, device=self._param.device)
        values = values.reshape((-1,) + (1,) * len(self._batch_shape))
        return values.expand(-1, *self._batch_shape) if expand else values


class Geometric(_Binary):
    """Geometric(probs=p) or Geometric(logits=l): the number of failures before the first success of
    Bernoulli(p) trials; p must be in (0, 1]."""
    support = constraints.nonnegative_integer

    def __init__(self, probs=None, logits=None, validate_args=None):
        super().__init__(probs, logits, validate_args)
        if self._validate_args and probs is not None:
            value = self.probs
            valid = value > 0
            if not bool(valid.all()):
                raise ValueError(f"Expected parameter probs ({type(value).__name__} of shape {tuple(value.shape)}) "
                                 f"of distribution {self!r} to be positive but found invalid values:\n"
                                 f"{value.detach()[~valid]}")

    def expand(self, batch_shape, _instance=None):
        return super().expand(batch_shape, self._get_checked_instance(Geometric, _instance))

    @property
    def mean(self):
        return 1.0 / self.probs - 1.0

    @property
    def mode(self):
        return _C.zeros_like(self.probs)

    @property
    def variance(self):
        return (1.0 / self.probs - 1.0) / self.probs

    def sample(self, sample_shape=()):
        shape = self._extended_shape(sample_shape)
        with no_grad():
            u = _C.clamp(_C.rand(shape, dtype=self.probs.dtype, device=self.probs.device), min=tiny(self.probs.dtype))
            return _C.floor(_C.log(u) / _C.log1p(-self.probs))

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        value, probs = broadcast_all(value, self.probs)
        # p = 1 and value 0: 0 * log(0) is taken as 0, as torch's
        probs = _C.where((probs == 1) & (value == 0), _C.zeros_like(probs), probs)
        return value * _C.log1p(-probs) + _C.log(self.probs)

    def entropy(self):
        return _bce_with_logits(self.logits, self.probs) / self.probs


class Categorical(Distribution):
    """Categorical(probs=p) or Categorical(logits=l) over the last dim's K categories: probs are
    normalised to sum to 1 (p / p.sum(-1)), logits to log-probabilities (l - logsumexp(l)). Samples are
    int64 indices of shape sample_shape + batch_shape."""
    arg_constraints = {"probs": constraints.simplex, "logits": constraints.independent(constraints.real, 1)}
    has_enumerate_support = True

    def __init__(self, probs=None, logits=None, validate_args=None):
        _one_of(probs, logits)
        if probs is not None:
            if probs.dim() < 1:
                raise ValueError("`probs` parameter must be at least one-dimensional.")
            self.probs = probs / probs.sum(-1, keepdim=True)
        else:
            if logits.dim() < 1:
                raise ValueError("`logits` parameter must be at least one-dimensional.")
            self.logits = logits - _C.logsumexp(logits, -1, True)
        self._param = self.probs if probs is not None else self.logits
        self._num_events = self._param.shape[-1]
        batch_shape = tuple(self._param.shape[:-1])
        super().__init__(batch_shape, validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(Categorical, _instance)
        batch_shape = tuple(batch_shape)
        param_shape = batch_shape + (self._num_events,)
        expand_probs_or_logits(self, new, param_shape)
        new._num_events = self._num_events
        Distribution.__init__(new, batch_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    @constraints.dependent_property(is_discrete=True, event_dim=0)
    def support(self):
        return constraints.integer_interval(0, self._num_events - 1)

    @lazy_property
    def logits(self):
        return probs_to_logits(self.probs)

    @lazy_property
    def probs(self):
        return logits_to_probs(self.logits)

    @property
    def param_shape(self):
        return tuple(self._param.shape)

    @property
    def mean(self):
        return _C.full(self._extended_shape(), math.nan, dtype=self.probs.dtype, device=self.probs.device)

    @property
    def mode(self):
        return self.probs.argmax(-1)

    @property
    def variance(self):
        return _C.full(self._extended_shape(), math.nan, dtype=self.probs.dtype, device=self.probs.device)

    def sample(self, sample_shape=()):
        if isinstance(sample_shape, int):
            sample_shape = (sample_shape,)
        sample_shape = tuple(sample_shape)
        n = math.prod(sample_shape)
        shape = self._extended_shape(sample_shape)
        with no_grad():
            if n == 0 or math.prod(self._batch_shape) == 0:
                return _C.zeros(shape, dtype=_C.dtype.int64, device=self._param.device)
            probs_2d = self.probs.reshape(-1, self._num_events)
            samples_2d = _multinomial(probs_2d, n, True).T  # [n, prod(batch_shape)]
            return samples_2d.reshape(shape)

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        value = value.to(_C.dtype.int64).unsqueeze(-1)
        shape = tuple(_C.broadcast_shapes(tuple(value.shape), tuple(self.logits.shape)))
        value = value.expand(*shape[:-1], 1)
        log_pmf = self.logits.expand(*shape)
        return _C.gather(log_pmf, -1, value).squeeze(-1)

    def entropy(self):
        logits = _C.clamp(self.logits, min=float_min(self.logits.dtype))
        return -(logits * self.probs).sum(-1)

    def enumerate_support(self, expand=True):
        values = _C.arange(self._num_events, device=self._param.device)
        values = values.reshape((-1,) + (1,) * len(self._batch_shape))
        return values.expand(-1, *self._batch_shape) if expand else values


class _OverCategorical:
    """A distribution over one-hot vectors that keeps a Categorical (self._categorical) for its
    parameters: probs, logits, param_shape and _param are the Categorical's."""

    @property
    def _param(self):
        return self._categorical._param

    @property
    def probs(self):
        return self._categorical.probs

    @property
    def logits(self):
        return self._categorical.logits

    @property
    def param_shape(self):
        return self._categorical.param_shape


class OneHotCategorical(_OverCategorical, Distribution):
    """OneHotCategorical(probs=p) or (logits=l): Categorical's draws as one-hot vectors of the K
    categories (event_shape (K,)), in the parameters' dtype."""
    arg_constraints = {"probs": constraints.simplex, "logits": constraints.independent(constraints.real, 1)}
    support = constraints.one_hot
    has_enumerate_support = True

    def __init__(self, probs=None, logits=None, validate_args=None):
        self._categorical = Categorical(probs, logits)
        param = self._categorical._param
        super().__init__(tuple(param.shape[:-1]), tuple(param.shape[-1:]), validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(OneHotCategorical, _instance)
        batch_shape = tuple(batch_shape)
        new._categorical = self._categorical.expand(batch_shape)
        Distribution.__init__(new, batch_shape, self._event_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    @property
    def mean(self):
        return self._categorical.probs

    @property
    def mode(self):
        probs = self._categorical.probs
        return _C.one_hot(probs.argmax(-1), probs.shape[-1]).to(probs.dtype)

    @property
    def variance(self):
        return self._categorical.probs * (1 - self._categorical.probs)

    def sample(self, sample_shape=()):
        probs = self._categorical.probs
        indices = self._categorical.sample(sample_shape)
        return _C.one_hot(indices, self._categorical._num_events).to(probs.dtype)

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        return self._categorical.log_prob(value.argmax(-1))

    def entropy(self):
        return self._categorical.entropy()

    def enumerate_support(self, expand=True):
        n = self._event_shape[0]
        values = _C.eye(n, dtype=self._param.dtype, device=self._param.device)
        values = values.reshape((n,) + (1,) * len(self._batch_shape) + (n,))
        return values.expand(n, *self._batch_shape, n) if expand else values

    def __repr__(self):
        names = [k for k in self.arg_constraints if k in self._categorical.__dict__]
        args = ", ".join(f"{p}: {tuple(self._categorical.__dict__[p].shape)}" for p in names)
        return self.__class__.__name__ + "(" + args + ")"
