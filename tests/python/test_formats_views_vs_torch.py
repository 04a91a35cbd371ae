# Memory formats (kiln.channels_last, contiguous_format, preserve_format, and torch's own objects) in
# is_contiguous, contiguous, to and nn.Module.to, and the views and functions ported code uses (unfold,
# tensor_split, swapaxes/swapdims, index_copy, view(dtype)), against PyTorch itself: values, strides,
# gradients and the errors of refused calls.
import pickle

import numpy as np
import pytest

import kiln

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(11)


def both(a, grad=False):
    return kiln.tensor(a, requires_grad=grad), torch.tensor(a, requires_grad=grad)


def same(k, t, tol=1e-6):
    assert tuple(k.shape) == tuple(t.shape), (tuple(k.shape), tuple(t.shape))
    t = t.detach()
    kn, tn = np.asarray(k.detach().tolist()).reshape(tuple(k.shape)), (
        t.float() if t.dtype == torch.bfloat16 else t).numpy()
    if t.dtype.is_floating_point:
        assert np.allclose(kn, tn, rtol=tol, atol=tol, equal_nan=True), np.abs(kn - tn).max()
    else:
        assert (kn == tn).all()


def raises_as_torch(kfn, tfn, kind=RuntimeError, match=None):
    with pytest.raises(kind) as te:
        tfn()
    with pytest.raises(kind) as ke:
        kfn()
    if match:
        assert match in str(te.value), str(te.value)
        assert match in str(ke.value), str(ke.value)
    return ke.value


FORMATS = [(kiln.contiguous_format, torch.contiguous_format), (kiln.channels_last, torch.channels_last),
           (kiln.preserve_format, torch.preserve_format)]


# ---- memory formats ----

def test_memory_format_objects():
    assert repr(kiln.channels_last) == "kiln.channels_last"
    assert isinstance(kiln.preserve_format, kiln.memory_format)
    for f, _ in FORMATS:
        assert pickle.loads(pickle.dumps(f)) is f
    with pytest.raises(AttributeError):
        kiln.channels_last._name = "contiguous_format"


# The same layouts made in both libraries: NCHW, NHWC, permuted, sliced, size-1 and empty dims, not 4-D.
LAYOUTS = [
    ((2, 3, 4, 5), lambda m, x: x),
    ((2, 3, 4, 5), lambda m, x: x.contiguous(memory_format=m.channels_last)),
    ((2, 4, 5, 3), lambda m, x: x.permute(0, 3, 1, 2)),  # an NHWC tensor read as NCHW: channels_last
    ((2, 3, 4, 5), lambda m, x: x.permute(0, 2, 3, 1)),
    ((2, 3, 4, 5), lambda m, x: x.permute(0, 1, 3, 2)),
    ((2, 3, 4, 5), lambda m, x: x.transpose(0, 1)),
    ((2, 3, 4, 6), lambda m, x: x[:, :, :, ::2]),
    ((2, 3, 4, 6), lambda m, x: x.contiguous(memory_format=m.channels_last)[:, :, :, :3]),
    ((2, 1, 4, 5), lambda m, x: x),
    ((2, 3, 1, 1), lambda m, x: x),
    ((1, 3, 1, 5), lambda m, x: x.contiguous(memory_format=m.channels_last)),
    ((0, 3, 4, 5), lambda m, x: x),
    ((2, 0, 4, 5), lambda m, x: x),
    ((0, 3, 4, 5), lambda m, x: x.contiguous(memory_format=m.channels_last)),
    ((2, 3, 0, 5), lambda m, x: x.contiguous(memory_format=m.channels_last)),
    ((2, 3, 4), lambda m, x: x),
    ((3, 4), lambda m, x: x.t()),
    ((5,), lambda m, x: x),
]


