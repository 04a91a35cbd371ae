# NumPy and PyTorch interop: zero-copy both ways (same data pointer), lifetimes (the source deleted
# first, then the view read), every dtype.
import gc
import sys

import numpy as np
import pytest

import kiln

try:
    import torch
except ImportError:  # the README's test command installs it; a bare venv may not have it
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")

NUMPY_DTYPES = [np.float32, np.float16, np.float64, np.int32, np.int64, np.int16, np.int8, np.uint8, np.bool_]


def churn():
    """Allocates and fills memory, so a freed buffer read afterwards would show other values."""
    junk = [np.full(1 << 16, 7, dtype=np.uint8) for _ in range(64)]
    gc.collect()
    return len(junk)


@pytest.mark.parametrize("dt", NUMPY_DTYPES)
def test_from_numpy_shares_memory(dt):
    a = (np.arange(24) % 5).astype(dt).reshape(4, 6)
    t = kiln.from_numpy(a)
    assert t.data_ptr() == a.ctypes.data
    assert t.shape == (4, 6)
    assert np.array_equal(t.numpy(), a)
    a[1, 2] = 1
    assert t[1, 2].item() == 1  # writes to the array are seen by the tensor
    t[2, 3] = 0
    assert a[2, 3] == 0  # and the other way round


@pytest.mark.parametrize("dt", NUMPY_DTYPES)
def test_numpy_shares_memory(dt):
    t = kiln.tensor((np.arange(10) % 3).astype(dt))
    a = t.numpy()
    assert a.ctypes.data == t.data_ptr()
    assert a.dtype == np.dtype(dt)


def test_numpy_source_deleted_first():
    a = np.arange(1000, dtype=np.float64) * 0.5
    t = kiln.from_numpy(a)
    expect = a.copy()
    del a
    churn()
    assert np.array_equal(t.numpy(), expect)


def test_tensor_deleted_first():
    t = kiln.arange(1000).to(kiln.float64) * 0.25
    a = t.numpy()
    expect = np.arange(1000) * 0.25
    del t
    churn()
    assert np.array_equal(a, expect)


