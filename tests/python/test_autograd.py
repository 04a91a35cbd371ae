# Autograd from Python: gradients against finite differences computed here, kiln.autograd.gradcheck,
# custom Functions, grad mode, hooks, and the errors of a misused graph.
import numpy as np
import pytest

import kiln
from kiln.autograd import Function, gradcheck, GradcheckError


def numerical_grad(f, x, eps=1e-6):
    """Central differences of the scalar f over a float64 NumPy array x."""
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        xp, xm = x.copy(), x.copy()
        xp[i] += eps
        xm[i] -= eps
        g[i] = (f(xp) - f(xm)) / (2 * eps)
    return g


@pytest.mark.parametrize("expr", [
    lambda x: (x * x).sum(),
    lambda x: (x.sin() * x.exp()).mean(),
    lambda x: (x @ x.T).tanh().sum(),
    lambda x: kiln.nn.functional.softmax(x, 1)[:, 0].sum(),
    lambda x: kiln.nn.functional.layer_norm(x, (4,)).pow(3).sum(),
    lambda x: x[1:, ::2].sigmoid().prod(),
    lambda x: kiln.logsumexp(x, dim=0).sum() + x.norm(),
])
def test_backward_against_finite_differences(expr):
    rng = np.random.default_rng(1)
    a = rng.normal(size=(3, 4))
    x = kiln.tensor(a, requires_grad=True)
    expr(x).backward()
    expect = numerical_grad(lambda v: expr(kiln.tensor(v)).item(), a)
    np.testing.assert_allclose(x.grad.numpy(), expect, rtol=1e-5, atol=1e-7)


def test_gradcheck_ops():
    F = kiln.nn.functional
    x = kiln.randn(2, 3, 5, 5).double()
    w = kiln.randn(4, 3, 3, 3).double()
    assert gradcheck(lambda a, b: F.conv2d(a, b, padding=1, stride=2), (x, w), max_checks=20)
    assert gradcheck(lambda a: F.gelu(a, approximate="tanh"), (kiln.randn(6).double(),))
    assert gradcheck(lambda a: F.cross_entropy(a, kiln.tensor([0, 2])), (kiln.randn(2, 3).double(),))


def test_gradcheck_reports_a_wrong_gradient():
    class Wrong(Function):
        @staticmethod
        def forward(ctx, x):
            return x * x

        @staticmethod
        def backward(ctx, g):
            return g  # should be 2 x g

    x = kiln.tensor([1.0, 2.0], dtype=kiln.float64)
    with pytest.raises(GradcheckError, match="input 0"):
        gradcheck(lambda a: Wrong.apply(a), (x,))
    assert gradcheck(lambda a: Wrong.apply(a), (x,), raise_exception=False) is False


class Cube(Function):
    @staticmethod
    def forward(ctx, x, scale):
        ctx.save_for_backward(x)
        ctx.scale = scale
        return x * x * x * scale

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * 3 * x * x * ctx.scale, None


def test_custom_function():
    x = kiln.tensor([1.0, -2.0, 0.5], requires_grad=True)
    y = Cube.apply(x, 2.0)
    assert y.grad_fn == "Cube"
    (y.sum() * 2).backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * 3 * x.detach().numpy() ** 2 * 2.0)
    assert gradcheck(lambda a: Cube.apply(a, 0.5), (kiln.randn(5).double(),))
    with kiln.no_grad():
        assert Cube.apply(x, 1.0).grad_fn is None


