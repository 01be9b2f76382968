"""Where a SQLite effector's store writer spends its time, statement by statement.

``python -m benchmarks.sqlite_statements FILE serve ...`` runs the effector's own command line
with every statement of the store's write transactions timed (thread CPU and wall, BEGIN and
COMMIT included) by its shape, the store's opening transaction left out; when the effector
exits, the totals go to ``FILE`` as JSON. :func:`measure_writer` runs such an effector through
one sustained run and says, in the words of benchmark 6's "what is left", where the writer's
time went and how often it ran beside the event loop (:mod:`benchmarks.thread_overlap`).
Timing costs two clock reads per statement, and statements are batched.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import re
import sqlite3
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

import effector.store.sqlite as sqlite_store
from benchmarks import sql_shapes, usage
from benchmarks.effector_load import CONCURRENCY, server_processes, sustained
from benchmarks.harness import EFFECTOR_READY, effector_command
from benchmarks.thread_overlap import Overlap, OverlapSampler
from effector.cli import main as effector_main
from effector.store._tx import Tx

_T = TypeVar("_T")


@dataclass
class StatementCost:
    """One statement shape's share of a run on the store's writer thread."""

    text: str
    """The statement's shape (:mod:`benchmarks.sql_shapes`), whole."""
    calls: int = 0
    cpu_s: float = 0.0
    """Thread CPU inside the call: SQLite's own work (and the Python binding's)."""
    wall_s: float = 0.0
    """Wall time inside the call: CPU, waits on the disk (each COMMIT's fsync) and the GIL."""


@dataclass(frozen=True)
class WriterSplit:
    """What :func:`measure_writer` found: the text for "what is left", and its figures."""

    text: str
    overlap: Overlap | None
    costs: tuple[StatementCost, ...] = ()
    """The statements' totals, largest CPU first."""
    intents: int = 0
    """The intents the totals cover (both runs)."""
    sampled_wall_us: float | None = None
    """Wall time per intent of the run the overlap was sampled in."""

    def per_intent(self, pattern: str) -> tuple[float, float]:
        """CPU and wall µs per intent of the statements whose shape matches ``pattern``."""
        found = [cost for cost in self.costs if re.match(pattern, cost.text)]
        scale = 1e6 / max(self.intents, 1)
        return (
            sum(cost.cpu_s for cost in found) * scale,
            sum(cost.wall_s for cost in found) * scale,
        )


