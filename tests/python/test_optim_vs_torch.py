# kiln.optim against torch.optim: per-parameter step counts (a parameter that gets its first gradient
# late, a step without gradients), state_dict round trips, load_state_dict's checks and restored
# hyper-parameters, zero_grad(set_to_none=False), param_groups edits, per-group LR schedules, and the
# argument checks (mixed params lists, a gradient of another dtype, an LrSchedule's settings).
import numpy as np
import pytest

import kiln

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(5)


def pair(values, dtype=np.float32):
    a = np.asarray(values, dtype=dtype)
    return kiln.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)


def set_grads(kps, tps, grads, mask, dtype=np.float32):
    for kp, tp, g, m in zip(kps, tps, grads, mask):
        if m:
            kp.grad = kiln.tensor(np.asarray(g, dtype=dtype))
            tp.grad = torch.tensor(np.asarray(g, dtype=dtype))
        else:
            kp.grad = None
            tp.grad = None


def close(kps, tps, tol):
    for i, (kp, tp) in enumerate(zip(kps, tps)):
        k, t = kp.detach().numpy(), tp.detach().numpy()
        assert np.allclose(k, t, rtol=tol, atol=tol), (i, k, t)


def test_the_reported_late_parameter():
    a, b = kiln.tensor([1.0], requires_grad=True), kiln.tensor([1.0], requires_grad=True)
    o = kiln.optim.AdamW([a, b], lr=0.1, weight_decay=0)
    a.grad = kiln.tensor([1.0])
    o.step()
    a.grad = kiln.tensor([1.0])
    b.grad = kiln.tensor([1.0])
    o.step()
    assert b.item() == pytest.approx(0.90000004, abs=1e-7)  # was 0.92558634: b's first step used t = 2


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_adamw_with_parameters_stepping_at_different_times_matches_torch(dtype):
    shapes = [(3, 2), (4,), (1,), (2, 2)]
    ks, ts = zip(*(pair(RNG.standard_normal(s), dtype) for s in shapes))
    ko = kiln.optim.AdamW(list(ks), lr=0.05, betas=(0.8, 0.99), eps=1e-7, weight_decay=0.02)
    to = torch.optim.AdamW(list(ts), lr=0.05, betas=(0.8, 0.99), eps=1e-7, weight_decay=0.02)
    masks = [(1, 0, 0, 1), (0, 0, 0, 0), (1, 1, 0, 0), (1, 1, 1, 0), (0, 1, 1, 1), (1, 1, 1, 1), (0, 0, 1, 0)]
    tol = 1e-5 if dtype == np.float32 else 1e-10
    for step, mask in enumerate(masks):
        set_grads(ks, ts, [RNG.standard_normal(s) for s in shapes], mask, dtype)
        ko.step()
        to.step()
        close(ks, ts, tol)
        if step == 3:  # midway, the state goes into a fresh optimizer, which continues as torch
            state = ko.state_dict()
            ks2 = [kiln.tensor(k.detach().numpy(), requires_grad=True) for k in ks]
            ko2 = kiln.optim.AdamW(ks2, lr=0.05, betas=(0.8, 0.99), eps=1e-7, weight_decay=0.02)
            ko2.load_state_dict(state)
            ks, ko = ks2, ko2
    assert ko.steps == 6  # the step without gradients is not one


def test_lamb_refuses_eps_0():
    # torch has no LAMB; with eps 0 one parameter whose gradients were all 0 makes its update 0 / 0, and the
    # NaN norm silently set every other element's trust ratio to 1: refused, when built, per group and loaded
    p = kiln.tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(ValueError, match="LAMB: Invalid epsilon value: 0.0"):
        kiln.optim.LAMB([p], eps=0)
    with pytest.raises(ValueError, match="LAMB: Invalid epsilon value: 0.0"):
        kiln.optim.LAMB([{"params": [p], "eps": 0.0}])
    opt = kiln.optim.LAMB([p], eps=1e-6)
    state = opt.state_dict()
    state["param_groups"][0]["eps"] = 0.0
    with pytest.raises(kiln.KilnError, match=r"param_groups\[0\]\['eps'\]: .*eps must be > 0"):
        kiln.optim.LAMB([p], eps=1e-6).load_state_dict(state)
    tensors, scalars = opt._engine.state()  # Kiln's older layout too
    with pytest.raises(kiln.KilnError, match="eps must be > 0"):
        kiln.optim.LAMB([p], eps=1e-6).load_state_dict({"tensors": tensors,
                                                        "scalars": dict(scalars, **{"group0.eps": 0.0})})


