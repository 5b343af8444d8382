"""Single-batch analysis (gSAP paper §3.5, Figure 3): gSAP vs mSAP on one fixed batch.

One fixed batch of the bundled MNIST-5k digits (``--data mnist``, default) or of
random features (``--data random``), one initialisation of a linear encoder
(pixels -> ``--dim``, L2-normalised), ``--steps`` Adam (or SGD) updates with gSAP and
with mSAP at each temperature. Per update it records, on the batch itself
(diagonal excluded):

- gAP (one AP over all off-diagonal pairs) and mAP (mean per-row AP), exact
  (scikit-learn's ``average_precision_score``, ties pessimistic);
- the number of *unsaturated* comparisons per positive: items j with
  |s_j − s_i| / τ < ``SATURATION`` (beyond, σ is 0 or 1 to float32 precision
  and the pair carries no gradient), among the items the loss compares
  positive i with: the whole flattened batch for gSAP, i's row for mSAP.

Writes ``<out>/overfit_analysis.csv`` and ``.png`` (``overfit_analysis_sgd.*`` with SGD).

    python research/overfit_analysis.py --out runs/overfit_analysis
"""

from __future__ import annotations

import argparse
import csv
import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.metrics import average_precision_score

from rl_gap.losses import build_loss

# σ(−u) < 2^-24 (float32 epsilon/2) for u > 24 ln 2 ≈ 16.6: saturated.
SATURATION = 24 * math.log(2.0)
TAUS = (1e-1, 1e-2, 1e-3, 1e-4)


