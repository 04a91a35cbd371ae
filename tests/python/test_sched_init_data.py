# kiln.optim.lr_scheduler, kiln.nn.init and kiln.data's torch-style pieces against torch: the lr
# sequences of every scheduler (to 1e-12, two groups of their own lr), their state_dict round trip,
# OneCycleLR's momentum; init's fans, gains and statistics; TensorDataset, random_split and DataLoader's
# torch defaults.
import math
import os
import signal
import threading

import numpy as np
import pytest

import kiln

torch = pytest.importorskip("torch")
KS, TS = kiln.optim.lr_scheduler, torch.optim.lr_scheduler


def optimizers(kind="sgd"):
    kp = [kiln.tensor([1.0], requires_grad=True), kiln.tensor([2.0], requires_grad=True)]
    tp = [torch.tensor([1.0], requires_grad=True), torch.tensor([2.0], requires_grad=True)]
    if kind == "sgd":
        make = lambda m, ps: m.SGD([{"params": [ps[0]]}, {"params": [ps[1]], "lr": 0.01}], lr=0.1, momentum=0.9)
    else:
        make = lambda m, ps: m.AdamW([{"params": [ps[0]]}, {"params": [ps[1]], "lr": 0.01}], lr=0.1)
    return make(kiln.optim, kp), make(torch.optim, tp)


SCHEDULERS = {
    "LambdaLR": lambda m, o: m.LambdaLR(o, lambda e: 0.95 ** e + 0.1 * (e % 3)),
    "LambdaLR_per_group": lambda m, o: m.LambdaLR(o, [lambda e: 1.0 / (e + 1), lambda e: 0.9 ** e]),
    "MultiplicativeLR": lambda m, o: m.MultiplicativeLR(o, lambda e: 0.97 if e % 2 else 0.99),
    "StepLR": lambda m, o: m.StepLR(o, step_size=7, gamma=0.5),
    "MultiStepLR": lambda m, o: m.MultiStepLR(o, milestones=[3, 10, 10, 30], gamma=0.3),
    "ExponentialLR": lambda m, o: m.ExponentialLR(o, gamma=0.93),
    "CosineAnnealingLR": lambda m, o: m.CosineAnnealingLR(o, T_max=20, eta_min=0.001),  # 50 steps: past T_max too
    "LinearLR": lambda m, o: m.LinearLR(o, start_factor=0.1, end_factor=0.8, total_iters=12),
    "ConstantLR": lambda m, o: m.ConstantLR(o, factor=0.25, total_iters=9),
    "OneCycleLR_cos": lambda m, o: m.OneCycleLR(o, max_lr=[0.5, 0.05], total_steps=50),
    "OneCycleLR_linear_3phase": lambda m, o: m.OneCycleLR(o, max_lr=0.4, epochs=5, steps_per_epoch=10, pct_start=0.25,
                                                          anneal_strategy="linear", three_phase=True),
    "OneCycleLR_no_momentum": lambda m, o: m.OneCycleLR(o, max_lr=0.4, total_steps=50, cycle_momentum=False),
    "SequentialLR": lambda m, o: m.SequentialLR(
        o, [m.LinearLR(o, start_factor=0.01, total_iters=5), m.CosineAnnealingLR(o, T_max=30),
            m.ExponentialLR(o, gamma=0.9)], milestones=[5, 35]),
    "PolynomialLR": lambda m, o: m.PolynomialLR(o, total_iters=30, power=2.0),
    "ChainedScheduler": lambda m, o: m.ChainedScheduler(
        [m.ConstantLR(o, factor=0.5, total_iters=4), m.ExponentialLR(o, gamma=0.95)]),
    "CosineAnnealingWarmRestarts": lambda m, o: m.CosineAnnealingWarmRestarts(o, T_0=4, T_mult=2, eta_min=1e-4),
    "CosineAnnealingWarmRestarts_T_mult_1": lambda m, o: m.CosineAnnealingWarmRestarts(o, T_0=6),
}


def lrs(opt):
    return [g["lr"] for g in opt.param_groups]


def momenta(opt):
    return [g["betas"][0] if "betas" in g else g["momentum"] for g in opt.param_groups]


@pytest.mark.parametrize("kind", ["sgd", "adamw"])
@pytest.mark.parametrize("name", sorted(SCHEDULERS))
def test_scheduler_lrs_equal_torchs(name, kind):
    ko, to = optimizers(kind)
    ks, ts = SCHEDULERS[name](KS, ko), SCHEDULERS[name](TS, to)
    if name not in ("SequentialLR", "ChainedScheduler"):  # (torch's have none)
        assert ks.base_lrs == pytest.approx(ts.base_lrs, rel=1e-15)
    assert [g["initial_lr"] for g in ko.param_groups] == [g["initial_lr"] for g in to.param_groups]
    for step in range(50):
        assert lrs(ko) == pytest.approx(lrs(to), rel=1e-12, abs=1e-15), step
        assert ks.get_last_lr() == pytest.approx(ts.get_last_lr(), rel=1e-12, abs=1e-15), step
        assert momenta(ko) == pytest.approx(momenta(to), rel=1e-12), step
        assert getattr(ks, "last_epoch", None) == getattr(ts, "last_epoch", None)  # (a ChainedScheduler has none)
        ko.step()
        to.step()
        if name.startswith("OneCycleLR") and step == 48:
            break  # total_steps: one step more is an error in both
        ks.step()
        ts.step()
        if step == 20:  # the state goes into a new scheduler over the same optimizer, which continues as torch's
            state = ks.state_dict()
            assert sorted(k for k in state if not k.startswith("_")) == \
                sorted(k for k in ts.state_dict() if not k.startswith("_"))
            ks2 = SCHEDULERS[name](KS, optimizers(kind)[0])
            for s in [ks2] + list(getattr(ks2, "_schedulers", [])):
                s.optimizer = ko
            ks2.load_state_dict(state)
            ks = ks2
    if name == "OneCycleLR_cos":  # (linear annealing goes below 0 past its end: test_a_schedule_below_0...)
        ks.step()
        ks.step()  # step 50 is the last torch allows
        with pytest.raises(ValueError, match="total_steps is 50"):
            ks.step()


PAST_THE_END = {
    "OneCycleLR_linear": (lambda m, o: m.OneCycleLR(o, max_lr=0.1, total_steps=10, anneal_strategy="linear"), 10),
    "OneCycleLR_linear_3phase": (lambda m, o: m.OneCycleLR(o, max_lr=0.1, total_steps=10, anneal_strategy="linear",
                                                           three_phase=True), 10),
    "LambdaLR": (lambda m, o: m.LambdaLR(o, lambda e: 1 - e / 3), 4),
}


@pytest.mark.parametrize("kind", ["sgd", "adamw"])
@pytest.mark.parametrize("name", sorted(PAST_THE_END))
def test_a_schedule_below_0_past_its_end_is_kept_as_torchs_and_refused_at_a_step(name, kind):
    # The ordinary loop `opt.step(); sched.step()` ends with a schedule's lr below 0 (OneCycleLR's linear
    # annealing, a LambdaLR past its end), never used: torch keeps it, and so does Kiln (it raised at the last
    # sched.step()). A step with it is refused (torch would ascend the gradient) and changes nothing.
    make, steps = PAST_THE_END[name]
    ko, to = optimizers(kind)
    ks, ts = make(KS, ko), make(TS, to)
    kp = [g["params"][0] for g in ko.param_groups]
    tp = [g["params"][0] for g in to.param_groups]
    for step in range(steps):
        for k, t, v in zip(kp, tp, (0.5 + step, -1.5 + step)):
            k.grad, t.grad = kiln.tensor([v]), torch.tensor([v])
        ko.step()
        to.step()
        ks.step()
        ts.step()
        assert lrs(ko) == pytest.approx(lrs(to), rel=1e-12, abs=1e-15), step
    assert min(lrs(to)) < 0 and ks.get_last_lr() == pytest.approx(ts.get_last_lr(), rel=1e-12)
    assert [k.item() for k in kp] == pytest.approx([t.item() for t in tp], rel=1e-6)
    # state_dict() round-trips the lr no step used
    ko2 = optimizers(kind)[0]
    ko2.load_state_dict(ko.state_dict())
    assert lrs(ko2) == lrs(ko)
    before = [k.item() for k in kp]
    for k in kp:
        k.grad = kiln.tensor([1.0])
    with pytest.raises(kiln.KilnError, match=r"group 0's lr is -0\.0[0-9]+ at this step; a step needs a finite "
                                             r"lr >= 0 .*maximize=True"):
        ko.step()
    assert [k.item() for k in kp] == before
    ko.param_groups[0]["lr"] = to.param_groups[0]["lr"] = -0.1  # stored as torch stores it
    assert lrs(ko) == lrs(to)
    extra = (kiln.tensor([3.0], requires_grad=True), torch.tensor([3.0], requires_grad=True))
    ko.add_param_group({"params": [extra[0]]})  # the engine rebuilt over the groups keeps their lrs
    to.add_param_group({"params": [extra[1]]})
    assert lrs(ko) == lrs(to)
    ko.param_groups[0]["lr"] = ko.param_groups[1]["lr"] = 0.1
    ko.step()
    assert all(k.item() != b for k, b in zip(kp, before))


def test_a_non_finite_scheduled_lr_changes_no_group():
    # every group's lr is checked before any changes, and last_epoch is put back
    ko, _ = optimizers()
    ks = KS.LambdaLR(ko, [lambda e: 1.0 / (e + 1), lambda e: math.inf if e == 2 else 1.0])
    ks.step()
    before = lrs(ko)
    with pytest.raises(ValueError, match=r"LambdaLR: step at epoch 2: group 1's lr would be inf \(an lr must be "
                                         r"finite\); no group's lr was changed"):
        ks.step()
    assert lrs(ko) == before and ks.last_epoch == 1
    with pytest.raises(kiln.KilnValueError, match="group 0's lr must be finite, got nan"):
        ko.param_groups[0]["lr"] = math.nan


