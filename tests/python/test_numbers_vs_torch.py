# Python numbers beside integer and bool tensors, sum/cumsum's dtype=, clamp's NaN bounds and max/min of
# an empty tensor, against PyTorch itself: result dtype and values, and the same refusals.
import math

import numpy as np
import pytest

import kiln

torch = pytest.importorskip("torch")

NAN = float("nan")


def lib(x):
    """kiln or torch, whichever x belongs to (the module-level spelling of an op)."""
    return kiln if isinstance(x, kiln.Tensor) else torch


def k_of(t):
    return kiln.from_dlpack(t.clone())


def same(k, t):
    assert str(k.dtype).split(".")[-1] == str(t.dtype).split(".")[-1], (k.dtype, t.dtype)
    kn, tn = np.asarray(torch.from_dlpack(k).tolist()), np.asarray(t.tolist())
    assert kn.shape == tn.shape
    if t.dtype.is_floating_point:
        assert np.allclose(kn, tn, rtol=1e-6, atol=0, equal_nan=True), (kn, tn)
    else:
        assert (kn == tn).all(), (kn, tn)


INT_DTYPES = ["bool", "uint8", "int8", "int16", "int32", "int64"]
OPS = {
    "+": lambda x, s: x + s, "r+": lambda x, s: s + x, "-": lambda x, s: x - s, "r-": lambda x, s: s - x,
    "*": lambda x, s: x * s, "r*": lambda x, s: s * x, "/": lambda x, s: x / s, "r/": lambda x, s: s / x,
    "%": lambda x, s: x % s, "**": lambda x, s: x ** s,
    "div": lambda x, s: x.div(s), "kiln.div": lambda x, s: lib(x).div(x, s),
    "pow": lambda x, s: x.pow(s), "kiln.pow": lambda x, s: lib(x).pow(x, s),
}
POW_OPS = ("**", "pow", "kiln.pow")


@pytest.mark.parametrize("dt", INT_DTYPES)
@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("s", [2.0, 300.0, -1.0, 1.0, 0.5, 300, -3, 2**32 + 5, 2**40 + 3])
def test_a_number_beside_an_integer_tensor_is_torchs(dt, op, s):
    t = torch.tensor([5, -5, 100, 3]).to(getattr(torch, dt))
    f = OPS[op]
    try:
        want = f(t, s)
    except RuntimeError:
        with pytest.raises(RuntimeError):
            f(k_of(t), s)
        return
    same(f(k_of(t), s), want)


@pytest.mark.parametrize("dt", ["uint8", "int8", "int16", "int32"])
@pytest.mark.parametrize("mode", ["floor", "trunc"])
@pytest.mark.parametrize("s", [300, -300, 2**40 + 3, 2**32 + 7, 300.0, -2.5, 2.5])
def test_div_with_a_rounding_mode_and_an_out_of_range_number_is_torchs(dt, mode, s):
    # torch wraps an int into the tensor's dtype here (i8 x.div(300, rounding_mode='floor') divides by 44),
    # unlike true division; a float makes the result f32.
    t = torch.tensor([100, -100, 7, 0]).to(getattr(torch, dt))
    for f in (lambda x: x.div(s, rounding_mode=mode), lambda x: lib(x).div(x, s, rounding_mode=mode)):
        same(f(k_of(t)), f(t))


def test_the_reported_cases():
    x = kiln.tensor([5, -5, 100]).to(kiln.int8)
    assert (x * 300.0).dtype == kiln.float32 and (x * 300.0).tolist() == [1500.0, -1500.0, 30000.0]
    assert (kiln.tensor([1, 2, 3]) * 1.0).dtype == kiln.float32
    assert (kiln.tensor([True, False]) * 2.0).tolist() == [2.0, 0.0]
    assert (x / 300).tolist() == pytest.approx([5 / 300, -5 / 300, 100 / 300])
    assert (kiln.tensor([6]).to(kiln.uint8) / -3).tolist() == [-2.0]
    assert (kiln.tensor([1, 2]).to(kiln.int32) + (2**32 + 5)).tolist() == [6, 7]
    i8 = kiln.tensor([100, -100, 7]).to(kiln.int8)
    for q in (i8.div(300), kiln.div(i8, 300)):
        assert q.dtype == kiln.float32 and q.tolist() == pytest.approx([1 / 3, -1 / 3, 7 / 300])
    for f in (lambda: i8 ** 257, lambda: i8.pow(257), lambda: kiln.pow(i8, 257)):
        with pytest.raises(RuntimeError, match="exponent 257 does not fit"):
            f()


@pytest.mark.parametrize("dt", ["int8", "int32", "int64", "bool"])
def test_in_place_integer_ops_with_a_float_are_refused_as_torch(dt):
    for f in (lambda x: x.__imul__(2.0), lambda x: x.mul_(2.0), lambda x: x.__iadd__(2.0),
              lambda x: x.add_(2.0), lambda x: x.__isub__(2.0)):
        t = torch.tensor([1, 0, 3]).to(getattr(torch, dt))
        with pytest.raises(RuntimeError):
            f(t)
        with pytest.raises(RuntimeError):
            f(k_of(t))
    t = torch.tensor([1, 2, 3]).to(getattr(torch, dt))
    if dt != "bool":
        k = k_of(t)
        k *= 300
        t *= 300
        same(k, t)
        k.mul_(-3)
        t.mul_(-3)
        same(k, t)


