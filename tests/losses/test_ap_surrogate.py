"""The six AP-surrogate losses as drop-in losses: global = per-query on the flattened row,
input checks, bf16 autocast, memory bounds (no P × M tensor), recipe configuration."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from surrogate_refs import flat_one_row, make_batch, value_and_grad

from rl_gap.losses import build_loss, loss_from_config
from rl_gap.losses.ap_surrogate import APSurrogateLoss
from tests.losses.sap_refs import LargestTensor

PER_QUERY = ["softbin", "blackbox", "supap"]
GLOBAL = ["gsoftbin", "gblackbox", "gsupap"]
ALL = PER_QUERY + GLOBAL


def metric_batch(batch: int = 64, seed: int = 9):
    gen = torch.Generator().manual_seed(seed)
    emb = torch.nn.functional.normalize(torch.randn(batch, 8, generator=gen), dim=1)
    labels = torch.arange(batch) // 4
    return emb, labels.unsqueeze(1) == labels.unsqueeze(0), ~torch.eye(batch, dtype=torch.bool)


@pytest.mark.parametrize("name", PER_QUERY)
def test_global_equals_per_query_on_the_flattened_one_row_matrix(name):
    sim, rel, valid = make_batch(seed=17, q=8, d=9)
    value, grad = value_and_grad(build_loss("g" + name, neg_drop=0.25), sim, rel, valid)
    flat, flat_rel, flat_valid = flat_one_row(sim, rel, valid)
    one_value, one_grad = value_and_grad(
        build_loss(name, neg_drop=0.25), flat, flat_rel, flat_valid
    )
    torch.testing.assert_close(value, one_value, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(grad[valid], one_grad[0], rtol=1e-12, atol=1e-14)
    assert (grad[~valid] == 0).all()
    # and it differs from the per-query mean: the lists are not the same
    assert abs(float(value) - float(build_loss(name)(sim, rel, valid))) > 1e-3


@pytest.mark.parametrize("name", ALL)
def test_bad_inputs_and_no_positive_batch(name):
    sim, rel, valid = make_batch(seed=2)
    loss_fn = build_loss(name)
    with pytest.raises(ValueError, match="2-D"):
        loss_fn(sim[0], rel[0], valid[0])
    with pytest.raises(ValueError, match="rel shape"):
        loss_fn(sim, rel[:, :3], valid)
    with pytest.raises(ValueError, match="bool"):
        loss_fn(sim, rel.float(), valid)
    bad = sim.clone()
    bad[1, 1] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        loss_fn(bad, rel, valid)
    leaf = sim.clone().requires_grad_(True)
    with pytest.warns(UserWarning, match="no valid positive"):
        loss = loss_fn(leaf, torch.zeros_like(rel), valid)
    loss.backward()
    assert float(loss.detach()) == 0.0 and (leaf.grad == 0).all()


@pytest.mark.parametrize(
    ("name", "kwargs", "message"),
    [
        ("softbin", {"num_bins": 0}, "num_bins"),
        ("gsoftbin", {"num_bins": 2.5}, "num_bins"),
        ("softbin", {"sim_range": (1.0, -1.0)}, "lo < hi"),
        ("gsoftbin", {"sim_range": "x"}, "sim_range"),
        ("blackbox", {"lambda_val": 0.0}, "lambda_val"),
        ("gblackbox", {"margin": -0.1}, "margin"),
        ("supap", {"temperature": 0.0}, "temperature"),
        ("gsupap", {"rho": -1.0}, "rho"),
        ("supap", {"offset": float("inf")}, "offset"),
        ("gsupap", {"chunk_size": 0}, "chunk_size"),
        ("softbin", {"neg_drop": 1.0}, "neg_drop"),
    ],
)
def test_bad_hyper_parameters(name, kwargs, message):
    with pytest.raises(ValueError, match=message):
        build_loss(name, **kwargs)


@pytest.mark.parametrize("name", ALL)
def test_bf16_autocast_ranks_in_float32(name):
    emb, rel, valid = metric_batch(batch=24)
    emb = emb.requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        sim = emb @ emb.T  # bf16 under autocast
        loss = build_loss(name)(sim, rel, valid)
    loss.backward()
    assert sim.dtype == torch.bfloat16 and loss.dtype == torch.float32
    assert torch.isfinite(emb.grad).all()
    # the same bf16 similarities ranked in float64 outside autocast
    reference = build_loss(name)(sim.detach().double(), rel, valid)
    assert float(loss.detach()) == pytest.approx(float(reference), abs=1e-5)


@pytest.mark.parametrize("name", ALL)
def test_float32_gradient_unchanged_by_autocast(name):
    """Autocast must not push the losses' internal products (e.g. SupAP's) to bf16."""
    emb, rel, valid = metric_batch(batch=24, seed=3)
    sim = (emb @ emb.T).float()
    plain = value_and_grad(build_loss(name), sim, rel, valid)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = value_and_grad(build_loss(name), sim, rel, valid)
    torch.testing.assert_close(mixed[0], plain[0], rtol=0, atol=0)
    torch.testing.assert_close(mixed[1], plain[1], rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("name", GLOBAL)
def test_global_losses_never_materialise_pairs_by_pairs(name):
    emb, rel, valid = metric_batch(batch=48)
    sim = emb @ emb.T
    num_items, num_pos = int(valid.sum()), int((rel & valid).sum())  # M = 2256, P = 144
    kwargs = {"chunk_size": 4} if name == "gsupap" else {}
    leaf = sim.clone().requires_grad_(True)
    with LargestTensor() as mode:
        build_loss(name, **kwargs)(leaf, rel, valid).backward()
    bound = 4 * num_items if name == "gsupap" else sim.numel()
    assert mode.numel <= bound < num_pos * num_items // 30


def test_supap_per_query_chunks_rows():
    emb, rel, valid = metric_batch(batch=48)
    leaf = (emb @ emb.T).requires_grad_(True)
    with LargestTensor() as mode:
        build_loss("supap", chunk_size=2)(leaf, rel, valid).backward()
    assert mode.numel <= leaf.numel() < 48 * 3 * 48  # not rows × K × D


def test_recipe_section_selects_and_configures_the_new_losses():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every key below is taken by the chosen loss
        gsoft = loss_from_config({"name": "gsoftbin", "num_bins": 20, "neg_drop": 0.5})
        gbb = loss_from_config({"name": "gblackbox", "lambda_val": 2.0, "margin": 0.0})
        gsup = loss_from_config({"name": "gsupap", "temperature": 0.02, "rho": 50.0})
    assert (type(gsoft).__name__, gsoft.num_bins, gsoft.neg_drop) == (
        "GlobalSoftBinAPLoss",
        20,
        0.5,
    )
    assert (gbb.lambda_val, gbb.margin, gsup.temperature, gsup.rho) == (2.0, 0.0, 0.02, 50.0)
    with pytest.raises(ValueError, match=r"does not take \['temperature'\]"):
        loss_from_config({"name": "softbin", "temperature": 0.01})
    swapped = loss_from_config({"name": "softbin", "gsap": {"temperature": 0.01}})
    assert type(swapped).__name__ == "SoftBinAPLoss"
    with pytest.raises(ValueError, match="does not take.*num_bin"):
        loss_from_config({"name": "gsoftbin", "num_bin": 20})


RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "demo" / "mnist_gsap.yaml"


def test_recipe_loss_swap_by_one_flag_builds_the_new_losses():
    """``--model.loss.name gsoftbin`` on a recipe: parsed and instantiated with its own values."""
    from rl_gap.training.cli import run_lightning_cli

    argv = ["--config", str(RECIPE), "--wandb", "off"]
    cli = run_lightning_cli(
        argv + ["--model.loss.name", "gsoftbin", "--model.loss.num_bins", "20"], run=False
    )
    assert type(cli.model.loss_fn).__name__ == "GlobalSoftBinAPLoss"
    assert (cli.model.loss_fn.num_bins, cli.model.loss_fn.neg_drop) == (20, 0.0)
    cli = run_lightning_cli(
        argv + ["--model.loss.name", "gsupap", "--model.loss.rho", "50"], run=False
    )
    assert type(cli.model.loss_fn).__name__ == "GlobalSupAPLoss"
    assert (cli.model.loss_fn.temperature, cli.model.loss_fn.rho) == (0.01, 50.0)  # its defaults


@pytest.mark.parametrize("name", ["gsoftbin", "gblackbox", "gsupap"])
def test_fast_dev_run_trains_with_the_global_surrogates(name, run_dir):
    from rl_gap.training.cli import run_lightning_cli

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # recipe keys a loss does not take
        cli = run_lightning_cli(
            ["fit", "--config", str(RECIPE), "--trainer.fast_dev_run", "true",
             "--output_dir", str(run_dir), "--data.init_args.eval_batch_size", "120",
             "--model.init_args.eval_plots", "false", "--model.loss.name", name]
        )  # fmt: skip
    assert cli.trainer.state.finished
    assert 0.0 < float(cli.trainer.callback_metrics["val/gap"]) <= 1.0


def _mean_score_ap(scores, positive, valid, shift):
    """A toy family's kernel: the mean positive score of each row, plus ``shift``."""
    return (scores * positive).sum(1) / positive.sum(1) + shift


