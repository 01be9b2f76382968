"""The store conformance suite, continued: one lifecycle for runs, intents and approvals.

Runs on both stores (SQLite and PostgreSQL). A run that stops waiting for an intent submits a
WITHDRAWAL of it: an intent that has not started is WITHDRAWN (terminal, never run, never
published), whichever of the two arrives first; one that started is left alone. A conflicting
submission is answered with a published REJECTED result. Telemetry ids tell runs apart by
trace and namespace; reads are bounded by bytes; times near the INT64 limits are stored.
"""

from __future__ import annotations

import asyncio

import pytest
from effector_harness import make_intent, make_withdrawal

from beam_agents._protos import (
    ActivationRecord,
    AgentEnvelope,
    AgentError,
    IntentState,
    ToolIntent,
    ToolResult,
    TraceEvent,
)
from effector.store import open_store
from effector.store.intents import Claim, Completion, NewIntent, SubmitOutcome, new_result
from effector.store.sql import SqlStore

T0 = 1_700_000_000_000
LEASE = 1_000
INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)
REASON = "deadline route taken \u202e after 20000 ms\n"


def withdrawal(target: ToolIntent, reason: str = REASON, *, key: bytes | None = None) -> ToolIntent:
    """The WITHDRAWAL a run submits when it stops waiting for ``target``."""
    return make_withdrawal(target, reason, key=key, created_at_ms=T0)


def approval(*, key: bytes = b"k", step: int = 0, quorum: int = 0) -> ToolIntent:
    intent = make_intent(
        "", {"to": "acct-1"}, key=key, step=step, kind=ToolIntent.APPROVAL, created_at_ms=T0
    )
    intent.required_approvals = quorum
    return intent


def ok(claim: Claim, now: int = T0) -> Completion:
    result = new_result(
        claim.intent, ToolResult.OK, completed_at_ms=now, attempt=claim.attempt, payload=b"1"
    )
    return Completion(claim, result)


async def log_of(store: SqlStore) -> list[AgentEnvelope]:
    return [record.envelope for record in await store.read(1, 10_000)]


async def state_of(store: SqlStore, intent: ToolIntent) -> IntentState:
    record = await store.get_intent(intent.intent_id)
    assert record is not None
    return record.state


async def assert_withdrawn(store: SqlStore, intent: ToolIntent, by: ToolIntent) -> None:
    record = await store.get_intent(intent.intent_id)
    assert record is not None and record.state == IntentState.WITHDRAWN
    assert record.result is not None
    assert record.result.status == ToolResult.WITHDRAWN
    assert (record.result.intent_id, record.result.entity_key, record.result.seq) == (
        intent.intent_id,
        intent.entity_key,
        intent.seq,
    )
    assert by.intent_id in record.result.error_message
    assert REASON in record.result.error_message
    assert record.attempts == 0 and record.started_at_ms is None
    recorded = await store.get_intent(by.intent_id)
    assert recorded is not None and recorded.state == IntentState.DONE
    assert recorded.result is not None and recorded.result.status == ToolResult.OK


def test_the_test_withdrawals_are_well_formed() -> None:
    from effector.worker import withdrawal_problem

    assert withdrawal_problem(withdrawal(make_intent("add"))) is None


# -- a withdrawal arriving after its target -----------------------------------------------------


@pytest.mark.asyncio
async def test_a_pending_intent_is_withdrawn_and_the_next_of_its_key_runs(store: SqlStore) -> None:
    head = make_intent("add", {"a": 1}, step=0, created_at_ms=T0)
    following = make_intent("add", {"a": 2}, step=1, created_at_ms=T0)
    other = make_intent("add", key=b"other", created_at_ms=T0)
    await store.submit([NewIntent(i) for i in (head, following, other)], T0)
    notice = withdrawal(head)

    [answer] = await store.submit([NewIntent(notice)], T0 + 1)

    assert (answer.outcome, answer.state) == (SubmitOutcome.ACCEPTED, IntentState.DONE)
    assert answer.rejection is None
    await assert_withdrawn(store, head, notice)
    counts = await store.counts()
    assert (counts.pending, counts.withdrawn, counts.done) == (2, 1, 1)
    assert (await store.counts(done=False)).pending == 2
    assert await store.list_intents(IntentState.PENDING, 10) == [following, other]
    assert [
        r.intent
        for r in await store.search_intents(state=None, tool_name=None, entity_key=b"key", limit=10)
    ].count(head) == 1
    claimed = (await store.claim("w", 10, T0 + 2, LEASE)).claims
    assert sorted(c.intent.intent_id for c in claimed) == sorted(
        [following.intent_id, other.intent_id]
    )
    assert await log_of(store) == []  # neither the withdrawal nor the withdrawn is published


