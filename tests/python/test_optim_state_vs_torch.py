# kiln.optim's state_dict() in torch's layout ({"state": {index: {...}}, "param_groups": [...]}): key by key
# as torch.optim's for each optimizer and its options, a torch run resumed in Kiln from torch's saved state
# (torch.save / torch.load) and a Kiln run resumed in torch from Kiln's, both stepping as the run that
# continued unbroken; Kiln's older layout {"tensors", "scalars", "groups"} still loads; refused loads say
# which group, parameter and key, and change nothing; opt.steps comes back through the first group's
# "kiln_steps"; hundreds of parameters read the engine's state once.
import io
import pathlib
import re

import numpy as np
import pytest

import kiln

torch = pytest.importorskip("torch")

SHAPES = [(3, 2), (4,), (2, 2)]

CASES = [
    ("SGD", dict(lr=0.05)),
    ("SGD", dict(lr=0.05, momentum=0.9, weight_decay=0.01)),
    ("SGD", dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.02)),
    ("SGD", dict(lr=0.05, momentum=0.8, dampening=0.1, maximize=True)),
    ("Adam", dict(lr=0.05, betas=(0.8, 0.99), eps=1e-7)),
    ("Adam", dict(lr=0.05, weight_decay=0.03)),
    ("Adam", dict(lr=0.05, weight_decay=0.03, decoupled_weight_decay=True)),
    ("AdamW", dict(lr=0.05, weight_decay=0.02)),
    ("AdamW", dict(lr=0.05, weight_decay=0.02, maximize=True)),
]
IDS = [f"{n}-{'-'.join(f'{k}={v}' for k, v in kw.items())}" for n, kw in CASES]


def grads(rng, shapes=SHAPES):
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


def make(lib, name, kw, values):
    ps = [lib.tensor(v.copy(), requires_grad=True) for v in values]
    groups = [{"params": ps[:2]}, {"params": ps[2:], "lr": kw["lr"] / 2}]
    return ps, getattr(lib.optim, name)(groups, **kw)


def run(lib, ps, opt, gs, skip_last=False):
    for s, g in enumerate(gs):
        for i, (p, v) in enumerate(zip(ps, g)):
            # the last parameter gets its first gradient at the second step: its own step count
            p.grad = None if (i == len(ps) - 1 and s == 0 and skip_last) else lib.tensor(v)
        opt.step()


def numpy_of(t):
    return t.detach().cpu().numpy() if hasattr(t, "detach") else np.asarray(t)


def same_layout(k, t):
    """k (Kiln's state_dict) holds torch's t's keys, value types and values, state tensor by tensor."""
    assert list(k) == list(t) == ["state", "param_groups"]
    assert len(k["param_groups"]) == len(t["param_groups"])
    for g, (kg, tg) in enumerate(zip(k["param_groups"], t["param_groups"])):
        extra = set(kg) - set(tg)
        # Kiln's group name, kept as torch keeps initial_lr, and the first group's note of opt.steps
        assert extra <= ({"name", "kiln_steps"} if g == 0 else {"name"}), extra
        assert [x for x in kg if x in tg] == list(tg)  # torch's keys, in torch's order
        for key, tv in tg.items():
            assert kg[key] == tv and type(kg[key]) in (type(tv), float), (key, kg[key], tv)
    assert list(k["state"]) == list(t["state"])
    for index, te in t["state"].items():
        ke = k["state"][index]
        assert list(ke) == list(te), (index, list(ke), list(te))
        for slot, tv in te.items():
            kv = ke[slot]
            assert isinstance(kv, kiln.Tensor) and tuple(kv.shape) == tuple(tv.shape), (index, slot)
            assert str(kv.dtype).split(".")[-1] == str(tv.dtype).split(".")[-1], (index, slot, kv.dtype, tv.dtype)
            assert np.allclose(numpy_of(kv), numpy_of(tv), rtol=1e-5, atol=1e-6), (index, slot)


@pytest.mark.parametrize("name,kw", CASES, ids=IDS)
def test_layout_is_torchs(name, kw):
    rng = np.random.default_rng(1)
    values = grads(rng)
    kps, ko = make(kiln, name, kw, values)
    tps, to = make(torch, name, kw, values)
    same_layout(ko.state_dict(), to.state_dict())  # before any step: no state
    gs = [grads(rng) for _ in range(3)]
    run(kiln, kps, ko, gs, skip_last=True)
    run(torch, tps, to, gs, skip_last=True)
    same_layout(ko.state_dict(), to.state_dict())


