# kiln.optim.lr_scheduler.CyclicLR and kiln.optim.swa_utils (AveragedModel, SWALR, update_bn and the
# avg_fn factories) against torch's, and kiln.use_deterministic_algorithms: lr and momentum / beta1
# sequences in every mode, state_dict round trips, refusals, averaged weights and BatchNorm statistics.
import pickle

import numpy as np
import pytest

import kiln

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(17)


def params(n=2):
    arrs = [RNG.standard_normal(3).astype(np.float32) for _ in range(n)]
    return ([kiln.tensor(a, requires_grad=True) for a in arrs], [torch.tensor(a, requires_grad=True) for a in arrs])


def optimizers(kind, **kw):
    kp, tp = params()
    groups = lambda ps: [{"params": [ps[0]]}, {"params": [ps[1]], "lr": 0.5}]  # noqa: E731
    if kind == "sgd":
        return kiln.optim.SGD(groups(kp), lr=0.1, momentum=0.9, **kw), torch.optim.SGD(groups(tp), lr=0.1,
                                                                                        momentum=0.9, **kw)
    return kiln.optim.Adam(groups(kp), lr=0.1, **kw), torch.optim.Adam(groups(tp), lr=0.1, **kw)


def momenta(opt):
    return [g["betas"][0] if "betas" in g else g["momentum"] for g in opt.param_groups]


class Halving:
    """A scale_fn that is an object: its __dict__ is saved in state_dict, as torch's."""

    def __init__(self):
        self.base = 0.5

    def __call__(self, x):
        return self.base ** x


CYCLIC = [dict(mode="triangular"), dict(mode="triangular2"), dict(mode="exp_range", gamma=0.9),
          dict(step_size_down=2), dict(scale_fn=lambda x: 1 / (1 + x), scale_mode="iterations"),
          dict(scale_fn=lambda x: 0.8 ** x, scale_mode="cycle"), dict(mode="triangular2", step_size_down=5)]


@pytest.mark.parametrize("kind", ["sgd", "adam"])
@pytest.mark.parametrize("i", range(len(CYCLIC)))
def test_cyclic_lr_and_momentum_sequences(kind, i):
    kw = CYCLIC[i]
    ko, to = optimizers(kind)
    args = dict(base_lr=[0.01, 0.02], max_lr=[0.1, 0.3], step_size_up=3, base_momentum=[0.8, 0.7],
                max_momentum=0.95, **kw)
    ks, ts = kiln.optim.lr_scheduler.CyclicLR(ko, **args), torch.optim.lr_scheduler.CyclicLR(to, **args)
    for _ in range(20):
        assert ks.get_last_lr() == pytest.approx(ts.get_last_lr(), rel=1e-12)
        assert [g["lr"] for g in ko.param_groups] == pytest.approx([g["lr"] for g in to.param_groups], rel=1e-12)
        assert momenta(ko) == pytest.approx(momenta(to), rel=1e-12)
        ko.step()
        to.step()
        ks.step()
        ts.step()


def test_cyclic_without_momentum_and_refusals():
    ko, to = optimizers("sgd")
    ks = kiln.optim.lr_scheduler.CyclicLR(ko, 0.01, 0.1, step_size_up=2, cycle_momentum=False)
    ts = torch.optim.lr_scheduler.CyclicLR(to, 0.01, 0.1, step_size_up=2, cycle_momentum=False)
    for _ in range(6):
        ks.step()
        ts.step()
        assert ks.get_last_lr() == pytest.approx(ts.get_last_lr(), rel=1e-12)
        assert momenta(ko) == [0.9, 0.9]
    with pytest.raises(ValueError, match="mode must be"):
        kiln.optim.lr_scheduler.CyclicLR(ko, 0.01, 0.1, mode="sawtooth")
    with pytest.raises(ValueError, match="expected 2 values for max_lr"):
        kiln.optim.lr_scheduler.CyclicLR(ko, 0.01, [0.1, 0.2, 0.3])
    with pytest.raises(TypeError, match="not a kiln.optim optimizer"):
        kiln.optim.lr_scheduler.CyclicLR(to, 0.01, 0.1)


