"""``rl-gap compare``: τ chosen on held-out training classes, paired seeds, files, resume.

The fast tests drive :func:`rl_gap.experiments.compare.compare` with a runner that
returns set metrics per (loss, τ, seed): the chosen τ, the table (numpy mean / std, ddof=1)
and the verdicts (hand-computed) are checked against those inputs. The slow test trains
tiny glyph runs through the real command, twice: the second call trains nothing.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from rl_gap.cli import main as cli_main
from rl_gap.experiments.compare import Comparison, compare, recipe_temperature
from rl_gap.experiments.runner import Runner

RECIPE = str(Path(__file__).resolve().parents[2] / "recipes" / "demo" / "glyph_classes.yaml")
GAP = {"gsap": [0.60, 0.62, 0.58], "msap": [0.55, 0.56, 0.57], "infonce": [0.50, 0.61, 0.52]}
VAL = {("gsap", 0.01): 0.7, ("gsap", 0.05): 0.8, ("msap", 0.01): 0.9, ("msap", 0.05): 0.6,
       ("infonce", 0.01): 0.5, ("infonce", 0.05): 0.5}  # fmt: skip


class FakeRunner(Runner):
    """Metrics set per (loss, τ, seed); records every call's overrides."""

    def __init__(self) -> None:
        super().__init__(wandb="off")
        self.calls: list[tuple[int, list[str], str]] = []

    def run(self, recipe, run_dir, seed, overrides=(), job_type="train"):
        overrides = [*self.overrides, *overrides]  # as Runner.run: the runner's, then the run's
        self.calls.append((seed, overrides, job_type))
        loss = overrides[overrides.index("--model.init_args.loss.name") + 1]
        tau = float(overrides[overrides.index("--model.init_args.loss.temperature") + 1])
        split = float(overrides[overrides.index("--data.init_args.val_split") + 1])
        if split > 0:  # the τ search on held-out training classes
            gap = VAL[(loss, tau)]
        else:
            gap = GAP[loss][seed]
        return {"val/gap": gap, "val/map": 0.5, "val/ceiling": gap + 0.1,
                "val/efficiency": gap / (gap + 0.1)}  # fmt: skip


def _plan(tmp_path, **kw):
    return Comparison(recipe=RECIPE, losses=["gsap", "msap", "infonce"], seeds=[0, 1, 2],
                      output=tmp_path, **kw)  # fmt: skip


def test_tau_chosen_on_validation_then_test_runs_paired(tmp_path):
    runner = FakeRunner()
    result = compare(_plan(tmp_path, tau_grid=[0.01, 0.05], val_split=0.3), runner)
    # best mean validation gAP per loss; a tie goes to the first grid value
    assert result.temperatures == {"gsap": 0.05, "msap": 0.01, "infonce": 0.01}
    searches = [c for c in runner.calls if c[2] == "tau"]
    assert len(searches) == 6
    assert all(c[1][c[1].index("--data.init_args.val_split") + 1] == "0.3" for c in searches)
    tests = [c for c in runner.calls if c[2] == "train"]
    assert [(c[1][c[1].index("--model.init_args.loss.name") + 1], c[0]) for c in tests] == [
        (loss, s) for loss in ("gsap", "msap", "infonce") for s in (0, 1, 2)
    ]
    assert all(c[1][c[1].index("--data.init_args.val_split") + 1] == "0" for c in tests)
    taus = {c[1][c[1].index("--model.init_args.loss.name") + 1]:
            c[1][c[1].index("--model.init_args.loss.temperature") + 1] for c in tests}  # fmt: skip
    assert taus == {"gsap": "0.05", "msap": "0.01", "infonce": "0.01"}
    # the table: numpy mean / std (ddof=1) of the set values
    for row in result.summary:
        gaps = np.array(GAP[row["loss"]])
        assert row["gAP_mean"] == pytest.approx(gaps.mean())
        assert row["gAP_std"] == pytest.approx(gaps.std(ddof=1))
        assert row["C_mean"] == pytest.approx(gaps.mean() + 0.1)
    # gsap − infonce on gAP: +0.10, +0.01, +0.06 -> mean 0.0567, ahead 3/3
    v = next(v for v in result.verdicts if (v.a, v.b, v.metric) == ("gsap", "infonce", "gAP"))
    assert v.diffs == pytest.approx((0.10, 0.01, 0.06)) and v.wins == 3
    assert v.mean == pytest.approx(0.17 / 3)
    text = (tmp_path / "table.md").read_text()
    assert "gAP: gsap ahead of infonce in 3/3 seeds, +5.67 ± 4.51 points" in text
    assert "gsap 0.05 (val gAP 80.00)" in text and "| τ=0.01 | τ=0.05 |" in text
    assert json.loads((tmp_path / "temperatures.json").read_text())["gsap"] == 0.05
    with (tmp_path / "runs.csv").open() as f:
        runs = list(csv.DictReader(f))
    assert len(runs) == 9 and float(runs[0]["gAP"]) == GAP["gsap"][0]
    assert (tmp_path / "paired.png").stat().st_size > 1000


