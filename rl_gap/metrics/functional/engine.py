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

import torch
from torch import Tensor

from rl_gap.metrics.functional.arguments import check_block_size
from rl_gap.metrics.functional.counting import NegativeCounter
from rl_gap.metrics.functional.dense import bootstrap_knots, merge_grid, prepare_positives
from rl_gap.metrics.functional.engine_inputs import (
    as_tensor,
    check_embeddings,
    check_labels,
    check_query_index,
    check_rows,
    positive_pairs_from_labels,
    relevant_pairs_from_fn,
    same_data,
)
from rl_gap.metrics.functional.sharding import Shard, merge_sum
from rl_gap.metrics.functional.state import (
    RetrievalState,
    argsort_stable,
    compute_dtype_for,
    torch_threads,
    unique_sorted,
)
from rl_gap.precision import autocast_disabled

__all__ = [
    "state_from_embeddings",
    "positive_pairs_from_labels",
    "as_tensor",
    "check_embeddings",
    "relevant_pairs_from_fn",
    "check_query_index",
]


def _blocks(size: int, step: int) -> list[tuple[int, int]]:
    return [(s, min(size, s + step)) for s in range(0, size, step)]


def state_from_embeddings(*args, **kwargs) -> RetrievalState:
    """Exact retrieval state from embeddings (see ``_state_from_embeddings`` for the
    arguments). Bookkeeping runs on one CPU thread; the GEMM blocks and the counting
    kernel use torch's configured threads."""
    threads = torch.get_num_threads()
    with torch_threads(1):
        return _state_from_embeddings(*args, heavy_threads=threads, **kwargs)


