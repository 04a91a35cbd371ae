"""kiln.optim: the engine's optimizers (SGD, AdamW, LAMB: fused update kernels, one step over all
parameters) and LR schedules. Parameters are updated in place, so a model built in Python or in
C++ (kiln.models) sees the update.

    opt = kiln.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4)
    loss.backward(); opt.step(); opt.zero_grad()
"""
import math

from . import _C
from ._C import LrSchedule  # noqa: F401


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
    return params


class _ParamGroup(dict):
    """One entry of Optimizer.param_groups: a dict whose 'lr' and 'weight_decay' are the engine's, so
    `group['lr'] = x` takes effect at the next step (checked as the constructor checks it). The
    optimizer's own options (momentum, betas, ...) are shown in every group and are the same for all:
    setting one to another value is refused. Other keys are kept as given (a scheduler's notes)."""

    def __init__(self, opt, index, values):
        super().__init__(values)
        self._opt, self._index = opt, index

    def __setitem__(self, key, value):
        impl = self._opt._impl
        if key == "lr":
            impl.set_group_lr(self._index, float(value))
            value = impl.lrs[self._index]
        elif key == "weight_decay":
            impl.set_group_weight_decay(self._index, float(value))
        elif key in ("params", "name"):
            raise _C.KilnValueError(f"optimizer: param_groups[{self._index}]['{key}'] cannot be changed after the "
                                    f"optimizer is built")
        elif key in self._opt._options and value != self._opt._options[key]:
            raise _C.KilnValueError(f"optimizer: '{key}' is the optimizer's, the same for every group (now "
                                    f"{self._opt._options[key]!r}); param_groups[{self._index}]['{key}'] cannot "
                                    f"be set to {value!r}: build the optimizer with {key}={value!r}")
        super().__setitem__(key, value)

    def update(self, *args, **kwargs):
        for k, v in dict(*args, **kwargs).items():
            self[k] = v

    def setdefault(self, key, default=None):
        if key not in self:
            self[key] = default
        return self[key]

    def __delitem__(self, key):
        raise _C.KilnValueError(f"optimizer: param_groups[{self._index}] keys cannot be removed")


class Optimizer:
    """Wraps an engine optimizer: step(), zero_grad(), param_groups (a list of dicts, as torch's),
    lr, state_dict()/load_state_dict()."""

    def __init__(self, impl, options):
        self._impl = impl
        self._options = dict(options)
        self.param_groups = []
        for i, (params, lr, wd, name) in enumerate(impl.groups):
            self.param_groups.append(_ParamGroup(self, i, {"params": list(params), "lr": lr, "weight_decay": wd,
                                                            "name": name, **self._options}))

    def _sync(self):
        """The groups' dicts after the engine's values changed (lr, load_state_dict)."""
        for g, (_, lr, wd, _) in zip(self.param_groups, self._impl.groups):
            dict.__setitem__(g, "lr", lr)
            dict.__setitem__(g, "weight_decay", wd)
            for k, v in self._options.items():
                dict.__setitem__(g, k, v)

    def step(self, closure=None):
        loss = closure() if closure is not None else None
        self._impl.step()
        return loss

    def zero_grad(self, set_to_none=True):
        """Drops the gradients (set_to_none=True, as torch) or sets them to zero in place."""
        self._impl.zero_grad(bool(set_to_none))

    @property
    def lr(self):
        """The first group's lr. Setting it scales every group's lr by the same factor, so the groups keep
        their ratios (groups with one lr all get the value), as a torch LR scheduler scales each group's own."""
        return self._impl.lrs[0]

    @lr.setter
    def lr(self, value):
        value = float(value)
        lrs = list(self._impl.lrs)
        first = lrs[0]
        if all(lr == first for lr in lrs):
            self._impl.set_lr(value)
        elif first == 0:
            raise _C.KilnValueError(f"optimizer: lr = {value} would scale each group's lr {lrs} by the first "
                                    f"group's, which is 0; set param_groups[i]['lr'] for each group instead")
        else:
            self._set_lrs([value if lr == first else value * (lr / first) for lr in lrs])
        self._sync()

    def _set_lrs(self, lrs):
        for i, lr in enumerate(lrs):  # every value checked before any is set
            if not (math.isfinite(lr) and lr >= 0):
                raise _C.KilnValueError(f"optimizer: group {i}'s lr must be finite and >= 0, got {lr}")
        for i, lr in enumerate(lrs):
            self._impl.set_group_lr(i, lr)
        self._sync()

    @property
    def param_group_lrs(self):
        return list(self._impl.lrs)

    @property
    def steps(self):
        """Steps that updated a parameter (a step without any gradient is not one)."""
        return self._impl.steps

    def state_dict(self):
        tensors, scalars = self._impl.state()
        return {"tensors": tensors, "scalars": scalars}

    def load_state_dict(self, state):
        """Restores what state_dict() returned: {"tensors": {...}, "scalars": {...}}: the state, the step
        counts, each group's lr and weight decay and the optimizer's options (momentum, betas, ...), as
        torch's does. The number of groups and their sizes must match."""
        if not isinstance(state, dict) or "tensors" not in state or "scalars" not in state:
            got = sorted(state) if isinstance(state, dict) else type(state).__name__
            raise _C.KilnValueError(f"load_state_dict: expected the dict state_dict() returns, with keys 'tensors' "
                                    f"and 'scalars'; got {got}")
        self._impl.load_state(state["tensors"], state["scalars"])
        self._options = self._options_from(state["scalars"])
        self._sync()

    def _options_from(self, scalars):
        return self._options


