# kiln.optim.RMSprop and kiln.optim.Adagrad against torch.optim's: the same parameters after 20 steps for
# every option that changes the rule (momentum, centered, weight_decay, maximize; lr_decay,
# initial_accumulator_value), two groups of different lrs (one with its own options), state_dict() in
# torch's layout resuming both ways, LR schedulers, and bad hyper-parameters refused with torch's words.
import io
import itertools

import numpy as np
import pytest

import kiln

torch = pytest.importorskip("torch")

SHAPES = [(3, 2), (4,), (2, 2)]

RMSPROP = [dict(lr=0.01, alpha=0.9, eps=1e-6, momentum=m, centered=c, weight_decay=wd, maximize=mx)
           for m, c, wd, mx in itertools.product((0.0, 0.9), (False, True), (0.0, 0.05), (False, True))]
ADAGRAD = [dict(lr=0.1, lr_decay=ld, initial_accumulator_value=init, weight_decay=wd, maximize=mx)
           for ld, init, wd, mx in itertools.product((0.0, 0.05), (0.0, 0.3), (0.0, 0.02), (False, True))]
CASES = [("RMSprop", kw) for kw in RMSPROP] + [("Adagrad", kw) for kw in ADAGRAD]
IDS = [f"{n}-{'-'.join(f'{k}={v}' for k, v in kw.items())}" for n, kw in CASES]


def grads(rng, shapes=SHAPES):
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


def make(lib, name, kw, values, own=None):
    ps = [lib.tensor(v.copy(), requires_grad=True) for v in values]
    groups = [{"params": ps[:2]}, {"params": ps[2:], "lr": kw["lr"] / 2, **(own or {})}]
    return ps, getattr(lib.optim, name)(groups, **kw)


def run(lib, ps, opt, gs, skip_last=False, sched=None):
    for s, g in enumerate(gs):
        for i, (p, v) in enumerate(zip(ps, g)):
            # the last parameter gets its first gradient at the second step: its own step count
            p.grad = None if (i == len(ps) - 1 and s == 0 and skip_last) else lib.tensor(v)
        opt.step()
        if sched is not None:
            sched.step()


def numpy_of(t):
    return t.detach().cpu().numpy() if hasattr(t, "detach") else np.asarray(t)


def close(a, b):
    for x, y in zip(a, b):
        assert np.allclose(numpy_of(x), numpy_of(y), rtol=1e-5, atol=1e-6), (numpy_of(x), numpy_of(y))


@pytest.mark.parametrize("name,kw", CASES, ids=IDS)
def test_twenty_steps_as_torch(name, kw):
    rng = np.random.default_rng(7)
    values = grads(rng)
    gs = [grads(rng) for _ in range(20)]
    kps, ko = make(kiln, name, kw, values)
    tps, to = make(torch, name, kw, values)
    run(kiln, kps, ko, gs, skip_last=True)
    run(torch, tps, to, gs, skip_last=True)
    close(kps, tps)
    ks, ts = ko.state_dict(), to.state_dict()
    assert list(ks["state"]) == list(ts["state"])
    for i, te in ts["state"].items():
        assert list(ks["state"][i]) == list(te), (i, list(ks["state"][i]), list(te))
        close([ks["state"][i][k] for k in te], list(te.values()))
    for kg, tg in zip(ks["param_groups"], ts["param_groups"]):
        assert [k for k in kg if k in tg] == list(tg)  # torch's keys, in torch's order
        assert {k: kg[k] for k in tg} == tg


@pytest.mark.parametrize("name,own", [("RMSprop", dict(momentum=0.5, centered=True, alpha=0.8)),
                                      ("Adagrad", dict(lr_decay=0.1, eps=1e-6, initial_accumulator_value=0.5))])
def test_a_groups_own_options_as_torch(name, own):
    rng = np.random.default_rng(8)
    values = grads(rng)
    gs = [grads(rng) for _ in range(20)]
    kw = dict(lr=0.02)
    kps, ko = make(kiln, name, kw, values, own)
    tps, to = make(torch, name, kw, values, own)
    run(kiln, kps, ko, gs)
    run(torch, tps, to, gs)
    close(kps, tps)
    assert {k: ko.param_groups[1][k] for k in own} == own


