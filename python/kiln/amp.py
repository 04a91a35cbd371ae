"""kiln.amp: mixed precision. autocast runs the ops of the autocast table (docs/amp.md) in float16
or bfloat16 within a `with` block (or a function it decorates); GradScaler scales float16 losses
dynamically.

    scaler = kiln.amp.GradScaler()
    with kiln.amp.autocast(kiln.float16):
        loss = F.cross_entropy(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(opt)   # opt: a kiln.optim optimizer
    scaler.update()
    ckpt["scaler"] = scaler.state_dict()   # scaler.load_state_dict(ckpt["scaler"]) on resume
"""
import functools
import math
import numbers
import threading
from collections import abc

from . import _C
from ._C import autocast_dtype  # noqa: F401


_DEVICE_TYPES = ("cpu", "cuda")


def _device_type(fn, device):
    """torch's device argument (first positional): "cpu" or "cuda". Kiln's autocast regions and
    scalers follow the tensors' device, so it is only checked."""
    if device not in _DEVICE_TYPES:
        raise _C.KilnValueError(f"{fn}: device {device!r} is not one of {', '.join(map(repr, _DEVICE_TYPES))}")
    return device


class autocast:  # noqa: N801  (as torch.autocast)
    """autocast(dtype=kiln.bfloat16, enabled=True): the ops of the autocast table run in dtype
    (float16 or bfloat16) inside a `with` block, or inside every call of a function it decorates:

        @kiln.amp.autocast(kiln.float16)
        def forward(x): ...

    torch's form autocast("cpu" or "cuda", dtype=..., enabled=...) works too (the device is checked;
    dtype defaults to torch's: bfloat16 on "cpu", float16 on "cuda").
    Per thread, and nestable (an inner region with enabled=False runs in float32)."""

    def __init__(self, device_type=None, dtype=None, enabled=True):
        if isinstance(device_type, str) and device_type in _DEVICE_TYPES:
            if dtype is None:
                dtype = "float16" if device_type == "cuda" else "bfloat16"
        elif device_type is None:
            dtype = "bfloat16" if dtype is None else dtype
        else:
            # Kiln's form autocast(dtype, enabled): the first argument is the dtype (or a bad device).
            if isinstance(device_type, str) and device_type.split(":")[0] in ("cpu", "cuda", "meta", "mps", "xpu"):
                _device_type("autocast", device_type)
            if isinstance(dtype, bool):
                enabled, dtype = dtype, None
            if dtype is not None:
                raise TypeError(f"autocast: dtype given twice ({device_type!r} and {dtype!r}); torch's form is "
                                "autocast(\"cpu\" or \"cuda\", dtype=...)")
            dtype = device_type
        _C.autocast(dtype, enabled)  # checks the arguments now
        self.dtype, self.enabled = dtype, enabled
        # The engine's regions this object has open, innermost last, per thread: autocast state is
        # per thread, so an object shared by threads must exit each thread's own region (one list
        # for all let a thread's __exit__ pop another's region, leaving both threads in the wrong one).
        self._local = threading.local()

    # Copies and pickles (as torch's autocast allows) carry the settings, not the regions open on
    # this object (a threading.local cannot be pickled; a copy has none open).
    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k != "_local"}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._local = threading.local()

    def _entered(self):
        entered = getattr(self._local, "entered", None)
        if entered is None:
            entered = self._local.entered = []
        return entered

    def __enter__(self):
        region = _C.autocast(self.dtype, self.enabled)
        region.__enter__()
        self._entered().append(region)
        return self

    def __exit__(self, *exc):
        entered = self._entered()
        if not entered:
            raise _C.KilnError("autocast.__exit__: this thread has no region of this autocast open (each thread "
                               "exits the regions it entered)")
        entered.pop().__exit__(*exc)
        return False

    def __call__(self, func):
        if not callable(func):
            raise TypeError(f"autocast: used as a decorator it takes a function, got {type(func).__name__}")

        @functools.wraps(func)
        def in_autocast(*args, **kwargs):
            with _C.autocast(self.dtype, self.enabled):
                return func(*args, **kwargs)

        return in_autocast

    def __repr__(self):
        return f"kiln.amp.autocast({self.dtype}, enabled={self.enabled})"


