# Indexing and in-place writes compared with PyTorch: 0-dim bool and integer tensors as indices,
# assignment into int64 tensors, values with leading size-1 dims, empty indices, `in`, the refusal of
# an in-place write that would drop a gradient, and the small in-place methods.
import warnings
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
    same(x[[1.0]], tx[[1.0]])  # index data that is not a tensor: int64, as torch's


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


# ---- diagonal: a view sharing the input's memory, as torch's ----

def test_diagonal_writes_reach_the_input():
    # the tester's cases: covariance jitter, assignment and fill through the diagonal
    for lib in (kiln, torch):
        c = lib.zeros(3, 3)
        c.diagonal().add_(1e-3)
        d = lib.zeros(2, 2)
        d.diagonal()[:] = 5.0
        e = lib.zeros(2, 3)
        e.diagonal(dim1=0, dim2=1).fill_(7.0)
        f = lib.zeros(3, 4)
        lib.diagonal(f, -1).copy_(lib.tensor([1.0, 2.0]))
        if lib is kiln:
            got = [c.tolist(), d.tolist(), e.tolist(), f.tolist()]
        else:
            assert got == [c.tolist(), d.tolist(), e.tolist(), f.tolist()]
    assert got[0][1][1] == pytest.approx(1e-3) and got[1] == [[5.0, 0.0], [0.0, 5.0]]


@pytest.mark.parametrize("shape,offset,dim1,dim2", [
    ((3, 3), 0, 0, 1), ((3, 3), 1, 0, 1), ((3, 3), -2, 0, 1), ((2, 4), 1, 0, 1), ((4, 2), -1, 1, 0),
    ((2, 3, 4), 1, 1, 2), ((2, 3, 4), -2, 0, 2), ((4, 3, 5), 2, -1, 0), ((3, 3), 3, 0, 1), ((3, 3), -5, 0, 1),
    ((0, 3), 0, 0, 1), ((2, 3, 4), 0, 2, 1)])
def test_diagonal_is_a_view_with_torch_values_strides_and_gradient(shape, offset, dim1, dim2):
    a = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    k, t = kiln.tensor(a), torch.tensor(a)
    kd, td = k.diagonal(offset, dim1, dim2), t.diagonal(offset, dim1, dim2)
    same(kd, td)
    if td.numel():
        assert tuple(kd.stride()) == tuple(td.stride())
        assert kd.data_ptr() - k.data_ptr() == td.data_ptr() - t.data_ptr()
    # of a non-contiguous input (a transpose) too
    same(k.transpose(0, -1).diagonal(offset, dim1, dim2), t.transpose(0, -1).diagonal(offset, dim1, dim2))
    kd.mul_(-1.0)
    td.mul_(-1.0)
    same(k, t)
    k.diagonal(offset, dim1, dim2)[...] = 9.0
    t.diagonal(offset, dim1, dim2)[...] = 9.0
    same(k, t)
    # the gradient lands on the diagonal
    g = np.random.default_rng(0).standard_normal(tuple(td.shape)).astype(np.float32)
    kx = kiln.tensor(a).requires_grad_(True)
    tx = torch.tensor(a).requires_grad_(True)
    (kiln.diagonal(kx, offset, dim1, dim2) * kiln.tensor(g)).sum().backward()
    (torch.diagonal(tx, offset, dim1, dim2) * torch.tensor(g)).sum().backward()
    same(kx.grad, tx.grad)
    # through a non-leaf, and used twice
    kx.grad = None
    tx.grad = None
    h, th = kx * 2, tx * 2
    (h.diagonal(offset, dim1, dim2) ** 2).sum().backward()
    (th.diagonal(offset, dim1, dim2) ** 2).sum().backward()
    assert np.allclose(kx.grad.numpy(), tx.grad.numpy())


def test_diagonal_errors_as_torch():
    for lib in (kiln, torch):
        with pytest.raises(RuntimeError, match="cannot be identical"):
            lib.zeros(2, 2).diagonal(0, 1, 1)
        with pytest.raises((IndexError, RuntimeError)):
            lib.zeros(2, 2).diagonal(0, 0, 2)
        with pytest.raises((IndexError, RuntimeError)):
            lib.zeros(3).diagonal()


# ---- v.data = t on a view: torch rebinds v, the base is untouched ----