@pytest.mark.parametrize("src", ["int8", "int32", "int64", "bool", "float32"])
@pytest.mark.parametrize("dt", ["bool", "uint8", "int8", "int16", "int32", "int64", "float32"])
def test_sum_and_cumsum_give_the_requested_dtype(src, dt):
    t = torch.tensor([[100, 100, 0], [1, 100, 7]]).to(getattr(torch, src))
    k, d, kd = k_of(t), getattr(torch, dt), getattr(kiln, dt)
    same(kiln.sum(k, dtype=kd), torch.sum(t, dtype=d))
    same(k.sum(1, dtype=kd), t.sum(1, dtype=d))
    if dt != "bool":  # torch has no bool cumsum
        same(kiln.cumsum(k, 1, dtype=kd), torch.cumsum(t, 1, dtype=d))
        same(k.cumsum(0, dtype=kd), t.cumsum(0, dtype=d))
    assert kiln.tensor([100, 100]).to(kiln.int8).sum(dtype=kiln.int8).item() == -56


@pytest.mark.parametrize("lo,hi", [(None, NAN), (NAN, None), (NAN, 1.0), (-1.0, NAN), (NAN, NAN), (-1.0, 1.0),
                                   (None, 1.0), (-math.inf, None), (None, math.inf)])
@pytest.mark.parametrize("dt", ["float32", "float64", "float16", "bfloat16"])
def test_clamp_with_nan_bounds_is_torchs(lo, hi, dt):
    t = torch.tensor([0.0, -5.0, 5.0, NAN, 1.0, -math.inf]).to(getattr(torch, dt))
    same(kiln.clamp(k_of(t), lo, hi), torch.clamp(t, lo, hi))
    same(k_of(t).clamp(min=lo, max=hi), t.clamp(min=lo, max=hi))


def test_clamp_with_a_nan_tensor_bound_and_its_gradient_are_torchs():
    lo, x = torch.tensor([NAN, -1.0, 0.0]), torch.tensor([0.0, -5.0, 0.0])
    same(kiln.clamp(k_of(x), k_of(lo)), torch.clamp(x, lo))
    same(kiln.clamp(k_of(x), None, k_of(lo)), torch.clamp(x, None, lo))
    lo = torch.tensor([2.0, -1.0, 0.0])
    t = torch.tensor([0.0, -5.0, 0.0], requires_grad=True)
    k = kiln.tensor([0.0, -5.0, 0.0], requires_grad=True)
    kl = k_of(lo).requires_grad_()
    tl = lo.clone().requires_grad_()
    want, got = torch.clamp(t, tl), kiln.clamp(k, kl)
    same(got.detach(), want.detach())
    want.sum().backward()
    got.sum().backward()
    same(k.grad, t.grad)  # at the tie (0 and 0) half to x and half to the bound
    same(kl.grad, tl.grad)
    # a NaN number bound: NaN values, no gradient
    t2 = torch.tensor([0.0, -5.0, 5.0], requires_grad=True)
    k2 = kiln.tensor([0.0, -5.0, 5.0], requires_grad=True)
    torch.clamp(t2, max=NAN).sum().backward()
    kiln.clamp(k2, max=NAN).sum().backward()
    same(k2.grad, t2.grad)


def test_the_refusals_give_torchs_reason():
    b = kiln.tensor([True, False])
    for f in (lambda: b - 1, lambda: 1 - b, lambda: b - 1.5, lambda: 2.5 - b, lambda: kiln.tensor([1, 2]) - b):
        with pytest.raises(RuntimeError, match="with a bool tensor .* not supported.*logical_not"):
            f()
    with pytest.raises(RuntimeError, match="two bool tensors .* not supported.*logical_xor"):
        b - b
    for o in (b, 1, kiln.tensor([True, True])):
        with pytest.raises(RuntimeError, match="with a bool tensor .* not supported"):
            b.__isub__(o)
    with pytest.raises(RuntimeError, match="with a bool tensor .* not supported"):
        kiln.tensor([1, 2]).__isub__(kiln.tensor([True, False]))
    for target, o in ((b, b), (kiln.tensor([1.0, 2.0]), b), (kiln.tensor([1.0, 2.0]), True)):
        with pytest.raises(RuntimeError, match="sub_: subtraction with a bool tensor .* not supported"):
            target.sub_(o)
    assert b.tolist() == [True, False]
    x = kiln.tensor([1, 2]).to(kiln.int8)
    for f in (lambda: x ** -3, lambda: x.pow(-1), lambda: kiln.pow(x.to(kiln.int64), -2), lambda: b ** -1):
        with pytest.raises(RuntimeError, match="negative integer powers are not allowed"):
            f()
    assert (x ** -1.0).dtype == kiln.float32 and (b ** 300).dtype == kiln.int64 and (b ** 0).tolist() == [1, 1]


