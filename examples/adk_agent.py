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

import quiet_beam  # noqa: F401  # isort: skip  (first: keeps a Beam import warning out)
import json
import tempfile
from pathlib import Path
from typing import Any

import apache_beam as beam
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
from beam_agents.model.client import ToolCall
from beam_agents.model.fake import match_any, respond_with_fn


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
    fake: FakeLLM

    def respond(request: LlmRequest) -> bytes:
        return fake.scripted_body(request, *answer(request))

    fake = FakeLLM([(match_any(), respond_with_fn(respond))])
    return fake


def make_events() -> list[AgentEnvelope]:
    """Two accounts, one risky."""
    return [
        AgentEnvelope(
            entity_key=account.encode(),
            event_time_ms=1_000 + n,
            external_event=json.dumps({"account": account}).encode(),
        )
        for n, account in enumerate(["acct-1", "acct-2"])
    ]


AGENT = AdkAgent(build_agent, app_name="cards")


def run(target: str, out_dir: str, **pipeline_args: Any) -> None:
    """The loop: read events and results from the effector, run the agent, submit its intents."""
    with beam.Pipeline(**pipeline_args) as pipeline:
        events = pipeline | ReadEnvelopes(target, events=make_events(), stop_when_idle_s=1.0)
        config = AgentConfig(provider_factory=make_model, tool_registry=make_registry())
        outputs = events | RunAgent(AGENT, config=config)
        outputs.intents | SubmitIntents(target)
        outputs.output | beam.Map(bytes.decode) | beam.io.WriteToText(f"{out_dir}/answers")


def read_lines(out_dir: str) -> list[str]:
    """Every line ``run`` wrote to ``out_dir``, sorted."""
    paths = Path(out_dir).glob("answers-*")
    return sorted(line for path in paths for line in path.read_text().splitlines())


def main() -> None:
    """Start an effector, run the loop against it, print the answers."""
    from effector.launch import EffectorThread  # the sidecar, in this process for the demo

    with tempfile.TemporaryDirectory() as scratch:
        effector_tools = ToolRegistry([hold_card])  # the effector runs side effects only
        with EffectorThread(f"sqlite:///{scratch}/effector.db", effector_tools) as effector:
            run(effector.address, scratch)
        for line in read_lines(scratch):
            print(f"adk_agent: {line}")
    print("adk_agent: ok")


if __name__ == "__main__":
    main()
