"""The ``tail`` estimator on distractor tails whose hardness is known in closed form.

Scores are drawn directly from a distribution (exact GPD, exponential, Weibull);
positives sit at known depths L = −log x, so the truth E[AP@k] at N follows
from the Binomial rank law at the true hardness (``rank_law``), independently
of any fit. Also: the simulated worlds of ``research/validate_tail.py`` keep
their defining rates at any number of queries.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from research.tail_worlds import World
from rl_gap.metrics.tail import predict_map
from rl_gap.metrics.tail.bayes import BayesTailConfig
from rl_gap.metrics.tail.rank_law import ap_at_k_from_hardness, sort_positives

#: name → (scores from uniforms u, score at depth L, true survival of a score)
CLOSED_FORM = {
    "gpd": (
        lambda u: (u**0.2 - 1.0) / -0.2,  # ξ = −0.2, σ = 1: endpoint 5
        lambda L: (torch.exp(-L) ** 0.2 - 1.0) / -0.2,
        lambda s: (1.0 - 0.2 * s).clamp_min(0.0) ** 5,
    ),
    "exponential": (lambda u: -torch.log(u), lambda L: L, lambda s: torch.exp(-s)),
    "weibull": (
        lambda u: torch.sqrt(-torch.log(u)),  # P(Y > y) = exp(−y²): Gaussian-like
        lambda L: torch.sqrt(L),
        lambda s: torch.exp(-(s**2)),
    ),
}


def closed_form_world(name: str, seed: int = 0, Q: int = 300, S: int = 100_000):
    draw, at_depth, survival = CLOSED_FORM[name]
    g = torch.Generator().manual_seed(seed)
    sample = draw(torch.rand(Q, S, generator=g, dtype=torch.float64))
    # Positives from 8 to 15 nats deep: the sample (S = 1e5, 11.5 nats) sees the
    # shallow ones, the 20× larger gallery reaches the deepest.
    pos = at_depth(torch.empty(Q, 3, dtype=torch.float64).uniform_(8.0, 15.0, generator=g))
    return pos, sample, survival


@pytest.mark.parametrize("name", sorted(CLOSED_FORM))
def test_tail_predicts_closed_form_worlds_at_20x(name):
    """Measured (seed 0): −0.000 (exponential), −0.005 (gpd), +0.010 (weibull);
    without the bootstrap bias correction +0.002, +0.018, +0.014."""
    pos, sample, survival = closed_form_world(name)
    N, k = 2_000_000, 1000
    ps, valid, j = sort_positives(pos)
    truth = float(ap_at_k_from_hardness(j, valid, survival(ps), N, k, "binomial").mean())
    est = predict_map(pos, sample, gallery_size=N, k=k, n_boot=200, estimator="tail")
    assert abs(est.map - truth) < 0.012
    uncorrected = predict_map(
        pos,
        sample,
        gallery_size=N,
        k=k,
        n_boot=10,
        estimator="tail",
        bayes=BayesTailConfig(bias_replicates=0),
    )
    assert abs(est.map - truth) < abs(uncorrected.map - truth)


def test_near_duplicate_copies_per_query_do_not_depend_on_the_number_of_queries():
    """The bump holds ~5 copies of each query per 100,000 distractors at any Q (it used to
    thin out as 1/Q: one copy per query in a 5% sample at Q = 1000)."""
    for n_queries in (50, 400):
        counts = []
        for name in ("near_duplicates", "isotropic"):  # same queries and bulk, with/without copies
            world = World(name, n_queries=n_queries, seed=0)
            x = world.distractors(100_000, torch.Generator().manual_seed(1))
            counts.append(float((world.queries @ x.T > 0.55).sum(1).double().mean()))
        # Copies have cosines 0.53–0.86: ~4–5 of the ~5 per query lie above 0.55.
        assert 2.5 < counts[0] - counts[1] < 8.0


def _validate_script():
    path = Path(__file__).resolve().parents[2] / "research" / "validate_tail.py"
    spec = importlib.util.spec_from_file_location("validate_tail", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def test_validate_script_splits_the_error_by_sampled_count_and_reuses_its_cache(tmp_path):
    """research/validate_tail.py on a small pool: the per-group errors add up to each
    estimator's error (against the pool's exact mAP@k), the summary covers every
    (world, seed), and a second run reads the cached pool instead of streaming it."""
    script = _validate_script()
    argv = [
        "--worlds", "isotropic,student_t", "--pool", "40000", "--rate", "0.1",
        "--queries", "30", "--k", "50", "--n-boot", "20", "--seeds", "0,1",
        "--estimators", "count,evt,tail", "--by-count", "--nested-boot", "3",
        "--cache", str(tmp_path / "cache"), "--json", str(tmp_path / "out.json"),
    ]  # fmt: skip
    assert script.main(argv) == 0
    rows = json.loads((tmp_path / "out.json").read_text())["rows"]
    assert sorted((r["world"], r["seed"]) for r in rows) == [
        ("isotropic", 0), ("isotropic", 1), ("student_t", 0), ("student_t", 1)
    ]  # fmt: skip
    for row in rows:
        for name in ("count", "evt", "tail"):
            parts = row[name]["by_count"]
            assert sum(p["positives"] for p in parts.values()) > 0
            assert sum(p["err"] for p in parts.values()) == pytest.approx(
                row[name]["err"], abs=1e-9
            )
            lo, hi = row[name]["nested_ci"]  # the joint interval, centred on the prediction
            assert lo <= row[name]["map"] <= hi and row[name]["sample_noise_sd"] > 0
    assert len(list((tmp_path / "cache").glob("*.pt"))) == 4
    script.stream_world = None  # a second run must not stream again
    assert script.main(argv) == 0


def _brute_force_map_at_k(pos_scores: torch.Tensor, scores: torch.Tensor, k: int) -> float:
    """mAP@k in float64 against the distractor scores (Q, n): rank of the j-th best
    positive = j + the distractors scoring at least as high."""
    pos, dis = pos_scores.numpy(), scores.double().numpy()
    aps = []
    for q in range(pos.shape[0]):
        p = np.sort(pos[q][~np.isnan(pos[q])])[::-1]
        ranks = np.arange(1, p.size + 1) + (dis[q][None, :] >= p[:, None]).sum(1)
        hits = ranks <= k
        aps.append((np.arange(1, p.size + 1)[hits] / ranks[hits]).sum() / min(k, p.size))
    return float(np.mean(aps))


def test_validate_script_resamples_are_independent_hashed_samples_of_one_pool(tmp_path, capsys):
    """--resamples: sample r is the pool's distractors whose hash (seed 0, then
    100003·r) falls below the rate, and the bias / noise sd are the mean / sd of the
    errors; checked by replaying the pool and computing every mAP@k by brute force.
    With --by-count every sample's error is split by K_S (counted by brute force), and
    --half-check counts, for every sample, the other half's distractors above the
    positives its nested half (hash below rate/2) does not reach, and the rest of
    the pool's above the positives the sample does not reach."""
    from research.tail_report import bias_and_noise
    from rl_gap.metrics.tail.sampling import hash_uniform

    script = _validate_script()
    pool, rate, k, block, n_queries = 12_000, 0.1, 30, 5000, 20
    argv = [
        "--worlds", "isotropic", "--pool", str(pool), "--rate", str(rate), "--block", str(block),
        "--queries", str(n_queries), "--k", str(k), "--n-boot", "10", "--seed", "0",
        "--estimators", "sample,count", "--resamples", "3", "--nested-boot", "2",
        "--by-count", "--half-check", "--json", str(tmp_path / "out.json"),
    ]  # fmt: skip
    assert script.main(argv) == 0
    printed = capsys.readouterr().out
    row = json.loads((tmp_path / "out.json").read_text())["rows"][0]

    world = World("isotropic", n_queries, 6, 0)
    g = torch.Generator().manual_seed(17)  # the pool of seed 0
    scores = torch.cat(
        [
            world.queries @ world.distractors(min(block, pool - s), g).T
            for s in range(0, pool, block)
        ],
        dim=1,
    )
    truth = _brute_force_map_at_k(world.pos_scores, scores, k)
    assert row["truth"] == pytest.approx(truth, abs=1e-12)
    errs, unreached, half_unreached, other_above, pool_above = [], [], [], [], []
    rest_sizes = []
    valid = ~torch.isnan(world.pos_scores)

    def above(cols: torch.Tensor) -> torch.Tensor:  # (Q, m) distractors in cols >= each positive
        return (scores[:, cols].unsqueeze(1) >= world.pos_scores.unsqueeze(2)).sum(2)

    pool_counts = above(torch.ones(pool, dtype=torch.bool))
    for hash_seed in (0, 100003, 200006):
        u = torch.from_numpy(hash_uniform(np.arange(pool), seed=hash_seed))
        keep = u < rate
        rest_sizes.append(pool - int(keep.sum()))
        errs.append(_brute_force_map_at_k(world.pos_scores, scores[:, keep], k) - truth)
        past_sample = valid & (above(keep) == 0)
        unreached.append(int(past_sample.sum()))
        pool_above.append(float(pool_counts[past_sample].sum()))
        past_half = valid & (above(u < rate / 2) == 0)
        half_unreached.append(int(past_half.sum()))
        other_above.append(float(above((u >= rate / 2) & keep)[past_half].sum()))
    checks = row["half_check"]
    assert [int(sum(c["positives"])) for c in checks] == half_unreached
    assert [sum(c["actual"]) for c in checks] == other_above
    assert all(c["other_size"] > 0 and sum(c["predicted"]) > 0 for c in checks)
    checks = row["pool_check"]
    assert [int(sum(c["positives"])) for c in checks] == unreached
    assert [sum(c["actual"]) for c in checks] == pool_above
    assert [c["other_size"] for c in checks] == rest_sizes
    splits = row["count"]["resample_by_count"]
    assert [sp["K_S=0"]["positives"] for sp in splits] == unreached
    for sp, err in zip(splits, row["count"]["resample_errs"]):
        assert sum(v["err"] for v in sp.values()) == pytest.approx(err, abs=1e-9)
    held_out = np.mean([sp["K_S=0"]["err"] for sp in splits[1:]])
    line = next(x for x in printed.splitlines() if x.startswith("count") and "K_S=0" in x)
    assert float(line.split()[-1]) == pytest.approx(held_out, abs=1e-4)
    assert len({round(e, 9) for e in errs}) == 3  # three different samples
    assert row["sample"]["resample_errs"] == pytest.approx(errs, abs=1e-12)
    stats = bias_and_noise([row], "sample", "isotropic")
    assert stats["bias"] == pytest.approx(np.mean(errs))
    assert stats["sd"] == pytest.approx(np.std(errs, ddof=1))
    assert stats["mean_abs"] == pytest.approx(np.mean(np.abs(errs)))
    assert stats["held_out"] == pytest.approx(np.mean(np.abs(errs[1:])))
    covered = row["sample"]["resample_covered"]
    assert len(covered) == 3 and stats["covered"] == sum(covered) and stats["cells"] == 3
    # The joint interval (count has one) is computed on every sample, not only sample 0.
    assert (
        len(row["count"]["resample_nested_covered"]) == 3
        and len(row["count"]["resample_errs"]) == 3
    )
