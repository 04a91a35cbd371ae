# The Python bindings of the [ops] functions against PyTorch on the same float64 inputs: each case
# runs both, compares every output (values and integer indices exactly, floats to 1e-10) and, where
# the op is differentiable, the gradient of a random weighting of the outputs.
import numpy as np
import pytest

import kiln

torch = pytest.importorskip("torch")
F = kiln.nn.functional
TF = torch.nn.functional

RNG = np.random.default_rng(11)


def arr(*shape, lo=None):
    a = RNG.standard_normal(shape)
    return np.abs(a) + lo if lo is not None else a


def both(a, grad=True):
    return kiln.tensor(a, requires_grad=grad), torch.tensor(a, requires_grad=grad)


def as_list(out):
    return list(out) if isinstance(out, (tuple, list)) else [out]


def compare(kouts, touts, kins, tins, what):
    kouts, touts = as_list(kouts), as_list(touts)
    assert len(kouts) == len(touts), what
    kloss, tloss = None, None
    for i, (k, t) in enumerate(zip(kouts, touts)):
        kn = np.asarray(k.detach().tolist()) if not k.dtype.is_floating_point else k.detach().numpy()
        tn = t.detach().numpy()
        assert kn.shape == tn.shape, (what, i, kn.shape, tn.shape)
        if t.dtype.is_floating_point:
            assert np.allclose(kn, tn, rtol=1e-10, atol=1e-10, equal_nan=True), (what, i, np.abs(kn - tn).max())
            if t.requires_grad:
                w = RNG.standard_normal(tn.shape)
                kt = (k * kiln.tensor(w)).sum()
                tt = (t * torch.tensor(w)).sum()
                kloss = kt if kloss is None else kloss + kt
                tloss = tt if tloss is None else tloss + tt
        else:
            assert np.array_equal(kn, tn), (what, i)
    if kloss is not None:
        kloss.backward()
        tloss.backward()
        for j, (ki, ti) in enumerate(zip(kins, tins)):
            if ti.grad is not None:
                assert ki.grad is not None, (what, "input", j)
                assert np.allclose(ki.grad.numpy(), ti.grad.numpy(), rtol=1e-9, atol=1e-10), (what, "grad", j)


def case_conv3d():
    (kx, tx), (kw, tw) = both(arr(2, 4, 5, 6, 4)), both(arr(6, 2, 3, 2, 3))
    return (F.conv3d(kx, kw, None, (2, 1, 1), (1, 0, 1), (1, 2, 1), 2),
            TF.conv3d(tx, tw, None, (2, 1, 1), (1, 0, 1), (1, 2, 1), 2), [kx, kw], [tx, tw])


def case_conv_transpose1d():
    (kx, tx), (kw, tw), (kb, tb) = both(arr(2, 4, 13)), both(arr(4, 3, 4)), both(arr(6))
    return (F.conv_transpose1d(kx, kw, kb, 2, 1, 1, 2, 2), TF.conv_transpose1d(tx, tw, tb, 2, 1, 1, 2, 2),
            [kx, kw, kb], [tx, tw, tb])


def case_interpolate():
    kx, tx = both(arr(2, 3, 5, 6))
    return ([F.interpolate(kx, size=(7, 9), mode="bilinear", align_corners=True),
             F.interpolate(kx, scale_factor=2, mode="bicubic"), F.upsample(kx, size=(8, 4)),
             kiln.nn.Upsample(size=(3, 11), mode="bilinear")(kx),
             # a scale that is not whole: source steps of 1 / scale, not in / out (5 -> 7 at 1.5)
             F.interpolate(kx, scale_factor=(1.5, 0.7), mode="bilinear"),
             F.interpolate(kx, scale_factor=1.5, mode="bicubic"),
             F.interpolate(kx, scale_factor=(2.3, 1.7)),
             F.interpolate(kx, scale_factor=1.5, mode="bilinear", recompute_scale_factor=True),
             kiln.nn.Upsample(scale_factor=1.5, mode="bilinear")(kx)],
            [TF.interpolate(tx, size=(7, 9), mode="bilinear", align_corners=True),
             TF.interpolate(tx, scale_factor=2, mode="bicubic"), TF.interpolate(tx, size=(8, 4)),
             torch.nn.Upsample(size=(3, 11), mode="bilinear")(tx),
             TF.interpolate(tx, scale_factor=(1.5, 0.7), mode="bilinear"),
             TF.interpolate(tx, scale_factor=1.5, mode="bicubic"),
             TF.interpolate(tx, scale_factor=(2.3, 1.7)),
             TF.interpolate(tx, scale_factor=1.5, mode="bilinear", recompute_scale_factor=True),
             torch.nn.Upsample(scale_factor=1.5, mode="bilinear")(tx)], [kx], [tx])


