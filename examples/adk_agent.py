# mypy: disallow-untyped-calls=False
# (Beam's own API is mostly unannotated.)
"""A Google ADK agent in the local loop: events -> RunAgent -> effector -> results -> RunAgent.

The ADK ``LlmAgent`` names its model ("card-model") and offers two registry tools through
``beam_tools``: ``risk_of`` (read-only, runs inline in the pipeline) and ``hold_card``
(side-effecting: the run stages an intent, suspends, and resumes when the effector's result
comes back). ``AdkAgent`` re-runs the ADK agent on every activation; the replay cache hands
back the model's earlier answers, so no model call is repeated. A scripted ``FakeLLM`` stands in
for the provider: it looks the risk up, holds the card when the risk is high, then answers.

Run it:  python examples/adk_agent.py   (it starts an effector of its own for the run)
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from google.adk.agents import LlmAgent

from beam_agents import (
    AgentConfig,
    AgentEnvelope,
    FakeLLM,
    LlmRequest,
    ReadEnvelopes,
    RunAgent,
    SubmitIntents,
    ToolRegistry,
    tool,
)
from beam_agents.adapters.adk import AdkAgent, beam_tools
from beam_agents.model import ToolCall

import apache_beam as beam


@tool
def risk_of(account: str) -> int:
    """How risky the account looks, 0 to 9 (read-only).

    Args:
        account: The account id.
    """
    return 7 if account.endswith("1") else 2


@tool(side_effect=True)
def hold_card(account: str) -> str:
    """Put a hold on the account's card. Executed by the effector, never in the pipeline.

    Args:
        account: The account id.
    """
    return f"card of {account} held"


def make_registry() -> ToolRegistry:
    """The tools: ``risk_of`` runs inline, the effector runs ``hold_card``."""
    return ToolRegistry([risk_of, hold_card])


def build_agent() -> LlmAgent:
    """The ADK agent (built once per worker process by ``AdkAgent``)."""
    return LlmAgent(
        name="cards",
        model="card-model",
        instruction="Check the account's risk; hold its card when the risk is 5 or more.",
        tools=beam_tools(make_registry()),
    )


def answer(request: LlmRequest) -> tuple[str, tuple[ToolCall, ...]]:
    """The scripted model: look the risk up, hold the card if it is high, then report."""
    account = json.loads(request.messages[1]["content"])["account"]
    results = [m["content"] for m in request.messages if m["role"] == "tool"]
    if not results:
        return "", (ToolCall("risk-1", "risk_of", {"account": account}),)
    risk = int(results[0])
    if risk >= 5 and len(results) == 1:
        return "", (ToolCall("hold-1", "hold_card", {"account": account}),)
    if risk >= 5:
        return f"{account}: risk {risk}, {results[1]}", ()
    return f"{account}: risk {risk}, nothing to do", ()


def make_model() -> FakeLLM:
    """The provider: a ``FakeLLM`` answering with :func:`answer` (no network)."""
    return FakeLLM.scripted(answer)


ACCOUNTS = ("acct-1", "acct-2")
"""One event per account: the first is risky."""


def triage(target: str, answers: str) -> None:
    """One pipeline against the effector at ``target``; the answers go to the file ``answers``.

    Events (and, as they come back, the effector's results) reach ``AdkAgent``; its intents go
    to the effector, which runs ``hold_card``.
    """
    events = [
        AgentEnvelope(
            entity_key=account.encode(),
            event_time_ms=1_000 + n,
            external_event=json.dumps({"account": account}).encode(),
        )
        for n, account in enumerate(ACCOUNTS)
    ]
    agent = AdkAgent(build_agent, app_name="cards")
    config = AgentConfig(provider_factory=make_model, tool_registry=make_registry())
    with beam.Pipeline() as pipeline:
        inputs = pipeline | ReadEnvelopes(target, events=events, stop_when_idle_s=1.0)
        outputs = inputs | RunAgent(agent, config=config)
        outputs.intents | SubmitIntents(target)
        texts = outputs.output | beam.Map(bytes.decode)
        texts | beam.io.WriteToText(answers, shard_name_template="")  # one file, that name


def main() -> None:
    """Run :func:`triage` with an effector of its own (``hold_card`` only), print the answers."""
    from effector import EffectorThread  # the sidecar, in this process for the demo

    with tempfile.TemporaryDirectory() as scratch:
        store = f"sqlite:///{scratch}/effector.db"
        with EffectorThread(store, ToolRegistry([hold_card])) as effector:
            triage(effector.address, f"{scratch}/answers")
        answers = sorted(Path(scratch, "answers").read_text().splitlines())
    for line in [*answers, "ok"]:
        print(f"adk_agent: {line}")


if __name__ == "__main__":
    main()
