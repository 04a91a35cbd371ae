"""kiln.optim: the engine's optimizers (SGD, Adam, AdamW, LAMB: fused update kernels, one step over
all parameters; RMSprop, Adagrad: engine tensor ops per parameter) and LR schedules (kiln.optim.lr_scheduler: torch's schedulers). Parameters are
updated in place, so a model built in Python or in C++ (kiln.models) sees the update.

    opt = kiln.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4)
    loss.backward(); opt.step(); opt.zero_grad()

state_dict() is torch's layout ({"state": {index: {"step", "exp_avg", ...}}, "param_groups": [...]}), so a
torch optimizer's state resumes in Kiln and Kiln's in torch; Kiln's older layout ({"tensors", "scalars",
"groups"}) still loads.
"""
import collections.abc
import numbers
import math

import numpy as np

from .. import _C
from . import lr_scheduler  # noqa: F401  (kiln.optim.lr_scheduler, torch's schedulers)
from .._tensor import _a_type, no_grad as _no_grad
from .._C import LrSchedule  # noqa: F401


def _params(params):
    if isinstance(params, _C.Tensor):
        return [params]
    params = list(params)
    tensors = [i for i, p in enumerate(params) if not isinstance(p, dict)]
    dicts = [i for i, p in enumerate(params) if isinstance(p, dict)]
    if tensors and dicts:
        raise TypeError(f"optimizer: params mixes tensors (item {tensors[0]}) and parameter-group dicts (item "
                        f"{dicts[0]}); give a list of tensors or a list of dicts, as torch.optim does (put the "
                        f"loose tensors in a group of their own: {{'params': [...]}})")
    if dicts:  # each group's params as a list of the caller's own tensors (a generator is read once)
        params = [dict(d, params=[d["params"]] if isinstance(d.get("params"), _C.Tensor) else list(d["params"]))
                  if "params" in d else d for d in params]
    return params


# The first group's key in state_dict() for the optimizer's step count (opt.steps), which torch's layout
# lacks: torch keeps it as a note of the group and ignores it; Kiln's load_state_dict restores the count
# from it.
_STEPS_KEY = "kiln_steps"

# Group keys that Python handles, not the engine: maximize (the gradients negated for the step, as
# torch's), foreach and fused (how torch runs its update; Kiln's is always one fused engine step), and
# Adam's decoupled_weight_decay and capturable (Adam._py_keys).
_PY_KEYS = ("maximize", "foreach", "fused")


def _py_key(key, value):
    if key in ("maximize", "decoupled_weight_decay"):
        return bool(value)
    if key == "capturable":  # Adam's: accepted (a group's own too, as torch's) and not used
        if not isinstance(value, (bool, np.bool_)):
            raise TypeError(f"optimizer: capturable must be True or False, got {value!r:.100}")
        return bool(value)
    if value is not None and not isinstance(value, bool):
        raise TypeError(f"optimizer: {key} must be None, True or False, got {value!r}")
    return value


def _split(groups, options, check, py_keys=_PY_KEYS):
    """Groups for the engine (params, lr, weight_decay, name) and each group's own options (momentum,
    betas, maximize, ...: a group may set them, as torch's may), checked."""
    if not groups or not isinstance(groups[0], dict):
        return groups, [{}]
    engine, extras = [], []
    for g in groups:
        # other keys go to the engine, which refuses them (a misspelt 'lrr' is not silently dropped)
        engine.append({k: v for k, v in g.items() if k not in options and k not in py_keys})
        extras.append({k: check(k, v) if k in options else _py_key(k, v) for k, v in g.items()
                       if k in options or k in py_keys})
    return engine, extras


class _ParamList(list):
    """A group's 'params': the engine steps the tensors it was given, so the list cannot change in place
    (`group['params'][0] = t` would leave the engine stepping the old tensor while the list shows the new)."""

    def __init__(self, index, params):
        super().__init__(params)
        self._index = index

    def _refuse(self, *args, **kwargs):
        raise _C.KilnValueError(f"optimizer: param_groups[{self._index}]['params'] cannot be changed after the "
                                f"optimizer is built (the engine steps the tensors it was given): build a new "
                                f"optimizer, or add others with add_param_group")

    __setitem__ = __delitem__ = __iadd__ = __imul__ = _refuse
    append = extend = insert = pop = remove = clear = sort = reverse = _refuse

    def __reduce__(self):  # pickled and copied as the plain list it shows
        return (list, (list(self),))


class _ParamGroup(dict):
    """One entry of Optimizer.param_groups: a dict whose 'lr' and 'weight_decay' are the engine's, so
    `group['lr'] = x` takes effect at the next step (checked as the constructor checks it). The
    optimizer's own options (momentum, betas, ...) may be set per group, as torch's (OneCycleLR cycles
    them): the engine takes each group's at the next step. Other keys are kept as given (a scheduler's
    notes)."""

    def __init__(self, opt, index, values):
        super().__init__(values)
        self._opt, self._index = opt, index
        if "params" in values:
            dict.__setitem__(self, "params", _ParamList(index, values["params"]))

    def __setitem__(self, key, value):
        impl = self._opt._engine
        if key == "lr":
            impl.set_group_lr(self._index, float(value))
            value = impl.lrs[self._index]
        elif key == "weight_decay":
            self._opt._set_weight_decay(self._index, float(value))
        elif key in ("params", "name"):
            raise _C.KilnValueError(f"optimizer: param_groups[{self._index}]['{key}'] cannot be changed after the "
                                    f"optimizer is built")
        elif key in self._opt._options:
            value = self._opt._check_option(key, value)
        elif key in self._opt._py_keys:
            value = _py_key(key, value)
        super().__setitem__(key, value)
        if key == "lr":
            self._opt._note_ratios()  # each edit, so that `opt.lr = x` scales by the groups' lrs of now

    def update(self, *args, **kwargs):
        for k, v in dict(*args, **kwargs).items():
            self[k] = v

    def setdefault(self, key, default=None):
        if key not in self:
            self[key] = default
        return self[key]

    def __delitem__(self, key):
        raise _C.KilnValueError(f"optimizer: param_groups[{self._index}] keys cannot be removed")


def _same(q, p):
    """Whether q and p are one tensor: one Python object, or two for the same tensor (a C++ module's
    parameters give a new object each time)."""
    if q is p:
        return True
    return (isinstance(p, _C.Tensor) and isinstance(q, _C.Tensor) and q.data_ptr() == p.data_ptr()
            and q.shape == p.shape and q.dtype == p.dtype)


def _by_param(tensors):
    """The engine's state tensors ({"<group>.<index>.<slot>": tensor}) by parameter, {(group, index): {slot:
    tensor}}, in one pass over the keys (a scan of all of them per parameter was quadratic in their number)."""
    out = {}
    for key, t in tensors.items():
        g, i, slot = key.split(".", 2)
        out.setdefault((int(g), int(i)), {})[slot] = t
    return out


