"""``rl-gap tune``: the gSAP paper's hyper-parameter protocol, per loss, as one command.

For every recipe given (one per loss; the recipes of a task differ only in
their ``loss:`` section):

1. **search** — ``--n-trials`` Optuna trials (default 10) on a class-disjoint
   split of the *training* set (``data.val_split``, default 0.3: 70% of the
   training classes train, 30% validate); learning rate in [1e-5, 5e-4] and
   τ in [1e-4, 5e-2], both log-uniform; objective: validation gAP (maximised);
2. **final** — the best trial's (lr, τ) trained on the full training set with
   ``--num-seeds`` seeds (default 3: ``seed, seed+1, ...``), evaluated on the
   test split (the DataModule validates on the test split when
   ``val_split`` is 0);
3. a table of gAP, mAP, R@1, R@P90, F1g, F1q as mean ± std over the seeds,
   one row per loss: ``results.csv``, ``results.md`` and printed; every final
   run's metrics in ``final_runs.csv``.

Outputs go to ``--output`` (default ``runs/tune/<name>``): ``optuna.db``
(the SQLite study storage), ``trials/<loss>/trial_<k>/`` and
``final/<loss>/trial_<best>/seed_<s>/`` (ordinary rl-gap run folders: CSV logs, config,
checkpoints, offline W&B runs grouped under ``--group``).

Resuming: the study lives in the storage and every finished run leaves a
``result.json``, so re-running the same command continues (it completes the
missing trials and seeds; nothing finished is trained twice). A trial left
``RUNNING`` by a killed worker is marked failed and done again, with the same
sampler seed (so the same lr and τ): at once when the worker ran on this host
and its process is gone, otherwise once its Optuna heartbeat is older than
the grace period (180 s). Only completed trials count toward ``--n-trials``
and the table ("best of N completed trials").
Several machines / DDP: point every worker at one RDB storage
(``--storage postgresql://user:pw@host/db``) and run ``--stage search`` on
each; trials are numbered by the storage and the total stops at
``--n-trials``. ``--trial-command "torchrun --nproc_per_node 8 -m rl_gap.cli"``
runs every trial and seed as its own (DDP) job. Afterwards one
``--stage final`` trains the seeds.

Determinism: the sampler of trial k is a fresh TPE sampler seeded with
``seed · 1000 + k`` that sees the trials before it, and each run is seeded, so
the same command on one worker gives the same trials and the same table
(interrupted and resumed included).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import shlex
import socket
import time
import warnings
from pathlib import Path
from typing import Any

from rl_gap.commands.progress import StepLog, add_quiet_argument
from rl_gap.experiments.runner import METRICS, Runner, recipe_loss
from rl_gap.experiments.tables import (
    RANKING_RULE,
    aggregate,
    cell,
    markdown_table,
    metric_row,
    ranking_lines,
    write_csv,
)

SEARCH_SPACE = {"lr": (1e-5, 5e-4), "temperature": (1e-4, 5e-2)}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--recipes", nargs="+", required=True, help="training recipes, one per loss"
    )
    parser.add_argument("--n-trials", type=int, default=10, help="Optuna trials per loss")
    parser.add_argument("--num-seeds", type=int, default=3, help="final runs per loss")
    parser.add_argument("--seed", type=int, default=0, help="base seed (trials and seeds)")
    parser.add_argument(
        "--val-split", type=float, default=0.3, help="training classes held out for validation"
    )
    parser.add_argument("--lr-range", type=float, nargs=2, default=SEARCH_SPACE["lr"])
    parser.add_argument("--temperature-range", type=float, nargs=2, default=SEARCH_SPACE["temperature"])  # fmt: skip
    parser.add_argument(
        "--startup-trials",
        type=int,
        default=5,
        help="random trials before TPE models the results (Optuna's default is 10)",
    )
    parser.add_argument("--output", default=None, help="output folder (default runs/tune/<name>)")
    parser.add_argument("--name", default="tune", help="study / W&B group name")
    parser.add_argument(
        "--storage",
        default=None,
        help="Optuna storage URL (default sqlite:///<output>/optuna.db); any RDB URL",
    )
    parser.add_argument(
        "--stage", choices=("all", "search", "final"), default="all", help="what to run"
    )
    Runner.add_arguments(parser, grouping="grouped by --name")
    parser.add_argument("--search-overrides", default="", help="overrides for the trials only")
    parser.add_argument("--final-overrides", default="", help="overrides for the final runs only")
    add_quiet_argument(parser)  # one stderr line per finished trial / seed


def loss_takes_temperature(loss: str) -> bool:
    from rl_gap.losses import get_loss_class

    return "temperature" in inspect.signature(get_loss_class(loss).__init__).parameters


def row_labels(recipes: list[str]) -> list[str]:
    """Row label per recipe: its loss name, or the recipe stem when two share a loss."""
    losses = [recipe_loss(r) for r in recipes]
    return [loss if losses.count(loss) == 1 else Path(r).stem for loss, r in zip(losses, recipes)]


def open_storage(url: str):
    """An Optuna RDB storage with heartbeats (a killed worker's trial is failed and redone)."""
    try:
        import optuna
    except ImportError as error:
        raise ImportError(
            "rl-gap tune needs Optuna: pip install 'rl_gap[tune]' (or optuna>=5.0)"
        ) from error

    return optuna.storages.RDBStorage(url, heartbeat_interval=60, grace_period=180)


WORKER_ATTR = "rl_gap_worker"  # user attribute of every trial: {"host": ..., "pid": ...}


def _process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, owned by another user
        return False
    return False


def fail_dead_trials(study) -> list[int]:
    """Mark failed the trials left RUNNING by a dead worker; return their numbers.

    A trial whose worker ran on this host and whose process no longer exists is
    failed at once; any other trial whose heartbeat stopped longer ago than the
    storage's grace period is failed by Optuna (``fail_stale_trials``).
    """
    import optuna
    from optuna.trial import TrialState

    host = socket.gethostname()
    dead = []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        worker = trial.user_attrs.get(WORKER_ATTR) or {}
        pid = worker.get("pid")
        if worker.get("host") == host and isinstance(pid, int) and pid != os.getpid():
            if _process_gone(pid):
                study._storage.set_trial_state_values(trial._trial_id, state=TrialState.FAIL)
                dead.append(trial.number)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        before = {t.number for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,))}
        optuna.storages.fail_stale_trials(study)
        after = {t.number for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,))}
    return sorted(set(dead) | (after - before))