@pytest.mark.asyncio
async def test_an_awaiting_approval_is_withdrawn_and_a_late_decision_is_refused(
    store: SqlStore,
) -> None:
    asked = approval()
    await store.submit([NewIntent(asked)], T0)
    notice = withdrawal(asked)
    await store.submit([NewIntent(notice)], T0 + 1)

    await assert_withdrawn(store, asked, notice)
    assert await store.list_intents(IntentState.AWAITING_DECISION, 10) == []
    assert (await store.counts(done=False)).awaiting_decision == 0
    decision = await store.record_vote(
        asked.intent_id, approved=True, approver="ann", reason="ok", now_ms=T0 + 2
    )
    assert not decision.applied
    assert decision.state == IntentState.WITHDRAWN
    assert "withdrawn" in decision.reason and REASON in decision.reason
    assert decision.result is not None and decision.result.status == ToolResult.WITHDRAWN
    assert await state_of(store, asked) == IntentState.WITHDRAWN
    assert await log_of(store) == []


@pytest.mark.asyncio
async def test_a_quorum_keeps_its_votes_but_they_no_longer_count(store: SqlStore) -> None:
    asked = approval(quorum=2)
    await store.submit([NewIntent(asked)], T0)
    first = await store.record_vote(
        asked.intent_id, approved=True, approver="ann", reason="", now_ms=T0 + 1
    )
    assert first.applied and first.state == IntentState.AWAITING_DECISION
    await store.submit([NewIntent(withdrawal(asked))], T0 + 2)

    assert [vote.approver for vote in await store.approval_votes(asked.intent_id)] == ["ann"]
    second = await store.record_vote(
        asked.intent_id, approved=True, approver="bob", reason="", now_ms=T0 + 3
    )
    assert (second.applied, second.state) == (False, IntentState.WITHDRAWN)
    assert await log_of(store) == []


@pytest.mark.asyncio
async def test_started_or_finished_intents_are_not_withdrawn(store: SqlStore) -> None:
    running = make_intent("add", key=b"r", created_at_ms=T0)
    finished = make_intent("add", key=b"f", created_at_ms=T0)
    released = make_intent("add", key=b"s", created_at_ms=T0)
    decided = approval(key=b"d")
    await store.submit([NewIntent(i) for i in (running, finished, released, decided)], T0)
    claims = {c.intent.intent_id: c for c in (await store.claim("w", 10, T0, LEASE)).claims}
    await store.complete([ok(claims[finished.intent_id])], T0)
    await store.release([claims[released.intent_id]])  # possibly started: PENDING, attempt 1
    await store.record_vote(decided.intent_id, approved=True, approver="a", reason="", now_ms=T0)
    notices = [withdrawal(i) for i in (running, finished, released, decided)]

    answers = await store.submit([NewIntent(n) for n in notices], T0 + 1)

    assert [(a.outcome, a.state) for a in answers] == [
        (SubmitOutcome.ACCEPTED, IntentState.DONE)
    ] * 4
    assert [await state_of(store, i) for i in (running, finished, released, decided)] == [
        IntentState.RUNNING,
        IntentState.DONE,
        IntentState.PENDING,
        IntentState.DONE,
    ]
    await store.complete([ok(claims[running.intent_id], T0 + 2)], T0 + 2)
    assert await state_of(store, running) == IntentState.DONE
    assert (await store.counts()).withdrawn == 0


# -- a withdrawal arriving before its target ----------------------------------------------------


