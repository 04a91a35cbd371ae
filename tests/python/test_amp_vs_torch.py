# kiln.amp.GradScaler against torch.amp.GradScaler: the scale sequence and weights with several
# optimizers (torch's unscale_/unscale_/step/step/update pattern) and with non-power-of-two factors
# (the scale kept in f32), the misuse errors, 16-bit gradients refused, torch's call forms
# (the device first) and numpy scalars in load_state_dict; and what Kiln adds: a scale below the
# smallest normal f32 refused, and an overflow made by unscaling caught.
import re

import numpy as np
import pytest

import kiln

torch = pytest.importorskip("torch")

FLT_MIN = float(np.finfo(np.float32).tiny)


def _run_two(lib, steps, inf_steps):
    """Two SGD optimizers, each unscaled, then each stepped, then one update; optimizer 2's
    gradient is inf on inf_steps."""
    w0, x = np.linspace(-1, 1, 4).astype(np.float32), np.arange(1, 5).astype(np.float32)
    if lib == "torch":
        t = torch.tensor
        a, b = t(w0, requires_grad=True), t(w0[::-1].copy(), requires_grad=True)
        oa, ob = torch.optim.SGD([a], lr=0.1, momentum=0.9), torch.optim.SGD([b], lr=0.05)
        s = torch.amp.GradScaler("cpu", init_scale=1000.0, growth_factor=1.5, backoff_factor=0.3, growth_interval=2)
        xs, tsum = t(x), torch.sum
    else:
        t = kiln.tensor
        a, b = t(w0, requires_grad=True), t(w0[::-1].copy(), requires_grad=True)
        oa, ob = kiln.optim.SGD([a], lr=0.1, momentum=0.9), kiln.optim.SGD([b], lr=0.05)
        s = kiln.amp.GradScaler("cpu", init_scale=1000.0, growth_factor=1.5, backoff_factor=0.3, growth_interval=2)
        xs, tsum = t(x), kiln.sum
    scales, wa, wb = [], [], []
    for i in range(steps):
        oa.zero_grad()
        ob.zero_grad()
        loss = tsum(a * xs) + tsum(b * b) * (float("inf") if i in inf_steps else 1.0)
        s.scale(loss).backward()
        s.unscale_(oa)
        s.unscale_(ob)
        s.step(oa)
        s.step(ob)
        s.update()
        scales.append(s.get_scale())
        wa.append(np.array(a.tolist()))
        wb.append(np.array(b.tolist()))
    return scales, np.array(wa), np.array(wb), s.state_dict()


