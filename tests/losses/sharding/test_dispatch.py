"""``rl_gap.losses.sharding.dispatch`` is the old import path of the sharded call's names."""

from rl_gap.losses.sharding import call, dispatch


def test_old_path_names_the_same_functions():
    assert set(dispatch.__all__) == {"sharded_forward", "supports_sharding", "warn_replicated"}
    assert all(getattr(dispatch, name) is getattr(call, name) for name in dispatch.__all__)
