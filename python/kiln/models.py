"""kiln.models: the model families of `kiln train` (ResNet, BERT), built in C++ with the same
names and --set overrides (set=):

    model = kiln.models.create("resnet20")                        # CIFAR-style ResNet-20
    model = kiln.models.create("resnet18", set={"num_classes": 100, "zero_init_residual": True})
    model = kiln.models.create("resnet20", set="num_classes=10,in_channels=1")
    bert = kiln.models.create("bert-tiny-mlm", set={"vocab_size": 3000})
    logits = model(images)                                         # [N, classes]
"""
import copy
from collections import OrderedDict

import numpy as np

from . import _C
from ._tensor import _a_type, tensor
from .nn.modules import CppModule, _state_tensors


def names():
    """Every model name kiln train takes."""
    return list(_C._model_names())


class ZooModel(CppModule):
    """A model of the zoo: call it with its inputs (positionally in input_names order, or by name);
    returns its "output" tensor (run() gives every output by name)."""

    def __init__(self, name, built, sets=(), deterministic=False):
        super().__init__(built.module)
        object.__setattr__(self, "_built", built)
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "_recipe", (list(sets), deterministic))

    def __deepcopy__(self, memo):
        # The C++ model cannot be copied member by member: build the same model again and copy into it
        # the weights, buffers, dtype, device, mode and which parameters are frozen (an EMA or teacher
        # copy, as copy.deepcopy of a torch model gives).
        sets, deterministic = self._recipe
        new = ZooModel(self.name, _C._create_model(self.name, sets, deterministic), sets, deterministic)
        memo[id(self)] = new
        params = dict(self.named_parameters())
        first = next(iter(params.values()), None)
        if first is not None:
            new.to(device=first.device, dtype=first.dtype)
        tied = self._tied_decoder()  # the decoder is the embeddings: copied once
        new.load_state_dict({k: v.detach().clone() for k, v in self.state_dict().items() if k not in tied})
        for k, p in new.named_parameters():
            old = params[k]
            if p.dtype != old.dtype:  # the C++ model converts as a whole
                raise _C.KilnError(f"copy.deepcopy({self.name}): its parameters have several dtypes ({k} is "
                                   f"{old.dtype}); copy a model of one dtype, or load its state_dict into a new one")
            p.requires_grad_(old.requires_grad)  # not .grad: torch's Parameter.__deepcopy__ drops it
        new.train(self.training)
        # As torch's deepcopy: an object copied with the model (a hook's state among them, so the
        # parameters are mapped before the hooks are copied) maps each parameter to the copy's, and
        # the copy keeps the hooks (the same functions; a handle deep-copied along follows the copy's).
        # A parameter or buffer copied before the model (copy.deepcopy([p, model])) is already in the
        # memo, and what was copied with it holds that copy: it becomes the new model's tensor (the
        # same object points at it), so, as torch's, the copy is the copied model's own.
        _map_copies(new, dict(self.named_parameters()), dict(new.named_parameters()), "_parameters", memo)
        _map_copies(new, dict(self.named_buffers()), dict(new.named_buffers()), "_buffers", memo)
        for hooks in ("_forward_pre_hooks", "_forward_hooks", "_backward_hooks", "_forward_pre_hooks_with_kwargs",
                      "_forward_hooks_with_kwargs", "_forward_hooks_always_called"):
            object.__setattr__(new, hooks, copy.deepcopy(getattr(self, hooks), memo))
        return new

    def state_dict(self, destination=None, prefix="", keep_vars=False):
        """As torch's, and for bert-*-mlm as Hugging Face's BertForMaskedLM: its decoder, tied to the
        word embeddings (and its bias to cls.predictions.bias), under its own names as well
        (cls.predictions.decoder.weight and .bias, the same tensors, after the head's transform)."""
        sd = super().state_dict(prefix=prefix, keep_vars=keep_vars)
        tied = self._tied_decoder(prefix)
        if tied:
            keys = list(sd)
            head = f"{prefix}cls.predictions."
            last = max(i for i, k in enumerate(keys) if k.startswith(head))
            out = OrderedDict()
            for i, k in enumerate(keys):
                out[k] = sd[k]
                if i == last:  # the decoder after the head's transform, as torch orders BertLMPredictionHead's
                    for alias, k_of in tied.items():
                        out[alias] = sd[k_of]
            sd = out
        if destination is None:
            return sd
        destination.update(sd)
        return destination

    def _tied_decoder(self, prefix=""):
        """{decoder name: the name of the tensor it is} for a masked-LM head, else {}."""
        names = self._c.state_dict()
        emb = next((k for k in names if k.endswith("embeddings.word_embeddings.weight")), None)
        if emb is None or "cls.predictions.bias" not in names:
            return {}
        return {f"{prefix}cls.predictions.decoder.weight": prefix + emb,
                f"{prefix}cls.predictions.decoder.bias": f"{prefix}cls.predictions.bias"}

    def _tied_names(self, prefix):
        return self._tied_decoder(prefix)

    def load_state_dict(self, state_dict, strict=True, assign=False):
        if assign:
            self._refuse_assign("load_state_dict(assign=True)")
        if hasattr(state_dict, "keys"):
            for k in state_dict.keys():
                if not isinstance(k, str):
                    raise TypeError(f"load_state_dict: key {k!r} is {_a_type(k)}, expected a str (the name of "
                                    f"a parameter or buffer of {self.name})")
            # A BERT checkpoint named as Hugging Face names it (BertForMaskedLM: the tied decoder weight,
            # "bert." on an encoder, gamma/beta, position_ids) loads as `kiln forward` loads it: the
            # same C++ normalisation, onto this model's names, which maps BERT names only for BERT
            # (another model's load stays strict about every name: a stray key is unexpected) and
            # starts a batch norm saved without num_batches_tracked (old torchvision weights) at 0,
            # as torch does. NumPy arrays and torch tensors are read as kiln tensors first.
            mine = self._c.state_dict()
            state_dict = _state_tensors(state_dict, mine, f"load_state_dict({self.name})")
            state_dict = _C._normalise_checkpoint_names(dict(state_dict), mine, f"load_state_dict({self.name})")
        return super().load_state_dict(state_dict, strict)

    @property
    def input_names(self):
        return list(self._built.input_names)

    def run(self, *args, **inputs):
        names = self.input_names
        if len(args) > len(names):
            raise _C.KilnValueError(f"{self.name} takes at most {len(names)} inputs ({', '.join(names)})")
        for n, a in zip(names, args):
            inputs[n] = a
        feed = {}
        for k, v in inputs.items():
            if v is None:
                continue
            if k not in names:
                raise _C.KilnValueError(f"{self.name}: unknown input '{k}' (inputs: {', '.join(names)})")
            if not isinstance(v, _C.Tensor):
                try:
                    v = tensor(v)  # an array-like: a copy, keeping a NumPy array's dtype
                except (ValueError, TypeError) as e:
                    raise TypeError(f"{self.name}: input '{k}' must be a kiln.Tensor or an array, got "
                                    f"{type(v).__name__} ({e})") from None
            if k == "input" and v.dtype.is_floating_point and _C.autocast_dtype() is None:
                # A ResNet's images in another float dtype than its weights (a float64 NumPy batch): refused
                # as torch's conv refuses it (the engine would promote and run in float64).
                w = next((p for p in self.parameters() if p.dtype.is_floating_point), None)
                if w is not None and w.dtype != v.dtype:
                    raise _C.KilnError(f"{self.name}: the input is {v.dtype.name} and the weights {w.dtype.name}; "
                                       f"they must have the same dtype, as in torch: convert the input "
                                       f"(x.to(kiln.{w.dtype.name})) or the model (.to(kiln.{v.dtype.name}))")
            feed[k] = v
        return dict(self._built.run(feed))

    def forward(self, *args, **inputs):
        return self.run(*args, **inputs)["output"]