@pytest.mark.asyncio
async def test_an_intent_arriving_after_its_withdrawal_is_withdrawn_on_arrival(
    store: SqlStore,
) -> None:
    late = make_intent("add", created_at_ms=T0)
    asked = approval(key=b"k2")
    notices = [withdrawal(late), withdrawal(asked)]
    await store.submit([NewIntent(n) for n in notices], T0)

    answers = await store.submit([NewIntent(late), NewIntent(asked)], T0 + 1)

    assert [(a.outcome, a.state) for a in answers] == [
        (SubmitOutcome.ACCEPTED, IntentState.WITHDRAWN)
    ] * 2
    assert all(a.result is not None and a.result.status == ToolResult.WITHDRAWN for a in answers)
    await assert_withdrawn(store, late, notices[0])
    await assert_withdrawn(store, asked, notices[1])
    assert (await store.claim("w", 10, T0 + 2, LEASE)).claims == []
    assert (await store.counts(done=False)).pending == 0
    # A retried submit of either is a plain duplicate, still WITHDRAWN, still unpublished.
    again = await store.submit([NewIntent(late), NewIntent(asked)], T0 + 3, redeliver_results=True)
    assert [(a.outcome, a.state, a.redelivered) for a in again] == [
        (SubmitOutcome.DUPLICATE, IntentState.WITHDRAWN, False)
    ] * 2
    assert await log_of(store) == []


@pytest.mark.parametrize("withdrawal_first", [True, False])
@pytest.mark.asyncio
async def test_an_intent_and_its_withdrawal_in_one_submit(
    store: SqlStore, withdrawal_first: bool
) -> None:
    target = make_intent("add", created_at_ms=T0)
    notice = withdrawal(target)
    batch = [notice, target] if withdrawal_first else [target, notice]

    answers = await store.submit([NewIntent(i) for i in batch], T0)

    assert all(a.outcome is SubmitOutcome.ACCEPTED for a in answers)
    await assert_withdrawn(store, target, notice)
    assert (await store.claim("w", 10, T0 + 1, LEASE)).claims == []


@pytest.mark.asyncio
async def test_a_withdrawal_of_another_keys_intent_is_refused_either_way(
    store: SqlStore,
) -> None:
    known = make_intent("add", key=b"a", created_at_ms=T0)
    await store.submit([NewIntent(known)], T0)
    [refused] = await store.submit([NewIntent(withdrawal(known, key=b"b"))], T0 + 1)
    assert refused.outcome is SubmitOutcome.ACCEPTED
    assert refused.result is not None and refused.result.status == ToolResult.REJECTED
    assert refused.rejection is not None and "another entity key" in refused.rejection
    assert await state_of(store, known) == IntentState.PENDING

    later = make_intent("add", key=b"c", created_at_ms=T0)
    await store.submit([NewIntent(withdrawal(later, key=b"d"))], T0 + 2)
    [arrived] = await store.submit([NewIntent(later)], T0 + 3)
    assert arrived.state == IntentState.PENDING
    claims = (await store.claim("w", 10, T0 + 4, LEASE)).claims
    assert sorted(c.intent.intent_id for c in claims) == sorted([known.intent_id, later.intent_id])
    assert await log_of(store) == []  # a refused withdrawal is not published either


@pytest.mark.asyncio
async def test_a_compensation_of_a_withdrawn_intent_is_not_needed(store: SqlStore) -> None:
    original = make_intent("add", {"a": 1}, step=0, created_at_ms=T0)
    original.compensate_tool = "add"
    original.compensate_args_json = '{"a":-1}'
    undo = make_intent("add", '{"a":-1}', step=1, created_at_ms=T0)
    undo.compensates_intent_id = original.intent_id
    await store.submit([NewIntent(original), NewIntent(withdrawal(original)), NewIntent(undo)], T0)

    [claim] = (await store.claim("w", 10, T0 + 1, LEASE)).claims
    assert claim.intent == undo
    settled = await store.settle_compensation(claim, T0 + 1)

    assert not settled.execute
    assert settled.result is not None and settled.result.status == ToolResult.NOT_NEEDED
    assert "withdrawn" in settled.result.error_message
    [published] = await log_of(store)
    assert published.tool_result.intent_id == undo.intent_id


