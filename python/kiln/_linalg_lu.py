"""kiln.linalg's LU and Cholesky decompositions and the solves on them, with torch's signatures over the
engine's ops (engine/ops_decomp.cpp): linalg.lu_factor, lu_solve, solve, inv, det, slogdet, cholesky,
cholesky_ex, solve_triangular (and _math.py's matrix_power takes inv for a negative n); and the torch-level
names kiln.det, logdet, slogdet, inverse, cholesky, cholesky_solve, cholesky_inverse, triangular_solve,
matrix_power (with the Tensor methods). f32 and f64, batched over the leading dims; gradients (and second
derivatives) as torch's. A CUDA tensor is decomposed on the host (copied there and back)."""
import collections

from . import _C
from ._C import Tensor
from ._tensor import _as_method, return_types
from . import _math
from ._math import _tensor_arg, linalg

for _name, _fields in (("linalg_lu_factor", ["LU", "pivots"]), ("linalg_slogdet", ["sign", "logabsdet"]),
                       ("slogdet", ["sign", "logabsdet"]), ("linalg_cholesky_ex", ["L", "info"]),
                       ("triangular_solve", ["solution", "cloned_coefficient"])):
    _t = collections.namedtuple(_name, _fields)
    _t.__module__, _t.__qualname__ = "kiln.return_types", _name
    setattr(return_types, _name, _t)


def _bool(fn, name, v):
    if not isinstance(v, bool):
        raise TypeError(f"{fn}(): argument '{name}' must be bool, not {type(v).__name__}")
    return v


def lu_factor(A, *, pivot=True):
    """torch.linalg.lu_factor: (LU, pivots), P A = L U with L's unit diagonal not stored and pivots torch's
    1-based int32 row swaps. A singular A (a zero on U's diagonal) is an error, as torch's."""
    _tensor_arg("linalg.lu_factor", "A", A)
    if not pivot:
        raise _C.KilnValueError("linalg.lu_factor: LU without pivoting is not implemented (torch has it on CUDA "
                                "only); use pivot=True")
    return return_types.linalg_lu_factor(*_C._linalg_lu_factor(A))


def lu_solve(LU, pivots, B, *, left=True, adjoint=False):
    """torch.linalg.lu_solve: A X = B (left) or X A = B from lu_factor's (LU, pivots); adjoint: A^T."""
    _tensor_arg("linalg.lu_solve", "LU", LU)
    _tensor_arg("linalg.lu_solve", "pivots", pivots)
    _tensor_arg("linalg.lu_solve", "B", B)
    return _C._linalg_lu_solve(LU, pivots, B, _bool("linalg.lu_solve", "left", left),
                               _bool("linalg.lu_solve", "adjoint", adjoint))


def solve(A, B, *, left=True):
    """torch.linalg.solve: A X = B (left) or X A = B; B is a vector (batch of vectors) when 1-D or shaped as A
    without its last dim. A singular A is an error."""
    _tensor_arg("linalg.solve", "A", A)
    _tensor_arg("linalg.solve", "B", B)
    return _C._linalg_solve(A, B, _bool("linalg.solve", "left", left))


def inv(A):
    """torch.linalg.inv: the inverse of each square matrix; a singular one is an error naming its first zero
    pivot, as torch's."""
    _tensor_arg("linalg.inv", "A", A)
    return _C._linalg_inv(A)


def det(A):
    """torch.linalg.det; the gradient where det is 0 is the cofactor matrix (finite), as torch's."""
    _tensor_arg("linalg.det", "A", A)
    return _C._linalg_det(A)


def slogdet(A):
    """torch.linalg.slogdet: (sign, logabsdet); sign 0 and logabsdet -inf for a singular matrix."""
    _tensor_arg("linalg.slogdet", "A", A)
    return return_types.linalg_slogdet(*_C._linalg_slogdet(A))


def _slogdet(A):
    _tensor_arg("slogdet", "A", A)
    return return_types.slogdet(*_C._linalg_slogdet(A))


def logdet(A):
    """torch.logdet: log(det A), NaN where det < 0 and -inf where it is 0."""
    _tensor_arg("logdet", "A", A)
    return _C._logdet(A)


