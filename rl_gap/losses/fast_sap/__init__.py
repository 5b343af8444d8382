"""Fast smoothed AP: gSAP's sub-quadratic kernel (docs/fast_gsap.md).

The sigmoid sums of every positive over every item are evaluated on a two-level grid
instead of the P × M sweep, to a stated relative tolerance:

- ``kernel``: :func:`smoothed_ap_fast` (value and exact gradient, autograd) and
  :func:`prefer_fast` (when the grid beats the exact sweep).
- ``grid``: the grid plan (bin widths, Taylor orders, FFT size) for a tolerance.
- ``binning``: scatter of scores into fine bins and their moments (torch, or ``native``).
- ``taylor``: the Taylor error bounds of the sigmoid that size the grid.
- ``drop``: negative dropping by a score threshold (no sort).
- ``native``: the optional one-pass CPU library (``native_sap_passes.cpp``).

The loss itself is registered as ``gsap`` (``rl_gap.losses.gsap``, ``impl="fast"|"auto"``);
the registry stays the way to add or swap losses.
"""

from rl_gap.losses.fast_sap.grid import PlanError
from rl_gap.losses.fast_sap.kernel import prefer_fast, smoothed_ap_fast

__all__ = ["PlanError", "prefer_fast", "smoothed_ap_fast"]
