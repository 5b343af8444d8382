"""rl_gap: representation learning judged by global Average Precision."""

__version__ = "0.1.0"
