"""The world-family generator (research/tail_gen.py) and its committed design / held-out split."""

import math

import numpy as np
import torch

from research.tail_gen import (
    EMBEDDING_FAMILIES,
    EMBEDDING_MAX_POOL,
    FAMILIES,
    RATIO,
    SCORE_FAMILIES,
    SIZES,
    all_keys,
    load_split,
    make_split,
    parse_key,
    score_world,
    world_spec,
)


def test_the_committed_split_is_the_seeded_one_and_splits_families_not_draws():
    split = load_split()
    assert split == make_split()
    design, held = set(split["design"]), set(split["held_out"])
    assert not design & held and design | held == set(FAMILIES)
    for group in (EMBEDDING_FAMILIES, SCORE_FAMILIES):  # half of each kind on each side
        assert len(design & set(group)) == len(group) // 2


def test_world_designs_lie_in_their_ranges_and_are_deterministic():
    keys = all_keys()
    assert len(keys) == len(FAMILIES) * len(SIZES) * 2
    for key in keys:
        spec = world_spec(key)
        assert spec == world_spec(key) and parse_key(key) == (
            spec["family"],
            spec["S"],
            int(key[-1]),
        )
        ratio = spec["N"] / spec["S"]
        if spec["family"] in EMBEDDING_FAMILIES:
            assert spec["N"] <= EMBEDDING_MAX_POOL and 8 <= spec["params"]["dim"] <= 512
            assert ratio <= RATIO[1] * 1.001
        else:
            assert RATIO[0] * 0.999 <= ratio <= RATIO[1] * 1.001
        assert spec["k"] in (100, 1000)


def test_score_world_pool_counts_hold_the_sample_and_follow_the_law():
    spec = world_spec("score_heavy-S5k-0")
    out = score_world(spec)
    pos, sample, counts = out["pos_scores"], out["sample"], out["pool_counts"]
    valid = ~torch.isnan(pos)
    in_sample = (sample.double().unsqueeze(1) >= pos.unsqueeze(-1)).sum(-1)
    # The pool contains the sample: its count is never below the sample's own.
    assert bool((counts[valid] >= in_sample[valid]).all())
    # Pool counts grow with descending positive score (nested intervals), per query.
    for q in range(pos.shape[0]):
        v = valid[q]
        order = torch.argsort(pos[q][v], descending=True)
        assert bool((counts[q][v][order].diff() >= 0).all())
    # The pool's share above each positive matches its exact survival (Student-t law):
    # summed over positives, counts / N against sum of the drawn hardness, within 5 sd.
    from research.tail_gen import _laws  # the same per-query laws, redrawn from the seed

    rng = np.random.default_rng(spec["seed"])
    laws = _laws(spec, rng)
    x = np.concatenate([laws[q].sf(pos[q][valid[q]].numpy()) for q in range(pos.shape[0])])
    expected = x.sum() * spec["N"]
    assert abs(float(counts[valid].sum()) - expected) < 5 * math.sqrt(expected) + 5
