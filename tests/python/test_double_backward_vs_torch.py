"""Second derivatives (create_graph=True) against torch: gradient penalties, Hessian-vector
products, a MAML-style inner step, .grad after backward(create_graph=True), custom Functions
(saved inputs and outputs) and the refusal of a second derivative through a once-differentiable
backward."""
import numpy as np
import pytest

import kiln
import kiln.nn.functional as KF

torch = pytest.importorskip("torch")


def pair(shape, seed, scale=1.0):
    a = np.random.default_rng(seed).standard_normal(shape) * scale
    return (kiln.tensor(a, dtype=kiln.float64, requires_grad=True),
            torch.tensor(a, dtype=torch.float64, requires_grad=True))


def close(k, t, tol=1e-10):
    np.testing.assert_allclose(k.detach().numpy(), t.detach().numpy(), rtol=tol, atol=tol)


ACTS = {
    "tanh": (kiln.tanh, torch.tanh),
    "sigmoid": (kiln.sigmoid, torch.sigmoid),
    "relu": (KF.relu, torch.relu),
    "gelu": (KF.gelu, torch.nn.functional.gelu),
    "softplus": (KF.softplus, torch.nn.functional.softplus),
    "silu": (KF.silu, torch.nn.functional.silu),
    "elu": (KF.elu, torch.nn.functional.elu),
    "leaky_relu": (lambda x: KF.leaky_relu(x, 0.1), lambda x: torch.nn.functional.leaky_relu(x, 0.1)),
}


@pytest.mark.parametrize("act", sorted(ACTS))
def test_gradient_penalty_of_an_mlp(act):
    # WGAN-GP's penalty: (||d critic(x) / dx|| - 1)^2, differentiated w.r.t. the critic's weights.
    fk, ft = ACTS[act]
    xk, xt = pair((6, 5), 1)
    w1k, w1t = pair((8, 5), 2, 0.5)
    b1k, b1t = pair((8,), 3, 0.1)
    w2k, w2t = pair((1, 8), 4, 0.5)

    def penalty(F, f, x, w1, b1, w2, grad):
        out = F.linear(f(F.linear(x, w1, b1)), w2).sum()
        (gx,) = grad(out, x)
        return ((gx * gx).sum(1).sqrt() - 1).pow(2).mean()

    pk = penalty(KF, fk, xk, w1k, b1k, w2k, lambda o, x: kiln.autograd.grad(o, x, create_graph=True))
    pt = penalty(torch.nn.functional, ft, xt, w1t, b1t, w2t, lambda o, x: torch.autograd.grad(o, x, create_graph=True))
    close(pk, pt)
    # relu's and leaky_relu's derivative is a constant mask: the bias reaches the penalty only
    # through it, so Kiln finds no path (None; materialize_grads gives zeros), where torch gives zeros.
    gk = kiln.autograd.grad(pk, [w1k, b1k, w2k, xk], materialize_grads=True)
    gt = torch.autograd.grad(pt, [w1t, b1t, w2t, xt])
    for a, b in zip(gk, gt):
        close(a, b)


def test_hessian_vector_product_and_full_hessian():
    xk, xt = pair((4,), 5)
    ak, at = pair((4, 4), 6)
    vk, vt = pair((4,), 7)

    def f(x, a, lib):
        return (lib.tanh(a @ x) ** 2).sum() + (x * x * x).sum()

    (gk,) = kiln.autograd.grad(f(xk, ak, kiln), xk, create_graph=True)
    (gt,) = torch.autograd.grad(f(xt, at, torch), xt, create_graph=True)
    close(gk, gt)
    (hvk,) = kiln.autograd.grad((gk * vk.detach()).sum(), xk, retain_graph=True)
    (hvt,) = torch.autograd.grad((gt * vt.detach()).sum(), xt, retain_graph=True)
    close(hvk, hvt)
    # The full Hessian, a row at a time from the one graph (retain_graph), and its symmetry.
    rows = [kiln.autograd.grad(gk[i], xk, retain_graph=True)[0].numpy() for i in range(4)]
    hess = torch.autograd.functional.hessian(lambda x: f(x, at.detach(), torch), xt.detach()).numpy()
    np.testing.assert_allclose(np.stack(rows), hess, rtol=1e-10, atol=1e-10)


