"""The telemetry half of the conformance suite: traces, errors, keys, searches, the overview.

Runs against every store backend (SQLite and PostgreSQL) with time passed in, like
``test_store_conformance.py``.
"""

from __future__ import annotations

import asyncio
import hashlib

import pytest
from effector_harness import make_intent

import effector.store.schema as schema
import effector.store.sql as store_sql
import effector.store.telemetry as telemetry
from beam_agents._protos import (
    AgentEnvelope,
    AgentError,
    IntentState,
    ToolIntent,
    ToolResult,
    TraceEvent,
)
from effector.store.intents import Completion, NewIntent, error_id_for, new_result
from effector.store.sql import SqlStore

T0 = 1_700_000_020_000
MINUTE = 60_000
LEASE = 1_000


def span(
    key: bytes, seq: int, sequence: int, event_type: int = TraceEvent.TOOL_CALL, **more: object
) -> TraceEvent:
    return TraceEvent(
        trace_id=hashlib.md5(key + seq.to_bytes(8)).hexdigest(),  # 32 hex digits
        span_id=f"{sequence:016x}",
        entity_key=key,
        seq=seq,
        sequence=sequence,
        event_type=event_type,  # type: ignore[arg-type]
        **more,  # type: ignore[arg-type]
    )


def llm_span(key: bytes, seq: int, at_ms: int, tokens_in: str, tokens_out: str) -> TraceEvent:
    return span(
        key,
        seq,
        1,
        TraceEvent.LLM_CALL,
        attributes={
            "gen_ai.usage.input_tokens": tokens_in,
            "gen_ai.usage.output_tokens": tokens_out,
        },
        wall_start_unix_nano=at_ms * 1_000_000,
    )


@pytest.mark.asyncio
async def test_runs_are_listed_per_trace_and_read_a_page_at_a_time(store: SqlStore) -> None:
    plain = [span(b"k", 4, n) for n in range(5)]
    other = [span(b"k", 4, n) for n in range(3)]  # the same run in another namespace
    for event in other:
        event.trace_id = "f" * 32
    other[-1].event_type = TraceEvent.ACTIVATION_END
    older = [span(b"k", 1, 0, TraceEvent.SUSPENDED)]
    await store.record_traces([*plain, *other, *older, span(b"other", 4, 0)], T0)
    heads = await store.trace_runs(b"k", 10)
    assert [(h.seq, h.trace_id, h.spans) for h in heads] == [
        (4, plain[0].trace_id, 5),
        (4, "f" * 32, 3),
        (1, older[0].trace_id, 1),
    ]
    assert heads[1].last_event == TraceEvent.ACTIVATION_END
    assert [(h.seq, h.spans) for h in await store.trace_runs(b"k", 1)] == [(4, 5), (4, 3)]
    assert await store.trace_runs(b"k", 0) == [] and await store.trace_runs(b"none", 5) == []
    assert await store.trace_run(b"k", "f" * 32) == heads[1]
    assert await store.trace_run(b"other", "f" * 32) is None
    assert await store.run_spans(b"k", heads[0], 1, 3) == plain[1:4]
    assert await store.run_spans(b"k", heads[1], 2, 10) == other[2:]
    closing = (TraceEvent.ACTIVATION_END, TraceEvent.SUSPENDED)
    assert await store.newest_events_of_types(b"k", closing, 10) == [other[-1], *older]
    assert await store.newest_events_of_types(b"k", closing, 1) == [other[-1]]


def agent_error(key: bytes, detail: str, reason: str = "activation_error") -> AgentError:
    envelope = AgentEnvelope(entity_key=key, external_event=detail.encode())
    return AgentError(
        entity_key=key, reason=reason, detail=detail, envelope=envelope.SerializeToString()
    )


@pytest.mark.asyncio
async def test_trace_events_are_recorded_once_per_span_id(store: SqlStore) -> None:
    first = [span(b"k", 0, n, wall_start_unix_nano=1_000) for n in range(3)]
    again = [span(b"k", 0, n, wall_start_unix_nano=9_000) for n in range(3)]  # a retry's times
    recorded = await store.record_traces([*first, first[0]], T0)
    assert (recorded.recorded, recorded.duplicates) == (3, 1)
    recorded = await store.record_traces([*again, span(b"k", 1, 0)], T0 + 1)
    assert (recorded.recorded, recorded.duplicates) == (1, 3)
    assert await store.traces_for_key(b"k", 10) == [*first, span(b"k", 1, 0)]


