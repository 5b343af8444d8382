"""Run identity: a fresh fit never touches a saved run; only a resume continues a W&B run.

Offline W&B runs are read back from their transaction logs (``tests/wandb_records.py``).
"""

from pathlib import Path

import pytest
import torch
from cluster_helpers import fit_argv
from wandb_records import offline_runs, read_run

from rl_gap.training.cli import run_lightning_cli
from rl_gap.training.run_folder import FreshFitGuard, choose_run_dir, run_versions


def _offline(argv):
    argv = list(argv)
    argv[argv.index("--wandb") + 1] = "offline"
    return argv


def _ckpt(path):
    return torch.load(path, map_location="cpu", weights_only=False)


def test_versions_and_choice(tmp_path):
    base = tmp_path / "seed0"
    assert choose_run_dir(base, "fit", None) == base  # nothing yet
    (base / "checkpoints").mkdir(parents=True)
    assert choose_run_dir(base, "fit", None) == base  # a folder without checkpoints is free
    (base / "checkpoints" / "last.ckpt").write_bytes(b"x")
    v2 = tmp_path / "seed0-v2"
    assert choose_run_dir(base, "fit", None) == v2
    assert choose_run_dir(base, "fit", "last") == base
    (v2 / "checkpoints").mkdir(parents=True)
    (tmp_path / "seed0-v10").mkdir()  # numeric order, not text order
    (tmp_path / "seed0-1a2b3c4d").mkdir()  # another configuration: not a version
    assert run_versions(base) == [base, v2, tmp_path / "seed0-v10"]
    assert choose_run_dir(base, "fit", "last") == tmp_path / "seed0-v10"
    assert choose_run_dir(base, "predict", None) == tmp_path / "seed0-v10"
    older = base / "checkpoints" / "last.ckpt"
    assert choose_run_dir(base, "fit", str(older)) == base  # resuming a file: its own version
    assert choose_run_dir(base, "validate", str(older)) == base
    (tmp_path / "seed0-v10" / "checkpoints").mkdir()
    (tmp_path / "seed0-v10" / "checkpoints" / "a.ckpt").write_bytes(b"x")
    assert choose_run_dir(base, "fit", None) == tmp_path / "seed0-v11"


def test_fit_refit_resume_predict_wandb_runs(run_dir, capsys):
    """fit -> the same fit again -> --ckpt_path last -> predict: four W&B runs, three ids."""
    argv = _offline(fit_argv(run_dir, None, epochs=1, batches=1))
    first = run_lightning_cli(["fit", *argv])
    root = Path(first.trainer.default_root_dir)
    saved = (root / "checkpoints" / "last.ckpt").read_bytes()
    first_id = _ckpt(root / "checkpoints" / "last.ckpt")["rl_gap"]["wandb_id"]

    again = run_lightning_cli(["fit", *argv])  # the same command, without --ckpt_path
    root2 = Path(again.trainer.default_root_dir)
    assert root2 == root.parent / f"{root.name}-v2"
    assert (root / "checkpoints" / "last.ckpt").read_bytes() == saved, "a saved run was touched"
    assert f"--ckpt_path {root / 'checkpoints' / 'last.ckpt'}" in capsys.readouterr().err
    second_id = _ckpt(root2 / "checkpoints" / "last.ckpt")["rl_gap"]["wandb_id"]
    assert second_id != first_id

    resumed = run_lightning_cli(["fit", *argv, "--ckpt_path", "last"])  # the newest version
    assert Path(resumed.trainer.default_root_dir) == root2
    assert resumed.trainer.global_step == 1  # restored, not retrained

    ckpt = root2 / "checkpoints" / "last.ckpt"
    run_lightning_cli(["predict", *argv, "--ckpt_path", str(ckpt)])
    runs = [read_run(p) for p in offline_runs(run_dir)]
    by_job = sorted((r["job_type"], r["id"]) for r in runs)
    assert [job for job, _ in by_job] == ["predict", "train", "train", "train"]
    train_ids = sorted(i for job, i in by_job if job == "train")
    assert train_ids == sorted([first_id, second_id, second_id])
    (pred,) = [r for r in runs if r["job_type"] == "predict"]
    assert pred["id"] not in (first_id, second_id)
    assert pred["group"] == second_id
    assert pred["config"]["eval.training_run_id"] == second_id
    assert pred["config"]["eval.ckpt_path"] == str(ckpt)
    fits = [r for r in runs if r["id"] == first_id]
    # the recipe, the seed and the keys the command line changed; a second version says so
    assert fits[0]["name"].startswith(f"{root.parent.name} seed0 backbone_kwargs.width=8 ")
    assert not fits[0]["name"].endswith("v2")
    refit = [r for r in runs if r["id"] == second_id]
    assert all(r["name"].endswith(" v2") for r in refit)
    # counts are summary values, not charted metrics
    history_keys = {k for r in runs for row in r["history"] for k in row}
    assert "val/gap" in history_keys and "val/num_pairs" not in history_keys
    assert fits[0]["summary"]["val/num_pairs"] == 9900  # 100 items: 100 x 99 pairs
    assert fits[0]["output"] > 0, "console capture is on (offline too)"


@pytest.mark.slow
def test_python_fit_without_checkpoint_refuses_a_used_folder(run_dir):
    argv = fit_argv(run_dir, "mine", epochs=1, batches=1)
    run_lightning_cli(["fit", *argv])
    last = run_dir / "mine" / "checkpoints" / "last.ckpt"
    saved = last.read_bytes()
    cli = run_lightning_cli(argv, run=False)  # fit's checkpoint is unknown at parse time
    assert any(isinstance(c, FreshFitGuard) for c in cli.trainer.callbacks)
    with pytest.raises(FileExistsError, match="holds checkpoints of an earlier run"):
        cli.trainer.fit(cli.model, cli.datamodule)
    assert last.read_bytes() == saved


def test_seedless_recipe_records_its_seed_and_resumes(run_dir):
    argv = fit_argv(run_dir, None, "--seed_everything", "true", epochs=1, batches=1)
    first = run_lightning_cli(["fit", *argv])
    root = Path(first.trainer.default_root_dir)
    assert root.name.startswith("seedauto")
    seed = _ckpt(root / "checkpoints" / "last.ckpt")["rl_gap"]["config"]["seed_everything"]
    assert isinstance(seed, int) and not isinstance(seed, bool)
    assert first.config.fit.seed_everything == seed
    resumed = run_lightning_cli(["fit", *argv, "--ckpt_path", "last"])
    assert Path(resumed.trainer.default_root_dir) == root
    assert resumed.config.fit.seed_everything == seed
    assert resumed.trainer.global_step == 1  # found and restored
