"""gSAP: 1 − smoothed AP of the whole (global) batch matrix ranked as one list.

Global Average Precision for Representation Learning (gSAP paper §3.3–3.4):
every valid (q, d) pair of the similarity matrix enters one ranked list, so
a positive of query q is compared with the pairs of *every* query, which
makes similarities comparable across queries.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import torch
from torch import nn

from rl_gap.losses.common import (
    check_batch,
    check_neg_drop,
    check_temperature,
    compute_dtype,
    drop_lowest_negatives,
    zero_loss,
)
from rl_gap.losses.registry import register_loss
from rl_gap.losses.smoothed_ap import smoothed_ap_exact

IMPLS = ("auto", "exact", "fast")
FAST_MODULE = "rl_gap.losses.fast_rank"


def _fast_module():
    """``rl_gap.losses.fast_rank`` if it exists, else None.

    Imported lazily so the exact path never depends on it. An import error
    *inside* fast_rank is re-raised rather than silently hidden.
    """
    try:
        return importlib.import_module(FAST_MODULE)
    except ModuleNotFoundError as err:
        if err.name == FAST_MODULE:
            return None
        raise


def load_fast_kernel() -> Callable[..., torch.Tensor] | None:
    """``rl_gap.losses.fast_rank.smoothed_ap_fast`` if available, else None."""
    return getattr(_fast_module(), "smoothed_ap_fast", None)


@register_loss("gsap")
class GlobalSmoothAPLoss(nn.Module):
    """gSAP loss: ``1 − SAP`` over the flattened valid pairs of ``sim``.

    Args:
        temperature: sigmoid temperature τ > 0 of the smoothed rank.
        neg_drop: α in [0, 1); the ``floor(α · N)`` lowest-similarity negatives
            of the flattened list are dropped before ranking (no gradient
            through the selection; positives always kept; ties broken by
            row-major flat position, lower first).
        impl: ``"exact"`` (chunked P × M sweep), ``"fast"`` (the sub-quadratic
            kernel in ``rl_gap.losses.fast_rank``) or ``"auto"`` (fast when
            ``fast_rank.prefer_fast(P, M, τ)`` says it beats the sweep).
        chunk_size: positives per chunk of the exact sweep (peak extra memory
            one chunk_size × M block); None = automatic (~2^24-element blocks).
        tolerance: accuracy target passed to the fast kernel. 1e-8 rather than 1e-7:
            on tight clusters at τ = 1e-4 a positive's own gradient is a difference of
            near-equal sums, and 1e-7 left it 2.5e-3 off (1e-8: 5e-5, at the same cost).

    Shapes: ``sim``, ``rel``, ``valid``: (Q, D) -> 0-d loss (float32 for
    half-precision inputs, else ``sim.dtype``).
    """

    def __init__(
        self,
        temperature: float = 0.01,
        neg_drop: float = 0.0,
        impl: str = "auto",
        chunk_size: int | None = None,
        tolerance: float = 1e-8,
    ) -> None:
        super().__init__()
        self.temperature = check_temperature(temperature)
        self.neg_drop = check_neg_drop(neg_drop)
        if impl not in IMPLS:
            raise ValueError(f"unknown gsap impl {impl!r}; choose one of {IMPLS}")
        if impl == "fast" and load_fast_kernel() is None:
            raise ValueError(
                "gsap impl='fast' needs rl_gap.losses.fast_rank.smoothed_ap_fast, "
                "which is not available; use impl='exact' or 'auto'"
            )
        if chunk_size is not None and int(chunk_size) < 1:
            raise ValueError(f"chunk_size must be a positive integer or None, got {chunk_size}")
        self.impl = impl
        self.chunk_size = None if chunk_size is None else int(chunk_size)
        self.tolerance = float(tolerance)

    def extra_repr(self) -> str:
        return f"temperature={self.temperature}, neg_drop={self.neg_drop}, impl={self.impl!r}"

    def select_impl(self, num_pos: int, num_items: int) -> str:
        """Which kernel ranks a list with ``num_pos`` positives among ``num_items`` items."""
        if self.impl != "auto":
            return self.impl
        fast_rank = _fast_module()
        if fast_rank is not None and fast_rank.prefer_fast(num_pos, num_items, self.temperature):
            return "fast"
        return "exact"

    def forward(
        self, sim: torch.Tensor, rel: torch.Tensor, valid: torch.Tensor | None = None
    ) -> torch.Tensor:
        sim, rel, valid = check_batch(sim, rel, valid)
        # count_nonzero, not .sum(): a bool sum first widens the whole mask to int64.
        num_pos = int(torch.count_nonzero(rel & valid))
        if num_pos == 0:
            return zero_loss(sim, self, "batch has no valid positive pair")
        if self.neg_drop == 0:
            impl = self.impl
            if impl == "auto":
                impl = self.select_impl(num_pos, int(torch.count_nonzero(valid)))
            if impl == "fast":
                # The fast kernel skips invalid items itself: no (M,) copy of sim[valid].
                sap = load_fast_kernel()(
                    sim.reshape(-1),
                    rel.reshape(-1),
                    self.temperature,
                    tolerance=self.tolerance,
                    valid=valid.reshape(-1),
                )
                return 1.0 - sap
        scores = sim[valid].to(compute_dtype(sim.dtype))  # row-major flat list
        positive = rel[valid]
        if self.neg_drop > 0:
            keep = drop_lowest_negatives(
                scores.unsqueeze(0),
                positive.unsqueeze(0),
                torch.ones_like(positive)[None],
                self.neg_drop,
            )[0]
            scores, positive = scores[keep], positive[keep]
            impl = self.select_impl(num_pos, scores.numel())
        if impl == "fast":
            sap = load_fast_kernel()(scores, positive, self.temperature, tolerance=self.tolerance)
        else:
            sap = smoothed_ap_exact(scores, positive, self.temperature, self.chunk_size)
        return 1.0 - sap
