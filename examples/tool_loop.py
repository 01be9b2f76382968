# mypy: disallow-untyped-calls=False
# (Beam's own API is mostly unannotated.)
"""A tool-calling loop, closed through the effector: read-only tools inline, a refund as an intent.

A support agent gets a customer's complaint and runs ``beam_agents.loop.run_tool_loop``. The
model looks the order and the customer up (two read-only tools, run inline in the activation,
in one turn), then asks for a refund: a side-effecting tool, so the loop stages it as an intent
and the run suspends. The pipeline submits the intent to an effector, which executes it and
publishes the result; the result re-enters the pipeline, resumes the run, and the loop re-walks
the conversation (the two model calls already made come from the replay cache, the refund keeps
its intent id and is not staged again) and asks the model for its final answer.

The effector runs in this process on a loopback port with an SQLite store in a temporary
directory; the pipeline reads its envelopes with ``ReadEnvelopes`` (the DirectRunner's
single-source shape) and submits intents with ``SubmitIntents``.

The model is a scripted ``FakeLLM`` speaking the OpenAI wire format, unless ``OPENAI_BASE_URL``
is set: then any OpenAI-compatible server answers (model from ``OPENAI_MODEL``, key from
``OPENAI_API_KEY`` if set).

Run it:  python examples/tool_loop.py
"""

from __future__ import annotations

import functools
import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from beam_agents import (
    ActivationContext,
    AgentConfig,
    AgentEnvelope,
    Complete,
    FakeLLM,
    LlmRequest,
    ReadEnvelopes,
    RunAgent,
    SubmitIntents,
    Suspend,
    ToolRegistry,
    TraceEvent,
    tool,
)
from beam_agents.loop import run_tool_loop
from beam_agents.model import (
    ModelClient,
    OpenAIChatProvider,
    ToolCall,
    match_any,
    respond_with_fn,
    wire_body,
)
from effector import EffectorThread, ServerSettings, WorkerSettings

import apache_beam as beam
from apache_beam.pvalue import PCollection
from apache_beam.runners.portability.fn_api_runner.fn_runner import FnApiRunner

CUSTOMER = b"customer-c42"
COMPLAINT = "Hi, order A-1001 arrived broken. I'm customer c-42. Can I get my money back?"
INSTRUCTIONS = (
    "You are a support agent. Use the tools to check orders and customers, refund delivered "
    "orders that arrived broken, and then answer the customer in one or two sentences."
)

ORDERS = {"A-1001": {"customer": "c-42", "amount_cents": 2599, "status": "delivered"}}
TIERS = {"c-42": "gold"}


@tool
def lookup_order(order_id: str) -> dict[str, Any]:
    """Look an order up: its customer, amount and delivery status (read-only).

    Args:
        order_id: The order number, e.g. "A-1001".
    """
    return ORDERS.get(order_id, {"status": "unknown"})


@tool
def customer_tier(customer_id: str) -> str:
    """The loyalty tier of a customer (read-only).

    Args:
        customer_id: The customer id, e.g. "c-42".
    """
    return TIERS.get(customer_id, "standard")


@tool(side_effect=True)
def issue_refund(order_id: str, amount_cents: int) -> dict[str, Any]:
    """Refund an order to the customer's card (side-effecting: only the effector runs it).

    Args:
        order_id: The order to refund.
        amount_cents: How much to refund, in cents.
    """
    return {"refund_id": f"R-{order_id}", "amount_cents": amount_cents, "status": "issued"}


def pipeline_tools() -> ToolRegistry:
    """Every tool the model may call: ``ctx.run_tool`` runs the read-only ones."""
    return ToolRegistry([lookup_order, customer_tier, issue_refund])


def effector_tools() -> ToolRegistry:
    """The tools the effector executes."""
    return ToolRegistry([issue_refund])


def scripted_support_model(request: LlmRequest) -> bytes:
    """What the fake model answers: it reads the tool results it was given, like a model would."""
    results = {
        message["tool_call_id"]: json.loads(message["content"])
        for message in request.messages
        if message["role"] == "tool"
    }
    if not results:
        text = "Let me check the order and your account."
        calls = [
            ToolCall("call_order", "lookup_order", {"order_id": "A-1001"}),
            ToolCall("call_tier", "customer_tier", {"customer_id": "c-42"}),
        ]
    elif "call_refund" not in results:
        order = results["call_order"]
        text = "The order was delivered broken; refunding it in full."
        calls = [
            ToolCall(
                "call_refund",
                "issue_refund",
                {"order_id": "A-1001", "amount_cents": order["amount_cents"]},
            )
        ]
    else:
        refund = results["call_refund"]
        euros = refund["amount_cents"] / 100
        text = (
            f"Refunded {euros:.2f} EUR for order A-1001 (refund {refund['refund_id']}), "
            f"with priority handling for our {results['call_tier']} members."
        )
        calls = []
    return wire_body("openai", text=text, tool_calls=calls, model=request.model_id)


def fake_provider() -> FakeLLM:
    """The scripted model, speaking the OpenAI Chat Completions wire format."""
    return FakeLLM([(match_any(), respond_with_fn(scripted_support_model))], shape="openai")