@pytest.mark.parametrize("name", ["Adam", "AdamW"])
def test_adam_takes_eps_0_as_torch(name):
    # torch takes eps=0 (the step divides by sqrt(v_hat) alone); Kiln refused it. Non-zero gradients: the
    # same numbers as torch's, given when built, as a group's own eps and through a state_dict.
    shapes = [(3, 2), (4,)]
    ks, ts = zip(*(pair(RNG.standard_normal(s)) for s in shapes))
    groups = lambda ps: [{"params": [ps[0]]}, {"params": [ps[1]], "eps": 0.0}]
    ko = getattr(kiln.optim, name)(groups(ks), lr=0.05, betas=(0.8, 0.99), eps=0.0, weight_decay=0.02)
    to = getattr(torch.optim, name)(groups(ts), lr=0.05, betas=(0.8, 0.99), eps=0.0, weight_decay=0.02)
    assert ko.param_groups[0]["eps"] == 0.0 and ko.param_groups[1]["eps"] == 0.0
    for step in range(4):
        set_grads(ks, ts, [RNG.standard_normal(s) + 0.5 for s in shapes], [1, 1])
        ko.step()
        to.step()
        close(ks, ts, 1e-5)
        if step == 1:
            ks2 = [kiln.tensor(k.detach().numpy(), requires_grad=True) for k in ks]
            ko2 = getattr(kiln.optim, name)(groups(ks2), lr=0.05, betas=(0.8, 0.99), eps=1e-3, weight_decay=0.02)
            ko2.load_state_dict(ko.state_dict())
            assert ko2.param_groups[0]["eps"] == 0.0
            ks, ko = ks2, ko2
    # a gradient of 0 from the first step on: 0 / 0, NaN, where torch's is NaN too
    k, t = pair([1.0, 2.0])
    ko, to = getattr(kiln.optim, name)([k], eps=0), getattr(torch.optim, name)([t], eps=0)
    set_grads([k], [t], [[0.0, 1.0]], [1])
    ko.step()
    to.step()
    assert np.array_equal(np.isnan(k.detach().numpy()), np.isnan(t.detach().numpy()))
    assert np.isnan(k.detach().numpy()[0]) and k.detach().numpy()[1] == pytest.approx(t.detach().numpy()[1])
    # below 0 (or not finite) is still refused, in torch's words
    for bad in (-1e-8, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=f"{name}: Invalid epsilon value"):
            getattr(kiln.optim, name)([k], eps=bad)
    with pytest.raises(ValueError, match="Invalid epsilon value"):
        getattr(torch.optim, name)([t], eps=-1e-8)


def test_load_state_dict_checks_groups_and_restores_hyper_parameters():
    p = kiln.tensor([1.0], requires_grad=True)
    one = kiln.optim.SGD([p], lr=0.1, momentum=0.9)
    p.grad = kiln.tensor([1.0])
    one.step()
    two = kiln.optim.SGD([kiln.tensor([1.0], requires_grad=True), kiln.tensor([2.0], requires_grad=True)],
                         lr=0.1, momentum=0.9)
    with pytest.raises(kiln.KilnError,
                       match=r"param_groups\[0\] has 1 parameter in the state, this optimizer's group 0 has 2"):
        two.load_state_dict(one.state_dict())
    grouped = kiln.optim.SGD([{"params": [kiln.tensor([1.0], requires_grad=True)]},
                              {"params": [kiln.tensor([1.0], requires_grad=True)], "lr": 0.01}], lr=0.1)
    single = kiln.optim.SGD([kiln.tensor([1.0], requires_grad=True)], lr=0.1)
    with pytest.raises(kiln.KilnError, match="state has 2 parameter groups, this optimizer has 1"):
        single.load_state_dict(grouped.state_dict())
    # momentum 0.5 saved, 0.9 constructed: torch continues with 0.5, and so does kiln
    k, t = pair([1.0, -2.0])
    ko = kiln.optim.SGD([k], lr=0.1, momentum=0.5)
    to = torch.optim.SGD([t], lr=0.1, momentum=0.5)
    set_grads([k], [t], [[0.5, 0.25]], [1])
    ko.step()
    to.step()
    k2 = kiln.tensor(k.detach().numpy(), requires_grad=True)
    ko2 = kiln.optim.SGD([k2], lr=0.3, momentum=0.9, nesterov=True)
    ko2.load_state_dict(ko.state_dict())
    g = ko2.param_groups[0]
    assert (g["momentum"], g["nesterov"], g["lr"]) == (0.5, False, pytest.approx(0.1))
    for _ in range(3):
        set_grads([k2], [t], [RNG.standard_normal(2)], [1])
        ko2.step()
        to.step()
    close([k2], [t], 1e-6)
    # AdamW's betas and eps
    ka = kiln.optim.AdamW([kiln.tensor([1.0], requires_grad=True)], betas=(0.5, 0.6), eps=1e-3)
    kb = kiln.optim.AdamW([kiln.tensor([1.0], requires_grad=True)])
    kb.load_state_dict(ka.state_dict())
    assert kb.param_groups[0]["betas"] == (0.5, 0.6) and kb.param_groups[0]["eps"] == 1e-3


def test_zero_grad_in_place_and_to_none():
    k, t = pair([1.0, 2.0])
    ko, to = kiln.optim.SGD([k], lr=0.1), torch.optim.SGD([t], lr=0.1)
    set_grads([k], [t], [[3.0, 4.0]], [1])
    ko.zero_grad(set_to_none=False)
    to.zero_grad(set_to_none=False)
    assert k.grad is not None and k.grad.tolist() == t.grad.tolist() == [0.0, 0.0]
    ko.zero_grad()
    to.zero_grad()
    assert k.grad is None and t.grad is None


