"""The lab: studies, simulations and validation tables behind the docs' figures.

Not part of the ``rl_gap`` package (never imported by it, not shipped in the wheel); run from
the repository root, e.g. ``python research/validate_tail.py`` or
``python -m research.studies neg_drop``. Benchmarks live in ``benchmarks/``, developer tools
in ``tools/``.
"""
