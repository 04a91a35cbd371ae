"""kiln.nn modules in Python: Module (parameters, buffers and submodules by attribute, dotted names,
state_dict, hooks), Parameter, the containers, and the common layers over kiln.nn.functional.
Initialisation follows PyTorch's defaults (uniform in +-1/sqrt(fan_in) for Linear and Conv)."""
import collections
import itertools
import math
import operator
import sys
import warnings
import weakref
from collections import OrderedDict

from .. import _C
from .._C import Tensor, KilnError, KilnValueError
from .._memory_format import _memory_format, channels_last
from ..autograd import Function
from .._tensor import _a_type, no_grad, tensor as _tensor
from . import functional as F


class IncompatibleKeys(collections.namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])):
    """What load_state_dict(strict=False) left out, as torch's named tuple: names of the module's
    tensors the state dict lacks, and names in the state dict the module does not have."""
    __slots__ = ()

    def __repr__(self):
        # As torch's: a load that matched every key says so rather than printing two empty lists.
        if not self.missing_keys and not self.unexpected_keys:
            return "<All keys matched successfully>"
        return super().__repr__()

    __str__ = __repr__


class Parameter(Tensor):
    """A tensor that is a module's parameter: a leaf that requires grad, sharing `data`'s memory (a
    list, a number or a NumPy array is copied into a new tensor first; None gives an empty one)."""

    def __init__(self, data=None, requires_grad=True):
        if data is None:
            data = _C.empty(0)
        elif not isinstance(data, Tensor):
            data = _tensor(data)
        super().__init__(data.detach())
        self.requires_grad_(requires_grad)

    def __setattr__(self, name, value):
        # A Parameter has a __dict__ (for a user's tags, as torch's), which would silently hide a
        # Tensor method under an assigned value; properties (data, grad, requires_grad) are data
        # descriptors and take the assignment themselves.
        attr = getattr(Tensor, name, None)
        if attr is not None and not hasattr(attr, "__set__"):
            raise AttributeError(f"Parameter: cannot assign '{name}': it is a kiln.Tensor "
                                 f"{'method' if callable(attr) else 'attribute'}")
        super().__setattr__(name, value)

    def __repr__(self):
        return "Parameter containing:\n" + super().__repr__()

    def __deepcopy__(self, memo):
        # As torch's Parameter.__deepcopy__: a copy of the data with requires_grad, without .grad (a
        # plain leaf tensor keeps its .grad, as torch's); an EMA or teacher copy starts with none.
        if id(self) in memo:
            return memo[id(self)]
        new = type(self)(self.detach().clone(), self.requires_grad)
        memo[id(self)] = new
        return new


class _HookHandle:
    """What register_forward_hook and friends return: remove() takes the hook off (also as a context
    manager's exit), as torch.utils.hooks.RemovableHandle."""
    _ids = itertools.count()

    def __init__(self, hooks, extra=()):
        self._hooks = weakref.ref(hooks)
        # The flag dicts (with_kwargs, always_call) that hold this hook's id too, as torch's extra_dict.
        self._extra = tuple(weakref.ref(d) for d in extra)
        self.id = next(_HookHandle._ids)

    def remove(self):
        for ref in (self._hooks,) + self._extra:
            hooks = ref()
            if hooks is not None:
                hooks.pop(self.id, None)

    # As torch's RemovableHandle: pickled and deep-copied with the hooks dict itself, so that a copy's
    # handle follows the copy's module (deepcopy's memo gives the dict the module's copy has).
    def __getstate__(self):
        return (self._hooks(), self.id, tuple(ref() for ref in self._extra))

    def __setstate__(self, state):
        hooks, self.id = state[:2]
        self._hooks = weakref.ref(hooks if hooks is not None else _HookDict())
        self._extra = tuple(weakref.ref(d) for d in (state[2] if len(state) > 2 else ()) if d is not None)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()


class _HookDict(OrderedDict):
    pass  # an OrderedDict can't be weakly referenced; a subclass can


def _check_name(kind, name, module, store):
    """torch's checks of a name given to add_module and register_*: a str without dots, not empty,
    not already an attribute of another kind."""
    if not isinstance(name, str):
        raise TypeError(f"{kind} name should be a string, got {type(name).__name__}")
    if "." in name:
        raise KeyError(f"{kind} name can't contain \".\", got: {name}")
    if name == "":
        raise KeyError(f"{kind} name can't be empty string \"\"")
    if hasattr(module, name) and name not in store:
        raise KeyError(f"attribute '{name}' already exists")