def case_embedding_padding():
    # padding_idx counts from the end when negative (-1: the last row), in the function and the module
    (kw, tw) = both(arr(5, 3))
    idx = [[0, 4, 4], [3, 1, 4]]
    km = kiln.nn.Embedding(5, 3, padding_idx=-2)
    assert km.padding_idx == torch.nn.Embedding(5, 3, padding_idx=-2).padding_idx == 3
    assert np.all(km.weight.detach().numpy()[3] == 0)
    km(kiln.tensor([[3, 3, 0]])).sum().backward()
    assert np.all(km.weight.grad.numpy()[3] == 0) and np.all(km.weight.grad.numpy()[0] == 1)
    return ([F.embedding(kiln.tensor(idx), kw, padding_idx=-1), F.embedding(kiln.tensor(idx), kw, padding_idx=1)],
            [TF.embedding(torch.tensor(idx), tw, padding_idx=-1), TF.embedding(torch.tensor(idx), tw, padding_idx=1)],
            [kw], [tw])


def case_scatter():
    (kx, tx), (ks, ts) = both(arr(4, 5)), both(arr(3, 5))
    idx = RNG.integers(0, 4, size=(3, 5))
    ki, ti = kiln.tensor(idx), torch.tensor(idx)
    # torch has no gradient for scatter's reduce=: those two compare values only
    kd, ksd, td, tsd = kx.detach(), ks.detach(), tx.detach(), ts.detach()
    return ([kiln.scatter_reduce(kx, 0, ki, ks, "amax", include_self=False), kiln.scatter(kd, 0, ki, ksd, reduce="add"),
             kiln.scatter(kd, 0, ki, ksd, reduce="multiply")],
            [torch.scatter_reduce(tx, 0, ti, ts, "amax", include_self=False), torch.scatter(td, 0, ti, tsd, reduce="add"),
             torch.scatter(td, 0, ti, tsd, reduce="multiply")], [kx, ks], [tx, ts])


def case_shorter_indices():
    # indices shorter than input (outside dim) and than src in any dim: torch reads and writes only the
    # part they cover. torch's backward refuses a src larger than the indices, so its gradient is compared
    # with torch's through the slice the indices cover (Kiln's: zeros beyond it); scatter's src gradient
    # is Kiln's own rule (only the write that lands gets it: engine/nn_ops.h), so it is left out.
    (kx, tx), (ks, ts), (kx3, tx3) = both(arr(4, 6)), both(arr(5, 7)), both(arr(3, 5, 4))
    idx = RNG.integers(0, 4, size=(3, 4))
    ki, ti = kiln.tensor(idx), torch.tensor(idx)
    idx3 = RNG.integers(0, 5, size=(2, 3, 2))
    ki3, ti3 = kiln.tensor(idx3), torch.tensor(idx3)
    tsp = ts[:3, :4]
    kouts = [kiln.gather(kx, 0, ki), kiln.gather(kx3, 1, ki3), kiln.scatter_add(kx, 0, ki, ks),
             kiln.scatter(kx, 0, ki, ks.detach()), kiln.scatter_reduce(kx, 0, ki, ks, "mean", include_self=False),
             kiln.scatter_reduce(kx, 0, ki, ks, "amin"), kiln.scatter_reduce(kx, 0, ki, ks, "prod"),
             kiln.gather(kx, 1, ki[:, :2])]
    touts = [torch.gather(tx, 0, ti), torch.gather(tx3, 1, ti3), torch.scatter_add(tx, 0, ti, tsp),
             torch.scatter(tx, 0, ti, tsp.detach()), torch.scatter_reduce(tx, 0, ti, tsp, "mean", include_self=False),
             torch.scatter_reduce(tx, 0, ti, tsp, "amin"), torch.scatter_reduce(tx, 0, ti, tsp, "prod"),
             torch.gather(tx, 1, ti[:, :2])]
    # the values with the larger src itself, as torch reads it
    td, tsd = tx.detach(), ts.detach()
    kouts += [kiln.scatter_add(kx.detach(), 0, ki, ks.detach()), kiln.scatter(kx.detach(), 0, ki, ks.detach())]
    touts += [torch.scatter_add(td, 0, ti, tsd), torch.scatter(td, 0, ti, tsd)]
    return kouts, touts, [kx, ks, kx3], [tx, ts, tx3]


