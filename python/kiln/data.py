"""kiln.data: the engine's data sets and loader (background threads build batches, optionally in
page-locked memory, so a GPU never waits).

    d = kiln.data.fashion_mnist()                  # Debian's dataset-fashion-mnist
    loader = kiln.data.DataLoader(d["train"], batch_size=128, shuffle=True, num_workers=2)
    for batch in loader:                           # one epoch per iteration
        x, y = batch["input"], batch["target"]
"""
import atexit
import collections.abc
import itertools
import math
import numbers
import os
import random
import sys
import threading
import time
import weakref

import numpy as np

from . import _C
from ._tensor import _a_type

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"


# kiln train's transforms per data set (tools/tasks.cpp, image_classification): the training set's
# pixel mean and standard deviation, and whether augmentation mirrors (clothes do, digits do not).
_MNIST_TRANSFORMS = {"fashion-mnist": ((0.2860,), (0.3530,), True), "mnist": ((0.1307,), (0.3081,), False)}


def _per_channel(what, value, channels):
    """`value` (a number, or a sequence of one per channel) as a list of `channels` floats."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return [float(value)] * channels
    try:
        if isinstance(value, (str, bytes)):
            raise TypeError
        values = [float(v) for v in value]
    except (TypeError, ValueError):
        raise TypeError(f"mnist_dir: {what} must be a number or a sequence of {channels} numbers (one per "
                        f"channel), got {value!r}") from None
    if len(values) != channels:
        raise ValueError(f"mnist_dir: {what} has {len(values)} values, but the data set has {channels} "
                         f"channel{'s' if channels != 1 else ''}: give a number or {channels} values")
    return values


def mnist_dir(path, name="mnist", augment=True, mean=None, std=None, hflip=None, pad=2):
    """An MNIST-format directory (train/t10k idx files, gzipped or not): {"train", "test",
    "num_classes", "shape", "class_names"}, with kiln train's transforms for `name`: "mnist"
    normalises with MNIST's mean and std (0.1307, 0.3081) and augments with a random crop (pad 2);
    "fashion-mnist" with (0.2860, 0.3530) and a random crop plus a horizontal flip. Any other name
    takes MNIST's; `mean`, `std` (a number or a one-value sequence: the images are grey) and `hflip`
    override them, and `pad` is the random crop's zero padding (0: no crop shift)."""
    d_mean, d_std, d_flip = _MNIST_TRANSFORMS.get(name, _MNIST_TRANSFORMS["mnist"])
    mean = _per_channel("mean", d_mean if mean is None else mean, 1)
    std = _per_channel("std", d_std if std is None else std, 1)
    hflip = d_flip if hflip is None else hflip
    if isinstance(pad, bool) or not isinstance(pad, numbers.Integral):
        raise TypeError(f"mnist_dir: pad must be an int (the random crop's padding in pixels), got {pad!r}")
    if pad < 0:
        raise ValueError(f"mnist_dir: pad must be >= 0 (the random crop's padding in pixels; 0: no crop), got {pad}")
    if pad >= 2**63:  # past the engine's int64; smaller ones above the image size are refused naming it
        raise ValueError(f"mnist_dir: pad {pad} is larger than the images (the random crop's padding in pixels)")
    return dict(_C._load_mnist_dir(str(path), name, int(pad) if augment else 0, bool(augment and hflip), mean, std))


def fashion_mnist(path=FASHION_MNIST_DIR, augment=True, mean=None, std=None, hflip=None, pad=2):
    """Fashion-MNIST with kiln train's transforms (the same batches for the same seed); `mean`, `std`,
    `hflip` and `pad` override them as mnist_dir's."""
    return mnist_dir(path, "fashion-mnist", augment, mean=mean, std=std, hflip=hflip, pad=pad)


def default_collate(samples):
    """One batch from a list of samples, as torch's default_collate: tensors, NumPy arrays and numbers
    are stacked along a new first dimension (Python ints as int64, floats as float64, bools as bool);
    dicts, tuples and lists are collated field by field; strings stay a list."""
    if len(samples) == 0:
        raise ValueError("default_collate: no samples (an empty batch has nothing to stack)")
    return _collate(list(samples), "sample", None)


def default_convert(sample):
    """One sample as a loader with batch_size=None gives it, as torch's default_convert: NumPy arrays
    and scalars become tensors (no batch dim), dicts, tuples and lists are converted field by field,
    anything else stays as it is: NumPy arrays of strings or objects too, as torch's. A complex array or
    scalar, which torch makes a complex tensor, is a TypeError (Kiln has no complex dtype)."""
    if isinstance(sample, (np.ndarray, np.complexfloating)) and sample.dtype.kind == "c":
        raise TypeError(f"default_convert: a complex sample ({sample.dtype}, shape {tuple(sample.shape)}): "
                        f"{_NO_COMPLEX}")
    if isinstance(sample, np.ndarray) and sample.dtype.kind not in "OSUV":
        return _C.from_numpy(np.ascontiguousarray(sample))
    if isinstance(sample, np.generic) and not isinstance(sample, (np.str_, np.bytes_)):
        return _C.from_numpy(np.array(sample))
    if isinstance(sample, collections.abc.Mapping):
        return {k: default_convert(v) for k, v in sample.items()}
    if isinstance(sample, tuple) and hasattr(sample, "_fields"):  # a namedtuple
        return type(sample)(*[default_convert(v) for v in sample])
    if isinstance(sample, (tuple, list)):
        return type(sample)(default_convert(v) for v in sample)
    return sample


