"""kiln.utils.data: torch.utils.data's names over kiln.data, so that a ported script's
`from kiln.utils.data import DataLoader, Dataset, TensorDataset` works. The loader, the data sets and
their helpers are kiln.data's own objects (see it for what they take)."""
from ..data import (  # noqa: F401
    DataLoader, TensorDataset, Subset, random_split, default_collate, default_convert,
)

__all__ = ["DataLoader", "Dataset", "TensorDataset", "Subset", "random_split", "default_collate",
           "default_convert"]


class Dataset:
    """torch.utils.data.Dataset: the base class of a map-style Python data set. A subclass gives
    __getitem__ (sample i) and __len__; kiln.data.DataLoader takes it as any object with those two."""

    def __getitem__(self, index):
        raise NotImplementedError(f"{type(self).__name__}: a subclass of kiln.utils.data.Dataset must implement "
                                  f"__getitem__ (and __len__, for DataLoader)")
