"""The broad world family (research/tail_family.py) and its fixed design / held-out split."""

import math

import pytest
import torch

from research.tail_family import (
    N_WORLDS,
    RANGES,
    RandomWorld,
    describe,
    draw_params,
    family_world,
)
from research.tail_pools import stream_pool, true_map
from research.tail_split import load_split, make_split
from research.tail_worlds import WORLDS


def test_family_is_broad_and_includes_the_six_worlds():
    assert N_WORLDS >= 66
    for i, name in enumerate(WORLDS):
        assert family_world(i, 8).name == name
    params = [draw_params(i) for i in range(len(WORLDS), N_WORLDS)]
    assert {p.score for p in params} == {"cosine", "inner"}
    assert {p.weights for p in params} == {"dirichlet", "zipf"}
    assert {p.depth for p in params} == {1, 2, 3}
    assert sum(p.dup_rate > 0 for p in params) >= 5
    assert sum(p.junk > 0 for p in params) >= 10
    assert sum(p.heavy_share > 0 for p in params) >= 10


def test_parameters_lie_in_their_ranges():
    for i in range(len(WORLDS), N_WORLDS):
        p = draw_params(i)
        for key, (lo, hi) in RANGES.items():
            value = getattr(p, key)
            if key in ("junk", "heavy_share", "dup_rate") and value == 0.0:
                continue  # the component is switched off in this world
            # Integer parameters are rounded from a continuous draw.
            slack = 0.5 if isinstance(value, int) else 1e-12
            assert lo - slack <= value <= hi + slack, (i, key, value)


def test_worlds_are_deterministic_per_id_and_differ_between_ids():
    a, b = RandomWorld(7, 16), RandomWorld(7, 16)
    assert torch.equal(a.pos_scores.nan_to_num(-9), b.pos_scores.nan_to_num(-9))
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    assert torch.equal(a.distractors(500, g1), b.distractors(500, g2))
    c = RandomWorld(8, 16)
    assert describe(7) != describe(8)
    assert not torch.equal(a.queries[:, :4], c.queries[:, :4])


def test_cosine_scores_are_bounded_and_positives_calibrated():
    w = next(RandomWorld(i, 64) for i in range(6, N_WORLDS) if draw_params(i).score == "cosine")
    x = w.distractors(4000, torch.Generator().manual_seed(0))
    assert torch.allclose(x.norm(dim=1), torch.ones(4000), atol=1e-5)
    s = w.queries @ x.T
    assert float(s.abs().max()) <= 1.0 + 1e-5
    # The calibration targets a share of positives above the whole 20k pilot; above
    # a smaller fresh sample, at least that share (independent brute-force count).
    valid = ~torch.isnan(w.pos_scores)
    above = (w.pos_scores > s.max(1).values.double().unsqueeze(1)) & valid
    assert float(above.sum()) / float(valid.sum()) >= w.params.unreached - 0.15


def test_split_is_fixed_disjoint_and_covers_the_family():
    split = load_split()
    assert split == make_split(split["seed"])
    design, held = set(split["design"]), set(split["held_out"])
    assert not design & held
    assert design | held == set(range(N_WORLDS))
    assert set(range(len(WORLDS))) <= design  # the estimators were built on the six
    assert len(held) >= 30


def test_pool_truth_matches_brute_force():
    data = stream_pool(9, pool=3000, rate=0.1, n_queries=5, block=1024)
    # Brute force: re-draw the same pool in one block and rank every positive.
    world = family_world(9, 5)
    g = torch.Generator().manual_seed(9 * 31 + 17)
    blocks = [world.distractors(n, g) for n in (1024, 1024, 952)]
    scores = (world.queries @ torch.cat(blocks).T).double()
    total = 0.0
    for q in range(5):
        pos = sorted((float(v) for v in world.pos_scores[q] if not math.isnan(v)), reverse=True)
        ap = 0.0
        for j, s in enumerate(pos, 1):
            rank = j + int((scores[q] >= torch.tensor(s, dtype=torch.float32).double()).sum())
            ap += j / rank if rank <= 1000 else 0.0
        total += ap / min(1000, len(pos))
    assert true_map(data) == pytest.approx(total / 5, abs=1e-12)
    assert 0.05 * 3000 * 0.6 < data["sample"].shape[1] < 0.1 * 3000 * 1.4
