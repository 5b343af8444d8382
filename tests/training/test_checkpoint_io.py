"""Checkpoints are complete or absent: a kill mid-write keeps the previous file, ``$TMPDIR`` and
cross-filesystem moves play no part, and ``--ckpt_path last`` skips a damaged ``last.ckpt``."""

import io
import os
import shutil
import stat
import tempfile
import warnings

import pytest
import torch
from cluster_helpers import assert_same_weights, fit_argv, load, weights
from lightning.pytorch.callbacks import Callback

from rl_gap.training import checkpoint_io
from rl_gap.training.checkpoint_io import TEMP_PREFIX, AtomicCheckpointIO, atomic_torch_save
from rl_gap.training.cli import run_lightning_cli

_real_save = torch.save


class Killed(BaseException):
    """Stands for the process dying mid-write (not an Exception: nothing handles it)."""


def _dies_half_way(obj, f, *args, **kwargs):
    """torch.save that writes the first half of the real bytes to ``f``, then dies."""
    import io

    buffer = io.BytesIO()
    _real_save(obj, buffer, *args, **kwargs)
    data = buffer.getvalue()
    if isinstance(f, (str, bytes)) or hasattr(f, "__fspath__"):
        f = open(f, "wb")  # noqa: SIM115 - left open on purpose, as by a killed process
    f.write(data[: len(data) // 2])
    f.flush()
    raise Killed("killed while writing the checkpoint")


def test_kill_mid_write_keeps_the_previous_file_and_no_partial_file(tmp_path, monkeypatch):
    path = tmp_path / "ckpts" / "last.ckpt"
    old = {"state_dict": {"w": torch.arange(1000.0)}, "global_step": 4}
    atomic_torch_save(old, path)
    monkeypatch.setattr(torch, "save", _dies_half_way)
    with pytest.raises(Killed):
        atomic_torch_save({"state_dict": {"w": torch.zeros(1000)}, "global_step": 6}, path)
    monkeypatch.setattr(torch, "save", _real_save)
    got = load(path)
    assert got["global_step"] == 4
    torch.testing.assert_close(got["state_dict"]["w"], torch.arange(1000.0), rtol=0, atol=0)
    assert sorted(p.name for p in path.parent.iterdir()) == ["last.ckpt"]


def test_full_disk_names_the_checkpoint_and_keeps_the_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "last.ckpt"
    atomic_torch_save({"step": 1}, path)

    def no_space(obj, f, *args, **kwargs):
        f.write(b"x" * 100)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", no_space)
    with pytest.raises(
        OSError, match=f"could not write checkpoint {path} .*previous file is intact"
    ):
        atomic_torch_save({"step": 2}, path)
    monkeypatch.setattr(torch, "save", _real_save)
    assert load(path) == {"step": 1} and len(list(tmp_path.iterdir())) == 1


def _cross_filesystem_move_killed(src, dst, *args, **kwargs):
    """shutil.move across filesystems (truncate dst, copy), killed half-way through the copy."""
    data = open(src, "rb").read()
    with open(dst, "wb") as f:
        f.write(data[: len(data) // 2])
    raise Killed("killed while moving the checkpoint from $TMPDIR")


def test_fit_checkpoints_ignore_tmpdir_and_cross_filesystem_moves(run_dir, monkeypatch):
    # $TMPDIR that does not exist, and a move from it that would die half-way: rl-gap's
    # checkpoints use neither (Lightning's default writer does both)
    monkeypatch.setattr(tempfile, "tempdir", str(run_dir / "no" / "such" / "tmpdir"))
    monkeypatch.setattr(shutil, "move", _cross_filesystem_move_killed)
    cli = run_lightning_cli(["fit", *fit_argv(run_dir, "tmp", epochs=1, batches=2)])
    assert isinstance(cli.trainer.strategy.checkpoint_io, AtomicCheckpointIO)
    folder = run_dir / "tmp" / "checkpoints"
    assert load(folder / "last.ckpt")["global_step"] == 2
    assert load(folder / "epoch=0-step=2.ckpt")["global_step"] == 2
    assert not list(folder.glob(f"{TEMP_PREFIX}*"))


class _At(Callback):
    """Calls ``action()`` at the start of training batch ``step`` (global step)."""

    def __init__(self, step, action):
        self.step, self.action = step, action

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.step:
            self.action()


def _crash():
    raise RuntimeError("simulated crash")


# validation and ModelCheckpoint at every epoch end: last.ckpt and epoch=0-step=2.ckpt after epoch 0
EVERY_EPOCH = ("--trainer.check_val_every_n_epoch", "1")


def _fit_until_crash(run_dir, name, step, action):
    cli = run_lightning_cli(fit_argv(run_dir, name, *EVERY_EPOCH), run=False)
    cli.trainer.callbacks.append(_At(step, action))
    return cli


def test_kill_during_modelcheckpoint_rewrite_keeps_last(run_dir, monkeypatch):
    cli = _fit_until_crash(
        run_dir, "kill", 2, lambda: monkeypatch.setattr(torch, "save", _dies_half_way)
    )
    with pytest.raises(Killed):  # the epoch-1 rewrite of last.ckpt dies half-way
        cli.trainer.fit(cli.model, cli.datamodule)
    monkeypatch.setattr(torch, "save", _real_save)
    folder = run_dir / "kill" / "checkpoints"
    assert load(folder / "last.ckpt")["global_step"] == 2  # the epoch-0 one, intact
    assert_same_weights(
        weights(load(folder / "last.ckpt")), weights(load(folder / "epoch=0-step=2.ckpt"))
    )


def test_ckpt_path_last_falls_back_to_the_newest_readable_checkpoint(run_dir, tmp_path):
    full = run_lightning_cli(["fit", *fit_argv(tmp_path / "full", "full", *EVERY_EPOCH)])
    cli = _fit_until_crash(run_dir, "trunc", 2, _crash)
    with pytest.raises(RuntimeError, match="simulated crash"):
        cli.trainer.fit(cli.model, cli.datamodule)
    folder = run_dir / "trunc" / "checkpoints"
    last = folder / "last.ckpt"
    last.write_bytes(last.read_bytes()[:1000])  # truncated, as by a full disk
    with pytest.warns(UserWarning) as record:
        resumed = run_lightning_cli(
            ["fit", *fit_argv(run_dir, "trunc", *EVERY_EPOCH, "--ckpt_path", "last")]
        )
    message = "\n".join(str(w.message) for w in record)
    assert f"{last}: " in message and "is not a checkpoint" in message
    assert f"resuming from the newest readable one, {folder / 'epoch=0-step=2.ckpt'}" in message
    assert resumed.trainer.global_step == 4
    assert_same_weights(weights(resumed), weights(full))


def test_ckpt_path_last_with_no_readable_checkpoint_is_one_error(run_dir, capsys):
    folder = run_dir / "bad" / "checkpoints"
    folder.mkdir(parents=True)
    (folder / "last.ckpt").write_bytes(b"")
    (folder / "epoch=0-step=2.ckpt").write_bytes(b"garbage")
    with pytest.raises(SystemExit) as exit_info, warnings.catch_warnings():
        run_lightning_cli(["fit", *fit_argv(run_dir, "bad", "--ckpt_path", "last")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"no checkpoint in {folder} can be read" in err
    assert "last.ckpt" in err and "epoch=0-step=2.ckpt" in err


class _FullDiskFile(io.RawIOBase):
    """A file whose disk fills up after ``room`` bytes (torch's zip writer then fails its own way)."""

    def __init__(self, real, room):
        self.real, self.room = real, room

    def writable(self):
        return True

    def write(self, data):
        if self.room < len(data):
            raise OSError(28, "No space left on device")
        self.room -= len(data)
        return self.real.write(data)

    def flush(self):
        if not self.real.closed:
            self.real.flush()

    def fileno(self):
        return self.real.fileno()

    def close(self):
        super().close()
        self.real.close()


def test_full_disk_inside_torch_save_gives_the_one_line_message(tmp_path, monkeypatch):
    # torch.save reports this as a RuntimeError from inline_container.cc, not an OSError
    path = tmp_path / "last.ckpt"
    atomic_torch_save({"step": 1}, path)
    real_fdopen = os.fdopen
    monkeypatch.setattr(
        checkpoint_io.os, "fdopen", lambda fd, mode: _FullDiskFile(real_fdopen(fd, mode), 1000)
    )
    with pytest.raises(OSError) as info:
        atomic_torch_save({"w": torch.zeros(10_000)}, path)
    message = str(info.value)
    assert f"could not write checkpoint {path}" in message and "\n" not in message
    assert "disk full" in message and "previous file is intact" in message
    monkeypatch.setattr(checkpoint_io.os, "fdopen", real_fdopen)
    assert load(path) == {"step": 1} and len(list(tmp_path.iterdir())) == 1


@pytest.mark.parametrize("umask", [0o022, 0o002])
def test_checkpoint_permissions_follow_the_umask(tmp_path, umask):
    previous = os.umask(umask)
    try:
        atomic_torch_save({"step": 1}, tmp_path / "last.ckpt")
        plain = tmp_path / "plain"
        plain.write_bytes(b"")
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "last.ckpt").stat().st_mode) == 0o666 & ~umask
    assert stat.S_IMODE(plain.stat().st_mode) == 0o666 & ~umask  # as any file the user writes


def test_full_disk_at_a_periodic_checkpoint_ends_the_fit_with_one_line(
    run_dir, monkeypatch, capsys
):
    from cluster_helpers import fit_argv

    from rl_gap.training.cli import run_lightning_cli

    real_fdopen = os.fdopen
    monkeypatch.setattr(
        checkpoint_io.os, "fdopen", lambda fd, mode: _FullDiskFile(real_fdopen(fd, mode), 1000)
    )
    with pytest.raises(SystemExit) as exit_info:
        run_lightning_cli(["fit", *fit_argv(run_dir, "full", "--checkpoint_every_n_steps", "1",
                                            epochs=1, batches=2)])  # fmt: skip
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    (line,) = [x for x in err.splitlines() if x.startswith("rl-gap: error:")]
    assert line.startswith(f"rl-gap: error: could not write checkpoint {run_dir / 'full'}")
    assert line.endswith(
        "(the file system refused the write: is the disk full?); nothing was written"
    )
