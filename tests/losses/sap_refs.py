"""A brute-force float64 smoothed AP and its batches, written plainly for the gSAP, mSAP and sweep tests.

The reference materialises the full P × M comparison matrix with explicit
broadcasting, and applies negative dropping with its own rule: keep every
positive; among the negatives, sort by (score, flat position) ascending with
Python's ``sorted`` and drop the first ``floor(α · N)`` (α · N rounded at 1e-9
first), i.e. ties between equal negatives drop the earlier position first.
"""

from __future__ import annotations

import math

import torch
from torch.utils._python_dispatch import TorchDispatchMode


def brute_smoothed_ap(scores: torch.Tensor, positive: list[bool], tau: float) -> torch.Tensor:
    """SAP of one list, full P × M broadcast (float64, autograd for gradients)."""
    pos_mask = torch.tensor(positive)
    pos_idx = [i for i, p in enumerate(positive) if p]
    anchors = scores[pos_idx]
    sig = torch.sigmoid((scores.unsqueeze(0) - anchors.unsqueeze(1)) / tau)  # (P, M)
    columns = torch.arange(len(positive))
    not_self = columns.unsqueeze(0) != torch.tensor(pos_idx).unsqueeze(1)
    r_p = 1.0 + (sig * (pos_mask.unsqueeze(0) & not_self)).sum(1)
    r_a = r_p + (sig * ~pos_mask.unsqueeze(0)).sum(1)
    return (r_p / r_a).mean()


def brute_drop(items: list[tuple[int, bool]], values: list[float], alpha: float) -> list[int]:
    """Keep-list of positions after dropping the floor(α·N) lowest negatives."""
    negatives = [i for i, is_pos in items if not is_pos]
    n_drop = math.floor(alpha * len(negatives) + 1e-9)
    dropped = set(sorted(negatives, key=lambda i: (values[i], i))[:n_drop])
    return [i for i, _ in items if i not in dropped]


def make_batch(seed: int, ties: bool, q: int = 9, d: int = 11):
    """Random sims, several positives per row, a random valid mask, 2 rows without positives."""
    gen = torch.Generator().manual_seed(seed)
    sim = torch.rand(q, d, generator=gen, dtype=torch.float64) * 2 - 1
    if ties:
        sim = torch.round(sim * 5) / 5  # 11 distinct values: many exact ties
    rel = torch.rand(q, d, generator=gen) < 0.3
    rel[0, :3] = True
    rel[-2:] = False  # distractor queries: their pairs are negatives only
    valid = torch.rand(q, d, generator=gen) > 0.15
    valid[0, :3] = True
    return sim, rel, valid


def grad_of(loss_fn, sim, rel, valid):
    leaf = sim.clone().requires_grad_(True)
    loss = loss_fn(leaf, rel, valid)
    (grad,) = torch.autograd.grad(loss, leaf)
    return loss.detach(), grad


def assert_matches(loss_fn, reference_fn, sim, rel, valid):
    loss, grad = grad_of(loss_fn, sim, rel, valid)
    ref_loss, ref_grad = grad_of(reference_fn, sim, rel, valid)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-8, atol=1e-10)


class LargestTensor(TorchDispatchMode):
    """Records the largest tensor any aten op produces (forward and backward)."""

    def __init__(self) -> None:
        super().__init__()
        self.numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.numel = max(self.numel, t.numel())
        return out


def metric_batch(batch: int = 64):
    gen = torch.Generator().manual_seed(9)
    emb = torch.nn.functional.normalize(torch.randn(batch, 8, generator=gen), dim=1)
    labels = torch.arange(batch) // 4
    rel = labels.unsqueeze(1) == labels.unsqueeze(0)
    return emb @ emb.T, rel, ~torch.eye(batch, dtype=torch.bool)
