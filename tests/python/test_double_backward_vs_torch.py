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


def test_second_derivative_through_a_nested_backward_is_refused_never_wrong():
    # checkpoint's backward runs a backward of its own (conv2d's, once refused here, now records).
    x = kiln.randn(1, 2, 5, 5, requires_grad=True)
    conv = kiln.nn.Conv2d(2, 3, 3)
    y = kiln.autograd.checkpoint(lambda t: conv(t).pow(2), x)
    (g,) = kiln.autograd.grad(y.sum(), x, create_graph=True)
    with pytest.raises(kiln.KilnError, match="second derivatives of checkpoint are not implemented"):
        kiln.autograd.grad(g.sum(), x)


# ---- .grad after backward(create_graph=True) and Tensor.unfold (review findings) ----

def test_create_graph_grads_are_their_own_memory():
    # add's backward gives one tensor to both inputs; a later backward must not write into both.
    res = []
    for lib in (kiln, torch):
        a = lib.ones(3, dtype=lib.float64, requires_grad=True)
        b = lib.ones(3, dtype=lib.float64, requires_grad=True)
        c = lib.full((3,), 2.0, dtype=lib.float64)
        ((a + b) * c).sum().backward(create_graph=True)
        (a * 3).sum().backward()
        # A broadcast gradient (sum's backward) and the caller's gradient are copied too.
        w = lib.ones(2, 2, dtype=lib.float64, requires_grad=True)
        w.sum().backward(create_graph=True)
        w.sum().backward()
        v = lib.full((2,), 5.0, dtype=lib.float64)
        u = lib.ones(2, dtype=lib.float64, requires_grad=True)
        (u + 0.0).backward(v, create_graph=True)
        with lib.no_grad():
            u.grad.zero_()  # as zero_grad(set_to_none=False): the caller's v must keep its values
        res.append((a.grad.detach().clone(), b.grad.detach().clone(), w.grad.detach().clone(), v.clone()))
    for k, t in zip(res[0], res[1]):
        close(k, t)


def test_unfold_second_derivative():
    xk, xt = pair((6,), 31)
    wk, wt = pair((3,), 32)

    def f(x, w):
        return (((x.unfold(0, 3, 1) * w).sum(-1)) ** 2).sum() + (x ** 3).sum()

    (gk,) = kiln.autograd.grad(f(xk, wk), xk, create_graph=True)
    (gt,) = torch.autograd.grad(f(xt, wt), xt, create_graph=True)
    close(gk, gt)
    for a, b in zip(kiln.autograd.grad(gk.sum(), [xk, wk]), torch.autograd.grad(gt.sum(), [xt, wt])):
        close(a, b)


# ---- softmax, log_softmax, masked_softmax (attention), cross_entropy, nll_loss, layer_norm, group_norm:
# their backwards switch to recorded forms under create_graph, so these differentiate twice.

def _grad(lib, out, inputs, **kw):
    return (kiln if lib is KF else torch).autograd.grad(out, inputs, **kw)


def _class_targets(shape, classes, seed, ignore=None):
    t = np.random.default_rng(seed).integers(0, classes, size=shape)
    if ignore is not None:
        t.flat[::3] = ignore
    return kiln.tensor(t, dtype=kiln.int64), torch.tensor(t, dtype=torch.int64)


CE_CASES = {
    "mean": dict(),
    "sum_smoothing": dict(reduction="sum", label_smoothing=0.2),
    "none_ignore": dict(reduction="none", ignore_index=1),
    "mean_ignore_smoothing": dict(ignore_index=2, label_smoothing=0.1),
    "weights_ignore_smoothing": dict(weight=True, ignore_index=0, label_smoothing=0.3),
    "weights_sum": dict(weight=True, reduction="sum"),
    "kdim_mean": dict(kdim=True, label_smoothing=0.1),
    "kdim_weights_none": dict(kdim=True, weight=True, reduction="none", ignore_index=3),
}


