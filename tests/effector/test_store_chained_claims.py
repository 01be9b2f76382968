"""Recording results and claiming the next work at once, on every store backend.

``complete_and_claim`` is the worker's hot path: it records results and claims work for the
slots they free (on SQLite in the same transaction, on PostgreSQL in the next one). These
tests hold it to the same rules as a
separate ``complete`` then ``claim``: per-key order, the result published before its successor
is handed out, waiting keys first, and never a key another claim holds.
"""

from __future__ import annotations

from typing import Any

import pytest
from conftest import execute_sql
from effector_harness import make_intent

from beam_agents._protos import IntentState, ToolIntent, ToolResult
from effector.store import open_store
from effector.store.intents import Claim, ClaimRequest, Completion, NewIntent, new_result
from effector.store.sql import SqlStore

T0 = 1_700_000_000_000
LEASE = 1_000


def ok(claim: Claim) -> Completion:
    result = new_result(
        claim.intent, ToolResult.OK, completed_at_ms=T0, attempt=claim.attempt, payload=b"1"
    )
    return Completion(claim, result)


def request(owner: str, limit: int) -> ClaimRequest:
    return ClaimRequest(owner, limit, LEASE)


async def published_ids(store: SqlStore) -> list[str]:
    return [record.envelope.tool_result.intent_id for record in await store.read(1, 1_000)]


@pytest.mark.asyncio
async def test_a_keys_next_intent_is_claimed_in_the_commit_that_records_the_one_before(
    store: SqlStore,
) -> None:
    queue = [make_intent("add", key=b"k", seq=seq) for seq in range(4)]
    await store.submit([NewIntent(intent) for intent in reversed(queue)], T0)
    [claim] = (await store.claim("w", 1, T0, LEASE)).claims
    executed = [claim.intent]
    for _ in range(3):
        recorded, batch = await store.complete_and_claim([ok(claim)], T0, request("w", 1))
        assert recorded == [True]
        [claim] = batch.claims
        # Handed out only once the result before it is DONE and published.
        before = await store.get_intent(executed[-1].intent_id)
        assert before is not None and before.state == IntentState.DONE
        assert await published_ids(store) == [intent.intent_id for intent in executed]
        assert claim.attempt == 1
        executed.append(claim.intent)
    assert executed == queue
    recorded, batch = await store.complete_and_claim([ok(claim)], T0, request("w", 1))
    assert (recorded, batch.claims) == ([True], [])


@pytest.mark.asyncio
async def test_keys_that_waited_longer_are_claimed_before_a_released_key(
    store: SqlStore,
) -> None:
    first_a, second_a = (make_intent("add", key=b"a", seq=seq) for seq in range(2))
    first_b = make_intent("add", key=b"b")
    await store.submit([NewIntent(first_a), NewIntent(second_a)], T0)
    await store.submit([NewIntent(first_b)], T0 + 1)
    [claim] = (await store.claim("w", 1, T0 + 2, LEASE)).claims
    assert claim.intent == first_a
    # Key a goes to the back of the queue: b, waiting since it was submitted, comes first.
    _, batch = await store.complete_and_claim([ok(claim)], T0 + 3, request("w", 1))
    assert [c.intent for c in batch.claims] == [first_b]
    [claim] = batch.claims
    _, batch = await store.complete_and_claim([ok(claim)], T0 + 4, request("w", 1))
    assert [c.intent for c in batch.claims] == [second_a]


@pytest.mark.asyncio
async def test_a_zero_limit_records_without_claiming(store: SqlStore) -> None:
    queue = [make_intent("add", key=b"k", seq=seq) for seq in range(2)]
    await store.submit([NewIntent(intent) for intent in queue], T0)
    [claim] = (await store.claim("w", 1, T0, LEASE)).claims
    recorded, batch = await store.complete_and_claim([ok(claim)], T0, request("w", 0))
    assert (recorded, batch.claims) == ([True], [])
    [claim] = (await store.claim("w", 1, T0, LEASE)).claims
    assert claim.intent == queue[1]


@pytest.mark.asyncio
async def test_a_chained_claim_never_takes_a_key_another_claim_holds(
    store: SqlStore,
) -> None:
    mine = [make_intent("add", key=b"mine", seq=seq) for seq in range(2)]
    theirs = [make_intent("add", key=b"theirs", seq=seq) for seq in range(2)]
    await store.submit([NewIntent(intent) for intent in mine + theirs], T0)
    [held] = (await store.claim("other", 1, T0, LEASE)).claims
    [claim] = (await store.claim("w", 1, T0, LEASE)).claims
    assert {held.intent.entity_key, claim.intent.entity_key} == {b"mine", b"theirs"}
    _, batch = await store.complete_and_claim([ok(claim)], T0, request("w", 10))
    # Only the released key's next intent: the other key stays with its holder.
    assert [c.intent.entity_key for c in batch.claims] == [claim.intent.entity_key]
    record = await store.get_intent(held.intent.intent_id)
    assert record is not None and (record.state, record.attempts) == (IntentState.RUNNING, 1)


