"""kiln.nn.utils.parametrizations: torch.nn.utils.parametrizations' weight_norm and spectral_norm
(the parametrize API: module.parametrizations.weight.original0 / original1, or .original with the
power iteration's vectors as parametrizations.weight.0._u / _v)."""
from .. import _C
from .._C import KilnIndexError, KilnValueError
from .._tensor import no_grad
from . import functional as F
from .modules import Module
from .parametrize import register_parametrization


def _norm_except_dim(v, dim):
    # torch's norm_except_dim(v, 2, dim): the 2-norm over every dimension but dim (keeping them as
    # size 1); dim=-1 means the norm of the whole tensor (a 0-dim result), as torch
    if dim == -1:
        return (v * v).sum().sqrt()
    dims = [d for d in range(v.dim()) if d != dim]
    if not dims:
        return v.abs()
    return (v * v).sum(dims, keepdim=True).sqrt()


def _weight_norm_dim(dim, v):
    """weight_norm's dim for v (-1: the whole tensor; a negative one counted from v's end)."""
    return dim if dim == -1 or dim >= 0 else dim + v.dim()


def _weight_from(g, v, dim):
    """g * v / ||v||, the norm over every dimension of v but dim."""
    return v * (g / _norm_except_dim(v, _weight_norm_dim(dim, v)))


def _weight_matrix(weight, dim):
    """spectral_norm's view of weight as a matrix: dim first, the rest flattened."""
    if dim != 0:
        weight = weight.permute([dim] + [d for d in range(weight.dim()) if d != dim])
    return weight.flatten(1)


def _start_vector(n, like, eps):
    """A power iteration's random unit start vector of n elements, in like's dtype and device."""
    return F.normalize(_C.randn(n).to(like.dtype).to(like.device), dim=0, eps=eps)


def _sigma(u, mat, v):
    return (u * mat.matmul(v)).sum()


def _default_spectral_dim(module):
    """spectral_norm's default dim: 1 for transposed convolutions (their weight is [in, out, ...]), else 0."""
    from .layers import ConvTranspose1d, ConvTranspose2d
    return 1 if isinstance(module, (ConvTranspose1d, ConvTranspose2d)) else 0


class _WeightNorm(Module):
    def __init__(self, dim=0):
        super().__init__()
        self.dim = -1 if dim is None else dim

    def forward(self, weight_g, weight_v):
        return _weight_from(weight_g, weight_v, self.dim)

    def right_inverse(self, weight):
        return _norm_except_dim(weight, _weight_norm_dim(self.dim, weight)), weight


def weight_norm(module, name="weight", dim=0):
    """torch.nn.utils.parametrizations.weight_norm: module.NAME = g * v / ||v|| (the norm over every
    dimension but dim; dim=None: over the whole tensor), g as parametrizations.NAME.original0 and v
    as original1."""
    if dim is not None and (isinstance(dim, bool) or not isinstance(dim, int)):
        raise KilnValueError(f"weight_norm: dim must be an int or None, got {dim!r}")
    register_parametrization(module, name, _WeightNorm(dim), unsafe=True)
    return module


class _SpectralNorm(Module):
    def __init__(self, weight, n_power_iterations=1, dim=0, eps=1e-12):
        super().__init__()
        ndim = weight.dim()
        if dim >= ndim or dim < -ndim:
            raise KilnIndexError(f"spectral_norm: dim must be in [-{ndim}, {ndim - 1}] for a {ndim}-D weight, got "
                                 f"{dim}")
        if n_power_iterations <= 0:
            raise KilnValueError(f"spectral_norm: expected n_power_iterations to be positive, but got "
                                 f"n_power_iterations={n_power_iterations}")
        self.dim = dim if dim >= 0 else dim + ndim
        self.eps = eps
        if ndim > 1:
            self.n_power_iterations = n_power_iterations
            with no_grad():
                mat = _weight_matrix(weight, self.dim)
                h, w = mat.shape
                self.register_buffer("_u", _start_vector(h, weight, eps))
                self.register_buffer("_v", _start_vector(w, weight, eps))
            self._power_method(mat, 15)

    def _power_method(self, mat, n):
        with no_grad():
            mat = mat.detach()
            for _ in range(n):
                self._u.copy_(F.normalize(mat.matmul(self._v), dim=0, eps=self.eps))
                self._v.copy_(F.normalize(mat.t().matmul(self._u), dim=0, eps=self.eps))

    def forward(self, weight):
        if weight.dim() == 1:
            return F.normalize(weight, dim=0, eps=self.eps)
        mat = _weight_matrix(weight, self.dim)
        if self.training:
            self._power_method(mat, self.n_power_iterations)
        return weight / _sigma(self._u.clone(), mat, self._v.clone())

    def right_inverse(self, value):
        return value


def spectral_norm(module, name="weight", n_power_iterations=1, eps=1e-12, dim=None):
    """torch.nn.utils.parametrizations.spectral_norm: module.NAME = W / sigma(W), sigma estimated by
    power iteration (n_power_iterations per forward in training; the vectors are the buffers
    parametrizations.NAME.0._u / _v); dim defaults to 1 for transposed convolutions, else 0."""
    weight = getattr(module, name, None)
    if weight is None:
        raise KilnValueError(f"spectral_norm: module {type(module).__name__} has no parameter or buffer with name "
                             f"'{name}'")
    if dim is None:
        dim = _default_spectral_dim(module)
    register_parametrization(module, name, _SpectralNorm(weight, n_power_iterations, dim, eps))
    return module
