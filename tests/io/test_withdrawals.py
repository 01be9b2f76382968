"""A run that stops waiting withdraws what it waited for, at a real effector (issue 42, point 2).

The README's loop shape on Beam's local runner. A run that completes while its approval is
pending withdraws it: the effector never offers it again and refuses a decision on it. A run
denied after a one-second ``Suspend`` timeout, under a policy whose approvals live five minutes,
leaves nothing awaiting a decision. Needs the effector to record ``WITHDRAWAL`` intents.
"""

from __future__ import annotations

import json
import time
from typing import Any

import apache_beam as beam
from effector_harness import BackgroundEffector, make_intent

from beam_agents import AgentConfig, Complete, Deny, HitlPolicy, RunAgent, Suspend
from beam_agents._protos import AgentEnvelope, IntentState, SubmitAck, ToolIntent, ToolResult
from beam_agents.core.agent import intent_id_for
from beam_agents.core.context import ActivationContext
from beam_agents.hitl import FallbackContext
from beam_agents.io import ReadEnvelopes, SubmitIntents
from effector.client import EffectorClient
from tests.io.io_harness import Collector, run_pipeline

KEY = b"refund-\xe2\x80\xae7"


def deny_unanswered(fallback: FallbackContext) -> Deny:
    return Deny(b"denied " + fallback.snapshot)


POLICY = HitlPolicy(
    timeout_ms=300_000,  # the policy's own wait: the Suspend below overrides it
    intent_ttl_ms=300_000,
    approval_channel="refunds",
    on_timeout=deny_unanswered,
)


async def asks_briefly(ctx: ActivationContext) -> Complete | Suspend:
    if ctx.is_resume:
        return Complete(output=b"decided")
    ctx.request_approval({"refund": 7, "to": "acct-\u202e4321"})
    return Suspend(snapshot=b"r-7", timeout_ms=1_000)


def loop(
    effector: BackgroundEffector, agent: Any
) -> tuple[list[bytes], dict[str, int], list[Any], float]:
    """Run ``agent`` in the local loop: its outputs, acks by intent id, dead letters, seconds."""
    event = AgentEnvelope(entity_key=KEY, event_time_ms=1_000, external_event=b"refund")
    output, acks, letters = Collector.new(), Collector.new(), Collector.new()

    def build(pipeline: beam.Pipeline) -> None:
        events = pipeline | ReadEnvelopes(
            effector.address, events=[event], stop_when_idle_s=1.0, poll_wait_ms=50
        )
        outputs = events | RunAgent(agent, AgentConfig(hitl_policy=POLICY))
        submitted = outputs.intents | SubmitIntents(effector.address)
        outputs.output | "Output" >> output.sink()
        submitted.acks | "Acks" >> acks.sink()
        submitted.dead_letter | "Letters" >> letters.sink()

    started = time.monotonic()
    run_pipeline(build)
    outcomes = {ack.intent_id: ack.outcome for ack in acks.values()}
    return output.values(), outcomes, letters.values(), time.monotonic() - started


async def asks_and_records(ctx: ActivationContext) -> Complete | Suspend:
    """Asks for an approval and records a note; the note's result settles the run."""
    if ctx.is_resume:
        return Complete(output=b"settled without the approval")
    ctx.request_approval({"refund": 7, "to": "acct-\u202e4321"})
    ctx.act("record", {"note": "refund 7"})
    return Suspend(snapshot=b"r-7", timeout_ms=60_000)


def test_a_run_that_completes_withdraws_the_approval_it_no_longer_needs(
    effector: BackgroundEffector,
) -> None:
    output, outcomes, letters, seconds = loop(effector, asks_and_records)
    assert output == [b"settled without the approval"] and letters == []
    assert seconds < 50  # the loop did not wait for the approval's minute
    approval_id = intent_id_for(KEY, 0, 0)
    assert set(outcomes.values()) == {SubmitAck.ACCEPTED} and len(outcomes) == 3
    with EffectorClient(effector.address) as client:
        shown = client.get_intent(approval_id)
        assert shown.state == IntentState.WITHDRAWN
        awaiting = client.list_intents(IntentState.AWAITING_DECISION)
        assert approval_id not in {intent.intent_id for intent in awaiting}
        assert client.status().awaiting_decision == 0
        decided = client.decide(approval_id, approved=True, approver="ann")
        assert not decided.applied and decided.state == IntentState.WITHDRAWN
        assert "withdrawn" in decided.reason.lower()
        [withdrawal_id] = set(outcomes) - {approval_id, intent_id_for(KEY, 0, 1)}
        notice = client.get_intent(withdrawal_id).intent
    assert notice.kind == ToolIntent.WITHDRAWAL and notice.withdraws_intent_id == approval_id
    assert json.loads(notice.args_json) == {"reason": "the run completed without waiting for it"}


def test_a_denied_run_leaves_no_approval_offered_after_its_wait(
    effector: BackgroundEffector,
) -> None:
    """The issue's case: Suspend(timeout_ms=1000) while the policy's approval TTL is 5 min."""
    output, outcomes, letters, seconds = loop(effector, asks_briefly)
    assert output == [b"denied r-7"] and letters == []
    assert seconds < 60  # not the approval's five minutes
    approval_id = intent_id_for(KEY, 0, 0)
    assert set(outcomes.values()) == {SubmitAck.ACCEPTED} and len(outcomes) == 2
    with EffectorClient(effector.address) as client:
        shown = client.get_intent(approval_id)
        # The approval's effector deadline was cut to the run's one-second wait, so the
        # effector expires it when the run's deny route withdraws it: either ends it.
        assert shown.intent.expires_at_ms - shown.intent.created_at_ms == 1_000
        assert shown.state in (IntentState.WITHDRAWN, IntentState.DONE)
        assert client.status().awaiting_decision == 0
        assert not client.decide(approval_id, approved=True, approver="ann").applied


async def reads_its_result(ctx: ActivationContext) -> Complete | Suspend:
    if not ctx.is_resume:
        ctx.act("record", {"note": "mine"})
        return Suspend(snapshot=b"r-7", timeout_ms=60_000)
    result = ctx.resume_result
    assert result is not None
    return Complete(output=ToolResult.Status.Name(result.status).encode())


def test_a_conflict_reaches_the_waiting_run_as_a_rejected_result(
    effector: BackgroundEffector,
) -> None:
    """Another submission already holds the run's intent id with other arguments (point 3)."""
    taken = make_intent("record", {"note": "someone else's"}, key=KEY)
    taken.intent_id = intent_id_for(KEY, 0, 0)
    with EffectorClient(effector.address) as client:
        [ack] = client.submit([taken])
        assert ack.outcome == SubmitAck.ACCEPTED
    output, outcomes, letters, seconds = loop(effector, reads_its_result)
    assert output == [b"REJECTED"]  # resumed at once, not after its one-minute timeout
    assert seconds < 50
    assert outcomes == {taken.intent_id: SubmitAck.REJECTED}
    [letter] = letters
    assert letter.intent.intent_id == taken.intent_id and "conflict" in letter.reason.lower()
