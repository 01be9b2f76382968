"""Human in the loop in a pipeline: approvals in time, and each timeout route at the deadline."""

from __future__ import annotations

import json

from beam_agents import (
    AgentConfig,
    Complete,
    Deny,
    Drop,
    Escalate,
    FallbackContext,
    HitlPolicy,
    Suspend,
    intent_id_for,
)
from beam_agents._protos import ToolIntent, TraceEvent
from beam_agents.core.context import ActivationContext
from beam_agents.testing import EnvelopeStream, epoch_clock
from tests.core.harness import Outputs, run_agent, streamed

K = b"transfer-1"
TIMEOUT_MS = 5_000
PAST_DEADLINE_MS = 6_000


def deny_route(fallback: FallbackContext) -> Deny:
    return Deny(b"denied:" + fallback.snapshot + b":%d" % len(fallback.pending_intent_ids))


def drop_route(fallback: FallbackContext) -> Drop:
    return Drop()


def escalate_route(fallback: FallbackContext) -> Escalate:
    return Escalate()


def broken_route(fallback: FallbackContext) -> Deny:
    raise RuntimeError("the route has a bug")


def config(on_timeout: object, **policy: object) -> AgentConfig:
    return AgentConfig(
        hitl_policy=HitlPolicy(
            timeout_ms=TIMEOUT_MS,
            intent_ttl_ms=30_000,
            approval_channel="ops",
            on_timeout=on_timeout,  # type: ignore[arg-type]
            **policy,  # type: ignore[arg-type]
        ),
        processing_clock=epoch_clock,
    )


async def needs_approval(ctx: ActivationContext) -> Complete | Suspend:
    """Large amounts wait for a human; small ones are approved at once."""
    if not ctx.is_resume:
        if int(ctx.event) < 10_000:
            return Complete(output=b"auto:seq %d" % ctx.seq)
        ctx.request_approval({"amount": int(ctx.event)})
        return Suspend(snapshot=ctx.event)
    approval = ctx.resume_approval
    assert approval is not None
    verdict = "approved" if approval.approved else "declined"
    return Complete(output=f"{verdict}:{approval.approver}:{approval.intent_id}".encode())


def trace_names(outputs: Outputs) -> list[str]:
    return [TraceEvent.EventType.Name(event.event_type) for event in outputs.traces_for(K)]


def test_an_approval_in_time_resumes_the_agent_and_the_deadline_never_fires() -> None:
    approval_id = intent_id_for(K, 0, 0)
    stream = (
        EnvelopeStream()
        .event(K, b"12500", at_ms=1_000)
        .approval(K, approval_id, approved=True, approver="alice", at_ms=2_000)
        .advance_processing_time(PAST_DEADLINE_MS)
    )
    outputs = run_agent(streamed(stream), needs_approval, config(deny_route), streaming=True)
    assert outputs.output == [f"approved:alice:{approval_id}".encode()]
    assert outputs.errors == []
    [intent] = outputs.intents
    assert (intent.kind, intent.tool_name, intent.channel) == (
        ToolIntent.APPROVAL,
        "approval",
        "ops",
    )
    assert (intent.created_at_ms, intent.expires_at_ms) == (1_000, 31_000)
    assert json.loads(intent.args_json) == {"amount": 12500}
    assert trace_names(outputs).count("ACTIVATION_START") == 2


def test_an_unanswered_approval_takes_the_deny_route_at_the_deadline() -> None:
    stream = (
        EnvelopeStream()
        .event(K, b"12500", at_ms=1_000)
        .advance_processing_time(PAST_DEADLINE_MS)
        .approval(K, intent_id_for(K, 0, 0), approved=True, at_ms=9_000)
        .event(K, b"1", at_ms=10_000)
    )
    outputs = run_agent(streamed(stream), needs_approval, config(deny_route), streaming=True)
    # The next event after the denied run is a new run with the next seq.
    assert sorted(outputs.output) == [b"auto:seq 1", b"denied:12500:1"]
    [late] = outputs.errors
    assert late.reason == "orphaned_result" and "no suspended run" in late.detail
    deadline_events = [e for e in outputs.traces_for(K) if e.seq == 0][3:]
    assert [TraceEvent.EventType.Name(e.event_type) for e in deadline_events] == [
        "ACTIVATION_START",
        "ACTIVATION_END",
    ]
    assert deadline_events[0].attributes["trigger"] == "deadline"
    assert deadline_events[1].attributes["route"] == "deny"


