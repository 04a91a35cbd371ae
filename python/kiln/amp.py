"""kiln.amp: mixed precision. autocast runs the ops of the autocast table (docs/amp.md) in float16
or bfloat16 within a `with` block; GradScaler scales float16 losses dynamically.

    scaler = kiln.amp.GradScaler()
    with kiln.amp.autocast(kiln.float16):
        loss = F.cross_entropy(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(opt)   # opt: a kiln.optim optimizer
    scaler.update()
"""
from . import _C
from ._C import autocast, autocast_dtype  # noqa: F401


class GradScaler:
    def __init__(self, init_scale=65536.0, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000, enabled=True):
        self._impl = _C._GradScaler(init_scale, growth_factor, backoff_factor, growth_interval, enabled)

    def scale(self, loss):
        return self._impl.scale(loss)

    def unscale_(self, optimizer):
        self._impl.unscale_(optimizer._impl)

    def step(self, optimizer):
        self._impl.step(optimizer._impl)

    def update(self):
        self._impl.update()

    def get_scale(self):
        return self._impl.get_scale()

    @property
    def skipped_steps(self):
        return self._impl.skipped_steps
