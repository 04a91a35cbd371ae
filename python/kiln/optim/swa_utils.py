"""kiln.optim.swa_utils: torch.optim.swa_utils over Kiln modules and optimizers: AveragedModel (a copy
of a model whose parameters are a running average of the model's: SWA's equal average by default, or
EMA through get_ema_multi_avg_fn / get_ema_avg_fn, or any avg_fn / multi_avg_fn), SWALR (anneals each
group's lr to swa_lr) and update_bn (recomputes BatchNorm statistics for the averaged weights).

    swa_model = kiln.optim.swa_utils.AveragedModel(model)
    swa_sched = kiln.optim.swa_utils.SWALR(opt, swa_lr=0.05)
    for epoch in range(epochs):
        train(...)
        if epoch >= swa_start:
            swa_model.update_parameters(model); swa_sched.step()
    kiln.optim.swa_utils.update_bn(loader, swa_model)
"""
import copy
import itertools
import math

from .. import _C
from .._tensor import no_grad, tensor as _tensor
from ..nn.modules import CppModule, Module, _BatchNorm
from .lr_scheduler import LRScheduler, _check_optimizer, _per_group

__all__ = ["AveragedModel", "update_bn", "SWALR", "get_ema_multi_avg_fn", "get_swa_multi_avg_fn",
           "get_ema_avg_fn", "get_swa_avg_fn"]


def _check_decay(decay, who):
    if not 0.0 <= decay <= 1.0:
        raise ValueError(f"{who}: invalid decay value {decay}: give a value in [0, 1]")


def _count(n):
    return n.item() if isinstance(n, _C.Tensor) else n


def get_ema_multi_avg_fn(decay=0.999):
    """An update of lists of tensors: ema = ema * decay + current * (1 - decay), in place."""
    _check_decay(decay, "get_ema_multi_avg_fn")

    def ema_update(ema_param_list, current_param_list, _):
        with no_grad():
            for p_ema, p_model in zip(ema_param_list, current_param_list, strict=True):
                if p_ema.dtype.is_floating_point:
                    p_ema.lerp_(p_model, 1 - decay)
                else:
                    p_ema.copy_(p_ema * decay + p_model * (1 - decay))

    return ema_update


def get_swa_multi_avg_fn():
    """An update of lists of tensors: the equal average of num_averaged + 1 values, in place."""

    def swa_update(averaged_param_list, current_param_list, num_averaged):
        n = _count(num_averaged)
        with no_grad():
            for p_avg, p_model in zip(averaged_param_list, current_param_list, strict=True):
                if p_avg.dtype.is_floating_point:
                    p_avg.lerp_(p_model, 1 / (n + 1))
                else:  # an integer buffer (num_batches_tracked): the mean, truncated (torch refuses it)
                    p_avg.copy_(p_avg + (p_model - p_avg) / (n + 1))

    return swa_update


def get_ema_avg_fn(decay=0.999):
    """The new average of one tensor: decay * ema + (1 - decay) * current."""
    _check_decay(decay, "get_ema_avg_fn")

    def ema_update(ema_param, current_param, num_averaged):
        with no_grad():
            return decay * ema_param + (1 - decay) * current_param

    return ema_update


def get_swa_avg_fn():
    """The new average of one tensor: averaged + (current - averaged) / (num_averaged + 1)."""

    def swa_update(averaged_param, current_param, num_averaged):
        with no_grad():
            return averaged_param + (current_param - averaged_param) / (_count(num_averaged) + 1)

    return swa_update