def search(
    args: argparse.Namespace, runner: Runner, recipe: str, label: str, storage, out: Path
) -> dict[str, Any]:
    """Run the missing trials of one loss's study; return the best trial's params and value."""
    import optuna
    from optuna.trial import TrialState

    study_name = f"{args.name}:{label}"
    tune_tau = loss_takes_temperature(recipe_loss(recipe))
    overrides = ["--data.init_args.val_split", repr(args.val_split)]
    overrides += shlex.split(args.search_overrides)

    def objective(trial: optuna.Trial) -> float:
        trial.set_user_attr(WORKER_ATTR, {"host": socket.gethostname(), "pid": os.getpid()})
        lr = trial.suggest_float("lr", *args.lr_range, log=True)
        extra = ["--model.init_args.lr", repr(lr)]
        if tune_tau:
            tau = trial.suggest_float("temperature", *args.temperature_range, log=True)
            extra += ["--model.init_args.loss.temperature", repr(tau)]
        metrics = runner.run(
            recipe,
            out / "trials" / label / f"trial_{trial.number}",
            args.seed,
            overrides + extra,
            job_type="trial",
        )
        for name, value in metric_row(metrics).items():
            trial.set_user_attr(name, value)
        return metrics["val/gap"]

    taken = (TrialState.COMPLETE, TrialState.RUNNING, TrialState.WAITING, TrialState.PRUNED)
    study = optuna.create_study(
        study_name=study_name, storage=storage, direction="maximize", load_if_exists=True
    )
    dead = fail_dead_trials(study)
    if dead:
        print(f"[tune] {label}: trial(s) {dead} were left running by a worker that is gone; "
              "marked failed, running them again")  # fmt: skip
    done = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
    steps = StepLog("tune", f"{label} search", args.n_trials, min(done, args.n_trials), args.quiet)
    while len(study.get_trials(deepcopy=False, states=taken)) < args.n_trials:
        # trial k sees a sampler seeded by (seed, k), k counting the trials that were not
        # failed: the same trials whether or not the study was interrupted and resumed
        # (a trial killed mid-way is redone with the same seed, seeing the same trials)
        k = len(study.get_trials(deepcopy=False, states=taken))
        study.sampler = optuna.samplers.TPESampler(
            seed=args.seed * 1000 + k, n_startup_trials=args.startup_trials
        )
        study.optimize(objective, n_trials=1)
        last = study.trials[-1]
        steps.step(
            f"trial {last.number}: val gAP {last.value:.4f}" if last.value is not None else ""
        )
    return best_of(study_name, storage)