@pytest.mark.parametrize("case", range(len(LAYOUTS)))
def test_is_contiguous_and_contiguous_as_torch(case):
    shape, make = LAYOUTS[case]
    a = RNG.standard_normal(shape).astype(np.float32)
    # torch.tensor and torch.from_numpy give an empty array strides of 0
    kx, tx = kiln.tensor(a), torch.from_numpy(a) if a.size else torch.zeros(shape)
    kx, tx = make(kiln, kx), make(torch, tx)
    assert kx.stride() == tx.stride()
    assert kx.is_contiguous() == tx.is_contiguous()
    for kf, tf in FORMATS:
        want = tx.is_contiguous(memory_format=tf)
        assert kx.is_contiguous(memory_format=kf) == want, kf
        assert kx.is_contiguous(memory_format=tf) == want, tf  # torch's object, as torch dtypes are taken
    for kf, tf in FORMATS[:2]:
        if tf is torch.channels_last and tx.dim() != 4:
            continue
        ky, ty = kx.contiguous(memory_format=kf), tx.contiguous(memory_format=tf)
        same(ky, ty)
        assert ky.stride() == ty.stride(), (ky.stride(), ty.stride())
        for kf2, tf2 in FORMATS:
            assert ky.is_contiguous(memory_format=kf2) == ty.is_contiguous(memory_format=tf2)
        # to() keeps the tensor itself unless its strides suggest another format (torch's rule: a
        # non-contiguous tensor whose strides are not channels_last-like stays as it is)
        kz, tz = kx.to(memory_format=kf), tx.to(memory_format=tf)
        assert kz.stride() == tz.stride()
        assert (kz is kx) == (tz is tx)
        same(kz, tz)
        kz, tz = kx.to(kiln.float64, memory_format=kf), tx.to(torch.float64, memory_format=tf)
        assert kz.stride() == tz.stride() and kz.dtype == kiln.float64
        same(kz, tz)
    # preserve_format (the default) keeps the tensor; a cast keeps channels_last, as torch's (Kiln's cast
    # gives any other layout contiguous, where torch keeps a dense permutation's strides)
    assert kx.to(memory_format=kiln.preserve_format) is kx
    if tx.numel() and (tx.is_contiguous() or tx.is_contiguous(memory_format=torch.channels_last)):
        assert kx.to(kiln.float64).stride() == tx.to(torch.float64).stride()


def test_channels_last_values_and_gradients_through_a_conv_net():
    # What Module.to(memory_format=channels_last)'s refusal says to do: feed channels_last inputs, which the
    # convolution, batch norm, activation and pooling keep; values and gradients are torch's.
    torch.manual_seed(0)
    tm = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                             torch.nn.MaxPool2d(2))
    km = kiln.nn.Sequential(kiln.nn.Conv2d(3, 4, 3, padding=1), kiln.nn.BatchNorm2d(4), kiln.nn.ReLU(),
                            kiln.nn.MaxPool2d(2))
    km.load_state_dict(tm.state_dict())
    kx, tx = both(RNG.standard_normal((2, 3, 6, 6)).astype(np.float32), grad=True)
    for kf, tf in [(kiln.channels_last, torch.channels_last), (torch.channels_last, torch.channels_last),
                   ("channels_last", torch.channels_last)]:
        kx.grad, tx.grad = None, None
        kin, tin = kx.contiguous(memory_format=kf), tx.contiguous(memory_format=tf)
        ky, ty = km(kin), tm(tin)
        assert ty.is_contiguous(memory_format=torch.channels_last)
        assert ky.is_contiguous(memory_format=kiln.channels_last)
        assert ky.is_contiguous() == ty.is_contiguous()
        same(ky, ty, 1e-5)
        w = RNG.standard_normal(tuple(ty.shape)).astype(np.float32)
        (ky * kiln.tensor(w)).sum().backward()
        (ty * torch.tensor(w)).sum().backward()
        same(kx.grad, tx.grad, 1e-5)
        for (kn, kp), (tn, tp) in zip(km.named_parameters(), tm.named_parameters()):
            same(kp.grad, tp.grad, 1e-4)
        km.zero_grad()
        tm.zero_grad()
    # to(memory_format=...) records its copy for autograd too
    kx.grad, tx.grad = None, None
    (kx.to(memory_format=kiln.channels_last) * 3).sum().backward()
    (tx.to(memory_format=torch.channels_last) * 3).sum().backward()
    same(kx.grad, tx.grad)


