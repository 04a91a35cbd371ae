# kiln.models models as torch modules: the same Parameter objects on every call, their C++ module
# tree as submodules, Hugging Face state dicts, iterator parameters(), deepcopy with hooks.
import copy
import inspect
import pickle

import numpy as np
import pytest
import torch

import kiln
from kiln import nn


class TeacherStudent(nn.Module):
    def __init__(self):
        super().__init__()
        self.student = kiln.models.create("resnet20")
        self.teacher = kiln.models.create("resnet20")


def test_two_zoo_models_in_one_module_list_every_parameter():
    m = TeacherStudent()
    one = kiln.models.create("resnet20")
    n_params, n_bufs = len(list(one.named_parameters())), len(list(one.named_buffers()))
    names = [n for n, _ in m.named_parameters()]
    assert len(names) == len(set(names)) == 2 * n_params
    assert len([n for n, _ in m.named_buffers()]) == 2 * n_bufs
    assert len(m.state_dict()) == 2 * len(one.state_dict())
    for n, p in m.named_parameters():
        if n.startswith("teacher."):
            p.requires_grad_(False)
    assert not any(p.requires_grad for p in m.teacher.parameters())
    assert all(p.requires_grad for p in m.student.parameters())


def test_zoo_parameters_are_the_same_parameter_objects():
    m = kiln.models.create("resnet20")
    p = next(m.parameters())
    assert isinstance(p, nn.Parameter) and p is next(m.parameters())
    assert not any(isinstance(b, nn.Parameter) for b in m.buffers())  # buffers: tensors, as torch's
    ps = list(m.parameters())
    assert len(set(ps + list(m.parameters()))) == len(ps)
    head = {id(q) for n, q in m.named_parameters() if n.startswith("fc.")}
    assert len([q for q in m.parameters() if id(q) not in head]) == len(ps) - 2
    p.tag = "mine"
    assert next(m.parameters()).tag == "mine"
    # The objects stay the model's tensors: to() converts, load_state_dict copies and requires_grad_
    # flags the C++ tensors in place.
    w = m.fc.weight
    m.double()
    assert w is m.fc.weight and w.dtype == kiln.float64
    m.load_state_dict({k: kiln.zeros_like(v) for k, v in m.state_dict().items()})
    assert float(w.abs().sum()) == 0.0
    m.requires_grad_(False)
    assert not w.requires_grad and [q is r for q, r in zip(ps, m.parameters())] == [True] * len(ps)
    m.requires_grad_(True).float()
    opt = kiln.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    nn.functional.cross_entropy(m(kiln.randn(2, 3, 32, 32)), kiln.tensor([0, 1])).backward()
    opt.step()
    assert w.grad is not None and "momentum_buffer" in opt.state[m.fc.weight]


def test_tied_zoo_parameter_is_one_object_under_each_name():
    b = kiln.models.create("bert-tiny-mlm", set={"vocab_size": 300})
    everything = list(b.named_parameters(remove_duplicate=False))
    assert len({id(p) for _, p in everything}) == len(list(b.parameters()))
    assert b.bert.embeddings.word_embeddings.weight is dict(everything)["bert.embeddings.word_embeddings.weight"]