def _map_copies(new, olds, news, store, memo):
    """Maps each of a model's tensors (olds, by name) to its copy's (news) in the deepcopy memo; one
    copied before the model is pointed at the copy's tensor and put in its place in the new tree."""
    swap = {}
    # What this deepcopy copied: copy.deepcopy keeps each original it copied alive in memo[id(memo)].
    # An entry the caller put in the memo (copy.deepcopy(model, {id(p): p}), torch's idiom to share p)
    # is not a copy: pointing it at the new tensor would change the caller's object (the original).
    copied = {id(o) for o in memo.get(id(memo), ())}
    for k, t in news.items():
        old = olds[k]
        earlier = memo.get(id(old), t)
        if earlier is t:
            memo[id(old)] = t
        elif id(old) in copied and isinstance(earlier, _C.Tensor):
            _C._rebind(earlier, t)
            swap[id(t)] = earlier
        else:
            # torch's copy would hold the caller's object itself; the C++ model can only hold its own.
            raise _C.KilnError(f"copy.deepcopy({new.name}): the memo gives '{k}' an object of the caller's "
                               f"({type(earlier).__name__}, to be shared rather than copied, as torch's copy would); "
                               "a kiln.models model's tensors are its C++ model's own and cannot be shared with "
                               "another model: copy the whole model, then load_state_dict what it should share")
    if swap:
        for m in new.modules():
            d = m.__dict__[store]
            for name, t in d.items():
                if id(t) in swap:
                    d[name] = swap[id(t)]


