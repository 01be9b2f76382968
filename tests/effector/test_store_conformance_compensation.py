"""The store conformance suite, continued: compensation ordering and NOT_NEEDED.

Runs on both stores (SQLite and PostgreSQL). A compensating intent sits on its original's key
at a later step, so per-key order claims it only once the original is DONE (an original
RUNNING or IN_DOUBT holds it back). When it is claimed, ``store.settle_compensation``
applies ``effector.compensation.verdict`` to the original's record: it ran (OK, ERROR) →
execute (the first compensation only); it never ran (REJECTED, EXPIRED) → a NOT_NEEDED
result, recorded and published like any other; unknown (never submitted, pruned), not the
declared compensation, or compensated already → REJECTED. An original that arrives after its
compensation settled it is refused (at Submit, or by the settle if it is already queued).
"""

from __future__ import annotations

import pytest
from effector_harness import make_intent

from beam_agents._protos import IntentState, ToolIntent, ToolResult
from effector.store.intents import Claim, Completion, NewIntent, SubmitOutcome, new_result
from effector.store.sql import SqlStore

T0 = 1_700_000_000_000
LEASE = 1_000
UNDO_ARGS = '{"a":-1}'


def linked(step: int = 0, *, key: bytes = b"k", ttl_ms: int = 0) -> ToolIntent:
    """An ``add`` intent staged with ``compensate_with=("add", {"a": -1})``."""
    intent = make_intent("add", {"a": 1}, key=key, step=step, ttl_ms=ttl_ms, created_at_ms=T0)
    intent.compensate_tool = "add"
    intent.compensate_args_json = UNDO_ARGS
    return intent


def compensation_of(original: ToolIntent, step: int) -> ToolIntent:
    """The compensating intent ``ctx.compensate`` stages for ``original`` at ``step``."""
    intent = make_intent(
        original.compensate_tool,
        original.compensate_args_json,
        key=original.entity_key,
        seq=original.seq,
        step=step,
        created_at_ms=T0,
    )
    intent.compensates_intent_id = original.intent_id
    return intent


def completion(claim: Claim, status: ToolResult.Status, now: int = T0) -> Completion:
    payload = b"1" if status == ToolResult.OK else b""
    result = new_result(
        claim.intent, status, completed_at_ms=now, attempt=claim.attempt, payload=payload
    )
    return Completion(claim, result)


async def judge(store: SqlStore, claim: Claim, now: int) -> ToolResult | None:
    """Settle a claimed compensation (``None``: execute it); a verdict is recorded by it."""
    settled = await store.settle_compensation(claim, now)
    assert settled.execute == (settled.result is None)
    assert settled.recorded == (settled.result is not None)
    return settled.result


async def claimed(store: SqlStore, now: int) -> list[ToolIntent]:
    return [claim.intent for claim in (await store.claim("w", 10, now, LEASE)).claims]


@pytest.mark.asyncio
async def test_a_compensation_runs_only_after_its_original_is_done(store: SqlStore) -> None:
    original = linked(0)
    undo = compensation_of(original, 1)
    # Submitted together, the compensation first: per-key order still claims the original first.
    await store.submit([NewIntent(undo), NewIntent(original)], T0)
    [claim] = (await store.claim("w", 10, T0, LEASE)).claims
    assert claim.intent == original
    assert await claimed(store, T0 + 1) == []  # the key is held while the original runs
    assert await store.complete([completion(claim, ToolResult.OK)], T0 + 2) == [True]
    [undo_claim] = (await store.claim("w", 10, T0 + 3, LEASE)).claims
    assert undo_claim.intent == undo
    assert await judge(store, undo_claim, T0 + 3) is None  # the original ran: execute


