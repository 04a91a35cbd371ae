"""kiln.nn.utils.rnn: torch.nn.utils.rnn's variable-length sequences. PackedSequence holds a batch of
sequences time step by time step (data [sum of batch_sizes, *]: step 0 of every sequence, then step 1
of those at least 2 long, ...; the sequences sorted longest first, sorted_indices / unsorted_indices
mapping to and from the caller's order), as the recurrent layers (kiln.nn.RNN, LSTM, GRU) take it.
pad_sequence, pack_padded_sequence, pad_packed_sequence, pack_sequence, unpad_sequence and
unpack_sequence convert, with torch's arguments and refusals, using Kiln's ops (index_select, slices,
cat, stack), so the gradients flow through them."""
import collections
import math
import numbers
import operator

from ... import _C
from ..._C import Tensor, KilnValueError
from ..._tensor import _a_type, tensor as _tensor

__all__ = ["PackedSequence", "pad_sequence", "pack_padded_sequence", "pad_packed_sequence", "pack_sequence",
           "unpad_sequence", "unpack_sequence"]


def _indices(values):
    """A 1-D int64 CPU tensor of the Python ints `values`."""
    return _tensor([int(v) for v in values], dtype=_C.dtype.int64)


def _invert(sorted_indices):
    """The permutation that undoes sorted_indices (a tensor or None)."""
    if sorted_indices is None:
        return None
    order = [int(i) for i in sorted_indices.tolist()]
    inverse = [0] * len(order)
    for position, i in enumerate(order):
        inverse[i] = position
    return _indices(inverse).to(sorted_indices.device)


class PackedSequence(collections.namedtuple("PackedSequence", ["data", "batch_sizes", "sorted_indices",
                                                               "unsorted_indices"])):
    """torch's PackedSequence (a named tuple): data [sum(batch_sizes), *], batch_sizes (int64, on the
    CPU: how many sequences have each time step), sorted_indices (the caller's batch index of each
    packed column; None when the batch was packed in its own order) and unsorted_indices (its inverse,
    computed from sorted_indices when not given). Make one with pack_padded_sequence or pack_sequence."""
    __slots__ = ()

    def __new__(cls, data, batch_sizes=None, sorted_indices=None, unsorted_indices=None):
        if not isinstance(data, Tensor):
            raise TypeError(f"PackedSequence: data must be a kiln.Tensor, got {_a_type(data)}")
        if batch_sizes is None:
            raise TypeError("PackedSequence: batch_sizes is required (make one with pack_padded_sequence or "
                            "pack_sequence)")
        if not isinstance(batch_sizes, Tensor):
            batch_sizes = _indices([operator.index(b) for b in batch_sizes])
        if unsorted_indices is None:
            unsorted_indices = _invert(sorted_indices)
        return super().__new__(cls, data, batch_sizes, sorted_indices, unsorted_indices)

    def to(self, *args, **kwargs):
        """data moved or converted as Tensor.to; batch_sizes stays on the CPU, the indices follow data's
        device."""
        data = self.data.to(*args, **kwargs)
        if data is self.data:
            return self
        move = (lambda t: None if t is None else t.to(data.device))  # noqa: E731
        return type(self)(data, self.batch_sizes, move(self.sorted_indices), move(self.unsorted_indices))

    def cpu(self):
        return self.to("cpu")

    def cuda(self, device=None):
        """data on CUDA device `device` (an index, "cuda:N" or a kiln.Device; None: device 0)."""
        if device is None:
            device = 0
        if isinstance(device, numbers.Integral) and not isinstance(device, bool):
            device = f"cuda:{int(device)}"
        return self.to(device)

    def float(self):
        return self.to(dtype=_C.dtype.float32)

    def double(self):
        return self.to(dtype=_C.dtype.float64)

    def half(self):
        return self.to(dtype=_C.dtype.float16)

    def bfloat16(self):
        return self.to(dtype=_C.dtype.bfloat16)

    @property
    def is_cuda(self):
        return self.data.device.type == "cuda"


def _check_tensor(fn, name, t):
    if not isinstance(t, Tensor):
        raise TypeError(f"{fn}: {name} must be a kiln.Tensor, got {_a_type(t)}")