def test_a_custom_scheduler_subclass_as_torchs():
    def make(base):
        class Warmup(base):
            def __init__(self, optimizer, warmup):
                self.warmup = warmup
                super().__init__(optimizer)

            def get_lr(self):
                return [b * min(1.0, (self.last_epoch + 1) / self.warmup) for b in self.base_lrs]
        return Warmup

    ko, to = optimizers()
    ks, ts = make(KS._LRScheduler)(ko, 4), make(TS._LRScheduler)(to, 4)
    for _ in range(6):
        assert lrs(ko) == pytest.approx(lrs(to), rel=1e-12) and ks.get_last_lr() == pytest.approx(ts.get_last_lr())
        ko.step()
        to.step()
        ks.step()
        ts.step()


def test_cosine_warm_restarts_with_fractional_epochs_and_closed_form_step():
    ko, to = optimizers()
    ks, ts = KS.CosineAnnealingWarmRestarts(ko, T_0=3, T_mult=2), TS.CosineAnnealingWarmRestarts(to, T_0=3, T_mult=2)
    for e in [0.0, 0.5, 1.25, 3.0, 4.75, 9.5, 20.0]:
        ks.step(e)
        ts.step(e)
        assert lrs(ko) == pytest.approx(lrs(to), rel=1e-12)
    ko, to = optimizers()
    ks, ts = KS.StepLR(ko, 3, 0.5), TS.StepLR(to, 3, 0.5)
    with pytest.warns(UserWarning):
        ks.step(7)
    with pytest.warns(UserWarning):
        ts.step(7)
    assert lrs(ko) == pytest.approx(lrs(to), rel=1e-12)


def test_reduce_lr_on_plateau_as_torch():
    for kwargs in [{}, {"mode": "max", "factor": 0.5, "patience": 2, "threshold_mode": "abs", "threshold": 0.01,
                        "cooldown": 1, "min_lr": [0.02, 0.001]}]:
        ko, to = optimizers()
        ks, ts = KS.ReduceLROnPlateau(ko, **kwargs), TS.ReduceLROnPlateau(to, **kwargs)
        metrics = [1.0, 0.9, 0.95, 0.9, 0.91, 0.92, 0.89, 0.9, 0.9, 0.9, 0.9, 0.88] * 4
        for i, m in enumerate(metrics):
            ks.step(m)
            ts.step(m)
            assert lrs(ko) == pytest.approx(lrs(to), rel=1e-12), i
            assert ks.get_last_lr() == pytest.approx(ts.get_last_lr(), rel=1e-12)
            assert (ks.num_bad_epochs, ks.best, ks.last_epoch) == (ts.num_bad_epochs, ts.best, ts.last_epoch)
        state = ks.state_dict()
        ks2 = KS.ReduceLROnPlateau(ko, **kwargs)
        ks2.load_state_dict(state)
        assert (ks2.best, ks2.num_bad_epochs, ks2.cooldown_counter) == (ks.best, ks.num_bad_epochs, ks.cooldown_counter)


def test_scheduler_over_a_training_run_and_resume_checks():
    # the lr the scheduler sets is the one the optimizer steps with
    k, t = kiln.tensor([1.0, -1.0], requires_grad=True), torch.tensor([1.0, -1.0], requires_grad=True)
    ko, to = kiln.optim.SGD([k], lr=0.2, momentum=0.9), torch.optim.SGD([t], lr=0.2, momentum=0.9)
    ks, ts = KS.OneCycleLR(ko, max_lr=0.3, total_steps=12), TS.OneCycleLR(to, max_lr=0.3, total_steps=12)
    for _ in range(12):
        k.grad, t.grad = kiln.tensor([0.5, 0.25]), torch.tensor([0.5, 0.25])
        ko.step()
        to.step()
        ks.step() if ks.last_epoch < 11 else None
        ts.step() if ts.last_epoch < 11 else None
    assert np.allclose(k.detach().numpy(), t.detach().numpy(), atol=1e-6)
    fresh, _ = optimizers()
    with pytest.raises(KeyError, match="initial_lr"):
        KS.StepLR(fresh, 3, last_epoch=5)
    with pytest.raises(TypeError, match="not a kiln.optim optimizer"):
        KS.StepLR(torch.optim.SGD([t], lr=0.1), 3)
    ko, _ = optimizers()
    with pytest.raises(ValueError, match="expected 2 lr_lambdas, but got 1"):
        KS.LambdaLR(ko, [lambda e: 1.0])
    # LambdaSchedule (kiln's) sets lr = schedule(step), LambdaLR (torch's) base_lr * lambda(epoch)
    ko, to = optimizers()
    KS.LambdaLR(ko, lambda e: 0.5)
    kiln.optim.LambdaSchedule(optimizers()[0], lambda s: 0.5)
    assert lrs(ko) == [0.05, 0.005]


# ---- kiln.nn.init ----
INIT = kiln.nn.init


@pytest.mark.parametrize("shape", [(5, 3), (8, 4, 3), (16, 3, 3, 5), (6, 2, 2, 3, 4)])
def test_init_fans_match_torchs(shape):
    assert INIT._calculate_fan_in_and_fan_out(kiln.zeros(*shape)) == \
        torch.nn.init._calculate_fan_in_and_fan_out(torch.zeros(*shape))
    for mode in ("fan_in", "fan_out"):
        assert INIT._calculate_correct_fan(kiln.zeros(*shape), mode) == \
            torch.nn.init._calculate_correct_fan(torch.zeros(*shape), mode)
    # layers' weights, as torch lays them out
    assert INIT._calculate_fan_in_and_fan_out(kiln.nn.Conv2d(3, 8, 5).weight) == (75, 200)
    assert INIT._calculate_fan_in_and_fan_out(kiln.nn.Linear(7, 2).weight) == (7, 2)
    with pytest.raises(ValueError, match="fewer than 2 dimensions"):
        INIT.xavier_uniform_(kiln.zeros(4))


def test_init_exact_values_and_gains():
    for args in [("linear",), ("conv2d",), ("sigmoid",), ("tanh",), ("relu",), ("leaky_relu",),
                 ("leaky_relu", 0.2), ("selu",)]:
        assert INIT.calculate_gain(*args) == torch.nn.init.calculate_gain(*args)
    with pytest.raises(ValueError, match="unsupported nonlinearity"):
        INIT.calculate_gain("swish")
    p = kiln.nn.Linear(4, 3).weight  # a parameter that requires grad: filled under no_grad
    assert INIT.constant_(p, 0.25) is p and p.requires_grad
    assert (p.detach().numpy() == 0.25).all()
    assert (INIT.ones_(kiln.zeros(2, 2)).numpy() == 1).all() and (INIT.zeros_(kiln.ones(3)).numpy() == 0).all()
    for shape in [(3, 5), (4, 2)]:
        assert np.array_equal(INIT.eye_(kiln.ones(*shape)).numpy(), torch.nn.init.eye_(torch.ones(*shape)).numpy())
    with pytest.raises(ValueError, match="2 dimensions"):
        INIT.eye_(kiln.zeros(2, 2, 2))


def stats(t):
    a = t.numpy().astype(np.float64)
    return a.mean(), a.std(), a.min(), a.max()


def test_init_statistics_with_a_fixed_seed():
    kiln.manual_seed(123)
    n = 200_000
    m, s, lo, hi = stats(INIT.uniform_(kiln.zeros(n), -1.0, 3.0))
    assert abs(m - 1.0) < 0.02 and abs(s - 4 / math.sqrt(12)) < 0.01 and lo >= -1.0 and hi < 3.0
    m, s, _, _ = stats(INIT.normal_(kiln.zeros(n), 2.0, 0.5))
    assert abs(m - 2.0) < 0.01 and abs(s - 0.5) < 0.01
    t = torch.nn.init.trunc_normal_(torch.zeros(n), 0.5, 1.0, -1.0, 1.5)
    m, s, lo, hi = stats(INIT.trunc_normal_(kiln.zeros(n), 0.5, 1.0, -1.0, 1.5))
    assert abs(m - t.mean().item()) < 0.01 and abs(s - t.std().item()) < 0.01 and lo >= -1.0 and hi <= 1.5
    w = kiln.zeros(256, 64, 3, 3)  # fan_in 576, fan_out 2304
    tw = torch.zeros(256, 64, 3, 3)
    for k_init, t_init, kwargs in [(INIT.xavier_uniform_, torch.nn.init.xavier_uniform_, {"gain": 2.0}),
                                   (INIT.xavier_normal_, torch.nn.init.xavier_normal_, {}),
                                   (INIT.kaiming_uniform_, torch.nn.init.kaiming_uniform_, {"a": math.sqrt(5)}),
                                   (INIT.kaiming_normal_, torch.nn.init.kaiming_normal_,
                                    {"mode": "fan_out", "nonlinearity": "relu"}),
                                   (INIT.kaiming_uniform_, torch.nn.init.kaiming_uniform_,
                                    {"a": 0.1, "mode": "fan_in", "nonlinearity": "leaky_relu"})]:
        m, s, lo, hi = stats(k_init(w, **kwargs))
        t_init(tw, **kwargs)
        assert abs(m) < 0.01 * tw.std().item() + 1e-4 and abs(s / tw.std().item() - 1) < 0.01, k_init.__name__
        if "uniform" in k_init.__name__:  # the same bound as torch's
            assert abs(hi - tw.max().item()) < 1e-3 * hi and abs(lo - tw.min().item()) < 1e-3 * hi
    q = INIT.orthogonal_(kiln.zeros(6, 10), gain=2.0).numpy().astype(np.float64)
    assert np.allclose(q @ q.T, 4 * np.eye(6), atol=1e-5)
    q = INIT.orthogonal_(kiln.zeros(8, 2, 2)).numpy().reshape(8, 4).astype(np.float64)
    assert np.allclose(q.T @ q, np.eye(4), atol=1e-5)
    kiln.manual_seed(7)
    a = INIT.normal_(kiln.zeros(5)).numpy()
    kiln.manual_seed(7)
    assert np.array_equal(a, INIT.normal_(kiln.zeros(5)).numpy())  # kiln.manual_seed decides the values


