"""A generator of world *families* for judging tail extrapolation on designs it never saw.

A family is a generative mechanism with its own ranges of design parameters;
a world is one seeded draw from a family at a sample size S and a pool size
N = S · (N/S). Estimators are chosen on the design families and reported on
the held-out ones (``tail_gen_split.json``, drawn with a fixed seed before any
estimator ran on these worlds), so a held-out figure says how a rule does on
mechanisms nobody tuned it on, not on new draws of a known mechanism.

Embedding families (queries and distractors are vectors; the distractors are
shared by all queries, so the sample's noise is shared too; d = 8–512):

- ``clusters_cos``: Gaussian clusters (2–2,000, Dirichlet weights), cosine;
- ``zipf_inner``: Zipf-weighted clusters, inner products of vectors with
  log-normal norms (unbounded scores);
- ``heavy_inner``: Student-t clusters (ν = 2.5–6), inner products;
- ``cone_aniso``: a few broad clusters in a cone with a power-law spectrum, cosine;
- ``hier_junk``: a 2–3 level hierarchy plus 5–30% broad junk, cosine;
- ``confusers``: noisy copies of the queries at the positives' distance,
  0.1–3 expected per query in the sample, cosine;
- ``hubs``: 0.05–3% of the distractors are hubs near the queries' centroid
  direction (high for many queries at once), cosine or inner products;
- ``dup_groups``: the pool is made of near-duplicate groups of 2–100 items
  (a distractor's copies are all above or all below a positive), cosine.

Score-level families (each query's distractor scores are i.i.d. from a law
with a closed-form survival function; the pool count of each positive is
drawn exactly, so N reaches 10⁸ cheaply; queries do not share distractors):

- ``score_heavy``: Student-t scores, ν = 1.5–20 per query (ξ = 1/ν), unbounded;
- ``score_bounded``: 2·Beta(a, b) − 1 (b = 1.2–8: ξ = −1/b), declared cosine;
- ``score_bump``: a normal bulk plus a rare component (weight 10⁻⁵–10⁻³,
  2.5–6 sd above): a tail that changes shape below the sample's reach;
- ``score_laws``: each query its own law (Student-t, normal, logistic,
  Gumbel or Beta), unbounded.

Per world: Q = 40 queries with 1–6 positives, k ∈ {100, 1000}, S ∈ {5k, 10k,
100k}, N/S log-uniform in [10, 1000] (embedding families capped at N = 2·10⁶,
so N/S ≤ 20 at S = 100k). Positives: embedding worlds calibrate their noise
so that a drawn share (30–80%) of the positives beats every score of an
S-distractor pilot; score-level worlds draw each positive's hardness
log-uniformly in [0.02/N, 30/S] (most lie past the sample's maximum).

    PYTHONPATH=. python -m research.tail_gen --write-split      # rewrites tail_gen_split.json
    PYTHONPATH=. python -m research.tail_gen --cache /tmp/tailgen  # streams every world once
"""

from __future__ import annotations

import json
import math
import os
import time

import numpy as np
import torch

from research.tail_family import FamilyParams, RandomWorld

EMBEDDING_FAMILIES = (
    "clusters_cos", "zipf_inner", "heavy_inner", "cone_aniso",
    "hier_junk", "confusers", "hubs", "dup_groups",
)  # fmt: skip
SCORE_FAMILIES = ("score_heavy", "score_bounded", "score_bump", "score_laws")
FAMILIES = EMBEDDING_FAMILIES + SCORE_FAMILIES
SIZES = (5_000, 10_000, 100_000)
DRAWS = 2  # worlds per family and sample size
QUERIES = 40
MAX_POS = 6
RATIO = (10.0, 1000.0)
EMBEDDING_MAX_POOL = 2_000_000
SPLIT_SEED = 20261204
SPLIT_PATH = os.path.join(os.path.dirname(__file__), "tail_gen_split.json")


def world_key(family: str, sample_size: int, draw: int) -> str:
    return f"{family}-S{sample_size // 1000}k-{draw}"


def parse_key(key: str) -> tuple[str, int, int]:
    family, size, draw = key.rsplit("-", 2)
    return family, int(size[1:].rstrip("k")) * 1000, int(draw)


def _seed(family: str, sample_size: int, draw: int) -> int:
    return 1_000_003 * FAMILIES.index(family) + 7919 * SIZES.index(sample_size) + 31 * draw + 11


