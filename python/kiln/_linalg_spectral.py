"""torch.linalg's spectral decompositions and what is built on them: eigh, eigvalsh, svd, svdvals, qr (engine
ops, engine/ops_spectral.cpp: Eigen on the host, a CUDA tensor copied there and back, no cuSOLVER), and from
those, with engine ops (so autograd differentiates them, twice too): pinv, lstsq, matrix_rank, cond, and
matrix_norm's 'nuc', 2 and -2 (_math.matrix_norm calls svdvals). Also torch.svd (some=, V rather than Vh)
and torch.pinverse (torch.qr is removed from torch; linalg.qr is here). Eigenvectors and singular vectors
are determined up to sign, and Eigen's signs may differ from LAPACK's (torch's): compare reconstructions,
projectors or |U^T U'|, not the vectors."""
import builtins
import collections

from . import _C
from ._C import Tensor
from ._tensor import return_types

__all__ = ["svd", "pinverse"]  # torch.qr is gone from torch (2.x raises): linalg.qr only


def _named(name, fields):
    t = collections.namedtuple(name, fields)
    t.__module__ = "kiln.return_types"
    t.__qualname__ = name
    setattr(return_types, name, t)
    return t


_Eigh = _named("linalg_eigh", ["eigenvalues", "eigenvectors"])
_Svd = _named("linalg_svd", ["U", "S", "Vh"])
_Qr = _named("linalg_qr", ["Q", "R"])
_Lstsq = _named("linalg_lstsq", ["solution", "residuals", "rank", "singular_values"])
_OldSvd = _named("svd", ["U", "S", "V"])


_EPS = {_C.dtype.float32: 2.0 ** -23, _C.dtype.float64: 2.0 ** -52}  # torch.finfo(dtype).eps


def _tensor(fn, name, x):
    if not isinstance(x, Tensor):
        raise TypeError(f"linalg.{fn}(): argument '{name}' must be a kiln.Tensor, not {type(x).__name__}")


def _uplo(fn, UPLO):
    if UPLO not in ("L", "U"):
        raise _C.KilnValueError(f"linalg.{fn}: Expected UPLO argument to be 'L' or 'U', but got {UPLO}")
    return UPLO == "U"


def eigh(A, UPLO="L"):
    """torch.linalg.eigh: A = Q diag(L) Q^T for symmetric A (its lower triangle, or the upper one with UPLO='U'),
    eigenvalues ascending."""
    _tensor("eigh", "A", A)
    return _Eigh(*_C._linalg_eigh(A, _uplo("eigh", UPLO)))


def eigvalsh(A, UPLO="L"):
    """torch.linalg.eigvalsh: eigh's eigenvalues (ascending)."""
    _tensor("eigvalsh", "A", A)
    return _C._linalg_eigvalsh(A, _uplo("eigvalsh", UPLO))


def _driver(fn, driver):
    if driver is not None:
        raise _C.KilnValueError(f"linalg.{fn}: keyword argument `driver=` is only supported on CUDA inputs with "
                                f"cuSOLVER backend (torch's rule; Kiln has no cuSOLVER path: driver must be None)")


def linalg_svd(A, full_matrices=True, *, driver=None):
    """torch.linalg.svd: A = U diag(S) Vh, S descending; full_matrices=False gives the reduced factors."""
    _tensor("svd", "A", A)
    _driver("svd", driver)
    return _Svd(*_C._linalg_svd(A, bool(full_matrices)))


def svdvals(A, *, driver=None):
    """torch.linalg.svdvals: the singular values, descending."""
    _tensor("svdvals", "A", A)
    _driver("svdvals", driver)
    return _C._linalg_svdvals(A)


