"""Negative-dropping study: gAP and mAP against the drop rate α (gSAP paper Fig. 2 / Table M).

    python scripts/study_neg_drop.py [--alphas 0 0.5 0.9 0.95 0.99 0.999] [--num-seeds 3]
        [--recipes recipes/demo/mnist_gsap.yaml] [--output runs/studies/neg_drop]
        [--overrides "--trainer.max_epochs 2"] [--wandb off]

Writes neg_drop.csv, neg_drop_runs.csv, neg_drop.md and neg_drop.png (gAP/mAP vs α)
to --output and prints the table; see rl_gap/experiments/studies.py.
"""

from rl_gap.experiments.studies import neg_drop_main

if __name__ == "__main__":
    neg_drop_main()