def test_param_groups_edits_take_effect_as_in_torch():
    ks, ts = zip(*(pair(RNG.standard_normal(3)) for _ in range(2)))
    ko = kiln.optim.SGD([{"params": [ks[0]]}, {"params": [ks[1]], "lr": 0.01}], lr=0.1, momentum=0.9)
    to = torch.optim.SGD([{"params": [ts[0]]}, {"params": [ts[1]], "lr": 0.01}], lr=0.1, momentum=0.9)
    assert [g["lr"] for g in ko.param_groups] == [g["lr"] for g in to.param_groups]
    assert ko.param_groups[1]["params"][0] is not None and len(ko.param_groups[0]["params"]) == 1
    for step in range(4):
        for kg, tg in zip(ko.param_groups, to.param_groups):
            kg["lr"] = tg["lr"] = tg["lr"] * 0.5
            kg["weight_decay"] = tg["weight_decay"] = 0.01 * step
        set_grads(ks, ts, [RNG.standard_normal(3) for _ in range(2)], [1, 1])
        ko.step()
        to.step()
    close(ks, ts, 1e-6)
    assert ko.param_group_lrs == [0.00625, 0.000625]
    with pytest.raises(kiln.KilnValueError, match="lr must be finite, got nan"):
        ko.param_groups[0]["lr"] = float("nan")
    # a group's momentum may be set (as torch's), one group at a time, taken at the next step
    ko.param_groups[1]["momentum"] = to.param_groups[1]["momentum"] = 0.5
    for _ in range(2):
        set_grads(ks, ts, [RNG.standard_normal(3) for _ in range(2)], [1, 1])
        ko.step()
        to.step()
        close(ks, ts, 1e-6)
    ko.param_groups[0]["momentum"] = to.param_groups[0]["momentum"] = 0.25
    set_grads(ks, ts, [RNG.standard_normal(3) for _ in range(2)], [1, 1])
    ko.step()
    to.step()
    close(ks, ts, 1e-6)
    groups = ko.state_dict()["param_groups"]
    assert ko.defaults["momentum"] == 0.9
    assert (groups[0]["momentum"], groups[1]["momentum"]) == (0.25, 0.5)
    # a bad value is refused at the next step, naming the group, and changes nothing
    ko.param_groups[1]["momentum"] = -0.5
    before = [k.detach().numpy().copy() for k in ks]
    with pytest.raises(kiln.KilnValueError, match="sgd: group 1's momentum must be >= 0, got -0.5"):
        ko.step()
    assert all(np.array_equal(b, k.detach().numpy()) for b, k in zip(before, ks))
    ko.param_groups[1]["momentum"] = 0.5
    ko.param_groups[0]["initial_lr"] = 0.1  # a scheduler's note is kept
    assert ko.param_groups[0]["initial_lr"] == 0.1


def test_lr_and_schedules_scale_each_groups_own_lr_as_torch():
    ks, ts = zip(*(pair([1.0]) for _ in range(2)))
    ko = kiln.optim.SGD([{"params": [ks[0]]}, {"params": [ks[1]], "lr": 0.01}], lr=0.1)
    to = torch.optim.SGD([{"params": [ts[0]]}, {"params": [ts[1]], "lr": 0.01}], lr=0.1)
    sched = kiln.optim.LrSchedule("cosine", base_lr=0.1, warmup_steps=2, total_steps=10)
    ks_ = kiln.optim.LambdaSchedule(ko, sched)
    ts_ = torch.optim.lr_scheduler.LambdaLR(to, lambda s: sched(s) / 0.1)
    for _ in range(12):
        assert ko.param_group_lrs == pytest.approx([g["lr"] for g in to.param_groups], rel=1e-12, abs=1e-15)
        set_grads(ks, ts, [[1.0], [1.0]], [1, 1])
        ko.step()
        to.step()
        ks_.step()
        ts_.step()
    assert [g["lr"] for g in ko.param_groups] == ko.param_group_lrs
    ko = kiln.optim.SGD([{"params": [ks[0]]}, {"params": [ks[1]], "lr": 0.01}], lr=0.1)
    ko.lr = 0.5  # the groups keep their ratio: was [0.5, 0.5]
    assert ko.param_group_lrs == pytest.approx([0.5, 0.05])
    assert [g["lr"] for g in ko.param_groups] == ko.param_group_lrs
    # one group, or one lr for all groups: the schedule's value itself, as before (and as kiln train)
    k = kiln.tensor([1.0], requires_grad=True)
    o = kiln.optim.SGD([{"params": [k]}, {"params": [kiln.tensor([1.0], requires_grad=True)]}], lr=0.3)
    kiln.optim.LambdaSchedule(o, sched)
    assert o.param_group_lrs == [sched(0), sched(0)]


def test_bad_arguments_are_refused_clearly():
    a, b = kiln.tensor([1.0], requires_grad=True), kiln.tensor([1.0], requires_grad=True)
    with pytest.raises(TypeError, match=r"mixes tensors \(item 0\) and parameter-group dicts \(item 1\)"):
        kiln.optim.SGD([a, {"params": [b], "lr": 0.01}], lr=0.1)
    o = kiln.optim.AdamW([a, b], lr=0.1)
    a.grad = kiln.tensor([1.0])
    # As torch, a gradient of another dtype is refused when assigned (the optimizer's own check of it is
    # tested in C++, where set_grad allows one)
    with pytest.raises(kiln.KilnError, match="has another dtype than the tensor"):
        b.grad = kiln.tensor([1.0], dtype=kiln.float64)
    assert b.grad is None
    o.step()
    assert a.item() != 1.0 and b.item() == 1.0  # b has no gradient: left alone
    # An LrSchedule is checked when built, not first at at().
    for kwargs, message in [({"kind": "cosine"}, "needs its total steps"),
                            ({"kind": "step", "step_size": 0}, "step size must be >= 1"),
                            ({"kind": "constant", "base_lr": -1.0}, "base lr must be finite"),
                            ({"kind": "polynomial", "total_steps": 5, "power": 0.0}, "power must be finite and > 0"),
                            ({"kind": "constant", "warmup_steps": -1}, "warmup steps must be >= 0")]:
        kwargs.setdefault("base_lr", 0.1)
        with pytest.raises(kiln.KilnValueError, match=message):
            kiln.optim.LrSchedule(**kwargs)