@pytest.mark.parametrize("name,kw", CASES, ids=IDS)
def test_torch_state_resumes_in_kiln_and_kiln_state_in_torch(name, kw):
    rng = np.random.default_rng(2)
    values = grads(rng)
    before, after = [grads(rng) for _ in range(3)], [grads(rng) for _ in range(3)]
    # the whole run in torch, and in Kiln
    tps, to = make(torch, name, kw, values)
    run(torch, tps, to, before + after, skip_last=True)
    kps, ko = make(kiln, name, kw, values)
    run(kiln, kps, ko, before + after, skip_last=True)
    for a, b in zip(kps, tps):
        assert np.allclose(numpy_of(a), numpy_of(b), rtol=1e-5, atol=1e-6)

    # torch's first half, saved as torch saves a checkpoint, resumed in Kiln
    tps1, to1 = make(torch, name, kw, values)
    run(torch, tps1, to1, before, skip_last=True)
    buf = io.BytesIO()
    torch.save({"model": [p.detach() for p in tps1], "optimizer": to1.state_dict()}, buf)
    buf.seek(0)
    ckpt = torch.load(buf)
    kps2, ko2 = make(kiln, name, kw, [p.numpy() for p in ckpt["model"]])
    ko2.load_state_dict(ckpt["optimizer"])
    run(kiln, kps2, ko2, after)
    for a, b in zip(kps2, tps):
        assert np.allclose(numpy_of(a), numpy_of(b), rtol=1e-5, atol=1e-6)

    # Kiln's first half, its state_dict() handed to torch
    kps3, ko3 = make(kiln, name, kw, values)
    run(kiln, kps3, ko3, before, skip_last=True)
    sd = ko3.state_dict()
    tps4, to4 = make(torch, name, kw, [numpy_of(p) for p in kps3])
    to4.load_state_dict({"state": {i: {k: torch.from_numpy(numpy_of(v).copy()) for k, v in e.items()}
                                   for i, e in sd["state"].items()},
                         "param_groups": sd["param_groups"]})
    run(torch, tps4, to4, after)
    for a, b in zip(tps4, tps):
        assert np.allclose(numpy_of(a), numpy_of(b), rtol=1e-5, atol=1e-6)

    # and Kiln to Kiln, through its own state_dict()
    kps5, ko5 = make(kiln, name, kw, [numpy_of(p) for p in kps3])
    ko5.load_state_dict(sd)
    run(kiln, kps5, ko5, after)
    for a, b in zip(kps5, kps):
        assert np.array_equal(numpy_of(a), numpy_of(b))


def test_group_values_and_notes_come_with_the_state():
    # a torch state's lrs, options and a scheduler's initial_lr replace the optimizer's, as torch's load does
    rng = np.random.default_rng(3)
    values = grads(rng)
    tps, to = make(torch, "SGD", dict(lr=0.1, momentum=0.9), values)
    torch.optim.lr_scheduler.StepLR(to, 1, gamma=0.5)
    to.param_groups[1]["momentum"] = 0.5
    run(torch, tps, to, [grads(rng)])
    kps, ko = make(kiln, "SGD", dict(lr=0.3, momentum=0.1), values)
    ko.load_state_dict(to.state_dict())
    for kg, tg in zip(ko.param_groups, to.param_groups):
        assert (kg["lr"], kg["momentum"], kg["initial_lr"]) == (tg["lr"], tg["momentum"], tg["initial_lr"])
    assert ko.state_dict()["param_groups"][0]["initial_lr"] == 0.1
    # a Kiln scheduler built with last_epoch finds the notes
    kiln.optim.lr_scheduler.StepLR(ko, 1, gamma=0.5, last_epoch=0)