@pytest.mark.asyncio
async def test_traces_for_key_returns_the_newest_runs_in_order(store: SqlStore) -> None:
    events = [span(b"k", seq, n) for seq in (0, 1, 2, 5) for n in (2, 0, 1)]
    await store.record_traces(events, T0)
    await store.record_traces([span(b"other", 9, 0), span(b"k-longer", 7, 0)], T0)
    newest = await store.traces_for_key(b"k", 2)
    assert [(e.seq, e.sequence) for e in newest] == [(2, 0), (2, 1), (2, 2), (5, 0), (5, 1), (5, 2)]
    assert len(await store.traces_for_key(b"k", 100)) == 12
    assert await store.traces_for_key(b"k", 0) == []
    assert await store.traces_for_key(b"missing", 5) == []


def test_the_error_id_digests_what_a_retry_reproduces_and_nothing_else() -> None:
    base = AgentError(
        entity_key=b"k",
        seq=3,
        reason="activation_error",
        event_time_ms=T0,
        envelope=b"envelope",
        detail="RuntimeError: on worker 1",
        traceback="File /worker-1/agent.py",
    )
    error_id = error_id_for(base)
    assert len(error_id) == 32 and int(error_id, 16) >= 0
    elsewhere = AgentError()
    elsewhere.CopyFrom(base)
    elsewhere.detail, elsewhere.traceback = "RuntimeError: on worker 2", "File /w2/agent.py"
    assert error_id_for(elsewhere) == error_id
    changes = {
        "entity_key": b"j",
        "seq": 4,
        "reason": "activation_timeout",
        "event_time_ms": T0 + 1,
        "envelope": b"other",
    }
    for field, value in changes.items():
        changed = AgentError()
        changed.CopyFrom(base)
        setattr(changed, field, value)
        assert error_id_for(changed) != error_id, field


@pytest.mark.asyncio
async def test_errors_are_recorded_once_per_content_digest(store: SqlStore) -> None:
    boom, other = agent_error(b"k", "boom"), agent_error(b"k", "other")
    assert error_id_for(boom) == error_id_for(agent_error(b"k", "boom"))
    assert error_id_for(boom) != error_id_for(other)
    recorded = await store.record_errors([boom, boom], T0)
    assert (recorded.recorded, recorded.duplicates) == (1, 1)
    recorded = await store.record_errors([other, boom], T0 + 5)
    assert (recorded.recorded, recorded.duplicates) == (1, 1)
    stored = await store.get_error(error_id_for(boom))
    assert stored is not None
    assert (stored.error, stored.recorded_at_ms, stored.redriven_at_ms) == (boom, T0, None)
    assert await store.get_error("0" * 32) is None


@pytest.mark.asyncio
async def test_list_errors_newest_first_by_key_and_bounded(store: SqlStore) -> None:
    errors = [agent_error(b"a" if n % 2 else b"b", f"e{n}") for n in range(5)]
    for n, error in enumerate(errors):
        await store.record_errors([error], T0 + n)
    listed = await store.list_errors(None, 10)
    assert [record.error for record in listed] == errors[::-1]
    assert [record.error_id for record in listed] == [error_id_for(e) for e in errors[::-1]]
    assert [record.error.detail for record in await store.list_errors(b"a", 10)] == ["e3", "e1"]
    assert [record.error.detail for record in await store.list_errors(None, 2)] == ["e4", "e3"]
    assert await store.list_errors(b"none", 10) == []


@pytest.mark.asyncio
async def test_mark_redriven_notes_the_time_of_known_errors_only(store: SqlStore) -> None:
    error = agent_error(b"k", "boom")
    await store.record_errors([error], T0)
    assert await store.mark_redriven(error_id_for(error), T0 + 7) is True
    assert await store.mark_redriven("f" * 32, T0 + 7) is False
    assert await store.mark_redriven("f" * 32, T0 + 7, again=True) is False
    stored = await store.get_error(error_id_for(error))
    assert stored is not None and stored.redriven_at_ms == T0 + 7
    await store.record_errors([error], T0 + 9)  # a duplicate changes nothing
    [listed] = await store.list_errors(b"k", 5)
    assert (listed.recorded_at_ms, listed.redriven_at_ms) == (T0, T0 + 7)