def test_shorter_indices_refusals_as_torch():
    x, i = kiln.zeros(3, 4), kiln.zeros(2, 5, dtype=kiln.int64)
    with pytest.raises(RuntimeError, match=r"gather: indices \[2,5\] must be no larger than input \[3,4\] outside dim 0"):
        kiln.gather(x, 0, i)
    with pytest.raises(RuntimeError, match=r"scatter_add: indices \[2,3\] must be no larger than src \[2,2\]"):
        kiln.scatter_add(x, 0, kiln.zeros(2, 3, dtype=kiln.int64), kiln.ones(2, 2))
    with pytest.raises(RuntimeError):
        torch.scatter_add(torch.zeros(3, 4), 0, torch.zeros(2, 3, dtype=torch.int64), torch.ones(2, 2))
    with pytest.raises(RuntimeError, match="must be no larger than input"):
        kiln.scatter(x, 1, kiln.zeros(4, 2, dtype=kiln.int64), kiln.ones(4, 2))
    with pytest.raises(RuntimeError):
        torch.scatter(torch.zeros(3, 4), 1, torch.zeros(4, 2, dtype=torch.int64), torch.ones(4, 2))


def case_indexing():
    (kx, tx), (kv, tv) = both(arr(5, 4)), both(arr(3, 4))
    rows = np.array([4, 0, 4])
    mask = RNG.random((5, 4)) < 0.4
    (ksrc, tsrc) = both(arr(20))
    tidx = RNG.integers(0, 4, size=(5, 2))
    return ([kiln.index_put(kx, [kiln.tensor(rows)], kv, accumulate=True),
             kiln.masked_scatter(kx, kiln.tensor(mask), ksrc),
             kiln.take_along_dim(kx, kiln.tensor(tidx), 1),
             kiln.nn.functional.one_hot(kiln.tensor([0, 3, 2]), 5),
             kiln.nn.functional.one_hot(kiln.tensor([0, 7, 2]), 5, out_of_range="zeros").sum()],
            [torch.index_put(tx, (torch.tensor(rows),), tv, accumulate=True),
             torch.masked_scatter(tx, torch.tensor(mask), tsrc),
             torch.take_along_dim(tx, torch.tensor(tidx), 1),
             TF.one_hot(torch.tensor([0, 3, 2]), 5),
             torch.tensor(2)], [kx, kv, ksrc], [tx, tv, tsrc])


def case_scans():
    x = arr(6, 7)
    x[2, 3] = x[2, 5]  # a tie for mode and kthvalue
    ints = RNG.integers(0, 3, size=(6, 7)).astype(np.float64)
    (kx, tx), (kn, tn) = both(x), both(ints, grad=False)
    kk, tk = kiln.kthvalue(kx, 3, 1), torch.kthvalue(tx, 3, 1)
    kc, tc = kiln.cummax(kx, 0), torch.cummax(tx, 0)
    km, tm = kiln.mode(kn, 1), torch.mode(tn, 1)
    return ([kk[0], kk[1], kc[0], kc[1], km[0], km[1]], [tk[0], tk[1], tc[0], tc[1], tm[0], tm[1]], [kx], [tx])


def case_math():
    x = arr(4, 5)
    x[0, 0], x[1, 1], x[2, 2] = np.nan, np.inf, -np.inf
    (kx, tx), (ka, ta), (kb, tb) = both(x, grad=False), both(arr(4, 5)), both(arr(4, 5))
    return ([kiln.nan_to_num(kx), kiln.nan_to_num(kx, 1.0, 5.0, -5.0), kiln.lerp(ka, kb, 0.3),
             kiln.lerp(ka, kb, kiln.tensor(np.full((4, 5), 0.7)))],
            [torch.nan_to_num(tx), torch.nan_to_num(tx, 1.0, 5.0, -5.0), torch.lerp(ta, tb, 0.3),
             torch.lerp(ta, tb, torch.tensor(np.full((4, 5), 0.7)))], [ka, kb], [ta, tb])


