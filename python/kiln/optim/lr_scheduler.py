"""kiln.optim.lr_scheduler: torch.optim.lr_scheduler's schedulers over kiln.optim's optimizers, with
torch's arguments and arithmetic (the same recursive get_lr, so the lrs match torch's to rounding and
schedulers chain as torch's do): each sets param_groups[i]['lr'] from the group's own initial lr.

    opt = kiln.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = kiln.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=100)
    for epoch in range(100):
        train(...); opt.step(); sched.step()

LambdaLR sets lr = base_lr * lr_lambda(epoch), as torch; kiln.optim.LambdaSchedule instead sets the
first group's lr to schedule(step) itself (kiln train's LrSchedule gives rates, not factors)."""
import math
import types
import warnings
from bisect import bisect_right
from collections import Counter
from functools import partial

__all__ = ["LRScheduler", "LambdaLR", "MultiplicativeLR", "StepLR", "MultiStepLR", "ConstantLR", "LinearLR",
           "ExponentialLR", "PolynomialLR", "SequentialLR", "ChainedScheduler", "CosineAnnealingLR", "ReduceLROnPlateau", "CosineAnnealingWarmRestarts",
           "OneCycleLR", "CyclicLR"]


def _check_optimizer(optimizer, who):
    from . import Optimizer
    if not isinstance(optimizer, Optimizer):
        raise TypeError(f"{who}: {type(optimizer).__name__} is not a kiln.optim optimizer")


def _lrs(optimizer):
    return [group["lr"] for group in optimizer.param_groups]


class LRScheduler:
    """The base of the schedulers, as torch's: step() advances last_epoch and sets each group's lr from
    get_lr(); get_last_lr() is what the last step set; state_dict() holds everything but the optimizer."""

    _is_initial = False  # true within the constructor's first step()

    def __init__(self, optimizer, last_epoch=-1):
        _check_optimizer(optimizer, type(self).__name__)
        self.optimizer = optimizer
        if last_epoch == -1:
            for group in optimizer.param_groups:
                group.setdefault("initial_lr", group["lr"])
        else:
            for i, group in enumerate(optimizer.param_groups):
                if "initial_lr" not in group:
                    raise KeyError(f"{type(self).__name__}: param 'initial_lr' is not specified in param_groups[{i}] "
                                   f"when resuming a scheduler with last_epoch={last_epoch} (>= 0): build it with "
                                   f"last_epoch=-1, or load the optimizer's state first")
        self.base_lrs = [group["initial_lr"] for group in optimizer.param_groups]
        self.last_epoch = last_epoch
        self._initial_step()

    def _initial_step(self):
        self._step_count = 0
        self._is_initial = True
        try:
            self.step()
        finally:
            self._is_initial = False

    def state_dict(self):
        return {key: value for key, value in self.__dict__.items() if key != "optimizer"}

    def load_state_dict(self, state_dict):
        self.__dict__.update(state_dict)

    def get_last_lr(self):
        return self._last_lr

    def get_lr(self):
        raise NotImplementedError

    def step(self, epoch=None):
        if epoch is not None:
            warnings.warn("The epoch parameter in `scheduler.step()` is deprecated (as in torch); call step() "
                          "without it", UserWarning, stacklevel=2)
        self._step_count += 1
        last = self.last_epoch
        try:
            self._update_lr(epoch)
        except BaseException:
            # a refused step, or a get_lr (a user's lr_lambda) that raises, changes nothing: a retry steps the
            # same epoch
            self._step_count -= 1
            self.last_epoch = last
            raise

    def _update_lr(self, epoch=None):
        last = self.last_epoch
        if epoch is None:
            self.last_epoch += 1
            values = self.get_lr()
        else:
            self.last_epoch = epoch
            values = self._get_closed_form_lr() if hasattr(self, "_get_closed_form_lr") else self.get_lr()
        values = list(values)
        # every lr checked before any group's changes (a negative one is kept, as torch's: step() refuses it)
        bad = [(i, lr) for i, lr in enumerate(values) if not math.isfinite(lr)]
        if bad or len(values) != len(self.optimizer.param_groups):
            self.last_epoch = last
            what = (f"group {bad[0][0]}'s lr would be {bad[0][1]} (an lr must be finite)" if bad else
                    f"get_lr() gave {len(values)} lrs for {len(self.optimizer.param_groups)} parameter groups")
            raise ValueError(f"{type(self).__name__}: step at epoch {self.last_epoch + 1 if epoch is None else epoch}: "
                             f"{what}; no group's lr was changed")
        for group, lr in zip(self.optimizer.param_groups, values, strict=True):
            group["lr"] = lr
        self._last_lr = _lrs(self.optimizer)




