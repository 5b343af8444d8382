"""The contract every registered tail estimator keeps, on a world whose mAP is known.

The world: each query has three positives at fixed scores near the top of
[−1, 1] and a gallery of N distractors drawn uniformly on [−1, 1]; the sample
is the first S of them. The gallery's exact AP@k is computed here by brute
force in float64 (``brute_force_ap``), independent of the package.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

from rl_gap.metrics.tail import available_estimators, get_estimator, predict_map
from rl_gap.metrics.tail.bayes import BayesTailConfig
from rl_gap.metrics.tail.registry import DEFAULT_ESTIMATOR

Q, S, N, K = 24, 2_000, 40_000, 100


def brute_force_ap(pos: np.ndarray, gallery: np.ndarray, k: int) -> np.ndarray:
    """(Q,) AP@k of each query: positives ranked among themselves and the gallery (ties
    pessimistic: every item scoring ≥ a positive ranks above it)."""
    out = np.empty(pos.shape[0])
    for q in range(pos.shape[0]):
        items = np.concatenate([pos[q], gallery[q]])
        total = 0.0
        for s in pos[q]:
            rank = int((items >= s).sum())
            hits = int((pos[q] >= s).sum())
            if rank <= k:
                total += hits / rank
        out[q] = total / min(k, pos.shape[1])
    return out


@pytest.fixture(scope="module")
def world():
    rng = np.random.default_rng(7)
    pos = np.sort(rng.uniform(0.9990, 0.99999, (Q, 3)), axis=1)[:, ::-1].copy()
    gallery = rng.uniform(-1.0, 1.0, (Q, N))
    return {
        "pos": torch.from_numpy(pos),
        "sample": torch.from_numpy(gallery[:, :S].copy()),
        "truth": float(brute_force_ap(pos, gallery, K).mean()),
        "at_sample": float(brute_force_ap(pos, gallery[:, :S], K).mean()),
    }


def predict(world, name, pos=None, sample=None, **kwargs):
    kwargs.setdefault("n_boot", 200)
    kwargs.setdefault("bayes", BayesTailConfig(bias_replicates=0))  # tail: one fit, not ~7
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a 2,000-score sample is small for the paper's evt
        return predict_map(
            world["pos"] if pos is None else pos,
            world["sample"] if sample is None else sample,
            gallery_size=N,
            k=K,
            estimator=name,
            **kwargs,
        )


def test_the_registry_names_every_estimator_once_with_the_default_among_them():
    names = available_estimators()
    assert len(set(names)) == len(names) == 9
    assert DEFAULT_ESTIMATOR == "tail_pooled" and DEFAULT_ESTIMATOR in names
    for name in names:
        est = get_estimator(name)
        assert est.name == name and est.summary and est.cost
        assert est.own_rank_law in est.rank_laws


def test_an_unknown_name_is_one_clear_error():
    with pytest.raises(ValueError, match=r"unknown estimator 'nope'; known: tail, evt"):
        get_estimator("nope")
    with pytest.raises(ValueError, match="unknown estimator 'nope'"):
        predict_map(torch.ones(1, 1) * 0.5, torch.zeros(1, 4), 10, k=2, estimator="nope")


@pytest.mark.parametrize("name", available_estimators())
def test_estimate_is_finite_in_the_unit_interval_below_the_sample_gallery(world, name):
    est = predict(world, name)
    assert math.isfinite(est.map) and 0.0 <= est.map <= 1.0
    if get_estimator(name).realized:
        # the sample's own gallery: the brute-force AP@k of the first S distractors
        assert est.map == pytest.approx(world["at_sample"], abs=1e-12)
        assert est.gallery_size == S
    else:
        assert est.gallery_size == N
        # N = 20 S distractors cannot raise the sample gallery's mAP (the truth, 0.25, is
        # far below it); how close each estimator comes is docs/tail_validation.md's table
        assert est.map < world["at_sample"], (name, est.map, world["at_sample"])
        assert world["truth"] < world["at_sample"] - 0.5


@pytest.mark.parametrize("name", available_estimators())
def test_interval_brackets_the_estimate(world, name):
    est = predict(world, name)
    lo, hi = est.ci
    assert lo <= est.map <= hi
    assert predict(world, name, n_boot=0).ci is None


@pytest.mark.parametrize("name", available_estimators())
def test_result_carries_what_the_estimator_declares(world, name):
    spec = get_estimator(name)
    est = predict(world, name, budget=True)
    assert est.estimator == name
    assert (est.hardness is not None) == spec.per_positive
    assert (est.budget is not None) == spec.per_positive
    assert (est.diagnostics is not None) == spec.per_positive
    assert est.flags == ([] if est.diagnostics is None else list(est.diagnostics.flags))
    assert est.rank_law == ("realized" if spec.realized else spec.own_rank_law)


@pytest.mark.parametrize("name", available_estimators())
def test_an_affine_map_of_the_scores_with_their_range_leaves_the_prediction(world, name):
    a, b = 0.5, 0.25
    plain = predict(world, name)
    moved = predict(
        world, name, pos=a * world["pos"] + b, sample=a * world["sample"] + b,
        score_range=(a * -1.0 + b, a * 1.0 + b),
    )  # fmt: skip
    assert moved.map == pytest.approx(plain.map, rel=1e-6, abs=1e-9)


@pytest.mark.parametrize("name", available_estimators())
def test_nan_or_empty_input_is_refused_by_name(world, name):
    sample = world["sample"].clone()
    sample[3, 5] = math.nan
    with pytest.raises(ValueError, match="NaN"):
        predict(world, name, sample=sample)
    with pytest.raises(ValueError, match="empty"):
        predict(world, name, sample=world["sample"][:, :0])
    pos = world["pos"].clone()
    pos[0, 0] = math.inf
    with pytest.raises(ValueError, match="inf"):
        predict(world, name, pos=pos)
