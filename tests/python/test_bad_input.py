# Bad input from Python: a clear error naming the argument and what was wrong (kiln.KilnError and
# its ValueError / IndexError subclasses, TypeError for a wrong type, OverflowError for an int
# beyond int64), never an interpreter crash, a silently wrong result, a bare "std::bad_cast" or a
# nanobind "incompatible function arguments".
import math

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
    assert kiln.arange(2, 2).tolist() == []
    with pytest.raises(ValueError, match="inconsistent with step sign"):  # torch's error, not an empty range
        kiln.arange(3, 2)
    with pytest.raises(kiln.KilnError, match="arange: the step 0.5 leads from start 3 away from end 2"):
        kiln.arange(3, 2, 0.5)


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

def test_bitwise_operators_refuse_float_tensors():
    # ~ & | ^ are bitwise (logical on bool), as torch's: integers are taken, floats refused naming the op
    # (tests/python/test_bitwise_vs_torch.py has the values).
    i = kiln.tensor([1, 2])
    assert (~i).tolist() == [-2, -3]
    assert (i & kiln.tensor([2, 2])).tolist() == [0, 2]
    assert (i | 1).tolist() == [1, 3]
    with pytest.raises(TypeError, match=r"~ \(bitwise_not\) on f32"):
        ~kiln.tensor([1.0, 2.0])
    with pytest.raises(kiln.KilnError, match="bitwise_or: the second operand is f32"):
        i | 1.5
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


# ---- checkpoints and safetensors ----

def test_save_checkpoint_refuses_what_load_checkpoint_cannot_read(tmp_path):
    p = tmp_path / "c.kiln"
    t = {"w": kiln.ones(2)}
    with pytest.raises(kiln.KilnValueError, match=r"state\['a'\]\['b'\]\[1\] is a dict whose only key is '\$float'"):
        kiln.save_checkpoint(p, t, {"a": {"b": [1, {"$float": "inf"}]}})
    with pytest.raises(TypeError, match=r"state\['o'\] is an object"):
        kiln.save_checkpoint(p, t, {"o": object()})
    with pytest.raises(TypeError, match="state must be a dict"):
        kiln.save_checkpoint(p, t, [1, 2])
    with pytest.raises(TypeError, match="int key 1"):
        kiln.save_checkpoint(p, t, {1: 2})
    assert not p.exists()
    kiln.save_checkpoint(p, t, {"v": 1.5, "s": [None, True, "x"]})
    assert kiln.load_checkpoint(p)[1] == {"v": 1.5, "s": [None, True, "x"]}


def test_save_names_the_bad_entry(tmp_path):
    with pytest.raises(TypeError, match="'a' is an int, expected kiln.Tensor"):
        kiln.save({"a": 5}, tmp_path / "x.safetensors")
    with pytest.raises(TypeError, match="tensor names must be str"):
        kiln.save({1: kiln.ones(1)}, tmp_path / "x.safetensors")
    with pytest.raises(TypeError, match="metadata"):
        kiln.save({"a": kiln.ones(1)}, tmp_path / "x.safetensors", metadata={"k": 1})


# ---- optimizers, schedules ----

def test_optimizer_param_groups_are_checked():
    ps = list(kiln.nn.Linear(2, 2).parameters())
    with pytest.raises(TypeError, match="group 0: lr: expected a number, got str"):
        kiln.optim.SGD([{"params": ps, "lr": "x"}])
    with pytest.raises(kiln.KilnValueError, match="unknown key 'lrr'"):
        kiln.optim.SGD([{"params": ps, "lrr": 0.1}])
    with pytest.raises(TypeError, match="params"):
        kiln.optim.SGD([{"params": [1.0]}])
    with pytest.raises(kiln.KilnValueError, match="betas"):
        kiln.optim.AdamW(ps, betas=(0.9,))
    with pytest.raises(kiln.KilnValueError, match=r"betas\[1\]"):
        kiln.optim.AdamW(ps, betas=(0.9, 1.5))
    opt = kiln.optim.SGD(ps)
    with pytest.raises(kiln.KilnValueError, match="'tensors' and 'scalars'"):
        opt.load_state_dict({})
    opt.load_state_dict(opt.state_dict())


def test_lr_schedule_step_out_of_range():
    s = kiln.optim.LrSchedule("constant", 0.1)
    assert s(3) == pytest.approx(0.1)
    with pytest.raises(OverflowError, match="step"):
        s(2**64)
    with pytest.raises(TypeError, match="step"):
        s("3")


# ---- modules ----