def case_norms():
    (kx, tx), (kg, tg), (kb, tb), (kw, tw) = both(arr(2, 6, 4, 3)), both(arr(6)), both(arr(6)), both(arr(4, 3))
    return ([F.group_norm(kx, 3, kg, kb), F.rms_norm(kx, (4, 3), kw, 1e-6)],
            [TF.group_norm(tx, 3, tg, tb), TF.rms_norm(tx, (4, 3), tw, 1e-6)], [kx, kg, kb, kw], [tx, tg, tb, tw])


def case_batch_norm_relu():
    # The fused op against torch's batch norm, add and relu in a row (training, then eval).
    (kx, tx), (kg, tg), (kb, tb), (kr, tr) = both(arr(4, 3, 5, 6)), both(arr(3)), both(arr(3)), both(arr(4, 3, 5, 6))
    rm, rv = np.full(3, 0.2), np.full(3, 1.5)
    k_rm, k_rv, t_rm, t_rv = kiln.tensor(rm), kiln.tensor(rv), torch.tensor(rm), torch.tensor(rv)
    return ([F.batch_norm_relu(kx, k_rm, k_rv, kg, kb, True, 0.1, 1e-5, residual=kr),
             F.batch_norm_relu(kx, kiln.tensor(rm), kiln.tensor(rv), kg, kb, False), k_rm, k_rv],
            [torch.relu(TF.batch_norm(tx, t_rm, t_rv, tg, tb, True, 0.1, 1e-5) + tr),
             torch.relu(TF.batch_norm(tx, torch.tensor(rm), torch.tensor(rv), tg, tb, False)), t_rm, t_rv],
            [kx, kg, kb, kr], [tx, tg, tb, tr])


def case_activations_and_losses():
    (kx, tx), (kw, tw) = both(arr(3, 4, 6)), both(arr(4, lo=0.05))
    (kl, tl), (kt, tt) = both(arr(5, 7)), both(arr(5, 7, lo=0.0), grad=False)
    lp_k, lp_t = F.log_softmax(kl, -1), TF.log_softmax(tl, -1)
    q_k, q_t = F.softmax(kt, -1), TF.softmax(tt, -1)
    return ([F.glu(kx, -1), F.prelu(kx, kw), F.kl_div(lp_k, q_k, reduction="batchmean")],
            [TF.glu(tx, -1), TF.prelu(tx, tw), TF.kl_div(lp_t, q_t, reduction="batchmean")], [kx, kw, kl], [tx, tw, tl])


def case_shapes():
    kx, tx = both(arr(2, 3, 5, 6))
    return ([F.pad(kx, (2, 1, 1, 3), mode="reflect"), F.pad(kx, (1, 2, 2, 0), mode="circular"),
             F.pad(kx, (3, 0, 1, 1), mode="replicate"), kiln.tile(kx, (2, 1, 1)), kx.repeat(1, 2, 1, 2),
             kiln.roll(kx, (2, -1), (2, 3)), kiln.roll(kx, 7), kiln.flip(kx, (1, 3))],
            [TF.pad(tx, (2, 1, 1, 3), mode="reflect"), TF.pad(tx, (1, 2, 2, 0), mode="circular"),
             TF.pad(tx, (3, 0, 1, 1), mode="replicate"), torch.tile(tx, (2, 1, 1)), tx.repeat(1, 2, 1, 2),
             torch.roll(tx, (2, -1), (2, 3)), torch.roll(tx, 7), torch.flip(tx, (1, 3))], [kx], [tx])


def case_pool3d():
    kx, tx = both(arr(2, 2, 5, 6, 7))
    return ([F.avg_pool3d(kx, (3, 2, 3), (2, 2, 2), (1, 1, 1), True, False),
             F.avg_pool3d(kx, 2, divisor_override=5)],
            [TF.avg_pool3d(tx, (3, 2, 3), (2, 2, 2), (1, 1, 1), True, False),
             TF.avg_pool3d(tx, 2, divisor_override=5)], [kx], [tx])


CASES = [case_conv3d, case_conv_transpose1d, case_interpolate, case_embedding_padding, case_scatter, case_shorter_indices,
         case_indexing, case_scans, case_math,
         case_norms, case_batch_norm_relu, case_activations_and_losses, case_shapes, case_pool3d]


