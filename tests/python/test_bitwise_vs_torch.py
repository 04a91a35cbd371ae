# The bitwise ops (& | ^ ~ << >>, their in-place and reflected forms, kiln.bitwise_* and the Tensor
# methods) against PyTorch: values and result dtypes for every pair of integer and bool dtypes, Python
# numbers on either side, broadcasting, the `x[~mask]` idiom, and the refusal of floating operands.
import operator

import numpy as np
import pytest

import kiln

torch = pytest.importorskip("torch")

DTYPES = ["bool", "uint8", "int8", "int16", "int32", "int64"]
RNG = np.random.default_rng(11)


def pair(dtype, shape=(3, 4), lo=-100, hi=100):
    if dtype == "bool":
        a = RNG.random(shape) < 0.5
    elif dtype == "uint8":
        a = RNG.integers(0, 256, shape)
    else:
        a = RNG.integers(lo, hi, shape)
    return kiln.tensor(a.tolist(), dtype=getattr(kiln, dtype)), torch.tensor(a.tolist(), dtype=getattr(torch, dtype))


def same(k, t):
    assert str(k.dtype).split(".")[-1] == str(t.dtype).split(".")[-1], (k.dtype, t.dtype)
    assert tuple(k.shape) == tuple(t.shape)
    assert k.tolist() == t.tolist()


BINARY = [operator.and_, operator.or_, operator.xor]


@pytest.mark.parametrize("da", DTYPES)
@pytest.mark.parametrize("db", DTYPES)
def test_and_or_xor_every_dtype_pair(da, db):
    ka, ta = pair(da)
    kb, tb = pair(db, shape=(4,))  # broadcast against [3, 4]
    for op in BINARY:
        same(op(ka, kb), op(ta, tb))
    same(kiln.bitwise_and(ka, kb), torch.bitwise_and(ta, tb))
    same(kiln.bitwise_or(ka, kb), torch.bitwise_or(ta, tb))
    same(kiln.bitwise_xor(ka, kb), torch.bitwise_xor(ta, tb))
    same(ka.bitwise_and(kb), ta.bitwise_and(tb))


@pytest.mark.parametrize("da", DTYPES[1:])
@pytest.mark.parametrize("db", DTYPES)
def test_shifts_every_dtype_pair(da, db):
    ka, ta = pair(da)
    if db == "bool":
        kb, tb = pair(db, shape=(4,))
    else:  # amounts in and out of [0, width), negative ones too (uint8: 0 to 255)
        kb, tb = pair(db, shape=(4,), lo=-3, hi=70)
    for op in (operator.lshift, operator.rshift):
        same(op(ka, kb), op(ta, tb))
    same(kiln.bitwise_left_shift(ka, kb), torch.bitwise_left_shift(ta, tb))
    same(kiln.bitwise_right_shift(ka, kb), torch.bitwise_right_shift(ta, tb))
    same(ka.bitwise_right_shift(kb), ta.bitwise_right_shift(tb))


def test_shift_of_two_bools_is_refused():
    kb, _ = pair("bool")
    with pytest.raises(kiln.KilnError, match="bitwise_left_shift"):
        kb << kb


@pytest.mark.parametrize("dtype", DTYPES)
def test_not_and_the_mask_idiom(dtype):
    k, t = pair(dtype)
    same(~k, ~t)
    same(kiln.bitwise_not(k), torch.bitwise_not(t))
    same(k.bitwise_not(), t.bitwise_not())
    x = kiln.arange(12).reshape(3, 4)
    m = x % 3 == 0
    assert x[~m].tolist() == torch.arange(12).reshape(3, 4)[~(torch.arange(12).reshape(3, 4) % 3 == 0)].tolist()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("number", [0, 1, 5, -1, 300, True, False, 2**40])
def test_python_numbers_on_either_side(dtype, number):
    k, t = pair(dtype)
    for op in BINARY:
        same(op(k, number), op(t, number))
        same(op(number, k), op(number, t))
    if dtype != "bool" and not isinstance(number, bool):
        for op in (operator.lshift, operator.rshift):
            same(op(k, number % 80), op(t, number % 80))
            same(op(number % 80, k.abs() % 8), op(number % 80, t.abs() % 8))