class _Draw:
    """Uniform and log-uniform draws from a seeded generator."""

    def __init__(self, seed: int) -> None:
        self.g = torch.Generator().manual_seed(seed)

    def u(self, lo: float, hi: float) -> float:
        return float(torch.empty(1, dtype=torch.float64).uniform_(lo, hi, generator=self.g))

    def logu(self, lo: float, hi: float) -> float:
        return math.exp(self.u(math.log(lo), math.log(hi)))

    def choice(self, options):
        return options[int(torch.randint(0, len(options), (1,), generator=self.g))]


def world_spec(key: str) -> dict:
    """The design of world ``key``: family, S, N, k, score range and the family's parameters."""
    family, s, draw = parse_key(key)
    if family not in FAMILIES or s not in SIZES:
        raise ValueError(f"unknown world {key!r}")
    d = _Draw(_seed(family, s, draw))
    ratio = d.logu(*RATIO)
    pool = int(round(s * ratio))
    if family in EMBEDDING_FAMILIES:
        pool = min(pool, EMBEDDING_MAX_POOL)
    spec = {"key": key, "family": family, "S": s, "N": pool, "k": d.choice((100, 1000))}
    spec["seed"] = _seed(family, s, draw)
    if family in EMBEDDING_FAMILIES:
        spec.update(_embedding_params(family, d))
    else:
        spec.update(_score_params(family, d))
    return spec


def _embedding_params(family: str, d: _Draw) -> dict:
    base = dict(
        dim=int(round(d.logu(8, 512))),
        n_clusters=int(round(d.logu(2, 2000))),
        weights="dirichlet",
        dirichlet_alpha=d.logu(0.1, 10.0),
        zipf_exponent=d.u(0.5, 1.5),
        spread=d.logu(0.2, 1.5),
        spread_sd=d.u(0.0, 1.0),
        spectrum=d.u(0.0, 0.5),
        cone=d.u(0.0, 1.0),
        depth=1,
        junk=0.0,
        heavy_share=0.0,
        nu=10.0,
        dup_rate=0.0,
        score="cosine",
        norm_sd=0.0,
        unreached=d.u(0.3, 0.8),
        query_spread=d.u(0.3, 1.5),
    )
    extra: dict = {}
    if family == "zipf_inner":
        base.update(weights="zipf", score="inner", norm_sd=d.u(0.1, 0.5))
    elif family == "heavy_inner":
        base.update(score="inner", heavy_share=d.u(0.5, 1.0), nu=d.u(2.5, 6.0),
                    norm_sd=d.u(0.0, 0.4))  # fmt: skip
    elif family == "cone_aniso":
        base.update(n_clusters=int(round(d.logu(1, 4))), spectrum=d.u(0.7, 2.0),
                    cone=d.u(1.0, 4.0), spread=d.logu(0.5, 1.5))  # fmt: skip
    elif family == "hier_junk":
        base.update(depth=int(round(d.u(2, 3))), junk=d.u(0.05, 0.3))
    elif family == "confusers":
        extra["confusers_in_sample"] = d.logu(0.1, 3.0)
    elif family == "hubs":
        base.update(score=d.choice(("cosine", "inner")), norm_sd=d.u(0.0, 0.3))
        extra.update(hub_rate=d.logu(5e-4, 3e-2), n_hubs=int(round(d.logu(1, 50))),
                     hub_pull=d.u(0.5, 2.0))  # fmt: skip
    elif family == "dup_groups":
        extra.update(group_size=int(round(d.logu(2, 100))), group_jitter=d.logu(1e-3, 0.1))
    return {"params": base, **extra}


def _score_params(family: str, d: _Draw) -> dict:
    if family == "score_heavy":
        return {"law": "t", "nu": (d.u(1.5, 4.0), d.u(5.0, 20.0)), "range": None}
    if family == "score_bounded":
        return {"law": "beta", "a": (1.0, d.u(2.0, 8.0)), "b": (d.u(1.2, 3.0), d.u(4.0, 8.0)),
                "range": [-1.0, 1.0]}  # fmt: skip
    if family == "score_bump":
        return {"law": "bump", "weight": (d.logu(1e-5, 1e-4), d.logu(2e-4, 1e-3)),
                "shift": (d.u(2.5, 4.0), d.u(4.0, 6.0)), "width": d.u(0.2, 1.0), "range": None}  # fmt: skip
    return {"law": "mixed", "range": None}


# --------------------------------------------------------------------- embedding worlds


