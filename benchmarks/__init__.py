"""The performance suite: each benchmark measures our figures against a floor in the same run.

``make bench`` (``python -m benchmarks``) runs it and writes ``BENCHMARKS.md``;
``python -m benchmarks.compare`` compares this checkout's ratios with another revision's.
"""