def test_module_arguments():
    with pytest.raises(kiln.KilnValueError, match="in_features must be an int >= 0, got -1"):
        kiln.nn.Linear(-1, 2)
    lin = kiln.nn.Linear(0, 2)  # as torch: no inputs, the bias' bound is 0
    assert lin(kiln.zeros(4, 0)).tolist() == [[0.0, 0.0]] * 4
    with pytest.raises(kiln.KilnValueError, match="groups"):
        kiln.nn.Conv2d(3, 4, 3, groups=2)
    m = kiln.nn.Linear(2, 1)
    with pytest.raises(TypeError, match="'weight' is a list"):
        m.load_state_dict({"weight": [[1.0, 2.0]], "bias": kiln.zeros(1)})
    with pytest.raises(TypeError, match="'weight' is a NoneType"):
        m.load_state_dict({"weight": None, "bias": None})
    with pytest.raises(kiln.KilnValueError, match="neither a device nor a dtype|neither a device"):
        m.to("tpu")
    m.to("float64")
    assert m.weight.dtype == kiln.float64


def test_parameter_from_array_likes():
    p = kiln.nn.Parameter([1.0, 2.0])
    assert p.requires_grad and p.tolist() == [1.0, 2.0]
    q = kiln.nn.Parameter(np.arange(3, dtype=np.float32))
    assert q.tolist() == [0.0, 1.0, 2.0]


def test_zoo_model_takes_arrays():
    m = kiln.models.create("resnet20")
    assert m(np.zeros((1, 3, 32, 32), np.float32)).shape == (1, 10)
    with pytest.raises(TypeError, match="input 'input'"):
        m("x")
    with pytest.raises(kiln.KilnValueError, match="unknown input 'images'"):
        m.run(images=kiln.zeros(1, 3, 32, 32))


# ---- autograd.Function ----

def _fn(fwd, bwd=None):
    return type("MyFn", (kiln.autograd.Function,),
                {"forward": staticmethod(fwd), "backward": staticmethod(bwd or (lambda ctx, g: g))})


@pytest.mark.parametrize("ret, what", [(1, "got int"), (None, "got NoneType"), ((), "no tensors")])
def test_function_forward_must_return_tensors(ret, what):
    x = kiln.randn(3, requires_grad=True)
    with pytest.raises(kiln.KilnError, match=f"MyFn.forward.*{what}"):
        _fn(lambda ctx, x: ret).apply(x)


def test_function_backward_gradient_shape():
    x = kiln.randn(3, requires_grad=True)
    y = _fn(lambda ctx, x: x * 2, lambda ctx, g: kiln.ones(7)).apply(x)
    with pytest.raises(kiln.KilnError, match=r"MyFn.backward returned a gradient of shape \(7,\) for input 0, "
                                             r"which has shape \(3,\)"):
        y.sum().backward()
    y = _fn(lambda ctx, x: x.sum(), lambda ctx, g: g).apply(x)
    with pytest.raises(kiln.KilnError, match=r"shape \(\) for input 0"):
        y.backward()
    # a gradient larger by broadcasting is summed down, as torch does
    y = _fn(lambda ctx, x: x * 2, lambda ctx, g: g.expand(2, 3) * 1.0).apply(x)
    y.sum().backward()
    assert x.grad.tolist() == [2.0, 2.0, 2.0]


# ---- nn.functional ----

def test_pooling_and_resampling_arguments():
    F = kiln.nn.functional
    x = kiln.ones(1, 1, 4, 4)
    with pytest.raises(kiln.KilnValueError, match="stride must be positive, got 0"):
        F.max_pool2d(x, 2, stride=0)
    with pytest.raises(kiln.KilnValueError, match="stride"):
        F.avg_pool1d(kiln.ones(1, 1, 4), 2, stride=0)
    with pytest.raises(kiln.KilnValueError, match="divisor_override"):
        F.avg_pool2d(x, 2, divisor_override=0)
    with pytest.raises(kiln.KilnValueError, match="only one of size or scale_factor"):
        F.interpolate(x, size=2, scale_factor=2)
    y, idx = F.max_pool2d(x, 2, return_indices=True)
    with pytest.raises(kiln.KilnValueError, match="output_size 1 .* between 3 and 5"):
        F.max_unpool2d(y, idx, 2, output_size=(1, 1))
    assert F.max_unpool2d(y, idx, 2, output_size=(5, 5)).shape == (1, 1, 5, 5)
    assert F.max_pool2d(x, 2).shape == (1, 1, 2, 2)


# ---- kiln.train ----

TRAIN = dict(epochs=1, max_steps=2, batch=16, limit_train=32, limit_eval=16, log_every=1, threads=2, seed=5,
             workers=0, progress="lines")


def test_train_help_and_list_options(tmp_path, capsys):
    assert kiln.train(help=True, out=tmp_path / "h") is None
    assert "--batch" in capsys.readouterr().out
    assert kiln.train(help=True) is None  # as docs/python.md shows it: no run, so no `out`
    assert "--batch" in capsys.readouterr().out
    with pytest.raises(TypeError, match="give out=, the run directory"):
        kiln.train("resnet20", **TRAIN)
    with pytest.raises(kiln.KilnValueError, match="batch takes one value, got 2"):
        kiln.train("resnet20", out=tmp_path / "b", **dict(TRAIN, batch=[8, 16]))


@pytest.mark.parametrize("ret", ["no", {}])
def test_train_callback_must_return_a_bool(tmp_path, ret):
    with pytest.raises(TypeError, match=f"callback returned a {type(ret).__name__}"):
        kiln.train("resnet20", out=tmp_path / "c", callback=lambda r: ret, **TRAIN)