def test_cyclic_refused_step_changes_nothing():
    ko, _ = optimizers("sgd")
    bad = []

    def scale(x):
        return float("inf") if bad else 1.0

    ks = kiln.optim.lr_scheduler.CyclicLR(ko, 0.01, 0.1, step_size_up=2, scale_fn=scale)
    ks.step()
    bad.append(True)
    before = (ks.last_epoch, [g["lr"] for g in ko.param_groups], momenta(ko))
    with pytest.raises(ValueError, match="no group's lr was changed"):
        ks.step()
    assert (ks.last_epoch, [g["lr"] for g in ko.param_groups], momenta(ko)) == before
    bad.clear()
    ks.step()
    assert ks.last_epoch == before[0] + 1 and momenta(ko) != before[2]


@pytest.mark.parametrize("kw", [dict(mode="exp_range", gamma=0.95), dict(scale_fn=Halving(), scale_mode="cycle"),
                                dict(scale_fn=lambda x: 1.0)])
def test_cyclic_state_dict_round_trip(kw):
    ko, to = optimizers("adam")
    ks = kiln.optim.lr_scheduler.CyclicLR(ko, 0.01, 0.1, step_size_up=4, **kw)
    ts = torch.optim.lr_scheduler.CyclicLR(to, 0.01, 0.1, step_size_up=4, **kw)
    for _ in range(5):
        ks.step()
        ts.step()
    sd = ks.state_dict()
    tsd = ts.state_dict()
    assert sd["_scale_fn_custom"] == tsd["_scale_fn_custom"]
    sd = pickle.loads(pickle.dumps(sd))  # no function in it: it pickles
    # a fresh scheduler (a new optimizer) takes the state and continues as the first
    ko2, _ = optimizers("adam")
    fn = kw.get("scale_fn")
    if isinstance(fn, Halving):
        kw = dict(kw, scale_fn=Halving())
        kw["scale_fn"].base = 0.1  # load restores the object's state
        fn.base = 0.5
    ks2 = kiln.optim.lr_scheduler.CyclicLR(ko2, 0.01, 0.1, step_size_up=4, **kw)
    ks2.load_state_dict(sd)
    assert "_scale_fn_custom" in sd  # the caller's dict is not emptied
    if isinstance(fn, Halving):
        assert ks2._scale_fn_custom.base == 0.5
    for _ in range(6):
        ks.step()
        ks2.step()
        ts.step()
        assert ks2.get_last_lr() == pytest.approx(ks.get_last_lr(), rel=1e-12)
        assert ks2.get_last_lr() == pytest.approx(ts.get_last_lr(), rel=1e-12)
        assert momenta(ko2) == pytest.approx(momenta(to), rel=1e-12)


def test_cyclic_resume_with_last_epoch():
    ko, to = optimizers("sgd")
    ks = kiln.optim.lr_scheduler.CyclicLR(ko, 0.01, 0.1, step_size_up=3)
    ts = torch.optim.lr_scheduler.CyclicLR(to, 0.01, 0.1, step_size_up=3)
    for _ in range(4):
        ks.step()
        ts.step()
    ks2 = kiln.optim.lr_scheduler.CyclicLR(ko, 0.01, 0.1, step_size_up=3, last_epoch=ks.last_epoch)
    ts2 = torch.optim.lr_scheduler.CyclicLR(to, 0.01, 0.1, step_size_up=3, last_epoch=ts.last_epoch)
    for _ in range(4):
        ks2.step()
        ts2.step()
        assert ks2.get_last_lr() == pytest.approx(ts2.get_last_lr(), rel=1e-12)
        assert momenta(ko) == pytest.approx(momenta(to), rel=1e-12)


# ---- swa_utils ---------------------------------------------------------------------------------------


def models():
    torch.manual_seed(0)
    tm = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.BatchNorm1d(5), torch.nn.ReLU(), torch.nn.Linear(5, 2))
    km = kiln.nn.Sequential(kiln.nn.Linear(4, 5), kiln.nn.BatchNorm1d(5), kiln.nn.ReLU(), kiln.nn.Linear(5, 2))
    km.load_state_dict({k: kiln.tensor(v.numpy()) for k, v in tm.state_dict().items()})
    return km, tm


