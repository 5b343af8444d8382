"""rl_gap.metrics.functional."""