def _where(indices, positions):
    # which samples: their dataset indices when the loader knows them, else their places in the batch
    if indices is None:
        return f"batch position{'s' if len(positions) > 1 else ''} {positions}"
    return f"dataset ind{'ices' if len(positions) > 1 else 'ex'} {[indices[p] for p in positions]}"


def _by(samples, key, indices):
    """'A at dataset indices [..], B at [..]': the samples grouped by key(sample)."""
    groups = {}
    for p, s in enumerate(samples):
        groups.setdefault(key(s), []).append(p)
    return " and ".join(f"{k} at {_where(indices, ps)}" for k, ps in groups.items())


def _check_dtypes(samples, where, indices):
    """Refuses NumPy arrays of strings or objects (as torch's default_collate, its TypeError and words)
    and complex samples (Kiln has no complex dtype), before from_numpy's low-level error."""
    if all(type(s) in (float, int) for s in samples):  # Python numbers, the common batch of labels: nothing to refuse
        return
    for s in samples:
        if isinstance(s, np.ndarray) and s.dtype.kind in "SUOV":
            raise TypeError("default_collate: batch must contain tensors, numpy arrays, numbers, dicts or lists; "
                            f"found {s.dtype}")
    dtypes = {}  # the complex samples' positions, by dtype
    for p, s in enumerate(samples):
        # (no np.asarray of the others: it cost more than the stacking for Python numbers, and raised
        # NumPy's own ValueError for a ragged list before the stacking's error could name it)
        if isinstance(s, (np.ndarray, np.generic)):
            if s.dtype.kind == "c":
                dtypes.setdefault(str(s.dtype), []).append(p)
        elif isinstance(s, complex):
            dtypes.setdefault("complex128", []).append(p)
    if dtypes:
        found = " and ".join(f"{dt} at {_where(indices, ps)}" for dt, ps in dtypes.items())
        raise TypeError(f"DataLoader: {where}s of one batch are complex ({found}): {_NO_COMPLEX}")


_NO_COMPLEX = ("Kiln has no complex dtype (give the real and imaginary parts as real arrays, e.g. "
               "np.stack([z.real, z.imag], -1), or a collate_fn)")


def _collate(samples, where, indices):
    first = samples[0]
    tensors = sum(isinstance(s, _C.Tensor) for s in samples)
    if 0 < tensors < len(samples):  # (NumPy arrays and numbers stack together, as before)
        raise TypeError(f"DataLoader: {where}s of one batch mix types: "
                        f"{_by(samples, lambda s: type(s).__name__, indices)} (make them one type, e.g. all "
                        "kiln tensors with kiln.from_numpy, or give a collate_fn)")
    if isinstance(first, collections.abc.Mapping):
        keys = list(first.keys())  # the batch's order; the others may list the same keys in another (as torch)
        for s in samples:
            if not isinstance(s, collections.abc.Mapping) or s.keys() != first.keys():
                got = list(s.keys()) if isinstance(s, collections.abc.Mapping) else type(s).__name__
                raise ValueError(f"DataLoader: {where}s of one batch differ: keys {keys} and {got}")
        return {k: _collate([s[k] for s in samples], f"{where}[{k!r}]", indices) for k in keys}
    if isinstance(first, (str, bytes)):
        return list(samples)
    if isinstance(first, (tuple, list)):
        for s in samples:
            if not isinstance(s, (tuple, list)) or len(s) != len(first):
                raise ValueError(f"DataLoader: {where}s of one batch differ: {len(first)} fields and "
                                 f"{len(s) if isinstance(s, (tuple, list)) else type(s).__name__}")
        fields = [_collate([s[i] for s in samples], f"{where}[{i}]", indices) for i in range(len(first))]
        if isinstance(first, tuple) and hasattr(first, "_fields"):  # a namedtuple
            return type(first)(*fields)
        return tuple(fields) if isinstance(first, tuple) else fields
    arrays = all(isinstance(s, (_C.Tensor, np.ndarray)) for s in samples)
    if arrays and len({tuple(s.shape) for s in samples}) > 1:
        raise ValueError(f"DataLoader: {where}s of one batch cannot be stacked: shapes "
                         f"{_by(samples, lambda s: tuple(s.shape), indices)} (give samples of one shape, or a "
                         "collate_fn)")
    if isinstance(first, _C.Tensor):
        return _C.stack(list(samples), 0)
    if isinstance(first, (bool, np.bool_)) and all(isinstance(s, (bool, np.bool_)) for s in samples):
        return _C.from_numpy(np.array(samples, dtype=np.bool_))
    if isinstance(first, (numbers.Number, np.ndarray, np.generic)):
        _check_dtypes(samples, where, indices)
        try:
            if isinstance(first, numbers.Real) and not isinstance(first, np.generic):
                # Python numbers: int64 when every one is an int (or a bool among ints), else float64
                # (never truncated)
                ints = all(isinstance(s, numbers.Integral) for s in samples)
                arr = np.array(samples, dtype=np.int64 if ints else np.float64)
            else:
                arr = np.stack([np.asarray(s) for s in samples])
        except (ValueError, TypeError, OverflowError) as e:
            raise ValueError(f"DataLoader: {where}s of one batch cannot be stacked: {e}") from None
        return _C.from_numpy(np.ascontiguousarray(arr))
    raise TypeError(f"DataLoader: cannot collate {where}s of type {type(first).__name__} (give tensors, NumPy "
                    "arrays, numbers, strings, or dicts/tuples/lists of them, or a collate_fn)")


