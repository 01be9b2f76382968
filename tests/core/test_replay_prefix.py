"""Rule family: replay. A resumed activation re-walking its run replays it, then diverges.

Steps below the run's high-water mark are compared with their records: a match is served from
the replay cache (a model call) or returns the intent id it had (an intent); the first step that
differs, and every step after it, takes a fresh position.
"""

from __future__ import annotations

import pytest

from beam_agents import AgentConfig, Complete, Suspend
from beam_agents._protos import Continuation, ModelCache, ToolIntent, ToolResult, TraceEvent
from beam_agents.core.agent import intent_id_for
from beam_agents.core.context import ActivationContext, staged
from beam_agents.core.staging import Resumption, StepRecord
from beam_agents.model.client import LlmRequest
from beam_agents.model.fake import FakeLLM, match_any, respond_with
from beam_agents.testing import EnvelopeStream, epoch_clock
from tests.core.harness import (
    SCENARIO_KEY,
    Outputs,
    SharedProvider,
    ask,
    calls_containing,
    escalate_once,
    make_fake,
    run_agent,
    run_order,
    streamed,
)
from tests.core.test_context import KEY, event_types, make_context

SEQ = 4
PLAN = LlmRequest(model_id="m", messages=[{"role": "user", "content": "plan the trip"}])


def answering(text: bytes) -> FakeLLM:
    return FakeLLM([(match_any(), respond_with(text))])


async def first_activation() -> tuple[ActivationContext, FakeLLM]:
    """A run's first activation: a model call, an intent and an approval request."""
    fake = answering(b"fly")
    ctx = make_context(provider=fake, seq=SEQ)
    await ctx.call_model(PLAN)
    ctx.act("charge", {"amount": 5})
    ctx.request_approval({"trip": "fly"})
    return ctx, fake


def resumed(first: ActivationContext, fake: FakeLLM) -> ActivationContext:
    """The resume of ``first``'s run, with what its suspension would have committed."""
    assert staged(first).cache is not None
    taken = staged(first).cursor.new_steps
    steps = [StepRecord(kind=kind, digest=digest) for kind, digest in taken]  # type: ignore[arg-type]
    charge = intent_id_for(KEY, SEQ, 1)
    answer = ToolResult(intent_id=charge, status=ToolResult.OK, payload=b'"charged"')
    return make_context(
        provider=fake,
        seq=SEQ,
        first_step=first.high_water_step,
        cache=ModelCache.FromString(staged(first).cache.encode()),
        resumption=Resumption(
            result=answer,
            approval=None,
            snapshot=b"",
            results={charge: answer},
            pending=((intent_id_for(KEY, SEQ, 2), ToolIntent.APPROVAL),),
            tokens_used=staged(first).tokens_used,
            steps=steps,
        ),
    )


@pytest.mark.asyncio
async def test_every_step_is_recorded_with_its_kind_and_content_digest() -> None:
    ctx, _ = await first_activation()
    assert [kind for kind, _ in staged(ctx).cursor.new_steps] == [
        StepRecord.MODEL,
        StepRecord.INTENT,
        StepRecord.APPROVAL,
    ]
    assert staged(ctx).cursor.new_steps[0][1] == bytes.fromhex(PLAN.content_digest())
    assert len({digest for _, digest in staged(ctx).cursor.new_steps}) == 3
    assert (ctx.next_step, ctx.high_water_step) == (3, 3)