# ---- kiln.data ----
TD = torch.utils.data


def test_dataloader_defaults_and_tensor_dataset_as_torch():
    x = np.arange(22 * 3, dtype=np.float32).reshape(22, 3)
    y = np.arange(22) % 4
    kd = kiln.data.TensorDataset(kiln.tensor(x), kiln.tensor(y))
    td = TD.TensorDataset(torch.tensor(x), torch.tensor(y))
    assert len(kd) == len(td) == 22
    assert [a.tolist() for a in kd[3]] == [a.tolist() for a in td[3]]
    for kwargs in [{"batch_size": 5}, {"batch_size": 5, "drop_last": True}, {"batch_size": 22, "num_workers": 2},
                   {"batch_size": 4, "drop_last": False, "num_workers": 0}]:
        kb, tb = list(kiln.data.DataLoader(kd, **kwargs)), list(TD.DataLoader(td, **kwargs))
        assert len(kb) == len(tb) == len(kiln.data.DataLoader(kd, **kwargs))  # not shuffled by default, as torch
        for (kx, ky), (tx, ty) in zip(kb, tb):
            assert kx.tolist() == tx.tolist() and ky.tolist() == ty.tolist()
    shuffled = [b[1].tolist() for b in kiln.data.DataLoader(kd, batch_size=22, shuffle=True)]
    assert sorted(shuffled[0]) == sorted(y.tolist()) and shuffled[0] != y.tolist()
    # a plain list of (tensor, label) tuples, default collate as torch's
    rows = np.random.default_rng(1).standard_normal((7, 2, 3)).astype(np.float32)
    kb = next(iter(kiln.data.DataLoader([(kiln.tensor(r), i % 3) for i, r in enumerate(rows)], batch_size=7)))
    tb = next(iter(TD.DataLoader([(torch.tensor(r), i % 3) for i, r in enumerate(rows)], batch_size=7)))
    assert kb[0].shape == tuple(tb[0].shape) and np.array_equal(kb[0].numpy(), tb[0].numpy())
    assert kb[1].tolist() == tb[1].tolist() and kb[1].dtype == kiln.int64 and tb[1].dtype == torch.int64
    with pytest.raises(TypeError, match="not both"):
        kiln.data.DataLoader(kd, workers=1, num_workers=1)
    with pytest.raises(ValueError, match=r"size mismatch between tensors: dim 0 sizes \[22, 3\]"):
        kiln.data.TensorDataset(kiln.tensor(x), kiln.zeros(3))


@pytest.mark.parametrize("lengths", [[3, 7], [0.3, 0.3, 0.4], [0.33, 0.33, 0.34], [0.5, 0.5], [1.0]])
def test_random_split_sizes_as_torch(lengths):
    data = list(range(10))
    ks, ts = kiln.data.random_split(data, lengths), TD.random_split(data, lengths)
    assert [len(s) for s in ks] == [len(s) for s in ts]
    assert sorted(i for s in ks for i in (s[j] for j in range(len(s)))) == data
    with pytest.raises(ValueError, match="does not equal the length"):
        kiln.data.random_split(data, [3, 3])


def test_dataloader_batch_size_defaults_to_one_as_torch():
    data = [np.float32(i) for i in range(5)]
    kl, tl = kiln.data.DataLoader(data), TD.DataLoader(data)
    assert len(kl) == len(tl) == 5
    assert [b.tolist() for b in kl] == [b.tolist() for b in tl] == [[float(i)] for i in range(5)]


def test_dataloader_shuffle_follows_manual_seed():
    # seed not given: drawn from Kiln's generator, as torch's loader draws from torch's
    def orders(**kwargs):
        loader = kiln.data.DataLoader(list(range(40)), batch_size=8, shuffle=True, **kwargs)
        return [[b.tolist() for b in loader] for _ in range(2)]  # two epochs

    kiln.manual_seed(1)
    a = orders()
    kiln.manual_seed(1)
    assert orders() == a and a[0] != a[1]
    kiln.manual_seed(2)
    assert orders() != a
    # seed= given keeps its meaning: the same order whatever manual_seed says
    kiln.manual_seed(1)
    fixed = orders(seed=5)
    kiln.manual_seed(2)
    assert orders(seed=5) == fixed and kiln.data.DataLoader([1], seed=-1).seed == 2**64 - 1
    if os.path.isdir(kiln.data.FASHION_MNIST_DIR):  # a kiln Dataset's C++ loader too
        test = kiln.data.fashion_mnist(augment=False)["test"]

        def first_targets():
            return next(iter(kiln.data.DataLoader(test, batch_size=16, shuffle=True)))["target"].tolist()

        kiln.manual_seed(1)
        t1 = first_targets()
        kiln.manual_seed(1)
        assert first_targets() == t1
        kiln.manual_seed(2)
        assert first_targets() != t1


def test_dataloader_draws_its_seed_when_made_and_only_when_used():
    # A loader that does not use the seed draws nothing (the model's init after it is as without it);
    # a shuffling one draws once, when made (not at its first iteration, where other threads drawing
    # from Kiln's generator raced it: test_dataloader_seed_does_not_race_other_threads).
    def init_after(make):
        kiln.manual_seed(0)
        loader = make()
        return kiln.rand(4).tolist(), loader

    plain, _ = init_after(lambda: None)
    after, loader = init_after(lambda: kiln.data.DataLoader(list(range(6))))
    assert after == plain and loader.seed is None
    kiln.manual_seed(0)
    assert [b.tolist() for b in loader] == [[0], [1], [2], [3], [4], [5]] and loader.seed is None
    after, loader = init_after(lambda: kiln.data.DataLoader(list(range(6)), shuffle=True))
    assert after != plain and loader.seed is not None
    # drawn from manual_seed's stream when made, then kept (set_epoch resumes)

    def epochs(loader, n):
        return [[b.tolist() for b in loader] for _ in range(n)]

    kiln.manual_seed(3)
    first = kiln.data.DataLoader(list(range(10)), batch_size=3, shuffle=True)
    seed = first.seed
    kiln.rand(5)  # the model's init, between making the loader and reading it: changes nothing
    whole = epochs(first, 4)
    assert seed is not None and first.seed == seed and whole[0] != whole[1]
    kiln.manual_seed(3)
    again = kiln.data.DataLoader(list(range(10)), batch_size=3, shuffle=True)
    assert again.seed == seed and epochs(again, 1) == whole[:1]
    again.set_epoch(2)
    assert epochs(again, 2) == whole[2:] and again.seed == seed
    assert epochs(kiln.data.DataLoader(list(range(10)), batch_size=3, shuffle=True, seed=seed), 4) == whole
    assert kiln.data.DataLoader(list(range(10)), shuffle=True, world_size=2).seed == 0
    if os.path.isdir(kiln.data.FASHION_MNIST_DIR):  # a kiln Dataset's C++ loader: drawn when made too
        test = kiln.data.fashion_mnist()["test"]
        after, loader = init_after(lambda: kiln.data.DataLoader(test, batch_size=4))
        assert after != plain and loader.seed is not None
        t1 = next(iter(loader))["input"].tolist()
        assert next(iter(kiln.data.DataLoader(test, batch_size=4, seed=loader.seed)))["input"].tolist() == t1


def _run_script(script, timeout=120):
    """Runs `script` in a fresh interpreter: (returncode, stdout, stderr); a hang fails, naming where."""
    import subprocess
    import sys

    try:
        r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the script did not end in {timeout} s; stdout: {e.stdout!r}, stderr: {e.stderr!r}")
    return r.returncode, r.stdout, r.stderr


def test_dataloader_seed_does_not_race_other_threads():
    # The seed was drawn at the first iteration, while the other loader's worker threads drew from
    # Kiln's generator (augmentation): a different seed in most runs of the same program.
    script = """
import time, kiln, kiln.data
class Aug:
    def __len__(self): return 64
    def __getitem__(self, i):
        time.sleep(0.002); return kiln.rand(4).sum()
seeds = []
for trial in range(8):
    kiln.manual_seed(0)
    train = kiln.data.DataLoader(Aug(), batch_size=4, num_workers=2)
    aux = kiln.data.DataLoader(list(range(100)), batch_size=10, shuffle=True)
    for a, b in zip(train, aux):
        break
    seeds.append(aux.seed)
print(len(set(seeds)), seeds[0])
"""
    runs = [_run_script(script) for _ in range(2)]
    for rc, out, err in runs:
        assert rc == 0 and out.split()[0] == "1", (out, err)
    assert runs[0][1] == runs[1][1]


class _Stuck:
    """Items from 2 on block until `release` is set (10 s at most); the first of them can send SIGINT."""

    def __init__(self, interrupt=False):
        self.release, self.finished, self.interrupt = threading.Event(), [], interrupt

    def __len__(self):
        return 20

    def __getitem__(self, i):
        if i >= 2:
            if i == 2 and self.interrupt:
                self.release.wait(0.3)  # the caller waiting for this batch, most likely
                os.kill(os.getpid(), signal.SIGINT)
            self.release.wait(10)
            self.finished.append(i)
        return i


def test_dataloader_interrupt_and_timeout_do_not_wait_for_running_items():
    # Ctrl-C while a worker thread is in a __getitem__: raised at once, the running items left to end
    # on their own (it waited for every one of them)
    ds = _Stuck(interrupt=True)
    with pytest.raises(KeyboardInterrupt):
        for _ in kiln.data.DataLoader(ds, batch_size=2, num_workers=2):
            pass
    assert ds.finished == []
    ds.release.set()
    # timeout=: seconds for one batch, naming what it reads
    ds = _Stuck()
    loader = kiln.data.DataLoader(ds, batch_size=2, num_workers=2, timeout=0.2)
    with pytest.raises(RuntimeError, match=r"batch 1 of this pass \(dataset indices \[2, 3\]\) was not ready after "
                       r"timeout=0.2 s"):
        list(loader)
    assert ds.finished == []
    ds.release.set()
    for bad in [dict(timeout=-1), dict(timeout="1"), dict(timeout=1, num_workers=0)]:
        with pytest.raises(ValueError, match="timeout"):
            kiln.data.DataLoader(list(range(4)), **bad)


