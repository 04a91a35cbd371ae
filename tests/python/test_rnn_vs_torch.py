# kiln.nn's recurrent layers (RNN, LSTM, GRU, their cells) and kiln.nn.utils.rnn against torch with the
# same weights (torch's state dict loaded as it is) and inputs: outputs, final states and the gradients
# of the inputs, the initial states and every parameter; packed sequences; a few Adam steps; refusals.
import warnings

import numpy as np
import pytest

import kiln
from kiln import nn
from kiln.nn.utils.rnn import (PackedSequence, pack_padded_sequence, pack_sequence, pad_packed_sequence,
                               pad_sequence, unpack_sequence, unpad_sequence)

torch = pytest.importorskip("torch")
tnn = torch.nn
trnn = torch.nn.utils.rnn

def k(t, requires_grad=False):
    """A kiln tensor (a leaf) with torch tensor t's values and dtype."""
    out = kiln.tensor(t.detach().numpy())
    return out.requires_grad_() if requires_grad else out


def close(kt, tt, tol):
    np.testing.assert_allclose(np.asarray(kt.detach()), tt.detach().numpy(), rtol=tol, atol=tol)


def rnd(*shape, seed=0, dtype=torch.float32):
    return torch.from_numpy(np.random.default_rng(seed).standard_normal(shape)).to(dtype)


def pair(mode, *args, dtype=torch.float32, **kwargs):
    """A torch module and the kiln module of the same class and arguments, with torch's weights."""
    torch.manual_seed(0)
    tm = getattr(tnn, mode)(*args, **kwargs).to(dtype)
    km = getattr(nn, mode)(*args, **kwargs)
    if dtype == torch.float64:
        km = km.double()
    result = km.load_state_dict(tm.state_dict())  # torch tensors, strict: torch's names and shapes
    assert not result.missing_keys and not result.unexpected_keys
    return km, tm


def check_grads(km, tm, pairs, tol):
    """Gradients of the named (kiln, torch) leaves and of every parameter."""
    for name, (kt, tt) in pairs.items():
        assert kt.grad is not None, name
        close(kt.grad, tt.grad, tol)
    tparams = dict(tm.named_parameters())
    for name, p in km.named_parameters():
        assert p.grad is not None, name
        close(p.grad, tparams[name].grad, tol)


def states(mode, h):
    return list(h) if mode == "LSTM" else [h]


H, IN, T, N = 5, 4, 6, 3
LENGTHS = {"sorted": [6, 4, 2], "unsorted": [3, 6, 1]}


# ---- the modules against torch: every mode x batch_first x bidirectional x layers x hx x packing ----
@pytest.mark.parametrize("mode", ["RNN", "RNN_relu", "LSTM", "GRU"])
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("num_layers", [1, 2])
@pytest.mark.parametrize("with_hx", [False, True])
@pytest.mark.parametrize("packing", ["padded", "sorted", "unsorted"])
def test_module_matches_torch(mode, batch_first, bidirectional, num_layers, with_hx, packing):
    extra = {"nonlinearity": "relu"} if mode == "RNN_relu" else {}
    mode = mode.split("_")[0]
    km, tm = pair(mode, IN, H, num_layers, batch_first=batch_first, bidirectional=bidirectional, **extra)
    x = rnd(*((N, T, IN) if batch_first else (T, N, IN)), seed=1).requires_grad_()
    kx = k(x, True)
    count = num_layers * (2 if bidirectional else 1)
    hx = [rnd(count, N, H, seed=2 + i).requires_grad_() for i in range(2 if mode == "LSTM" else 1)]
    khx = [k(h, True) for h in hx]
    targs = (tuple(hx) if mode == "LSTM" else hx[0]) if with_hx else None
    kargs = (tuple(khx) if mode == "LSTM" else khx[0]) if with_hx else None
    if packing == "padded":
        tin, kin = x, kx
    else:
        lengths = LENGTHS[packing]
        tin = trnn.pack_padded_sequence(x, lengths, batch_first=batch_first, enforce_sorted=packing == "sorted")
        kin = pack_padded_sequence(kx, lengths, batch_first=batch_first, enforce_sorted=packing == "sorted")
        assert isinstance(kin, PackedSequence)
        assert kin.batch_sizes.tolist() == tin.batch_sizes.tolist()
        for a, b in ((kin.sorted_indices, tin.sorted_indices), (kin.unsorted_indices, tin.unsorted_indices)):
            assert (a is None) == (b is None) and (a is None or a.tolist() == b.tolist())
    tout, th = tm(tin, targs)
    kout, kh = km(kin, kargs)
    if packing != "padded":
        assert isinstance(kout, PackedSequence)
        assert kout.batch_sizes.tolist() == tout.batch_sizes.tolist()
        tout, kout = tout.data, kout.data
    assert kout.shape == tuple(tout.shape)
    close(kout, tout, 1e-5)
    th, kh = states(mode, th), states(mode, kh)
    for a, b in zip(kh, th):
        assert a.shape == tuple(b.shape)
        close(a, b, 1e-5)
    # one loss over the output and the final states, with fixed weights
    weights = [rnd(*tout.shape, seed=7)] + [rnd(*t.shape, seed=8 + i) for i, t in enumerate(th)]
    (sum((a * w).sum() for a, w in zip([tout] + th, weights))).backward()
    (sum((a * k(w)).sum() for a, w in zip([kout] + kh, weights))).backward()
    leaves = {"input": (kx, x)}
    if with_hx:
        leaves.update({f"hx[{i}]": (a, b) for i, (a, b) in enumerate(zip(khx, hx))})
    check_grads(km, tm, leaves, 1e-4)