class _ToyFamily(APSurrogateLoss):
    """A family that names only a one-process kernel."""

    list_kernel = staticmethod(_mean_score_ap)

    def __init__(self, shift: float = 0.0, neg_drop: float = 0.0, symmetric: bool = False):
        super().__init__(neg_drop=neg_drop, symmetric=symmetric)
        self.shift = shift

    def kernel_args(self):
        return (self.shift,)

    def settings(self):
        return {"shift": self.shift}


class _GlobalToyFamily(_ToyFamily):
    global_ranking = True


def test_a_family_is_its_kernel_its_settings_and_whether_it_has_a_sharded_kernel():
    sim = torch.tensor([[0.9, 0.2, 0.4], [0.1, 0.8, 0.3]])
    rel = torch.tensor([[True, False, True], [False, True, False]])
    # per query: rows (0.9 + 0.4)/2 and 0.8, shifted by 0.5; global: (0.9 + 0.4 + 0.8)/3 + 0.5
    assert float(_ToyFamily(shift=0.5)(sim, rel)) == pytest.approx(1 - (0.65 + 0.8) / 2 - 0.5)
    assert float(_GlobalToyFamily(shift=0.5)(sim, rel)) == pytest.approx(1 - 0.7 - 0.5)
    assert repr(_ToyFamily(shift=0.5)) == "_ToyFamily(shift=0.5, neg_drop=0.0, symmetric=False)"
    assert repr(_GlobalToyFamily()) == "_GlobalToyFamily(shift=0.0, neg_drop=0.0)"
    assert _ToyFamily().sharding_unsupported() is None  # per query: the kernel on row sums
    assert _GlobalToyFamily().sharding_unsupported() == (
        "_GlobalToyFamily has no sharded global ranking"
    )
    for name in GLOBAL:
        assert build_loss(name).sharding_unsupported() is None