def best_of(study_name: str, storage) -> dict[str, Any]:
    """Best complete trial: ``{"lr", "temperature"?, "val_gap", "trial", "completed"}``.

    ``completed`` is the number of completed trials it is the best of (failed,
    pruned and still-running trials are not counted).
    """
    import optuna
    from optuna.trial import TrialState

    try:
        study = optuna.load_study(study_name=study_name, storage=storage)
    except KeyError as error:
        raise RuntimeError(
            f"no Optuna study {study_name!r} in the storage: run --stage search first"
        ) from error
    if not study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        raise RuntimeError(f"study {study_name!r} has no complete trial: run --stage search first")
    best = study.best_trial
    completed = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
    return {**best.params, "val_gap": best.value, "trial": best.number, "completed": completed}


def final(
    args: argparse.Namespace,
    runner: Runner,
    recipe: str,
    label: str,
    best: dict[str, Any],
    out: Path,
) -> list[dict[str, Any]]:
    """Train the best params on the full training set with every seed; one row per seed."""
    overrides = ["--data.init_args.val_split", "0.0", "--model.init_args.lr", repr(best["lr"])]
    if "temperature" in best:
        overrides += ["--model.init_args.loss.temperature", repr(best["temperature"])]
    overrides += shlex.split(args.final_overrides)
    rows = []
    steps = StepLog("tune", f"{label} final seeds", args.num_seeds, quiet=args.quiet)
    for i in range(args.num_seeds):
        seed = args.seed + i
        # the folder names the trial whose params it trains: more trials later, a new best,
        # new final runs (a finished folder is reused as is)
        run_dir = out / "final" / label / f"trial_{best['trial']}" / f"seed_{seed}"
        metrics = runner.run(recipe, run_dir, seed, overrides, job_type="final")
        rows.append({"loss": label, "trial": best["trial"], "seed": seed, **metric_row(metrics)})
        steps.step(f"seed {seed}: gAP {metrics['val/gap']:.4f}")
    return rows


def summary_table(summary: list[dict[str, Any]]) -> str:
    """Markdown: loss, chosen lr and τ, best validation gAP, then mean ± std per metric (%)."""
    header = ["loss", "lr", "τ", "val gAP (%)", *(f"{m} (%)" for m in METRICS), "seeds",
              "trials"]  # fmt: skip
    body = []
    for r in summary:
        tau = r.get("temperature")
        body.append(
            [r["loss"], f"{r['lr']:.3g}", "-" if tau is None else f"{tau:.3g}",
             f"{100 * r['val_gap']:.2f}", *(cell(r, m) for m in METRICS), r["n"],
             r.get("trials", "-")]
        )  # fmt: skip
    return markdown_table(header, body)