def test_an_int_exponent_is_read_exactly_as_torch():
    # A large Python int or a NumPy integer exponent is compared with the base's dtype as it is, not
    # converted (x_i8 ** (2**60 + 1) and x_i8 ** np.int64(257) were x ** 1); an i64 base takes any.
    x, xt = kiln.tensor([2, -3, 5]).to(kiln.int8), torch.tensor([2, -3, 5], dtype=torch.int8)
    for e in (2**53 + 1, 2**60 + 1, np.int64(257), np.uint16(300)):
        for f in (lambda: x ** e, lambda: x.pow(e), lambda: kiln.pow(x, e)):
            with pytest.raises(RuntimeError, match="does not fit in the dtype of the base"):
                f()
        with pytest.raises(RuntimeError):
            xt ** int(e)
    with pytest.raises(OverflowError, match="does not fit in int64"):
        x ** 2**64
    same(x ** np.int64(3), xt ** 3)
    y, yt = kiln.tensor([3, -3, 2, 1]), torch.tensor([3, -3, 2, 1])
    for e in (2**53 + 1, 2**60 + 1, 2**62 + 3, np.int64(2**61 + 5)):
        for k in (y ** e, y.pow(e), kiln.pow(y, e)):
            same(k, yt ** int(e))


@pytest.mark.parametrize("dt", ["float32", "float64", "int8", "uint8", "int64"])
def test_clamp_with_min_above_max_gives_max_as_torch(dt):
    t = torch.tensor([0, 5, 100, 1]).to(getattr(torch, dt))
    same(kiln.clamp(k_of(t), 2, 1), torch.clamp(t, 2, 1))
    same(k_of(t).clamp(min=50, max=3), t.clamp(min=50, max=3))
    lo, hi = torch.tensor([2, 0, 7, 1]).to(getattr(torch, dt)), torch.tensor([1, 0, 3, 1]).to(getattr(torch, dt))
    same(kiln.clamp(k_of(t), k_of(lo), k_of(hi)), torch.clamp(t, lo, hi))
    if dt.startswith("float"):
        same(kiln.clamp(k_of(t), 2.5, 1.5), torch.clamp(t, 2.5, 1.5))
        k = k_of(t).requires_grad_()
        kiln.clamp(k, 2.0, 1.0).sum().backward()
        assert k.grad.tolist() == [0.0] * 4


@pytest.mark.parametrize("bounds", ["min", "max", "both"])
def test_clamp_gradient_with_tensor_bounds_is_torchs_over_nan_inf_ties_and_crossed_bounds(bounds):
    # Every (x, min, max) over these values, one element each: NaN in x or a bound, ties, min > max.
    vals = [NAN, -math.inf, 0.0, 1.0, 2.0, math.inf]
    n = len(vals)
    grid = np.array(np.meshgrid(vals, vals, vals, indexing="ij")).reshape(3, -1)
    tx, tl, th = (torch.tensor(g, dtype=torch.float32, requires_grad=True) for g in grid)
    kx, kl, kh = (k_of(v.detach()).requires_grad_() for v in (tx, tl, th))
    lo_t, hi_t = (tl if bounds != "max" else None), (th if bounds != "min" else None)
    lo_k, hi_k = (kl if bounds != "max" else None), (kh if bounds != "min" else None)
    want, got = torch.clamp(tx, lo_t, hi_t), kiln.clamp(kx, lo_k, hi_k)
    same(got.detach(), want.detach())
    want.sum().backward()
    got.sum().backward()
    same(kx.grad, tx.grad)
    for k, t in ((lo_k, lo_t), (hi_k, hi_t)):
        if t is not None:
            same(k.grad, t.grad)
    assert n ** 3 == tx.numel()


@pytest.mark.parametrize("name", ["maximum", "minimum"])
def test_maximum_minimum_gradient_with_nan_and_ties_is_torchs(name):
    # A NaN on either side gives the gradient to both, as torch's; a tie splits it.
    vals = [NAN, -math.inf, 0.0, 1.0, math.inf]
    a, b = np.array(np.meshgrid(vals, vals, indexing="ij")).reshape(2, -1)
    ta, tb = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
    ka, kb = k_of(ta.detach()).requires_grad_(), k_of(tb.detach()).requires_grad_()
    getattr(torch, name)(ta, tb).sum().backward()
    getattr(kiln, name)(ka, kb).sum().backward()
    same(ka.grad, ta.grad)
    same(kb.grad, tb.grad)


def test_clamp_of_an_integer_tensor_with_a_nan_bound_is_torchs():
    # a float bound makes the result f32 (as test_clamp_with_float_bounds_promotes_as_torch), so NaN is a
    # bound there, all NaN, as torch's; Kiln refused it
    same(kiln.clamp(kiln.tensor([1, 2, 3]), min=NAN), torch.clamp(torch.tensor([1, 2, 3]), min=NAN))
    want = torch.clamp(torch.tensor([1, 2, 3], dtype=torch.int8), 0, 200)
    same(kiln.clamp(kiln.tensor([1, 2, 3]).to(kiln.int8), 0, 200), want)


