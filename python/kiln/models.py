"""kiln.models: the model families of `kiln train` (ResNet, BERT), built in C++ with the same
names and --set overrides:

    model = kiln.models.create("resnet20")                        # CIFAR-style ResNet-20
    model = kiln.models.create("resnet18", set={"num_classes": 100})
    bert = kiln.models.create("bert-tiny-mlm", set={"vocab_size": 3000})
    logits = model(images)                                         # [N, classes]
"""
from . import _C
from ._tensor import tensor
from .nn.modules import CppModule


def names():
    """Every model name kiln train takes."""
    return list(_C._model_names())


class ZooModel(CppModule):
    """A model of the zoo: call it with its inputs (positionally in input_names order, or by name);
    returns its "output" tensor (run() gives every output by name)."""

    def __init__(self, name, built, sets=(), deterministic=False):
        super().__init__(built.module)
        object.__setattr__(self, "_built", built)
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "_recipe", (list(sets), deterministic))

    def __deepcopy__(self, memo):
        # The C++ model cannot be copied member by member: build the same model again and copy into it
        # the weights, buffers, dtype, device, mode and which parameters are frozen (an EMA or teacher
        # copy, as copy.deepcopy of a torch model gives).
        sets, deterministic = self._recipe
        new = ZooModel(self.name, _C._create_model(self.name, sets, deterministic), sets, deterministic)
        memo[id(self)] = new
        params = dict(self.named_parameters())
        first = next(iter(params.values()), None)
        if first is not None:
            new.to(device=first.device, dtype=first.dtype)
        new.load_state_dict({k: v.detach().clone() for k, v in self.state_dict().items()})
        for k, p in new.named_parameters():
            old = params[k]
            if p.dtype != old.dtype:  # the C++ model converts as a whole
                raise _C.KilnError(f"copy.deepcopy({self.name}): its parameters have several dtypes ({k} is "
                                   f"{old.dtype}); copy a model of one dtype, or load its state_dict into a new one")
            p.requires_grad_(old.requires_grad)
            if old.grad is not None:
                p.grad = old.grad.detach().clone()
        new.train(self.training)
        return new

    @property
    def input_names(self):
        return list(self._built.input_names)

    def run(self, *args, **inputs):
        names = self.input_names
        if len(args) > len(names):
            raise _C.KilnValueError(f"{self.name} takes at most {len(names)} inputs ({', '.join(names)})")
        for n, a in zip(names, args):
            inputs[n] = a
        feed = {}
        for k, v in inputs.items():
            if v is None:
                continue
            if k not in names:
                raise _C.KilnValueError(f"{self.name}: unknown input '{k}' (inputs: {', '.join(names)})")
            if not isinstance(v, _C.Tensor):
                try:
                    v = tensor(v)  # an array-like: a copy, keeping a NumPy array's dtype
                except (ValueError, TypeError) as e:
                    raise TypeError(f"{self.name}: input '{k}' must be a kiln.Tensor or an array, got "
                                    f"{type(v).__name__} ({e})") from None
            feed[k] = v
        return dict(self._built.run(feed))

    def forward(self, *args, **inputs):
        return self.run(*args, **inputs)["output"]


def create(name, set=None, deterministic=False):  # noqa: A002  (as the flag)
    """Builds a model by its kiln train name, with --set overrides as a dict or "key=value" strings."""
    sets = []
    if isinstance(set, dict):
        sets = [f"{k}={v}" for k, v in set.items()]
    elif set:
        sets = list(set)
    return ZooModel(name, _C._create_model(name, sets, deterministic), sets, deterministic)