# -- conflicts reach the run --------------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_conflicting_submission_gets_a_published_rejection_each_time(
    store: SqlStore,
) -> None:
    first = make_intent("add", {"a": 1}, seq=3, created_at_ms=T0)
    changed = make_intent("add", {"a": "\u202eevil"}, seq=3, created_at_ms=T0)
    changed.tool_name = "ad\x00d"
    await store.submit([NewIntent(first)], T0)

    [answer] = await store.submit([NewIntent(changed)], T0 + 1)

    assert answer.outcome is SubmitOutcome.CONFLICT
    assert answer.refusal is not None and answer.refusal.status == ToolResult.REJECTED
    [envelope] = await log_of(store)
    result = envelope.tool_result
    assert envelope.entity_key == changed.entity_key and envelope.event_time_ms == T0 + 1
    assert (result.intent_id, result.entity_key, result.seq) == (
        changed.intent_id,
        changed.entity_key,
        3,
    )
    assert result.status == ToolResult.REJECTED
    assert "conflict" in result.error_message
    assert "args_json" in result.error_message and "tool_name" in result.error_message
    record = await store.get_intent(first.intent_id)
    assert record is not None and record.intent == first and record.state == IntentState.PENDING
    # A repeated identical conflicting submit is answered again (a run ignores a repeat).
    await store.submit([NewIntent(changed)], T0 + 2)
    assert [e.tool_result.intent_id for e in await log_of(store)] == [changed.intent_id] * 2
    claims = (await store.claim("w", 10, T0 + 3, LEASE)).claims
    assert [c.intent for c in claims] == [first]


# -- telemetry ids per run ----------------------------------------------------------------------


@pytest.mark.asyncio
async def test_errors_of_different_runs_are_stored_apart(store: SqlStore) -> None:
    errors = [
        AgentError(entity_key=b"k", seq=0, reason="step_failed", event_time_ms=T0, trace_id=trace)
        for trace in ("a" * 32, "b" * 32, "a" * 32)
    ]
    recorded = await store.record_errors(errors, T0)
    assert (recorded.recorded, recorded.duplicates) == (2, 1)
    stored = await store.list_errors(b"k", 10)
    assert sorted(e.error.trace_id for e in stored) == ["a" * 32, "b" * 32]


@pytest.mark.asyncio
async def test_activation_records_of_different_namespaces_are_stored_apart(
    store: SqlStore,
) -> None:
    records = [
        ActivationRecord(entity_key=b"k", seq=0, trace_sequence=1, intent_namespace=namespace)
        for namespace in ("", "v2", "v2")
    ]
    recorded = await store.record_activations(records, T0)
    assert (recorded.recorded, recorded.duplicates) == (2, 1)
    stored = await store.records_for_key(b"k", 10)
    assert sorted(r.intent_namespace for r in stored) == ["", "v2"]
    assert await store.prune_telemetry(T0 + 10, 1) == 2


# -- reads bounded by bytes ---------------------------------------------------------------------


def event(size: int) -> AgentEnvelope:
    return AgentEnvelope(
        entity_key=b"k",
        event_time_ms=T0,
        external_event=b"x" * size,
    )


@pytest.mark.asyncio
async def test_a_read_is_bounded_by_bytes_and_always_progresses(store: SqlStore) -> None:
    envelopes = [event(1_000), event(1_000), event(5_000), event(10)]
    offsets = await store.publish(envelopes, T0)
    sizes = [e.ByteSize() for e in envelopes]

    assert [r.offset for r in await store.read(1, 10, max_bytes=sizes[0] + sizes[1])] == [1, 2]
    assert [r.offset for r in await store.read(1, 10, max_bytes=sizes[0] + sizes[1] - 1)] == [1]
    assert [r.offset for r in await store.read(3, 10, max_bytes=1)] == [3]  # larger than asked
    assert [r.offset for r in await store.read(1, 2, max_bytes=1 << 30)] == [1, 2]
    assert [r.envelope for r in await store.read(1, 10, max_bytes=1 << 30)] == envelopes
    assert [r.offset for r in await store.read(1, 10)] == offsets
    assert await store.read(5, 10, max_bytes=100) == []


