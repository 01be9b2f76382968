"""The worker's gauges: refreshed each housekeeping tick while counting is cheap, less often
while counting the intents in flight is slow (a large backlog), so it never dominates."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from effector_harness import make_intent

import effector.worker as worker_module
from beam_agents.tools import ToolRegistry
from effector.observability import EffectorMetrics
from effector.store import open_store
from effector.store.intents import NewIntent, StoreCounts
from effector.store.sql import SqlStore
from effector.worker import GAUGE_COUNT_SHARE, EffectorToolRunner, Worker, WorkerSettings

TICK_MS = 10


async def counts_while_working(
    store: SqlStore, delay_s: float, watch_s: float
) -> tuple[int, float]:
    """Run an ingest-only worker for ``watch_s``; its counts, each slowed by ``delay_s``."""
    calls = 0
    count = store.counts

    async def slow_count(*, done: bool = True) -> StoreCounts:
        nonlocal calls
        calls += 1
        await asyncio.sleep(delay_s)
        return await count(done=done)

    store.counts = slow_count  # type: ignore[method-assign]
    metrics = EffectorMetrics()
    settings = WorkerSettings(concurrency=0, housekeeping_interval_ms=TICK_MS)
    worker = Worker(store, ToolRegistry(), EffectorToolRunner(), metrics, settings)
    worker.start()
    try:
        await asyncio.sleep(watch_s)
    finally:
        await worker.drain(5.0)
        store.counts = count  # type: ignore[method-assign]
    depth = metrics.registry.get_sample_value("effector_queue_depth")
    assert depth is not None
    return calls, depth


@pytest.mark.asyncio
async def test_a_count_waits_in_proportion_to_its_cost_then_runs_again(tmp_path: Path) -> None:
    store = await open_store(f"sqlite:///{tmp_path / 'store.db'}")
    try:
        intents = [make_intent("add", key=f"k{n}".encode()) for n in range(5)]
        await store.submit([NewIntent(intent) for intent in intents], int(time.time() * 1000))
        cheap = await counts_while_working(store, 0.0, watch_s=1.0)
        slow = await counts_while_working(store, 0.05, watch_s=1.0)
        slower_again = await counts_while_working(store, 0.01, watch_s=2.0)
    finally:
        await store.close()
    # Every run keeps the gauge right: five intents in flight, none executed (ingest only).
    assert cheap[1] == slow[1] == slower_again[1] == 5
    # A count of a few rows takes well under a tick's 2%-share budget: it runs most ticks.
    assert cheap[0] >= 5
    # One taking 50 ms waits at least 50 / 0.02 = 2.5 s: once in the second watched (about
    # a hundred at one per tick).
    assert 0.05 / GAUGE_COUNT_SHARE > 1.0
    assert slow[0] == 1
    # One taking 10 ms waits at least 0.5 s, then runs again: 2 to 4 times in 2 s.
    assert 2 <= slower_again[0] <= 1 + 2.0 / (0.01 / GAUGE_COUNT_SHARE)


@pytest.mark.asyncio
async def test_a_stalled_count_does_not_freeze_the_gauges_past_the_cap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A 50 ms count would wait 2.5 s; capped at 0.3 s it runs again within the 1 s watched.
    monkeypatch.setattr(worker_module, "GAUGE_COUNT_WAIT_MAX_S", 0.3)
    store = await open_store(f"sqlite:///{tmp_path / 'store.db'}")
    try:
        calls, depth = await counts_while_working(store, 0.05, watch_s=1.0)
    finally:
        await store.close()
    assert depth == 0
    assert 2 <= calls <= 1 + 1.0 / 0.3
