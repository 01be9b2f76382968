"""Where a PostgreSQL server's time goes, statement by statement (``pg_stat_statements``).

Benchmark 6 starts its throwaway cluster with :data:`SETTINGS`, resets the counts before the
sustained runs and reads them after, so "what is left" can split the server's work per intent
by statement instead of guessing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import psycopg

from benchmarks import sql_shapes
from benchmarks.sql_shapes import POSTGRES_PARAMETER

SETTINGS = "-c shared_preload_libraries=pg_stat_statements"
"""Server options that load the extension (it must be loaded when the server starts)."""

_OWN = "%pg_stat_statements%"
"""This module's own queries, left out of the figures."""


@dataclass(frozen=True)
class StatementTime:
    """One normalized statement's share of the runs."""

    text: str
    """The statement's shape (:mod:`benchmarks.sql_shapes`), whole."""
    calls: int
    exec_ms: float
    """Its execution time in the server, summed (wall time there, locks and I/O included)."""
    rows: int


class StatementTimes:
    """Reset and read ``pg_stat_statements`` on one server (any database's URL reaches it)."""

    def __init__(self, url: str) -> None:
        self._url = url
        with psycopg.connect(url, autocommit=True) as connection:
            connection.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")

    def reset(self) -> None:
        """Forget every count so far."""
        with psycopg.connect(self._url, autocommit=True) as connection:
            connection.execute("SELECT pg_stat_statements_reset()")

    def read(self, limit: int = 8) -> tuple[list[StatementTime], float]:
        """The ``limit`` statements that took longest since the reset, and all statements' ms."""
        with psycopg.connect(self._url, autocommit=True) as connection:
            rows = connection.execute(
                """SELECT query, calls, total_exec_time, rows FROM pg_stat_statements
                   WHERE query NOT LIKE %s ORDER BY total_exec_time DESC""",
                (_OWN,),
            ).fetchall()
        shapes: dict[str, StatementTime] = {}
        for query, calls, exec_ms, count in rows:
            text = _shape(query)
            seen = shapes.get(text, StatementTime(text, 0, 0.0, 0))
            shapes[text] = StatementTime(
                text, seen.calls + int(calls), seen.exec_ms + float(exec_ms), seen.rows + int(count)
            )
        ranked = sorted(shapes.values(), key=lambda statement: -statement.exec_ms)
        return ranked[:limit], sum(float(row[2]) for row in rows)


def _shape(query: str) -> str:
    """A statement's shape, its numbered parameters shown as ``$``."""
    return re.sub(POSTGRES_PARAMETER, "$", sql_shapes.shape(query, POSTGRES_PARAMETER))


def split_line(statements: list[StatementTime], total_ms: float, intents: int) -> str:
    """The statements as µs per intent, largest first, with what the rest took."""
    if not statements or intents < 1:
        return "The server's time by statement was not measured in this run."
    per_intent = 1000 / intents
    shown = [round(statement.exec_ms * per_intent, 1) for statement in statements]
    parts = [
        f"`{sql_shapes.shortened(statement.text)}` {us:.1f} µs "
        f"({statement.rows / intents:.2f} rows)"
        for statement, us in zip(statements, shown, strict=True)
    ]
    rest = round((total_ms - sum(statement.exec_ms for statement in statements)) * per_intent, 1)
    # The total printed is the sum of the figures printed, so the line adds up as read.
    return (
        f"the server's execution time by statement (`pg_stat_statements`, per intent, largest "
        f"first; wall time inside the server, so waits on locks count): {'; '.join(parts)}; "
        f"every other statement {rest:.1f} µs; all together {sum(shown) + rest:.1f} µs"
    )