@pytest.mark.parametrize("name", ["max", "min"])
def test_max_min_of_an_empty_tensor_without_dim_are_refused(name):
    with pytest.raises(RuntimeError):
        getattr(torch.zeros(0), name)()
    with pytest.raises(RuntimeError, match=f"^{name}\\(\\)"):
        getattr(kiln.zeros(0), name)()
    with pytest.raises(RuntimeError, match=f"^{name}\\(\\)"):
        getattr(kiln, name)(kiln.zeros(0, 3))
    assert getattr(kiln.tensor([3.0, -1.0]), name)().item() == (3.0 if name == "max" else -1.0)


def test_a_number_out_of_an_integer_dtype_is_refused_wherever_it_is_written_as_torch():
    # masked_fill and x[idx] = v / x[mask] = v wrapped it (i8 300 -> 44) while fill_ and x[0] = v refused it;
    # torch refuses them all ("value cannot be converted to type int8_t without overflow").
    def setitem(key):
        def f(x, v):
            y = x.clone()
            y[key(x)] = v
            return y
        return f

    writes = {
        "masked_fill": lambda x, v: x.masked_fill(mask_of(x), v),
        "masked_fill_": lambda x, v: x.clone().masked_fill_(mask_of(x), v),
        "x[idx] = v": setitem(lambda x: lib(x).tensor([0, 2])),
        "x[mask] = v": setitem(mask_of),
        "x[0] = v": setitem(lambda x: 0),
        "fill_": lambda x, v: x.clone().fill_(v),
    }
    for dt, bad, good in (("int8", (300, -129, 128.0, -128.5, NAN, math.inf, np.int64(300)), (127, -128, 2.5, 127.9)),
                          ("int16", (40000, -40000), (32767,)), ("int32", (2**31, -2**31 - 1), (2**31 - 1,)),
                          ("uint8", (256, 300), (255, 0))):
        x, xt = kiln.zeros(3, dtype=getattr(kiln, dt)), torch.zeros(3, dtype=getattr(torch, dt))
        for name, f in writes.items():
            for v in bad:
                with pytest.raises(RuntimeError, match="without overflow"):
                    f(xt, v)
                with pytest.raises(RuntimeError, match=f"does not fit in {kiln_dtype_name(dt)}"):
                    f(x, v)
            for v in good:
                same(f(x, v), f(xt, v))  # in range: x's dtype, truncated as torch


def test_masked_fill_writes_an_int_into_int64_exactly_as_torch():
    # The value went through a double: i64 masked_fill(m, 2**63 - 1) was refused as out of range and
    # 2**53 + 1 written as 2**53. torch writes both exactly; a value past int64 is refused.
    for v in (2**63 - 1, -2**63, 2**53 + 1, -(2**53) - 1, np.int64(2**63 - 1), np.int64(2**53 + 1)):
        x, xt = kiln.zeros(3, dtype=kiln.int64), torch.zeros(3, dtype=torch.int64)
        same(x.masked_fill(mask_of(x), v), xt.masked_fill(mask_of(xt), v))
        same(x.clone().masked_fill_(mask_of(x), v), xt.clone().masked_fill_(mask_of(xt), v))
        same(kiln.masked_fill(x, mask_of(x), v), torch.masked_fill(xt, mask_of(xt), v))
    x = kiln.zeros(3, dtype=kiln.int64)
    assert x.masked_fill(mask_of(x), 2**53 + 1).tolist() == [2**53 + 1, 0, 2**53 + 1]
    for v in (2**63, -2**63 - 1):
        with pytest.raises((RuntimeError, OverflowError)):
            torch.zeros(3, dtype=torch.int64).masked_fill(mask_of(torch.zeros(3)), v)
        with pytest.raises(OverflowError, match="masked_fill: value: .* does not fit in int64"):
            x.masked_fill(mask_of(x), v)
    # one past a narrower dtype is refused, named exactly
    with pytest.raises(RuntimeError, match="masked_fill: 2147483648 does not fit in i32"):
        kiln.zeros(3, dtype=kiln.int32).masked_fill(mask_of(x), 2**31)
    # floats, bools and 0-dim tensors still go as numbers
    for k, t in ((kiln.zeros(3), torch.zeros(3)), (kiln.zeros(3, dtype=kiln.bool), torch.zeros(3, dtype=torch.bool))):
        for v in (2**53 + 1, True, 0.5):
            same(k.masked_fill(mask_of(k), v), t.masked_fill(mask_of(t), v))
    same(kiln.zeros(3).masked_fill(mask_of(x), kiln.tensor(2.5)),
         torch.zeros(3).masked_fill(mask_of(xt), torch.tensor(2.5)))


def mask_of(x):
    return lib(x).tensor([True, False, True])


def kiln_dtype_name(dt):
    return {"uint8": "u8", "int8": "i8", "int16": "i16", "int32": "i32"}[dt]