@pytest.mark.parametrize("da", DTYPES)
@pytest.mark.parametrize("db", DTYPES)
def test_in_place_forms_take_what_torch_takes(da, db):
    ka, ta = pair(da)
    kb, tb = pair(db, shape=(4,), lo=0, hi=7)
    for name in ("__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__"):
        kx, tx = ka.clone(), ta.clone()
        try:
            want = getattr(tx, name)(tb)
        except (RuntimeError, TypeError) as e:
            with pytest.raises(Exception):
                getattr(kx, name)(kb)
            continue
        got = getattr(kx, name)(kb)
        assert got is kx
        same(kx, want)
    kx, tx = ka.clone(), ta.clone()
    if torch.result_type(ta, tb) == ta.dtype:
        kx.bitwise_xor_(kb)
        tx.bitwise_xor_(tb)
        same(kx, tx)


def test_in_place_operator_statements():
    x = kiln.tensor([1, 2, 12], dtype=kiln.int32)
    x &= kiln.tensor([3, 3, 4])  # i64 operand, written into i32, as torch
    x |= 8
    x ^= 1
    x <<= 2
    x >>= 1
    t = torch.tensor([1, 2, 12], dtype=torch.int32)
    t &= torch.tensor([3, 3, 4])
    t |= 8
    t ^= 1
    t <<= 2
    t >>= 1
    same(x, t)
    m = kiln.tensor([True, False])
    with pytest.raises(kiln.KilnError, match=r"\|=.*cannot be written into bool"):
        m |= 1  # an i64 result, as torch refuses


def test_float_operands_are_refused_naming_the_op_and_dtype():
    f = kiln.tensor([1.0, 2.0])
    i = kiln.tensor([1, 2])
    with pytest.raises(kiln.KilnError, match="bitwise_and: the second operand is f32"):
        i & f
    with pytest.raises(kiln.KilnError, match="bitwise_or: the first operand is f32"):
        f | i
    with pytest.raises(kiln.KilnError, match="bitwise_xor: the second operand is f32"):
        i ^ 1.5
    with pytest.raises(kiln.KilnError, match="bitwise_left_shift: the first operand is f16"):
        f.half() << 1
    with pytest.raises(TypeError, match=r"~ \(bitwise_not\) on f32"):
        ~f
    with pytest.raises(kiln.KilnError, match="bitwise_not: the operand is bf16"):
        kiln.bitwise_not(f.bfloat16())
    with pytest.raises(kiln.KilnError, match="bitwise_and: the first operand is f32"):
        f.requires_grad_()
        kiln.bitwise_and(f, i)


def test_in_place_shape_errors_name_the_op():
    # x |= y whose result is larger than x: refused naming |= before anything is computed (it named copy_'s
    # expand); shapes that do not broadcast name it too
    x = kiln.zeros(3, dtype=kiln.int64)
    with pytest.raises(kiln.KilnError, match=r"^\|=: cannot broadcast \[1,3\] into \[3\]"):
        x |= kiln.ones((1, 3), dtype=kiln.int64)
    with pytest.raises(kiln.KilnError, match=r"^bitwise_and_: shapes \[3\] and \[4\] do not broadcast"):
        x.bitwise_and_(kiln.ones(4, dtype=kiln.int64))
    with pytest.raises(RuntimeError):
        tx = torch.zeros(3, dtype=torch.int64)
        tx |= torch.ones((1, 3), dtype=torch.int64)
    assert x.tolist() == [0, 0, 0]


@pytest.mark.parametrize("number", [np.int32(2), np.uint8(200), np.int16(-3), np.int64(5)])
def test_numpy_integers_beside_a_bool_tensor_are_ints_as_torch(number):
    # torch takes a NumPy integer scalar as a Python int: beside a bool tensor the result is int64 (it
    # was the scalar's own dtype: mask + np.int32(2) int32, np.uint8(200) << mask wrapped in uint8)
    k, t = kiln.tensor([True, False]), torch.tensor([True, False])
    for op in (operator.add, operator.mul, operator.and_, operator.or_, operator.xor):
        same(op(k, number), op(t, number))
        same(op(number, k), op(number, t))
    same(np.uint8(200) << k, np.uint8(200) << t)
