"""The console's store queries follow indexes: SQLite's ``EXPLAIN QUERY PLAN`` of each.

Each query is run through the real store functions on a SQLite store holding some of
everything, with every statement's plan recorded. PostgreSQL plans depend on its statistics,
so only its behaviour is checked (``test_store_telemetry.py``).
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from conftest import sqlite_url
from effector_harness import make_intent
from test_store_telemetry import T0, agent_error, llm_span, span

import effector.store.sql as store_sql
import effector.store.telemetry as telemetry
from beam_agents._protos import IntentState, ToolIntent, ToolResult
from effector.store import open_store
from effector.store.claims import MemoryClaims
from effector.store.intents import ClaimRequest, Completion, NewIntent, new_result
from effector.store.sqlite import SQLITE, SqliteStore

STEPS = SqliteStore.__new__(SqliteStore)
"""A SQLite store object that runs no transaction of its own: its steps run on a test's."""
STEPS._dialect = SQLITE
STEPS._claims = MemoryClaims()


class PlannedTx:
    """A transaction that records the query plan of every statement it runs."""

    def __init__(self, connection: sqlite3.Connection) -> None:
        self._connection = connection
        self.plans: list[tuple[str, list[str]]] = []

    def execute(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
        explained = self._connection.execute(f"EXPLAIN QUERY PLAN {sql}", params).fetchall()
        self.plans.append((" ".join(sql.split()), [str(row[3]) for row in explained]))
        return self._connection.execute(sql, params)

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        self._connection.executemany(sql, rows)

    def plan_of(self, fragment: str) -> list[str]:
        """The plan of the statement containing ``fragment`` (run once, or always alike)."""
        [plan, *others] = [plan for sql, plan in self.plans if fragment in sql]
        assert all(other == plan for other in others)
        return plan


@pytest_asyncio.fixture
async def seeded(tmp_path: Path) -> Path:
    """A SQLite store with intents in every state, traces, errors and keys."""
    store = await open_store(sqlite_url(tmp_path / "store.db"))
    try:
        tools = [make_intent(("add", "mul")[n % 2], key=f"k{n % 7}".encode()) for n in range(40)]
        approval = make_intent("", key=b"k1", kind=ToolIntent.APPROVAL)
        await store.submit([NewIntent(intent) for intent in [*tools, approval]], T0)
        claims = (await store.claim("w", 5, T0 + 1, 60_000)).claims
        done = [
            Completion(
                claim, new_result(claim.intent, ToolResult.OK, completed_at_ms=T0 + 9, attempt=1)
            )
            for claim in claims[:3]
        ]
        await store.complete(done, T0 + 9)
        for n in range(7):
            key = f"k{n}".encode()
            await store.record_traces([span(key, seq, i) for seq in range(3) for i in range(3)], T0)
            await store.record_traces([llm_span(key, 9, T0, "1", "2")], T0)
            await store.record_errors([agent_error(key, "e")], T0)
    finally:
        await store.close()
    return tmp_path / "store.db"


@pytest.fixture
def planned(seeded: Path) -> Iterator[Callable[[Callable[[PlannedTx], object]], PlannedTx]]:
    connection = sqlite3.connect(seeded)

    def run(work: Callable[[PlannedTx], object]) -> PlannedTx:
        tx = PlannedTx(connection)
        work(tx)
        connection.rollback()
        return tx

    yield run
    connection.close()


def no_table_scans(tx: PlannedTx) -> None:
    """No statement reads a whole table (a scan of a subquery's own rows is no table scan)."""
    for sql, plan in tx.plans:
        subqueries = {
            step.split()[1] for step in plan if step.startswith(("CO-ROUTINE ", "MATERIALIZE "))
        }
        for step in plan:
            scanned = re.fullmatch(r"SCAN (\w+)", step)
            assert scanned is None or scanned[1] in subqueries, (sql, plan)


def test_the_overview_range_scans_its_window(planned: Any) -> None:
    tx = planned(lambda tx: STEPS._overview(tx, T0 + 60_000, 3_600_000))
    no_table_scans(tx)
    window = "(completed_at_ms>? AND completed_at_ms<?)"
    executed = "FROM effector_intents WHERE completed_at_ms IS NOT NULL AND settled_state = 4"
    for fragment in (
        f"/ 60000, COUNT(*) {executed}",
        f"SELECT COUNT(*) {executed}",
        "ORDER BY latency",
    ):
        plan = tx.plan_of(fragment)
        assert f"USING COVERING INDEX effector_intents_settled {window}" in plan[0]
    # The oldest open intent: the open ones sorted, never a walk through every intent by receipt.
    oldest = tx.plan_of("ORDER BY received_at_ms + 0, intent_id LIMIT 1")
    assert oldest[0] == "SCAN effector_intents USING INDEX effector_intents_open"
    tokens = tx.plan_of("SUM(tokens)")
    assert "USING INDEX effector_traces_llm (wall_start_ms>? AND wall_start_ms<?)" in tokens[0]
    errors = tx.plan_of("FROM effector_errors")
    assert "USING COVERING INDEX effector_errors_age" in errors[0]


@pytest.mark.parametrize("search", [b"", b"k1"])
def test_the_keys_list_walks_the_activity_index(planned: Any, search: bytes) -> None:
    tx = planned(lambda tx: STEPS._list_keys(tx, search, 50))
    no_table_scans(tx)
    steps = [step for _, plan in tx.plans for step in plan]
    assert "SCAN a USING INDEX effector_key_activity_seen" in steps
    assert not [step for step in steps if "effector_traces" in step]
    # The open intents are counted from the open index alone, never reading their rows.
    assert "SEARCH i USING COVERING INDEX effector_intents_open (entity_key=?)" in steps
    if not search:  # newest first straight from the index, no sorting
        assert not [step for step in steps if "TEMP B-TREE" in step]


@pytest.mark.parametrize("state", [None, IntentState.DONE])
def test_a_search_by_tool_follows_the_tool_index(planned: Any, state: Any) -> None:
    tx = planned(lambda tx: STEPS._search_intents(tx, state, "mul", None, 10))
    no_table_scans(tx)
    for _, plan in tx.plans:
        assert plan == [
            "SEARCH effector_intents USING INDEX effector_intents_by_tool (tool_name=?)"
        ]


def test_a_search_for_an_open_state_sorts_the_open_intents(planned: Any) -> None:
    tx = planned(lambda tx: STEPS._search_intents(tx, IntentState.PENDING, None, None, 10))
    [(_, plan)] = tx.plans
    assert plan == [
        "SCAN effector_intents USING INDEX effector_intents_open",
        "USE TEMP B-TREE FOR ORDER BY",
    ]


def test_recording_and_pruning_traces_probe_indexes(planned: Any) -> None:
    events = [span(b"k1", 3, 0), span(b"new", 0, 0), span(b"new", 0, 1)]
    tx = planned(lambda tx: telemetry._record_traces(tx, events, T0 + 5))
    no_table_scans(tx)
    counted = tx.plan_of("SELECT entity_key, seq, trace_id, COUNT(*) FROM effector_traces")
    assert "effector_traces_by_key (entity_key=? AND seq=?)" in " ".join(counted)
    tx = planned(lambda tx: STEPS._prune_telemetry(tx, T0 + 1))
    no_table_scans(tx)
    idle = tx.plan_of("SELECT entity_key FROM effector_key_activity WHERE last_seen_ms < ?")
    assert "effector_key_activity_seen (last_seen_ms<?)" in idle[0]
    forgotten = " ".join(tx.plan_of("DELETE FROM effector_traces"))
    assert "effector_traces_age (recorded_at_ms<?)" in forgotten


def test_counting_reads_open_rows_and_only_the_settled_index(planned: Any) -> None:
    every = planned(lambda tx: store_sql._counts(tx, {}))
    polled = planned(lambda tx: store_sql._counts(tx, {}, done=False))
    # The open intents (few) are counted on the open index; the settled ones on theirs alone.
    for tx in (every, polled):
        assert tx.plan_of("GROUP BY state")[0] == (
            "SCAN effector_intents USING INDEX effector_intents_open"
        )
    settled = every.plan_of("GROUP BY settled_state")[0]
    assert settled.startswith(
        "SEARCH effector_intents USING COVERING INDEX effector_intents_settled"
    )
    assert not [sql for sql, _ in polled.plans if "settled_state" in sql]


def test_pruning_settled_intents_range_scans_them_by_completion(planned: Any) -> None:
    tx = planned(lambda tx: store_sql._prune(tx, T0 + 50))
    settled = tx.plan_of(
        "FROM effector_intents WHERE completed_at_ms IS NOT NULL AND completed_at_ms"
    )
    assert any(
        "effector_intents_settled (completed_at_ms>? AND completed_at_ms<?)" in s for s in settled
    )


@pytest_asyncio.fixture
async def backlog(tmp_path: Path) -> Path:
    """A SQLite store with 250 keys, two intents queued on each."""
    store = await open_store(sqlite_url(tmp_path / "backlog.db"))
    try:
        queued = [make_intent("add", key=f"q{n % 250}".encode(), seq=n // 250) for n in range(500)]
        await store.submit([NewIntent(intent) for intent in queued], T0)
    finally:
        await store.close()
    return tmp_path / "backlog.db"


def test_the_worker_finds_the_intents_it_claims_and_records_by_id(backlog: Path) -> None:
    # With a long list of ids, SQLite's planner once preferred walking an index through every
    # queued intent over probing the ids: a claim cost grew with the backlog.
    connection = sqlite3.connect(backlog)
    tx = PlannedTx(connection)
    steps = SqliteStore.__new__(SqliteStore)
    steps._dialect = SQLITE
    steps._claims = claims = MemoryClaims()
    try:
        claims.load(tx, crashed=False)
        batch, _ = steps._claim_work(tx, "w", 250, T0 + 1, 60_000)
        done = [
            Completion(c, new_result(c.intent, ToolResult.OK, completed_at_ms=T0 + 2, attempt=1))
            for c in batch.claims
        ]
        recorded, after, _ = steps._record_and_claim(
            tx, done, T0 + 2, ClaimRequest("w", 250, 60_000)
        )
    finally:
        connection.rollback()
        connection.close()
    assert len(batch.claims) == len(after.claims) == 250 and all(recorded)
    no_table_scans(tx)
    updates = [(sql, plan) for sql, plan in tx.plans if "UPDATE effector_intents" in sql]
    # Claims write no intent row; results 200 to a statement: 250 finished in two.
    assert len(updates) == 2
    for sql, plan in updates:
        found = " ".join(plan)
        assert "effector_intents USING INDEX sqlite_autoindex_effector_intents_1" in found, sql
        assert "arrival" not in found and "by_tool" not in found, (sql, plan)
    # Each key's head is a probe of its queue on the open index.
    heads = [plan for sql, plan in tx.plans if sql.startswith("WITH claimed (entity_key) AS")]
    assert heads and all(
        any("effector_intents_open (entity_key=? AND kind=?)" in step for step in plan)
        for plan in heads
    ), heads
