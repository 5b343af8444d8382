"""rl_gap.callbacks."""
