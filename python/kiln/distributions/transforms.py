"""kiln.distributions.transforms: torch.distributions.transforms written with Kiln's tensor ops, so a
transform's value, its inverse and log_abs_det_jacobian differentiate through Kiln's autograd.

A Transform maps x in its domain to y = t(x) in its codomain (constraints, with event_dim: how many
rightmost dims one event of x spans); t.inv is its inverse (a view of t, the same object each time it is
alive); t.log_abs_det_jacobian(x, y) is log |dy/dx|, summed over the domain's event dims. cache_size=1
remembers the last (x, y) pair: t(x) given the same x object returns the same y, t.inv(y) given that y
returns that x (so a sample's log_prob needs no inverse), as torch's.

    Transform, ComposeTransform, IndependentTransform, ReshapeTransform, ExpTransform, PowerTransform,
    SigmoidTransform, SoftplusTransform, TanhTransform, AbsTransform, AffineTransform, SoftmaxTransform,
    StickBreakingTransform, CatTransform, StackTransform, identity_transform

Left out (Kiln has no Cholesky factorisation): CorrCholeskyTransform, LowerCholeskyTransform,
PositiveDefiniteTransform; also CumulativeDistributionTransform.
"""
import math
import numbers
import operator
import weakref
from functools import reduce

from .. import _C
from .._C import Tensor
from . import constraints
from .utils import broadcast_all, eps, lazy_property, sum_rightmost, tiny

__all__ = ["AbsTransform", "AffineTransform", "CatTransform", "ComposeTransform", "ExpTransform",
           "IndependentTransform", "PowerTransform", "ReshapeTransform", "SigmoidTransform", "SoftplusTransform",
           "SoftmaxTransform", "StackTransform", "StickBreakingTransform", "TanhTransform", "Transform",
           "identity_transform"]


def _shape(x):
    return tuple(x.shape)


def _broadcast_shapes(*shapes):
    return tuple(_C.broadcast_shapes(*[tuple(s) for s in shapes]))


class Transform:
    """An invertible (bijective) or not map with a computable log |det Jacobian|; see the module
    docstring. Subclasses define _call, _inverse, log_abs_det_jacobian, domain, codomain, bijective
    and sign."""
    bijective = False
    domain = constraints.real
    codomain = constraints.real

    def __init__(self, cache_size=0):
        if cache_size not in (0, 1):
            raise ValueError(f"{type(self).__name__}: cache_size must be 0 or 1, got {cache_size!r}")
        self._cache_size = cache_size
        self._inv = None
        if cache_size == 1:
            self._cached_x_y = None, None

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_inv"] = None
        return state

    @property
    def event_dim(self):
        if self.domain.event_dim == self.codomain.event_dim:
            return self.domain.event_dim
        raise ValueError(f"{type(self).__name__}: domain and codomain have different event_dim; "
                         "use .domain.event_dim or .codomain.event_dim")

    @property
    def inv(self):
        """The inverse transform (t.inv.inv is t); t.inv(y) uses t's cache."""
        inv = self._inv() if self._inv is not None else None
        if inv is None:
            inv = _InverseTransform(self)
            self._inv = weakref.ref(inv)
        return inv

    @property
    def sign(self):
        """+1 or -1 (or a tensor of them) for a monotone elementwise transform."""
        raise NotImplementedError(f"{type(self).__name__} has no sign (not a monotone elementwise transform)")

    def with_cache(self, cache_size=1):
        if self._cache_size == cache_size:
            return self
        if type(self).__init__ is Transform.__init__:
            return type(self)(cache_size=cache_size)
        raise NotImplementedError(f"{type(self).__name__}.with_cache is not implemented")

    def __eq__(self, other):
        return self is other

    def __ne__(self, other):
        return not self.__eq__(other)

    __hash__ = object.__hash__

    def __call__(self, x):
        if self._cache_size == 0:
            return self._call(x)
        x_old, y_old = self._cached_x_y
        if x is x_old:
            return y_old
        y = self._call(x)
        self._cached_x_y = x, y
        return y

    def _inv_call(self, y):
        if self._cache_size == 0:
            return self._inverse(y)
        x_old, y_old = self._cached_x_y
        if y is y_old:
            return x_old
        x = self._inverse(y)
        self._cached_x_y = x, y
        return x

    def _call(self, x):
        raise NotImplementedError(f"{type(self).__name__} does not implement the forward map")

    def _inverse(self, y):
        raise NotImplementedError(f"{type(self).__name__} is not invertible (no _inverse); with cache_size=1 "
                                  "its inverse is known only for the outputs it computed last")

    def log_abs_det_jacobian(self, x, y):
        raise NotImplementedError(f"{type(self).__name__} does not implement log_abs_det_jacobian")

    def __repr__(self):
        return self.__class__.__name__ + "()"

    def forward_shape(self, shape):
        """The shape of t(x) for x of this shape."""
        return tuple(shape)

    def inverse_shape(self, shape):
        """The shape of t.inv(y) for y of this shape."""
        return tuple(shape)