def linalg_qr(A, mode="reduced"):
    """torch.linalg.qr: mode 'reduced' (Q [m, k], R [k, n]), 'complete' (Q [m, m], R [m, n]) or 'r' (R only, Q
    an empty tensor). Differentiable for m >= n (mode 'reduced', or 'complete' with m == n)."""
    _tensor("qr", "A", A)
    if not isinstance(mode, str):
        raise TypeError(f"linalg.qr(): argument 'mode' must be str, not {type(mode).__name__}")
    return _Qr(*_C._linalg_qr(A, mode))


def _tolerances(fn, A, atol, rtol, smax):
    """torch's pinv / matrix_rank cutoff, max(atol, rtol * smax), smax [..., 1]: rtol defaults to eps * max(m, n)
    where atol is not given or is <= 0, else to 0 (element-wise for a tensor atol: where(atol > 0, 0, eps *
    max(m, n))). atol and rtol may be numbers or tensors of the batch shape (broadcasting with it): a tensor is
    unsqueezed on its last dim to meet smax's, as torch's."""
    for name, v in (("atol", atol), ("rtol", rtol)):
        if isinstance(v, Tensor) and v.dtype.is_floating_point is False:
            raise _C.KilnValueError(f"linalg.{fn}: {name} tensor of dtype {v.dtype.name} is not supported: it must "
                                    f"be floating")
    if rtol is None:
        default = _EPS[A.dtype] * builtins.max(A.shape[-2], A.shape[-1])
        if isinstance(atol, Tensor):
            rtol = _C.where(atol > 0, _C.zeros([], dtype=A.dtype, device=A.device),
                            _C.full([], default, dtype=A.dtype, device=A.device))
        else:
            rtol = 0.0 if atol is not None and atol > 0 else default
    if atol is None:
        atol = 0.0
    atol = atol.unsqueeze(-1) if isinstance(atol, Tensor) else atol
    r = rtol.unsqueeze(-1) * smax if isinstance(rtol, Tensor) else rtol * smax
    if isinstance(atol, Tensor):
        return _C.maximum(atol, r)
    return _C.maximum(_C.full_like(r, float(atol)), r)


def _check_float(fn, A):
    if A.dim() < 2:
        raise _C.KilnValueError(f"linalg.{fn}: The input tensor A must have at least 2 dimensions.")
    if A.dtype not in (_C.dtype.float32, _C.dtype.float64):
        raise _C.KilnValueError(f"linalg.{fn}: {A.dtype.name}: only float32 and float64 tensors are supported")


def pinv(A, *, atol=None, rtol=None, hermitian=False):
    """torch.linalg.pinv: V diag(1/s) U^T over the singular values above max(atol, rtol * s_max) (hermitian: from
    eigh, the eigenvalues by magnitude). The gradient goes through the decomposition: it needs distinct
    singular values; hermitian=True's (through eigh) is symmetric, torch's (its general formula) is not: they
    agree on symmetric directions only."""
    _tensor("pinv", "A", A)
    _check_float("pinv", A)
    if hermitian:
        if A.shape[-1] != A.shape[-2]:
            raise _C.KilnValueError(f"linalg.pinv(hermitian=True): A must be batches of square matrices, but they "
                                    f"are {A.shape[-2]} by {A.shape[-1]} matrices")
        L, V = eigh(A)
        s = _C.abs(L)
    else:
        U, s, Vh = linalg_svd(A, False)
    smax = _C.amax(s, [-1], True) if s.shape[-1] > 0 else _C.zeros_like(s.sum([-1], True))
    tol = _tolerances("pinv", A, atol, rtol, smax)
    keep = s > tol
    # 1/s where kept, 0 elsewhere; the dropped values divide 1, so no infinity reaches the gradient
    d = _C.where(keep, _C.ones_like(s), _C.zeros_like(s))
    if hermitian:
        inv = d / _C.where(keep, L, _C.ones_like(L))
        return _C.matmul(V * inv.unsqueeze(-2), V.transpose(-1, -2))
    inv = d / _C.where(keep, s, _C.ones_like(s))
    return _C.matmul(Vh.transpose(-1, -2) * inv.unsqueeze(-2), U.transpose(-1, -2))


