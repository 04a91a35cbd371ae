"""kiln.nn's recurrent layers: torch.nn's RNN (tanh or relu), LSTM (proj_size too) and GRU, and their
cells RNNCell, LSTMCell and GRUCell, built from Kiln's ops so that autograd differentiates them. Per
layer and direction one matmul projects every time step's input (x W_ih^T + b_ih, for an RNN or LSTM
with b_hh added there too), then each step adds h W_hh^T and applies torch's gates: LSTM i, f, g, o
(c' = f c + i g, h' = o tanh(c'), times W_hr^T with proj_size); GRU r, z, n with
n = tanh(W_in x + b_in + r (W_hn h + b_hn)) and h' = (1 - z) n + z h. Parameter names, shapes and
initialisation (uniform in +-1/sqrt(hidden_size)) are torch's, so a torch state dict loads as it is.
Input: [T, N, H_in] ([N, T, H_in] with batch_first; [T, H_in] unbatched) or a PackedSequence
(kiln.nn.utils.rnn), whose steps are run for the sequences that have them, each sequence's h_n taken
at its own last step."""
import math
import numbers
import operator
import warnings

from .. import _C
from .._C import Tensor, KilnError, KilnValueError
from .._tensor import _a_type
from ..autograd import Function
from . import functional as F
from .modules import Module, Parameter, _uniform, _place
from .utils.rnn import PackedSequence

__all__ = ["RNNBase", "RNN", "LSTM", "GRU", "RNNCellBase", "RNNCell", "LSTMCell", "GRUCell"]

_GATES = {"RNN_TANH": 1, "RNN_RELU": 1, "LSTM": 4, "GRU": 3}


def _size(cls, name, value, minimum):
    """torch's checks of a size argument: an int (NumPy's too, not a bool), at least minimum."""
    try:
        n = operator.index(value)
    except TypeError:
        n = None
    if isinstance(value, bool) or n is None:
        raise TypeError(f"{cls}: {name} should be of type int, got: {type(value).__name__}")
    if n < minimum:
        raise KilnValueError(f"{cls}: {name} must be greater than zero" if minimum == 1 else
                             f"{cls}: {name} should be a positive integer or zero to disable projections")
    return n


def _nonlinearity(cls, nonlinearity):
    if nonlinearity not in ("tanh", "relu"):
        raise KilnValueError(f"{cls}: Unknown nonlinearity '{nonlinearity}'. Select from 'tanh' or 'relu'.")
    return nonlinearity


class _Unbind(Function):
    """x's rows cut into consecutive blocks of the given sizes (one per time step), as one node of
    the graph: its backward stacks the steps' gradients (zeros for a step none reached) into one
    gradient for x. Slicing x per step instead gives a node per step whose backward builds a gradient
    of x's full size, so a backward over T steps cost O(T^2)."""

    @staticmethod
    def forward(ctx, x, sizes):
        ctx.shape, ctx.dtype, ctx.device = tuple(x.shape), x.dtype, x.device
        ctx.sizes = sizes
        out, at = [], 0
        for b in sizes:
            # a copy, not a view: slicing a view of x (the gates) would again give a gradient of x's size
            out.append(x[at:at + b].clone())
            at += b
        return tuple(out)

    @staticmethod
    def backward(ctx, *grads):
        tail = ctx.shape[1:]
        parts = [g if g is not None else _C.zeros(b, *tail, dtype=ctx.dtype, device=ctx.device)
                 for g, b in zip(grads, ctx.sizes)]
        return _C.cat(parts, 0), None


def _unbind_steps(x, sizes):
    """x [sum(sizes), *] as a list of its steps' blocks: copies from one autograd node for all of them
    when x needs a gradient and grad mode is on, else views of x."""
    if not sizes:
        return []
    if len(sizes) == 1:
        return [x]
    if not (x.requires_grad and _C.is_grad_enabled()):
        # no gradient will flow back (no_grad, or nothing needs one): plain views, no copies
        out, at = [], 0
        for b in sizes:
            out.append(x[at:at + b])
            at += b
        return out
    return list(_Unbind.apply(x, tuple(sizes)))


