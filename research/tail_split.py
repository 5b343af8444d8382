"""The fixed design / held-out split of the world family (``research/tail_split.json``).

Drawn once with a fixed seed before any estimator was evaluated on the
family: the six ``tail_simulate`` worlds (the ones the estimators were built
on) are design worlds; of the 60 random worlds, a seeded half is held out.
Estimators and their settings are chosen on design worlds only; every figure
reported as a result is on held-out worlds.

    .venv/bin/python -m research.tail_split      # rewrites tail_split.json (unchanged)
"""

from __future__ import annotations

import json
import os

import torch

from research.tail_family import N_WORLDS, WORLDS

SPLIT_SEED = 20261202
SPLIT_PATH = os.path.join(os.path.dirname(__file__), "tail_split.json")


def make_split(seed: int = SPLIT_SEED) -> dict:
    """{"design": ids, "held_out": ids}: the six fixed worlds + half the random ones to design."""
    random_ids = torch.arange(len(WORLDS), N_WORLDS)
    perm = random_ids[
        torch.randperm(random_ids.numel(), generator=torch.Generator().manual_seed(seed))
    ]
    half = random_ids.numel() // 2
    design = list(range(len(WORLDS))) + sorted(int(i) for i in perm[:half])
    return {"seed": seed, "design": design, "held_out": sorted(int(i) for i in perm[half:])}


def load_split(path: str = SPLIT_PATH) -> dict:
    """The committed split."""
    with open(path) as f:
        return json.load(f)


if __name__ == "__main__":
    with open(SPLIT_PATH, "w") as f:
        json.dump(make_split(), f, indent=1)
        f.write("\n")
    print(SPLIT_PATH)