def _set_value(key, v, who="kiln.models.create"):
    """A set= dict value as the config parser reads it: bools as true/false (only the boolean
    fields take them), numbers as Python writes them."""
    if isinstance(v, (bool, np.bool_)):
        return "true" if v else "false"
    # NumPy scalars (a value read from an array, np.int64 from a config sweep) are numbers too: an
    # integer as Python writes it, a float as NumPy does, the shortest text in its own precision
    # (np.float32(0.1) is 0.1, not its double 0.10000000149011612).
    if isinstance(v, np.integer):
        return str(int(v))
    if isinstance(v, (int, float, str, np.floating)):
        return str(v)
    raise TypeError(f"{who}: set['{key}'] is {_a_type(v)}, expected a number or a bool")


def _sets_of(set, who="kiln.models.create"):  # noqa: A002
    """set= as the list of key=value strings the engine takes: a dict, one string of key=value
    pairs separated by commas, or an iterable of key=value strings; `who` begins the errors."""
    if set is None:
        return []
    if isinstance(set, dict):
        items = []
        for k, v in set.items():
            if not isinstance(k, str):
                raise TypeError(f"{who}: set= keys are config field names (str), got "
                                f"{type(k).__name__} {k!r}")
            items.append(f"{k}={_set_value(k, v, who)}")
        return items
    if isinstance(set, str):
        if not set.strip():
            return []
        items = [s.strip() for s in set.split(",")]
        if len(items) > 1 and not items[-1]:  # "a=1,b=2,": a trailing comma is fine, an empty pair is not
            items.pop()
    else:
        try:
            items = list(set)
        except TypeError:
            raise TypeError(f"{who}: set= takes a dict, a 'key=value' string or a list of them, got "
                            f"{type(set).__name__}") from None
        for s in items:
            if not isinstance(s, str):
                raise TypeError(f"{who}: set= items must be 'key=value' strings, got "
                                f"{type(s).__name__} {s!r}")
    for s in items:
        k, eq, _ = s.partition("=")
        if not eq or not k.strip():
            raise _C.KilnValueError(f"{who}: set= item {s!r} is not 'key=value'")
    return [s.strip() for s in items]


