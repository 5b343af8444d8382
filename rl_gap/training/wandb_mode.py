"""W&B's mode for a command (``--wandb auto`` follows W&B's own credential lookup) and the
W&B runs of the plain commands (``evaluate``, ``knn``, ``linear-probe``, ``extrapolate``).

Light (no Lightning; wandb imported only when a credential file exists or a run starts), so
that a plain command decides whether to log before importing anything heavy.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

WandbMode = Literal["auto", "online", "offline", "off"]


def resolve_wandb_mode(mode: str) -> str:
    """``auto`` -> ``online`` when W&B finds credentials, else ``offline``; ``WANDB_MODE`` wins."""
    return wandb_mode_reason(mode)[0]


def wandb_mode_reason(mode: str, without_credentials: str = "offline") -> tuple[str, str]:
    """(the W&B mode a command runs in, why) for ``--wandb mode``.

    ``WANDB_MODE=disabled|offline`` wins over ``auto``; ``auto`` is online when
    :func:`wandb_credentials` finds a key where W&B itself would look, else
    ``without_credentials`` (training: ``offline``; the plain commands: ``off``).
    """
    env = os.environ.get("WANDB_MODE", "").lower()
    if env in ("disabled", "off"):
        return "off", f"WANDB_MODE={env}"
    if mode != "auto":
        return mode, f"--wandb {mode}"
    plain = without_credentials == "off"  # a plain command logs only where W&B would
    if env in ("offline", "dryrun") and not plain:
        return "offline", f"WANDB_MODE={env}"
    source = wandb_credentials()
    if source and env in ("offline", "dryrun"):
        return "offline", f"WANDB_MODE={env}"
    if source:
        return "online", f"credentials from {source}"
    return without_credentials, (
        "no W&B credentials: WANDB_API_KEY unset, no `wandb login` key in ~/.netrc or W&B "
        "settings; `wandb login` to go online"
    )


def wandb_credentials() -> str | None:
    """Where W&B would read an API key from (``WANDB_API_KEY``, the netrc file ``wandb login``
    wrote, W&B's settings file), or None. Nothing is sent anywhere: the key is not checked.

    Follows W&B's own order (``wandb.init``'s credential lookup: environment, netrc for
    the configured host, then the settings' ``api_key``) through its auth helpers.
    """
    for name in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE"):
        if os.environ.get(name):
            return name
    if not _credential_files():
        return None  # nothing W&B could read: no need to import it
    try:
        from wandb.sdk import wandb_setup
        from wandb.sdk.lib.wbauth import HostUrl
        from wandb.sdk.lib.wbauth.wbnetrc import read_netrc_auth_with_source
    except ImportError:  # another wandb layout: the netrc that `wandb login` writes
        return _netrc_credentials()
    try:
        with contextlib.redirect_stderr(io.StringIO()):  # W&B's "Loading settings" line
            settings = wandb_setup.singleton().settings
        found = read_netrc_auth_with_source(host=HostUrl(settings.base_url))
    except Exception:  # an unreadable or malformed key: W&B would refuse it too
        return None
    if found is not None:
        return str(found.source)
    if settings.api_key:
        return "W&B settings (api_key)"
    return None


def _netrc_credentials() -> str | None:
    import netrc

    path = Path(os.environ.get("NETRC") or Path.home() / ".netrc")
    try:
        entry = netrc.netrc(str(path)).authenticators("api.wandb.ai")
    except (OSError, netrc.NetrcParseError):
        return None
    return str(path) if entry and entry[2] else None


def _credential_files() -> list[Path]:
    """The files W&B may read a key from that exist: the netrc file, W&B's settings."""
    home = Path.home()
    netrc = (
        [Path(os.environ["NETRC"])]
        if os.environ.get("NETRC")
        else [home / ".netrc", home / "_netrc"]
    )
    config = Path(os.environ.get("WANDB_CONFIG_DIR") or home / ".config" / "wandb")
    return [p for p in [*netrc, config / "settings"] if p.is_file()]


def recorded_group(root: Path) -> str | None:
    """The W&B group of the training run in ``root`` (``<root>/wandb_group``), if recorded."""
    path = Path(root) / "wandb_group"
    return (path.read_text().strip() or None) if path.is_file() else None


_COMMAND_RUN: Any = None  # the W&B run of the plain command running in this process


@contextmanager
def command_wandb_run(
    command: str, args: Any, mode: str = "auto", project: str = "rl_gap"
) -> Iterator[Any]:
    """A W&B run of its own for a plain command (``evaluate``, ``knn``, ``linear-probe``,
    ``extrapolate``), or None when W&B is off.

    ``auto`` logs only where W&B finds credentials (a command is not a training run: no
    offline folder appears uninvited); ``online``/``offline`` always. The run's files go
    inside the command's output or run folder (:func:`command_folder`); it joins the W&B
    group of the training run whose checkpoint it reads; its config is the command's
    arguments. The command reports its numbers with :func:`log_command_result`.
    """
    global _COMMAND_RUN
    mode, why = wandb_mode_reason(mode, without_credentials="off")
    if mode == "off":
        yield None
        return
    import wandb

    folder = command_folder(args)
    folder.mkdir(parents=True, exist_ok=True)
    config = {k: v if isinstance(v, int | float | str | bool | None) else str(v)
              for k, v in vars(args).items()}  # fmt: skip
    run = wandb.init(
        project=project, dir=str(folder), mode=mode, job_type=command,
        group=recorded_group(folder) or _folder_id(folder), name=f"{command} {folder.name}",
        config={"command": command, **config}, reinit="create_new",
        settings=wandb.Settings(silent=True, console="off"),
    )  # fmt: skip
    print(f"W&B: {mode} ({why})", file=sys.stderr)
    _COMMAND_RUN = run
    try:
        yield run
    finally:
        _COMMAND_RUN = None
        run.finish()


def _folder_id(folder: Path) -> str | None:
    path = folder / "wandb_id"
    return (path.read_text().strip() or None) if path.is_file() else None


def command_folder(args: Any) -> Path:
    """Where a plain command's W&B files go: the training run folder (the one holding
    ``wandb_id``) above its ``--checkpoint`` or input embeddings (``--queries`` of a predict
    folder), else the folder of its ``--output``, else the checkpoint's folder, else the
    working directory."""
    inputs = [getattr(args, name, None) for name in ("checkpoint", "queries", "embeddings")]
    for value in inputs:
        if isinstance(value, str) and value:
            path = Path(value).resolve()
            for folder in [path, *path.parents][:5]:
                if (folder / "wandb_id").is_file():
                    return folder
    output = getattr(args, "output", None)
    if output:
        path = Path(output)
        return path.parent if path.suffix else path
    checkpoint = getattr(args, "checkpoint", None)
    if checkpoint:
        path = Path(checkpoint).resolve()
        return path.parent.parent if path.parent.name == "checkpoints" else path.parent
    return Path.cwd()


def log_command_result(result: Mapping[str, Any]) -> None:
    """The numbers of a plain command's result (nested keys joined by ``/``) into its W&B
    run's summary; nothing when the command has no W&B run."""
    if _COMMAND_RUN is None:
        return
    numbers = {
        k: v for k, v in _flat(result).items()
        if isinstance(v, int | float) and not isinstance(v, bool)
    }  # fmt: skip
    _COMMAND_RUN.summary.update(numbers)


def _flat(result: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in result.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(_flat(value, f"{name}/"))
        else:
            out[name] = value
    return out