def test_zoo_model_tree_is_its_submodules():
    m = kiln.models.create("resnet20")
    assert [n for n, _ in m.named_children()] == ["conv1", "bn1", "layer1", "layer2", "layer3", "fc"]
    mods = dict(m.named_modules())
    # As torch: every parameter's and buffer's module is a named module, holding it under its last name.
    for n, t in list(m.named_parameters()) + list(m.named_buffers()):
        path, _, last = n.rpartition(".")
        assert getattr(mods[path], last) is t
    assert m.get_submodule("layer2.0.downsample.0") is m.layer2[0].downsample[0] is mods["layer2.0.downsample.0"]
    assert m.get_parameter("layer1.1.bn2.weight") is m.layer1[1].bn2.weight
    assert len(m.layer1) == 3 and list(m.layer3) == [m.layer3[0], m.layer3[1], m.layer3[-1]]
    seen = []
    m.apply(seen.append)
    assert len(seen) == len(mods) and seen[-1] is m
    # The tree and its state dict agree with the C++ model's.
    assert set(m.state_dict()) == set(m._c.state_dict())
    assert [n for n, _ in m.named_parameters()] == [n for n, _ in m._c.named_parameters()]
    assert list(m.named_parameters(recurse=False)) == []
    assert [n for n, _ in m.fc.named_parameters(recurse=False)] == ["weight", "bias"]
    # train/eval reach every C++ submodule.
    m.eval()
    assert not m.layer1[0]._c.training and not m.layer1[0].training
    # A one-tensor layer runs on its own, as torch's.
    x = kiln.randn(4, 64)
    want = torch.nn.functional.linear(torch.from_numpy(x.numpy()), torch.from_numpy(m.fc.weight.detach().numpy()),
                                      torch.from_numpy(m.fc.bias.detach().numpy()))
    np.testing.assert_allclose(m.fc(x).detach().numpy(), want.numpy(), rtol=1e-5, atol=1e-5)
    b = kiln.models.create("bert-tiny-mlm", set={"vocab_size": 300})
    q = b.get_submodule("bert.encoder.layer.1.attention.self.query")
    assert q is b.bert.encoder.layer[1].attention.self.query and "Linear" in repr(q)


def test_zoo_model_tree_is_fixed_and_says_so():
    m = kiln.models.create("resnet20")
    with pytest.raises(kiln.KilnError, match="cannot assign 'fc' of the model .*built in C\\+\\+"):
        m.fc = nn.Linear(64, 3)
    with pytest.raises(kiln.KilnError, match="cannot assign 'weight' of 'fc' \\(Linear\\)"):
        m.fc.weight = nn.Parameter(kiln.zeros(10, 64))
    with pytest.raises(kiln.KilnError, match="cannot delete 'conv1'"):
        del m.layer1[0].conv1
    with pytest.raises(kiln.KilnError, match="cannot add module 'extra'"):
        m.add_module("extra", nn.ReLU())
    with pytest.raises(kiln.KilnError, match="register_forward_hook on 'layer1' .*register it on the whole model"):
        m.layer1.register_forward_hook(lambda *a: None)
    with pytest.raises(TypeError, match="not subscriptable"):
        m.layer1[0][0]
    b = kiln.models.create("bert-tiny")
    with pytest.raises(TypeError, match="a BertLayer of a kiln.models model cannot be called on its own"):
        b.encoder.layer[0](kiln.randn(1, 4, 128))
    m.note = "plain attributes are fine"
    assert m.note == "plain attributes are fine" and isinstance(m.fc, nn.Module)


def test_hugging_face_bert_for_masked_lm_state_dict_loads():
    b = kiln.models.create("bert-tiny-mlm", set={"vocab_size": 300})
    cfg = dict(layers=2, hidden=128, inter=512, vocab=300, positions=512, types=2)
    h, i = cfg["hidden"], cfg["inter"]
    # The names and shapes of transformers' BertForMaskedLM.state_dict() (no pooler; the decoder's
    # weight is the word embeddings, its bias cls.predictions.bias, both saved under both names).
    shapes = {"bert.embeddings.word_embeddings.weight": (cfg["vocab"], h),
              "bert.embeddings.position_embeddings.weight": (cfg["positions"], h),
              "bert.embeddings.token_type_embeddings.weight": (cfg["types"], h),
              "bert.embeddings.LayerNorm.weight": (h,), "bert.embeddings.LayerNorm.bias": (h,)}
    for n in range(cfg["layers"]):
        at = f"bert.encoder.layer.{n}."
        for lin in ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense"):
            shapes.update({at + lin + ".weight": (h, h), at + lin + ".bias": (h,)})
        shapes.update({at + "attention.output.LayerNorm.weight": (h,), at + "attention.output.LayerNorm.bias": (h,),
                       at + "intermediate.dense.weight": (i, h), at + "intermediate.dense.bias": (i,),
                       at + "output.dense.weight": (h, i), at + "output.dense.bias": (h,),
                       at + "output.LayerNorm.weight": (h,), at + "output.LayerNorm.bias": (h,)})
    shapes.update({"cls.predictions.bias": (cfg["vocab"],), "cls.predictions.transform.dense.weight": (h, h),
                   "cls.predictions.transform.dense.bias": (h,), "cls.predictions.transform.LayerNorm.weight": (h,),
                   "cls.predictions.transform.LayerNorm.bias": (h,)})
    gen = torch.Generator().manual_seed(0)
    hf = {k: torch.randn(s, generator=gen) for k, s in shapes.items()}
    hf["cls.predictions.decoder.weight"] = hf["bert.embeddings.word_embeddings.weight"]
    hf["cls.predictions.decoder.bias"] = hf["cls.predictions.bias"]
    hf["bert.embeddings.position_ids"] = torch.arange(cfg["positions"]).unsqueeze(0)  # transformers < 4.31
    sd = {k: kiln.from_dlpack(v.contiguous()) for k, v in hf.items()}
    assert b.load_state_dict(sd) == ([], [])
    got = b.state_dict()
    for k in shapes:
        np.testing.assert_array_equal(got[k].numpy(), hf[k].numpy(), err_msg=k)
    # An untied decoder cannot be represented: the error names both tensors.
    sd["cls.predictions.decoder.weight"] = kiln.zeros(cfg["vocab"], h)
    with pytest.raises(kiln.KilnError, match="load_state_dict\\(bert-tiny-mlm\\): 'cls.predictions.decoder.weight' "
                                             "differs from 'bert.embeddings.word_embeddings.weight'"):
        b.load_state_dict(sd)


