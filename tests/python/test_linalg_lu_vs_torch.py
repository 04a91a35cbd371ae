"""kiln.linalg's LU and Cholesky decompositions and solves (python/kiln/_linalg_lu.py over
engine/ops_decomp.cpp) against torch in f64: values, gradients and a second derivative (create_graph),
batched shapes, broadcasting of B, and the errors for singular, non-square, non-positive-definite and
16-bit or integer input."""
import numpy as np
import pytest

import kiln

torch = pytest.importorskip("torch")


def rand(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape)


def shifted(shape, seed):  # well-conditioned: A + n I
    return rand(shape, seed) + shape[-1] * np.eye(shape[-1])


def spd(shape, seed):  # B B^T + n I
    b = rand(shape, seed)
    return b @ np.swapaxes(b, -1, -2) + shape[-1] * np.eye(shape[-1])


def close(k, t, tol=1e-10):
    np.testing.assert_allclose(k.detach().numpy(), t.detach().numpy(), rtol=tol, atol=tol)


def compare(fk, ft, arrays, tol=1e-10, second=True):
    """fk / ft map leaves to a tensor or a tuple of tensors (the floating ones differentiated). Compares the
    outputs, the gradients of sum(w * out) and the gradient of sum(v * those gradients) (a second derivative)."""
    ks = [kiln.tensor(a, dtype=kiln.float64, requires_grad=True) for a in arrays]
    ts = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in arrays]
    ok, ot = fk(*ks), ft(*ts)
    ok = ok if isinstance(ok, tuple) else (ok,)
    ot = ot if isinstance(ot, tuple) else (ot,)
    assert len(ok) == len(ot)
    lk, lt = 0, 0
    for i, (a, b) in enumerate(zip(ok, ot)):
        assert tuple(a.shape) == tuple(b.shape)
        if not b.dtype.is_floating_point:
            np.testing.assert_array_equal(a.numpy(), b.numpy())
            continue
        close(a, b, tol)
        w = rand(tuple(b.shape), 100 + i)
        lk = lk + (a * kiln.tensor(w, dtype=kiln.float64)).sum()
        lt = lt + (b * torch.tensor(w, dtype=torch.float64)).sum()
    gk = kiln.autograd.grad(lk, ks, create_graph=second)
    gt = torch.autograd.grad(lt, ts, create_graph=second)
    for a, b in zip(gk, gt):
        close(a, b, tol)
    if not second:
        return
    vs = [rand(a.shape, 200 + i) for i, a in enumerate(arrays)]
    sk = sum((g * kiln.tensor(v, dtype=kiln.float64)).sum() for g, v in zip(gk, vs))
    st = sum((g * torch.tensor(v, dtype=torch.float64)).sum() for g, v in zip(gt, vs))
    for a, b in zip(kiln.autograd.grad(sk, ks, allow_unused=True, materialize_grads=True),
                    torch.autograd.grad(st, ts, allow_unused=True, materialize_grads=True)):
        close(a, b, tol * 100)


@pytest.mark.parametrize("a_shape,b_shape", [((4, 4), (4, 2)), ((2, 3, 4, 4), (4, 2)), ((3, 4, 4), (2, 1, 4, 5)),
                                             ((4, 4), (4,)), ((2, 4, 4), (2, 4)), ((3, 4, 4), (4,))])
def test_solve(a_shape, b_shape):
    compare(lambda a, b: kiln.linalg.solve(a, b), lambda a, b: torch.linalg.solve(a, b),
            [shifted(a_shape, 1), rand(b_shape, 2)])


@pytest.mark.parametrize("b_shape", [(3, 4), (2, 3, 4)])  # a vector B: refused, as torch (test_shape_errors)
def test_solve_left_false(b_shape):
    compare(lambda a, b: kiln.linalg.solve(a, b, left=False), lambda a, b: torch.linalg.solve(a, b, left=False),
            [shifted((2, 4, 4), 3), rand(b_shape, 4)])


@pytest.mark.parametrize("shape", [(4, 4), (2, 3, 3, 3), (1, 1)])
def test_inv_det_slogdet(shape):
    a = shifted(shape, 5)
    second = shape != (1, 1)  # torch's 1 x 1 gradients of these have no graph of their own
    compare(kiln.linalg.inv, torch.linalg.inv, [a], second=second)
    compare(kiln.linalg.det, torch.linalg.det, [a], second=second)
    compare(lambda x: tuple(kiln.linalg.slogdet(x)), lambda x: tuple(torch.linalg.slogdet(x)), [a], second=second)
    compare(kiln.inverse, torch.inverse, [a], second=second)
    compare(lambda x: x.det(), lambda x: x.det(), [a], second=second)
    compare(kiln.logdet, torch.logdet, [spd(shape, 6)], second=second)
    compare(lambda x: tuple(kiln.slogdet(x)), lambda x: tuple(torch.slogdet(x)), [a], second=second)


