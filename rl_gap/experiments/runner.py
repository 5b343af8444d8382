"""One training run of an experiment: ``rl-gap fit`` on a recipe with overrides, metrics back.

Every protocol in :mod:`rl_gap.experiments` (hyper-parameter search, seeds,
scarce data, studies) is a set of such runs. A run goes through the same
LightningCLI a user calls (:func:`rl_gap.training.cli.run_lightning_cli`):

- in this process (default), or
- as a child process started with ``command`` + ``fit ...`` (e.g.
  ``torchrun --nproc_per_node 8 -m rl_gap.cli``, ``srun python -m rl_gap.cli``),
  so that one run can be a DDP job; its metrics are then read back from the
  run's CSV log (``<run_dir>/version_N/metrics.csv``).

A finished run writes ``<run_dir>/result.json`` (its arguments and final
metrics); asking for the same run again returns it without training, so an
interrupted sweep resumes where it stopped (a folder holding a run with other
arguments is an error, never silently reused). A run with a checkpoint continues from
it (``--ckpt_path last``); one stopped after its last step, before its evaluation was
recorded, has nothing left to train and is evaluated from its checkpoint
(``validate --ckpt_path``, with a one-line notice). Runs are seeded: ``--seed_everything`` and the
DataModule's ``seed`` (batch sampling, class splits, subsets) both get the
run's seed.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import inspect
import json
import math
import os
import shlex
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

#: table column -> metric key (without the ``val/`` prefix) logged by RetrievalEvaluation
METRICS: dict[str, str] = {
    "gAP": "gap",
    "mAP": "map",
    "R@1": "r@1",
    "R@P90": "protocol_r@p90",
    "F1g": "protocol_f1g",
    "F1q": "protocol_f1q",
    "MAP@R": "map@r",  # pytorch-metric-learning's MAP@R and R-precision
    "R-prec": "r_precision",
}


def resolve_recipe(path: str | Path) -> Path:
    """A recipe file: ``path`` itself, else the recipe of that name shipped with rl_gap.

    ``recipes/demo/mnist_gsap.yaml`` works from the repository root and, when the
    package ships its recipes (``rl_gap.resources``), from anywhere.
    """
    path = Path(path)
    if path.is_file():
        return path.resolve()
    try:
        from rl_gap.resources import recipe_path
    except ImportError:
        raise FileNotFoundError(f"recipe not found: {path}") from None
    try:
        return recipe_path(str(path))
    except FileNotFoundError as error:
        raise FileNotFoundError(f"recipe not found: {path} ({error})") from None


def load_recipe(path: str | Path) -> dict[str, Any]:
    """The recipe YAML as a dict; a clear error when it is missing or not a LightningCLI recipe."""
    path = resolve_recipe(path)
    config = yaml.safe_load(path.read_text()) or {}
    if not isinstance(config, dict) or "model" not in config:
        raise ValueError(f"{path} is not a training recipe (no 'model' section)")
    return config


def recipe_loss(path: str | Path) -> str:
    """The loss name of a recipe (``model.init_args.loss``; the registry's default if none).

    Raises:
        rl_gap.losses.registry.LossSectionError: the section names an unknown loss or key.
    """
    from rl_gap.losses.registry import read_loss_section

    model = load_recipe(path)["model"]
    args = model.get("init_args", model) if isinstance(model, dict) else {}
    return read_loss_section(args.get("loss")).name


def _class_accepts(class_path: str | None, name: str) -> bool:
    """True when ``class_path``'s constructor (or a base's, via ``**kwargs``) takes ``name``."""
    if not class_path:
        return False
    import importlib

    module, _, attr = class_path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError):
        return False
    for klass in cls.__mro__:
        if "__init__" in vars(klass) and name in inspect.signature(klass.__init__).parameters:
            return True
    return False


def data_accepts(recipe: str | Path, name: str) -> bool:
    """True when the recipe's DataModule has an ``init_args`` key ``name``."""
    data = load_recipe(recipe).get("data") or {}
    return _class_accepts(data.get("class_path") if isinstance(data, dict) else None, name)


