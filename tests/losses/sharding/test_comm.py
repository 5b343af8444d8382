"""``rl_gap.losses.sharding.comm`` is the old import path of the collectives in ``rl_gap.dist``."""

from rl_gap import dist
from rl_gap.losses.sharding import comm


def test_old_path_names_the_same_collectives():
    assert comm.__all__ and all(getattr(comm, name) is getattr(dist, name) for name in comm.__all__)
