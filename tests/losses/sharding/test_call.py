"""Sharded loss calls equal one process holding the whole matrix, for every registered loss.

2 and 3 gloo processes (``torch.multiprocessing.spawn``) each pass their
consecutive block of rows (ragged: 5 + 8 and 4 + 6 + 3 of 13) of a float64
(13, 17) similarity matrix to ``loss_fn(..., sharded=True)``. The reference is
the same loss called on the whole matrix in the test process (no process
group): the loss value on every rank, the concatenated row gradients and the
rank-summed loss-parameter gradients must match it to 1e-10. Two matrices: a
smooth one and a tie-heavy one (cosines rounded to multiples of 1/8, with
±0.0 among them) for negative dropping's tie order.
"""

from __future__ import annotations

import os
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
import torch.distributed as torch_dist
import torch.multiprocessing as mp

from rl_gap.losses import available_losses, build_loss
from rl_gap.losses.common import drop_lowest_negatives
from rl_gap.losses.fast_sap import binning as fast_binning
from rl_gap.losses.fast_sap.grid import plan_grid
from rl_gap.losses.sharding import gsap as sharded_gsap
from rl_gap.losses.sharding.call import supports_sharding
from rl_gap.losses.sharding.drop import sharded_drop_mask

ROWS, COLS = 13, 17
SPLITS = {2: [5, 8], 3: [4, 6, 3]}
DROP = 0.5


def configs() -> dict[str, tuple[str, dict]]:
    out: dict[str, tuple[str, dict]] = {}
    for name in available_losses():
        out[name] = (name, {})
        if "neg_drop" in build_loss(name).__dict__:
            out[f"{name}/drop"] = (name, {"neg_drop": DROP})
    for impl in ("exact", "fast", "auto"):
        for drop in (0.0, DROP):
            out[f"gsap/{impl}/{drop}"] = (
                "gsap",
                {"impl": impl, "neg_drop": drop, "temperature": 0.05},
            )
    out["infonce/sym/learn"] = ("infonce", {"symmetric": True, "learnable_scale": True})
    out["infonce/sym"] = ("infonce", {"symmetric": True, "temperature": 0.1})
    out["siglip/fixed"] = ("siglip", {"learnable": False})
    out["msap/chunk"] = ("msap", {"chunk_size": 2, "neg_drop": 0.3})
    out["gsupap/chunk"] = ("gsupap", {"chunk_size": 3, "neg_drop": 0.3})
    out["gsupap/inat"] = ("gsupap", {"start": 0.0, "offset": 1.0})  # ROADMAP's iNat setting
    return out


def make_matrix(kind: str):
    gen = torch.Generator().manual_seed(3)
    q = torch.nn.functional.normalize(
        torch.randn(ROWS, 4, generator=gen, dtype=torch.float64), dim=1
    )
    d = torch.nn.functional.normalize(
        torch.randn(COLS, 4, generator=gen, dtype=torch.float64), dim=1
    )
    sim = q @ d.T
    if kind == "ties":
        sim = torch.round(sim * 8) / 8
        sim[0, :3] = -0.0  # −0.0 ties with +0.0 under every comparison
    q_labels = torch.arange(ROWS) % 4
    d_labels = torch.arange(COLS) % 5
    rel = q_labels[:, None] == d_labels[None, :]
    valid = torch.rand(ROWS, COLS, generator=gen) > 0.1
    rel[7] = False  # a query with no positive: its pairs are still negatives
    return sim, rel, valid


def loss_values(name, kwargs, sim, rel, valid, sharded):
    torch.manual_seed(0)
    loss_fn = build_loss(name, **kwargs).double()
    sim = sim.clone().requires_grad_(True)
    loss = loss_fn(sim, rel, valid, sharded=sharded) if sharded else loss_fn(sim, rel, valid)
    loss.backward()
    params = {n: p.grad.clone() for n, p in loss_fn.named_parameters()}
    return loss.detach(), sim.grad.clone(), params


def drop_lists():
    """Flat tie-heavy lists (float32 and float64) with signed zeros and negatives."""
    gen = torch.Generator().manual_seed(5)
    out = {}
    for dtype in (torch.float32, torch.float64):
        scores = (torch.randint(-3, 4, (40,), generator=gen) / 4.0).to(dtype)
        scores[::7] = -0.0
        positive = torch.rand(40, generator=gen) < 0.2
        valid = torch.rand(40, generator=gen) > 0.15
        out[str(dtype)] = (scores, positive, valid)
    # Hundreds of ties at the cut on every rank (past the 64 positions a thread records).
    scores = torch.randint(-1, 2, (3000,), generator=gen) / 2.0
    out["many_ties"] = (
        scores,
        torch.rand(3000, generator=gen) < 0.1,
        torch.rand(3000, generator=gen) > 0.05,
    )
    return out


