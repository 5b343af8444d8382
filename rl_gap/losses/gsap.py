"""gSAP: 1 − smoothed AP of the whole (global) batch matrix ranked as one list.

Global Average Precision for Representation Learning (gSAP paper §3.3–3.4):
every valid (q, d) pair of the similarity matrix enters one ranked list, so
a positive of query q is compared with the pairs of *every* query, which
makes similarities comparable across queries.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch

from rl_gap import dist as shard_comm
from rl_gap.losses.base import NO_POSITIVE, RankingLoss
from rl_gap.losses.common import (
    check_neg_drop,
    check_temperature,
    compute_dtype,
    drop_lowest_negatives,
    num_dropped,
    zero_loss,
)
from rl_gap.losses.fast_sap import kernel as fast_sap_kernel
from rl_gap.losses.fast_sap.grid import PlanError
from rl_gap.losses.registry import register_loss
from rl_gap.losses.sharding import gsap as sharded_gsap
from rl_gap.losses.sharding.rows import kept_flat
from rl_gap.losses.smoothed_ap import smoothed_ap_exact

IMPLS = ("auto", "exact", "fast")
# Below this the float64 sums of the fast kernel cannot certify the bound.
MIN_TOLERANCE = 1e-13


def load_fast_kernel() -> Callable[..., torch.Tensor] | None:
    """``rl_gap.losses.fast_sap.kernel.smoothed_ap_fast``, read at call time (None where it
    is missing: ``impl="fast"`` is then refused and ``"auto"`` keeps the exact sweep)."""
    return getattr(fast_sap_kernel, "smoothed_ap_fast", None)


def check_tolerance(tolerance: float) -> float:
    """The fast kernel's accuracy target: a number in [1e-13, 1) (NaN, <= 0 rejected)."""
    try:
        value = float(tolerance)
    except (TypeError, ValueError):
        raise ValueError(f"gsap tolerance must be a number, got {tolerance!r}") from None
    if not MIN_TOLERANCE <= value < 1.0:  # False for NaN
        raise ValueError(
            f"gsap tolerance must be in [{MIN_TOLERANCE:g}, 1) (the bound on |SAP_fast - "
            f"SAP_exact|), got {tolerance!r}"
        )
    return value