_LRScheduler = LRScheduler  # torch's old name, which custom schedulers still subclass


def _lambdas(optimizer, lr_lambda, who):
    if not isinstance(lr_lambda, (list, tuple)):
        lambdas = [lr_lambda] * len(optimizer.param_groups)
    else:
        if len(lr_lambda) != len(optimizer.param_groups):
            raise ValueError(f"{who}: expected {len(optimizer.param_groups)} lr_lambdas, but got {len(lr_lambda)}")
        lambdas = list(lr_lambda)
    for f in lambdas:
        if not callable(f):
            raise TypeError(f"{who}: lr_lambda should be a function, but got {type(f).__name__}")
    return lambdas


class _LambdaState:
    """torch's state_dict for schedulers holding functions: a lambda's __dict__ when it is an object."""

    def state_dict(self):
        state = {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "lr_lambdas")}
        state["lr_lambdas"] = [None if isinstance(f, types.FunctionType) else f.__dict__.copy()
                               for f in self.lr_lambdas]
        return state

    def load_state_dict(self, state_dict):
        state = dict(state_dict)
        lr_lambdas = state.pop("lr_lambdas")
        self.__dict__.update(state)
        for f, saved in zip(self.lr_lambdas, lr_lambdas):
            if saved is not None:
                f.__dict__.update(saved)


class LambdaLR(_LambdaState, LRScheduler):
    """lr = base_lr * lr_lambda(epoch) per group (lr_lambda: a function, or one per group)."""

    def __init__(self, optimizer, lr_lambda, last_epoch=-1):
        self.optimizer = optimizer
        self.lr_lambdas = _lambdas(optimizer, lr_lambda, "LambdaLR")
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        return [base_lr * f(self.last_epoch) for f, base_lr in zip(self.lr_lambdas, self.base_lrs, strict=True)]


class MultiplicativeLR(_LambdaState, LRScheduler):
    """lr = lr * lr_lambda(epoch) at each step after the first."""

    def __init__(self, optimizer, lr_lambda, last_epoch=-1):
        self.optimizer = optimizer
        self.lr_lambdas = _lambdas(optimizer, lr_lambda, "MultiplicativeLR")
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        if self._is_initial:
            return _lrs(self.optimizer)
        return [g["lr"] * f(self.last_epoch) for f, g in zip(self.lr_lambdas, self.optimizer.param_groups, strict=True)]


