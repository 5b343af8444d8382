"""The training studies of rl_gap.experiments.studies, by name.

    python -m research.studies neg_drop [--alphas 0 0.5 0.9 0.95 0.99 0.999] [--num-seeds 3]
        [--recipes recipes/demo/mnist_gsap.yaml] [--output runs/studies/neg_drop]
        [--overrides "--trainer.max_epochs 2"] [--wandb off]
    python -m research.studies temperature [--temperatures 1e-4 1e-3 1e-2 5e-2 0.1 0.5]
        [--recipes recipes/demo/mnist_gsap.yaml recipes/demo/mnist_msap.yaml] [...]

``neg_drop``: gAP and mAP against the drop rate α (gSAP paper Fig. 2 / Table M);
``temperature``: gAP and mAP against τ for each loss (gSAP paper §B.3). Each writes
``<study>.csv``, ``<study>_runs.csv``, ``<study>.md`` and ``<study>.png`` to ``--output``
and prints the table; ``python -m research.studies <study> --help`` lists its options.
"""

from __future__ import annotations

import sys

from rl_gap.experiments.studies import neg_drop_main, temperature_main

STUDIES = {"neg_drop": neg_drop_main, "temperature": temperature_main}


def main(argv: list[str] | None = None) -> None:
    """Run the study named by ``argv[0]`` with the remaining arguments."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in STUDIES:
        got = repr(argv[0]) if argv else "nothing"
        sys.exit(f"usage: python -m research.studies {{{','.join(STUDIES)}}} ...; got {got}")
    STUDIES[argv[0]](argv[1:])


if __name__ == "__main__":
    main()
