"""Streaming torchmetrics class for tail-extrapolated mAP@k.

The queries (and their positives) are registered first, on every rank alike;
the distractor sample is then streamed in chunks, sharded across ranks. The
state per query is the running top-T sampled scores of each nested part of
the sample (T = max(4000, k)), the positive scores and the sample size:
O(Q·(P·T + m)) memory, never Q × S. Sampled counts above each positive are
read off the top-T lists at compute time (exact below T, which is all that
AP@k can see for N ≥ S). Across DDP ranks the top-T lists are merged and the
sample sizes summed.
"""

from __future__ import annotations

import math
import warnings

import torch
from torchmetrics import Metric

from rl_gap.metrics.tail.build import state_capacity, tail_predictor, with_score_range
from rl_gap.metrics.tail.hardness import DEFAULT_CONFIG, TailConfig
from rl_gap.metrics.tail.inputs import check_k
from rl_gap.metrics.tail.intervals import check_n_boot
from rl_gap.metrics.tail.predictor import TailPredictor
from rl_gap.metrics.tail.registry import DEFAULT_ESTIMATOR, resolve_rank_law
from rl_gap.metrics.tail.results import TailEstimate
from rl_gap.metrics.tail.sampling import DEFAULT_FRACTIONS, NestedTopK, hash_uniform, part_of
from rl_gap.precision import full_precision_similarity


def _first_rank(stacked: torch.Tensor) -> torch.Tensor:
    """Replicated states (queries, positives): every rank holds the same; keep rank 0's."""
    return stacked[0]


def _merge_top(stacked: torch.Tensor) -> torch.Tensor:
    if stacked.dim() == 3:  # not stacked (single process)
        return stacked
    return NestedTopK.merge_ranks(stacked)


def _stack_ranks(stacked: torch.Tensor) -> torch.Tensor:
    """Keep the per-rank (W, P, Q, T) stack: a keyed state merges scores and keys together."""
    return stacked


def _sum_counts(stacked: torch.Tensor) -> torch.Tensor:
    return stacked.sum(0) if stacked.dim() == 2 else stacked


