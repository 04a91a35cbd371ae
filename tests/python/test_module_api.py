# kiln.nn.Module's API against torch.nn.Module's: identity of parameters across to(), .data,
# assignment rules, state_dict order, hooks, containers, pickling and argument checks.
import collections
import copy
import pickle
import warnings

import numpy as np
import pytest

import kiln
from kiln import nn

torch = pytest.importorskip("torch")
tnn = torch.nn


class Net(nn.Module):
    def __init__(self, lib=kiln):
        n = nn if lib is kiln else tnn
        n.Module.__init__(self)
        self.fc1 = n.Linear(3, 4)
        self.bn = n.BatchNorm1d(4)
        self.fc2 = n.Linear(4, 2, bias=False)
        self.scale = n.Parameter(lib.ones(1))

    def forward(self, x):
        return self.fc2(self.bn(self.fc1(x)).relu()) * self.scale


class TorchNet(tnn.Module):
    __init__ = Net.__init__
    forward = Net.forward


def build(lib):
    return Net() if lib is kiln else TorchNet(torch)


def keys(d):
    return list(d)


def names(pairs):
    return [k for k, _ in pairs]


# ---- 1: to() keeps the parameters when nothing changes ----

@pytest.mark.parametrize("call", [lambda m: m.to("cpu"), lambda m: m.cpu(), lambda m: m.float(),
                                  lambda m: m.to(kiln.float32), lambda m: m.to("cpu", kiln.float32)])