@pytest.mark.asyncio
async def test_mark_redriven_is_a_claim_taken_once_unless_again(store: SqlStore) -> None:
    error_id = error_id_for(agent_error(b"k", "boom"))
    await store.record_errors([agent_error(b"k", "boom")], T0)
    claims = await asyncio.gather(*(store.mark_redriven(error_id, T0 + n) for n in range(1, 5)))
    assert sorted(claims) == [False, False, False, True]
    first = await store.get_error(error_id)
    assert first is not None and first.redriven_at_ms is not None
    assert await store.mark_redriven(error_id, T0 + 50) is False
    assert (await store.get_error(error_id)) == first  # a refused claim changes nothing
    assert await store.mark_redriven(error_id, T0 + 60, again=True) is True
    again = await store.get_error(error_id)
    assert again is not None and again.redriven_at_ms == T0 + 60


@pytest.mark.asyncio
async def test_list_keys_by_last_seen_with_runs_and_open_intents(store: SqlStore) -> None:
    binary = b"\xff\x00key"
    await store.record_traces([span(b"order-1", seq, n) for seq in range(3) for n in range(2)], T0)
    await store.submit(
        [NewIntent(make_intent("add", key=b"order-2")), NewIntent(make_intent("add", key=binary))],
        T0 + 10,
    )
    await store.submit([NewIntent(make_intent("add", key=b"order-2", seq=1))], T0 + 11)
    await store.record_errors([agent_error(b"customer-9", "x")], T0 + 20)
    await store.record_traces([span(binary, 4, 0)], T0 + 30)

    # Keys come from traces and errors: order-2, with intents only, is not listed (a submit
    # stays off the keys table, which keeps the execution path's writes as they were).
    keys = await store.list_keys(b"", 10)
    assert [(k.entity_key, k.runs, k.last_seen_ms, k.open_intents) for k in keys] == [
        (binary, 1, T0 + 30, 1),
        (b"customer-9", 0, T0 + 20, 0),
        (b"order-1", 3, T0, 0),
    ]
    assert [k.entity_key for k in await store.list_keys(b"order", 10)] == [b"order-1"]
    assert [k.entity_key for k in await store.list_keys(b"\xff", 10)] == [binary]
    assert [k.entity_key for k in await store.list_keys(b"", 2)] == [binary, b"customer-9"]
    assert await store.list_keys(b"nothing", 10) == []


async def seed_intents(store: SqlStore) -> list[ToolIntent]:
    """Six intents received one ms apart: two tools, three keys, every state."""
    intents = [
        make_intent("add", key=b"a", seq=0),
        make_intent("mul", key=b"a", seq=1),
        make_intent("add", key=b"b", seq=0),
        make_intent("", key=b"c", kind=ToolIntent.APPROVAL),
        make_intent("mul", key=b"b", seq=1),
        make_intent("nope", key=b"c", seq=1),
    ]
    for n, intent in enumerate(intents):
        rejection = "unknown tool" if intent.tool_name == "nope" else None
        await store.submit([NewIntent(intent, rejection)], T0 + n)
    await store.claim("w", 10, T0 + 10, LEASE)  # a/0 and b/0 run
    return intents


@pytest.mark.asyncio
async def test_search_intents_filters_newest_first(
    store: SqlStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_sql, "_SEARCH_SCAN_BATCH", 2)  # every scan takes several pages
    intents = await seed_intents(store)

    async def ids(**filters: object) -> list[int]:
        query = {"state": None, "tool_name": None, "entity_key": None, "limit": 100, **filters}
        found = await store.search_intents(**query)  # type: ignore[arg-type]
        return [intents.index(record.intent) for record in found]

    assert await ids() == [5, 4, 3, 2, 1, 0]
    assert await ids(limit=4) == [5, 4, 3, 2]
    assert await ids(state=IntentState.RUNNING) == [2, 0]
    assert await ids(state=IntentState.PENDING) == [4, 1]
    assert await ids(tool_name="mul") == [4, 1]
    assert await ids(tool_name="add", limit=1) == [2]
    assert await ids(entity_key=b"b") == [4, 2]
    assert await ids(entity_key=b"a", state=IntentState.RUNNING) == [0]
    assert await ids(entity_key=b"c", tool_name="nope", state=IntentState.DONE) == [5]
    assert await ids(tool_name="missing") == []