@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("num_layers", [1, 2])
@pytest.mark.parametrize("packing", ["padded", "unsorted"])
def test_lstm_proj_size(bidirectional, num_layers, packing):
    km, tm = pair("LSTM", IN, H, num_layers, bidirectional=bidirectional, proj_size=3)
    assert [(n, tuple(p.shape)) for n, p in km.named_parameters()] == \
        [(n, tuple(p.shape)) for n, p in tm.named_parameters()]
    assert repr(km) == repr(tm)
    x = rnd(T, N, IN, seed=3).requires_grad_()
    kx = k(x, True)
    count = num_layers * (2 if bidirectional else 1)
    h0, c0 = rnd(count, N, 3, seed=4).requires_grad_(), rnd(count, N, H, seed=5).requires_grad_()
    kh0, kc0 = k(h0, True), k(c0, True)
    tin, kin = x, kx
    if packing != "padded":
        tin = trnn.pack_padded_sequence(x, LENGTHS[packing], enforce_sorted=False)
        kin = pack_padded_sequence(kx, LENGTHS[packing], enforce_sorted=False)
    tout, (th, tc) = tm(tin, (h0, c0))
    kout, (kh, kc) = km(kin, (kh0, kc0))
    if packing != "padded":
        tout, kout = tout.data, kout.data
    for a, b in ((kout, tout), (kh, th), (kc, tc)):
        assert a.shape == tuple(b.shape)
        close(a, b, 1e-5)
    (tout.sum() + (th * th).sum() + tc.sum()).backward()
    (kout.sum() + (kh * kh).sum() + kc.sum()).backward()
    check_grads(km, tm, {"input": (kx, x), "h0": (kh0, h0), "c0": (kc0, c0)}, 1e-4)


@pytest.mark.parametrize("mode", ["RNN", "LSTM", "GRU"])
@pytest.mark.parametrize("with_hx", [False, True])
def test_unbatched_input(mode, with_hx):
    km, tm = pair(mode, IN, H, 2, bidirectional=True)
    x = rnd(T, IN, seed=6).requires_grad_()
    kx = k(x, True)
    hx = [rnd(4, H, seed=9 + i) for i in range(2 if mode == "LSTM" else 1)]
    targs = (tuple(hx) if mode == "LSTM" else hx[0]) if with_hx else None
    kargs = (tuple(k(h) for h in hx) if mode == "LSTM" else k(hx[0])) if with_hx else None
    tout, th = tm(x, targs)
    kout, kh = km(kx, kargs)
    assert kout.shape == (T, 2 * H)
    close(kout, tout, 1e-5)
    for a, b in zip(states(mode, kh), states(mode, th)):
        assert a.shape == tuple(b.shape) == (4, H)
        close(a, b, 1e-5)
    tout.sum().backward()
    kout.sum().backward()
    check_grads(km, tm, {"input": (kx, x)}, 1e-4)


@pytest.mark.parametrize("mode", ["RNN", "LSTM", "GRU"])
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("packing", ["padded", "unsorted"])
def test_float64(mode, bidirectional, packing):
    km, tm = pair(mode, IN, H, 2, bidirectional=bidirectional, batch_first=True, dtype=torch.float64)
    assert km.weight_ih_l0.dtype == kiln.float64
    x = rnd(N, T, IN, seed=11, dtype=torch.float64).requires_grad_()
    kx = k(x, True)
    tin, kin = x, kx
    if packing != "padded":
        tin = trnn.pack_padded_sequence(x, LENGTHS[packing], batch_first=True, enforce_sorted=False)
        kin = pack_padded_sequence(kx, LENGTHS[packing], batch_first=True, enforce_sorted=False)
    tout, th = tm(tin)
    kout, kh = km(kin)
    if packing != "padded":
        tout, _ = trnn.pad_packed_sequence(tout, batch_first=True)
        kout, _ = pad_packed_sequence(kout, batch_first=True)
    assert kout.dtype == kiln.float64
    close(kout, tout, 1e-12)
    for a, b in zip(states(mode, kh), states(mode, th)):
        close(a, b, 1e-12)
    (tout * tout).sum().backward()
    (kout * kout).sum().backward()
    check_grads(km, tm, {"input": (kx, x)}, 1e-11)


