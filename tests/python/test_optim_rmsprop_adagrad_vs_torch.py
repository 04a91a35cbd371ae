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


def test_a_torch_state_missing_a_slot_its_options_need_is_refused():
    values = grads(np.random.default_rng(11))
    tps, to = make(torch, "RMSprop", dict(lr=0.01, momentum=0.9), values)
    run(torch, tps, to, [grads(np.random.default_rng(12))])
    sd = to.state_dict()
    del sd["state"][0]["momentum_buffer"]
    ko = make(kiln, "RMSprop", dict(lr=0.01, momentum=0.9), values)[1]
    with pytest.raises(ValueError, match=r"state\[0\] .*has 'step', 'square_avg' but no 'momentum_buffer'"):
        ko.load_state_dict(sd)


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