def from_pretrained(path, model, set=None, strict=True, deterministic=False):  # noqa: A002
    """A BERT model from a Hugging Face model folder (config.json, model.safetensors) or a config.json
    alone: kiln.models.create(model) with the config's sizes (hidden_size, num_hidden_layers,
    num_attention_heads, intermediate_size, vocab_size, max_position_embeddings, type_vocab_size,
    layer_norm_eps, the dropouts, num_labels or id2label's count), then `set` (which wins), then
    the folder's model.safetensors loaded with load_state_dict(strict=strict), less the heads the model
    never uses (a BertForPreTraining file's pooler and next-sentence head, named in a warning, as
    kiln ckpt import drops them: strict=True loads such a file). strict=False starts
    what the file lacks (a new classifier) from the initialisation, and warns naming it and what
    the file holds that the model does not use. What Kiln's BERT does not compute (hidden_act other
    than "gelu", position_embedding_type other than "absolute", ...) is a kiln.KilnValueError naming
    the key and value ("gelu_python" is "gelu": the same exact GELU). A set= that gives nothing
    ("", [], {}) is a kiln.KilnValueError, as in create."""
    import os
    import warnings

    from . import load

    if not isinstance(model, str) or not model.startswith("bert-"):
        raise _C.KilnValueError(f"kiln.models.from_pretrained: model must be one of the BERT models "
                                f"(bert-base-cls, ...), got {model!r}")
    path = os.fspath(path)
    config = os.path.join(path, "config.json") if os.path.isdir(path) else path
    try:
        sets = list(_C._hf_bert_config_sets(config))
    except _C.KilnError as e:
        raise _C.KilnValueError(f"kiln.models.from_pretrained: {e}") from None
    extra = _sets_of(set, "kiln.models.from_pretrained")
    if set is not None and not extra:  # as create(set=""): the config's own sizes would pass for the lost value
        raise _C.KilnValueError(f"kiln.models.from_pretrained: set={set!r} gives no override (leave it out, or "
                                f"None, for the config's own)")
    m = create(model, set=sets + extra, deterministic=deterministic)
    if os.path.isdir(path):
        weights = os.path.join(path, "model.safetensors")
        if not os.path.isfile(weights):
            # A model left at its initialisation without a word is what this function is against.
            raise _C.KilnValueError(f"kiln.models.from_pretrained: {path} has a config.json but no model.safetensors "
                                    f"(a pytorch_model.bin or sharded checkpoint: save it as one safetensors file; "
                                    f"or pass the config.json itself for a model without weights)")
        # As kiln ckpt import: the heads this model never uses (a BertForPreTraining file's pooler and
        # next-sentence head under bert-*-mlm, its cls.* heads under a classifier) are dropped, named in
        # a warning, so strict=True loads such a file; any other tensor the model lacks is still
        # unexpected, and one it needs still missing.
        mine = m._c.state_dict()
        given = _C._normalise_checkpoint_names(load(weights), mine, weights)
        given, dropped = _C._drop_unused_heads(m._c, given, weights, model)
        if dropped:
            warnings.warn(f"kiln.models.from_pretrained: {dropped}", stacklevel=2)
        res = m.load_state_dict(given, strict=strict)
        if res.missing_keys:
            warnings.warn(f"kiln.models.from_pretrained: {len(res.missing_keys)} tensors of {model} are not in "
                          f"{weights} and start from the initialisation: {', '.join(res.missing_keys)}", stacklevel=2)
        if res.unexpected_keys:
            warnings.warn(f"kiln.models.from_pretrained: {len(res.unexpected_keys)} tensors of {weights} are not "
                          f"used by {model}: {', '.join(res.unexpected_keys)}", stacklevel=2)
    return m


def create(name, set=None, deterministic=False):  # noqa: A002  (as the flag)
    """Builds a model by its kiln train name, with the overrides of `kiln train --set`: a dict
    ({"num_classes": 10, "zero_init_residual": True}), a "key=value" string (several separated by
    commas: "num_classes=10,in_channels=1") or a list of "key=value" strings. A bad name, field or
    value is a kiln.KilnValueError (a ValueError), as is a set= that gives nothing ("", " ", [], {},
    [""]): leave it out (None) for the model's own config."""
    if not isinstance(name, str):
        raise TypeError(f"kiln.models.create: the model name must be a str, got {type(name).__name__}")
    if name not in _C._model_names():
        raise _C.KilnValueError(f"kiln.models.create: unknown model {name!r} (expected one of "
                                f"{', '.join(_C._model_names())})")
    sets = _sets_of(set)
    if set is not None and not sets:  # as kiln.train(set=""): "no override" passing silently hides a lost value
        raise _C.KilnValueError(f"kiln.models.create: set={set!r} gives no override (leave it out, or None, for "
                                f"the model's own config)")
    try:
        built = _C._create_model(name, sets, deterministic)
    except _C.KilnError as e:
        # Building a model from its name and config fails on a bad field, value or range: the caller's
        # to fix. The config parser words its errors for the command line's --set flag.
        msg = str(e)
        if msg.startswith("--set "):
            msg = "set= " + msg[len("--set "):]
        raise _C.KilnValueError(f"kiln.models.create({name!r}): {msg}") from None
    return ZooModel(name, built, sets, deterministic)