def test_without_grid_each_loss_keeps_its_recipe_temperature(tmp_path):
    runner = FakeRunner.__new__(FakeRunner)
    FakeRunner.__init__(runner)
    original = runner.run

    def run(recipe, run_dir, seed, overrides=(), job_type="train"):
        assert "--model.init_args.loss.temperature" not in overrides
        return original(recipe, run_dir, seed, [*overrides, "--model.init_args.loss.temperature",
                                                "0.01"], job_type)  # fmt: skip

    runner.run = run
    result = compare(_plan(tmp_path), runner)
    from_recipe = {loss: recipe_temperature(RECIPE, loss) for loss in ("gsap", "msap", "infonce")}
    assert result.temperatures == from_recipe
    assert "τ per loss: the recipe's loss tables" in result.text


@pytest.mark.parametrize(
    ("kw", "match"),
    [({"losses": ["gsap", "nope"]}, "unknown loss"), ({"losses": ["gsap", "gsap"]}, "distinct"),
     ({"tau_grid": [0.01, -1.0]}, "> 0"), ({"tau_grid": [0.01], "val_split": 1.0}, "val_split"),
     ({"verdict_metrics": ["gAP", "AUC"]}, "unknown verdict metric"),
     ({"extra": ("--data.init_args.val_split", "0.2")}, "overrides set val_split")],
)  # fmt: skip
def test_bad_comparisons_fail_before_training(tmp_path, kw, match):
    plan = Comparison(**{"recipe": RECIPE, "losses": ["gsap", "msap"], "seeds": [0],
                         "output": tmp_path, **kw})  # fmt: skip
    runner = FakeRunner()
    with pytest.raises(ValueError, match=match):
        compare(plan, runner)
    assert runner.calls == []


TINY = (
    "--trainer.enable_progress_bar false --trainer.enable_model_summary false "
    "--data.init_args.train_classes 16 --data.init_args.test_classes 8 "
    "--data.init_args.train_renders 4 --data.init_args.test_renders 3 --data.init_args.canvas 16 "
    "--data.init_args.batch_size 16 --data.init_args.batches_per_epoch 3 "
    "--model.init_args.backbone_kwargs '{width: 4}' --model.init_args.dim 8"
)


