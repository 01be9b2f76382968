"""The worker's execution path: async tools run together, a key's next intent waits for the
durable result before it, and the commit recording results claims the next work itself.

The worker runs in-process on a SQLite store; the tools look at the store's file through a
connection of their own, so they see only what was committed.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import pytest
from effector_harness import intent_id, make_intent

from beam_agents._protos import IntentState, ToolIntent, ToolResult
from beam_agents.tools import IntentInfo, Tool, ToolRegistry, tool
from effector.metrics import EffectorMetrics
from effector.runner import EffectorToolRunner
from effector.store import EffectorStore, open_store
from effector.store.base import ClaimBatch, ClaimRequest, Completion, NewIntent
from effector.worker import Worker, WorkerSettings

SETTINGS = WorkerSettings(concurrency=16, poll_interval_ms=60_000, housekeeping_interval_ms=60_000)
"""The claim loop runs only when woken: every other claim is the record commit's own."""


@asynccontextmanager
async def working(store: EffectorStore, registry: ToolRegistry) -> AsyncIterator[Worker]:
    worker = Worker(store, registry, EffectorToolRunner(), EffectorMetrics(), SETTINGS)
    worker.start()
    try:
        yield worker
    finally:
        await worker.drain(5.0)


async def submit_and_wait(
    store: EffectorStore, worker: Worker, intents: list[ToolIntent], timeout_s: float = 20.0
) -> None:
    await store.submit([NewIntent(intent) for intent in intents], int(time.time() * 1000))
    worker.wake()
    deadline = time.monotonic() + timeout_s
    for intent in intents:
        while True:
            record = await store.get_intent(intent.intent_id)
            if record is not None and record.state == IntentState.DONE:
                assert record.result is not None and record.result.status == ToolResult.OK, (
                    record.result
                )
                break
            assert time.monotonic() < deadline, f"{intent.intent_id} not DONE in time"
            await asyncio.sleep(0.01)


def queues(tool_name: str, keys: int, length: int) -> list[ToolIntent]:
    """``length`` intents on each of ``keys`` keys, in (seq, key) order."""
    return [
        make_intent(tool_name, key=f"k{k}".encode(), seq=seq)
        for seq in range(length)
        for k in range(keys)
    ]


async def run_to_the_end(
    path: Path, tool_: Tool[..., Any], intents: list[ToolIntent]
) -> CountingStore:
    """Open a SQLite store at ``path``, execute ``intents`` with ``tool_``, close; the counts."""
    store = await open_store(f"sqlite:///{path}")
    counts = CountingStore(store)
    try:
        async with working(store, ToolRegistry([tool_])) as worker:
            await submit_and_wait(store, worker, intents)
    finally:
        await store.close()
    return counts


@pytest.mark.asyncio
async def test_async_tools_of_different_keys_run_concurrently(tmp_path: Path) -> None:
    keys = 8
    running = 0
    most = 0
    all_started = asyncio.Event()

    @tool(side_effect=True)
    async def rendezvous() -> int:
        """Wait until every key's call has started (or give up after a while)."""
        nonlocal running, most
        running += 1
        most = max(most, running)
        if most == keys:
            all_started.set()
        with suppress(TimeoutError):
            await asyncio.wait_for(all_started.wait(), 5.0)
        running -= 1
        return most

    await run_to_the_end(tmp_path / "store.db", rendezvous, queues("rendezvous", keys, 1))
    assert most == keys


@pytest.mark.asyncio
async def test_a_keys_next_intent_starts_only_after_the_result_before_it_is_durable(
    tmp_path: Path,
) -> None:
    path = tmp_path / "store.db"
    seen: list[tuple[bytes, int]] = []
    problems: list[str] = []

    @tool(side_effect=True)
    def step(*, intent: IntentInfo) -> int:
        """Check, on a connection of its own, that the key's previous intent is committed DONE."""
        seen.append((intent.entity_key, intent.seq))
        if intent.seq:
            before = intent_id(intent.entity_key, intent.seq - 1, 0)
            reader = sqlite3.connect(path)
            try:
                row = reader.execute(
                    "SELECT state, published_envelope FROM effector_intents WHERE intent_id = ?",
                    (before,),
                ).fetchone()
                published = reader.execute(
                    "SELECT count(*) FROM effector_envelopes WHERE envelope = ?",
                    (row[1] if row else b"",),
                ).fetchone()[0]
            finally:
                reader.close()
            if row is None or row[0] != IntentState.DONE or published != 1:
                problems.append(f"{intent.entity_key!r} seq {intent.seq} ran before {before}")
        return intent.seq

    await run_to_the_end(path, step, queues("step", 5, 6)[::-1])
    assert problems == []
    for k in range(5):
        assert [seq for key, seq in seen if key == f"k{k}".encode()] == list(range(6))


class CountingStore:
    """Counts the claims a store hands out, by the call that handed them out."""

    def __init__(self, store: EffectorStore) -> None:
        self.standalone = 0
        self.chained = 0
        claim, complete_and_claim = store.claim, store.complete_and_claim

        async def counted_claim(owner: str, limit: int, now_ms: int, lease_ms: int) -> ClaimBatch:
            batch = await claim(owner, limit, now_ms, lease_ms)
            self.standalone += len(batch.claims)
            return batch

        async def counted_complete_and_claim(
            completions: Sequence[Completion], now_ms: int, request: ClaimRequest
        ) -> tuple[list[bool], ClaimBatch]:
            recorded, batch = await complete_and_claim(completions, now_ms, request)
            self.chained += len(batch.claims)
            return recorded, batch

        store.claim = counted_claim  # type: ignore[method-assign]
        store.complete_and_claim = counted_complete_and_claim  # type: ignore[method-assign]


@pytest.mark.asyncio
async def test_the_commit_recording_results_claims_the_next_work(tmp_path: Path) -> None:
    @tool(side_effect=True)
    def noop() -> None:
        """Do nothing."""

    counts = await run_to_the_end(tmp_path / "store.db", noop, queues("noop", 4, 10))
    # The first claim round takes each key's head; every later intent is claimed by the
    # commit that recorded the one before it, with no claim transaction of its own.
    assert counts.standalone + counts.chained == 40
    assert counts.chained >= 36
