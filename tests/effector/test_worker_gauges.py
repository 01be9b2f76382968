"""The worker's gauges: refreshed each housekeeping tick while counting is cheap, less often
while counting the intents in flight is slow (a large backlog), so it never dominates."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from effector_harness import make_intent

from beam_agents.tools import ToolRegistry
from effector.metrics import EffectorMetrics
from effector.runner import EffectorToolRunner
from effector.store import EffectorStore, open_store
from effector.store.base import NewIntent, StoreCounts
from effector.worker import GAUGE_COUNT_SHARE, Worker, WorkerSettings

TICK_MS = 10
WATCH_S = 1.0


async def counts_while_working(store: EffectorStore, delay_s: float) -> tuple[int, float]:
    """Run an ingest-only worker for ``WATCH_S``; its counts, each slowed by ``delay_s``."""
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
        await asyncio.sleep(WATCH_S)
    finally:
        await worker.drain(5.0)
    depth = metrics.registry.get_sample_value("effector_queue_depth")
    assert depth is not None
    return calls, depth


@pytest.mark.asyncio
async def test_a_slow_count_is_taken_less_often_and_a_cheap_one_every_tick(
    tmp_path: Path,
) -> None:
    store = await open_store(f"sqlite:///{tmp_path / 'store.db'}")
    try:
        intents = [make_intent("add", key=f"k{n}".encode()) for n in range(5)]
        await store.submit([NewIntent(intent) for intent in intents], int(time.time() * 1000))
        cheap_calls, cheap_depth = await counts_while_working(store, 0.0)
        slow_calls, slow_depth = await counts_while_working(store, 0.05)
    finally:
        await store.close()
    # Both keep the gauge right: five intents in flight, none executed (ingest only).
    assert cheap_depth == slow_depth == 5
    # A cheap count runs about every 10 ms tick; a 50 ms one waits 50 / 0.02 = 2.5 s, so it
    # runs once in the 1 s watched (it would run about 16 times at one per tick).
    assert cheap_calls >= 10
    assert 0.05 / GAUGE_COUNT_SHARE > WATCH_S
    assert slow_calls == 1