def _in_order(entry, slots):
    """entry's slots in torch's order (slots: the optimizer's _SLOTS; the engine's map is by name)."""
    return {k: entry[k] for k in sorted(entry, key=lambda k: slots.index(k) if k in slots else len(slots))}


def _step_tensor(scalars, g, i):
    """Group g's parameter i's step count (the optimizer's where it has none of its own) as torch keeps it:
    a 0-dim float32 tensor."""
    return _C.from_numpy(np.array(scalars.get(f"{g}.{i}.step", scalars["steps"]), dtype=np.float32))


class _State(collections.abc.Mapping):
    """Optimizer.state: each parameter's state tensors by torch's names, for the parameters that have
    state, in torch's key order: 'step' first (where the optimizer counts steps), then the slots in the
    class's _SLOTS order: step, exp_avg, exp_avg_sq for the Adam family (and LAMB); momentum_buffer for
    SGD with momentum; step, square_avg, momentum_buffer (momentum > 0), grad_avg (centered) for
    RMSprop; step, sum for Adagrad (every parameter from construction). The tensors are the engine's own
    (an in-place change is seen by the next step); 'step' is a new 0-dim f32 tensor, as torch's. As torch's defaultdict(dict), `state[p]` makes p's dict if it has
    none and keeps it (opt._kept): what is written into it stays, and p is then `in` the state."""

    def __init__(self, opt):
        tensors, scalars = opt._engine.state()
        self._kept = opt._kept
        self._items = []
        by_param = _by_param(tensors)
        for g, group in enumerate(opt.param_groups):
            for i, p in enumerate(group["params"]):
                entry = by_param.get((g, i))
                if not entry:
                    continue
                entry = _in_order(entry, opt._SLOTS)
                if opt._counts_steps:
                    entry = {"step": _step_tensor(scalars, g, i), **entry}
                self._items.append((p, entry))

    @staticmethod
    def _lookup(items, p):
        for q, entry in items:  # the same object first: it is the usual case, and the cheap one
            if q is p:
                return entry
        for q, entry in items:
            if _same(q, p):
                return entry
        return None

    def _find(self, p):
        """p's dict: the kept one (with the engine's tensors, which may be newer), else the engine's."""
        entry, kept = self._lookup(self._items, p), self._lookup(self._kept, p)
        if kept is not None and entry is not None:
            kept.update(entry)
        return entry if kept is None else kept

    def __getitem__(self, p):
        # torch's state is a defaultdict(dict): a tensor without state (not stepped yet, or not a
        # parameter of the optimizer) gets an empty dict, not a KeyError, and keeps it
        entry = self._find(p)
        if entry is None:
            entry = {}
            self._kept.append((p, entry))
        elif self._lookup(self._kept, p) is None:
            self._kept.append((p, entry))  # the same dict at the next `state[p]`, with what was written
        return entry

    def get(self, p, default=None):  # as defaultdict.get: the default for a tensor without state, none made
        entry = self._find(p)
        return default if entry is None else entry

    def __contains__(self, p):
        return self._find(p) is not None

    def _keys(self):
        keys = [p for p, _ in self._items]
        return keys + [p for p, _ in self._kept if not any(_same(q, p) for q in keys)]

    def __iter__(self):
        return iter(self._keys())

    def __len__(self):
        return len(self._keys())