class Module:
    """Base class of every module: assign Parameters, Modules and (register_buffer) buffers as
    attributes; forward() computes; calling the module calls the forward pre-hooks, forward and the
    forward hooks."""

    def __init__(self):
        object.__setattr__(self, "training", True)
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_non_persistent_buffers_set", set())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "_forward_pre_hooks", _HookDict())
        object.__setattr__(self, "_forward_hooks", _HookDict())
        object.__setattr__(self, "_backward_hooks", _HookDict())
        # Hook ids registered with_kwargs=True / always_call=True, as torch's dicts of the same names.
        object.__setattr__(self, "_forward_pre_hooks_with_kwargs", _HookDict())
        object.__setattr__(self, "_forward_hooks_with_kwargs", _HookDict())
        object.__setattr__(self, "_forward_hooks_always_called", _HookDict())

    def __setstate__(self, state):
        # pickle and deepcopy: as torch's, a module pickled before the hook flag dicts existed gets
        # empty ones, so that register_forward_hook(with_kwargs=, always_call=) works on it.
        self.__dict__.update(state)
        for name in ("_forward_pre_hooks_with_kwargs", "_forward_hooks_with_kwargs",
                     "_forward_hooks_always_called"):
            if name not in self.__dict__:
                object.__setattr__(self, name, _HookDict())

    # ---- attributes ----
    def __setattr__(self, name, value):
        # As torch's: a Parameter, Module or tensor goes to its store; assigning to a name that holds
        # a parameter, child module or buffer replaces it in place (keeping its position in
        # state_dict) and takes only that kind or None.
        d = self.__dict__
        if "_parameters" not in d:
            raise KilnError(f"{type(self).__name__}: call super().__init__() before assigning attributes")
        params, buffers, modules = self._parameters, self._buffers, self._modules
        if isinstance(value, Parameter):
            _remove_from(name, d, buffers, modules, self._non_persistent_buffers_set)
            self.register_parameter(name, value)
        elif name in params:
            if value is not None:
                raise TypeError(f"cannot assign '{type(value).__name__}' as parameter '{name}' "
                                "(kiln.nn.Parameter or None expected)")
            params[name] = None
        elif isinstance(value, Module):
            _remove_from(name, d, params, buffers, self._non_persistent_buffers_set)
            modules[name] = value
        elif name in modules:
            if value is not None:
                raise TypeError(f"cannot assign '{type(value).__name__}' as child module '{name}' "
                                "(kiln.nn.Module or None expected)")
            modules[name] = None
        elif isinstance(value, Tensor) and getattr(value, "_is_buffer", False) is True:
            # an nn.Buffer (kiln/nn/_more_layers.py): a buffer with its persistent flag, as torch's
            self.register_buffer(name, value, value.persistent)
        elif name in buffers:
            if value is not None and not isinstance(value, Tensor):
                raise TypeError(f"cannot assign '{type(value).__name__}' as buffer '{name}' "
                                "(kiln.Tensor or None expected)")
            buffers[name] = value
        else:
            object.__setattr__(self, name, value)

    def __getattr__(self, name):
        d = self.__dict__
        for store in ("_parameters", "_buffers", "_modules"):
            if store in d and name in d[store]:
                return d[store][name]
        raise AttributeError(f"'{type(self).__name__}' has no attribute '{name}'")

    def __delattr__(self, name):
        for d in (self._parameters, self._buffers, self._modules):
            if name in d:
                del d[name]
                self._non_persistent_buffers_set.discard(name)
                return
        object.__delattr__(self, name)

    def register_parameter(self, name, param):
        """Adds (or replaces, in place) a parameter: a kiln.nn.Parameter, or None (a slot that
        state_dict and parameters() skip, as a Linear's bias=False)."""
        if "_parameters" not in self.__dict__:
            raise AttributeError("cannot assign parameter before Module.__init__() call")
        _check_name("parameter", name, self, self._parameters)
        if param is not None and not isinstance(param, Parameter):
            raise TypeError(f"cannot assign '{type(param).__name__}' object to parameter '{name}' "
                            "(kiln.nn.Parameter or None required)")
        self._parameters[name] = param

    def register_buffer(self, name, tensor, persistent=True):
        """Adds a buffer (a tensor that is state but not a parameter, as running statistics): in
        state_dict unless persistent=False; to() moves it."""
        if "_buffers" not in self.__dict__:
            raise AttributeError("cannot assign buffer before Module.__init__() call")
        _check_name("buffer", name, self, self._buffers)
        if tensor is not None and not isinstance(tensor, Tensor):
            raise TypeError(f"cannot assign '{type(tensor).__name__}' object to buffer '{name}' "
                            "(kiln.Tensor or None required)")
        if getattr(tensor, "_is_buffer", False) is True:
            tensor = tensor._plain()  # an nn.Buffer is a marker: the module holds a plain tensor, as torch's
        self._buffers[name] = tensor
        if persistent:
            self._non_persistent_buffers_set.discard(name)
        else:
            self._non_persistent_buffers_set.add(name)

    def add_module(self, name, module):
        if module is not None and not isinstance(module, Module):
            raise TypeError(f"{type(module).__name__} is not a Module subclass")
        _check_name("module", name, self, self._modules)
        self._modules[name] = module

    def register_module(self, name, module):
        return self.add_module(name, module)

    def get_submodule(self, target):
        """The module at a dotted path ("" is this one), as torch's."""
        mod = self
        if target == "":
            return mod
        for item in target.split("."):
            if not hasattr(mod, item):
                raise AttributeError(f"{type(mod).__name__} has no attribute `{item}`")
            mod = getattr(mod, item)
            if not isinstance(mod, Module):
                raise AttributeError(f"`{item}` is not an nn.Module")
        return mod

    def set_submodule(self, target, module, strict=False):
        """Puts module at a dotted path, as torch's: its parent must exist; the name must be free or a
        module's (strict=True: a module's)."""
        if target == "":
            raise ValueError("set_submodule: cannot set the submodule without a target name")
        if not isinstance(module, Module):
            raise ValueError(f"set_submodule('{target}'): `module` is not a kiln.nn.Module, found "
                             f"{type(module).__name__}")
        path, _, name = target.rpartition(".")
        parent = self.get_submodule(path)
        if strict and not hasattr(parent, name):
            raise AttributeError(f"set_submodule('{target}'): {type(parent).__name__} has no attribute `{name}`")
        if hasattr(parent, name) and not isinstance(getattr(parent, name), Module):
            raise AttributeError(f"set_submodule('{target}'): `{name}` is not an nn.Module")
        setattr(parent, name, module)

    def get_parameter(self, target):
        path, _, name = target.rpartition(".")
        mod = self.get_submodule(path)
        if not hasattr(mod, name):
            raise AttributeError(f"{type(mod).__name__} has no attribute `{name}`")
        p = getattr(mod, name)
        if not isinstance(p, Parameter):
            raise AttributeError(f"`{name}` is not an nn.Parameter")
        return p

    def get_buffer(self, target):
        path, _, name = target.rpartition(".")
        mod = self.get_submodule(path)
        if name not in mod._buffers:
            raise AttributeError(f"`{name}` is not a buffer of {type(mod).__name__}")
        return mod._buffers[name]

    # ---- traversal ----
    def named_children(self):
        seen = set()
        for name, m in self._modules.items():
            if m is not None and id(m) not in seen:
                seen.add(id(m))
                yield name, m

    def children(self):
        return (m for _, m in self.named_children())

    def named_modules(self, memo=None, prefix="", remove_duplicate=True):
        """Every module once (as PyTorch: a module reused under two names comes under its first), or every
        name with remove_duplicate=False. As torch's, memo is the set of modules already given (it is
        added to): one in it is skipped with its whole subtree."""
        if memo is None:
            memo = set()
        if self in memo:
            return
        if remove_duplicate:
            memo.add(self)
        yield prefix, self
        for name, m in self._modules.items():
            if m is not None:
                yield from m.named_modules(memo, f"{prefix}.{name}" if prefix else name, remove_duplicate)

    def modules(self):
        return (m for _, m in self.named_modules())

    def _named_members(self, members, prefix, recurse, remove_duplicate):
        # Module by module (its own tensors, then its children's), as torch: the order of state_dict.
        # seen holds the tensors it has given, so that an id it compares stays that tensor's.
        seen = {}
        mods = self.named_modules(prefix=prefix, remove_duplicate=remove_duplicate) if recurse else [(prefix, self)]
        for mp, m in mods:
            for name, t in members(m):
                if t is None:
                    continue
                if remove_duplicate:
                    if id(t) in seen:
                        continue
                    seen[id(t)] = t
                yield (f"{mp}.{name}" if mp else name), t

    def named_parameters(self, prefix="", recurse=True, remove_duplicate=True):
        """Every parameter once: a tied (shared) one under its first name, as PyTorch, so that an optimizer
        steps it once; remove_duplicate=False gives every name; recurse=False only this module's own."""
        return self._named_members(lambda m: m._own_parameters(), prefix, recurse, remove_duplicate)

    def _own_parameters(self):
        return self._parameters.items()

    def _own_buffers(self):
        return self._buffers.items()

    def parameters(self, recurse=True):
        """An iterator over the parameters (each once), as torch's: list() it to use it twice."""
        return (p for _, p in self.named_parameters(recurse=recurse))

    def named_buffers(self, prefix="", recurse=True, remove_duplicate=True):
        return self._named_members(lambda m: m._own_buffers(), prefix, recurse, remove_duplicate)

    def buffers(self, recurse=True):
        return (b for _, b in self.named_buffers(recurse=recurse))

    def num_parameters(self):
        return sum(p.numel() for p in self.parameters())

    def apply(self, fn):
        """Calls fn on every submodule (children first) and then on this module; returns self."""
        for m in self.children():
            m.apply(fn)
        fn(self)
        return self

    # ---- modes and conversions ----
    def train(self, mode=True):
        if not isinstance(mode, bool):
            raise ValueError(f"train(): mode must be a bool, got {mode!r}")
        for m in self.modules():
            object.__setattr__(m, "training", mode)
            m._set_mode(mode)
        return self

    def _set_mode(self, mode):
        pass

    def eval(self):
        return self.train(False)

    def zero_grad(self, set_to_none=True):
        """Drops every parameter's gradient, or with set_to_none=False zeroes it in place."""
        for p in self.parameters():
            g = p.grad
            if g is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                with no_grad():
                    g.detach().zero_()

    def requires_grad_(self, requires_grad=True):
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    def to(self, *args, **kwargs):
        """Moves every parameter and buffer to a device and converts the floating ones to a dtype:
        to("cuda"), to(kiln.float64), to("cuda", kiln.bfloat16), to(device=..., dtype=...). A tensor
        already there is kept (the same Parameter object). One that moves becomes a new Parameter
        (torch's moves in place), with its .grad converted and its attributes carried over; a
        parameter tied between modules stays one parameter. Something outside the module that still
        holds an old one (an optimizer made before) no longer updates the module, which a warning
        says; make the optimizer after .to()."""
        device, dtype = _parse_to(args, kwargs)
        if dtype is not None and not dtype.is_floating_point:
            raise TypeError(f"nn.Module.to only accepts floating point dtypes, but got kiln.{dtype.name}")
        # id(old Parameter) -> [old, new, its first name]: across the whole call, so that a tie across
        # modules (out.weight = emb.weight) gets one new Parameter.
        moved = {}
        with no_grad():
            for name, m in self.named_modules():
                m._convert(device, dtype, moved, f"{name}." if name else "")
        held = []
        for entry in moved.values():
            old = entry[0]
            # Another C++ handle (an optimizer's) or Python reference beyond moved's, old's and
            # getrefcount's own.
            if old._handles > 1 or sys.getrefcount(old) > 3:
                held.append(entry[2])
            del old
        if held:
            warnings.warn(f"Module.to: {len(held)} parameter(s) ({', '.join(held[:3])}{', ...' if len(held) > 3 else ''}) "
                          "became new Parameter objects, and something outside the module still holds the old ones "
                          "(an optimizer made before .to()?), which no longer update it: make the optimizer after "
                          "moving the module", stacklevel=2)
        return self

    def _convert(self, device, dtype, moved, prefix):
        """Converts this module's own tensors; a parameter that moves is recorded in moved (see to)."""
        def conv(t):
            q = t
            if device is not None:
                q = q.to(device)
            if dtype is not None and q.is_floating_point():
                q = q.to(dtype)
            # Tensor.to gives a new handle even when nothing changes: keep the tensor itself then, so
            # that an optimizer holding it still updates the module.
            return t if (q.dtype == t.dtype and q.device == t.device) else q

        for name in list(self._parameters):
            p = self._parameters[name]
            if p is None:
                continue
            entry = moved.get(id(p))
            if entry is None:
                q = conv(p)
                if q is p:
                    continue
                # a lazy module's UninitializedParameter stays one (with the new device and dtype), as torch's
                new = p._like(q.device, q.dtype) if getattr(p, "_is_uninitialized", False) else \
                    Parameter(q, p.requires_grad)
                if p.grad is not None:
                    new.grad = conv(p.grad)
                new.__dict__.update(getattr(p, "__dict__", {}))
                entry = moved[id(p)] = [p, new, prefix + name]
            self._parameters[name] = entry[1]
        for name, b in list(self._buffers.items()):
            if b is not None:
                q = conv(b)
                self._buffers[name] = b._like(q.device, q.dtype) if q is not b and getattr(
                    b, "_is_uninitialized", False) else q

    def cpu(self):
        return self.to("cpu")

    def cuda(self, device=0):
        return self.to(f"cuda:{device}" if isinstance(device, int) else device)

    def float(self):
        return self.to(_C.dtype.float32)

    def double(self):
        return self.to(_C.dtype.float64)

    def half(self):
        return self.to(_C.dtype.float16)

    def bfloat16(self):
        return self.to(_C.dtype.bfloat16)

    # ---- state ----
    def state_dict(self, destination=None, prefix="", keep_vars=False):
        """Parameters and persistent buffers by dotted name, module by module as torch's (a module's
        own parameters, its own buffers, then its children's), detached (they share memory with the
        module) unless keep_vars."""
        if destination is None:
            destination = OrderedDict()
        self._save_to_state_dict(destination, prefix, keep_vars)
        for name, m in self._modules.items():
            if m is not None:
                m.state_dict(destination=destination, prefix=f"{prefix}{name}.", keep_vars=keep_vars)
        return destination

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        for name, p in self._own_parameters():
            if p is not None:
                destination[prefix + name] = p if keep_vars else p.detach()
        for name, b in self._own_buffers():
            if b is not None and name not in self._non_persistent_buffers_set:
                destination[prefix + name] = b if keep_vars else b.detach()

    def load_state_dict(self, state_dict, strict=True, assign=False):
        """Copies tensors into the parameters and buffers of the same names. With strict, a missing or
        unexpected name is an error that names them (and nothing is copied); a shape mismatch always is.
        With assign=True, as torch's, the given tensors become the parameters and buffers instead (their
        memory, dtype and device; a parameter keeps the module's requires_grad, and a tensor that is not
        a Parameter becomes one sharing its memory). Returns (missing_keys, unexpected_keys), as torch
        does: what strict=False left out."""
        if assign:
            for name, m in self.named_modules():
                if isinstance(m, CppModule):
                    m._refuse_assign(f"load_state_dict(assign=True) on {type(self).__name__}")
        for name, m in self.named_modules():
            # a lazy module (kiln/nn/_more_layers.py) takes its uninitialized shapes from the state dict, as torch's
            if hasattr(m, "_materialize_from_state_dict"):
                m._materialize_from_state_dict(state_dict, f"{name}." if name else "")
        mine = self.state_dict()
        # A module may fill in keys an older save lacks (BatchNorm's num_batches_tracked), as torch's
        # _load_from_state_dict does: on _state_tensors' copy, so the caller's dict is left alone.
        state_dict = _state_tensors(state_dict, mine)
        for name, m in self.named_modules():
            prefix = f"{name}." if name else ""
            m._upgrade_state_dict(state_dict, prefix)
            # A second name of a tied tensor (a bert-*-mlm's decoder, listed as Hugging Face lists it):
            # optional, and when given it must equal the tensor it is, which is what gets loaded; an
            # untied value would otherwise overwrite the tensor it is tied to.
            for alias, target in m._tied_names(prefix).items():
                mine.pop(alias, None)
                if alias in state_dict:
                    _check_tied(state_dict, alias, target)
        missing = [k for k in mine if k not in state_dict]
        unexpected = [k for k in state_dict if k not in mine]
        if strict and (missing or unexpected):
            raise KilnError(f"load_state_dict: missing {missing}, unexpected {unexpected}")
        for k, t in state_dict.items():
            if k in mine and tuple(t.shape) != tuple(mine[k].shape):
                raise KilnError(f"load_state_dict: {k} has shape {tuple(t.shape)}, the module's is {tuple(mine[k].shape)}")
        if assign:
            self._assign_state(state_dict, mine)
            return IncompatibleKeys(missing, unexpected)
        with no_grad():
            for k, t in state_dict.items():
                if k in mine:
                    mine[k].copy_(t)
        return IncompatibleKeys(missing, unexpected)

    def _assign_state(self, state_dict, mine):
        # Module by module, every name (a module reused under two names too), as state_dict lists them.
        for prefix, m in self.named_modules(remove_duplicate=False):
            prefix = f"{prefix}." if prefix else ""
            for name, p in list(m._parameters.items()):
                t = state_dict.get(prefix + name)
                if p is None or t is None or prefix + name not in mine:
                    continue
                if isinstance(t, Parameter):
                    t.requires_grad_(p.requires_grad)
                else:
                    t = Parameter(t, p.requires_grad)
                m._parameters[name] = t
            for name, b in list(m._buffers.items()):
                t = state_dict.get(prefix + name)
                if b is not None and t is not None and prefix + name in mine:
                    m._buffers[name] = t

    def _tied_names(self, prefix):
        """{a second name this module's state_dict lists for a tensor: the tensor's own name}, each with
        prefix (load_state_dict takes the second name as optional, checked equal to the first)."""
        return {}

    def _upgrade_state_dict(self, state_dict, prefix):
        """Called by load_state_dict for every module with its key prefix: adds or rewrites, in
        state_dict, the entries an older version of this module saved differently."""

    # ---- calling ----
    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} must define forward")

    def register_forward_pre_hook(self, hook, *, prepend=False, with_kwargs=False):
        """hook(module, args) runs before forward; a value it returns (a tuple, or one value) replaces
        the positional arguments. With with_kwargs=True, hook(module, args, kwargs) returns None or
        (args, kwargs). prepend=True runs it before the hooks already registered. Returns a handle
        whose remove() takes the hook off."""
        return self._add_hook(self._forward_pre_hooks, hook, prepend,
                              [self._forward_pre_hooks_with_kwargs] if with_kwargs else [])

    def register_forward_hook(self, hook, *, prepend=False, with_kwargs=False, always_call=False):
        """hook(module, args, output) runs after forward; a value it returns replaces the output. With
        with_kwargs=True it is hook(module, args, kwargs, output); prepend=True runs it before the hooks
        already registered; always_call=True runs it also when forward (or a hook) raises, with output
        None if there was none yet. Returns a handle whose remove() takes the hook off."""
        flags = ([self._forward_hooks_with_kwargs] if with_kwargs else []) + \
            ([self._forward_hooks_always_called] if always_call else [])
        return self._add_hook(self._forward_hooks, hook, prepend, flags)

    def _add_hook(self, hooks, hook, prepend, flags):
        h = _HookHandle(hooks, flags)
        hooks[h.id] = hook
        if prepend:
            hooks.move_to_end(h.id, last=False)
        for d in flags:
            d[h.id] = True
        return h

    def register_full_backward_hook(self, hook):
        """hook(module, grad_input, grad_output) runs in backward once the gradients of the module's
        positional inputs are known: tuples, one per input / output, as torch's: zeros for a tensor
        input that needs no gradient (while another does), None for a non-tensor input and for an
        output without grad or that no loss reached. A tuple it returns replaces grad_input. Returns
        a handle whose remove() takes the hook off."""
        h = _HookHandle(self._backward_hooks)
        self._backward_hooks[h.id] = hook
        return h

    def __call__(self, *args, **kwargs):
        d = self.__dict__
        pre, post, back = d.get("_forward_pre_hooks"), d.get("_forward_hooks"), d.get("_backward_hooks")
        if not pre and not post and not back:
            return self.forward(*args, **kwargs)
        pre_kw = d.get("_forward_pre_hooks_with_kwargs") or {}
        post_kw = d.get("_forward_hooks_with_kwargs") or {}
        always = d.get("_forward_hooks_always_called") or {}
        out = None
        called = set()  # the always_call hooks that ran, so that an error does not run them twice
        try:
            for hook_id, hook in list(pre.items() if pre else ()):
                if hook_id in pre_kw:
                    r = hook(self, args, kwargs)
                    if r is not None:
                        if not (isinstance(r, tuple) and len(r) == 2):
                            raise KilnError("forward pre-hook registered with with_kwargs=True must return None or "
                                            f"a tuple of (new_args, new_kwargs), but got {r!r}")
                        args, kwargs = r
                else:
                    r = hook(self, args)
                    if r is not None:
                        args = r if isinstance(r, tuple) else (r,)
            bw = _BackwardHooks(self, list(back.values()), len(args)) if back and _C.is_grad_enabled() else None
            if bw is not None:
                args = bw.wrap(args, bw.input_backward)
            out = self.forward(*args, **kwargs)
            for hook_id, hook in list(post.items() if post else ()):
                if hook_id in always:
                    called.add(hook_id)
                r = hook(self, args, kwargs, out) if hook_id in post_kw else hook(self, args, out)
                if r is not None:
                    out = r
        except Exception:
            # As torch: the always_call hooks that have not run see the output so far (None if forward
            # raised); an error of theirs is a warning, so that forward's own error is the one raised.
            for hook_id, hook in list(post.items() if post else ()):
                if hook_id in always and hook_id not in called:
                    try:
                        r = hook(self, args, kwargs, out) if hook_id in post_kw else hook(self, args, out)
                        if r is not None:
                            out = r
                    except Exception as e:
                        warnings.warn("a forward hook registered with always_call=True raised an exception that "
                                      f"was silenced as another error was raised in forward: {e}", stacklevel=2)
            raise
        if bw is not None:
            # As torch: a tensor or a tuple (a namedtuple rebuilt from its fields) of outputs gets the
            # backward step; anything else (a dict, a list) is returned as it is.
            if isinstance(out, Tensor):
                out = bw.wrap((out,), bw.output_backward)[0]
            elif isinstance(out, tuple):
                outs = bw.wrap(tuple(out), bw.output_backward)
                out = type(out)(*outs) if hasattr(type(out), "_fields") else type(out)(outs)
        return out

    def extra_repr(self):
        return ""

    def __repr__(self):
        # torch's layout: extra_repr's lines and the children's, indented under the name.
        extra = self.extra_repr()
        extra_lines = extra.split("\n") if extra else []
        child_lines = [f"({name}): " + repr(m).replace("\n", "\n  ") for name, m in self._modules.items()]
        lines = extra_lines + child_lines
        s = type(self).__name__ + "("
        if len(extra_lines) == 1 and not child_lines:
            s += extra_lines[0]
        elif lines:
            s += "\n  " + "\n  ".join(lines) + "\n"
        return s + ")"


