"""``python -m benchmarks.sqlite_statements FILE serve ...``: the effector, SQLite statements timed.

Runs the effector's own command line with every statement of the SQLite store's write
transactions timed (thread CPU and wall, BEGIN and COMMIT included) by its shape, the store's
opening transaction left out; when the effector exits, the totals go to ``FILE`` as JSON.
Benchmark 6 reads them with :func:`read` and :func:`split_line` to say where the store writer's
time goes, as ``pg_stat_statements`` does for PostgreSQL. Timing costs two clock reads per
statement, and statements are batched.
"""

from __future__ import annotations

import atexit
import json
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import effector.store.sqlite as sqlite_store
from effector.cli import main as effector_main


@dataclass(frozen=True)
class StatementCost:
    """One statement shape's share of a run on the store's writer thread."""

    text: str
    """The statement's start, whitespace collapsed and lists of parameters folded."""
    calls: int
    cpu_s: float
    """Thread CPU inside the call: SQLite's own work (and the Python binding's)."""
    wall_s: float
    """Wall time inside the call: CPU, waits on the disk (each COMMIT's fsync) and the GIL."""


_ROWS = re.compile(r"\(\?(?:, \?)*\)(?:, \(\?(?:, \?)*\))+")
_LIST = re.compile(r"\?(?:, \?)+")


def shape(sql: str, width: int = 70) -> str:
    """A statement's start on one line, its lists of parameters folded (one shape per size)."""
    text = _LIST.sub("...", _ROWS.sub("(...)", re.sub(r"\s+", " ", sql).strip()))
    return text if len(text) <= width else text[: width - 3] + "..."


class _Totals:
    """Calls, CPU and wall time by statement shape, on the writer's connection only."""

    def __init__(self) -> None:
        self.by_shape: dict[str, list[float]] = {}
        self._shapes: dict[str, str] = {}

    def timed(self, call: Callable[..., Any], sql: str, *args: Any) -> Any:
        cpu, wall = time.thread_time(), time.perf_counter()
        try:
            return call(sql, *args)
        finally:
            cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
            text = self._shapes.get(sql)
            if text is None:
                text = self._shapes[sql] = shape(sql)
            totals = self.by_shape.setdefault(text, [0, 0.0, 0.0])
            totals[0] += 1
            totals[1] += cpu
            totals[2] += wall

    def write(self, path: Path) -> None:
        costs = [
            StatementCost(text, int(n), cpu, wall) for text, (n, cpu, wall) in self.by_shape.items()
        ]
        path.write_text(json.dumps([asdict(cost) for cost in costs]))


class _TimedConnection:
    """The writer's connection as ``_in_transaction`` uses it, each ``execute`` timed."""

    def __init__(self, connection: Any, totals: _Totals) -> None:
        self._connection, self._totals = connection, totals

    def execute(self, sql: str, *args: Any) -> Any:
        return self._totals.timed(self._connection.execute, sql, *args)

    def executemany(self, sql: str, *args: Any) -> Any:
        return self._totals.timed(self._connection.executemany, sql, *args)

    @property
    def in_transaction(self) -> bool:
        return bool(self._connection.in_transaction)


def _install(totals: _Totals) -> None:
    """Time the write transactions after the first (the store's opening: its schema)."""
    in_transaction = sqlite_store._in_transaction
    opened = False

    def timed_transaction(connection: Any, path: Path, work: Any, *, write: bool) -> Any:
        nonlocal opened
        if write and opened:
            connection = _TimedConnection(connection, totals)
        opened = opened or write
        return in_transaction(connection, path, work, write=write)

    sqlite_store._in_transaction = timed_transaction  # type: ignore[assignment]


def read(path: Path) -> list[StatementCost]:
    """The totals a timed effector wrote, largest CPU first."""
    costs = [StatementCost(**entry) for entry in json.loads(path.read_text())]
    return sorted(costs, key=lambda cost: -cost.cpu_s)


def split_line(
    costs: Sequence[StatementCost], intents: int, writer_cpu_s: float, top: int = 8
) -> str:
    """The writer's statements as µs per intent (CPU, then wall), largest first."""
    if not costs or intents < 1:
        return "The writer's time by statement was not measured in this run."
    per_intent = 1e6 / intents
    shown = list(costs[:top])
    parts = [
        f"`{cost.text}` {cost.cpu_s * per_intent:.1f} µs of CPU ({cost.wall_s * per_intent:.1f} "
        "wall)"
        for cost in shown
    ]
    rest = costs[top:]
    cpu = sum(cost.cpu_s for cost in costs)
    wall = sum(cost.wall_s for cost in costs)
    line = (
        "the writer's statements (timed in an extra sustained run, thread CPU and wall time "
        f"per intent, largest CPU first): {'; '.join(parts)}; every other statement "
        f"{sum(cost.cpu_s for cost in rest) * per_intent:.1f} µs of CPU; all together "
        f"{cpu * per_intent:.1f} µs of CPU and {wall * per_intent:.1f} of wall time"
    )
    if writer_cpu_s > 0:
        line += (
            f", against the writer thread's {writer_cpu_s * per_intent:.0f} µs of CPU in that "
            f"run: {max(writer_cpu_s - cpu, 0.0) * per_intent:.0f} µs of it is the Python around "
            "the statements (building their parameters, encoding results and envelopes)"
        )
    return line


def main() -> int:
    """Run the effector command line given after the output file."""
    out = Path(sys.argv[1])
    totals = _Totals()
    _install(totals)
    atexit.register(totals.write, out)
    return effector_main(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
