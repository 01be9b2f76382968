"""Rule family: deadline routes. What a suspension does when its deadline fires.

The route (deny, drop, escalate, or fail closed when the route itself fails) and idle expiry are
pure decisions (``beam_agents.core.activation``) from the continuation and the timer's firing time
alone, tested first without Beam; the pipeline tests below show human-in-the-loop approvals in
time, each route at the deadline, and a retried timer bundle escalating identically.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from beam_agents import AgentConfig, Complete, Suspend
from beam_agents._protos import Continuation, ToolIntent, TraceEvent
from beam_agents.core.activation import (
    DEADLINE_APPROVER,
    RouteFailure,
    choose_route,
    deadline_outcome,
    idle_expiry,
)
from beam_agents.core.agent import intent_id_for
from beam_agents.core.context import ActivationContext
from beam_agents.core.observability import DEADLINE_ATTRIBUTE, identity_of, trace_id_for
from beam_agents.hitl import Deny, Drop, Escalate, FallbackContext, HitlPolicy
from beam_agents.testing import EnvelopeStream, FailFirstCommit, epoch_clock
from tests.core.harness import Outputs, escalate, escalate_once, fingerprint, run_agent, streamed

KEY = b"order-9"


def deny(fallback: FallbackContext) -> Deny:
    return Deny(b"denied " + fallback.snapshot)


def broken(_: FallbackContext) -> Deny:
    raise RuntimeError("route bug")


def policy(route: object, max_escalations: int = 2) -> HitlPolicy:
    return HitlPolicy(
        timeout_ms=5_000,
        intent_ttl_ms=60_000,
        approval_channel="ops",
        on_timeout=route,  # type: ignore[arg-type]
        max_escalations=max_escalations,
        exhausted_output=b"exhausted",
    )


def waiting_run() -> Continuation:
    """Run 2 waiting, at step 3, for a tool intent and an approval; deadline at 10 s."""
    return Continuation(
        seq=2,
        next_step=3,
        snapshot=b"s",
        pending_intent_ids=[intent_id_for(KEY, 2, 0), intent_id_for(KEY, 2, 2)],
        pending_kinds=[ToolIntent.TOOL, ToolIntent.APPROVAL],
        deadline_ms=10_000,
        trace_id=trace_id_for(KEY, 2),
        trace_sequence=7,
    )


def names(events: list[TraceEvent]) -> list[str]:
    return [TraceEvent.EventType.Name(event.event_type) for event in events]


def test_without_a_policy_the_run_is_dropped() -> None:
    assert choose_route(None, KEY, waiting_run(), 10_000) == Drop()


def test_the_route_decides_on_the_runs_snapshot() -> None:
    assert choose_route(policy(deny), KEY, waiting_run(), 10_000) == Deny(b"denied s")


def test_escalating_past_the_limit_is_taken_as_the_exhausted_denial() -> None:
    run = waiting_run()
    run.escalations = 2
    assert choose_route(policy(escalate), KEY, run, 10_000) == Deny(b"exhausted")


def test_a_route_that_raises_is_returned_as_its_failure() -> None:
    failure = choose_route(policy(broken), KEY, waiting_run(), 10_000)
    assert isinstance(failure, RouteFailure) and isinstance(failure.error, RuntimeError)


def test_deny_ends_the_run_with_its_output() -> None:
    outcome = deadline_outcome(Deny(b"no"), KEY, waiting_run(), None, fired_ms=10_000, now_ms=50)
    assert outcome.escalated is None and outcome.outputs == [b"no"] and outcome.errors == []
    assert names(outcome.traces) == ["ACTIVATION_START", "ACTIVATION_END"]
    assert outcome.traces[-1].attributes["route"] == "deny"
    assert [event.sequence for event in outcome.traces] == [7, 8]


def test_drop_ends_the_run_on_errors() -> None:
    outcome = deadline_outcome(Drop(), KEY, waiting_run(), None, fired_ms=10_000, now_ms=50)
    [error] = outcome.errors
    assert outcome.escalated is None and outcome.outputs == []
    assert error.reason == "suspension_dropped" and error.seq == 2
    assert "2 intents pending" in error.detail and error.event_time_ms == 50


def test_a_failed_route_ends_the_run_fail_closed_with_one_error_trace() -> None:
    failure = RouteFailure(RuntimeError("route bug"))
    outcome = deadline_outcome(failure, KEY, waiting_run(), None, fired_ms=10_000, now_ms=50)
    [error] = outcome.errors
    assert error.reason == "timeout_route_error" and "RuntimeError: route bug" in error.detail
    assert names(outcome.traces) == ["ERROR"] and outcome.escalated is None


def test_escalation_answers_pending_approvals_no_and_asks_again() -> None:
    run = waiting_run()
    outcome = deadline_outcome(Escalate(), KEY, run, policy(escalate), fired_ms=10_000, now_ms=50)
    escalated, intent = outcome.escalated, outcome.intent
    assert escalated is not None and intent is not None
    assert intent.intent_id == intent_id_for(KEY, 2, 3) and intent.step_index == 3
    assert intent.kind == ToolIntent.APPROVAL and intent.channel == "ops"
    # The fresh approval never outlives the new deadline: its TTL is cut to the 5 s timeout.
    assert intent.created_at_ms == 50 and intent.expires_at_ms == 5_050
    [withdrawal] = outcome.withdrawals  # the replaced approval; the tool intent is still awaited
    assert withdrawal.withdraws_intent_id == intent_id_for(KEY, 2, 2)
    assert withdrawal.kind == ToolIntent.WITHDRAWAL and withdrawal.step_index == 2
    assert list(escalated.pending_intent_ids) == [intent_id_for(KEY, 2, 0), intent.intent_id]
    [answered] = escalated.approvals
    assert answered.intent_id == intent_id_for(KEY, 2, 2) and not answered.approved
    assert answered.approver == DEADLINE_APPROVER and answered.decided_at_ms == 10_000
    assert escalated.next_step == 4 and escalated.escalations == 1
    assert escalated.deadline_ms == 15_000
    assert names(outcome.traces) == ["ACTIVATION_START", "INTENT_EMITTED", "SUSPENDED"]
    assert outcome.traces[-1].attributes[DEADLINE_ATTRIBUTE] == "15000"
    assert escalated.trace_sequence == 7 + 3
    # The committed continuation is never edited in place.
    assert run == waiting_run()


def test_escalations_are_deterministic() -> None:
    first = deadline_outcome(Escalate(), KEY, waiting_run(), policy(escalate), fired_ms=1, now_ms=2)
    again = deadline_outcome(Escalate(), KEY, waiting_run(), policy(escalate), fired_ms=1, now_ms=2)
    assert dataclasses.replace(first, traces=[]) == dataclasses.replace(again, traces=[])
    assert list(map(identity_of, first.traces)) == list(map(identity_of, again.traces))


def test_idle_expiry_counts_from_the_last_activity() -> None:
    assert idle_expiry(1_000, 500) == 1_500
    assert idle_expiry(1_000, None) is None
    # A key with no recorded activity has no idle timer armed.
    assert idle_expiry(0, 500) is None


# -- in a pipeline --------------------------------------------------------------------------

K = b"transfer-1"
"""The key of the pipeline tests below."""
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
    # The policy's 30 s TTL is cut to its timeout: the approval never outlives the run's wait.
    assert (intent.created_at_ms, intent.expires_at_ms) == (1_000, 1_000 + TIMEOUT_MS)
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
    asks = sorted(
        (intent for intent in outputs.intents if intent.kind != ToolIntent.WITHDRAWAL),
        key=lambda intent: intent.step_index,
    )
    assert [intent.intent_id for intent in asks] == [intent_id_for(K, 0, s) for s in range(3)]
    assert {intent.kind for intent in asks} == {ToolIntent.APPROVAL}
    # Each escalation withdraws the request it replaces; the final denial withdraws the last.
    withdrawn = [i for i in outputs.intents if i.kind == ToolIntent.WITHDRAWAL]
    assert sorted(i.withdraws_intent_id for i in withdrawn) == sorted(i.intent_id for i in asks)
    reasons = sorted(json.loads(i.args_json)["reason"] for i in withdrawn)
    assert sum("escalated" in reason for reason in reasons) == 2
    assert sum("denied" in reason for reason in reasons) == 1
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
    kinds = sorted(ToolIntent.Kind.Name(intent.kind) for intent in outputs.intents)
    assert kinds == ["APPROVAL", "APPROVAL", "WITHDRAWAL"]  # the replaced request is withdrawn


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


async def approve_first(ctx: ActivationContext) -> Complete | Suspend:
    if ctx.is_resume:
        return Complete(output=b"decided")
    ctx.request_approval({"order": ctx.event.decode()})
    return Suspend()


def test_a_retried_deadline_firing_escalates_identically(tmp_path: Path) -> None:
    def run(before_commit: FailFirstCommit | None) -> Outputs:
        stream = EnvelopeStream().event(K, b"order", at_ms=1_000).advance_processing_time(6_000)
        policy = escalate_once()
        config = AgentConfig(
            hitl_policy=policy, processing_clock=epoch_clock, before_commit=before_commit
        )
        return run_agent(streamed(stream), approve_first, config, streaming=True)

    forced = FailFirstCommit(tmp_path, trigger="deadline")
    assert fingerprint(run(forced)) == fingerprint(run(None))
    assert f"{K.hex()}-0-deadline-1" in forced.forced()
