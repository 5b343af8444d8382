"""Distractor sampling and the streaming per-query tail state.

- :func:`hash_uniform` / :func:`sample_mask`: a deterministic i.i.d. sampler for
  distractor pools. Item ``i`` is kept iff ``hash(i, seed) < rate``, so every
  model is evaluated on the *same* sample, samples at smaller rates are nested
  in those at larger rates, and no shuffle of the pool is needed (the paper's
  protocol requires a uniform random sample, §4).
- :class:`NestedTopK`: the running top-T distractor scores of every query,
  kept separately for disjoint random parts of the sample so that the nested
  sub-samples S/8 ⊂ S/4 ⊂ S/2 ⊂ S can be recovered exactly at the end. Memory
  is O(P·Q·T), never O(Q·S); each pushed block costs one comparison per score
  plus work proportional to the scores that enter a top-T list.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from rl_gap.precision import full_precision_similarity

_GOLDEN64 = np.uint64(0x9E3779B97F4A7C15)

#: Nested sub-sample fractions kept by default (the plot's measured points and
#: the budget diagnostic's S/4, S/2, S).
DEFAULT_FRACTIONS: tuple[float, ...] = (0.125, 0.25, 0.5, 1.0)


def _mix64(z: np.ndarray) -> np.ndarray:
    """SplitMix64 finaliser on uint64 arrays (wrap-around arithmetic)."""
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def hash_uniform(ids: np.ndarray | torch.Tensor | list[int], seed: int = 0) -> np.ndarray:
    """Deterministic uniform value in [0, 1) for every integer item id.

    ``u = (mix64(id·φ + mix64(seed + φ)) >> 11) / 2^53`` with SplitMix64's
    finaliser ``mix64`` and φ the 64-bit golden ratio: well mixed, reproducible
    across machines, independent of the order or sharding of the pool.

    Args:
        ids: integer ids (any shape; negative ids are read modulo 2^64).
        seed: sampler seed; different seeds give independent samples.

    Returns:
        float64 array of the same shape.
    """
    if isinstance(ids, torch.Tensor):
        ids = ids.detach().cpu().numpy()
    arr = np.asarray(ids)
    if arr.dtype.kind not in "iu":
        raise ValueError(f"item ids must be integers, got dtype {arr.dtype}")
    z = arr.astype(np.int64).view(np.uint64) if arr.dtype.kind == "i" else arr.astype(np.uint64)
    with np.errstate(over="ignore"):
        key = _mix64(np.asarray([np.uint64(seed % (1 << 64)) + _GOLDEN64], dtype=np.uint64))[0]
        h = _mix64(z * _GOLDEN64 + key)
    return (h >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def sample_mask(
    ids: np.ndarray | torch.Tensor | list[int], rate: float, seed: int = 0
) -> np.ndarray:
    """Boolean mask keeping item ``i`` iff ``hash_uniform(i, seed) < rate``.

    Samples at rates r1 < r2 with the same seed are nested.
    """
    if not 0.0 < rate <= 1.0:
        raise ValueError(f"sampling rate must lie in (0, 1], got {rate}")
    return hash_uniform(ids, seed) < rate


def part_of(u: torch.Tensor, fractions: tuple[float, ...]) -> torch.Tensor:
    """Disjoint part index for uniforms ``u``: part p holds u ∈ [f_{p−1}, f_p)."""
    edges = torch.tensor(fractions[:-1], dtype=torch.float64, device=u.device)
    return torch.bucketize(u.to(torch.float64), edges, right=True)


class NestedTopK:
    """Running top-``capacity`` scores per query for disjoint parts of a sample.

    Part p receives the distractors whose uniform lies in
    ``[fractions[p−1], fractions[p])``; the union of parts 0..p is then an
    i.i.d. sub-sample of relative size ``fractions[p]``, and the top-T of a
    union is the top-T of its parts' top-T lists (:meth:`level`).

    Args:
        n_queries: Q.
        capacity: T, scores kept per query and part (≥ k and ≥ the EVT's 4000).
        fractions: increasing nested fractions ending at 1.
        dtype: storage dtype of the kept scores.
        keyed: also keep, for every kept score, the integer key of its
            distractor (its id, or any label shared by all queries), so that
            the sample can be resampled jointly across queries
            (:func:`poisson_multiplicities`): a distractor that ranks high for
            many queries moves all of them at once, which resampling each
            query's scores independently cannot see.
    """

    def __init__(
        self,
        n_queries: int,
        capacity: int,
        fractions: tuple[float, ...] = DEFAULT_FRACTIONS,
        dtype: torch.dtype = torch.float32,
        keyed: bool = False,
        device: torch.device | str | None = None,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        if abs(fractions[-1] - 1.0) > 1e-12 or any(
            b <= a for a, b in zip(fractions[:-1], fractions[1:])
        ):
            raise ValueError(f"fractions must increase strictly to 1, got {fractions}")
        self.fractions = tuple(float(f) for f in fractions)
        self.capacity = int(capacity)
        shape = (len(fractions), n_queries, capacity)
        self.top = torch.full(shape, -torch.inf, dtype=dtype, device=device)
        self.seen = torch.zeros(len(fractions), dtype=torch.long, device=device)
        self.keys: torch.Tensor | None = (
            torch.full(shape, -1, dtype=torch.long, device=device) if keyed else None
        )

    @classmethod
    def from_tensors(
        cls,
        top: torch.Tensor,
        seen: torch.Tensor,
        fractions: tuple[float, ...],
        keys: torch.Tensor | None = None,
    ) -> NestedTopK:
        """Wrap existing (P, Q, T) top lists, (P,) sizes and optional (P, Q, T) keys."""
        if top.dim() != 3 or top.shape[0] != len(fractions) or seen.shape != (len(fractions),):
            raise ValueError(
                f"state shapes {tuple(top.shape)}, {tuple(seen.shape)} do not match {fractions}"
            )
        if keys is not None and (keys.shape != top.shape or keys.dtype != torch.long):
            raise ValueError(
                f"keys must be int64 of the scores' shape {tuple(top.shape)}, "
                f"got {keys.dtype} {tuple(keys.shape)}"
            )
        state = cls(1, top.shape[2], fractions, dtype=top.dtype, device=top.device)
        state.top, state.seen, state.keys = top, seen, keys
        return state

    @classmethod
    def from_matrix(
        cls,
        sample_scores: torch.Tensor,
        capacity: int,
        fractions: tuple[float, ...],
        keyed: bool,
        seed: int,
        shuffle: bool,
    ) -> NestedTopK:
        """The state of a full (Q, S) floating-point sample matrix: the arguments of
        :func:`~rl_gap.metrics.tail.from_scores.state_from_scores`, which checks the matrix's
        shape and says why the columns are permuted with ``seed`` first."""
        Q, S = sample_scores.shape
        dtype = torch.float64 if sample_scores.dtype == torch.float64 else torch.float32
        state = cls(Q, capacity, fractions, dtype=dtype, keyed=keyed, device=sample_scores.device)
        perm = (
            torch.randperm(S, generator=torch.Generator().manual_seed(seed))
            if shuffle
            else torch.arange(S)
        )
        bounds = [0] + [int(round(f * S)) for f in fractions]
        for p in range(len(fractions)):
            for start in range(bounds[p], bounds[p + 1], 65536):
                cols = perm[start : min(bounds[p + 1], start + 65536)]
                block = sample_scores[:, cols.to(sample_scores.device)]
                if not bool(torch.isfinite(block).all()):
                    raise ValueError("sample_scores contains NaN or ±inf")
                state.push(block, p, cols.to(block.device) if keyed else None)
        return state

    @property
    def n_queries(self) -> int:
        return self.top.shape[1]

    def push(
        self,
        scores: torch.Tensor,
        part: int | torch.Tensor = -1,
        keys: torch.Tensor | None = None,
    ) -> None:
        """Add a block of distractor scores (Q, B).

        Args:
            scores: (Q, B) scores of B distractors against every query.
            part: one part index for the whole block, or a (B,) tensor of part
                indices (e.g. :func:`part_of` of hashed ids).
            keys: (B,) non-negative integer keys of the distractors; required
                by (and only accepted by) a ``keyed`` state.
        """
        if scores.dim() != 2 or scores.shape[0] != self.n_queries:
            raise ValueError(
                f"scores must be (Q={self.n_queries}, B), got shape {tuple(scores.shape)}"
            )
        if (keys is None) != (self.keys is None):
            raise ValueError(
                "a keyed state needs the distractors' keys=(B,) with every block"
                if keys is None
                else "keys given to a state built without keyed=True"
            )
        if keys is not None:
            keys = torch.as_tensor(keys, device=scores.device)
            if keys.shape != (scores.shape[1],) or keys.dtype.is_floating_point:
                raise ValueError(
                    f"keys must be ({scores.shape[1]},) integers, got {keys.dtype} {tuple(keys.shape)}"
                )
            keys = keys.long().to(scores.device)
            if keys.numel() and int(keys.min()) < 0:
                raise ValueError("keys must be non-negative (-1 marks an empty slot)")
        if isinstance(part, int):
            self._push_part(scores, part % len(self.fractions), keys)
            return
        part = part.to(scores.device)
        if part.numel() and bool((part == part[0]).all()):
            self._push_part(scores, int(part[0]) % len(self.fractions), keys)
            return
        for p in range(len(self.fractions)):
            cols = (part == p).nonzero().squeeze(1)
            if cols.numel():
                sub_keys = None if keys is None else keys[cols]
                self._push_part(scores.index_select(1, cols), p, sub_keys)

    def _push_part(self, scores: torch.Tensor, p: int, keys: torch.Tensor | None) -> None:
        scores = scores.to(device=self.top.device, dtype=self.top.dtype)
        current = self.top[p]
        n_cols = scores.shape[1]
        self.seen[p] += n_cols
        block_keys = None
        if self.seen[p] - n_cols < self.capacity:
            merged = torch.cat([current, scores], dim=1)
            if keys is not None:
                block_keys = keys.unsqueeze(0).expand(self.n_queries, -1)
        else:
            # Only scores above the row's current T-th best can enter its list.
            kth = current.amin(dim=1, keepdim=True)
            enter = scores > kth
            per_row = enter.sum(1)
            width = int(per_row.max())
            if width == 0:
                return
            if width * 4 > n_cols:
                merged = torch.cat([current, scores], dim=1)
                if keys is not None:
                    block_keys = keys.unsqueeze(0).expand(self.n_queries, -1)
            else:
                rows, cols = enter.nonzero(as_tuple=True)
                starts = torch.cumsum(per_row, 0) - per_row
                slot = torch.arange(rows.numel(), device=rows.device) - starts[rows]
                candidates = torch.full(
                    (self.n_queries, width), -torch.inf, dtype=self.top.dtype, device=rows.device
                )
                candidates[rows, slot] = scores[rows, cols]
                merged = torch.cat([current, candidates], dim=1)
                if keys is not None:
                    block_keys = torch.full(
                        (self.n_queries, width), -1, dtype=torch.long, device=rows.device
                    )
                    block_keys[rows, slot] = keys[cols]
        kept = torch.topk(merged, self.capacity, dim=1, sorted=False)
        self.top[p] = kept.values
        if self.keys is not None:
            merged_keys = torch.cat([self.keys[p], block_keys], dim=1)
            self.keys[p] = torch.gather(merged_keys, 1, kept.indices)

    def level(self, index: int) -> tuple[torch.Tensor, int]:
        """Top-T (Q, T) float64, sorted descending, and size of nested level ``index``."""
        top, _, size = self.level_with_keys(index)
        return top, size

    def level_with_keys(
        self, index: int, rows: slice = slice(None)
    ) -> tuple[torch.Tensor, torch.Tensor | None, int]:
        """:meth:`level` plus the (Q, T) keys in the same order (None if not keyed);
        ``rows``: only those queries' rows."""
        index = index % len(self.fractions)
        n_rows = len(range(self.n_queries)[rows])
        flat = lambda x: x[: index + 1, rows].permute(1, 0, 2).reshape(n_rows, -1)  # noqa: E731
        merged = flat(self.top)
        kept = torch.topk(merged, min(self.capacity, merged.shape[1]), dim=1)
        keys = None if self.keys is None else torch.gather(flat(self.keys), 1, kept.indices)
        return kept.values.to(torch.float64), keys, int(self.seen[: index + 1].sum())

    @staticmethod
    def merge_ranks(
        stacked: torch.Tensor, stacked_keys: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Merge (W, P, Q, T) per-rank states into one (P, Q, T) (DDP reduction).

        With ``stacked_keys`` (W, P, Q, T), returns (top, keys).
        """
        w, p, q, t = stacked.shape
        flat = lambda x: x.permute(1, 2, 0, 3).reshape(p, q, w * t)  # noqa: E731
        kept = torch.topk(flat(stacked), t, dim=-1, sorted=False)
        if stacked_keys is None:
            return kept.values
        return kept.values, torch.gather(flat(stacked_keys), -1, kept.indices)


#: Poisson(1) cumulative probabilities P(M ≤ m), m = 0..19 (beyond: < 1e-17).
_POISSON1_CDF = torch.tensor(
    [sum(math.exp(-1.0) / math.factorial(i) for i in range(m + 1)) for m in range(20)],
    dtype=torch.float64,
)


def poisson_multiplicities(keys: torch.Tensor, replicate: int, seed: int = 0) -> torch.Tensor:
    """Poisson(1) bootstrap multiplicity of every key, the same wherever the key occurs.

    The multiplicity of key ``i`` in replicate ``b`` is the Poisson(1) quantile
    of ``hash_uniform(i, seed')`` (``seed'`` from ``seed`` and ``b``), so a
    distractor kept in several queries' lists gets one multiplicity in all of
    them: the replicate resamples the distractor sample, not each query's
    scores independently.

    Args:
        keys: integer keys, any shape (negative keys, the empty slots, get 0).
        replicate: replicate index b.
        seed: bootstrap seed.

    Returns:
        float64 tensor of keys' shape.
    """
    u = torch.from_numpy(hash_uniform(keys, seed=seed * 1_000_003 + replicate + 1))
    m = torch.bucketize(u, _POISSON1_CDF, right=True).to(torch.float64)
    return torch.where(keys >= 0, m, torch.zeros_like(m))


def stream_scores(
    queries: torch.Tensor,
    distractors: torch.Tensor | np.ndarray,
    state: NestedTopK,
    *,
    part: torch.Tensor | None = None,
    block_size: int = 32768,
    progress=None,
    keys: torch.Tensor | None = None,
) -> None:
    """Score distractor embeddings against all queries in GEMM blocks into ``state``.

    Args:
        queries: (Q, d) query embeddings.
        distractors: (B, d) embeddings (tensor, array or memory map; read blockwise).
        state: the tail state to update.
        part: optional (B,) part indices; default: nested parts by position
            (valid when the distractors are already an i.i.d. sample in random
            order: prefixes are then random sub-samples).
        block_size: distractors per GEMM block.
        progress: optional callable ``progress(n_done)`` after each block.
        keys: (B,) distractor keys for a ``keyed`` state; default: the row
            positions 0..B−1.
    """
    n = distractors.shape[0]
    if state.keys is not None and keys is None:
        keys = torch.arange(n)
    if part is None:
        # Position-based nesting: first f_0·n items → part 0, and so on.
        bounds = [0] + [int(round(f * n)) for f in state.fractions]
        part = torch.empty(n, dtype=torch.long)
        for p in range(len(state.fractions)):
            part[bounds[p] : bounds[p + 1]] = p
    q = queries.to(torch.float32)
    for start in range(0, n, block_size):
        block = distractors[start : start + block_size]
        block = torch.as_tensor(np.asarray(block) if not isinstance(block, torch.Tensor) else block)
        # Host blocks (arrays, memory maps) go to the queries' device one at a time.
        scores = full_precision_similarity(q, block.to(device=q.device, dtype=torch.float32))
        block_keys = None if keys is None else keys[start : start + block_size]
        state.push(scores, part[start : start + block_size], block_keys)
        if progress is not None:
            progress(min(n, start + block_size))