def log_summary_to_wandb(args: argparse.Namespace, out: Path, summary: list[dict]) -> None:
    """One extra W&B run in the group holding the table (offline unless an API key is set)."""
    from rl_gap.training.cli import resolve_wandb_mode

    mode = resolve_wandb_mode(args.wandb)
    if mode == "off":
        return
    import wandb

    columns = list(summary[0])
    run = wandb.init(
        project="rl_gap", group=args.name, job_type="summary", name=f"{args.name}-summary",
        dir=str(out), mode=mode, settings=wandb.Settings(silent=True, console="off"),
    )  # fmt: skip
    run.log(
        {"tune/results": wandb.Table(columns=columns, data=[list(r.values()) for r in summary])}
    )
    run.finish()


def run(args: argparse.Namespace) -> int:
    if args.n_trials < 1 or args.num_seeds < 1:
        raise ValueError(f"--n-trials and --num-seeds must be >= 1, got {args.n_trials}, {args.num_seeds}")  # fmt: skip
    if not 0.0 < args.val_split < 1.0:
        raise ValueError(f"--val-split must be in (0, 1), got {args.val_split}")
    for lo, hi in (args.lr_range, args.temperature_range):
        if not 0.0 < lo <= hi:
            raise ValueError(f"a search range must satisfy 0 < low <= high, got [{lo}, {hi}]")
    out = Path(args.output or Path("runs") / "tune" / args.name).resolve()
    out.mkdir(parents=True, exist_ok=True)
    storage = open_storage(args.storage or f"sqlite:///{out / 'optuna.db'}")
    runner = Runner.from_args(args, args.name)
    labels = row_labels(args.recipes)
    start = time.perf_counter()
    summary, runs = [], []
    for recipe, label in zip(args.recipes, labels):
        if args.stage in ("all", "search"):
            best = search(args, runner, recipe, label, storage, out)
            print(f"[tune] {label}: best trial {best['trial']}, val gAP {best['val_gap']:.4f}, "
                  f"params {json.dumps({k: best[k] for k in best if k in SEARCH_SPACE})}")  # fmt: skip
        if args.stage == "search":
            continue
        best = best_of(f"{args.name}:{label}", storage)
        rows = final(args, runner, recipe, label, best, out)
        runs += rows
        (agg,) = aggregate(rows, ["loss"])
        summary.append({"loss": label, "lr": best["lr"], "temperature": best.get("temperature"),
                        "val_gap": best["val_gap"], "trials": best["completed"],
                        **{k: v for k, v in agg.items() if k != "loss"}})  # fmt: skip
    seconds = time.perf_counter() - start
    if args.stage == "search":
        print(f"[tune] search done in {seconds:.0f} s; storage {storage.url}")
        return 0
    write_csv(out / "final_runs.csv", runs)
    write_csv(out / "results.csv", summary)
    table = summary_table(summary)
    verdicts = "\n".join(
        [f"ranking rule: {RANKING_RULE}.", *ranking_lines(summary, tuple(METRICS))]
    )
    (out / "results.md").write_text(
        f"# rl-gap tune: {args.name}\n\n{table}\n\n"
        + (
            f"mean ± std over {args.num_seeds} seeds (ddof=1)"
            if args.num_seeds > 1
            else "one seed (n = 1): no standard deviation"
        )
        + "; metrics in %; "
        f"lr, τ: best of the completed trials (column 'trials') on a {1 - args.val_split:.0%}/"
        f"{args.val_split:.0%} class split of the training set.\n\n{verdicts}\n"
    )
    log_summary_to_wandb(args, out, summary)
    print(f"\n{table}\n\n{verdicts}\n\nwall time {seconds:.0f} s; tables: {out / 'results.csv'}, "
          f"{out / 'results.md'}; runs: {out / 'final_runs.csv'}")  # fmt: skip
    return 0