def test_refused_memory_formats_as_torch():
    k3, t3 = both(RNG.standard_normal((2, 3, 4)).astype(np.float32))
    for kf in (kiln.channels_last, torch.channels_last):
        assert k3.is_contiguous(memory_format=kf) is False
        raises_as_torch(lambda: k3.contiguous(memory_format=kf),
                        lambda: t3.contiguous(memory_format=torch.channels_last),
                        match="required rank 4 tensor to use channels_last format")
        raises_as_torch(lambda: k3.to(memory_format=kf), lambda: t3.to(memory_format=torch.channels_last),
                        match="required rank 4 tensor to use channels_last format")
        raises_as_torch(lambda: k3.to(kiln.float64, memory_format=kf),
                        lambda: t3.to(torch.float64, memory_format=torch.channels_last),
                        match="required rank 4 tensor to use channels_last format")
    k4, t4 = both(RNG.standard_normal((2, 3, 4, 5)).astype(np.float32))
    for kf in (kiln.preserve_format, torch.preserve_format):
        raises_as_torch(lambda: k4.contiguous(memory_format=kf), lambda: t4.permute(0, 1, 3, 2).contiguous(
            memory_format=torch.preserve_format), match="preserve memory format is unsupported by the contiguous")
    raises_as_torch(lambda: k4.contiguous(memory_format=3), lambda: t4.contiguous(memory_format=3), TypeError)
    raises_as_torch(lambda: k4.is_contiguous(memory_format=None), lambda: t4.is_contiguous(memory_format=None),
                    TypeError)
    raises_as_torch(lambda: k4.is_contiguous(kiln.channels_last), lambda: t4.is_contiguous(torch.channels_last),
                    TypeError)
    with pytest.raises(ValueError, match="channels_last_3d"):  # Kiln has no 5-D channels-last layout
        kiln.zeros(1, 2, 3, 4, 5).contiguous(memory_format=torch.channels_last_3d)


LIKES = ["empty_like", "zeros_like", "ones_like", "rand_like", "randn_like", "full_like"]


@pytest.mark.parametrize("fmt", range(3))
def test_clone_and_like_functions_keep_or_set_the_format_as_torch(fmt):
    kf, tf = FORMATS[fmt]
    a = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    for src in ("nchw", "nhwc", "sliced"):
        k, t = both(a)
        if src == "nhwc":
            k, t = k.to(memory_format=kiln.channels_last), t.to(memory_format=torch.channels_last)
        elif src == "sliced":  # NHWC-ordered strides but not dense: preserve_format suggests channels_last
            k = k.to(memory_format=kiln.channels_last)[:, :, ::2]
            t = t.to(memory_format=torch.channels_last)[:, :, ::2]
        for kc, tc in ((k.clone(memory_format=kf), t.clone(memory_format=tf)),
                       (kiln.clone(k, memory_format=kf), torch.clone(t, memory_format=tf))):
            same(kc, tc)
            assert kc.stride() == tc.stride(), (src, kc.stride(), tc.stride())
        for name in LIKES:
            args = (2.5,) if name == "full_like" else ()
            kl = getattr(kiln, name)(k, *args, memory_format=kf, requires_grad=True)
            tl = getattr(torch, name)(t, *args, memory_format=tf, requires_grad=True)
            assert kl.stride() == tl.stride(), (src, name, kl.stride(), tl.stride())
            assert kl.is_leaf and kl.requires_grad and tuple(kl.shape) == tuple(tl.shape)
            if name in ("zeros_like", "ones_like", "full_like"):
                same(kl, tl)
    # the default is preserve_format, and a channels_last clone passes gradients back to the NCHW source
    k, t = both(a, grad=True)
    kc, tc = k.to(memory_format=kiln.channels_last).clone(), t.to(memory_format=torch.channels_last).clone()
    assert kc.stride() == tc.stride()
    w = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    (kc * kiln.tensor(w)).sum().backward()
    (tc * torch.tensor(w)).sum().backward()
    same(k.grad, t.grad)
    k3, t3 = both(a[0])
    raises_as_torch(lambda: k3.clone(memory_format=kiln.channels_last),
                    lambda: t3.clone(memory_format=torch.channels_last),
                    match="required rank 4 tensor to use channels_last format")
    raises_as_torch(lambda: kiln.zeros_like(k3, memory_format=kiln.channels_last),
                    lambda: torch.zeros_like(t3, memory_format=torch.channels_last),
                    match="required rank 4 tensor to use channels_last format")