class _Identity(Function):
    """Passes tensors through; its backward hands their gradients to a _BackwardHooks step."""

    @staticmethod
    def forward(ctx, step, *tensors):
        ctx.step = step
        return tensors

    @staticmethod
    def backward(ctx, *grads):
        return (None,) + tuple(ctx.step(grads))


class _BackwardHooks:
    """One call's full backward hooks (torch's BackwardHook): the outputs pass through an identity
    whose backward hands grad_output on, and each output then through one of its own, which records
    its gradient (an output no loss reaches runs none, so its grad_output is None, as torch's, where
    the shared identity's would be zeros); the inputs that need a gradient pass through another,
    whose backward (run after, as the inputs come before the outputs) calls the hooks. Without such
    inputs the hooks run at the outputs with grad_input all None."""

    def __init__(self, module, hooks, n_inputs):
        self.module, self.hooks, self.n_inputs = module, hooks, n_inputs
        self.grad_output = None
        self.has_inputs = False
        self.reached = {}  # output position -> its gradient, from the per-output identities
        self.zeros = {}  # input position -> (shape, dtype, device) of a tensor input that needs no gradient

    def wrap(self, values, step):
        at = [i for i, v in enumerate(values) if isinstance(v, Tensor) and v.requires_grad]
        if not at:
            return values
        n = len(values)

        def backward_step(grads):
            full = [None] * n
            for i, g in zip(at, grads):
                full[i] = g
            full = step(tuple(full))
            return [full[i] for i in at]

        if step == self.input_backward:
            self.has_inputs = True
            # As torch: once some input needs a gradient, a tensor input that does not gets zeros in
            # grad_input (torch's hook function marks it non-differentiable and fills in zeros).
            self.zeros = {i: (tuple(v.shape), v.dtype, v.device) for i, v in enumerate(values)
                          if isinstance(v, Tensor) and i not in at}
        wrapped = _Identity.apply(backward_step, *[values[i] for i in at])
        if step == self.output_backward:
            wrapped = [_Identity.apply(self._recorder(i), v)[0] for i, v in zip(at, wrapped)]
        values = list(values)
        for i, v in zip(at, wrapped):
            values[i] = v
        return tuple(values)

    def _recorder(self, i):
        def record(grads):
            self.reached[i] = grads[0]
            return grads
        return record

    def output_backward(self, grads):
        # grads has zeros where no loss reached an output; grad_output has None there, as torch's.
        self.grad_output = tuple(self.reached.get(i) for i in range(len(grads)))
        # A second backward over the same graph (retain_graph=True) records afresh: an output that only
        # the first reached must be None again, not the first backward's gradient.
        self.reached = {}
        if not self.has_inputs:
            for hook in self.hooks:
                if hook(self.module, (None,) * self.n_inputs, self.grad_output) is not None:
                    raise KilnError("register_full_backward_hook: a hook cannot return a grad_input when no "
                                    "input of the module requires grad")
        return grads

    def input_backward(self, grads):
        grads = list(grads)
        for i, (shape, dtype, device) in self.zeros.items():
            grads[i] = _C.zeros(list(shape), dtype=dtype, device=device)
        grads = tuple(grads)
        for hook in self.hooks:
            r = hook(self.module, grads, self.grad_output)
            if r is not None:
                r = tuple(r) if isinstance(r, (tuple, list)) else (r,)
                if len(r) != len(grads):
                    raise KilnError(f"register_full_backward_hook: the hook returned {len(r)} gradients for the "
                                    f"module's {len(grads)} inputs")
                grads = r
        return grads