def test_data_assignment_on_a_view_rebinds_it_as_torch():
    out = {}
    for lib in (kiln, torch):
        base = lib.zeros(2, 3)
        v = base[1]  # a contiguous view
        v.data = lib.ones(3)
        base2 = lib.zeros(2, 4)
        w = base2[:, 1:3]  # a non-contiguous one
        w.data = lib.ones(2, 2)
        t = lib.full((3,), 2.0)
        ub = lib.zeros(2, 3)
        u = ub[0]
        u.data = t
        t.add_(1.0)  # u now holds t's memory
        base3 = lib.zeros(3)
        tail = base3[1:]
        base3.data = lib.ones(3)  # the base rebound: its view keeps the old memory
        m = lib.arange(4.0).reshape(2, 2)
        keep = m[0]
        m.data = m.data.t()  # value is an alias of m's memory
        out[lib.__name__] = [base.tolist(), v.tolist(), base2.tolist(), w.tolist(), u.tolist(), ub.tolist(),
                             base3.tolist(), tail.tolist(), m.tolist(), keep.tolist()]
    assert out["kiln"] == out["torch"]
    assert out["kiln"][0] == [[0.0] * 3] * 2 and out["kiln"][4] == [3.0] * 3


def test_data_assignment_on_a_data_alias_leaves_the_tensor_alone_as_torch():
    out = {}
    for lib in (kiln, torch):
        p = lib.zeros(3)
        d = p.data
        d.data = lib.ones(3)  # d rebound: p keeps its memory and values
        w = lib.nn.Linear(2, 2).weight
        w0 = w.tolist()
        dw = w.data
        dw.data = lib.full((2, 2), 7.0)
        e = p.data.data  # an alias of an alias
        e.data = lib.full((3,), 5.0)
        out[lib.__name__] = [p.tolist(), d.tolist(), w.tolist() == w0, dw.tolist(), e.tolist()]
    assert out["kiln"] == out["torch"]
    assert out["kiln"][0] == [0.0] * 3


def test_data_assignment_of_another_shape_rebinds_as_torch():
    out = {}
    for lib in (kiln, torch):
        base = lib.zeros(2, 5)
        v = base[1]
        v.data = lib.ones(5)  # a shared view, same shape
        v.data = lib.ones(2, 3)  # another shape: rebound
        x = lib.zeros(3)
        x.data = lib.arange(6.0).reshape(2, 3)  # a tensor alone, another shape and
        y = lib.zeros(3)
        y.data = lib.tensor([1, 2], dtype=lib.int64)  # dtype
        out[lib.__name__] = [base.tolist(), v.tolist(), list(v.shape), x.tolist(), y.tolist(), y.dtype.is_floating_point]
    assert out["kiln"] == out["torch"]
    with pytest.raises(ValueError, match=r"\[3\] float32 .*\[2, 2\] float32 parameter.*make a new Parameter"):
        kiln.nn.Linear(2, 2).weight.data = kiln.zeros(3)


def test_data_assignment_of_a_tensor_alone_still_copies_in():
    # nothing else holds the memory: the values are copied in (the handle an optimizer holds sees them)
    x = kiln.zeros(3)
    p0 = x.data_ptr()
    x.data = kiln.ones(3)
    assert x.tolist() == [1.0] * 3 and x.data_ptr() == p0
    t = kiln.tensor([[1.0, 2.0], [3.0, 4.0]])
    t.data = t.data.T
    assert t.tolist() == [[1.0, 3.0], [2.0, 4.0]]


# ---- a list index holding sequences, tensors, slices, None or ... is a tuple, as torch's ----

def _list_keys(lib):
    return [
        [[0, 2], [1, 0]], [lib.tensor([0, 2]), lib.tensor([1, 3])], [slice(None), 0], [None, 0], [Ellipsis, 1],
        [0, [1, 2]], [[True, False, True]], [slice(0, 2), [1, 1, 3]], [lib.tensor(1), slice(None), 0]]


@pytest.mark.parametrize("i", range(9))
def test_list_holding_sequences_or_slices_is_a_tuple_index(i):
    a = np.arange(24, dtype=np.float32).reshape(3, 4, 2)
    kkey, tkey = _list_keys(kiln)[i], _list_keys(torch)[i]
    k, t = kiln.tensor(a), torch.tensor(a)
    with pytest.warns(UserWarning, match="non-tuple sequence"):
        kr = k[kkey]
    with pytest.warns(UserWarning):
        tr = t[tkey]
    same(kr, tr)
    # writing
    with pytest.warns(UserWarning, match="non-tuple sequence"):
        k[kkey] = -1.0
    with pytest.warns(UserWarning):
        t[tkey] = -1.0
    same(k, t)
    # the gradient
    kx = kiln.tensor(a).requires_grad_(True)
    tx = torch.tensor(a).requires_grad_(True)
    with pytest.warns(UserWarning):
        (kx[kkey] * 3.0).sum().backward()
    with pytest.warns(UserWarning):
        (tx[tkey] * 3.0).sum().backward()
    same(kx.grad, tx.grad)