def test_logdet_negative_and_singular():
    a = np.array([[[0.0, 1.0], [1.0, 0.0]], [[1.0, 2.0], [2.0, 4.0]], [[2.0, 0.0], [0.0, 3.0]]])
    close(kiln.logdet(kiln.tensor(a)), torch.logdet(torch.tensor(a)))
    s_k, s_t = kiln.linalg.slogdet(kiln.tensor(a)), torch.linalg.slogdet(torch.tensor(a))
    close(s_k.sign, s_t.sign)
    close(s_k.logabsdet, s_t.logabsdet)


@pytest.mark.parametrize("a", [[[1.0, 2.0], [2.0, 4.0]], [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [5.0, 7.0, 9.0]],
                               [[0.0, 0.0], [0.0, 1.0]]])
def test_det_of_a_singular_matrix(a):
    # 0, with the cofactors as gradient: what torch gives under create_graph (without it, torch gives 0)
    k = kiln.tensor(a, dtype=kiln.float64, requires_grad=True)
    t = torch.tensor(a, dtype=torch.float64, requires_grad=True)
    dk, dt = kiln.linalg.det(k), torch.linalg.det(t)
    close(dk, dt)
    gk, = kiln.autograd.grad(dk, [k], create_graph=True)
    gt, = torch.autograd.grad(dt, [t], create_graph=True)
    close(gk, gt)
    assert np.isfinite(gk.detach().numpy()).all()


@pytest.mark.parametrize("shape", [(4, 4), (2, 3, 3, 3)])
@pytest.mark.parametrize("upper", [False, True])
def test_cholesky(shape, upper):
    sym = lambda f: (lambda b: f(b @ b.transpose(-1, -2) + shape[-1] * eye(b, shape[-1])))  # noqa: E731
    b = rand(shape, 7)
    compare(sym(lambda a: kiln.linalg.cholesky(a, upper=upper)), sym(lambda a: torch.linalg.cholesky(a, upper=upper)),
            [b])
    compare(sym(lambda a: kiln.linalg.cholesky_ex(a, upper=upper).L),
            sym(lambda a: torch.linalg.cholesky_ex(a, upper=upper).L), [b])
    # torch.cholesky is gone from torch: kiln.cholesky (its old API) against linalg.cholesky
    compare(sym(lambda a: kiln.cholesky(a, upper)), sym(lambda a: torch.linalg.cholesky(a, upper=upper)), [b])
    rhs = rand(shape[:-1] + (2,), 8)
    compare(lambda x, y: kiln.cholesky_solve(y, kiln.linalg.cholesky(spd_of(x), upper=upper), upper),
            lambda x, y: torch.cholesky_solve(y, torch.linalg.cholesky(spd_of(x), upper=upper), upper), [b, rhs])
    compare(lambda x: kiln.cholesky_inverse(kiln.linalg.cholesky(spd_of(x), upper=upper), upper),
            lambda x: torch.cholesky_inverse(torch.linalg.cholesky(spd_of(x), upper=upper), upper), [b])


def eye(like, n):
    if isinstance(like, torch.Tensor):
        return torch.eye(n, dtype=like.dtype)
    return kiln.eye(n, dtype=like.dtype)


def spd_of(b):
    return b @ b.transpose(-1, -2) + b.shape[-1] * eye(b, b.shape[-1])


def test_cholesky_solve_broadcasts_b():
    # the factor through tril: torch's gradient w.r.t. L is the full-matrix formula, nonzero above the
    # diagonal that its forward never reads; Kiln's is 0 there (docs/python.md)
    compare(lambda l, y: kiln.cholesky_solve(y, kiln.tril(l)), lambda l, y: torch.cholesky_solve(y, torch.tril(l)),
            [shifted((2, 3, 3), 9), rand((4, 1, 3, 2), 10)])