class StepLR(LRScheduler):
    """lr times gamma every step_size epochs."""

    def __init__(self, optimizer, step_size, gamma=0.1, last_epoch=-1):
        self.step_size, self.gamma = step_size, gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        if self.last_epoch == 0 or self.last_epoch % self.step_size != 0:
            return _lrs(self.optimizer)
        return [g["lr"] * self.gamma for g in self.optimizer.param_groups]

    def _get_closed_form_lr(self):
        return [base_lr * self.gamma ** (self.last_epoch // self.step_size) for base_lr in self.base_lrs]


class MultiStepLR(LRScheduler):
    """lr times gamma at each milestone (a milestone given twice: gamma**2)."""

    def __init__(self, optimizer, milestones, gamma=0.1, last_epoch=-1):
        self.milestones, self.gamma = Counter(milestones), gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        if self.last_epoch not in self.milestones:
            return _lrs(self.optimizer)
        return [g["lr"] * self.gamma ** self.milestones[self.last_epoch] for g in self.optimizer.param_groups]

    def _get_closed_form_lr(self):
        milestones = sorted(self.milestones.elements())
        return [base_lr * self.gamma ** bisect_right(milestones, self.last_epoch) for base_lr in self.base_lrs]


class ConstantLR(LRScheduler):
    """lr times factor until epoch total_iters."""

    def __init__(self, optimizer, factor=1.0 / 3, total_iters=5, last_epoch=-1):
        if factor > 1.0 or factor < 0:
            raise ValueError(f"ConstantLR: factor must be in [0, 1], got {factor}")
        self.factor, self.total_iters = factor, total_iters
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        if self.last_epoch == 0:
            return [g["lr"] * self.factor for g in self.optimizer.param_groups]
        if self.last_epoch != self.total_iters:
            return _lrs(self.optimizer)
        return [g["lr"] * (1.0 / self.factor) for g in self.optimizer.param_groups]

    def _get_closed_form_lr(self):
        return [base_lr * (self.factor + (self.last_epoch >= self.total_iters) * (1 - self.factor))
                for base_lr in self.base_lrs]


class LinearLR(LRScheduler):
    """lr factor from start_factor to end_factor, linearly over total_iters epochs."""

    def __init__(self, optimizer, start_factor=1.0 / 3, end_factor=1.0, total_iters=5, last_epoch=-1):
        if start_factor > 1.0 or start_factor <= 0:
            raise ValueError(f"LinearLR: start_factor must be in (0, 1], got {start_factor}")
        if end_factor > 1.0 or end_factor < 0:
            raise ValueError(f"LinearLR: end_factor must be in [0, 1], got {end_factor}")
        self.start_factor, self.end_factor, self.total_iters = start_factor, end_factor, total_iters
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        if self.last_epoch == 0:
            return [g["lr"] * self.start_factor for g in self.optimizer.param_groups]
        if self._is_initial or self.last_epoch > self.total_iters:
            return _lrs(self.optimizer)
        d = self.end_factor - self.start_factor
        return [g["lr"] * (1.0 + d / (self.total_iters * self.start_factor + (self.last_epoch - 1) * d))
                for g in self.optimizer.param_groups]

    def _get_closed_form_lr(self):
        return [base_lr * (self.start_factor + (self.end_factor - self.start_factor) *
                           min(self.total_iters, self.last_epoch) / self.total_iters) for base_lr in self.base_lrs]


class ExponentialLR(LRScheduler):
    """lr times gamma every epoch."""

    def __init__(self, optimizer, gamma, last_epoch=-1):
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        if self._is_initial:
            return _lrs(self.optimizer)
        return [g["lr"] * self.gamma for g in self.optimizer.param_groups]

    def _get_closed_form_lr(self):
        return [base_lr * self.gamma ** self.last_epoch for base_lr in self.base_lrs]


class PolynomialLR(LRScheduler):
    """lr times (1 - epoch / total_iters) ** power, down to 0 at total_iters."""

    def __init__(self, optimizer, total_iters=5, power=1.0, last_epoch=-1):
        self.total_iters, self.power = total_iters, power
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        if self._is_initial or self.last_epoch > self.total_iters:
            return _lrs(self.optimizer)
        factor = ((1.0 - self.last_epoch / self.total_iters) /
                  (1.0 - (self.last_epoch - 1) / self.total_iters)) ** self.power
        return [g["lr"] * factor for g in self.optimizer.param_groups]

    def _get_closed_form_lr(self):
        return [base_lr * (1.0 - min(self.total_iters, self.last_epoch) / self.total_iters) ** self.power
                for base_lr in self.base_lrs]


class CosineAnnealingLR(LRScheduler):
    """eta_min + (base_lr - eta_min) * (1 + cos(pi * epoch / T_max)) / 2, by torch's recursion (which
    keeps a change made to group['lr'] meanwhile, and past T_max rises again)."""

    def __init__(self, optimizer, T_max, eta_min=0.0, last_epoch=-1):
        self.T_max, self.eta_min = T_max, eta_min
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        if self._is_initial:
            return _lrs(self.optimizer)
        if self._step_count == 1 and self.last_epoch > 0:
            return [self.eta_min + (base_lr - self.eta_min) * (1 + math.cos(self.last_epoch * math.pi / self.T_max)) / 2
                    for base_lr in self.base_lrs]
        if (self.last_epoch - 1 - self.T_max) % (2 * self.T_max) == 0:
            return [g["lr"] + (base_lr - self.eta_min) * (1 - math.cos(math.pi / self.T_max)) / 2
                    for base_lr, g in zip(self.base_lrs, self.optimizer.param_groups, strict=True)]
        return [(1 + math.cos(math.pi * self.last_epoch / self.T_max)) /
                (1 + math.cos(math.pi * (self.last_epoch - 1) / self.T_max)) * (g["lr"] - self.eta_min) + self.eta_min
                for g in self.optimizer.param_groups]

    def _get_closed_form_lr(self):
        return [self.eta_min + (base_lr - self.eta_min) * (1 + math.cos(math.pi * self.last_epoch / self.T_max)) / 2
                for base_lr in self.base_lrs]


class SequentialLR(LRScheduler):
    """schedulers[i] from milestones[i - 1] on (each restarted at its milestone, as torch's)."""

    def __init__(self, optimizer, schedulers, milestones, last_epoch=-1):
        _check_optimizer(optimizer, "SequentialLR")
        if len(schedulers) < 1:
            raise ValueError("SequentialLR expects at least one scheduler, but got none")
        for i, s in enumerate(schedulers):
            if isinstance(s, ReduceLROnPlateau):
                raise ValueError(f"SequentialLR does not support ReduceLROnPlateau (its step() needs a metric), "
                                 f"got one at index {i}")
            if getattr(s, "optimizer", None) is not optimizer:
                raise ValueError(f"SequentialLR expects all schedulers to belong to its optimizer; scheduler {i} "
                                 f"({type(s).__name__}) has another")
        if len(milestones) != len(schedulers) - 1:
            raise ValueError(f"SequentialLR expects one milestone fewer than schedulers, got {len(schedulers)} "
                             f"schedulers and {len(milestones)} milestones")
        self._schedulers, self._milestones = schedulers, milestones
        self.last_epoch = last_epoch + 1
        self.optimizer = optimizer
        for group in optimizer.param_groups:  # undo what the schedulers' constructors did
            group["lr"] = group["initial_lr"]
        self._recursive_undo()
        idx = bisect_right(self._milestones, 0)
        self._schedulers[idx]._initial_step()
        self._last_lr = schedulers[idx].get_last_lr()

    def _recursive_undo(self, sched=None):
        scheds = self if sched is None else sched
        if hasattr(scheds, "_schedulers"):
            for s in scheds._schedulers:
                self._recursive_undo(s)
        elif hasattr(scheds, "last_epoch"):
            scheds.last_epoch -= 1

    def step(self):
        self.last_epoch += 1
        idx = bisect_right(self._milestones, self.last_epoch)
        scheduler = self._schedulers[idx]
        if idx > 0 and self._milestones[idx - 1] == self.last_epoch:
            scheduler._update_lr(0)
        else:
            scheduler.step()
        self._last_lr = scheduler.get_last_lr()

    def state_dict(self):
        state = {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "_schedulers")}
        state["_schedulers"] = [s.state_dict() for s in self._schedulers]
        return state

    def load_state_dict(self, state_dict):
        state = dict(state_dict)
        schedulers = state.pop("_schedulers")
        self.__dict__.update(state)
        for s, saved in zip(self._schedulers, schedulers):
            s.load_state_dict(saved)


class ChainedScheduler(LRScheduler):
    """Steps every scheduler of the list at each step() (their factors multiply)."""

    def __init__(self, schedulers, optimizer=None):
        if len(schedulers) < 1:
            raise ValueError("ChainedScheduler expects at least one scheduler, but got none")
        optimizer = optimizer or schedulers[0].optimizer
        for i, s in enumerate(schedulers):
            if isinstance(s, ReduceLROnPlateau):
                raise ValueError(f"ChainedScheduler does not support ReduceLROnPlateau (its step() needs a metric), "
                                 f"got one at index {i}")
            if getattr(s, "optimizer", None) is not optimizer:
                raise ValueError(f"ChainedScheduler expects all schedulers to belong to one optimizer; scheduler {i} "
                                 f"({type(s).__name__}) has another")
        self._schedulers, self.optimizer = schedulers, optimizer
        self._last_lr = _lrs(optimizer)

    def step(self):
        for s in self._schedulers:
            s.step()
        self._last_lr = _lrs(self.optimizer)

    state_dict = SequentialLR.state_dict
    load_state_dict = SequentialLR.load_state_dict


class ReduceLROnPlateau(LRScheduler):
    """lr times factor after `patience` epochs without improvement of the metric given to step()."""

    def __init__(self, optimizer, mode="min", factor=0.1, patience=10, threshold=1e-4, threshold_mode="rel",
                 cooldown=0, min_lr=0, eps=1e-8):
        if factor >= 1.0:
            raise ValueError(f"ReduceLROnPlateau: factor must be < 1.0, got {factor}")
        _check_optimizer(optimizer, "ReduceLROnPlateau")
        self.factor, self.optimizer = factor, optimizer
        if isinstance(min_lr, (list, tuple)):
            if len(min_lr) != len(optimizer.param_groups):
                raise ValueError(f"ReduceLROnPlateau: expected {len(optimizer.param_groups)} min_lrs, got "
                                 f"{len(min_lr)}")
            self.default_min_lr, self.min_lrs = None, list(min_lr)
        else:
            self.default_min_lr, self.min_lrs = min_lr, [min_lr] * len(optimizer.param_groups)
        self.patience, self.cooldown, self.eps = patience, cooldown, eps
        self.last_epoch = 0
        self._last_lr = _lrs(optimizer)
        self._init_is_better(mode, threshold, threshold_mode)
        self._reset()

    def _reset(self):
        self.best, self.cooldown_counter, self.num_bad_epochs = self.mode_worse, 0, 0

    def step(self, metrics, epoch=None):
        current = float(metrics)
        if epoch is None:
            epoch = self.last_epoch + 1
        self.last_epoch = epoch
        if self._is_better(current, self.best):
            self.best, self.num_bad_epochs = current, 0
        else:
            self.num_bad_epochs += 1
        if self.in_cooldown:
            self.cooldown_counter -= 1
            self.num_bad_epochs = 0
        if self.num_bad_epochs > self.patience:
            self._reduce_lr()
            self.cooldown_counter, self.num_bad_epochs = self.cooldown, 0
        self._last_lr = _lrs(self.optimizer)

    def _reduce_lr(self):
        if len(self.optimizer.param_groups) != len(self.min_lrs):
            if self.default_min_lr is None:
                raise RuntimeError(f"ReduceLROnPlateau: the optimizer has {len(self.optimizer.param_groups)} param "
                                   f"groups, min_lrs {len(self.min_lrs)} (a group was added): set min_lrs")
            self.min_lrs = [self.default_min_lr] * len(self.optimizer.param_groups)
        for i, group in enumerate(self.optimizer.param_groups):
            old = float(group["lr"])
            new = max(old * self.factor, self.min_lrs[i])
            if old - new > self.eps:
                group["lr"] = new

    @property
    def in_cooldown(self):
        return self.cooldown_counter > 0

    def _is_better(self, a, best):
        if self.mode == "min" and self.threshold_mode == "rel":
            return a < best * (1.0 - self.threshold)
        if self.mode == "min":
            return a < best - self.threshold
        if self.threshold_mode == "rel":
            return a > best * (self.threshold + 1.0)
        return a > best + self.threshold

    def _init_is_better(self, mode, threshold, threshold_mode):
        if mode not in ("min", "max"):
            raise ValueError(f"ReduceLROnPlateau: mode must be 'min' or 'max', got {mode!r}")
        if threshold_mode not in ("rel", "abs"):
            raise ValueError(f"ReduceLROnPlateau: threshold_mode must be 'rel' or 'abs', got {threshold_mode!r}")
        self.mode_worse = math.inf if mode == "min" else -math.inf
        self.mode, self.threshold, self.threshold_mode = mode, threshold, threshold_mode

    def load_state_dict(self, state_dict):
        self.__dict__.update(state_dict)
        self._init_is_better(self.mode, self.threshold, self.threshold_mode)


class CosineAnnealingWarmRestarts(LRScheduler):
    """Cosine annealing restarted every T_i epochs (T_0, then times T_mult); step(epoch) may take a
    fractional epoch, as torch's."""

    def __init__(self, optimizer, T_0, T_mult=1, eta_min=0.0, last_epoch=-1):
        if not isinstance(T_0, int) or T_0 <= 0:
            raise ValueError(f"CosineAnnealingWarmRestarts: expected a positive integer T_0, got {T_0!r}")
        if not isinstance(T_mult, int) or T_mult < 1:
            raise ValueError(f"CosineAnnealingWarmRestarts: expected an integer T_mult >= 1, got {T_mult!r}")
        if not isinstance(eta_min, (float, int)):
            raise ValueError(f"CosineAnnealingWarmRestarts: expected a float or int eta_min, got {eta_min!r}")
        self.T_0, self.T_i, self.T_mult, self.eta_min, self.T_cur = T_0, T_0, T_mult, eta_min, last_epoch
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        return [self.eta_min + (base_lr - self.eta_min) * (1 + math.cos(math.pi * self.T_cur / self.T_i)) / 2
                for base_lr in self.base_lrs]

    def step(self, epoch=None):
        if epoch is None and self.last_epoch < 0:
            epoch = 0
        if epoch is None:
            epoch = self.last_epoch + 1
            self.T_cur = self.T_cur + 1
            if self.T_cur >= self.T_i:
                self.T_cur = self.T_cur % self.T_i
                self.T_i = self.T_i * self.T_mult
        else:
            if epoch < 0:
                raise ValueError(f"CosineAnnealingWarmRestarts: expected a non-negative epoch, got {epoch}")
            if epoch >= self.T_0:
                if self.T_mult == 1:
                    self.T_cur = epoch % self.T_0
                else:
                    n = int(math.log(epoch / self.T_0 * (self.T_mult - 1) + 1, self.T_mult))
                    self.T_cur = epoch - self.T_0 * (self.T_mult ** n - 1) / (self.T_mult - 1)
                    self.T_i = self.T_0 * self.T_mult ** n
            else:
                self.T_i, self.T_cur = self.T_0, epoch
        self.last_epoch = math.floor(epoch)
        for group, lr in zip(self.optimizer.param_groups, self.get_lr(), strict=True):
            group["lr"] = lr
        self._last_lr = _lrs(self.optimizer)


def _set_momentum(group, use_beta1, m):
    """A group's momentum, or beta1 for an Adam-like optimizer (use_beta1), as torch's cycling schedulers."""
    if use_beta1:
        group["betas"] = (m, *group["betas"][1:])
    else:
        group["momentum"] = m


def _start_momenta(optimizer, use_beta1, max_ms, base_ms):
    """A momentum-cycling scheduler's start (OneCycleLR, CyclicLR): each group's momentum (or beta1) at its
    max, and the two bounds noted in the group, as torch's."""
    for m, b, group in zip(max_ms, base_ms, optimizer.param_groups):
        _set_momentum(group, use_beta1, m)
        group["max_momentum"] = m
        group["base_momentum"] = b


def _per_group(name, optimizer, value, who="OneCycleLR"):
    if isinstance(value, (list, tuple)):
        if len(value) != len(optimizer.param_groups):
            raise ValueError(f"{who}: expected {len(optimizer.param_groups)} values for {name}, got {len(value)}")
        return list(value)
    return [value] * len(optimizer.param_groups)


class OneCycleLR(LRScheduler):
    """The 1cycle policy: lr from max_lr / div_factor up to max_lr (pct_start of total_steps), then down
    to initial_lr / final_div_factor ('cos' or 'linear'; three_phase as torch's). With cycle_momentum
    the momentum (SGD) or beta1 (Adam, AdamW, LAMB) goes the other way, per group as torch's."""

    def __init__(self, optimizer, max_lr, total_steps=None, epochs=None, steps_per_epoch=None, pct_start=0.3,
                 anneal_strategy="cos", cycle_momentum=True, base_momentum=0.85, max_momentum=0.95, div_factor=25.0,
                 final_div_factor=1e4, three_phase=False, last_epoch=-1):
        _check_optimizer(optimizer, "OneCycleLR")
        self.optimizer = optimizer
        if total_steps is not None:
            if not isinstance(total_steps, int) or total_steps <= 0:
                raise ValueError(f"OneCycleLR: expected a positive integer total_steps, got {total_steps!r}")
            self.total_steps = total_steps
        elif epochs is not None and steps_per_epoch is not None:
            if not isinstance(epochs, int) or epochs <= 0:
                raise ValueError(f"OneCycleLR: expected a positive integer epochs, got {epochs!r}")
            if not isinstance(steps_per_epoch, int) or steps_per_epoch <= 0:
                raise ValueError(f"OneCycleLR: expected a positive integer steps_per_epoch, got {steps_per_epoch!r}")
            self.total_steps = epochs * steps_per_epoch
        else:
            raise ValueError("OneCycleLR: give total_steps, or epochs and steps_per_epoch")
        if three_phase:
            self._schedule_phases = [
                {"end_step": float(pct_start * self.total_steps) - 1, "start_lr": "initial_lr", "end_lr": "max_lr",
                 "start_momentum": "max_momentum", "end_momentum": "base_momentum"},
                {"end_step": float(2 * pct_start * self.total_steps) - 2, "start_lr": "max_lr",
                 "end_lr": "initial_lr", "start_momentum": "base_momentum", "end_momentum": "max_momentum"},
                {"end_step": self.total_steps - 1, "start_lr": "initial_lr", "end_lr": "min_lr",
                 "start_momentum": "max_momentum", "end_momentum": "max_momentum"}]
        else:
            self._schedule_phases = [
                {"end_step": float(pct_start * self.total_steps) - 1, "start_lr": "initial_lr", "end_lr": "max_lr",
                 "start_momentum": "max_momentum", "end_momentum": "base_momentum"},
                {"end_step": self.total_steps - 1, "start_lr": "max_lr", "end_lr": "min_lr",
                 "start_momentum": "base_momentum", "end_momentum": "max_momentum"}]
        if not isinstance(pct_start, float) or pct_start < 0 or pct_start > 1:
            raise ValueError(f"OneCycleLR: expected a float pct_start in [0, 1], got {pct_start!r}")
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError(f"OneCycleLR: anneal_strategy must be 'cos' or 'linear', got {anneal_strategy!r}")
        self._anneal_func_type = anneal_strategy
        max_lrs = _per_group("max_lr", optimizer, max_lr)
        if last_epoch == -1:
            for m, group in zip(max_lrs, optimizer.param_groups):
                group["initial_lr"] = m / div_factor
                group["max_lr"] = m
                group["min_lr"] = group["initial_lr"] / final_div_factor
        self.cycle_momentum = cycle_momentum
        if cycle_momentum:
            if "momentum" not in optimizer.defaults and "betas" not in optimizer.defaults:
                raise ValueError("OneCycleLR: cycle_momentum needs an optimizer with momentum or betas")
            self.use_beta1 = "betas" in optimizer.defaults
            max_ms = _per_group("max_momentum", optimizer, max_momentum)
            base_ms = _per_group("base_momentum", optimizer, base_momentum)
            if last_epoch == -1:
                _start_momenta(optimizer, self.use_beta1, max_ms, base_ms)
        super().__init__(optimizer, last_epoch)

    def _anneal_func(self, start, end, pct):
        if self._anneal_func_type == "cos":
            return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)
        return (end - start) * pct + start

    def get_lr(self):
        lrs = []
        step_num = self.last_epoch
        if step_num > self.total_steps:
            raise ValueError(f"OneCycleLR: tried to step {step_num} times; total_steps is {self.total_steps}")
        for group in self.optimizer.param_groups:
            start_step = 0.0
            for i, phase in enumerate(self._schedule_phases):
                end_step = phase["end_step"]
                if step_num <= end_step or i == len(self._schedule_phases) - 1:
                    pct = (step_num - start_step) / (end_step - start_step)
                    lr = self._anneal_func(group[phase["start_lr"]], group[phase["end_lr"]], pct)
                    if self.cycle_momentum:
                        momentum = self._anneal_func(group[phase["start_momentum"]], group[phase["end_momentum"]], pct)
                    break
                start_step = phase["end_step"]
            lrs.append(lr)
            if self.cycle_momentum:
                _set_momentum(group, self.use_beta1, momentum)
        return lrs