def test_clamp_refuses_an_integer_bound_every_element_would_pass_as_torch():
    # A min above the dtype's largest value or a max below its smallest was saturated (i8 clamp(min=300) gave
    # 127); torch refuses it. A bound past the other end bounds nothing, in both.
    x, xt = kiln.tensor([-5, 0, 7]).to(kiln.int8), torch.tensor([-5, 0, 7], dtype=torch.int8)
    for kw in ({"min": 300}, {"max": -300}, {"min": 128, "max": 200}, {"min": -200, "max": -129}):
        with pytest.raises(RuntimeError, match="outside the representable range"):
            xt.clamp(**kw)
        with pytest.raises(RuntimeError,
                           match=r"clamp: m.. -?[0-9]+ is (above the largest|below the smallest) i8 value \("):
            x.clamp(**kw)
    for kw in ({"min": -300, "max": 300}, {"min": 127}, {"max": -128}, {"min": 0, "max": 300}):
        same(x.clamp(**kw), xt.clamp(**kw))


def test_an_integer_base_to_a_negative_integer_tensor_exponent_as_torch():
    # A tensor exponent with negative entries was a kernel error; torch gives the truncated 1 / x ** -y:
    # 1 for base 1, +-1 for base -1 (by the exponent's parity), 0 for every other base, 0 included.
    bases, exps = [2, -2, 1, -1, 0, 3, 127, -128], [-3, -2, -1, 0, 1, 2]
    for dt in ("int8", "int16", "int32", "int64"):
        b = np.repeat(bases, len(exps)).reshape(len(bases), len(exps))
        e = np.tile(exps, (len(bases), 1))
        kb, ke = kiln.tensor(b.tolist()).to(getattr(kiln, dt)), kiln.tensor(e.tolist()).to(getattr(kiln, dt))
        tb, te = torch.tensor(b.tolist(), dtype=getattr(torch, dt)), torch.tensor(e.tolist(), dtype=getattr(torch, dt))
        same(kb ** ke, tb ** te)
        same(kiln.pow(kb, ke), torch.pow(tb, te))
    for base in (2, -1, 1, 0):  # a Python number base, as torch's
        same(base ** kiln.tensor(exps), base ** torch.tensor(exps))
    # a negative Python int exponent stays refused, as torch's
    with pytest.raises(RuntimeError, match="negative integer powers are not allowed"):
        kiln.tensor([2]) ** -3


def test_bool_to_a_bool_power_and_numpy_bool_exponents_as_torch():
    # mask ** True was refused (torch: bool, mask ** False all true); a NumPy bool is a float number to torch
    # (i ** np.True_ is f32 there; Kiln gave i64). bool ** a bool tensor stays refused, as torch's.
    m, mt = kiln.tensor([True, False]), torch.tensor([True, False])
    i, it = kiln.tensor([2, 3]), torch.tensor([2, 3])
    i8, i8t = i.to(kiln.int8), it.to(torch.int8)
    for e in (True, False):
        same(m ** e, mt ** e)
        same(m.pow(e), mt.pow(e))
        same(kiln.pow(m, e), torch.pow(mt, e))
    for e in (np.True_, np.False_):
        for k, t in ((i, it), (i8, i8t), (m, mt), (kiln.tensor([1.5]), torch.tensor([1.5]))):
            same(k ** e, t ** e)
            same(k.pow(e), t.pow(e))
    same(i ** True, it ** True)
    for f in (lambda x: x ** x, lambda x: x.pow(x)):
        with pytest.raises(NotImplementedError):
            f(mt)
        with pytest.raises(RuntimeError, match="pow: not defined for bool tensors"):
            f(m)


def test_a_numpy_bool_base_to_a_tensor_power_is_a_float_as_torch():
    # np.True_ ** mask raised (__pow__ took a NumPy bool as a float number, __rpow__ did not); torch gives f32.
    for k, t in ((kiln.tensor([True, False]), torch.tensor([True, False])), (kiln.tensor([2, 0]), torch.tensor([2, 0])),
                 (kiln.tensor([1.5, -2.0]), torch.tensor([1.5, -2.0]))):
        for b in (np.True_, np.False_):
            same(b ** k, b ** t)


def test_mean_takes_a_dtype_name_or_a_numpy_dtype():
    # dtype.is_floating_point was read before the dtype was resolved: x.mean(dtype="float32") and
    # dtype=np.dtype("float64") were AttributeErrors. They take what .to() takes.
    x, xt = kiln.tensor([1, 2, 4]), torch.tensor([1, 2, 4])
    for d, td in (("float32", torch.float32), (np.dtype("float64"), torch.float64)):
        same(x.mean(dtype=d), xt.mean(dtype=td))
        same(kiln.mean(x, 0, dtype=d), torch.mean(xt, 0, dtype=td))
    for d in ("int32", np.dtype("int64")):
        with pytest.raises(NotImplementedError, match="mean\\(\\): could not infer output dtype.*got int"):
            x.mean(dtype=d)