def _step(mode, g, h, c, w_hh, b_hh, w_hr, hidden):
    """One time step: g is the input's projection for this step ([n, gates * hidden]; for RNN and LSTM
    with both biases in it when b_hh is None), h [n, hidden or proj_size], c [n, hidden] (LSTM).
    Returns the new (h, c)."""
    if mode == "GRU":
        gh = F.linear(h, w_hh, b_hh)
        rz = _C.sigmoid(g[:, :2 * hidden] + gh[:, :2 * hidden])
        r, z = rz[:, :hidden], rz[:, hidden:]
        n = _C.tanh(g[:, 2 * hidden:] + r * gh[:, 2 * hidden:])
        return n + z * (h - n), None
    gates = g + F.linear(h, w_hh, b_hh)
    if mode == "RNN_TANH":
        return _C.tanh(gates), None
    if mode == "RNN_RELU":
        return _C.relu(gates), None
    s = _C.sigmoid(gates)
    i, f, o = s[:, :hidden], s[:, hidden:2 * hidden], s[:, 3 * hidden:]
    c = f * c + i * _C.tanh(gates[:, 2 * hidden:3 * hidden])
    h = o * _C.tanh(c)
    if w_hr is not None:
        h = F.linear(h, w_hr)
    return h, c


def _dtype_name(dtype):
    return f"kiln.{dtype.name}"