@pytest.mark.parametrize("case", sorted(CE_CASES))
@pytest.mark.parametrize("loss", ["cross_entropy", "nll_loss"])
def test_gradient_penalty_through_a_classifier_loss(case, loss):
    # || d loss / d x ||^2 of a small classifier, differentiated w.r.t. its weights and the input.
    opts = dict(CE_CASES[case])
    kdim, use_weight = opts.pop("kdim", False), opts.pop("weight", False)
    if loss == "nll_loss":
        opts.pop("label_smoothing", None)
    classes = 4
    xk, xt = pair((6, 5, 3) if kdim else (6, 5), 21)
    wk, wt = pair((classes, 5), 22, 0.7)
    tk, tt = _class_targets((6, 3) if kdim else (6,), classes, 23, opts.get("ignore_index"))
    cwk, cwt = pair((classes,), 24)
    cwk, cwt = (kiln.abs(cwk.detach()) + 0.5), (torch.abs(cwt.detach()) + 0.5)

    def penalty(F, lib, x, w, t, cw):
        h = lib.tanh(x.transpose(1, 2) if kdim else x)
        logits = F.linear(h, w)
        if kdim:
            logits = logits.transpose(1, 2)  # [N, C, d]
        kw = dict(opts, weight=cw if use_weight else None)
        out = F.cross_entropy(logits, t, **kw) if loss == "cross_entropy" else F.nll_loss(
            F.log_softmax(logits, 1), t, **kw)
        (gx,) = _grad(F, out.sum(), x, create_graph=True)
        return (gx * gx).sum()

    pk = penalty(KF, kiln, xk, wk, tk, cwk)
    pt = penalty(torch.nn.functional, torch, xt, wt, tt, cwt)
    close(pk, pt)
    for a, b in zip(kiln.autograd.grad(pk, [wk, xk]), torch.autograd.grad(pt, [wt, xt])):
        close(a, b)


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_hessian_vector_product_through_softmax(op, dim):
    xk, xt = pair((3, 4, 5), 25)
    vk, vt = pair((3, 4, 5), 26)
    wk, wt = pair((3, 4, 5), 27)

    def hvp(F, x, v, w):
        f = (getattr(F, op)(x, dim) * w.detach()).pow(2).sum()
        (g,) = _grad(F, f, x, create_graph=True)
        return _grad(F, (g * v.detach()).sum(), x)[0]

    close(hvp(KF, xk, vk, wk), hvp(torch.nn.functional, xt, vt, wt))


@pytest.mark.parametrize("masked", ["none", "bool", "float", "causal"])
def test_gradient_penalty_through_attention(masked):
    # Scaled dot-product attention: its masked softmax differentiates twice (w.r.t. q, k, v).
    qk, qt = pair((2, 2, 4, 3), 28)
    kk, kt = pair((2, 2, 5, 3), 29)
    vk, vt = pair((2, 2, 5, 3), 30)
    m = np.random.default_rng(31).random((4, 5)) > 0.3
    m[:, 0] = True
    kw_k, kw_t = {}, {}
    if masked == "bool":
        kw_k["attn_mask"], kw_t["attn_mask"] = kiln.tensor(m), torch.tensor(m)
    elif masked == "float":
        fm = np.random.default_rng(32).standard_normal((4, 5))
        kw_k["attn_mask"], kw_t["attn_mask"] = kiln.tensor(fm), torch.tensor(fm)
    elif masked == "causal":
        kw_k["is_causal"] = kw_t["is_causal"] = True

    def torch_sdpa(q, k, v, attn_mask=None, is_causal=False):
        # torch's math form: its fused CPU kernel's backward is not differentiable again.
        s = q @ k.transpose(-1, -2) / np.sqrt(q.shape[-1])
        if is_causal:
            attn_mask = torch.ones(s.shape[-2:], dtype=torch.bool).tril()
        if attn_mask is not None and attn_mask.dtype == torch.bool:
            s = s.masked_fill(~attn_mask, float("-inf"))
        elif attn_mask is not None:
            s = s + attn_mask
        return torch.softmax(s, -1) @ v

    def penalty(F, sdpa, q, k, v, kw):
        out = (sdpa(q, k, v, **kw) ** 2).sum()
        gq, gk = _grad(F, out, [q, k], create_graph=True)
        return (gq * gq).sum() + (gk * gk).sum()

    pk = penalty(KF, KF.scaled_dot_product_attention, qk, kk, vk, kw_k)
    pt = penalty(torch.nn.functional, torch_sdpa, qt, kt, vt, kw_t)
    close(pk, pt)
    for a, b in zip(kiln.autograd.grad(pk, [qk, kk, vk]), torch.autograd.grad(pt, [qt, kt, vt])):
        close(a, b)


