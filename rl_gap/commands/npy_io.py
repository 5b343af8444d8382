"""``np.load`` of user-given ``.npy`` files with one clear error for a damaged file.

A 0-byte file (a copy that never finished), text or another format renamed to ``.npy``
and a file cut short raise ``EOFError``/``ValueError``/``UnpicklingError`` from deep
inside NumPy without the file's name; :func:`load_npy` names the file, its size and
what was found instead.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np


def load_npy(path: str | Path, mmap: bool = True) -> np.ndarray:
    """The array in ``path`` (memory-mapped read-only when ``mmap``), or a ValueError naming it.

    Raises:
        ValueError: ``path`` is empty, not in ``.npy`` format, or shorter than its header says.
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
    try:
        array = np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except (ValueError, EOFError, OSError) as err:
        raise ValueError(
            f"{path} ({size:,} bytes) is not a readable .npy array (truncated or damaged?): {err}"
        ) from err
    if mmap and isinstance(array, np.memmap):
        return array
    return np.asarray(array)