class AveragedModel(Module):
    """A deep copy of `model` (moved to `device` when given) whose parameters update_parameters(model)
    averages with the model's: the first call copies them, later ones apply avg_fn(averaged, current,
    n_averaged) per tensor or multi_avg_fn(averaged_list, current_list, n_averaged) per list (only one
    of the two; neither: SWA's equal average). With use_buffers the buffers are averaged too (a
    BatchNorm's running statistics; num_batches_tracked as well, as torch's); without, they are copied
    from the model. n_averaged is an int64 buffer, passed as a 0-dim tensor, as torch's."""

    def __init__(self, model, device=None, avg_fn=None, multi_avg_fn=None, use_buffers=False):
        super().__init__()
        if avg_fn is not None and multi_avg_fn is not None:
            raise ValueError("AveragedModel: give avg_fn or multi_avg_fn, not both")
        if not isinstance(model, Module):
            raise TypeError(f"AveragedModel: model must be a kiln.nn.Module, got {type(model).__name__}")
        self.module = copy.deepcopy(model)
        if device is not None:
            self.module = self.module.to(device)
        n = _tensor(0, dtype=_C.dtype.int64)
        self.register_buffer("n_averaged", n.to(device) if device is not None else n)
        self.avg_fn = avg_fn
        self.multi_avg_fn = multi_avg_fn
        self.use_buffers = use_buffers

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def _tensors(self, model):
        if self.use_buffers:
            return list(itertools.chain(model.parameters(), model.buffers()))
        return list(model.parameters())

    def update_parameters(self, model):
        mine, theirs = self._tensors(self.module), self._tensors(model)
        if len(mine) != len(theirs):
            raise ValueError(f"AveragedModel.update_parameters: the model has {len(theirs)} "
                             f"{'parameters and buffers' if self.use_buffers else 'parameters'}, the averaged copy "
                             f"{len(mine)}: give a model of the same structure")
        averaged = [p.detach() for p in mine]
        current = [p.detach().to(a.device) for p, a in zip(theirs, averaged, strict=True)]
        for i, (a, c) in enumerate(zip(averaged, current, strict=True)):
            if a.shape != c.shape:
                raise ValueError(f"AveragedModel.update_parameters: tensor {i} has shape {list(c.shape)} in the model "
                                 f"and {list(a.shape)} in the averaged copy")
        with no_grad():
            n = self.n_averaged.item()  # one host read per update
            if n == 0:
                for a, c in zip(averaged, current):
                    a.copy_(c)
            elif self.avg_fn is not None:
                for a, c in zip(averaged, current):
                    a.copy_(self.avg_fn(a, c, self.n_averaged.to(a.device)))
            elif self.multi_avg_fn is not None:
                # one call per (device, dtype), as torch's grouping
                groups = {}
                for a, c in zip(averaged, current):
                    lists = groups.setdefault((str(a.device), str(a.dtype)), ([], []))
                    lists[0].append(a)
                    lists[1].append(c)
                for a_list, c_list in groups.values():
                    self.multi_avg_fn(a_list, c_list, self.n_averaged.to(a_list[0].device))
            else:
                # SWA's equal average, per tensor as torch's CPU path (an integer buffer: the mean truncated)
                swa = get_swa_avg_fn()
                for a, c in zip(averaged, current):
                    a.copy_(swa(a, c, n))
            if not self.use_buffers:
                # buffers are not averaged: they follow the model's
                for b_avg, b_model in zip(self.module.buffers(), model.buffers()):
                    b_avg.detach().copy_(b_model.detach().to(b_avg.device))
            self.n_averaged.add_(1)


def _cpp_batchnorms(model, bns):
    """The modules other than kiln.nn BatchNorms that hold running_mean and running_var buffers: a
    kiln.models model's C++ BatchNorms (CppModule), as (name, module). A Python module with such
    buffers that is not a kiln.nn BatchNorm is skipped, as torch's update_bn skips it."""
    found = []
    for name, module in model.named_modules():
        if module in bns:
            continue
        bufs = module._buffers
        if bufs.get("running_mean") is None or bufs.get("running_var") is None:
            continue
        if not isinstance(module, CppModule):
            # a Python module that is not a _BatchNorm (InstanceNorm with track_running_stats, a user's
            # own): left alone, as torch's update_bn, which only touches _BatchNorm modules
            continue
        found.append((name or "the model", module))
    return found


def _cpp_stats(module):
    b = module._buffers
    return b["running_mean"], b["running_var"], b.get("num_batches_tracked")


def _reset_cpp(cpp):
    """Each (name, C++ BatchNorm)'s statistics as reset_running_stats leaves them: mean 0, var 1, count 0."""
    with no_grad():
        for _, module in cpp:
            mean, var, count = _cpp_stats(module)
            mean.zero_()
            var.fill_(1)
            if count is not None:
                count.zero_()