@pytest.mark.asyncio
async def test_a_result_from_a_lost_lease_claims_nothing_for_the_key_in_other_hands(
    store: SqlStore,
) -> None:
    queue = [make_intent("add", key=b"k", seq=seq) for seq in range(2)]
    await store.submit([NewIntent(intent) for intent in queue], T0)
    [stale] = (await store.claim("w1", 1, T0, LEASE)).claims
    [fresh] = (await store.claim("w2", 1, T0 + LEASE + 1, LEASE)).claims
    assert fresh.intent == stale.intent and fresh.attempt == 2
    # The stale claim's result is the first recorded (it wins), but the key is w2's: w1
    # releases nothing and claims nothing there, since the intent still runs under w2's claim.
    recorded, batch = await store.complete_and_claim([ok(stale)], T0 + LEASE + 2, request("w1", 5))
    assert recorded == [True] and batch.claims == []
    recorded, batch = await store.complete_and_claim([ok(fresh)], T0 + LEASE + 3, request("w2", 5))
    assert recorded == [False]
    assert [c.intent for c in batch.claims] == [queue[1]]


@pytest.mark.asyncio
async def test_a_claim_that_fails_after_the_results_keeps_the_results(
    store: SqlStore, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # On SQLite the claim shares the results' transaction: a failing claim must not undo them.
    queue = [make_intent("add", key=b"k", seq=seq) for seq in range(2)]
    await store.submit([NewIntent(intent) for intent in queue], T0)
    [claim] = (await store.claim("w", 1, T0, LEASE)).claims
    real = SqlStore._claim_work

    def fails_once(*args: Any, **kwargs: Any) -> object:
        monkeypatch.setattr(SqlStore, "_claim_work", real)
        real(*args, **kwargs)  # claims queue[1]: the failure must undo that claim too
        raise RuntimeError("the claim exploded")

    monkeypatch.setattr(SqlStore, "_claim_work", fails_once)
    recorded, batch = await store.complete_and_claim([ok(claim)], T0, request("w", 1))
    assert (recorded, batch.claims) == ([True], [])
    assert "the claim exploded" in caplog.text
    done = await store.get_intent(queue[0].intent_id)
    assert done is not None and done.state == IntentState.DONE
    assert await published_ids(store) == [queue[0].intent_id]
    [following] = (await store.claim("w", 1, T0, LEASE)).claims
    assert following.intent == queue[1]


@pytest.mark.asyncio
async def test_a_tool_intent_has_no_result_exactly_while_it_is_queued(store_url: str) -> None:
    # The open index holds TOOL intents without a result; every write path must keep them the
    # intents PENDING or IN_DOUBT in their rows (a queued intent with a result would be skipped).
    # RUNNING is never written: it is the key's claim, the row of a running intent unchanged.
    store = await open_store(store_url)
    try:
        tools = [make_intent("add", key=f"k{n % 3}".encode(), seq=n // 3) for n in range(9)]
        approvals = [
            make_intent(
                "", key=b"a", seq=n, kind=ToolIntent.APPROVAL, ttl_ms=ttl_ms, created_at_ms=T0
            )
            for n, ttl_ms in enumerate((0, 1, 0))  # decided, expired, awaiting
        ]
        refused = make_intent("add", key=b"r")
        await store.submit(
            [
                *(NewIntent(intent) for intent in [*tools, *approvals]),
                NewIntent(refused, rejection="no"),
            ],
            T0,
        )
        claims = (await store.claim("w", 3, T0, LEASE)).claims
        done, doubted, given_back = claims
        _, more = await store.complete_and_claim([ok(done)], T0, request("w", 1))
        assert await store.mark_in_doubt(doubted, "down", T0, T0 + LEASE)
        await store.release([given_back])
        await store.record_vote(
            approvals[0].intent_id, approved=True, approver="a", reason="", now_ms=T0
        )
        assert len(await store.expire_approvals(T0 + 10 * LEASE, 10)) == 1
        assert more.claims
    finally:
        await store.close()
    rows = await execute_sql(
        store_url,
        ["SELECT state, kind = 1 AND completed_at_ms IS NULL FROM effector_intents ORDER BY state"],
    )
    by_state = {int(state): bool(queued) for state, queued in rows}
    assert set(by_state) == {1, 3, 4, 5}  # pending, awaiting, done, in doubt
    assert all(bool(queued) == (int(state) in (1, 5)) for state, queued in rows)
