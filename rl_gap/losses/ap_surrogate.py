"""Shared frame of the per-query and global AP surrogates (SoftBin, BlackBox, SupAP).

Each surrogate family names its kernel, ``list_kernel(scores, positive, valid,
*kernel_args())``, that scores every row of an (R, D) matrix as its own ranked
list (and, for its sharded global loss, ``sharded_kernel``). The loss classes
built on :class:`APSurrogateLoss` only differ in which lists they hand to it
(gSAP paper, Table L):

- per-query (``softbin``, ``blackbox``, ``supap``): each row of ``sim`` with ≥ 1
  valid positive is a list; loss = 1 − mean of the row surrogates
  (``symmetric=True`` also ranks the columns and averages both directions);
- global (``gsoftbin``, ``gblackbox``, ``gsupap``): the valid pairs of the whole
  matrix, flattened row-major, are *one* list (a (1, M) matrix); loss = 1 − its
  surrogate. So a global loss equals its per-query loss applied to the one-row
  matrix of the flattened valid pairs.

Negative dropping (``neg_drop`` = α) follows ``rl_gap/losses/common.py``:
per row for the per-query losses, over the flattened list for the global ones.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Callable
from typing import Any, ClassVar

import torch

from rl_gap.losses.base import RankingLoss
from rl_gap.losses.common import (
    check_neg_drop,
    compute_dtype,
    drop_lowest_negatives,
)
from rl_gap.losses.sharding.call import agree, symmetric_not_sharded
from rl_gap.losses.sharding.rows import kept_flat, row_mean


def check_chunk_size(chunk_size: int | None) -> int | None:
    if chunk_size is None:
        return None
    if isinstance(chunk_size, bool) or int(chunk_size) != chunk_size or int(chunk_size) < 1:
        raise ValueError(f"chunk_size must be a positive integer or None, got {chunk_size!r}")
    return int(chunk_size)


def check_positive_finite(name: str, value: float, allow_zero: bool = False) -> float:
    value = float(value)
    ok = value >= 0 if allow_zero else value > 0
    if not (ok and math.isfinite(value)):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be a finite number {bound}, got {value}")
    return value


def pessimistic_ranks(scores: torch.Tensor, member: torch.Tensor) -> torch.Tensor:
    """Rank of every member item within its row, ties counted against it.

    ``rank[r, i] = |{j : member[r, j] and scores[r, j] >= scores[r, i]}|`` (the
    item itself included, so the top item has rank 1; equal scores all get
    the largest rank of their tie group, as exact AP counts them). Non-members
    get 0. One sort per row and a sorted-into-sorted ``searchsorted``; no
    gradient; extra memory a few (R, D) arrays.

    Args:
        scores: (R, D) finite float scores.
        member: (R, D) bool, the items of each row's list.

    Returns:
        (R, D) int32 ranks.
    """
    key = scores.detach().masked_fill(~member, -math.inf)
    sorted_vals, order = key.sort(dim=1, descending=True)
    ascending = sorted_vals.neg_()  # non-members (+inf) last
    # |{j : −s_j ≤ −s_i}| = |{j : s_j ≥ s_i}| among members (+inf only counts itself).
    rank_sorted = torch.searchsorted(ascending, ascending, right=True, out_int32=True)
    ranks = torch.empty_like(rank_sorted).scatter_(1, order, rank_sorted)
    return ranks.masked_fill_(~member, 0)


class APSurrogateLoss(RankingLoss, abc.ABC):
    """``1 − surrogate AP``, per query (mean over rows) or global (one flattened list).

    Subclasses set ``global_ranking``, :attr:`list_kernel` (optionally :attr:`sharded_kernel`),
    :meth:`kernel_args` and, for ``repr``, :meth:`settings`. Inputs
    follow the loss contract: ``sim``, ``rel``, ``valid`` (Q, D) -> 0-d loss
    (float32 for half-precision inputs, else ``sim.dtype``). A batch with no
    valid positive gives a zero loss with a warning; rows with no valid
    positive are ignored by the per-query losses (their pairs are still
    negatives of the global list).
    """

    global_ranking: ClassVar[bool] = False

    def __init__(self, neg_drop: float = 0.0, symmetric: bool = False) -> None:
        super().__init__()
        self.neg_drop = check_neg_drop(neg_drop)
        self.symmetric = bool(symmetric)
        if self.symmetric and self.global_ranking:
            raise ValueError("a global loss ranks one list; symmetric=True does not apply")

    list_kernel: ClassVar[Callable[..., torch.Tensor]]
    """``list_kernel(scores, positive, valid, *self.kernel_args())``: the (R,) AP of every row
    of (R, D) scores, each row one list (``positive`` ⊆ ``valid``, every row with ≥ 1),
    differentiable w.r.t. ``scores``; set with ``staticmethod``."""

    sharded_kernel: ClassVar[Callable[..., torch.Tensor] | None] = None
    """``sharded_kernel(scores, positive, *self.kernel_args())``: the 0-d AP of the one list
    concatenated over ranks from this rank's (n,) kept flat scores, the same on every rank
    (backward: this rank's items' gradient). A family with one runs its global loss sharded."""

    @abc.abstractmethod
    def kernel_args(self) -> tuple[Any, ...]:
        """The family's settings, as its kernels take them after the lists."""

    def list_ap(
        self, scores: torch.Tensor, positive: torch.Tensor, valid: torch.Tensor
    ) -> torch.Tensor:
        """Surrogate AP of every row, each row one list (:attr:`list_kernel`).

        Args:
            scores: (R, D) float32/float64 scores.
            positive: (R, D) bool, valid relevant items (every row has ≥ 1).
            valid: (R, D) bool, the items of each row's list (⊇ ``positive``).

        Returns:
            (R,) surrogate AP per row, differentiable w.r.t. ``scores``.
        """
        return type(self).list_kernel(scores, positive, valid, *self.kernel_args())

    def check_scores(self, sim: torch.Tensor, valid: torch.Tensor) -> None:
        """Hook for a family's own input checks (e.g. a fixed similarity range)."""

    def extra_repr(self) -> str:
        settings = {**self.settings(), "neg_drop": self.neg_drop}
        if not self.global_ranking:
            settings["symmetric"] = self.symmetric
        return ", ".join(f"{name}={value}" for name, value in settings.items())

    def settings(self) -> dict[str, Any]:
        """The family's settings as ``repr`` shows them (before ``neg_drop``)."""
        return {}

    def _mean_row_ap(
        self, sim: torch.Tensor, rel: torch.Tensor, valid: torch.Tensor
    ) -> torch.Tensor:
        has_pos = (rel & valid).any(1)
        valid = drop_lowest_negatives(sim, rel, valid, self.neg_drop)
        scores, rel, valid = sim[has_pos], rel[has_pos], valid[has_pos]
        return self.list_ap(scores, rel & valid, valid).mean()

    def _loss(self, sim: torch.Tensor, rel: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        sim = sim.to(compute_dtype(sim.dtype))
        self.check_scores(sim, valid)
        if self.global_ranking:
            scores = sim[valid]  # row-major flat list
            positive = rel[valid]
            if self.neg_drop > 0:
                keep = drop_lowest_negatives(
                    scores[None], positive[None], torch.ones_like(positive)[None], self.neg_drop
                )[0]
                scores, positive = scores[keep], positive[keep]
            ap = self.list_ap(scores[None], positive[None], torch.ones_like(positive)[None])[0]
        else:
            ap = self._mean_row_ap(sim, rel, valid)
            if self.symmetric:
                ap = 0.5 * (ap + self._mean_row_ap(sim.T, rel.T, valid.T))
        return 1.0 - ap

    def sharding_unsupported(self) -> str | None:
        """Why these settings cannot be sharded (None: they can)."""
        if self.symmetric:
            return symmetric_not_sharded(self)
        if self.global_ranking and self.sharded_kernel is None:
            return f"{type(self).__name__} has no sharded global ranking"
        return None

    def _loss_sharded(
        self, sim: torch.Tensor, rel: torch.Tensor, valid: torch.Tensor
    ) -> torch.Tensor:
        """Per query: row partial sums; global: the family's :attr:`sharded_kernel`."""
        sim = sim.to(compute_dtype(sim.dtype))
        agree(lambda: self.check_scores(sim, valid), sim.device)
        if self.global_ranking:
            scores, positive = kept_flat(sim, rel, valid, self.neg_drop)
            kernel = type(self).sharded_kernel
            if kernel is None:
                raise NotImplementedError(f"{type(self).__name__} has no sharded global ranking")
            return 1.0 - kernel(scores, positive, *self.kernel_args())

        def per_rows(s, r, v, has_pos):
            s, r, v = s[has_pos], r[has_pos], v[has_pos]
            return self.list_ap(s, r & v, v)

        return 1.0 - row_mean(sim, rel, valid, per_rows, self.neg_drop)