def test_mean_refuses_an_integer_dtype_as_torch():
    # mean(dtype=int64) gave f32; torch refuses a dtype= that is not floating.
    for x, xt in ((kiln.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0])), (kiln.tensor([1, 2]), torch.tensor([1, 2]))):
        for dt in ("int64", "int32", "int8", "uint8", "bool"):
            for f in (lambda x, d: x.mean(dtype=d), lambda x, d: lib(x).mean(x, 0, dtype=d)):
                with pytest.raises(NotImplementedError, match="mean\\(\\): could not infer output dtype"):
                    f(xt, getattr(torch, dt))
                with pytest.raises(NotImplementedError, match=f"mean\\(\\): could not infer output dtype.*got {dt}"):
                    f(x, getattr(kiln, dt))
        for dt in ("float32", "float64"):
            same(x.mean(dtype=getattr(kiln, dt)), xt.mean(dtype=getattr(torch, dt)))


def test_to_and_dtype_arguments_take_python_and_numpy_scalar_types():
    # x.to(float), x.to(int), x.to(bool) are torch's (f64, i64, bool) and were read as a device; NumPy's
    # scalar types (np.float32, np.int64) were refused where np.dtype("float32") is taken (torch takes
    # neither: Kiln takes a NumPy dtype either way it is spelt).
    x, xt = kiln.tensor([1, 0, 3]).to(kiln.int8), torch.tensor([1, 0, 3], dtype=torch.int8)
    for d, td in ((float, float), (int, int), (bool, bool)):
        same(x.to(d), xt.to(td))
        same(x.to(dtype=d), xt.to(dtype=td))
        same(x.to("cpu", d), xt.to("cpu", td))
    for d, td in ((np.float32, torch.float32), (np.int64, torch.int64), (np.dtype("float32"), torch.float32),
                  (np.float64, torch.float64), (np.int16, torch.int16), (np.uint8, torch.uint8),
                  (np.bool_, torch.bool), (np.float16, torch.float16)):
        same(x.to(d), xt.to(td))
        same(x.to(dtype=d), xt.to(dtype=td))
        same(kiln.tensor([1, 2], dtype=d), torch.tensor([1, 2], dtype=td))
        same(kiln.zeros(2, dtype=d), torch.zeros(2, dtype=td))
        same(kiln.full_like(x, 1, dtype=d), torch.full_like(xt, 1, dtype=td))
    same(x.mean(dtype=np.float64), xt.mean(dtype=torch.float64))
    # a NumPy type Kiln has no dtype for, and a type that is no dtype, are still refused, naming the argument
    with pytest.raises(ValueError, match="dtype: .*complex"):
        x.to(np.complex64)
    with pytest.raises(ValueError, match="dtype: expected a kiln.dtype or a dtype name"):
        kiln.zeros(2, dtype=str)


def test_where_refuses_an_int_its_tensor_dtype_cannot_hold_as_torch():
    # where(mask, x_i8, 300) wrapped the number into i8 (44); torch refuses it (+ keeps the low bits, where
    # does not). In range, and a float, a bool or a tensor beside it, the values and dtype are torch's.
    m, mt = kiln.tensor([True, False, True]), torch.tensor([True, False, True])
    cases = (("int8", (300, -129, 128, 2**40, np.int64(300), np.uint8(200)), (127, -128, 0, np.int16(-5))),
             ("uint8", (256, -256, 300), (255, 0, -1, -255)),  # torch's uint8 takes -255 to 255, -1 as 255
             ("int16", (40000, -32769), (32767, -32768)), ("int32", (2**31, -2**31 - 1), (2**31 - 1, -2**31)),
             ("int64", (), (2**63 - 1, -2**63)), ("bool", (), (300, -1)))
    for dt, bad, good in cases:
        x, xt = kiln.tensor([1, 2, 3]).to(getattr(kiln, dt)), torch.tensor([1, 2, 3]).to(getattr(torch, dt))
        for v in bad:
            with pytest.raises(RuntimeError, match="without overflow"):
                torch.where(mt, xt, v)
            with pytest.raises(RuntimeError, match="without overflow"):
                torch.where(mt, v, xt)
            with pytest.raises(RuntimeError, match=f"where: other -?[0-9]+ does not fit in the other operand's "
                                                   f"{kiln_dtype_name(dt)} "):
                kiln.where(m, x, v)
            with pytest.raises(RuntimeError, match=f"where: input -?[0-9]+ does not fit"):
                kiln.where(m, v, x)
        for v in good + (2.5, 300.0, True):
            same(kiln.where(m, x, v), torch.where(mt, xt, v))
            same(kiln.where(m, v, x), torch.where(mt, v, xt))
        big = kiln.tensor([300, 400, 500])  # a tensor is converted by promotion, not checked
        same(kiln.where(m, x, big), torch.where(mt, xt, torch.tensor([300, 400, 500])))


