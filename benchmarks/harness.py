"""What the benchmarks share: statistics, timing, profiling and subprocess servers."""

from __future__ import annotations

import contextlib
import cProfile
import math
import pstats
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from effector import launch
from effector.cli import READY_PREFIX

REPO_ROOT = Path(__file__).resolve().parent.parent

STARTUP_TIMEOUT_S = 60.0
"""How long a server subprocess may take to print its address."""


def percentile(samples: Sequence[float], fraction: float) -> float:
    """The nearest-rank percentile (``fraction`` in [0, 1]) of ``samples``."""
    if not samples:
        raise ValueError("no samples")
    ordered = sorted(samples)
    rank = math.ceil(round(fraction * len(ordered), 9))  # rounded: 0.57 * 100 is 56.99...
    return ordered[max(1, min(len(ordered), rank)) - 1]


def child_environment() -> dict[str, str]:
    """The environment for subprocesses: this one, with the repository importable."""
    return launch.child_environment(REPO_ROOT)


@contextlib.contextmanager
def serving(command: Sequence[str], ready_prefix: str, log: IO[str]) -> Iterator[str]:
    """Start a server subprocess, yield the ``HOST:PORT`` it prints after ``ready_prefix``.

    The server's stderr goes to ``log``. On exit the server gets SIGTERM (so it drains), then
    SIGKILL if it has not exited within 30 s.
    """
    with server_process(command, ready_prefix, log) as server:
        yield server.address


def server_process(
    command: Sequence[str], ready_prefix: str, log: IO[str]
) -> launch.EffectorProcess:
    """:func:`serving`'s process, to use as a context manager (its ``address`` and ``pid``)."""
    return launch.EffectorProcess(
        command=command,
        env=child_environment(),
        cwd=REPO_ROOT,
        log=log,
        ready_prefix=ready_prefix,
        ready_timeout_s=STARTUP_TIMEOUT_S,
    )


def effector_command(
    store_url: str,
    *,
    concurrency: int = 256,
    profile_dir: Path | None = None,
    statements_file: Path | None = None,
) -> list[str]:
    """``python -m effector serve`` with the benchmark tools on ``store_url``, any free port.

    With ``profile_dir``, every thread of the effector is profiled and its statistics written
    there when it exits (see :mod:`benchmarks.profiled_effector`); with ``statements_file``,
    a SQLite store's write statements are timed into it (:mod:`benchmarks.sqlite_statements`).
    """
    entry = ["effector"]
    if profile_dir is not None:
        entry = ["benchmarks.profiled_effector", str(profile_dir)]
    elif statements_file is not None:
        entry = ["benchmarks.sqlite_statements", str(statements_file)]
    return [
        sys.executable,
        "-m",
        *entry,
        "serve",
        "--tools",
        "benchmarks.tools:make_registry",
        "--store",
        store_url,
        "--listen",
        "127.0.0.1:0",
        "--concurrency",
        str(concurrency),
        "--log-level",
        "WARNING",
    ]


EFFECTOR_READY = READY_PREFIX


@contextlib.contextmanager
def sqlite_effector() -> Iterator[str]:
    """An effector subprocess on a fresh SQLite store in a scratch directory; yields its target.

    The default ``synchronous=FULL``; the effector's log goes to the scratch directory too.
    """
    with tempfile.TemporaryDirectory(prefix="beam-agents-bench-") as scratch:
        store_url = f"sqlite:///{Path(scratch) / 'e.db'}"
        with (
            (Path(scratch) / "effector.log").open("w") as log,
            serving(effector_command(store_url), EFFECTOR_READY, log) as target,
        ):
            yield target


def seconds_per_call(action: Callable[[], object]) -> float:
    """Wall time of one call of ``action``, in seconds."""
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def profile_call(action: Callable[[], object]) -> pstats.Stats:
    """cProfile ``action`` in this thread."""
    profiler = cProfile.Profile()
    profiler.runcall(action)
    return pstats.Stats(profiler)


@dataclass(frozen=True)
class Hotspot:
    """A function a finding reports on: where it is, what it costs and what to do about it."""

    path: str
    """Its file, from the package root, e.g. ``beam_agents/core/tracing.py``."""
    function: str
    what: str
    """What the function does that costs."""
    fix: str
    """The proposed fix; empty when the cost is shared with the floor."""


def _entries(stats: pstats.Stats) -> dict[tuple[str, int, str], tuple[int, int, float, float, Any]]:
    entries: dict[tuple[str, int, str], tuple[int, int, float, float, Any]]
    entries = stats.stats  # type: ignore[attr-defined]
    return entries


def cumulative(stats: pstats.Stats, path: str, function: str) -> tuple[float, int]:
    """Cumulative seconds and calls of the functions named ``function`` in files ending ``path``.

    A match called by another match (an override calling ``super().process``) is counted once:
    the calls and time that reach it through the other are already in the other's.
    """
    entries = _entries(stats)
    matched = {key for key in entries if key[2] == function and key[0].endswith(path)}
    seconds, calls = 0.0, 0
    for key in matched:
        _, count, _, cumulative_s, callers = entries[key]
        seconds += cumulative_s
        calls += count
        for caller, (_, edge_calls, _, edge_cumulative_s) in callers.items():
            if caller in matched and caller != key:
                seconds -= edge_cumulative_s
                calls -= edge_calls
    return seconds, calls