def perturb(km, tm, seed):
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for (name, tp), kp in zip(tm.named_parameters(), km.parameters()):
            a = rng.standard_normal(tuple(tp.shape)).astype(np.float32)
            tp.add_(torch.tensor(a))
            kp.detach().add_(kiln.tensor(a))
        # the buffers move as training would move them
        for tb, kb in zip(tm.buffers(), km.buffers()):
            if tb.dtype.is_floating_point:
                a = np.abs(rng.standard_normal(tuple(tb.shape))).astype(np.float32)
                tb.add_(torch.tensor(a))
                kb.add_(kiln.tensor(a))
            else:
                tb.add_(3)
                kb.add_(3)


def same_state(ka, ta, tol=1e-6):
    ksd, tsd = ka.state_dict(), ta.state_dict()
    assert list(ksd) == list(tsd)
    for k in tsd:
        np.testing.assert_allclose(np.asarray(ksd[k].tolist()), tsd[k].numpy(), rtol=tol, atol=tol, err_msg=k)


SWA = {
    "swa": ({}, {}),
    "ema_multi": (lambda su: dict(multi_avg_fn=su.get_ema_multi_avg_fn(0.9)), None),
    "ema": (lambda su: dict(avg_fn=su.get_ema_avg_fn(0.8)), None),
    "swa_fn": (lambda su: dict(avg_fn=su.get_swa_avg_fn()), None),
    "swa_multi": (lambda su: dict(multi_avg_fn=su.get_swa_multi_avg_fn()), None),
    "custom": (lambda su: dict(avg_fn=lambda a, c, n: a * 0.5 + c * 0.5 + n), None),
}


@pytest.mark.parametrize("use_buffers", [False, True])
@pytest.mark.parametrize("name", list(SWA))
def test_averaged_model(name, use_buffers):
    if name == "swa_multi" and use_buffers:
        pytest.skip("torch's get_swa_multi_avg_fn refuses num_batches_tracked (integer addcdiv)")
    km, tm = models()
    make = SWA[name][0]
    kkw = make(kiln.optim.swa_utils) if callable(make) else {}
    tkw = make(torch.optim.swa_utils) if callable(make) else {}
    ka = kiln.optim.swa_utils.AveragedModel(km, use_buffers=use_buffers, **kkw)
    ta = torch.optim.swa_utils.AveragedModel(tm, use_buffers=use_buffers, **tkw)
    same_state(ka, ta)
    for step in range(4):
        perturb(km, tm, step)
        ka.update_parameters(km)
        ta.update_parameters(tm)
        same_state(ka, ta, 1e-5)
    assert ka.n_averaged.item() == 4
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    ka.eval()
    ta.eval()
    np.testing.assert_allclose(ka(kiln.tensor(x)).detach().numpy(), ta(torch.tensor(x)).detach().numpy(), rtol=1e-4,
                               atol=1e-5)
    # the copy is a copy: the model's parameters are not the averaged ones
    assert all(a is not b for a, b in zip(ka.module.parameters(), km.parameters()))


def test_averaged_model_refusals():
    km, _ = models()
    su = kiln.optim.swa_utils
    with pytest.raises(ValueError, match="not both"):
        su.AveragedModel(km, avg_fn=su.get_swa_avg_fn(), multi_avg_fn=su.get_swa_multi_avg_fn())
    with pytest.raises(ValueError, match="decay"):
        su.get_ema_multi_avg_fn(1.5)
    with pytest.raises(ValueError, match="decay"):
        su.get_ema_avg_fn(-0.1)
    ka = su.AveragedModel(km)
    with pytest.raises(ValueError, match="same structure"):
        ka.update_parameters(kiln.nn.Linear(4, 5))