class _InverseTransform(Transform):
    """t.inv: t's maps the other way round, sharing t's cache."""

    def __init__(self, transform):
        super().__init__(cache_size=transform._cache_size)
        self._inv = transform

    @constraints.dependent_property(is_discrete=False)
    def domain(self):
        return self._inv.codomain

    @constraints.dependent_property(is_discrete=False)
    def codomain(self):
        return self._inv.domain

    @property
    def bijective(self):
        return self._inv.bijective

    @property
    def sign(self):
        return self._inv.sign

    @property
    def inv(self):
        return self._inv

    def with_cache(self, cache_size=1):
        return self.inv.with_cache(cache_size).inv

    def __eq__(self, other):
        if not isinstance(other, _InverseTransform):
            return False
        return self._inv == other._inv

    __hash__ = object.__hash__

    def __repr__(self):
        return f"{self.__class__.__name__}({self._inv!r})"

    def __call__(self, x):
        return self._inv._inv_call(x)

    def log_abs_det_jacobian(self, x, y):
        return -self._inv.log_abs_det_jacobian(y, x)

    def forward_shape(self, shape):
        return self._inv.inverse_shape(shape)

    def inverse_shape(self, shape):
        return self._inv.forward_shape(shape)


class ComposeTransform(Transform):
    """parts applied in order (parts[0] first); its log_abs_det_jacobian sums theirs over the composite's
    event dims. ComposeTransform([]) is the identity."""

    def __init__(self, parts, cache_size=0):
        parts = list(parts)
        for i, p in enumerate(parts):
            if not isinstance(p, Transform):
                raise TypeError(f"ComposeTransform: parts[{i}] must be a Transform, got {type(p).__name__}")
        if cache_size:
            parts = [part.with_cache(cache_size) for part in parts]
        super().__init__(cache_size=cache_size)
        self.parts = parts

    def __eq__(self, other):
        if not isinstance(other, ComposeTransform):
            return False
        return self.parts == other.parts

    __hash__ = object.__hash__

    @constraints.dependent_property(is_discrete=False)
    def domain(self):
        if not self.parts:
            return constraints.real
        domain = self.parts[0].domain
        event_dim = self.parts[-1].codomain.event_dim
        for part in reversed(self.parts):
            event_dim += part.domain.event_dim - part.codomain.event_dim
            event_dim = max(event_dim, part.domain.event_dim)
        if event_dim > domain.event_dim:
            domain = constraints.independent(domain, event_dim - domain.event_dim)
        return domain

    @constraints.dependent_property(is_discrete=False)
    def codomain(self):
        if not self.parts:
            return constraints.real
        codomain = self.parts[-1].codomain
        event_dim = self.parts[0].domain.event_dim
        for part in self.parts:
            event_dim += part.codomain.event_dim - part.domain.event_dim
            event_dim = max(event_dim, part.codomain.event_dim)
        if event_dim > codomain.event_dim:
            codomain = constraints.independent(codomain, event_dim - codomain.event_dim)
        return codomain

    @lazy_property
    def bijective(self):
        return all(p.bijective for p in self.parts)

    @lazy_property
    def sign(self):
        sign = 1
        for p in self.parts:
            sign = sign * p.sign
        return sign

    @property
    def inv(self):
        inv = self._inv() if self._inv is not None else None
        if inv is None:
            inv = ComposeTransform([p.inv for p in reversed(self.parts)])
            self._inv = weakref.ref(inv)
            inv._inv = weakref.ref(self)
        return inv

    def with_cache(self, cache_size=1):
        if self._cache_size == cache_size:
            return self
        return ComposeTransform(self.parts, cache_size=cache_size)

    def __call__(self, x):
        for part in self.parts:
            x = part(x)
        return x

    def log_abs_det_jacobian(self, x, y):
        if not self.parts:
            return _C.zeros_like(x)
        xs = [x]  # the intermediates: free when parts[:-1] are cached
        for part in self.parts[:-1]:
            xs.append(part(xs[-1]))
        xs.append(y)
        terms = []
        event_dim = self.domain.event_dim
        for part, xi, yi in zip(self.parts, xs[:-1], xs[1:]):
            terms.append(sum_rightmost(part.log_abs_det_jacobian(xi, yi), event_dim - part.domain.event_dim))
            event_dim += part.codomain.event_dim - part.domain.event_dim
        return reduce(operator.add, terms)

    def forward_shape(self, shape):
        for part in self.parts:
            shape = part.forward_shape(shape)
        return tuple(shape)

    def inverse_shape(self, shape):
        for part in reversed(self.parts):
            shape = part.inverse_shape(shape)
        return tuple(shape)

    def __repr__(self):
        return self.__class__.__name__ + "(\n    " + ",\n    ".join(repr(p) for p in self.parts) + "\n)"


