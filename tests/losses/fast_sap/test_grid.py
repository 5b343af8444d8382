"""The grid plan of the fast gSAP kernel (rl_gap/losses/fast_sap/grid.py): grids that cannot
reach the tolerance raise ``PlanError``."""

from __future__ import annotations

import pytest
import torch

from rl_gap.losses.fast_sap.grid import PlanError, plan_grid


def test_plan_error_for_unreachable_grids():
    # τ = 1e-6 over cosine scores; scores x 1e4 at τ = 0.01: no grid within the cell budget.
    for lo, hi, tau in ((-0.9, 0.9, 1e-6), (-9000.0, 9000.0, 1e-2)):
        with pytest.raises(PlanError, match="cannot reach tolerance"):
            plan_grid(lo, hi, lo, hi, 10_000, tau, 1e-8, torch.float32)
    assert issubclass(PlanError, ValueError)
