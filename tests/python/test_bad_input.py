# Bad input from Python: a clear error naming the argument and what was wrong (kiln.KilnError and
# its ValueError / IndexError subclasses, TypeError for a wrong type, OverflowError for an int
# beyond int64), never an interpreter crash, a silently wrong result, a bare "std::bad_cast" or a
# nanobind "incompatible function arguments".
import numpy as np
import pytest

import kiln


# ---- arange ----

def test_arange_dtype_follows_the_arguments():
    t = kiln.arange(0., 1., 0.1)
    assert t.dtype == kiln.float32
    np.testing.assert_allclose(t.numpy(), np.arange(0, 1, 0.1, dtype=np.float32), rtol=1e-6, atol=1e-7)
    assert kiln.arange(5).dtype == kiln.int64
    assert kiln.arange(0, 5, 1.0).dtype == kiln.float32
    assert kiln.arange(2.5).tolist() == [0.0, 1.0, 2.0]
    assert kiln.arange(5, dtype=kiln.float64).dtype == kiln.float64
    assert kiln.arange(10, 0, -3).tolist() == [10, 7, 4, 1]
    assert kiln.arange(3, 2).tolist() == []


def test_arange_is_exact_for_large_int64():
    assert kiln.arange(2**53, 2**53 + 4).tolist() == [2**53, 2**53 + 1, 2**53 + 2, 2**53 + 3]
    with pytest.raises(ValueError, match="step"):
        kiln.arange(0, 5, 0)


# ---- indexing ----

def test_index_with_none_and_bools():
    x = kiln.arange(6).reshape(2, 3)
    assert x[None].shape == (1, 2, 3)
    assert x[True].shape == (1, 2, 3)
    assert x[False].shape == (0, 2, 3)
    assert x[None, True, 1].shape == (1, 1, 3)
    assert x[..., False].shape == (2, 3, 0)
    y = kiln.zeros(2, 3)
    y[None] = 5
    assert y.tolist() == [[5.0] * 3] * 2


def test_numpy_integer_scalar_index_drops_the_dim():
    x = kiln.arange(6).reshape(2, 3)
    assert x[np.int64(1)].tolist() == [3, 4, 5]
    assert x[np.int32(-1)].shape == (3,)
    assert x[np.array(1)].shape == (3,)


def test_huge_index_is_an_index_error():
    x = kiln.arange(6)
    with pytest.raises(kiln.KilnIndexError, match="1180591620717411303424"):
        x[2**70]


# ---- ~ & | ^ ----

def test_logical_operators_refuse_non_bool_tensors():
    i = kiln.tensor([1, 2])
    with pytest.raises(TypeError, match="logical.*bool"):
        ~i
    with pytest.raises(TypeError, match="bool"):
        ~kiln.tensor([1.0, 2.0])
    with pytest.raises(TypeError, match="bitwise"):
        i & kiln.tensor([2, 2])
    with pytest.raises(TypeError, match="bool"):
        i | 1
    b = kiln.tensor([True, False])
    assert (~b).tolist() == [False, True]
    assert (b & kiln.tensor([True, True])).tolist() == [True, False]
    assert (b | False).tolist() == [True, False]
    assert (b ^ True).tolist() == [False, True]
    assert (True & b).tolist() == [True, False]


# ---- Python ints beyond int64 ----

def test_ints_beyond_int64_are_errors():
    with pytest.raises(OverflowError, match="18446744073709551616"):
        kiln.ones(2, dtype=kiln.int64) + 2**64
    with pytest.raises(OverflowError, match="int64"):
        kiln.tensor([1, 2]) * -2**70
    with pytest.raises(ValueError, match="randint"):
        kiln.randint(-2**63, 2**63 - 1, (3,))
    with pytest.raises(OverflowError, match="size"):
        kiln.zeros(2**63)
    with pytest.raises(OverflowError, match="int64"):
        kiln.zeros(2, dtype=kiln.int64)[0] = 2**64


def test_large_int64_scalars_are_exact():
    z = kiln.zeros(2, dtype=kiln.int64)
    z[0] = 2**60 + 1
    assert z.tolist() == [2**60 + 1, 0]
    assert (z + 2**60).tolist() == [2**61 + 1, 2**60]


# ---- NumPy arrays Kiln cannot take ----

@pytest.mark.parametrize("dtype", [np.longdouble, "datetime64[s]", [("a", "f4"), ("b", "i4")], object])
def test_numpy_dtypes_without_a_kiln_dtype(dtype):
    a = np.zeros(3, dtype=dtype)
    with pytest.raises(kiln.KilnValueError, match="no Kiln dtype"):
        kiln.from_numpy(a)


def test_big_endian_arrays():
    a = np.arange(3, dtype=">f4")
    assert kiln.tensor(a).tolist() == [0.0, 1.0, 2.0]  # a copy: converted
    assert kiln.tensor(np.arange(3, dtype=">i8")).tolist() == [0, 1, 2]
    with pytest.raises(kiln.KilnValueError, match="big-endian"):
        kiln.from_numpy(a)


def test_stride_not_a_multiple_of_the_itemsize():
    a = np.ndarray(shape=(3,), dtype=np.float32, buffer=bytearray(20), offset=0, strides=(5,))
    with pytest.raises(kiln.KilnValueError, match="not a multiple of its item size"):
        kiln.from_numpy(a)
    assert kiln.tensor(a).tolist() == [0.0, 0.0, 0.0]


# ---- messages with bytes that are not UTF-8 ----

def test_corrupt_safetensors_header_is_a_kiln_error(tmp_path):
    p = tmp_path / "c.safetensors"
    kiln.save({"a": kiln.ones(3)}, p)
    b = bytearray(p.read_bytes())
    b[8] ^= 0xFF
    p.write_bytes(bytes(b))
    with pytest.raises(kiln.KilnError, match="header"):
        kiln.load(p)


# ---- None and other operands ----

def test_none_operands():
    t = kiln.ones(2)
    with pytest.raises(TypeError, match="unsupported operand"):
        t + None
    with pytest.raises(TypeError, match="unsupported operand"):
        t += None
    assert (t == None) is False  # noqa: E711  (as torch)
    assert (t != None) is True  # noqa: E711
    with pytest.raises(kiln.KilnValueError, match="data: cannot make a tensor from None"):
        kiln.tensor(None)


def test_manual_seed_takes_any_int_modulo_2_64():
    kiln.manual_seed(-1)
    a = kiln.rand(3).tolist()
    kiln.manual_seed(2**64 - 1)
    assert kiln.rand(3).tolist() == a
    kiln.manual_seed(2**64)
    b = kiln.rand(3).tolist()
    kiln.manual_seed(0)
    assert kiln.rand(3).tolist() == b
    with pytest.raises(TypeError, match="seed"):
        kiln.manual_seed("1")


def test_tensor_to_an_unknown_name():
    with pytest.raises(kiln.KilnValueError, match="neither a device"):
        kiln.ones(2).to("tpu")