# -- store-level robustness ---------------------------------------------------------------------


@pytest.mark.asyncio
async def test_times_at_the_int64_limits_are_stored_and_read_back(store: SqlStore) -> None:
    def timed(step: int, created: int, expires: int, kind: ToolIntent.Kind) -> ToolIntent:
        intent = make_intent("add", key=b"t", step=step, kind=kind, created_at_ms=created)
        intent.expires_at_ms = expires
        return intent

    far = [
        timed(0, INT64_MIN, INT64_MAX, ToolIntent.APPROVAL),
        timed(1, 0, INT64_MAX, ToolIntent.APPROVAL),
        timed(2, INT64_MAX - 1, INT64_MAX, ToolIntent.APPROVAL),
        timed(3, INT64_MIN, INT64_MIN + 1, ToolIntent.APPROVAL),
        timed(4, INT64_MIN, INT64_MAX, ToolIntent.TOOL),
    ]
    fine = make_intent("add", key=b"fine", created_at_ms=T0)

    answers = await store.submit([NewIntent(i) for i in [*far, fine]], T0)

    assert [a.outcome for a in answers] == [SubmitOutcome.ACCEPTED] * 6
    for intent in far:
        record = await store.get_intent(intent.intent_id)
        assert record is not None and record.intent == intent
    expired = await store.expire_approvals(T0 + 2, 10)
    assert [i.intent_id for i in expired] == [far[3].intent_id]  # a 1 ms TTL from receipt
    assert await state_of(store, far[0]) == IntentState.AWAITING_DECISION
    claims = (await store.claim("w", 10, T0 + 2, LEASE)).claims
    assert sorted(c.intent.intent_id for c in claims) == sorted([far[4].intent_id, fine.intent_id])
    await store.overview(T0 + 2, 3_600_000)
    assert (
        len(await store.search_intents(state=None, tool_name=None, entity_key=None, limit=9)) == 6
    )


@pytest.mark.asyncio
async def test_huge_token_counts_do_not_break_the_overview(store: SqlStore) -> None:
    events = [
        TraceEvent(
            trace_id=f"{n:032x}",
            span_id=f"{n:016x}",
            entity_key=b"k",
            event_type=TraceEvent.LLM_CALL,
            wall_start_unix_nano=T0 * 1_000_000,
            attributes={
                "gen_ai.usage.input_tokens": str(INT64_MAX),
                "gen_ai.usage.output_tokens": "9" * 5000 if n else str(INT64_MAX),
            },
        )
        for n in range(3)
    ]
    assert (await store.record_traces(events, T0)).recorded == 3
    overview = await store.overview(T0 + 1, 60_000)
    assert sum(tokens for _, tokens in overview.tokens_per_minute) > 0


@pytest.mark.asyncio
async def test_nul_and_bidi_characters_in_searchable_text_are_stored(store: SqlStore) -> None:
    odd = "a\x00\u202eb"
    unknown_tool = make_intent(odd, key=b"n", created_at_ms=T0)
    asked = approval(key=b"q", quorum=2)
    await store.submit([NewIntent(unknown_tool, rejection="unknown tool"), NewIntent(asked)], T0)
    [found] = await store.search_intents(state=None, tool_name=odd, entity_key=None, limit=5)
    assert found.intent == unknown_tool
    vote = await store.record_vote(
        asked.intent_id, approved=True, approver=odd, reason=odd, now_ms=T0
    )
    assert vote.applied
    again = await store.record_vote(
        asked.intent_id, approved=True, approver=odd, reason="", now_ms=T0
    )
    assert not again.applied and "already voted" in again.reason
    assert [v.approver for v in await store.approval_votes(asked.intent_id)] == [odd]
    error = AgentError(entity_key=b"n", reason=odd, trace_id="c" * 32)
    assert (await store.record_errors([error], T0)).recorded == 1
    assert [e.error for e in await store.list_errors(b"n", 5)] == [error]
    record = ActivationRecord(entity_key=b"n", seq=1, intent_namespace=odd)
    assert (await store.record_activations([record], T0)).recorded == 1
    assert await store.records_for_key(b"n", 5) == [record]
    tool = make_intent("add", key=b"d", created_at_ms=T0)
    await store.submit([NewIntent(tool)], T0)
    [claim] = (await store.claim("w", 1, T0, LEASE)).claims
    assert await store.mark_in_doubt(claim, odd, T0, T0 + 10)
    in_doubt = await store.get_intent(tool.intent_id)
    assert in_doubt is not None and in_doubt.in_doubt_reason.startswith("a")


