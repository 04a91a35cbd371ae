# Modules, models, optimizers, mixed precision, files and data from Python.
import os

import numpy as np
import pytest

import kiln
from kiln import nn
from kiln.nn import functional as F


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
        self.norm = nn.BatchNorm1d(3)
        self.scale = nn.Parameter(kiln.ones(1))

    def forward(self, x):
        return self.norm(self.body(x)) * self.scale


def test_module_names_state_and_modes():
    m = MLP()
    names = [n for n, _ in m.named_parameters()]
    assert names == ["scale", "body.0.weight", "body.0.bias", "body.2.weight", "body.2.bias", "norm.weight", "norm.bias"]
    assert [n for n, _ in m.named_buffers()] == ["norm.running_mean", "norm.running_var", "norm.num_batches_tracked"]
    assert m.num_parameters() == 1 + 4 * 8 + 8 + 8 * 3 + 3 + 3 + 3
    sd = m.state_dict()
    m2 = MLP()
    m2.load_state_dict(sd)
    x = kiln.randn(5, 4)
    m.eval(), m2.eval()
    assert not m.training and not m.body[0].training
    assert m(x).tolist() == m2(x).tolist()
    with pytest.raises(kiln.KilnError, match="missing"):
        m2.load_state_dict({k: v for k, v in sd.items() if k != "scale"})
    with pytest.raises(kiln.KilnError, match="shape"):
        m2.load_state_dict(dict(sd, scale=kiln.ones(2)), strict=False)
    m.double()
    assert m.body[0].weight.dtype == kiln.float64 and m.norm.running_mean.dtype == kiln.float64
    assert isinstance(m.body[0].weight, nn.Parameter) and m.body[0].weight.requires_grad


def test_training_a_python_module_converges():
    kiln.manual_seed(0)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype(np.float32)
    y = (x[:, 0] + 2 * x[:, 1] > 0).astype(np.int64) + (x[:, 2] > 1).astype(np.int64)
    model = nn.Sequential(nn.Linear(4, 16), nn.GELU(), nn.Linear(16, 3))
    opt = kiln.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.0)
    xs, ys = kiln.tensor(x), kiln.tensor(y)
    first = None
    for _ in range(60):
        loss = F.cross_entropy(model(xs), ys)
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.35 * first
    assert opt.steps == 60


def test_sgd_matches_the_update_rule():
    w = nn.Parameter(kiln.tensor([1.0, -2.0]))
    opt = kiln.optim.SGD([w], lr=0.1, momentum=0.9, nesterov=True)
    for _ in range(2):
        opt.zero_grad()
        (w * w).sum().backward()
        opt.step()
    # by hand: buf = g (first step), then buf = 0.9 buf + g; nesterov: p -= lr (g + 0.9 buf)
    p, buf = np.array([1.0, -2.0]), None
    for _ in range(2):
        g = 2 * p
        buf = g if buf is None else 0.9 * buf + g
        p = p - 0.1 * (g + 0.9 * buf)
    np.testing.assert_allclose(w.detach().numpy(), p, rtol=1e-6)
    sched = kiln.optim.LrSchedule("cosine", base_lr=1.0, warmup_steps=2, total_steps=10)
    assert sched(0) == 0.5 and sched(1) == 1.0 and sched(2) == 1.0 and sched(10) == pytest.approx(0.0, abs=1e-12)


def test_zoo_models_from_python():
    assert "resnet20" in kiln.models.names() and "bert-tiny-mlm" in kiln.models.names()
    kiln.manual_seed(1)
    model = kiln.models.create("resnet20", set={"num_classes": 10, "in_channels": 1})
    x = kiln.randn(2, 1, 28, 28)
    y = kiln.tensor([3, 7])
    model.train()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    names = [n for n, _ in model.named_parameters()]
    assert len(names) > 20 and all(p.grad is not None for p in model.parameters())
    opt = kiln.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    before = model.state_dict()[names[0]].clone()
    opt.step()
    assert not kiln.allclose(model.state_dict()[names[0]], before)  # the C++ model's own tensor moved
    model.eval()
    assert model(x).shape == (2, 10)
    bert = kiln.models.create("bert-tiny-mlm", set={"vocab_size": 50})
    ids = kiln.randint(0, 50, (2, 6))
    assert bert(ids).shape == (2, 6, 50)
    assert set(bert.run(ids, attention_mask=kiln.ones(2, 6, dtype=kiln.int64))) >= {"output"}
    with pytest.raises(ValueError, match="resnet-nope"):
        kiln.models.create("resnet-nope")


