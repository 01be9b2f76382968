"""Forced bundle retries (determinism, no repeated model calls) and idle-key cleanup."""

from __future__ import annotations

from pathlib import Path

from beam_agents import AgentConfig, Complete, Escalate, FallbackContext, HitlPolicy, Suspend
from beam_agents._protos import AgentEnvelope, ModelCache, ToolIntent, ToolResult, TraceEvent
from beam_agents.core.agent import intent_id_for
from beam_agents.core.context import ActivationContext
from beam_agents.core.dofn import AgentDoFn
from beam_agents.core.tracing import trace_id_for
from beam_agents.model.client import LlmRequest
from beam_agents.model.fake import FakeLLM, match_contains, respond_with
from beam_agents.testing import EnvelopeStream, FailFirstCommit, epoch_clock
from tests.core.harness import InMemoryKeyState, Outputs, SharedProvider, run_agent, streamed

K = b"order-1"


def ask(text: str) -> LlmRequest:
    return LlmRequest(model_id="planner", messages=[{"role": "user", "content": text}])


def make_fake() -> FakeLLM:
    return FakeLLM(
        [
            (match_contains("plan"), respond_with(b"ship it")),
            (match_contains("summarize"), respond_with(b"shipped")),
        ]
    )


async def plan_then_summarize(ctx: ActivationContext) -> Complete | Suspend:
    if not ctx.is_resume:
        plan = await ctx.call_model(ask("plan " + ctx.event.decode()))
        ctx.act("ship", {"plan": plan.text})
        return Suspend(snapshot=plan.response)
    result = ctx.resume_result
    assert result is not None
    summary = await ctx.call_model(ask("summarize " + result.payload.decode()))
    ctx.act("notify", {"summary": summary.text, "plan": ctx.snapshot.decode()})
    return Complete(output=summary.response)


def order_stream() -> EnvelopeStream:
    return (
        EnvelopeStream()
        .event(K, b"order", at_ms=1_000)
        .result(K, intent_id_for(K, 0, 1), payload=b'"tracking-1"', at_ms=2_000)
    )


def fingerprint(outputs: Outputs) -> tuple[list[bytes], list[bytes], list[bytes]]:
    return (
        sorted(intent.SerializeToString(deterministic=True) for intent in outputs.intents),
        sorted(event.SerializeToString(deterministic=True) for event in outputs.traces),
        sorted(outputs.output),
    )


def calls_containing(fake: FakeLLM, text: str) -> int:
    return sum(text in str(request.messages) for request in fake.requests)


def test_a_retried_resume_commits_the_same_intents_without_repeating_committed_calls(
    tmp_path: Path,
) -> None:
    plain = SharedProvider(make_fake())
    unforced = run_agent(
        streamed(order_stream()),
        plan_then_summarize,
        AgentConfig(provider_factory=plain),
        streaming=True,
    )
    retried = SharedProvider(make_fake())
    forced = FailFirstCommit(tmp_path / "markers", trigger="tool_result")
    with_retry = run_agent(
        streamed(order_stream()),
        plan_then_summarize,
        AgentConfig(provider_factory=retried, before_commit=forced),
        streaming=True,
    )
    assert forced.forced() == [f"{K.hex()}-0-tool_result-2"]
    assert unforced.output == [b"shipped"] and unforced.errors == []
    assert fingerprint(with_retry) == fingerprint(unforced)
    # The call committed with the suspension is never made again; the resumed activation's own
    # call was not committed when its bundle failed, so the retry makes it once more.
    assert calls_containing(plain.fake, "plan") == calls_containing(retried.fake, "plan") == 1
    assert calls_containing(plain.fake, "summarize") == 1
    assert calls_containing(retried.fake, "summarize") == 2