def test_module_to_memory_format():
    m = kiln.nn.Conv2d(3, 4, 3)
    w = m.weight
    for f in (kiln.contiguous_format, kiln.preserve_format, torch.contiguous_format, torch.preserve_format,
              "contiguous_format"):
        assert m.to(memory_format=f) is m
        assert m.weight is w
    for f in (kiln.channels_last, torch.channels_last, "channels_last"):
        with pytest.raises(ValueError, match="channels_last inputs.*kiln.channels_last"):
            m.to(memory_format=f)
    with pytest.raises(TypeError, match="memory_format"):
        m.to(memory_format=1)


# ---- views and functions ----

UNFOLDS = [((10,), 0, 3, 2), ((10,), 0, 3, 3), ((10,), 0, 2, 4), ((10,), -1, 10, 1), ((10,), 0, 0, 3),
           ((3, 7, 2), 1, 3, 1), ((3, 7, 2), -3, 2, 1), ((3, 7, 2), 2, 1, 5), ((), 0, 1, 1), ((), -1, 0, 2)]


@pytest.mark.parametrize("shape, dim, size, step", UNFOLDS)
def test_unfold_values_strides_and_gradient(shape, dim, size, step):
    kx, tx = both(RNG.standard_normal(shape), grad=True)
    ky, ty = kx.unfold(dim, size, step), tx.unfold(dim, size, step)
    same(ky, ty, 1e-12)
    assert ky.stride() == ty.stride()
    w = RNG.standard_normal(tuple(ty.shape))
    (ky * kiln.tensor(w)).sum().backward()
    (ty * torch.tensor(w)).sum().backward()
    same(kx.grad, tx.grad, 1e-12)


def test_unfold_is_a_view_and_its_errors():
    kx, tx = both(np.arange(10.0))
    ku, tu = kx.unfold(0, 4, 3), tx.unfold(0, 4, 3)
    ku[1, 0] = 100.0  # the memory of kx[3], as torch's
    tu[1, 0] = 100.0
    same(kx, tx)
    k2, t2 = both(np.arange(24.0).reshape(2, 3, 4))
    same(k2.transpose(1, 2).unfold(1, 2, 1), t2.transpose(1, 2).unfold(1, 2, 1))  # a strided input
    raises_as_torch(lambda: kx.unfold(0, 11, 1), lambda: tx.unfold(0, 11, 1),
                    match="maximum size for tensor at dimension 0 is 10 but size is 11")
    raises_as_torch(lambda: kx.unfold(0, 3, 0), lambda: tx.unfold(0, 3, 0), match="step is 0 but must be > 0")
    raises_as_torch(lambda: kx.unfold(0, -1, 1), lambda: tx.unfold(0, -1, 1), match="size is -1 but must be >= 0")
    raises_as_torch(lambda: kx.unfold(1, 3, 1), lambda: tx.unfold(1, 3, 1), IndexError,
                    match="Dimension out of range")
    raises_as_torch(lambda: kiln.tensor(5.0).unfold(0, 2, 1), lambda: torch.tensor(5.0).unfold(0, 2, 1),
                    match="maximum size for tensor at dimension 0 is 1 but size is 2")


SPLITS = [(7, 0, 3), (7, 0, 8), (7, 0, 1), (7, 0, [2, 5]), (7, 0, (-2, 1, 9)), (7, 0, []), (7, 0, [3, 3]),
          ((2, 6), 1, 4), ((2, 6), -1, [1, 4]), ((4, 3), 0, "t0"), ((4, 3), 0, "t1")]