def test_parameters_and_buffers_are_iterators_as_torch():
    t = torch.nn.Linear(2, 2)
    for m in (nn.Linear(2, 2), kiln.models.create("resnet20")):
        for f in ("parameters", "buffers", "named_parameters", "named_buffers", "children", "modules"):
            assert inspect.isgenerator(getattr(m, f)()) == inspect.isgenerator(getattr(t, f)()), f
        assert next(m.parameters()) is next(iter(m.parameters()))


def test_deepcopy_of_a_zoo_model_keeps_its_hooks():
    m = kiln.models.create("resnet20")
    calls = []
    h = m.register_forward_hook(lambda mod, args, out: calls.append(mod))
    m.register_forward_pre_hook(lambda mod, args: calls.append("pre"))
    c = copy.deepcopy(m)
    x = kiln.randn(1, 3, 32, 32)
    c(x)
    assert calls == ["pre", c]  # the hook gets the copy, as torch's
    h.remove()  # the original's handle: the copy keeps its hook
    calls.clear()
    c(x)
    m(x)
    assert calls == ["pre", c, "pre"]
    # Deep-copied with the model, a parameter maps to the copy's.
    c2, p2 = copy.deepcopy((m, m.fc.weight))
    assert p2 is c2.fc.weight and p2 is not m.fc.weight


def test_zoo_modules_are_truthy_and_only_lists_are_sequences():
    m = kiln.models.create("resnet20")
    assert bool(m) and bool(m.fc) and bool(m.layer1)  # as torch's: a module is true
    assert len(m.layer1) == 3 and m.layer1[0] is list(m.layer1)[0]
    with pytest.raises(TypeError):
        len(m.fc)
    with pytest.raises(TypeError):
        iter(m)


def test_a_submodule_held_alone_keeps_only_its_own_tensors():
    import gc
    import weakref
    m = kiln.models.create("resnet20")
    fc = m.fc
    conv = weakref.ref(m.conv1.weight)
    del m
    gc.collect()
    assert conv() is None  # the rest of the model's parameters went with it
    assert tuple(fc.weight.shape) == (10, 64) and tuple(fc(kiln.randn(2, 64)).shape) == (2, 10)


def test_deepcopy_maps_a_parameter_a_hook_holds_to_the_copys():
    m = kiln.models.create("resnet20")

    class Hook:
        def __init__(self, p):
            self.p = p

        def __call__(self, mod, args, out):
            pass

    m.register_forward_hook(Hook(m.fc.weight))
    c = copy.deepcopy(m)
    assert next(iter(c._forward_hooks.values())).p is c.fc.weight


