# Tensors from Python: construction and dtype rules, properties, indexing as views, the operators
# against NumPy, reductions, conversions.
import numpy as np
import pytest

import kiln


def test_construction_and_dtypes():
    assert kiln.tensor([1.5, 2.0]).dtype == kiln.float32  # Python floats: float32, as PyTorch
    assert kiln.tensor([[1, 2], [3, 4]]).dtype == kiln.int64
    assert kiln.tensor([True, False]).dtype == kiln.bool
    assert kiln.tensor(np.zeros(2, dtype=np.float64)).dtype == kiln.float64  # arrays keep theirs
    assert kiln.tensor(3.0).shape == ()
    t = kiln.tensor([[1, 2, 3]], dtype=kiln.float64, requires_grad=True)
    assert t.dtype == kiln.float64 and t.requires_grad and t.is_leaf
    assert kiln.zeros(2, 3).shape == (2, 3)
    assert kiln.zeros((2, 3), dtype="float16").dtype == kiln.float16
    assert kiln.ones([4], dtype=kiln.int32).tolist() == [1, 1, 1, 1]
    assert kiln.full((2,), 7.0).tolist() == [7.0, 7.0]
    assert kiln.arange(5).tolist() == [0, 1, 2, 3, 4]
    assert kiln.arange(1, 2, 0.25, dtype=kiln.float32).tolist() == [1.0, 1.25, 1.5, 1.75]
    assert kiln.eye(2).tolist() == [[1.0, 0.0], [0.0, 1.0]]
    assert kiln.zeros_like(t).dtype == kiln.float64
    assert str(kiln.zeros(1).device) == "cpu"
    assert kiln.zeros(1).device == "cpu"


def test_repr_prints_integers_exactly():
    # Integer elements went through a double: 2**62 + 1 printed as 4611686018427387904.
    values = [2**62 + 1, -2**63, 2**63 - 1, -3]
    t = kiln.from_numpy(np.array(values, dtype=np.int64))
    assert t.tolist() == values
    assert "[4611686018427387905, -9223372036854775808, 9223372036854775807, -3]" in repr(t)
    assert "[2147483647, -2147483648]" in repr(kiln.from_numpy(np.array([2**31 - 1, -2**31], dtype=np.int32)))
    torch = pytest.importorskip("torch")
    for v in values:  # the digits torch prints
        assert str(v) in repr(torch.tensor(values)) and str(v) in repr(t)


def test_random_streams_repeat():
    kiln.manual_seed(7)
    a = kiln.randn(5).tolist()
    kiln.manual_seed(7)
    assert kiln.randn(5).tolist() == a
    r = kiln.randint(0, 10, (1000,))
    assert r.dtype == kiln.int64 and 0 <= r.min().item() and r.max().item() < 10


def test_properties():
    t = kiln.arange(24).reshape(2, 3, 4)
    assert t.ndim == 3 and t.dim() == 3 and t.numel() == 24 and len(t) == 2
    assert t.size() == (2, 3, 4) and t.size(1) == 3 and t.size(-1) == 4
    assert t.stride() == (12, 4, 1)
    assert t.element_size() == 8
    assert t.is_contiguous() and not t.transpose(0, 2).is_contiguous()
    assert kiln.tensor(2.5).item() == 2.5
    assert kiln.tensor(3).item() == 3 and isinstance(kiln.tensor(3).item(), int)
    assert float(kiln.tensor(1.5)) == 1.5 and int(kiln.tensor(4)) == 4
    assert "tensor" in repr(t) or "[" in repr(t)
    with pytest.raises(ValueError, match="ambiguous"):
        bool(kiln.zeros(2))


def test_basic_indexing_is_a_view():
    a = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
    t = kiln.tensor(a)
    for key in [1, -1, (1, 2), (slice(None), 1), (Ellipsis, 2), (None, 1), (slice(1, None), None, slice(None, None, 2)),
                (1, Ellipsis, slice(-3, None)), (slice(0, 0),), (slice(None, None, 3), 0, 4), (-2, -1, -1)]:
        assert np.array_equal(t[key].numpy(), a[key]), key
    v = t[1, :, 1:3]
    assert v.data_ptr() == t.data_ptr() + (20 + 1) * 4  # a view: no copy
    v.fill_(0.0)
    assert t[1, 2, 1].item() == 0.0


