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
    return [k for k in d if not k.endswith("num_batches_tracked")]  # a buffer Kiln's BatchNorm lacks


def names(pairs):
    return [k for k, _ in pairs]


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


# ---- pickling ----

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
