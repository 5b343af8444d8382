"""Query-side score normalisation against a background set (pure tensor functions).

The normalisation the gSAP paper evaluates on its distractor-query tasks
(§B.4, Table 8) is the one of the copy-detection literature (SSCD, Pizzi et
al. 2022, eq. 8): every score of query q is shifted by a query-specific
statistic of q's similarities to a *background* set B of images that are
neither queries nor database items (DISC21: its training images),

    s'(q, d) = s(q, d) - beta * mean_{n = first..last} s(q, b_(n)),

where ``b_(n)`` is q's (n+1)-th most similar background item (``first`` and
``last`` 0-based, inclusive; SSCD's default is beta = 1, neighbours 0..2).
A query whose descriptor is close to everything (a "hub") is pushed down,
so scores become comparable across queries. Per-query metrics (mAP, R@k) are
unchanged (a row shift keeps the row's order); gAP and global thresholds change.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rl_gap.metrics.functional.engine_inputs import check_embeddings
from rl_gap.precision import autocast_disabled

__all__ = ["ScoreNorm", "background_offsets", "normalize_scores", "offset_embeddings"]


@dataclass(frozen=True)
class ScoreNorm:
    """Settings of the normalisation: ``beta`` and the neighbour ranks ``first..last``."""

    beta: float = 1.0
    first: int = 0
    last: int = 2

    def __post_init__(self) -> None:
        for name in ("first", "last"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(
                    f"score normalisation: {name} must be an integer >= 0, got {value!r}"
                )
        if self.first > self.last:
            raise ValueError(
                f"score normalisation: first ({self.first}) must be <= last ({self.last})"
            )
        if not isinstance(self.beta, (int, float)) or not torch.isfinite(torch.tensor(self.beta)):
            raise ValueError(
                f"score normalisation: beta must be a finite number, got {self.beta!r}"
            )


def _wide(x: Tensor, name: str) -> Tensor:
    if not isinstance(x, Tensor):
        raise ValueError(f"{name} must be a torch tensor, got {type(x).__name__}")
    check_embeddings(x, name)
    return x if x.dtype == torch.float64 else x.float()


def background_offsets(
    queries: Tensor,
    background: Tensor,
    norm: ScoreNorm = ScoreNorm(),
    block_size: int = 8192,
    device: torch.device | str | None = None,
) -> Tensor:
    """Per-query offsets ``beta * mean of the first..last highest background similarities``.

    Scores are dot products (L2-normalise beforehand for cosine), computed in
    float32 (float64 kept) with autocast off, in blocks of ``block_size``
    background rows: memory O(Q * (last + 1 + block_size)). The background is read
    one block at a time (a memory map or float16 array is never copied whole) and
    each block moved to the scoring device.

    Args:
        queries: (Q, dim) query embeddings.
        background: (B, dim) background embeddings, B > ``norm.last``.
        norm: beta and neighbour ranks.
        block_size: background rows scored at once.
        device: where to score (default: the queries' device).

    Returns:
        (Q,) offsets, float32 (float64 for float64 inputs).
    """
    if not isinstance(background, Tensor):
        raise ValueError(
            f"background embeddings must be a torch tensor, got {type(background).__name__}"
        )
    check_embeddings(background, "background embeddings")
    device = torch.device(device) if device is not None else queries.device
    q = _wide(queries, "query embeddings").to(device)
    b = background
    if q.shape[1] != b.shape[1]:
        raise ValueError(f"queries have dim {q.shape[1]} but the background has dim {b.shape[1]}")
    keep = norm.last + 1
    if b.shape[0] < keep:
        raise ValueError(
            f"score normalisation averages background neighbours {norm.first}..{norm.last}: "
            f"needs at least {keep} background items, got {b.shape[0]}"
        )
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    dtype = torch.float64 if torch.float64 in (q.dtype, b.dtype) else torch.float32
    q = q.to(dtype)
    top = torch.full((q.shape[0], 0), float("-inf"), dtype=dtype, device=q.device)
    with autocast_disabled(q):
        for start in range(0, b.shape[0], block_size):
            rows = b[start : start + block_size].to(dtype=dtype, device=q.device)
            scores = q @ rows.T
            merged = torch.cat([top, scores], dim=1)
            top = torch.topk(merged, min(keep, merged.shape[1]), dim=1).values
    return norm.beta * top[:, norm.first : norm.last + 1].mean(dim=1)


def normalize_scores(scores: Tensor, offsets: Tensor) -> Tensor:
    """``scores - offsets[:, None]``: (Q, D) scores, (Q,) offsets; float32 at least."""
    if scores.ndim != 2:
        raise ValueError(f"scores must be (Q, D), got shape {tuple(scores.shape)}")
    if offsets.shape != (scores.shape[0],):
        raise ValueError(
            f"offsets must be ({scores.shape[0]},) (one per query row), got {tuple(offsets.shape)}"
        )
    dtype = torch.float64 if torch.float64 in (scores.dtype, offsets.dtype) else torch.float32
    return scores.to(dtype) - offsets.to(dtype=dtype, device=scores.device)[:, None]


def offset_embeddings(queries: Tensor, database: Tensor, offsets: Tensor) -> tuple[Tensor, Tensor]:
    """Embeddings whose dot products are the normalised scores: ``[q, -offset] . [d, 1]
    = q . d - offset``, so the blocked metric engine ranks normalised scores unchanged.

    Args:
        queries: (Q, dim); database: (D, dim); offsets: (Q,).

    Returns:
        (Q, dim + 1) and (D, dim + 1), float32 (float64 kept).
    """
    q = _wide(queries, "query embeddings")
    d = _wide(database, "database embeddings")
    if offsets.shape != (q.shape[0],):
        raise ValueError(
            f"offsets must be ({q.shape[0]},) (one per query), got {tuple(offsets.shape)}"
        )
    dtype = torch.float64 if torch.float64 in (q.dtype, d.dtype, offsets.dtype) else torch.float32
    q_aug = torch.cat([q.to(dtype), -offsets.to(dtype=dtype, device=q.device)[:, None]], dim=1)
    d_aug = torch.cat([d.to(dtype), torch.ones(d.shape[0], 1, dtype=dtype, device=d.device)], dim=1)
    return q_aug, d_aug
