"""torch.distributions.constraints' everyday subset: objects with check(value) -> a bool tensor (True where
value satisfies the constraint), is_discrete and event_dim, and torch's repr (the error messages of
validate_args name them)."""
import operator

from .. import _C

__all__ = ["Constraint", "dependent", "dependent_property", "is_dependent", "independent", "boolean", "one_hot",
           "nonnegative_integer", "positive_integer", "integer_interval", "real", "real_vector", "positive",
           "nonnegative", "greater_than", "greater_than_eq", "less_than", "unit_interval", "interval",
           "half_open_interval", "simplex", "cat", "stack", "lower_cholesky", "positive_definite", "multinomial"]


def _ndims(owner, name, value):
    """value as a plain int >= 0: any operator.index()-able integer (numpy's included), not a bool."""
    try:
        if isinstance(value, bool):
            raise TypeError
        n = operator.index(value)
    except TypeError:
        raise ValueError(f"{owner}: {name} must be an int >= 0, got {type(value).__name__} {value!r}") from None
    if n < 0:
        raise ValueError(f"{owner}: {name} must be an int >= 0, got {n}")
    return n


class Constraint:
    """A region of valid values: check(value) is a bool tensor of value's batch shape (its shape less
    event_dim trailing dims)."""
    is_discrete = False
    event_dim = 0

    def check(self, value):
        raise NotImplementedError

    def __repr__(self):
        return self.__class__.__name__[1:] + "()"


class _Dependent(Constraint):
    """A placeholder for a constraint that depends on other parameters: not checked."""

    def __init__(self, *, is_discrete=False, event_dim=0):
        self.is_discrete = is_discrete
        self.event_dim = event_dim

    def check(self, value):
        raise ValueError("Cannot determine validity of dependent constraint")


def is_dependent(constraint):
    return isinstance(constraint, _Dependent)


class _DependentProperty(property, _Dependent):
    """A property whose value, read on an instance, is a constraint built from its parameters (Uniform's
    support is interval(low, high)); read on the class it is a dependent constraint."""

    def __init__(self, fn=None, *, is_discrete=False, event_dim=0):
        property.__init__(self, fn)
        _Dependent.__init__(self, is_discrete=is_discrete, event_dim=event_dim)

    def __call__(self, fn):
        return _DependentProperty(fn, is_discrete=self.is_discrete, event_dim=self.event_dim)


class _IndependentConstraint(Constraint):
    """base_constraint over reinterpreted_batch_ndims more dims: an event is valid when all its entries are."""

    def __init__(self, base_constraint, reinterpreted_batch_ndims):
        if not isinstance(base_constraint, Constraint):
            raise TypeError(f"independent: base_constraint must be a Constraint, got "
                            f"{type(base_constraint).__name__}")
        self.base_constraint = base_constraint
        self.reinterpreted_batch_ndims = _ndims("independent", "reinterpreted_batch_ndims", reinterpreted_batch_ndims)

    @property
    def is_discrete(self):
        return self.base_constraint.is_discrete

    @property
    def event_dim(self):
        return self.base_constraint.event_dim + self.reinterpreted_batch_ndims

    def check(self, value):
        result = self.base_constraint.check(value)
        n = self.reinterpreted_batch_ndims
        if result.dim() < n:
            raise ValueError(f"Expected value.dim() >= {self.event_dim} but got {value.dim()}")
        result = result.reshape(tuple(result.shape[:result.dim() - n]) + (-1,))
        return result.all(-1)

    def __repr__(self):
        return f"{self.__class__.__name__[1:]}({self.base_constraint!r}, {self.reinterpreted_batch_ndims})"


class _Boolean(Constraint):
    is_discrete = True

    def check(self, value):
        return (value == 0) | (value == 1)


class _OneHot(Constraint):
    is_discrete = True
    event_dim = 1

    def check(self, value):
        is_boolean = (value == 0) | (value == 1)
        return is_boolean.all(-1) & (value.sum(-1) == 1)


class _IntegerInterval(Constraint):
    is_discrete = True

    def __init__(self, lower_bound, upper_bound):
        self.lower_bound, self.upper_bound = lower_bound, upper_bound

    def check(self, value):
        return (value % 1 == 0) & (value >= self.lower_bound) & (value <= self.upper_bound)

    def __repr__(self):
        return f"{self.__class__.__name__[1:]}(lower_bound={self.lower_bound}, upper_bound={self.upper_bound})"


class _IntegerGreaterThan(Constraint):
    is_discrete = True

    def __init__(self, lower_bound):
        self.lower_bound = lower_bound

    def check(self, value):
        return (value % 1 == 0) & (value >= self.lower_bound)

    def __repr__(self):
        return f"{self.__class__.__name__[1:]}(lower_bound={self.lower_bound})"


class _Real(Constraint):
    def check(self, value):
        return value == value  # False only for NaN


class _GreaterThan(Constraint):
    def __init__(self, lower_bound):
        self.lower_bound = lower_bound

    def check(self, value):
        return value > self.lower_bound

    def __repr__(self):
        return f"{self.__class__.__name__[1:]}(lower_bound={self.lower_bound})"


class _GreaterThanEq(_GreaterThan):
    def check(self, value):
        return value >= self.lower_bound