# ---- cells ----
@pytest.mark.parametrize("mode", ["RNNCell", "RNNCell_relu", "LSTMCell", "GRUCell"])
@pytest.mark.parametrize("batched", [True, False])
@pytest.mark.parametrize("with_hx", [False, True])
@pytest.mark.parametrize("bias", [True, False])
def test_cell_matches_torch(mode, batched, with_hx, bias):
    extra = {"nonlinearity": "relu"} if mode.endswith("relu") else {}
    mode = mode.split("_")[0]
    km, tm = pair(mode, IN, H, bias=bias, **extra)
    assert repr(km) == repr(tm)
    lead = (N,) if batched else ()
    x = rnd(*lead, IN, seed=12).requires_grad_()
    kx = k(x, True)
    hx = [rnd(*lead, H, seed=13 + i).requires_grad_() for i in range(2 if mode == "LSTMCell" else 1)]
    khx = [k(h, True) for h in hx]
    targs = (tuple(hx) if mode == "LSTMCell" else hx[0]) if with_hx else None
    kargs = (tuple(khx) if mode == "LSTMCell" else khx[0]) if with_hx else None
    tout, kout = tm(x, targs), km(kx, kargs)
    tout, kout = (list(tout), list(kout)) if mode == "LSTMCell" else ([tout], [kout])
    for a, b in zip(kout, tout):
        assert a.shape == tuple(b.shape)
        close(a, b, 1e-5)
    sum((a * a).sum() for a in tout).backward()
    sum((a * a).sum() for a in kout).backward()
    leaves = {"input": (kx, x)}
    if with_hx:
        leaves.update({f"hx[{i}]": (a, b) for i, (a, b) in enumerate(zip(khx, hx))})
    check_grads(km, tm, leaves, 1e-4)


def test_cell_loop_over_time_matches_torch():
    km, tm = pair("LSTMCell", IN, H)
    x = rnd(T, N, IN, seed=14)
    th, kh = None, None
    for t in range(T):
        th = tm(x[t], th)
        kh = km(k(x[t]), kh)
    close(kh[0], th[0], 1e-5)
    close(kh[1], th[1], 1e-5)


# ---- names, init, repr, dropout ----
@pytest.mark.parametrize("mode,kwargs", [("RNN", {}), ("RNN", {"nonlinearity": "relu", "bias": False}),
                                         ("LSTM", {"num_layers": 2, "bidirectional": True, "proj_size": 2}),
                                         ("GRU", {"num_layers": 3, "batch_first": True, "dropout": 0.25})])
def test_parameter_names_init_and_repr(mode, kwargs):
    tm, km = getattr(tnn, mode)(IN, H, **kwargs), getattr(nn, mode)(IN, H, **kwargs)
    assert [(n, tuple(p.shape)) for n, p in km.named_parameters()] == \
        [(n, tuple(p.shape)) for n, p in tm.named_parameters()]
    assert list(km.state_dict()) == list(tm.state_dict())
    assert km._flat_weights_names == tm._flat_weights_names
    assert [[tuple(p.shape) for p in ws] for ws in km.all_weights] == \
        [[tuple(p.shape) for p in ws] for ws in tm.all_weights]
    assert repr(km) == repr(tm)
    bound = 1 / np.sqrt(H)
    values = np.concatenate([np.asarray(p.detach()).ravel() for p in km.parameters()])
    assert np.abs(values).max() <= bound and np.abs(values).max() > bound * 0.8  # torch's uniform(-b, b)
    km.flatten_parameters()  # torch's cuDNN call: accepted, nothing to do