@dataclass
class Runner:
    """How runs are launched and logged.

    Args:
        command: None = in this process; else the command a ``fit`` is appended to,
            e.g. ``["torchrun", "--nproc_per_node", "8", "-m", "rl_gap.cli"]``.
        wandb: ``auto`` | ``online`` | ``offline`` | ``off`` (the training CLI's ``--wandb``).
        group: W&B group shared by every run (``--wandb_group`` of each run).
        overrides: extra ``rl-gap fit`` arguments for every run.
        env: extra environment for child processes.
    """

    command: list[str] | None = None
    wandb: str = "auto"
    group: str | None = None
    overrides: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser, grouping: str) -> None:
        """The options a Runner is built from (``--overrides``, ``--trial-command``,
        ``--wandb``); ``grouping`` says how the W&B runs are grouped."""
        parser.add_argument(
            "--overrides", default="", help='rl-gap fit overrides for every run, e.g. "--trainer.max_epochs 2"'
        )  # fmt: skip
        parser.add_argument(
            "--trial-command",
            default=None,
            help='run each training as a child process: this command + "fit ..." '
            '(e.g. "torchrun --nproc_per_node 8 -m rl_gap.cli"); default: in this process',
        )
        parser.add_argument(
            "--wandb", choices=("auto", "online", "offline", "off"), default="auto",
            help=f"W&B logging of every run, {grouping} (auto: offline without an API key)",
        )  # fmt: skip

    @classmethod
    def from_args(cls, args: argparse.Namespace, group: str) -> Runner:
        """The Runner of the options :meth:`add_arguments` added, its W&B runs in ``group``."""
        return cls(
            command=cls.parse_command(args.trial_command),
            wandb=args.wandb,
            group=group,
            overrides=shlex.split(args.overrides),
        )

    @staticmethod
    def parse_command(text: str | None) -> list[str] | None:
        """``"torchrun --nproc_per_node 8 -m rl_gap.cli"`` -> argv list; ``""``/None -> in-process."""
        if not text:
            return None
        words = shlex.split(text)
        return words or None

    def run(
        self,
        recipe: str | Path,
        run_dir: str | Path,
        seed: int,
        overrides: Sequence[str] = (),
        job_type: str = "train",
    ) -> dict[str, float]:
        """Train ``recipe`` into ``run_dir`` (or reuse its ``result.json``); return final metrics.

        Returns the last logged value of every metric (``val/gap``, ``val/map``, ...).
        Raises a RuntimeError naming the run when it logs no ``val/gap``.
        """
        run_dir = Path(run_dir).resolve()
        recipe = resolve_recipe(recipe)
        argv = ["fit", "--config", str(recipe), "--output_dir", str(run_dir.parent)]
        argv += ["--run_name", run_dir.name, "--seed_everything", str(seed)]
        if data_accepts(recipe, "seed"):
            argv += ["--data.init_args.seed", str(seed)]
        argv += [*self.overrides, *overrides]
        done = run_dir / "result.json"
        if done.is_file():
            record = json.loads(done.read_text())
            if record.get("argv") != argv:
                raise ValueError(
                    f"{run_dir} holds a run trained with other arguments:\n  "
                    f"{shlex.join(record.get('argv', []))}\nnot\n  {shlex.join(argv)}\n"
                    "use another --output folder (or delete that run folder)"
                )
            return record["metrics"]
        # explicit, not only WANDB_RUN_GROUP: a fresh fit names its own group otherwise
        wandb = ["--wandb", self.wandb, *(["--wandb_group", self.group] if self.group else [])]
        command = [*argv[:1], *wandb, *argv[1:]]
        checkpoint = _newest_checkpoint(run_dir)
        if checkpoint is not None:
            # an interrupted run: continue it (a fresh fit would go to a new version folder)
            command += ["--ckpt_path", "last"]
        with _wandb_env(self.group, job_type, run_dir.name):
            metrics = self._launch(command, run_dir, fresh_logs=checkpoint is not None)
            if checkpoint is not None and not _has_gap(metrics):
                # stopped after its last checkpoint, before its evaluation was recorded: the
                # resumed fit has nothing left to train, so the checkpoint is evaluated
                checkpoint = _newest_checkpoint(run_dir) or checkpoint
                print(f"[runner] {run_dir}: trained to its last checkpoint but not evaluated; "
                      f"validating {checkpoint.name}", file=sys.stderr, flush=True)  # fmt: skip
                validate = ["validate", *wandb, *argv[1:]]
                validate += ["--ckpt_path", str(checkpoint)]
                metrics = self._launch(validate, run_dir, fresh_logs=True)
        if not _has_gap(metrics):
            raise RuntimeError(
                f"run {run_dir} logged no finite val/gap (does the recipe evaluate at the "
                f"last epoch? set trainer.check_val_every_n_epoch); metrics: {sorted(metrics)}"
            )
        run_dir.mkdir(parents=True, exist_ok=True)
        record = {"recipe": str(recipe), "seed": seed, "argv": argv, "metrics": metrics}
        done.write_text(json.dumps(record, indent=1, sort_keys=True))
        return metrics

    def _launch(self, command: list[str], run_dir: Path, fresh_logs: bool) -> dict[str, float]:
        """One ``rl-gap`` command in this process or as a child; its metrics.

        ``fresh_logs``: a child's metrics are read only from a log folder it wrote (an
        earlier, interrupted attempt's log would hand back that attempt's last values).
        """
        if self.command is None:
            return _run_in_process(command)
        newer_than = _last_version(run_dir) if fresh_logs else None
        return _run_child(self.command + command, run_dir, self.env, newer_than)


