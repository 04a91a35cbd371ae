"""torch.nn's Transformer family: TransformerEncoderLayer, TransformerEncoder, TransformerDecoderLayer,
TransformerDecoder and Transformer, built on kiln.nn.MultiheadAttention with torch's parameter names,
shapes, initialisation and defaults, so a torch state_dict loads into them."""
import copy
import types

from .. import _C
from .._C import KilnValueError
from . import functional as F, init
from .layers import MultiheadAttention
from .modules import Module, Linear, LayerNorm, Dropout, ModuleList, _place


def _activation_fn(cls, activation):
    # torch's rule: "relu" / "gelu" by name, or any callable (a Module becomes a submodule)
    if isinstance(activation, str):
        if activation == "relu":
            return _relu
        if activation == "gelu":
            return _gelu
        raise KilnValueError(f"{cls}: activation should be relu/gelu, not {activation}")
    if not callable(activation):
        raise KilnValueError(f"{cls}: activation must be 'relu', 'gelu' or a callable, got {activation!r}")
    if isinstance(activation, Module) or isinstance(activation, types.FunctionType):
        return activation

    # an engine function (F.relu itself): copy.deepcopy, which TransformerEncoder uses, cannot copy those
    def act(x):
        return activation(x)

    act.__name__ = getattr(activation, "__name__", "activation")
    return act


def _relu(x):
    return F.relu(x)


def _gelu(x):
    return F.gelu(x)


def _clones(cls, layer, n):
    if not isinstance(layer, Module):
        raise KilnValueError(f"{cls}: the layer to repeat must be a kiln.nn.Module, got {type(layer).__name__}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise KilnValueError(f"{cls}: num_layers must be an int >= 0, got {n!r}")
    return ModuleList([copy.deepcopy(layer) for _ in range(n)])


def _causal_flag(is_causal, mask, size):
    # torch's _detect_is_causal_mask: None means "True when the mask is the causal mask"
    if is_causal is not None:
        return bool(is_causal)
    if mask is None:
        return False
    size = size if size is not None else mask.shape[-2]
    if tuple(mask.shape) != (size, size) or not mask.is_floating_point():
        return False
    causal = Transformer.generate_square_subsequent_mask(size, device=mask.device, dtype=mask.dtype)
    return bool((mask == causal).all().item())


def _seq_len(x, batch_first):
    if x.dim() == 2:  # unbatched [S, E]
        return x.shape[0]
    return x.shape[1 if batch_first else 0]


def _attention_layer(layer, who, blocks, d_model, dim_feedforward, dropout, activation, layer_norm_eps, batch_first,
                     norm_first, bias):
    """The parts torch's encoder and decoder layers share, registered in torch's order (so state dict keys
    and parameter order are torch's): the feed-forward block (linear1, dropout, linear2), norm_first, one
    norm<i> and dropout<i> per residual block, the activation and batch_first."""
    layer.linear1 = Linear(d_model, dim_feedforward, bias=bias)
    layer.dropout = Dropout(dropout)
    layer.linear2 = Linear(dim_feedforward, d_model, bias=bias)
    layer.norm_first = norm_first
    for i in range(1, blocks + 1):
        setattr(layer, f"norm{i}", LayerNorm(d_model, eps=layer_norm_eps, bias=bias))
    for i in range(1, blocks + 1):
        setattr(layer, f"dropout{i}", Dropout(dropout))
    layer.activation = _activation_fn(who, activation)
    layer.batch_first = batch_first


class TransformerEncoderLayer(Module):
    """torch.nn.TransformerEncoderLayer: self_attn (MultiheadAttention), linear1 -> activation ->
    dropout -> linear2, norm1/norm2 (post-norm, or pre-norm with norm_first), dropout1/dropout2.
    Computed the same way with every input (torch's inference fast path is an implementation detail
    of torch; its results agree)."""

    def __init__(self, d_model, nhead, dim_feedforward=2048, dropout=0.1, activation="relu", layer_norm_eps=1e-5,
                 batch_first=False, norm_first=False, bias=True, device=None, dtype=None):
        super().__init__()
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias, batch_first=batch_first)
        _attention_layer(self, "TransformerEncoderLayer", 2, d_model, dim_feedforward, dropout, activation,
                         layer_norm_eps, batch_first, norm_first, bias)
        _place(self, device, dtype)

    def forward(self, src, src_mask=None, src_key_padding_mask=None, is_causal=False):
        x = src
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), src_mask, src_key_padding_mask, is_causal)
            x = x + self._ff_block(self.norm2(x))
        else:
            x = self.norm1(x + self._sa_block(x, src_mask, src_key_padding_mask, is_causal))
            x = self.norm2(x + self._ff_block(x))
        return x

    def _sa_block(self, x, attn_mask, key_padding_mask, is_causal=False):
        x = self.self_attn(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask, need_weights=False,
                           is_causal=is_causal)[0]
        return self.dropout1(x)

    def _ff_block(self, x):
        return self.dropout2(self.linear2(self.dropout(self.activation(self.linear1(x)))))


