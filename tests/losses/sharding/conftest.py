"""A one-process gloo group for the sharded pieces' reference tests (no spawned workers).

With one rank the concatenated list is this rank's list, so every sharded kernel must
give the single-list reference; ``tests/losses/sharding/test_call.py`` spawns 2 and 3
ranks for the cross-rank sums.
"""

from __future__ import annotations

import pytest
import torch.distributed as torch_dist


@pytest.fixture(scope="module")
def one_rank_group(tmp_path_factory):
    init = tmp_path_factory.mktemp("gloo") / "init"
    torch_dist.init_process_group("gloo", init_method=f"file://{init}", rank=0, world_size=1)
    yield
    torch_dist.destroy_process_group()
