# Indexing and in-place writes compared with PyTorch: 0-dim bool and integer tensors as indices,
# assignment into int64 tensors, values with leading size-1 dims, empty indices, `in`, the refusal of
# an in-place write that would drop a gradient, and the small in-place methods.
import numpy as np
import pytest

import kiln

torch = pytest.importorskip("torch")


def k_and_t(a):
    return kiln.tensor(a), torch.tensor(a)


def same(k, t):
    assert tuple(k.shape) == tuple(t.shape)
    assert k.tolist() == t.tolist()


# ---- an in-place write of a value that requires grad is refused (it would lose the gradient) ----

def test_setitem_of_a_value_that_requires_grad_is_refused():
    w = kiln.tensor([2.0], requires_grad=True)
    z = kiln.zeros(3)
    with pytest.raises(kiln.KilnError, match="requires grad") as e:
        z[1:2] = w * 3
    assert "no_grad" in str(e.value) and "kiln.where" in str(e.value) and ".cpp" not in str(e.value)
    with pytest.raises(kiln.KilnError, match="requires grad"):
        z[kiln.tensor([1])] = w * 3
    with pytest.raises(kiln.KilnError, match="requires grad"):
        z[kiln.tensor([False, True, False])] = w
    assert z.tolist() == [0.0, 0.0, 0.0]  # nothing written
    with kiln.no_grad():  # the gradient is not wanted: allowed
        z[1:2] = w * 3
    assert z.tolist() == [0.0, 6.0, 0.0]
    z[0] = w.detach()
    z[2] = 5.0
    assert z.tolist() == [2.0, 6.0, 5.0]


@pytest.mark.parametrize("op", ["add_", "mul_", "copy_", "iadd", "isub", "imul", "itruediv", "sub_", "div_"])
def test_inplace_op_with_an_operand_that_requires_grad_is_refused(op):
    w = kiln.tensor([2.0, 2.0, 2.0], requires_grad=True)
    z = kiln.ones(3)

    def run(z, w):
        if op.startswith("i"):
            {"iadd": z.__iadd__, "isub": z.__isub__, "imul": z.__imul__, "itruediv": z.__itruediv__}[op](w)
        else:
            getattr(z, op)(w)

    with pytest.raises(kiln.KilnError, match="requires grad"):
        run(z, w * 3)
    assert z.tolist() == [1.0, 1.0, 1.0]
    with kiln.no_grad():
        run(z, w)
    run(z, w.detach())  # fine: nothing to lose


def test_out_of_place_alternative_gives_torch_gradient():
    # what the error suggests: the same computation out of place has torch's gradient (37)
    w = kiln.tensor([2.0], requires_grad=True)
    w2 = kiln.tensor([1.0], requires_grad=True)
    z = kiln.cat([kiln.zeros(1), w * 3, kiln.zeros(1)])
    ((z * z).sum() + (w2 * w).sum()).backward()
    tw = torch.tensor([2.0], requires_grad=True)
    tw2 = torch.tensor([1.0], requires_grad=True)
    tz = torch.zeros(3)
    tz[1:2] = tw * 3
    ((tz * tz).sum() + (tw2 * tw).sum()).backward()
    assert w.grad.tolist() == tw.grad.tolist() == [37.0]


# ---- a 0-dim bool tensor acts as True / False ----

def test_zero_dim_bool_tensor_index_adds_a_dim():
    x = kiln.arange(6).float().reshape(2, 3)
    tx = torch.arange(6).float().reshape(2, 3)
    for b in (True, False):
        same(x[kiln.tensor(b)], tx[torch.tensor(b)])
        same(x[0, kiln.tensor(b)], tx[0, torch.tensor(b)])
        same(x[kiln.tensor(b), 1], tx[torch.tensor(b), 1])
        same(x[..., kiln.tensor(b)], tx[..., torch.tensor(b)])
        # with a tensor index, the bool is an index of shape [1] (True) or [0] (False) broadcast with it
        for kkey, tkey in (((kiln.tensor(b), kiln.tensor([1, 0])), (torch.tensor(b), torch.tensor([1, 0]))),
                           ((b, kiln.tensor([1, 0])), (b, torch.tensor([1, 0]))),
                           ((kiln.tensor([1]), b), (torch.tensor([1]), b)),
                           ((kiln.tensor([1, 0]), None, b), (torch.tensor([1, 0]), None, b))):
            try:
                want = tx[tkey]
            except IndexError as e:
                with pytest.raises(IndexError) as ke:
                    x[kkey]
                assert str(ke.value) == str(e)
            else:
                same(x[kkey], want)


