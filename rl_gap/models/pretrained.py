"""Pretrained weights by name, fetched through timm's and open_clip's own download and cache.

Both libraries fetch from the Hugging Face Hub into its cache (``$HF_HOME/hub``,
or ``$HF_HUB_CACHE``); timm's older URL weights go to torch.hub's cache
(``$TORCH_HOME/hub/checkpoints``), open_clip's to ``~/.cache/clip``. With
``HF_HUB_OFFLINE=1`` only the cache is read. A name that the cache does not hold
and that cannot be downloaded raises :class:`PretrainedWeightsUnavailable`, one
line naming the caches that were searched.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

HF_HUB_PREFIXES = ("hf-hub:", "hf_hub:")


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
