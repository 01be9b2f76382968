"""One lifecycle through a real effector over gRPC: withdrawals, late decisions, conflicts.

A run that stops waiting submits a WITHDRAWAL: what has not started never runs (the worker's
ledger shows it) and the key's next intent runs; a decision on a withdrawn approval is refused
with why; a conflicting submission gets a REJECTED result on the log so its run resumes.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from conftest import sqlite_url
from effector_harness import make_intent, make_withdrawal, running_effector, wait_done
from effector_test_tools import read_ledger

from beam_agents._protos import (
    IntentState,
    SubmitAck,
    ToolIntent,
    ToolResult,
    submission_digest,
)
from effector.client import AsyncEffectorClient

REASON = "the run took its deadline route \u202e (20000 ms)"


def withdrawal(target: ToolIntent, reason: str = REASON) -> ToolIntent:
    return make_withdrawal(target, reason)


async def wait_started(ledger: Path, intent_id: str) -> None:
    deadline = time.monotonic() + 30
    while not any(row.intent_id == intent_id for row in read_ledger(ledger)):
        assert time.monotonic() < deadline, f"{intent_id} never started"
        await asyncio.sleep(0.02)


async def published_results(client: AsyncEffectorClient) -> list[ToolResult]:
    records = (await client.read(1, wait_ms=0)).records
    return [r.envelope.tool_result for r in records if r.envelope.HasField("tool_result")]


@pytest.mark.asyncio
async def test_a_withdrawn_intent_never_runs_and_its_key_moves_on(
    tmp_path: Path, ledger: Path
) -> None:
    gate = tmp_path / "gate"
    head = make_intent("gate", {"path": str(gate)}, key=b"order", step=0)
    withdrawn = make_intent("record", {"note": "never"}, key=b"order", step=1)
    following = make_intent("record", {"note": "next"}, key=b"order", step=2)
    async with running_effector(sqlite_url(tmp_path / "s.db")) as effector:
        client = effector.client
        await client.submit([head, withdrawn, following])
        await wait_started(ledger, head.intent_id)

        acks = await client.submit([withdrawal(withdrawn), withdrawal(head)])

        assert [(a.outcome, a.state) for a in acks] == [(SubmitAck.ACCEPTED, IntentState.DONE)] * 2
        shown = await client.get_intent(withdrawn.intent_id)
        assert shown.state == IntentState.WITHDRAWN
        assert shown.result.status == ToolResult.WITHDRAWN
        assert REASON in shown.result.error_message
        assert (await client.get_intent(head.intent_id)).state == IntentState.RUNNING
        gate.touch()
        done = await wait_done(client, [head.intent_id, following.intent_id])
        assert done[head.intent_id].result.status == ToolResult.OK  # it had started: it ran
        assert done[following.intent_id].result.status == ToolResult.OK
        status = await client.status()
        assert (status.pending, status.in_flight) == (0, 0)
        ran = {row.intent_id for row in read_ledger(ledger)}
        assert withdrawn.intent_id not in ran and following.intent_id in ran
        published = {r.intent_id for r in await published_results(client)}
        assert published == {head.intent_id, following.intent_id}


@pytest.mark.asyncio
async def test_an_intent_submitted_after_its_withdrawal_never_runs(
    tmp_path: Path, ledger: Path
) -> None:
    late = make_intent("record", {"note": "late"}, key=b"late")
    marker = make_intent("record", {"note": "marker"}, key=b"late", step=1)
    async with running_effector(sqlite_url(tmp_path / "s.db")) as effector:
        client = effector.client
        await client.submit([withdrawal(late)])
        [ack, _] = await client.submit([late, marker])
        assert (ack.outcome, ack.state) == (SubmitAck.ACCEPTED, IntentState.WITHDRAWN)
        await wait_done(client, [marker.intent_id])
        assert [row.intent_id for row in read_ledger(ledger)] == [marker.intent_id] * 2
        assert (await client.get_intent(late.intent_id)).state == IntentState.WITHDRAWN


@pytest.mark.asyncio
async def test_deciding_a_withdrawn_approval_is_refused_and_says_why(tmp_path: Path) -> None:
    asked = make_intent("", {"to": "acct-1"}, key=b"ask", kind=ToolIntent.APPROVAL)
    asked.gated_tool = "record"
    async with running_effector(sqlite_url(tmp_path / "s.db")) as effector:
        client = effector.client
        await client.submit([asked])
        assert (await client.status()).awaiting_decision == 1
        await client.submit([withdrawal(asked)])

        decision = await client.decide(asked.intent_id, approved=True, approver="ann")

        assert not decision.applied
        assert decision.state == IntentState.WITHDRAWN
        assert "withdrawn" in decision.reason and REASON in decision.reason
        status = await client.status()
        assert (status.awaiting_decision, status.withdrawn, status.in_flight) == (0, 1, 0)
        assert (await client.read(1, wait_ms=0)).records == []


@pytest.mark.asyncio
async def test_a_malformed_withdrawal_is_refused(tmp_path: Path) -> None:
    target = make_intent("record", {"note": "kept"}, key=b"m")
    wrong_id = withdrawal(target)
    wrong_id.intent_id = target.intent_id.replace(target.intent_id[:8], "0" * 8)
    no_reason = withdrawal(make_intent("record", {"note": "a"}, key=b"m", step=1))
    no_reason.args_json = '{"why":"x"}'
    not_a_uuid = withdrawal(make_intent("record", {"note": "b"}, key=b"m", step=2))
    not_a_uuid.withdraws_intent_id = "\u202e" + not_a_uuid.withdraws_intent_id
    async with running_effector(sqlite_url(tmp_path / "s.db")) as effector:
        client = effector.client
        acks = await client.submit([wrong_id, no_reason, not_a_uuid])
        assert [a.outcome for a in acks] == [SubmitAck.REJECTED] * 3
        assert "withdrawal_id_for" in acks[0].reason
        assert '{"reason"' in acks[1].reason
        assert "withdraws_intent_id" in acks[2].reason
        [ack] = await client.submit([target])
        assert ack.outcome == SubmitAck.ACCEPTED
        await wait_done(client, [target.intent_id])


@pytest.mark.asyncio
async def test_a_conflicting_submission_resumes_its_run_with_a_rejection(tmp_path: Path) -> None:
    first = make_intent("record", {"note": "first"}, key=b"c", seq=7)
    other = make_intent("record", {"note": "other"}, key=b"c", seq=7)
    async with running_effector(sqlite_url(tmp_path / "s.db")) as effector:
        client = effector.client
        await client.submit([first])
        await wait_done(client, [first.intent_id])

        [ack] = await client.submit([other])

        assert ack.outcome == SubmitAck.REJECTED
        refusals = [r for r in await published_results(client) if r.status == ToolResult.REJECTED]
        assert len(refusals) == 1
        assert (refusals[0].intent_id, refusals[0].entity_key, refusals[0].seq) == (
            other.intent_id,
            b"c",
            7,
        )
        assert "conflict" in refusals[0].error_message
        assert "args_json" in refusals[0].error_message
        assert ack.result == refusals[0]  # the ack says what the waiting run receives
        # Only the run that staged these exact bytes takes it, never the one whose was kept.
        assert refusals[0].refused_submission_digest == submission_digest(other)
        assert "REJECTED result was published" in ack.reason
        shown = await client.get_intent(first.intent_id)
        assert shown.intent == first and shown.result.status == ToolResult.OK