class RNNBase(Module):
    """What RNN, LSTM and GRU share (torch's RNNBase): the parameters weight_ih_l{k}, weight_hh_l{k},
    bias_ih_l{k}, bias_hh_l{k} (and weight_hr_l{k} with proj_size), "_reverse" for the second direction,
    registered in torch's order; forward over padded or packed input."""

    def __init__(self, mode, input_size, hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0,
                 bidirectional=False, proj_size=0, device=None, dtype=None):
        super().__init__()
        cls = type(self).__name__
        if mode not in _GATES:
            raise KilnValueError(f"{cls}: Unrecognized RNN mode: {mode}")
        self.mode = mode
        self.input_size = _size(cls, "input_size", input_size, 0)
        self.hidden_size = _size(cls, "hidden_size", hidden_size, 1)
        self.num_layers = _size(cls, "num_layers", num_layers, 1)
        self.proj_size = _size(cls, "proj_size", proj_size, 0)
        self.bias, self.batch_first, self.bidirectional = bool(bias), bool(batch_first), bool(bidirectional)
        if isinstance(dropout, bool) or not isinstance(dropout, numbers.Number) or not 0 <= dropout <= 1:
            raise KilnValueError(f"{cls}: dropout should be a number in range [0, 1] representing the probability of "
                                 "an element being zeroed")
        self.dropout = float(dropout)
        if dropout > 0 and self.num_layers == 1:
            warnings.warn("dropout option adds dropout after all but last recurrent layer, so non-zero dropout "
                          f"expects num_layers greater than 1, but got dropout={dropout} and num_layers=1",
                          stacklevel=2)
        if self.proj_size and mode != "LSTM":
            raise KilnValueError(f"{cls}: proj_size argument is only supported for LSTM, not RNN or GRU")
        if self.proj_size >= self.hidden_size:
            raise KilnValueError(f"{cls}: proj_size has to be smaller than hidden_size")
        gate_size = _GATES[mode] * self.hidden_size
        real_hidden = self.proj_size or self.hidden_size
        directions = 2 if self.bidirectional else 1
        bound = 1.0 / math.sqrt(self.hidden_size)  # torch's reset_parameters
        self._flat_weights_names, self._all_weights = [], []
        for layer in range(self.num_layers):
            for direction in range(directions):
                layer_input = self.input_size if layer == 0 else real_hidden * directions
                shapes = [("weight_ih", (gate_size, layer_input)), ("weight_hh", (gate_size, real_hidden))]
                if self.bias:
                    shapes += [("bias_ih", (gate_size,)), ("bias_hh", (gate_size,))]
                if self.proj_size:
                    shapes.append(("weight_hr", (self.proj_size, self.hidden_size)))
                names = []
                for kind, shape in shapes:
                    name = f"{kind}_l{layer}{'_reverse' if direction else ''}"
                    setattr(self, name, Parameter(_uniform(shape, bound)))
                    names.append(name)
                self._flat_weights_names.extend(names)
                self._all_weights.append(names)
        _place(self, device, dtype)

    @property
    def all_weights(self):
        """torch's all_weights: each layer and direction's parameters, in their order."""
        return [[getattr(self, name) for name in names] for names in self._all_weights]

    @property
    def _flat_weights(self):
        return [getattr(self, name) for name in self._flat_weights_names]

    def flatten_parameters(self):
        """torch's cuDNN weight compaction: nothing to do in Kiln (each weight is its own tensor)."""

    def _weights(self, layer, direction):
        suffix = f"_l{layer}{'_reverse' if direction else ''}"
        get = (lambda kind: getattr(self, kind + suffix, None))  # noqa: E731
        return (get("weight_ih"), get("weight_hh"), get("bias_ih") if self.bias else None,
                get("bias_hh") if self.bias else None, get("weight_hr") if self.proj_size else None)

    def _hidden(self, hx, batched, batch, dtype, device, sorted_indices):
        """(h_0, c_0) as [layers * directions, batch, size] tensors (c_0 None but for LSTM): zeros for
        hx=None, else hx checked as torch checks it (count of dims, shape, dtype) and, for packed input,
        put in the packed batch order."""
        cls = type(self).__name__
        count = self.num_layers * (2 if self.bidirectional else 1)
        h_shape = (count, batch, self.proj_size or self.hidden_size)
        c_shape = (count, batch, self.hidden_size)
        lstm = self.mode == "LSTM"
        if hx is None:
            zeros = (lambda shape: _C.zeros(*shape, dtype=dtype, device=device))  # noqa: E731
            return zeros(h_shape), (zeros(c_shape) if lstm else None)
        if lstm:
            if not isinstance(hx, (tuple, list)) or len(hx) != 2:
                raise TypeError(f"{cls}: hx must be a tuple (h_0, c_0) of two tensors, got {_a_type(hx)}")
            states, names, shapes = list(hx), ("hx[0] (h_0)", "hx[1] (c_0)"), (h_shape, c_shape)
        else:
            states, names, shapes = [hx], ("hx",), (h_shape,)
        for i, (t, name) in enumerate(zip(states, names)):
            if not isinstance(t, Tensor):
                raise TypeError(f"{cls}: {name} must be a kiln.Tensor, got {_a_type(t)}")
            if t.device != device:
                raise KilnError(f"{cls}: Input and hidden tensors are not at the same device, found input tensor at "
                                f"{device} and hidden tensor ({name}) at {t.device}")
            want = 3 if batched else 2
            if t.dim() != want:
                which = "hx and cx" if lstm else "hx"
                what = "batched 3-D" if batched else "unbatched 2-D"
                raise KilnValueError(f"{cls}: For {what} input, {which} should also be {want}-D but got "
                                     f"{name} {t.dim()}-D")
            if not batched:
                t = t.unsqueeze(1)
            if sorted_indices is not None:
                if t.shape[1] != batch:
                    raise KilnValueError(f"{cls}: Expected {'hidden[%d]' % i if lstm else 'hidden'} size "
                                         f"{shapes[i]}, got {list(t.shape)}")
                t = t.index_select(1, sorted_indices)
            if tuple(t.shape) != shapes[i]:
                shown = list(t.shape) if batched else [t.shape[0], t.shape[2]]
                want_shape = shapes[i] if batched else (shapes[i][0], shapes[i][2])
                raise KilnValueError(f"{cls}: Expected {'hidden[%d]' % i if lstm else 'hidden'} size "
                                     f"{want_shape}, got {shown}")
            if t.dtype != dtype:
                raise KilnValueError(f"{cls}: {name} dtype ({_dtype_name(t.dtype)}) does not match the input's and "
                                     f"weights' ({_dtype_name(dtype)})")
            states[i] = t
        return states[0], (states[1] if lstm else None)

    def _direction(self, x, batch_sizes, weights, h, c, reverse):
        """One layer and direction over packed rows x [sum(batch_sizes), size]: the input projection in
        one matmul, then a step per time step on the sequences that have it. Returns the outputs (packed
        rows) and each sequence's final h and c (at its own last step)."""
        w_ih, w_hh, b_ih, b_hh, w_hr = weights
        mode, hidden = self.mode, self.hidden_size
        if mode != "GRU" and b_ih is not None:  # r (W_hn h + b_hn) keeps GRU's b_hh in the step
            b_ih, b_hh = b_ih + b_hh, None
        steps = len(batch_sizes)
        projected = _unbind_steps(F.linear(x, w_ih, b_ih), batch_sizes)  # one node, not a slice per step
        outputs = [None] * steps
        if not reverse:
            finished_h, finished_c = [], []
            for t in range(steps):
                b = batch_sizes[t]
                if b < h.shape[0]:  # the sequences past b ended at the previous step
                    finished_h.append(h[b:])
                    h = h[:b]
                    if c is not None:
                        finished_c.append(c[b:])
                        c = c[:b]
                h, c = _step(mode, projected[t], h, c, w_hh, b_hh, w_hr, hidden)
                outputs[t] = h
            if finished_h:
                h = _C.cat([h] + finished_h[::-1], 0)
                if c is not None:
                    c = _C.cat([c] + finished_c[::-1], 0)
        else:
            h0, c0 = h, c
            alive = batch_sizes[-1] if steps else 0
            h = h0[:alive]
            c = c0[:alive] if c0 is not None else None
            for t in reversed(range(steps)):
                b = batch_sizes[t]
                if b > alive:  # sequences whose last step is t start here, from their h_0
                    h = _C.cat([h, h0[alive:b]], 0)
                    if c is not None:
                        c = _C.cat([c, c0[alive:b]], 0)
                    alive = b
                h, c = _step(mode, projected[t], h, c, w_hh, b_hh, w_hr, hidden)
                outputs[t] = h
        return _C.cat(outputs, 0), h, c

    def forward(self, input, hx=None):
        cls = type(self).__name__
        packed = isinstance(input, PackedSequence)
        if packed:
            x, sorted_indices, unsorted_indices = input.data, input.sorted_indices, input.unsorted_indices
            batch_sizes = [int(b) for b in input.batch_sizes.tolist()]
            batched, batch = True, (batch_sizes[0] if batch_sizes else 0)
            if x.dim() != 2:
                raise KilnValueError(f"{cls}: a PackedSequence's data must be 2-D [steps, input_size], got shape "
                                     f"{list(x.shape)}")
        else:
            if not isinstance(input, Tensor):
                raise TypeError(f"{cls}: input must be a kiln.Tensor or a PackedSequence, got {_a_type(input)}")
            if input.dim() not in (2, 3):
                raise KilnValueError(f"{cls}: Expected input to be 2D or 3D, got {input.dim()}D instead")
            batched = input.dim() == 3
            x = input if batched else input.unsqueeze(1)
            if batched and self.batch_first:
                x = x.transpose(0, 1)
            steps, batch = x.shape[0], x.shape[1]
            if steps == 0:
                raise KilnValueError(f"{cls}: Expected sequence length to be larger than 0 in RNN")
            batch_sizes, sorted_indices, unsorted_indices = [batch] * steps, None, None
        if x.shape[-1] != self.input_size:
            raise KilnValueError(f"{cls}: input.size(-1) must be equal to input_size. Expected {self.input_size}, got "
                                 f"{x.shape[-1]}")
        dtype = self.weight_ih_l0.dtype
        if x.dtype != dtype:
            raise KilnValueError(f"{cls}: input dtype ({_dtype_name(x.dtype)}) does not match weight dtype "
                                 f"({_dtype_name(dtype)}). Convert input: input.to({_dtype_name(dtype)}), or convert "
                                 f"model: model.to({_dtype_name(x.dtype)})")
        h0, c0 = self._hidden(hx, batched, batch, dtype, x.device, sorted_indices)
        if not packed:
            x = x.reshape(x.shape[0] * batch, self.input_size)  # the time-major rows: packed with equal sizes
        directions = 2 if self.bidirectional else 1
        h_n, c_n = [], []
        for layer in range(self.num_layers):
            outputs = []
            for direction in range(directions):
                k = layer * directions + direction
                out, h, c = self._direction(x, batch_sizes, self._weights(layer, direction), h0[k],
                                            c0[k] if c0 is not None else None, direction == 1)
                outputs.append(out)
                h_n.append(h)
                c_n.append(c)
            x = outputs[0] if directions == 1 else _C.cat(outputs, 1)
            if self.dropout and self.training and layer < self.num_layers - 1:
                x = F.dropout(x, self.dropout, True)
        h_n = _C.stack(h_n, 0)
        c_n = _C.stack(c_n, 0) if self.mode == "LSTM" else None
        if packed:
            if unsorted_indices is not None:
                h_n = h_n.index_select(1, unsorted_indices)
                c_n = c_n.index_select(1, unsorted_indices) if c_n is not None else None
            output = PackedSequence(x, input.batch_sizes, sorted_indices, unsorted_indices)
        else:
            output = x.reshape(len(batch_sizes), batch, x.shape[-1])
            if not batched:
                output, h_n = output.squeeze(1), h_n.squeeze(1)
                c_n = c_n.squeeze(1) if c_n is not None else None
            elif self.batch_first:
                output = output.transpose(0, 1)
        return (output, (h_n, c_n)) if self.mode == "LSTM" else (output, h_n)

    def extra_repr(self):
        s = f"{self.input_size}, {self.hidden_size}"
        if self.proj_size:
            s += f", proj_size={self.proj_size}"
        if self.num_layers != 1:
            s += f", num_layers={self.num_layers}"
        if not self.bias:
            s += ", bias=False"
        if self.batch_first:
            s += ", batch_first=True"
        if self.dropout:
            s += f", dropout={self.dropout}"
        if self.bidirectional:
            s += ", bidirectional=True"
        return s