def test_dropout_between_layers():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        nn.LSTM(IN, H, dropout=0.5)
    assert any("non-zero dropout expects num_layers greater than 1" in str(w.message) for w in caught)
    km, tm = pair("GRU", IN, H, 2, dropout=0.5)
    x = rnd(T, N, IN, seed=15)
    km.eval(), tm.eval()
    close(km(k(x))[0], tm(x)[0], 1e-5)  # no dropout outside training
    km.train()
    kiln.manual_seed(0)
    out = km(k(x))[0]
    assert np.abs(np.asarray(out.detach()) - tm(x)[0].detach().numpy()).max() > 1e-3
    km1, tm1 = pair("GRU", IN, H, 2, dropout=1.0)  # everything dropped: layer 2 sees zeros
    km1.train()
    top = tnn.GRU(H, H)
    top.load_state_dict({n[:-1] + "0": v for n, v in tm1.state_dict().items() if n.endswith("l1")})
    expected = top(torch.zeros(T, N, H))[0]
    close(km1(k(x))[0], expected, 1e-5)


# ---- a few Adam steps against torch's ----
class _Model:
    def __init__(self, lib):
        self.rnn = lib.nn.LSTM(IN, H, 2, batch_first=True, bidirectional=True)
        self.head = lib.nn.Linear(2 * H, 2)

    def parameters(self):
        return list(self.rnn.parameters()) + list(self.head.parameters())


def test_training_loop_matches_torch():
    tmodel, kmodel = _Model(torch), _Model(kiln)
    kmodel.rnn.load_state_dict(tmodel.rnn.state_dict())
    kmodel.head.load_state_dict(tmodel.head.state_dict())
    topt = torch.optim.Adam(tmodel.parameters(), lr=1e-2)
    kopt = kiln.optim.Adam(kmodel.parameters(), lr=1e-2)
    x = rnd(N, T, IN, seed=16)
    y = rnd(N, 2, seed=17)
    lengths = [4, 6, 2]
    losses = []
    for model, opt, lib, xx, yy in ((tmodel, topt, torch, x, y), (kmodel, kopt, kiln, k(x), k(y))):
        run = []
        for _ in range(5):
            opt.zero_grad()
            packed = lib.nn.utils.rnn.pack_padded_sequence(xx, lengths, batch_first=True, enforce_sorted=False)
            _, (h, _) = model.rnn(packed)
            pred = model.head(lib.cat([h[-2], h[-1]], 1))
            loss = ((pred - yy) ** 2).mean()
            loss.backward()
            opt.step()
            run.append(float(loss.item()))
        losses.append(run)
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-5, atol=1e-6)
    assert losses[0][-1] < losses[0][0]


# ---- kiln.nn.utils.rnn ----
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_pad_sequence(batch_first, padding_side):
    seqs = [rnd(n, 2, seed=n).requires_grad_() for n in (3, 5, 1)]
    ks = [k(s, True) for s in seqs]
    t = trnn.pad_sequence(seqs, batch_first=batch_first, padding_value=-1.5, padding_side=padding_side)
    kt = pad_sequence(ks, batch_first=batch_first, padding_value=-1.5, padding_side=padding_side)
    assert kt.shape == tuple(t.shape)
    close(kt, t, 0)
    w = rnd(*t.shape, seed=20)
    (t * w).sum().backward()
    (kt * k(w)).sum().backward()
    for s, ks_ in zip(seqs, ks):
        close(ks_.grad, s.grad, 0)


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("enforce_sorted", [True, False])
def test_pack_and_pad_round_trip(batch_first, enforce_sorted):
    lengths = [5, 3, 3, 1] if enforce_sorted else [3, 5, 1, 3]
    x = rnd(*((4, 5, 2) if batch_first else (5, 4, 2)), seed=21).requires_grad_()
    kx = k(x, True)
    tp = trnn.pack_padded_sequence(x, lengths, batch_first=batch_first, enforce_sorted=enforce_sorted)
    kp = pack_padded_sequence(kx, kiln.tensor(lengths), batch_first=batch_first, enforce_sorted=enforce_sorted)
    close(kp.data, tp.data, 0)
    assert kp.batch_sizes.tolist() == tp.batch_sizes.tolist() and kp.batch_sizes.dtype == kiln.int64
    tpad, tlen = trnn.pad_packed_sequence(tp, batch_first=batch_first, padding_value=9.0, total_length=7)
    kpad, klen = pad_packed_sequence(kp, batch_first=batch_first, padding_value=9.0, total_length=7)
    assert kpad.shape == tuple(tpad.shape)
    close(kpad, tpad, 0)
    assert klen.tolist() == tlen.tolist() and klen.dtype == kiln.int64
    w = rnd(*tpad.shape, seed=22)
    (tpad * w).sum().backward()
    (kpad * k(w)).sum().backward()
    close(kx.grad, x.grad, 0)
    # pack_sequence, unpack_sequence, unpad_sequence
    seqs = [rnd(n, 2, seed=n) for n in lengths]
    tps = trnn.pack_sequence(seqs, enforce_sorted=enforce_sorted)
    kps = pack_sequence([k(s) for s in seqs], enforce_sorted=enforce_sorted)
    close(kps.data, tps.data, 0)
    assert kps.batch_sizes.tolist() == tps.batch_sizes.tolist()
    for a, b in zip(unpack_sequence(kps), trnn.unpack_sequence(tps)):
        close(a, b, 0)
    padded = trnn.pad_sequence(seqs, batch_first=batch_first)
    for a, b in zip(unpad_sequence(k(padded), lengths, batch_first=batch_first),
                    trnn.unpad_sequence(padded, torch.tensor(lengths), batch_first=batch_first)):
        close(a, b, 0)


