"""``rl-gap fit`` on the demo recipes: fast_dev_run, one-key loss swap, typo'd keys, bad paths, outputs."""

from pathlib import Path

import pytest
import yaml

from rl_gap.losses import get_loss_class
from rl_gap.training.cli import run_lightning_cli
from rl_gap.training.run_config import run_dir_for

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
DEMO = {loss: RECIPES / "demo" / f"mnist_{loss}.yaml" for loss in ("gsap", "msap", "infonce")}


@pytest.mark.parametrize("loss", sorted(DEMO))
def test_fast_dev_run_of_every_demo_recipe(loss, run_dir):
    cli = run_lightning_cli(
        ["fit", "--config", str(DEMO[loss]), "--trainer.fast_dev_run", "true",
         "--output_dir", str(run_dir), "--data.init_args.eval_batch_size", "120",
         "--model.init_args.eval_plots", "false"]
    )  # fmt: skip
    assert cli.trainer.state.finished
    assert type(cli.model.loss_fn) is get_loss_class(loss)
    metrics = cli.trainer.callback_metrics
    assert 0.0 < float(metrics["val/gap"]) <= 1.0 and 0.0 < float(metrics["val/map"]) <= 1.0


def _parse(argv):
    return run_lightning_cli(argv + ["--wandb", "off"], run=False)


def test_one_flag_swaps_the_loss_and_keeps_the_rest():
    cli = _parse(["--config", str(DEMO["gsap"]), "--model.loss.name", "msap"])
    assert type(cli.model.loss_fn) is get_loss_class("msap")
    assert (cli.model.loss_fn.temperature, cli.model.loss_fn.neg_drop) == (0.01, 0.0)
    cli = _parse(["--config", str(DEMO["gsap"]), "--model.loss.temperature", "0.002"])
    assert cli.model.loss_fn.temperature == pytest.approx(0.002)
    cli = _parse(["--config", str(DEMO["gsap"]), "--model.loss.name", "infonce"])
    assert type(cli.model.loss_fn) is get_loss_class("infonce")
    assert cli.model.loss_fn.temperature == 0.05  # InfoNCE's own table, not gSAP's 0.01


def _typo_recipe(tmp_path, section, key):
    config = yaml.safe_load(DEMO["gsap"].read_text())
    config[section]["init_args"][key] = 1
    path = tmp_path / "typo.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.parametrize("section, key", [("model", "dimm"), ("data", "batchsize")])
def test_typo_in_recipe_is_rejected(tmp_path, capsys, section, key):
    with pytest.raises(SystemExit):
        _parse(["--config", str(_typo_recipe(tmp_path, section, key))])
    assert key in capsys.readouterr().err


def test_typo_on_command_line_is_rejected(capsys):
    with pytest.raises(SystemExit):
        _parse(["--config", str(DEMO["gsap"]), "--trainer.max_epoch", "3"])
    assert "max_epoch" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _parse(["--config", str(DEMO["gsap"]), "--model.loss.name", "gsp"])
    assert "unknown loss 'gsp'" in capsys.readouterr().err


def test_bad_dataset_path_names_path_and_layout(tmp_path):
    missing = tmp_path / "no_sop_here"
    argv = [
        "fit", "--config", str(RECIPES / "metric_learning" / "sop_gsap.yaml"),
        "--data.init_args.root", str(missing), "--model.init_args.backbone", "rl_gap_convnet",
        "--trainer.accelerator", "cpu", "--trainer.devices", "1", "--trainer.strategy", "auto",
        "--trainer.precision", "32", "--output_dir", str(tmp_path), "--wandb", "off",
    ]  # fmt: skip
    with pytest.raises(FileNotFoundError, match="no_sop_here") as info:
        run_lightning_cli(argv)
    assert "Ebay_train.txt" in str(info.value)