def test_maml_inner_step_through_mse():
    # One inner SGD step with create_graph, then the outer loss's gradient w.r.t. the initial weights.
    xk, xt = pair((10, 3), 8)
    yk, yt = pair((10, 2), 9)
    wk, wt = pair((2, 3), 10, 0.5)
    bk, bt = pair((2,), 11, 0.1)

    def outer(F, lib, x, y, w, b):
        inner = F.mse_loss(F.linear(lib.tanh(x), w, b), y)
        gw, gb = (kiln if lib is kiln else torch).autograd.grad(inner, [w, b], create_graph=True)
        w2, b2 = w - 0.3 * gw, b - 0.3 * gb
        return F.mse_loss(F.linear(lib.tanh(x * 0.5), w2, b2), y)

    lk = outer(KF, kiln, xk, yk, wk, bk)
    lt = outer(torch.nn.functional, torch, xt, yt, wt, bt)
    close(lk, lt)
    for a, b in zip(kiln.autograd.grad(lk, [wk, bk]), torch.autograd.grad(lt, [wt, bt])):
        close(a, b)


def test_backward_create_graph_leaves_a_grad_with_history():
    xk, xt = pair((3,), 12)
    firsts = []
    for x, lib in ((xk, kiln), (xt, torch)):
        (lib.sin(x) * x * x).sum().backward(create_graph=True)
        assert x.grad.requires_grad
        firsts.append(x.grad.detach().clone())
        x.grad.sum().backward()  # adds the second derivative's row sums to .grad
    close(*firsts)
    close(xk.grad, xt.grad)