@pytest.mark.parametrize("norm", ["layer_norm", "layer_norm_affine", "group_norm"])
def test_gradient_penalty_through_a_norm(norm):
    xk, xt = pair((3, 4, 6), 33)
    gk, gt = pair((4, 6) if norm != "group_norm" else (4,), 34)
    bk, bt = pair(gk.shape, 35)

    def penalty(F, x, g, b):
        if norm == "layer_norm":
            y = F.layer_norm(x, (6,))
        elif norm == "layer_norm_affine":
            y = F.layer_norm(x, (4, 6), g, b)
        else:
            y = F.group_norm(x, 2, g, b)
        out = (y * y * y).sum()
        (gx,) = _grad(F, out, x, create_graph=True)
        return (gx * gx).sum()

    pk = penalty(KF, xk, gk, bk)
    pt = penalty(torch.nn.functional, xt, gt, bt)
    close(pk, pt)
    wrt_k, wrt_t = ([xk], [xt]) if norm == "layer_norm" else ([xk, gk, bk], [xt, gt, bt])
    for a, b in zip(kiln.autograd.grad(pk, wrt_k, materialize_grads=True), torch.autograd.grad(pt, wrt_t)):
        close(a, b)


def test_maml_inner_step_through_layer_norm_and_cross_entropy():
    # One inner SGD step on a LayerNorm classifier with create_graph, then the outer loss's gradient
    # w.r.t. the initial parameters.
    xk, xt = pair((8, 5), 36)
    tk, tt = _class_targets((8,), 3, 37)
    wk, wt = pair((3, 5), 38, 0.5)
    gk, gt = pair((5,), 39)
    bk, bt = pair((5,), 40)

    def outer(F, lib, x, t, w, g, b):
        def loss(x, w, g, b):
            return F.cross_entropy(F.linear(F.layer_norm(x, (5,), g, b), w), t, label_smoothing=0.1)
        gw, gg, gb = _grad(F, loss(x, w, g, b), [w, g, b], create_graph=True)
        return loss(x * 0.5 + 0.1, w - 0.4 * gw, g - 0.4 * gg, b - 0.4 * gb)

    lk = outer(KF, kiln, xk, tk, wk, gk, bk)
    lt = outer(torch.nn.functional, torch, xt, tt, wt, gt, bt)
    close(lk, lt)
    for a, b in zip(kiln.autograd.grad(lk, [wk, gk, bk]), torch.autograd.grad(lt, [wt, gt, bt])):
        close(a, b)
# ---- conv2d, conv_transpose2d, conv1d, conv3d, max_pool2d, avg_pool2d, adaptive_avg_pool2d,
# batch_norm (training and eval) and batch_norm_relu: second derivatives against torch ----


def _cnn_params(seed):
    shapes = {"w1": (6, 2, 3, 3), "b1": (6,), "w2": (6, 3, 2, 3), "gamma": (6,), "beta": (6,), "w3": (4, 6, 3, 3),
              "lw": (1, 16)}
    out = {}
    for i, (name, shape) in enumerate(shapes.items()):
        out[name] = pair(shape, seed + i, 0.4)
    return out


