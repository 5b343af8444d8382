"""Temperature study: gAP and mAP against τ for each loss (gSAP paper §B.3).

    python scripts/study_temperature.py [--temperatures 1e-4 1e-3 1e-2 5e-2 0.1 0.5]
        [--recipes recipes/demo/mnist_gsap.yaml recipes/demo/mnist_msap.yaml] [--num-seeds 3]
        [--output runs/studies/temperature] [--overrides "--trainer.max_epochs 2"] [--wandb off]

Writes temperature.csv, temperature_runs.csv, temperature.md and temperature.png
(gAP/mAP vs τ, one line per loss) to --output and prints the table; see
rl_gap/experiments/studies.py.
"""

from rl_gap.experiments.studies import temperature_main

if __name__ == "__main__":
    temperature_main()
