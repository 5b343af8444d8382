"""The registry (rl_gap/losses/registry.py): names, registration, building from a recipe's
``loss:`` section; and the loss benchmark script over the registered losses."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
from torch import nn

from rl_gap.losses import available_losses, build_loss, loss_from_config, register_loss, registry


def test_registry_lists_every_loss():
    assert {"gsap", "msap", "infonce", "siglip"} <= set(available_losses())
    assert available_losses() == sorted(available_losses())
    for name in available_losses():
        assert isinstance(build_loss(name), nn.Module)
    assert type(build_loss("GSAP")) is type(build_loss("gsap"))


def test_unknown_loss_names_the_known_ones():
    with pytest.raises(ValueError, match="unknown loss 'gsapp'.*gsap.*infonce.*msap.*siglip"):
        build_loss("gsapp")


def test_decorator_registration_and_duplicate_name(monkeypatch):
    # A private copy of the registry, so the toy loss does not leak into other tests.
    monkeypatch.setattr(registry, "_LOSSES", dict(registry._LOSSES))

    @register_loss("test_only_constant")
    class ConstantLoss(nn.Module):
        def forward(self, sim, rel, valid=None):
            return sim.sum() * 0

    assert "test_only_constant" in available_losses()
    assert isinstance(build_loss("test_only_constant"), ConstantLoss)
    with pytest.raises(ValueError, match="already registered"):

        @register_loss("gsap")
        class Clash(nn.Module):
            pass


def test_loss_from_config_swaps_and_catches_typos():
    loss_fn = loss_from_config({"name": "gsap", "temperature": 0.001, "neg_drop": 0.9})
    assert (loss_fn.temperature, loss_fn.neg_drop) == (0.001, 0.9)
    # a swap takes the new loss's own table, never another loss's values
    section = {"name": "infonce", "gsap": {"temperature": 0.001, "neg_drop": 0.9},
               "infonce": {"temperature": 0.05}}  # fmt: skip
    swapped = loss_from_config(section)
    assert type(swapped).__name__ == "InfoNCELoss" and swapped.temperature == 0.05
    with pytest.raises(ValueError, match="does not take.*neg_drop"):
        loss_from_config({"name": "infonce", "temperature": 0.05, "neg_drop": 0.9})
    with pytest.raises(ValueError, match="does not take.*temprature"):
        loss_from_config({"name": "gsap", "temprature": 0.01})
    with pytest.raises(ValueError, match="unknown loss"):
        loss_from_config({"name": "nope"})
    assert type(loss_from_config(None)).__name__ == "GlobalSmoothAPLoss"


def test_bench_script_measures_every_loss():
    """Smoke test of benchmarks/bench_losses.py in-process (no subprocess), tiny batch."""
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_losses.py"
    spec = importlib.util.spec_from_file_location("bench_losses", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    args = bench.parse_args(["--batch-sizes", "16", "--impls", "exact", "--reps", "1"])
    rows = []
    for config in bench.build_configs(args):
        rows.append({**config, **bench.measure(config)})
    assert {r["label"] for r in rows} == {"gsap-exact", "msap", "infonce", "siglip"}
    measured = [r["seconds"] for r in rows]  # a smoke check of the record, not of speed
    assert all(math.isfinite(t) and t > 0 for t in measured)
    assert all(r["reps"] == 1 for r in rows)
    table = bench.format_table(rows)
    assert "gsap-exact" in table and "x_infonce" in table