def test_strided_views_keep_strides():
    a = np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2].T  # non-contiguous
    t = kiln.from_numpy(a)
    assert t.data_ptr() == a.ctypes.data
    assert t.stride() == tuple(s // 4 for s in a.strides)
    assert np.array_equal(t.numpy(), a)
    v = kiln.arange(24).reshape(4, 6).transpose(0, 1)
    assert v.numpy().strides == (8, 48)


def test_numpy_refusals():
    with pytest.raises(kiln.KilnValueError, match="uint16"):
        kiln.from_numpy(np.zeros(3, dtype=np.uint16))
    ro = np.zeros(3, dtype=np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        kiln.from_numpy(ro)
    assert kiln.tensor(ro).shape == (3,)  # the copying constructor takes it
    with pytest.raises(ValueError, match="requires grad"):
        kiln.ones(2, requires_grad=True).numpy()
    with pytest.raises(ValueError, match="bfloat16"):
        kiln.ones(2).to(kiln.bfloat16).numpy()


def test_tensor_of_numpy_scalars_and_0d_arrays_is_0d_and_keeps_the_dtype():
    # torch.tensor's rule: a 0-d array or a NumPy scalar gives a 0-d tensor of its dtype
    for v, dt in [(np.array(3.0), kiln.float64), (np.float32(2), kiln.float32), (np.float64(2), kiln.float64),
                  (np.int32(4), kiln.int32), (np.array(5), kiln.int64), (np.bool_(True), kiln.bool)]:
        t = kiln.tensor(v)
        assert t.shape == () and t.dtype == dt, (repr(v), t.shape, t.dtype)
        assert t.item() == v
    assert kiln.tensor(2.5).dtype == kiln.float32  # a Python float: the default float type
    t = kiln.tensor(np.arange(6).reshape(2, 3).T)  # not C-contiguous: copied in order
    assert t.shape == (3, 2) and t.tolist() == [[0, 3], [1, 4], [2, 5]]


def test_numpy_protocols():
    t = kiln.arange(6).reshape(2, 3)
    assert np.asarray(t).ctypes.data == t.data_ptr()
    assert np.array_equal(np.from_dlpack(t), np.arange(6).reshape(2, 3))
    assert np.asarray(np.from_dlpack(t, device="cpu")).ctypes.data == t.data_ptr()  # its own device: no copy
    assert np.array_equal(np.asarray(t, dtype=np.float64), np.arange(6.0).reshape(2, 3))


def test_dlpack_copy_and_device_requests():
    t = kiln.arange(6).reshape(2, 3)
    c = np.from_dlpack(t, copy=True)  # the array API's copy=True: a copy, never the memory itself
    assert c.ctypes.data != t.data_ptr() and np.array_equal(c, np.arange(6).reshape(2, 3))
    c[0, 0] = 7
    assert t[0, 0].item() == 0
    with pytest.raises(BufferError, match="copy=False"):
        t.__dlpack__(dl_device=(2, 0), copy=False)
    with pytest.raises(BufferError, match="not 3"):  # CUDA host memory: not a kind Kiln allocates
        t.__dlpack__(dl_device=(3, 0))
    with pytest.raises(BufferError, match="cannot copy to cuda:64"):
        t.__dlpack__(dl_device=(2, 64))
    m = kiln.zeros(3, device="meta")
    with pytest.raises(BufferError, match="no memory"):
        m.__dlpack__()
    with pytest.raises(BufferError, match="no memory"):
        np.from_dlpack(m)


def test_dlpack_negative_strides_refused_and_released():
    a = np.arange(5.0)[::-1]
    refs = sys.getrefcount(a)
    with pytest.raises(ValueError, match="negative stride"):
        kiln.from_dlpack(a)
    gc.collect()
    assert sys.getrefcount(a) == refs  # the refused array is not held


@needs_torch
@pytest.mark.parametrize(
    "name", ["float32", "float16", "bfloat16", "float64", "int32", "int64", "int16", "int8", "uint8", "bool"]
)
def test_torch_round_trip_every_dtype(name):
    tt = (torch.arange(12) % 3).to(getattr(torch, name)).reshape(3, 4)
    k = kiln.from_dlpack(tt)
    assert k.data_ptr() == tt.data_ptr()
    assert k.dtype == getattr(kiln, name)
    back = torch.from_dlpack(k)
    assert back.data_ptr() == tt.data_ptr()
    assert back.dtype == tt.dtype
    assert torch.equal(back, tt)


@needs_torch
def test_torch_strides_and_writes():
    tt = torch.arange(20.0).reshape(4, 5).t()  # a transposed view
    k = kiln.from_dlpack(tt)
    assert k.stride() == tt.stride()
    assert k.tolist() == tt.tolist()
    k[0, 1] = -1.0
    assert tt[0, 1].item() == -1.0
    back = torch.from_dlpack(k[1:3])
    assert back.data_ptr() == tt[1:3].data_ptr()


@needs_torch
def test_torch_lifetimes():
    tt = torch.linspace(0, 1, 4096, dtype=torch.float64)
    expect = tt.clone()
    k = kiln.from_dlpack(tt)
    del tt
    churn()
    assert torch.equal(torch.from_dlpack(k.clone()), expect)
    src = kiln.arange(4096).to(kiln.float64) / 4095.0
    tt2 = torch.from_dlpack(src)
    del src
    churn()
    assert torch.allclose(tt2, expect)


@needs_torch
def test_torch_tensor_that_requires_grad():
    tt = torch.ones(3, requires_grad=True)
    k = kiln.from_dlpack(tt)  # the data, shared; not torch's graph
    assert k.data_ptr() == tt.data_ptr() and not k.requires_grad


@needs_torch
def test_load_state_dict_takes_torch_tensors_and_numpy_arrays():
    # A state dict made by torch (or NumPy code) loads as one of kiln.Tensors, as weights are ported.
    torch.manual_seed(0)
    tm = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    km = kiln.nn.Sequential(kiln.nn.Linear(3, 4), kiln.nn.BatchNorm1d(4))
    with torch.no_grad():
        tm[1].running_mean.uniform_()
    assert km.load_state_dict(tm.state_dict()) == ([], [])
    assert km.load_state_dict(tm.state_dict(keep_vars=True)) == ([], [])  # tensors that require grad
    for k, v in tm.state_dict().items():
        np.testing.assert_array_equal(km.state_dict()[k].numpy(), v.numpy(), err_msg=k)
    # NumPy arrays: another dtype is converted (as torch's copy_), a read-only one copied first.
    w = np.arange(12, dtype=np.float64).reshape(4, 3)
    b = np.ones(4, np.float32)
    b.flags.writeable = False
    lin = kiln.nn.Linear(3, 4)
    assert lin.load_state_dict({"weight": w, "bias": b}) == ([], [])
    assert lin.weight.dtype == kiln.float32 and lin.weight.tolist() == w.tolist() and lin.bias.tolist() == [1.0] * 4
    lin.load_state_dict({"weight": torch.full((4, 3), 2.0, dtype=torch.bfloat16), "bias": torch.zeros(4)})
    assert lin.weight.tolist() == [[2.0] * 3] * 4
    # A kiln.models model, and an optimizer's state.
    r = kiln.models.create("resnet20", set={"num_classes": 3})
    arrays = {k: v.numpy().copy() for k, v in r.state_dict().items()}
    arrays["fc.bias"] = np.array([1.0, 2.0, 3.0], np.float32)
    assert r.load_state_dict(arrays) == ([], [])
    assert r.fc.bias.tolist() == [1.0, 2.0, 3.0]
    assert r.load_state_dict({k: torch.from_numpy(v) for k, v in arrays.items()}) == ([], [])
    opt = kiln.optim.SGD(lin.parameters(), lr=0.1, momentum=0.9)
    lin(kiln.ones(2, 3)).sum().backward()
    opt.step()
    state = opt.state_dict()
    ported = {"state": {i: {k: torch.from_numpy(v.numpy() * 0 + 5) for k, v in e.items()}
                        for i, e in state["state"].items()}, "param_groups": state["param_groups"]}
    opt.load_state_dict(ported)
    assert all(set(v.numpy().ravel().tolist()) == {5.0} for e in opt.state_dict()["state"].values() for v in e.values())
    tensors, scalars = opt._engine.state()  # and in Kiln's older layout
    opt.load_state_dict({"tensors": {k: np.full(v.shape, 6, np.float32) for k, v in tensors.items()},
                         "scalars": scalars})
    assert all(set(v.numpy().ravel().tolist()) == {6.0} for e in opt.state_dict()["state"].values() for v in e.values())
    # A wrong shape names the key and both shapes; a dtype Kiln lacks names the key, it and the module's.
    with pytest.raises(kiln.KilnError, match=r"weight has shape \(4, 2\), the module's is \(4, 3\)"):
        lin.load_state_dict({"weight": np.zeros((4, 2), np.float32), "bias": b})
    with pytest.raises(kiln.KilnError, match=r"fc.weight \(checkpoint \[3,5\], model \[3,64\]\)"):
        r.load_state_dict({**arrays, "fc.weight": torch.zeros(3, 5)})
    with pytest.raises(kiln.KilnValueError, match=r"'weight' \(ndarray of complex64 \(4, 3\)\).*complex64.*"
                                                  r"the module's is float32 \(4, 3\)"):
        lin.load_state_dict({"weight": np.zeros((4, 3), np.complex64), "bias": b})
    with pytest.raises(kiln.KilnValueError, match=r"'bias' \(Tensor of torch.complex64 \(4,\)\)"):
        lin.load_state_dict({"weight": w, "bias": torch.zeros(4, dtype=torch.complex64)})
    with pytest.raises(TypeError, match="'weight' is a list, expected a kiln.Tensor, a NumPy array or a torch.Tensor"):
        lin.load_state_dict({"weight": [[1.0] * 3] * 4, "bias": b})
