"""The performance suite: each benchmark measures our number against a floor in the same run.

Run it with ``make bench`` (or ``python -m benchmarks``), which writes ``BENCHMARKS.md``;
``python -m benchmarks --quick`` is the smoke run. See :mod:`benchmarks.run_all`.
"""