def test_custom_function_saved_input_and_output_differentiate_twice():
    class KExp(kiln.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            y = kiln.exp(x) * w
            ctx.save_for_backward(x, w, y)
            return y

        @staticmethod
        def backward(ctx, g):
            x, w, y = ctx.saved_tensors
            return g * y, g * kiln.exp(x)

    xk, xt = pair((5,), 13)
    wk, wt = pair((5,), 14)
    (gk,) = kiln.autograd.grad(KExp.apply(xk, wk).sum(), xk, create_graph=True)
    gt = (torch.exp(xt) * wt)  # d/dx sum(e^x w) = e^x w
    close(gk, gt)
    hk = kiln.autograd.grad((gk * gk).sum(), [xk, wk])
    ht = torch.autograd.grad((gt * gt).sum(), [xt, wt])
    for a, b in zip(hk, ht):
        close(a, b)


def test_once_differentiable_function_refuses_the_second_derivative():
    class Cube(kiln.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x * x

        @staticmethod
        @kiln.autograd.once_differentiable
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            assert not kiln.is_grad_enabled()
            return g * 3 * x * x

    x = kiln.tensor([1.0, 2.0], requires_grad=True)
    (g,) = kiln.autograd.grad(Cube.apply(x).sum(), x, create_graph=True)
    assert g.tolist() == [3.0, 12.0]
    with pytest.raises(kiln.KilnError, match="Cube, whose backward is not differentiable"):
        kiln.autograd.grad(g.sum(), x)
    # Without create_graph it is an ordinary Function.
    (g,) = kiln.autograd.grad(Cube.apply(x).sum(), x)
    assert g.tolist() == [3.0, 12.0] and not g.requires_grad


def test_second_derivative_through_a_fused_kernel_is_refused_never_wrong():
    x = kiln.randn(1, 2, 5, 5, requires_grad=True)
    conv = kiln.nn.Conv2d(2, 3, 3)
    (g,) = kiln.autograd.grad(conv(x).pow(2).sum(), x, create_graph=True)
    with pytest.raises(kiln.KilnError, match="second derivatives of conv2d are not implemented"):
        kiln.autograd.grad(g.sum(), x)


# ---- second derivatives through index_select, embedding, cumprod (and prod), scatter_reduce ----
def leaves(a, zero_at):
    a = a.copy()
    a[zero_at] = 0.0
    return (kiln.tensor(a, dtype=kiln.float64, requires_grad=True),
            torch.tensor(a, dtype=torch.float64, requires_grad=True))


def ints(values, lib):
    return kiln.tensor(np.array(values, dtype=np.int64)) if lib is kiln else torch.tensor(values, dtype=torch.int64)


@pytest.mark.parametrize("padding_idx", [None, 2])
def test_gradient_penalty_through_embedding_and_index_select(padding_idx):
    # A penalty on the embedding table's gradient, differentiated w.r.t. the table and a projection:
    # its path runs through embedding's and index_select's recorded backwards.
    wk, wt = pair((6, 4), 20)
    ak, at = pair((4, 5), 21, 0.5)

    def penalty(F, lib, w, a):
        ids = ints([[0, 2, 5, 2], [3, 0, 0, 1]], lib)
        h = lib.tanh(F.embedding(ids, w, padding_idx=padding_idx) @ a)
        out = (h.index_select(2, ints([4, 0, 0, 3], lib)) ** 2).sum()
        (gw,) = (kiln if lib is kiln else torch).autograd.grad(out, w, create_graph=True)
        return (gw * gw).sum()

    pk, pt = penalty(KF, kiln, wk, ak), penalty(torch.nn.functional, torch, wt, at)
    close(pk, pt)
    for a, b in zip(kiln.autograd.grad(pk, [wk, ak]), torch.autograd.grad(pt, [wt, at])):
        close(a, b)


@pytest.mark.parametrize("zeros", [0, 1, 3])
def test_gradient_penalty_through_cumprod_and_prod(zeros):
    # Zeros (none, one, several per row) where x / x would divide by zero: the recorded backward
    # is PyTorch's exact product of the others, so the second derivative matches torch's.
    xk, xt = leaves(np.random.default_rng(22).standard_normal((3, 6)), (slice(None), slice(1, 1 + zeros)))
    vk, vt = pair((3, 6), 23)

    def penalty(lib, x, v):
        out = (lib.cumprod(x, 1) * v.detach()).sum() + (x.prod(1) ** 2).sum()
        (g,) = (kiln if lib is kiln else torch).autograd.grad(out, x, create_graph=True)
        return (g * g).sum(), g

    (pk, gk), (pt, gt) = penalty(kiln, xk, vk), penalty(torch, xt, vt)
    close(gk, gt)
    close(pk, pt)
    close(kiln.autograd.grad(pk, xk)[0], torch.autograd.grad(pt, xt)[0])


def test_maml_step_through_scatter_reduce_prod():
    # An inner SGD step on the scattered factors (one of them zero), then the outer loss's gradient
    # w.r.t. the initial factors and the base.
    bk, bt = pair((2, 3), 24)
    sk, st = leaves(np.random.default_rng(25).standard_normal((2, 5)), (0, 0))
    yk, yt = pair((2, 3), 26)

    def outer(lib, b, s, y, include_self):
        idx = ints([[0, 1, 0, 2, 1], [2, 2, 0, 1, 0]], lib)
        loss = lambda s_: ((b.scatter_reduce(1, idx, s_, "prod", include_self=include_self) - y.detach()) ** 2).sum()
        (gs,) = (kiln if lib is kiln else torch).autograd.grad(loss(s), s, create_graph=True)
        return loss(s - 0.1 * gs)

    for include_self in (True, False):
        lk, lt = outer(kiln, bk, sk, yk, include_self), outer(torch, bt, st, yt, include_self)
        close(lk, lt)
        for a, b in zip(kiln.autograd.grad(lk, [sk, bk]), torch.autograd.grad(lt, [st, bt])):
            close(a, b)


def test_scatter_reduce_prod_two_zero_srcs_in_one_place_refuse_the_second_derivative():
    b = kiln.tensor([[1.5, 2.0]], dtype=kiln.float64, requires_grad=True)
    s = kiln.tensor([[0.0, 0.0, 3.0]], dtype=kiln.float64, requires_grad=True)
    idx = kiln.tensor(np.array([[0, 0, 1]], dtype=np.int64))
    out = b.scatter_reduce(1, idx, s, "prod")
    (g,) = kiln.autograd.grad((out * out).sum(), s, create_graph=True)
    assert g.tolist() == [[0.0, 0.0, 24.0]]
    with pytest.raises(kiln.KilnError, match="scatter_reduce .prod. with more than one zero src"):
        kiln.autograd.grad(g.sum(), s)
