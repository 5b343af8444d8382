"""The sharded call of a loss: ``loss_fn(sim_rows, rel_rows, valid_rows, sharded=True)``.

Contract (docs/definitions.md, "Sharded losses"): under an initialised process
group each rank passes its consecutive block of rows of the global (B, M)
matrix (rank order; ragged blocks allowed); every rank gets the loss one
process would compute on the whole matrix, and backward gives this rank's rows
of that process's gradient. Loss parameters (InfoNCE's scale, SigLIP's scale
and bias) get per-rank gradients that sum over ranks to the single-process
gradient.

A loss takes part through ``forward_sharded(sim_rows, rel_rows, valid_rows)`` (the
inputs already checked on every rank, ``valid`` filled in) and, where some settings
cannot be sharded, ``sharding_unsupported() -> str | None``; its ``forward`` hands
``sharded=True`` to :func:`sharded_forward`. A :class:`rl_gap.losses.base.RankingLoss`
has all three from its template and writes only ``_loss_sharded``. The per-row partial sums most
losses need are in :mod:`rl_gap.losses.sharding.rows`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
from torch import nn

from rl_gap import dist as shard_comm
from rl_gap.losses.common import check_batch


def supports_sharding(module: nn.Module) -> str | None:
    """None when ``module`` can be called with ``sharded=True``, else the reason it cannot.

    Reads the loss class itself: a ``forward_sharded`` method, and the optional
    ``sharding_unsupported()`` for settings the sharded form does not cover.
    """
    if not callable(getattr(module, "forward_sharded", None)):
        return f"{type(module).__name__} has no sharded implementation"
    unsupported = getattr(module, "sharding_unsupported", None)
    return unsupported() if callable(unsupported) else None


def agree(check: Callable[[], None], device: torch.device) -> None:
    """Run a local input check; if it raises ``ValueError`` on any rank, raise on every rank.

    (A bad input on one rank must not leave the others waiting in a collective.)
    """
    error: Exception | None = None
    try:
        check()
    except ValueError as err:
        error = err
    flag = torch.tensor([0 if error is None else 1], dtype=torch.int64, device=device)
    bad = int(shard_comm.all_reduce(flag))
    if error is not None:
        raise error
    if bad:
        raise ValueError(f"sharded loss: the inputs of {bad} other rank(s) were rejected")


def sharded_forward(
    module: nn.Module, sim: torch.Tensor, rel: torch.Tensor, valid: torch.Tensor | None
) -> torch.Tensor:
    """``module.forward_sharded`` on inputs checked on every rank (what ``sharded=True`` runs).

    Raises:
        RuntimeError: without an initialised process group.
        ValueError: on every rank, when any rank's input is bad or the loss's
            settings cannot be sharded (:func:`supports_sharding`).
    """
    shard_comm.require_group()
    checked: list[torch.Tensor] = []

    def check() -> None:
        checked.extend(check_batch(sim, rel, valid))
        reason = supports_sharding(module)
        if reason is not None:
            raise ValueError(f"sharded=True: {reason}")

    device = sim.device if isinstance(sim, torch.Tensor) else torch.device("cpu")
    agree(check, device)
    return module.forward_sharded(*checked)


def warn_replicated(reason: str) -> None:
    """One warning that a module keeps the replicated loss (every rank the whole matrix)."""
    warnings.warn(
        f"shard_loss=auto: {reason}; every rank computes the whole loss instead", stacklevel=3
    )


def symmetric_not_sharded(module: nn.Module) -> str:
    """Why a per-query loss with ``symmetric=True`` is not sharded (its columns span ranks)."""
    return (
        f"{type(module).__name__}(symmetric=True) ranks every column as its own list over "
        "all ranks' rows, which is not sharded; use symmetric=False or the replicated "
        "loss (shard_loss: false)"
    )
