"""The gSAP paper's experimental protocols as commands built on the training CLI.

- :mod:`rl_gap.experiments.runner`: one seeded ``rl-gap fit`` run (in process or
  as a child/DDP job), its final metrics, resumable via ``result.json``;
- :mod:`rl_gap.experiments.grid`: settings × seeds sweeps, their shared options, runs side
  by side in worker processes (``run_jobs``);
- :mod:`rl_gap.experiments.tables`: mean ± std tables as CSV / Markdown, paired verdicts;
- :mod:`rl_gap.experiments.compare`: ``rl-gap compare`` and ``make demo`` (losses × seeds
  on one recipe, τ chosen on held-out training classes, paired verdicts, plot);
- :mod:`rl_gap.experiments.scarce`: ``rl-gap sweep-scarce`` (γ × ρ × loss);
- :mod:`rl_gap.experiments.studies`: negative-dropping and temperature studies
  (``python -m research.studies neg_drop``, ``python -m research.studies temperature``).

``rl-gap tune`` (Optuna search + seeds) lives in :mod:`rl_gap.commands.tune`.
"""
