"""kiln.optim: the engine's optimizers (SGD, AdamW, LAMB: fused update kernels, one step over all
parameters) and LR schedules. Parameters are updated in place, so a model built in Python or in
C++ (kiln.models) sees the update.

    opt = kiln.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4)
    loss.backward(); opt.step(); opt.zero_grad()
"""
from . import _C
from ._C import LrSchedule  # noqa: F401


def _params(params):
    if isinstance(params, _C.Tensor):
        return [params]
    return list(params)


class Optimizer:
    """Wraps an engine optimizer: step(), zero_grad(), lr (all groups), state_dict()/load_state_dict()."""

    def __init__(self, impl):
        self._impl = impl

    def step(self, closure=None):
        loss = closure() if closure is not None else None
        self._impl.step()
        return loss

    def zero_grad(self, set_to_none=True):
        self._impl.zero_grad()

    @property
    def lr(self):
        return self._impl.lrs[0]

    @lr.setter
    def lr(self, value):
        self._impl.set_lr(float(value))

    @property
    def param_group_lrs(self):
        return list(self._impl.lrs)

    @property
    def steps(self):
        return self._impl.steps

    def state_dict(self):
        tensors, scalars = self._impl.state()
        return {"tensors": tensors, "scalars": scalars}

    def load_state_dict(self, state):
        """Restores what state_dict() returned: {"tensors": {...}, "scalars": {...}}."""
        if not isinstance(state, dict) or "tensors" not in state or "scalars" not in state:
            got = sorted(state) if isinstance(state, dict) else type(state).__name__
            raise _C.KilnValueError(f"load_state_dict: expected the dict state_dict() returns, with keys 'tensors' "
                                    f"and 'scalars'; got {got}")
        self._impl.load_state(state["tensors"], state["scalars"])


class SGD(Optimizer):
    def __init__(self, params, lr=0.1, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False):
        super().__init__(_C._sgd(_params(params), lr, momentum, dampening, nesterov, weight_decay))


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
        super().__init__(_C._adamw(_params(params), lr, b1, b2, eps, weight_decay, False))


class LAMB(Optimizer):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01):
        b1, b2 = _betas("LAMB", betas)
        super().__init__(_C._adamw(_params(params), lr, b1, b2, eps, weight_decay, True))


def decay_groups(named_parameters, lr, weight_decay):
    """Parameter groups as kiln train makes them: weight decay on weights, none on biases and
    normalisation weights."""
    return _C._decay_groups(list(named_parameters), lr, weight_decay)


class LambdaSchedule:
    """Sets optimizer.lr = schedule(step) at each step(): schedule is an LrSchedule or any callable."""

    def __init__(self, optimizer, schedule):
        self.optimizer, self.schedule, self.step_count = optimizer, schedule, 0
        optimizer.lr = schedule(0)

    def step(self):
        self.step_count += 1
        self.optimizer.lr = self.schedule(self.step_count)