class RNN(RNNBase):
    """torch.nn.RNN: h' = tanh(x W_ih^T + b_ih + h W_hh^T + b_hh) (nonlinearity="relu": relu). The
    arguments in torch's positional order (RNNBase's, nonlinearity fourth); proj_size is taken only to
    refuse it with torch's message, as GRU's."""

    def __init__(self, input_size, hidden_size, num_layers=1, nonlinearity="tanh", bias=True, batch_first=False,
                 dropout=0.0, bidirectional=False, proj_size=0, device=None, dtype=None):
        _nonlinearity("RNN", nonlinearity)
        super().__init__("RNN_TANH" if nonlinearity == "tanh" else "RNN_RELU", input_size, hidden_size, num_layers,
                         bias, batch_first, dropout, bidirectional, proj_size, device, dtype)
        self.nonlinearity = nonlinearity


class LSTM(RNNBase):
    """torch.nn.LSTM: returns (output, (h_n, c_n)); proj_size > 0 projects h by weight_hr_l{k}."""

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0,
                 bidirectional=False, proj_size=0, device=None, dtype=None):
        super().__init__("LSTM", input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional,
                         proj_size, device, dtype)


class GRU(RNNBase):
    """torch.nn.GRU (gates r, z, n in torch's order and form); the arguments in torch's positional order
    (RNNBase's: proj_size, refused, before device and dtype)."""

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0,
                 bidirectional=False, proj_size=0, device=None, dtype=None):
        super().__init__("GRU", input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional,
                         proj_size, device, dtype)