@pytest.mark.filterwarnings("ignore:The reduce argument of torch.scatter")  # torch's own deprecation
@pytest.mark.parametrize("case", CASES, ids=[c.__name__[5:] for c in CASES])
def test_op_matches_torch(case):
    kouts, touts, kins, tins = case()
    compare(kouts, touts, kins, tins, case.__name__)


def test_load_state_dict_names_what_it_left_out():
    model = kiln.models.create("bert-tiny-mlm")
    sd = dict(model.state_dict())
    extra = dict(sd)
    extra["bert.pooler.dense.weight"] = kiln.zeros(2, 2)
    dropped = next(iter(sd))
    del extra[dropped]
    missing, unexpected = model.load_state_dict(extra, strict=False)
    assert missing == [dropped] and unexpected == ["bert.pooler.dense.weight"]
    res = model.load_state_dict(sd)
    assert res.missing_keys == [] and res.unexpected_keys == []
    lin = kiln.nn.Linear(2, 3)
    res = lin.load_state_dict({"weight": kiln.zeros(3, 2), "bias": kiln.zeros(3), "extra": kiln.zeros(1)}, strict=False)
    assert res.unexpected_keys == ["extra"] and res.missing_keys == []


def test_result_type_and_promotion_with_0dim_operands_match_torch():
    # a 0-dim tensor next to a dimensioned one counts only by category (bool < integer < floating)
    names = ["bool", "uint8", "int8", "int32", "int64", "float16", "bfloat16", "float32", "float64"]
    for d in names:
        for z in names:
            kd, kz = kiln.ones(2, dtype=getattr(kiln, d)), kiln.ones((), dtype=getattr(kiln, z))
            td, tz = torch.ones(2, dtype=getattr(torch, d)), torch.ones((), dtype=getattr(torch, z))
            want = str(torch.result_type(td, tz)).split(".")[1]
            assert str(kiln.result_type(kd, kz)).split(".")[1] == want, (d, z)
            if want != "bool":
                assert str((kd + kz).dtype).split(".")[1] == want, (d, z)
                assert str((kz * kd).dtype).split(".")[1] == want, (d, z)
            assert str(kiln.where(kiln.ones(2, dtype=kiln.bool), kd, kz).dtype).split(".")[1] == want, (d, z)
    wrapped = kiln.full((2,), 100, dtype=kiln.int8) + kiln.from_numpy(np.array(100))
    assert wrapped.dtype == kiln.int8 and wrapped.tolist() == [-56, -56]  # torch's answer too


