"""The private Lightning/jsonargparse names rl_gap relies on: listed, present, and bounded.

A release that drops one fails here, naming the name, the files that use it and why
(``rl_gap/training/private_apis.py``), instead of failing inside a training run.
"""

from __future__ import annotations

import configparser
import re
from pathlib import Path

from lightning.pytorch.cli import LightningCLI

from rl_gap.training import private_apis
from rl_gap.training.private_apis import PRIVATE_APIS, missing

ROOT = Path(__file__).resolve().parents[2]
# Private names as the package source spells them: imported from Lightning/jsonargparse, or
# reached as an attribute of one of their objects.
PRIVATE_IMPORT = re.compile(r"from (?:lightning|jsonargparse)[\w.]* import ([^\n]+)")
PRIVATE_ATTRIBUTE = re.compile(
    r"(?:trainer|connector|val_loop|parser|fabric_subprocess|pl_subprocess|super\(\))"
    r"\.(_[A-Za-z]\w*)"
)


def test_every_private_name_resolves_in_the_installed_versions():
    gone = missing()
    assert not gone, "private Lightning/jsonargparse names are gone:\n" + "\n".join(gone)


def test_a_removed_name_is_reported_with_where_and_why(monkeypatch):
    monkeypatch.delattr(LightningCLI, "_run_subcommand")
    (line,) = missing()
    assert line.startswith("lightning.pytorch.cli:LightningCLI._run_subcommand is gone (")
    assert "AttributeError" in line and "rl_gap/training/cli.py because" in line


def test_every_private_name_in_the_package_is_listed():
    listed = " ".join(api.name for api in PRIVATE_APIS)
    found = set()
    for path in (ROOT / "rl_gap").rglob("*.py"):
        if path.name == "private_apis.py":
            continue
        text = path.read_text()
        for names in PRIVATE_IMPORT.findall(text):
            found |= {n.strip(" ()") for n in names.split(",") if n.strip(" ()").startswith("_")}
        found |= set(PRIVATE_ATTRIBUTE.findall(text))
    own = {"_run_with_sigterm_exit", "_wandb_run", "_rl_gap_resumed_wandb_id", "_loss"}
    found -= own | {"_loss_sharded"}  # rl_gap's own methods and attributes
    unlisted = sorted(name for name in found if name not in listed)
    assert not unlisted, f"private names used but not in private_apis.py: {unlisted}"
    assert {"_instantiate_trainer", "_ChildProcessObserver", "_parse_common"} <= found


def test_every_listed_use_names_a_file_that_uses_it():
    for api in PRIVATE_APIS:
        last = re.split(r"[.:, ]", api.name)[-1]
        for rel in api.used_in:
            assert last in (ROOT / rel).read_text() or rel == "rl_gap/cli.py", (api.name, rel)


def test_lightning_and_jsonargparse_are_bounded_above_at_the_pinned_versions():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    reqs = {
        re.split(r"[\[>=<]", r.strip())[0]: r.strip()
        for r in cfg["options"]["install_requires"].splitlines()
        if r.strip()
    }
    pins = dict(
        line.split("==") for line in (ROOT / "constraints.txt").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    )  # fmt: skip
    for name in ("lightning", "jsonargparse"):
        assert reqs[name].endswith(f",<={pins[name]}"), (reqs[name], pins[name])
    assert private_apis.__doc__ and "setup.cfg" in private_apis.__doc__


def test_no_product_code_reads_jsonargparse_error_text():
    """Setting errors are told apart by type and origin (run_setup.setting_error)."""
    hits = [
        f"{path.relative_to(ROOT)}"
        for path in (ROOT / "rl_gap").rglob("*.py")
        if "Does not validate against any of the Union subtypes" in path.read_text()
    ]
    assert not hits, hits