def test_autocast_and_grad_scaler():
    a, b = kiln.randn(4, 8), kiln.randn(8, 3)
    with kiln.amp.autocast(kiln.bfloat16):
        assert kiln.amp.autocast_dtype() == kiln.bfloat16
        assert (a @ b).dtype == kiln.bfloat16
    assert kiln.amp.autocast_dtype() is None and (a @ b).dtype == kiln.float32
    w = nn.Parameter(kiln.ones(3))
    opt = kiln.optim.SGD([w], lr=0.5)
    scaler = kiln.amp.GradScaler(init_scale=1024.0)
    scaler.scale((w * 2).sum()).backward()
    assert w.grad.tolist() == [2048.0] * 3
    scaler.step(opt)
    scaler.update()
    assert w.tolist() == [0.0, 0.0, 0.0]  # unscaled before the step
    opt.zero_grad()
    scaler.scale((w * float("inf")).sum()).backward()
    scaler.step(opt)
    scaler.update()
    assert scaler.skipped_steps == 1 and scaler.get_scale() == 512.0 and w.tolist() == [0.0, 0.0, 0.0]


def test_files(tmp_path):
    m = MLP()
    kiln.save(m, tmp_path / "m.safetensors", metadata={"note": "test"})
    back = kiln.load(tmp_path / "m.safetensors")
    assert set(back) == set(m.state_dict())
    tensors, meta = kiln.load_safetensors(str(tmp_path / "m.safetensors"))
    assert meta["note"] == "test"
    kiln.save_checkpoint(str(tmp_path / "c.kiln"), {"w": kiln.arange(5)}, {"step": 3})
    t, state = kiln.load_checkpoint(str(tmp_path / "c.kiln"))
    assert t["w"].tolist() == [0, 1, 2, 3, 4] and state == {"step": 3}
    (tmp_path / "bad.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{\"a\":")
    with pytest.raises(kiln.KilnError, match="bad.safetensors"):
        kiln.load(tmp_path / "bad.safetensors")
    with pytest.raises(kiln.KilnError, match="nope.kiln"):
        kiln.load_checkpoint(str(tmp_path / "nope.kiln"))


def test_checkpoint_of_many_tensors_with_empty_ones_reads_back(tmp_path):
    # An empty tensor shares its offset with the next blob; with more than 16 entries the reader once
    # sorted them the wrong way round and called the file's tensors overlapping.
    for empty in (lambda i: i % 2 == 0, lambda i: i % 3 == 1, lambda i: i >= 10, lambda i: True):
        want = {"t%04d" % i: (kiln.zeros(0) if empty(i) else kiln.ones(3) * i) for i in range(17)}
        kiln.save_checkpoint(str(tmp_path / "k17.kiln"), want, {"n": 17})
        got, state = kiln.load_checkpoint(str(tmp_path / "k17.kiln"))
        assert state == {"n": 17} and list(got) == list(want)
        assert all(got[k].tolist() == v.tolist() for k, v in want.items())


@pytest.mark.skipif(not os.path.isdir(kiln.data.FASHION_MNIST_DIR), reason="dataset-fashion-mnist is not installed")
def test_data_loader():
    d = kiln.data.fashion_mnist()
    assert len(d["train"]) == 60000 and d["num_classes"] == 10 and d["shape"] == (1, 28, 28)
    loader = kiln.data.DataLoader(d["test"], batch_size=1000, shuffle=False, workers=2)
    n, first = 0, None
    for batch in loader:
        first = first or batch["target"][:5].tolist()
        assert batch["input"].shape[1:] == (1, 28, 28)
        n += batch["input"].shape[0]
    assert n == 10000 and len(loader) == 10
    again = next(iter(loader))["target"][:5].tolist()
    assert again == first  # unshuffled: the same order each epoch
    # One pass at a time: a second iter() supersedes the first, which then says so (zip(loader, loader)
    # split the samples between the two without a word).
    small = kiln.data.DataLoader(d["test"], batch_size=2500, shuffle=False, workers=0)
    with pytest.raises(RuntimeError, match="superseded by a newer iter"):
        list(zip(small, small))
    assert sum(b["input"].shape[0] for b in small) == 10000  # a fresh pass is whole
    for bad, msg in [(dict(seed=1.5), "seed must be an int"), (dict(batch_size=32.0), "batch_size must be an int")]:
        with pytest.raises(TypeError, match=msg):
            kiln.data.DataLoader(d["test"], **bad)
    with pytest.raises(TypeError, match="must be a kiln Dataset .* a map-style Python dataset .* or an iterable one"):
        kiln.data.DataLoader(42)
    assert len(kiln.data.DataLoader(d["test"], batch_size=5000, seed=-1)) == 2  # any int seed, as manual_seed


