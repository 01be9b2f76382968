"""RunAgent over a TestStream: per-key order, memory across activations, atomic failure."""

from __future__ import annotations

import apache_beam as beam
from apache_beam.transforms.window import FixedWindows

from beam_agents import AgentConfig, Complete
from beam_agents._protos import AgentEnvelope, TraceEvent
from beam_agents.core.context import ActivationContext
from beam_agents.model.client import LlmRequest
from beam_agents.model.fake import FakeLLM, match_any, respond_with
from beam_agents.testing import EnvelopeStream
from tests.core.harness import SharedProvider, run_agent, streamed


async def remember(ctx: ActivationContext) -> Complete:
    """Append the event to a ring and report everything this key has seen, with the seq."""
    ctx.memory.append("seen", ctx.event)
    history = b",".join(ctx.memory.ring("seen"))
    return Complete(output=ctx.entity_key + b"#" + str(ctx.seq).encode() + b":" + history)


def test_events_on_a_key_run_in_order_and_memory_carries_to_the_next_one_only() -> None:
    stream = (
        EnvelopeStream()
        .event(b"a", b"1", at_ms=1_000)
        .event(b"b", b"x", at_ms=1_001)
        .event(b"a", b"2", at_ms=1_002)
        .event(b"a", b"3", at_ms=1_003)
        .event(b"b", b"y", at_ms=1_004)
    )
    outputs = run_agent(streamed(stream), remember, streaming=True)
    assert sorted(outputs.output) == [
        b"a#0:1",
        b"a#1:1,2",
        b"a#2:1,2,3",
        b"b#0:x",
        b"b#1:x,y",
    ]


def test_a_key_keeps_one_history_across_windows_of_its_input() -> None:
    stream = (
        EnvelopeStream()
        .event(b"a", b"1", at_ms=1_000)
        .advance_watermark_to(70_000)
        .event(b"a", b"2", at_ms=75_000)
    )

    def windowed(pipeline: beam.Pipeline) -> object:
        return pipeline | stream.build() | beam.WindowInto(FixedWindows(60))

    outputs = run_agent(windowed, remember, streaming=True)
    assert sorted(outputs.output) == [b"a#0:1", b"a#1:1,2"]


async def fails_on_boom(ctx: ActivationContext) -> Complete:
    """Writes memory, stages an intent and calls the model, then raises on a "boom" event."""
    before = ctx.memory.get("value") or b"-"
    ctx.memory.set("value", ctx.event)
    ctx.act("notify", {"event": ctx.event.decode()})
    await ctx.call_model(LlmRequest(model_id="m", messages=[{"role": "user", "content": "hi"}]))
    if ctx.event == b"boom":
        raise RuntimeError("the agent failed after staging everything")
    return Complete(output=b"seq=%d before=%s" % (ctx.seq, before))


def test_a_failed_activation_leaves_state_outputs_and_intents_untouched() -> None:
    provider = SharedProvider(FakeLLM([(match_any(), respond_with(b"ok"))]))
    stream = (
        EnvelopeStream()
        .event(b"k", b"first", at_ms=1_000)
        .event(b"k", b"boom", at_ms=2_000)
        .event(b"k", b"third", at_ms=3_000)
    )
    outputs = run_agent(
        streamed(stream), fails_on_boom, AgentConfig(provider_factory=provider), streaming=True
    )
    # The third event sees the first one's memory and the seq the failed one did not take.
    assert sorted(outputs.output) == [b"seq=0 before=-", b"seq=1 before=first"]
    assert sorted(intent.seq for intent in outputs.intents) == [0, 1]
    assert {intent.args_json for intent in outputs.intents} == {
        '{"event":"first"}',
        '{"event":"third"}',
    }
    assert [error.reason for error in outputs.errors] == ["activation_error"]
    error = outputs.errors[0]
    assert AgentEnvelope.FromString(error.envelope).external_event == b"boom"
    assert "the agent failed after staging everything" in error.detail
    assert error.seq == 1
    failed_traces = [event for event in outputs.traces if event.start_ms == 2_000]
    assert [event.event_type for event in failed_traces] == [TraceEvent.ERROR]
    # Seq 1's trace holds the ERROR of the failed attempt and then the run that committed.
    seq_one = [
        TraceEvent.EventType.Name(e.event_type) for e in outputs.traces_for(b"k") if e.seq == 1
    ]
    assert seq_one.count("ACTIVATION_START") == 1 and seq_one.count("ERROR") == 1
    assert provider.fake.call_count == 3