identity_transform = ComposeTransform([])


class IndependentTransform(Transform):
    """base_transform with reinterpreted_batch_ndims more rightmost dims taken as event dims (its
    log_abs_det_jacobian summed over them)."""

    def __init__(self, base_transform, reinterpreted_batch_ndims, cache_size=0):
        if not isinstance(base_transform, Transform):
            raise TypeError(f"IndependentTransform: base_transform must be a Transform, got "
                            f"{type(base_transform).__name__}")
        reinterpreted_batch_ndims = constraints._ndims("IndependentTransform", "reinterpreted_batch_ndims",
                                                       reinterpreted_batch_ndims)
        super().__init__(cache_size=cache_size)
        self.base_transform = base_transform.with_cache(cache_size)
        self.reinterpreted_batch_ndims = reinterpreted_batch_ndims

    def with_cache(self, cache_size=1):
        if self._cache_size == cache_size:
            return self
        return IndependentTransform(self.base_transform, self.reinterpreted_batch_ndims, cache_size=cache_size)

    @constraints.dependent_property(is_discrete=False)
    def domain(self):
        return constraints.independent(self.base_transform.domain, self.reinterpreted_batch_ndims)

    @constraints.dependent_property(is_discrete=False)
    def codomain(self):
        return constraints.independent(self.base_transform.codomain, self.reinterpreted_batch_ndims)

    @property
    def bijective(self):
        return self.base_transform.bijective

    @property
    def sign(self):
        return self.base_transform.sign

    def _call(self, x):
        if x.dim() < self.domain.event_dim:
            raise ValueError(f"IndependentTransform: x has {x.dim()} dims, fewer than the domain's event_dim "
                             f"{self.domain.event_dim}")
        return self.base_transform(x)

    def _inverse(self, y):
        if y.dim() < self.codomain.event_dim:
            raise ValueError(f"IndependentTransform: y has {y.dim()} dims, fewer than the codomain's event_dim "
                             f"{self.codomain.event_dim}")
        return self.base_transform.inv(y)

    def log_abs_det_jacobian(self, x, y):
        return sum_rightmost(self.base_transform.log_abs_det_jacobian(x, y), self.reinterpreted_batch_ndims)

    def __repr__(self):
        return f"{self.__class__.__name__}({self.base_transform!r}, {self.reinterpreted_batch_ndims})"

    def forward_shape(self, shape):
        return self.base_transform.forward_shape(shape)

    def inverse_shape(self, shape):
        return self.base_transform.inverse_shape(shape)