def test_update_bn():
    km, tm = models()
    perturb(km, tm, 7)
    data = [RNG.standard_normal((6, 4)).astype(np.float32) * 3 + 1 for _ in range(4)]
    kloader = [(kiln.tensor(d), 0) for d in data]
    tloader = [(torch.tensor(d), 0) for d in data]
    km.eval()
    tm.eval()
    kiln.optim.swa_utils.update_bn(kloader, km)
    torch.optim.swa_utils.update_bn(tloader, tm)
    same_state(km, tm, 1e-5)
    assert not km.training
    assert km[1].momentum == 0.1
    assert km[1].num_batches_tracked.item() == 4
    # a loader of tensors, and an AveragedModel
    ka = kiln.optim.swa_utils.AveragedModel(km)
    ta = torch.optim.swa_utils.AveragedModel(tm)
    kiln.optim.swa_utils.update_bn([kiln.tensor(d) for d in data[:2]], ka)
    torch.optim.swa_utils.update_bn([torch.tensor(d) for d in data[:2]], ta)
    same_state(ka, ta, 1e-5)
    # no BatchNorm: nothing happens
    lin = kiln.nn.Linear(2, 2)
    kiln.optim.swa_utils.update_bn([kiln.zeros(1, 2)], lin)


def bn_stats(model):
    return {n: b.numpy().copy() for n, b in model.named_buffers() if n.endswith(("running_mean", "running_var"))}


def test_update_bn_on_a_cpp_model():
    # kiln.models' BatchNorms are C++ modules: update_bn recomputes them too. The reference: each batch's
    # own statistics, by running it alone in training mode until the running statistics (momentum 0.1)
    # have converged to them (0.9 ** 200 of the start is left); update_bn's cumulative average over two
    # batches is their mean
    model = kiln.models.create("resnet20")
    rng = np.random.default_rng(11)
    batches = [kiln.tensor(rng.standard_normal((4, 3, 8, 8)).astype(np.float32) * s + s) for s in (1.0, 2.0)]
    per_batch = []
    model.train()
    with kiln.no_grad():
        for x in batches:
            for _ in range(200):
                model(x)
            per_batch.append(bn_stats(model))
    want = {n: (per_batch[0][n] + per_batch[1][n]) / 2 for n in per_batch[0]}
    assert len(want) == 2 * 21  # resnet20's 21 BatchNorms (two in shortcuts), none left out
    model.eval()
    kiln.optim.swa_utils.update_bn([(x, 0) for x in batches], model)
    got = bn_stats(model)
    for n in want:
        np.testing.assert_allclose(got[n], want[n], rtol=1e-4, atol=1e-5, err_msg=n)
    assert not model.training
    for n, b in model.named_buffers():
        if n.endswith("num_batches_tracked"):
            assert b.item() == 2, n
    # an AveragedModel of it; and an empty loader leaves the statistics reset, as torch's
    avg = kiln.optim.swa_utils.AveragedModel(model)
    kiln.optim.swa_utils.update_bn([batches[0]], avg)
    for n, v in bn_stats(avg.module).items():
        np.testing.assert_allclose(v, per_batch[0][n], rtol=1e-4, atol=1e-5, err_msg=n)
    kiln.optim.swa_utils.update_bn([], model)
    for n, v in bn_stats(model).items():
        np.testing.assert_array_equal(v, np.zeros_like(v) if n.endswith("mean") else np.ones_like(v))


