"""torch.nn.utils' older weight_norm / remove_weight_norm and spectral_norm / remove_spectral_norm:
forward pre-hooks that recompute module.NAME from NAME_g and NAME_v (weight norm) or from NAME_orig
with the buffers NAME_u and NAME_v (spectral norm), with torch's state_dict keys."""
from .._C import KilnError, KilnValueError
from .._tensor import no_grad
from . import functional as F
from .modules import Parameter
from .parametrizations import (_default_spectral_dim, _norm_except_dim, _sigma, _start_vector, _weight_from,
                              _weight_matrix, _weight_norm_dim)


class _WeightNormHook:
    def __init__(self, name, dim):
        self.name, self.dim = name, -1 if dim is None else dim

    def compute_weight(self, module):
        return _weight_from(getattr(module, self.name + "_g"), getattr(module, self.name + "_v"), self.dim)

    def __call__(self, module, inputs):
        object.__setattr__(module, self.name, self.compute_weight(module))


class _SpectralNormHook:
    def __init__(self, name, n_power_iterations, dim, eps):
        if n_power_iterations <= 0:
            raise KilnValueError(f"spectral_norm: expected n_power_iterations to be positive, but got "
                                 f"n_power_iterations={n_power_iterations}")
        self.name, self.n_power_iterations, self.dim, self.eps = name, n_power_iterations, dim, eps

    def compute_weight(self, module, do_power_iteration):
        weight = getattr(module, self.name + "_orig")
        u, v = getattr(module, self.name + "_u"), getattr(module, self.name + "_v")
        mat = _weight_matrix(weight, self.dim)
        if do_power_iteration:
            with no_grad():
                m = mat.detach()
                for _ in range(self.n_power_iterations):
                    v.copy_(F.normalize(m.t().matmul(u), dim=0, eps=self.eps))
                    u.copy_(F.normalize(m.matmul(v), dim=0, eps=self.eps))
                u, v = u.clone(), v.clone()
        return weight / _sigma(u, mat, v)

    def __call__(self, module, inputs):
        object.__setattr__(module, self.name, self.compute_weight(module, module.training))


def _find_hook(module, kind, name):
    for hid, hook in module._forward_pre_hooks.items():
        if isinstance(hook, kind) and hook.name == name:
            return hid, hook
    return None, None


def _check_plain_parameter(what, module, name):
    for kind in (_WeightNormHook, _SpectralNormHook):
        if _find_hook(module, kind, name)[1] is not None:
            raise KilnError(f"{what}: cannot register two weight_norm / spectral_norm hooks on the same parameter "
                            f"{name}")
    if name not in module._parameters or module._parameters[name] is None:
        raise KilnValueError(f"{what}: module {type(module).__name__} has no parameter '{name}'")


def weight_norm(module, name="weight", dim=0):
    """torch.nn.utils.weight_norm (the older API): parameters NAME_g (the norm over every dimension but
    dim; dim=None: the whole tensor) and NAME_v replace NAME, recomputed before every forward."""
    _check_plain_parameter("weight_norm", module, name)
    fn = _WeightNormHook(name, dim)
    weight = module._parameters[name]
    with no_grad():
        g = _norm_except_dim(weight.detach(), _weight_norm_dim(fn.dim, weight))
    del module._parameters[name]
    module.register_parameter(name + "_g", Parameter(g.clone()))
    module.register_parameter(name + "_v", Parameter(weight.detach().clone()))
    object.__setattr__(module, name, fn.compute_weight(module))
    module.register_forward_pre_hook(fn)
    return module


def remove_weight_norm(module, name="weight"):
    """torch.nn.utils.remove_weight_norm: NAME becomes a parameter again, holding g * v / ||v||."""
    hid, fn = _find_hook(module, _WeightNormHook, name)
    if fn is None:
        raise KilnValueError(f"remove_weight_norm: weight_norm of '{name}' not found in {type(module).__name__}")
    with no_grad():
        weight = fn.compute_weight(module).detach().clone()
    del module._forward_pre_hooks[hid]
    object.__delattr__(module, name)
    del module._parameters[name + "_g"]
    del module._parameters[name + "_v"]
    module.register_parameter(name, Parameter(weight))
    return module


def spectral_norm(module, name="weight", n_power_iterations=1, eps=1e-12, dim=None):
    """torch.nn.utils.spectral_norm (the older API): NAME_orig (the parameter) and the buffers NAME_u and
    NAME_v; NAME = NAME_orig / sigma is recomputed before every forward, with n_power_iterations steps
    of power iteration in training mode. dim defaults to 1 for transposed convolutions, else 0."""
    _check_plain_parameter("spectral_norm", module, name)
    if dim is None:
        dim = _default_spectral_dim(module)
    fn = _SpectralNormHook(name, n_power_iterations, dim, eps)
    weight = module._parameters[name]
    with no_grad():
        h, w = _weight_matrix(weight.detach(), dim).shape
        u, v = _start_vector(h, weight, eps), _start_vector(w, weight, eps)
    del module._parameters[name]
    module.register_parameter(name + "_orig", weight)
    object.__setattr__(module, name, weight.detach())
    module.register_buffer(name + "_u", u)
    module.register_buffer(name + "_v", v)
    module.register_forward_pre_hook(fn)
    return module


def remove_spectral_norm(module, name="weight"):
    """torch.nn.utils.remove_spectral_norm: NAME becomes a parameter again, holding NAME_orig / sigma."""
    hid, fn = _find_hook(module, _SpectralNormHook, name)
    if fn is None:
        raise KilnValueError(f"remove_spectral_norm: spectral_norm of '{name}' not found in "
                             f"{type(module).__name__}")
    with no_grad():
        weight = fn.compute_weight(module, do_power_iteration=False).detach().clone()
    del module._forward_pre_hooks[hid]
    object.__delattr__(module, name)
    del module._parameters[name + "_orig"]
    del module._buffers[name + "_u"]
    del module._buffers[name + "_v"]
    module.register_parameter(name, Parameter(weight))
    return module