def _remove_from(name, *stores):
    for d in stores:
        if name in d:
            if isinstance(d, set):
                d.discard(name)
            else:
                del d[name]


def _check_tied(state_dict, alias, target, what="load_state_dict"):
    """Drops state_dict[alias], the second name of the tied tensor `target`: it must hold the same values
    (then it is the tensor saved twice), or the tie cannot hold it and both are named. Given alone, it
    is loaded as `target`."""
    v = state_dict.pop(alias)
    t = state_dict.get(target)
    if t is None:
        state_dict[target] = v
        return
    f64 = _C.dtype.float64  # the values compared exactly, whatever the dtypes and devices
    same = tuple(v.shape) == tuple(t.shape) and _C.allclose(_C.cast(v.detach().cpu(), f64),
                                                            _C.cast(t.detach().cpu(), f64), 0.0, 0.0, True)
    if not same:
        raise KilnError(f"{what}: '{alias}' differs from '{target}': the model ties them (one tensor), so an "
                        "untied value cannot be loaded")


def _state_tensors(state_dict, mine=None, what="load_state_dict"):
    """load_state_dict's argument as a dict of name -> kiln.Tensor. The values may be kiln.Tensors,
    NumPy arrays or torch.Tensors (a state dict made by NumPy code, or torch's: weights being
    ported); an array is viewed without a copy where Kiln can (DLPack, NumPy's buffer), else copied
    (a read-only or big-endian array), and the load then copies it in, converting the dtype. `mine`,
    the module's state dict, names what the key was for when an array's dtype has no Kiln dtype."""
    if not hasattr(state_dict, "items"):
        raise TypeError(f"{what}: expected a dict of name -> kiln.Tensor, got {type(state_dict).__name__}")
    out = OrderedDict()
    for k, t in state_dict.items():
        out[k] = t if isinstance(t, Tensor) else _foreign_tensor(k, t, mine, what)
    return out


def _foreign_tensor(key, value, mine, what):
    """A state dict's NumPy array or DLPack producer (torch.Tensor, CuPy, JAX) as a kiln.Tensor."""
    import numpy as np

    if isinstance(value, np.ndarray):
        try:
            return _C.from_numpy(value)
        except ValueError:  # read-only, big-endian or odd strides: a copy (or the dtype, named below)
            make = _tensor
    elif hasattr(value, "__dlpack__"):
        from .. import from_dlpack

        # torch's load_state_dict reads the values without recording a gradient: a tensor that
        # requires grad in its own framework (which DLPack refuses) is read detached.
        make = from_dlpack
        if callable(getattr(value, "detach", None)):
            value = value.detach()
        if callable(getattr(value, "resolve_neg", None)):
            value = value.resolve_neg()  # torch exports a negative-bit view's memory, not its values
    else:
        raise TypeError(f"{what}: '{key}' is {_a_type(value)}, expected a kiln.Tensor, a NumPy array or "
                        "a torch.Tensor")
    try:
        try:
            return make(value)
        except (ValueError, TypeError, BufferError, RuntimeError):
            # DLPack refuses some torch tensors Kiln could hold (a CUDA one in a CPU-only Kiln, a sparse
            # one, a conjugated view): read them copied, through the CPU (and NumPy).
            if make is _tensor or not callable(getattr(value, "cpu", None)):
                raise
            host = value.cpu()
            if callable(getattr(host, "to_dense", None)) and str(getattr(host, "layout", "")) != "torch.strided":
                host = host.to_dense()  # a sparse tensor
            if callable(getattr(host, "resolve_conj", None)):
                host = host.resolve_conj()
            try:
                return make(host)  # a CPU bfloat16 tensor, which NumPy lacks, among them
            except (ValueError, TypeError, BufferError, RuntimeError):
                return _tensor(host.numpy())
    except (ValueError, TypeError, BufferError, RuntimeError) as e:
        target = mine.get(key) if mine is not None else None
        theirs = f"{getattr(value, 'dtype', '?')} {tuple(getattr(value, 'shape', ()))}"
        ours = f"; the module's is {target.dtype.name} {tuple(target.shape)}" if target is not None else ""
        raise KilnValueError(f"{what}: '{key}' ({type(value).__name__} of {theirs}) cannot be read as a kiln "
                             f"tensor: {e}{ours}") from None


def _parse_to(args, kwargs):
    # torch's Module.to keywords: non_blocking is a hint (Kiln's copies finish before they return);
    # memory_format=kiln.channels_last (torch's, or the name) would make 4-D weights NHWC, which Kiln's
    # modules do not keep (feed channels_last inputs: x.contiguous(memory_format=kiln.channels_last));
    # contiguous_format and preserve_format change nothing; anything else is a mistake.
    unknown = set(kwargs) - {"device", "dtype", "non_blocking", "memory_format"}
    if unknown:
        raise TypeError(f"to() got an unexpected keyword argument '{sorted(unknown)[0]}'")
    fmt = kwargs.get("memory_format")
    if fmt is not None and _memory_format(fmt, "Module.to()") is channels_last:
        raise KilnValueError(f"Module.to(memory_format={fmt!r}): Kiln keeps parameters in their standard layout "
                             "(NCHW); for NHWC activations feed channels_last inputs "
                             "(x.contiguous(memory_format=kiln.channels_last)), which the convolutions keep")
    device, dtype = kwargs.get("device"), kwargs.get("dtype")
    for a in args:
        if isinstance(a, Tensor):
            device, dtype = a.device, a.dtype
        elif isinstance(a, _C.dtype):
            dtype = a
        elif isinstance(a, str):
            try:
                device = _C.Device(a)
            except ValueError:
                try:
                    dtype = _C.promote_types(a, a)
                except ValueError:
                    raise KilnValueError(f"to(): '{a}' is neither a device (\"cpu\", \"cuda\", \"cuda:N\") nor a dtype "
                                         "(float32, float16, bfloat16, float64, int64, int32, int16, int8, uint8, "
                                         "bool)") from None
        else:
            device = a
    return device, dtype


