"""The worker's execution path: async tools run together, a key's next intent waits for the
durable result before it, and the commit recording results claims the next work itself.

The worker runs in-process on a SQLite store; the tools look at the store's file through a
connection of their own, so they see only what was committed.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import pytest
from effector_harness import intent_id, make_intent

from beam_agents._protos import AgentEnvelope, IntentState, ToolIntent, ToolResult
from beam_agents.tools import IntentInfo, Tool, ToolRegistry, tool
from effector.observability import EffectorMetrics
from effector.store import open_store
from effector.store.errors import StoreError
from effector.store.intents import ClaimBatch, ClaimRequest, Completion, NewIntent
from effector.store.sql import SqlStore, new_token
from effector.worker import EffectorToolRunner, Worker, WorkerSettings, _ToolThreads

SETTINGS = WorkerSettings(concurrency=16, poll_interval_ms=60_000, housekeeping_interval_ms=60_000)
"""The claim loop runs only when woken: every other claim is the record commit's own."""


@asynccontextmanager
async def working(store: SqlStore, registry: ToolRegistry) -> AsyncIterator[Worker]:
    worker = Worker(store, registry, EffectorToolRunner(), EffectorMetrics(), SETTINGS)
    worker.start()
    try:
        yield worker
    finally:
        await worker.drain(5.0)


async def submit_and_wait(
    store: SqlStore,
    worker: Worker,
    intents: list[ToolIntent],
    timeout_s: float = 20.0,
    *,
    status: ToolResult.Status = ToolResult.OK,
) -> None:
    await store.submit([NewIntent(intent) for intent in intents], int(time.time() * 1000))
    worker.wake()
    deadline = time.monotonic() + timeout_s
    for intent in intents:
        while True:
            record = await store.get_intent(intent.intent_id)
            if record is not None and record.state == IntentState.DONE:
                assert record.result is not None and record.result.status == status, record.result
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
    path: Path,
    tool_: Tool[..., Any],
    intents: list[ToolIntent],
    *,
    status: ToolResult.Status = ToolResult.OK,
) -> CountingStore:
    """Open a SQLite store at ``path``, execute ``intents`` with ``tool_``, close; the counts."""
    store = await open_store(f"sqlite:///{path}")
    counts = CountingStore(store)
    try:
        async with working(store, ToolRegistry([tool_])) as worker:
            await submit_and_wait(store, worker, intents, status=status)
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
        """Check, on a connection of its own, that the key's previous result is published."""
        seen.append((intent.entity_key, intent.seq))
        if intent.seq:
            before = intent_id(intent.entity_key, intent.seq - 1, 0)
            if before not in committed_results(path):
                problems.append(f"{intent.entity_key!r} seq {intent.seq} ran before {before}")
        return intent.seq

    await run_to_the_end(path, step, queues("step", 5, 6)[::-1])
    assert problems == []
    for k in range(5):
        assert [seq for key, seq in seen if key == f"k{k}".encode()] == list(range(6))


def committed_results(path: Path) -> set[str]:
    """The intent ids of the results in the envelope log, as a connection of its own sees it.

    A result is recorded in the transaction that publishes it: committed, the log shows it.
    """
    reader = sqlite3.connect(path)
    try:
        rows = reader.execute("SELECT envelope FROM effector_envelopes").fetchall()
    finally:
        reader.close()
    envelopes = (AgentEnvelope.FromString(bytes(row[0])) for row in rows)
    return {e.tool_result.intent_id for e in envelopes if e.HasField("tool_result")}


class CountingStore:
    """Counts the claims a store hands out, by the call that handed them out."""

    def __init__(self, store: SqlStore) -> None:
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


# -- failure paths around the batched commit (found by review) -------------------------------


@pytest.mark.asyncio
async def test_a_tool_raising_stop_iteration_strands_no_other_result() -> None:
    pool = _ToolThreads()
    gate = threading.Event()

    def odd() -> None:
        gate.wait()
        raise StopIteration("a generator's end, escaped")

    def good() -> int:
        gate.wait()
        time.sleep(0.05)
        return 42

    odd_call, good_call = pool.call(odd, {}), pool.call(good, {})
    gate.set()
    time.sleep(0.3)  # the loop is busy: both results reach the inbox in one hand-over
    assert await asyncio.wait_for(good_call, 5.0) == 42
    with pytest.raises(RuntimeError, match="StopIteration"):
        await odd_call