@pytest.mark.asyncio
async def test_a_re_walk_replays_every_step_and_then_continues_fresh() -> None:
    first, fake = await first_activation()
    ctx = resumed(first, fake)
    assert (ctx.next_step, ctx.high_water_step) == (0, 3)
    response = await ctx.call_model(PLAN)
    assert response.text == "fly" and fake.call_count == 1
    assert ctx.act("charge", {"amount": 5}) == intent_id_for(KEY, SEQ, 1)
    assert ctx.request_approval({"trip": "fly"}) == intent_id_for(KEY, SEQ, 2)
    assert (
        staged(ctx).intents == []
        and staged(ctx).cursor.new_steps == []
        and staged(ctx).tokens_used == 0
    )
    assert event_types(ctx) == ["LLM_CALL"]
    assert staged(ctx).trace.events[0].attributes["beam_agents.cache_hit"] == "true"
    assert staged(ctx).trace.events[0].attributes["beam_agents.attempts"] == "0"
    assert ctx.act("notify", {"trip": "fly"}) == intent_id_for(KEY, SEQ, 3)
    assert [intent.step_index for intent in staged(ctx).intents] == [3]
    assert [kind for kind, _ in staged(ctx).cursor.new_steps] == [StepRecord.INTENT]
    assert ctx.run_tokens_used == staged(first).tokens_used


@pytest.mark.asyncio
async def test_the_first_different_step_ends_replay_at_the_high_water_mark() -> None:
    first, fake = await first_activation()
    ctx = resumed(first, fake)
    await ctx.call_model(PLAN)
    # Other arguments at step 1: the run diverges here, and takes fresh positions from 3 on.
    assert ctx.act("charge", {"amount": 6}) == intent_id_for(KEY, SEQ, 3)
    # The recorded approval would match step 2, but replay is over: this is step 4.
    assert ctx.request_approval({"trip": "fly"}) == intent_id_for(KEY, SEQ, 4)
    assert [intent.step_index for intent in staged(ctx).intents] == [3, 4]
    assert len(staged(ctx).cursor.new_steps) == 2


@pytest.mark.asyncio
async def test_another_kind_of_step_diverges_even_with_the_same_content() -> None:
    first, fake = await first_activation()
    ctx = resumed(first, fake)
    assert ctx.act("charge", {"amount": 5}) == intent_id_for(KEY, SEQ, 3)
    await ctx.call_model(PLAN)  # a fresh position: the provider is called again
    assert fake.call_count == 2
    assert staged(ctx).trace.events[-1].step_index == 4


@pytest.mark.asyncio
async def test_a_replayed_call_whose_entry_was_evicted_is_made_again_at_its_position() -> None:
    first, _ = await first_activation()
    again = answering(b"fly again")
    ctx = resumed(first, again)
    ctx._load_cache = lambda: None  # the replay cache lost the entry
    response = await ctx.call_model(PLAN)
    assert response.text == "fly again" and again.call_count == 1
    assert staged(ctx).trace.events[0].step_index == 0
    assert staged(ctx).cursor.new_steps == [] and ctx.next_step == 1
    assert staged(ctx).cache is not None and staged(ctx).cache.changed


@pytest.mark.parametrize(("recorded", "expected_first"), [(0, 3), (1, 3)])
def test_a_continuation_without_full_step_records_continues_at_its_cursor(
    recorded: int, expected_first: int
) -> None:
    steps = [StepRecord(kind=StepRecord.INTENT, digest=b"x" * 32)][:recorded]
    ctx = make_context(
        seq=SEQ,
        first_step=3,
        resumption=Resumption(
            result=ToolResult(intent_id="i"),
            approval=None,
            snapshot=b"",
            results={},
            pending=(),
            steps=steps,
        ),
    )
    assert ctx.act("charge", {"amount": 1}) == intent_id_for(KEY, SEQ, expected_first)


def test_the_continuation_stores_one_record_per_step() -> None:
    suspended = Continuation(next_step=2)
    suspended.steps.add(kind=StepRecord.MODEL, digest=b"a")
    suspended.steps.add(kind=StepRecord.INTENT, digest=b"b")
    again = Continuation.FromString(suspended.SerializeToString(deterministic=True))
    assert [(step.kind, step.digest) for step in again.steps] == [
        (StepRecord.MODEL, b"a"),
        (StepRecord.INTENT, b"b"),
    ]


# -- in a pipeline --------------------------------------------------------------------------

K = SCENARIO_KEY


