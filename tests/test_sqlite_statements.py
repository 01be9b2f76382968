"""Benchmark 6's SQLite statement timing: a real effector, its writer's statements timed."""

from __future__ import annotations

import asyncio
from pathlib import Path

from benchmarks import sqlite_statements
from benchmarks.effector_load import server_processes, sustained
from benchmarks.harness import EFFECTOR_READY, effector_command


def test_shape_folds_parameter_lists_so_each_batch_size_is_one_shape() -> None:
    two = "INSERT INTO t (a, b)\n   VALUES (?, ?), (?, ?) ON CONFLICT DO NOTHING"
    three = "INSERT INTO t (a, b) VALUES (?, ?), (?, ?), (?, ?) ON CONFLICT DO NOTHING"
    assert sqlite_statements.shape(two) == sqlite_statements.shape(three)
    assert (
        sqlite_statements.shape(two) == "INSERT INTO t (a, b) VALUES (...) ON CONFLICT DO NOTHING"
    )
    assert sqlite_statements.shape("SELECT x FROM t WHERE k IN (?, ?, ?)") == (
        "SELECT x FROM t WHERE k IN (...)"
    )


def test_a_timed_effector_writes_its_writers_statements(tmp_path: Path) -> None:
    timings = tmp_path / "statements.json"
    command = effector_command(
        f"sqlite:///{tmp_path / 'e.db'}", concurrency=16, statements_file=timings
    )
    with server_processes([command], EFFECTOR_READY, tmp_path) as processes:
        run = asyncio.run(sustained([processes[0].address], 200, 50))
    assert run.intents == 200
    costs = {cost.text: cost for cost in sqlite_statements.read(timings)}
    inserts = [text for text in costs if text.startswith("INSERT INTO effector_intents")]
    assert len(inserts) == 1, costs.keys()
    assert costs["COMMIT"].calls >= 4  # a Submit group and record-and-claim commits at least
    assert all(cost.wall_s >= cost.cpu_s * 0.5 >= 0 for cost in costs.values())
    # The opening transaction (the schema) is left out.
    assert not any(text.startswith("CREATE") for text in costs)
    line = sqlite_statements.split_line(list(costs.values()), run.intents, writer_cpu_s=1.0)
    assert line.startswith("the writer's statements (timed in an extra sustained run")
    assert "`COMMIT`" in line or "every other statement" in line
    assert "against the writer thread's" in line