def cholesky(A, *, upper=False):
    """torch.linalg.cholesky: L with A = L L^T (upper: U with A = U^T U); an A that is not positive-definite is
    an error naming the first leading minor that is not."""
    _tensor_arg("linalg.cholesky", "A", A)
    return _C._linalg_cholesky(A, _bool("linalg.cholesky", "upper", upper))


def cholesky_ex(A, *, upper=False, check_errors=False):
    """torch.linalg.cholesky_ex: (L, info), info 0 or the order of the first leading minor that is not
    positive-definite (there L is not a factor: Kiln leaves the input's triangle, torch LAPACK's partial one)."""
    _tensor_arg("linalg.cholesky_ex", "A", A)
    if check_errors:
        return return_types.linalg_cholesky_ex(cholesky(A, upper=upper),
                                               _C.zeros(list(A.shape[:-2]), dtype=_C.dtype.int32, device=A.device))
    return return_types.linalg_cholesky_ex(*_C._linalg_cholesky_ex(A, _bool("linalg.cholesky_ex", "upper", upper)))


def solve_triangular(A, B, *, upper, left=True, unitriangular=False):
    """torch.linalg.solve_triangular: A X = B (left) or X A = B for triangular A (the other triangle is not
    read; unitriangular: its diagonal taken as ones)."""
    _tensor_arg("linalg.solve_triangular", "A", A)
    _tensor_arg("linalg.solve_triangular", "B", B)
    fn = "linalg.solve_triangular"
    return _C._linalg_solve_triangular(A, B, _bool(fn, "upper", upper), _bool(fn, "left", left),
                                       _bool(fn, "unitriangular", unitriangular))


def triangular_solve(b, A, upper=True, transpose=False, unitriangular=False):
    """torch.triangular_solve (the old API): (solution of op(A) X = b, a copy of A), op(A) = A or A^T."""
    _tensor_arg("triangular_solve", "b", b)
    _tensor_arg("triangular_solve", "A", A)
    coeff = A.transpose(-1, -2) if transpose else A
    x = _C._linalg_solve_triangular(coeff, b, bool(upper) != bool(transpose), True, bool(unitriangular))
    # the copy of A broadcast to the batch of the solution, as torch's (b [3, 2, 1], A [2, 2]: [3, 2, 2])
    return return_types.triangular_solve(x, A.expand(list(x.shape[:-2]) + list(A.shape[-2:])).clone())


def torch_cholesky(A, upper=False):
    """torch.cholesky (deprecated in torch for linalg.cholesky): the lower factor, or the upper with upper."""
    _tensor_arg("cholesky", "A", A)
    return _C._linalg_cholesky(A, bool(upper))


def cholesky_solve(B, L, upper=False):
    """torch.cholesky_solve: A^-1 B where A = L L^T (upper: U^T U) is given by its factor."""
    _tensor_arg("cholesky_solve", "B", B)
    _tensor_arg("cholesky_solve", "L", L)
    return _C._cholesky_solve(B, L, bool(upper))


def cholesky_inverse(L, upper=False):
    """torch.cholesky_inverse: A^-1 where A = L L^T (upper: U^T U) is given by its factor."""
    _tensor_arg("cholesky_inverse", "L", L)
    return _C._cholesky_inverse(L, bool(upper))


# torch.linalg.matrix_power: _math's, which takes inv (above) first for a negative n
matrix_power = _math.matrix_power


def _install():
    linalg.lu_factor, linalg.lu_solve, linalg.solve, linalg.inv = lu_factor, lu_solve, solve, inv
    linalg.det, linalg.slogdet, linalg.cholesky, linalg.cholesky_ex = det, slogdet, cholesky, cholesky_ex
    linalg.solve_triangular, linalg.matrix_power = solve_triangular, matrix_power
    names = {"det": det, "logdet": logdet, "slogdet": _slogdet, "inverse": inv, "cholesky": torch_cholesky,
             "cholesky_solve": cholesky_solve, "cholesky_inverse": cholesky_inverse,
             "triangular_solve": triangular_solve, "matrix_power": matrix_power}
    for name, fn in names.items():
        setattr(Tensor, name, _as_method(fn))
    return names


_EXPORTS = _install()