class _Squares:
    """A map-style Python dataset: dicts of an array, a number and a label string."""

    def __init__(self, n, bad=None):
        self.n, self.bad, self.reads = n, bad, []

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self.reads.append(i)
        if i == self.bad:
            raise KeyError(f"sample {i} is missing")
        return {"x": np.full(3, i, dtype=np.float32), "y": i * i, "w": 0.5 * i, "name": f"s{i}"}


def test_data_loader_python_dataset():
    ds = _Squares(10)
    for workers in (0, 1, 3):
        loader = kiln.data.DataLoader(ds, batch_size=4, shuffle=False, workers=workers)
        batches = list(loader)
        assert len(loader) == 3 and [b["y"].shape for b in batches] == [(4,), (4,), (2,)]
        b = batches[0]
        assert b["x"].dtype == kiln.float32 and b["x"].shape == (4, 3) and b["x"][:, 0].tolist() == [0, 1, 2, 3]
        assert b["y"].dtype == kiln.int64 and b["y"].tolist() == [0, 1, 4, 9]
        assert b["w"].dtype == kiln.float64 and b["name"] == ["s0", "s1", "s2", "s3"]
    # shuffled: every sample once per epoch, in an order fixed by (seed, epoch)
    orders = []
    for _ in range(2):
        loader = kiln.data.DataLoader(ds, batch_size=3, shuffle=True, seed=7, workers=2)
        orders.append([[int(v) for v in b["x"][:, 0].tolist()] for b in loader] +
                      [[int(v) for v in b["x"][:, 0].tolist()] for b in loader])
    assert orders[0] == orders[1]
    first, second = sum(orders[0][:4], []), sum(orders[0][4:], [])
    assert sorted(first) == list(range(10)) and sorted(second) == list(range(10)) and first != second
    assert len(kiln.data.DataLoader(ds, batch_size=4, drop_last=True)) == 2
    assert [b["y"].shape[0] for b in kiln.data.DataLoader(ds, batch_size=4, drop_last=True)] == [4, 4]
    # tuples, kiln tensors, a list as a dataset, a collate_fn
    pairs = [(kiln.full((2,), float(i)), i % 2 == 0) for i in range(5)]
    x, even = next(iter(kiln.data.DataLoader(pairs, batch_size=5, shuffle=False)))
    assert x.shape == (5, 2) and even.dtype == kiln.bool and even.tolist() == [True, False, True, False, True]
    sums = list(kiln.data.DataLoader(list(range(6)), batch_size=3, shuffle=False, collate_fn=sum))
    assert sums == [3, 12]
    mixed = next(iter(kiln.data.DataLoader([1, 2.5], batch_size=2, shuffle=False)))
    assert mixed.dtype == kiln.float64 and mixed.tolist() == [1.0, 2.5]  # an int then a float: not truncated
    # a failing sample is raised as itself, naming its index; samples that do not stack are named
    for workers in (0, 2):
        with pytest.raises(KeyError, match="sample 5 is missing") as e:
            list(kiln.data.DataLoader(_Squares(10, bad=5), batch_size=2, shuffle=False, workers=workers))
        if hasattr(e.value, "add_note"):
            assert "dataset[5]" in "".join(e.value.__notes__)
    uneven = [np.zeros(3, np.float32), np.zeros(4, np.float32)]
    with pytest.raises(ValueError, match="cannot be stacked"):
        next(iter(kiln.data.DataLoader(uneven, batch_size=2)))
    with pytest.raises(ValueError, match=r"keys \['a'\] and \['b'\]"):
        next(iter(kiln.data.DataLoader([{"a": 1}, {"b": 2}], batch_size=2, shuffle=False)))
    with pytest.raises(TypeError, match="cannot collate samples of type object"):
        next(iter(kiln.data.DataLoader([object()], batch_size=1)))
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        kiln.data.DataLoader(ds, batch_size=0)
    with pytest.raises(TypeError, match="collate_fn must be callable"):
        kiln.data.DataLoader(ds, collate_fn=3)
    # [True, 2] is int64 [1, 2], as torch (a bool first does not make the field bool)
    assert next(iter(kiln.data.DataLoader([True, 2], batch_size=2, shuffle=False))).tolist() == [1, 2]
    # by default a Python dataset is read in the calling thread (torch's workers=0)
    import threading
    seen = []

    class Where(_Squares):
        def __getitem__(self, i):
            seen.append(threading.get_ident())
            return super().__getitem__(i)

    list(kiln.data.DataLoader(Where(4), batch_size=2))
    assert set(seen) == {threading.get_ident()}
    # a pass left early stops its worker threads (they kept reading ahead until the next iter()): each
    # ends after the item it is in, not waited for, and none starts another
    before = set(threading.enumerate())  # (another test's threads may still be ending)
    squares = _Squares(100)
    for _ in kiln.data.DataLoader(squares, batch_size=2, workers=3):
        break
    mine = [t for t in threading.enumerate() if t not in before]
    for t in mine:
        t.join(10)
    assert not any(t.is_alive() for t in mine) and len(squares.reads) <= 2 * 7  # 1 taken, 6 ahead at most
    # pin_memory: the same values (page-locked only where a CUDA device is present)
    pinned = next(iter(kiln.data.DataLoader(ds, batch_size=2, shuffle=False, pin_memory=True)))
    assert pinned["y"].tolist() == [0, 1] and pinned["name"] == ["s0", "s1"]