class ReshapeTransform(Transform):
    """Reshapes the rightmost dims from in_shape to out_shape (same number of elements); log |det J| 0."""
    bijective = True

    def __init__(self, in_shape, out_shape, cache_size=0):
        self.in_shape, self.out_shape = tuple(in_shape), tuple(out_shape)
        if math.prod(self.in_shape) != math.prod(self.out_shape):
            raise ValueError(f"ReshapeTransform: in_shape {self.in_shape} and out_shape {self.out_shape} have "
                             "different numbers of elements")
        super().__init__(cache_size=cache_size)

    @constraints.dependent_property
    def domain(self):
        return constraints.independent(constraints.real, len(self.in_shape))

    @constraints.dependent_property
    def codomain(self):
        return constraints.independent(constraints.real, len(self.out_shape))

    def with_cache(self, cache_size=1):
        if self._cache_size == cache_size:
            return self
        return ReshapeTransform(self.in_shape, self.out_shape, cache_size=cache_size)

    def _call(self, x):
        batch_shape = _shape(x)[:x.dim() - len(self.in_shape)]
        return x.reshape(batch_shape + self.out_shape)

    def _inverse(self, y):
        batch_shape = _shape(y)[:y.dim() - len(self.out_shape)]
        return y.reshape(batch_shape + self.in_shape)

    def log_abs_det_jacobian(self, x, y):
        batch_shape = _shape(x)[:x.dim() - len(self.in_shape)]
        return _C.zeros(batch_shape, dtype=x.dtype, device=x.device)

    def _reshape(self, shape, src, dst, name):
        shape = tuple(shape)
        if len(shape) < len(src):
            raise ValueError(f"ReshapeTransform.{name}: shape {shape} has fewer dims than {src}")
        cut = len(shape) - len(src)
        if shape[cut:] != src:
            raise ValueError(f"ReshapeTransform.{name}: shape mismatch: expected {shape[cut:]} but got {src}")
        return shape[:cut] + dst

    def forward_shape(self, shape):
        return self._reshape(shape, self.in_shape, self.out_shape, "forward_shape")

    def inverse_shape(self, shape):
        return self._reshape(shape, self.out_shape, self.in_shape, "inverse_shape")


class ExpTransform(Transform):
    """y = exp(x)."""
    domain = constraints.real
    codomain = constraints.positive
    bijective = True
    sign = +1

    def __eq__(self, other):
        return isinstance(other, ExpTransform)

    __hash__ = object.__hash__

    def _call(self, x):
        return _C.exp(x)

    def _inverse(self, y):
        return _C.log(y)

    def log_abs_det_jacobian(self, x, y):
        return x


class PowerTransform(Transform):
    """y = x ** exponent on positive x (exponent a number or a tensor)."""
    domain = constraints.positive
    codomain = constraints.positive
    bijective = True

    def __init__(self, exponent, cache_size=0):
        super().__init__(cache_size=cache_size)
        (self.exponent,) = broadcast_all(exponent)

    def with_cache(self, cache_size=1):
        if self._cache_size == cache_size:
            return self
        return PowerTransform(self.exponent, cache_size=cache_size)

    @lazy_property
    def sign(self):
        return _C.sign(self.exponent)

    def __eq__(self, other):
        if not isinstance(other, PowerTransform):
            return False
        return bool((self.exponent == other.exponent).all())

    __hash__ = object.__hash__

    def _call(self, x):
        return x.pow(self.exponent)

    def _inverse(self, y):
        return y.pow(1 / self.exponent)

    def log_abs_det_jacobian(self, x, y):
        return _C.log(_C.abs(self.exponent * y / x))

    def forward_shape(self, shape):
        return _broadcast_shapes(shape, _shape(self.exponent))

    def inverse_shape(self, shape):
        return _broadcast_shapes(shape, _shape(self.exponent))


def _clipped_sigmoid(x):
    return _C.clamp(_C.sigmoid(x), tiny(x.dtype), 1.0 - eps(x.dtype))


class SigmoidTransform(Transform):
    """y = sigmoid(x), clamped to [tiny, 1 - eps] of x's dtype as torch's."""
    domain = constraints.real
    codomain = constraints.unit_interval
    bijective = True
    sign = +1

    def __eq__(self, other):
        return isinstance(other, SigmoidTransform)

    __hash__ = object.__hash__

    def _call(self, x):
        return _clipped_sigmoid(x)

    def _inverse(self, y):
        y = _C.clamp(y, tiny(y.dtype), 1.0 - eps(y.dtype))
        return _C.log(y) - _C.log1p(-y)

    def log_abs_det_jacobian(self, x, y):
        return -_C.softplus(-x) - _C.softplus(x)