def test_a_bare_bert_encoder_state_dict_fills_a_headed_models_encoder():
    # Hugging Face's BertModel.save_pretrained names the encoder without "bert.": into a classifier it
    # matched nothing, and strict=False left the encoder random; now "bert." is added, as from_pretrained.
    sets = {"vocab_size": 100, "num_layers": 1, "num_labels": 3}
    bare = {k: v.detach().clone() for k, v in kiln.models.create("bert-tiny", set=sets).state_dict().items()}
    assert "embeddings.word_embeddings.weight" in bare
    cls = kiln.models.create("bert-tiny-cls", set=sets)
    res = cls.load_state_dict(bare, strict=False)
    assert sorted(res.missing_keys) == ["classifier.bias", "classifier.weight"]
    assert res.unexpected_keys == []
    got = cls.state_dict()
    for k, v in bare.items():
        np.testing.assert_array_equal(got["bert." + k].numpy(), v.numpy(), err_msg=k)
    # The masked-LM model takes it too (its head missing, the pooler it has none of unexpected).
    mlm = kiln.models.create("bert-tiny-mlm", set=sets)
    res = mlm.load_state_dict(bare, strict=False)
    assert all(k.startswith("cls.") for k in res.missing_keys)
    assert sorted(res.unexpected_keys) == ["bert.pooler.dense.bias", "bert.pooler.dense.weight"]


def test_a_stray_bert_key_stays_unexpected_outside_a_bert_mlm_model():
    r = kiln.models.create("resnet20")
    sd = dict(r.state_dict())
    sd["bert.embeddings.position_ids"] = kiln.zeros(1, 4)
    with pytest.raises(kiln.KilnError, match="position_ids"):
        r.load_state_dict(sd)
    sd = dict(r.state_dict())
    sd["layer1.0.bn1.gamma"] = kiln.zeros(16)  # a BERT-style LayerNorm name, not mapped for a ResNet
    with pytest.raises(kiln.KilnError, match="layer1.0.bn1.gamma"):
        r.load_state_dict(sd)
    b = kiln.models.create("bert-tiny-cls", set={"vocab_size": 100})
    sd = dict(b.state_dict())
    sd["cls.predictions.decoder.weight"] = kiln.zeros(100, 128)
    res = b.load_state_dict(sd, strict=False)
    assert "cls.predictions.decoder.weight" in res.unexpected_keys


def test_bert_mlm_state_dict_has_the_tied_decoder_as_hugging_face():
    # transformers' BertForMaskedLM ties cls.predictions.decoder to the word embeddings (and its bias
    # to cls.predictions.bias) and its state_dict() lists both names, the decoder after the transform.
    b = kiln.models.create("bert-tiny-mlm", set={"vocab_size": 300})
    sd = b.state_dict()
    assert [k for k in sd if k.startswith("cls.")] == [
        "cls.predictions.bias", "cls.predictions.transform.dense.weight", "cls.predictions.transform.dense.bias",
        "cls.predictions.transform.LayerNorm.weight", "cls.predictions.transform.LayerNorm.bias",
        "cls.predictions.decoder.weight", "cls.predictions.decoder.bias"]
    emb = b.bert.embeddings.word_embeddings.weight
    assert sd["cls.predictions.decoder.weight"].data_ptr() == emb.data_ptr()
    assert sd["cls.predictions.decoder.bias"].data_ptr() == b.cls.predictions.bias.data_ptr()
    assert b.state_dict(keep_vars=True)["cls.predictions.decoder.weight"] is emb
    assert "cls.predictions.decoder.weight" not in dict(b.named_parameters())  # one parameter, as torch
    # Its own state dict loads back strictly (the decoder checked against the embeddings, as a
    # Hugging Face file's), into a parent module's under its prefix too.
    other = kiln.models.create("bert-tiny-mlm", set={"vocab_size": 300})
    assert other.load_state_dict(sd) == ([], [])
    np.testing.assert_array_equal(other.bert.embeddings.word_embeddings.weight.detach().numpy(), emb.detach().numpy())
    parent = nn.Module()
    parent.mlm = other
    assert "mlm.cls.predictions.decoder.weight" in parent.state_dict()
    bad = dict(sd)
    bad["cls.predictions.decoder.weight"] = kiln.zeros(300, 128)
    with pytest.raises(kiln.KilnError, match="'cls.predictions.decoder.weight' differs from "
                                             "'bert.embeddings.word_embeddings.weight'"):
        other.load_state_dict(bad)
    # Not in a classifier or the bare encoder, which have no decoder.
    assert not any("decoder" in k for k in kiln.models.create("bert-tiny-cls").state_dict())


