"""Checkpoint resolution owned by the run: never a silent untrained model or a silent fresh start.

One tiny MNIST fit (1 epoch x 2 steps, ``--model.init_args.lr 0.002`` so its folder is
``seed0-<hash>``) is copied into each test's output folder; each command is then run as a
user would type it and checked against what the run folder holds.
"""

import shutil
from pathlib import Path

import pytest
import torch
from cluster_helpers import fit_argv, load

from rl_gap.training.cli import run_lightning_cli

LR = ["--model.init_args.lr", "0.002"]
STEPS = 2


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(output folder, run folder) of a finished 1-epoch fit with an lr override."""
    out = tmp_path_factory.mktemp("trained")
    cli = run_lightning_cli(["fit", *fit_argv(out, None, *LR, epochs=1, batches=STEPS)])
    assert cli.trainer.global_step == STEPS
    return out, Path(cli.trainer.default_root_dir)


@pytest.fixture
def copy(trained, tmp_path):
    out, root = trained
    shutil.copytree(out, tmp_path / "out")
    return tmp_path / "out", tmp_path / "out" / root.relative_to(out)


def _newest_last(root):
    # a copied run folder: Lightning's ModelCheckpoint writes last-v1.ckpt next to the
    # last.ckpt it does not recognise as its own (its recorded path is the original's)
    return max((root / "checkpoints").glob("last*.ckpt"), key=lambda p: p.stat().st_mtime)


def _exit(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        run_lightning_cli(argv)
    return exit_info.value.code, capsys.readouterr().err


def _eval_argv(out, *extra):
    return [*fit_argv(out, None, epochs=1, batches=STEPS), *extra]


@pytest.mark.parametrize("command", ["validate", "test", "predict"])
def test_eval_without_checkpoint_is_refused_unless_initial_weights(copy, capsys, command):
    out, root = copy
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    code, err = _exit([command, *_eval_argv(out, *LR)], capsys)
    assert code == 2
    assert err.strip().splitlines()[-1] == (
        f"rl-gap: error: rl-gap {command} needs a trained model: pass --ckpt_path last (this "
        "configuration's run) or --ckpt_path <file>; to evaluate the model as built (random "
        "or pretrained initial weights) pass --initial_weights true"
    )
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before  # nothing written


def test_eval_with_initial_weights_runs_in_a_folder_of_its_own(copy):
    out, root = copy
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    cli = run_lightning_cli(
        [
            "predict",
            *_eval_argv(
                out, *LR, "--initial_weights", "true", "--trainer.limit_predict_batches", "1"
            ),
        ]
    )
    # never into (or over) the trained run's folder: its embeddings stay the trained model's
    assert cli.trainer.ckpt_path is None
    assert Path(cli.trainer.default_root_dir) == root.with_name(root.name + "-initial")
    assert (root.with_name(root.name + "-initial") / "embeddings").is_dir()
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before
    named = run_lightning_cli(["validate", *_eval_argv(out, "--initial_weights", "true",
                                                       "--run_name", "init")])  # fmt: skip
    assert Path(named.trainer.default_root_dir) == out / "init"


@pytest.mark.parametrize("command", ["validate", "test", "predict"])
def test_eval_last_without_the_fits_override_refuses_naming_the_run(copy, capsys, command):
    out, root = copy
    code, err = _exit([command, *_eval_argv(out, "--ckpt_path", "last")], capsys)
    assert code == 2
    assert "--ckpt_path last: no checkpoint of this configuration in" in err
    assert (
        f"{root / 'checkpoints' / 'last.ckpt'} (differs in model.init_args.lr: 0.001 -> "
        "0.002" not in err
    )  # the candidate's value first, this command's second
    assert (
        f"{root / 'checkpoints' / 'last.ckpt'} (differs in model.init_args.lr: 0.002 -> 0.001)"
        in err
    )
    assert "give the same overrides as the fit that wrote it" in err


def test_eval_last_with_the_fits_override_uses_its_checkpoint(copy):
    out, root = copy
    cli = run_lightning_cli(["validate", *_eval_argv(out, *LR, "--ckpt_path", "last")])
    assert Path(cli.trainer.ckpt_path) == root / "checkpoints" / "last.ckpt"
    assert Path(cli.trainer.default_root_dir) == root


def test_empty_newer_version_does_not_hide_the_checkpoint(copy):
    out, root = copy
    empty = root.with_name(root.name + "-v2")
    (empty / "version_0").mkdir(parents=True)  # a relaunch stopped while it started
    (empty / ".rl_gap.lock").write_text("")
    argv = fit_argv(out, None, *LR, epochs=2, batches=STEPS)  # 2 epochs: continue the run
    cli = run_lightning_cli(["fit", *argv, "--ckpt_path", "last"])
    assert Path(cli.trainer.default_root_dir) == root
    assert cli.trainer.global_step == 2 * STEPS  # resumed at step 2, not trained from 0
    assert not (empty / "checkpoints").exists()


def test_requeue_with_lightnings_hpc_checkpoint_resumes(copy, capsys):
    out, root = copy
    # what SLURMEnvironment(auto_requeue=True) leaves before a requeue
    hpc = root / "hpc_ckpt_1.ckpt"
    (root / "checkpoints" / "last.ckpt").rename(hpc)
    for other in (root / "checkpoints").glob("*.ckpt"):
        other.unlink()
    saved = load(hpc)
    argv = fit_argv(out, None, *LR, epochs=1, batches=STEPS)
    cli = run_lightning_cli(["fit", *argv])  # the documented requeue: the same command
    assert "holds Lightning's hpc_ckpt (a requeued job): resuming" in capsys.readouterr().err
    assert Path(cli.trainer.ckpt_path) == hpc and Path(cli.trainer.default_root_dir) == root
    assert cli.trainer.global_step == STEPS  # restored (the run had finished its epoch)
    for name, value in cli.model.state_dict().items():  # its weights, not fresh ones
        assert torch.equal(value, saved["state_dict"][name]), name
    assert not root.with_name(root.name + "-v2").exists()


def test_changed_max_epochs_continues_the_same_run_and_records_it(copy, capsys):
    out, root = copy
    wandb_id = load(root / "checkpoints" / "last.ckpt")["rl_gap"]["wandb_id"]
    argv = fit_argv(out, None, *LR, epochs=2, batches=STEPS)  # max_epochs 1 -> 2
    cli = run_lightning_cli(["fit", *argv, "--ckpt_path", "last"])
    err = capsys.readouterr().err
    assert (
        f"continuing the run in {root} from last.ckpt with trainer.check_val_every_n_epoch"
        " 1 -> 2, trainer.max_epochs 1 -> 2" in err
    )
    assert Path(cli.trainer.default_root_dir) == root
    assert cli.trainer.global_step == 2 * STEPS
    record = load(_newest_last(root))["rl_gap"]
    assert record["wandb_id"] == wandb_id  # one run, one id
    assert record["config"]["trainer.max_epochs"] == 2
    assert record["changes"] == [{"step": STEPS, "keys": {
        "trainer.check_val_every_n_epoch": [1, 2], "trainer.max_epochs": [1, 2]}}]  # fmt: skip
    # the next requeue of the new command finds the run again (its own config now)
    from rl_gap.training.run_checkpoint import resolve_last

    again = resolve_last("fit", root.with_name("seed0-00000000"), record["config"], True)
    assert again.root == root and again.changed == {}


def test_changed_objective_with_last_refuses_with_keys_and_the_new_run_command(copy, capsys):
    out, root = copy
    argv = fit_argv(out, None, "--model.init_args.lr", "0.01", epochs=1, batches=STEPS)
    code, err = _exit(["fit", *argv, "--ckpt_path", "last"], capsys)
    assert code == 2
    assert "(differs in model.init_args.lr: 0.002 -> 0.01)" in err
    assert (
        "to start this configuration as a new run, run the same command without --ckpt_path" in err
    )
    assert sorted(p.name for p in root.parent.iterdir()) == [root.name]  # nothing started


def test_first_launch_with_last_starts_the_run_and_says_so(tmp_path, capsys):
    argv = fit_argv(tmp_path, "fresh", epochs=1, batches=1)
    cli = run_lightning_cli(["fit", *argv, "--ckpt_path", "last"])
    assert cli.trainer.global_step == 1
    assert (
        f"no checkpoint of this run yet; starting it in {tmp_path / 'fresh'}"
        in capsys.readouterr().err
    )


def test_resumed_file_of_another_configuration_continues_in_its_own_folder(copy):
    out, root = copy
    ckpt = root / "checkpoints" / "last.ckpt"
    argv = fit_argv(out, None, *LR, "--model.loss.gsap.temperature", "0.02", epochs=2,
                    batches=STEPS)  # fmt: skip
    cli = run_lightning_cli(["fit", *argv, "--ckpt_path", str(ckpt), "--force_resume", "true"])
    assert Path(cli.trainer.default_root_dir) == root  # not a -v2 or another hash folder
    assert sorted(p.name for p in root.parent.iterdir()) == [root.name]
    assert cli.model.loss_fn.temperature == pytest.approx(0.02)  # the new value is applied


def test_force_resume_refuses_an_lr_the_optimizer_state_would_override(copy, capsys):
    out, root = copy
    ckpt = root / "checkpoints" / "last.ckpt"
    argv = fit_argv(out, None, "--model.init_args.lr", "0.1", epochs=2, batches=STEPS)
    code, err = _exit(["fit", *argv, "--ckpt_path", str(ckpt), "--force_resume", "true"], capsys)
    assert code == 2
    assert "--force_resume cannot change model.init_args.lr 0.002 -> 0.1" in err


def test_eval_of_a_checkpoint_refuses_model_overrides_it_cannot_apply(copy, capsys):
    out, root = copy
    ckpt = root / "checkpoints" / "last.ckpt"
    code, err = _exit(["validate", *_eval_argv(out, *LR, "--model.init_args.dim", "32",
                                               "--ckpt_path", str(ckpt))], capsys)  # fmt: skip
    assert code == 2
    assert (
        "was trained with other model settings than this command gives "
        "(model.init_args.dim 32; the checkpoint's: 64)" in err
    )


def test_owning_run_and_continuable_keys(tmp_path):
    from rl_gap.training.run_checkpoint import CONTINUABLE_KEYS, owning_run, resolve_last

    run = tmp_path / "seed0"
    (run / "checkpoints").mkdir(parents=True)
    assert owning_run(str(run / "checkpoints" / "last.ckpt")) is None  # not written by rl-gap
    (run / "wandb_id").write_text("x")
    assert owning_run(str(run / "checkpoints" / "last.ckpt")) == run
    assert owning_run(str(run / "hpc_ckpt_3.ckpt")) == run
    assert owning_run(str(tmp_path / "model.ckpt")) is None
    assert "trainer.max_epochs" in CONTINUABLE_KEYS and "model.init_args.lr" not in CONTINUABLE_KEYS
    torch.save({"state_dict": {}}, run / "checkpoints" / "last.ckpt")
    assert resolve_last("fit", run, {}, True).path == run / "checkpoints" / "last.ckpt"


def test_two_runs_that_could_be_meant_are_refused_not_guessed(tmp_path):
    from rl_gap.training.resume import ResumeRefused
    from rl_gap.training.run_checkpoint import resolve_last

    current = {"model.init_args.lr": 0.1, "trainer.max_epochs": 4}
    for name, epochs in (("seed0-aaaaaaaa", 2), ("seed0-bbbbbbbb", 3)):
        (tmp_path / name / "checkpoints").mkdir(parents=True)
        record = {"config": {**current, "trainer.max_epochs": epochs}}
        torch.save(
            {"state_dict": {}, "rl_gap": record}, tmp_path / name / "checkpoints" / "last.ckpt"
        )
    with pytest.raises(ResumeRefused, match="2 runs of this recipe and seed could be meant"):
        resolve_last("fit", tmp_path / "seed0-cccccccc", current, True)
    # exactly one: it is this run, continued
    shutil.rmtree(tmp_path / "seed0-bbbbbbbb")
    found = resolve_last("validate", tmp_path / "seed0-cccccccc", current, True)
    assert found.root == tmp_path / "seed0-aaaaaaaa" and found.changed == {
        "trainer.max_epochs": (2, 4)
    }