def _worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    torch_dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world
    )
    try:
        split = SPLITS[world]
        rows = slice(sum(split[:rank]), sum(split[: rank + 1]))
        results = {}
        for kind in ("smooth", "ties"):
            sim, rel, valid = make_matrix(kind)
            for key, (name, kwargs) in configs().items():
                if supports_sharding(build_loss(name, **kwargs)) is not None:
                    continue
                results[(kind, key)] = loss_values(
                    name, kwargs, sim[rows], rel[rows], valid[rows], sharded=True
                )
        sim, rel, valid = make_matrix("smooth")
        work, positive, ok = sim[rows].reshape(-1), rel[rows].reshape(-1), valid[rows].reshape(-1)
        stats = sharded_gsap._global_stats(work, ok, work[positive & ok])
        results["plan"] = (stats, asdict(sharded_gsap._global_plan(stats, 0.05, 1e-4, work.dtype)))
        drops = {}
        for native in (True, False):  # the library's passes, and the torch ops (CUDA's path)
            fast_binning.USE_NATIVE = native
            for key, (scores, positive, valid) in drop_lists().items():
                size = scores.numel()
                cut = slice(rank * size // world, (rank + 1) * size // world)
                for rate in (0.1, 0.37, 0.5, 0.9):
                    drops[(key, rate, native)] = sharded_drop_mask(
                        scores[cut], positive[cut], valid[cut], rate
                    )
        fast_binning.USE_NATIVE = True
        errors = {}
        for key, kwargs in (("msap_sym", {"symmetric": True}), ("nan", {})):
            sim, rel, valid = make_matrix("smooth")
            sim = sim[rows].clone()
            if key == "nan" and rank == world - 1:
                sim[0, 0] = float("nan")
            try:
                build_loss("msap", **kwargs).double()(sim, rel[rows], valid[rows], sharded=True)
                errors[key] = None
            except ValueError as err:
                errors[key] = str(err)
        torch.save(
            {"results": results, "drops": drops, "errors": errors},
            os.path.join(out_dir, f"rank{rank}.pt"),
        )
        torch_dist.barrier()
    finally:
        torch_dist.destroy_process_group()


def _run(tmp_path: Path, world: int) -> list[dict]:
    mp.spawn(_worker, args=(world, str(tmp_path / "init"), str(tmp_path)), nprocs=world, join=True)
    return [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]


def _check(per_rank: list[dict], world: int) -> None:
    split = SPLITS[world]
    checked = set()
    for kind in ("smooth", "ties"):
        sim, rel, valid = make_matrix(kind)
        for key, (name, kwargs) in configs().items():
            if supports_sharding(build_loss(name, **kwargs)) is not None:
                assert kwargs.get("symmetric"), key  # only symmetric per-query losses opt out
                continue
            ref_loss, ref_grad, ref_params = loss_values(name, kwargs, sim, rel, valid, False)
            assert ref_grad.abs().max() > 0, (kind, key)
            outs = [r["results"][(kind, key)] for r in per_rank]
            for loss, _, _ in outs:
                torch.testing.assert_close(loss, ref_loss, rtol=0, atol=1e-10, msg=(kind, key))
            grad = torch.cat([g for _, g, _ in outs])
            assert [g.shape[0] for _, g, _ in outs] == split
            torch.testing.assert_close(grad, ref_grad, rtol=0, atol=1e-10, msg=(kind, key))
            for pname, ref in ref_params.items():
                total = sum(p[pname] for _, _, p in outs)
                assert ref.abs() > 0, (key, pname)
                torch.testing.assert_close(total, ref, rtol=0, atol=1e-10, msg=(kind, key, pname))
            checked.add(name)
    assert checked == set(available_losses())
    # The fast kernel's plan is the one-process plan of the concatenated list.
    sim, rel, valid = make_matrix("smooth")
    work, positive, ok = sim.reshape(-1), rel.reshape(-1), valid.reshape(-1)
    pos = work[positive & ok]
    reference = plan_grid(
        float(work.min()), float(work.max()), float(pos.min()), float(pos.max()), work.numel(),
        0.05, 1e-4, work.dtype, cache_tables=fast_binning.native_applicable(work, ok),
    )  # fmt: skip
    for r in per_rank:
        stats, plan = r["results"]["plan"]
        assert (stats["num_items"], stats["num_pos"]) == (work.numel(), pos.numel())
        assert plan == asdict(reference)
    assert {native for _, _, native in per_rank[0]["drops"]} == {True, False}
    for (key, rate, native), _ in per_rank[0]["drops"].items():
        scores, positive, valid = drop_lists()[key]
        keep = torch.cat([r["drops"][(key, rate, native)] for r in per_rank])
        # Reference: the exact path's sort-based drop over the list scores[valid] (flat order).
        ref_kept = drop_lowest_negatives(
            scores[valid][None], positive[valid][None], torch.ones_like(positive[valid])[None], rate
        )[0]
        assert torch.equal(keep[valid], ref_kept), (key, rate, native)
        assert not keep[~valid].any()
    for r in per_rank:
        assert "symmetric=True" in r["errors"]["msap_sym"]
        assert r["errors"]["nan"] is not None  # every rank raises, none waits forever
    assert "NaN" in per_rank[-1]["errors"]["nan"]
    assert "other rank" in per_rank[0]["errors"]["nan"]


@pytest.mark.ddp
def test_two_ranks_sharded_equal_one_process(tmp_path: Path):
    _check(_run(tmp_path, 2), 2)


@pytest.mark.ddp
@pytest.mark.slow
def test_three_ranks_sharded_equal_one_process(tmp_path: Path):
    _check(_run(tmp_path, 3), 3)


def test_sharded_call_needs_a_process_group():
    sim, rel, valid = make_matrix("smooth")
    with pytest.raises(RuntimeError, match="process group"):
        build_loss("gsap")(sim, rel, valid, sharded=True)
