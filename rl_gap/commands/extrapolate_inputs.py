"""Inputs of ``rl-gap extrapolate``: embedding files, labels, and each query's positive scores.

The positive scores are built block by block and only each query's top ``k``
are kept: AP@k never counts a positive ranked below k, and positive j ranks at
least j, so the top min(k, m) of a query's m positives give its AP@k exactly
(the normaliser is min(k, m) either way). Memory is then bounded by Q·k, not by
the number of (query, positive) pairs, which leave-one-out on a labelled set
makes quadratic.
"""

from __future__ import annotations

import math
import os

import numpy as np
import torch

from rl_gap.commands.labels import as_numbers, load_labels
from rl_gap.commands.npy_io import load_npy

#: Query-by-positive scores held at once while building the positive matrix.
PAIR_BLOCK = 1 << 24


def load_array(path: str, name: str, layout: str) -> np.ndarray | torch.Tensor:
    """Load ``.npy`` (memory-mapped), ``.pt`` (tensor or ndarray), or a writer folder's embeddings."""
    if os.path.isdir(path):
        path = folder_file(path, "embeddings.npy", name)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{name}: no file {path!r} (expected {layout} as .npy or .pt)")
    if path.endswith(".npy"):
        return load_npy(path)
    if path.endswith((".pt", ".pth")):
        obj = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
        if not isinstance(obj, torch.Tensor | np.ndarray):
            raise ValueError(
                f"{name}: {path!r} must hold one tensor ({layout}), got {type(obj).__name__}"
            )
        return obj
    raise ValueError(f"{name}: unsupported file type {path!r}; use .npy or .pt ({layout})")


def same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def same_embeddings(a: str, b: str) -> bool:
    """Whether two embedding arguments name one set: the same file or folder, or a
    prediction-writer folder and the ``embeddings.npy`` inside it."""

    def file_of(path: str) -> str:
        return os.path.join(path, "embeddings.npy") if os.path.isdir(path) else path

    return same_file(a, b) or same_file(file_of(a), file_of(b))


def read_labels(path: str, name: str, count: int) -> np.ndarray:
    """Labels of ``count`` items read as ``rl-gap evaluate`` reads them
    (:func:`rl_gap.commands.labels.load_labels`: .npy, .pt, or .txt/.csv one per line);
    text that is all numbers becomes numbers, so ``7`` in a text file equals 7 in a .npy."""
    try:
        labels = np.asarray(load_labels(path, count))
        numbers = as_numbers(labels) if labels.dtype.kind in "US" else None
    except (OSError, ValueError) as err:
        raise type(err)(f"{name}: {err}") from err
    return labels if numbers is None else numbers


def folder_file(folder: str, filename: str, name: str) -> str:
    path = os.path.join(folder, filename)
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"{name}: folder {folder!r} has no {filename} (a prediction-writer folder holds "
            "embeddings.npy (n, d) and labels.npy (n,))"
        )
    return path


def folder_labels(path: str | None, name: str) -> str | None:
    """``labels.npy`` of a prediction-writer folder given as ``path``; None for a plain file."""
    if path is None or not os.path.isdir(path):
        return None
    return folder_file(path, "labels.npy", name)


def integer_indices(values: np.ndarray, name: str) -> torch.Tensor:
    """int64 tensor of ``values``; a clear error for non-integer (e.g. float 2.5) entries."""
    arr = np.asarray(values)
    if arr.dtype.kind in "iu":
        return torch.as_tensor(arr.astype(np.int64))
    if arr.dtype.kind == "f":
        bad = ~np.isfinite(arr) | (arr != np.round(arr))
        if bad.any():
            first = arr[bad].ravel()[0]
            raise ValueError(
                f"{name} must hold integer indices; found {int(bad.sum())} non-integer "
                f"value(s), e.g. {first!r} (dtype {arr.dtype}); refusing to truncate them"
            )
        return torch.as_tensor(arr.astype(np.int64))
    raise ValueError(f"{name} must hold integer indices, got dtype {arr.dtype}")


def check_embeddings(x, name: str, dim: int | None = None) -> None:
    floating = x.dtype.is_floating_point if isinstance(x, torch.Tensor) else x.dtype.kind == "f"
    if not floating:
        # an int8/uint8 (quantised) file would be cast and score as garbage: refuse, as evaluate
        raise ValueError(
            f"{name} must be floating point embeddings, got dtype {x.dtype}; "
            "dequantise them first (e.g. x.astype(np.float32) * scale)"
        )
    if x.ndim != 2 or x.shape[0] == 0:
        raise ValueError(f"{name} must be a non-empty (n, d) matrix, got shape {tuple(x.shape)}")
    if dim is not None and x.shape[1] != dim:
        raise ValueError(f"{name} has dimension {x.shape[1]}, the queries {dim}")


