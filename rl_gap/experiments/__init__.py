"""The gSAP paper's experimental protocols as commands built on the training CLI.

- :mod:`rl_gap.experiments.runner`: one seeded ``rl-gap fit`` run (in process or
  as a child/DDP job), its final metrics, resumable via ``result.json``;
- :mod:`rl_gap.experiments.grid`: settings × seeds sweeps and their shared options;
- :mod:`rl_gap.experiments.tables`: mean ± std tables as CSV / Markdown;
- :mod:`rl_gap.experiments.scarce`: ``rl-gap sweep-scarce`` (γ × ρ × loss);
- :mod:`rl_gap.experiments.studies`: negative-dropping and temperature studies
  (``scripts/study_neg_drop.py``, ``scripts/study_temperature.py``).

``rl-gap tune`` (Optuna search + seeds) lives in :mod:`rl_gap.commands.tune`.
"""
