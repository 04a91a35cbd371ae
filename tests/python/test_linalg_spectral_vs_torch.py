# kiln.linalg's spectral decompositions against PyTorch in f64: eigh / eigvalsh, svd / svdvals, qr, pinv, lstsq,
# matrix_rank, cond, matrix_norm / norm with 'nuc', 2 and -2, and the old kiln.svd / kiln.pinverse.
# Eigen's signs of eigenvectors, singular vectors and QR's factors may differ from LAPACK's, so vectors are
# compared through gauge-invariant quantities (reconstructions, projectors, |U^T U_torch|); values, and
# gradients of gauge-invariant losses, to 1e-8. Also batched shapes, second derivatives and torch's refusals.
import re

import numpy as np
import pytest

import kiln

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(23)
TOL = 1e-8


def both(a, grad=False):
    return kiln.tensor(a, requires_grad=grad), torch.tensor(a, requires_grad=grad)


def close(k, t, tol=TOL):
    kn = np.asarray(k.detach().numpy()) if isinstance(k, kiln.Tensor) else np.asarray(k)
    tn = t.detach().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)
    assert kn.shape == tn.shape, (kn.shape, tn.shape)
    assert np.allclose(kn, tn, rtol=tol, atol=tol, equal_nan=True), np.nanmax(np.abs(kn - tn))


def sym(a):
    return a + np.swapaxes(a, -1, -2)


def grads(k_loss, t_loss, kx, tx):
    k_loss.backward()
    t_loss.backward()
    close(kx.grad, tx.grad)


@pytest.mark.parametrize("shape", [(5, 5), (3, 4, 4), (2, 1, 6, 6)])
@pytest.mark.parametrize("uplo", ["L", "U"])
def test_eigh_values_vectors_and_gradients(shape, uplo):
    a = RNG.standard_normal(shape)
    kx, tx = both(a, True)
    # torch reads one triangle too: the input need not be symmetric for the forward
    kL, kV = kiln.linalg.eigh(kx, UPLO=uplo)
    tL, tV = torch.linalg.eigh(tx, UPLO=uplo)
    close(kL, tL)
    # each eigenvector up to sign: |V^T V_torch| is the identity
    overlap = np.abs(np.swapaxes(kV.detach().numpy(), -1, -2) @ tV.detach().numpy())
    close(overlap, np.broadcast_to(np.eye(shape[-1]), overlap.shape))
    # gauge-invariant loss: eigenvalues and V diag(sin L) V^T
    w = RNG.standard_normal(shape)
    kw, tw = both(w)
    kl = (kL * kL).sum() + ((kV * kL.sin().unsqueeze(-2)) @ kV.transpose(-1, -2) * kw).sum()
    tl = (tL * tL).sum() + ((tV * tL.sin().unsqueeze(-2)) @ tV.transpose(-1, -2) * tw).sum()
    grads(kl, tl, kx, tx)
    kx2, tx2 = both(a, True)
    grads((kiln.linalg.eigvalsh(kx2, UPLO=uplo) * kiln.tensor(w[..., 0])).sum(),
          (torch.linalg.eigvalsh(tx2, UPLO=uplo) * torch.tensor(w[..., 0])).sum(), kx2, tx2)


@pytest.mark.parametrize("shape", [(6, 4), (4, 6), (5, 5), (3, 5, 2), (2, 2, 3, 7)])
@pytest.mark.parametrize("full", [False, True])
def test_svd_values_subspaces_and_gradients(shape, full):
    a = RNG.standard_normal(shape)
    kx, tx = both(a, True)
    kU, kS, kVh = kiln.linalg.svd(kx, full_matrices=full)
    tU, tS, tVh = torch.linalg.svd(tx, full_matrices=full)
    assert tuple(kU.shape) == tuple(tU.shape) and tuple(kVh.shape) == tuple(tVh.shape)
    close(kS, tS)
    k = min(shape[-2:])
    Un, Vn = kU.detach().numpy(), kVh.detach().numpy()
    close(np.abs(np.swapaxes(Un[..., :k], -1, -2) @ tU.detach().numpy()[..., :k]),
          np.broadcast_to(np.eye(k), shape[:-2] + (k, k)))
    close(np.abs(Vn[..., :k, :] @ np.swapaxes(tVh.detach().numpy()[..., :k, :], -1, -2)),
          np.broadcast_to(np.eye(k), shape[:-2] + (k, k)))
    close((Un[..., :k] * kS.detach().numpy()[..., None, :]) @ Vn[..., :k, :], a)
    close(kiln.linalg.svdvals(kiln.tensor(a)), torch.linalg.svdvals(torch.tensor(a)))
    # gauge-invariant loss: the projectors U_k diag(S) U_k^T and V_k^T V_k weighted, and the values
    w1, w2 = RNG.standard_normal(shape[:-2] + (shape[-2],) * 2), RNG.standard_normal(shape[:-2] + (shape[-1],) * 2)

    def loss(U, S, Vh, lib):
        U, Vh = U[..., :k], Vh[..., :k, :]
        pu = (U * S.unsqueeze(-2)) @ U.transpose(-1, -2)
        pv = Vh.transpose(-1, -2) @ (Vh * S.unsqueeze(-1))
        return (S ** 3).sum() + (pu * lib.tensor(w1)).sum() + (pv * lib.tensor(w2)).sum()
    grads(loss(kU, kS, kVh, kiln), loss(tU, tS, tVh, torch), kx, tx)