def update_bn(loader, model, device=None):
    """One pass over `loader` in training mode to recompute every BatchNorm's running statistics from
    scratch (their cumulative average: momentum None for the pass, then restored), as torch's; an item
    that is a list or tuple gives its first element. A model without BatchNorm is left alone.

    A kiln.models model's BatchNorms are C++ modules whose momentum Python cannot set: their buffers
    (shared with C++) are zeroed before each batch, so the update leaves momentum * the batch's
    statistics, and summed; momentum is measured once, by running the first batch a second time with the
    statistics at one (the update leaves (1 - momentum) + momentum * statistics); at the end each holds
    the sum / (batches * momentum), the cumulative average torch's momentum=None gives, and
    num_batches_tracked the batch count. A C++ BatchNorm the forward does not run is left reset, as
    torch's; one with momentum 0 (its statistics cannot be read back) is a NotImplementedError. Since
    momentum is measured by running the first batch twice, the forward must be deterministic in which
    C++ BatchNorms it runs and what it feeds them, and run each of them on every batch. Python modules
    with running statistics that are not kiln.nn BatchNorms (InstanceNorm with track_running_stats) are
    left alone, as torch's."""
    momenta = {}
    for module in model.modules():
        if isinstance(module, _BatchNorm) and module.track_running_stats:
            module.reset_running_stats()
            momenta[module] = module.momentum
    cpp = _cpp_batchnorms(model, momenta)
    if not momenta and not cpp:
        return
    _reset_cpp(cpp)
    was_training = model.training
    model.train()
    for module in momenta:
        module.momentum = None
    sums = {}  # C++ BatchNorm -> [sum of its mean updates, of its var updates]
    momentum = {}  # C++ BatchNorm -> its measured momentum (absent: the forward does not run it)
    n = 0
    try:
        with no_grad():
            for item in loader:
                if isinstance(item, (list, tuple)):
                    item = item[0]
                if device is not None:
                    item = item.to(device)
                if cpp and n == 0:
                    # the probe: the first batch with every C++ BatchNorm's statistics at one; one the
                    # forward ran has counted a batch or moved its statistics
                    for _, module in cpp:
                        mean, var, count = _cpp_stats(module)
                        mean.fill_(1)
                        var.fill_(1)
                    model(item)
                    probed = {}
                    for _, module in cpp:
                        mean, var, count = _cpp_stats(module)
                        ran = (count is not None and count.item() > 0) or (mean != 1).any().item() or \
                            (var != 1).any().item()
                        probed[module] = (mean.clone(), var.clone()) if ran else None
                    for module in momenta:  # the probe counted the first batch once already
                        module.reset_running_stats()
                for _, module in cpp:
                    mean, var, _ = _cpp_stats(module)
                    mean.zero_()
                    var.zero_()
                model(item)
                for name, module in cpp:
                    mean, var, _ = _cpp_stats(module)
                    if n == 0:
                        if probed[module] is not None:
                            one_mean, one_var = probed[module]
                            # (1 - m) + m * stat against m * stat: 1 - m, averaged over every channel
                            m = 1.0 - ((one_mean - mean).mean().item() + (one_var - var).mean().item()) / 2
                            if not m > 1e-6:
                                raise NotImplementedError(
                                    f"update_bn: BatchNorm '{name}' ({module._c.type_name}, a C++ module) has "
                                    f"momentum {m:.3g}: its statistics cannot be recomputed through its updates; "
                                    "build the model with a nonzero BatchNorm momentum")
                            momentum[module] = m
                            sums[module] = [mean.clone(), var.clone()]
                    elif module in momentum:
                        sums[module][0] = sums[module][0] + mean
                        sums[module][1] = sums[module][1] + var
                n += 1
    except BaseException:
        _reset_cpp(cpp)  # a half pass's sums mean nothing
        raise
    finally:
        for module, m in momenta.items():
            module.momentum = m
        model.train(was_training)
    with no_grad():
        for _, module in cpp:
            if module not in momentum:
                _reset_cpp([(None, module)])  # not run (or no batch): reset, as torch leaves such a BatchNorm
                continue
            mean, var, count = _cpp_stats(module)
            mean.copy_(sums[module][0] / (n * momentum[module]))
            var.copy_(sums[module][1] / (n * momentum[module]))
            if count is not None:
                count.fill_(n)


class SWALR(LRScheduler):
    """Anneals each group's lr from its value to swa_lr over anneal_epochs steps ('cos' or 'linear'),
    then holds it, as torch's SWALR (swa_lr: a number or one per group)."""

    def __init__(self, optimizer, swa_lr, anneal_epochs=10, anneal_strategy="cos", last_epoch=-1):
        _check_optimizer(optimizer, "SWALR")
        swa_lrs = _per_group("swa_lr", optimizer, swa_lr, "SWALR")
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError(f"SWALR: anneal_strategy must be 'cos' or 'linear', got {anneal_strategy!r}")
        if not isinstance(anneal_epochs, int) or isinstance(anneal_epochs, bool) or anneal_epochs < 0:
            raise ValueError(f"SWALR: anneal_epochs must be an int >= 0, got {anneal_epochs!r}")
        for lr, group in zip(swa_lrs, optimizer.param_groups):
            group["swa_lr"] = lr
        self.anneal_strategy = anneal_strategy
        self.anneal_epochs = anneal_epochs
        super().__init__(optimizer, last_epoch)

    def anneal_func(self, t):
        if self.anneal_strategy == "linear":
            return t
        return (1 - math.cos(math.pi * t)) / 2

    @staticmethod
    def _get_initial_lr(lr, swa_lr, alpha):
        if alpha == 1:
            return swa_lr
        return (lr - alpha * swa_lr) / (1 - alpha)

    def get_lr(self):
        step = self._step_count - 1
        if self.anneal_epochs == 0:
            step = max(1, step)
        prev_t = max(0, min(1, (step - 1) / max(1, self.anneal_epochs)))
        prev_alpha = self.anneal_func(prev_t)
        prev_lrs = [self._get_initial_lr(g["lr"], g["swa_lr"], prev_alpha) for g in self.optimizer.param_groups]
        t = max(0, min(1, step / max(1, self.anneal_epochs)))
        alpha = self.anneal_func(t)
        return [g["swa_lr"] * alpha + lr * (1 - alpha) for g, lr in zip(self.optimizer.param_groups, prev_lrs)]
