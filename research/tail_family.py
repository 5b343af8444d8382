"""A broad, seeded family of synthetic retrieval worlds for validating tail extrapolation.

The six worlds of ``research.tail_worlds`` are the geometries the
estimators were designed on. This family draws many more worlds with their
parameters taken at random from wide ranges, so that an estimator can be
chosen on some worlds and judged on others it never saw:

- dimension d (16–128, log-uniform);
- number of clusters (1–1,000, log-uniform) and their weights (Dirichlet with
  a concentration of 0.1–10, or Zipf with an exponent of 0.5–1.5);
- cluster tightness: a base spread (0.15–1.5) and a per-cluster log-normal spread;
- anisotropy: a power-law spectrum of the per-dimension scales (exponent
  0–1.5) and a cone (a common mean offset of 0–3 before normalisation);
- hierarchy depth (1–3 levels of centres, each level a fraction of its
  parent's spread);
- background junk share (0–30% broad isotropic distractors);
- heavy-tailed components (a share of clusters with Student-t noise, ν 2.5–10);
- near-duplicates (with probability 0.3, noisy copies of the queries at a
  per-query rate of 1e-6–1e-4 of the pool);
- scores: cosine (unit vectors, bounded) or inner product of unnormalised
  vectors (unbounded; item norms log-normal).

Queries are cluster members; each has 1..``max_pos`` positives, noisy copies
of the query in the latent space at a per-query noise scale. The noise scale's
common factor is set by bisection so that a given share (30–80%, drawn) of the
positives beats all of a 20,000-distractor pilot sample: the worlds then sit
in the regime the extrapolation is for (many positives the sample never
reaches), whatever their geometry. Every world is a deterministic function of
its id (``family_world(i)``): ids 0–5 are the six ``tail_simulate`` worlds.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

from research.tail_worlds import WORLDS, World

#: Worlds of the family: the six ``tail_simulate`` worlds (ids 0–5) and random draws.
N_RANDOM = 60
N_WORLDS = len(WORLDS) + N_RANDOM
PILOT = 20_000

#: Parameter ranges of the random draws (validated by tests/test_tail_family.py).
RANGES = {
    "dim": (16, 128),
    "n_clusters": (1, 1000),
    "dirichlet_alpha": (0.1, 10.0),
    "zipf_exponent": (0.5, 1.5),
    "spread": (0.15, 1.5),
    "spread_sd": (0.0, 1.0),
    "spectrum": (0.0, 1.5),
    "cone": (0.0, 3.0),
    "depth": (1, 3),
    "junk": (0.0, 0.3),
    "heavy_share": (0.0, 1.0),
    "nu": (2.5, 10.0),
    "dup_rate": (1e-6, 1e-4),
    "norm_sd": (0.0, 0.5),
    "unreached": (0.3, 0.8),
    "query_spread": (0.3, 1.5),
}


@dataclass(frozen=True)
class FamilyParams:
    """The drawn parameters of one random world (see the module docstring)."""

    dim: int
    n_clusters: int
    weights: str  # "dirichlet" or "zipf"
    dirichlet_alpha: float
    zipf_exponent: float
    spread: float
    spread_sd: float
    spectrum: float
    cone: float
    depth: int
    junk: float
    heavy_share: float
    nu: float
    dup_rate: float  # 0 = no near-duplicates
    score: str  # "cosine" or "inner"
    norm_sd: float
    unreached: float  # target share of positives above the whole pilot sample
    query_spread: float  # half-width of the per-query log noise scale


def _u(g: torch.Generator, lo: float, hi: float) -> float:
    return float(torch.empty(1, dtype=torch.float64).uniform_(lo, hi, generator=g))


def _logu(g: torch.Generator, lo: float, hi: float) -> float:
    return math.exp(_u(g, math.log(lo), math.log(hi)))


def draw_params(world_id: int) -> FamilyParams:
    """Parameters of random world ``world_id`` (≥ 6), a deterministic function of the id."""
    g = torch.Generator().manual_seed(1_000_003 * world_id + 12345)
    r = RANGES
    return FamilyParams(
        dim=int(round(_logu(g, *r["dim"]))),
        n_clusters=int(round(_logu(g, *r["n_clusters"]))),
        weights="dirichlet" if _u(g, 0, 1) < 0.5 else "zipf",
        dirichlet_alpha=_logu(g, *r["dirichlet_alpha"]),
        zipf_exponent=_u(g, *r["zipf_exponent"]),
        spread=_logu(g, *r["spread"]),
        spread_sd=_u(g, *r["spread_sd"]),
        spectrum=_u(g, *r["spectrum"]),
        cone=_u(g, *r["cone"]),
        depth=int(torch.randint(r["depth"][0], r["depth"][1] + 1, (1,), generator=g)),
        junk=_u(g, *r["junk"]) if _u(g, 0, 1) < 0.6 else 0.0,
        heavy_share=_u(g, *r["heavy_share"]) if _u(g, 0, 1) < 0.5 else 0.0,
        nu=_u(g, *r["nu"]),
        dup_rate=_logu(g, *r["dup_rate"]) if _u(g, 0, 1) < 0.3 else 0.0,
        score="cosine" if _u(g, 0, 1) < 0.65 else "inner",
        norm_sd=_u(g, *r["norm_sd"]),
        unreached=_u(g, *r["unreached"]),
        query_spread=_u(g, *r["query_spread"]),
    )


class RandomWorld:
    """A world drawn from :class:`FamilyParams`, with the ``tail_simulate.World`` interface.

    ``params`` replaces the drawn parameters (other world families reuse the
    generator); ``pilot`` is the size of the sample the positives are calibrated on.

    Attributes:
        queries: (Q, d) query embeddings; the score of a distractor x is ``queries @ x``.
        pos_scores: (Q, max_pos) float64 positive scores, NaN-padded.
    """

    def __init__(
        self,
        world_id: int,
        n_queries: int = 100,
        max_pos: int = 6,
        params: FamilyParams | None = None,
        pilot: int = PILOT,
    ) -> None:
        if params is None and (world_id < len(WORLDS) or world_id >= N_WORLDS):
            raise ValueError(f"random world ids are {len(WORLDS)}..{N_WORLDS - 1}, got {world_id}")
        self.name = f"w{world_id:02d}"
        self.params = p = params or draw_params(world_id)
        g = torch.Generator().manual_seed(7_654_321 * world_id + 99)
        d, C = p.dim, p.n_clusters
        self.dim = d
        self.axis = torch.arange(1, d + 1, dtype=torch.float32) ** (-p.spectrum)
        self.axis = self.axis / self.axis.pow(2).mean().sqrt()
        self.offset = torch.nn.functional.normalize(torch.randn(d, generator=g), dim=0) * p.cone
        # Hierarchy: each level's centres spread around their parent, narrowing by 0.4 per level.
        branch = max(1, int(math.ceil(C ** (1.0 / p.depth))))
        centres = torch.zeros(1, d)
        scale = 1.0
        for level in range(p.depth):
            n_next = C if level == p.depth - 1 else min(C, centres.shape[0] * branch)
            parent = torch.randint(0, centres.shape[0], (n_next,), generator=g)
            centres = centres[parent] + scale * torch.randn(n_next, d, generator=g) * self.axis
            scale *= 0.4
        self.centres = centres
        if p.weights == "dirichlet":
            w = torch._sample_dirichlet(torch.full((C,), p.dirichlet_alpha, dtype=torch.float64), g)
        else:
            w = 1.0 / torch.arange(1, C + 1, dtype=torch.float64) ** p.zipf_exponent
        self.weights = (w + 1e-12) / (w + 1e-12).sum()
        self.spreads = p.spread * torch.exp(p.spread_sd * torch.randn(C, generator=g))
        self.heavy = torch.rand(C, generator=g) < p.heavy_share
        Q, m = n_queries, max_pos
        n_pos = torch.randint(1, m + 1, (Q,), generator=g)
        cq = torch.multinomial(self.weights, Q, replacement=True, generator=g)
        zq = self._members(cq, g)
        self.queries = self._embed(zq, g)
        # Positives: the query's latent point plus cluster-shaped noise at a per-query scale.
        noise = self._noise(cq.repeat_interleave(m), g).reshape(Q, m, d)
        rel = torch.exp(torch.empty(Q, 1, 1).uniform_(-p.query_spread, p.query_spread, generator=g))
        pos_norm = torch.exp(p.norm_sd * torch.randn(Q, m, 1, generator=g))
        self._zq, self._noise_pos, self._rel, self._pos_norm = zq, noise, rel, pos_norm
        # The pilot runs without near-duplicates: their noise scale is the one being calibrated.
        self.dup_rate = 0.0
        pilot = self.distractors(pilot, torch.Generator().manual_seed(world_id + 555))
        pilot_scores = self.queries @ pilot.T
        valid = torch.arange(m).unsqueeze(0) < n_pos.unsqueeze(1)
        pilot_max = pilot_scores.max(1).values
        self.norm_boost = 1.0
        if p.score == "inner":
            # Unbounded scores: positives need norms the distractors' norms do not swamp,
            # so first scale their norms until almost all noiseless positives top the pilot.
            self.norm_boost = self._calibrate(
                lambda b: self._positive_scores(1e-3, b), pilot_max, valid, 0.97, (0.0, 3.0)
            )
        self.noise_scale = self._calibrate(
            lambda t: self._positive_scores(t, self.norm_boost),
            pilot_max,
            valid,
            p.unreached,
            (-7.0, 4.6),
        )
        scores = self._positive_scores(self.noise_scale, self.norm_boost)
        self.dup_rate = p.dup_rate * Q
        self.pos_scores = scores.double().masked_fill(~valid, math.nan)

    def _noise(self, cls: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        eps = torch.randn(cls.numel(), self.dim, generator=g)
        heavy = self.heavy[cls]
        if bool(heavy.any()):
            nu = self.params.nu
            chi2 = 2.0 * torch._standard_gamma(
                torch.full((int(heavy.sum()), 1), nu / 2.0), generator=g
            )
            # Scaled so the Student-t noise has unit variance per axis (ν > 2).
            eps[heavy] = eps[heavy] / torch.sqrt(chi2 / nu) * math.sqrt((nu - 2.0) / nu)
        return eps * self.axis

    def _members(self, cls: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        return self.centres[cls] + self.spreads[cls].unsqueeze(1) * self._noise(cls, g)

    def _embed(self, z: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        z = z + self.offset
        if self.params.score == "cosine":
            return torch.nn.functional.normalize(z, dim=1)
        norms = torch.exp(self.params.norm_sd * torch.randn(z.shape[0], 1, generator=g))
        return torch.nn.functional.normalize(z, dim=1) * norms

    def _positive_scores(self, scale: float, boost: float = 1.0) -> torch.Tensor:
        Q, m, d = self._noise_pos.shape
        z = self._zq.unsqueeze(1) + scale * self._rel * self._noise_pos + self.offset
        emb = torch.nn.functional.normalize(z, dim=-1)
        if self.params.score == "inner":
            emb = emb * self._pos_norm * boost
        return (emb * self.queries.unsqueeze(1)).sum(-1)

    @staticmethod
    def _calibrate(scores_at, pilot_max, valid, target: float, log_range) -> float:
        """exp(t) in ``log_range`` at which a share ``target`` of the positives tops the pilot.

        ``scores_at(v)`` gives the positive scores at value v; the share falls with the
        noise scale and rises with the norm boost (the bisection direction follows).
        """
        lo, hi = log_range

        def share(t: float) -> float:
            return float(((scores_at(math.exp(t)) > pilot_max.unsqueeze(1)) & valid).sum())

        rising = share(hi) > share(lo)
        for _ in range(30):
            mid = 0.5 * (lo + hi)
            if (share(mid) / float(valid.sum()) > target) != rising:
                lo = mid
            else:
                hi = mid
        return math.exp(0.5 * (lo + hi))

    def distractors(self, n: int, g: torch.Generator) -> torch.Tensor:
        """(n, d) float32 distractor embeddings, i.i.d. given the world."""
        p = self.params
        cls = torch.multinomial(self.weights, n, replacement=True, generator=g)
        z = self._members(cls, g)
        if p.junk > 0:
            junk = torch.rand(n, generator=g) < p.junk
            broad = float(self.centres.std()) + p.spread
            z[junk] = broad * torch.randn(int(junk.sum()), self.dim, generator=g)
        if self.dup_rate > 0:
            dup = torch.rand(n, generator=g) < self.dup_rate
            owner = torch.randint(0, self._zq.shape[0], (int(dup.sum()),), generator=g)
            tau = torch.empty(owner.numel(), 1).uniform_(0.6, 1.6, generator=g)
            z[dup] = self._zq[owner] + tau * self.noise_scale * self._noise(
                torch.zeros_like(owner), g
            )
        return self._embed(z, g)


def family_world(world_id: int, n_queries: int = 100, max_pos: int = 6, seed: int = 0):
    """World ``world_id`` of the family: 0–5 the ``tail_simulate`` worlds, then random draws."""
    if not 0 <= world_id < N_WORLDS:
        raise ValueError(f"world ids are 0..{N_WORLDS - 1}, got {world_id}")
    if world_id < len(WORLDS):
        return World(WORLDS[world_id], n_queries, max_pos, seed)
    return RandomWorld(world_id, n_queries, max_pos)


def world_name(world_id: int) -> str:
    return WORLDS[world_id] if world_id < len(WORLDS) else f"w{world_id:02d}"


def describe(world_id: int) -> dict:
    """JSON-friendly parameters of a world (the six fixed worlds: their name only)."""
    if world_id < len(WORLDS):
        return {"id": world_id, "name": WORLDS[world_id], "fixed": True}
    return {"id": world_id, "name": world_name(world_id), **asdict(draw_params(world_id))}