@pytest.mark.parametrize("wd", [0.0, 0.1])
def test_adam_is_torchs_adam_with_l2_decay_per_group(wd):
    shapes = [(3, 2), (4,), (2,)]
    ks, ts = zip(*(pair(RNG.standard_normal(s)) for s in shapes))
    groups = lambda ps: [{"params": [ps[0], ps[1]]}, {"params": [ps[2]], "lr": 0.01, "weight_decay": 0.3}]
    ko = kiln.optim.Adam(groups(ks), lr=0.05, betas=(0.8, 0.99), eps=1e-7, weight_decay=wd)
    to = torch.optim.Adam(groups(ts), lr=0.05, betas=(0.8, 0.99), eps=1e-7, weight_decay=wd)
    assert [g["weight_decay"] for g in ko.param_groups] == [wd, 0.3]
    for step, mask in enumerate([(1, 1, 1), (1, 0, 1), (1, 1, 1), (0, 1, 1), (1, 1, 1)]):
        grads = [RNG.standard_normal(s) for s in shapes]
        set_grads(ks, ts, grads, mask)
        ko.step()
        to.step()
        close(ks, ts, 1e-5)
        for k, g, m in zip(ks, grads, mask):  # the gradient is the caller's again after the step
            assert not m or np.allclose(k.grad.numpy(), np.asarray(g, np.float32))
        if step == 2:  # the L2 decay round-trips through state_dict
            state = ko.state_dict()
            ks2 = [kiln.tensor(k.detach().numpy(), requires_grad=True) for k in ks]
            ko = kiln.optim.Adam(groups(ks2), lr=0.05, betas=(0.8, 0.99), eps=1e-7, weight_decay=wd * 3)
            ko.load_state_dict(state)
            ks = ks2
            assert [g["weight_decay"] for g in ko.param_groups] == [wd, 0.3]  # the saved ones, not wd * 3
            ko.defaults["weight_decay"] = wd  # (torch's load_state_dict leaves the defaults too)
    # opt.state, by torch's names
    for k, t in zip(ks, ts):
        ks_, ts_ = ko.state[k], to.state[t]
        assert sorted(ks_) == sorted(ts_) == ["exp_avg", "exp_avg_sq", "step"]
        assert ks_["step"].item() == ts_["step"].item()
        assert np.allclose(ks_["exp_avg_sq"].numpy(), ts_["exp_avg_sq"].numpy(), rtol=1e-5, atol=1e-7)
    with pytest.raises(kiln.KilnValueError, match="amsgrad=True is not implemented"):
        kiln.optim.Adam(list(ks), amsgrad=True)
    # kiln.amp.GradScaler steps the engine, which cannot add the L2 decay: refused, not silently dropped
    # a group added later decays as torch's (L2, the optimizer's default or its own)
    k3, t3 = pair(RNG.standard_normal(3))
    ko.add_param_group({"params": [k3]})
    to.add_param_group({"params": [t3]})
    assert ko.param_groups[-1]["weight_decay"] == to.param_groups[-1]["weight_decay"] == wd
    for _ in range(3):
        grads = [RNG.standard_normal(s) for s in shapes] + [RNG.standard_normal(3)]
        set_grads(list(ks) + [k3], list(ts) + [t3], grads, [1, 1, 1, 1])
        ko.step()
        to.step()
    close(list(ks) + [k3], list(ts) + [t3], 1e-5)
    scaler = kiln.amp.GradScaler()
    with pytest.raises(kiln.KilnValueError, match="cannot add Adam's L2 weight decay"):
        scaler.step(ko)  # group 1 decays
    scaler.step(kiln.optim.Adam(list(ks), weight_decay=0.0))


