"""Quorum votes on both stores (SQLite and PostgreSQL), racing as replicas and clients do."""

from __future__ import annotations

import asyncio

import pytest
from effector_harness import make_intent

from beam_agents._protos import IntentState, ToolIntent
from effector.store.intents import NewIntent
from effector.store.sql import SqlStore

T0 = 1_700_000_000_000


async def _asked(store: SqlStore, key: bytes, quorum: int) -> ToolIntent:
    intent = make_intent("", {"pay": key.decode()}, key=key, kind=ToolIntent.APPROVAL)
    intent.required_approvals = quorum
    await store.submit([NewIntent(intent)], T0)
    return intent


async def _vote(store: SqlStore, intent: ToolIntent, approver: str, approved: bool = True):  # type: ignore[no-untyped-def]
    return await store.record_vote(
        intent.intent_id, approved=approved, approver=approver, reason="", now_ms=T0 + 1
    )


async def _approvals(store: SqlStore, intent_id: str) -> list[object]:
    return [
        record.envelope.approval
        for record in await store.read(1, 1_000)
        if record.envelope.HasField("approval") and record.envelope.approval.intent_id == intent_id
    ]


@pytest.mark.asyncio
async def test_a_racing_quorum_counts_each_approver_once_and_decides_once(
    store: SqlStore,
) -> None:
    asked = await _asked(store, b"q", 2)
    same = await asyncio.gather(*(_vote(store, asked, "ann") for _ in range(4)))
    assert sum(decision.applied for decision in same) == 1  # ann's vote counts once
    assert [vote.approver for vote in await store.approval_votes(asked.intent_id)] == ["ann"]
    assert (await store.get_intent(asked.intent_id)).state == IntentState.AWAITING_DECISION  # type: ignore[union-attr]

    racing = await asyncio.gather(_vote(store, asked, "bob"), _vote(store, asked, "cy"))
    assert sorted(decision.applied for decision in racing) == [False, True]
    assert {decision.reason for decision in racing if not decision.applied} == {"already decided"}
    [published] = await _approvals(store, asked.intent_id)
    assert published.approved and len(set(published.approvers)) == 2  # type: ignore[attr-defined]
    assert "ann" in published.approvers  # type: ignore[attr-defined]


@pytest.mark.asyncio
async def test_any_deny_decides_a_quorum_denied(store: SqlStore) -> None:
    asked = await _asked(store, b"d", 3)
    assert (await _vote(store, asked, "ann")).applied
    denied = await _vote(store, asked, "bob", approved=False)
    assert denied.applied and denied.state == IntentState.DONE
    late = await _vote(store, asked, "cy")
    assert (late.applied, late.reason) == (False, "already decided")
    [published] = await _approvals(store, asked.intent_id)
    assert not published.approved and list(published.approvers) == ["bob"]  # type: ignore[attr-defined]