@pytest.mark.asyncio
async def test_an_original_in_doubt_holds_its_compensation_back(store: SqlStore) -> None:
    original = linked(0)
    undo = compensation_of(original, 1)
    await store.submit([NewIntent(original), NewIntent(undo)], T0)
    [claim] = (await store.claim("w", 10, T0, LEASE)).claims
    retry_at = T0 + 10 * LEASE
    assert await store.mark_in_doubt(claim, "ConnectionError: down", T0 + 1, retry_at)
    assert await claimed(store, T0 + 2 * LEASE) == []  # held past the old lease
    [again] = (await store.claim("w", 10, retry_at + 1, LEASE)).claims
    assert again.intent == original  # the original again, never its compensation
    assert await store.complete([completion(again, ToolResult.ERROR)], retry_at + 2) == [True]
    [undo_claim] = (await store.claim("w", 10, retry_at + 3, LEASE)).claims
    assert undo_claim.intent == undo
    assert await judge(store, undo_claim, retry_at + 3) is None  # ERROR ran: compensate too


@pytest.mark.asyncio
@pytest.mark.parametrize("never_ran", ["rejected", "expired"])
async def test_a_compensation_of_an_original_that_never_ran_is_not_needed(
    store: SqlStore, never_ran: str
) -> None:
    original = linked(0, ttl_ms=LEASE)
    undo = compensation_of(original, 1)
    rejection = "invalid arguments" if never_ran == "rejected" else None
    await store.submit([NewIntent(original, rejection), NewIntent(undo)], T0)
    late = T0 + 5 * LEASE  # past the original's deadline: refused as EXPIRED, not claimed
    batch = await store.claim("w", 10, late, LEASE)
    assert batch.expired == (1 if never_ran == "expired" else 0)
    [undo_claim] = (
        batch.claims if batch.claims else (await store.claim("w", 10, late, LEASE)).claims
    )
    assert undo_claim.intent == undo
    result = await judge(store, undo_claim, late + 1)
    assert result is not None and result.status == ToolResult.NOT_NEEDED
    assert result.attempt == undo_claim.attempt
    assert f"compensated intent {original.intent_id} never ran" in result.error_message

    record = await store.get_intent(undo.intent_id)
    assert record is not None and (record.state, record.result) == (IntentState.DONE, result)
    published = [r.envelope.tool_result for r in await store.read(1, 100)]
    assert published[-1] == result  # published like any result, after the original's
    assert [r.intent_id for r in published] == [original.intent_id, undo.intent_id]
    # NOT_NEEDED is not a failure; the original's REJECTED or EXPIRED is.
    assert [intent.intent_id for intent, _ in await store.list_failed(10)] == [original.intent_id]
    # A redelivery republishes it, and it is never claimed again.
    again = await store.submit([NewIntent(undo)], late + 2, redeliver_results=True)
    assert again[0].redelivered and again[0].result == result
    assert (await store.read(1, 100))[-1].envelope.tool_result == result
    assert await claimed(store, late + 3) == []


@pytest.mark.asyncio
async def test_a_compensation_of_a_not_needed_compensation_is_not_needed(
    store: SqlStore,
) -> None:
    original = linked(0)
    undo = compensation_of(original, 1)
    await store.submit([NewIntent(original, "refused"), NewIntent(undo)], T0)
    [claim] = (await store.claim("w", 10, T0, LEASE)).claims
    result = await judge(store, claim, T0)
    assert result is not None
    # A second compensating intent of the same original (the route after the agent) is also
    # NOT_NEEDED: the original's record decides, not what happened to other compensations.
    second = compensation_of(original, 2)
    await store.submit([NewIntent(second)], T0 + 1)
    [claim] = (await store.claim("w", 10, T0 + 1, LEASE)).claims
    verdict_ = await judge(store, claim, T0 + 1)
    assert verdict_ is not None and verdict_.status == ToolResult.NOT_NEEDED