def label_codes(
    query_labels: np.ndarray, positive_labels: np.ndarray
) -> tuple[torch.Tensor, torch.Tensor]:
    """Integer codes of two label arrays, equal iff the labels are (numbers or strings alike)."""
    ql, pl = np.asarray(query_labels), np.asarray(positive_labels)
    for option, lab in (("--query-labels", ql), ("--positive-labels", pl)):
        if lab.dtype.kind == "f" and not bool(np.isfinite(lab).all()):
            # NaN equals nothing: those items would silently have no positives
            bad = int((~np.isfinite(lab)).sum())
            raise ValueError(f"{option} holds {bad} NaN/inf label(s); labels are class ids")
        if lab.dtype.kind not in "iufbUS":
            raise ValueError(f"{option} must hold numbers or strings, got dtype {lab.dtype}")
    text = (ql.dtype.kind in "US", pl.dtype.kind in "US")
    if text[0] != text[1]:
        raise ValueError(
            f"--query-labels ({ql.dtype}) and --positive-labels ({pl.dtype}) must both be "
            "numbers or both be strings"
        )
    joined = np.concatenate([ql.astype(str) if text[0] else ql, pl.astype(str) if text[1] else pl])
    _, codes = np.unique(joined, return_inverse=True)
    codes = torch.as_tensor(codes.astype(np.int64).ravel())
    return codes[: ql.shape[0]], codes[ql.shape[0] :]


def top_positive_scores(
    queries: torch.Tensor,
    positives: torch.Tensor,
    k: int,
    *,
    owner: torch.Tensor | None = None,
    query_codes: torch.Tensor | None = None,
    positive_codes: torch.Tensor | None = None,
    leave_one_out: bool = False,
    progress=None,
) -> torch.Tensor:
    """(Q, w) float64 scores of each query's top min(k, m) positives, NaN-padded.

    Positives are tied to queries by ``owner`` (P,) query indices, or by equal
    ``query_codes`` (Q,) / ``positive_codes`` (P,) (``leave_one_out``: query i is
    not its own positive i). ``progress(done, total)`` follows the query blocks.
    """
    Q, P = queries.shape[0], positives.shape[0]
    if owner is not None:
        scores = (queries[owner].double() * positives.double()).sum(1)
        return _top_per_query(owner, scores, Q, k)
    per_query = torch.bincount(positive_codes, minlength=int(query_codes.max()) + 1)
    m = per_query[query_codes].clamp(max=len(positive_codes)) - int(leave_one_out)
    width = max(1, min(int(k), int(m.max()) if m.numel() else 1))
    out = torch.full((Q, width), math.nan, dtype=torch.float64)
    block = max(1, PAIR_BLOCK // max(P, 1))
    for start in range(0, Q, block):
        rows = slice(start, min(Q, start + block))
        scores = queries[rows].double() @ positives.double().T
        match = query_codes[rows].unsqueeze(1) == positive_codes.unsqueeze(0)
        if leave_one_out:
            idx = torch.arange(rows.start, rows.stop)
            match[idx - rows.start, idx] = False
        scores = scores.masked_fill(~match, -math.inf)
        top = torch.topk(scores, width, dim=1).values
        out[rows] = top.masked_fill(torch.isinf(top), math.nan)
        if progress is not None:
            progress(rows.stop, Q)
    return out


def _top_per_query(owner: torch.Tensor, scores: torch.Tensor, Q: int, k: int) -> torch.Tensor:
    """(Q, min(k, max count)) top scores of each owner, descending, NaN-padded."""
    counts = torch.bincount(owner, minlength=Q)
    width = max(1, min(int(k), int(counts.max()) if counts.numel() else 1))
    # Sort by score (descending), then stably by owner: each owner's scores descending.
    by_score = torch.argsort(scores, descending=True, stable=True)
    order = by_score[torch.argsort(owner[by_score], stable=True)]
    starts = torch.cumsum(counts, 0) - counts
    slot = torch.arange(owner.numel()) - starts[owner[order]]
    keep = slot < width
    out = torch.full((Q, width), math.nan, dtype=torch.float64)
    out[owner[order][keep], slot[keep]] = scores[order][keep]
    return out
