"""LightningCLI for training recipes (``rl-gap fit|validate|test``)."""

from __future__ import annotations

import lightning as L
from lightning.pytorch.cli import LightningCLI

from rl_gap.modules.base import RankingModule


class RLGapCLI(LightningCLI):
    pass


def run_lightning_cli(argv: list[str] | None = None) -> RLGapCLI:
    return RLGapCLI(
        RankingModule,
        L.LightningDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        args=argv,
        save_config_kwargs={"overwrite": True},
    )