def test_dataloader_timeout_while_the_iterable_dataset_stalls():
    # The iterable dataset's next item was read under the lock the caller waits on: a stalled stream
    # held back the batch already built, and timeout= never fired (only when the stream went on).
    release = threading.Event()

    class Stalls:
        def __iter__(self):
            yield 0.0
            yield 1.0
            release.wait(20)
            yield 2.0

    got = []
    with pytest.raises(RuntimeError, match=r"batch 1 of this pass \(its samples not read yet\) was not ready after "
                       r"timeout=0.2 s"):
        for b in kiln.data.DataLoader(Stalls(), batch_size=2, num_workers=2, timeout=0.2):
            got.append(b.tolist())
    stalled = not release.is_set()  # the stream still waits: the timeout came from get(), not its end
    release.set()
    assert got == [[0.0, 1.0]] and stalled


def test_dataloader_exit_does_not_wait_for_running_items():
    import subprocess
    import sys

    script = """
import time
import kiln.data
class Slow:
    def __len__(self): return 10
    def __getitem__(self, i):
        if i >= 2: time.sleep(600)
        return i
it = iter(kiln.data.DataLoader(Slow(), batch_size=2, num_workers=2))
print(next(it).tolist(), flush=True)
"""
    # the interpreter waited for the threads blocked in time.sleep (the timeout here is only a guard)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=90)
    assert r.returncode == 0 and r.stdout == "[0, 1]\n", r.stderr
    assert "leaked" not in r.stderr, r.stderr


_HEAVY = """
import kiln, kiln.data
class Heavy:
    def __len__(self): return 1000
    def __getitem__(self, i):
        x = kiln.rand(256, 256)
        for _ in range(100):
            x = (x @ x).tanh()
        return x.sum()
loader = kiln.data.DataLoader(Heavy(), batch_size=1, num_workers=2)
"""


@pytest.mark.parametrize("end", ["for b in loader: break", "it = iter(loader); next(it)",
                                 "for b in loader: raise SystemExit(0)",
                                 "kiln.data._EXIT_JOIN_S = 0\nfor b in loader: break"])
def test_dataloader_exit_with_workers_in_engine_code(end):
    # Worker threads inside kiln's C++ code (matmuls) at exit, the pass left by break, left open, or
    # by an exception: the process aborted ("terminate called without an active exception", rc 134)
    # when Python ended a thread taking the GIL back. A few runs: where the threads are at exit varies.
    # _EXIT_JOIN_S = 0: as items longer than the exit waits for, the threads left running.
    import subprocess
    import sys

    for _ in range(3):
        r = subprocess.run([sys.executable, "-c", f"{_HEAVY}{end}\nprint('exit')\n"], capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, (r.returncode, r.stderr)
        assert r.stdout == ("" if "raise" in end else "exit\n"), r.stdout
        assert "terminate" not in r.stderr and "leaked" not in r.stderr, r.stderr


def test_dataloader_exit_of_a_forked_child_does_not_wait_for_the_parents_threads():
    # The exit waits for the threads counted inside engine code; a child forked while the workers ran
    # matmuls inherited the count, of threads it does not have, and waited for ever. (The child runs
    # the exit hook itself, then os._exit: only that wait is under test here.)
    import subprocess
    import sys

    script = _HEAVY + """
import os, time
it = iter(loader)
next(it)
for _ in range(3):
    pid = os.fork()
    if pid == 0:
        kiln.data._end_passes_at_exit()
        os._exit(0)
    deadline = time.monotonic() + 60  # a guard: the child ends at once
    while not os.waitpid(pid, os.WNOHANG)[0]:
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            print("hung", flush=True)
            os._exit(1)
        time.sleep(0.05)
print("ok", flush=True)
"""
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=400)
    assert r.returncode == 0 and r.stdout == "ok\n", (r.stdout, r.stderr)


_HOOK_BLOCKED = """
import threading, time, kiln, kiln.data
ev = threading.Event()
x = kiln.ones(2, requires_grad=True)
x.register_hook(lambda g: ev.wait())  # a hook waiting on something that never comes
threading.Thread(target=lambda: (x * 2).sum().backward(), daemon=True).start()
time.sleep(0.5)
"""


@pytest.mark.parametrize("loader", [False, True])
def test_exit_does_not_wait_for_a_thread_in_a_python_callback(loader):
    # A daemon thread's backward in a hook blocked on an Event: the exit waited for it for ever, as
    # inside Kiln code, in every program importing kiln (the exit hook was registered at import), and
    # with a DataLoader pass started (the hook's thread counted though back in Python).
    start = "next(iter(kiln.data.DataLoader(list(range(8)), num_workers=1)))\n" if loader else ""
    rc, out, err = _run_script(_HOOK_BLOCKED + start + "print('main done', flush=True)\n")
    assert rc == 0 and out == "main done\n", (rc, out, err)
    assert "did not wait" not in err and "terminate" not in err, err


def test_exit_hook_only_in_a_program_that_started_worker_threads():
    # kiln.data's exit hook (and its wait for threads in Kiln code) ran in every program importing
    # kiln, DataLoader or not.
    script = """
import kiln, kiln.data
real = kiln.data._C
class Spy:
    def __getattr__(self, name): return getattr(real, name)
    def _exit_quiesce(self, *args):
        print("quiesced", flush=True)
        return real._exit_quiesce(*args)
kiln.data._C = Spy()
print([b.tolist() for b in kiln.data.DataLoader(list(range(4)), batch_size=2)], flush=True)
"""
    assert _run_script(script)[1] == "[[0, 1], [2, 3]]\n"
    rc, out, err = _run_script(script.replace("batch_size=2", "batch_size=2, num_workers=1"))
    assert rc == 0 and out == "[[0, 1], [2, 3]]\nquiesced\n", (rc, out, err)


_IN_ENGINE = """
import os, signal, tempfile, threading, time, kiln, kiln.data
fifo = os.path.join(tempfile.mkdtemp(), "f")
os.mkfifo(fifo)
# inside Kiln code without the GIL for ever: opening a FIFO no one writes to
threading.Thread(target=lambda: kiln._C._load_safetensors(fifo, False), daemon=True).start()
time.sleep(0.5)
"""


def test_exit_wait_for_threads_in_kiln_code_is_bounded_and_ctrl_c_ends_it():
    # A thread that never leaves Kiln code: the exit waited for it for ever, Ctrl-C or not.
    script = _IN_ENGINE + """
next(iter(kiln.data.DataLoader(list(range(8)), num_workers=1)))
kiln.data._EXIT_QUIESCE_S = 0.5
print('main done', flush=True)
"""
    rc, out, err = _run_script(script)
    assert rc == 0 and out == "main done\n", (rc, out, err)
    assert "kiln: exit did not wait for 1 thread still in Kiln code (still there after the exit's wait)" in err, err
    script = _IN_ENGINE + """
threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
print(kiln._C._exit_quiesce(3600 * 1000), flush=True)
os._exit(0)
"""
    rc, out, err = _run_script(script)
    assert rc == 0 and out == "1\n", (rc, out, err)
    assert "kiln: exit did not wait for 1 thread still in Kiln code (interrupted)" in err, err


def test_exit_of_a_forked_child_does_not_take_the_parents_pass_locks():
    # A parent's thread held a pass's lock when another forked: the child's exit hook, closing the
    # parent's passes, waited for that lock for ever.
    script = """
import os, sys, threading, time, kiln, kiln.data
class Slow:
    def __len__(self): return 100
    def __getitem__(self, i): time.sleep(0.01); return float(i)
it = iter(kiln.data.DataLoader(Slow(), batch_size=1, num_workers=2)); next(it)
p = next(iter(kiln.data._passes))
threading.Thread(target=lambda: (p._cv.acquire(), time.sleep(30), p._cv.release()), daemon=True).start()
time.sleep(0.2)
pid = os.fork()
if pid == 0:
    sys.exit(0)  # the child's normal exit runs kiln.data's exit hook
deadline = time.monotonic() + 20  # a guard: the child ends at once
while not os.waitpid(pid, os.WNOHANG)[0]:
    if time.monotonic() > deadline:
        os.kill(pid, 9)
        print("child hung", flush=True)
        os._exit(1)
    time.sleep(0.05)
print("child exited", flush=True)
os._exit(0)
"""
    rc, out, err = _run_script(script)
    assert rc == 0 and out == "child exited\n", (rc, out, err)


def test_dataloader_close_stops_a_thread_reading_its_next_task():
    # close() while a worker thread read the next batch's indices from the sampler: the thread built
    # that batch anyway (the closed flag was checked only before reading).
    script = """
import threading, time, kiln, kiln.data
built, got = [], threading.Event()
class Data:
    def __len__(self): return 10
    def __getitem__(self, i):
        built.append(i)
        return i
class Closing:
    def __iter__(self):
        yield 0
        got.wait(60)  # (else close would drop batch 0 before the caller has it)
        for p in list(kiln.data._passes):
            p.close()  # the pass closed (as by break elsewhere) while this thread reads index 1
        yield 1
    def __len__(self): return 2
it = iter(kiln.data.DataLoader(Data(), sampler=Closing(), num_workers=1))
print(next(it).tolist(), flush=True)
got.set()
time.sleep(1)
print(built, flush=True)
"""
    rc, out, err = _run_script(script)
    assert rc == 0 and out == "[0]\n[0]\n", (rc, out, err)