def test_packed_sequence_object():
    p = PackedSequence(kiln.randn(3, 2), kiln.tensor([2, 1]), kiln.tensor([1, 0]))
    assert p.unsorted_indices.tolist() == [1, 0]
    data, batch_sizes, sorted_indices, unsorted_indices = p  # a named tuple, as torch's
    assert p.double().data.dtype == kiln.float64 and p.double().batch_sizes.tolist() == [2, 1]
    assert not p.is_cuda
    import kiln.nn.utils.rnn as rnn_module
    assert kiln.nn.utils.rnn is rnn_module and nn.utils.rnn.PackedSequence is PackedSequence


# ---- refusals, as torch's ----
def refused(kfn, tfn, match, kind=ValueError):
    """kiln's call raises kind matching `match`; torch's raises too."""
    with pytest.raises(kind, match=match):
        kfn()
    with pytest.raises(Exception):
        tfn()


@pytest.mark.parametrize("mode", ["RNN", "LSTM", "GRU"])
def test_module_refusals(mode):
    km, tm = pair(mode, IN, H, 2)
    lstm = mode == "LSTM"

    def both(x, hx=None, khx=None):
        return (lambda: km(x if isinstance(x, kiln.Tensor) else k(x), khx)), (lambda: tm(x, hx))

    refused(*both(rnd(T, N, 3)), r"input\.size\(-1\) must be equal to input_size\. Expected 4, got 3")
    refused(*both(rnd(T, N, IN, dtype=torch.float64)), r"input dtype \(kiln.float64\) does not match weight dtype")
    refused(*both(rnd(1, T, N, IN)), rf"{mode}: Expected input to be 2D or 3D, got 4D instead")
    refused(*both(rnd(0, N, IN)), "Expected sequence length to be larger than 0")
    good = [rnd(2, N, H, seed=30), rnd(2, N, H, seed=31)]
    wrong = rnd(1, N, H)
    if lstm:
        refused(*both(rnd(T, N, IN), (wrong, good[1]), (k(wrong), k(good[1]))),
                r"Expected hidden\[0\] size \(2, 3, 5\), got \[1, 3, 5\]")
        refused(*both(rnd(T, N, IN), (good[0], rnd(2, 2, H)), (k(good[0]), k(rnd(2, 2, H)))),
                r"Expected hidden\[1\] size \(2, 3, 5\), got \[2, 2, 5\]")
        refused(*both(rnd(T, IN), tuple(good), tuple(k(g) for g in good)),
                "For unbatched 2-D input, hx and cx should also be 2-D")
        with pytest.raises(TypeError, match=r"hx must be a tuple \(h_0, c_0\)"):
            km(k(rnd(T, N, IN)), k(good[0]))
        refused(*both(rnd(T, N, IN), (good[0].double(), good[1]), (k(good[0].double()), k(good[1]))),
                r"hx\[0\] \(h_0\) dtype \(kiln.float64\) does not match")
    else:
        refused(*both(rnd(T, N, IN), wrong, k(wrong)), r"Expected hidden size \(2, 3, 5\), got \[1, 3, 5\]")
        refused(*both(rnd(T, IN), good[0], k(good[0])), "For unbatched 2-D input, hx should also be 2-D")
        refused(*both(rnd(T, N, IN), good[0][0], k(good[0][0])), "For batched 3-D input, hx should also be 3-D")
        refused(*both(rnd(T, N, IN), good[0].double(), k(good[0].double())), r"hx dtype \(kiln.float64\) does not")
        with pytest.raises(TypeError, match="hx must be a kiln.Tensor"):
            km(k(rnd(T, N, IN)), (k(good[0]),))
    with pytest.raises(TypeError, match="input must be a kiln.Tensor or a PackedSequence"):
        km([[1.0] * IN])