def test_negative_steps_and_tensor_indices():
    a = np.arange(20).reshape(4, 5)
    t = kiln.tensor(a)
    assert np.array_equal(t[::-1].numpy(), a[::-1])
    assert np.array_equal(t[:, 4:0:-2].numpy(), a[:, 4:0:-2])
    assert np.array_equal(t[[0, 2, -1]].numpy(), a[[0, 2, -1]])
    assert np.array_equal(t[:, kiln.tensor([[0, 1], [4, 3]])].numpy(), a[:, np.array([[0, 1], [4, 3]])])
    mask = a % 3 == 0
    assert np.array_equal(t[kiln.tensor(mask)].numpy(), a[mask])
    rows = a[:, 0] > 4
    assert np.array_equal(t[kiln.tensor(rows)].numpy(), a[rows])


def test_setitem():
    a = np.zeros((3, 4), dtype=np.float32)
    t = kiln.zeros(3, 4)
    for key, val in [((0, 1), 5.0), ((slice(None), 2), 1.5), ((1,), np.arange(4, dtype=np.float32)),
                     (([0, 2], 3), 9.0), ((slice(None), [1, 3]), np.array([[1, 2], [3, 4], [5, 6]], np.float32))]:
        a[key] = val
        t[key] = kiln.tensor(val) if isinstance(val, np.ndarray) else val
        assert np.array_equal(t.numpy(), a), key
    a[a > 4] = -1
    t[t > 4] = -1
    assert np.array_equal(t.numpy(), a)
    with pytest.raises(IndexError, match="negative-step"):
        t[::-1] = 0.0


def test_index_errors():
    t = kiln.zeros(2, 3)
    with pytest.raises(IndexError, match="out of bounds for dimension 1 with size 3"):
        t[0, 3]
    with pytest.raises(IndexError, match="too many indices"):
        t[0, 0, 0]
    with pytest.raises(kiln.KilnIndexError, match="out of bounds"):
        t[kiln.tensor([0, 5])]
    with pytest.raises(IndexError, match="f32"):
        t[kiln.tensor([0.0])]
    with pytest.raises(IndexError, match="valid indices"):
        t["a"]


@pytest.mark.parametrize("op", ["+", "-", "*", "/", "**"])
def test_operators_match_numpy(op):
    rng = np.random.default_rng(0)
    a = rng.uniform(0.5, 2, (3, 4)).astype(np.float32)
    b = rng.uniform(0.5, 2, (4,)).astype(np.float32)
    ka, kb = kiln.tensor(a), kiln.tensor(b)
    for x, y, kx, ky in [(a, b, ka, kb), (a, 2.5, ka, 2.5), (3.0, a, 3.0, ka), (a, b, ka, b)]:
        expect = eval(f"x {op} y")
        got = eval(f"kx {op} ky")
        assert isinstance(got, kiln.Tensor)
        np.testing.assert_allclose(got.numpy(), expect, rtol=2e-6)


def test_comparisons_and_logic():
    a = kiln.tensor([1, 2, 3])
    assert (a == 2).tolist() == [False, True, False]
    assert (a >= 2).tolist() == [False, True, True]
    assert ((a > 1) & (a < 3)).tolist() == [False, True, False]
    assert (~(a > 1)).tolist() == [True, False, False]
    m = kiln.tensor([[1.0, 2.0], [3.0, 4.0]])
    assert (m @ m).tolist() == [[7.0, 10.0], [15.0, 22.0]]
    assert (-m).tolist() == [[-1.0, -2.0], [-3.0, -4.0]]
    assert abs(kiln.tensor([-2.0])).tolist() == [2.0]
    assert (kiln.tensor([7, -7]) % 3).tolist() == [1, 2]  # Python's sign rule


def test_inplace_operators():
    t = kiln.ones(3)
    ptr = t.data_ptr()
    t += 1
    t *= kiln.tensor([1.0, 2.0, 3.0])
    t -= 0.5
    t /= 2
    assert t.data_ptr() == ptr
    assert t.tolist() == [0.75, 1.75, 2.75]


