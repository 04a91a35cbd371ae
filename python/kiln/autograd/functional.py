"""kiln.autograd.functional: torch.autograd.functional's vjp, jvp, jacobian, hessian, vhp and hvp,
over Kiln's reverse mode. jvp is the double-vjp trick (a vjp with a placeholder vector, then the
gradient of that w.r.t. the placeholder), as torch's, so it needs the ops' backwards to be
differentiable (an op whose backward is a kernel of its own refuses, naming itself); so do hessian,
vhp and hvp. jacobian builds one row per output element (reverse mode) or one column per input
element (forward mode, by jvp); `vectorize` is accepted and changes nothing but speed in torch, so
the results are the same here."""
from .. import _C
from .._C import Tensor
from . import grad as _grad


def _tuple(x, what, fn_name):
    """(was it a single tensor, the tensors as a tuple), with torch's TypeError otherwise."""
    if isinstance(x, Tensor):
        return True, (x,)
    if not isinstance(x, (tuple, list)):
        raise TypeError(f"The {what} given to {fn_name} must be either a Tensor or a tuple of Tensors but the "
                        f"value at index 0 has type {type(x)}.")
    for i, t in enumerate(x):
        if not isinstance(t, Tensor):
            raise TypeError(f"The {what} given to {fn_name} must be either a Tensor or a tuple of Tensors but the "
                            f"value at index {i} has type {type(t)}.")
    return False, tuple(x)


def _untuple(single, xs):
    return xs[0] if single else tuple(xs)


def _prepare(inputs, create_graph):
    """Inputs that require grad for the function to run on: still attached to their own graph with
    create_graph (as torch, so the results can be differentiated w.r.t. the caller's tensors), else
    detached copies."""
    out = []
    for t in inputs:
        if create_graph and t.requires_grad:
            out.append(t.view_as(t))
        else:
            out.append(t.detach().requires_grad_(True))
    return tuple(out)


def _tuple_outputs(res, fn_name):
    if isinstance(res, Tensor):
        return True, (res,)
    if isinstance(res, (tuple, list)) and all(isinstance(t, Tensor) for t in res):
        return False, tuple(res)
    raise TypeError(f"The outputs of the user-provided function given to {fn_name} must be either a Tensor or a "
                    f"tuple of Tensors but the given outputs of the user-provided function has type {type(res)}.")


def _check_v(v, against, fn_name, what="v"):
    single, vs = _tuple(v, f"{what}", fn_name)
    if len(vs) != len(against):
        raise RuntimeError(f"The given {what} should contain a single Tensor." if len(against) == 1 else
                           f"{what} is a tuple of invalid length: should be {len(against)} but got {len(vs)}.")
    for i, (a, b) in enumerate(zip(vs, against)):
        if tuple(a.shape) != tuple(b.shape):
            raise RuntimeError(f"Entry {i} in {what} has invalid size: should be {tuple(b.shape)} but got "
                               f"{tuple(a.shape)}.")
    return vs


def _independent(i):
    return (f"The output of the user-provided function is independent of input {i}. This is not allowed in "
            "strict mode.")


def _input_vector(v, inputs, fn_name):
    """v as a tuple matching the inputs; None only for one single-element input (then ones)."""
    if v is None:
        if len(inputs) != 1 or inputs[0].numel() != 1:
            raise RuntimeError("The vector v can only be None if the input to the user-provided function is a "
                               "single Tensor with a single element.")
        return (_C.ones_like(inputs[0]),)
    return _check_v(v, inputs, fn_name)


def _grads(outputs, inputs, grad_outputs, create_graph, strict, retain_graph=None, message=_independent):
    """d(outputs . grad_outputs)/d inputs; an input the outputs do not reach gets zeros (torch's
    non-strict mode) or, with strict, torch's RuntimeError (message(i))."""
    pairs = [(o, g) for o, g in zip(outputs, grad_outputs) if o.requires_grad]
    res = [None] * len(inputs)
    if pairs:
        res = list(_grad([o for o, _ in pairs], list(inputs), [g for _, g in pairs], create_graph=create_graph,
                         retain_graph=True if retain_graph is None else retain_graph, allow_unused=True))
    for i, g in enumerate(res):
        if g is None:
            if strict:
                raise RuntimeError(message(i))
            res[i] = _C.zeros_like(inputs[i])
    return res


