# mypy: disallow-untyped-calls=False
"""Approve-with-edit end to end: a pipeline on the local runner and a real effector.

The agent asks to pay 500 to "acme" (an approval gating the ``pay`` tool, quorum of one); an
approver, with a named token, approves with the amount edited to 50; the run resumes with the
edited arguments, stages ``pay`` with them and its lineage, and the effector pays 50.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import apache_beam as beam

from beam_agents import AgentConfig, Complete, Deny, HitlPolicy, RunAgent, Suspend
from beam_agents._protos import AgentEnvelope, IntentState, canonical_json_bytes
from beam_agents.core.context import ActivationContext
from beam_agents.hitl import FallbackContext
from beam_agents.io import ReadEnvelopes, SubmitIntents
from beam_agents.tools import ToolRegistry, tool
from effector.client import EffectorClient
from effector.launch import EffectorThread
from effector.server import ServerSettings
from effector.service import parse_tokens
from tests.io.io_harness import Collector

ASKED = {"payee": "acme", "amount": 500}


@tool(side_effect=True)
def pay(payee: str, amount: int) -> dict[str, object]:
    """Pay someone.

    :param payee: Who is paid.
    :param amount: How much.
    """
    return {"paid": amount, "to": payee}


def _deny(fallback: FallbackContext) -> Deny:
    return Deny(b"timed out")


async def pays_when_approved(ctx: ActivationContext) -> Complete | Suspend:
    """Ask, pay as approved, and report the payment's intent id and result."""
    if not ctx.is_resume:
        ctx.request_approval(ASKED, tool="pay")
        return Suspend()
    approval = ctx.resume_approval
    if approval is not None:
        if not approval.approved:
            return Complete(output=b"denied")
        intent_id = ctx.act("pay", ASKED, approval=approval)
        return Suspend(snapshot=intent_id.encode())
    result = ctx.resume_result
    assert result is not None
    report = {"intent_id": ctx.snapshot.decode(), "result": json.loads(result.payload)}
    return Complete(output=canonical_json_bytes(report))


def _approve_with_edit(address: str, stop: threading.Event, decided: list[str]) -> None:
    """Wait for the approval, then approve it as ``ann`` with the amount edited to 50."""
    with EffectorClient(address, token="tok-ann") as client:
        while not stop.is_set():
            waiting = client.list_intents(IntentState.AWAITING_DECISION)
            if waiting:
                [intent] = waiting
                shown = client.get_intent(intent.intent_id)
                answer = client.decide(
                    intent.intent_id,
                    approved=True,
                    approver="someone else",
                    reason="smaller",
                    args_digest=shown.args_digest,
                    edited_args_json=json.dumps({"payee": "acme", "amount": 50}),
                )
                assert answer.applied, answer.reason
                decided.append(intent.intent_id)
                return
            time.sleep(0.05)


def test_an_edited_approval_resumes_with_the_edited_arguments_and_their_lineage(
    tmp_path: Path,
) -> None:
    tokens = parse_tokens("ann:tok-ann\npipeline:tok-pipe\n", "tokens")
    settings = ServerSettings(token=tokens.primary, tokens=tokens)
    policy = HitlPolicy(
        timeout_ms=60_000, intent_ttl_ms=60_000, approval_channel="payments", on_timeout=_deny
    )
    config = AgentConfig(tool_registry=ToolRegistry([pay]), hitl_policy=policy)
    event = AgentEnvelope(entity_key=b"order-1", event_time_ms=1_000, external_event=b"go")
    collected = Collector.new()
    decided: list[str] = []
    stop = threading.Event()
    with EffectorThread(f"sqlite:///{tmp_path}/e.db", ToolRegistry([pay]), settings) as eff:
        approver = threading.Thread(target=_approve_with_edit, args=(eff.address, stop, decided))
        approver.start()
        try:
            with beam.Pipeline() as pipeline:
                outputs = (
                    pipeline
                    | ReadEnvelopes(
                        eff.address, token=tokens.primary, events=[event], stop_when_idle_s=3.0
                    )
                    | RunAgent(pays_when_approved, config=config)
                )
                outputs.intents | SubmitIntents(eff.address, token=tokens.primary)
                outputs.output | collected.sink()
        finally:
            stop.set()
            approver.join()
        [approval_id] = decided
        [output] = collected.values()
        report = json.loads(output)
        assert report["result"] == {"paid": 50, "to": "acme"}
        with EffectorClient(eff.address, token="tok-pipe") as client:
            paid = client.get_intent(report["intent_id"])
            approval = client.get_intent(approval_id)
    assert json.loads(paid.intent.args_json) == {"payee": "acme", "amount": 50}
    lineage = paid.intent.edited_from
    assert (lineage.approval_intent_id, lineage.edited_by) == (approval_id, "ann")
    assert json.loads(lineage.diff_json) == {"changed": {"amount": {"from": 500, "to": 50}}}
    assert json.loads(approval.result.payload)["approver"] == "ann"