@pytest.mark.skipif(not os.path.isdir("/usr/share/games/fortunes"), reason="Debian's fortunes package is not installed")
def test_text_data(tmp_path):
    corpus = ["/usr/share/games/fortunes/computers"]
    kiln.data.build_vocab(corpus, str(tmp_path / "vocab.txt"), size=1200)
    tok = kiln.data.WordPieceTokenizer(str(tmp_path / "vocab.txt"))
    ids = tok.encode("Computers are useless.", add_special_tokens=False)
    assert ids and tok.decode(ids) == "computers are useless." and tok.vocab_size <= 1200
    assert tok.decode(ids, clean_up_tokenization_spaces=False) == "computers are useless ."
    mlm = kiln.data.masked_lm(corpus, tok, seq_len=32)
    b = next(iter(kiln.data.DataLoader(mlm, batch_size=4, workers=0)))
    assert b["input_ids"].shape == (4, 32) and (b["labels"] != -100).any().item()
    bert = kiln.models.create("bert-tiny-mlm", set={"vocab_size": tok.vocab_size})
    logits = bert(b["input_ids"], attention_mask=b["attention_mask"])
    loss = F.cross_entropy(logits.reshape(-1, tok.vocab_size), b["labels"].reshape(-1))
    assert loss.item() > 0
    (tmp_path / "t.tsv").write_text("label\ttext\npos\tgreat fun\nneg\tawful\npos\tnice\n")
    ds, labels = kiln.data.tsv_classification(tmp_path / "t.tsv", tok, seq_len=8)
    assert labels == ["neg", "pos"] and len(ds) == 3
    assert ds.get_batch([0, 1])["target"].tolist() == [1, 0]
    with pytest.raises(kiln.KilnError, match="nope.txt"):
        kiln.data.WordPieceTokenizer(str(tmp_path / "nope.txt"))