@pytest.mark.parametrize("name,kw", [CASES[i] for i in (5, 15, 16 + 7, 16 + 13)],
                         ids=[IDS[i] for i in (5, 15, 16 + 7, 16 + 13)])
def test_state_dict_resumes_both_ways(name, kw):
    rng = np.random.default_rng(9)
    values = grads(rng)
    before, after = [grads(rng) for _ in range(10)], [grads(rng) for _ in range(10)]
    tps, to = make(torch, name, kw, values)
    run(torch, tps, to, before + after, skip_last=True)

    # torch's first half, through torch.save / torch.load, resumed in Kiln
    tps1, to1 = make(torch, name, kw, values)
    run(torch, tps1, to1, before, skip_last=True)
    buf = io.BytesIO()
    torch.save({"model": [p.detach() for p in tps1], "optimizer": to1.state_dict()}, buf)
    buf.seek(0)
    ckpt = torch.load(buf)
    kps2, ko2 = make(kiln, name, kw, [p.numpy() for p in ckpt["model"]])
    ko2.load_state_dict(ckpt["optimizer"])
    run(kiln, kps2, ko2, after)
    close(kps2, tps)

    # Kiln's first half, its state_dict() handed to torch
    kps3, ko3 = make(kiln, name, kw, values)
    run(kiln, kps3, ko3, before, skip_last=True)
    sd = ko3.state_dict()
    tps4, to4 = make(torch, name, kw, [numpy_of(p) for p in kps3])
    to4.load_state_dict({"state": {i: {k: torch.from_numpy(numpy_of(v).copy()) for k, v in e.items()}
                                   for i, e in sd["state"].items()},
                         "param_groups": sd["param_groups"]})
    run(torch, tps4, to4, after)
    close(tps4, tps)

    # and Kiln to Kiln, bit for bit
    kps, ko = make(kiln, name, kw, values)
    run(kiln, kps, ko, before + after, skip_last=True)
    kps5, ko5 = make(kiln, name, kw, [numpy_of(p) for p in kps3])
    ko5.load_state_dict(sd)
    run(kiln, kps5, ko5, after)
    for a, b in zip(kps5, kps):
        assert np.array_equal(numpy_of(a), numpy_of(b))


def test_adagrad_state_before_any_step_is_torchs():
    # torch's Adagrad makes every parameter's state at construction: step 0, sum = initial_accumulator_value
    values = grads(np.random.default_rng(10))
    ks = make(kiln, "Adagrad", dict(lr=0.1, initial_accumulator_value=0.25), values)[1].state_dict()
    ts = make(torch, "Adagrad", dict(lr=0.1, initial_accumulator_value=0.25), values)[1].state_dict()
    assert list(ks["state"]) == list(ts["state"]) == [0, 1, 2]
    for i, te in ts["state"].items():
        assert list(ks["state"][i]) == ["step", "sum"]
        close([ks["state"][i]["step"], ks["state"][i]["sum"]], [te["step"], te["sum"]])


