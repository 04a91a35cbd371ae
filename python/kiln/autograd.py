"""kiln.autograd: backward and grad over several tensors, custom functions with a Python backward
(Function), and gradcheck against finite differences."""
from . import _C
from ._C import Tensor, KilnError
from ._tensor import no_grad

backward = _C.backward
grad = _C.grad


class GradcheckError(KilnError):
    """An analytic gradient disagrees with the finite-difference one."""


def gradcheck(fn, inputs, *, eps=1e-6, atol=1e-5, rtol=1e-3, max_checks=0, raise_exception=True):
    """Checks fn's gradients against central differences in float64: fn(*inputs) -> one tensor.
    Floating inputs are copied to float64 leaves; returns True, or raises GradcheckError with the
    input, element and both values (False with raise_exception=False)."""
    if isinstance(inputs, Tensor):
        inputs = (inputs,)
    msg = _C._gradcheck(lambda xs: fn(*xs), list(inputs), eps, atol, rtol, max_checks)
    if msg:
        if raise_exception:
            raise GradcheckError(msg)
        return False
    return True


class FunctionCtx:
    """What forward leaves for backward: save_for_backward(*tensors) / saved_tensors,
    needs_input_grad (one flag per forward argument), and any attribute set on it. Tensors are
    saved detached and checked for in-place changes when read back."""

    def save_for_backward(self, *tensors):
        self._saved = [(None, 0) if t is None else (t.detach(), t._version) for t in tensors]

    @property
    def saved_tensors(self):
        out = []
        for i, (t, version) in enumerate(getattr(self, "_saved", [])):
            if t is not None and t._version != version:
                raise KilnError(f"saved tensor {i} of {self._name} was modified in place after it was saved "
                                f"(version {version}, now {t._version})")
            out.append(t)
        return tuple(out)


class Function:
    """A differentiable op with a Python forward and backward:

        class Cube(kiln.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                ctx.save_for_backward(x)
                return x * x * x

            @staticmethod
            def backward(ctx, grad):
                (x,) = ctx.saved_tensors
                return grad * 3 * x * x

        y = Cube.apply(x)

    forward runs without gradient recording; backward gets one gradient per output and returns one
    per forward argument (None for non-tensors or inputs that need none). Keep tensors for backward
    with ctx.save_for_backward, not as ctx attributes (an output held there would keep its own
    graph alive)."""

    @staticmethod
    def forward(ctx, *args, **kwargs):
        raise NotImplementedError("a kiln.autograd.Function subclass must define forward")

    @staticmethod
    def backward(ctx, *grads):
        raise NotImplementedError("a kiln.autograd.Function subclass must define backward")

    @classmethod
    def apply(cls, *args, **kwargs):
        ctx = FunctionCtx()
        ctx._name = cls.__name__
        for k, v in kwargs.items():
            # backward returns one gradient per positional argument: a keyword's would be lost silently
            if isinstance(v, Tensor) and v.requires_grad and _C.is_grad_enabled():
                raise KilnError(f"{cls.__name__}.apply: the tensor passed as {k}= requires grad; pass it "
                                "positionally (backward returns one gradient per positional argument)")
        ctx.needs_input_grad = tuple(isinstance(a, Tensor) and a.requires_grad for a in args)
        with no_grad():
            out = cls.forward(ctx, *args, **kwargs)
        name = cls.__name__
        single = isinstance(out, Tensor)
        if not single and not isinstance(out, (tuple, list)):
            raise KilnError(f"{name}.forward must return a kiln.Tensor or a tuple of them, got {type(out).__name__}")
        outs = (out,) if single else tuple(out)
        if not outs:
            raise KilnError(f"{name}.forward returned no tensors (an empty {type(out).__name__})")
        for k, o in enumerate(outs):
            if not isinstance(o, Tensor):
                raise KilnError(f"{name}.forward must return tensors, got {type(o).__name__} as output {k}")
        # An input returned as it is gets a new handle, so that its own graph is not overwritten.
        outs = tuple(o.detach() if any(o is a for a in args) else o for o in outs)
        positions = [i for i, a in enumerate(args) if isinstance(a, Tensor)]
        if _C.is_grad_enabled() and any(ctx.needs_input_grad):
            n_args = len(args)
            # What backward's results are checked against; the closure holds shapes, not the inputs.
            shapes = {i: tuple(args[i].shape) for i in positions}

            def run_backward(grads, needs):
                res = cls.backward(ctx, *grads)
                if not isinstance(res, tuple):
                    res = (res,)
                if len(res) != n_args:
                    raise KilnError(f"{name}.backward returned {len(res)} values for {n_args} forward arguments")
                for i in positions:
                    g = res[i]
                    if isinstance(g, Tensor) and not _expandable(shapes[i], tuple(g.shape)):
                        raise KilnError(f"{name}.backward returned a gradient of shape {tuple(g.shape)} for input {i}, "
                                        f"which has shape {shapes[i]} (as torch, a gradient may be larger only by "
                                        "broadcasting: it is summed down)")
                return tuple(res[i] for i in positions)

            _C._record_function(name, [args[i] for i in positions], list(outs), run_backward)
        return outs[0] if single else outs


def _expandable(shape, to):
    """Whether `shape` broadcasts to `to` (then a gradient of shape `to` sums down to it)."""
    if len(shape) > len(to):
        return False
    return all(a == b or a == 1 for a, b in zip(reversed(shape), reversed(to)))


def checkpoint(fn, *inputs):
    """Activation recomputation: runs fn(*inputs) keeping none of its intermediate tensors for
    backward, only the inputs; backward runs fn again with the same random draws (dropout masks)
    and autocast, and backpropagates through it. Parameters used inside fn get their gradients as
    usual. Less memory for about one more forward pass; on the CPU the gradients are bit-identical.
    Returns what fn returns (a tensor or a tuple of tensors)."""
    outs = _C._checkpoint(fn, list(inputs))
    return outs[0] if len(outs) == 1 else tuple(outs)