def test_wordpiece_tokenizer_as_hugging_face(tmp_path):
    # The answers are transformers 5.25's BertTokenizer over the same vocab.txt.
    words = ["hello", "world", "the", "cat", "sat", "on", "mat", "a", "dog", "ran", ".", ",", "!", "?", "'", "s",
             "run", "##s", "##ning", "is", "it"]
    (tmp_path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words) + "\n")
    tok = kiln.data.WordPieceTokenizer(str(tmp_path / "vocab.txt"))
    assert tok("hello world") == {"input_ids": [2, 5, 6, 3], "token_type_ids": [0, 0, 0, 0],
                                  "attention_mask": [1, 1, 1, 1]}
    assert tok("hello world", "the cat sat") == {"input_ids": [2, 5, 6, 3, 7, 8, 9, 3],
                                                 "token_type_ids": [0, 0, 0, 0, 1, 1, 1, 1],
                                                 "attention_mask": [1, 1, 1, 1, 1, 1, 1, 1]}
    assert tok(["hello world", "the cat sat on the mat."]) == {
        "input_ids": [[2, 5, 6, 3], [2, 7, 8, 9, 10, 7, 11, 15, 3]],
        "token_type_ids": [[0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0, 0, 0]],
        "attention_mask": [[1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1, 1, 1]]}
    assert tok("hello world", max_length=8, padding="max_length") == {
        "input_ids": [2, 5, 6, 3, 0, 0, 0, 0], "token_type_ids": [0, 0, 0, 0, 0, 0, 0, 0],
        "attention_mask": [1, 1, 1, 1, 0, 0, 0, 0]}
    assert tok(["hello world", "a dog"], ["the cat sat", "ran !"], max_length=9, padding="max_length",
               truncation=True) == {
        "input_ids": [[2, 5, 6, 3, 7, 8, 9, 3, 0], [2, 12, 13, 3, 14, 17, 3, 0, 0]],
        "token_type_ids": [[0, 0, 0, 0, 1, 1, 1, 1, 0], [0, 0, 0, 0, 1, 1, 1, 0, 0]],
        "attention_mask": [[1, 1, 1, 1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1, 1, 0, 0]]}
    # 'longest_first': a tie cuts the first to half the room, the second to the rest
    assert tok("hello world hello world hello", "the cat sat on the", max_length=10, truncation=True) == {
        "input_ids": [2, 5, 6, 5, 3, 7, 8, 9, 10, 3], "token_type_ids": [0, 0, 0, 0, 0, 1, 1, 1, 1, 1],
        "attention_mask": [1] * 10}
    assert tok("hello world hello world", max_length=4, truncation=True)["input_ids"] == [2, 5, 6, 3]
    assert tok(["hello world", "the cat sat on the mat"], padding=True) == {
        "input_ids": [[2, 5, 6, 3, 0, 0, 0, 0], [2, 7, 8, 9, 10, 7, 11, 3]],
        "token_type_ids": [[0] * 8, [0] * 8], "attention_mask": [[1, 1, 1, 1, 0, 0, 0, 0], [1] * 8]}
    assert tok.encode("hello world") == [2, 5, 6, 3]
    assert tok.encode("hello world", add_special_tokens=False) == [5, 6]
    ids = tok.encode("The cat's running , it is ! ok ? zz .")
    assert ids == [2, 7, 8, 19, 20, 21, 23, 16, 25, 24, 17, 1, 18, 1, 15, 3]
    assert tok.decode(ids) == "[CLS] the cat's running, it is! [UNK]? [UNK]. [SEP]"
    assert tok.decode(ids, skip_special_tokens=True) == "the cat's running, it is!?."
    assert tok.decode([7, 8, 19, 20, 24, 9]) == "the cat's is sat"
    assert tok.decode(ids, clean_up_tokenization_spaces=False) == \
        "[CLS] the cat ' s running , it is ! [UNK] ? [UNK] . [SEP]"  # as the slow (Python) tokenizer
    with pytest.raises(ValueError, match="truncation=True needs max_length"):
        tok("hello", truncation=True)
    with pytest.raises(ValueError, match="text_pair must be a list of as many str as text"):
        tok(["hello", "world"], ["the"])
    with pytest.raises(ValueError, match="padding must be"):
        tok("hello", padding="left")


def test_deepcopy_of_modules_tensors_and_zoo_models():
    import copy

    # an EMA / teacher copy: its own memory, the same values, mode, frozen flags and ties
    lin = kiln.nn.Linear(3, 3)
    m = kiln.nn.Sequential(lin, kiln.nn.BatchNorm1d(3), kiln.nn.Linear(3, 3))
    m[2].weight = m[0].weight  # tied
    m.eval()
    m[0].bias.requires_grad_(False)
    c = copy.deepcopy(m)
    assert not c.training and isinstance(c[0].weight, kiln.nn.Parameter)
    assert c[2].weight is c[0].weight and c[0].weight is not m[0].weight
    assert c[0].weight.data_ptr() != m[0].weight.data_ptr()
    assert not c[0].bias.requires_grad and c[0].weight.requires_grad
    x = kiln.randn(4, 3)
    assert np.array_equal(c(x).detach().numpy(), m(x).detach().numpy())
    with kiln.no_grad():
        c[0].weight.fill_(0.0)
    assert m[0].weight.abs().sum().item() > 0  # the original is untouched
    t = kiln.ones(2, requires_grad=True)
    (t * 2).sum().backward()
    u = copy.deepcopy(t)
    assert u.requires_grad and u.grad.tolist() == [2.0, 2.0] and u.is_leaf
    with pytest.raises(kiln.KilnError, match="only leaf tensors"):
        copy.deepcopy(t * 2)
    z = kiln.models.create("resnet20", set={"in_channels": 1})
    z.eval()
    z2 = copy.deepcopy(z)
    assert type(z2) is type(z) and not z2.training
    img = kiln.randn(2, 1, 28, 28)
    assert np.array_equal(z(img).detach().numpy(), z2(img).detach().numpy())
    with kiln.no_grad():
        next(iter(z2.parameters())).fill_(0.0)
    assert not np.array_equal(z(img).detach().numpy(), z2(img).detach().numpy())


