"""Non-training ``rl-gap`` sub-commands (argparse), loaded lazily by name.

Each module exposes ``add_arguments(parser)`` and ``run(args) -> int``.
"""

COMMANDS: dict[str, tuple[str, str]] = {
    # name: (module, one-line help)
    "evaluate": (
        "rl_gap.commands.evaluate",
        "retrieval metrics from saved embeddings (checkpoints: rl-gap validate|test)",
    ),
    "extrapolate": (
        "rl_gap.commands.extrapolate",
        "predict web-scale mAP@k from a distractor sample",
    ),
    "linear-probe": (
        "rl_gap.commands.linear_probe",
        "linear probe on frozen features of a checkpoint",
    ),
    "knn": ("rl_gap.commands.knn", "weighted kNN classification on frozen features"),
    "tune": (
        "rl_gap.commands.tune",
        "Optuna search of lr and τ per loss, then seeds: mean ± std table (CSV, Markdown, W&B)",
    ),
    "compare": (
        "rl_gap.commands.compare",
        "losses × seeds on one recipe (optional τ grid on held-out classes): table, paired verdicts",
    ),
    "sweep-scarce": (
        "rl_gap.experiments.scarce",
        "scarce-data protocol: γ% of classes × ρ images per class × loss table over seeds",
    ),
}