def _engine_subset(dataset):
    """A Subset (of Subsets) of an engine data set as an engine data set of the same samples (whose
    batch of indices i is the base set's batch of indices[i]), or None."""
    indices = None
    while isinstance(dataset, Subset):
        mine = [int(i) for i in dataset.indices]
        indices = mine if indices is None else [mine[i] for i in indices]
        dataset = dataset.dataset
    return _C._subset(dataset, indices) if indices is not None and isinstance(dataset, _C.Dataset) else None


def _seed_from_generator():
    # As torch's loader draws its base seed from torch's generator: kiln.manual_seed decides the
    # order (and a kiln Dataset's augmentation). 3 x 24 random bits (randint's widest range) make 64.
    a, b, c = _C.randint(0, 2**24, (3,), dtype=_C.dtype.int64, device="cpu").tolist()
    return (a | b << 24 | c << 48) % 2**64


_NOTE = "(in DataLoader, reading dataset["


_note_lock = threading.Lock()  # (worker threads may note one exception object at once)


def _note_index(e, i, loader):
    # One note naming the index per loader: the same exception object raised again (re-raised by the
    # user's code, or kept and raised by a caching dataset for several items) had a note added at every
    # raise. The note names the latest index that raised it through this loader; another loader's note
    # (an inner loader read by the outer one's dataset) stays. The exception keeps (loader, its note)
    # pairs: exceptions take no weak references, the loader is held by a weak one.
    if not hasattr(e, "add_note"):  # (Python < 3.11)
        return
    note = f"{_NOTE}{i}])"
    with _note_lock:
        mine = getattr(e, "_kiln_loader_notes", None)
        if not isinstance(mine, list):
            mine = []
            try:
                e._kiln_loader_notes = mine
            except AttributeError:  # (an exception type without a __dict__: a note each time)
                pass
        notes = getattr(e, "__notes__", None)
        for k, (ref, old) in enumerate(mine):
            if ref() is loader:
                mine[k] = (ref, note)
                for j, n in enumerate(notes if isinstance(notes, list) else []):
                    if n is old:
                        notes[j] = note
                        return
                break
        else:
            mine.append((weakref.ref(loader), note))
        e.add_note(note)


class _NoBatches:
    """An empty engine data set's loader: 0 batches each epoch."""

    def __len__(self):
        return 0

    def start_epoch(self, epoch):
        pass

    def next(self):
        return None


# torch's DataLoader arguments a thread pool has no use for: what to do instead.
_REFUSED = {
    "generator": "the order comes from seed= (drawn from Kiln's generator, kiln.manual_seed, when not given)",
    "worker_init_fn": "the workers are threads of this process sharing the dataset object, with nothing to set up "
                      "per worker: set the dataset up before making the loader",
    "multiprocessing_context": "the workers are threads, not processes: leave it out",
    "pin_memory_device": "pin_memory=True pins for the CUDA device: leave it out",
}