def test_load_reads_into_memory_and_mmap_is_opt_in(tmp_path):
    # A loaded file rewritten in place: mapped tensors would read the new bytes, or die of SIGBUS
    # once it is truncated; the default load read them into memory.
    p = tmp_path / "w2.st"
    kiln.save({"a": kiln.ones(100000)}, p)
    d = kiln.load(p)
    t, _ = kiln.load_safetensors(p)
    with open(p, "r+b") as f:
        f.seek(200)
        f.write(b"\xff" * 4096)
    with open(p, "wb") as f:
        f.write(b"x" * 10)
    assert float(d["a"].sum()) == 100000.0 and float(t["a"].sum()) == 100000.0
    # mmap=True maps (values as written; the file must stay as it is while they live).
    kiln.save({"a": kiln.arange(10, dtype=kiln.float32)}, p)
    m = kiln.load(p, mmap=True)
    assert m["a"].tolist() == list(range(10))
    assert kiln.load_safetensors(str(p), mmap=True)[0]["a"].tolist() == list(range(10))
    with pytest.raises(ValueError, match="mmap=True needs a path"):
        with open(p, "rb") as f:
            kiln.load(f, mmap=True)


def test_missing_files_raise_file_not_found(tmp_path):
    for call in (lambda p: kiln.load(p), lambda p: kiln.load_safetensors(str(p)), lambda p: kiln.load_checkpoint(p)):
        p = tmp_path / "nope.kiln"
        with pytest.raises(FileNotFoundError, match="nope.kiln") as e:
            call(p)
        assert isinstance(e.value, kiln.KilnError) and e.value.errno == 2 and e.value.filename == str(p)
        assert str(e.value).startswith(f"{p}: cannot open") and "No such file or directory" in str(e.value)
    # Other failures to open are not reported as missing.
    with pytest.raises(kiln.KilnError) as e:
        kiln.load(tmp_path)
    assert not isinstance(e.value, FileNotFoundError)


def test_zoo_load_state_dict_names_a_non_str_key():
    m = kiln.models.create("resnet20", set={"num_classes": 3})
    sd = m.state_dict()
    sd[7] = kiln.zeros(1)
    with pytest.raises(TypeError, match="key 7 is an int, expected a str"):
        m.load_state_dict(sd)


def test_grad_scaler_state_dict_round_trip_and_errors():
    w = nn.Parameter(kiln.ones(3))
    opt = kiln.optim.SGD([w], lr=0.1)
    s = kiln.amp.GradScaler(init_scale=1024.0, growth_interval=3)
    assert s.is_enabled() and not kiln.amp.GradScaler(enabled=False).is_enabled()
    for _ in range(2):  # two clean steps: the tracker at 2
        s.scale((w * 2).sum()).backward()
        s.step(opt)
        s.update()
        opt.zero_grad()
    sd = s.state_dict()
    assert sd == {"scale": 1024.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 3,
                  "_growth_tracker": 2}
    # A resumed scaler grows after one more clean step, as the original would.
    r = kiln.amp.GradScaler()
    r.load_state_dict(sd)
    assert r.state_dict() == sd and r.get_scale() == 1024.0
    r.scale((w * 2).sum()).backward()
    r.step(opt)
    r.update()
    assert r.get_scale() == 2048.0 and r.state_dict()["_growth_tracker"] == 0
    assert kiln.amp.GradScaler(enabled=False).state_dict() == {}
    for bad, what in [({**sd, "scale": float("nan")}, "'scale' is nan"), ({**sd, "scale": -1.0}, "'scale' is -1.0"),
                      ({**sd, "_growth_tracker": -1}, "'_growth_tracker' is -1"),
                      ({**sd, "growth_interval": "3"}, "'growth_interval' is '3'"),
                      ({**sd, "growth_factor": 0.5}, "'growth_factor' is 0.5"),
                      ({**sd, "extra": 1}, "unknown key 'extra'"),
                      ({k: v for k, v in sd.items() if k != "scale"}, "missing 'scale'"), ({}, "empty")]:
        with pytest.raises(ValueError, match=what):
            kiln.amp.GradScaler().load_state_dict(bad)


