"""SIGTERM to a whole process tree (what SLURM and Kubernetes do): the run saves once, exits 143,
and resumes exactly; a SIGTERM outside the training loop exits 143 with one line, no traceback.

The tree is signalled from this test with ``kill -TERM <main> <its children>`` while the run is
paused after a known step (``fault_helpers.PauseAtStep``), so the DataLoader workers receive the
signal together with the process that trains.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from cluster_helpers import ROOT, assert_same_weights, fit_argv, load, weights

from rl_gap.training.cli import run_lightning_cli

EPOCHS, BATCHES, STEP = 2, 3, 4  # step 4: mid-way through the second epoch
WAIT_S = 600


def _env():
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "tests"), str(ROOT)]))


def _children(pid):
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def _start(argv, log):
    cmd = [sys.executable, "-m", "rl_gap.cli", "fit", *argv]
    return subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL, stderr=log)


def _wait_for(path, proc, log):
    deadline = time.monotonic() + WAIT_S
    while not path.exists():
        assert proc.poll() is None and time.monotonic() < deadline, Path(log.name).read_text()
        time.sleep(0.2)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    cli = run_lightning_cli(["fit", *fit_argv(tmp_path_factory.mktemp("full"), "full",
                                              epochs=EPOCHS, batches=BATCHES)])  # fmt: skip
    assert cli.trainer.global_step == EPOCHS * BATCHES
    return weights(cli)


def test_sigterm_to_main_and_dataloader_workers_together_saves_once_and_resumes(
    run_dir, uninterrupted
):
    run_dir.mkdir(parents=True)
    marker = run_dir / "paused"
    pause = {"class_path": "fault_helpers.PauseAtStep",
             "init_args": {"step": STEP, "marker": str(marker)}}  # fmt: skip
    workers = ["--data.init_args.num_workers", "2"]
    argv = fit_argv(run_dir, "tree", *workers, f"--trainer.callbacks+={json.dumps(pause)}",
                    epochs=EPOCHS, batches=BATCHES)  # fmt: skip
    with open(run_dir / "tree.err", "w") as log:
        proc = _start(argv, log)
        _wait_for(marker, proc, log)
        tree = _children(proc.pid)
        assert len(tree) >= 2, tree  # the two DataLoader workers
        for pid in [proc.pid, *tree]:  # one kill(1) of the whole tree, main process first
            os.kill(pid, signal.SIGTERM)
        status = proc.wait(timeout=WAIT_S)
    err = (run_dir / "tree.err").read_text()
    assert status == 143, err[-3000:]
    assert "killed by signal" not in err and "Traceback" not in err, err[-3000:]
    last = run_dir / "tree" / "checkpoints" / "last.ckpt"
    assert err.count(f"step {STEP}: saved {last}") == 1, err[-3000:]
    assert load(last)["global_step"] == STEP
    assert not [p for p in tree if Path(f"/proc/{p}").exists()], "a worker outlived the run"
    resumed = run_lightning_cli(
        [
            "fit",
            *fit_argv(
                run_dir, "tree", *workers, "--ckpt_path", "last", epochs=EPOCHS, batches=BATCHES
            ),
        ]
    )
    assert resumed.trainer.global_step == EPOCHS * BATCHES
    assert_same_weights(weights(resumed), uninterrupted)


@pytest.mark.slow
def test_sigterm_while_the_run_starts_exits_143_without_a_traceback(run_dir):
    """Signalled before the first step (here: during data setup): 143, one line, nothing saved."""
    run_dir.mkdir(parents=True)
    with open(run_dir / "early.err", "w") as log:
        proc = _start(fit_argv(run_dir, "early", "--trainer.callbacks+=fault_helpers.SigtermAtSetup"),
                      log)  # fmt: skip
        status = proc.wait(timeout=WAIT_S)
    err = (run_dir / "early.err").read_text()
    assert status == 143, err[-3000:]
    assert "Traceback" not in err and "while the run was starting" in err, err[-3000:]
    assert not (run_dir / "early" / "checkpoints" / "last.ckpt").exists()


def test_sigterm_after_the_fit_ended_exits_143_with_its_outputs_complete(run_dir, capsys):
    argv = fit_argv(run_dir, "late", "--trainer.callbacks+=fault_helpers.SigtermAtFitEnd",
                    epochs=1, batches=2)  # fmt: skip
    with pytest.raises(SystemExit) as exit_info:
        run_lightning_cli(["fit", *argv])
    assert exit_info.value.code == 143
    assert "after training had ended" in capsys.readouterr().err
    ckpt = load(run_dir / "late" / "checkpoints" / "last.ckpt")
    assert ckpt["global_step"] == 2  # the fit's own final checkpoint, complete
    assert torch.isfinite(next(iter(ckpt["state_dict"].values()))).all()


def test_ctrl_c_saves_at_the_next_step_and_exits_130(run_dir, capsys):
    argv = fit_argv(run_dir, "ctrl_c", "--trainer.callbacks+=fault_helpers.SigintAtStep",
                    "--trainer.callbacks.step=3", epochs=2, batches=2)  # fmt: skip
    with pytest.raises(SystemExit) as exit_info:
        run_lightning_cli(["fit", *argv])
    assert exit_info.value.code == 130
    assert "SIGINT at epoch 1, step 3: saved" in capsys.readouterr().err
    assert load(run_dir / "ctrl_c" / "checkpoints" / "last.ckpt")["global_step"] == 3


def test_a_batch_the_ranks_cannot_share_is_refused_before_any_process_starts(run_dir, capsys):
    argv = fit_argv(run_dir, "odd", "--data.init_args.batch_size", "25",
                    "--data.init_args.m_per_class", "5", "--trainer.devices", "2",
                    "--trainer.accelerator", "cpu", "--trainer.strategy", "ddp_spawn")  # fmt: skip
    with pytest.raises(SystemExit) as exit_info:
        run_lightning_cli(["fit", *argv])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "batch_size 25" in err and "divisible by the 2 ranks" in err, err