class DataLoader:
    """Batches of a data set; each iteration is the next epoch (shuffled by seed and epoch, the same
    order every run). torch's arguments and defaults, with threads for workers; docs/python.md lists
    them and how they differ from torch's.

    dataset: a kiln Dataset (kiln.data.mnist_dir, masked_lm, ...: batches are dicts of tensors, built
    by C++ threads) or a Subset of one; a map-style Python dataset (__len__ and __getitem__(int): a
    list of (tensor, label) tuples, a TensorDataset), whose samples collate_fn (default_collate)
    batches; or an iterable one (__iter__ and no __getitem__), read in its own order.
    batch_size: 1 by default, as torch's; None for samples one by one, not batched. shuffle: False by
    default, as torch's (a new order each epoch when True). drop_last: the last, smaller batch left
    out. sampler / batch_sampler: iterables of indices / of lists of indices, in place of the
    loader's own order. workers (or torch's num_workers): threads building batches ahead (default: 1
    for a kiln Dataset; 0 for a Python dataset, whose __getitem__ then runs in the calling thread, as
    torch's default: with workers > 0 it runs in those threads, beside the caller and each other, so a
    dataset with shared state or global random numbers must allow that); prefetch_factor batches
    ahead per thread (not given: 2 for a Python dataset, as torch's; 4 in all for a kiln Dataset, its
    C++ loader's default). pin_memory: batches in page-locked memory when a CUDA device is present.
    timeout: seconds to wait for one batch of a Python dataset's threads (0: for ever), as torch's.
    seed: the order's (and a kiln Dataset's augmentation's) seed; not given, drawn from Kiln's
    generator (kiln.manual_seed) when the loader is made, and only where it is used (a kiln Dataset,
    or shuffle=True; else loader.seed is None). torch's loader draws from torch's at each iteration;
    drawn once when built, from the thread making it, no other thread's random numbers can come
    between (worker threads augmenting with kiln.rand). With world_size > 1 it is 0 (every rank the
    same order, as torch's DistributedSampler's seed).
    rank / world_size: this rank's part of each epoch's order, as torch's DistributedSampler."""

    def __init__(self, dataset, batch_size=1, shuffle=False, sampler=None, batch_sampler=None, num_workers=None,
                 collate_fn=None, pin_memory=False, drop_last=False, timeout=0, worker_init_fn=None,
                 multiprocessing_context=None, generator=None, *, prefetch_factor=None, persistent_workers=False,
                 pin_memory_device="", in_order=True, seed=None, workers=None, rank=0, world_size=1):
        for name, v in (("generator", generator), ("worker_init_fn", worker_init_fn),
                        ("multiprocessing_context", multiprocessing_context),
                        ("pin_memory_device", pin_memory_device or None)):
            if v is not None:
                raise TypeError(f"DataLoader: {name}= is not supported: {_REFUSED[name]}")
        if in_order is not True:
            raise TypeError("DataLoader: in_order=False is not supported: batches always come in order")
        if num_workers is not None:  # torch's name
            if workers is not None:
                raise TypeError("DataLoader: give workers or num_workers (torch's name for it), not both")
            workers = num_workers
        engine_part = _engine_subset(dataset)  # random_split's parts of an engine data set: its C++ loader
        engine = engine_part if engine_part is not None else dataset if isinstance(dataset, _C.Dataset) else None
        if workers is None:
            workers = 1 if engine is not None else 0
        for name, v in (("workers", workers), ("rank", rank), ("world_size", world_size)):
            if isinstance(v, bool) or not isinstance(v, numbers.Integral):
                raise TypeError(f"DataLoader: {name} must be an int, got {v!r}")
        if batch_size is not None:
            if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral):
                raise TypeError(f"DataLoader: batch_size must be an int or None, got {batch_size!r}")
            if batch_size < 1:
                raise ValueError(f"DataLoader: batch_size must be >= 1, got {batch_size}")
        if workers < 0:
            raise ValueError(f"DataLoader: workers must be >= 0, got {workers}")
        if seed is None and world_size > 1:
            # ranks draw from generators seeded apart (dropout's seed per rank, say): their orders
            # would differ and their shards overlap. A fixed 0, as torch's DistributedSampler.
            seed = 0
        elif seed is not None and (isinstance(seed, bool) or not isinstance(seed, numbers.Integral)):
            raise TypeError(f"DataLoader: seed must be an int or None, got {seed!r}")
        # as kiln.manual_seed: any int, taken modulo 2**64. None: drawn below where it is used, here
        # and not at the first iteration: worker threads of another pass drawing from Kiln's
        # generator then (augmentation) would race it, and the order would vary run to run.
        self.seed = None if seed is None else int(seed) % 2**64
        if not (world_size >= 1 and 0 <= rank < world_size):
            raise ValueError(f"DataLoader: rank must be in [0, world_size) and world_size >= 1, got rank={rank}, "
                             f"world_size={world_size}")
        self._rank, self._world = int(rank), int(world_size)
        if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real) or not timeout >= 0:
            raise ValueError(f"DataLoader: timeout must be a number of seconds >= 0 (0: for ever), got {timeout!r}")
        if timeout and (workers == 0 or engine is not None):
            raise ValueError("DataLoader: timeout applies to a Python dataset's worker threads (num_workers >= 1); "
                             f"with {'a kiln Dataset' if workers else 'num_workers=0'} it cannot be kept: leave it 0")
        self._timeout = float(timeout)
        # as torch's: prefetch_factor and persistent_workers only with workers
        if prefetch_factor is not None:
            if workers == 0:
                raise ValueError("DataLoader: prefetch_factor applies to worker threads: give num_workers >= 1, or "
                                 "leave prefetch_factor out")
            if isinstance(prefetch_factor, bool) or not isinstance(prefetch_factor, numbers.Integral) or \
                    prefetch_factor < 1:
                raise ValueError(f"DataLoader: prefetch_factor must be an int >= 1, got {prefetch_factor!r}")
        if persistent_workers and workers == 0:
            raise ValueError("DataLoader: persistent_workers needs num_workers >= 1")
        # persistent_workers is otherwise nothing to do: the threads share the dataset object (no copy
        # to keep between epochs) and start with each pass at a thread's cost.
        self._ahead = int(prefetch_factor or 2) * workers
        if collate_fn is not None and not callable(collate_fn):
            raise TypeError(f"DataLoader: collate_fn must be callable, got {collate_fn!r}")
        iterable = engine is None and hasattr(dataset, "__iter__") and not hasattr(dataset, "__getitem__")
        # torch's rules and messages
        if iterable:
            for name, v in (("shuffle", shuffle or None), ("sampler", sampler), ("batch_sampler", batch_sampler)):
                if v is not None:
                    raise ValueError(f"DataLoader with IterableDataset: expected unspecified {name} option, but got "
                                     f"{name}={v!r} (an iterable dataset is read in its own order)")
        if sampler is not None and shuffle:
            raise ValueError("DataLoader: sampler option is mutually exclusive with shuffle")
        if batch_sampler is not None:
            if batch_size != 1 or shuffle or sampler is not None or drop_last:
                raise ValueError("DataLoader: batch_sampler option is mutually exclusive with batch_size, shuffle, "
                                 "sampler, and drop_last")
            batch_size = None
        elif batch_size is None and drop_last:
            raise ValueError("DataLoader: batch_size=None option disables auto-batching and is mutually exclusive "
                             "with drop_last")
        if self._world > 1 and (iterable or sampler is not None or batch_sampler is not None):
            raise ValueError("DataLoader: rank/world_size split the loader's own order; with an iterable dataset, a "
                             "sampler or a batch_sampler, split in those instead")
        self._generation = 0
        self._epoch = -1  # the last epoch started; set_epoch(n) makes the next n
        self.dataset = dataset  # as torch's
        self.batch_size, self.drop_last = batch_size, bool(drop_last)
        self.sampler, self.batch_sampler = sampler, batch_sampler
        if engine is not None:
            for name, v in (("collate_fn", collate_fn), ("sampler", sampler), ("batch_sampler", batch_sampler)):
                if v is not None:
                    raise TypeError(f"DataLoader: {name} applies to Python datasets; a kiln Dataset builds its own "
                                    "batches in its own order (give it a Subset of the indices, or shuffle/seed)")
            if batch_size is None:
                raise TypeError("DataLoader: batch_size=None applies to Python datasets; a kiln Dataset is read in "
                                "batches (ds[i] is one sample)")
            def make(seed):
                if len(engine) == 0:  # an empty Subset: no batches, as a Python dataset's (the C++ loader refuses)
                    return _NoBatches()
                return _C._Loader(engine, int(batch_size), bool(shuffle), bool(drop_last), seed, int(workers),
                                  bool(pin_memory), self._rank, self._world,
                                  int(prefetch_factor) * int(workers) if prefetch_factor else 0)

            # its batches may take the seed whether shuffled or not (augmentation, masking)
            if self.seed is None:
                self.seed = _seed_from_generator()
            self._impl = make(self.seed)
            return
        if not iterable and not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
            raise TypeError(f"DataLoader: dataset must be a kiln Dataset (kiln.data.mnist_dir, masked_lm, "
                            f"tsv_classification, ...), a map-style Python dataset with __len__ and __getitem__, or "
                            f"an iterable one with __iter__, got {type(dataset).__name__}")
        if not iterable:
            n = len(dataset)
            if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 0:
                raise TypeError(f"DataLoader: len(dataset) must be an int >= 0, got {n!r}")
            self._size = int(n)
        self._impl = None
        if self.seed is None and shuffle:  # a sampler's, a batch_sampler's or an iterable's order is theirs
            self.seed = _seed_from_generator()
        self._iterable = iterable
        self._dataset = dataset
        self._shuffle = bool(shuffle)
        self._workers = int(workers)
        self._pin = bool(pin_memory)
        # batch_size=None (and no batch_sampler): each sample alone, through collate_fn if given, else
        # default_convert (torch's)
        self._batched = batch_size is not None or batch_sampler is not None
        self._collate = collate_fn or (default_collate if self._batched else default_convert)

    def set_epoch(self, epoch):
        """The next iteration is epoch `epoch` (its order and augmentation), the one after epoch + 1, ...:
        to resume a run where it stopped (each iteration is otherwise the next epoch from 0)."""
        if isinstance(epoch, bool) or not isinstance(epoch, numbers.Integral) or epoch < 0:
            raise ValueError(f"DataLoader.set_epoch: epoch must be an int >= 0, got {epoch!r}")
        self._epoch = int(epoch) - 1

    def __len__(self):
        if self._impl is not None:
            return len(self._impl)
        if self.batch_sampler is not None:
            return len(self.batch_sampler)
        if self._iterable:
            if not hasattr(self._dataset, "__len__"):
                raise TypeError(f"DataLoader: the iterable dataset ({type(self._dataset).__name__}) has no len(), "
                                "so neither has its loader")
            n = len(self._dataset)
        elif self.sampler is not None:
            n = len(self.sampler)
        else:
            n = -(-self._size // self._world)  # this rank's samples
        if self.batch_size is None:
            return n
        full, rest = divmod(n, self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def __iter__(self):
        # One pass at a time: the batches come from one C++ loader, so a second iter() starts the next
        # epoch under the first. Iterating the first after that is an error, not a silent split of the
        # samples between the two (zip(loader, loader) gave each sample to one of them).
        self._generation += 1
        mine = self._generation
        batches = None  # a Python dataset's batches of this pass (its threads end with it)
        self._epoch += 1
        if self._impl is not None:
            self._impl.start_epoch(self._epoch)
        else:
            batches = self._python_batches(self._epoch)
        try:
            while True:
                if self._generation != mine:
                    raise RuntimeError("DataLoader: this iterator was superseded by a newer iter() of the same "
                                       "loader (each iteration is the next epoch, one at a time); make a second "
                                       "DataLoader to read two passes side by side")
                if batches is None:
                    b = self._impl.next()
                    if b is None:
                        return
                else:
                    b = next(batches, _Workers.END)  # (a collate_fn may return None)
                    if b is _Workers.END:
                        return
                yield b
        finally:
            if batches is not None:
                batches.close()  # a pass left early (break): its worker threads stop now

    # ---- Python datasets ----
    def _order(self, epoch):
        """This epoch's dataset indices, in order (map-style datasets)."""
        if self.sampler is not None:
            return iter(self.sampler)
        order = list(range(self._size))
        if self._shuffle:
            random.Random(f"kiln.data.DataLoader:{self.seed}:{epoch}").shuffle(order)
        if self._world > 1 and order:
            # as torch's DistributedSampler (and the C++ loader): the order padded with its start to a multiple
            # of world_size, then every world_size-th sample from rank on
            order += (order * -(-self._world // len(order)))[:-len(order) % self._world]
            order = order[self._rank::self._world]
        return iter(order)

    def _tasks(self, epoch):
        """This epoch's batches to build, read lazily (a sampler or an iterable dataset may be endless):
        lists of dataset indices, or for an iterable dataset lists of its samples."""
        if self.batch_sampler is not None:
            for idx in self.batch_sampler:
                yield list(idx)
            return
        items = iter(self._dataset) if self._iterable else self._order(epoch)
        size = self.batch_size or 1
        while True:
            chunk = list(itertools.islice(items, size))
            if not chunk or (len(chunk) < size and self.drop_last):
                return
            yield chunk

    def _make_batch(self, task):
        if self._iterable:
            samples = task
        else:
            samples = []
            for i in task:
                try:
                    samples.append(self._dataset[i])
                except Exception as e:
                    _note_index(e, i, self)
                    raise
        if not self._batched:
            batch = self._collate(samples[0])
        elif self._collate is default_collate:  # its errors name the dataset indices
            if not samples:  # (only a batch_sampler gives an empty batch; a collate_fn is handed it)
                raise ValueError("DataLoader: the batch_sampler gave an empty list of indices, and default_collate "
                                 "has no samples to stack (leave empty batches out, or give a collate_fn)")
            batch = _collate(samples, "sample", None if self._iterable else task)
        else:
            batch = self._collate(samples)
        return _pin(batch) if self._pin else batch

    def _describe(self, task):
        return "samples of the iterable dataset" if self._iterable else f"dataset indices {task}"

    def _python_batches(self, epoch):
        tasks = self._tasks(epoch)
        if self._workers == 0:
            for task in tasks:
                yield self._make_batch(task)
            return
        # `workers` threads build the next batches in order, prefetch_factor (2) per thread ahead.
        work = _Workers(self._make_batch, tasks, self._workers, self._ahead, self._describe)
        try:
            for k in itertools.count():
                batch = work.get(k, self._timeout)
                if batch is _Workers.END:
                    return
                yield batch
        finally:
            work.close()  # pending batches are dropped, running ones not waited for


_passes = weakref.WeakSet()  # every pass's _Workers while its threads run (their target holds it)
_EXIT_JOIN_S = 3.0  # how long the exit waits for the threads to end their items, in all
_EXIT_QUIESCE_S = 10.0  # then how long for threads still inside engine code (a hook blocked for ever)
_exit_hook_lock = threading.Lock()
_exit_hook_registered = False


def _register_exit_hook():
    # Only once a pass starts worker threads: a program without them has nothing to wait for at
    # exit. Registered after kiln's _release_python_refs, so it runs before it (atexit is LIFO): the
    # threads still running find the hooks they call.
    global _exit_hook_registered
    with _exit_hook_lock:
        if not _exit_hook_registered:
            atexit.register(_end_passes_at_exit)
            _exit_hook_registered = True


def _end_passes_at_exit():
    # Worker threads still in a __getitem__ at exit (a pass left by break, Ctrl-C, an exception):
    # every pass is closed, so each thread ends after the item it is on, and waited for. Not for
    # ever: one blocked in Python code (a sleep, a queue) is harmless to leave, as Python ends it
    # where it waits. One inside engine code is not (taking the GIL back once Python finalizes, it
    # would abort the process): _exit_quiesce waits for those (_EXIT_QUIESCE_S at most; Ctrl-C ends
    # it) and keeps the others out of engine code from then on.
    passes = list(_passes)
    threads = [t for p in passes for t in p.threads]
    try:
        for p in passes:
            p.close()
        deadline = time.monotonic() + _EXIT_JOIN_S
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
    except KeyboardInterrupt:
        pass  # Ctrl-C ends the wait, not the quiesce: without it a thread in engine code aborts the exit
    _C._exit_quiesce(int(_EXIT_QUIESCE_S * 1000))
    left = [t for t in threads if t.is_alive()]
    if left:
        # Their frames keep what the items made (tensors, the dataset module's globals) past the
        # interpreter's end: nanobind would report those as the binding's leaks. Only then, and said.
        _C._set_leak_warnings(False)
        print(f"kiln.data: {len(left)} DataLoader worker thread{'s' if len(left) > 1 else ''} still in the "
              f"dataset's code {_EXIT_JOIN_S:g} s after exit began, left to end with the interpreter (nanobind's "
              "leak report is off: what they hold is not the binding's)", file=sys.stderr)


_kiln_threads_at_fork = False  # whether the parent's other threads held Kiln objects when it last forked


def _is_kilns(v):
    # A Kiln object (a tensor, a module, a loader, or a subclass of one), or a list/tuple/dict holding one
    if isinstance(v, (list, tuple)):
        return any(_is_kilns(x) for x in v[:64] if not isinstance(x, (list, tuple, dict)))
    if isinstance(v, dict):
        return any(_is_kilns(x) for x in itertools.islice(v.values(), 64) if not isinstance(x, (list, tuple, dict)))
    return any(getattr(c, "__module__", "").startswith("kiln") for c in type(v).__mro__)


def _before_fork():
    # Whether another thread, at the fork, holds Kiln objects in its frames (or is one of the loader's
    # worker threads): in the child those frames are never freed, and what they hold is reported as the
    # binding's leaks. The parent's other threads that do nothing with Kiln leave the child's report on.
    global _kiln_threads_at_fork
    me = threading.get_ident()
    workers = {t.ident for p in list(_passes) for t in p.threads}
    found = False
    for ident, frame in sys._current_frames().items():
        if ident == me:
            continue
        if ident in workers:
            found = True
            break
        while frame is not None and not found:
            found = any(_is_kilns(v) for v in list(frame.f_locals.values()))
            frame = frame.f_back
        if found:
            break
    _kiln_threads_at_fork = found


def _after_fork_in_child():
    # In a forked child only the forking thread runs, and it held the GIL to fork: the threads counted
    # inside engine code in the parent are not there (its exit would wait for them for ever), nor the
    # parent's passes, whose locks a parent's thread may have held at the fork (the exit hook closing
    # them would wait for ever).
    # The parent's other Python threads (DataLoader workers, the user's) are gone too, but their frames
    # are never freed: what they held, and the globals they reach, is still referenced at the child's
    # exit, and nanobind reported those tensors and modules as the binding's leaks. Only in a child
    # whose parent had threads holding Kiln objects (_before_fork) is the report off; the parent's,
    # other children's, and those of a parent whose threads did nothing with Kiln keep it.
    global _passes, _exit_hook_lock
    _C._gil_releases_after_fork()
    _passes = weakref.WeakSet()
    _exit_hook_lock = threading.Lock()
    if _kiln_threads_at_fork:
        _C._set_leak_warnings(False)


os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)


class _Workers:
    """One pass's worker threads: they build batch k = build(the k-th of `tasks`) in order of k, at
    most `ahead` past the one the caller waits for. Daemon threads, not joined by the pass: an
    exception, a KeyboardInterrupt or a pass left early (close) drops the batches not started and
    returns at once, and a __getitem__ blocked in a thread does not hold up the caller (its result
    is thrown away when it ends). The interpreter's exit waits for them a while
    (_end_passes_at_exit)."""

    END = object()

    def __init__(self, build, tasks, workers, ahead, describe):
        self._build, self._tasks, self._ahead, self._describe = build, tasks, ahead, describe
        self._running = {}  # k -> its task, while built
        self._cv = threading.Condition()
        self._reader = threading.Lock()  # held while a thread reads the next task
        self._next = 0  # the next task to hand out
        self._wanted = 0  # the batch the caller waits for
        self._done = {}  # k -> (True, batch) or (False, exception)
        self._exhausted = self._closed = False
        self.threads = []
        _register_exit_hook()
        _passes.add(self)
        try:
            for i in range(workers):
                t = threading.Thread(target=self._run, name=f"kiln-loader-{i}", daemon=True)
                t.start()
                self.threads.append(t)
        except BaseException:  # a KeyboardInterrupt while starting them: those started stop too
            self.close()
            raise

    def _run(self):
        while True:
            # The tasks are read one thread at a time under _reader, not _cv: a sampler's or an
            # iterable dataset's code that stalls must not keep get() from the batches already built,
            # nor from its timeout.
            with self._reader:
                with self._cv:
                    while not (self._closed or self._exhausted) and self._next >= self._wanted + self._ahead:
                        self._cv.wait()
                    if self._closed or self._exhausted:
                        return
                    k = self._next
                try:
                    task = next(self._tasks)
                except StopIteration:
                    with self._cv:
                        self._exhausted = True
                        self._cv.notify_all()
                    return
                except BaseException as e:  # raised where batch k is asked for; the pass ends there
                    with self._cv:
                        self._exhausted = True
                        self._next += 1
                        self._done[k] = (False, e)
                        self._cv.notify_all()
                    return
                with self._cv:
                    if self._closed:  # closed while the task was read: no new batch
                        return
                    self._next += 1
                    self._running[k] = task
            try:
                result = (True, self._build(task))
            except BaseException as e:  # raised where the caller asks for batch k
                result = (False, e)
            with self._cv:
                if self._closed:
                    return
                del self._running[k]
                self._done[k] = result
                self._cv.notify_all()
            # not kept while the next one is built: a thread still blocked at exit would hold it (nanobind
            # reports the tensors in it as leaked)
            del result

    def get(self, k, timeout):
        """Batch k, or END after the last; waits at most `timeout` seconds (0: for ever)."""
        deadline = time.monotonic() + timeout if timeout else None
        with self._cv:
            self._wanted = k
            self._cv.notify_all()
            while k not in self._done:
                if self._exhausted and k >= self._next:
                    return _Workers.END
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    what = self._describe(self._running[k]) if k in self._running else "its samples not read yet"
                    raise RuntimeError(f"DataLoader: batch {k} of this pass ({what}) was not ready after "
                                       f"timeout={timeout:g} s")
                self._cv.wait(left)
            ok, value = self._done.pop(k)
        if not ok:
            raise value
        return value

    def close(self):
        with self._cv:
            self._closed = True
            self._done.clear()
            self._cv.notify_all()


class TensorDataset:
    """Samples from tensors of one length along dim 0, as torch's: item i is (t[i] for t in tensors)."""

    def __init__(self, *tensors):
        if not tensors:
            raise ValueError("TensorDataset: give at least one tensor")
        for i, t in enumerate(tensors):
            if not isinstance(t, _C.Tensor):
                raise TypeError(f"TensorDataset: argument {i} is {_a_type(t)}, not a kiln.Tensor")
            if len(t.shape) == 0:
                raise ValueError(f"TensorDataset: argument {i} is 0-dimensional; samples are taken along dim 0")
        sizes = [t.shape[0] for t in tensors]
        if any(n != sizes[0] for n in sizes):
            raise ValueError(f"TensorDataset: size mismatch between tensors: dim 0 sizes {sizes}")
        self.tensors = tensors

    def __getitem__(self, index):
        return tuple(t[index] for t in self.tensors)

    def __len__(self):
        return self.tensors[0].shape[0]


class Subset:
    """The items of dataset at indices, as torch's."""

    def __init__(self, dataset, indices):
        self.dataset, self.indices = dataset, indices

    def __getitem__(self, idx):
        if isinstance(idx, list):
            return [self.dataset[self.indices[i]] for i in idx]
        return self.dataset[self.indices[idx]]

    def __len__(self):
        return len(self.indices)


def random_split(dataset, lengths, generator=None):
    """Splits dataset into Subsets of the given lengths (or fractions summing to 1: the remainder
    given one by one from the first, as torch's) over a random permutation drawn from Kiln's generator
    (kiln.manual_seed); torch's generator= is refused."""
    if generator is not None:
        raise TypeError("random_split: generator is not supported (the permutation comes from Kiln's generator: "
                        "seed it with kiln.manual_seed)")
    n = len(dataset)
    lengths = list(lengths)
    if lengths and math.isclose(sum(lengths), 1) and sum(lengths) <= 1:
        sizes = []
        for i, frac in enumerate(lengths):
            if frac < 0 or frac > 1:
                raise ValueError(f"random_split: fraction at index {i} is not between 0 and 1")
            sizes.append(int(math.floor(n * frac)))
        for i in range(n - sum(sizes)):
            sizes[i % len(sizes)] += 1
        lengths = sizes
    if sum(lengths) != n:
        raise ValueError(f"random_split: sum of input lengths ({sum(lengths)}) does not equal the length of the input "
                         f"dataset ({n})")
    perm = np.argsort(_C.rand(n, dtype=_C.dtype.float64).numpy(), kind="stable").tolist() if n else []
    out, start = [], 0
    for length in lengths:
        out.append(Subset(dataset, perm[start:start + length]))
        start += length
    return out


def _pin(batch):
    if isinstance(batch, _C.Tensor):
        return batch.pin_memory()
    if isinstance(batch, dict):
        return {k: _pin(v) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*[_pin(v) for v in batch])
    if isinstance(batch, (tuple, list)):
        return type(batch)(_pin(v) for v in batch)
    return batch


# ---- text ----
from ._C import WordPieceTokenizer  # noqa: E402,F401


def _paths(files):
    # one path (str, bytes or a pathlib.Path) or a list of them, as strings
    if isinstance(files, (str, bytes)) or hasattr(files, "__fspath__"):
        files = [files]
    return [os.fsdecode(os.fspath(f)) for f in files]


def build_vocab(files, out, size=8000, min_frequency=2, lower_case=True):
    """Learns a WordPiece vocab.txt from text files (as `kiln vocab`): files is one path or a list of
    them (str or pathlib.Path, as masked_lm's), out the vocab.txt to write."""
    _C.build_vocab(_paths(files), os.fsdecode(os.fspath(out)), size, min_frequency, lower_case)


def _tokenizer(tokenizer):
    return tokenizer if isinstance(tokenizer, WordPieceTokenizer) else WordPieceTokenizer(str(tokenizer))


def masked_lm(files, tokenizer, seq_len=128, mask_prob=0.15):
    """Text files packed into [CLS] ... [SEP] sequences for masked-LM (kiln train --task mlm's data):
    batches hold input_ids, attention_mask, token_type_ids and labels (-100 where not masked).
    tokenizer: a WordPieceTokenizer or a vocab.txt path."""
    return _C._mlm_dataset(_tokenizer(tokenizer), _paths(files), seq_len, mask_prob)


def tsv_classification(path, tokenizer, seq_len=128, label_names=()):
    """label<TAB>text lines (kiln train --task classify's data for BERT): (dataset, label_names);
    batches hold input_ids, attention_mask, token_type_ids and target."""
    return _C._tsv_dataset(_tokenizer(tokenizer), str(path), seq_len, list(label_names))
