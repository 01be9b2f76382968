"""SQLite keeps claims in memory: what a clean close records, what a crash leaves counted.

A claim writes no row on SQLite, so a process that dies takes its claims with it; the next
process counts each key's head as possibly started (its reconciler is asked first). A clean
close records the attempts the claims counted, so nothing is counted twice or lost.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from conftest import sqlite_url
from effector_harness import make_intent

from beam_agents._protos import IntentState, ToolResult
from effector.store import open_store
from effector.store.claims import Hold, MemoryClaims, Release
from effector.store.intents import Claim, Completion, NewIntent, new_result
from effector.store.sql import SqlStore

T0 = 1_700_000_000_000
LEASE = 60_000


def ok(claim: Claim) -> Completion:
    result = new_result(claim.intent, ToolResult.OK, completed_at_ms=T0, attempt=claim.attempt)
    return Completion(claim, result)


async def claim_all(store: SqlStore, now: int = T0) -> dict[str, Claim]:
    return {c.intent.intent_id: c for c in (await store.claim("w", 10, now, LEASE)).claims}


@pytest.mark.asyncio
async def test_a_claim_writes_no_row_and_reads_say_running(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store = await open_store(sqlite_url(path))
    try:
        intent = make_intent("add", key=b"k")
        await store.submit([NewIntent(intent)], T0)
        before = store._connection.total_changes  # type: ignore[attr-defined]
        [claim] = (await store.claim("w", 1, T0, LEASE)).claims
        assert store._connection.total_changes == before  # type: ignore[attr-defined]
        record = await store.get_intent(intent.intent_id)
        assert record is not None and (record.state, record.attempts) == (IntentState.RUNNING, 1)
        assert (await store.counts()).running == 1
        assert await store.list_intents(IntentState.RUNNING, 10) == [intent]
        assert await store.list_intents(IntentState.PENDING, 10) == []
        assert await store.complete([ok(claim)], T0 + 1) == [True]
        record = await store.get_intent(intent.intent_id)
        assert record is not None and (record.state, record.attempts) == (IntentState.DONE, 1)
        assert record.started_at_ms == T0
    finally:
        await store.close()


@pytest.mark.asyncio
async def test_a_clean_close_records_what_the_claims_counted(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "s.db")
    started, unstarted, queued = (make_intent("add", key=key) for key in (b"a", b"b", b"c"))
    store = await open_store(url)
    try:
        await store.submit([NewIntent(i) for i in (started, unstarted, queued)], T0)
        claims = await claim_all(store)
        await store.release([claims[started.intent_id]])
        await store.release([claims[unstarted.intent_id]], started=False)
        await store.release([claims[queued.intent_id]], started=False)
    finally:
        await store.close()
    store = await open_store(url)
    try:
        again = await claim_all(store)
        assert {i: c.attempt for i, c in again.items()} == {
            started.intent_id: 2,
            unstarted.intent_id: 1,
            queued.intent_id: 1,
        }
    finally:
        await store.close()


_CRASH = textwrap.dedent(
    """
    import asyncio, os, sys
    from effector.store import open_store

    async def main() -> None:
        store = await open_store(sys.argv[1])
        batch = await store.claim("w", 1, {now}, {lease})
        assert len(batch.claims) == 1
        os._exit(0)  # no close: the claim dies with the process

    asyncio.run(main())
    """
)


@pytest.mark.asyncio
async def test_after_a_crash_each_keys_head_counts_as_possibly_started(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "s.db")
    claimed, untouched, behind = (
        make_intent("add", key=b"a", seq=0),
        make_intent("add", key=b"b", seq=0),
        make_intent("add", key=b"a", seq=1),
    )
    store = await open_store(url)
    try:
        await store.submit([NewIntent(i) for i in (claimed, untouched, behind)], T0)
    finally:
        await store.close()
    script = _CRASH.format(now=T0, lease=LEASE)
    subprocess.run([sys.executable, "-c", script, url], check=True, timeout=60)
    store = await open_store(url)
    try:
        # Neither head can be told from the other: both count as started, neither is withdrawn.
        for intent in (claimed, untouched):
            record = await store.get_intent(intent.intent_id)
            assert record is not None and (record.state, record.attempts) == (
                IntentState.PENDING,
                1,
            )
        again = await claim_all(store)
        assert {i: c.possibly_started for i, c in again.items()} == {
            claimed.intent_id: True,
            untouched.intent_id: True,
        }
        await store.complete([ok(again[claimed.intent_id])], T0 + 1)
        [next_of_a] = (await store.claim("w", 10, T0 + 2, LEASE)).claims
        assert next_of_a.intent == behind and not next_of_a.possibly_started
    finally:
        await store.close()


def test_a_rolled_back_transaction_leaves_the_claims_as_they_were() -> None:
    claims = MemoryClaims()
    tx: Any = None  # the memory's changes need no transaction of the database
    held = Hold(b"k", "i", "t1", 1, T0, T0 + LEASE)
    claims.take(tx, [held])
    claims.commit()
    point = claims.savepoint()
    claims.release(tx, [held], T0, Release.FINISHED)
    claims.take(tx, [Hold(b"other", "j", "t2", 1, T0, T0 + LEASE)])
    assert claims.holds(tx, [b"k", b"other"]) == {
        b"other": Hold(b"other", "j", "t2", 1, T0, T0 + LEASE)
    }
    claims.rollback(point)
    assert claims.holds(tx, [b"k", b"other"]) == {b"k": held}
    assert claims.held(tx) == [held]
