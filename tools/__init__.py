"""Developer tools: the import-graph check, the GPU wheel kit and the GPU check.

Not part of the ``rl_gap`` package (never imported by it, not shipped in the wheel); run from
the repository root, e.g. ``python tools/import_graph.py``, ``make gpu-wheels``,
``make gpu-check``.
"""