@pytest.mark.parametrize("shape", [(6, 4), (5, 5), (3, 5, 2), (4, 6)])
@pytest.mark.parametrize("mode", ["reduced", "complete", "r"])
def test_qr_as_torch(shape, mode):
    a = RNG.standard_normal(shape)
    kx, tx = both(a, True)
    kQ, kR = kiln.linalg.qr(kx, mode=mode)
    tQ, tR = torch.linalg.qr(tx, mode=mode)
    assert tuple(kQ.shape) == tuple(tQ.shape) and tuple(kR.shape) == tuple(tR.shape)
    # Householder's QR with LAPACK's reflector sign: the same factors, not only up to sign
    close(kR, tR)
    if mode != "r":
        close(kQ, tQ)
        close(kQ.detach().numpy() @ kR.detach().numpy(), a)
    differentiable = mode == "reduced" and shape[-2] >= shape[-1] or mode == "complete" and shape[-2] == shape[-1]
    if differentiable:
        w1, w2 = RNG.standard_normal(tuple(tQ.shape)), RNG.standard_normal(tuple(tR.shape))
        grads((kQ * kiln.tensor(w1)).sum() + (kR * kiln.tensor(w2)).sum(),
              (tQ * torch.tensor(w1)).sum() + (tR * torch.tensor(w2)).sum(), kx, tx)


def test_second_derivatives_as_torch():
    # d/dA of the gradient of a gauge-invariant loss, with create_graph: Hessian-vector products
    a = RNG.standard_normal((4, 4))
    v = RNG.standard_normal((4, 4))
    for f in (lambda lib, x: (lib.linalg.eigvalsh(x + x.transpose(-1, -2)) ** 3).sum(),
              lambda lib, x: (lib.linalg.svdvals(x) ** 3).sum(),
              lambda lib, x: lib.linalg.matrix_norm(x, "nuc"),
              lambda lib, x: (lib.linalg.qr(x).Q.sin()).sum() + (lib.linalg.qr(x).R ** 2).sum(),
              lambda lib, x: (lib.linalg.pinv(x) ** 2).sum()):
        out = []
        for lib in (kiln, torch):
            x = lib.tensor(a, requires_grad=True)
            (g,) = lib.autograd.grad(f(lib, x), [x], create_graph=True)
            (h,) = lib.autograd.grad((g * lib.tensor(v)).sum(), [x])
            out.append((g, h))
        close(out[0][0], out[1][0])
        close(out[0][1], out[1][1], 1e-7)