def test_grad_scaler_scale_takes_tensors_and_iterables_only():
    s = kiln.amp.GradScaler(init_scale=4.0)
    a, b = kiln.ones(2), kiln.full((1,), 3.0)
    assert s.scale(a).tolist() == [4.0, 4.0]
    out = s.scale([a, (b,)])
    assert isinstance(out, list) and out[0].tolist() == [4.0, 4.0] and isinstance(out[1], tuple)
    assert out[1][0].tolist() == [12.0]
    assert [t.tolist() for t in s.scale(x for x in [b])] == [[12.0]]
    for bad, name in [(2.0, "float"), ("loss", "str"), ([a, 2.0], "float")]:
        with pytest.raises(TypeError, match=f"GradScaler.scale: expected a kiln.Tensor or an iterable of them, got {name}"):
            s.scale(bad)


def test_autocast_as_a_decorator():
    a, b = kiln.randn(4, 8), kiln.randn(8, 3)

    @kiln.amp.autocast(kiln.bfloat16)
    def mm(x, y):
        """doc"""
        assert kiln.amp.autocast_dtype() == kiln.bfloat16
        return x @ y

    assert mm(a, b).dtype == kiln.bfloat16 and mm(a, b).dtype == kiln.bfloat16 and mm.__doc__ == "doc"
    assert kiln.amp.autocast_dtype() is None and (a @ b).dtype == kiln.float32
    assert kiln.autocast is kiln.amp.autocast
    region = kiln.amp.autocast(kiln.float16)
    with region:
        with region:  # the same object nested
            assert (a @ b).dtype == kiln.float16
        assert (a @ b).dtype == kiln.float16
    assert kiln.amp.autocast_dtype() is None
    with pytest.raises(ValueError):
        kiln.amp.autocast(kiln.float32)


def test_models_create_set_forms_and_errors():
    assert kiln.models.create("resnet20", set="num_classes=3")(kiln.randn(1, 3, 32, 32)).shape == (1, 3)
    m = kiln.models.create("resnet20", set="num_classes=3, in_channels=1")
    assert m(kiln.randn(1, 1, 32, 32)).shape == (1, 3)
    assert kiln.models.create("resnet20", set=["num_classes=5"])(kiln.randn(1, 3, 32, 32)).shape == (1, 5)
    kiln.models.create("resnet20", set={"zero_init_residual": True, "recompute": False})
    bad = [("resnet20", {"num_classes": True}, "num_classes=true: expected an integer"),
           ("resnet20", "num_classes", "'num_classes' is not 'key=value'"),
           ("resnet20", {"colour": 1}, "set= colour: not a ResNet config field"),
           ("resnet20", {"zero_init_residual": 2}, "zero_init_residual=2: expected a boolean"),
           ("bert-tiny", {"hidden_dropout": 1.5}, "hidden_dropout=1.5: a dropout probability must be in"),
           ("bert-tiny", {"attention_dropout": -0.1}, "attention_dropout=-0.1: a dropout probability"),
           ("bert-tiny", {"layer_norm_eps": float("nan")}, "layer_norm_eps=nan: must be a finite number > 0"),
           ("bert-tiny", {"layer_norm_eps": 0}, "layer_norm_eps=0: must be a finite number > 0"),
           ("resnet20", {"num_classes": 0}, "set= num_classes=0: must be at least 1"),
           ("resnet-nope", None, "unknown model 'resnet-nope'")]
    for name, sets, what in bad:
        with pytest.raises(kiln.KilnValueError, match=what) as e:
            kiln.models.create(name, set=sets)
        assert "--set" not in str(e.value) and "--model" not in str(e.value)
    with pytest.raises(TypeError, match="set= items must be 'key=value' strings"):
        kiln.models.create("resnet20", set=[("num_classes", 3)])


def test_models_create_refuses_a_set_that_gives_nothing():
    # set="" built the model's own config without a word, though a value was meant (as kiln.train's set="").
    for empty in ["", " ", [], {}, ()]:
        with pytest.raises(kiln.KilnValueError, match=r"set=.* gives no override \(leave it out, or None"):
            kiln.models.create("resnet20", set=empty)
    with pytest.raises(kiln.KilnValueError, match="set= item '' is not 'key=value'"):
        kiln.models.create("resnet20", set=[""])
    assert kiln.models.create("resnet20", set=None)(kiln.randn(1, 3, 32, 32)).shape == (1, 10)