def test_bert_mlm_saved_with_kiln_save_holds_the_tied_decoder_once(tmp_path):
    b = kiln.models.create("bert-tiny-mlm", set={"vocab_size": 300})
    kiln.save(b, tmp_path / "b.safetensors")
    saved = kiln.load(tmp_path / "b.safetensors")
    assert "cls.predictions.decoder.weight" not in saved and "bert.embeddings.word_embeddings.weight" in saved
    c = kiln.models.create("bert-tiny-mlm", set={"vocab_size": 300})
    assert c.load_state_dict(saved) == ([], [])


@pytest.mark.parametrize("which", ["parameter", "buffer"])
def test_deepcopy_of_a_tensor_before_its_zoo_model_gives_the_copys_own(which):
    # copy.deepcopy([p, model]): p is copied first, then the model; torch's memo makes the first copy
    # the copied model's own tensor, and so does Kiln's.
    m = kiln.models.create("resnet20")
    t = m.fc.weight if which == "parameter" else m.bn1.running_mean
    t.grad = kiln.ones(*t.shape) if which == "parameter" else None
    ct, cm = copy.deepcopy([t, m])
    same = cm.fc.weight if which == "parameter" else cm.bn1.running_mean
    assert ct is same and ct is not t
    assert (cm.state_dict(keep_vars=True)["fc.weight" if which == "parameter" else "bn1.running_mean"] is ct)
    np.testing.assert_array_equal(ct.detach().numpy(), t.detach().numpy())
    if which == "parameter":
        assert type(ct) is nn.Parameter and ct.requires_grad and ct.grad is None  # as torch's Parameter
        # It is the model's tensor: an update through it changes the copy's forward, not the original's.
        x = kiln.randn(2, 3, 32, 32)
        m.eval(), cm.eval()
        before = cm(x).tolist()
        with kiln.no_grad():
            ct.mul_(0.0)
        assert cm(x).tolist() != before and m(x).tolist() == before
    else:
        with kiln.no_grad():
            ct.fill_(3.0)
        assert cm.state_dict()["bn1.running_mean"].tolist() == [3.0] * t.shape[0]
    # And the other way round, as before: the model first, then the tensor.
    cm2, ct2 = copy.deepcopy([m, t])
    assert ct2 is (cm2.fc.weight if which == "parameter" else cm2.bn1.running_mean)


def test_deepcopy_of_a_parameter_before_its_python_module_gives_the_copys_own():
    m = nn.Sequential(nn.Linear(3, 2), nn.ReLU())
    p = m[0].weight
    cp, cm = copy.deepcopy([p, m])
    assert cp is cm[0].weight and cp is not p


def test_a_parent_module_loads_a_bert_mlm_child_as_the_child_does():
    # Through a parent's load_state_dict the tied decoder is what it is in the model's own: optional (a
    # dict from before it was listed loads strictly) and, when given, checked equal to the embeddings.
    p = nn.Module()
    p.enc = kiln.models.create("bert-tiny-mlm", set={"vocab_size": 300})
    sd = p.state_dict()
    assert "enc.cls.predictions.decoder.weight" in sd
    assert p.load_state_dict({k: v for k, v in sd.items() if "decoder" not in k}) == ([], [])
    assert p.load_state_dict(sd) == ([], [])
    emb = p.enc.bert.embeddings.word_embeddings.weight
    before = emb.detach().numpy().copy()
    bad = dict(sd)
    bad["enc.cls.predictions.decoder.weight"] = kiln.full((300, 128), 5.0)
    with pytest.raises(kiln.KilnError, match="'enc.cls.predictions.decoder.weight' differs from "
                                             "'enc.bert.embeddings.word_embeddings.weight'"):
        p.load_state_dict(bad)
    np.testing.assert_array_equal(emb.detach().numpy(), before)  # refused, not copied over the embeddings
    bad = dict(sd)
    bad["enc.cls.predictions.decoder.bias"] = kiln.full((300,), 5.0)
    with pytest.raises(kiln.KilnError, match="'enc.cls.predictions.decoder.bias' differs from "
                                             "'enc.cls.predictions.bias'"):
        p.load_state_dict(bad)
    # Given alone (the embeddings left out), the decoder is loaded as the embeddings.
    only = {k: v for k, v in sd.items() if k != "enc.bert.embeddings.word_embeddings.weight"}
    only["enc.cls.predictions.decoder.weight"] = kiln.full((300, 128), 2.0)
    assert p.load_state_dict(only) == ([], [])
    assert (emb.detach().numpy() == 2.0).all()