def test_noop_to_keeps_parameters_and_optimizer(call):
    m = build(kiln)
    params, bufs = list(m.parameters()), list(m.buffers())
    opt = kiln.optim.SGD(m.parameters(), lr=0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert call(m) is m
    assert all(a is b for a, b in zip(params, m.parameters()))
    assert all(a is b for a, b in zip(bufs, m.buffers()))
    w0 = m.fc1.weight.detach().numpy().copy()
    m(kiln.randn(4, 3)).pow(2).sum().backward()
    opt.step()
    assert (m.fc1.weight.detach().numpy() != w0).any()


def test_real_move_warns_when_old_parameters_are_held():
    m = build(kiln)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m.double()  # nobody holds the float32 parameters: silent
    assert all(p.dtype == kiln.float64 for p in m.parameters())
    names_before = names(m.state_dict().items())
    opt = kiln.optim.SGD(m.parameters(), lr=0.5)  # noqa: F841
    with pytest.warns(UserWarning, match="optimizer made before"):
        m.float()
    assert names(m.state_dict().items()) == names_before  # replaced in place


# ---- 2: .data ----

def test_data_alias_and_assignment():
    lin = nn.Linear(2, 2)
    opt = kiln.optim.SGD(lin.parameters(), lr=0.1)
    d = lin.weight.data
    assert type(d) is kiln.Tensor and not d.requires_grad
    d.fill_(0.5)  # an alias: the parameter sees it
    assert np.all(lin.weight.detach().numpy() == 0.5)
    lin.weight.data = kiln.zeros(2, 2)
    assert "data" not in lin.weight.__dict__
    assert np.all(lin.weight.detach().numpy() == 0) and lin.weight.requires_grad
    lin(kiln.ones(1, 2)).sum().backward()
    opt.step()  # the optimizer's handle is still the parameter
    assert np.all(lin.weight.detach().numpy() == -0.1)
    t = kiln.tensor([[1.0, 2.0], [3.0, 4.0]])
    t.data = t.data.T  # overlapping memory: the values of the transpose
    assert t.tolist() == [[1.0, 3.0], [2.0, 4.0]]
    with pytest.raises(ValueError, match=r"\[3\] float32 .*\[2, 2\] float32.*torch rebinds"):
        lin.weight.data = kiln.zeros(3)
    with pytest.raises(ValueError, match="float64"):
        lin.weight.data = kiln.zeros(2, 2, dtype=kiln.float64)


def test_parameter_attributes_do_not_shadow_tensor():
    p = nn.Parameter(kiln.zeros(2))
    p.grad = kiln.ones(2)
    assert "grad" not in p.__dict__ and p.grad.tolist() == [1.0, 1.0]
    with pytest.raises(AttributeError):
        p.shape = (3,)
    with pytest.raises(AttributeError, match="detach"):
        p.detach = None
    p.my_tag = True  # a user's own attribute is fine, as in torch
    assert p.my_tag


# ---- 3: assignment ----

@pytest.mark.parametrize("lib", [kiln, torch])
def test_assign_none_and_wrong_types(lib):
    m = build(lib)
    m.fc2 = None
    assert m.fc2 is None and "fc2.weight" not in m.state_dict()
    assert "fc2.weight" not in names(m.named_parameters())
    assert "(fc2): None" in repr(m)
    with pytest.raises(TypeError, match=r"cannot assign 'int' as child module 'fc1' \((kiln|torch)\.nn\.Module or None"):
        m.fc1 = 3
    m.fc1.bias = None
    assert "fc1.bias" not in m.state_dict()
    with pytest.raises(TypeError, match="cannot assign '.*Tensor' as parameter 'weight'"):
        m.fc1.weight = lib.zeros(4, 3)
    with pytest.raises(TypeError, match="cannot assign 'int' as buffer 'running_mean'"):
        m.bn.running_mean = 5
    m.bn.running_mean = lib.ones(4)
    assert m.state_dict()["bn.running_mean"].tolist() == [1.0] * 4
    m.bn.running_var = None
    assert "bn.running_var" not in m.state_dict()


# ---- 4: order ----

@pytest.mark.parametrize("keep_vars", [False, True])
def test_state_dict_order_matches_torch(keep_vars):
    k, t = build(kiln), build(torch)
    assert list(k.state_dict(keep_vars=keep_vars)) == keys(t.state_dict(keep_vars=keep_vars))
    assert names(k.named_parameters()) == names(t.named_parameters())
    assert names(k.named_buffers()) == keys(names(t.named_buffers()))
    assert list(k.state_dict(prefix="x.")) == keys(t.state_dict(prefix="x."))
    if keep_vars:
        assert k.state_dict(keep_vars=True)["fc1.weight"] is k.fc1.weight
    for m, lib in ((k, kiln), (t, torch)):
        m.fc1.weight = (nn if lib is kiln else tnn).Parameter(lib.zeros(4, 3))
    assert list(k.state_dict()) == keys(t.state_dict())
    dest = collections.OrderedDict(a=kiln.zeros(1))
    assert k.state_dict(destination=dest) is dest and list(dest)[0] == "a"


def test_recurse_prefix_and_non_persistent_buffers():
    for lib, n in ((kiln, nn), (torch, tnn)):
        m = build(lib)
        m.register_buffer("tmp", lib.zeros(1), persistent=False)
        assert "tmp" not in m.state_dict() and "tmp" in names(m.named_buffers())
        assert names(m.named_parameters(recurse=False)) == ["scale"]
        assert len(list(m.parameters(recurse=False))) == 1 and len(list(m.buffers(recurse=False))) == 1
        assert names(m.named_parameters(prefix="model"))[:2] == ["model.scale", "model.fc1.weight"]
        lin = n.Linear(2, 2)
        s = n.Sequential(lin, lin)  # tied
        assert names(s.named_parameters(remove_duplicate=False)) == ["0.weight", "0.bias", "1.weight", "1.bias"]
        assert names(s.named_parameters()) == ["0.weight", "0.bias"]


# ---- 5: API ----

@pytest.mark.parametrize("lib", [kiln, torch])
def test_forward_hooks(lib):
    n = nn if lib is kiln else tnn
    m = n.Linear(2, 2)
    seen = []
    h1 = m.register_forward_pre_hook(lambda mod, args: (args[0] * 0,))
    h2 = m.register_forward_hook(lambda mod, args, out: seen.append((mod, len(args), tuple(out.shape))) or out + 1)
    x = lib.ones(1, 2)
    y = m(x)
    assert seen == [(m, 1, (1, 2))]
    assert np.allclose(y.detach().numpy(), m.bias.detach().numpy() + 1)
    h1.remove()
    h2.remove()
    h2.remove()
    assert np.allclose(m(x).detach().numpy(), (x @ m.weight.T + m.bias).detach().numpy())
    assert len(seen) == 1
    with m.register_forward_pre_hook(lambda mod, args: args[0] * 2):  # one value, not a tuple
        assert np.allclose(m(x).detach().numpy(), (2 * x @ m.weight.T + m.bias).detach().numpy())
    assert np.allclose(m(x).detach().numpy(), (x @ m.weight.T + m.bias).detach().numpy())


@pytest.mark.parametrize("lib", [kiln, torch])
def test_full_backward_hook(lib):
    n = nn if lib is kiln else tnn
    lib.manual_seed(0)
    m = n.Linear(3, 2)
    seen = []

    def hook(mod, grad_input, grad_output):
        seen.append((mod, [None if g is None else g.numpy().copy() for g in grad_input],
                     [g.numpy().copy() for g in grad_output]))
        return None if grad_input[0] is None else (grad_input[0] * 2,)

    h = m.register_full_backward_hook(hook)
    x = lib.ones(4, 3, requires_grad=True)
    (m(x) * 3).sum().backward()
    w = m.weight.detach().numpy()
    ((mod, gi, go),) = seen
    assert mod is m and np.allclose(go[0], 3) and np.allclose(gi[0], 3 * w.sum(0))
    assert np.allclose(x.grad.numpy(), 6 * w.sum(0), rtol=1e-5)  # the hook's replacement
    seen.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns that the hook fires at the outputs here
        m(lib.ones(4, 3)).sum().backward()
    assert len(seen) == 1 and seen[0][1] == [None] and np.allclose(seen[0][2][0], 1)
    h.remove()
    seen.clear()
    m(x).sum().backward()
    assert seen == []


@pytest.mark.parametrize("lib", [kiln, torch])
def test_apply_zero_grad_and_lookups(lib):
    n = nn if lib is kiln else tnn
    m = build(lib)
    order = []
    assert m.apply(lambda mod: order.append(type(mod).__name__)) is m
    assert order == ["Linear", "BatchNorm1d", "Linear", type(m).__name__]
    m(lib.randn(4, 3)).pow(2).sum().backward()
    m.zero_grad(set_to_none=False)
    assert m.fc1.weight.grad is not None and not m.fc1.weight.grad.numpy().any()
    m.zero_grad()
    assert m.fc1.weight.grad is None
    assert m.get_submodule("fc1") is m.fc1 and m.get_submodule("") is m
    assert m.get_parameter("fc1.weight") is m.fc1.weight
    with pytest.raises(AttributeError, match="has no attribute `nope`"):
        m.get_submodule("nope")
    with pytest.raises(AttributeError, match="`weight` is not an nn.Module"):
        m.get_submodule("fc1.weight")
    sub = n.Linear(1, 1)
    m.register_module("extra", sub)
    assert m.extra is sub and list(m.state_dict())[-1] == "extra.bias"


def test_half_bfloat16_extra_repr():
    m = build(kiln)
    assert m.half().fc1.weight.dtype == kiln.float16
    assert m.bfloat16().bn.running_mean.dtype == kiln.bfloat16
    assert repr(nn.Linear(2, 3)) == repr(tnn.Linear(2, 3))

    class A(nn.Module):
        def __init__(self):
            super().__init__()
            self.l = nn.Linear(1, 1)

        def extra_repr(self):
            return "k=1"

    assert repr(A()) == "A(\n  k=1\n  (l): Linear(in_features=1, out_features=1, bias=True)\n)"


def test_pickle_module_and_tensors():
    m = build(kiln)
    m.fc1.weight.requires_grad_(False)
    m2 = pickle.loads(pickle.dumps(m))
    assert type(m2.fc1.weight) is nn.Parameter and not m2.fc1.weight.requires_grad and m2.fc2.weight.requires_grad
    for (k, a), (k2, b) in zip(m.state_dict().items(), m2.state_dict().items()):
        assert k == k2 and a.dtype == b.dtype and np.array_equal(a.numpy(), b.numpy())
    x = kiln.randn(2, 3)
    assert np.array_equal(m.eval()(x).detach().numpy(), m2.eval()(x).detach().numpy())
    t = kiln.tensor([1.5, 2.0], dtype=kiln.bfloat16)
    t2 = pickle.loads(pickle.dumps(t))
    assert type(t2) is kiln.Tensor and t2.dtype == kiln.bfloat16 and t2.tolist() == [1.5, 2.0]
    with pytest.raises(kiln.KilnError, match="leaf"):
        pickle.dumps(m.fc2.weight * 2)
    assert type(copy.deepcopy(m).fc1.weight) is nn.Parameter


# ---- 6: containers ----

@pytest.mark.parametrize("lib", [kiln, torch])
def test_sequential(lib):
    n = nn if lib is kiln else tnn
    s = n.Sequential(n.Linear(2, 3), n.ReLU(), n.Linear(3, 1))
    head = s[:-1]
    assert type(head) is n.Sequential and len(head) == 2 and head[0] is s[0]
    assert tuple(head(lib.ones(4, 2)).shape) == (4, 3)
    assert [type(m).__name__ for m in s] == ["Linear", "ReLU", "Linear"]
    with pytest.raises(IndexError):
        s[3]
    assert s[-1] is s[2]
    s.append(n.ReLU())
    s.insert(0, n.Identity())
    s.extend([n.Tanh()])
    assert list(s._modules) == [str(i) for i in range(6)]
    assert [type(m).__name__ for m in s] == ["Identity", "Linear", "ReLU", "Linear", "ReLU", "Tanh"]
    del s[0]
    s[-1] = n.Sigmoid()
    assert [type(m).__name__ for m in s] == ["Linear", "ReLU", "Linear", "ReLU", "Sigmoid"]
    assert list(s.state_dict()) == ["0.weight", "0.bias", "2.weight", "2.bias"]
    del s[1:3]
    assert list(s._modules) == ["0", "1", "2"] and list(s.state_dict()) == ["0.weight", "0.bias"]
    od = n.Sequential(collections.OrderedDict([("enc", n.Linear(2, 2)), ("act", n.ReLU())]))
    assert list(od.state_dict()) == ["enc.weight", "enc.bias"] and od.enc is od[0]
    assert type(od[1:]) is n.Sequential and list(od[1:]._modules) == ["act"]
    with pytest.raises(TypeError, match="int is not a Module subclass"):
        n.Sequential(3)


@pytest.mark.parametrize("lib", [kiln, torch])
def test_module_list(lib):
    n = nn if lib is kiln else tnn
    ml = n.ModuleList([n.Linear(1, 1), n.Linear(1, 2)])
    assert type(ml[0:1]) is n.ModuleList and len(ml[0:1]) == 1
    ml.extend([n.ReLU()])
    ml += [n.Tanh()]
    ml.insert(0, n.Identity())
    ml[1] = n.Linear(1, 3)
    del ml[-1]
    assert [type(m).__name__ for m in ml] == ["Identity", "Linear", "Linear", "ReLU"]
    assert list(ml.state_dict()) == ["1.weight", "1.bias", "2.weight", "2.bias"]
    assert len(n.ModuleList(None)) == 0 and len(n.ModuleList()) == 0
    assert type(ml + n.ModuleList([n.ReLU()])) is n.ModuleList
    with pytest.raises(TypeError):
        ml.extend(n.ReLU())


@pytest.mark.parametrize("lib", [kiln, torch])
def test_module_dict_parameter_list_dict(lib):
    n = nn if lib is kiln else tnn
    md = n.ModuleDict({"b": n.Linear(1, 1), "a": n.Linear(1, 2)})
    md["c"] = n.ReLU()
    assert list(md) == ["b", "a", "c"] and "a" in md and len(md) == 3
    assert list(md.keys()) == ["b", "a", "c"] and md["a"] is md.a
    del md["b"]
    md.update([("d", n.Tanh())])
    assert list(md.state_dict()) == ["a.weight", "a.bias"] and list(md) == ["a", "c", "d"]
    assert type(md.pop("d")).__name__ == "Tanh"
    pl = n.ParameterList([n.Parameter(lib.zeros(1)), lib.ones(2)])
    pl.append(lib.zeros(3))
    assert len(pl) == 3 and isinstance(pl[1], n.Parameter) and tuple(pl[-1].shape) == (3,)
    assert list(pl.state_dict()) == ["0", "1", "2"] and len(list(pl.parameters())) == 3
    assert type(pl[1:]) is n.ParameterList and len(pl[1:]) == 2
    pd = n.ParameterDict({"w": n.Parameter(lib.zeros(2)), "v": lib.ones(1)})
    pd["u"] = lib.ones(3)
    assert list(pd) == ["v", "w", "u"] and isinstance(pd["v"], n.Parameter) and "u" in pd
    del pd["w"]
    assert list(pd.state_dict()) == ["v", "u"] and list(pd.keys()) == ["v", "u"]
    assert list(n.ParameterDict(collections.OrderedDict(b=lib.zeros(1), a=lib.zeros(1)))) == ["b", "a"]
    with pytest.raises(KeyError if lib is kiln else AttributeError):  # torch's is an AttributeError
        pd["nope"]

    class M(n.Module):
        def __init__(self):
            super().__init__()
            self.heads = n.ModuleDict({"x": n.Linear(1, 1)})
            self.pl = n.ParameterList([lib.zeros(1)])
            self.pd = n.ParameterDict({"k": lib.zeros(1)})

    assert list(M().state_dict()) == ["heads.x.weight", "heads.x.bias", "pl.0", "pd.k"]
    assert names(M().named_parameters()) == ["heads.x.weight", "heads.x.bias", "pl.0", "pd.k"]


# ---- 7: checks ----

@pytest.mark.parametrize("lib", [kiln, torch])
def test_name_and_type_checks(lib):
    n = nn if lib is kiln else tnn
    m = n.Module()
    m.x = 3
    for reg, arg in ((m.register_parameter, n.Parameter(lib.zeros(1))), (m.register_buffer, lib.zeros(1)),
                     (m.add_module, n.Linear(1, 1))):
        with pytest.raises(KeyError, match="contain"):
            reg("a.b", arg)
        with pytest.raises(KeyError, match="empty string"):
            reg("", arg)
        with pytest.raises(KeyError, match="attribute 'x' already exists"):
            reg("x", arg)
    m.register_buffer("b", lib.zeros(1))
    with pytest.raises(KeyError, match="attribute 'b' already exists"):
        m.register_parameter("b", n.Parameter(lib.zeros(1)))
    with pytest.raises(TypeError, match="int is not a Module subclass"):
        m.add_module("c", 3)
    with pytest.raises(TypeError, match="cannot assign 'int' object to buffer 'd'"):
        m.register_buffer("d", 3)
    with pytest.raises(TypeError, match="cannot assign '.*Tensor' object to parameter 'p'"):
        m.register_parameter("p", lib.zeros(1))
    with pytest.raises(ValueError, match="bool"):
        m.train("no")
    dt = kiln.int64 if lib is kiln else torch.int64
    with pytest.raises(TypeError, match=r"nn.Module.to only accepts floating point.* dtypes, but got.*int64"):
        n.Linear(1, 1).to(dt)


# ---- review fixes ----

def test_data_has_its_own_version_counter():
    # torch's .data does not share the version: an in-place write through it between forward and
    # backward is not an error (the gradient sees the new values).
    for lib, P in ((kiln, nn.Parameter), (torch, tnn.Parameter)):
        p = P(lib.ones(3))
        y = (p * p).sum()
        v0 = p._version
        p.data.mul_(2)
        assert p._version == v0
        y.backward()
        assert p.grad.tolist() == [4.0, 4.0, 4.0]
        p = P(lib.ones(3))
        y = (p * p).sum()
        p.data = lib.full((3,), 2.0)
        y.backward()
        assert p.grad.tolist() == [4.0, 4.0, 4.0]
    # Assigning .data of a view: the view is rebound, as torch's; the base is untouched.
    base = kiln.zeros(2, 4)
    v = base[:, 1:3]
    v.data = kiln.ones(2, 2)
    assert base.tolist() == [[0.0] * 4] * 2 and v.tolist() == [[1.0] * 2] * 2


@pytest.mark.parametrize("make", [lambda n: n.BatchNorm1d(3),
                                  lambda n: n.InstanceNorm1d(3, track_running_stats=True)])
def test_norm_state_dict_without_num_batches_tracked_loads(make):
    for n in (nn, tnn):
        m = make(n)
        m.num_batches_tracked.add_(5)
        old = {k: v for k, v in m.state_dict().items() if "num_batches" not in k}
        r = m.load_state_dict(old)  # strict
        assert list(r.missing_keys) == [] and list(r.unexpected_keys) == []
        assert int(m.num_batches_tracked.item()) == 5  # torch keeps the module's own count
        assert "num_batches_tracked" not in old


_NT = collections.namedtuple("_NT", "a b")


@pytest.mark.filterwarnings("ignore:For backward hooks")  # torch's, about the dict
@pytest.mark.parametrize("lib", [kiln, torch])
def test_full_backward_hook_dict_and_namedtuple_outputs(lib):
    n = nn if lib is kiln else tnn
    got = []

    class D(n.Module):
        def forward(self, x):
            return {"y": x * 2}

    class N(n.Module):
        def forward(self, x):
            return _NT(x * 2, x * 3)

    x = lib.ones(2).requires_grad_()
    d = D()
    d.register_full_backward_hook(lambda *a: None)
    o = d(x)
    assert type(o) is dict and list(o) == ["y"] and o["y"].tolist() == [2.0, 2.0]
    m = N()
    m.register_full_backward_hook(lambda mod, gi, go: got.append(gi[0].tolist()))
    o = m(x)
    assert type(o) is _NT and o.b.tolist() == [3.0, 3.0]
    (o.a + o.b).sum().backward()
    assert got == [[5.0, 5.0]]


def _return_output(m, args, out):
    return out


class _Hooked(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(2, 2)
        self.h = self.l.register_forward_hook(_return_output)


class _TorchHooked(tnn.Module):
    def __init__(self):
        super().__init__()
        self.l = tnn.Linear(2, 2)
        self.h = self.l.register_forward_hook(_return_output)


@pytest.mark.parametrize("cls", [_Hooked, _TorchHooked])
@pytest.mark.parametrize("how", [copy.deepcopy, lambda m: pickle.loads(pickle.dumps(m))])
def test_hook_handle_follows_deepcopy_and_pickle(cls, how):
    m = cls()
    m2 = how(m)
    assert len(m2.l._forward_hooks) == 1
    m2.h.remove()  # the copy's hook, not the original's
    assert len(m2.l._forward_hooks) == 0 and len(m.l._forward_hooks) == 1
    m.h.remove()
    assert len(m.l._forward_hooks) == 0


@pytest.mark.parametrize("lib", [kiln, torch])
def test_module_pickled_without_the_hook_flag_dicts_takes_the_flags_after_loading(lib):
    # A module pickled before with_kwargs / always_call existed has none of their dicts: loading it
    # makes empty ones, as torch's Module.__setstate__.
    m = build(lib)
    flags = ("_forward_pre_hooks_with_kwargs", "_forward_hooks_with_kwargs", "_forward_hooks_always_called")
    for sub in m.modules():
        for name in flags:
            del sub.__dict__[name]
    m2 = pickle.loads(pickle.dumps(m))
    seen = []
    for sub in (m2, m2.fc1):
        assert all(len(getattr(sub, name)) == 0 for name in flags)
        sub.register_forward_hook(lambda mod, args, kwargs, out: seen.append(type(mod).__name__),
                                  with_kwargs=True, always_call=True)
        sub.register_forward_pre_hook(lambda mod, args, kwargs: None, with_kwargs=True)
    m2.eval()(lib.ones(2, 3))
    assert seen == ["Linear", type(m2).__name__]


@pytest.mark.parametrize("lib", [kiln, torch])
def test_to_keeps_ties_grad_and_attributes(lib):
    n = nn if lib is kiln else tnn

    class S(n.Module):
        def __init__(self):
            super().__init__()
            self.emb = n.Linear(2, 2, bias=False)
            self.out = n.Linear(2, 2, bias=False)
            self.out.weight = self.emb.weight

    s = S()
    s.emb.weight.grad = lib.ones(2, 2)
    s.emb.weight.tag = "shared"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing outside the module holds the old parameter
        s.double()
    assert s.out.weight is s.emb.weight and len(list(s.parameters())) == 1
    w = s.emb.weight
    assert w.dtype == lib.float64 and w.grad.dtype == lib.float64 and w.grad.tolist() == [[1.0] * 2] * 2
    assert w.tag == "shared" and isinstance(w, n.Parameter)


@pytest.mark.parametrize("lib", [kiln, torch])
def test_incompatible_keys_repr_as_torch(lib):
    n = nn if lib is kiln else tnn
    m = n.Linear(2, 2)
    r = m.load_state_dict(n.Linear(2, 2).state_dict())
    assert repr(r) == str(r) == "<All keys matched successfully>"
    assert r == ([], []) and r.missing_keys == [] and r.unexpected_keys == []
    r = m.load_state_dict({"weight": lib.zeros(2, 2)}, strict=False)
    assert repr(r).endswith("IncompatibleKeys(missing_keys=['bias'], unexpected_keys=[])")


@pytest.mark.parametrize("lib", [kiln, torch])
def test_deepcopy_drops_a_parameters_grad_and_keeps_a_tensors(lib):
    # torch's Parameter.__deepcopy__ copies the data and requires_grad only; a plain leaf keeps .grad.
    n = nn if lib is kiln else tnn
    m = n.Linear(2, 2)
    m(lib.ones(1, 2)).sum().backward()
    m.bias.requires_grad_(False)
    c = copy.deepcopy(m)
    assert c.weight.grad is None and m.weight.grad is not None
    assert type(c.weight) is n.Parameter and c.weight.requires_grad and not c.bias.requires_grad
    p = copy.deepcopy(m.weight)
    assert p.grad is None and p.tolist() == m.weight.tolist() and p is not m.weight
    t = lib.ones(2, requires_grad=True)
    (t * 2).sum().backward()
    assert copy.deepcopy(t).grad.tolist() == [2.0, 2.0]


@pytest.mark.parametrize("lib", [kiln, torch])
def test_full_backward_hook_zeros_for_inputs_without_grad_and_none_for_unused_outputs(lib):
    # torch: once some input needs a gradient, a tensor input that does not gets zeros (of its dtype)
    # in grad_input, a non-tensor argument None; an output no loss reaches, or one without grad, gets None.
    n = nn if lib is kiln else tnn

    class Three(n.Module):
        def forward(self, a, b, idx, c=None):
            return a * b * 2, a + 0, b * 5

    m = Three()
    log = []

    def hook(mod, gi, go):
        log.append(([None if g is None else (g.tolist(), str(g.dtype).split(".")[-1]) for g in gi],
                     [None if g is None else g.tolist() for g in go]))
        return (gi[0] * 10,) + tuple(gi[1:])

    m.register_full_backward_hook(hook)
    a = lib.tensor([1.0, 2.0], requires_grad=True)
    o1, o2, o3 = m(a, lib.tensor([3.0, 4.0]), lib.tensor([1, 2]))
    o1.sum().backward()
    assert log == [([([6.0, 8.0], "float32"), ([0.0, 0.0], "float32"), ([0, 0], "int64")],
                    [[1.0, 1.0], None, None])]
    assert a.grad.tolist() == [60.0, 80.0]
    log.clear()
    a.grad = None
    b = lib.tensor([3.0, 4.0], requires_grad=True)
    o1, o2, o3 = m(a, b, 7)
    (o2.sum() * 3).backward()
    assert log == [([([3.0, 3.0], "float32"), ([0.0, 0.0], "float32"), None], [None, [3.0, 3.0], None])]
    assert a.grad.tolist() == [30.0, 30.0] and b.grad.tolist() == [0.0, 0.0]


@pytest.mark.parametrize("lib", [kiln, torch])
def test_full_backward_hook_grad_output_is_fresh_on_a_second_backward(lib):
    # A second backward over a retained graph gives the hook only what that backward reached (None for
    # an output it did not), and two calls of the module in one graph each see their own outputs.
    n = nn if lib is kiln else tnn

    class Two(n.Module):
        def forward(self, x):
            return x * 2, x * 3

    m = Two()
    log = []
    m.register_full_backward_hook(lambda mod, gi, go: log.append([None if g is None else g.tolist() for g in go]))
    x = lib.ones(2, requires_grad=True)
    a, b = m(x)
    (a.sum() + b.sum()).backward(retain_graph=True)
    a.sum().backward()
    assert log == [[[1.0, 1.0], [1.0, 1.0]], [[1.0, 1.0], None]]
    log.clear()
    a1, b1 = m(x)
    a2, b2 = m(x)
    (a1.sum() + (b2 * 4).sum()).backward(retain_graph=True)
    assert sorted(log, key=repr) == sorted([[[1.0, 1.0], None], [None, [4.0, 4.0]]], key=repr)
    log.clear()
    (b1 * 5).sum().backward()
    assert log == [[None, [5.0, 5.0]]]


@pytest.mark.parametrize("lib", [kiln, torch])
def test_load_state_dict_assign_makes_the_given_tensors_the_modules(lib):
    n = nn if lib is kiln else tnn
    m = n.Sequential(n.Linear(2, 2), n.BatchNorm1d(2))
    m[0].weight.requires_grad_(False)
    w, b, rm = lib.zeros(2, 2, dtype=lib.float64), lib.ones(2), lib.full((2,), 5.0)
    p = n.Parameter(lib.ones(2), requires_grad=False)
    sd = dict(m.state_dict(), **{"0.weight": w, "0.bias": b, "1.weight": p, "1.running_mean": rm})
    assert repr(m.load_state_dict(sd, assign=True)) == "<All keys matched successfully>"
    # A plain tensor becomes a Parameter sharing its memory, with the module's requires_grad, in the
    # tensor's dtype; a Parameter given is used itself; a buffer is the tensor itself.
    assert type(m[0].weight) is n.Parameter and not m[0].weight.requires_grad and m[0].bias.requires_grad
    assert m[0].weight.dtype == lib.float64 and m[0].weight.data_ptr() == w.data_ptr()
    assert m[1].weight is p and p.requires_grad and m[1].running_mean is rm
    with lib.no_grad():
        b.fill_(7.0)
    assert m[0].bias.tolist() == [7.0, 7.0]
    m[0].double()
    m[0](lib.ones(1, 2, dtype=lib.float64)).sum().backward()
    assert m[0].bias.grad.tolist() == [1.0, 1.0] and m[0].weight.grad is None
    with pytest.raises(RuntimeError, match="size mismatch|shape"):
        n.Linear(2, 2).load_state_dict({"weight": lib.zeros(3, 2), "bias": lib.zeros(2)}, assign=True)


@pytest.mark.parametrize("lib", [kiln, torch])
def test_forward_hooks_with_kwargs_prepend_and_always_call(lib):
    n = nn if lib is kiln else tnn

    class KW(n.Module):
        def forward(self, x, scale=1.0):
            return x * scale

    m, log = KW(), []
    h = m.register_forward_pre_hook(lambda mod, a, kw: (a, {"scale": kw["scale"] * 3}), with_kwargs=True)
    m.register_forward_pre_hook(lambda mod, a: log.append("pre first"), prepend=True)
    m.register_forward_hook(lambda mod, a, kw, out: out + kw["scale"], with_kwargs=True)
    m.register_forward_hook(lambda mod, a, out: log.append(("post first", out.tolist())), prepend=True)
    assert m(lib.ones(1), scale=2.0).tolist() == [12.0]
    assert log == ["pre first", ("post first", [6.0])]
    h.remove()
    assert m(lib.ones(1), scale=2.0).tolist() == [4.0]
    c = copy.deepcopy(m)  # the flags follow the copy
    assert c(lib.ones(1), scale=2.0).tolist() == [4.0]
    m = KW()
    m.register_forward_pre_hook(lambda mod, a, kw: 5, with_kwargs=True)
    with pytest.raises(RuntimeError, match="new_args, new_kwargs"):
        m(lib.ones(1))

    class Bad(n.Module):
        def forward(self, x):
            raise ValueError("boom")

    b, log = Bad(), []
    b.register_forward_hook(lambda mod, a, out: log.append(("always", out)), always_call=True)
    b.register_forward_hook(lambda mod, a, out: log.append("not run"))
    b.register_forward_hook(lambda mod, a, kw, out: log.append(("kw", kw)), always_call=True, with_kwargs=True)
    b.register_forward_hook(lambda mod, a, out: 1 / 0, always_call=True)
    with pytest.warns(UserWarning, match="always_call=True"), pytest.raises(ValueError, match="boom"):
        b(lib.ones(1))
    assert log == [("always", None), ("kw", {})]


@pytest.mark.parametrize("lib", [kiln, torch])
def test_sequential_pop_add_mul_and_input_keyword(lib):
    n = nn if lib is kiln else tnn
    relu, tanh, sig = n.ReLU(), n.Tanh(), n.Sigmoid()
    s = n.Sequential(relu, tanh, sig)
    assert s.pop(1) is tanh and list(s) == [relu, sig] and list(s._modules) == ["0", "1"]
    assert s.pop(-1) is sig and list(s) == [relu]
    s = n.Sequential(relu, tanh)
    assert list(s + n.Sequential(sig)) == [relu, tanh, sig]
    assert list(s * 2) == list(2 * s) == [relu, tanh, relu, tanh]
    assert list((s * 2)._modules) == ["0", "1", "2", "3"]
    with pytest.raises(ValueError, match="Non-positive"):
        s * 0
    with pytest.raises(TypeError):
        s * 1.5
    with pytest.raises(ValueError, match="only objects of Sequential"):
        s + [sig]
    t = s
    s += n.Sequential(sig)
    assert s is t and list(s) == [relu, tanh, sig]
    s *= 2
    assert s is t and len(s) == 6 and list(s._modules) == [str(i) for i in range(6)]
    assert n.Sequential(n.ReLU())(input=lib.ones(1)).tolist() == [1.0]


@pytest.mark.parametrize("lib", [kiln, torch])
def test_named_modules_memo_skips_a_given_module_and_its_subtree(lib):
    n = nn if lib is kiln else tnn
    inner = n.Sequential(n.ReLU(), n.Tanh())
    m = n.Sequential(n.Linear(1, 1), inner)
    memo = {inner}
    assert [name for name, _ in m.named_modules(memo=memo)] == ["", "0"]
    assert len(memo) == 3 and m in memo and m[0] in memo
    assert [name for name, _ in m.named_modules(None, "p")] == ["p", "p.0", "p.1", "p.1.0", "p.1.1"]


@pytest.mark.parametrize("lib", [kiln, torch])
def test_set_submodule_as_torch(lib):
    n = nn if lib is kiln else tnn
    m = n.Sequential(n.Linear(1, 1), n.Sequential(n.ReLU()))
    tanh = n.Tanh()
    m.set_submodule("1.0", tanh)
    assert m[1][0] is tanh and m.get_submodule("1.0") is tanh
    m.set_submodule("0.act", tanh)  # a new name is fine unless strict
    assert m[0].act is tanh
    with pytest.raises(AttributeError, match="no attribute `other`"):
        m.set_submodule("0.other", tanh, strict=True)
    with pytest.raises(AttributeError, match="`weight` is not an nn.Module"):
        m.set_submodule("0.weight", tanh)
    with pytest.raises(AttributeError):
        m.set_submodule("2.x", tanh)  # the parent must exist
    with pytest.raises(ValueError):
        m.set_submodule("", tanh)
    with pytest.raises(ValueError):
        m.set_submodule("1", 3)


def test_module_to_refuses_what_it_would_ignore():
    # m.to(memory_format="channels_last") and m.to(bogus=3) were accepted and did nothing.
    torch = pytest.importorskip("torch")
    m = kiln.nn.Conv2d(3, 4, 3)
    for fmt in ("channels_last", torch.channels_last):
        with pytest.raises(kiln.KilnValueError, match="keeps parameters in their standard layout"):
            m.to(memory_format=fmt)
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        m.to(bogus=3)
    with pytest.raises(TypeError):
        torch.nn.Conv2d(3, 4, 3).to(bogus=3)
    assert m.to(memory_format=torch.contiguous_format, non_blocking=True) is m
    assert m.to(memory_format="contiguous", dtype=kiln.float64).weight.dtype == kiln.float64