def _check_count(cls, name, value, minimum=0):
    try:
        n = operator.index(value)  # an int, or NumPy's integers (nn.Linear(np.prod(shape), 10))
    except TypeError:
        n = None
    if isinstance(value, bool) or n is None or n < minimum:
        raise KilnValueError(f"{cls}: {name} must be an int >= {minimum}, got {value!r}")
    return n


def _uniform(shape, bound):
    return _C.rand(*shape) * (2 * bound) - bound


def _bound(fan_in):
    """PyTorch's default init bound 1/sqrt(fan_in); 0 for no inputs (the weight has no elements)."""
    return 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0


def _place(module, device, dtype):
    """The device= and dtype= that torch's layers take: the parameters are made, then moved."""
    if device is not None or dtype is not None:
        module.to(device=device, dtype=dtype)


def _ntuple(v, n):
    return tuple(v) if hasattr(v, "__len__") else (v,) * n


class Linear(Module):
    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None):
        super().__init__()
        in_features = _check_count("Linear", "in_features", in_features)
        out_features = _check_count("Linear", "out_features", out_features)
        self.in_features, self.out_features = in_features, out_features
        bound = _bound(in_features)
        self.weight = Parameter(_uniform((out_features, in_features), bound))
        self.bias = Parameter(_uniform((out_features,), bound)) if bias else None
        _place(self, device, dtype)

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


_PADDING_MODES = ("zeros", "reflect", "replicate", "circular")


class _ConvNd(Module):
    """Convolution layers (and, with _transposed, the transposed ones): stride, padding, dilation and
    output_padding stored as tuples, as torch. padding_mode other than "zeros" pads the input with
    F.pad first and convolves without padding (torch's way); an unbatched input ([C, ...]) gets a batch
    dim of one for the call."""
    _fn = None
    _dims = 2
    _transposed = False

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1, bias=True,
                 padding_mode="zeros", device=None, dtype=None, output_padding=0):
        super().__init__()
        name = type(self).__name__
        n = self._dims
        k = _ntuple(kernel_size, n)
        in_channels = _check_count(name, "in_channels", in_channels)
        out_channels = _check_count(name, "out_channels", out_channels)
        groups = _check_count(name, "groups", groups, 1)
        if len(k) != n:
            raise KilnValueError(f"{name}: kernel_size must be an int or {n} ints, got {kernel_size!r}")
        k = tuple(_check_count(name, "kernel_size", v, 1) for v in k)
        if in_channels % groups or out_channels % groups:
            raise KilnValueError(f"{name}: in_channels ({in_channels}) and out_channels ({out_channels}) must be "
                                 f"divisible by groups ({groups})")
        if padding_mode not in _PADDING_MODES:
            raise KilnValueError(f"{name}: padding_mode must be one of {_PADDING_MODES}, got {padding_mode!r}")
        stride, dilation = _ntuple(stride, n), _ntuple(dilation, n)
        if isinstance(padding, str):
            if padding not in ("same", "valid"):
                raise KilnValueError(f"{name}: padding must be an int, {n} ints, 'same' or 'valid', got {padding!r}")
            if padding == "same" and any(s != 1 for s in stride):
                raise KilnValueError(f"{name}: padding='same' is not supported for strided convolutions")
        else:
            padding = _ntuple(padding, n)
        if self._transposed and padding_mode != "zeros":
            raise KilnValueError(f"{name}: only 'zeros' padding mode is supported, got {padding_mode!r}")
        self.stride, self.padding, self.dilation, self.groups = stride, padding, dilation, groups
        self.output_padding = _ntuple(output_padding, n)
        self.in_channels, self.out_channels, self.kernel_size = in_channels, out_channels, k
        self.padding_mode = padding_mode
        # torch's kaiming_uniform(a=sqrt(5)) bound: 1/sqrt(fan_in), fan_in from the weight's dim 1
        wshape = ((in_channels, out_channels // groups) if self._transposed
                  else (out_channels, in_channels // groups)) + k
        bound = _bound(wshape[1] * math.prod(k))
        self.weight = Parameter(_uniform(wshape, bound))
        self.bias = Parameter(_uniform((out_channels,), bound)) if bias else None
        _place(self, device, dtype)

    def _pad_amounts(self):
        """F.pad's list (last dim first) for a padding_mode other than zeros; 'same' puts the odd element
        on the right, as torch."""
        out = []
        for i in reversed(range(self._dims)):
            if self.padding == "same":
                total = self.dilation[i] * (self.kernel_size[i] - 1)
                out += [total // 2, total - total // 2]
            elif self.padding == "valid":
                out += [0, 0]
            else:
                out += [self.padding[i], self.padding[i]]
        return out

    def _unbatched(self, x):
        if x.dim() == self._dims + 1:
            return True
        if x.dim() != self._dims + 2:
            raise KilnValueError(f"{type(self).__name__}: expected a {self._dims + 1}-D (unbatched) or "
                                 f"{self._dims + 2}-D (batched) input, got {tuple(x.shape)}")
        return False

    def forward(self, x):
        unbatched = self._unbatched(x)
        if unbatched:
            x = x.unsqueeze(0)
        if self.padding_mode != "zeros":
            x = F.pad(x, self._pad_amounts(), mode=self.padding_mode)
            y = type(self)._fn(x, self.weight, self.bias, self.stride, 0, self.dilation, self.groups)
        else:
            y = type(self)._fn(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)
        return y.squeeze(0) if unbatched else y

    def extra_repr(self):
        s = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"
        if self.padding != (0,) * len(self.padding):
            s += f", padding={self.padding}"
        if self.dilation != (1,) * len(self.dilation):
            s += f", dilation={self.dilation}"
        if self.output_padding != (0,) * len(self.output_padding):
            s += f", output_padding={self.output_padding}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        if self.bias is None:
            s += ", bias=False"
        if self.padding_mode != "zeros":
            s += f", padding_mode={self.padding_mode}"
        return s


class Conv1d(_ConvNd):
    _fn = staticmethod(F.conv1d)
    _dims = 1


class Conv2d(_ConvNd):
    _fn = staticmethod(F.conv2d)
    _dims = 2


class Conv3d(_ConvNd):
    _fn = staticmethod(F.conv3d)
    _dims = 3


def _fill_num_batches_tracked(module, state_dict, prefix):
    """As torch's _NormBase: a state dict saved before num_batches_tracked existed (older Kiln, torch
    before 0.4.1) loads, leaving the module's counter as it is."""
    key = prefix + "num_batches_tracked"
    if module.track_running_stats and module.num_batches_tracked is not None and key not in state_dict \
            and prefix + "running_mean" in state_dict:
        state_dict[key] = module.num_batches_tracked.detach().clone()


class _NormBase(Module):
    """What torch's BatchNorm and InstanceNorm share (torch's _NormBase): weight and bias when affine;
    running_mean/running_var and num_batches_tracked (int64) when track_running_stats."""

    def __init__(self, num_features, eps, momentum, affine, track_running_stats, device, dtype, bias):
        super().__init__()
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.affine, self.track_running_stats = affine, track_running_stats
        self.weight = Parameter(_C.ones(num_features)) if affine else None
        self.bias = Parameter(_C.zeros(num_features)) if affine and bias else None
        if track_running_stats:
            self.register_buffer("running_mean", _C.zeros(num_features))
            self.register_buffer("running_var", _C.ones(num_features))
            self.register_buffer("num_batches_tracked", _tensor(0, dtype=_C.dtype.int64))
        else:
            self.register_buffer("running_mean", None)
            self.register_buffer("running_var", None)
            self.register_buffer("num_batches_tracked", None)
        _place(self, device, dtype)

    def _tied_names(self, prefix):
        """{a second name this module's state_dict lists for a tensor: the tensor's own name}, each with
        prefix (load_state_dict takes the second name as optional, checked equal to the first)."""
        return {}

    def reset_running_stats(self):
        """running_mean 0, running_var 1, num_batches_tracked 0 (as torch's; nothing without them)."""
        if self.track_running_stats:
            with no_grad():
                self.running_mean.zero_()
                self.running_var.fill_(1)
                self.num_batches_tracked.zero_()

    def _upgrade_state_dict(self, state_dict, prefix):
        _fill_num_batches_tracked(self, state_dict, prefix)

    def extra_repr(self):
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
                f"bias={self.bias is not None}, track_running_stats={self.track_running_stats}")


class _BatchNorm(_NormBase):
    """torch's BatchNorm: running_mean/running_var and num_batches_tracked (int64, counted in training)
    when track_running_stats; momentum=None is the cumulative average (factor 1/num_batches_tracked)."""
    _expected = ()

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True, device=None,
                 dtype=None, *, bias=True):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype, bias)

    def _check_input_dim(self, x):
        if x.dim() not in self._expected:
            want = " or ".join(f"{d}D" for d in self._expected)
            raise KilnValueError(f"expected {want} input (got {x.dim()}D input)")

    def forward(self, x):
        self._check_input_dim(x)
        if self.training and _C._recomputing():
            # checkpoint's backward reruns the block: the batch's statistics again, but the running ones
            # and num_batches_tracked were updated by the first run (torch's count them twice)
            return F.batch_norm(x, None, None, self.weight, self.bias, True, 0.0, self.eps)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            with no_grad():
                self.num_batches_tracked.add_(1)
            factor = 1.0 / self.num_batches_tracked.item() if self.momentum is None else self.momentum
        training = self.training or self.running_mean is None
        use_running = not self.training or self.track_running_stats
        return F.batch_norm(x, self.running_mean if use_running else None, self.running_var if use_running else None,
                            self.weight, self.bias, training, factor, self.eps)


class BatchNorm1d(_BatchNorm):
    _expected = (2, 3)


class BatchNorm2d(_BatchNorm):
    _expected = (4,)


class BatchNorm3d(_BatchNorm):
    _expected = (5,)


class LayerNorm(Module):
    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True, device=None, dtype=None):
        super().__init__()
        self.normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.eps, self.elementwise_affine = eps, elementwise_affine
        self.weight = Parameter(_C.ones(self.normalized_shape)) if elementwise_affine else None
        self.bias = Parameter(_C.zeros(self.normalized_shape)) if elementwise_affine and bias else None
        _place(self, device, dtype)

    def forward(self, x):
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self):
        return (f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}, "
                f"bias={self.bias is not None}")