def test_adamw_state_into_adam_stays_decoupled():
    rng = np.random.default_rng(4)
    values = grads(rng)
    kps, ko = make(kiln, "AdamW", dict(lr=0.05, weight_decay=0.1), values)
    run(kiln, kps, ko, [grads(rng)])
    sd = ko.state_dict()
    assert [g["decoupled_weight_decay"] for g in sd["param_groups"]] == [True, True]
    adam = make(kiln, "Adam", dict(lr=0.01), values)[1]
    adam.load_state_dict(sd)
    assert [(g["decoupled_weight_decay"], g["weight_decay"]) for g in adam.param_groups] == [(True, 0.1)] * 2


def test_old_kiln_layout_still_loads():
    # {"tensors", "scalars", "groups"}, as Kiln wrote it before, through kiln.save_checkpoint's files too
    rng = np.random.default_rng(5)
    values = grads(rng)
    kps, ko = make(kiln, "AdamW", dict(lr=0.05, weight_decay=0.02), values)
    gs = [grads(rng) for _ in range(2)]
    run(kiln, kps, ko, gs, skip_last=True)
    tensors, scalars = ko._engine.state()
    groups = [{"initial_lr": 0.05, "maximize": False, "foreach": None, "fused": None,
               "decoupled_weight_decay": True}, {"initial_lr": 0.025, "maximize": False, "foreach": None,
                                                  "fused": None, "decoupled_weight_decay": True}]
    scalars = dict(scalars, **{"group0.weight_decay": 0.02, "group1.weight_decay": 0.02})
    old = {"tensors": tensors, "scalars": scalars, "groups": groups}
    fresh = make(kiln, "AdamW", dict(lr=0.5, weight_decay=0.5), values)[1]
    fresh.load_state_dict(old)
    sd, want = fresh.state_dict(), ko.state_dict()
    assert [g["initial_lr"] for g in sd["param_groups"]] == [0.05, 0.025]
    for a, b in zip(sd["param_groups"], want["param_groups"]):
        assert {k: v for k, v in a.items() if k != "initial_lr"} == b
    assert list(sd["state"]) == list(want["state"]) == [0, 1, 2]
    assert float(sd["state"][2]["step"]) == 1.0 and float(sd["state"][0]["step"]) == 2.0
    for i, e in want["state"].items():
        for k, v in e.items():
            assert np.array_equal(numpy_of(sd["state"][i][k]), numpy_of(v))


def test_old_kiln_checkpoint_file_still_loads(tmp_path):
    # docs/python.md's checkpoint of before: the optimizer's tensors under "opt/", its scalars and groups in the state
    rng = np.random.default_rng(6)
    values = grads(rng)
    kps, ko = make(kiln, "SGD", dict(lr=0.05, momentum=0.9), values)
    run(kiln, kps, ko, [grads(rng)])
    tensors, scalars = ko._engine.state()
    kiln.save_checkpoint(tmp_path / "old.kiln", {"opt/" + k: v for k, v in tensors.items()},
                         {"opt": {"scalars": scalars, "groups": [{"maximize": False}, {"maximize": False}]}})
    back_tensors, state = kiln.load_checkpoint(tmp_path / "old.kiln")
    fresh = make(kiln, "SGD", dict(lr=0.5, momentum=0.1), values)[1]
    fresh.load_state_dict({"tensors": {k[4:]: v for k, v in back_tensors.items() if k.startswith("opt/")},
                           **state["opt"]})
    a, b = fresh.state_dict(), ko.state_dict()
    assert a["param_groups"] == b["param_groups"]
    assert all(np.array_equal(numpy_of(a["state"][i]["momentum_buffer"]), numpy_of(e["momentum_buffer"]))
               for i, e in b["state"].items())


def snapshot(opt, ps):
    sd = opt.state_dict()
    state = {i: {k: numpy_of(v).copy() for k, v in e.items()} for i, e in sd["state"].items()}
    return repr(sd["param_groups"]), state, [numpy_of(p).copy() for p in ps]


def same_snapshot(a, b):
    assert a[0] == b[0] and list(a[1]) == list(b[1])
    for i in a[1]:
        assert all(np.array_equal(a[1][i][k], b[1][i][k]) for k in a[1][i])
    assert all(np.array_equal(x, y) for x, y in zip(a[2], b[2]))


