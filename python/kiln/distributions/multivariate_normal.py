"""MultivariateNormal(loc, covariance_matrix= | precision_matrix= | scale_tril=): torch's formulas through
kiln.linalg (cholesky, solve_triangular), so rsample, log_prob, entropy and kl_divergence differentiate
with respect to loc and the matrix given; LowRankMultivariateNormal(loc, cov_factor, cov_diag) by the
Woodbury identity, as torch's."""
import math

from .. import _C
from .. import linalg
from . import constraints
from .distribution import Distribution
from .utils import lazy_property

__all__ = ["MultivariateNormal", "LowRankMultivariateNormal"]


def _batch_mahalanobis(L, x):
    """x^T (L L^T)^-1 x over the last dim of x, L lower triangular (batch dims broadcast)."""
    batch = tuple(_C.broadcast_shapes(tuple(L.shape[:-2]), tuple(x.shape[:-1])))
    n = L.shape[-1]
    Lb = L.expand(*(batch + (n, n)))
    y = linalg.solve_triangular(Lb, x.expand(*(batch + (n,))).unsqueeze(-1), upper=False).squeeze(-1)
    return (y * y).sum(-1)


class MultivariateNormal(Distribution):
    """MultivariateNormal(loc, covariance_matrix=None, precision_matrix=None, scale_tril=None): exactly one
    of the three matrices; loc (..., n) and the matrix (..., n, n) broadcast over their batch dims.
    The covariance and precision are factorised by Cholesky (the precision's inverse first)."""
    arg_constraints = {"loc": constraints.real_vector, "covariance_matrix": constraints.positive_definite,
                       "precision_matrix": constraints.positive_definite,
                       "scale_tril": constraints.lower_cholesky}
    support = constraints.real_vector
    has_rsample = True

    def __init__(self, loc, covariance_matrix=None, precision_matrix=None, scale_tril=None, validate_args=None):
        if not isinstance(loc, _C.Tensor) or loc.dim() < 1:
            raise ValueError("MultivariateNormal: loc must be at least one-dimensional (a Tensor of shape "
                             f"(..., n)), got {loc!r}")
        given = [(k, m) for k, m in (("covariance_matrix", covariance_matrix), ("precision_matrix", precision_matrix),
                                     ("scale_tril", scale_tril)) if m is not None]
        if len(given) != 1:
            raise ValueError("Exactly one of covariance_matrix or precision_matrix or scale_tril may be specified.")
        name, matrix = given[0]
        if not isinstance(matrix, _C.Tensor) or matrix.dim() < 2:
            raise ValueError(f"MultivariateNormal: {name} must be at least two-dimensional, with optional "
                             f"leading batch dimensions, got {matrix!r}")
        n = loc.shape[-1]
        if tuple(matrix.shape[-2:]) != (n, n):
            raise ValueError(f"MultivariateNormal: {name} must be of shape (..., {n}, {n}) to match loc of shape "
                             f"{tuple(loc.shape)}, got {tuple(matrix.shape)}")
        batch_shape = tuple(_C.broadcast_shapes(tuple(matrix.shape[:-2]), tuple(loc.shape[:-1])))
        setattr(self, name, matrix.expand(*(batch_shape + (n, n))))
        self.loc = loc.expand(*(batch_shape + (n,)))
        super().__init__(batch_shape, (n,), validate_args=validate_args)
        if name == "scale_tril":
            self._unbroadcasted_scale_tril = matrix
        elif name == "covariance_matrix":
            self._unbroadcasted_scale_tril = linalg.cholesky(matrix)
        else:
            self._unbroadcasted_scale_tril = linalg.cholesky(linalg.inv(matrix))

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(MultivariateNormal, _instance)
        batch_shape = tuple(batch_shape)
        n = self._event_shape[0]
        new.loc = self.loc.expand(*(batch_shape + (n,)))
        new._unbroadcasted_scale_tril = self._unbroadcasted_scale_tril
        for name in ("covariance_matrix", "precision_matrix", "scale_tril"):
            if name in self.__dict__:
                new.__dict__[name] = self.__dict__[name].expand(*(batch_shape + (n, n)))
        Distribution.__init__(new, batch_shape, self._event_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    def _matrix_shape(self):
        return self._batch_shape + self._event_shape + self._event_shape

    @lazy_property
    def scale_tril(self):
        return self._unbroadcasted_scale_tril.expand(*self._matrix_shape())

    @lazy_property
    def covariance_matrix(self):
        L = self._unbroadcasted_scale_tril
        return (L @ L.transpose(-1, -2)).expand(*self._matrix_shape())

    @lazy_property
    def precision_matrix(self):
        L = self._unbroadcasted_scale_tril
        # the inverse of L L^T, differentiated as a function of the whole of L (torch's cholesky_inverse
        # gradient, upper entries included); a triangular solve would give a lower-triangular gradient
        return linalg.inv(L @ L.transpose(-1, -2)).expand(*self._matrix_shape())

    @property
    def mean(self):
        return self.loc

    @property
    def mode(self):
        return self.loc

    @property
    def variance(self):
        L = self._unbroadcasted_scale_tril
        return (L * L).sum(-1).expand(*(self._batch_shape + self._event_shape))

    def rsample(self, sample_shape=()):
        shape = self._extended_shape(sample_shape)
        eps = _C.randn(shape, dtype=self.loc.dtype, device=self.loc.device)
        return self.loc + (self._unbroadcasted_scale_tril @ eps.unsqueeze(-1)).squeeze(-1)

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        diff = value - self.loc
        M = _batch_mahalanobis(self._unbroadcasted_scale_tril, diff)
        half_log_det = _C.log(self._unbroadcasted_scale_tril.diagonal(dim1=-2, dim2=-1)).sum(-1)
        return -0.5 * (self._event_shape[0] * math.log(2 * math.pi) + M) - half_log_det

    def entropy(self):
        half_log_det = _C.log(self._unbroadcasted_scale_tril.diagonal(dim1=-2, dim2=-1)).sum(-1)
        H = 0.5 * self._event_shape[0] * (1.0 + math.log(2 * math.pi)) + half_log_det
        return H.expand(*self._batch_shape) if tuple(H.shape) != self._batch_shape else H


def _batch_capacitance_tril(W, D):
    """Cholesky factor of I + W^T D^-1 W (r x r)."""
    Wt_Dinv = W.transpose(-1, -2) / D.unsqueeze(-2)
    K = Wt_Dinv @ W
    r = W.shape[-1]
    K = K + _C.eye(r, dtype=K.dtype, device=K.device)
    return linalg.cholesky(K)


class LowRankMultivariateNormal(Distribution):
    """LowRankMultivariateNormal(loc, cov_factor, cov_diag): covariance cov_factor @ cov_factor^T +
    diag(cov_diag), loc (..., n), cov_factor (..., n, r), cov_diag (..., n) broadcast over their batch dims.
    log_prob and entropy through the Woodbury identity and the r x r capacitance matrix's Cholesky
    factor, as torch's."""
    arg_constraints = {"loc": constraints.real_vector, "cov_factor": constraints.independent(constraints.real, 2),
                       "cov_diag": constraints.independent(constraints.positive, 1)}
    support = constraints.real_vector
    has_rsample = True

    def __init__(self, loc, cov_factor, cov_diag, validate_args=None):
        for name, t, dims in (("loc", loc, 1), ("cov_factor", cov_factor, 2), ("cov_diag", cov_diag, 1)):
            if not isinstance(t, _C.Tensor) or t.dim() < dims:
                raise ValueError(f"LowRankMultivariateNormal: {name} must be at least {dims}-dimensional, got {t!r}")
        n = loc.shape[-1]
        if cov_factor.shape[-2] != n:
            raise ValueError(f"LowRankMultivariateNormal: cov_factor must be a batch of matrices with shape "
                             f"(..., {n}, r) to match loc of shape {tuple(loc.shape)}, got {tuple(cov_factor.shape)}")
        if cov_diag.shape[-1] != n:
            raise ValueError(f"LowRankMultivariateNormal: cov_diag must be a batch of vectors with shape (..., {n}) "
                             f"to match loc of shape {tuple(loc.shape)}, got {tuple(cov_diag.shape)}")
        batch_shape = tuple(_C.broadcast_shapes(tuple(loc.shape[:-1]), tuple(cov_factor.shape[:-2]),
                                                tuple(cov_diag.shape[:-1])))
        r = cov_factor.shape[-1]
        self.loc = loc.expand(*(batch_shape + (n,)))
        self.cov_factor = cov_factor.expand(*(batch_shape + (n, r)))
        self.cov_diag = cov_diag.expand(*(batch_shape + (n,)))
        self._unbroadcasted_cov_factor = cov_factor
        self._unbroadcasted_cov_diag = cov_diag
        self._capacitance_tril = _batch_capacitance_tril(cov_factor, cov_diag)
        super().__init__(batch_shape, (n,), validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(LowRankMultivariateNormal, _instance)
        batch_shape = tuple(batch_shape)
        n, r = self._event_shape[0], self.cov_factor.shape[-1]
        new.loc = self.loc.expand(*(batch_shape + (n,)))
        new.cov_factor = self.cov_factor.expand(*(batch_shape + (n, r)))
        new.cov_diag = self.cov_diag.expand(*(batch_shape + (n,)))
        new._unbroadcasted_cov_factor = self._unbroadcasted_cov_factor
        new._unbroadcasted_cov_diag = self._unbroadcasted_cov_diag
        new._capacitance_tril = self._capacitance_tril
        Distribution.__init__(new, batch_shape, self._event_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    def _matrix_shape(self):
        return self._batch_shape + self._event_shape + self._event_shape

    @property
    def mean(self):
        return self.loc

    @property
    def mode(self):
        return self.loc

    @lazy_property
    def variance(self):
        W, D = self._unbroadcasted_cov_factor, self._unbroadcasted_cov_diag
        return ((W * W).sum(-1) + D).expand(*(self._batch_shape + self._event_shape))

    @lazy_property
    def covariance_matrix(self):
        W, D = self._unbroadcasted_cov_factor, self._unbroadcasted_cov_diag
        eye = _C.eye(D.shape[-1], dtype=D.dtype, device=D.device)
        return (W @ W.transpose(-1, -2) + D.unsqueeze(-1) * eye).expand(*self._matrix_shape())

    @lazy_property
    def scale_tril(self):
        return linalg.cholesky(self.covariance_matrix)

    @lazy_property
    def precision_matrix(self):
        return linalg.inv(self.covariance_matrix)

    def rsample(self, sample_shape=()):
        shape = self._extended_shape(sample_shape)
        W = self._unbroadcasted_cov_factor
        eps_W = _C.randn(tuple(shape[:-1]) + (W.shape[-1],), dtype=self.loc.dtype, device=self.loc.device)
        eps_D = _C.randn(shape, dtype=self.loc.dtype, device=self.loc.device)
        return (self.loc + (W @ eps_W.unsqueeze(-1)).squeeze(-1)
                + _C.sqrt(self._unbroadcasted_cov_diag) * eps_D)

    def _logdet(self):
        return (2 * _C.log(self._capacitance_tril.diagonal(dim1=-2, dim2=-1)).sum(-1)
                + _C.log(self._unbroadcasted_cov_diag).sum(-1))

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        W, D = self._unbroadcasted_cov_factor, self._unbroadcasted_cov_diag
        diff = value - self.loc
        Wt_Dinv_x = ((W / D.unsqueeze(-1)) * diff.unsqueeze(-1)).sum(-2)  # W^T D^-1 x
        M = (diff * diff / D).sum(-1) - _batch_mahalanobis(self._capacitance_tril, Wt_Dinv_x)
        return -0.5 * (self._event_shape[0] * math.log(2 * math.pi) + self._logdet() + M)

    def entropy(self):
        H = 0.5 * (self._event_shape[0] * (1.0 + math.log(2 * math.pi)) + self._logdet())
        return H.expand(*self._batch_shape) if tuple(H.shape) != self._batch_shape else H
