"""mSAP: 1 − mean per-query smoothed AP (Smooth-AP, Brown et al., ECCV 2020).

Each row of the similarity matrix is its own ranked list; the loss averages
the rows with at least one valid positive. ``symmetric=True`` (cross-modal)
also ranks every column and averages the two directions.
"""

from __future__ import annotations

import torch

from rl_gap.losses.base import RankingLoss
from rl_gap.losses.common import (
    check_neg_drop,
    check_temperature,
    drop_lowest_negatives,
)
from rl_gap.losses.registry import register_loss
from rl_gap.losses.sharding.call import symmetric_not_sharded
from rl_gap.losses.sharding.rows import row_mean
from rl_gap.losses.smoothed_ap import smoothed_ap_rows


def mean_row_smoothed_ap(
    sim: torch.Tensor,
    rel: torch.Tensor,
    valid: torch.Tensor,
    temperature: float,
    neg_drop: float,
    chunk_size: int | None,
) -> torch.Tensor:
    """Mean smoothed AP over the rows of ``sim`` with ≥ 1 valid positive (0-d).

    ``neg_drop`` drops each row's ``floor(α · N_row)`` lowest valid negatives
    (ties: lower column index first) before ranking.
    """
    has_pos = (rel & valid).any(1)
    valid = drop_lowest_negatives(sim, rel, valid, neg_drop)
    per_row = smoothed_ap_rows(sim, rel, valid, temperature, chunk_size)
    return per_row[has_pos].mean()


@register_loss("msap")
class MeanSmoothAPLoss(RankingLoss):
    """mSAP loss: ``1 − mean_{rows with a positive} SAP(row)``.

    Args:
        temperature: sigmoid temperature τ > 0.
        neg_drop: α in [0, 1), per-list negative dropping: each row (and, when
            symmetric, each column) drops its ``floor(α · N)`` lowest valid
            negatives (no gradient through the selection; positives kept; ties:
            lower index first).
        symmetric: also rank the columns (D lists over Q) and average both.
        chunk_size: rows per chunk (peak extra memory one chunk × K × D
            block, K = most positives in a row); None = automatic (~2^24 elements).

    Shapes: ``sim``, ``rel``, ``valid``: (Q, D) -> 0-d loss.
    """

    def __init__(
        self,
        temperature: float = 0.01,
        neg_drop: float = 0.0,
        symmetric: bool = False,
        chunk_size: int | None = None,
    ) -> None:
        super().__init__()
        self.temperature = check_temperature(temperature)
        self.neg_drop = check_neg_drop(neg_drop)
        self.symmetric = bool(symmetric)
        if chunk_size is not None and int(chunk_size) < 1:
            raise ValueError(f"chunk_size must be a positive integer or None, got {chunk_size}")
        self.chunk_size = None if chunk_size is None else int(chunk_size)

    def extra_repr(self) -> str:
        return (
            f"temperature={self.temperature}, neg_drop={self.neg_drop}, symmetric={self.symmetric}"
        )

    def _loss(self, sim: torch.Tensor, rel: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        args = (self.temperature, self.neg_drop, self.chunk_size)
        sap = mean_row_smoothed_ap(sim, rel, valid, *args)
        if self.symmetric:
            sap = 0.5 * (sap + mean_row_smoothed_ap(sim.T, rel.T, valid.T, *args))
        return 1.0 - sap

    def sharding_unsupported(self) -> str | None:
        """Columns are lists over every rank's rows: ``symmetric=True`` is not sharded."""
        if self.symmetric:
            return symmetric_not_sharded(self)
        return None

    def _loss_sharded(
        self, sim: torch.Tensor, rel: torch.Tensor, valid: torch.Tensor
    ) -> torch.Tensor:
        """Each row is complete on its rank: the row sums and row count are all-reduced."""

        def per_rows(s, r, v, has_pos):
            return smoothed_ap_rows(s, r, v, self.temperature, self.chunk_size)[has_pos]

        return 1.0 - row_mean(sim, rel, valid, per_rows, self.neg_drop)