def test_refused_loads_name_the_group_parameter_and_key_and_change_nothing():
    rng = np.random.default_rng(7)
    values = grads(rng)
    tps, to = make(torch, "Adam", dict(lr=0.05), values)
    run(torch, tps, to, [grads(rng)])
    good = to.state_dict()
    kps, ko = make(kiln, "Adam", dict(lr=0.01), values)
    run(kiln, kps, ko, [grads(rng)])
    before = snapshot(ko, kps)

    def refused(state, match, error=kiln.KilnValueError):
        with pytest.raises(error, match=match):
            ko.load_state_dict(state)
        same_snapshot(before, snapshot(ko, kps))

    refused({"param_groups": good["param_groups"][:1], "state": {}},
            r"Adam.load_state_dict: the state has 1 parameter group, this optimizer has 2")
    groups = [dict(good["param_groups"][0], params=[0]), good["param_groups"][1]]
    refused({"param_groups": groups, "state": {}},
            r"param_groups\[0\] has 1 parameter in the state, this optimizer's group 0 has 2")
    state = {i: dict(e) for i, e in good["state"].items()}
    state[1]["exp_avg"] = torch.zeros(5)
    refused({"param_groups": good["param_groups"], "state": state},
            r"state\[1\] \(param_groups\[0\]'s parameter 1\)'s 'exp_avg' has shape \(5,\), the parameter has \(4,\)")
    state = {i: dict(e) for i, e in good["state"].items()}
    state[2]["exp_avgg"] = state[2].pop("exp_avg")
    refused({"param_groups": good["param_groups"], "state": state},
            r"state\[2\] \(param_groups\[1\]'s parameter 0\) has 'exp_avgg', a slot Adam does not keep")
    state = {i: dict(e) for i, e in good["state"].items()}
    state[0]["max_exp_avg_sq"] = state[0]["exp_avg_sq"]
    refused({"param_groups": good["param_groups"], "state": state}, r"state\[0\] .*'max_exp_avg_sq' \(torch's amsgrad")
    refused({"param_groups": [dict(good["param_groups"][0], amsgrad=True), good["param_groups"][1]],
             "state": good["state"]}, r"param_groups\[0\] sets amsgrad=True")
    refused({"param_groups": good["param_groups"], "state": {7: good["state"][0]}}, r"state\[7\] is for no parameter")
    refused({"param_groups": [good["param_groups"][0], dict(good["param_groups"][1], betas=(0.9, 1.5))],
             "state": good["state"]}, r"param_groups\[1\]\['betas'\]")
    refused({"param_groups": [good["param_groups"][0], dict(good["param_groups"][1], lr=float("nan"))],
             "state": good["state"]}, r"group1.lr must be finite", kiln.KilnError)
    refused({}, r"'state' and 'param_groups'")
    # SGD keeps no step count: a torch Adam's state is refused by its slots
    sgd = make(kiln, "SGD", dict(lr=0.1, momentum=0.9), values)[1]
    with pytest.raises(kiln.KilnValueError, match=r"state\[0\] \(param_groups\[0\]'s parameter 0\) has 'step', a "
                                                  r"slot SGD does not keep \(it keeps 'momentum_buffer'\)"):
        sgd.load_state_dict(good)


def test_adam_refuses_a_state_with_only_some_of_a_parameters_keys():
    rng = np.random.default_rng(8)
    values = grads(rng)
    kps, ko = make(kiln, "Adam", dict(lr=0.01), values)
    run(kiln, kps, ko, [grads(rng)])
    good = ko.state_dict()
    before = snapshot(ko, kps)
    for entry, match in [({"step": 5}, r"state\[0\] \(param_groups\[0\]'s parameter 0\) has 'step' but no "
                                       r"'exp_avg', 'exp_avg_sq': a parameter's state holds all of 'step', "
                                       r"'exp_avg', 'exp_avg_sq'"),
                         ({k: v for k, v in good["state"][0].items() if k != "exp_avg_sq"},
                          r"state\[0\] .* has 'step', 'exp_avg' but no 'exp_avg_sq'"),
                         ({k: v for k, v in good["state"][0].items() if k != "step"},
                          r"state\[0\] .* has 'exp_avg', 'exp_avg_sq' but no 'step'")]:
        with pytest.raises(kiln.KilnValueError, match=match):
            ko.load_state_dict({"state": {**good["state"], 0: entry}, "param_groups": good["param_groups"]})
        same_snapshot(before, snapshot(ko, kps))
    # a parameter without state has no entry, or an empty one (torch's SGD without momentum: a None buffer)
    ko.load_state_dict({"state": {**good["state"], 0: {}}, "param_groups": good["param_groups"]})
    assert 0 not in ko.state_dict()["state"]
    sgd = make(kiln, "SGD", dict(lr=0.1), values)[1]
    tps, to = make(torch, "SGD", dict(lr=0.1), values)
    run(torch, tps, to, [grads(rng)])
    assert all(e == {"momentum_buffer": None} for e in to.state_dict()["state"].values())
    sgd.load_state_dict(to.state_dict())
    assert sgd.state_dict()["state"] == {}


