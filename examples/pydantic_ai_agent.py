# mypy: disallow-untyped-calls=False
# (Beam's own API is mostly unannotated.)
"""A Pydantic AI agent in the local loop: ``RunAgent(PydanticAIAgent(build_agent, ...))``.

The agent is plain Pydantic AI: a system prompt, and the pipeline's registry tools through
``BeamToolset``. The adapter gives it the runtime's model (``BeamModel``: every call goes
through ``ctx.call_model`` and its replay cache), runs the read-only ``lookup_order`` inline and
turns ``issue_refund`` (side-effecting) into an intent; the run suspends until the in-process
effector has executed it. On the resume the agent runs again from the complaint: the two model
answers come back from the replay cache and the refund keeps its intent id, so only the final
answer is a new model call. The model is a scripted ``FakeLLM``.

Run it:  python examples/pydantic_ai_agent.py
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from pydantic_ai import Agent

from beam_agents import (
    AgentConfig,
    AgentEnvelope,
    FakeLLM,
    LlmRequest,
    ReadEnvelopes,
    RunAgent,
    SubmitIntents,
    ToolRegistry,
    TraceEvent,
    tool,
)
from beam_agents.adapters.pydantic_ai import PydanticAIAgent
from beam_agents.model import ToolCall, match_any, respond_with_fn, wire_body

import apache_beam as beam

ORDERS = {"A-1001": {"amount_cents": 2599, "status": "delivered broken"}}


@tool
def lookup_order(order_id: str) -> dict[str, Any]:
    """Look an order up: its amount and delivery status (read-only).

    Args:
        order_id: The order number, e.g. "A-1001".
    """
    return ORDERS.get(order_id, {"status": "unknown"})


@tool(side_effect=True)
def issue_refund(order_id: str, amount_cents: int) -> dict[str, Any]:
    """Refund an order (side-effecting: only the effector runs it).

    Args:
        order_id: The order to refund.
        amount_cents: How much to refund, in cents.
    """
    return {"refund_id": f"R-{order_id}", "amount_cents": amount_cents}


def build_agent() -> Agent[None, str]:
    """The Pydantic AI agent; ``PydanticAIAgent`` builds it once per worker process."""
    return Agent(system_prompt="You are a support agent. Check the order, then refund it.")


def scripted_model(request: LlmRequest) -> bytes:
    """Look the order up, refund it, then answer with the refund."""
    results = {
        message["tool_call_id"]: json.loads(message["content"])
        for message in request.messages
        if message["role"] == "tool"
    }
    calls: list[ToolCall] = []
    text = ""
    if "order" not in results:
        calls = [ToolCall("order", "lookup_order", {"order_id": "A-1001"})]
    elif "refund" not in results:
        amount = results["order"]["amount_cents"]
        calls = [ToolCall("refund", "issue_refund", {"order_id": "A-1001", "amount_cents": amount})]
    else:
        refund = results["refund"]
        euros = refund["amount_cents"] / 100
        text = f"Refunded {euros:.2f} EUR for order A-1001 (refund {refund['refund_id']})."
    return wire_body("openai", text=text, tool_calls=calls, model=request.model_id)


def fake_provider() -> FakeLLM:
    """The scripted model, speaking the OpenAI wire format."""
    return FakeLLM([(match_any(), respond_with_fn(scripted_model))], shape="openai")


def run(target: str, out_dir: str) -> None:
    """Events and results in, the Pydantic AI agent, intents out to the effector."""
    complaint = AgentEnvelope(
        entity_key=b"customer-c42",
        event_time_ms=1_000,
        external_event=b"Order A-1001 arrived broken. Can I get my money back?",
    )
    agent = PydanticAIAgent(build_agent, model_id="support-model")
    registry = ToolRegistry([lookup_order, issue_refund])
    with beam.Pipeline() as pipeline:
        events = pipeline | ReadEnvelopes(target, events=[complaint], stop_when_idle_s=1.0)
        outputs = events | RunAgent(
            agent, config=AgentConfig(provider_factory=fake_provider, tool_registry=registry)
        )
        outputs.intents | SubmitIntents(target)
        written = {
            "answers": outputs.output | "Answers" >> beam.Map(bytes.decode),
            "intents": outputs.intents
            | "Intents" >> beam.Map(lambda intent: f"{intent.tool_name} {intent.args_json}"),
            "calls": outputs.traces
            | "Calls" >> beam.Filter(lambda event: event.event_type == TraceEvent.LLM_CALL)
            | "CacheHits" >> beam.Map(lambda event: event.attributes["beam_agents.cache_hit"]),
            "errors": outputs.errors | "Errors" >> beam.Map(lambda error: error.reason),
        }
        for name, lines in written.items():
            lines | f"Write_{name}" >> beam.io.WriteToText(f"{out_dir}/{name}")


def read_lines(out_dir: str, name: str) -> list[str]:
    """Every line ``run`` wrote to ``name``, sorted."""
    paths = Path(out_dir).glob(f"{name}-*")
    return sorted(line for path in paths for line in path.read_text().splitlines())


def main() -> None:
    """Start an effector, run the agent against it, print what happened."""
    from effector import EffectorThread  # the sidecar, in this process for the demo

    with tempfile.TemporaryDirectory() as scratch:
        effector_tools = ToolRegistry([issue_refund])
        with EffectorThread(f"sqlite:///{scratch}/effector.db", effector_tools) as effector:
            run(effector.address, scratch)
        errors = read_lines(scratch, "errors")
        if errors:
            raise SystemExit(f"pydantic_ai_agent: the run failed: {errors}")
        for line in read_lines(scratch, "intents"):
            print(f"pydantic_ai_agent: staged {line}")
        for line in read_lines(scratch, "answers"):
            print(f"pydantic_ai_agent: answer: {line}")
        hits = read_lines(scratch, "calls")
        replayed = hits.count("true")
        print(
            f"pydantic_ai_agent: {len(hits) - replayed} model calls, {replayed} replayed "
            "from the cache when the run resumed"
        )
    print("pydantic_ai_agent: ok")


if __name__ == "__main__":
    main()
