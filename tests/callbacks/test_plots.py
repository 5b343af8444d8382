"""The evaluation plots state AP, the prevalence baseline and the shared threshold they draw."""

import numpy as np
import torch
from sklearn.metrics import average_precision_score

from rl_gap.callbacks.plots import save_consistency_plots
from rl_gap.metrics.functional.engine import state_from_embeddings


def _pairs(emb, labels):
    """Scores and relevance of every (query, other item) pair, float64 brute force."""
    scores = (emb.double() @ emb.double().T).numpy()
    same = (labels[:, None] == labels[None, :]).numpy()
    off = ~np.eye(len(labels), dtype=bool)
    return scores[off], same[off]


def test_pr_curve_and_threshold_values(tmp_path):
    gen = torch.Generator().manual_seed(0)
    labels = torch.arange(6).repeat_interleave(5)
    emb = torch.nn.functional.normalize(
        torch.randn(30, 8, generator=gen) + labels[:, None] * 0.3, dim=1
    )
    state = state_from_embeddings(emb, emb, labels, labels, exclude_self=True)
    plots = save_consistency_plots(state, tmp_path, "val_epoch003", title="demo/seed0 · val · epoch 3",
                                   threshold_key="val/threshold_f1g")  # fmt: skip
    scores, rel = _pairs(emb, labels)
    assert abs(plots.gap - average_precision_score(rel, scores)) < 1e-5
    assert plots.prevalence == rel.mean()
    # the shared threshold maximises the F1 of "score >= t" over all pairs
    best = max(
        (2 * (rel & (scores >= t)).sum() / ((scores >= t).sum() + rel.sum()), t)
        for t in scores[rel]
    )
    assert abs(plots.shared_threshold - best[1]) < 1e-5
    assert plots.pr_curve.is_file() and plots.thresholds.is_file()
    recall, precision = np.array(plots.pr_points).T
    # the curve's last point: every positive retrieved, with the negatives scoring above the
    # lowest positive
    lowest = scores[rel].min()
    assert recall[-1] == 1.0 and abs(precision[-1] - rel.sum() / (scores >= lowest).sum()) < 1e-9