def test_a_refused_group_key_changes_nothing():
    # the group keys (foreach, fused, maximize, capturable) are checked with everything else, before the
    # engine's state is loaded: a refused load keeps the lrs, the step count and the state
    rng = np.random.default_rng(9)
    values = grads(rng)
    tps, to = make(torch, "Adam", dict(lr=0.1), values)
    run(torch, tps, to, [grads(rng) for _ in range(3)])
    good = to.state_dict()
    kps, ko = make(kiln, "Adam", dict(lr=0.3), values)
    run(kiln, kps, ko, [grads(rng)])
    before, steps = snapshot(ko, kps), ko.steps
    for key, value in [("foreach", "x"), ("fused", 1), ("capturable", "yes")]:
        groups = [good["param_groups"][0], dict(good["param_groups"][1], **{key: value})]
        with pytest.raises(TypeError, match=rf"Adam.load_state_dict: param_groups\[1\]\['{key}'\] must be"):
            ko.load_state_dict({"state": good["state"], "param_groups": groups})
        same_snapshot(before, snapshot(ko, kps))
        assert ko.steps == steps and [g["lr"] for g in ko.param_groups] == [0.3, 0.15]
    # Kiln's older layout likewise
    tensors, scalars = ko._engine.state()
    scalars = dict(scalars, **{"group0.lr": 0.5, "steps": 9.0})
    with pytest.raises(TypeError, match=r"Adam.load_state_dict: groups\[0\]\['foreach'\] must be None, True or False"):
        ko.load_state_dict({"tensors": tensors, "scalars": scalars, "groups": [{"foreach": "x"}, {}]})
    same_snapshot(before, snapshot(ko, kps))
    assert ko.steps == steps
    ko.load_state_dict(good)  # and the good state loads
    assert [g["lr"] for g in ko.param_groups] == [0.1, 0.05] and ko.steps == 3


def test_steps_come_back_through_state_dict():
    # torch's layout has no optimizer-wide count: Kiln's is the first group's note "kiln_steps", which a
    # Kiln -> Kiln round trip restores (SGD's, and the Adam family's where gradients alternated and no
    # parameter's own count is the optimizer's); torch's load keeps it as a note and ignores it
    rng = np.random.default_rng(10)
    values = grads(rng)
    for name, kw in [("SGD", dict(lr=0.05, momentum=0.9)), ("Adam", dict(lr=0.05)), ("LAMB", dict(lr=0.05))]:
        kps, ko = make(kiln, name, kw, values)
        for s in range(4):  # the first two parameters step at even steps, the last at odd ones
            for i, p in enumerate(kps):
                p.grad = kiln.tensor(grads(rng)[i]) if (i == 2) == (s % 2 == 1) else None
            ko.step()
        assert ko.steps == 4
        sd = ko.state_dict()
        assert sd["param_groups"][0]["kiln_steps"] == 4 and "kiln_steps" not in sd["param_groups"][1]
        fresh = make(kiln, name, kw, values)[1]
        fresh.load_state_dict(sd)
        assert fresh.steps == 4, name
        assert "kiln_steps" not in fresh.param_groups[0]  # read, not kept as a note
        assert fresh.state_dict()["param_groups"] == sd["param_groups"]
        if name == "LAMB":
            continue
        # through torch and back: the note stays as it was; the Adam family's count is never below a parameter's
        tps, to = make(torch, name, kw, values)
        to.load_state_dict({"state": {i: {k: torch.tensor(numpy_of(v)) for k, v in e.items()}
                                      for i, e in sd["state"].items()}, "param_groups": sd["param_groups"]})
        run(torch, tps, to, [grads(rng) for _ in range(3)])
        back = make(kiln, name, kw, values)[1]
        back.load_state_dict(to.state_dict())
        assert back.steps == (4 if name == "SGD" else 5), name
    # torch's own state: SGD's count restarts at 0, the Adam family's is its parameters' largest
    for name, want in [("SGD", 0), ("Adam", 2)]:
        tps, to = make(torch, name, dict(lr=0.05, momentum=0.9) if name == "SGD" else dict(lr=0.05), values)
        run(torch, tps, to, [grads(rng) for _ in range(2)])
        fresh = make(kiln, name, dict(lr=0.05), values)[1]
        fresh.load_state_dict(to.state_dict())
        assert fresh.steps == want, name