def test_deepcopy_with_a_parameter_in_the_callers_memo_leaves_the_original_alone():
    # copy.deepcopy(model, {id(p): p}), torch's idiom to share p: a kiln.models model cannot share a tensor
    # with another, so it is refused, and the original's parameter stays the original's tensor.
    m = kiln.models.create("resnet20")
    p = m.fc.weight
    ptr = p.data_ptr()
    with pytest.raises(kiln.KilnError, match="'fc.weight'.*cannot be shared"):
        copy.deepcopy(m, {id(p): p})
    assert m.fc.weight is p and p.data_ptr() == ptr
    assert m.state_dict(keep_vars=True)["fc.weight"].data_ptr() == ptr
    x = kiln.randn(2, 3, 32, 32)
    m.eval()
    before = m(x).tolist()
    with kiln.no_grad():
        p.mul_(0.0)  # the model's forward still reads p
    assert m(x).tolist() != before
    # A copy made in this deepcopy is still the copied model's own (the idiom that works).
    cp, cm = copy.deepcopy([p, m])
    assert cm.fc.weight is cp and m.fc.weight is p and p.data_ptr() == ptr


def test_a_torch_tensor_dlpack_refuses_or_misreads_is_loaded_copied():
    # docs/python.md: read through DLPack where Kiln can, copied otherwise. torch's DLPack export refuses a
    # sparse tensor (read through the CPU instead), and exports a negative-bit view's memory without its
    # sign (resolved first).
    m = nn.Linear(2, 2)
    w = torch.tensor([[1.0, 0.0], [0.0, -4.0]])
    with pytest.raises(BufferError):
        w.to_sparse().__dlpack__()  # the case under test
    m.load_state_dict({"weight": w.to_sparse(), "bias": torch._neg_view(torch.tensor([1.0, -2.0]))})
    np.testing.assert_array_equal(m.weight.detach().numpy(), w.numpy())
    np.testing.assert_array_equal(m.bias.detach().numpy(), [-1.0, 2.0])


def _hf_folder(path, model, config):
    """A Hugging Face model folder: config.json and model.safetensors (the state dict's names)."""
    import json
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    kiln.save(model.state_dict(), str(path / "model.safetensors"))
    return path


def test_from_pretrained_refuses_a_set_that_gives_nothing(tmp_path):
    # set="" built the config's own sizes without a word, though create(set="") and kiln.train(set="")
    # refuse it: a value was meant and lost.
    import json
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "bert", "hidden_size": 64, "num_hidden_layers": 1,
                                  "num_attention_heads": 2, "intermediate_size": 96, "vocab_size": 40,
                                  "max_position_embeddings": 32}))
    for empty in ["", " ", [], {}, ()]:
        with pytest.raises(kiln.KilnValueError,
                           match=r"from_pretrained: set=.* gives no override \(leave it out, or None"):
            kiln.models.from_pretrained(config, model="bert-tiny-mlm", set=empty)
    with pytest.raises(kiln.KilnValueError, match="from_pretrained: set= item '' is not 'key=value'"):
        kiln.models.from_pretrained(config, model="bert-tiny-mlm", set=[""])
    assert kiln.models.from_pretrained(config, model="bert-tiny-mlm", set={"vocab_size": 50}).state_dict()[
        "bert.embeddings.word_embeddings.weight"].shape == (50, 64)