def _lengths(fn, lengths):
    """lengths as Python ints: a list or tuple of ints, a 1-D tensor (kiln, NumPy, torch)."""
    if hasattr(lengths, "tolist"):
        if getattr(lengths, "ndim", lengths.dim() if isinstance(lengths, Tensor) else 1) != 1:
            raise KilnValueError(f"{fn}: lengths must be 1-D, got shape {list(lengths.shape)}")
        lengths = lengths.tolist()
    out = []
    for i, n in enumerate(lengths):
        if isinstance(n, numbers.Real) and not isinstance(n, numbers.Integral) and not math.isfinite(n):
            raise KilnValueError(f"{fn}: lengths[{i}] is {n}; each length must be a whole number of time steps")
        try:
            out.append(int(n) if isinstance(n, numbers.Real) and n == int(n) else operator.index(n))
        except TypeError:
            raise TypeError(f"{fn}: lengths must be a list or 1-D tensor of ints, got {lengths!r}") from None
    return out


def pad_sequence(sequences, batch_first=False, padding_value=0.0, padding_side="right"):
    """torch's pad_sequence: tensors [L_i, *] (the same trailing sizes, dtype and device) stacked into
    [max L, N, *] ([N, max L, *] with batch_first), the shorter ones padded with padding_value after
    their steps (padding_side="right") or before them ("left"). As torch, the result has sequences[0]'s
    dtype (the others are converted to it)."""
    if padding_side not in ("left", "right"):
        raise KilnValueError(f"pad_sequence: Expected padding_side to be one of left or right, but got "
                             f"{padding_side}.")
    if isinstance(sequences, Tensor):
        sequences = list(sequences.unbind(0))
    sequences = list(sequences)
    if not sequences:
        raise KilnValueError("pad_sequence: received an empty list of sequences")
    for i, s in enumerate(sequences):
        _check_tensor("pad_sequence", f"sequences[{i}]", s)
        if s.dim() < 1:
            raise KilnValueError(f"pad_sequence: sequences[{i}] is 0-D; each sequence needs a time dimension")
        if tuple(s.shape[1:]) != tuple(sequences[0].shape[1:]):
            raise KilnValueError(f"pad_sequence: sequences[{i}] has shape {list(s.shape)}, but sequences[0] has "
                                 f"{list(sequences[0].shape)}: the sizes after the first (time) dimension must match")
    longest = max(s.shape[0] for s in sequences)
    padded = []
    for s in sequences:
        if s.dtype != sequences[0].dtype:
            s = s.to(sequences[0].dtype)
        missing = longest - s.shape[0]
        if missing:
            fill = s.new_full((missing,) + tuple(s.shape[1:]), padding_value)
            s = _C.cat([s, fill] if padding_side == "right" else [fill, s], 0)
        padded.append(s)
    return _C.stack(padded, 0 if batch_first else 1)


def pack_padded_sequence(input, lengths, batch_first=False, enforce_sorted=True):
    """torch's pack_padded_sequence: input [T, N, *] ([N, T, *] with batch_first) holding N sequences
    of the given lengths (each 1..T), as a PackedSequence. With enforce_sorted the lengths must not
    increase (the batch is packed in its order, sorted_indices None); enforce_sorted=False sorts it
    longest first (a stable sort, as torch's) and records the order."""
    fn = "pack_padded_sequence"
    _check_tensor(fn, "input", input)
    if input.dim() < 2:
        raise KilnValueError(f"{fn}: input must be at least 2-D ([T, N, *] or, with batch_first, [N, T, *]), got "
                             f"shape {list(input.shape)}")
    lengths = _lengths(fn, lengths)
    x = input.transpose(0, 1) if batch_first else input
    steps, batch = x.shape[0], x.shape[1]
    if input.numel() == 0:
        raise KilnValueError(f"{fn}: Cannot pack empty tensors (input has shape {list(input.shape)}, lengths "
                             f"{lengths})")
    if len(lengths) != batch:
        raise KilnValueError(f"{fn}: Expected `len(lengths)` to be equal to batch_size, but got {len(lengths)} "
                             f"(batch_size={batch})")
    if any(n <= 0 for n in lengths):
        raise KilnValueError(f"{fn}: Length of all samples has to be greater than 0, but found an element in "
                             "'lengths' that is <= 0")
    if max(lengths) > steps:
        raise KilnValueError(f"{fn}: lengths has {max(lengths)}, longer than the input's {steps} time steps")
    if enforce_sorted:
        if any(a < b for a, b in zip(lengths, lengths[1:])):
            raise KilnValueError(f"{fn}: `lengths` array must be sorted in decreasing order when `enforce_sorted` is "
                                 "True. You can pass `enforce_sorted=False` to pack_padded_sequence and/or "
                                 "pack_sequence to sidestep this requirement if you do not need ONNX exportability.")
        sorted_indices = None
    else:
        order = sorted(range(batch), key=lambda i: -lengths[i])  # stable: ties keep their order
        lengths = [lengths[i] for i in order]
        sorted_indices = _indices(order).to(x.device)
        x = x.index_select(1, sorted_indices)
    batch_sizes = [sum(1 for n in lengths if n > t) for t in range(lengths[0])]
    # one index_select of the time-major rows (a slice per step would cost O(T^2) in backward)
    rows = [t * batch + i for t, b in enumerate(batch_sizes) for i in range(b)]
    data = x.reshape([steps * batch] + list(x.shape[2:])).index_select(0, _indices(rows).to(x.device))
    return PackedSequence(data, _indices(batch_sizes), sorted_indices, _invert(sorted_indices))