@pytest.mark.parametrize("upper", [False, True])
@pytest.mark.parametrize("left", [False, True])
@pytest.mark.parametrize("unit", [False, True])
def test_solve_triangular(upper, left, unit):
    b_shape = (2, 4, 3) if left else (2, 3, 4)
    compare(lambda a, b: kiln.linalg.solve_triangular(a, b, upper=upper, left=left, unitriangular=unit),
            lambda a, b: torch.linalg.solve_triangular(a, b, upper=upper, left=left, unitriangular=unit),
            [shifted((4, 4), 11), rand(b_shape, 12)])


@pytest.mark.parametrize("transpose", [False, True])
def test_triangular_solve_old_api(transpose):
    compare(lambda b, a: tuple(kiln.triangular_solve(b, a, upper=False, transpose=transpose)),
            lambda b, a: tuple(torch.triangular_solve(b, a, upper=False, transpose=transpose)),
            [rand((3, 4, 2), 13), shifted((3, 4, 4), 14)])


@pytest.mark.parametrize("shape", [(4, 4), (2, 3, 5, 5)])
def test_lu_factor_and_lu_solve(shape):
    a = rand(shape, 15) + 0.5 * np.eye(shape[-1])  # pivoting happens: no dominant diagonal
    fk = kiln.linalg.lu_factor(kiln.tensor(a))
    ft = torch.linalg.lu_factor(torch.tensor(a))
    assert fk.pivots.dtype == kiln.int32
    np.testing.assert_array_equal(fk.pivots.numpy(), ft.pivots.numpy())
    close(fk.LU, ft.LU)
    compare(lambda x: kiln.linalg.lu_factor(x).LU, lambda x: torch.linalg.lu_factor(x).LU, [a])
    n = shape[-1]
    for left in (True, False):
        for adjoint in (False, True):
            b = rand(shape[:-2] + ((n, 2) if left else (2, n)), 16)
            compare(lambda x, y: kiln.linalg.lu_solve(*kiln.linalg.lu_factor(x), y, left=left, adjoint=adjoint),
                    lambda x, y: torch.linalg.lu_solve(*torch.linalg.lu_factor(x), y, left=left, adjoint=adjoint),
                    [a, b], tol=1e-9)


@pytest.mark.parametrize("n", [-1, -2, -3, 0, 2])
def test_matrix_power(n):
    second = n != 0  # n = 0: the identity, whose zero gradient has no graph in Kiln
    compare(lambda a: kiln.linalg.matrix_power(a, n), lambda a: torch.linalg.matrix_power(a, n),
            [shifted((2, 3, 3), 17)], second=second)
    compare(lambda a: a.matrix_power(n), lambda a: a.matrix_power(n), [shifted((3, 3), 18)], second=second)


def test_float32():
    a = shifted((3, 4, 4), 19).astype(np.float32)
    for fk, ft in ((kiln.linalg.inv, torch.linalg.inv), (kiln.linalg.det, torch.linalg.det),
                   (lambda x: kiln.linalg.solve(x, x[0]), lambda x: torch.linalg.solve(x, x[0]))):
        out = fk(kiln.tensor(a))
        assert out.dtype == kiln.float32
        close(out, ft(torch.tensor(a)), 1e-4)


SINGULAR = np.array([[1.0, 2.0], [2.0, 4.0]])


@pytest.mark.parametrize("kfn,tfn", [
    (kiln.linalg.inv, torch.linalg.inv),
    (lambda a: kiln.linalg.solve(a, a[..., 0]), lambda a: torch.linalg.solve(a, a[..., 0])),
    (kiln.linalg.lu_factor, torch.linalg.lu_factor),
    (kiln.linalg.cholesky, torch.linalg.cholesky),
])
@pytest.mark.parametrize("batched", [False, True])
def test_singular_errors_name_the_op_as_torch(kfn, tfn, batched):
    a = np.stack([np.eye(2), SINGULAR]) if batched else SINGULAR
    with pytest.raises(RuntimeError) as te:
        tfn(torch.tensor(a))
    with pytest.raises(kiln.KilnError) as ke:
        kfn(kiln.tensor(a))
    # torch's message up to its first full stop (its lu_factor one goes on about linalg.lu)
    want = str(te.value).replace("torch.linalg.", "linalg.").split(". ")[0]
    assert want in str(ke.value)


@pytest.mark.parametrize("fn", [kiln.linalg.inv, kiln.linalg.det, kiln.linalg.cholesky, kiln.logdet,
                                kiln.linalg.lu_factor, lambda a: kiln.linalg.solve(a, a)])