def _state_from_embeddings(
    queries,
    database=None,
    query_labels=None,
    database_labels=None,
    *,
    exclude_self: bool = False,
    query_index: Tensor | None = None,
    relevant_pairs: tuple[Tensor, Tensor] | None = None,
    block_size: int | tuple[int, int] = 2048,
    device: torch.device | str | None = None,
    query_group: Tensor | None = None,
    num_groups: int = 1,
    bootstrap_budget: int = 0,
    cache_bytes: int = 512 << 20,
    validated: bool = False,
    symmetric: bool | None = None,
    heavy_threads: int = 1,
    extra_grid: Tensor | None = None,
    query_rows: Tensor | None = None,
    database_rows: Tensor | None = None,
    query_offsets: Tensor | None = None,
    shard: Shard | None = None,
) -> RetrievalState:
    """Exact retrieval state from embeddings; scores are dot products.

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
        heavy_threads: CPU threads for the GEMM blocks and the counting kernel.
        extra_grid: optional scores added to the grid (``merge_grid``): negatives are
            counted exactly at each (the threshold protocol's fitted thresholds).
        query_rows / database_rows: optional (Q,) / (D,) int64 rows of ``queries`` /
            ``database`` that form the problem (a subset, read per block, never copied);
            labels, indices and groups refer to the subset. The same tensor for both,
            with ``exclude_self``, is leave-one-out on that subset.
        query_offsets: optional (Q,) per-query shifts: scores are ``q . d - offset[q]``
            (query-side score normalisation, ``score_norm.py``).
        shard: sharded evaluation (``sharding.py``): every process passes the same
            inputs, scores and counts the blocks it owns, and the counts are summed;
            every process returns the one-process state.
    """
    queries = as_tensor(queries, "queries")
    database = queries if database is None else as_tensor(database, "database")
    if not validated:
        check_embeddings(queries, "query embeddings")
        if database is not queries:
            check_embeddings(database, "database embeddings")
    if queries.shape[1] != database.shape[1]:
        raise ValueError(
            f"embedding dims differ: queries {tuple(queries.shape)}, database {tuple(database.shape)}"
        )
    same_rows = query_rows is database_rows
    query_rows = check_rows(query_rows, queries.shape[0], "query_rows")
    database_rows = check_rows(database_rows, database.shape[0], "database_rows")
    num_q = queries.shape[0] if query_rows is None else query_rows.numel()
    num_d = database.shape[0] if database_rows is None else database_rows.numel()
    self_index = check_query_index(query_index, num_q, num_d, exclude_self)
    device = torch.device(device) if device is not None else queries.device
    dtype = compute_dtype_for(torch.promote_types(queries.dtype, database.dtype))
    block_size = check_block_size(block_size)
    rows_step, cols_step = (block_size, block_size) if isinstance(block_size, int) else block_size
    if isinstance(cache_bytes, bool) or not isinstance(cache_bytes, int) or cache_bytes < 0:
        raise ValueError(f"cache_bytes must be an integer >= 0, got {cache_bytes!r}")

    # ---- relevance, in label-sorted order
    if relevant_pairs is not None:
        perm_q = torch.arange(num_q)
        perm_d = torch.arange(num_d)
        q_idx, d_idx = (as_tensor(t, "relevant_pairs").long().cpu() for t in relevant_pairs)
        if q_idx.shape != d_idx.shape or q_idx.ndim != 1:
            raise ValueError("relevant_pairs must be two 1-D index tensors of equal length")
        if q_idx.numel() and (
            q_idx.min() < 0 or q_idx.max() >= num_q or d_idx.min() < 0 or d_idx.max() >= num_d
        ):
            raise ValueError("relevant_pairs index out of range")
        key = unique_sorted(q_idx * num_d + d_idx)
        q_idx, d_idx = key // num_d, key % num_d
    else:
        if query_labels is None or database_labels is None:
            if query_labels is not None and database is queries:
                database_labels = query_labels
            else:
                raise ValueError("give query_labels and database_labels, or relevant_pairs")
        q_lab = check_labels(as_tensor(query_labels, "query_labels").cpu(), num_q, "query_labels")
        d_lab = check_labels(
            as_tensor(database_labels, "database_labels").cpu(), num_d, "database_labels"
        )
        if self_index is not None and not bool((q_lab == d_lab[self_index]).all()):
            raise ValueError(
                "exclude_self / query_index: a query's label differs from its database row's "
                "(query_labels must equal database_labels[query_index])"
            )
        perm_q = argsort_stable(q_lab)
        perm_d = perm_q if exclude_self else argsort_stable(d_lab)
        q_idx, d_idx = positive_pairs_from_labels(q_lab[perm_q], d_lab[perm_d], False)
    # Self column of each (sorted) query in the sorted database, or None.
    self_col = None
    if self_index is not None:
        inv_perm_d = torch.empty_like(perm_d)
        inv_perm_d[perm_d] = torch.arange(num_d)
        self_col = inv_perm_d[self_index[perm_q]]
        keep = d_idx != self_col[q_idx]
        q_idx, d_idx = q_idx[keep], d_idx[keep]

    # ---- step 1: positive scores from the blocks that hold them
    row_blocks, col_blocks = _blocks(num_q, rows_step), _blocks(num_d, cols_step)
    # Source rows of the sorted problem's queries / database items, read per block.
    q_source = perm_q if query_rows is None else query_rows[perm_q]
    d_order = perm_d if relevant_pairs is None else None
    if database_rows is not None:
        d_order = database_rows if d_order is None else database_rows[d_order]
    q_shift = None  # per sorted query: its score offset
    if query_offsets is not None:
        q_shift = as_tensor(query_offsets, "query_offsets")
        if q_shift.shape != (num_q,):
            raise ValueError(
                f"query_offsets must be ({num_q},) (one per query), got {tuple(q_shift.shape)}"
            )
        q_shift = q_shift.to(device=device, dtype=dtype)[perm_q.to(device)]

    def db_block(c0: int, c1: int) -> Tensor:
        """Sorted database rows c0..c1 on the scoring device, in the scoring dtype."""
        rows = database[c0:c1] if d_order is None else database[d_order[c0:c1]]
        return rows.to(device=device, dtype=dtype)

    # Leave-one-out on one embedding set: the score matrix is symmetric, so only
    # blocks on or above the diagonal are computed; block (r, c) also stands for
    # (c, r). Pair (j, i) gets the very value computed for (i, j) (one tie, never
    # two roundings of the same similarity), and the GEMM and global counting halve.
    symmetric = (
        symmetric is not False
        and exclude_self
        and relevant_pairs is None
        and same_data(database, queries)
        and same_rows
        and q_shift is None
        and rows_step == cols_step
    )

    def query_block(r0: int, r1: int) -> Tensor:
        if symmetric:
            return db_block(r0, r1)
        return queries[q_source[r0:r1]].to(device=device, dtype=dtype)

    def mask_self(block: Tensor, r0: int, r1: int, c0: int, c1: int) -> None:
        if self_col is None:
            return
        cols = self_col[r0:r1]
        rows = ((cols >= c0) & (cols < c1)).nonzero(as_tuple=True)[0]
        if rows.numel():
            block[rows.to(block.device), (cols[rows] - c0).to(block.device)] = float("-inf")

    reusable: list[Tensor] = []

    def gemm(
        r0: int,
        r1: int,
        c0: int,
        c1: int,
        q_blk: Tensor | None = None,
        reuse: bool = False,
        d_blk: Tensor | None = None,
    ) -> Tensor:
        """Score block; ``reuse`` writes it into one recycled buffer (a fresh 16 MB
        block costs milliseconds of page faults), valid until the next such call."""
        q_blk = query_block(r0, r1) if q_blk is None else q_blk
        d_blk = db_block(c0, c1) if d_blk is None else d_blk
        with torch_threads(heavy_threads), autocast_disabled(device):
            if not reuse:
                out = q_blk @ d_blk.T
            else:
                if not reusable:
                    size = min(rows_step, num_q) * min(cols_step, num_d)
                    reusable.append(torch.empty(size, dtype=dtype, device=device))
                out = reusable[0][: (r1 - r0) * (c1 - c0)].view(r1 - r0, c1 - c0)
                torch.mm(q_blk, d_blk.T, out=out)
            if q_shift is not None:
                out.sub_(q_shift[r0:r1, None])
            return out

    n_col_blocks = len(col_blocks)
    # Where each positive's score is read: (row, column) of its block.
    read_q, read_d = q_idx, d_idx
    if symmetric:
        lower = (q_idx // rows_step) > (d_idx // cols_step)
        read_q, read_d = torch.where(lower, d_idx, q_idx), torch.where(lower, q_idx, d_idx)
    block_id = (read_q // rows_step) * n_col_blocks + read_d // cols_step
    order = argsort_stable(block_id)
    q_idx, d_idx, block_id = q_idx[order], d_idx[order], block_id[order]
    read_q, read_d = read_q[order], read_d[order]
    ids, counts = torch.unique_consecutive(block_id, return_counts=True)
    bounds = torch.cumsum(counts, 0).tolist()
    block_pairs: dict[int, tuple[Tensor, Tensor]] = {}
    # Sharded: entries of blocks owned elsewhere stay 0 until the sum over processes.
    pos_scores = torch.zeros(q_idx.numel(), dtype=dtype, device=device)
    cache: dict[int, Tensor] = {}
    cached = 0
    start = 0
    for bid, stop in zip(ids.tolist(), bounds):
        if shard is not None and not shard.owns(bid):
            start = stop
            continue
        rb, cb = divmod(bid, n_col_blocks)
        (r0, r1), (c0, c1) = row_blocks[rb], col_blocks[cb]
        rows = (read_q[start:stop] - r0).to(device)
        cols = (read_d[start:stop] - c0).to(device)
        block = gemm(r0, r1, c0, c1)
        pos_scores[start:stop] = block[rows, cols]
        block_pairs[bid] = (rows, cols)
        block_bytes = block.numel() * block.element_size()
        if cached + block_bytes <= cache_bytes:
            block[rows, cols] = float("-inf")
            mask_self(block, r0, r1, c0, c1)
            cache[bid] = block
            cached += block_bytes
        start = stop
    if shard is not None:
        merge_sum([pos_scores], shard)
    if not bool(torch.isfinite(pos_scores).all()):
        raise ValueError("scores overflow to inf: embeddings too large for the scoring dtype")

    # ---- grid and counter
    pos_query = q_idx.to(device)
    _, pos_query, pos_scores, offsets, grid, pos_grid_index = prepare_positives(
        pos_query, pos_scores, num_q
    )
    if extra_grid is not None:
        grid, pos_grid_index = merge_grid(grid, pos_grid_index, extra_grid)
    group_sorted = (
        torch.zeros(num_q, dtype=torch.long)
        if query_group is None
        else as_tensor(query_group, "query_group").long().cpu()[perm_q]
    )
    knots = None
    pos_neg_ge = torch.zeros(pos_query.numel(), dtype=torch.long, device=device)
    grid_neg_ge = torch.zeros((num_groups, 0), dtype=torch.long, device=device)
    boot = None
    if grid.numel() > 0:
        if bootstrap_budget > 0:
            knots = bootstrap_knots(pos_grid_index, grid.numel(), num_q, bootstrap_budget)
        # Count on the groups that have queries only (empty ones stay zero): one group
        # lets a mirrored score count twice without looking up its column's group.
        used, compact_group = unique_sorted(group_sorted, return_inverse=True)
        counter = NegativeCounter(
            grid, offsets, pos_grid_index, compact_group.to(device), used.numel(), knots
        )
        # ---- step 2: every block, negatives only
        visits = [
            (rb, cb)
            for rb in range(len(row_blocks))
            for cb in range(n_col_blocks)
            if not (symmetric and cb < rb)
        ]
        if num_d > num_q:  # column blocks outermost: the database streams once per pass
            visits.sort(key=lambda visit: (visit[1], visit[0]))
        q_key = d_key = None
        for rb, cb in visits:
            bid = rb * n_col_blocks + cb
            if shard is not None and not shard.owns(bid):
                continue
            (r0, r1), (c0, c1) = row_blocks[rb], col_blocks[cb]
            block = cache.pop(bid, None)
            if block is None:  # read the outer block once, the inner one per visit
                if q_key != rb:
                    q_blk, q_key = query_block(r0, r1), rb
                if d_key != cb:
                    d_blk, d_key = db_block(c0, c1), cb
                block = gemm(r0, r1, c0, c1, q_blk, reuse=True, d_blk=d_blk)
                if bid in block_pairs:
                    rows, cols = block_pairs[bid]
                    block[rows, cols] = float("-inf")
                mask_self(block, r0, r1, c0, c1)
            with torch_threads(heavy_threads):
                if not symmetric or cb == rb:
                    counter.add(block, r0)
                    continue
                # Positives of the column queries sit at the mirrored places
                # (labels are symmetric), so the masked block serves both sides:
                # the row pass counts each score globally for both queries, the
                # transposed pass adds the column queries' own counts.
                counter.add(block, r0, mirror_start=c0)
                counter.add(block, c0, global_weight=0, transposed=True)
        if shard is not None:
            counter.merge(shard)
        pos_neg_ge, used_neg_ge, boot = counter.finish()
        grid_neg_ge = used_neg_ge.new_zeros((num_groups, grid.numel()))
        grid_neg_ge[used.to(device)] = used_neg_ge

    # ---- back to the caller's query order
    orig_query = perm_q.to(device)[pos_query]
    back = argsort_stable(orig_query.cpu()).to(device)
    num_pos = torch.bincount(orig_query, minlength=num_q)
    num_negatives = num_d - num_pos - (0 if self_index is None else 1)
    if boot is not None:
        unsorted = torch.empty_like(boot)
        unsorted[perm_q.to(device)] = boot
        boot = unsorted
    group = torch.zeros(num_q, dtype=torch.long) if query_group is None else group_sorted.clone()
    if query_group is not None:
        group[perm_q] = group_sorted
    return RetrievalState(
        num_q, pos_scores[back], orig_query[back], pos_neg_ge[back], grid,
        pos_grid_index[back], grid_neg_ge, group.to(device), num_negatives, knots, boot,
    )  # fmt: skip