class RMSNorm(Module):
    def __init__(self, normalized_shape, eps=None, elementwise_affine=True, device=None, dtype=None):
        super().__init__()
        self.normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.eps, self.elementwise_affine = eps, elementwise_affine
        self.weight = Parameter(_C.ones(self.normalized_shape)) if elementwise_affine else None
        _place(self, device, dtype)

    def forward(self, x):
        return F.rms_norm(x, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self):
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


class GroupNorm(Module):
    def __init__(self, num_groups, num_channels, eps=1e-5, affine=True, device=None, dtype=None, *, bias=True):
        super().__init__()
        if num_channels % num_groups:
            raise KilnValueError(f"GroupNorm: num_channels ({num_channels}) must be divisible by num_groups "
                                 f"({num_groups})")
        self.num_groups, self.num_channels, self.eps, self.affine = num_groups, num_channels, eps, affine
        self.weight = Parameter(_C.ones(num_channels)) if affine else None
        self.bias = Parameter(_C.zeros(num_channels)) if affine and bias else None
        _place(self, device, dtype)

    def forward(self, x):
        return F.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)

    def extra_repr(self):
        return (f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}, "
                f"bias={self.bias is not None}")


def _embedding_weight(who, num_embeddings, embedding_dim, padding_idx, _weight):
    """An embedding table's initial weight (Embedding, EmbeddingBag): N(0, 1) with padding_idx's row zero,
    or the given _weight, whose shape must be [num_embeddings, embedding_dim]."""
    if _weight is None:
        w = _C.randn(num_embeddings, embedding_dim)
        if padding_idx is not None:
            w[padding_idx] = 0.0
        return w
    if tuple(_weight.shape) != (num_embeddings, embedding_dim):
        raise KilnValueError(f"{who}: _weight has shape {tuple(_weight.shape)}, expected "
                             f"({num_embeddings}, {embedding_dim})")
    return _weight


class Embedding(Module):
    """torch's Embedding: padding_idx's row starts at 0 (it still gets gradients here: torch zeroes
    them); max_norm renormalises the looked-up rows of the weight in place, as torch's.
    scale_grad_by_freq and sparse are not supported and are refused by name."""

    def __init__(self, num_embeddings, embedding_dim, padding_idx=None, max_norm=None, norm_type=2.0,
                 scale_grad_by_freq=False, sparse=False, _weight=None, _freeze=False, device=None, dtype=None):
        super().__init__()
        for arg, v, default in (("scale_grad_by_freq", scale_grad_by_freq, False), ("sparse", sparse, False)):
            if v != default:
                raise KilnError(f"Embedding: {arg}={v!r} is not supported by Kiln (leave it at {default!r})")
        if padding_idx is not None:
            # as torch: a negative index counts from the end and is stored as the row it names
            padding_idx = operator.index(padding_idx)
            if not -num_embeddings <= padding_idx < num_embeddings:
                raise ValueError(
                    f"Embedding: padding_idx {padding_idx} is outside "
                    f"[-{num_embeddings}, {num_embeddings})")
            if padding_idx < 0:
                padding_idx += num_embeddings
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.padding_idx, self.max_norm, self.norm_type = padding_idx, max_norm, norm_type
        self.scale_grad_by_freq, self.sparse = scale_grad_by_freq, sparse
        self.weight = Parameter(_embedding_weight("Embedding", num_embeddings, embedding_dim, padding_idx, _weight),
                                requires_grad=not _freeze)
        _place(self, device, dtype)

    @classmethod
    def from_pretrained(cls, embeddings, freeze=True, padding_idx=None, max_norm=None, norm_type=2.0,
                        scale_grad_by_freq=False, sparse=False):
        """An Embedding whose weight is `embeddings` (2-D, shared); freeze: no gradient (as torch)."""
        if embeddings.dim() != 2:
            raise KilnValueError(f"Embedding.from_pretrained: embeddings must be 2-D, got {tuple(embeddings.shape)}")
        rows, cols = embeddings.shape
        return cls(rows, cols, padding_idx, max_norm, norm_type, scale_grad_by_freq, sparse, _weight=embeddings,
                   _freeze=freeze)

    def forward(self, idx):
        return F.embedding(idx, self.weight, self.padding_idx, self.max_norm, self.norm_type)

    def extra_repr(self):
        s = f"{self.num_embeddings}, {self.embedding_dim}"
        if self.padding_idx is not None:
            s += f", padding_idx={self.padding_idx}"
        if self.max_norm is not None:
            s += f", max_norm={self.max_norm}"
        if self.norm_type != 2:
            s += f", norm_type={self.norm_type}"
        return s


def _check_p(cls, p):
    if not 0 <= p <= 1:
        raise KilnValueError(f"{cls}: dropout probability has to be between 0 and 1, but got {p}")
    return p


class Dropout(Module):
    """inplace=True returns the input itself, as torch's: the result is written into it where Kiln may
    change it in place (it needs no gradient, or under kiln.no_grad()); inside a graph its object is
    pointed at the result (refused for a leaf that requires grad, as torch, and for a tensor whose memory
    a view shares: use inplace=False there); out of training or with p=0 it is returned as it was."""

    def __init__(self, p=0.5, inplace=False):
        super().__init__()
        self.p, self.inplace = _check_p(type(self).__name__, p), inplace

    def forward(self, x):
        return _inplace_result(x, F.dropout(x, self.p, self.training, self.inplace), self.inplace)

    def extra_repr(self):
        return f"p={self.p}, inplace={self.inplace}"


def _inplace_result(x, y, inplace):
    """What a module's forward with inplace= returns, given its functional form's result y: with
    inplace=True the F.* forms return their input object itself (y is x), as torch's, so y is returned
    as it is; no guessing from data_ptr(), which every meta tensor and empty tensors share."""
    return y


class _Inplace(Module):
    """An activation that takes torch's inplace=: True puts the result into the input and returns it, as
    torch's (written into it where Kiln may change it in place; inside a graph the input's object is
    pointed at the result); a leaf that requires grad is refused (as torch), and so are, inside a graph,
    a tensor whose memory a view shares (use inplace=False there) and a result of another dtype."""
    _fn = None

    def __init__(self, inplace=False):
        super().__init__()
        self.inplace = inplace

    def forward(self, x):
        return _inplace_result(x, type(self)._fn(x, inplace=self.inplace), self.inplace)

    def extra_repr(self):
        return "inplace=True" if self.inplace else ""


class ReLU(_Inplace):
    """x <= 0 ? 0 : x (NaN stays NaN, as torch.relu)"""
    _fn = staticmethod(F.relu)


class SiLU(_Inplace):
    """x * sigmoid(x)"""
    _fn = staticmethod(F.silu)


class Tanh(Module):
    """tanh(x)"""

    def forward(self, x):
        return F.tanh(x)


class Sigmoid(Module):
    """1 / (1 + exp(-x))"""

    def forward(self, x):
        return F.sigmoid(x)


class Identity(Module):
    """x; takes and ignores any arguments, as torch's."""

    def __init__(self, *args, **kwargs):
        super().__init__()

    def forward(self, x):
        return x


class GELU(Module):
    def __init__(self, approximate="none"):
        super().__init__()
        self.approximate = approximate

    def forward(self, x):
        return F.gelu(x, self.approximate)

    def extra_repr(self):
        return f"approximate={self.approximate!r}"


class LeakyReLU(Module):
    def __init__(self, negative_slope=0.01, inplace=False):
        super().__init__()
        self.negative_slope, self.inplace = negative_slope, inplace

    def forward(self, x):
        return _inplace_result(x, F.leaky_relu(x, self.negative_slope, self.inplace), self.inplace)

    def extra_repr(self):
        return f"negative_slope={self.negative_slope}" + (", inplace=True" if self.inplace else "")


class Softmax(Module):
    """dim=None: torch's legacy choice (0 for 0-, 1- and 3-D inputs, else 1), with its warning."""

    def __init__(self, dim=None):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return F.softmax(x, self.dim)

    def extra_repr(self):
        return f"dim={self.dim}"


class Flatten(Module):
    def __init__(self, start_dim=1, end_dim=-1):
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, x):
        return x.flatten(self.start_dim, self.end_dim)

    def extra_repr(self):
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"


