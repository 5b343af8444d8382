"""Small-sample worlds: tail extrapolation from samples of S = 10k, 20k and 100k distractors.

The paper's EVT constants (top 4,000 scores, 200 exceedances) were set for
samples of millions. This family checks the estimators where users often
are: a 5% sample of a pool of 20·S distractors, predicting mAP@100 at the
pool (20× extrapolation), Q = 50 queries with 1–6 positives each. Four kinds
of geometry, all drawn with :class:`research.tail_family.RandomWorld`:

- ``clusters``: Gaussian clusters (5–300, Dirichlet weights), d = 32–128, cosine;
- ``cone``: one to three broad, strongly anisotropic clusters around a common
  offset (a cone of directions), d = 32–128, cosine;
- ``confusers``: Gaussian clusters plus rare tight confusers, noisy copies of
  the queries at the positives' distance, 0.2–2 per query expected in the sample
  (4–40 in the pool), cosine;
- ``family``: the broad ranges of ``research.tail_family`` (inner products included).

Each world's positives are calibrated on a pilot sample of S distractors so
that 30–70% of them beat every pilot score. A world is a deterministic function
of (S, kind, index); ``SMALL_SPLIT_PATH`` holds the design / held-out split,
drawn with a fixed seed and committed before any estimator ran on these worlds.

    .venv/bin/python -m research.tail_small --split     # rewrites tail_small_split.json
    .venv/bin/python -m research.tail_small --cache /tmp/tailsmall   # streams every pool
"""

from __future__ import annotations

import dataclasses
import json
import math
import os

import torch

from research.tail_family import RANGES, FamilyParams, RandomWorld, draw_params

SIZES = (10_000, 20_000, 100_000)
KINDS = ("clusters", "cone", "confusers", "family")
PER_KIND = 4
QUERIES = 50
MAX_POS = 6
K = 100
RATE = 0.05
SPLIT_SEED = 20261203
SMALL_SPLIT_PATH = os.path.join(os.path.dirname(__file__), "tail_small_split.json")


def world_key(sample_size: int, kind: str, index: int) -> str:
    return f"{kind}{index}-S{sample_size // 1000}k"


def _seed(sample_size: int, kind: str, index: int) -> int:
    return 7919 * SIZES.index(sample_size) + 104_729 * KINDS.index(kind) + 31 * index + 5


def small_params(sample_size: int, kind: str, index: int) -> FamilyParams:
    """The parameters of world (S, kind, index), a deterministic function of the three."""
    seed = _seed(sample_size, kind, index)
    if kind == "family":
        # A draw from the broad family's ranges at an id far from the family's own.
        return draw_params(10_000 + seed)
    g = torch.Generator().manual_seed(seed)

    def u(lo: float, hi: float) -> float:
        return float(torch.empty(1, dtype=torch.float64).uniform_(lo, hi, generator=g))

    def logu(lo: float, hi: float) -> float:
        return math.exp(u(math.log(lo), math.log(hi)))

    base = dict(
        dim=int(round(logu(32, 128))),
        n_clusters=int(round(logu(5, 300))),
        weights="dirichlet",
        dirichlet_alpha=logu(0.3, 5.0),
        zipf_exponent=1.0,
        spread=logu(0.3, 1.0),
        spread_sd=u(0.0, 0.5),
        spectrum=0.0,
        cone=0.0,
        depth=1,
        junk=0.0,
        heavy_share=0.0,
        nu=RANGES["nu"][1],
        dup_rate=0.0,
        score="cosine",
        norm_sd=0.0,
        unreached=u(0.3, 0.7),
        query_spread=u(0.3, 1.0),
    )
    if kind == "cone":
        base.update(
            n_clusters=int(round(logu(1, 3))),
            spread=logu(0.5, 1.5),
            spectrum=u(0.5, 1.5),
            cone=u(1.0, 3.0),
        )
    elif kind == "confusers":
        # Per query and pool item; expected copies per query in the sample = rate · S.
        base.update(dup_rate=logu(0.2, 2.0) / sample_size)
    elif kind != "clusters":
        raise ValueError(f"unknown kind {kind!r}; known: {', '.join(KINDS)}")
    return FamilyParams(**base)


def small_world(sample_size: int, kind: str, index: int) -> RandomWorld:
    """World (S, kind, index): Q = 50 queries, positives calibrated on S pilot distractors."""
    params = small_params(sample_size, kind, index)
    world = RandomWorld(
        _seed(sample_size, kind, index), QUERIES, MAX_POS, params=params, pilot=sample_size
    )
    world.name = world_key(sample_size, kind, index)
    return world


def small_pool(key: str, cache: str) -> dict:
    """The pool of world ``key`` streamed once (20·S distractors, a 5% sample), cached on disk."""
    from research.tail_pools import stream_world

    path = os.path.join(cache, f"{key}.pt")
    if os.path.exists(path):
        return torch.load(path)
    s, kind, index = parse_key(key)
    world = small_world(s, kind, index)
    seed = _seed(s, kind, index)
    g = torch.Generator().manual_seed(seed * 13 + 1)
    g_sample = torch.Generator().manual_seed(seed * 17 + 2)
    out = stream_world(world, int(round(s / RATE)), RATE, g, g_sample)
    os.makedirs(cache, exist_ok=True)
    torch.save(out, path + ".tmp")
    os.replace(path + ".tmp", path)
    return out


def make_split(seed: int = SPLIT_SEED) -> dict:
    """Per sample size and kind, a seeded half of the worlds to design, the rest held out."""
    g = torch.Generator().manual_seed(seed)
    design, held_out = [], []
    for s in SIZES:
        for kind in KINDS:
            perm = torch.randperm(PER_KIND, generator=g).tolist()
            design += [world_key(s, kind, i) for i in sorted(perm[: PER_KIND // 2])]
            held_out += [world_key(s, kind, i) for i in sorted(perm[PER_KIND // 2 :])]
    return {"seed": seed, "design": design, "held_out": held_out}


def parse_key(key: str) -> tuple[int, str, int]:
    """(S, kind, index) of a world key such as ``cone3-S20k``."""
    head, size = key.split("-S")
    kind = head.rstrip("0123456789")
    return int(size.rstrip("k")) * 1000, kind, int(head[len(kind) :])


def load_small_split(path: str = SMALL_SPLIT_PATH) -> dict:
    with open(path) as f:
        return json.load(f)


def describe_small(key: str) -> dict:
    s, kind, index = parse_key(key)
    return {"key": key, "S": s, "kind": kind, **dataclasses.asdict(small_params(s, kind, index))}


def main(argv: list[str] | None = None) -> int:
    import argparse
    import time

    from research.tail_pools import true_map

    p = argparse.ArgumentParser(description="stream the small-sample worlds' pools once")
    p.add_argument("--cache", default="/tmp/tailsmall")
    p.add_argument("--keys", default=None, help="comma-separated world keys (default: all)")
    args = p.parse_args(argv)
    split = load_small_split()
    keys = args.keys.split(",") if args.keys else split["design"] + split["held_out"]
    for key in keys:
        t0 = time.perf_counter()
        data = small_pool(key, args.cache)
        print(
            f"{key:>16}: S = {data['sample'].shape[1]}, true mAP@{K} = "
            f"{true_map(data, K):.4f} ({time.perf_counter() - t0:.1f} s)",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    import sys

    if sys.argv[1:2] != ["--split"]:
        raise SystemExit(main())
    with open(SMALL_SPLIT_PATH, "w") as f:
        json.dump(make_split(), f, indent=1)
        f.write("\n")
    print(SMALL_SPLIT_PATH)