def test_ctrl_c_during_the_exit_join_still_quiesces():
    # Ctrl-C while the exit hook joined the worker threads skipped _exit_quiesce (a worker left inside
    # Kiln code then aborts the process).
    script = """
import atexit, os, signal, threading, time, kiln, kiln.data
exiting = threading.Event()
class Slow:
    def __len__(self): return 10
    def __getitem__(self, i):
        if i >= 2:
            exiting.wait(60)
            time.sleep(0.3)  # the exit hook joins this thread now
            if i == 2:
                os.kill(os.getpid(), signal.SIGINT)
            time.sleep(600)
        return i
it = iter(kiln.data.DataLoader(Slow(), batch_size=2, num_workers=2))
print(next(it).tolist(), flush=True)
real = kiln.data._C
class Spy:
    def __getattr__(self, name): return getattr(real, name)
    def _exit_quiesce(self, *args):
        print("quiesced", flush=True)
        return real._exit_quiesce(*args)
kiln.data._C = Spy()
kiln.data._EXIT_JOIN_S = 30
atexit.register(exiting.set)  # runs before kiln.data's hook (atexit is LIFO)
"""
    rc, out, err = _run_script(script)
    assert out == "[0, 1]\nquiesced\n", (rc, out, err)


def test_engine_objects_are_released_after_the_dataloader_exit_hook():
    # kiln's _release_python_refs ran before kiln.data's exit hook (atexit is LIFO, and kiln.data's
    # was registered first): threads still running in the exit's wait found their hooks let go.
    script = """
import weakref, kiln, kiln.data
class Token: pass
tok = Token()
alive = weakref.ref(tok)
x = kiln.ones(2, requires_grad=True)
x.register_hook(lambda g, t=tok: None)
del tok
next(iter(kiln.data.DataLoader(list(range(8)), num_workers=1)))
real = kiln.data._C
class Spy:
    def __getattr__(self, name): return getattr(real, name)
    def _exit_quiesce(self, *args):
        print("hook held:", alive() is not None, flush=True)
        return real._exit_quiesce(*args)
kiln.data._C = Spy()
"""
    rc, out, err = _run_script(script)
    assert rc == 0 and out == "hook held: True\n", (rc, out, err)


def test_default_collate_dicts_with_keys_in_another_order_as_torch():
    samples = [{"a": 1, "b": 2.0}, {"b": 3.0, "a": 4}]
    kb, tb = kiln.data.default_collate(samples), TD.default_collate(samples)
    assert list(kb) == list(tb) == ["a", "b"]  # the first sample's order
    assert kb["a"].tolist() == tb["a"].tolist() == [1, 4] and kb["b"].tolist() == tb["b"].tolist() == [2.0, 3.0]
    with pytest.raises(ValueError, match=r"keys \['a', 'b'\] and \['a', 'c'\]"):
        kiln.data.default_collate([{"a": 1, "b": 2}, {"a": 1, "c": 2}])


def test_default_convert_and_collate_of_numpy_strings_and_complex_as_torch():
    # strings and objects: default_convert keeps them as they are, default_collate refuses arrays of them
    # with torch's TypeError and words, and keeps NumPy string scalars a list, as torch 2.15
    for a in [np.array(["a", "b"]), np.array([b"a"]), np.array("a"), np.array([{}, 1], dtype=object)]:
        assert kiln.data.default_convert(a) is a and TD.default_convert(a) is a
    s = np.str_("x")
    assert kiln.data.default_convert(s) is s and TD.default_convert(s) is s
    for batch in [[np.array(["a", "b"]), np.array(["c", "d"])], [np.array("a"), np.array("b")]]:
        for collate in (kiln.data.default_collate, TD.default_collate):
            with pytest.raises(TypeError, match=r"default_collate: batch must contain tensors, numpy arrays, numbers, "
                                                r"dicts or lists; found <U1"):
                collate(batch)
    strs = [np.str_("a"), np.str_("b")]
    assert kiln.data.default_collate(strs) == TD.default_collate(strs) == ["a", "b"]
    # complex: torch makes a complex tensor; Kiln has no complex dtype, and says so (it was from_numpy's
    # error, which named no sample), in default_convert as in default_collate and the loader
    z = np.array([1 + 2j, 3j])
    assert TD.default_convert(z).dtype == torch.complex128
    for sample, what in [(z, r"complex128, shape \(2,\)"), (np.complex64(1 + 1j), r"complex64, shape \(\)"),
                         ({"x": z.astype(np.complex64)}, r"complex64, shape \(2,\)")]:
        with pytest.raises(TypeError, match=f"default_convert: a complex sample \\({what}\\): Kiln has no complex "
                                            "dtype"):
            kiln.data.default_convert(sample)
    with pytest.raises(TypeError, match=r"default_convert: a complex sample .*Kiln has no complex dtype"):
        list(kiln.data.DataLoader([z, z], batch_size=None))
    with pytest.raises(TypeError, match=r"complex \(complex128 at batch positions \[0, 1\]\): Kiln has no complex"):
        kiln.data.default_collate([z, z])


@pytest.mark.skipif(not os.path.isdir(kiln.data.FASHION_MNIST_DIR), reason="dataset-fashion-mnist is not installed")
def test_dataloader_subset_of_engine_dataset():
    d = kiln.data.fashion_mnist()
    test, train = d["test"], d["train"]
    kiln.manual_seed(0)
    part, rest = kiln.data.random_split(test, [0.001, 0.999])  # 10 samples
    idx = list(part.indices)

    def same(a, b):
        return a.keys() == b.keys() and all(np.array_equal(a[k].numpy(), b[k].numpy()) for k in a)

    # the loader's batches are the base set's batches of those indices ("'Dataset' object is not subscriptable")
    batches = list(kiln.data.DataLoader(part, batch_size=4))
    assert len(batches) == 3 and all(same(b, test.get_batch(idx[i:i + 4])) for b, i in zip(batches, (0, 4, 8)))
    assert sum(b["target"].shape[0] for b in kiln.data.DataLoader(rest, batch_size=2500)) == 9990
    # a Subset of a Subset, negative indices as Python's
    nested = kiln.data.Subset(kiln.data.Subset(test, idx), [2, -1])
    assert same(next(iter(kiln.data.DataLoader(nested, batch_size=2))), test.get_batch([idx[2], idx[-1]]))
    # one sample by index: get_batch([i]) without the batch dim
    one = part[3]
    assert one["input"].shape == (1, 28, 28) and same({k: v.unsqueeze(0) for k, v in one.items()},
                                                      test.get_batch([idx[3]]))
    with pytest.raises(IndexError, match="index 10000 is out of range for 10000 samples"):
        test[10000]
    # an augmented set: the same augmentation as the whole set's loader with that seed
    first8 = kiln.data.Subset(train, list(range(8)))
    whole = kiln.data.DataLoader(train, batch_size=4, seed=3)
    for a, b in zip(kiln.data.DataLoader(first8, batch_size=4, seed=3), whole):
        assert same(a, b)
    with pytest.raises(IndexError, match="index 60000 .* out of range"):
        kiln.data.DataLoader(kiln.data.Subset(train, [60000]))


@pytest.mark.skipif(not os.path.isdir(kiln.data.FASHION_MNIST_DIR), reason="dataset-fashion-mnist is not installed")
def test_engine_dataset_item_is_a_fresh_augmentation_from_kilns_generator():
    # As a torch data set with a random transform: each ds[i] a new draw (not one frozen augmented
    # sample per index), reproducible with kiln.manual_seed.
    d = kiln.data.fashion_mnist()
    train, test = d["train"], d["test"]

    def draws(i, n):
        return [train[i]["input"].numpy().tobytes() for _ in range(n)]

    kiln.manual_seed(11)
    first = draws(5, 12)
    assert len(set(first)) > 1  # 25 crop shifts x 2 flips: 12 equal draws would be a frozen sample
    kiln.manual_seed(11)
    assert draws(5, 12) == first
    assert all(train[5]["target"].item() == train.get_batch([5])["target"][0].item() for _ in range(3))
    # an unaugmented set gives its sample whatever the seed
    assert np.array_equal(test[3]["input"].numpy(), test.get_batch([3])["input"][0].numpy())


def test_engine_dataset_item_of_an_unaugmented_set_leaves_kilns_generator():
    # Peeking at the test split must not move the generator that model init (and a DataLoader's
    # default seed) draw from next; an augmented set draws its seed from it.
    d = kiln.data.fashion_mnist()
    kiln.manual_seed(3)
    expected = kiln.randn(5).numpy()
    kiln.manual_seed(3)
    d["test"][0], d["test"][-1], kiln.data.Subset(d["test"], [7, 9])[1]
    assert np.array_equal(kiln.randn(5).numpy(), expected)
    kiln.manual_seed(3)
    d["train"][0]
    assert not np.array_equal(kiln.randn(5).numpy(), expected)


class _TrainItems(torch.utils.data.Dataset):  # module level: picklable for the workers
    def __init__(self, ds):
        self.ds = ds

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return self.ds[0]["input"].numpy()  # one sample for every i: only the seed makes two items differ


def _seed_kiln_1234(worker_id):  # a worker_init_fn seeding Kiln the same in every worker
    kiln.manual_seed(1234)


def test_engine_dataset_item_in_torch_dataloader_workers_draws_per_worker_seeds():
    # Forked workers copy Kiln's generator: each epoch's (and each worker's) draws repeated the
    # parent's. Like torch's own generator, Kiln's is seeded per worker from get_worker_info().seed.
    items = _TrainItems(kiln.data.fashion_mnist()["train"])

    def epoch():
        loader = torch.utils.data.DataLoader(items, batch_size=1, num_workers=2, multiprocessing_context="fork")
        return [b.numpy().tobytes() for b in loader]

    torch.manual_seed(0)
    first, second = epoch(), epoch()
    assert first != second
    assert first[0] != first[1]  # worker 0's first sample and worker 1's: another seed, another shift
    torch.manual_seed(0)  # torch's base seed decides the workers' seeds: reproducible
    assert epoch() == first


