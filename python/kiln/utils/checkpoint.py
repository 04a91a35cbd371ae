"""kiln.utils.checkpoint: torch.utils.checkpoint's checkpoint and checkpoint_sequential over Kiln's
activation recomputation (kiln.autograd.checkpoint, the engine's autograd::checkpoint): the forward
keeps only the block's inputs, backward reruns the block with the forward's random draws and
backpropagates through it, so the gradients equal those of the run without checkpointing."""
from .. import _C
from .._C import KilnError, KilnValueError
from .._tensor import Tensor


def checkpoint(function, *args, use_reentrant=None, context_fn=None, determinism_check="default", debug=False,
               preserve_rng_state=True, **kwargs):
    """torch.utils.checkpoint.checkpoint: function(*args, **kwargs) without keeping its intermediate
    tensors for backward. Arguments other than tensors (and kwargs) are passed as they are; function
    must return a tensor or a tuple / list of tensors. use_reentrant (either value) and debug are
    accepted; Kiln always replays the forward's random stream (preserve_rng_state=False is accepted
    and gives the same dropout masks too, which torch does not promise either way). A custom
    context_fn and determinism_check other than "default" are refused."""
    if context_fn is not None:
        raise KilnError("checkpoint: context_fn is not supported by Kiln (leave it None)")
    if determinism_check != "default":
        raise KilnValueError(f"checkpoint: determinism_check must be 'default', got {determinism_check!r}")
    if not callable(function):
        raise KilnValueError(f"checkpoint: function must be callable, got {type(function).__name__}")
    slots = [i for i, a in enumerate(args) if isinstance(a, Tensor)]
    shape = {}

    def run(*tensors):
        full = list(args)
        for i, t in zip(slots, tensors):
            full[i] = t
        out = function(*full, **kwargs)
        if isinstance(out, Tensor):
            shape.setdefault("kind", Tensor)
            return out
        if isinstance(out, (tuple, list)):
            shape.setdefault("kind", type(out))
            for j, o in enumerate(out):
                if not isinstance(o, Tensor):
                    raise KilnValueError(f"checkpoint: function's output {j} is a {type(o).__name__}; Kiln's "
                                         "checkpoint needs every output to be a kiln.Tensor")
            return tuple(out)
        raise KilnValueError(f"checkpoint: function returned a {type(out).__name__}; it must return a kiln.Tensor "
                             "or a tuple / list of them")

    outs = _C._checkpoint(run, [args[i] for i in slots])
    kind = shape.get("kind", tuple)
    if kind is Tensor:
        return outs[0]
    return kind(outs)


def checkpoint_sequential(functions, segments, input, use_reentrant=None, **kwargs):
    """torch.utils.checkpoint.checkpoint_sequential: functions (a Sequential or a list of modules /
    callables) run in `segments` chunks, every chunk but the last checkpointed, as torch splits them."""
    preserve = kwargs.pop("preserve_rng_state", True)
    if kwargs:
        raise KilnValueError(f"checkpoint_sequential: unexpected keyword arguments {sorted(kwargs)}")
    if hasattr(functions, "children") and not isinstance(functions, (list, tuple)):
        functions = list(functions.children())
    functions = list(functions)
    if isinstance(segments, bool) or not isinstance(segments, int) or segments <= 0:
        raise KilnValueError(f"checkpoint_sequential: segments must be an int > 0, got {segments!r}")

    def run_function(start, end):
        def forward(x):
            for j in range(start, end + 1):
                x = functions[j](x)
            return x
        return forward

    segment_size = len(functions) // segments
    end = -1
    for start in range(0, segment_size * (segments - 1), segment_size):
        end = start + segment_size - 1
        input = checkpoint(run_function(start, end), input, use_reentrant=use_reentrant,
                           preserve_rng_state=preserve)
    return run_function(end + 1, len(functions) - 1)(input)