def test_non_square_and_dtype_errors(fn):
    with pytest.raises(kiln.KilnError, match="must be batches of square matrices, but they are 2 by 3 matrices"):
        fn(kiln.ones([2, 3], dtype=kiln.float64))
    with pytest.raises(kiln.KilnError, match="Low precision dtypes not supported"):
        fn(kiln.eye(2, dtype=kiln.float16))
    with pytest.raises(kiln.KilnError, match="Expected a floating point tensor"):
        fn(kiln.eye(2, dtype=kiln.int64))


def test_shape_errors():
    with pytest.raises(kiln.KilnError, match=r"linalg.solve: Incompatible shapes of A and B for the equation XA = B"):
        kiln.linalg.solve(kiln.eye(2, dtype=kiln.float64), kiln.ones([2], dtype=kiln.float64), left=False)
    with pytest.raises(kiln.KilnError, match="linalg.solve: Incompatible shapes of A and B for the equation AX = B"):
        kiln.linalg.solve(kiln.eye(2, dtype=kiln.float64), kiln.ones([3], dtype=kiln.float64))
    with pytest.raises(kiln.KilnError, match="linalg.solve_triangular: Expected A and B to have the same dtype"):
        kiln.linalg.solve_triangular(kiln.eye(2, dtype=kiln.float64), kiln.ones([2, 1]), upper=True)
    with pytest.raises(kiln.KilnError, match="linalg.lu_solve: pivots should be a Tensor of dtype int32"):
        kiln.linalg.lu_solve(kiln.eye(2), kiln.ones([2], dtype=kiln.int64), kiln.ones([2, 1]))


def test_cholesky_ex_info():
    a = np.stack([np.eye(2), [[1.0, 2.0], [2.0, 1.0]], -np.eye(2)])
    np.testing.assert_array_equal(kiln.linalg.cholesky_ex(kiln.tensor(a)).info.numpy(),
                                  torch.linalg.cholesky_ex(torch.tensor(a)).info.numpy())


@pytest.mark.parametrize("bshape,ashape", [((3, 2, 1), (2, 2)), ((2, 1), (3, 2, 2)), ((4, 1, 2, 3), (5, 2, 2))])
def test_triangular_solve_broadcasts_cloned_coefficient_as_torch(bshape, ashape):
    # cloned_coefficient is A broadcast to the batch of the solution, as torch's (Kiln returned A's own shape)
    b, a = rand(bshape, 31), np.triu(shifted(ashape, 32))
    for transpose in (False, True):
        ko = kiln.triangular_solve(kiln.tensor(b), kiln.tensor(a), transpose=transpose)
        to = torch.triangular_solve(torch.tensor(b), torch.tensor(a), transpose=transpose)
        close(ko.solution, to.solution)
        close(ko.cloned_coefficient, to.cloned_coefficient)


def test_matrix_power_negative_n_errors_as_torch():
    # a negative n checks what matrix_power needs before inverting, with torch's messages (Kiln reported
    # non-square A as linalg.inv's error)
    for n in (-1, 2):
        with pytest.raises(RuntimeError) as te:
            torch.linalg.matrix_power(torch.ones(2, 3, dtype=torch.float64), n)
        with pytest.raises(kiln.KilnError) as ke:
            kiln.linalg.matrix_power(kiln.ones([2, 3], dtype=kiln.float64), n)
        assert str(te.value) in str(ke.value)
        with pytest.raises(RuntimeError) as te:
            torch.linalg.matrix_power(torch.ones(3, dtype=torch.float64), n)
        with pytest.raises(kiln.KilnError) as ke:
            kiln.linalg.matrix_power(kiln.ones([3], dtype=kiln.float64), n)
        assert str(te.value) in str(ke.value)
    with pytest.raises(NotImplementedError, match="Expected a floating point"):
        torch.linalg.matrix_power(torch.ones(3, 3, dtype=torch.int64), -1)
    with pytest.raises(kiln.KilnError, match="linalg.matrix_power: n=-1 < 0 inverts A .*Expected a floating point"):
        kiln.linalg.matrix_power(kiln.ones([3, 3], dtype=kiln.int64), -1)
    a = shifted((2, 3, 3), 33)
    close(kiln.linalg.matrix_power(kiln.tensor(a), -2), torch.linalg.matrix_power(torch.tensor(a), -2))
    close(kiln.tensor(a).matrix_power(-3), torch.tensor(a).matrix_power(-3))


def rank_deficient(seed):  # 3 x 3, the third row the sum of the others: det is 0 only up to rounding
    x = rand((2, 3), seed)
    return np.concatenate([x, x.sum(0, keepdims=True)])