def test_group_options_state_and_add_param_group_as_torch():
    shapes = [(3,), (2, 2), (4,)]
    ks, ts = zip(*(pair(RNG.standard_normal(s)) for s in shapes))
    # torch's groups may carry their own options (each its own here)
    ko = kiln.optim.SGD([{"params": [ks[0]], "momentum": 0.8}, {"params": [ks[1]], "nesterov": True}],
                        lr=0.1, momentum=0.9)
    to = torch.optim.SGD([{"params": [ts[0]], "momentum": 0.8}, {"params": [ts[1]], "nesterov": True}],
                         lr=0.1, momentum=0.9)
    assert [g["momentum"] for g in ko.param_groups] == [g["momentum"] for g in to.param_groups] == [0.8, 0.9]
    assert ko.param_groups[0]["params"][0] is ks[0]
    with pytest.raises(kiln.KilnValueError, match="group 2's nesterov needs momentum > 0"):
        ko.add_param_group({"params": ks[2], "momentum": 0.0, "nesterov": True})
    assert len(ko.param_groups) == 2
    for step in range(5):
        if step == 2:  # a new group takes the defaults (momentum 0.9), as torch's
            ko.add_param_group({"params": ks[2], "lr": 0.05})
            to.add_param_group({"params": ts[2], "lr": 0.05})
            assert ko.param_groups[2]["momentum"] == to.param_groups[2]["momentum"] == 0.9
        n = len(ko.param_groups)
        set_grads(ks[:n], ts[:n], [RNG.standard_normal(s) for s in shapes[:n]], [1] * n)
        ko.step()
        to.step()
        close(ks, ts, 1e-6)
    for k, t in zip(ks, ts):
        assert np.allclose(ko.state[k]["momentum_buffer"].numpy(), to.state[t]["momentum_buffer"].numpy(), atol=1e-6)
    assert len(ko.state) == 3
    with pytest.raises(ValueError, match="more than one parameter group"):
        ko.add_param_group({"params": [ks[0]]})
    with pytest.raises(kiln.KilnValueError, match="sgd: group 1's momentum must be >= 0, got -0.5"):
        kiln.optim.SGD([{"params": [ks[0]]}, {"params": [ks[1]], "momentum": -0.5}], lr=0.1, momentum=0.9)
    # the groups' own options go through state_dict into a fresh optimizer, which continues as torch
    fresh = kiln.optim.SGD([{"params": [ks[0]]}, {"params": [ks[1]]}, {"params": [ks[2]]}], lr=0.3)
    fresh.load_state_dict(ko.state_dict())
    assert [(g["momentum"], g["nesterov"]) for g in fresh.param_groups] == [(0.8, False), (0.9, True), (0.9, False)]
    set_grads(ks, ts, [RNG.standard_normal(s) for s in shapes], [1, 1, 1])
    fresh.step()
    to.step()
    close(ks, ts, 1e-6)
    ko.zero_grad(set_to_none=True)
    assert all(k.grad is None for k in ks)


def test_adam_betas_and_one_cycle_momentum_per_group_as_torch():
    shapes = [(3,), (2, 2)]
    ks, ts = zip(*(pair(RNG.standard_normal(s)) for s in shapes))
    groups = lambda ps: [{"params": [ps[0]], "betas": (0.5, 0.9), "eps": 1e-3}, {"params": [ps[1]], "lr": 0.02}]
    ko = kiln.optim.AdamW(groups(ks), lr=0.05, betas=(0.8, 0.99), weight_decay=0.1)
    to = torch.optim.AdamW(groups(ts), lr=0.05, betas=(0.8, 0.99), weight_decay=0.1)
    # OneCycleLR cycles each group's beta1 between its own base and max momentum
    ksch = kiln.optim.lr_scheduler.OneCycleLR(ko, max_lr=[0.1, 0.05], total_steps=8, base_momentum=[0.6, 0.7],
                                              max_momentum=[0.9, 0.95])
    tsch = torch.optim.lr_scheduler.OneCycleLR(to, max_lr=[0.1, 0.05], total_steps=8, base_momentum=[0.6, 0.7],
                                               max_momentum=[0.9, 0.95])
    for _ in range(7):
        set_grads(ks, ts, [RNG.standard_normal(s) for s in shapes], [1, 1])
        ko.step()
        to.step()
        ksch.step()
        tsch.step()
        assert [g["betas"][0] for g in ko.param_groups] == pytest.approx([g["betas"][0] for g in to.param_groups])
        close(ks, ts, 1e-5)
    assert ko.param_groups[0]["eps"] == 1e-3 and ko.param_groups[1]["eps"] == 1e-8
    assert ko.param_groups[0]["betas"][0] != ko.param_groups[1]["betas"][0]


def test_group_option_edits_survive_lr_changes_and_momentum_zero_resumes():
    ks, ts = zip(*(pair(RNG.standard_normal(3)) for _ in range(2)))
    ko = kiln.optim.SGD([{"params": [ks[0]]}, {"params": [ks[1]]}], lr=0.1, momentum=0.9)
    to = torch.optim.SGD([{"params": [ts[0]]}, {"params": [ts[1]]}], lr=0.1, momentum=0.9)
    for step in range(4):
        if step == 1:  # an edit not stepped yet, then an lr change: the edit stays (it was dropped)
            ko.param_groups[1]["momentum"] = to.param_groups[1]["momentum"] = 0.5
            ko.lr = 0.05
            for g in to.param_groups:
                g["lr"] = 0.05
            assert ko.param_groups[1]["momentum"] == 0.5
        if step == 2:  # momentum 0 after buffers exist: torch keeps them; the state must load again
            ko.param_groups[0]["momentum"] = to.param_groups[0]["momentum"] = 0.0
        set_grads(ks, ts, [RNG.standard_normal(3) for _ in range(2)], [1, 1])
        ko.step()
        to.step()
        close(ks, ts, 1e-6)
    again = kiln.optim.SGD([{"params": [ks[0]]}, {"params": [ks[1]]}], lr=0.1, momentum=0.9)
    again.load_state_dict(ko.state_dict())
    ko.load_state_dict(ko.state_dict())
    assert [g["momentum"] for g in again.param_groups] == [0.0, 0.5]