def test_clamp_with_float_bounds_promotes_as_torch():
    # clamp(x_i8, 0.5, 2.5) stayed i8 (the bounds truncated: [2, 2, 1]); torch's type promotion makes it f32
    # (a float number beside an integer or bool tensor), and a bool tensor with int bounds i64.
    for dt in ("int8", "uint8", "int32", "int64", "bool"):
        x = [1, 0, 1] if dt == "bool" else [100, -3 if dt != "uint8" else 3, 0]
        k, t = kiln.tensor(x).to(getattr(kiln, dt)), torch.tensor(x).to(getattr(torch, dt))
        for lo, hi in ((0.5, 2.5), (0.5, None), (None, 1.5), (0, 1.5), (-math.inf, 0.25), (np.float32(0.5), None),
                       (np.float64(0.5), 2), (np.True_, None), (NAN, None), (0, 1), (None, np.int64(1))):
            same(kiln.clamp(k, lo, hi), torch.clamp(t, lo, hi))
            same(k.clamp(min=lo, max=hi), t.clamp(min=lo, max=hi))
            same(k.clip(lo, hi), t.clip(lo, hi))
        # tensor bounds: result_type, as before
        same(kiln.clamp(k, kiln.tensor(0.5), None), torch.clamp(t, torch.tensor(0.5), None))
        same(kiln.clamp(k, kiln.tensor([0.5, 1, 1]), kiln.tensor([2.5, 3, 3])),
             torch.clamp(t, torch.tensor([0.5, 1, 1]), torch.tensor([2.5, 3, 3])))
        # in place, a float result cannot be written back into x: refused, as torch's (it was truncated)
        for f in (lambda x: x.clamp_(0.5, 2.5), lambda x: x.clamp_(min=0.5), lambda x: x.clip_(None, 1.5)):
            with pytest.raises(RuntimeError, match="can't be cast"):
                f(t.clone())
            with pytest.raises(RuntimeError, match="cannot be written into"):
                f(k.clone())
    same(kiln.tensor([1, 5]).to(kiln.int8).clamp_(0, 3), torch.tensor([1, 5], dtype=torch.int8).clamp_(0, 3))
    f16, f16t = kiln.tensor([1.0, 2.0]).to(kiln.float16), torch.tensor([1.0, 2.0], dtype=torch.float16)
    same(f16.clamp_(kiln.tensor([1.5])), f16t.clamp_(torch.tensor([1.5])))


def test_a_numpy_bool_beside_a_tensor_is_a_float_number_as_torch():
    # x_i32 + np.True_ kept i32 (the NumPy bool read as a bool); torch takes it as a float number, f32 [2.],
    # while Python's True keeps i32. The same in every binary op, where and with two numbers.
    for dt in ("int32", "int8", "uint8", "int64", "bool", "float16", "float64"):
        k, t = kiln.tensor([1, 0]).to(getattr(kiln, dt)), torch.tensor([1, 0]).to(getattr(torch, dt))
        for b in (np.True_, np.False_, True, False):
            for f in (lambda x, b: x + b, lambda x, b: b + x, lambda x, b: x * b, lambda x, b: b * x,
                      lambda x, b: x / (b or 2), lambda x, b: lib(x).add(x, b), lambda x, b: lib(x).mul(x, b),
                      lambda x, b: x == b, lambda x, b: lib(x).where(lib(x).tensor([True, False]), x, b),
                      lambda x, b: lib(x).where(lib(x).tensor([True, False]), b, x)):
                same(f(k, b), f(t, b))
            if dt != "bool" and not isinstance(b, bool):  # (Python's bool - is refused in both)
                same(k - b, t - b)
                same(b - k, b - t)
    m, mt = kiln.tensor([True, False]), torch.tensor([True, False])
    same(kiln.where(m, np.True_, 2), torch.where(mt, np.True_, 2))
    same(kiln.where(m, np.True_, np.False_), torch.where(mt, np.True_, np.False_))
    # in place, the float cannot go into an integer tensor: refused, as torch's
    with pytest.raises(RuntimeError):
        torch.tensor([1], dtype=torch.int32).add_(np.True_)
    with pytest.raises(RuntimeError, match="cannot be written into"):
        kiln.tensor([1]).to(kiln.int32).add_(np.True_)
    assert kiln.tensor(np.True_).dtype == kiln.bool  # a tensor of it is still a bool tensor, as torch.tensor's


def test_numpy_0d_integer_arrays_are_int_bounds_and_abstract_numpy_types_no_dtype():
    # a 0-dim NumPy integer array is an int bound, as np.int32(2) is: clamp keeps the integer dtype (it
    # promoted to f32, and clamp_ refused), and where range-checks it
    x = kiln.tensor([1, 3, 5], dtype=kiln.int32)
    y = kiln.clamp(x, np.array(2), np.array(4))
    assert y.dtype == kiln.int32 and y.tolist() == [2, 3, 4]
    x.clamp_(np.array(2))
    assert x.tolist() == [2, 3, 5]
    with pytest.raises(ValueError, match="does not fit"):
        kiln.where(kiln.tensor([True, False, True]), kiln.tensor([1, 2, 3], dtype=kiln.int8), np.array(300))
    # an abstract NumPy type is refused in Kiln's words (it was NumPy's TypeError)
    for t in (np.generic, np.floating, np.integer):
        with pytest.raises(ValueError, match="not a dtype"):
            kiln.zeros(2, dtype=t)