def test_reductions_and_methods():
    a = np.arange(12, dtype=np.float64).reshape(3, 4)
    t = kiln.tensor(a)
    assert t.sum().item() == a.sum()
    np.testing.assert_allclose(t.sum(dim=1).numpy(), a.sum(1))
    np.testing.assert_allclose(t.mean((0, 1), keepdim=True).numpy(), a.mean(keepdims=True))
    np.testing.assert_allclose(t.var(dim=0).numpy(), a.var(0, ddof=1))
    np.testing.assert_allclose(t.std(dim=0, correction=0).numpy(), a.std(0))
    values, indices = t.max(dim=1)
    assert values.tolist() == [3.0, 7.0, 11.0] and indices.tolist() == [3, 3, 3]
    assert t.max().item() == 11.0 and t.argmin().item() == 0
    np.testing.assert_allclose(t.norm().item(), np.linalg.norm(a))
    np.testing.assert_allclose(t.exp().log().numpy(), a, atol=1e-12)
    assert t.relu().clamp(2, 5).tolist()[0] == [2.0, 2.0, 2.0, 3.0]
    v, i = kiln.tensor([3.0, 1.0, 2.0]).sort()
    assert v.tolist() == [1.0, 2.0, 3.0] and i.tolist() == [1, 2, 0]
    assert kiln.cat([t, t], 0).shape == (6, 4) and kiln.stack([t, t], 1).shape == (3, 2, 4)
    assert [c.shape for c in t.chunk(2, 1)] == [(3, 2), (3, 2)]
    assert kiln.einsum("ij,kj->ik", t, t).shape == (3, 3)
    assert kiln.where(t > 5, t, 0.0).sum().item() == sum(x for x in range(12) if x > 5)


def test_conversions():
    t = kiln.tensor([1.7, -2.2])
    assert t.to(kiln.int64).tolist() == [1, -2]
    assert t.double().dtype == kiln.float64 and t.half().dtype == kiln.float16
    assert t.to("float64").dtype == kiln.float64
    assert t.to("cpu") is not None
    assert t.to(dtype=kiln.bfloat16).float().tolist() == [1.703125, -2.203125]
    assert kiln.promote_types(kiln.int64, "float16") == kiln.float16
    with pytest.raises(ValueError, match="unknown dtype"):
        t.to("float8")


def test_functional_ops():
    F = kiln.nn.functional
    x = kiln.randn(2, 3, 8, 8)
    w = kiln.randn(4, 3, 3, 3)
    assert F.conv2d(x, w, padding=1).shape == (2, 4, 8, 8)
    assert F.conv2d(x, w, padding="same", dilation=2).shape == (2, 4, 8, 8)
    assert F.conv2d(x, w, stride=(2, 1)).shape == (2, 4, 3, 6)
    out, idx = F.max_pool2d(x, 2, return_indices=True)
    assert out.shape == (2, 3, 4, 4) and idx.dtype == kiln.int64
    assert F.max_unpool2d(out, idx, 2).shape == x.shape
    assert F.avg_pool2d(x, 3, stride=2, padding=1).shape == (2, 3, 4, 4)
    assert F.layer_norm(x, (8,)).shape == x.shape
    logits = kiln.randn(5, 10)
    target = kiln.tensor([1, 0, 9, 3, 3])
    ce = F.cross_entropy(logits, target)
    lp = F.log_softmax(logits, 1).numpy()
    np.testing.assert_allclose(ce.item(), -lp[np.arange(5), target.numpy()].mean(), rtol=1e-5)
    q = kiln.randn(2, 4, 6, 8)
    causal = F.scaled_dot_product_attention(q, q, q, is_causal=True)
    keep = kiln.tensor(np.tril(np.ones((6, 6), dtype=bool)))
    masked = F.scaled_dot_product_attention(q, q, q, attn_mask=keep)
    np.testing.assert_allclose(causal.numpy(), masked.numpy(), atol=1e-6)
    with pytest.raises(ValueError, match="reduction"):
        F.mse_loss(logits, logits, reduction="avg")


def test_docstrings_come_from_the_headers():
    assert "Running sum" in kiln.cumsum.__doc__  # engine/ops.h's comment
    assert "stride = kernel" in kiln.nn.functional.max_pool2d.__doc__  # engine/nn_ops.h's
    assert "half to even" in kiln.round.__doc__  # a group comment that names it


def test_docstrings_name_docs_that_exist():
    # kiln.save_checkpoint's named docs/checkpoint.md, which never existed (docs/checkpoint-format.md)
    import os
    import re

    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    named = {}
    for name in dir(kiln):
        doc = getattr(getattr(kiln, name), "__doc__", None)
        if isinstance(doc, str):
            for path in re.findall(r"docs/[\w./-]+\.md", doc):
                named.setdefault(path, []).append(name)
    assert "docs/checkpoint-format.md" in named  # save_checkpoint's, so the check has something to check
    missing = {p: n for p, n in named.items() if not os.path.isfile(os.path.join(root, p))}
    assert not missing, missing