@pytest.mark.slow
def test_command_trains_tiny_runs_resumes_and_writes_everything(tmp_path, capsys):
    argv = ["compare", "--config", RECIPE, "--losses", "gsap,infonce", "--seeds", "2",
            "--tau-grid", "0.01,0.1", "--output", str(tmp_path), "--wandb", "off",
            "--jobs", "2", "--threads", "1", "--overrides", TINY]  # fmt: skip
    assert cli_main(argv) == 0
    first = capsys.readouterr().out
    for name in ("runs.csv", "table.csv", "table.md", "paired.png", "val_runs.csv",
                 "temperatures.json"):  # fmt: skip
        assert (tmp_path / name).is_file(), name
    taus = json.loads((tmp_path / "temperatures.json").read_text())
    with (tmp_path / "val_runs.csv").open() as f:
        val = list(csv.DictReader(f))
    for loss in ("gsap", "infonce"):  # the chosen τ is the best validation gAP of its loss
        best = max((r for r in val if r["loss"] == loss), key=lambda r: float(r["gAP"]))
        assert taus[loss] == float(best["tau"])
    with (tmp_path / "runs.csv").open() as f:
        runs = list(csv.DictReader(f))
    assert [(r["loss"], r["seed"]) for r in runs] == [
        ("gsap", "0"),
        ("gsap", "1"),
        ("infonce", "0"),
        ("infonce", "1"),
    ]
    for r in runs:  # the table's numbers are the runs' logged test metrics; seed = data order
        record = json.loads(next((tmp_path / "test" / r["loss"]).glob(
            f"tau_*/seed_{r['seed']}/result.json")).read_text())  # fmt: skip
        assert float(r["gAP"]) == record["metrics"]["val/gap"]
        assert float(r["C"]) == record["metrics"]["val/ceiling"]
        assert record["metrics"]["val/gap"] <= record["metrics"]["val/ceiling"] + 1e-12
        argv_run = record["argv"]
        assert argv_run[argv_run.index("--data.init_args.seed") + 1] == r["seed"]
        assert argv_run[argv_run.index("--seed_everything") + 1] == r["seed"]
    diffs = [float(runs[i]["gAP"]) - float(runs[i + 2]["gAP"]) for i in (0, 1)]
    wins = sum(d > 0 for d in diffs)
    assert f"gAP: gsap ahead of infonce in {wins}/2 seeds, {100 * np.mean(diffs):+.2f}" in first
    versions = sorted(str(p) for p in tmp_path.rglob("version_*"))
    table = (tmp_path / "table.md").read_text()
    # the same command again trains nothing: every run is read back, the same table
    assert cli_main(argv) == 0
    assert sorted(str(p) for p in tmp_path.rglob("version_*")) == versions
    assert (tmp_path / "table.md").read_text() == table


def test_command_groups_runs_in_wandb_and_logs_a_summary(tmp_path, monkeypatch):
    import sys
    import types

    import rl_gap.experiments.compare as engine

    seen: dict = {}

    def fake_compare(plan, runner, progress=None):
        seen["runner"] = runner
        plan.output.mkdir(parents=True, exist_ok=True)
        rows = [{"loss": "gsap", "seed": 0, "gAP": 0.5}, {"loss": "msap", "seed": 0, "gAP": 0.4}]
        verdicts = engine.paired_verdicts(rows, ("gAP",))
        return engine.Result(rows, [{"loss": "gsap", "gAP_mean": 0.5}], {}, verdicts, "T", 1.0)

    class Run:
        def __init__(self):
            self.logged, self.summary = {}, {}

        def log(self, values):
            self.logged.update(values)

        def finish(self):
            seen["finished"] = True

    def init(**kw):
        seen["init"], seen["run"] = kw, Run()
        return seen["run"]

    fake = types.SimpleNamespace(init=init, Table=lambda columns, data: (columns, data),
                                 Image=lambda path: path, Settings=lambda **kw: kw)  # fmt: skip
    monkeypatch.setitem(sys.modules, "wandb", fake)
    monkeypatch.setattr(engine, "compare", fake_compare)
    argv = ["compare", "--config", RECIPE, "--losses", "gsap,msap", "--name", "g1",
            "--output", str(tmp_path), "--wandb", "offline"]  # fmt: skip
    assert cli_main(argv) == 0
    assert seen["runner"].group == "g1" and seen["runner"].wandb == "offline"
    assert seen["init"]["group"] == "g1" and seen["init"]["mode"] == "offline"
    columns, data = seen["run"].logged["compare/runs"]
    assert columns == ["loss", "seed", "gAP"] and data[1] == ["msap", 0, 0.4]
    assert seen["run"].summary["verdict/gsap-msap/gAP"] == pytest.approx(0.1)
    assert seen["finished"]
    seen.clear()
    assert cli_main([*argv[:-1], "off"]) == 0
    assert "init" not in seen  # W&B off: no summary run


def test_a_temperature_override_is_the_reported_tau(tmp_path):
    runner = FakeRunner()
    plan = _plan(tmp_path, extra=("--model.init_args.loss.temperature", "0.05"))
    runner.overrides = list(plan.extra)
    result = compare(plan, runner)
    assert result.temperatures == {"gsap": 0.05, "msap": 0.05, "infonce": 0.05}
    assert "| gsap | 0.05 |" in result.text and "set for every loss by the overrides" in result.text
    with pytest.raises(ValueError, match="drop one of the two"):
        compare(_plan(tmp_path, tau_grid=[0.1], extra=("--model.loss.temperature=0.01",)), runner)