def _cnn(F, x, p, training=True):
    # Grouped, strided, dilated and padded convolutions, a transposed one, the three poolings and
    # batch norm with batch statistics (training) or running ones (eval).
    h = F.conv2d(x, p["w1"], p["b1"], stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2)
    h = F.max_pool2d(F.tanh(h), 2, stride=1, padding=1)
    h = F.conv_transpose2d(h, p["w2"], stride=2, padding=1, output_padding=1, groups=2)
    if training:
        h = F.batch_norm(h, None, None, p["gamma"] + 1, p["beta"], training=True)
    else:
        rm = h.detach().mean((0, 2, 3)) * 0 + 0.1
        rv = h.detach().mean((0, 2, 3)) * 0 + 1.5
        h = F.batch_norm(h, rm, rv, p["gamma"] + 1, p["beta"], training=False)
    h = F.avg_pool2d(F.tanh(h), 3, stride=2, padding=1, count_include_pad=False)
    h = F.conv2d(h, p["w3"], padding=1)
    h = F.adaptive_avg_pool2d(h, (2, 2))
    return F.linear(h.reshape(h.shape[0], -1), p["lw"]).sum()


@pytest.mark.parametrize("training", [True, False])
def test_gradient_penalty_of_a_cnn_through_conv_pooling_and_batch_norm(training):
    # WGAN-GP's penalty through a small critic of convolutions, poolings and batch norm, then its
    # gradient w.r.t. every weight and the input.
    xk, xt = pair((3, 4, 9, 8), 40)
    p = _cnn_params(41)
    pk = {k: v[0] for k, v in p.items()}
    pt = {k: v[1] for k, v in p.items()}

    def penalty(F, lib, x, params):
        (gx,) = lib.autograd.grad(_cnn(F, x, params, training), x, create_graph=True)
        return ((gx * gx).sum((1, 2, 3)).sqrt() - 1).pow(2).mean()

    lk = penalty(KF, kiln, xk, pk)
    lt = penalty(torch.nn.functional, torch, xt, pt)
    close(lk, lt)
    names = sorted(p)
    gk = kiln.autograd.grad(lk, [pk[n] for n in names] + [xk], materialize_grads=True)
    gt = torch.autograd.grad(lt, [pt[n] for n in names] + [xt])
    for n, a, b in zip(names + ["x"], gk, gt):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-10, atol=1e-10, err_msg=n)


def test_maml_step_of_a_cnn_with_conv1d_conv3d_and_batch_norm_relu():
    # One inner SGD step with create_graph through conv1d, conv3d and the fused batch norm + residual
    # + ReLU, then the outer loss's gradient w.r.t. the initial weights.
    x1k, x1t = pair((2, 4, 11), 50)
    x3k, x3t = pair((2, 2, 5, 4, 6), 51)
    w1k, w1t = pair((4, 2, 3), 52, 0.5)
    w3k, w3t = pair((3, 2, 2, 3, 2), 53, 0.5)
    gk_, gt_ = pair((4,), 54, 0.3)

    def bn_relu(F, x, g, res):
        if F is KF:
            return KF.batch_norm_relu(x, None, None, g + 1, g * 0.5, training=True, residual=res)
        return torch.relu(torch.nn.functional.batch_norm(x, None, None, g + 1, g * 0.5, training=True) + res)

    def loss(F, x1, x3, w1, w3, g):
        h = F.conv1d(x1, w1, stride=1, padding=1, groups=2)
        h = bn_relu(F, h, g, x1 * 0.5)
        y = F.conv3d(x3, w3, padding=(1, 0, 1))
        return (h * h).mean() + (F.tanh(y) ** 2).mean()

    def outer(F, lib, x1, x3, w1, w3, g):
        inner = loss(F, x1, x3, w1, w3, g)
        d1, d3, dg = lib.autograd.grad(inner, [w1, w3, g], create_graph=True)
        return loss(F, x1 * 0.7, x3 * 0.7, w1 - 0.3 * d1, w3 - 0.3 * d3, g - 0.3 * dg)

    lk = outer(KF, kiln, x1k, x3k, w1k, w3k, gk_)
    lt = outer(torch.nn.functional, torch, x1t, x3t, w1t, w3t, gt_)
    close(lk, lt)
    for a, b in zip(kiln.autograd.grad(lk, [w1k, w3k, gk_, x1k, x3k], materialize_grads=True),
                    torch.autograd.grad(lt, [w1t, w3t, gt_, x1t, x3t])):
        close(a, b)