# softplus in this module is the engine's, as torch.nn.functional.softplus (x itself above 20), with its gradient
# sigmoid(x): 0.5 at x == 0 (a clamp_min(0) + log1p(exp(-|x|)) form has gradient 0 there, kiln's clamp_min and
# abs passing none at their kinks).


class SoftplusTransform(Transform):
    """y = log(1 + exp(x))."""
    domain = constraints.real
    codomain = constraints.positive
    bijective = True
    sign = +1

    def __eq__(self, other):
        return isinstance(other, SoftplusTransform)

    __hash__ = object.__hash__

    def _call(self, x):
        return _C.softplus(x)

    def _inverse(self, y):
        return _C.log(-_C.expm1(-y)) + y

    def log_abs_det_jacobian(self, x, y):
        return -_C.softplus(-x)


class TanhTransform(Transform):
    """y = tanh(x); the inverse atanh(y) is not clamped (use cache_size=1 for samples near +-1)."""
    domain = constraints.real
    codomain = constraints.interval(-1.0, 1.0)
    bijective = True
    sign = +1

    def __eq__(self, other):
        return isinstance(other, TanhTransform)

    __hash__ = object.__hash__

    def _call(self, x):
        return _C.tanh(x)

    def _inverse(self, y):
        return 0.5 * (_C.log1p(y) - _C.log1p(-y))  # atanh(y)

    def log_abs_det_jacobian(self, x, y):
        return 2.0 * (math.log(2.0) - x - _C.softplus(-2.0 * x))


class AbsTransform(Transform):
    """y = |x| (not bijective: its inverse returns y)."""
    domain = constraints.real
    codomain = constraints.positive

    def __eq__(self, other):
        return isinstance(other, AbsTransform)

    __hash__ = object.__hash__

    def _call(self, x):
        return _C.abs(x)

    def _inverse(self, y):
        return y


class AffineTransform(Transform):
    """y = loc + scale * x (loc, scale numbers or tensors); event_dim > 0 sums log |scale| over that many
    rightmost dims."""
    bijective = True

    def __init__(self, loc, scale, event_dim=0, cache_size=0):
        for name, v in (("loc", loc), ("scale", scale)):
            if not isinstance(v, (Tensor, numbers.Number)):
                raise TypeError(f"AffineTransform: {name} must be a number or a kiln.Tensor, got {type(v).__name__}")
        event_dim = constraints._ndims("AffineTransform", "event_dim", event_dim)
        super().__init__(cache_size=cache_size)
        self.loc, self.scale = loc, scale
        self._event_dim = event_dim

    @property
    def event_dim(self):
        return self._event_dim

    @constraints.dependent_property(is_discrete=False)
    def domain(self):
        if self.event_dim == 0:
            return constraints.real
        return constraints.independent(constraints.real, self.event_dim)

    @constraints.dependent_property(is_discrete=False)
    def codomain(self):
        if self.event_dim == 0:
            return constraints.real
        return constraints.independent(constraints.real, self.event_dim)

    def with_cache(self, cache_size=1):
        if self._cache_size == cache_size:
            return self
        return AffineTransform(self.loc, self.scale, self.event_dim, cache_size=cache_size)

    def __eq__(self, other):
        if not isinstance(other, AffineTransform):
            return False
        for a, b in ((self.loc, other.loc), (self.scale, other.scale)):
            if isinstance(a, numbers.Number) and isinstance(b, numbers.Number):
                if a != b:
                    return False
            elif not bool((a == b).all() if isinstance(a, Tensor) else (b == a).all()):
                return False
        return True

    __hash__ = object.__hash__

    @property
    def sign(self):
        if isinstance(self.scale, numbers.Real):
            return 1 if float(self.scale) > 0 else -1 if float(self.scale) < 0 else 0
        return _C.sign(self.scale)

    def _call(self, x):
        return self.loc + self.scale * x

    def _inverse(self, y):
        return (y - self.loc) / self.scale

    def log_abs_det_jacobian(self, x, y):
        shape = _shape(x)
        scale = self.scale
        if isinstance(scale, numbers.Real):
            result = _C.full_like(x, math.log(abs(scale)))
        else:
            result = _C.log(_C.abs(scale))
        if self.event_dim:
            result = result.reshape(_shape(result)[:result.dim() - self.event_dim] + (-1,)).sum(-1)
            shape = shape[:len(shape) - self.event_dim]
        return result.expand(*shape) if _shape(result) != shape else result

    def forward_shape(self, shape):
        return _broadcast_shapes(shape, getattr(self.loc, "shape", ()), getattr(self.scale, "shape", ()))

    def inverse_shape(self, shape):
        return _broadcast_shapes(shape, getattr(self.loc, "shape", ()), getattr(self.scale, "shape", ()))


