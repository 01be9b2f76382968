"""One conformance suite, run against every store backend (SQLite and PostgreSQL).

Time is passed in explicitly, so leases, expiry and retention are tested without sleeping.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random

import pytest
from effector_harness import make_intent

import effector.store.sql as store_sql
from beam_agents._protos import AgentEnvelope, IntentState, ToolIntent, ToolResult, approval_digest
from effector.store import open_store
from effector.store.intents import (
    Claim,
    Completion,
    NewIntent,
    SubmitOutcome,
    SubmitResult,
    expiry_deadline_ms,
    new_result,
)
from effector.store.sql import SqlStore

T0 = 1_700_000_000_000
LEASE = 1_000


def ok(claim: Claim, payload: bytes = b'"done"', now: int = T0) -> Completion:
    result = new_result(
        claim.intent, ToolResult.OK, completed_at_ms=now, attempt=claim.attempt, payload=payload
    )
    return Completion(claim, result)


async def submit(store: SqlStore, *intents: ToolIntent, now: int = T0) -> list[SubmitOutcome]:
    answers = await store.submit([NewIntent(intent) for intent in intents], now)
    return [answer.outcome for answer in answers]


async def envelopes(store: SqlStore, from_offset: int = 1) -> list[AgentEnvelope]:
    return [record.envelope for record in await store.read(from_offset, 10_000)]


@pytest.mark.asyncio
async def test_first_submit_is_accepted_and_recorded(store: SqlStore) -> None:
    intent = make_intent("add", {"a": 1})
    answers = await store.submit([NewIntent(intent)], T0)
    assert [(a.outcome, a.state, a.result) for a in answers] == [
        (SubmitOutcome.ACCEPTED, IntentState.PENDING, None)
    ]
    record = await store.get_intent(intent.intent_id)
    assert record is not None
    assert record.intent == intent
    assert (record.state, record.result, record.attempts) == (IntentState.PENDING, None, 0)
    assert await store.get_intent(make_intent("add", key=b"other").intent_id) is None


@pytest.mark.asyncio
async def test_same_id_same_content_is_duplicate_different_content_is_conflict(
    store: SqlStore,
) -> None:
    first = make_intent("add", {"a": 1}, created_at_ms=T0)
    changed = make_intent("add", {"a": 2}, created_at_ms=T0)
    assert changed.intent_id == first.intent_id
    assert await submit(store, first) == [SubmitOutcome.ACCEPTED]
    assert await submit(store, first, changed) == [SubmitOutcome.DUPLICATE, SubmitOutcome.CONFLICT]
    record = await store.get_intent(first.intent_id)
    assert record is not None and record.intent == first


@pytest.mark.asyncio
async def test_repeats_within_one_batch_are_deduplicated(store: SqlStore) -> None:
    first = make_intent("add", {"a": 1}, created_at_ms=T0)
    changed = make_intent("add", {"a": 2}, created_at_ms=T0)
    other = make_intent("add", {"a": 3}, key=b"other", created_at_ms=T0)
    assert await submit(store, changed, other, first, changed) == [
        SubmitOutcome.ACCEPTED,
        SubmitOutcome.ACCEPTED,
        SubmitOutcome.CONFLICT,
        SubmitOutcome.DUPLICATE,
    ]
    batch = await store.claim("w", 10, T0, LEASE)
    assert sorted(c.intent.args_json for c in batch.claims) == ['{"a":2}', '{"a":3}']


@pytest.mark.asyncio
async def test_rejection_is_recorded_done_and_published(store: SqlStore) -> None:
    intent = make_intent("nope")
    answers = await store.submit([NewIntent(intent, rejection="unknown tool 'nope'")], T0)
    assert answers[0].outcome is SubmitOutcome.ACCEPTED
    assert answers[0].state == IntentState.DONE
    assert answers[0].result is not None
    assert answers[0].result.status == ToolResult.REJECTED
    assert answers[0].result.error_message == "unknown tool 'nope'"
    [envelope] = await envelopes(store)
    assert envelope.tool_result == answers[0].result
    assert envelope.entity_key == intent.entity_key
    again = await store.submit([NewIntent(intent, rejection="unknown tool 'nope'")], T0 + 5)
    assert (again[0].outcome, again[0].result) == (SubmitOutcome.DUPLICATE, answers[0].result)
    assert (await store.claim("w", 10, T0, LEASE)).claims == []


@pytest.mark.asyncio
async def test_claims_follow_per_key_order_one_at_a_time(store: SqlStore) -> None:
    # Submitted out of order on purpose: execution order is (seq, step_index), not arrival.
    a_late = make_intent("add", key=b"a", seq=1, step=0)
    a_first = make_intent("add", key=b"a", seq=0, step=0)
    a_second = make_intent("add", key=b"a", seq=0, step=1)
    b_first = make_intent("add", key=b"b", seq=3, step=0)
    await submit(store, a_late, a_second, b_first, a_first)

    batch = await store.claim("w", 10, T0, LEASE)
    assert {c.intent.intent_id for c in batch.claims} == {a_first.intent_id, b_first.intent_id}
    assert all(c.attempt == 1 for c in batch.claims)
    assert (await store.claim("w", 10, T0, LEASE)).claims == []  # both keys are busy

    by_id = {c.intent.intent_id: c for c in batch.claims}
    assert await store.complete([ok(by_id[a_first.intent_id])], T0) == [True]
    [next_a] = (await store.claim("w", 10, T0, LEASE)).claims
    assert next_a.intent == a_second
    await store.complete([ok(next_a)], T0)
    [last_a] = (await store.claim("w", 10, T0, LEASE)).claims
    assert last_a.intent == a_late

    record = await store.get_intent(a_first.intent_id)
    assert record is not None and record.state == IntentState.DONE
    assert record.result is not None and record.result.payload == b'"done"'
    running = await store.get_intent(b_first.intent_id)
    assert running is not None and (running.state, running.attempts) == (IntentState.RUNNING, 1)


@pytest.mark.asyncio
async def test_every_key_runs_its_queue_in_order_across_many_keys(store: SqlStore) -> None:
    # Many keys with several intents each, submitted shuffled: every claim round must hand
    # out exactly the lowest (seq, step_index) left on each key, whatever the arrival order.
    queues = {
        f"key-{k}".encode(): [
            make_intent("add", key=f"key-{k}".encode(), seq=seq, step=step)
            for seq in range(3)
            for step in range(2)
        ]
        for k in range(40)
    }
    arrivals = [intent for queue in queues.values() for intent in queue]
    random.Random(7).shuffle(arrivals)
    await submit(store, *arrivals)
    for position in range(6):
        batch = await store.claim("w", 1_000, T0, LEASE)
        assert sorted(c.intent.intent_id for c in batch.claims) == sorted(
            queue[position].intent_id for queue in queues.values()
        )
        assert await store.complete([ok(claim) for claim in batch.claims], T0) == [True] * 40
    assert (await store.claim("w", 1_000, T0, LEASE)).claims == []


@pytest.mark.asyncio
async def test_claim_limit_is_respected(store: SqlStore) -> None:
    await submit(store, *(make_intent("add", key=f"k{i}".encode()) for i in range(5)))
    first = await store.claim("w", 2, T0, LEASE)
    second = await store.claim("w", 10, T0, LEASE)
    assert (len(first.claims), len(second.claims)) == (2, 3)
    assert not {c.intent.intent_id for c in first.claims} & {
        c.intent.intent_id for c in second.claims
    }


@pytest.mark.asyncio
async def test_approvals_are_never_claimed(store: SqlStore) -> None:
    approval = make_intent("", {"amount": 5}, kind=ToolIntent.APPROVAL)
    answers = await store.submit([NewIntent(approval)], T0)
    assert answers[0].state == IntentState.AWAITING_DECISION
    assert (await store.claim("w", 10, T0, LEASE)).claims == []


@pytest.mark.asyncio
async def test_completion_publishes_the_result_envelope(store: SqlStore) -> None:
    intent = make_intent("add", key=b"k", seq=4)
    await submit(store, intent)
    [claim] = (await store.claim("w", 1, T0, LEASE)).claims
    completion = ok(claim, b"42", now=T0 + 7)
    assert await store.complete([completion], T0 + 7) == [True]
    [record] = await store.read(1, 10)
    assert record.offset == 1
    assert record.envelope.entity_key == b"k"
    assert record.envelope.event_time_ms == T0 + 7
    assert record.envelope.tool_result == completion.result
    # A second completion of the same claim records nothing new.
    assert await store.complete([completion], T0 + 8) == [False]
    assert len(await envelopes(store)) == 1


@pytest.mark.asyncio
async def test_expired_lease_is_claimed_again_and_first_result_wins(store: SqlStore) -> None:
    intent = make_intent("add")
    await submit(store, intent)
    [first] = (await store.claim("w1", 1, T0, LEASE)).claims
    assert (await store.claim("w2", 1, T0 + LEASE - 1, LEASE)).claims == []
    [second] = (await store.claim("w2", 1, T0 + LEASE + 1, LEASE)).claims
    assert second.intent == intent
    assert (first.attempt, second.attempt) == (1, 2)
    assert second.token != first.token
    # The first claim finishes late, but it is the first result: it wins, exactly once.
    assert await store.complete([ok(first, b"1")], T0 + LEASE + 2) == [True]
    assert await store.complete([ok(second, b"2")], T0 + LEASE + 3) == [False]
    record = await store.get_intent(intent.intent_id)
    assert record is not None and record.result is not None
    assert (record.result.payload, record.attempts) == (b"1", 2)
    assert len(await envelopes(store)) == 1
    # The key was released by the claim that held it, so later work is claimable.
    follow_up = make_intent("add", seq=1)
    await submit(store, follow_up)
    [claim] = (await store.claim("w1", 1, T0 + LEASE + 4, LEASE)).claims
    assert claim.intent == follow_up


@pytest.mark.asyncio
async def test_renewal_keeps_a_claim(store: SqlStore) -> None:
    await submit(store, make_intent("add"))
    [claim] = (await store.claim("w", 1, T0, LEASE)).claims
    assert await store.renew([claim], T0 + 900, LEASE) == {claim.token}
    assert (await store.claim("w2", 1, T0 + 1_500, LEASE)).claims == []
    [again] = (await store.claim("w2", 1, T0 + 2_000, LEASE)).claims
    assert again.attempt == 2
    assert await store.renew([claim], T0 + 2_001, LEASE) == set()


@pytest.mark.asyncio
async def test_release_gives_the_intent_back(store: SqlStore) -> None:
    intent = make_intent("add")
    await submit(store, intent)
    [claim] = (await store.claim("w", 1, T0, LEASE)).claims
    await store.release([claim])
    record = await store.get_intent(intent.intent_id)
    assert record is not None and (record.state, record.attempts) == (IntentState.PENDING, 1)
    [again] = (await store.claim("w", 1, T0, LEASE)).claims
    assert again.attempt == 2
    # Whichever claim produced it, the first result recorded for an intent is the one kept.
    assert await store.complete([ok(claim, b"1")], T0) == [True]
    assert await store.complete([ok(again, b"2")], T0) == [False]
    record = await store.get_intent(intent.intent_id)
    assert record is not None and record.result is not None and record.result.payload == b"1"


@pytest.mark.asyncio
async def test_expired_head_is_refused_before_claiming(store: SqlStore) -> None:
    expiring = make_intent("add", key=b"k", seq=0, ttl_ms=1_000, created_at_ms=T0)
    after = make_intent("add", key=b"k", seq=1, created_at_ms=T0)
    await submit(store, expiring, after, now=T0)
    batch = await store.claim("w", 10, T0 + 1_001, LEASE)
    assert (batch.claims, batch.expired) == ([], 1)
    record = await store.get_intent(expiring.intent_id)
    assert record is not None and record.result is not None
    assert (record.state, record.result.status, record.attempts) == (
        IntentState.DONE,
        ToolResult.EXPIRED,
        0,
    )
    [envelope] = await envelopes(store)
    assert envelope.tool_result.status == ToolResult.EXPIRED
    [claim] = (await store.claim("w", 10, T0 + 1_002, LEASE)).claims
    assert claim.intent == after


@pytest.mark.asyncio
async def test_expiry_is_anchored_at_first_receipt_for_old_event_times(
    store: SqlStore,
) -> None:
    hours_ago = T0 - 5 * 3_600_000
    replayed = make_intent("add", ttl_ms=1_000, created_at_ms=hours_ago)
    assert expiry_deadline_ms(replayed, T0) == T0 + 1_000
    twin = make_intent("add", key=b"twin", ttl_ms=1_000, created_at_ms=hours_ago)
    await submit(store, replayed, twin, now=T0)
    [claim] = (await store.claim("w", 1, T0 + 1_000, LEASE)).claims
    assert claim.intent == replayed
    # A duplicate submit later does not move the anchor: past it, a head never started is
    # refused (one that was started, like ``replayed`` now, is claimed for its reconciler).
    await submit(store, twin, now=T0 + 900)
    batch = await store.claim("w", 5, T0 + 1_001, LEASE)
    assert (batch.claims, batch.expired) == ([], 1)
    assert (await store.get_intent(twin.intent_id)).result.status == ToolResult.EXPIRED  # type: ignore[union-attr]


@pytest.mark.asyncio
async def test_undecided_approval_expires_with_a_result_envelope(store: SqlStore) -> None:
    approval = make_intent("", kind=ToolIntent.APPROVAL, ttl_ms=500, created_at_ms=T0)
    await submit(store, approval)
    assert len(await store.expire_approvals(T0 + 500, 100)) == 0
    assert len(await store.expire_approvals(T0 + 501, 100)) == 1
    assert len(await store.expire_approvals(T0 + 502, 100)) == 0
    [envelope] = await envelopes(store)
    assert envelope.WhichOneof("payload") == "tool_result"
    assert envelope.tool_result.intent_id == approval.intent_id
    assert envelope.tool_result.status == ToolResult.EXPIRED
    decision = await store.record_vote(
        approval.intent_id, approved=True, approver="ann", reason="", now_ms=T0 + 600
    )
    assert (decision.applied, decision.reason) == (False, "already expired")


@pytest.mark.asyncio
async def test_a_vote_records_and_publishes_an_approval(store: SqlStore) -> None:
    approval = make_intent("", {"amount": 5}, kind=ToolIntent.APPROVAL, ttl_ms=10_000)
    tool_intent = make_intent("add", key=b"other")
    await submit(store, approval, tool_intent)
    decision = await store.record_vote(
        approval.intent_id, approved=True, approver="ann", reason="fine", now_ms=T0 + 3
    )
    assert (decision.applied, decision.state) == (True, IntentState.DONE)
    assert decision.result is not None and decision.result.status == ToolResult.OK
    # The payload records the decision, with the digest of the arguments it was made on.
    digest = approval_digest(approval.args_json)
    assert decision.result.payload == (
        b'{"approved":true,"approver":"ann","args_digest":"%s",' % digest.encode()
        + b'"decided_at_ms":1700000000003,"reason":"fine"}'
    )
    [envelope] = await envelopes(store)
    assert envelope.WhichOneof("payload") == "approval"
    assert envelope.entity_key == approval.entity_key
    assert (
        envelope.approval.intent_id,
        envelope.approval.approved,
        envelope.approval.approver,
        envelope.approval.decided_at_ms,
        envelope.approval.reason,
    ) == (approval.intent_id, True, "ann", T0 + 3, "fine")

    again = await store.record_vote(
        approval.intent_id, approved=False, approver="bob", reason="", now_ms=T0 + 4
    )
    assert (again.applied, again.reason, again.result) == (
        False,
        "already decided",
        decision.result,
    )
    not_approval = await store.record_vote(
        tool_intent.intent_id, approved=True, approver="", reason="", now_ms=T0
    )
    assert (not_approval.applied, not_approval.reason) == (False, "not an approval intent")
    unknown = await store.record_vote(
        make_intent("x", key=b"nobody").intent_id, approved=True, approver="", reason="", now_ms=T0
    )
    assert (unknown.applied, unknown.reason) == (False, "unknown intent")
    assert len(await envelopes(store)) == 1


@pytest.mark.asyncio
async def test_a_vote_after_the_deadline_expires_the_approval(store: SqlStore) -> None:
    approval = make_intent("", kind=ToolIntent.APPROVAL, ttl_ms=100, created_at_ms=T0)
    await submit(store, approval)
    decision = await store.record_vote(
        approval.intent_id, approved=True, approver="", reason="", now_ms=T0 + 101
    )
    assert decision.applied is False
    assert decision.result is not None and decision.result.status == ToolResult.EXPIRED
    [envelope] = await envelopes(store)
    assert envelope.tool_result.status == ToolResult.EXPIRED


@pytest.mark.asyncio
async def test_offsets_are_dense_and_ordered_across_every_kind_of_append(
    store: SqlStore,
) -> None:
    events = [AgentEnvelope(entity_key=b"e", external_event=bytes([i])) for i in range(3)]
    assert await store.publish(events, T0) == [1, 2, 3]
    await store.submit([NewIntent(make_intent("bad"), rejection="no")], T0)
    await submit(store, make_intent("add", key=b"x"))
    [claim] = (await store.claim("w", 1, T0, LEASE)).claims
    await store.complete([ok(claim)], T0)
    assert await store.publish(events[:1], T0) == [6]
    records = await store.read(1, 100)
    assert [r.offset for r in records] == [1, 2, 3, 4, 5, 6]
    assert [r.envelope.WhichOneof("payload") for r in records] == [
        "external_event",
        "external_event",
        "external_event",
        "tool_result",
        "tool_result",
        "external_event",
    ]
    assert [r.offset for r in await store.read(3, 2)] == [3, 4]
    assert await store.read(7, 10) == []


@pytest.mark.asyncio
async def test_counts(store: SqlStore) -> None:
    await submit(
        store,
        make_intent("add", key=b"a"),
        make_intent("add", key=b"b"),
        make_intent("", key=b"c", kind=ToolIntent.APPROVAL),
    )
    await store.submit([NewIntent(make_intent("bad", key=b"d"), rejection="no")], T0)
    await store.claim("w", 1, T0, LEASE)
    counts = await store.counts()
    assert (counts.pending, counts.running, counts.awaiting_decision, counts.done) == (1, 1, 1, 1)
    assert counts.head_offset == 1
    # Polling leaves DONE intents uncounted and every other figure as it is.
    assert await store.counts(done=False) == dataclasses.replace(counts, done=0)


@pytest.mark.asyncio
async def test_prune_forgets_only_old_done_records(store: SqlStore) -> None:
    old = make_intent("add", key=b"old")
    recent = make_intent("add", key=b"recent")
    pending = make_intent("add", key=b"pending", seq=0)
    await submit(store, old, recent)
    claims = {c.intent.intent_id: c for c in (await store.claim("w", 10, T0, LEASE)).claims}
    await store.complete([ok(claims[old.intent_id])], T0)
    await store.complete([ok(claims[recent.intent_id])], T0 + 5_000)
    await submit(store, pending, now=T0)
    removed = await store.prune(now_ms=T0 + 10_000, retention_ms=6_000)
    assert removed >= 2  # the old intent and its envelope
    assert await store.get_intent(old.intent_id) is None
    assert await store.get_intent(recent.intent_id) is not None
    assert await store.get_intent(pending.intent_id) is not None
    assert [r.envelope.tool_result.intent_id for r in await store.read(1, 10)] == [recent.intent_id]
    # Within retention a resubmit is still a duplicate; past it the id is forgotten.
    assert await submit(store, recent, now=T0 + 10_000) == [SubmitOutcome.DUPLICATE]
    assert await submit(store, old, now=T0 + 10_000) == [SubmitOutcome.ACCEPTED]


@pytest.mark.asyncio
async def test_wait_for_offset_wakes_on_append_and_times_out(store: SqlStore) -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    await store.wait_for_offset(1, 0.2)
    assert loop.time() - started >= 0.19

    async def publish_soon() -> None:
        await asyncio.sleep(0.1)
        await store.publish([AgentEnvelope(entity_key=b"k", external_event=b"x")], T0)

    publisher = asyncio.create_task(publish_soon())
    started = loop.time()
    await store.wait_for_offset(1, 10.0)
    assert loop.time() - started < 5.0
    await publisher
    assert [r.offset for r in await store.read(1, 10)] == [1]


@pytest.mark.asyncio
async def test_records_survive_reopening(store_url: str) -> None:
    intent = make_intent("add")
    first = await open_store(store_url)
    try:
        await submit(first, intent)
        await first.publish([AgentEnvelope(entity_key=b"k", external_event=b"x")], T0)
    finally:
        await first.close()
    second = await open_store(store_url)
    try:
        record = await second.get_intent(intent.intent_id)
        assert record is not None and record.intent == intent
        assert await second.publish([AgentEnvelope(entity_key=b"k", external_event=b"y")], T0) == [
            2
        ]
        assert await submit(second, intent) == [SubmitOutcome.DUPLICATE]
    finally:
        await second.close()


async def redeliver(store: SqlStore, *intents: ToolIntent, now: int) -> list[SubmitResult]:
    return await store.submit(
        [NewIntent(intent) for intent in intents], now, redeliver_results=True
    )


async def raw_log(store: SqlStore) -> list[bytes]:
    return [record.envelope.SerializeToString() for record in await store.read(1, 10_000)]


@pytest.mark.asyncio
async def test_redelivery_republishes_every_kind_of_result_byte_for_byte(
    store: SqlStore,
) -> None:
    executed = make_intent("add", key=b"executed")
    expired_tool = make_intent("add", key=b"late", ttl_ms=10, created_at_ms=T0)
    rejected = make_intent("nope", key=b"rejected")
    approved = make_intent("", {"amount": 1}, key=b"approved", kind=ToolIntent.APPROVAL)
    denied = make_intent("", {"amount": 2}, key=b"denied", kind=ToolIntent.APPROVAL)
    lapsed = make_intent("", key=b"lapsed", kind=ToolIntent.APPROVAL, ttl_ms=10, created_at_ms=T0)
    await submit(store, executed, expired_tool, approved, denied, lapsed)
    await store.submit([NewIntent(rejected, rejection="unknown tool 'nope'")], T0)
    batch = await store.claim("w", 10, T0 + 11, LEASE)
    assert ([c.intent for c in batch.claims], batch.expired) == ([executed], 1)
    await store.complete([ok(batch.claims[0], b"2", now=T0 + 12)], T0 + 12)
    await store.record_vote(
        approved.intent_id, approved=True, approver="ann", reason="ok", now_ms=T0
    )
    await store.record_vote(
        denied.intent_id, approved=False, approver="bob", reason="no", now_ms=T0
    )
    assert len(await store.expire_approvals(T0 + 20, 10)) == 1
    first = await raw_log(store)
    assert len(first) == 6
    published = {AgentEnvelope.FromString(blob).entity_key: blob for blob in first}

    everything = [executed, expired_tool, rejected, approved, denied, lapsed]
    answers = await redeliver(store, *everything, now=T0 + 1_000)
    assert [(a.outcome, a.state, a.redelivered) for a in answers] == [
        (SubmitOutcome.DUPLICATE, IntentState.DONE, True)
    ] * 6
    again = (await raw_log(store))[6:]
    # Appended in request order, each the very bytes first published for that intent.
    assert again == [published[intent.entity_key] for intent in everything]
    payloads = [AgentEnvelope.FromString(blob).WhichOneof("payload") for blob in again]
    tool_result, approval = "tool_result", "approval"
    assert payloads == [tool_result, tool_result, tool_result, approval, approval, tool_result]
    # Redelivery re-executes nothing and decides nothing again.
    assert (await store.claim("w", 10, T0 + 2_000, LEASE)).claims == []
    record = await store.get_intent(executed.intent_id)
    assert record is not None and record.attempts == 1
    counts = await store.counts()
    assert (counts.done, counts.head_offset) == (6, 12)


@pytest.mark.asyncio
async def test_redelivery_skips_work_not_yet_done_conflicts_and_plain_duplicates(
    store: SqlStore,
) -> None:
    queued = make_intent("add", key=b"a", seq=1)
    running = make_intent("add", key=b"a", seq=0)
    awaiting = make_intent("", key=b"b", kind=ToolIntent.APPROVAL)
    finished = make_intent("add", {"a": 1}, key=b"c", created_at_ms=T0)
    await submit(store, queued, running, awaiting, finished)
    claims = {c.intent.intent_id: c for c in (await store.claim("w", 10, T0, LEASE)).claims}
    assert set(claims) == {running.intent_id, finished.intent_id}
    await store.complete([ok(claims[finished.intent_id])], T0)
    assert len(await raw_log(store)) == 1

    answers = await redeliver(store, queued, running, awaiting, now=T0 + 1)
    assert [(a.outcome, a.state, a.redelivered) for a in answers] == [
        (SubmitOutcome.DUPLICATE, IntentState.PENDING, False),
        (SubmitOutcome.DUPLICATE, IntentState.RUNNING, False),
        (SubmitOutcome.DUPLICATE, IntentState.AWAITING_DECISION, False),
    ]
    conflicting = make_intent("add", {"a": 2}, key=b"c", created_at_ms=T0)
    [conflict] = await redeliver(store, conflicting, now=T0 + 2)
    assert (conflict.outcome, conflict.redelivered) == (SubmitOutcome.CONFLICT, False)
    [plain] = await store.submit([NewIntent(finished)], T0 + 3)
    assert (plain.outcome, plain.state, plain.redelivered) == (
        SubmitOutcome.DUPLICATE,
        IntentState.DONE,
        False,
    )
    # Only the conflict's refusal was appended, never the kept intent's result again.
    assert len(await raw_log(store)) == 2
    # Once the running intent finishes, its result is published once, by the completion.
    await store.complete([ok(claims[running.intent_id])], T0 + 4)
    log = await store.read(1, 10)
    assert [(r.envelope.tool_result.intent_id, r.envelope.tool_result.status) for r in log] == [
        (finished.intent_id, ToolResult.OK),
        (conflicting.intent_id, ToolResult.REJECTED),
        (running.intent_id, ToolResult.OK),
    ]


@pytest.mark.asyncio
async def test_redelivered_results_are_not_executed_again_by_a_fresh_claim(
    store: SqlStore,
) -> None:
    intent = make_intent("add", key=b"k")
    await submit(store, intent)
    [claim] = (await store.claim("w", 1, T0, LEASE)).claims
    await store.complete([ok(claim)], T0)
    for round_ in range(3):
        await redeliver(store, intent, now=T0 + round_)
    assert (await store.claim("w", 10, T0 + LEASE * 10, LEASE)).claims == []
    log = await raw_log(store)
    assert len(log) == 4 and len(set(log)) == 1
    record = await store.get_intent(intent.intent_id)
    assert record is not None and (record.state, record.attempts) == (IntentState.DONE, 1)


@pytest.mark.asyncio
async def test_list_intents_by_state_oldest_first_and_bounded(store: SqlStore) -> None:
    approvals = [
        make_intent("", {"n": n}, key=f"ap{n}".encode(), kind=ToolIntent.APPROVAL) for n in range(4)
    ]
    # Received out of key order: the listing follows receipt time, not ids or keys.
    for offset, intent in enumerate(reversed(approvals)):
        await submit(store, intent, now=T0 + offset)
    tool_a = make_intent("add", key=b"t1")
    tool_b = make_intent("add", key=b"t2")
    await submit(store, tool_a, tool_b, now=T0 + 10)
    await store.record_vote(
        approvals[0].intent_id, approved=True, approver="", reason="", now_ms=T0
    )

    awaiting = await store.list_intents(IntentState.AWAITING_DECISION, 100)
    assert awaiting == [approvals[3], approvals[2], approvals[1]]
    assert await store.list_intents(IntentState.AWAITING_DECISION, 2) == awaiting[:2]
    assert await store.list_intents(IntentState.DONE, 100) == [approvals[0]]
    pending = await store.list_intents(IntentState.PENDING, 100)
    # Same receipt time: ties are broken by intent id.
    assert pending == sorted([tool_a, tool_b], key=lambda i: i.intent_id)
    [claim] = (await store.claim("w", 1, T0 + 20, LEASE)).claims
    assert await store.list_intents(IntentState.RUNNING, 100) == [claim.intent]
    assert await store.list_intents(IntentState.INTENT_STATE_UNSPECIFIED, 100) == []


@pytest.mark.asyncio
async def test_list_failed_pages_through_done_intents_oldest_first(
    store: SqlStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_sql, "_FAILED_SCAN_BATCH", 2)  # several pages, failures on each
    decided = [
        make_intent("", {"n": n}, key=f"ok{n}".encode(), kind=ToolIntent.APPROVAL) for n in range(3)
    ]
    rejected = [make_intent("nope", {"n": n}, key=f"r{n}".encode()) for n in range(2)]
    erroring = make_intent("add", key=b"e")
    assert await store.list_failed(100) == []
    await submit(store, decided[0], now=T0)
    await store.submit([NewIntent(rejected[0], rejection="unknown tool 'nope'")], T0 + 1)
    await submit(store, decided[1], decided[2], now=T0 + 2)
    await store.submit([NewIntent(rejected[1], rejection="unknown tool 'nope'")], T0 + 3)
    await submit(store, erroring, now=T0 + 4)
    for intent in decided:  # a denial is an OK result: the decision was recorded
        await store.record_vote(
            intent.intent_id, approved=False, approver="", reason="", now_ms=T0 + 5
        )
    [claim] = (await store.claim("w", 1, T0 + 6, LEASE)).claims
    error = new_result(
        claim.intent, ToolResult.ERROR, completed_at_ms=T0 + 7, attempt=1, error_message="boom"
    )
    await store.complete([Completion(claim, error)], T0 + 7)

    failed = await store.list_failed(100)
    assert [(intent.intent_id, result.status) for intent, result in failed] == [
        (rejected[0].intent_id, ToolResult.REJECTED),
        (rejected[1].intent_id, ToolResult.REJECTED),
        (erroring.intent_id, ToolResult.ERROR),
    ]
    assert [intent for intent, _ in failed] == [*rejected, erroring]
    assert failed[2][1].error_message == "boom"
    assert await store.list_failed(2) == failed[:2]


@pytest.mark.asyncio
async def test_concurrent_submits_answer_as_if_recorded_one_after_another(
    store: SqlStore,
) -> None:
    finished = make_intent("add", {"a": 1}, key=b"done", created_at_ms=T0)
    await submit(store, finished)
    [claim] = (await store.claim("w", 10, T0, LEASE)).claims
    await store.complete([ok(claim)], T0)
    fresh = make_intent("add", {"a": 1}, key=b"x", created_at_ms=T0)
    changed = make_intent("add", {"a": 2}, key=b"x", created_at_ms=T0)
    other = make_intent("add", key=b"y", created_at_ms=T0)
    refused = make_intent("nope", key=b"z", created_at_ms=T0)

    first, second, third, fourth = await asyncio.gather(
        store.submit([NewIntent(fresh), NewIntent(refused, rejection="unknown tool")], T0 + 1),
        store.submit([NewIntent(fresh), NewIntent(other)], T0 + 2),
        store.submit([NewIntent(finished)], T0 + 3, redeliver_results=True),
        store.submit([NewIntent(changed), NewIntent(finished)], T0 + 4),
    )

    assert [a.outcome for a in first] == [SubmitOutcome.ACCEPTED, SubmitOutcome.ACCEPTED]
    assert [a.outcome for a in second] == [SubmitOutcome.DUPLICATE, SubmitOutcome.ACCEPTED]
    assert [(a.outcome, a.redelivered) for a in third] == [(SubmitOutcome.DUPLICATE, True)]
    assert [(a.outcome, a.redelivered) for a in fourth] == [
        (SubmitOutcome.CONFLICT, False),
        (SubmitOutcome.DUPLICATE, False),
    ]
    # The rejection (first submit) is published before the redelivery (third) and the
    # conflict's refusal (fourth), as submitted.
    log = [envelope.tool_result for envelope in await envelopes(store)]
    assert [(r.intent_id, r.status) for r in log] == [
        (finished.intent_id, ToolResult.OK),
        (refused.intent_id, ToolResult.REJECTED),
        (finished.intent_id, ToolResult.OK),
        (changed.intent_id, ToolResult.REJECTED),
    ]
    batch = await store.claim("w", 10, T0 + 5, LEASE)
    assert sorted(c.intent.args_json for c in batch.claims) == ['{"a":1}', "{}"]
