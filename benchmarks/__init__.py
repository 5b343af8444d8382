"""Benchmarks: timings and memory of the losses, metrics, sharding and start-up (``bench_*.py``).

Not part of the ``rl_gap`` package (never imported by it, not shipped in the wheel); run from
the repository root, e.g. ``python benchmarks/bench_losses.py`` or
``python -m benchmarks.bench_fast_gsap``. The figures they print are quoted in docs/.
"""
