"""A lazy zarr array whose every slice is a checked read (``SpectrumStore.V``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from gradspec.store._integrity import ArrayChecker


class CheckedView:
    """A lazy 2-D zarr array read through :meth:`ArrayChecker.read` (``SpectrumStore.V``): each
    slice checks the chunks it touches, and a chunk that fails its checksum is named."""

    def __init__(self, checker: ArrayChecker, name: str, array: Any) -> None:
        self._checker, self._name, self._array = checker, name, array
        self.shape = tuple(int(s) for s in array.shape)
        self.chunks = tuple(int(c) for c in array.chunks)
        self.dtype = np.dtype(array.dtype)
        self.ndim = len(self.shape)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, sel: Any) -> np.ndarray:
        return self._checker.read(self._name, self._array, sel)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        out = self[:]
        return out if dtype is None else out.astype(dtype, copy=False)
