"""One run per run folder: a second ``rl-gap fit`` into a folder in use refuses, naming the holder
and ``--run_name``; the lock of a process that died (``kill -9``) is taken over."""

import os
import signal
import socket
import subprocess
import sys

import pytest
from cluster_helpers import ROOT, fit_argv

from rl_gap.training.cli import run_lightning_cli
from rl_gap.training.run_lock import LOCK_NAME, RunFolderLocked, RunLock, starts_the_run

_HOLD = "import sys, time; from rl_gap.training.run_lock import RunLock; RunLock(sys.argv[1]).acquire(); " \
        "print('locked', flush=True); time.sleep(600)"  # fmt: skip


@pytest.fixture
def holder():
    """Starts another process that holds the lock on a folder; kills it at the end."""
    procs = []

    def start(folder):
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        proc = subprocess.Popen([sys.executable, "-c", _HOLD, str(folder)], env=env,
                                stdout=subprocess.PIPE, text=True)  # fmt: skip
        procs.append(proc)
        assert proc.stdout.readline().strip() == "locked"
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def test_a_held_folder_is_refused_naming_the_holder_and_a_dead_holder_is_taken_over(
    tmp_path, holder
):
    folder = tmp_path / "run"
    proc = holder(folder)
    with pytest.raises(RunFolderLocked) as err:
        RunLock(folder).acquire()
    message = str(err.value)
    assert f"PID {proc.pid} on host {socket.gethostname()}" in message
    assert str(folder) in message and "--run_name" in message
    proc.send_signal(signal.SIGKILL)  # dies holding it: the kernel drops the flock
    proc.wait()
    lock = RunLock(folder).acquire()
    try:
        assert (folder / LOCK_NAME).read_text().split()[:2] == [
            str(os.getpid()),
            socket.gethostname(),
        ]
        assert RunLock(folder).acquire() is lock  # this process again (a second fit in a notebook)
    finally:
        lock.release()
    with RunLock(folder):  # released: free again
        pass


def test_second_fit_in_a_folder_in_use_refuses_before_writing(run_dir, holder, capsys):
    folder = run_dir / "same"
    proc = holder(folder)
    with pytest.raises(SystemExit) as exit_info:
        run_lightning_cli(["fit", *fit_argv(run_dir, "same", epochs=1, batches=1)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"run folder {folder} is in use by PID {proc.pid} on host" in err
    assert "--run_name" in err
    assert sorted(p.name for p in folder.iterdir()) == [LOCK_NAME]  # nothing of the run written
    proc.kill()
    proc.wait()
    cli = run_lightning_cli(["fit", *fit_argv(run_dir, "same", epochs=1, batches=1)])
    assert cli.trainer.global_step == 1
    with RunLock(folder):  # the finished fit released its lock
        pass


@pytest.mark.parametrize(
    "env, starts",
    [
        ({}, True),
        ({"LOCAL_RANK": "0", "RANK": "0"}, True),
        ({"LOCAL_RANK": "1"}, False),  # a rank the ddp launcher started (the same command again)
        ({"RANK": "3", "LOCAL_RANK": "0"}, False),  # torchrun, rank 0 of the second node
        ({"SLURM_PROCID": "1"}, False),
        ({"NODE_RANK": "1", "LOCAL_RANK": "0"}, False),
    ],
)
def test_only_the_process_that_starts_the_run_locks(env, starts):
    assert starts_the_run(env) is starts