def test_update_bn_leaves_other_python_modules_with_running_stats_alone_as_torch():
    # torch's update_bn only touches _BatchNorm modules: an InstanceNorm2d tracking running statistics
    # (and a module of one's own with such buffers) keeps what it has, the BatchNorm is recomputed
    def build(nn):
        torch.manual_seed(3)
        return nn.Sequential(nn.Conv2d(2, 3, 3), nn.InstanceNorm2d(3, track_running_stats=True), nn.BatchNorm2d(3))

    tm, km = build(torch.nn), build(kiln.nn)
    km.load_state_dict({k: kiln.tensor(v.numpy()) for k, v in tm.state_dict().items()})
    rng = np.random.default_rng(5)
    warm = rng.standard_normal((2, 2, 6, 6)).astype(np.float32) * 2 + 1
    tm(torch.tensor(warm))  # training mode: the InstanceNorm's statistics move away from 0 / 1
    km(kiln.tensor(warm))
    same_state(km, tm, 1e-5)

    class Norm(kiln.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("running_mean", kiln.full([3], 2.0))
            self.register_buffer("running_var", kiln.full([3], 3.0))

        def forward(self, x):
            return x

    km.append(Norm())
    data = [rng.standard_normal((4, 2, 6, 6)).astype(np.float32) for _ in range(3)]
    kiln.optim.swa_utils.update_bn([kiln.tensor(d) for d in data], km)
    torch.optim.swa_utils.update_bn([torch.tensor(d) for d in data], tm)
    del km[3]
    same_state(km, tm, 1e-5)


@pytest.mark.parametrize("strategy", ["cos", "linear"])
@pytest.mark.parametrize("anneal_epochs", [0, 1, 4])
def test_swalr(strategy, anneal_epochs):
    ko, to = optimizers("sgd")
    ks = kiln.optim.swa_utils.SWALR(ko, swa_lr=[0.05, 0.2], anneal_epochs=anneal_epochs, anneal_strategy=strategy)
    ts = torch.optim.swa_utils.SWALR(to, swa_lr=[0.05, 0.2], anneal_epochs=anneal_epochs, anneal_strategy=strategy)
    for _ in range(7):
        assert ks.get_last_lr() == pytest.approx(ts.get_last_lr(), rel=1e-12)
        assert [g["swa_lr"] for g in ko.param_groups] == [g["swa_lr"] for g in to.param_groups]
        ko.step()
        to.step()
        ks.step()
        ts.step()
    sd = pickle.loads(pickle.dumps(ks.state_dict()))
    ko2, _ = optimizers("sgd")
    ks2 = kiln.optim.swa_utils.SWALR(ko2, swa_lr=[0.05, 0.2], anneal_epochs=anneal_epochs)
    ks2.load_state_dict(sd)
    for g2, g in zip(ko2.param_groups, ko.param_groups):
        g2["lr"] = g["lr"]
    ks.step()
    ks2.step()
    assert ks2.get_last_lr() == pytest.approx(ks.get_last_lr(), rel=1e-12)


def test_swalr_refusals():
    ko, _ = optimizers("sgd")
    with pytest.raises(ValueError, match="anneal_strategy"):
        kiln.optim.swa_utils.SWALR(ko, 0.05, anneal_strategy="exp")
    with pytest.raises(ValueError, match="anneal_epochs"):
        kiln.optim.swa_utils.SWALR(ko, 0.05, anneal_epochs=-1)
    with pytest.raises(ValueError, match="expected 2 values for swa_lr"):
        kiln.optim.swa_utils.SWALR(ko, [0.05])


# ---- determinism -------------------------------------------------------------------------------------


def test_use_deterministic_algorithms():
    before = kiln.are_deterministic_algorithms_enabled()
    try:
        kiln.use_deterministic_algorithms(True)
        assert kiln.are_deterministic_algorithms_enabled() is True
        assert kiln.is_deterministic_algorithms_warn_only_enabled() is False
        kiln.use_deterministic_algorithms(True, warn_only=True)
        assert kiln.is_deterministic_algorithms_warn_only_enabled() is True
        kiln.use_deterministic_algorithms(False)
        assert kiln.are_deterministic_algorithms_enabled() is False
        assert kiln.is_deterministic_algorithms_warn_only_enabled() is False
        with pytest.raises(TypeError, match="mode must be a bool"):
            kiln.use_deterministic_algorithms(1)
        with pytest.raises(TypeError):
            kiln.use_deterministic_algorithms(True, True)  # warn_only is keyword-only, as torch's
        # every op has a deterministic path: nothing is refused in the mode (index_add, scatter_add and
        # embedding's backward included)
        kiln.use_deterministic_algorithms(True)
        w = kiln.tensor(np.ones((4, 3), np.float32), requires_grad=True)
        kiln.nn.functional.embedding(kiln.tensor([0, 1, 1, 3]), w).sum().backward()
        assert w.grad.numpy().sum(1).tolist() == [3, 6, 0, 3]
        assert kiln.zeros(4).index_add(0, kiln.tensor([0, 0, 2]), kiln.ones(3)).tolist() == [2, 0, 1, 0]
    finally:
        kiln.use_deterministic_algorithms(before)