@register_loss("gsap")
class GlobalSmoothAPLoss(RankingLoss):
    """gSAP loss: ``1 − SAP`` over the flattened valid pairs of ``sim``.

    Args:
        temperature: sigmoid temperature τ > 0 of the smoothed rank.
        neg_drop: α in [0, 1); the ``floor(α · N)`` lowest-similarity negatives
            of the flattened list are dropped before ranking (no gradient
            through the selection; positives always kept; ties broken by
            row-major flat position, lower first). The fast kernel selects the
            same set by a score threshold (``rl_gap.losses.fast_sap.drop``), no sort.
        impl: ``"exact"`` (chunked P × M sweep), ``"fast"`` (the sub-quadratic
            kernel in ``rl_gap.losses.fast_sap.kernel``; raises ``PlanError`` when no grid
            reaches ``tolerance``) or ``"auto"`` (fast when
            ``fast_sap.kernel.prefer_fast(P, M_kept, τ)`` says it beats the sweep and a grid
            reaches the tolerance, else the exact sweep, with one warning; never raises
            for a valid batch).
        chunk_size: positives per chunk of the exact sweep (peak extra memory
            one chunk_size × M block); None = automatic (~2^24-element blocks).
        tolerance: accuracy target passed to the fast kernel, in [1e-13, 1) (checked
            here: 0, negative and NaN values are rejected). 1e-8 rather than 1e-7:
            on tight clusters at τ = 1e-4 a positive's own gradient is a difference of
            near-equal sums, and 1e-7 left it 2.5e-3 off (1e-8: 5e-5, at the same cost).

    Shapes: ``sim``, ``rel``, ``valid``: (Q, D) -> 0-d loss (float32 for
    half-precision inputs, else ``sim.dtype``). ``sharded=True``: the rows are
    sharded over a process group (:meth:`_loss_sharded`).
    """

    # The kernel choice counts the positives anyway (all-reduced with the valid pairs when
    # sharded): the empty batch is caught there, in one collective.
    needs_positive = False

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
                "gsap impl='fast' needs rl_gap.losses.fast_sap.kernel.smoothed_ap_fast, "
                "which is not available; use impl='exact' or 'auto'"
            )
        if chunk_size is not None and int(chunk_size) < 1:
            raise ValueError(f"chunk_size must be a positive integer or None, got {chunk_size}")
        self.impl = impl
        self.chunk_size = None if chunk_size is None else int(chunk_size)
        self.tolerance = check_tolerance(tolerance)
        self._warned_fallback = False

    def extra_repr(self) -> str:
        return f"temperature={self.temperature}, neg_drop={self.neg_drop}, impl={self.impl!r}"

    def _warn_fallback(self, error: Exception) -> None:
        """impl="auto" found no fast plan for this batch: say once that the exact sweep runs."""
        if not self._warned_fallback:
            self._warned_fallback = True
            warnings.warn(
                f"gsap impl='auto': the fast kernel has no plan for this batch ({error}); "
                "using the exact P x M sweep instead (slower, same result)",
                stacklevel=3,
            )

    def select_impl(self, num_pos: int, num_items: int, device: torch.device | None = None) -> str:
        """Which kernel ranks a list with ``num_pos`` positives among ``num_items`` items."""
        if self.impl != "auto":
            return self.impl
        if load_fast_kernel() is not None and fast_sap_kernel.prefer_fast(
            num_pos, num_items, self.temperature, device=device
        ):
            return "fast"
        return "exact"

    def _one_minus_sap(
        self,
        sim: torch.Tensor,
        counts: tuple[int, int],
        device: torch.device | None,
        fast: Callable[[], torch.Tensor],
        exact: Callable[[], torch.Tensor],
    ) -> torch.Tensor:
        """``1 − SAP`` by the kernel these counts call for: the one place the kernel is chosen.

        Args:
            sim: the checked similarities (for the zero loss of a batch without positives).
            counts: ``(positives, valid pairs)`` of the whole list (every rank's, sharded).
            device: where the list lives, for :func:`prefer_fast` (None: not consulted).
            fast, exact: the list's SAP by the fast kernel and by the exact sweep.

        ``impl="auto"`` falls back to ``exact`` (one warning) when the fast kernel finds no
        plan; ``impl="fast"`` lets its ``PlanError`` through.
        """
        num_pos, num_valid = counts
        if num_pos == 0:
            return zero_loss(sim, self, NO_POSITIVE)
        impl = self.impl
        if impl == "auto":
            num_kept = num_valid - num_dropped(num_valid - num_pos, self.neg_drop)
            impl = self.select_impl(num_pos, num_kept, device)
        if impl == "fast":
            try:
                return 1.0 - fast()
            except PlanError as error:
                if self.impl == "fast":
                    raise
                self._warn_fallback(error)
        return 1.0 - exact()

    def _flat_call(
        self,
        kernel: Callable[..., torch.Tensor],
        sim: torch.Tensor,
        rel: torch.Tensor,
        valid: torch.Tensor,
    ) -> torch.Tensor:
        """A fast kernel (one process or sharded) on the flattened matrix with this loss's
        settings; ``neg_drop`` is passed only when it drops something."""
        extra = {"neg_drop": self.neg_drop} if self.neg_drop > 0 else {}
        return kernel(
            sim.reshape(-1),
            rel.reshape(-1),
            self.temperature,
            tolerance=self.tolerance,
            valid=valid.reshape(-1),
            **extra,
        )

    def _loss(self, sim: torch.Tensor, rel: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        # count_nonzero, not .sum(): a bool sum first widens the whole mask to int64.
        counts = (int(torch.count_nonzero(rel & valid)), int(torch.count_nonzero(valid)))

        def fast() -> torch.Tensor:
            # The fast kernel skips invalid (and dropped) items itself: no (M,) copy of sim[valid].
            return self._flat_call(fast_sap_kernel.smoothed_ap_fast, sim, rel, valid)

        def exact() -> torch.Tensor:
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
            return smoothed_ap_exact(scores, positive, self.temperature, self.chunk_size)

        return self._one_minus_sap(sim, counts, sim.device, fast, exact)

    def _loss_sharded(
        self, sim: torch.Tensor, rel: torch.Tensor, valid: torch.Tensor
    ) -> torch.Tensor:
        """The loss of the global list from this rank's rows (``rl_gap.losses.sharding.gsap``).

        The fast kernel all-reduces its grid moments (O(G) per step); the exact
        sweep all-gathers the positives (O(P)). The kernel is chosen as in :meth:`_loss`,
        from the global counts.
        """
        local = [int(torch.count_nonzero(rel & valid)), int(torch.count_nonzero(valid))]
        counts = torch.tensor(local, dtype=torch.int64, device=sim.device)
        num_pos, num_valid = (int(c) for c in shard_comm.all_reduce(counts))

        def fast() -> torch.Tensor:
            return self._flat_call(sharded_gsap.sharded_smoothed_ap_fast, sim, rel, valid)

        def exact() -> torch.Tensor:
            scores, positive = kept_flat(sim, rel, valid, self.neg_drop)
            scores = scores.to(compute_dtype(sim.dtype))
            return sharded_gsap.sharded_smoothed_ap_exact(
                scores, positive, self.temperature, self.chunk_size
            )

        return self._one_minus_sap(sim, (num_pos, num_valid), None, fast, exact)