class SoftmaxTransform(Transform):
    """x -> softmax(x) over the last dim (not bijective: the inverse is log(y), one of the preimages)."""
    domain = constraints.real_vector
    codomain = constraints.simplex

    def __eq__(self, other):
        return isinstance(other, SoftmaxTransform)

    __hash__ = object.__hash__

    def _call(self, x):
        probs = _C.exp(x - x.amax(-1, keepdim=True))
        return probs / probs.sum(-1, keepdim=True)

    def _inverse(self, y):
        return _C.log(y)

    def _check(self, shape, name):
        if len(shape) < 1:
            raise ValueError(f"SoftmaxTransform.{name}: shape {tuple(shape)} has no dims (needs at least 1)")
        return tuple(shape)

    def forward_shape(self, shape):
        return self._check(shape, "forward_shape")

    def inverse_shape(self, shape):
        return self._check(shape, "inverse_shape")


class StickBreakingTransform(Transform):
    """A bijection from R^(K-1) to the K-simplex by stick breaking (torch's, offset so that x = 0 maps to
    the uniform point)."""
    domain = constraints.real_vector
    codomain = constraints.simplex
    bijective = True

    def __eq__(self, other):
        return isinstance(other, StickBreakingTransform)

    __hash__ = object.__hash__

    @staticmethod
    def _offset(x, n, top):
        return top - _C.ones((n,), dtype=x.dtype, device=x.device).cumsum(-1)

    def _call(self, x):
        n = _shape(x)[-1]
        offset = self._offset(x, n, n + 1)
        z = _clipped_sigmoid(x - _C.log(offset))
        z_cumprod = (1 - z).cumprod(-1)
        return _C.pad(z, [0, 1], value=1.0) * _C.pad(z_cumprod, [1, 0], value=1.0)

    def _inverse(self, y):
        y_crop = y[..., :-1]
        n = _shape(y)[-1]
        offset = self._offset(y, n - 1, n)
        sf = (1 - y_crop.cumsum(-1)).clamp_min(tiny(y.dtype))
        return _C.log(y_crop) - _C.log(sf) + _C.log(offset)

    def log_abs_det_jacobian(self, x, y):
        n = _shape(x)[-1]
        x = x - _C.log(self._offset(x, n, n + 1))
        return (-x + _C.logsigmoid(x) + _C.log(y[..., :-1])).sum(-1)

    def forward_shape(self, shape):
        if len(shape) < 1:
            raise ValueError(f"StickBreakingTransform.forward_shape: shape {tuple(shape)} has no dims")
        return tuple(shape[:-1]) + (shape[-1] + 1,)

    def inverse_shape(self, shape):
        if len(shape) < 1:
            raise ValueError(f"StickBreakingTransform.inverse_shape: shape {tuple(shape)} has no dims")
        return tuple(shape[:-1]) + (shape[-1] - 1,)


def _check_transforms(name, tseq):
    tseq = list(tseq)
    for i, t in enumerate(tseq):
        if not isinstance(t, Transform):
            raise TypeError(f"{name}: tseq[{i}] must be a Transform, got {type(t).__name__}")
    return tseq


def _check_dim(name, what, t, dim, size):
    if not -t.dim() <= dim < t.dim():
        raise ValueError(f"{name}: dim {dim} out of range for {what} of {t.dim()} dims")
    if _shape(t)[dim] != size:
        raise ValueError(f"{name}: {what} has size {_shape(t)[dim]} in dim {dim}, expected {size}")