@pytest.mark.parametrize("shape", [(6, 4), (4, 6), (3, 5, 5)])
@pytest.mark.parametrize("hermitian", [False, True])
def test_pinv_matrix_rank_cond_norms(shape, hermitian):
    a = RNG.standard_normal(shape)
    if hermitian:
        if shape[-1] != shape[-2]:
            return
        a = sym(a)
    kx, tx = both(a, True)
    kp, tp = kiln.linalg.pinv(kx, hermitian=hermitian), torch.linalg.pinv(tx, hermitian=hermitian)
    close(kp, tp)
    w = RNG.standard_normal(tuple(tp.shape))
    (kp * kiln.tensor(w)).sum().backward()
    (tp * torch.tensor(w)).sum().backward()
    kg, tg = kx.grad.numpy(), tx.grad.numpy()
    if hermitian:
        # torch differentiates pinv by the general formula, Kiln through eigh (a symmetric gradient): they agree
        # on every symmetric direction, the only ones a hermitian input may move in
        kg, tg = kg + np.swapaxes(kg, -1, -2), tg + np.swapaxes(tg, -1, -2)
    close(kg, tg)
    # a rank-deficient matrix and the tolerances
    b = RNG.standard_normal(shape[:-1] + (2,)) @ RNG.standard_normal(shape[:-2] + (2, shape[-1]))
    if hermitian:
        b = b @ np.swapaxes(b, -1, -2)
    for kw in ({}, {"atol": 1.0}, {"rtol": 0.3}, {"atol": 0.5, "rtol": 0.1}):
        close(kiln.linalg.matrix_rank(kiln.tensor(b), hermitian=hermitian, **kw),
              torch.linalg.matrix_rank(torch.tensor(b), hermitian=hermitian, **kw))
        close(kiln.linalg.pinv(kiln.tensor(b), hermitian=hermitian, **kw),
              torch.linalg.pinv(torch.tensor(b), hermitian=hermitian, **kw), 1e-7)
    assert kiln.linalg.matrix_rank(kiln.tensor(b)).dtype == kiln.int64
    for p in (None, 2, -2):
        close(kiln.linalg.cond(kiln.tensor(a), p), torch.linalg.cond(torch.tensor(a), p))
    for ord in ("nuc", 2, -2):
        kx2, tx2 = both(a, True)
        kn, tn = kiln.linalg.matrix_norm(kx2, ord), torch.linalg.matrix_norm(tx2, ord)
        close(kn, tn)
        grads(kn.sum(), tn.sum(), kx2, tx2)
        close(kiln.linalg.matrix_norm(kiln.tensor(a), ord, dim=(-1, -2), keepdim=True),
              torch.linalg.matrix_norm(torch.tensor(a), ord, dim=(-1, -2), keepdim=True))
    if len(shape) == 2:
        close(kiln.linalg.norm(kiln.tensor(a), "nuc"), torch.linalg.norm(torch.tensor(a), "nuc"))
        close(kiln.linalg.norm(kiln.tensor(a), 2), torch.linalg.norm(torch.tensor(a), 2))


@pytest.mark.parametrize("ashape,bshape", [((6, 3), (6, 2)), ((6, 3), (6,)), ((3, 5), (3, 2)), ((2, 5, 4), (2, 5, 3))])
@pytest.mark.parametrize("driver", [None, "gelsd"])
def test_lstsq_as_torch(ashape, bshape, driver):
    a, b = RNG.standard_normal(ashape), RNG.standard_normal(bshape)
    ka, ta = both(a, True)
    kb, tb = both(b, True)
    kr, tr = kiln.linalg.lstsq(ka, kb, driver=driver), torch.linalg.lstsq(ta, tb, driver=driver)
    for name in ("solution", "residuals", "rank", "singular_values"):
        close(getattr(kr, name), getattr(tr, name))
    w = RNG.standard_normal(tuple(tr.solution.shape))
    (kr.solution * kiln.tensor(w)).sum().backward()
    (tr.solution * torch.tensor(w)).sum().backward()
    close(ka.grad, ta.grad)
    close(kb.grad, tb.grad)


def test_old_svd_pinverse():
    a = RNG.standard_normal((5, 3))
    for some in (True, False):
        kU, kS, kV = kiln.svd(kiln.tensor(a), some=some)
        tU, tS, tV = torch.svd(torch.tensor(a), some=some)
        assert tuple(kU.shape) == tuple(tU.shape) and tuple(kV.shape) == tuple(tV.shape)
        close(kS, tS)
        close((kU.numpy()[:, :3] * kS.numpy()) @ kV.numpy()[:, :3].T, a)
    r = kiln.svd(kiln.tensor(a), compute_uv=False)
    t = torch.svd(torch.tensor(a), compute_uv=False)
    for k_, t_ in zip(r, t):
        close(k_, t_)
    close(kiln.pinverse(kiln.tensor(a)), torch.pinverse(torch.tensor(a)))
    close(kiln.tensor(a).pinverse(), torch.tensor(a).pinverse())