class SGD(Optimizer):
    def __init__(self, params, lr=0.1, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False):
        super().__init__(_C._sgd(_params(params), lr, momentum, dampening, nesterov, weight_decay),
                         {"momentum": float(momentum), "dampening": float(dampening), "nesterov": bool(nesterov)})

    def _options_from(self, scalars):
        return {"momentum": scalars["momentum"], "dampening": scalars["dampening"],
                "nesterov": bool(scalars["nesterov"])}


def _betas(name, betas):
    try:
        b1, b2 = (float(b) for b in betas)
    except (TypeError, ValueError):
        raise _C.KilnValueError(f"{name}: betas must be two numbers (beta1, beta2), got {betas!r}") from None
    for i, b in enumerate((b1, b2)):
        if not 0.0 <= b < 1.0:
            raise _C.KilnValueError(f"{name}: betas[{i}] must be in [0, 1), got {b}")
    return b1, b2


class AdamW(Optimizer):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
        b1, b2 = _betas("AdamW", betas)
        super().__init__(_C._adamw(_params(params), lr, b1, b2, eps, weight_decay, False),
                         {"betas": (b1, b2), "eps": float(eps)})

    def _options_from(self, scalars):
        return {"betas": (scalars["beta1"], scalars["beta2"]), "eps": scalars["eps"]}


class LAMB(Optimizer):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01):
        b1, b2 = _betas("LAMB", betas)
        super().__init__(_C._adamw(_params(params), lr, b1, b2, eps, weight_decay, True),
                         {"betas": (b1, b2), "eps": float(eps)})

    def _options_from(self, scalars):
        return {"betas": (scalars["beta1"], scalars["beta2"]), "eps": scalars["eps"]}


def decay_groups(named_parameters, lr, weight_decay):
    """Parameter groups as kiln train makes them: weight decay on weights, none on biases and
    normalisation weights."""
    return _C._decay_groups(list(named_parameters), lr, weight_decay)


class LambdaSchedule:
    """Sets the lrs from schedule(step) at each step(): schedule is an LrSchedule or any callable giving
    a rate. The first group gets schedule(step) itself (one group, or groups of one lr: as kiln train
    sets its rate) and every other group that times its lr / the first group's lr at construction, as
    torch's LR schedulers scale each group's own initial lr: groups of 0.1 and 0.01 under a schedule at
    0.5 get 0.5 and 0.05."""

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
