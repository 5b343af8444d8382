"""Losses compared seed by seed on one recipe: the engine of ``rl-gap compare`` and the demo.

One recipe, a list of losses (``model.init_args.loss.name``; each loss takes its
hyperparameters from its own table of the recipe's ``loss:`` section, see
:func:`rl_gap.losses.registry.read_loss_section`), seeds ``seed .. seed+n-1``; seed
``s`` sets both the initialisation (``--seed_everything``) and the data order
(``data.seed``) of every loss, so runs with the same seed are paired.

1. **temperatures** (optional, ``tau_grid``): every loss that has a temperature is
   trained at every grid value on a class-disjoint split of the *training* classes
   (``data.val_split``, default 0.3), with ``tau_seeds``; its temperature is the grid
   value with the highest mean validation gAP (``val_runs.csv``, ``temperatures.json``).
   Without a grid, each loss keeps the recipe's value.
2. **test runs**: every loss × seed at its temperature, ``data.val_split 0`` (reported
   on the test split): ``runs.csv`` (one row per run).
3. **tables**: mean ± std of gAP, mAP, R@1, R@P90, F1g, F1q, the consistency ceiling C
   and the efficiency gAP / C, one row per loss (``table.md``), and the paired verdicts
   (:func:`rl_gap.experiments.tables.paired_verdicts`), ``paired.png`` (per-seed values
   per loss, a line per seed) and, with W&B on, a summary run in the sweep's group.

Run folders: ``<output>/val/<loss>/tau_<τ>/seed_<s>`` and ``<output>/test/<loss>/tau_<τ>/seed_<s>``;
a finished run is read back from its ``result.json``, so a stopped comparison resumes.
"""

from __future__ import annotations

import inspect
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rl_gap.experiments.grid import VAL_SPLIT_KEY, Job, on_test_split, run_jobs
from rl_gap.experiments.runner import METRICS, Runner, data_accepts, load_recipe
from rl_gap.experiments.tables import (
    CONSISTENCY,
    PAIRED_RULE,
    aggregate,
    cell,
    markdown_table,
    mean_std,
    metric_row,
    paired_verdicts,
    write_csv,
)

#: every column of a comparison table: the papers' metrics, then C and gAP / C
TABLE_METRICS: dict[str, str] = {**METRICS, **CONSISTENCY}
#: metrics of the paired verdicts by default
VERDICT_METRICS = ("gAP", "mAP", "R@1", "C", "gAP/C")


@dataclass
class Comparison:
    """What to compare and where (see module doc).

    Args:
        recipe: training recipe (a path, or a recipe shipped with rl_gap).
        losses: loss names, first = the one every other is compared with first.
        seeds: seeds of the test runs.
        output: output folder.
        tau_grid: temperatures tried per loss on the validation split (None: recipe's).
        tau_seeds: seeds of the validation runs.
        val_split: share of the training classes validated on when choosing τ.
        workers: runs side by side (worker processes); threads: torch threads per run.
        verdict_metrics: metrics of the paired verdicts.
        extra: the overrides every run gets (checked: none may set ``val_split``).
        tau_source: where the recipe's temperatures come from (printed without a grid).
    """

    recipe: str
    losses: Sequence[str]
    seeds: Sequence[int]
    output: Path
    tau_grid: Sequence[float] | None = None
    tau_seeds: Sequence[int] = (0,)
    val_split: float = 0.3
    workers: int = 1
    threads: int | None = None
    verdict_metrics: Sequence[str] = VERDICT_METRICS
    extra: tuple[str, ...] = field(default_factory=tuple)
    tau_source: str = "the recipe's loss tables"

    def check(self) -> None:
        """One-line errors for a bad comparison, before any training."""
        from rl_gap.losses import available_losses

        load_recipe(self.recipe)
        if not self.losses or len(set(self.losses)) != len(self.losses):
            raise ValueError(f"losses must be distinct names, got {list(self.losses)}")
        unknown = [loss for loss in self.losses if loss not in available_losses()]
        if unknown:
            raise ValueError(f"unknown loss(es) {unknown}; known: {', '.join(available_losses())}")
        if not self.seeds:
            raise ValueError("no seed to run")
        bad = [m for m in self.verdict_metrics if m not in TABLE_METRICS]
        if bad:
            raise ValueError(f"unknown verdict metric(s) {bad}; known: {', '.join(TABLE_METRICS)}")
        if self.tau_grid is not None:
            if not self.tau_grid or any(not t > 0 for t in self.tau_grid):
                raise ValueError(f"tau grid values must be > 0, got {list(self.tau_grid)}")
            if not 0.0 < self.val_split < 1.0:
                raise ValueError(f"val_split must be in (0, 1), got {self.val_split}")
            if not data_accepts(self.recipe, VAL_SPLIT_KEY):
                raise ValueError(
                    f"{self.recipe}: its DataModule has no {VAL_SPLIT_KEY}, so temperatures "
                    "cannot be chosen on held-out training classes"
                )
        if self.tau_grid is not None and override_temperature(self.extra) is not None:
            raise ValueError(
                "overrides set the temperature of every loss and --tau-grid searches it: "
                "drop one of the two"
            )
        if any(VAL_SPLIT_KEY in word for word in self.extra):
            raise ValueError(
                f"overrides set {VAL_SPLIT_KEY}: test runs report the test split and the τ "
                "search uses val_split (--val-split)"
            )