def test_f32_and_empty():
    a = RNG.standard_normal((4, 4)).astype(np.float32)
    close(kiln.linalg.eigvalsh(kiln.tensor(sym(a))), torch.linalg.eigvalsh(torch.tensor(sym(a))), 1e-4)
    close(kiln.linalg.svdvals(kiln.tensor(a)), torch.linalg.svdvals(torch.tensor(a)), 1e-4)
    assert kiln.linalg.svd(kiln.tensor(a)).S.dtype == kiln.float32
    for shape in ((0, 0), (0, 3), (3, 0)):
        e = np.zeros(shape)
        for kt, tt in zip(kiln.linalg.svd(kiln.tensor(e)), torch.linalg.svd(torch.tensor(e))):
            close(kt, tt)
        for kt, tt in zip(kiln.linalg.qr(kiln.tensor(e), "complete"), torch.linalg.qr(torch.tensor(e), "complete")):
            close(kt, tt)
    close(kiln.linalg.eigh(kiln.tensor(np.zeros((2, 0, 0)))).eigenvalues,
          torch.linalg.eigh(torch.tensor(np.zeros((2, 0, 0)))).eigenvalues)


def test_errors_as_torch():
    with pytest.raises(RuntimeError, match="A must be batches of square matrices, but they are 3 by 4 matrices"):
        kiln.linalg.eigh(kiln.zeros(3, 4, dtype=kiln.float64))
    with pytest.raises(RuntimeError, match="at least 2 dimensions"):
        kiln.linalg.svd(kiln.zeros(3))
    for dt in (kiln.float16, kiln.bfloat16, kiln.int64):
        for fn in (kiln.linalg.eigh, kiln.linalg.svd, kiln.linalg.qr, kiln.linalg.svdvals, kiln.linalg.eigvalsh):
            with pytest.raises(RuntimeError, match="only float32 and float64"):
                fn(kiln.zeros(3, 3, dtype=dt))
    nan = kiln.full((3, 3), float("nan"), dtype=kiln.float64)
    with pytest.raises(RuntimeError, match="failed to converge"):
        kiln.linalg.eigh(nan)
    with pytest.raises(RuntimeError, match="non-finite values"):
        kiln.linalg.svdvals(nan)
    with pytest.raises(RuntimeError, match="Expected UPLO argument to be 'L' or 'U', but got X"):
        kiln.linalg.eigh(kiln.eye(3), UPLO="X")
    with pytest.raises(RuntimeError, match="qr received unrecognized mode 'x'"):
        kiln.linalg.qr(kiln.eye(3), mode="x")
    x = kiln.tensor(RNG.standard_normal((4, 3)), requires_grad=True)
    with pytest.raises(RuntimeError, match="depends on Q, which is not computed when mode='r'"):
        kiln.linalg.qr(x, mode="r").R.sum().backward()
    with pytest.raises(RuntimeError, match="not differentiable when mode='complete' and nrows > ncols"):
        kiln.linalg.qr(x, mode="complete").Q.sum().backward()
    # cond(p='fro') is computed now (test_cond_other_norms_as_torch); an unknown p is refused, as torch's
    with pytest.raises(ValueError, match="linalg.cond got an invalid norm type"):
        torch.linalg.cond(torch.eye(3), "x")
    with pytest.raises(ValueError, match="linalg.cond got an invalid norm type"):
        kiln.linalg.cond(kiln.eye(3), "x")


@pytest.mark.parametrize("p", ["fro", "nuc", float("inf"), float("-inf"), 1, -1])
def test_cond_other_norms_as_torch(p):
    # norm(A, p) * norm(inv(A), p); a singular matrix in the batch gives inf there, as torch's.
    a = np.random.default_rng(3).standard_normal((3, 4, 4))
    a[1, 2] = 0.0  # a zero row: LU meets an exact zero pivot
    k = kiln.tensor(a, dtype=kiln.float64, requires_grad=True)
    t = torch.tensor(a, requires_grad=True)
    kc, tc = kiln.linalg.cond(k, p), torch.linalg.cond(t, p)
    np.testing.assert_allclose(np.array(kc.tolist()), tc.detach().numpy(), rtol=1e-10)
    good = kiln.linalg.cond(k[0::2], p).sum()
    (kg,) = kiln.autograd.grad(good, k)
    # torch.linalg.cond's own backward for these p fails (an in-place write to inv_ex's output): its formula
    tn = torch.linalg.matrix_norm
    (tg,) = torch.autograd.grad((tn(t[0::2], p) * tn(torch.linalg.inv(t[0::2]), p)).sum(), t)
    np.testing.assert_allclose(np.array(kg.tolist()), tg.numpy(), rtol=1e-8, atol=1e-12)
    with pytest.raises(ValueError, match="square"):
        kiln.linalg.cond(kiln.zeros(2, 3, dtype=kiln.float64), p)