def test_zero_dim_bool_tensor_index_gradient_and_assignment():
    x = kiln.arange(6).float().reshape(2, 3).requires_grad_(True)
    tx = torch.arange(6).float().reshape(2, 3).requires_grad_(True)
    (x[kiln.tensor(True)] * kiln.arange(6).float().reshape(1, 2, 3)).sum().backward()
    (tx[torch.tensor(True)] * torch.arange(6).float().reshape(1, 2, 3)).sum().backward()
    same(x.grad, tx.grad)
    y, ty = kiln.zeros(2, 3), torch.zeros(2, 3)
    y[kiln.tensor(True)] = 9.0
    ty[torch.tensor(True)] = 9.0
    same(y, ty)
    y[kiln.tensor(False)] = 1.0
    ty[torch.tensor(False)] = 1.0
    same(y, ty)
    y[0, kiln.tensor(True)] = kiln.tensor([1.0, 2.0, 3.0])
    ty[0, torch.tensor(True)] = torch.tensor([1.0, 2.0, 3.0])
    same(y, ty)


# ---- a 0-dim integer tensor acts as an int: a view ----

def test_zero_dim_int_tensor_index_is_a_view():
    buf, tbuf = kiln.zeros(3, 2), torch.zeros(3, 2)
    for i, ti in zip(kiln.tensor([0, 2]), torch.tensor([0, 2])):
        buf[i].copy_(kiln.ones(2))
        tbuf[ti].copy_(torch.ones(2))
    same(buf, tbuf)
    x = kiln.arange(6).reshape(2, 3)
    tx = torch.arange(6).reshape(2, 3)
    for dt in (kiln.int64, kiln.int32):
        same(x[kiln.tensor(1).to(dt)], tx[torch.tensor(1)])
        same(x[:, kiln.tensor(-1).to(dt)], tx[:, torch.tensor(-1)])
    assert x[kiln.tensor(1)].data_ptr() == x[1].data_ptr()
    with pytest.raises(IndexError):
        x[kiln.tensor(2)]


# ---- assignment by mask or index tensor into int64 ----

def test_int64_assignment_by_mask_and_index():
    x, tx = k_and_t([[3, 9, 12], [15, 1, 8]])
    x[x > 8] = 0
    tx[tx > 8] = 0
    same(x, tx)
    x[[1]] = 1
    tx[[1]] = 1
    same(x, tx)
    idx = kiln.tensor([0, 2])
    x[:, idx] += 1
    tx[:, torch.tensor([0, 2])] += 1
    same(x, tx)
    # exact beyond 2**53
    big = 2 ** 62 + 1
    y, ty = k_and_t([0, 0, 0])
    y[kiln.tensor([2, 0])] = kiln.tensor([big, -big])
    ty[torch.tensor([2, 0])] = torch.tensor([big, -big])
    same(y, ty)
    assert y.tolist() == [-big, 0, big]
    y[y > 0] = big + 2
    assert y.tolist() == [-big, 0, big + 2]


def test_int64_index_put_accumulate_is_exact():
    big = 2 ** 60 + 3
    x, tx = k_and_t([1, big, 5, 7])
    idx = [2, 1, 2, 1, 1]
    v = [big, 1, -3, 2 ** 55 + 1, 7]
    got = kiln.index_put(x, [kiln.tensor(idx)], kiln.tensor(v), True)
    want = tx.index_put((torch.tensor(idx),), torch.tensor(v), accumulate=True)
    same(got, want)
    got = kiln.index_put(x, [kiln.tensor(idx)], kiln.tensor(v), False)
    assert got.tolist()[0] == 1 and got.tolist()[3] == 7
    assert got.tolist()[1] == 7 and got.tolist()[2] == -3  # the last write (torch leaves duplicates undefined)
    # rows of a 2-D int64 tensor, and int32 (unchanged path)
    a, ta = k_and_t([[1, 2], [3, 4], [5, 6]])
    got = kiln.index_put(a, [kiln.tensor([0, 2, 0])], kiln.tensor([[2 ** 53 + 1, 1]]), True)
    same(got, ta.index_put((torch.tensor([0, 2, 0]),), torch.tensor([[2 ** 53 + 1, 1]]), accumulate=True))
    b = kiln.tensor([1, 2, 3], dtype=kiln.int32)
    b[kiln.tensor([0, 0])] = 5
    assert b.tolist() == [5, 2, 3]
    e = kiln.index_put(x, [kiln.tensor([], dtype=kiln.int64)], kiln.tensor([], dtype=kiln.int64), True)
    same(e, tx)


