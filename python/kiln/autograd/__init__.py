"""kiln.autograd: backward and grad over several tensors, custom functions with a Python backward
(Function), and gradcheck against finite differences."""
import functools
import inspect

from .. import _C
from .._C import Tensor, KilnError
from .._tensor import _a_type, no_grad

def _tensors(x, what):
    """A tensor or a sequence of them (or Nones, for gradients) as a list."""
    if x is None or isinstance(x, Tensor):
        return [x]
    try:
        return list(x)
    except TypeError:
        raise TypeError(f"{what} must be a kiln.Tensor or a sequence of them, got {type(x).__name__}") from None


def backward(tensors, grad_tensors=None, retain_graph=None, create_graph=False):
    """Backward from several outputs at once (each a tensor or a sequence of tensors, as torch):
    leaves accumulate .grad. grad_tensors: one gradient (or None for a one-element output) each.
    create_graph=True records the backward too: .grad can then be differentiated again (as torch,
    it keeps the graph, and the .grad keeps it alive until it is reset: prefer grad())."""
    tensors = _tensors(tensors, "backward: tensors")
    grads = None if grad_tensors is None else _tensors(grad_tensors, "backward: grad_tensors")
    if retain_graph is None:
        retain_graph = create_graph
    _C.backward(tensors, grads, bool(retain_graph), bool(create_graph))


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
    if retain_graph is None:
        retain_graph = create_graph
    res = _C.grad(outs, ins, gos, retain_graph=bool(retain_graph), create_graph=bool(create_graph))
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
    """Checks fn's gradients against central differences in float64: fn(*inputs) -> a tensor, or a
    tuple/list of outputs whose floating-point tensors are each checked (the others skipped, as torch).
    As torch, only the inputs with requires_grad=True are checked; they are copied to float64
    leaves; inputs other than tensors are passed to fn as they are. A difference within atol +
    rtol * |numerical| passes; a larger one only within a loose allowance for the rounding of large
    outputs, and not where that allowance is as large as the gradient (fails as unresolvable).
    Returns True, or raises GradcheckError with the input (its position among the arguments),
    element and both values (False with raise_exception=False)."""
    if isinstance(inputs, Tensor):
        inputs = (inputs,)
    inputs = list(inputs)
    differentiate = [isinstance(x, Tensor) and x.requires_grad for x in inputs]
    if not any(differentiate):
        raise ValueError("gradcheck: no input requires grad, so there is nothing to check; as torch, only the "
                         "inputs with requires_grad=True are checked (x.requires_grad_())")
    # The engine gets None in place of each argument that is not a tensor (so the input it names is
    # the argument's position); the argument itself (a scale, a flag) goes back there in each call.
    at = [i for i, x in enumerate(inputs) if isinstance(x, Tensor)]

    def call(xs):
        args = list(inputs)
        for i in at:
            args[i] = xs[i]
        return fn(*args)

    given = [x if isinstance(x, Tensor) else None for x in inputs]
    with no_grad():
        first = fn(*inputs)
    if isinstance(first, (tuple, list)):
        # Several outputs (as torch): each floating-point tensor among them is checked on its own, the
        # others (integer indices, counts, None) are not differentiable and are skipped, as torch's.
        checked = [k for k, y in enumerate(first) if isinstance(y, Tensor) and y.dtype.is_floating_point]
        if not checked:
            raise ValueError(f"gradcheck: the function returned {len(first)} outputs, none of them a floating-point "
                             "kiln.Tensor, so there is nothing to check")
        msg = ""
        for k in checked:
            def one(xs, k=k):
                out = call(xs)
                if not isinstance(out, (tuple, list)) or len(out) != len(first):
                    raise ValueError(f"gradcheck: the function returned {len(first)} outputs on its first call and "
                                     f"{len(out) if isinstance(out, (tuple, list)) else 'one'} on a later one")
                return out[k]
            msg = _C._gradcheck(one, given, eps, atol, rtol, max_checks, differentiate)
            if msg:
                msg = f"output {k} (of {len(first)}): {msg}"
                break
    else:
        msg = _C._gradcheck(call, given, eps, atol, rtol, max_checks, differentiate)
    if msg:
        if raise_exception:
            raise GradcheckError(msg)
        return False
    return True