def test_claim_tokens_differ_in_a_forked_child() -> None:
    reader, writer = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child only reports its tokens
        os.write(writer, " ".join(new_token() for _ in range(3)).encode())
        os._exit(0)
    os.waitpid(child, 0)
    os.close(writer)
    theirs = set(os.read(reader, 4096).decode().split())
    os.close(reader)
    ours = {new_token() for _ in range(3)}
    assert len(theirs) == 3 and not theirs & ours


@pytest.mark.asyncio
async def test_a_failed_claim_after_durable_results_still_reports_them(tmp_path: Path) -> None:
    """PostgreSQL's shape (results, then claims in a second transaction) with the second failing."""
    store = await open_store(f"sqlite:///{tmp_path / 'store.db'}")
    failed: list[bool] = []
    real_claim = store.claim

    async def claim(*args: Any, **kwargs: Any) -> ClaimBatch:
        if not failed:
            failed.append(True)
            raise StoreError("connection lost between the two transactions")
        return await real_claim(*args, **kwargs)

    store.claim = claim  # type: ignore[method-assign]
    intent = make_intent("slow_tool", key=b"k")
    await store.submit([NewIntent(intent)], int(time.time() * 1000))
    batch = await real_claim("owner", 1, int(time.time() * 1000), 30_000)
    result = ToolResult(intent_id=intent.intent_id, status=ToolResult.OK)
    store._claim_with_results = False  # type: ignore[attr-defined]  # PostgreSQL's shape
    recorded, claimed = await store.complete_and_claim(
        [Completion(batch.claims[0], result)],
        int(time.time() * 1000),
        ClaimRequest("owner", 4, 30_000),
    )
    assert failed and recorded == [True] and claimed.claims == []
    record = await store.get_intent(intent.intent_id)
    assert record is not None and record.state == IntentState.DONE
    await store.close()


@pytest.mark.asyncio
async def test_a_drain_that_gives_up_on_a_commit_releases_what_it_claimed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "store.db"
    store = await open_store(f"sqlite:///{path}")
    slow = threading.Event()
    real = SqlStore._record_and_claim

    def slow_record_and_claim(*args: Any, **kwargs: Any) -> Any:
        out = real(*args, **kwargs)
        if slow.is_set():
            slow.clear()  # one slow commit; one queued behind it is not slow itself
            time.sleep(1.6)  # the drain's grace (1 s) runs out meanwhile
        return out

    monkeypatch.setattr(SqlStore, "_record_and_claim", slow_record_and_claim)
    worker = Worker(
        store,
        ToolRegistry([quick_noop]),
        EffectorToolRunner(),
        EffectorMetrics(),
        WorkerSettings(concurrency=2, poll_interval_ms=60_000),
    )
    worker.start()
    intents = [
        make_intent("quick_noop", key=key, seq=seq) for key in (b"a", b"b") for seq in (0, 1)
    ]
    await store.submit([NewIntent(intent) for intent in intents], int(time.time() * 1000))
    slow.set()
    worker.wake()
    await asyncio.sleep(0.3)  # the heads ran; their record-and-claim commit is in flight
    await worker.drain(1.0)
    await store.close()
    with sqlite3.connect(path) as connection:
        held = connection.execute(
            "SELECT count(*) FROM effector_keys WHERE claim_token IS NOT NULL"
        ).fetchone()[0]
        running = connection.execute(
            "SELECT count(*) FROM effector_intents WHERE state = ?", (IntentState.RUNNING,)
        ).fetchone()[0]
        second_attempts = connection.execute(
            "SELECT attempts FROM effector_intents WHERE seq = 1"
        ).fetchall()
    assert (held, running) == (0, 0)
    # Each key's second intent was at most claimed by the abandoned commit and given back
    # unstarted: its attempt is not counted, so no reconciler is asked about it.
    assert sorted(second_attempts) == [(0,), (0,)]


@tool(side_effect=True)
def quick_noop() -> int:
    """Do nothing, synchronously."""
    return 1


@tool(side_effect=True)
async def async_noop() -> None:
    """Return at once."""


