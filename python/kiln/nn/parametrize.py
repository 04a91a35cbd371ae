"""kiln.nn.utils.parametrize: torch.nn.utils.parametrize's register_parametrization,
remove_parametrizations and is_parametrized. A parametrized tensor becomes a property of the
module (its class is swapped for a subclass, as torch's), computed from
module.parametrizations.NAME.original (or original0, original1, ... when the parametrization's
right_inverse returns several tensors), so state_dict keys are torch's."""
from .._C import KilnValueError
from .._tensor import Tensor, no_grad
from .modules import Module, ModuleDict, ModuleList, Parameter


def _as_original(t, like):
    # a parameter when the tensor it replaces was one (keeping its requires_grad), a plain tensor else
    if isinstance(like, Parameter):
        return Parameter(t.detach().clone(), like.requires_grad)
    return t.detach().clone()


class ParametrizationList(ModuleList):
    """The parametrizations of one tensor (applied in order) and its original tensor(s)."""

    def __init__(self, modules, original, unsafe=False):
        if len(modules) == 0:
            raise KilnValueError("ParametrizationList: it needs at least one parametrization")
        super().__init__(modules)
        self.unsafe = unsafe
        with no_grad():
            new = original
            for m in reversed(self):
                if hasattr(m, "right_inverse"):
                    new = m.right_inverse(new)
        self.is_tensor = isinstance(new, Tensor)
        self.ntensors = 1 if self.is_tensor else len(new)
        if self.is_tensor:
            if not unsafe and (new.dtype != original.dtype or tuple(new.shape) != tuple(original.shape)):
                raise KilnValueError(f"register_parametrization: right_inverse must keep the tensor's dtype and "
                                     f"shape ({original.dtype}, {tuple(original.shape)}), got {new.dtype}, "
                                     f"{tuple(new.shape)}")
            self._register("original", _as_original(new, original))
        else:
            for i, t in enumerate(new):
                if not isinstance(t, Tensor):
                    raise KilnValueError(f"register_parametrization: right_inverse must return tensors, got "
                                         f"{type(t).__name__} at position {i}")
                self._register(f"original{i}", _as_original(t, original))
        if not unsafe:
            z = self()
            if not isinstance(z, Tensor) or z.dtype != original.dtype or tuple(z.shape) != tuple(original.shape):
                raise KilnValueError(f"register_parametrization: the parametrization must keep the tensor's dtype "
                                     f"and shape ({original.dtype}, {tuple(original.shape)}); pass unsafe=True to "
                                     "allow otherwise")

    def _register(self, name, t):
        if isinstance(t, Parameter):
            self.register_parameter(name, t)
        else:
            self.register_buffer(name, t)

    def _originals(self):
        if self.is_tensor:
            return (self.original,)
        return tuple(getattr(self, f"original{i}") for i in range(self.ntensors))

    def right_inverse(self, value):
        """Sets the original tensor(s) so that the parametrized tensor becomes value."""
        with no_grad():
            for m in reversed(self):
                if not hasattr(m, "right_inverse"):
                    raise KilnValueError(f"parametrization {type(m).__name__} has no right_inverse: the "
                                         "parametrized tensor cannot be assigned")
                value = m.right_inverse(value)
            if self.is_tensor:
                self.original.copy_(value)
            else:
                if isinstance(value, Tensor) or len(value) != self.ntensors:
                    raise KilnValueError(f"right_inverse must return {self.ntensors} tensors")
                for o, v in zip(self._originals(), value):
                    o.copy_(v)

    def forward(self):
        x = self[0](*self._originals())
        for i in range(1, len(self)):
            x = self[i](x)
        return x


def is_parametrized(module, tensor_name=None):
    """Whether module has a parametrization (on tensor_name, when given)."""
    ps = module.__dict__.get("_modules", {}).get("parametrizations")
    if not isinstance(ps, ModuleDict):
        return False
    return len(ps) > 0 if tensor_name is None else tensor_name in ps


