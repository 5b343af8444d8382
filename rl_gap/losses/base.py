"""The ranking-loss template: one ``forward`` for every loss of the package.

Every loss takes ``(sim, rel, valid=None, *, sharded=False)`` and owes its callers the
same four steps, which :class:`RankingLoss` runs in this order so that no loss repeats
them:

1. full precision: autocast off, half-precision ``sim`` widened to float32
   (``@full_precision``, :mod:`rl_gap.precision`);
2. ``sharded=True``: the rows are sharded over a process group; the inputs are checked on
   every rank and the loss's own :meth:`RankingLoss._loss_sharded` runs
   (:func:`rl_gap.losses.sharding.call.sharded_forward`);
3. input checks (:func:`rl_gap.losses.common.check_batch`: shapes, dtypes, finite
   values; ``valid`` filled in);
4. a batch with no valid positive pair gives a zero loss (connected to ``sim`` and to the
   loss's parameters) with one warning, unless the loss says it handles that itself
   (:attr:`RankingLoss.needs_positive`).

A loss then fills in :meth:`RankingLoss._loss` (and, when it has a sharded form,
:meth:`RankingLoss._loss_sharded`), which receive checked tensors.
"""

from __future__ import annotations

import abc
from typing import ClassVar

import torch
from torch import nn

from rl_gap.losses.common import check_batch, full_precision, zero_loss
from rl_gap.losses.sharding.call import sharded_forward
from rl_gap.losses.sharding.rows import no_positive

NO_POSITIVE = "batch has no valid positive pair"


class RankingLoss(nn.Module, abc.ABC):
    """Base class of the batch-matrix losses: the template :meth:`forward`.

    Subclasses implement :meth:`_loss` and, to be shardable, :meth:`_loss_sharded`;
    ``sharding_unsupported()`` may refuse some settings (it says why). A subclass without
    ``_loss_sharded`` is never sharded: the modules keep the replicated loss.

    Attributes:
        needs_positive: True (default): a batch with no valid positive pair returns a zero
            loss before :meth:`_loss` runs (a positive-free all-reduce on the sharded path).
            False: the loss decides itself (a pairwise loss that also trains on negatives,
            or one that counts its positives anyway).

    Shapes: ``sim``, ``rel``, ``valid``: (Q, D) -> 0-d loss (float32 for half-precision
    inputs, else ``sim.dtype``).
    """

    needs_positive: ClassVar[bool] = True

    @full_precision
    def forward(
        self,
        sim: torch.Tensor,
        rel: torch.Tensor,
        valid: torch.Tensor | None = None,
        *,
        sharded: bool = False,
    ) -> torch.Tensor:
        """The loss of the batch (or, ``sharded=True``, of the rows of every rank)."""
        if sharded:
            return sharded_forward(self, sim, rel, valid)
        sim, rel, valid = check_batch(sim, rel, valid)
        if self.needs_positive and not bool((rel & valid).any()):
            return zero_loss(sim, self, NO_POSITIVE)
        return self._loss(sim, rel, valid)

    def forward_sharded(
        self, sim: torch.Tensor, rel: torch.Tensor, valid: torch.Tensor
    ) -> torch.Tensor:
        """What ``sharded=True`` runs on inputs already checked on every rank."""
        if self.needs_positive and no_positive(rel, valid):
            return zero_loss(sim, self, NO_POSITIVE)
        return self._loss_sharded(sim, rel, valid)

    def sharding_unsupported(self) -> str | None:
        """Why this loss cannot be sharded (None: it can)."""
        if type(self)._loss_sharded is RankingLoss._loss_sharded:
            return f"{type(self).__name__} has no sharded implementation"
        return None

    @abc.abstractmethod
    def _loss(self, sim: torch.Tensor, rel: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """The loss of checked (Q, D) inputs (with a valid positive unless ``needs_positive``
        is False)."""

    def _loss_sharded(
        self, sim: torch.Tensor, rel: torch.Tensor, valid: torch.Tensor
    ) -> torch.Tensor:
        """The global loss from this rank's checked rows; backward gives this rank's rows
        of the single-process gradient (docs/definitions.md, "Sharded losses")."""
        raise NotImplementedError(f"{type(self).__name__} has no sharded implementation")