def takes_temperature(loss: str) -> bool:
    from rl_gap.losses import get_loss_class

    return "temperature" in inspect.signature(get_loss_class(loss).__init__).parameters


def recipe_temperature(recipe: str, loss: str) -> float | None:
    """The temperature ``loss`` trains with from ``recipe``: its table's, else its default."""
    from rl_gap.losses import get_loss_class
    from rl_gap.losses.registry import read_loss_section

    if not takes_temperature(loss):
        return None
    model = load_recipe(recipe)["model"]
    args = model.get("init_args", model) if isinstance(model, dict) else {}
    section = dict(args.get("loss") or {})
    section["name"] = loss
    kwargs = read_loss_section(section).kwargs
    if "temperature" in kwargs:
        return float(kwargs["temperature"])
    default = inspect.signature(get_loss_class(loss).__init__).parameters["temperature"].default
    return float(default)


TEMPERATURE_KEYS = ("--model.init_args.loss.temperature", "--model.loss.temperature")


def override_temperature(extra: Sequence[str]) -> float | None:
    """The temperature an override sets for every loss (``--model.init_args.loss.temperature
    0.01`` or ``--model.loss.temperature=0.01``; the last one wins), or None."""
    value = None
    for i, word in enumerate(extra):
        key, eq, rest = word.partition("=")
        if key in TEMPERATURE_KEYS:
            text = rest if eq else (extra[i + 1] if i + 1 < len(extra) else "")
            try:
                value = float(text)
            except ValueError:
                raise ValueError(f"{key} needs a number, got {text!r}") from None
    return value


def _loss_args(loss: str, tau: float | None) -> tuple[str, ...]:
    args: tuple[str, ...] = ("--model.init_args.loss.name", loss)
    if tau is not None:
        args += ("--model.init_args.loss.temperature", repr(tau))
    return args


def _tau_dir(tau: float | None) -> str:
    return "tau_recipe" if tau is None else f"tau_{tau:g}"


def choose_temperatures(
    plan: Comparison, runner: Runner, done: Callable | None = None
) -> tuple[dict[str, float | None], list[dict[str, Any]]]:
    """Each loss's grid value with the highest mean validation gAP; and every validation run."""
    split = ("--data.init_args.val_split", repr(plan.val_split))
    jobs, keys = [], []
    for loss in plan.losses:
        if not takes_temperature(loss):
            continue
        for tau in plan.tau_grid or ():
            for seed in plan.tau_seeds:
                run_dir = plan.output / "val" / loss / _tau_dir(tau) / f"seed_{seed}"
                jobs.append(Job(plan.recipe, run_dir, seed, split + _loss_args(loss, tau), "tau"))
                keys.append((loss, tau, seed))
    results = run_jobs(runner, jobs, plan.workers, plan.threads, done)
    rows = [{"loss": loss, "tau": tau, "seed": seed, **metric_row(m, names=TABLE_METRICS)}
            for (loss, tau, seed), m in zip(keys, results)]  # fmt: skip
    choice: dict[str, float | None] = {}
    for loss in plan.losses:
        scores = {}
        for tau in plan.tau_grid or ():
            gaps = [r["gAP"] for r in rows if r["loss"] == loss and r["tau"] == tau]
            if gaps:
                scores[tau] = mean_std(gaps)[0]
        # the first grid value among equal scores: ties go to the grid's order
        choice[loss] = max(scores, key=scores.__getitem__) if scores else None
    return choice, rows