async def approve_then_ship(ctx: ActivationContext) -> Complete | Suspend:
    """Re-walks its approval request on every resume; ships once the escalation is approved."""
    ctx.request_approval({"order": "o-1"})
    approval = ctx.resume_approval
    if approval is not None and approval.approved:
        ctx.act("ship", {"order": "o-1"})
        # The stream's processing clock is already past the policy's timeout (see epoch_clock).
        return Suspend(timeout_ms=60_000)
    if ctx.resume_result is not None:
        return Complete(output=b"shipped")
    return Suspend()


def test_escalations_are_recorded_so_later_resumes_still_replay() -> None:
    escalated = intent_id_for(b"o-1", 0, 1)
    stream = (
        EnvelopeStream()
        .event(b"o-1", b"order", at_ms=1_000)
        .advance_processing_time(6_000)
        .approval(b"o-1", escalated, approved=True, at_ms=2_000)
        .result(b"o-1", intent_id_for(b"o-1", 0, 2), at_ms=3_000)
    )
    config = AgentConfig(hitl_policy=escalate_once(), processing_clock=epoch_clock)
    outputs = run_agent(streamed(stream), approve_then_ship, config, streaming=True)
    assert outputs.errors == [] and outputs.output == [b"shipped"]
    assert sorted((i.step_index, i.tool_name, i.kind) for i in outputs.intents) == [
        (0, "", ToolIntent.WITHDRAWAL),  # the escalation replaced the first request
        (0, "approval", ToolIntent.APPROVAL),
        (1, "approval", ToolIntent.APPROVAL),
        (2, "ship", ToolIntent.TOOL),
    ]


async def ask_again_after_resume(ctx: ActivationContext) -> Complete | Suspend:
    """Re-walks its run on resume: the same model call, then the same intent, every time."""
    answer = await ctx.call_model(ask("plan the same thing"))
    shipment = ctx.act("ship", {"plan": answer.text})
    if not ctx.is_resume:
        return Suspend()
    return Complete(output=b"%s -> %s" % (answer.response, shipment.encode()))


def llm_calls(outputs: Outputs) -> list[tuple[int, str]]:
    return sorted(
        (event.step_index, event.attributes["beam_agents.cache_hit"])
        for event in outputs.traces
        if event.event_type == TraceEvent.LLM_CALL
    )


def test_calls_made_before_a_suspension_are_replayed_when_the_resume_re_walks_them() -> None:
    provider = SharedProvider(make_fake())
    shipment = intent_id_for(K, 0, 1)
    stream = EnvelopeStream().event(K, b"order", at_ms=1_000).result(K, shipment, at_ms=2_000)
    outputs = run_agent(
        streamed(stream),
        ask_again_after_resume,
        AgentConfig(provider_factory=provider),
        streaming=True,
    )
    assert outputs.errors == []
    # The resume walked the same path: the same answer, from the cache, and the same intent id.
    assert outputs.output == [b"ship it -> " + shipment.encode()]
    assert provider.fake.call_count == 1
    assert llm_calls(outputs) == [(0, "false"), (0, "true")]
    # The replayed intent was already emitted with the suspension: nothing new is staged.
    assert [(intent.step_index, intent.tool_name) for intent in outputs.intents] == [(1, "ship")]
    assert outputs.event_types(K) == [
        "ACTIVATION_START",
        "LLM_CALL",
        "INTENT_EMITTED",
        "SUSPENDED",
        "ACTIVATION_START",
        "LLM_CALL",
        "ACTIVATION_END",
    ]


def test_a_continuation_style_agent_continues_where_the_run_stopped() -> None:
    provider = SharedProvider(make_fake())
    outputs = run_order(AgentConfig(provider_factory=provider))
    assert outputs.errors == [] and outputs.output == [b"shipped"]
    # Its first step on resume differs from the record, so it takes the next fresh position.
    assert llm_calls(outputs) == [(0, "false"), (2, "false")]
    assert sorted((i.step_index, i.intent_id, i.tool_name) for i in outputs.intents) == [
        (1, intent_id_for(K, 0, 1), "ship"),
        (3, intent_id_for(K, 0, 3), "notify"),
    ]
    assert calls_containing(provider.fake, "plan") == calls_containing(provider.fake, "summarize")
    assert provider.fake.call_count == 2