class FunctionCtx:
    """What forward leaves for backward: save_for_backward(*tensors) / saved_tensors,
    needs_input_grad (one flag per forward argument), and any attribute set on it. Tensors are
    saved detached and checked for in-place changes when read back. As torch's, it also takes
    mark_non_differentiable, mark_dirty and set_materialize_grads."""

    def save_for_backward(self, *tensors):
        for i, t in enumerate(tensors):
            if t is not None and not isinstance(t, Tensor):
                raise TypeError(f"save_for_backward can only save tensors (or None), but argument {i} is of "
                                f"type {type(t).__name__}; keep other values as attributes of ctx")
        self._saved = [(None, 0) if t is None else (t.detach(), t._version) for t in tensors]
        self._originals = tensors  # for their history; Function.apply lets go of them once forward is done

    def _mark(self, what, tensors):
        for i, t in enumerate(tensors):
            if not isinstance(t, Tensor):
                raise TypeError(f"ctx.{what} takes tensors, but argument {i} is of type {type(t).__name__}")
        return getattr(self, "_" + what, ()) + tuple(tensors)

    def mark_non_differentiable(self, *tensors):
        """These outputs of forward get no gradient (as torch): they do not require grad, and backward
        gets zeros for them (None with set_materialize_grads(False))."""
        self._mark_non_differentiable = self._mark("mark_non_differentiable", tensors)

    def mark_dirty(self, *tensors):
        """These inputs were modified in place by forward and are returned as outputs (as torch): the
        output is the input itself, whose history becomes this Function's; saving it
        (save_for_backward) saves that output. Refused for a leaf that requires grad, and for a tensor
        whose memory another tensor holds (a view of it, the tensor it is a view of, or another alias
        such as a detach(); Kiln cannot move that tensor's history too): clone() it first. Tensors
        autograd saved for an earlier op's backward may hold it: that backward then fails, as torch's,
        saying the tensor was modified in place."""
        self._mark_dirty = self._mark("mark_dirty", tensors)

    def set_materialize_grads(self, value):
        """With False, backward gets None for an output no gradient reached, instead of zeros (as torch)."""
        self._materialize = bool(value)

    @property
    def saved_tensors(self):
        out = []
        for i, (t, version) in enumerate(getattr(self, "_saved", [])):
            if t is not None and t._version != version:
                raise KilnError(f"saved tensor {i} of {self._name} was modified in place after it was saved "
                                f"(version {version}, now {t._version})")
            out.append(t if t is None else self._history[i].unpack(self._name))
        return tuple(out)