def pad_packed_sequence(sequence, batch_first=False, padding_value=0.0, total_length=None):
    """torch's pad_packed_sequence: a PackedSequence back to a padded tensor [T, N, *] ([N, T, *] with
    batch_first) in the caller's batch order, T the longest length or total_length, and the lengths
    (an int64 tensor)."""
    fn = "pad_packed_sequence"
    if not isinstance(sequence, PackedSequence):
        raise TypeError(f"{fn}: sequence must be a PackedSequence, got {_a_type(sequence)}")
    data, batch_sizes = sequence.data, [int(b) for b in sequence.batch_sizes.tolist()]
    steps, batch = len(batch_sizes), (batch_sizes[0] if batch_sizes else 0)
    if total_length is not None:
        # an int, a numpy integer or (as torch) a 0-d integer tensor; never a bool or a float
        bad = isinstance(total_length, bool) or (
            isinstance(total_length, Tensor) and (total_length.dtype == _C.dtype.bool or total_length.dim() != 0))
        try:
            value = None if bad else operator.index(total_length)
        except TypeError:
            value = None
        if value is None:
            raise TypeError(f"{fn}: total_length must be an int or a 0-d integer tensor (or None), got "
                            f"{_a_type(total_length)} {total_length!r}")
        total_length = value
        if total_length < steps:
            raise KilnValueError(f"{fn}: Expected total_length to be at least the length of the longest sequence in "
                                 f"input, but got total_length={total_length} and max sequence length being {steps}")
        steps_out = total_length
    else:
        steps_out = steps
    tail = tuple(data.shape[1:])
    lengths = [sum(1 for b in batch_sizes if b > i) for i in range(batch)]
    order = list(range(batch))  # the packed column of each output column
    if sequence.unsorted_indices is not None:
        order = [int(i) for i in sequence.unsorted_indices.tolist()]
        lengths = [lengths[i] for i in order]
    if batch:
        # One index_select of data and a padding row (a slice per step would cost O(T^2) in backward):
        # step t of packed column j is data row starts[t] + j when j < batch_sizes[t].
        pad_row = data.shape[0]
        rows, at = [], 0
        for t in range(steps_out):
            b = batch_sizes[t] if t < steps else 0
            rows.extend(at + j if j < b else pad_row for j in order)
            at += b
        source = _C.cat([data, data.new_full((1,) + tail, padding_value)], 0)
        padded = source.index_select(0, _indices(rows).to(data.device)).reshape([steps_out, batch] + list(tail))
    else:
        padded = data.new_full((steps_out, 0) + tail, padding_value)
    if batch_first:
        padded = padded.transpose(0, 1)
    return padded, _indices(lengths)


def pack_sequence(sequences, enforce_sorted=True):
    """torch's pack_sequence: tensors [L_i, *] packed (pad_sequence, then pack_padded_sequence)."""
    sequences = list(sequences)
    for i, s in enumerate(sequences):
        _check_tensor("pack_sequence", f"sequences[{i}]", s)
    lengths = [s.shape[0] if s.dim() else 0 for s in sequences]
    return pack_padded_sequence(pad_sequence(sequences), lengths, enforce_sorted=enforce_sorted)


def unpad_sequence(padded_sequences, lengths, batch_first=False):
    """torch's unpad_sequence: the padded batch's sequences as a list of tensors [L_i, *]."""
    _check_tensor("unpad_sequence", "padded_sequences", padded_sequences)
    lengths = _lengths("unpad_sequence", lengths)
    x = padded_sequences if batch_first else padded_sequences.transpose(0, 1)
    if len(lengths) != x.shape[0]:
        raise KilnValueError(f"unpad_sequence: {len(lengths)} lengths for a batch of {x.shape[0]}")
    return [x[i, :n] for i, n in enumerate(lengths)]


def unpack_sequence(packed_sequences):
    """torch's unpack_sequence: a PackedSequence's sequences as a list of tensors [L_i, *]."""
    padded, lengths = pad_packed_sequence(packed_sequences, batch_first=True)
    return unpad_sequence(padded, lengths, batch_first=True)