def test_inplace_ops_follow_the_result_type():
    x = kiln.tensor([3, 7, -5])
    for op in ("x /= 2", "x *= 1.5", "x -= 0.5", "x += 1.5", "x /= kiln.tensor([2, 2, 2])"):
        with pytest.raises(kiln.KilnError, match="cannot be written into"):
            exec(op, {"x": x, "kiln": kiln})
    assert x.tolist() == [3, 7, -5]  # nothing written
    x *= 2
    assert x.tolist() == [6, 14, -10]


def test_inplace_ops_with_overlapping_operands_match_numpy():
    a = np.arange(9, dtype=np.float32).reshape(3, 3)
    x = kiln.tensor(a)
    x += x.T
    assert x.tolist() == (a + a.T).tolist()
    y = kiln.ones(5)
    y[1:] += y[:-1]
    assert y.tolist() == [1, 2, 2, 2, 2]
    z = kiln.zeros(1, 3)
    with pytest.raises(kiln.KilnError, match="share memory"):
        z.expand(3, 3).__iadd__(1.0)
    assert z.tolist() == [[0, 0, 0]]


def test_sizes_that_overflow_are_errors():
    with pytest.raises(kiln.KilnError, match="more elements than fit in 64 bits"):
        kiln.zeros(2**32, 2**32)
    with pytest.raises(kiln.KilnError, match="more elements than fit in 64 bits"):
        kiln.ones(1, 1).expand(2**32, 2**32)
    with pytest.raises(kiln.KilnError):
        kiln.zeros(1).expand(-5)
    assert kiln.arange(10)[:: 2**63 - 1].tolist() == [0]


def test_var_with_a_large_correction_is_inf_not_negative():
    assert math.isinf(kiln.var(kiln.tensor([1.0, 2.0, 4.0]), correction=5).item())


def test_grad_setter_checks_the_gradient():
    w = kiln.nn.Parameter(kiln.ones(3))
    with pytest.raises(kiln.KilnError, match="must be floating"):
        w.grad = kiln.ones(3, dtype=kiln.int64)
    with pytest.raises(kiln.KilnError, match="gradient on meta"):
        w.grad = kiln.ones(3, device="meta")


def test_optimizer_lr_must_be_finite_and_non_negative():
    w = kiln.nn.Parameter(kiln.ones(3))
    with pytest.raises(kiln.KilnError, match="lr must be finite"):
        kiln.optim.SGD([w], lr=float("inf"))
    with pytest.raises(kiln.KilnError, match="lr must be finite and >= 0, got -0.1"):
        kiln.optim.SGD([w], lr=-0.1)
    opt = kiln.optim.SGD([w], lr=0.1)
    with pytest.raises(kiln.KilnError, match="lr must be finite"):
        opt.lr = float("nan")
    opt.lr = -5.0  # kept, as torch keeps a schedule's last lr below 0; refused at the step
    w.grad = kiln.ones(3)
    with pytest.raises(kiln.KilnError, match=r"group 0's lr is -5(\.0)? at this step"):
        opt.step()
    with pytest.raises(kiln.KilnError, match="also parameter 0"):
        kiln.optim.SGD([w, w], lr=0.1)


def test_errors_in_composite_ops_name_the_op_called():
    cases = {
        "nll_loss": lambda: kiln.nll_loss(kiln.randn(2, 5).log_softmax(1), kiln.tensor([9, 1])),
        "embedding": lambda: kiln.embedding(kiln.tensor([5]), kiln.randn(3, 4)),
        "masked_fill": lambda: kiln.masked_fill(kiln.randn(3), kiln.tensor([True, False]), 0.0),
        "einsum": lambda: kiln.einsum("ij->ii", kiln.randn(3, 3)),
    }
    for op, f in cases.items():
        with pytest.raises(kiln.KilnError, match=op + ": "):
            f()


def test_tied_parameters_are_stepped_once_and_kept_under_every_name():
    class Tied(kiln.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = kiln.nn.Linear(3, 3, bias=False)
            self.b = kiln.nn.Linear(3, 3, bias=False)
            self.b.weight = self.a.weight  # weight tying

    m = Tied()
    assert [n for n, _ in m.named_parameters()] == ["a.weight"]
    assert list(m.state_dict()) == ["a.weight", "b.weight"]
    opt = kiln.optim.SGD(m.parameters(), lr=0.1)  # no "listed twice" error
    before = m.a.weight.tolist()
    (m.b(m.a(kiln.ones(1, 3)))).sum().backward()
    g = m.a.weight.grad.tolist()
    opt.step()
    after = m.a.weight.tolist()
    assert all(abs(after[i][j] - (before[i][j] - 0.1 * g[i][j])) < 1e-6 for i in range(3) for j in range(3))


def test_sizes_take_numpy_integers():
    layer = kiln.nn.Linear(np.prod((2, 3)), np.int64(4))
    assert tuple(layer.weight.shape) == (4, 6)