def test_constructor_refusals():
    cases = [(lambda m: m.RNN(IN, H, nonlinearity="gelu"), ValueError, r"Unknown nonlinearity 'gelu'"),
             (lambda m: m.GRU(IN, H, proj_size=2), ValueError, "proj_size argument is only supported for LSTM"),
             (lambda m: m.LSTM(IN, H, proj_size=H), ValueError, "proj_size has to be smaller than hidden_size"),
             (lambda m: m.LSTM(IN, H, proj_size=-1), ValueError, "proj_size should be a positive integer or zero"),
             (lambda m: m.LSTM(IN, 0), ValueError, "hidden_size must be greater than zero"),
             (lambda m: m.LSTM(IN, H, num_layers=0), ValueError, "num_layers must be greater than zero"),
             (lambda m: m.GRU(IN, H, dropout=1.5), ValueError, r"dropout should be a number in range \[0, 1\]"),
             (lambda m: m.GRU(IN, H, dropout=True), ValueError, r"dropout should be a number in range \[0, 1\]"),
             (lambda m: m.LSTM(4.0, H), TypeError, "input_size should be of type int, got: float")]
    for make, kind, match in cases:
        with pytest.raises(kind, match=match):
            make(nn)
        with pytest.raises(kind, match=match):
            make(tnn)
    with pytest.raises(ValueError, match=r"RNNCell: Unknown nonlinearity 'x'"):
        nn.RNNCell(IN, H, nonlinearity="x")  # torch refuses it at the first call


@pytest.mark.parametrize("mode", ["RNNCell", "LSTMCell", "GRUCell"])
def test_cell_refusals(mode):
    km, tm = pair(mode, IN, H)
    lstm = mode == "LSTMCell"

    def hx(*shape, dtype=torch.float32):
        return (rnd(*shape, dtype=dtype), rnd(*shape)) if lstm else rnd(*shape, dtype=dtype)

    def kh(h):
        return tuple(k(a) for a in h) if lstm else k(h)

    refused(lambda: km(k(rnd(N, 3))), lambda: tm(rnd(N, 3)), "input has inconsistent input_size: got 3 expected 4")
    refused(lambda: km(k(rnd(2, N, IN))), lambda: tm(rnd(2, N, IN)),
            f"{mode}: Expected input to be 1D or 2D, got 3D instead")
    refused(lambda: km(k(rnd(N, IN)), kh(hx(2, H))), lambda: tm(rnd(N, IN), hx(2, H)),
            "Input batch size 3 doesn't match hidden0 batch size 2")
    refused(lambda: km(k(rnd(N, IN)), kh(hx(N, 6))), lambda: tm(rnd(N, IN), hx(N, 6)),
            "hidden0 has inconsistent hidden_size: got 6, expected 5")
    refused(lambda: km(k(rnd(N, IN, dtype=torch.float64))), lambda: tm(rnd(N, IN, dtype=torch.float64)),
            r"input dtype \(kiln.float64\) does not match weight dtype \(kiln.float32\)")
    refused(lambda: km(k(rnd(IN)), kh(hx(N, H))), lambda: tm(rnd(IN), hx(N, H)),
            "is 2-D but the input is 1-D; for unbatched 1-D input it must be 1-D too")
    refused(lambda: km(k(rnd(N, IN)), kh(hx(N, H, dtype=torch.float64))),
            lambda: tm(rnd(N, IN), hx(N, H, dtype=torch.float64)), r"dtype \(kiln.float64\) does not match weight")


def test_sequence_utility_refusals():
    x = rnd(4, 3, 2)
    for lengths, match in (([2, 3, 1], "`lengths` array must be sorted in decreasing order when `enforce_sorted`"),
                           ([3, 2], r"Expected `len\(lengths\)` to be equal to batch_size, but got 2 \(batch_size=3\)"),
                           ([3, 0, 0], "Length of all samples has to be greater than 0")):
        refused(lambda: pack_padded_sequence(k(x), lengths), lambda: trnn.pack_padded_sequence(x, lengths), match)
    with pytest.raises(ValueError, match="lengths has 5, longer than the input's 4 time steps"):
        pack_padded_sequence(k(x), [5, 2, 1])  # torch reads past the input here
    p, tp = pack_padded_sequence(k(x), [3, 3, 1]), trnn.pack_padded_sequence(x, [3, 3, 1])
    refused(lambda: pad_packed_sequence(p, total_length=2), lambda: trnn.pad_packed_sequence(tp, total_length=2),
            "Expected total_length to be at least the length of the longest sequence in input, but got "
            "total_length=2 and max sequence length being 3")
    seqs = [rnd(2, 3), rnd(3, 3)]
    refused(lambda: pad_sequence([k(s) for s in seqs], padding_side="mid"),
            lambda: trnn.pad_sequence(seqs, padding_side="mid"),
            "Expected padding_side to be one of left or right, but got mid")
    refused(lambda: pad_sequence([]), lambda: trnn.pad_sequence([]), "received an empty list of sequences")
    refused(lambda: pad_sequence([k(rnd(2, 3)), k(rnd(3, 4))]), lambda: trnn.pad_sequence([rnd(2, 3), rnd(3, 4)]),
            r"sequences\[1\] has shape \[3, 4\], but sequences\[0\] has \[2, 3\]")
    refused(lambda: pack_sequence([k(s) for s in seqs]), lambda: trnn.pack_sequence(seqs),
            "must be sorted in decreasing order")
    with pytest.raises(TypeError, match="pad_packed_sequence: sequence must be a PackedSequence"):
        pad_packed_sequence(k(x))


