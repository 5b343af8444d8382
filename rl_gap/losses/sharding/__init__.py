"""Losses on a batch matrix whose rows are sharded across ranks (docs/distributed.md).

``loss_fn(sim_rows, rel_rows, valid_rows, sharded=True)`` returns the
single-process global loss on every rank from this rank's rows. Each loss
class holds its own sharded form (``_loss_sharded`` of a
:class:`rl_gap.losses.base.RankingLoss`); this package holds what they share:

- ``call``: the sharded call (inputs checked on every rank), ``supports_sharding``;
- ``rows``: per-row partial sums and the flat list after global negative dropping;
- ``drop``: negative dropping over the sharded list (a distributed radix select);
- ``gsap``: gSAP's fast kernel (grid moments all-reduced) and exact sweep;
- ``global_surrogates``: gSoftBin, gBlackBox, gSupAP.

The collectives themselves live in :mod:`rl_gap.dist`.
"""

from rl_gap.losses.sharding.call import sharded_forward, supports_sharding, warn_replicated

__all__ = ["sharded_forward", "supports_sharding", "warn_replicated"]
