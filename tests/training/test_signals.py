"""SIGTERM to a ddp_spawn launcher before training started: every worker (and its children) is
stopped within seconds, the run lock is released only after they are gone, and the launcher
exits 143, instead of torch's two 30 s grace periods.

The launcher is ``tests/training/spawn_launcher.py`` (``_spawn_launch`` around
``torch.multiprocessing.start_processes``, as Lightning's launcher calls it) with workers that
never reach training; the end-to-end ``rl-gap fit --trainer.strategy ddp_spawn`` case is the
slow test at the end.
"""

import contextlib
import fcntl
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from cluster_helpers import ROOT, fit_argv

WAIT_S = 300  # for the workers to start on a loaded machine
STOP_BOUND_S = 45  # a launcher alive this long after SIGTERM hangs (torch's 2 x 30 s grace)


def _env():
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_PORT", "MASTER_ADDR")}
    return dict(env, PYTHONPATH=os.pathsep.join([str(ROOT / "tests"), str(ROOT)]))


def _running(pid):
    """Alive and not a zombie (a killed orphan waits for its reaper)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _session(sid):
    """PIDs of the running processes of session ``sid`` (the launcher's whole tree)."""
    out = subprocess.run(["pgrep", "-s", str(sid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split() if _running(int(p))]


@contextlib.contextmanager
def _session_cleaned(proc):
    """Whatever the test's outcome, nothing it started outlives it."""
    try:
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _wait_for(paths, proc, log):
    deadline = time.monotonic() + WAIT_S
    while not all(p.exists() and p.read_text().strip() for p in paths):
        assert proc.poll() is None and time.monotonic() < deadline, Path(log).read_text()[-3000:]
        time.sleep(0.05)


class LockWatch:
    """Polls a run lock; records which of ``pids`` still ran when it was first free."""

    def __init__(self, lock_path, pids):
        self.path, self.pids, self.alive_at_release = lock_path, pids, None
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self):
        fd = os.open(self.path, os.O_RDONLY)
        try:
            while True:
                alive = [p for p in self.pids() if _running(p)]  # before probing: no race
                try:
                    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                except BlockingIOError:
                    time.sleep(0.02)
                    continue
                fcntl.flock(fd, fcntl.LOCK_UN)
                self.alive_at_release = alive
                return
        finally:
            os.close(fd)

    def result(self):
        self._thread.join(timeout=30)
        return self.alive_at_release


def _stop_launcher(proc, log):
    """SIGTERM to the launcher only; (exit status, seconds to exit, stderr).

    A launcher still running STOP_BOUND_S after the signal is a hang (torch's own path
    waits out two 30 s grace periods), not a slow machine."""
    sent = time.monotonic()
    os.kill(proc.pid, signal.SIGTERM)
    try:
        status = proc.wait(timeout=STOP_BOUND_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"no exit {STOP_BOUND_S} s after SIGTERM\n{Path(log).read_text()[-3000:]}")
    return status, time.monotonic() - sent, Path(log).read_text()


def _assert_tree_gone(sid, err):
    deadline = time.monotonic() + 10  # multiprocessing's resource tracker ends after its pipe
    while _session(sid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _session(sid), f"processes left: {_session(sid)}\n{err[-3000:]}"


@pytest.mark.ddp
@pytest.mark.parametrize(
    "when", ["workers_started", pytest.param("second_worker_starting", marks=pytest.mark.slow)]
)
def test_sigterm_to_the_spawn_launcher_before_training_stops_every_worker_promptly(tmp_path, when):
    log = tmp_path / "launcher.err"
    stall = ["--stall-second-start"] if when == "second_worker_starting" else []
    cmd = [sys.executable, "-m", "tests.training.spawn_launcher", str(tmp_path), "--hold-lock",
           *stall]  # fmt: skip
    with open(log, "w") as err:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(), stderr=err, start_new_session=True)
    with _session_cleaned(proc):
        ready = [tmp_path / "worker0"]
        ready += [tmp_path / "stalled"] if stall else [tmp_path / "worker1", tmp_path / "started"]
        _wait_for(ready, proc, log)
        pids = [int(p) for f in tmp_path.glob("worker?") for p in f.read_text().split()]
        pids += [int(tmp_path.joinpath("stalled").read_text())] if stall else []
        assert len(pids) == (3 if stall else 4), pids  # workers and the workers' own children
        watch = LockWatch(tmp_path / "run" / ".rl_gap.lock", lambda: pids)
        status, seconds, text = _stop_launcher(proc, log)
        print(f"{when}: exit {status} {seconds:.1f} s after SIGTERM")
        assert status == 143, text[-3000:]
        assert "SIGTERM" in text and "nothing was trained" in text, text[-3000:]
        assert "Traceback" not in text, text[-3000:]
        assert watch.result() == [], f"the run lock was released while {watch.result()} ran"
        assert not [p for p in pids if _running(p)]
        _assert_tree_gone(proc.pid, text)


def _cmdline(pid):
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    except OSError:
        return ""


@pytest.mark.slow
@pytest.mark.ddp
@pytest.mark.parametrize(
    "trigger",
    ["GLOBAL_RANK: 0", "All distributed processes registered"],
    ids=["rank0_up_rank1_starting", "rendezvous_done"],
)
def test_sigterm_to_the_ddp_spawn_launcher_while_workers_start_exits_143_promptly(
    tmp_path, trigger
):
    """``rl-gap fit --trainer.strategy ddp_spawn``, the launcher signalled as rank 0 reports in."""
    argv = fit_argv(tmp_path, "spawn", "--trainer.devices", "2", "--trainer.accelerator", "cpu",
                    "--trainer.strategy", "ddp_spawn", epochs=1, batches=3)  # fmt: skip
    log = tmp_path / "fit.err"
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "rl_gap.cli", "fit", *argv], cwd=ROOT,
                                env=_env(), stdout=err, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
    with _session_cleaned(proc):
        deadline = time.monotonic() + WAIT_S
        while trigger not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.02)

        def ranks():  # every process of the run but the launcher and multiprocessing's tracker
            return [p for p in _session(proc.pid)
                    if p != proc.pid and "resource_tracker" not in _cmdline(p)]  # fmt: skip

        watch = LockWatch(tmp_path / "spawn" / ".rl_gap.lock", ranks)
        status, seconds, text = _stop_launcher(proc, log)
        print(f"{trigger}: exit {status} {seconds:.1f} s after SIGTERM")
        assert status == 143, text[-3000:]
        assert "Traceback" not in text, text[-3000:]
        if "nothing was trained" in text:
            assert not (tmp_path / "spawn" / "checkpoints" / "last.ckpt").exists()
        else:  # on a fast machine both workers may reach training before the signal lands
            assert "exited with [143, 143]" in text, text[-3000:]
        assert watch.result() == [], f"the run lock was released while {watch.result()} ran"
        _assert_tree_gone(proc.pid, text)