def test_attention_options_and_random():
    F = kiln.nn.functional
    q = kiln.randn(1, 2, 5, 4)
    out, w = F.attention(q, q, q, causal="top_left", need_weights=True)
    assert out.shape == (1, 2, 5, 4) and w.shape == (1, 2, 5, 5)
    assert w[0, 0, 0, 1:].sum().item() == 0.0  # nothing after the first position
    np.testing.assert_allclose(out.numpy(), F.scaled_dot_product_attention(q, q, q, is_causal=True).numpy(), atol=1e-6)
    s = F.masked_softmax(kiln.zeros(2, 3), kiln.tensor([0.0, float("-inf"), 0.0]))
    assert s.tolist() == [[0.5, 0.0, 0.5]] * 2
    with pytest.raises(ValueError, match="causal"):
        F.attention(q, q, q, causal="upper")
    u = kiln.uniform(2.0, 3.0, (1000,))
    assert 2.0 <= u.min().item() and u.max().item() < 3.0
    assert kiln.sum_to(kiln.ones(4, 3), (1, 3)).tolist() == [[4.0, 4.0, 4.0]]


def test_small_integer_dtypes_match_torch():
    torch = pytest.importorskip("torch")
    a, b = [100, -128, 127, 5, -7], [100, -1, 1, -3, 2]
    for name in ("int8", "int16", "uint8", "int32"):
        kd, td = getattr(kiln, name), getattr(torch, name)
        ka, kb = kiln.tensor(a).to(kd), kiln.tensor(b).to(kd)
        ta, tb = torch.tensor(a).to(td), torch.tensor(b).to(td)
        assert ka.tolist() == ta.tolist(), name  # i64 -> small: the low bits
        for op in ("__add__", "__sub__", "__mul__", "__lt__", "__eq__"):
            assert getattr(ka, op)(kb).tolist() == getattr(ta, op)(tb).tolist(), (name, op)
        assert (ka + 300).tolist() == (ta + 300).tolist(), name  # a whole scalar wraps in the dtype
        assert kiln.sum(ka).dtype == kiln.int64 and kiln.sum(ka).item() == torch.sum(ta).item(), name
    # floats into integers: x86-64's truncation (to i32, or i64; outside it or NaN its minimum), then the low bits
    f = [-1.0, 300.0, 127.9, -128.5, 2.99, -2.99, 40000.0, 3e9, -3e9, 5e19, float("inf"), float("-inf"), float("nan")]
    for name in ("int8", "int16", "uint8", "int32", "int64"):
        got = kiln.tensor(f).to(getattr(kiln, name)).tolist()
        assert got == torch.tensor(f).to(getattr(torch, name)).tolist(), name
    mixed = kiln.tensor([-1, 100]).to(kiln.int8) + kiln.tensor([255, 200]).to(kiln.uint8)
    assert mixed.dtype == kiln.int16 and mixed.tolist() == [254, 300]
    assert torch.promote_types(torch.int8, torch.uint8) == torch.int16
    assert kiln.promote_types(kiln.int8, kiln.uint8) == kiln.int16
    assert kiln.tensor([3]).char().dtype == kiln.int8 and kiln.tensor([3]).short().dtype == kiln.int16