@pytest.mark.parametrize("kind", ["sgd", "adamw"])
def test_frozen_parameters_are_taken_skipped_and_train_once_unfrozen_as_torch(kind):
    shapes = [(4, 3), (3,), (3, 2), (2,)]
    ks, ts = zip(*(pair(RNG.standard_normal(s)) for s in shapes))
    for p in ks[:2] + ts[:2]:  # the first layer frozen before the optimizer is made: torch takes it
        p.requires_grad_(False)
    if kind == "sgd":
        ko = kiln.optim.SGD(ks, lr=0.1, momentum=0.9, weight_decay=0.1)
        to = torch.optim.SGD(ts, lr=0.1, momentum=0.9, weight_decay=0.1)
    else:
        ko = kiln.optim.AdamW(ks, lr=0.05, weight_decay=0.5)
        to = torch.optim.AdamW(ts, lr=0.05, weight_decay=0.5)
    x = RNG.standard_normal((5, 4)).astype(np.float32)
    kx, tx = kiln.tensor(x), torch.tensor(x)

    def step(ps, xx, opt):
        opt.zero_grad()
        out = (xx @ ps[0] + ps[1]) @ ps[2] + ps[3]
        (out * out).mean().backward()
        opt.step()

    def freeze(first, second):
        for i, p in enumerate(zip(ks, ts)):
            for q in p:
                q.requires_grad_(not (first if i < 2 else second))

    for phase, (first_frozen, second_frozen) in enumerate([(True, False), (False, True), (False, False)]):
        freeze(first_frozen, second_frozen)
        before = [k.detach().numpy().copy() for k in ks]
        for _ in range(2):
            step(ks, kx, ko)
            step(ts, tx, to)
        for i, k in enumerate(ks):
            frozen = first_frozen if i < 2 else second_frozen
            if frozen:  # no gradient: neither the update nor the weight decay touches it
                assert np.array_equal(k.detach().numpy(), before[i]), (phase, i)
            else:
                assert not np.array_equal(k.detach().numpy(), before[i]), (phase, i)
        close(ks, ts, 1e-5)
        # the state as torch's: made at a parameter's first gradient (fresh once unfrozen), kept while
        # it is frozen, and each parameter's own step count
        assert len(ko.state) == len(to.state), phase
        for k, t in zip(ks, ts):
            assert (k in ko.state) == (t in to.state)
            if kind == "adamw" and t in to.state:
                assert ko.state[k]["step"].item() == to.state[t]["step"].item()


def test_lr_through_zero_keeps_the_groups_ratios():
    # opt.lr = 0 made every group's lr 0, and opt.lr = 0.1 then gave them all 0.1: the 10:1 was lost
    a, b = kiln.tensor([1.0], requires_grad=True), kiln.tensor([1.0], requires_grad=True)
    o = kiln.optim.SGD([{"params": [a], "lr": 0.1}, {"params": [b], "lr": 0.01}])
    o.lr = 0.0
    assert [g["lr"] for g in o.param_groups] == [0.0, 0.0]
    o.lr = 0.2
    assert np.allclose([g["lr"] for g in o.param_groups], [0.2, 0.02], rtol=1e-12)
    o.param_groups[1]["lr"] = 0.05  # a group's own edit sets its new ratio
    o.lr = 0.0
    o.lr = 0.4
    assert np.allclose([g["lr"] for g in o.param_groups], [0.4, 0.1], rtol=1e-12)
    o.param_groups[0]["lr"] = 0.0  # the first group's 0 against another's lr: no ratio to keep
    with pytest.raises(kiln.KilnValueError, match="which is 0"):
        o.lr = 0.1


def test_lr_after_group_edits_scales_the_groups_lrs_of_now():
    # `param_groups[i]['lr'] = v` did not note the ratios: opt.lr = x used the constructor's
    a, b = kiln.tensor([1.0], requires_grad=True), kiln.tensor([1.0], requires_grad=True)
    o = kiln.optim.SGD([{"params": [a], "lr": 0.1}, {"params": [b], "lr": 0.01}])
    o.param_groups[1]["lr"] = 0.1  # the groups now share one lr
    o.param_groups[0]["lr"] = 0.0  # then both go to 0, the first group first (a scheduler's order)
    o.param_groups[1]["lr"] = 0.0
    o.lr = 0.3
    assert [g["lr"] for g in o.param_groups] == [0.3, 0.3]
    # a 10:1 taken to 0 the same way keeps its 10:1 (the last ratios while the first lr was not 0)
    o.param_groups[1]["lr"] = 0.03
    o.param_groups[0]["lr"] = 0.0
    o.param_groups[1]["lr"] = 0.0
    o.lr = 0.5
    assert np.allclose([g["lr"] for g in o.param_groups], [0.5, 0.05], rtol=1e-12)


@pytest.mark.parametrize("name", ["SGD", "Adam", "AdamW"])
def test_the_resume_idiom_with_a_scheduler_built_at_last_epoch(name):
    # torch's: load the optimizer's state, then build the scheduler with last_epoch=; it needs each group's
    # initial_lr, which state_dict() dropped (a KeyError)
    def run(lib, P):
        p = P()
        o = getattr(lib.optim, name)([p], lr=0.1)
        s = lib.optim.lr_scheduler.CosineAnnealingLR(o, T_max=50)
        for _ in range(20):
            p.grad = lib.ones(2)
            o.step()
            s.step()
        sd = o.state_dict()
        o2 = getattr(lib.optim, name)([p], lr=0.1)
        o2.load_state_dict(sd)
        assert o2.param_groups[0]["initial_lr"] == 0.1
        s2 = lib.optim.lr_scheduler.CosineAnnealingLR(o2, T_max=50, last_epoch=19)
        got = []
        for _ in range(3):
            p.grad = lib.ones(2)
            o2.step()
            s2.step()
            got.append(s2.get_last_lr()[0])
        return got

    k = run(kiln, lambda: kiln.nn.Parameter(kiln.zeros(2)))
    t = run(torch, lambda: torch.nn.Parameter(torch.zeros(2)))
    np.testing.assert_allclose(k, t, rtol=1e-12)