class Optimizer:
    """Wraps an engine optimizer: step(), zero_grad(), param_groups (a list of dicts, as torch's), state
    (per parameter), defaults, add_param_group(), lr, state_dict()/load_state_dict()."""

    def __init__(self, params, lr, weight_decay, options, maximize=False, foreach=None, fused=None):
        self._lr, self._weight_decay = float(lr), float(weight_decay)
        py = {k: _py_key(k, v) for k, v in (("maximize", maximize), ("foreach", foreach), ("fused", fused))}
        params = _params(params)
        engine_groups, extras = _split(params, options, self._check_option, self._py_keys)
        self._options = dict(options)  # the optimizer's; each group may hold its own (self._applied)
        self.defaults = {"lr": float(lr), "weight_decay": float(weight_decay), **options, **py}
        self._engine = self._make(engine_groups)
        self.param_groups = []
        user = [params] if not params or not isinstance(params[0], dict) else [g["params"] for g in params]
        for i, ((_, lr, wd, name), ps, extra) in enumerate(zip(self._engine.groups, user, extras)):
            self.param_groups.append(_ParamGroup(self, i, {"params": list(ps), "lr": lr, "weight_decay": wd,
                                                            "name": name, **self._options, **py, **extra}))
        self._applied = [None] * len(self.param_groups)
        self._apply_options()  # each group's options checked by the engine now, not at the first step
        self._ratios = None
        self._note_ratios()
        self._kept = []  # the dicts `state[p]` made or handed out, kept as torch's defaultdict keeps them

    # the group keys Python handles (Adam adds decoupled_weight_decay)
    _py_keys = _PY_KEYS

    def _make(self, groups):
        """The engine optimizer over groups (a list of tensors or of dicts), with self._options."""
        raise NotImplementedError

    def _check_option(self, key, value):
        return value

    def _set_weight_decay(self, index, wd):
        self._engine.set_group_weight_decay(index, wd)

    @property
    def _impl(self):
        """The engine optimizer, with the options the groups hold (kiln.amp.GradScaler steps it)."""
        if any(dict.get(g, "maximize", False) for g in self.param_groups):
            raise _C.KilnValueError(f"{type(self).__name__}: kiln.amp.GradScaler steps the engine optimizer directly, "
                                    f"which cannot negate the gradients for maximize=True: step the optimizer "
                                    f"without a GradScaler, or minimize the negated loss")
        self._apply_options()
        return self._engine

    def _apply_options(self):
        """Gives the engine each group's options (momentum, betas, ...) where they changed since the last
        step (checked by the engine: a bad value is refused naming the group)."""
        for i, g in enumerate(self.param_groups):
            values = {k: dict.get(g, k, now) for k, now in self._options.items()}
            if values != self._applied[i]:
                self._engine.set_group_options(i, self._hyper(values))
                self._applied[i] = values

    def _hyper(self, options):
        """The engine's state scalars for options."""
        raise NotImplementedError

    def _sync(self):
        """The groups' dicts after the engine's values changed (lr, load_state_dict)."""
        for i, (g, (_, lr, wd, _)) in enumerate(zip(self.param_groups, self._engine.groups)):
            dict.__setitem__(g, "lr", lr)
            dict.__setitem__(g, "weight_decay", wd)
            values = self._options_from(self._engine.group_hyper(i))
            for k, v in values.items():
                dict.__setitem__(g, k, v)
            self._applied[i] = values
        self._note_ratios()

    def _note_ratios(self):
        """Each group's lr / the first group's, for `opt.lr = x`, noted at every change of an lr (the
        constructor, `param_groups[i]['lr'] = v`, `opt.lr = x`, a schedule, load_state_dict): taken
        while the first lr is not 0 and kept while it is 0, so `opt.lr = 0` then `opt.lr = 0.1` gives the
        groups their ratios back. Groups that never had a first lr other than 0 have none (all 0: one lr
        for all)."""
        lrs = list(self._engine.lrs)
        if not lrs:
            return
        if lrs[0] != 0:
            self._ratios = [1.0 if lr == lrs[0] else lr / lrs[0] for lr in lrs]
        elif self._ratios is None or len(self._ratios) != len(lrs):
            self._ratios = None if any(lrs) else [1.0] * len(lrs)

    def _l2(self, index):
        """Group index's L2 decay added to its gradients for the step (Adam's); the engine decays the others."""
        return 0.0

    def _check_lrs(self):
        """The engine's lr check (every group's finite and >= 0) before anything runs, its advice fitting the
        group: maximize=True to ascend only where the group does not already set it."""
        for i, group in enumerate(self.param_groups):
            lr = dict.get(group, "lr")
            if not (math.isfinite(lr) and lr >= 0):
                hint = ("the group already sets maximize=True, which ascends with an lr >= 0"
                        if dict.get(group, "maximize", False) else "to ascend, use maximize=True")
                raise _C.KilnError(f"{type(self).__name__}: group {i}'s lr is {lr} at this step; a step needs a "
                                   f"finite lr >= 0 (a negative lr would ascend the gradient where torch's loop "
                                   f"with a schedule past its end never steps; {hint})")

    def step(self, closure=None):
        self._check_lrs()
        loss = closure() if closure is not None else None
        self._apply_options()
        # torch's maximize and Adam's L2 decay: each gradient g of such a group is -g (maximize), plus
        # weight_decay * p (L2), for the engine's step, and put back after it
        saved = []
        try:
            with _no_grad():
                for i, group in enumerate(self.param_groups):
                    flip, wd = bool(dict.get(group, "maximize", False)), self._l2(i)
                    if not (flip or wd):
                        continue
                    for p in group["params"]:
                        g = p.grad
                        if g is None:
                            continue
                        saved.append((p, g))
                        edited = -g if flip else g
                        p.grad = edited + p.detach() * wd if wd else edited
            self._engine.step()
        finally:
            for p, g in saved:
                p.grad = g
        return loss

    def zero_grad(self, set_to_none=True):
        """Drops the gradients (set_to_none=True, as torch) or sets them to zero in place."""
        self._engine.zero_grad(bool(set_to_none))

    @property
    def state(self):
        return _State(self)

    def add_param_group(self, param_group):
        """Adds a group, as torch's: keys it lacks take the optimizer's defaults; a parameter already in
        a group is refused. The engine optimizer is rebuilt over all groups and keeps the state so far."""
        if not isinstance(param_group, dict):
            raise TypeError(f"add_param_group: param_group must be a dict, got {type(param_group).__name__}")
        if "params" not in param_group:
            raise _C.KilnValueError("add_param_group: the group needs 'params'")
        (group,) = _params([param_group])
        for p in group["params"]:
            if not isinstance(p, _C.Tensor):
                raise TypeError(f"add_param_group: 'params' holds {_a_type(p)}, expected kiln.Tensor")
        have = {id(p) for g in self.param_groups for p in g["params"]}
        if any(id(p) in have for p in group["params"]):
            raise ValueError("add_param_group: some parameters appear in more than one parameter group")
        full = {**self.defaults, **group}
        engine_new, (extra,) = _split([full], self._options, self._check_option, self._py_keys)
        self._apply_options()
        # a group's negative lr (a schedule's last) is refused by the engine's constructor: 0 there, the saved
        # scalars' lr restored by load_state
        old = [{"params": list(g["params"]), "lr": max(g["lr"], 0.0), "weight_decay": self._engine_wd(i), "name": g["name"]}
               for i, g in enumerate(self.param_groups)]
        tensors, scalars = self._engine.state()
        engine = self._make(old + engine_new)
        n = len(old)
        _, lr, wd, name = engine.groups[n]
        scalars.update({f"group{n}.lr": lr, f"group{n}.weight_decay": wd, f"group{n}.params": len(full["params"])})
        hyper = self._hyper({**self._options, **extra})
        engine.set_group_options(n, hyper)  # refused here, before anything changes
        scalars.update({f"group{n}.{k}": v for k, v in hyper.items()})
        engine.load_state(tensors, scalars)
        self._engine = engine
        self.param_groups.append(_ParamGroup(self, n, {"params": list(full["params"]), "lr": lr, "weight_decay": wd,
                                                        "name": name, **self._options, **extra}))
        self._applied.append({k: v for k, v in {**self._options, **extra}.items() if k in self._options})
        self._after_add(full)
        self._note_ratios()

    def _engine_wd(self, i):
        return self._engine.groups[i][2]

    def _after_add(self, group):
        pass

    @property
    def lr(self):
        """The first group's lr. Setting it scales every group's lr by the same factor, so the groups keep
        their ratios (groups with one lr all get the value), as a torch LR scheduler scales each group's own."""
        return self._engine.lrs[0]

    @lr.setter
    def lr(self, value):
        self._apply_options()  # the groups' option edits first: _sync reads them back from the engine
        value = float(value)
        self._note_ratios()  # an lr the engine changed by itself, if any
        lrs = list(self._engine.lrs)
        if self._ratios is None or (lrs[0] == 0 and any(lrs)):
            raise _C.KilnValueError(f"optimizer: lr = {value} would scale each group's lr {list(self._engine.lrs)} "
                                    f"by the first group's, which is 0; set param_groups[i]['lr'] for each group "
                                    f"instead")
        self._set_lrs([value if r == 1.0 else value * r for r in self._ratios])

    def _set_lrs(self, lrs):
        self._apply_options()  # as lr's setter
        for i, lr in enumerate(lrs):  # every value checked before any is set
            if not math.isfinite(lr):  # a negative one is kept (step() refuses it), as the groups' setter
                raise _C.KilnValueError(f"optimizer: group {i}'s lr must be finite, got {lr}")
        for i, lr in enumerate(lrs):
            self._engine.set_group_lr(i, lr)
        self._sync()

    @property
    def param_group_lrs(self):
        return list(self._engine.lrs)

    @property
    def steps(self):
        """Steps that updated a parameter (a step without any gradient is not one)."""
        return self._engine.steps

    # keys of a group that the engine's scalars carry (the rest are a group's own notes: initial_lr, ...)
    _ENGINE_KEYS = ("params", "lr", "weight_decay", "name")
    # torch's group keys, in torch's order (state_dict() writes the group's other keys after them);
    # _TORCH_FIXED: those Kiln takes one value of only (the constructor refuses another), with it
    _TORCH_KEYS = ("lr", "weight_decay")
    _TORCH_FIXED = {}
    # the state tensors kept per parameter, shaped as it, by torch's names
    _SLOTS = ()
    # whether each parameter's state has torch's "step" (a 0-dim f32 tensor: the Adam family's; SGD's has none)
    _counts_steps = True

    def state_dict(self):
        """torch's layout: {"state": {index: {slot: tensor}}, "param_groups": [{"lr": ..., options, ...,
        "params": [index, ...]}]}, the parameters numbered 0, 1, ... across the groups in order, as torch's.
        A parameter without state (no step yet) has no entry. The Adam family's "step" is a 0-dim f32
        tensor, as torch's; the other tensors are the engine's own. Each group also keeps Kiln's own keys
        ("name", a scheduler's initial_lr, ...), as torch's keeps initial_lr, and the first group Kiln's
        "kiln_steps" (the optimizer's step count, opt.steps: torch's layout has none; torch's load keeps
        it as a note and its step ignores it)."""
        self._apply_options()
        tensors, scalars = self._engine.state()
        by_param = _by_param(tensors)
        state, groups, index = {}, [], 0
        for g, group in enumerate(self.param_groups):
            indices = []
            for i in range(len(group["params"])):
                entry = by_param.get((g, i))
                if entry:
                    entry = _in_order(entry, self._SLOTS)
                    if self._counts_steps:
                        entry = {"step": _step_tensor(scalars, g, i), **entry}
                    state[index] = entry
                indices.append(index)
                index += 1
            out = {k: self._torch_value(group, k) for k in self._TORCH_KEYS}
            out.update((k, v) for k, v in group.items() if k not in out and k != "params")
            if g == 0:  # the optimizer's own count (opt.steps), which torch's layout has no place for
                out[_STEPS_KEY] = int(scalars["steps"])
            out["params"] = indices
            groups.append(out)
        return {"state": state, "param_groups": groups}

    def _torch_value(self, group, key):
        """group's value of torch's group key."""
        if key in self._TORCH_FIXED:
            return self._TORCH_FIXED[key]
        if key == "capturable":  # a loaded group's own, else the constructor's
            return bool(dict.get(group, key, self._capturable))
        return dict.get(group, key, self.defaults.get(key))

    def load_state_dict(self, state):
        """Restores a state in torch's layout: what state_dict() returned, or torch's own optimizer's
        state_dict() (torch tensors, as torch.load gives them): the state, each parameter's step count, each
        group's lr, weight decay, options (momentum, betas, ...) and other keys (initial_lr, ...), as torch's.
        The layout of Kiln before it, {"tensors": ..., "scalars": ..., "groups": ...} (checkpoints of older
        versions), loads too. The number of groups, each group's number of parameters and each state
        tensor's shape must match; a refused state changes nothing."""
        if isinstance(state, collections.abc.Mapping) and "tensors" in state and "scalars" in state:
            return self._load_kiln_layout(dict(state))
        if not isinstance(state, collections.abc.Mapping) or "state" not in state or "param_groups" not in state:
            got = sorted(state, key=str) if isinstance(state, collections.abc.Mapping) else type(state).__name__
            raise _C.KilnValueError(f"load_state_dict: expected the dict state_dict() returns, with keys 'state' and "
                                    f"'param_groups' (torch's layout), or Kiln's older one with 'tensors' and "
                                    f"'scalars'; got {got}")
        return self._load_kiln_layout(self._from_torch_layout(state), "param_groups")

    def _from_torch_layout(self, state):
        """state (torch's layout) as Kiln's older one, {"tensors", "scalars", "groups"}, checked first."""
        from ..nn.modules import _state_tensors

        name = type(self).__name__
        saved, entries = state["param_groups"], state["state"]
        if not isinstance(saved, (list, tuple)) or not all(isinstance(g, collections.abc.Mapping) for g in saved):
            raise _C.KilnValueError(f"{name}.load_state_dict: 'param_groups' must be a list of dicts (one per "
                                    f"parameter group), got {saved!r:.200}")
        if not isinstance(entries, collections.abc.Mapping):
            raise _C.KilnValueError(f"{name}.load_state_dict: 'state' must be a dict of parameter index -> dict of "
                                    f"state, got {type(entries).__name__}")
        if len(saved) != len(self.param_groups):
            raise _C.KilnValueError(f"{name}.load_state_dict: the state has {len(saved)} parameter group"
                                    f"{'' if len(saved) == 1 else 's'}, this optimizer has {len(self.param_groups)}")
        where = {}  # a saved parameter index -> (group, index in the group)
        for g, (s, mine) in enumerate(zip(saved, self.param_groups)):
            ids = s.get("params")
            if not isinstance(ids, (list, tuple)):
                raise _C.KilnValueError(f"{name}.load_state_dict: param_groups[{g}] has no 'params' list of "
                                        f"parameter indices (got {ids!r:.100})")
            if len(ids) != len(mine["params"]):
                raise _C.KilnValueError(f"{name}.load_state_dict: param_groups[{g}] has {len(ids)} parameter"
                                        f"{'' if len(ids) == 1 else 's'} in the state, this optimizer's group {g} "
                                        f"has {len(mine['params'])}")
            for i, k in enumerate(ids):
                if k in where:
                    raise _C.KilnValueError(f"{name}.load_state_dict: parameter index {k!r} is in param_groups"
                                            f"[{where[k][0]}] and param_groups[{g}]")
                where[k] = (g, i)
        scalars, tensors, steps = {}, {}, []
        for k, entry in entries.items():
            if k not in where and isinstance(k, str) and k.isdigit():
                k = int(k)  # a state written through JSON has its indices as strings
            if k not in where:
                raise _C.KilnValueError(f"{name}.load_state_dict: state[{k!r}] is for no parameter of 'param_groups'")
            g, i = where[k]
            at = f"state[{k!r}] (param_groups[{g}]'s parameter {i})"
            if not isinstance(entry, collections.abc.Mapping):
                raise _C.KilnValueError(f"{name}.load_state_dict: {at} must be a dict of state, got "
                                        f"{type(entry).__name__}")
            p = self.param_groups[g]["params"][i]
            present = []  # the keys of the entry that hold state
            for slot, value in entry.items():
                if slot == "step" and self._counts_steps:
                    step = _whole(value, f"{name}.load_state_dict: {at}'s 'step'")
                    scalars[f"{g}.{i}.step"] = step
                    steps.append(step)
                    present.append(slot)
                    continue
                if value is None and slot == "momentum_buffer":  # torch's SGD before its first step with momentum
                    continue
                if slot == "max_exp_avg_sq":
                    raise _C.KilnValueError(f"{name}.load_state_dict: {at} has 'max_exp_avg_sq' (torch's amsgrad=True"
                                            f"), which Kiln's optimizers do not implement")
                if slot not in self._SLOTS:
                    raise _C.KilnValueError(f"{name}.load_state_dict: {at} has '{slot}', a slot {name} does not keep "
                                            f"(it keeps {', '.join(repr(s) for s in self._SLOTS)})")
                (t,) = _state_tensors({slot: value}, None, f"{name}.load_state_dict: {at}").values()
                if tuple(t.shape) != tuple(p.shape):
                    raise _C.KilnValueError(f"{name}.load_state_dict: {at}'s '{slot}' has shape {tuple(t.shape)}, the "
                                            f"parameter has {tuple(p.shape)}")
                tensors[f"{g}.{i}.{slot}"] = t
                present.append(slot)
            # a parameter's state is all of its keys or none: {"step": 5} alone, or exp_avg without exp_avg_sq,
            # would step from moments of zero with the bias corrections of step 5
            need = (("step",) if self._counts_steps else ()) + self._needed_slots(saved[g], self.param_groups[g])
            missing = [s for s in need if s not in present]
            if present and missing:
                raise _C.KilnValueError(f"{name}.load_state_dict: {at} has {', '.join(repr(s) for s in present)} "
                                        f"but no {', '.join(repr(s) for s in missing)}: a parameter's state holds "
                                        f"all of {', '.join(repr(s) for s in need)} (or none: no entry)")
        # the optimizer's own count (opt.steps): Kiln's note in the first group where the state has it (a
        # state_dict() of Kiln's), else, as torch keeps none, the Adam family's parameters' largest and SGD's
        # 0; the Adam family's never below its parameters' largest (a note a torch optimizer kept and stepped on)
        kiln_steps = saved[0].get(_STEPS_KEY) if saved else None
        if kiln_steps is not None:
            kiln_steps = _whole(kiln_steps, f"{name}.load_state_dict: param_groups[0]['{_STEPS_KEY}']")
        scalars["steps"] = max(steps + ([] if kiln_steps is None else [kiln_steps]), default=0.0)
        scalars.update(self._hyper(self._options))  # the optimizer-wide options stay (torch's defaults)
        groups = []
        for g, (s, mine) in enumerate(zip(saved, self.param_groups)):
            options = {}
            for k in self._options:
                try:
                    options[k] = self._check_option(k, s[k] if k in s else dict.get(mine, k))
                except (TypeError, ValueError) as e:
                    raise type(e)(f"{name}.load_state_dict: param_groups[{g}]['{k}']: {e}") from None
            for k, v in self._hyper(options).items():
                scalars[f"group{g}.{k}"] = v
            for k in ("lr", "weight_decay"):
                v = s.get(k, dict.get(mine, k))
                try:
                    scalars[f"group{g}.{k}"] = float(v)
                except (TypeError, ValueError):
                    raise TypeError(f"{name}.load_state_dict: param_groups[{g}]['{k}'] must be a number, got "
                                    f"{v!r:.100}") from None
            scalars[f"group{g}.params"] = float(len(mine["params"]))
            extra = {}
            for k, v in s.items():
                if k in self._ENGINE_KEYS or k in self._options or k == _STEPS_KEY:
                    continue
                if k in self._TORCH_FIXED:
                    if bool(v) != self._TORCH_FIXED[k]:
                        raise _C.KilnValueError(f"{name}.load_state_dict: param_groups[{g}] sets {k}={v!r}, which "
                                                f"Kiln's {name} does not implement")
                    continue
                extra[k] = v
            groups.append(extra)
        return {"tensors": tensors, "scalars": scalars, "groups": groups}

    def _needed_slots(self, saved, group):
        """The slots a parameter's saved state must hold, given its saved group (torch's dict) and the group
        it loads into: all of _SLOTS (RMSprop's depend on the group's momentum and centered)."""
        return self._SLOTS

    def _group_note(self, key, value, where):
        """A group's key other than the engine's, as load_state_dict keeps it: maximize, foreach, fused (and
        Adam's decoupled_weight_decay and capturable) checked as the constructor checks them, others as given."""
        name = type(self).__name__
        if key in self._py_keys:
            try:
                return _py_key(key, value)
            except TypeError:
                allowed = "True or False" if key == "capturable" else "None, True or False"
                raise TypeError(f"{name}.load_state_dict: {where}['{key}'] must be {allowed}, got "
                                f"{value!r:.100}") from None
        return value

    def _load_kiln_layout(self, state, label="groups"):
        """Restores Kiln's older layout: {"tensors": {...}, "scalars": {...}}: the state, the step counts,
        each group's lr, weight decay and options (momentum, betas, ...) and the optimizer's, and with
        "groups" each group's other keys (initial_lr, ...)."""
        # The slots may be NumPy arrays or torch tensors too (state ported from elsewhere), as a module's.
        from ..nn.modules import _state_tensors

        groups = state.get("groups")  # absent in a state_dict() of an older Kiln
        if groups is not None and (not isinstance(groups, (list, tuple))
                                   or not all(isinstance(g, dict) for g in groups)):
            raise _C.KilnValueError(f"load_state_dict: 'groups' must be a list of dicts (one per parameter group), "
                                    f"got {groups!r:.200}")
        tensors = _state_tensors(state["tensors"], None, "optimizer load_state_dict")
        if groups is not None:  # before anything is loaded
            n = sum(1 for k in state["scalars"] if k.startswith("group") and k.endswith(".lr"))
            if len(groups) != n:
                raise _C.KilnValueError(f"load_state_dict: 'groups' has {len(groups)} dicts, the state's 'scalars' "
                                        f"{n} parameter groups")
        # each group's other keys checked before anything is loaded too (a refused load changes nothing)
        notes = [{k: self._group_note(k, v, f"{label}[{g}]") for k, v in extra.items()
                  if k not in self._ENGINE_KEYS and k not in self._options and k != _STEPS_KEY}
                 for g, extra in enumerate(groups or [])]
        self._engine.load_state(dict(tensors), state["scalars"])
        self._kept = []  # torch's load replaces its state: the dicts state[p] made go with it
        self._options = self._options_from(state["scalars"])
        self._ratios = None  # the loaded lrs', not this optimizer's
        self._sync()
        for group, extra in zip(self.param_groups, notes):
            for k, v in extra.items():  # the engine's keys and options left out: the scalars' value won
                dict.__setitem__(group, k, v)

    def _options_from(self, scalars):
        return self._options


