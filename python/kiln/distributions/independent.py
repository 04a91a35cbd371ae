"""Independent(base_distribution, reinterpreted_batch_ndims): base's rightmost batch dims taken as event
dims (log_prob and entropy summed over them), as torch's."""
from . import constraints
from .distribution import Distribution
from .utils import sum_rightmost

__all__ = ["Independent"]


class Independent(Distribution):
    arg_constraints = {}

    def __init__(self, base_distribution, reinterpreted_batch_ndims, validate_args=None):
        if not isinstance(base_distribution, Distribution):
            raise TypeError("Independent: base_distribution must be a kiln.distributions.Distribution, got "
                            f"{type(base_distribution).__name__}")
        n = constraints._ndims("Independent", "reinterpreted_batch_ndims", reinterpreted_batch_ndims)
        shape = base_distribution.batch_shape + base_distribution.event_shape
        event_dim = n + len(base_distribution.event_shape)
        if n > len(base_distribution.batch_shape):
            raise ValueError("Expected reinterpreted_batch_ndims <= len(base_distribution.batch_shape), "
                             f"actual {n} vs {len(base_distribution.batch_shape)}")
        self.base_dist = base_distribution
        self.reinterpreted_batch_ndims = n
        super().__init__(shape[:len(shape) - event_dim], shape[len(shape) - event_dim:],
                         validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(Independent, _instance)
        batch_shape = tuple(batch_shape)
        new.base_dist = self.base_dist.expand(batch_shape + self._event_shape[:self.reinterpreted_batch_ndims])
        new.reinterpreted_batch_ndims = self.reinterpreted_batch_ndims
        Distribution.__init__(new, batch_shape, self._event_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    @property
    def has_rsample(self):
        return self.base_dist.has_rsample

    @property
    def has_enumerate_support(self):
        if self.reinterpreted_batch_ndims > 0:
            return False
        return self.base_dist.has_enumerate_support

    @constraints.dependent_property
    def support(self):
        result = self.base_dist.support
        if self.reinterpreted_batch_ndims:
            result = constraints.independent(result, self.reinterpreted_batch_ndims)
        return result

    @property
    def mean(self):
        return self.base_dist.mean

    @property
    def mode(self):
        return self.base_dist.mode

    @property
    def variance(self):
        return self.base_dist.variance

    def sample(self, sample_shape=()):
        return self.base_dist.sample(sample_shape)

    def rsample(self, sample_shape=()):
        return self.base_dist.rsample(sample_shape)

    def log_prob(self, value):
        return sum_rightmost(self.base_dist.log_prob(value), self.reinterpreted_batch_ndims)

    def entropy(self):
        return sum_rightmost(self.base_dist.entropy(), self.reinterpreted_batch_ndims)

    def enumerate_support(self, expand=True):
        if self.reinterpreted_batch_ndims > 0:
            raise NotImplementedError("Enumeration over cartesian product is not implemented")
        return self.base_dist.enumerate_support(expand=expand)

    def __repr__(self):
        return f"{self.__class__.__name__}({self.base_dist}, {self.reinterpreted_batch_ndims})"
