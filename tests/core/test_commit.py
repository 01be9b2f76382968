"""Rule family: commit. An activation's work is committed whole, exactly once, or not at all.

A failed or timed-out activation commits nothing and reports one error; a retried bundle
commits the same intents, traces and outputs without repeating committed model calls; the
replay cache holds a run's calls only while it is suspended. The state-layout tests drive one
key through ``AgentDoFn`` to show which cells an element reads and what the header records.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from beam_agents import AgentConfig, Complete, Suspend
from beam_agents._protos import (
    AgentEnvelope,
    Continuation,
    ModelCache,
    ToolResult,
    TraceEvent,
)
from beam_agents.core.agent import intent_id_for
from beam_agents.core.context import ActivationContext
from beam_agents.core.state import MEMORY_CAP_BYTES
from beam_agents.io.run_agent import AgentDoFn, agent_dofn
from beam_agents.model.client import LlmRequest
from beam_agents.model.fake import FakeLLM, match_any, respond_with
from beam_agents.testing import EnvelopeStream, FailFirstCommit
from tests.core.harness import (
    SCENARIO_KEY,
    InMemoryBag,
    InMemoryKeyState,
    SharedProvider,
    calls_containing,
    created,
    fingerprint,
    header_of,
    held_dofn,
    main_outputs,
    make_fake,
    make_registry,
    plan_then_summarize,
    run_agent,
    run_order,
    streamed,
)
from tests.core.harness import hold_event as event

K = SCENARIO_KEY


# -- a failed activation --------------------------------------------------------------------


async def uses_unknown_tool(ctx: ActivationContext) -> Complete:
    await ctx.run_tool("no_such_tool", {})
    return Complete(output=b"unreachable")


async def bad_intent_arguments(ctx: ActivationContext) -> Complete:
    ctx.act("freeze_account", {"customer_id": 12, "extra": True})
    return Complete(output=b"unreachable")


async def overfills_memory(ctx: ActivationContext) -> Complete:
    ctx.memory.set("blob", b"x" * MEMORY_CAP_BYTES)
    return Complete(output=b"unreachable")


async def returns_text(ctx: ActivationContext) -> Complete:
    return Complete(output="text")  # type: ignore[arg-type]


async def returns_nothing(ctx: ActivationContext) -> None:
    return None


async def suspends_on_nothing(ctx: ActivationContext) -> Suspend:
    return Suspend()


async def too_slow(ctx: ActivationContext) -> Complete:
    ctx.act("freeze_account", {"customer_id": "c"})
    await asyncio.sleep(5)
    return Complete(output=b"unreachable")


@pytest.mark.parametrize(
    ("agent", "reason", "detail"),
    [
        (uses_unknown_tool, "activation_error", "ToolNotFoundError"),
        (bad_intent_arguments, "activation_error", "ToolArgumentError"),
        (overfills_memory, "activation_error", "MemoryLimitError"),
        (returns_text, "activation_error", "Complete.output must be bytes"),
        (returns_nothing, "activation_error", "must return Complete or Suspend, got NoneType"),
        (suspends_on_nothing, "activation_error", "nothing could ever resume it"),
        (too_slow, "activation_timeout", "ActivationTimeoutError"),
    ],
)
def test_a_failed_activation_commits_nothing_and_reports_one_error(
    agent: object, reason: str, detail: str
) -> None:
    envelope = AgentEnvelope(entity_key=b"k", event_time_ms=42, external_event=b"cust-1")
    outputs = run_agent(
        created([(b"k", envelope)]),
        agent,  # type: ignore[arg-type]
        AgentConfig(tool_registry=make_registry(), activation_timeout_s=0.3),
    )
    assert outputs.output == [] and outputs.intents == []
    assert len(outputs.errors) == 1
    error = outputs.errors[0]
    assert (error.reason, error.entity_key, error.event_time_ms, error.seq) == (reason, b"k", 42, 0)
    assert detail in error.detail
    assert AgentEnvelope.FromString(error.envelope) == envelope
    assert [TraceEvent.EventType.Name(e.event_type) for e in outputs.traces] == ["ERROR"]
    assert outputs.traces[0].attributes["reason"] == reason


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
    # The third event, run as seq 1, asks the failed activation's question at its position:
    # the worker's answer memo hands it that answer instead of asking the provider again.
    assert provider.fake.call_count == 2


# -- retried bundles ----------------------------------------------------------------------


def test_a_retried_resume_commits_the_same_intents_without_repeating_committed_calls(
    tmp_path: Path,
) -> None:
    plain = SharedProvider(make_fake())
    unforced = run_order(AgentConfig(provider_factory=plain))
    retried = SharedProvider(make_fake())
    forced = FailFirstCommit(tmp_path / "markers", trigger="tool_result")
    with_retry = run_order(AgentConfig(provider_factory=retried, before_commit=forced))
    assert forced.forced() == [f"{K.hex()}-0-tool_result-2"]
    assert unforced.output == [b"shipped"] and unforced.errors == []
    assert fingerprint(with_retry) == fingerprint(unforced)
    # The call committed with the suspension is never made again; the resumed activation's own
    # call was not committed when its bundle failed, and the retry gets its answer from the
    # worker's answer memo: the provider is asked nothing twice.
    assert calls_containing(plain.fake, "plan") == calls_containing(retried.fake, "plan") == 1
    assert calls_containing(plain.fake, "summarize") == 1
    assert calls_containing(retried.fake, "summarize") == 1


def test_a_retried_first_commit_mints_the_same_intents(tmp_path: Path) -> None:
    forced = FailFirstCommit(tmp_path, trigger="event", entity_key=K)
    first = run_order(AgentConfig(provider_factory=SharedProvider(make_fake())))
    second = run_order(
        AgentConfig(provider_factory=SharedProvider(make_fake()), before_commit=forced)
    )
    assert forced.forced() == [f"{K.hex()}-0-event-0"]
    assert fingerprint(first) == fingerprint(second)


def test_a_run_keeps_its_model_calls_in_state_only_while_it_is_suspended() -> None:
    fake = make_fake()
    dofn = AgentDoFn(plan_then_summarize, AgentConfig(provider_factory=lambda: fake))
    dofn.setup()
    cells = InMemoryKeyState()

    def deliver(envelope: AgentEnvelope) -> list[object]:
        return cells.process(dofn, K, envelope)

    def cached_calls() -> list[tuple[int, int]]:
        continuation = Continuation.FromString(cells.continuation.value or b"")
        assert continuation.schema_version == 1  # the run carries its cache
        cache = ModelCache.FromString(continuation.replay_cache)
        return [(entry.seq, entry.step_index) for entry in cache.entries]

    try:
        deliver(AgentEnvelope(entity_key=K, event_time_ms=1_000, external_event=b"order"))
        # Suspended: the run's one model call is kept, for its resume to replay.
        assert cached_calls() == [(0, 0)]
        shipped = ToolResult(
            intent_id=intent_id_for(K, 0, 1), entity_key=K, status=ToolResult.OK, payload=b'"t-1"'
        )
        deliver(AgentEnvelope(entity_key=K, event_time_ms=2_000, tool_result=shipped))
        # The run completed: nothing it cached can be replayed again, so none of it is kept.
        assert cells.continuation.value is None
        outputs = deliver(
            AgentEnvelope(entity_key=K, event_time_ms=3_000, external_event=b"second order")
        )
        assert cells.continuation.value is not None, outputs
        assert cached_calls() == [(1, 0)]
    finally:
        dofn.teardown()
    assert calls_containing(fake, "plan") == 2 and calls_containing(fake, "summarize") == 1


# -- state layout: which cells an element reads, what the header records --------------------


@pytest.fixture
def dofn() -> Iterator[AgentDoFn]:
    yield from held_dofn()


def result_for(seq: int, step: int, at_ms: int) -> AgentEnvelope:
    answer = ToolResult(
        intent_id=intent_id_for(K, seq, step), entity_key=K, status=ToolResult.OK, payload=b"{}"
    )
    return AgentEnvelope(entity_key=K, event_time_ms=at_ms, tool_result=answer)


def test_an_event_on_a_key_that_is_not_suspended_reads_only_the_header(dofn: AgentDoFn) -> None:
    cells = InMemoryKeyState()
    assert main_outputs(cells.process(dofn, K, event(b"first", 1_000))) == [b"done first"]
    assert main_outputs(cells.process(dofn, K, event(b"second", 2_000))) == [b"done second"]
    # Beam's state cache weighs every cell a key first reads in a bundle: one cell, one weighing.
    assert cells.header.reads == 2 and cells.memory.reads == 0
    assert header_of(cells).next_seq == 2 and not header_of(cells).continuation


def test_an_event_behind_a_suspended_run_is_appended_without_rewriting_the_header(
    dofn: AgentDoFn,
) -> None:
    cells = InMemoryKeyState()
    cells.process(dofn, K, event(b"hold", 1_000))
    header = cells.header.values[0]
    assert cells.continuation.value is not None
    later = event(b"later", 2_000)
    assert main_outputs(cells.process(dofn, K, later)) == []
    assert cells.header.values == [header, b"\x00" + later.SerializeToString()]
    # The resumed run completes, then the buffered event runs as a new run on the same key.
    outputs = main_outputs(cells.process(dofn, K, result_for(0, 0, 3_000)))
    assert outputs == [b"released", b"done later"]
    assert cells.continuation.value is None and cells.buffered == []
    assert header_of(cells).next_seq == 2 and header_of(cells).last_activity_ms == 3_000


async def three_steps(ctx: ActivationContext) -> Complete | Suspend:
    """Waits for one intent at a time, three times, then completes."""
    answered = len(ctx.results)
    if answered < 3:
        ctx.act("step", {"n": answered})
        return Suspend()
    return Complete(output=b"three steps")


def step_result(step: int, at_ms: int) -> AgentEnvelope:
    answer = ToolResult(
        intent_id=intent_id_for(K, 0, step), entity_key=K, status=ToolResult.OK, payload=b"{}"
    )
    return AgentEnvelope(entity_key=K, event_time_ms=at_ms, tool_result=answer)


class CountedBag(InMemoryBag):
    """A bag that counts the bytes added to it."""

    def __init__(self) -> None:
        super().__init__()
        self.added_bytes = 0

    def add(self, value: bytes) -> None:
        self.added_bytes += len(value)
        super().add(value)


def test_a_run_that_suspends_again_does_not_rewrite_the_events_waiting_behind_it() -> None:
    dofn = agent_dofn(three_steps, AgentConfig())
    dofn.setup()
    cells = InMemoryKeyState()
    cells.header = bag = CountedBag()
    big = event(b"big " + bytes(100_000), 2_000)
    try:
        cells.process(dofn, K, event(b"first", 1_000))
        cells.process(dofn, K, big)
        written = bag.added_bytes
        assert cells.buffered == [big.SerializeToString()]
        for step in (0, 1):  # each resume suspends again: only a new header is appended
            cells.process(dofn, K, step_result(step, 3_000 + step))
            assert cells.buffered == [big.SerializeToString()]
        assert bag.added_bytes - written < 10_000 and len(cells.headers) == 3
        outputs = main_outputs(cells.process(dofn, K, step_result(2, 4_000)))
    finally:
        dofn.teardown()
    # The run completes; the big event runs next and suspends: the bag is compacted.
    assert outputs == [b"three steps"]
    assert cells.buffered == [] and len(cells.headers) == 1
    assert header_of(cells).next_seq == 2 and cells.continuation.value is not None
