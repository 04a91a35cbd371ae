"""kiln.autograd: backward and grad over several tensors, custom functions with a Python backward
(Function), and gradcheck against finite differences."""
from . import _C
from ._C import Tensor, KilnError
from ._tensor import no_grad

def _tensors(x, what):
    """A tensor or a sequence of them (or Nones, for gradients) as a list."""
    if x is None or isinstance(x, Tensor):
        return [x]
    try:
        return list(x)
    except TypeError:
        raise TypeError(f"{what} must be a kiln.Tensor or a sequence of them, got {type(x).__name__}") from None


def backward(tensors, grad_tensors=None, retain_graph=None):
    """Backward from several outputs at once (each a tensor or a sequence of tensors, as torch):
    leaves accumulate .grad. grad_tensors: one gradient (or None for a one-element output) each."""
    tensors = _tensors(tensors, "backward: tensors")
    grads = None if grad_tensors is None else _tensors(grad_tensors, "backward: grad_tensors")
    _C.backward(tensors, grads, bool(retain_graph))


def grad(outputs, inputs, grad_outputs=None, retain_graph=None, create_graph=False, allow_unused=None,
         materialize_grads=False):
    """The gradients of outputs with respect to inputs (each a tensor or a sequence of them), without
    touching .grad, as torch's: an input the outputs do not reach (or reach with no gradient) is an
    error unless allow_unused=True, then its gradient is None; materialize_grads=True gives zeros
    for it instead (and implies allow_unused)."""
    if materialize_grads and allow_unused is False:
        raise ValueError("autograd.grad: materialize_grads=True needs allow_unused=True or left out "
                         "(an unused input gets zeros)")
    if allow_unused is None:
        allow_unused = materialize_grads
    outs = _tensors(outputs, "autograd.grad: outputs")
    ins = _tensors(inputs, "autograd.grad: inputs")
    gos = None if grad_outputs is None else _tensors(grad_outputs, "autograd.grad: grad_outputs")
    res = _C.grad(outs, ins, gos, retain_graph=bool(retain_graph), create_graph=create_graph)
    for i, g in enumerate(res):
        if g is None and not allow_unused:
            raise KilnError(f"autograd.grad: input {i} appears to not have been used in the graph (no gradient "
                            "reaches it); pass allow_unused=True for None, or materialize_grads=True for zeros")
    if materialize_grads:
        res = tuple(_C.zeros_like(x) if g is None else g for g, x in zip(res, ins))
    return res


class GradcheckError(KilnError):
    """An analytic gradient disagrees with the finite-difference one."""


def gradcheck(fn, inputs, *, eps=1e-6, atol=1e-5, rtol=1e-3, max_checks=0, raise_exception=True):
    """Checks fn's gradients against central differences in float64: fn(*inputs) -> one tensor.
    As torch, only the inputs with requires_grad=True are checked; they are copied to float64
    leaves. Returns True, or raises GradcheckError with the input, element and both values (False
    with raise_exception=False)."""
    if isinstance(inputs, Tensor):
        inputs = (inputs,)
    inputs = list(inputs)
    differentiate = [isinstance(x, Tensor) and x.requires_grad for x in inputs]
    if not any(differentiate):
        raise ValueError("gradcheck: no input requires grad, so there is nothing to check; as torch, only the "
                         "inputs with requires_grad=True are checked (x.requires_grad_())")
    msg = _C._gradcheck(lambda xs: fn(*xs), inputs, eps, atol, rtol, max_checks, differentiate)
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
        for i, t in enumerate(tensors):
            if t is not None and not isinstance(t, Tensor):
                raise TypeError(f"save_for_backward can only save tensors (or None), but argument {i} is of "
                                f"type {type(t).__name__}; keep other values as attributes of ctx")
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

    forward runs without gradient recording and returns a tensor or a tuple (values other than
    tensors in it pass through and get no gradient); backward gets one gradient per output (None for
    a non-tensor output) and returns one per forward argument (None for non-tensors or inputs that
    need none; extra trailing Nones are ignored, as torch). Keep tensors for backward
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
        # As torch, other values among the outputs pass through as they are and get no gradient
        # (backward still gets one argument per output: None for them).
        tensor_at = [k for k, o in enumerate(outs) if isinstance(o, Tensor)]
        n_outs = len(outs)
        # An input returned as it is gets a new handle, so that its own graph is not overwritten.
        outs = tuple(o.detach() if isinstance(o, Tensor) and any(o is a for a in args) else o for o in outs)
        positions = [i for i, a in enumerate(args) if isinstance(a, Tensor)]
        if tensor_at and _C.is_grad_enabled() and any(ctx.needs_input_grad):
            n_args = len(args)
            # What backward's results are checked against; the closure holds shapes, not the inputs.
            shapes = {i: tuple(args[i].shape) for i in positions}

            def run_backward(grads, needs):
                full = [None] * n_outs
                for k, g in zip(tensor_at, grads):
                    full[k] = g
                res = cls.backward(ctx, *full)
                if not isinstance(res, tuple):
                    res = (res,)
                # As torch: extra trailing Nones are fine, anything else must be one per argument.
                if len(res) > n_args and all(r is None for r in res[n_args:]):
                    res = res[:n_args]
                if len(res) != n_args:
                    raise KilnError(f"{name}.backward returned {len(res)} values for {n_args} forward arguments "
                                    "(one per argument; only extra trailing Nones are allowed)")
                for i in positions:
                    g = res[i]
                    if isinstance(g, Tensor) and not _expandable(shapes[i], tuple(g.shape)):
                        raise KilnError(f"{name}.backward returned a gradient of shape {tuple(g.shape)} for input {i}, "
                                        f"which has shape {shapes[i]} (as torch, a gradient may be larger only by "
                                        "broadcasting: it is summed down)")
                return tuple(res[i] for i in positions)

            _C._record_function(name, [args[i] for i in positions], [outs[k] for k in tensor_at], run_backward)
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