def test_f32_decompositions_stay_orthonormal_on_graded_low_rank_input():
    # Eigen's f32 BDCSVD gave a zero row of Vh (|Vh Vh^T - I| = 1) for this rank-3 matrix with graded columns,
    # and f32 eigh lost orthogonality under the pool's flush-to-zero: f32 is decomposed in f64 now.
    rng = np.random.default_rng(7)
    a = (rng.standard_normal((90, 3)) @ rng.standard_normal((3, 70))) * np.exp(-0.3 * np.arange(70))
    U, S, Vh = kiln.linalg.svd(kiln.tensor(a, dtype=kiln.float32), full_matrices=False)
    vh, u = np.array(Vh.tolist(), dtype=np.float64), np.array(U.tolist(), dtype=np.float64)
    assert np.abs(vh @ vh.T - np.eye(70)).max() < 1e-5
    assert np.abs(u.T @ u - np.eye(70)).max() < 1e-5
    x = rng.standard_normal((200, 50)) * np.logspace(0, -9, 50)
    c = x.T @ x
    L, V = kiln.linalg.eigh(kiln.tensor(c, dtype=kiln.float32))
    v = np.array(V.tolist(), dtype=np.float64)
    assert np.abs(v.T @ v - np.eye(50)).max() < 1e-5


def test_subnormal_values_and_the_unread_triangle_as_torch():
    # Subnormal singular values survive the pool's flush-to-zero, as LAPACK's; eigh reads one triangle only,
    # so a NaN in the other is no error, as torch's.
    # (kiln.tensor's f64 -> f32 cast flushes an f32 subnormal itself while flush_denormal is on, its default)
    kiln.set_flush_denormal(False)
    try:
        for dt, tdt, v in ((kiln.float32, torch.float32, 1e-39), (kiln.float64, torch.float64, 1e-310)):
            x = kiln.tensor([[v, 0.0], [0.0, 2 * v]], dtype=dt)
            kiln.set_flush_denormal(True)  # the pool's tasks flush again: the decomposition must not
            k = kiln.linalg.svdvals(x)
            kiln.set_flush_denormal(False)
            t = torch.linalg.svdvals(torch.tensor([[v, 0.0], [0.0, 2 * v]], dtype=tdt))
            assert k.tolist() == t.tolist() and t.tolist()[1] > 0
    finally:
        kiln.set_flush_denormal(True)
    a = np.array([[2.0, 1.0, np.nan], [1.0, 3.0, 0.5], [0.25, 0.5, 4.0]])
    for uplo, bad in (("L", (0, 2)), ("U", (2, 0))):
        m = a.copy()
        m[0, 2], m[2, 0] = 0.25, 0.25
        m[bad] = np.nan
        k = kiln.linalg.eigvalsh(kiln.tensor(m, dtype=kiln.float64), UPLO=uplo)
        t = torch.linalg.eigvalsh(torch.tensor(m), UPLO=uplo)
        np.testing.assert_allclose(np.array(k.tolist()), t.numpy(), rtol=1e-13)


def test_tensor_tolerances_of_batch_shape_as_torch():
    # a tensor atol / rtol of the batch shape is unsqueezed before the max with s_max [..., 1], as torch's (it
    # gave max([3, 3]) and 'gt: shapes [3,4] and [3,3] do not broadcast')
    b = RNG.standard_normal((3, 4, 2)) @ RNG.standard_normal((3, 2, 4))
    b[1] *= 1e-3
    kb, tb = kiln.tensor(b), torch.tensor(b)
    tols = np.array([1e-2, 0.5, 1e-2])
    for kw in ({"atol": tols}, {"rtol": tols}, {"atol": tols, "rtol": tols[::-1].copy()}):
        kk = {k: kiln.tensor(v) for k, v in kw.items()}
        tk = {k: torch.tensor(v) for k, v in kw.items()}
        close(kiln.linalg.matrix_rank(kb, **kk), torch.linalg.matrix_rank(tb, **tk))
        close(kiln.linalg.pinv(kb, **kk), torch.linalg.pinv(tb, **tk), 1e-7)
        close(kiln.linalg.matrix_rank(kb, hermitian=True, **kk), torch.linalg.matrix_rank(tb, hermitian=True, **tk))


