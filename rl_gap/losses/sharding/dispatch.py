"""Old import path of the sharded call: the names live in ``rl_gap.losses.sharding.call``
and each loss's sharded form in its own class (``forward_sharded``)."""

from rl_gap.losses.sharding.call import sharded_forward, supports_sharding, warn_replicated

__all__ = ["sharded_forward", "supports_sharding", "warn_replicated"]