class _MaxPoolNd(Module):
    _fn = None

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, return_indices=False, ceil_mode=False):
        super().__init__()
        self.kernel_size, self.stride = kernel_size, stride if stride is not None else kernel_size
        self.padding, self.dilation, self.return_indices, self.ceil_mode = padding, dilation, return_indices, ceil_mode

    def forward(self, x):
        return type(self)._fn(x, self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode,
                              self.return_indices)

    def extra_repr(self):
        return (f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
                f"dilation={self.dilation}, ceil_mode={self.ceil_mode}")


class MaxPool2d(_MaxPoolNd):
    _fn = staticmethod(F.max_pool2d)


class _AvgPoolNd(Module):
    _fn = None

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
                 divisor_override=None):
        super().__init__()
        self.kernel_size, self.stride = kernel_size, stride if stride is not None else kernel_size
        self.padding, self.ceil_mode, self.count_include_pad = padding, ceil_mode, count_include_pad
        self.divisor_override = divisor_override

    def forward(self, x):
        return type(self)._fn(x, self.kernel_size, self.stride, self.padding, self.ceil_mode, self.count_include_pad,
                              self.divisor_override)

    def extra_repr(self):
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class AvgPool2d(_AvgPoolNd):
    _fn = staticmethod(F.avg_pool2d)


class AdaptiveAvgPool2d(Module):
    def __init__(self, output_size):
        super().__init__()
        self.output_size = output_size

    def forward(self, x):
        return F.adaptive_avg_pool2d(x, self.output_size)

    def extra_repr(self):
        return f"output_size={self.output_size}"


class Upsample(Module):
    def __init__(self, size=None, scale_factor=None, mode="nearest", align_corners=None,
                 recompute_scale_factor=None):
        super().__init__()
        self.size, self.scale_factor, self.mode, self.align_corners = size, scale_factor, mode, align_corners
        self.recompute_scale_factor = recompute_scale_factor

    def forward(self, x):
        return F.interpolate(x, self.size, self.scale_factor, self.mode, self.align_corners,
                             self.recompute_scale_factor)


def _abs_index(container, idx):
    """idx (an int, negative from the end) as the key of the container's entry, or IndexError."""
    idx = operator.index(idx)
    n = len(container)
    if not -n <= idx < n:
        raise IndexError(f"{type(container).__name__}: index {idx} is out of range (length {n})")
    return str(idx + n if idx < 0 else idx)


def _renumber(module):
    # After a deletion the children are 0..n-1 again, as torch's Sequential and ModuleList.
    object.__setattr__(module, "_modules", OrderedDict((str(i), m) for i, m in enumerate(module._modules.values())))


def _insert(module, index, m):
    if not isinstance(m, Module):
        raise TypeError(f"{type(module).__name__}.insert: {type(m).__name__} is not a Module subclass")
    n = len(module._modules)
    index = operator.index(index)
    if not -n <= index <= n:
        raise IndexError(f"{type(module).__name__}.insert: index {index} is out of range (length {n})")
    if index < 0:
        index += n
    for i in range(n, index, -1):
        module._modules[str(i)] = module._modules[str(i - 1)]
    module._modules[str(index)] = m
    return module


class Sequential(Module):
    """Calls its modules in order: Sequential(m1, m2, ...) names them 0, 1, ...;
    Sequential(OrderedDict(name=module, ...)) by the dict's keys. A slice is a Sequential."""

    def __init__(self, *args):
        super().__init__()
        if len(args) == 1 and isinstance(args[0], OrderedDict):
            for name, m in args[0].items():
                self.add_module(name, m)
        else:
            for i, m in enumerate(args):
                self.add_module(str(i), m)

    def forward(self, input):
        for m in self._modules.values():
            input = m(input)
        return input

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return Sequential(OrderedDict(list(self._modules.items())[idx]))
        return list(self._modules.values())[int(_abs_index(self, idx))]

    def __setitem__(self, idx, module):
        setattr(self, list(self._modules)[int(_abs_index(self, idx))], module)

    def __delitem__(self, idx):
        keys = list(self._modules)
        for k in (keys[idx] if isinstance(idx, slice) else [keys[int(_abs_index(self, idx))]]):
            del self._modules[k]
        _renumber(self)

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())

    def append(self, module):
        self.add_module(str(len(self)), module)
        return self

    def insert(self, index, module):
        return _insert(self, index, module)

    def extend(self, modules):
        for m in modules:
            self.append(m)
        return self

    def pop(self, key):
        m = self[key]
        del self[key]
        return m

    # As torch's: + and += take a Sequential (the same module objects, numbered on), * and *= a count
    # (each module repeated, so its parameters are shared, not copied).
    def __add__(self, other):
        _check_sequential(other)
        return Sequential(*self, *other)

    def __iadd__(self, other):
        _check_sequential(other)
        return self.extend(list(other))

    def __mul__(self, other):
        _check_repeat(self, other)
        return Sequential(*(list(self) * other))

    __rmul__ = __mul__

    def __imul__(self, other):
        _check_repeat(self, other)
        return self.extend(list(self) * (other - 1))


def _check_sequential(other):
    if not isinstance(other, Sequential):
        raise ValueError(f"add operator supports only objects of Sequential class, but {type(other).__name__} is given")


def _check_repeat(seq, other):
    if not isinstance(other, int):
        raise TypeError(f"unsupported operand type(s) for *: Sequential and {type(other).__name__}")
    if other <= 0:
        raise ValueError(f"Non-positive multiplication factor {other} for Sequential")


class ModuleList(Module):
    """A list of modules, registered as children 0, 1, ... (in parameters() and state_dict()); a
    slice is a ModuleList."""

    def __init__(self, modules=None):
        super().__init__()
        if modules is not None:
            self.extend(modules)

    def append(self, m):
        self.add_module(str(len(self._modules)), m)
        return self

    def extend(self, modules):
        if isinstance(modules, (Module, Tensor)) or not hasattr(modules, "__iter__"):
            raise TypeError(f"ModuleList.extend should be called with an iterable, but got {type(modules).__name__}")
        for m in modules:
            self.append(m)
        return self

    def insert(self, index, module):
        _insert(self, index, module)

    def __iadd__(self, modules):
        return self.extend(modules)

    def __add__(self, other):
        return ModuleList(itertools.chain(self, other))

    def pop(self, idx=-1):
        m = self[idx]
        del self[idx]
        return m

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return ModuleList(list(self._modules.values())[idx])
        return self._modules[_abs_index(self, idx)]

    def __setitem__(self, idx, module):
        setattr(self, _abs_index(self, idx), module)

    def __delitem__(self, idx):
        if isinstance(idx, slice):
            for k in list(self._modules)[idx]:
                del self._modules[k]
        else:
            del self._modules[_abs_index(self, idx)]
        _renumber(self)

    def __iter__(self):
        return iter(self._modules.values())

    def __len__(self):
        return len(self._modules)


class ModuleDict(Module):
    """A dict of modules (keys are their names in parameters() and state_dict()), in insertion
    order."""

    def __init__(self, modules=None):
        super().__init__()
        if modules is not None:
            self.update(modules)

    def __getitem__(self, key):
        return self._modules[key]

    def __setitem__(self, key, module):
        self.add_module(key, module)

    def __delitem__(self, key):
        del self._modules[key]

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules)

    def __contains__(self, key):
        return key in self._modules

    def keys(self):
        return self._modules.keys()

    def items(self):
        return self._modules.items()

    def values(self):
        return self._modules.values()

    def clear(self):
        self._modules.clear()

    def pop(self, key):
        m = self[key]
        del self[key]
        return m

    def update(self, modules):
        for key, m in _pairs("ModuleDict", modules):
            self[key] = m


def _pairs(cls, items):
    """The (key, value) pairs of a mapping, or of an iterable of pairs (as torch's update)."""
    if hasattr(items, "keys"):
        return [(k, items[k]) for k in items.keys()]
    if isinstance(items, (Module, Tensor)) or not hasattr(items, "__iter__"):
        raise TypeError(f"{cls}.update should be called with a mapping or an iterable of key/value pairs, but got "
                        f"{type(items).__name__}")
    pairs = []
    for j, kv in enumerate(items):
        if not hasattr(kv, "__iter__") or isinstance(kv, (str, Tensor)):
            raise TypeError(f"{cls}.update: element #{j} is {_a_type(kv)}, not a key/value pair")
        kv = tuple(kv)
        if len(kv) != 2:
            raise ValueError(f"{cls}.update: element #{j} has length {len(kv)}; 2 is required")
        pairs.append(kv)
    return pairs


def _as_parameter(value):
    # As torch's ParameterList/Dict: a plain tensor becomes a Parameter (sharing its memory).
    return Parameter(value) if isinstance(value, Tensor) and not isinstance(value, Parameter) else value


class ParameterList(Module):
    """A list of parameters, registered as 0, 1, ... (in parameters() and state_dict()); a tensor
    added becomes a Parameter."""

    def __init__(self, values=None):
        super().__init__()
        object.__setattr__(self, "_size", 0)
        if values is not None:
            self += values

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return ParameterList([self[i] for i in range(len(self))[idx]])
        return getattr(self, _abs_index(self, idx))

    def __setitem__(self, idx, param):
        setattr(self, _abs_index(self, idx), _as_parameter(param))

    def __len__(self):
        return self._size

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def __iadd__(self, parameters):
        return self.extend(parameters)

    def append(self, value):
        object.__setattr__(self, "_size", self._size + 1)
        self[self._size - 1] = value
        return self

    def extend(self, values):
        if isinstance(values, (Module, Tensor)) or not hasattr(values, "__iter__"):
            raise TypeError(f"ParameterList.extend should be called with an iterable, but got {type(values).__name__}")
        for v in values:
            self.append(v)
        return self

    def extra_repr(self):
        return "\n".join(f"  ({i}): {_param_line(p)}" for i, p in enumerate(self))


