"""ROADMAP (Ramzi et al., NeurIPS 2021): SupAP plus the calibration loss, per query and global.

*Robust and Decomposable Average Precision for Image Retrieval* trains with

    L_ROADMAP = w_AP · (1 − SupAP) + w_calib · L_calib

where ``1 − SupAP`` is the AP term of :mod:`rl_gap.losses.supap` (per query:
``roadmap``, the paper's loss; one flattened list: ``groadmap``) and L_calib
the calibration loss of the released code — pytorch-metric-learning's
``ContrastiveLoss`` on dot-product similarities with ``pos_margin = 0.9``,
``neg_margin = 0.6`` and its default ``AvgNonZeroReducer``:

    L_calib = mean_{(i,j) in P, ℓ⁺ > 0} ℓ⁺_ij + mean_{(i,j) in N, ℓ⁻ > 0} ℓ⁻_ij
    ℓ⁺_ij = [m⁺ − s_ij]_+     ℓ⁻_ij = [s_ij − m⁻]_+

each mean over the pairs whose hinge is non-zero (0 when there is none), over
all valid positive (P) and negative (N) pairs of the batch. The released
default weights both terms 1. The calibration term is the same for the per
query and the global loss (it sees pairs, not rankings); negative dropping
applies to the AP term only.

Shapes: ``sim``, ``rel``, ``valid``: (Q, D) -> 0-d loss. The calibration
adds O(Q · D) time and memory to SupAP's cost.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from rl_gap import dist as shard_comm
from rl_gap.losses.base import NO_POSITIVE
from rl_gap.losses.common import check_batch, compute_dtype, zero_loss
from rl_gap.losses.registry import register_loss
from rl_gap.losses.sharding.rows import no_positive
from rl_gap.losses.supap import GlobalSupAPLoss, SupAPLoss
from rl_gap.losses.variant import variant_of


def _nonzero_mean(values: torch.Tensor) -> torch.Tensor:
    """Mean of the entries > 0 (AvgNonZeroReducer), 0 without any (kept in the graph)."""
    count = (values > 0).sum()
    return values.sum() / count.clamp(min=1).to(values.dtype)


def calibration_loss(
    sim: torch.Tensor,
    rel: torch.Tensor,
    valid: torch.Tensor | None = None,
    pos_margin: float = 0.9,
    neg_margin: float = 0.6,
) -> torch.Tensor:
    """ROADMAP's calibration loss (module docstring) of a (Q, D) similarity matrix.

    Args:
        sim: (Q, D) float similarities (cosine for unit embeddings).
        rel: (Q, D) bool relevant pairs.
        valid: (Q, D) bool pairs that count (None: all; self pairs excluded by the caller).
        pos_margin: m⁺, positives below it are pulled up.
        neg_margin: m⁻, negatives above it are pushed down.

    Returns:
        0-d loss in the compute dtype of ``sim`` (float32 for half precision).
    """
    sim, rel, valid = check_batch(sim, rel, valid)
    sim = sim.to(compute_dtype(sim.dtype))
    positive, negative = rel & valid, ~rel & valid
    pos_hinge = (pos_margin - sim).clamp(min=0) * positive
    neg_hinge = (sim - neg_margin).clamp(min=0) * negative
    return _nonzero_mean(pos_hinge) + _nonzero_mean(neg_hinge)


def _check_margins(pos_margin: float, neg_margin: float, weight: float) -> None:
    for name, value in (("pos_margin", pos_margin), ("neg_margin", neg_margin)):
        if isinstance(value, bool) or not math.isfinite(float(value)):
            raise ValueError(f"{name} must be a finite number, got {value!r}")
    if isinstance(weight, bool) or not math.isfinite(float(weight)) or float(weight) < 0:
        raise ValueError(f"calibration_weight must be a finite number >= 0, got {weight!r}")


class _RoadmapMixin:
    """``(1 − SupAP) + calibration_weight · L_calib`` on top of a SupAP loss class.

    Its ``__init__`` takes the calibration keywords and hands the rest to the SupAP class
    (the concrete classes advertise both, :func:`~rl_gap.losses.variant.variant_of`).
    """

    pos_margin: float
    neg_margin: float
    calibration_weight: float

    def __init__(
        self,
        *,
        pos_margin: float = 0.9,
        neg_margin: float = 0.6,
        calibration_weight: float = 1.0,
        **supap: Any,
    ) -> None:
        super().__init__(**supap)
        _check_margins(pos_margin, neg_margin, calibration_weight)
        self.pos_margin = float(pos_margin)
        self.neg_margin = float(neg_margin)
        self.calibration_weight = float(calibration_weight)

    # The calibration term trains on negatives too: a positive-free batch still has one.
    needs_positive = False

    def _loss(self, sim: torch.Tensor, rel: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        if bool((rel & valid).any()):
            ap_term = super()._loss(sim, rel, valid)  # type: ignore[misc]
        else:
            ap_term = zero_loss(sim, self, NO_POSITIVE)  # type: ignore[arg-type]
        calib = calibration_loss(sim, rel, valid, self.pos_margin, self.neg_margin)
        return ap_term + self.calibration_weight * calib.to(ap_term.dtype)

    def _loss_sharded(
        self, sim: torch.Tensor, rel: torch.Tensor, valid: torch.Tensor
    ) -> torch.Tensor:
        """The SupAP term sharded, plus the calibration term's two global non-zero means."""
        if no_positive(rel, valid):
            ap_term = zero_loss(sim, self, NO_POSITIVE)  # type: ignore[arg-type]
        else:
            ap_term = super()._loss_sharded(sim, rel, valid)  # type: ignore[misc]
        s = sim.to(compute_dtype(sim.dtype))
        positive, negative = rel & valid, ~rel & valid
        calib = s.sum() * 0.0
        for hinge in (
            (self.pos_margin - s).clamp(min=0) * positive,
            (s - self.neg_margin).clamp(min=0) * negative,
        ):
            count = shard_comm.global_count(int(torch.count_nonzero(hinge)), sim.device)
            calib = calib + shard_comm.reduce_partials(hinge.sum()) / max(count, 1)
        return ap_term + self.calibration_weight * calib.to(ap_term.dtype)

    def extra_repr(self) -> str:
        return (
            super().extra_repr()  # type: ignore[misc]
            + f", pos_margin={self.pos_margin}, neg_margin={self.neg_margin}, "
            f"calibration_weight={self.calibration_weight}"
        )


@register_loss("roadmap")
@variant_of(SupAPLoss)
class RoadmapLoss(_RoadmapMixin, SupAPLoss):
    """ROADMAP, per query: ``(1 − mean SupAP) + calibration_weight · L_calib``.

    Args:
        temperature, rho, offset, margin, neg_drop, symmetric, chunk_size, start: the
            SupAP term, as :class:`~rl_gap.losses.supap.SupAPLoss` (released defaults;
            the released iNaturalist setting is ``start=0.0, offset=1.0``).
        pos_margin: calibration margin of positive pairs (released: 0.9).
        neg_margin: calibration margin of negative pairs (released: 0.6).
        calibration_weight: weight of L_calib (released: 1; the AP term has weight 1).
    """


@register_loss("groadmap")
@variant_of(GlobalSupAPLoss)
class GlobalRoadmapLoss(_RoadmapMixin, GlobalSupAPLoss):
    """ROADMAP with a global AP term: ``(1 − SupAP of all valid pairs) + w · L_calib``.

    Args: as :class:`RoadmapLoss` without ``symmetric`` (one flattened list).
    """