@pytest.mark.asyncio
async def test_a_decision_with_unreadable_edited_arguments_is_stored(store: SqlStore) -> None:
    asked = approval(key=b"e")
    await store.submit([NewIntent(asked)], T0)
    deep = "[" * 100_000 + "]" * 100_000
    decision = await store.record_vote(
        asked.intent_id, approved=True, approver="a", reason="", now_ms=T0, edited_args_json=deep
    )
    assert decision.applied and decision.result is not None
    assert deep.encode() in decision.result.payload
    [published] = await log_of(store)
    assert published.approval.edited_args_json == deep


@pytest.mark.asyncio
async def test_refused_withdrawals_with_any_target_text_are_recorded(store: SqlStore) -> None:
    garbled = withdrawal(make_intent("add", key=b"g", created_at_ms=T0))
    garbled.withdraws_intent_id = "\x00\u202e" * 1000
    stray = make_intent("add", key=b"g", step=1, created_at_ms=T0)
    stray.withdraws_intent_id = "\x00"
    fine = make_intent("add", key=b"g", step=2, created_at_ms=T0)

    answers = await store.submit(
        [
            NewIntent(garbled, rejection="withdraws_intent_id: not a UUID"),
            NewIntent(stray, rejection="only a WITHDRAWAL intent may set withdraws_intent_id"),
            NewIntent(fine),
        ],
        T0,
    )

    assert [a.state for a in answers] == [IntentState.DONE, IntentState.DONE, IntentState.PENDING]
    record = await store.get_intent(garbled.intent_id)
    assert record is not None and record.intent == garbled
    # The refused TOOL intent's REJECTED result is published; the withdrawal's is not.
    assert [e.tool_result.intent_id for e in await log_of(store)] == [stray.intent_id]


@pytest.mark.parametrize("kind", [ToolIntent.TOOL, ToolIntent.APPROVAL])
@pytest.mark.asyncio
async def test_an_intent_and_its_withdrawal_submitted_at_once_through_two_connections(
    store: SqlStore, store_url: str, kind: ToolIntent.Kind
) -> None:
    # PostgreSQL: a second store is a second connection (replicas); SQLite allows one process.
    other = await open_store(store_url) if store_url.startswith("postgres") else store
    try:
        for round_ in range(25):
            targets = [
                make_intent("add", key=f"r{round_}-{n}".encode(), kind=kind, created_at_ms=T0)
                for n in range(4)
            ]
            await asyncio.gather(
                store.submit([NewIntent(t) for t in targets], T0),
                other.submit([NewIntent(withdrawal(t)) for t in reversed(targets)], T0),
            )
            assert [await state_of(store, t) for t in targets] == [IntentState.WITHDRAWN] * 4
        assert (await store.claim("w", 200, T0 + 1, LEASE)).claims == []
        assert (await store.counts()).withdrawn == 100
    finally:
        if other is not store:
            await other.close()


@pytest.mark.asyncio
async def test_withdrawn_intents_are_forgotten_after_the_retention(store: SqlStore) -> None:
    target = make_intent("add", created_at_ms=T0)
    asked = approval(key=b"p")
    notices = [withdrawal(target), withdrawal(asked)]
    await store.submit([NewIntent(i) for i in (target, asked, *notices)], T0)
    await store.prune(T0 + 5, 10)  # within the retention
    assert await state_of(store, target) == IntentState.WITHDRAWN
    assert await store.prune(T0 + 100, 10) >= 4
    for intent in (target, asked, *notices):
        assert await store.get_intent(intent.intent_id) is None
    assert (await store.counts()).withdrawn == 0