def test_default_rtol_where_atol_is_not_positive_as_torch():
    # torch's default rtol is where(atol > 0, 0, eps * max(m, n)), element-wise: a zero tensor atol or a
    # negative number keeps the relative cutoff (Kiln took rtol = 0 and counted 1e-17 as rank)
    a = np.diag([1.0, 1e-17, 1.0])
    ka, ta = kiln.tensor(a), torch.tensor(a)
    for katol, tatol in ((kiln.zeros(3, dtype=kiln.float64), torch.zeros(3, dtype=torch.float64)),
                         (kiln.zeros([], dtype=kiln.float64), torch.zeros((), dtype=torch.float64)),
                         (-1.0, -1.0), (0.0, 0.0), (1e-20, 1e-20)):
        close(kiln.linalg.matrix_rank(ka, atol=katol), torch.linalg.matrix_rank(ta, atol=tatol))
        close(kiln.linalg.pinv(ka, atol=katol), torch.linalg.pinv(ta, atol=tatol))
    # element-wise over a batch: atol 0 in one matrix, 1e-20 (> 0: rtol 0) in the other
    b = np.stack([a, a])
    close(kiln.linalg.matrix_rank(kiln.tensor(b), atol=kiln.tensor([0.0, 1e-20])),
          torch.linalg.matrix_rank(torch.tensor(b), atol=torch.tensor([0.0, 1e-20])))
    assert kiln.linalg.matrix_rank(kiln.tensor(b), atol=kiln.tensor([0.0, 1e-20])).tolist() == [2, 3]


@pytest.mark.parametrize("ashape,bshape", [((6, 3), (6, 2)), ((6, 3), (6,)), ((2, 5, 4), (2, 5, 3)), ((3, 5), (3, 2))])
def test_lstsq_gels_residuals_as_torch(ashape, bshape):
    # 'gels' fills the residuals whenever m > n, as torch's (Kiln left them empty)
    a, b = RNG.standard_normal(ashape), RNG.standard_normal(bshape)
    kr, tr = kiln.linalg.lstsq(kiln.tensor(a), kiln.tensor(b), driver="gels"), \
        torch.linalg.lstsq(torch.tensor(a), torch.tensor(b), driver="gels")
    for name in ("solution", "residuals", "rank", "singular_values"):
        close(getattr(kr, name), getattr(tr, name))


def test_lstsq_refuses_b_with_more_dims_as_torch():
    for ashape, bshape in (((3, 2), (2, 3, 1)), ((4, 3, 2), (3,))):
        msg = re.escape("input.dim() must be greater or equal to other.dim() and (input.dim() - other.dim()) <= 1")
        with pytest.raises(RuntimeError, match=msg):
            torch.linalg.lstsq(torch.ones(ashape), torch.ones(bshape))
        with pytest.raises(RuntimeError, match=msg):
            kiln.linalg.lstsq(kiln.ones(ashape), kiln.ones(bshape))


@pytest.mark.parametrize("shape", [(0, 0), (3, 0), (0, 3), (2, 0, 3)])
def test_matrix_norm_2_of_empty_matrices_as_torch(shape):
    # ord 2 (and 'nuc') of an empty matrix is 0, as torch's (Kiln: "amax: cannot reduce over an empty dim");
    # ord -2 is refused by both (torch: amin over an empty dim)
    a = np.zeros(shape)
    for ord in (2, "nuc"):
        close(kiln.linalg.matrix_norm(kiln.tensor(a), ord), torch.linalg.matrix_norm(torch.tensor(a), ord))
        close(kiln.linalg.matrix_norm(kiln.tensor(a), ord, keepdim=True),
              torch.linalg.matrix_norm(torch.tensor(a), ord, keepdim=True))
    with pytest.raises(IndexError):
        torch.linalg.matrix_norm(torch.tensor(a), -2)
    with pytest.raises(RuntimeError, match="matrix_norm\\(ord=-2\\): the smallest singular value of an empty"):
        kiln.linalg.matrix_norm(kiln.tensor(a), -2)


def test_linalg_docstring_lists_every_function():
    # one docstring for kiln.linalg after both installs (_linalg_lu's overwrote it without the spectral family)
    doc = kiln.linalg.__doc__
    names = [n for n in dir(kiln.linalg) if not n.startswith("_") and callable(getattr(kiln.linalg, n))]
    assert len(names) >= 25
    missing = [n for n in names if n not in doc]
    assert not missing, missing
