"""Reading arrays for the commands: memory-mapped .npy, and one-line errors for files that
are empty, not .npy, truncated or pickled objects."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rl_gap.commands.npy_io import load_npy, load_pt


def test_npy_is_memory_mapped_read_only_or_loaded(tmp_path):
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    np.save(tmp_path / "x.npy", x)
    mapped = load_npy(tmp_path / "x.npy")
    assert isinstance(mapped, np.memmap) and not mapped.flags.writeable
    assert np.array_equal(mapped, x)
    loaded = load_npy(tmp_path / "x.npy", mmap=False)
    assert type(loaded) is np.ndarray and np.array_equal(loaded, x)


def test_damaged_files_are_named(tmp_path):
    (tmp_path / "empty.npy").write_bytes(b"")
    with pytest.raises(ValueError, match=r"empty.npy is empty \(0 bytes\)"):
        load_npy(tmp_path / "empty.npy")
    (tmp_path / "text.npy").write_text("1,2,3\n")
    with pytest.raises(ValueError, match="is not a .npy file"):
        load_npy(tmp_path / "text.npy")
    np.save(tmp_path / "cut.npy", np.zeros((100, 8), dtype=np.float32))
    data = (tmp_path / "cut.npy").read_bytes()
    (tmp_path / "cut.npy").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"cut.npy \([\d,]+ bytes\) is not a readable .npy array"):
        load_npy(tmp_path / "cut.npy")
    np.save(tmp_path / "objects.npy", np.array([{"a": 1}, None], dtype=object))
    with pytest.raises(ValueError, match="array of Python objects"):
        load_npy(tmp_path / "objects.npy")


def test_pt_tensors_load_with_and_without_zip_format(tmp_path):
    x = torch.arange(6.0).reshape(2, 3)
    torch.save({"embeddings": x}, tmp_path / "zip.pt")
    torch.save(x, tmp_path / "legacy.pt", _use_new_zipfile_serialization=False)
    assert torch.equal(load_pt(tmp_path / "zip.pt")["embeddings"], x)
    assert torch.equal(load_pt(tmp_path / "legacy.pt"), x)