@pytest.mark.asyncio
async def test_a_compensation_of_an_unknown_or_pruned_original_is_rejected(
    store: SqlStore,
) -> None:
    never_submitted = compensation_of(linked(0, key=b"ghost"), 1)
    original = linked(0)
    undo = compensation_of(original, 1)
    await store.submit([NewIntent(never_submitted), NewIntent(original)], T0)
    claims = (await store.claim("w", 10, T0, LEASE)).claims
    [ghost] = [c for c in claims if c.intent == never_submitted]
    result = await judge(store, ghost, T0)
    assert result is not None and result.status == ToolResult.REJECTED
    assert "is unknown to this effector" in result.error_message

    [claim] = [c for c in claims if c.intent == original]
    await store.complete([completion(claim, ToolResult.OK)], T0)
    assert await store.prune(T0 + 2 * LEASE, LEASE) > 0  # the original's record is gone
    await store.submit([NewIntent(undo)], T0 + 2 * LEASE)
    [late] = (await store.claim("w", 10, T0 + 2 * LEASE, LEASE)).claims
    result = await judge(store, late, T0 + 2 * LEASE)
    assert result is not None and result.status == ToolResult.REJECTED


@pytest.mark.asyncio
async def test_a_compensation_that_is_not_the_declared_one_is_rejected(
    store: SqlStore,
) -> None:
    original = linked(0)
    other_args = compensation_of(original, 1)
    other_args.args_json = '{"a":-2}'
    unlinked = make_intent("add", {"a": 1}, key=b"plain", created_at_ms=T0)
    of_unlinked = compensation_of(unlinked, 1)
    of_unlinked.tool_name, of_unlinked.args_json = "add", UNDO_ARGS
    other_key = compensation_of(original, 2)
    other_key.entity_key = b"elsewhere"
    await store.submit([NewIntent(i) for i in (original, unlinked)], T0)
    for claim in (await store.claim("w", 10, T0, LEASE)).claims:
        await store.complete([completion(claim, ToolResult.OK)], T0)
    await store.submit([NewIntent(i) for i in (other_args, of_unlinked, other_key)], T0 + 1)
    reasons = {}
    for claim in (await store.claim("w", 10, T0 + 1, LEASE)).claims:
        result = await judge(store, claim, T0 + 1)
        assert result is not None and result.status == ToolResult.REJECTED
        reasons[claim.intent.entity_key] = result.error_message
    assert "does not match the one intent" in reasons[b"k"]
    assert "declared no compensation" in reasons[b"plain"]
    assert "another entity key" in reasons[b"elsewhere"]


async def log_results(store: SqlStore) -> list[tuple[str, int]]:
    return [
        (r.envelope.tool_result.intent_id, r.envelope.tool_result.status)
        for r in await store.read(1, 100)
    ]


@pytest.mark.asyncio
async def test_an_original_arriving_after_its_compensation_is_refused_at_submit(
    store: SqlStore,
) -> None:
    original = linked(0)
    undo = compensation_of(original, 1)
    await store.submit([NewIntent(undo)], T0)
    [claim] = (await store.claim("w", 10, T0, LEASE)).claims
    result = await judge(store, claim, T0)
    assert result is not None and result.status == ToolResult.REJECTED
    assert "is unknown" in result.error_message and "refused if it arrives" in result.error_message
    # The original arrives after (a slow retry, a re-submitted dead letter): refused, published.
    [answer] = await store.submit([NewIntent(original)], T0 + 1)
    reason = f"compensated by {undo.intent_id} before it arrived; it will not run"
    assert (answer.outcome, answer.state, answer.rejection) == (
        SubmitOutcome.ACCEPTED,
        IntentState.DONE,
        reason,
    )
    assert answer.result is not None and answer.result.status == ToolResult.REJECTED
    assert answer.result.error_message == reason
    assert await log_results(store) == [
        (undo.intent_id, ToolResult.REJECTED),
        (original.intent_id, ToolResult.REJECTED),
    ]
    assert await claimed(store, T0 + 2) == []  # never executed
    record = await store.get_intent(original.intent_id)
    assert record is not None and record.attempts == 0 and record.result == answer.result
    [again] = await store.submit([NewIntent(original)], T0 + 3)
    assert again.outcome is SubmitOutcome.DUPLICATE and again.rejection is None


