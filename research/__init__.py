"""The lab: simulations, validation tables, checks and benchmarks behind the docs' figures.

Not part of the ``rl_gap`` package (never imported by it, not shipped in the wheel); run from
the repository root, e.g. ``python scripts/validate_tail.py`` or ``python -m research.bench_fast_gsap``.
"""
