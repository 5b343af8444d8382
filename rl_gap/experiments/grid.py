"""Grids of seeded runs: the shared command-line options and the loop over settings × seeds.

Each setting of a sweep (a loss, a class fraction, a negative-drop rate, ...)
is one recipe plus ``rl-gap fit`` overrides; it is trained with ``num_seeds``
seeds (``seed, seed+1, ...``) into ``<output>/<setting path>/seed_<s>/``
through :class:`rl_gap.experiments.runner.Runner` (finished runs are reused,
so an interrupted sweep resumes).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rl_gap.experiments.runner import Runner, data_accepts
from rl_gap.experiments.tables import aggregate, metric_row, write_csv


@dataclass(frozen=True)
class Setting:
    """One point of a grid.

    Args:
        labels: the setting's table columns, e.g. ``{"loss": "gsap", "alpha": 0.9}``.
        recipe: training recipe.
        overrides: ``rl-gap fit`` arguments of this setting.
        path: run folder of the setting, relative to the sweep's output.
    """

    labels: dict[str, Any]
    recipe: str
    overrides: tuple[str, ...]
    path: str


def add_grid_arguments(parser: argparse.ArgumentParser, recipes: Sequence[str]) -> None:
    """Options every sweep shares: recipes, seeds, output, overrides, launcher, W&B."""
    parser.add_argument("--recipes", nargs="+", default=list(recipes), help="one recipe per loss")
    parser.add_argument("--num-seeds", type=int, default=3, help="seeds per setting")
    parser.add_argument("--seed", type=int, default=0, help="first seed")
    parser.add_argument("--output", default=None, help="output folder")
    Runner.add_arguments(parser, grouping="one group per sweep")


VAL_SPLIT_KEY = "val_split"


def on_test_split(recipe: str) -> tuple[str, ...]:
    """``rl-gap fit`` overrides that make a run report the test split.

    A recipe tuned on a held-out share of its training classes (``val_split: 0.3``,
    the SOP/iNaturalist recipes) would report ``val/*`` on those classes and train
    on the rest; ``val_split 0`` trains on every training class and validates on
    the test split, the number the paper's protocols report.
    """
    if data_accepts(recipe, VAL_SPLIT_KEY):
        return (f"--data.init_args.{VAL_SPLIT_KEY}", "0")
    return ()


def runner_from_args(args: argparse.Namespace, group: str) -> Runner:
    if args.num_seeds < 1:
        raise ValueError(f"--num-seeds must be >= 1, got {args.num_seeds}")
    if VAL_SPLIT_KEY in args.overrides:
        raise ValueError(
            f"--overrides sets {VAL_SPLIT_KEY}: this protocol reports the test split, so every "
            f"run gets {VAL_SPLIT_KEY} 0 (search on a validation split with rl-gap tune)"
        )
    return Runner.from_args(args, group)


def run_grid(
    runner: Runner, settings: Sequence[Setting], output: Path, seeds: Sequence[int]
) -> list[dict[str, Any]]:
    """Train every setting with every seed; one row per run: labels, seed, gAP, mAP, ..."""
    rows = []
    for setting in settings:
        for seed in seeds:
            run_dir = output / setting.path / f"seed_{seed}"
            metrics = runner.run(setting.recipe, run_dir, seed, list(setting.overrides))
            rows.append({**setting.labels, "seed": seed, **metric_row(metrics)})
    return rows


def sweep(
    args: argparse.Namespace,
    settings: Sequence[Setting],
    output: Path,
    name: str,
    group: str,
    by: Sequence[str],
) -> tuple[list[dict[str, Any]], float]:
    """A sweep of :func:`add_grid_arguments`'s command line: every setting with the seeds
    ``--seed, --seed + 1, ...`` (``--num-seeds``), W&B runs in ``group``.

    Writes ``<name>_runs.csv`` (one row per run) and ``<name>.csv`` (mean ± std per
    distinct ``by`` labels, :func:`~rl_gap.experiments.tables.aggregate`) to ``output``.

    Returns:
        The aggregated rows and the wall time in seconds.
    """
    runner = runner_from_args(args, group)
    seeds = [args.seed + i for i in range(args.num_seeds)]
    start = time.perf_counter()
    rows = run_grid(runner, settings, output, seeds)
    seconds = time.perf_counter() - start
    agg = aggregate(rows, by)
    write_csv(output / f"{name}_runs.csv", rows)
    write_csv(output / f"{name}.csv", agg)
    return agg, seconds


@dataclass(frozen=True)
class Job:
    """One seeded run of :meth:`Runner.run`: recipe, run folder, seed, its own overrides."""

    recipe: str
    run_dir: Path
    seed: int
    overrides: tuple[str, ...] = ()
    job_type: str = "train"


def run_jobs(
    runner: Runner,
    jobs: Sequence[Job],
    workers: int = 1,
    threads: int | None = None,
    done: Callable[[Job, dict[str, float]], None] | None = None,
) -> list[dict[str, float]]:
    """Run ``jobs`` (finished ones are read back from their ``result.json``); metrics in order.

    Args:
        runner: how every run is launched (in-process or a child command, W&B, overrides).
        jobs: the runs.
        workers: runs at a time; above 1, each in a worker process (``spawn``), so two
            small CPU runs use two cores better than one run with two threads.
        threads: torch intra-op threads per run (None: torch's default). Small models on
            a few cores train faster with 1 thread per run and runs side by side.
        done: called with every finished job and its metrics (in completion order).

    Raises:
        RunsStopped: (``workers`` > 1) this process received SIGTERM or SIGINT: the
            workers were sent SIGTERM, their running runs saved and stopped, the jobs not
            yet started were refused, and every worker had exited.
    """
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if threads is not None and threads < 1:
        raise ValueError(f"threads must be >= 1 or None, got {threads}")
    if workers == 1:
        results = []
        with _torch_threads(threads):
            for job in jobs:
                results.append(runner.run(job.recipe, job.run_dir, job.seed,
                                          list(job.overrides), job.job_type))  # fmt: skip
                if done is not None:
                    done(job, results[-1])
        return results
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    context = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(workers, mp_context=context, initializer=_start_worker,
                               initargs=(threads,))  # fmt: skip
    stop: list[int] = []  # the signal this process received, if any
    signalled: set[int] = set()

    def forward(signum: int, frame: object) -> None:
        # SIGTERM is what a run saves on (a Ctrl-C has reached the workers already)
        if not stop:
            stop.append(signum)
        # the pool's workers are this process's only multiprocessing children
        for pid in [p.pid for p in context.active_children()]:
            if pid not in signalled:
                signalled.add(pid)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)

    try:
        with _handling((signal.SIGTERM, signal.SIGINT), forward):
            futures = {pool.submit(_run_in_worker, runner, job): i for i, job in enumerate(jobs)}
            results: list[dict[str, float] | None] = [None] * len(jobs)
            for future in as_completed(futures):
                i = futures[future]
                if stop:
                    forward(stop[0], None)  # a worker started since the signal
                    if future.exception() is None:
                        results[i] = future.result()
                    continue  # stopped or refused: its run resumes with the same command
                results[i] = future.result()  # a failed run raises here, naming its folder
                if done is not None:
                    done(jobs[i], results[i])
            pool.shutdown(wait=True)
    except BaseException:
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    if stop:
        raise RunsStopped(stop[0])
    return [r for r in results if r is not None]


class RunsStopped(Exception):
    """A sweep stopped by a signal; every run it had started saved and stopped."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum

    def __str__(self) -> str:
        return f"stopped by {signal.Signals(self.signum).name}"


class RunStopped(Exception):
    """A worker's run stopped by a signal (saved), or refused after one (not started)."""


_worker_stop: list[int] = []  # in a worker process: the first stop signal it received


def _note_worker_stop(signum: int, frame: object) -> None:
    from rl_gap.training.stop_request import request_stop

    if not _worker_stop:
        _worker_stop.append(signum)
    request_stop(signum)  # a run starting now stops before its first step


def _start_worker(threads: int | None) -> None:
    """Worker set-up: threads, and a stop signal recorded instead of killing the worker
    (a run in progress saves on it; the queued ones are refused)."""
    _set_threads(threads)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _note_worker_stop)


def _run_in_worker(runner: Runner, job: Job) -> dict[str, float]:
    """One job in a worker process; after a stop signal, a stopped run or a refused job."""
    if _worker_stop:
        raise RunStopped(f"{job.run_dir}: not started, the sweep is stopping")
    try:
        return runner.run(job.recipe, job.run_dir, job.seed, list(job.overrides), job.job_type)
    except SystemExit as exit_:
        from rl_gap.training.signals import STOP_EXIT_CODES

        if exit_.code not in STOP_EXIT_CODES:
            raise
        _worker_stop.append(int(exit_.code) - 128)
        raise RunStopped(f"{job.run_dir}: stopped by a signal (exit {exit_.code})") from None


@contextlib.contextmanager
def _handling(signums: Sequence[int], handler: Callable[[int, object], None]) -> Iterator[None]:
    """``handler`` for ``signums`` (main thread only), the previous handlers back afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, handler) for s in signums}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def _set_threads(threads: int | None) -> None:
    if threads is not None:
        import torch

        torch.set_num_threads(threads)


@contextlib.contextmanager
def _torch_threads(threads: int | None) -> Iterator[None]:
    if threads is None:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)