def test_hessian_vector_product_through_max_pool2d_scatters_and_gathers():
    # max_pool2d's second derivative: its backward scatters to the argmax, the double backward gathers.
    xk, xt = pair((2, 3, 7, 6), 60)
    vk, vt = pair((2, 3, 7, 6), 61)
    (gk,) = kiln.autograd.grad((KF.max_pool2d(xk, 3, 2, 1) ** 3).sum(), xk, create_graph=True)
    (gt,) = torch.autograd.grad((torch.nn.functional.max_pool2d(xt, 3, 2, 1) ** 3).sum(), xt, create_graph=True)
    close(gk, gt)
    close(kiln.autograd.grad((gk * vk.detach()).sum(), xk)[0], torch.autograd.grad((gt * vt.detach()).sum(), xt)[0])
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


def test_16_bit_batch_norm_gradient_under_create_graph_as_accurate_as_the_plain_one():
    # The recorded backward computes in f32 as the kernel does (in f16 its statistics lost digits:
    # relative error 1.1e-3 against the kernel's 7.9e-4 for this input).
    a = np.random.default_rng(1).standard_normal((32, 4, 8, 8)) * 3 + 5
    v = np.random.default_rng(2).standard_normal((32, 4, 8, 8))

    def grad(dt, create_graph):
        x = kiln.tensor(a, dtype=dt).requires_grad_(True)
        y = KF.batch_norm(x, None, None, training=True)
        (g,) = kiln.autograd.grad((y * y * kiln.tensor(v, dtype=dt)).sum(), [x], create_graph=create_graph)
        return g.detach().double().numpy()

    ref = grad(kiln.float64, False)
    scale = np.abs(ref).max()
    plain = np.abs(grad(kiln.float16, False) - ref).max() / scale
    recorded = np.abs(grad(kiln.float16, True) - ref).max() / scale
    assert recorded <= 1.1 * plain, (recorded, plain)


# ---- relu, leaky_relu, hardtanh, relu6: the mask's input reached with derivative 0 (zeros, not unused) ----
@pytest.mark.parametrize("name", ["relu", "leaky_relu", "hardtanh", "relu6"])
def test_piecewise_linear_second_derivative_reaches_the_input_as_torch(name):
    # torch's threshold/leaky_relu/hardtanh backward ops depend on the saved input with derivative 0:
    # grad of the gradient w.r.t. x is zeros, where a mask from a comparison alone would leave x unused.
    xs = [[1.0, -2.0, 3.0, 0.25, 7.0]]
    ws = [[0.5, 1.0], [2.0, -1.0], [1.0, 1.0], [-0.5, 3.0], [1.5, 0.25]]
    got = []
    for lib, f in ((torch, getattr(torch.nn.functional, name)), (kiln, getattr(KF, name))):
        x = lib.tensor(xs, dtype=lib.float64, requires_grad=True)
        w = lib.tensor(ws, dtype=lib.float64, requires_grad=True)
        (g,) = lib.autograd.grad((f(x) @ w).sum(), x, create_graph=True)
        assert g.requires_grad
        h, hw = lib.autograd.grad((g * g).sum(), [x, w])
        got.append((np.array(h.detach().tolist()), np.array(hw.detach().tolist())))
    np.testing.assert_array_equal(got[1][0], got[0][0])
    np.testing.assert_allclose(got[1][1], got[0][1], rtol=1e-12, atol=0)


def test_huber_second_derivative_at_delta_as_torch():
    # Quadratic strictly inside delta, as torch's: at |x - y| = delta the second derivative is the linear side's 0.
    got = []
    for lib in (torch, kiln):
        x = lib.tensor([1.0, -2.0, 3.0, 0.25, -1.0], dtype=lib.float64, requires_grad=True)
        y = lib.nn.functional.huber_loss(x, lib.zeros_like(x), reduction="sum", delta=1.0)
        (g,) = lib.autograd.grad(y, x, create_graph=True)
        (h,) = lib.autograd.grad(g.sum(), x)
        got.append((g.detach().tolist(), h.tolist()))
    assert got[1] == got[0]