def _whole(value, what):
    """value (a real number, or a 0-dim tensor: torch's 'step') as a float of a whole number >= 0; what names
    it. A bool or a string is refused (float() took "3" and True)."""
    n = value
    if hasattr(value, "item") and not isinstance(value, numbers.Number):  # a tensor or a NumPy array
        shape = tuple(getattr(value, "shape", ()))
        if shape != ():
            raise _C.KilnValueError(f"{what} must be a number or a 0-dim tensor, got a tensor of shape "
                                    f"{list(shape)}")
        n = value.item()
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, numbers.Real):
        raise _C.KilnValueError(f"{what} must be a number (an int or a float) or a 0-dim tensor, got "
                                f"{type(value).__name__} {value!r:.100}")
    n = float(n)
    if not (math.isfinite(n) and n >= 0 and n == int(n)):
        raise _C.KilnValueError(f"{what} is {n}, not a whole number >= 0")
    return n


def _no_differentiable(name, differentiable):
    if differentiable:
        raise _C.KilnValueError(f"{name}: differentiable=True is not implemented (Kiln's optimizer step is not "
                                f"recorded by autograd)")


class SGD(Optimizer):
    """torch.optim.SGD, lr 1e-3 by default as torch's. maximize=True negates the gradients for the step
    (torch's); foreach and fused are accepted and change nothing: the step is always one fused engine step."""

    def __init__(self, params, lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False, *,
                 maximize=False, foreach=None, differentiable=False, fused=None):
        _no_differentiable("SGD", differentiable)
        super().__init__(params, lr, weight_decay,
                         {"momentum": float(momentum), "dampening": float(dampening), "nesterov": bool(nesterov)},
                         maximize, foreach, fused)

    _TORCH_KEYS = ("lr", "momentum", "dampening", "weight_decay", "nesterov", "maximize", "foreach", "differentiable",
                   "fused")
    _TORCH_FIXED = {"differentiable": False}
    _SLOTS = ("momentum_buffer",)
    _counts_steps = False

    def _make(self, groups):
        o = self._options
        return _C._sgd(groups, self._lr, o["momentum"], o["dampening"], o["nesterov"], self._weight_decay)

    def _check_option(self, key, value):
        return bool(value) if key == "nesterov" else float(value)

    def _hyper(self, o):
        return {"momentum": o["momentum"], "dampening": o["dampening"], "nesterov": float(o["nesterov"])}

    def _options_from(self, scalars):
        return {"momentum": scalars["momentum"], "dampening": scalars["dampening"],
                "nesterov": bool(scalars["nesterov"])}