def test_adam_takes_a_loaded_groups_capturable():
    rng = np.random.default_rng(11)
    values = grads(rng)
    to = make(torch, "Adam", dict(lr=0.05, capturable=True), values)[1]
    to.param_groups[1]["capturable"] = False
    ko = make(kiln, "Adam", dict(lr=0.05), values)[1]
    ko.load_state_dict(to.state_dict())
    assert [g["capturable"] for g in ko.state_dict()["param_groups"]] == [True, False]
    same_layout(ko.state_dict(), to.state_dict())


def test_lamb_refuses_torch_adams_amsgrad_and_differentiable():
    rng = np.random.default_rng(12)
    values = grads(rng)
    kps, ko = make(kiln, "LAMB", dict(lr=0.05), values)
    run(kiln, kps, ko, [grads(rng)])
    good = ko.state_dict()
    before = snapshot(ko, kps)
    for key in ("amsgrad", "differentiable"):
        with pytest.raises(kiln.KilnValueError, match=rf"LAMB.load_state_dict: param_groups\[1\] sets {key}=True, "
                                                      rf"which Kiln's LAMB does not implement"):
            groups = [good["param_groups"][0], dict(good["param_groups"][1], **{key: True})]
            ko.load_state_dict({"state": good["state"], "param_groups": groups})
        same_snapshot(before, snapshot(ko, kps))
    # False is torch's Adam's default: taken, and not kept as a note
    ko.load_state_dict({"state": good["state"], "param_groups": [dict(g, amsgrad=False, differentiable=False)
                                                                 for g in good["param_groups"]]})
    assert all("amsgrad" not in g and "differentiable" not in g for g in ko.param_groups)


def test_docs_recipe_for_kiln_state_in_torch_copies():
    # docs/python.md's recipe for Kiln's state tensors in torch: one torch step must not change Kiln's state
    doc = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "python.md").read_text()
    recipe = re.search(r"and Kiln's \(its tensors through\s+`([^`]+)`", doc).group(1)
    rng = np.random.default_rng(13)
    values = grads(rng)
    kps, ko = make(kiln, "Adam", dict(lr=0.05), values)
    run(kiln, kps, ko, [grads(rng)])
    sd = ko.state_dict()
    kept = {i: {k: numpy_of(v).copy() for k, v in e.items()} for i, e in sd["state"].items()}
    tps, to = make(torch, "Adam", dict(lr=0.05), values)
    to.load_state_dict({"state": {i: {k: eval(recipe, {"torch": torch, "t": v}) for k, v in e.items()}
                                  for i, e in sd["state"].items()}, "param_groups": sd["param_groups"]})
    run(torch, tps, to, [grads(rng)])
    for i, e in ko.state_dict()["state"].items():
        assert all(np.array_equal(numpy_of(v), kept[i][k]) for k, v in e.items()), i


class _CountedKeys(dict):
    """The engine's state tensors, counting the passes over their keys."""

    passes = 0

    def items(self):
        _CountedKeys.passes += 1
        return super().items()

    def keys(self):
        _CountedKeys.passes += 1
        return super().keys()

    def __iter__(self):
        _CountedKeys.passes += 1
        return super().__iter__()


class _CountingEngine:
    def __init__(self, engine):
        self._engine = engine

    def __getattr__(self, key):
        return getattr(self._engine, key)

    def state(self):
        tensors, scalars = self._engine.state()
        return _CountedKeys(tensors), scalars


