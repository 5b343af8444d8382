"""MAP@R / R-precision agreement: the exact engine against a float64 brute force (tied
scores, queries without positives) and against pytorch-metric-learning's
``AccuracyCalculator`` (tie-free scores, lone queries), over 50 seeded cases.

    python research/check_map_at_r.py

pytorch-metric-learning is not a dependency; it installs without touching torch, e.g.
``pip install --no-deps --target /tmp/pml pytorch-metric-learning`` and
``PYTHONPATH=/tmp/pml``. Without it only the brute-force line is printed.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ holds the brute force

from rl_gap.metrics.functional import evaluate_embeddings  # noqa: E402
from tests.metrics.functional.test_map_at_r import brute_force  # noqa: E402


def _calculator():
    try:
        from pytorch_metric_learning.distances import DotProductSimilarity
        from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator
        from pytorch_metric_learning.utils.inference import CustomKNN
    except ImportError:
        return None
    return AccuracyCalculator(
        include=("mean_average_precision_at_r", "r_precision"),
        k="max_bin_count",
        knn_func=CustomKNN(DotProductSimilarity(normalize_embeddings=False)),
    )


def main(cases: int = 50) -> None:
    calc = _calculator()
    d_bf, d_pml = [0.0, 0.0], [0.0, 0.0]
    for seed in range(cases):
        g = torch.Generator().manual_seed(seed)
        # tied: small-integer embeddings (exact scores), 5 singleton classes
        x = torch.randint(-2, 3, (200, 4), generator=g).float()
        lab = torch.randint(0, 15, (200,), generator=g)
        lab[:5] = 1000 + torch.arange(5)
        scores = (x.double() @ x.double().T).numpy()
        rel = (lab[:, None] == lab[None, :]).numpy()
        want_map, want_rp, _ = brute_force(scores, rel, ~np.eye(200, dtype=bool))
        out = evaluate_embeddings(x, query_labels=lab, exclude_self=True, ceiling=False)
        d_bf[0] = max(d_bf[0], abs(out["map@r"] - want_map))
        d_bf[1] = max(d_bf[1], abs(out["r_precision"] - want_rp))
        if calc is None:
            continue
        # tie-free: unit float64 rows (each its own nearest, which PML drops), 3 lone queries
        y = torch.nn.functional.normalize(torch.randn(300, 16, generator=g, dtype=torch.float64))
        lab = torch.randint(0, 20, (300,), generator=g)
        lab[:3] = 1000 + torch.arange(3)
        want = calc.get_accuracy(y, lab, y, lab, ref_includes_query=True)
        out = evaluate_embeddings(y, query_labels=lab, exclude_self=True, ceiling=False)
        d_pml[0] = max(d_pml[0], abs(out["map@r"] - want["mean_average_precision_at_r"]))
        d_pml[1] = max(d_pml[1], abs(out["r_precision"] - want["r_precision"]))
    print(
        f"{cases} cases, max |engine - float64 brute force| (ties, queries without positives): "
        f"MAP@R {d_bf[0]:.1e}, R-precision {d_bf[1]:.1e}"
    )
    if calc is not None:
        print(
            f"{cases} cases, max |engine - pytorch-metric-learning| (no ties, lone queries): "
            f"MAP@R {d_pml[0]:.1e}, R-precision {d_pml[1]:.1e}"
        )


if __name__ == "__main__":
    main()