def test_state_of_a_parameter_without_state_is_an_empty_dict():
    # torch's state is a defaultdict(dict): opt.state[p] before the first step is {}, not a KeyError
    p = kiln.nn.Parameter(kiln.zeros(3))
    o = kiln.optim.Adam([p], lr=0.1)
    assert o.state.get(p) is None and p not in o.state  # get() and `in` make nothing
    assert o.state[p] == {}
    assert o.state[kiln.zeros(1)] == {}  # any key, as torch's defaultdict
    p.grad = kiln.ones(3)
    o.step()
    assert set(o.state[p]) == {"exp_avg", "exp_avg_sq", "step"}


def test_state_keeps_the_dicts_it_makes_as_torchs_defaultdict():
    # opt.state[p] gave a new {} each time: a write into it was lost and p never came `in` the state
    def run(lib, P):
        p, q = P(), P()
        o = lib.optim.SGD([p, q], lr=0.1, momentum=0.9)
        o.state[p]["note"] = 1
        seen = ["note" in o.state[p], p in o.state, q in o.state, len(o.state)]
        p.grad = lib.ones(3)
        o.step()
        seen += [sorted(o.state[p]), o.state[p]["note"], len(o.state)]
        o.state[p]["later"] = 2  # a stepped parameter's dict keeps a write too
        seen.append(o.state[p].get("later"))
        return seen

    k = run(kiln, lambda: kiln.nn.Parameter(kiln.zeros(3)))
    t = run(torch, lambda: torch.nn.Parameter(torch.zeros(3)))
    assert k == t == [True, True, False, 1, ["momentum_buffer", "note"], 1, 1, 2]
    # state_dict() holds the engine's state only, and load_state_dict drops the made dicts (torch's
    # load replaces its state)
    p = kiln.nn.Parameter(kiln.zeros(3))
    o = kiln.optim.SGD([p], lr=0.1, momentum=0.9)
    sd = o.state_dict()
    o.state[p]["note"] = 1
    assert o.state_dict()["state"] == sd["state"] == {}
    o.load_state_dict(sd)
    assert p not in o.state and o.state[p] == {}


@pytest.mark.parametrize("name,kw", [("SGD", dict(lr=0.05, momentum=0.9, weight_decay=0.01)),
                                     ("SGD", dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.02)),
                                     ("Adam", dict(lr=0.05, weight_decay=0.01)),
                                     ("AdamW", dict(lr=0.05, weight_decay=0.1))])
def test_maximize_foreach_fused_as_torch(name, kw):
    w0 = RNG.standard_normal((2, 3)).astype(np.float32)
    grads = [RNG.standard_normal((2, 3)).astype(np.float32) for _ in range(5)]
    kp, tp = kiln.nn.Parameter(kiln.tensor(w0)), torch.nn.Parameter(torch.tensor(w0))
    ko = getattr(kiln.optim, name)([kp], maximize=True, foreach=False, fused=None, **kw)
    to = getattr(torch.optim, name)([tp], maximize=True, foreach=False, fused=None, **kw)
    assert ko.param_groups[0]["maximize"] is True and ko.defaults["maximize"] is True
    for g in grads:
        kp.grad, tp.grad = kiln.tensor(g), torch.tensor(g)
        ko.step()
        to.step()
        np.testing.assert_array_equal(kp.grad.numpy(), g)  # the caller's gradient is put back
    close([kp], [tp], 1e-5)
    ko.param_groups[0]["maximize"] = False  # a group's own, as torch's
    to.param_groups[0]["maximize"] = False
    kp.grad, tp.grad = kiln.tensor(grads[0]), torch.tensor(grads[0])
    ko.step()
    to.step()
    close([kp], [tp], 1e-5)


class _KilnAdamSub(kiln.optim.Adam):
    pass


class _TorchAdamSub(torch.optim.Adam):
    pass


