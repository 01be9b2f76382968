"""The tools the benchmark effectors execute (``--tools benchmarks.tools:make_registry``).

Both are side-effecting in name only: the benchmarks measure the effector and the loop through
it, not a tool.
"""

from __future__ import annotations

import time

from beam_agents.tools import ToolRegistry, tool


@tool(side_effect=True)
def noop() -> None:
    """Do nothing."""


@tool(side_effect=True)
def stamp() -> dict[str, int]:
    """Return the system-wide monotonic clock (ns) at entry and at exit.

    ``CLOCK_MONOTONIC`` is shared by every process on the machine, so the pipeline can subtract
    the tool's own execution time from a round trip it timed with the same clock.
    """
    started_ns = time.monotonic_ns()
    return {"started_ns": started_ns, "ended_ns": time.monotonic_ns()}


def make_registry() -> ToolRegistry:
    """A fresh registry of the benchmark tools."""
    return ToolRegistry([noop, stamp])