@pytest.mark.parametrize("shape, dim, arg", SPLITS)
def test_tensor_split_as_torch(shape, dim, arg):
    kx, tx = both(RNG.standard_normal(shape), grad=True)
    karg, targ = arg, arg
    if arg == "t0":
        karg, targ = kiln.tensor(3), torch.tensor(3)
    elif arg == "t1":
        karg, targ = kiln.tensor([1, 3]), torch.tensor([1, 3])
    kp, tp = kiln.tensor_split(kx, karg, dim), torch.tensor_split(tx, targ, dim)
    kq, tq = kx.tensor_split(karg, dim=dim), tx.tensor_split(targ, dim=dim)
    assert isinstance(kp, tuple) and len(kp) == len(tp) == len(kq)
    for k, k2, t in zip(kp, kq, tp):
        same(k, t, 1e-12)
        same(k2, t, 1e-12)
    loss_k = sum(((i + 1) * p ** 2).sum() for i, p in enumerate(kp))
    loss_t = sum(((i + 1) * p ** 2).sum() for i, p in enumerate(tp))
    loss_k.backward()
    loss_t.backward()
    same(kx.grad, tx.grad, 1e-12)


def test_tensor_split_errors_as_torch():
    kx, tx = both(np.arange(7))
    raises_as_torch(lambda: kiln.tensor_split(kx, 0), lambda: torch.tensor_split(tx, 0),
                    match="number of sections must be larger than 0, got 0")
    raises_as_torch(lambda: kiln.tensor_split(kx, kiln.tensor([1.0])),
                    lambda: torch.tensor_split(tx, torch.tensor([1.0])),
                    match="tensor_split expected tensor_indices_or_sections to have dtype of long")
    raises_as_torch(lambda: kiln.tensor_split(kx, kiln.tensor([[1]])),
                    lambda: torch.tensor_split(tx, torch.tensor([[1]])),
                    match="to be a zero-dimensional or one-dimensional tensor, but got a tensor with 2 dims")
    raises_as_torch(lambda: kiln.tensor_split(kiln.tensor(1.0), 2), lambda: torch.tensor_split(torch.tensor(1.0), 2),
                    match="expected at least a 1-dimensional tensor, but got a tensor with 0 dims")
    raises_as_torch(lambda: kiln.tensor_split(kx, 2.5), lambda: torch.tensor_split(tx, 2.5), TypeError)
    raises_as_torch(lambda: kiln.tensor_split(kx, 2, 1), lambda: torch.tensor_split(tx, 2, 1), IndexError)


def test_swapaxes_swapdims_as_torch():
    kx, tx = both(RNG.standard_normal((2, 3, 4)), grad=True)
    outs = [(kiln.swapaxes(kx, 0, 2), torch.swapaxes(tx, 0, 2)), (kx.swapaxes(-1, 1), tx.swapaxes(-1, 1)),
            (kiln.swapdims(kx, 1, 0), torch.swapdims(tx, 1, 0)), (kx.swapdims(2, 2), tx.swapdims(2, 2))]
    for i, (k, t) in enumerate(outs):
        same(k, t, 1e-12)
        assert k.stride() == t.stride()
    sum(((i + 1) * k ** 3).sum() for i, (k, _) in enumerate(outs)).backward()
    sum(((i + 1) * t ** 3).sum() for i, (_, t) in enumerate(outs)).backward()
    same(kx.grad, tx.grad, 1e-12)
    raises_as_torch(lambda: kx.swapaxes(0, 3), lambda: tx.swapaxes(0, 3), IndexError)


@pytest.mark.parametrize("shape, dim, index, src_shape", [
    ((5, 3), 0, [4, 0, 2], (3, 3)), ((5, 3), 1, [2, 0], (5, 2)), ((2, 4, 3), -2, [3], (2, 1, 3)),
    ((2, 4, 3), 1, 1, (2, 1, 3)), ((5,), 0, [], (0,)), ((), 0, [0], (1,))])