def _betas(name, betas):
    try:
        b1, b2 = (float(b) for b in betas)
    except (TypeError, ValueError):
        raise _C.KilnValueError(f"{name}: betas must be two numbers (beta1, beta2), got {betas!r}") from None
    for i, b in enumerate((b1, b2)):
        if not 0.0 <= b < 1.0:  # torch's words, and the optimizer's name
            raise _C.KilnValueError(f"{name}: Invalid beta parameter at index {i}: {b} (betas[{i}] must be in [0, 1))")
    return b1, b2


def _eps(name, eps):
    eps = float(eps)
    if name == "LAMB" and eps == 0:  # its trust ratio takes the whole update's norm: one 0 / 0 would spoil it all
        raise _C.KilnValueError(f"{name}: Invalid epsilon value: {eps} (LAMB's eps must be > 0: its trust ratio "
                                f"takes the norm of the whole update)")
    # torch's words; 0 is taken, as torch takes it: the step divides by sqrt(v_hat) alone, 0 / 0 (NaN) only
    # where a parameter's gradients have all been 0, as torch's does
    if not (math.isfinite(eps) and eps >= 0):
        raise _C.KilnValueError(f"{name}: Invalid epsilon value: {eps} (eps must be finite and >= 0)")
    return eps


def _no_amsgrad(name, amsgrad):
    if amsgrad:
        raise _C.KilnValueError(f"{name}: amsgrad=True is not implemented by Kiln's engine optimizers (they keep "
                                f"exp_avg and exp_avg_sq only)")