def chosen_provider() -> tuple[Callable[[], ModelClient], str]:
    """The provider factory, and a description of the model it reaches."""
    base_url = os.environ.get("OPENAI_BASE_URL")
    if not base_url:
        return fake_provider, "a scripted FakeLLM (OpenAI wire format)"
    model = os.environ.get("OPENAI_MODEL")
    if not model:
        raise SystemExit("OPENAI_BASE_URL is set: set OPENAI_MODEL to the model to use too")
    key_env = "OPENAI_API_KEY" if os.environ.get("OPENAI_API_KEY") else None
    factory = functools.partial(
        OpenAIChatProvider, base_url=base_url, model=model, api_key_env=key_env
    )
    return factory, f"{model} at {base_url}"


async def support(ctx: ActivationContext) -> Complete | Suspend:
    """The agent: the whole conversation is one tool loop over AgentConfig.tool_registry."""
    request = LlmRequest(
        # Empty: the provider's own model answers (OPENAI_MODEL for a real endpoint).
        model_id="",
        messages=[
            {"role": "system", "content": INSTRUCTIONS},
            {"role": "user", "content": ctx.event.decode()},
        ],
    )
    loop = await run_tool_loop(ctx, request, max_iterations=6)
    return loop.outcome


def trace_line(event: TraceEvent) -> str:
    """The parts of a trace event this program reports, as a JSON line."""
    return json.dumps(
        {
            "type": TraceEvent.EventType.Name(event.event_type),
            "cache_hit": event.attributes.get("beam_agents.cache_hit", ""),
        }
    )


def run_pipeline(target: str, out_dir: Path, factory: Callable[[], ModelClient]) -> None:
    """One pipeline run: the complaint in, the loop closed through the effector, files out."""
    complaint = AgentEnvelope(
        entity_key=CUSTOMER,
        event_time_ms=int(time.time() * 1000),
        external_event=COMPLAINT.encode(),
    )
    with beam.Pipeline(runner=FnApiRunner()) as pipeline:
        envelopes = pipeline | "Envelopes" >> ReadEnvelopes(
            target, events=[complaint], stop_when_idle_s=1.0, poll_wait_ms=50
        )
        outputs = envelopes | "Support" >> RunAgent(
            support,
            config=AgentConfig(provider_factory=factory, tool_registry=pipeline_tools()),
        )
        _ = outputs.intents | "ToEffector" >> SubmitIntents(target)
        files: dict[str, PCollection[str]] = {
            "answers": outputs.output | "AnswerText" >> beam.Map(bytes.decode),
            "intents": outputs.intents
            | "IntentText"
            >> beam.Map(
                lambda intent: json.dumps(
                    [intent.step_index, intent.tool_name, intent.args_json, intent.intent_id]
                )
            ),
            "traces": outputs.traces | "TraceText" >> beam.Map(trace_line),
            "errors": outputs.errors
            | "ErrorText" >> beam.Map(lambda error: f"{error.reason}: {error.detail}"),
        }
        for name, lines in files.items():
            _ = lines | f"Write_{name}" >> beam.io.WriteToText(
                str(out_dir / name), shard_name_template=""
            )


def read(out_dir: Path, name: str) -> list[str]:
    """The lines the pipeline wrote to ``name``."""
    return (out_dir / name).read_text(encoding="utf-8").splitlines()


def main() -> None:
    """Run the conversation end to end and report the intents, the answer and the replays."""
    factory, description = chosen_provider()
    print(f"tool_loop: the model is {description}")
    with tempfile.TemporaryDirectory() as workdir:
        out_dir = Path(workdir)
        with EffectorThread(
            f"sqlite:///{out_dir / 'effector.db'}",
            effector_tools(),
            ServerSettings(worker=WorkerSettings(poll_interval_ms=50)),
        ) as effector:
            run_pipeline(effector.address, out_dir, factory)
        errors, answers = read(out_dir, "errors"), read(out_dir, "answers")
        intents = sorted(json.loads(line) for line in read(out_dir, "intents"))
        traces = [json.loads(line) for line in read(out_dir, "traces")]
    if errors:
        raise SystemExit("tool_loop: the run failed:\n" + "\n".join(errors))
    for step, tool_name, args_json, intent_id in intents:
        print(f"tool_loop: staged {tool_name} {args_json} at step {step} as {intent_id}")
    [answer] = answers
    print(f"tool_loop: answer: {answer}")
    calls = [event for event in traces if event["type"] == "LLM_CALL"]
    replayed = sum(event["cache_hit"] == "true" for event in calls)
    print(
        f"tool_loop: {len(calls) - replayed} model calls, {replayed} replayed from the cache "
        "when the run resumed"
    )
    if not os.environ.get("OPENAI_BASE_URL"):
        assert [tool_name for _, tool_name, _, _ in intents] == ["issue_refund"], intents
        assert json.loads(intents[0][2]) == {"amount_cents": 2599, "order_id": "A-1001"}
        assert answer.startswith("Refunded 25.99 EUR for order A-1001 (refund R-A-1001)"), answer
        assert (len(calls) - replayed, replayed) == (3, 2), calls
    print("tool_loop: ok")


if __name__ == "__main__":
    main()
