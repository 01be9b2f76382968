"""The fast path: an agent that remembers, one model call per event, nothing suspended.

A support assistant keeps the last few turns of each customer's conversation in working
memory. Two messages arrive for the same customer; each activation reads what the previous one
remembered, makes exactly one model call, stores the new turn and completes. Memory is per key:
the second customer starts from nothing.

The model is a ``FakeLLM`` whose answers depend on how many turns the prompt carries, so the
outputs prove that memory crossed from the first activation to the second.

Run it:  python examples/fast_path.py
"""

from __future__ import annotations

from beam_agents import (
    ActivationContext,
    AgentConfig,
    Complete,
    FakeLLM,
    LlmRequest,
    RunAgent,
    TraceEvent,
)
from beam_agents.model import match_contains, respond_with
from beam_agents.testing import EnvelopeStream, streaming_pipeline

import apache_beam as beam
from apache_beam.testing.util import assert_that, equal_to

MODEL_ID = "support-assistant"


def make_provider() -> FakeLLM:
    """Answers that reveal how much conversation the prompt carried."""
    return FakeLLM(
        [
            (match_contains("[0 earlier turns]"), respond_with(b"Hi! Which order is it about?")),
            (match_contains("[2 earlier turns]"), respond_with(b"Order 42 ships tomorrow.")),
        ]
    )


async def support(ctx: ActivationContext) -> Complete:
    """Answer one customer message with the conversation so far."""
    history = ctx.memory.ring("turns")
    prompt = f"[{len(history)} earlier turns] " + " | ".join(t.decode() for t in history)
    reply = await ctx.call_model(
        LlmRequest(
            model_id=MODEL_ID,
            messages=[{"role": "user", "content": f"{prompt} || customer: {ctx.event.decode()}"}],
        )
    )
    ctx.memory.append("turns", b"customer: " + ctx.event, max_items=6)
    ctx.memory.append("turns", b"assistant: " + reply.response, max_items=6)
    return Complete(output=ctx.entity_key + b" <- " + reply.response)


def main() -> None:
    """Run the conversation through RunAgent and check every reply and model call."""
    stream = (
        EnvelopeStream()
        .event(b"alice", b"Where is my order?", at_ms=1_000)
        .event(b"alice", b"It is order 42.", at_ms=2_000)
        .event(b"bob", b"Hello?", at_ms=2_500)
    )
    with streaming_pipeline() as pipeline:
        outputs = (
            pipeline
            | "Messages" >> stream.build()
            | "Support" >> RunAgent(support, config=AgentConfig(provider_factory=make_provider))
        )
        assert_that(
            outputs.output,
            equal_to(
                [
                    b"alice <- Hi! Which order is it about?",
                    b"alice <- Order 42 ships tomorrow.",
                    b"bob <- Hi! Which order is it about?",
                ]
            ),
            label="replies",
        )
        model_calls = outputs.traces | "ModelCalls" >> beam.Filter(
            lambda event: event.event_type == TraceEvent.LLM_CALL
        )
        assert_that(
            model_calls | "Keys" >> beam.Map(lambda event: event.entity_key),
            equal_to([b"alice", b"alice", b"bob"]),
            label="one model call per event",
        )
        assert_that(outputs.intents, equal_to([]), label="nothing staged")
        assert_that(outputs.errors, equal_to([]), label="no errors")
    print("fast_path: alice's second activation remembered her first message")
    print("fast_path: 3 events, 3 model calls, 0 intents")
    print("fast_path: ok")


if __name__ == "__main__":
    main()