def test_rounded_division_matches_torch_bit_for_bit():
    # div(rounding_mode=...), //, //=, % and their reflected forms, in every dtype torch has for them
    rng = np.random.default_rng(1)
    for name in ["float64", "float32", "float16", "bfloat16", "int64", "int32", "int8"]:
        kd, td = getattr(kiln, name), getattr(torch, name)
        if td.is_floating_point:
            a, b = rng.standard_normal(500) * 10, rng.standard_normal(500)
            a[:6], b[:6] = [1, -1, 0, -0.0, 5, np.inf], [0.1, 0.1, -2, 3, 0, 2]
        else:
            a, b = rng.integers(-100, 100, 500), rng.integers(1, 9, 500) * rng.choice([-1, 1], 500)
        ta, tb = torch.tensor(a).to(td), torch.tensor(b).to(td)
        ka, kb = kiln.tensor(ta.double().numpy()).to(kd), kiln.tensor(tb.double().numpy()).to(kd)
        for mode in ["trunc", "floor"]:
            t = torch.div(ta, tb, rounding_mode=mode).double().numpy()
            k = kiln.div(ka, kb, rounding_mode=mode).to(kiln.float64).numpy()
            assert np.array_equal(t, k, equal_nan=True) and np.array_equal(np.signbit(t), np.signbit(k)), (name, mode)
        assert kiln.div(ka, kb, rounding_mode="floor").dtype == kd
        assert np.array_equal((ka // kb).to(kiln.float64).numpy(), (ta // tb).double().numpy(), equal_nan=True)
    # a 0-dim divisor wraps into the result type (int8: 200 is -56), and its sign is the wrapped one
    i8 = torch.tensor([100, -100, 7], dtype=torch.int8)
    assert (kiln.tensor(i8.numpy()) // kiln.tensor(200)).tolist() == (i8 // torch.tensor(200)).tolist()
    x = kiln.tensor([7, -7])
    assert (7 // kiln.tensor([2, -2])).tolist() == [3, -4] and (7 % kiln.tensor([2, -2])).tolist() == [1, -1]
    x //= 3
    assert x.tolist() == [2, -3] and x.dtype == kiln.int64
    with pytest.raises(kiln.KilnError, match="division by zero"):
        kiln.tensor([1]) // 0
    with pytest.raises(ValueError, match="rounding_mode"):
        kiln.div(x, 2, rounding_mode="round")
    y = kiln.tensor([1.0, 2.0, 3.0])
    y /= 3  # a true division, as torch (not a product with 1/3)
    assert np.array_equal(y.numpy(), (torch.tensor([1.0, 2.0, 3.0]) / 3).numpy())


def test_cross_entropy_with_probability_targets_and_unbatched_input():
    # soft labels (mixup, distillation) and an unbatched [C] input, as torch
    x, p, w = arr(4, 5, 3), RNG.random((4, 5, 3)), RNG.random(5)
    p /= p.sum(1, keepdims=True)
    for red in ["mean", "sum", "none"]:
        for ls in [0.0, 0.2]:
            for ww in [None, w]:
                (kx, tx) = both(x)
                k = F.cross_entropy(kx, kiln.tensor(p), weight=None if ww is None else kiln.tensor(ww),
                                    reduction=red, label_smoothing=ls)
                t = TF.cross_entropy(tx, torch.tensor(p), weight=None if ww is None else torch.tensor(ww),
                                     reduction=red, label_smoothing=ls)
                compare(k, t, [kx], [tx], f"soft {red} {ls} {ww is not None}")
    (kx, tx) = both(arr(5))
    compare([F.cross_entropy(kx, kiln.tensor(2)), F.cross_entropy(kx, kiln.tensor(p[0, :, 0]), reduction="none")],
            [TF.cross_entropy(tx, torch.tensor(2)), TF.cross_entropy(tx, torch.tensor(p[0, :, 0]), reduction="none")],
            [kx], [tx], "unbatched")
    with pytest.raises(kiln.KilnError, match="must have the input's shape"):
        F.cross_entropy(kiln.randn(4, 5), kiln.rand(4, 6))


@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.0, float("inf"), 0.5])
def test_clip_grad_norm_vs_torch(norm_type):
    grads = [arr(4, 3), arr(5), arr(2, 2, 2)]
    kp = [kiln.zeros(g.shape, dtype=kiln.float64, requires_grad=True) for g in grads]
    tp = [torch.zeros(g.shape, dtype=torch.float64, requires_grad=True) for g in grads]
    for k, t, g in zip(kp, tp, grads):
        k.grad, t.grad = kiln.tensor(g), torch.tensor(g)
    kn = kiln.nn.clip_grad_norm_(kp, 0.5, norm_type=norm_type)
    tn = torch.nn.utils.clip_grad_norm_(tp, 0.5, norm_type=norm_type)
    assert abs(kn.item() - tn.item()) < 1e-5 * tn.item()
    for k, t in zip(kp, tp):
        np.testing.assert_allclose(k.grad.numpy(), t.grad.numpy(), rtol=1e-5, atol=1e-9)


def test_clip_grad_norm_takes_a_tensor_or_an_iterable():
    g = arr(3, 3)
    one = kiln.zeros((3, 3), dtype=kiln.float64, requires_grad=True)
    one.grad = kiln.tensor(g)
    t = torch.zeros((3, 3), dtype=torch.float64, requires_grad=True)
    t.grad = torch.tensor(g)
    # a single tensor is one parameter (not a sequence of its rows), as in torch
    assert abs(kiln.nn.clip_grad_norm_(one, 0.1).item() - torch.nn.utils.clip_grad_norm_(t, 0.1).item()) < 1e-9
    np.testing.assert_allclose(one.grad.numpy(), t.grad.numpy(), rtol=1e-6)
    lin = kiln.nn.Linear(3, 2)
    lin(kiln.ones((4, 3))).sum().backward()
    assert kiln.nn.clip_grad_norm_(lin.parameters(), 1e-3, norm_type=float("inf")).item() > 0  # an iterator
    assert kiln.nn.clip_grad_norm_((p for p in lin.parameters()), 1e-3).item() > 0  # a generator
    with pytest.raises(TypeError, match=r"parameters\[1\] is an int"):
        kiln.nn.clip_grad_norm_([one, 3], 1.0)
    with pytest.raises(TypeError, match="max_norm must be a number"):
        kiln.nn.clip_grad_norm_(one, "1")
    # NumPy scalars and 'inf' as torch takes them
    assert kiln.nn.clip_grad_norm_(one, np.float32(10.0), norm_type="inf").item() > 0
    assert kiln.nn.clip_grad_norm_(one, np.float64(10.0), norm_type=np.int64(2)).item() > 0


def _clip_pair(grads, dtype=np.float32):
    kp = [kiln.zeros(g.shape, dtype=kiln.float32 if dtype == np.float32 else kiln.float64, requires_grad=True)
          for g in grads]
    tp = [torch.zeros(g.shape, dtype=torch.float32 if dtype == np.float32 else torch.float64, requires_grad=True)
          for g in grads]
    for k, t, g in zip(kp, tp, grads):
        k.grad, t.grad = kiln.tensor(g.astype(dtype)), torch.tensor(g.astype(dtype))
    return kp, tp


def test_clip_grad_norm_of_huge_f32_gradients_is_finite():
    # The squares were taken in f32 and overflowed past |g| ~ 1.8e19: the norm was inf and the gradients
    # were left unclipped. They are summed in f64: the true norm, and the gradients clipped to max_norm.
    for v in (1e20, 3e37):
        (p,), _ = _clip_pair([np.full(4, v, np.float32)])
        n = kiln.nn.utils.clip_grad_norm_([p], 1.0)
        assert n.dtype == kiln.float64 and np.isclose(n.item(), 2 * float(np.float32(v)), rtol=1e-6)
        np.testing.assert_allclose(p.grad.numpy(), np.full(4, 0.5, np.float32), rtol=1e-5)


@pytest.mark.parametrize("norm_type", [2.0, float("inf")])
def test_clip_grad_norm_of_a_norm_past_f32s_smallest_factor_clips_as_torch(norm_type):
    # Past ~8.5e37 x max_norm the factor max_norm / norm is below FLT_MIN: subnormal in f32, and the
    # CPU kernels flush subnormals, so the gradients became 0 where torch's come out at max_norm. (One
    # element: with more, torch's f32 sum of squares overflows where Kiln's f64 one does not. torch's
    # subnormal factor keeps fewer digits: 1e-3 comes out 3e-5 off there.)
    for v, max_norm in [(1e38, 1.0), (3e38, 1.0), (2e38, 0.5), (1e38, 1e-3)]:
        kp, tp = _clip_pair([np.array([v], np.float32)])
        kn = kiln.nn.clip_grad_norm_(kp, max_norm, norm_type)
        tn = torch.nn.utils.clip_grad_norm_(tp, max_norm, norm_type)
        assert np.isclose(kn.item(), tn.item(), rtol=1e-6)
        np.testing.assert_allclose(kp[0].grad.numpy(), tp[0].grad.numpy(), rtol=1e-4, atol=0)
        assert np.isclose(kp[0].grad.item(), max_norm, rtol=1e-5)


@pytest.mark.parametrize("dt", ["float32", "bfloat16", "float16"])
def test_clip_grad_norm_scales_each_gradient_once_bit_for_bit(dt):
    # One pass over each gradient, as torch's (its version moves by 1): every non-f64 gradient on the CPU
    # was scaled twice (by the factor, then by 1, or by sqrt(factor) twice below FLT_MIN), ~7% of a clip.
    # The product is the dtype's own multiply by the factor in that dtype, bit for bit.
    kd, td = getattr(kiln, dt), getattr(torch, dt)
    grads = [arr(37, 5) * 40, arr(300) * 3, arr(2, 3, 4)]
    kp = [kiln.zeros(g.shape, dtype=kd, requires_grad=True) for g in grads]
    for k, g in zip(kp, grads):
        k.grad = kiln.tensor(g).to(kd)
    versions = [k.grad._version for k in kp]
    n = kiln.nn.clip_grad_norm_(kp, 0.5)
    assert [k.grad._version for k in kp] == [v + 1 for v in versions]
    factor = torch.tensor(min(0.5 / (n.item() + 1e-6), 1.0), dtype=torch.float64).to(td)
    assert factor.item() < 0.05
    for k, g in zip(kp, grads):
        want = torch.tensor(g).to(td) * factor
        np.testing.assert_array_equal(k.grad.float().numpy(), want.float().numpy())
    # a factor below FLT_MIN (not flushed to 0): the gradient comes out at max_norm, bf16 as f32
    if dt != "float16":  # (an f16 gradient cannot hold a norm that large)
        (k,) = [kiln.zeros(1, dtype=kd, requires_grad=True)]
        k.grad = kiln.tensor([3e38]).to(kd)
        v = k.grad._version
        kiln.nn.clip_grad_norm_([k], 0.5)
        assert k.grad._version == v + 1
        assert np.isclose(k.grad.float().item(), 0.5, rtol=1e-2 if dt == "bfloat16" else 1e-6)


@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
@pytest.mark.parametrize("norm_type", [2.0, float("inf")])
def test_clip_grad_norm_of_a_non_finite_norm_scales_as_torch(bad, norm_type):
    # torch's factor min(max_norm / (norm + 1e-6), 1): an inf norm zeroes the gradients (the inf element
    # NaN), a NaN norm makes them NaN; they were left as they were
    g = [arr(3, 4).astype(np.float32), arr(5).astype(np.float32)]
    g[1][0] = bad
    kp, tp = _clip_pair(g)
    kn = kiln.nn.clip_grad_norm_(kp, 1.0, norm_type)
    tn = torch.nn.utils.clip_grad_norm_(tp, 1.0, norm_type)
    assert np.array_equal(np.float32(kn.item()), tn.numpy(), equal_nan=True)
    for k, t in zip(kp, tp):
        np.testing.assert_array_equal(k.grad.numpy(), t.grad.numpy())


def test_clip_grad_norm_error_if_nonfinite_max_norm_0_and_foreach_as_torch():
    g = [arr(3, 4).astype(np.float32), arr(5).astype(np.float32)]
    g[1][2] = np.inf
    kp, tp = _clip_pair(g)
    with pytest.raises(RuntimeError) as te:
        torch.nn.utils.clip_grad_norm_(tp, 1.0, error_if_nonfinite=True)
    with pytest.raises(kiln.KilnError) as ke:
        kiln.nn.utils.clip_grad_norm_(kp, 1.0, error_if_nonfinite=True)
    # torch's words (its order printed as a Python float: 2.0 where Kiln's C++ prints 2)
    assert str(te.value).replace("order 2.0", "order 2") in str(ke.value)
    np.testing.assert_array_equal(kp[1].grad.numpy(), g[1])  # nothing scaled
    g[1][2] = 0.5
    kp, tp = _clip_pair(g)
    kn = kiln.nn.clip_grad_norm_(kp, 0.0, foreach=False)  # max_norm 0 zeroes the gradients, as torch
    tn = torch.nn.utils.clip_grad_norm_(tp, 0.0, foreach=False)
    assert np.isclose(kn.item(), tn.item(), rtol=1e-6)
    for k, t in zip(kp, tp):
        np.testing.assert_array_equal(k.grad.numpy(), t.grad.numpy())
    with pytest.raises(kiln.KilnError, match="max_norm must be >= 0, got -1"):  # torch would flip them
        kiln.nn.clip_grad_norm_(kp, -1.0)


def test_nn_utils_is_torchs_module_path():
    g = [arr(3, 4), arr(5)]
    kp, tp = _clip_pair(g, np.float64)
    kiln.nn.utils.clip_grad_value_(kp, 0.3)
    torch.nn.utils.clip_grad_value_(tp, 0.3)
    for k, t in zip(kp, tp):
        np.testing.assert_array_equal(k.grad.numpy(), t.grad.numpy())
    assert kiln.nn.clip_grad_value_ is kiln.nn.utils.clip_grad_value_
    assert kiln.nn.clip_grad_norm_ is kiln.nn.utils.clip_grad_norm_
    kv, tv = kiln.nn.utils.parameters_to_vector(kp), torch.nn.utils.parameters_to_vector(tp)
    np.testing.assert_array_equal(kv.detach().numpy(), tv.detach().numpy())
    new = arr(17)
    kiln.nn.utils.vector_to_parameters(kiln.tensor(new), kp)
    torch.nn.utils.vector_to_parameters(torch.tensor(new), tp)
    for k, t in zip(kp, tp):
        np.testing.assert_array_equal(k.detach().numpy(), t.detach().numpy())
    with pytest.raises(kiln.KilnValueError, match="17 elements"):
        kiln.nn.utils.vector_to_parameters(kiln.tensor(arr(16)), kp)
