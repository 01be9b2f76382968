"""The store conformance suite, continued: reconcile before re-executing, and IN_DOUBT.

Runs on both stores (SQLite and PostgreSQL), like ``test_store_conformance.py``: a claim
that is not an intent's first says its execution may have started; an intent left IN_DOUBT
holds its key until its retry time, is claimed again then (whatever its deadline), and is
visible in the reads.
"""

from __future__ import annotations

import dataclasses

import pytest
from effector_harness import make_intent

from beam_agents._protos import IntentState, ToolResult
from effector.store.intents import Claim, Completion, NewIntent, new_result
from effector.store.sql import SqlStore

T0 = 1_700_000_000_000
LEASE = 1_000


def ok(claim: Claim, payload: bytes = b'"done"', now: int = T0) -> Completion:
    result = new_result(
        claim.intent, ToolResult.OK, completed_at_ms=now, attempt=claim.attempt, payload=payload
    )
    return Completion(claim, result)


async def submit(store: SqlStore, *intents: object, now: int = T0) -> None:
    await store.submit([NewIntent(intent) for intent in intents], now)  # type: ignore[arg-type]


async def state_of(store: SqlStore, intent_id: str) -> tuple[IntentState, int]:
    record = await store.get_intent(intent_id)
    assert record is not None
    return record.state, record.attempts


@pytest.mark.asyncio
async def test_only_a_claim_after_the_first_may_find_its_effect_made(store: SqlStore) -> None:
    intent = make_intent("add", ttl_ms=60_000, created_at_ms=T0)
    await submit(store, intent)
    [first] = (await store.claim("w1", 1, T0, LEASE)).claims
    assert (first.attempt, first.possibly_started, first.reconcile_failures) == (1, False, 0)
    assert first.deadline_ms == T0 + 60_000
    [second] = (await store.claim("w2", 1, T0 + LEASE + 1, LEASE)).claims  # the lease ran out
    assert (second.attempt, second.possibly_started) == (2, True)
    await store.release([second])  # a drain gives it back: it may have started too
    [third] = (await store.claim("w3", 1, T0 + LEASE + 2, LEASE)).claims
    assert (third.attempt, third.possibly_started) == (3, True)


@pytest.mark.asyncio
async def test_an_intent_in_doubt_holds_its_key_until_its_retry_and_is_visible(
    store: SqlStore,
) -> None:
    doubtful = make_intent("add", key=b"k", seq=0)
    behind = make_intent("add", key=b"k", seq=1)
    other = make_intent("add", key=b"other")
    await submit(store, doubtful, behind, other)
    await store.claim("crashed", 2, T0, LEASE)
    claims = (await store.claim("w", 2, T0 + LEASE + 1, LEASE)).claims
    [claim] = [c for c in claims if c.intent == doubtful]
    await store.complete([ok(c) for c in claims if c.intent == other], T0 + LEASE + 1)
    retry_at = T0 + 10 * LEASE
    assert await store.mark_in_doubt(claim, "ConnectionError: down", T0 + LEASE + 2, retry_at)

    record = await store.get_intent(doubtful.intent_id)
    assert record is not None
    assert (record.state, record.attempts, record.result) == (IntentState.IN_DOUBT, 2, None)
    assert (record.in_doubt_reason, record.retry_at_ms) == ("ConnectionError: down", retry_at)
    counts = await store.counts()
    assert (counts.in_doubt, counts.pending, counts.done) == (1, 1, 1)
    # The gauges' polled counts see it too (only the DONE one is left uncounted).
    assert await store.counts(done=False) == dataclasses.replace(counts, done=0)
    assert await store.list_intents(IntentState.IN_DOUBT, 10) == [doubtful]
    found = await store.search_intents(state=None, tool_name="add", entity_key=None, limit=10)
    assert doubtful.intent_id in {r.intent.intent_id for r in found}

    # The key stays held: nothing behind the intent runs, however long the old lease is gone.
    assert (await store.claim("w", 10, retry_at - 1, LEASE)).claims == []
    # At its retry time it is claimed again, not the intent behind it.
    [again] = (await store.claim("w", 10, retry_at + 1, LEASE)).claims
    assert again.intent == doubtful
    assert (again.attempt, again.reconcile_failures, again.possibly_started) == (3, 1, True)
    assert await state_of(store, doubtful.intent_id) == (IntentState.RUNNING, 3)
    # Failing again counts in a row; answering settles it and frees the key.
    assert await store.mark_in_doubt(again, "again", retry_at + 2, retry_at + 100)
    [third] = (await store.claim("w", 10, retry_at + 101, LEASE)).claims
    assert third.reconcile_failures == 2
    assert await store.complete([ok(third, b'"found"', retry_at + 102)], retry_at + 102) == [True]
    record = await store.get_intent(doubtful.intent_id)
    assert record is not None and record.result is not None
    assert (record.state, record.result.payload) == (IntentState.DONE, b'"found"')
    assert (await store.counts()).in_doubt == 0
    [next_claim] = (await store.claim("w", 10, retry_at + 103, LEASE)).claims
    assert next_claim.intent == behind


@pytest.mark.asyncio
async def test_an_intent_in_doubt_is_claimed_again_past_its_deadline_not_expired(
    store: SqlStore,
) -> None:
    intent = make_intent("add", ttl_ms=5 * LEASE, created_at_ms=T0)
    await submit(store, intent)
    [claim] = (await store.claim("w", 1, T0, LEASE)).claims
    assert await store.mark_in_doubt(claim, "timeout", T0 + 1, T0 + 10 * LEASE)
    batch = await store.claim("w", 1, T0 + 10 * LEASE + 1, LEASE)
    assert batch.expired == 0
    [again] = batch.claims
    assert again.intent == intent and again.deadline_ms == T0 + 5 * LEASE
    # A started head past its deadline is claimed too (its effect may have happened: the
    # worker asks the reconciler, or records EXPIRED); one never started is refused as before.
    late = make_intent("add", key=b"late", ttl_ms=LEASE, created_at_ms=T0)
    never = make_intent("add", key=b"never", ttl_ms=LEASE, created_at_ms=T0)
    await submit(store, late)
    await store.claim("crashed", 1, T0, LEASE)
    await submit(store, never)
    batch = await store.claim("w", 5, T0 + 3 * LEASE, LEASE)
    assert batch.expired == 1
    [started] = batch.claims
    assert started.intent == late and started.possibly_started


@pytest.mark.asyncio
async def test_marking_in_doubt_needs_the_claim_to_hold_the_key(store: SqlStore) -> None:
    intent = make_intent("add")
    await submit(store, intent)
    [lost] = (await store.claim("w1", 1, T0, LEASE)).claims
    [taken] = (await store.claim("w2", 1, T0 + LEASE + 1, LEASE)).claims
    assert not await store.mark_in_doubt(lost, "late", T0 + LEASE + 2, T0 + 99 * LEASE)
    assert await state_of(store, intent.intent_id) == (IntentState.RUNNING, 2)
    assert await store.complete([ok(taken)], T0 + LEASE + 3) == [True]
    assert not await store.mark_in_doubt(taken, "done already", T0 + LEASE + 4, T0 + 99 * LEASE)
    assert await state_of(store, intent.intent_id) == (IntentState.DONE, 2)