def matrix_rank(A, *, atol=None, rtol=None, hermitian=False):
    """torch.linalg.matrix_rank: how many singular values (hermitian: |eigenvalues|) exceed max(atol, rtol *
    s_max); int64."""
    _tensor("matrix_rank", "A", A)
    _check_float("matrix_rank", A)
    s = _C.abs(eigvalsh(A)) if hermitian else svdvals(A)
    s = s.detach()
    smax = _C.amax(s, [-1], True) if s.shape[-1] > 0 else _C.zeros_like(s.sum([-1], True))
    tol = _tolerances("matrix_rank", A, atol, rtol, smax)
    return (s > tol).sum([-1], False)


def lstsq(A, B, rcond=None, *, driver=None):
    """torch.linalg.lstsq as the minimum-norm solution pinv(A, rtol=rcond) @ B (what LAPACK's gelsy and gelsd
    give). The other fields as torch's CPU drivers fill them: rank for 'gelsy' (the default), 'gelsd' and
    'gelss'; singular_values for 'gelsd' and 'gelss'; residuals (squared, per column) when m > n, for 'gels'
    always, for 'gelsd' and 'gelss' when every matrix has full rank; the rest empty. B has A's dims or one
    fewer (a vector per matrix), as torch's."""
    _tensor("lstsq", "A", A)
    _tensor("lstsq", "B", B)
    _check_float("lstsq", A)
    if driver is None:
        driver = "gelsy"
    if driver not in ("gels", "gelsy", "gelsd", "gelss"):
        raise _C.KilnValueError(f"torch.linalg.lstsq: parameter `driver` should be one of (gels, gelsy, gelsd, "
                                f"gelss), but got {driver}")
    if A.dtype != B.dtype:
        raise _C.KilnValueError(f"torch.linalg.lstsq: Expected input and other to have the same dtype, but got "
                                f"input's dtype {A.dtype.name} and other's dtype {B.dtype.name}")
    if B.dim() > A.dim() or A.dim() - B.dim() > 1:
        raise _C.KilnValueError(f"torch.linalg.lstsq: input.dim() must be greater or equal to other.dim() and "
                                f"(input.dim() - other.dim()) <= 1 (got A of {A.dim()} dims and B of {B.dim()})")
    vector = B.dim() == A.dim() - 1
    Bm = B.unsqueeze(-1) if vector else B
    if Bm.shape[-2] != A.shape[-2]:
        raise _C.KilnValueError(f"torch.linalg.lstsq: input.size(-2) should match other.size(-2), got "
                                f"{A.shape[-2]} and {Bm.shape[-2]}")
    m, n = A.shape[-2], A.shape[-1]
    rtol = _EPS[A.dtype] * builtins.max(m, n) if rcond is None or rcond < 0 else float(rcond)
    U, s, Vh = linalg_svd(A, False)
    smax = _C.amax(s, [-1], True) if s.shape[-1] > 0 else _C.zeros_like(s.sum([-1], True))
    keep = s > (smax * rtol)
    d = _C.where(keep, _C.ones_like(s), _C.zeros_like(s))
    inv = d / _C.where(keep, s, _C.ones_like(s))
    x = _C.matmul(Vh.transpose(-1, -2) * inv.unsqueeze(-2), _C.matmul(U.transpose(-1, -2), Bm))
    empty = _C.zeros([0], dtype=A.dtype, device=A.device)
    rank = keep.sum([-1], False) if driver != "gels" else _C.zeros([0], dtype=_C.dtype.int64, device=A.device)
    sv = s if driver in ("gelsd", "gelss") else empty
    residuals = empty
    # 'gels' (QR) fills them whenever m > n, 'gelsd' / 'gelss' only when every matrix has full rank
    if m > n and (driver == "gels" or (driver in ("gelsd", "gelss") and bool((keep.sum([-1], False) == n).all()))):
        r = _C.matmul(A, x) - Bm
        residuals = (r * r).sum([-2], False)  # [..., 1] for a vector B, as torch's
    return _Lstsq(x.squeeze(-1) if vector else x, residuals, rank, sv)