def test_outputs_csv_wandb_offline_checkpoints(run_dir, capsys, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    cli = run_lightning_cli(
        ["fit", "--config", str(DEMO["gsap"]), "--output_dir", str(run_dir),
         "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2",
         "--trainer.limit_val_batches", "1", "--trainer.check_val_every_n_epoch", "1",
         "--data.init_args.eval_batch_size", "100", "--model.init_args.eval_plots", "false"]
    )  # fmt: skip
    root = Path(cli.trainer.default_root_dir)
    # overrides that change training: a folder of their own under the recipe's
    assert root.parent == run_dir / "demo" / "mnist_gsap" and root.name.startswith("seed0-")
    header, row = (root / "version_0" / "metrics.csv").read_text().splitlines()
    metrics = dict(zip(header.split(","), row.split(",")))
    assert 0 < float(metrics["val/gap"]) < 1 and float(metrics["val/num_queries"]) == 100
    assert (
        yaml.safe_load((root / "version_0" / "config.yaml").read_text())["trainer"]["max_epochs"]
        == 1
    )
    assert (root / "wandb_id").is_file()
    assert (root / "checkpoints" / "last.ckpt").is_file()
    # what rl-gap knn / linear-probe read to load the right module class
    from rl_gap.commands.knn import checkpoint_module_class

    recorded = checkpoint_module_class(root / "checkpoints" / "last.ckpt")
    assert recorded == "rl_gap.modules.MetricLearningModule"  # as the recipe names it
    assert 0 <= float(metrics["val/knn_top1"]) <= 1 and 0 < float(metrics["val/map@r"]) < 1
    offline = list((root / "wandb").glob("offline-run-*"))
    assert len(offline) == 1, "W&B must run offline inside the run folder"
    captured = capsys.readouterr()
    out = captured.out
    assert f"rl-gap outputs in {root}" in out and "wandb sync" in out and "last.ckpt" in out
    # one line says which W&B mode and why; no third-party tips or W&B warnings
    assert "W&B: offline (" in captured.err
    assert "litlogger" not in out + captured.err and "anonymous" not in out + captured.err
    from tests.wandb_records import read_run

    run = read_run(offline[0])
    run_id = (root / "wandb_id").read_text().strip()
    assert run["group"] == run_id == (root / "wandb_group").read_text().strip()
    assert run["name"] == (
        "mnist_gsap seed0 check_val_every_n_epoch=1 limit_train_batches=2 "
        "limit_val_batches=1 max_epochs=1"
    )


def test_run_dir_naming():
    assert run_dir_for(["recipes/metric_learning/sop_gsap.yaml"], "runs", None) == Path(
        "runs/metric_learning/sop_gsap"
    )
    assert run_dir_for(["recipes/metric_learning/sop_gsap.yaml"], "runs", None, 0) == Path(
        "runs/metric_learning/sop_gsap/seed0"
    )
    assert run_dir_for(["a/b.yaml"], "out", None, 2, "0123abcd") == Path("out/a/b/seed2-0123abcd")
    assert run_dir_for(["a/b.yaml"], "out", None, False) == Path("out/a/b/noseed")
    assert run_dir_for(["a/b.yaml"], "out", "mine", 0, "0123abcd") == Path("out/mine")


@pytest.mark.parametrize(
    "recipe",
    sorted([*(RECIPES / "metric_learning").glob("sop_*.yaml"),
            *(RECIPES / "metric_learning").glob("inat_*.yaml")]),
    ids=lambda p: p.stem,
)  # fmt: skip
def test_paper_recipes_parse(recipe):
    cpu = ["--trainer.accelerator", "cpu", "--trainer.devices", "1", "--trainer.strategy", "auto",
           "--trainer.precision", "32", "--model.init_args.backbone", "rl_gap_convnet"]  # fmt: skip
    cli = _parse(["--config", str(recipe), *cpu])
    dataset, loss = recipe.stem.split("_")
    assert type(cli.model.loss_fn) is get_loss_class(loss)
    assert cli.datamodule.batch_size == 4000 and cli.datamodule.m_per_class == 4
    assert cli.datamodule.queries_per_class == (4 if dataset == "inat" else None)
    assert cli.trainer.fit_loop.max_epochs == 100


def test_recipe_checkpoint_goes_to_the_run_folder(tmp_path):
    cpu = ["--trainer.accelerator", "cpu", "--trainer.devices", "1", "--trainer.strategy", "auto",
           "--trainer.precision", "32", "--model.init_args.backbone", "rl_gap_convnet"]  # fmt: skip
    recipe = RECIPES / "metric_learning" / "sop_gsap.yaml"
    cli = _parse(["--config", str(recipe), "--output_dir", str(tmp_path), *cpu])
    (ckpt,) = cli.trainer.checkpoint_callbacks
    assert ckpt.monitor == "val/gap" and ckpt.save_last
    root = Path(cli.trainer.default_root_dir)
    assert root.parent == tmp_path / "metric_learning" / "sop_gsap"
    assert ckpt.dirpath == str(root / "checkpoints")