def once_differentiable(backward):
    """Decorates a Function's backward (under @staticmethod) as torch.autograd.function's does: it
    runs without recording, and a second derivative through the Function (a backward with
    create_graph, differentiated again) is an error naming it rather than a silently missing term.
    Without it, a backward with create_graph records the ops backward runs, so they must be kiln
    ops on the tensors it is given."""
    @functools.wraps(backward)
    def wrapper(ctx, *grads):
        with no_grad():
            return backward(ctx, *grads)

    wrapper._kiln_once_differentiable = True
    return wrapper


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
    a non-tensor output) and returns one per forward argument (None for inputs that need none; a
    non-tensor argument must get None, as torch; extra trailing Nones are ignored). torch 2's style
    works too: forward(*args) without ctx plus setup_context(ctx, inputs, output). Keep tensors for
    backward with ctx.save_for_backward, not as ctx attributes (an output held there would keep its
    own graph alive)."""

    @staticmethod
    def forward(ctx, *args, **kwargs):
        raise NotImplementedError("a kiln.autograd.Function subclass must define forward")

    @staticmethod
    def backward(ctx, *grads):
        raise NotImplementedError("a kiln.autograd.Function subclass must define backward")

    @staticmethod
    def setup_context(ctx, inputs, output):
        """torch 2's style: define it, and forward(*args) takes no ctx; setup_context(ctx, inputs,
        output) then gets the forward's arguments (a tuple, bound to forward's signature as torch
        binds them: keywords and defaults included) and what it returned."""
        raise NotImplementedError("setup_context is not defined: forward takes ctx first")

    @classmethod
    def apply(cls, *args, **kwargs):
        ctx = FunctionCtx()
        ctx._name = cls.__name__
        torch2 = cls.setup_context is not Function.setup_context
        if torch2:
            # As torch: forward's signature binds the arguments, defaults included, so setup_context's
            # inputs (and backward's gradients, one per argument) cover keywords and defaults too.
            try:
                bound = inspect.signature(cls.forward).bind(*args, **kwargs)
            except TypeError as e:
                raise TypeError(f"{cls.__name__}.apply: the arguments do not fit forward's signature: {e}") from None
            bound.apply_defaults()
            args, kwargs = bound.args, bound.kwargs
        for k, v in kwargs.items():
            # backward returns one gradient per positional argument: a keyword's would be lost silently
            if isinstance(v, Tensor) and v.requires_grad and _C.is_grad_enabled():
                raise KilnError(f"{cls.__name__}.apply: the tensor passed as {k}= requires grad; pass it "
                                "positionally (backward returns one gradient per positional argument)")
        ctx.needs_input_grad = tuple(isinstance(a, Tensor) and a.requires_grad for a in args)
        with no_grad():
            if torch2:  # torch 2's style: forward without ctx, then setup_context
                out = cls.forward(*args, **kwargs)
                cls.setup_context(ctx, args, out)
            else:
                out = cls.forward(ctx, *args, **kwargs)
        # As torch, the saved tensors' versions are taken once forward is done: a tensor saved and then
        # modified in forward (an input marked dirty) is saved as it is returned.
        ctx._saved = [(t, 0 if t is None else t._version) for t, _ in getattr(ctx, "_saved", [])]
        # With create_graph, saved_tensors come back with their history (an output's is this
        # Function's node, recognised when it records below).
        saved_originals = ctx.__dict__.pop("_originals", ())
        ctx._history = [None if t is None else _C._SavedTensor(t) for t in saved_originals]
        name = cls.__name__
        single = isinstance(out, Tensor)
        if not single and not isinstance(out, (tuple, list)):
            raise KilnError(f"{name}.forward must return a kiln.Tensor or a tuple of them, got {type(out).__name__}")
        outs = (out,) if single else tuple(out)
        if not outs:
            raise KilnError(f"{name}.forward returned no tensors (an empty {type(out).__name__})")
        # What ctx marked; ctx lets go of the tensors (backward's closure holds ctx).
        non_diff = ctx.__dict__.pop("_mark_non_differentiable", ())
        dirty = ctx.__dict__.pop("_mark_dirty", ())
        materialize = ctx.__dict__.pop("_materialize", True)
        for t in dirty:
            if not any(t is o for o in outs):
                raise KilnError(f"{name}.forward marked a tensor dirty (ctx.mark_dirty) but did not return it; as "
                                "torch, an input modified in place must be one of the outputs")
        dirty_in = [i for i, a in enumerate(args) if isinstance(a, Tensor) and any(a is t for t in dirty)]
        # As torch, other values among the outputs pass through as they are and get no gradient
        # (backward still gets one argument per output: None for them), and so do the outputs
        # marked non-differentiable (backward gets zeros for them, or None without materialize).
        tensor_at = [k for k, o in enumerate(outs) if isinstance(o, Tensor) and not any(o is t for t in non_diff)]
        non_diff_at = [k for k, o in enumerate(outs) if isinstance(o, Tensor) and k not in tensor_at]
        n_outs = len(outs)
        # An input returned as it is gets a new handle, so that its own graph is not overwritten;
        # one marked dirty is returned itself, and its history becomes this Function's below.
        outs = tuple(o.detach() if isinstance(o, Tensor) and any(o is a for a in args)
                     and not any(o is t for t in dirty) else o for o in outs)
        non_diff_meta = {k: (tuple(outs[k].shape), outs[k].dtype, outs[k].device) for k in non_diff_at}
        positions = [i for i, a in enumerate(args) if isinstance(a, Tensor)]
        recording = _C.is_grad_enabled() and any(ctx.needs_input_grad)
        if recording:
            for i in dirty_in:
                a = args[i]
                if a.requires_grad and a.is_leaf:
                    raise KilnError(f"{name}.forward modified input {i} in place (ctx.mark_dirty), a leaf that "
                                    "requires grad: as torch, a leaf that requires grad cannot be modified in "
                                    "place; pass a copy (x.clone())")
                # The ctx's own saved tensors and those autograd keeps for backward (whose version
                # counter catches a stale one) may hold its memory; anything else is refused.
                shared = _C._shared_memory(a, [t for t, _ in getattr(ctx, "_saved", []) if t is not None])
                if shared:
                    raise KilnError(f"{name}.forward modified input {i} in place (ctx.mark_dirty), which {shared}: "
                                    "Kiln moves the history of the input alone, so that tensor's gradient would "
                                    "be wrong; pass a copy (x.clone())")
        for k in non_diff_at:
            if outs[k].requires_grad:  # an input returned as it is, marked non-differentiable
                outs = outs[:k] + (outs[k].detach(),) + outs[k + 1:]
        if tensor_at and recording:
            n_args = len(args)
            # What backward's results are checked against; the closure holds shapes and type names,
            # not the inputs.
            shapes = {i: tuple(args[i].shape) for i in positions}
            kinds = {i: type(a).__name__ for i, a in enumerate(args) if i not in shapes}

            def run_backward(grads, needs, reached):
                full = [None] * n_outs
                for k, g, r in zip(tensor_at, grads, reached):
                    full[k] = g if r or materialize else None
                if materialize:
                    for k, (shape, dtype, device) in non_diff_meta.items():
                        full[k] = _C.zeros(*shape, dtype=dtype, device=device)
                res = cls.backward(ctx, *full)
                if not isinstance(res, tuple):
                    res = (res,)
                # As torch: extra trailing Nones are fine, anything else must be one per argument.
                if len(res) > n_args and all(r is None for r in res[n_args:]):
                    res = res[:n_args]
                if len(res) != n_args:
                    raise KilnError(f"{name}.backward returned {len(res)} values for {n_args} forward arguments "
                                    "(one per argument; only extra trailing Nones are allowed)")
                for i, kind in kinds.items():
                    if res[i] is not None:  # as torch: a gradient for a number would be dropped silently
                        raise KilnError(f"{name}.backward returned a gradient different than None at position "
                                        f"{i + 1}, but the corresponding forward input was not a tensor (a {kind}, "
                                        f"given {_a_type(res[i])}); return None there")
                for i in positions:
                    g = res[i]
                    if isinstance(g, Tensor) and not _expandable(shapes[i], tuple(g.shape)):
                        raise KilnError(f"{name}.backward returned a gradient of shape {tuple(g.shape)} for input {i}, "
                                        f"which has shape {shapes[i]} (as torch, a gradient may be larger only by "
                                        "broadcasting: it is summed down)")
                return tuple(res[i] for i in positions)

            # A saved tensor that forward modified in place (marked dirty) is this Function's output,
            # which Kiln cannot tell its saved copy apart from: its second derivative is refused too.
            once = getattr(cls.backward, "_kiln_once_differentiable", False) or any(
                t is not None and any(t is d for d in dirty) for t in saved_originals)
            _C._record_function(name, [args[i] for i in positions], [outs[k] for k in tensor_at], run_backward,
                                bool(dirty_in), once)
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


from . import functional, function  # noqa: E402  (they use grad and Function above)