class _AdamFamily(Optimizer):
    _lamb = False
    _TORCH_KEYS = ("lr", "betas", "eps", "weight_decay")
    _SLOTS = ("exp_avg", "exp_avg_sq")

    def __init__(self, params, lr, betas, eps, weight_decay, maximize=False, foreach=None, fused=None):
        name = type(self).__name__
        super().__init__(params, lr, weight_decay, {"betas": _betas(name, betas), "eps": _eps(name, eps)},
                         maximize, foreach, fused)

    def _make(self, groups):
        (b1, b2), eps = self._options["betas"], self._options["eps"]
        return _C._adamw(groups, self._lr, b1, b2, eps, self._weight_decay, self._lamb)

    def _check_option(self, key, value):
        if key == "betas":
            return _betas(type(self).__name__, value)
        return _eps(type(self).__name__, value) if key == "eps" else float(value)

    def _hyper(self, o):
        return {"beta1": o["betas"][0], "beta2": o["betas"][1], "eps": o["eps"]}

    def _options_from(self, scalars):
        return {"betas": (scalars["beta1"], scalars["beta2"]), "eps": scalars["eps"]}


class LAMB(_AdamFamily):
    _lamb = True
    # torch's Adam keys of one value in Kiln (a torch Adam's state loaded into a LAMB): True refused, as Adam's
    _TORCH_FIXED = {"amsgrad": False, "differentiable": False}

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01):
        super().__init__(params, lr, betas, eps, weight_decay)