class _LessThan(Constraint):
    def __init__(self, upper_bound):
        self.upper_bound = upper_bound

    def check(self, value):
        return value < self.upper_bound

    def __repr__(self):
        return f"{self.__class__.__name__[1:]}(upper_bound={self.upper_bound})"


class _Interval(Constraint):
    def __init__(self, lower_bound, upper_bound):
        self.lower_bound, self.upper_bound = lower_bound, upper_bound

    def check(self, value):
        return (value >= self.lower_bound) & (value <= self.upper_bound)

    def __repr__(self):
        return f"{self.__class__.__name__[1:]}(lower_bound={self.lower_bound}, upper_bound={self.upper_bound})"


class _HalfOpenInterval(_Interval):
    def check(self, value):
        return (value >= self.lower_bound) & (value < self.upper_bound)


class _Simplex(Constraint):
    event_dim = 1

    def check(self, value):
        return (value >= 0).all(-1) & (_C.abs(value.sum(-1) - 1) < 1e-6)


class _LowerCholesky(Constraint):
    """Lower-triangular square matrices with a positive diagonal (torch's lower_cholesky)."""
    event_dim = 2

    def check(self, value):
        lower = (value.tril() == value).reshape(tuple(value.shape[:-2]) + (-1,)).all(-1)
        return lower & (value.diagonal(dim1=-2, dim2=-1) > 0).all(-1)


class _PositiveDefinite(Constraint):
    """Symmetric positive-definite matrices (torch's positive_definite: symmetric to 1e-6 and a
    Cholesky factorisation that succeeds)."""
    event_dim = 2

    def check(self, value):
        from ..linalg import cholesky_ex
        sym = (_C.abs(value - value.transpose(-1, -2)) <= 1e-6).reshape(tuple(value.shape[:-2]) + (-1,)).all(-1)
        return sym & (cholesky_ex(value)[1] == 0)


class _Multinomial(Constraint):
    """Nonnegative integer vectors summing to at most upper_bound (torch's multinomial constraint)."""
    is_discrete = True
    event_dim = 1

    def __init__(self, upper_bound):
        self.upper_bound = upper_bound

    def check(self, value):
        return (value >= 0).all(-1) & (value.sum(-1) <= self.upper_bound)


class _Cat(Constraint):
    """cseq[i] on the i-th piece (lengths[i] entries, 1 each by default) of value along dim (the domain
    of CatTransform)."""

    def __init__(self, cseq, dim=0, lengths=None):
        self.cseq = list(cseq)
        for i, c in enumerate(self.cseq):
            if not isinstance(c, Constraint):
                raise TypeError(f"cat: cseq[{i}] must be a Constraint, got {type(c).__name__}")
        self.lengths = [1] * len(self.cseq) if lengths is None else list(lengths)
        if len(self.lengths) != len(self.cseq):
            raise ValueError(f"cat: lengths has {len(self.lengths)} entries for {len(self.cseq)} constraints")
        self.dim = dim

    @property
    def is_discrete(self):
        return any(c.is_discrete for c in self.cseq)

    @property
    def event_dim(self):
        return max(c.event_dim for c in self.cseq)

    def check(self, value):
        if not -value.dim() <= self.dim < value.dim():
            raise ValueError(f"cat: dim {self.dim} out of range for a value of {value.dim()} dims")
        checks, start = [], 0
        for c, length in zip(self.cseq, self.lengths):
            checks.append(c.check(value.narrow(self.dim, start, length)))
            start = start + length
        return _C.cat(checks, self.dim)


class _Stack(Constraint):
    """cseq[i] on value.select(dim, i) (the domain of StackTransform)."""

    def __init__(self, cseq, dim=0):
        self.cseq = list(cseq)
        for i, c in enumerate(self.cseq):
            if not isinstance(c, Constraint):
                raise TypeError(f"stack: cseq[{i}] must be a Constraint, got {type(c).__name__}")
        self.dim = dim

    @property
    def is_discrete(self):
        return any(c.is_discrete for c in self.cseq)

    @property
    def event_dim(self):
        dim = max(c.event_dim for c in self.cseq)
        if self.dim + dim < 0:
            dim += 1
        return dim

    def check(self, value):
        if not -value.dim() <= self.dim < value.dim():
            raise ValueError(f"stack: dim {self.dim} out of range for a value of {value.dim()} dims")
        vs = [value.select(self.dim, i) for i in range(tuple(value.shape)[self.dim])]
        return _C.stack([c.check(v) for v, c in zip(vs, self.cseq)], self.dim)


dependent = _Dependent()
dependent_property = _DependentProperty
independent = _IndependentConstraint
boolean = _Boolean()
one_hot = _OneHot()
nonnegative_integer = _IntegerGreaterThan(0)
positive_integer = _IntegerGreaterThan(1)
integer_interval = _IntegerInterval
real = _Real()
real_vector = independent(real, 1)
positive = _GreaterThan(0.0)
nonnegative = _GreaterThanEq(0.0)
greater_than = _GreaterThan
greater_than_eq = _GreaterThanEq
less_than = _LessThan
unit_interval = _Interval(0.0, 1.0)
interval = _Interval
half_open_interval = _HalfOpenInterval
simplex = _Simplex()
lower_cholesky = _LowerCholesky()
positive_definite = _PositiveDefinite()
multinomial = _Multinomial
cat = _Cat
stack = _Stack
