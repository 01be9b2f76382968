"""Trace events: wall-clock spans, GenAI tool attributes, memory sizes, and the identity.

Wall times are read from the recorder's clock (fixed here where exact values matter); every
other field stays a function of key, seq and position, which ``identity_of`` compares.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from beam_agents import AgentConfig, Complete
from beam_agents._protos import ModelCache, ToolResult, TraceEvent
from beam_agents.core.activation import suspend, with_answer
from beam_agents.core.context import ActivationContext, WorkingMemory, staged
from beam_agents.core.observability import (
    DEADLINE_ATTRIBUTE,
    MEMORY_SLOTS_ATTRIBUTE,
    TraceRecorder,
    identity_of,
    trace_id_for,
)
from beam_agents.model.client import LlmRequest
from beam_agents.model.fake import FakeLLM, match_any, respond_with
from tests.core.harness import created, event, run_agent
from tests.core.test_context import KEY, make_context
from tests.core.test_continuation import staged_resume, waiting

LATENCY_MS = 30
NS_PER_MS = 1_000_000


def ticking(start: int = 1_000, step: int = 10) -> Iterator[int]:
    """A fixed clock's readings: ``start``, ``start + step``, ..."""
    value = start
    while True:
        yield value
        value += step


def recorder(clock: Iterator[int]) -> TraceRecorder:
    return TraceRecorder(KEY, 4, trace_id_for(KEY, 4), 0, 77, clock=clock.__next__)


def walls(events: list[TraceEvent]) -> list[tuple[int, int]]:
    return [(event.wall_start_unix_nano, event.wall_end_unix_nano) for event in events]


def test_the_start_spans_its_activation_and_timed_events_span_their_work() -> None:
    trace = recorder(ticking())
    trace.record(TraceEvent.ACTIVATION_START, 0)  # 1000
    started = trace.wall_ns()  # 1010
    trace.record(TraceEvent.LLM_CALL, 0, {"gen_ai.operation.name": "chat"}, started)  # 1020
    trace.record(TraceEvent.INTENT_EMITTED, 1)  # 1030
    trace.record(TraceEvent.ACTIVATION_END, 2)  # 1040
    assert walls(trace.events) == [(1000, 1040), (1010, 1020), (1030, 1030), (1040, 1040)]
    # Event time is untouched: every event is at the activation's event time.
    assert {(event.start_ms, event.end_ms) for event in trace.events} == {(77, 77)}


def test_a_suspension_closes_the_start_and_a_failure_spans_the_whole_activation() -> None:
    suspended = recorder(ticking())
    suspended.record(TraceEvent.ACTIVATION_START, 0)
    suspended.record(TraceEvent.SUSPENDED, 0)
    assert walls(suspended.events) == [(1000, 1010), (1010, 1010)]
    failed = recorder(ticking(5_000))
    failed.record(TraceEvent.ACTIVATION_START, 0)
    failed.record(TraceEvent.LLM_CALL, 0)
    error = failed.failure(0, {"reason": "activation_error"})
    assert (error.wall_start_unix_nano, error.wall_end_unix_nano) == (5_000, 5_020)


def test_identity_ignores_wall_times_and_the_deadline_and_nothing_else() -> None:
    first, second = recorder(ticking(1)), recorder(ticking(999_999))
    for trace in (first, second):
        trace.record(TraceEvent.SUSPENDED, 3, {"pending": "1"})
    [one], [other] = first.events, second.events
    one.attributes[DEADLINE_ATTRIBUTE] = "123"
    assert one.SerializeToString() != other.SerializeToString()
    assert identity_of(one) == identity_of(other)
    assert one.wall_start_unix_nano == 1  # the event itself is not changed
    other.attributes["pending"] = "2"
    assert identity_of(one) != identity_of(other)
    other.attributes["pending"] = "1"
    other.step_index = 4
    assert identity_of(one) != identity_of(other)


@pytest.mark.asyncio
async def test_tool_calls_carry_gen_ai_attributes_and_deterministic_call_ids() -> None:
    ctx = make_context(trace=recorder(ticking()))
    await ctx.run_tool("lookup", {"customer_id": "c9"})
    with pytest.raises(RuntimeError):
        await ctx.run_tool("broken", {"number": 3})
    ok, failed = staged(ctx).trace.events
    trace_id = trace_id_for(KEY, 4)
    assert dict(ok.attributes) == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "lookup",
        "gen_ai.tool.call.id": f"call_{trace_id}_0",
        "tool_name": "lookup",
        "status": "ok",
    }
    assert failed.attributes["gen_ai.tool.call.id"] == f"call_{trace_id}_1"
    assert (failed.attributes["status"], failed.attributes["error"]) == ("error", "RuntimeError")
    assert walls([ok, failed]) == [(1000, 1010), (1020, 1030)]