def test_from_pretrained_reads_config_json_and_refuses_what_kiln_does_not_compute(tmp_path):
    # num_attention_heads 4 has the shapes of bert-tiny's 2: the weights load either way, and only the
    # config gives the right numbers.
    config = {"model_type": "bert", "hidden_act": "gelu", "hidden_size": 64, "num_hidden_layers": 1,
              "num_attention_heads": 4, "intermediate_size": 96, "vocab_size": 40, "max_position_embeddings": 32,
              "type_vocab_size": 2, "layer_norm_eps": 1e-12, "hidden_dropout_prob": 0.0,
              "attention_probs_dropout_prob": 0.0, "pad_token_id": 0, "position_embedding_type": "absolute",
              "id2label": {"0": "a", "1": "b", "2": "c"}}
    kiln.manual_seed(0)
    src = kiln.models.create("bert-tiny-cls", set={"hidden_size": 64, "num_layers": 1, "num_heads": 4,
                                                   "intermediate_size": 96, "vocab_size": 40, "max_position": 32,
                                                   "num_labels": 3}).eval()
    folder = _hf_folder(tmp_path / "hf", src, config)
    ids = kiln.tensor(np.random.default_rng(0).integers(0, 40, (2, 7)))
    with kiln.no_grad():
        want = src(ids).numpy()
        got = kiln.models.from_pretrained(folder, model="bert-tiny-cls").eval()
        np.testing.assert_allclose(got(ids).numpy(), want, rtol=1e-5, atol=1e-6)
        # The config file alone builds the model (no weights loaded).
        assert len(kiln.models.from_pretrained(folder / "config.json", model="bert-tiny-cls").state_dict()) == \
            len(src.state_dict())
    for key, value, says in [("hidden_act", "gelu_new", 'hidden_act is "gelu_new"'),
                             ("position_embedding_type", "relative_key_query",
                              'position_embedding_type is "relative_key_query"'),
                             ("num_attention_heads", "4", 'num_attention_heads is "4", not a whole number')]:
        bad = _hf_folder(tmp_path / f"bad_{key}", src, {**config, key: value})
        with pytest.raises(kiln.KilnValueError, match=f"config.json: {says}"):
            kiln.models.from_pretrained(bad, model="bert-tiny-cls")
    with pytest.raises(kiln.KilnValueError, match="BERT models"):
        kiln.models.from_pretrained(folder, model="resnet20")
    # A bare encoder's folder: strict=False starts the new classifier and names it.
    enc = kiln.models.create("bert-tiny", set={"hidden_size": 64, "num_layers": 1, "num_heads": 4,
                                               "intermediate_size": 96, "vocab_size": 40, "max_position": 32})
    base = _hf_folder(tmp_path / "base", enc, config)
    with pytest.raises(kiln.KilnError, match="classifier"):
        kiln.models.from_pretrained(base, model="bert-tiny-cls")
    with pytest.warns(UserWarning, match="start from the initialisation: classifier"):
        kiln.models.from_pretrained(base, model="bert-tiny-cls", strict=False)


def test_deepcopy_of_a_zoo_model_leaves_out_the_grads():
    # As copy.deepcopy of a torch model (Parameter.__deepcopy__ drops .grad): a teacher or EMA copy
    # starts with no gradients.
    m = kiln.models.create("resnet20")
    m(kiln.randn(2, 3, 32, 32)).sum().backward()
    assert m.fc.weight.grad is not None
    c = copy.deepcopy(m)
    assert all(p.grad is None for p in c.parameters())
    assert m.fc.weight.grad is not None


def test_pickling_a_zoo_model_says_to_save_its_state_dict():
    m = kiln.models.create("resnet20")
    for what in (m, m.layer1[0]):
        with pytest.raises(TypeError, match=r"cannot pickle .*kiln.models.*state_dict\(\)"):
            pickle.dumps(what)
    # copy.copy, as torch's, is a shallow copy: a new wrapper sharing the C++ model and its tensors.
    for what in (m, m.layer1[0]):
        c = copy.copy(what)
        assert type(c) is type(what) and c is not what and c._c is what._c
        assert all(p is q for (_, p), (_, q) in zip(c.named_parameters(), what.named_parameters(), strict=True))
    x = kiln.randn(2, 3, 32, 32)
    m.eval()
    assert copy.copy(m)(x).tolist() == m(x).tolist()


def test_load_state_dict_assign_is_refused_for_a_zoo_model():
    # The C++ forward uses the model's own tensors: they cannot become the state dict's.
    m = kiln.models.create("resnet20")
    sd = m.state_dict()
    with pytest.raises(kiln.KilnError, match=r"assign=True.*built in C\+\+.*assign=False"):
        m.load_state_dict(sd, assign=True)
    parent = nn.Sequential(m)
    with pytest.raises(kiln.KilnError, match=r"assign=True.*built in C\+\+"):
        parent.load_state_dict(parent.state_dict(), assign=True)
    assert m.load_state_dict(sd) == ([], [])