@pytest.mark.parametrize("name", ["SGD", "Adam"])
def test_state_dict_of_many_parameters_reads_the_engine_state_once(name):
    # state_dict() and state took each parameter's tensors by a scan of every key of the engine's state:
    # quadratic in the number of parameters (2000 took a second). Now one pass: the keys are read once,
    # and the state is torch's for hundreds of parameters whose gradients come and go
    rng = np.random.default_rng(14)
    shapes = [(2,), (3,)] * 150
    values = grads(rng, shapes)
    kw = dict(lr=0.05, momentum=0.9) if name == "SGD" else dict(lr=0.05)
    kps, ko = make(kiln, name, kw, values)
    tps, to = make(torch, name, kw, values)
    for s in range(3):
        g = grads(rng, shapes)
        for lib, ps, opt in ((kiln, kps, ko), (torch, tps, to)):
            for j, (p, v) in enumerate(zip(ps, g)):
                p.grad = lib.tensor(v) if (j + s) % 3 else None  # each parameter misses one step of three
            opt.step()
    want = to.state_dict()  # torch's entries in the order its parameters first stepped, Kiln's by index
    same_layout(ko.state_dict(), {"state": dict(sorted(want["state"].items())), "param_groups": want["param_groups"]})
    ko._engine = _CountingEngine(ko._engine)
    _CountedKeys.passes = 0
    sd = ko.state_dict()
    assert _CountedKeys.passes == 1
    _CountedKeys.passes = 0
    state = ko.state
    assert _CountedKeys.passes == 1
    assert len(sd["state"]) == len(state) == len(shapes)
    for j, p in enumerate(kps):
        assert sd["state"][j].keys() == state[p].keys()
        assert all(np.array_equal(numpy_of(sd["state"][j][k]), numpy_of(v)) for k, v in state[p].items())


def test_adam_group_capturable_in_the_constructor_and_checked_when_set():
    # torch takes {"params": ..., "capturable": True} as a group's own; Kiln's constructor refused it
    # ("unknown key"), and param_groups[0]["capturable"] = "maybe" was stored unchecked
    rng = np.random.default_rng(13)
    values = grads(rng)
    for lib in (torch, kiln):
        ps = [lib.tensor(v.copy(), requires_grad=True) for v in values]
        for name in ("Adam", "AdamW"):
            opt = getattr(lib.optim, name)([{"params": ps[:2], "capturable": True}, {"params": ps[2:]}], lr=0.05)
            assert [g["capturable"] for g in opt.state_dict()["param_groups"]] == [True, False], (lib, name)
    kps, ko = make(kiln, "Adam", dict(lr=0.05), values)
    ko.param_groups[1]["capturable"] = True
    assert [g["capturable"] for g in ko.state_dict()["param_groups"]] == [False, True]
    for bad in ("maybe", 1, None):
        with pytest.raises(TypeError, match="capturable must be True or False"):
            ko.param_groups[0]["capturable"] = bad
        with pytest.raises(TypeError, match="capturable must be True or False"):
            kiln.optim.Adam([{"params": kps[:1], "capturable": bad}], lr=0.05)
    assert ko.param_groups[0]["capturable"] is False or "capturable" not in ko.param_groups[0]
    run(kiln, kps, ko, [grads(rng)])  # and it steps


@pytest.mark.parametrize("bad", ["3", True, [3], b"3"])
def test_kiln_steps_must_be_a_number(bad):
    # float() took "3" and True: a string or a bool is no step count
    rng = np.random.default_rng(14)
    values = grads(rng)
    kps, ko = make(kiln, "SGD", dict(lr=0.05, momentum=0.9), values)
    run(kiln, kps, ko, [grads(rng)])
    sd = ko.state_dict()
    groups = [dict(sd["param_groups"][0], kiln_steps=bad), sd["param_groups"][1]]
    with pytest.raises(kiln.KilnValueError, match=r"param_groups\[0\]\['kiln_steps'\] must be a number"):
        ko.load_state_dict({"state": sd["state"], "param_groups": groups})
    assert ko.steps == 1
    for good, want in ((3, 3), (4.0, 4), (np.int64(5), 5), (kiln.tensor(6.0), 6), (torch.tensor(7), 7)):
        ko.load_state_dict({"state": sd["state"], "param_groups": [dict(sd["param_groups"][0], kiln_steps=good),
                                                                  sd["param_groups"][1]]})
        assert ko.steps == want
