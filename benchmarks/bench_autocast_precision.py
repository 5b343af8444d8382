"""Accuracy of every registered loss under bf16 autocast: float32 ranking vs a bf16 matrix.

For B unit embeddings of B/4 classes (metric-learning relevance, self pairs
invalid) the loss value and its gradient w.r.t. the embeddings are compared
with a float64 computation of the same loss:

- ``fp32``: what the modules do now, ``full_precision_similarity`` under
  ``torch.autocast("cpu", torch.bfloat16)``;
- ``bf16``: ``embeddings @ embeddings.T`` under autocast (a bf16 matrix, which
  the loss then ranks in float32), the similarity this replaced.

Also prints the bf16 self-similarity range and how many distinct values the bf16
matrix keeps. Usage::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_autocast_precision.py [--batch 128]
"""

from __future__ import annotations

import argparse

import torch

from rl_gap.losses import available_losses, build_loss
from rl_gap.precision import full_precision_similarity

SETTINGS = {
    "gsap": {"temperature": 0.01, "impl": "exact"},
    "msap": {"temperature": 0.01},
    "infonce": {"temperature": 0.05},
    "siglip": {},
    "supap": {"temperature": 0.01},
    "gsupap": {"temperature": 0.01},
}


def loss_and_grad(loss_fn, emb: torch.Tensor, rel, valid, how: str):
    leaf = emb.clone().requires_grad_()
    if how == "fp64":
        # Symmetrised: a float64 GEMM is not exactly symmetric at this size while
        # the float32 one is, and rank-based losses count the (i, j) / (j, i) ties.
        sim = leaf @ leaf.T
        sim = 0.5 * (sim + sim.T)
    else:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            sim = full_precision_similarity(leaf) if how == "fp32" else leaf @ leaf.T
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=how != "fp64"):
        loss = loss_fn(sim, rel, valid)
    (grad,) = torch.autograd.grad(loss, leaf)
    return float(loss.detach()), grad.double()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--dim", type=int, default=64)
    args = parser.parse_args()
    gen = torch.Generator().manual_seed(0)
    labels = torch.arange(args.batch) % max(1, args.batch // 4)
    centres = torch.randn(int(labels.max()) + 1, args.dim, generator=gen, dtype=torch.float64)
    emb64 = centres[labels] + 1.5 * torch.randn(args.batch, args.dim, generator=gen).double()
    emb64 = torch.nn.functional.normalize(emb64, dim=1)
    rel = labels[:, None] == labels[None, :]
    valid = ~torch.eye(args.batch, dtype=torch.bool)

    emb32 = emb64.float()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        sim_bf16 = emb32 @ emb32.T
    diag = sim_bf16.diagonal().float()
    print(
        f"B={args.batch}: bf16 self-similarity in [{float(diag.min()):.6f}, "
        f"{float(diag.max()):.6f}]; distinct off-diagonal values: bf16 "
        f"{sim_bf16[valid].unique().numel()}, float32 "
        f"{full_precision_similarity(emb32)[valid].unique().numel()} of {int(valid.sum())}"
    )
    print(f"{'loss':10s} {'value err fp32':>15s} {'value err bf16':>15s} "
          f"{'grad err fp32':>14s} {'grad err bf16':>14s}")  # fmt: skip
    for name in available_losses():
        loss_fn = build_loss(name, **SETTINGS.get(name, {}))
        ref_value, ref_grad = loss_and_grad(loss_fn.double(), emb64, rel, valid, "fp64")
        loss_fn = loss_fn.float()
        row = []
        for how in ("fp32", "bf16"):
            value, grad = loss_and_grad(loss_fn, emb32, rel, valid, how)
            value_err = abs(value - ref_value) / max(abs(ref_value), 1e-12)
            grad_err = float((grad - ref_grad).norm() / ref_grad.norm())
            row.append((value_err, grad_err))
        (v32, g32), (v16, g16) = row
        cells = [f"{x:15.2e}" for x in (v32, v16)] + [f"{x:14.2e}" for x in (g32, g16)]
        print(f"{name:10s} " + " ".join(cells))
    print(
        f"(relative errors vs float64; tests/modules/test_autocast.py asserts <= 1e-4; {SETTINGS})"
    )


if __name__ == "__main__":
    main()
