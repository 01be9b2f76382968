"""Compensation end to end in one effector: executed after an effect that ran, NOT_NEEDED
after one that never did, and the compensation fields checked at Submit."""

from __future__ import annotations

from pathlib import Path

import pytest
from effector_harness import make_intent, make_withdrawal, running_effector, wait_done
from effector_test_tools import make_registry, read_ledger

from beam_agents._protos import (
    IntentState,
    SubmitAck,
    ToolIntent,
    ToolResult,
)
from effector.worker import intake_rejection


def paid(step: int, note: object = "pay", *, key: bytes = b"order-1") -> ToolIntent:
    """A ``record`` intent linked to its compensation ``record(note="refund")``."""
    intent = make_intent("record", {"note": note}, key=key, step=step)
    intent.compensate_tool = "record"
    intent.compensate_args_json = '{"note":"refund"}'
    return intent


def refund(original: ToolIntent, step: int) -> ToolIntent:
    intent = make_intent(
        "record", original.compensate_args_json, key=original.entity_key, step=step
    )
    intent.compensates_intent_id = original.intent_id
    return intent


@pytest.mark.asyncio
async def test_a_compensation_runs_once_after_its_effect_and_not_for_an_effect_never_run(
    tmp_path: Path, ledger: Path
) -> None:
    ran = paid(0)
    undo_ran = refund(ran, 1)
    never = paid(0, 5, key=b"order-2")  # invalid arguments: REJECTED at Submit, never run
    undo_never = refund(never, 1)
    async with running_effector(f"sqlite:///{tmp_path / 'e.db'}") as effector:
        # One Submit, compensation first: the effector still runs the effect first.
        acks = await effector.client.submit([undo_ran, ran, undo_never, never])
        assert [a.outcome for a in acks] == [SubmitAck.ACCEPTED] * 3 + [SubmitAck.REJECTED]
        done = await wait_done(effector.client, [ran.intent_id, undo_ran.intent_id])
        done |= await wait_done(effector.client, [never.intent_id, undo_never.intent_id])
        # Submitted again (a replayed pipeline), nothing runs twice.
        again = await effector.client.submit([undo_ran, ran], redeliver_results=True)
        assert {a.outcome for a in again} == {SubmitAck.DUPLICATE}
        published = [
            r.envelope.tool_result for r in (await effector.client.read(1, max_batch=100)).records
        ]
    assert done[undo_ran.intent_id].result.status == ToolResult.OK
    result = done[undo_never.intent_id].result
    assert result.status == ToolResult.NOT_NEEDED
    assert f"compensated intent {never.intent_id} never ran (REJECTED)" in result.error_message
    finished = [
        (row.intent_id, row.attempt) for row in read_ledger(ledger) if row.event == "finished"
    ]
    assert finished == [(ran.intent_id, 1), (undo_ran.intent_id, 1)]  # in order, once each
    statuses = {r.intent_id: r.status for r in published}
    assert statuses[undo_never.intent_id] == ToolResult.NOT_NEEDED


@pytest.mark.asyncio
async def test_an_original_arriving_after_its_undo_is_refused_and_never_runs(
    tmp_path: Path, ledger: Path
) -> None:
    late = paid(0, key=b"order-3")
    undo = refund(late, 1)
    async with running_effector(f"sqlite:///{tmp_path / 'e.db'}") as effector:
        [first] = await effector.client.submit([undo])  # the original is still in a dead letter
        assert first.outcome == SubmitAck.ACCEPTED
        settled = await wait_done(effector.client, [undo.intent_id])
        [ack] = await effector.client.submit([late])  # re-submitted once the cause was fixed
        refused = await wait_done(effector.client, [late.intent_id])
    assert settled[undo.intent_id].result.status == ToolResult.REJECTED
    assert "refused if it arrives later" in settled[undo.intent_id].result.error_message
    assert ack.outcome == SubmitAck.REJECTED
    assert f"compensated by {undo.intent_id} before it arrived" in ack.reason
    assert refused[late.intent_id].result.status == ToolResult.REJECTED
    assert [row for row in read_ledger(ledger) if row.intent_id == late.intent_id] == []


@pytest.mark.asyncio
async def test_the_compensation_of_a_withdrawn_effect_is_not_needed(
    tmp_path: Path, ledger: Path
) -> None:
    withdrawn = paid(0, key=b"order-4")
    undo = refund(withdrawn, 1)
    notice = make_withdrawal(withdrawn, "the run completed")
    async with running_effector(f"sqlite:///{tmp_path / 'e.db'}") as effector:
        # The run withdrew the payment, then undid it (a saga's cleanup), all in one Submit.
        acks = await effector.client.submit([withdrawn, notice, undo])
        assert [a.outcome for a in acks] == [SubmitAck.ACCEPTED] * 3
        settled = await wait_done(effector.client, [undo.intent_id])
        shown = await effector.client.get_intent(withdrawn.intent_id)
    result = settled[undo.intent_id].result
    assert result.status == ToolResult.NOT_NEEDED
    assert f"compensated intent {withdrawn.intent_id} was withdrawn" in result.error_message
    assert shown.state == IntentState.WITHDRAWN
    assert read_ledger(ledger) == []  # neither the effect nor its undo ran


def test_submit_checks_the_compensation_fields() -> None:
    registry = make_registry()
    good = paid(0)
    assert intake_rejection(registry, good) is None
    assert intake_rejection(registry, refund(good, 1)) is None

    def changed(intent: ToolIntent, **fields: object) -> ToolIntent:
        copy = ToolIntent()
        copy.CopyFrom(intent)
        for name, value in fields.items():
            setattr(copy, name, value)
        return copy

    cases = {
        "its compensation cannot run: unknown tool 'nope'": changed(good, compensate_tool="nope"),
        "its compensation cannot run: tool 'lookup' is read-only": changed(
            good, compensate_tool="lookup", compensate_args_json='{"name":"x"}'
        ),
        "its compensation cannot run": changed(good, compensate_args_json='{"note":1}'),
        "compensates_intent_id: intent_id 'x' is not a UUID": changed(
            refund(good, 1), compensates_intent_id="x"
        ),
        "an intent cannot compensate itself": changed(
            refund(good, 1), compensates_intent_id=refund(good, 1).intent_id
        ),
        "a compensating intent cannot itself have a compensation": changed(
            refund(good, 1), compensate_tool="record", compensate_args_json='{"note":"x"}'
        ),
        "only a TOOL intent may compensate or be compensated": changed(
            good, kind=ToolIntent.APPROVAL, tool_name="approval"
        ),
    }
    for expected, intent in cases.items():
        reason = intake_rejection(registry, intent)
        assert reason is not None and reason.startswith(expected), (expected, reason)