def run_tests(
    plan: Comparison,
    runner: Runner,
    taus: dict[str, float | None],
    done: Callable | None = None,
) -> list[dict[str, Any]]:
    """Every loss × seed on the test split at its temperature; one row per run."""
    test = on_test_split(plan.recipe)
    jobs, keys = [], []
    for loss in plan.losses:
        for seed in plan.seeds:
            run_dir = plan.output / "test" / loss / _tau_dir(taus[loss]) / f"seed_{seed}"
            jobs.append(Job(plan.recipe, run_dir, seed, test + _loss_args(loss, taus[loss])))
            keys.append((loss, seed))
    results = run_jobs(runner, jobs, plan.workers, plan.threads, done)
    return [{"loss": loss, "seed": seed, **metric_row(m, names=TABLE_METRICS)}
            for (loss, seed), m in zip(keys, results)]  # fmt: skip


@dataclass
class Result:
    """A finished comparison: runs, aggregated rows, temperatures, verdict lines, text."""

    rows: list[dict[str, Any]]
    summary: list[dict[str, Any]]
    temperatures: dict[str, float | None]
    verdicts: list[Any]
    text: str
    seconds: float


def compare(
    plan: Comparison, runner: Runner, progress: Callable[[str], None] | None = None
) -> Result:
    """Run the comparison (module doc) and write its files; return the result."""
    plan.check()
    plan.output.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()

    def done(job: Job, metrics: dict[str, float]) -> None:
        if progress is not None:
            where = job.run_dir.relative_to(plan.output)
            progress(
                f"{where}: {job.job_type} gAP {100 * metrics.get('val/gap', float('nan')):.2f}"
            )

    val_rows: list[dict[str, Any]] = []
    val_gap: dict[str, float] = {}
    if plan.tau_grid is not None:
        taus, val_rows = choose_temperatures(plan, runner, done)
        write_csv(plan.output / "val_runs.csv", val_rows)
        for loss, tau in taus.items():
            gaps = [r["gAP"] for r in val_rows if r["loss"] == loss and r["tau"] == tau]
            if gaps:
                val_gap[loss] = mean_std(gaps)[0]
        (plan.output / "temperatures.json").write_text(json.dumps(taus, indent=1))
    else:
        taus = {loss: None for loss in plan.losses}
    rows = run_tests(plan, runner, taus, done)
    forced = override_temperature(plan.extra)  # an override wins over the recipe's tables
    chosen = {
        loss: taus[loss] if taus[loss] is not None
        else (forced if forced is not None and takes_temperature(loss)
              else recipe_temperature(plan.recipe, loss))
        for loss in plan.losses
    }  # fmt: skip
    summary = aggregate(rows, ["loss"], tuple(TABLE_METRICS))
    for row in summary:
        row["tau"] = chosen[row["loss"]]
    verdicts = paired_verdicts(rows, plan.verdict_metrics)
    seconds = time.perf_counter() - start
    text = report(plan, summary, verdicts, chosen, val_gap, val_rows)
    write_csv(plan.output / "runs.csv", rows)
    write_csv(plan.output / "table.csv", summary)
    (plan.output / "table.md").write_text(text + "\n")
    plot_paired(rows, ("gAP", "mAP", "C", "gAP/C"), plan.output / "paired.png")
    return Result(rows, summary, chosen, verdicts, text, seconds)