def test_a_retried_first_commit_mints_the_same_intents(tmp_path: Path) -> None:
    forced = FailFirstCommit(tmp_path, trigger="event", entity_key=K)
    first = run_agent(
        streamed(order_stream()),
        plan_then_summarize,
        AgentConfig(provider_factory=SharedProvider(make_fake())),
        streaming=True,
    )
    second = run_agent(
        streamed(order_stream()),
        plan_then_summarize,
        AgentConfig(provider_factory=SharedProvider(make_fake()), before_commit=forced),
        streaming=True,
    )
    assert forced.forced() == [f"{K.hex()}-0-event-0"]
    assert fingerprint(first) == fingerprint(second)


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
    outputs = run_agent(
        streamed(order_stream()),
        plan_then_summarize,
        AgentConfig(provider_factory=provider),
        streaming=True,
    )
    assert outputs.errors == [] and outputs.output == [b"shipped"]
    # Its first step on resume differs from the record, so it takes the next fresh position.
    assert llm_calls(outputs) == [(0, "false"), (2, "false")]
    assert sorted((i.step_index, i.intent_id, i.tool_name) for i in outputs.intents) == [
        (1, intent_id_for(K, 0, 1), "ship"),
        (3, intent_id_for(K, 0, 3), "notify"),
    ]
    assert calls_containing(provider.fake, "plan") == calls_containing(provider.fake, "summarize")
    assert provider.fake.call_count == 2


def escalate(fallback: FallbackContext) -> Escalate:
    return Escalate()


async def approve_first(ctx: ActivationContext) -> Complete | Suspend:
    if ctx.is_resume:
        return Complete(output=b"decided")
    ctx.request_approval({"order": ctx.event.decode()})
    return Suspend()


def test_a_retried_deadline_firing_escalates_identically(tmp_path: Path) -> None:
    def run(before_commit: FailFirstCommit | None) -> Outputs:
        stream = EnvelopeStream().event(K, b"order", at_ms=1_000).advance_processing_time(6_000)
        policy = HitlPolicy(
            timeout_ms=5_000,
            intent_ttl_ms=60_000,
            approval_channel="ops",
            on_timeout=escalate,
            max_escalations=1,
        )
        config = AgentConfig(
            hitl_policy=policy, processing_clock=epoch_clock, before_commit=before_commit
        )
        return run_agent(streamed(stream), approve_first, config, streaming=True)

    forced = FailFirstCommit(tmp_path, trigger="deadline")
    assert fingerprint(run(forced)) == fingerprint(run(None))
    assert f"{K.hex()}-0-deadline-1" in forced.forced()


# -- idle-key cleanup ---------------------------------------------------------------------


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
    assert [intent.kind for intent in outputs.intents] == [ToolIntent.TOOL]


def test_a_run_keeps_its_model_calls_in_state_only_while_it_is_suspended() -> None:
    fake = make_fake()
    dofn = AgentDoFn(plan_then_summarize, AgentConfig(provider_factory=lambda: fake))
    dofn.setup()
    cells = InMemoryKeyState()

    def deliver(envelope: AgentEnvelope) -> list[object]:
        return cells.process(dofn, K, envelope)

    try:
        deliver(AgentEnvelope(entity_key=K, event_time_ms=1_000, external_event=b"order"))
        # Suspended: the run's one model call is kept, for its resume to replay.
        cache = ModelCache.FromString(cells.cache.value or b"")
        assert [(entry.seq, entry.step_index) for entry in cache.entries] == [(0, 0)]
        shipped = ToolResult(
            intent_id=intent_id_for(K, 0, 1), entity_key=K, status=ToolResult.OK, payload=b'"t-1"'
        )
        deliver(AgentEnvelope(entity_key=K, event_time_ms=2_000, tool_result=shipped))
        # The run completed: nothing it cached can be replayed again, so none of it is kept.
        assert cells.continuation.value is None and cells.cache.value is None
        reads = cells.cache.reads
        outputs = deliver(
            AgentEnvelope(entity_key=K, event_time_ms=3_000, external_event=b"second order")
        )
        assert cells.continuation.value is not None, outputs
        # A new run's calls are keyed by a seq no earlier call had: it never reads the cell.
        assert cells.cache.reads == reads
        cache = ModelCache.FromString(cells.cache.value or b"")
        assert [(entry.seq, entry.step_index) for entry in cache.entries] == [(1, 0)]
    finally:
        dofn.teardown()
    assert calls_containing(fake, "plan") == 2 and calls_containing(fake, "summarize") == 1