# What state_dict() holds: the keys of torch.amp.GradScaler's.
_STATE_KEYS = ("scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker")


def _real(state, key):
    v = state[key]  # a Python or numpy number (torch's load_state_dict takes both)
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v):
        raise _C.KilnValueError(f"GradScaler.load_state_dict: '{key}' is {v!r}, expected a finite number")
    return float(v)


def _count(state, key, least=None):
    v = state[key]
    if isinstance(v, numbers.Integral) and not isinstance(v, bool):
        v = int(v)
    elif isinstance(v, numbers.Real) and math.isfinite(v) and float(v).is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int) or (least is not None and v < least):
        at_least = "" if least is None else f" >= {least}"
        raise _C.KilnValueError(f"GradScaler.load_state_dict: '{key}' is {v!r}, expected an integer{at_least}")
    return v


class GradScaler:
    """Dynamic loss scaling for float16 training, as torch.amp.GradScaler: scale(loss).backward(),
    step(optimizer), update(); state_dict()/load_state_dict() carry the scale and growth tracker
    over a resume."""

    _NAMES = ("device", "init_scale", "growth_factor", "backoff_factor", "growth_interval", "enabled")
    _DEFAULTS = {"device": None, "init_scale": 65536.0, "growth_factor": 2.0, "backoff_factor": 0.5,
                 "growth_interval": 2000, "enabled": True}

    def __init__(self, *args, **kwargs):
        """GradScaler(device=None, init_scale=65536.0, growth_factor=2.0, backoff_factor=0.5,
        growth_interval=2000, enabled=True), torch.amp.GradScaler's signature (the device, "cpu" or
        "cuda", is only checked: the scale follows the gradients). A number first is the older
        torch.cuda.amp form, without the device: GradScaler(1024.0, 3.0) is init_scale=1024.0,
        growth_factor=3.0."""
        names = self._NAMES
        if args and isinstance(args[0], numbers.Real) and not isinstance(args[0], bool):
            names = names[1:]
        if len(args) > len(names):
            raise TypeError(f"GradScaler takes at most {len(names)} positional arguments ({len(args)} given)")
        for name, value in zip(names, args):
            if name in kwargs:
                raise TypeError(f"GradScaler: got multiple values for argument '{name}'")
            kwargs[name] = value
        unknown = sorted(set(kwargs) - set(self._NAMES))
        if unknown:
            raise TypeError(f"GradScaler: unexpected keyword argument(s) {', '.join(unknown)}")
        o = {**self._DEFAULTS, **kwargs}
        device, init_scale, growth_factor, backoff_factor, growth_interval, enabled = (o[n] for n in self._NAMES)
        if device is not None:
            _device_type("GradScaler", device)
        # The engine optimizer each Python optimizer was unscaled or stepped through since update():
        # add_param_group builds a new engine, whose record is the old one's (torch keys its
        # per-optimizer state by the Python optimizer); holding both keeps their addresses unique.
        self._engines = {}
        self._impl = _C._GradScaler(init_scale, growth_factor, backoff_factor, growth_interval, enabled)
        self._options = (float(init_scale), float(growth_factor), float(backoff_factor), int(growth_interval))
        self._enabled = bool(enabled)

    def scale(self, outputs):
        """outputs times the scale: a kiln.Tensor, or an iterable of them (a list or tuple gives the
        same type back, another iterable an iterator)."""
        if isinstance(outputs, _C.Tensor):
            return self._impl.scale(outputs)
        if isinstance(outputs, (str, bytes)) or not isinstance(outputs, abc.Iterable):
            raise TypeError(f"GradScaler.scale: expected a kiln.Tensor or an iterable of them, got "
                            f"{type(outputs).__name__}")
        scaled = map(self.scale, outputs)
        if isinstance(outputs, (list, tuple)):
            return type(outputs)(scaled)
        return scaled

    def _engine(self, optimizer):
        engine = optimizer._impl
        seen = self._engines.get(id(optimizer))
        if seen is not None and seen[1] is not engine:
            self._impl._rename_optimizer(seen[1], engine)
        self._engines[id(optimizer)] = (optimizer, engine, seen)
        return engine

    def unscale_(self, optimizer):
        self._impl.unscale_(self._engine(optimizer))

    def step(self, optimizer):
        self._impl.step(self._engine(optimizer))

    def update(self):
        self._impl.update()
        self._engines.clear()

    def get_scale(self):
        return self._impl.get_scale()

    def is_enabled(self):
        return self._enabled

    def get_growth_factor(self):
        return self._options[1]

    def get_backoff_factor(self):
        return self._options[2]

    def get_growth_interval(self):
        return self._options[3]

    @property
    def skipped_steps(self):
        return self._impl.skipped_steps

    def state_dict(self):
        """The scale, the factors, the interval and the growth tracker, under torch's keys ({} for a
        disabled scaler, as torch's)."""
        if not self._enabled:
            return {}
        scale, tracker, _ = _C._grad_scaler_state(self._impl)
        _, growth, backoff, interval = self._options
        return {"scale": scale, "growth_factor": growth, "backoff_factor": backoff, "growth_interval": interval,
                "_growth_tracker": int(tracker)}

    def load_state_dict(self, state_dict):
        """Restores what state_dict() gave (or torch's GradScaler.state_dict()); a missing or
        unknown key or a bad value is a kiln.KilnValueError naming it."""
        if not self._enabled:
            return
        if not isinstance(state_dict, abc.Mapping):
            raise TypeError(f"GradScaler.load_state_dict: expected the dict state_dict() returns, got "
                            f"{type(state_dict).__name__}")
        if len(state_dict) == 0:
            raise _C.KilnValueError("GradScaler.load_state_dict: the state dict is empty (saved from a disabled "
                                    "GradScaler?)")
        for k in state_dict:
            if k not in _STATE_KEYS:
                raise _C.KilnValueError(f"GradScaler.load_state_dict: unknown key {k!r} (expected "
                                        f"{', '.join(_STATE_KEYS)})")
        missing = [k for k in _STATE_KEYS if k not in state_dict]
        if missing:
            raise _C.KilnValueError(f"GradScaler.load_state_dict: missing {', '.join(repr(k) for k in missing)}")
        scale = _real(state_dict, "scale")
        growth = _real(state_dict, "growth_factor")
        backoff = _real(state_dict, "backoff_factor")
        interval = _count(state_dict, "growth_interval")  # any integer, as torch: <= 0 never grows
        tracker = _count(state_dict, "_growth_tracker", 0)
        if not 0 < scale <= 3.4028234663852886e38:
            raise _C.KilnValueError(f"GradScaler.load_state_dict: 'scale' is {scale!r}, expected a number in "
                                    "(0, FLT_MAX]")
        scale = max(scale, 1.1754943508222875e-38)  # an older (f64) scale below FLT_MIN: the scaler's floor
        if growth <= 1:
            raise _C.KilnValueError(f"GradScaler.load_state_dict: 'growth_factor' is {growth!r}, expected > 1")
        if not 0 < backoff < 1:
            raise _C.KilnValueError(f"GradScaler.load_state_dict: 'backoff_factor' is {backoff!r}, expected in (0, 1)")
        # The factors and interval are the engine scaler's options: a new one with them, then its state.
        skipped = self._impl.skipped_steps
        impl = _C._GradScaler(scale, growth, backoff, interval, True)
        _C._grad_scaler_load_state(impl, scale, tracker, skipped)
        self._impl = impl
        self._options = (self._options[0], growth, backoff, interval)
