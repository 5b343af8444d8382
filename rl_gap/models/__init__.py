"""rl_gap.models."""