def test_the_drop_route_writes_the_run_to_errors() -> None:
    stream = (
        EnvelopeStream().event(K, b"12500", at_ms=1_000).advance_processing_time(PAST_DEADLINE_MS)
    )
    outputs = run_agent(streamed(stream), needs_approval, config(drop_route), streaming=True)
    assert outputs.output == []
    [dropped] = outputs.errors
    assert (dropped.reason, dropped.entity_key, dropped.seq) == ("suspension_dropped", K, 0)
    assert "1 intents pending" in dropped.detail


def test_escalate_re_asks_at_most_max_escalations_times_then_denies() -> None:
    original = intent_id_for(K, 0, 0)
    stream = (
        EnvelopeStream()
        .event(K, b"12500", at_ms=1_000)
        .advance_processing_time(PAST_DEADLINE_MS)
        .approval(K, original, approved=True, at_ms=2_000)
        .advance_processing_time(PAST_DEADLINE_MS)
        .advance_processing_time(PAST_DEADLINE_MS)
    )
    outputs = run_agent(
        streamed(stream),
        needs_approval,
        config(escalate_route, max_escalations=2, exhausted_output=b"no decision"),
        streaming=True,
    )
    assert outputs.output == [b"no decision"]
    asks = sorted(outputs.intents, key=lambda intent: intent.step_index)
    assert [intent.intent_id for intent in asks] == [intent_id_for(K, 0, s) for s in range(3)]
    assert {intent.kind for intent in asks} == {ToolIntent.APPROVAL}
    assert {intent.channel for intent in asks} == {"ops"}
    assert [json.loads(intent.args_json).get("escalation") for intent in asks] == [None, 1, 2]
    assert json.loads(asks[1].args_json)["supersedes"] == [original]
    # The first request timed out and was escalated: a decision on it now comes too late.
    [late] = outputs.errors
    assert late.reason == "orphaned_result" and "after the deadline" in late.detail


def test_an_escalated_approval_granted_in_time_resumes_the_agent() -> None:
    escalation = intent_id_for(K, 0, 1)
    stream = (
        EnvelopeStream()
        .event(K, b"12500", at_ms=1_000)
        .advance_processing_time(PAST_DEADLINE_MS)
        .approval(K, escalation, approved=False, approver="manager", at_ms=2_000)
        .advance_processing_time(PAST_DEADLINE_MS)
    )
    outputs = run_agent(
        streamed(stream), needs_approval, config(escalate_route, max_escalations=3), streaming=True
    )
    assert outputs.output == [f"declined:manager:{escalation}".encode()]
    assert outputs.errors == []
    assert len(outputs.intents) == 2


async def waits_with_its_own_timeout(ctx: ActivationContext) -> Suspend:
    ctx.act("slow_tool", {})
    return Suspend(timeout_ms=1_000)


def test_a_suspend_timeout_without_a_policy_is_dropped() -> None:
    stream = EnvelopeStream().event(K, b"x", at_ms=1_000).advance_processing_time(2_000)
    outputs = run_agent(
        streamed(stream),
        waits_with_its_own_timeout,
        AgentConfig(processing_clock=epoch_clock),
        streaming=True,
    )
    assert [error.reason for error in outputs.errors] == ["suspension_dropped"]


def test_a_failing_route_ends_the_run_fail_closed() -> None:
    stream = (
        EnvelopeStream()
        .event(K, b"12500", at_ms=1_000)
        .advance_processing_time(PAST_DEADLINE_MS)
        .approval(K, intent_id_for(K, 0, 0), approved=True, at_ms=9_000)
    )
    outputs = run_agent(streamed(stream), needs_approval, config(broken_route), streaming=True)
    assert outputs.output == []
    assert sorted(error.reason for error in outputs.errors) == [
        "orphaned_result",
        "timeout_route_error",
    ]
    failure = next(e for e in outputs.errors if e.reason == "timeout_route_error")
    assert "the route has a bug" in failure.detail
    assert "ERROR" in trace_names(outputs)