class RNNCellBase(Module):
    """What the cells share: weight_ih [gates * hidden, input], weight_hh [gates * hidden, hidden],
    bias_ih and bias_hh (torch's names and init); input [N, input_size] or [input_size] unbatched."""

    def __init__(self, input_size, hidden_size, bias, num_chunks, device=None, dtype=None):
        super().__init__()
        cls = type(self).__name__
        self.input_size = _size(cls, "input_size", input_size, 0)
        self.hidden_size = _size(cls, "hidden_size", hidden_size, 1)
        self.bias = bool(bias)
        bound = 1.0 / math.sqrt(self.hidden_size)
        self.weight_ih = Parameter(_uniform((num_chunks * self.hidden_size, self.input_size), bound))
        self.weight_hh = Parameter(_uniform((num_chunks * self.hidden_size, self.hidden_size), bound))
        if self.bias:
            self.bias_ih = Parameter(_uniform((num_chunks * self.hidden_size,), bound))
            self.bias_hh = Parameter(_uniform((num_chunks * self.hidden_size,), bound))
        else:
            self.register_parameter("bias_ih", None)
            self.register_parameter("bias_hh", None)
        _place(self, device, dtype)

    def _run(self, mode, input, states):
        """Checks input and the states (h, or h and c; None: zeros) as torch does, runs one step;
        returns the new states and whether the input was batched."""
        cls = type(self).__name__
        if not isinstance(input, Tensor):
            raise TypeError(f"{cls}: input must be a kiln.Tensor, got {_a_type(input)}")
        if input.dim() not in (1, 2):
            raise KilnValueError(f"{cls}: Expected input to be 1D or 2D, got {input.dim()}D instead")
        batched = input.dim() == 2
        x = input if batched else input.unsqueeze(0)
        if x.shape[1] != self.input_size:
            raise KilnValueError(f"{cls}: input has inconsistent input_size: got {x.shape[1]} expected "
                                 f"{self.input_size}")
        dtype = self.weight_ih.dtype
        if x.dtype != dtype:
            raise KilnValueError(f"{cls}: input dtype ({_dtype_name(x.dtype)}) does not match weight dtype "
                                 f"({_dtype_name(dtype)})")
        checked = []
        for i, t in enumerate(states):
            name = f"hx[{i}]" if len(states) > 1 else "hx"
            if t is None:
                checked.append(_C.zeros(x.shape[0], self.hidden_size, dtype=dtype, device=x.device))
                continue
            if not isinstance(t, Tensor):
                raise TypeError(f"{cls}: {name} must be a kiln.Tensor, got {_a_type(t)}")
            if t.dim() not in (1, 2):
                raise KilnValueError(f"{cls}: Expected hidden to be 1D or 2D, got {t.dim()}D instead")
            if t.dim() != input.dim():
                raise KilnValueError(f"{cls}: {name} is {t.dim()}-D but the input is {input.dim()}-D; for "
                                     f"{'batched 2-D' if batched else 'unbatched 1-D'} input it must be "
                                     f"{input.dim()}-D too")
            t = t if batched else t.unsqueeze(0)
            if t.shape[0] != x.shape[0]:
                raise KilnValueError(f"{cls}: Input batch size {x.shape[0]} doesn't match hidden{i} batch size "
                                     f"{t.shape[0]}")
            if t.shape[1] != self.hidden_size:
                raise KilnValueError(f"{cls}: hidden{i} has inconsistent hidden_size: got {t.shape[1]}, expected "
                                     f"{self.hidden_size}")
            if t.dtype != dtype:
                raise KilnValueError(f"{cls}: {name} dtype ({_dtype_name(t.dtype)}) does not match weight dtype "
                                     f"({_dtype_name(dtype)})")
            if t.device != x.device:
                raise KilnError(f"{cls}: Input and hidden tensors are not at the same device, found input tensor at "
                                f"{x.device} and hidden tensor ({name}) at {t.device}")
            checked.append(t)
        g = F.linear(x, self.weight_ih, self.bias_ih)
        h, c = _step(mode, g, checked[0], checked[1] if len(checked) > 1 else None, self.weight_hh, self.bias_hh,
                     None, self.hidden_size)
        if not batched:
            h, c = h.squeeze(0), (c.squeeze(0) if c is not None else None)
        return h, c

    def extra_repr(self):
        s = f"{self.input_size}, {self.hidden_size}"
        if not self.bias:
            s += ", bias=False"
        if getattr(self, "nonlinearity", "tanh") != "tanh":
            s += f", nonlinearity={self.nonlinearity}"
        return s


