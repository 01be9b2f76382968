"""A refund desk whose limits hold at the effector, whatever the agent does.

The agent drafts a note to the customer with the model, then refunds directly with
``ctx.act``: it never asks anyone. The effector's policy (``refund_policy.toml`` beside this
file) decides each refund before it runs: small ones run, those above 500.00 wait for two
approvers, those above 5,000.00 are refused with a REJECTED result that names the rule, and
the run handles it. Each tenant's model calls draw on a daily token budget the effector keeps;
past it the agent sends a stock note instead (``BudgetExceeded``).

Two people approve here from another thread; in production they would use the console, the
CLI (``beam-agents-effector approve``) or the MCP endpoint, each with a named token.

Run it:  python examples/refund_desk.py   (it starts an effector of its own for the run)
"""

from __future__ import annotations

import json
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from beam_agents import (
    ActivationContext,
    AgentConfig,
    AgentEnvelope,
    Budget,
    BudgetExceeded,
    Complete,
    FakeLLM,
    IntentState,
    LlmRequest,
    ReadEnvelopes,
    RunAgent,
    SubmitIntents,
    Suspend,
    ToolRegistry,
    ToolResult,
    tool,
)
from beam_agents.model import TokenUsage, match_any, respond_with

import apache_beam as beam

POLICY = Path(__file__).with_name("refund_policy.toml")


STOCK_NOTE = "Your refund is on its way."
DAILY_TOKENS = 10_000
"""Each tenant's daily token budget."""


@tool(side_effect=True)
def refund(order: str, amount_cents: int, note: str) -> str:
    """Pay the refund back and send the note. Executed by the effector, never in the pipeline."""
    return f"refunded {order}"


def make_model() -> FakeLLM:
    """The model that drafts notes (a fake here: 21 tokens a call)."""
    answer = b"Sorry for the trouble: your refund is on its way."
    return FakeLLM([(match_any(), respond_with(answer, usage=TokenUsage(12, 9)))])


def make_registry() -> ToolRegistry:
    """The tools the effector may run."""
    return ToolRegistry([refund])


async def desk(ctx: ActivationContext) -> Complete | Suspend:
    """Refund the request; report what the effector did with it."""
    if ctx.is_resume:
        result = ctx.resume_result
        assert result is not None
        if result.status == ToolResult.OK:
            return Complete(output=ctx.snapshot + b": " + json.loads(result.payload).encode())
        return Complete(output=ctx.snapshot + b": refused: " + result.error_message.encode())
    request = json.loads(ctx.event)
    try:
        ask = f"Write a one-line note for refund {request['order']}."
        note = (await ctx.call_model(LlmRequest(model_id="desk", messages=[ask]))).text
    except BudgetExceeded:  # the tenant's tokens for today are spent
        note = STOCK_NOTE
    ctx.act("refund", {**request, "note": note})
    return Suspend(snapshot=request["order"].encode(), timeout_ms=600_000)


def make_events() -> list[AgentEnvelope]:
    """Three refund requests of one tenant: small, large and too large."""
    amounts = {"o-1": 2_500, "o-2": 80_000, "o-3": 900_000}
    return [
        AgentEnvelope(
            entity_key=f"acme/customer-{n}".encode(),
            event_time_ms=1_000 + n,
            external_event=json.dumps({"order": order, "amount_cents": cents}).encode(),
        )
        for n, (order, cents) in enumerate(amounts.items())
    ]


def approve_as_two(target: str, stop: threading.Event) -> list[str]:
    """Approve every refund the policy holds, as alice and then bob; the gates decided."""
    from effector import EffectorClient

    decided: list[str] = []
    with EffectorClient(target) as client:
        while not stop.is_set():
            for gate in client.list_intents(IntentState.AWAITING_DECISION):
                for approver in ("alice", "bob"):
                    client.decide(gate.intent_id, approved=True, approver=approver)
                decided.append(f"{gate.policy_rule}: {json.loads(gate.args_json)['order']}")
            time.sleep(0.1)
    return decided


def run(target: str, out_dir: str, **pipeline_args: Any) -> None:
    """The loop: read events and results from the effector, run the agent, submit its intents."""
    budget = Budget("refund-desk", target, tokens=DAILY_TOKENS, window="24h", tenant_separator="/")
    config = AgentConfig(provider_factory=make_model, tool_registry=make_registry(), budget=budget)
    with beam.Pipeline(**pipeline_args) as pipeline:
        events = pipeline | ReadEnvelopes(target, events=make_events(), stop_when_idle_s=1.0)
        outputs = events | RunAgent(desk, config=config)
        outputs.intents | SubmitIntents(target)
        outputs.output | beam.Map(bytes.decode) | beam.io.WriteToText(f"{out_dir}/refunds")


def main() -> None:
    """Start an effector with the policy, run the desk against it, print what happened."""
    from effector import EffectorClient, EffectorThread, ServerSettings

    settings = ServerSettings(policy_file=str(POLICY))
    with tempfile.TemporaryDirectory() as scratch:
        store = f"sqlite:///{scratch}/effector.db"
        with EffectorThread(store, make_registry(), settings) as effector:
            stop, decided = threading.Event(), []
            approver = threading.Thread(
                target=lambda: decided.extend(approve_as_two(effector.address, stop))
            )
            approver.start()
            try:
                run(effector.address, scratch)
            finally:
                stop.set()
                approver.join()
            with EffectorClient(effector.address) as client:
                windows = client.budgets()
        for line in decided:
            print(f"refund_desk: two approvers released {line}")
        for window in windows:
            used = f"{window.debited_tokens} of {window.cap_tokens} tokens"
            print(f"refund_desk: {window.ledger} used {used} today")
        paths = Path(scratch).glob("refunds-*")
        for line in sorted(line for path in paths for line in path.read_text().splitlines()):
            print(f"refund_desk: {line}")
    print("refund_desk: ok")


if __name__ == "__main__":
    main()