@pytest.mark.skipif(not os.path.isdir(kiln.data.FASHION_MNIST_DIR), reason="dataset-fashion-mnist is not installed")
def test_mnist_dir_takes_the_named_data_sets_transforms():
    # A black pixel normalised with MNIST's statistics (kiln train --data mnist), not Fashion-MNIST's.
    def black(**kw):
        d = kiln.data.mnist_dir(kiln.data.FASHION_MNIST_DIR, augment=False, **kw)
        return min(next(iter(kiln.data.DataLoader(d["test"], batch_size=4)))["input"].flatten().tolist())

    assert black() == pytest.approx(-0.1307 / 0.3081, abs=1e-6)
    assert black(name="fashion-mnist") == pytest.approx(-0.2860 / 0.3530, abs=1e-6)
    assert black(mean=(0.5,), std=(0.5,)) == pytest.approx(-1.0, abs=1e-6)


@pytest.mark.skipif(not os.path.isdir(kiln.data.FASHION_MNIST_DIR), reason="dataset-fashion-mnist is not installed")
def test_mnist_dir_takes_a_number_for_the_one_channels_mean_and_std():
    d = kiln.data.mnist_dir(kiln.data.FASHION_MNIST_DIR, augment=False, mean=0.5, std=0.25)
    x = next(iter(kiln.data.DataLoader(d["test"], batch_size=4)))["input"]
    assert min(x.flatten().tolist()) == pytest.approx(-2.0, abs=1e-6)  # black: (0 - 0.5) / 0.25
    with pytest.raises(ValueError, match=r"mean has 2 values, but the data set has 1 channel"):
        kiln.data.mnist_dir(kiln.data.FASHION_MNIST_DIR, mean=(0.5, 0.5))
    with pytest.raises(TypeError, match=r"std must be a number or a sequence of 1 numbers"):
        kiln.data.mnist_dir(kiln.data.FASHION_MNIST_DIR, std="wide")


@pytest.mark.skipif(not os.path.isdir(kiln.data.FASHION_MNIST_DIR), reason="dataset-fashion-mnist is not installed")
def test_fashion_mnist_forwards_the_overrides_and_pad():
    def first(d, split="test"):
        return next(iter(kiln.data.DataLoader(d[split], batch_size=8)))["input"].numpy()

    d = kiln.data.fashion_mnist(mean=(0.5,), std=0.5)
    assert first(d).min() == pytest.approx(-1.0, abs=1e-6)  # black: (0 - 0.5) / 0.5
    # pad=0 and no flip: training batches are the images as they are, whatever the seed
    plain = kiln.data.fashion_mnist(hflip=False, pad=0)
    assert np.array_equal(first(plain, "train"), plain["train"].get_batch(list(range(8)), seed=0)["input"].numpy())
    raw = kiln.data.fashion_mnist(augment=False)
    assert np.array_equal(plain["train"].get_batch(list(range(8)), seed=9)["input"].numpy(),
                          raw["train"].get_batch(list(range(8)))["input"].numpy())
    # the default pad is 2: some sample of a batch is shifted
    shifted = kiln.data.fashion_mnist(hflip=False)
    assert not np.array_equal(shifted["train"].get_batch(list(range(8)), seed=9)["input"].numpy(),
                              raw["train"].get_batch(list(range(8)))["input"].numpy())
    with pytest.raises(ValueError, match=r"pad must be >= 0.*got -1"):
        kiln.data.fashion_mnist(pad=-1)
    with pytest.raises(TypeError, match=r"pad must be an int"):
        kiln.data.mnist_dir(kiln.data.FASHION_MNIST_DIR, pad=1.5)


def test_mnist_dir_refuses_a_pad_larger_than_the_images():
    # 2 * pad + 1 overflowed for pad=2**62; 2**63 was nanobind's TypeError on the int64 argument
    assert len(kiln.data.fashion_mnist(pad=28)["train"]) == 60000  # the image size itself is fine
    for pad in (29, 2**62):
        with pytest.raises(kiln.KilnError, match=rf"crop padding \(pad\) {pad} is larger than the 28x28 images"):
            kiln.data.fashion_mnist(pad=pad)
    with pytest.raises(ValueError, match=rf"pad {2**63} is larger than the images"):
        kiln.data.mnist_dir(kiln.data.FASHION_MNIST_DIR, pad=2**63)