def grown_functions(
    small: tuple[pstats.Stats, int], large: tuple[pstats.Stats, int], top: int = 6
) -> list[tuple[str, float]]:
    """The functions whose own time per unit grew most from ``small`` to ``large`` (µs).

    Each is a profile and the units it covered; the growth is self time, so a function is
    charged only for its own work, not its callees'.
    """

    def per_unit(stats: pstats.Stats, units: int) -> dict[str, float]:
        own: dict[str, float] = {}
        for (filename, line, function), entry in _entries(stats).items():
            where = f"{_short_path(filename)}:{line}({function})"
            own[where] = own.get(where, 0.0) + entry[2] * 1e6 / units
        return own

    before, after = per_unit(*small), per_unit(*large)
    grown = sorted(((after[k] - before.get(k, 0.0), k) for k in after), reverse=True)[:top]
    return [(where, growth) for growth, where in grown]


def findings(
    stats: pstats.Stats, hotspots: Sequence[Hotspot], *, busy_s: float, unit: str, units: int
) -> list[str]:
    """One line per hotspot: its share of ``busy_s`` and its cost per ``unit`` (of ``units``)."""
    lines = []
    for spot in hotspots:
        seconds, calls = cumulative(stats, spot.path, spot.function)
        line = (
            f"`{spot.path}` `{spot.function}`: {100 * seconds / busy_s:.0f}% "
            f"({calls:,} calls, {1e6 * seconds / units:.1f} µs per {unit} under the profiler). "
            f"{spot.what}"
        )
        lines.append(line if not spot.fix else f"{line} Proposed fix: {spot.fix}")
    return lines


_IDLE_WAITS = frozenset(
    {
        "<method 'poll' of 'select.epoll' objects>",
        "<method 'get' of '_queue.SimpleQueue' objects>",
        "<method 'acquire' of '_thread.lock' objects>",
        "<built-in method time.sleep>",
    }
)
"""Builtins in which a thread waits for work (their self time is idle, not cost)."""


def idle_seconds(stats: pstats.Stats) -> float:
    """Self time spent in the blocking waits of :data:`_IDLE_WAITS`."""
    return sum(
        entry[2] for (_, _, function), entry in _entries(stats).items() if function in _IDLE_WAITS
    )


def total_seconds(stats: pstats.Stats) -> float:
    """All profiled self time."""
    return sum(entry[2] for entry in _entries(stats).values())


def summarize_profile(stats: pstats.Stats, *, top: int = 12) -> list[str]:
    """Report lines: time by area, the top functions by self time, ours by cumulative time."""
    entries = _entries(stats)
    total = total_seconds(stats) or 1.0
    by_area: dict[str, float] = {}
    rows = []
    for (filename, line, function), (_, calls, self_time, cumulative_s, _) in entries.items():
        area = _area(filename)
        by_area[area] = by_area.get(area, 0.0) + self_time
        where = f"{_short_path(filename)}:{line}({function})"
        rows.append((self_time, cumulative_s, calls, where, area))
    idle = idle_seconds(stats)
    lines = [
        f"profiled {total:.2f} s, of which {idle:.2f} s ({100 * idle / total:.0f}%) waiting for "
        "work (epoll, queue, lock, sleep); self time by area:"
    ]
    for area, seconds in sorted(by_area.items(), key=lambda item: -item[1]):
        if seconds / total >= 0.001:
            lines.append(f"  {100 * seconds / total:5.1f}%  {area}")
    lines.append(f"top {top} functions by self time (self %, cumulative %, calls):")
    for self_time, cumulative_s, calls, where, _ in sorted(rows, reverse=True)[:top]:
        lines.append(
            f"  {100 * self_time / total:5.1f}%  {100 * cumulative_s / total:5.1f}%  "
            f"{calls:>9,}  {where}"
        )
    ours = sorted((row for row in rows if row[4].endswith("(ours)")), key=lambda row: -row[1])[:top]
    if ours:
        lines.append(f"top {len(ours)} of our functions by cumulative time:")
        for self_time, cumulative_s, calls, where, _ in ours:
            lines.append(
                f"  {100 * self_time / total:5.1f}%  {100 * cumulative_s / total:5.1f}%  "
                f"{calls:>9,}  {where}"
            )
    return lines


_AREAS = (
    ("beam_agents/", "beam_agents (ours)"),
    ("effector/", "effector (ours)"),
    ("benchmarks/", "benchmark code"),
    ("apache_beam/", "apache_beam"),
    ("google/protobuf/", "protobuf"),
    ("grpc", "grpc"),
    ("asyncio/", "asyncio"),
)


def _area(filename: str) -> str:
    for marker, area in _AREAS:
        if marker in filename:
            return area
    if filename == "~":
        return "builtins (C)"
    return "other Python"


def _short_path(filename: str) -> str:
    for marker in ("beam_agents/", "effector/", "benchmarks/", "apache_beam/", "google/"):
        position = filename.find(marker)
        if position >= 0:
            return filename[position:]
    return Path(filename).name if filename != "~" else "~"
