"""Write files into a Hugging Face Hub cache folder in the hub's own layout.

``<cache>/models--<org>--<name>/refs/main`` holds the revision and
``snapshots/<revision>/<file>`` the files: exactly what ``hf_hub_download``
reads with ``HF_HUB_OFFLINE=1``, so a test can exercise the real
download-or-cache code path of timm and open_clip without a network.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

REVISION = "0123456789abcdef0123456789abcdef01234567"


def write_hub_repo(cache: Path, repo_id: str, files: dict[str, Any]) -> Path:
    """Store ``files`` (name -> dict for JSON, tensor dict for weights, or bytes) under ``repo_id``.

    Weight files are written by extension: ``.safetensors`` with safetensors,
    ``.bin`` with ``torch.save``. Returns the snapshot folder.
    """
    from safetensors.torch import save_file

    org, name = repo_id.split("/")
    repo = cache / f"models--{org}--{name}"
    snapshot = repo / "snapshots" / REVISION
    snapshot.mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(REVISION)
    for filename, content in files.items():
        target = snapshot / filename
        if filename.endswith(".json"):
            target.write_text(json.dumps(content))
        elif filename.endswith(".safetensors"):
            save_file({k: v.contiguous() for k, v in content.items()}, str(target))
        elif filename.endswith(".bin"):
            torch.save(content, target)
        else:
            target.write_bytes(content)
    return snapshot


def scrambled(state: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    """The state dict with every float tensor redrawn from N(0, 1) (no initialiser gives these)."""
    generator = torch.Generator().manual_seed(seed)
    return {
        k: torch.randn(v.shape, generator=generator) if v.is_floating_point() else v.clone()
        for k, v in state.items()
    }
