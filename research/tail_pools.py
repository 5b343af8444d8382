"""Stream a family world's distractor pool once: the truth at N and a random sample's scores.

For world ``i`` of ``research.tail_family`` a pool of N distractors is drawn
block by block (never held whole). Per query we count, for every positive,
the pool distractors scoring ≥ it (pessimistic ties): the realized mAP@k at N
is exact from these counts. Each pool item joins the sample with probability
``rate`` (an i.i.d. Bernoulli draw from its own generator), and the sample's
full (Q, S) score matrix is kept, its columns in pool order (which is random:
the pool is i.i.d.). States are cached on disk, so estimator runs re-use them.

    nice -n 19 env OMP_NUM_THREADS=1 .venv/bin/python -m research.tail_pools --cache /tmp/tailfam
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from research.tail_family import N_WORLDS, family_world, world_name
from rl_gap.metrics.tail.rank_law import ap_at_k_from_counts, sort_positives

POOL = 400_000
RATE = 0.05
QUERIES = 100
MAX_POS = 6
K = 1000


def stream_pool(
    world_id: int,
    pool: int = POOL,
    rate: float = RATE,
    n_queries: int = QUERIES,
    seed: int = 0,
    block: int = 32768,
) -> dict:
    """{"pos_scores", "sample" (Q, S) float32, "pool_counts" (Q, m), "pool", "seconds"}."""
    world = family_world(world_id, n_queries, MAX_POS, seed)
    g = torch.Generator().manual_seed(seed * 104729 + world_id * 31 + 17)
    g_sample = torch.Generator().manual_seed(seed * 7 + world_id * 1009 + 3)
    return stream_world(world, pool, rate, g, g_sample, block)


def stream_world(
    world, pool: int, rate: float, g: torch.Generator, g_sample: torch.Generator, block: int = 32768
) -> dict:
    """:func:`stream_pool` for a world object (``queries``, ``pos_scores``, ``distractors``)."""
    pos = world.pos_scores
    valid = ~torch.isnan(pos)
    probe = torch.where(valid, pos, torch.full_like(pos, float("inf"))).float()
    counts = torch.zeros(pos.shape, dtype=torch.float64)
    parts = []
    t0 = time.perf_counter()
    for start in range(0, pool, block):
        n = min(block, pool - start)
        scores = world.queries @ world.distractors(n, g).T  # (Q, n)
        counts += (scores.unsqueeze(-1) >= probe.unsqueeze(1)).sum(1).double()
        keep = torch.rand(n, generator=g_sample) < rate
        parts.append(scores[:, keep].clone())
    return {
        "pos_scores": pos,
        "sample": torch.cat(parts, 1),
        "pool_counts": counts,
        "pool": pool,
        "seconds": time.perf_counter() - t0,
    }


def cached_pool(world_id: int, cache: str, pool: int = POOL, rate: float = RATE, seed: int = 0):
    """:func:`stream_pool`, or its result saved under ``cache`` by an earlier run."""
    path = os.path.join(cache, f"{world_name(world_id)}-q{QUERIES}-n{pool}-r{rate}-s{seed}.pt")
    if os.path.exists(path):
        return torch.load(path)
    out = stream_pool(world_id, pool, rate, QUERIES, seed)
    os.makedirs(cache, exist_ok=True)
    torch.save(out, path + ".tmp")
    os.replace(path + ".tmp", path)
    return out


def sorted_pool_counts(data: dict) -> torch.Tensor:
    """(Q, m) pool counts in the order of ``sort_positives`` (descending scores, padding last)."""
    pos = data["pos_scores"]
    keyed = torch.where(torch.isnan(pos), torch.full_like(pos, -torch.inf), pos)
    order = torch.argsort(keyed, dim=1, descending=True, stable=True)
    return data["pool_counts"].gather(1, order)


def true_map(data: dict, k: int = K) -> float:
    """Realized mAP@k of the pool (mean over queries with a positive)."""
    _, valid, j = sort_positives(data["pos_scores"])
    counts = torch.where(valid, sorted_pool_counts(data), torch.zeros_like(j))
    ap = ap_at_k_from_counts(j, valid, counts, k)
    return float(ap[~torch.isnan(ap)].mean())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cache", default="/tmp/tailfam")
    p.add_argument("--ids", default=None, help="comma-separated world ids (default: all)")
    p.add_argument("--pool", type=int, default=POOL)
    args = p.parse_args(argv)
    ids = [int(i) for i in args.ids.split(",")] if args.ids else list(range(N_WORLDS))
    for i in ids:
        t0 = time.perf_counter()
        data = cached_pool(i, args.cache, args.pool)
        print(
            f"{world_name(i):>16}: S = {data['sample'].shape[1]}, true mAP@{K} = "
            f"{true_map(data):.4f} ({time.perf_counter() - t0:.1f} s)",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
