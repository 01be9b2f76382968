"""``benchmarks.harness.cumulative``: a function's share of a profile, nested matches once."""

from __future__ import annotations

import pstats
from types import SimpleNamespace
from typing import Any

import pytest

from benchmarks.harness import cumulative

DOFN = "site/beam_agents/core/dofn.py"


def _stats(entries: dict[tuple[str, int, str], Any]) -> pstats.Stats:
    """A stand-in for a profile: ``cumulative`` reads only its ``stats`` mapping."""
    stats: pstats.Stats = SimpleNamespace(stats=entries)  # type: ignore[assignment]
    return stats


def test_an_override_calling_its_parent_is_counted_once() -> None:
    runner = ("site/apache_beam/common.py", 1, "invoke")
    child = (DOFN, 325, "process")
    parent = (DOFN, 290, "process")
    timer = (DOFN, 400, "_on_deadline")
    # pstats entries: (primitive calls, calls, self s, cumulative s, {caller: edge figures}).
    stats = _stats(
        {
            runner: (1, 1, 1.0, 12.0, {}),
            child: (10, 10, 0.5, 8.0, {runner: (10, 10, 0.5, 8.0)}),
            # Reached from the override (7.5 s) and, twice, from a timer callback (1.5 s).
            parent: (12, 12, 1.0, 9.0, {child: (10, 10, 0.8, 7.5), timer: (2, 2, 0.2, 1.5)}),
            timer: (2, 2, 0.1, 1.6, {runner: (2, 2, 0.1, 1.6)}),
        }
    )
    seconds, calls = cumulative(stats, "beam_agents/core/dofn.py", "process")
    assert seconds == pytest.approx(8.0 + 1.5)
    assert calls == 12


def test_unrelated_matches_add_up() -> None:
    first = ("a/statecache.py", 1, "get_deep_size")
    second = ("b/statecache.py", 9, "get_deep_size")
    other = ("a/statecache.py", 20, "put")
    stats = _stats(
        {
            first: (3, 3, 0.1, 2.0, {other: (3, 3, 0.1, 2.0)}),
            second: (1, 1, 0.1, 0.5, {other: (1, 1, 0.1, 0.5)}),
            other: (4, 4, 0.1, 2.7, {}),
        }
    )
    seconds, calls = cumulative(stats, "statecache.py", "get_deep_size")
    assert seconds == pytest.approx(2.5)
    assert calls == 4