def report(
    plan: Comparison,
    summary: list[dict[str, Any]],
    verdicts: Sequence[Any],
    taus: dict[str, float | None],
    val_gap: dict[str, float],
    val_rows: Sequence[dict[str, Any]],
) -> str:
    """The Markdown report: temperatures, the mean ± std table, the paired verdicts."""
    header = ["loss", "τ", *(f"{m} (%)" for m in TABLE_METRICS)]
    body = [[r["loss"], "-" if r["tau"] is None else f"{r['tau']:g}",
             *(cell(r, m) for m in TABLE_METRICS)] for r in summary]  # fmt: skip
    seeds = list(plan.seeds)
    lines = [markdown_table(header, body), ""]
    lines.append(
        f"Test split, mean ± std over {len(seeds)} seed(s) {seeds[0]}..{seeds[-1]} (ddof=1); each "
        "seed sets the initialisation and the data order of every loss. C: consistency "
        "ceiling (best gAP of the same per-query rankings), gAP/C: efficiency."
    )
    if plan.tau_grid is not None:
        grid = ", ".join(f"{t:g}" for t in plan.tau_grid)
        chosen = "; ".join(
            f"{loss} {tau:g} (val gAP {100 * val_gap[loss]:.2f})" if tau is not None and loss in val_gap
            else f"{loss}: recipe's" for loss, tau in taus.items()
        )  # fmt: skip
        lines.append(
            f"τ per loss: best mean validation gAP over the grid {{{grid}}} with seed(s) "
            f"{list(plan.tau_seeds)} on a {1 - plan.val_split:.0%}/{plan.val_split:.0%} "
            f"class split of the training classes: {chosen}."
        )
        lines.append("")
        lines.append(_grid_table(plan, val_rows))
    elif override_temperature(plan.extra) is not None:
        lines.append("τ per loss: set for every loss by the overrides.")
    else:
        lines.append(f"τ per loss: {plan.tau_source}.")
    lines += ["", f"Paired verdicts, {PAIRED_RULE}:", ""]
    lines += [f"- {v.line()}" for v in verdicts]
    return "\n".join(lines)


def _grid_table(plan: Comparison, val_rows: Sequence[dict[str, Any]]) -> str:
    """Validation gAP (%) per loss × grid value (mean over the τ seeds)."""
    body = []
    for loss in plan.losses:
        values = []
        for tau in plan.tau_grid or ():
            gaps = [r["gAP"] for r in val_rows if r["loss"] == loss and r["tau"] == tau]
            values.append(f"{100 * mean_std(gaps)[0]:.2f}" if gaps else "-")
        body.append([loss, *values])
    return markdown_table(["val gAP (%)", *(f"τ={t:g}" for t in plan.tau_grid or ())], body)


def plot_paired(rows: Sequence[dict[str, Any]], metrics: Sequence[str], path: Path) -> Path:
    """One panel per metric: each loss's per-seed values (%), a grey line joining a seed's runs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    losses = list(dict.fromkeys(r["loss"] for r in rows))
    seeds = sorted({r["seed"] for r in rows})
    fig, axes = plt.subplots(1, len(metrics), figsize=(3.2 * len(metrics), 3.2), squeeze=False)
    for ax, metric in zip(axes[0], metrics):
        value = {(r["loss"], r["seed"]): 100 * float(r[metric]) for r in rows}
        for seed in seeds:
            ys = [value.get((loss, seed), float("nan")) for loss in losses]
            ax.plot(range(len(losses)), ys, color="0.7", lw=1, zorder=1)
        for i, loss in enumerate(losses):
            ys = [value[(loss, s)] for s in seeds if (loss, s) in value]
            ax.scatter([i] * len(ys), ys, s=18, zorder=2, label=loss)
        ax.set_xticks(range(len(losses)), losses)
        ax.set_title(f"{metric} (%)")
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(f"per-seed test values, {len(seeds)} seed(s); a grey line joins one seed's runs")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def log_to_wandb(mode: str, group: str, out: Path, result: Result) -> None:
    """One summary run in the comparison's W&B group: the table, every run, the paired plot."""
    from rl_gap.training.cli import resolve_wandb_mode

    mode = resolve_wandb_mode(mode)
    if mode == "off":
        return
    import wandb

    run = wandb.init(
        project="rl_gap", group=group, job_type="summary", name=f"{group}-summary",
        dir=str(out), mode=mode, settings=wandb.Settings(silent=True, console="off"),
    )  # fmt: skip
    for key, rows in (("compare/table", result.summary), ("compare/runs", result.rows)):
        columns = list(dict.fromkeys(k for r in rows for k in r))
        run.log(
            {key: wandb.Table(columns=columns, data=[[r.get(c) for c in columns] for r in rows])}
        )
    plot = out / "paired.png"
    if plot.is_file():
        run.log({"compare/paired": wandb.Image(str(plot))})
    run.summary.update({f"verdict/{v.a}-{v.b}/{v.metric}": v.mean for v in result.verdicts})
    run.finish()
