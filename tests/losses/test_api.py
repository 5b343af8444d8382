"""Registry, input validation, the no-positive batch, and config-driven swaps."""

from __future__ import annotations

import importlib.util
import math
import types
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import rl_gap.losses.gsap as gsap_module
from rl_gap.losses import available_losses, build_loss, loss_from_config, register_loss, registry


def small_batch(q: int = 6, d: int = 6):
    gen = torch.Generator().manual_seed(0)
    sim = torch.rand(q, d, generator=gen) * 2 - 1
    labels = torch.arange(q) % 3
    rel = labels.unsqueeze(1) == labels[:d].unsqueeze(0)
    valid = ~torch.eye(q, d, dtype=torch.bool)
    return sim, rel, valid


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


@pytest.mark.parametrize("name", ["gsap", "msap", "infonce", "siglip"])
def test_bad_inputs_raise_clear_errors(name):
    loss_fn = build_loss(name)
    sim, rel, valid = small_batch()
    with pytest.raises(ValueError, match="2-D"):
        loss_fn(sim.flatten(), rel.flatten())
    with pytest.raises(ValueError, match="rel shape"):
        loss_fn(sim, rel[:, :-1])
    with pytest.raises(ValueError, match="valid shape"):
        loss_fn(sim, rel, valid[:-1])
    with pytest.raises(ValueError, match="rel must be a bool"):
        loss_fn(sim, rel.float())
    with pytest.raises(ValueError, match="valid must be a bool"):
        loss_fn(sim, rel, valid.long())
    with pytest.raises(ValueError, match="floating"):
        loss_fn(sim.long(), rel)
    with pytest.raises(ValueError, match="empty"):
        loss_fn(sim[:0], rel[:0])
    for bad in (math.nan, math.inf, -math.inf):
        broken = sim.clone()
        broken[1, 2] = bad
        with pytest.raises(ValueError, match="NaN/inf"):
            loss_fn(broken, rel, valid)


@pytest.mark.parametrize("name", ["gsap", "msap", "infonce"])
@pytest.mark.parametrize("temperature", [0.0, -0.1, math.nan])
def test_bad_temperature(name, temperature):
    with pytest.raises(ValueError, match="temperature"):
        build_loss(name, temperature=temperature)


@pytest.mark.parametrize("name", ["gsap", "msap"])
@pytest.mark.parametrize("rate", [-0.1, 1.0, 1.5])
def test_bad_neg_drop(name, rate):
    with pytest.raises(ValueError, match="neg_drop"):
        build_loss(name, neg_drop=rate)


def test_bad_impl_and_chunk_size():
    with pytest.raises(ValueError, match="unknown gsap impl 'gpu'"):
        build_loss("gsap", impl="gpu")
    with pytest.raises(ValueError, match="chunk_size"):
        build_loss("gsap", chunk_size=0)
    with pytest.raises(ValueError, match="chunk_size"):
        build_loss("msap", chunk_size=-2)


def test_load_fast_kernel_is_the_fast_sap_kernel(monkeypatch):
    from rl_gap.losses.fast_sap import kernel

    assert gsap_module.load_fast_kernel() is kernel.smoothed_ap_fast
    monkeypatch.setattr(gsap_module, "_fast_module", lambda: None)
    assert gsap_module.load_fast_kernel() is None


def test_fast_impl_without_kernel(monkeypatch):
    monkeypatch.setattr(gsap_module, "_fast_module", lambda: None)
    with pytest.raises(ValueError, match="fast_sap.kernel"):
        build_loss("gsap", impl="fast")
    loss_fn = build_loss("gsap", impl="auto")
    assert loss_fn.select_impl(10**6, 10**6) == "exact"


def test_auto_uses_fast_kernel_when_it_prefers(monkeypatch):
    calls = []
    prefer = {"fast": True}

    def fake_fast(scores, positive, temperature, *, tolerance=1e-7, valid=None):
        keep = torch.ones_like(positive) if valid is None else valid
        calls.append((int(keep.sum()), int((positive & keep).sum()), temperature, tolerance))
        return scores.mean() * 0 + 0.25

    fake_module = types.SimpleNamespace(
        smoothed_ap_fast=fake_fast, prefer_fast=lambda p, m, t, device=None: prefer["fast"]
    )
    monkeypatch.setattr(gsap_module, "_fast_module", lambda: fake_module)
    sim, rel, valid = small_batch()
    loss = build_loss("gsap", temperature=0.02, impl="auto", tolerance=1e-5)(sim, rel, valid)
    assert float(loss) == pytest.approx(0.75)
    assert calls == [(int(valid.sum()), int((rel & valid).sum()), 0.02, 1e-5)]
    prefer["fast"] = False
    build_loss("gsap", impl="auto")(sim, rel, valid)
    assert len(calls) == 1  # the kernel declined: exact path


@pytest.mark.parametrize("name", ["gsap", "msap", "infonce", "siglip"])
def test_no_positive_batch_gives_finite_loss_with_gradient(name):
    sim, _, valid = small_batch()
    leaf = sim.clone().requires_grad_(True)
    rel = torch.zeros_like(valid)
    loss_fn = build_loss(name) if name != "infonce" else build_loss(name, learnable_scale=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loss = loss_fn(leaf, rel, valid)
    loss.backward()
    assert torch.isfinite(loss) and leaf.grad is not None
    assert all(p.grad is not None for p in loss_fn.parameters())
    if name == "siglip":  # well defined without positives: pushes every pair down
        assert float(loss.detach()) > 0 and (leaf.grad[valid] > 0).all()
    else:
        assert float(loss.detach()) == 0.0
        assert (leaf.grad == 0).all()
        assert any("no valid positive" in str(w.message) for w in caught)


def test_positive_only_in_invalid_pairs_counts_as_none():
    sim, _, _ = small_batch()
    rel = torch.eye(6, dtype=torch.bool)
    valid = ~rel
    for name in ("gsap", "msap", "infonce"):
        with pytest.warns(UserWarning, match="no valid positive"):
            assert float(build_loss(name)(sim, rel, valid)) == 0.0


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


@pytest.mark.parametrize("name", ["infonce", "siglip"])
def test_half_precision_inputs_compute_in_float32(name):
    sim, rel, valid = small_batch()
    reference = build_loss(name)(sim.double(), rel, valid)
    for dtype in (torch.float16, torch.bfloat16):
        leaf = sim.to(dtype).requires_grad_(True)
        loss = build_loss(name)(leaf, rel, valid)
        loss.backward()
        assert loss.dtype == torch.float32 and leaf.grad.dtype == dtype
        assert torch.isfinite(leaf.grad.float()).all()
        tol = 2e-2 if dtype == torch.bfloat16 else 2e-3  # the inputs' own rounding
        assert float(loss.detach()) == pytest.approx(float(reference.detach()), rel=tol)


def test_bench_script_measures_every_loss():
    """Smoke test of scripts/bench_losses.py in-process (no subprocess), tiny batch."""
    path = Path(__file__).resolve().parents[2] / "scripts" / "bench_losses.py"
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