def test_kiln_manual_seed_in_torch_worker_init_fn_is_kept():
    # The worker seed replaced a worker_init_fn's kiln.manual_seed at the first ds[i]: the user's
    # seed, made in the worker, wins.
    ds = kiln.data.fashion_mnist()["train"]
    torch.manual_seed(0)
    loader = torch.utils.data.DataLoader(_TrainItems(ds), batch_size=1, num_workers=2, worker_init_fn=_seed_kiln_1234,
                                         multiprocessing_context="fork")
    got = [b.numpy().tobytes() for b in loader]
    kiln.manual_seed(1234)
    want = ds[0]["input"].numpy().tobytes()
    assert got[0] == want and got[1] == want  # each worker's first item: the draw after kiln.manual_seed(1234)


def test_dataloader_set_epoch_and_ranks():
    def epochs(loader, n):
        return [[b.tolist() for b in loader] for _ in range(n)]

    whole = epochs(kiln.data.DataLoader(list(range(10)), batch_size=3, shuffle=True, seed=4), 4)
    resumed = kiln.data.DataLoader(list(range(10)), batch_size=3, shuffle=True, seed=4)
    resumed.set_epoch(2)  # the order of epoch 2, then 3: a run resumed there
    assert epochs(resumed, 2) == whole[2:]
    with pytest.raises(ValueError, match="epoch must be an int >= 0"):
        resumed.set_epoch(-1)
    # rank / world_size as torch's DistributedSampler: equal parts of each epoch's order, padded with its start
    for n, world in [(10, 3), (2, 5), (9, 3)]:
        parts = [kiln.data.DataLoader(list(range(n)), batch_size=2, rank=r, world_size=world) for r in range(world)]
        got = [sum((b.tolist() for b in p), []) for p in parts]
        assert got == [list(TD.DistributedSampler(range(n), num_replicas=world, rank=r, shuffle=False))
                       for r in range(world)]
        assert all(len(p) == len(TD.DataLoader(range(-(-n // world)), batch_size=2)) for p in parts)
        shuffled = [[b.tolist() for b in kiln.data.DataLoader(list(range(n)), batch_size=n, shuffle=True, seed=1,
                                                              rank=r, world_size=world)][0] for r in range(world)]
        flat = sum(shuffled, [])
        assert len(flat) == world * -(-n // world) and set(flat) == set(range(n))
    with pytest.raises(ValueError, match=r"rank=3, world_size=3"):
        kiln.data.DataLoader([1], rank=3, world_size=3)
    if os.path.isdir(kiln.data.FASHION_MNIST_DIR):  # the C++ loader: the same rules
        test = kiln.data.fashion_mnist()["test"]
        first = kiln.data.DataLoader(test, batch_size=5000, shuffle=True, seed=2)
        targets = [[b["target"].tolist() for b in first] for _ in range(3)]
        again = kiln.data.DataLoader(test, batch_size=5000, shuffle=True, seed=2)
        again.set_epoch(2)
        assert [b["target"].tolist() for b in again] == targets[2]
        half = kiln.data.DataLoader(test, batch_size=10000, shuffle=True, seed=2, rank=1, world_size=2)
        assert len(half) == 1 and next(iter(half))["target"].shape == (5000,)


def test_dataloader_ranks_without_a_seed_share_the_order():
    # seed not given: each rank drew its own from Kiln's generator, which ranks often seed apart, so
    # their shuffled parts overlapped and missed samples. Now 0, as torch's DistributedSampler.
    parts, seeds = [], []
    for r in range(3):
        kiln.manual_seed(100 + r)
        loader = kiln.data.DataLoader(list(range(9)), batch_size=9, shuffle=True, rank=r, world_size=3)
        parts.append([b.tolist() for b in loader][0])
        seeds.append(loader.seed)
    assert sorted(sum(parts, [])) == list(range(9)) and seeds == [0, 0, 0]
    assert parts == [[b.tolist() for b in kiln.data.DataLoader(list(range(9)), batch_size=9, shuffle=True, seed=0,
                                                                rank=r, world_size=3)][0] for r in range(3)]


class _Stream:
    """An iterable dataset: __iter__, no __getitem__ (and no len())."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter(np.float32(i) for i in range(self.n))


class _StreamLen(_Stream):
    def __len__(self):
        return self.n


class _TorchStream(TD.IterableDataset):  # torch knows an iterable dataset by this class
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter(np.float32(i) for i in range(self.n))

    def __len__(self):
        return self.n


def test_dataloader_unbatched_samplers_and_iterable_datasets_as_torch():
    def same(kl, tl):
        kb, tb = list(kl), list(tl)
        assert len(kb) == len(tb) and len(kl) == len(tl)
        for k, t in zip(kb, tb):
            assert isinstance(k, kiln.Tensor) == isinstance(t, torch.Tensor)
            tensor = isinstance(k, kiln.Tensor)
            assert (k.tolist() if tensor else k) == (t.tolist() if tensor else t)

    arrays = [np.full(2, i, np.float32) for i in range(7)]
    for workers in (0, 2):
        # batch_size=None: samples one by one, NumPy converted to tensors, no batch dim
        same(kiln.data.DataLoader(arrays, batch_size=None, num_workers=workers),
             TD.DataLoader(arrays, batch_size=None, num_workers=0))
        assert next(iter(kiln.data.DataLoader([3, 4], batch_size=None))) == 3  # a Python int stays one
        # sampler= / batch_sampler=: torch's iterables of indices
        sampler = [6, 0, 5, 1]
        same(kiln.data.DataLoader(arrays, batch_size=3, sampler=sampler, num_workers=workers),
             TD.DataLoader(arrays, batch_size=3, sampler=sampler))
        same(kiln.data.DataLoader(arrays, batch_size=3, sampler=sampler, drop_last=True, num_workers=workers),
             TD.DataLoader(arrays, batch_size=3, sampler=sampler, drop_last=True))
        batches = [[1, 2], [6], [0, 3, 4]]
        same(kiln.data.DataLoader(arrays, batch_sampler=batches, num_workers=workers),
             TD.DataLoader(arrays, batch_sampler=batches))
        rs = TD.BatchSampler(TD.SequentialSampler(range(7)), batch_size=2, drop_last=False)
        same(kiln.data.DataLoader(arrays, batch_sampler=rs, num_workers=workers),
             TD.DataLoader(arrays, batch_sampler=rs))
        # iterable datasets: batches of batch_size in their order, drop_last honoured
        for kwargs in [dict(batch_size=3), dict(batch_size=3, drop_last=True), dict(batch_size=None)]:
            same(kiln.data.DataLoader(_StreamLen(8), num_workers=workers, **kwargs),
                 TD.DataLoader(_TorchStream(8), **kwargs))
        assert [b.tolist() for b in kiln.data.DataLoader(_Stream(5), batch_size=2, num_workers=workers)] == \
            [[0, 1], [2, 3], [4]]
    class Broken(_Stream):
        def __iter__(self):
            yield from super().__iter__()
            raise OSError("stream cut")

    for workers in (0, 2):  # an iterable dataset's error is raised as itself, after the batches before it
        got = []
        with pytest.raises(OSError, match="stream cut"):
            for b in kiln.data.DataLoader(Broken(4), batch_size=2, num_workers=workers):
                got.append(b.tolist())
        assert got == [[0, 1], [2, 3]]
    with pytest.raises(TypeError, match=r"iterable dataset \(_Stream\) has no len\(\)"):
        len(kiln.data.DataLoader(_Stream(5)))
    # torch's mutual exclusions and messages
    for kwargs, msg in [(dict(sampler=[0], shuffle=True), "sampler option is mutually exclusive with shuffle"),
                        (dict(batch_sampler=[[0]], batch_size=2), "batch_sampler option is mutually exclusive"),
                        (dict(batch_sampler=[[0]], drop_last=True), "batch_sampler option is mutually exclusive"),
                        (dict(batch_sampler=[[0]], sampler=[0]), "batch_sampler option is mutually exclusive"),
                        (dict(batch_size=None, drop_last=True), "disables auto-batching and is mutually exclusive "
                                                                "with drop_last")]:
        with pytest.raises(ValueError, match=msg):
            kiln.data.DataLoader(arrays, **kwargs)
        with pytest.raises(ValueError, match=msg):
            TD.DataLoader(arrays, **kwargs)
    for kwargs in [dict(shuffle=True), dict(sampler=[0]), dict(batch_sampler=[[0]])]:
        name = next(iter(kwargs))
        with pytest.raises(ValueError, match=f"IterableDataset: expected unspecified {name} option"):
            kiln.data.DataLoader(_StreamLen(3), **kwargs)
    # torch's arguments a thread pool has no use for: named, with what to do instead
    for name, value, msg in [("generator", object(), "seed="), ("worker_init_fn", print, "threads of this process"),
                             ("multiprocessing_context", "spawn", "threads, not processes"),
                             ("pin_memory_device", "cuda", "pin_memory=True")]:
        with pytest.raises(TypeError, match=f"DataLoader: {name}= is not supported: .*{msg}"):
            kiln.data.DataLoader(arrays, **{name: value})
    # the harmless ones are taken: persistent_workers, prefetch_factor (batches ahead per thread)
    loader = kiln.data.DataLoader(arrays, batch_size=2, num_workers=2, persistent_workers=True, prefetch_factor=1)
    assert [b[:, 0].tolist() for b in loader] == [[0, 1], [2, 3], [4, 5], [6]]
    for kwargs, msg in [(dict(persistent_workers=True), "persistent_workers needs num_workers >= 1"),
                        (dict(prefetch_factor=2), "prefetch_factor applies to worker threads"),
                        (dict(prefetch_factor=0, num_workers=1), "prefetch_factor must be an int >= 1")]:
        with pytest.raises(ValueError, match=msg):
            kiln.data.DataLoader(arrays, **kwargs)


def test_collate_errors_name_types_indices_and_empty_batches():
    # a kiln tensor with a NumPy array: said so (it was "shapes [(3,)]")
    for samples, order in [([kiln.zeros(3), np.zeros(3, np.float32)], r"Tensor at batch position \[0\] and ndarray"),
                           ([np.zeros(3, np.float32), kiln.zeros(3)], r"ndarray at batch position \[0\] and Tensor")]:
        with pytest.raises(TypeError, match=f"samples of one batch mix types: {order}"):
            kiln.data.default_collate(samples)

    class Shapes:  # (tensor, label); sample 7's tensor is longer
        def __len__(self):
            return 10

        def __getitem__(self, i):
            return kiln.zeros(4 if i == 7 else 3), i

    for workers in (0, 2):  # the loader names the dataset indices of the batch
        with pytest.raises(ValueError, match=r"sample\[0\]s of one batch cannot be stacked: shapes \(3,\) at dataset "
                                             r"indices \[4, 5, 6\] and \(4,\) at dataset index \[7\]"):
            list(kiln.data.DataLoader(Shapes(), batch_size=4, num_workers=workers))
    with pytest.raises(ValueError, match="default_collate: no samples"):
        kiln.data.default_collate([])
    with pytest.raises(ValueError, match="cannot be stacked"):
        kiln.data.default_collate([np.zeros(3), np.zeros(4)])


def test_dataloader_empty_subset_of_an_engine_dataset_has_no_batches(tmp_path):
    # "the dataset is empty" was raised; an empty Python list (and torch) gives 0 batches
    corpus = tmp_path / "c.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog\n" * 50)
    kiln.data.build_vocab(corpus, tmp_path / "v.txt", size=100, min_frequency=1)
    mlm = kiln.data.masked_lm(corpus, tmp_path / "v.txt", seq_len=16)
    assert len(mlm) > 0
    for kwargs in [dict(batch_size=4), dict(batch_size=4, shuffle=True, drop_last=True, num_workers=2),
                   dict(batch_size=2, rank=1, world_size=2)]:
        loader = kiln.data.DataLoader(kiln.data.Subset(mlm, []), **kwargs)
        assert len(loader) == 0 and list(loader) == [] and list(loader) == []
    assert len(kiln.data.DataLoader(kiln.data.Subset(list(range(5)), []), batch_size=4)) == 0
    assert len(TD.DataLoader(TD.Subset(list(range(5)), []), batch_size=4)) == 0


@pytest.mark.parametrize("workers", [0, 2])
def test_dataloader_empty_batch_from_a_batch_sampler(workers):
    # an IndexError (default_collate's samples[0]) where default_collate says it has no samples
    data = [np.float32(i) for i in range(4)]
    loader = kiln.data.DataLoader(data, batch_sampler=[[0, 1], []], num_workers=workers)
    with pytest.raises(ValueError, match=r"batch_sampler gave an empty list of indices, and default_collate has no "
                       r"samples to stack"):
        list(loader)
    # a collate_fn is handed the empty batch, as torch's
    assert list(kiln.data.DataLoader(data, batch_sampler=[[2], []], collate_fn=len, num_workers=workers)) == [1, 0]


def test_build_vocab_takes_paths_as_masked_lm(tmp_path):
    import pathlib

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog\n" * 20)
    for files, out in [(corpus, tmp_path / "a.txt"), (str(corpus), str(tmp_path / "b.txt")),
                       ([pathlib.Path(corpus)], tmp_path / "c.txt")]:
        kiln.data.build_vocab(files, out, size=100, min_frequency=1)
        tok = kiln.data.WordPieceTokenizer(str(out))
        assert tok.vocab_size > 5 and tok.id("fox") >= 0
    assert (tmp_path / "a.txt").read_text() == (tmp_path / "b.txt").read_text() == (tmp_path / "c.txt").read_text()
    assert len(kiln.data.masked_lm(corpus, tmp_path / "a.txt", seq_len=16)) > 0


def test_a_grandchild_forked_before_its_parents_first_use_keeps_the_thread_count():
    # A child that forked again before any parallel work passed its own fresh 1-thread pool's size
    # on, not the size its parent was to start at: the grandchild ran on 1 thread for good.
    script = """
import os, kiln
kiln.set_num_threads(2)
pid = os.fork()
if pid == 0:
    pid2 = os.fork()
    if pid2 == 0:
        print("grandchild", kiln.get_num_threads(), flush=True); os._exit(0)
    os.waitpid(pid2, 0)
    print("child", kiln.get_num_threads(), flush=True); os._exit(0)
os.waitpid(pid, 0)
print("parent", kiln.get_num_threads(), flush=True)
"""
    rc, out, err = _run_script(script)
    assert rc == 0, err
    assert sorted(out.split("\n")[:3]) == ["child 2", "grandchild 2", "parent 2"], out


def test_an_op_run_by_python_code_inside_a_result_conversion_leaves_the_kiln_code_count_balanced():
    # max(x, dim) took the GIL back inside its release to build its result: Python code run
    # there (a GC callback) calling another op cleared the thread's mark, and the count of threads
    # in Kiln code grew by one each time (an exit then waited its whole limit for no thread).
    script = """
import gc, kiln
x = kiln.ones([4, 4])
calls = [0]
def cb(phase, info):
    calls[0] += 1
    kiln.argmax(x)
gc.callbacks.append(cb)
gc.set_threshold(1)
keep = [kiln._C.max(x, 0) for _ in range(3000)]  # the binding itself (kiln.max may take another way)
gc.callbacks.clear(); gc.set_threshold(700)
print(calls[0] > 0, kiln._C._exit_quiesce(0), flush=True)
"""
    rc, out, err = _run_script(script)
    assert rc == 0, err
    assert out.split() == ["True", "0"], out + err


@pytest.mark.skipif(not hasattr(BaseException, "add_note"), reason="exception notes are Python 3.11's")
@pytest.mark.parametrize("workers", [0, 2])
def test_dataloader_notes_the_index_once_on_an_exception_raised_again(workers):
    # The note naming the index was added at every raise of the same exception object: twice when
    # the user's code re-raised it through a second pass, once per item for a dataset that keeps it.
    kept = KeyError("no such sample")

    class Cached:
        def __len__(self):
            return 6

        def __getitem__(self, i):
            if i >= 3:
                raise kept
            return np.float32(i)

    def notes(e):
        return [n for n in getattr(e, "__notes__", []) if "in DataLoader" in n]

    loader = kiln.data.DataLoader(Cached(), batch_sampler=[[0, 1], [2, 3]], num_workers=workers)
    for _ in range(2):  # the same object from two passes (item 3, then 3 again)
        with pytest.raises(KeyError) as e:
            list(loader)
        assert e.value is kept and notes(e.value) == ["(in DataLoader, reading dataset[3])"]
    # items 5 and 4 after 3 (through another loader, whose note is its own): one note, naming the item
    # that raised last (either, with worker threads)
    del kept.__notes__
    with pytest.raises(KeyError) as e:
        list(kiln.data.DataLoader(Cached(), batch_sampler=[[5], [4]], num_workers=workers))
    assert notes(e.value) in (["(in DataLoader, reading dataset[5])"], ["(in DataLoader, reading dataset[4])"])
    # the user's own notes are left as they are
    del kept.__notes__
    loader = kiln.data.DataLoader(Cached(), batch_sampler=[[3]], num_workers=workers)
    with pytest.raises(KeyError):
        list(loader)
    kept.add_note("mine")
    loader.batch_sampler = [[4]]
    with pytest.raises(KeyError) as e:
        list(loader)
    assert e.value.__notes__ == ["(in DataLoader, reading dataset[4])", "mine"]


@pytest.mark.skipif(not hasattr(BaseException, "add_note"), reason="exception notes are Python 3.11's")
@pytest.mark.parametrize("workers", [0, 2])
def test_dataloader_keeps_an_inner_loaders_index_note(workers):
    # A dataset reading another DataLoader: the inner loader's note (its index) and the outer's are both
    # kept; the outer's replaced the inner's.
    class Inner:
        def __len__(self):
            return 8

        def __getitem__(self, i):
            if i == 7:
                raise KeyError("no such sample")
            return np.float32(i)

    inner = kiln.data.DataLoader(Inner(), batch_sampler=[[7]], num_workers=workers)

    class Outer:
        def __len__(self):
            return 2

        def __getitem__(self, i):
            return next(iter(inner)) if i == 1 else np.float32(0)

    with pytest.raises(KeyError) as e:
        list(kiln.data.DataLoader(Outer(), batch_size=2, num_workers=workers))
    assert [n for n in e.value.__notes__ if "in DataLoader" in n] == ["(in DataLoader, reading dataset[7])",
                                                                    "(in DataLoader, reading dataset[1])"]


def test_default_collate_of_string_object_and_complex_arrays_is_a_type_error():
    # from_numpy's low-level error came out. String and object arrays: torch's TypeError and words;
    # complex ones (which Kiln has no dtype for): a TypeError naming the dtype and the samples.
    for samples in ([np.array(["ab", "c"]), np.array(["d", "e"])], [np.array([b"x"]), np.array([b"y"])],
                    [np.array([object()]), np.array([object()])]):
        with pytest.raises(TypeError) as te:
            TD.default_collate(samples)
        with pytest.raises(TypeError) as ke:
            kiln.data.default_collate(samples)
        assert str(ke.value) == str(te.value)
        assert str(ke.value).startswith("default_collate: batch must contain tensors, numpy arrays, numbers, dicts "
                                        "or lists; found ")
    with pytest.raises(TypeError, match=r"samples of one batch are complex \(complex64 at batch position \[1\]\): "
                                        "Kiln has no complex dtype"):
        kiln.data.default_collate([np.zeros(2, np.float32), np.zeros(2, np.complex64)])
    with pytest.raises(TypeError, match=r"sample\[1\]s of one batch are complex \(complex128 at batch positions "
                                        r"\[0, 1\]\)"):
        kiln.data.default_collate([(1, 1j), (2, 2 + 0j)])
    with pytest.raises(TypeError, match=r"complex \(complex128 at dataset indices \[2, 3\]\)"):
        list(kiln.data.DataLoader([np.float64(0), np.float64(1), np.complex128(2), np.complex128(3)], batch_size=2))
    # NumPy string scalars stay a list, as torch's
    assert kiln.data.default_collate([np.str_("a"), np.str_("b")]) == ["a", "b"]


@pytest.mark.parametrize("threads", ["loader", "user", "realleak"])
def test_a_forked_child_of_a_parent_with_threads_exits_without_leak_reports(threads):
    # The parent's other threads are gone in the child, their frames never freed: what they held (the
    # tensors, the module's globals) was reported by nanobind as leaked at the child's exit.
    # realleak: the parent's other thread does nothing with Kiln, and the child leaks a tensor for
    # real: the child's report stays on and names it.
    script = """
import os, sys, threading, time, numpy as np, kiln, kiln.data
m = kiln.nn.Linear(3, 2)
m(kiln.randn(4, 3)).sum().backward()
if sys.argv[1] == "loader":
    class DS:
        def __len__(self): return 100
        def __getitem__(self, i):
            time.sleep(0.05); return np.float32(i)
    it = iter(kiln.data.DataLoader(DS(), batch_size=2, num_workers=2))
    next(it)
elif sys.argv[1] == "user":
    started = threading.Event()
    def hold():
        t = kiln.randn(5)
        started.set(); time.sleep(30)
    threading.Thread(target=hold, daemon=True).start(); started.wait()
else:
    threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
pid = os.fork()
if pid == 0:
    if sys.argv[1] == "realleak":
        import ctypes
        t = kiln.randn(3)
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(t))  # a reference never dropped: a real leak
    sys.exit(0)  # the interpreter's whole exit, as a script's child ends
_, status = os.waitpid(pid, 0)
print("child", os.waitstatus_to_exitcode(status), flush=True)
os._exit(0)
"""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", script, threads], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.split() == ["child", "0"], r.stdout + r.stderr
    if threads == "realleak":
        assert "leaked" in r.stderr, r.stderr
    else:
        assert "leaked" not in r.stderr, r.stderr


def test_default_collate_of_a_ragged_sample_is_the_stacking_error():
    # The complex check's np.asarray of every sample raised NumPy's bare ValueError for a ragged list
    # before the stacking could say which batch cannot be stacked.
    for samples in ([np.zeros(2), [[1, 2], [3]]], [1.0, [[1, 2], [3]]]):
        with pytest.raises(ValueError, match=r"^DataLoader: samples of one batch cannot be stacked: "):
            kiln.data.default_collate(samples)
    with pytest.raises(TypeError, match=r"complex \(complex128 at batch position \[1\]\)"):
        kiln.data.default_collate([np.float64(1), 2j])


def test_a_python_thread_runs_while_a_long_sort_runs():
    # sort, topk, kthvalue, median, mode, cummax and cummin (and max/min without a dim) held the GIL
    # for the whole op: every other Python thread stopped until a sort of millions of elements ended.
    # A counter thread's progress during one sort is compared with its progress in one GIL switch
    # interval: holding the GIL, the sort let it run for an interval or three around the call.
    import sys
    import time

    count = [0]
    stop = threading.Event()

    def counter():
        while not stop.is_set():
            count[0] += 1

    threads = kiln.get_num_threads()
    kiln.set_num_threads(1)
    t = threading.Thread(target=counter)
    t.start()
    try:
        x = kiln.randn(1_000_000)
        kiln.sort(x)  # warm up
        while count[0] == 0:
            time.sleep(0.001)
        at = count[0]
        time.sleep(10 * sys.getswitchinterval())  # the GIL let go: what the counter does in an interval
        per_interval = max(1, (count[0] - at) // 10)
        progress = []
        for _ in range(3):
            at = count[0]
            start = time.perf_counter()
            kiln.sort(x)
            took = time.perf_counter() - start
            progress.append(count[0] - at)
            if took < 20 * sys.getswitchinterval():  # too short to tell; a bigger sort next time
                x = kiln.cat([x, x])
    finally:
        stop.set()
        t.join()
        kiln.set_num_threads(threads)
    assert max(progress) > 8 * per_interval, (progress, per_interval)


DEADLOCK_SCRIPT = """
import threading, time, numpy as np, kiln
w = kiln.zeros(3, 4).requires_grad_(True)
# Each backward's gradient is a fresh NumPy buffer that the leaf's accumulation copies and lets go:
# its release takes the GIL, while the other thread, holding the GIL, builds graphs on other leaves.
w.register_hook(lambda g: kiln.from_numpy(np.ones((3, 4), dtype=np.float32)))
w.grad = kiln.zeros(3, 4)
qs = [kiln.zeros(2).requires_grad_(True) for _ in range(64)]
stop = False
def a():
    x = kiln.ones(3, 4)
    while not stop:
        (w * x).sum().backward()
def b():
    while not stop:
        for q in qs:
            q.t()
ts = [threading.Thread(target=f, daemon=True) for f in (a, b)]
for t in ts:
    t.start()
time.sleep(3)
stop = True
for t in ts:
    t.join(10)
print("alive", sum(t.is_alive() for t in ts))
"""


def test_backward_releasing_a_numpy_gradient_while_another_thread_builds_graphs_does_not_hang():
    # The leaf accumulation's lock (a pool of mutexes shared by leaves) was held while a NumPy-owned
    # gradient died, whose release waits for the GIL; a thread holding the GIL waited for the same
    # mutex in a graph's leaf edge: both hung for good (in under a second).
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", DEADLOCK_SCRIPT], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "alive 0" in r.stdout, r.stdout + r.stderr


def test_grad_scaler_step_with_a_negative_lr_changes_nothing_and_can_be_retried():
    # the lr check runs before the gradients are unscaled and the scaler notes the step: fixing the lr and
    # stepping again takes the step once, with the gradient unscaled once
    p = kiln.tensor([1.0, 2.0], requires_grad=True)
    opt = kiln.optim.SGD([p], lr=0.1)
    scaler = kiln.amp.GradScaler("cpu", init_scale=8.0)
    scaler.scale((p * kiln.tensor([1.0, 3.0])).sum()).backward()
    opt.param_groups[0]["lr"] = -0.1
    with pytest.raises(kiln.KilnError, match=r"group 0's lr is -0\.1 at this step; a step needs a finite lr >= 0"):
        scaler.step(opt)
    assert p.grad.numpy().tolist() == [8.0, 24.0] and p.detach().numpy().tolist() == [1.0, 2.0]
    opt.param_groups[0]["lr"] = 0.1
    scaler.step(opt)
    scaler.update()
    assert p.detach().numpy().tolist() == pytest.approx([0.9, 1.7])


def test_the_negative_lr_refusal_suggests_maximize_only_where_the_group_does_not_set_it():
    for maximize in (False, True):
        p = kiln.tensor([1.0], requires_grad=True)
        opt = kiln.optim.SGD([p], lr=0.1, maximize=maximize)
        opt.param_groups[0]["lr"] = -0.5
        p.grad = kiln.tensor([1.0])
        with pytest.raises(kiln.KilnError, match=r"group 0's lr is -0\.5 at this step") as e:
            opt.step()
        assert ("to ascend, use maximize=True" in str(e.value)) == (not maximize), str(e.value)
        assert p.detach().numpy().tolist() == [1.0]


def test_every_groups_lr_is_checked_not_only_those_with_gradients():
    # under ZeRO a rank whose shard holds none of a group's parameters must refuse as the others do
    a, b = kiln.tensor([1.0], requires_grad=True), kiln.tensor([2.0], requires_grad=True)
    opt = kiln.optim.SGD([{"params": [a]}, {"params": [b]}], lr=0.1)
    opt.param_groups[1]["lr"] = -0.1
    a.grad = kiln.tensor([1.0])
    with pytest.raises(kiln.KilnError, match=r"group 1's lr is -0\.1 at this step"):
        opt.step()
    with pytest.raises(kiln.KilnError, match=r"group 1's lr is -0\.1 at this step; .*minimize the negated loss"):
        opt._engine.step()
    assert a.detach().numpy().tolist() == [1.0]


def test_a_refused_scheduler_step_rolls_back_its_step_count():
    ko, _ = optimizers()
    ks = KS.LambdaLR(ko, lambda e: math.inf if e == 2 else 1.0)
    ks.step()
    count = ks._step_count
    with pytest.raises(ValueError, match="LambdaLR: step at epoch 2"):
        ks.step()
    assert ks._step_count == count and ks.last_epoch == 1
    # a lr_lambda that raises (a review): last_epoch rolled back too, so a retry steps epoch 2
    calls = []

    def flaky(e):
        calls.append(e)
        if e == 2 and calls.count(2) == 1:
            raise RuntimeError("data not ready")
        return 0.5 ** e

    ks = KS.LambdaLR(optimizers()[0], flaky)
    ks.step()
    with pytest.raises(RuntimeError, match="data not ready"):
        ks.step()
    assert ks.last_epoch == 1 and ks._step_count == 2
    ks.step()
    assert ks.last_epoch == 2 and ks.get_last_lr()[0] == pytest.approx(0.25 * ks.base_lrs[0])


def test_a_groups_own_negative_lr_is_refused_where_torch_takes_it_as_documented():
    # docs/python.md: torch takes {'lr': -0.1} in a group and in add_param_group; Kiln refuses both
    tp = torch.zeros(1, requires_grad=True)
    torch.optim.SGD([{"params": [tp], "lr": -0.1}], lr=0.1).add_param_group(
        {"params": [torch.zeros(1, requires_grad=True)], "lr": -0.2})
    kp = kiln.zeros(1, requires_grad=True)
    with pytest.raises(kiln.KilnError, match="group 0's lr must be finite and >= 0, got -0.1"):
        kiln.optim.SGD([{"params": [kp], "lr": -0.1}], lr=0.1)
    with pytest.raises(kiln.KilnError, match="group 1's lr must be finite and >= 0, got -0.2"):
        kiln.optim.SGD([kp], lr=0.1).add_param_group({"params": [kiln.zeros(1, requires_grad=True)], "lr": -0.2})
