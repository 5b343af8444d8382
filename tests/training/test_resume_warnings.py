"""Checkpoints that cannot resume exactly or at all say so at load: NaN weights are refused
(naming the tensors), a checkpoint without loop state or sampler position resumes with a
warning naming what is lost."""

import math
import shutil

import pytest
import torch
from cluster_helpers import fit_argv, load
from lightning.pytorch.callbacks import Callback

from rl_gap.training.cli import run_lightning_cli


def _argv(out, name, *extra):
    return fit_argv(out, name, "--checkpoint_every_n_steps", "1", *extra, epochs=1, batches=2)


class _KeepStep1(Callback):
    """Copies last.ckpt as written after step 1 (mid-epoch) before step 2 overwrites it."""

    def __init__(self, folder, copy):
        self.folder, self.copy = folder, copy

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == 1:
            shutil.copy(self.folder / "last.ckpt", self.copy)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A mid-epoch checkpoint (step 1 of 2) written by rl-gap fit."""
    out = tmp_path_factory.mktemp("ckpt")
    cli = run_lightning_cli(_argv(out, "src"), run=False)
    cli.trainer.callbacks.append(_KeepStep1(out / "src" / "checkpoints", out / "step1.ckpt"))
    cli.trainer.fit(cli.model, cli.datamodule)
    ckpt = load(out / "step1.ckpt")
    assert ckpt["global_step"] == 1
    return ckpt


def _save(ckpt, path):
    torch.save(ckpt, path)
    return path


def test_nan_weights_are_refused_at_load_naming_the_tensor(checkpoint, run_dir, tmp_path, capsys):
    ckpt = {**checkpoint, "state_dict": dict(checkpoint["state_dict"])}
    name = next(k for k, v in ckpt["state_dict"].items() if v.is_floating_point() and v.numel() > 1)
    broken = ckpt["state_dict"][name].clone()
    broken.view(-1)[1] = math.nan
    ckpt["state_dict"][name] = broken
    path = _save(ckpt, tmp_path / "diverged.ckpt")
    for command in ("fit", "validate"):
        with pytest.raises(SystemExit) as exit_info:
            run_lightning_cli([command, *_argv(run_dir, "nan", "--ckpt_path", str(path))])
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert f"{path} holds NaN/inf weights in 1 tensor(s) ({name})" in err
    # a Trainer driven from Python (FaultTolerance.on_load_checkpoint) refuses too
    cli = run_lightning_cli(_argv(run_dir, "nan_py"), run=False)
    with pytest.raises(ValueError, match=rf"NaN/inf weights in 1 tensor\(s\) \({name}\)"):
        cli.trainer.fit(cli.model, cli.datamodule, ckpt_path=str(path))


def test_checkpoint_without_loop_state_warns_what_is_lost(checkpoint, run_dir, tmp_path):
    ckpt = {k: v for k, v in checkpoint.items() if k != "loops"}
    path = _save(ckpt, tmp_path / "weights_only.ckpt")
    with pytest.warns(UserWarning, match="holds no training-loop state") as record:
        run_lightning_cli(["fit", *_argv(run_dir, "noloops", "--ckpt_path", str(path))])
    message = next(str(w.message) for w in record if "training-loop state" in str(w.message))
    assert str(path) in message and "sampler position are lost" in message


def test_checkpoint_without_sampler_position_warns(checkpoint, run_dir, tmp_path):
    loops = {**checkpoint["loops"], "fit_loop": dict(checkpoint["loops"]["fit_loop"])}
    state = dict(loops["fit_loop"]["state_dict"])
    assert state.pop("combined_loader")  # rl-gap wrote the position; take it out
    loops["fit_loop"]["state_dict"] = state
    path = _save({**checkpoint, "loops": loops}, tmp_path / "no_position.ckpt")
    with pytest.warns(UserWarning, match="holds no position of the training sampler") as record:
        run_lightning_cli(["fit", *_argv(run_dir, "nopos", "--ckpt_path", str(path))])
    assert any(str(path) in str(w.message) for w in record)
