# Engine errors become Python exceptions with the engine's message; bad arguments never crash the
# interpreter.
import numpy as np
import pytest

import kiln


def test_engine_error_type_and_message():
    with pytest.raises(kiln.KilnError) as e:
        kiln.matmul(kiln.zeros(2, 3), kiln.zeros(4, 5))
    assert isinstance(e.value, RuntimeError)
    assert "[2,3]" in str(e.value) and "[4,5]" in str(e.value)
    with pytest.raises(kiln.KilnError, match="broadcast"):
        kiln.zeros(2, 3) + kiln.zeros(4)


def test_argument_errors_are_value_errors():
    with pytest.raises(ValueError, match="dtype"):
        kiln.zeros(2, dtype="complex64")
    with pytest.raises(ValueError, match="device"):
        kiln.zeros(2, device="tpu")
    with pytest.raises(ValueError, match="size"):
        kiln.zeros(2, "3")
    with pytest.raises(TypeError):
        kiln.nn.functional.conv2d("x", kiln.zeros(1))
    with pytest.raises(ValueError, match="stride"):
        kiln.nn.functional.conv2d(kiln.zeros(1, 1, 4, 4), kiln.zeros(1, 1, 3, 3), stride=(1, 1, 1))
    with pytest.raises(ValueError, match="not numbers"):
        kiln.tensor(["a", "b"])
    with pytest.raises(kiln.KilnValueError):
        kiln.tensor([[1, 2], [3]])


def test_wrong_dtype_for_an_op():
    with pytest.raises(kiln.KilnError, match="i64|int"):
        kiln.nn.functional.embedding(kiln.zeros(2), kiln.zeros(3, 4))


@pytest.mark.skipif(kiln.cuda_is_available(), reason="checks the error without a GPU")
def test_missing_device():
    with pytest.raises(kiln.KilnError):
        kiln.zeros(2, device="cuda:0")


@pytest.mark.skipif(not kiln.cuda_is_available(), reason="needs a GPU")
def test_tensors_on_two_devices():
    with pytest.raises(kiln.KilnError, match="device"):
        kiln.zeros(2) + kiln.zeros(2, device="cuda")


def test_files_and_streams(tmp_path):
    import io

    buf = io.BytesIO()
    kiln.save({"w": kiln.arange(4)}, buf)
    buf.seek(0)
    assert kiln.load(buf)["w"].tolist() == [0, 1, 2, 3]
    with pytest.raises(kiln.KilnError, match="<stream>"):
        kiln.load(io.BytesIO(b"\x05\x00\x00\x00\x00\x00\x00\x00{}"))
    f = open(tmp_path / "x.safetensors", "wb")
    f.close()
    with pytest.raises(ValueError, match="closed file"):
        kiln.save({"w": kiln.zeros(1)}, f)
    with pytest.raises(kiln.KilnError, match="x.safetensors"):
        kiln.load(tmp_path / "x.safetensors")  # empty
    with pytest.raises(kiln.KilnError, match="missing.safetensors"):
        kiln.load(tmp_path / "missing.safetensors")