@pytest.mark.filterwarnings("ignore:kiln.models.from_pretrained. ignored")  # said again by the refused loads
def test_from_pretrained_drops_a_pretraining_files_unused_heads_as_kiln_ckpt_import_does(tmp_path):
    # A BertForPreTraining file (HF names: the tied decoder, the pooler, the NSP head) loads into
    # bert-*-mlm with strict=True, the pooler and NSP head named in a warning, as `kiln ckpt import`
    # names them on stderr; a tensor the model has no place for otherwise is still refused.
    import json
    config = {"model_type": "bert", "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
              "intermediate_size": 48, "vocab_size": 30, "max_position_embeddings": 16, "hidden_dropout_prob": 0.0,
              "attention_probs_dropout_prob": 0.0}
    kiln.manual_seed(0)
    src = kiln.models.create("bert-tiny-mlm", set={"hidden_size": 32, "num_layers": 1, "num_heads": 2,
                                                   "intermediate_size": 48, "vocab_size": 30,
                                                   "max_position": 16}).eval()
    sd = dict(src.state_dict())
    assert "cls.predictions.decoder.weight" in sd  # Hugging Face's names
    rng = np.random.default_rng(0)
    heads = {"bert.pooler.dense.weight": (32, 32), "bert.pooler.dense.bias": (32,),
             "cls.seq_relationship.weight": (2, 32), "cls.seq_relationship.bias": (2,)}
    for k, shape in heads.items():
        sd[k] = kiln.tensor(rng.standard_normal(shape).astype(np.float32))

    def folder(name, tensors):
        path = tmp_path / name
        path.mkdir()
        (path / "config.json").write_text(json.dumps(config))
        kiln.save(tensors, str(path / "model.safetensors"))
        return path

    pre = folder("pretraining", sd)
    ids = kiln.tensor(rng.integers(0, 30, (2, 5)))
    with pytest.warns(UserWarning, match="ignored 4 tensors of .*model.safetensors that bert-tiny-mlm does not use: "
                      "bert.pooler.dense.bias, bert.pooler.dense.weight, cls.seq_relationship.bias"):
        got = kiln.models.from_pretrained(pre, model="bert-tiny-mlm", strict=True).eval()
    with kiln.no_grad():
        np.testing.assert_allclose(got(ids).numpy(), src(ids).numpy(), rtol=1e-5, atol=1e-6)
    # Not a head the model never uses: unexpected, and a tensor it needs: missing, both still refused.
    odd = folder("odd", {**sd, "bert.encoder.layer.7.output.dense.bias": kiln.zeros(32)})
    with pytest.raises(kiln.KilnError, match="bert.encoder.layer.7.output.dense.bias"):
        kiln.models.from_pretrained(odd, model="bert-tiny-mlm", strict=True)
    short = folder("short", {k: v for k, v in sd.items() if k != "cls.predictions.transform.dense.bias"})
    with pytest.raises(kiln.KilnError, match="cls.predictions.transform.dense.bias"):
        kiln.models.from_pretrained(short, model="bert-tiny-mlm", strict=True)


def test_a_resnet_state_dict_without_num_batches_tracked_loads_as_torch_loads_it():
    # torchvision's first ResNet weights predate PyTorch 0.4.1's num_batches_tracked: torch's strict
    # load starts each counter at 0, and so do `kiln eval` and kiln.models (a missing layer stays missing).
    tm = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
    r = kiln.models.create("resnet18", set={"num_classes": 3})
    for p in r.parameters():
        p.requires_grad_(False)
    r.layer1[0].bn1.num_batches_tracked.fill_(5)
    sd = {k: v for k, v in r.state_dict().items() if "num_batches_tracked" not in k}
    tsd = {k: v for k, v in tm.state_dict().items() if "num_batches_tracked" not in k}
    assert str(tm.load_state_dict(tsd)) == "<All keys matched successfully>"
    assert str(r.load_state_dict(sd)) == "<All keys matched successfully>"
    assert r.layer1[0].bn1.num_batches_tracked.item() == 0
    del sd["layer1.0.bn1.running_mean"]
    with pytest.raises(kiln.KilnError, match="layer1.0.bn1.running_mean"):
        r.load_state_dict(sd)