def cond(A, p=None):
    """torch.linalg.cond: p None or 2 (s_max / s_min) and -2 (s_min / s_max) from the singular values (any
    shape); 'fro', 'nuc', inf, -inf, 1 and -1 as norm(A, p) * norm(inv(A), p) for square matrices, inf where a
    matrix is singular (its LU has a zero pivot), as torch's."""
    _tensor("cond", "A", A)
    _check_float("cond", A)
    if p in (None, 2, -2):
        s = svdvals(A)
        if s.shape[-1] == 0:
            return _C.zeros_like(s.sum([-1], False))
        big, small = s.narrow(-1, 0, 1).squeeze(-1), s.narrow(-1, s.shape[-1] - 1, 1).squeeze(-1)
        return big / small if p != -2 else small / big
    if p not in ("fro", "nuc", float("inf"), float("-inf"), 1, -1):
        raise _C.KilnValueError(f"linalg.cond got an invalid norm type: {p!r}")
    if A.dim() < 2 or A.shape[-1] != A.shape[-2]:
        raise _C.KilnValueError(f"linalg.cond(ord={p}): A must be batches of square matrices, but they are "
                                f"{A.shape[-2] if A.dim() >= 2 else A.shape[-1]} by {A.shape[-1]} matrices")
    from . import _math, _linalg_lu  # noqa: PLC0415 (both import this module's siblings)
    if A.numel() == 0:
        return _C.zeros(list(A.shape[:-2]), dtype=A.dtype, device=A.device)
    norm = _math.linalg.matrix_norm
    try:
        return norm(A, p) * norm(_linalg_lu.inv(A), p)
    except _C.KilnError:
        pass  # some matrix of the batch is singular: each one on its own, inf for the singular ones
    flat = A.reshape([-1] + list(A.shape[-2:]))
    out = []
    for i in range(flat.shape[0]):
        a = flat.select(0, i)
        try:
            out.append(norm(a, p) * norm(_linalg_lu.inv(a), p))
        except _C.KilnError:
            out.append(_C.full([], float("inf"), dtype=A.dtype, device=A.device) + a.sum() * 0)
    return _C.stack(out, 0).reshape(list(A.shape[:-2]))


def svd(input, some=True, compute_uv=True):
    """torch.svd (deprecated in torch for linalg.svd): returns V, not Vh; some=False the square factors;
    compute_uv=False zero-filled U [m, m] and V [n, n], as torch's."""
    _tensor("svd", "input", input)
    if not compute_uv:
        S = svdvals(input)
        m, n = input.shape[-2], input.shape[-1]
        batch = list(input.shape[:-2])
        return _OldSvd(_C.zeros(batch + [m, m], dtype=input.dtype, device=input.device), S,
                       _C.zeros(batch + [n, n], dtype=input.dtype, device=input.device))
    U, S, Vh = linalg_svd(input, not some)
    return _OldSvd(U, S, Vh.transpose(-1, -2))


def pinverse(input, rcond=1e-15):
    """torch.pinverse: linalg.pinv with rtol=rcond."""
    return pinv(input, rtol=rcond)


def _install(linalg):
    linalg.eigh, linalg.eigvalsh, linalg.svd, linalg.svdvals, linalg.qr = eigh, eigvalsh, linalg_svd, svdvals, \
        linalg_qr
    linalg.pinv, linalg.lstsq, linalg.matrix_rank, linalg.cond = pinv, lstsq, matrix_rank, cond
    for name in ("svd", "pinverse"):
        setattr(Tensor, name, globals()[name])