class TailExtrapolatedMAP(Metric):
    """Predicted mAP@k at ``gallery_size`` distractors from a streamed distractor sample.

    Args:
        gallery_size: N, the gallery size to predict for.
        k: AP cut-off.
        estimator: "tail_pooled" (default: the GPD shape's posterior pooled
            across queries, ``ci`` for these queries), "evt_support" (plug-in GPD,
            ξ bound following the score support), "tail" (tail-aware with parameter uncertainty),
            "evt" (plug-in GPD), "count", "sample", or a baseline
            ("single_x", "powerlaw", "loguniform").
        rank_law: None (the estimator's own), "plugin" (expected ranks) or
            "binomial"/"poisson" (E[AP@k]).
        n_boot: query-bootstrap replicates for the interval (0: none, logged as NaN).
        fractions: nested sub-sample fractions kept (for diagnostics).
        block_size: distractors per GEMM block when fed embeddings.
        seed: seeds the random part assignment (when no ids) and the bootstrap.
        config: EVT settings.
        keyed: keep each kept score's distractor key (its id, or a random key
            when no ids are given), so that ``estimate(nested_boot=...)``
            resamples distractors jointly across queries (a distractor that
            ranks high for many queries moves them all at once). Triples the
            state's memory.
        score_range: the similarity's declared range ("cosine" = [−1, 1], the
            default; "dot" or None = unbounded; or a (low, high) pair), as in
            :func:`~rl_gap.metrics.tail.predict_map`.

    Example:
        Register the queries and their positives first (on every rank alike),
        then stream the distractor sample in chunks (sharded across ranks in
        DDP). One query q = (1, 0) with positives scoring 0.95 and 0.5 and ten
        sampled distractors, one of which (0.9) lies between them: with the
        ``count`` estimator the second positive has hardness 1/10 and sits at
        rank 2 + 20/10 in a gallery of 20, so mAP@10 = (1 + 2/4)/2
        (``predict_map``'s example, from embeddings):

        >>> import torch
        >>> from rl_gap.metrics import TailExtrapolatedMAP
        >>> metric = TailExtrapolatedMAP(gallery_size=20, k=10, estimator="count")
        >>> metric.update(queries=torch.tensor([[1.0, 0.0]]),
        ...               positives=torch.tensor([[0.95, 0.0], [0.5, 0.0]]),
        ...               positive_query=torch.tensor([0, 0]))
        >>> scores = [0.9, 0.4, 0.3, 0.2, 0.1, 0.0, -0.1, -0.2, -0.3, -0.4]
        >>> for chunk in torch.tensor([[s, 0.0] for s in scores]).split(4):
        ...     metric.update(distractors=chunk)
        >>> import warnings
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("ignore")  # ten distractors cannot support a prediction
        ...     result = metric.compute()
        >>> {key: round(float(value), 4) for key, value in result.items()}
        {'map': 0.75, 'ci_low': 0.75, 'ci_high': 0.75, 'supported': 0.0, 'ci_total_low': 0.75, 'ci_total_high': 0.75}
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    def __init__(
        self,
        gallery_size: int,
        k: int = 1000,
        estimator: str = DEFAULT_ESTIMATOR,
        rank_law: str | None = None,
        n_boot: int = 1000,
        fractions: tuple[float, ...] = DEFAULT_FRACTIONS,
        block_size: int = 32768,
        seed: int = 0,
        config: TailConfig = DEFAULT_CONFIG,
        keyed: bool = False,
        score_range: str | tuple[float, float] | None = "cosine",
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        config = with_score_range(config, score_range)
        resolve_rank_law(estimator, rank_law)  # the name and the law, checked at construction
        check_k(k)
        if int(gallery_size) < 1:
            raise ValueError(f"gallery_size must be >= 1, got {gallery_size}")
        self.gallery_size = int(gallery_size)
        self.k = int(k)
        self.estimator = estimator
        self.rank_law = rank_law
        check_n_boot(n_boot)
        self.n_boot = n_boot
        self.fractions = tuple(fractions)
        self.capacity = state_capacity(self.k, config)
        self.block_size = block_size
        self.seed = seed
        self.config = config
        self._generator: torch.Generator | None = None
        self.add_state("queries", default=torch.zeros(0, 0), dist_reduce_fx=_first_rank)
        self.add_state(
            "pos_scores", default=torch.zeros(0, 0, dtype=torch.float64), dist_reduce_fx=_first_rank
        )
        self.keyed = keyed
        self.add_state(
            "top",
            default=torch.zeros(len(self.fractions), 0, self.capacity),
            dist_reduce_fx=_stack_ranks if keyed else _merge_top,
        )
        if keyed:
            self.add_state(
                "keys",
                default=torch.zeros(len(self.fractions), 0, self.capacity, dtype=torch.long),
                dist_reduce_fx=_stack_ranks,
            )
        self.add_state(
            "seen",
            default=torch.zeros(len(self.fractions), dtype=torch.long),
            dist_reduce_fx=_sum_counts,
        )

    # ----------------------------------------------------------------- update
    def update(
        self,
        queries: torch.Tensor | None = None,
        positives: torch.Tensor | None = None,
        positive_query: torch.Tensor | None = None,
        positive_scores: torch.Tensor | None = None,
        distractors: torch.Tensor | None = None,
        distractor_scores: torch.Tensor | None = None,
        distractor_ids: torch.Tensor | None = None,
    ) -> None:
        """Register queries (with positives) and/or stream a chunk of distractors.

        Args:
            queries: (q, d) query embeddings of this chunk of queries.
            positives: (P, d) positive embeddings, with ``positive_query`` (P,)
                the index (into this chunk's queries) each positive belongs to.
            positive_scores: (q, m) NaN-padded positive scores, instead of
                embeddings (then distractors must come as scores).
            distractors: (B, d) embeddings of sampled distractors.
            distractor_scores: (Q, B) scores of sampled distractors against
                every registered query.
            distractor_ids: optional (B,) integer ids; they decide (by hash)
                which nested sub-sample each distractor joins, reproducibly.
        """
        # The state lives on the metric's device (moved with ``.to``): inputs from elsewhere
        # are moved there, so the state is never split across devices.
        queries, positives, positive_query, positive_scores, distractors, distractor_scores = (
            None if x is None else x.to(self.device)
            for x in (
                queries,
                positives,
                positive_query,
                positive_scores,
                distractors,
                distractor_scores,
            )
        )
        if queries is not None or positive_scores is not None:
            self._register(queries, positives, positive_query, positive_scores)
        if distractors is not None:
            if self.queries.numel() == 0:
                raise ValueError("distractor embeddings need registered query embeddings")
            if distractors.dim() != 2 or distractors.shape[1] != self.queries.shape[1]:
                raise ValueError(
                    f"distractors must be (B, d={self.queries.shape[1]}), got {tuple(distractors.shape)}"
                )
            self._check_finite(distractors, "distractors")
            for start in range(0, distractors.shape[0], self.block_size):
                block = distractors[start : start + self.block_size].to(self.queries.dtype)
                ids = (
                    None
                    if distractor_ids is None
                    else distractor_ids[start : start + self.block_size]
                )
                self._push(full_precision_similarity(self.queries, block), ids)
        if distractor_scores is not None:
            if (
                distractor_scores.dim() != 2
                or distractor_scores.shape[0] != self.pos_scores.shape[0]
            ):
                raise ValueError(
                    f"distractor_scores must be (Q={self.pos_scores.shape[0]}, B), got {tuple(distractor_scores.shape)}"
                )
            self._check_finite(distractor_scores, "distractor_scores")
            self._push(distractor_scores, distractor_ids)

    @staticmethod
    def _check_finite(x: torch.Tensor, name: str) -> None:
        if not bool(torch.isfinite(x).all()):
            raise ValueError(f"{name} contains NaN or ±inf")

    def _register(self, queries, positives, positive_query, positive_scores) -> None:
        if int(self.seen.sum()) > 0:
            raise ValueError("register every query before streaming distractors")
        if positive_scores is None:
            if queries is None or positives is None or positive_query is None:
                raise ValueError(
                    "give queries with positives and positive_query, or positive_scores"
                )
            if queries.dim() != 2 or positives.dim() != 2 or queries.shape[1] != positives.shape[1]:
                raise ValueError(
                    f"queries (q, d) and positives (P, d) must share d; got {tuple(queries.shape)}, {tuple(positives.shape)}"
                )
            owner = positive_query.long()
            if owner.shape != (positives.shape[0],) or (
                owner.numel() and (owner.min() < 0 or owner.max() >= queries.shape[0])
            ):
                raise ValueError("positive_query must be (P,) indices into this chunk's queries")
            self._check_finite(queries, "queries")
            self._check_finite(positives, "positives")
            scores = (queries[owner].double() * positives.double()).sum(1)
            counts = torch.bincount(owner, minlength=queries.shape[0])
            width = int(counts.max()) if counts.numel() else 0
            slot = torch.zeros_like(owner)
            order = torch.argsort(owner, stable=True)
            starts = torch.cumsum(counts, 0) - counts
            slot[order] = torch.arange(owner.numel(), device=owner.device) - starts[owner[order]]
            positive_scores = torch.full(
                (queries.shape[0], max(width, 1)),
                math.nan,
                dtype=torch.float64,
                device=owner.device,
            )
            positive_scores[owner, slot] = scores
            q = queries.to(torch.float32)
            self.queries = q if self.queries.numel() == 0 else torch.cat([self.queries, q])
        elif queries is not None:
            self.queries = (
                queries.float()
                if self.queries.numel() == 0
                else torch.cat([self.queries, queries.float()])
            )
        pos = positive_scores.to(torch.float64)
        if pos.dim() != 2 or bool(torch.isinf(pos).any()):
            raise ValueError("positive scores must be (q, m), finite or NaN-padded")
        old = self.pos_scores
        width = max(old.shape[1] if old.numel() else 0, pos.shape[1])
        pad = lambda x: torch.nn.functional.pad(x, (0, width - x.shape[1]), value=math.nan)  # noqa: E731
        self.pos_scores = pad(pos) if old.numel() == 0 else torch.cat([pad(old), pad(pos)])
        self.top = torch.full(
            (len(self.fractions), self.pos_scores.shape[0], self.capacity),
            -math.inf,
            device=self.pos_scores.device,
        )
        if self.keyed:
            self.keys = torch.full(self.top.shape, -1, dtype=torch.long, device=self.top.device)

    def _push(self, scores: torch.Tensor, ids: torch.Tensor | None) -> None:
        keys = None
        device = scores.device
        if ids is not None:
            u = torch.from_numpy(hash_uniform(ids, seed=self.seed)).to(device)
            keys = torch.as_tensor(ids, device=device).long() if self.keyed else None
        else:
            if self._generator is None:
                from rl_gap.dist import rank

                self._generator = torch.Generator().manual_seed(self.seed * 1009 + rank())
            # Drawn on the host (B numbers per block) so that a run's sample does not depend
            # on the device it runs on.
            u = torch.rand(scores.shape[1], generator=self._generator, dtype=torch.float64)
            u = u.to(device)
            if self.keyed:  # random 62-bit keys: distinct across blocks and ranks in practice
                keys = torch.randint(0, 1 << 62, (scores.shape[1],), generator=self._generator)
                keys = keys.to(device)
        state = self._state()
        state.push(scores.float(), part_of(u, self.fractions), keys)
        self.top, self.seen = state.top, state.seen
        if self.keyed:
            self.keys = state.keys

    def _state(self) -> NestedTopK:
        if not self.keyed:
            return NestedTopK.from_tensors(self.top, self.seen, self.fractions)
        top, keys = self.top, self.keys
        if top.dim() == 4:  # synced: (W, P, Q, T) per-rank stacks, merged together
            top, keys = NestedTopK.merge_ranks(top, keys)
        return NestedTopK.from_tensors(top, self.seen, self.fractions, keys)

    # ---------------------------------------------------------------- compute
    def predictor(self) -> TailPredictor:
        """A TailPredictor on the (synced) state, for curves and diagnostics."""
        if self.pos_scores.numel() == 0:
            raise ValueError("no query registered: call update(queries=..., positives=...) first")
        return tail_predictor(
            self.pos_scores, self._state(), self.k, config=self.config, seed=self.seed
        )

    def estimate(self, **kwargs) -> TailEstimate:
        """Full TailEstimate (per-query AP, fit, optional nested bootstrap / budget)."""
        with self.sync_context(should_sync=self._to_sync, should_unsync=self._should_unsync):
            return self.predictor().estimate(
                self.estimator,
                self.gallery_size,
                kwargs.pop("rank_law", self.rank_law),
                n_boot=kwargs.pop("n_boot", self.n_boot),
                **kwargs,
            )

    def compute(self) -> dict[str, torch.Tensor]:
        est = self.predictor().estimate(
            self.estimator, self.gallery_size, self.rank_law, n_boot=self.n_boot
        )
        # n_boot = 0 asks for no interval: its bounds are logged as NaN.
        ci = est.ci or (math.nan, math.nan)
        out = {
            "map": torch.tensor(est.map, dtype=torch.float64),
            "ci_low": torch.tensor(ci[0], dtype=torch.float64),
            "ci_high": torch.tensor(ci[1], dtype=torch.float64),
        }
        if est.diagnostics is not None:
            # Logged next to the prediction (W&B), and said once per compute.
            out["supported"] = torch.tensor(float(est.supported), dtype=torch.float64)
            total = est.ci_total or (math.nan, math.nan)
            out["ci_total_low"] = torch.tensor(total[0], dtype=torch.float64)
            out["ci_total_high"] = torch.tensor(total[1], dtype=torch.float64)
            if est.flags:
                warnings.warn(
                    f"TailExtrapolatedMAP ({self.estimator}, N = {self.gallery_size:,}): the "
                    "sample cannot support this prediction: " + "; ".join(est.flags),
                    stacklevel=2,
                )
        return out
