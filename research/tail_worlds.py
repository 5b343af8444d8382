"""Seeded synthetic retrieval worlds for validating tail extrapolation.

Each world draws Q queries with 1..``max_pos`` positives (their scores fixed
up front) and an endless stream of i.i.d. distractor embeddings; the score of
a distractor is its inner product with the query. ``research/validate_tail.py``
streams a large pool from a world, keeps the exact top-k of the pool (the
truth) and the top scores of a hashed random sample (the estimators' input).

The worlds differ in the shape of the upper tail of each query's distractor
scores, which is what the estimators extrapolate:

- ``isotropic``: unit vectors, uniform directions in d = 32 (smooth bounded tail);
- ``lowdim``: the same in d = 8 (strongly bounded: ξ near −2/(d − 1));
- ``mixture``: anisotropic Gaussian mixture (Zipf-weighted components with
  per-dimension scales) through a random linear map, L2-normalised;
- ``student_t``: un-normalised inner products with multivariate Student-t
  (ν = 4) distractors: heavy upper tails (ξ = 1/ν > 0);
- ``hierarchical``: superclass → class → item; the distractors of the query's
  own superclass form a second, higher population in the upper tail;
- ``near_duplicates``: isotropic plus a small rate of noisy copies of the
  queries, a bump above the bulk that the sample sees only a few times.

Positive difficulty is heterogeneous: a per-query noise scale drawn
log-uniformly (fixed ranges, chosen so that mAP@1000 at 2M distractors lies
in a moderate range; never tuned to an estimator).
"""

from __future__ import annotations

import math

import torch

WORLDS = ("isotropic", "lowdim", "mixture", "student_t", "hierarchical", "near_duplicates")

#: Fraction of the pool that is a noisy copy of one given query (``near_duplicates``).
DUPLICATES_PER_QUERY = 5e-5


