"""Crashes and replicas: SIGKILL mid-run loses nothing; two replicas share one PostgreSQL."""

from __future__ import annotations

import asyncio
import itertools
import signal
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from effector_harness import TOOLS, EffectorProcess, make_intent
from effector_test_tools import LedgerRow, read_ledger

from beam_agents._protos import IntentState, SubmitAck, ToolIntent, ToolResult
from effector.client import EffectorClient
from tests.pg import PostgresServer


def wait_all_done(client: EffectorClient, intents: list[ToolIntent], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while (status := client.status()).done < len(intents):
        assert time.monotonic() < deadline, f"only {status.done} of {len(intents)} done"
        time.sleep(0.1)


def read_results(client: EffectorClient) -> list[ToolResult]:
    results: list[ToolResult] = []
    offset = 1
    while True:
        response = client.read(offset, max_batch=5_000)
        if not response.records:
            return results
        assert [r.offset for r in response.records] == list(
            range(offset, offset + len(response.records))
        )
        results.extend(r.envelope.tool_result for r in response.records)
        offset = response.next_offset


def assert_key_order(rows: list[LedgerRow]) -> None:
    """Each key's first executions start in (seq, step) order, never overlapping."""
    by_key: dict[bytes, list[LedgerRow]] = defaultdict(list)
    for row in rows:
        by_key[row.entity_key].append(row)
    for key, key_rows in by_key.items():
        first_starts: dict[str, LedgerRow] = {}
        for row in key_rows:
            if row.event == "started":
                first_starts.setdefault(row.intent_id, row)
        positions = [
            (r.seq, r.step_index) for r in sorted(first_starts.values(), key=lambda r: r.at_ns)
        ]
        assert positions == sorted(positions), key
        finished = {r.intent_id: r.at_ns for r in key_rows if r.event == "finished"}
        ordered = sorted(first_starts.values(), key=lambda r: r.at_ns)
        for before, after in itertools.pairwise(ordered):
            assert before.intent_id in finished, key
            assert finished[before.intent_id] <= after.at_ns, key


def test_sigkill_mid_run_loses_nothing_and_reexecutes_only_started_work(
    store_url: str, ledger: Path
) -> None:
    # SQLite gives a dead process's claims back when the store is reopened; on PostgreSQL the
    # restarted replica (a new owner) waits for the dead one's leases to run out.
    args = [
        *("--tools", TOOLS, "--store", store_url, "--listen", "127.0.0.1:0"),
        *("--concurrency", "4", "--lease-ms", "1000"),
    ]
    intents = [
        make_intent("slow", {"seconds": 0.2}, key=f"slow-{k}".encode(), seq=s)
        for s in range(5)
        for k in range(8)
    ] + [make_intent("record", {"note": str(i)}, key=f"fast-{i}".encode()) for i in range(10)]
    with EffectorProcess(*args) as first:
        with EffectorClient(first.address) as client:
            acks = client.submit(intents)
            assert {ack.outcome for ack in acks} == {SubmitAck.ACCEPTED}
        deadline = time.monotonic() + 20
        while True:
            rows = read_ledger(ledger)
            started = {r.intent_id for r in rows if r.event == "started"}
            finished = {r.intent_id for r in rows if r.event == "finished"}
            # A slow tool mid-run: a fast one could finish between this check and the kill.
            slow_running = {r.intent_id for r in rows if r.tool == "slow"} - finished
            if len(started) >= 8 and slow_running:
                break
            assert time.monotonic() < deadline, "work never got under way"
            time.sleep(0.01)
        first.signal(signal.SIGKILL)
        assert first.wait() == -signal.SIGKILL
    before_kill = read_ledger(ledger)
    started_before = {r.intent_id for r in before_kill if r.event == "started"}
    unfinished_before = started_before - {r.intent_id for r in before_kill if r.event == "finished"}
    assert unfinished_before, "the kill should catch at least one tool mid-execution"
    assert len(started_before) < len(intents), "the kill should leave work pending"

    with EffectorProcess(*args) as second, EffectorClient(second.address) as client:
        wait_all_done(client, intents)
        records = {i.intent_id: client.get_intent(i.intent_id) for i in intents}
        published = read_results(client)
        second.signal(signal.SIGTERM)
        assert second.wait() == 0

    # Exactly one terminal result per intent, recorded and published once.
    assert {r.state for r in records.values()} == {IntentState.DONE}
    assert {r.result.status for r in records.values()} == {ToolResult.OK}
    assert Counter(result.intent_id for result in published) == Counter(
        {intent.intent_id: 1 for intent in intents}
    )
    # Only intents whose tool had started before the kill ran more than once.
    executions = Counter(r.intent_id for r in read_ledger(ledger) if r.event == "started")
    assert set(executions) == {i.intent_id for i in intents}
    repeated = {intent_id for intent_id, count in executions.items() if count > 1}
    assert repeated <= started_before
    assert unfinished_before <= repeated
    for intent_id in unfinished_before:
        assert records[intent_id].attempts == 2
        assert records[intent_id].result.attempt == 2
    assert_key_order(read_ledger(ledger))


@pytest.mark.asyncio
async def test_two_replicas_on_one_postgres_execute_each_intent_once_in_key_order(
    postgres: PostgresServer, ledger: Path
) -> None:
    url = postgres.create_database("replicas")
    args = ["--tools", TOOLS, "--store", url, "--listen", "127.0.0.1:0", "--lease-ms", "5000"]
    # Batches of 100 carry whole key histories (5 keys x 20 seqs): a pipeline submits a key's
    # intents in seq order, and the effector orders only what it has received.
    intents = [
        make_intent("record", {"note": f"{k}/{s}"}, key=f"key-{k}".encode(), seq=s)
        for k in range(100)
        for s in range(20)
    ]
    with EffectorProcess(*args) as first, EffectorProcess(*args) as second:
        with EffectorClient(first.address) as a, EffectorClient(second.address) as b:
            batches = [intents[i : i + 100] for i in range(0, len(intents), 100)]

            def submit_all(client: EffectorClient, mine: list[list[ToolIntent]]) -> list[int]:
                return [ack.outcome for batch in mine for ack in client.submit(batch)]

            # Each replica gets half the batches, and a few of the other half as duplicates.
            outcomes = await asyncio.gather(
                asyncio.to_thread(submit_all, a, batches[0::2] + batches[1:6:2]),
                asyncio.to_thread(submit_all, b, batches[1::2] + batches[0:6:2]),
            )
            counted = Counter(outcome for replica in outcomes for outcome in replica)
            assert counted[SubmitAck.ACCEPTED] == 2_000
            assert counted[SubmitAck.DUPLICATE] == 600
            await asyncio.to_thread(wait_all_done, a, intents, 120)
            published_a = await asyncio.to_thread(read_results, a)
            published_b = await asyncio.to_thread(read_results, b)
        for replica in (first, second):
            replica.signal(signal.SIGTERM)
            assert await asyncio.to_thread(replica.wait) == 0

    assert published_a == published_b  # one log, seen identically through either replica
    assert Counter(r.intent_id for r in published_a) == Counter({i.intent_id: 1 for i in intents})
    assert {r.status for r in published_a} == {ToolResult.OK}
    rows = read_ledger(ledger)
    executions = Counter(r.intent_id for r in rows if r.event == "started")
    assert executions == Counter({i.intent_id: 1 for i in intents})
    assert len({r.pid for r in rows}) == 2, "both replicas should have executed work"
    assert_key_order(rows)


@pytest.mark.asyncio
async def test_an_ingest_only_replica_records_and_publishes_while_its_peer_executes(
    postgres: PostgresServer, ledger: Path
) -> None:
    url = postgres.create_database("ingest_only")
    args = ["--tools", TOOLS, "--store", url, "--listen", "127.0.0.1:0"]
    intents = [
        make_intent("record", {"note": f"{k}/{s}"}, key=f"key-{k}".encode(), seq=s)
        for k in range(10)
        for s in range(5)
    ]
    with EffectorProcess(*args, "--concurrency", "0") as ingest:
        with EffectorClient(ingest.address) as client:
            acks = await asyncio.to_thread(client.submit, intents)
            assert {ack.outcome for ack in acks} == {SubmitAck.ACCEPTED}
            await asyncio.sleep(0.5)
            assert read_ledger(ledger) == [], "an ingest-only replica must not execute"
            with EffectorProcess(*args) as executor:
                await asyncio.to_thread(wait_all_done, client, intents, 60)
                published = await asyncio.to_thread(read_results, client)
                executor.signal(signal.SIGTERM)
                assert await asyncio.to_thread(executor.wait) == 0
        assert "ingest-only" in ingest.stderr()
    assert Counter(r.intent_id for r in published) == Counter({i.intent_id: 1 for i in intents})
    rows = read_ledger(ledger)
    assert {r.pid for r in rows} == {executor.process.pid}
    assert_key_order(rows)