class ParameterDict(Module):
    """A dict of parameters (keys are their names in parameters() and state_dict()), in insertion
    order; a tensor added becomes a Parameter."""

    def __init__(self, parameters=None):
        super().__init__()
        object.__setattr__(self, "_keys", {})
        if parameters is not None:
            self.update(parameters)

    def __getitem__(self, key):
        if key not in self._keys:
            raise KeyError(key)
        return getattr(self, key)

    def __setitem__(self, key, value):
        self._keys[key] = None
        try:
            setattr(self, key, _as_parameter(value))
        except BaseException:
            del self._keys[key]
            raise

    def __delitem__(self, key):
        del self._keys[key]
        delattr(self, key)

    def __len__(self):
        return len(self._keys)

    def __iter__(self):
        return iter(self._keys)

    def __contains__(self, key):
        return key in self._keys

    def keys(self):
        return list(self._keys)

    def items(self):
        return [(k, self[k]) for k in self._keys]

    def values(self):
        return [self[k] for k in self._keys]

    def get(self, key, default=None):
        return self[key] if key in self else default

    def pop(self, key):
        v = self[key]
        del self[key]
        return v

    def clear(self):
        for k in list(self._keys):
            del self[k]

    def update(self, parameters):
        pairs = _pairs("ParameterDict", parameters)
        if hasattr(parameters, "keys") and not isinstance(parameters, (OrderedDict, ParameterDict)):
            pairs.sort(key=lambda kv: kv[0])  # as torch: a plain dict's keys in sorted order
        for key, value in pairs:
            self[key] = value

    def extra_repr(self):
        return "\n".join(f"  ({k}): {_param_line(p)}" for k, p in self.items())


def _param_line(p):
    if not isinstance(p, Tensor):
        return f"Object of type: {type(p).__name__}"
    dev = "" if p.device.type == "cpu" else f" ({p.device})"
    return (f"{'Parameter' if isinstance(p, Parameter) else 'Tensor'} containing: "
            f"[kiln.{p.dtype.name} of size {'x'.join(str(s) for s in p.shape)}{dev}]")


class CppModule(Module):
    """A module built in C++ (kiln.models), and each of its submodules, under the C++ (torchvision,
    Hugging Face) names: children, named_modules, get_submodule, apply and attribute access
    (model.fc, model.layer1[0]) work as torch's. Its parameters (kiln.nn.Parameter) and buffers are
    the C++ module's own tensors (shared: an optimizer step from Python updates the C++ model);
    train/eval, to and load_state_dict go to C++. The tree is fixed: the C++ forward uses its own
    members, so a child, parameter or buffer cannot be replaced, added or deleted from Python, and
    hooks run only on the whole model (a submodule's forward runs inside the C++ one)."""

    def __init__(self, cmodule, _wrappers=None, _path=""):
        super().__init__()
        object.__setattr__(self, "_c", cmodule)
        object.__setattr__(self, "_path", _path)  # "" for the model itself, else the dotted name
        # The Python object of each C++ tensor, made once and shared by the whole tree (key: the tensor
        # itself, so both names of a tied tensor give one Parameter): every call gives the same
        # objects, as torch's, so `is`, id(), sets and dicts keyed by parameters work. It stays valid:
        # the C++ module never replaces its tensors; to() converts and moves each in place (its impl)
        # and load_state_dict copies into it, and the wrapper is a second handle onto that impl.
        # Not kept on the module: a submodule held alone (model.fc) keeps only its own tensors alive.
        wrappers = {} if _wrappers is None else _wrappers
        for store, params in ((self._parameters, True), (self._buffers, False)):
            for name, t, key in cmodule.own_tensors(params):
                w = wrappers.get(key)
                if w is None:
                    if params:
                        w = Tensor.__new__(Parameter)
                        Tensor.__init__(w, t)  # the same tensor, not Parameter()'s detached copy
                    else:
                        w = t
                    wrappers[key] = w
                store[name] = w
        for name, child in cmodule.children():
            kind = _CppModuleList if child.type_name in ("ModuleList", "Sequential") else CppModule
            self._modules[name] = kind(child, wrappers, f"{_path}.{name}" if _path else name)

    def _refuse(self, what):
        where = f"'{self._path}' ({self._c.type_name})" if self._path else f"the model ({self._c.type_name})"
        raise KilnError(f"{what} of {where}: a kiln.models model is built in C++ and its forward uses its "
                        "own submodules, parameters and buffers, so they cannot be replaced, added or deleted "
                        "from Python; build the model you want in Python (kiln.nn), or copy weights in with "
                        "load_state_dict")

    def __setattr__(self, name, value):
        d = self.__dict__
        if name in d["_parameters"] or name in d["_buffers"] or name in d["_modules"] or \
                isinstance(value, (Parameter, Module)):
            self._refuse(f"cannot assign '{name}'")
        object.__setattr__(self, name, value)

    def __delattr__(self, name):
        d = self.__dict__
        if name in d["_parameters"] or name in d["_buffers"] or name in d["_modules"]:
            self._refuse(f"cannot delete '{name}'")
        object.__delattr__(self, name)

    def register_parameter(self, name, param):
        self._refuse(f"cannot register parameter '{name}'")

    def register_buffer(self, name, tensor, persistent=True):
        self._refuse(f"cannot register buffer '{name}'")

    def add_module(self, name, module):
        self._refuse(f"cannot add module '{name}'")

    def _hook_on_submodule(self, kind):
        if self._path:
            raise KilnError(f"{kind} on '{self._path}' ({self._c.type_name}): a kiln.models model runs its "
                            "submodules inside its C++ forward, where Python hooks are not called; register it "
                            "on the whole model")

    def register_forward_pre_hook(self, hook, **flags):
        self._hook_on_submodule("register_forward_pre_hook")
        return super().register_forward_pre_hook(hook, **flags)

    def register_forward_hook(self, hook, **flags):
        self._hook_on_submodule("register_forward_hook")
        return super().register_forward_hook(hook, **flags)

    def register_full_backward_hook(self, hook):
        self._hook_on_submodule("register_full_backward_hook")
        return super().register_full_backward_hook(hook)

    def forward(self, x):
        # A one-tensor layer (Linear, Conv2d, a ResNet block, ...) of the tree, called on its own.
        return self._c.forward(x)

    def __copy__(self):
        # As copy.copy of a torch module: a new wrapper whose attributes are this one's (the same C++
        # module, parameter and child dicts); __reduce_ex__ below refuses pickling only.
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        return new

    def __reduce_ex__(self, protocol):
        # pickle would reach the C++ module and fail with "cannot pickle '_CModule' object", which
        # does not say what to do instead.
        what = f"'{self._path}' ({self._c.type_name}), a submodule of a kiln.models model" if self._path \
            else f"a kiln.models model ({self._c.type_name})"
        raise TypeError(f"cannot pickle {what}: it is built in C++; save its weights instead, "
                        "kiln.save(model.state_dict(), 'model.safetensors'), and load them into "
                        "kiln.models.create(name) with load_state_dict(kiln.load('model.safetensors'))")

    def __deepcopy__(self, memo):
        raise KilnError(f"copy.deepcopy of '{self._path}' ({self._c.type_name}), a submodule of a kiln.models "
                        "model: deep-copy the whole model")

    def _set_mode(self, mode):
        self._c.train(mode)

    def _convert(self, device, dtype, moved, prefix):
        # The C++ to() converts this module's whole subtree in place (the tensors, so every wrapper sees
        # it); to() reaching a submodule after its parent finds nothing left to do.
        if device is not None:
            self._c.to_device(device)
        if dtype is not None:
            self._c.to_dtype(dtype)

    def _refuse_assign(self, what):
        where = f"'{self._path}' ({self._c.type_name})" if self._path else f"the model ({self._c.type_name})"
        raise KilnError(f"{what}: {where} is a kiln.models model, built in C++, whose forward uses its own "
                        "tensors, so they cannot be replaced by the state dict's; load with assign=False "
                        "(the values are copied into the model's tensors)")

    def load_state_dict(self, state_dict, strict=True, assign=False):
        if assign:
            self._refuse_assign("load_state_dict(assign=True)")
        state_dict = _state_tensors(state_dict, self._c.state_dict())
        return IncompatibleKeys(*self._c.load_state_dict(dict(state_dict), strict))

    def extra_repr(self):
        n = self._c.num_parameters()
        if not self._path:
            return f"{self._c.type_name}, {n} parameters"
        return f"{n} parameters" if n else ""

    def __repr__(self):
        r = super().__repr__()
        # A submodule under its C++ type's name (Conv2d, BasicBlock), as torch prints it.
        return self._c.type_name + r[len(type(self).__name__):] if self._path else r


class _CppModuleList(CppModule):
    """A C++ ModuleList or Sequential inside a kiln.models model: its children by index, len and
    iteration, as torch's (model.layer1[0]); only these are sequences, so bool() and iter() of any
    other module behave as torch's."""

    def __getitem__(self, idx):
        return getattr(self, _abs_index(self, idx))

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())