class Adam(_AdamFamily):
    """torch.optim.Adam: weight_decay is L2, added to the gradient (g + weight_decay * p) before the
    moments, not decoupled as AdamW's; with decoupled_weight_decay=True (the optimizer's default, or a
    group's own, as torch's) it is AdamW's decoupled decay. The engine's AdamW decays the decoupled
    groups itself and the others not at all: their L2 decay is added to each gradient for the step and
    the gradient put back after it. kiln.amp.GradScaler steps the engine directly, so with it an L2
    weight_decay must be 0 (it is refused otherwise). The flag is a group key: state_dict() saves it in
    "param_groups" and load_state_dict restores it, so an AdamW's state loaded into an Adam stays decoupled."""

    # capturable: accepted, a group's own too (as torch's), checked (True or False) and not used
    _py_keys = _PY_KEYS + ("decoupled_weight_decay", "capturable")
    _TORCH_KEYS = ("lr", "betas", "eps", "weight_decay", "amsgrad", "maximize", "foreach", "capturable",
                   "differentiable", "fused", "decoupled_weight_decay")
    _TORCH_FIXED = {"amsgrad": False, "differentiable": False}

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, amsgrad=False, *,
                 maximize=False, foreach=None, capturable=False, differentiable=False, fused=None,
                 decoupled_weight_decay=False):
        name = type(self).__name__
        _no_amsgrad(name, amsgrad)
        _no_differentiable(name, differentiable)
        params = _params(params)
        wd = float(weight_decay)
        # each group's weight_decay (L2 or decoupled, as its flag says); the engine's are set from them
        # at each step (_apply_options)
        if params and isinstance(params[0], dict):
            self._decay = [float(g.get("weight_decay", wd)) for g in params]
            params = [dict(g, weight_decay=0.0) for g in params]
        else:
            self._decay = [wd]
        for i, v in enumerate(self._decay):
            if not (math.isfinite(v) and v >= 0):
                raise _C.KilnValueError(f"{name}: group {i}'s weight_decay must be finite and >= 0, got {v}")
        self._decoupled_default = bool(decoupled_weight_decay)
        self._capturable = bool(capturable)  # accepted and saved, as torch's: the engine's step needs no host sync
        super().__init__(params, lr, betas, eps, 0.0, maximize, foreach, fused)
        self.defaults["weight_decay"] = wd
        self.defaults["decoupled_weight_decay"] = self._decoupled_default
        self.defaults["capturable"] = self._capturable
        for g in self.param_groups:
            dict.setdefault(g, "decoupled_weight_decay", self._decoupled_default)
            dict.setdefault(g, "capturable", self._capturable)  # each group's, as torch's
        self._sync()

    def _decoupled(self, index):
        return bool(dict.get(self.param_groups[index], "decoupled_weight_decay", self._decoupled_default))

    def _make(self, groups):
        # the engine decays nothing until _apply_options gives the decoupled groups their decay
        return super()._make([dict(g, weight_decay=0.0) if isinstance(g, dict) else g for g in groups])

    def _apply_options(self):
        super()._apply_options()
        engine = self._engine.groups
        for i in range(len(self.param_groups)):
            want = self._decay[i] if self._decoupled(i) else 0.0
            if engine[i][2] != want:
                self._engine.set_group_weight_decay(i, want)

    def _set_weight_decay(self, index, wd):
        if not (math.isfinite(wd) and wd >= 0):
            raise _C.KilnValueError(f"optimizer: group {index}'s weight_decay must be finite and >= 0, got {wd}")
        self._decay[index] = wd

    def _engine_wd(self, i):
        return 0.0

    def _after_add(self, group):
        self._decay.append(float(group.get("weight_decay", self.defaults["weight_decay"])))
        dict.setdefault(self.param_groups[-1], "capturable", self._capturable)
        self._sync()

    def _sync(self):
        super()._sync()
        for g, wd in zip(self.param_groups, self._decay):
            dict.__setitem__(g, "weight_decay", wd)

    @property
    def _impl(self):
        if any(self._l2(i) for i in range(len(self.param_groups))):
            raise _C.KilnValueError(f"{type(self).__name__}: kiln.amp.GradScaler steps the engine optimizer directly, "
                                    f"which cannot add Adam's L2 weight decay to the gradients: use weight_decay=0, "
                                    f"decoupled_weight_decay=True (or AdamW) with a GradScaler")
        return super()._impl

    def _l2(self, index):
        return 0.0 if self._decoupled(index) else self._decay[index]

    def _load_kiln_layout(self, state, label="groups"):
        # each group's weight_decay is saved as it is given (L2 or decoupled: the group's flag says which,
        # a group without it, from an older Kiln, keeps this optimizer's); the engine's is set at the next step
        scalars = dict(state["scalars"])
        decay = list(self._decay)
        for i in range(len(decay)):
            key = f"group{i}.weight_decay"
            if key in scalars:
                decay[i] = float(scalars[key])
                if not (math.isfinite(decay[i]) and decay[i] >= 0):
                    raise _C.KilnValueError(f"{type(self).__name__}.load_state_dict: group {i}'s weight_decay must "
                                            f"be finite and >= 0, got {decay[i]}")
                scalars[key] = 0.0
        super()._load_kiln_layout({**state, "scalars": scalars}, label)
        self._decay = decay
        self._sync()


