"""Benchmark 6's one-intent Submit account: statements no Submit runs, set apart; the cores'
margin; and the backlog an ingest-only effector's housekeeping count walks."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from benchmarks import group_commits, sql_shapes, submit_cpu, submit_split
from benchmarks.effector_load import calls_round, server_processes
from benchmarks.group_commits import GroupCommits
from benchmarks.harness import EFFECTOR_READY, effector_command
from benchmarks.paired_rounds import Batch, Pairs, paired_figure
from benchmarks.pg_statements import StatementTime
from benchmarks.report import Goal, Target
from benchmarks.submit_account import SubmitRow, submit_account
from benchmarks.submit_cpu import Need, need_text
from benchmarks.submit_split import Side, SubmitSplit
from benchmarks.usage import Usage

PG_ROW = "Submit calls/s (1 intent each, 64 callers), PostgreSQL, 2 replicas"
TARGET = Target(Goal.RATIO_AT_LEAST, 0.6)
COUNT = "SELECT state, COUNT(*) FROM effector_intents WHERE state IN (...) GROUP BY state"
# 1,000 calls in 1 s over 100 commits: the server's statements 79.3 ms in all (79 µs a call),
# 31 of them the housekeeping count, which ran twice.
STATEMENTS = (
    StatementTime(COUNT, 2, 31.0, 8),
    StatementTime("INSERT INTO effector_keys (entity_key, pending) VALUES ($)", 100, 20.4, 1),
    StatementTime("INSERT INTO effector_intents (intent_id) VALUES ($)", 100, 18.3, 1),
    StatementTime("COMMIT", 100, 9.6, 0),
)
NOOP = Side(1_000, 0.1, Usage(0.08, 0.02, 0.01, 0.03, 0, 0, 0, (("event_engine", 0.03),)))
POSTGRES = Side(1_000, 0.2, Usage(0.1, 0.03, 0.02, 0.04, 0, 0, 0, (("pg", 0.03),)), 0.13, 0.09)
MISSED = Pairs((10_000.0,) * 5, (4_000.0, 4_500.0, 5_000.0, 5_500.0, 5_800.0))


@pytest.fixture(autouse=True)
def _two_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(submit_split, "CORES", 2)
    monkeypatch.setattr(submit_cpu, "CORES", 2)


def _commits(in_flight: int | None = 120_000) -> GroupCommits:
    batch = Batch(1_000, 1.0, (0.011,) * 9)
    return GroupCommits(batch, 100, 0.0793, 0.0096, False, STATEMENTS, in_flight)


def _account(commits: GroupCommits, pairs: Pairs = MISSED, split: Side = POSTGRES) -> str:
    figure = paired_figure(PG_ROW, "calls/s", pairs, 4_000, "no-op", TARGET)
    latencies = (tuple(i / 1000 for i in range(1, 11)), tuple(i / 500 for i in range(1, 11)))
    row = SubmitRow(figure, TARGET, pairs, 64, latencies, SubmitSplit(2, NOOP, split), commits)
    return submit_account([row])


def test_statement_shapes_no_submit_runs_are_named_by_origin() -> None:
    assert sql_shapes.not_submit(COUNT) == (
        "the worker's housekeeping count (once a second per effector; not run by Submit)"
    )
    status = "SELECT state, COUNT(*) FROM effector_intents GROUP BY state"
    assert sql_shapes.not_submit(status) == "the Status call's count (not run by Submit)"
    assert sql_shapes.not_submit("INSERT INTO effector_intents (intent_id) VALUES ($)") is None


def test_the_housekeeping_count_is_set_apart_from_submits_statements() -> None:
    commits = _commits()
    # Printed per call: 79 in all, 31 apart, so Submit's own 48 (the printed difference).
    assert (commits.per_call_us, commits.apart_us, commits.own_us) == (79, 31, 48)
    # A commit's statements and the server's busy share leave the count out: 48.3 ms / 100.
    assert commits.commit_ms == pytest.approx(0.483)
    assert commits.busy == pytest.approx(0.0483)
    text = _account(commits)
    assert "the server executed a commit's statements in 0.48 ms on average and was" in text
    assert "executing them 5% of the round (both replicas' connections summed; the" in text
    assert (
        "took 79 µs of wall time per call (lock waits included), Submit's own statements 48" in text
    )
    assert (
        "`COMMIT` 10; every other statement 0. The other 31 µs per call were statements no" in text
    )
    assert (
        "`SELECT state, COUNT(*) FROM effector_intents WHERE state IN (...) G...` 31, the" in text
    )
    assert "worker's housekeeping count (once a second per effector; not run by Submit): it" in text
    assert "ran 2 times in the round, 15.5 ms each on average, over the 120,000 intents in" in text
    assert "What it walks is the benchmark's never-drained backlog, an artifact of the" in text
    assert "The server was not executing the commits' statements 95% of the round." in text
    # Its CPU stays in the totals, said so, with its statement time as an upper bound.
    assert "370 µs (150 in the effectors, 90 in the PostgreSQL server and 130 in the" in text
    assert "The PostgreSQL server's 90 µs include the statements no Submit runs (above)," in text
    assert "as the benchmark ran them: at most 31 of them, by their time in the statements" in text
    # The sizing uses Submit's own statements.
    assert "(the key rows' upsert, of the 48 µs per call of Submit's own statements" in text
    # A count whose time is not below the server's CPU bounds nothing.
    cheap = Side(POSTGRES.calls, POSTGRES.elapsed_s, POSTGRES.servers, 0.13, 0.025)
    text = _account(commits, split=cheap)
    assert "their time in the statements round, 31 µs per call (wall time in the server, in" in text
    assert "is not below the server's CPU here, so this run does not bound their share" in text
    # Without the backlog read, no figure is given for it.
    text = _account(_commits(None))
    assert "ms each on average. What it walks is" in text and "in flight" not in text


def test_a_narrow_margin_of_cores_is_stated() -> None:
    def said(total: int, budget: float) -> str:
        return need_text(Need(total, 0, 0, 1e6 / budget, budget), True, [])

    # 1.92 of 2 cores: a 4% margin.
    assert "needs 1.92 of 2 cores, a 4% margin." in said(480, 250.0)
    # 1.60 of 2: a margin of 20% goes unsaid.
    assert "needs 1.60 of 2 cores. Against" in said(400, 250.0)
    # 1.998 prints 2.00: under 1%.
    assert "needs 2.00 of 2 cores, a margin under 1%." in said(4995, 2500.0)
    # Past the cores: the cut, no margin.
    assert "margin" not in said(520, 250.0)
    assert "Against the no-op server's and the client's" in said(400, 250.0)


def test_a_real_effectors_backlog_is_read_from_its_status(tmp_path: Path) -> None:
    command = effector_command(f"sqlite:///{tmp_path / 'e.db'}", concurrency=0)
    with server_processes([command], EFFECTOR_READY, tmp_path) as processes:
        target = processes[0].address
        asyncio.run(calls_round([target], (1, 4, 40), warm=False))
        assert asyncio.run(group_commits._in_flight(target)) == 40
    assert asyncio.run(group_commits._in_flight("127.0.0.1:1")) is None