def load_batch(kind: str, batch: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Features (B, F) float32 and labels (B,), a class-balanced fixed batch."""
    gen = np.random.default_rng(seed)
    if kind == "mnist":
        from rl_gap.data.mnist import load_mnist_5k

        images, labels = load_mnist_5k()
        per_class = batch // 10
        chosen = np.concatenate(
            [gen.choice(np.flatnonzero(labels == c), per_class, replace=False) for c in range(10)]
        )
        feats = torch.from_numpy(images[chosen].reshape(len(chosen), -1).astype(np.float32) / 255.0)
        return feats - feats.mean(0), torch.from_numpy(labels[chosen])
    labels = torch.arange(batch) // 4
    centres = torch.from_numpy(gen.standard_normal((batch // 4, 64)).astype(np.float32))
    noise = torch.from_numpy(gen.standard_normal((batch, 64)).astype(np.float32))
    return centres[labels] + 1.5 * noise, labels


def exact_gap_map(sim: torch.Tensor, rel: torch.Tensor, valid: torch.Tensor) -> tuple[float, float]:
    s, r = sim[valid].double().numpy(), rel[valid].numpy()
    gap = float(average_precision_score(r, s))
    aps = [
        average_precision_score(rel[q][valid[q]].numpy(), sim[q][valid[q]].double().numpy())
        for q in range(sim.shape[0])
        if bool((rel[q] & valid[q]).any())
    ]
    return gap, float(np.mean(aps))


def unsaturated_per_positive(
    sim: torch.Tensor, rel: torch.Tensor, valid: torch.Tensor, tau: float, per_row: bool
) -> float:
    """Mean over positives i of #{j != i compared with i : |s_j − s_i| < SATURATION τ}."""
    width = SATURATION * tau
    counts = []
    lists = [(sim[q][valid[q]], rel[q][valid[q]]) for q in range(sim.shape[0])]
    if not per_row:
        lists = [(sim[valid], rel[valid])]
    for scores, positive in lists:
        if not bool(positive.any()):
            continue
        ordered, _ = torch.sort(scores.double())
        anchors = scores[positive].double()
        upper = torch.searchsorted(ordered, anchors + width, right=False)
        lower = torch.searchsorted(ordered, anchors - width, right=True)
        counts.append((upper - lower - 1).clamp_min(0).double())  # minus the positive itself
    return float(torch.cat(counts).mean())


def run(args: argparse.Namespace) -> list[dict]:
    torch.manual_seed(args.seed)
    feats, labels = load_batch(args.data, args.batch, args.seed)
    init = torch.nn.Linear(feats.shape[1], args.dim, bias=False)
    rel = labels[:, None] == labels[None, :]
    valid = ~torch.eye(len(labels), dtype=torch.bool)
    rows = []
    for tau in args.taus:
        for loss_name in ("gsap", "msap"):
            encoder = torch.nn.Linear(feats.shape[1], args.dim, bias=False)
            encoder.load_state_dict(init.state_dict())
            loss_fn = build_loss(loss_name, temperature=tau)
            if args.optimizer == "adam":
                optimizer = torch.optim.Adam(encoder.parameters(), lr=args.lr)
            else:
                optimizer = torch.optim.SGD(encoder.parameters(), lr=args.lr, momentum=0.9)
            for step in range(args.steps + 1):
                emb = F.normalize(encoder(feats), dim=1)
                sim = emb @ emb.T
                loss = loss_fn(sim, rel, valid)
                with torch.no_grad():
                    gap, map_ = exact_gap_map(sim.detach(), rel, valid)
                    unsat = unsaturated_per_positive(
                        sim.detach(), rel, valid, tau, per_row=loss_name == "msap"
                    )
                rows.append(
                    {
                        "loss": loss_name,
                        "tau": tau,
                        "step": step,
                        "loss_value": float(loss),
                        "gap": gap,
                        "map": map_,
                        "unsaturated_per_positive": unsat,
                    }
                )
                print(
                    f"{loss_name} tau={tau:g} step={step:2d} loss={float(loss):.5f} "
                    f"gAP={gap:.4f} mAP={map_:.4f} unsaturated/pos={unsat:.2f}",
                    flush=True,
                )
                if step == args.steps:
                    break
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
    return rows


def write_outputs(rows: list[dict], out: Path, stem: str) -> tuple[Path, Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    csv_path, png_path = out / f"{stem}.csv", out / f"{stem}.png"
    with csv_path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    taus = sorted({r["tau"] for r in rows}, reverse=True)
    metrics = [
        ("gap", "gAP"),
        ("map", "mAP"),
        ("unsaturated_per_positive", "unsaturated / positive"),
    ]
    fig, axes = plt.subplots(len(metrics), len(taus), figsize=(3.2 * len(taus), 7.5), squeeze=False)
    for col, tau in enumerate(taus):
        for row, (key, label) in enumerate(metrics):
            ax = axes[row][col]
            for name, color in (("gsap", "tab:blue"), ("msap", "tab:orange")):
                series = [r for r in rows if r["tau"] == tau and r["loss"] == name]
                values = [max(r[key], 1e-2) if key.startswith("unsat") else r[key] for r in series]
                ax.plot([r["step"] for r in series], values, color=color, label=name)
            if key.startswith("unsat"):
                ax.set_yscale("log")
            if row == 0:
                ax.set_title(f"τ = {tau:g}")
            if col == 0:
                ax.set_ylabel(label)
            if row == len(metrics) - 1:
                ax.set_xlabel("update")
    axes[0][0].legend()
    fig.tight_layout()
    fig.savefig(png_path, dpi=80)
    plt.close(fig)
    return csv_path, png_path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", choices=("mnist", "random"), default="mnist")
    parser.add_argument("--batch", type=int, default=200)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--optimizer", choices=("adam", "sgd"), default="adam")
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--taus", type=float, nargs="+", default=list(TAUS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("runs/overfit_analysis"))
    args = parser.parse_args(argv)
    if args.batch < 2 or args.steps < 1:
        raise ValueError("need --batch >= 2 and --steps >= 1")
    rows = run(args)
    stem = "overfit_analysis" if args.optimizer == "adam" else f"overfit_analysis_{args.optimizer}"
    csv_path, png_path = write_outputs(rows, args.out, stem)
    print(f"wrote {csv_path} and {png_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
