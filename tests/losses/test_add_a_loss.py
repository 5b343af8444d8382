"""Adding a loss, worked end to end (docs/losses.md, "Add a loss").

``PairHingeLoss`` below is written as its own module ``rl_gap/losses/pair_hinge.py``
would hold it, with ``@register_loss("pair_hinge")`` on the class; here it is
registered by a fixture into a private copy of the registry, so it does not leak
into the other tests. It is then checked through the registry, the recipe path
(built by name from a ``loss:`` section) and the sharded path on 2 gloo ranks,
against a hand-written float64 reference.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from rl_gap import dist as shard_comm
from rl_gap.losses import available_losses, build_loss, loss_from_config, register_loss, registry
from rl_gap.losses.base import RankingLoss
from rl_gap.losses.sharding import supports_sharding
from rl_gap.losses.sharding.rows import mean_over_ranks

from .gloo_ranks import on_ranks, row_block

TOY = "pair_hinge"
SPLIT = [3, 4]


# --- rl_gap/losses/pair_hinge.py --------------------------------------------------
class PairHingeLoss(RankingLoss):
    """Toy loss: mean over the valid pairs of ``[margin − s]_+`` (positives), ``[s]_+`` (negatives).

    Args:
        margin: finite; positives below it are pulled up.

    Shapes: ``sim``, ``rel``, ``valid``: (Q, D) -> 0-d loss.
    """

    def __init__(self, margin: float = 0.5) -> None:
        super().__init__()
        if not math.isfinite(float(margin)):
            raise ValueError(f"pair_hinge margin must be finite, got {margin!r}")
        self.margin = float(margin)

    def _hinge_sum(self, sim, rel, valid):
        hinge = torch.where(rel, (self.margin - sim).clamp(min=0), sim.clamp(min=0))
        return (hinge * valid).sum()

    def _loss(self, sim, rel, valid):
        return self._hinge_sum(sim, rel, valid) / int(torch.count_nonzero(valid))

    def _loss_sharded(self, sim_rows, rel_rows, valid_rows):
        """Each pair is its own term: this rank's sum over the global number of valid pairs."""
        count = shard_comm.global_count(int(torch.count_nonzero(valid_rows)), sim_rows.device)
        return mean_over_ranks(self._hinge_sum(sim_rows, rel_rows, valid_rows), count)


# --- end of the loss's file --------------------------------------------------------


@pytest.fixture
def toy_loss(monkeypatch):
    monkeypatch.setattr(registry, "_LOSSES", dict(registry._LOSSES))
    register_loss(TOY)(PairHingeLoss)
    return TOY


def reference(sim, rel, valid, margin):
    """The toy loss by its definition, pair by pair in float64."""
    total, count = 0.0, 0
    for q in range(sim.shape[0]):
        for d in range(sim.shape[1]):
            if valid[q, d]:
                s = float(sim[q, d])
                total += max(margin - s, 0.0) if rel[q, d] else max(s, 0.0)
                count += 1
    return total / count


def batch():
    gen = torch.Generator().manual_seed(4)
    sim = torch.rand(sum(SPLIT), 5, generator=gen, dtype=torch.float64) * 2 - 1
    rel = torch.rand(sum(SPLIT), 5, generator=gen) < 0.4
    valid = torch.rand(sum(SPLIT), 5, generator=gen) > 0.2
    return sim, rel, valid


def test_registry_builds_the_new_loss(toy_loss):
    assert toy_loss in available_losses()
    loss_fn = build_loss(toy_loss, margin=0.3)
    assert isinstance(loss_fn, PairHingeLoss) and supports_sharding(loss_fn) is None
    sim, rel, valid = batch()
    expected = reference(sim, rel, valid, 0.3)
    torch.testing.assert_close(loss_fn(sim, rel, valid).item(), expected, rtol=0, atol=1e-12)
    with pytest.warns(UserWarning, match="no valid positive"):
        assert float(loss_fn(sim, torch.zeros_like(rel), valid)) == 0.0
    with pytest.raises(ValueError, match="margin must be finite"):
        build_loss(toy_loss, margin=math.inf)


def test_recipe_section_builds_the_new_loss_by_name(toy_loss):
    section = {"name": toy_loss, toy_loss: {"margin": 0.2}, "gsap": {"temperature": 0.05}}
    assert loss_from_config(section).margin == 0.2
    assert loss_from_config({**section, "margin": 0.7}).margin == 0.7  # a flat override wins
    with pytest.raises(ValueError, match="does not take.*temperature"):
        loss_from_config({"name": toy_loss, "temperature": 0.1})


def _sharded_toy(rank: int, world: int, margin: float):
    register_loss(TOY)(PairHingeLoss)  # this process's own registry
    sim, rel, valid = batch()
    rows = row_block(rank, SPLIT)
    sim = sim[rows].clone().requires_grad_(True)
    loss = build_loss(TOY, margin=margin)(sim, rel[rows], valid[rows], sharded=True)
    loss.backward()
    return loss.detach(), sim.grad


@pytest.mark.ddp
def test_sharded_equals_replicated_on_two_ranks(toy_loss, tmp_path: Path):
    sim, rel, valid = batch()
    sim.requires_grad_(True)
    replicated = build_loss(toy_loss, margin=0.3)(sim, rel, valid)
    replicated.backward()
    per_rank = on_ranks(tmp_path, 2, _sharded_toy, 0.3)
    expected = reference(sim.detach(), rel, valid, 0.3)
    for loss, _ in per_rank:
        torch.testing.assert_close(loss.item(), expected, rtol=0, atol=1e-12)
    grad = torch.cat([g for _, g in per_rank])
    torch.testing.assert_close(grad, sim.grad, rtol=0, atol=1e-12)
    assert grad[~valid].abs().max() == 0 and grad[valid].abs().max() > 0