def _unit(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.normalize(x, dim=1)


def _log_uniform(n: int, lo: float, hi: float, g: torch.Generator) -> torch.Tensor:
    return torch.exp(torch.empty(n).uniform_(math.log(lo), math.log(hi), generator=g))


def _pad_scores(scores: torch.Tensor, n_pos: torch.Tensor) -> torch.Tensor:
    mask = torch.arange(scores.shape[1]).unsqueeze(0) < n_pos.unsqueeze(1)
    return scores.double().masked_fill(~mask, math.nan)


class World:
    """A synthetic world: queries with positive scores and a distractor stream.

    Args:
        name: one of :data:`WORLDS`.
        n_queries: Q.
        max_pos: positives per query are uniform in 1..max_pos.
        seed: seeds the world, the queries and their positives.
    """

    def __init__(self, name: str, n_queries: int = 200, max_pos: int = 6, seed: int = 0) -> None:
        if name not in WORLDS:
            raise ValueError(f"unknown world {name!r}; known: {', '.join(WORLDS)}")
        self.name = name
        g = torch.Generator().manual_seed(seed * 7919 + WORLDS.index(name))
        self.g = g
        n_pos = torch.randint(1, max_pos + 1, (n_queries,), generator=g)
        self.dim = 8 if name == "lowdim" else 32
        d, Q, m = self.dim, n_queries, max_pos
        if name in ("isotropic", "lowdim", "near_duplicates"):
            self.queries = _unit(torch.randn(Q, d, generator=g))
            # Cosine ≈ 1/sqrt(1 + τ²) in high dimension; per-query τ sets the difficulty.
            lo, hi = (0.06, 0.3) if name == "lowdim" else (0.55, 1.25)
            tau = _log_uniform(Q, lo, hi, g).view(Q, 1, 1)
            noise = torch.randn(Q, m, d, generator=g) / math.sqrt(d)
            pos = _unit((self.queries.unsqueeze(1) + tau * noise).reshape(-1, d)).reshape(Q, m, d)
            scores = (pos * self.queries.unsqueeze(1)).sum(-1)
            # Near-duplicates: ~100 per query in a 2M pool (≈ 5 in a 5% sample),
            # whatever the number of queries (the rate is per query).
            self.dup_rate = DUPLICATES_PER_QUERY * Q if name == "near_duplicates" else 0.0
            if self.dup_rate > 1.0:
                raise ValueError(
                    f"near_duplicates supports at most {int(1 / DUPLICATES_PER_QUERY)} queries"
                )
        elif name == "mixture":
            latent, n_comp = 48, 64
            self.centers = torch.randn(n_comp, latent, generator=g)
            self.scales = torch.exp(0.5 * torch.randn(n_comp, latent, generator=g)) * 0.6
            zipf = 1.0 / torch.arange(1, n_comp + 1, dtype=torch.float64) ** 0.8
            self.weights = zipf / zipf.sum()
            col = torch.exp(0.4 * torch.randn(latent, generator=g))
            self.encoder = torch.randn(latent, d, generator=g) * col.unsqueeze(1)
            zq = self._mixture_latent(Q, g)
            tau = _log_uniform(Q, 0.15, 0.9, g).view(Q, 1, 1)
            zp = zq.unsqueeze(1) + tau * torch.randn(Q, m, latent, generator=g)
            self.queries = _unit(zq @ self.encoder)
            pos = _unit(zp.reshape(-1, latent) @ self.encoder).reshape(Q, m, d)
            scores = (pos * self.queries.unsqueeze(1)).sum(-1)
        elif name == "student_t":
            self.nu = 4.0
            self.axis_scale = torch.exp(0.5 * torch.randn(d, generator=g))
            self.queries = _unit(torch.randn(Q, d, generator=g))
            # A positive is the query direction pushed out by κ, plus a distractor-like draw.
            kappa = _log_uniform(Q, 8.0, 60.0, g).view(Q, 1)
            draws = self._student(Q * m, g).reshape(Q, m, d)
            scores = kappa + (draws * self.queries.unsqueeze(1)).sum(-1)
        else:  # hierarchical
            n_super, n_class = 16, 64
            self.super_centers = torch.randn(n_super, d, generator=g) * 1.6
            self.class_centers = self.super_centers.repeat_interleave(n_class, 0) + torch.randn(
                n_super * n_class, d, generator=g
            )
            self.class_spread = _log_uniform(n_super * n_class, 0.5, 1.1, g)
            # Queries use the first half of each superclass's classes, distractors the second.
            half = torch.arange(n_super * n_class) % n_class < n_class // 2
            self.query_classes = half.nonzero().squeeze(1)
            self.distractor_classes = (~half).nonzero().squeeze(1)
            cls = self.query_classes[
                torch.randint(0, self.query_classes.numel(), (Q,), generator=g)
            ]
            self.queries = _unit(self._items(cls, g))
            pos = _unit(self._items(cls.repeat_interleave(m), g)).reshape(Q, m, d)
            scores = (pos * self.queries.unsqueeze(1)).sum(-1)
        self.pos_scores = _pad_scores(scores, n_pos)

    def _mixture_latent(self, n: int, g: torch.Generator) -> torch.Tensor:
        comp = torch.multinomial(self.weights, n, replacement=True, generator=g)
        eps = torch.randn(n, self.centers.shape[1], generator=g)
        return self.centers[comp] + self.scales[comp] * eps

    def _student(self, n: int, g: torch.Generator) -> torch.Tensor:
        z = torch.randn(n, self.dim, generator=g) * self.axis_scale
        chi2 = 2.0 * torch._standard_gamma(torch.full((n, 1), self.nu / 2.0), generator=g)
        return z / torch.sqrt(chi2 / self.nu)

    def _items(self, cls: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        eps = torch.randn(cls.numel(), self.dim, generator=g)
        return self.class_centers[cls] + self.class_spread[cls].unsqueeze(1) * eps

    def distractors(self, n: int, g: torch.Generator) -> torch.Tensor:
        """(n, d) float32 distractor embeddings, i.i.d. given the world."""
        if self.name in ("isotropic", "lowdim", "near_duplicates"):
            x = _unit(torch.randn(n, self.dim, generator=g))
            if self.dup_rate > 0:
                dup = torch.rand(n, generator=g) < self.dup_rate
                n_dup = int(dup.sum())
                owner = torch.randint(0, self.queries.shape[0], (n_dup,), generator=g)
                tau = torch.empty(n_dup, 1).uniform_(0.6, 1.6, generator=g)
                noise = torch.randn(n_dup, self.dim, generator=g) / math.sqrt(self.dim)
                x[dup] = _unit(self.queries[owner] + tau * noise)
            return x
        if self.name == "mixture":
            return _unit(self._mixture_latent(n, g) @ self.encoder)
        if self.name == "student_t":
            return self._student(n, g)
        cls = self.distractor_classes[
            torch.randint(0, self.distractor_classes.numel(), (n,), generator=g)
        ]
        return _unit(self._items(cls, g))