def _inject_class(module):
    cls = module.__class__
    param_cls = type(f"Parametrized{cls.__name__}", (cls,), {"_kiln_unparametrized": cls})
    module.__class__ = param_cls


def _inject_property(module, tensor_name):
    def getter(self):
        return self.parametrizations[tensor_name]()

    def setter(self, value):
        self.parametrizations[tensor_name].right_inverse(value)

    setattr(module.__class__, tensor_name, property(getter, setter))


def register_parametrization(module, tensor_name, parametrization, *, unsafe=False):
    """torch.nn.utils.parametrize.register_parametrization: module.TENSOR_NAME becomes
    parametrization(module.parametrizations.TENSOR_NAME.original); registering a second one on the
    same name chains it."""
    if not isinstance(parametrization, Module):
        raise KilnValueError(f"register_parametrization: the parametrization must be a kiln.nn.Module, got "
                             f"{type(parametrization).__name__}")
    if is_parametrized(module, tensor_name):
        ps = module.parametrizations[tensor_name]
        if not unsafe:
            y = getattr(module, tensor_name)
            z = parametrization(y)
            if not isinstance(z, Tensor) or z.dtype != y.dtype or tuple(z.shape) != tuple(y.shape):
                raise KilnValueError(f"register_parametrization: the parametrization must keep '{tensor_name}''s "
                                     f"dtype and shape ({y.dtype}, {tuple(y.shape)}); pass unsafe=True to allow "
                                     "otherwise")
        ps.append(parametrization)
        ps.unsafe |= unsafe
        return module
    if tensor_name in module._parameters or tensor_name in module._buffers:
        original = getattr(module, tensor_name)
        if original is None:
            raise KilnValueError(f"register_parametrization: '{tensor_name}' of {type(module).__name__} is None")
        ps = ParametrizationList([parametrization], original, unsafe=unsafe)
        delattr(module, tensor_name)
        if not is_parametrized(module):
            _inject_class(module)
            module.parametrizations = ModuleDict()
        _inject_property(module, tensor_name)
        module.parametrizations[tensor_name] = ps
        return module
    raise KilnValueError(f"register_parametrization: module {type(module).__name__} does not have a parameter, a "
                         f"buffer, or a parametrized element with name '{tensor_name}'")


def remove_parametrizations(module, tensor_name, leave_parametrized=True):
    """torch.nn.utils.parametrize.remove_parametrizations: tensor_name becomes a plain parameter (or
    buffer) again, holding its current parametrized value (leave_parametrized=True) or the
    original."""
    if not is_parametrized(module, tensor_name):
        raise KilnValueError(f"remove_parametrizations: module {type(module).__name__} does not have a "
                             f"parametrization on {tensor_name}")
    ps = module.parametrizations[tensor_name]
    if ps.is_tensor:
        original = ps.original
        if leave_parametrized:
            with no_grad():
                t = getattr(module, tensor_name)
                if tuple(t.shape) == tuple(original.shape) and t.dtype == original.dtype:
                    original.copy_(t)
                else:
                    original = _as_original(t, original)
    else:
        if not leave_parametrized:
            raise KilnValueError("remove_parametrizations: cannot leave unparametrized (leave_parametrized=False) "
                                 "a tensor that is parametrized in terms of a sequence of tensors")
        with no_grad():
            t = getattr(module, tensor_name)
        original = _as_original(t, ps.original0)
    delattr(module.__class__, tensor_name)
    del module.parametrizations[tensor_name]
    if isinstance(original, Parameter):
        module.register_parameter(tensor_name, original)
    else:
        module.register_buffer(tensor_name, original)
    if not is_parametrized(module):
        delattr(module, "parametrizations")
        module.__class__ = module.__class__._kiln_unparametrized
    return module


def type_before_parametrizations(module):
    """The module's class before register_parametrization swapped it."""
    return module.__class__._kiln_unparametrized if is_parametrized(module) else type(module)