class CatTransform(Transform):
    """Applies tseq[i] to the i-th piece (of lengths[i], 1 each by default) of dim, and concatenates."""

    def __init__(self, tseq, dim=0, lengths=None, cache_size=0):
        tseq = _check_transforms("CatTransform", tseq)
        if cache_size:
            tseq = [t.with_cache(cache_size) for t in tseq]
        super().__init__(cache_size=cache_size)
        self.transforms = tseq
        self.lengths = [1] * len(tseq) if lengths is None else list(lengths)
        if len(self.lengths) != len(self.transforms):
            raise ValueError(f"CatTransform: lengths has {len(self.lengths)} entries for {len(self.transforms)} "
                             "transforms")
        self.dim = dim

    @lazy_property
    def event_dim(self):
        return max(t.event_dim for t in self.transforms)

    @lazy_property
    def length(self):
        return sum(self.lengths)

    def with_cache(self, cache_size=1):
        if self._cache_size == cache_size:
            return self
        return CatTransform(self.transforms, self.dim, self.lengths, cache_size)

    def _map(self, x, inverse, what):
        _check_dim("CatTransform", what, x, self.dim, self.length)
        out, start = [], 0
        for trans, length in zip(self.transforms, self.lengths):
            piece = x.narrow(self.dim, start, length)
            out.append(trans.inv(piece) if inverse else trans(piece))
            start = start + length
        return _C.cat(out, self.dim)

    def _call(self, x):
        return self._map(x, False, "x")

    def _inverse(self, y):
        return self._map(y, True, "y")

    def log_abs_det_jacobian(self, x, y):
        _check_dim("CatTransform", "x", x, self.dim, self.length)
        _check_dim("CatTransform", "y", y, self.dim, self.length)
        terms, start = [], 0
        for trans, length in zip(self.transforms, self.lengths):
            term = trans.log_abs_det_jacobian(x.narrow(self.dim, start, length), y.narrow(self.dim, start, length))
            if trans.event_dim < self.event_dim:
                term = sum_rightmost(term, self.event_dim - trans.event_dim)
            terms.append(term)
            start = start + length
        dim = self.dim - x.dim() if self.dim >= 0 else self.dim
        dim = dim + self.event_dim
        if dim < 0:
            return _C.cat(terms, dim)
        return reduce(operator.add, terms)

    @property
    def bijective(self):
        return all(t.bijective for t in self.transforms)

    @constraints.dependent_property
    def domain(self):
        return constraints.cat([t.domain for t in self.transforms], self.dim, self.lengths)

    @constraints.dependent_property
    def codomain(self):
        return constraints.cat([t.codomain for t in self.transforms], self.dim, self.lengths)


class StackTransform(Transform):
    """Applies tseq[i] to x.select(dim, i) and stacks the results along dim."""

    def __init__(self, tseq, dim=0, cache_size=0):
        tseq = _check_transforms("StackTransform", tseq)
        if cache_size:
            tseq = [t.with_cache(cache_size) for t in tseq]
        super().__init__(cache_size=cache_size)
        self.transforms = tseq
        self.dim = dim

    def with_cache(self, cache_size=1):
        if self._cache_size == cache_size:
            return self
        return StackTransform(self.transforms, self.dim, cache_size)

    def _slice(self, z):
        return [z.select(self.dim, i) for i in range(_shape(z)[self.dim])]

    def _map(self, x, inverse, what):
        _check_dim("StackTransform", what, x, self.dim, len(self.transforms))
        out = [t.inv(s) if inverse else t(s) for s, t in zip(self._slice(x), self.transforms)]
        return _C.stack(out, self.dim)

    def _call(self, x):
        return self._map(x, False, "x")

    def _inverse(self, y):
        return self._map(y, True, "y")

    def log_abs_det_jacobian(self, x, y):
        _check_dim("StackTransform", "x", x, self.dim, len(self.transforms))
        _check_dim("StackTransform", "y", y, self.dim, len(self.transforms))
        terms = [t.log_abs_det_jacobian(xs, ys) for xs, ys, t in zip(self._slice(x), self._slice(y), self.transforms)]
        return _C.stack(terms, self.dim)

    @property
    def bijective(self):
        return all(t.bijective for t in self.transforms)

    @constraints.dependent_property
    def domain(self):
        return constraints.stack([t.domain for t in self.transforms], self.dim)

    @constraints.dependent_property
    def codomain(self):
        return constraints.stack([t.codomain for t in self.transforms], self.dim)