def test_index_copy_values_and_gradients(shape, dim, index, src_shape):
    kx, tx = both(RNG.standard_normal(shape), grad=True)
    ks, ts = both(RNG.standard_normal(src_shape), grad=True)
    ki, ti = kiln.tensor(index, dtype=kiln.int64), torch.tensor(index, dtype=torch.int64)
    ky, ty = kiln.index_copy(kx, dim, ki, ks), torch.index_copy(tx, dim, ti, ts)
    same(ky, ty, 1e-12)
    same(kx.index_copy(dim, ki, ks), tx.index_copy(dim, ti, ts), 1e-12)
    w = RNG.standard_normal(tuple(ty.shape))
    (ky * kiln.tensor(w)).sum().backward()
    (ty * torch.tensor(w)).sum().backward()
    same(kx.grad, tx.grad, 1e-12)
    same(ks.grad, ts.grad, 1e-12)
    kz, tz = kx.detach().clone(), tx.detach().clone()
    assert kz.index_copy_(dim, ki, ks.detach()) is kz
    tz.index_copy_(dim, ti, ts.detach())
    same(kz, tz, 1e-12)


def test_index_copy_errors_as_torch():
    kx, tx = both(np.zeros((3, 4), np.float32))
    ks, ts = both(RNG.standard_normal((2, 4)).astype(np.float32))
    cases = [
        (lambda m, x, s: x.index_copy(0, m.tensor([0, 2], dtype=m.int32), s), RuntimeError,
         "Expected a long tensor for index"),
        (lambda m, x, s: x.index_copy(0, m.tensor([[0, 2]]), s), IndexError, "Index should have dimension 1 or 0"),
        (lambda m, x, s: x.index_copy(0, m.tensor([0, 5]), s), IndexError,
         "index 5 is out of bounds for dimension 0 with size 3"),
        (lambda m, x, s: x.index_copy(0, m.tensor([0, -1]), s), IndexError,
         "index -1 is out of bounds for dimension 0 with size 3"),
        (lambda m, x, s: x.index_copy(0, m.tensor([0, 1, 2]), s), IndexError,
         "Number of indices (3) should be equal to source.size(dim) (2)"),
        (lambda m, x, s: x.index_copy(0, m.tensor([0, 2]), s.double()), RuntimeError,
         "self and source expected to have the same dtype"),
        (lambda m, x, s: x.index_copy(0, m.tensor([0, 2]), s[:, :3]), RuntimeError,
         "Source/destination tensor must have same slice shapes"),
        (lambda m, x, s: x.index_copy(2, m.tensor([0, 2]), s), IndexError, "Dimension out of range"),
    ]
    for fn, kind, match in cases:
        raises_as_torch(lambda: fn(kiln, kx, ks), lambda: fn(torch, tx, ts), kind, match)
    kl, tl = both(np.zeros((3, 4), np.float32), grad=True)
    with pytest.raises(RuntimeError, match="index_copy_"):  # a leaf that requires grad, as torch refuses
        kl.index_copy_(0, kiln.tensor([0, 2]), ks)
    with pytest.raises(RuntimeError):
        tl.index_copy_(0, torch.tensor([0, 2]), ts)


VIEWS = [
    ("float32", "int32", lambda x: x), ("float32", "float16", lambda x: x), ("float32", "bfloat16", lambda x: x),
    ("float32", "float64", lambda x: x), ("float32", "uint8", lambda x: x), ("int64", "int8", lambda x: x),
    ("int64", "float64", lambda x: x), ("float16", "bfloat16", lambda x: x), ("float16", "int16", lambda x: x),
    ("float32", "float16", lambda x: x[:, 1:]), ("float32", "float64", lambda x: x[:, 2:]),
    ("float32", "int32", lambda x: x.t()), ("float32", "int32", lambda x: x[0, 0]),
    ("uint8", "bool", lambda x: x % 2), ("int8", "uint8", lambda x: x),
]


@pytest.mark.parametrize("src, dst, make", VIEWS)
def test_view_dtype_as_torch(src, dst, make):
    a = (RNG.standard_normal((3, 4)) * 50).astype(src)
    kx, tx = make(kiln.tensor(a)), make(torch.tensor(a))
    ky, ty = kx.view(getattr(kiln, dst)), tx.view(getattr(torch, dst))
    assert ky.dtype.name == dst
    assert tuple(ky.shape) == tuple(ty.shape) and ky.stride() == ty.stride()
    assert ky.storage_offset() == ty.storage_offset()
    if dst == "bfloat16":
        same(ky.float(), ty.float())
    else:
        kn, tn = np.asarray(ky.tolist()), ty.numpy()
        assert ((kn == tn) | (np.isnan(kn) & np.isnan(tn))).all()
    same(kx.view(getattr(torch, dst)).float(), ty.float())  # torch's dtype, as kiln takes it elsewhere
    same(kx.view(dtype=getattr(kiln, dst)).float(), ty.float())


