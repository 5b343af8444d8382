"""Losses on a batch matrix whose rows are sharded across ranks (docs/distributed.md).

``loss_fn(sim_rows, rel_rows, valid_rows, sharded=True)`` (every registered loss)
returns the single-process global loss on every rank from this rank's rows:

- ``comm``: autograd-aware reductions of the global statistics and a byte counter;
- ``drop``: negative dropping over the sharded list (a distributed radix select);
- ``gsap``: gSAP's fast kernel (grid moments all-reduced) and exact sweep;
- ``global_surrogates``: gSoftBin, gBlackBox, gSupAP;
- ``dispatch``: the per-loss routing, per-row losses and InfoNCE's column statistics.
"""

from rl_gap.losses.sharding.dispatch import sharded_forward, supports_sharding, warn_replicated

__all__ = ["sharded_forward", "supports_sharding", "warn_replicated"]
