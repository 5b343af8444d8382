"""``np.load`` of user-given ``.npy`` files with one clear error for a damaged file; ``.pt`` tensors.

A 0-byte file (a copy that never finished), text or another format renamed to ``.npy``
and a file cut short raise ``EOFError``/``ValueError``/``UnpicklingError`` from deep
inside NumPy without the file's name; :func:`load_npy` names the file, its size and
what was found instead. An array of Python objects (``np.save`` of a list of mixed
values or of ``None``) is refused as what it is: loading it would run pickle code.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch


def load_npy(path: str | Path, mmap: bool = True) -> np.ndarray:
    """The array in ``path`` (memory-mapped read-only when ``mmap``), or a ValueError naming it.

    Raises:
        ValueError: ``path`` is empty, not in ``.npy`` format, shorter than its header says,
            or an array of Python objects.
    """
    path = Path(path)
    size = os.path.getsize(path)
    if size == 0:
        raise ValueError(f"{path} is empty (0 bytes): not a .npy array (an unfinished copy?)")
    with open(path, "rb") as f:
        magic = f.read(6)
    if magic != b"\x93NUMPY":
        raise ValueError(
            f"{path} is not a .npy file (it starts with {magic!r}, not the .npy header "
            "b'\\x93NUMPY'); save arrays with np.save"
        )
    dtype = _header_dtype(path)
    if dtype is not None and dtype.hasobject:
        raise ValueError(
            f"{path} holds an array of Python objects (dtype {dtype}), which is not read "
            "(unpickling can run code): save numbers as an integer/float array and names "
            "with a string dtype, e.g. np.save(path, np.array(names, dtype=str))"
        )
    try:
        array = np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except (ValueError, EOFError, OSError) as err:
        raise ValueError(
            f"{path} ({size:,} bytes) is not a readable .npy array (truncated or damaged?): {err}"
        ) from err
    if mmap and isinstance(array, np.memmap):
        return array
    return np.asarray(array)


def _header_dtype(path: Path) -> np.dtype | None:
    """The dtype in a ``.npy`` header (format 1.0/2.0), None when it cannot be read here."""
    readers = {1: np.lib.format.read_array_header_1_0, 2: np.lib.format.read_array_header_2_0}
    try:
        with open(path, "rb") as f:
            major, _ = np.lib.format.read_magic(f)
            return readers[major](f)[2] if major in readers else None
    except (ValueError, OSError, EOFError):
        return None  # np.load says what is wrong


def load_pt(path: str | Path):
    """``torch.load`` of a tensor file (weights only), memory-mapped when it is zip-format."""
    try:
        return torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except RuntimeError:  # not a zip-format file: no mmap
        return torch.load(path, map_location="cpu", weights_only=True)