class TransformerDecoderLayer(Module):
    """torch.nn.TransformerDecoderLayer: self_attn over the target, multihead_attn over the memory
    (the encoder's output), then the feed-forward block; norm1..norm3 and dropout1..dropout3."""

    def __init__(self, d_model, nhead, dim_feedforward=2048, dropout=0.1, activation="relu", layer_norm_eps=1e-5,
                 batch_first=False, norm_first=False, bias=True, device=None, dtype=None):
        super().__init__()
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias, batch_first=batch_first)
        self.multihead_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias, batch_first=batch_first)
        _attention_layer(self, "TransformerDecoderLayer", 3, d_model, dim_feedforward, dropout, activation,
                         layer_norm_eps, batch_first, norm_first, bias)
        _place(self, device, dtype)

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, tgt_is_causal=False, memory_is_causal=False):
        x = tgt
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), tgt_mask, tgt_key_padding_mask, tgt_is_causal)
            x = x + self._mha_block(self.norm2(x), memory, memory_mask, memory_key_padding_mask, memory_is_causal)
            x = x + self._ff_block(self.norm3(x))
        else:
            x = self.norm1(x + self._sa_block(x, tgt_mask, tgt_key_padding_mask, tgt_is_causal))
            x = self.norm2(x + self._mha_block(x, memory, memory_mask, memory_key_padding_mask, memory_is_causal))
            x = self.norm3(x + self._ff_block(x))
        return x

    def _sa_block(self, x, attn_mask, key_padding_mask, is_causal=False):
        x = self.self_attn(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask, need_weights=False,
                           is_causal=is_causal)[0]
        return self.dropout1(x)

    def _mha_block(self, x, mem, attn_mask, key_padding_mask, is_causal=False):
        x = self.multihead_attn(x, mem, mem, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                                need_weights=False, is_causal=is_causal)[0]
        return self.dropout2(x)

    def _ff_block(self, x):
        return self.dropout3(self.linear2(self.dropout(self.activation(self.linear1(x)))))


class TransformerEncoder(Module):
    """torch.nn.TransformerEncoder: num_layers deep copies of encoder_layer (layers.0, layers.1, ...)
    and an optional final norm. enable_nested_tensor and mask_check are accepted for torch's
    signature; Kiln computes padded positions as ordinary ones (torch's nested-tensor fast path, in
    eval mode with a src_key_padding_mask, gives 0 at the padded positions instead)."""

    def __init__(self, encoder_layer, num_layers, norm=None, enable_nested_tensor=True, mask_check=True):
        super().__init__()
        self.layers = _clones("TransformerEncoder", encoder_layer, num_layers)
        self.num_layers = num_layers
        self.norm = norm
        self.enable_nested_tensor, self.mask_check = enable_nested_tensor, mask_check

    def forward(self, src, mask=None, src_key_padding_mask=None, is_causal=None):
        batch_first = getattr(self.layers[0], "batch_first", False) if len(self.layers) else False
        is_causal = _causal_flag(is_causal, mask, _seq_len(src, batch_first))
        out = src
        for mod in self.layers:
            out = mod(out, src_mask=mask, is_causal=is_causal, src_key_padding_mask=src_key_padding_mask)
        if self.norm is not None:
            out = self.norm(out)
        return out


