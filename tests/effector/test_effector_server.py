"""The effector over real gRPC on 127.0.0.1: dedup, ordering, every status, approvals, bad input."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import defaultdict
from pathlib import Path

import grpc
import httpx
import pytest
from conftest import sqlite_url
from effector_harness import FAST_WORKER, make_intent, running_effector, wait_done
from effector_test_tools import read_ledger

import beam_agents._protos as pb
from beam_agents._protos import (
    AgentEnvelope,
    IntentState,
    SubmitAck,
    SubmitRequest,
    ToolIntent,
    ToolResult,
)
from effector.client import AsyncEffectorClient
from effector.server import ServerSettings
from effector.service import DEFAULT_LIST_LIMIT, MAX_LIST_LIMIT, MAX_SUBMIT_BATCH
from effector.store.intents import intent_id_problem
from effector.worker import WorkerSettings


async def read_envelopes(
    client: AsyncEffectorClient, count: int, timeout_s: float = 20.0
) -> list[AgentEnvelope]:
    """Read the log from the start until ``count`` envelopes have arrived."""
    found: list[AgentEnvelope] = []
    offset = 1
    deadline = time.monotonic() + timeout_s
    while len(found) < count:
        assert time.monotonic() < deadline, f"only {len(found)} of {count} envelopes arrived"
        response = await client.read(offset, wait_ms=500)
        assert [r.offset for r in response.records] == list(
            range(offset, offset + len(response.records))
        )
        found.extend(r.envelope for r in response.records)
        offset = response.next_offset
    return found


@pytest.mark.asyncio
async def test_one_intent_submitted_1000_times_concurrently_executes_once(
    store_url: str, ledger: Path
) -> None:
    intent = make_intent("record", {"note": "once"})
    async with running_effector(store_url) as effector:
        acks = await asyncio.gather(*(effector.client.submit([intent]) for _ in range(1_000)))
        outcomes = [ack.outcome for [ack] in acks]
        assert outcomes.count(SubmitAck.ACCEPTED) == 1
        assert outcomes.count(SubmitAck.DUPLICATE) == 999
        final = (await wait_done(effector.client, [intent.intent_id]))[intent.intent_id].result
        assert final.status == ToolResult.OK
        assert [ack.result for [ack] in acks if ack.HasField("result")] == [final] * sum(
            ack.HasField("result") for [ack] in acks
        )
        later = await asyncio.gather(*(effector.client.submit([intent]) for _ in range(100)))
        assert {(ack.outcome, ack.state) for [ack] in later} == {
            (SubmitAck.DUPLICATE, IntentState.DONE)
        }
        assert all(ack.result == final for [ack] in later)
        envelopes = await read_envelopes(effector.client, 1)
        assert [e.tool_result for e in envelopes] == [final]
        assert (await effector.client.read(2, wait_ms=200)).records == []
    assert [row.event for row in read_ledger(ledger)] == ["started", "finished"]


@pytest.mark.asyncio
async def test_one_key_runs_in_order_while_other_keys_run_concurrently(
    tmp_path: Path, ledger: Path
) -> None:
    ordered = [
        make_intent("slow", {"seconds": 0.15}, key=b"a", seq=s, step=t)
        for s in range(3)
        for t in range(2)
    ]
    gate = tmp_path / "open"
    blocker = make_intent("gate", {"path": str(gate)}, key=b"blocked")
    blocked_behind = make_intent("add", {"a": 1}, key=b"blocked", seq=1)
    async with running_effector(sqlite_url(tmp_path / "s.db")) as effector:
        await effector.client.submit([blocked_behind, blocker, *reversed(ordered)])
        quick = make_intent("record", {"note": "fast"}, key=b"quick")
        await effector.client.submit([quick])
        # Another key and the whole of key "a" finish while key "blocked" is held up.
        await wait_done(effector.client, [quick.intent_id, *(i.intent_id for i in ordered)])
        assert (await effector.client.get_intent(blocker.intent_id)).state == IntentState.RUNNING
        assert (await effector.client.get_intent(blocked_behind.intent_id)).state == (
            IntentState.PENDING
        )
        gate.touch()
        await wait_done(effector.client, [blocker.intent_id, blocked_behind.intent_id])
    rows = [row for row in read_ledger(ledger) if row.entity_key == b"a"]
    assert [(row.event, row.seq, row.step_index) for row in rows] == [
        (event, intent.seq, intent.step_index)
        for intent in ordered
        for event in ("started", "finished")
    ]


@pytest.mark.asyncio
async def test_every_result_status_over_grpc(tmp_path: Path, ledger: Path) -> None:
    # Wide enough that a pause of the whole test process late in the suite cannot time out the
    # quick tools: with 300 ms, all seven once timed out together in a fresh-clone run.
    settings = ServerSettings(tool_timeout_ms=1_500, worker=FAST_WORKER)
    cases = {
        "ok": make_intent("add", {"a": 2, "b": "5"}, key=b"ok"),
        "async": make_intent("async_slow", {"seconds": 0.01}, key=b"async"),
        "injected": make_intent("record", {"note": "hi"}, key=b"inj", seq=2, step=3),
        "raises": make_intent("fail", {"message": "boom"}, key=b"raises"),
        "timeout": make_intent("slow", {"seconds": 5}, key=b"timeout"),
        "not_json": make_intent("not_json", key=b"not_json"),
        "exits": make_intent("exits", key=b"exits"),
        # Held behind a slow intent of its key for longer than its 100 ms TTL.
        "expired": make_intent("add", {"a": 1}, key=b"timeout", seq=1, ttl_ms=100),
    }
    async with running_effector(sqlite_url(tmp_path / "s.db"), settings=settings) as effector:
        acks = await effector.client.submit(list(cases.values()))
        assert {ack.outcome for ack in acks} == {SubmitAck.ACCEPTED}
        done = await wait_done(effector.client, [i.intent_id for i in cases.values()])
        results = {name: done[intent.intent_id].result for name, intent in cases.items()}
        assert (results["ok"].status, results["ok"].payload) == (ToolResult.OK, b"7")
        assert (results["async"].status, results["async"].payload) == (
            ToolResult.OK,
            b'"slept 0.01"',
        )
        assert json.loads(results["injected"].payload) == {
            "note": "hi",
            "intent_id": cases["injected"].intent_id,
            "attempt": 1,
        }
        assert results["raises"].status == ToolResult.ERROR
        assert results["raises"].error_message == "RuntimeError: boom"
        assert results["timeout"].status == ToolResult.ERROR
        assert "1500 ms" in results["timeout"].error_message
        assert results["not_json"].status == ToolResult.ERROR
        assert results["exits"].status == ToolResult.ERROR
        assert results["expired"].status == ToolResult.EXPIRED
        assert done[cases["expired"].intent_id].attempts == 0
        envelopes = await read_envelopes(effector.client, len(cases))
        assert {e.tool_result.intent_id: e.tool_result for e in envelopes} == {
            intent.intent_id: results[name] for name, intent in cases.items()
        }
        assert await effector.client.health()
    started = {row.intent_id for row in read_ledger(ledger) if row.event == "started"}
    assert cases["expired"].intent_id not in started


@pytest.mark.asyncio
async def test_invalid_intents_are_rejected_recorded_and_published(
    tmp_path: Path, ledger: Path
) -> None:
    unknown_kind = make_intent("add", {"a": 1}, key=b"kind")
    unknown_kind.kind = 9  # type: ignore[assignment]
    backwards = make_intent("add", {"a": 1}, key=b"ttl", created_at_ms=5_000)
    backwards.expires_at_ms = 10
    rejected = {
        "unknown tool 'missing'": make_intent("missing", key=b"t1"),
        "read-only": make_intent("lookup", {"name": "x"}, key=b"t2"),
        "is not JSON": make_intent("add", "{", key=b"t3"),
        "must be a JSON object": make_intent("add", "3", key=b"t4"),
        "add": make_intent("add", {"a": "lots"}, key=b"t5"),
        "intent": make_intent("record", {"note": "x", "intent": {"attempt": 9}}, key=b"t6"),
        "unknown intent kind 9": unknown_kind,
        "precedes created_at_ms": backwards,
    }
    valid = make_intent("add", {"a": 1}, key=b"fine")
    async with running_effector(sqlite_url(tmp_path / "s.db")) as effector:
        acks = await effector.client.submit([*rejected.values(), valid])
        for (reason, intent), ack in zip(rejected.items(), acks, strict=False):
            assert ack.outcome == SubmitAck.REJECTED, reason
            assert reason in ack.reason
            assert ack.state == IntentState.DONE
            assert (ack.result.status, ack.result.intent_id) == (
                ToolResult.REJECTED,
                intent.intent_id,
            )
        assert acks[-1].outcome == SubmitAck.ACCEPTED
        envelopes = await read_envelopes(effector.client, len(rejected) + 1)
        by_id = {e.tool_result.intent_id: e.tool_result.status for e in envelopes}
        assert by_id == {
            **{intent.intent_id: ToolResult.REJECTED for intent in rejected.values()},
            valid.intent_id: ToolResult.OK,
        }
        again = await effector.client.submit([rejected["read-only"]])
        assert (again[0].outcome, again[0].result.status) == (
            SubmitAck.DUPLICATE,
            ToolResult.REJECTED,
        )
    assert read_ledger(ledger) == []


@pytest.mark.parametrize(
    ("spelling", "problem"),
    [
        ("{id}", None),
        ("{{{id}}}", "canonical form"),
        ("urn:uuid:{id}", "canonical form"),
        ("{hex}", "canonical form"),
        ("{upper}", "canonical form"),
        ("{id}\n", "not a UUID"),
        ("{id}0", "not a UUID"),
        ("", "not a UUID"),
    ],
)
def test_only_the_canonical_spelling_of_a_uuid_is_an_intent_id(
    spelling: str, problem: str | None
) -> None:
    known = uuid.uuid4()
    intent_id = spelling.format(id=known, hex=known.hex, upper=str(known).upper())
    found = intent_id_problem(intent_id)
    assert found is None if problem is None else problem in str(found)


@pytest.mark.asyncio
async def test_malformed_ids_and_keys_and_conflicts(tmp_path: Path) -> None:
    good = make_intent("add", {"a": 1}, key=b"k")
    uppercase = make_intent("add", {"a": 1}, key=b"k2")
    uppercase.intent_id = uppercase.intent_id.upper()
    not_uuid = make_intent("add", {"a": 1}, key=b"k3")
    not_uuid.intent_id = "order-17"
    no_key = make_intent("add", {"a": 1}, key=b"k4")
    no_key.entity_key = b""
    conflict = make_intent("add", {"a": 99}, key=b"k")
    async with running_effector(sqlite_url(tmp_path / "s.db")) as effector:
        acks = await effector.client.submit([good, uppercase, not_uuid, no_key, conflict])
        assert [ack.outcome for ack in acks] == [
            SubmitAck.ACCEPTED,
            SubmitAck.REJECTED,
            SubmitAck.REJECTED,
            SubmitAck.REJECTED,
            SubmitAck.REJECTED,
        ]
        assert "canonical form" in acks[1].reason
        assert "not a UUID" in acks[2].reason
        assert "empty entity_key" in acks[3].reason
        assert "conflict" in acks[4].reason
        assert not any(ack.HasField("result") for ack in acks[1:4])
        assert not (await effector.client.get_intent(uppercase.intent_id.lower())).found
        with pytest.raises(grpc.aio.AioRpcError) as bad_lookup:
            await effector.client.get_intent("order-17")
        assert bad_lookup.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        done = await wait_done(effector.client, [good.intent_id])
        assert done[good.intent_id].result.payload == b"2"  # the first content was kept
        assert (await effector.client.status()).done == 1


@pytest.mark.asyncio
async def test_batch_limits_and_malformed_bytes_leave_the_server_healthy(tmp_path: Path) -> None:
    async with running_effector(sqlite_url(tmp_path / "s.db")) as effector:
        client = effector.client
        with pytest.raises(grpc.aio.AioRpcError) as empty:
            await client.submit([])
        assert empty.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        too_many = [
            make_intent("add", {"a": 1}, key=f"k{i}".encode()) for i in range(MAX_SUBMIT_BATCH + 1)
        ]
        with pytest.raises(grpc.aio.AioRpcError) as oversized:
            await client.submit(too_many)
        assert oversized.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert str(MAX_SUBMIT_BATCH) in (oversized.value.details() or "")
        huge = make_intent("add", json.dumps({"a": 1, "pad": "x" * (17 * 1024 * 1024)}))
        with pytest.raises(grpc.aio.AioRpcError) as too_big:
            await client.submit([huge])
        assert too_big.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED

        async with grpc.aio.insecure_channel(effector.server.address) as channel:
            raw_submit = channel.unary_unary(
                "/beam_agents.v1.Effector/Submit",
                request_serializer=lambda raw: raw,
                response_deserializer=lambda raw: raw,
            )
            for garbage in (b"\xff\xff\xff\xff", b"\x0a\x05abc", bytes(range(256))):
                with pytest.raises(grpc.aio.AioRpcError) as malformed:
                    await raw_submit(garbage, timeout=5)
                assert malformed.value.code() in (
                    grpc.StatusCode.INVALID_ARGUMENT,
                    grpc.StatusCode.INTERNAL,
                )
            # Well-formed bytes still work on the same raw channel.
            valid = make_intent("add", {"a": 4})
            reply = await raw_submit(SubmitRequest(intents=[valid]).SerializeToString(), timeout=5)
            assert reply
        for bad_read in (
            {"from_offset": -1},
            {"from_offset": 1, "max_batch": -1},
            {"from_offset": 1, "wait_ms": -5},
        ):
            with pytest.raises(grpc.aio.AioRpcError) as negative:
                await client.read(**bad_read)
            assert negative.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert await client.health()
        done = await wait_done(client, [valid.intent_id])
        assert done[valid.intent_id].result.payload == b"5"
        assert (await client.status()).done == 1  # nothing from the refused batches was recorded


@pytest.mark.asyncio
async def test_publish_and_long_poll_read(tmp_path: Path) -> None:
    async with running_effector(sqlite_url(tmp_path / "s.db")) as effector:
        client = effector.client
        waiting = asyncio.create_task(client.read(1, wait_ms=10_000))
        await asyncio.sleep(0.2)
        assert not waiting.done()
        started = time.monotonic()
        offsets = await client.publish(
            [
                AgentEnvelope(entity_key=b"k", external_event=b"one", event_time_ms=5),
                AgentEnvelope(entity_key=b"k", external_event=b"two"),
            ]
        )
        assert offsets == [1, 2]
        response = await waiting
        assert time.monotonic() - started < 2.0
        assert response.records[0].envelope.external_event == b"one"
        everything = await client.read(1)
        assert [r.envelope.external_event for r in everything.records] == [b"one", b"two"]
        assert everything.records[0].envelope.event_time_ms == 5
        assert everything.records[1].envelope.event_time_ms > 0  # stamped by the effector
        assert everything.next_offset == 3
        limited = await client.read(1, max_batch=1)
        assert ([r.offset for r in limited.records], limited.next_offset) == ([1], 2)
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await client.publish([])
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        forged = AgentEnvelope(entity_key=b"k", tool_result=ToolResult(intent_id="x"))
        report = await client.publish_report(
            [forged, AgentEnvelope(external_event=b"no key"), AgentEnvelope(entity_key=b"k")]
        )
        assert list(report.offsets) == [0, 0, 0]
        assert [problem.split(" ", 2)[2] for problem in report.problems] == [
            "is not an external_event: tool results and approvals are published only by the "
            "effector itself",
            "has an empty entity_key",
            "is not an external_event: tool results and approvals are published only by the "
            "effector itself",
        ]
        assert (await client.status()).head_offset == 2


@pytest.mark.asyncio
async def test_approvals_are_decided_or_expire_and_never_execute(
    tmp_path: Path, ledger: Path
) -> None:
    approve = make_intent("record", {"note": "x"}, key=b"a", kind=ToolIntent.APPROVAL)
    deny = make_intent("record", {"note": "y"}, key=b"d", kind=ToolIntent.APPROVAL)
    lapse = make_intent("", {"amount": 3}, key=b"e", kind=ToolIntent.APPROVAL, ttl_ms=300)
    async with running_effector(sqlite_url(tmp_path / "s.db")) as effector:
        client = effector.client
        acks = await client.submit([approve, deny, lapse])
        assert {(ack.outcome, ack.state) for ack in acks} == {
            (SubmitAck.ACCEPTED, IntentState.AWAITING_DECISION)
        }
        approved = await client.decide(
            approve.intent_id, approved=True, approver="ann", reason="ok"
        )
        denied = await client.decide(deny.intent_id, approved=False, approver="bob")
        assert (approved.applied, denied.applied) == (True, True)
        assert json.loads(denied.result.payload)["approved"] is False
        twice = await client.decide(approve.intent_id, approved=False)
        assert (twice.applied, twice.reason) == (False, "already decided")
        # No Decide and no new submit: the worker notices the lapsed approval by itself.
        done = await wait_done(client, [lapse.intent_id], timeout_s=5)
        assert done[lapse.intent_id].result.status == ToolResult.EXPIRED
        envelopes = await read_envelopes(client, 3)
        kinds = {
            (e.approval.intent_id or e.tool_result.intent_id): e.WhichOneof("payload")
            for e in envelopes
        }
        assert kinds == {
            approve.intent_id: "approval",
            deny.intent_id: "approval",
            lapse.intent_id: "tool_result",
        }
        approval = next(e.approval for e in envelopes if e.approval.intent_id == approve.intent_id)
        assert (approval.approved, approval.approver, approval.reason) == (True, "ann", "ok")
        for intent in (approve, deny):
            assert (await client.get_intent(intent.intent_id)).attempts == 0
        with pytest.raises(grpc.aio.AioRpcError) as bad:
            await client.decide("nope", approved=True)
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert read_ledger(ledger) == []


@pytest.mark.asyncio
async def test_metrics_endpoint_counts_per_server(tmp_path: Path) -> None:
    settings = ServerSettings(metrics_listen="127.0.0.1:0", worker=FAST_WORKER)
    async with (
        running_effector(sqlite_url(tmp_path / "a.db"), settings=settings) as first,
        running_effector(sqlite_url(tmp_path / "b.db"), settings=settings) as second,
    ):
        intents = [make_intent("add", {"a": i}, key=f"k{i}".encode()) for i in range(3)]
        await first.client.submit([*intents, intents[0], make_intent("missing", key=b"m")])
        await wait_done(first.client, [i.intent_id for i in intents])
        async with httpx.AsyncClient() as http:
            text = (await http.get(f"http://127.0.0.1:{first.server.metrics_port}/metrics")).text
            other = (await http.get(f"http://127.0.0.1:{second.server.metrics_port}/metrics")).text
    samples = {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }
    assert samples["effector_intents_accepted_total"] == 3
    assert samples["effector_intents_duplicate_total"] == 1
    assert samples['effector_intents_rejected_total{cause="invalid"}'] == 1
    assert samples['effector_intents_executed_total{status="OK"}'] == 3
    assert samples['effector_tool_latency_seconds_count{tool="add"}'] == 3
    assert "effector_intents_in_flight" in samples
    assert "effector_queue_depth" in samples
    assert "effector_intents_accepted_total 0.0" in other


@pytest.mark.asyncio
async def test_lease_is_renewed_while_a_long_tool_runs(tmp_path: Path, ledger: Path) -> None:
    settings = ServerSettings(
        worker=WorkerSettings(lease_ms=1_000, housekeeping_interval_ms=50, poll_interval_ms=50)
    )
    # A pause of the whole process shorter than the lease (another test worker busy on the
    # same cores) must not let it run out; the tool outlasts several renewals.
    intent = make_intent("slow", {"seconds": 3.0})
    async with running_effector(sqlite_url(tmp_path / "s.db"), settings=settings) as effector:
        await effector.client.submit([intent])
        done = await wait_done(effector.client, [intent.intent_id])
    assert done[intent.intent_id].attempts == 1
    assert [row.event for row in read_ledger(ledger)] == ["started", "finished"]


@pytest.mark.asyncio
async def test_many_keys_many_intents_all_finish_once(tmp_path: Path, ledger: Path) -> None:
    intents = [
        make_intent("record", {"note": str(i)}, key=f"key-{i % 25}".encode(), seq=i // 25)
        for i in range(300)
    ]
    async with running_effector(sqlite_url(tmp_path / "s.db")) as effector:
        for start in range(0, len(intents), 100):
            await effector.client.submit(intents[start : start + 100])
        await wait_done(effector.client, [i.intent_id for i in intents])
        envelopes = await read_envelopes(effector.client, len(intents))
    assert sorted(e.tool_result.intent_id for e in envelopes) == sorted(
        i.intent_id for i in intents
    )
    starts: dict[bytes, list[int]] = defaultdict(list)
    for row in read_ledger(ledger):
        if row.event == "started":
            starts[row.entity_key].append(row.seq)
    assert all(seqs == sorted(seqs) and len(seqs) == 12 for seqs in starts.values())


async def metric_samples(port: int | None) -> dict[str, float]:
    async with httpx.AsyncClient() as http:
        text = (await http.get(f"http://127.0.0.1:{port}/metrics")).text
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }


@pytest.mark.asyncio
async def test_submit_with_redelivery_republishes_done_results_once_per_request(
    store_url: str, ledger: Path
) -> None:
    settings = ServerSettings(metrics_listen="127.0.0.1:0", worker=FAST_WORKER)
    executed = make_intent("record", {"note": "once"}, key=b"run")
    approval = make_intent("", {"amount": 9}, key=b"ask", kind=ToolIntent.APPROVAL)
    rejected = make_intent("missing", key=b"bad")
    async with running_effector(store_url, settings=settings) as effector:
        client = effector.client
        await client.submit([executed, approval, rejected])
        # Asked while the approval is still undecided: nothing is appended for it.
        await wait_done(client, [executed.intent_id, rejected.intent_id])
        early = await client.submit([approval], redeliver_results=True)
        assert (early[0].outcome, early[0].state) == (
            SubmitAck.DUPLICATE,
            IntentState.AWAITING_DECISION,
        )
        await client.decide(approval.intent_id, approved=True, approver="ann")
        first = await read_envelopes(client, 3)
        assert (await client.read(4, wait_ms=100)).records == []

        plain = await client.submit([executed, approval, rejected])
        assert {ack.outcome for ack in plain} == {SubmitAck.DUPLICATE}
        assert (await client.read(4, wait_ms=100)).records == []

        acks = await client.submit([rejected, executed, approval], redeliver_results=True)
        assert [(ack.outcome, ack.state) for ack in acks] == [
            (SubmitAck.DUPLICATE, IntentState.DONE)
        ] * 3
        again = await read_envelopes(client, 6)
        by_id = {
            (e.tool_result.intent_id or e.approval.intent_id): e.SerializeToString() for e in first
        }
        assert [e.SerializeToString() for e in again[3:]] == [
            by_id[rejected.intent_id],
            by_id[executed.intent_id],
            by_id[approval.intent_id],
        ]
        samples = await metric_samples(effector.server.metrics_port)
    assert samples["effector_results_redelivered_total"] == 3
    assert [row.event for row in read_ledger(ledger)] == ["started", "finished"]


@pytest.mark.asyncio
async def test_list_intents_is_an_approvers_inbox(tmp_path: Path) -> None:
    approvals = [
        make_intent("", {"n": n}, key=f"k{n}".encode(), kind=ToolIntent.APPROVAL) for n in range(5)
    ]
    async with running_effector(sqlite_url(tmp_path / "s.db")) as effector:
        client = effector.client
        for intent in approvals:
            await client.submit([intent])
        await client.decide(approvals[1].intent_id, approved=False)
        inbox = await client.list_intents(IntentState.AWAITING_DECISION)
        assert inbox == [approvals[0], *approvals[2:]]
        assert await client.list_intents(IntentState.AWAITING_DECISION, limit=2) == inbox[:2]
        assert await client.list_intents(IntentState.DONE) == [approvals[1]]
        assert await client.list_intents(IntentState.PENDING) == []
        for state, limit in (
            (IntentState.INTENT_STATE_UNSPECIFIED, 0),
            (42, 0),
            (IntentState.DONE, -1),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await client.list_intents(state, limit=limit)  # type: ignore[arg-type]
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert await client.list_failed() == []  # a denial is a recorded decision, not a failure
        only_done = pb.ListIntentsRequest(state=IntentState.PENDING, failed_only=True)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await client._stub.ListIntents(only_done)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "failed_only lists DONE intents" in (refused.value.details() or "")


@pytest.mark.asyncio
async def test_list_intents_default_and_maximum_limits(tmp_path: Path) -> None:
    approvals = [
        make_intent("", key=f"k{n:04}".encode(), kind=ToolIntent.APPROVAL)
        for n in range(MAX_LIST_LIMIT + 1)
    ]
    async with running_effector(sqlite_url(tmp_path / "s.db")) as effector:
        client = effector.client
        for start in range(0, len(approvals), MAX_SUBMIT_BATCH):
            await client.submit(approvals[start : start + MAX_SUBMIT_BATCH])
        assert len(await client.list_intents(IntentState.AWAITING_DECISION)) == DEFAULT_LIST_LIMIT
        capped = await client.list_intents(IntentState.AWAITING_DECISION, limit=10 * MAX_LIST_LIMIT)
        assert len(capped) == MAX_LIST_LIMIT