def test_ctc_loss_matches_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    T, N, C = 30, 4, 6
    logits = rng.standard_normal((T, N, C))
    targets = rng.integers(1, C, size=(N, 8))
    targets[1, :3] = 2  # a repeated label
    in_lens, tgt_lens = [30, 25, 17, 30], [8, 5, 0, 14 // 2]
    for reduction in ("mean", "sum", "none"):
        k = kiln.tensor(logits, requires_grad=True)
        kl = kiln.nn.functional.ctc_loss(kiln.nn.functional.log_softmax(k, -1), kiln.tensor(targets), in_lens,
                                         tgt_lens, reduction=reduction)
        t = torch.tensor(logits, requires_grad=True)
        tl = torch.nn.functional.ctc_loss(torch.log_softmax(t, -1), torch.tensor(targets), in_lens, tgt_lens,
                                          reduction=reduction)
        assert np.allclose(np.asarray(kl.detach().tolist()), tl.detach().numpy(), rtol=1e-10, atol=1e-10), reduction
        kl.sum().backward()
        tl.sum().backward()
        assert np.allclose(k.grad.numpy(), t.grad.numpy(), rtol=1e-9, atol=1e-10), reduction
    # lengths as tensors; a target too long for its frames: inf, or 0 with zero_infinity
    lp = kiln.nn.functional.log_softmax(kiln.tensor(logits[:3]), -1)
    long_t = kiln.tensor([[1, 2, 3, 4]] * N)
    lens = kiln.tensor([3] * N)
    assert all(v == float("inf") for v in kiln.nn.functional.ctc_loss(lp, long_t, lens, [4] * N,
                                                                       reduction="none").tolist())
    assert kiln.nn.functional.ctc_loss(lp, long_t, lens, [4] * N, zero_infinity=True).item() == 0.0
    with pytest.raises(kiln.KilnError, match="blank"):
        kiln.nn.functional.ctc_loss(lp, kiln.tensor([[0, 1]] * N), [3] * N, [2] * N)


def test_max_pool3d_indices_and_unpool_match_torch():
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(5).standard_normal((2, 3, 5, 6, 7))
    x[0, 0, 1, 2, 3] = x[0, 0, 2, 2, 3] = 9.0  # a tie across slices: the first in (d, h, w) order wins
    kv, ki = kiln.nn.functional.max_pool3d(kiln.tensor(x), (2, 3, 2), (2, 2, 2), (1, 1, 0), (1, 1, 2), True,
                                           return_indices=True)
    tv, ti = torch.nn.functional.max_pool3d(torch.tensor(x), (2, 3, 2), (2, 2, 2), (1, 1, 0), (1, 1, 2), True,
                                            return_indices=True)
    assert np.array_equal(kv.numpy(), tv.numpy()) and np.array_equal(ki.numpy(), ti.numpy())
    ku = kiln.nn.functional.max_unpool3d(kv, ki, (2, 3, 2), (2, 2, 2), (1, 1, 0), output_size=(5, 6, 7))
    tu = torch.nn.functional.max_unpool3d(tv, ti, (2, 3, 2), (2, 2, 2), (1, 1, 0), output_size=(5, 6, 7))
    assert np.array_equal(ku.numpy(), tu.numpy())


def test_integer_index_assignment_and_ctc_without_frames():
    torch = pytest.importorskip("torch")
    t = kiln.tensor([1, 2, 3, 4]).to(kiln.int16)
    t[kiln.tensor([0, 2])] = 7
    assert t.dtype == kiln.int16 and t.tolist() == [7, 2, 7, 4]
    u = kiln.tensor([1, 2, 3]).to(kiln.uint8)
    u[1] = 255
    assert u.tolist() == [1, 255, 3]
    with pytest.raises(kiln.KilnError, match="i64"):
        kiln.scatter(kiln.tensor([1, 2]), 0, kiln.tensor([0]), kiln.tensor([5]))
    with pytest.raises(kiln.KilnError, match="alpha"):
        kiln.add(kiln.tensor([1]).to(kiln.int8), kiln.tensor([1]).to(kiln.int8), alpha=1000)
    # sequences with no frames: log P is 0 for an empty target and -inf for any other, as torch
    lp = np.log(np.full((4, 3, 5), 0.2))
    kl = kiln.nn.functional.ctc_loss(kiln.tensor(lp), kiln.tensor([[1, 2], [1, 2], [3, 3]]), [0, 0, 4], [0, 2, 2],
                                     reduction="none").tolist()
    tl = torch.nn.functional.ctc_loss(torch.tensor(lp), torch.tensor([[1, 2], [1, 2], [3, 3]]), [0, 0, 4], [0, 2, 2],
                                      reduction="none").tolist()
    assert np.allclose(kl, tl, rtol=1e-12) and kl[0] == 0.0 and kl[1] == float("inf")


def test_set_flush_denormal():
    x = kiln.from_numpy(np.array([1e-39, 2.0], np.float32))
    try:
        assert kiln.set_flush_denormal(False) is True
        assert (x * 1.0).tolist()[0] > 0  # kept
        assert abs(kiln.log(x).tolist()[0] - np.log(np.float64(np.float32(1e-39)))) < 1e-4
        kiln.set_flush_denormal(True)
        assert (x * 1.0).tolist() == [0.0, 2.0]  # flushed (the default)
    finally:
        kiln.set_flush_denormal(True)