def test_list_of_plain_ints_or_bools_stays_one_index():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    k, t = kiln.tensor(a), torch.tensor(a)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for key in ([0, 2, 2], [True, False, True], [-1], [[0, 1]][0]):
            same(k[key], t[key])
        same(k[(0, [1, 3])], t[(0, [1, 3])])


# ---- index tensor dtypes and a second Ellipsis, as torch ----

def test_uint8_index_tensor_is_a_mask_with_a_warning():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    k, t = kiln.tensor(a), torch.tensor(a)
    m = [1, 0, 2]  # nonzero is true
    with pytest.warns(UserWarning, match="uint8"):
        kr = k[kiln.tensor(m).to(kiln.uint8)]
    with pytest.warns(UserWarning):
        tr = t[torch.tensor(m, dtype=torch.uint8)]
    same(kr, tr)
    # (torch's x[u8 mask] = number fails in masked_fill_; a tensor value is written as by a bool mask)
    with pytest.warns(UserWarning, match="uint8"):
        k[:, kiln.tensor([0, 1, 1, 0]).to(kiln.uint8)] = kiln.zeros(3, 2)
    with pytest.warns(UserWarning):
        t[:, torch.tensor([0, 1, 1, 0], dtype=torch.uint8)] = torch.zeros(3, 2)
    same(k, t)
    with pytest.warns(UserWarning, match="uint8"):
        k[kiln.tensor([0, 3, 1]).to(kiln.uint8)] = -1.0
    t[torch.tensor([False, True, True])] = -1.0
    same(k, t)
    # a 0-dim uint8 tensor: a 0-dim mask (a new dim of size 1 or 0), not an int, as torch's
    for v in (0, 2):
        same(k[kiln.tensor(v).to(kiln.uint8)], t[torch.tensor(v, dtype=torch.uint8)])
    same(k[kiln.tensor(2).to(kiln.uint8), kiln.tensor([0, 1])], t[torch.tensor(2, dtype=torch.uint8), torch.tensor([0, 1])])


@pytest.mark.parametrize("dt", ["int8", "int16"])
def test_int8_and_int16_index_tensors_are_refused(dt):
    k, t = kiln.arange(4.0), torch.arange(4.0)
    with pytest.raises(IndexError, match="long, int, byte or bool"):
        t[torch.tensor([1, 0]).to(getattr(torch, dt))]
    with pytest.raises(IndexError, match="long, int, byte or bool"):
        k[kiln.tensor([1, 0]).to(getattr(kiln, dt))]
    with pytest.raises(IndexError, match="long, int, byte or bool"):
        k[kiln.tensor([1, 0]).to(getattr(kiln, dt))] = 1.0
    # a 0-dim one is an int, as torch's
    same(k[kiln.tensor(2).to(getattr(kiln, dt))], t[torch.tensor(2).to(getattr(torch, dt))])


@pytest.mark.parametrize("dt", ["int8", "int16", "int32", "uint16", "float64"])
def test_non_tensor_index_data_of_any_dtype_is_int64_as_torch(dt):
    # torch converts index data that is not a tensor to int64 (bool and uint8 data stay a mask)
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    k, t = kiln.tensor(a), torch.tensor(a)
    i = np.array([2, 0, 1], dtype=dt)
    same(k[i], t[i])
    same(k[:, i], t[:, i])
    with pytest.warns(UserWarning, match="non-tuple sequence"):
        kr = k[[i]]
    with pytest.warns(UserWarning):
        tr = t[[i]]
    same(kr, tr)
    k[i[:2]] = -1.0
    t[i[:2]] = -1.0
    same(k, t)
    kx, tx = kiln.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)
    (kx[i] * 2.0).sum().backward()
    (tx[i] * 2.0).sum().backward()
    same(kx.grad, tx.grad)


def test_numpy_uint8_and_bool_index_data_stay_a_mask_as_torch():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    k, t = kiln.tensor(a), torch.tensor(a)
    m = np.array([1, 0, 1], dtype=np.uint8)
    with pytest.warns(UserWarning, match="uint8"):
        kr = k[m]
    with pytest.warns(UserWarning):
        tr = t[m]
    same(kr, tr)
    same(k[m.astype(bool)], t[m.astype(bool)])