def test_two_optimizers_as_torch_with_infs_in_one():
    inf_steps = (1, 2, 6)
    ts, twa, twb, tsd = _run_two("torch", 10, inf_steps)
    ks, kwa, kwb, ksd = _run_two("kiln", 10, inf_steps)
    assert ks == ts  # growth 1.5, backoff 0.3: the same f32 values (an f64 scale drifted)
    np.testing.assert_allclose(kwa, twa, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(kwb, twb, rtol=1e-6, atol=1e-7)
    assert ksd == tsd


def test_misuse_errors_as_torch():
    w = kiln.tensor([1.0, 2.0], requires_grad=True)
    opt = kiln.optim.SGD([w], lr=0.1)
    s = kiln.amp.GradScaler()
    with pytest.raises(kiln.KilnError, match=r"update\(\) needs a step\(\) first"):
        s.update()
    s.scale(kiln.sum(w * w)).backward()
    s.unscale_(opt)
    with pytest.raises(kiln.KilnError, match=r"unscale\(\) was already called on this optimizer"):
        s.unscale_(opt)
    s.step(opt)
    with pytest.raises(kiln.KilnError, match=r"unscale\(\) is being called after step\(\)"):
        s.unscale_(opt)
    with pytest.raises(kiln.KilnError, match=r"step\(\) was already called on this optimizer"):
        s.step(opt)
    s.update()
    with pytest.raises(kiln.KilnError, match=r"update\(\) needs a step\(\) first"):
        s.update()


def test_16_bit_gradients_are_refused_as_torch():
    p = kiln.tensor(np.ones(3, np.float16), requires_grad=True)
    opt = kiln.optim.SGD([p], lr=0.1)
    s = kiln.amp.GradScaler()
    s.scale(kiln.sum(p.float() * 3.0)).backward()
    assert p.grad.dtype == kiln.float16
    for call in (s.unscale_, s.step):
        with pytest.raises(kiln.KilnValueError, match=r"param_groups\[0\] parameter 0 \(shape \[3\]\) has a"):
            call(opt)
    tp = torch.ones(3, dtype=torch.float16, requires_grad=True)
    ts = torch.amp.GradScaler("cpu")
    ts.scale((tp.float() * 3.0).sum()).backward()
    with pytest.raises(ValueError, match="Attempting to unscale FP16 gradients"):
        ts.unscale_(torch.optim.SGD([tp], lr=0.1))
    assert p.tolist() == [1.0, 1.0, 1.0]
    # bf16 gradients are unscaled, as torch's (f32's exponent range: no underflow)
    b = kiln.cast(kiln.ones(3), kiln.bfloat16).requires_grad_()
    sb = kiln.amp.GradScaler(init_scale=4.0)
    optb = kiln.optim.SGD([b], lr=1.0)
    sb.scale(kiln.sum(b.float() * 3.0)).backward()
    sb.step(optb)
    tb = torch.ones(3, dtype=torch.bfloat16, requires_grad=True)
    tsb = torch.amp.GradScaler("cpu", init_scale=4.0)
    tsb.scale((tb.float() * 3.0).sum()).backward()
    tsb.step(torch.optim.SGD([tb], lr=1.0))
    assert kiln.cast(b.detach(), kiln.float32).tolist() == tb.detach().float().tolist() == [-2.0, -2.0, -2.0]


def test_a_scale_below_the_smallest_normal_f32_is_refused():
    for bad in (1e-50, 1e-39, 0.0, -1.0, 1e39):
        with pytest.raises(kiln.KilnError, match="init_scale must be a normal f32 value .*got " + re.escape(f"{bad:g}")):
            kiln.amp.GradScaler(init_scale=bad)
    # At the smallest normal scale: a finite gradient whose unscaled value is inf skips the step
    # (the check sees the unscaled values), and backoff stays at FLT_MIN.
    w = kiln.tensor([1.0, 2.0], requires_grad=True)
    opt = kiln.optim.SGD([w], lr=0.1)
    s = kiln.amp.GradScaler(init_scale=FLT_MIN)
    w.grad = kiln.tensor([1e30, 1.0])  # as a backward of a scaled loss left it: finite, 1e30 / FLT_MIN is not
    s.step(opt)
    s.update()
    assert w.tolist() == [1.0, 2.0] and s.skipped_steps == 1 and s.get_scale() == FLT_MIN


def test_torch_call_forms_and_numpy_state():
    s = kiln.amp.GradScaler("cpu", 1024.0, growth_interval=3)
    assert s.get_scale() == 1024.0 and kiln.amp.GradScaler(512.0).get_scale() == 512.0
    with pytest.raises(kiln.KilnValueError, match="device 'tpu'"):
        kiln.amp.GradScaler("tpu")
    a, b = kiln.randn(2, 3), kiln.randn(3, 2)
    with kiln.amp.autocast("cpu", dtype=kiln.float16):
        assert (a @ b).dtype == kiln.float16
    with kiln.amp.autocast("cpu"):  # torch's CPU default
        assert (a @ b).dtype == kiln.bfloat16
    with kiln.amp.autocast(kiln.float16, False):
        assert (a @ b).dtype == kiln.float32
    sd = {"scale": np.float32(18.225), "growth_factor": np.float64(1.5), "backoff_factor": np.float32(0.25),
          "growth_interval": np.int64(3), "_growth_tracker": np.int64(1)}
    s.load_state_dict(sd)
    t = torch.amp.GradScaler("cpu")
    t.load_state_dict(sd)
    assert s.get_scale() == t.get_scale() == float(np.float32(18.225))
    assert s.state_dict()["_growth_tracker"] == 1 and s.get_growth_interval() == 3
    # A checkpoint from when the scale was an f64: rounded to f32 on load.
    s.load_state_dict({**s.state_dict(), "scale": 18.224999999999998})
    assert s.get_scale() == float(np.float32(18.225))


def test_add_param_group_between_unscale_and_step_keeps_the_stage_as_torch():
    # torch keys the stage by the optimizer: unscale_, add_param_group, step unscales once.
    def run(mod, make_opt, scaler):
        p = (kiln.tensor([1.0], requires_grad=True) if mod is kiln else torch.tensor([1.0], requires_grad=True))
        q = (kiln.tensor([1.0], requires_grad=True) if mod is kiln else torch.tensor([1.0], requires_grad=True))
        opt = make_opt([p])
        (scaler.scale((p * 2.0).sum() + (q * 2.0).sum())).backward()
        scaler.unscale_(opt)
        opt.add_param_group({"params": [q]})
        scaler.step(opt)
        scaler.update()
        return [float(p.detach().tolist()[0]), float(q.detach().tolist()[0])]
    k = run(kiln, lambda ps: kiln.optim.SGD(ps, lr=1.0), kiln.amp.GradScaler(init_scale=4.0))
    t = run(torch, lambda ps: torch.optim.SGD(ps, lr=1.0), torch.amp.GradScaler("cpu", init_scale=4.0))
    assert k == t == [-1.0, -7.0]  # p unscaled once (grad 2); q added after the unscale: grad 8, as torch


def test_older_positional_form_of_grad_scaler():
    s = kiln.amp.GradScaler(1024.0, 3.0, 0.25, 7)
    assert s.state_dict()["scale"] == 1024.0 and s.state_dict()["growth_factor"] == 3.0
    assert s.state_dict()["backoff_factor"] == 0.25 and s.state_dict()["growth_interval"] == 7
    s = kiln.amp.GradScaler("cpu", 512.0, growth_interval=9)
    assert s.get_scale() == 512.0 and s.state_dict()["growth_interval"] == 9
    with pytest.raises(TypeError, match="multiple values for argument 'init_scale'"):
        kiln.amp.GradScaler(1024.0, init_scale=2.0)
    with pytest.raises(TypeError, match="unexpected keyword"):
        kiln.amp.GradScaler(init_scal=2.0)


@pytest.mark.parametrize("interval", [0, -3])
def test_a_growth_interval_of_zero_or_less_never_grows_the_scale_as_torch(interval):
    # torch takes any int: its count of clean steps (1, 2, ...) never equals it, so the scale stays.
    def run(mod, scaler):
        p = mod.tensor([1.0, 2.0], requires_grad=True)
        opt = mod.optim.SGD([p], lr=0.1)
        for i in range(5):
            opt.zero_grad()
            scaler.scale((p * (float("inf") if i == 2 else 1.0)).sum()).backward()
            scaler.step(opt)
            scaler.update()
        return scaler.get_scale(), scaler.state_dict(), p.detach().tolist()
    t = run(torch, torch.amp.GradScaler("cpu", init_scale=8.0, growth_interval=interval))
    k = run(kiln, kiln.amp.GradScaler("cpu", init_scale=8.0, growth_interval=interval))
    assert k == t and k[0] == 4.0 and k[1]["_growth_tracker"] == 2  # backed off once, never grown
    s = kiln.amp.GradScaler("cpu", growth_interval=5)
    s.load_state_dict(t[1])  # torch's state with that interval loads too
    assert s.get_growth_interval() == interval and s.get_scale() == 4.0


def test_an_autocast_object_shared_by_threads_exits_each_threads_own_region():
    # The object kept the regions it had entered in one list: thread A's __exit__ popped thread B's
    # region (entered later), so A stayed in autocast and B fell out of its own region early.
    import threading

    shared, a, b = kiln.amp.autocast(kiln.bfloat16), {}, {}
    entered_a, entered_b, exited_a = threading.Event(), threading.Event(), threading.Event()

    def thread_a():
        shared.__enter__()
        entered_a.set()
        entered_b.wait(10)
        a["inside"] = kiln.autocast_dtype()
        shared.__exit__(None, None, None)
        a["after"] = kiln.autocast_dtype()
        exited_a.set()

    def thread_b():
        with kiln.amp.autocast(kiln.float16):
            entered_a.wait(10)
            shared.__enter__()
            entered_b.set()
            exited_a.wait(10)
            b["inside"] = kiln.autocast_dtype()
            shared.__exit__(None, None, None)
            b["after_inner"] = kiln.autocast_dtype()
        b["after_outer"] = kiln.autocast_dtype()

    threads = [threading.Thread(target=thread_a), threading.Thread(target=thread_b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert a == {"inside": kiln.bfloat16, "after": None}
    assert b == {"inside": kiln.bfloat16, "after_inner": kiln.float16, "after_outer": None}
    with pytest.raises(kiln.KilnError, match="no region of this autocast open"):
        shared.__exit__(None, None, None)


def test_an_autocast_object_copies_and_pickles_as_torchs():
    import copy
    import pickle

    a = kiln.amp.autocast(kiln.bfloat16)
    with a:
        b = copy.deepcopy(a)
        c = pickle.loads(pickle.dumps(a))
    for x in (b, c, copy.copy(a)):
        assert (x.dtype, x.enabled) == (a.dtype, a.enabled)
        with x:
            assert (kiln.ones(2, 2) @ kiln.ones(2, 2)).dtype == kiln.bfloat16
        assert (kiln.ones(2, 2) @ kiln.ones(2, 2)).dtype == kiln.float32
    torch_copy = copy.deepcopy(torch.autocast("cpu", dtype=torch.bfloat16))
    assert torch_copy.fast_dtype == torch.bfloat16
