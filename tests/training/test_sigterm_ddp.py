"""SIGTERM to any one process of a 2-process CPU (gloo) fit: every rank saves the same step once,
exits 143, and ``--ckpt_path last`` resumes to the uninterrupted run's weights bit for bit.

Launched as a user would: ``rl-gap fit --trainer.devices 2 --trainer.strategy ddp|ddp_spawn``
and ``python -m torch.distributed.run --nproc_per_node 2 -m rl_gap.cli fit ...``. The run pauses
after step ``STEP`` on every rank (``fault_helpers.PauseUntil``) so that the signal lands at a
known step; the test signals the launcher or rank 1 only, then lets the ranks go on.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cluster_helpers import ROOT, assert_same_weights, fit_argv, load, weights

EPOCHS, BATCHES, STEP = 2, 3, 4  # signal after step 4: mid-way through the second epoch
TWO_CPU_RANKS = ["--trainer.devices", "2", "--trainer.accelerator", "cpu"]
WAIT_S = 600  # generous bound for a loaded 2-core machine; no timing is asserted


def _command(launcher, argv):
    if launcher == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc_per_node", "2", "-m", "rl_gap.cli", "fit", *argv, *TWO_CPU_RANKS,
                "--trainer.strategy", "ddp"]  # fmt: skip
    rl_gap = Path(sys.executable).with_name("rl-gap")
    program = [str(rl_gap)] if rl_gap.exists() else [sys.executable, "-m", "rl_gap.cli"]
    return [*program, "fit", *argv, *TWO_CPU_RANKS, "--trainer.strategy", launcher]


def _env():
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_PORT", "MASTER_ADDR")}
    return dict(env, PYTHONPATH=os.pathsep.join([str(ROOT / "tests"), str(ROOT)]))


def _run(cmd, log):
    with open(log, "w") as err:
        proc = subprocess.run(cmd, cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL, stderr=err,
                              timeout=WAIT_S)  # fmt: skip
    return proc.returncode, Path(log).read_text()


def interrupt(run_dir, launcher, target, name, step=STEP, epochs=EPOCHS, batches=BATCHES):
    """Start the run, SIGTERM ``target`` ('launcher' or 'rank1') after ``step``; (status, stderr)."""
    marker, go = run_dir / f"{name}.paused", run_dir / f"{name}.go"
    pause = {"class_path": "fault_helpers.PauseUntil",
             "init_args": {"step": step, "marker": str(marker), "go": str(go)}}  # fmt: skip
    argv = fit_argv(run_dir, name, f"--trainer.callbacks+={json.dumps(pause)}",
                    epochs=epochs, batches=batches)  # fmt: skip
    run_dir.mkdir(parents=True, exist_ok=True)
    log = run_dir / f"{name}.err"
    with open(log, "w") as err:
        proc = subprocess.Popen(_command(launcher, argv), cwd=ROOT, env=_env(),
                                stdout=subprocess.DEVNULL, stderr=err)  # fmt: skip
        ranks = [Path(f"{marker}.rank{r}") for r in (0, 1)]
        deadline = time.monotonic() + WAIT_S
        while not all(r.exists() and r.read_text().strip() for r in ranks):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        pid = proc.pid if target == "launcher" else int(ranks[1].read_text())
        os.kill(pid, signal.SIGTERM)
        time.sleep(1.0)  # the handler has long run; now let the paused ranks reach the next check
        go.touch()
        try:
            status = proc.wait(timeout=WAIT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            pytest.fail(f"{launcher}: no exit after SIGTERM to {target}\n{log.read_text()[-3000:]}")
    return status, log.read_text()


def rank_statuses(stderr):
    """Exit statuses of the launcher's workers as rl-gap reports them (ddp, ddp_spawn)."""
    found = re.findall(r"worker process\(es\) \[[\d, ]*\] exited with \[([-\d, ]*)\]", stderr)
    return [int(c) for c in found[-1].split(",")] if found else None


@pytest.mark.ddp
def test_sigterm_to_rank_1_of_ddp_stops_every_rank_with_143_and_one_checkpoint(run_dir):
    # the case that hung before: one non-zero rank signalled, launched as `rl-gap fit`
    status, err = interrupt(run_dir, "ddp", "rank1", "fast", step=1, epochs=1, batches=3)
    assert status == 143, err[-3000:]
    assert rank_statuses(err) == [143], err[-3000:]  # rank 1, reported by the launcher (rank 0)
    assert err.count("rl-gap: SIGTERM at epoch 0, step 1: saved") == 1
    ckpt = load(run_dir / "fast" / "checkpoints" / "last.ckpt")
    assert ckpt["global_step"] == 1 and ckpt["epoch"] == 0


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("full")
    status, err = _run(_command("ddp", fit_argv(out, "full", epochs=EPOCHS, batches=BATCHES)),
                       out / "full.err")  # fmt: skip
    assert status == 0, err[-3000:]
    ckpt = load(out / "full" / "checkpoints" / "last.ckpt")
    assert ckpt["global_step"] == EPOCHS * BATCHES
    return weights(ckpt)


@pytest.mark.slow
@pytest.mark.ddp
@pytest.mark.parametrize("target", ["launcher", "rank1"])
@pytest.mark.parametrize("launcher", ["ddp", "ddp_spawn", "torchrun"])
def test_sigterm_to_one_process_saves_once_exits_143_and_resumes_exactly(
    run_dir, uninterrupted, launcher, target
):
    name = f"{launcher}-{target}"
    status, err = interrupt(run_dir, launcher, target, name)
    ranks = rank_statuses(err)
    last = run_dir / name / "checkpoints" / "last.ckpt"
    ckpt = load(last)
    resumed_status, resumed_err = _run(
        _command(launcher, fit_argv(run_dir, name, "--ckpt_path", "last", epochs=EPOCHS,
                                    batches=BATCHES)), run_dir / f"{name}.resume.err")  # fmt: skip
    final = load(last)
    print(f"TABLE | {launcher} | {target} | launcher {status} | ranks {ranks} | "
          f"saved step {ckpt['global_step']} | resume {resumed_status} at step "
          f"{final['global_step']}")  # fmt: skip
    if launcher == "torchrun":
        # torchrun's own status: 1 when it is signalled itself (SignalException); its report
        # lists each failed rank with exitcode 143 when a rank stopped on its own
        assert status != 0, err[-3000:]
        if target == "rank1":
            assert re.findall(r"exitcode\s*: (-?\d+)", err) and all(
                c == "143" for c in re.findall(r"exitcode\s*: (-?\d+)", err)
            ), err[-3000:]
    else:
        assert status == 143, err[-3000:]
        assert ranks == ([143] if launcher == "ddp" else [143, 143]), err[-3000:]
    assert err.count(f"step {STEP}: saved {last}") == 1, err[-3000:]
    assert ckpt["global_step"] == STEP and ckpt["epoch"] == 1
    assert resumed_status == 0, resumed_err[-3000:]
    assert final["global_step"] == EPOCHS * BATCHES
    assert_same_weights(weights(final), uninterrupted)