def test_view_dtype_shares_memory_needs_no_gradient_and_its_errors():
    kx, tx = both(np.arange(8, dtype=np.float32).reshape(2, 4), grad=True)
    kv, tv = kx.view(kiln.int32), tx.view(torch.int32)
    assert kv.requires_grad is tv.requires_grad is False
    with kiln.no_grad():
        kv[0, 0] = 1065353216  # the bits of 1.0f
    with torch.no_grad():
        tv[0, 0] = 1065353216
    same(kx, tx)
    k, t = kx.detach(), tx.detach()
    raises_as_torch(lambda: kiln.tensor(1.0).view(kiln.float16), lambda: torch.tensor(1.0).view(torch.float16),
                    match="cannot be 0")
    raises_as_torch(lambda: kiln.zeros(3, 3).t().view(kiln.float16), lambda: torch.zeros(3, 3).t().view(torch.float16),
                    match="stride(-1) must be 1")
    raises_as_torch(lambda: kiln.zeros(2, 3).view(kiln.float64), lambda: torch.zeros(2, 3).view(torch.float64),
                    match="must be divisible by 2")
    raises_as_torch(lambda: kiln.zeros(4, 4)[:, 1:3].view(kiln.float64),
                    lambda: torch.zeros(4, 4)[:, 1:3].view(torch.float64), match="storage_offset() must be divisible")
    raises_as_torch(lambda: kiln.zeros(4, 3)[:, :2].view(kiln.float64),
                    lambda: torch.zeros(4, 3)[:, :2].view(torch.float64), match="stride(0) must be divisible by 2")
    assert k.view(-1).shape == (8,) and k.view(4, 2).shape == (4, 2) and k.view((2, 4)).shape == (2, 4)


def test_hsplit_vsplit_dsplit_as_torch():
    for shape, name, arg in [((2, 6), "hsplit", 3), ((6,), "hsplit", [1, 4]), ((2, 6), "hsplit", [1, 4]),
                             ((4, 2), "vsplit", 2), ((4, 2), "vsplit", [3]), ((1, 2, 6), "dsplit", 2),
                             ((1, 2, 6), "dsplit", (5,))]:
        kx, tx = both(RNG.standard_normal(shape), grad=True)
        kp, tp = getattr(kiln, name)(kx, arg), getattr(torch, name)(tx, arg)
        kq = getattr(kx, name)(arg)
        assert len(kp) == len(tp) == len(kq)
        for k, k2, t in zip(kp, kq, tp):
            same(k, t, 1e-12)
            same(k2, t, 1e-12)
        sum(((i + 1) * p ** 2).sum() for i, p in enumerate(kp)).backward()
        sum(((i + 1) * p ** 2).sum() for i, p in enumerate(tp)).backward()
        same(kx.grad, tx.grad, 1e-12)
    for shape, name, arg, match in [((2, 6), "hsplit", 4, "is not divisible by the split_size 4"),
                                    ((6,), "hsplit", 4, "along dimension 0"),
                                    ((), "hsplit", 2, "at least 1 dimension"),
                                    ((6,), "vsplit", 2, "at least 2 dimension"),
                                    ((2, 6), "dsplit", 2, "at least 3 dimension"),
                                    ((1, 2, 6), "dsplit", 0, "split_size 0")]:
        k, t = kiln.zeros(shape), torch.zeros(shape)
        raises_as_torch(lambda: getattr(kiln, name)(k, arg), lambda: getattr(torch, name)(t, arg), match=match)


