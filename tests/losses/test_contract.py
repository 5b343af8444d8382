"""The contract every registered loss keeps (docs/definitions.md), parametrised over the registry.

For each name in ``available_losses()``, with its default settings:
- a 0-d output, float32 for float32 input and float64 for float64 input;
- the valid mask honoured: what an invalid pair holds (its score, its relevance)
  changes neither the loss nor any gradient, and its own gradient is 0;
- rows with no positive: a finite loss and gradient; the per-query losses ignore
  such a row; a batch with no positive at all gives 0 with a warning for the
  ranking losses (ROADMAP keeps its calibration term; SigLIP still pushes every
  pair below its bias);
- the gradient equals central finite differences in float64 (``gradcheck``),
  for the losses that are smooth (BlackBox's gradient is its own interpolation);
- the sharded call on 2 gloo ranks equals the replicated loss.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from rl_gap.losses import available_losses, build_loss

from .gloo_ranks import on_ranks, row_block

LOSSES = available_losses()
# Per-query losses: each row is its own list (ROADMAP's calibration sees every pair).
ROW_LISTS = {"msap", "infonce", "softbin", "blackbox", "supap"}
NOT_SMOOTH = {"blackbox", "gblackbox"}
NO_POSITIVE_IS_A_LOSS = {"siglip"}
CALIBRATED = {"roadmap", "groadmap"}  # ROADMAP's defaults: negatives above 0.6 are pushed down
SPLIT = [3, 4]


def batch(dtype=torch.float64, seed: int = 0, rows: int = 7, cols: int = 6):
    gen = torch.Generator().manual_seed(seed)
    sim = (torch.rand(rows, cols, generator=gen, dtype=torch.float64) * 1.6 - 0.8).to(dtype)
    rel = torch.rand(rows, cols, generator=gen) < 0.35
    rel[0, 0] = rel[1, 1] = True
    rel[rows - 1] = False  # a row with no positive
    valid = torch.rand(rows, cols, generator=gen) > 0.2
    valid[0, 0] = valid[1, 1] = True
    return sim, rel, valid


def value_and_grad(name, sim, rel, valid):
    torch.manual_seed(0)
    loss_fn = build_loss(name).to(sim.dtype)
    sim = sim.clone().requires_grad_(True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loss = loss_fn(sim, rel, valid)
    loss.backward()
    return loss.detach(), sim.grad


@pytest.mark.parametrize("name", LOSSES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_scalar_output_in_the_input_dtype(name, dtype):
    loss, grad = value_and_grad(name, *batch(dtype))
    assert loss.shape == () and loss.dtype == dtype
    assert grad.dtype == dtype and bool(torch.isfinite(loss)) and bool(torch.isfinite(grad).all())


@pytest.mark.parametrize("name", LOSSES)
def test_invalid_pairs_change_nothing(name):
    sim, rel, valid = batch()
    loss, grad = value_and_grad(name, sim, rel, valid)
    gen = torch.Generator().manual_seed(1)
    other_sim = torch.where(valid, sim, torch.rand(sim.shape, generator=gen, dtype=sim.dtype))
    other_rel = torch.where(valid, rel, ~rel)
    other_loss, other_grad = value_and_grad(name, other_sim, other_rel, valid)
    torch.testing.assert_close(other_loss, loss, rtol=0, atol=1e-12)
    torch.testing.assert_close(other_grad, grad, rtol=0, atol=1e-12)
    assert grad[~valid].abs().max() == 0 and grad[valid].abs().max() > 0


@pytest.mark.parametrize("name", LOSSES)
def test_rows_without_a_positive(name):
    sim, rel, valid = batch()
    loss, grad = value_and_grad(name, sim, rel, valid)
    assert bool(torch.isfinite(grad).all())
    if name in ROW_LISTS:
        without, _ = value_and_grad(name, sim[:-1], rel[:-1], valid[:-1])
        torch.testing.assert_close(loss, without, rtol=0, atol=1e-12)
        assert grad[-1].abs().max() == 0
    none = torch.zeros_like(rel)
    loss_fn = build_loss(name).double()
    if name in NO_POSITIVE_IS_A_LOSS:
        assert float(loss_fn(sim, none, valid)) > 0
        return
    with pytest.warns(UserWarning, match="no valid positive"):
        empty = loss_fn(sim.requires_grad_(True), none, valid)
    empty.backward()
    expected = 0.0
    if name in CALIBRATED:  # the mean of the non-zero hinges [s − 0.6]_+ over valid pairs
        hinges = [float(s) - 0.6 for s in sim.detach()[valid] if float(s) > 0.6]
        expected = sum(hinges) / len(hinges)
        assert hinges
    assert abs(float(empty.detach()) - expected) < 1e-12 and sim.grad is not None
    if name not in CALIBRATED:
        assert sim.grad.abs().max() == 0


@pytest.mark.parametrize("name", sorted(set(LOSSES) - NOT_SMOOTH))
def test_gradient_matches_finite_differences(name):
    sim, rel, valid = batch(rows=4, cols=5, seed=2)
    loss_fn = build_loss(name).double()
    assert torch.autograd.gradcheck(
        lambda s: loss_fn(s, rel, valid), (sim.requires_grad_(True),), eps=1e-6, atol=1e-5
    )


def _sharded_defaults(rank: int, world: int) -> dict:
    sim, rel, valid = batch()
    rows = row_block(rank, SPLIT)
    return {
        name: value_and_grad_sharded(name, sim[rows], rel[rows], valid[rows]) for name in LOSSES
    }


def value_and_grad_sharded(name, sim, rel, valid):
    torch.manual_seed(0)
    loss_fn = build_loss(name).double()
    sim = sim.clone().requires_grad_(True)
    loss = loss_fn(sim, rel, valid, sharded=True)
    loss.backward()
    return loss.detach(), sim.grad


@pytest.fixture(scope="module")
def sharded_results(tmp_path_factory) -> list[dict]:
    return on_ranks(tmp_path_factory.mktemp("contract"), 2, _sharded_defaults)


@pytest.mark.ddp
@pytest.mark.parametrize("name", LOSSES)
def test_sharded_equals_replicated(name, sharded_results):
    loss, grad = value_and_grad(name, *batch())
    for per_rank in sharded_results:
        torch.testing.assert_close(per_rank[name][0], loss, rtol=0, atol=1e-10)
    sharded_grad = torch.cat([per_rank[name][1] for per_rank in sharded_results])
    torch.testing.assert_close(sharded_grad, grad, rtol=0, atol=1e-10)
