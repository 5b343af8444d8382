"""Evaluation during training also logs the consistency ceiling C and the efficiency gAP / C.

Reference: ``tests/ceiling_brute.py`` (exhaustive search over every interleaving of the
per-query rankings, float64) for C, scikit-learn for gAP.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from ceiling_brute import best_interleaving_ap, observed_gap

from rl_gap.callbacks.retrieval import RetrievalEvaluation


def _logged(ceiling, embeddings, labels) -> dict[str, float]:
    callback = RetrievalEvaluation(plots=False, map_at=(), ceiling=ceiling)
    callback._collect({"embeddings": embeddings, "labels": labels,
                       "indices": torch.arange(len(labels))})  # fmt: skip
    trainer = SimpleNamespace(is_global_zero=True, datamodule=None, world_size=1,
                              strategy=SimpleNamespace(broadcast=lambda obj, src=0: obj))  # fmt: skip
    logged: dict[str, float] = {}
    module = SimpleNamespace(device=torch.device("cpu"),
                             log=lambda k, v, **_: logged.update({k: v}))  # fmt: skip
    callback._evaluate(trainer, module, "val")
    return logged


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ceiling_and_efficiency_logged_against_brute_force(seed):
    g = torch.Generator().manual_seed(seed)
    emb = torch.nn.functional.normalize(torch.randn(5, 3, generator=g, dtype=torch.float64), dim=1)
    labels = torch.tensor([0, 0, 0, 1, 1])
    logged = _logged(None, emb.float(), labels)
    scores = (emb.float() @ emb.float().T).double().numpy()
    rel = (labels[:, None] == labels[None, :]).numpy()
    valid = ~np.eye(5, dtype=bool)
    best = best_interleaving_ap(scores, rel, valid)
    gap = observed_gap(scores, rel, valid)
    assert logged["val/gap"] == pytest.approx(gap, abs=1e-6)
    # C is the best of the schedules: a lower bound on the exhaustive optimum, at least gAP
    assert gap - 1e-9 <= logged["val/ceiling"] <= best + 1e-9
    assert logged["val/ceiling"] == pytest.approx(best, abs=1e-6)  # exact on these instances
    assert logged["val/efficiency"] == pytest.approx(gap / best, abs=1e-6)


def test_ceiling_off_logs_none():
    emb = torch.nn.functional.normalize(
        torch.randn(6, 3, generator=torch.Generator().manual_seed(0))
    )
    logged = _logged(False, emb, torch.tensor([0, 0, 0, 1, 1, 1]))
    assert "val/gap" in logged and "val/ceiling" not in logged and "val/efficiency" not in logged