# ---- values with leading size-1 dims ----

def test_assignment_drops_leading_size_one_dims():
    x, tx = kiln.zeros(3, 4), torch.zeros(3, 4)
    x[1:] = kiln.ones(1, 1, 4)
    tx[1:] = torch.ones(1, 1, 4)
    same(x, tx)
    t = kiln.arange(4).float()
    x[0] = t[None]
    tx[0] = torch.arange(4).float()[None]
    same(x, tx)
    x[kiln.tensor([0, 2])] = kiln.full((1, 1, 4), 7.0)
    tx[torch.tensor([0, 2])] = torch.full((1, 1, 4), 7.0)
    same(x, tx)
    x[x > 6] = kiln.full((1, 1), 2.0)
    tx[tx > 6] = torch.full((1, 1), 2.0)
    same(x, tx)
    with pytest.raises(kiln.KilnError):
        x[0] = kiln.ones(2, 4)  # only leading ones go, as torch


# ---- empty indices ----

def test_empty_list_and_array_index():
    x, tx = kiln.arange(6).float().reshape(2, 3), torch.arange(6).float().reshape(2, 3)
    same(x[[]], tx[[]])
    same(x[np.array([])], tx[torch.tensor(np.array([])).long()])
    same(x[:, []], tx[:, []])
    x[[]] = 1.0
    tx[[]] = 1.0
    same(x, tx)
    with pytest.raises(IndexError):
        x[kiln.tensor([1.0])]  # a float tensor is still refused
    with pytest.raises(IndexError):
        x[[1.0]]


# ---- `in` ----

def test_contains():
    x, tx = k_and_t([[1.0, 2.0], [5.0, 3.0]])
    for v in (5.0, 4.0, 1, True):
        assert (v in x) == (v in tx)
    assert (kiln.tensor(3.0) in x) and (kiln.tensor(9.0) not in x)
    assert np.float32(5.0) in x and np.int64(4) not in x
    with pytest.raises(TypeError):
        "a" in x


# ---- item() on many elements, in-place methods, small helpers ----

def test_item_on_many_elements_says_why_without_a_source_path():
    x = kiln.zeros(2, 2)
    for f in (lambda: x.item(), lambda: float(x), lambda: int(x)):
        with pytest.raises(ValueError) as e:
            f()
        assert "4 elements" in str(e.value) and ".cpp" not in str(e.value)


def test_small_inplace_methods_match_torch():
    a = [[1.5, -2.0], [3.0, -4.5]]
    for name, args in [("sub_", (1.0,)), ("div_", (2.0,)), ("neg_", ()), ("clamp_", (-1.0, 2.0)),
                       ("clip_", (None, 0.0)), ("masked_fill_", None)]:
        k, t = k_and_t(a)
        if name == "masked_fill_":
            rk = k.masked_fill_(k > 0, 9.0)
            rt = t.masked_fill_(t > 0, 9.0)
        else:
            rk = getattr(k, name)(*args)
            rt = getattr(t, name)(*args)
        assert rk is k
        same(k, t)
        same(rk, rt)
    k, t = k_and_t(a)
    k.sub_(kiln.tensor([1.0, 2.0]), alpha=2)
    t.sub_(torch.tensor([1.0, 2.0]), alpha=2)
    same(k, t)
    p = kiln.tensor([1.0], requires_grad=True)
    for f in (lambda: p.neg_(), lambda: p.clamp_(0.0, 1.0), lambda: p.masked_fill_(p > 0, 1.0)):
        with pytest.raises(kiln.KilnError, match="requires grad"):
            f()
    with kiln.no_grad():
        p.clamp_(0.0, 0.5)
    assert p.tolist() == [0.5]


def test_view_helpers_match_torch():
    k = kiln.arange(24).reshape(2, 3, 4)
    t = torch.arange(24).reshape(2, 3, 4)
    same(k.mT, t.mT)
    same(k.view_as(kiln.zeros(6, 4)), t.view_as(torch.zeros(6, 4)))
    same(kiln.ones(3, 1).expand_as(kiln.zeros(3, 5)), torch.ones(3, 1).expand_as(torch.zeros(3, 5)))
    z = k.new_zeros(2, 3)
    assert z.dtype == kiln.int64 and z.tolist() == [[0] * 3] * 2
    o = k.float().new_ones((2,), dtype=kiln.float64)
    assert o.dtype == kiln.float64 and o.tolist() == [1.0, 1.0]