class AdamW(Adam):
    """torch.optim.AdamW: Adam with decoupled weight decay, 0.01 by default (a subclass of Adam with
    decoupled_weight_decay=True, as torch 2.x's). maximize, foreach and fused as SGD's."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, amsgrad=False, *,
                 maximize=False, foreach=None, capturable=False, differentiable=False, fused=None):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, maximize=maximize, foreach=foreach,
                         capturable=capturable, differentiable=differentiable, fused=fused,
                         decoupled_weight_decay=True)

    def load_state_dict(self, state):
        super().load_state_dict(state)
        for g in self.param_groups:  # torch's AdamW: whatever state it loads, its decay stays decoupled
            dict.__setitem__(g, "decoupled_weight_decay", True)


def _nonneg(name, what, value):
    """value as a float, refused (torch's words: 'Invalid <what> value: ...') unless finite and >= 0."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name}: {what} must be a number, got {value!r:.100}") from None
    if not (math.isfinite(v) and v >= 0):  # torch's words, the value as given
        word = {"lr": "Invalid learning rate", "eps": "Invalid epsilon value"}.get(what, f"Invalid {what} value")
        raise _C.KilnValueError(f"{name}: {word}: {value} ({what} must be finite and >= 0)")
    return v


class RMSprop(Optimizer):
    """torch.optim.RMSprop, torch's single-tensor rule: weight_decay is L2 (added to the gradient),
    centered subtracts the running mean of the gradients, momentum > 0 keeps a buffer of the steps.
    state per parameter as torch's: 'step', 'square_avg', 'momentum_buffer' (momentum > 0), 'grad_avg'
    (centered). The engine steps with tensor ops per parameter (no fused kernel; no host reads but a
    GradScaler's skip flag, once a step).
    maximize negates the gradients (torch's); capturable and foreach are accepted and change nothing."""

    _py_keys = ("maximize", "foreach", "capturable")
    _TORCH_KEYS = ("lr", "momentum", "alpha", "eps", "centered", "weight_decay", "capturable", "foreach", "maximize",
                   "differentiable")
    _TORCH_FIXED = {"differentiable": False}
    _SLOTS = ("square_avg", "momentum_buffer", "grad_avg")

    def __init__(self, params, lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0, momentum=0, centered=False,
                 capturable=False, foreach=None, maximize=False, differentiable=False):
        _no_differentiable("RMSprop", differentiable)
        lr, weight_decay = _nonneg("RMSprop", "lr", lr), _nonneg("RMSprop", "weight_decay", weight_decay)
        self._capturable = _py_key("capturable", capturable)
        options = {"momentum": self._check_option("momentum", momentum), "alpha": self._check_option("alpha", alpha),
                   "eps": self._check_option("eps", eps), "centered": self._check_option("centered", centered)}
        super().__init__(params, lr, weight_decay, options, maximize, foreach)
        # torch's RMSprop has capturable where the others have fused
        del self.defaults["fused"]
        self.defaults["capturable"] = self._capturable
        for g in self.param_groups:
            dict.pop(g, "fused", None)
            dict.setdefault(g, "capturable", self._capturable)

    def _make(self, groups):
        o = self._options
        return _C._rmsprop(groups, self._lr, o["alpha"], o["eps"], o["momentum"], o["centered"], self._weight_decay)

    def _check_option(self, key, value):
        return bool(value) if key == "centered" else _nonneg("RMSprop", key, value)

    def _hyper(self, o):
        return {"alpha": o["alpha"], "eps": o["eps"], "momentum": o["momentum"], "centered": float(o["centered"])}

    def _options_from(self, scalars):
        return {"momentum": scalars["momentum"], "alpha": scalars["alpha"], "eps": scalars["eps"],
                "centered": bool(scalars["centered"])}

    def _after_add(self, group):
        dict.setdefault(self.param_groups[-1], "capturable", self._capturable)

    def _needed_slots(self, saved, group):
        """square_avg only: the engine makes a missing momentum_buffer or grad_avg as zeros at the next step that
        needs it, as it does after momentum or centered is switched on, so a state saved then (before the next
        step: the group says momentum > 0 or centered, the entry has no buffer yet) loads back. A slot that is
        there is still checked (a tensor of the parameter's shape, one of _SLOTS)."""
        return ("square_avg",)


class Adagrad(Optimizer):
    """torch.optim.Adagrad, torch's single-tensor rule for dense gradients: weight_decay is L2, the step is
    lr / (1 + (step - 1) * lr_decay) * g / (sqrt(sum) + eps), 'sum' starting at initial_accumulator_value.
    state per parameter as torch's: 'step' and 'sum', made at construction for every parameter, as
    torch's (step 0, sum = the optimizer's initial_accumulator_value; a group's own, in the constructor's
    groups or add_param_group's, is kept as a key but never used: an added group's sum, made at its first
    step, starts from the optimizer's value too, as torch 2.x's). 'sum' is f32 (f64 for f64 parameters),
    also for f16/bf16 parameters (torch's is the parameter's dtype). The
    engine steps with tensor ops per parameter (no fused kernel; no host reads but a GradScaler's skip flag,
    once a step). maximize negates the
    gradients; foreach and fused are accepted and change nothing."""

    _TORCH_KEYS = ("lr", "lr_decay", "eps", "weight_decay", "initial_accumulator_value", "foreach", "maximize",
                   "differentiable", "fused")
    _TORCH_FIXED = {"differentiable": False}
    _SLOTS = ("sum",)

    def __init__(self, params, lr=1e-2, lr_decay=0, weight_decay=0, initial_accumulator_value=0, eps=1e-10,
                 foreach=None, *, maximize=False, differentiable=False, fused=None):
        _no_differentiable("Adagrad", differentiable)
        lr, weight_decay = _nonneg("Adagrad", "lr", lr), _nonneg("Adagrad", "weight_decay", weight_decay)
        options = {"lr_decay": self._check_option("lr_decay", lr_decay), "eps": self._check_option("eps", eps),
                   "initial_accumulator_value": self._check_option("initial_accumulator_value",
                                                                   initial_accumulator_value)}
        super().__init__(params, lr, weight_decay, options, maximize, foreach, fused)
        # torch's Adagrad makes every parameter's state here, step 0 and sum filled with the optimizer's
        # initial_accumulator_value (never a group's own: add_param_group's groups get theirs at their first
        # step, as the engine makes them, from the optimizer's value too, as torch 2.x's). The sum is in the
        # engine's state dtype (f32, f64 for f64 parameters), not a 16-bit parameter's: 1e5 stays finite
        # and 0.1 is 0.1 in f32.
        tensors, scalars = self._engine.state()
        for g, group in enumerate(self.param_groups):
            for i, p in enumerate(group["params"]):
                dt = _C.dtype.float64 if p.dtype == _C.dtype.float64 else _C.dtype.float32
                tensors[f"{g}.{i}.sum"] = _C.full_like(p.detach(), options["initial_accumulator_value"], dtype=dt)
        self._engine.load_state(tensors, scalars)

    def _make(self, groups):
        o = self._options
        return _C._adagrad(groups, self._lr, o["lr_decay"], o["eps"], o["initial_accumulator_value"],
                           self._weight_decay)

    def _check_option(self, key, value):
        return _nonneg("Adagrad", key, value)

    def _hyper(self, o):
        return {"lr_decay": o["lr_decay"], "eps": o["eps"], "initial_accumulator_value": o["initial_accumulator_value"]}

    def _options_from(self, scalars):
        return {k: scalars[k] for k in ("lr_decay", "eps", "initial_accumulator_value")}


def decay_groups(named_parameters, lr, weight_decay):
    """Parameter groups as kiln train makes them: weight decay on weights, none on biases and
    normalisation weights."""
    return _C._decay_groups(list(named_parameters), lr, weight_decay)


class LambdaSchedule:
    """Sets the lrs from schedule(step) at each step(): schedule is an LrSchedule or any callable giving a rate. Not
    torch's LambdaLR, whose lambda gives a factor of each group's initial lr: for that, use
    kiln.optim.lr_scheduler.LambdaLR. The first group gets schedule(step) itself (one group, or groups of one
    lr: as kiln train sets its rate) and every other group that times its lr / the first group's lr at
    construction, as torch's LR schedulers scale each group's own initial lr: groups of 0.1 and 0.01 under a
    schedule at 0.5 get 0.5 and 0.05."""

    def __init__(self, optimizer, schedule):
        self.optimizer, self.schedule, self.step_count = optimizer, schedule, 0
        self.base_lrs = list(optimizer.param_group_lrs)
        first = self.base_lrs[0]
        if first == 0 and any(b != 0 for b in self.base_lrs):
            raise _C.KilnValueError(f"LambdaSchedule: the first group's lr is 0, so the groups' lrs {self.base_lrs} "
                                    f"cannot keep their ratios to it")
        self._apply(0)

    def _apply(self, step):
        rate, first = float(self.schedule(step)), self.base_lrs[0]
        self.optimizer._set_lrs([rate if b == first else rate * (b / first) for b in self.base_lrs])

    def step(self):
        self.step_count += 1
        self._apply(self.step_count)


from . import swa_utils  # noqa: E402,F401  (kiln.optim.swa_utils: AveragedModel, SWALR, update_bn)
