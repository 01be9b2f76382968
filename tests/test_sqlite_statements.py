"""Benchmark 6's statement accounts: shapes, the SQLite writer's timing, and its split line."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from benchmarks import pg_statements, sql_shapes, sqlite_statements, usage
from benchmarks.effector_load import server_processes, sustained
from benchmarks.harness import EFFECTOR_READY, effector_command
from benchmarks.pg_statements import _shape as postgres_shape
from benchmarks.sqlite_statements import StatementCost


def test_a_shape_folds_each_batch_size_into_one() -> None:
    two = "INSERT INTO t (a, b)\n   VALUES (?, ?), (?, ?) ON CONFLICT DO NOTHING"
    three = "INSERT INTO t (a, b) VALUES (?, ?), (?, ?), (?, ?) ON CONFLICT DO NOTHING"
    assert sql_shapes.shape(two, sql_shapes.SQLITE_PARAMETER) == (
        "INSERT INTO t (a, b) VALUES (...) ON CONFLICT DO NOTHING"
    )
    assert sql_shapes.shape(three, sql_shapes.SQLITE_PARAMETER) == sql_shapes.shape(
        two, sql_shapes.SQLITE_PARAMETER
    )
    listed = "SELECT x FROM t WHERE k IN (?, ?, ?) AND v = ?"
    assert sql_shapes.shape(listed, sql_shapes.SQLITE_PARAMETER) == (
        "SELECT x FROM t WHERE k IN (...) AND v = ?"
    )
    assert postgres_shape("SELECT x FROM t WHERE k IN ($1, $2) AND v = $3") == (
        "SELECT x FROM t WHERE k IN (...) AND v = $"
    )


def test_statements_that_begin_alike_stay_apart_and_are_shortened_only_when_shown() -> None:
    start = "UPDATE effector_intents SET state = ?, attempts = attempts + 1, started_at_ms = ?"
    first, second = f"{start} WHERE a = ?", f"{start} WHERE b = ?"
    shapes = {sql_shapes.shape(sql, sql_shapes.SQLITE_PARAMETER) for sql in (first, second)}
    assert len(shapes) == 2
    assert sql_shapes.shortened(first) == first[:67] + "..."
    assert sql_shapes.shortened("COMMIT") == "COMMIT"


def test_the_split_line_divides_by_intents_and_names_what_is_not_statements() -> None:
    costs = [
        StatementCost("UPDATE a", calls=10, cpu_s=0.002, wall_s=0.003),
        StatementCost("COMMIT", calls=10, cpu_s=0.001, wall_s=0.005),
        StatementCost("INSERT b", calls=5, cpu_s=0.0005, wall_s=0.0005),
    ]
    line = sqlite_statements.split_line(costs, intents=100, writer_cpu_s=0.0045, top=2)
    # Per intent: 20, 10 and 5 µs of CPU; 35 in all, of the writer's 45.
    assert "`UPDATE a` 20.0 µs of CPU (30.0 wall)" in line
    assert "`COMMIT` 10.0 µs of CPU (50.0 wall)" in line
    assert "every other statement 5.0 µs of CPU (5.0 wall)" in line
    assert "all together 35.0 µs of CPU and 85.0 of wall time" in line
    # Beyond their CPU, outside COMMIT: 10 µs (UPDATE a) and 0 (INSERT b).
    assert "other than COMMIT, which wait on no fsync" in line
    assert "took 10.0 µs of wall time beyond their CPU" in line
    assert "(all together less COMMIT: (85.0 - 50.0) - (35.0 - 10.0))" in line
    # The run does not say what that wait is: no GIL claim.
    assert "a wait this run does not attribute" in line and "GIL back" not in line
    assert "against the writer thread's 45.0 µs of CPU in that run: the other 10.0 µs" in line
    assert sqlite_statements.split_line([], 100, 1.0).endswith("not measured in this run.")


def test_the_split_lines_totals_and_differences_are_of_its_printed_figures() -> None:
    # Over 1,000,000 intents a second is a µs per intent; COMMIT is last by CPU, past top=2.
    costs = [
        StatementCost("UPDATE a", calls=1, cpu_s=16.44, wall_s=20.16),
        StatementCost("INSERT b", calls=1, cpu_s=10.64, wall_s=15.96),
        StatementCost("SELECT c", calls=1, cpu_s=0.04, wall_s=0.04),
        StatementCost("COMMIT", calls=1, cpu_s=0.03, wall_s=0.36),
    ]
    line = sqlite_statements.split_line(costs, intents=1_000_000, writer_cpu_s=40.0, top=2)
    # COMMIT is listed though past the top, so the rest holds no COMMIT.
    assert "`INSERT b` 10.6 µs of CPU (16.0 wall); `COMMIT` 0.0 µs of CPU (0.4 wall); " in line
    assert "every other statement 0.0 µs of CPU (0.0 wall); all together" in line
    # Printed: 16.4 + 10.6 + 0.0 + 0.0 = 27.0 (unrounded 27.15); 20.2 + 16.0 + 0.4 + 0.0 = 36.6.
    assert "all together 27.0 µs of CPU and 36.6 of wall time" in line
    assert "the writer thread's 40.0 µs of CPU in that run: the other 13.0 µs" in line
    # (36.6 - 0.4) - (27.0 - 0.0) = 9.2, where the unrounded waits (3.72 + 5.32) give 9.0.
    assert "took 9.2 µs of wall time beyond their CPU (all together less COMMIT: " in line
    assert "(36.6 - 0.4) - (27.0 - 0.0))" in line
    # All listed: no "every other statement"; no COMMIT: nothing taken off.
    line = sqlite_statements.split_line(costs[:3], intents=1_000_000, writer_cpu_s=0.0, top=8)
    assert "every other" not in line and "writer thread's" not in line
    assert "took 9.2 µs of wall time beyond their CPU" in line
    assert "(36.2 - 0.0) - (27.0 - 0.0)" in line


@pytest.mark.skipif(not usage.schedstat_available(), reason="needs Linux's /proc schedstat")
def test_measure_writer_times_a_real_effectors_statements(tmp_path: Path) -> None:
    split = sqlite_statements.measure_writer(f"sqlite:///{tmp_path / 'e.db'}", 400, 50, tmp_path)
    assert split.text.startswith("the writer's statements (timed in an extra sustained run")
    assert "`INSERT INTO effector_intents (intent_id, entity_key, seq, step_inde...`" in split.text
    assert split.overlap is not None and split.overlap.samples > 10
    assert (
        0
        <= split.overlap.both_running
        <= min(split.overlap.first_running, split.overlap.second_running)
    )


def test_a_timed_effector_leaves_its_opening_transaction_out(tmp_path: Path) -> None:
    timings = tmp_path / "statements.json"
    command = effector_command(
        f"sqlite:///{tmp_path / 'e.db'}", concurrency=16, statements_file=timings
    )
    with server_processes([command], EFFECTOR_READY, tmp_path) as processes:
        run = asyncio.run(sustained([processes[0].address], 200, 50))
    assert run.intents == 200
    costs = {cost.text: cost for cost in sqlite_statements.read(timings)}
    assert costs["COMMIT"].calls >= 4  # a Submit group and record-and-claim commits at least
    assert any(text.startswith("INSERT INTO effector_intents") for text in costs)
    assert not any(text.startswith("CREATE") for text in costs)


def test_the_postgres_split_lines_total_is_the_sum_of_its_printed_figures() -> None:
    statements = [
        pg_statements.StatementTime("INSERT INTO a VALUES ($1)", 10, 0.01044, 10),
        pg_statements.StatementTime("UPDATE b SET c = $1", 10, 0.01044, 10),
    ]
    # Printed 10.4, 10.4 and 0.4 for the rest: 21.2 together, though the unrounded total,
    # 21.32 µs, would print as 21.3.
    line = pg_statements.split_line(statements, total_ms=0.02132, intents=1)
    assert "`INSERT INTO a VALUES ($1)` 10.4 µs (10.00 rows)" in line
    assert line.endswith("every other statement 0.4 µs; all together 21.2 µs")
