"""kiln.data: the engine's data sets and loader (background threads build batches, optionally in
page-locked memory, so a GPU never waits).

    d = kiln.data.fashion_mnist()                  # Debian's dataset-fashion-mnist
    loader = kiln.data.DataLoader(d["train"], batch_size=128, shuffle=True, workers=2)
    for batch in loader:                           # one epoch per iteration
        x, y = batch["input"], batch["target"]
"""
import numbers

from . import _C

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"


def mnist_dir(path, name="mnist", augment=True, mean=(0.2860,), std=(0.3530,)):
    """An MNIST-format directory (train/t10k idx files, gzipped or not): {"train", "test",
    "num_classes", "shape", "class_names"}; augment: random crop (pad 2) and horizontal flip."""
    return dict(_C._load_mnist_dir(str(path), name, 2 if augment else 0, bool(augment), list(mean), list(std)))


def fashion_mnist(path=FASHION_MNIST_DIR, augment=True):
    """Fashion-MNIST with kiln train's transforms (the same batches for the same seed)."""
    return mnist_dir(path, "fashion-mnist", augment)


class DataLoader:
    """Batches of a kiln Dataset as dicts of tensors; each iteration is the next epoch (shuffled by
    seed and epoch, the same order every run)."""

    def __init__(self, dataset, batch_size=32, shuffle=True, drop_last=False, seed=0, workers=1, pin_memory=False):
        if not isinstance(dataset, _C.Dataset):
            raise TypeError(f"DataLoader: dataset must be a kiln Dataset (kiln.data.mnist, images, masked_lm, "
                            f"tsv_classification, ...), got {type(dataset).__name__}; a Python dataset is not "
                            "supported yet")
        for name, v in (("batch_size", batch_size), ("workers", workers)):
            if isinstance(v, bool) or not isinstance(v, numbers.Integral):
                raise TypeError(f"DataLoader: {name} must be an int, got {v!r}")
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
            raise TypeError(f"DataLoader: seed must be an int, got {seed!r}")
        # as kiln.manual_seed: any int, taken modulo 2**64
        self._impl = _C._Loader(dataset, int(batch_size), bool(shuffle), bool(drop_last), int(seed) % 2**64,
                                int(workers), bool(pin_memory))
        self._generation = 0

    def __len__(self):
        return len(self._impl)

    def __iter__(self):
        # One pass at a time: the batches come from one C++ loader, so a second iter() starts the next
        # epoch under the first. Iterating the first after that is an error, not a silent split of the
        # samples between the two (zip(loader, loader) gave each sample to one of them).
        self._generation += 1
        mine = self._generation
        self._impl.start_epoch()
        while True:
            if self._generation != mine:
                raise RuntimeError("DataLoader: this iterator was superseded by a newer iter() of the same loader "
                                   "(each iteration is the next epoch, one at a time); make a second DataLoader "
                                   "to read two passes side by side")
            b = self._impl.next()
            if b is None:
                return
            yield b


# ---- text ----
from ._C import WordPieceTokenizer, build_vocab  # noqa: E402,F401


def _tokenizer(tokenizer):
    return tokenizer if isinstance(tokenizer, WordPieceTokenizer) else WordPieceTokenizer(str(tokenizer))


def masked_lm(files, tokenizer, seq_len=128, mask_prob=0.15):
    """Text files packed into [CLS] ... [SEP] sequences for masked-LM (kiln train --task mlm's data):
    batches hold input_ids, attention_mask, token_type_ids and labels (-100 where not masked).
    tokenizer: a WordPieceTokenizer or a vocab.txt path."""
    files = [str(files)] if isinstance(files, (str, bytes)) or hasattr(files, "__fspath__") else [str(f) for f in files]
    return _C._mlm_dataset(_tokenizer(tokenizer), files, seq_len, mask_prob)


def tsv_classification(path, tokenizer, seq_len=128, label_names=()):
    """label<TAB>text lines (kiln train --task classify's data for BERT): (dataset, label_names);
    batches hold input_ids, attention_mask, token_type_ids and target."""
    return _C._tsv_dataset(_tokenizer(tokenizer), str(path), seq_len, list(label_names))