@pytest.mark.asyncio
async def test_an_original_queued_after_its_compensation_was_claimed_is_refused(
    store: SqlStore,
) -> None:
    original = linked(0)
    undo = compensation_of(original, 1)
    await store.submit([NewIntent(undo)], T0)
    [claim] = (await store.claim("w", 10, T0, LEASE)).claims
    await store.submit([NewIntent(original)], T0 + 1)  # queued ahead of the claimed undo
    settled = await store.settle_compensation(claim, T0 + 2)
    assert settled.refused_original == original and not settled.execute
    assert settled.result is not None and settled.result.status == ToolResult.NOT_NEEDED
    record = await store.get_intent(original.intent_id)
    assert record is not None and record.result is not None and record.attempts == 0
    assert record.result.status == ToolResult.REJECTED
    assert f"compensated by {undo.intent_id}" in record.result.error_message
    assert await log_results(store) == [
        (original.intent_id, ToolResult.REJECTED),
        (undo.intent_id, ToolResult.NOT_NEEDED),
    ]
    assert await claimed(store, T0 + 3) == []
    assert (await store.counts()).pending == 0


@pytest.mark.asyncio
async def test_only_the_first_compensation_of_an_effect_executes(store: SqlStore) -> None:
    original = linked(0)
    first, second = compensation_of(original, 1), compensation_of(original, 2)
    await store.submit([NewIntent(i) for i in (original, first, second)], T0)
    [claim] = (await store.claim("w", 10, T0, LEASE)).claims
    await store.complete([completion(claim, ToolResult.OK)], T0)
    [claim] = (await store.claim("w", 10, T0 + 1, LEASE)).claims
    assert claim.intent == first and await judge(store, claim, T0 + 1) is None
    await store.complete([completion(claim, ToolResult.OK, T0 + 2)], T0 + 2)
    [claim] = (await store.claim("w", 10, T0 + 3, LEASE)).claims
    assert claim.intent == second
    result = await judge(store, claim, T0 + 3)
    assert result is not None and result.status == ToolResult.REJECTED
    assert result.error_message == (
        f"compensated intent {original.intent_id} is already compensated by {first.intent_id}"
    )
    record = await store.get_intent(second.intent_id)
    assert record is not None and record.result == result
    assert await claimed(store, T0 + 4) == []


@pytest.mark.asyncio
async def test_the_same_compensation_claimed_again_after_a_lost_lease_still_runs(
    store: SqlStore,
) -> None:
    original = linked(0)
    undo = compensation_of(original, 1)
    await store.submit([NewIntent(original), NewIntent(undo)], T0)
    [claim] = (await store.claim("w", 10, T0, LEASE)).claims
    await store.complete([completion(claim, ToolResult.OK)], T0)
    [lost] = (await store.claim("w", 10, T0 + 1, LEASE)).claims
    assert await judge(store, lost, T0 + 1) is None  # executes; the worker then crashes
    [again] = (await store.claim("w2", 10, T0 + 2 * LEASE, LEASE)).claims
    assert again.intent == undo and again.attempt == 2 and again.possibly_started
    assert await judge(store, again, T0 + 2 * LEASE) is None  # the same undo: reconcile, run
    # The claim that lost its key decides nothing more; the first result recorded wins.
    late = await store.settle_compensation(lost, T0 + 2 * LEASE + 1)
    assert (late.execute, late.result, late.recorded) == (False, None, False)
    done = completion(again, ToolResult.OK, T0 + 2 * LEASE + 2)
    assert await store.complete([done], T0 + 2 * LEASE + 2) == [True]
    assert await store.complete([completion(lost, ToolResult.OK)], T0 + 2 * LEASE + 3) == [False]