class RNNCell(RNNCellBase):
    """torch.nn.RNNCell: h' = tanh(x W_ih^T + b_ih + h W_hh^T + b_hh) (or relu)."""

    def __init__(self, input_size, hidden_size, bias=True, nonlinearity="tanh", device=None, dtype=None):
        super().__init__(input_size, hidden_size, bias, 1, device, dtype)
        self.nonlinearity = _nonlinearity("RNNCell", nonlinearity)

    def forward(self, input, hx=None):
        return self._run("RNN_TANH" if self.nonlinearity == "tanh" else "RNN_RELU", input, [hx])[0]


class LSTMCell(RNNCellBase):
    """torch.nn.LSTMCell: forward(input, (h, c)) returns (h', c')."""

    def __init__(self, input_size, hidden_size, bias=True, device=None, dtype=None):
        super().__init__(input_size, hidden_size, bias, 4, device, dtype)

    def forward(self, input, hx=None):
        if hx is None:
            hx = (None, None)
        elif not isinstance(hx, (tuple, list)) or len(hx) != 2:
            raise TypeError(f"LSTMCell: hx must be a tuple (h, c) of two tensors, got {_a_type(hx)}")
        elif hx[0] is None or hx[1] is None:  # torch's lstm_cell takes both or neither (hx=None)
            raise TypeError(f"LSTMCell: hx must be a tuple (h, c) of two tensors, got hx[{0 if hx[0] is None else 1}] "
                            "None (pass hx=None for zero states)")
        return self._run("LSTM", input, list(hx))


class GRUCell(RNNCellBase):
    """torch.nn.GRUCell (gates r, z, n in torch's order and form)."""

    def __init__(self, input_size, hidden_size, bias=True, device=None, dtype=None):
        super().__init__(input_size, hidden_size, bias, 3, device, dtype)

    def forward(self, input, hx=None):
        return self._run("GRU", input, [hx])[0]