class TransformerDecoder(Module):
    """torch.nn.TransformerDecoder: num_layers deep copies of decoder_layer and an optional final norm."""

    def __init__(self, decoder_layer, num_layers, norm=None):
        super().__init__()
        self.layers = _clones("TransformerDecoder", decoder_layer, num_layers)
        self.num_layers = num_layers
        self.norm = norm

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, tgt_is_causal=None, memory_is_causal=False):
        batch_first = getattr(self.layers[0], "batch_first", False) if len(self.layers) else False
        tgt_is_causal = _causal_flag(tgt_is_causal, tgt_mask, _seq_len(tgt, batch_first))
        out = tgt
        for mod in self.layers:
            out = mod(out, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                      tgt_key_padding_mask=tgt_key_padding_mask, memory_key_padding_mask=memory_key_padding_mask,
                      tgt_is_causal=tgt_is_causal, memory_is_causal=memory_is_causal)
        if self.norm is not None:
            out = self.norm(out)
        return out


class Transformer(Module):
    """torch.nn.Transformer: encoder (TransformerEncoder with a final LayerNorm) and decoder
    (TransformerDecoder with a final LayerNorm), or custom_encoder / custom_decoder; every parameter
    of two or more dimensions starts xavier-uniform, as torch's _reset_parameters."""

    def __init__(self, d_model=512, nhead=8, num_encoder_layers=6, num_decoder_layers=6, dim_feedforward=2048,
                 dropout=0.1, activation="relu", custom_encoder=None, custom_decoder=None, layer_norm_eps=1e-5,
                 batch_first=False, norm_first=False, bias=True, device=None, dtype=None):
        super().__init__()
        if custom_encoder is not None:
            self.encoder = custom_encoder
        else:
            layer = TransformerEncoderLayer(d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps,
                                            batch_first, norm_first, bias)
            self.encoder = TransformerEncoder(layer, num_encoder_layers,
                                              LayerNorm(d_model, eps=layer_norm_eps, bias=bias))
        if custom_decoder is not None:
            self.decoder = custom_decoder
        else:
            layer = TransformerDecoderLayer(d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps,
                                            batch_first, norm_first, bias)
            self.decoder = TransformerDecoder(layer, num_decoder_layers,
                                              LayerNorm(d_model, eps=layer_norm_eps, bias=bias))
        self._reset_parameters()
        self.d_model, self.nhead, self.batch_first = d_model, nhead, batch_first
        _place(self, device, dtype)

    def _reset_parameters(self):
        for p in self.parameters():
            if p.dim() > 1:  # as torch's
                init.xavier_uniform_(p)

    @staticmethod
    def generate_square_subsequent_mask(sz, device=None, dtype=None):
        """The [sz, sz] causal mask: -inf above the diagonal (a position may not attend later ones), 0
        elsewhere; float32 unless dtype says otherwise."""
        mask = _C.full([sz, sz], float("-inf"), dtype=dtype if dtype is not None else _C.dtype.float32)
        mask = mask.triu(1)
        return mask if device is None else mask.to(device)

    def forward(self, src, tgt, src_mask=None, tgt_mask=None, memory_mask=None, src_key_padding_mask=None,
                tgt_key_padding_mask=None, memory_key_padding_mask=None, src_is_causal=None, tgt_is_causal=None,
                memory_is_causal=False):
        is_batched = src.dim() == 3
        if not self.batch_first and src.shape[1] != tgt.shape[1] and is_batched:
            raise KilnValueError(f"Transformer: the batch number of src ({src.shape[1]}) and tgt ({tgt.shape[1]}) "
                                 "must be equal")
        if self.batch_first and src.shape[0] != tgt.shape[0] and is_batched:
            raise KilnValueError(f"Transformer: the batch number of src ({src.shape[0]}) and tgt ({tgt.shape[0]}) "
                                 "must be equal")
        if src.shape[-1] != self.d_model or tgt.shape[-1] != self.d_model:
            raise KilnValueError(f"Transformer: the feature number of src ({src.shape[-1]}) and tgt "
                                 f"({tgt.shape[-1]}) must be equal to d_model ({self.d_model})")
        memory = self.encoder(src, mask=src_mask, src_key_padding_mask=src_key_padding_mask,
                              is_causal=src_is_causal)
        return self.decoder(tgt, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                            tgt_key_padding_mask=tgt_key_padding_mask,
                            memory_key_padding_mask=memory_key_padding_mask, tgt_is_causal=tgt_is_causal,
                            memory_is_causal=memory_is_causal)