def test_uint8_with_negative_python_ints_as_torch():
    # torch wraps a Python int into uint8 for arithmetic and comparisons, and lets -255..-1 through the
    # written values' check (fill_(-1) is 255); Kiln's fill_, full and masked_fill refused -1.
    def setitem(key):
        def f(x, v):
            y = x.clone()
            y[key(x)] = v
            return y
        return f

    cases = {
        "x + v": lambda x, v: x + v, "x - v": lambda x, v: x - v, "x * v": lambda x, v: x * v,
        "v - x": lambda x, v: v - x, "x == v": lambda x, v: x == v, "x != v": lambda x, v: x != v,
        "x < v": lambda x, v: x < v, "x > v": lambda x, v: x > v, "x >= v": lambda x, v: x >= v,
        "x <= v": lambda x, v: x <= v,
        "fill_": lambda x, v: x.clone().fill_(v),
        "full": lambda x, v: lib(x).full((2,), v, dtype=x.dtype),
        "masked_fill": lambda x, v: x.masked_fill(lib(x).tensor([True, False]), v),
        "x[0] = v": setitem(lambda x: 0),
        "x[mask] = v": setitem(lambda x: lib(x).tensor([False, True])),
    }
    x, xt = kiln.tensor([1, 2], dtype=kiln.uint8), torch.tensor([1, 2], dtype=torch.uint8)
    for name, f in cases.items():
        for v in (-1, -2, -255):
            try:
                want = f(xt, v)
            except RuntimeError:
                with pytest.raises(RuntimeError):
                    f(x, v)
                continue
            same(f(x, v), want)
    # full_like too, and an integer-like value (np.int64, a 0-d int tensor) as a Python int: fill_ and
    # full refused them, full_like took only a float
    cases["full_like"] = lambda x, v: lib(x).full_like(x, v)
    for v in (-1, np.int64(-1), np.int64(-255), kiln.tensor(-1), kiln.tensor(-7)):
        tv = torch.tensor(v.item()) if isinstance(v, kiln.Tensor) else v
        for name in ("fill_", "full", "full_like", "masked_fill", "x[0] = v"):
            same(cases[name](x, v), cases[name](xt, tv))
    for name in ("fill_", "full", "full_like", "masked_fill", "x[0] = v"):  # past -255, or a float: refused in both
        for v in (-256, -1.0):
            with pytest.raises(RuntimeError, match="without overflow"):
                cases[name](xt, v)
            with pytest.raises(RuntimeError, match="does not fit in u8"):
                cases[name](x, v)


# ---- kiln.tensor / Tensor.new_tensor from Python numbers with a dtype: converted as torch.tensor's ----

_FROM_PYTHON = [
    0.3, [0.3], [[0.1, 0.2], [1e-50, -2.5]], [1, 2**60 + 1, -(2**53) - 1], [2**60 + 1, 0.5], [True, False, 2.5],
    [1 + 2**-11 + 2**-40, 1 + 2**-8 + 2**-40, 65519.0, 70000.0, 1e300, -1e-300], [[3], [4]], 7, True,
    np.float64(0.3), np.float32(0.3), np.int32(7), [np.float64(0.1), 2],
]


@pytest.mark.parametrize("data", _FROM_PYTHON, ids=range(len(_FROM_PYTHON)))
@pytest.mark.parametrize("dt", ["float64", "float32", "float16", "bfloat16", "int64", "bool"])
def test_tensor_from_python_numbers_with_a_dtype_is_torchs(data, dt):
    if dt == "int64" and isinstance(data, list) and 1e300 in data:
        pytest.skip("torch refuses a float beyond int64; Kiln's engine cast gives its minimum")
    if dt in ("int64", "bool") and isinstance(data, np.float32):
        pytest.skip("torch 2.15 refuses a NumPy float32 scalar with an integer or bool dtype")
    t = torch.tensor(data, dtype=getattr(torch, dt))
    for k in (kiln.tensor(data, dtype=getattr(kiln, dt)), kiln.zeros([1], dtype=getattr(kiln, dt)).new_tensor(data)):
        assert str(k.dtype).split(".")[-1] == dt
        assert list(k.shape) == list(t.shape)
        # exact: the same double for every element (NaN-free data)
        assert k.float().tolist() == t.float().tolist() if dt in ("float16", "bfloat16") else k.tolist() == t.tolist()


def test_tensor_with_float64_keeps_the_python_double():
    assert kiln.tensor([0.3], dtype=kiln.float64).item() == 0.3
    assert kiln.tensor(0.1, dtype=kiln.float64).item() == 0.1
    for spelt in ("float64", torch.float64, np.float64, float):
        assert kiln.tensor([0.3], dtype=spelt).item() == 0.3
    assert kiln.zeros([2], dtype=kiln.float64).new_tensor([[0.7]]).tolist() == [[0.7]]
    assert kiln.tensor([2**60 + 1], dtype=kiln.int64).item() == 2**60 + 1
    assert kiln.tensor([2**60 + 1, 0.5], dtype=kiln.int64).tolist() == [2**60 + 1, 0]


@pytest.mark.parametrize("data", [[0.3], 0.3, [[1, 2]], [2**60 + 1], [True], [np.float32(0.5)], np.float64(0.3)])
def test_tensor_default_dtype_rules_are_unchanged(data):
    k, t = kiln.tensor(data), torch.tensor(data)
    assert str(k.dtype).split(".")[-1] == str(t.dtype).split(".")[-1]
    assert k.tolist() == t.tolist()
