"""The evaluation engine: retrieval state from embeddings in one pass of GEMM blocks.

The Q x D similarity matrix is never built. Queries and database are sorted
by label so positives sit in few blocks:

1. *positives*: only the GEMM blocks that hold a positive pair are computed;
   their positive scores form the grid (G distinct values);
2. *negatives*: every block is computed (the same blocks, same shapes, so a
   positive and a negative with equal scores stay tied), positives and self
   pairs are masked to ``-inf`` and the rest is counted on the grid
   (``NegativeCounter``: O(1) per pair).

Blocks of step 1 are kept for step 2 within ``cache_bytes``. Memory is
O(P + groups·G + block) besides the embeddings: the database is read one column
block at a time (label permutation applied per block, widened to the scoring dtype
and moved to the scoring device per block), so a memory-mapped or float16 database
is never copied whole. Leave-one-out on one embedding
set computes only the blocks on and above the diagonal (the scores are
symmetric): each unordered pair is scored once and counted for both queries.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rl_gap.metrics.functional.counting import NegativeCounter
from rl_gap.metrics.functional.dense import bootstrap_knots, merge_grid, prepare_positives
from rl_gap.metrics.functional.engine_blocks import BlockScorer
from rl_gap.metrics.functional.engine_inputs import (
    as_tensor,
    check_embeddings,
    check_query_index,
    positive_pairs_from_labels,
    relevant_pairs_from_fn,
)
from rl_gap.metrics.functional.engine_plan import Plan, plan_problem
from rl_gap.metrics.functional.progress import report_blocks
from rl_gap.metrics.functional.sharding import Shard, merge_sum
from rl_gap.metrics.functional.state import (
    RetrievalState,
    argsort_stable,
    torch_threads,
    unique_sorted,
)

__all__ = [
    "state_from_embeddings",
    "positive_pairs_from_labels",
    "as_tensor",
    "check_embeddings",
    "relevant_pairs_from_fn",
    "check_query_index",
    "PositiveScores",
    "NegativeCounts",
    "score_positives",
    "count_negatives",
    "state_in_query_order",
]


def state_from_embeddings(
    queries,
    database=None,
    query_labels=None,
    database_labels=None,
    *,
    bootstrap_budget: int = 0,
    cache_bytes: int = 512 << 20,
    extra_grid: Tensor | None = None,
    shard: Shard | None = None,
    **problem,
) -> RetrievalState:
    """Exact retrieval state from embeddings; scores are dot products.

    Four steps: ``plan_problem`` (inputs in label-sorted order) -> ``score_positives``
    (the blocks holding positives) -> ``count_negatives`` (every block, on the grid) ->
    ``state_in_query_order``. Bookkeeping runs on one CPU thread; the GEMM blocks and
    the counting kernel use torch's configured threads.

    The problem's options (every argument below but ``bootstrap_budget``,
    ``cache_bytes``, ``extra_grid`` and ``shard``) go by name to ``plan_problem``,
    which checks them and holds their defaults; an unknown one is a TypeError.

    Args:
        queries: (Q, dim) float tensor or numpy array (memory maps are read block-wise).
        database: (D, dim); None = the queries themselves.
        query_labels / database_labels: (Q,) / (D,) integer labels; relevance = same label.
        exclude_self: leave-one-out; query i is database item i, the pair is ignored.
        query_index: (Q,) int64, distinct, in [0, D): query i is database row
            ``query_index[i]``; that pair is ignored (neither positive nor negative).
            A query subset of the database (``exclude_self`` is ``arange(Q)``).
        relevant_pairs: instead of labels, explicit ``(query_idx, database_idx)`` positives.
        block_size: GEMM block rows = columns (or ``(rows, columns)``).
        device: where to score (default: the queries' device); fp16/bf16 are scored in fp32.
        query_group / num_groups: per-query group ids for split metrics.
        bootstrap_budget: per-query knot counts kept for the gAP bootstrap (0: none).
        cache_bytes: memory for keeping positive blocks between the two steps (blocks
            beyond it are computed twice; 512 MB holds the ~2 per block row of a
            label-sorted 32k x 32k problem).
        validated: skip the NaN/inf scan of the embeddings (the caller did it).
        symmetric: leave-one-out on one embedding set (``database`` None or the same
            tensor, labels, square blocks): compute each unordered pair once, so
            (i, j) and (j, i) share one value (None: whenever possible; False: never).
        extra_grid: optional scores added to the grid (``merge_grid``): negatives are
            counted exactly at each (the threshold protocol's fitted thresholds).
        query_rows / database_rows: optional (Q,) / (D,) int64 rows of ``queries`` /
            ``database`` that form the problem (a subset, read per block, never copied);
            labels, indices and groups refer to the subset. The same tensor for both,
            with ``exclude_self``, is leave-one-out on that subset.
        query_offsets: optional (Q,) per-query shifts: scores are ``q . d - offset[q]``
            (query-side score normalisation, ``score_norm.py``).
        normalize: cosine scores: each row L2-normalised as its block is read (the
            values of normalising the embeddings first, without a normalised copy).
        shard: sharded evaluation (``sharding.py``): every process passes the same
            inputs, scores and counts the blocks it owns, and the counts are summed;
            every process returns the one-process state.
    """
    if isinstance(cache_bytes, bool) or not isinstance(cache_bytes, int) or cache_bytes < 0:
        raise ValueError(f"cache_bytes must be an integer >= 0, got {cache_bytes!r}")
    heavy_threads = torch.get_num_threads()
    with torch_threads(1):
        plan = plan_problem(queries, database, query_labels, database_labels, **problem)
        scorer = BlockScorer(plan, heavy_threads)
        positives = score_positives(plan, scorer, cache_bytes, shard)
        counts = count_negatives(plan, scorer, positives, bootstrap_budget, extra_grid, shard)
        return state_in_query_order(plan, counts)


@dataclass
class PositiveScores:
    """Step 1's result, positives ordered by the block that holds them.

    Attributes:
        query / item: (P,) sorted query and database position of each positive.
        scores: (P,) their scores on the scoring device.
        block_pairs: block id -> (rows, columns) of its positives inside the block.
        cache: block id -> kept score block, positives and self pairs already ``-inf``.
    """

    query: Tensor
    item: Tensor
    scores: Tensor
    block_pairs: dict[int, tuple[Tensor, Tensor]]
    cache: dict[int, Tensor]


@dataclass
class NegativeCounts:
    """Step 2's result: the grid and the negative counts on it (``NegativeCounter``).

    Attributes:
        pos_query / pos_scores / pos_grid_index: (P,) positives in sorted query order
            (``prepare_positives``), with each one's position on the grid.
        grid: (G,) distinct positive scores (plus ``extra_grid``), ascending.
        pos_neg_ge: (P,) negatives of the positive's query scoring >= it.
        grid_neg_ge: (groups, G) negatives of each query group scoring >= each grid value.
        knots / boot: the bootstrap's knots and per sorted query counts (or None).
    """

    pos_query: Tensor
    pos_scores: Tensor
    pos_grid_index: Tensor
    grid: Tensor
    pos_neg_ge: Tensor
    grid_neg_ge: Tensor
    knots: Tensor | None
    boot: Tensor | None


def _block_of_each_positive(plan: Plan) -> tuple[Tensor, Tensor, Tensor]:
    """``(block id, row, column)`` where each positive's score is read. Symmetric plans
    read a pair below the diagonal from its mirror above it."""
    read_q, read_d = plan.pos_q, plan.pos_d
    if plan.symmetric:
        lower = (read_q // plan.rows_step) > (read_d // plan.cols_step)
        read_q, read_d = torch.where(lower, read_d, read_q), torch.where(lower, read_q, read_d)
    n_col_blocks = len(plan.col_blocks)
    block_id = (read_q // plan.rows_step) * n_col_blocks + read_d // plan.cols_step
    return block_id, read_q, read_d


def score_positives(
    plan: Plan, scorer: BlockScorer, cache_bytes: int, shard: Shard | None = None
) -> PositiveScores:
    """Step 1: score only the blocks that hold a positive pair and read the positives.

    Blocks within ``cache_bytes`` are kept for step 2 with their positives and self
    pairs set to ``-inf``; the others are scored into the recycled buffer. With a
    ``shard``, a process scores the blocks it owns and the scores are summed (the
    others' entries are 0 until then). Raises on scores that overflow to inf.
    """
    block_id, read_q, read_d = _block_of_each_positive(plan)
    order = argsort_stable(block_id)
    block_id, read_q, read_d = block_id[order], read_q[order], read_d[order]
    ids, counts = torch.unique_consecutive(block_id, return_counts=True)
    n_col_blocks = len(plan.col_blocks)
    row_blocks, col_blocks = plan.row_blocks, plan.col_blocks
    element = torch.empty((), dtype=plan.dtype).element_size()
    out = PositiveScores(
        plan.pos_q[order], plan.pos_d[order],
        torch.zeros(order.numel(), dtype=plan.dtype, device=plan.device), {}, {},
    )  # fmt: skip
    cached, start = 0, 0
    for bid, stop in zip(ids.tolist(), torch.cumsum(counts, 0).tolist()):
        if shard is None or shard.owns(bid):
            (r0, r1), (c0, c1) = row_blocks[bid // n_col_blocks], col_blocks[bid % n_col_blocks]
            rows = (read_q[start:stop] - r0).to(plan.device)
            cols = (read_d[start:stop] - c0).to(plan.device)
            keep = cached + (r1 - r0) * (c1 - c0) * element <= cache_bytes
            block = scorer.score(r0, r1, c0, c1, keep=keep)
            out.scores[start:stop] = block[rows, cols]
            out.block_pairs[bid] = (rows, cols)
            if keep:
                block[rows, cols] = float("-inf")
                scorer.mask_self(block, r0, r1, c0)
                out.cache[bid] = block
                cached += block.numel() * element
        start = stop
    if shard is not None:
        merge_sum([out.scores], shard)
    if not bool(torch.isfinite(out.scores).all()):
        raise ValueError("scores overflow to inf: embeddings too large for the scoring dtype")
    return out


def _block_visits(plan: Plan) -> list[tuple[int, int]]:
    """(row block, column block) in scoring order: symmetric plans skip blocks below the
    diagonal; with more database items than queries the database streams once per pass."""
    visits = [
        (rb, cb)
        for rb in range(len(plan.row_blocks))
        for cb in range(len(plan.col_blocks))
        if not (plan.symmetric and cb < rb)
    ]
    if plan.num_database > plan.num_queries:
        visits.sort(key=lambda visit: (visit[1], visit[0]))
    return visits


def count_negatives(
    plan: Plan,
    scorer: BlockScorer,
    positives: PositiveScores,
    bootstrap_budget: int = 0,
    extra_grid: Tensor | None = None,
    shard: Shard | None = None,
) -> NegativeCounts:
    """Step 2: build the grid of positive scores and count every block's negatives on it.

    Positives and self pairs are masked to ``-inf`` in each block (kept blocks come
    masked from step 1). Counting runs on the query groups that have queries (empty
    groups stay zero). With a ``shard`` the counts of the owned blocks are summed.
    """
    num_q = plan.num_queries
    _, pos_query, pos_scores, offsets, grid, pos_grid_index = prepare_positives(
        positives.query.to(plan.device), positives.scores, num_q
    )
    if extra_grid is not None:
        grid, pos_grid_index = merge_grid(grid, pos_grid_index, extra_grid)
    counts = NegativeCounts(
        pos_query, pos_scores, pos_grid_index, grid,
        torch.zeros(pos_query.numel(), dtype=torch.long, device=plan.device),
        torch.zeros((plan.num_groups, 0), dtype=torch.long, device=plan.device), None, None,
    )  # fmt: skip
    if grid.numel() == 0:
        return counts
    if bootstrap_budget > 0:
        counts.knots = bootstrap_knots(pos_grid_index, grid.numel(), num_q, bootstrap_budget)
    # One group per used group id lets a mirrored score count twice without looking up
    # its column's group.
    used, compact_group = unique_sorted(plan.query_group[plan.perm_q], return_inverse=True)
    counter = NegativeCounter(
        grid, offsets, pos_grid_index, compact_group.to(plan.device), used.numel(), counts.knots
    )
    n_col_blocks = len(plan.col_blocks)
    visits = _block_visits(plan)
    report_blocks(0, len(visits))
    for done, (rb, cb) in enumerate(visits, 1):
        bid = rb * n_col_blocks + cb
        if shard is None or shard.owns(bid):
            _count_block(plan, scorer, positives, counter, rb, cb)
        report_blocks(done, len(visits))
    if shard is not None:
        counter.merge(shard)
    counts.pos_neg_ge, used_neg_ge, counts.boot = counter.finish()
    counts.grid_neg_ge = used_neg_ge.new_zeros((plan.num_groups, grid.numel()))
    counts.grid_neg_ge[used.to(plan.device)] = used_neg_ge
    return counts


def _count_block(
    plan: Plan,
    scorer: BlockScorer,
    positives: PositiveScores,
    counter: NegativeCounter,
    rb: int,
    cb: int,
) -> None:
    """Count the negatives of block (rb, cb) (and of its mirror, for a symmetric plan)."""
    bid = rb * len(plan.col_blocks) + cb
    (r0, r1), (c0, c1) = plan.row_blocks[rb], plan.col_blocks[cb]
    block = positives.cache.pop(bid, None)
    if block is None:
        block = scorer.score(r0, r1, c0, c1)
        if bid in positives.block_pairs:
            rows, cols = positives.block_pairs[bid]
            block[rows, cols] = float("-inf")
        scorer.mask_self(block, r0, r1, c0)
    with torch_threads(scorer.heavy_threads):
        if not plan.symmetric or cb == rb:
            counter.add(block, r0)
            return
        # Positives of the column queries sit at the mirrored places (labels are
        # symmetric), so the masked block serves both sides: the row pass counts each
        # score globally for both queries, the transposed pass adds the column
        # queries' own counts.
        counter.add(block, r0, mirror_start=c0)
        counter.add(block, c0, global_weight=0, transposed=True)


def state_in_query_order(plan: Plan, counts: NegativeCounts) -> RetrievalState:
    """Step 3: the ``RetrievalState`` with queries back in the caller's order."""
    device = plan.device
    perm_q = plan.perm_q.to(device)
    orig_query = perm_q[counts.pos_query]
    back = argsort_stable(orig_query.cpu()).to(device)
    num_pos = torch.bincount(orig_query, minlength=plan.num_queries)
    num_negatives = plan.num_database - num_pos - (0 if plan.self_col is None else 1)
    boot = counts.boot
    if boot is not None:
        boot = torch.empty_like(counts.boot)
        boot[perm_q] = counts.boot
    return RetrievalState(
        plan.num_queries, counts.pos_scores[back], orig_query[back], counts.pos_neg_ge[back],
        counts.grid, counts.pos_grid_index[back], counts.grid_neg_ge,
        plan.query_group.to(device), num_negatives, counts.knots, boot,
    )  # fmt: skip
