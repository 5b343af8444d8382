"""The sharded losses' collectives, now in ``rl_gap.dist`` (every collective of rl_gap
lives there); this module keeps the old import path ``rl_gap.losses.sharding.comm``."""

from rl_gap.dist import (
    COUNTER,
    CommCounter,
    all_gather_ragged,
    all_gather_sizes,
    all_reduce,
    counting,
    first_rank_only,
    global_count,
    reduce_partials,
    reduce_statistic,
    require_group,
    scale_grad,
)

__all__ = [
    "COUNTER",
    "CommCounter",
    "all_gather_ragged",
    "all_gather_sizes",
    "all_reduce",
    "counting",
    "first_rank_only",
    "global_count",
    "reduce_partials",
    "reduce_statistic",
    "require_group",
    "scale_grad",
]
