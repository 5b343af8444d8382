"""The distractor recipes end to end: one training step and a test on a tiny DISC21 fixture.

The logged test metrics are checked against scikit-learn on the model's own
embeddings of the fixture images (float64), so the roles, labels and
normalisation of the whole path (DataModule -> module -> callback) are checked.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.metrics import average_precision_score

from rl_gap.training.cli import run_lightning_cli
from tests.data.test_distractor_layouts import make_disc21, make_ilias, make_met, make_wildlife

RECIPES = Path(__file__).resolve().parents[2] / "recipes" / "distractor"
TINY = [
    "--model.init_args.backbone", "rl_gap_convnet", "--model.init_args.backbone_kwargs",
    "{width: 4}", "--model.init_args.dim", "8", "--model.init_args.weights", "null",
    "--model.init_args.eval_plots", "false", "--trainer.accelerator", "cpu",
    "--trainer.devices", "1", "--trainer.strategy", "auto", "--trainer.precision", "32",
    "--data.init_args.batch_size", "4", "--data.init_args.eval_batch_size", "64",
    "--data.init_args.num_workers", "0", "--data.init_args.image_size", "16",
    "--wandb", "off",
]  # fmt: skip


def _embed(model, dataset) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return model(torch.stack([dataset[i][0] for i in range(len(dataset))])).double()


def test_disc21_recipe_fit_one_step_then_test(tmp_path, run_dir):
    root = make_disc21(tmp_path / "disc21")
    common = ["--config", str(RECIPES / "disc21_gsap.yaml"), "--data.init_args.root", str(root),
              "--data.init_args.background_size", "null", "--output_dir", str(run_dir), *TINY]  # fmt: skip
    cli = run_lightning_cli(["fit", *common, "--trainer.max_steps", "1",
                             "--trainer.check_val_every_n_epoch", "1"])  # fmt: skip
    assert cli.trainer.global_step == 1
    assert float(cli.trainer.callback_metrics["val/num_distractor_queries"]) == 3
    ckpt = Path(cli.trainer.checkpoint_callback.last_model_path)
    cli = run_lightning_cli(["test", *common, "--ckpt_path", str(ckpt)])
    got = {k: float(v) for k, v in cli.trainer.callback_metrics.items()}
    test = cli.datamodule.datasets["test"]
    emb = _embed(cli.model, test)
    q, d, b = emb[:6], emb[6:10], emb[10:]  # 6 queries, 4 references, 6 training images
    scores = (q @ d.T).numpy()
    rel = np.zeros((6, 4), dtype=bool)
    rel[0, 2] = rel[1, 0] = rel[4, 2] = True  # the fixture's ground truth
    pos = rel.any(1)
    offsets = np.sort((q @ b.T).numpy(), axis=1)[:, ::-1][:, :3].mean(1)  # SSCD: top-3 mean
    normed = scores - offsets[:, None]
    tol = 1e-5  # the model's float32 embeddings vs their float64 copy here
    assert got["test/gap"] == pytest.approx(
        average_precision_score(rel.ravel(), scores.ravel()), abs=tol
    )
    assert got["test/gap_no_distractors"] == pytest.approx(
        average_precision_score(rel[pos].ravel(), scores[pos].ravel()), abs=tol
    )
    ap = [average_precision_score(r, s) for r, s in zip(rel[pos], scores[pos])]
    assert got["test/map"] == pytest.approx(np.mean(ap), abs=tol)
    assert got["test/norm_gap"] == pytest.approx(
        average_precision_score(rel.ravel(), normed.ravel()), abs=tol
    )
    assert got["test/num_distractor_queries"] == 3 and got["test/num_queries"] == 6


def test_missing_dataset_names_the_layout(tmp_path, run_dir):
    for recipe, missing, expected in (
        ("disc21_gsap.yaml", "no_disc21", "val_groundtruth_matches.csv"),
        ("met_gsap.yaml", "no_met", "MET_database.json"),
        ("wildlife_gsap.yaml", "no_wildlife", "metadata.csv"),
    ):
        argv = ["fit", "--config", str(RECIPES / recipe), "--data.init_args.root",
                str(tmp_path / missing), "--output_dir", str(run_dir), *TINY]  # fmt: skip
        with pytest.raises(FileNotFoundError, match=missing) as info:
            run_lightning_cli(argv)
        assert expected in str(info.value)
    argv = ["fit", "--config", str(RECIPES / "ilias_gsap.yaml"), "--data.init_args.root",
            str(tmp_path / "no_ilias"), "--data.init_args.train", str(tmp_path),
            "--output_dir", str(run_dir), *TINY]  # fmt: skip
    with pytest.raises(FileNotFoundError, match="no_ilias") as info:
        run_lightning_cli(argv)
    assert "core/<instance_id>/pos" in str(info.value)


@pytest.mark.parametrize("recipe", sorted(RECIPES.glob("*.yaml")), ids=lambda p: p.stem)
def test_recipes_parse_with_paper_values(recipe):
    cli = run_lightning_cli(["--config", str(recipe), *TINY], run=False)
    assert cli.model.loss_config["name"] == "gsap"
    assert cli.model.loss_fn.temperature == 0.001  # paper §C.4
    assert cli.model.loss_fn.neg_drop == 0.9  # paper §C.4


@pytest.mark.parametrize(
    "recipe, make, extra, queries, distractors",
    [
        ("wildlife_gsap.yaml", make_wildlife, [], 4, 2),
        ("met_gsap.yaml", make_met, [], 4, 2),
        ("ilias_gsap.yaml", make_ilias, ["--data.init_args.train", "{root}/train",
                                         "--data.init_args.background", "{root}/distractors"], 3, 1),
    ],
    ids=["wildlife", "met", "ilias"],
)  # fmt: skip
def test_recipe_fast_dev_run(tmp_path, run_dir, recipe, make, extra, queries, distractors):
    root = make(tmp_path / "data")
    cli = run_lightning_cli(
        ["fit", "--config", str(RECIPES / recipe), "--data.init_args.root", str(root),
         "--output_dir", str(run_dir), "--trainer.fast_dev_run", "true", *TINY,
         *[a.format(root=root) for a in extra]]
    )  # fmt: skip
    metrics = {k: float(v) for k, v in cli.trainer.callback_metrics.items()}
    assert metrics["val/num_distractor_queries"] == distractors
    assert metrics["val/num_queries"] == queries
    assert 0 < metrics["val/gap"] <= metrics["val/gap_no_distractors"] <= 1
    assert ("val/norm_gap" in metrics) == ("ilias" in recipe)  # the ILIAS recipe normalises


def test_mnist_distractor_demo_vs_sklearn(run_dir):
    cli = run_lightning_cli(
        ["fit", "--config", str(RECIPES.parent / "demo" / "mnist_distractor_gsap.yaml"),
         "--output_dir", str(run_dir), "--trainer.fast_dev_run", "true", "--wandb", "off",
         "--model.init_args.eval_plots", "false", "--model.init_args.backbone_kwargs", "{width: 4}",
         "--data.init_args.queries_per_digit", "10", "--data.init_args.background_size", "50",
         "--data.init_args.eval_batch_size", "2000"]
    )  # fmt: skip
    got = {k: float(v) for k, v in cli.trainer.callback_metrics.items()}
    assert got["val/num_queries"] == 50 and got["val/num_distractor_queries"] == 20
    dataset, roles = cli.datamodule.datasets["test"], cli.datamodule.evaluation_roles("test")
    emb = _embed(cli.model, dataset)
    labels = dataset.labels
    q, d, b = emb[roles == 0], emb[roles == 1], emb[roles == 2]
    assert len(b) == 50 and set(labels[roles == 0].tolist()) == {5, 6, 7, -1}
    flat = dataset.images.flatten(1)
    same = (flat[roles == 0][:, None] == flat[roles == 1][None]).all(-1)
    assert not bool(same.any()), "a query image is also in the database"
    rel = (labels[roles == 0][:, None] == labels[roles == 1][None, :]).numpy()
    scores = (q @ d.T).numpy()
    offsets = np.sort((q @ b.T).numpy(), axis=1)[:, ::-1][:, :3].mean(1)
    pos = rel.any(1)
    tol = 2e-4  # 73,500 pairs scored in float32 by the engine: near-ties vs this float64 copy
    assert got["val/gap"] == pytest.approx(
        average_precision_score(rel.ravel(), scores.ravel()), abs=tol
    )
    assert got["val/gap_no_distractors"] == pytest.approx(
        average_precision_score(rel[pos].ravel(), scores[pos].ravel()), abs=tol
    )
    normed = scores - offsets[:, None]
    assert got["val/norm_gap"] == pytest.approx(
        average_precision_score(rel.ravel(), normed.ravel()), abs=tol
    )