@pytest.mark.parametrize("a", [np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [5.0, 7.0, 9.0]])] +
                         [rank_deficient(s) for s in range(6)] +
                         [np.stack([shifted((3, 3), 1), rank_deficient(7)])])
def test_det_second_derivative_at_numerically_singular_matrices(a):
    # Kiln's LU gives these a det of ~1e-15, not 0: the gradient's branch is chosen by a tolerance on U's
    # diagonal (the SVD adjugate), so the second derivative is torch's, not det A^-T's rounding noise.
    compare(kiln.linalg.det, torch.linalg.det, [a], tol=1e-8)


def test_det_backward_exactly_singular_large():
    a = np.eye(96)
    a[3] = 0
    k = kiln.tensor(a, dtype=kiln.float64, requires_grad=True)
    t = torch.tensor(a, dtype=torch.float64, requires_grad=True)
    # under create_graph torch gives the adjugate (without it, 0): one SVD here, not n^2 minors' dets
    gk, = kiln.autograd.grad(kiln.linalg.det(k), [k], create_graph=True)
    gt, = torch.autograd.grad(torch.linalg.det(t), [t], create_graph=True)
    close(gk, gt)
    assert gk.detach().numpy()[3, 3] == 1


@pytest.mark.parametrize("a", [[[4.0, 1.0], [3.0, 5.0]], [[1.0, 2.0], [5.0, 1.0]], [[4.0, 1.0, 1.0], [3.0, 5.0, 2.0],
                                                                                     [1.0, 1.0, -9.0]],
                               [[np.nan, 0.0], [0.0, 1.0]], [[4.0, 0.0], [np.nan, 1.0]], [[4.0, 0.0], [np.inf, 1.0]]])
@pytest.mark.parametrize("upper", [False, True])
def test_cholesky_ex_reads_torchs_triangle_and_fails_as_torch(a, upper):
    # Not symmetric: lower reads the lower triangle, upper the upper one; a failed factorization returns
    # LAPACK's partial factor; a NaN pivot fails (info), an inf one does not.
    rk = kiln.linalg.cholesky_ex(kiln.tensor(a, dtype=kiln.float64), upper=upper)
    rt = torch.linalg.cholesky_ex(torch.tensor(a, dtype=torch.float64), upper=upper)
    np.testing.assert_array_equal(rk.info.numpy(), rt.info.numpy())
    np.testing.assert_allclose(rk.L.numpy(), rt.L.numpy(), rtol=1e-12, atol=1e-12)
    if rt.info.item() == 0:
        close(kiln.cholesky(kiln.tensor(a, dtype=kiln.float64), upper),
              torch.linalg.cholesky(torch.tensor(a, dtype=torch.float64), upper=upper))


def test_cholesky_of_nan_fails_as_torch():
    with pytest.raises(kiln.KilnError, match=r"the leading minor of order 1 is not positive-definite"):
        kiln.linalg.cholesky(kiln.tensor([[np.nan, 0.0], [0.0, 1.0]], dtype=kiln.float64))


@pytest.mark.parametrize("fn", ["slogdet", "logdet"])
def test_slogdet_logdet_gradient_at_a_singular_matrix(fn):
    # torch's lu_solve through a zero pivot: inf entries, not an error naming linalg.inv
    a = [[1.0, 2.0], [2.0, 4.0]]
    k = kiln.tensor(a, dtype=kiln.float64, requires_grad=True)
    t = torch.tensor(a, dtype=torch.float64, requires_grad=True)
    if fn == "slogdet":
        kiln.linalg.slogdet(k).logabsdet.backward()
        torch.linalg.slogdet(t).logabsdet.backward()
    else:
        kiln.logdet(k).backward()
        torch.logdet(t).backward()
    np.testing.assert_array_equal(k.grad.numpy(), t.grad.numpy())


def test_lu_solve_pivots_shape_as_torch():
    lu = np.broadcast_to(np.eye(4), (3, 4, 4)).copy()
    for piv in [np.ones((5, 4)), np.ones(4)]:
        with pytest.raises(RuntimeError) as et:
            torch.linalg.lu_solve(torch.tensor(lu), torch.tensor(piv, dtype=torch.int32), torch.zeros(3, 4, 1,
                                                                                                     dtype=torch.float64))
        with pytest.raises(kiln.KilnError) as ek:
            kiln.linalg.lu_solve(kiln.tensor(lu), kiln.tensor(piv, dtype=kiln.int32), kiln.zeros([3, 4, 1],
                                                                                                  dtype=kiln.float64))
        assert str(et.value) in str(ek.value)
