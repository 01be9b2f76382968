# mypy: disallow-untyped-calls=False
"""The adapter base every adapter shares, in a real ``RunAgent`` pipeline (no framework needed).

The agent below plays an adapter: it re-walks two approval requests on every activation
through an ``AdapterActivation``, as the adapters do, and reports each decision.
"""

from __future__ import annotations

import pytest

from beam_agents import AgentConfig, Complete, Suspend, ToolRegistry, intent_id_for
from beam_agents._protos import withdrawal_id_for
from beam_agents.adapters import AdapterActivation, Decision, Pending
from beam_agents.core.context import ActivationContext
from beam_agents.testing import EnvelopeStream
from beam_agents.tools.errors import ToolArgumentError
from tests.core.harness import escalate_once, run_agent, streamed
from tests.semantics.gate_tools import apply_effect

KEY = b"two-asks"


async def two_approvals(ctx: ActivationContext) -> Complete | Suspend:
    """Ask about A, then about B; finish with both decisions."""
    activation = AdapterActivation(ctx, adapter="test")
    said: list[str] = []
    for name in ("A", "B"):
        decision = activation.request_approval({"ask": name}, call_key=name)
        if isinstance(decision, Pending):
            # The TestStream's clock reads as the epoch: B's wait must outlast the advance.
            return activation.suspend(timeout_ms=5_000 if name == "A" else 60_000)
        assert isinstance(decision, Decision)
        said.append(f"{name}:{decision.approved}:{decision.approver}:{decision.timed_out}")
    return activation.finish(",".join(said))


def test_an_escalated_approval_keeps_the_escalations_answer_on_every_re_walk() -> None:
    asked_a, escalation, asked_b = (intent_id_for(KEY, 0, step) for step in range(3))
    stream = (
        EnvelopeStream()
        .event(KEY, b"go", at_ms=1_000)
        .advance_processing_time(6_000)  # A's deadline: the route escalates, E asks again
        .approval(KEY, escalation, approved=True, at_ms=2_000, approver="alice")
        .approval(KEY, asked_b, approved=False, at_ms=3_000, approver="bob")
    )
    outputs = run_agent(
        streamed(stream), two_approvals, AgentConfig(hitl_policy=escalate_once()), streaming=True
    )
    assert outputs.errors == []
    withdrawn_a = withdrawal_id_for(asked_a)  # the escalation replaced A's approval
    assert [i.intent_id for i in outputs.intents] == [asked_a, withdrawn_a, escalation, asked_b]
    # The last activation re-walks A after bob denied B: A is still alice's "yes".
    assert outputs.output == [b"A:True:alice:False,B:False:bob:False"]


def test_an_escalation_nobody_answers_reads_as_timed_out() -> None:
    asked_a = intent_id_for(KEY, 0, 0)
    stream = (
        EnvelopeStream()
        .event(KEY, b"go", at_ms=1_000)
        .advance_processing_time(6_000)  # escalates
        .advance_processing_time(6_000)  # the escalation times out too: Escalate becomes Deny
    )
    outputs = run_agent(
        streamed(stream), two_approvals, AgentConfig(hitl_policy=escalate_once()), streaming=True
    )
    escalation = intent_id_for(KEY, 0, 1)
    assert [i.intent_id for i in outputs.intents] == [
        asked_a,
        withdrawal_id_for(asked_a),  # replaced by the escalation
        escalation,
        withdrawal_id_for(escalation),  # the exhausted route denies: nothing is awaited
    ]
    assert outputs.errors == []
    assert outputs.output == []  # the exhausted route denies with an empty output


def test_an_approval_the_effector_expired_reads_as_timed_out_not_approved() -> None:
    from beam_agents._protos import ToolResult

    asked_a = intent_id_for(KEY, 0, 0)
    asked_b = intent_id_for(KEY, 0, 1)
    stream = (
        EnvelopeStream()
        .event(KEY, b"go", at_ms=1_000)
        .result(KEY, asked_a, at_ms=2_000, status=ToolResult.EXPIRED, error_message="ttl")
        .approval(KEY, asked_b, approved=True, at_ms=3_000, approver="carol")
    )
    outputs = run_agent(streamed(stream), two_approvals, AgentConfig(), streaming=True)
    assert outputs.errors == []
    assert outputs.output == [b"A:False::True,B:True:carol:False"]