def _finish(xs, create_graph):
    return tuple(x if create_graph else x.detach() for x in xs)


def vjp(func, inputs, v=None, create_graph=False, strict=False):
    """(func(*inputs), v^T J): the vector-Jacobian product, as torch.autograd.functional.vjp. v may be
    None only when func returns one single-element tensor."""
    single_in, inputs = _tuple(inputs, "inputs", "vjp")
    inputs = _prepare(inputs, create_graph)
    single_out, outputs = _tuple_outputs(func(*inputs), "vjp")
    if v is None:
        if len(outputs) != 1 or outputs[0].numel() != 1:
            raise RuntimeError("The vector v can only be None if the user-provided function returns a single "
                               "Tensor with a single element.")
        vs = (_C.ones_like(outputs[0]),)
    else:
        vs = _check_v(v, outputs, "vjp")
    res = _grads(outputs, inputs, vs, create_graph, strict)
    return _untuple(single_out, _finish(outputs, create_graph)), _untuple(single_in, _finish(res, create_graph))


def jvp(func, inputs, v=None, create_graph=False, strict=False):
    """(func(*inputs), J v): the Jacobian-vector product, by the double-vjp trick as torch's. v may
    be None only when there is one single-element input."""
    single_in, inputs = _tuple(inputs, "inputs", "jvp")
    inputs = _prepare(inputs, create_graph)
    vs = _input_vector(v, inputs, "jvp")
    single_out, outputs = _tuple_outputs(func(*inputs), "jvp")
    # u: placeholders for the output vector; g(u) = J^T u is linear in u, so d(g . v)/du = J v.
    us = tuple(_C.zeros_like(o).requires_grad_(True) for o in outputs)
    g = _grads(outputs, inputs, us, True, strict)
    res = _grads(g, us, vs, create_graph, strict)
    return _untuple(single_out, _finish(outputs, create_graph)), _untuple(single_out, _finish(res, create_graph))


def _one_hot(like, j):
    e = _C.zeros(like.numel(), dtype=like.dtype, device=like.device)
    e[j] = 1
    return e.reshape(tuple(like.shape))


def _jacobian(func, inputs, create_graph, strict, strategy, fn_name):
    """The Jacobian blocks [output i][input k], each of shape out_i.shape + in_k.shape."""
    single_in, inputs = _tuple(inputs, "inputs", fn_name)
    inputs = _prepare(inputs, create_graph)
    single_out, outputs = _tuple_outputs(func(*inputs), fn_name)
    blocks = [[None] * len(inputs) for _ in outputs]
    if strategy == "reverse-mode":
        for i, o in enumerate(outputs):
            rows = [[] for _ in inputs]
            for j in range(o.numel()):
                vs = [_one_hot(o, j) if k == i else _C.zeros_like(q) for k, q in enumerate(outputs)]
                gs = _grads(outputs, inputs, vs, create_graph, strict, message=lambda k, i=i: (
                    f"Output {i} of the user-provided function is independent of input {k}. This is not allowed "
                    "in strict mode."))
                for k, g in enumerate(gs):
                    rows[k].append(g.reshape(-1))
            for k, x in enumerate(inputs):
                flat = _C.stack(rows[k], 0) if rows[k] else _C.zeros(0, x.numel(), dtype=x.dtype, device=x.device)
                blocks[i][k] = flat.reshape(tuple(o.shape) + tuple(x.shape))
    else:
        for k, x in enumerate(inputs):
            cols = [[] for _ in outputs]
            for j in range(x.numel()):
                vs = tuple(_one_hot(x, j) if m == k else _C.zeros_like(q) for m, q in enumerate(inputs))
                _, jv = jvp(func, tuple(inputs), vs, create_graph=create_graph, strict=strict)
                jv = (jv,) if isinstance(jv, Tensor) else jv
                for i, c in enumerate(jv):
                    cols[i].append(c.reshape(-1))
            for i, o in enumerate(outputs):
                flat = _C.stack(cols[i], 1) if cols[i] else _C.zeros(o.numel(), 0, dtype=o.dtype, device=o.device)
                blocks[i][k] = flat.reshape(tuple(o.shape) + tuple(x.shape))
    blocks = [[b if create_graph else b.detach() for b in row] for row in blocks]
    if single_out:
        return _untuple(single_in, blocks[0])
    return tuple(_untuple(single_in, row) for row in blocks)