def test_custom_function_two_outputs_and_errors():
    class SplitScale(Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2, x * 3

        @staticmethod
        def backward(ctx, ga, gb):
            return ga * 2 + gb * 3

    x = kiln.ones(2, requires_grad=True)
    a, b = SplitScale.apply(x)
    (a.sum() + b.sum() * 10).backward()
    assert x.grad.tolist() == [32.0, 32.0]

    class BadCount(Function):
        @staticmethod
        def forward(ctx, x):
            return x + 1

        @staticmethod
        def backward(ctx, g):
            return g, g

    with pytest.raises(kiln.KilnError, match="2 values for 1 forward"):
        BadCount.apply(kiln.ones(1, requires_grad=True)).sum().backward()

    class Raises(Function):
        @staticmethod
        def forward(ctx, x):
            return x + 1

        @staticmethod
        def backward(ctx, g):
            raise ZeroDivisionError("from backward")

    with pytest.raises(ZeroDivisionError, match="from backward"):
        Raises.apply(kiln.ones(1, requires_grad=True)).sum().backward()

    class Keyword(Function):
        @staticmethod
        def forward(ctx, x, other=None):
            return x * other

        @staticmethod
        def backward(ctx, g):
            return g

    x, o = kiln.ones(2, requires_grad=True), kiln.ones(2, requires_grad=True)
    with pytest.raises(kiln.KilnError, match="passed as other= requires grad; pass it positionally"):
        Keyword.apply(x, other=o)
    assert Keyword.apply(x, other=kiln.ones(2)).shape == (2,)  # a keyword tensor without grad is fine


def test_saved_tensor_modified_in_place():
    class Keep(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * 2

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * 2

    base = kiln.ones(3)
    x = base.clone().requires_grad_()
    y = Keep.apply(x)
    with kiln.no_grad():
        x.add_(kiln.ones(3))
    with pytest.raises(kiln.KilnError, match="modified in place"):
        y.sum().backward()


def test_grad_mode_and_hooks():
    x = kiln.ones(2, requires_grad=True)
    with kiln.no_grad():
        assert not (x * 2).requires_grad
        with kiln.enable_grad():
            assert (x * 2).requires_grad
    assert kiln.is_grad_enabled()

    @kiln.no_grad()
    def f(t):
        return t * 3

    assert not f(x).requires_grad
    seen = []
    hid = x.register_post_accumulate_grad_hook(lambda t: seen.append(t.grad.tolist()))
    (x * 5).sum().backward()
    assert seen == [[5.0, 5.0]]
    x.remove_post_accumulate_grad_hook(hid)
    (x * 5).sum().backward()
    assert len(seen) == 1 and x.grad.tolist() == [10.0, 10.0]
    x.grad = None
    assert x.grad is None


def test_grad_and_retain_graph():
    x = kiln.tensor([1.0, 2.0], requires_grad=True)
    y = (x * x).sum()
    (g,) = kiln.autograd.grad([y], [x], retain_graph=True)
    assert g.tolist() == [2.0, 4.0] and x.grad is None
    y.backward()
    with pytest.raises(kiln.KilnError, match="retain_graph"):
        y.backward()
    z = kiln.ones(1, requires_grad=True)
    gx, gz = kiln.autograd.grad([(x * 2).sum()], [x, z])
    assert gx.tolist() == [2.0, 2.0] and gz.tolist() == [0.0]  # unused: zeros
    with pytest.raises(ValueError, match="no second derivatives"):
        kiln.autograd.grad([(x * x).sum()], [x], create_graph=True)


def test_inplace_on_leaf_refused():
    x = kiln.ones(2, requires_grad=True)
    with pytest.raises(kiln.KilnError, match="requires grad"):
        x += 1
    with kiln.no_grad():
        x -= 0.5  # an optimizer step
    assert x.tolist() == [0.5, 0.5]


def test_ctrl_c_stops_backward_between_kernels():
    import os
    import signal
    import threading

    started = threading.Event()

    class Mark(Function):
        @staticmethod
        def forward(ctx, x):
            return x * 1.0

        @staticmethod
        def backward(ctx, g):
            started.set()  # the first node of the backward pass: the rest runs in C++
            return g

    x = kiln.ones(256, 256, requires_grad=True)
    y = x
    for _ in range(8000):
        y = y * 1.0001
    loss = Mark.apply(y).sum()

    def interrupt():
        started.wait(30)
        os.kill(os.getpid(), signal.SIGINT)

    t = threading.Thread(target=interrupt)
    t.start()
    with pytest.raises(KeyboardInterrupt):
        loss.backward()
    t.join()
    assert x.grad is None  # stopped between kernels, before the leaf's gradient
    z = kiln.ones(2, requires_grad=True)
    (z * 2).sum().backward()  # and the next call runs normally
    assert z.grad.tolist() == [2.0, 2.0]


def test_checkpoint_gives_the_same_gradients_with_dropout():
    import kiln.nn as nn

    def run(recompute):
        kiln.manual_seed(3)
        lin1, lin2 = nn.Linear(8, 16), nn.Linear(16, 4)
        x = kiln.randn(5, 8, requires_grad=True)

        def block(h):
            return lin2(kiln.nn.functional.dropout(kiln.nn.functional.gelu(lin1(h)), 0.3, training=True))

        y = kiln.autograd.checkpoint(block, x) if recompute else block(x)
        (y * y).sum().backward()
        return [t.grad.numpy().copy() for t in (x, lin1.weight, lin1.bias, lin2.weight)]

    plain, again = run(False), run(True)
    for a, b in zip(plain, again):
        assert (a == b).all()


def test_checkpoint_rejects_a_function_that_returns_no_tensor():
    with pytest.raises(kiln.KilnError, match="must return kiln.Tensor"):
        kiln.autograd.checkpoint(lambda x: 3, kiln.ones(2, requires_grad=True))


def test_register_hook_and_retain_grad_as_torch():
    torch = pytest.importorskip("torch")

    def run(lib):
        x = lib.tensor([1.0, -2.0, 3.0], requires_grad=True)
        seen = []
        hx = x.register_hook(lambda g: (seen.append(g.tolist()), g * 2)[1])
        y = x * x
        y.retain_grad()
        y.register_hook(lambda g: g + 1)
        z = y.sum() * 3
        z.retain_grad()
        z.backward()
        first = (x.grad.tolist(), y.grad.tolist(), z.grad.tolist(), list(seen), y.retains_grad)
        hx.remove()
        (x * 4).sum().backward()
        return first, x.grad.tolist(), len(seen)

    assert run(kiln) == run(torch)


def test_register_hook_errors_and_handle():
    x = kiln.ones(2, requires_grad=True)
    with pytest.raises(kiln.KilnError, match="expected kiln.Tensor or None"):
        x.register_hook(lambda g: 3.0)
        (x * 2).sum().backward()
    x = kiln.ones(2, requires_grad=True)

    def boom(g):
        raise KeyError("from the hook")

    h = x.register_hook(boom)
    with pytest.raises(KeyError, match="from the hook"):
        (x * 2).sum().backward()
    with h:  # a handle is a context manager that removes the hook on exit
        pass
    (x * 2).sum().backward()
    assert x.grad.tolist() == [2.0, 2.0]
    with pytest.raises(kiln.KilnError, match="does not require grad"):
        kiln.ones(2).register_hook(lambda g: g)
    y = kiln.ones(2, requires_grad=True) * 2
    handle = y.register_hook(lambda g: g)
    del y
    handle.remove()  # the tensor is gone: nothing to do, no crash