def test_adagrad_add_param_groups_sum_starts_from_the_optimizers_initial_accumulator_value():
    # torch 2.x makes an added group's state at its first step from self.defaults: the optimizer's
    # initial_accumulator_value, not the group's own (kept as a key)
    rng = np.random.default_rng(14)
    values = grads(rng)
    gs = [grads(rng) for _ in range(5)]
    out = {}
    for lib in (kiln, torch):
        ps = [lib.tensor(v.copy(), requires_grad=True) for v in values]
        opt = lib.optim.Adagrad(ps[:2], lr=0.1, initial_accumulator_value=0.5)
        opt.add_param_group({"params": ps[2:], "initial_accumulator_value": 5.0, "lr_decay": 0.1})
        assert opt.param_groups[1]["initial_accumulator_value"] == 5.0
        run(lib, ps, opt, gs[:1])
        sums = [numpy_of(opt.state_dict()["state"][i]["sum"]).copy() for i in range(3)]
        run(lib, ps, opt, gs[1:])
        out[lib.__name__] = ps, sums
    close(out["kiln"][1], out["torch"][1])
    close(out["kiln"][0], out["torch"][0])
    # after one step: 0.5 + g^2, not 5 + g^2
    assert np.allclose(out["kiln"][1][2], 0.5 + gs[0][2] ** 2)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_adagrad_sum_of_a_16_bit_parameter_is_f32(dtype):
    # the sum is made in the engine's state dtype (f32), not the parameter's: 1e5 is not inf in f16, 0.1
    # is f32's 0.1, and the first step is the f32 rule's
    values = np.array([1.0, -2.0, 0.5], np.float32)
    for init in (1e5, 0.1):
        p = kiln.tensor(values).to(getattr(kiln, dtype)).requires_grad_()
        opt = kiln.optim.Adagrad([p], lr=0.1, initial_accumulator_value=init)
        s = opt.state_dict()["state"][0]["sum"]
        assert s.dtype == kiln.float32
        assert numpy_of(s).tolist() == [np.float32(init)] * 3
        g = np.array([0.25, -1.0, 2.0], np.float32)
        p.grad = kiln.tensor(g).to(getattr(kiln, dtype))
        opt.step()
        w = values.astype(np.float64) - 0.1 * g / (np.sqrt(np.float32(init) + g.astype(np.float64) ** 2) + 1e-10)
        tol = 1e-2 if dtype == "bfloat16" else 1e-3
        assert np.all(np.isfinite(numpy_of(p.float())))
        assert np.allclose(numpy_of(p.float()), w, rtol=tol, atol=tol), (numpy_of(p.float()), w)
        assert numpy_of(opt.state_dict()["state"][0]["sum"]).tolist() == \
            (np.float32(init) + g.astype(np.float32) ** 2).tolist()


def test_adagrad_bf16_parameter_under_a_grad_scaler():
    # one GradScaler step on a bfloat16 parameter (an f16 gradient is refused, as torch's): the unscaled
    # gradient steps the f32 sum, whose 0.1 is f32's
    p = kiln.tensor(np.array([1.0, 2.0], np.float32)).to(kiln.bfloat16).requires_grad_()
    opt = kiln.optim.Adagrad([p], lr=0.1, initial_accumulator_value=0.1)
    scaler = kiln.amp.GradScaler(init_scale=1024.0)
    p.grad = kiln.tensor(np.array([1024.0, 2048.0], np.float32)).to(kiln.bfloat16)
    scaler.step(opt)
    scaler.update()
    assert numpy_of(opt.state_dict()["state"][0]["sum"]).tolist() == [np.float32(0.1) + np.float32(1),
                                                                       np.float32(0.1) + np.float32(4)]
    w = np.array([1.0, 2.0]) - 0.1 * np.array([1.0, 2.0]) / np.sqrt(np.array([1.1, 4.1]))
    assert np.allclose(numpy_of(p.float()), w, atol=1e-2)


def test_rmsprop_state_saved_after_switching_momentum_and_centered_on_loads_back():
    # momentum and centered switched on after a step, the state saved before the next: the group says
    # momentum > 0 and centered, the entries have no momentum_buffer or grad_avg yet (the engine makes them
    # as zeros at the next step), so the state loads back and resumes as the run that went on
    rng = np.random.default_rng(11)
    values = grads(rng)
    before, after = [grads(rng) for _ in range(3)], [grads(rng) for _ in range(5)]
    kps, ko = make(kiln, "RMSprop", dict(lr=0.01), values)
    run(kiln, kps, ko, before)
    for g in ko.param_groups:
        g["momentum"], g["centered"] = 0.9, True
    sd = ko.state_dict()
    assert list(sd["state"][0]) == ["step", "square_avg"] and sd["param_groups"][0]["momentum"] == 0.9
    kps2, ko2 = make(kiln, "RMSprop", dict(lr=0.01), [numpy_of(p) for p in kps])
    ko2.load_state_dict(sd)
    assert ko2.param_groups[0]["momentum"] == 0.9 and ko2.param_groups[0]["centered"] is True
    run(kiln, kps, ko, after)
    run(kiln, kps2, ko2, after)
    for a, b in zip(kps2, kps):
        assert np.array_equal(numpy_of(a), numpy_of(b))
    assert list(ko2.state_dict()["state"][0]) == ["step", "square_avg", "momentum_buffer", "grad_avg"]
    # a slot that is there is still checked, and square_avg stays needed with step
    for label, edit, message in [
            ("wrong shape", lambda e: e.__setitem__("momentum_buffer", kiln.tensor(np.zeros(7, np.float32))),
             r"'momentum_buffer' has shape \(7,\)"),
            ("unknown slot", lambda e: e.__setitem__("foo", kiln.tensor(np.zeros((3, 2), np.float32))), r"'foo', a slot"),
            ("no square_avg", lambda e: e.pop("square_avg"), r"has 'step' but no 'square_avg'")]:
        bad = {"state": {i: dict(e) for i, e in sd["state"].items()}, "param_groups": sd["param_groups"]}
        edit(bad["state"][0])
        with pytest.raises(ValueError, match=message):
            ko2.load_state_dict(bad)