def _check_strategy(strategy, what):
    if strategy not in ("forward-mode", "reverse-mode"):
        raise ValueError(f'Expected {what} to be either "forward-mode" or "reverse-mode".')


def jacobian(func, inputs, create_graph=False, strict=False, vectorize=False, strategy="reverse-mode"):
    """The Jacobian of func at inputs, as torch.autograd.functional.jacobian: a tensor of shape
    output.shape + input.shape, or tuples of them ([output][input]) for tuples."""
    _check_strategy(strategy, "strategy")
    if strategy == "forward-mode" and not vectorize:
        raise ValueError("torch.autograd.functional.jacobian: `strategy=\"forward-mode\"` is only implemented "
                         "when `vectorize=True`.")
    if strategy == "forward-mode" and strict:
        raise RuntimeError("torch.autograd.functional.jacobian: `strict=True` and `strategy=\"forward-mode\"` are "
                           "not supported together (yet). Please either set `strict=False` or "
                           "`strategy=\"reverse-mode\"`.")
    return _jacobian(func, inputs, create_graph, strict, strategy, "jacobian")


def _scalar_output(func, fn_name):
    def checked(*inp):
        res = func(*inp)
        single, outs = _tuple_outputs(res, fn_name)
        if not single or outs[0].numel() != 1:
            raise RuntimeError(f"The Tensor returned by the function given to {fn_name} should contain a single "
                               "element")
        return outs[0].reshape(())
    return checked


def hessian(func, inputs, create_graph=False, strict=False, vectorize=False, outer_jacobian_strategy="reverse-mode"):
    """The Hessian of a scalar func at inputs, as torch.autograd.functional.hessian: a tensor of shape
    input.shape + input.shape, or a tuple of tuples [i][j] for a tuple of inputs."""
    _check_strategy(outer_jacobian_strategy, "outer_jacobian_strategy")
    if outer_jacobian_strategy == "forward-mode" and not vectorize:
        raise ValueError("torch.autograd.functional.hessian: `outer_jacobian_strategy=\"forward-mode\"` is only "
                         "implemented when `vectorize=True`.")
    scalar = _scalar_output(func, "hessian")
    single_in, ins = _tuple(inputs, "inputs", "hessian")

    def first(*inp):
        g = _jacobian(scalar, inp, True, strict, "reverse-mode", "hessian")  # one block per input
        return g[0] if single_in else tuple(g)

    res = _jacobian(first, inputs, create_graph, strict, outer_jacobian_strategy, "hessian")
    if single_in:
        return res
    return tuple(tuple(row) for row in res)


def vhp(func, inputs, v=None, create_graph=False, strict=False):
    """(func(*inputs), v^T H) for a scalar func, as torch.autograd.functional.vhp."""
    return _hessian_product(func, inputs, v, create_graph, strict, "vhp")


def hvp(func, inputs, v=None, create_graph=False, strict=False):
    """(func(*inputs), H v) for a scalar func, as torch.autograd.functional.hvp (the Hessian of a
    twice continuously differentiable func is symmetric, so this is v^T H transposed: one
    double backward, where torch's hvp takes two)."""
    return _hessian_product(func, inputs, v, create_graph, strict, "hvp")


def _hessian_product(func, inputs, v, create_graph, strict, fn_name):
    single_in, inputs = _tuple(inputs, "inputs", fn_name)
    inputs = _prepare(inputs, create_graph)
    single_out, outs = _tuple_outputs(func(*inputs), fn_name)
    if not single_out or outs[0].numel() != 1:
        raise RuntimeError(f"The Tensor returned by the function given to {fn_name} should contain a single element")
    out = outs[0]
    vs = _input_vector(v, inputs, fn_name)
    g = _grads((out,), inputs, (_C.ones_like(out),), True, strict)
    res = _grads(g, inputs, vs, create_graph, strict, message=lambda i: (
        f"The Tensor returned by the function given to {fn_name} is independent of input {i}. This is not "
        "allowed in strict mode."))
    return _finish((out,), create_graph)[0], _untuple(single_in, _finish(res, create_graph))
