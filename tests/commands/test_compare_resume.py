"""``rl-gap compare`` stopped part-way: a member trained to its last step but never
evaluated is evaluated from its checkpoint on resume; a signal stops the workers too.

Tiny glyph runs through the real command; every number is checked against the value
the same run logged when it was not interrupted.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rl_gap.cli import main as cli_main
from rl_gap.experiments.runner import Runner, default_child_command

ROOT = Path(__file__).resolve().parents[2]

RECIPE = str(ROOT / "recipes" / "demo" / "glyph_classes.yaml")
TINY = (
    "--trainer.enable_progress_bar false --trainer.enable_model_summary false "
    "--trainer.max_epochs 1 "
    "--data.init_args.train_classes 16 --data.init_args.test_classes 8 "
    "--data.init_args.train_renders 4 --data.init_args.test_renders 3 --data.init_args.canvas 16 "
    "--data.init_args.batch_size 16 --data.init_args.batches_per_epoch 3 "
    "--model.init_args.backbone_kwargs '{width: 4}' --model.init_args.dim 8"
)


def _runs(folder: Path) -> dict[tuple[str, str], float]:
    with (folder / "runs.csv").open() as f:
        return {(r["loss"], r["seed"]): float(r["gAP"]) for r in csv.DictReader(f)}


def test_member_trained_but_not_evaluated_is_evaluated_from_its_checkpoint(tmp_path, capsys):
    argv = ["compare", "--config", RECIPE, "--losses", "gsap,infonce", "--seeds", "1",
            "--output", str(tmp_path), "--wandb", "off", "--threads", "1",
            "--overrides", TINY]  # fmt: skip
    assert cli_main(argv) == 0
    before = _runs(tmp_path)
    member = next((tmp_path / "test" / "infonce").glob("tau_*/seed_0"))
    logged = json.loads((member / "result.json").read_text())["metrics"]["val/gap"]
    # killed after the last step's checkpoint, before its evaluation was written
    (member / "result.json").unlink()
    for version in member.glob("version_*"):
        shutil.rmtree(version)
    assert any((member / "checkpoints").glob("*.ckpt"))
    capsys.readouterr()
    assert cli_main(argv) == 0
    err = capsys.readouterr()
    notice = [line for line in (err.out + err.err).splitlines() if "not evaluated" in line]
    assert len(notice) == 1 and str(member) in notice[0]
    after = _runs(tmp_path)
    # the same weights, the same test split: the value the uninterrupted run logged
    assert after[("infonce", "0")] == logged == before[("infonce", "0")]
    assert after[("gsap", "0")] == before[("gsap", "0")]
    assert json.loads((member / "result.json").read_text())["metrics"]["val/gap"] == logged


@pytest.mark.slow
def test_child_run_stopped_before_evaluation_never_returns_an_earlier_log(tmp_path):
    """As a child command: the evaluation is read from the log it writes, not from the log
    of the attempt that was stopped (which holds an earlier validation)."""
    runner = Runner(command=default_child_command(), wandb="off", overrides=shlex.split(TINY))
    run_dir = tmp_path / "seed_0"
    logged = runner.run(RECIPE, run_dir, 0, ["--data.init_args.val_split", "0"])["val/gap"]
    (run_dir / "result.json").unlink()
    log = next(run_dir.glob("version_*/metrics.csv"))
    rows = list(csv.DictReader(log.open()))
    for row in rows:  # the stopped attempt's log: an earlier, different validation
        if row.get("val/gap"):
            row["val/gap"] = "0.999"
    with log.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    again = runner.run(RECIPE, run_dir, 0, ["--data.init_args.val_split", "0"])["val/gap"]
    assert again == logged != 0.999


def _workers(pid: int) -> list[int]:
    """The pool's worker processes among ``pid``'s children (not the resource tracker)."""
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    found = []
    for child in (int(p) for p in out.split()):
        with contextlib.suppress(OSError):
            if b"resource_tracker" not in Path(f"/proc/{child}/cmdline").read_bytes():
                found.append(child)
    return found


def _alive(pid: int) -> bool:
    """Running (a zombie, dead but not yet reaped by its orphaned parent, is not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize(
    "signum", [signal.SIGTERM, pytest.param(signal.SIGINT, marks=pytest.mark.slow)]
)
def test_signal_to_compare_stops_its_workers_and_says_how_to_resume(tmp_path, signum):
    marker = tmp_path / "paused"
    pause = {"class_path": "fault_helpers.PauseAtStep",
             "init_args": {"step": 1, "marker": str(marker), "timeout": 60}}  # fmt: skip
    callback = shlex.quote(f"--trainer.callbacks+={json.dumps(pause)}")
    overrides = f"{TINY} --trainer.max_epochs 3 {callback}"
    cmd = [sys.executable, "-m", "rl_gap.cli", "compare", "--config", RECIPE,
           "--losses", "gsap,infonce", "--seeds", "1", "--output", str(tmp_path / "out"),
           "--wandb", "off", "--jobs", "2", "--threads", "1", "--overrides", overrides]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "tests"), str(ROOT)]))
    workers: list[int] = []
    with open(tmp_path / "compare.err", "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 300
            while not marker.exists():  # a member paused after step 1, the other one started
                assert proc.poll() is None and time.monotonic() < deadline, (
                    tmp_path / "compare.err"
                ).read_text()[-3000:]
                time.sleep(0.2)
            workers = _workers(proc.pid)
            assert len(workers) == 2, workers
            os.kill(proc.pid, signum)
            status = proc.wait(timeout=120)
            alive = [p for p in workers if _alive(p)]
        finally:
            for pid in [proc.pid, *workers]:  # never leave a run behind when the test fails
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
    out = (tmp_path / "compare.err").read_text()
    assert not alive, f"workers {alive} outlived rl-gap compare (exit {status})"
    assert status == 128 + signum, out[-3000:]
    assert "run the same command again to resume" in out, out[-3000:]
    # the paused member saved where it stopped (the other may not have reached a step)
    saved = list((tmp_path / "out" / "test").glob("*/tau_*/seed_0/checkpoints/last.ckpt"))
    assert saved, out[-3000:]
    assert not list((tmp_path / "out" / "test").glob("*/tau_*/seed_0/result.json"))