class GenWorld(RandomWorld):
    """A :class:`RandomWorld` with the generator's extra mechanisms (hubs, duplicate groups)."""

    def __init__(self, spec: dict) -> None:
        self.spec = spec
        s = spec["S"]
        params = dict(spec["params"])
        if spec["family"] == "confusers":
            params["dup_rate"] = spec["confusers_in_sample"] / s
        super().__init__(spec["seed"], QUERIES, MAX_POS, params=FamilyParams(**params), pilot=s)
        self.name = spec["key"]
        if spec["family"] == "hubs":
            g = torch.Generator().manual_seed(spec["seed"] + 3)
            centre = self._zq.mean(0, keepdim=True)
            jitter = torch.randn(spec["n_hubs"], self.dim, generator=g) * self.axis
            self.hubs = centre * spec["hub_pull"] + 0.3 * float(self.centres.std()) * jitter

    def distractors(self, n: int, g: torch.Generator) -> torch.Tensor:
        spec = self.spec
        if spec.get("family") == "dup_groups":
            size = spec["group_size"]
            base = super().distractors(-(-n // size), g)
            items = base.repeat_interleave(size, 0)[:n]
            items = items + spec["group_jitter"] * items.norm(dim=1, keepdim=True) * torch.randn(
                items.shape, generator=g
            ) / math.sqrt(self.dim)
            items = items[torch.randperm(n, generator=g)]
            return torch.nn.functional.normalize(items, dim=1)
        out = super().distractors(n, g)
        if spec.get("family") == "hubs" and hasattr(self, "hubs"):
            hub = torch.rand(n, generator=g) < spec["hub_rate"]
            which = torch.randint(0, self.hubs.shape[0], (int(hub.sum()),), generator=g)
            z = self.hubs[which] + 0.05 * torch.randn(which.numel(), self.dim, generator=g)
            out[hub] = self._embed(z, g)
        return out


# --------------------------------------------------------------------- score-level worlds


def _laws(spec: dict, rng: np.random.Generator) -> list:
    """One scipy.stats frozen law per query."""
    from scipy import stats

    law = spec["law"]
    out = []
    for _ in range(QUERIES):
        if law == "t":
            out.append(
                stats.t(rng.uniform(*spec["nu"]), loc=rng.normal(0, 1), scale=rng.lognormal(0, 0.5))
            )
        elif law == "beta":
            a, b = rng.uniform(*spec["a"]), rng.uniform(*spec["b"])
            out.append(stats.beta(a, b, loc=-1.0, scale=2.0))
        elif law == "bump":
            out.append(
                _Bump(rng.uniform(*spec["weight"]), rng.uniform(*spec["shift"]), spec["width"])
            )
        else:
            kind = rng.choice(["t", "norm", "logistic", "gumbel", "beta"])
            if kind == "t":
                out.append(stats.t(rng.uniform(2.0, 15.0)))
            elif kind == "norm":
                out.append(stats.norm(rng.normal(0, 1), rng.lognormal(0, 0.5)))
            elif kind == "logistic":
                out.append(stats.logistic(0.0, rng.lognormal(0, 0.5)))
            elif kind == "gumbel":
                out.append(stats.gumbel_r(0.0, rng.lognormal(0, 0.5)))
            else:
                out.append(stats.beta(rng.uniform(1, 5), rng.uniform(1.2, 6), loc=-1.0, scale=2.0))
    return out


class _Bump:
    """Standard normal bulk plus a rare normal component ``shift`` sd above (weight ``w``)."""

    def __init__(self, w: float, shift: float, width: float) -> None:
        self.w, self.shift, self.width = w, shift, width

    def sf(self, x):
        from scipy.stats import norm

        return (1 - self.w) * norm.sf(x) + self.w * norm.sf((x - self.shift) / self.width)

    def isf(self, q):
        q = np.asarray(q, dtype=np.float64)
        lo, hi = np.full_like(q, -10.0), np.full_like(q, 60.0)
        for _ in range(200):
            mid = 0.5 * (lo + hi)
            above = self.sf(mid) > q
            lo, hi = np.where(above, mid, lo), np.where(above, hi, mid)
        return 0.5 * (lo + hi)

    def rvs(self, size, random_state):
        rare = random_state.random(size) < self.w
        z = random_state.standard_normal(size)
        return np.where(rare, self.shift + self.width * z, z)


def score_world(spec: dict) -> dict:
    """The stream dict of a score-level world: its sample and the pool's exact counts."""
    rng = np.random.default_rng(spec["seed"])
    s, pool = spec["S"], spec["N"]
    laws = _laws(spec, rng)
    pos = np.full((QUERIES, MAX_POS), np.nan)
    counts = np.zeros((QUERIES, MAX_POS))
    sample = np.empty((QUERIES, s), dtype=np.float32)
    lo, hi = math.log(0.02 / pool), math.log(30.0 / s)
    for q, law in enumerate(laws):
        m = int(rng.integers(1, MAX_POS + 1))
        x = np.sort(np.exp(rng.uniform(lo, hi, m)))  # hardness, easiest first
        scores = law.isf(x)
        draws = np.asarray(law.rvs(size=s, random_state=rng), dtype=np.float64)
        if spec["range"] is not None:
            scores, draws = np.clip(scores, -1, 1), np.clip(draws, -1, 1)
        sample[q] = draws.astype(np.float32)
        # Float32 scores as the estimators see them; the exact survival of those values.
        s32 = scores.astype(np.float32).astype(np.float64)
        x32 = np.asarray(law.sf(s32), dtype=np.float64)
        in_sample = (sample[q][None, :].astype(np.float64) >= s32[:, None]).sum(1)
        # The rest of the pool (N − S items): nested binomial counts between the positives.
        rest, below, cum = pool - s, 0.0, 0
        others = np.zeros(m)
        for i in range(m):
            p = (x32[i] - below) / max(1.0 - below, 1e-300)
            c = rng.binomial(rest, min(max(p, 0.0), 1.0))
            rest, cum, below = rest - c, cum + c, x32[i]
            others[i] = cum
        pos[q, :m] = s32
        counts[q, :m] = in_sample + others
    return {
        "pos_scores": torch.from_numpy(pos),
        "sample": torch.from_numpy(sample),
        "pool_counts": torch.from_numpy(counts),
        "pool": pool,
    }


# --------------------------------------------------------------------- streaming, cache, split


def stream(key: str) -> dict:
    """{"pos_scores", "sample" (Q, ≈S), "pool_counts", "pool", "spec", "seconds"} of world ``key``."""
    from research.tail_pools import stream_world

    spec = world_spec(key)
    t0 = time.perf_counter()
    if spec["family"] in SCORE_FAMILIES:
        out = score_world(spec)
    else:
        world = GenWorld(spec)
        g = torch.Generator().manual_seed(spec["seed"] * 13 + 1)
        g_sample = torch.Generator().manual_seed(spec["seed"] * 17 + 2)
        out = stream_world(world, spec["N"], spec["S"] / spec["N"], g, g_sample)
        out["score_range"] = [-1.0, 1.0] if spec["params"]["score"] == "cosine" else None
    if spec["family"] in SCORE_FAMILIES:
        out["score_range"] = spec["range"]
    out["spec"] = spec
    out["seconds"] = time.perf_counter() - t0
    return out


def cached(key: str, cache: str) -> dict:
    path = os.path.join(cache, f"{key}.pt")
    if os.path.exists(path):
        return torch.load(path, weights_only=False)
    out = stream(key)
    os.makedirs(cache, exist_ok=True)
    torch.save(out, path + ".tmp")
    os.replace(path + ".tmp", path)
    return out


def all_keys() -> list[str]:
    return [world_key(f, s, i) for f in FAMILIES for s in SIZES for i in range(DRAWS)]


def make_split(seed: int = SPLIT_SEED) -> dict:
    """Half the embedding and half the score-level families to design, the rest held out."""
    g = torch.Generator().manual_seed(seed)
    design, held_out = [], []
    for group in (EMBEDDING_FAMILIES, SCORE_FAMILIES):
        perm = torch.randperm(len(group), generator=g).tolist()
        design += sorted(group[i] for i in perm[: len(group) // 2])
        held_out += sorted(group[i] for i in perm[len(group) // 2 :])
    return {"seed": seed, "design": design, "held_out": held_out}


def load_split(path: str = SPLIT_PATH) -> dict:
    with open(path) as f:
        return json.load(f)


def split_keys(part: str) -> list[str]:
    families = set(load_split()[part])
    return [k for k in all_keys() if parse_key(k)[0] in families]


def main(argv: list[str] | None = None) -> int:
    import argparse

    from research.tail_pools import true_map

    p = argparse.ArgumentParser(description="stream the generated worlds once")
    p.add_argument("--cache", default="/tmp/tailgen")
    p.add_argument("--split", dest="part", choices=("design", "held_out"), default=None)
    p.add_argument("--keys", default=None)
    args = p.parse_args(argv)
    keys = (
        args.keys.split(",") if args.keys else (split_keys(args.part) if args.part else all_keys())
    )
    for key in keys:
        t0 = time.perf_counter()
        data = cached(key, args.cache)
        spec = data["spec"]
        print(
            f"{key:>22}: S = {data['sample'].shape[1]}, N = {spec['N']}, k = {spec['k']}, "
            f"truth {true_map(data, spec['k']):.4f} ({time.perf_counter() - t0:.1f} s)",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["--write-split"]:
        with open(SPLIT_PATH, "w") as f:
            json.dump(make_split(), f, indent=1)
            f.write("\n")
        print(SPLIT_PATH)
    else:
        raise SystemExit(main())
