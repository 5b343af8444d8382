"""Model selection never looks at the test split.

When validation runs on the test split (``val_split: 0`` in the metric-learning
recipes; the CLIP and MoCo v3 evaluation sets), a ``ModelCheckpoint`` monitoring
a metric would keep the epoch that is best *on test*: the reported number would
be selected on the data it reports. ``guard_model_selection`` therefore:

- asks the datamodule what validation is (``validation_source()``: a description
  of a held-out split, or None for the test split; a datamodule without the
  method is taken to validate on its evaluation split);
- held-out split: keeps the checkpoint monitors (selection on held-out classes);
- test split: drops every checkpoint monitor (only ``last.ckpt`` is kept);
- prints one line saying which, e.g.
  ``validation: held-out 30% of training classes; checkpoint selection on val/gap`` or
  ``validation = test split; no checkpoint selection (monitor val/gap dropped)``.

``RetrievalEvaluation`` runs it at the start of ``fit``; for modules evaluating
themselves (CLIP, MoCo v3) add the ``ModelSelectionGuard`` callback.
"""

from __future__ import annotations

import logging

import lightning as L
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_only

log = logging.getLogger(__name__)

__all__ = ["ModelSelectionGuard", "guard_model_selection", "validation_source"]

_DONE = "_rl_gap_selection_line"


def validation_source(datamodule) -> str | None:
    """Description of a held-out validation split, or None (validation = test split)."""
    describe = getattr(datamodule, "validation_source", None)
    return describe() if callable(describe) else None


def guard_model_selection(trainer: L.Trainer) -> str:
    """Drop checkpoint monitors when validation is the test split; print and return
    the line saying what validation is (once per trainer)."""
    done = getattr(trainer, _DONE, None)
    if done is not None:
        return done
    held_out = validation_source(getattr(trainer, "datamodule", None))
    checkpoints = [c for c in trainer.checkpoint_callbacks if isinstance(c, ModelCheckpoint)]
    monitors = [c.monitor for c in checkpoints if c.monitor is not None]
    if held_out is not None:
        line = f"validation: {held_out}; " + (
            f"checkpoint selection on {', '.join(monitors)}" if monitors else "no monitor"
        )
    else:
        for callback in checkpoints:
            if callback.monitor is not None:
                callback.monitor = None
                callback.save_top_k = 0  # no "best" checkpoint: it would be best on test
                callback.save_last = callback.save_last or True
        line = "validation = test split; no checkpoint selection" + (
            f" (monitor {', '.join(monitors)} dropped: it would select on the test split)"
            if monitors
            else ""
        )
    setattr(trainer, _DONE, line)
    _announce(line)
    return line


@rank_zero_only
def _announce(line: str) -> None:
    print(line, flush=True)
    log.info(line)


class ModelSelectionGuard(Callback):
    """Runs ``guard_model_selection`` at the start of ``fit`` (see the module docstring)."""

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit":
            guard_model_selection(trainer)