@pytest.mark.asyncio
async def test_a_model_call_spans_the_provider_and_a_replay_is_near_instant() -> None:
    fake = FakeLLM([(match_any(), respond_with(b"answer", latency_ms=LATENCY_MS))])
    request = LlmRequest(model_id="m", messages=[{"role": "user", "content": "q"}])
    original = make_context(provider=fake)
    await original.call_model(request)
    [called] = staged(original).trace.events
    assert called.wall_end_unix_nano - called.wall_start_unix_nano >= LATENCY_MS * NS_PER_MS
    cache = staged(original).cache
    assert cache is not None
    replay = make_context(provider=fake, cache=ModelCache.FromString(cache.encode()))
    await replay.call_model(request)
    [replayed] = staged(replay).trace.events
    assert replayed.attributes["beam_agents.cache_hit"] == "true" and fake.call_count == 1
    assert replayed.wall_end_unix_nano - replayed.wall_start_unix_nano < LATENCY_MS * NS_PER_MS
    assert identity_of(replayed) != identity_of(called)  # cache_hit and attempts differ


async def remember(ctx: ActivationContext) -> Complete:
    if ctx.event == b"note":
        ctx.memory.set("notes", b"x" * 300)
        ctx.memory.append("log", b"entry")
    return Complete()


def test_the_end_of_an_activation_that_used_memory_gives_its_slot_sizes() -> None:
    outputs = run_agent(created([event(b"m", b"note"), event(b"q", b"quiet")]), remember)
    [used] = [e for e in outputs.traces_for(b"m") if e.event_type == TraceEvent.ACTIVATION_END]
    expected = WorkingMemory(None)
    expected.set("notes", b"x" * 300)
    expected.append("log", b"entry")
    sizes = json.loads(used.attributes[MEMORY_SLOTS_ATTRIBUTE])
    assert sizes == expected.slot_sizes and set(sizes) == {"log", "notes"}
    assert sum(sizes.values()) + 2 == expected.size == len(b"".join(expected.encode()))
    assert used.attributes[MEMORY_SLOTS_ATTRIBUTE] == '{"log":16,"notes":313}'
    [quiet] = [e for e in outputs.traces_for(b"q") if e.event_type == TraceEvent.ACTIVATION_END]
    assert MEMORY_SLOTS_ATTRIBUTE not in quiet.attributes


async def forget(ctx: ActivationContext) -> Complete:
    if ctx.event == b"note":
        ctx.memory.set("notes", b"x")
    elif ctx.event == b"forget":
        ctx.memory.delete("notes")
    elif ctx.event == b"look":
        assert ctx.memory.keys() == []
    return Complete()


def test_an_activation_that_emptied_memory_says_so_and_one_that_only_read_it_does_not() -> None:
    events = [event(b"m", b"note"), event(b"m", b"forget"), event(b"m", b"look")]
    outputs = run_agent(created(events), forget)
    ends = [e for e in outputs.traces_for(b"m") if e.event_type == TraceEvent.ACTIVATION_END]
    assert [end.attributes.get(MEMORY_SLOTS_ATTRIBUTE) for end in ends] == [
        '{"notes":12}',
        "{}",
        None,
    ]


@pytest.mark.parametrize("deadline_ms", [0, 77])
def test_a_suspension_with_a_deadline_says_when(deadline_ms: int) -> None:
    base = with_answer(waiting(), ToolResult(intent_id="a", status=ToolResult.OK))
    record = staged_resume(base)
    suspend(base, record, seq=1, started_at_ms=0, snapshot=b"", adapter="", deadline_ms=deadline_ms)
    suspended = record.trace.events[-1]
    assert suspended.event_type == TraceEvent.SUSPENDED
    assert suspended.attributes.get(DEADLINE_ATTRIBUTE) == (
        str(deadline_ms) if deadline_ms else None
    )


async def ask(ctx: ActivationContext) -> Complete:
    await ctx.call_model(LlmRequest(model_id="m", messages=["q"]))
    return Complete()


def test_spans_in_a_pipeline_nest_inside_their_activation() -> None:
    fake = FakeLLM([(match_any(), respond_with(b"a", latency_ms=LATENCY_MS))])
    config = AgentConfig(provider_factory=lambda: fake)
    outputs = run_agent(created([event(b"k", b"go")]), ask, config)
    start, call, end = outputs.traces_for(b"k")
    assert [start.event_type, call.event_type, end.event_type] == [
        TraceEvent.ACTIVATION_START,
        TraceEvent.LLM_CALL,
        TraceEvent.ACTIVATION_END,
    ]
    assert call.wall_end_unix_nano - call.wall_start_unix_nano >= LATENCY_MS * NS_PER_MS
    assert start.wall_start_unix_nano <= call.wall_start_unix_nano
    assert call.wall_end_unix_nano <= end.wall_start_unix_nano == start.wall_end_unix_nano
