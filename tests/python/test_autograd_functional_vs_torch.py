"""kiln.autograd.functional against torch.autograd.functional: vjp, jvp, jacobian (both
strategies), hessian, vhp, hvp, single tensors and tuples, create_graph, strict mode and the
errors for bad arguments."""
import numpy as np
import pytest

import kiln
import kiln.autograd.functional as KAF

torch = pytest.importorskip("torch")
TAF = torch.autograd.functional


def pair(shape, seed):
    a = np.random.default_rng(seed).standard_normal(shape)
    return kiln.tensor(a, dtype=kiln.float64), torch.tensor(a, dtype=torch.float64)


def close(k, t):
    if isinstance(t, (tuple, list)):
        assert isinstance(k, (tuple, list)) and len(k) == len(t), (type(k), type(t))
        for a, b in zip(k, t):
            close(a, b)
        return
    assert isinstance(k, kiln.Tensor), type(k)
    assert tuple(k.shape) == tuple(t.shape)
    np.testing.assert_allclose(k.detach().numpy(), t.detach().numpy(), rtol=1e-10, atol=1e-12)


def f_one(lib):
    return lambda x: lib.tanh(x) * x.sum() + x * x * x


def f_two(lib):
    return lambda x, y: (lib.sin(x) @ y, (x * x).sum() * y)


def scalar(lib):
    return lambda x, y: (lib.tanh(x @ y) ** 2).sum() + (x * x * x).sum() * y.sum()


def test_vjp_and_jvp():
    xk, xt = pair((4,), 1)
    vk, vt = pair((4,), 2)
    close(KAF.vjp(f_one(kiln), xk, vk), TAF.vjp(f_one(torch), xt, vt))
    close(KAF.jvp(f_one(kiln), xk, vk), TAF.jvp(f_one(torch), xt, vt))
    ak, at = pair((3, 4), 3)
    bk, bt = pair((4, 2), 4)
    uk = (pair((3, 2), 5)[0], pair((4, 2), 6)[0])
    ut = (pair((3, 2), 5)[1], pair((4, 2), 6)[1])
    close(KAF.vjp(f_two(kiln), (ak, bk), uk), TAF.vjp(f_two(torch), (at, bt), ut))
    wk = (pair((3, 4), 7)[0], pair((4, 2), 8)[0])
    wt = (pair((3, 4), 7)[1], pair((4, 2), 8)[1])
    close(KAF.jvp(f_two(kiln), (ak, bk), wk), TAF.jvp(f_two(torch), (at, bt), wt))
    # v may be left out for a single-element output (vjp) or input (jvp).
    sk, st = pair((1,), 9)
    close(KAF.vjp(lambda x: (x * x).sum(), sk), TAF.vjp(lambda x: (x * x).sum(), st))
    close(KAF.jvp(lambda x: x * 3, sk), TAF.jvp(lambda x: x * 3, st))


@pytest.mark.parametrize("strategy", ["reverse-mode", "forward-mode"])
def test_jacobian(strategy):
    xk, xt = pair((3,), 10)
    kw = dict(strategy=strategy, vectorize=strategy == "forward-mode")
    close(KAF.jacobian(f_one(kiln), xk, **kw), TAF.jacobian(f_one(torch), xt, **kw))
    ak, at = pair((2, 3), 11)
    bk, bt = pair((3, 2), 12)
    close(KAF.jacobian(f_two(kiln), (ak, bk), **kw), TAF.jacobian(f_two(torch), (at, bt), **kw))
    close(KAF.jacobian(lambda a, b: a @ b, (ak, bk), **kw), TAF.jacobian(lambda a, b: a @ b, (at, bt), **kw))
    close(KAF.jacobian(lambda a: (a.sum(), a * 2), ak, **kw), TAF.jacobian(lambda a: (a.sum(), a * 2), at, **kw))


def test_hessian_vhp_hvp():
    xk, xt = pair((3, 2), 13)
    yk, yt = pair((2, 2), 14)
    close(KAF.hessian(scalar(kiln), (xk, yk)), TAF.hessian(scalar(torch), (xt, yt)))
    one_k = lambda x: (kiln.tanh(x) ** 2).sum() + (x ** 3).sum() ** 2
    one_t = lambda x: (torch.tanh(x) ** 2).sum() + (x ** 3).sum() ** 2
    close(KAF.hessian(one_k, xk), TAF.hessian(one_t, xt))
    vk = (pair((3, 2), 15)[0], pair((2, 2), 16)[0])
    vt = (pair((3, 2), 15)[1], pair((2, 2), 16)[1])
    close(KAF.vhp(scalar(kiln), (xk, yk), vk), TAF.vhp(scalar(torch), (xt, yt), vt))
    close(KAF.hvp(scalar(kiln), (xk, yk), vk), TAF.hvp(scalar(torch), (xt, yt), vt))


def test_create_graph_results_differentiate_again():
    xk, xt = pair((3,), 17)
    xk.requires_grad_(True)
    xt.requires_grad_(True)
    hk = KAF.hessian(lambda x: (x ** 4).sum(), xk, create_graph=True)
    ht = TAF.hessian(lambda x: (x ** 4).sum(), xt, create_graph=True)
    assert hk.requires_grad
    close(kiln.autograd.grad(hk.sum(), xk)[0], torch.autograd.grad(ht.sum(), xt)[0])
    # Without create_graph the results are cut from the graph.
    assert not KAF.jacobian(lambda x: x * x, xk).requires_grad


def test_strict_mode_and_bad_arguments():
    xk, _ = pair((3,), 18)
    yk, _ = pair((3,), 19)
    with pytest.raises(RuntimeError, match="independent of input 1"):
        KAF.vjp(lambda x, y: x * 2, (xk, yk), kiln.ones(3, dtype=kiln.float64), strict=True)
    out, g = KAF.vjp(lambda x, y: x * 2, (xk, yk), kiln.ones(3, dtype=kiln.float64))
    assert g[1].tolist() == [0.0, 0.0, 0.0]
    with pytest.raises(RuntimeError, match="Output 0 of the user-provided function is independent of input 1"):
        KAF.jacobian(lambda x, y: x * 2, (xk, yk), strict=True)
    with pytest.raises(TypeError, match="must be either a Tensor or a tuple of Tensors"):
        KAF.jacobian(lambda x: x, 3.0)
    with pytest.raises(TypeError, match="outputs of the user-provided function"):
        KAF.vjp(lambda x: 3.0, xk, xk)
    with pytest.raises(RuntimeError, match="v can only be None"):
        KAF.vjp(lambda x: x * 2, xk)
    with pytest.raises(RuntimeError, match="invalid size"):
        KAF.vjp(lambda x: x * 2, xk, kiln.ones(2, dtype=kiln.float64))
    with pytest.raises(RuntimeError, match="should contain a single element"):
        KAF.hessian(lambda x: x * 2, xk)
    with pytest.raises(ValueError, match="forward-mode"):
        KAF.jacobian(lambda x: x, xk, strategy="forward-mode")
    # torch's spelling of the decorator's home.
    from kiln.autograd.function import once_differentiable, Function
    assert once_differentiable is kiln.autograd.once_differentiable and Function is kiln.autograd.Function