@pytest.mark.parametrize("which", range(4))
def test_tuples_and_ranges_inside_a_list_key_are_index_data_as_torch(which):
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    keys = [lambda: [(0, 1)], lambda: [range(2), [1, 2]], lambda: [(0, 2), (1, 3)], lambda: [slice(None), range(1, 3)]]
    k, t = kiln.tensor(a), torch.tensor(a)
    with pytest.warns(UserWarning, match="non-tuple sequence"):
        kr = k[keys[which]()]
    with pytest.warns(UserWarning):
        tr = t[keys[which]()]
    same(kr, tr)
    with pytest.warns(UserWarning, match="non-tuple sequence"):
        k[keys[which]()] = -1.0
    with pytest.warns(UserWarning):
        t[keys[which]()] = -1.0
    same(k, t)
    # a tuple inside a tuple key too
    same(k[(0, 2), 1], t[(0, 2), 1])
    with pytest.raises(IndexError):
        k["ab"]


def test_two_ellipses_are_refused():
    # NumPy's rule, and torch's before 2.15 (which now takes x[..., ...] as x[...]): a clear error
    with pytest.raises(IndexError, match=r"single ellipsis \('...'\)"):
        kiln.zeros(2, 3)[..., ...]
    x = kiln.zeros(2, 3)
    with pytest.raises(IndexError, match="single ellipsis"):
        x[..., 0, ...] = 1.0
    with pytest.raises(IndexError, match="single ellipsis"), pytest.warns(UserWarning, match="non-tuple"):
        x[[Ellipsis, Ellipsis]]
    assert x.tolist() == [[0.0] * 3] * 2


# ---- index_add with an index out of range is refused, as torch's ----

@pytest.mark.parametrize("idx", [[-1], [3], [0, 5], [-4, 1]])
def test_index_add_refuses_an_index_out_of_range(idx):
    for lib in (kiln, torch):
        x = lib.zeros(3, 2)
        src = lib.ones(len(idx), 2)
        with pytest.raises((IndexError, RuntimeError), match="out of"):
            x.index_add_(0, lib.tensor(idx), src)
        with pytest.raises((IndexError, RuntimeError), match="out of"):
            lib.index_add(x, 0, lib.tensor(idx), src)
        if lib is kiln:  # checked before anything is written (torch's may have added the rows in range)
            assert x.tolist() == [[0.0, 0.0]] * 3
    with pytest.raises(IndexError, match=r"index_add_\(\): index .* out of bounds for dimension 0 with size 3"):
        kiln.zeros(3).index_add_(0, kiln.tensor(idx), kiln.ones(len(idx)))
    with pytest.raises(IndexError, match="dimension 1 with size 2"):
        kiln.zeros(2, 2).index_add(-1, kiln.tensor([2]), kiln.ones(2, 1))
    # in range: torch's values
    k, t = kiln.zeros(3).index_add(0, kiln.tensor([2, 0, 2]), kiln.ones(3)), torch.zeros(3).index_add(
        0, torch.tensor([2, 0, 2]), torch.ones(3))
    same(k, t)


def test_index_add_range_check_reads_the_index_once():
    # an index out of range stops index_add before index_put (which reads on its own): only the check reads
    x, idx, src = kiln.zeros(5, 2), kiln.tensor([4, 0, 9]), kiln.ones(3, 2)
    before = kiln._C.host_read_count()
    with pytest.raises(IndexError, match="index 9 is out of bounds"):
        x.index_add(0, idx, src)
    assert kiln._C.host_read_count() - before == 1
    idx = kiln.tensor([4, 0, 2])
    same(x.index_add(0, idx, src), torch.zeros(5, 2).index_add(0, torch.tensor([4, 0, 2]), torch.ones(3, 2)))


@pytest.mark.parametrize("key", ["np.float32(1.7)", "np.float64(-0.9)", "np.bool_(True)", "(0, np.float64(1.0))",
                                 "np.array(1.7)", "np.array([1.5, 0.2])", "[1.0]", "np.int16(1)",
                                 "np.array([1, 0], dtype=np.int16)", "torch.tensor([1.0, 0.0])",
                                 "torch.tensor([1, 0])"])
def test_numpy_scalars_and_foreign_tensors_as_indices_as_torch(key):
    # np.float32(1.7) was truncated to index 1 (x[1]) and x[np.float64(2.5)] = 9 wrote element 2, where
    # torch refuses a float scalar; a torch float tensor was converted too. Arrays and lists of floats
    # are index data (int64) in both.
    torch = pytest.importorskip("torch")
    results = []
    for lib in (torch, kiln):
        x = lib.arange(12.0).reshape(4, 3)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                results.append(x[eval(key)].tolist())
        except IndexError:
            results.append("IndexError")
    assert results[1] == results[0]
