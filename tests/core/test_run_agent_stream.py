"""RunAgent over a TestStream: per-key order, and memory across activations and windows.

A failed activation leaving state untouched is the commit rule (test_commit.py).
"""

from __future__ import annotations

import apache_beam as beam
from apache_beam.transforms.window import FixedWindows

from beam_agents import Complete
from beam_agents.core.context import ActivationContext
from beam_agents.testing import EnvelopeStream
from tests.core.harness import run_agent, streamed


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