# ---- the steps of a layer are one autograd node; review fixes ----
@pytest.mark.parametrize("mode", ["LSTM", "GRU"])
@pytest.mark.parametrize("packing", ["padded", "unsorted"])
def test_steps_are_cut_by_one_node_whose_backward_stacks_them(monkeypatch, mode, packing):
    # Slicing the input projection per step made a node per step whose backward built a gradient of the
    # whole projection (backward O(T^2)); now one node per layer and direction cuts the steps, and its
    # backward runs once and stacks the steps' gradients. The gradients stay torch's.
    from kiln.nn import rnn as rnn_module
    calls = []
    backward = rnn_module._Unbind.backward

    def counted(ctx, *grads):
        calls.append(len(grads))
        return backward(ctx, *grads)

    monkeypatch.setattr(rnn_module._Unbind, "backward", staticmethod(counted))
    steps = 40
    km, tm = pair(mode, IN, H, 2, bidirectional=True)
    x = rnd(steps, N, IN, seed=5)
    kx, tx = k(x, True), x.clone().requires_grad_()
    if packing == "padded":
        ko, to = km(kx)[0], tm(tx)[0]
    else:
        lengths = [steps // 2, steps, 3]
        ko = pad_packed_sequence(km(pack_padded_sequence(kx, lengths, enforce_sorted=False))[0])[0]
        to = trnn.pad_packed_sequence(tm(trnn.pack_padded_sequence(tx, lengths, enforce_sorted=False))[0])[0]
    close(ko, to, 1e-5)
    g = rnd(*to.shape, seed=6)
    ko.backward(k(g))
    to.backward(g)
    check_grads(km, tm, {"input": (kx, tx)}, 1e-4)
    assert calls == [steps] * 4  # 2 layers x 2 directions, each one node over all the steps


def test_unbind_steps_gives_zeros_to_steps_without_gradient():
    from kiln.nn.rnn import _unbind_steps
    x = kiln.randn(6, 2).requires_grad_()
    parts = _unbind_steps(x, [3, 2, 1])
    assert [tuple(p.shape) for p in parts] == [(3, 2), (2, 2), (1, 2)]
    (parts[1] * 2).sum().backward()  # steps 0 and 2 get no gradient
    assert np.asarray(x.grad).tolist() == [[0, 0]] * 3 + [[2, 2]] * 2 + [[0, 0]]


def test_unbind_steps_gives_views_when_no_gradient_is_needed(monkeypatch):
    # under no_grad, or for an input that needs no gradient, the steps are views of x (no copies, no
    # autograd node); an LSTM's forward under no_grad still gives torch's output
    from kiln.nn import rnn as rnn_module
    for grad in (False, True):
        x = kiln.randn(6, 2).requires_grad_(grad)
        with kiln.no_grad():
            parts = rnn_module._unbind_steps(x, [3, 2, 1])
            x.fill_(7.0)  # a view sees the write
        assert [np.asarray(p).tolist() for p in parts] == [[[7, 7]] * 3, [[7, 7]] * 2, [[7, 7]]]
    calls = []
    apply = rnn_module._Unbind.apply
    monkeypatch.setattr(rnn_module._Unbind, "apply", lambda *a: calls.append(1) or apply(*a))
    km, tm = pair("LSTM", IN, H, 2)
    x = rnd(5, N, IN, seed=4)
    with kiln.no_grad():
        ko = km(k(x))[0]
    close(ko, tm(x)[0], 1e-5)
    assert calls == []
    km(k(x, True))[0].sum().backward()  # with a gradient: the one node per layer
    assert len(calls) == 2


def test_packed_sequence_cuda_names_the_device():
    p = PackedSequence(kiln.randn(3, 2), kiln.tensor([2, 1]))
    if kiln.cuda_is_available():
        assert p.cuda().is_cuda and p.cuda(0).data.device == p.cuda("cuda:0").data.device
        assert p.cuda().batch_sizes.tolist() == [2, 1]  # batch_sizes stays on the CPU
    else:
        with pytest.raises(Exception, match="(?i)cuda") as e:
            p.cuda()
        assert not isinstance(e.value, TypeError)  # a Device("cuda", 0) call was a TypeError
        with pytest.raises(Exception, match="(?i)cuda") as e:
            p.cuda(0)
        assert not isinstance(e.value, TypeError)


def test_sequence_utility_review_refusals():
    x = rnd(4, 3, 2)
    refused(lambda: pack_padded_sequence(k(rnd(0, 0, 2)), []), lambda: trnn.pack_padded_sequence(rnd(0, 0, 2), []),
            "Cannot pack empty tensors")
    with pytest.raises(ValueError, match=r"pack_padded_sequence: lengths\[1\] is nan"):
        pack_padded_sequence(k(x), [3.0, float("nan"), 1.0])
    p, tp = pack_padded_sequence(k(x), [3, 3, 1]), trnn.pack_padded_sequence(x, [3, 3, 1])
    refused(lambda: pad_packed_sequence(p, total_length=7.0), lambda: trnn.pad_packed_sequence(tp, total_length=7.0),
            "pad_packed_sequence: total_length must be an int", TypeError)
    padded, lengths = pad_packed_sequence(p, total_length=np.int64(5))
    assert tuple(padded.shape) == (5, 3, 2) and lengths.tolist() == [3, 3, 1]
    # a 0-d integer tensor, as torch accepts; a bool (tensor), a float tensor and a 1-d tensor are refused
    padded, lengths = pad_packed_sequence(p, total_length=kiln.tensor(5))
    tpadded, _ = trnn.pad_packed_sequence(tp, total_length=torch.tensor(5))
    close(padded, tpadded, 0)
    for bad in (True, kiln.tensor(True), kiln.tensor(5.0), kiln.tensor([5])):
        with pytest.raises(TypeError, match="pad_packed_sequence: total_length must be an int or a 0-d integer"):
            pad_packed_sequence(p, total_length=bad)
    # mixed dtypes: as torch, the result has sequences[0]'s dtype
    seqs = [rnd(2, 3), rnd(3, 3, dtype=torch.float64)]
    kp, tp = pad_sequence([k(s) for s in seqs]), trnn.pad_sequence(seqs)
    assert kp.dtype == kiln.float32 and tp.dtype == torch.float32
    close(kp, tp, 1e-6)


def test_lstm_cell_refuses_a_missing_state():
    km, tm = pair("LSTMCell", IN, H)
    x, h = rnd(N, IN), rnd(N, H)
    for state, kstate, at in (((h, None), (k(h), None), 1), ((None, h), (None, k(h)), 0)):
        refused(lambda: km(k(x), kstate), lambda: tm(x, state), rf"LSTMCell: .*got hx\[{at}\] None", TypeError)


@pytest.mark.parametrize("mode", ["RNN", "GRU"])
def test_positional_arguments_in_torch_order(mode):
    # torch's RNNBase order: ..., bidirectional, proj_size, device, dtype (RNN: nonlinearity fourth)
    args = (IN, H, 1) + (("tanh",) if mode == "RNN" else ()) + (True, False, 0.0, True)
    km, tm = getattr(nn, mode)(*args, 0, "cpu"), getattr(tnn, mode)(*args, 0, "cpu")
    assert km.bidirectional and tm.bidirectional and km.proj_size == 0
    refused(lambda: getattr(nn, mode)(*args, "cpu"), lambda: getattr(tnn, mode)(*args, "cpu"),
            "proj_size should be of type int, got: str", TypeError)


@pytest.mark.skipif(not kiln.cuda_is_available(), reason="needs CUDA")
@pytest.mark.parametrize("mode", ["RNN", "LSTM", "GRU", "GRUCell", "LSTMCell"])
def test_hidden_state_on_another_device_is_refused(mode):
    cell = mode.endswith("Cell")
    km = getattr(nn, mode)(IN, H)
    x = kiln.randn(N, IN) if cell else kiln.randn(T, N, IN)
    h = kiln.randn(N, H) if cell else kiln.randn(1, N, H)
    h = h.to("cuda")
    hx = (h, h) if mode.startswith("LSTM") else h
    with pytest.raises(RuntimeError, match="Input and hidden tensors are not at the same device, found input tensor "
                                           "at cpu and hidden tensor"):
        km(x, hx)