@pytest.mark.asyncio
async def test_intent_records_carry_their_lifecycle_times(store: SqlStore) -> None:
    intents = await seed_intents(store)
    record = await store.get_intent(intents[0].intent_id)
    assert record is not None
    assert (record.received_at_ms, record.started_at_ms, record.completed_at_ms) == (
        T0,
        T0 + 10,
        None,
    )
    batch = await store.claim("w", 10, T0 + 10 + LEASE + 1, LEASE)  # the leases ran out
    [claim] = [claim for claim in batch.claims if claim.intent == intents[0]]
    result = new_result(claim.intent, ToolResult.OK, completed_at_ms=T0 + 2_000, attempt=2)
    await store.complete([Completion(claim, result)], T0 + 2_000)
    record = await store.get_intent(intents[0].intent_id)
    assert record is not None
    assert (record.started_at_ms, record.completed_at_ms, record.attempts) == (
        T0 + 10 + LEASE + 1,
        T0 + 2_000,
        2,
    )
    rejected = await store.get_intent(intents[5].intent_id)
    assert rejected is not None
    assert (rejected.started_at_ms, rejected.completed_at_ms) == (None, T0 + 5)


@pytest.mark.asyncio
async def test_overview_figures_on_known_data(store: SqlStore) -> None:
    minute = T0 - T0 % MINUTE  # the minute T0 falls in
    now = minute + 3 * MINUTE + 5  # in the fourth minute; a 3-minute window covers the last 3
    empty = await store.overview(now, 3 * MINUTE)
    assert [count for _, count in empty.executions_per_minute] == [0, 0, 0]
    assert (empty.tool_latency_p50_ms, empty.tool_latency_p99_ms, empty.oldest_open) == (
        None,
        None,
        None,
    )
    # Five executions, claimed at one time and completed 10, 20, 30, 40, 100 ms later.
    tools = [make_intent("add", key=f"t{n}".encode()) for n in range(5)]
    await store.submit([NewIntent(intent) for intent in tools], minute)
    claims = sorted((await store.claim("w", 10, minute + MINUTE, 10 * MINUTE)).claims,
                    key=lambda c: c.intent.entity_key)  # fmt: skip
    for claim, latency in zip(claims, (10, 20, 30, 40, 100), strict=True):
        done_at = minute + MINUTE + latency + (MINUTE if latency == 100 else 0)
        result = new_result(claim.intent, ToolResult.OK, completed_at_ms=done_at, attempt=1)
        await store.complete([Completion(claim, result)], done_at)
    waiting = make_intent("", key=b"w", kind=ToolIntent.APPROVAL)
    await store.submit([NewIntent(waiting)], minute + 2)
    await store.submit([NewIntent(make_intent("add", key=b"later"))], minute + 3)
    # DONE in the window without being executed: a rejection and a decided approval.
    refused = NewIntent(make_intent("nope", key=b"r"), rejection="unknown tool")
    await store.submit([refused], minute + MINUTE + 5)
    decided = make_intent("", key=b"d", kind=ToolIntent.APPROVAL)
    await store.submit([NewIntent(decided)], minute + MINUTE)
    await store.record_vote(
        decided.intent_id, approved=True, approver="a", reason="", now_ms=minute + 2 * MINUTE
    )
    await store.record_errors([agent_error(b"e", "1"), agent_error(b"e", "2")], minute + MINUTE)
    await store.record_errors([agent_error(b"e", "3")], minute + 3 * MINUTE)
    await store.record_errors([agent_error(b"e", "old")], minute - 1)  # before the window
    await store.record_traces(
        [
            llm_span(b"m", 0, minute + MINUTE + 1, "100", "20"),
            llm_span(b"m", 1, minute + 2 * MINUTE, "7", "not a number"),
            llm_span(b"m", 2, minute + 2 * MINUTE + 9, "-4", ""),
            span(b"m", 3, 0, attributes={"gen_ai.usage.input_tokens": "1000"}),  # not LLM
        ],
        minute + 2 * MINUTE,
    )

    view = await store.overview(now, 3 * MINUTE)
    starts = [minute + MINUTE, minute + 2 * MINUTE, minute + 3 * MINUTE]
    assert view.executions_per_minute == list(zip(starts, [4, 1, 0], strict=True))
    assert view.errors_per_minute == list(zip(starts, [2, 0, 1], strict=True))
    assert view.tokens_per_minute == list(zip(starts, [120, 7, 0], strict=True))
    assert view.tool_latency_p50_ms == pytest.approx(30.0)
    assert view.tool_latency_p99_ms == pytest.approx(40 + 0.96 * (MINUTE + 100 - 40))
    assert (view.pending_approvals, view.counts.awaiting_decision, view.counts.done) == (1, 1, 7)
    assert view.oldest_open is not None and view.oldest_open.intent == waiting
    assert view.oldest_open.received_at_ms == minute + 2
    one_minute = await store.overview(now, 1)
    assert one_minute.executions_per_minute == [(starts[2], 0)]
    assert one_minute.tool_latency_p50_ms is None