def _triangular_scale_fn(x):
    return 1.0


def _triangular2_scale_fn(x):
    return 1 / (2.0 ** (x - 1))


def _exp_range_scale_fn(gamma, x):
    return gamma ** x


class CyclicLR(LRScheduler):
    """Cyclical learning rates (torch's CyclicLR): lr climbs from base_lr to max_lr over step_size_up steps
    and back over step_size_down (default the same), the swing scaled by mode: 'triangular' (1),
    'triangular2' (halved each cycle), 'exp_range' (gamma ** step), or scale_fn(x) with x the cycle
    ('cycle') or the step ('iterations'). With cycle_momentum the momentum (SGD) or beta1 (Adam, AdamW,
    LAMB) goes the other way, between max_momentum and base_momentum. Step it after every batch."""

    def __init__(self, optimizer, base_lr, max_lr, step_size_up=2000, step_size_down=None, mode="triangular",
                 gamma=1.0, scale_fn=None, scale_mode="cycle", cycle_momentum=True, base_momentum=0.8,
                 max_momentum=0.9, last_epoch=-1):
        _check_optimizer(optimizer, "CyclicLR")
        self.optimizer = optimizer
        base_lrs = _per_group("base_lr", optimizer, base_lr, "CyclicLR")
        if last_epoch == -1:
            for lr, group in zip(base_lrs, optimizer.param_groups):
                group["lr"] = lr
        self.max_lrs = _per_group("max_lr", optimizer, max_lr, "CyclicLR")
        step_size_up = float(step_size_up)
        step_size_down = float(step_size_down) if step_size_down is not None else step_size_up
        if step_size_up <= 0 or step_size_down < 0:
            raise ValueError(f"CyclicLR: step_size_up must be > 0 and step_size_down >= 0, got {step_size_up} and "
                             f"{step_size_down}")
        self.total_size = step_size_up + step_size_down
        self.step_ratio = step_size_up / self.total_size
        if mode not in ("triangular", "triangular2", "exp_range") and scale_fn is None:
            raise ValueError(f"CyclicLR: mode must be 'triangular', 'triangular2' or 'exp_range' (or give scale_fn), "
                             f"got {mode!r}")
        if scale_fn is not None and scale_mode not in ("cycle", "iterations"):
            raise ValueError(f"CyclicLR: scale_mode must be 'cycle' or 'iterations', got {scale_mode!r}")
        self.mode, self.gamma = mode, gamma
        self._scale_fn_custom = scale_fn
        self.scale_mode = scale_mode
        self._init_scale_fn()
        self.cycle_momentum = cycle_momentum
        if cycle_momentum:
            if "momentum" not in optimizer.defaults and "betas" not in optimizer.defaults:
                raise ValueError("CyclicLR: cycle_momentum needs an optimizer with momentum or betas")
            self.use_beta1 = "betas" in optimizer.defaults
            self.base_momentums = _per_group("base_momentum", optimizer, base_momentum, "CyclicLR")
            self.max_momentums = _per_group("max_momentum", optimizer, max_momentum, "CyclicLR")
            if last_epoch == -1:
                _start_momenta(optimizer, self.use_beta1, self.max_momentums, self.base_momentums)
        super().__init__(optimizer, last_epoch)
        self.base_lrs = base_lrs

    def step(self, epoch=None):
        # a refused step changes nothing: get_lr sets the momenta before the base checks the lrs
        saved = [{k: g[k] for k in ("momentum", "betas") if k in g} for g in self.optimizer.param_groups]
        try:
            super().step(epoch)
        except BaseException:
            if self.cycle_momentum:
                for g, keep in zip(self.optimizer.param_groups, saved):
                    for k, v in keep.items():
                        g[k] = v
            raise

    def _init_scale_fn(self):
        if self._scale_fn_custom is not None:
            return
        if self.mode == "triangular":
            self._scale_fn_ref, self.scale_mode = _triangular_scale_fn, "cycle"
        elif self.mode == "triangular2":
            self._scale_fn_ref, self.scale_mode = _triangular2_scale_fn, "cycle"
        elif self.mode == "exp_range":
            self._scale_fn_ref, self.scale_mode = partial(_exp_range_scale_fn, self.gamma), "iterations"

    def scale_fn(self, x):
        if self._scale_fn_custom is not None:
            return self._scale_fn_custom(x)
        return self._scale_fn_ref(x)

    def get_lr(self):
        cycle = math.floor(1 + self.last_epoch / self.total_size)
        x = 1.0 + self.last_epoch / self.total_size - cycle
        scale_factor = x / self.step_ratio if x <= self.step_ratio else (x - 1) / (self.step_ratio - 1)
        at = cycle if self.scale_mode == "cycle" else self.last_epoch
        lrs = [base_lr + (max_lr - base_lr) * scale_factor * self.scale_fn(at)
               for base_lr, max_lr in zip(self.base_lrs, self.max_lrs, strict=True)]
        if self.cycle_momentum:
            momenta = [max_m - (max_m - base_m) * scale_factor * self.scale_fn(at)
                       for base_m, max_m in zip(self.base_momentums, self.max_momentums, strict=True)]
            for group, m in zip(self.optimizer.param_groups, momenta, strict=True):
                _set_momentum(group, self.use_beta1, m)
        return lrs

    def state_dict(self):
        # torch's: the mode's scale function is rebuilt on load; a custom one is saved only as an object's
        # __dict__ (a function or lambda is not)
        state = {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "_scale_fn_ref", "_scale_fn_custom")}
        fn = self._scale_fn_custom
        state["_scale_fn_custom"] = None if fn is None or isinstance(fn, types.FunctionType) else fn.__dict__.copy()
        return state

    def load_state_dict(self, state_dict):
        state = dict(state_dict)
        fn = state.pop("_scale_fn_custom", None)
        self.__dict__.update(state)
        if fn is not None:
            self._scale_fn_custom.__dict__.update(fn)
        self._init_scale_fn()
