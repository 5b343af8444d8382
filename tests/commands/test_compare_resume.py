"""``rl-gap compare`` stopped part-way: a member trained to its last step but never
evaluated is evaluated from its checkpoint on resume; a signal stops the workers too.

Tiny glyph runs through the real command; every number is checked against the value
the same run logged when it was not interrupted.
"""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

from rl_gap.cli import main as cli_main

RECIPE = str(Path(__file__).resolve().parents[2] / "recipes" / "demo" / "glyph_classes.yaml")
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