async def apply_once(ctx: ActivationContext) -> Complete | Suspend:
    """Stage one side effect and finish with what it returned."""
    activation = AdapterActivation(ctx, adapter="test")
    value = activation.act("apply_effect", {"event_id": "e", "amount": 1}, call_key="only")
    if isinstance(value, Pending):
        return activation.suspend()
    return activation.finish(value)


def test_a_run_waiting_only_for_an_effect_outlasts_the_deadline_for_people() -> None:
    from beam_agents import Deny, HitlPolicy
    from tests.adapters.conformance import deny_when_nobody_answers
    from tests.adapters.scenario import triage_registry

    policy = HitlPolicy(
        timeout_ms=1_000,
        intent_ttl_ms=5_000,
        approval_channel="ops",
        on_timeout=deny_when_nobody_answers,
    )
    assert isinstance(deny_when_nobody_answers(None), Deny)  # type: ignore[arg-type]
    effect = intent_id_for(KEY, 0, 0)
    stream = (
        EnvelopeStream()
        .event(KEY, b"go", at_ms=1_000)
        .advance_processing_time(30_000)  # far past the policy's 1 s for people
        .result(KEY, effect, at_ms=2_000, payload=b'{"applied":1}')
    )
    config = AgentConfig(hitl_policy=policy, tool_registry=triage_registry(), intent_ttl_ms=60_000)
    outputs = run_agent(streamed(stream), apply_once, config, streaming=True)
    assert outputs.errors == []
    assert outputs.output == [b'{"applied":1}']
    [suspended] = [e for e in outputs.traces if e.attributes.get("pending") == "1"]
    assert suspended.attributes["beam_agents.deadline_ms"] == str(60_000 + 60_000)


async def acting_badly(ctx: ActivationContext) -> Complete | Suspend:
    """An adapter-like agent staging ``apply_effect`` with arguments the tool refuses."""
    activation = AdapterActivation(ctx, adapter="test")
    try:
        activation.act("apply_effect", {"event_id": "e1", "amount": "lots"}, tool=apply_effect)
    except ToolArgumentError as refused:
        return activation.finish(f"refused: {refused}")
    return activation.finish("staged")


@pytest.mark.parametrize("registered", [True, False], ids=["registered", "unregistered"])
def test_an_effect_with_arguments_its_tool_refuses_is_never_staged(registered: bool) -> None:
    # ctx.act validates a tool AgentConfig.tool_registry holds; the adapter's own tool does
    # it for one the pipeline's registry lacks (which ctx.act would stage unchecked).
    registry = ToolRegistry([apply_effect] if registered else [])
    stream = EnvelopeStream().event(KEY, b"go", at_ms=1_000)
    config = AgentConfig(tool_registry=registry)
    outputs = run_agent(streamed(stream), acting_badly, config, streaming=True)
    assert outputs.errors == [] and outputs.intents == []
    [output] = outputs.output
    assert output.startswith(b"refused: ") and b"apply_effect" in output and b"amount" in output


async def acting_well(ctx: ActivationContext) -> Complete | Suspend:
    """An adapter-like agent staging a valid ``apply_effect``; reports the value it gets."""
    activation = AdapterActivation(ctx, adapter="test")
    value = activation.act("apply_effect", {"event_id": "e1", "amount": 5}, tool=apply_effect)
    if isinstance(value, Pending):
        return activation.suspend()
    return activation.finish(f"{type(value).__name__}: {value}")


@pytest.mark.parametrize("registered", [True, False], ids=["registered", "unregistered"])
def test_an_effects_answer_is_rebuilt_by_its_tool_registered_or_not(registered: bool) -> None:
    effect = intent_id_for(KEY, 0, 0)
    stream = (
        EnvelopeStream()
        .event(KEY, b"go", at_ms=1_000)
        .result(KEY, effect, payload=b'{"event_id":"e1","applied":5}', at_ms=2_000)
    )
    config = AgentConfig(tool_registry=ToolRegistry([apply_effect] if registered else []))
    outputs = run_agent(streamed(stream), acting_well, config, streaming=True)
    assert outputs.errors == []
    assert [intent.intent_id for intent in outputs.intents] == [effect]
    assert outputs.output == [b"dict: {'event_id': 'e1', 'applied': 5}"]