@pytest.mark.asyncio
async def test_one_batch_is_recorded_while_the_next_gathers_its_results(tmp_path: Path) -> None:
    """Two commits in flight at most: the next is queued while the store records one."""
    store = await open_store(f"sqlite:///{tmp_path / 'store.db'}")
    in_flight = most = calls = 0
    real = store.complete_and_claim

    async def slow_complete_and_claim(
        completions: Sequence[Completion], now_ms: int, request: ClaimRequest
    ) -> tuple[list[bool], ClaimBatch]:
        nonlocal in_flight, most, calls
        in_flight += 1
        calls += 1
        most = max(most, in_flight)
        try:
            await asyncio.sleep(0.02)  # a slow disk: results keep arriving meanwhile
            return await real(completions, now_ms, request)
        finally:
            in_flight -= 1

    store.complete_and_claim = slow_complete_and_claim  # type: ignore[method-assign]
    try:
        async with working(store, ToolRegistry([async_noop])) as worker:
            await submit_and_wait(store, worker, queues("async_noop", 32, 5))
    finally:
        await store.close()
    assert most == 2, (most, calls)


@pytest.mark.asyncio
async def test_no_more_tools_run_at_once_than_the_concurrency(tmp_path: Path) -> None:
    running = most = 0

    @tool(side_effect=True)
    async def nap() -> None:
        """Sleep a little, counting the naps at once."""
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.01)
        running -= 1

    await run_to_the_end(tmp_path / "store.db", nap, queues("nap", 40, 3))
    assert most == SETTINGS.concurrency


attempts_seen: list[int] = []


@tool(side_effect=True)
async def cancels_first(*, intent: IntentInfo) -> int:
    """Raise CancelledError on its first attempt; return the attempt after that."""
    attempts_seen.append(intent.attempt)
    if intent.attempt == 1:
        raise asyncio.CancelledError
    return intent.attempt


async def results_of(path: Path, intents: Sequence[ToolIntent]) -> list[ToolResult]:
    """The recorded result of each of ``intents``, read back from the store at ``path``."""
    store = await open_store(f"sqlite:///{path}")
    try:
        records = [await store.get_intent(intent.intent_id) for intent in intents]
    finally:
        await store.close()
    results = [record.result for record in records if record is not None]
    assert len(results) == len(intents) and all(result is not None for result in results)
    return [result for result in results if result is not None]


@pytest.mark.asyncio
async def test_a_tool_that_cancels_itself_fails_and_its_key_goes_on(tmp_path: Path) -> None:
    attempts_seen.clear()
    intents = queues("cancels_first", 1, 2)
    await run_to_the_end(tmp_path / "store.db", cancels_first, intents, status=ToolResult.ERROR)
    assert attempts_seen == [1, 1]  # each ran once, in key order; neither blocked the key
    for result in await results_of(tmp_path / "store.db", intents):
        assert result.status == ToolResult.ERROR
        assert result.error_message.startswith("CancelledError")


class OwnBaseError(BaseException):
    """A BaseException of a tool's own, neither Exception nor SystemExit."""


class UnprintableError(Exception):
    """An exception whose message cannot be read."""

    def __str__(self) -> str:
        raise RuntimeError("no str")


failures_by_seq: dict[int, BaseException] = {}


@tool(side_effect=True)
async def fails_strangely(*, intent: IntentInfo) -> None:
    """Raise the failure registered for this intent's seq, after a sleep when it is odd."""
    if intent.seq % 2:
        await asyncio.sleep(0.01)
    raise failures_by_seq[intent.seq]


@pytest.mark.asyncio
async def test_strange_failures_become_error_results_and_every_key_goes_on(
    tmp_path: Path,
) -> None:
    failures_by_seq.update(
        {
            0: ValueError("bad \ud800 text"),  # a lone surrogate: no protobuf string takes it
            1: ValueError("after a sleep, bad \udfff text"),
            2: UnprintableError(),
            3: UnprintableError(),
            4: OwnBaseError("mine"),
            5: OwnBaseError("mine, later"),
        }
    )
    intents = queues("fails_strangely", 3, 6)
    await run_to_the_end(tmp_path / "store.db", fails_strangely, intents, status=ToolResult.ERROR)
    results = await results_of(tmp_path / "store.db", intents)
    assert [result.status for result in results] == [ToolResult.ERROR] * len(intents)
    messages = {
        intent.seq: result.error_message for intent, result in zip(intents, results, strict=True)
    }
    assert messages[0] == "ValueError: bad \\ud800 text"
    assert messages[1] == "ValueError: after a sleep, bad \\udfff text"
    assert (
        messages[2]
        == messages[3]
        == ("UnprintableError: <its message could not be read: RuntimeError>")
    )
    assert messages[4] == "OwnBaseError: mine"
    assert messages[5] == "OwnBaseError: mine, later"