def _has_gap(metrics: dict[str, float]) -> bool:
    return "val/gap" in metrics and math.isfinite(metrics["val/gap"])


def _newest_checkpoint(run_dir: Path) -> Path | None:
    """``last.ckpt``, else the newest checkpoint of ``run_dir``, or None."""
    folder = run_dir / "checkpoints"
    if (folder / "last.ckpt").exists():
        return folder / "last.ckpt"
    found = sorted(folder.glob("*.ckpt"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def _version(path: Path) -> int:
    try:
        return int(path.name.split("_")[-1])
    except ValueError:
        return -1


def _last_version(run_dir: Path) -> int:
    """The highest ``version_N`` of ``run_dir`` (-1 when none)."""
    return max((_version(p) for p in run_dir.glob("version_*")), default=-1)


@contextlib.contextmanager
def _wandb_env(group: str | None, job_type: str, name: str) -> Iterator[None]:
    """Set W&B's group/job-type environment for one run (read by ``wandb.init``)."""
    values = {"WANDB_RUN_GROUP": group, "WANDB_JOB_TYPE": job_type} if group else {}
    old = {k: os.environ.get(k) for k in values}
    os.environ.update({k: v for k, v in values.items() if v})
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _run_in_process(argv: list[str]) -> dict[str, float]:
    import warnings

    from rl_gap.training.cli import run_lightning_cli

    with warnings.catch_warnings():
        # argv is given on purpose while sys.argv holds the outer command's words
        warnings.filterwarnings("ignore", message="LightningCLI's args parameter")
        cli = run_lightning_cli(argv)
    return {k: float(v) for k, v in cli.trainer.callback_metrics.items() if v.numel() == 1}


def _run_child(
    argv: list[str], run_dir: Path, env: dict[str, str], newer_than: int | None = None
) -> dict[str, float]:
    child_env = {**os.environ, **env}
    result = subprocess.run(argv, env=child_env, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"run failed with exit code {result.returncode}: {shlex.join(argv)}")
    if newer_than is not None:
        return read_csv_metrics(run_dir, newer_than) if any(
            _version(p.parent) > newer_than for p in run_dir.glob("version_*/metrics.csv")
        ) else {}  # fmt: skip
    return read_csv_metrics(run_dir)


def read_csv_metrics(run_dir: str | Path, newer_than: int = -1) -> dict[str, float]:
    """Last logged value of every column of the newest ``<run_dir>/version_N/metrics.csv``
    (only versions ``N > newer_than``)."""
    run_dir = Path(run_dir)
    versions = sorted(
        (p for p in run_dir.glob("version_*/metrics.csv") if _version(p.parent) > newer_than),
        key=lambda p: _version(p.parent),
    )
    if not versions:
        raise FileNotFoundError(f"no metrics.csv under {run_dir}/version_*/ (did the run log?)")
    last: dict[str, float] = {}
    with versions[-1].open() as f:
        for row in csv.DictReader(f):
            for k, v in row.items():
                if v not in ("", None):
                    last[k] = float(v)
    return last


def default_child_command() -> list[str]:
    """``python -m rl_gap.cli`` with this interpreter."""
    return [sys.executable, "-m", "rl_gap.cli"]