def measure_writer(database: str, count: int, batch: int, scratch: Path) -> WriterSplit:
    """One sustained run of ``count`` intents on a timed effector at ``database``.

    A short run first finds the writer (the busiest thread besides the event loop); the full
    run is then sampled for how often the two ran at once. Per-intent figures cover both runs.
    """
    if not (usage.available() and usage.schedstat_available()):
        return WriterSplit("The writer's statements were not measured: no `/proc` here.", None)
    timings, warm = scratch / "statements.json", max(batch, count // 20)
    command = effector_command(database, concurrency=CONCURRENCY, statements_file=timings)
    with server_processes([command], EFFECTOR_READY, scratch) as processes:
        pid, targets = processes[0].pid, [process.address for process in processes]
        before = usage.on_cpu_now(pid)
        asyncio.run(sustained(targets, warm, batch))
        writer = usage.busiest_other(pid, before)
        if writer is None:
            return WriterSplit("The writer's statements were not measured: no writer.", None)
        with OverlapSampler(pid, pid, writer) as sampler:
            sampled = asyncio.run(sustained(targets, count, batch))
        writer_cpu_s = (usage.on_cpu_ns(pid, writer) - before.get(writer, 0)) / 1e9
    if not timings.exists():
        return WriterSplit("The writer's statements were not measured: no timings written.", None)
    costs = read(timings)
    text = split_line(costs, warm + count, writer_cpu_s)
    overlap = sampler.overlap
    if overlap is not None:
        text += (
            f"; through that run the event loop was running (or ready to run) in "
            f"{overlap.first_running:.0%} of the samples and the writer in "
            f"{overlap.second_running:.0%}, both at once in {overlap.both_running:.0%} (their "
            f"scheduler states read from `/proc` every {overlap.interval_s * 1000:.1f} ms, "
            f"{overlap.samples:,} samples)"
        )
    wall_us = sampled.elapsed_s / count * 1e6
    return WriterSplit(text, overlap, tuple(costs), warm + count, wall_us)


def read(path: Path) -> list[StatementCost]:
    """The totals a timed effector wrote, largest CPU first."""
    costs = [StatementCost(**entry) for entry in json.loads(path.read_text())]
    return sorted(costs, key=lambda cost: -cost.cpu_s)


def split_line(
    costs: Sequence[StatementCost], intents: int, writer_cpu_s: float, top: int = 8
) -> str:
    """The writer's statements as µs per intent (CPU, then wall), largest CPU first.

    The ``top`` statements are listed (COMMIT too, if not among them), then the rest as one;
    every total and difference is taken from the printed (0.1 µs) figures, so they add up.
    """
    if not costs or intents < 1:
        return "The writer's time by statement was not measured in this run."
    shown = [index < top or cost.text == "COMMIT" for index, cost in enumerate(costs)]
    listed = [cost for cost, show in zip(costs, shown, strict=True) if show]
    rest = [cost for cost, show in zip(costs, shown, strict=True) if not show]
    rows = [(cost.text, *_printed(intents, cost)) for cost in listed]
    other_cpu, other_wall = _printed(intents, *rest)
    cpu = round(sum(row[1] for row in rows) + other_cpu, 1)
    wall = round(sum(row[2] for row in rows) + other_wall, 1)
    commit = [(row_cpu, row_wall) for text, row_cpu, row_wall in rows if text == "COMMIT"]
    commit_cpu, commit_wall = commit[0] if commit else (0.0, 0.0)
    # Differences of printed figures, a rounded zero as 0.0 (never -0.0).
    waited = round(round(wall - commit_wall, 1) - round(cpu - commit_cpu, 1), 1) + 0.0
    parts = [
        f"`{sql_shapes.shortened(text)}` {row_cpu:.1f} µs of CPU ({row_wall:.1f} wall)"
        for text, row_cpu, row_wall in rows
    ]
    if rest:
        parts.append(f"every other statement {other_cpu:.1f} µs of CPU ({other_wall:.1f} wall)")
    line = (
        "the writer's statements (timed in an extra sustained run, thread CPU and wall time "
        f"per intent, largest CPU first): {'; '.join(parts)}; all together "
        f"{cpu:.1f} µs of CPU and {wall:.1f} of wall time"
    )
    if writer_cpu_s > 0:
        writer = round(writer_cpu_s * 1e6 / intents, 1)
        line += (
            f", against the writer thread's {writer:.1f} µs of CPU in that run: the other "
            f"{round(max(writer - cpu, 0.0), 1):.1f} µs are the rest of its work (fetching rows, "
            "building parameters, encoding results and envelopes)"
        )
    line += (
        "; the statements other than COMMIT, which wait on no fsync (in WAL mode only a commit "
        f"syncs), took {waited:.1f} µs of wall time beyond their CPU (all together less COMMIT: "
        f"({wall:.1f} - {commit_wall:.1f}) - ({cpu:.1f} - {commit_cpu:.1f})), a wait this run "
        "does not attribute (the GIL, a core, or the disk)"
    )
    return line


def _printed(intents: int, *costs: StatementCost) -> tuple[float, float]:
    """CPU and wall µs per intent of ``costs`` together, rounded as printed."""
    scale = 1e6 / intents
    return (
        round(sum(cost.cpu_s for cost in costs) * scale, 1),
        round(sum(cost.wall_s for cost in costs) * scale, 1),
    )


class _Totals:
    """Calls, CPU and wall time by statement shape, on the writer's connection only."""

    def __init__(self) -> None:
        self.by_shape: dict[str, StatementCost] = {}
        self._shapes: dict[str, str] = {}

    def timed(self, call: Callable[..., Any], sql: str, *args: Any) -> Any:
        cpu, wall = time.thread_time(), time.perf_counter()
        try:
            return call(sql, *args)
        finally:
            cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
            text = self._shapes.get(sql)
            if text is None:
                text = self._shapes[sql] = sql_shapes.shape(sql, sql_shapes.SQLITE_PARAMETER)
            cost = self.by_shape.setdefault(text, StatementCost(text))
            cost.calls += 1
            cost.cpu_s += cpu
            cost.wall_s += wall

    def write(self, path: Path) -> None:
        path.write_text(json.dumps([asdict(cost) for cost in self.by_shape.values()]))


class _TimedConnection:
    """The writer's connection as ``_in_transaction`` uses it, each ``execute`` timed."""

    def __init__(self, connection: sqlite3.Connection, totals: _Totals) -> None:
        self._connection, self._totals = connection, totals

    def execute(self, sql: str, *args: Any) -> Any:
        return self._totals.timed(self._connection.execute, sql, *args)

    def executemany(self, sql: str, *args: Any) -> Any:
        return self._totals.timed(self._connection.executemany, sql, *args)

    @property
    def in_transaction(self) -> bool:
        return self._connection.in_transaction


def _install(totals: _Totals) -> None:
    """Time the write transactions after the first (the store's opening: its schema)."""
    in_transaction = sqlite_store._in_transaction
    opened = False

    def timed_transaction(
        connection: sqlite3.Connection,
        path: Path,
        work: Callable[[Tx], _T],
        *,
        write: bool,
    ) -> _T:
        nonlocal opened
        timed: Any = _TimedConnection(connection, totals) if write and opened else connection
        opened = opened or write
        return in_transaction(timed, path, work, write=write)

    sqlite_store._in_transaction = timed_transaction


def main() -> int:
    """Run the effector command line given after the output file."""
    out = Path(sys.argv[1])
    totals = _Totals()
    _install(totals)
    atexit.register(totals.write, out)
    return effector_main(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
