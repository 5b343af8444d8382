"""Every private name of Lightning and jsonargparse that rl_gap relies on, and why.

Private names can change in any release. Each one rl_gap uses is listed here with the place
that uses it and the reason no public API serves; ``setup.cfg`` bounds ``lightning`` above
at the last version tested and ``constraints.txt`` pins both libraries, and
``tests/training/test_private_apis.py`` resolves every entry (and fails, naming the entry
and its use, when a release removes one), and checks that no private name in the package
source is missing from this list.

Nothing here is imported at run time by the code that uses these names: this module is the
inventory, read by the test and by whoever upgrades Lightning.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PrivateAPI:
    """One private name.

    Attributes:
        name: the name as rl_gap spells it (``module:Object.attribute``).
        used_in: the rl_gap files that use it.
        why: why no public API serves.
        resolve: returns the object; raises ``ImportError`` or ``AttributeError`` when gone.
    """

    name: str
    used_in: tuple[str, ...]
    why: str
    resolve: Callable[[], Any]


def _attr(module: str, path: str) -> Callable[[], Any]:
    def resolve() -> Any:
        import importlib

        value: Any = importlib.import_module(module)
        for part in path.split("."):
            value = getattr(value, part)
        return value

    return resolve


def _bare_trainer() -> Any:
    """A CPU trainer that writes nothing (its connectors and loops are built in ``__init__``)."""
    import lightning as L

    return L.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )


def _on_trainer(path: str) -> Callable[[], Any]:
    def resolve() -> Any:
        value = _bare_trainer()
        for part in path.split("."):
            value = getattr(value, part)
        return value

    return resolve


def _observer_children() -> Any:
    from lightning.fabric.strategies.launchers.subprocess_script import _ChildProcessObserver

    return _ChildProcessObserver(main_pid=0, child_processes=[])._child_processes


def _launcher_procs(kind: str) -> Callable[[], Any]:
    def resolve() -> Any:
        from unittest import mock

        if kind == "script":
            from lightning.pytorch.strategies.launchers.subprocess_script import (
                _SubprocessScriptLauncher,
            )

            return _SubprocessScriptLauncher(mock.Mock(), num_processes=1, num_nodes=1).procs
        from lightning.pytorch.strategies.launchers.multiprocessing import (
            _MultiProcessingLauncher,
        )

        return _MultiProcessingLauncher(mock.Mock(), start_method="spawn").procs

    return resolve


ARGPARSE_INTERNALS = (
    "_actions",
    "_action_groups",
    "_mutually_exclusive_groups",
    "_format_action",
    "_format_action_invocation",
    "_format_actions_usage",
    "_split_lines",
)


def _argparse_internals() -> list[Any]:
    import argparse

    parser = argparse.ArgumentParser()
    formatter = argparse.HelpFormatter
    return [
        getattr(formatter if n.startswith(("_format", "_split")) else parser, n)
        for n in ARGPARSE_INTERNALS
    ]


def _subcommands_action() -> Any:
    from jsonargparse import ArgumentParser

    parser = ArgumentParser()
    parser.add_subcommands().add_subcommand("fit", ArgumentParser())
    return parser._subcommands_action._name_parser_map


PRIVATE_APIS: tuple[PrivateAPI, ...] = (
    PrivateAPI(
        "lightning.pytorch.cli:LightningCLI._parse_ckpt_path",
        ("rl_gap/training/cli.py",),
        "Lightning replaces the model's settings by those stored in --ckpt_path while parsing; "
        "a resumed fit must train with the settings its command line states (the resume "
        "checks allow only changes that are applied), and no public option turns that off",
        _attr("lightning.pytorch.cli", "LightningCLI._parse_ckpt_path"),
    ),
    PrivateAPI(
        "lightning.pytorch.cli:LightningCLI._instantiate_trainer",
        ("rl_gap/training/cli.py",),
        "the one hook between the parsed config and the Trainer: rl-gap adds its fault "
        "tolerance and fresh-fit guard callbacks and turns off use_distributed_sampler for "
        "data modules that shard batches themselves; instantiate_trainer (public) receives "
        "only the extra callbacks, not the trainer keywords",
        _attr("lightning.pytorch.cli", "LightningCLI._instantiate_trainer"),
    ),
    PrivateAPI(
        "lightning.pytorch.cli:LightningCLI._run_subcommand",
        ("rl_gap/training/cli.py",),
        "wraps the fit itself (not its construction) in the SIGTERM-safe launch and releases "
        "the run-folder lock after every rank ended; LightningCLI has no public hook around "
        "the subcommand call (before_/after_<subcommand> hooks do not see its exceptions)",
        _attr("lightning.pytorch.cli", "LightningCLI._run_subcommand"),
    ),
    PrivateAPI(
        "jsonargparse:ArgumentParser._parse_common",
        ("rl_gap/training/parser.py",),
        "the one step every parse (command line, recipe, environment) goes through with the "
        "merged config before it is checked and instantiated: the loss section is read "
        "there; jsonargparse has no public post-merge hook",
        _attr("jsonargparse", "ArgumentParser._parse_common"),
    ),
    PrivateAPI(
        "jsonargparse:ArgumentParser._subcommands_action",
        ("rl_gap/help_spec/__init__.py",),
        "the help record walks the subcommand parsers to store their pages; jsonargparse "
        "exposes no public list of a parser's subcommand parsers",
        _subcommands_action,
    ),
    PrivateAPI(
        "argparse:ArgumentParser/HelpFormatter " + ", ".join(ARGPARSE_INTERNALS),
        ("rl_gap/help_spec/__init__.py", "rl_gap/cli.py"),
        "the help record stores each page's actions and groups and replays them through "
        "argparse's own layout (so the text matches the live parser at any width); argparse "
        "(standard library, which jsonargparse builds on) has no public view of either",
        _argparse_internals,
    ),
    PrivateAPI(
        "lightning.pytorch:Trainer._signal_connector._sigterm_notifier_fn",
        ("rl_gap/training/fault_tolerance.py",),
        "Lightning installs this function as its SIGTERM handler when training starts; "
        "rl-gap replaces it before that so a SIGTERM from any moment is recorded and acted "
        "on at a step boundary; there is no public handler setting",
        _on_trainer("_signal_connector._sigterm_notifier_fn"),
    ),
    PrivateAPI(
        "lightning.pytorch:Trainer._signal_connector.received_sigterm",
        ("rl_gap/training/fault_tolerance.py",),
        "the flag Lightning's loops read to stop every rank together after a SIGTERM; "
        "rl-gap sets it when it stops a run itself, so Lightning tears down as it does for "
        "its own SIGTERM (no public setter)",
        _on_trainer("_signal_connector.received_sigterm"),
    ),
    PrivateAPI(
        "lightning.pytorch:Trainer._accelerator_connector.use_distributed_sampler",
        ("rl_gap/data/resumable.py", "rl_gap/data/metric_learning.py"),
        "a data module that shards the global batch itself must refuse a trainer that would "
        "also wrap it in a DistributedSampler; the Trainer keeps its "
        "use_distributed_sampler argument only on this connector",
        _on_trainer("_accelerator_connector.use_distributed_sampler"),
    ),
    PrivateAPI(
        "lightning.pytorch:Trainer.fit_loop.epoch_loop.val_loop._data_source",
        ("rl_gap/training/schedule_check.py",),
        "whether a validation loader is defined (the test Lightning itself makes before "
        "validating); the loader is built only later, so no public attribute says it yet",
        _on_trainer("fit_loop.epoch_loop.val_loop._data_source.is_defined"),
    ),
    PrivateAPI(
        "lightning.fabric.strategies.launchers.subprocess_script:_ChildProcessObserver",
        ("rl_gap/training/signals.py",),
        "the thread that kills every rank when one dies: rl-gap subclasses it (its _run and "
        "_child_processes) so a rank stopping on SIGTERM after saving is not a crash; the "
        "observer is not configurable",
        _observer_children,
    ),
    PrivateAPI(
        "lightning.pytorch.strategies.launchers.subprocess_script:_launch_process_observer",
        ("rl_gap/training/signals.py",),
        "where the script launcher starts that observer; swapped for the subclass during a "
        "fit (no public option chooses the observer)",
        _attr(
            "lightning.pytorch.strategies.launchers.subprocess_script", "_launch_process_observer"
        ),
    ),
    PrivateAPI(
        "lightning.pytorch.strategies.launchers.subprocess_script:_SubprocessScriptLauncher.procs",
        ("rl_gap/training/signals.py",),
        "the ddp launcher's worker processes, which rl-gap waits for (and kills when stuck) "
        "before releasing the run lock; the launcher class is only reachable by type",
        _launcher_procs("script"),
    ),
    PrivateAPI(
        "lightning.pytorch.strategies.launchers.multiprocessing:_MultiProcessingLauncher.procs",
        ("rl_gap/training/signals.py",),
        "the ddp_spawn workers, signalled and awaited the same way",
        _launcher_procs("spawn"),
    ),
)


def missing() -> list[str]:
    """One line per entry that no longer resolves (empty: every private name is there)."""
    gone = []
    for api in PRIVATE_APIS:
        try:
            api.resolve()
        except (ImportError, AttributeError) as err:
            gone.append(
                f"{api.name} is gone ({type(err).__name__}: {err}); rl_gap uses it in "
                f"{', '.join(api.used_in)} because {api.why}"
            )
    return gone
