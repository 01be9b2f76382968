"""The runtime side of approvals bound to arguments: stale decisions, edits and lineage."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from apache_beam.pvalue import TaggedOutput

from beam_agents import AgentConfig, Complete, Suspend, intent_id_for
from beam_agents._protos import (
    AgentEnvelope,
    AgentError,
    Approval,
    ToolIntent,
    approval_digest,
    canonical_json,
)
from beam_agents.core.context import ActivationContext, approved_call, edit_diff
from beam_agents.core.staging import APPROVAL_TOOL_NAME, intent_step_digest
from beam_agents.hitl import HitlPolicy
from beam_agents.io.run_agent import AgentDoFn
from tests.core.harness import InMemoryKeyState, make_registry
from tests.seed import freeze_account

K = b"acct"
ASKED = {"customer_id": "c-1"}


def _deny_route(fallback: Any) -> Any:
    from beam_agents import Deny

    return Deny()


async def gated(ctx: ActivationContext) -> Complete | Suspend:
    """Ask to freeze an account; freeze it as approved (edited or not); report the result."""
    approval = ctx.resume_approval
    if approval is None and ctx.resume_result is None:
        ctx.request_approval(ASKED, tool="freeze_account")
        return Suspend()
    if approval is not None:
        if not approval.approved:
            return Complete(output=b"denied")
        ctx.act("freeze_account", ASKED, approval=approval)
        return Suspend()
    return Complete(output=b"frozen")


@pytest.fixture
def dofn() -> Iterator[AgentDoFn]:
    policy = HitlPolicy(
        timeout_ms=60_000,
        intent_ttl_ms=60_000,
        approval_channel="risk",
        on_timeout=_deny_route,
        required_approvals=2,
    )
    agent = AgentDoFn(gated, AgentConfig(tool_registry=make_registry(), hitl_policy=policy))
    agent.setup()
    yield agent
    agent.teardown()


def _tagged(outputs: list[Any], kind: type) -> list[Any]:
    return [o.value for o in outputs if isinstance(o, TaggedOutput) and isinstance(o.value, kind)]


def _intents(outputs: list[Any]) -> list[ToolIntent]:
    found = []
    for output in outputs:
        value = output.value if isinstance(output, TaggedOutput) else output
        if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], ToolIntent):
            found.append(value[1])
        elif isinstance(value, ToolIntent):
            found.append(value)
    return found


def _decision(**fields: Any) -> AgentEnvelope:
    approval = Approval(intent_id=intent_id_for(K, 0, 0), decided_at_ms=2_000, **fields)
    return AgentEnvelope(entity_key=K, event_time_ms=2_000, approval=approval)


def test_the_approval_digest_is_the_steps_digest() -> None:
    args_json = canonical_json(ASKED)
    recorded = intent_step_digest(ToolIntent.APPROVAL, APPROVAL_TOOL_NAME, args_json)
    assert approval_digest(args_json) == recorded.hex()


def test_an_edited_approval_resumes_with_the_edited_arguments_and_records_lineage(
    dofn: AgentDoFn,
) -> None:
    cells = InMemoryKeyState()
    asked = cells.process(
        dofn, K, AgentEnvelope(entity_key=K, event_time_ms=1_000, external_event=b"go")
    )
    [approval_intent] = _intents(asked)
    assert approval_intent.gated_tool == "freeze_account"
    assert approval_intent.required_approvals == 2
    assert approval_intent.channel == "risk"
    digest = approval_digest(approval_intent.args_json)
    edited = canonical_json({"customer_id": "c-2"})
    outputs = cells.process(
        dofn,
        K,
        _decision(approved=True, approver="ann", args_digest=digest, edited_args_json=edited),
    )
    assert _tagged(outputs, AgentError) == []
    [tool_intent] = _intents(outputs)
    assert (tool_intent.tool_name, tool_intent.args_json) == ("freeze_account", edited)
    lineage = tool_intent.edited_from
    assert (lineage.approval_intent_id, lineage.edited_by) == (approval_intent.intent_id, "ann")
    assert json.loads(lineage.diff_json) == {
        "changed": {"customer_id": {"from": "c-1", "to": "c-2"}}
    }


def test_a_stale_approval_is_refused_and_the_run_keeps_waiting(dofn: AgentDoFn) -> None:
    cells = InMemoryKeyState()
    cells.process(dofn, K, AgentEnvelope(entity_key=K, event_time_ms=1_000, external_event=b"go"))
    stale = approval_digest(canonical_json({"customer_id": "someone-else"}))
    outputs = cells.process(dofn, K, _decision(approved=True, approver="ann", args_digest=stale))
    [error] = _tagged(outputs, AgentError)
    assert error.reason == "stale_approval" and stale in error.detail
    assert _intents(outputs) == []
    assert cells.continuation.value is not None  # still suspended, waiting for a good decision
    good = approval_digest(canonical_json(ASKED))
    resumed = cells.process(dofn, K, _decision(approved=True, approver="ann", args_digest=good))
    [tool_intent] = _intents(resumed)
    assert tool_intent.args_json == canonical_json(ASKED)
    assert not tool_intent.HasField("edited_from")


def test_approved_call_refuses_denials_and_other_arguments() -> None:
    args_json = canonical_json(ASKED)
    with pytest.raises(ValueError, match="denied"):
        approved_call(Approval(intent_id="i", approver="a"), args_json, ASKED)
    other = Approval(approved=True, args_digest=approval_digest("{}"))
    with pytest.raises(ValueError, match="other arguments"):
        approved_call(other, args_json, ASKED)
    assert approved_call(Approval(approved=True), args_json, ASKED) == (args_json, None)
    assert edit_diff({"a": 1, "b": 2}, {"a": 1, "c": 3}) == ('{"added":{"c":3},"removed":{"b":2}}')


def test_request_approval_checks_the_gated_tool_and_the_quorum() -> None:
    with pytest.raises(ValueError, match="required_approvals"):
        HitlPolicy(
            timeout_ms=1,
            intent_ttl_ms=1,
            approval_channel="",
            on_timeout=_deny_route,
            required_approvals=0,
        )
    assert freeze_account.side_effect