@pytest.mark.parametrize("name,kw", [("RMSprop", dict(lr=0.05, momentum=0.5, centered=True)),
                                     ("Adagrad", dict(lr=0.2, lr_decay=0.01))])
@pytest.mark.parametrize("sched", [("StepLR", dict(step_size=3, gamma=0.5)), ("CosineAnnealingLR", dict(T_max=8))])
def test_lr_schedulers_drive_them_as_torch(name, kw, sched):
    rng = np.random.default_rng(13)
    values = grads(rng)
    gs = [grads(rng) for _ in range(12)]
    kps, ko = make(kiln, name, kw, values)
    tps, to = make(torch, name, kw, values)
    ks = getattr(kiln.optim.lr_scheduler, sched[0])(ko, **sched[1])
    ts = getattr(torch.optim.lr_scheduler, sched[0])(to, **sched[1])
    run(kiln, kps, ko, gs, sched=ks)
    run(torch, tps, to, gs, sched=ts)
    close(kps, tps)
    assert np.allclose([g["lr"] for g in ko.param_groups], [g["lr"] for g in to.param_groups])


@pytest.mark.parametrize("name,kw,message", [
    ("RMSprop", dict(lr=-0.1), "Invalid learning rate: -0.1"),
    ("RMSprop", dict(alpha=-0.5), "Invalid alpha value: -0.5"),
    ("RMSprop", dict(eps=-1e-8), "Invalid epsilon value: -1e-08"),
    ("RMSprop", dict(momentum=-0.9), "Invalid momentum value: -0.9"),
    ("RMSprop", dict(weight_decay=-1), "Invalid weight_decay value: -1 "),
    ("RMSprop", dict(alpha=float("nan")), "Invalid alpha value: nan"),
    ("Adagrad", dict(lr=-1), "Invalid learning rate: -1 "),
    ("Adagrad", dict(lr_decay=-0.1), "Invalid lr_decay value: -0.1"),
    ("Adagrad", dict(weight_decay=-0.1), "Invalid weight_decay value: -0.1"),
    ("Adagrad", dict(initial_accumulator_value=-2), "Invalid initial_accumulator_value value: -2 "),
    ("Adagrad", dict(eps=-1), "Invalid epsilon value: -1 "),
])
def test_bad_hyper_parameters_are_refused_as_torch(name, kw, message):
    p = kiln.tensor(np.ones(3, np.float32), requires_grad=True)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(".", r"\.")):
        getattr(kiln.optim, name)([p], **kw)
    tp = torch.tensor(np.ones(3, np.float32), requires_grad=True)
    with pytest.raises(ValueError):
        getattr(torch.optim, name)([tp], **kw)
    # a group's own bad value too, naming it
    opt = getattr(kiln.optim, name)([p])
    key = next(k for k in kw if k != "lr") if any(k != "lr" for k in kw) else None
    if key is not None and key != "weight_decay":
        with pytest.raises(ValueError, match=key):
            opt.param_groups[0][key] = kw[key]