@pytest.mark.asyncio
async def test_prune_telemetry_forgets_only_what_is_past_the_retention(
    store: SqlStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(schema, "PRUNE_BATCH", 2)  # pruning takes several transactions
    await store.record_traces([span(b"old", 0, n) for n in range(5)], T0)
    await store.record_errors([agent_error(b"old", str(n)) for n in range(3)], T0)
    await store.record_traces([span(b"mixed", 0, 0)], T0)
    await store.submit([NewIntent(make_intent("add", key=b"asked"))], T0)
    await store.record_traces([span(b"new", 0, 0), span(b"mixed", 1, 0)], T0 + 1_000)
    await store.record_errors([agent_error(b"new", "x")], T0 + 1_000)
    # 6 trace events, 3 errors, and the key not seen since with no runs left: old. (A key
    # with intents only, "asked", is not on the keys page: submits stay off its table.)
    assert await store.prune_telemetry(T0 + 1_500, 1_000) == 10
    assert await store.traces_for_key(b"old", 10) == []
    assert len(await store.traces_for_key(b"new", 10)) == 1
    assert [e.error.entity_key for e in await store.list_errors(None, 10)] == [b"new"]
    keys = await store.list_keys(b"", 10)
    assert [(k.entity_key, k.runs, k.last_seen_ms) for k in keys] == [
        (b"new", 1, T0 + 1_000),
        (b"mixed", 1, T0 + 1_000),
    ]
    asked = await store.search_intents(state=None, tool_name=None, entity_key=b"asked", limit=5)
    assert len(asked) == 1  # a key forgotten by the keys page keeps its intents
    assert await store.prune_telemetry(T0 + 1_500, 1_000) == 0
    assert (await store.record_traces([span(b"old", 0, 0)], T0 + 2_000)).recorded == 1
    [old, *_] = await store.list_keys(b"", 10)
    assert (old.entity_key, old.runs, old.last_seen_ms) == (b"old", 1, T0 + 2_000)


@pytest.mark.asyncio
async def test_a_keys_runs_count_each_run_once_however_its_events_arrive(
    store: SqlStore,
) -> None:
    await store.record_traces([span(b"k", 0, 0), span(b"k", 0, 1)], T0)
    await store.record_traces([span(b"k", 0, 1), span(b"k", 0, 2)], T0 + 1)  # a retry, and more
    # Concurrent calls with events of the same new runs (PostgreSQL runs them in parallel).
    await asyncio.gather(
        *(store.record_traces([span(b"k", seq, n)], T0 + 2) for n in range(4) for seq in (1, 2))
    )
    await store.record_traces([span(b"k", 0, 0)], T0 + 5)  # only a duplicate: not seen anew
    [key] = await store.list_keys(b"", 10)
    assert (key.runs, key.last_seen_ms) == (3, T0 + 2)


@pytest.mark.asyncio
async def test_two_namespaces_runs_on_one_seq_count_as_two_runs_until_pruned(
    store: SqlStore,
) -> None:

    def other(sequence: int) -> TraceEvent:
        """A span of another namespace's run on the same key and seq (its own trace id)."""
        event = span(b"k", 0, sequence)
        event.trace_id = "f" * 32
        return event

    await store.record_traces([span(b"k", 0, n) for n in range(2)], T0)
    await store.record_traces([other(n) for n in range(3)], T0 + 1)
    heads = await store.trace_runs(b"k", 10)
    [key] = await store.list_keys(b"", 10)
    assert key.runs == len(heads) == 2
    await store.record_traces([other(5)], T0 + 5_000)
    assert await store.prune_telemetry(T0 + 1_500, 1_000) == 5  # the first spans of both
    [key] = await store.list_keys(b"", 10)
    assert key.runs == len(await store.trace_runs(b"k", 10)) == 1


@pytest.mark.asyncio
async def test_a_key_search_looks_at_the_newest_keys_and_finds_an_exact_key(
    store: SqlStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(telemetry, "KEY_SEARCH_SCAN", 2)
    for n, key in enumerate([b"order-1", b"order-2", b"order-3", b"other"]):
        await store.record_errors([agent_error(key, "x")], T0 + n)
    assert [k.entity_key for k in await store.list_keys(b"order", 10)] == [b"order-3"]
    assert [k.entity_key for k in await store.list_keys(b"order-1", 10)] == [b"order-1"]
    assert [k.entity_key for k in await store.list_keys(b"", 3)] == [
        b"other",
        b"order-3",
        b"order-2",
    ]