def test_small_methods_as_torch():
    kx, tx = both(RNG.standard_normal((2, 3, 4)), grad=True)
    outs = [(kx.square(), tx.square()), (kiln.square(kx), torch.square(tx)), (kx.ravel(), tx.ravel()),
            (kiln.ravel(kx.transpose(0, 2)), torch.ravel(tx.transpose(0, 2))),
            (kx.reshape_as(kiln.zeros(4, 6)), tx.reshape_as(torch.zeros(4, 6))),
            (kx.clamp_min(0.1), tx.clamp_min(0.1)), (kx.clamp_max(-0.2), tx.clamp_max(-0.2)),
            (kiln.clamp_min(kx, 0.3), torch.clamp_min(tx, 0.3)), (kiln.clamp_max(kx, 0.3), torch.clamp_max(tx, 0.3))]
    for k, t in outs:
        same(k, t, 1e-12)
    sum(((i + 1) * k).sum() for i, (k, _) in enumerate(outs)).backward()
    sum(((i + 1) * t).sum() for i, (_, t) in enumerate(outs)).backward()
    same(kx.grad, tx.grad, 1e-12)
    for a in ([True, False], [3, -2]):
        for kd, td in ((kiln.bool, torch.bool), (kiln.int8, torch.int8)):
            k, t = kiln.tensor(a, dtype=kd), torch.tensor(a, dtype=td)
            assert str(k.square().dtype.name) == str(t.square().dtype).replace("torch.", "")
            same(k.square(), t.square())
    assert kx.nelement() == tx.nelement() == 24 and kx.ndimension() == tx.ndimension() == 3
    ke, te = kx.new_empty(2, 5), tx.new_empty(2, 5)
    assert ke.shape == tuple(te.shape) and ke.dtype == kiln.float64 and not ke.requires_grad
    ke = kx.new_empty((3,), dtype=kiln.int32, requires_grad=False)
    assert ke.shape == (3,) and ke.dtype == kiln.int32


def test_review_cases_as_torch():
    # Found by a review: each was another result or error than torch's.
    # index_copy with a repeated index: every source row gets the gradient of the row it was written to
    # (torch's g.index_select), not only the last write
    for mk in (kiln, torch):
        x = mk.zeros(3, 3, requires_grad=True)
        s = mk.arange(6.0).reshape(2, 3).requires_grad_()
        (x.index_copy(0, mk.tensor([1, 1]), s) * mk.arange(9.0).reshape(3, 3)).sum().backward()
        assert s.grad.tolist() == [[3.0, 4.0, 5.0], [3.0, 4.0, 5.0]]
        assert x.grad.tolist() == [[0.0, 1.0, 2.0], [0.0, 0.0, 0.0], [6.0, 7.0, 8.0]]
    # a 1-D input takes a 0-dim source; a source of other dims is an IndexError
    assert kiln.zeros(3).index_copy(0, kiln.tensor([1]), kiln.tensor(5.0)).tolist() == [0.0, 5.0, 0.0]
    with pytest.raises(IndexError, match="dimensionality must match"):
        kiln.zeros(3, 3).index_copy(0, kiln.tensor([1]), kiln.zeros(1, 1, 3))
    # a NumPy scalar type is a dtype for view(), as np.dtype is
    assert kiln.tensor([1.0, 2.0]).view(np.int32).tolist() == torch.tensor([1.0, 2.0]).view(torch.int32).tolist()
    # a 0-dim tensor of sections is checked as a number of sections
    with pytest.raises(kiln.KilnError, match="not divisible"):
        kiln.arange(10.0).hsplit(kiln.tensor(3))
    # to(copy=True) copies even where nothing converts; writes into the copy leave the input
    x = kiln.ones(2)
    y = x.to(kiln.float32, copy=True)
    y[0] = 100
    assert x.tolist() == [1.0, 1.0] and y is not x
    c = kiln.randn(2, 3, 4, 5).contiguous(memory_format=kiln.channels_last)
    assert c.to(copy=True).stride() == (60, 1, 15, 3) and c.to(copy=True) is not c
    # memory_format=None is preserve_format; a memory_format made by hand is the named one
    assert c.to(memory_format=None) is c
    assert c.is_contiguous(memory_format=kiln.memory_format("channels_last"))
    # a device move keeps channels_last, as torch's (it gave NCHW strides)
    assert c.to("meta").stride() == (60, 1, 15, 3)
    assert c.to("meta").is_contiguous(memory_format=kiln.channels_last)