def test_adam_decoupled_weight_decay_as_torch():
    # Adam(decoupled_weight_decay=True) was an AdamW: a subclass of Adam got L2 decay, and its state
    # loaded into a plain Adam lost the flag (L2 from there on); torch's is an Adam with the flag per group
    w0 = RNG.standard_normal(4).astype(np.float32)
    grads = [RNG.standard_normal(4).astype(np.float32) for _ in range(6)]

    def run(lib, cls, resume_cls, **kw):
        p = lib.nn.Parameter(lib.tensor(w0))
        o = cls([p], lr=0.1, weight_decay=0.3, **kw)
        for g in grads[:3]:
            p.grad = lib.tensor(g)
            o.step()
        o2 = resume_cls([p], lr=0.1)  # a plain Adam (weight_decay 0, not decoupled) takes the state
        o2.load_state_dict(o.state_dict())
        for g in grads[3:]:
            p.grad = lib.tensor(g)
            o2.step()
        return o, o2, p.detach().numpy()

    for kcls, tcls in ((kiln.optim.Adam, torch.optim.Adam), (_KilnAdamSub, _TorchAdamSub)):
        ko, ko2, k = run(kiln, kcls, kiln.optim.Adam, decoupled_weight_decay=True)
        to, to2, t = run(torch, tcls, torch.optim.Adam, decoupled_weight_decay=True)
        assert type(ko) is kcls and isinstance(ko, kiln.optim.Adam) and type(to) is tcls
        assert ko.param_groups[0]["decoupled_weight_decay"] is True
        assert ko.state_dict()["param_groups"][0]["decoupled_weight_decay"] is True
        assert ko2.param_groups[0]["decoupled_weight_decay"] is to2.param_groups[0]["decoupled_weight_decay"] is True
        assert ko2.param_groups[0]["weight_decay"] == to2.param_groups[0]["weight_decay"] == 0.3
        np.testing.assert_allclose(k, t, rtol=1e-5, atol=1e-5)
    # L2 is not decoupled: the flag changes the numbers
    _, _, l2 = run(kiln, kiln.optim.Adam, kiln.optim.Adam)
    assert not np.allclose(l2, k, rtol=1e-4, atol=1e-4)
    # AdamW is torch's subclass of Adam; its state into an Adam stays decoupled, an Adam's into an AdamW too
    assert issubclass(kiln.optim.AdamW, kiln.optim.Adam) == issubclass(torch.optim.AdamW, torch.optim.Adam)
    for a, b in ((kiln.optim.AdamW, kiln.optim.Adam), (kiln.optim.Adam, kiln.optim.AdamW)):
        ta, tb = getattr(torch.optim, a.__name__), getattr(torch.optim, b.__name__)
        ko, ko2, k = run(kiln, a, b)
        to, to2, t = run(torch, ta, tb)
        assert ko2.param_groups[0]["decoupled_weight_decay"] == to2.param_groups[0]["decoupled_weight_decay"]
        np.testing.assert_allclose(k, t, rtol=1e-5, atol=1e-5)


def test_adam_decoupled_weight_decay_per_group_as_torch():
    w = [RNG.standard_normal(3).astype(np.float32) for _ in range(2)]
    kps, tps = [kiln.nn.Parameter(kiln.tensor(x)) for x in w], [torch.nn.Parameter(torch.tensor(x)) for x in w]

    def groups(ps):
        return [{"params": [ps[0]], "weight_decay": 0.2, "decoupled_weight_decay": True},
                {"params": [ps[1]], "weight_decay": 0.1}]

    ko, to = kiln.optim.Adam(groups(kps), lr=0.05), torch.optim.Adam(groups(tps), lr=0.05)
    for i in range(4):
        if i == 2:  # an edit of the flag takes effect at the next step, as torch's
            ko.param_groups[1]["decoupled_weight_decay"] = True
            to.param_groups[1]["decoupled_weight_decay"] = True
        grads = [RNG.standard_normal(3).astype(np.float32) for _ in range(2)]
        set_grads(kps, tps, grads, [True, True])
        ko.step()
        to.step()
        close(kps, tps, 1e-5)
    assert [g["decoupled_weight_decay"] for g in ko.param_groups] == [True, True]


def test_bad_hyper_parameters_name_the_optimizer_and_the_value_as_torch():
    p = kiln.nn.Parameter(kiln.zeros(3))
    for cls in ("Adam", "AdamW"):
        with pytest.raises(ValueError, match=rf"^{cls}: Invalid epsilon value: -1.0"):
            getattr(kiln.optim, cls)([p], eps=-1)
        with pytest.raises(ValueError, match=rf"^{cls}: Invalid beta parameter at index 0: 1.0"):
            getattr(kiln.optim, cls)([p], betas=(1.0, 0.9))
    o = kiln.optim.Adam([p])
    with pytest.raises(ValueError, match=r"Adam: Invalid epsilon value: -0.5"):
        o.param_groups[0]["eps"] = -0.5
    # torch's defaults
    tp = torch.nn.Parameter(torch.zeros(3))
    for cls in ("SGD", "Adam", "AdamW"):
        k, t = getattr(kiln.optim, cls)([p]).defaults, getattr(torch.optim, cls)([tp]).defaults
        assert {key: k[key] for key in ("lr", "weight_decay")} == {key: t[key] for key in ("lr", "weight_decay")}


def test_a_groups_params_list_cannot_change_in_place():
    # The engine steps the tensors it was given: `group['params'][0] = t` changed only the Python list (the
    # engine went on stepping the old tensor while the list showed the new), so it is refused, as replacing
    # the whole list was; copies and pickles are plain lists, and add_param_group still adds.
    import copy
    import pickle
    w, v = kiln.ones(2, requires_grad=True), kiln.zeros(2, requires_grad=True)
    opt = kiln.optim.SGD([w], lr=0.1)
    params = opt.param_groups[0]["params"]
    for change in (lambda: params.__setitem__(0, v), lambda: params.append(v), lambda: params.pop(),
                   lambda: params.extend([v]), lambda: params.remove(w), lambda: params.clear()):
        with pytest.raises(kiln.KilnValueError, match=r"param_groups\[0\]\['params'\] cannot be changed after"):
            change()
    assert len(params) == 1 and params[0] is w and params == [w]
    assert type(copy.deepcopy(params)) is list and len(pickle.loads(pickle.dumps(params))) == 1
    opt.add_param_group({"params": [v]})
    assert len(opt.param_groups) == 2 and opt.param_groups[1]["params"] == [v]
    w.grad = kiln.ones(2)
    opt.step()
    assert w.tolist() == pytest.approx([0.9, 0.9])
