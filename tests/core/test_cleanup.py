"""Rule family: cleanup. A key idle for ``ttl_ms`` is cleared, and its identifiers never repeat.

Cleanup wipes memory, cache and any suspension (reported as ``suspension_wiped``), then runs the
events that were waiting; the key's next run takes the next seq, so intent and trace ids are new.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from apache_beam.pvalue import TaggedOutput
from apache_beam.utils.timestamp import Timestamp

from beam_agents import AgentConfig, Complete, Suspend
from beam_agents._protos import AgentEnvelope, AgentError, ToolIntent, withdrawal_id_for
from beam_agents.core.agent import intent_id_for
from beam_agents.core.context import ActivationContext
from beam_agents.core.observability import trace_id_for
from beam_agents.io.run_agent import AgentDoFn
from beam_agents.testing import EnvelopeStream
from tests.core.harness import (
    HOLD_TTL_MS,
    SCENARIO_KEY,
    InMemoryKeyState,
    SharedProvider,
    ask,
    created,
    header_of,
    held_dofn,
    hold_then_release,
    main_outputs,
    make_fake,
    run_agent,
    streamed,
)
from tests.core.harness import hold_event as event

K = SCENARIO_KEY
TTL_MS = HOLD_TTL_MS


async def remember_and_act(ctx: ActivationContext) -> Complete:
    ctx.memory.append("seen", ctx.event)
    ctx.act("note", {"event": ctx.event.decode()})
    await ctx.call_model(ask("plan " + ctx.event.decode()))
    seen = b",".join(ctx.memory.ring("seen"))
    return Complete(output=b"seq %d saw %s" % (ctx.seq, seen))


def test_cleanup_clears_an_idle_key_but_its_identifiers_never_repeat() -> None:
    stream = (
        EnvelopeStream()
        .event(K, b"a", at_ms=1_000)
        .event(K, b"b", at_ms=9_000)
        .advance_watermark_to(12_000)  # the first timer fires early and re-arms for 19 000
        .event(K, b"c", at_ms=16_000)
        .advance_watermark_to(40_000)  # idle since 16 000: cleaned up
        .event(K, b"d", at_ms=50_000)
    )
    provider = SharedProvider(make_fake())
    outputs = run_agent(
        streamed(stream),
        remember_and_act,
        AgentConfig(provider_factory=provider, ttl_ms=10_000),
        streaming=True,
    )
    assert sorted(outputs.output) == [
        b"seq 0 saw a",
        b"seq 1 saw a,b",
        b"seq 2 saw a,b,c",
        b"seq 3 saw d",
    ]
    ids = [intent.intent_id for intent in outputs.intents]
    assert sorted(ids) == sorted(intent_id_for(K, seq, 0) for seq in range(4))
    assert len({event.trace_id for event in outputs.traces}) == 4
    assert {event.trace_id for event in outputs.traces} == {trace_id_for(K, s) for s in range(4)}
    # Cache keys include the seq too: after cleanup the same request is a new provider call.
    assert provider.fake.call_count == 4
    assert outputs.errors == []


async def wait_for_tool(ctx: ActivationContext) -> Complete | Suspend:
    if ctx.event == b"wait":
        ctx.act("slow", {})
        return Suspend()
    ctx.memory.append("seen", ctx.event)
    return Complete(output=b"%s seq %d memory %d" % (ctx.event, ctx.seq, len(ctx.memory.keys())))


def test_cleanup_reports_a_wiped_suspension_and_then_runs_what_was_waiting() -> None:
    stream = (
        EnvelopeStream()
        .event(K, b"wait", at_ms=1_000)
        .event(K, b"queued", at_ms=2_000)
        .advance_watermark_to(30_000)
        .result(K, intent_id_for(K, 0, 0), at_ms=31_000)
    )
    outputs = run_agent(streamed(stream), wait_for_tool, AgentConfig(ttl_ms=10_000), streaming=True)
    assert outputs.output == [b"queued seq 1 memory 1"]
    assert sorted(error.reason for error in outputs.errors) == [
        "orphaned_result",
        "suspension_wiped",
    ]
    wiped = next(error for error in outputs.errors if error.reason == "suspension_wiped")
    assert wiped.seq == 0 and "waiting for 1 intents" in wiped.detail
    assert wiped.trace_id == trace_id_for(K, 0)
    # The wiped run no longer waits for its intent: it withdraws it at the effector.
    [staged] = [intent for intent in outputs.intents if intent.kind == ToolIntent.TOOL]
    [withdrawal] = [intent for intent in outputs.intents if intent.kind == ToolIntent.WITHDRAWAL]
    assert withdrawal.withdraws_intent_id == staged.intent_id
    assert withdrawal.intent_id == withdrawal_id_for(staged.intent_id)
    assert withdrawal.seq == 0 and withdrawal.step_index == staged.step_index
    assert withdrawal.created_at_ms == 2_000  # the key's last activity, when cleanup happened
    assert "idle-key cleanup" in json.loads(withdrawal.args_json)["reason"]


# -- one key driven through AgentDoFn -------------------------------------------------------


@pytest.fixture
def dofn() -> Iterator[AgentDoFn]:
    yield from held_dofn()


def errors(outputs: list[Any]) -> list[str]:
    return [
        output.value.reason
        for output in outputs
        if isinstance(output, TaggedOutput) and isinstance(output.value, AgentError)
    ]


def test_a_key_cleaned_up_while_suspended_is_no_longer_suspended(dofn: AgentDoFn) -> None:
    cells = InMemoryKeyState()
    cells.process(dofn, K, event(b"hold", 1_000))
    fired = Timestamp(micros=(1_000 + TTL_MS) * 1000)
    assert errors(dofn._on_idle(key=K, fired=fired, **cells.params())) == ["suspension_wiped"]
    assert cells.continuation.value is None and header_of(cells).next_seq == 1
    assert main_outputs(cells.process(dofn, K, event(b"again", 70_000))) == [b"done again"]


def test_an_event_buffered_behind_a_suspension_postpones_its_cleanup(dofn: AgentDoFn) -> None:
    cells = InMemoryKeyState()
    cells.process(dofn, K, event(b"hold", 1_000))
    cells.process(dofn, K, event(b"later", 50_000))  # appended behind the run
    first_expiry = Timestamp(micros=(1_000 + TTL_MS) * 1000)
    assert errors(dofn._on_idle(key=K, fired=first_expiry, **cells.params())) == []
    assert cells.continuation.value is not None
    assert cells.idle.at == Timestamp(micros=(50_000 + TTL_MS) * 1000)  # re-armed
    later_expiry = Timestamp(micros=(50_000 + TTL_MS) * 1000)
    outputs = dofn._on_idle(key=K, fired=later_expiry, **cells.params())
    assert errors(outputs) == ["suspension_wiped"] and main_outputs(outputs) == [b"done later"]


@pytest.mark.parametrize("at_ms", [2**63 - 1, (2**63 - 1) // 1000])
def test_an_event_from_the_end_of_time_keeps_its_key_and_the_pipeline_ends(at_ms: int) -> None:
    key = b"k\x00\n\x1b|"
    hold = AgentEnvelope(entity_key=key, event_time_ms=1_000, external_event=b"hold")
    late = AgentEnvelope(entity_key=key, event_time_ms=at_ms, external_event=b"late")
    config = AgentConfig(ttl_ms=TTL_MS)
    outputs = run_agent(created([(key, hold), (key, late)]), hold_then_release, config)
    # Its activity never expires, so the run keeps waiting and the event keeps its place.
    assert outputs.output == [] and outputs.errors == [] and len(outputs.intents) == 1


def test_an_event_from_before_the_epoch_is_idle_like_any_other() -> None:
    key = b"k\x00\n\x1b|"
    hold = AgentEnvelope(entity_key=key, event_time_ms=1_000, external_event=b"hold")
    early = AgentEnvelope(entity_key=key, event_time_ms=-5, external_event=b"early")
    config = AgentConfig(ttl_ms=TTL_MS)
    outputs = run_agent(created([(key, hold), (key, early)]), hold_then_release, config)
    assert outputs.output == [b"done early"] and outputs.reasons() == ["suspension_wiped"]
