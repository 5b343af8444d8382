"""Pretrained weights by name, fetched through timm's and open_clip's own download and cache.

Both libraries fetch from the Hugging Face Hub into its cache (``$HF_HOME/hub``,
or ``$HF_HUB_CACHE``); timm's older URL weights go to torch.hub's cache
(``$TORCH_HOME/hub/checkpoints``), open_clip's to ``~/.cache/clip``. With
``HF_HUB_OFFLINE=1`` only the cache is read. A name that the cache does not hold
and that cannot be downloaded raises :class:`PretrainedWeightsUnavailable`, one
line naming the caches that were searched. ``hf-hub:timm/<registered name>`` is also
found in a cache that holds the repository's weights but not its ``config.json`` (as
timm fills it for ``<registered name>`` with ``pretrained: true``): timm's registry
has the same architecture and reads the same weight file.

Evaluating a checkpoint (``rl-gap validate|test|predict --ckpt_path``) builds the
model inside :func:`weights_from_checkpoint`: the checkpoint replaces every weight,
so named weights and weight files are not read at all (an offline node needs no
cache). The architecture and the preprocessing (CLIP's mean/std) are taken from
the names' static configs, the same ones the trained run resolved: timm's model
registry for ``resnet50.tv_in1k`` and for ``hf-hub:timm/<registered name>``,
open_clip's pretrained registry for a tag such as ``openai``. Other Hub names
carry their architecture in the Hub repository, which is read from the cache.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar

HF_HUB_PREFIXES = ("hf-hub:", "hf_hub:")


_FROM_CHECKPOINT: ContextVar[bool] = ContextVar("rl_gap_weights_from_checkpoint", default=False)


@contextmanager
def weights_from_checkpoint(active: bool = True) -> Iterator[None]:
    """Models built inside take every weight from a checkpoint loaded afterwards: no named
    pretrained weights are fetched and no weight file is read (see the module docstring)."""
    token = _FROM_CHECKPOINT.set(bool(active))
    try:
        yield
    finally:
        _FROM_CHECKPOINT.reset(token)


def weights_come_from_checkpoint() -> bool:
    """True inside :func:`weights_from_checkpoint`."""
    return _FROM_CHECKPOINT.get()


class PretrainedWeightsUnavailable(RuntimeError):
    """Named pretrained weights that are neither cached nor downloadable."""


def is_hub_name(name: str | None) -> bool:
    """True for ``hf-hub:org/repo`` names (weights and config live in that Hub repository)."""
    return bool(name) and str(name).startswith(HF_HUB_PREFIXES)


def hf_hub_cache() -> str:
    """The Hugging Face Hub cache folder in effect (``HF_HUB_CACHE``, else ``$HF_HOME/hub``)."""
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


def torch_hub_checkpoints() -> str:
    """torch.hub's weight cache (``$TORCH_HOME/hub/checkpoints``), used by timm for URL weights."""
    import torch.hub

    return os.path.join(torch.hub.get_dir(), "checkpoints")


def hub_offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def _network_errors() -> tuple[type[BaseException], ...]:
    # OSError covers the hub's LocalEntryNotFoundError, urllib and requests errors.
    errors: list[type[BaseException]] = [OSError]
    try:
        from huggingface_hub.errors import HfHubHTTPError

        errors.append(HfHubHTTPError)
    except ImportError:  # pragma: no cover - every supported huggingface_hub has it
        pass
    return tuple(errors)


@contextmanager
def fetching(what: str, caches: Sequence[str]) -> Iterator[None]:
    """Re-raise a failed download/cache look-up of ``what`` as one line naming ``caches``."""
    try:
        yield
    except _network_errors() as err:
        mode = "HF_HUB_OFFLINE=1, cache only" if hub_offline() else "download failed"
        raise PretrainedWeightsUnavailable(
            f"cannot load pretrained weights {what}: not in the local cache ({mode}); "
            f"looked in {' and '.join(caches)}; point HF_HOME / TORCH_HOME at a cache that "
            f"holds them, or allow downloads [{type(err).__name__}]"
        ) from err
